package ir

import (
	"fmt"
	"maps"
	"slices"

	"github.com/kiln-ml/kiln/ndarray"
)

// This file holds the graph-level (Relax-style) IR: functions over
// tensors whose bodies are sequences of binding blocks (dataflow or not)
// ending in a result, calls of operators, of PrimFuncs (call_tir) and of
// other functions, tuples, constants, shapes and conditionals. Graph
// nodes are prefixed R where TensorIR already uses the plain name (RExpr,
// RVar, RCall, RTuple, RIf, RString).

// RExpr is a graph-level expression. Its StructInfo says what it computes;
// see StructInfoOf.
type RExpr interface {
	Node
	isRExpr()
}

// RVar is a graph-level variable: a function parameter or the target of a
// binding. A Dataflow variable is local to the dataflow block that binds
// it. Identity is the pointer; Name is a hint for printing.
type RVar struct {
	Name     string
	Info     StructInfo
	Dataflow bool
}

// Op names a registered operator ("relax.add", "relax.call_tir"…) as the
// callee of an RCall. Ops compare by name.
type Op struct {
	Name string
}

// ExternFunc names a packed function provided by the runtime
// (R.ExternFunc("vm.builtin.copy")), callable with R.call_packed.
type ExternFunc struct {
	Name string
}

// RCall calls Op, which is an *Op (an operator, with Attrs), a *GlobalVar
// (a function of the module), an *RVar holding a function, or an
// *ExternFunc. SInfoArgs are struct infos some operators take (call_tir's
// out_sinfo). Info is the call's result, set when the call is built.
// Sources are the model operators the call computes (set by a frontend,
// carried by the passes that rewrite or fuse calls, and recorded by the
// VM's code generator for profiles); they are not part of the call's
// structure and are not printed.
type RCall struct {
	Op        RExpr
	Args      []RExpr
	Attrs     map[string]any
	SInfoArgs []StructInfo
	Info      StructInfo
	Sources   []Source
}

// Source is a model operator a graph-level call came from: the node's
// name and its operator type in the model ("conv1", "Conv").
type Source struct {
	Name, Op string
}

// AddSources appends to dst the sources of src it lacks, in order.
func AddSources(dst []Source, src ...Source) []Source {
	for _, s := range src {
		if !slices.Contains(dst, s) {
			dst = append(dst, s)
		}
	}
	return dst
}

// RTuple builds a tuple of Fields.
type RTuple struct {
	Fields []RExpr
}

// TupleGetItem is field Index of Tuple.
type TupleGetItem struct {
	Tuple RExpr
	Index int
}

// Constant is a tensor constant (R.const). The data is kept on the host in
// the IR, compactly in row-major order: NewConstant copies an
// ndarray.NDArray in, and ndarray.FromBytes(c.Data, c.Shape, c.DType, dev)
// makes one back (this package does not import devices).
type Constant struct {
	DType DType
	Shape ndarray.Shape
	Data  []byte
}

// ShapeExpr is a shape value (R.shape([2, n])); values are int64
// expressions.
type ShapeExpr struct {
	Values []Expr
}

// PrimValue is a scalar value (R.prim_value(0)).
type PrimValue struct {
	Value Expr
}

// RString is a string argument (R.str("global")).
type RString struct {
	Value string
}

// DataTypeImm is a dtype argument (R.dtype("float32")).
type DataTypeImm struct {
	DType DType
}

// RIf evaluates Then or Else (each a *SeqExpr) by Cond, a boolean scalar
// tensor or R.Prim("bool"). Info joins the branches' struct infos.
type RIf struct {
	Cond       RExpr
	Then, Else *SeqExpr
	Info       StructInfo
}

// SeqExpr evaluates binding blocks in order, then Body.
type SeqExpr struct {
	Blocks []*BindingBlock
	Body   RExpr
}

// BindingBlock is a list of bindings. In a Dataflow block bindings are
// pure and may be reordered; variables bound there are Dataflow variables
// unless the block outputs them.
type BindingBlock struct {
	Dataflow bool
	Bindings []Binding
}

// Binding binds a variable in a BindingBlock: a *VarBinding or a
// *MatchCast.
type Binding interface {
	// BoundVar is the variable the binding defines.
	BoundVar() *RVar
	// BoundValue is the expression whose value the variable takes.
	BoundValue() RExpr
	isBinding()
}

// VarBinding binds Var to Value.
type VarBinding struct {
	Var   *RVar
	Value RExpr
}

// MatchCast binds Var to Value after checking at run time that Value
// matches Info; symbolic dimensions first seen in Info are defined here.
type MatchCast struct {
	Var   *RVar
	Value RExpr
	Info  StructInfo
}

// Function is a graph-level function: parameters with struct info, a body
// and the result's struct info Ret. A function not Pure may have side
// effects (allocate storage, call PrimFuncs directly). It is a BaseFunc,
// so IRModules hold it beside PrimFuncs; a function that is not private
// has the attribute AttrGlobalSymbol.
type Function struct {
	Params []*RVar
	Body   *SeqExpr
	Ret    StructInfo
	Pure   bool
	Attrs  map[string]any
}

func (*RVar) isRExpr()         {}
func (*Op) isRExpr()           {}
func (*ExternFunc) isRExpr()   {}
func (*GlobalVar) isRExpr()    {}
func (*RCall) isRExpr()        {}
func (*RTuple) isRExpr()       {}
func (*TupleGetItem) isRExpr() {}
func (*Constant) isRExpr()     {}
func (*ShapeExpr) isRExpr()    {}
func (*PrimValue) isRExpr()    {}
func (*RString) isRExpr()      {}
func (*DataTypeImm) isRExpr()  {}
func (*RIf) isRExpr()          {}
func (*SeqExpr) isRExpr()      {}
func (*Function) isRExpr()     {}

func (*VarBinding) isBinding() {}
func (*MatchCast) isBinding()  {}

// BoundVar returns Var.
func (b *VarBinding) BoundVar() *RVar { return b.Var }

// BoundValue returns Value.
func (b *VarBinding) BoundValue() RExpr { return b.Value }

// BoundVar returns Var.
func (b *MatchCast) BoundVar() *RVar { return b.Var }

// BoundValue returns Value.
func (b *MatchCast) BoundValue() RExpr { return b.Value }

// FuncAttrs returns the attributes.
func (f *Function) FuncAttrs() map[string]any { return f.Attrs }

// WithAttr returns a copy of f with attribute key set to v.
func (f *Function) WithAttr(key string, v any) *Function {
	g := *f
	g.Attrs = maps.Clone(f.Attrs)
	if g.Attrs == nil {
		g.Attrs = map[string]any{}
	}
	g.Attrs[key] = v
	return &g
}

// WithBody returns a copy of f with body.
func (f *Function) WithBody(body *SeqExpr) *Function {
	g := *f
	g.Body = body
	return &g
}

// NewRVar returns a fresh graph variable with struct info info.
func NewRVar(name string, info StructInfo) *RVar {
	if info == nil {
		info = Object()
	}
	return &RVar{Name: name, Info: info}
}

// NewDataflowVar returns a fresh dataflow variable.
func NewDataflowVar(name string, info StructInfo) *RVar {
	v := NewRVar(name, info)
	v.Dataflow = true
	return v
}

// String is the variable's name.
func (v *RVar) String() string { return v.Name }

// NewFunction returns a pure function whose Ret is body's struct info,
// with attrs (which may be nil).
func NewFunction(params []*RVar, body *SeqExpr, attrs map[string]any) *Function {
	if attrs == nil {
		attrs = map[string]any{}
	}
	return &Function{Params: params, Body: body, Ret: StructInfoOf(body), Pure: true, Attrs: attrs}
}

// FuncInfo returns the function's struct info.
func (f *Function) FuncInfo() *FuncStructInfo {
	ps := make([]StructInfo, len(f.Params))
	for i, p := range f.Params {
		ps[i] = p.Info
	}
	return &FuncStructInfo{Params: ps, Ret: f.Ret, Pure: f.Pure}
}

// NewConstant copies a into a Constant. a may live on any device whose
// memory the host can read (its bytes are fetched with Bytes).
func NewConstant(a *ndarray.NDArray) (*Constant, error) {
	b, err := a.Bytes()
	if err != nil {
		return nil, fmt.Errorf("read constant data: %w", err)
	}
	return &Constant{DType: a.DType(), Shape: a.Shape().Clone(), Data: b}, nil
}

// ConstantFromBytes returns a Constant holding data (compact row-major)
// of shape and dtype; the length must match.
func ConstantFromBytes(dtype DType, shape ndarray.Shape, data []byte) (*Constant, error) {
	if err := shape.Validate(); err != nil {
		return nil, fmt.Errorf("constant shape %s: %w", shape, err)
	}
	if want := shape.NumElements() * int64(dtype.Size()); int64(len(data)) != want {
		return nil, fmt.Errorf("constant of shape %s and dtype %s needs %d bytes, got %d", shape, dtype, want, len(data))
	}
	return &Constant{DType: dtype, Shape: shape.Clone(), Data: data}, nil
}

// Info is the constant's tensor struct info.
func (c *Constant) Info() *TensorStructInfo {
	return TensorOfShape(c.DType, c.Shape...)
}

// CallTIR returns R.call_tir(gv, (args…), out_sinfo=out): a call of the
// PrimFunc gv in destination-passing style, whose output tensors (out, or
// the fields of a tuple out) are allocated by the caller.
func CallTIR(gv *GlobalVar, args []RExpr, out StructInfo) *RCall {
	return &RCall{Op: &Op{Name: OpCallTIR}, Args: []RExpr{gv, &RTuple{Fields: args}},
		SInfoArgs: []StructInfo{out}, Info: out}
}

// Graph-level operators this package knows by name (the others live in
// the registry, see RegisterOp).
const (
	// OpCallTIR calls a PrimFunc: Args are the GlobalVar and a tuple of
	// inputs, SInfoArgs[0] the outputs' struct info.
	OpCallTIR = "relax.call_tir"
	// OpCallPacked calls a packed (runtime) function: Args[0] is an
	// *ExternFunc, SInfoArgs[0] the result's struct info.
	OpCallPacked = "relax.call_packed"
)

// StructInfoOf returns what e computes, as far as it is known without a
// module: a GlobalVar or an Op is an object, a call has the Info it was
// built with.
func StructInfoOf(e RExpr) StructInfo {
	switch e := e.(type) {
	case *RVar:
		if e.Info != nil {
			return e.Info
		}
	case *RCall:
		if e.Info != nil {
			return e.Info
		}
	case *RTuple:
		fs := make([]StructInfo, len(e.Fields))
		for i, f := range e.Fields {
			fs[i] = StructInfoOf(f)
		}
		return Tuple(fs...)
	case *TupleGetItem:
		if t, ok := StructInfoOf(e.Tuple).(*TupleStructInfo); ok && e.Index >= 0 && e.Index < len(t.Fields) {
			return t.Fields[e.Index]
		}
	case *Constant:
		return e.Info()
	case *ShapeExpr:
		return ShapeOf(e.Values...)
	case *PrimValue:
		return &PrimStructInfo{DType: e.Value.DType(), Value: e.Value}
	case *RIf:
		if e.Info != nil {
			return e.Info
		}
	case *SeqExpr:
		return StructInfoOf(e.Body)
	case *Function:
		return e.FuncInfo()
	case *ExternFunc:
		return &FuncStructInfo{}
	}
	return Object()
}

// NewIf returns an if whose Info joins the branches'.
func NewIf(cond RExpr, then, els *SeqExpr) *RIf {
	return &RIf{Cond: cond, Then: then, Else: els, Info: Unify(StructInfoOf(then), StructInfoOf(els))}
}
