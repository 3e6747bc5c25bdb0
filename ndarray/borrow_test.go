package ndarray_test

import (
	"encoding/binary"
	"math"
	"testing"
	"unsafe"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

func TestBorrow(t *testing.T) {
	owner, err := ndarray.Zeros(ndarray.Shape{2, 3}, ndarray.Float32, devices.CPUDevice)
	check.NoError(t, err)
	released := 0
	a, err := ndarray.Borrow(owner.Data(), owner.NumBytes(), devices.CPUDevice, ndarray.Shape{2, 3}, ndarray.Float32, nil, 0, func() { released++ })
	check.NoError(t, err)
	// Writes through the borrowed array land in the owner's memory: no copy.
	b := make([]byte, 24)
	binary.LittleEndian.PutUint32(b[4:], math.Float32bits(2.5))
	check.NoError(t, a.CopyFromBytes(b))
	hb, err := owner.HostBytes()
	check.NoError(t, err)
	check.Equal(t, math.Float32frombits(binary.LittleEndian.Uint32(hb[4:])), float32(2.5))
	check.Equal(t, uintptr(a.Data()), uintptr(owner.Data()))

	// A transposed view over the same memory: strides in elements.
	tr, err := ndarray.Borrow(owner.Data(), owner.NumBytes(), devices.CPUDevice, ndarray.Shape{3, 2}, ndarray.Float32, []int64{1, 3}, 0, nil)
	check.NoError(t, err)
	check.Equal(t, tr.IsContiguous(), false)

	check.NoError(t, a.Release())
	check.NoError(t, a.Release())
	check.Equal(t, released, 1)
	check.Equal(t, a.Released(), true)
	_, err = a.Bytes()
	check.ErrorIs(t, err, ndarray.ErrReleased)
	// The owner's memory is untouched by the borrowed array's release.
	_, err = owner.Bytes()
	check.NoError(t, err)
}

func TestBorrowErrors(t *testing.T) {
	var buf [16]byte
	p := devices.Ptr(uintptr(unsafe.Pointer(&buf[0])))
	for name, tc := range map[string]struct {
		ptr     devices.Ptr
		nbytes  int64
		shape   ndarray.Shape
		strides []int64
		want    string
	}{
		"too small":       {p, 16, ndarray.Shape{5}, nil, "needs 20 bytes"},
		"nil pointer":     {0, 16, ndarray.Shape{4}, nil, "nil data pointer"},
		"strides outside": {p, 16, ndarray.Shape{2, 2}, []int64{4, 1}, "reaches outside"},
		"negative size":   {p, -1, ndarray.Shape{1}, nil, "negative size"},
	} {
		t.Run(name, func(t *testing.T) {
			released := false
			_, err := ndarray.Borrow(tc.ptr, tc.nbytes, devices.CPUDevice, tc.shape, ndarray.Float32, tc.strides, 0, func() { released = true })
			check.Error(t, err, tc.want)
			check.Equal(t, released, true, "release called on failure")
		})
	}
}
