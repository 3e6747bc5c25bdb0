# Kernels whose generated C is kept in testdata/<name>.golden.
# from tvm.script import ir as I
# from tvm.script import tir as T
@I.ir_module
class Module:
    @T.prim_func
    def vecadd(var_A: T.handle, var_B: T.handle, var_C: T.handle):
        T.func_attr({"global_symbol": "vecadd", "tir.noalias": T.bool(True)})
        n = T.int64()
        A = T.match_buffer(var_A, (n,))
        B = T.match_buffer(var_B, (n,))
        C = T.match_buffer(var_C, (n,))
        for i in T.parallel(n):
            with T.block("C"):
                vi = T.axis.spatial(n, i)
                C[vi] = A[vi] + B[vi]

    @T.prim_func
    def microkernel(A: T.Buffer((16, 24), "float32"), B: T.Buffer((24, 32), "float32"), C: T.Buffer((16, 32), "float32")):
        T.func_attr({"global_symbol": "microkernel", "tir.noalias": T.bool(True)})
        C_local = T.alloc_buffer((4, 32), scope="local")
        for io in T.parallel(4):
            for ii in T.unroll(4):
                for ji in T.vectorized(32):
                    with T.block("init"):
                        vi = T.axis.spatial(4, ii)
                        vj = T.axis.spatial(32, ji)
                        C_local[vi, vj] = T.float32(0)
            for k in range(24):
                for ii in T.unroll(4):
                    for jo in T.unroll(2):
                        for ji in T.vectorized(16):
                            with T.block("update"):
                                vi = T.axis.spatial(4, ii)
                                vj = T.axis.spatial(32, jo * 16 + ji)
                                vk = T.axis.reduce(24, k)
                                C_local[vi, vj] = C_local[vi, vj] + A[io * 4 + vi, vk] * B[vk, vj]
            for ii in T.unroll(4):
                for ji in T.vectorized(32):
                    with T.block("store"):
                        vi = T.axis.spatial(16, io * 4 + ii)
                        vj = T.axis.spatial(32, ji)
                        C[vi, vj] = C_local[ii, vj]

    @T.prim_func
    def relu_vec(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32"), C: T.Buffer((64,), "int32")):
        T.func_attr({"global_symbol": "relu_vec"})
        for io in range(4):
            for ii in T.vectorized(16):
                with T.block("B"):
                    vi = T.axis.spatial(64, io * 16 + ii)
                    B[vi] = T.max(A[vi], T.float32(0))
                    C[vi] = T.Cast("int32", A[vi * 1] * T.float32(2))
        for i in T.unroll(100):
            with T.block("tail"):
                vi = T.axis.spatial(64, i % 64)
                B[vi] = T.exp(B[vi]) + T.round(A[vi]) - T.sigmoid(A[vi])

    @T.prim_func
    def scalars(var_X: T.handle, alpha: T.float32, off: T.int32):
        T.func_attr({"global_symbol": "scalars"})
        m = T.int32()
        X = T.match_buffer(var_X, (m, 8))
        for i, j in T.grid(m, 8):
            with T.block("X"):
                vi, vj = T.axis.remap("SS", [i, j])
                if vi // 2 == 1:
                    X[vi, vj] = X[vi, vj] * alpha + T.Cast("float32", off)
                else:
                    X[vi, vj] = T.Select(vj % 3 == 0, T.float32(-1.5), T.float32(1e30))
