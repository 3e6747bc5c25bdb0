package transform

import (
	"math"

	"github.com/kiln-ml/kiln/compiler/arith"
	"github.com/kiln-ml/kiln/compiler/ir"
)

// Simplify simplifies every expression with compiler/arith's analyzer
// (canonical sums, constant folding, floordiv/floormod and comparisons
// proved from the enclosing loops' ranges, ramp and broadcast algebra),
// removes loops of extent one (substituting their minimum) and of extent
// zero or less, keeps only the taken branch of an if whose condition is
// constant, and flattens nested sequences.
//
// It walks statements itself rather than calling arith's SimplifyStmt,
// which relies on ir.Rewriter and so loses changes to the first statement
// of a sequence (see seqSafe).
func Simplify(f *ir.PrimFunc) (*ir.PrimFunc, error) {
	return f.WithBody(simplifyStmt(f.Body)), nil
}

func simplifyStmt(s ir.Stmt) ir.Stmt {
	a := arith.NewAnalyzer()
	simp := func(e ir.Expr) ir.Expr {
		if e == nil {
			return nil
		}
		return truncDivisions(a, foldExpr(a.Simplify(e)))
	}
	simpAll := func(es []ir.Expr) []ir.Expr {
		out := make([]ir.Expr, len(es))
		for i, e := range es {
			out[i] = simp(e)
		}
		return out
	}
	r := &ir.Rewriter{}
	r.PreStmt = func(s ir.Stmt) (ir.Stmt, bool) {
		fr, ok := s.(*ir.For)
		if !ok {
			return nil, false
		}
		mn, ext := simp(fr.Min), simp(fr.Extent)
		if n, ok := ir.IsConstInt(ext); ok {
			if n <= 0 {
				return &ir.SeqStmt{}, true
			}
			if n == 1 && fr.Kind != ir.ForThreadBinding {
				return r.RewriteStmt(substitute(fr.Body, map[*ir.Var]ir.Expr{fr.Var: mn})), true
			}
		}
		a.Bind(fr.Var, ir.Range{Min: mn, Extent: ext})
		body := r.RewriteStmt(fr.Body)
		a.Unbind(fr.Var)
		c := *fr
		c.Min, c.Extent, c.Body = mn, ext, body
		return &c, true
	}
	r.Stmt = func(s ir.Stmt) ir.Stmt {
		switch s := s.(type) {
		case *ir.BufferStore:
			return &ir.BufferStore{Buffer: s.Buffer, Value: simp(s.Value), Indices: simpAll(s.Indices)}
		case *ir.IfThenElse:
			cond := simp(s.Cond)
			if c, ok := cond.(*ir.IntImm); ok {
				if c.Value != 0 {
					return s.Then
				}
				if s.Else == nil {
					return &ir.SeqStmt{}
				}
				return s.Else
			}
			return &ir.IfThenElse{Cond: cond, Then: s.Then, Else: s.Else}
		case *ir.LetStmt:
			return &ir.LetStmt{Var: s.Var, Value: simp(s.Value), Body: s.Body}
		case *ir.Evaluate:
			return &ir.Evaluate{Value: simp(s.Value)}
		case *ir.AssertStmt:
			return &ir.AssertStmt{Cond: simp(s.Cond), Message: s.Message}
		case *ir.SeqStmt:
			var out []ir.Stmt
			changed := false
			for _, c := range s.Seq {
				if q, ok := c.(*ir.SeqStmt); ok {
					out = append(out, q.Seq...)
					changed = true
					continue
				}
				out = append(out, c)
			}
			if changed {
				if len(out) == 1 {
					return out[0]
				}
				return &ir.SeqStmt{Seq: out}
			}
		}
		return s
	}
	return seqSafe(r).RewriteStmt(s)
}

// truncDivisions replaces integer floordiv and floormod by C's truncating
// / and % where the dividend is provably non-negative and the divisor
// positive, so the code generators print plain operators the C compiler
// can hoist and strength-reduce (TVM's LowerIntrin does the same).
func truncDivisions(a *arith.Analyzer, e ir.Expr) ir.Expr {
	return (&ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
		b, ok := e.(*ir.Binary)
		if !ok || (b.Op != ir.OpFloorDiv && b.Op != ir.OpFloorMod) {
			return e
		}
		t := b.A.DType()
		if t.Lanes != 1 || !t.IsInt() || b.B.DType() != t {
			return e
		}
		if lo, _ := a.ConstIntBound(b.A); lo < 0 {
			return e
		}
		if lo, _ := a.ConstIntBound(b.B); lo <= 0 {
			return e
		}
		op := ir.OpDiv
		if b.Op == ir.OpFloorMod {
			op = ir.OpMod
		}
		return &ir.Binary{Op: op, A: b.A, B: b.B}
	}}).RewriteExpr(e)
}

// foldExpr simplifies e bottom-up.
func foldExpr(e ir.Expr) ir.Expr {
	if e == nil {
		return nil
	}
	return (&ir.Rewriter{Expr: foldNode}).RewriteExpr(e)
}

// foldNode simplifies one node whose children are already simplified.
func foldNode(e ir.Expr) ir.Expr {
	switch e := e.(type) {
	case *ir.Binary:
		return foldBinary(e.Op, e.A, e.B, e)
	case *ir.Not:
		if c, ok := e.A.(*ir.IntImm); ok {
			return ir.BoolImm(c.Value == 0)
		}
	case *ir.Cast:
		if c := ir.NewCast(e.Type, e.Value); c != ir.Expr(e) {
			if _, ok := c.(*ir.Cast); !ok {
				return c
			}
		}
		if b, ok := e.Value.(*ir.Broadcast); ok {
			return &ir.Broadcast{Value: foldNode(ir.NewCast(e.Type.Scalar(), b.Value)), Lanes: b.Lanes}
		}
	case *ir.Select:
		if c, ok := e.Cond.(*ir.IntImm); ok {
			if c.Value != 0 {
				return e.True
			}
			return e.False
		}
	case *ir.Call:
		if e.Op == ir.OpIfThenElse && len(e.Args) == 3 {
			if c, ok := e.Args[0].(*ir.IntImm); ok {
				if c.Value != 0 {
					return e.Args[1]
				}
				return e.Args[2]
			}
		}
	}
	return e
}

// binary builds op(a, b), broadcasting a scalar operand to the other's
// lanes, and simplifies it.
func binary(op ir.BinaryOp, a, b ir.Expr) ir.Expr {
	return foldBinary(op, a, b, nil)
}

// foldBinary simplifies op(a, b); orig, when not nil, is the node being
// simplified and is returned when nothing applies.
func foldBinary(op ir.BinaryOp, a, b ir.Expr, orig *ir.Binary) ir.Expr {
	la, lb := a.DType().Lanes, b.DType().Lanes
	if la != lb {
		switch {
		case la == 1:
			a = &ir.Broadcast{Value: a, Lanes: int(lb)}
		case lb == 1:
			b = &ir.Broadcast{Value: b, Lanes: int(la)}
		}
		orig = nil
	}
	keep := func() ir.Expr {
		if orig != nil && orig.A == a && orig.B == b {
			return orig
		}
		return &ir.Binary{Op: op, A: a, B: b}
	}
	if a.DType() != b.DType() {
		return keep()
	}
	t := a.DType()
	// Constants.
	if ca, ok := a.(*ir.IntImm); ok {
		if cb, ok := b.(*ir.IntImm); ok {
			if v, ok := foldInt(op, t, ca.Value, cb.Value); ok {
				return v
			}
			return keep()
		}
	}
	if ca, ok := a.(*ir.FloatImm); ok {
		if cb, ok := b.(*ir.FloatImm); ok {
			if v, ok := foldFloat(op, t, ca.Value, cb.Value); ok {
				return v
			}
			return keep()
		}
	}
	// Vectors: broadcasts and ramps.
	if ba, ok := a.(*ir.Broadcast); ok {
		if bb, ok := b.(*ir.Broadcast); ok && ba.Lanes == bb.Lanes {
			return &ir.Broadcast{Value: binary(op, ba.Value, bb.Value), Lanes: ba.Lanes}
		}
	}
	if v := foldRamp(op, a, b); v != nil {
		return v
	}
	if ir.IsBool(t) && t.Lanes == 1 && (op == ir.OpAnd || op == ir.OpOr) {
		for _, p := range [][2]ir.Expr{{a, b}, {b, a}} {
			if c, ok := p[0].(*ir.IntImm); ok {
				if (c.Value != 0) == (op == ir.OpAnd) {
					return p[1] // true && x, false || x
				}
				return c // false && x, true || x
			}
		}
	}
	if t.Lanes != 1 || !(t.IsInt() || t.IsFloat()) {
		return keep()
	}
	isInt := t.IsInt()
	ca, aConst := ir.IsConstInt(a)
	cb, bConst := ir.IsConstInt(b)
	switch op {
	case ir.OpAdd:
		if bConst && cb == 0 {
			return a
		}
		if aConst && ca == 0 {
			return b
		}
		if aConst && isInt {
			return binary(ir.OpAdd, b, a)
		}
		if isInt {
			// (x + c1) + c2 → x + (c1+c2); (x + c) + y → (x + y) + c;
			// x + (y + c) → (x + y) + c.
			if xa, c1, ok := addConst(a); ok {
				if bConst {
					return binary(ir.OpAdd, xa, ir.NewIntImm(t, ca2(c1, cb, t)))
				}
				return binary(ir.OpAdd, binary(ir.OpAdd, xa, b), ir.NewIntImm(t, c1))
			}
			if xb, c2, ok := addConst(b); ok {
				return binary(ir.OpAdd, binary(ir.OpAdd, a, xb), ir.NewIntImm(t, c2))
			}
		}
	case ir.OpSub:
		if bConst && cb == 0 {
			return a
		}
		if isInt && bConst {
			return binary(ir.OpAdd, a, ir.NewIntImm(t, wrapTo(t, -cb)))
		}
		if va, ok := a.(*ir.Var); ok && va == b {
			return ir.NewIntImm(t, 0)
		}
	case ir.OpMul:
		if bConst && cb == 1 {
			return a
		}
		if aConst && ca == 1 {
			return b
		}
		if isInt && ((bConst && cb == 0) || (aConst && ca == 0)) {
			return ir.NewIntImm(t, 0)
		}
		if isInt && aConst {
			return binary(ir.OpMul, b, a)
		}
		if isInt && bConst {
			if m, ok := a.(*ir.Binary); ok {
				if c1, ok := ir.IsConstInt(m.B); ok {
					switch m.Op {
					case ir.OpMul: // (x*c1)*c2
						return binary(ir.OpMul, m.A, ir.NewIntImm(t, wrapTo(t, c1*cb)))
					case ir.OpAdd: // (x+c1)*c2
						return binary(ir.OpAdd, binary(ir.OpMul, m.A, b), ir.NewIntImm(t, wrapTo(t, c1*cb)))
					}
				}
			}
		}
	case ir.OpFloorDiv, ir.OpDiv:
		if isInt && bConst && cb == 1 {
			return a
		}
		if isInt && aConst && ca == 0 && bConst && cb != 0 {
			return ir.NewIntImm(t, 0)
		}
	case ir.OpFloorMod, ir.OpMod:
		if isInt && bConst && cb == 1 {
			return ir.NewIntImm(t, 0)
		}
	case ir.OpMin, ir.OpMax:
		if va, ok := a.(*ir.Var); ok && va == b {
			return a
		}
	}
	return keep()
}

func ca2(a, b int64, t ir.DType) int64 { return wrapTo(t, a+b) }

// addConst matches x + c with c an integer constant.
func addConst(e ir.Expr) (ir.Expr, int64, bool) {
	if m, ok := e.(*ir.Binary); ok && m.Op == ir.OpAdd {
		if c, ok := ir.IsConstInt(m.B); ok {
			return m.A, c, true
		}
	}
	return nil, 0, false
}

// foldRamp combines ramps with broadcasts and ramps under + - *.
func foldRamp(op ir.BinaryOp, a, b ir.Expr) ir.Expr {
	ra, aRamp := a.(*ir.Ramp)
	rb, bRamp := b.(*ir.Ramp)
	ba, aBc := a.(*ir.Broadcast)
	bb, bBc := b.(*ir.Broadcast)
	switch op {
	case ir.OpAdd:
		switch {
		case aRamp && bBc:
			return &ir.Ramp{Base: binary(ir.OpAdd, ra.Base, bb.Value), Stride: ra.Stride, Lanes: ra.Lanes}
		case aBc && bRamp:
			return &ir.Ramp{Base: binary(ir.OpAdd, ba.Value, rb.Base), Stride: rb.Stride, Lanes: rb.Lanes}
		case aRamp && bRamp && ra.Lanes == rb.Lanes:
			return &ir.Ramp{Base: binary(ir.OpAdd, ra.Base, rb.Base), Stride: binary(ir.OpAdd, ra.Stride, rb.Stride), Lanes: ra.Lanes}
		}
	case ir.OpSub:
		switch {
		case aRamp && bBc:
			return &ir.Ramp{Base: binary(ir.OpSub, ra.Base, bb.Value), Stride: ra.Stride, Lanes: ra.Lanes}
		case aBc && bRamp:
			return &ir.Ramp{Base: binary(ir.OpSub, ba.Value, rb.Base), Stride: binary(ir.OpSub, ir.NewIntImm(rb.Stride.DType(), 0), rb.Stride), Lanes: rb.Lanes}
		case aRamp && bRamp && ra.Lanes == rb.Lanes:
			return &ir.Ramp{Base: binary(ir.OpSub, ra.Base, rb.Base), Stride: binary(ir.OpSub, ra.Stride, rb.Stride), Lanes: ra.Lanes}
		}
	case ir.OpMul:
		switch {
		case aRamp && bBc:
			return &ir.Ramp{Base: binary(ir.OpMul, ra.Base, bb.Value), Stride: binary(ir.OpMul, ra.Stride, bb.Value), Lanes: ra.Lanes}
		case aBc && bRamp:
			return &ir.Ramp{Base: binary(ir.OpMul, ba.Value, rb.Base), Stride: binary(ir.OpMul, ba.Value, rb.Stride), Lanes: rb.Lanes}
		}
	}
	return nil
}

// foldInt evaluates op on two integer constants of type t.
func foldInt(op ir.BinaryOp, t ir.DType, a, b int64) (ir.Expr, bool) {
	if ir.IsBool(t) {
		switch op {
		case ir.OpAnd:
			return ir.BoolImm(a != 0 && b != 0), true
		case ir.OpOr:
			return ir.BoolImm(a != 0 || b != 0), true
		case ir.OpEQ:
			return ir.BoolImm(a == b), true
		case ir.OpNE:
			return ir.BoolImm(a != b), true
		}
		return nil, false
	}
	unsigned := t.Code == ir.Uint32.Code
	less := func(x, y int64) bool {
		if unsigned {
			return uint64(x) < uint64(y)
		}
		return x < y
	}
	var v int64
	switch op {
	case ir.OpAdd:
		v = a + b
	case ir.OpSub:
		v = a - b
	case ir.OpMul:
		v = a * b
	case ir.OpDiv, ir.OpMod, ir.OpFloorDiv, ir.OpFloorMod:
		if b == 0 || unsigned || (a == math.MinInt64 && b == -1) {
			return nil, false
		}
		switch op {
		case ir.OpDiv:
			v = a / b
		case ir.OpMod:
			v = a % b
		case ir.OpFloorDiv:
			v = floorDiv(a, b)
		case ir.OpFloorMod:
			v = a - floorDiv(a, b)*b
		}
	case ir.OpMin:
		v = a
		if less(b, a) {
			v = b
		}
	case ir.OpMax:
		v = a
		if less(a, b) {
			v = b
		}
	case ir.OpEQ:
		return ir.BoolImm(a == b), true
	case ir.OpNE:
		return ir.BoolImm(a != b), true
	case ir.OpLT:
		return ir.BoolImm(less(a, b)), true
	case ir.OpLE:
		return ir.BoolImm(!less(b, a)), true
	case ir.OpGT:
		return ir.BoolImm(less(b, a)), true
	case ir.OpGE:
		return ir.BoolImm(!less(a, b)), true
	default:
		return nil, false
	}
	return ir.NewIntImm(t, wrapTo(t, v)), true
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// wrapTo truncates v to integer type t.
func wrapTo(t ir.DType, v int64) int64 {
	if t.Bits >= 64 || t.Bits == 0 {
		return v
	}
	mask := int64(1)<<t.Bits - 1
	v &= mask
	if t.Code == ir.Int32.Code && v>>(t.Bits-1) != 0 {
		v -= int64(1) << t.Bits
	}
	return v
}

// foldFloat evaluates op on two float constants of type t.
func foldFloat(op ir.BinaryOp, t ir.DType, a, b float64) (ir.Expr, bool) {
	round := func(v float64) float64 {
		if t.Bits == 32 {
			return float64(float32(v))
		}
		return v
	}
	if t.Bits != 32 && t.Bits != 64 {
		return nil, false
	}
	switch op {
	case ir.OpAdd:
		return ir.NewFloatImm(t, round(a+b)), true
	case ir.OpSub:
		return ir.NewFloatImm(t, round(a-b)), true
	case ir.OpMul:
		return ir.NewFloatImm(t, round(a*b)), true
	case ir.OpDiv:
		return ir.NewFloatImm(t, round(a/b)), true
	case ir.OpMin:
		if a < b {
			return ir.NewFloatImm(t, a), true
		}
		return ir.NewFloatImm(t, b), true
	case ir.OpMax:
		if a > b {
			return ir.NewFloatImm(t, a), true
		}
		return ir.NewFloatImm(t, b), true
	case ir.OpEQ:
		return ir.BoolImm(a == b), true
	case ir.OpNE:
		return ir.BoolImm(a != b), true
	case ir.OpLT:
		return ir.BoolImm(a < b), true
	case ir.OpLE:
		return ir.BoolImm(a <= b), true
	case ir.OpGT:
		return ir.BoolImm(a > b), true
	case ir.OpGE:
		return ir.BoolImm(a >= b), true
	}
	return nil, false
}
