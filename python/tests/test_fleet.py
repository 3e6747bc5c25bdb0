"""The seed matmul built through the tracker, run and timed on a leased
device from Python, checked against numpy."""

import os
import subprocess
import sys

import numpy as np

import kiln
from conftest import EXAMPLES, MATMUL, free_port


def test_summary_lists_the_device_and_the_compiler(tracker):
    s = tracker.summary()
    keys = {k["key"]: k for k in s["keys"]}
    assert "cpu" in keys
    assert s["compilers"], s
    text = tracker.text_summary()
    # TVM's form: the server list, then each key's total, free and pending.
    assert "Queue Status" in text and any(line.split()[:4] == ["cpu", "1", "1", "0"] for line in text.splitlines()), text
    assert s["queue_info"]["cpu"] == {"free": 1, "pending": 0}
    assert any(srv["key"] == "server:cpu" for srv in s["server_info"]), s["server_info"]
    assert "TrackerSession 127.0.0.1:" in repr(tracker)


def test_build_through_the_tracker_run_and_time(tracker, tmp_path, capfd):
    path = kiln.build(MATMUL, tracker=tracker, output=str(tmp_path / "matmul.kiln"))
    assert path == str(tmp_path / "matmul.kiln")
    err = capfd.readouterr().err
    assert "build job" in err and "queued" in err, err  # progress was printed
    with tracker.request("cpu", priority=1, session_timeout=60, wait=60) as remote:
        assert "RPCSession 127.0.0.1:" in repr(remote) and "key='cpu'" in repr(remote)
        remote.upload(path)
        mod = remote.load_module("matmul.kiln")
        assert mod.functions == ["matrix_multiply"]
        dev = remote.cpu(0)
        rng = np.random.default_rng(0)
        a_np = rng.random((64, 48), dtype=np.float32)
        b_np = rng.random((48, 32), dtype=np.float32)
        a = kiln.nd.array(a_np, dev)
        b = kiln.nd.array(b_np, dev)
        c = kiln.nd.empty((64, 32), "float32", dev)
        assert "remote shape=(64, 32) dtype=float32" in repr(c)
        mod["matrix_multiply"](a, b, c)
        np.testing.assert_allclose(c.numpy(), a_np @ b_np, rtol=1e-5)
        c.copyfrom(np.zeros((64, 32), np.float32))
        mod.matrix_multiply(a, b, c)  # attribute access, as TVM allows
        np.testing.assert_allclose(c.numpy(), a_np @ b_np, rtol=1e-5)

        ftimer = mod.time_evaluator("matrix_multiply", dev, number=10, repeat=3, min_repeat_ms=5)
        r = ftimer(a, b, c)
        assert len(r.results) == 3
        assert r.min <= r.median <= r.max and r.min <= r.mean <= r.max
        assert r.std >= 0 and r.min > 0
        assert "mean (ms)" in repr(r)


def test_direct_session_on_a_standalone_daemon(fleet, kiln_binary, matmul_artifact, tmp_path):
    port = free_port()
    p = fleet.start("standalone", "rpcserver", "--key", "solo", "--listen", f"127.0.0.1:{port}", "--token-file", fleet.token_file)
    try:
        import time

        deadline = time.monotonic() + 60
        while True:
            try:
                remote = kiln.rpc.connect("127.0.0.1", port, token=fleet.token)
                break
            except kiln.SessionError:
                if time.monotonic() > deadline or p.poll() is not None:
                    raise
                time.sleep(0.2)
        with remote:
            remote.upload(matmul_artifact)
            mod = remote.load_module("matmul.kiln")
            dev = remote.cpu()
            x = np.arange(12, dtype=np.float32).reshape(3, 4)
            y = np.ones((4, 2), np.float32)
            a, b, c = kiln.nd.array(x, dev), kiln.nd.array(y, dev), kiln.nd.empty((3, 2), "float32", dev)
            mod["matrix_multiply"](a, b, c)
            np.testing.assert_allclose(c.numpy(), x @ y)
    finally:
        p.terminate()
        p.wait(timeout=20)


def test_tvm_style_script_runs_as_written(fleet, tmp_path):
    env = dict(os.environ, KILN_TRACKER=fleet.tracker_addr, KILN_TOKEN_FILE=fleet.token_file, TMPDIR=str(tmp_path),
               PYTHONPATH=os.path.dirname(os.path.dirname(kiln.__file__)))
    r = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "tvm_style.py")],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "matches numpy" in r.stdout, r.stdout
