"""Arrays on a device: ``kiln.nd.array``, ``kiln.nd.empty`` and ``NDArray``,
named after TVM's ``tvm.nd``.

An array lives in a session: a remote one (its memory on the device daemon;
``numpy()`` and ``copyfrom()`` copy over the connection) or the local one
(``kiln.local()``, memory in this process, shared with numpy and other
DLPack libraries without a copy).
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib
from ._lib import DLDataType, DLDevice, DLTensor, lib
from .errors import KilnValueError

if TYPE_CHECKING:
    from .rpc import RPCSession

_CODES = {"int": 0, "uint": 1, "float": 2, "bfloat": 4, "bool": 6}
_NAMES = {v: k for k, v in _CODES.items()}
_DEVICE_NAMES = {1: "cpu", 2: "cuda"}


def _dltype(dtype: Any) -> DLDataType:
    """DLPack's dtype for a numpy dtype or a dtype string ("float32")."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name == "bool":
        return DLDataType(6, 8, 1)
    lanes = 1
    base = name
    if "x" in name:
        base, _, l = name.partition("x")
        if not l.isdigit():
            raise KilnValueError(f"dtype {name!r}: lanes {l!r} is not a number")
        lanes = int(l)
    for prefix in ("bfloat", "float", "uint", "int"):
        if base.startswith(prefix) and base[len(prefix):].isdigit():
            return DLDataType(_CODES[prefix], int(base[len(prefix):]), lanes)
    raise KilnValueError(f"dtype {name!r} is not one kiln knows (int8..int64, uint8..uint64, float16/32/64, bfloat16, bool)")


def _dtype_name(t: DLDataType) -> str:
    if t.code == 6:
        name = "bool"
    else:
        name = f"{_NAMES.get(t.code, f'code{t.code}')}{t.bits}"
    return name if t.lanes == 1 else f"{name}x{t.lanes}"


def _numpy_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        raise KilnValueError(f"dtype {name} has no numpy equivalent") from None


class Device:
    """A device of a session: ``remote.cpu(0)``, ``remote.cuda(0)``, or
    ``kiln.cpu(0)`` for this machine's CPU."""

    def __init__(self, session: "RPCSession", device_type: int, device_id: int = 0) -> None:
        self.session = session
        self.device_type = int(device_type)
        self.device_id = int(device_id)

    def _dl(self) -> DLDevice:
        return DLDevice(self.device_type, self.device_id)

    def __repr__(self) -> str:
        name = _DEVICE_NAMES.get(self.device_type, f"type{self.device_type}")
        return f"{name}({self.device_id}) on {self.session._where()}"

    def __str__(self) -> str:
        # TVM's form: "remote[N]:cpu(0)" for a device of a remote session.
        name = _DEVICE_NAMES.get(self.device_type, f"type{self.device_type}")
        if self.session.is_local:
            return f"{name}({self.device_id})"
        return f"remote[{self.session.info.get('id', '')}]:{name}({self.device_id})"

    def sync(self) -> None:
        """Waits until the work queued on the device has finished (TVM's
        Device.sync); the device's session runs the wait."""
        self.session.get_function("runtime.DeviceSync")(self.device_type, self.device_id)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Device)
            and other.session is self.session
            and (other.device_type, other.device_id) == (self.device_type, self.device_id)
        )

    def __hash__(self) -> int:
        return hash((id(self.session), self.device_type, self.device_id))


class NDArray:
    """An array on a device. ``numpy()`` copies it to a numpy array;
    ``copyfrom(x)`` fills it from one. A local array (``kiln.local()``) also
    has ``__array_interface__`` and ``__dlpack__``, so ``np.asarray(a)`` and
    ``torch.from_dlpack(a)`` see its memory without a copy.

    ``free()`` releases the array now (it is also released when collected);
    using it afterwards raises KilnValueError."""

    def __init__(self, handle: int, session: "RPCSession", keep: Any = None) -> None:
        self._h = handle
        self._freed = False
        self._lock = threading.Lock()
        self.session = session
        self._keep = keep  # an object whose memory the array borrows
        shape = (ctypes.c_int64 * 64)()
        ndim = ctypes.c_int32()
        dt = DLDataType()
        dev = DLDevice()
        data = ctypes.c_void_p()
        _lib.check(lib.kiln_array_info(handle, 64, shape, ctypes.byref(ndim), ctypes.byref(dt), ctypes.byref(dev), ctypes.byref(data)))
        self.shape: Tuple[int, ...] = tuple(shape[i] for i in range(ndim.value))
        self.dtype: str = _dtype_name(dt)
        self.device = Device(session, dev.device_type, dev.device_id)
        self._data = data.value  # element zero of a local array, else None

    @property
    def handle(self) -> int:
        """The libkiln handle (for other bindings of the C API)."""
        return self._h

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.size * _numpy_dtype(self.dtype).itemsize

    @property
    def is_local(self) -> bool:
        """Whether the memory is in this process (a local session)."""
        return self._data is not None

    def _live(self) -> int:
        if self._freed:
            raise KilnValueError(f"array handle {self._h} ({self._desc()}) was freed and cannot be used again")
        return self._h

    def _desc(self) -> str:
        return f"shape {self.shape}, {self.dtype}"

    def _host(self, x: np.ndarray) -> Tuple[DLTensor, Any]:
        shape = (ctypes.c_int64 * max(x.ndim, 1))(*x.shape)
        t = DLTensor()
        t.data = x.ctypes.data
        t.device = DLDevice(1, 0)
        t.ndim = x.ndim
        t.dtype = _dltype(x.dtype)
        t.shape = shape
        t.strides = None
        t.byte_offset = 0
        return t, shape

    def copyfrom(self, source: Any) -> "NDArray":
        """Fills the array from a numpy array (or anything np.asarray takes)
        of the same shape and dtype. A non-contiguous source is copied to a
        contiguous one first."""
        h = self._live()
        x = np.asarray(source)
        if x.shape != self.shape or x.dtype != _numpy_dtype(self.dtype):
            raise KilnValueError(f"copyfrom: source is shape {x.shape}, {x.dtype}; the array is {self._desc()}")
        x = np.ascontiguousarray(x)
        t, keep = self._host(x)
        _lib.check(lib.kiln_array_copy_from(h, ctypes.byref(t), 0))
        del keep
        return self

    def copyto(self, target: Any) -> Any:
        """Copies into a numpy array of the same shape and dtype (which must
        be C-contiguous and writable) or another NDArray; returns it."""
        if isinstance(target, NDArray):
            return target.copyfrom(self.numpy())
        h = self._live()
        if not isinstance(target, np.ndarray):
            raise KilnValueError(f"copyto: want a numpy array or an NDArray, got {type(target).__name__}")
        if target.shape != self.shape or target.dtype != _numpy_dtype(self.dtype):
            raise KilnValueError(f"copyto: target is shape {target.shape}, {target.dtype}; the array is {self._desc()}")
        if not target.flags.c_contiguous or not target.flags.writeable:
            raise KilnValueError("copyto: the target numpy array must be C-contiguous and writable")
        t, keep = self._host(target)
        _lib.check(lib.kiln_array_copy_to(h, ctypes.byref(t), 0))
        del keep
        return target

    def numpy(self) -> np.ndarray:
        """A numpy copy of the array."""
        self._live()
        out = np.empty(self.shape, dtype=_numpy_dtype(self.dtype))
        return self.copyto(out)

    def asnumpy(self) -> np.ndarray:
        """TVM's older name of numpy()."""
        return self.numpy()

    @property
    def __array_interface__(self) -> dict:
        """numpy's view of a local array's memory (no copy)."""
        self._live()
        if self._data is None:
            raise AttributeError("__array_interface__: a remote array's memory is not in this process; use .numpy()")
        return {
            "shape": self.shape,
            "typestr": _numpy_dtype(self.dtype).str,
            "data": (self._data, False),
            "version": 3,
        }

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (self.device.device_type, self.device.device_id)

    def __dlpack__(self, stream: Any = None) -> Any:
        """A DLPack capsule sharing a local array's memory."""
        h = self._live()
        p = ctypes.c_void_p()
        _lib.check(lib.kiln_array_to_dlpack(h, ctypes.byref(p)))
        return _capsule(p.value)

    def free(self) -> None:
        """Releases the array now. Calling it again is harmless."""
        with self._lock:
            if self._freed:
                return
            self._freed = True
        _lib.free(self._h)
        self._keep = None

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = " (freed)" if self._freed else ""
        where = "local" if self._data is not None else "remote"
        return f"<kiln.nd.NDArray {where} shape={self.shape} dtype={self.dtype} device={self.device!r}{state}>"

    def __str__(self) -> str:
        if self._freed:
            return repr(self)
        return f"{self.numpy()!s}\n@{self.device!r}"


# DLPack capsules through Python's C API (ctypes.pythonapi).
_capi = ctypes.pythonapi
_capi.PyCapsule_New.restype = ctypes.py_object
_capi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_SetName.restype = ctypes.c_int
_capi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_IsValid.restype = ctypes.c_int
_capi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]

_DLTENSOR = b"dltensor"
_USED = b"used_dltensor"


# The destructor gets the dying capsule's address: these prototypes take it
# as a plain pointer, so no new reference to the capsule is made.
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _capi))
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _capi))


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule: int) -> None:
    # A capsule nobody consumed still owns its tensor: call its deleter.
    if _raw_is_valid(capsule, _DLTENSOR):
        p = _raw_get_pointer(capsule, _DLTENSOR)
        t = ctypes.cast(p, ctypes.POINTER(_lib.DLManagedTensor))
        if t.contents.deleter:
            t.contents.deleter(t)


def _capsule(p: int) -> Any:
    return _capi.PyCapsule_New(p, _DLTENSOR, ctypes.cast(_capsule_destructor, ctypes.c_void_p))


def _default_device(device: Optional[Device]) -> Device:
    if device is None:
        from .rpc import local

        return local().cpu(0)
    if not isinstance(device, Device):
        raise KilnValueError(f"device: want a kiln device (remote.cpu(0), kiln.cpu(0)), got {type(device).__name__}")
    return device


def empty(shape: Union[int, Sequence[int]], dtype: Any = "float32", device: Optional[Device] = None) -> NDArray:
    """An uninitialized array of shape and dtype on device (this machine's
    CPU when None)."""
    dev = _default_device(device)
    if isinstance(shape, int):
        shape = (shape,)
    try:
        dims = [int(d) for d in shape]
    except (TypeError, ValueError):
        raise KilnValueError(f"shape {shape!r}: want a sequence of integers") from None
    arr = (ctypes.c_int64 * max(len(dims), 1))(*dims)
    h = _lib.Handle()
    _lib.check(lib.kiln_array_empty(dev.session._live(), len(dims), arr, _dltype(dtype), dev._dl(), ctypes.byref(h)))
    return NDArray(h.value, dev.session)


def array(source: Any, device: Optional[Device] = None, dtype: Any = None) -> NDArray:
    """A new array on device (this machine's CPU when None) holding a copy of
    source (a numpy array, a list, anything np.asarray takes). A
    non-contiguous numpy array is copied as a contiguous one. For an array
    that shares memory instead, see from_dlpack."""
    if isinstance(source, NDArray):
        source = source.numpy()
    x = np.asarray(source, dtype=dtype)
    a = empty(x.shape, x.dtype, device)
    try:
        a.copyfrom(x)
    except BaseException:
        a.free()
        raise
    return a


def from_dlpack(source: Any) -> NDArray:
    """A local array sharing source's memory, no copy: a numpy array, a
    PyTorch CPU tensor or anything with ``__dlpack__`` (or a DLPack
    capsule). The memory must be CPU memory, C-contiguous; a non-contiguous
    source is refused (make it contiguous first). The source stays alive
    while the array does."""
    from .rpc import local

    keep = source
    if hasattr(source, "__dlpack__"):
        if isinstance(source, np.ndarray) and not source.flags.c_contiguous:
            raise KilnValueError(
                f"from_dlpack: the numpy array (shape {source.shape}, strides {source.strides}) is not C-contiguous; "
                "kernels take compact row-major arrays: pass np.ascontiguousarray(x), or use kiln.nd.array(x) to copy"
            )
        capsule = source.__dlpack__()
    else:
        capsule = source
    if not _capi.PyCapsule_IsValid(ctypes.py_object(capsule), _DLTENSOR):
        raise KilnValueError(f"from_dlpack: want an object with __dlpack__ or an unused DLPack capsule, got {type(source).__name__}")
    p = _capi.PyCapsule_GetPointer(capsule, _DLTENSOR)
    # The array owns the tensor from here on: the capsule must not delete it.
    _capi.PyCapsule_SetName(capsule, _USED)
    h = _lib.Handle()
    _lib.check(lib.kiln_array_from_dlpack(p, ctypes.byref(h)))
    return NDArray(h.value, local(), keep=keep)
