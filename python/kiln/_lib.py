"""Loading libkiln.so and calling it: errors, cancellation, DLPack structs.

Everything here is private to the package; users see the errors through
``kiln.KilnError`` and its subclasses.
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    Union,
    c_char_p,
    c_double,
    c_int,
    c_int32,
    c_int64,
    c_uint8,
    c_uint16,
    c_uint64,
    c_void_p,
)
from typing import Any, Callable, Optional

from .errors import (
    BuildError,
    KilnCancelled,
    KilnError,
    KilnValueError,
    SessionError,
    TrackerError,
)

# Error classes of kiln.h.
ERR_ARGUMENT = 1
ERR_TRACKER = 2
ERR_SESSION = 3
ERR_BUILD = 4
ERR_CANCELLED = 5

# Value type codes of kiln.h.
CODE_INT = 0
CODE_FLOAT = 2
CODE_NULL = 4
CODE_ARRAY = 7
CODE_STR = 11
CODE_BYTES = 12
CODE_TUPLE = 20
CODE_FUNC = 21
CODE_SHAPE = 22

# Causes of errors (kiln_last_error_code).
CAUSE_NOT_FOUND = 1
CAUSE_SESSION_EXPIRED = 2

Handle = c_uint64


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class DLManagedTensor(Structure):
    pass


DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", c_void_p),
    ("deleter", CFUNCTYPE(None, POINTER(DLManagedTensor))),
]


class KilnArg(Union):
    _fields_ = [
        ("v_int64", c_int64),
        ("v_float64", c_double),
        ("v_handle", c_uint64),
        ("v_str", c_char_p),
    ]


class KilnSpan(Structure):
    _fields_ = [("data", c_void_p), ("len", c_int64)]


ProgressFn = CFUNCTYPE(None, c_char_p, c_void_p)

_P = POINTER
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "kiln_last_error": (c_char_p, []),
    "kiln_last_error_kind": (c_int, []),
    "kiln_last_error_code": (c_int, []),
    "kiln_session_upload_bytes": (c_int, [Handle, c_void_p, c_int64, c_char_p, Handle]),
    "kiln_session_download": (c_int, [Handle, c_char_p, Handle, _P(c_void_p), _P(c_int64)]),
    "kiln_session_listdir": (c_int, [Handle, Handle, _P(c_void_p)]),
    "kiln_session_remove": (c_int, [Handle, c_char_p, Handle]),
    "kiln_artifact_export": (c_int, [c_char_p, c_char_p]),
    "kiln_tar_linked": (c_int, [c_void_p, c_int64, _P(c_void_p), _P(c_int64)]),
    "kiln_handle_floor": (c_int, [c_uint64]),
    "kiln_handle_next": (c_uint64, []),
    "kiln_blob_get": (c_int, [Handle, _P(c_void_p), _P(c_int64)]),
    "kiln_time_evaluator_options": (
        c_int,
        [Handle, _P(KilnArg), _P(c_int32), c_int32, c_char_p, Handle, _P(c_void_p)],
    ),
    "kiln_session_record_result": (c_int, [Handle, c_char_p, _P(c_void_p)]),
    "kiln_live_handles": (c_int64, []),
    "kiln_free": (c_int, [Handle]),
    "kiln_string_free": (None, [c_void_p]),
    "kiln_version": (c_char_p, []),
    "kiln_cancel_new": (c_int, [_P(Handle)]),
    "kiln_cancel": (c_int, [Handle]),
    "kiln_tracker_connect": (c_int, [c_char_p, c_char_p, Handle, _P(Handle)]),
    "kiln_tracker_summary": (c_int, [Handle, _P(c_void_p)]),
    "kiln_tracker_request": (
        c_int,
        [Handle, c_char_p, c_char_p, c_int32, c_double, c_double, ProgressFn, c_void_p, Handle, _P(Handle)],
    ),
    "kiln_connect": (c_int, [c_char_p, c_char_p, Handle, _P(Handle)]),
    "kiln_connect_timeout": (c_int, [c_char_p, c_char_p, c_double, Handle, _P(Handle)]),
    "kiln_local": (c_int, [_P(Handle)]),
    "kiln_session_info": (c_int, [Handle, _P(c_void_p)]),
    "kiln_session_upload": (c_int, [Handle, c_char_p, c_char_p, Handle]),
    "kiln_session_load_module": (c_int, [Handle, c_char_p, _P(Handle)]),
    "kiln_session_get_function": (c_int, [Handle, c_char_p, _P(Handle)]),
    "kiln_module_functions": (c_int, [Handle, _P(c_void_p)]),
    "kiln_module_get_function": (c_int, [Handle, c_char_p, _P(Handle)]),
    "kiln_array_empty": (c_int, [Handle, c_int32, _P(c_int64), DLDataType, DLDevice, _P(Handle)]),
    "kiln_array_info": (
        c_int,
        [Handle, c_int32, _P(c_int64), _P(c_int32), _P(DLDataType), _P(DLDevice), _P(c_void_p)],
    ),
    "kiln_array_copy_from": (c_int, [Handle, _P(DLTensor), Handle]),
    "kiln_array_copy_to": (c_int, [Handle, _P(DLTensor), Handle]),
    "kiln_array_from_dlpack": (c_int, [c_void_p, _P(Handle)]),
    "kiln_array_to_dlpack": (c_int, [Handle, _P(c_void_p)]),
    # The arguments go as plain pointers: the call's fast path fills
    # uint64/int32 scratch arrays (see runtime.Function.__call__).
    "kiln_call": (c_int, [Handle, c_void_p, c_void_p, c_int32, Handle, c_void_p, c_void_p]),
    "kiln_tuple_size": (c_int, [Handle, _P(c_int32)]),
    "kiln_tuple_get": (c_int, [Handle, c_int32, _P(KilnArg), _P(c_int32)]),
    "kiln_time_evaluator": (
        c_int,
        [Handle, _P(KilnArg), _P(c_int32), c_int32, c_int32, c_int32, c_int32, Handle, _P(c_void_p)],
    ),
    "kiln_build": (
        c_int,
        [c_char_p, c_char_p, c_char_p, Handle, c_char_p, ProgressFn, c_void_p, Handle, _P(c_void_p)],
    ),
    "kiln_build_file": (
        c_int,
        [c_char_p, c_char_p, Handle, c_char_p, c_char_p, ProgressFn, c_void_p, Handle, _P(c_void_p)],
    ),
    "kiln_te_create_prim_func": (c_int, [c_char_p, _P(c_void_p)]),
    "kiln_tir_function": (c_int, [c_char_p, c_char_p, c_char_p, _P(c_void_p)]),
    "kiln_schedule_new": (c_int, [c_char_p, c_char_p, _P(Handle)]),
    "kiln_schedule_copy": (c_int, [Handle, _P(Handle)]),
    "kiln_schedule_apply": (c_int, [Handle, c_char_p, c_char_p, _P(c_void_p)]),
    "kiln_schedule_script": (c_int, [Handle, _P(c_void_p)]),
    "kiln_schedule_trace": (c_int, [Handle, _P(c_void_p)]),
}


def _find_library() -> str:
    env = os.environ.get("KILN_LIBRARY")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libkiln.so")
    if os.path.exists(here):
        return here
    raise ImportError(
        "kiln: libkiln.so is not next to the package and KILN_LIBRARY is not set; "
        "install the package with `pip install ./python` (it builds the library with Go) "
        "or build it with `go build -buildmode=c-shared -o libkiln.so ./capi` and point KILN_LIBRARY at it"
    )


def _open(path: str) -> ctypes.CDLL:
    try:
        cdll = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(f"kiln: cannot load {path}: {e}") from e
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(cdll, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return cdll


class _Library:
    """libkiln's functions, looked up once each (the instance's dict caches
    them). A process forked from one that used libkiln cannot use the
    parent's copy: the Go runtime inside it lost its threads in the fork,
    and its first call would wait for them forever. So a forked child loads
    a fresh copy of the library (a copy of the file, which the dynamic
    loader maps anew, with a Go runtime of its own) at its first call, and
    handles the parent's objects still hold are never issued again (they
    name nothing in the child: using one fails as a freed handle does)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._cdll = _open(path)
        self._floor = 0
        self._stale = False
        self._copy: Optional[str] = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._stale:
            self._reload()
        fn = getattr(self._cdll, name)
        self.__dict__[name] = fn
        return fn

    def _before_fork(self) -> None:
        # The parent's handles so far; the child's start above them.
        try:
            self._floor = int(self._cdll.kiln_handle_next())
        except Exception:
            self._floor = 0

    def _after_fork_in_child(self) -> None:
        for k in [k for k in self.__dict__ if not k.startswith("_")]:
            del self.__dict__[k]
        self._stale = True
        for fn in _fork_hooks:
            fn()

    def _reload(self) -> None:
        import shutil
        import tempfile

        self._stale = False
        fd, copy = tempfile.mkstemp(prefix="libkiln-fork-", suffix=".so")
        os.close(fd)
        try:
            shutil.copyfile(self._path, copy)
            self._cdll = _open(copy)
        finally:
            # Mapped now; the name is no longer needed.
            os.unlink(copy)
        self._cdll.kiln_handle_floor(self._floor + (1 << 20))


# Called in a forked child before its first call (to drop state of the
# parent's library copy: the local session, cached functions).
_fork_hooks: list = []

lib = _Library(_find_library())
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=lib._before_fork, after_in_child=lib._after_fork_in_child)

_CLASSES: dict[int, type] = {
    ERR_ARGUMENT: KilnValueError,
    ERR_TRACKER: TrackerError,
    ERR_SESSION: SessionError,
    ERR_BUILD: BuildError,
}


_NOT_FOUND: dict = {}


def _not_found_class(base: type) -> type:
    """base, also an AttributeError: TVM raises AttributeError for a
    function a module or session does not have."""
    cls = _NOT_FOUND.get(base)
    if cls is None:
        cls = type(base.__name__, (base, AttributeError), {"__module__": base.__module__, "__doc__": base.__doc__})
        _NOT_FOUND[base] = cls
    return cls


def last_error() -> KilnError:
    """The calling thread's last error from libkiln as an exception."""
    msg = (lib.kiln_last_error() or b"").decode("utf-8", "replace")
    kind = lib.kiln_last_error_kind()
    if kind == ERR_CANCELLED:
        return KilnCancelled(msg)
    cls = _CLASSES.get(kind, KilnError)
    cause = lib.kiln_last_error_code()
    if cause == CAUSE_SESSION_EXPIRED:
        from .errors import RPCSessionTimeoutError

        cls = RPCSessionTimeoutError
    elif cause == CAUSE_NOT_FOUND:
        cls = _not_found_class(cls)
    return cls(msg)


def check(rc: int) -> None:
    """Raises the thread's last error when rc says the call failed."""
    if rc != 0:
        raise last_error()


def take_string(p: c_void_p) -> str:
    """Reads and frees a string libkiln returned."""
    if not p.value:
        return ""
    s = ctypes.string_at(p.value).decode("utf-8", "replace")
    lib.kiln_string_free(p)
    return s


def encode(s: Optional[str]) -> Optional[bytes]:
    return None if s is None else s.encode("utf-8")


def free(h: int) -> None:
    """Frees a handle, ignoring one already gone (at interpreter exit)."""
    if lib is not None and h and not lib._stale:
        lib.kiln_free(h)


def live_handles() -> int:
    """How many libkiln handles are live (not yet freed)."""
    return int(lib.kiln_live_handles())


def blocking(fn: Callable[..., int], *args: Any, cancel_at: int) -> None:
    """Runs fn(*args, token) where args[cancel_at] is replaced by a fresh
    cancel token, so that Ctrl-C cancels it: in the main thread the call runs
    in a helper thread while the main thread waits, and a KeyboardInterrupt
    cancels the token, waits for the call to return and is raised again.
    Errors are raised as KilnError subclasses."""
    token = Handle()
    check(lib.kiln_cancel_new(ctypes.byref(token)))
    try:
        call_args = list(args)
        call_args[cancel_at] = token.value
        if threading.current_thread() is not threading.main_thread():
            check(fn(*call_args))
            return
        result: dict[str, Any] = {}
        # The wait is for these events, not Thread.join: on Python 3.11 a
        # join that Ctrl-C interrupts may mark the thread finished while it
        # still runs (it releases the lock the running thread holds), and
        # the next join returns at once.
        started, done = threading.Event(), threading.Event()

        def run() -> None:
            started.set()
            try:
                rc = fn(*call_args)
                result["rc"] = rc
                if rc != 0:
                    result["err"] = last_error()
            finally:
                done.set()

        t = threading.Thread(target=run, name="kiln-call", daemon=True)
        try:
            t.start()
            while not done.wait(0.1):
                pass
        except KeyboardInterrupt:
            lib.kiln_cancel(token.value)
            # The call returns soon once cancelled; the caller may use its
            # handles (or free them) only after that. A Ctrl-C that came
            # before the thread ran leaves nothing to wait for.
            if started.wait(5):
                done.wait()
            raise
        if result.get("rc", 0) != 0:
            raise result["err"]
    finally:
        lib.kiln_free(token.value)


def progress_printer(enabled: bool) -> Any:
    """A progress callback that prints each line to stderr (or a null
    callback)."""
    if not enabled:
        return ProgressFn()
    import sys

    def say(line: bytes, _user: Any) -> None:
        print(line.decode("utf-8", "replace"), file=sys.stderr, flush=True)

    return ProgressFn(say)
