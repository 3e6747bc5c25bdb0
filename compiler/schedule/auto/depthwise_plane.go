package auto

import (
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// Depthwise convolutions as a plane per channel: a function made of an
// optional padding stage, a depthwise convolution over NCHW data
//
//	C[n, c, y, x] += A[n, c, y·sy+ry, x·sx+rx] · W[c, 0, ry, rx]
//
// (topi.Conv2D's group_conv2d_nchw with one channel per group, any
// width, a stride of 1 or 2 along the rows) and elementwise blocks after
// it (bias, Clip, residual add) is rewritten into loops of its own, which
// the primitives cannot express: rows whose width no vector divides (14,
// 7) are computed on whole vectors, their extra lanes dropped.
//
//	parallel for c:
//	  P = A's plane for channel c, padded (the padding stage computed
//	      here, once per channel, in a buffer that stays in cache); a
//	      stride of 2 stores even and odd columns apart, so that every
//	      tap reads consecutive elements
//	  for y:
//	    acc[0:Xv] = 0                        (vectors in registers)
//	    for ry, rx: acc[0:Xv] += P[row y·sy+ry, from x = rx] · W[c, ry, rx]
//	    row[0:Xv] = acc
//	    for x < X: out[n, c, y, x] = epilogue(row[x])
//
// Xv is the width rounded up to whole vectors; the padded plane has
// columns enough for the extra lanes (zeros).
//
// A pooling window after a padding stage (a maximum or sum of A's window,
// topi's pool_max and pool_sum) is computed the same way, its terms
// combined by max or + from the reduction's initial value: the padding
// stage, a pass over memory of its own otherwise, is per channel here
// (resnet18's 3×3 stride-2 max pool: 306→118 µs in the model).

// maxPlaneVectors bounds the vectors of one output row held in
// registers.
const maxPlaneVectors = 8

// maxPlaneAccumulators bounds the vectors of a tile of output rows: rows
// of one vector make chains of dependent multiply-adds, so several rows
// run side by side.
const maxPlaneAccumulators = 12

// depthwisePlane is what matchDepthwisePlane found in a function.
type depthwisePlane struct {
	conv     *ir.BlockRealize
	pad      *ir.BlockRealize // nil when the convolution reads a parameter
	epilogue *ir.BlockRealize // the last elementwise block, nil if none
	a, w     *ir.BufferLoad
	// iteration variables of the convolution: n, c, y, x and the window's
	// ry, rx (rc, the channel within the group, has extent 1 and is 0).
	n, c, y, x, rc, ry, rx *ir.Var // rc is nil for a pooling window
	// op and init combine the window's terms (OpAdd from 0 for a
	// convolution, whose w is the weight; a pooling window's w is nil).
	op                 ir.BinaryOp
	init               ir.Expr
	N, C, Y, X, KH, KW int64
	sy, sx             int64
	offY, offX         int64 // A's row and column at y = ry = 0
	planeSource
}

// planeSource is what a window reads: src is the unpadded input (four
// axes, its rows srcH and columns srcW); A[.., i, j] = src[.., i-padY,
// j-padX] inside src and padValue outside.
type planeSource struct {
	src        *ir.Buffer
	padY, padX int64
	padValue   ir.Expr
	srcH, srcW int64
}

// matchSource finds the source of A, the buffer block name's window
// reads: a parameter when pad is nil, else pad's padding of one.
func matchSource(f *ir.PrimFunc, name string, a *ir.Buffer, pad *ir.BlockRealize) (planeSource, error) {
	var p planeSource
	if pad != nil {
		if err := p.matchPad(f, pad, a); err != nil {
			return p, err
		}
	} else if !isParam(f, a) {
		return p, skip("block %q reads an intermediate", name)
	} else {
		p.src, p.padValue = a, ir.F32(0)
	}
	var ok1, ok2 bool
	if len(p.src.Shape) == 4 {
		p.srcH, ok1 = ir.IsConstInt(p.src.Shape[2])
		p.srcW, ok2 = ir.IsConstInt(p.src.Shape[3])
	}
	if !ok1 || !ok2 {
		return p, skip("block %q: input shape", name)
	}
	return p, nil
}

// scheduleDepthwisePlane returns f rewritten by the rule above, or an
// error when f is not of its form.
func scheduleDepthwisePlane(f *ir.PrimFunc, c convBlock, opts Options) (*ir.PrimFunc, error) {
	conv := len(c.reduce) == 3 && c.reduce[0] == 1
	if c.rows >= 0 || len(c.spatial) != 4 || !conv && len(c.reduce) != 2 || c.dtype != ir.Float32 {
		return nil, skip("block %q is not a depthwise convolution", c.name)
	}
	g, d, err := matchPlaneFunc(f, c)
	if err != nil {
		return nil, err
	}
	if d.sx > 2 {
		return nil, skip("block %q: a stride of %d along the rows", c.name, d.sx)
	}
	if d.w == nil && d.pad == nil {
		// An unpadded pooling window reads its input where it is
		// (pool.go); a plane would only copy it.
		return nil, skip("block %q: pooling without padding", c.name)
	}
	if ha, ok := ir.IsConstInt(d.a.Buffer.Shape[2]); !ok || d.offY < 0 || (d.Y-1)*d.sy+d.KH-1+d.offY >= ha {
		return nil, skip("block %q: rows past the input", c.name)
	}
	if _, ok := ir.IsConstInt(d.a.Buffer.Shape[3]); !ok {
		return nil, skip("block %q: input width", c.name)
	}
	lanes := opts.VectorBytes / 4
	for lanes > 4 && lanes/2 >= d.X {
		lanes /= 2
	}
	xv := (d.X + lanes - 1) / lanes * lanes
	if xv/lanes > maxPlaneVectors {
		return nil, skip("block %q: rows of %d are too wide", c.name, d.X)
	}
	return g.WithBody(ir.NewRootBlock(d.loops(lanes, xv, opts))), nil
}

// matchPlaneFunc returns f with the elementwise blocks after block c
// inlined into the last of them, and what matchDepthwisePlane finds in
// it.
func matchPlaneFunc(f *ir.PrimFunc, c convBlock) (*ir.PrimFunc, *depthwisePlane, error) {
	g, err := inlineAfter(f, c.name)
	if err != nil {
		return nil, nil, err
	}
	d, err := matchDepthwisePlane(g, c)
	return g, d, err
}

// inlineAfter returns f with the elementwise blocks after block name
// inlined into the last of them, which the rules then compute from their
// result.
func inlineAfter(f *ir.PrimFunc, name string) (*ir.PrimFunc, error) {
	s, err := schedule.New(f)
	if err != nil {
		return nil, err
	}
	after := blocksAfter(s.Func(), name)
	for _, a := range after[:max(len(after)-1, 0)] {
		b, err := s.GetBlock(a)
		if err != nil {
			return nil, err
		}
		if err := s.ComputeInline(b); err != nil {
			// A block after it that is not elementwise: not the rules'
			// form.
			return nil, skip("block %q after %q cannot be inlined: %v", a, name, err)
		}
	}
	return s.Func(), nil
}

func matchDepthwisePlane(f *ir.PrimFunc, cb convBlock) (*depthwisePlane, error) {
	d := &depthwisePlane{}
	blocks := topBlocks(f)
	for i, br := range blocks {
		if br.Block.Name == cb.name {
			d.conv = br
			switch {
			case i == len(blocks)-1:
			case i == len(blocks)-2:
				d.epilogue = blocks[i+1]
			default:
				return nil, skip("more than one block after %q", cb.name)
			}
			if i > 1 {
				return nil, skip("more than one block before %q", cb.name)
			}
			if i == 1 {
				d.pad = blocks[0]
			}
		}
	}
	if d.conv == nil {
		return nil, skip("no block %q", cb.name)
	}
	b := d.conv.Block
	st, ok := b.Body.(*ir.BufferStore)
	if !ok {
		return nil, skip("block %q: not a store", cb.name)
	}
	iv := b.IterVars
	d.n, d.c, d.y, d.x = iv[0].Var, iv[1].Var, iv[2].Var, iv[3].Var
	d.N, d.C, d.Y, d.X = cb.spatial[0], cb.spatial[1], cb.spatial[2], cb.spatial[3]
	nr := len(iv) - 2
	d.ry, d.rx = iv[nr].Var, iv[nr+1].Var
	d.KH, d.KW = cb.reduce[len(cb.reduce)-2], cb.reduce[len(cb.reduce)-1]
	var a *ir.BufferLoad
	if a, d.w, ok = multiplyAccumulate(st); ok && len(cb.reduce) == 3 {
		d.rc = iv[4].Var
		if usesVar(a, d.ry) && usesVar(d.w, d.y) || !usesVar(a, d.x) {
			a, d.w = d.w, a
		}
		d.op, d.init = ir.OpAdd, ir.F32(0)
		if usesVar(d.w, d.y) || usesVar(d.w, d.x) {
			return nil, skip("block %q: operands", cb.name)
		}
	} else if r, ok := reduction(b, st); ok && len(cb.reduce) == 2 {
		// A pooling window: a sum or maximum of A's elements.
		if a, ok = r.term.(*ir.BufferLoad); !ok {
			return nil, skip("block %q: not a pooling window", cb.name)
		}
		d.op, d.init, d.w = r.op, r.init, nil
	} else {
		return nil, skip("block %q: not a window", cb.name)
	}
	d.a = a
	if len(a.Indices) != 4 {
		return nil, skip("block %q: operands", cb.name)
	}
	for i := range st.Indices {
		if !isVar(st.Indices[i], iv[i].Var) {
			return nil, skip("block %q: output indices", cb.name)
		}
	}
	if d.sy, d.offY, ok = windowIndex(a.Indices[2], d.y, d.ry); !ok {
		return nil, skip("block %q: rows of the input", cb.name)
	}
	if d.sx, d.offX, ok = windowIndex(a.Indices[3], d.x, d.rx); !ok {
		return nil, skip("block %q: columns of the input", cb.name)
	}
	for _, e := range a.Indices[:2] {
		for _, v := range []*ir.Var{d.y, d.x, d.ry, d.rx} {
			if usesVar(e, v) {
				return nil, skip("block %q: input channel", cb.name)
			}
		}
	}
	src, err := matchSource(f, cb.name, a.Buffer, d.pad)
	if err != nil {
		return nil, err
	}
	d.planeSource = src
	if d.epilogue != nil {
		est, ok := d.epilogue.Block.Body.(*ir.BufferStore)
		if !ok || !isSpatial(d.epilogue.Block) || len(est.Indices) != 4 || !isParam(f, est.Buffer) {
			return nil, skip("the block after %q is not elementwise", cb.name)
		}
		for i, ix := range est.Indices {
			ext, _ := ir.IsConstInt(d.epilogue.Block.IterVars[i].Dom.Extent)
			if !isVar(ix, d.epilogue.Block.IterVars[i].Var) || ext != cb.spatial[i] {
				return nil, skip("the block after %q is not elementwise", cb.name)
			}
		}
		bad := false
		ir.Visit(est.Value, func(n ir.Node) bool {
			if l, ok := n.(*ir.BufferLoad); ok && l.Buffer == st.Buffer {
				for i, ix := range l.Indices {
					bad = bad || !isVar(ix, d.epilogue.Block.IterVars[i].Var)
				}
			}
			return !bad
		})
		if bad {
			return nil, skip("the block after %q reads it elsewhere", cb.name)
		}
	} else if !isParam(f, st.Buffer) {
		return nil, skip("block %q writes an intermediate nobody reads", cb.name)
	}
	return d, nil
}

// matchPad matches block d.pad as a padding stage of a's four
// dimensions, A[i0, i1, i2, i3] = if_then_else(inside, src[i0, i1, i2 -
// padY, i3 - padX], value), value a constant, src a parameter.
func (p *planeSource) matchPad(f *ir.PrimFunc, pad *ir.BlockRealize, a *ir.Buffer) error {
	st, ok := pad.Block.Body.(*ir.BufferStore)
	if !ok || st.Buffer != a || !isSpatial(pad.Block) || len(st.Indices) != 4 {
		return skip("the block before the window is not its padding")
	}
	for i, ix := range st.Indices {
		if !isVar(ix, pad.Block.IterVars[i].Var) {
			return skip("padding indices")
		}
	}
	call, ok := st.Value.(*ir.Call)
	if !ok || call.Op != ir.OpIfThenElse || len(call.Args) != 3 {
		return skip("padding: not a conditional")
	}
	src, ok := call.Args[1].(*ir.BufferLoad)
	if !ok || !isParam(f, src.Buffer) || len(src.Indices) != 4 {
		return skip("padding: not a load of a parameter")
	}
	switch v := call.Args[2].(type) {
	case *ir.FloatImm:
	case *ir.Cast:
		if _, ok := v.Value.(*ir.FloatImm); !ok {
			return skip("padding value")
		}
	default:
		return skip("padding value")
	}
	iv := pad.Block.IterVars
	var off [4]int64
	for i, ix := range src.Indices {
		env := map[*ir.Var]int64{}
		for _, v := range iv {
			env[v.Var] = 0
		}
		o, ok := evalInt(ix, env)
		env[iv[i].Var] = 5
		o5, ok5 := evalInt(ix, env)
		if !ok || !ok5 || o5-o != 5 {
			return skip("padding: index %d", i)
		}
		for j, v := range iv {
			if j != i && usesVar(ix, v.Var) {
				return skip("padding: index %d", i)
			}
		}
		off[i] = o
	}
	if off[0] != 0 || off[1] != 0 {
		return skip("padding of batch or channels")
	}
	p.src, p.padY, p.padX, p.padValue = src.Buffer, -off[2], -off[3], call.Args[2]
	return nil
}

func isParam(f *ir.PrimFunc, b *ir.Buffer) bool {
	for _, p := range f.Params {
		if f.BufferMap[p] == b {
			return true
		}
	}
	return false
}

// windowIndex matches e = o·s + r + off (o the output position, r the
// window's, dilation 1) and returns s and off.
func windowIndex(e ir.Expr, o, r *ir.Var) (s, off int64, ok bool) {
	at := func(ov, rv int64) (int64, bool) {
		return evalInt(e, map[*ir.Var]int64{o: ov, r: rv})
	}
	off, ok0 := at(0, 0)
	s, ok1 := at(1, 0)
	r1, ok2 := at(0, 1)
	s3, ok3 := at(3, 2)
	s, r1 = s-off, r1-off
	if !ok0 || !ok1 || !ok2 || !ok3 || r1 != 1 || s < 1 || s3-off != 3*s+2 {
		return 0, 0, false
	}
	return s, off, true
}

// evalInt evaluates an integer expression of the variables in env.
func evalInt(e ir.Expr, env map[*ir.Var]int64) (int64, bool) {
	switch e := e.(type) {
	case *ir.IntImm:
		return e.Value, true
	case *ir.Var:
		v, ok := env[e]
		return v, ok
	case *ir.Cast:
		return evalInt(e.Value, env)
	case *ir.Binary:
		a, ok1 := evalInt(e.A, env)
		b, ok2 := evalInt(e.B, env)
		if !ok1 || !ok2 {
			return 0, false
		}
		switch e.Op {
		case ir.OpAdd:
			return a + b, true
		case ir.OpSub:
			return a - b, true
		case ir.OpMul:
			return a * b, true
		case ir.OpFloorDiv:
			if b > 0 && a >= 0 {
				return a / b, true
			}
		case ir.OpFloorMod:
			if b > 0 && a >= 0 {
				return a % b, true
			}
		}
	}
	return 0, false
}

// ceilDiv is a/b rounded up (b > 0).
func ceilDiv(a, b int64) int64 {
	if a >= 0 {
		return (a + b - 1) / b
	}
	return -((-a) / b)
}

// loops builds the function's new body.
func (d *depthwisePlane) loops(lanes, xv int64, opts Options) ir.Stmt {
	// Indices in the type of the convolution's iteration variables.
	it := d.c.Type
	i64 := func(v int64) ir.Expr { return ir.NewIntImm(it, v) }
	n := ir.NewVar("n", it)
	c := ir.NewVar("c", it)
	// The plane: sx phases of hn rows of wq columns; phase p, row r,
	// column j holds A[.., r, j·sx + p] (zero past A's width).
	hn := (d.Y-1)*d.sy + d.KH
	wq := xv + (d.KW-1)/d.sx
	plane := ir.NewBuffer("plane", ir.Float32, []ir.Expr{i64(d.sx * hn * wq)}, "global")

	// Channel indices of A for output channel c (rc = 0).
	conv := map[*ir.Var]ir.Expr{d.n: n, d.c: c, d.rc: i64(0)}
	an := ir.SubstituteExpr(d.a.Indices[0], conv)
	ac := ir.SubstituteExpr(d.a.Indices[1], conv)

	// The plane is src's rows and columns, copied (plain loops the C
	// compiler vectorizes), framed by the padding value.
	var fills []ir.Stmt
	rect := func(p, ra, rb, ja, jb int64, value func(r, j ir.Expr) ir.Expr) {
		if ra >= rb || ja >= jb {
			return
		}
		r := ir.NewVar("r", it)
		j := ir.NewVar("j", it)
		fills = append(fills, ir.NewFor(r, i64(ra), i64(rb-ra), ir.ForSerial,
			ir.NewFor(j, i64(ja), i64(jb-ja), ir.ForSerial,
				ir.NewBufferStore(plane, value(r, j), ir.Add(ir.Mul(ir.Add(i64(p*hn), r), i64(wq)), j)))))
	}
	padding := func(_, _ ir.Expr) ir.Expr { return d.padValue }
	// Plane row r is A's row r+offY, src's row r+offY-padY.
	r0, r1 := min(max(0, d.padY-d.offY), hn), max(min(hn, d.srcH+d.padY-d.offY), 0)
	for p := int64(0); p < d.sx; p++ {
		// Plane column j of phase p is A's column j·sx+p+offX.
		base := p + d.offX - d.padX
		j0, j1 := ceilDiv(-base, d.sx), ceilDiv(d.srcW-base, d.sx)
		j0, j1 = min(max(j0, 0), wq), max(min(j1, wq), 0)
		if r0 >= r1 || j0 >= j1 {
			rect(p, 0, hn, 0, wq, padding)
			continue
		}
		rect(p, 0, r0, 0, wq, padding)
		rect(p, r0, r1, 0, j0, padding)
		rect(p, r0, r1, j0, j1, func(r, j ir.Expr) ir.Expr {
			return ir.NewBufferLoad(d.src, an, ac, ir.Add(r, i64(d.offY-d.padY)), ir.Add(ir.Mul(j, i64(d.sx)), i64(base)))
		})
		rect(p, r0, r1, j1, wq, padding)
		rect(p, r1, hn, 0, wq, padding)
	}
	fill := ir.Seq(fills...)

	// A tile of yt rows × xv/lanes vectors stays in registers.
	yt := largestDivisor(d.Y, max(1, maxPlaneAccumulators/(xv/lanes)))
	yo := ir.NewVar("yo", it)
	acc := ir.NewBuffer("acc", ir.Float32, []ir.Expr{i64(yt * xv)}, "local")
	row := ir.NewBuffer("row", ir.Float32, []ir.Expr{i64(yt * xv)}, "global")
	// tile runs body over the tile: the row's y, the column x in it and
	// the slot of the tile.
	tile := func(name string, body func(y, x, slot ir.Expr) ir.Stmt) ir.Stmt {
		yi := ir.NewVar(name+"_y", it)
		xo := ir.NewVar(name+"_o", it)
		xi := ir.NewVar(name+"_i", it)
		x := ir.Add(ir.Mul(xo, i64(lanes)), xi)
		return ir.NewFor(yi, i64(0), i64(yt), ir.ForUnrolled,
			ir.NewFor(xo, i64(0), i64(xv/lanes), ir.ForUnrolled,
				ir.NewFor(xi, i64(0), i64(lanes), ir.ForVectorized,
					body(ir.Add(ir.Mul(yo, i64(yt)), yi), x, ir.Add(ir.Mul(yi, i64(xv)), x)))))
	}
	ry := ir.NewVar("ry", it)
	rx := ir.NewVar("rx", it)
	zero := tile("z", func(_, _, slot ir.Expr) ir.Stmt { return ir.NewBufferStore(acc, d.init, slot) })
	var wv ir.Expr
	if d.w != nil {
		wv = ir.SubstituteExpr(d.w, map[*ir.Var]ir.Expr{d.n: n, d.c: c, d.rc: i64(0), d.ry: ry, d.rx: rx})
	}
	var taps []ir.Stmt
	for k := int64(0); k < d.KW; k++ {
		// Tap rx = k reads phase k mod sx from column x + k div sx.
		kk := k
		taps = append(taps, tile("t", func(y, x, slot ir.Expr) ir.Stmt {
			at := ir.Add(ir.Mul(ir.Add(i64(kk%d.sx*hn), ir.Add(ir.Mul(y, i64(d.sy)), ry)), i64(wq)), ir.Add(x, i64(kk/d.sx)))
			term := ir.Expr(ir.NewBufferLoad(plane, at))
			if wv != nil {
				term = ir.Mul(term, ir.SubstituteExpr(wv, map[*ir.Var]ir.Expr{rx: i64(kk)}))
			}
			return ir.NewBufferStore(acc, ir.NewBinary(d.op, ir.NewBufferLoad(acc, slot), term), slot)
		}))
	}
	window := ir.NewFor(ry, i64(0), i64(d.KH), ir.ForSerial, ir.Seq(taps...))
	outBuf, epilogue, vectorTail := d.output(n, c)
	// When the epilogue reads nothing else along the row (a bias, Clip),
	// it runs on the tile's whole vectors, extra lanes included, and the
	// rows are copied out; otherwise it runs on the row's X elements.
	save := tile("s", func(y, x, slot ir.Expr) ir.Stmt {
		v := ir.Expr(ir.NewBufferLoad(acc, slot))
		if vectorTail {
			v = epilogue(y, x, v)
		}
		return ir.NewBufferStore(row, v, slot)
	})

	yi := ir.NewVar("yi", it)
	y := ir.Add(ir.Mul(yo, i64(yt)), yi)
	x := ir.NewVar("x", it)
	slot := ir.Add(ir.Mul(yi, i64(xv)), x)
	v := ir.Expr(ir.NewBufferLoad(row, slot))
	if !vectorTail {
		v = epilogue(y, x, v)
	}
	store := ir.NewBufferStore(outBuf, v, n, c, y, x)
	out := ir.Stmt(ir.NewFor(x, i64(0), i64(d.X), ir.ForSerial, store))
	if d.X%lanes == 0 {
		xo := ir.NewVar("xe_o", it)
		xi := ir.NewVar("xe_i", it)
		out = ir.NewFor(xo, i64(0), i64(d.X/lanes), ir.ForSerial,
			ir.NewFor(xi, i64(0), i64(lanes), ir.ForVectorized,
				ir.Substitute(store, map[*ir.Var]ir.Expr{x: ir.Add(ir.Mul(xo, i64(lanes)), xi)})))
	}
	out = ir.NewFor(yi, i64(0), i64(yt), ir.ForSerial, out)
	var flat *ir.Buffer
	if vectorTail && xv <= 2*d.X && d.Y > 1 && outBuf.Strides == nil {
		flat = flatView(outBuf, it, d.Y*d.X)
		save, out = d.overlappingRows(flat, outBuf, acc, row, n, c, yo, yt, lanes, xv, epilogue)
	}
	rows := ir.NewFor(yo, i64(0), i64(d.Y/yt), ir.ForSerial,
		&ir.Allocate{Buffer: acc, Body: &ir.Allocate{Buffer: row, Body: ir.Seq(zero, window, save, out)}})
	kind := ir.ForSerial
	if opts.ParallelFlops > 0 && d.C*d.Y*d.X*d.KH*d.KW*8 >= opts.ParallelFlops && d.C > 1 {
		kind = ir.ForParallel
	}
	body := ir.Stmt(ir.NewFor(n, i64(0), i64(d.N), ir.ForSerial,
		ir.NewFor(c, i64(0), i64(d.C), kind, &ir.Allocate{Buffer: plane, Body: ir.Seq(fill, rows)})))
	if flat != nil {
		body = &ir.DeclBuffer{Buffer: flat, Body: body}
	}
	return body
}

// overlappingRows returns the tile's store and the copy after it, when
// the epilogue reads nothing else along the row: every row but the plane's last is stored as its
// whole vectors straight into the output plane (flat, a view of outBuf
// as [N, C, Y·X]), the extra lanes running into the next row, which is
// stored after it and overwrites them; the last row, whose extra lanes
// would run past the channel's plane (into a plane another thread may
// be writing), goes through row and is copied out element by element.
// Rows of 56, 28, 14 or 7 (mobilenet_v2's) no longer pass through a
// buffer and a scalar copy each: its depthwise convolutions ran
// 1.06–1.2× faster so. Rows that whole vectors fill (112) are all
// stored straight into the output (its 112×112 one 1.2× faster).
func (d *depthwisePlane) overlappingRows(flat, outBuf, acc, row *ir.Buffer, n, c, yo ir.Expr, yt, lanes, xv int64, epilogue func(y, x, v ir.Expr) ir.Expr) (save, out ir.Stmt) {
	it := d.c.Type
	i64 := func(v int64) ir.Expr { return ir.NewIntImm(it, v) }
	yi := ir.NewVar("s_y", it)
	y := ir.Add(ir.Mul(yo, i64(yt)), yi)
	vectors := func(body func(x, slot ir.Expr) ir.Stmt) ir.Stmt {
		xo := ir.NewVar("s_o", it)
		xi := ir.NewVar("s_i", it)
		x := ir.Add(ir.Mul(xo, i64(lanes)), xi)
		return ir.NewFor(xo, i64(0), i64(xv/lanes), ir.ForUnrolled,
			ir.NewFor(xi, i64(0), i64(lanes), ir.ForVectorized, body(x, ir.Add(ir.Mul(yi, i64(xv)), x))))
	}
	value := func(x, slot ir.Expr) ir.Expr { return epilogue(y, x, ir.NewBufferLoad(acc, slot)) }
	direct := vectors(func(x, slot ir.Expr) ir.Stmt {
		return ir.NewBufferStore(flat, value(x, slot), n, c, ir.Add(ir.Mul(y, i64(d.X)), x))
	})
	last := vectors(func(x, slot ir.Expr) ir.Stmt { return ir.NewBufferStore(row, value(x, slot), slot) })
	if xv == d.X {
		// Whole vectors end every row: nothing runs over.
		return ir.NewFor(yi, i64(0), i64(yt), ir.ForUnrolled, direct), ir.Seq()
	}
	save = ir.NewFor(yi, i64(0), i64(yt), ir.ForUnrolled, &ir.IfThenElse{Cond: ir.LT(y, i64(d.Y-1)), Then: direct, Else: last})
	x := ir.NewVar("x", it)
	copyLast := ir.NewFor(x, i64(0), i64(d.X), ir.ForSerial,
		ir.NewBufferStore(outBuf, ir.NewBufferLoad(row, ir.Add(i64((yt-1)*xv), x)), n, c, i64(d.Y-1), x))
	return save, &ir.IfThenElse{Cond: ir.EQ(yo, i64(d.Y/yt-1)), Then: copyLast}
}

// output returns the buffer the function stores for channel (n, c), the
// value stored at (y, x) from the window's result v, and whether that
// value reads nothing else along the row (a bias, Clip: it may be
// computed on lanes past the row's end).
func (d *depthwisePlane) output(n, c ir.Expr) (*ir.Buffer, func(y, x, v ir.Expr) ir.Expr, bool) {
	outBuf := d.conv.Block.Body.(*ir.BufferStore).Buffer
	if d.epilogue == nil {
		return outBuf, func(_, _, v ir.Expr) ir.Expr { return v }, true
	}
	est := d.epilogue.Block.Body.(*ir.BufferStore)
	ev := d.epilogue.Block.IterVars
	vectorTail := true
	ir.Visit(est.Value, func(m ir.Node) bool {
		if l, ok := m.(*ir.BufferLoad); ok && l.Buffer != outBuf && usesVar(l, ev[3].Var) {
			vectorTail = false
		}
		return true
	})
	return est.Buffer, func(y, x, v ir.Expr) ir.Expr {
		e := (&ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
			if l, ok := e.(*ir.BufferLoad); ok && l.Buffer == outBuf {
				return v
			}
			return e
		}}).RewriteExpr(est.Value)
		return ir.SubstituteExpr(e, map[*ir.Var]ir.Expr{ev[0].Var: n, ev[1].Var: c, ev[2].Var: y, ev[3].Var: x})
	}, vectorTail
}
