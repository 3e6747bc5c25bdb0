package arith

import (
	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
)

// intBinary applies the rules for scalar integer operands.
func (a *Analyzer) intBinary(op ir.BinaryOp, x, y ir.Expr) ir.Expr {
	t := x.DType()
	switch op {
	case ir.OpAdd, ir.OpSub:
		s := linear(ir.NewBinary(op, x, y))
		combineDivMod(s)
		return s.expr()
	case ir.OpMul:
		if isConst(x) || isConst(y) {
			s := linear(ir.NewBinary(op, x, y))
			return s.expr()
		}
		if atomKey(y) < atomKey(x) {
			return ir.NewBinary(ir.OpMul, y, x)
		}
		return nil
	case ir.OpDiv, ir.OpMod, ir.OpFloorDiv, ir.OpFloorMod:
		if c, ok := y.(*ir.IntImm); ok {
			return a.divConst(op, x, c.Value)
		}
		if exprEqual(x, y) && a.proveNonZero(y) {
			if op == ir.OpDiv || op == ir.OpFloorDiv {
				return &ir.IntImm{Type: t, Value: 1}
			}
			return &ir.IntImm{Type: t, Value: 0}
		}
		return nil
	case ir.OpMin, ir.OpMax:
		return a.minmax(op, x, y)
	}
	if op.IsCompare() {
		return a.compare(op, x, y)
	}
	return nil
}

func (a *Analyzer) proveNonZero(e ir.Expr) bool {
	b := a.bound(e)
	return b.lo > 0 || b.hi < 0
}

// combineDivMod rewrites k·c·(x // c) + k·(x % c) to k·x, in floor and in
// truncating form; the identity holds for every x, wrapped or not.
func combineDivMod(s *sum) {
	for changed, rounds := true, 0; changed && rounds < 8; rounds++ {
		changed = false
	outer:
		for i, ti := range s.terms {
			d, ok := ti.atom.(*ir.Binary)
			if !ok || (d.Op != ir.OpFloorDiv && d.Op != ir.OpDiv) || ti.coeff == 0 {
				continue
			}
			c, ok := d.B.(*ir.IntImm)
			if !ok || c.Value == 0 {
				continue
			}
			modOp := ir.OpFloorMod
			if d.Op == ir.OpDiv {
				modOp = ir.OpMod
			}
			for j, tj := range s.terms {
				m, ok := tj.atom.(*ir.Binary)
				if !ok || m.Op != modOp || tj.coeff == 0 || !exprEqual(m.B, d.B) || !exprEqual(m.A, d.A) {
					continue
				}
				if wrapT(s.t, tj.coeff*c.Value) != ti.coeff {
					continue
				}
				k := tj.coeff
				s.terms[i].coeff, s.terms[j].coeff = 0, 0
				s.addExpr(d.A, k)
				changed = true
				break outer
			}
		}
	}
}

// divConst simplifies x op c for a constant c.
func (a *Analyzer) divConst(op ir.BinaryOp, x ir.Expr, c int64) ir.Expr {
	t := x.DType()
	isDiv := op == ir.OpDiv || op == ir.OpFloorDiv
	mk := func(v int64) ir.Expr { return &ir.IntImm{Type: t, Value: wrapT(t, v)} }
	switch {
	case c == 1:
		if isDiv {
			return x
		}
		return mk(0)
	case c <= 0 || !boundedType(t):
		return nil
	}
	trunc := op == ir.OpDiv || op == ir.OpMod
	// Nested divisions and modulos by constants.
	if in, ok := x.(*ir.Binary); ok {
		if ic, ok := in.B.(*ir.IntImm); ok && ic.Value > 0 {
			switch {
			case isDiv && in.Op == op:
				if p, over := mulExt(ic.Value, c); !over && p <= typeRange(t).hi {
					return a.mk(op, in.A, mk(p))
				}
			case !isDiv && in.Op == op && !trunc && ic.Value%c == 0:
				return a.mk(op, in.A, mk(c))
			}
		}
	}
	if trunc && a.bound(x).lo < 0 {
		return nil
	}
	l := linear(x)
	if _, ok := a.sumBound(l); !ok {
		return nil
	}
	q := &sum{t: t}
	r := &sum{t: t}
	for _, tm := range l.terms {
		if tm.coeff%c == 0 {
			q.addAtom(tm.atom, tm.coeff/c)
		} else {
			r.addAtom(tm.atom, tm.coeff)
		}
	}
	q.c, r.c = interp.FloorDiv(l.c, c), interp.FloorMod(l.c, c)
	rb, rok := a.sumBound(r)
	if _, qok := a.sumBound(q); !rok || !qok || (trunc && rb.lo < 0) {
		return nil
	}
	// The remainder's quotient, when the bounds pin it down.
	k, pinned := int64(0), false
	if !isInf(rb.lo) && !isInf(rb.hi) {
		k = interp.FloorDiv(rb.lo, c)
		pinned = interp.FloorDiv(rb.hi, c) == k
	}
	if isDiv {
		if pinned {
			q.c = wrapT(t, q.c+k)
			return q.expr()
		}
		if q.isConst() && q.c == 0 {
			return nil
		}
		q.addAtom(ir.NewBinary(op, r.expr(), mk(c)), 1)
		return q.expr()
	}
	if pinned {
		r.c = wrapT(t, r.c-k*c)
		return r.expr()
	}
	if q.isConst() && q.c == 0 {
		return nil
	}
	return ir.NewBinary(op, r.expr(), mk(c))
}

// mk builds op(x, y) with the rules applied.
func (a *Analyzer) mk(op ir.BinaryOp, x, y ir.Expr) ir.Expr {
	if r := a.binary(op, x, y); r != nil {
		return r
	}
	return ir.NewBinary(op, x, y)
}

// proveDiffLE reports whether value(x) - value(y) <= k always holds, for
// scalar integer x and y of one dtype.
func (a *Analyzer) proveDiffLE(x, y ir.Expr, k int64) bool {
	if !boundedType(x.DType()) {
		return false
	}
	lx, ly := linear(x), linear(y)
	if _, ok := a.sumBound(lx); !ok {
		return false
	}
	if _, ok := a.sumBound(ly); !ok {
		return false
	}
	d := mathDiff(lx, ly)
	for round := 0; round < 3 && !d.bad; round++ {
		b, over := a.rawBound(d)
		if !over && b.hi <= k {
			return true
		}
		if round == 2 || !a.substituteRanges(d) {
			return false
		}
	}
	return false
}

// substituteRanges replaces, in a math sum to be bounded from above, each
// variable with a symbolic range by its extreme: the range's last value
// for a positive coefficient, its minimum for a negative one. It reports
// whether it replaced anything.
func (a *Analyzer) substituteRanges(d *sum) bool {
	var keep, add []term
	for _, tm := range d.terms {
		repl := a.rangeEnd(tm)
		if repl == nil {
			keep = append(keep, tm)
			continue
		}
		for _, e := range repl.terms {
			add = append(add, term{atom: e.atom, key: e.key, coeff: d.times(e.coeff, tm.coeff)})
		}
		d.c = d.plus(d.c, d.times(repl.c, tm.coeff))
	}
	if len(keep) == len(d.terms) {
		return false
	}
	d.terms = keep
	for _, t := range add {
		d.addAtom(t.atom, t.coeff)
	}
	return true
}

// rangeEnd returns, for a term over a variable with a symbolic range, the
// end of the range that maximizes the term (min+extent-1 for a positive
// coefficient, min for a negative one); nil when there is none.
func (a *Analyzer) rangeEnd(tm term) *sum {
	v, ok := tm.atom.(*ir.Var)
	if !ok || tm.coeff == 0 {
		return nil
	}
	info, ok := a.vars[v]
	if !ok || info.rng.Min == nil || (isConst(info.rng.Min) && isConst(info.rng.Extent)) {
		return nil
	}
	lm := linear(info.rng.Min)
	if _, ok := a.sumBound(lm); !ok {
		return nil
	}
	out := &sum{t: lm.t, math: true}
	out.addSum(lm, 1)
	if tm.coeff > 0 {
		le := linear(info.rng.Extent)
		if _, ok := a.sumBound(le); !ok {
			return nil
		}
		out.addSum(le, 1)
		out.c = out.plus(out.c, -1)
	}
	if out.bad {
		return nil
	}
	return out
}

func (a *Analyzer) minmax(op ir.BinaryOp, x, y ir.Expr) ir.Expr {
	if exprEqual(x, y) {
		return x
	}
	le := a.proveDiffLE(x, y, 0)
	ge := !le && a.proveDiffLE(y, x, 0)
	switch {
	case le && op == ir.OpMin, ge && op == ir.OpMax:
		return x
	case le, ge:
		return y
	}
	// min(min(z, c1), c2) = min(z, min(c1, c2)).
	if in, ok := x.(*ir.Binary); ok && in.Op == op && isConst(in.B) && isConst(y) {
		if c, ok := fold(ir.NewBinary(op, in.B, y)); ok {
			return ir.NewBinary(op, in.A, c)
		}
	}
	if isConst(x) && !isConst(y) { // constants go right
		return ir.NewBinary(op, y, x)
	}
	return nil
}

func (a *Analyzer) compare(op ir.BinaryOp, x, y ir.Expr) ir.Expr {
	switch op {
	case ir.OpEQ, ir.OpNE:
		d := linear(x)
		d.addSum(linear(y), -1)
		eq := op == ir.OpEQ
		if d.isConst() { // holds modulo 2^n: no bounds needed
			return boolConst((d.c == 0) == eq)
		}
		if a.proveDiffLE(x, y, -1) || a.proveDiffLE(y, x, -1) {
			return boolConst(!eq)
		}
		return nil
	case ir.OpGT:
		return a.compare(ir.OpLT, y, x)
	case ir.OpGE:
		return a.compare(ir.OpLE, y, x)
	}
	strict := op == ir.OpLT
	k := int64(0)
	if strict {
		k = -1
	}
	switch {
	case a.proveDiffLE(x, y, k):
		return boolConst(true)
	case a.proveDiffLE(y, x, -1-k):
		return boolConst(false)
	}
	// s + c1 < c2  →  s < c2 - c1, when neither side wraps.
	if cy, ok := y.(*ir.IntImm); ok {
		lx := linear(x)
		if lx.c != 0 && !lx.isConst() {
			rest := lx.clone()
			rest.c = 0
			_, ok1 := a.sumBound(lx)
			_, ok2 := a.sumBound(rest)
			nc, over := addExt(cy.Value, -lx.c)
			if ok1 && ok2 && !over && point(nc).within(typeRange(x.DType())) {
				return ir.NewBinary(op, rest.expr(), &ir.IntImm{Type: x.DType(), Value: nc})
			}
		}
	}
	return nil
}

// vector applies the rules for vector operands: operations on broadcasts
// and ramps become scalar operations.
func (a *Analyzer) vector(op ir.BinaryOp, x, y ir.Expr) ir.Expr {
	bx, xb := x.(*ir.Broadcast)
	by, yb := y.(*ir.Broadcast)
	if xb && yb && bx.Lanes == by.Lanes {
		return &ir.Broadcast{Value: a.mk(op, bx.Value, by.Value), Lanes: bx.Lanes}
	}
	if !x.DType().IsInt() {
		return nil
	}
	rx, xr := x.(*ir.Ramp)
	ry, yr := y.(*ir.Ramp)
	ramp := func(b, s ir.Expr, n int) ir.Expr { return &ir.Ramp{Base: b, Stride: s, Lanes: n} }
	switch op {
	case ir.OpAdd, ir.OpSub:
		switch {
		case xr && yr && rx.Lanes == ry.Lanes:
			return ramp(a.mk(op, rx.Base, ry.Base), a.mk(op, rx.Stride, ry.Stride), rx.Lanes)
		case xr && yb && rx.Lanes == by.Lanes:
			return ramp(a.mk(op, rx.Base, by.Value), rx.Stride, rx.Lanes)
		case xb && yr && bx.Lanes == ry.Lanes:
			s := ry.Stride
			if op == ir.OpSub {
				s = a.mk(ir.OpSub, &ir.IntImm{Type: s.DType(), Value: 0}, s)
			}
			return ramp(a.mk(op, bx.Value, ry.Base), s, ry.Lanes)
		}
	case ir.OpMul:
		switch {
		case xr && yb && rx.Lanes == by.Lanes:
			return ramp(a.mk(op, rx.Base, by.Value), a.mk(op, rx.Stride, by.Value), rx.Lanes)
		case xb && yr && bx.Lanes == ry.Lanes:
			return ramp(a.mk(op, ry.Base, bx.Value), a.mk(op, ry.Stride, bx.Value), ry.Lanes)
		}
	case ir.OpFloorDiv, ir.OpFloorMod:
		if !xr || !yb || rx.Lanes != by.Lanes {
			return nil
		}
		c, ok := by.Value.(*ir.IntImm)
		s, ok2 := rx.Stride.(*ir.IntImm)
		if !ok || !ok2 || c.Value <= 0 || s.Value < 0 {
			return nil
		}
		t := rx.Base.DType()
		span, over := mulExt(s.Value, int64(rx.Lanes-1))
		bb, bok := a.sumBound(linear(rx.Base))
		last, over2 := addExt(bb.hi, span)
		if over || over2 || !bok || !point(last).within(typeRange(t)) {
			return nil
		}
		// All lanes fall in one block of c when (base mod c) + span < c.
		m := a.bound(a.mk(ir.OpFloorMod, rx.Base, by.Value))
		if end, o := addExt(m.hi, span); o || end >= c.Value {
			return nil
		}
		if op == ir.OpFloorDiv {
			return &ir.Broadcast{Value: a.mk(op, rx.Base, c), Lanes: rx.Lanes}
		}
		return ramp(a.mk(op, rx.Base, c), rx.Stride, rx.Lanes)
	}
	return nil
}
