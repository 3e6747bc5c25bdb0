"""The runners (TVM's meta_schedule.runner)."""

from .config import EvaluatorConfig, RPCConfig
from .rpc_runner import RPCRunner
from .runner import PyRunner, PyRunnerFuture, Runner, RunnerFuture, RunnerInput, RunnerResult

__all__ = [
    "EvaluatorConfig",
    "PyRunner",
    "PyRunnerFuture",
    "RPCConfig",
    "RPCRunner",
    "Runner",
    "RunnerFuture",
    "RunnerInput",
    "RunnerResult",
]
