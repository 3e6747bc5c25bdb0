package ir

import "maps"

// Visit walks n pre-order: it calls f on n and, when f returns true, on n's
// children. n may be an Expr, a Stmt, a *Block or a *PrimFunc (whose body
// is walked). Children are the sub-expressions and sub-statements; defining
// occurrences of variables (loop variables, iteration variables, let
// variables) and buffers are not visited, their uses are.
func Visit(n Node, f func(Node) bool) {
	if n == nil || !f(n) {
		return
	}
	visitChildren(n, func(c Node) { Visit(c, f) })
}

// PostOrderVisit calls f on every node under n (see Visit) after its
// children.
func PostOrderVisit(n Node, f func(Node)) {
	var walk func(Node)
	walk = func(n Node) {
		if n == nil {
			return
		}
		visitChildren(n, walk)
		f(n)
	}
	walk(n)
}

func visitChildren(n Node, f func(Node)) {
	exprs := func(es []Expr) {
		for _, e := range es {
			f(e)
		}
	}
	regions := func(rs []BufferRegion) {
		for _, r := range rs {
			for _, rg := range r.Region {
				f(rg.Min)
				f(rg.Extent)
			}
		}
	}
	switch n := n.(type) {
	case *PrimFunc:
		f(n.Body)
	case *Binary:
		f(n.A)
		f(n.B)
	case *Not:
		f(n.A)
	case *Cast:
		f(n.Value)
	case *Select:
		f(n.Cond)
		f(n.True)
		f(n.False)
	case *BufferLoad:
		exprs(n.Indices)
	case *Call:
		exprs(n.Args)
	case *Ramp:
		f(n.Base)
		f(n.Stride)
	case *Broadcast:
		f(n.Value)
	case *Let:
		f(n.Value)
		f(n.Body)
	case *For:
		f(n.Min)
		f(n.Extent)
		f(n.Body)
	case *BlockRealize:
		exprs(n.IterValues)
		if n.Predicate != nil {
			f(n.Predicate)
		}
		f(n.Block)
	case *Block:
		for _, iv := range n.IterVars {
			f(iv.Dom.Min)
			f(iv.Dom.Extent)
		}
		regions(n.Reads)
		regions(n.Writes)
		if n.Init != nil {
			f(n.Init)
		}
		f(n.Body)
	case *BufferStore:
		f(n.Value)
		exprs(n.Indices)
	case *Allocate:
		f(n.Body)
	case *DeclBuffer:
		f(n.Body)
	case *SeqStmt:
		for _, s := range n.Seq {
			f(s)
		}
	case *IfThenElse:
		f(n.Cond)
		f(n.Then)
		if n.Else != nil {
			f(n.Else)
		}
	case *LetStmt:
		f(n.Value)
		f(n.Body)
	case *Evaluate:
		f(n.Value)
	case *AttrStmt:
		if n.Node != nil {
			f(n.Node)
		}
		f(n.Value)
		f(n.Body)
	case *AssertStmt:
		f(n.Cond)
	}
}

// Rewriter is a post-order rewriter: it rebuilds a tree bottom-up, copying
// a node only when one of its children changed (the input is never
// modified), and offers each rebuilt node to its hooks. Nil hooks leave
// nodes as they are. A pass is usually one Rewriter literal:
//
//	out := (&ir.Rewriter{Expr: func(e ir.Expr) ir.Expr { … }}).RewriteStmt(body)
type Rewriter struct {
	// PreStmt, when set, sees each statement before its children: returning
	// (replacement, true) puts replacement in its place and skips the
	// children and the Stmt hook.
	PreStmt func(s Stmt) (Stmt, bool)
	// Expr sees each expression after its children were rewritten and
	// returns its replacement (or the argument). Variable uses pass through
	// it; variable definitions do not.
	Expr func(e Expr) Expr
	// Stmt sees each statement after its children were rewritten.
	Stmt func(s Stmt) Stmt
	// Buffer maps each buffer referenced (loads, stores, regions,
	// allocations, buffer maps) to its replacement; it is called once per
	// distinct buffer in a rewrite.
	Buffer func(b *Buffer) *Buffer
}

// Transform rewrites s post-order with the two hooks (either may be nil).
func Transform(s Stmt, expr func(Expr) Expr, stmt func(Stmt) Stmt) Stmt {
	return (&Rewriter{Expr: expr, Stmt: stmt}).RewriteStmt(s)
}

// RewriteStmt rewrites a statement.
func (r *Rewriter) RewriteStmt(s Stmt) Stmt { return (&rewrite{r: r}).stmt(s) }

// RewriteExpr rewrites an expression.
func (r *Rewriter) RewriteExpr(e Expr) Expr { return (&rewrite{r: r}).expr(e) }

// RewriteFunc rewrites a PrimFunc's body and buffer map; it returns f itself when
// nothing changed.
func (r *Rewriter) RewriteFunc(f *PrimFunc) *PrimFunc {
	w := &rewrite{r: r}
	body := w.stmt(f.Body)
	changed := body != f.Body
	bm := make(map[*Var]*Buffer, len(f.BufferMap))
	for p, b := range f.BufferMap {
		nb := w.buffer(b)
		changed = changed || nb != b
		bm[p] = nb
	}
	if !changed {
		return f
	}
	g := *f
	g.Body = body
	g.BufferMap = bm
	return &g
}

type rewrite struct {
	r    *Rewriter
	bufs map[*Buffer]*Buffer
}

func (w *rewrite) buffer(b *Buffer) *Buffer {
	if w.r.Buffer == nil || b == nil {
		return b
	}
	if nb, ok := w.bufs[b]; ok {
		return nb
	}
	if w.bufs == nil {
		w.bufs = map[*Buffer]*Buffer{}
	}
	nb := w.r.Buffer(b)
	w.bufs[b] = nb
	return nb
}

func (w *rewrite) exprs(es []Expr) ([]Expr, bool) {
	var out []Expr
	for i, e := range es {
		ne := w.expr(e)
		if ne != e && out == nil {
			out = make([]Expr, len(es))
			copy(out, es[:i])
		}
		if out != nil {
			out[i] = ne
		}
	}
	if out == nil {
		return es, false
	}
	return out, true
}

func (w *rewrite) rng(r Range) (Range, bool) {
	mn, ex := w.expr(r.Min), w.expr(r.Extent)
	return Range{Min: mn, Extent: ex}, mn != r.Min || ex != r.Extent
}

func (w *rewrite) regions(rs []BufferRegion) ([]BufferRegion, bool) {
	changed := false
	out := make([]BufferRegion, len(rs))
	for i, r := range rs {
		nb := w.buffer(r.Buffer)
		reg := make([]Range, len(r.Region))
		c := nb != r.Buffer
		for j, rg := range r.Region {
			var cj bool
			reg[j], cj = w.rng(rg)
			c = c || cj
		}
		if c {
			out[i] = BufferRegion{Buffer: nb, Region: reg}
			changed = true
		} else {
			out[i] = r
		}
	}
	if !changed {
		return rs, false
	}
	return out, true
}

func (w *rewrite) expr(e Expr) Expr {
	if e == nil {
		return nil
	}
	var out Expr = e
	switch n := e.(type) {
	case *Binary:
		a, b := w.expr(n.A), w.expr(n.B)
		if a != n.A || b != n.B {
			out = &Binary{Op: n.Op, A: a, B: b}
		}
	case *Not:
		if a := w.expr(n.A); a != n.A {
			out = &Not{A: a}
		}
	case *Cast:
		if v := w.expr(n.Value); v != n.Value {
			out = &Cast{Type: n.Type, Value: v}
		}
	case *Select:
		c, t, f := w.expr(n.Cond), w.expr(n.True), w.expr(n.False)
		if c != n.Cond || t != n.True || f != n.False {
			out = &Select{Cond: c, True: t, False: f}
		}
	case *BufferLoad:
		ix, c := w.exprs(n.Indices)
		b := w.buffer(n.Buffer)
		if c || b != n.Buffer {
			out = &BufferLoad{Buffer: b, Indices: ix}
		}
	case *Call:
		if args, c := w.exprs(n.Args); c {
			out = &Call{Type: n.Type, Op: n.Op, Args: args}
		}
	case *Ramp:
		b, s := w.expr(n.Base), w.expr(n.Stride)
		if b != n.Base || s != n.Stride {
			out = &Ramp{Base: b, Stride: s, Lanes: n.Lanes}
		}
	case *Broadcast:
		if v := w.expr(n.Value); v != n.Value {
			out = &Broadcast{Value: v, Lanes: n.Lanes}
		}
	case *Let:
		v, b := w.expr(n.Value), w.expr(n.Body)
		if v != n.Value || b != n.Body {
			out = &Let{Var: n.Var, Value: v, Body: b}
		}
	}
	if w.r.Expr != nil {
		out = w.r.Expr(out)
	}
	return out
}

func (w *rewrite) stmt(s Stmt) Stmt {
	if s == nil {
		return nil
	}
	if w.r.PreStmt != nil {
		if ns, ok := w.r.PreStmt(s); ok {
			return ns
		}
	}
	var out Stmt = s
	switch n := s.(type) {
	case *For:
		mn, ex, body := w.expr(n.Min), w.expr(n.Extent), w.stmt(n.Body)
		if mn != n.Min || ex != n.Extent || body != n.Body {
			c := *n
			c.Min, c.Extent, c.Body = mn, ex, body
			out = &c
		}
	case *BlockRealize:
		vals, c1 := w.exprs(n.IterValues)
		pred := w.expr(n.Predicate)
		blk := w.block(n.Block)
		if c1 || pred != n.Predicate || blk != n.Block {
			out = &BlockRealize{IterValues: vals, Predicate: pred, Block: blk}
		}
	case *BufferStore:
		v := w.expr(n.Value)
		ix, c := w.exprs(n.Indices)
		b := w.buffer(n.Buffer)
		if c || v != n.Value || b != n.Buffer {
			out = &BufferStore{Buffer: b, Value: v, Indices: ix}
		}
	case *Allocate:
		b, body := w.buffer(n.Buffer), w.stmt(n.Body)
		if b != n.Buffer || body != n.Body {
			out = &Allocate{Buffer: b, Body: body}
		}
	case *DeclBuffer:
		b, body := w.buffer(n.Buffer), w.stmt(n.Body)
		if b != n.Buffer || body != n.Body {
			out = &DeclBuffer{Buffer: b, Body: body}
		}
	case *SeqStmt:
		var seq []Stmt
		for i, c := range n.Seq {
			nc := w.stmt(c)
			if nc != c && seq == nil {
				seq = make([]Stmt, i, len(n.Seq))
				copy(seq, n.Seq[:i])
			}
			if seq != nil {
				seq = append(seq, nc)
			}
		}
		if seq != nil {
			out = &SeqStmt{Seq: seq}
		}
	case *IfThenElse:
		c, t, e := w.expr(n.Cond), w.stmt(n.Then), w.stmt(n.Else)
		if c != n.Cond || t != n.Then || e != n.Else {
			out = &IfThenElse{Cond: c, Then: t, Else: e}
		}
	case *LetStmt:
		v, body := w.expr(n.Value), w.stmt(n.Body)
		if v != n.Value || body != n.Body {
			out = &LetStmt{Var: n.Var, Value: v, Body: body}
		}
	case *Evaluate:
		if v := w.expr(n.Value); v != n.Value {
			out = &Evaluate{Value: v}
		}
	case *AttrStmt:
		nd, v, body := w.expr(n.Node), w.expr(n.Value), w.stmt(n.Body)
		if nd != n.Node || v != n.Value || body != n.Body {
			out = &AttrStmt{Node: nd, Key: n.Key, Value: v, Body: body}
		}
	case *AssertStmt:
		if c := w.expr(n.Cond); c != n.Cond {
			out = &AssertStmt{Cond: c, Message: n.Message}
		}
	}
	if w.r.Stmt != nil {
		out = w.r.Stmt(out)
	}
	return out
}

func (w *rewrite) block(b *Block) *Block {
	changed := false
	ivs := make([]IterVar, len(b.IterVars))
	for i, iv := range b.IterVars {
		d, c := w.rng(iv.Dom)
		ivs[i] = IterVar{Var: iv.Var, Dom: d, Kind: iv.Kind}
		changed = changed || c
	}
	reads, c1 := w.regions(b.Reads)
	writes, c2 := w.regions(b.Writes)
	init := w.stmt(b.Init)
	body := w.stmt(b.Body)
	allocs := make([]*Buffer, len(b.AllocBuffers))
	for i, a := range b.AllocBuffers {
		allocs[i] = w.buffer(a)
		changed = changed || allocs[i] != a
	}
	if !changed && !c1 && !c2 && init == b.Init && body == b.Body {
		return b
	}
	if len(b.AllocBuffers) == 0 {
		allocs = b.AllocBuffers
	}
	return &Block{Name: b.Name, IterVars: ivs, Reads: reads, Writes: writes, Init: init, Body: body,
		AllocBuffers: allocs, Annotations: maps.Clone(b.Annotations)}
}

// Substitute replaces uses of the variables in vmap, in s and in the shapes,
// strides and offsets of the buffers s references (those become new
// buffers when they change).
func Substitute(s Stmt, vmap map[*Var]Expr) Stmt { return substituter(vmap).RewriteStmt(s) }

// SubstituteExpr replaces uses of the variables in vmap in e.
func SubstituteExpr(e Expr, vmap map[*Var]Expr) Expr { return substituter(vmap).RewriteExpr(e) }

// SubstituteFunc applies Substitute to a PrimFunc's body and buffer map.
func SubstituteFunc(f *PrimFunc, vmap map[*Var]Expr) *PrimFunc {
	return substituter(vmap).RewriteFunc(f)
}

func substituter(vmap map[*Var]Expr) *Rewriter {
	r := &Rewriter{}
	r.Expr = func(e Expr) Expr {
		if v, ok := e.(*Var); ok {
			if ne, ok := vmap[v]; ok {
				return ne
			}
		}
		return e
	}
	inner := &Rewriter{Expr: r.Expr}
	r.Buffer = func(b *Buffer) *Buffer {
		shape, c1 := (&rewrite{r: inner}).exprs(b.Shape)
		strides, c2 := (&rewrite{r: inner}).exprs(b.Strides)
		off := inner.RewriteExpr(b.ElemOffset)
		if !c1 && !c2 && off == b.ElemOffset {
			return b
		}
		nb := *b
		nb.Shape, nb.Strides, nb.ElemOffset = shape, strides, off
		return &nb
	}
	return r
}
