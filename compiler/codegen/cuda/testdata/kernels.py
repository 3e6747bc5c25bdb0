# Thread-bound kernels whose generated CUDA is kept in testdata/<name>.golden.
# from tvm.script import ir as I
# from tvm.script import tir as T
@I.ir_module
class Module:
    @T.prim_func
    def add(A: T.Buffer((4096,), "float32"), B: T.Buffer((4096,), "float32"), C: T.Buffer((4096,), "float32")):
        T.func_attr({"global_symbol": "add", "tir.noalias": T.bool(True)})
        for bx in T.thread_binding(16, thread="blockIdx.x"):
            for tx in T.thread_binding(256, thread="threadIdx.x"):
                with T.block("C"):
                    vi = T.axis.spatial(4096, bx * 256 + tx)
                    C[vi] = A[vi] + B[vi]

    @T.prim_func
    def scale2d(A: T.Buffer((64, 96), "float32"), B: T.Buffer((64, 96), "float32"), alpha: T.float32):
        T.func_attr({"global_symbol": "scale2d", "tir.noalias": T.bool(True)})
        for by in T.thread_binding(8, thread="blockIdx.y"):
            for bx in T.thread_binding(3, thread="blockIdx.x"):
                for ty in T.thread_binding(8, thread="threadIdx.y"):
                    for tx in T.thread_binding(32, thread="threadIdx.x"):
                        with T.block("B"):
                            vi = T.axis.spatial(64, by * 8 + ty)
                            vj = T.axis.spatial(96, bx * 32 + tx)
                            B[vi, vj] = T.max(A[vi, vj] * alpha, T.float32(0))

    @T.prim_func
    def rowsum(A: T.Buffer((128, 300), "float32"), S: T.Buffer((128,), "float32")):
        T.func_attr({"global_symbol": "rowsum", "tir.noalias": T.bool(True)})
        acc = T.alloc_buffer((1,), scope="local")
        for bx in T.thread_binding(2, thread="blockIdx.x"):
            for tx in T.thread_binding(64, thread="threadIdx.x"):
                with T.block("init"):
                    vi = T.axis.spatial(128, bx * 64 + tx)
                    acc[0] = T.float32(0)
                for k in range(300):
                    with T.block("update"):
                        vi = T.axis.spatial(128, bx * 64 + tx)
                        vk = T.axis.reduce(300, k)
                        acc[0] = acc[0] + A[vi, vk]
                with T.block("store"):
                    vi = T.axis.spatial(128, bx * 64 + tx)
                    S[vi] = acc[0]

    @T.prim_func
    def shared_reverse(A: T.Buffer((256,), "float32"), B: T.Buffer((256,), "float32")):
        T.func_attr({"global_symbol": "shared_reverse", "tir.noalias": T.bool(True)})
        S = T.alloc_buffer((64,), scope="shared")
        for bx in T.thread_binding(4, thread="blockIdx.x"):
            for tx in T.thread_binding(64, thread="threadIdx.x"):
                with T.block("load"):
                    vb = T.axis.spatial(4, bx)
                    vi = T.axis.spatial(64, tx)
                    S[vi] = A[vb * 64 + vi]
            for tx in T.thread_binding(64, thread="threadIdx.x"):
                with T.block("store"):
                    vb = T.axis.spatial(4, bx)
                    vi = T.axis.spatial(64, tx)
                    B[vb * 64 + vi] = S[63 - vi]

    @T.prim_func
    def dyn_reverse(A: T.Buffer((256,), "float32"), B: T.Buffer((256,), "float32")):
        T.func_attr({"global_symbol": "dyn_reverse", "tir.noalias": T.bool(True)})
        S = T.alloc_buffer((64,), scope="shared.dyn")
        U = T.alloc_buffer((64,), scope="shared.dyn")
        for bx in T.thread_binding(4, thread="blockIdx.x"):
            for tx in T.thread_binding(64, thread="threadIdx.x"):
                with T.block("load"):
                    vb = T.axis.spatial(4, bx)
                    vi = T.axis.spatial(64, tx)
                    S[vi] = A[vb * 64 + vi]
                    U[vi] = A[vb * 64 + vi] * T.float32(2)
            for tx in T.thread_binding(64, thread="threadIdx.x"):
                with T.block("store"):
                    vb = T.axis.spatial(4, bx)
                    vi = T.axis.spatial(64, tx)
                    B[vb * 64 + vi] = S[63 - vi] + U[vi]

    @T.prim_func
    def shared_same_thread(A: T.Buffer((256,), "float32"), B: T.Buffer((256,), "float32")):
        T.func_attr({"global_symbol": "shared_same_thread", "tir.noalias": T.bool(True)})
        S = T.alloc_buffer((64,), scope="shared")
        for bx in T.thread_binding(4, thread="blockIdx.x"):
            for tx in T.thread_binding(64, thread="threadIdx.x"):
                with T.block("load"):
                    vb = T.axis.spatial(4, bx)
                    vi = T.axis.spatial(64, tx)
                    S[vi] = A[vb * 64 + vi] * T.float32(2)
            for tx in T.thread_binding(64, thread="threadIdx.x"):
                with T.block("store"):
                    vb = T.axis.spatial(4, bx)
                    vi = T.axis.spatial(64, tx)
                    B[vb * 64 + vi] = S[vi] + T.float32(1)

    @T.prim_func
    def tiled_shift(A: T.Buffer((8, 256), "float32"), O: T.Buffer((8, 64), "float32")):
        T.func_attr({"global_symbol": "tiled_shift", "tir.noalias": T.bool(True)})
        Ts = T.alloc_buffer((64,), scope="shared")
        for bx in T.thread_binding(8, thread="blockIdx.x"):
            for tx in T.thread_binding(64, thread="threadIdx.x"):
                with T.block("init"):
                    vr = T.axis.spatial(8, bx)
                    vt = T.axis.spatial(64, tx)
                    O[vr, vt] = T.float32(0)
            for ko in range(4):
                for tx in T.thread_binding(64, thread="threadIdx.x"):
                    with T.block("load"):
                        vr = T.axis.spatial(8, bx)
                        vt = T.axis.spatial(64, tx)
                        vk = T.axis.spatial(4, ko)
                        Ts[vt] = A[vr, vk * 64 + vt]
                for tx in T.thread_binding(64, thread="threadIdx.x"):
                    with T.block("acc"):
                        vr = T.axis.spatial(8, bx)
                        vt = T.axis.spatial(64, tx)
                        O[vr, vt] = O[vr, vt] + Ts[(vt + 1) % 64]

    @T.prim_func
    def half_axpy(X: T.Buffer((512,), "float16"), Y: T.Buffer((512,), "float16")):
        T.func_attr({"global_symbol": "half_axpy", "tir.noalias": T.bool(True)})
        for bx in T.thread_binding(2, thread="blockIdx.x"):
            for tx in T.thread_binding(256, thread="threadIdx.x"):
                with T.block("Y"):
                    vi = T.axis.spatial(512, bx * 256 + tx)
                    Y[vi] = X[vi] * T.float16(1.5) + Y[vi] - T.max(X[vi], T.float16(0)) / T.float16(3)

    @T.prim_func
    def bf16_axpy(X: T.Buffer((512,), "bfloat16"), Y: T.Buffer((512,), "bfloat16"), S: T.Buffer((512,), "float32")):
        T.func_attr({"global_symbol": "bf16_axpy", "tir.noalias": T.bool(True)})
        for bx in T.thread_binding(2, thread="blockIdx.x"):
            for tx in T.thread_binding(256, thread="threadIdx.x"):
                with T.block("Y"):
                    vi = T.axis.spatial(512, bx * 256 + tx)
                    Y[vi] = X[vi] * T.bfloat16(1.5) + Y[vi] - T.max(X[vi], T.bfloat16(0)) / T.bfloat16(3)
                    S[vi] = T.Cast("float32", Y[vi]) + T.float32(0.25)

    @T.prim_func
    def half_rowsum(A: T.Buffer((64, 40), "float16"), S: T.Buffer((64,), "float32")):
        T.func_attr({"global_symbol": "half_rowsum", "tir.noalias": T.bool(True)})
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.block("init"):
                vi = T.axis.spatial(64, tx)
                S[vi] = T.float32(0)
            for k in range(40):
                with T.block("acc"):
                    vi = T.axis.spatial(64, tx)
                    vk = T.axis.reduce(40, k)
                    S[vi] = S[vi] + T.Cast("float32", T.exp(A[vi, vk]))
