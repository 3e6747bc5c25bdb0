"""Recording a time evaluator's result in the tracker's results store
(``kiln results``): ``time_evaluator(..., record=True, label="pr-123")`` on
a session leased from a tracker records each timing it takes, with the
lease's device and the arguments' shapes."""

from __future__ import annotations

import ctypes
import json
from typing import Any, Optional, Sequence

from . import _lib
from ._lib import lib
from .errors import KilnValueError, SessionError


def input_shapes(args: Sequence[Any]) -> list:
    """The arrays among args as the results store names inputs:
    "arg0:float32[64,48]"."""
    out = []
    for i, a in enumerate(args):
        shape, dtype = getattr(a, "shape", None), getattr(a, "dtype", None)
        if shape is None or dtype is None:
            continue
        out.append(f"arg{i}:{dtype}[{','.join(str(int(d)) for d in shape)}]")
    return out


def check_label(label: Optional[str]) -> str:
    if label is None:
        return ""
    if not isinstance(label, str):
        raise KilnValueError(f"time_evaluator: label must be a str, got {label!r}")
    if len(label.encode()) > 128:
        raise KilnValueError(f"time_evaluator: label of {len(label.encode())} bytes, at most 128")
    return label


def record_result(session: Any, function: str, timing: dict, label: str = "", share: bool = False,
                  inputs: Optional[list] = None) -> dict:
    """Records timing (the time evaluator's answer, as libkiln returns it)
    of function in the results store of the tracker that leased session,
    and returns the result as stored (its "id", "owner", "recorded")."""
    if session is None or getattr(session, "is_local", False):
        raise SessionError(
            "time_evaluator(record=True): a timing is recorded in the tracker's results store, so the session must be "
            "one leased from a tracker (kiln.rpc.connect_tracker(...).request(...)), not a local one"
        )
    args = {"function": function, "time": timing, "label": label, "shared": bool(share), "inputs": inputs or []}
    out = ctypes.c_void_p()
    _lib.check(lib.kiln_session_record_result(session._live(), json.dumps(args).encode(), ctypes.byref(out)))
    return json.loads(_lib.take_string(out))
