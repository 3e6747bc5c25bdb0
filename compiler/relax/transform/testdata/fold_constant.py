# Operators on constants fold away; the unused bindings and PrimFuncs go with dead code elimination.
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((2,), dtype="float32")) -> R.Tensor((2,), dtype="float32"):
        with R.dataflow():
            lv = R.add(R.const(1.5, "float32"), R.const(2.0, "float32"))
            lv1 = R.multiply(lv, R.const(2.0, "float32"))
            gv = R.add(x, lv1)
            R.output(gv)
        return gv
