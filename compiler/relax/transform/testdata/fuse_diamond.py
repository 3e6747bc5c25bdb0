# A matmul whose result feeds two elementwise branches that join again, then a bias and a reduction.
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4, 8), dtype="float32"), w: R.Tensor((8, 6), dtype="float32"), b: R.Tensor((6,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
        with R.dataflow():
            lv = R.matmul(x, w)
            lv1 = R.nn.relu(lv)
            lv2 = R.exp(lv)
            lv3 = R.add(lv1, lv2)
            lv4 = R.add(lv3, b)
            gv = R.sum(lv4, axis=[1])
            R.output(gv)
        return gv
