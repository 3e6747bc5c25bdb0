"""TVM's runner data types (meta_schedule/runner/runner.py) as plain
Python classes: the same constructors, fields and methods."""

from __future__ import annotations

from typing import Any, Callable, List, Optional


class RunnerInput:
    """The runner's input: the built artifact's path, the device type and
    the arguments' information."""

    def __init__(self, artifact_path: str, device_type: str, args_info: List[Any]) -> None:
        self.artifact_path = artifact_path
        self.device_type = device_type
        self.args_info = list(args_info)


class RunnerResult:
    """The runner's result: run_secs, or error_msg when it failed."""

    def __init__(self, run_secs: Optional[List[float]], error_msg: Optional[str]) -> None:
        self.run_secs = run_secs
        self.error_msg = error_msg

    def __repr__(self) -> str:
        return f"RunnerResult(run_secs={self.run_secs!r}, error_msg={self.error_msg!r})"


class RunnerFuture:
    """A runner's pending output, from two callables (TVM's RunnerFuture)."""

    def __init__(self, f_done: Callable[[], bool], f_result: Optional[Callable[[], RunnerResult]] = None) -> None:
        self._f_done, self._f_result = f_done, f_result

    def done(self) -> bool:
        return self._f_done()

    def result(self) -> RunnerResult:
        if self._f_result is None:
            raise NotImplementedError("RunnerFuture without f_result")
        return self._f_result()


class PyRunnerFuture(RunnerFuture):
    """The base class of runner futures written in Python."""

    def __init__(self) -> None:
        pass

    def done(self) -> bool:
        raise NotImplementedError

    def result(self) -> RunnerResult:
        raise NotImplementedError


class Runner:
    """The runner interface."""

    def run(self, runner_inputs: List[RunnerInput]) -> List[RunnerFuture]:
        raise NotImplementedError


class PyRunner(Runner):
    """The base class of runners written in Python."""

    def __init__(self) -> None:
        pass
