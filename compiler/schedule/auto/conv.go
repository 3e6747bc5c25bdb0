package auto

import (
	"slices"
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

// convTile picks the register tile with regs vector registers: lanes
// per vector (a power of two dividing F, at most the register's), vecs
// vectors of f (a divisor of F's vectors, at most 4) and xi positions
// of x (convPositions), the most multiply-adds per step; ties go to the
// fewest loads.
func convTile(X, F, maxLanes, regs int64) (lanes, vecs, xi int64, ok bool) {
	for lanes = maxLanes; lanes >= 4 && F%lanes != 0; lanes /= 2 {
	}
	if lanes < 4 {
		return 0, 0, 0, false
	}
	for v := int64(1); v <= 4; v++ {
		if (F/lanes)%v != 0 {
			continue
		}
		x := convPositions(X, v, regs)
		if x > 0 && (vecs == 0 || convBetter(X, v, x, vecs, xi)) {
			vecs, xi = v, x
		}
	}
	return lanes, vecs, xi, vecs > 0
}

// convPositions picks the positions of a register tile of vecs vectors
// of channels over a row of X with regs vector registers, 0 when none
// fits: vecs·xi accumulators within three quarters of the file, and
// beside them the step's operands (vecs vectors of the kernel, xi
// broadcasts of the input) but one, a kernel vector read as the
// multiply-add's memory operand. A count that does not divide the row
// ends with a tile that overlaps the one before (SplitOverlap), whose
// recomputed positions count against it (5 over 56 run 60); the count
// with the most accumulators per position it computes wins, ties going
// to an exact divisor, then to fewer positions (fewer loads). On AVX2's
// 16 registers that makes 2 vectors × 5 positions: resnet18's 56- and
// 28-wide rows ran 1.2–1.3× faster so than with 2 × 4 (a divisor, 8
// accumulators), and 2 × 6 (12 accumulators and 8 operands) spills
// accumulators in the loop, as AVX-512's 2 × 11 does where 2 × 10 does
// not.
func convPositions(X, vecs, regs int64) int64 {
	limit := max(1, regs*3/4)
	best := int64(0)
	for x := int64(1); x <= min(X, limit/vecs) && vecs*x+vecs+x-1 <= regs; x++ {
		if best == 0 || convBetter(X, vecs, x, vecs, best) {
			best = x
		}
	}
	return best
}

// convBetter reports whether a tile of v vectors × x positions over a
// row of X does more multiply-adds per position computed than one of
// w × y (a last tile that overlaps the one before recomputes
// positions), or as many with an exact divisor, or with fewer loads.
func convBetter(X, v, x, w, y int64) bool {
	runX, runY := (X+x-1)/x*x, (X+y-1)/y*y
	if a, b := v*x*runY, w*y*runX; a != b { // v·x·X/runX vs w·y·X/runY
		return a > b
	}
	if exX, exY := X%x == 0, X%y == 0; exX != exY {
		return exX
	}
	return v+x < w+y
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
	if slices.Min(c.spatial) < 1 || slices.Min(c.reduce) < 1 {
		return blk, nil, 0, skip("block %q has an empty axis", c.name)
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
	site := func(what string) string { return RuleConv + "/" + c.name + "/" + what }
	pad := padProducer(s.Func(), c.name)
	ns := len(c.spatial)
	limit := opts.accumulators()
	regs := opts.withDefaults().VectorRegisters
	X, F := c.spatial[ns-2], c.spatial[ns-1]
	if c.fblock > 0 {
		F = c.fblock
	}
	lanes, vecs, xi, ok := convTile(X, F, maxLanes, regs)
	if !ok {
		return skip("block %q: %d channels take no vector tile", c.name, F)
	}
	// The tile: lanes per vector, vectors of channels, positions; each
	// default is convTile's pick for the choices before it.
	if lanes, err = opts.choose(s, site("lanes"), vectorLanes(F, maxLanes), lanes); err != nil {
		return err
	}
	_, vecs, _, _ = convTile(X, F, lanes, regs)
	if vecs, err = opts.choose(s, site("vectors"), divisorsUpTo(F/lanes, limit), vecs); err != nil {
		return err
	}
	// Positions that do not divide the row end with a tile that
	// overlaps the one before (SplitOverlap).
	xi = max(1, convPositions(X, vecs, regs))
	if xi, err = opts.choose(s, site("positions"), withSize(tileSizes(X, limit/vecs), xi), xi); err != nil {
		return err
	}
	if epilogue, err = chooseEpilogue(s, c, opts, site("epilogue"), epilogue); err != nil {
		return err
	}
	split := s.Split
	if X%xi != 0 {
		split = s.SplitOverlap
	}
	xs, err := split(loops[ns-2], -1, xi)
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
	// of W stays in cache while the positions stream by), or last (a
	// row of A stays in cache while the blocks of W go by), then x's.
	nf := len(fs) - 2
	channelsOuter, err := opts.chooseBool(s, site("channels_outer"), true)
	if err != nil {
		return err
	}
	outer := append(append([]schedule.LoopRV{}, fs[:nf]...), loops[:ns-2]...)
	if !channelsOuter {
		outer = append(append([]schedule.LoopRV{}, loops[:ns-2]...), fs[:nf]...)
	}
	tile := []schedule.LoopRV{xs[1], fs[nf], fs[nf+1]}
	if err := c.tileOverReductions(s, blk, loops[ns:], append(outer, xs[0]), tile, c.reduceOrder, lanes, epilogue, opts, site); err != nil {
		return err
	}
	par, err := padStage(s, site("padding"), pad, append(outer, xs[0]), opts)
	if err != nil {
		return err
	}
	if X%xi != 0 {
		par = par[:min(len(par), len(outer))] // xs[0] recomputes its last iteration
	}
	work := product(c.spatial) * product(c.reduce)
	threads := opts.ParallelFlops > 0 && work >= opts.ParallelFlops
	if pad == "" {
		if err := channelsBesideRows(s, blk, site("input_rows"), threads, opts); err != nil {
			return err
		}
	}
	return chooseParallel(s, site("parallel"), par, len(outer), threads, opts)
}

// channelsBesideRows copies the input of a convolution whose only
// reduction that steps is the input channel (a 1×1 window), read where
// it is (no padding stage), into a buffer with the channels next to the
// positions of a row: A[n, c, y, x] becomes A'[n, y, c, x]. Each step of
// the register tile broadcasts a few consecutive positions of one
// channel's row; in NCHW the next channel's are a whole plane further,
// so that every step touches a new cache line and a new stretch of
// pages. In the copy a tile's steps walk one run of memory. The copy is
// one pass over the input (1/F of the multiply-adds for F output
// channels), parallel when the convolution is, and a choice (site).
func channelsBesideRows(s *schedule.Schedule, blk schedule.BlockRV, site string, threads bool, opts Options) error {
	br, err := s.BlockRealize(blk)
	if err != nil {
		return err
	}
	st, _ := br.Block.Body.(*ir.BufferStore)
	if st == nil {
		return nil
	}
	a, _, ok := multiplyAccumulate(st)
	if !ok || !isParam(s.Func(), a.Buffer) || len(a.Indices) < 3 {
		return nil
	}
	// d: the dimension of A that the one stepping reduction indexes.
	d, n := -1, len(a.Indices)
	for _, iv := range br.Block.IterVars {
		if iv.Kind != ir.IterReduce {
			continue
		}
		if ext, _ := iv.Dom.Extent.(*ir.IntImm); ext != nil && ext.Value == 1 {
			continue
		}
		if d >= 0 {
			return nil // a window of more than one position
		}
		for i, ix := range a.Indices {
			if isVar(ix, iv.Var) {
				d = i
			}
		}
		if d < 0 {
			return nil
		}
	}
	if d < 0 || d >= n-2 || a.Buffer.Shape[n-2] == nil {
		return nil
	}
	if rows, ok := a.Buffer.Shape[n-2].(*ir.IntImm); !ok || rows.Value < 2 {
		return nil
	}
	on, err := opts.chooseBool(s, site, true)
	if err != nil || !on {
		return err
	}
	i, err := readIndex(s, blk, a.Buffer)
	if err != nil {
		return err
	}
	m := schedule.NewIndexMap(n, func(ix ...ir.Expr) []ir.Expr {
		out := append(append([]ir.Expr{}, ix[:d]...), ix[d+1:n-1]...)
		return append(out, ix[d], ix[n-1])
	})
	cp, err := s.CacheReadLayout(blk, i, "global", m, nil)
	if err != nil || !threads {
		return err
	}
	loops, err := s.GetLoops(cp)
	if err != nil {
		return err
	}
	return parallel(s, loops[:d+1])
}

// tileOverReductions accumulates block blk (block c) in a register tile
// (registerTile) over its reduction loops red, in the order chosen
// (def, positions in red, the rule's own), under the loops outer (the
// last the one the tile is stored under) and over the tile's loops, and
// chooses the steps of the reductions unrolled.
func (c convBlock) tileOverReductions(s *schedule.Schedule, blk schedule.BlockRV, red, outer, tile []schedule.LoopRV, def []int, lanes int64, epilogue bool, opts Options, site func(string) string) error {
	redOrder, err := chooseReduceOrder(s, site("reduce_order"), c.reduce, def, opts)
	if err != nil {
		return err
	}
	ordered := make([]schedule.LoopRV, len(redOrder))
	ext := make([]int64, len(redOrder))
	for i, r := range redOrder {
		ordered[i], ext[i] = red[r], c.reduce[r]
	}
	order := append(slices.Clone(outer), ordered...)
	if err := registerTile(s, blk, order, outer[len(outer)-1], ordered[0], tile, lanes, epilogue); err != nil {
		return err
	}
	return unrollReduction(s, site("unroll"), ordered, ext, opts)
}

// vectorLanes lists the lanes a vector of channels may take: the powers
// of two of at least 4, at most maxLanes, that divide F.
func vectorLanes(F, maxLanes int64) []int64 {
	var out []int64
	for l := maxLanes; l >= 4; l /= 2 {
		if F%l == 0 {
			out = append(out, l)
		}
	}
	return out
}

// tileSizes lists the sizes of a tile of a loop of n iterations, at most
// limit: the divisors of n, and the sizes beyond the largest of them,
// whose last tile overlaps the one before (SplitOverlap).
func tileSizes(n, limit int64) []int64 {
	out := divisorsUpTo(n, limit)
	for d := largestDivisor(n, limit) + 1; d <= min(n, limit); d++ {
		out = append(out, d)
	}
	return out
}

// withSize adds size n to the sorted sizes of a tile where they lack it.
func withSize(sizes []int64, n int64) []int64 {
	i, found := slices.BinarySearch(sizes, n)
	if found {
		return sizes
	}
	return slices.Insert(slices.Clone(sizes), i, n)
}

// upTo lists 1 to n.
func upTo(n int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i + 1)
	}
	return out
}

// divisorsUpTo lists the divisors of n that are at most limit, in
// increasing order.
func divisorsUpTo(n, limit int64) []int64 {
	var out []int64
	for d := int64(1); d <= min(n, limit); d++ {
		if n%d == 0 {
			out = append(out, d)
		}
	}
	return out
}

// chooseEpilogue asks whether the blocks after block c run on its
// register tile (epilogue, the rule's own pick where the primitives
// allow it) when there are blocks after it; a choice of no epilogue
// where the rule tries one is a refusal that withEpilogue answers with
// the schedule without it (which asks again, to record the choice).
func chooseEpilogue(s *schedule.Schedule, c convBlock, opts Options, site string, epilogue bool) (bool, error) {
	if len(blocksAfter(s.Func(), c.name)) == 0 {
		return epilogue, nil
	}
	on, err := opts.chooseBool(s, site, true)
	if err != nil {
		return false, err
	}
	if epilogue && !on {
		return false, skip("block %q: the epilogue stays off the tile (chosen)", c.name)
	}
	return epilogue, nil
}

// chooseReduceOrder chooses the order of the reductions (positions in
// reduce): def first, then the other orders of the reductions of more
// than one step (those of one step keep their place among them).
func chooseReduceOrder(s *schedule.Schedule, site string, reduce []int64, def []int, opts Options) ([]int, error) {
	key := func(p []int) string {
		k := ""
		for _, r := range p {
			if reduce[r] > 1 {
				k += string(rune('a' + r))
			}
		}
		return k
	}
	orders := [][]int{def}
	seen := map[string]bool{key(def): true}
	for _, p := range permutations(len(reduce)) {
		if k := key(p); !seen[k] {
			seen[k] = true
			orders = append(orders, p)
		}
	}
	cands := make([]int64, len(orders))
	for i := range cands {
		cands[i] = int64(i)
	}
	i, err := opts.choose(s, site, cands, 0)
	if err != nil {
		return nil, err
	}
	return orders[i], nil
}

// permutations lists the orders of 0..n-1.
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}

// maxUnrolledSteps bounds the steps of a reduction that a register
// tile's loop body is unrolled into (each step is the tile's
// multiply-adds, up to Options.accumulators of them), so that unrolled
// loop bodies stay a few hundred instructions.
const maxUnrolledSteps = 16

// unrollReduction chooses how many steps of the reductions red (their
// extents ext, outermost first) one pass of the innermost loop body
// makes: 1 (the rule's own), the steps of the innermost loops unrolled
// whole, or the innermost loop split by a divisor of its extent and the
// inner part unrolled; at most maxUnrolledSteps.
func unrollReduction(s *schedule.Schedule, site string, red []schedule.LoopRV, ext []int64, opts Options) error {
	n := len(red)
	cands := []int64{1}
	whole := map[int64]int{} // steps → the innermost loops unrolled whole
	p := int64(1)
	for k := 1; k <= n; k++ {
		p *= ext[n-k]
		if p > maxUnrolledSteps {
			break
		}
		if p > 1 {
			cands = append(cands, p)
			whole[p] = k
		}
	}
	for u := int64(2); u < ext[n-1] && u <= maxUnrolledSteps; u++ {
		if ext[n-1]%u == 0 {
			cands = append(cands, u)
		}
	}
	steps, err := opts.choose(s, site, cands, 1)
	if err != nil || steps == 1 {
		return err
	}
	if k, ok := whole[steps]; ok {
		for _, l := range red[n-k:] {
			if err := s.Unroll(l); err != nil {
				return err
			}
		}
		return nil
	}
	parts, err := s.Split(red[n-1], -1, steps)
	if err != nil {
		return err
	}
	return s.Unroll(parts[1])
}

// padStage chooses where block pad, a convolution's input producer
// (the padding stage of a convolution with padding), is computed: all of
// it before the convolution (the rule's own), inlined into the
// convolution's loads (no copy, a bounds check per load), or the part
// each iteration of one of the loops of nest (the loops around the
// register tile, outermost first) reads, under it (a copy that stays in
// cache). It returns the loops of nest that can still fuse into one
// (those down to the one the padding went under).
func padStage(s *schedule.Schedule, site string, pad string, nest []schedule.LoopRV, opts Options) ([]schedule.LoopRV, error) {
	if pad == "" {
		return nest, nil
	}
	cands := []int64{0, 1}
	for i := range nest {
		cands = append(cands, int64(2+i))
	}
	where, err := opts.choose(s, site, cands, 0)
	if err != nil || where == 0 {
		return nest, err
	}
	b, err := s.GetBlock(pad)
	if err != nil {
		return nil, err
	}
	if where == 1 {
		return nest, s.ComputeInline(b)
	}
	return nest[:where-1], s.ComputeAt(b, nest[where-2])
}

// padProducer names the block that writes block name's first operand
// when it is a spatial block of f writing an intermediate that only
// block name reads (a convolution's padding), or "".
func padProducer(f *ir.PrimFunc, name string) string {
	var buf *ir.Buffer
	blocks := topBlocks(f)
	for _, br := range blocks {
		if br.Block.Name != name {
			continue
		}
		ir.Visit(br.Block.Body, func(n ir.Node) bool {
			if st, ok := n.(*ir.BufferStore); ok {
				if a, _, ok := multiplyAccumulate(st); ok {
					buf = a.Buffer
				}
			}
			return buf == nil
		})
	}
	if buf == nil || isParam(f, buf) {
		return ""
	}
	producer := ""
	for _, br := range blocks {
		st, ok := br.Block.Body.(*ir.BufferStore)
		if ok && st.Buffer == buf && isSpatial(br.Block) && br.Block.Name != name {
			producer = br.Block.Name
			continue
		}
		reads := false
		ir.Visit(br.Block, func(n ir.Node) bool {
			if l, ok := n.(*ir.BufferLoad); ok && l.Buffer == buf {
				reads = true
			}
			return !reads
		})
		if reads && br.Block.Name != name {
			return ""
		}
	}
	return producer
}

// chooseParallel chooses how many of loops (nested in order, the
// outermost first) are fused into one parallel loop: def of them when
// the rule's threshold says to (on), else none; any number from none to
// all when the target runs threads (Options.ParallelFlops > 0).
func chooseParallel(s *schedule.Schedule, site string, loops []schedule.LoopRV, def int, on bool, opts Options) error {
	if !on {
		def = 0
	}
	def = min(def, len(loops))
	cands := []int64{0}
	if opts.ParallelFlops > 0 {
		for k := 1; k <= len(loops); k++ {
			cands = append(cands, int64(k))
		}
	}
	k, err := opts.choose(s, site, cands, int64(def))
	if err != nil || k == 0 {
		return err
	}
	if k == 1 {
		return s.Parallel(loops[0])
	}
	return parallel(s, loops[:k])
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
