# from tvm.script import tir as T
@T.prim_func
def vecadd(var_A: T.handle, var_B: T.handle, var_C: T.handle):
    T.func_attr({"tir.noalias": T.bool(True), "tag": "demo", "ints": [1, 2, 3], "nested": {"a": 1.5}})
    n = T.int64()
    A = T.match_buffer(var_A, (n,))
    B = T.match_buffer(var_B, (n,))
    C = T.match_buffer(var_C, (n,), "float32")
    for i in T.parallel(n, annotations={"pragma_auto_unroll_max_step": 16}):
        with T.block("C"):
            v_i = T.axis.spatial(n, i)
            C[v_i] = A[v_i] + B[v_i]


@T.prim_func(private=True)
def features(A: T.Buffer((16, 16), "float32"), B: T.Buffer((16,), "float32"), m: T.int32, X: T.Buffer((4, 4), "int32", scope="shared")):
    acc = T.alloc_buffer((16,), scope="local")
    for io in T.serial(4):
        for ii in T.vectorized(4):
            with T.block("init"):
                vi = T.axis.spatial(16, io * 4 + ii)
                T.where(io * 4 + ii < 16)
                T.reads()
                T.writes(acc[vi])
                T.block_attr({"meta_schedule.tiling_structure": "SSR"})
                acc[vi] = T.float32(0)
    for i, k in T.grid(16, 16):
        with T.block("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                B[vi] = T.float32(0)
            B[vi] = B[vi] + T.exp(A[vi, vk]) * T.sqrt(T.fabs(A[vi, vk])) - T.Cast("float32", vk) / T.float32(2.5)
    for j in range(2, 10):
        with T.block("misc"):
            vj = T.axis.spatial((2, 10), j)
            T.reads(A[vj, 0:16], B[vj:vj + 2])
            T.writes(B[vj])
            B[vj] = T.Select(vj % 2 == 0 and not vj > 5, T.max(A[vj, 0], T.float32(-1.5)), T.if_then_else(vj // 3 != 1, T.min(A[vj, 1], B[0]), T.float32("inf")))
    for t in T.thread_binding(4, thread="threadIdx.x"):
        for u in T.unroll(4):
            X[t, u] = T.truncdiv(t * 4 + u, 3) - T.truncmod(t, 2) + T.floordiv(u, 2) + T.floormod(u, 3) + m
    if m > 3:
        T.evaluate(T.call_extern("int32", "printf", "hello\n", m))
    elif m < -1:
        assert m != -5, "m must not be -5"
    else:
        x: T.int32 = m * 2
        X[0, 0] = x + T.Let(y, x + 1, y * y)
