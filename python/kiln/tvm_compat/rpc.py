"""tvm.rpc on kiln: kiln.rpc's sessions, trackers and processes under
TVM's names, with TVM's submodules tvm.rpc.tracker (Tracker) and
tvm.rpc.server (Server)."""

from __future__ import annotations

import sys
import types

from ..rpc import (
    LocalSession,
    Proxy,
    RPCSession,
    Server,
    Tracker,
    TrackerSession,
    connect,
    connect_tracker,
    local,
)
from ..errors import RPCError, RPCSessionTimeoutError

tracker = types.ModuleType(__name__ + ".tracker", "tvm.rpc.tracker on kiln: Tracker starts `kiln tracker`.")
tracker.Tracker = Tracker  # type: ignore[attr-defined]
server = types.ModuleType(__name__ + ".server", "tvm.rpc.server on kiln: Server starts `kiln rpcserver`.")
server.Server = Server  # type: ignore[attr-defined]
proxy = types.ModuleType(__name__ + ".proxy", "tvm.rpc.proxy on kiln: Proxy starts `kiln proxy`.")
proxy.Proxy = Proxy  # type: ignore[attr-defined]
client = types.ModuleType(__name__ + ".client", "tvm.rpc.client on kiln.")
for _n in ("RPCSession", "TrackerSession", "LocalSession", "connect", "connect_tracker"):
    setattr(client, _n, globals()[_n])
for _m in (tracker, server, proxy, client):
    sys.modules[_m.__name__] = _m

__all__ = [
    "LocalSession",
    "Proxy",
    "RPCError",
    "RPCSession",
    "RPCSessionTimeoutError",
    "Server",
    "Tracker",
    "TrackerSession",
    "client",
    "connect",
    "connect_tracker",
    "local",
    "proxy",
    "server",
    "tracker",
]
