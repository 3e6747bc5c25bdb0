# Functions for compact_buffers: testdata/compact/NAME.golden holds each
# one after lower_blocks and after compact_buffers.
# from tvm.script import ir as I
# from tvm.script import tir as T
@I.ir_module
class Module:
    @T.prim_func
    def fused_tile(A: T.Buffer((8, 4), "float32"), B: T.Buffer((4, 16), "float32"), C: T.Buffer((8, 16), "float32")):
        T.func_attr({"global_symbol": "fused_tile", "tir.noalias": T.bool(True)})
        C_local = T.alloc_buffer((8, 16), scope="local")
        for i_0_j_0_fused in T.parallel(4):
            for i_1_init in T.unroll(4):
                for j_1_init in T.vectorized(8):
                    with T.block("C_init"):
                        v_i = T.axis.spatial(8, i_0_j_0_fused // 2 * 4 + i_1_init)
                        v_j = T.axis.spatial(16, i_0_j_0_fused % 2 * 8 + j_1_init)
                        C_local[v_i, v_j] = T.float32(0.0)
            for k in range(4):
                for i_1 in T.unroll(4):
                    for j_1 in T.vectorized(8):
                        with T.block("C_update"):
                            v_i = T.axis.spatial(8, i_0_j_0_fused // 2 * 4 + i_1)
                            v_j = T.axis.spatial(16, i_0_j_0_fused % 2 * 8 + j_1)
                            v_k = T.axis.remap("R", [k])
                            C_local[v_i, v_j] = C_local[v_i, v_j] + A[v_i, v_k] * B[v_k, v_j]
            for ax0 in range(4):
                for ax1 in T.vectorized(8):
                    with T.block("C_local"):
                        v0 = T.axis.spatial(8, i_0_j_0_fused // 2 * 4 + ax0)
                        v1 = T.axis.spatial(16, i_0_j_0_fused % 2 * 8 + ax1)
                        C[v0, v1] = C_local[v0, v1]

    @T.prim_func
    def packed_panel(A: T.Buffer((8, 4), "float32"), B: T.Buffer((4, 16), "float32"), C: T.Buffer((8, 16), "float32")):
        T.func_attr({"global_symbol": "packed_panel", "tir.noalias": T.bool(True)})
        C_local = T.alloc_buffer((8, 16), scope="local")
        B_global = T.alloc_buffer((4, 16))
        for j_0 in T.parallel(2):
            for ax0 in range(4):
                for ax1 in T.vectorized(8):
                    with T.block("B_global"):
                        v0 = T.axis.remap("S", [ax0])
                        v1 = T.axis.spatial(16, j_0 * 8 + ax1)
                        B_global[v0, v1] = B[v0, v1]
            for i_0 in range(2):
                for i_1_init in T.unroll(4):
                    for j_1_init in T.vectorized(8):
                        with T.block("C_init"):
                            v_i = T.axis.spatial(8, i_0 * 4 + i_1_init)
                            v_j = T.axis.spatial(16, j_0 * 8 + j_1_init)
                            C_local[v_i, v_j] = T.float32(0.0)
                for k in range(4):
                    for i_1 in T.unroll(4):
                        for j_1 in T.vectorized(8):
                            with T.block("C_update"):
                                v_i = T.axis.spatial(8, i_0 * 4 + i_1)
                                v_j = T.axis.spatial(16, j_0 * 8 + j_1)
                                v_k = T.axis.remap("R", [k])
                                C_local[v_i, v_j] = C_local[v_i, v_j] + A[v_i, v_k] * B_global[v_k, v_j]
                for ax0 in range(4):
                    for ax1 in T.vectorized(8):
                        with T.block("C_local"):
                            v0 = T.axis.spatial(8, i_0 * 4 + ax0)
                            v1 = T.axis.spatial(16, j_0 * 8 + ax1)
                            C[v0, v1] = C_local[v0, v1]

    @T.prim_func
    def unit_batch(A: T.Buffer((1, 8, 4), "float32"), B: T.Buffer((4, 16), "float32"), C: T.Buffer((1, 8, 16), "float32")):
        T.func_attr({"global_symbol": "unit_batch", "tir.noalias": T.bool(True)})
        C_local = T.alloc_buffer((1, 8, 16), scope="local")
        for b in range(1):
            for i_0 in T.parallel(2):
                for i_1_init in T.unroll(4):
                    for j_init in T.vectorized(16):
                        with T.block("C_init"):
                            v_b = T.axis.remap("S", [b])
                            v_i = T.axis.spatial(8, i_0 * 4 + i_1_init)
                            v_j = T.axis.remap("S", [j_init])
                            C_local[v_b, v_i, v_j] = T.float32(0.0)
                for k in range(4):
                    for i_1 in T.unroll(4):
                        for j in T.vectorized(16):
                            with T.block("C_update"):
                                v_b = T.axis.remap("S", [b])
                                v_i = T.axis.spatial(8, i_0 * 4 + i_1)
                                v_j, v_k = T.axis.remap("SR", [j, k])
                                C_local[v_b, v_i, v_j] = C_local[v_b, v_i, v_j] + A[v_b, v_i, v_k] * B[v_k, v_j]
                for ax0 in range(4):
                    for ax1 in T.vectorized(16):
                        with T.block("C_local"):
                            v0 = T.axis.remap("S", [b])
                            v1 = T.axis.spatial(8, i_0 * 4 + ax0)
                            v2 = T.axis.remap("S", [ax1])
                            C[v0, v1, v2] = C_local[v0, v1, v2]

    @T.prim_func
    def carried(A: T.Buffer((4, 4), "float32"), B: T.Buffer((4, 4), "float32")):
        T.func_attr({"global_symbol": "carried"})
        t = T.decl_buffer((8,), scope="local")
        for io in range(4):
            for ii in range(4):
                if io == 0:
                    t[ii + 2] = A[0, ii]
                B[io, ii] = t[ii + 2] + A[io, ii]

    @T.prim_func
    def symbolic(var_A: T.handle, var_B: T.handle):
        T.func_attr({"global_symbol": "symbolic"})
        n = T.int32()
        A = T.match_buffer(var_A, (n, 4))
        B = T.match_buffer(var_B, (n, 4))
        t = T.decl_buffer((n, 4))
        u = T.decl_buffer((n, 4))
        for i in range(n):
            for j in range(4):
                t[i, j] = A[i, j] * T.float32(2)
            for j in range(4):
                B[i, j] = t[i, j] + T.float32(1)
        for i in range(n):
            u[i, 3] = A[i, 0]
        for i in range(n):
            B[i, 0] = u[n - 1 - i, 3]

    @T.prim_func
    def threads(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
        T.func_attr({"global_symbol": "threads"})
        S = T.decl_buffer((64,), scope="shared")
        L = T.decl_buffer((64,), scope="local")
        for bx in T.thread_binding(4, thread="blockIdx.x"):
            for tx in T.thread_binding(16, thread="threadIdx.x"):
                S[bx * 16 + tx] = A[bx * 16 + tx]
            for tx in T.thread_binding(16, thread="threadIdx.x"):
                L[bx * 16 + tx] = S[bx * 16 + 15 - tx] * T.float32(2)
                B[bx * 16 + tx] = L[bx * 16 + tx]

    @T.prim_func
    def per_thread(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
        T.func_attr({"global_symbol": "per_thread"})
        L = T.decl_buffer((2, 16, 2), scope="local")
        for bx in T.thread_binding(2, thread="blockIdx.x"):
            for tx in T.thread_binding(16, thread="threadIdx.x"):
                for r in range(2):
                    L[bx, tx, r] = A[bx * 32 + r * 16 + tx]
            for tx in T.thread_binding(16, thread="threadIdx.x"):
                for r in range(2):
                    B[bx * 32 + r * 16 + tx] = L[bx, tx, 1 - r] * T.float32(2)

    @T.prim_func
    def per_thread_rows(A: T.Buffer((128,), "float32"), B: T.Buffer((128,), "float32")):
        T.func_attr({"global_symbol": "per_thread_rows"})
        L = T.decl_buffer((2, 2, 16, 2), scope="local")
        for bx in T.thread_binding(2, thread="blockIdx.x"):
            for ty in T.thread_binding(2, thread="threadIdx.y"):
                for tx in T.thread_binding(16, thread="threadIdx.x"):
                    for r in range(2):
                        L[bx, ty, tx, r] = A[bx * 64 + ty * 32 + r * 16 + tx]
                for tx in T.thread_binding(16, thread="threadIdx.x"):
                    for r in range(2):
                        B[bx * 64 + ty * 32 + r * 16 + tx] = L[bx, ty, tx, 1 - r] * T.float32(2)
