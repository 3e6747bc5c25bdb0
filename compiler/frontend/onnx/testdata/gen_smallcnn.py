"""Writes smallcnn.onnx, smallcnn_x.npy and smallcnn_y.npy.

A small CNN in the shape of a PyTorch export: Conv → BatchNormalization →
Relu → MaxPool → Conv (depthwise) → Clip → GlobalAveragePool → the
Shape/Gather/Unsqueeze/Concat/Reshape flatten → Gemm, with a symbolic
batch "N". The expected output is computed here with numpy, independently
of kiln. Run with python3 (numpy and python3-onnx).
"""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(7)
f32 = np.float32
w1 = rng.standard_normal((8, 3, 3, 3)).astype(f32) * 0.3
b1 = rng.standard_normal(8).astype(f32) * 0.1
gamma = (rng.random(8) + 0.5).astype(f32)
beta = rng.standard_normal(8).astype(f32) * 0.1
mean = rng.standard_normal(8).astype(f32) * 0.1
var = (rng.random(8) + 0.5).astype(f32)
w2 = rng.standard_normal((8, 1, 3, 3)).astype(f32) * 0.3
fcw = rng.standard_normal((5, 8)).astype(f32) * 0.5
fcb = rng.standard_normal(5).astype(f32) * 0.1

inits = [numpy_helper.from_array(a, n) for a, n in [
    (w1, "conv1.weight"), (b1, "conv1.bias"), (gamma, "bn1.weight"), (beta, "bn1.bias"),
    (mean, "bn1.running_mean"), (var, "bn1.running_var"), (w2, "conv2.weight"),
    (fcw, "fc.weight"), (fcb, "fc.bias"),
    (np.array([0], np.int64), "zero"), (np.array([-1], np.int64), "minus1"),
]]
nodes = [
    helper.make_node("Conv", ["x", "conv1.weight", "conv1.bias"], ["c1"], name="/conv1/Conv", pads=[1, 1, 1, 1]),
    helper.make_node("BatchNormalization", ["c1", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"], ["n1"], name="/bn1/BatchNormalization", epsilon=1e-5),
    helper.make_node("Relu", ["n1"], ["r1"], name="/relu/Relu"),
    helper.make_node("MaxPool", ["r1"], ["p1"], name="/pool/MaxPool", kernel_shape=[2, 2], strides=[2, 2]),
    helper.make_node("Conv", ["p1", "conv2.weight"], ["c2"], name="/conv2/Conv", group=8, pads=[1, 1, 1, 1]),
    helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"], name="/relu6/Clip"),
    helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="/avgpool/GlobalAveragePool"),
    helper.make_node("Shape", ["g"], ["s"], name="/Shape"),
    helper.make_node("Gather", ["s", "zero"], ["n"], name="/Gather", axis=0),
    helper.make_node("Concat", ["n", "minus1"], ["shape"], name="/Concat", axis=0),
    helper.make_node("Reshape", ["g", "shape"], ["flat"], name="/Reshape"),
    helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["y"], name="/fc/Gemm", transB=1),
]
inits += [numpy_helper.from_array(np.array(0, f32), "lo"), numpy_helper.from_array(np.array(6, f32), "hi")]
graph = helper.make_graph(nodes, "smallcnn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="kiln-testdata")
model.ir_version = 7
onnx.checker.check_model(model)
onnx.save(model, "smallcnn.onnx")


def conv(x, w, b=None, pad=1, groups=1):
    n, c, h, wd = x.shape
    o, i, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    out = np.zeros((n, o, oh, ow))
    per = o // groups
    for oc in range(o):
        g = oc // per
        for ic in range(i):
            for dy in range(kh):
                for dx in range(kw):
                    out[:, oc] += w[oc, ic, dy, dx] * xp[:, g * i + ic, dy:dy + oh, dx:dx + ow]
        if b is not None:
            out[:, oc] += b[oc]
    return out


x = rng.standard_normal((2, 3, 16, 16)).astype(f32)
h = conv(x, w1, b1)
h = (h - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5) * gamma[None, :, None, None] + beta[None, :, None, None]
h = np.maximum(h, 0)
h = h.reshape(2, 8, 8, 2, 8, 2).max(axis=(3, 5))
h = conv(h, w2, groups=8)
h = np.clip(h, 0, 6)
h = h.mean(axis=(2, 3))
y = h @ fcw.T.astype(np.float64) + fcb
np.save("smallcnn_x.npy", x)
np.save("smallcnn_y.npy", y.astype(f32))
