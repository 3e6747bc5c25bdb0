"""A real kiln fleet on loopback for the tests: the kiln binary as tracker,
compiler node and device daemon (key "cpu"), with a token, started once per
test session and stopped at its end.

The kiln binary is $KILN_BINARY, or built from the repository with go build.
The package under test is the installed one (pip install ./python), or the
source tree with $KILN_LIBRARY naming a libkiln.so.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from typing import Iterator

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
MATMUL = os.path.join(EXAMPLES, "matmul.py")

if os.environ.get("KILN_LIBRARY"):
    # Testing the source tree against a library built by hand.
    sys.path.insert(0, os.path.dirname(HERE))

import kiln  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def kiln_binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    env = os.environ.get("KILN_BINARY")
    if env:
        return env
    go = shutil.which("go") or "/usr/local/go/bin/go"
    out = str(tmp_path_factory.mktemp("bin") / "kiln")
    subprocess.run([go, "build", "-o", out, "./cmd/kiln"], cwd=REPO, check=True)
    return out


class Fleet:
    """The processes of a loopback fleet and how to reach them."""

    def __init__(self, binary: str, root: str) -> None:
        self.binary = binary
        self.root = root
        self.token = secrets.token_hex(16)
        self.token_file = os.path.join(root, "token")
        with open(self.token_file, "w") as f:
            f.write(self.token)
        self.tracker_port = free_port()
        self.device_port = free_port()
        self.procs: list[subprocess.Popen] = []
        self.logs: list[str] = []

    @property
    def tracker_addr(self) -> str:
        return f"127.0.0.1:{self.tracker_port}"

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = os.path.join(self.root, name + ".log")
        self.logs.append(log)
        with open(log, "wb") as f:
            p = subprocess.Popen([self.binary, *args], stdout=f, stderr=subprocess.STDOUT, cwd=self.root)
        self.procs.append(p)
        return p

    def up(self) -> None:
        tok = ["--token-file", self.token_file]
        self.start("tracker", "tracker", "--data", os.path.join(self.root, "tracker"), "--listen", self.tracker_addr, *tok)
        self.start("compiler", "compiler", "--tracker", self.tracker_addr, *tok)
        self.start(
            "device", "rpcserver", "--tracker", self.tracker_addr, "--key", "cpu",
            "--listen", f"127.0.0.1:{self.device_port}", *tok,
        )
        deadline = time.monotonic() + 120
        last = None
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[1]} exited with {p.returncode}:\n{self.tail()}")
            try:
                with kiln.rpc.connect_tracker("127.0.0.1", self.tracker_port, token=self.token) as t:
                    s = t.summary()
                if any(k["key"] == "cpu" and k.get("free", 0) > 0 for k in s.get("keys") or []) and s.get("compilers"):
                    return
            except kiln.KilnError as e:
                last = e
            time.sleep(0.2)
        raise RuntimeError(f"the fleet did not come up in 120 s (last error: {last}):\n{self.tail()}")

    def tail(self) -> str:
        out = []
        for log in self.logs:
            with open(log, errors="replace") as f:
                out.append(f"--- {os.path.basename(log)}\n" + "".join(f.readlines()[-20:]))
        return "\n".join(out)

    def down(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="session")
def fleet(kiln_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(kiln_binary, str(tmp_path_factory.mktemp("fleet")))
    try:
        f.up()
        yield f
    finally:
        f.down()


@pytest.fixture
def tracker(fleet: Fleet) -> Iterator["kiln.rpc.TrackerSession"]:
    t = kiln.rpc.connect_tracker("127.0.0.1", fleet.tracker_port, token=fleet.token)
    yield t
    t.close()


@pytest.fixture
def remote(tracker: "kiln.rpc.TrackerSession") -> Iterator["kiln.rpc.RPCSession"]:
    s = tracker.request("cpu", session_timeout=120, wait=60, progress=False)
    yield s
    s.close()


@pytest.fixture(scope="session")
def matmul_artifact(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The matmul built here (the remote build is tested on its own)."""
    out = str(tmp_path_factory.mktemp("art") / "matmul.kiln")
    return kiln.build(MATMUL, output=out, progress=False)
