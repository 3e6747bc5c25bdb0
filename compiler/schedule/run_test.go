package schedule

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"

	_ "github.com/kiln-ml/kiln/devices/cpu" // host arrays for the interpreter
)

// runFunc runs float32 PrimFunc f on compiler/interp's reference
// interpreter, with its size variables set from sizes, and returns the
// contents of every parameter buffer by name. Every parameter but the
// last holds small integers (exact in float32, so sums do not depend on
// their order); the last starts as NaN, and intermediate buffers are
// poisoned, so an element that no block writes shows up in the result.
func runFunc(t testing.TB, f *ir.PrimFunc, sizes map[string]int64) map[string][]float64 {
	t.Helper()
	args, arrays := inputs(t, f, sizes)
	check.NoError(t, interp.RunOptions(f, interp.Options{Poison: true, MaxSteps: 50_000_000}, args...))
	return contents(t, arrays)
}

// inputs makes runFunc's arguments: the arrays, also by buffer name.
func inputs(t testing.TB, f *ir.PrimFunc, sizes map[string]int64) ([]any, map[string]*ndarray.NDArray) {
	args := make([]any, len(f.Params))
	arrays := map[string]*ndarray.NDArray{}
	for i, p := range f.Params {
		b := f.BufferMap[p]
		check.True(t, b.DType == ir.Float32 || b.DType == ir.Float16 && i < len(f.Params)-1, "runFunc takes float32 buffers (float16 inputs), not", b.DType)
		shape := make(ndarray.Shape, len(b.Shape))
		n := int64(1)
		for d, e := range b.Shape {
			switch e := e.(type) {
			case *ir.IntImm:
				shape[d] = e.Value
			case *ir.Var:
				v, ok := sizes[e.Name]
				check.True(t, ok, "size of", e.Name)
				shape[d] = v
			default:
				t.Fatalf("runFunc: shape %s of %q", e, b.Name)
			}
			n *= shape[d]
		}
		data := make([]float32, n)
		for j := range data {
			if i == len(f.Params)-1 {
				data[j] = float32(math.NaN())
			} else {
				data[j] = float32((j*7+i*3)%11 - 5)
			}
		}
		a, err := ndarray.FromSlice(data, shape)
		check.NoError(t, err)
		if b.DType == ir.Float16 {
			// Small integers: exact in float16.
			raw := make([]byte, 2*n)
			for j, x := range data {
				binary.LittleEndian.PutUint16(raw[2*j:], halfBits(x))
			}
			a, err = ndarray.Empty(shape, ir.Float16, devices.CPUDevice)
			check.NoError(t, err)
			check.NoError(t, a.CopyFromBytes(raw))
		}
		args[i] = a
		arrays[b.Name] = a
	}
	return args, arrays
}

// contents returns the arrays' elements as float64s.
func contents(t testing.TB, arrays map[string]*ndarray.NDArray) map[string][]float64 {
	out := map[string][]float64{}
	for name, a := range arrays {
		if a.DType() != ndarray.Float32 {
			continue // an input
		}
		data, err := ndarray.ToSlice[float32](a)
		check.NoError(t, err)
		vals := make([]float64, len(data))
		for i, x := range data {
			vals[i] = float64(x)
		}
		out[name] = vals
	}
	return out
}

// sameResults fails unless the two runs agree on every element.
func sameResults(t testing.TB, got, want map[string][]float64) {
	t.Helper()
	for name, w := range want {
		g := got[name]
		check.Equal(t, len(g), len(w), "size of", name)
		for i := range w {
			if !(g[i] == w[i] || math.IsNaN(g[i]) && math.IsNaN(w[i])) {
				t.Fatalf("%s[%d] = %v, want %v", name, i, g[i], w[i])
			}
		}
		if name == "C" || name == "D" || name == "P" {
			nan := 0
			for _, x := range g {
				if math.IsNaN(x) {
					nan++
				}
			}
			check.Equal(t, nan, 0, "unwritten elements of", name)
		}
	}
}

// halfBits is the float16 encoding of x, a small integer.
func halfBits(x float32) uint16 {
	if x == 0 {
		return 0
	}
	var sign uint16
	if x < 0 {
		sign, x = 0x8000, -x
	}
	e := int(math.Floor(math.Log2(float64(x))))
	mant := uint16((float64(x)/math.Ldexp(1, e) - 1) * 1024)
	return sign | uint16(e+15)<<10 | mant
}
