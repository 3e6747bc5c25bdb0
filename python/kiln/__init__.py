"""kiln from Python: build tensor programs, run and time them on this
machine or on devices leased from a kiln fleet, with numpy in and out.

The names follow Apache TVM's, so TVM's RPC code ports by changing imports:

    import kiln
    tracker = kiln.rpc.connect_tracker("127.0.0.1", 9190, token=token)
    path = kiln.build("matmul.py", tracker=tracker)
    remote = tracker.request("cpu", priority=1, session_timeout=60)
    remote.upload(path)
    mod = remote.load_module("matmul.kiln")
    dev = remote.cpu(0)
    a = kiln.nd.array(np_a, dev)
    ...
    mod["matrix_multiply"](a, b, c)
    print(mod.time_evaluator("matrix_multiply", dev, number=10, repeat=3)(a, b, c))

Tensor programs are defined in Python as in TVM's tensor-expression
tutorial (kiln.te.placeholder, te.compute, te.create_schedule or
te.create_prim_func with kiln.tir.Schedule) and built with kiln.build.

Everything runs in libkiln.so (kiln's Go SDK and compiler behind a C API);
blocking calls release the GIL and Ctrl-C cancels a waiting request or a
build.
"""

from . import errors as error
from . import nd, rpc, runtime, target, te, tir
from ._lib import live_handles
from .build import build, lower
from .errors import (
    BuildError,
    RPCSessionTimeoutError,
    TVMError,
    KilnCancelled,
    KilnError,
    KilnValueError,
    RPCError,
    SessionError,
    TrackerError,
)
from .ir import IRModule
from .nd import Device, NDArray
from .rpc import local
from .runtime import BenchmarkResult, Function, Module, TimeReport


def cpu(dev_id: int = 0) -> Device:
    """This machine's CPU (the local session's)."""
    return local().cpu(dev_id)


def device(dev_type: object, dev_id: int = 0) -> Device:
    """A device of this machine by name ("cpu", "llvm", "cuda") or type
    code (TVM's tvm.device)."""
    return local().device(dev_type, dev_id)


def version() -> str:
    """The version libkiln was built from."""
    from ._lib import lib

    return lib.kiln_version().decode()


__all__ = [
    "BenchmarkResult",
    "BuildError",
    "Device",
    "Function",
    "IRModule",
    "KilnCancelled",
    "KilnError",
    "KilnValueError",
    "Module",
    "NDArray",
    "RPCError",
    "RPCSessionTimeoutError",
    "SessionError",
    "TVMError",
    "TimeReport",
    "TrackerError",
    "build",
    "cpu",
    "device",
    "error",
    "live_handles",
    "local",
    "lower",
    "nd",
    "rpc",
    "runtime",
    "target",
    "te",
    "tir",
    "version",
]
