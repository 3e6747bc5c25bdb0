"""Sessions on devices, named after TVM's ``tvm.rpc``: connect to a tracker
and request a device, or connect to a device daemon directly.

    tracker = kiln.rpc.connect_tracker("127.0.0.1", 9190, token=token)
    remote = tracker.request("cpu", priority=1, session_timeout=60)
    remote.upload("matmul.kiln")
    mod = remote.load_module("matmul.kiln")
    dev = remote.cpu(0)
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import threading
from typing import Any, Optional

from . import _lib
from ._lib import lib
from .errors import KilnValueError, SessionError
from .nd import Device
from .runtime import Function, Module


def _addr(host: str, port: int) -> bytes:
    if not isinstance(port, int) or not 0 < port < 65536:
        raise KilnValueError(f"port {port!r}: want an integer from 1 to 65535")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}".encode()


def _token(token: Optional[str], token_file: Optional[str]) -> Optional[bytes]:
    if token is not None and token_file is not None:
        raise KilnValueError("give token or token_file, not both")
    if token_file is not None:
        with open(token_file, "rb") as f:
            return f.read().strip()
    if token is None:
        env = os.environ.get("KILN_TOKEN_FILE")
        if env:
            with open(env, "rb") as f:
                return f.read().strip()
        return None
    return token.encode()


class RPCSession:
    """A session on a device: remote (a device daemon, maybe through a
    tracker lease) or local (this machine, kiln.local()). Close it with
    close() or a with block; a session from a tracker releases its lease
    then."""

    def __init__(self, handle: int) -> None:
        self._h = handle
        self._closed = False
        self._lock = threading.Lock()
        out = ctypes.c_void_p()
        _lib.check(lib.kiln_session_info(handle, ctypes.byref(out)))
        self.info: dict = json.loads(_lib.take_string(out))

    @property
    def is_local(self) -> bool:
        return self.info.get("kind") == "local"

    def _live(self) -> int:
        if self._closed:
            raise SessionError(f"session on {self._where()} was closed")
        return self._h

    def _where(self) -> str:
        if self.is_local:
            return "this machine"
        where = self.info.get("addr", "?")
        if self.info.get("key"):
            where += f" (key {self.info['key']})"
        return where

    def upload(self, data: Any, target: Optional[str] = None) -> None:
        """Copies the local file data (a path) into the session's directory,
        named target (default: the file's base name)."""
        if isinstance(data, (bytes, bytearray)):
            raise KilnValueError("upload: give a file path; bytes are not supported")
        path = os.fspath(data)
        name = target if target is not None else os.path.basename(path)
        _lib.blocking(lib.kiln_session_upload, self._live(), path.encode(), name.encode(), 0, cancel_at=3)

    def load_module(self, path: str) -> Module:
        """Loads an uploaded file (a .kiln artifact) and returns the module.
        A local session also loads a path on this machine."""
        h = _lib.Handle()
        _lib.check(lib.kiln_session_load_module(self._live(), os.fspath(path).encode(), ctypes.byref(h)))
        return Module(h.value, self, os.path.basename(os.fspath(path)))

    def get_function(self, name: str) -> Function:
        """A global function of the session's registry (TVM's
        get_function), e.g. "rpcserver.nop" on a device daemon."""
        h = _lib.Handle()
        _lib.check(lib.kiln_session_get_function(self._live(), name.encode(), ctypes.byref(h)))
        return Function(h.value, None, name, self)

    def device(self, dev_type: Any, dev_id: int = 0) -> Device:
        """A device of the session: dev_type is "cpu", "cuda", 1 or 2."""
        types = {"cpu": 1, "llvm": 1, "c": 1, "cuda": 2, "gpu": 2}
        if isinstance(dev_type, str):
            if dev_type not in types:
                raise KilnValueError(f"device type {dev_type!r}: want cpu or cuda")
            dev_type = types[dev_type]
        return Device(self, dev_type, dev_id)

    def cpu(self, dev_id: int = 0) -> Device:
        """The session's CPU."""
        return Device(self, 1, dev_id)

    def cuda(self, dev_id: int = 0) -> Device:
        """The session's CUDA device dev_id."""
        return Device(self, 2, dev_id)

    def close(self) -> None:
        """Ends the session (a leased one releases its lease). Arrays and
        modules of it can no longer be used. Calling it again is harmless."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _lib.free(self._h)

    def __enter__(self) -> "RPCSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        if self.is_local:
            return f"<kiln.rpc.LocalSession {self.info.get('device', 'cpu:0')}{state}>"
        extra = ""
        if self.info.get("key"):
            extra = f" key={self.info['key']!r} node={self.info.get('node', '')!r}"
        return f"<kiln.rpc.RPCSession {self.info.get('addr')}{extra} session={self.info.get('id', '')!r} expires={self.info.get('expires', '')}{state}>"


_local: Optional[RPCSession] = None
_local_lock = threading.Lock()


def local() -> RPCSession:
    """The session on this machine (one per process): the same API as a
    remote session, arrays in this process's memory. It lasts until the
    interpreter exits (then its files, in a temporary directory, are
    removed)."""
    global _local
    with _local_lock:
        if _local is None:
            h = _lib.Handle()
            _lib.check(lib.kiln_local(ctypes.byref(h)))
            _local = RPCSession(h.value)
            atexit.register(_local.close)
        return _local


LocalSession = local


def connect(host: str, port: int, token: Optional[str] = None, token_file: Optional[str] = None) -> RPCSession:
    """Opens a session on the device daemon at host:port directly (a daemon
    that is not registered with a tracker, or one you hold a lease on)."""
    h = _lib.Handle()
    _lib.blocking(lib.kiln_connect, _addr(host, port), _token(token, token_file), 0, ctypes.byref(h), cancel_at=2)
    return RPCSession(h.value)


class TrackerSession:
    """A connection to a tracker: summary() describes the fleet, request()
    leases a device and opens a session on it."""

    def __init__(self, handle: int, addr: str) -> None:
        self._h = handle
        self.addr = addr
        self._closed = False

    def _live(self) -> int:
        if self._closed:
            raise SessionError(f"tracker connection to {self.addr} was closed")
        return self._h

    def summary(self) -> dict:
        """The tracker's view of the fleet: keys, devices, compiler nodes,
        queues and recent build jobs."""
        out = ctypes.c_void_p()
        _lib.check(lib.kiln_tracker_summary(self._live(), ctypes.byref(out)))
        return json.loads(_lib.take_string(out))

    def text_summary(self) -> str:
        """The summary as a table of keys (TVM's text_summary)."""
        s = self.summary()
        lines = ["key            free  busy  lost  quarantined  waiting"]
        for k in s.get("keys") or []:
            lines.append(
                f"{k['key']:<14} {k.get('free', 0):>4}  {k.get('busy', 0):>4}  {k.get('lost', 0):>4}  "
                f"{k.get('quarantined', 0):>11}  {k.get('pending', 0):>7}"
            )
        return "\n".join(lines)

    def request(
        self,
        key: str = "",
        priority: int = 1,
        session_timeout: float = 0,
        max_retry: Optional[int] = None,
        wait: Optional[float] = None,
        selector: str = "",
        progress: bool = True,
    ) -> RPCSession:
        """Leases a device registered under key (or matching selector,
        "cpu.avx512=true") and opens a session on it. session_timeout
        (seconds, 0: the daemon's default) bounds the session; wait
        (seconds) bounds the time in the queue; without it a key no device
        is registered under fails at once. Ctrl-C cancels the wait. While
        queued, the position is printed when progress is true. max_retry is
        accepted for TVM's signature."""
        if not key and not selector:
            raise KilnValueError("request: give a device key (or a selector)")
        if wait is not None and wait <= 0:
            raise KilnValueError(f"request: wait must be positive seconds, got {wait!r}")
        cb = _lib.progress_printer(progress)
        h = _lib.Handle()
        _lib.blocking(
            lib.kiln_tracker_request,
            self._live(), key.encode(), selector.encode(), int(priority), float(session_timeout),
            float(wait or 0), cb, None, 0, ctypes.byref(h),
            cancel_at=8,
        )
        return RPCSession(h.value)

    def close(self) -> None:
        """Closes the connection to the tracker."""
        if not self._closed:
            self._closed = True
            _lib.free(self._h)

    def __enter__(self) -> "TrackerSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"<kiln.rpc.TrackerSession {self.addr}{' closed' if self._closed else ''}>"


def connect_tracker(host: str, port: Optional[int] = None, token: Optional[str] = None, token_file: Optional[str] = None) -> TrackerSession:
    """Connects to the tracker at host:port. With port left out, host is an
    address list as kiln's --tracker flag takes it: "HOST:PORT", or the
    replicas of a tracker cluster separated by commas
    ("10.0.0.1:9190,10.0.0.2:9190"); the connection goes to the one that
    answers and fails over to the others when it is lost. token is the
    fleet's token (or token_file a file holding it; KILN_TOKEN_FILE is read
    when neither is given)."""
    h = _lib.Handle()
    if port is None:
        if not isinstance(host, str) or not host:
            raise KilnValueError(f"tracker address {host!r}: want HOST:PORT, or several separated by commas (or give port)")
        addr = host.encode()
    else:
        addr = _addr(host, port)
    _lib.blocking(lib.kiln_tracker_connect, addr, _token(token, token_file), 0, ctypes.byref(h), cancel_at=2)
    return TrackerSession(h.value, addr.decode())
