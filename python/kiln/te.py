"""kiln.te: tensor expressions, named after TVM's ``tvm.te``.

Placeholders, te.compute stages defined by Python lambdas over index
variables, and reductions (te.sum, te.max, te.min) over te.reduce_axis
axes are Python objects; ``te.create_prim_func([A, B, C])`` hands the whole
graph to kiln's Go side (compiler/te), which builds the TensorIR PrimFunc.

``te.create_schedule(C.op)`` is TVM's older schedule API (``s[C].split``,
``tile``, ``reorder``, ``parallel``, ``vectorize``, ``compute_at``,
``s.cache_write`` …). kiln runs each of its calls as the tir.Schedule
primitive it amounts to (a stage is the block named after it, its axes
the block's loops), so a call that does not apply fails at once;
``kiln.build(s, [A, B, C])`` builds the function of those arguments with
the same primitives.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _lib, tir
from ._expr import (
    IterVar,
    PrimExpr,
    Range,
    Reduce,
    TensorElement,
    Var,
    _index_expr,
    convert,
    encode_graph,
    shape_tuple,
)
from ._lib import lib
from .errors import KilnValueError
from .tir import (  # noqa: F401 (TVM's te re-exports these)
    Cast,
    ScheduleError,
    abs,
    ceil,
    const,
    erf,
    exp,
    floor,
    floordiv,
    floormod,
    if_then_else,
    indexdiv,
    indexmod,
    log,
    power,
    round,
    rsqrt,
    sigmoid,
    sqrt,
    tanh,
    truncdiv,
    truncmod,
)


def var(name: str = "tindex", dtype: str = "int32") -> Var:
    """A symbolic scalar, e.g. a size (TVM's te.var)."""
    if not dtype.startswith(("int", "uint")):
        raise KilnValueError(f"te.var {name!r}: dtype {dtype!r}; kiln's size variables are integers")
    return Var(name, dtype)


size_var = var


class PlaceholderOp:
    """The operation of a te.placeholder: an input."""

    body = None
    axis: List[IterVar] = []
    reduce_axis: List[IterVar] = []
    input_tensors: List["Tensor"] = []

    def __init__(self, name: str) -> None:
        self.name = name
        self._out: Optional[Tensor] = None

    def output(self, i: int) -> "Tensor":
        if i != 0 or self._out is None:
            raise KilnValueError(f"{self.name}: an operation has one output (0), not {i}")
        return self._out

    @property
    def num_outputs(self) -> int:
        return 1

    def __repr__(self) -> str:
        return f"placeholder({self.name})"


class ComputeOp(PlaceholderOp):
    """The operation of a te.compute stage: axis are its index variables,
    reduce_axis the axes of its reduction, body its value."""

    def __init__(self, name: str, axis: List[IterVar], body: PrimExpr, inputs: List["Tensor"]) -> None:
        super().__init__(name)
        self.axis = axis
        self.body = body
        self.reduce_axis = list(body.axis) if isinstance(body, Reduce) else []
        self.input_tensors = inputs

    def __repr__(self) -> str:
        return f"compute({self.name}, body=[{self.body}], axis=[{', '.join(map(repr, self.axis))}])"


class Tensor:
    """A tensor: a placeholder or the output of a te.compute. ``T[i, j]``
    is its element in another stage's expression."""

    def __init__(self, shape: Tuple[PrimExpr, ...], dtype: str, op: PlaceholderOp) -> None:
        self.shape = shape
        self.dtype = dtype
        self.op = op
        self.name = op.name
        self.value_index = 0
        op._out = self

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices: Any) -> TensorElement:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != len(self.shape):
            raise KilnValueError(f"tensor {self.name!r} has {len(self.shape)} dimensions, indexed with {len(indices)} indices")
        idx = []
        for d, i in enumerate(indices):
            if isinstance(i, slice):
                raise KilnValueError(f"tensor {self.name!r}: index {d} is a slice; index elements one by one")
            e = convert(i)
            if not e.dtype.startswith(("int", "uint")):
                raise KilnValueError(f"tensor {self.name!r}: index {d} ({e}) has dtype {e.dtype}, want an integer")
            idx.append(e)
        return TensorElement(self, idx)

    def __call__(self, *indices: Any) -> TensorElement:
        return self[indices]

    def __repr__(self) -> str:
        return f"Tensor(shape=[{', '.join(map(str, self.shape))}], op.name={self.name})"


def placeholder(shape: Any, dtype: str = "float32", name: str = "placeholder") -> Tensor:
    """An input tensor (TVM's te.placeholder)."""
    if not isinstance(dtype, str) or not dtype:
        raise KilnValueError(f"te.placeholder {name!r}: dtype {dtype!r} is not a dtype name such as 'float32'")
    return Tensor(shape_tuple(shape, f"te.placeholder {name!r}"), dtype, PlaceholderOp(name))


def reduce_axis(dom: Any, name: str = "rv") -> IterVar:
    """A reduce axis over dom, (min, max) or a Range (TVM's
    te.reduce_axis((0, K), "k"))."""
    if isinstance(dom, Range):
        r = dom
    else:
        try:
            lo, hi = dom
        except (TypeError, ValueError):
            raise KilnValueError(f"te.reduce_axis {name!r}: dom {dom!r}: want (min, max) or a Range") from None
        r = Range(lo, hi)
    return IterVar(r, name, IterVar.CommReduce)


def thread_axis(dom: Any = None, tag: str = "", name: str = "") -> IterVar:
    """A GPU thread axis for Stage.bind: te.thread_axis("threadIdx.x")."""
    if isinstance(dom, str):
        tag, dom = dom, None
    if not tag:
        raise KilnValueError("te.thread_axis: no thread tag given (blockIdx.x, threadIdx.x, …)")
    return IterVar(None, name or tag, 1, tag)


def _reads(e: PrimExpr, out: List[Tensor]) -> None:
    """Appends the tensors e reads, in first-use order."""
    stack = [e]
    seen_nodes = set()
    while stack:
        x = stack.pop()
        if id(x) in seen_nodes:
            continue
        seen_nodes.add(id(x))
        if isinstance(x, TensorElement):
            if all(t is not x.tensor for t in out):
                out.append(x.tensor)
            stack.extend(reversed(x.indices))
            continue
        for attr in ("a", "b", "value", "condition", "true_value", "false_value", "source"):
            c = getattr(x, attr, None)
            if isinstance(c, PrimExpr):
                stack.append(c)
        for c in getattr(x, "args", []) or []:
            if isinstance(c, PrimExpr):
                stack.append(c)


def compute(shape: Any, fcompute: Callable[..., Any], name: str = "compute", tag: str = "", attrs: Any = None) -> Tensor:
    """The tensor whose element at indices is fcompute(*indices) (TVM's
    te.compute); the lambda's parameter names name the index variables.
    The value may be a reduction (te.sum(..., axis=k)) as a whole."""
    what = f"te.compute {name!r}"
    dims = shape_tuple(shape, what)
    if not callable(fcompute):
        raise KilnValueError(f"{what}: fcompute is a {type(fcompute).__name__}, want a function of the indices")
    names: List[str] = []
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        params = []
    variadic = any(p.kind == p.VAR_POSITIONAL for p in params)
    if not variadic:
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) != len(dims):
            raise KilnValueError(f"{what}: the function takes {len(positional)} indices, the shape has {len(dims)} dimensions")
        names = [p.name for p in positional]
    else:
        defaults = ["i", "j", "k", "l"]
        names = defaults[: len(dims)] if len(dims) <= 4 else [f"i{d}" for d in range(len(dims))]
    axis = [IterVar(Range(0, d), n, IterVar.DataPar) for d, n in zip(dims, names)]
    body = fcompute(*axis)
    if isinstance(body, (list, tuple)):
        raise KilnValueError(f"{what}: the function returned {len(body)} values; kiln's te.compute has one output")
    if inspect.isgenerator(body):
        raise KilnValueError(f"{what}: the function returned a generator; write a reduction as te.sum(expr, axis=k) with k = te.reduce_axis((0, K))")
    body = convert(body)
    inputs: List[Tensor] = []
    _reads(body, inputs)
    op = ComputeOp(name, axis, body, inputs)
    for d, iv in enumerate(axis):
        iv._owner, iv._pos = op, d
    return Tensor(dims, body.dtype, op)


def _reducer(kind: str):
    def reduce(expr: Any, axis: Any = None, where: Any = None, init: Any = None) -> PrimExpr:
        if inspect.isgenerator(expr):
            raise KilnValueError(
                f"te.{kind}: a generator (… for k in range(K)) cannot be a reduction; "
                f"write te.{kind}(expr, axis=k) with k = te.reduce_axis((0, K), 'k')"
            )
        if where is not None or init is not None:
            raise KilnValueError(f"te.{kind}: kiln's reductions take no where= or init=")
        if axis is None:
            raise KilnValueError(f"te.{kind}: no reduce axis given (axis=k, k = te.reduce_axis(...))")
        axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
        if kind != "sum" and len(axes) == 1 and not isinstance(axes[0], IterVar):
            # te.max(a, b) and te.min(a, b) on two values, as in TVM.
            return tir.max(expr, axes[0]) if kind == "max" else tir.min(expr, axes[0])
        for a in axes:
            if not isinstance(a, IterVar) or a.iter_type != IterVar.CommReduce:
                raise KilnValueError(f"te.{kind}: axis {a!r} is not a reduce axis (te.reduce_axis)")
        return Reduce(kind, expr, axes)

    reduce.__name__ = kind
    reduce.__doc__ = f"The {kind} of expr over the reduce axes axis (TVM's te.{kind})."
    return reduce


sum = _reducer("sum")  # noqa: A001 (TVM's name)
max = _reducer("max")  # noqa: A001 (TVM's name)
min = _reducer("min")  # noqa: A001 (TVM's name)


def create_prim_func(ops: Sequence[Tensor], index_dtype_override: Optional[str] = None) -> tir.PrimFunc:
    """The TensorIR PrimFunc of the tensors ops: its parameters, in order
    (the placeholders read and the outputs); stages among them become loop
    nests around blocks named after them (TVM's te.create_prim_func)."""
    if index_dtype_override is not None:
        raise KilnValueError("create_prim_func: index_dtype_override is not supported; give te.var the dtype")
    return _prim_func(ops, "")


def _prim_func(args: Sequence[Tensor], name: str) -> tir.PrimFunc:
    graph = json.dumps(encode_graph(list(args), name))
    out = ctypes.c_void_p()
    _lib.check(lib.kiln_te_create_prim_func(graph.encode(), ctypes.byref(out)))
    return tir.PrimFunc(_lib.take_string(out))


class Stage:
    """The schedule of one te.compute stage: s[C]. Its axes are the loops
    of the block named after the stage."""

    def __init__(self, sch: "Schedule", op: ComputeOp, block: str) -> None:
        self.sch = sch
        self.op = op
        self._block = block
        self._loops: Dict[int, tir.LoopRV] = {}
        self._keep: List[IterVar] = []
        self._bind_axes(list(op.axis) + list(op.reduce_axis))

    def _bind_axes(self, ivs: List[IterVar]) -> None:
        t = self.sch._tir
        loops = t.get_loops(t.get_block(self._block))
        if len(loops) < len(ivs):
            raise ScheduleError(f"stage {self.op.name!r}: block {self._block!r} has {len(loops)} loops, the stage {len(ivs)} axes")
        self._loops = {}
        for iv, l in zip(ivs, loops):
            self._map(iv, l)

    def _map(self, iv: IterVar, loop: tir.LoopRV) -> None:
        self._loops[id(iv)] = loop
        self._keep.append(iv)

    def _loop(self, prim: str, iv: Any) -> tir.LoopRV:
        if not isinstance(iv, IterVar):
            raise ScheduleError(f"{prim}: {iv!r} is not an axis (IterVar) of stage {self.op.name!r}")
        l = self._loops.get(id(iv))
        if l is None:
            raise ScheduleError(f"{prim}: {iv.name!r} is not an axis of stage {self.op.name!r} (or a split or fuse replaced it)")
        return l

    def _new(self, loops: Sequence[tir.LoopRV]) -> List[IterVar]:
        out = []
        for l in loops:
            iv = IterVar(None, l.name, IterVar.DataPar)
            self._map(iv, l)
            out.append(iv)
        return out

    def split(self, parent: IterVar, factor: Any = None, nparts: Any = None) -> Tuple[IterVar, IterVar]:
        """Splits parent into (outer, inner), inner of factor iterations or
        outer of nparts."""
        if (factor is None) == (nparts is None):
            raise ScheduleError(f"split of {getattr(parent, 'name', parent)!r}: give exactly one of factor and nparts")
        fs = [None, factor] if nparts is None else [nparts, None]
        outer, inner = self._new(self.sch._tir.split(self._loop("split", parent), fs))
        return outer, inner

    def tile(self, x_parent: IterVar, y_parent: IterVar, x_factor: Any, y_factor: Any) -> Tuple[IterVar, IterVar, IterVar, IterVar]:
        """Tiles the 2-d nest x_parent, y_parent: (xo, yo, xi, yi)."""
        xo, xi = self.split(x_parent, factor=x_factor)
        yo, yi = self.split(y_parent, factor=y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def fuse(self, *args: IterVar) -> IterVar:
        loops = [self._loop("fuse", a) for a in args]
        (fused,) = self._new([self.sch._tir.fuse(*loops)])
        return fused

    def reorder(self, *args: IterVar) -> None:
        self.sch._tir.reorder(*[self._loop("reorder", a) for a in args])

    def parallel(self, var: IterVar) -> None:
        self.sch._tir.parallel(self._loop("parallel", var))

    def vectorize(self, var: IterVar) -> None:
        self.sch._tir.vectorize(self._loop("vectorize", var))

    def unroll(self, var: IterVar) -> None:
        self.sch._tir.unroll(self._loop("unroll", var))

    def bind(self, ivar: IterVar, thread_ivar: IterVar) -> None:
        if not isinstance(thread_ivar, IterVar) or not thread_ivar.thread_tag:
            raise ScheduleError("bind: the thread axis must come from te.thread_axis")
        self.sch._tir.bind(self._loop("bind", ivar), thread_ivar.thread_tag)

    def pragma(self, var: IterVar, pragma_type: str, pragma_value: Any = None) -> None:
        key = "pragma_" + pragma_type
        self.sch._tir.annotate(self._loop("pragma", var), key, 1 if pragma_value is None else pragma_value)

    def compute_at(self, parent: "Stage", scope: IterVar) -> None:
        """Computes this stage inside parent's loop scope."""
        if not isinstance(parent, Stage):
            raise ScheduleError(f"compute_at: parent is a {type(parent).__name__}, want a stage (s[T])")
        t = self.sch._tir
        block = t.get_block(self._block)
        t.compute_at(block, parent._loop("compute_at", scope))
        # compute_at made new loops for this stage under scope (the
        # region parent needs); the stage's axes are the innermost ones.
        ivs = list(self.op.axis) + list(self.op.reduce_axis)
        loops = t.get_loops(block)
        own = loops[len(loops) - len(ivs):] if len(loops) >= len(ivs) else []
        self._loops = {}
        for iv, l in zip(ivs, own):
            self._map(iv, l)

    def compute_inline(self) -> None:
        t = self.sch._tir
        t.compute_inline(t.get_block(self._block))

    def __repr__(self) -> str:
        return f"stage({self.op.name})"


class Schedule:
    """TVM's te schedule: s[T] is the Stage of T (a tensor or its op)."""

    def __init__(self, outputs: Sequence[Any]) -> None:
        outs = []
        for o in outputs:
            t = o if isinstance(o, Tensor) else getattr(o, "_out", None)
            if not isinstance(t, Tensor) or not isinstance(t.op, ComputeOp):
                raise KilnValueError(f"create_schedule: {o!r} is not a te.compute (or its op)")
            outs.append(t)
        self.outputs = outs
        # The arguments kiln schedules with until build names them: every
        # placeholder read, in first-use order, then the outputs.
        self._args = _default_args(outs)
        self._tir = tir.Schedule(_prim_func(self._args, ""))
        self.stages: Dict[int, Stage] = {}
        self._tensors: Dict[int, Tensor] = {}

    def __getitem__(self, t: Any) -> Stage:
        tensor = t if isinstance(t, Tensor) else getattr(t, "_out", None)
        if not isinstance(tensor, Tensor):
            raise KilnValueError(f"schedule: {t!r} is not a tensor or an operation")
        st = self.stages.get(id(tensor.op))
        if st is None:
            if not isinstance(tensor.op, ComputeOp):
                raise ScheduleError(f"schedule: {tensor.name!r} is a placeholder; it has no stage to schedule")
            if not self._reaches(tensor):
                raise ScheduleError(f"schedule: {tensor.name!r} is not computed by this schedule's outputs")
            st = self.stages[id(tensor.op)] = Stage(self, tensor.op, tensor.name)
            self._tensors[id(tensor.op)] = tensor
        return st

    def _reaches(self, t: Tensor) -> bool:
        seen, stack = set(), list(self.outputs)
        while stack:
            x = stack.pop()
            if x is t:
                return True
            if id(x) not in seen:
                seen.add(id(x))
                stack.extend(x.op.input_tensors)
        return False

    def cache_write(self, tensor: Tensor, scope: str) -> Tensor:
        """Computes tensor into a new buffer of storage scope scope, copied
        out after: the returned tensor's stage does the computation, s[tensor]
        the copy (TVM's s.cache_write)."""
        st = self[tensor]
        t = self._tir
        copy = t.cache_write(t.get_block(st._block), 0, scope)
        op = st.op
        axis = [IterVar(iv.dom, iv.name, IterVar.DataPar) for iv in op.axis]
        cached = ComputeOp(f"{op.name}.{scope}", axis, op.body, op.input_tensors)
        for d, iv in enumerate(axis):
            iv._owner, iv._pos = cached, d
        cached.reduce_axis = list(op.reduce_axis)
        ct = Tensor(tensor.shape, tensor.dtype, cached)
        # The computation keeps the block named after the tensor; the copy
        # is the new block, and s[tensor] now schedules the copy's loops.
        cs = Stage.__new__(Stage)
        cs.sch, cs.op, cs._block, cs._loops, cs._keep = self, cached, st._block, {}, []
        cs._bind_axes(list(cached.axis) + list(cached.reduce_axis))
        self.stages[id(cached)] = cs
        st._block = copy.name
        st._bind_axes(list(op.axis))
        return ct

    def _func(self, args: Optional[Sequence[Tensor]], name: str) -> tir.Schedule:
        """This schedule's primitives applied to the PrimFunc of args."""
        args = list(args) if args is not None else self._args
        return self._tir._replay(_prim_func(args, name))


def _default_args(outs: List[Tensor]) -> List[Tensor]:
    order: List[Tensor] = []
    seen = set()

    def visit(t: Tensor) -> None:
        if id(t) in seen:
            return
        seen.add(id(t))
        for i in t.op.input_tensors:
            visit(i)
        if not isinstance(t.op, ComputeOp) and all(t is not o for o in order):
            order.append(t)

    for o in outs:
        visit(o)
    return order + list(outs)


def create_schedule(ops: Any) -> Schedule:
    """A schedule of the stages computing ops (an op, a tensor or a list of
    them), every loop serial, in row-major order (TVM's te.create_schedule)."""
    if not isinstance(ops, (list, tuple)):
        ops = [ops]
    return Schedule(ops)


__all__ = [
    "ComputeOp", "PlaceholderOp", "Schedule", "Stage", "Tensor", "compute", "create_prim_func",
    "create_schedule", "max", "min", "placeholder", "reduce_axis", "size_var", "sum", "thread_axis", "var",
]
