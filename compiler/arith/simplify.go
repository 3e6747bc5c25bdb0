package arith

import (
	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
)

// maxRounds bounds how often Simplify re-runs its rules to reach a fixed
// point.
const maxRounds = 4

// Simplify returns an expression equal to e for every value of the
// variables within their known ranges, in canonical form: constants
// folded, sums ordered and combined, divisions, modulos, min/max,
// comparisons and selects decided where the bounds allow. e is not
// modified; Simplify returns e itself when nothing changes.
func (a *Analyzer) Simplify(e ir.Expr) ir.Expr {
	if e == nil {
		return nil
	}
	cur := e
	for range maxRounds {
		next := a.simp(cur)
		if next == cur || exprEqual(next, cur) {
			return cur
		}
		cur = next
	}
	return cur
}

// simp simplifies children, then applies the rules of the node's kind.
func (a *Analyzer) simp(e ir.Expr) ir.Expr {
	switch e := e.(type) {
	case *ir.IntImm:
		if w := wrapT(e.Type, e.Value); w != e.Value && (e.Type.IsInt() || ir.IsBool(e.Type)) {
			return &ir.IntImm{Type: e.Type, Value: w} // a constant beyond its dtype, as C would read it
		}
		return e
	case *ir.Var:
		if info, ok := a.vars[e]; ok && info.bound.isPoint() && linearType(e.Type) {
			return &ir.IntImm{Type: e.Type, Value: info.bound.lo}
		}
		return e
	case *ir.Binary:
		x, y := a.simp(e.A), a.simp(e.B)
		r := a.binary(e.Op, x, y)
		if r == nil {
			if x == e.A && y == e.B {
				return e
			}
			return ir.NewBinary(e.Op, x, y)
		}
		return r
	case *ir.Not:
		return a.not(a.simp(e.A), e)
	case *ir.Cast:
		v := a.simp(e.Value)
		if v.DType() == e.Type {
			return v
		}
		if c, ok := fold(&ir.Cast{Type: e.Type, Value: v}); ok {
			return c
		}
		if v == e.Value {
			return e
		}
		return &ir.Cast{Type: e.Type, Value: v}
	case *ir.Select:
		c, t, f := a.simp(e.Cond), a.simp(e.True), a.simp(e.False)
		if v, ok := ir.IsConstInt(c); ok {
			if v != 0 {
				return t
			}
			return f
		}
		if exprEqual(t, f) {
			return t
		}
		if c == e.Cond && t == e.True && f == e.False {
			return e
		}
		return &ir.Select{Cond: c, True: t, False: f}
	case *ir.Let:
		v := a.simp(e.Value)
		switch v.(type) {
		case *ir.IntImm, *ir.FloatImm, *ir.Var:
			return a.simp(ir.SubstituteExpr(e.Body, map[*ir.Var]ir.Expr{e.Var: v}))
		}
		restore := a.scope(e.Var)
		a.BindValue(e.Var, v)
		body := a.simp(e.Body)
		restore()
		if v == e.Value && body == e.Body {
			return e
		}
		return &ir.Let{Var: e.Var, Value: v, Body: body}
	case *ir.Ramp:
		b, s := a.simp(e.Base), a.simp(e.Stride)
		if v, ok := ir.IsConstInt(s); ok && v == 0 {
			return &ir.Broadcast{Value: b, Lanes: e.Lanes}
		}
		if b == e.Base && s == e.Stride {
			return e
		}
		return &ir.Ramp{Base: b, Stride: s, Lanes: e.Lanes}
	case *ir.Broadcast:
		v := a.simp(e.Value)
		if e.Lanes == 1 {
			return v
		}
		if v == e.Value {
			return e
		}
		return &ir.Broadcast{Value: v, Lanes: e.Lanes}
	case *ir.BufferLoad:
		ix, changed := a.simpList(e.Indices)
		if !changed {
			return e
		}
		return &ir.BufferLoad{Buffer: e.Buffer, Indices: ix}
	case *ir.Call:
		return a.call(e)
	}
	return e
}

func (a *Analyzer) simpList(es []ir.Expr) ([]ir.Expr, bool) {
	out := make([]ir.Expr, len(es))
	changed := false
	for i, x := range es {
		out[i] = a.simp(x)
		changed = changed || out[i] != x
	}
	return out, changed
}

func (a *Analyzer) call(e *ir.Call) ir.Expr {
	if e.Op == ir.OpIfThenElse && len(e.Args) == 3 {
		c := a.simp(e.Args[0])
		if v, ok := ir.IsConstInt(c); ok {
			if v != 0 {
				return a.simp(e.Args[1])
			}
			return a.simp(e.Args[2])
		}
	}
	args, changed := a.simpList(e.Args)
	n := e
	if changed {
		n = &ir.Call{Type: e.Type, Op: e.Op, Args: args}
	}
	if _, ok := ir.Intrinsics[e.Op]; ok {
		if c, ok := fold(n); ok {
			return c
		}
	}
	return n
}

// isConst reports a scalar constant.
func isConst(e ir.Expr) bool {
	switch e.(type) {
	case *ir.IntImm, *ir.FloatImm:
		return true
	}
	return false
}

// fold evaluates e when its operands are all scalar constants, with the
// interpreter's semantics; it fails for anything else and for evaluation
// errors (a division by zero stays in the IR for run time to report).
func fold(e ir.Expr) (ir.Expr, bool) {
	switch e := e.(type) {
	case *ir.Binary:
		if !isConst(e.A) || !isConst(e.B) {
			return nil, false
		}
	case *ir.Cast:
		if !isConst(e.Value) || e.Type.Lanes > 1 {
			return nil, false
		}
	case *ir.Not:
		if !isConst(e.A) {
			return nil, false
		}
	case *ir.Call:
		for _, x := range e.Args {
			if !isConst(x) {
				return nil, false
			}
		}
		if e.Type.Lanes > 1 {
			return nil, false
		}
	default:
		return nil, false
	}
	v, err := interp.Eval(e, interp.Vars{})
	if err != nil || v.Lanes() != 1 {
		return nil, false
	}
	return constOf(v), true
}

// constOf converts a scalar interpreter value back to a constant.
func constOf(v interp.Value) ir.Expr {
	if v.IsFloat() {
		return &ir.FloatImm{Type: v.Type, Value: v.AsFloat()}
	}
	return &ir.IntImm{Type: v.Type, Value: v.AsInt()}
}

func boolConst(b bool) ir.Expr { return ir.BoolImm(b) }

// not simplifies !x (x already simplified); orig is returned when nothing
// applies.
func (a *Analyzer) not(x ir.Expr, orig *ir.Not) ir.Expr {
	if v, ok := ir.IsConstInt(x); ok {
		return boolConst(v == 0)
	}
	switch n := x.(type) {
	case *ir.Not:
		return n.A
	case *ir.Binary:
		if n.A.DType().IsInt() { // not for floats: NaN compares false both ways
			inv := map[ir.BinaryOp]ir.BinaryOp{ir.OpLT: ir.OpGE, ir.OpGE: ir.OpLT, ir.OpLE: ir.OpGT,
				ir.OpGT: ir.OpLE, ir.OpEQ: ir.OpNE, ir.OpNE: ir.OpEQ}
			if op, ok := inv[n.Op]; ok {
				return ir.NewBinary(op, n.A, n.B)
			}
		}
	}
	if x == orig.A {
		return orig
	}
	return &ir.Not{A: x}
}

// binary applies the rules for op on simplified operands; nil means no
// rule applied.
func (a *Analyzer) binary(op ir.BinaryOp, x, y ir.Expr) ir.Expr {
	tx, ty := x.DType(), y.DType()
	if tx != ty {
		return nil // ill-typed: left for Verify
	}
	if c, ok := fold(&ir.Binary{Op: op, A: x, B: y}); ok {
		return c
	}
	switch {
	case op.IsLogical():
		return logical(op, x, y)
	case tx.Lanes > 1:
		return a.vector(op, x, y)
	case linearType(tx):
		return a.intBinary(op, x, y)
	case tx.IsFloat():
		return floatBinary(op, x, y)
	}
	return nil
}

func logical(op ir.BinaryOp, x, y ir.Expr) ir.Expr {
	cx, xok := ir.IsConstInt(x)
	cy, yok := ir.IsConstInt(y)
	if yok && !xok {
		x, y, cx, cy, xok, yok = y, x, cy, cx, yok, xok
	}
	if xok {
		switch {
		case op == ir.OpAnd && cx == 0, op == ir.OpOr && cx != 0:
			return boolConst(cx != 0)
		default:
			return y
		}
	}
	if exprEqual(x, y) {
		return x
	}
	return nil
}

func floatBinary(op ir.BinaryOp, x, y ir.Expr) ir.Expr {
	cy, yok := y.(*ir.FloatImm)
	cx, xok := x.(*ir.FloatImm)
	switch op {
	case ir.OpAdd:
		if yok && cy.Value == 0 {
			return x
		}
		if xok && cx.Value == 0 {
			return y
		}
	case ir.OpSub:
		if yok && cy.Value == 0 {
			return x
		}
	case ir.OpMul:
		if yok && cy.Value == 1 {
			return x
		}
		if xok && cx.Value == 1 {
			return y
		}
	case ir.OpDiv:
		if yok && cy.Value == 1 {
			return x
		}
	}
	return nil
}
