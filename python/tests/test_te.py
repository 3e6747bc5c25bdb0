"""TVM's tensor-expression tutorial ("Working with Operators Using Tensor
Expression"), its CPU part, written as in TVM with tvm replaced by kiln:
the vector add with te.compute, create_schedule, split, parallel and
vectorize; the matmul with te.reduce_axis and te.sum, tiled, reordered,
vectorized, with a write cache, and packed; then the same matmul as
te.create_prim_func scheduled with tir.Schedule. Every result is checked
against numpy; the schedule errors carry the Go side's message."""

import numpy as np
import pytest

import kiln
from kiln import te, tir

RNG = np.random.default_rng(7)


def test_vector_add():
    tgt = kiln.target.Target(target="llvm", host="llvm")
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute(A.shape, lambda i: A[i] + B[i], name="C")
    s = te.create_schedule(C.op)
    fadd = kiln.build(s, [A, B, C], tgt, name="myadd")
    assert fadd.entry_name == "myadd"

    dev = kiln.device(tgt.kind.name, 0)
    n = 1024
    a = kiln.nd.array(RNG.uniform(size=n).astype(A.dtype), dev)
    b = kiln.nd.array(RNG.uniform(size=n).astype(B.dtype), dev)
    c = kiln.nd.array(np.zeros(n, dtype=C.dtype), dev)
    fadd(a, b, c)
    np.testing.assert_allclose(c.numpy(), a.numpy() + b.numpy())

    evaluator = fadd.time_evaluator(fadd.entry_name, dev, number=10)
    assert evaluator(a, b, c).mean > 0


def vector_add(n_var=None):
    n = n_var if n_var is not None else te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute(A.shape, lambda i: A[i] + B[i], name="C")
    return A, B, C


def check_add(func, n):
    dev = kiln.cpu(0)
    a_np, b_np = RNG.uniform(size=n).astype("float32"), RNG.uniform(size=n).astype("float32")
    a, b = kiln.nd.array(a_np, dev), kiln.nd.array(b_np, dev)
    c = kiln.nd.array(np.zeros(n, dtype="float32"), dev)
    func(a, b, c)
    np.testing.assert_allclose(c.numpy(), a_np + b_np)


def test_vector_add_parallel_and_vectorized():
    A, B, C = vector_add()
    s = te.create_schedule(C.op)
    s[C].parallel(C.op.axis[0])
    assert "T.parallel(n)" in str(kiln.lower(s, [A, B, C], simple_mode=True))
    check_add(kiln.build(s, [A, B, C], "llvm", name="myadd_parallel"), 1000)

    A, B, C = vector_add()
    s = te.create_schedule(C.op)
    factor = 4
    outer, inner = s[C].split(C.op.axis[0], factor=factor)
    s[C].parallel(outer)
    s[C].vectorize(inner)
    text = str(kiln.lower(s, [A, B, C], simple_mode=True))
    assert "T.parallel((n + 3) // 4)" in text and "T.vectorized(4)" in text
    # 1023: the split does not divide n, the predicate guards the tail.
    check_add(kiln.build(s, [A, B, C], "llvm", name="myadd_vector"), 1023)


M = K = N = 64
BN = 16
KFACTOR = 4


def matmul_def():
    k = te.reduce_axis((0, K), "k")
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    C = te.compute((M, N), lambda x, y: te.sum(A[x, k] * B[k, y], axis=k), name="C")
    return A, B, C, k


def check_matmul(func):
    dev = kiln.cpu(0)
    a_np = RNG.uniform(size=(M, K)).astype("float32")
    b_np = RNG.uniform(size=(K, N)).astype("float32")
    a, b = kiln.nd.array(a_np, dev), kiln.nd.array(b_np, dev)
    c = kiln.nd.array(np.zeros((M, N), dtype="float32"), dev)
    func(a, b, c)
    np.testing.assert_allclose(c.numpy(), a_np @ b_np, rtol=1e-5)


def test_matmul_default_schedule():
    A, B, C, _ = matmul_def()
    s = te.create_schedule(C.op)
    func = kiln.build(s, [A, B, C], target="llvm", name="mmult")
    check_matmul(func)


def test_matmul_blocking_vectorize_permute_parallel():
    A, B, C, _ = matmul_def()
    s = te.create_schedule(C.op)
    xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], BN, BN)
    (k,) = s[C].op.reduce_axis
    ko, ki = s[C].split(k, factor=KFACTOR)
    # Loop permutation: the tutorial's better order, then vectorize and
    # parallelize.
    s[C].reorder(xo, yo, ko, xi, ki, yi)
    s[C].vectorize(yi)
    s[C].parallel(xo)
    text = str(kiln.lower(s, [A, B, C], simple_mode=True))
    assert "T.parallel(4)" in text and "T.vectorized(16)" in text
    check_matmul(kiln.build(s, [A, B, C], target="llvm", name="mmult"))


def test_matmul_array_packing_and_write_cache():
    k = te.reduce_axis((0, K), "k")
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    packedB = te.compute((N / BN, K, BN), lambda bigN, k, littleN: B[k, bigN * BN + littleN], name="packedB")
    C = te.compute(
        (M, N),
        lambda x, y: te.sum(A[x, k] * packedB[y // BN, k, tir.indexmod(y, BN)], axis=k),
        name="C",
    )
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "global")
    xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], BN, BN)
    s[CC].compute_at(s[C], yo)
    xc, yc = s[CC].op.axis
    (k,) = s[CC].op.reduce_axis
    ko, ki = s[CC].split(k, factor=KFACTOR)
    s[CC].reorder(ko, xc, ki, yc)
    s[CC].unroll(ki)
    s[CC].vectorize(yc)
    s[C].parallel(xo)
    x, y, z = s[packedB].op.axis
    s[packedB].vectorize(z)
    s[packedB].parallel(x)
    text = str(kiln.lower(s, [A, B, C], simple_mode=True))
    assert 'T.block("packedB")' in text and "C_global" in text
    check_matmul(kiln.build(s, [A, B, C], target="llvm", name="mmult"))


def test_create_prim_func_and_tir_schedule():
    A, B, C, _ = matmul_def()
    func = te.create_prim_func([A, B, C])
    sch = tir.Schedule(func)
    block = sch.get_block("C")
    i, j, k = sch.get_loops(block)
    assert [l.name for l in (i, j, k)] == ["x", "y", "k"]
    i0, i1 = sch.split(i, factors=[None, BN])
    j0, j1 = sch.split(j, factors=[None, BN])
    k0, k1 = sch.split(k, factors=[None, KFACTOR])
    sch.reorder(i0, j0, k0, i1, k1, j1)
    sch.parallel(i0)
    sch.vectorize(j1)
    assert len(sch.trace.insts) == 8 and "sch.parallel(x_0)" in str(sch.trace)
    assert "T.vectorized(16)" in sch.mod.script()
    check_matmul(kiln.build(sch.mod, target="llvm"))

    # The fork does not change the original.
    sch2 = sch.copy()
    sch2.unroll(k1)
    assert "T.unroll" in sch2.mod.script() and "T.unroll" not in sch.mod.script()

    mod = kiln.IRModule({"mmult": func})
    assert "def mmult(" in mod.script()
    f = kiln.build(mod)
    assert f.entry_name == "mmult"
    check_matmul(f)


def test_tir_schedule_cache_and_decompose():
    A, B, C, _ = matmul_def()
    sch = tir.Schedule(te.create_prim_func([A, B, C]))
    block = sch.get_block("C")
    i, j, k = sch.get_loops(block)
    cw = sch.cache_write(block, 0, "global")
    assert cw.name == "C_global"
    sch.reverse_compute_at(cw, j)
    init = sch.decompose_reduction(block, k)
    assert isinstance(init, tir.BlockRV)
    check_matmul(kiln.build(sch.mod))


def test_elementwise_chain_inline_and_fuse():
    n = 256
    A = te.placeholder((n, 4), name="A")
    B = te.compute((n, 4), lambda i, j: te.exp(A[i, j]) * 2.0, name="B")
    C = te.compute((n, 4), lambda i, j: te.max(B[i, j] - 1.0, tir.const(0.0, "float32")), name="C")
    s = te.create_schedule(C.op)
    s[B].compute_inline()
    f = s[C].fuse(*C.op.axis)
    s[C].parallel(f)
    func = kiln.build(s, [A, C], name="chain")
    dev = kiln.cpu(0)
    a_np = RNG.uniform(-1, 1, size=(n, 4)).astype("float32")
    a, c = kiln.nd.array(a_np, dev), kiln.nd.empty((n, 4), "float32", dev)
    func(a, c)
    np.testing.assert_allclose(c.numpy(), np.maximum(np.exp(a_np) * 2 - 1, 0), rtol=1e-5, atol=1e-6)


def test_schedule_errors_name_what_was_wrong():
    A, B, C, _ = matmul_def()
    sch = tir.Schedule(te.create_prim_func([A, B, C]))
    block = sch.get_block("C")
    i, j, k = sch.get_loops(block)
    with pytest.raises(tir.ScheduleError, match=r"split: factor 1 of loop \"x\" is 0"):
        sch.split(i, factors=[None, 0])
    with pytest.raises(tir.ScheduleError, match=r"parallel: .*k"):
        sch.parallel(k)
    with pytest.raises(tir.ScheduleError, match=r"no block"):
        sch.get_block("D")
    # A failed primitive leaves the schedule as it was: it still builds.
    check_matmul(kiln.build(sch.mod))
    a, _ = sch.split(i, factors=[None, 8])
    with pytest.raises(tir.ScheduleError, match="no longer exists|not.*exist"):
        sch.parallel(i)
    other = tir.Schedule(te.create_prim_func([A, B, C]))
    with pytest.raises(tir.ScheduleError, match="another schedule"):
        other.parallel(a)

    s = te.create_schedule(C.op)
    with pytest.raises(tir.ScheduleError, match="factor and nparts"):
        s[C].split(C.op.axis[0])
    with pytest.raises(tir.ScheduleError, match="placeholder"):
        s[A].parallel(A.op.axis)


def test_definition_errors_name_what_was_wrong():
    A = te.placeholder((8, 8), name="A")
    with pytest.raises(kiln.KilnValueError, match="2 dimensions, indexed with 1"):
        A[1]
    with pytest.raises(kiln.KilnValueError, match="takes 1 indices, the shape has 2"):
        te.compute((8, 8), lambda i: A[i, i], name="B")
    K = te.var("K")
    with pytest.raises(TypeError):
        # The generator form cannot even be written with a symbolic K:
        # Python's range() needs an integer.
        te.compute((8,), lambda i: te.sum(A[i, k] for k in range(K)), name="B")  # noqa: F821
    with pytest.raises(kiln.KilnValueError, match="generator"):
        te.compute((8,), lambda i: te.sum(A[i, k] for k in range(8)), name="B")
    i_of_b = []
    B = te.compute((8,), lambda i: i_of_b.append(i) or A[i, 0], name="B")
    D = te.compute((8,), lambda j: B[j] + i_of_b[0], name="D")
    with pytest.raises(kiln.KilnValueError, match="index variable 'i' of te.compute 'B' is used in te.compute 'D'"):
        te.create_prim_func([A, D])
    X = te.placeholder((8,), name="X")
    E = te.compute((8,), lambda i: X[i] * 2, name="E")
    with pytest.raises(kiln.KilnValueError, match=r"placeholder \"X\" read by \"E\" is not among the arguments"):
        te.create_prim_func([E])
    with pytest.raises(kiln.KilnValueError, match="truth value"):
        te.compute((8,), lambda i: X[i] if X[i] > 0 else 0, name="F")
