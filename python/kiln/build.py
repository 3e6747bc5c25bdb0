"""kiln.build: TVMScript source (text or a file) to a .kiln artifact, here
or on a compiler node of the fleet."""

from __future__ import annotations

import ctypes
import os
import tempfile
from typing import Optional, Union

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
) -> str:
    """Builds an IRModule and returns the artifact's path.

    source_or_path is TVMScript text (an @I.ir_module class or @T.prim_func
    definitions) or the path of a file holding it. target is a target
    string ("cpu", "cpu -mtriple=aarch64-linux-gnu"). With tracker (a
    TrackerSession, or "host:port" with token) the build is queued at the
    tracker and runs on a compiler node, its progress printed to stderr
    while it runs (progress=False keeps quiet); without one it runs in this
    process. output is the artifact's path (default: the file's name with
    .kiln, or module.kiln in a new temporary directory for text). Ctrl-C
    cancels the build."""
    src_path = None
    text = os.fspath(source_or_path)
    if "\n" not in text and os.path.exists(text):
        src_path = text
        if text.endswith(".onnx"):
            raise KilnValueError(f"build {text}: ONNX models cannot be built yet; give TVMScript text or a .py file")
        with open(text, encoding="utf-8") as f:
            text = f.read()
    elif "\n" not in text and (text.endswith(".py") or text.endswith(".onnx")):
        raise KilnValueError(f"build: no file {text!r}")
    if name is None:
        name = os.path.basename(src_path) if src_path else "module.py"
    if output is None:
        if src_path:
            output = os.path.splitext(src_path)[0] + ".kiln"
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
        _lib.blocking(
            lib.kiln_build,
            text.encode(), name.encode(), target.encode(), th, os.fspath(output).encode(), cb, None, 0,
            ctypes.byref(out),
            cancel_at=7,
        )
    finally:
        if own is not None:
            own.close()
    return _lib.take_string(out)
