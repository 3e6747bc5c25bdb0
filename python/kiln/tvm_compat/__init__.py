"""TVM's import path on kiln: ``import kiln.tvm_compat as tvm``.

With it, code written against TVM's Python API for RPC, arrays and
measurement runs on kiln as written: ``tvm.rpc`` (connect, connect_tracker,
Server, tracker.Tracker, LocalSession, RPCSession), ``tvm.runtime``
(Device, Module, Tensor, tensor, empty, load_module, convert), ``tvm.nd``,
``tvm.cpu``, ``tvm.cuda``, ``tvm.device``, ``tvm.error``, ``tvm.te``,
``tvm.tir``, ``tvm.target``, ``tvm.IRModule``, ``tvm.compile`` and
``tvm.build`` (kiln.build), ``tvm.register_func`` and
``tvm.get_global_func``, ``tvm.testing.assert_allclose`` and
``tvm.support.utils.tempdir``. Each name is kiln's own object; this module
only arranges them under TVM's paths (the submodules are importable:
``from kiln.tvm_compat.rpc import RPCSession``).

Functions registered here with register_func live in this process, as
TVM's do in a client; the functions of a remote session are its daemon's
(remote.get_function), as in TVM.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Dict, Optional

from .. import build as _build
from .. import errors as error
from .. import nd, target, te, tir
from ..ir import IRModule
from ..nd import Device
from . import rpc, runtime, support, testing

# kiln's own modules under TVM's paths: ``from kiln.tvm_compat.tir import
# FloatImm`` as ``from tvm.tir import FloatImm``.
for _name, _mod in (("nd", nd), ("target", target), ("te", te), ("tir", tir), ("error", error)):
    sys.modules[f"{__name__}.{_name}"] = _mod

cpu = runtime.cpu
cuda = runtime.cuda
device = runtime.device

_registry: Dict[str, Callable[..., Any]] = {}
_registry_lock = threading.Lock()


def register_func(func_name: Any, f: Optional[Callable[..., Any]] = None, override: bool = False) -> Any:
    """Registers f as the global function func_name of this process (TVM's
    tvm.register_func); as a decorator, ``@register_func("name")`` or
    ``@register_func`` (the function's own name). A name registered already
    is refused unless override is true."""
    if callable(func_name) and f is None:
        f, func_name = func_name, func_name.__name__
    if not isinstance(func_name, str) or not func_name:
        raise error.KilnValueError(f"register_func: the name must be a non-empty string, got {func_name!r}")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise error.KilnValueError(f"register_func({func_name!r}): {fn!r} is not callable")
        with _registry_lock:
            if func_name in _registry and not override:
                raise error.KilnValueError(f"register_func: global function {func_name!r} is registered already (override=True replaces it)")
            _registry[func_name] = fn
        return fn

    return register(f) if f is not None else register


def get_global_func(name: str, allow_missing: bool = False) -> Any:
    """The global function name of this process (TVM's
    tvm.get_global_func): one registered with register_func, else one of
    the local session's built-ins ("testing.echo", "rpc.test.addone", ...).
    A missing one is None with allow_missing, else an error that is also an
    AttributeError."""
    with _registry_lock:
        fn = _registry.get(name)
    if fn is not None:
        return fn
    try:
        return rpc.LocalSession().get_function(name)
    except AttributeError:
        if allow_missing:
            return None
        raise


def list_global_func_names() -> list:
    """The names registered with register_func in this process."""
    with _registry_lock:
        return sorted(_registry)


build = _build
compile = _build  # TVM's tvm.compile

__all__ = [
    "Device",
    "IRModule",
    "build",
    "compile",
    "cpu",
    "cuda",
    "device",
    "error",
    "get_global_func",
    "list_global_func_names",
    "nd",
    "register_func",
    "rpc",
    "runtime",
    "support",
    "target",
    "te",
    "testing",
    "tir",
]
