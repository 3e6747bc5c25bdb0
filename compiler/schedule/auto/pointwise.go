package auto

import (
	"github.com/kiln-ml/kiln/compiler/ir"
)

// Pointwise (1×1, stride 1, unpadded) convolutions over NCHW data with
// an OIHW kernel (AlterConvLayout leaves them so) as a matrix product
// over the flattened output plane: with p = y·X + x, contiguous in
// memory for each channel,
//
//	C[n, f, p] += A[n, c, p] · W[f, c, 0, 0]
//
// the function (the convolution and an optional elementwise block after
// it, as for depthwise_plane.go) is rewritten into loops of its own:
//
//	parallel for each tile of ft output channels × pv vectors of p:
//	  acc[ft][pv] = 0                        (vectors in registers)
//	  for c: acc[i][v] += A[n, c, p0 + v·lanes:] · W[f0 + i, c]
//	  C[n, f0 + i, p0 + v·lanes:] = epilogue(acc[i][v])
//
// Each step loads pv vectors of A and broadcasts ft weights for ft·pv
// multiply-adds, and every store is a whole vector: rows 55, 27 or 13
// wide (squeezenet1_1's) no longer leave half-empty vectors or scalar
// tails. A plane whose size no tile divides ends with a tile of as few
// vectors as cover the rest, moved back to end at its last element
// (p0 = P - vectors·lanes), which computes some outputs a second time,
// the same values (squeezenet1_1's 13×13 classifier 1.08× faster than
// with a whole tile of 3 vectors there).

// maxPointwiseVectors bounds a pointwise tile's vectors along the
// plane.
const maxPointwiseVectors = 3

// pointwiseTile picks the tile of ft output channels (dividing F) × pv
// vectors of lanes along a plane of P (at most limit accumulators): the
// fewest vectors computed per channel (the last tile's overlap
// included), then the most accumulators, then the most channels (each
// tile of channels reads the whole input once).
func pointwiseTile(F, P, lanes, limit int64) (ft, pv int64) {
	best := int64(-1)
	for v := int64(1); v <= maxPointwiseVectors && v*lanes <= P; v++ {
		for f := min(F, limit/v); f >= 1; f-- {
			if F%f != 0 {
				continue
			}
			vecs := ceilDiv(P, v*lanes) * v
			score := vecs*1000*limit*limit - f*v*limit - f
			if best < 0 || score < best {
				best, ft, pv = score, f, v
			}
			break
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

// schedulePointwise returns f rewritten by the rule above, or an error
// when f is not of its form.
func schedulePointwise(f *ir.PrimFunc, c convBlock, opts Options) (*ir.PrimFunc, error) {
	if c.rows != 1 || len(c.spatial) != 4 || len(c.reduce) != 3 || c.reduce[1] != 1 || c.reduce[2] != 1 || c.dtype != ir.Float32 {
		return nil, skip("block %q is not a pointwise convolution", c.name)
	}
	g, d, err := matchPlaneFunc(f, c)
	if err != nil {
		return nil, err
	}
	if d.pad != nil || d.sy != 1 || d.sx != 1 || d.offY != 0 || d.offX != 0 || d.srcH != d.Y || d.srcW != d.X {
		return nil, skip("block %q: not a 1×1 stride-1 unpadded convolution", c.name)
	}
	if len(d.w.Indices) != 4 || !isVar(d.w.Indices[0], d.c) || !isVar(d.w.Indices[1], d.rc) {
		return nil, skip("block %q: kernel not in OIHW", c.name)
	}
	if !isVar(d.a.Indices[0], d.n) || !isVar(d.a.Indices[1], d.rc) {
		return nil, skip("block %q: input channels", c.name)
	}
	// The flat views take the planes as compact rows.
	if d.src.Strides != nil || d.conv.Block.Body.(*ir.BufferStore).Buffer.Strides != nil ||
		d.epilogue != nil && d.epilogue.Block.Body.(*ir.BufferStore).Buffer.Strides != nil {
		return nil, skip("block %q: strided buffers", c.name)
	}
	P := d.Y * d.X
	lanes := opts.VectorBytes / 4
	for lanes > 4 && lanes > P {
		lanes /= 2
	}
	if lanes > P {
		return nil, skip("block %q: a plane of %d", c.name, P)
	}
	limit := opts.accumulators()
	ft, pv := pointwiseTile(d.C, P, lanes, limit)
	posOuter := c.reduce[0]*P*4 > opts.L2Bytes
	if posOuter {
		ft, pv = streamingPointwiseTile(d.C, P, lanes, limit)
	}
	return g.WithBody(ir.NewRootBlock(d.pointwiseLoops(lanes, ft, pv, c.reduce[0], 0, posOuter, opts))), nil
}

// flatView declares a view of 4-D buffer b as [N, C, Y·X].
func flatView(b *ir.Buffer, it ir.DType, P int64) *ir.Buffer {
	v := *b
	v.Name = b.Name + "_flat"
	v.Shape = []ir.Expr{b.Shape[0], b.Shape[1], ir.NewIntImm(it, P)}
	v.Strides = nil
	return &v
}

// pointwiseLoops builds the function's new body: tiles of ft output
// channels × pv vectors of lanes along the plane, K input channels.
//
// With panel > 0 the kernel comes in panels of that many output
// channels (W[f / panel, c, 0, 0, f % panel], ft = panel): a tile's
// weights at each c are one contiguous run.
//
// With posOuter the tiles of positions run outside the tiles of
// channels, so that consecutive tiles read the same pv vectors of every
// input channel (from cache) and the input is read from memory once
// whatever the tile of channels.
func (d *depthwisePlane) pointwiseLoops(lanes, ft, pv, K, panel int64, posOuter bool, opts Options) ir.Stmt {
	it := d.c.Type
	i64 := func(v int64) ir.Expr { return ir.NewIntImm(it, v) }
	P := d.Y * d.X
	pt := pv * lanes
	npt := ceilDiv(P, pt)
	nft := d.C / ft
	views := map[*ir.Buffer]*ir.Buffer{}
	var made []*ir.Buffer // the views in the order they were made
	view := func(b *ir.Buffer) *ir.Buffer {
		if v, ok := views[b]; ok {
			return v
		}
		v := flatView(b, it, P)
		views[b] = v
		made = append(made, v)
		return v
	}

	n := ir.NewVar("n", it)
	t := ir.NewVar("t", it)
	fIdx, pIdx := ir.FloorDiv(t, i64(npt)), ir.FloorMod(t, i64(npt))
	if posOuter {
		fIdx, pIdx = ir.FloorMod(t, i64(nft)), ir.FloorDiv(t, i64(nft))
	}
	f0 := ir.Mul(fIdx, i64(ft))
	acc := ir.NewBuffer("acc", ir.Float32, []ir.Expr{i64(ft * pt)}, "local")
	// tile runs body over a tile of vecs vectors from p0: the channel
	// fi within the tile, output channel f, plane position p and the
	// slot of the tile.
	tile := func(name string, vecs int64, p0 ir.Expr, body func(fi, f, p, slot ir.Expr) ir.Stmt) ir.Stmt {
		v := ir.NewVar(name+"_v", it)
		fi := ir.NewVar(name+"_f", it)
		l := ir.NewVar(name+"_l", it)
		off := ir.Add(ir.Mul(v, i64(lanes)), l)
		// The channels outside: each step's broadcast weight is used
		// by its vecs multiply-adds at once, vecs vectors of A and one
		// weight live beside the accumulators.
		return ir.NewFor(fi, i64(0), i64(ft), ir.ForUnrolled,
			ir.NewFor(v, i64(0), i64(vecs), ir.ForUnrolled,
				ir.NewFor(l, i64(0), i64(lanes), ir.ForVectorized,
					body(fi, ir.Add(f0, fi), ir.Add(p0, off), ir.Add(ir.Mul(fi, i64(pt)), off)))))
	}
	wv := ir.SubstituteExpr(d.w, map[*ir.Var]ir.Expr{d.ry: i64(0), d.rx: i64(0)})
	aFlat := view(d.src)

	outBuf := d.conv.Block.Body.(*ir.BufferStore).Buffer
	epilogue := func(f, p, v ir.Expr) ir.Expr { return v }
	if d.epilogue != nil {
		est := d.epilogue.Block.Body.(*ir.BufferStore)
		ev := d.epilogue.Block.IterVars
		convOut := outBuf
		outBuf = est.Buffer
		epilogue = func(f, p, v ir.Expr) ir.Expr {
			// Loads at the epilogue's (y, x) read the flat view at p;
			// any other use of y or x computes them from p.
			e := (&ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
				l, ok := e.(*ir.BufferLoad)
				if !ok {
					return e
				}
				if l.Buffer == convOut {
					return v
				}
				if len(l.Indices) == 4 && isVar(l.Indices[2], ev[2].Var) && isVar(l.Indices[3], ev[3].Var) && sameDims(l.Buffer, d.Y, d.X) && l.Buffer.Strides == nil {
					return ir.NewBufferLoad(view(l.Buffer), l.Indices[0], l.Indices[1], ev[3].Var)
				}
				return e
			}}).RewriteExpr(est.Value)
			// ev[3] stood for p in the rewritten loads.
			e = ir.SubstituteExpr(e, map[*ir.Var]ir.Expr{ev[0].Var: n, ev[1].Var: f})
			if usesVar(e, ev[2].Var) {
				e = ir.SubstituteExpr(e, map[*ir.Var]ir.Expr{ev[2].Var: ir.FloorDiv(p, i64(d.X))})
			}
			return replaceFlatX(e, ev[3].Var, p, i64(d.X), views)
		}
	}
	oFlat := view(outBuf)
	// compute zeroes, accumulates and stores a tile of vecs vectors
	// from start.
	compute := func(vecs int64, start ir.Expr) ir.Stmt {
		p0 := ir.NewVar("p0", it)
		rc := ir.NewVar("rc", it)
		zero := tile("z", vecs, p0, func(_, _, _, slot ir.Expr) ir.Stmt { return ir.NewBufferStore(acc, ir.F32(0), slot) })
		step := tile("k", vecs, p0, func(fi, f, p, slot ir.Expr) ir.Stmt {
			a := ir.NewBufferLoad(aFlat, n, rc, p)
			w := ir.SubstituteExpr(wv, map[*ir.Var]ir.Expr{d.rc: rc})
			if panel > 0 {
				// The tile is one panel: its index and fi, no division.
				w = panelIndex(w, d.c, panel, fIdx, fi)
			}
			w = ir.SubstituteExpr(w, map[*ir.Var]ir.Expr{d.c: f, d.n: n})
			return ir.NewBufferStore(acc, ir.Add(ir.NewBufferLoad(acc, slot), ir.Mul(a, w)), slot)
		})
		save := tile("s", vecs, p0, func(_, f, p, slot ir.Expr) ir.Stmt {
			return ir.NewBufferStore(oFlat, epilogue(f, p, ir.NewBufferLoad(acc, slot)), n, f, p)
		})
		return &ir.LetStmt{Var: p0, Value: start, Body: ir.Seq(zero, ir.NewFor(rc, i64(0), i64(K), ir.ForSerial, step), save)}
	}
	// The last tile of a plane that pt does not divide ends at P, with
	// as few vectors as cover what the others leave (squeezenet1_1's
	// 13×13: three tiles of 3 vectors, then one of 2).
	start := ir.Mul(pIdx, i64(pt))
	tiles := compute(pv, start)
	if rest := P - (npt-1)*pt; rest < pt {
		if last := ceilDiv(rest, lanes); last < pv && npt > 1 {
			tiles = &ir.IfThenElse{Cond: ir.LT(pIdx, i64(npt-1)), Then: tiles, Else: compute(last, i64(P-last*lanes))}
		} else {
			tiles = compute(pv, ir.Min(start, i64(P-pt)))
		}
	}
	body := ir.Stmt(&ir.Allocate{Buffer: acc, Body: tiles})
	kind := ir.ForSerial
	if opts.ParallelFlops > 0 && d.C*P*K >= opts.ParallelFlops && nft*npt > 1 {
		kind = ir.ForParallel
	}
	loops := ir.Stmt(ir.NewFor(n, i64(0), i64(d.N), ir.ForSerial, ir.NewFor(t, i64(0), i64(nft*npt), kind, body)))
	// Declared in a fixed order (not the map's), so that the same
	// function always gets the same schedule.
	for _, v := range made {
		loops = &ir.DeclBuffer{Buffer: v, Body: loops}
	}
	return loops
}

// sameDims reports a 4-D buffer of Y rows of X.
func sameDims(b *ir.Buffer, Y, X int64) bool {
	h, ok1 := ir.IsConstInt(b.Shape[2])
	w, ok2 := ir.IsConstInt(b.Shape[3])
	return ok1 && ok2 && h == Y && w == X
}

// replaceFlatX substitutes plane position p for x in the loads of flat
// views (which took x's place for p) and x = p mod X elsewhere.
func replaceFlatX(e ir.Expr, x *ir.Var, p, X ir.Expr, views map[*ir.Buffer]*ir.Buffer) ir.Expr {
	flat := map[*ir.Buffer]bool{}
	for _, v := range views {
		flat[v] = true
	}
	e = (&ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
		if l, ok := e.(*ir.BufferLoad); ok && flat[l.Buffer] && len(l.Indices) == 3 && isVar(l.Indices[2], x) {
			return ir.NewBufferLoad(l.Buffer, l.Indices[0], l.Indices[1], p)
		}
		return e
	}}).RewriteExpr(e)
	return ir.SubstituteExpr(e, map[*ir.Var]ir.Expr{x: ir.FloorMod(p, X)})
}

// Pointwise convolutions with the kernel in panels of output channels
// (AlterConvLayout's OIHW8o for those reducing many input channels over
// rows no vector divides: squeezenet1_1's 512→1000 classifier) come as
// topi.Conv2D's conv2d_hwio stage, the output channels innermost,
//
//	C[n, y, x, f] += A[n, c, y, x] · W[f / b, c, 0, 0, f % b]
//
// and a layout change back to NCHW (with the elementwise blocks after
// it). They take the same plane loops, a tile being one panel of b
// channels: at each c its b weights lie one after the other (one cache
// line), where an OIHW kernel's rows lie C floats apart — a power of two
// for 256 or 512 channels, which sends every row to the same few cache
// sets. Only the channels the last block writes are computed: a kernel
// padded with zero channels (sliced off after the convolution) costs
// nothing.

// panelIndex replaces f / panel with blk and f % panel with fi in the
// indices of load w.
func panelIndex(w ir.Expr, f *ir.Var, panel int64, blk, fi ir.Expr) ir.Expr {
	of := func(e ir.Expr, op ir.BinaryOp) bool {
		b, ok := e.(*ir.Binary)
		if !ok || b.Op != op || !isVar(b.A, f) {
			return false
		}
		c, ok := ir.IsConstInt(b.B)
		return ok && c == panel
	}
	return (&ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
		switch {
		case of(e, ir.OpFloorDiv):
			return blk
		case of(e, ir.OpFloorMod):
			return fi
		}
		return e
	}}).RewriteExpr(w)
}

// packedPointwiseTile picks the vectors pv along a plane of P for tiles
// of ft channels (at most limit accumulators): the most, up to
// maxPointwiseVectors. The last tile takes only the vectors that cover
// the rest of the plane, so every pv computes about the same positions,
// and each step loads ft weights and pv vectors for ft·pv multiply-adds:
// 8 channels × 3 vectors ran 1.03–1.08× faster than × 2 on the 27×27 and
// 14×14 planes of squeezenet1_1 and mobilenet_v2, and than 20 channels
// × 1 vector on the 13×13 classifier.
func packedPointwiseTile(ft, P, lanes, limit int64) int64 {
	pv := int64(0)
	for v := int64(1); v <= maxPointwiseVectors && v*lanes <= P && ft*v <= limit; v++ {
		pv = v
	}
	return pv
}

// schedulePackedPointwise returns f rewritten into the plane loops when
// block c is a pointwise convolution over a kernel in panels (above),
// or an error.
func schedulePackedPointwise(f *ir.PrimFunc, c convBlock, opts Options) (*ir.PrimFunc, error) {
	if c.fblock <= 0 || len(c.spatial) != 4 || len(c.reduce) != 3 || c.reduce[1] != 1 || c.reduce[2] != 1 || c.dtype != ir.Float32 {
		return nil, skip("block %q is not a pointwise convolution over panels", c.name)
	}
	g, err := inlineAfter(f, c.name)
	if err != nil {
		return nil, err
	}
	d, err := matchPackedPointwise(g, c)
	if err != nil {
		return nil, err
	}
	P := d.Y * d.X
	lanes := opts.VectorBytes / 4
	// Whole vectors along the plane, overrunning it by at most an
	// eighth (AlterConvLayout's rule for the plane).
	if lanes > P || ceilDiv(P, lanes)*lanes*8 > P*9 {
		return nil, skip("block %q: a plane of %d", c.name, P)
	}
	limit := opts.accumulators()
	pv := packedPointwiseTile(c.fblock, P, lanes, limit)
	if pv == 0 {
		return nil, skip("block %q: panels of %d take no tile", c.name, c.fblock)
	}
	return g.WithBody(ir.NewRootBlock(d.pointwiseLoops(lanes, c.fblock, pv, c.reduce[0], c.fblock, false, opts))), nil
}

// matchPackedPointwise matches g (the blocks after the convolution
// inlined into the last) as the convolution over NCHW data, unpadded,
// stride 1, and one block after it that writes an NCHW parameter of as
// many positions and at most as many channels (a whole number of
// panels), reading the convolution at its own (n, y, x, f).
func matchPackedPointwise(g *ir.PrimFunc, c convBlock) (*depthwisePlane, error) {
	blocks := topBlocks(g)
	if len(blocks) != 2 || blocks[0].Block.Name != c.name {
		return nil, skip("block %q: not a convolution and one block after it", c.name)
	}
	conv, ep := blocks[0], blocks[1]
	st, ok := conv.Block.Body.(*ir.BufferStore)
	if !ok {
		return nil, skip("block %q: not a store", c.name)
	}
	iv := conv.Block.IterVars
	for i := range 4 {
		if !isVar(st.Indices[i], iv[i].Var) {
			return nil, skip("block %q: output indices", c.name)
		}
	}
	d := &depthwisePlane{conv: conv, epilogue: ep, op: ir.OpAdd, init: ir.F32(0)}
	d.n, d.y, d.x, d.c = iv[0].Var, iv[1].Var, iv[2].Var, iv[3].Var
	d.rc, d.ry, d.rx = iv[4].Var, iv[5].Var, iv[6].Var
	d.N, d.Y, d.X = c.spatial[0], c.spatial[1], c.spatial[2]
	d.KH, d.KW, d.sy, d.sx = 1, 1, 1, 1
	a, w, ok := multiplyAccumulate(st)
	if ok && usesVar(a, d.c) {
		a, w = w, a
	}
	if !ok || usesVar(a, d.c) || len(a.Indices) != 4 || !isParam(g, a.Buffer) || a.Buffer.Strides != nil {
		return nil, skip("block %q: operands", c.name)
	}
	if !isVar(a.Indices[0], d.n) || !isVar(a.Indices[1], d.rc) {
		return nil, skip("block %q: input channels", c.name)
	}
	for i, o := range []*ir.Var{d.y, d.x} {
		r := []*ir.Var{d.ry, d.rx}[i]
		if s, off, ok := windowIndex(a.Indices[2+i], o, r); !ok || s != 1 || off != 0 {
			return nil, skip("block %q: not an unpadded stride-1 window", c.name)
		}
	}
	if len(w.Indices) != 5 || !isVar(w.Indices[1], d.rc) {
		return nil, skip("block %q: kernel not in panels of output channels", c.name)
	}
	d.a, d.w, d.src = a, w, a.Buffer
	h, ok1 := ir.IsConstInt(a.Buffer.Shape[2])
	wd, ok2 := ir.IsConstInt(a.Buffer.Shape[3])
	if !ok1 || !ok2 || h != d.Y || wd != d.X {
		return nil, skip("block %q: input shape", c.name)
	}
	d.srcH, d.srcW = h, wd
	est, ok := ep.Block.Body.(*ir.BufferStore)
	if !ok || !isSpatial(ep.Block) || len(est.Indices) != 4 || !isParam(g, est.Buffer) || est.Buffer.Strides != nil {
		return nil, skip("the block after %q is not elementwise", c.name)
	}
	ev := ep.Block.IterVars
	ext := make([]int64, 4)
	for i, ix := range est.Indices {
		ext[i], _ = ir.IsConstInt(ev[i].Dom.Extent)
		if !isVar(ix, ev[i].Var) {
			return nil, skip("the block after %q is not elementwise", c.name)
		}
	}
	F := c.spatial[3]
	if ext[0] != d.N || ext[2] != d.Y || ext[3] != d.X || ext[1] > F || ext[1]%c.fblock != 0 {
		return nil, skip("the block after %q: shape", c.name)
	}
	d.C = ext[1]
	// The convolution is read at the block's own position only.
	want := []*ir.Var{ev[0].Var, ev[2].Var, ev[3].Var, ev[1].Var}
	bad := false
	ir.Visit(est.Value, func(n ir.Node) bool {
		if l, ok := n.(*ir.BufferLoad); ok && l.Buffer == st.Buffer {
			for i, ix := range l.Indices {
				bad = bad || !isVar(ix, want[i])
			}
		}
		return !bad
	})
	if bad {
		return nil, skip("the block after %q reads it elsewhere", c.name)
	}
	return d, nil
}
