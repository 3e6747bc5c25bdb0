# TVM's AnnotateUsedMemory tests: the called function has a dynamic dimension, so the call's result has an unknown shape.
# Expect the error "AnnotateUsedMemory does not support dynamic shapes".
from tvm.script import ir as I
from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def pool(x: R.Tensor(("n", 2, 2, 4), dtype="int8")) -> R.Tensor(("n", 2, 2, 4), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.nn.max_pool2d(x, pool_size=[1, 1])
        return y

    @R.function
    def main(input: R.Tensor((1, 2, 2, 4), dtype="int8")) -> R.Tensor((1, 2, 2, 4), dtype="int8"):
        cls = Module
        a = cls.pool(input)
        return a
