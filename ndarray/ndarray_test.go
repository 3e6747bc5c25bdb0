package ndarray_test

import (
	"testing"

	"github.com/kiln-ml/kiln/devices"
	_ "github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

func TestParseDType(t *testing.T) {
	tests := []struct {
		in   string
		want ndarray.DType
	}{
		{"bool", ndarray.BoolT},
		{"int8", ndarray.Int8},
		{"int16", ndarray.Int16},
		{"int32", ndarray.Int32},
		{"int64", ndarray.Int64},
		{"uint8", ndarray.Uint8},
		{"uint16", ndarray.Uint16},
		{"uint32", ndarray.Uint32},
		{"uint64", ndarray.Uint64},
		{"float16", ndarray.Float16},
		{"bfloat16", ndarray.BFloat16},
		{"float32", ndarray.Float32},
		{"float64", ndarray.Float64},
		{"float32x4", ndarray.DType{Code: ndarray.Float, Bits: 32, Lanes: 4}},
		{"int8x16", ndarray.DType{Code: ndarray.Int, Bits: 8, Lanes: 16}},
		{"boolx2", ndarray.DType{Code: ndarray.Bool, Bits: 8, Lanes: 2}},
		{"uint1", ndarray.DType{Code: ndarray.UInt, Bits: 1, Lanes: 1}},
		{"handle", ndarray.DType{Code: ndarray.Handle, Bits: 64, Lanes: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ndarray.ParseDType(tt.in)
			check.NoError(t, err)
			check.Equal(t, got, tt.want)
			check.Equal(t, got.String(), tt.in, "print")
			check.Equal(t, ndarray.MustParseDType(tt.in), tt.want)
		})
	}
}

func TestParseDTypeErrors(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{"float8", "float has no 8-bit type"},
		{"int7", "int has no 7-bit type"},
		{"int1", "int has no 1-bit type"},
		{"bfloat32", "bfloat has no 32-bit type"},
		{"floatx", `bad lane count ""`},
		{"float32x0", `bad lane count "0"`},
		{"float32x70000", `bad lane count "70000"`},
		{"float", `bad bit width ""`},
		{"complex64", `"complex64"`},
		{"", `""`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			_, err := ndarray.ParseDType(tt.in)
			check.ErrorIs(t, err, ndarray.ErrBadDType)
			check.Error(t, err, tt.want)
		})
	}
}

func TestDTypeSize(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"bool", 1}, {"int8", 1}, {"uint16", 2}, {"float16", 2}, {"bfloat16", 2},
		{"int32", 4}, {"float64", 8}, {"float32x4", 16}, {"uint1", 1}, {"uint1x8", 1}, {"uint1x9", 2},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			check.Equal(t, ndarray.MustParseDType(tt.in).Size(), tt.want)
		})
	}
}

func TestShape(t *testing.T) {
	tests := []struct {
		name     string
		shape    ndarray.Shape
		elems    int64
		str      string
		strides  []int64
		validErr string
	}{
		{"scalar", ndarray.Shape{}, 1, "()", []int64{}, ""},
		{"vector", ndarray.Shape{3}, 3, "(3,)", []int64{1}, ""},
		{"matrix", ndarray.Shape{2, 3}, 6, "(2, 3)", []int64{3, 1}, ""},
		{"empty", ndarray.Shape{0, 5}, 0, "(0, 5)", []int64{5, 1}, ""},
		{"4d", ndarray.Shape{2, 3, 4, 5}, 120, "(2, 3, 4, 5)", []int64{60, 20, 5, 1}, ""},
		{"negative", ndarray.Shape{2, -1}, -2, "(2, -1)", []int64{-1, 1}, "dimension 1 is negative"},
		{"overflow", ndarray.Shape{1 << 40, 1 << 40}, 0, "", nil, "too many elements"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.shape.Validate()
			if tt.validErr != "" {
				check.Error(t, err, tt.validErr)
				return
			}
			check.NoError(t, err)
			check.Equal(t, tt.shape.NumElements(), tt.elems)
			check.Equal(t, tt.shape.String(), tt.str)
			check.Equal(t, ndarray.CompactStrides(tt.shape), tt.strides)
			c := tt.shape.Clone()
			check.True(t, c.Equal(tt.shape), "clone equals")
			if len(c) > 0 {
				c[0]++
				check.True(t, !c.Equal(tt.shape), "clone shares no storage")
			}
			check.True(t, !tt.shape.Equal(append(tt.shape.Clone(), 1)), "rank differs")
		})
	}
}

func TestEmptyFromSliceToSlice(t *testing.T) {
	t.Run("float32", func(t *testing.T) {
		a, err := ndarray.FromSlice([]float32{1, 2, 3, 4, 5, 6}, ndarray.Shape{2, 3})
		check.NoError(t, err)
		check.Equal(t, a.DType(), ndarray.Float32)
		check.Equal(t, a.Shape(), ndarray.Shape{2, 3})
		check.Equal(t, a.NDim(), 2)
		check.Equal(t, a.NumBytes(), int64(24))
		check.True(t, a.IsContiguous(), "contiguous")
		got, err := ndarray.ToSlice[float32](a)
		check.NoError(t, err)
		check.Equal(t, got, []float32{1, 2, 3, 4, 5, 6})
	})
	t.Run("bool", func(t *testing.T) {
		a, err := ndarray.FromSlice([]bool{true, false, true}, ndarray.Shape{3})
		check.NoError(t, err)
		b, err := a.Bytes()
		check.NoError(t, err)
		check.Equal(t, b, []byte{1, 0, 1})
	})
	t.Run("empty", func(t *testing.T) {
		a, err := ndarray.Empty(ndarray.Shape{0, 4}, ndarray.Int64, devices.CPUDevice)
		check.NoError(t, err)
		check.Equal(t, a.NumElements(), int64(0))
		got, err := ndarray.ToSlice[int64](a)
		check.NoError(t, err)
		check.Equal(t, got, []int64{})
	})
	t.Run("zeros", func(t *testing.T) {
		a, err := ndarray.Zeros(ndarray.Shape{3}, ndarray.Uint16, devices.CPUDevice)
		check.NoError(t, err)
		got, err := ndarray.ToSlice[uint16](a)
		check.NoError(t, err)
		check.Equal(t, got, []uint16{0, 0, 0})
	})
	t.Run("from bytes", func(t *testing.T) {
		a, err := ndarray.FromBytes([]byte{1, 0, 2, 0}, ndarray.Shape{2}, ndarray.Int16, devices.CPUDevice)
		check.NoError(t, err)
		got, err := ndarray.ToSlice[int16](a)
		check.NoError(t, err)
		check.Equal(t, got, []int16{1, 2})
	})
}

func TestConstructorErrors(t *testing.T) {
	tests := []struct {
		name string
		fn   func() error
		want []string
	}{
		{"negative shape", func() error {
			_, err := ndarray.Empty(ndarray.Shape{-1}, ndarray.Float32, devices.CPUDevice)
			return err
		}, []string{"negative"}},
		{"bad dtype", func() error {
			_, err := ndarray.Empty(ndarray.Shape{1}, ndarray.DType{Code: ndarray.Float, Bits: 8, Lanes: 1}, devices.CPUDevice)
			return err
		}, []string{"unknown dtype"}},
		{"no such device", func() error {
			_, err := ndarray.Empty(ndarray.Shape{1}, ndarray.Float32, devices.Device{Type: devices.CPU, ID: 3})
			return err
		}, []string{"no such device"}},
		{"bad scope", func() error {
			_, err := ndarray.EmptyScoped(ndarray.Shape{1}, ndarray.Float32, devices.CPUDevice, "shared")
			return err
		}, []string{"unknown memory scope"}},
		{"slice length", func() error {
			_, err := ndarray.FromSlice([]int32{1, 2, 3}, ndarray.Shape{2, 2})
			return err
		}, []string{"3 elements for shape (2, 2)"}},
		{"bytes length", func() error {
			_, err := ndarray.FromBytes([]byte{1, 2, 3}, ndarray.Shape{1}, ndarray.Float32, devices.CPUDevice)
			return err
		}, []string{"got 3 bytes", "holds 4"}},
		{"to slice dtype", func() error {
			a, err := ndarray.FromSlice([]int32{1}, ndarray.Shape{1})
			if err != nil {
				return err
			}
			_, err = ndarray.ToSlice[float32](a)
			return err
		}, []string{"array dtype is int32, slice wants float32"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check.Error(t, tt.fn(), tt.want...)
		})
	}
}

func TestView(t *testing.T) {
	a, err := ndarray.FromSlice([]float32{0, 1, 2, 3, 4, 5}, ndarray.Shape{2, 3})
	check.NoError(t, err)

	v, err := a.View(ndarray.Shape{6}, ndarray.Float32)
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](v)
	check.NoError(t, err)
	check.Equal(t, got, []float32{0, 1, 2, 3, 4, 5})

	u, err := a.View(ndarray.Shape{24}, ndarray.Uint8)
	check.NoError(t, err)
	check.Equal(t, u.NumBytes(), int64(24))

	tests := []struct {
		name  string
		shape ndarray.Shape
		dtype ndarray.DType
		want  []string
	}{
		{"too many elements", ndarray.Shape{7}, ndarray.Float32, []string{"needs 28 bytes", "storage has 24"}},
		{"wider dtype", ndarray.Shape{6}, ndarray.Float64, []string{"needs 48 bytes"}},
		{"negative", ndarray.Shape{-1}, ndarray.Float32, []string{"negative"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := a.View(tt.shape, tt.dtype)
			check.Error(t, err, tt.want...)
		})
	}

	t.Run("not contiguous", func(t *testing.T) {
		tr, err := a.StridedView(ndarray.Shape{3, 2}, ndarray.Float32, []int64{1, 3}, 0)
		check.NoError(t, err)
		check.True(t, !tr.IsContiguous(), "transpose is not contiguous")
		_, err = tr.View(ndarray.Shape{6}, ndarray.Float32)
		check.Error(t, err, "not contiguous")
		_, err = tr.Bytes()
		check.Error(t, err, "not contiguous")
	})
}

func TestStridedView(t *testing.T) {
	a, err := ndarray.FromSlice([]int32{0, 1, 2, 3, 4, 5}, ndarray.Shape{2, 3})
	check.NoError(t, err)

	tests := []struct {
		name    string
		shape   ndarray.Shape
		strides []int64
		offset  int64
		want    []string // empty: no error
	}{
		{"transpose", ndarray.Shape{3, 2}, []int64{1, 3}, 0, nil},
		{"last column", ndarray.Shape{2}, []int64{3}, 8, nil},
		{"reversed", ndarray.Shape{6}, []int64{-1}, 20, nil},
		{"broadcast", ndarray.Shape{4, 3}, []int64{0, 1}, 0, nil},
		{"empty anywhere", ndarray.Shape{0, 3}, []int64{100, 100}, 0, nil},
		{"past the end", ndarray.Shape{2, 3}, []int64{3, 1}, 4, []string{"reaches outside 24 bytes"}},
		{"stride too big", ndarray.Shape{3}, []int64{3}, 0, []string{"reaches outside"}},
		{"before the start", ndarray.Shape{2}, []int64{-1}, 0, []string{"reaches outside"}},
		{"negative offset", ndarray.Shape{1}, []int64{1}, -4, []string{"negative byte offset -4"}},
		{"stride count", ndarray.Shape{2, 3}, []int64{1}, 0, []string{"1 strides for 2 dimensions"}},
		{"negative shape", ndarray.Shape{-2}, []int64{1}, 0, []string{"negative"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := a.StridedView(tt.shape, ndarray.Int32, tt.strides, tt.offset)
			if tt.want != nil {
				check.Error(t, err, tt.want...)
				return
			}
			check.NoError(t, err)
			check.Equal(t, v.Shape(), tt.shape)
			check.Equal(t, v.Strides(), tt.strides)
			check.Equal(t, v.ByteOffset(), tt.offset)
		})
	}
}

func TestCopyFrom(t *testing.T) {
	src, err := ndarray.FromSlice([]float32{1, 2, 3, 4, 5, 6}, ndarray.Shape{2, 3})
	check.NoError(t, err)

	t.Run("same shape", func(t *testing.T) {
		dst, err := ndarray.Empty(ndarray.Shape{2, 3}, ndarray.Float32, devices.CPUDevice)
		check.NoError(t, err)
		check.NoError(t, dst.CopyFrom(src))
		got, err := ndarray.ToSlice[float32](dst)
		check.NoError(t, err)
		check.Equal(t, got, []float32{1, 2, 3, 4, 5, 6})
	})
	t.Run("copy to", func(t *testing.T) {
		dst, err := src.CopyTo(devices.CPUDevice)
		check.NoError(t, err)
		got, err := ndarray.ToSlice[float32](dst)
		check.NoError(t, err)
		check.Equal(t, got, []float32{1, 2, 3, 4, 5, 6})
	})

	tests := []struct {
		name  string
		shape ndarray.Shape
		dtype ndarray.DType
		want  string
	}{
		{"transposed shape", ndarray.Shape{3, 2}, ndarray.Float32, "source is (2, 3) float32, destination (3, 2) float32"},
		{"same count", ndarray.Shape{6}, ndarray.Float32, "destination (6,) float32"},
		{"dtype", ndarray.Shape{2, 3}, ndarray.Int32, "destination (2, 3) int32"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst, err := ndarray.Empty(tt.shape, tt.dtype, devices.CPUDevice)
			check.NoError(t, err)
			check.Error(t, dst.CopyFrom(src), tt.want)
		})
	}
}

func TestRelease(t *testing.T) {
	a, err := ndarray.FromSlice([]int64{1, 2, 3}, ndarray.Shape{3})
	check.NoError(t, err)
	v, err := a.View(ndarray.Shape{3}, ndarray.Int64)
	check.NoError(t, err)
	check.Error(t, v.Release(), "Release on a view")

	check.NoError(t, a.Release())
	check.True(t, a.Released(), "released")
	check.True(t, v.Released(), "view sees the release")
	check.NoError(t, a.Release(), "second release")

	other, err := ndarray.FromSlice([]int64{1, 2, 3}, ndarray.Shape{3})
	check.NoError(t, err)

	uses := []struct {
		name string
		fn   func() error
	}{
		{"bytes", func() error { _, err := a.Bytes(); return err }},
		{"to slice", func() error { _, err := ndarray.ToSlice[int64](a); return err }},
		{"copy from bytes", func() error { return a.CopyFromBytes(make([]byte, 24)) }},
		{"copy to bytes", func() error { return a.CopyToBytes(make([]byte, 24)) }},
		{"host bytes", func() error { _, err := a.HostBytes(); return err }},
		{"view", func() error { _, err := a.View(ndarray.Shape{3}, ndarray.Int64); return err }},
		{"strided view", func() error { _, err := a.StridedView(ndarray.Shape{3}, ndarray.Int64, []int64{1}, 0); return err }},
		{"copy into", func() error { return a.CopyFrom(other) }},
		{"copy out of", func() error { return other.CopyFrom(a) }},
		{"copy to", func() error { _, err := a.CopyTo(devices.CPUDevice); return err }},
		{"view of released", func() error { _, err := v.Bytes(); return err }},
	}
	for _, u := range uses {
		t.Run(u.name, func(t *testing.T) {
			check.ErrorIs(t, u.fn(), ndarray.ErrReleased)
		})
	}
}

func TestViewOverflow(t *testing.T) {
	a, err := ndarray.Empty(ndarray.Shape{16}, ndarray.Float32, devices.Device{Type: devices.CPU})
	check.NoError(t, err)
	_, err = a.View(ndarray.Shape{1 << 40, 1 << 40}, ndarray.Float32)
	check.Error(t, err, "too many elements")
	_, err = a.View(ndarray.Shape{1 << 30, 1 << 30}, ndarray.Float32)
	check.Error(t, err)
	_, err = a.StridedView(ndarray.Shape{2, 2}, ndarray.Float32, []int64{1 << 62, -(1 << 62)}, 0)
	check.Error(t, err, "outside")
	_, err = a.StridedView(ndarray.Shape{2}, ndarray.Float32, []int64{1}, 1<<62)
	check.Error(t, err, "outside")
	if got := (ndarray.Shape{}).Clone(); got == nil {
		t.Fatal("ndarray.Shape{}.Clone() is nil")
	}
}
