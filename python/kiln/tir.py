"""kiln.tir: TensorIR functions and their schedules, named after TVM's
``tvm.tir``.

``tir.Schedule(func)`` schedules a PrimFunc (from ``te.create_prim_func``,
an IRModule or TVMScript text) with kiln's Go schedule primitives
(compiler/schedule): each call runs there at once, and a primitive that
does not apply raises ScheduleError with the Go side's message, leaving
the schedule unchanged. ``sch.mod`` is the scheduled module, for
``kiln.build``; ``sch.trace`` lists the primitives applied.

The expression helpers (Select, Cast, floordiv, exp, …) build the
expressions of te.compute bodies.
"""

from __future__ import annotations

import ctypes
import json
import numbers
from typing import Any, List, Optional, Sequence, Tuple, Union

from . import _lib
from ._expr import (
    Binary,
    Call,
    Cast,
    FloatImm,
    IntImm,
    IterVar,
    Not,
    PrimExpr,
    Range,
    Select,
    Var,
    const,
    convert,
)
from ._lib import lib
from .errors import KilnValueError
from .ir import IRModule, _function_text


class ScheduleError(KilnValueError):
    """A schedule primitive does not apply (TVM's tvm.tir.ScheduleError);
    the message is the Go side's, naming the primitive, blocks and loops."""


class PrimFunc:
    """A TensorIR function, held as the TVMScript text of a module of that
    one function. ``script()`` is the text, ``show()`` prints it."""

    def __init__(self, text: str) -> None:
        self._text = text

    @property
    def name(self) -> str:
        """The function's name (its global symbol)."""
        for line in self._text.splitlines():
            s = line.strip()
            if s.startswith("def ") and "(" in s:
                return s[4 : s.index("(")]
        return "main"

    def with_attr(self, key: str, value: Any) -> "PrimFunc":
        """The function with attribute key set; kiln sets "global_symbol"
        (the function's name) only."""
        if key != "global_symbol":
            raise KilnValueError(f"with_attr: kiln sets only 'global_symbol' from Python, not {key!r}")
        if not isinstance(value, str) or not value:
            raise KilnValueError(f"with_attr: global_symbol must be a non-empty string, got {value!r}")
        return PrimFunc(_function_text(self._text, "", value))

    def script(self, **_: Any) -> str:
        return self._text

    def show(self, file: Optional[Any] = None) -> None:
        print(self._text, file=file)

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return self._text


class BlockRV:
    """A block of a Schedule."""

    def __init__(self, sch: "Schedule", ref: dict) -> None:
        self._sch = sch
        self._ref = {"block": ref["block"]}
        self.name = ref.get("name", "")

    def __repr__(self) -> str:
        return f"BlockRV({self.name!r})"


class LoopRV:
    """A loop of a Schedule, named by its loop variable."""

    def __init__(self, sch: "Schedule", ref: dict) -> None:
        self._sch = sch
        self._ref = {"loop": ref["loop"]}
        self.name = ref.get("name", "")

    def __repr__(self) -> str:
        return f"LoopRV({self.name!r})"


class Trace:
    """The primitives a schedule applied, in TVM's Python syntax."""

    def __init__(self, insts: List[str]) -> None:
        self.insts = insts

    def show(self, file: Optional[Any] = None) -> None:
        print(str(self), file=file)

    def __str__(self) -> str:
        return "\n".join(self.insts)

    def __repr__(self) -> str:
        return str(self)


def _text_of(mod: Any, what: str) -> str:
    if isinstance(mod, (IRModule, PrimFunc)):
        return mod.script()
    if isinstance(mod, str):
        return mod
    raise KilnValueError(f"{what}: want a kiln.IRModule, kiln.tir.PrimFunc or TVMScript text, got {type(mod).__name__}")


class Schedule:
    """TVM's tir.Schedule over kiln's Go primitives: get_block, get_loops,
    get_child_blocks, split, fuse, reorder, parallel, vectorize, unroll,
    bind, annotate, cache_read, cache_write, compute_at,
    reverse_compute_at, compute_inline and decompose_reduction."""

    def __init__(self, mod: Union[IRModule, PrimFunc, str], func_name: Optional[str] = None) -> None:
        text = _text_of(mod, "tir.Schedule")
        h = _lib.Handle()
        _lib.check(lib.kiln_schedule_new(text.encode(), (func_name or "").encode(), ctypes.byref(h)))
        self._h = h.value
        # Copies share blocks and loops: the handles number them alike.
        self._family = object()
        # The primitives applied, to replay them on another function of
        # the same structure (te schedules built with other arguments).
        self._calls: List[Tuple[str, str]] = []

    def __del__(self) -> None:
        try:
            _lib.free(self._h)
        except Exception:
            pass

    def copy(self) -> "Schedule":
        """An independent schedule in the same state; blocks and loops of
        this one are valid in the copy."""
        h = _lib.Handle()
        _lib.check(lib.kiln_schedule_copy(self._h, ctypes.byref(h)))
        c = Schedule.__new__(Schedule)
        c._h = h.value
        c._family = self._family
        c._calls = list(self._calls)
        return c

    @property
    def mod(self) -> IRModule:
        """The scheduled function as a module."""
        out = ctypes.c_void_p()
        _lib.check(lib.kiln_schedule_script(self._h, ctypes.byref(out)))
        return IRModule(_lib.take_string(out))

    @property
    def func(self) -> PrimFunc:
        return PrimFunc(self.mod.script())

    @property
    def trace(self) -> Trace:
        out = ctypes.c_void_p()
        _lib.check(lib.kiln_schedule_trace(self._h, ctypes.byref(out)))
        return Trace(json.loads(_lib.take_string(out)))

    def show(self, file: Optional[Any] = None) -> None:
        self.mod.show(file)

    # The one way into the Go primitives.
    def _apply(self, prim: str, *args: Any) -> Any:
        enc = json.dumps([self._arg(prim, i, a) for i, a in enumerate(args)])
        out = ctypes.c_void_p()
        rc = lib.kiln_schedule_apply(self._h, prim.encode(), enc.encode(), ctypes.byref(out))
        if rc != 0:
            err = _lib.last_error()
            if isinstance(err, KilnValueError):
                raise ScheduleError(str(err)) from None
            raise err
        self._calls.append((prim, enc))
        return self._result(json.loads(_lib.take_string(out)))

    def _arg(self, prim: str, i: int, a: Any) -> Any:
        if isinstance(a, (BlockRV, LoopRV)):
            if a._sch._family is not self._family:
                raise ScheduleError(f"{prim}: argument {i} ({a!r}) belongs to another schedule")
            return a._ref
        if isinstance(a, (list, tuple)):
            return [self._arg(prim, i, x) for x in a]
        if isinstance(a, IntImm):
            return a.value
        if a is None or isinstance(a, (str, bool, numbers.Integral)):
            return int(a) if isinstance(a, numbers.Integral) and not isinstance(a, bool) else a
        if isinstance(a, float):
            return a
        raise ScheduleError(f"{prim}: argument {i} is a {type(a).__name__} ({a!r}); kiln's primitives take blocks, loops, integers and strings")

    def _result(self, r: Any) -> Any:
        if isinstance(r, list):
            return [self._result(x) for x in r]
        if isinstance(r, dict):
            return BlockRV(self, r) if "block" in r else LoopRV(self, r)
        return r

    def _replay(self, mod: Union[IRModule, PrimFunc, str]) -> "Schedule":
        """A schedule of mod with this one's primitives applied again (mod
        has the same blocks and loops, e.g. other parameters' order)."""
        s = Schedule(mod)
        for prim, enc in self._calls:
            out = ctypes.c_void_p()
            rc = lib.kiln_schedule_apply(s._h, prim.encode(), enc.encode(), ctypes.byref(out))
            if rc != 0:
                raise ScheduleError(str(_lib.last_error()))
            _lib.take_string(out)
            s._calls.append((prim, enc))
        return s

    # Primitives, with TVM's signatures.
    def get_block(self, name: str, func_name: Optional[str] = None) -> BlockRV:
        return self._apply("get_block", name)

    def get_loops(self, block: BlockRV) -> List[LoopRV]:
        return self._apply("get_loops", block)

    def get_child_blocks(self, block_or_loop: Union[BlockRV, LoopRV]) -> List[BlockRV]:
        if isinstance(block_or_loop, BlockRV):
            raise ScheduleError("get_child_blocks: kiln takes a loop here, not a block")
        return self._apply("get_child_blocks", block_or_loop)

    def split(
        self,
        loop: LoopRV,
        factors: Sequence[Optional[Any]],
        preserve_unit_iters: bool = True,
        disable_predication: bool = False,
    ) -> List[LoopRV]:
        if disable_predication:
            raise ScheduleError("split: kiln always predicates a split that does not divide its loop (disable_predication)")
        fs = []
        for f in factors:
            if isinstance(f, IntImm):
                f = f.value
            if f is not None and (isinstance(f, bool) or not isinstance(f, numbers.Integral)):
                raise ScheduleError(f"split: factor {f!r} of loop {loop.name!r} is not an integer or None")
            fs.append(f)
        return self._apply("split", loop, fs)

    def fuse(self, *loops: LoopRV, preserve_unit_iters: bool = True) -> LoopRV:
        return self._apply("fuse", *loops)

    def reorder(self, *ordered_loops: LoopRV) -> None:
        self._apply("reorder", *ordered_loops)

    def parallel(self, loop: LoopRV) -> None:
        self._apply("parallel", loop)

    def vectorize(self, loop: LoopRV) -> None:
        self._apply("vectorize", loop)

    def unroll(self, loop: LoopRV) -> None:
        self._apply("unroll", loop)

    def bind(self, loop: LoopRV, thread_axis: str) -> None:
        self._apply("bind", loop, thread_axis)

    def annotate(self, block_or_loop: Union[BlockRV, LoopRV], ann_key: str, ann_val: Any) -> None:
        if isinstance(block_or_loop, BlockRV):
            raise ScheduleError("annotate: kiln annotates loops, not blocks")
        self._apply("annotate", block_or_loop, ann_key, ann_val)

    def cache_read(self, block: BlockRV, read_buffer_index: int, storage_scope: str, consumer_blocks: Any = None) -> BlockRV:
        if consumer_blocks:
            raise ScheduleError("cache_read: kiln makes every reader of the scope read the copy (consumer_blocks)")
        return self._apply("cache_read", block, read_buffer_index, storage_scope)

    def cache_write(self, block: BlockRV, write_buffer_index: int, storage_scope: str, consumer_blocks: Any = None) -> BlockRV:
        if consumer_blocks:
            raise ScheduleError("cache_write: consumer_blocks is not supported by kiln")
        return self._apply("cache_write", block, write_buffer_index, storage_scope)

    def compute_at(self, block: BlockRV, loop: LoopRV, preserve_unit_loops: bool = False, index: int = -1) -> None:
        self._apply("compute_at", block, loop)

    def reverse_compute_at(self, block: BlockRV, loop: LoopRV, preserve_unit_loops: bool = False, index: int = -1) -> None:
        self._apply("reverse_compute_at", block, loop)

    def compute_inline(self, block: BlockRV) -> None:
        self._apply("compute_inline", block)

    def decompose_reduction(self, block: BlockRV, loop: LoopRV) -> BlockRV:
        return self._apply("decompose_reduction", block, loop)


# Expression helpers, as in tvm.tir.
def _binary(op: str, a: Any, b: Any) -> PrimExpr:
    return Binary(op, convert(a), convert(b))


def floordiv(a: Any, b: Any) -> PrimExpr:
    return _binary("floordiv", a, b)


def floormod(a: Any, b: Any) -> PrimExpr:
    return _binary("floormod", a, b)


def truncdiv(a: Any, b: Any) -> PrimExpr:
    return _binary("div", a, b)


def truncmod(a: Any, b: Any) -> PrimExpr:
    return _binary("mod", a, b)


indexdiv = floordiv
indexmod = floormod


def div(a: Any, b: Any) -> PrimExpr:
    return _binary("div", a, b)


def min(a: Any, b: Any) -> PrimExpr:  # noqa: A001 (TVM's name)
    return _binary("min", a, b)


def max(a: Any, b: Any) -> PrimExpr:  # noqa: A001 (TVM's name)
    return _binary("max", a, b)


def all(*conds: Any) -> PrimExpr:  # noqa: A001 (TVM's name)
    if not conds:
        raise KilnValueError("tir.all: no condition given")
    out = convert(conds[0])
    for c in conds[1:]:
        out = _binary("and", out, c)
    return out


def any(*conds: Any) -> PrimExpr:  # noqa: A001 (TVM's name)
    if not conds:
        raise KilnValueError("tir.any: no condition given")
    out = convert(conds[0])
    for c in conds[1:]:
        out = _binary("or", out, c)
    return out


def if_then_else(cond: Any, t: Any, f: Any) -> PrimExpr:
    return Select(cond, t, f)


def _intrin(name: str, arity: int):
    def f(*args: Any) -> PrimExpr:
        if len(args) != arity:
            raise KilnValueError(f"{name} takes {arity} argument(s), got {len(args)}")
        return Call(name, args)

    f.__name__ = name
    f.__doc__ = f"TVM's tir.{name}."
    return f


exp = _intrin("exp", 1)
log = _intrin("log", 1)
sqrt = _intrin("sqrt", 1)
rsqrt = _intrin("rsqrt", 1)
tanh = _intrin("tanh", 1)
sigmoid = _intrin("sigmoid", 1)
erf = _intrin("erf", 1)
floor = _intrin("floor", 1)
ceil = _intrin("ceil", 1)
round = _intrin("round", 1)  # noqa: A001 (TVM's name)
fabs = _intrin("fabs", 1)
power = _intrin("pow", 2)
pow = power  # noqa: A001 (TVM's name)


def abs(x: Any) -> PrimExpr:  # noqa: A001 (TVM's name)
    """|x|: fabs for floats, a select for integers."""
    x = convert(x)
    if x.dtype.startswith(("float", "bfloat")):
        return Call("fabs", [x])
    return Select(x < 0, -x, x)


__all__ = [
    "BlockRV", "Binary", "Call", "Cast", "FloatImm", "IntImm", "IterVar", "LoopRV", "Not", "PrimExpr",
    "PrimFunc", "Range", "Schedule", "ScheduleError", "Select", "Trace", "Var", "abs", "all", "any",
    "ceil", "const", "div", "erf", "exp", "fabs", "floor", "floordiv", "floormod", "if_then_else",
    "indexdiv", "indexmod", "log", "max", "min", "pow", "power", "round", "rsqrt", "sigmoid", "sqrt",
    "tanh", "truncdiv", "truncmod",
]
