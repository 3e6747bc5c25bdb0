# The matrix multiply of TVM's tensor-expression tutorial (te.compute with
# te.sum, s[C].parallel(C.op.axis[0])) as TVMScript, as `kiln demo --keep`
# writes it. N, K and M are symbolic: any shapes that agree work.
# from tvm.script import tir as T

@T.prim_func
def matrix_multiply(var_A: T.handle, var_B: T.handle, var_C: T.handle):
    T.func_attr({"tir.noalias": T.bool(True)})
    N = T.int32()
    K = T.int32()
    M = T.int32()
    A = T.match_buffer(var_A, (N, K))
    B = T.match_buffer(var_B, (K, M))
    C = T.match_buffer(var_C, (N, M))
    # with T.block("root"):
    for i in T.parallel(N):
        for j, k in T.grid(M, K):
            with T.block("C"):
                v_i, v_j, v_k = T.axis.remap("SSR", [i, j, k])
                T.reads(A[v_i, v_k], B[v_k, v_j])
                T.writes(C[v_i, v_j])
                with T.init():
                    C[v_i, v_j] = T.float32(0.0)
                C[v_i, v_j] = C[v_i, v_j] + A[v_i, v_k] * B[v_k, v_j]
