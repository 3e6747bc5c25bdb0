# TVM's AnnotateUsedMemory tests: a primitive function holding a composite function (the BYOC case).
# The text format has no nested function values, so the composite is a global function with attr Composite called from the primitive one. Expect [20] and io_used_memory 20.
from tvm.script import ir as I
from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def composite(x: R.Tensor((1, 2, 2, 4), dtype="int8")) -> R.Tensor((1, 1, 1, 4), dtype="int8"):
        R.func_attr({"Composite": "my_composite_func"})
        y = R.nn.max_pool2d(x, pool_size=[2, 2], layout="NHWC")
        return y

    @R.function
    def prim(y: R.Tensor((1, 2, 2, 4), dtype="int8")) -> R.Tensor((1, 1, 1, 4), dtype="int8"):
        R.func_attr({"Primitive": 1})
        cls = Module
        z = cls.composite(y)
        return z

    @R.function
    def main(input: R.Tensor((1, 2, 2, 4), dtype="int8")) -> R.Tensor((1, 1, 1, 4), dtype="int8"):
        cls = Module
        a = cls.prim(input)
        return a
