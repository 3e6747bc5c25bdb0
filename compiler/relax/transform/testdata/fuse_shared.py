# Two groups with the same computation share one fused function.
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((3, 5), dtype="float32"), y: R.Tensor((3, 5), dtype="float32"), z: R.Tensor((3, 5), dtype="float32")) -> R.Tuple(R.Tensor((3, 5), dtype="float32"), R.Tensor((3, 5), dtype="float32")):
        with R.dataflow():
            lv = R.add(x, y)
            gv1 = R.nn.relu(lv)
            lv1 = R.add(z, y)
            gv2 = R.nn.relu(lv1)
            R.output(gv1, gv2)
        return (gv1, gv2)
