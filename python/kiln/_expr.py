"""Expressions of tensor programs as Python objects: what kiln.te and
kiln.tir build with operators (``A[i] + B[i]``), and their encoding as the
JSON graph libkiln turns into a PrimFunc (see ``kiln_te_create_prim_func``).

Nothing is computed or checked here beyond what a message needs (dtypes,
arity): the Go side (compiler/te) builds and verifies the function.
"""

from __future__ import annotations

import numbers
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .errors import KilnValueError

_FLOAT_PREFIXES = ("float", "bfloat")


def _is_float(dtype: str) -> bool:
    return dtype.startswith(_FLOAT_PREFIXES)


def _bits(dtype: str) -> int:
    digits = "".join(c for c in dtype if c.isdigit())
    return int(digits) if digits else 0


def _promote(a: "PrimExpr", b: "PrimExpr") -> str:
    """The dtype a binary operation of a and b has, by the rules of the Go
    side's ir.Arith: a constant takes the other side's dtype, float beats
    int, the wider type wins."""
    ta, tb = a.dtype, b.dtype
    if ta == tb:
        return ta
    ca, cb = isinstance(a, (IntImm, FloatImm)), isinstance(b, (IntImm, FloatImm))
    if cb and not ca:
        return ta
    if ca and not cb:
        return tb
    if _is_float(ta) != _is_float(tb):
        return ta if _is_float(ta) else tb
    if ta == "bool":
        return tb
    if tb == "bool":
        return ta
    return tb if _bits(tb) > _bits(ta) else ta


def const(value: Any, dtype: Optional[str] = None) -> "PrimExpr":
    """A constant (TVM's tvm.tir.const): ints default to int32, floats to
    float32, bools to bool."""
    if isinstance(value, PrimExpr):
        return value
    if isinstance(value, bool):
        return IntImm(dtype or "bool", int(value))
    if isinstance(value, numbers.Integral):
        d = dtype or "int32"
        return FloatImm(d, float(value)) if _is_float(d) else IntImm(d, int(value))
    if isinstance(value, numbers.Real):
        d = dtype or "float32"
        if not _is_float(d):
            raise KilnValueError(f"constant {value!r}: dtype {d} is not a float type")
        return FloatImm(d, float(value))
    raise KilnValueError(f"cannot use a {type(value).__name__} ({value!r}) in a tensor expression")


def convert(value: Any) -> "PrimExpr":
    """value as an expression (numbers become constants)."""
    return const(value)


class PrimExpr:
    """An expression of a tensor program. Arithmetic, comparison and
    indexing operators build new expressions; ``==`` builds an equality
    whose truth value (in an ``if``) is identity, as in TVM."""

    dtype: str = "int32"

    # Encoding (see _Encoder.expr).
    def _enc(self, e: "_Encoder") -> list:
        raise NotImplementedError

    def _bin(self, op: str, other: Any, reverse: bool = False) -> "PrimExpr":
        o = convert(other)
        return Binary(op, o, self) if reverse else Binary(op, self, o)

    def __add__(self, o: Any) -> "PrimExpr":
        return self._bin("add", o)

    def __radd__(self, o: Any) -> "PrimExpr":
        return self._bin("add", o, True)

    def __sub__(self, o: Any) -> "PrimExpr":
        return self._bin("sub", o)

    def __rsub__(self, o: Any) -> "PrimExpr":
        return self._bin("sub", o, True)

    def __mul__(self, o: Any) -> "PrimExpr":
        return self._bin("mul", o)

    def __rmul__(self, o: Any) -> "PrimExpr":
        return self._bin("mul", o, True)

    def __truediv__(self, o: Any) -> "PrimExpr":
        return self._bin("div", o)

    def __rtruediv__(self, o: Any) -> "PrimExpr":
        return self._bin("div", o, True)

    def __floordiv__(self, o: Any) -> "PrimExpr":
        return self._bin("floordiv", o)

    def __rfloordiv__(self, o: Any) -> "PrimExpr":
        return self._bin("floordiv", o, True)

    def __mod__(self, o: Any) -> "PrimExpr":
        return self._bin("floormod", o)

    def __rmod__(self, o: Any) -> "PrimExpr":
        return self._bin("floormod", o, True)

    def __neg__(self) -> "PrimExpr":
        return Binary("sub", const(0, self.dtype), self)

    def __lt__(self, o: Any) -> "PrimExpr":
        return self._bin("lt", o)

    def __le__(self, o: Any) -> "PrimExpr":
        return self._bin("le", o)

    def __gt__(self, o: Any) -> "PrimExpr":
        return self._bin("gt", o)

    def __ge__(self, o: Any) -> "PrimExpr":
        return self._bin("ge", o)

    def __eq__(self, o: Any) -> "PrimExpr":  # type: ignore[override]
        return _Equal("eq", self, convert(o))

    def __ne__(self, o: Any) -> "PrimExpr":  # type: ignore[override]
        return _Equal("ne", self, convert(o))

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise KilnValueError(
            f"the truth value of the expression {self} is not known while the program is defined; "
            "use kiln.tir.Select or kiln.te.if_then_else for a condition"
        )

    def equal(self, o: Any) -> "PrimExpr":
        return Binary("eq", self, convert(o))

    def astype(self, dtype: str) -> "PrimExpr":
        """This expression cast to dtype."""
        return Cast(dtype, self)

    def __repr__(self) -> str:
        return str(self)


class Var(PrimExpr):
    """A scalar variable: a symbolic size (te.var) or, inside te.compute,
    an index."""

    def __init__(self, name: str, dtype: str = "int32") -> None:
        self.name = name
        self.dtype = dtype

    def _enc(self, e: "_Encoder") -> list:
        return ["var", e.var(self)]

    def __str__(self) -> str:
        return self.name


class IntImm(PrimExpr):
    def __init__(self, dtype: str, value: int) -> None:
        self.dtype = dtype
        self.value = value

    def _enc(self, e: "_Encoder") -> list:
        return ["int", self.value, self.dtype]

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __str__(self) -> str:
        return str(self.value)


class FloatImm(PrimExpr):
    def __init__(self, dtype: str, value: float) -> None:
        self.dtype = dtype
        self.value = value

    def _enc(self, e: "_Encoder") -> list:
        return ["float", self.value, self.dtype]

    def __float__(self) -> float:
        return self.value

    def __str__(self) -> str:
        return repr(self.value)


class Range:
    """The half-open interval [min, min + extent) (TVM's tvm.ir.Range)."""

    def __init__(self, begin: Any, end: Any = None) -> None:
        if end is None:
            begin, end = 0, begin
        self.min = _index_expr(begin, "range start")
        end = _index_expr(end, "range end")
        if isinstance(self.min, IntImm) and self.min.value == 0:
            self.extent = end
        elif isinstance(self.min, IntImm) and isinstance(end, IntImm):
            self.extent = IntImm(end.dtype, end.value - self.min.value)
        else:
            self.extent = end - self.min

    @staticmethod
    def from_min_extent(min_value: Any, extent: Any) -> "Range":
        r = Range(0, 1)
        r.min = _index_expr(min_value, "range start")
        r.extent = _index_expr(extent, "range extent")
        return r

    def __repr__(self) -> str:
        return f"range(min={self.min}, ext={self.extent})"


def _index_expr(v: Any, what: str) -> PrimExpr:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    e = convert(v)
    if _is_float(e.dtype):
        raise KilnValueError(f"{what} {v!r} is not an integer")
    return e


class IterVar(PrimExpr):
    """An iteration variable: one of a compute stage's index variables
    (op.axis), a reduce axis (te.reduce_axis) or, in a te schedule, a loop
    that split or fuse made. It stands for its variable in expressions."""

    DataPar = 0
    CommReduce = 2

    def __init__(self, dom: Optional[Range], name: str, kind: int, thread_tag: str = "") -> None:
        self.dom = dom
        self.var = self
        self.name = name
        self.iter_type = kind
        self.thread_tag = thread_tag
        self.dtype = dom.extent.dtype if dom is not None else "int32"
        # The compute stage whose index this is (set by te.compute).
        self._owner: Optional[Any] = None
        self._pos = -1

    def _enc(self, e: "_Encoder") -> list:
        if self.iter_type == IterVar.CommReduce:
            return ["axis", e.axis(self)]
        if self._owner is None:
            raise KilnValueError(f"the loop variable {self.name!r} of a schedule cannot be used in a tensor expression")
        if e.stage is not self._owner:
            where = f"te.compute {e.stage.name!r}" if e.stage is not None else "a shape or range"
            raise KilnValueError(
                f"the index variable {self.name!r} of te.compute {self._owner.name!r} is used in {where}"
            )
        return ["index", self._pos]

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        kind = {0: "data_par", 2: "reduce"}.get(self.iter_type, str(self.iter_type))
        return f"IterVar({self.name}, {self.dom!r}, {kind})"


class Binary(PrimExpr):
    _SYMBOLS = {
        "add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "floormod": "%",
        "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": "and", "or": "or",
    }

    def __init__(self, op: str, a: PrimExpr, b: PrimExpr) -> None:
        self.op, self.a, self.b = op, a, b
        if op in ("lt", "le", "gt", "ge", "eq", "ne", "and", "or"):
            self.dtype = "bool"
        else:
            self.dtype = _promote(a, b)

    def _enc(self, e: "_Encoder") -> list:
        return ["bin", self.op, e.expr(self.a), e.expr(self.b)]

    def __str__(self) -> str:
        sym = self._SYMBOLS.get(self.op)
        if sym is None:
            return f"T.{self.op}({self.a}, {self.b})"
        return f"({self.a} {sym} {self.b})"


class _Equal(Binary):
    """a == b: an expression, and in an if its identity test (TVM's EqualOp)."""

    def __bool__(self) -> bool:
        same = self.a is self.b
        return same if self.op == "eq" else not same


class Not(PrimExpr):
    dtype = "bool"

    def __init__(self, a: PrimExpr) -> None:
        self.a = a

    def _enc(self, e: "_Encoder") -> list:
        return ["not", e.expr(self.a)]

    def __str__(self) -> str:
        return f"not {self.a}"


class Cast(PrimExpr):
    def __init__(self, dtype: str, value: PrimExpr) -> None:
        self.dtype = dtype
        self.value = convert(value)

    def _enc(self, e: "_Encoder") -> list:
        return ["cast", self.dtype, e.expr(self.value)]

    def __str__(self) -> str:
        return f"T.Cast({self.dtype!r}, {self.value})"


class Select(PrimExpr):
    """cond ? true_value : false_value (TVM's tvm.tir.Select)."""

    def __init__(self, condition: Any, true_value: Any, false_value: Any) -> None:
        self.condition = convert(condition)
        self.true_value = convert(true_value)
        self.false_value = convert(false_value)
        self.dtype = _promote(self.true_value, self.false_value)

    def _enc(self, e: "_Encoder") -> list:
        return ["select", e.expr(self.condition), e.expr(self.true_value), e.expr(self.false_value)]

    def __str__(self) -> str:
        return f"T.Select({self.condition}, {self.true_value}, {self.false_value})"


class Call(PrimExpr):
    """An intrinsic call (exp, sqrt, …)."""

    def __init__(self, op: str, args: Sequence[Any]) -> None:
        self.op = op
        self.args = [convert(a) for a in args]
        self.dtype = self.args[0].dtype if len(self.args) == 1 else _promote(self.args[0], self.args[1])

    def _enc(self, e: "_Encoder") -> list:
        return ["call", self.op, [e.expr(a) for a in self.args]]

    def __str__(self) -> str:
        return f"T.{self.op}({', '.join(str(a) for a in self.args)})"


class Reduce(PrimExpr):
    """A reduction (te.sum, te.max, te.min) over reduce axes; it must be the
    whole value of a te.compute."""

    def __init__(self, kind: str, source: Any, axes: Sequence[IterVar]) -> None:
        self.kind = kind
        self.source = convert(source)
        self.axis = list(axes)
        self.dtype = self.source.dtype

    def _enc(self, e: "_Encoder") -> list:
        return ["reduce", self.kind, e.expr(self.source), [e.axis(a) for a in self.axis]]

    def __str__(self) -> str:
        return f"T.{self.kind}({self.source}, axis=[{', '.join(a.name for a in self.axis)}])"


class TensorElement(PrimExpr):
    """tensor[indices]."""

    def __init__(self, tensor: Any, indices: Sequence[Any]) -> None:
        self.tensor = tensor
        self.indices = [convert(i) for i in indices]
        self.dtype = tensor.dtype

    def _enc(self, e: "_Encoder") -> list:
        return ["load", e.tensor(self.tensor), [e.expr(i) for i in self.indices]]

    def __str__(self) -> str:
        return f"{self.tensor.name}[{', '.join(str(i) for i in self.indices)}]"


class _Encoder:
    """Numbers the variables, reduce axes and tensors of a graph as it
    encodes them (see the JSON layout in capi/te.go)."""

    def __init__(self) -> None:
        self.vars: List[dict] = []
        self.axes: List[dict] = []
        self.tensors: List[dict] = []
        self._var_ids: Dict[int, int] = {}
        self._axis_ids: Dict[int, int] = {}
        self._tensor_ids: Dict[int, int] = {}
        self._keep: List[Any] = []  # ids are object ids: keep them alive
        self.stage: Optional[Any] = None

    def var(self, v: Var) -> int:
        k = self._var_ids.get(id(v))
        if k is None:
            k = self._var_ids[id(v)] = len(self.vars)
            self.vars.append({"name": v.name, "dtype": v.dtype})
            self._keep.append(v)
        return k

    def axis(self, a: IterVar) -> int:
        if not isinstance(a, IterVar) or a.iter_type != IterVar.CommReduce:
            raise KilnValueError(f"{a!s} is not a reduce axis (make one with te.reduce_axis)")
        k = self._axis_ids.get(id(a))
        if k is None:
            saved, self.stage = self.stage, None
            entry = {"name": a.name, "min": self.expr(a.dom.min), "extent": self.expr(a.dom.extent)}
            self.stage = saved
            k = self._axis_ids[id(a)] = len(self.axes)
            self.axes.append(entry)
            self._keep.append(a)
        return k

    def tensor(self, t: Any) -> int:
        k = self._tensor_ids.get(id(t))
        if k is None:
            raise KilnValueError(f"tensor {t.name!r} is read before it is defined")
        return k

    def expr(self, x: PrimExpr) -> list:
        return x._enc(self)

    def add_tensor(self, t: Any) -> None:
        """Encodes t; every tensor it reads must be encoded before."""
        saved, self.stage = self.stage, None
        shape = [self.expr(s) for s in t.shape]
        entry: Dict[str, Any] = {"name": t.name, "shape": shape}
        op = t.op
        if op.body is None:
            entry["dtype"] = t.dtype
        else:
            self.stage = op
            entry["axis_names"] = [iv.name for iv in op.axis]
            entry["body"] = self.expr(op.body)
        self.stage = saved
        self._tensor_ids[id(t)] = len(self.tensors)
        self.tensors.append(entry)
        self._keep.append(t)


def encode_graph(args: Sequence[Any], name: str = "") -> dict:
    """The JSON graph of the tensors args (the PrimFunc's parameters, in
    order) and every tensor they read."""
    from .te import Tensor

    order: List[Any] = []
    state: Dict[int, int] = {}

    def visit(t: Any) -> None:
        s = state.get(id(t))
        if s == 2:
            return
        if s == 1:
            raise KilnValueError(f"tensor {t.name!r} depends on itself")
        state[id(t)] = 1
        for inp in t.op.input_tensors:
            visit(inp)
        state[id(t)] = 2
        order.append(t)

    for i, t in enumerate(args):
        if not isinstance(t, Tensor):
            raise KilnValueError(f"argument {i}: want a te.Tensor (te.placeholder or te.compute), got {type(t).__name__}")
        visit(t)
    e = _Encoder()
    for t in order:
        e.add_tensor(t)
    return {
        "vars": e.vars,
        "axes": e.axes,
        "tensors": e.tensors,
        "args": [e.tensor(t) for t in args],
        "name": name,
    }


def shape_tuple(shape: Any, what: str) -> Tuple[PrimExpr, ...]:
    """A shape argument (an int, an expression or a sequence of them) as a
    tuple of index expressions."""
    if isinstance(shape, (numbers.Integral, PrimExpr)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = list(shape)
    except TypeError:
        raise KilnValueError(f"{what}: shape {shape!r} is not a sequence of sizes") from None
    out = []
    for d, s in enumerate(dims):
        if isinstance(s, float) and not s.is_integer():
            raise KilnValueError(f"{what}: extent {d} is {s!r}, not an integer")
        e = _index_expr(s, f"{what}: extent {d}")
        if isinstance(e, IterVar) and e.iter_type == IterVar.CommReduce:
            raise KilnValueError(f"{what}: extent {d} is the reduce axis {e.name!r}")
        out.append(e)
    return tuple(out)
