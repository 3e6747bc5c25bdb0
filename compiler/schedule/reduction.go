package schedule

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// DecomposeReduction splits reduction block b into an init block, placed
// right before loop l, that stores the reduction's initial value, and an
// update block (b renamed name_update, which b's handle follows) without
// an init (TVM's sch.decompose_reduction). The init block gets copies
// (named loop_init) of the loops between l and b that bind spatial
// iteration variables only. l must enclose b, no loop above l may carry
// the reduction, and every loop from l down to b must bind an iteration
// variable of b (a loop binding none would repeat the update; bindings
// x // c and x % c, a fused loop split again, count as binding x). The
// reduction must not run over variables of an enclosing block (decompose
// Blockize's outer block instead, which holds the init). It returns the
// init block, named name_init.
func (s *Schedule) DecomposeReduction(b BlockRV, l LoopRV) (BlockRV, error) {
	out, err := s.decomposeReduction(b, l)
	if err != nil {
		return BlockRV{}, fmt.Errorf("decompose_reduction: %w", err)
	}
	s.record("%s = sch.decompose_reduction(%s, %s)", s.bn(out), s.bn(b), s.ln(l))
	return out, nil
}

func (s *Schedule) decomposeReduction(b BlockRV, l LoopRV) (BlockRV, error) {
	bs, err := s.block("", b)
	if err != nil {
		return BlockRV{}, err
	}
	ls, err := s.loop("", l)
	if err != nil {
		return BlockRV{}, err
	}
	br, loop := bs.realize(), ls.loop()
	blk := br.Block
	if blk.Init == nil {
		return BlockRV{}, fmt.Errorf("block %q has no init (it is not a reduction)", blk.Name)
	}
	loops := bs.loops()
	at := slices.Index(loops, loop)
	if at < 0 {
		return BlockRV{}, fmt.Errorf("loop %q does not enclose block %q", loop.Var.Name, blk.Name)
	}
	spatial, reduce := bindingVars(br)
	for _, f := range loops[:at] {
		if reduce[f.Var] {
			return BlockRV{}, fmt.Errorf("loop %q, above loop %q, carries the reduction of block %q", f.Var.Name, loop.Var.Name, blk.Name)
		}
	}
	// Nor may a variable of an enclosing block (Blockize's outer block
	// holds the outer part of the reduction).
	inNest := map[*ir.Var]bool{}
	for _, f := range loops {
		inNest[f.Var] = true
	}
	for v := range reduce {
		if !inNest[v] {
			return BlockRV{}, fmt.Errorf("the reduction of block %q also runs over %q, outside its loop nest: decompose the enclosing block's reduction instead", blk.Name, v.Name)
		}
	}
	if f := repeated(loops[at:], br.IterValues); f != nil {
		return BlockRV{}, fmt.Errorf("cannot prove that loop %q, between loop %q and block %q, gives each of its iterations a distinct instance of the block: after one init the update could run more than once", f.Var.Name, loop.Var.Name, blk.Name)
	}
	vmap := map[*ir.Var]ir.Expr{}
	avail := map[*ir.Var]bool{}
	for _, f := range loops[:at] {
		avail[f.Var] = true
	}
	var copies []*ir.For
	for _, f := range loops[at:] {
		if reduce[f.Var] {
			if spatial[f.Var] {
				return BlockRV{}, fmt.Errorf("loop %q binds both spatial and reduction iteration variables of block %q", f.Var.Name, blk.Name)
			}
			continue
		}
		if !spatial[f.Var] {
			continue // an extent-1 loop (repeated said so)
		}
		c := *f
		c.Var = ir.NewVar(f.Var.Name+"_init", f.Var.Type)
		c.Min, c.Extent = ir.SubstituteExpr(f.Min, vmap), ir.SubstituteExpr(f.Extent, vmap)
		if usesVar(c.Min, reduce) || usesVar(c.Extent, reduce) {
			return BlockRV{}, fmt.Errorf("the bounds of loop %q depend on a reduction loop", f.Var.Name)
		}
		vmap[f.Var] = c.Var
		avail[c.Var] = true
		copies = append(copies, &c)
	}
	// The init block: the spatial iteration variables, renamed.
	ivs, vals, ivmap := spatialCopies(br, vmap)
	initName := s.uniqueName(blk.Name + "_init")
	updateName := s.uniqueName(blk.Name + "_update")
	writes := make([]ir.BufferRegion, len(blk.Writes))
	for i, w := range blk.Writes {
		reg := make([]ir.Range, len(w.Region))
		for d, rg := range w.Region {
			reg[d] = ir.Range{Min: ir.SubstituteExpr(rg.Min, ivmap), Extent: ir.SubstituteExpr(rg.Extent, ivmap)}
		}
		writes[i] = ir.BufferRegion{Buffer: w.Buffer, Region: reg}
	}
	initBlk := &ir.Block{Name: initName, IterVars: ivs, Writes: writes, Body: substitute(blk.Init, ivmap)}
	// The init keeps the conjuncts of the predicate over the loops above
	// l, the copied loops and variables of enclosing blocks; those over
	// the reduction loops go.
	below := map[*ir.Var]bool{}
	for _, f := range loops[at:] {
		below[f.Var] = true
	}
	pred := keptPredicate(br.Predicate, func(v *ir.Var) bool {
		_, copied := vmap[v]
		return below[v] && !copied
	}, vmap)
	var nest ir.Stmt = &ir.BlockRealize{IterValues: vals, Predicate: pred, Block: initBlk}
	for i := len(copies) - 1; i >= 0; i-- {
		copies[i].Body = nest
		nest = copies[i]
	}
	upd := *blk
	upd.Name = updateName
	upd.Init = nil
	upd.Reads = slices.Clone(blk.Reads)
	for i := len(blk.Writes) - 1; i >= 0; i-- {
		if !reads(blk, blk.Writes[i].Buffer) {
			upd.Reads = append([]ir.BufferRegion{blk.Writes[i]}, upd.Reads...)
		}
	}
	newLoop := replace(loop, map[ir.Stmt]ir.Stmt{br: &ir.BlockRealize{IterValues: br.IterValues, Predicate: br.Predicate, Block: &upd}})
	body := replace(s.fn.Body, map[ir.Stmt]ir.Stmt{loop: ir.Seq(nest, newLoop)})
	if err := s.commit("decompose_reduction", body); err != nil {
		return BlockRV{}, err
	}
	s.renameBlock(blk.Name, updateName)
	return s.blockRV(initName), nil
}

// conjuncts splits a predicate at its top-level ands.
func conjuncts(e ir.Expr) []ir.Expr {
	if e == nil {
		return nil
	}
	if b, ok := e.(*ir.Binary); ok && b.Op == ir.OpAnd {
		return append(conjuncts(b.A), conjuncts(b.B)...)
	}
	if c, ok := ir.IsConstInt(e); ok && c != 0 {
		return nil
	}
	return []ir.Expr{e}
}

// repeated returns a loop of loops (other than those of extent 1) whose
// iterations this package cannot prove to reach distinct values of the
// bindings, or nil. A loop passes when some binding uses it only in an
// affine term and that binding's terms over these loops form a mixed
// radix (x_0 + 4*x_1 + 32*x_2 with extents 4 and 8 …): then the loop's
// value can be read back from the binding.
func repeated(loops []*ir.For, bindings []ir.Expr) *ir.For {
	ext := map[*ir.Var]int64{}
	vars := map[*ir.Var]bool{}
	for _, f := range loops {
		e, ok := ir.IsConstInt(f.Extent)
		if ok && e == 1 {
			continue
		}
		if !ok {
			e = -1
		}
		ext[f.Var] = e
		vars[f.Var] = true
	}
	// A pair x // c, x % c of bindings gives x back: x counts as a binding.
	all := slices.Clone(bindings)
	for _, b := range bindings {
		d, ok := b.(*ir.Binary)
		if !ok || d.Op != ir.OpFloorDiv {
			continue
		}
		if slices.ContainsFunc(bindings, func(e ir.Expr) bool {
			m, ok := e.(*ir.Binary)
			return ok && m.Op == ir.OpFloorMod && ir.Equal(m.A, d.A) && ir.Equal(m.B, d.B)
		}) {
			all = append(all, d.A)
		}
	}
	covered := map[*ir.Var]bool{}
	for _, b := range all {
		var ts []term
		ok := true
		for _, t := range toAffine(b).terms {
			if v, isVar := t.atom.(*ir.Var); isVar && vars[v] {
				ts = append(ts, t)
			} else if usesVar(t.atom, vars) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		slices.SortFunc(ts, func(a, b term) int { return cmp.Compare(abs(a.coef), abs(b.coef)) })
		for i := 0; i+1 < len(ts) && ok; i++ {
			e := ext[ts[i].atom.(*ir.Var)]
			ok = e > 0 && abs(ts[i+1].coef) >= abs(ts[i].coef)*e
		}
		if ok {
			for _, t := range ts {
				covered[t.atom.(*ir.Var)] = true
			}
		}
	}
	for _, f := range loops {
		if vars[f.Var] && !covered[f.Var] {
			return f
		}
	}
	return nil
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// bindingVars returns the variables that the bindings of br's spatial
// and of its other iteration variables use.
func bindingVars(br *ir.BlockRealize) (spatial, reduce map[*ir.Var]bool) {
	spatial, reduce = map[*ir.Var]bool{}, map[*ir.Var]bool{}
	for i, iv := range br.Block.IterVars {
		set := spatial
		if iv.Kind != ir.IterSpatial {
			set = reduce
		}
		ir.Visit(br.IterValues[i], func(n ir.Node) bool {
			if v, ok := n.(*ir.Var); ok {
				set[v] = true
			}
			return true
		})
	}
	return spatial, reduce
}

// spatialCopies returns fresh copies of the spatial iteration variables
// of br's block, their bindings with vmap substituted, and the map from
// the old variables to the copies.
func spatialCopies(br *ir.BlockRealize, vmap map[*ir.Var]ir.Expr) ([]ir.IterVar, []ir.Expr, map[*ir.Var]ir.Expr) {
	ivmap := map[*ir.Var]ir.Expr{}
	var ivs []ir.IterVar
	var vals []ir.Expr
	for i, iv := range br.Block.IterVars {
		if iv.Kind != ir.IterSpatial {
			continue
		}
		nv := ir.NewVar(iv.Var.Name, iv.Var.Type)
		ivmap[iv.Var] = nv
		ivs = append(ivs, ir.IterVar{Var: nv, Dom: iv.Dom, Kind: iv.Kind})
		vals = append(vals, ir.SubstituteExpr(br.IterValues[i], vmap))
	}
	return ivs, vals, ivmap
}

// keptPredicate conjoins the conjuncts of pred that use no variable drop
// reports, with vmap substituted.
func keptPredicate(pred ir.Expr, drop func(*ir.Var) bool, vmap map[*ir.Var]ir.Expr) ir.Expr {
	var out ir.Expr = ir.BoolImm(true)
	for _, c := range conjuncts(pred) {
		keep := true
		ir.Visit(c, func(n ir.Node) bool {
			if v, ok := n.(*ir.Var); ok && drop(v) {
				keep = false
			}
			return keep
		})
		if keep {
			out = conjoin(out, ir.SubstituteExpr(c, vmap))
		}
	}
	return out
}
