"""The two TVM utilities the runner imports from outside MetaSchedule:
tvm.ir.utils.derived_object and tvm.support.popen_pool.PopenPoolExecutor
(see the package's docstring for why it runs on threads)."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Optional


def derived_object(cls: type) -> type:
    """TVM wraps a Python subclass of an FFI object; there is none here."""
    return cls


class PopenPoolExecutor:
    """TVM's PopenPoolExecutor's interface as RPCRunner uses it:
    submit(fn, *args) returns a concurrent.futures.Future and initializer
    runs once in each worker. A per-task timeout (which TVM enforces by
    killing the popen worker) is refused: RPCRunner does not set one, its
    session's timeout bounds the measurement on the device."""

    def __init__(self, max_workers: Optional[int] = None, timeout: Optional[float] = None,
                 initializer: Optional[Callable[..., None]] = None, initargs: tuple = ()) -> None:
        if timeout is not None:
            raise ValueError("PopenPoolExecutor: a per-task timeout is not supported on threads")
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers or 1, initializer=initializer, initargs=initargs,
        )

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        return self._pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait)

    def __del__(self) -> None:
        try:
            self._pool.shutdown(wait=False)
        except Exception:
            pass
