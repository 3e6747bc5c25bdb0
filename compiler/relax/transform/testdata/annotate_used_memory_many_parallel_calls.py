# TVM's AnnotateUsedMemory tests: many different functions called in parallel on the input, joined by a fourth.
# Expect [240], [360], [480], [720] and io_used_memory 480.
from tvm.script import ir as I
from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def prim1(x: R.Tensor((1, 4, 5, 6), dtype="int8")) -> R.Tensor((1, 4, 5, 6), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.tanh(x)
        return y

    @R.function
    def prim2(x: R.Tensor((1, 4, 5, 6), dtype="int8")) -> R.Tensor((1, 4, 5, 6), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.nn.max_pool2d(x, pool_size=[1, 1], layout="NHWC")
        return y

    @R.function
    def prim3(x: R.Tensor((1, 4, 5, 6), dtype="int8")) -> R.Tensor((1, 4, 5, 6), dtype="int8"):
        R.func_attr({"Primitive": 1})
        a = R.abs(x)
        b = R.nn.relu(a)
        y = R.exp(b)
        return y

    @R.function
    def prim4(x: R.Tensor((1, 4, 5, 6), dtype="int8"), y: R.Tensor((1, 4, 5, 6), dtype="int8"), z: R.Tensor((1, 4, 5, 6), dtype="int8")) -> R.Tensor((1, 4, 5, 18), dtype="int8"):
        R.func_attr({"Primitive": 1})
        out = R.concat((x, y, z), axis=3)
        return out

    @R.function
    def main(input: R.Tensor((1, 4, 5, 6), dtype="int8")) -> R.Tensor((1, 4, 5, 18), dtype="int8"):
        cls = Module
        x = cls.prim1(input)
        y = cls.prim2(input)
        z = cls.prim3(input)
        a = cls.prim4(x, y, z)
        return a
