# the IRModule tutorial's MLP shrunk (1x16 -> 8 -> 4) so that the interpreter runs it quickly.
# from tvm.script import ir as I
# from tvm.script import relax as R
@I.ir_module
class Module:
    @R.function
    def main(inp_0: R.Tensor((1, 16), dtype="float32"), fc1_bias: R.Tensor((8,), dtype="float32"), fc1_weight: R.Tensor((8, 16), dtype="float32"), fc2_bias: R.Tensor((4,), dtype="float32"), fc2_weight: R.Tensor((4, 8), dtype="float32")) -> R.Tensor((1, 4), dtype="float32"):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            lv: R.Tensor((16, 8), dtype="float32") = R.permute_dims(fc1_weight, axes=None)
            lv1: R.Tensor((1, 8), dtype="float32") = R.matmul(inp_0, lv, out_dtype="float32")
            lv2: R.Tensor((1, 8), dtype="float32") = R.add(lv1, fc1_bias)
            lv3: R.Tensor((1, 8), dtype="float32") = R.nn.relu(lv2)
            lv4: R.Tensor((8, 4), dtype="float32") = R.permute_dims(fc2_weight, axes=None)
            lv5: R.Tensor((1, 4), dtype="float32") = R.matmul(lv3, lv4, out_dtype="float32")
            lv6: R.Tensor((1, 4), dtype="float32") = R.add(lv5, fc2_bias)
            gv: R.Tensor((1, 4), dtype="float32") = lv6
            R.output(gv)
        return gv
