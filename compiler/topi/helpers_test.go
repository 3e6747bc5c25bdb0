package topi

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
	_ "github.com/kiln-ml/kiln/devices/cpu" // host arrays for the interpreter
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// arr is a host tensor for reference computations: values as float64 in
// row-major order, whatever the dtype.
type arr struct {
	shape []int64
	dt    ir.DType
	data  []float64
}

func numel(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

func newArr(dt ir.DType, shape ...int64) arr {
	return arr{shape: shape, dt: dt, data: make([]float64, numel(shape))}
}

// randArr fills a tensor with normal values (floats) or small integers.
func randArr(rng *rand.Rand, dt ir.DType, shape ...int64) arr {
	a := newArr(dt, shape...)
	for i := range a.data {
		switch {
		case dt.IsFloat():
			a.data[i] = float64(float32(rng.NormFloat64()))
		case ir.IsBool(dt):
			a.data[i] = float64(rng.IntN(2))
		default:
			a.data[i] = float64(rng.IntN(19) - 9)
		}
	}
	return a
}

// at reads the element at a multi-index.
func (a arr) at(idx ...int64) float64 { return a.data[ravel(idx, a.shape)] }

func ravel(idx, shape []int64) int64 {
	off := int64(0)
	for i, d := range shape {
		off = off*d + idx[i]
	}
	return off
}

func unravel(i int64, shape []int64) []int64 {
	idx := make([]int64, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		if shape[d] > 0 {
			idx[d] = i % shape[d]
			i /= shape[d]
		}
	}
	return idx
}

// fill sets every element of a new tensor of shape to f(index).
func fill(dt ir.DType, shape []int64, f func(idx []int64) float64) arr {
	a := newArr(dt, shape...)
	for i := range a.data {
		a.data[i] = f(unravel(int64(i), shape))
	}
	return a
}

func toND(t *testing.T, a arr) *ndarray.NDArray {
	t.Helper()
	var nd *ndarray.NDArray
	var err error
	shape := ndarray.Shape(a.shape)
	switch a.dt {
	case ir.Float32:
		s := make([]float32, len(a.data))
		for i, v := range a.data {
			s[i] = float32(v)
		}
		nd, err = ndarray.FromSlice(s, shape)
	case ir.Float64:
		nd, err = ndarray.FromSlice(append([]float64(nil), a.data...), shape)
	case ir.Int32:
		s := make([]int32, len(a.data))
		for i, v := range a.data {
			s[i] = int32(v)
		}
		nd, err = ndarray.FromSlice(s, shape)
	case ir.Int64:
		s := make([]int64, len(a.data))
		for i, v := range a.data {
			s[i] = int64(v)
		}
		nd, err = ndarray.FromSlice(s, shape)
	case ir.Bool:
		s := make([]bool, len(a.data))
		for i, v := range a.data {
			s[i] = v != 0
		}
		nd, err = ndarray.FromSlice(s, shape)
	default:
		t.Fatalf("test arrays of dtype %s are not supported", a.dt)
	}
	check.NoError(t, err)
	return nd
}

func fromND(t *testing.T, nd *ndarray.NDArray) []float64 {
	t.Helper()
	var out []float64
	switch nd.DType() {
	case ir.Float32:
		s, err := ndarray.ToSlice[float32](nd)
		check.NoError(t, err)
		for _, v := range s {
			out = append(out, float64(v))
		}
	case ir.Float64:
		s, err := ndarray.ToSlice[float64](nd)
		check.NoError(t, err)
		out = s
	case ir.Int32:
		s, err := ndarray.ToSlice[int32](nd)
		check.NoError(t, err)
		for _, v := range s {
			out = append(out, float64(v))
		}
	case ir.Int64:
		s, err := ndarray.ToSlice[int64](nd)
		check.NoError(t, err)
		for _, v := range s {
			out = append(out, float64(v))
		}
	case ir.Bool:
		s, err := ndarray.ToSlice[bool](nd)
		check.NoError(t, err)
		for _, v := range s {
			if v {
				out = append(out, 1)
			} else {
				out = append(out, 0)
			}
		}
	default:
		t.Fatalf("test arrays of dtype %s are not supported", nd.DType())
	}
	return out
}

// placeholder returns an input tensor with int64 dimensions, as the
// graph level gives them.
func placeholder(name string, dt ir.DType, shape ...int64) *te.Tensor {
	return te.Placeholder(ir.Dims(shape...), dt, name)
}

func constShape(t *testing.T, s []ir.Expr) []int64 {
	t.Helper()
	out := make([]int64, len(s))
	for i, d := range s {
		v, ok := ir.ConstDim(d)
		check.True(t, ok, "dimension", i, "of", ir.ShapeString(s), "is constant")
		out[i] = v
	}
	return out
}

// runPrimFunc runs f on the inputs and fresh outputs of outShapes and
// returns the outputs.
func runPrimFunc(t *testing.T, f *ir.PrimFunc, ins []arr, outs []arr) []arr {
	t.Helper()
	var args []any
	for _, a := range ins {
		args = append(args, toND(t, a))
	}
	var nds []*ndarray.NDArray
	for _, o := range outs {
		nd := toND(t, o)
		nds = append(nds, nd)
		args = append(args, nd)
	}
	check.NoError(t, interp.Run(f, args...))
	res := make([]arr, len(outs))
	for i, nd := range nds {
		res[i] = arr{shape: outs[i].shape, dt: outs[i].dt, data: fromND(t, nd)}
	}
	return res
}

// runTE builds the PrimFunc of inputs → outputs, runs it on ins and
// returns the outputs.
func runTE(t *testing.T, inputs, outputs []*te.Tensor, ins []arr) []arr {
	t.Helper()
	f, err := te.CreatePrimFunc(append(append([]*te.Tensor{}, inputs...), outputs...))
	check.NoError(t, err)
	check.NoError(t, ir.Verify(f))
	outs := make([]arr, len(outputs))
	for i, o := range outputs {
		outs[i] = newArr(o.DType, constShape(t, o.Shape)...)
	}
	return runPrimFunc(t, f, ins, outs)
}

// near fails unless got matches want within a relative/absolute tolerance.
func near(t *testing.T, got, want arr, tol float64) {
	t.Helper()
	check.Equal(t, fmt.Sprint(got.shape), fmt.Sprint(want.shape), "shape")
	check.Equal(t, len(got.data), len(want.data), "element count")
	for i := range got.data {
		g, w := got.data[i], want.data[i]
		if math.IsNaN(w) && math.IsNaN(g) || g == w {
			continue
		}
		if math.Abs(g-w) > tol*(1+math.Abs(w)) {
			t.Fatalf("element %v: got %v, want %v", unravel(int64(i), want.shape), g, w)
		}
	}
}

func f32(v float64) float64 { return float64(float32(v)) }
