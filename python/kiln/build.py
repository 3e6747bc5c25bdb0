"""kiln.build: TVMScript (text or a file), an ONNX model or a program
defined in Python (kiln.te, kiln.tir) to a .kiln artifact, here or on a
compiler node of the fleet; kiln.lower: a te schedule's module."""

from __future__ import annotations

import ctypes
import os
import tempfile
from typing import Any, Mapping, Optional, Sequence, Union

from . import _lib
from ._lib import lib
from .errors import KilnValueError
from .rpc import TrackerSession, connect_tracker


def build(source_or_path: Any, *rest: Any, **kwargs: Any) -> Any:
    """Builds a module: TVMScript or an ONNX model (see build_source) or a
    program defined in Python (see build_program: a kiln.te schedule, a
    kiln.tir.Schedule, an IRModule or a PrimFunc, with TVM's tvm.build
    arguments)."""
    if _is_program(source_or_path):
        return build_program(source_or_path, *rest, **kwargs)
    return build_source(source_or_path, *rest, **kwargs)


def build_program(
    inputs: Any,
    args: Optional[Sequence[Any]] = None,
    target: Any = None,
    target_host: Any = None,
    name: Optional[str] = None,
    tracker: Union[TrackerSession, str, None] = None,
    output: Optional[str] = None,
    progress: bool = False,
    token: Optional[str] = None,
) -> Any:
    """Builds a program defined in Python, with TVM's tvm.build arguments:
    a kiln.te schedule and its arguments (``kiln.build(s, [A, B, C],
    "llvm", name="myadd")``), or a kiln.tir.Schedule, an IRModule (sch.mod)
    or a PrimFunc (``kiln.build(sch.mod, target="llvm")``). name renames
    the function; target_host is accepted for TVM's signature.

    Without tracker the module is built here and returned loaded in the
    local session (kiln.local()), as tvm.build returns a module:
    ``fadd(a, b, c)`` calls its function, ``fadd.export_library(path)``
    saves the artifact. With tracker it is built on a compiler node and
    the artifact's path is returned, to upload to a device."""
    if target is None and (isinstance(args, str) or type(args).__name__ == "Target"):
        args, target = None, args
    text = _program_text(inputs, args, name)
    tgt = _target_string(target)
    if tracker is not None:
        return build_source(text, tgt, tracker, output=output, progress=progress, token=token)
    path = build_source(text, tgt, output=output, progress=progress)
    from .rpc import local

    mod = local().load_module(path)
    mod.artifact = path
    return mod


def build_source(
    source_or_path: Union[str, "os.PathLike[str]"],
    target: Any = "cpu",
    tracker: Union[TrackerSession, str, None] = None,
    output: Optional[str] = None,
    name: Optional[str] = None,
    progress: bool = True,
    token: Optional[str] = None,
    input_shapes: Optional[Mapping[str, Sequence[int]]] = None,
) -> str:
    """Builds a module and returns the artifact's path.

    source_or_path is TVMScript text (an @I.ir_module class or @T.prim_func
    definitions), the path of a file holding it, or the path of an ONNX
    model (FILE.onnx, its weights bundled into the artifact; input_shapes
    fixes its inputs' symbolic dimensions, {"x": (1, 3, 224, 224)}). target
    is a target string ("cpu", "cpu -mtriple=aarch64-linux-gnu"). With
    tracker (a TrackerSession, or "host:port" with token) the build is
    queued at the tracker and runs on a compiler node, its progress printed
    to stderr while it runs (progress=False keeps quiet); without one it
    runs in this process. output is the artifact's path (default: the
    file's name with .kiln, or module.kiln in a new temporary directory for
    text). Ctrl-C cancels the build."""
    target = _target_string(target)
    text = os.fspath(source_or_path)
    is_path = "\n" not in text and (os.path.exists(text) or text.endswith((".py", ".onnx")))
    if is_path and not os.path.exists(text):
        raise KilnValueError(f"build: no file {text!r}")
    if input_shapes and not (is_path and text.lower().endswith(".onnx")):
        raise KilnValueError("build: input_shapes is for ONNX models (FILE.onnx)")
    if output is None:
        if is_path:
            output = os.path.splitext(text)[0] + ".kiln"
        else:
            output = os.path.join(tempfile.mkdtemp(prefix="kiln-build-"), "module.kiln")
    own = None
    th = 0
    if isinstance(tracker, str):
        host, _, port = tracker.rpartition(":")
        if not host or not port.isdigit():
            raise KilnValueError(f"tracker {tracker!r}: want HOST:PORT")
        own = connect_tracker(host, int(port), token=token)
        tracker = own
    if tracker is not None:
        if not isinstance(tracker, TrackerSession):
            raise KilnValueError(f"tracker: want a TrackerSession or 'host:port', got {type(tracker).__name__}")
        th = tracker._live()
    cb = _lib.progress_printer(progress)
    out = ctypes.c_void_p()
    try:
        if is_path:
            shapes = "\n".join(f"{k}={'x'.join(str(int(d)) for d in v)}" for k, v in (input_shapes or {}).items())
            _lib.blocking(
                lib.kiln_build_file,
                text.encode(), target.encode(), th, os.fspath(output).encode(), shapes.encode(), cb, None, 0,
                ctypes.byref(out),
                cancel_at=7,
            )
        else:
            _lib.blocking(
                lib.kiln_build,
                text.encode(), (name or "module.py").encode(), target.encode(), th, os.fspath(output).encode(),
                cb, None, 0, ctypes.byref(out),
                cancel_at=7,
            )
    finally:
        if own is not None:
            own.close()
    return _lib.take_string(out)


def _is_program(x: Any) -> bool:
    from . import te, tir
    from .ir import IRModule

    return isinstance(x, (te.Schedule, tir.Schedule, tir.PrimFunc, IRModule))


def _program_text(x: Any, args: Optional[Sequence[Any]], name: Optional[str]) -> str:
    """The TVMScript text of a program defined in Python, its function
    renamed to name."""
    from . import te, tir
    from .ir import _function_text

    if isinstance(x, te.Schedule):
        return x._func(args, name or "").mod.script()
    if args is not None:
        raise KilnValueError(f"build: args is for te schedules; a {type(x).__name__} has its parameters")
    if isinstance(x, tir.Schedule):
        x = x.mod
    return _function_text(x.script(), "", name or "")


def _target_string(target: Any) -> str:
    if target is None:
        return "cpu"
    if isinstance(target, str):
        return target
    if isinstance(target, dict):
        # TVM's dict form: {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}.
        from .target import Target

        return str(Target(target))
    s = str(target)
    if type(target).__name__ == "Target" and s:
        return s
    raise KilnValueError(f"build: target {target!r}: want a target string such as 'cpu' or 'llvm'")


def lower(inputs: Any, args: Optional[Sequence[Any]] = None, name: Optional[str] = None, simple_mode: bool = False) -> Any:
    """The module kiln builds for a te schedule and its arguments, or for
    a tir.Schedule, PrimFunc or IRModule, before lowering (TVM's tvm.lower;
    print it to see the loops the schedule made)."""
    from .ir import IRModule

    if not _is_program(inputs):
        raise KilnValueError(f"lower: want a te or tir schedule, a PrimFunc or an IRModule, got {type(inputs).__name__}")
    return IRModule(_program_text(inputs, args, name))
