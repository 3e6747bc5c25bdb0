package ndarray_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/devices"
	_ "github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// le encodes values as little-endian bytes, the layout every array in
// these tests has.
func le(t testing.TB, vals any) []byte {
	t.Helper()
	var b bytes.Buffer
	check.NoError(t, binary.Write(&b, binary.LittleEndian, vals))
	return b.Bytes()
}

// stream hides Len and Seek, so ReadNPY reads it as a stream of unknown
// length.
type stream struct{ io.Reader }

// allDTypes is every dtype kiln writes to both formats.
var allDTypes = []ndarray.DType{
	ndarray.BoolT, ndarray.Int8, ndarray.Int16, ndarray.Int32, ndarray.Int64,
	ndarray.Uint8, ndarray.Uint16, ndarray.Uint32, ndarray.Uint64,
	ndarray.Float16, ndarray.BFloat16, ndarray.Float32, ndarray.Float64,
}

// pattern makes an array whose bytes are a deterministic pattern (0 or 1
// for bool).
func pattern(t testing.TB, shape ndarray.Shape, dt ndarray.DType, seed byte) (*ndarray.NDArray, []byte) {
	t.Helper()
	n := shape.NumElements() * int64(dt.Size())
	b := make([]byte, n)
	for i := range b {
		if dt.Code == ndarray.Bool {
			b[i] = byte(i+int(seed)) % 2
		} else {
			b[i] = byte(i*7+int(seed)*13+1) ^ byte(i>>8)
		}
	}
	a, err := ndarray.FromBytes(b, shape, dt, devices.CPUDevice)
	check.NoError(t, err)
	return a, b
}

// checkShape compares shapes, with nil and empty both meaning a scalar.
func checkShape(t testing.TB, got, want ndarray.Shape, context ...any) {
	t.Helper()
	check.True(t, got.Equal(want), append(context, fmt.Sprintf("shape %s, want %s", got, want))...)
}

func arrayBytes(t testing.TB, a *ndarray.NDArray) []byte {
	t.Helper()
	b, err := a.Bytes()
	check.NoError(t, err)
	return b
}

func TestNPYGolden(t *testing.T) {
	inf32, inf64 := float32(math.Inf(1)), math.Inf(-1)
	tests := []struct {
		file  string
		dtype ndarray.DType
		shape ndarray.Shape
		data  []byte
		exact bool // WriteNPY writes the file byte for byte
	}{
		{"bool", ndarray.BoolT, ndarray.Shape{2, 3}, []byte{1, 0, 1, 1, 0, 0}, true},
		{"int8", ndarray.Int8, ndarray.Shape{5}, le(t, []int8{-128, -1, 0, 1, 127}), true},
		{"int16", ndarray.Int16, ndarray.Shape{5}, le(t, []int16{-32768, -1, 0, 1, 32767}), true},
		{"int32", ndarray.Int32, ndarray.Shape{5}, le(t, []int32{math.MinInt32, -1, 0, 1, math.MaxInt32}), true},
		{"int64", ndarray.Int64, ndarray.Shape{5}, le(t, []int64{math.MinInt64, -1, 0, 1, math.MaxInt64}), true},
		{"uint8", ndarray.Uint8, ndarray.Shape{5}, []byte{0, 1, 127, 128, 255}, true},
		{"uint16", ndarray.Uint16, ndarray.Shape{5}, le(t, []uint16{0, 1, 1<<15 - 1, 1 << 15, 1<<16 - 1}), true},
		{"uint32", ndarray.Uint32, ndarray.Shape{5}, le(t, []uint32{0, 1, 1<<31 - 1, 1 << 31, 1<<32 - 1}), true},
		{"uint64", ndarray.Uint64, ndarray.Shape{5}, le(t, []uint64{0, 1, 1<<63 - 1, 1 << 63, 1<<64 - 1}), true},
		// float16 bits of 0, 1, -2, 0.5, 65504, inf.
		{"float16", ndarray.Float16, ndarray.Shape{2, 3}, le(t, []uint16{0x0000, 0x3C00, 0xC000, 0x3800, 0x7BFF, 0x7C00}), true},
		{"float32", ndarray.Float32, ndarray.Shape{2, 3}, le(t, []float32{0, 1.5, -2.25, math.MaxFloat32, math.SmallestNonzeroFloat32, inf32}), true},
		{"float64", ndarray.Float64, ndarray.Shape{3, 2}, le(t, []float64{0, 1.5, -2.25, math.MaxFloat64, math.SmallestNonzeroFloat64, inf64}), true},
		{"scalar_float64", ndarray.Float64, ndarray.Shape{}, le(t, []float64{3.25}), true},
		{"empty_float32", ndarray.Float32, ndarray.Shape{0, 3}, []byte{}, true},
		{"int32_4d", ndarray.Int32, ndarray.Shape{1, 2, 3, 4}, le(t, []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}), true},
		// bfloat16 bits of 1, -2, 0.5, inf, descr 'bfloat16'.
		{"bfloat16", ndarray.BFloat16, ndarray.Shape{4}, le(t, []uint16{0x3F80, 0xC000, 0x3F00, 0x7F80}), true},
		{"be_float32", ndarray.Float32, ndarray.Shape{3}, le(t, []float32{1.5, -2.25, 3}), false},
		{"be_int64", ndarray.Int64, ndarray.Shape{3}, le(t, []int64{-1, 2, 1 << 40}), false},
		{"be_uint16", ndarray.Uint16, ndarray.Shape{3}, le(t, []uint16{1, 258, 65535}), false},
		{"be_float16", ndarray.Float16, ndarray.Shape{3}, le(t, []uint16{0x3C00, 0xC000, 0x3800}), false},
		{"float32_v2", ndarray.Float32, ndarray.Shape{2, 3}, le(t, []float32{0, 1, 2, 3, 4, 5}), false},
		{"float32_v3", ndarray.Float32, ndarray.Shape{2, 3}, le(t, []float32{0, 1, 2, 3, 4, 5}), false},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join("testdata", "npy", tt.file+".npy")
			a, err := ndarray.LoadNPY(path)
			check.NoError(t, err)
			check.Equal(t, a.DType(), tt.dtype)
			checkShape(t, a.Shape(), tt.shape)
			check.Equal(t, arrayBytes(t, a), tt.data)
			check.Equal(t, a.Device(), devices.CPUDevice)

			raw, err := os.ReadFile(path)
			check.NoError(t, err)
			s, err := ndarray.ReadNPY(stream{bytes.NewReader(raw)})
			check.NoError(t, err, "as a stream")
			check.Equal(t, arrayBytes(t, s), tt.data, "as a stream")

			if tt.exact {
				var out bytes.Buffer
				check.NoError(t, ndarray.WriteNPY(&out, a))
				check.Equal(t, out.String(), string(raw), "WriteNPY writes what np.save wrote")
			}
		})
	}
}

func TestNPYGoldenRefused(t *testing.T) {
	tests := []struct {
		file string
		want []string
	}{
		{"fortran", []string{"Fortran", "not supported"}},
		{"object", []string{`"|O"`, "object arrays are not supported"}},
		{"bfloat16_v2", []string{`"<V2"`, "ml_dtypes.bfloat16", "'bfloat16'"}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join("testdata", "npy", tt.file+".npy")
			_, err := ndarray.LoadNPY(path)
			check.Error(t, err, append([]string{"load npy", tt.file + ".npy"}, tt.want...)...)
		})
	}
}

func TestNPYRoundTrip(t *testing.T) {
	shapes := []ndarray.Shape{{}, {0}, {3}, {2, 3, 4}, {4, 0, 2}}
	for _, dt := range allDTypes {
		for _, shape := range shapes {
			t.Run(dt.String()+shape.String(), func(t *testing.T) {
				a, want := pattern(t, shape, dt, 1)
				var buf bytes.Buffer
				check.NoError(t, ndarray.WriteNPY(&buf, a))
				check.Equal(t, buf.Bytes()[6], byte(1), "version 1.0")
				check.Equal(t, (len(buf.Bytes())-len(want))%64, 0, "data aligned to 64 bytes")
				for name, r := range map[string]io.Reader{
					"bytes":  bytes.NewReader(buf.Bytes()),
					"stream": stream{bytes.NewReader(buf.Bytes())},
				} {
					got, err := ndarray.ReadNPY(r)
					check.NoError(t, err, name)
					check.Equal(t, got.DType(), dt, name)
					checkShape(t, got.Shape(), shape, name)
					check.Equal(t, arrayBytes(t, got), want, name)
				}
				path := filepath.Join(t.TempDir(), "a.npy")
				check.NoError(t, ndarray.SaveNPY(path, a))
				got, err := ndarray.LoadNPY(path)
				check.NoError(t, err)
				check.Equal(t, arrayBytes(t, got), want, "file")
			})
		}
	}
}

func TestNPYLanes(t *testing.T) {
	tests := []struct {
		dtype string
		shape ndarray.Shape
		want  ndarray.Shape
	}{
		{"float32x4", ndarray.Shape{3}, ndarray.Shape{3, 4}},
		{"float32x4", ndarray.Shape{}, ndarray.Shape{4}},
		{"int8x16", ndarray.Shape{2, 2}, ndarray.Shape{2, 2, 16}},
		{"boolx2", ndarray.Shape{3}, ndarray.Shape{3, 2}},
		{"bfloat16x8", ndarray.Shape{1}, ndarray.Shape{1, 8}},
	}
	for _, tt := range tests {
		t.Run(tt.dtype+tt.shape.String(), func(t *testing.T) {
			dt := ndarray.MustParseDType(tt.dtype)
			a, want := pattern(t, tt.shape, dt, 2)
			var buf bytes.Buffer
			check.NoError(t, ndarray.WriteNPY(&buf, a))
			got, err := ndarray.ReadNPY(&buf)
			check.NoError(t, err)
			check.Equal(t, got.DType(), dt.Scalar())
			checkShape(t, got.Shape(), tt.want)
			check.Equal(t, arrayBytes(t, got), want)
		})
	}
}

func TestNPYWriteStrided(t *testing.T) {
	base, err := ndarray.FromSlice([]int16{0, 1, 2, 3, 4, 5}, ndarray.Shape{2, 3})
	check.NoError(t, err)
	tests := []struct {
		name    string
		shape   ndarray.Shape
		strides []int64
		offset  int64
		want    []int16
	}{
		{"transpose", ndarray.Shape{3, 2}, []int64{1, 3}, 0, []int16{0, 3, 1, 4, 2, 5}},
		{"reversed", ndarray.Shape{6}, []int64{-1}, 10, []int16{5, 4, 3, 2, 1, 0}},
		{"column", ndarray.Shape{2}, []int64{3}, 2, []int16{1, 4}},
		{"broadcast", ndarray.Shape{2, 2}, []int64{0, 1}, 0, []int16{0, 1, 0, 1}},
		{"empty", ndarray.Shape{0, 2}, []int64{7, 9}, 0, []int16{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := base.StridedView(tt.shape, ndarray.Int16, tt.strides, tt.offset)
			check.NoError(t, err)
			var buf bytes.Buffer
			check.NoError(t, ndarray.WriteNPY(&buf, v))
			got, err := ndarray.ReadNPY(&buf)
			check.NoError(t, err)
			checkShape(t, got.Shape(), tt.shape)
			vals, err := ndarray.ToSlice[int16](got)
			check.NoError(t, err)
			check.Equal(t, vals, tt.want)
		})
	}
}

func TestNPYVersion2(t *testing.T) {
	// 30000 dimensions of 1 make a header longer than 1.0's 65535 bytes.
	shape := make(ndarray.Shape, 30000)
	for i := range shape {
		shape[i] = 1
	}
	a, want := pattern(t, shape, ndarray.Float32, 3)
	var buf bytes.Buffer
	check.NoError(t, ndarray.WriteNPY(&buf, a))
	check.Equal(t, buf.Bytes()[6:8], []byte{2, 0}, "version 2.0")
	check.Equal(t, (buf.Len()-len(want))%64, 0, "data aligned to 64 bytes")
	got, err := ndarray.ReadNPY(&buf)
	check.NoError(t, err)
	checkShape(t, got.Shape(), shape)
	check.Equal(t, arrayBytes(t, got), want)
}

func TestNPYBackToBack(t *testing.T) {
	a, wantA := pattern(t, ndarray.Shape{5}, ndarray.Int32, 1)
	b, wantB := pattern(t, ndarray.Shape{2, 2}, ndarray.Float64, 2)
	var buf bytes.Buffer
	check.NoError(t, ndarray.WriteNPY(&buf, a))
	check.NoError(t, ndarray.WriteNPY(&buf, b))
	r := stream{&buf}
	got, err := ndarray.ReadNPY(r)
	check.NoError(t, err)
	check.Equal(t, arrayBytes(t, got), wantA)
	got, err = ndarray.ReadNPY(r)
	check.NoError(t, err)
	check.Equal(t, arrayBytes(t, got), wantB)
	_, err = ndarray.ReadNPY(r)
	check.Error(t, err, "magic and version: want 8 bytes, got 0")
}

func TestNPYBoolNormalized(t *testing.T) {
	raw := npyBytes("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", []byte{0, 2, 255})
	a, err := ndarray.ReadNPY(bytes.NewReader(raw))
	check.NoError(t, err)
	got, err := ndarray.ToSlice[bool](a)
	check.NoError(t, err)
	check.Equal(t, got, []bool{false, true, true})
	check.Equal(t, arrayBytes(t, a), []byte{0, 1, 1})
}

// npyBytes makes a version 1.0 file from a header dict and data.
func npyBytes(dict string, data []byte) []byte {
	return npyVersion(1, dict, data)
}

func npyVersion(major byte, dict string, data []byte) []byte {
	b := []byte("\x93NUMPY")
	b = append(b, major, 0)
	h := dict + "\n"
	if major == 1 {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(h)))
	} else {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(h)))
	}
	b = append(b, h...)
	return append(b, data...)
}

func TestNPYHeaderVariants(t *testing.T) {
	tests := []struct {
		name  string
		raw   []byte
		dtype ndarray.DType
		shape ndarray.Shape
	}{
		{"python 2 longs", npyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2L, 1L), }", make([]byte, 16)), ndarray.Float64, ndarray.Shape{2, 1}},
		{"double quotes, no trailing comma", npyBytes(`{"shape": (3,), "fortran_order": False, "descr": "<i2"}`, make([]byte, 6)), ndarray.Int16, ndarray.Shape{3}},
		{"no spaces", npyBytes("{'descr':'<u4','fortran_order':False,'shape':(1,2)}", make([]byte, 8)), ndarray.Uint32, ndarray.Shape{1, 2}},
		{"bool char", npyBytes("{'descr': '?', 'fortran_order': False, 'shape': (1,), }", []byte{1}), ndarray.BoolT, ndarray.Shape{1}},
		{"native order", npyBytes("{'descr': '=i4', 'fortran_order': False, 'shape': (), }", make([]byte, 4)), ndarray.Int32, ndarray.Shape{}},
		{"big-endian byte", npyBytes("{'descr': '>u1', 'fortran_order': False, 'shape': (2,), }", []byte{1, 2}), ndarray.Uint8, ndarray.Shape{2}},
		{"version 3.0", npyVersion(3, "{'descr': '<f2', 'fortran_order': False, 'shape': (1,), }", []byte{0, 0x3c}), ndarray.Float16, ndarray.Shape{1}},
		{"trailing data", npyBytes("{'descr': '|u1', 'fortran_order': False, 'shape': (1,), }", []byte{7, 8, 9}), ndarray.Uint8, ndarray.Shape{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := ndarray.ReadNPY(bytes.NewReader(tt.raw))
			check.NoError(t, err)
			check.Equal(t, a.DType(), tt.dtype)
			checkShape(t, a.Shape(), tt.shape)
		})
	}
}

func TestNPYErrors(t *testing.T) {
	f4 := func(shape string) []byte {
		return npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': "+shape+", }", nil)
	}
	descr := func(d string) []byte {
		return npyBytes("{'descr': "+d+", 'fortran_order': False, 'shape': (1,), }", make([]byte, 16))
	}
	hugeLen := []byte("\x93NUMPY\x02\x00\xff\xff\xff\x7f")
	tests := []struct {
		name string
		raw  []byte
		want []string
	}{
		{"empty", nil, []string{"magic and version: want 8 bytes, got 0"}},
		{"short magic", []byte("\x93NUM"), []string{"want 8 bytes, got 4"}},
		{"wrong magic", []byte("PK\x03\x04\x14\x00\x00\x00\x00\x00"), []string{"bad magic", "not a .npy file"}},
		{"unknown version", []byte("\x93NUMPY\x04\x00\x10\x00"), []string{"unknown format version 4.0"}},
		{"unknown minor", []byte("\x93NUMPY\x01\x01\x10\x00"), []string{"unknown format version 1.1"}},
		{"no header length", []byte("\x93NUMPY\x02\x00\x10"), []string{"header length: want 4 bytes, got 1"}},
		{"header over limit", hugeLen, []string{"header length 2147483647 is over the limit"}},
		{"header cut short", append([]byte("\x93NUMPY\x01\x00\x40\x00"), "{'descr'"...), []string{"header cut short: want 64 bytes, got 8"}},
		{"not a dict", npyBytes("['<f4', False, (1,)]", nil), []string{"malformed header", "not a dict"}},
		{"unclosed dict", npyBytes("{'descr': '<f4', 'fortran_order': False", nil), []string{"malformed header", "not closed"}},
		{"unclosed string", npyBytes("{'descr: '<f4'}", nil), []string{"malformed header"}},
		{"missing colon", npyBytes("{'descr' '<f4'}", nil), []string{"malformed header", "want ':'"}},
		{"missing comma", npyBytes("{'descr': '<f4' 'shape': (1,)}", nil), []string{"malformed header", "want ','"}},
		{"trailing garbage", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } x", nil), []string{"malformed header", "after the dict"}},
		{"missing key", npyBytes("{'descr': '<f4', 'shape': (1,), }", nil), []string{"malformed header", `no key "fortran_order"`}},
		{"extra key", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", nil), []string{`unexpected key "x"`}},
		{"duplicate key", npyBytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", nil), []string{`key "descr" appears twice`}},
		{"non-string key", npyBytes("{1: '<f4'}", nil), []string{"key 1 is not a string"}},
		{"unknown name", npyBytes("{'descr': float32}", nil), []string{`unexpected name "float32"`}},
		{"bad escape", npyBytes(`{'descr': '\x41'}`, nil), []string{"unsupported escape"}},
		{"fortran order", npyBytes("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }", make([]byte, 4)), []string{"fortran_order is True", "Fortran (column-major) order is not supported"}},
		{"fortran not bool", npyBytes("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }", nil), []string{"fortran_order 0 is not True or False"}},
		{"shape not a tuple", f4("(3)"), []string{"shape 3 is not a tuple"}},
		{"shape a list", f4("[3]"), []string{"shape [3] is not a tuple"}},
		{"shape negative", f4("(2, -3)"), []string{"shape: dimension 1 is negative (-3)"}},
		{"shape not int", f4("(2, 'a')"), []string{"shape: dimension 1", "not an integer"}},
		{"shape float", f4("(2.5,)"), []string{"malformed header"}},
		{"shape overflow", f4("(99999999999999999999,)"), []string{"dimension 0 is 99999999999999999999: out of range"}},
		{"too many elements", f4("(4294967296, 4294967296)"), []string{"too many elements"}},
		{"too many bytes", f4("(4611686018427387904,)"), []string{"more than 9223372036854775807 bytes"}},
		{"deep nesting", f4(strings.Repeat("(", 40) + strings.Repeat(")", 40)), []string{"nested too deeply"}},
		{"descr object", descr("'|O'"), []string{`descr "|O": object arrays are not supported`}},
		{"descr void", descr("'<V2'"), []string{`descr "<V2": void dtype`}},
		{"descr complex", descr("'<c8'"), []string{`descr "<c8": dtype not supported`}},
		{"descr string", descr("'|S5'"), []string{`descr "|S5": dtype not supported`}},
		{"descr int3", descr("'<i3'"), []string{`descr "<i3": dtype not supported`}},
		{"descr empty", descr("''"), []string{`descr "": no type`}},
		{"descr order only", descr("'<'"), []string{`descr "<": no type`}},
		{"descr structured", descr("[('a', '<f4')]"), []string{"structured dtypes are not supported"}},
		{"descr not a string", descr("4"), []string{"descr 4 is not a string"}},
		{"data cut short", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", make([]byte, 10)), []string{"data cut short", "(2, 3) float32 needs 24 bytes", "10 remain"}},
		{"lying size", npyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }", make([]byte, 10)), []string{"data cut short", "needs 8000000000000 bytes", "10 remain"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ndarray.ReadNPY(bytes.NewReader(tt.raw))
			check.Error(t, err, append([]string{"read npy: "}, tt.want...)...)
			// A stream gives the same error, except that it counts what
			// it got rather than what remains.
			_, err = ndarray.ReadNPY(stream{bytes.NewReader(tt.raw)})
			check.Error(t, err, "read npy: ")
			if tt.name == "data cut short" || tt.name == "lying size" {
				check.Error(t, err, "data cut short", "got 10")
			}
		})
	}
}

func TestNPYWriteErrors(t *testing.T) {
	released, err := ndarray.FromSlice([]int8{1}, ndarray.Shape{1})
	check.NoError(t, err)
	check.NoError(t, released.Release())
	uint1, err := ndarray.Empty(ndarray.Shape{8}, ndarray.MustParseDType("uint1"), devices.CPUDevice)
	check.NoError(t, err)
	handle, err := ndarray.Empty(ndarray.Shape{1}, ndarray.MustParseDType("handle"), devices.CPUDevice)
	check.NoError(t, err)

	t.Run("released", func(t *testing.T) {
		check.ErrorIs(t, ndarray.WriteNPY(io.Discard, released), ndarray.ErrReleased)
	})
	t.Run("nil", func(t *testing.T) {
		check.Error(t, ndarray.WriteNPY(io.Discard, nil), "write npy", "nil array")
	})
	t.Run("uint1", func(t *testing.T) {
		check.Error(t, ndarray.WriteNPY(io.Discard, uint1), "write npy: dtype uint1 has no numpy equivalent")
	})
	t.Run("handle", func(t *testing.T) {
		check.Error(t, ndarray.WriteNPY(io.Discard, handle), "dtype handle has no numpy equivalent")
	})
	t.Run("writer fails", func(t *testing.T) {
		a, _ := pattern(t, ndarray.Shape{4}, ndarray.Float32, 0)
		check.Error(t, ndarray.WriteNPY(failWriter{}, a), "write npy: disk full")
	})
	t.Run("stride overflow", func(t *testing.T) {
		// Either StridedView refuses this view (its bounds check
		// multiplies without overflow checks today) or WriteNPY must.
		base, err := ndarray.FromSlice([]float32{1, 2}, ndarray.Shape{2})
		check.NoError(t, err)
		v, err := base.StridedView(ndarray.Shape{3}, ndarray.Float32, []int64{1<<62 + 1}, 0)
		if err == nil {
			check.Error(t, ndarray.WriteNPY(io.Discard, v), "outside")
		}
	})
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestSaveNPYAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.npy")
	a, want := pattern(t, ndarray.Shape{3}, ndarray.Int64, 4)
	check.NoError(t, ndarray.SaveNPY(path, a))

	// A failed save leaves the old file whole and no temporary behind.
	bad, err := ndarray.Empty(ndarray.Shape{1}, ndarray.MustParseDType("uint1"), devices.CPUDevice)
	check.NoError(t, err)
	check.Error(t, ndarray.SaveNPY(path, bad), "save npy", "x.npy", "no numpy equivalent")
	got, err := ndarray.LoadNPY(path)
	check.NoError(t, err)
	check.Equal(t, arrayBytes(t, got), want)
	entries, err := os.ReadDir(dir)
	check.NoError(t, err)
	check.Equal(t, len(entries), 1, "files in the directory")
	info, err := os.Stat(path)
	check.NoError(t, err)
	check.Equal(t, info.Mode().Perm(), fs.FileMode(0o644))

	t.Run("no directory", func(t *testing.T) {
		err := ndarray.SaveNPY(filepath.Join(dir, "missing", "x.npy"), a)
		check.ErrorIs(t, err, fs.ErrNotExist)
	})
	t.Run("load missing", func(t *testing.T) {
		_, err := ndarray.LoadNPY(filepath.Join(dir, "nothing.npy"))
		check.ErrorIs(t, err, fs.ErrNotExist)
		check.Error(t, err, "load npy")
	})
}

// hasNumpy reports whether /usr/bin/python3 can import numpy.
func hasNumpy() bool {
	return exec.Command("/usr/bin/python3", "-c", "import numpy").Run() == nil
}

// TestNPYNumpyLoads checks that numpy reads what kiln writes. It needs
// /usr/bin/python3 with numpy and skips without it.
func TestNPYNumpyLoads(t *testing.T) {
	if !hasNumpy() {
		t.Skip("/usr/bin/python3 with numpy is not available")
	}
	dir := t.TempDir()
	type want struct {
		Descr string  `json:"descr"`
		Shape []int64 `json:"shape"`
		Hex   string  `json:"hex"`
	}
	wants := map[string]want{}
	add := func(name string, a *ndarray.NDArray, descr string, shape ndarray.Shape, data []byte) {
		check.NoError(t, ndarray.SaveNPY(filepath.Join(dir, name+".npy"), a))
		if shape == nil {
			shape = ndarray.Shape{}
		}
		wants[name] = want{descr, shape, fmt.Sprintf("%x", data)}
	}
	descrs := map[ndarray.DType]string{
		ndarray.BoolT: "|b1", ndarray.Int8: "|i1", ndarray.Int16: "<i2", ndarray.Int32: "<i4", ndarray.Int64: "<i8",
		ndarray.Uint8: "|u1", ndarray.Uint16: "<u2", ndarray.Uint32: "<u4", ndarray.Uint64: "<u8",
		ndarray.Float16: "<f2", ndarray.Float32: "<f4", ndarray.Float64: "<f8",
	}
	for dt, d := range descrs {
		for i, shape := range []ndarray.Shape{{}, {0}, {2, 3}} {
			a, data := pattern(t, shape, dt, byte(i))
			add(fmt.Sprintf("%s_%d", dt, i), a, d, shape, data)
		}
	}
	lanes, data := pattern(t, ndarray.Shape{2}, ndarray.MustParseDType("float32x4"), 5)
	add("float32x4", lanes, "<f4", ndarray.Shape{2, 4}, data)
	base, err := ndarray.FromSlice([]int16{0, 1, 2, 3, 4, 5}, ndarray.Shape{2, 3})
	check.NoError(t, err)
	tr, err := base.StridedView(ndarray.Shape{3, 2}, ndarray.Int16, []int64{1, 3}, 0)
	check.NoError(t, err)
	add("transposed", tr, "<i2", ndarray.Shape{3, 2}, le(t, []int16{0, 3, 1, 4, 2, 5}))

	script := `
import json, os, sys
import numpy as np
out = {}
d = sys.argv[1]
for f in sorted(os.listdir(d)):
    a = np.load(os.path.join(d, f), allow_pickle=False)
    out[f[:-4]] = {"descr": np.lib.format.dtype_to_descr(a.dtype), "shape": list(a.shape), "hex": a.tobytes().hex()}
print(json.dumps(out))
`
	cmd := exec.Command("/usr/bin/python3", "-c", script, dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	check.NoError(t, err, stderr.String())
	var got map[string]want
	check.NoError(t, json.Unmarshal(out, &got))
	check.Equal(t, len(got), len(wants), "files numpy read")
	for name, w := range wants {
		t.Run(name, func(t *testing.T) {
			g := got[name]
			if g.Shape == nil {
				g.Shape = []int64{}
			}
			check.Equal(t, g, w)
		})
	}
}

// FuzzReadNPY checks that no input makes ReadNPY panic or allocate
// without bound, that a byte reader and a stream agree, and that what it
// reads survives a write and a second read unchanged.
func FuzzReadNPY(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "npy", "*.npy"))
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte("\x93NUMPY\x01\x00"))
	f.Add(npyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2L, 1L), }", make([]byte, 16)))
	f.Add(npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }", make([]byte, 8)))
	f.Add(npyBytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", make([]byte, 4)))
	f.Add(npyVersion(3, "{'descr': 'bfloat16', 'fortran_order': False, 'shape': (0, 99999999999), }", nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := ndarray.ReadNPY(bytes.NewReader(data))
		s, serr := ndarray.ReadNPY(stream{bytes.NewReader(data)})
		if (err == nil) != (serr == nil) {
			t.Fatalf("byte reader and stream disagree: %v, %v", err, serr)
		}
		if err != nil {
			return
		}
		want := arrayBytes(t, a)
		check.Equal(t, arrayBytes(t, s), want, "stream")
		var buf bytes.Buffer
		check.NoError(t, ndarray.WriteNPY(&buf, a))
		b, err := ndarray.ReadNPY(&buf)
		check.NoError(t, err, "reading back")
		check.Equal(t, b.DType(), a.DType())
		checkShape(t, b.Shape(), a.Shape())
		check.Equal(t, arrayBytes(t, b), want)
	})
}
