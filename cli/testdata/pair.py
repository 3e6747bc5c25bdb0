# A graph function with two results: kiln run writes out_0.npy and out_1.npy.
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4,), dtype="float32")) -> R.Tuple(R.Tensor((4,), dtype="float32"), R.Tensor((4,), dtype="float32")):
        with R.dataflow():
            a = R.add(x, x)
            b = R.multiply(x, x)
            gv = (a, b)
            R.output(gv)
        return gv
