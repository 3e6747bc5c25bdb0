package c

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

// Expr returns the C text of an expression, fully parenthesised where
// precedence matters.
func (r *Renderer) Expr(e ir.Expr) string {
	switch e := e.(type) {
	case nil:
		r.fail("nil expression")
		return "0"
	case *ir.IntImm:
		return intLiteral(e)
	case *ir.FloatImm:
		return floatLiteral(e.Type, e.Value)
	case *ir.StringImm:
		return cString(e.Value)
	case *ir.Var:
		return r.VarName(e)
	case *ir.Binary:
		return r.binary(e)
	case *ir.Not:
		return "(!" + r.Expr(e.A) + ")"
	case *ir.Cast:
		return r.cast(e)
	case *ir.Select:
		if e.Cond.DType().Lanes > 1 {
			r.fail("vector select %s is not supported", e)
			return "0"
		}
		return "(" + r.Expr(e.Cond) + " ? " + r.Expr(e.True) + " : " + r.Expr(e.False) + ")"
	case *ir.BufferLoad:
		return r.load(e)
	case *ir.Call:
		return r.call(e)
	case *ir.Ramp:
		t := e.DType()
		it := r.Type(e.Base.DType())
		lanes := make([]string, e.Lanes)
		for i := range lanes {
			lanes[i] = fmt.Sprintf("b_ + %d * s_", i)
		}
		return fmt.Sprintf("({ %s b_ = %s, s_ = %s; (%s){%s}; })", it, r.Expr(e.Base), r.Expr(e.Stride), r.Type(t), strings.Join(lanes, ", "))
	case *ir.Broadcast:
		t := e.DType()
		return fmt.Sprintf("kiln_bcast_%s(%s)", r.Type(t), r.Expr(e.Value))
	case *ir.Let:
		return fmt.Sprintf("({ %s %s = %s; %s; })", r.Type(e.Var.Type), r.VarName(e.Var), r.Expr(e.Value), r.Expr(e.Body))
	}
	r.fail("cannot print expression %T", e)
	return "0"
}

func intLiteral(e *ir.IntImm) string {
	t := e.Type
	if ir.IsBool(t) || (t.Code == ndarray.UInt && t.Bits == 1) {
		if e.Value != 0 {
			return "true"
		}
		return "false"
	}
	v := e.Value
	if t.Code == ndarray.UInt {
		if t.Bits == 64 {
			return strconv.FormatUint(uint64(v), 10) + "ULL"
		}
		return strconv.FormatInt(v, 10) + "U"
	}
	s := strconv.FormatInt(v, 10)
	switch {
	case v == math.MinInt64:
		return "(-9223372036854775807LL - 1)"
	case v < math.MinInt32 || v > math.MaxInt32:
		s += "LL"
	}
	if v < 0 {
		return "(" + s + ")"
	}
	return s
}

func floatLiteral(t ir.DType, v float64) string {
	var s string
	switch {
	case math.IsNaN(v):
		s = "NAN"
	case math.IsInf(v, 1):
		s = "INFINITY"
	case math.IsInf(v, -1):
		s = "(-INFINITY)"
	default:
		bits := 64
		if t.Bits == 32 {
			bits = 32
		}
		s = strconv.FormatFloat(v, 'g', -1, bits)
		if !strings.ContainsAny(s, ".eE") {
			s += ".0"
		}
		if t.Bits == 32 {
			s += "f"
		}
		if v < 0 {
			s = "(" + s + ")"
		}
	}
	switch t.Bits {
	case 8:
		return "((" + Float8Type(t) + ")" + s + ")"
	case 32:
		if strings.Contains(s, "NAN") || strings.Contains(s, "INFINITY") {
			return "((float)" + s + ")"
		}
		return s
	case 16:
		if t.Code == ndarray.BFloat {
			return "((" + bfloat16Type + ")" + s + ")"
		}
		return "((_Float16)" + s + ")"
	}
	return s
}

// cString quotes s as a C string literal.
func cString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\t':
			b.WriteString(`\t`)
		case '?':
			b.WriteString(`\?`) // no trigraphs
		default:
			if c < 0x20 || c >= 0x7f {
				fmt.Fprintf(&b, `\%03o`, c)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

var binarySymbols = map[ir.BinaryOp]string{
	ir.OpAdd: "+", ir.OpSub: "-", ir.OpMul: "*", ir.OpDiv: "/", ir.OpMod: "%",
	ir.OpEQ: "==", ir.OpNE: "!=", ir.OpLT: "<", ir.OpLE: "<=", ir.OpGT: ">", ir.OpGE: ">=",
	ir.OpAnd: "&&", ir.OpOr: "||",
}

// operand prints a binary operand; a broadcast beside a vector is printed
// as its scalar, which GCC's vector extension broadcasts, except a 16-bit
// float's: where the CPU has no half-precision arithmetic (AVX2) GCC
// computes _Float16 expressions in float, and a float beside a vector of
// _Float16 is refused ("involves truncation"), so it is broadcast
// explicitly.
func (r *Renderer) operand(e ir.Expr) string {
	if b, ok := e.(*ir.Broadcast); ok {
		if t := b.Value.DType(); t.IsFloat() && t.Bits == 16 {
			return r.Expr(b)
		}
		return "(" + r.Type(b.Value.DType()) + ")" + r.Expr(b.Value)
	}
	return r.Expr(e)
}

func (r *Renderer) binary(e *ir.Binary) string {
	t := e.A.DType()
	if t.Lanes > 1 {
		return r.vectorBinary(e)
	}
	a, b := r.Expr(e.A), r.Expr(e.B)
	switch e.Op {
	case ir.OpMin:
		return "KILN_MIN(" + a + ", " + b + ")"
	case ir.OpMax:
		return "KILN_MAX(" + a + ", " + b + ")"
	case ir.OpFloorDiv:
		if t.IsFloat() {
			return r.mathCall("floor", t, []string{"(" + a + " / " + b + ")"})
		}
		return "KILN_FLOORDIV(" + a + ", " + b + ")"
	case ir.OpFloorMod:
		if t.IsFloat() {
			return fmt.Sprintf("({ %s a_ = %s, b_ = %s; a_ - %s * b_; })", r.Type(t), a, b, r.mathCall("floor", t, []string{"(a_ / b_)"}))
		}
		return "KILN_FLOORMOD(" + a + ", " + b + ")"
	case ir.OpMod:
		if t.IsFloat() {
			return r.mathCall("fmod", t, []string{a, b})
		}
	}
	sym, ok := binarySymbols[e.Op]
	if !ok {
		r.fail("cannot print operator %s", e.Op)
		return "0"
	}
	return "(" + a + " " + sym + " " + b + ")"
}

func (r *Renderer) vectorBinary(e *ir.Binary) string {
	t := e.A.DType()
	switch e.Op {
	case ir.OpAdd, ir.OpSub, ir.OpMul, ir.OpDiv:
		if e.Op == ir.OpDiv && !t.IsFloat() {
			break
		}
		return "(" + r.operand(e.A) + " " + binarySymbols[e.Op] + " " + r.operand(e.B) + ")"
	case ir.OpMin, ir.OpMax:
		fn := "kiln_vmin_"
		if e.Op == ir.OpMax {
			fn = "kiln_vmax_"
		}
		return fn + r.Type(t) + "(" + r.Expr(e.A) + ", " + r.Expr(e.B) + ")"
	}
	r.fail("vector operation %s on %s is not supported", e.Op, t)
	return "0"
}

func (r *Renderer) cast(e *ir.Cast) string {
	from := e.Value.DType()
	if e.Type.Lanes > 1 {
		if from == e.Type {
			return r.Expr(e.Value)
		}
		if ir.IsBool(e.Type) || ir.IsBool(from) {
			r.fail("vector cast %s → %s is not supported", from, e.Type)
			return "0"
		}
		return fmt.Sprintf("__builtin_convertvector(%s, %s)", r.Expr(e.Value), r.Type(e.Type))
	}
	if ir.IsBool(e.Type) {
		return "(" + r.Expr(e.Value) + " != 0)"
	}
	return "((" + r.Type(e.Type) + ")" + r.Expr(e.Value) + ")"
}

func (r *Renderer) load(e *ir.BufferLoad) string {
	if len(e.Indices) != 1 {
		r.fail("load from %q has %d indices: run transform.FlattenBuffers first", e.Buffer.Name, len(e.Indices))
		return "0"
	}
	if name, ok := r.promotedSlot(e.Buffer, e.Indices[0]); ok {
		return name
	}
	p := r.pointer(e.Buffer)
	idx := e.Indices[0]
	if idx.DType().Lanes == 1 {
		return p + "[" + r.Expr(idx) + "]"
	}
	t := e.DType()
	ramp, ok := idx.(*ir.Ramp)
	if !ok {
		r.fail("load from %q at vector index %s: only ramps are supported", e.Buffer.Name, idx)
		return "0"
	}
	if isOne(ramp.Stride) {
		if r.inRegister > 0 && r.d.VectorDecl == nil {
			r.vecLoadR[t] = true
			return fmt.Sprintf("kiln_vload_reg_%s(&%s[%s])", r.Type(t), p, r.Expr(ramp.Base))
		}
		return fmt.Sprintf("kiln_vload_%s(&%s[%s])", r.Type(t), p, r.Expr(ramp.Base))
	}
	if s, ok := ir.IsConstInt(ramp.Stride); ok && s == 2 && r.d.VectorDecl == nil {
		r.vecLoad2[t] = true
		return fmt.Sprintf("kiln_vload2_%s(&%s[%s])", r.Type(t), p, r.Expr(ramp.Base))
	}
	lanes := make([]string, ramp.Lanes)
	for i := range lanes {
		lanes[i] = fmt.Sprintf("%s[b_ + %d * s_]", p, i)
	}
	it := r.Type(ramp.Base.DType())
	return fmt.Sprintf("({ %s b_ = %s, s_ = %s; (%s){%s}; })", it, r.Expr(ramp.Base), r.Expr(ramp.Stride), r.Type(t), strings.Join(lanes, ", "))
}

func (r *Renderer) call(e *ir.Call) string {
	args := make([]string, len(e.Args))
	switch e.Op {
	case ir.OpCallExtern:
		if len(e.Args) == 0 {
			r.fail("call_extern without a function name")
			return "0"
		}
		name, ok := e.Args[0].(*ir.StringImm)
		if !ok {
			r.fail("call_extern's first argument %s is not a string", e.Args[0])
			return "0"
		}
		if err := r.checkExtern(name.Value); err != nil {
			r.fail("%v", err)
			return "0"
		}
		rest := make([]string, 0, len(e.Args)-1)
		for _, a := range e.Args[1:] {
			rest = append(rest, r.Expr(a))
		}
		return name.Value + "(" + strings.Join(rest, ", ") + ")"
	case ir.OpIfThenElse:
		if len(e.Args) != 3 || e.Type.Lanes > 1 {
			r.fail("bad if_then_else %s", e)
			return "0"
		}
		return "(" + r.Expr(e.Args[0]) + " ? " + r.Expr(e.Args[1]) + " : " + r.Expr(e.Args[2]) + ")"
	case ir.OpWarpShuffleDown, ir.OpPtxMma:
		// A GPU's own instructions: only a dialect that prints them
		// (Dialect.Call) has them.
		if r.d.Call != nil {
			if s, ok, err := r.d.Call(r, e); err != nil {
				r.fail("%s: %v", e, err)
				return "0"
			} else if ok {
				return s
			}
		}
		r.fail("%s: %s is a GPU instruction the %s dialect does not print", e, e.Op, r.d.Name)
		return "0"
	}
	if _, ok := ir.Intrinsics[e.Op]; !ok {
		r.fail("unknown intrinsic %q", e.Op)
		return "0"
	}
	for i, a := range e.Args {
		args[i] = r.Expr(a)
	}
	if e.Type.Lanes > 1 {
		if s, ok := r.vectorMath(e.Op, e.Type, args); ok {
			return s
		}
		r.fail("intrinsic %s on vector %s is not supported", e.Op, e.Type)
		return "0"
	}
	if r.d.Intrinsic != nil {
		if s, ok := r.d.Intrinsic(e.Op, e.Type, args); ok {
			return s
		}
	}
	t := e.Type
	switch e.Op {
	case "abs", "fabs":
		if !t.IsFloat() {
			return "KILN_ABS(" + args[0] + ")"
		}
		return r.mathCall("fabs", t, args)
	case "rsqrt":
		return "(" + floatLiteral(t, 1) + " / " + r.mathCall("sqrt", t, args) + ")"
	case "sigmoid":
		return "(" + floatLiteral(t, 1) + " / (" + floatLiteral(t, 1) + " + " + r.mathCall("exp", t, []string{"-(" + args[0] + ")"}) + "))"
	case "round":
		return r.mathCall("nearbyint", t, args)
	}
	return r.mathCall(e.Op, t, args)
}

// mathCall calls libm function fn for float type t (expf for float32,
// exp for float64; float16 computes in float).
func (r *Renderer) mathCall(fn string, t ir.DType, args []string) string {
	switch t.Bits {
	case 32:
		return fn + "f(" + strings.Join(args, ", ") + ")"
	case 16:
		conv := make([]string, len(args))
		for i, a := range args {
			conv[i] = "(float)" + a
		}
		return "((" + r.Type(t) + ")" + fn + "f(" + strings.Join(conv, ", ") + "))"
	}
	return fn + "(" + strings.Join(args, ", ") + ")"
}

// load2Decl defines kiln_vload2_T, the load of every other element from
// p (a ramp of stride 2): two loads of consecutive elements, from p and
// from p+lanes-1 (so that nothing past the last element read is touched),
// and one shuffle of their lanes; with AVX-512 a vpermt2ps instead of a
// load per lane.
func load2Decl(t ir.DType, name, elem string) string {
	n := int(t.Lanes)
	idx := make([]string, n)
	for i := range idx {
		// Element 2i is lane 2i of the first load or lane 2i-(n-1) of
		// the second, n+2i-(n-1) = 2i+1 of the pair.
		if 2*i < n {
			idx[i] = strconv.Itoa(2 * i)
		} else {
			idx[i] = strconv.Itoa(2*i + 1)
		}
	}
	lanes := make([]string, n)
	for i := range lanes {
		lanes[i] = fmt.Sprintf("p[%d]", 2*i)
	}
	return fmt.Sprintf(`#ifndef __has_builtin
#define __has_builtin(x) 0
#endif
static inline %s kiln_vload2_%s(const %s* p) {
#if __has_builtin(__builtin_shufflevector)
  return __builtin_shufflevector(kiln_vload_%s(p), kiln_vload_%s(p + %d), %s);
#else
  return (%s){%s};
#endif
}
`, name, name, elem, name, name, n-1, strings.Join(idx, ", "), name, strings.Join(lanes, ", "))
}
