"""Profiler.timeit as TVM's meta_schedule/profiler.py has it: the time of
each named scope, summed per name (Profiler.table())."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Dict, Iterator


class Profiler:
    _lock = threading.Lock()
    _totals: Dict[str, float] = {}

    @staticmethod
    @contextmanager
    def timeit(name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            with Profiler._lock:
                Profiler._totals[name] = Profiler._totals.get(name, 0.0) + time.perf_counter() - start

    @staticmethod
    def table() -> Dict[str, float]:
        with Profiler._lock:
            return dict(Profiler._totals)
