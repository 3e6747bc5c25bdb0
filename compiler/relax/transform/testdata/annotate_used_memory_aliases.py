# Beyond TVM's AnnotateUsedMemory tests: bindings that only rename or regroup values (a tuple,
# a tuple field, a plain rename) allocate nothing and keep their sources
# alive; a primitive function may return a tuple (its fields add up); a
# call of a function that is not primitive allocates its result but gets
# no annotation.
# Expect used_memory [32, 96] on pool, [80] on pair, none on helper, and
# io_used_memory 16 + (16 + 32 + 16) = 80.
from tvm.script import ir as I
from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def pool(x: R.Tensor((1, 2, 2, 4), dtype="int8")) -> R.Tensor((1, 2, 2, 4), dtype="int8"):
        R.func_attr({"Primitive": 1})
        y = R.nn.relu(x)
        return y

    @R.function
    def pair(x: R.Tensor((1, 2, 2, 4), dtype="int8"), y: R.Tensor((1, 2, 2, 4), dtype="int8")) -> R.Tuple(R.Tensor((1, 2, 2, 4), dtype="int8"), R.Tensor((1, 2, 2, 4), dtype="int8")):
        R.func_attr({"Primitive": 1})
        a = R.nn.relu(x)
        b = R.abs(y)
        return (a, b)

    @R.function
    def helper(x: R.Tensor((1, 2, 2, 4), dtype="int8")) -> R.Tensor((1, 2, 2, 4), dtype="int8"):
        y = R.negative(x)
        return y

    @R.function
    def main(input: R.Tensor((1, 2, 2, 4), dtype="int8")):
        cls = Module
        with R.dataflow():
            a = cls.pool(input)
            h = cls.helper(a)
            t = (a, input)
            b = t[0]
            p = cls.pair(b, input)
            c = p[1]
            d = cls.pool(c)
            out = (d, t, h)
            R.output(out)
        return out
