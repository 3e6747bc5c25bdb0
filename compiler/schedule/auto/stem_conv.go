package auto

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// A network's first convolution (its stem) reads few input channels (3:
// an image's colours) with a stride of 2, and writes many (32 or 64) in
// NCHW: squeezenet1_1's 3×3 and mobilenet_v2's, resnet18's 7×7 after a
// padding of 3. The channel-vectorized tile (conv.go) has only 3·kh·kw
// steps to amortize its tile over there, holds a tile of positions no
// larger than the row's divisors allow (3 of squeezenet's 111) and stores
// each vector of channels across 16 planes. This rule vectorizes along
// the output row instead:
//
//	for n, parallel for y:
//	  S = the kh input rows of each channel that row y reads, padded, a
//	      stride of sx stored as sx phases (even and odd columns apart),
//	      so that every tap reads consecutive elements
//	  for each tile of fi output channels × xv vectors of positions x:
//	    acc[fi][xv] = 0                                   (registers)
//	    for c, ry, rx: acc[i][j] += W[f+i, c, ry, rx] · S[c, ry, rx, x+j]
//	    out[n, f+i, y, x+j] = epilogue(acc[i][j])         (whole vectors)
//
// in schedule primitives:
//
//	compute_inline      the elementwise blocks after the convolution into
//	                    the last one
//	cache_read_layout   the kernel packed, W[f, c, ry, rx] at
//	                    (f // fi, c, ry, rx, f % fi): a tap's fi weights
//	                    side by side, read in order
//	transform_layout    a stride of sx: the padded input's columns w at
//	                    (w % sx, h, w // sx), so that every tap reads
//	                    consecutive elements (cache_read_layout when the
//	                    convolution reads a parameter; rows of stride 1
//	                    without padding are read where they are)
//	cache_write_layout  the accumulators in "local", x innermost
//	split, split_overlap, reorder
//	                    rows of the strip outside channel tiles outside
//	                    tiles of the row, the window, then the register
//	                    tile fi × xv × lanes; a row no tile divides ends
//	                    with a tile moved back to end at the row's end
//	                    (the positions it computes twice get the same
//	                    values), so every load and store is a whole vector
//	decompose_reduction, compute_inline, reverse_compute_at
//	                    the tile zeroed, accumulated, and stored through
//	                    the epilogue, unrolled and vectorized along x
//	compute_at          the strip under the rows' loop, its phases
//	                    unrolled outermost, rows and columns annotated
//	                    pragma_loop_partition_hint so that lowering
//	                    leaves its interior a plain copy
//	unroll              the taps along the row
//	parallel            the rows, above Options.ParallelFlops
//
// Each tap loads xv vectors of S once for fi broadcast weights, and the
// tile's sums stay in registers over all C·kh·kw steps, where the
// channel-vectorized tile would have only those few steps to amortize
// storing vectors of channels across planes (1.6–1.8× slower on 3×3
// stems).
//
// The choices (Options.Decide), each the rule's own pick by default:
//
//	stem/B/lanes    the vector: the target's, halved while wider than
//	                the row
//	stem/B/vectors  xv, vectors of positions per tile (1–4 within the
//	                row): the fewest vectors computed per row
//	stem/B/channels fi, output channels per tile (a divisor of F, fi·xv
//	                within the accumulator registers): the most up to 16
//	stem/B/rows     output rows per strip (divisors of the rows up to 4
//	                whose strip fits in L1): 1
//	stem/B/pack     whether the kernel is packed: yes
//	stem/B/unroll   whether the taps are unrolled: yes
//	stem/B/parallel whether the rows run in parallel: above
//	                Options.ParallelFlops

// maxStemChannels bounds the input channels of a stem: beyond a few, the
// channel-vectorized tile has reductions enough.
const maxStemChannels = 4

// maxStemVectors bounds a stem tile's vectors along the row.
const maxStemVectors = 4

// maxStemTileChannels bounds the output channels of the default tile.
const maxStemTileChannels = 16

// maxStemStripRows bounds the output rows of a strip.
const maxStemStripRows = 4

// stemConv is what matchStem found in a function.
type stemConv struct {
	conv, epilogue *ir.BlockRealize
	pad            *ir.BlockRealize // nil when the convolution reads a parameter
	a, w           *ir.BufferLoad
	// iteration variables of the convolution block.
	n, y, x, f, rc, ry, rx *ir.Var
	N, Y, X, F, C, KH, KW  int64
	sy, sx, offY, offX     int64
	planeSource            // the input before padding
	// axis[k] is the convolution variable that the epilogue's k-th
	// iteration variable stands for.
	axis []*ir.Var
}

// stemTile is a stem's choices.
type stemTile struct {
	lanes, xv, fi, rows int64
	pack, unroll, par   bool
}

// scheduleStem returns f scheduled by the rule above, or an error when
// block c is not a stem.
func scheduleStem(f *ir.PrimFunc, c convBlock, opts Options) (*scheduled, error) {
	if len(c.spatial) != 4 || len(c.reduce) != 3 || c.dtype != ir.Float32 {
		return nil, skip("block %q is not a stem", c.name)
	}
	s, err := schedule.New(f)
	if err != nil {
		return nil, err
	}
	if err := inlineAfterIn(s, c.name); err != nil {
		return nil, err
	}
	st, err := matchStem(s.Func(), c)
	if err != nil {
		return nil, err
	}
	lanes, _, _, ok := stemDefaultTile(st.X, st.F, opts.VectorBytes/4, opts.accumulators())
	if !ok {
		return nil, skip("block %q: rows of %d take no vectors", c.name, st.X)
	}
	if st.stripBytes(1) > opts.L1DBytes {
		return nil, skip("block %q: input rows too wide", c.name)
	}
	t, err := st.choose(s, c.name, lanes, opts)
	if err != nil {
		return nil, err
	}
	if err := st.schedule(s, c.name, t); err != nil {
		return nil, err
	}
	return done(s), nil
}

// stemDefaultTile picks the lanes (a power of two of at least 4 and at
// most maxLanes, no wider than the row), xv vectors of positions and fi
// output channels (a divisor of F) for at most limit accumulators: the
// fewest vectors computed per row, the tiles overlapping at its end, then
// the most accumulators.
func stemDefaultTile(X, F, maxLanes, limit int64) (lanes, fi, xv int64, ok bool) {
	for lanes = maxLanes; lanes > 4 && lanes > X; lanes /= 2 {
	}
	if lanes < 4 || lanes > X {
		return 0, 0, 0, false
	}
	fi, xv = stemVectors(X, F, lanes, limit)
	return lanes, fi, xv, true
}

// stemVectors picks xv and fi for vectors of lanes (see stemDefaultTile).
func stemVectors(X, F, lanes, limit int64) (fi, xv int64) {
	best := int64(-1)
	for v := int64(1); v <= maxStemVectors && v*lanes <= X; v++ {
		t := v * lanes
		computed := (X + t - 1) / t * v
		fv := largestDivisor(F, min(maxStemTileChannels, limit/v))
		if best < 0 || computed < best || computed == best && fv*v > fi*xv {
			best, fi, xv = computed, fv, v
		}
	}
	return fi, xv
}

// choose makes the rule's choices for block name (see above), lanes the
// rule's own vector.
func (st *stemConv) choose(s *schedule.Schedule, name string, lanes int64, opts Options) (stemTile, error) {
	var t stemTile
	site := func(what string) string { return "stem/" + name + "/" + what }
	var cands []int64
	for l := opts.VectorBytes / 4; l >= 4; l /= 2 {
		if l <= st.X {
			cands = append(cands, l)
		}
	}
	var err error
	if t.lanes, err = opts.choose(s, site("lanes"), cands, lanes); err != nil {
		return t, err
	}
	limit := opts.accumulators()
	_, xv := stemVectors(st.X, st.F, t.lanes, limit)
	cands = nil
	for v := int64(1); v <= maxStemVectors && v*t.lanes <= st.X; v++ {
		cands = append(cands, v)
	}
	if t.xv, err = opts.choose(s, site("vectors"), cands, xv); err != nil {
		return t, err
	}
	cands = nil
	for d := int64(1); d <= st.F && d*t.xv <= max(limit, t.xv); d++ {
		if st.F%d == 0 {
			cands = append(cands, d)
		}
	}
	fi := largestDivisor(st.F, min(maxStemTileChannels, limit/t.xv))
	if t.fi, err = opts.choose(s, site("channels"), cands, fi); err != nil {
		return t, err
	}
	cands = nil
	for r := int64(1); r <= maxStemStripRows && r <= st.Y; r++ {
		if st.Y%r == 0 && (r == 1 || st.stripBytes(r) <= opts.L1DBytes) {
			cands = append(cands, r)
		}
	}
	if t.rows, err = opts.choose(s, site("rows"), cands, 1); err != nil {
		return t, err
	}
	if t.pack, err = opts.chooseBool(s, site("pack"), true); err != nil {
		return t, err
	}
	if t.unroll, err = opts.chooseBool(s, site("unroll"), true); err != nil {
		return t, err
	}
	par := opts.ParallelFlops > 0 && st.N*st.Y*st.X*st.F*st.C*st.KH*st.KW >= opts.ParallelFlops && st.N*st.Y > 1
	if st.N*st.Y > 1 {
		if t.par, err = opts.chooseBool(s, site("parallel"), par); err != nil {
			return t, err
		}
	}
	return t, nil
}

// stripBytes is the size of a strip of the input for rows output rows:
// each channel's (rows-1)·sy + kh rows of the padded input.
func (st *stemConv) stripBytes(rows int64) int64 {
	w, _ := ir.IsConstInt(st.a.Buffer.Shape[3])
	return st.C * ((rows-1)*st.sy + st.KH) * (w + st.sx - 1) / st.sx * st.sx * 4
}

// matchStem matches function f (the blocks after the convolution c
// inlined into the last): an optional padding stage, the convolution
// C[n, y, x, f] += A[n, c, y·sy+ry, x·sx+rx] · W[f, c, ry, rx] (any
// layout of W) with few input channels, and one elementwise block
// writing the output with x its last index.
func matchStem(f *ir.PrimFunc, cb convBlock) (*stemConv, error) {
	s := &stemConv{}
	blocks := topBlocks(f)
	var pad *ir.BlockRealize
	for i, br := range blocks {
		if br.Block.Name != cb.name {
			continue
		}
		if i != len(blocks)-2 || i > 1 {
			return nil, skip("block %q: not a padding, the convolution and an epilogue", cb.name)
		}
		s.conv, s.epilogue = br, blocks[i+1]
		if i == 1 {
			pad = blocks[0]
		}
		s.pad = pad
	}
	if s.conv == nil {
		return nil, skip("no block %q", cb.name)
	}
	b := s.conv.Block
	st, ok := b.Body.(*ir.BufferStore)
	if !ok {
		return nil, skip("block %q: not a store", cb.name)
	}
	a, w, ok := multiplyAccumulate(st)
	if !ok {
		return nil, skip("block %q: not a multiply-accumulate", cb.name)
	}
	iv := b.IterVars
	s.f = iv[3].Var
	if usesVar(a, s.f) {
		a, w = w, a
	}
	s.a, s.w = a, w
	if len(a.Indices) != 4 || usesVar(a, s.f) {
		return nil, skip("block %q: operands", cb.name)
	}
	for i := range st.Indices {
		if !isVar(st.Indices[i], iv[i].Var) {
			return nil, skip("block %q: output indices", cb.name)
		}
	}
	// A[n, rc, y·sy+ry+offY, x·sx+rx+offX]
	spatial, reduce := iv[:3], iv[4:]
	find := func(vs []ir.IterVar, e ir.Expr) *ir.Var {
		var found *ir.Var
		for _, v := range vs {
			if usesVar(e, v.Var) {
				if found != nil {
					return nil
				}
				found = v.Var
			}
		}
		return found
	}
	s.n = find(spatial, a.Indices[0])
	s.y, s.ry = find(spatial, a.Indices[2]), find(reduce, a.Indices[2])
	s.x, s.rx = find(spatial, a.Indices[3]), find(reduce, a.Indices[3])
	s.rc = find(reduce, a.Indices[1])
	if s.n == nil || s.y == nil || s.x == nil || s.rc == nil || s.ry == nil || s.rx == nil ||
		!isVar(a.Indices[0], s.n) || !isVar(a.Indices[1], s.rc) || s.y == s.x || s.y == s.n || s.x == s.n || s.ry == s.rx {
		return nil, skip("block %q: input indices", cb.name)
	}
	if s.sy, s.offY, ok = windowIndex(a.Indices[2], s.y, s.ry); !ok {
		return nil, skip("block %q: rows of the input", cb.name)
	}
	if s.sx, s.offX, ok = windowIndex(a.Indices[3], s.x, s.rx); !ok || s.sx > 4 {
		return nil, skip("block %q: columns of the input", cb.name)
	}
	for _, v := range []*ir.Var{s.n, s.y, s.x} {
		if usesVar(w, v) {
			return nil, skip("block %q: the kernel varies with the position", cb.name)
		}
	}
	ext := func(v *ir.Var) int64 {
		for i, x := range iv {
			if x.Var == v {
				return append(append([]int64{}, cb.spatial...), cb.reduce...)[i]
			}
		}
		return 0
	}
	s.N, s.Y, s.X, s.F = ext(s.n), ext(s.y), ext(s.x), cb.spatial[3]
	s.C, s.KH, s.KW = ext(s.rc), ext(s.ry), ext(s.rx)
	if s.C > maxStemChannels {
		return nil, skip("block %q: %d input channels", cb.name, s.C)
	}
	var err error
	if s.planeSource, err = matchSource(f, cb.name, a.Buffer, pad); err != nil {
		return nil, err
	}
	if ha, ok := ir.IsConstInt(a.Buffer.Shape[2]); !ok || s.offY < 0 || (s.Y-1)*s.sy+s.KH-1+s.offY >= ha {
		return nil, skip("block %q: rows past the input", cb.name)
	}
	return s, s.matchEpilogue(f, st.Buffer)
}

// matchEpilogue checks that the last block is elementwise over the
// convolution's output conv, read at a permutation of its variables, and
// writes a parameter whose last index is the convolution's x.
func (s *stemConv) matchEpilogue(f *ir.PrimFunc, conv *ir.Buffer) error {
	e := s.epilogue.Block
	est, ok := e.Body.(*ir.BufferStore)
	if !ok || !isSpatial(e) || len(est.Indices) != 4 || len(e.IterVars) != 4 || !isParam(f, est.Buffer) {
		return skip("the block after the convolution is not elementwise")
	}
	for i, ix := range est.Indices {
		if !isVar(ix, e.IterVars[i].Var) {
			return skip("the block after the convolution is not elementwise")
		}
	}
	convVars := s.conv.Block.IterVars[:4]
	var at []ir.Expr
	bad := false
	ir.Visit(est.Value, func(n ir.Node) bool {
		if l, ok := n.(*ir.BufferLoad); ok && l.Buffer == conv {
			if at != nil && !sameExprs(at, l.Indices) {
				bad = true
			}
			at = l.Indices
		}
		return !bad
	})
	if bad || at == nil {
		return skip("the block after the convolution reads it elsewhere")
	}
	s.axis = make([]*ir.Var, 4)
	for i, ix := range at {
		for k, v := range e.IterVars {
			if isVar(ix, v.Var) {
				if s.axis[k] != nil {
					return skip("the block after the convolution reads it elsewhere")
				}
				s.axis[k] = convVars[i].Var
			}
		}
	}
	for k, v := range s.axis {
		ext, _ := ir.IsConstInt(e.IterVars[k].Dom.Extent)
		if v == nil || ext != map[*ir.Var]int64{s.n: s.N, s.y: s.Y, s.x: s.X, s.f: s.F}[v] {
			return skip("the block after the convolution is not elementwise")
		}
	}
	if s.axis[3] != s.x {
		return skip("the output's rows are not its last axis")
	}
	return nil
}

// sameExprs reports two index lists of the same variables.
func sameExprs(a, b []ir.Expr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		va, ok1 := a[i].(*ir.Var)
		vb, ok2 := b[i].(*ir.Var)
		if !ok1 || !ok2 || va != vb {
			return false
		}
	}
	return true
}

// schedule applies the rule's primitives to s (the function with the
// blocks after the convolution name inlined into the last) with the
// choices t.
func (st *stemConv) schedule(s *schedule.Schedule, name string, t stemTile) error {
	blk, err := s.GetBlock(name)
	if err != nil {
		return err
	}
	br, err := s.BlockRealize(blk)
	if err != nil {
		return err
	}
	iv := br.Block.IterVars
	loops, err := s.GetLoops(blk)
	if err != nil {
		return err
	}
	if len(loops) != len(iv) {
		return skip("block %q is nested in other loops", name)
	}
	var l [7]schedule.LoopRV
	for k, v := range []*ir.Var{st.n, st.y, st.x, st.f, st.rc, st.ry, st.rx} {
		i := slices.IndexFunc(iv, func(x ir.IterVar) bool { return x.Var == v })
		if i < 0 {
			return fmt.Errorf("block %q has no iteration variable %q", name, v.Name)
		}
		l[k] = loops[i]
	}
	n, y, x, f, rc, ry, rx := l[0], l[1], l[2], l[3], l[4], l[5], l[6]

	// The strip: the padded input (or a copy of the input) in phases.
	zero := 0.0
	strip, hasStrip := schedule.BlockRV{}, true
	switch {
	case st.pad == nil && st.sx == 1:
		hasStrip = false // read where it is: rows of stride 1
	case st.pad == nil:
		i, err := readIndex(s, blk, st.a.Buffer)
		if err != nil {
			return err
		}
		if strip, err = s.CacheReadLayout(blk, i, "global", st.phaseMap(), &zero); err != nil {
			return err
		}
	default:
		if strip, err = s.GetBlock(st.pad.Block.Name); err != nil {
			return err
		}
		if st.sx > 1 {
			if err := s.TransformLayout(strip, schedule.BufferIndex{Write: true}, st.phaseMap(), &zero); err != nil {
				return err
			}
		}
	}
	// The kernel packed in tiles of fi channels.
	if t.pack {
		m, ok := st.packMap(t.fi)
		if !ok {
			return skip("block %q: the kernel's indices %v", name, st.w.Indices)
		}
		i, err := readIndex(s, blk, st.w.Buffer)
		if err != nil {
			return err
		}
		if _, err := s.CacheReadLayout(blk, i, "global", m, nil); err != nil {
			return err
		}
	}
	// The accumulators with the positions x innermost, so that the tile
	// and its store are vectors along the row.
	xd := -1
	for d, e := range br.Block.Body.(*ir.BufferStore).Indices {
		if isVar(e, st.x) {
			xd = d
		}
	}
	wb, err := s.CacheWriteLayout(blk, 0, "local", lastAxis(4, xd), nil)
	if err != nil {
		return err
	}

	rows := []schedule.LoopRV{y}
	if t.rows > 1 {
		if rows, err = s.Split(y, -1, t.rows); err != nil {
			return err
		}
	}
	// A kernel in blocks of b channels that tiles of fi divide: the
	// tiles of a block apart (f = fo·b + fb·fi + i), so that its indices
	// f // b and f % b simplify over the loops' bounds.
	factors := []int64{-1, t.fi}
	if b := st.kernelBlock(); b > t.fi && b%t.fi == 0 && st.F%b == 0 {
		factors = []int64{-1, b / t.fi, t.fi}
	}
	fs, err := s.Split(f, factors...)
	if err != nil {
		return err
	}
	xs, err := s.SplitOverlap(x, -1, t.xv, t.lanes)
	if err != nil {
		return err
	}
	order := append(append(append([]schedule.LoopRV{n}, rows...), fs[:len(fs)-1]...), xs[0], rc, ry, rx)
	tile := []schedule.LoopRV{fs[len(fs)-1], xs[1], xs[2]}
	if err := s.Reorder(append(order, tile...)...); err != nil {
		return err
	}
	init, err := s.DecomposeReduction(blk, rc)
	if err != nil {
		return err
	}
	// The epilogue on the tile, vectors along the row.
	if err := convEpilogue(s, wb, xs[0], t.lanes); err != nil {
		return err
	}
	if err := unrollTile(s, tile, init); err != nil {
		return err
	}
	if t.unroll {
		if err := s.Unroll(rx); err != nil {
			return err
		}
	}
	if hasStrip {
		if err := s.ComputeAt(strip, rows[0]); err != nil {
			return err
		}
		if err := phaseLoops(s, strip, st.sx, true); err != nil {
			return err
		}
	}
	if t.par {
		return parallel(s, []schedule.LoopRV{n, rows[0]})
	}
	return nil
}

// readIndex is the index of the read region of block b that reads buf.
func readIndex(s *schedule.Schedule, b schedule.BlockRV, buf *ir.Buffer) (int, error) {
	br, err := s.BlockRealize(b)
	if err != nil {
		return 0, err
	}
	for i, r := range br.Block.Reads {
		if r.Buffer == buf {
			return i, nil
		}
	}
	return 0, fmt.Errorf("block %q does not read %q", br.Block.Name, buf.Name)
}

// lastAxis maps n indices to the same with index d moved last.
func lastAxis(n, d int) *schedule.IndexMap {
	return schedule.NewIndexMap(n, func(ix ...ir.Expr) []ir.Expr {
		out := append(append([]ir.Expr{}, ix[:d]...), ix[d+1:]...)
		return append(out, ix[d])
	})
}

// phaseMap stores the input's columns w at (w % sx, h, w // sx): each
// phase of the stride holds the columns one tap reads, consecutive.
func (st *stemConv) phaseMap() *schedule.IndexMap {
	return schedule.NewIndexMap(4, func(ix ...ir.Expr) []ir.Expr {
		sx := ir.Const(ix[3].DType(), float64(st.sx))
		return []ir.Expr{ix[0], ix[1], ir.FloorMod(ix[3], sx), ix[2], ir.FloorDiv(ix[3], sx)}
	})
}

// packMap maps the kernel's indices to (f // fi, c, ry, rx, f % fi), or
// reports false when they are not the window's variables and f (or f's
// blocks, f // b and f % b) one to one.
func (st *stemConv) packMap(fi int64) (*schedule.IndexMap, bool) {
	b := st.kernelBlock()
	dims := map[*ir.Var]int{} // the dimension a variable indexes
	div, mod := -1, -1        // f // b and f % b
	for d, e := range st.w.Indices {
		if v, ok := e.(*ir.Var); ok {
			if _, dup := dims[v]; dup {
				return nil, false
			}
			dims[v] = d
			continue
		}
		bin, ok := e.(*ir.Binary)
		if !ok || b == 0 || !isVar(bin.A, st.f) {
			return nil, false
		}
		if c, _ := ir.IsConstInt(bin.B); c != b {
			return nil, false
		}
		switch bin.Op {
		case ir.OpFloorDiv:
			div = d
		case ir.OpFloorMod:
			mod = d
		default:
			return nil, false
		}
	}
	vars := []*ir.Var{st.rc, st.ry, st.rx}
	if div < 0 {
		vars = append(vars, st.f)
	} else if mod < 0 {
		return nil, false
	}
	for _, v := range vars {
		if _, ok := dims[v]; !ok {
			return nil, false
		}
	}
	if len(dims) != len(vars) {
		return nil, false
	}
	return schedule.NewIndexMap(len(st.w.Indices), func(ix ...ir.Expr) []ir.Expr {
		c := func(v int64) ir.Expr { return ir.Const(ix[0].DType(), float64(v)) }
		var f ir.Expr
		if div < 0 {
			f = ix[dims[st.f]]
		} else {
			f = ir.Add(ir.Mul(ix[div], c(b)), ix[mod])
		}
		return []ir.Expr{ir.FloorDiv(f, c(fi)), ix[dims[st.rc]], ix[dims[st.ry]], ix[dims[st.rx]], ir.FloorMod(f, c(fi))}
	}), true
}

// kernelBlock is the block of output channels of a kernel read at f // b
// and f % b, or 0.
func (st *stemConv) kernelBlock() int64 {
	for _, e := range st.w.Indices {
		if d, ok := e.(*ir.Binary); ok && d.Op == ir.OpFloorMod && isVar(d.A, st.f) {
			b, _ := ir.IsConstInt(d.B)
			return b
		}
	}
	return 0
}

// phaseLoops orders the loops of the copy b of a plane (or a strip of
// rows), its last two loops its rows and columns, and marks them for
// partitioning where the padding's conditions change
// (transform.PartitionLoops): its interior is then a plain copy. A
// stride of sx stores columns w at (w % sx, w // sx), the phase loop
// unrolled: outermost, each phase's rows stored in order from every
// sx-th column of the input, or else under the rows, every phase of a row
// copied while the input's row is in cache.
func phaseLoops(s *schedule.Schedule, b schedule.BlockRV, sx int64, outer bool) error {
	loops, err := s.GetLoops(b)
	if err != nil {
		return err
	}
	n := len(loops)
	if n < 2 {
		return skip("the copy has %d loops", n)
	}
	rows, cols := loops[n-2], loops[n-1]
	if sx > 1 {
		ph, err := s.Split(cols, -1, sx)
		if err != nil {
			return err
		}
		order := []schedule.LoopRV{ph[1], rows, ph[0]}
		if !outer {
			order = []schedule.LoopRV{rows, ph[1], ph[0]}
		}
		if err := s.Reorder(order...); err != nil {
			return err
		}
		if err := s.Unroll(ph[1]); err != nil {
			return err
		}
		cols = ph[0]
	}
	for _, l := range []schedule.LoopRV{rows, cols} {
		if err := s.Annotate(l, loopPartitionHint, true); err != nil {
			return err
		}
	}
	return nil
}
