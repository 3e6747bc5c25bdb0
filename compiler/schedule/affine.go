package schedule

import (
	"github.com/kiln-ml/kiln/compiler/ir"
)

// This file is the integer arithmetic the primitives need: affine forms of
// index expressions, a simplifier that keeps printed bindings readable
// (i_0 * 32 + i_1 * 8 + i_2), constant bounds to prove or drop guards,
// and symbolic relaxation of index ranges over loops for compute_at.

// term is coef*atom, where atom is a variable or an expression the affine
// form treats as opaque (a floordiv, a load…).
type term struct {
	atom ir.Expr
	coef int64
}

// affine is the integer expression sum(terms) + c of dtype t.
type affine struct {
	t     ir.DType
	terms []term
	c     int64
}

func constAffine(t ir.DType, c int64) affine { return affine{t: t, c: c} }

// toAffine returns e in affine form; any integer expression has one (its
// non-affine parts become atoms).
func toAffine(e ir.Expr) affine {
	t := e.DType()
	switch n := e.(type) {
	case *ir.IntImm:
		return constAffine(t, n.Value)
	case *ir.Binary:
		switch n.Op {
		case ir.OpAdd:
			return toAffine(n.A).add(toAffine(n.B), 1)
		case ir.OpSub:
			return toAffine(n.A).add(toAffine(n.B), -1)
		case ir.OpMul:
			if c, ok := ir.IsConstInt(n.B); ok {
				return toAffine(n.A).scale(c)
			}
			if c, ok := ir.IsConstInt(n.A); ok {
				return toAffine(n.B).scale(c)
			}
		}
	}
	return affine{t: t, terms: []term{{atom: e, coef: 1}}}
}

func sameAtom(a, b ir.Expr) bool {
	if va, ok := a.(*ir.Var); ok {
		return va == b
	}
	return ir.Equal(a, b)
}

// add returns a + k*b.
func (a affine) add(b affine, k int64) affine {
	out := affine{t: a.t, terms: append([]term(nil), a.terms...), c: a.c + k*b.c}
	for _, bt := range b.terms {
		merged := false
		for i := range out.terms {
			if sameAtom(out.terms[i].atom, bt.atom) {
				out.terms[i].coef += k * bt.coef
				merged = true
				break
			}
		}
		if !merged {
			out.terms = append(out.terms, term{atom: bt.atom, coef: k * bt.coef})
		}
	}
	return out.compact()
}

func (a affine) scale(k int64) affine {
	out := affine{t: a.t, c: a.c * k}
	if k == 0 {
		return out
	}
	for _, t := range a.terms {
		out.terms = append(out.terms, term{atom: t.atom, coef: t.coef * k})
	}
	return out
}

func (a affine) compact() affine {
	terms := a.terms[:0:0]
	for _, t := range a.terms {
		if t.coef != 0 {
			terms = append(terms, t)
		}
	}
	a.terms = terms
	return a
}

// isConst reports a form without terms and returns its constant.
func (a affine) isConst() (int64, bool) { return a.c, len(a.terms) == 0 }

// expr rebuilds the form: positive terms in order, then negative ones,
// then the constant.
func (a affine) expr() ir.Expr {
	var out ir.Expr
	mul := func(t term, k int64) ir.Expr {
		if k == 1 {
			return t.atom
		}
		return ir.NewBinary(ir.OpMul, t.atom, ir.NewIntImm(a.t, k))
	}
	for _, t := range a.terms {
		if t.coef > 0 {
			x := mul(t, t.coef)
			if out == nil {
				out = x
			} else {
				out = ir.NewBinary(ir.OpAdd, out, x)
			}
		}
	}
	for _, t := range a.terms {
		if t.coef < 0 {
			if out == nil {
				out = ir.NewIntImm(a.t, a.c)
				a.c = 0
			}
			out = ir.NewBinary(ir.OpSub, out, mul(t, -t.coef))
		}
	}
	switch {
	case out == nil:
		return ir.NewIntImm(a.t, a.c)
	case a.c > 0:
		return ir.NewBinary(ir.OpAdd, out, ir.NewIntImm(a.t, a.c))
	case a.c < 0:
		return ir.NewBinary(ir.OpSub, out, ir.NewIntImm(a.t, -a.c))
	}
	return out
}

// bounds maps variables to constant inclusive ranges.
type bounds map[*ir.Var][2]int64

// constBound returns constant lower and upper bounds of integer e, when
// the variables it uses have bounds in b.
func (b bounds) constBound(e ir.Expr) (int64, int64, bool) {
	switch n := e.(type) {
	case *ir.IntImm:
		return n.Value, n.Value, true
	case *ir.Var:
		r, ok := b[n]
		return r[0], r[1], ok
	case *ir.Binary:
		if !ir.IsIndexType(n.DType()) {
			return 0, 0, false
		}
		alo, ahi, ok1 := b.constBound(n.A)
		blo, bhi, ok2 := b.constBound(n.B)
		if !ok1 || !ok2 {
			return 0, 0, false
		}
		switch n.Op {
		case ir.OpAdd:
			return alo + blo, ahi + bhi, true
		case ir.OpSub:
			return alo - bhi, ahi - blo, true
		case ir.OpMul:
			ps := []int64{alo * blo, alo * bhi, ahi * blo, ahi * bhi}
			return min(ps[0], ps[1], ps[2], ps[3]), max(ps[0], ps[1], ps[2], ps[3]), true
		case ir.OpFloorDiv:
			if blo == bhi && blo > 0 {
				return floorDiv(alo, blo), floorDiv(ahi, blo), true
			}
		case ir.OpFloorMod:
			if blo == bhi && blo > 0 {
				if floorDiv(alo, blo) == floorDiv(ahi, blo) {
					return floorMod(alo, blo), floorMod(ahi, blo), true
				}
				return 0, blo - 1, true
			}
		case ir.OpMin:
			return min(alo, blo), min(ahi, bhi), true
		case ir.OpMax:
			return max(alo, blo), max(ahi, bhi), true
		}
	}
	return 0, 0, false
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }

// simplify rewrites integer index arithmetic in e into canonical affine
// form and folds floordiv, floormod and comparisons that the bounds in b
// decide. It never changes the value of e.
func (b bounds) simplify(e ir.Expr) ir.Expr {
	r := &ir.Rewriter{Expr: b.simplifyNode}
	return r.RewriteExpr(e)
}

func (b bounds) simplifyNode(e ir.Expr) ir.Expr {
	n, ok := e.(*ir.Binary)
	if !ok {
		if x, ok := e.(*ir.Not); ok {
			if c, ok := ir.IsConstInt(x.A); ok {
				return ir.BoolImm(c == 0)
			}
		}
		return e
	}
	t := n.DType()
	switch {
	case n.Op == ir.OpAnd || n.Op == ir.OpOr:
		ca, oka := ir.IsConstInt(n.A)
		cb, okb := ir.IsConstInt(n.B)
		isAnd := n.Op == ir.OpAnd
		switch {
		case oka && okb:
			if isAnd {
				return ir.BoolImm(ca != 0 && cb != 0)
			}
			return ir.BoolImm(ca != 0 || cb != 0)
		case oka:
			if (ca != 0) == isAnd {
				return n.B
			}
			return ir.BoolImm(!isAnd)
		case okb:
			if (cb != 0) == isAnd {
				return n.A
			}
			return ir.BoolImm(!isAnd)
		}
		return e
	case n.Op.IsCompare() && ir.IsIndexType(n.A.DType()):
		d := toAffine(n.A).add(toAffine(n.B), -1)
		lo, hi, ok := b.affineBound(d)
		if !ok {
			return e
		}
		switch n.Op {
		case ir.OpLT:
			return decide(hi < 0, lo >= 0, e)
		case ir.OpLE:
			return decide(hi <= 0, lo > 0, e)
		case ir.OpGT:
			return decide(lo > 0, hi <= 0, e)
		case ir.OpGE:
			return decide(lo >= 0, hi < 0, e)
		case ir.OpEQ:
			return decide(lo == 0 && hi == 0, lo > 0 || hi < 0, e)
		case ir.OpNE:
			return decide(lo > 0 || hi < 0, lo == 0 && hi == 0, e)
		}
		return e
	case !ir.IsIndexType(t):
		return e
	}
	switch n.Op {
	case ir.OpAdd, ir.OpSub, ir.OpMul:
		return toAffine(e).expr()
	case ir.OpFloorDiv, ir.OpFloorMod:
		c, ok := ir.IsConstInt(n.B)
		if !ok || c <= 0 {
			return e
		}
		return b.divMod(toAffine(n.A), c, n.Op == ir.OpFloorDiv, e)
	case ir.OpMin, ir.OpMax:
		alo, ahi, ok1 := b.constBound(n.A)
		blo, bhi, ok2 := b.constBound(n.B)
		if ok1 && ok2 {
			aFirst := ahi <= blo // a <= b everywhere
			bFirst := bhi <= alo
			if n.Op == ir.OpMin && aFirst || n.Op == ir.OpMax && bFirst {
				return n.A
			}
			if n.Op == ir.OpMin && bFirst || n.Op == ir.OpMax && aFirst {
				return n.B
			}
		}
	}
	return e
}

func decide(yes, no bool, e ir.Expr) ir.Expr {
	switch {
	case yes:
		return ir.BoolImm(true)
	case no:
		return ir.BoolImm(false)
	}
	return e
}

// affineBound returns constant bounds of a form whose atoms have bounds.
func (b bounds) affineBound(a affine) (int64, int64, bool) {
	lo, hi := a.c, a.c
	for _, t := range a.terms {
		l, h, ok := b.constBound(t.atom)
		if !ok {
			return 0, 0, false
		}
		if t.coef > 0 {
			lo, hi = lo+t.coef*l, hi+t.coef*h
		} else {
			lo, hi = lo+t.coef*h, hi+t.coef*l
		}
	}
	return lo, hi, true
}

// divMod simplifies floordiv (div) or floormod of a by c > 0: the terms
// whose coefficients c divides leave the division exactly; the rest is
// dropped or kept whole when its bounds say where it lies.
func (b bounds) divMod(a affine, c int64, div bool, orig ir.Expr) ir.Expr {
	if c == 1 {
		if div {
			return a.expr()
		}
		return ir.NewIntImm(a.t, 0)
	}
	q := affine{t: a.t, c: floorDiv(a.c, c)}
	rest := affine{t: a.t, c: floorMod(a.c, c)}
	for _, t := range a.terms {
		if t.coef%c == 0 {
			q.terms = append(q.terms, term{atom: t.atom, coef: t.coef / c})
		} else {
			rest.terms = append(rest.terms, t)
		}
	}
	lo, hi, known := b.affineBound(rest)
	inRange := known && lo >= 0 && hi < c
	if div {
		if inRange {
			return q.expr()
		}
		if len(q.terms) == 0 && q.c == 0 {
			return ir.NewBinary(ir.OpFloorDiv, rest.expr(), ir.NewIntImm(a.t, c))
		}
		if len(rest.terms) == 0 {
			return q.expr()
		}
		return q.add(toAffine(ir.NewBinary(ir.OpFloorDiv, rest.expr(), ir.NewIntImm(a.t, c))), 1).expr()
	}
	if inRange {
		return rest.expr()
	}
	if len(rest.terms) == 0 {
		return ir.NewIntImm(a.t, rest.c)
	}
	if len(q.terms) == 0 && q.c == 0 {
		return orig
	}
	return ir.NewBinary(ir.OpFloorMod, rest.expr(), ir.NewIntImm(a.t, c))
}

// span is an inclusive symbolic range [lo, hi] of an integer expression.
type span struct {
	lo, hi affine
}

// relax returns the range of a when the variables in dom take every value
// of their spans; atoms not mentioning them stay symbolic. It fails on
// atoms it cannot bound (a load, a division by a variable).
func relax(a affine, dom map[*ir.Var]span) (span, bool) {
	out := span{lo: constAffine(a.t, a.c), hi: constAffine(a.t, a.c)}
	vars := map[*ir.Var]bool{}
	for v := range dom {
		vars[v] = true
	}
	for _, t := range a.terms {
		var sp span
		if v, ok := t.atom.(*ir.Var); ok && vars[v] {
			sp = dom[v]
		} else if !usesVar(t.atom, vars) {
			one := affine{t: a.t, terms: []term{{atom: t.atom, coef: 1}}}
			sp = span{lo: one, hi: one}
		} else {
			var ok bool
			if sp, ok = relaxAtom(t.atom, dom); !ok {
				return span{}, false
			}
		}
		if t.coef > 0 {
			out.lo = out.lo.add(sp.lo, t.coef)
			out.hi = out.hi.add(sp.hi, t.coef)
		} else {
			out.lo = out.lo.add(sp.hi, t.coef)
			out.hi = out.hi.add(sp.lo, t.coef)
		}
	}
	return out, true
}

// relaxAtom bounds floordiv and floormod by positive constants.
func relaxAtom(e ir.Expr, dom map[*ir.Var]span) (span, bool) {
	n, ok := e.(*ir.Binary)
	if !ok || (n.Op != ir.OpFloorDiv && n.Op != ir.OpFloorMod) {
		return span{}, false
	}
	c, ok := ir.IsConstInt(n.B)
	if !ok || c <= 0 {
		return span{}, false
	}
	x, ok := relax(toAffine(n.A), dom)
	if !ok {
		return span{}, false
	}
	none := bounds{}
	qlo := toAffine(none.divMod(x.lo, c, true, nil))
	qhi := toAffine(none.divMod(x.hi, c, true, nil))
	if n.Op == ir.OpFloorDiv {
		return span{lo: qlo, hi: qhi}, true
	}
	if d, ok := qhi.add(qlo, -1).isConst(); ok && d == 0 {
		mlo := toAffine(none.divMod(x.lo, c, false, ir.NewBinary(ir.OpFloorMod, x.lo.expr(), n.B)))
		mhi := toAffine(none.divMod(x.hi, c, false, ir.NewBinary(ir.OpFloorMod, x.hi.expr(), n.B)))
		if ext, ok := mhi.add(mlo, -1).isConst(); ok && ext >= 0 {
			return span{lo: mlo, hi: mhi}, true
		}
	}
	t := x.lo.t
	return span{lo: constAffine(t, 0), hi: constAffine(t, c-1)}, true
}

// loopBounds returns the constant ranges of the loops enclosing a site
// (those with constant bounds).
func loopBounds(loops []*ir.For) bounds {
	b := bounds{}
	for _, f := range loops {
		addLoopBound(b, f)
	}
	return b
}

func addLoopBound(b bounds, f *ir.For) {
	mn, ok1 := ir.IsConstInt(f.Min)
	ext, ok2 := ir.IsConstInt(f.Extent)
	if ok1 && ok2 && ext > 0 {
		b[f.Var] = [2]int64{mn, mn + ext - 1}
	}
}

// simplifyBindings simplifies the iteration values and predicates of the
// block realizes in s, with the bounds of the loops around them (outer
// holds the loops enclosing s).
func simplifyBindings(s ir.Stmt, outer []*ir.For) ir.Stmt {
	b := loopBounds(outer)
	var walk func(s ir.Stmt) ir.Stmt
	walk = func(s ir.Stmt) ir.Stmt {
		switch n := s.(type) {
		case *ir.For:
			addLoopBound(b, n)
			body := walk(n.Body)
			delete(b, n.Var)
			if body == n.Body {
				return n
			}
			c := *n
			c.Body = body
			return &c
		case *ir.SeqStmt:
			seq := make([]ir.Stmt, len(n.Seq))
			changed := false
			for i, c := range n.Seq {
				seq[i] = walk(c)
				changed = changed || seq[i] != c
			}
			if !changed {
				return n
			}
			return &ir.SeqStmt{Seq: seq}
		case *ir.BlockRealize:
			vals := make([]ir.Expr, len(n.IterValues))
			for i, v := range n.IterValues {
				vals[i] = b.simplify(v)
			}
			pred := n.Predicate
			if pred != nil {
				pred = b.simplify(pred)
			}
			return &ir.BlockRealize{IterValues: vals, Predicate: pred, Block: n.Block}
		}
		return s
	}
	return walk(s)
}
