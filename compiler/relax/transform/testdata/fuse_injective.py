# An injective chain (transpose, reshape) and an elementwise operator feeding a reduction.
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((2, 3, 4), dtype="float32")) -> R.Tensor((2,), dtype="float32"):
        with R.dataflow():
            lv = R.permute_dims(x, axes=[0, 2, 1])
            lv1 = R.reshape(lv, R.shape([2, 12]))
            lv2 = R.exp(lv1)
            gv = R.sum(lv2, axis=[1])
            R.output(gv)
        return gv
