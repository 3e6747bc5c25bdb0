# TVM's AnnotateUsedMemory tests: two primitive functions whose results are concatenated in main.
# The second call also holds the first result: expect [240], [360] and io_used_memory 360.
from tvm.script import ir as I
from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def reshape0(x: R.Tensor((1, 4, 5, 6), dtype="int8")) -> R.Tensor((1, 4, 30), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.reshape(x, R.shape([1, 4, 30]))
        return y

    @R.function
    def reshape1(x: R.Tensor((1, 4, 5, 6), dtype="int8")) -> R.Tensor((1, 4, 30), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.reshape(x, R.shape([1, 4, 30]))
        return y

    @R.function
    def main(input: R.Tensor((1, 4, 5, 6), dtype="int8")) -> R.Tensor((2, 4, 30), dtype="int8"):
        cls = Module
        a = cls.reshape0(input)
        b = cls.reshape1(input)
        c = R.concat((a, b), axis=0)
        return c
