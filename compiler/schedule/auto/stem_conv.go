package auto

import (
	"github.com/kiln-ml/kiln/compiler/ir"
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
// Each tap loads xv vectors of S once for fi broadcast weights, which the
// kernel, repacked once per call, holds side by side. A row no tile
// divides ends with a tile that overlaps the one before it (the positions
// it computes twice get the same values), so every load and store is a
// whole vector within the row. On one Zen 4 core squeezenet1_1's stem
// took 203 µs instead of 357, mobilenet_v2's 111 instead of 176;
// resnet18's (147 steps, rows of 112) ran as fast either way.

// maxStemChannels bounds the input channels of a stem: beyond a few, the
// channel-vectorized tile has reductions enough.
const maxStemChannels = 4

// stemConv is what matchStem found in a function.
type stemConv struct {
	conv, epilogue *ir.BlockRealize
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

// scheduleStem returns f rewritten by the rule above, or an error when
// block c is not a stem.
func scheduleStem(f *ir.PrimFunc, c convBlock, opts Options) (*scheduled, error) {
	if len(c.spatial) != 4 || len(c.reduce) != 3 || c.dtype != ir.Float32 {
		return nil, skip("block %q is not a stem", c.name)
	}
	g, err := inlineAfter(f, c.name)
	if err != nil {
		return nil, err
	}
	s, err := matchStem(g, c)
	if err != nil {
		return nil, err
	}
	lanes, fi, xv, ok := stemTile(s.X, s.F, opts.VectorBytes/4, opts.accumulators())
	if !ok {
		return nil, skip("block %q: rows of %d take no vectors", c.name, s.X)
	}
	if s.stripLen()*4 > opts.L1DBytes {
		return nil, skip("block %q: input rows too wide", c.name)
	}
	return byHand(g.WithBody(ir.NewRootBlock(s.loops(lanes, fi, xv, opts)))), nil
}

// stemTile picks the lanes (a power of two of at least 4 and at most
// maxLanes, no wider than the row), xv vectors of positions and fi output
// channels (a divisor of F) for at most limit accumulators: the fewest
// vectors computed per row, the tiles overlapping at its end, then the
// most accumulators.
func stemTile(X, F, maxLanes, limit int64) (lanes, fi, xv int64, ok bool) {
	for lanes = maxLanes; lanes > 4 && lanes > X; lanes /= 2 {
	}
	if lanes < 4 || lanes > X {
		return 0, 0, 0, false
	}
	best := int64(-1)
	for v := int64(1); v <= 4 && v*lanes <= X; v++ {
		t := v * lanes
		computed := (X + t - 1) / t * v
		fv := largestDivisor(F, min(16, limit/v))
		if best < 0 || computed < best || computed == best && fv*v > fi*xv {
			best, fi, xv = computed, fv, v
		}
	}
	return lanes, fi, xv, true
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

// phaseWidth is the columns of one phase of the strip: every column a
// tap of the row's last vector reads.
func (s *stemConv) phaseWidth() int64 { return s.X + (s.KW-1)/s.sx }

func (s *stemConv) stripLen() int64 { return s.C * s.KH * s.sx * s.phaseWidth() }

// loops builds the function's new body.
func (s *stemConv) loops(lanes, fi, xv int64, opts Options) ir.Stmt {
	it := s.f.Type
	i64 := func(v int64) ir.Expr { return ir.NewIntImm(it, v) }
	n, y := ir.NewVar("n", it), ir.NewVar("y", it)
	wq := s.phaseWidth()
	strip := ir.NewBuffer("strip", ir.Float32, []ir.Expr{i64(s.stripLen())}, "global")
	// at is the strip's element for channel c, row r, phase p, column j.
	at := func(c, r ir.Expr, p int64, j ir.Expr) ir.Expr {
		return ir.Add(ir.Mul(ir.Add(ir.Mul(ir.Add(ir.Mul(c, i64(s.KH)), r), i64(s.sx)), i64(p)), i64(wq)), j)
	}

	// The strip: row r of channel c is A's row y·sy+r+offY (src's row
	// minus padY), padded; phase p, column j holds A's column
	// j·sx+p+offX.
	c, r := ir.NewVar("c", it), ir.NewVar("r", it)
	srcN := ir.SubstituteExpr(s.a.Indices[0], map[*ir.Var]ir.Expr{s.n: n})
	row := ir.Add(ir.Mul(y, i64(s.sy)), ir.Add(r, i64(s.offY-s.padY)))
	fillRange := func(p, ja, jb int64, value func(j ir.Expr) ir.Expr) ir.Stmt {
		if ja >= jb {
			return nil
		}
		j := ir.NewVar("j", it)
		return ir.NewFor(j, i64(ja), i64(jb-ja), ir.ForSerial, ir.NewBufferStore(strip, value(j), at(c, r, p, j)))
	}
	padding := func(ir.Expr) ir.Expr { return s.padValue }
	var inside, outside []ir.Stmt
	for p := int64(0); p < s.sx; p++ {
		base := p + s.offX - s.padX
		j0, j1 := ceilDiv(-base, s.sx), ceilDiv(s.srcW-base, s.sx)
		j0, j1 = min(max(j0, 0), wq), max(min(j1, wq), 0)
		if j0 >= j1 {
			j0, j1 = 0, 0
		}
		for _, st := range []ir.Stmt{
			fillRange(p, 0, j0, padding),
			fillRange(p, j0, j1, func(j ir.Expr) ir.Expr {
				return ir.NewBufferLoad(s.src, srcN, c, row, ir.Add(ir.Mul(j, i64(s.sx)), i64(base)))
			}),
			fillRange(p, j1, wq, padding),
		} {
			if st != nil {
				inside = append(inside, st)
			}
		}
		outside = append(outside, fillRange(p, 0, wq, padding))
	}
	var fill ir.Stmt = ir.Seq(inside...)
	if (s.Y-1)*s.sy+s.KH-1+s.offY-s.padY >= s.srcH || s.offY-s.padY < 0 {
		fill = &ir.IfThenElse{Cond: ir.And(ir.GE(row, i64(0)), ir.LT(row, i64(s.srcH))), Then: fill, Else: ir.Seq(outside...)}
	}
	fill = ir.NewFor(c, i64(0), i64(s.C), ir.ForSerial, ir.NewFor(r, i64(0), i64(s.KH), ir.ForSerial, fill))

	// The tiles of the row: fo·fi output channels, positions from x0.
	fo, xt := ir.NewVar("fo", it), ir.NewVar("xt", it)
	T := xv * lanes
	x0 := ir.Min(ir.Mul(xt, i64(T)), i64(s.X-T))
	acc := ir.NewBuffer("acc", ir.Float32, []ir.Expr{i64(fi * xv * lanes)}, "local")
	// tile runs body over the tile: channel f, position x and slot.
	tile := func(name string, body func(f, x, slot ir.Expr) ir.Stmt) ir.Stmt {
		ii, jj, l := ir.NewVar(name+"_f", it), ir.NewVar(name+"_v", it), ir.NewVar(name+"_l", it)
		x := ir.Add(x0, ir.Add(ir.Mul(jj, i64(lanes)), l))
		f := ir.Add(ir.Mul(fo, i64(fi)), ii)
		slot := ir.Add(ir.Mul(ir.Add(ir.Mul(ii, i64(xv)), jj), i64(lanes)), l)
		return ir.NewFor(ii, i64(0), i64(fi), ir.ForUnrolled,
			ir.NewFor(jj, i64(0), i64(xv), ir.ForUnrolled,
				ir.NewFor(l, i64(0), i64(lanes), ir.ForVectorized, body(f, x, slot))))
	}
	zero := tile("z", func(_, _, slot ir.Expr) ir.Stmt { return ir.NewBufferStore(acc, ir.F32(0), slot) })
	// The kernel, packed first in the tile's order: pack[fo, c, ry, rx,
	// i] is W[fo·fi+i, c, ry, rx], so that a tap's fi weights lie at
	// one address plus constants.
	pack := ir.NewBuffer("pack", ir.Float32, []ir.Expr{i64(s.F * s.C * s.KH * s.KW)}, "global")
	packAt := func(fo, c, ry, rx, i ir.Expr) ir.Expr {
		return ir.Add(ir.Mul(ir.Add(ir.Mul(ir.Add(ir.Mul(ir.Add(ir.Mul(fo, i64(s.C)), c), i64(s.KH)), ry), i64(s.KW)), rx), i64(fi)), i)
	}
	pf, pc, pr, pk, pi := ir.NewVar("pf", it), ir.NewVar("pc", it), ir.NewVar("pr", it), ir.NewVar("pk", it), ir.NewVar("pi", it)
	packing := ir.NewFor(pf, i64(0), i64(s.F/fi), ir.ForSerial, ir.NewFor(pc, i64(0), i64(s.C), ir.ForSerial,
		ir.NewFor(pr, i64(0), i64(s.KH), ir.ForSerial, ir.NewFor(pk, i64(0), i64(s.KW), ir.ForSerial,
			ir.NewFor(pi, i64(0), i64(fi), ir.ForSerial, ir.NewBufferStore(pack,
				ir.SubstituteExpr(s.w, map[*ir.Var]ir.Expr{s.f: ir.Add(ir.Mul(pf, i64(fi)), pi), s.rc: pc, s.ry: pr, s.rx: pk}),
				packAt(pf, pc, pr, pk, pi)))))))
	rc, ry := ir.NewVar("rc", it), ir.NewVar("ry", it)
	var taps []ir.Stmt
	for k := int64(0); k < s.KW; k++ {
		taps = append(taps, tile("t", func(f, x, slot ir.Expr) ir.Stmt {
			a := ir.NewBufferLoad(strip, at(rc, ry, k%s.sx, ir.Add(x, i64(k/s.sx))))
			w := ir.NewBufferLoad(pack, packAt(fo, rc, ry, i64(k), ir.Sub(f, ir.Mul(fo, i64(fi)))))
			return ir.NewBufferStore(acc, ir.Add(ir.NewBufferLoad(acc, slot), ir.Mul(w, a)), slot)
		}))
	}
	window := ir.NewFor(rc, i64(0), i64(s.C), ir.ForSerial, ir.NewFor(ry, i64(0), i64(s.KH), ir.ForSerial, ir.Seq(taps...)))

	// The epilogue on the tile, stored at the output's indices.
	est := s.epilogue.Block.Body.(*ir.BufferStore)
	ev := s.epilogue.Block.IterVars
	convOut := s.conv.Block.Body.(*ir.BufferStore).Buffer
	save := tile("s", func(f, x, slot ir.Expr) ir.Stmt {
		coord := map[*ir.Var]ir.Expr{s.n: n, s.y: y, s.x: x, s.f: f}
		sub := map[*ir.Var]ir.Expr{}
		idx := make([]ir.Expr, len(ev))
		for k, v := range ev {
			sub[v.Var], idx[k] = coord[s.axis[k]], coord[s.axis[k]]
		}
		v := ir.Expr(ir.NewBufferLoad(acc, slot))
		value := (&ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
			if l, ok := e.(*ir.BufferLoad); ok && l.Buffer == convOut {
				return v
			}
			return e
		}}).RewriteExpr(est.Value)
		return ir.NewBufferStore(est.Buffer, ir.SubstituteExpr(value, sub), idx...)
	})
	tiles := ir.NewFor(fo, i64(0), i64(s.F/fi), ir.ForSerial,
		ir.NewFor(xt, i64(0), i64((s.X+T-1)/T), ir.ForSerial,
			&ir.Allocate{Buffer: acc, Body: ir.Seq(zero, window, save)}))

	kind := ir.ForSerial
	if opts.ParallelFlops > 0 && s.N*s.Y*s.X*s.F*s.C*s.KH*s.KW >= opts.ParallelFlops && s.Y > 1 {
		kind = ir.ForParallel
	}
	return &ir.Allocate{Buffer: pack, Body: ir.Seq(packing, ir.NewFor(n, i64(0), i64(s.N), ir.ForSerial,
		ir.NewFor(y, i64(0), i64(s.Y), kind, &ir.Allocate{Buffer: strip, Body: ir.Seq(fill, tiles)})))}
}
