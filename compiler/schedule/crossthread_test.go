package schedule

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/internal/check"
)

// rowSum returns S[i] = sum over k of A[i, k] for A: m×n.
func rowSum(m, n int64) *ir.PrimFunc {
	A := te.Placeholder(te.Shape(m, n), ir.Float32, "A")
	r := te.ReduceAxis(ir.RangeFromExtent(ir.I32(n)), "k")
	S := te.Compute(te.Shape(m), func(i ir.Expr) ir.Expr { return te.Sum(A.At(i, r), r) }, "S")
	return mustFunc(A, S)
}

// rowMax returns S[i] = max over k of A[i, k] for A: m×n (the same in
// any order: a cross-thread reduction of it gives the serial bits).
func rowMax(m, n int64) *ir.PrimFunc {
	A := te.Placeholder(te.Shape(m, n), ir.Float32, "A")
	r := te.ReduceAxis(ir.RangeFromExtent(ir.I32(n)), "k")
	S := te.Compute(te.Shape(m), func(i ir.Expr) ir.Expr { return te.Max(A.At(i, r), r) }, "S")
	return mustFunc(A, S)
}

// TestCrossThreadReduction: rfactor by a split of k that does not divide
// it (10 by 4) keeps the split's predicate on the partial results when
// compute_at moves them under the write-back's row loop; and the
// write-back of a row max, moved under the partial results' row loop (a reduction
// block, which reverse_compute_at takes), reduces over a loop bound to
// threadIdx.x: a cross-thread reduction.
func TestCrossThreadReduction(t *testing.T) {
	runCases(t, []schedCase{
		{name: "compute_at_keeps_predicate", fn: func() *ir.PrimFunc { return rowSum(6, 10) }, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "S")
			k := must[[]LoopRV](t)(s.Split(ls[1], -1, 4))
			rf := must[BlockRV](t)(s.RFactor(k[1], 0))
			wb := loopsOf(t, s, "S")
			check.NoError(t, s.ComputeAt(rf, wb[0]))
		}},
		{name: "cross_thread_reduction", fn: func() *ir.PrimFunc { return rowMax(4, 70) }, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "S")
			k := must[[]LoopRV](t)(s.Split(ls[1], -1, 32))
			rf := must[BlockRV](t)(s.RFactor(k[1], 0))
			check.NoError(t, s.SetScope(rf, 0, "local"))
			check.NoError(t, s.Reorder(k[1], k[0]))
			check.NoError(t, s.Bind(ls[0], "blockIdx.x"))
			check.NoError(t, s.Bind(k[1], "threadIdx.x"))
			b := must[BlockRV](t)(s.GetBlock("S"))
			check.NoError(t, s.ReverseComputeAt(b, ls[0]))
			bl := loopsOf(t, s, "S")
			check.NoError(t, s.Bind(bl[len(bl)-1], "threadIdx.x"))
		}},
	})
	// A predicate over a loop that binds no iteration variable directly
	// cannot be carried: compute_at refuses.
	s, err := New(chain(4, 10))
	check.NoError(t, err)
	ls := loopsOf(t, s, "B")
	must[[]LoopRV](t)(s.Split(ls[1], -1, 4))
	b := must[BlockRV](t)(s.GetBlock("B"))
	c := loopsOf(t, s, "C")
	check.Error(t, s.ComputeAt(b, c[0]), `compute_at: block "B" has the predicate`)
	// Parallel and vector loops still refuse a reduction loop.
	s, err = New(rowSum(4, 8))
	check.NoError(t, err)
	ls = loopsOf(t, s, "S")
	check.Error(t, s.Bind(ls[1], "blockIdx.x"), `bind: loop "k" is bound to the reduce iteration variable`)
}
