# Unused bindings and a function nothing calls are removed; exported functions stay.
@I.ir_module
class Module:
    @T.prim_func(private=True)
    def unused(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        for i in range(4):
            with T.block("B"):
                vi = T.axis.spatial(4, i)
                B[vi] = A[vi]

    @R.function(private=True)
    def helper(x: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
        return x

    @R.function
    def exported(x: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
        cls = Module
        y = cls.helper(x)
        return y

    @R.function
    def main(x: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
        with R.dataflow():
            lv = R.exp(x)
            lv1 = R.nn.relu(lv)
            lv2 = R.add(x, x)
            gv = lv2
            R.output(gv)
        return gv
