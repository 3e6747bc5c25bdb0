package ndarray

import (
	"fmt"
	"unsafe"

	"github.com/kiln-ml/kiln/devices"
)

// Elem is a Go element type with a matching dtype.
type Elem interface {
	~bool | ~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~float32 | ~float64
}

// DTypeOf returns the dtype of a Go element type.
func DTypeOf[T Elem]() DType {
	var z T
	switch any(z).(type) {
	case bool:
		return BoolT
	case int8:
		return Int8
	case int16:
		return Int16
	case int32:
		return Int32
	case int64:
		return Int64
	case uint8:
		return Uint8
	case uint16:
		return Uint16
	case uint32:
		return Uint32
	case uint64:
		return Uint64
	case float32:
		return Float32
	case float64:
		return Float64
	}
	panic(fmt.Sprintf("ndarray: no dtype for %T", z))
}

func asBytes[T Elem](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}

// FromSlice makes a CPU array of the given shape from a Go slice.
func FromSlice[T Elem](data []T, shape Shape) (*NDArray, error) {
	return FromSliceOn(data, shape, devices.CPUDevice)
}

// FromSliceOn makes an array on dev from a Go slice.
func FromSliceOn[T Elem](data []T, shape Shape, dev devices.Device) (*NDArray, error) {
	if err := shape.Validate(); err != nil {
		return nil, err
	}
	if int64(len(data)) != shape.NumElements() {
		return nil, fmt.Errorf("from slice: %d elements for shape %s (%d elements)", len(data), shape, shape.NumElements())
	}
	return FromBytes(asBytes(data), shape, DTypeOf[T](), dev)
}

// ToSlice copies an array's elements into a new Go slice; the array's dtype
// must match T.
func ToSlice[T Elem](a *NDArray) ([]T, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	if want := DTypeOf[T](); a.dtype != want {
		return nil, fmt.Errorf("to slice: array dtype is %s, slice wants %s", a.dtype, want)
	}
	out := make([]T, a.NumElements())
	return out, a.CopyToBytes(asBytes(out))
}
