"""tvm.runtime on kiln: modules, devices and arrays (TVM's Tensor is
kiln's NDArray)."""

from __future__ import annotations

from typing import Any

from .. import nd as _nd
from ..nd import Device, NDArray, empty
from ..rpc import local as _local
from ..runtime import BenchmarkResult, Function, Module, load_module
from ..runtime import ShapeTuple

Tensor = NDArray
ndarray = _nd
PackedFunc = Function


def tensor(source: Any, device: Any = None, dtype: Any = None) -> NDArray:
    """TVM's tvm.runtime.tensor: a copy of source on device (kiln.nd.array)."""
    return _nd.array(source, device, dtype)


def convert(value: Any) -> Any:
    """TVM's tvm.runtime.convert: kiln takes Python values (ints, floats,
    strings, lists) as they are, so it returns value."""
    return value


def cpu(dev_id: int = 0) -> Device:
    """This machine's CPU (tvm.cpu)."""
    return _local().cpu(dev_id)


def cuda(dev_id: int = 0) -> Device:
    """This machine's CUDA device dev_id (tvm.cuda)."""
    return _local().cuda(dev_id)


def device(dev_type: Any, dev_id: int = 0) -> Device:
    """A device of this machine by name or type code (tvm.device)."""
    return _local().device(dev_type, dev_id)


__all__ = [
    "BenchmarkResult",
    "Device",
    "Function",
    "Module",
    "NDArray",
    "PackedFunc",
    "ShapeTuple",
    "Tensor",
    "convert",
    "cpu",
    "cuda",
    "device",
    "empty",
    "load_module",
    "ndarray",
    "tensor",
]
