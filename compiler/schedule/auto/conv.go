package auto

import (
	"sort"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// Direct convolution with the output channels innermost: topi.Conv2D's
// conv2d_hwio stage (a kernel in HWIO, as AlterConvLayout arranges),
//
//	C[n, y, x, f] += A[n, c, y·s+ry, x·s+rx] · W[ry, rx, c, f]
//
// or any block of that form: spatial iteration variables, the last (f)
// indexing C and B last and A not at all, then one or more reductions.
// The kernel may also come in blocks of output channels (kernel layout
// "OIHW32o", AlterConvLayout's choice): W[f/b, c, ry, rx, f%b], so that
// the weights of a block of b channels lie one after the other and are
// read in order; the tile then covers a block (or a part of one).
// A tile of xi positions of the next-to-last spatial variable (x) × vecs
// vectors of f stays in vector registers over the whole reduction: each
// step loads vecs vectors of W, broadcasts xi elements of A and does
// xi·vecs fused multiply-adds. The reductions run in the order the
// kernel's indices take them, so that the kernel is read in order: with
// HWIO the input channel innermost (the other way the steps jump between
// the kernel's (ry, rx) planes, whose strides, a power-of-two number of
// bytes for 256 or 512 channels, send them all to the same cache sets:
// resnet18's 7×7×512 convolution took twice as long), with OIHW32o the
// window innermost, which also reads each input row for the 3×3 window
// from L1.

// convBlock is a block C[.., x, f] += A[..] * B[.., f] (or, for the row
// schedule, C[.., x] += A[..] * B[..]).
type convBlock struct {
	name    string
	dtype   ir.DType
	spatial []int64 // extents of the spatial iteration variables
	reduce  []int64 // extents of the reductions
	// rows, for the row schedule, is the spatial variable (an output
	// channel) that B uses and A does not, whose tile rows share A's
	// loads; -1 when there is none (depthwise).
	rows int
	// fblock, for the channel-vectorized schedule, is the block of
	// output channels of a blocked kernel (B[.., f/fblock, .., f%fblock]);
	// 0 when B takes f as it is.
	fblock int64
	// reduceOrder, for the channel-vectorized schedule, lists the
	// reductions in the order the kernel's indices take them, so that
	// the steps read the kernel in order.
	reduceOrder []int
}

// findConvs lists the unscheduled blocks of f of the convolution form.
func findConvs(f *ir.PrimFunc) []convBlock { return findBlocks(f, matchConv) }

func matchConv(br *ir.BlockRealize) (convBlock, bool) {
	c, f, a, w, ok := lastAxisMAC(br, 1)
	if !ok || usesVar(a, f) {
		return convBlock{}, false
	}
	if b, ok := channelBlock(w.Indices, f); ok {
		if c.spatial[len(c.spatial)-1]%b != 0 {
			return convBlock{}, false
		}
		c.fblock = b
	} else if !onlyLastUses(w.Indices, f) || !isVar(w.Indices[len(w.Indices)-1], f) {
		return convBlock{}, false
	}
	c.reduceOrder = indexOrder(br.Block.IterVars[len(c.spatial):], w.Indices)
	return c, true
}

// indexOrder lists the positions of vars in the order idx first uses
// them (those it does not use last, in their order).
func indexOrder(vars []ir.IterVar, idx []ir.Expr) []int {
	first := func(v *ir.Var) int {
		for i, ix := range idx {
			if usesVar(ix, v) {
				return i
			}
		}
		return len(idx)
	}
	order := make([]int, len(vars))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(i, j int) bool { return first(vars[order[i]].Var) < first(vars[order[j]].Var) })
	return order
}

// channelBlock reports indices that take f in blocks of b: the last is
// f % b, one other f / b, and no other uses f.
func channelBlock(idx []ir.Expr, f *ir.Var) (b int64, ok bool) {
	of := func(e ir.Expr, op ir.BinaryOp) int64 {
		d, ok := e.(*ir.Binary)
		if !ok || d.Op != op || !isVar(d.A, f) {
			return 0
		}
		c, ok := d.B.(*ir.IntImm)
		if !ok || c.Value < 1 {
			return 0
		}
		return c.Value
	}
	if len(idx) < 2 {
		return 0, false
	}
	if b = of(idx[len(idx)-1], ir.OpFloorMod); b == 0 {
		return 0, false
	}
	divs := 0
	for _, ix := range idx[:len(idx)-1] {
		switch {
		case of(ix, ir.OpFloorDiv) == b:
			divs++
		case usesVar(ix, f):
			return 0, false
		}
	}
	return b, divs == 1
}

// lastAxisMAC matches an unscheduled block C[.., v] = C[.., v] + A * B
// with v its last spatial iteration variable, at least two of those and
// minReduce reductions; it returns the block's extents, v and the loads
// of A and B.
func lastAxisMAC(br *ir.BlockRealize, minReduce int) (c convBlock, v *ir.Var, a, w *ir.BufferLoad, ok bool) {
	b := br.Block
	spatial, reduce, ok := unscheduledExtents(br)
	if !ok || len(spatial) < 2 || len(reduce) < minReduce {
		return c, nil, nil, nil, false
	}
	v = b.IterVars[len(spatial)-1].Var
	st, ok := b.Body.(*ir.BufferStore)
	if !ok || len(st.Indices) == 0 || !isVar(st.Indices[len(st.Indices)-1], v) {
		return c, nil, nil, nil, false
	}
	if a, w, ok = multiplyAccumulate(st); !ok {
		return c, nil, nil, nil, false
	}
	return convBlock{name: b.Name, dtype: st.Buffer.DType, spatial: spatial, reduce: reduce, rows: -1}, v, a, w, true
}

// onlyLastUses reports whether v appears in the last index only (which
// must be there).
func onlyLastUses(idx []ir.Expr, v *ir.Var) bool {
	if len(idx) == 0 {
		return false
	}
	for _, ix := range idx[:len(idx)-1] {
		if usesVar(ix, v) {
			return false
		}
	}
	return true
}

// unscheduledExtents returns the extents of the spatial iteration
// variables of a reduction block, then of its reductions, when every
// variable is bound to a loop variable of its own with a constant range
// from 0 (as LegalizeOps makes them) and the spatial ones come first.
func unscheduledExtents(br *ir.BlockRealize) (spatial, reduce []int64, ok bool) {
	b := br.Block
	if b.Init == nil || len(br.IterValues) != len(b.IterVars) || !isTrue(br.Predicate) {
		return nil, nil, false
	}
	for i, iv := range b.IterVars {
		ext, ok := iv.Dom.Extent.(*ir.IntImm)
		if !ok {
			return nil, nil, false
		}
		if min, _ := iv.Dom.Min.(*ir.IntImm); min == nil || min.Value != 0 {
			return nil, nil, false
		}
		if _, ok := br.IterValues[i].(*ir.Var); !ok {
			return nil, nil, false
		}
		switch {
		case iv.Kind == ir.IterSpatial && len(reduce) == 0:
			spatial = append(spatial, ext.Value)
		case iv.Kind == ir.IterReduce:
			reduce = append(reduce, ext.Value)
		default:
			return nil, nil, false
		}
	}
	return spatial, reduce, true
}

// multiplyAccumulate returns the operands of a store C = C + A * B.
func multiplyAccumulate(st *ir.BufferStore) (a, b *ir.BufferLoad, ok bool) {
	sum, ok := st.Value.(*ir.Binary)
	if !ok || sum.Op != ir.OpAdd {
		return nil, nil, false
	}
	if acc, ok := sum.A.(*ir.BufferLoad); !ok || acc.Buffer != st.Buffer {
		return nil, nil, false
	}
	prod, ok := sum.B.(*ir.Binary)
	if !ok || prod.Op != ir.OpMul {
		return nil, nil, false
	}
	a, okA := prod.A.(*ir.BufferLoad)
	b, okB := prod.B.(*ir.BufferLoad)
	return a, b, okA && okB
}

func usesVar(n ir.Node, v *ir.Var) bool {
	found := false
	ir.Visit(n, func(m ir.Node) bool {
		if x, ok := m.(*ir.Var); ok && x == v {
			found = true
		}
		return !found
	})
	return found
}

// convTile picks the register tile: lanes per vector (a power of two
// dividing F, at most the register's), vecs vectors of f and xi
// positions of x, the most multiply-adds per step that fit in limit
// accumulators, then the fewest loads.
func convTile(X, F, maxLanes, limit int64) (lanes, vecs, xi int64, ok bool) {
	for lanes = maxLanes; lanes >= 4 && F%lanes != 0; lanes /= 2 {
	}
	if lanes < 4 {
		return 0, 0, 0, false
	}
	best := int64(0)
	for v := int64(1); v <= 4 && v <= limit; v++ {
		if (F/lanes)%v != 0 {
			continue
		}
		x := largestDivisor(X, limit/v)
		if p := v * x; p > best || p == best && v+x < vecs+xi {
			best, vecs, xi = p, v, x
		}
	}
	// A prime row (13 wide) takes the whole row and one vector of
	// channels: two vectors (26 accumulators, beyond limit but within
	// the register file) spill accumulators in the loop, and
	// squeezenet1_1's 13×13 3×3 convolutions ran 1.15× slower so.
	return lanes, vecs, xi, best > 0
}

// loops returns c's block in s, its loops (spatial then reductions) and
// the vector lanes of its dtype in vectorBytes.
func (c convBlock) loops(s *schedule.Schedule, vectorBytes int64) (schedule.BlockRV, []schedule.LoopRV, int64, error) {
	blk, err := s.GetBlock(c.name)
	if err != nil {
		return blk, nil, 0, err
	}
	loops, err := s.GetLoops(blk)
	if err != nil {
		return blk, nil, 0, err
	}
	if len(loops) != len(c.spatial)+len(c.reduce) {
		return blk, nil, 0, skip("block %q is nested in other loops", c.name)
	}
	esize := int64(c.dtype.Size())
	if esize <= 0 {
		return blk, nil, 0, skip("block %q: dtype %s", c.name, c.dtype)
	}
	return blk, loops, vectorBytes / esize, nil
}

func convSchedule(s *schedule.Schedule, c convBlock, opts Options, epilogue bool) error {
	blk, loops, maxLanes, err := c.loops(s, opts.VectorBytes)
	if err != nil {
		return err
	}
	ns := len(c.spatial)
	limit := opts.accumulators()
	X, F := c.spatial[ns-2], c.spatial[ns-1]
	if c.fblock > 0 {
		F = c.fblock
	}
	lanes, vecs, xi, ok := convTile(X, F, maxLanes, limit)
	if !ok {
		return skip("block %q: %d channels take no vector tile", c.name, F)
	}
	xs, err := s.Split(loops[ns-2], -1, xi)
	if err != nil {
		return err
	}
	factors := []int64{-1, vecs, lanes}
	if c.fblock > 0 {
		// The tile stays within a block: f's outer loops are the blocks
		// and the tiles of a block.
		factors = []int64{-1, c.fblock / (vecs * lanes), vecs, lanes}
	}
	fs, err := s.Split(loops[ns-1], factors...)
	if err != nil {
		return err
	}
	// Outer loops: the spatial ones before x, f's blocks first (a block
	// of W stays in cache while the positions stream by), then x's.
	nf := len(fs) - 2
	outer := append(append([]schedule.LoopRV{}, fs[:nf]...), loops[:ns-2]...)
	order := append(append([]schedule.LoopRV{}, outer...), xs[0])
	red := make([]schedule.LoopRV, len(c.reduceOrder))
	for i, r := range c.reduceOrder {
		red[i] = loops[ns+r]
	}
	order = append(order, red...)
	if err := registerTile(s, blk, order, xs[0], red[0], []schedule.LoopRV{xs[1], fs[nf], fs[nf+1]}, lanes, epilogue); err != nil {
		return err
	}
	if opts.ParallelFlops > 0 && product(c.spatial)*product(c.reduce) >= opts.ParallelFlops {
		return parallel(s, outer)
	}
	return nil
}

func product(xs []int64) int64 {
	p := int64(1)
	for _, x := range xs {
		p *= x
	}
	return p
}

// parallel fuses loops (nested in order) and makes the result parallel;
// loops of different index types cannot fuse, and the first goes
// parallel alone.
func parallel(s *schedule.Schedule, loops []schedule.LoopRV) error {
	par, err := s.Fuse(loops...)
	if err != nil {
		par = loops[0]
	}
	return s.Parallel(par)
}

// registerTile accumulates block blk in a "local" tile over the
// reductions: its loops go in order (the loops outside the tile, tile
// loop at, the reductions from red), then tile (the tile's loops, the
// last one a vector of lanes); the tile is zeroed before red, and stored
// (through the epilogue when asked) after the reductions, both unrolled
// but for the vector.
func registerTile(s *schedule.Schedule, blk schedule.BlockRV, order []schedule.LoopRV, at, red schedule.LoopRV, tile []schedule.LoopRV, lanes int64, epilogue bool) error {
	if err := s.Reorder(append(append([]schedule.LoopRV{}, order...), tile...)...); err != nil {
		return err
	}
	wb, err := s.CacheWrite(blk, 0, "local")
	if err != nil {
		return err
	}
	init, err := s.DecomposeReduction(blk, red)
	if err != nil {
		return err
	}
	if epilogue {
		err = convEpilogue(s, wb, at, lanes)
	} else {
		err = tileStore(s, wb, at, lanes)
	}
	if err != nil {
		return err
	}
	return unrollTile(s, tile, init)
}

// unrollTile unrolls a register tile's loops and its zeroing block
// init's (their innermost n loops, n the tile's rank) but for the last,
// the vector, which it vectorizes in both.
func unrollTile(s *schedule.Schedule, tile []schedule.LoopRV, init schedule.BlockRV) error {
	il, err := s.GetLoops(init)
	if err != nil {
		return err
	}
	n := len(tile)
	unroll := append(append([]schedule.LoopRV{}, tile[:n-1]...), il[len(il)-n:len(il)-1]...)
	for _, u := range unroll {
		if err := s.Unroll(u); err != nil {
			return err
		}
	}
	for _, v := range []schedule.LoopRV{tile[n-1], il[len(il)-1]} {
		if err := s.Vectorize(v); err != nil {
			return err
		}
	}
	return nil
}

// convEpilogue computes the blocks after the accumulator's write-back on
// the tile, before anything is stored: the write-back and every
// intermediate elementwise block are inlined into the last block, which
// moves under loop at.
func convEpilogue(s *schedule.Schedule, wb schedule.BlockRV, at schedule.LoopRV, lanes int64) error {
	wbr, err := s.BlockRealize(wb)
	if err != nil {
		return err
	}
	after := blocksAfter(s.Func(), wbr.Block.Name)
	if len(after) == 0 {
		return skip("no block reads the accumulator")
	}
	if err := s.ComputeInline(wb); err != nil {
		return err
	}
	for _, name := range after[:len(after)-1] {
		b, err := s.GetBlock(name)
		if err != nil {
			return err
		}
		if err := s.ComputeInline(b); err != nil {
			return err
		}
	}
	last, err := s.GetBlock(after[len(after)-1])
	if err != nil {
		return err
	}
	return tileStore(s, last, at, lanes)
}

// blocksAfter names the blocks that follow block name in f, in order.
func blocksAfter(f *ir.PrimFunc, name string) []string {
	var out []string
	seen := false
	ir.Visit(f.Body, func(n ir.Node) bool {
		br, ok := n.(*ir.BlockRealize)
		if !ok || br.Block == nil || br.Block.Name == ir.RootBlockName {
			return true
		}
		if seen {
			out = append(out, br.Block.Name)
		} else {
			seen = br.Block.Name == name
		}
		return false
	})
	return out
}

// tileStore moves block b, which reads the accumulator tile, under loop
// at and vectorizes it along the accumulator's last axis: its loop that
// binds the variable of the accumulator's last index goes innermost,
// split into vectors of lanes (unrolled when lanes ≤ 1), the others
// unrolled, so that every access to the tile is a constant slot (it
// lives in registers).
func tileStore(s *schedule.Schedule, b schedule.BlockRV, at schedule.LoopRV, lanes int64) error {
	if err := s.ReverseComputeAt(b, at); err != nil {
		return err
	}
	br, err := s.BlockRealize(b)
	if err != nil {
		return err
	}
	var fv *ir.Var
	ir.Visit(br.Block.Body, func(n ir.Node) bool {
		if l, ok := n.(*ir.BufferLoad); ok && l.Buffer.Scope == "local" && len(l.Indices) > 0 {
			fv, _ = l.Indices[len(l.Indices)-1].(*ir.Var)
		}
		return fv == nil
	})
	if fv == nil {
		return skip("block %q does not read the accumulator at a variable", br.Block.Name)
	}
	loops, err := s.GetLoops(b)
	if err != nil {
		return err
	}
	atLoop, err := s.LoopFor(at)
	if err != nil {
		return err
	}
	var inner []schedule.LoopRV
	for i, l := range loops {
		lf, err := s.LoopFor(l)
		if err != nil {
			return err
		}
		if lf == atLoop {
			inner = loops[i+1:]
			break
		}
	}
	var fl schedule.LoopRV
	var rest []schedule.LoopRV
	found := false
	for i, l := range inner {
		lf, err := s.LoopFor(l)
		if err != nil {
			return err
		}
		bound := false
		for j, iv := range br.Block.IterVars {
			if iv.Var == fv && usesVar(br.IterValues[j], lf.Var) {
				bound = true
			}
		}
		if bound && !found {
			fl, found = inner[i], true
		} else {
			rest = append(rest, inner[i])
		}
	}
	if !found {
		return skip("block %q: no loop runs along the accumulator's last axis", br.Block.Name)
	}
	if len(rest) > 0 {
		if err := s.Reorder(append(append([]schedule.LoopRV{}, rest...), fl)...); err != nil {
			return err
		}
	}
	if lanes <= 1 {
		for _, u := range append(rest, fl) {
			if err := s.Unroll(u); err != nil {
				return err
			}
		}
		return nil
	}
	fs, err := s.Split(fl, -1, lanes)
	if err != nil {
		return err
	}
	for _, u := range append(rest, fs[0]) {
		if err := s.Unroll(u); err != nil {
			return err
		}
	}
	return s.Vectorize(fs[1])
}
