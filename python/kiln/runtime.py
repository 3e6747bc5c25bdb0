"""Modules, functions and the time evaluator, named after TVM's
``tvm.runtime``."""

from __future__ import annotations

import ctypes
import json
import math
import os
import struct
import threading
import weakref
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

from . import _lib, _record
from ._lib import KilnArg, lib
from .errors import KilnValueError, SessionError
from .nd import Device, NDArray

if TYPE_CHECKING:
    from .rpc import RPCSession


class _Object:
    """A libkiln handle freed when the object is collected (or by free())."""

    def __init__(self, handle: int) -> None:
        self._h = handle
        self._freed = False
        self._lock = threading.Lock()

    def free(self) -> None:
        with self._lock:
            if self._freed:
                return
            self._freed = True
        _lib.free(self._h)

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:
            pass


class Module(_Object):
    """A module loaded in a session: ``mod["name"]`` or ``mod.name`` is one
    of its functions; ``mod.time_evaluator(...)`` times one."""

    def __init__(self, handle: int, session: "RPCSession", name: str) -> None:
        super().__init__(handle)
        self.session = session
        self.name = name
        # Weak: a Function holds its module, and a cycle would keep the
        # module, and so its session and the session's lease, alive until
        # Python's cycle collector happens to run (TVM's scripts free a
        # session by dropping the last reference to it).
        self._funcs: "weakref.WeakValueDictionary[str, Function]" = weakref.WeakValueDictionary()
        out = ctypes.c_void_p()
        _lib.check(lib.kiln_module_functions(handle, ctypes.byref(out)))
        self.functions: List[str] = json.loads(_lib.take_string(out))

    def get_function(self, name: str) -> "Function":
        """The function called name (KilnValueError naming the module's
        functions when there is none)."""
        f = self._funcs.get(name)
        if f is None:
            h = _lib.Handle()
            _lib.check(lib.kiln_module_get_function(self._h, name.encode(), ctypes.byref(h)))
            f = Function(h.value, self, name)
            self._funcs[name] = f
        return f

    def __getitem__(self, name: str) -> "Function":
        return self.get_function(name)

    def __getattr__(self, name: str) -> "Function":
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self.get_function(name)
        except KilnValueError as e:
            raise AttributeError(str(e)) from None

    def __contains__(self, name: str) -> bool:
        return name in self.functions

    @property
    def entry_name(self) -> str:
        """The function calling the module calls: "main", or the module's
        only function."""
        if "main" in self.functions or len(self.functions) != 1:
            return "main"
        return self.functions[0]

    def __call__(self, *args: Any) -> Any:
        """Calls the entry function (entry_name), as TVM's built modules
        do: ``fadd = kiln.build(...); fadd(a, b, c)``."""
        return self.get_function(self.entry_name)(*args)

    def export_library(self, file_name: str, fcompile: Any = None, **kwargs: Any) -> None:
        """Saves the artifact the module was loaded from (kiln.build's) as
        file_name, in the form its name asks, as TVM's export_library does:
        FILE.so the linked host library, FILE.tar the tar export (the
        library and the whole artifact), anything else (FILE.kiln) the
        artifact. load_module, here or in a remote session, takes each;
        download_linked_module takes the .tar. fcompile (a TVM compiler
        callback) has no counterpart: kiln's artifact is linked already."""
        src = getattr(self, "artifact", None)
        if not src:
            raise KilnValueError(f"export_library: module {self.name!r} was not built by kiln.build in this process")
        if fcompile is not None:
            raise KilnValueError("export_library: fcompile is not supported; kiln's artifact is linked when built")
        _lib.check(lib.kiln_artifact_export(os.fspath(src).encode(), os.fspath(file_name).encode()))

    def time_evaluator(
        self,
        func_name: str,
        dev: Optional[Device] = None,
        number: int = 10,
        repeat: int = 1,
        min_repeat_ms: int = 0,
        limit_zero_time_iterations: int = 100,
        cooldown_interval_ms: int = 0,
        repeats_to_cooldown: int = 1,
        cache_flush_bytes: int = 0,
        f_preproc: str = "",
        record: bool = False,
        label: Optional[str] = None,
        share: bool = False,
    ) -> "TimeEvaluator":
        """TVM's time_evaluator: a callable that times func_name on the
        device, called with the function's arguments. One warm-up call, then
        repeat measurements of number calls each (number grown until a
        measurement lasts min_repeat_ms; at most limit_zero_time_iterations
        measurements that read zero); a pause of cooldown_interval_ms every
        repeats_to_cooldown repeats; the CPU caches flushed with a buffer of
        cache_flush_bytes before each measurement; f_preproc, the name of a
        global function of the session (e.g.
        "cache_flush_cpu_non_first_arg"), called with the arguments before
        each repeat. It returns a BenchmarkResult in seconds per call. dev
        is accepted for TVM's signature; the function runs on the device
        its arrays are on. With record=True, on a session leased from a
        tracker, each timing is also recorded in the tracker's results
        store (kiln results, the console) under label, visible to every
        user of the fleet with share=True; the result's id is then
        BenchmarkResult.record_id."""
        return TimeEvaluator(
            self.get_function(func_name), number, repeat, min_repeat_ms, limit_zero_time_iterations,
            cooldown_interval_ms, repeats_to_cooldown, cache_flush_bytes, f_preproc,
            record=record, label=label, share=share,
        )

    def __repr__(self) -> str:
        return f"<kiln.runtime.Module {self.name!r} functions={self.functions} on {self.session._where()}>"


def _pack(args: Sequence[Any], keep: list) -> tuple:
    n = len(args)
    vals = (KilnArg * max(n, 1))()
    codes = (ctypes.c_int32 * max(n, 1))()
    for i, a in enumerate(args):
        if isinstance(a, NDArray):
            vals[i].v_handle = a._live()
            codes[i] = _lib.CODE_ARRAY
        elif isinstance(a, bool):
            vals[i].v_int64 = int(a)
            codes[i] = _lib.CODE_INT
        elif isinstance(a, int):
            vals[i].v_int64 = a
            codes[i] = _lib.CODE_INT
        elif isinstance(a, float):
            vals[i].v_float64 = a
            codes[i] = _lib.CODE_FLOAT
        elif a is None:
            codes[i] = _lib.CODE_NULL
        elif isinstance(a, str):
            b = a.encode()
            keep.append(b)
            vals[i].v_str = b
            codes[i] = _lib.CODE_STR
        elif isinstance(a, (bytes, bytearray, memoryview)):
            buf = ctypes.create_string_buffer(bytes(a), len(a) or 1)
            span = _lib.KilnSpan(ctypes.cast(buf, ctypes.c_void_p), len(a))
            keep.extend((buf, span))
            vals[i].v_handle = ctypes.addressof(span)
            codes[i] = _lib.CODE_BYTES
        elif isinstance(a, ShapeTuple):
            dims = (ctypes.c_int64 * max(len(a), 1))(*a)
            span = _lib.KilnSpan(ctypes.cast(dims, ctypes.c_void_p), len(a))
            keep.extend((dims, span))
            vals[i].v_handle = ctypes.addressof(span)
            codes[i] = _lib.CODE_SHAPE
        elif isinstance(a, Function):
            vals[i].v_handle = a._h
            codes[i] = _lib.CODE_FUNC
        else:
            import numpy as np

            if isinstance(a, np.ndarray):
                raise KilnValueError(
                    f"argument {i}: a numpy array; pass kiln.nd.array(x, dev) (a copy on the device) "
                    "or kiln.nd.from_dlpack(x) (shared, local only)"
                )
            if isinstance(a, np.integer):
                vals[i].v_int64 = int(a)
                codes[i] = _lib.CODE_INT
            elif isinstance(a, np.floating):
                vals[i].v_float64 = float(a)
                codes[i] = _lib.CODE_FLOAT
            else:
                raise KilnValueError(f"argument {i}: cannot pass a {type(a).__name__} to a kiln function")
    return vals, codes, n


def _unpack(session: "RPCSession", val: KilnArg, code: int, module: Optional[Module]) -> Any:
    if code == _lib.CODE_NULL:
        return None
    if code == _lib.CODE_INT:
        return val.v_int64
    if code == _lib.CODE_FLOAT:
        return val.v_float64
    if code == _lib.CODE_STR:
        return _lib.take_string(ctypes.c_void_p(val.v_handle))
    if code == _lib.CODE_ARRAY:
        return NDArray(val.v_handle, session)
    if code in (_lib.CODE_BYTES, _lib.CODE_SHAPE):
        h = val.v_handle
        try:
            p, n = ctypes.c_void_p(), ctypes.c_int64()
            _lib.check(lib.kiln_blob_get(h, ctypes.byref(p), ctypes.byref(n)))
            if code == _lib.CODE_SHAPE:
                dims = (ctypes.c_int64 * n.value).from_address(p.value) if n.value else []
                return ShapeTuple(int(d) for d in dims)
            return bytearray(ctypes.string_at(p.value, n.value)) if n.value else bytearray()
        finally:
            _lib.free(h)
    if code == _lib.CODE_FUNC:
        return Function(val.v_handle, module, "<returned>", session)
    if code == _lib.CODE_TUPLE:
        h = val.v_handle
        try:
            n = ctypes.c_int32()
            _lib.check(lib.kiln_tuple_size(h, ctypes.byref(n)))
            out = []
            for i in range(n.value):
                v, c = KilnArg(), ctypes.c_int32()
                _lib.check(lib.kiln_tuple_get(h, i, ctypes.byref(v), ctypes.byref(c)))
                out.append(_unpack(session, v, c.value, module))
            return tuple(out)
        finally:
            _lib.free(h)
    raise KilnValueError(f"result of unknown type code {code}")


_U64 = (1 << 64) - 1
_local = threading.local()


class ShapeTuple(tuple):
    """A shape a remote function returned or takes (TVM's ffi.Shape): a
    tuple of ints that crosses the wire as a shape."""


def _bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


class _Scratch:
    """Per-thread argument buffers for calls (no allocation per call)."""

    def __init__(self, n: int) -> None:
        self.vals = (ctypes.c_uint64 * n)()
        self.codes = (ctypes.c_int32 * n)()
        self.ret = ctypes.c_uint64()
        self.code = ctypes.c_int32()
        self.ret_p = ctypes.addressof(self.ret)
        self.code_p = ctypes.addressof(self.code)


def _scratch(n: int) -> _Scratch:
    sc = getattr(_local, "sc", None)
    if sc is None or len(sc.vals) < n:
        sc = _Scratch(max(n, 16))
        _local.sc = sc
    return sc


class Function(_Object):
    """A function of a module; call it with NDArrays and scalars."""

    def __init__(self, handle: int, module: Optional[Module], name: str, session: Optional["RPCSession"] = None) -> None:
        super().__init__(handle)
        self.module = module
        self.name = name
        self.session = session if session is not None else (module.session if module is not None else None)

    def __call__(self, *args: Any) -> Any:
        n = len(args)
        sc = _scratch(n)
        vals, codes = sc.vals, sc.codes
        keep = None
        for i, a in enumerate(args):
            t = type(a)
            if t is NDArray:
                if a._freed:
                    a._live()
                vals[i] = a._h
                codes[i] = _lib.CODE_ARRAY
            elif t is int:
                vals[i] = a & _U64
                codes[i] = _lib.CODE_INT
            elif t is float:
                vals[i] = _bits(a)
                codes[i] = _lib.CODE_FLOAT
            else:
                # The rare kinds go through the general packer.
                keep = []
                v, c, _ = _pack(args, keep)
                ctypes.memmove(vals, v, 8 * n)
                ctypes.memmove(codes, c, 4 * n)
                break
        rc = lib.kiln_call(self._h, vals, codes, n, 0, sc.ret_p, sc.code_p)
        if rc:
            raise _lib.last_error()
        code = sc.code.value
        if code == _lib.CODE_NULL:
            return None
        ret = KilnArg.from_buffer_copy(sc.ret)
        return _unpack(self.session, ret, code, self.module)

    def time_evaluator(self, number: int = 10, repeat: int = 1, min_repeat_ms: int = 0, **options: Any) -> "TimeEvaluator":
        """See Module.time_evaluator (the same keyword options)."""
        return TimeEvaluator(self, number, repeat, min_repeat_ms, **options)

    def __repr__(self) -> str:
        mod = self.module.name if self.module is not None else "?"
        return f"<kiln.runtime.Function {self.name!r} of {mod!r}>"


class TimeReport:
    """The validity report of a timing, computed on the device next to the
    figures: verdict ("stable" when the median's 95% confidence interval
    is within stable_within of the median, else "noisy") and reason; the
    spread (n samples, cv, min, median, max, the interval ci_low..ci_high
    and its half-width ci_half relative to the median); and machine, the
    device host's state while it ran (a dict: cpus, load_avg,
    freq_min_mhz, freq_max_mhz, governors, temps_c, other_sessions,
    emulated, unread)."""

    def __init__(self, d: dict) -> None:
        self.verdict: str = d.get("verdict", "")
        self.reason: str = d.get("reason", "")
        self.n: int = d.get("n", 0)
        self.cv: float = d.get("cv", math.nan)
        self.min: float = d.get("min", math.nan)
        self.median: float = d.get("median", math.nan)
        self.max: float = d.get("max", math.nan)
        self.ci_low: float = d.get("ci_low", 0.0)
        self.ci_high: float = d.get("ci_high", 0.0)
        self.ci_half: float = d.get("ci_half", 0.0)
        self.stable_within: float = d.get("stable_within", 0.02)
        self.machine: dict = dict(d.get("machine") or {})

    @property
    def stable(self) -> bool:
        """True when the verdict is "stable"."""
        return self.verdict == "stable"

    def __repr__(self) -> str:
        if self.stable:
            return f"stable (median's 95% CI ±{self.ci_half * 100:.1f}% within ±{self.stable_within * 100:g}%, n={self.n}, cv {self.cv * 100:.1f}%)"
        return f"{self.verdict}: {self.reason} (n={self.n}, cv {self.cv * 100:.1f}%)"


class BenchmarkResult:
    """What the time evaluator measured, in seconds per call (TVM's
    BenchmarkResult): results (one per repeat), mean, median, min, max,
    std, and number (calls per measurement); report is the timing's
    TimeReport (None from a device daemon that predates it), with verdict,
    reason and cv also here."""

    def __init__(self, d: dict) -> None:
        self.results: List[float] = list(d.get("results") or [])
        self.mean: float = d.get("mean", math.nan)
        self.median: float = d.get("median", math.nan)
        self.min: float = d.get("min", math.nan)
        self.max: float = d.get("max", math.nan)
        self.std: float = d.get("std", 0.0)
        self.number: int = d.get("number", 0)
        self.device: str = d.get("device", "")
        self.emulated: str = d.get("emulated", "")
        self.report: Optional[TimeReport] = TimeReport(d["report"]) if d.get("report") else None
        # The id of the result in the tracker's results store, when the
        # time evaluator recorded it (record=True).
        self.record_id: str = ""

    @property
    def verdict(self) -> str:
        """The report's verdict: "stable" or "noisy" ("" without a report)."""
        return self.report.verdict if self.report else ""

    @property
    def reason(self) -> str:
        """Why the timing is noisy ("" when stable)."""
        return self.report.reason if self.report else ""

    @property
    def cv(self) -> float:
        """The coefficient of variation of the results (std / mean)."""
        if self.report:
            return self.report.cv
        return self.std / self.mean if self.mean else math.nan

    def __repr__(self) -> str:
        def ms(s: float) -> str:
            return f"{s * 1e3:.4f}"

        text = (
            "Execution time summary:\n"
            f" mean (ms)   median (ms)    max (ms)     min (ms)     std (ms)\n"
            f"  {ms(self.mean):>9}    {ms(self.median):>9}    {ms(self.max):>9}    {ms(self.min):>9}    {ms(self.std):>9}\n"
            f" ({len(self.results)} repeats of {self.number} calls on {self.device})"
        )
        if self.report:
            text += f"\n verdict: {self.report!r}"
        return text


class TimeEvaluator:
    """The callable time_evaluator returns."""

    def __init__(
        self,
        func: Function,
        number: int,
        repeat: int,
        min_repeat_ms: int,
        limit_zero_time_iterations: int = 100,
        cooldown_interval_ms: int = 0,
        repeats_to_cooldown: int = 1,
        cache_flush_bytes: int = 0,
        f_preproc: str = "",
        record: bool = False,
        label: Optional[str] = None,
        share: bool = False,
    ) -> None:
        opts = {
            "number": number, "repeat": repeat, "min_repeat_ms": min_repeat_ms,
            "limit_zero_time_iterations": limit_zero_time_iterations,
            "cooldown_interval_ms": cooldown_interval_ms, "repeats_to_cooldown": repeats_to_cooldown,
            "cache_flush_bytes": cache_flush_bytes,
        }
        for k, v in opts.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise KilnValueError(f"time_evaluator: {k} must be a non-negative integer, got {v!r}")
        if not isinstance(f_preproc, str):
            raise KilnValueError(f"time_evaluator: f_preproc names a global function of the session (a str), got {f_preproc!r}")
        if f_preproc:
            opts["f_preproc"] = f_preproc
        self.func = func
        self.number, self.repeat, self.min_repeat_ms = number, repeat, min_repeat_ms
        self.options = opts
        self.record, self.label, self.share = bool(record), _record.check_label(label), bool(share)
        if self.record and (func.session is None or func.session.is_local):
            raise SessionError(
                "time_evaluator(record=True): timings are recorded in a tracker's results store; time on a session "
                "leased from a tracker (kiln.rpc.connect_tracker(...).request(...))"
            )

    def __call__(self, *args: Any) -> BenchmarkResult:
        keep: list = []
        vals, codes, n = _pack(args, keep)
        out = ctypes.c_void_p()
        _lib.blocking(
            lib.kiln_time_evaluator_options,
            self.func._h, vals, codes, n, json.dumps(self.options).encode(), 0, ctypes.byref(out),
            cancel_at=5,
        )
        d = json.loads(_lib.take_string(out))
        r = BenchmarkResult(d)
        if self.record:
            stored = _record.record_result(self.func.session, self.func.name, d, self.label, self.share, _record.input_shapes(args))
            r.record_id = stored.get("id", "")
        return r

    def __repr__(self) -> str:
        return f"<kiln time_evaluator of {self.func.name!r} number={self.number} repeat={self.repeat} min_repeat_ms={self.min_repeat_ms}>"


def load_module(path: str) -> Module:
    """Loads a module on this machine (TVM's tvm.runtime.load_module): a
    .kiln artifact, or an export_library of one (.so, .tar)."""
    from .rpc import local

    return local().load_module(path)


class SystemLib:
    """TVM's system library as a kiln session has it: kiln links no
    modules into the server, so its functions are the session's global
    functions (``system_lib()["name"]``); one that does not exist raises an
    error that is also an AttributeError, as TVM's does."""

    def __init__(self, session: "RPCSession") -> None:
        self.session = session

    def get_function(self, name: str) -> Function:
        return self.session.get_function(name)

    def __getitem__(self, name: str) -> Function:
        return self.get_function(name)

    def time_evaluator(self, func_name: str, dev: Optional[Device] = None, number: int = 10, repeat: int = 1,
                       min_repeat_ms: int = 0, **options: Any) -> TimeEvaluator:
        return TimeEvaluator(self.get_function(func_name), number, repeat, min_repeat_ms, **options)
