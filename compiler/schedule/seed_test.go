package schedule

import (
	"os"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestSeedPrimFuncs schedules the int64-indexed PrimFuncs that the IRModule tutorial's
// graph level produces (parsed from compiler/script's copy of the seed).
func TestSeedPrimFuncs(t *testing.T) {
	m := tutorialModule(t)
	runCases(t, []schedCase{
		{name: "seed001_matmul", fn: func() *ir.PrimFunc { return m.PrimFunc("matmul1") }, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("matmul"))
			ls := must[[]LoopRV](t)(s.GetLoops(c))
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 4))
			k := must[[]LoopRV](t)(s.Split(ls[2], -1, 64))
			check.NoError(t, s.Reorder(ls[0], j[0], k[0], k[1], j[1]))
			check.NoError(t, s.Parallel(j[0]))
			must[BlockRV](t)(s.DecomposeReduction(c, k[0]))
			check.NoError(t, s.Vectorize(j[1]))
		}},
		{name: "seed001_transpose", fn: func() *ir.PrimFunc {
			return m.PrimFunc("transpose1")
		}, apply: func(t *testing.T, s *Schedule) {
			b := must[BlockRV](t)(s.GetBlock("T_transpose"))
			ls := must[[]LoopRV](t)(s.GetLoops(b))
			check.NoError(t, s.Reorder(ls[1], ls[0]))
			f := must[LoopRV](t)(s.Fuse(ls[1], ls[0]))
			o := must[[]LoopRV](t)(s.Split(f, -1, 16))
			check.NoError(t, s.Vectorize(o[1]))
			must[BlockRV](t)(s.CacheRead(b, 0, "local"))
		}},
	})
}

// tutorialModule parses compiler/script's copy of the IRModule tutorial's
// module after LegalizeOps, or skips the test without it.
func tutorialModule(t *testing.T) *ir.IRModule {
	t.Helper()
	src, err := os.ReadFile("../script/testdata/001_after_legalize_ops.py")
	if err != nil {
		t.Skip("the tutorial's module is not available:", err)
	}
	m, err := script.Parse("001_after_legalize_ops.py", string(src))
	check.NoError(t, err)
	return m
}
