package auto

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// Global pooling: a sum or maximum over the whole of each channel's plane
// of NCHW data,
//
//	C[n, c, 0, 0] op= A[n, c, ry, rx]
//
// (GlobalAveragePool's mean, the sum before its division) reads each
// plane as one run of H·W consecutive elements: the window's loops are
// fused into one of H·W and split into vectors of L lanes, and rfactor
// over the lanes makes a vector of L partial results per channel
// (C_rf), its init decomposed before the loop over vectors; the
// write-back, moved under the channel's loop, combines the lanes, and
// the epilogue (the division) follows it there. Both buffers are local
// (a vector and a scalar per channel once compacted). L is by default
// the widest vector (down to 4 lanes); on a run it does not divide (7·7,
// 13·13) the lanes past the run are guarded, and the loop over vectors
// is annotated for loop partitioning (partition_loops), which splits off
// the last vector: the whole vectors run unguarded, the last is a short
// tail with the guard (a guard left in every vector keeps them all
// scalar, 2–2.5× slower on 13·13 planes).

// scheduleGlobalPool returns f rewritten by the rule above, or an error
// when block c is not a global pooling.
func scheduleGlobalPool(f *ir.PrimFunc, c convBlock, opts Options) (*scheduled, error) {
	if len(c.spatial) != 4 || c.spatial[2] != 1 || c.spatial[3] != 1 || len(c.reduce) != 2 || c.dtype != ir.Float32 {
		return nil, skip("block %q is not a global pooling", c.name)
	}
	s, err := inlinedAfter(f, c.name)
	if err != nil {
		return nil, err
	}
	g := s.Func()
	blocks := topBlocks(g)
	if len(blocks) > 2 || blocks[0].Block.Name != c.name {
		return nil, skip("block %q: other blocks", c.name)
	}
	b := blocks[0].Block
	st := b.Body.(*ir.BufferStore)
	r, ok := reduction(b, st)
	if !ok {
		return nil, skip("block %q: not a reduction", c.name)
	}
	a, ok := r.term.(*ir.BufferLoad)
	if !ok || !isParam(g, a.Buffer) || len(a.Indices) != 4 {
		return nil, skip("block %q: not a load of a parameter", c.name)
	}
	iv := b.IterVars
	for i, v := range []*ir.Var{iv[0].Var, iv[1].Var, iv[4].Var, iv[5].Var} {
		if !isVar(a.Indices[i], v) {
			return nil, skip("block %q: not a whole plane", c.name)
		}
	}
	shape, ok := constShape(a.Buffer)
	if !ok || shape[0] != c.spatial[0] || shape[1] != c.spatial[1] || shape[2] != c.reduce[0] || shape[3] != c.reduce[1] {
		return nil, skip("block %q: not a whole plane", c.name)
	}
	var epilogue string
	if len(blocks) == 2 {
		e := blocks[1].Block
		est, ok := e.Body.(*ir.BufferStore)
		if !ok || !isParam(g, est.Buffer) || len(est.Indices) != 4 || len(e.IterVars) != 4 {
			return nil, skip("the block after %q is not elementwise", c.name)
		}
		for i, ix := range est.Indices {
			if !isVar(ix, e.IterVars[i].Var) {
				return nil, skip("the block after %q is not elementwise", c.name)
			}
		}
		epilogue = e.Name
	} else if !isParam(g, st.Buffer) {
		return nil, skip("block %q writes an intermediate", c.name)
	}
	N, C, K := shape[0], shape[1], shape[2]*shape[3]
	lanes := opts.VectorBytes / 4
	for lanes > 4 && lanes > K {
		lanes /= 2
	}
	parallel := opts.ParallelFlops > 0 && N*C*K >= genericParallelFactor*opts.ParallelFlops
	if err := globalPoolSchedule(s, c.name, epilogue, lanes, K, parallel); err != nil {
		return nil, err
	}
	return done(s), nil
}

// globalPoolSchedule applies the global pooling rule to block name of s
// (loops n, c, 1, 1, ry, rx, plane iterations in all) and its
// elementwise epilogue (none when ""), with vectors of up to the given
// lanes.
func globalPoolSchedule(s *schedule.Schedule, name, epilogue string, lanes, plane int64, parallel bool) error {
	b, loops, err := blockLoops(s, name)
	if err != nil {
		return err
	}
	if len(loops) != 6 {
		return fmt.Errorf("block %q has %d loops, want 6", name, len(loops))
	}
	// The lanes, a choice the tuner may change (the vector's width and
	// halves of it).
	lanes, err = sampleLanes(s, lanes)
	if err != nil {
		return err
	}
	fused, err := s.Fuse(loops[4], loops[5])
	if err != nil {
		return err
	}
	vec, err := s.Split(fused, -1, lanes)
	if err != nil {
		return err
	}
	rf, err := s.RFactor(vec[1], -1)
	if err != nil {
		return err
	}
	at := loops[3]
	if err := s.ReverseComputeAt(b, at); err != nil {
		return err
	}
	if epilogue != "" {
		e, err := s.GetBlock(epilogue)
		if err != nil {
			return err
		}
		if err := s.ReverseComputeAt(e, at); err != nil {
			return err
		}
	}
	init, err := s.DecomposeReduction(rf, vec[0])
	if err != nil {
		return err
	}
	if err := vectorizeLast(s, init); err != nil {
		return err
	}
	if err := s.Vectorize(vec[1]); err != nil {
		return err
	}
	// The whole vectors run unguarded, the last (the run's remainder)
	// is a loop of its own.
	if plane%lanes != 0 {
		if err := s.Annotate(vec[0], loopPartitionHint, true); err != nil {
			return err
		}
	}
	wl, err := s.GetLoops(b)
	if err != nil {
		return err
	}
	if _, err := s.DecomposeReduction(b, wl[len(wl)-1]); err != nil {
		return err
	}
	if err := s.Unroll(wl[len(wl)-1]); err != nil {
		return err
	}
	if err := s.SetScope(rf, 0, "local"); err != nil {
		return err
	}
	if epilogue != "" {
		if err := s.SetScope(b, 0, "local"); err != nil {
			return err
		}
	}
	if parallel {
		return s.Parallel(loops[1])
	}
	return nil
}

// inlinedAfter returns a schedule of f with the elementwise blocks after
// block name inlined into the last of them (see inlineAfterIn).
func inlinedAfter(f *ir.PrimFunc, name string) (*schedule.Schedule, error) {
	s, err := schedule.New(f)
	if err != nil {
		return nil, err
	}
	if err := inlineAfterIn(s, name); err != nil {
		return nil, err
	}
	return s, nil
}

// sampleLanes makes the lanes of the vectors over a loop a
// decision among lanes and its halves down to 4, by default the widest
// (a vector that does not divide the loop is guarded, the loop partitioned).
func sampleLanes(s *schedule.Schedule, lanes int64) (int64, error) {
	var cands []int64
	var probs []float64
	for l := lanes; l >= min(lanes, 4); l /= 2 {
		cands, probs = append(cands, l), append(probs, 1)
	}
	return s.SampleCategorical(nil, cands, probs, 0)
}

// vectorizeLast vectorizes the innermost loop of block b.
func vectorizeLast(s *schedule.Schedule, b schedule.BlockRV) error {
	loops, err := s.GetLoops(b)
	if err != nil {
		return err
	}
	return s.Vectorize(loops[len(loops)-1])
}

// constShape returns b's extents when they are all constants.
func constShape(b *ir.Buffer) ([]int64, bool) {
	out := make([]int64, len(b.Shape))
	for i, e := range b.Shape {
		v, ok := ir.IsConstInt(e)
		if !ok {
			return nil, false
		}
		out[i] = v
	}
	return out, true
}

// Pooling windows without padding (squeezenet1_1's 3×3 stride-2 max
// pools), C[n, c, y, x] op= A[n, c, y·sy+ry, x·sx+rx], read their input
// where it is, in schedule primitives:
//
//	split_overlap x by v vectors of lanes
//	for n, c, y, each tile of v vectors along the row:
//	  acc[v] = init                          (decompose_reduction)
//	  for ry, rx (unrolled): acc[i] op= A[n, c, y·sy+ry, (x0 + i·lanes:)·sx+rx]
//	  out[n, c, y, x0 + i·lanes:] = epilogue(acc[i])
//	                                         (cache_write, reverse_compute_at)
//
// each term a vector load of A's row with a stride of sx (every other
// element for a stride of 2: two loads and a shuffle, codegen/c). A row
// no tile divides ends with a tile moved back to end at the row's end
// (split_overlap), overlapping the one before it. The elementwise blocks
// after the window (an average's division) run on the vectors before
// they are stored. The choices: the vectors per tile (one by default:
// a 3×3 window's nine loads per vector keep the load ports busy) and the
// parallel loop (the channels, or the channels and rows fused).

// maxPoolVectors bounds the vectors of a pooling tile along a row.
const maxPoolVectors = 4

// schedulePoolRows returns f rewritten by the rule above, or an error
// when block c is not an unpadded pooling window.
func schedulePoolRows(f *ir.PrimFunc, c convBlock, opts Options) (*scheduled, error) {
	if c.rows >= 0 || len(c.spatial) != 4 || len(c.reduce) != 2 || c.dtype != ir.Float32 {
		return nil, skip("block %q is not a pooling window", c.name)
	}
	_, d, err := matchPlaneFunc(f, c)
	if err != nil {
		return nil, err
	}
	if d.w != nil || d.pad != nil {
		return nil, skip("block %q is not a pooling window without padding", c.name)
	}
	if d.offY < 0 || d.offX < 0 || (d.Y-1)*d.sy+d.KH-1+d.offY >= d.srcH || (d.X-1)*d.sx+d.KW-1+d.offX >= d.srcW {
		return nil, skip("block %q: windows past the input", c.name)
	}
	lanes := opts.VectorBytes / 4
	for lanes > 4 && lanes > d.X {
		lanes /= 2
	}
	if lanes > d.X {
		return nil, skip("block %q: rows of %d take no vectors", c.name, d.X)
	}
	return withEpilogue(f, func(s *schedule.Schedule, epilogue bool) error {
		return poolRowsSchedule(s, c, d, lanes, opts, epilogue)
	})
}

// poolRowsSchedule applies the pooling rows rule to block c of s (loops
// n, c, y, x, ry, rx), with the blocks after it on the vectors when
// epilogue is set.
func poolRowsSchedule(s *schedule.Schedule, c convBlock, d *depthwisePlane, lanes int64, opts Options, epilogue bool) error {
	blk, loops, err := blockLoops(s, c.name)
	if err != nil {
		return err
	}
	if len(loops) != 6 {
		return skip("block %q is nested in other loops", c.name)
	}
	var vecs []int64
	for v := int64(1); v <= maxPoolVectors && v*lanes <= d.X; v++ {
		vecs = append(vecs, v)
	}
	site := "pool/" + c.name + "/"
	v, err := opts.choose(s, site+"vectors", vecs, 1)
	if err != nil {
		return err
	}
	// 0: serial, 1: the channels, 2: the channels and rows fused.
	par := int64(0)
	if opts.ParallelFlops > 0 && d.C*d.Y*d.X*d.KH*d.KW*8 >= opts.ParallelFlops && d.C > 1 {
		par = 1
	}
	if par, err = opts.choose(s, site+"parallel", []int64{0, 1, 2}, par); err != nil {
		return err
	}
	xs, err := s.SplitOverlap(loops[3], -1, v, lanes)
	if err != nil {
		return err
	}
	order := []schedule.LoopRV{loops[0], loops[1], loops[2], xs[0], loops[4], loops[5]}
	if err := registerTile(s, blk, order, xs[0], loops[4], xs[1:], lanes, epilogue); err != nil {
		return err
	}
	// The window's taps, unrolled: each a load at a constant offset.
	for _, u := range loops[4:] {
		if err := s.Unroll(u); err != nil {
			return err
		}
	}
	switch par {
	case 1:
		return s.Parallel(loops[1])
	case 2:
		return parallel(s, loops[1:3])
	}
	return nil
}
