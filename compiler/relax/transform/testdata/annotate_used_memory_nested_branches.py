# TVM's AnnotateUsedMemory tests: branches that branch again: a = f1(in), b = f2(in), c = f3(b), d = f4(b), concat(a, c, d).
# Expect [32], [48], [48], [64] and io_used_memory 64.
from tvm.script import ir as I
from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def prim1(x: R.Tensor((1, 2, 2, 4), dtype="int8")) -> R.Tensor((1, 2, 2, 4), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.nn.relu(x)
        return y

    @R.function
    def prim2(x: R.Tensor((1, 2, 2, 4), dtype="int8")) -> R.Tensor((1, 2, 2, 4), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.nn.relu(x)
        return y

    @R.function
    def prim3(x: R.Tensor((1, 2, 2, 4), dtype="int8")) -> R.Tensor((1, 2, 2, 4), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.nn.relu(x)
        return y

    @R.function
    def prim4(x: R.Tensor((1, 2, 2, 4), dtype="int8")) -> R.Tensor((1, 2, 2, 4), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.nn.relu(x)
        return y

    @R.function
    def main(input: R.Tensor((1, 2, 2, 4), dtype="int8")) -> R.Tensor((1, 2, 2, 12), dtype="int8"):
        cls = Module
        a = cls.prim1(input)
        b = cls.prim2(input)
        c = cls.prim3(b)
        d = cls.prim4(b)
        out = R.concat((a, c, d), axis=3)
        return out
