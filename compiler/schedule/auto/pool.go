package auto

import (
	"github.com/kiln-ml/kiln/compiler/ir"
)

// Global pooling: a sum or maximum over the whole of each channel's plane
// of NCHW data,
//
//	C[n, c, 0, 0] op= A[n, c, ry, rx]
//
// (GlobalAveragePool's mean, the sum before its division) reads each
// plane as one run of H·W consecutive elements: a vector of partial
// results over whole vectors of the run, then its lanes and the run's
// tail, then the epilogue (the division) on the result. The rows of a
// plane (13 or 7 wide) divide into no vectors, so the row reduction
// (reduction_cpu.go) leaves them scalar.

// scheduleGlobalPool returns f rewritten by the rule above, or an error
// when block c is not a global pooling.
func scheduleGlobalPool(f *ir.PrimFunc, c convBlock, opts Options) (*ir.PrimFunc, error) {
	if len(c.spatial) != 4 || c.spatial[2] != 1 || c.spatial[3] != 1 || len(c.reduce) != 2 || c.dtype != ir.Float32 {
		return nil, skip("block %q is not a global pooling", c.name)
	}
	g, err := inlineAfter(f, c.name)
	if err != nil {
		return nil, err
	}
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
	// What is stored for channel (n, c) from the result v.
	out, at := st.Buffer, func(n, ch ir.Expr) []ir.Expr {
		return []ir.Expr{n, ch, ir.NewIntImm(n.DType(), 0), ir.NewIntImm(n.DType(), 0)}
	}
	value := func(_, _, v ir.Expr) ir.Expr { return v }
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
		out = est.Buffer
		value = func(n, ch, v ir.Expr) ir.Expr {
			w := (&ir.Rewriter{Expr: func(x ir.Expr) ir.Expr {
				if l, ok := x.(*ir.BufferLoad); ok && l.Buffer == st.Buffer {
					return v
				}
				return x
			}}).RewriteExpr(est.Value)
			zero := ir.NewIntImm(n.DType(), 0)
			return ir.SubstituteExpr(w, map[*ir.Var]ir.Expr{e.IterVars[0].Var: n, e.IterVars[1].Var: ch, e.IterVars[2].Var: zero, e.IterVars[3].Var: zero})
		}
	} else if !isParam(g, out) {
		return nil, skip("block %q writes an intermediate", c.name)
	}

	it := iv[0].Var.Type
	i64 := func(v int64) ir.Expr { return ir.NewIntImm(it, v) }
	N, C, K := shape[0], shape[1], shape[2]*shape[3]
	lanes := opts.VectorBytes / 4
	for lanes > 4 && lanes > K {
		lanes /= 2
	}
	flat := *a.Buffer
	flat.Shape, flat.Strides, flat.ElemOffset = []ir.Expr{i64(N * C * K)}, nil, nil
	n, ch := ir.NewVar("n", it), ir.NewVar("c", it)
	base := ir.Mul(ir.Add(ir.Mul(n, i64(C)), ch), i64(K))
	part := ir.NewBuffer("part", ir.Float32, []ir.Expr{i64(lanes)}, "local")
	sum := ir.NewBuffer("sum", ir.Float32, []ir.Expr{i64(1)}, "local")
	combine := func(x, y ir.Expr) ir.Expr { return ir.NewBinary(r.op, x, y) }
	l0, l, k, l2, t := ir.NewVar("l0", it), ir.NewVar("l", it), ir.NewVar("k", it), ir.NewVar("lr", it), ir.NewVar("t", it)
	zero := i64(0)
	body := ir.Seq(
		ir.NewFor(l0, zero, i64(lanes), ir.ForVectorized, ir.NewBufferStore(part, r.init, l0)),
		ir.NewFor(k, zero, i64(K/lanes), ir.ForSerial,
			ir.NewFor(l, zero, i64(lanes), ir.ForVectorized, ir.NewBufferStore(part,
				combine(ir.NewBufferLoad(part, l), ir.NewBufferLoad(&flat, ir.Add(base, ir.Add(ir.Mul(k, i64(lanes)), l)))), l))),
		ir.NewBufferStore(sum, r.init, zero),
		ir.NewFor(l2, zero, i64(lanes), ir.ForUnrolled,
			ir.NewBufferStore(sum, combine(ir.NewBufferLoad(sum, zero), ir.NewBufferLoad(part, l2)), zero)),
		ir.NewFor(t, zero, i64(K%lanes), ir.ForSerial,
			ir.NewBufferStore(sum, combine(ir.NewBufferLoad(sum, zero), ir.NewBufferLoad(&flat, ir.Add(base, ir.Add(i64(K/lanes*lanes), t)))), zero)),
		ir.NewBufferStore(out, value(n, ch, ir.NewBufferLoad(sum, zero)), at(n, ch)...),
	)
	kind := ir.ForSerial
	if opts.ParallelFlops > 0 && N*C*K >= genericParallelFactor*opts.ParallelFlops {
		kind = ir.ForParallel
	}
	loops := ir.NewFor(n, zero, i64(N), ir.ForSerial,
		ir.NewFor(ch, zero, i64(C), kind, &ir.Allocate{Buffer: part, Body: &ir.Allocate{Buffer: sum, Body: body}}))
	return g.WithBody(ir.NewRootBlock(&ir.DeclBuffer{Buffer: &flat, Body: loops})), nil
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
// where it is: per channel and output row, vectors of positions x combine
// the window's terms, each a vector load of A's row with a stride of sx
// (every other element for a stride of 2: two loads and a shuffle,
// codegen/c). A row no vector divides ends with a vector overlapping the
// one before it. The elementwise blocks after the window (an average's
// division) run on the vectors before they are stored.

// schedulePoolRows returns f rewritten by the rule above, or an error
// when block c is not an unpadded pooling window.
func schedulePoolRows(f *ir.PrimFunc, c convBlock, opts Options) (*ir.PrimFunc, error) {
	if c.rows >= 0 || len(c.spatial) != 4 || len(c.reduce) != 2 || c.dtype != ir.Float32 {
		return nil, skip("block %q is not a pooling window", c.name)
	}
	g, d, err := matchPlaneFunc(f, c)
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

	it := d.c.Type
	i64 := func(v int64) ir.Expr { return ir.NewIntImm(it, v) }
	n, ch, y, xt := ir.NewVar("n", it), ir.NewVar("c", it), ir.NewVar("y", it), ir.NewVar("xt", it)
	acc := ir.NewBuffer("acc", ir.Float32, []ir.Expr{i64(lanes)}, "local")
	// vector runs body over the lanes: lane l, position x.
	vector := func(body func(l, x ir.Expr) ir.Stmt) ir.Stmt {
		l := ir.NewVar("l", it)
		x := ir.Add(ir.Min(ir.Mul(xt, i64(lanes)), i64(d.X-lanes)), l)
		return ir.NewFor(l, i64(0), i64(lanes), ir.ForVectorized, body(l, x))
	}
	var taps []ir.Stmt
	for ry := int64(0); ry < d.KH; ry++ {
		for rx := int64(0); rx < d.KW; rx++ {
			taps = append(taps, vector(func(l, x ir.Expr) ir.Stmt {
				term := ir.SubstituteExpr(d.a, map[*ir.Var]ir.Expr{d.n: n, d.c: ch, d.y: y, d.x: x, d.ry: i64(ry), d.rx: i64(rx)})
				return ir.NewBufferStore(acc, ir.NewBinary(d.op, ir.NewBufferLoad(acc, l), term), l)
			}))
		}
	}
	out, epilogue, _ := d.output(n, ch)
	body := ir.Seq(
		vector(func(l, _ ir.Expr) ir.Stmt { return ir.NewBufferStore(acc, d.init, l) }),
		ir.Seq(taps...),
		vector(func(l, x ir.Expr) ir.Stmt {
			return ir.NewBufferStore(out, epilogue(y, x, ir.NewBufferLoad(acc, l)), n, ch, y, x)
		}),
	)
	kind := ir.ForSerial
	if opts.ParallelFlops > 0 && d.C*d.Y*d.X*d.KH*d.KW*8 >= opts.ParallelFlops && d.C > 1 {
		kind = ir.ForParallel
	}
	loops := ir.NewFor(n, i64(0), i64(d.N), ir.ForSerial, ir.NewFor(ch, i64(0), i64(d.C), kind,
		ir.NewFor(y, i64(0), i64(d.Y), ir.ForSerial, ir.NewFor(xt, i64(0), i64((d.X+lanes-1)/lanes), ir.ForSerial,
			&ir.Allocate{Buffer: acc, Body: body}))))
	return g.WithBody(ir.NewRootBlock(loops)), nil
}
