package ir

import (
	"fmt"
	"strings"
)

// StructInfo is the static description of a graph-level value (Relax's
// struct info): a tensor's shape and dtype, a tuple's fields, a shape, a
// scalar, a function or an opaque object. Unknown parts are allowed: a
// tensor may have an unknown dtype (Void), an unknown rank (NDim -1) or
// unknown dimensions (Shape nil), and dimensions may be symbolic (int64
// expressions over *Var).
//
// StructInfo values are immutable. String prints them in TVMScript form
// (R.Tensor((1, n), dtype="float32")) for messages.
type StructInfo interface {
	Node
	String() string
	isStructInfo()
}

// ObjectStructInfo describes any value: nothing is known about it.
type ObjectStructInfo struct{}

// PrimStructInfo describes a scalar (R.Prim) of DType, with its Value when
// it is known.
type PrimStructInfo struct {
	DType DType
	Value Expr // nil when unknown
}

// ShapeStructInfo describes a shape value (R.Shape): its Values when
// known, else its rank NDim (-1 when unknown too).
type ShapeStructInfo struct {
	Values []Expr // nil when unknown
	NDim   int
}

// TensorStructInfo describes a tensor (R.Tensor). Shape is nil when the
// dimensions are unknown; NDim is len(Shape) when Shape is known and -1
// when the rank is unknown. DType is Void when unknown.
type TensorStructInfo struct {
	Shape []Expr
	NDim  int
	DType DType
}

// TupleStructInfo describes a tuple (R.Tuple); the empty tuple is the
// value of calls that return nothing.
type TupleStructInfo struct {
	Fields []StructInfo
}

// FuncStructInfo describes a function (R.Callable): its parameters and
// result. Params nil means an opaque function whose parameters are unknown.
type FuncStructInfo struct {
	Params []StructInfo
	Ret    StructInfo
	Pure   bool
}

func (*ObjectStructInfo) isStructInfo() {}
func (*PrimStructInfo) isStructInfo()   {}
func (*ShapeStructInfo) isStructInfo()  {}
func (*TensorStructInfo) isStructInfo() {}
func (*TupleStructInfo) isStructInfo()  {}
func (*FuncStructInfo) isStructInfo()   {}

// Object returns the struct info that says nothing.
func Object() *ObjectStructInfo { return &ObjectStructInfo{} }

// Tensor returns the struct info of a tensor of dtype with the given
// dimensions (int64 constants or expressions).
func Tensor(dtype DType, shape ...Expr) *TensorStructInfo {
	if shape == nil {
		shape = []Expr{}
	}
	return &TensorStructInfo{Shape: shape, NDim: len(shape), DType: dtype}
}

// TensorOfShape returns a tensor struct info with constant dimensions.
func TensorOfShape(dtype DType, dims ...int64) *TensorStructInfo {
	return Tensor(dtype, Dims(dims...)...)
}

// TensorNDim returns the struct info of a tensor of known rank (ndim may
// be -1) and unknown dimensions.
func TensorNDim(dtype DType, ndim int) *TensorStructInfo {
	return &TensorStructInfo{NDim: ndim, DType: dtype}
}

// Tuple returns the struct info of a tuple of fields.
func Tuple(fields ...StructInfo) *TupleStructInfo {
	if fields == nil {
		fields = []StructInfo{}
	}
	return &TupleStructInfo{Fields: fields}
}

// ShapeOf returns the struct info of a known shape value.
func ShapeOf(values ...Expr) *ShapeStructInfo {
	if values == nil {
		values = []Expr{}
	}
	return &ShapeStructInfo{Values: values, NDim: len(values)}
}

// Dims returns int64 constants for dims.
func Dims(dims ...int64) []Expr {
	out := make([]Expr, len(dims))
	for i, d := range dims {
		out[i] = I64(d)
	}
	return out
}

// VoidInfo is the empty tuple's struct info, the result of calls that return
// nothing.
func VoidInfo() *TupleStructInfo { return Tuple() }

// IsVoidInfo reports whether s is the empty tuple.
func IsVoidInfo(s StructInfo) bool {
	t, ok := s.(*TupleStructInfo)
	return ok && len(t.Fields) == 0
}

// KnownShape reports whether t's dimensions are known and returns them as
// integers when they are all constants.
func (t *TensorStructInfo) KnownShape() ([]int64, bool) {
	if t.Shape == nil {
		return nil, false
	}
	out := make([]int64, len(t.Shape))
	for i, d := range t.Shape {
		v, ok := ConstDim(d)
		if !ok {
			return nil, false
		}
		out[i] = v
	}
	return out, true
}

// ConstDim returns the value of a dimension that folds to a constant.
func ConstDim(e Expr) (int64, bool) {
	if e == nil {
		return 0, false
	}
	if c, ok := FoldDim(e).(*IntImm); ok {
		return c.Value, true
	}
	return 0, false
}

// FoldDim folds the constant parts of a dimension expression: integer
// arithmetic on constants becomes one int64 constant, and x*1, x+0, x//1
// simplify to x.
func FoldDim(e Expr) Expr {
	switch e := e.(type) {
	case *IntImm:
		if e.Type != Int64 && e.Type.IsInt() {
			return I64(e.Value)
		}
		return e
	case *Binary:
		a, b := FoldDim(e.A), FoldDim(e.B)
		ca, aok := a.(*IntImm)
		cb, bok := b.(*IntImm)
		if aok && bok && ca.Type.IsInt() && cb.Type.IsInt() {
			x, y := ca.Value, cb.Value
			switch e.Op {
			case OpAdd:
				return I64(x + y)
			case OpSub:
				return I64(x - y)
			case OpMul:
				return I64(x * y)
			case OpFloorDiv:
				if y != 0 {
					return I64(floorDiv(x, y))
				}
			case OpFloorMod:
				if y != 0 {
					return I64(x - floorDiv(x, y)*y)
				}
			case OpDiv:
				if y != 0 {
					return I64(x / y)
				}
			case OpMod:
				if y != 0 {
					return I64(x % y)
				}
			case OpMin:
				return I64(min(x, y))
			case OpMax:
				return I64(max(x, y))
			}
		}
		switch {
		case bok && cb.Value == 0 && (e.Op == OpAdd || e.Op == OpSub):
			return a
		case bok && cb.Value == 1 && (e.Op == OpMul || e.Op == OpFloorDiv):
			return a
		case aok && ca.Value == 0 && e.Op == OpAdd:
			return b
		case aok && ca.Value == 1 && e.Op == OpMul:
			return b
		}
		if a == e.A && b == e.B {
			return e
		}
		return &Binary{Op: e.Op, A: a, B: b}
	}
	return e
}

func floorDiv(x, y int64) int64 {
	q := x / y
	if (x%y != 0) && ((x < 0) != (y < 0)) {
		q--
	}
	return q
}

// DimEqual reports whether two dimensions are provably equal: the same
// constant, or the same expression over the same variables.
func DimEqual(a, b Expr) bool {
	a, b = FoldDim(a), FoldDim(b)
	ca, aok := a.(*IntImm)
	cb, bok := b.(*IntImm)
	if aok && bok {
		return ca.Value == cb.Value
	}
	if aok != bok {
		return false
	}
	return Equal(a, b)
}

// dimConflict reports dimensions that are provably different: two
// different constants.
func dimConflict(a, b Expr) bool {
	x, aok := ConstDim(a)
	y, bok := ConstDim(b)
	return aok && bok && x != y
}

// String prints R.Object.
func (*ObjectStructInfo) String() string { return "R.Object" }

// String prints R.Prim("dtype").
func (s *PrimStructInfo) String() string {
	if s.Value != nil {
		return fmt.Sprintf("R.Prim(value=%s)", dimString(s.Value))
	}
	if IsVoid(s.DType) {
		return "R.Prim"
	}
	return fmt.Sprintf("R.Prim(%q)", s.DType.String())
}

// String prints R.Shape([…]) or R.Shape(ndim=n).
func (s *ShapeStructInfo) String() string {
	switch {
	case s.Values != nil:
		return "R.Shape([" + dimsString(s.Values) + "])"
	case s.NDim >= 0:
		return fmt.Sprintf("R.Shape(ndim=%d)", s.NDim)
	}
	return "R.Shape"
}

// String prints R.Tensor((…), dtype="…").
func (s *TensorStructInfo) String() string {
	var args []string
	if s.Shape != nil {
		args = append(args, ShapeString(s.Shape))
	}
	if !IsVoid(s.DType) {
		args = append(args, fmt.Sprintf("dtype=%q", s.DType.String()))
	}
	if s.Shape == nil && s.NDim >= 0 {
		args = append(args, fmt.Sprintf("ndim=%d", s.NDim))
	}
	if len(args) == 0 {
		return "R.Tensor"
	}
	return "R.Tensor(" + strings.Join(args, ", ") + ")"
}

// String prints R.Tuple(…).
func (s *TupleStructInfo) String() string {
	if len(s.Fields) == 0 {
		return "R.Tuple"
	}
	parts := make([]string, len(s.Fields))
	for i, f := range s.Fields {
		parts[i] = f.String()
	}
	return "R.Tuple(" + strings.Join(parts, ", ") + ")"
}

// String prints R.Callable(…).
func (s *FuncStructInfo) String() string {
	if s.Params == nil {
		return "R.Callable"
	}
	parts := make([]string, len(s.Params))
	for i, f := range s.Params {
		parts[i] = f.String()
	}
	ret := "R.Object"
	if s.Ret != nil {
		ret = s.Ret.String()
	}
	return fmt.Sprintf("R.Callable((%s), %s, %v)", strings.Join(parts, ", "), ret, pyBool(s.Pure))
}

func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

// ShapeString prints dimensions as a Python tuple: (1, 784), (n,).
func ShapeString(dims []Expr) string {
	if len(dims) == 1 {
		return "(" + dimString(dims[0]) + ",)"
	}
	return "(" + dimsString(dims) + ")"
}

func dimsString(dims []Expr) string {
	parts := make([]string, len(dims))
	for i, d := range dims {
		parts[i] = dimString(d)
	}
	return strings.Join(parts, ", ")
}

// DimString prints a dimension for messages: 784, n, n * 2.
func DimString(d Expr) string { return dimString(d) }

func dimString(d Expr) string {
	switch d := d.(type) {
	case nil:
		return "?"
	case *IntImm:
		if d.Type.IsInt() {
			return fmt.Sprint(d.Value)
		}
	case *Var:
		return d.Name
	case *Binary:
		if s := d.Op.Symbol(); s != "" {
			return dimString(d.A) + " " + s + " " + dimString(d.B)
		}
	}
	return d.String()
}

// IsBaseOf reports whether every value described by derived is also
// described by base (base is the same or less specific).
func IsBaseOf(base, derived StructInfo) bool {
	switch b := base.(type) {
	case nil, *ObjectStructInfo:
		return true
	case *PrimStructInfo:
		d, ok := derived.(*PrimStructInfo)
		if !ok || !IsVoid(b.DType) && b.DType != d.DType {
			return false
		}
		return b.Value == nil || d.Value != nil && DimEqual(b.Value, d.Value)
	case *ShapeStructInfo:
		d, ok := derived.(*ShapeStructInfo)
		if !ok || b.NDim >= 0 && b.NDim != d.NDim {
			return false
		}
		return b.Values == nil || d.Values != nil && dimsEqual(b.Values, d.Values)
	case *TensorStructInfo:
		d, ok := derived.(*TensorStructInfo)
		if !ok || !IsVoid(b.DType) && b.DType != d.DType || b.NDim >= 0 && b.NDim != d.NDim {
			return false
		}
		return b.Shape == nil || d.Shape != nil && dimsEqual(b.Shape, d.Shape)
	case *TupleStructInfo:
		d, ok := derived.(*TupleStructInfo)
		if !ok || len(b.Fields) != len(d.Fields) {
			return false
		}
		for i := range b.Fields {
			if !IsBaseOf(b.Fields[i], d.Fields[i]) {
				return false
			}
		}
		return true
	case *FuncStructInfo:
		d, ok := derived.(*FuncStructInfo)
		if !ok || b.Pure && !d.Pure {
			return false
		}
		if b.Params == nil {
			return true
		}
		if d.Params == nil || len(b.Params) != len(d.Params) {
			return false
		}
		for i := range b.Params {
			if !IsBaseOf(d.Params[i], b.Params[i]) {
				return false
			}
		}
		return IsBaseOf(b.Ret, d.Ret)
	}
	return false
}

func dimsEqual(a, b []Expr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !DimEqual(a[i], b[i]) {
			return false
		}
	}
	return true
}

// Conflict explains why a value described by actual can never be
// described by want (different kinds, dtypes, ranks or constant
// dimensions), or returns "" when it can: actual is more specific, or
// unknown or symbolic parts may match at run time.
func Conflict(want, actual StructInfo) string {
	mismatch := func() string { return fmt.Sprintf("%s is not %s", actual, want) }
	switch w := want.(type) {
	case nil, *ObjectStructInfo:
		return ""
	case *PrimStructInfo:
		a, ok := actual.(*PrimStructInfo)
		if !ok {
			if _, obj := actual.(*ObjectStructInfo); obj {
				return ""
			}
			return mismatch()
		}
		if !IsVoid(w.DType) && !IsVoid(a.DType) && w.DType != a.DType {
			return mismatch()
		}
	case *ShapeStructInfo:
		a, ok := actual.(*ShapeStructInfo)
		if !ok {
			if _, obj := actual.(*ObjectStructInfo); obj {
				return ""
			}
			return mismatch()
		}
		if w.NDim >= 0 && a.NDim >= 0 && w.NDim != a.NDim {
			return mismatch()
		}
		if w.Values != nil && a.Values != nil {
			for i := range w.Values {
				if dimConflict(w.Values[i], a.Values[i]) {
					return mismatch()
				}
			}
		}
	case *TensorStructInfo:
		a, ok := actual.(*TensorStructInfo)
		if !ok {
			if _, obj := actual.(*ObjectStructInfo); obj {
				return ""
			}
			return mismatch()
		}
		if !IsVoid(w.DType) && !IsVoid(a.DType) && w.DType != a.DType {
			return mismatch()
		}
		if w.NDim >= 0 && a.NDim >= 0 && w.NDim != a.NDim {
			return mismatch()
		}
		if w.Shape != nil && a.Shape != nil {
			for i := range w.Shape {
				if dimConflict(w.Shape[i], a.Shape[i]) {
					return mismatch()
				}
			}
		}
	case *TupleStructInfo:
		a, ok := actual.(*TupleStructInfo)
		if !ok {
			if _, obj := actual.(*ObjectStructInfo); obj {
				return ""
			}
			return mismatch()
		}
		if len(w.Fields) != len(a.Fields) {
			return mismatch()
		}
		for i := range w.Fields {
			if Conflict(w.Fields[i], a.Fields[i]) != "" {
				return mismatch()
			}
		}
	case *FuncStructInfo:
		switch actual.(type) {
		case *FuncStructInfo, *ObjectStructInfo:
		default:
			return mismatch()
		}
	}
	return ""
}

// Unify returns the most specific struct info describing values of both a
// and b (the join of an if's branches): equal parts are kept, differing
// parts become unknown.
func Unify(a, b StructInfo) StructInfo {
	switch x := a.(type) {
	case *PrimStructInfo:
		if y, ok := b.(*PrimStructInfo); ok {
			if x.DType != y.DType {
				return &PrimStructInfo{}
			}
			if x.Value != nil && y.Value != nil && DimEqual(x.Value, y.Value) {
				return x
			}
			return &PrimStructInfo{DType: x.DType}
		}
	case *ShapeStructInfo:
		if y, ok := b.(*ShapeStructInfo); ok {
			if x.NDim != y.NDim {
				return &ShapeStructInfo{NDim: -1}
			}
			if x.Values != nil && y.Values != nil && dimsEqual(x.Values, y.Values) {
				return x
			}
			return &ShapeStructInfo{NDim: x.NDim}
		}
	case *TensorStructInfo:
		if y, ok := b.(*TensorStructInfo); ok {
			out := &TensorStructInfo{NDim: -1}
			if x.DType == y.DType {
				out.DType = x.DType
			}
			if x.NDim == y.NDim {
				out.NDim = x.NDim
				if x.Shape != nil && y.Shape != nil && dimsEqual(x.Shape, y.Shape) {
					out.Shape = x.Shape
				}
			}
			return out
		}
	case *TupleStructInfo:
		if y, ok := b.(*TupleStructInfo); ok && len(x.Fields) == len(y.Fields) {
			fs := make([]StructInfo, len(x.Fields))
			for i := range fs {
				fs[i] = Unify(x.Fields[i], y.Fields[i])
			}
			return Tuple(fs...)
		}
	case *FuncStructInfo:
		if y, ok := b.(*FuncStructInfo); ok {
			if IsBaseOf(x, y) {
				return x
			}
			if IsBaseOf(y, x) {
				return y
			}
			return &FuncStructInfo{Pure: x.Pure && y.Pure}
		}
	}
	return Object()
}

// WriteStructure writes the struct info for structural equality.
func (*ObjectStructInfo) WriteStructure(w *StructuralWriter) {}

// WriteStructure writes the struct info for structural equality.
func (s *PrimStructInfo) WriteStructure(w *StructuralWriter) {
	w.DType(s.DType)
	w.Node(s.Value)
}

// WriteStructure writes the struct info for structural equality.
func (s *ShapeStructInfo) WriteStructure(w *StructuralWriter) {
	w.Int(int64(s.NDim))
	w.optExprs(s.Values)
}

// WriteStructure writes the struct info for structural equality.
func (s *TensorStructInfo) WriteStructure(w *StructuralWriter) {
	w.Int(int64(s.NDim))
	w.DType(s.DType)
	w.optExprs(s.Shape)
}

// WriteStructure writes the struct info for structural equality.
func (s *TupleStructInfo) WriteStructure(w *StructuralWriter) {
	w.Int(int64(len(s.Fields)))
	for _, f := range s.Fields {
		w.Node(f)
	}
}

// WriteStructure writes the struct info for structural equality.
func (s *FuncStructInfo) WriteStructure(w *StructuralWriter) {
	if s.Params == nil {
		w.Tag("opaque")
	} else {
		w.Int(int64(len(s.Params)))
		for _, p := range s.Params {
			w.Node(p)
		}
	}
	w.Node(s.Ret)
	if s.Pure {
		w.Int(1)
	} else {
		w.Int(0)
	}
}

func (w *StructuralWriter) optExprs(es []Expr) {
	if es == nil {
		w.Tag("unknown")
		return
	}
	w.exprs(es)
}
