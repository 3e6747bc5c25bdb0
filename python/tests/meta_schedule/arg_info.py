"""TVM's TensorInfo (meta_schedule/arg_info.py) with its JSON form."""

from __future__ import annotations

from typing import Any, Sequence


class ArgInfo:
    """An argument's information."""

    def as_json(self) -> Any:
        raise NotImplementedError


class TensorInfo(ArgInfo):
    """A tensor argument: its dtype and shape."""

    def __init__(self, dtype: str, shape: Sequence[int]) -> None:
        self.dtype = str(dtype)
        self.shape = tuple(int(d) for d in shape)

    def as_json(self) -> Any:
        return ["TENSOR", self.dtype, list(self.shape)]

    def __repr__(self) -> str:
        return f"TensorInfo({self.dtype!r}, {list(self.shape)})"
