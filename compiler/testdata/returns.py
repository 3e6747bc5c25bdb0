# PrimFuncs with a result (TVMScript's -> T.int64 and return): TVM's
# zero-argument RPC test functions (tests/python/runtime/test_runtime_rpc.py,
# test_compiled_function_with_zero_arguments), a result computed from a
# tensor through a heap-allocated scratch buffer (which the early return
# frees), a float result, a bool, and one that may end without a return.
@I.ir_module
class Module:
    @T.prim_func
    def func_without_arg() -> T.int64:
        return T.int64(42)

    @T.prim_func
    def func_with_arg(unused: T.int64) -> T.int64:
        return T.int64(42)

    @T.prim_func
    def total(A: T.Buffer((16,), "int32"), n: T.int32) -> T.int64:
        scratch = T.alloc_buffer((16384,), "int64")
        for i in range(16384):
            scratch[i] = T.Cast("int64", A[i % 16])
        for i in range(1, 16384):
            scratch[0] = scratch[0] + scratch[i]
        if n < 0:
            return T.int64(-1)
        return scratch[0] + T.Cast("int64", n)

    @T.prim_func
    def half(x: T.float64) -> T.float32:
        return T.Cast("float32", x * T.float64(0.5))

    @T.prim_func
    def positive(x: T.int64) -> T.bool:
        return x > T.int64(0)

    @T.prim_func
    def maybe(x: T.int64) -> T.int64:
        if x > T.int64(0):
            return x * T.int64(2)
