"""The time evaluator's validity report from Python: verdict, reason,
spread and the machine's state, here and on a leased device."""

import numpy as np

import kiln
from conftest import MATMUL
from kiln.runtime import BenchmarkResult


def _args(dev):
    rng = np.random.default_rng(2)
    a = kiln.nd.array(rng.random((16, 8), dtype=np.float32), dev)
    b = kiln.nd.array(rng.random((8, 4), dtype=np.float32), dev)
    return a, b, kiln.nd.empty((16, 4), "float32", dev)


def _check_report(r, n):
    rep = r.report
    assert isinstance(rep, kiln.TimeReport)
    assert rep.n == n and len(r.results) == n
    assert r.verdict == rep.verdict and r.verdict in ("stable", "noisy")
    assert rep.stable == (r.verdict == "stable")
    assert r.cv == rep.cv and r.cv >= 0
    assert rep.min <= rep.median <= rep.max
    assert rep.stable_within == 0.02
    assert rep.machine["cpus"] > 0 and "load_avg" in rep.machine
    assert "verdict: " in repr(r)
    if r.verdict == "noisy":
        assert r.reason


def test_local_time_evaluator_report(tmp_path):
    path = kiln.build(MATMUL, output=str(tmp_path / "m.kiln"), progress=False)
    mod = kiln.local().load_module(path)
    dev = kiln.cpu(0)
    a, b, c = _args(dev)
    r = mod.time_evaluator("matrix_multiply", dev, number=5, repeat=6)(a, b, c)
    _check_report(r, 6)
    assert r.report.ci_low <= r.report.median <= r.report.ci_high
    r = mod.time_evaluator("matrix_multiply", dev, number=5, repeat=2)(a, b, c)
    _check_report(r, 2)
    assert r.verdict == "noisy"
    assert r.reason.startswith("too few samples (n=2) for a 95% interval"), r.reason


def test_remote_time_evaluator_report(tracker, tmp_path):
    path = kiln.build(MATMUL, tracker=tracker, output=str(tmp_path / "matmul.kiln"), progress=False)
    with tracker.request("cpu", session_timeout=60, wait=60) as remote:
        remote.upload(path)
        mod = remote.load_module("matmul.kiln")
        dev = remote.cpu(0)
        r = mod.time_evaluator("matrix_multiply", dev, number=2, repeat=6, min_repeat_ms=1)(*_args(dev))
        _check_report(r, 6)
        assert r.report.machine["other_sessions"] == 0


def test_result_without_report():
    # What a device daemon that predates the report sends.
    r = BenchmarkResult({"results": [1.0, 3.0], "mean": 2.0, "median": 2.0, "min": 1.0, "max": 3.0, "std": 1.0, "number": 1})
    assert r.report is None and r.verdict == "" and r.reason == ""
    assert r.cv == 0.5
    assert "verdict" not in repr(r)
