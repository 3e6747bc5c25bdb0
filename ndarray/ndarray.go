// Package ndarray owns kiln's tensors: DType, Shape and NDArray (data on a
// device, shape, strides, byte offset), the DLTensor view that C kernels
// receive, and the .npy and safetensors formats.
//
// ndarray imports devices (to allocate and copy through a DeviceAPI) and
// nothing else from kiln. Memory always comes from a DeviceAPI, never from
// the Go heap, so C code may hold a DLTensor for as long as the NDArray
// lives.
package ndarray

/*
#cgo CFLAGS: -I${SRCDIR}/../abi
#include <stdlib.h>
#include <string.h>
#include "kiln_abi.h"

static DLTensor* kiln_dltensor_new(int32_t ndim, int with_strides) {
	size_t n = sizeof(DLTensor) + sizeof(int64_t) * (size_t)ndim * (with_strides ? 2 : 1);
	DLTensor* t = (DLTensor*)calloc(1, n);
	if (t == NULL) return NULL;
	t->ndim = ndim;
	t->shape = (int64_t*)(t + 1);
	t->strides = with_strides ? t->shape + ndim : NULL;
	return t;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/kiln-ml/kiln/devices"
)

// Alignment is the byte alignment of every NDArray allocation.
const Alignment = 64

// ErrReleased reports use of an array whose storage was released.
var ErrReleased = errors.New("ndarray: storage released")

// allocation is the memory behind one or more arrays. It is freed by
// Release on the array that allocated it, or when no array refers to it.
type allocation struct {
	api    devices.DeviceAPI
	dev    devices.Device
	ptr    devices.Ptr
	nbytes int64
	scope  string
	freed  atomic.Bool
	// release, when set, gives borrowed memory back to its owner instead
	// of freeing it through the DeviceAPI (see Borrow).
	release func()
}

func (a *allocation) free() {
	if a.freed.CompareAndSwap(false, true) {
		if a.release != nil {
			a.release()
			return
		}
		_ = a.api.Free(a.dev, a.ptr)
	}
}

// storage is referenced by every array viewing an allocation; when the last
// one is collected, the allocation is freed.
type storage struct{ a *allocation }

// NDArray is a tensor on a device. Its metadata is immutable; the data is
// not. An NDArray is safe to share between goroutines that do not write the
// same elements concurrently.
type NDArray struct {
	st      *storage
	dtype   DType
	shape   Shape
	strides []int64 // in elements; nil when compact row-major
	offset  int64   // bytes from the allocation's start
	dl      *C.DLTensor
	owner   bool
}

type dlBox struct{ p *C.DLTensor }

// byteSize is the storage an array of shape and dtype needs, or an error
// when that does not fit in an int64.
func byteSize(shape Shape, dtype DType) (int64, error) {
	n, sz := shape.NumElements(), int64(dtype.Size())
	if sz > 0 && n > math.MaxInt64/sz {
		return 0, fmt.Errorf("shape %s of %s needs more than %d bytes", shape, dtype, int64(math.MaxInt64))
	}
	return n * sz, nil
}

func freeDL(b dlBox) { C.free(unsafe.Pointer(b.p)) }

// Empty allocates an uninitialized array on dev in the default memory scope.
func Empty(shape Shape, dtype DType, dev devices.Device) (*NDArray, error) {
	return EmptyScoped(shape, dtype, dev, "")
}

// EmptyScoped allocates an uninitialized array in a memory scope.
func EmptyScoped(shape Shape, dtype DType, dev devices.Device, scope string) (*NDArray, error) {
	if err := shape.Validate(); err != nil {
		return nil, err
	}
	if !dtype.valid() || dtype.Lanes == 0 {
		return nil, fmt.Errorf("%w %s", ErrBadDType, dtype)
	}
	api, err := devices.For(dev)
	if err != nil {
		return nil, err
	}
	nbytes, err := byteSize(shape, dtype)
	if err != nil {
		return nil, err
	}
	ptr, err := api.Alloc(dev, max(nbytes, 1), Alignment, scope)
	if err != nil {
		return nil, fmt.Errorf("allocate %s %s on %s: %w", shape, dtype, dev, err)
	}
	a := &allocation{api: api, dev: dev, ptr: ptr, nbytes: nbytes, scope: scope}
	st := &storage{a: a}
	runtime.AddCleanup(st, (*allocation).free, a)
	arr, err := newView(st, shape, dtype, nil, 0)
	if err != nil {
		a.free()
		return nil, err
	}
	arr.owner = true
	return arr, nil
}

// Borrow makes an array over memory kiln did not allocate (a DLPack tensor
// from another library, a numpy buffer): nbytes at ptr on dev, viewed with
// shape, dtype, strides (in elements; nil when compact row-major) and a byte
// offset. No copy is made. release is called once, when the array is
// Released or collected, to give the memory back to its owner; it is also
// called when Borrow fails, so the memory is the array's from the call on.
// Every addressed element must lie inside the nbytes.
func Borrow(ptr devices.Ptr, nbytes int64, dev devices.Device, shape Shape, dtype DType, strides []int64, byteOffset int64, release func()) (*NDArray, error) {
	if release == nil {
		release = func() {}
	}
	if ptr == 0 && nbytes > 0 {
		release()
		return nil, errors.New("borrow: nil data pointer")
	}
	if nbytes < 0 {
		release()
		return nil, fmt.Errorf("borrow: negative size %d", nbytes)
	}
	api, err := devices.For(dev)
	if err != nil {
		release()
		return nil, err
	}
	a := &allocation{api: api, dev: dev, ptr: ptr, nbytes: nbytes, release: release}
	st := &storage{a: a}
	runtime.AddCleanup(st, (*allocation).free, a)
	whole := &NDArray{st: st}
	var arr *NDArray
	if strides == nil && byteOffset == 0 {
		arr, err = whole.View(shape, dtype)
	} else {
		if strides == nil {
			strides = CompactStrides(shape)
		}
		arr, err = whole.StridedView(shape, dtype, strides, byteOffset)
	}
	if err != nil {
		a.free()
		return nil, fmt.Errorf("borrow: %w", err)
	}
	arr.owner = true
	return arr, nil
}

// Zeros allocates an array filled with zero bytes.
func Zeros(shape Shape, dtype DType, dev devices.Device) (*NDArray, error) {
	a, err := Empty(shape, dtype, dev)
	if err != nil {
		return nil, err
	}
	if err := a.CopyFromBytes(make([]byte, a.NumBytes())); err != nil {
		return nil, err
	}
	return a, nil
}

func newView(st *storage, shape Shape, dtype DType, strides []int64, offset int64) (*NDArray, error) {
	if len(shape) > 1<<16 {
		return nil, fmt.Errorf("shape with %d dimensions is too many", len(shape))
	}
	dl := C.kiln_dltensor_new(C.int32_t(len(shape)), boolInt(strides != nil))
	if dl == nil {
		return nil, errors.New("ndarray: out of memory for a DLTensor")
	}
	arr := &NDArray{st: st, dtype: dtype, shape: shape.Clone(), offset: offset, dl: dl}
	if strides != nil {
		arr.strides = append([]int64(nil), strides...)
	}
	runtime.AddCleanup(arr, freeDL, dlBox{dl})
	dl.data = st.a.ptr.Unsafe()
	dl.device = C.DLDevice{device_type: C.int32_t(st.a.dev.Type), device_id: C.int32_t(st.a.dev.ID)}
	dl.dtype = C.DLDataType{code: C.uint8_t(dtype.Code), bits: C.uint8_t(dtype.Bits), lanes: C.uint16_t(dtype.Lanes)}
	dl.byte_offset = C.uint64_t(offset)
	if len(shape) > 0 {
		sh := unsafe.Slice((*int64)(unsafe.Pointer(dl.shape)), len(shape))
		copy(sh, shape)
		if strides != nil {
			copy(unsafe.Slice((*int64)(unsafe.Pointer(dl.strides)), len(shape)), strides)
		}
	}
	return arr, nil
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// DType is the element type.
func (a *NDArray) DType() DType { return a.dtype }

// Shape is the array's shape; callers must not modify it.
func (a *NDArray) Shape() Shape { return a.shape }

// NDim is the number of dimensions.
func (a *NDArray) NDim() int { return len(a.shape) }

// Device is where the data lives.
func (a *NDArray) Device() devices.Device { return a.st.a.dev }

// Scope is the memory scope the storage was allocated in.
func (a *NDArray) Scope() string { return a.st.a.scope }

// Strides are the strides in elements (row-major compact ones when the
// array has none of its own).
func (a *NDArray) Strides() []int64 {
	if a.strides == nil {
		return CompactStrides(a.shape)
	}
	return append([]int64(nil), a.strides...)
}

// ByteOffset is the offset of element zero from the start of the storage.
func (a *NDArray) ByteOffset() int64 { return a.offset }

// NumElements is the number of elements.
func (a *NDArray) NumElements() int64 { return a.shape.NumElements() }

// NumBytes is the number of bytes the elements occupy when compact.
func (a *NDArray) NumBytes() int64 { return a.NumElements() * int64(a.dtype.Size()) }

// IsContiguous reports whether the elements are compact and row-major.
func (a *NDArray) IsContiguous() bool {
	if a.strides == nil {
		return true
	}
	want := CompactStrides(a.shape)
	for i := range want {
		if a.shape[i] != 1 && a.strides[i] != want[i] {
			return false
		}
	}
	return true
}

// Data is the address of element zero (storage start plus byte offset).
func (a *NDArray) Data() devices.Ptr { return a.st.a.ptr + devices.Ptr(a.offset) }

// DLTensor returns the C DLTensor describing the array. It stays valid while
// the array is reachable; callers passing it to C keep the array alive
// (runtime.KeepAlive) until the call returns.
func (a *NDArray) DLTensor() unsafe.Pointer { return unsafe.Pointer(a.dl) }

// Released reports whether the storage has been freed.
func (a *NDArray) Released() bool { return a.st.a.freed.Load() }

// Release frees the storage now instead of waiting for the garbage
// collector. It may only be called on an array returned by Empty (not a
// view); views of it become unusable. Calling it twice is harmless.
func (a *NDArray) Release() error {
	if !a.owner {
		return errors.New("ndarray: Release on a view; release the array that owns the storage")
	}
	a.st.a.free()
	return nil
}

func (a *NDArray) check() error {
	if a == nil {
		return errors.New("ndarray: nil array")
	}
	if a.st.a.freed.Load() {
		return ErrReleased
	}
	return nil
}

func (a *NDArray) checkContiguous(op string) error {
	if err := a.check(); err != nil {
		return err
	}
	if !a.IsContiguous() {
		return fmt.Errorf("%s: array with shape %s and strides %v is not contiguous", op, a.shape, a.strides)
	}
	return nil
}

// View returns an array of another shape and dtype over the same storage,
// starting at the same element. It must not reach past the storage.
func (a *NDArray) View(shape Shape, dtype DType) (*NDArray, error) {
	if err := a.checkContiguous("view"); err != nil {
		return nil, err
	}
	if err := shape.Validate(); err != nil {
		return nil, err
	}
	if !dtype.valid() || dtype.Lanes == 0 {
		return nil, fmt.Errorf("view: %w %s", ErrBadDType, dtype)
	}
	need, err := byteSize(shape, dtype)
	if err != nil {
		return nil, err
	}
	if need > a.st.a.nbytes-a.offset {
		return nil, fmt.Errorf("view %s %s needs %d bytes, storage has %d from offset %d", shape, dtype, need, a.st.a.nbytes-a.offset, a.offset)
	}
	return newView(a.st, shape, dtype, nil, a.offset)
}

// StridedView returns a view with explicit strides (in elements) and byte
// offset from the storage's start; every addressed element must lie inside
// the storage.
func (a *NDArray) StridedView(shape Shape, dtype DType, strides []int64, byteOffset int64) (*NDArray, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	if err := shape.Validate(); err != nil {
		return nil, err
	}
	if len(strides) != len(shape) {
		return nil, fmt.Errorf("strided view: %d strides for %d dimensions", len(strides), len(shape))
	}
	if byteOffset < 0 {
		return nil, fmt.Errorf("strided view: negative byte offset %d", byteOffset)
	}
	if !dtype.valid() || dtype.Lanes == 0 {
		return nil, fmt.Errorf("strided view: %w %s", ErrBadDType, dtype)
	}
	if shape.NumElements() > 0 {
		// Work in big integers: hostile strides must not wrap around.
		lo, hi := new(big.Int), new(big.Int)
		for i, s := range strides {
			ext := new(big.Int).Mul(big.NewInt(shape[i]-1), big.NewInt(s))
			if ext.Sign() < 0 {
				lo.Add(lo, ext)
			} else {
				hi.Add(hi, ext)
			}
		}
		es := big.NewInt(int64(dtype.Size()))
		off := big.NewInt(byteOffset)
		first := new(big.Int).Add(off, new(big.Int).Mul(lo, es))
		end := new(big.Int).Add(off, new(big.Int).Mul(new(big.Int).Add(hi, big.NewInt(1)), es))
		if first.Sign() < 0 || end.Cmp(big.NewInt(a.st.a.nbytes)) > 0 {
			return nil, fmt.Errorf("strided view: shape %s strides %v at offset %d reaches outside %d bytes of storage", shape, strides, byteOffset, a.st.a.nbytes)
		}
	}
	return newView(a.st, shape, dtype, strides, byteOffset)
}

// CopyFromBytes fills the array from host bytes laid out compactly.
func (a *NDArray) CopyFromBytes(b []byte) error {
	if err := a.checkContiguous("copy from bytes"); err != nil {
		return err
	}
	if int64(len(b)) != a.NumBytes() {
		return fmt.Errorf("copy from bytes: got %d bytes, array %s %s holds %d", len(b), a.shape, a.dtype, a.NumBytes())
	}
	if len(b) == 0 {
		return nil
	}
	return a.st.a.api.CopyFromHost(a.Data(), a.Device(), b, 0)
}

// CopyToBytes copies the array's elements into host bytes.
func (a *NDArray) CopyToBytes(b []byte) error {
	if err := a.checkContiguous("copy to bytes"); err != nil {
		return err
	}
	if int64(len(b)) != a.NumBytes() {
		return fmt.Errorf("copy to bytes: got %d bytes, array %s %s holds %d", len(b), a.shape, a.dtype, a.NumBytes())
	}
	if len(b) == 0 {
		return nil
	}
	return a.st.a.api.CopyToHost(b, a.Data(), a.Device(), 0)
}

// Bytes returns a copy of the elements as host bytes.
func (a *NDArray) Bytes() ([]byte, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	b := make([]byte, a.NumBytes())
	return b, a.CopyToBytes(b)
}

// HostBytes returns the elements of a contiguous CPU array as a byte slice
// aliasing its storage (no copy). The slice is valid while the array is.
func (a *NDArray) HostBytes() ([]byte, error) {
	if err := a.checkContiguous("host bytes"); err != nil {
		return nil, err
	}
	if a.Device().Type != devices.CPU {
		return nil, fmt.Errorf("host bytes: array is on %s, not the CPU", a.Device())
	}
	return a.Data().HostBytes(a.NumBytes()), nil
}

// CopyFrom copies src's elements into a, across devices if needed. Shapes
// and dtypes must match.
func (a *NDArray) CopyFrom(src *NDArray) error {
	if err := a.checkContiguous("copy"); err != nil {
		return err
	}
	if err := src.checkContiguous("copy"); err != nil {
		return err
	}
	if !a.shape.Equal(src.shape) || a.dtype != src.dtype {
		return fmt.Errorf("copy: source is %s %s, destination %s %s", src.shape, src.dtype, a.shape, a.dtype)
	}
	if a.NumBytes() == 0 {
		return nil
	}
	err := devices.CopyBetween(a.Data(), a.Device(), src.Data(), src.Device(), a.NumBytes(), 0)
	runtime.KeepAlive(src)
	runtime.KeepAlive(a)
	return err
}

// CopyTo returns a copy of the array on dev.
func (a *NDArray) CopyTo(dev devices.Device) (*NDArray, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	out, err := Empty(a.shape, a.dtype, dev)
	if err != nil {
		return nil, err
	}
	return out, out.CopyFrom(a)
}

// FromBytes makes an array on dev from compact host bytes.
func FromBytes(b []byte, shape Shape, dtype DType, dev devices.Device) (*NDArray, error) {
	a, err := Empty(shape, dtype, dev)
	if err != nil {
		return nil, err
	}
	if err := a.CopyFromBytes(b); err != nil {
		return nil, err
	}
	return a, nil
}

// String describes the array without its data.
func (a *NDArray) String() string {
	return fmt.Sprintf("NDArray(%s, %s, %s)", a.shape, a.dtype, a.Device())
}
