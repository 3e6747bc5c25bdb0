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
        elif isinstance(target, dict):
            target = _from_dict(target)
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


def _from_dict(d: dict) -> str:
    """TVM's dict form of a target ({"kind": "llvm", "mtriple": ...,
    "mcpu": ...}) as a target string ("llvm -mtriple=... -mcpu=...")."""
    kind = d.get("kind")
    if not isinstance(kind, str) or not kind:
        raise KilnValueError(f"Target: {d!r} has no \"kind\" (want e.g. {{'kind': 'llvm', 'mtriple': 'aarch64-linux-gnu'}})")
    parts = [kind]
    for k, v in d.items():
        if k in ("kind", "host"):
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        if isinstance(v, (list, tuple)):
            v = ",".join(str(x) for x in v)
        parts.append(f"-{k}={v}")
    return " ".join(parts)
