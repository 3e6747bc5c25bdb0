package auto

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// Pointwise (1×1, stride 1, unpadded) convolutions over NCHW data are a
// matrix product over the flattened output plane: with p = y·X + x,
// contiguous in memory for each channel,
//
//	C[n, f, p] += A[n, c, p] · W[f, c]
//
// the rule runs, in schedule primitives:
//
//	transform_block_layout: the block iterates over (n, f, p, c)
//	cache_write + transform_layout: acc[n, f, p] in "local"
//	split f by ft, split_overlap_tail p by pv vectors of lanes
//	parallel for each tile of ft output channels:
//	  for each tile of pv vectors of p (loop partitioning splits off the last):
//	    acc[ft][pv] = 0                      (decompose_reduction)
//	    for c: acc[i][v] += A[n, c, p0 + v·lanes:] · W[f0 + i, c]
//	    out[n, f0 + i, p0 + v·lanes:] = epilogue(acc[i][v])
//	                                         (reverse_compute_at)
//
// Each step loads pv vectors of A and broadcasts ft weights for ft·pv
// multiply-adds, and every store is a whole vector: rows 55, 27 or 13
// wide (squeezenet1_1's) no longer leave half-empty vectors or scalar
// tails. A plane no tile divides ends with a tile of only the vectors
// that cover the rest, moved back to end at its last element
// (split_overlap_tail), which computes some outputs a second time, the
// same values: a 13×13 plane in tiles of 3 vectors computes 11 vectors
// (three tiles and one of 2), with no guard left once the loop over
// tiles of positions is partitioned. That loop must then be serial: when
// the tiles of channels alone are fewer than those of positions, the
// tiles of both run in one parallel loop and the last tile of positions
// is a whole one moved back (split_overlap: 12 vectors on 13×13, the
// kernels about 1.1× slower).
//
// The kernel comes in OIHW (AlterConvLayout leaves those reducing few
// channels so; findRowConvs finds them, f the second spatial variable)
// or in blocks of b output channels, topi.Conv2D's conv2d_hwio stage
// with the output channels innermost,
//
//	C[n, y, x, f] += A[n, c, y, x] · W[f / b, c, 0, 0, f % b]
//
// followed by a layout change back to NCHW with the elementwise blocks
// after it (findConvs finds those: AlterConvLayout's OIHW8o for those
// reducing many input channels over rows no vector divides, squeezenet1_1's
// 512→1000 classifier). A tile is then one block, so that at each c its
// weights are one run (one cache line): an OIHW kernel's rows lie C floats
// apart, a power of two for 256 or 512 channels, which sends every row to
// the same few cache sets. Only the channels the last block writes are
// stored; a kernel padded with zero channels (sliced off after the
// convolution) computes its padding too.

// maxPointwiseVectors bounds a pointwise tile's vectors along the
// plane.
const maxPointwiseVectors = 3

// pointwiseTile picks the tile of ft output channels × pv vectors of
// lanes along a plane of P (at most limit accumulators) whose steps take
// the fewest issue slots of multiply-adds, each step at least the chains
// of multiply-adds a core keeps in flight (chains, Options.FMAChains:
// each accumulator is one chain, waiting on its last multiply-add); then
// that computes the fewest vectors (the overlap of last tiles included);
// then that has the most accumulators, then the most channels (each
// tile of channels reads the whole input once). A tile of channels need
// not divide F: the last one moves back to end at F (split_overlap),
// recomputing some channels. 116 channels (4·29) no longer take a tile
// of 4 channels × 1 vector, whose 4 accumulators left the multiply-add
// units half idle: shufflenet_v2's 1×1 convolutions of 116 and 58
// channels ran 1.46× and 1.26× faster in tiles of 9 and 12 channels ×
// 1 vector (AMD EPYC, AVX2).
func pointwiseTile(F, P, lanes, limit, chains int64) (ft, pv int64) {
	units := ceilDiv(P, lanes)
	var best [4]int64
	for v := int64(1); v <= maxPointwiseVectors && v*lanes <= P; v++ {
		for f := min(F, limit/v); f >= 1; f-- {
			tiles := ceilDiv(F, f) * ceilDiv(units, v)
			score := [4]int64{tiles * max(f*v, chains), tiles * f * v, -f * v, -f}
			if ft == 0 || slices.Compare(score[:], best[:]) < 0 {
				best, ft, pv = score, f, v
			}
		}
	}
	return ft, pv
}

// A pointwise convolution whose tiles of channels each read all of its
// input needs that input to stay in L2 between them: one with a larger
// input (Options.L2Bytes; mobilenet_v2's 112×112 32→16 projection, 1.6 MB)
// runs its tiles of positions outside, 8 channels × 3 vectors
// (streamingPointwiseTile): 1.15× faster in the model than 16 channels × 1
// vector. Its 16→96 expansion (0.8 MB of input) ran 1.5× slower with the
// tiles of positions outside: each tile of positions then stores to as
// many planes as there are channels.

// streamingPointwiseTile picks the tile for positions outside channels:
// the most vectors along the plane (up to maxPointwiseVectors), then the
// most channels dividing F that fit in limit accumulators, so that each
// step loads few weights per multiply-add; the input stays in cache
// between the tiles of channels.
func streamingPointwiseTile(F, P, lanes, limit int64) (ft, pv int64) {
	pv = min(maxPointwiseVectors, max(P/lanes, 1))
	for ft = min(F, limit/pv); F%ft != 0; ft-- {
	}
	return ft, pv
}

// packedPointwiseTile picks the vectors pv along a plane of P for tiles
// of ft channels (a block of the kernel; at most limit accumulators): the
// most, up to maxPointwiseVectors. Each step loads ft weights and pv
// vectors for ft·pv multiply-adds: 8 channels × 3 vectors ran 1.03–1.08×
// faster than × 2 on the 27×27 and 14×14 planes of squeezenet1_1 and
// mobilenet_v2, and than 20 channels × 1 vector on the 13×13 classifier.
func packedPointwiseTile(ft, P, lanes, limit int64) int64 {
	pv := int64(0)
	for v := int64(1); v <= maxPointwiseVectors && v*lanes <= P && ft*v <= limit; v++ {
		pv = v
	}
	return pv
}

// pointwiseConv is a pointwise convolution block the rule schedules.
type pointwiseConv struct {
	convBlock
	N, F, Y, X, K int64
	// hwio: the output channels innermost (C[n, y, x, f]), the kernel in
	// blocks of c.fblock.
	hwio bool
}

// schedulePointwise schedules a pointwise convolution over an OIHW
// kernel, or says why block c is not one.
func schedulePointwise(f *ir.PrimFunc, c convBlock, opts Options) (*scheduled, error) {
	if c.rows != 1 || len(c.spatial) != 4 || len(c.reduce) != 3 || c.reduce[1] != 1 || c.reduce[2] != 1 || c.dtype != ir.Float32 {
		return nil, skip("block %q is not a pointwise convolution", c.name)
	}
	return pointwiseRule(f, pointwiseConv{convBlock: c, N: c.spatial[0], F: c.spatial[1], Y: c.spatial[2], X: c.spatial[3], K: c.reduce[0]}, opts)
}

// schedulePackedPointwise schedules a pointwise convolution over a kernel
// in blocks of output channels, or says why block c is not one.
func schedulePackedPointwise(f *ir.PrimFunc, c convBlock, opts Options) (*scheduled, error) {
	if c.fblock <= 0 || len(c.spatial) != 4 || len(c.reduce) != 3 || c.reduce[1] != 1 || c.reduce[2] != 1 || c.dtype != ir.Float32 {
		return nil, skip("block %q is not a pointwise convolution over blocks of channels", c.name)
	}
	return pointwiseRule(f, pointwiseConv{convBlock: c, N: c.spatial[0], Y: c.spatial[1], X: c.spatial[2], F: c.spatial[3], K: c.reduce[0], hwio: true}, opts)
}

// pointwiseRule checks the block's form and schedules it (see above).
func pointwiseRule(f *ir.PrimFunc, p pointwiseConv, opts Options) (*scheduled, error) {
	c := p.convBlock
	br, ok := blockNamed(f, c.name)
	if !ok {
		return nil, skip("no block %q", c.name)
	}
	if err := p.match(f, br); err != nil {
		return nil, err
	}
	P := p.Y * p.X
	lanes := opts.VectorBytes / 4
	for lanes > 4 && lanes > P {
		lanes /= 2
	}
	if lanes > P {
		return nil, skip("block %q: a plane of %d", c.name, P)
	}
	limit := opts.accumulators()
	posOuter := false
	var ft, pv int64
	switch {
	case p.hwio:
		// Whole vectors along the plane, overrunning it by at most an
		// eighth (AlterConvLayout's rule for the plane), and a tile of
		// one block: larger blocks (32 channels, AlterConvLayout's for
		// the channel-vectorized rule) ran 1.3–1.7× faster there than in
		// tiles of 8 channels of the plane on mobilenet_v2's 7×7 and
		// 14×14 planes of 160 to 960 channels.
		if (P+lanes-1)/lanes*lanes*8 > P*9 {
			return nil, skip("block %q: a plane of %d", c.name, P)
		}
		ft, pv = c.fblock, packedPointwiseTile(c.fblock, P, lanes, limit)
		if pv == 0 {
			return nil, skip("block %q: blocks of %d channels take no tile", c.name, c.fblock)
		}
	case p.K*P*4 > opts.L2Bytes:
		posOuter = true
		ft, pv = streamingPointwiseTile(p.F, P, lanes, limit)
	default:
		ft, pv = pointwiseTile(p.F, P, lanes, limit, opts.FMAChains)
	}
	s, err := schedule.New(f)
	if err != nil {
		return nil, err
	}
	t, err := p.choose(s, pointwiseTiling{lanes: lanes, ft: ft, pv: pv, posOuter: posOuter}, limit, opts)
	if err != nil {
		return nil, err
	}
	if err := p.schedule(s, t); err != nil {
		return nil, err
	}
	return done(s), nil
}

// pointwiseTiling is how the rule tiles a pointwise convolution: ft
// output channels × pv vectors of lanes positions, the tiles of
// positions outside those of channels with posOuter, and the parallel
// loop (parallel).
type pointwiseTiling struct {
	lanes, ft, pv int64
	posOuter      bool
	parallel      int64
}

// The parallel loop of a pointwise convolution: none, the tiles of
// channels and positions fused, or the tiles of channels only, the tiles
// of positions a serial loop whose last tile takes only the vectors the
// plane needs (split_overlap_tail; the loop partitioned, so that no
// tile keeps a guard).
const (
	pointwiseSerial int64 = iota
	pointwiseFused
	pointwiseChannels
)

// choose makes the rule's choices from its own picks in t (limit the
// accumulators): the vectors per tile, the channels per tile (one block
// of the kernel with hwio), whether the tiles of positions run outside,
// and the parallel loop. By default a plane whose last tile would
// recompute vectors (squeezenet1_1's 13×13: 12 vectors for 11) runs its
// tiles of positions serially with a short last tile, in parallel over
// the tiles of channels, when those are at least as many.
func (p *pointwiseConv) choose(s *schedule.Schedule, t pointwiseTiling, limit int64, opts Options) (pointwiseTiling, error) {
	site := "pointwise/" + p.name + "/"
	P := p.Y * p.X
	var err error
	if !p.hwio {
		if t.posOuter, err = opts.chooseBool(s, site+"positions_outer", t.posOuter); err != nil {
			return t, err
		}
		if t.posOuter {
			t.ft, t.pv = streamingPointwiseTile(p.F, P, t.lanes, limit)
		} else {
			t.ft, t.pv = pointwiseTile(p.F, P, t.lanes, limit, opts.FMAChains)
		}
	}
	var vecs []int64
	for v := int64(1); v <= maxPointwiseVectors && v*t.lanes <= P && v <= limit && (!p.hwio || t.ft*v <= limit); v++ {
		vecs = append(vecs, v)
	}
	if t.pv, err = opts.choose(s, site+"vectors", vecs, t.pv); err != nil {
		return t, err
	}
	if !p.hwio {
		var fts []int64
		for f := min(p.F, limit/t.pv); f >= 1; f-- {
			fts = append(fts, f)
		}
		def := t.ft
		if !slices.Contains(fts, def) {
			def = fts[0]
		}
		if t.ft, err = opts.choose(s, site+"channels", fts, def); err != nil {
			return t, err
		}
	}
	units := ceilDiv(P, t.lanes)
	ptiles := ceilDiv(units, t.pv)
	ftiles := ceilDiv(p.F, t.ft)
	tiles := ftiles * ptiles
	def := pointwiseSerial
	if opts.ParallelFlops > 0 && p.F*P*p.K >= opts.ParallelFlops && tiles > 1 {
		def = pointwiseFused
		if units%t.pv != 0 && !t.posOuter && ftiles >= ptiles {
			def = pointwiseChannels
		}
	}
	t.parallel, err = opts.choose(s, site+"parallel", []int64{pointwiseSerial, pointwiseFused, pointwiseChannels}, def)
	return t, err
}

// blockNamed finds the realize of block name in f.
func blockNamed(f *ir.PrimFunc, name string) (*ir.BlockRealize, bool) {
	var out *ir.BlockRealize
	ir.Visit(f.Body, func(n ir.Node) bool {
		if br, ok := n.(*ir.BlockRealize); ok && br.Block != nil && br.Block.Name == name {
			out = br
		}
		return out == nil
	})
	return out, out != nil
}

// match checks block br of f: C[n, f, y, x] (or C[n, y, x, f]) += A[n,
// c, y, x] · W[..], A a compact parameter of the plane's shape read at
// stride 1 and W free of the position.
func (p *pointwiseConv) match(f *ir.PrimFunc, br *ir.BlockRealize) error {
	name := p.name
	b := br.Block
	st, ok := b.Body.(*ir.BufferStore)
	if !ok || len(st.Indices) != 4 {
		return skip("block %q: not a store of four indices", name)
	}
	iv := b.IterVars
	for i := range 4 {
		if !isVar(st.Indices[i], iv[i].Var) {
			return skip("block %q: output indices", name)
		}
	}
	n, fv, y, x := iv[0].Var, iv[1].Var, iv[2].Var, iv[3].Var
	if p.hwio {
		y, x, fv = iv[1].Var, iv[2].Var, iv[3].Var
	}
	rc := iv[4].Var
	a, w, ok := multiplyAccumulate(st)
	if ok && usesVar(a, fv) {
		a, w = w, a
	}
	if !ok || usesVar(a, fv) || len(a.Indices) != 4 || !isParam(f, a.Buffer) || a.Buffer.Strides != nil {
		return skip("block %q: operands", name)
	}
	if !isVar(a.Indices[0], n) || !isVar(a.Indices[1], rc) || !planeIndex(a.Indices[2], y, iv[5].Var) || !planeIndex(a.Indices[3], x, iv[6].Var) {
		return skip("block %q: not a 1×1 stride-1 unpadded convolution", name)
	}
	if h, ok := ir.IsConstInt(a.Buffer.Shape[2]); !ok || h != p.Y {
		return skip("block %q: input rows", name)
	}
	if w, ok := ir.IsConstInt(a.Buffer.Shape[3]); !ok || w != p.X {
		return skip("block %q: input columns", name)
	}
	for _, v := range []*ir.Var{n, y, x} {
		if usesVar(w, v) {
			return skip("block %q: the kernel varies with the position", name)
		}
	}
	if !p.hwio && (len(w.Indices) != 4 || !isVar(w.Indices[0], fv) || !isVar(w.Indices[1], rc)) {
		return skip("block %q: kernel not in OIHW", name)
	}
	return nil
}

// planeIndex reports an index v + r (r the 1×1 window's variable, maybe
// cast to v's dtype).
func planeIndex(e ir.Expr, v, r *ir.Var) bool {
	if isVar(e, v) {
		return true
	}
	isR := func(e ir.Expr) bool {
		if c, ok := e.(*ir.Cast); ok {
			e = c.Value
		}
		return isVar(e, r)
	}
	sum, ok := e.(*ir.Binary)
	return ok && sum.Op == ir.OpAdd && (isVar(sum.A, v) && isR(sum.B) || isR(sum.A) && isVar(sum.B, v))
}

// flatMap maps the four indices of an NCHW buffer (or NHWC with hwio)
// and extra others to the plane flattened: (n, c, y·X + x, …), or
// (n, y·X + x, c, …) with keepOrder.
func (p *pointwiseConv) flatMap(hwio, keepOrder bool, extra int) (*schedule.IndexMap, error) {
	vars := make([]string, 4+extra)
	for i := range vars {
		vars[i] = fmt.Sprintf("i%d", i)
	}
	ix := []string{"i0", "i1", fmt.Sprintf("i2 * %d + i3", p.X)}
	if hwio {
		plane := fmt.Sprintf("i1 * %d + i2", p.X)
		ix = []string{"i0", "i3", plane}
		if keepOrder {
			ix = []string{"i0", plane, "i3"}
		}
	}
	ix = append(ix, vars[4:]...)
	return schedule.ParseIndexMap(fmt.Sprintf("lambda %s: (%s)", strings.Join(vars, ", "), strings.Join(ix, ", ")))
}

// schedule applies the rule's primitives to s.
func (p *pointwiseConv) schedule(s *schedule.Schedule, t pointwiseTiling) error {
	lanes, ft, pv, posOuter := t.lanes, t.ft, t.pv, t.posOuter
	blk, err := s.GetBlock(p.name)
	if err != nil {
		return err
	}
	// The blocks after the convolution inlined into the last, which
	// must then be elementwise over the flattened plane.
	after := blocksAfter(s.Func(), p.name)
	for _, a := range after[:max(len(after)-1, 0)] {
		b, err := s.GetBlock(a)
		if err != nil {
			return err
		}
		if err := s.ComputeInline(b); err != nil {
			return skip("block %q after %q cannot be inlined: %v", a, p.name, err)
		}
	}
	if p.hwio && len(after) == 0 {
		return skip("block %q: no layout change after it", p.name)
	}
	outMap, err := p.flatMap(p.hwio, false, 0)
	if err != nil {
		return err
	}
	blockMap, err := p.flatMap(p.hwio, true, 3)
	if err != nil {
		return err
	}
	storeMap, err := p.flatMap(false, false, 0)
	if err != nil {
		return err
	}
	wb, err := s.CacheWriteLayout(blk, 0, "local", outMap, nil)
	if err != nil {
		return err
	}
	if err := s.TransformBlockLayout(blk, blockMap); err != nil {
		return err
	}
	loops, err := s.GetLoops(blk)
	if err != nil {
		return err
	}
	if len(loops) != 6 {
		return skip("block %q is nested in other loops", p.name)
	}
	n, fl, pl := loops[0], loops[1], loops[2]
	if p.hwio {
		fl, pl = loops[2], loops[1]
	}
	// A tile of channels that does not divide them ends with one moved
	// back (split_overlap); a block of the kernel divides them.
	fs, err := s.SplitOverlap(fl, -1, ft)
	if err != nil {
		return err
	}
	// Tiles of positions outside the parallel loop end with a short
	// tile, their loop partitioned.
	split := s.SplitOverlap
	if t.parallel != pointwiseFused {
		split = s.SplitOverlapTail
	}
	ps, err := split(pl, -1, pv, lanes)
	if err != nil {
		return err
	}
	outer := []schedule.LoopRV{fs[0], ps[0]}
	if posOuter {
		outer = []schedule.LoopRV{ps[0], fs[0]}
	}
	order := append([]schedule.LoopRV{n}, outer...)
	order = append(order, loops[3:]...)
	order = append(order, fs[1], ps[1], ps[2])
	if err := s.Reorder(order...); err != nil {
		return err
	}
	init, err := s.DecomposeReduction(blk, loops[3])
	if err != nil {
		return err
	}
	store := wb
	if len(after) > 0 {
		if err := s.ComputeInline(wb); err != nil {
			return skip("block %q: the write-back does not inline into %q: %v", p.name, after[len(after)-1], err)
		}
		if store, err = s.GetBlock(after[len(after)-1]); err != nil {
			return err
		}
	}
	if err := s.TransformBlockLayout(store, storeMap); err != nil {
		return skip("block %q: the block after it is not elementwise over the plane: %v", p.name, err)
	}
	// The store under the tile, vectors along the plane.
	if err := tileStore(s, store, outer[1], lanes); err != nil {
		return err
	}
	for _, u := range []schedule.LoopRV{fs[1], ps[1]} {
		if err := s.Unroll(u); err != nil {
			return err
		}
	}
	if err := s.Vectorize(ps[2]); err != nil {
		return err
	}
	il, err := s.GetLoops(init)
	if err != nil {
		return err
	}
	for _, u := range il[len(il)-3 : len(il)-1] {
		if err := s.Unroll(u); err != nil {
			return err
		}
	}
	if err := s.Vectorize(il[len(il)-1]); err != nil {
		return err
	}
	if t.parallel != pointwiseFused && ceilDiv(p.Y*p.X, lanes)%pv != 0 {
		if err := s.Annotate(ps[0], loopPartitionHint, true); err != nil {
			return err
		}
	}
	switch t.parallel {
	case pointwiseFused:
		return parallel(s, outer)
	case pointwiseChannels:
		return s.Parallel(fs[0])
	}
	return nil
}
