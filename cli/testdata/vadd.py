@T.prim_func
def vadd(A: T.Buffer((1024,), "float32"), B: T.Buffer((1024,), "float32"), C: T.Buffer((1024,), "float32")):
    for i in T.parallel(1024):
        with T.block("C"):
            vi = T.axis.spatial(1024, i)
            T.reads(A[vi], B[vi])
            T.writes(C[vi])
            C[vi] = A[vi] + B[vi]
