"""Exports the onnx benchmark's models from PyTorch and times PyTorch.

usage: python3 onnx_export.py DIR MODEL[,MODEL…] ROUNDS

For each model (a torchvision classifier by its name in torchvision.models,
with random weights, 1x3x224x224; "transformer", a TransformerEncoderLayer:
d_model 128, 4 heads, batch_first, sequence 32; or "transformer_masked", the
same with GELU, the norm first and a causal attention mask) writes DIR/NAME.onnx, DIR/NAME_x.bin (the input,
raw float32) and DIR/NAME_y.bin (PyTorch's output), and prints
{"NAME": median milliseconds of PyTorch eager, 2 threads, batch 1} (of up
to ROUNDS runs, stopping after TIME_BUDGET_S seconds once three have run).
"""
import json
import sys
import time

import torch
import torchvision

TIME_BUDGET_S = 20.0

torch.set_num_threads(2)
out, names, rounds = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
result = {}


class MaskedEncoder(torch.nn.Module):
    """A pre-norm GELU encoder layer whose attention is causally masked."""

    def __init__(self, seq):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(
            d_model=128, nhead=4, batch_first=True, activation="gelu", norm_first=True)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1))

    def forward(self, x):
        return self.layer(x, src_mask=self.mask)


for name in names:
    torch.manual_seed(0)
    if name == "transformer":
        m = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, batch_first=True).eval()
        x = torch.randn(1, 32, 128)
    elif name == "transformer_masked":
        m = MaskedEncoder(32).eval()
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
        # Up to ROUNDS runs, but no more than a budget of seconds once
        # three have run: PyTorch builds without oneDNN (Debian's) take
        # seconds a run on the larger models.
        times, start = [], time.perf_counter()
        for _ in range(rounds):
            t0 = time.perf_counter()
            m(x)
            times.append((time.perf_counter() - t0) * 1e3)
            if len(times) >= 3 and time.perf_counter() - start > TIME_BUDGET_S:
                break
    times.sort()
    result[name] = times[len(times) // 2]
    x.numpy().tofile(f"{out}/{name}_x.bin")
    y.numpy().tofile(f"{out}/{name}_y.bin")
print(json.dumps(result))
