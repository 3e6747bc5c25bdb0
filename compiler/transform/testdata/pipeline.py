# Functions whose IR after every pass is kept in testdata/NAME.golden.
# from tvm.script import ir as I
# from tvm.script import tir as T
@I.ir_module
class Module:
    @T.prim_func
    def matmul(A: T.Buffer((64, 32), "float32"), B: T.Buffer((32, 64), "float32"), C: T.Buffer((64, 64), "float32")):
        T.func_attr({"global_symbol": "matmul", "tir.noalias": T.bool(True)})
        for i in T.parallel(64):
            for jo in range(4):
                for k in range(32):
                    for ji in T.vectorized(16):
                        with T.block("C"):
                            vi = T.axis.spatial(64, i)
                            vj = T.axis.spatial(64, jo * 16 + ji)
                            vk = T.axis.reduce(32, k)
                            with T.init():
                                C[vi, vj] = T.float32(0)
                            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]

    @T.prim_func
    def blocked(A: T.Buffer((8, 16), "float32"), B: T.Buffer((16, 32), "float32"), C: T.Buffer((8, 32), "float32")):
        T.func_attr({"global_symbol": "blocked", "tir.noalias": T.bool(True)})
        C_local = T.alloc_buffer((2, 32), scope="local")
        for io in T.parallel(4):
            for ii in T.unroll(2):
                for ji in T.vectorized(32):
                    with T.block("init"):
                        vi, vj = T.axis.remap("SS", [ii, ji])
                        C_local[vi, vj] = T.float32(0)
            for k in range(16):
                for ii in T.unroll(2):
                    for jo in T.unroll(2):
                        for ji in T.vectorized(16):
                            with T.block("update"):
                                vi = T.axis.spatial(2, ii)
                                vj = T.axis.spatial(32, jo * 16 + ji)
                                vk = T.axis.reduce(16, k)
                                C_local[vi, vj] = C_local[vi, vj] + A[io * 2 + vi, vk] * B[vk, vj]
            for ii in T.unroll(2):
                for ji in T.vectorized(32):
                    with T.block("store"):
                        vi = T.axis.spatial(8, io * 2 + ii)
                        vj = T.axis.spatial(32, ji)
                        C[vi, vj] = C_local[ii, vj]

    @T.prim_func
    def split_pred(var_A: T.handle, var_B: T.handle):
        T.func_attr({"global_symbol": "split_pred"})
        n = T.int32()
        A = T.match_buffer(var_A, (n, 3))
        B = T.match_buffer(var_B, (n,))
        for io in range((n + 7) // 8):
            for ii in T.vectorized(8):
                with T.block("B"):
                    vi = T.axis.spatial(n, io * 8 + ii)
                    T.where(io * 8 + ii < n)
                    B[vi] = A[vi, 0] + A[vi, 2] * T.float32(2)

    @T.prim_func
    def storage(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "storage"})
        for i in range(4):
            with T.block("stage"):
                vi = T.axis.spatial(4, i)
                T.reads(A[vi * 4:vi * 4 + 4])
                T.writes(B[vi * 4:vi * 4 + 4])
                t1 = T.alloc_buffer((4,), scope="local")
                t2 = T.alloc_buffer((4,), scope="local")
                for j in T.unroll(4):
                    t1[j] = A[vi * 4 + j] + T.float32(1)
                for j in range(4):
                    B[vi * 4 + j] = t1[j] * T.float32(2)
                for j in range(4):
                    t2[j] = B[vi * 4 + j] - T.float32(1)
                for j in range(4):
                    B[vi * 4 + j] = t2[j] * t2[j] + T.float32(0) * T.float32(3)
