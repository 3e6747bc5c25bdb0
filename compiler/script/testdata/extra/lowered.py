# from tvm.script import tir as T
@T.prim_func
def lowered(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
    with T.LetStmt(T.int32(8), T.int32) as n:
        for i in range(n):
            A[i] = T.float32(1)
    with T.decl_buffer((8,), scope="local") as tmp:
        for i in range(8):
            tmp[i] = A[i] * T.float32(2)
        B[0] = tmp[0]
    flat = T.decl_buffer((8, 8), data=A.data)
    with T.attr(None, "pragma_x", 1):
        for i in T.serial(1, 9):
            B[T.Ramp(i * 4, 1, 4)] = A[T.Ramp(i * 4, 1, 4)] + T.Broadcast(T.float32(1), 4)
            flat[i - 1, 0] = T.sigmoid(flat[i - 1, 1]) ** T.float32(2) + T.tanh(T.log(B[0])) + T.erf(T.rsqrt(B[1]))
