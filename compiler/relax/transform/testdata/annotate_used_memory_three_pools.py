# TVM's AnnotateUsedMemory tests: three chained NHWC 2x2 max pools.
# Expect used_memory [226], [170], [122] and io_used_memory 178.
from tvm.script import ir as I
from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def pool0(x: R.Tensor((1, 8, 8, 2), dtype="int8")) -> R.Tensor((1, 7, 7, 2), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.nn.max_pool2d(x, pool_size=[2, 2], layout="NHWC")
        return y

    @R.function
    def pool1(x: R.Tensor((1, 7, 7, 2), dtype="int8")) -> R.Tensor((1, 6, 6, 2), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.nn.max_pool2d(x, pool_size=[2, 2], layout="NHWC")
        return y

    @R.function
    def pool2(x: R.Tensor((1, 6, 6, 2), dtype="int8")) -> R.Tensor((1, 5, 5, 2), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.nn.max_pool2d(x, pool_size=[2, 2], layout="NHWC")
        return y

    @R.function
    def main(input: R.Tensor((1, 8, 8, 2), dtype="int8")) -> R.Tensor((1, 5, 5, 2), dtype="int8"):
        cls = Module
        a = cls.pool0(input)
        b = cls.pool1(a)
        c = cls.pool2(b)
        return c
