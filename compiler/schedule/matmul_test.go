package schedule

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

// registerBlocked applies the register-blocked matmul schedule that the
// benchmark uses: an mr×nr tile of C accumulates in a local buffer while k
// runs over the whole reduction, the tile's columns are one vector of nr
// lanes, its rows are unrolled, the tile loops are fused and run in
// parallel. With pack, B's column panel is copied (cache_read) before the
// tiles that use it.
func registerBlocked(t *testing.T, s *Schedule, mr, nr int64, pack bool) {
	c := must[BlockRV](t)(s.GetBlock("C"))
	ls := must[[]LoopRV](t)(s.GetLoops(c))
	i := must[[]LoopRV](t)(s.Split(ls[0], -1, mr))
	j := must[[]LoopRV](t)(s.Split(ls[1], -1, nr))
	k := ls[2]
	outer := []LoopRV{i[0], j[0]}
	if pack {
		outer = []LoopRV{j[0], i[0]}
	}
	check.NoError(t, s.Reorder(outer[0], outer[1], k, i[1], j[1]))
	cl := must[BlockRV](t)(s.CacheWrite(c, 0, "local"))
	check.NoError(t, s.ReverseComputeAt(cl, outer[1]))
	init := must[BlockRV](t)(s.DecomposeReduction(c, k))
	check.NoError(t, s.Unroll(i[1]))
	check.NoError(t, s.Vectorize(j[1]))
	il := must[[]LoopRV](t)(s.GetLoops(init))
	check.NoError(t, s.Unroll(il[len(il)-2]))
	check.NoError(t, s.Vectorize(il[len(il)-1]))
	wl := must[[]LoopRV](t)(s.GetLoops(cl))
	check.NoError(t, s.Vectorize(wl[len(wl)-1]))
	if pack {
		// After decompose_reduction the update block reads C_local, A, B.
		bp := must[BlockRV](t)(s.CacheRead(c, 2, "global"))
		check.NoError(t, s.ComputeAt(bp, outer[0]))
		pl := must[[]LoopRV](t)(s.GetLoops(bp))
		check.NoError(t, s.Vectorize(pl[len(pl)-1]))
		check.NoError(t, s.Parallel(outer[0]))
		return
	}
	check.NoError(t, s.Parallel(must[LoopRV](t)(s.Fuse(outer[0], outer[1]))))
}

// TestMatmulRegisterBlocked expresses the benchmark's schedule (
// tiling, reorder, cache_write into a local accumulator computed at the
// tile loop, vectorize, unroll, parallel; optionally a packed panel of B)
// and checks it against the unscheduled matmul.
func TestMatmulRegisterBlocked(t *testing.T) {
	runCases(t, []schedCase{
		{name: "matmul_register_blocked", fn: func() *ir.PrimFunc { return matmul(32, 64, 16) }, apply: func(t *testing.T, s *Schedule) {
			registerBlocked(t, s, 8, 32, false)
		}},
		{name: "matmul_register_blocked_packed", fn: func() *ir.PrimFunc { return matmul(16, 64, 8) }, apply: func(t *testing.T, s *Schedule) {
			registerBlocked(t, s, 8, 32, true)
		}},
		{name: "matmul_register_blocked_ragged", fn: func() *ir.PrimFunc { return matmul(20, 40, 7) }, apply: func(t *testing.T, s *Schedule) {
			registerBlocked(t, s, 8, 16, false)
		}},
	})
}
