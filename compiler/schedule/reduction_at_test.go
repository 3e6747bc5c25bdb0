package schedule

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestReverseComputeAtReduction moves rfactor's write-back, a reduction
// block, under the loop of its rows (TVM's reverse_compute_at of a
// reduction block): each row's partial results are combined right after
// they are computed, and the factored buffer holds one row's lanes.
func TestReverseComputeAtReduction(t *testing.T) {
	vectorRow := func(t *testing.T, s *Schedule, lanes int64) {
		ls := loopsOf(t, s, "C")
		k := must[[]LoopRV](t)(s.Split(ls[1], -1, lanes))
		rf := must[BlockRV](t)(s.RFactor(k[1], -1))
		c := must[BlockRV](t)(s.GetBlock("C"))
		check.NoError(t, s.ReverseComputeAt(c, ls[0]))
		must[BlockRV](t)(s.DecomposeReduction(rf, k[0]))
		check.NoError(t, s.Vectorize(k[1]))
		wl := loopsOf(t, s, "C")
		must[BlockRV](t)(s.DecomposeReduction(c, wl[len(wl)-1]))
		check.NoError(t, s.SetScope(rf, 0, "local"))
	}
	runCases(t, []schedCase{
		{name: "reverse_compute_at_write_back", fn: func() *ir.PrimFunc { return rowReduce(3, 16, false) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			vectorRow(t, s, 4)
		}},
		// 10 is no multiple of 4: the last vector is guarded.
		{name: "reverse_compute_at_write_back_tail", fn: func() *ir.PrimFunc { return rowReduce(5, 10, false) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			vectorRow(t, s, 4)
		}},
		{name: "reverse_compute_at_write_back_max", fn: func() *ir.PrimFunc { return rowReduce(3, 12, true) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			vectorRow(t, s, 4)
			check.NoError(t, s.Parallel(loopsOf(t, s, "C_rf_update")[0]))
		}},
	})
}

func TestReverseComputeAtReductionErrors(t *testing.T) {
	s, err := New(rowReduce(3, 8, false))
	check.NoError(t, err)
	ls := loopsOf(t, s, "C")
	k := must[[]LoopRV](t)(s.Split(ls[1], -1, 4))
	must[BlockRV](t)(s.RFactor(k[1], -1))
	c := must[BlockRV](t)(s.GetBlock("C"))
	// Under the loop of the lanes, one iteration produces one lane: the
	// write-back would combine one lane per init.
	err = s.ReverseComputeAt(c, k[1])
	check.True(t, err != nil, "no error")
	check.Equal(t, err.Error(), `reverse_compute_at: the loop would cover [k_1, k_1 + 1) of the reduction iteration variable "vk_1" of block "C", not its whole domain [0, 0 + 4): its init would run for a part of the reduction`)
	// A block that reads and writes a buffer without being its reduction
	// still cannot move.
	check.True(t, !updatesInPlace(&ir.Block{Name: "x"}, nil), "a block without a body is no reduction")
}

// rowCentered returns D[i, j] = A[i, j] - C[i] with C[i] the sum of row
// i of A.
func rowCentered(m, k int64) *ir.PrimFunc {
	A := te.Placeholder(te.Shape(m, k), ir.Float32, "A")
	r := te.ReduceAxis(ir.RangeFromExtent(ir.I32(k)), "k")
	C := te.Compute(te.Shape(m), func(i ir.Expr) ir.Expr { return te.Sum(A.At(i, r), r) }, "C")
	D := te.Compute(te.Shape(m, k), func(i, j ir.Expr) ir.Expr { return ir.Sub(A.At(i, j), C.At(i)) }, "D")
	return mustFunc(A, D)
}

// TestRFactorSharedLoop factors a reduction computed under its
// consumer's loop of rows: the loops of the block's own are the nest, and
// the write-back follows them inside the row loop, before the consumer.
func TestRFactorSharedLoop(t *testing.T) {
	runCases(t, []schedCase{
		{name: "rfactor_shared_loop", fn: func() *ir.PrimFunc { return rowCentered(3, 12) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			check.NoError(t, s.ComputeAt(c, loopsOf(t, s, "D")[0]))
			ls := loopsOf(t, s, "C")
			k := must[[]LoopRV](t)(s.Split(ls[len(ls)-1], -1, 4))
			rf := must[BlockRV](t)(s.RFactor(k[1], -1))
			must[BlockRV](t)(s.DecomposeReduction(rf, k[0]))
			check.NoError(t, s.Vectorize(k[1]))
			check.NoError(t, s.SetScope(rf, 0, "local"))
		}},
	})
}
