@T.prim_func
def vfma(A: T.Buffer((1024,), "float32"), B: T.Buffer((1024,), "float32"), C: T.Buffer((1024,), "float32")):
    for io in T.parallel(64):
        for ii in T.vectorized(16):
            with T.block("C"):
                vi = T.axis.spatial(1024, io * 16 + ii)
                T.reads(A[vi], B[vi])
                T.writes(C[vi])
                C[vi] = A[vi] * B[vi] + T.max(A[vi], B[vi])
