package arith

import (
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

// bound returns bounds of e's wrapped value (everything for expressions
// the analysis does not cover).
func (a *Analyzer) bound(e ir.Expr) interval {
	b, _ := a.boundOK(e)
	return b
}

// boundOK returns bounds of e's value; ok reports that the bounds came
// from the computation rather than from widening to the dtype's range
// after a possible wrap-around (ok also holds for values that are simply
// unknown, such as a variable without a range).
func (a *Analyzer) boundOK(e ir.Expr) (interval, bool) {
	t := e.DType()
	if t.Lanes > 1 {
		return a.vectorBound(e), false
	}
	if !boundedType(t) {
		if t.Code == ndarray.UInt { // uint64: at least non-negative as a bit pattern is unknown
			return everything, false
		}
		return everything, true
	}
	switch e := e.(type) {
	case *ir.IntImm:
		return point(wrapT(t, e.Value)), true
	case *ir.Var:
		if info, ok := a.vars[e]; ok {
			return info.bound.intersect(typeRange(t)), true
		}
		return typeRange(t), true
	case *ir.Binary:
		return a.binaryBound(e)
	case *ir.Not:
		return interval{0, 1}, true
	case *ir.Cast:
		vt := e.Value.DType()
		if ir.IsBool(t) {
			return interval{0, 1}, true
		}
		if boundedType(vt) && !vt.IsFloat() {
			b := a.bound(e.Value)
			if ir.IsBool(vt) {
				b = interval{0, 1}
			}
			return fit(t, b, false)
		}
		return typeRange(t), true
	case *ir.Select:
		return a.bound(e.True).union(a.bound(e.False)), true
	case *ir.Let:
		restore := a.scope(e.Var)
		a.BindValue(e.Var, e.Value)
		b, ok := a.boundOK(e.Body)
		restore()
		return b, ok
	case *ir.Call:
		switch e.Op {
		case ir.OpIfThenElse:
			if len(e.Args) == 3 {
				return a.bound(e.Args[1]).union(a.bound(e.Args[2])), true
			}
		case "abs", "fabs":
			if len(e.Args) == 1 {
				b := a.bound(e.Args[0])
				switch {
				case b.lo >= 0:
					return b, true
				case b.hi <= 0:
					return fit(t, b.neg(), false)
				}
				n := b.neg()
				return fit(t, interval{0, max(n.hi, b.hi)}, false)
			}
		}
	}
	return typeRange(t), true
}

func (a *Analyzer) binaryBound(e *ir.Binary) (interval, bool) {
	t := e.DType()
	if e.Op.IsCompare() || e.Op.IsLogical() {
		return interval{0, 1}, true
	}
	if !boundedType(e.A.DType()) {
		return typeRange(t), true
	}
	switch e.Op {
	case ir.OpAdd, ir.OpSub:
		return a.sumBound(linear(e))
	case ir.OpMul:
		if _, ok := e.A.(*ir.IntImm); ok {
			return a.sumBound(linear(e))
		}
		if _, ok := e.B.(*ir.IntImm); ok {
			return a.sumBound(linear(e))
		}
		if exprEqual(e.A, e.B) { // a square is non-negative
			x := a.bound(e.A)
			r, over := x.mul(x)
			return fit(t, interval{max(r.lo, 0), r.hi}, over)
		}
		r, over := a.bound(e.A).mul(a.bound(e.B))
		return fit(t, r, over)
	case ir.OpMin:
		x, y := a.bound(e.A), a.bound(e.B)
		return interval{min(x.lo, y.lo), min(x.hi, y.hi)}, true
	case ir.OpMax:
		x, y := a.bound(e.A), a.bound(e.B)
		return interval{max(x.lo, y.lo), max(x.hi, y.hi)}, true
	case ir.OpFloorDiv, ir.OpDiv:
		x, y := a.bound(e.A), a.bound(e.B)
		r := x.div(y, e.Op == ir.OpFloorDiv)
		return fit(t, r, false)
	case ir.OpFloorMod:
		x, y := a.bound(e.A), a.bound(e.B)
		switch {
		case y.isPoint() && y.lo > 0:
			c := y.lo
			if x.lo != NegInf && x.hi != PosInf {
				k := divExt(x.lo, c, true)
				if divExt(x.hi, c, true) == k {
					return interval{x.lo - k*c, x.hi - k*c}, true
				}
			}
			return interval{0, c - 1}, true
		case y.lo > 0 && !isInf(y.hi):
			r := interval{0, y.hi - 1}
			if x.lo >= 0 {
				r.hi = min(r.hi, x.hi)
			}
			return r, true
		case y.hi < 0 && !isInf(y.lo):
			return interval{y.lo + 1, 0}, true
		}
		return typeRange(t), true
	case ir.OpMod:
		x, y := a.bound(e.A), a.bound(e.B)
		if isInf(y.lo) || isInf(y.hi) {
			return typeRange(t), true
		}
		m := max(absU(y.lo), absU(y.hi))
		if m == 0 || m > 1<<62 {
			return typeRange(t), true
		}
		lim := int64(m) - 1
		r := interval{-lim, lim}
		if x.lo >= 0 {
			r.lo = 0
			r.hi = min(r.hi, x.hi)
		}
		if x.hi <= 0 {
			r.hi = 0
			r.lo = max(r.lo, x.lo)
		}
		return r.intersect(typeRange(t)), true
	}
	return typeRange(t), true
}

// sumBound bounds a sum's mathematical value from its atoms' bounds; ok
// reports that the bound lies within the dtype's range, so the sum's
// wrapped value equals its mathematical value.
func (a *Analyzer) sumBound(s *sum) (interval, bool) {
	if !boundedType(s.t) {
		return everything, false
	}
	r, over := a.rawBound(s)
	return fit(s.t, r, over)
}

// rawBound bounds a sum's mathematical value; over reports an int64
// overflow in the bound itself (or a void math sum).
func (a *Analyzer) rawBound(s *sum) (interval, bool) {
	r := point(s.c)
	over := s.bad
	for _, tm := range s.terms {
		if tm.coeff == 0 {
			continue
		}
		b, o1 := a.bound(tm.atom).scale(tm.coeff)
		var o2 bool
		r, o2 = r.add(b)
		over = over || o1 || o2
	}
	return r, over
}

// vectorBound bounds every lane of a vector integer expression.
func (a *Analyzer) vectorBound(e ir.Expr) interval {
	switch e := e.(type) {
	case *ir.Broadcast:
		return a.bound(e.Value)
	case *ir.Ramp:
		base, stride := a.bound(e.Base), a.bound(e.Stride)
		span, o1 := stride.scale(int64(e.Lanes - 1))
		last, o2 := base.add(span)
		if o1 || o2 {
			return typeRange(e.Base.DType())
		}
		r, _ := fit(e.Base.DType(), base.union(last), false)
		return r
	}
	if t := e.DType().Scalar(); boundedType(t) {
		return typeRange(t)
	}
	return everything
}
