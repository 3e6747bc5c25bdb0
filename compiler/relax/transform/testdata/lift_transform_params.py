# LiftTransformParams: num_input = 1, so x is the input and w, b, s are weights.
# w's transpose and its scaling (a chain: only the end is used), and b + s
# (used twice) lift; the matmul with x stays; s is also used directly.
# other has no num_input and stays as it is.
# from tvm.script import ir as I
# from tvm.script import relax as R
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((2, 8), dtype="float32"), w: R.Tensor((4, 8), dtype="float32"), b: R.Tensor((4,), dtype="float32"), s: R.Tensor((4,), dtype="float32")) -> R.Tensor((2, 4), dtype="float32"):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            wt: R.Tensor((8, 4), dtype="float32") = R.permute_dims(w, axes=None)
            ws: R.Tensor((8, 4), dtype="float32") = R.multiply(wt, R.const(0.5, "float32"))
            mm: R.Tensor((2, 4), dtype="float32") = R.matmul(x, ws, out_dtype="float32")
            bs: R.Tensor((4,), dtype="float32") = R.add(b, s)
            y: R.Tensor((2, 4), dtype="float32") = R.add(mm, bs)
            z: R.Tensor((2, 4), dtype="float32") = R.multiply(y, s)
            gv: R.Tensor((2, 4), dtype="float32") = R.add(z, bs)
            R.output(gv)
        return gv

    @R.function
    def other(x: R.Tensor((4,), dtype="float32"), w: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
        with R.dataflow():
            w2: R.Tensor((4,), dtype="float32") = R.multiply(w, w)
            gv: R.Tensor((4,), dtype="float32") = R.add(x, w2)
            R.output(gv)
        return gv
