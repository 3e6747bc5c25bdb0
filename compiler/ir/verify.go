package ir

import (
	"errors"
	"fmt"
	"strings"
)

// ErrIllFormed is wrapped by every error that Verify reports.
var ErrIllFormed = errors.New("ill-formed IR")

// VerifyError is one problem Verify found: the function, the innermost
// block and statement around it, and what is wrong.
type VerifyError struct {
	Func  string
	Block string // "" outside any block
	Node  string // the statement, as Describe prints it
	Msg   string
}

// Error prints `function "f": block "b": store to "C": what is wrong`.
func (e *VerifyError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "function %q", e.Func)
	if e.Block != "" {
		fmt.Fprintf(&b, ": block %q", e.Block)
	}
	if e.Node != "" && e.Node != fmt.Sprintf("block %q", e.Block) {
		b.WriteString(": " + e.Node)
	}
	return b.String() + ": " + e.Msg
}

// Is makes errors.Is(err, ErrIllFormed) hold.
func (e *VerifyError) Is(target error) bool { return target == ErrIllFormed }

// maxVerifyErrors bounds how many problems one Verify reports.
const maxVerifyErrors = 20

// Verify checks that f is well formed: every variable and buffer used is
// defined in scope and defined only once, loads and stores have one index
// per dimension, operands of binary operations and stores agree in dtype,
// conditions are Bool, block bindings match their iteration variables, and
// reduction iteration variables appear only in reduction contexts (not in
// a block's init, not in the indices a reduction block writes, not bound
// to parallel, vectorized or thread-bound loops). The function is named by
// its "global_symbol" attribute, or "prim_func". Problems are joined into
// one error; each is a *VerifyError.
func Verify(f *PrimFunc) error {
	name, _ := f.Attrs[AttrGlobalSymbol].(string)
	if name == "" {
		name = "prim_func"
	}
	return verifyFunc(name, f)
}

// VerifyModule verifies every PrimFunc of m under its name in m, and
// every graph-level Function with VerifyFunction in the context of m.
func VerifyModule(m *IRModule) error {
	var errs []error
	for name, f := range m.Funcs() {
		var err error
		switch f := f.(type) {
		case *PrimFunc:
			err = verifyFunc(name, f)
		case *Function:
			err = VerifyFunction(name, f, m)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

type verifier struct {
	fn      string
	errs    []error
	defined map[*Var]bool    // ever defined in the function
	scope   map[*Var]bool    // defined here
	kinds   map[*Var]ForKind // loop variables in scope
	// crossThread are the variables of the threadIdx loops in scope: a
	// reduction over one is a cross-thread reduction.
	crossThread map[*Var]bool
	buffers     map[*Buffer]bool // declared buffers in scope
	reduce      map[*Var]bool    // reduce iteration variables not allowed here
	block       string
	node        string
}

func verifyFunc(name string, f *PrimFunc) error {
	v := &verifier{fn: name, defined: map[*Var]bool{}, scope: map[*Var]bool{}, kinds: map[*Var]ForKind{},
		buffers: map[*Buffer]bool{}, reduce: map[*Var]bool{}}
	v.node = "parameters"
	for _, p := range f.Params {
		if p == nil {
			v.errorf("nil parameter")
			continue
		}
		v.define(p)
	}
	// Shape variables are defined by their first occurrence in the buffer map.
	for _, p := range f.Params {
		b, ok := f.BufferMap[p]
		if !ok {
			continue
		}
		if b == nil {
			v.errorf("parameter %q has a nil buffer", p.Name)
			continue
		}
		for _, e := range bufferExprs(b) {
			PostOrderVisit(e, func(n Node) {
				if x, ok := n.(*Var); ok && !v.scope[x] {
					v.define(x)
				}
			})
		}
		v.declareBuffer(b)
	}
	v.node = ""
	if f.Body == nil {
		v.errorf("no body")
	} else {
		v.stmt(f.Body)
		v.returns(f)
	}
	return errors.Join(v.errs...)
}

// returns checks the function's result: a RetType that is a scalar
// integer, bool, float32 or float64, and every `return value` (OpRet) one of its
// statements (the value of an Evaluate), outside loops and blocks other
// than the root block (TVM's packed functions return from their top
// level), of the RetType.
func (v *verifier) returns(f *PrimFunc) {
	v.block, v.node = "", ""
	rt := f.RetType
	if !IsVoid(rt) && (rt.Lanes != 1 || !(rt.IsInt() || IsBool(rt) || rt == Float32 || rt == Float64)) {
		v.errorf("returns %s: a function returns a scalar integer, bool, float32 or float64", rt)
	}
	var check func(Node) bool
	var walk func(s Stmt, where string)
	walk = func(s Stmt, where string) {
		Visit(s, func(n Node) bool {
			switch n := n.(type) {
			case *For:
				walk(n.Body, "a loop")
				return false
			case *BlockRealize:
				if n.Block.Name == RootBlockName && len(n.Block.IterVars) == 0 && where == "" {
					// The implicit root block is the function's top level.
					walk(n.Block.Body, "")
					return false
				}
				walk(n.Block.Body, "a block")
				if n.Block.Init != nil {
					walk(n.Block.Init, "a block")
				}
				return false
			case *Evaluate:
				if c, ok := n.Value.(*Call); ok && c.Op == OpRet {
					switch {
					case len(c.Args) != 1:
						v.errorf("return takes one value, got %d", len(c.Args))
					case where != "":
						v.errorf("return %s inside %s: a function returns from its top level only", c.Args[0], where)
					case IsVoid(rt):
						v.errorf("return %s in a function without a result type (declare it: -> T.%s)", c.Args[0], c.Args[0].DType())
					case c.Args[0].DType() != rt:
						v.errorf("return %s of dtype %s from a function that returns %s", c.Args[0], c.Args[0].DType(), rt)
					}
					for _, a := range c.Args {
						Visit(a, func(m Node) bool { return check(m) })
					}
					return false
				}
			case *Call:
				return check(n)
			}
			return true
		})
	}
	check = func(n Node) bool {
		if c, ok := n.(*Call); ok && c.Op == OpRet {
			v.errorf("return used as a value: it is a statement")
			return false
		}
		return true
	}
	walk(f.Body, "")
}

func bufferExprs(b *Buffer) []Expr {
	es := append([]Expr(nil), b.Shape...)
	es = append(es, b.Strides...)
	if b.ElemOffset != nil {
		es = append(es, b.ElemOffset)
	}
	return es
}

func (v *verifier) errorf(format string, args ...any) {
	if len(v.errs) == maxVerifyErrors {
		v.errs = append(v.errs, &VerifyError{Func: v.fn, Msg: "too many errors"})
	}
	if len(v.errs) > maxVerifyErrors {
		return
	}
	v.errs = append(v.errs, &VerifyError{Func: v.fn, Block: v.block, Node: v.node, Msg: fmt.Sprintf(format, args...)})
}

func (v *verifier) define(x *Var) {
	if v.defined[x] {
		v.errorf("variable %q defined twice", x.Name)
	}
	v.defined[x] = true
	v.scope[x] = true
}

func (v *verifier) undefine(x *Var) {
	delete(v.scope, x)
	delete(v.kinds, x)
}

// declareBuffer brings b into scope; its data variable is defined unless
// it already is (a view over existing memory).
func (v *verifier) declareBuffer(b *Buffer) {
	if v.buffers[b] {
		v.errorf("buffer %q declared twice", b.Name)
	}
	v.buffers[b] = true
	if b.Data == nil {
		v.errorf("buffer %q has no data variable", b.Name)
	} else if !v.scope[b.Data] {
		v.define(b.Data)
	}
	for i, s := range b.Shape {
		if s == nil {
			v.errorf("buffer %q has a nil extent at dimension %d", b.Name, i)
			continue
		}
		v.expr(s)
		if !IsIndexType(s.DType()) {
			v.errorf("buffer %q has extent %s of dtype %s, want an integer", b.Name, s, s.DType())
		}
	}
	for _, s := range b.Strides {
		v.expr(s)
	}
	if b.ElemOffset != nil {
		v.expr(b.ElemOffset)
	}
	if len(b.Strides) != 0 && len(b.Strides) != len(b.Shape) {
		v.errorf("buffer %q has %d strides for %d dimensions", b.Name, len(b.Strides), len(b.Shape))
	}
}

func (v *verifier) useBuffer(b *Buffer) bool {
	if b == nil {
		v.errorf("nil buffer")
		return false
	}
	if !v.buffers[b] && (b.Data == nil || !v.scope[b.Data]) {
		v.errorf("buffer %q is not defined here", b.Name)
		return false
	}
	return true
}

func (v *verifier) indices(b *Buffer, ix []Expr, what string) {
	if len(ix) != len(b.Shape) {
		v.errorf("%s %q with %d indices, buffer has %d dimensions", what, b.Name, len(ix), len(b.Shape))
	}
	for _, e := range ix {
		if e == nil {
			v.errorf("%s %q with a nil index", what, b.Name)
			continue
		}
		v.expr(e)
		if !e.DType().IsInt() {
			v.errorf("%s %q with index %s of dtype %s, want an integer", what, b.Name, e, e.DType())
		}
	}
}

func (v *verifier) cond(e Expr, what string) {
	if e == nil {
		v.errorf("nil %s", what)
		return
	}
	v.expr(e)
	if !IsBool(e.DType()) {
		v.errorf("%s %s has dtype %s, want bool", what, e, e.DType())
	}
}

func (v *verifier) expr(e Expr) {
	switch e := e.(type) {
	case nil:
		v.errorf("nil expression")
	case *IntImm, *FloatImm, *StringImm:
	case *Var:
		if !v.scope[e] {
			v.errorf("undefined variable %q", e.Name)
		} else if v.reduce[e] {
			v.errorf("reduction variable %q used outside a reduction context (the block's init)", e.Name)
		}
	case *Binary:
		if e.A == nil || e.B == nil {
			v.errorf("%s with a nil operand", e.Op)
			return
		}
		v.expr(e.A)
		v.expr(e.B)
		ta, tb := e.A.DType(), e.B.DType()
		switch {
		case ta != tb:
			v.errorf("dtype mismatch in %s: %s is %s, %s is %s", e.Op, e.A, ta, e.B, tb)
		case e.Op.IsLogical() && !IsBool(ta):
			v.errorf("%s of non-bool operands of dtype %s", e.Op, ta)
		}
	case *Not:
		v.cond(e.A, "operand of not")
	case *Cast:
		v.expr(e.Value)
		if e.Value != nil && e.Value.DType().Lanes != e.Type.Lanes {
			v.errorf("cast of %s from %s to %s changes the lane count", e.Value, e.Value.DType(), e.Type)
		}
	case *Select:
		v.cond(e.Cond, "select condition")
		v.expr(e.True)
		v.expr(e.False)
		if e.True != nil && e.False != nil && e.True.DType() != e.False.DType() {
			v.errorf("dtype mismatch in Select: %s vs %s", e.True.DType(), e.False.DType())
		}
	case *BufferLoad:
		if v.useBuffer(e.Buffer) {
			v.indices(e.Buffer, e.Indices, "load from")
		}
	case *Call:
		for _, a := range e.Args {
			v.expr(a)
		}
		if in, ok := Intrinsics[e.Op]; ok {
			if len(e.Args) != in.Arity {
				v.errorf("T.%s takes %d arguments, got %d", e.Op, in.Arity, len(e.Args))
			} else if in.FloatOnly && e.Args[0] != nil && !e.Args[0].DType().IsFloat() {
				v.errorf("T.%s of %s, want a float", e.Op, e.Args[0].DType())
			}
		}
		if e.Op == OpCallExtern {
			if len(e.Args) == 0 {
				v.errorf("call_extern without a function name")
			} else if name, ok := e.Args[0].(*StringImm); !ok {
				v.errorf("call_extern's first argument %s is not a string", e.Args[0])
			} else if !IsCIdentifier(name.Value) {
				v.errorf("call_extern of %q: a function name must be a C identifier (letters, digits, _)", name.Value)
			}
		}
	case *Ramp:
		v.expr(e.Base)
		v.expr(e.Stride)
		if e.Base != nil && e.Stride != nil && e.Base.DType() != e.Stride.DType() {
			v.errorf("dtype mismatch in Ramp: %s vs %s", e.Base.DType(), e.Stride.DType())
		}
		if e.Lanes < 1 {
			v.errorf("Ramp with %d lanes", e.Lanes)
		}
	case *Broadcast:
		v.expr(e.Value)
		if e.Lanes < 1 {
			v.errorf("Broadcast with %d lanes", e.Lanes)
		}
	case *Let:
		v.expr(e.Value)
		if e.Var == nil {
			v.errorf("let with a nil variable")
			return
		}
		v.define(e.Var)
		v.expr(e.Body)
		v.undefine(e.Var)
	default:
		v.errorf("unknown expression %T", e)
	}
}

func (v *verifier) stmt(s Stmt) {
	saved := v.node
	v.node = Describe(s)
	defer func() { v.node = saved }()
	switch s := s.(type) {
	case nil:
		v.errorf("nil statement")
	case *For:
		v.expr(s.Min)
		v.expr(s.Extent)
		if s.Var == nil {
			v.errorf("loop with a nil variable")
			return
		}
		if !IsIndexType(s.Var.Type) {
			v.errorf("loop variable %q has dtype %s, want an integer", s.Var.Name, s.Var.Type)
		}
		for _, e := range []Expr{s.Min, s.Extent} {
			if e != nil && e.DType() != s.Var.Type {
				v.errorf("loop bound %s has dtype %s, loop variable %q has %s", e, e.DType(), s.Var.Name, s.Var.Type)
			}
		}
		if s.Kind == ForThreadBinding && s.ThreadTag == "" {
			v.errorf("thread-bound loop without a thread tag")
		}
		v.define(s.Var)
		v.kinds[s.Var] = s.Kind
		if s.Kind == ForThreadBinding && strings.HasPrefix(s.ThreadTag, "threadIdx.") {
			if v.crossThread == nil {
				v.crossThread = map[*Var]bool{}
			}
			v.crossThread[s.Var] = true
		}
		v.stmt(s.Body)
		v.undefine(s.Var)
	case *BlockRealize:
		v.blockRealize(s)
	case *BufferStore:
		if !v.useBuffer(s.Buffer) {
			return
		}
		v.indices(s.Buffer, s.Indices, "store to")
		v.expr(s.Value)
		if s.Value == nil {
			return
		}
		want := s.Buffer.DType
		for _, ix := range s.Indices {
			if ix != nil && ix.DType().Lanes > 1 {
				want = want.WithLanes(int(ix.DType().Lanes) * int(want.Lanes))
			}
		}
		if got := s.Value.DType(); got != want {
			v.errorf("dtype mismatch: storing %s of dtype %s into buffer %q of dtype %s", s.Value, got, s.Buffer.Name, want)
		}
	case *Allocate:
		if s.Buffer == nil {
			v.errorf("allocate of a nil buffer")
			return
		}
		if s.Buffer.Data != nil && v.scope[s.Buffer.Data] {
			v.errorf("allocate %q: data variable already defined", s.Buffer.Name)
		}
		v.declareBuffer(s.Buffer)
		v.stmt(s.Body)
		delete(v.buffers, s.Buffer)
		if s.Buffer.Data != nil {
			v.undefine(s.Buffer.Data)
		}
	case *DeclBuffer:
		if s.Buffer == nil {
			v.errorf("decl_buffer of a nil buffer")
			return
		}
		if s.Buffer.Data == nil || !v.scope[s.Buffer.Data] {
			v.errorf("decl_buffer %q over undefined data", s.Buffer.Name)
		}
		v.declareBuffer(s.Buffer)
		v.stmt(s.Body)
		delete(v.buffers, s.Buffer)
	case *SeqStmt:
		for _, c := range s.Seq {
			v.stmt(c)
		}
	case *IfThenElse:
		v.cond(s.Cond, "if condition")
		v.stmt(s.Then)
		if s.Else != nil {
			v.stmt(s.Else)
		}
	case *LetStmt:
		v.expr(s.Value)
		if s.Var == nil {
			v.errorf("let with a nil variable")
			return
		}
		if s.Value != nil && s.Value.DType() != s.Var.Type {
			v.errorf("let %q of dtype %s bound to %s of dtype %s", s.Var.Name, s.Var.Type, s.Value, s.Value.DType())
		}
		v.define(s.Var)
		v.stmt(s.Body)
		v.undefine(s.Var)
	case *Evaluate:
		v.expr(s.Value)
	case *AttrStmt:
		if s.Node != nil {
			v.expr(s.Node)
		}
		v.expr(s.Value)
		v.stmt(s.Body)
	case *AssertStmt:
		v.cond(s.Cond, "assert condition")
	default:
		v.errorf("unknown statement %T", s)
	}
}

func (v *verifier) blockRealize(s *BlockRealize) {
	b := s.Block
	if b == nil {
		v.errorf("block realize without a block")
		return
	}
	for _, e := range s.IterValues {
		v.expr(e)
	}
	if s.Predicate != nil {
		v.cond(s.Predicate, "block predicate")
	}
	savedBlock := v.block
	v.block = b.Name
	defer func() { v.block = savedBlock }()
	if len(s.IterValues) != len(b.IterVars) {
		v.errorf("%d iteration variables bound to %d values", len(b.IterVars), len(s.IterValues))
	}
	var reduceVars []*Var
	for i, iv := range b.IterVars {
		if iv.Var == nil {
			v.errorf("nil iteration variable")
			continue
		}
		v.expr(iv.Dom.Min)
		v.expr(iv.Dom.Extent)
		if i < len(s.IterValues) && s.IterValues[i] != nil {
			val := s.IterValues[i]
			if val.DType() != iv.Var.Type {
				v.errorf("iteration variable %q of dtype %s bound to %s of dtype %s", iv.Var.Name, iv.Var.Type, val, val.DType())
			}
			if iv.Kind == IterReduce {
				PostOrderVisit(val, func(n Node) {
					if x, ok := n.(*Var); ok {
						if k, ok := v.kinds[x]; ok && k != ForSerial && k != ForUnrolled && !v.crossThread[x] {
							v.errorf("reduction variable %q bound to %s loop %q", iv.Var.Name, k, x.Name)
						}
					}
				})
			}
		}
		if iv.Kind == IterReduce {
			reduceVars = append(reduceVars, iv.Var)
		}
	}
	for _, iv := range b.IterVars {
		if iv.Var != nil {
			v.define(iv.Var)
		}
	}
	for _, a := range b.AllocBuffers {
		if a == nil {
			v.errorf("nil allocated buffer")
			continue
		}
		v.declareBuffer(a)
	}
	for _, rs := range [][]BufferRegion{b.Reads, b.Writes} {
		for _, r := range rs {
			if !v.useBuffer(r.Buffer) {
				continue
			}
			if len(r.Region) != len(r.Buffer.Shape) {
				v.errorf("region of %q has %d ranges, buffer has %d dimensions", r.Buffer.Name, len(r.Region), len(r.Buffer.Shape))
			}
			for _, rg := range r.Region {
				v.expr(rg.Min)
				v.expr(rg.Extent)
			}
		}
	}
	if b.Init != nil {
		for _, x := range reduceVars {
			v.reduce[x] = true
		}
		v.stmt(b.Init)
		for _, x := range reduceVars {
			delete(v.reduce, x)
		}
		v.checkReductionStores(b, reduceVars)
	}
	if b.Body == nil {
		v.errorf("block without a body")
	} else {
		v.stmt(b.Body)
	}
	for _, a := range b.AllocBuffers {
		if a != nil {
			delete(v.buffers, a)
			if a.Data != nil {
				v.undefine(a.Data)
			}
		}
	}
	for _, iv := range b.IterVars {
		if iv.Var != nil {
			v.undefine(iv.Var)
		}
	}
}

// checkReductionStores reports stores in a reduction block's body whose
// indices depend on a reduction variable: such a block is no reduction.
func (v *verifier) checkReductionStores(b *Block, reduceVars []*Var) {
	if len(reduceVars) == 0 || b.Body == nil {
		return
	}
	isReduce := map[*Var]bool{}
	for _, x := range reduceVars {
		isReduce[x] = true
	}
	Visit(b.Body, func(n Node) bool {
		switch n := n.(type) {
		case *BlockRealize:
			return false
		case *BufferStore:
			for _, ix := range n.Indices {
				PostOrderVisit(ix, func(m Node) {
					if x, ok := m.(*Var); ok && isReduce[x] {
						v.errorf("reduction variable %q indexes the store to %q", x.Name, n.Buffer.Name)
					}
				})
			}
		}
		return true
	})
}
