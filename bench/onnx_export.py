"""Exports the onnx benchmark's models from PyTorch and times PyTorch.

usage: python3 onnx_export.py DIR MODEL[,MODEL…] ROUNDS

For each model (torchvision's resnet18, mobilenet_v2, squeezenet1_1 with
random weights, or a TransformerEncoderLayer: d_model 128, 4 heads,
batch_first, sequence 32) writes DIR/NAME.onnx, DIR/NAME_x.bin (the input,
raw float32) and DIR/NAME_y.bin (PyTorch's output), and prints
{"NAME": median milliseconds of PyTorch eager, 2 threads, batch 1}.
"""
import json
import sys
import time

import torch
import torchvision

torch.set_num_threads(2)
out, names, rounds = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
result = {}
for name in names:
    torch.manual_seed(0)
    if name == "transformer":
        m = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, batch_first=True).eval()
        x = torch.randn(1, 32, 128)
    else:
        m = getattr(torchvision.models, name)().eval()
        x = torch.randn(1, 3, 224, 224)
    # Exported outside no_grad: there, PyTorch's fused fast path of the
    # transformer layer has no ONNX export.
    torch.onnx.export(m, x, f"{out}/{name}.onnx", input_names=["input"], output_names=["output"], opset_version=13)
    with torch.no_grad():
        y = m(x)
        for _ in range(2):
            m(x)
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            m(x)
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    result[name] = times[len(times) // 2]
    x.numpy().tofile(f"{out}/{name}_x.bin")
    y.numpy().tofile(f"{out}/{name}_y.bin")
print(json.dumps(result))
