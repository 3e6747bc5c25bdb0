package ir

import (
	"errors"
	"fmt"
)

// VerifyFunction checks that the graph function f, called name, is well
// formed: every variable is defined before use and only once, dataflow
// variables are bound in dataflow blocks and used only in the block that
// binds them, symbolic dimensions are defined (by a parameter's struct
// info or a MatchCast) before use, operators are registered, each binding's
// struct info agrees with what its value computes (by the operators'
// inference), dataflow blocks and pure functions make no impure calls, and
// the body agrees with the declared result. mod, which may be nil, resolves
// calls of other functions and call_tir targets. Problems are joined; each
// is a *VerifyError naming the function and the binding.
func VerifyFunction(name string, f *Function, mod *IRModule) error {
	v := &rverifier{fn: name, mod: mod, pure: f.Pure, defined: map[*RVar]bool{}, scope: map[*RVar]bool{},
		dfBlock: map[*RVar]*BindingBlock{}, sym: map[*Var]bool{}}
	v.function(f)
	return errors.Join(v.errs...)
}

type rverifier struct {
	fn      string
	mod     *IRModule
	pure    bool
	errs    []error
	defined map[*RVar]bool
	scope   map[*RVar]bool
	dfBlock map[*RVar]*BindingBlock // the block that binds each dataflow variable
	block   *BindingBlock           // the block being checked, nil outside
	sym     map[*Var]bool           // symbolic dimensions in scope
	node    string
}

func (v *rverifier) errorf(format string, args ...any) {
	if len(v.errs) >= maxVerifyErrors {
		return
	}
	v.errs = append(v.errs, &VerifyError{Func: v.fn, Node: v.node, Msg: fmt.Sprintf(format, args...)})
}

func (v *rverifier) function(f *Function) {
	outer := v.node
	for _, p := range f.Params {
		v.node = fmt.Sprintf("parameter %q", p.Name)
		if p.Dataflow {
			v.errorf("a parameter cannot be a dataflow variable")
		}
		v.defineSym(p.Info)
		v.define(p)
	}
	v.node = outer
	if f.Body == nil {
		v.errorf("function has no body")
		return
	}
	body := v.seq(f.Body)
	v.node = "return value"
	v.useSym(f.Ret)
	if msg := Conflict(f.Ret, body); msg != "" {
		v.errorf("result %s does not match the declared %s", body, f.Ret)
	}
	v.node = outer
}

func (v *rverifier) define(x *RVar) {
	if v.defined[x] {
		v.errorf("variable %q defined twice", x.Name)
	}
	v.defined[x] = true
	v.scope[x] = true
}

// defineSym defines the symbolic variables that s mentions for the first
// time; a dimension like n + 1 does not define n.
func (v *rverifier) defineSym(s StructInfo) {
	for _, d := range sinfoDims(s) {
		if x, ok := d.(*Var); ok {
			v.sym[x] = true
		}
	}
	v.useSym(s)
}

func (v *rverifier) useSym(s StructInfo) {
	for _, d := range sinfoDims(s) {
		v.useDim(d)
	}
}

func (v *rverifier) useDim(d Expr) {
	PostOrderVisit(d, func(n Node) {
		if x, ok := n.(*Var); ok && !v.sym[x] {
			v.errorf("symbolic dimension %q is not defined", x.Name)
			v.sym[x] = true // report once
		}
	})
}

// sinfoDims returns the dimension expressions in s.
func sinfoDims(s StructInfo) []Expr {
	switch s := s.(type) {
	case *TensorStructInfo:
		return s.Shape
	case *ShapeStructInfo:
		return s.Values
	case *PrimStructInfo:
		if s.Value != nil {
			return []Expr{s.Value}
		}
	case *TupleStructInfo:
		var out []Expr
		for _, f := range s.Fields {
			out = append(out, sinfoDims(f)...)
		}
		return out
	case *FuncStructInfo:
		var out []Expr
		for _, p := range s.Params {
			out = append(out, sinfoDims(p)...)
		}
		return append(out, sinfoDims(s.Ret)...)
	}
	return nil
}

// seq checks s in a new scope and returns its struct info.
func (v *rverifier) seq(s *SeqExpr) StructInfo {
	saved := make(map[*RVar]bool, len(v.scope))
	for k := range v.scope {
		saved[k] = true
	}
	outerBlock := v.block
	for _, b := range s.Blocks {
		v.block = b
		for _, bd := range b.Bindings {
			v.binding(b, bd)
		}
	}
	v.block = nil
	outer := v.node
	v.node = "body"
	info := v.expr(s.Body)
	v.node = outer
	v.block = outerBlock
	v.scope = saved
	return info
}

func (v *rverifier) binding(b *BindingBlock, bd Binding) {
	x := bd.BoundVar()
	outer := v.node
	defer func() { v.node = outer }()
	if x == nil {
		v.node = "binding"
		v.errorf("binding without a variable")
		return
	}
	v.node = fmt.Sprintf("binding %q", x.Name)
	if bd.BoundValue() == nil {
		v.errorf("binding without a value")
		return
	}
	if x.Dataflow && !b.Dataflow {
		v.errorf("dataflow variable bound outside a dataflow block")
	}
	val := v.expr(bd.BoundValue())
	if c, ok := bd.BoundValue().(*RCall); ok {
		if pure, known := callPurity(c, v.mod); known && !pure {
			switch {
			case b.Dataflow:
				v.errorf("impure call of %s in a dataflow block", calleeName(c))
			case v.pure:
				v.errorf("impure call of %s in a pure function (mark it pure=False)", calleeName(c))
			}
		}
	}
	switch bd := bd.(type) {
	case *VarBinding:
		v.useSym(x.Info)
		if msg := Conflict(x.Info, val); msg != "" {
			v.errorf("struct info %s does not match the value's %s", x.Info, val)
		}
	case *MatchCast:
		v.defineSym(bd.Info)
		if msg := Conflict(bd.Info, val); msg != "" {
			v.errorf("match_cast to %s of a value of %s can never succeed", bd.Info, val)
		}
	}
	v.define(x)
	if x.Dataflow {
		v.dfBlock[x] = b
	}
}

func calleeName(c *RCall) string {
	switch op := c.Op.(type) {
	case *Op:
		return fmt.Sprintf("%q", op.Name)
	case *GlobalVar:
		return fmt.Sprintf("%q", op.Name)
	case *ExternFunc:
		return fmt.Sprintf("%q", op.Name)
	case *RVar:
		return fmt.Sprintf("%q", op.Name)
	}
	return fmt.Sprintf("%T", c.Op)
}

// expr checks the uses in e and returns its struct info.
func (v *rverifier) expr(e RExpr) StructInfo {
	switch e := e.(type) {
	case nil:
		v.errorf("missing expression")
		return Object()
	case *RVar:
		switch {
		case !v.scope[e]:
			v.errorf("variable %q is not defined here", e.Name)
		case e.Dataflow && v.dfBlock[e] != v.block:
			v.errorf("dataflow variable %q used outside its dataflow block", e.Name)
		}
		return StructInfoOf(e)
	case *RCall:
		return v.call(e)
	case *RTuple:
		fs := make([]StructInfo, len(e.Fields))
		for i, f := range e.Fields {
			fs[i] = v.expr(f)
		}
		return Tuple(fs...)
	case *TupleGetItem:
		t := v.expr(e.Tuple)
		switch ts := t.(type) {
		case *TupleStructInfo:
			if e.Index < 0 || e.Index >= len(ts.Fields) {
				v.errorf("index %d of a tuple of %d fields", e.Index, len(ts.Fields))
				return Object()
			}
			return ts.Fields[e.Index]
		case *ObjectStructInfo:
			return Object()
		}
		v.errorf("indexing %s, which is not a tuple", t)
		return Object()
	case *ShapeExpr:
		for _, d := range e.Values {
			v.useDim(d)
			if !IsIndexType(d.DType()) {
				v.errorf("shape value %s has dtype %s, want an integer", d, d.DType())
			}
		}
		return StructInfoOf(e)
	case *PrimValue:
		v.useDim(e.Value)
		return StructInfoOf(e)
	case *RIf:
		c := v.expr(e.Cond)
		if !isBoolScalar(c) {
			v.errorf("if condition has struct info %s, want a bool scalar", c)
		}
		if e.Then == nil || e.Else == nil {
			v.errorf("if without both branches")
			return Object()
		}
		return Unify(v.seq(e.Then), v.seq(e.Else))
	case *SeqExpr:
		return v.seq(e)
	case *Function:
		saved := v.pure
		v.pure = e.Pure
		v.function(e)
		v.pure = saved
		return e.FuncInfo()
	case *GlobalVar:
		if v.mod != nil {
			if _, ok := v.mod.Lookup(e.Name); !ok {
				v.errorf("no function %q in the module", e.Name)
			}
		}
		return Object()
	case *Op:
		return Object()
	case *Constant:
		if want := e.Shape.NumElements() * int64(e.DType.Size()); int64(len(e.Data)) != want {
			v.errorf("constant of %s holds %d bytes, want %d", e.Info(), len(e.Data), want)
		}
		return e.Info()
	case *ExternFunc, *RString, *DataTypeImm:
		return StructInfoOf(e)
	}
	v.errorf("unexpected expression %T", e)
	return Object()
}

func isBoolScalar(s StructInfo) bool {
	switch s := s.(type) {
	case *TensorStructInfo:
		return (IsVoid(s.DType) || IsBool(s.DType)) && (s.NDim == 0 || s.NDim == -1)
	case *PrimStructInfo:
		return IsVoid(s.DType) || IsBool(s.DType)
	case *ObjectStructInfo:
		return true
	}
	return false
}

func (v *rverifier) call(c *RCall) StructInfo {
	switch op := c.Op.(type) {
	case *Op:
		if _, ok := LookupOp(op.Name); !ok && op.Name != OpCallTIR && op.Name != OpCallPacked {
			v.errorf("unknown operator %q", op.Name)
			return Object()
		}
	case nil:
		v.errorf("call without a callee")
		return Object()
	default:
		v.expr(c.Op)
	}
	for _, a := range c.Args {
		v.expr(a)
	}
	for _, s := range c.SInfoArgs {
		v.useSym(s)
	}
	if op, ok := c.Op.(*Op); ok && op.Name == OpCallTIR && v.mod != nil && len(c.Args) > 0 {
		if gv, ok := c.Args[0].(*GlobalVar); ok {
			if f, _ := v.mod.Lookup(gv.Name); f != nil {
				if _, prim := f.(*PrimFunc); !prim {
					v.errorf("call_tir of %q, which is not a PrimFunc", gv.Name)
				}
			}
		}
	}
	info, err := InferCall(c, v.mod)
	if err != nil {
		v.errorf("%v", err)
		return Object()
	}
	return info
}
