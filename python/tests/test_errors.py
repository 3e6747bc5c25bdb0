"""Bad input: each a Python exception naming what was wrong, never a crash
of the interpreter."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import kiln
from conftest import HERE, free_port


@pytest.fixture(autouse=True)
def sigint_raises():
    """Ctrl-C raises KeyboardInterrupt here and in the scripts these tests
    start, even when the test run itself was started with SIGINT ignored
    (as a shell does for a command it starts in the background): a
    disposition of SIG_IGN would pass on to the children, a handler does
    not."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_wrong_token(fleet):
    with pytest.raises(kiln.TrackerError, match="authentication failed"):
        kiln.rpc.connect_tracker("127.0.0.1", fleet.tracker_port, token="not-the-token")
    with pytest.raises(kiln.SessionError, match="authentication failed"):
        kiln.rpc.connect("127.0.0.1", fleet.device_port, token="not-the-token")


def test_unknown_key(tracker):
    with pytest.raises(kiln.TrackerError, match='no device is registered under key "no-such-board".*"cpu"'):
        tracker.request("no-such-board", progress=False)


def test_tracker_address_list(fleet):
    """An address list fails over to the replica that answers: the first
    address has nothing listening."""
    dead = free_port()
    addrs = f"127.0.0.1:{dead},127.0.0.1:{fleet.tracker_port}"
    with kiln.rpc.connect_tracker(addrs, token=fleet.token) as t:
        assert "cpu" in {k["key"] for k in t.summary()["keys"]}
        assert addrs in repr(t)


def test_dead_tracker():
    port = free_port()  # nothing listens there
    with pytest.raises(kiln.TrackerError, match=f"127.0.0.1:{port}"):
        kiln.rpc.connect_tracker("127.0.0.1", port, token="x")


def test_bad_addresses():
    with pytest.raises(kiln.KilnValueError, match="port"):
        kiln.rpc.connect_tracker("127.0.0.1", 0)
    with pytest.raises(kiln.KilnValueError, match="entry 2 is empty"):
        kiln.rpc.connect_tracker("127.0.0.1:9190,")
    with pytest.raises(kiln.KilnValueError, match='tracker address "localhost": want HOST:PORT'):
        kiln.rpc.connect_tracker("localhost")
    with pytest.raises(kiln.KilnValueError, match="port"):
        kiln.rpc.connect("127.0.0.1", "9090")


@pytest.fixture(params=["local", "remote"])
def session_and_mod(request, matmul_artifact):
    if request.param == "local":
        s = kiln.local()
        yield s, s.load_module(matmul_artifact)
        return
    remote = request.getfixturevalue("remote")
    remote.upload(matmul_artifact)
    yield remote, remote.load_module("matmul.kiln")


def test_wrong_shape_and_dtype(session_and_mod):
    """A wrong shape, dtype or argument count is a KilnValueError on a
    remote device as here, and its message names the function once."""
    s, mod = session_and_mod
    dev = s.cpu(0)
    a = kiln.nd.array(np.ones((4, 3), np.float32), dev)
    b = kiln.nd.array(np.ones((5, 2), np.float32), dev)  # K disagrees
    c = kiln.nd.empty((4, 2), "float32", dev)
    with pytest.raises(kiln.KilnValueError, match="K") as shape:
        mod["matrix_multiply"](a, b, c)
    assert str(shape.value).count("matrix_multiply") == 1, str(shape.value)
    assert "func.call" not in str(shape.value), str(shape.value)
    d = kiln.nd.array(np.ones((3, 2), np.float64), dev)
    with pytest.raises(kiln.KilnValueError, match="float64"):
        mod["matrix_multiply"](a, d, c)
    with pytest.raises(kiln.KilnValueError, match="want 3, got 2"):
        mod["matrix_multiply"](a, c)
    with pytest.raises(kiln.KilnValueError, match="numpy array"):
        mod["matrix_multiply"](np.ones((4, 3), np.float32), b, c)
    with pytest.raises(kiln.KilnValueError, match="source is shape"):
        a.copyfrom(np.ones((3, 4), np.float32))
    with pytest.raises(kiln.KilnValueError, match="no_such_function.*matrix_multiply"):
        mod["no_such_function"]
    with pytest.raises(AttributeError, match="no_such_function"):
        mod.no_such_function


def test_freed_array(session_and_mod):
    s, mod = session_and_mod
    dev = s.cpu(0)
    a = kiln.nd.array(np.ones((2, 2), np.float32), dev)
    c = kiln.nd.empty((2, 2), "float32", dev)
    a.free()
    a.free()  # harmless
    with pytest.raises(kiln.KilnValueError, match="freed"):
        mod["matrix_multiply"](a, a, c)
    with pytest.raises(kiln.KilnValueError, match="freed"):
        a.numpy()
    assert "freed" in repr(a)


def test_closed_session(remote, matmul_artifact):
    remote.upload(matmul_artifact)
    mod = remote.load_module("matmul.kiln")
    dev = remote.cpu(0)
    a = kiln.nd.array(np.ones((2, 2), np.float32), dev)
    remote.close()
    assert "closed" in repr(remote)
    with pytest.raises(kiln.SessionError, match="closed"):
        mod["matrix_multiply"](a, a, a)
    with pytest.raises(kiln.SessionError, match="closed"):
        a.numpy()
    with pytest.raises(kiln.SessionError, match="closed"):
        kiln.nd.empty((2,), "float32", dev)
    with pytest.raises(kiln.SessionError, match="closed"):
        remote.upload(matmul_artifact)


def test_non_contiguous_numpy(session_and_mod):
    s, mod = session_and_mod
    dev = s.cpu(0)
    x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]  # a strided view
    assert not x.flags.c_contiguous
    a = kiln.nd.array(x, dev)  # copied to a contiguous array
    np.testing.assert_array_equal(a.numpy(), x)
    b = kiln.nd.empty((4, 3), "float32", dev)
    b.copyfrom(x)  # also copied
    np.testing.assert_array_equal(b.numpy(), x)
    with pytest.raises(kiln.KilnValueError, match="not C-contiguous"):
        kiln.nd.from_dlpack(x)  # sharing is refused, clearly


def test_bad_dtype_and_shape():
    with pytest.raises(kiln.KilnValueError, match="complex64"):
        kiln.nd.empty((2,), "complex64")
    with pytest.raises(kiln.KilnValueError, match="shape"):
        kiln.nd.empty((2, -1), "float32")
    with pytest.raises(kiln.KilnValueError, match="shape"):
        kiln.nd.empty("abc", "float32")


def test_build_errors(tmp_path):
    with pytest.raises(kiln.BuildError, match="bad.py"):
        kiln.build("@T.prim_func\ndef f(:\n", name="bad.py", output=str(tmp_path / "x.kiln"), progress=False)
    with pytest.raises(kiln.KilnValueError, match="no file"):
        kiln.build("missing.py")
    with pytest.raises(kiln.KilnValueError, match="target"):
        kiln.build(os.path.join(os.path.dirname(HERE), "examples", "matmul.py"), target="tpu",
                   output=str(tmp_path / "y.kiln"), progress=False)


def test_ctrl_c_cancels_a_waiting_request(fleet):
    """A request queued behind a lease another session holds: SIGINT ends
    the wait at once with KeyboardInterrupt, and the interpreter lives on."""
    holder = kiln.rpc.connect_tracker("127.0.0.1", fleet.tracker_port, token=fleet.token)
    held = holder.request("cpu", wait=60, progress=False)
    try:
        script = textwrap.dedent(f"""
            import sys, time
            sys.path[:0] = {sys.path!r}
            import kiln
            t = kiln.rpc.connect_tracker("127.0.0.1", {fleet.tracker_port}, token={fleet.token!r})
            print("waiting", flush=True)
            start = time.monotonic()
            try:
                t.request("cpu", wait=120)
            except KeyboardInterrupt:
                print("interrupted after %.1f s" % (time.monotonic() - start), flush=True)
                print("live handles", kiln.live_handles(), flush=True)
            # The tracker connection is usable after the interrupted wait.
            print("keys", [k["key"] for k in t.summary()["keys"]], flush=True)
        """)
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "waiting"
        time.sleep(1.5)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert "interrupted after" in out, out + err
        assert "waiting for a device: position 1" in err, err
        assert "live handles 1" in out, out  # only the tracker connection
        assert "keys ['cpu']" in out, out + err
    finally:
        held.close()
        holder.close()


def test_ctrl_c_cancels_a_queued_build(fleet, tmp_path):
    """A build queued at a tracker no compiler node serves: SIGINT ends the
    wait with KeyboardInterrupt and the job is cancelled at the tracker."""
    port = free_port()
    p = fleet.start("lonely-tracker", "tracker", "--data", str(tmp_path / "t"), "--listen", f"127.0.0.1:{port}",
                    "--token-file", fleet.token_file)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                kiln.rpc.connect_tracker("127.0.0.1", port, token=fleet.token).close()
                break
            except kiln.TrackerError:
                if time.monotonic() > deadline or p.poll() is not None:
                    raise
                time.sleep(0.2)
        matmul = os.path.join(os.path.dirname(HERE), "examples", "matmul.py")
        script = textwrap.dedent(f"""
            import sys
            sys.path[:0] = {sys.path!r}
            import kiln
            try:
                kiln.build({matmul!r}, tracker="127.0.0.1:{port}", token={fleet.token!r}, output={str(tmp_path / "m.kiln")!r})
            except KeyboardInterrupt:
                print("interrupted", flush=True)
                print("live handles", kiln.live_handles(), flush=True)
        """)
        child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = child.stderr.readline()
        assert "queued" in line, line
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        assert "interrupted" in out and "live handles 0" in out, out + err
        with kiln.rpc.connect_tracker("127.0.0.1", port, token=fleet.token) as t:
            jobs = t.summary()["jobs"]
        assert jobs and jobs[0]["state"] == "cancelled", (jobs, err)
        assert not os.path.exists(tmp_path / "m.kiln")
    finally:
        p.terminate()
        p.wait(timeout=20)


def test_ctrl_c_returns_once_the_call_has():
    """KeyboardInterrupt leaves a blocking call only after the call itself
    returned: the handles it used are free to use (or free) again. The call
    here is Python standing in for libkiln's; it interrupts the main thread
    itself, so the interrupt always lands inside blocking."""
    from kiln import _lib

    main = threading.main_thread().ident
    finished = []

    def call(token):
        signal.pthread_kill(main, signal.SIGINT)
        time.sleep(0.5)
        finished.append(token)
        return 0

    with pytest.raises(KeyboardInterrupt):
        _lib.blocking(call, None, cancel_at=0)
    assert finished, "blocking returned while the call still ran"


def test_blocking_calls_release_the_gil(matmul_artifact):
    """The time evaluator runs in C for a while; another Python thread runs
    meanwhile."""
    mod = kiln.local().load_module(matmul_artifact)
    x = kiln.nd.array(np.ones((32, 32), np.float32))
    c = kiln.nd.empty((32, 32), "float32")
    done = threading.Event()
    result = {}

    def timing():
        result["r"] = mod.time_evaluator("matrix_multiply", number=1, repeat=5, min_repeat_ms=100)(x, x, c)
        done.set()

    t = threading.Thread(target=timing)
    t.start()
    ticks = 0
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    assert len(result["r"].results) == 5
    assert ticks > 10, ticks  # this thread ran while the other was in the time evaluator


def test_a_device_the_daemon_does_not_have(remote):
    with pytest.raises(kiln.SessionError, match="cuda"):
        kiln.nd.empty((2,), "float32", remote.cuda(0))
    with pytest.raises(kiln.KilnValueError, match="device type 'tpu'"):
        remote.device("tpu")


def test_direct_session_on_a_daemon_that_serves_leases_only(fleet):
    with pytest.raises(kiln.SessionError, match="opens no session on the fleet token"):
        kiln.rpc.connect("127.0.0.1", fleet.device_port, token=fleet.token)
