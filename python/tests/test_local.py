"""kiln.local(): build here, run here, arrays shared with numpy (and
PyTorch, where installed) without copies; no handle or memory leaks."""

import gc
import os
import shutil

import numpy as np
import pytest

import kiln
from conftest import MATMUL


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def test_local_build_run_and_time(tmp_path, capfd):
    path = kiln.build(MATMUL, output=str(tmp_path / "m.kiln"))
    assert "built " in capfd.readouterr().err
    s = kiln.local()
    assert s is kiln.local() and "LocalSession cpu:0" in repr(s)
    mod = s.load_module(path)
    dev = kiln.cpu(0)
    rng = np.random.default_rng(1)
    a_np, b_np = rng.random((16, 8), dtype=np.float32), rng.random((8, 4), dtype=np.float32)
    a, b, c = kiln.nd.array(a_np, dev), kiln.nd.array(b_np, dev), kiln.nd.empty((4,), "float32", dev)
    c = kiln.nd.empty((16, 4), "float32", dev)
    mod["matrix_multiply"](a, b, c)
    np.testing.assert_allclose(c.numpy(), a_np @ b_np, rtol=1e-5)
    r = mod.time_evaluator("matrix_multiply", dev, number=5, repeat=2)(a, b, c)
    assert len(r.results) == 2 and r.mean > 0


def test_build_from_text(tmp_path):
    with open(MATMUL) as f:
        text = f.read()
    path = kiln.build(text, progress=False)
    try:
        assert path.endswith("module.kiln")
        assert kiln.local().load_module(path).functions == ["matrix_multiply"]
    finally:
        shutil.rmtree(os.path.dirname(path))


def test_zero_copy_with_numpy(matmul_artifact):
    mod = kiln.local().load_module(matmul_artifact)
    a_np = np.ones((8, 8), np.float32)
    b_np = np.full((8, 8), 2, np.float32)
    c_np = np.zeros((8, 8), np.float32)
    a, b, c = kiln.nd.from_dlpack(a_np), kiln.nd.from_dlpack(b_np), kiln.nd.from_dlpack(c_np)
    mod["matrix_multiply"](a, b, c)
    assert (c_np == 16).all()  # the kernel wrote numpy's own memory
    view = np.asarray(c)  # __array_interface__: kiln's memory seen by numpy
    assert np.shares_memory(view, c_np)
    d = kiln.nd.empty((3,), "int32")
    d.copyfrom(np.array([1, 2, 3], np.int32))
    shared = np.from_dlpack(d)  # __dlpack__ (numpy makes it read-only)
    np.asarray(d)[0] = 42
    assert shared.tolist() == [42, 2, 3] and d.numpy().tolist() == [42, 2, 3]
    del shared
    gc.collect()


def test_torch_cpu_tensor_through_dlpack(matmul_artifact):
    torch = pytest.importorskip("torch")
    mod = kiln.local().load_module(matmul_artifact)
    a, b = torch.ones(4, 4), torch.ones(4, 4)
    c = torch.zeros(4, 4)
    mod["matrix_multiply"](kiln.nd.from_dlpack(a), kiln.nd.from_dlpack(b), kiln.nd.from_dlpack(c))
    assert bool((c == 4).all())  # the kernel wrote the tensor's own memory
    k = kiln.nd.array(np.arange(6, dtype=np.float32).reshape(2, 3))
    t = torch.from_dlpack(k)  # and a kiln array seen by PyTorch, no copy
    np.asarray(k)[1, 2] = 42
    assert t.shape == (2, 3) and float(t[1, 2]) == 42


def test_ten_thousand_calls_leak_nothing(matmul_artifact):
    mod = kiln.local().load_module(matmul_artifact)
    f = mod["matrix_multiply"]
    x = np.ones((2, 2), np.float32)
    gc.collect()
    before = kiln.live_handles()

    def churn(n):
        for _ in range(n):
            a = kiln.nd.array(x)
            b = kiln.nd.from_dlpack(x)
            c = kiln.nd.empty((2, 2), "float32")
            f(a, b, c)
            np.asarray(c).sum()
            np.from_dlpack(c)
            a.free()
            del b, c

    churn(1000)  # warm up allocators and caches
    gc.collect()
    rss = rss_kib()
    churn(10_000)
    gc.collect()
    assert kiln.live_handles() == before
    grown = rss_kib() - rss
    assert grown < 32 * 1024, f"RSS grew {grown} KiB over 10,000 calls"


def test_ten_thousand_remote_calls_leak_nothing(remote, matmul_artifact):
    remote.upload(matmul_artifact)
    mod = remote.load_module("matmul.kiln")
    dev = remote.cpu(0)
    a = kiln.nd.array(np.ones((2, 2), np.float32), dev)
    c = kiln.nd.empty((2, 2), "float32", dev)
    f = mod["matrix_multiply"]
    gc.collect()
    before = kiln.live_handles()
    for _ in range(1000):
        f(a, a, c)
    gc.collect()
    rss = rss_kib()
    for _ in range(10_000):
        f(a, a, c)
    for _ in range(200):
        kiln.nd.array(np.ones((2, 2), np.float32), dev).free()
    gc.collect()
    assert kiln.live_handles() == before
    assert c.numpy().tolist() == [[2, 2], [2, 2]]
    grown = rss_kib() - rss
    assert grown < 32 * 1024, f"RSS grew {grown} KiB over 10,000 remote calls"


def test_reprs_and_help():
    a = kiln.nd.array(np.zeros((2, 3), np.float32))
    assert "shape=(2, 3) dtype=float32" in repr(a) and "cpu(0)" in repr(a)
    assert kiln.nd.array.__doc__ and kiln.rpc.connect_tracker.__doc__ and kiln.build.__doc__
    assert kiln.version()
