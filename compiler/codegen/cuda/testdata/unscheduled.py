# Unscheduled kernels that the default GPU schedule (the fallback rule)
# binds to threads before code generation.
# from tvm.script import ir as I
# from tvm.script import tir as T
@I.ir_module
class Module:
    @T.prim_func
    def relu(A: T.Buffer((37, 129), "float32"), B: T.Buffer((37, 129), "float32")):
        T.func_attr({"global_symbol": "relu", "tir.noalias": T.bool(True)})
        for i, j in T.grid(37, 129):
            with T.block("B"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = T.max(A[vi, vj], T.float32(0))

    @T.prim_func
    def add_bias(A: T.Buffer((64, 512), "float32"), bias: T.Buffer((512,), "float32"), C: T.Buffer((64, 512), "float32")):
        T.func_attr({"global_symbol": "add_bias", "tir.noalias": T.bool(True)})
        for i, j in T.grid(64, 512):
            with T.block("C"):
                vi, vj = T.axis.remap("SS", [i, j])
                C[vi, vj] = A[vi, vj] + bias[vj]

    @T.prim_func
    def row_sum(A: T.Buffer((100, 77), "float32"), S: T.Buffer((100,), "float32")):
        T.func_attr({"global_symbol": "row_sum", "tir.noalias": T.bool(True)})
        for i, k in T.grid(100, 77):
            with T.block("S"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    S[vi] = T.float32(0)
                S[vi] = S[vi] + A[vi, vk]

    @T.prim_func
    def row_sum_long(A: T.Buffer((6, 300), "float32"), S: T.Buffer((6,), "float32")):
        T.func_attr({"global_symbol": "row_sum_long", "tir.noalias": T.bool(True)})
        for i, k in T.grid(6, 300):
            with T.block("S"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    S[vi] = T.float32(0)
                S[vi] = S[vi] + A[vi, vk]

    @T.prim_func
    def small(A: T.Buffer((5,), "float32"), B: T.Buffer((5,), "float32")):
        T.func_attr({"global_symbol": "small", "tir.noalias": T.bool(True)})
        for i in range(5):
            with T.block("B"):
                vi = T.axis.spatial(5, i)
                B[vi] = A[vi] * T.float32(3)

    @T.prim_func
    def gemv_bias(A: T.Buffer((40, 64), "float32"), x: T.Buffer((64,), "float32"), b: T.Buffer((40,), "float32"), y: T.Buffer((40,), "float32")):
        T.func_attr({"global_symbol": "gemv_bias", "tir.noalias": T.bool(True)})
        t = T.alloc_buffer((40,), "float32")
        for i, k in T.grid(40, 64):
            with T.block("t"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    t[vi] = T.float32(0)
                t[vi] = t[vi] + A[vi, vk] * x[vk]
        for i in range(40):
            with T.block("y"):
                vi = T.axis.spatial(40, i)
                y[vi] = t[vi] + b[vi]

    @T.prim_func
    def scale_relu(A: T.Buffer((300,), "float32"), B: T.Buffer((300,), "float32")):
        T.func_attr({"global_symbol": "scale_relu", "tir.noalias": T.bool(True)})
        t = T.alloc_buffer((300,), "float32")
        for i in range(300):
            with T.block("t"):
                vi = T.axis.spatial(300, i)
                t[vi] = A[vi] * T.float32(-2)
        for i in range(300):
            with T.block("B"):
                vi = T.axis.spatial(300, i)
                B[vi] = T.max(t[vi], T.float32(0))

    @T.prim_func
    def matmul(A: T.Buffer((128, 48), "float32"), B: T.Buffer((48, 96), "float32"), C: T.Buffer((128, 96), "float32")):
        T.func_attr({"global_symbol": "matmul", "tir.noalias": T.bool(True)})
        for i, j, k in T.grid(128, 96, 48):
            with T.block("C"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    C[vi, vj] = T.float32(0)
                C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]

    @T.prim_func
    def matmul_bias_relu(A: T.Buffer((64, 32), "float32"), B: T.Buffer((32, 64), "float32"), bias: T.Buffer((64,), "float32"), D: T.Buffer((64, 64), "float32")):
        T.func_attr({"global_symbol": "matmul_bias_relu", "tir.noalias": T.bool(True)})
        C = T.alloc_buffer((64, 64), "float32")
        E = T.alloc_buffer((64, 64), "float32")
        for i, j, k in T.grid(64, 64, 32):
            with T.block("C"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    C[vi, vj] = T.float32(0)
                C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
        for i, j in T.grid(64, 64):
            with T.block("E"):
                vi, vj = T.axis.remap("SS", [i, j])
                E[vi, vj] = C[vi, vj] + bias[vj]
        for i, j in T.grid(64, 64):
            with T.block("D"):
                vi, vj = T.axis.remap("SS", [i, j])
                D[vi, vj] = T.max(E[vi, vj], T.float32(0))

    @T.prim_func
    def softmax(A: T.Buffer((8, 50), "float32"), B: T.Buffer((8, 50), "float32")):
        T.func_attr({"global_symbol": "softmax", "tir.noalias": T.bool(True)})
        mx = T.alloc_buffer((8,), "float32")
        e = T.alloc_buffer((8, 50), "float32")
        s = T.alloc_buffer((8,), "float32")
        for i, k in T.grid(8, 50):
            with T.block("max"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    mx[vi] = T.float32(-3.4028234663852886e38)
                mx[vi] = T.max(mx[vi], A[vi, vk])
        for i, j in T.grid(8, 50):
            with T.block("exp"):
                vi, vj = T.axis.remap("SS", [i, j])
                e[vi, vj] = T.exp(A[vi, vj] - mx[vi])
        for i, k in T.grid(8, 50):
            with T.block("sum"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    s[vi] = T.float32(0)
                s[vi] = s[vi] + e[vi, vk]
        for i, j in T.grid(8, 50):
            with T.block("norm"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = e[vi, vj] / s[vi]

    @T.prim_func
    def softmax_3d(A: T.Buffer((2, 3, 130), "float32"), B: T.Buffer((2, 3, 130), "float32")):
        T.func_attr({"global_symbol": "softmax_3d", "tir.noalias": T.bool(True)})
        mx = T.alloc_buffer((2, 3), "float32")
        e = T.alloc_buffer((2, 3, 130), "float32")
        s = T.alloc_buffer((2, 3), "float32")
        for i, j, k in T.grid(2, 3, 130):
            with T.block("max"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    mx[vi, vj] = T.float32(-3.4028234663852886e38)
                mx[vi, vj] = T.max(mx[vi, vj], A[vi, vj, vk])
        for i, j, k in T.grid(2, 3, 130):
            with T.block("exp"):
                vi, vj, vk = T.axis.remap("SSS", [i, j, k])
                e[vi, vj, vk] = T.exp(A[vi, vj, vk] - mx[vi, vj])
        for i, j, k in T.grid(2, 3, 130):
            with T.block("sum"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    s[vi, vj] = T.float32(0)
                s[vi, vj] = s[vi, vj] + e[vi, vj, vk]
        for i, j, k in T.grid(2, 3, 130):
            with T.block("norm"):
                vi, vj, vk = T.axis.remap("SSS", [i, j, k])
                B[vi, vj, vk] = e[vi, vj, vk] / s[vi, vj]

    @T.prim_func
    def layer_norm(A: T.Buffer((8, 50), "float32"), gamma: T.Buffer((50,), "float32"), beta: T.Buffer((50,), "float32"), B: T.Buffer((8, 50), "float32")):
        T.func_attr({"global_symbol": "layer_norm", "tir.noalias": T.bool(True)})
        s = T.alloc_buffer((8,), "float32")
        v = T.alloc_buffer((8,), "float32")
        for i, k in T.grid(8, 50):
            with T.block("sum"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    s[vi] = T.float32(0)
                s[vi] = s[vi] + A[vi, vk]
        for i, k in T.grid(8, 50):
            with T.block("var"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    v[vi] = T.float32(0)
                v[vi] = v[vi] + (A[vi, vk] - s[vi] * T.float32(0.02)) * (A[vi, vk] - s[vi] * T.float32(0.02))
        for i, j in T.grid(8, 50):
            with T.block("norm"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = (A[vi, vj] - s[vi] * T.float32(0.02)) / T.sqrt(v[vi] * T.float32(0.02) + T.float32(1e-5)) * gamma[vj] + beta[vj]
