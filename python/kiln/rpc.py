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
from .errors import KilnError, KilnValueError, RPCError, SessionError, TrackerError
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
        """Copies data into the session's directory as the file target:
        data is a local file's path (target defaults to its base name) or
        bytes (target required), as TVM's upload takes."""
        if isinstance(data, (bytes, bytearray, memoryview)):
            if not target:
                raise KilnValueError("upload: bytes need a target file name")
            b = bytes(data)
            buf = ctypes.create_string_buffer(b, len(b) or 1)
            _lib.blocking(lib.kiln_session_upload_bytes, self._live(), ctypes.cast(buf, ctypes.c_void_p), len(b),
                          target.encode(), 0, cancel_at=4)
            return
        path = os.fspath(data)
        name = target if target is not None else os.path.basename(path)
        _lib.blocking(lib.kiln_session_upload, self._live(), path.encode(), name.encode(), 0, cancel_at=3)

    def download(self, path: str) -> bytearray:
        """The contents of the session's file path (TVM's download)."""
        p, n = ctypes.c_void_p(), ctypes.c_int64()
        _lib.blocking(lib.kiln_session_download, self._live(), os.fspath(path).encode(), 0, ctypes.byref(p), ctypes.byref(n),
                      cancel_at=2)
        try:
            return bytearray(ctypes.string_at(p.value, n.value)) if n.value else bytearray()
        finally:
            lib.kiln_string_free(p)

    def listdir(self, path: str = ".") -> list:
        """The names of the session's files (TVM's listdir): under path, a
        directory of the session ("." or "" for all)."""
        out = ctypes.c_void_p()
        _lib.blocking(lib.kiln_session_listdir, self._live(), 0, ctypes.byref(out), cancel_at=1)
        names = [e["name"] for e in json.loads(_lib.take_string(out))]
        prefix = os.fspath(path).strip("/")
        if prefix in ("", "."):
            return names
        return [n[len(prefix) + 1:] for n in names if n.startswith(prefix + "/")]

    def remove(self, path: str) -> None:
        """Removes the session's file path (TVM's remove). As TVM's server
        does, a file that is not there is no error, and "" (the session's
        directory) removes nothing: the directory goes when the session
        ends."""
        path = os.fspath(path)
        if path.strip("/") in ("", "."):
            self._live()
            return
        try:
            _lib.blocking(lib.kiln_session_remove, self._live(), path.encode(), 0, cancel_at=2)
        except AttributeError:
            # Not found (kiln's not-found errors are also AttributeErrors).
            pass

    def download_linked_module(self, path: str) -> bytearray:
        """The shared library of the tar export path in the session's
        directory (TVM's download_linked_module). TVM links the tar's
        objects on the device; kiln's tar export carries the library it
        linked when it built the module, which this returns."""
        tar = bytes(self.download(path))
        p, n = ctypes.c_void_p(), ctypes.c_int64()
        _lib.check(lib.kiln_tar_linked(tar, len(tar), ctypes.byref(p), ctypes.byref(n)))
        try:
            return bytearray(ctypes.string_at(p.value, n.value))
        finally:
            lib.kiln_string_free(p)

    def system_lib(self) -> Any:
        """TVM's system library: kiln links no modules into its servers, so
        it is the view of the session's global functions (see
        kiln.runtime.SystemLib)."""
        from .runtime import SystemLib

        return SystemLib(self)

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


def _forget_local() -> None:
    # A forked child's local session belongs to the parent's library copy.
    global _local, _local_lock
    _local = None
    _local_lock = threading.Lock()


_lib._fork_hooks.append(_forget_local)


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


def LocalSession() -> RPCSession:
    """TVM's rpc.LocalSession(): the session on this machine (kiln.local();
    every call returns the same one, which lasts until the interpreter
    exits)."""
    return local()


def connect(
    host: str,
    port: int,
    key: str = "",
    session_timeout: float = 0,
    session_constructor_args: Optional[list] = None,
    token: Optional[str] = None,
    token_file: Optional[str] = None,
) -> RPCSession:
    """Opens a session on the device daemon at host:port directly (a daemon
    that is not registered with a tracker, or one you hold a lease on), as
    TVM's rpc.connect does. At a daemon key is accepted for TVM's
    signature (a kiln daemon serves whoever holds its token, whatever key
    it registers under); at a kiln proxy's port (rpc.Proxy, kiln proxy)
    it picks the board: the session opens on a board connected to the
    proxy with that key, as TVM's proxy matches keys. session_timeout (seconds, 0: the daemon's own limit) is kept
    by the daemon: it ends the session and frees the device once it has
    passed, even while this object lives (a later call raises
    RPCSessionTimeoutError). session_constructor_args
    ["rpc.Connect", host2, port2, key2, ...] asks for the device behind
    another server: kiln's data path never passes through a second daemon,
    so the session goes to host2:port2 directly; no other constructor
    exists."""
    if session_constructor_args:
        ctor = session_constructor_args[0]
        if ctor != "rpc.Connect" or len(session_constructor_args) < 3:
            raise SessionError(
                f"session constructor {ctor!r}: kiln's daemons have only rpc.Connect (host, port, key), "
                "which connects to that daemon directly"
            )
        host, port = session_constructor_args[1], int(session_constructor_args[2])
    if session_timeout is None or session_timeout < 0:
        raise KilnValueError(f"session_timeout {session_timeout!r}: want seconds, 0 or more")
    tok = _token(token, token_file)
    h = _lib.Handle()
    try:
        _lib.blocking(lib.kiln_connect_timeout, _addr(host, port), tok, float(session_timeout), 0,
                      ctypes.byref(h), cancel_at=3)
    except KilnError as e:
        # host:port is a kiln proxy's port for daemons: as TVM's proxy
        # does, it matches the client's key with a board connected with it.
        if _PROXY_REFUSAL not in str(e):
            raise
        if not key:
            raise RPCError(f"{host}:{port} is a kiln proxy ({_PROXY_REFUSAL}): give the key of the board to reach, "
                           "rpc.connect(host, port, key=KEY)") from None
        host, port = _proxy_lookup(host, port, key)
        _lib.blocking(lib.kiln_connect_timeout, _addr(host, port), tok, float(session_timeout), 0,
                      ctypes.byref(h), cancel_at=3)
    return RPCSession(h.value)


# The start of the refusal a kiln proxy's daemon port answers a client's
# hello with (cli/proxy.go's proxyClientRefusal).
_PROXY_REFUSAL = "kiln proxy: this port is for device daemons"


def _proxy_lookup(host: str, port: int, key: str) -> tuple:
    """Asks the kiln proxy at host:port for the address of a board connected
    with key (the port the proxy opened for it)."""
    import socket

    if not key.strip() or any(c.isspace() for c in key):
        raise KilnValueError(f"key {key!r}: a board's key has no spaces")
    with socket.create_connection((host, int(port)), timeout=30) as c:
        c.sendall(f"KILNPROXY1 lookup {key}\n".encode())
        buf = b""
        while not buf.endswith(b"\n") and len(buf) < 4096:
            part = c.recv(4096)
            if not part:
                break
            buf += part
    line = buf.decode(errors="replace").strip()
    if not line.startswith("ok "):
        why = line[len("error "):] if line.startswith("error ") else f"no answer ({line!r})"
        raise SessionError(f"connect to the proxy {host}:{port} with key {key!r}: {why}")
    addr = line[3:].strip()
    h, _, p = addr.rpartition(":")
    if not h or not p.isdigit():
        raise SessionError(f"connect to the proxy {host}:{port}: it gave the board's address {addr!r}, want HOST:PORT")
    return h.strip("[]"), int(p)


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
        queues and recent build jobs, and TVM's summary beside them:
        queue_info ({key: {"free", "pending"}}; a key seen before keeps
        free 0 once its last device has left) and server_info (one
        {"key": "server:KEY", "addr": [host, port]} per device that is up)."""
        out = ctypes.c_void_p()
        _lib.check(lib.kiln_tracker_summary(self._live(), ctypes.byref(out)))
        s = json.loads(_lib.take_string(out))
        seen = self.__dict__.setdefault("_seen_keys", set())
        queue = {k: {"free": 0, "pending": 0} for k in seen}
        for k in s.get("keys") or []:
            queue[k["key"]] = {"free": k.get("free", 0), "pending": k.get("pending", 0)}
            seen.add(k["key"])
        servers = []
        for d in s.get("devices") or []:
            if d.get("state") in ("lost", "quarantined") or not d.get("addr"):
                continue
            h, _, p = d["addr"].rpartition(":")
            servers.append({"key": f"server:{d.get('key', '')}", "addr": [h.strip("[]"), int(p) if p.isdigit() else p]})
        s["queue_info"], s["server_info"] = queue, servers
        return s

    def text_summary(self) -> str:
        """The summary as TVM's text_summary writes it: the servers, then
        each key's queue (total, free, pending)."""
        s = self.summary()
        rule = "-" * 40
        lines = ["Server List", rule, f"{'server-address':<24}key", rule]
        for srv in s["server_info"]:
            lines.append(f"{srv['addr'][0]}:{srv['addr'][1]:<12} {srv['key']}")
        lines += [rule, "", "Queue Status", rule, f"{'key':<24}{'total':>6}{'free':>6}{'pending':>8}", rule]
        totals = {k["key"]: k.get("free", 0) + k.get("busy", 0) for k in s.get("keys") or []}
        for key, q in sorted(s["queue_info"].items()):
            lines.append(f"{key:<24}{totals.get(key, 0):>6}{q['free']:>6}{q['pending']:>8}")
        lines.append(rule)
        return "\n".join(lines)

    def request_and_run(self, key: str, func: Any, priority: int = 1, session_timeout: float = 0, max_retry: int = 2) -> Any:
        """Requests a session on key and returns func(session), asking again
        up to max_retry times when the session fails (TVM's
        request_and_run). A failure of func that is not the session's is
        raised at once."""
        last: Optional[BaseException] = None
        for _ in range(max(1, int(max_retry))):
            try:
                sess = self.request(key, priority=priority, session_timeout=session_timeout, progress=False)
            except TrackerError as e:
                last = e
                continue
            try:
                return func(sess)
            except SessionError as e:
                last = e
            finally:
                sess.close()
        raise RPCError(f"request_and_run on key {key!r}: failed {max_retry} times: {last}") from last

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


from ._fleet import Proxy, Server, Tracker  # noqa: E402
