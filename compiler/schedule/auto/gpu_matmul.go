package auto

import (
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// GPU matmul tiling: each thread accumulates a tile of up to
// gpuThreadTile × gpuThreadTile elements of C in registers over all of k;
// a block has up to gpuBlockSide × gpuBlockSide threads.
const (
	gpuThreadTile = 4
	gpuBlockSide  = 16
	// gpuMinThreads is the fewest threads per block the matmul rule makes;
	// a smaller matmul (a matrix-vector product) takes the fallback rule.
	gpuMinThreads = 64
)

// bindMatmul applies the GPU matmul rule to block br when it is a 2-D
// matmul (see matchMatmul) whose sizes the tiles divide: rows are split
// into blockIdx.y × threadIdx.y × a register tile and columns into
// blockIdx.x × threadIdx.x × a register tile; the reduction runs inside
// each thread over a "local" accumulator (cache_write), initialized
// before it (decompose_reduction) and written back after it; the register
// tile's loops are unrolled. It returns the threadIdx.x loop, or ok=false
// when the rule does not apply.
func bindMatmul(s *schedule.Schedule, br *ir.BlockRealize) (schedule.LoopRV, bool, error) {
	var none schedule.LoopRV
	m, rt, ct, ty, tx, ok := gpuMatmulTiles(br)
	if !ok {
		return none, false, nil
	}
	c, err := s.GetBlock(m.name)
	if err != nil {
		return none, false, err
	}
	loops, err := s.GetLoops(c)
	if err != nil || len(loops) != 3 {
		return none, false, err
	}
	is, err := s.Split(loops[0], -1, ty, rt)
	if err != nil {
		return none, false, err
	}
	js, err := s.Split(loops[1], -1, tx, ct)
	if err != nil {
		return none, false, err
	}
	k := loops[2]
	if err := s.Reorder(is[0], js[0], is[1], js[1], k, is[2], js[2]); err != nil {
		return none, false, err
	}
	for _, b := range []struct {
		l   schedule.LoopRV
		tag string
	}{{is[0], "blockIdx.y"}, {js[0], "blockIdx.x"}, {is[1], "threadIdx.y"}, {js[1], "threadIdx.x"}} {
		if err := s.Bind(b.l, b.tag); err != nil {
			return none, false, err
		}
	}
	wb, err := s.CacheWrite(c, 0, "local")
	if err != nil {
		return none, false, err
	}
	if err := s.ReverseComputeAt(wb, js[1]); err != nil {
		return none, false, err
	}
	init, err := s.DecomposeReduction(c, k)
	if err != nil {
		return none, false, err
	}
	il, err := s.GetLoops(init)
	if err != nil {
		return none, false, err
	}
	wl, err := s.GetLoops(wb)
	if err != nil {
		return none, false, err
	}
	unroll := []schedule.LoopRV{is[2], js[2]}
	if len(il) >= 2 {
		unroll = append(unroll, il[len(il)-2], il[len(il)-1])
	}
	if len(wl) >= 2 {
		unroll = append(unroll, wl[len(wl)-2], wl[len(wl)-1])
	}
	for _, u := range unroll {
		if err := s.Unroll(u); err != nil {
			return none, false, err
		}
	}
	return js[1], true, nil
}

// gpuMatmulTiles reports whether br is a 2-D matmul the GPU matmul rule
// takes, with its register tile (rt × ct) and threads (ty × tx).
func gpuMatmulTiles(br *ir.BlockRealize) (m matmulBlock, rt, ct, ty, tx int64, ok bool) {
	m, ok = matchMatmul(br)
	if !ok || len(m.extents) != 3 {
		return m, 0, 0, 0, 0, false
	}
	M, N := m.extents[0], m.extents[1]
	rt, ct = largestDivisor(M, gpuThreadTile), largestDivisor(N, gpuThreadTile)
	ty, tx = largestDivisor(M/rt, gpuBlockSide), largestDivisor(N/ct, gpuBlockSide)
	return m, rt, ct, ty, tx, ty*tx >= gpuMinThreads
}
