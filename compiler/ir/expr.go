package ir

import (
	"fmt"

	"github.com/kiln-ml/kiln/ndarray"
)

// Node is any IR object: an Expr, a Stmt, a *Buffer, a Range, an IterVar, a
// BufferRegion, a *PrimFunc, a *GlobalVar or an *IRModule. Nodes defined in
// other packages take part in structural equality by implementing Structural.
type Node any

// Expr is a scalar or vector expression. The set of expressions is closed:
// the types in this file are all of them.
type Expr interface {
	// DType is the type of the value the expression computes.
	DType() DType
	// String prints the expression in TVMScript-like syntax, for messages.
	String() string
	isExpr()
}

// IntImm is an integer (or boolean) constant.
type IntImm struct {
	Type  DType
	Value int64
}

// FloatImm is a floating-point constant.
type FloatImm struct {
	Type  DType
	Value float64
}

// StringImm is a string constant, used as an argument of calls.
type StringImm struct {
	Value string
}

// Var is a variable: a loop variable, a block iteration variable, a scalar
// parameter, a symbolic shape, a let-bound value or a buffer's data pointer.
// A variable's identity is its pointer; Name is only a hint for printing.
type Var struct {
	Name string
	Type DType
}

// BinaryOp is the operator of a Binary expression.
type BinaryOp uint8

// Binary operators. Div and Mod truncate toward zero on integers; FloorDiv
// and FloorMod round toward negative infinity. Comparisons give Bool; And
// and Or take and give Bool.
const (
	OpAdd BinaryOp = iota
	OpSub
	OpMul
	OpDiv
	OpMod
	OpFloorDiv
	OpFloorMod
	OpMin
	OpMax
	OpEQ
	OpNE
	OpLT
	OpLE
	OpGT
	OpGE
	OpAnd
	OpOr
)

var binaryOpNames = [...]string{"Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max", "EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or"}

// String is the operator's name ("Add", "FloorDiv", "LT"…).
func (op BinaryOp) String() string {
	if int(op) < len(binaryOpNames) {
		return binaryOpNames[op]
	}
	return fmt.Sprintf("BinaryOp(%d)", uint8(op))
}

// IsCompare reports the comparison operators (EQ … GE).
func (op BinaryOp) IsCompare() bool { return op >= OpEQ && op <= OpGE }

// IsLogical reports And and Or.
func (op BinaryOp) IsLogical() bool { return op == OpAnd || op == OpOr }

// IsArith reports the arithmetic operators (Add … Max).
func (op BinaryOp) IsArith() bool { return op <= OpMax }

// Binary is an arithmetic, comparison or logical operation on two operands
// of the same dtype.
type Binary struct {
	Op   BinaryOp
	A, B Expr
}

// Not is logical negation of a Bool expression.
type Not struct {
	A Expr
}

// Cast converts Value to Type.
type Cast struct {
	Type  DType
	Value Expr
}

// Select is Cond ? True : False, evaluating both sides.
type Select struct {
	Cond, True, False Expr
}

// BufferLoad reads Buffer at Indices (one per dimension of the buffer; a
// Ramp index makes a vector load).
type BufferLoad struct {
	Buffer  *Buffer
	Indices []Expr
}

// Call applies an intrinsic (see Intrinsics) or, with Op OpCallExtern, an
// external function whose name is Args[0] (a StringImm).
type Call struct {
	Type DType
	Op   string
	Args []Expr
}

// Ramp is the vector Base, Base+Stride, …, Base+(Lanes-1)*Stride.
type Ramp struct {
	Base, Stride Expr
	Lanes        int
}

// Broadcast is the vector holding Value in each of Lanes lanes.
type Broadcast struct {
	Value Expr
	Lanes int
}

// Let binds Var to Value inside Body.
type Let struct {
	Var   *Var
	Value Expr
	Body  Expr
}

func (*IntImm) isExpr()     {}
func (*FloatImm) isExpr()   {}
func (*StringImm) isExpr()  {}
func (*Var) isExpr()        {}
func (*Binary) isExpr()     {}
func (*Not) isExpr()        {}
func (*Cast) isExpr()       {}
func (*Select) isExpr()     {}
func (*BufferLoad) isExpr() {}
func (*Call) isExpr()       {}
func (*Ramp) isExpr()       {}
func (*Broadcast) isExpr()  {}
func (*Let) isExpr()        {}

// DType returns the constant's type.
func (e *IntImm) DType() DType { return e.Type }

// DType returns the constant's type.
func (e *FloatImm) DType() DType { return e.Type }

// DType is Handle.
func (e *StringImm) DType() DType { return Handle }

// DType returns the variable's type.
func (e *Var) DType() DType { return e.Type }

// DType is the operands' type for arithmetic and Bool (with the operands'
// lane count) for comparisons and logic.
func (e *Binary) DType() DType {
	t := e.A.DType()
	if e.Op.IsCompare() || e.Op.IsLogical() {
		return Bool.WithLanes(int(t.Lanes))
	}
	return t
}

// DType is the operand's type (Bool).
func (e *Not) DType() DType { return e.A.DType() }

// DType returns the target type.
func (e *Cast) DType() DType { return e.Type }

// DType is the type of the True branch.
func (e *Select) DType() DType { return e.True.DType() }

// DType is the buffer's dtype with the lane count of the widest index.
func (e *BufferLoad) DType() DType {
	t := e.Buffer.DType
	for _, ix := range e.Indices {
		if l := ix.DType().Lanes; l > 1 {
			t = t.WithLanes(int(l) * int(t.Lanes))
		}
	}
	return t
}

// DType returns the call's result type.
func (e *Call) DType() DType { return e.Type }

// DType is the base's type with Lanes lanes.
func (e *Ramp) DType() DType { return e.Base.DType().WithLanes(e.Lanes) }

// DType is the value's type with Lanes lanes.
func (e *Broadcast) DType() DType { return e.Value.DType().WithLanes(e.Lanes) }

// DType is the body's type.
func (e *Let) DType() DType { return e.Body.DType() }

// NewVar returns a fresh variable. Two calls with the same name give two
// distinct variables.
func NewVar(name string, t DType) *Var { return &Var{Name: name, Type: t} }

// NewIntImm returns an integer constant of type t (a Bool type gives a
// boolean constant; more than one lane gives a Broadcast).
func NewIntImm(t DType, v int64) Expr {
	if t.Lanes > 1 {
		return &Broadcast{Value: &IntImm{Type: t.Scalar(), Value: v}, Lanes: int(t.Lanes)}
	}
	return &IntImm{Type: t, Value: v}
}

// NewFloatImm returns a float constant of type t (more than one lane gives a
// Broadcast).
func NewFloatImm(t DType, v float64) Expr {
	if t.Lanes > 1 {
		return &Broadcast{Value: &FloatImm{Type: t.Scalar(), Value: v}, Lanes: int(t.Lanes)}
	}
	return &FloatImm{Type: t, Value: v}
}

// Const returns the constant v of type t: a FloatImm for float types and an
// IntImm otherwise.
func Const(t DType, v float64) Expr {
	if t.IsFloat() {
		return NewFloatImm(t, v)
	}
	return NewIntImm(t, int64(v))
}

// I32 returns an int32 constant.
func I32(v int64) *IntImm { return &IntImm{Type: Int32, Value: v} }

// I64 returns an int64 constant.
func I64(v int64) *IntImm { return &IntImm{Type: Int64, Value: v} }

// F32 returns a float32 constant.
func F32(v float64) *FloatImm { return &FloatImm{Type: Float32, Value: v} }

// F64 returns a float64 constant.
func F64(v float64) *FloatImm { return &FloatImm{Type: Float64, Value: v} }

// BoolImm returns the boolean constant b.
func BoolImm(b bool) *IntImm {
	if b {
		return &IntImm{Type: Bool, Value: 1}
	}
	return &IntImm{Type: Bool, Value: 0}
}

// Str returns a string constant.
func Str(s string) *StringImm { return &StringImm{Value: s} }

// NewBinary builds a Binary exactly as given, without promotion: the
// parser and tests use it to keep ill-typed input for Verify to report.
func NewBinary(op BinaryOp, a, b Expr) *Binary {
	if a == nil || b == nil {
		panic(fmt.Sprintf("ir: %s with a nil operand", op))
	}
	return &Binary{Op: op, A: a, B: b}
}

// Arith builds op(a, b) after promoting the operands to a common dtype:
// a constant takes the other side's type, a scalar is broadcast to the
// other side's lanes, int meets float as float and a narrower type is cast
// to the wider. Logical operators cast their operands to Bool.
func Arith(op BinaryOp, a, b Expr) Expr {
	if a == nil || b == nil {
		panic(fmt.Sprintf("ir: %s with a nil operand", op))
	}
	if op.IsLogical() {
		return &Binary{Op: op, A: toBool(a), B: toBool(b)}
	}
	a, b = Promote(a, b)
	return &Binary{Op: op, A: a, B: b}
}

// Add returns a + b with promotion (see Arith).
func Add(a, b Expr) Expr { return Arith(OpAdd, a, b) }

// Sub returns a - b with promotion.
func Sub(a, b Expr) Expr { return Arith(OpSub, a, b) }

// Mul returns a * b with promotion.
func Mul(a, b Expr) Expr { return Arith(OpMul, a, b) }

// Div returns a / b (truncating on integers) with promotion.
func Div(a, b Expr) Expr { return Arith(OpDiv, a, b) }

// Mod returns the truncated remainder of a / b with promotion.
func Mod(a, b Expr) Expr { return Arith(OpMod, a, b) }

// FloorDiv returns floor(a / b) with promotion.
func FloorDiv(a, b Expr) Expr { return Arith(OpFloorDiv, a, b) }

// FloorMod returns a - floor(a / b) * b with promotion.
func FloorMod(a, b Expr) Expr { return Arith(OpFloorMod, a, b) }

// Min returns min(a, b) with promotion.
func Min(a, b Expr) Expr { return Arith(OpMin, a, b) }

// Max returns max(a, b) with promotion.
func Max(a, b Expr) Expr { return Arith(OpMax, a, b) }

// EQ returns a == b with promotion.
func EQ(a, b Expr) Expr { return Arith(OpEQ, a, b) }

// NE returns a != b with promotion.
func NE(a, b Expr) Expr { return Arith(OpNE, a, b) }

// LT returns a < b with promotion.
func LT(a, b Expr) Expr { return Arith(OpLT, a, b) }

// LE returns a <= b with promotion.
func LE(a, b Expr) Expr { return Arith(OpLE, a, b) }

// GT returns a > b with promotion.
func GT(a, b Expr) Expr { return Arith(OpGT, a, b) }

// GE returns a >= b with promotion.
func GE(a, b Expr) Expr { return Arith(OpGE, a, b) }

// And returns a && b.
func And(a, b Expr) Expr { return Arith(OpAnd, a, b) }

// Or returns a || b.
func Or(a, b Expr) Expr { return Arith(OpOr, a, b) }

// LogicalNot returns !a.
func LogicalNot(a Expr) Expr {
	if a == nil {
		panic("ir: Not with a nil operand")
	}
	return &Not{A: toBool(a)}
}

// NewCast returns value converted to t; it returns value itself when it
// already has type t, and folds constants.
func NewCast(t DType, value Expr) Expr {
	if value == nil {
		panic("ir: Cast of nil")
	}
	if value.DType() == t {
		return value
	}
	switch v := value.(type) {
	case *IntImm:
		if t.Lanes == 1 {
			if t.IsFloat() {
				return &FloatImm{Type: t, Value: float64(v.Value)}
			}
			if t.IsInt() || IsBool(t) {
				return &IntImm{Type: t, Value: wrapInt(t, v.Value)}
			}
		}
	case *FloatImm:
		if t.Lanes == 1 && t.IsFloat() {
			return &FloatImm{Type: t, Value: v.Value}
		}
	}
	if value.DType().Lanes == 1 && t.Lanes > 1 {
		return &Broadcast{Value: NewCast(t.Scalar(), value), Lanes: int(t.Lanes)}
	}
	return &Cast{Type: t, Value: value}
}

// wrapInt truncates v to the range of integer (or bool) type t.
func wrapInt(t DType, v int64) int64 {
	if IsBool(t) {
		if v != 0 {
			return 1
		}
		return 0
	}
	if t.Bits >= 64 {
		return v
	}
	mask := int64(1)<<t.Bits - 1
	v &= mask
	if t.Code == ndarray.Int && v>>(t.Bits-1) != 0 {
		v -= int64(1) << t.Bits
	}
	return v
}

// NewSelect returns cond ? t : f, promoting t and f to a common type.
func NewSelect(cond, t, f Expr) Expr {
	if cond == nil || t == nil || f == nil {
		panic("ir: Select with a nil operand")
	}
	t, f = Promote(t, f)
	return &Select{Cond: toBool(cond), True: t, False: f}
}

// NewBufferLoad returns b[indices…].
func NewBufferLoad(b *Buffer, indices ...Expr) *BufferLoad {
	if b == nil {
		panic("ir: load from a nil buffer")
	}
	return &BufferLoad{Buffer: b, Indices: indices}
}

// NewRamp returns the vector base, base+stride, … of lanes lanes.
func NewRamp(base, stride Expr, lanes int) *Ramp {
	if base == nil || stride == nil || lanes < 1 {
		panic("ir: bad Ramp")
	}
	_, stride = Promote(base, stride)
	return &Ramp{Base: base, Stride: stride, Lanes: lanes}
}

// NewBroadcast returns value repeated in lanes lanes.
func NewBroadcast(value Expr, lanes int) *Broadcast {
	if value == nil || lanes < 1 {
		panic("ir: bad Broadcast")
	}
	return &Broadcast{Value: value, Lanes: lanes}
}

// NewLet returns body with v bound to value.
func NewLet(v *Var, value, body Expr) *Let {
	if v == nil || value == nil || body == nil {
		panic("ir: Let with a nil part")
	}
	return &Let{Var: v, Value: value, Body: body}
}

// Promote returns a and b converted to a common dtype by the rules of Arith.
func Promote(a, b Expr) (Expr, Expr) {
	ta, tb := a.DType(), b.DType()
	if ta == tb {
		return a, b
	}
	if ta.Lanes != tb.Lanes {
		switch {
		case ta.Lanes == 1:
			a = &Broadcast{Value: a, Lanes: int(tb.Lanes)}
		case tb.Lanes == 1:
			b = &Broadcast{Value: b, Lanes: int(ta.Lanes)}
		default:
			return a, b // left for Verify to report
		}
		ta, tb = a.DType(), b.DType()
		if ta == tb {
			return a, b
		}
	}
	ca, cb := isConst(a), isConst(b)
	switch {
	case cb && !ca:
		return a, NewCast(ta, b)
	case ca && !cb:
		return NewCast(tb, a), b
	}
	t := wider(ta, tb)
	return NewCast(t, a), NewCast(t, b)
}

// isConst reports a constant or a broadcast constant.
func isConst(e Expr) bool {
	switch e := e.(type) {
	case *IntImm, *FloatImm:
		return true
	case *Broadcast:
		return isConst(e.Value)
	}
	return false
}

// wider picks the dtype two operands of types a and b meet at.
func wider(a, b DType) DType {
	switch {
	case a.IsFloat() && !b.IsFloat():
		return a
	case b.IsFloat() && !a.IsFloat():
		return b
	case IsBool(a) && !IsBool(b):
		return b
	case IsBool(b) && !IsBool(a):
		return a
	case b.Bits > a.Bits:
		return b
	}
	return a
}

func toBool(e Expr) Expr {
	t := e.DType()
	if IsBool(t) {
		return e
	}
	return NewCast(Bool.WithLanes(int(t.Lanes)), e)
}

// IsConstInt reports whether e is an integer constant and returns its value.
func IsConstInt(e Expr) (int64, bool) {
	if c, ok := e.(*IntImm); ok {
		return c.Value, true
	}
	return 0, false
}
