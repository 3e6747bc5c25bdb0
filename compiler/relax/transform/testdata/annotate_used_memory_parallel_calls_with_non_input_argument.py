# TVM's AnnotateUsedMemory tests: y = f(x), then twenty parallel calls g(y) concatenated (main in a dataflow block).
# Expect [240] on f, [120 + 80*i for i in 1..20] on g and io_used_memory 1720.
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
    def prim2(x: R.Tensor((1, 4, 5, 6), dtype="int8")) -> R.Tensor((1, 4, 4, 5), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.nn.max_pool2d(x, pool_size=[2, 2])
        return y

    @R.function
    def main(input: R.Tensor((1, 4, 5, 6), dtype="int8")) -> R.Tensor((1, 4, 4, 100), dtype="int8"):
        cls = Module
        with R.dataflow():
            y = cls.prim1(input)
            z0 = cls.prim2(y)
            z1 = cls.prim2(y)
            z2 = cls.prim2(y)
            z3 = cls.prim2(y)
            z4 = cls.prim2(y)
            z5 = cls.prim2(y)
            z6 = cls.prim2(y)
            z7 = cls.prim2(y)
            z8 = cls.prim2(y)
            z9 = cls.prim2(y)
            z10 = cls.prim2(y)
            z11 = cls.prim2(y)
            z12 = cls.prim2(y)
            z13 = cls.prim2(y)
            z14 = cls.prim2(y)
            z15 = cls.prim2(y)
            z16 = cls.prim2(y)
            z17 = cls.prim2(y)
            z18 = cls.prim2(y)
            z19 = cls.prim2(y)
            out = R.concat((z0, z1, z2, z3, z4, z5, z6, z7, z8, z9, z10, z11, z12, z13, z14, z15, z16, z17, z18, z19), axis=3)
            gv = out
            R.output(gv)
        return gv
