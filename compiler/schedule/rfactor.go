package schedule

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// RFactor factorizes the reduction of the block under loop l by the
// iterations of l (TVM's sch.rfactor): a new block, name_rf, takes the
// block's place in the loop nest and reduces into a new buffer name_rf
// that has l's extent as an extra dimension at factorAxis (negative
// counts from the end, as in Python); l now binds a spatial iteration
// variable of it, so l can run in parallel or as a vector. The block
// itself becomes the write-back: in a loop nest of its own after the
// original one, over the spatial loops and a copy of l, it reduces
// name_rf into the output. It returns the name_rf block.
//
// The block must be a reduction, with an init, whose body is one store
// out = out op x for op one of +, *, min and max; l must bind reduction
// iteration variables only, and no loop of the nest may bind both kinds.
// No other block in the loop nest may read the output. When the nest is
// under a loop shared with other blocks (a row's steps), the loops of the
// block's own below it are the nest: the write-back follows them there.
func (s *Schedule) RFactor(l LoopRV, factorAxis int) (BlockRV, error) {
	out, err := s.rfactor(l, factorAxis)
	if err != nil {
		return BlockRV{}, fmt.Errorf("rfactor: %w", err)
	}
	s.record("%s = sch.rfactor(%s, %d)", s.bn(out), s.ln(l), factorAxis)
	return out, nil
}

func (s *Schedule) rfactor(l LoopRV, factorAxis int) (BlockRV, error) {
	ls, err := s.loop("", l)
	if err != nil {
		return BlockRV{}, err
	}
	rf := ls.loop()
	var target *site
	for _, st := range s.scopeBlocks(ls.scope()) {
		if !st.under(rf) {
			continue
		}
		br := st.realize()
		for i, iv := range br.Block.IterVars {
			if iv.Kind == ir.IterReduce && usesVar(br.IterValues[i], map[*ir.Var]bool{rf.Var: true}) {
				if target != nil && target.realize() != br {
					return BlockRV{}, fmt.Errorf("loop %q carries the reductions of two blocks, %q and %q", rf.Var.Name, target.realize().Block.Name, br.Block.Name)
				}
				st := st
				target = &st
			}
		}
	}
	if target == nil {
		return BlockRV{}, fmt.Errorf("loop %q binds no reduction iteration variable of a block under it", rf.Var.Name)
	}
	bs := *target
	br := bs.realize()
	blk := br.Block
	if blk.Init == nil {
		return BlockRV{}, fmt.Errorf("block %q has no init (decompose_reduction separated it? rfactor it first)", blk.Name)
	}
	store, ok := blk.Body.(*ir.BufferStore)
	if !ok || len(blk.Writes) != 1 {
		return BlockRV{}, fmt.Errorf("the body of block %q is not a single store", blk.Name)
	}
	op, x, ok := combiner(store)
	if !ok {
		return BlockRV{}, fmt.Errorf("block %q does not store %s = %s op x for op one of +, *, min and max: its update is %s", blk.Name, store.Buffer.Name, store.Buffer.Name, store.Value)
	}
	out := store.Buffer
	init, ok := blk.Init.(*ir.BufferStore)
	if !ok || init.Buffer != out || !slices.EqualFunc(init.Indices, store.Indices, func(a, b ir.Expr) bool { return ir.Equal(a, b) }) {
		return BlockRV{}, fmt.Errorf("the init of block %q is not one store to %s at the update's indices", blk.Name, out.Name)
	}
	n := len(out.Shape)
	if factorAxis < -(n+1) || factorAxis > n {
		return BlockRV{}, fmt.Errorf("factor axis %d is out of range for the %d dimensions of %q and one more", factorAxis, n, out.Name)
	}
	if factorAxis < 0 {
		factorAxis += n + 1
	}
	loops := bs.loops()
	spatialLoops, reduceLoops := map[*ir.Var]bool{}, map[*ir.Var]bool{}
	reduceVars := map[*ir.Var]bool{}
	for i, iv := range blk.IterVars {
		set := spatialLoops
		if iv.Kind != ir.IterSpatial {
			set = reduceLoops
			reduceVars[iv.Var] = true
		}
		if iv.Kind == ir.IterOpaque {
			return BlockRV{}, fmt.Errorf("block %q has the opaque iteration variable %q", blk.Name, iv.Var.Name)
		}
		ir.Visit(br.IterValues[i], func(nd ir.Node) bool {
			if v, ok := nd.(*ir.Var); ok {
				set[v] = true
			}
			return true
		})
	}
	if spatialLoops[rf.Var] {
		return BlockRV{}, fmt.Errorf("loop %q binds a spatial iteration variable of block %q", rf.Var.Name, blk.Name)
	}
	loopVars := map[*ir.Var]bool{}
	for _, f := range loops {
		loopVars[f.Var] = true
	}
	for _, f := range loops {
		if spatialLoops[f.Var] && reduceLoops[f.Var] {
			return BlockRV{}, fmt.Errorf("loop %q binds both spatial and reduction iteration variables of block %q", f.Var.Name, blk.Name)
		}
		if reduceLoops[f.Var] && (usesVar(f.Min, loopVars) || usesVar(f.Extent, loopVars)) {
			return BlockRV{}, fmt.Errorf("the bounds of loop %q depend on other loops", f.Var.Name)
		}
	}
	for _, ix := range store.Indices {
		if usesVar(ix, reduceVars) {
			return BlockRV{}, fmt.Errorf("block %q stores %q at an index of its reduction variables", blk.Name, out.Name)
		}
	}
	scopeBR := bs.scope()
	top := topOf(bs, scopeBR)
	if own := ownNest(s.scopeBlocks(scopeBR), bs, loops, reduceLoops); own != nil && own != top {
		top, loops = own, loops[slices.Index(loops, own):]
		loopVars = loopSet(loops)
	}
	for _, st := range s.scopeBlocks(scopeBR) {
		if o := st.realize(); o != br && st.under(top) && (reads(o.Block, out) || writes(o.Block, out)) {
			return BlockRV{}, fmt.Errorf("block %q, in the loop nest of %q, accesses %q", o.Block.Name, blk.Name, out.Name)
		}
	}
	if top == ir.Stmt(br) {
		return BlockRV{}, fmt.Errorf("block %q is not in a loop", blk.Name)
	}

	// The rfactor block: the spatial variables, vk for l and one new
	// reduction variable per other loop of the reduction bindings.
	rfName := s.uniqueName(blk.Name + "_rf")
	shape := slices.Insert(slices.Clone(out.Shape), factorAxis, rf.Extent)
	rfBuf := ir.NewBuffer(rfName, out.DType, shape, out.StorageScope())
	ivs, vals, vmap := spatialCopies(br, nil)
	loopIter := map[*ir.Var]ir.Expr{}
	var vk *ir.Var
	for _, f := range loops {
		if !reduceLoops[f.Var] {
			continue
		}
		nv := ir.NewVar("v"+f.Var.Name, f.Var.Type)
		kind := ir.IterReduce
		if f == rf {
			kind, vk = ir.IterSpatial, nv
		}
		loopIter[f.Var] = nv
		ivs = append(ivs, ir.IterVar{Var: nv, Dom: ir.Range{Min: f.Min, Extent: f.Extent}, Kind: kind})
		vals = append(vals, f.Var)
	}
	for i, iv := range blk.IterVars {
		if iv.Kind == ir.IterReduce {
			vmap[iv.Var] = ir.SubstituteExpr(br.IterValues[i], loopIter)
		}
	}
	rfIndex := func(idx []ir.Expr, v ir.Expr) []ir.Expr {
		k := v
		if c, ok := ir.IsConstInt(rf.Min); !ok || c != 0 {
			k = ir.Sub(v, rf.Min)
		}
		return slices.Insert(slices.Clone(idx), factorAxis, k)
	}
	idx := make([]ir.Expr, n)
	for d, e := range store.Indices {
		idx[d] = ir.SubstituteExpr(e, vmap)
	}
	ridx := rfIndex(idx, vk)
	rfInit := identity(op, out.DType)
	if rfInit == nil {
		rfInit = ir.SubstituteExpr(init.Value, vmap)
	}
	rfBlk := &ir.Block{
		Name:     rfName,
		IterVars: ivs,
		Init:     ir.NewBufferStore(rfBuf, rfInit, ridx...),
		Body:     &ir.BufferStore{Buffer: rfBuf, Value: ir.NewBinary(op, rfBuf.Load(ridx...), ir.SubstituteExpr(x, vmap)), Indices: ridx},
		Writes:   []ir.BufferRegion{ir.PointRegion(rfBuf, ridx...)},
	}
	for _, rg := range blk.Reads {
		if rg.Buffer == out {
			rfBlk.Reads = append(rfBlk.Reads, ir.PointRegion(rfBuf, ridx...))
			continue
		}
		rfBlk.Reads = append(rfBlk.Reads, substRegion(rg, vmap))
	}
	rfRealize := &ir.BlockRealize{IterValues: vals, Predicate: br.Predicate, Block: rfBlk}

	// The write-back: copies of the spatial loops and of l.
	copyLoops := func() ([]*ir.For, map[*ir.Var]ir.Expr, error) {
		copyOf := map[*ir.Var]ir.Expr{}
		var nest []*ir.For
		for _, f := range loops {
			if !spatialLoops[f.Var] && f != rf {
				continue
			}
			c := *f
			c.Var = ir.NewVar(f.Var.Name, f.Var.Type)
			c.Kind, c.ThreadTag, c.Annotations = ir.ForSerial, "", nil
			c.Min, c.Extent = ir.SubstituteExpr(f.Min, copyOf), ir.SubstituteExpr(f.Extent, copyOf)
			var others = map[*ir.Var]bool{}
			for v := range loopVars {
				if _, copied := copyOf[v]; !copied {
					others[v] = true
				}
			}
			if usesVar(c.Min, others) || usesVar(c.Extent, others) {
				return nil, nil, fmt.Errorf("the bounds of loop %q depend on a loop that the write-back block does not have", f.Var.Name)
			}
			copyOf[f.Var] = c.Var
			nest = append(nest, &c)
		}
		return nest, copyOf, nil
	}
	wrap := func(nest []*ir.For, inner ir.Stmt) ir.Stmt {
		for i := len(nest) - 1; i >= 0; i-- {
			nest[i].Body = inner
			inner = nest[i]
		}
		return inner
	}
	nest, copyOf, err := copyLoops()
	if err != nil {
		return BlockRV{}, err
	}
	// When the predicate may skip every instance of some value of l (a
	// factor larger than the extent), that part of name_rf is never
	// initialized. A guard binding < bound, increasing in the other
	// loops, holds for some instance exactly when it holds with them at
	// their minimum, where the init runs: the write-back's copy of l
	// stops where that guard fails.
	wext := rf.Extent
	for _, c := range conjuncts(br.Predicate) {
		if !usesVar(c, map[*ir.Var]bool{rf.Var: true}) {
			continue
		}
		fail := fmt.Errorf("the predicate %s of block %q may skip whole iterations of loop %q, leaving parts of the factored buffer unset", c, blk.Name, rf.Var.Name)
		g, ok := guardAtMin(c, loops, copyOf)
		if !ok {
			return BlockRV{}, fail
		}
		if k, ok := ir.IsConstInt(g); ok && k != 0 {
			continue
		}
		count, ok := guardCount(g, copyOf[rf.Var].(*ir.Var), rf)
		if !ok {
			return BlockRV{}, fail
		}
		if e, _ := ir.IsConstInt(wext); count < e {
			wext = ir.NewIntImm(rf.Extent.DType(), count)
		}
	}
	if !ir.Equal(wext, rf.Extent) {
		for _, f := range nest {
			if f.Var == copyOf[rf.Var] {
				f.Extent = wext
			}
		}
	}
	wivs, wvals, wmap := spatialCopies(br, copyOf)
	vw := ir.NewVar("v"+rf.Var.Name, rf.Var.Type)
	wivs = append(wivs, ir.IterVar{Var: vw, Dom: ir.Range{Min: rf.Min, Extent: wext}, Kind: ir.IterReduce})
	wvals = append(wvals, copyOf[rf.Var])
	widx := make([]ir.Expr, n)
	for d, e := range store.Indices {
		widx[d] = ir.SubstituteExpr(e, wmap)
	}
	wridx := rfIndex(widx, vw)
	wb := &ir.Block{
		Name:     blk.Name,
		IterVars: wivs,
		Init:     ir.NewBufferStore(out, ir.SubstituteExpr(init.Value, wmap), widx...),
		Body:     &ir.BufferStore{Buffer: out, Value: ir.NewBinary(op, out.Load(widx...), rfBuf.Load(wridx...)), Indices: widx},
		Reads:    []ir.BufferRegion{ir.PointRegion(out, widx...), ir.PointRegion(rfBuf, wridx...)},
		Writes:   []ir.BufferRegion{ir.PointRegion(out, widx...)},
	}
	pred := keptPredicate(br.Predicate, func(v *ir.Var) bool {
		_, copied := copyOf[v]
		return loopVars[v] && !copied
	}, copyOf)
	wnest := wrap(nest, &ir.BlockRealize{IterValues: wvals, Predicate: pred, Block: wb})
	newTop := replace(top, map[ir.Stmt]ir.Stmt{br: rfRealize})
	body := replace(scopeBR.Block.Body, map[ir.Stmt]ir.Stmt{top: ir.Seq(newTop, wnest)})
	if err := s.commit("rfactor", replace(s.fn.Body, map[ir.Stmt]ir.Stmt{scopeBR: withAlloc(scopeBR, body, []*ir.Buffer{rfBuf}, nil)})); err != nil {
		return BlockRV{}, err
	}
	return s.blockRV(rfName), nil
}

// combiner matches out[idx] = out[idx] op x (or x op out[idx]).
func combiner(st *ir.BufferStore) (ir.BinaryOp, ir.Expr, bool) {
	b, ok := st.Value.(*ir.Binary)
	if !ok || (b.Op != ir.OpAdd && b.Op != ir.OpMul && b.Op != ir.OpMin && b.Op != ir.OpMax) {
		return 0, nil, false
	}
	self := func(e ir.Expr) bool {
		l, ok := e.(*ir.BufferLoad)
		return ok && l.Buffer == st.Buffer && slices.EqualFunc(l.Indices, st.Indices, func(a, b ir.Expr) bool { return ir.Equal(a, b) })
	}
	switch {
	case self(b.A) && !loadsBuffer(b.B, st.Buffer):
		return b.Op, b.B, true
	case self(b.B) && !loadsBuffer(b.A, st.Buffer):
		return b.Op, b.A, true
	}
	return 0, nil, false
}

// identity returns the identity of + and * in t; min and max, idempotent,
// start the factored reduction from the block's own init (nil here).
func identity(op ir.BinaryOp, t ir.DType) ir.Expr {
	switch op {
	case ir.OpAdd:
		return ir.Const(t, 0)
	case ir.OpMul:
		return ir.Const(t, 1)
	}
	return nil
}

// guardAtMin returns guard c (a < b) with the loops of the nest that
// copyOf does not copy at their minimum and the others copied, when a is
// increasing in those loops (so that c holds for some of their values
// exactly when it holds at the minimum) and b does not use them.
func guardAtMin(c ir.Expr, loops []*ir.For, copyOf map[*ir.Var]ir.Expr) (ir.Expr, bool) {
	lt, ok := c.(*ir.Binary)
	if !ok || lt.Op != ir.OpLT {
		return nil, false
	}
	others := map[*ir.Var]ir.Expr{}
	for _, f := range loops {
		if _, copied := copyOf[f.Var]; !copied {
			others[f.Var] = f.Min
		}
	}
	set := map[*ir.Var]bool{}
	for v := range others {
		set[v] = true
	}
	if usesVar(lt.B, set) {
		return nil, false
	}
	for _, t := range toAffine(lt.A).terms {
		v, isVar := t.atom.(*ir.Var)
		if isVar && set[v] && t.coef < 0 || !isVar && usesVar(t.atom, set) {
			return nil, false
		}
	}
	for _, v := range others {
		if usesVar(v, set) {
			return nil, false
		}
	}
	vmap := map[*ir.Var]ir.Expr{}
	for v, e := range others {
		vmap[v] = e
	}
	for v, e := range copyOf {
		vmap[v] = e
	}
	b := bounds{}
	for _, f := range loops {
		if cv, ok := copyOf[f.Var].(*ir.Var); ok {
			lo, ok1 := ir.IsConstInt(f.Min)
			ext, ok2 := ir.IsConstInt(f.Extent)
			if ok1 && ok2 && ext > 0 {
				b[cv] = [2]int64{lo, lo + ext - 1}
			}
		}
	}
	return b.simplify(ir.SubstituteExpr(c, vmap)), true
}

// guardCount returns how many iterations of loop rf, from its minimum,
// satisfy guard g over its copy v: g must be c·v + d < b with constants
// c > 0, d and b, and rf's bounds constant.
func guardCount(g ir.Expr, v *ir.Var, rf *ir.For) (int64, bool) {
	lt, ok := g.(*ir.Binary)
	if !ok || lt.Op != ir.OpLT {
		return 0, false
	}
	b, ok1 := ir.IsConstInt(lt.B)
	mn, ok2 := ir.IsConstInt(rf.Min)
	ext, ok3 := ir.IsConstInt(rf.Extent)
	a := toAffine(lt.A)
	if !ok1 || !ok2 || !ok3 || len(a.terms) != 1 || a.terms[0].atom != ir.Expr(v) || a.terms[0].coef <= 0 {
		return 0, false
	}
	upper := floorDiv(b-a.c-1, a.terms[0].coef) + 1 // v < upper
	return max(0, min(ext, upper-mn)), true
}
