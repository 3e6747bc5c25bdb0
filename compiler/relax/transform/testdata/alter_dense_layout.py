# AlterDenseLayout: the dense layers over weights (w1, w2: num_input = 1)
# take their weight packed in panels of the CPU tile's columns (32 for
# 8 rows of 64 columns, 8 for 40 columns), which O2 lifts out of the
# per-call path; their bias and relu fuse after them. The matmul of two
# activations, and w3's layer whose tile is all its 16 columns, stay.
# from tvm.script import ir as I
# from tvm.script import relax as R
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 8, 32), dtype="float32"), w1: R.Tensor((32, 64), dtype="float32"), b1: R.Tensor((64,), dtype="float32"), w2: R.Tensor((64, 40), dtype="float32"), w3: R.Tensor((40, 16), dtype="float32")) -> R.Tensor((1, 8, 16), dtype="float32"):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            h: R.Tensor((1, 8, 64), dtype="float32") = R.matmul(x, w1, out_dtype="void")
            hb: R.Tensor((1, 8, 64), dtype="float32") = R.add(h, b1)
            r: R.Tensor((1, 8, 64), dtype="float32") = R.nn.relu(hb)
            o: R.Tensor((1, 8, 40), dtype="float32") = R.matmul(r, w2, out_dtype="void")
            t: R.Tensor((1, 40, 8), dtype="float32") = R.permute_dims(o, axes=[0, 2, 1])
            a: R.Tensor((1, 8, 8), dtype="float32") = R.matmul(o, t, out_dtype="void")
            ao: R.Tensor((1, 8, 40), dtype="float32") = R.matmul(a, o, out_dtype="void")
            gv: R.Tensor((1, 8, 16), dtype="float32") = R.matmul(ao, w3, out_dtype="void")
            R.output(gv)
        return gv
