# TVM's AnnotateUsedMemory tests: two chained calls of the same function.
# Expect used_memory [32, 32] and io_used_memory 32.
from tvm.script import ir as I
from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def pool(x: R.Tensor((1, 2, 2, 4), dtype="int8")) -> R.Tensor((1, 2, 2, 4), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.nn.max_pool2d(x, pool_size=[1, 1])
        return y

    @R.function
    def main(input: R.Tensor((1, 2, 2, 4), dtype="int8")) -> R.Tensor((1, 2, 2, 4), dtype="int8"):
        cls = Module
        a = cls.pool(input)
        b = cls.pool(a)
        return b
