package schedule

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/internal/check"
)

// rowWindow is a window of k along rows of w with a stride of s, a
// depthwise convolution's row: C[i, x] = Σ_r A[i, x·s + r] · W[i, r].
func rowWindow(m, w, k, s int64) *ir.PrimFunc {
	xs := (w-k)/s + 1
	A := te.Placeholder(te.Shape(m, w), ir.Float32, "A")
	W := te.Placeholder(te.Shape(m, k), ir.Float32, "W")
	r := te.ReduceAxis(ir.RangeFromExtent(ir.I32(k)), "r")
	C := te.Compute(te.Shape(m, xs), func(i ...ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(A.At(i[0], ir.Add(ir.Mul(i[1], ir.I32(s)), r.Var)), W.At(i[0], r.Var)), r)
	}, "C")
	return mustFunc(A, W, C)
}

// reversed reads its input backwards, which no padding of the domain
// extends.
func reversed() *ir.PrimFunc {
	A := te.Placeholder(te.Shape(8), ir.Float32, "A")
	C := te.Compute(te.Shape(8), func(i ir.Expr) ir.Expr { return A.At(ir.Sub(ir.I32(7), i)) }, "C")
	return mustFunc(A, C)
}

// TestPadEinsumWindow pads blocks that read windows of their inputs: the
// padded copy of an input holds what the padded domain reads.
func TestPadEinsumWindow(t *testing.T) {
	runCases(t, []schedCase{
		// Rows of 6 outputs, stride 2, padded to 8: the copy of A has
		// (8-1)·2+3 = 17 columns, zeros past A's 13.
		{name: "pad_einsum_window_stride2", fn: func() *ir.PrimFunc { return rowWindow(3, 13, 3, 2) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			check.NoError(t, s.PadEinsum(c, []int64{1, 8, 1}))
			ls := must[[]LoopRV](t)(s.GetLoops(c))
			check.NoError(t, s.Reorder(ls[0], ls[2], ls[1]))
			check.NoError(t, s.Vectorize(ls[1]))
		}},
		// Two loads of B (at i and i+1): one copy, 13 elements for 12
		// outputs.
		{name: "pad_einsum_stencil", fn: stencil, compiled: true, apply: func(t *testing.T, s *Schedule) {
			check.NoError(t, s.PadEinsum(must[BlockRV](t)(s.GetBlock("C")), []int64{4}))
		}},
	})
}

func TestPadEinsumWindowErrors(t *testing.T) {
	s, err := New(reversed())
	check.NoError(t, err)
	err = s.PadEinsum(must[BlockRV](t)(s.GetBlock("C")), []int64{16})
	check.True(t, err != nil, "no error")
	check.Equal(t, err.Error(), `pad_einsum: block "C" loads "A" at (7 - v_i) in dimension 0, not a sum of iteration variables times non-negative constants`)
}
