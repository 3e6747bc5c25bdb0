# Differential test cases: each function runs on the reference interpreter
# (before and after lowering) and as compiled C, and the results must agree.
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
    def matmul(A: T.Buffer((64, 32), "float32"), B: T.Buffer((32, 48), "float32"), C: T.Buffer((64, 48), "float32")):
        T.func_attr({"global_symbol": "matmul", "tir.noalias": T.bool(True)})
        for i in T.parallel(64):
            for jo in range(3):
                for k in range(32):
                    for ji in T.vectorized(16):
                        with T.block("C"):
                            vi = T.axis.spatial(64, i)
                            vj = T.axis.spatial(48, jo * 16 + ji)
                            vk = T.axis.reduce(32, k)
                            with T.init():
                                C[vi, vj] = T.float32(0)
                            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]

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
    def select_if(A: T.Buffer((37,), "float32"), B: T.Buffer((37,), "float32"), C: T.Buffer((37,), "int32")):
        T.func_attr({"global_symbol": "select_if"})
        for i in range(37):
            with T.block("B"):
                vi = T.axis.spatial(37, i)
                B[vi] = T.Select(A[vi] > T.float32(0), A[vi], A[vi] * T.float32(0.25))
                if vi % 3 == 0:
                    C[vi] = 1
                elif A[vi] < T.float32(-0.5):
                    C[vi] = T.if_then_else(vi > 10, 2, 3)
                else:
                    C[vi] = T.max(vi // 4, 5) - T.min(vi % 7, 2)

    @T.prim_func
    def intrinsics(A: T.Buffer((32,), "float32"), B: T.Buffer((12, 32), "float32")):
        T.func_attr({"global_symbol": "intrinsics"})
        for i in range(32):
            with T.block("B"):
                vi = T.axis.spatial(32, i)
                B[0, vi] = T.exp(A[vi])
                B[1, vi] = T.log(T.fabs(A[vi]) + T.float32(1))
                B[2, vi] = T.sqrt(T.fabs(A[vi]))
                B[3, vi] = T.tanh(A[vi])
                B[4, vi] = T.sigmoid(A[vi])
                B[5, vi] = T.erf(A[vi])
                B[6, vi] = T.pow(T.fabs(A[vi]), T.float32(1.5))
                B[7, vi] = T.floor(A[vi] * T.float32(3))
                B[8, vi] = T.ceil(A[vi] * T.float32(3))
                B[9, vi] = T.round(A[vi] * T.float32(4))
                B[10, vi] = T.rsqrt(T.fabs(A[vi]) + T.float32(0.5))
                B[11, vi] = T.max(A[vi], T.float32(0))

    @T.prim_func
    def casts(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "int32"), C: T.Buffer((16,), "float64"), D: T.Buffer((16,), "int64")):
        T.func_attr({"global_symbol": "casts"})
        for i in range(16):
            with T.block("B"):
                vi = T.axis.spatial(16, i)
                B[vi] = T.Cast("int32", A[vi] * T.float32(10))
                C[vi] = T.Cast("float64", A[vi]) * T.float64(2) + T.Cast("float64", vi)
                D[vi] = T.Cast("int64", B[vi]) * T.int64(3000000000) // T.int64(7)

    @T.prim_func
    def local_alloc(A: T.Buffer((8, 16), "float32"), B: T.Buffer((8,), "float32")):
        T.func_attr({"global_symbol": "local_alloc"})
        for i in range(8):
            with T.block("row"):
                vi = T.axis.spatial(8, i)
                T.reads(A[vi, 0:16])
                T.writes(B[vi])
                tmp = T.alloc_buffer((16,), scope="local")
                acc = T.alloc_buffer((1,), scope="local")
                for j in range(16):
                    tmp[j] = A[vi, j] * A[vi, j]
                acc[0] = T.float32(0)
                for k in range(16):
                    acc[0] = acc[0] + tmp[k]
                B[vi] = acc[0]

    @T.prim_func
    def split_pred(A: T.Buffer((30,), "float32"), B: T.Buffer((30,), "float32")):
        T.func_attr({"global_symbol": "split_pred", "tir.noalias": T.bool(True)})
        for io in T.parallel(4):
            for ii in T.vectorized(8):
                with T.block("B"):
                    vi = T.axis.spatial(30, io * 8 + ii)
                    T.where(io * 8 + ii < 30)
                    B[vi] = A[vi] * T.float32(2) + T.float32(1)

    @T.prim_func
    def scale_sym(var_X: T.handle, alpha: T.float32, off: T.int32):
        T.func_attr({"global_symbol": "scale_sym"})
        m = T.int32()
        X = T.match_buffer(var_X, (m, 8))
        for i, j in T.grid(m, 8):
            with T.block("X"):
                vi, vj = T.axis.remap("SS", [i, j])
                X[vi, vj] = X[vi, vj] * alpha + T.Cast("float32", off)
