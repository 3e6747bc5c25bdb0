package schedule

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Blockize turns the loop nest under loop l, which must hold exactly one
// block and only loops above it, into a new block, name_o, around it
// (TVM's sch.blockize): each binding of the inner block splits into an
// outer part over the loops above l, which becomes an iteration variable
// of name_o, and an inner part over l and the loops below, c·outer +
// inner with inner in [0, c). The new block's regions are the inner
// block's relaxed over the inner loops. Tensorize replaces such a block's
// body with a tensor intrinsic. It returns the new block.
func (s *Schedule) Blockize(l LoopRV) (BlockRV, error) {
	out, err := s.blockize(l)
	if err != nil {
		return BlockRV{}, fmt.Errorf("blockize: %w", err)
	}
	s.record("%s = sch.blockize(%s)", s.bn(out), s.ln(l))
	return out, nil
}

func (s *Schedule) blockize(l LoopRV) (BlockRV, error) {
	name, body, err := s.blockized(l)
	if err != nil {
		return BlockRV{}, err
	}
	if err := s.commit("blockize", body); err != nil {
		return BlockRV{}, err
	}
	return s.blockRV(name), nil
}

// blockized returns the function body with loop l blockized and the new
// block's name.
func (s *Schedule) blockized(l LoopRV) (string, ir.Stmt, error) {
	ls, err := s.loop("", l)
	if err != nil {
		return "", nil, err
	}
	loop := ls.loop()
	rs := childRealizes(loop.Body)
	if len(rs) != 1 {
		return "", nil, fmt.Errorf("loop %q holds %d blocks, want one", loop.Var.Name, len(rs))
	}
	br := rs[0]
	blk := br.Block
	// The inner loops: l and the loops down to the block, nothing else.
	inner := []*ir.For{loop}
	for st := loop.Body; st != ir.Stmt(br); {
		f, ok := st.(*ir.For)
		if !ok {
			return "", nil, fmt.Errorf("loop %q holds statements other than loops around block %q", loop.Var.Name, blk.Name)
		}
		inner = append(inner, f)
		st = f.Body
	}
	innerVars := map[*ir.Var]bool{}
	b := bounds{}
	dom := map[*ir.Var]span{}
	for _, f := range inner {
		lo, ok1 := ir.IsConstInt(f.Min)
		ext, ok2 := ir.IsConstInt(f.Extent)
		if !ok1 || !ok2 || ext < 1 {
			return "", nil, fmt.Errorf("loop %q has non-constant bounds", f.Var.Name)
		}
		innerVars[f.Var] = true
		b[f.Var] = [2]int64{lo, lo + ext - 1}
		t := f.Var.Type
		dom[f.Var] = span{lo: constAffine(t, lo), hi: constAffine(t, lo+ext-1)}
	}
	outerVars := map[*ir.Var]bool{}
	for _, f := range ls.loops() {
		outerVars[f.Var] = true
	}
	// Split each binding: outer·c + inner.
	var ovs []ir.IterVar
	var ovals []ir.Expr
	newVals := make([]ir.Expr, len(br.IterValues))
	for i, e := range br.IterValues {
		iv := blk.IterVars[i]
		a := toAffine(e)
		in := affine{t: a.t}
		outer := affine{t: a.t, c: a.c}
		for _, t := range a.terms {
			v, isVar := t.atom.(*ir.Var)
			switch {
			case isVar && innerVars[v]:
				in.terms = append(in.terms, t)
			case !usesVar(t.atom, innerVars):
				outer.terms = append(outer.terms, t)
			case !usesVar(t.atom, outerVars):
				in.terms = append(in.terms, t)
			default:
				return "", nil, fmt.Errorf("the binding %s of %q mixes loops inside and outside loop %q", e, iv.Var.Name, loop.Var.Name)
			}
		}
		c := int64(1)
		var inExpr ir.Expr
		if len(in.terms) > 0 {
			lo, hi, ok := b.constBound(in.expr())
			if !ok || lo != 0 {
				return "", nil, fmt.Errorf("the part of binding %s of %q over the loops from %q does not range from 0", e, iv.Var.Name, loop.Var.Name)
			}
			c = hi + 1
			inExpr = in.expr()
		}
		if len(outer.terms) == 0 && outer.c == 0 {
			newVals[i] = inExpr
			if inExpr == nil {
				newVals[i] = ir.NewIntImm(a.t, 0)
			}
			continue
		}
		for _, t := range outer.terms {
			if t.coef%c != 0 {
				return "", nil, fmt.Errorf("cannot divide the binding %s of %q into an outer part and an inner one of extent %d", e, iv.Var.Name, c)
			}
		}
		if outer.c%c != 0 {
			return "", nil, fmt.Errorf("cannot divide the binding %s of %q into an outer part and an inner one of extent %d", e, iv.Var.Name, c)
		}
		q := affine{t: a.t, c: outer.c / c}
		for _, t := range outer.terms {
			q.terms = append(q.terms, term{atom: t.atom, coef: t.coef / c})
		}
		var ext ir.Expr
		if d, ok := ir.IsConstInt(iv.Dom.Extent); ok {
			ext = ir.NewIntImm(iv.Dom.Extent.DType(), (d+c-1)/c)
		} else if c == 1 {
			ext = iv.Dom.Extent
		} else {
			return "", nil, fmt.Errorf("iteration variable %q has the symbolic extent %s", iv.Var.Name, iv.Dom.Extent)
		}
		if m, ok := ir.IsConstInt(iv.Dom.Min); !ok || m != 0 {
			return "", nil, fmt.Errorf("iteration variable %q does not range from 0", iv.Var.Name)
		}
		vo := ir.NewVar(iv.Var.Name+"_o", iv.Var.Type)
		ovs = append(ovs, ir.IterVar{Var: vo, Dom: ir.RangeFromExtent(ext), Kind: iv.Kind})
		ovals = append(ovals, q.expr())
		nv := ir.Expr(vo)
		if c != 1 {
			nv = ir.NewBinary(ir.OpMul, vo, ir.NewIntImm(a.t, c))
		}
		if inExpr != nil {
			nv = ir.NewBinary(ir.OpAdd, nv, inExpr)
		}
		newVals[i] = nv
	}
	// The inner predicate may only keep the bindings in their domains,
	// which the new bindings then do.
	var pred ir.Expr = ir.BoolImm(true)
	if usesVar(br.Predicate, outerVars) {
		if !domainGuard(br) {
			return "", nil, fmt.Errorf("the predicate %s of block %q uses loops outside loop %q", br.Predicate, blk.Name, loop.Var.Name)
		}
		for _, c := range conjuncts(br.Predicate) {
			lt := c.(*ir.Binary)
			for i, v := range br.IterValues {
				if ir.Equal(v, lt.A) {
					pred = conjoin(pred, ir.LT(newVals[i], lt.B))
					break
				}
			}
		}
	} else {
		pred = br.Predicate
	}
	nbr := &ir.BlockRealize{IterValues: newVals, Predicate: pred, Block: blk}
	// The outer block's regions: the inner ones over the inner loops.
	vmap := map[*ir.Var]ir.Expr{}
	for i, iv := range blk.IterVars {
		vmap[iv.Var] = newVals[i]
	}
	relaxed := func(rs []ir.BufferRegion) []ir.BufferRegion {
		out := make([]ir.BufferRegion, len(rs))
		for i, r := range rs {
			out[i] = ir.BufferRegion{Buffer: r.Buffer, Region: make([]ir.Range, len(r.Region))}
			for d, rg := range r.Region {
				lo := toAffine(ir.SubstituteExpr(rg.Min, vmap))
				hi := lo.add(toAffine(rg.Extent), 1).add(constAffine(lo.t, 1), -1)
				sl, ok1 := relax(lo, dom)
				sh, ok2 := relax(hi, dom)
				ext := sh.hi.add(sl.lo, -1).add(constAffine(lo.t, 1), 1)
				if !ok1 || !ok2 || usesVar(sl.lo.expr(), innerVars) || usesVar(ext.expr(), innerVars) {
					out[i].Region[d] = ir.RangeFromExtent(r.Buffer.Shape[d])
					continue
				}
				out[i].Region[d] = ir.Range{Min: sl.lo.expr(), Extent: ext.expr()}
			}
		}
		return out
	}
	name := s.uniqueName(blk.Name + "_o")
	var oinit ir.Stmt
	if blk.Init != nil {
		// The init moves to the outer block, as a nest over the inner
		// loops that bind spatial variables, around a block name_init.
		if oinit, err = s.outerInit(nbr, inner); err != nil {
			return "", nil, err
		}
		ib := *blk
		ib.Init = nil
		ib.Reads = slices.Clone(blk.Reads)
		for i := len(blk.Writes) - 1; i >= 0; i-- {
			if !reads(blk, blk.Writes[i].Buffer) {
				ib.Reads = append([]ir.BufferRegion{blk.Writes[i]}, ib.Reads...)
			}
		}
		nbr = &ir.BlockRealize{IterValues: nbr.IterValues, Predicate: nbr.Predicate, Block: &ib}
	}
	obody := replace(loop, map[ir.Stmt]ir.Stmt{br: nbr})
	oblk := &ir.Block{Name: name, IterVars: ovs, Reads: relaxed(blk.Reads), Writes: relaxed(blk.Writes), Init: oinit, Body: obody}
	obr := &ir.BlockRealize{IterValues: ovals, Predicate: ir.BoolImm(true), Block: oblk}
	return name, replace(s.fn.Body, map[ir.Stmt]ir.Stmt{loop: obr}), nil
}

// outerInit returns the init of a blockized reduction: copies (named
// loop_init) of the inner loops that bind its spatial variables, around a
// block name_init storing the init over them.
func (s *Schedule) outerInit(br *ir.BlockRealize, inner []*ir.For) (ir.Stmt, error) {
	blk := br.Block
	spatial, reduce := bindingVars(br)
	vmap := map[*ir.Var]ir.Expr{}
	var copies []*ir.For
	for _, f := range inner {
		if spatial[f.Var] && reduce[f.Var] {
			return nil, fmt.Errorf("loop %q binds both spatial and reduction iteration variables of block %q", f.Var.Name, blk.Name)
		}
		if !spatial[f.Var] {
			continue
		}
		c := *f
		c.Var = ir.NewVar(f.Var.Name+"_init", f.Var.Type)
		vmap[f.Var] = c.Var
		copies = append(copies, &c)
	}
	ivs, vals, ivmap := spatialCopies(br, vmap)
	writes := make([]ir.BufferRegion, len(blk.Writes))
	for i, w := range blk.Writes {
		writes[i] = substRegion(w, ivmap)
	}
	pred := keptPredicate(br.Predicate, func(v *ir.Var) bool { return reduce[v] }, vmap)
	ib := &ir.Block{Name: s.uniqueName(blk.Name + "_init"), IterVars: ivs, Writes: writes, Body: substitute(blk.Init, ivmap)}
	var nest ir.Stmt = &ir.BlockRealize{IterValues: vals, Predicate: pred, Block: ib}
	for i := len(copies) - 1; i >= 0; i-- {
		copies[i].Body = nest
		nest = copies[i]
	}
	return nest, nil
}
