# TVM's AnnotateUsedMemory tests: mixed dtypes (cast int16 to uint32; Relay's cast is R.astype).
# Expect used_memory [48] and io_used_memory 48.
from tvm.script import ir as I
from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def cast(x: R.Tensor((1, 2, 2, 2), dtype="int16")) -> R.Tensor((1, 2, 2, 2), dtype="uint32"):
        R.func_attr({"Primitive": 1})
        y = R.astype(x, dtype="uint32")
        return y

    @R.function
    def main(input: R.Tensor((1, 2, 2, 2), dtype="int16")) -> R.Tensor((1, 2, 2, 2), dtype="uint32"):
        cls = Module
        a = cls.cast(input)
        return a
