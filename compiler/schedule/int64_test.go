package schedule

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestInt64Primitives runs the new primitives on the int64-indexed
// PrimFuncs of the IRModule tutorial (after LegalizeOps): the index maps'
// and intrinsics' int32 constants take the functions' index type.
func TestInt64Primitives(t *testing.T) {
	m := tutorialModule(t)
	mm := func() *ir.PrimFunc { return m.PrimFunc("matmul1") } // 1×256 · 256×10
	runCases(t, []schedCase{
		{name: "int64_cache_read_layout", fn: mm, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("matmul"))
			must[BlockRV](t)(s.CacheReadLayout(c, 1, "global", imap(t, "lambda k, n: (n // 4, k, n % 4)"), zero()))
		}},
		{name: "int64_pad_tensorize", fn: mm, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("matmul"))
			check.NoError(t, s.PadEinsum(c, []int64{1, 8, 1}))
			ls := must[[]LoopRV](t)(s.GetLoops(c))
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 8))
			check.NoError(t, s.Reorder(ls[0], j[0], ls[2], j[1]))
			check.NoError(t, s.Tensorize(j[1], VecFMAIntrin(8)))
		}},
		{name: "int64_rfactor", fn: mm, compiled: true, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "matmul")
			k := must[[]LoopRV](t)(s.Split(ls[2], -1, 16))
			rf := must[BlockRV](t)(s.RFactor(k[1], 0))
			must[BlockRV](t)(s.DecomposeReduction(rf, k[0]))
		}},
	})
}
