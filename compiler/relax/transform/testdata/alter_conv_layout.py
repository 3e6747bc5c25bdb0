# AlterConvLayout: the convolution of one group (w, a weight: num_input = 1)
# takes its kernel in blocks of 16 output channels (OIHW16o) through a
# reshape and a permute_dims, which O2 lifts out of the per-call path;
# its bias and relu fuse after it. The grouped convolution keeps its OIHW
# kernel; rows' pointwise convolution takes its kernel in panels of 8
# output channels (OIHW8o), which the CPU schedule computes over the
# flattened plane a panel at a time, and rows3x3's convolution, as wide
# but 3×3, takes blocks of 8 channels (the blocked tile); hwio's 12
# output channels take no block of 8 or more, so its kernel goes to HWIO;
# classes' 260 channels are padded with zeros to 288 (blocks of 32) and
# the convolution's result sliced back to 260.
# from tvm.script import ir as I
# from tvm.script import relax as R
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 4, 6, 6), dtype="float32"), w: R.Tensor((16, 4, 3, 3), dtype="float32"), b: R.Tensor((1, 16, 1, 1), dtype="float32"), g: R.Tensor((16, 8, 3, 3), dtype="float32")) -> R.Tensor((1, 16, 3, 3), dtype="float32"):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            c: R.Tensor((1, 16, 6, 6), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            cb: R.Tensor((1, 16, 6, 6), dtype="float32") = R.add(c, b)
            r: R.Tensor((1, 16, 6, 6), dtype="float32") = R.nn.relu(cb)
            gv: R.Tensor((1, 16, 3, 3), dtype="float32") = R.nn.conv2d(r, g, strides=[2, 2], padding=[1, 1, 1, 1], dilation=[1, 1], groups=2, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            R.output(gv)
        return gv

    @R.function
    def rows(x: R.Tensor((1, 4, 3, 16), dtype="float32"), w: R.Tensor((8, 4, 1, 1), dtype="float32")) -> R.Tensor((1, 8, 3, 16), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((1, 8, 3, 16), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[0, 0, 0, 0], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            R.output(gv)
        return gv

    @R.function
    def rows3x3(x: R.Tensor((1, 4, 3, 16), dtype="float32"), w: R.Tensor((8, 4, 3, 3), dtype="float32")) -> R.Tensor((1, 8, 3, 16), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((1, 8, 3, 16), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            R.output(gv)
        return gv

    @R.function
    def hwio(x: R.Tensor((1, 4, 5, 5), dtype="float32"), w: R.Tensor((12, 4, 3, 3), dtype="float32")) -> R.Tensor((1, 12, 3, 3), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((1, 12, 3, 3), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[0, 0, 0, 0], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            R.output(gv)
        return gv

    @R.function
    def classes(x: R.Tensor((1, 4, 3, 3), dtype="float32"), w: R.Tensor((260, 4, 1, 1), dtype="float32")) -> R.Tensor((1, 260, 3, 3), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((1, 260, 3, 3), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[0, 0, 0, 0], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            R.output(gv)
        return gv
