package arith

import (
	"github.com/kiln-ml/kiln/compiler/ir"
)

// Analyzer holds what is known about variables (their ranges) and answers
// questions about integer expressions under that knowledge. The zero value
// is not usable; call NewAnalyzer. An Analyzer is not safe for concurrent
// use.
type Analyzer struct {
	vars map[*ir.Var]varInfo
}

// varInfo is a variable's known range: rng when it came from a loop or
// domain (possibly symbolic), and its constant bounds.
type varInfo struct {
	rng   ir.Range // Min nil when only constant bounds are known
	bound interval
}

// NewAnalyzer returns an Analyzer that knows nothing about any variable.
func NewAnalyzer() *Analyzer { return &Analyzer{vars: map[*ir.Var]varInfo{}} }

// Bind records that v takes values in r = [r.Min, r.Min+r.Extent), as a
// loop variable does; Min and Extent may be symbolic. Binding v again
// replaces what was known.
func (a *Analyzer) Bind(v *ir.Var, r ir.Range) {
	lo := a.bound(r.Min)
	ext := a.bound(r.Extent)
	hi, _ := addExt(lo.hi, ext.hi)
	hi, _ = addExt(hi, -1)
	b := interval{lo.lo, hi}
	if ext.hi <= 0 && !isInf(ext.hi) {
		b = interval{lo.lo, lo.hi} // empty loop: keep a sane range
	}
	if !boundedType(v.Type) {
		b = everything
	} else {
		b = b.intersect(typeRange(v.Type))
	}
	a.vars[v] = varInfo{rng: r, bound: b}
}

// BindBound records that lo <= v <= hi (NegInf and PosInf for no limit).
func (a *Analyzer) BindBound(v *ir.Var, lo, hi int64) {
	a.vars[v] = varInfo{bound: interval{lo, hi}}
}

// BindValue records that v equals e: v gets e's bounds, and a constant e
// is substituted for v by Simplify.
func (a *Analyzer) BindValue(v *ir.Var, e ir.Expr) {
	a.vars[v] = varInfo{rng: ir.Range{Min: e, Extent: &ir.IntImm{Type: e.DType(), Value: 1}}, bound: a.bound(e)}
}

// Unbind forgets what is known about v.
func (a *Analyzer) Unbind(v *ir.Var) { delete(a.vars, v) }

// scope saves v's binding and returns a function restoring it.
func (a *Analyzer) scope(v *ir.Var) func() {
	old, had := a.vars[v]
	return func() {
		if had {
			a.vars[v] = old
		} else {
			delete(a.vars, v)
		}
	}
}

// ConstIntBound returns constant bounds lo <= e <= hi of a scalar integer
// or bool expression's (wrapped) value; NegInf and PosInf mean no limit.
// Other expressions get (NegInf, PosInf).
func (a *Analyzer) ConstIntBound(e ir.Expr) (lo, hi int64) {
	b := a.bound(e)
	return b.lo, b.hi
}

// CanProve reports whether cond (a Bool expression) holds for every value
// of the variables within their known ranges. False means "not proven".
func (a *Analyzer) CanProve(cond ir.Expr) bool {
	if cond == nil || !ir.IsBool(cond.DType()) || cond.DType().Lanes > 1 {
		return false
	}
	if b, ok := cond.(*ir.Binary); ok && b.Op == ir.OpAnd {
		return a.CanProve(b.A) && a.CanProve(b.B)
	}
	s := a.Simplify(cond)
	v, ok := ir.IsConstInt(s)
	return ok && v != 0
}

// CanProveEqual reports whether x and y always have the same value.
func (a *Analyzer) CanProveEqual(x, y ir.Expr) bool {
	if exprEqual(x, y) {
		return true
	}
	if x.DType() != y.DType() {
		return false
	}
	if linearType(x.DType()) {
		d := linear(a.Simplify(x))
		d.addSum(linear(a.Simplify(y)), -1)
		return d.isConst() && d.c == 0
	}
	return exprEqual(a.Simplify(x), a.Simplify(y))
}

// CanProveDivisible reports whether the scalar integer e is always a
// multiple of c (c > 0).
func (a *Analyzer) CanProveDivisible(e ir.Expr, c int64) bool {
	if c <= 0 || !linearType(e.DType()) {
		return false
	}
	if c == 1 {
		return true
	}
	s := linear(a.Simplify(e))
	for _, t := range s.terms {
		if t.coeff%c != 0 && !a.atomDivisible(t.atom, c) {
			return false
		}
	}
	if s.c%c != 0 {
		return false
	}
	// The mathematical value is a multiple of c; the wrapped one is too
	// when c divides 2^bits or when the value does not wrap.
	if c&(c-1) == 0 && (s.t.Bits >= 64 || c <= int64(1)<<s.t.Bits) {
		return true
	}
	_, ok := a.sumBound(s)
	return ok
}

// atomDivisible reports atoms known to be multiples of c: constants and
// products with a constant factor that c divides.
func (a *Analyzer) atomDivisible(e ir.Expr, c int64) bool {
	if b, ok := e.(*ir.Binary); ok && b.Op == ir.OpMul {
		// The product's wrapped value keeps the factor when it does not
		// wrap (or c divides 2^bits, checked by the caller's final test).
		if _, ok := a.boundOK(e); !ok {
			return false
		}
		return a.CanProveDivisible(b.A, c) || a.CanProveDivisible(b.B, c)
	}
	if v, ok := e.(*ir.Var); ok {
		if info, ok := a.vars[v]; ok && info.bound.isPoint() {
			return info.bound.lo%c == 0
		}
	}
	return false
}
