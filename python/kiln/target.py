"""kiln.target.Target: a target string with TVM's Target attributes, so
``tvm.target.Target("llvm")`` ports by changing the import."""

from __future__ import annotations

from typing import Any, Optional

from .errors import KilnValueError


class TargetKind:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


class Target:
    """A compilation target: "cpu" (or "llvm", "c"), with options as in
    kiln build's --target ("cpu -mtriple=aarch64-linux-gnu"). host is
    accepted for TVM's signature; kiln's CPU target is its own host."""

    def __init__(self, target: Any, host: Optional[Any] = None) -> None:
        if isinstance(target, Target):
            target = str(target)
        if not isinstance(target, str) or not target.strip():
            raise KilnValueError(f"Target: {target!r} is not a target string such as 'llvm' or 'cpu'")
        self._s = target.strip()
        kind = self._s.split()[0]
        self.kind = TargetKind(kind)
        self.host = host

    def __str__(self) -> str:
        return self._s

    def __repr__(self) -> str:
        return f"Target({self._s!r})"
