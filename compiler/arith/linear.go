package arith

import (
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

// sum is a linear combination Σ c·atom + c0 over a scalar integer dtype:
// the canonical form of additive expressions. Its coefficients are kept
// wrapped to the dtype (sign-extended), so building a sum from an
// expression is a ring homomorphism: the expression's wrapped value is the
// sum's mathematical value wrapped.
type sum struct {
	t     ir.DType
	terms []term
	c     int64
	// math marks a sum of mathematical integers (a difference built for a
	// proof): coefficients are not wrapped, and bad records an int64
	// overflow, which voids the sum.
	math, bad bool
}

// term is coeff·atom; key orders atoms canonically.
type term struct {
	atom  ir.Expr
	key   string
	coeff int64
}

// wrapT truncates v to the width of integer type t.
func wrapT(t ir.DType, v int64) int64 {
	switch {
	case ir.IsBool(t):
		if v != 0 {
			return 1
		}
		return 0
	case t.Bits >= 64:
		return v
	case t.Code == ndarray.UInt:
		return int64(uint64(v) & (uint64(1)<<t.Bits - 1))
	}
	shift := 64 - uint(t.Bits)
	return v << shift >> shift
}

// linearType reports the dtypes sums are built for: scalar integers.
func linearType(t ir.DType) bool { return t.IsInt() && t.Lanes <= 1 }

// linear returns the canonical sum of e (a scalar integer expression).
func linear(e ir.Expr) *sum {
	s := &sum{t: e.DType()}
	s.addExpr(e, 1)
	return s
}

func (s *sum) addExpr(e ir.Expr, k int64) {
	if k == 0 {
		return
	}
	switch e := e.(type) {
	case *ir.IntImm:
		s.c = wrapT(s.t, s.c+wrapT(s.t, e.Value*k))
		return
	case *ir.Binary:
		if e.A.DType() == s.t && e.B.DType() == s.t {
			switch e.Op {
			case ir.OpAdd:
				s.addExpr(e.A, k)
				s.addExpr(e.B, k)
				return
			case ir.OpSub:
				s.addExpr(e.A, k)
				s.addExpr(e.B, wrapT(s.t, -k))
				return
			case ir.OpMul:
				if c, ok := e.B.(*ir.IntImm); ok {
					s.addExpr(e.A, wrapT(s.t, k*c.Value))
					return
				}
				if c, ok := e.A.(*ir.IntImm); ok {
					s.addExpr(e.B, wrapT(s.t, k*c.Value))
					return
				}
			}
		}
	}
	s.addAtom(e, k)
}

func (s *sum) addAtom(e ir.Expr, k int64) {
	for i := range s.terms {
		if exprEqual(s.terms[i].atom, e) {
			s.terms[i].coeff = s.plus(s.terms[i].coeff, k)
			return
		}
	}
	s.terms = append(s.terms, term{atom: e, key: atomKey(e), coeff: k})
}

// plus adds two coefficients: wrapped, or checked in a math sum.
func (s *sum) plus(a, b int64) int64 {
	if !s.math {
		return wrapT(s.t, a+b)
	}
	r, over := addExt(a, b)
	if over || isInf(r) {
		s.bad = true
	}
	return r
}

// times multiplies two coefficients: wrapped, or checked in a math sum.
func (s *sum) times(a, b int64) int64 {
	if !s.math {
		return wrapT(s.t, a*b)
	}
	r, over := mulExt(a, b)
	if over || isInf(r) {
		s.bad = true
	}
	return r
}

// addSum adds k·o to s (same dtype), wrapping coefficients.
func (s *sum) addSum(o *sum, k int64) {
	for _, t := range o.terms {
		s.addAtom(t.atom, s.times(t.coeff, k))
	}
	s.c = s.plus(s.c, s.times(o.c, k))
}

func (s *sum) clone() *sum {
	return &sum{t: s.t, terms: slices.Clone(s.terms), c: s.c, math: s.math, bad: s.bad}
}

// mathDiff returns x - y over mathematical integers (the sums' own
// coefficients taken as integers).
func mathDiff(x, y *sum) *sum {
	d := &sum{t: x.t, math: true}
	d.addSum(x, 1)
	d.addSum(y, -1)
	return d
}

// normalize drops zero terms and sorts the rest: larger coefficients
// (in magnitude) first, then by key; stable, so atoms with equal keys keep
// their order of appearance. So i*4 + j, as TVM prints split indices.
func (s *sum) normalize() {
	s.terms = slices.DeleteFunc(s.terms, func(t term) bool { return t.coeff == 0 })
	slices.SortStableFunc(s.terms, func(a, b term) int {
		if ma, mb := absU(a.coeff), absU(b.coeff); ma != mb {
			if ma > mb {
				return -1
			}
			return 1
		}
		return strings.Compare(a.key, b.key)
	})
}

func (s *sum) isConst() bool {
	for _, t := range s.terms {
		if t.coeff != 0 {
			return false
		}
	}
	return true
}

// atomKey orders atoms: variables first (by name), then other expressions
// by their text.
func atomKey(e ir.Expr) string {
	if v, ok := e.(*ir.Var); ok {
		return "0" + v.Name
	}
	return "1" + e.String()
}

// expr rebuilds the canonical expression: positive terms in key order,
// then negative ones subtracted, then the constant.
func (s *sum) expr() ir.Expr {
	s.normalize()
	t := s.t
	var out ir.Expr
	mk := func(atom ir.Expr, k int64) ir.Expr {
		if k == 1 {
			return atom
		}
		return ir.NewBinary(ir.OpMul, atom, &ir.IntImm{Type: t, Value: k})
	}
	isNeg := func(k int64) bool { return k < 0 && wrapT(t, -k) > 0 }
	for _, tm := range s.terms {
		if !isNeg(tm.coeff) {
			out = addTo(out, mk(tm.atom, tm.coeff))
		}
	}
	for _, tm := range s.terms {
		if !isNeg(tm.coeff) {
			continue
		}
		switch {
		case out != nil:
			out = ir.NewBinary(ir.OpSub, out, mk(tm.atom, -tm.coeff))
		case s.c > 0:
			out = ir.NewBinary(ir.OpSub, &ir.IntImm{Type: t, Value: s.c}, mk(tm.atom, -tm.coeff))
			s = &sum{t: t, terms: s.terms} // constant used
		default:
			out = mk(tm.atom, tm.coeff)
		}
	}
	switch {
	case out == nil:
		return &ir.IntImm{Type: t, Value: s.c}
	case s.c == 0:
		return out
	case isNeg(s.c):
		return ir.NewBinary(ir.OpSub, out, &ir.IntImm{Type: t, Value: -s.c})
	}
	return ir.NewBinary(ir.OpAdd, out, &ir.IntImm{Type: t, Value: s.c})
}

func addTo(acc, e ir.Expr) ir.Expr {
	if acc == nil {
		return e
	}
	return ir.NewBinary(ir.OpAdd, acc, e)
}

// exprEqual compares two expressions with variables and buffers by
// identity (ir.Equal), quickly for the common shapes.
func exprEqual(a, b ir.Expr) bool {
	if a == b {
		return true
	}
	switch x := a.(type) {
	case *ir.Var:
		return false
	case *ir.IntImm:
		y, ok := b.(*ir.IntImm)
		return ok && x.Type == y.Type && x.Value == y.Value
	case *ir.Binary:
		y, ok := b.(*ir.Binary)
		return ok && x.Op == y.Op && exprEqual(x.A, y.A) && exprEqual(x.B, y.B)
	}
	if _, ok := b.(*ir.Var); ok {
		return false
	}
	return ir.Equal(a, b)
}
