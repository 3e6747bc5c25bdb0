"""TVM's rpc.Server, rpc.tracker.Tracker and rpc.proxy.Proxy as kiln processes: each starts
the kiln binary (``kiln rpcserver``, ``kiln tracker``, ``kiln proxy``) on a free port of the
range asked for, waits until it serves, and stops it with terminate().
The binary is $KILN_BINARY, else ``kiln`` on PATH."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any, Optional, Sequence, Tuple

from .errors import KilnValueError, SessionError

# How long a process may take to start serving.
_START_TIMEOUT = 120.0


def _binary() -> str:
    b = os.environ.get("KILN_BINARY") or shutil.which("kiln")
    if not b:
        raise SessionError("the kiln binary was not found: set KILN_BINARY or put kiln on PATH")
    return b


def _free_port(host: str, port: int, port_end: int) -> int:
    for p in range(port, max(port_end, port + 1)):
        with socket.socket() as s:
            # As kiln's listeners do (Go sets SO_REUSEADDR): a port whose
            # last listener has just gone (connections in TIME_WAIT) is free.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, p))
            except OSError:
                continue
            return p
    raise SessionError(f"no free port on {host} from {port} to {port_end}")


def _wait_listening(proc: subprocess.Popen, host: str, port: int, log: str) -> None:
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SessionError(f"{proc.args[1]} exited with {proc.returncode}: {_tail(log)}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SessionError(f"{proc.args[1]} did not listen on {host}:{port} within {_START_TIMEOUT:.0f} s: {_tail(log)}")


def _tail(log: str) -> str:
    try:
        with open(log, errors="replace") as f:
            return "".join(f.readlines()[-10:])
    except OSError:
        return ""


class _Process:
    """A kiln process and its log and working directory."""

    def __init__(self, args: Sequence[str], host: str, port: int) -> None:
        self._dir = tempfile.mkdtemp(prefix="kiln-" + args[0] + "-")
        self._log = os.path.join(self._dir, args[0] + ".log")
        self.host, self.port = host, port
        with open(self._log, "wb") as f:
            self.proc = subprocess.Popen([_binary(), *args], stdout=f, stderr=subprocess.STDOUT, cwd=self._dir)
        try:
            _wait_listening(self.proc, host, port, self._log)
        except BaseException:
            self.terminate()
            raise

    def terminate(self) -> None:
        """Stops the process (SIGTERM, then SIGKILL after 20 s)."""
        p = getattr(self, "proc", None)
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __del__(self) -> None:
        try:
            self.terminate()
        except Exception:
            pass


class Tracker(_Process):
    """A kiln tracker (TVM's rpc.tracker.Tracker) on host, on the first free
    port from port to port_end; its clients use kiln.rpc.connect_tracker.
    silent, reuse_addr and timeout are accepted for TVM's signature."""

    def __init__(self, host: str = "127.0.0.1", port: int = 9190, port_end: int = 9199, silent: bool = False,
                 reuse_addr: bool = True, timeout: Optional[float] = None, token_file: Optional[str] = None) -> None:
        p = _free_port(host, port, port_end)
        data = tempfile.mkdtemp(prefix="kiln-tracker-data-")
        self._data = data
        args = ["tracker", "--data", data, "--listen", f"{host}:{p}"]
        token_file = token_file or os.environ.get("KILN_TOKEN_FILE")
        if token_file:
            args += ["--token-file", token_file]
        super().__init__(args, host, p)

    def terminate(self) -> None:
        super().terminate()
        shutil.rmtree(getattr(self, "_data", ""), ignore_errors=True)


class Server(_Process):
    """A kiln device daemon (TVM's rpc.Server) serving key on host, on the
    first free port from port to port_end, registered with the tracker at
    tracker_addr (host, port) when given (and advertised there as
    custom_addr when given). The constructor returns once the daemon
    listens and, with a tracker, has registered.

    With is_proxy, host:port is a kiln proxy (kiln.rpc.Proxy) that the
    daemon connects out to, as a board behind NAT does; its port is then
    the one the proxy opened for it (the daemon and the proxy share a
    token: token_file, else KILN_TOKEN_FILE). load_library has kiln's form in
    plugins: shared objects of kiln's packed ABI whose functions every
    session serves as globals (``kiln rpcserver --plugin``)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 9091,
        port_end: int = 9199,
        is_proxy: bool = False,
        tracker_addr: Optional[Tuple[str, int]] = None,
        key: str = "",
        load_library: Any = None,
        custom_addr: Optional[str] = None,
        silent: bool = False,
        no_fork: bool = False,
        server_init_callback: Any = None,
        reuse_addr: bool = True,
        timeout: Optional[float] = None,
        plugins: Sequence[str] = (),
        token_file: Optional[str] = None,
        session_timeout: Optional[str] = None,
    ) -> None:
        if server_init_callback is not None:
            raise KilnValueError(
                "rpc.Server(server_init_callback=...): a kiln daemon's sessions run in a sandboxed worker process "
                "of the kiln binary, not in Python; serve functions from a plugin (plugins=[...])"
            )
        if load_library:
            raise KilnValueError("rpc.Server(load_library=...): give plugins=[...], shared objects of kiln's packed ABI")
        self.key = key or "kiln"
        if is_proxy:
            # host:port is a kiln proxy (kiln.rpc.Proxy) the daemon connects
            # out to; clients reach it at the port the proxy opens for it.
            args = ["rpcserver", "--key", self.key, "--proxy", f"{host}:{port}", "--listen", "127.0.0.1:0"]
        else:
            p = _free_port(host, port, port_end)
            args = ["rpcserver", "--key", self.key, "--listen", f"{host}:{p}"]
        if tracker_addr is not None:
            args += ["--tracker", f"{tracker_addr[0]}:{tracker_addr[1]}"]
        if custom_addr:
            args += ["--advertise", f"{custom_addr}:{p}"]
        token_file = token_file or os.environ.get("KILN_TOKEN_FILE")
        if token_file:
            args += ["--token-file", token_file]
        if session_timeout:
            args += ["--session-timeout", session_timeout]
        for lib in plugins:
            args += ["--plugin", os.fspath(lib)]
        self.tracker_addr = tracker_addr
        if is_proxy:
            if not token_file:
                raise KilnValueError("rpc.Server(is_proxy=True): a daemon behind a proxy needs a token (token_file or KILN_TOKEN_FILE), as the proxy does")
            self._start_via_proxy(args, host, tracker_addr is not None or bool(getattr(_proxies.get((host, port)), "tracker_addr", None)))
            return
        super().__init__(args, host, p)
        if tracker_addr is not None:
            self._wait_registered(custom_addr or host)

    def _start_via_proxy(self, args: Sequence[str], proxy_host: str, registers: bool) -> None:
        """Starts the daemon and waits until the proxy has given it its
        port (and, when it registers with a tracker, until it has)."""
        self._dir = tempfile.mkdtemp(prefix="kiln-rpcserver-")
        self._log = os.path.join(self._dir, "rpcserver.log")
        with open(self._log, "wb") as f:
            self.proc = subprocess.Popen([_binary(), *args], stdout=f, stderr=subprocess.STDOUT, cwd=self._dir)
        want = "registered with tracker" if registers else "device daemon listening"
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.terminate()
                raise SessionError(f"rpcserver exited with {self.proc.returncode}: {_tail(self._log)}")
            with open(self._log, errors="replace") as f:
                text = f.read()
            m = re.search(r'public=(\S+):(\d+)', text)
            if m and want in text:
                self.host, self.port = m.group(1), int(m.group(2))
                return
            time.sleep(0.05)
        self.terminate()
        raise SessionError(f"the device daemon did not come up through the proxy on {proxy_host}: {_tail(self._log)}")

    def _wait_registered(self, host: str) -> None:
        from .rpc import connect_tracker

        want = f"{host}:{self.port}"
        # A daemon on every interface (0.0.0.0) registers the address the
        # tracker sees it from: any address on its port will do.
        anyhost = host in ("0.0.0.0", "::", "")

        def registered(addr: str) -> bool:
            return addr.endswith(f":{self.port}") if anyhost else addr == want

        deadline = time.monotonic() + _START_TIMEOUT
        with connect_tracker(self.tracker_addr[0], self.tracker_addr[1]) as t:
            while time.monotonic() < deadline:
                if any(registered(d.get("addr", "")) for d in t.summary().get("devices") or []):
                    return
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.terminate()
        raise SessionError(f"the device daemon on {want} did not register with the tracker: {_tail(self._log)}")


# The proxies started here, by (host, port): a daemon started behind one
# registers with its tracker.
_proxies: dict = {}


class Proxy(_Process):
    """A kiln proxy (TVM's rpc.proxy.Proxy): ``kiln proxy`` on host, on the
    first free port from port to port_end, for device daemons behind NAT
    (``rpc.Server(host=proxy.host, port=proxy.port, is_proxy=True)``). A
    daemon that connects gets a port of the proxy's, which clients dial
    (the tracker's server_info lists it); with tracker_addr, daemons that
    name no tracker register with that one, as TVM's proxy registers its
    servers. The proxy admits daemons by a token (token_file, else
    KILN_TOKEN_FILE). web_port, timeout_client, timeout_server and index
    are accepted for TVM's signature."""

    def __init__(self, host: str = "127.0.0.1", port: int = 9091, port_end: int = 9199, web_port: int = 0,
                 timeout_client: float = 600, timeout_server: float = 600, tracker_addr: Optional[Tuple[str, int]] = None,
                 index_page: Any = None, resource_files: Any = None, token_file: Optional[str] = None) -> None:
        token_file = token_file or os.environ.get("KILN_TOKEN_FILE")
        if not token_file:
            raise KilnValueError("rpc.Proxy: kiln's proxy admits device daemons by a token: give token_file or set KILN_TOKEN_FILE")
        p = _free_port(host, port, port_end)
        args = ["proxy", "--listen", f"{host}:{p}", "--token-file", token_file]
        if tracker_addr is not None:
            args += ["--tracker", f"{tracker_addr[0]}:{tracker_addr[1]}"]
        self.tracker_addr = tracker_addr
        super().__init__(args, host, p)
        _proxies[(host, p)] = self

    def terminate(self) -> None:
        _proxies.pop((self.host, self.port), None)
        super().terminate()
