#!/usr/bin/python3
"""Regenerates the golden files under ndarray/testdata with real numpy.

Run from ndarray/testdata:  /usr/bin/python3 gen.py
The values here are repeated in npy_test.go and safetensors_test.go.
"""
import io
import json
import struct

import numpy as np
from numpy.lib import format as npf

inf = float("inf")

# One file per dtype, written by np.save (format 1.0, little-endian).
per_dtype = {
    "bool": (np.array([True, False, True, True, False, False]).reshape(2, 3)),
    "int8": np.array([-128, -1, 0, 1, 127], dtype=np.int8),
    "int16": np.array([-32768, -1, 0, 1, 32767], dtype=np.int16),
    "int32": np.array([-2**31, -1, 0, 1, 2**31 - 1], dtype=np.int32),
    "int64": np.array([-2**63, -1, 0, 1, 2**63 - 1], dtype=np.int64),
    "uint8": np.array([0, 1, 127, 128, 255], dtype=np.uint8),
    "uint16": np.array([0, 1, 2**15 - 1, 2**15, 2**16 - 1], dtype=np.uint16),
    "uint32": np.array([0, 1, 2**31 - 1, 2**31, 2**32 - 1], dtype=np.uint32),
    "uint64": np.array([0, 1, 2**63 - 1, 2**63, 2**64 - 1], dtype=np.uint64),
    "float16": np.array([0, 1, -2, 0.5, 65504, inf], dtype=np.float16).reshape(2, 3),
    "float32": np.array([0, 1.5, -2.25, 3.4028235e38, 1e-45, inf], dtype=np.float32).reshape(2, 3),
    "float64": np.array([0, 1.5, -2.25, 1.7976931348623157e308, 5e-324, -inf]).reshape(3, 2),
}
for name, a in per_dtype.items():
    np.save(f"npy/{name}.npy", a)

np.save("npy/scalar_float64.npy", np.float64(3.25))
np.save("npy/empty_float32.npy", np.zeros((0, 3), dtype=np.float32))
np.save("npy/int32_4d.npy", np.arange(24, dtype=np.int32).reshape(1, 2, 3, 4))

# Big-endian data.
np.save("npy/be_float32.npy", np.array([1.5, -2.25, 3], dtype=">f4"))
np.save("npy/be_int64.npy", np.array([-1, 2, 1 << 40], dtype=">i8"))
np.save("npy/be_uint16.npy", np.array([1, 258, 65535], dtype=">u2"))
np.save("npy/be_float16.npy", np.array([1, -2, 0.5], dtype=">f2"))

# Format versions 2.0 and 3.0.
a = np.arange(6, dtype=np.float32).reshape(2, 3)
for v in [(2, 0), (3, 0)]:
    with open(f"npy/float32_v{v[0]}.npy", "wb") as f:
        npf.write_array(f, a, version=v)

# Refused: Fortran order, object arrays.
np.save("npy/fortran.npy", np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)))
np.save("npy/object.npy", np.array([1, "a"], dtype=object), allow_pickle=True)


def raw(path, descr, shape, data):
    with open(path, "wb") as f:
        npf.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": shape})
        f.write(data)


# bfloat16 as kiln writes it: descr 'bfloat16'. Values 1, -2, 0.5, inf.
bf16 = np.array([0x3F80, 0xC000, 0x3F00, 0x7F80], dtype="<u2")
raw("npy/bfloat16.npy", "bfloat16", (4,), bf16.tobytes())
# bfloat16 as np.save writes an ml_dtypes.bfloat16 array: descr '<V2'.
raw("npy/bfloat16_v2.npy", "<V2", (4,), bf16.tobytes())


# A safetensors file laid out as the reference implementation lays one out:
# tensors by descending dtype rank then name, header padded with spaces to
# a multiple of 8.
RANK = ["BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64"]
tensors = {
    "weight": ("F32", [2, 2], np.array([1, -2, 0.5, 4], dtype="<f4").tobytes()),
    "bias": ("F32", [2], np.array([0.25, -0.25], dtype="<f4").tobytes()),
    "step": ("I64", [], np.array([7], dtype="<i8").tobytes()),
    "mask": ("BOOL", [3], bytes([1, 0, 1])),
    "ids": ("U8", [0], b""),
    "half": ("F16", [2], np.array([1, -2], dtype="<f2").tobytes()),
    "brain": ("BF16", [2], np.array([0x3F80, 0xC000], dtype="<u2").tobytes()),
}
order = sorted(tensors, key=lambda n: (-RANK.index(tensors[n][0]), n))
header = {"__metadata__": {"format": "pt", "note": "<kiln & co>"}}
off = 0
data = b""
for n in order:
    dt, shape, b = tensors[n]
    header[n] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
    off += len(b)
    data += b
h = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open("safetensors/mixed.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + data)
