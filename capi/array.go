package main

/*
#include <stdlib.h>
#include "support.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
)

// remoteArray is an array in a remote session.
type remoteArray struct {
	r *remoteSession
	a *client.Array
}

func (a *remoteArray) kind() string { return "array" }
func (a *remoteArray) free() {
	if a.r.check() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), freeTimeout)
		a.a.Free(ctx)
		cancel()
	}
}

// localArray is an array in this process: kiln's memory, or memory borrowed
// from a DLPack tensor.
type localArray struct {
	l *localSession // nil for an array wrapped from DLPack
	a *ndarray.NDArray

	mu   sync.Mutex
	refs int // handles and exported DLPack tensors sharing the memory
}

func (a *localArray) kind() string { return "array" }

// free drops one reference; the last one releases the memory.
func (a *localArray) free() {
	a.mu.Lock()
	a.refs--
	last := a.refs == 0
	a.mu.Unlock()
	if last {
		a.a.Release()
	}
}

func (a *localArray) ref() {
	a.mu.Lock()
	a.refs++
	a.mu.Unlock()
}

// exportRef keeps a local array alive for a DLPack tensor made from it.
type exportRef struct{ a *localArray }

func (e *exportRef) kind() string { return "exported array" }
func (e *exportRef) free()        { e.a.free() }

// exports counts DLPack tensors handed out and not yet deleted; they count
// as live handles.
var exports atomic.Int64

func dtypeOf(d C.DLDataType) (ndarray.DType, error) {
	dt := ndarray.DType{Code: ndarray.Code(d.code), Bits: uint8(d.bits), Lanes: uint16(d.lanes)}
	if d.lanes == 0 || d.bits == 0 {
		return dt, badArg("bad dtype (code %d, %d bits, %d lanes)", d.code, d.bits, d.lanes)
	}
	if _, err := ndarray.ParseDType(dt.String()); err != nil {
		return dt, badArg("bad dtype (code %d, %d bits, %d lanes): %v", d.code, d.bits, d.lanes, err)
	}
	return dt, nil
}

func deviceOf(d C.DLDevice) (devices.Device, error) {
	dev := devices.Device{Type: devices.Type(d.device_type), ID: int32(d.device_id)}
	switch dev.Type {
	case devices.CPU, devices.CUDA:
	default:
		return dev, badArg("unknown device type %d (want 1 for cpu, 2 for cuda)", d.device_type)
	}
	if d.device_id < 0 {
		return dev, badArg("negative device id %d", d.device_id)
	}
	return dev, nil
}

func shapeOf(ndim C.int32_t, p *C.int64_t) (ndarray.Shape, error) {
	if ndim < 0 || ndim > 64 {
		return nil, badArg("%d dimensions (want 0 to 64)", ndim)
	}
	if ndim > 0 && p == nil {
		return nil, badArg("no shape given (NULL) for %d dimensions", ndim)
	}
	s := make(ndarray.Shape, ndim)
	if ndim > 0 {
		copy(s, unsafe.Slice((*int64)(unsafe.Pointer(p)), int(ndim)))
	}
	if err := s.Validate(); err != nil {
		return nil, badArg("shape %v: %v", s, err)
	}
	return s, nil
}

//export kiln_array_empty
func kiln_array_empty(h C.KilnHandle, ndim C.int32_t, shape *C.int64_t, dtype C.DLDataType, dev C.DLDevice, out *C.KilnHandle) C.int {
	s, err := lookup[session](h, "session")
	if err != nil {
		return fail(err, errArgument)
	}
	if out == nil {
		return fail(badArg("no place for the array (NULL)"), errArgument)
	}
	sh, err := shapeOf(ndim, shape)
	if err != nil {
		return fail(err, errArgument)
	}
	dt, err := dtypeOf(dtype)
	if err != nil {
		return fail(err, errArgument)
	}
	d, err := deviceOf(dev)
	if err != nil {
		return fail(err, errArgument)
	}
	switch s := s.(type) {
	case *remoteSession:
		if err := s.check(); err != nil {
			return fail(err, errSession)
		}
		a, err := s.s.Empty(context.Background(), sh, dt, d)
		if err != nil {
			return fail(err, errSession)
		}
		*out = newHandle(&remoteArray{r: s, a: a})
	case *localSession:
		if err := s.check(); err != nil {
			return fail(err, errSession)
		}
		if d.Type != devices.CPU {
			return fail(badArg("a local session has only the cpu device, not %s", d), errArgument)
		}
		a, err := ndarray.Empty(sh, dt, d)
		if err != nil {
			return fail(err, errArgument)
		}
		*out = newHandle(&localArray{l: s, a: a, refs: 1})
	}
	return 0
}

// arrayOf looks an array handle up.
func arrayOf(h C.KilnHandle) (object, error) {
	handles.RLock()
	o := handles.m[uint64(h)]
	handles.RUnlock()
	switch o.(type) {
	case *remoteArray, *localArray:
		return o, nil
	}
	return lookup[*remoteArray](h, "array")
}

//export kiln_array_info
func kiln_array_info(h C.KilnHandle, maxNDim C.int32_t, shape *C.int64_t, ndim *C.int32_t, dtype *C.DLDataType, dev *C.DLDevice, data *unsafe.Pointer) C.int {
	o, err := arrayOf(h)
	if err != nil {
		return fail(err, errArgument)
	}
	var sh ndarray.Shape
	var dt ndarray.DType
	var d devices.Device
	var p unsafe.Pointer
	switch a := o.(type) {
	case *remoteArray:
		sh, dt, d = a.a.Shape, a.a.DType, a.a.Device
	case *localArray:
		if a.a.Released() {
			return fail(badArg("array handle %d: its memory was released", h), errArgument)
		}
		sh, dt, d = a.a.Shape(), a.a.DType(), a.a.Device()
		p = a.a.Data().Unsafe()
	}
	if ndim != nil {
		*ndim = C.int32_t(len(sh))
	}
	if shape != nil && len(sh) > 0 {
		n := min(len(sh), int(maxNDim))
		copy(unsafe.Slice((*int64)(unsafe.Pointer(shape)), n), sh[:n])
	}
	if dtype != nil {
		*dtype = C.DLDataType{code: C.uint8_t(dt.Code), bits: C.uint8_t(dt.Bits), lanes: C.uint16_t(dt.Lanes)}
	}
	if dev != nil {
		*dev = C.DLDevice{device_type: C.int32_t(d.Type), device_id: C.int32_t(d.ID)}
	}
	if data != nil {
		*data = p
	}
	return 0
}

// hostBytes checks that t is compact CPU memory holding an array of shape
// and dtype, and returns it as a byte slice (no copy).
func hostBytes(t *C.DLTensor, shape ndarray.Shape, dtype ndarray.DType, what string) ([]byte, error) {
	if t == nil {
		return nil, badArg("%s: no tensor given (NULL)", what)
	}
	if t.device.device_type != C.int32_t(devices.CPU) {
		return nil, badArg("%s: host memory must be on the cpu (device type 1), got device type %d", what, t.device.device_type)
	}
	sh, err := shapeOf(t.ndim, t.shape)
	if err != nil {
		return nil, badArg("%s: %v", what, err)
	}
	dt, err := dtypeOf(t.dtype)
	if err != nil {
		return nil, badArg("%s: %v", what, err)
	}
	if !sh.Equal(shape) || dt != dtype {
		return nil, badArg("%s: host array is %v %s, the array is %v %s", what, sh, dt, shape, dtype)
	}
	if t.strides != nil && sh.NumElements() > 1 {
		want := ndarray.CompactStrides(sh)
		got := unsafe.Slice((*int64)(unsafe.Pointer(t.strides)), len(sh))
		for i := range want {
			if sh[i] != 1 && got[i] != want[i] {
				return nil, badArg("%s: host array with strides %v is not contiguous (compact strides are %v); copy it to a contiguous one first", what, got, want)
			}
		}
	}
	n := sh.NumElements() * int64(dt.Size())
	if n == 0 {
		return nil, nil
	}
	if t.data == nil {
		return nil, badArg("%s: host array has no data (NULL)", what)
	}
	return unsafe.Slice((*byte)(unsafe.Add(t.data, uintptr(t.byte_offset))), n), nil
}

//export kiln_array_copy_from
func kiln_array_copy_from(h C.KilnHandle, src *C.DLTensor, cancel C.KilnHandle) C.int {
	o, err := arrayOf(h)
	if err != nil {
		return fail(err, errArgument)
	}
	ctx, err := contextOf(cancel)
	if err != nil {
		return fail(err, errArgument)
	}
	switch a := o.(type) {
	case *remoteArray:
		b, err := hostBytes(src, a.a.Shape, a.a.DType, "copy to the array")
		if err != nil {
			return fail(err, errArgument)
		}
		if err := a.r.check(); err != nil {
			return fail(err, errSession)
		}
		if _, err := offThread(func() (struct{}, error) { return struct{}{}, a.a.CopyFromBytes(ctx, b) }); err != nil {
			return fail(err, errSession)
		}
	case *localArray:
		b, err := hostBytes(src, a.a.Shape(), a.a.DType(), "copy to the array")
		if err != nil {
			return fail(err, errArgument)
		}
		if err := a.a.CopyFromBytes(b); err != nil {
			return fail(err, errArgument)
		}
	}
	return 0
}

//export kiln_array_copy_to
func kiln_array_copy_to(h C.KilnHandle, dst *C.DLTensor, cancel C.KilnHandle) C.int {
	o, err := arrayOf(h)
	if err != nil {
		return fail(err, errArgument)
	}
	ctx, err := contextOf(cancel)
	if err != nil {
		return fail(err, errArgument)
	}
	switch a := o.(type) {
	case *remoteArray:
		b, err := hostBytes(dst, a.a.Shape, a.a.DType, "copy from the array")
		if err != nil {
			return fail(err, errArgument)
		}
		if err := a.r.check(); err != nil {
			return fail(err, errSession)
		}
		w := &fillBuffer{b: b}
		n, err := offThread(func() (int64, error) { return a.a.CopyTo(ctx, w) })
		if err != nil {
			return fail(err, errSession)
		}
		if n != int64(len(b)) {
			return fail(fmt.Errorf("copy from array: the daemon sent %d bytes, want %d", n, len(b)), errSession)
		}
	case *localArray:
		b, err := hostBytes(dst, a.a.Shape(), a.a.DType(), "copy from the array")
		if err != nil {
			return fail(err, errArgument)
		}
		if err := a.a.CopyToBytes(b); err != nil {
			return fail(err, errArgument)
		}
	}
	return 0
}

// fillBuffer writes into a fixed slice, refusing more than it holds.
type fillBuffer struct {
	b []byte
	n int
}

func (f *fillBuffer) Write(p []byte) (int, error) {
	if len(p) > len(f.b)-f.n {
		return 0, fmt.Errorf("copy from array: the daemon sent more than the %d bytes the array holds", len(f.b))
	}
	f.n += copy(f.b[f.n:], p)
	return len(p), nil
}

//export kiln_array_from_dlpack
func kiln_array_from_dlpack(t *C.DLManagedTensor, out *C.KilnHandle) C.int {
	if t == nil {
		return fail(badArg("from DLPack: no tensor given (NULL)"), errArgument)
	}
	release := func() { C.kiln_dlpack_call_deleter(t) }
	if out == nil {
		release()
		return fail(badArg("no place for the array (NULL)"), errArgument)
	}
	dl := &t.dl_tensor
	fail2 := func(err error) C.int {
		release()
		return fail(fmt.Errorf("from DLPack: %w", err), errArgument)
	}
	if dl.device.device_type != C.int32_t(devices.CPU) {
		return fail2(badArg("tensor is on device type %d; only cpu (1) memory can be shared", dl.device.device_type))
	}
	sh, err := shapeOf(dl.ndim, dl.shape)
	if err != nil {
		return fail2(err)
	}
	dt, err := dtypeOf(dl.dtype)
	if err != nil {
		return fail2(err)
	}
	var strides []int64
	if dl.strides != nil && len(sh) > 0 {
		strides = append(strides, unsafe.Slice((*int64)(unsafe.Pointer(dl.strides)), len(sh))...)
		want := ndarray.CompactStrides(sh)
		for i := range want {
			if sh[i] != 1 && strides[i] != want[i] {
				return fail2(badArg("tensor with shape %v and strides %v is not contiguous (kernels take compact row-major arrays; make a contiguous copy first)", sh, strides))
			}
			if strides[i] < 0 {
				return fail2(badArg("negative strides %v", strides))
			}
		}
		strides = nil
	}
	nbytes := sh.NumElements() * int64(dt.Size())
	ptr := devices.Ptr(uintptr(dl.data) + uintptr(dl.byte_offset))
	if nbytes > 0 && dl.data == nil {
		return fail2(badArg("tensor has no data (NULL)"))
	}
	a, err := ndarray.Borrow(ptr, nbytes, devices.CPUDevice, sh, dt, nil, 0, release)
	if err != nil {
		// Borrow called release.
		return fail(fmt.Errorf("from DLPack: %w", err), errArgument)
	}
	*out = newHandle(&localArray{a: a, refs: 1})
	return 0
}

//export kiln_array_to_dlpack
func kiln_array_to_dlpack(h C.KilnHandle, out **C.DLManagedTensor) C.int {
	o, err := arrayOf(h)
	if err != nil {
		return fail(err, errArgument)
	}
	if out == nil {
		return fail(badArg("no place for the tensor (NULL)"), errArgument)
	}
	a, ok := o.(*localArray)
	if !ok {
		return fail(badArg("to DLPack: array handle %d is on a remote device; copy it to the host (numpy) instead", h), errArgument)
	}
	if a.a.Released() {
		return fail(badArg("to DLPack: array handle %d: its memory was released", h), errArgument)
	}
	sh := a.a.Shape()
	t := C.kiln_dlpack_new(C.int32_t(len(sh)))
	if t == nil {
		return fail(fmt.Errorf("to DLPack: out of memory"), errInternal)
	}
	if len(sh) > 0 {
		copy(unsafe.Slice((*int64)(unsafe.Pointer(t.dl_tensor.shape)), len(sh)), sh)
	}
	dt := a.a.DType()
	t.dl_tensor.data = a.a.Data().Unsafe()
	t.dl_tensor.device = C.DLDevice{device_type: C.int32_t(devices.CPU), device_id: 0}
	t.dl_tensor.dtype = C.DLDataType{code: C.uint8_t(dt.Code), bits: C.uint8_t(dt.Bits), lanes: C.uint16_t(dt.Lanes)}
	a.ref()
	ref := newHandle(&exportRef{a: a})
	exports.Add(1)
	C.kiln_dlpack_set_ctx(t, C.uint64_t(ref))
	*out = t
	return 0
}

// kilnReleaseExport is called by the deleter of an exported DLPack tensor.
//
//export kilnReleaseExport
func kilnReleaseExport(ref C.uint64_t) {
	handles.Lock()
	o, ok := handles.m[uint64(ref)]
	delete(handles.m, uint64(ref))
	handles.Unlock()
	if ok {
		exports.Add(-1)
		o.free()
	}
}
