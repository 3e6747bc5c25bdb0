package schedule

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// ComputeAt moves producer block b to the start of loop l's body, where it
// computes only the region of its output that the blocks under l read in
// one iteration of l (TVM's sch.compute_at). New loops ax0, ax1 … cover
// that region, with a predicate where it may leave the block's domain;
// the block's own predicate (a split that does not divide) is kept where
// it is over loops that bind its iteration variables directly (as
// rfactor's partial results are), else compute_at refuses. A dimension
// of the output that b writes at an expression of its iteration
// variables (a layout's w % 2, w // 2) leaves those variables over their
// whole domain.
// Preconditions: b writes one intermediate buffer (not a parameter) and
// is its only producer; every block that reads it is under l; b comes
// before l and is not already under it.
func (s *Schedule) ComputeAt(b BlockRV, l LoopRV) error {
	if err := s.computeAt("compute_at", b, l, false); err != nil {
		return err
	}
	s.record("sch.compute_at(%s, %s)", s.bn(b), s.ln(l))
	return nil
}

// ReverseComputeAt moves consumer block b to the end of loop l's body,
// where it consumes only the region that the blocks under l produce in
// one iteration of l (TVM's sch.reverse_compute_at). Preconditions: every
// producer of the buffers b reads lies under l, b comes after l, and b
// reads at least one buffer produced under l at its iteration variables
// one to one (C[v0, v1] = C_local[v0, v1]). A reduction block (rfactor's
// write-back) moves when its new loops cover its whole reduction.
func (s *Schedule) ReverseComputeAt(b BlockRV, l LoopRV) error {
	if err := s.computeAt("reverse_compute_at", b, l, true); err != nil {
		return err
	}
	s.record("sch.reverse_compute_at(%s, %s)", s.bn(b), s.ln(l))
	return nil
}

func (s *Schedule) computeAt(prim string, b BlockRV, l LoopRV, reverse bool) error {
	bs, err := s.block(prim, b)
	if err != nil {
		return err
	}
	ls, err := s.loop(prim, l)
	if err != nil {
		return err
	}
	return s.moveUnder(prim, bs, ls, reverse, nil)
}

// moveUnder moves the block at bs under the loop at ls: at the start of
// its body (compute_at), at the end (reverse_compute_at), or right after
// the statement after of the loop's body when after is not nil.
func (s *Schedule) moveUnder(prim string, bs, ls site, reverse bool, after ir.Stmt) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%s: %s", prim, fmt.Sprintf(format, args...))
	}
	br, loop := bs.realize(), ls.loop()
	blk := br.Block
	if ls.under(br) {
		return fail("loop %q is inside block %q", loop.Var.Name, blk.Name)
	}
	if bs.under(loop) {
		return fail("block %q is already under loop %q", blk.Name, loop.Var.Name)
	}
	scopeBR := bs.scope()
	if ls.scope() != scopeBR {
		return fail("block %q and loop %q are in different blocks", blk.Name, loop.Var.Name)
	}
	before := order(s.fn.Body, br) < order(s.fn.Body, loop)
	if !reverse && !before {
		return fail("block %q comes after loop %q; it must produce before its consumers", blk.Name, loop.Var.Name)
	}
	if reverse && before {
		return fail("block %q comes before loop %q; it must consume after its producers", blk.Name, loop.Var.Name)
	}
	others := slices.DeleteFunc(s.scopeBlocks(scopeBR), func(st site) bool { return st.realize() == br })

	// The buffer that fixes the region, the blocks under l that access it
	// and the mapping of its dimensions to b's iteration variables.
	var buf *ir.Buffer
	var dims []int
	var partners []site
	if !reverse {
		if len(blk.Writes) != 1 {
			return fail("block %q writes %d buffers, want 1", blk.Name, len(blk.Writes))
		}
		buf = blk.Writes[0].Buffer
		if isParam(s.fn, buf) {
			return fail("block %q writes %q, a parameter of the function; only blocks writing intermediate buffers can move", blk.Name, buf.Name)
		}
		for _, st := range others {
			o := st.realize().Block
			if writes(o, buf) {
				return fail("%q has another producer, block %q", buf.Name, o.Name)
			}
			if !reads(o, buf) {
				continue
			}
			if !st.under(loop) {
				return fail("loop %q does not cover the region block %q reads: block %q reads %q outside the loop", loop.Var.Name, o.Name, o.Name, buf.Name)
			}
			partners = append(partners, st)
		}
		if len(partners) == 0 {
			return fail("no block under loop %q reads %q, which block %q writes", loop.Var.Name, buf.Name, blk.Name)
		}
		var ok bool
		if dims, ok = partlyOneToOne(blk, blk.Writes[0]); !ok {
			return fail("block %q does not write %s at its iteration variables one to one", blk.Name, regionString(blk.Writes[0]))
		}
	} else {
		for _, st := range others {
			o := st.realize().Block
			for _, r := range blk.Reads {
				if writes(o, r.Buffer) && !st.under(loop) {
					return fail("loop %q does not cover block %q, which writes %q that block %q reads", loop.Var.Name, o.Name, r.Buffer.Name, blk.Name)
				}
			}
		}
		for _, r := range blk.Reads {
			var prods []site
			for _, st := range others {
				if writes(st.realize().Block, r.Buffer) {
					prods = append(prods, st)
				}
			}
			if len(prods) == 0 {
				continue
			}
			if d, ok := oneToOne(blk, r); ok && buf == nil {
				buf, dims, partners = r.Buffer, d, prods
			}
		}
		if buf == nil {
			return fail("block %q reads no buffer produced under loop %q at its iteration variables one to one", blk.Name, loop.Var.Name)
		}
		// A reduction block reads what it writes (TVM's reverse_compute_at
		// takes complete and reduction blocks).
		for _, w := range blk.Writes {
			if reads(blk, w.Buffer) && !updatesInPlace(blk, w.Buffer) {
				return fail("block %q reads and writes %q", blk.Name, w.Buffer.Name)
			}
		}
	}

	// The region of buf the partners access in one iteration of loop.
	region := make([]span, len(buf.Shape))
	known := make([]bool, len(buf.Shape))
	first := make([]bool, len(buf.Shape))
	for d := range first {
		first[d] = true
	}
	for _, st := range partners {
		p := st.realize()
		dom := map[*ir.Var]span{}
		for _, f := range st.loops() {
			if f == loop || !st.under(loop) || slices.Contains(ls.loops(), f) {
				continue
			}
			lo := toAffine(f.Min)
			dom[f.Var] = span{lo: lo, hi: lo.add(toAffine(f.Extent), 1).add(constAffine(lo.t, 1), -1)}
		}
		regions := p.Block.Reads
		if reverse {
			regions = p.Block.Writes
		}
		for _, r := range regions {
			if r.Buffer != buf {
				continue
			}
			sp, ok := accessSpan(p, r, dom)
			for d := range region {
				switch {
				case first[d]:
					region[d], known[d], first[d] = sp[d], ok[d], false
				case known[d] && ok[d]:
					region[d], known[d] = unionSpan(region[d], sp[d])
				default:
					known[d] = false
				}
			}
		}
	}
	for d := range region {
		if !known[d] {
			lo := toAffine(ir.NewIntImm(buf.Shape[d].DType(), 0))
			region[d] = span{lo: lo, hi: toAffine(buf.Shape[d]).add(constAffine(lo.t, 1), -1)}
		}
	}

	// New loops over the region: one per iteration variable of b.
	byVar := make([]int, len(blk.IterVars))
	for i := range byVar {
		byVar[i] = -1
	}
	for d, i := range dims {
		if i >= 0 {
			byVar[i] = d
		}
	}
	bnd := loopBounds(append(ls.loops(), loop))
	var loopVars []*ir.Var
	var extents []ir.Expr
	vals := make([]ir.Expr, len(blk.IterVars))
	var pred ir.Expr = ir.BoolImm(true)
	for i, iv := range blk.IterVars {
		t := iv.Var.Type
		ax := ir.NewVar(fmt.Sprintf("ax%d", len(loopVars)), t)
		d := byVar[i]
		if d < 0 {
			loopVars = append(loopVars, ax)
			extents = append(extents, iv.Dom.Extent)
			vals[i] = bnd.simplify(ir.NewBinary(ir.OpAdd, iv.Dom.Min, ax))
			continue
		}
		region[d] = widenSpan(region[d], t)
		ext := region[d].hi.add(region[d].lo, -1).add(constAffine(region[d].lo.t, 1), 1)
		if c, ok := ext.isConst(); ok && c < 1 {
			return fail("the region of %q to cover along dimension %d is empty", buf.Name, d)
		}
		lo := region[d].lo
		if err := wholeReduction(blk, iv, lo, ext); err != nil {
			return fail("%v", err)
		}
		if lo.t != t {
			return fail("iteration variable %q of block %q has dtype %s, the indices of %q have %s", iv.Var.Name, blk.Name, t, buf.Name, lo.t)
		}
		loopVars = append(loopVars, ax)
		extents = append(extents, ext.expr())
		if c, ok := ext.isConst(); ok {
			bnd[ax] = [2]int64{0, c - 1}
		}
		v := lo.add(toAffine(ax), 1)
		vals[i] = v.expr()
		// Guard the part of the region outside the block's domain.
		lower := bnd.simplify(ir.NewBinary(ir.OpGE, v.expr(), iv.Dom.Min))
		upper := bnd.simplify(ir.NewBinary(ir.OpLT, v.expr(), bnd.simplify(ir.NewBinary(ir.OpAdd, iv.Dom.Min, iv.Dom.Extent))))
		for _, c := range []ir.Expr{lower, upper} {
			if k, ok := ir.IsConstInt(c); !ok || k == 0 {
				pred = conjoin(pred, c)
			}
		}
	}
	// The block's own predicate (a split that does not divide) carries
	// over where it is over loops that bind iteration variables directly.
	if c, ok := ir.IsConstInt(br.Predicate); !ok || c == 0 {
		direct := map[*ir.Var]ir.Expr{}
		for i, v := range br.IterValues {
			if lv, ok := v.(*ir.Var); ok {
				direct[lv] = vals[i]
			}
		}
		kept := map[*ir.Var]bool{loop.Var: true}
		for _, f := range ls.loops() {
			kept[f.Var] = true
		}
		for _, f := range bs.loops() {
			if _, ok := direct[f.Var]; !ok && !kept[f.Var] && usesVar(br.Predicate, map[*ir.Var]bool{f.Var: true}) {
				return fail("block %q has the predicate %s over loop %q, which binds none of its iteration variables directly", blk.Name, br.Predicate, f.Var.Name)
			}
		}
		pred = conjoin(pred, bnd.simplify(ir.SubstituteExpr(br.Predicate, direct)))
	}
	var nest ir.Stmt = &ir.BlockRealize{IterValues: vals, Predicate: pred, Block: blk}
	for i := len(loopVars) - 1; i >= 0; i-- {
		nest = &ir.For{Var: loopVars[i], Min: ir.NewIntImm(loopVars[i].Type, 0), Extent: extents[i], Kind: ir.ForSerial, Body: nest}
	}
	nest = simplifyBindings(nest, append(ls.loops(), loop))
	newLoop := *loop
	switch {
	case after != nil:
		newLoop.Body = insertAfter(loop.Body, after, nest)
	case reverse:
		newLoop.Body = ir.Seq(loop.Body, nest)
	default:
		newLoop.Body = ir.Seq(nest, loop.Body)
	}
	body := replace(s.fn.Body, map[ir.Stmt]ir.Stmt{loop: &newLoop})
	body = replace(body, map[ir.Stmt]ir.Stmt{br: nil})
	return s.commit(prim, body)
}

// insertAfter returns body with s placed right after its statement at
// (body itself or an element of body's sequence).
func insertAfter(body, at, s ir.Stmt) ir.Stmt {
	if q, ok := body.(*ir.SeqStmt); ok {
		for i, c := range q.Seq {
			if c == at {
				seq := append(append(slices.Clone(q.Seq[:i+1]), s), q.Seq[i+1:]...)
				return &ir.SeqStmt{Seq: seq}
			}
		}
	}
	return ir.Seq(body, s)
}
