"""kiln.build: TVMScript (text or a file) or an ONNX model to a .kiln
artifact, here or on a compiler node of the fleet."""

from __future__ import annotations

import ctypes
import os
import tempfile
from typing import Mapping, Optional, Sequence, Union

from . import _lib
from ._lib import lib
from .errors import KilnValueError
from .rpc import TrackerSession, connect_tracker


def build(
    source_or_path: Union[str, "os.PathLike[str]"],
    target: str = "cpu",
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
