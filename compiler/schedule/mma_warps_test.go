package schedule

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

// mmaTiled is the schedule of a tensor-core matmul made of primitives
// only: blocks of wm × wn warps (threadIdx.y) over tiles of C of
// 16·fm·wm × 8·fn·wn, each warp fm × fn accumulators of 16×8 in
// registers across all of k; for each bk values of k the block's threads
// copy the tiles of A and B into shared memory, and for each 16 of them
// every warp loads its fragments from there and runs the fragment
// intrinsic.
func mmaTiled(fm, fn, wm, wn, bk int64) func(t *testing.T, s *Schedule) {
	return func(t *testing.T, s *Schedule) {
		c := must[BlockRV](t)(s.GetBlock("C"))
		ls := must[[]LoopRV](t)(s.GetLoops(c))
		i := must[[]LoopRV](t)(s.Split(ls[0], -1, wm, fm, 16))
		j := must[[]LoopRV](t)(s.Split(ls[1], -1, wn, fn, 8))
		k := must[[]LoopRV](t)(s.Split(ls[2], -1, bk/16, 16))
		by, bx, ko, kk := i[0], j[0], k[0], k[1]
		check.NoError(t, s.Reorder(by, bx, ko, i[1], j[1], kk, i[2], j[2], i[3], j[3], k[2]))
		check.NoError(t, s.Bind(by, "blockIdx.y"))
		check.NoError(t, s.Bind(bx, "blockIdx.x"))

		// The accumulators, in mma's layout of C, and their copy back:
		// thread (lane, warp) copies its lane of each of its warp's tiles.
		wb := must[BlockRV](t)(s.CacheWrite(c, 0, "local"))
		check.NoError(t, s.ReverseComputeAt(wb, bx))
		check.NoError(t, s.TransformLayout(c, BufferIndex{Write: true}, MmaLayoutC(), nil))
		wl := must[[]LoopRV](t)(s.GetLoops(wb))
		r := must[[]LoopRV](t)(s.Split(wl[len(wl)-2], wm, fm, 2, 8))
		q := must[[]LoopRV](t)(s.Split(wl[len(wl)-1], wn, fn, 4, 2))
		check.NoError(t, s.Reorder(r[0], q[0], r[3], q[2], r[1], q[1], r[2], q[3]))
		check.NoError(t, s.Bind(must[LoopRV](t)(s.Fuse(r[0], q[0])), "threadIdx.y"))
		check.NoError(t, s.Bind(must[LoopRV](t)(s.Fuse(r[3], q[2])), "threadIdx.x"))
		// The init, before the warps' loops are fused (a fused loop's
		// iterations are not proved distinct instances).
		init := must[BlockRV](t)(s.DecomposeReduction(c, ko))
		check.NoError(t, s.Bind(must[LoopRV](t)(s.Fuse(i[1], j[1])), "threadIdx.y"))
		il := must[[]LoopRV](t)(s.GetLoops(init))
		n := len(il)
		ir := must[[]LoopRV](t)(s.Split(il[n-2], 2, 8))
		iq := must[[]LoopRV](t)(s.Split(il[n-1], 4, 2))
		check.NoError(t, s.Reorder(ir[1], iq[0], il[n-4], il[n-3], ir[0], iq[1]))
		check.NoError(t, s.Bind(must[LoopRV](t)(s.Fuse(ir[1], iq[0])), "threadIdx.x"))
		check.NoError(t, s.Bind(must[LoopRV](t)(s.Fuse(il[n-6], il[n-5])), "threadIdx.y"))

		// The tiles of A and B in shared memory, copied by all the
		// threads of the block for each tile of k; each warp's fragments
		// from there.
		for n, layout := range []*IndexMap{MmaLayoutA(), MmaLayoutB()} {
			fr := must[BlockRV](t)(s.CacheRead(c, n+1, "local"))
			sh := must[BlockRV](t)(s.CacheRead(fr, 0, "shared"))
			check.NoError(t, s.ComputeAt(fr, kk))
			check.NoError(t, s.ComputeAt(sh, ko))
			cl := must[[]LoopRV](t)(s.GetLoops(sh))
			f := must[LoopRV](t)(s.Fuse(cl[len(cl)-2], cl[len(cl)-1]))
			parts := must[[]LoopRV](t)(s.Split(f, -1, wm*wn, 32))
			check.NoError(t, s.Reorder(parts[1], parts[2], parts[0]))
			check.NoError(t, s.Bind(parts[1], "threadIdx.y"))
			check.NoError(t, s.Bind(parts[2], "threadIdx.x"))
			check.NoError(t, s.TransformLayout(fr, BufferIndex{Write: true}, layout, nil))
			fragLanes(t, s, fr, "AB"[n])
		}
		check.NoError(t, s.Tensorize(i[3], MmaFragIntrin("fp16")))
	}
}

// TestMmaTiled: the tensor-core matmul in primitives, with several warps
// and fragments per warp and a tile of k of two steps, and odd numbers of
// tiles, against the unscheduled function in the interpreter (as
// scheduled, and as lowered, where every fragment is one thread's
// registers), replayed from its trace, and in CUDA.
func TestMmaTiled(t *testing.T) {
	for _, c := range []struct {
		name               string
		m, n, k            int64
		fm, fn, wm, wn, bk int64
		regs               string
		shared             int64
	}{
		{"one_warp", 16, 8, 16, 1, 1, 1, 1, 16, "C_local[4] A_local[8] B_local[4]", (16*16 + 16*8) * 2},
		{"warps", 96, 48, 96, 2, 3, 3, 2, 32, "C_local[24] A_local[16] B_local[12]", (96*32 + 32*48) * 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := halfMatmul(c.m, c.n, c.k)
			runCases(t, []schedCase{{name: "mma_tiled_" + c.name, fn: func() *ir.PrimFunc { return f }, apply: mmaTiled(c.fm, c.fn, c.wm, c.wn, c.bk)}})
			s, err := New(f)
			check.NoError(t, err)
			mmaTiled(c.fm, c.fn, c.wm, c.wn, c.bk)(t, s)
			low := lowerCompacted(t, s.Func())
			check.Equal(t, localAllocs(low), c.regs, "one thread's fragments")
			sameResults(t, runFunc(t, low, nil), runFunc(t, f, nil))
			src, kernels := cudaOf(t, s.Func())
			check.True(t, strings.Contains(src, "kiln_mma_m16n8k16_f32_fp16(&C_local["), "no mma on the registers in\n", src)
			check.Equal(t, len(kernels), 1)
			check.Equal(t, kernels[0].Block, [3]int64{32, c.wm * c.wn, 1})
			check.Equal(t, kernels[0].SharedBytes, c.shared)
		})
	}
}
