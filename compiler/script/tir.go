package script

import (
	"fmt"
	"math"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

// tirParser converts the syntax tree of one @T.prim_func into a PrimFunc.
// Errors panic with bail and are recovered by parsePrimFunc.
type tirParser struct {
	file, src string
	scopes    []map[string]any // *ir.Var or *ir.Buffer
	loops     map[*ir.Var]ir.Range
	attrs     map[string]any
	params    []*ir.Var
	bufferMap map[*ir.Var]*ir.Buffer
	retType   ir.DType // the -> annotation; Void for none or -> None
}

// blockBuilder collects the parts of a block while its body is converted.
// The function's top level has one too: the root block.
type blockBuilder struct {
	root     bool
	name     string
	iterVars []ir.IterVar
	values   []ir.Expr
	reads    []ir.BufferRegion
	writes   []ir.BufferRegion
	hasReads bool
	hasWrite bool
	where    ir.Expr
	init     ir.Stmt
	allocs   []*ir.Buffer
	annots   map[string]any
}

func (p *tirParser) failAt(at pos, format string, args ...any) {
	for i, a := range args {
		if e, ok := a.(ir.Expr); ok {
			args[i] = Print(e)
		}
	}
	panic(bail{newError(p.file, p.src, at, fmt.Sprintf(format, args...))})
}

func (p *tirParser) push() { p.scopes = append(p.scopes, map[string]any{}) }
func (p *tirParser) pop()  { p.scopes = p.scopes[:len(p.scopes)-1] }

func (p *tirParser) define(name string, v any) { p.scopes[len(p.scopes)-1][name] = v }

func (p *tirParser) lookup(name string) (any, bool) {
	for i := len(p.scopes) - 1; i >= 0; i-- {
		if v, ok := p.scopes[i][name]; ok {
			return v, true
		}
	}
	return nil, false
}

// parsePrimFunc converts fd; private reports @T.prim_func(private=True).
func parsePrimFunc(file, src string, fd *pyFuncDef, private bool) (f *ir.PrimFunc, err *Error) {
	p := &tirParser{file: file, src: src, loops: map[*ir.Var]ir.Range{}, attrs: map[string]any{}, bufferMap: map[*ir.Var]*ir.Buffer{}}
	defer func() {
		if r := recover(); r != nil {
			b, ok := r.(bail)
			if !ok {
				panic(r)
			}
			f, err = nil, b.err
		}
	}()
	if !private {
		p.attrs[ir.AttrGlobalSymbol] = fd.Name
	}
	p.push()
	for _, prm := range fd.Params {
		p.param(prm)
	}
	if fd.Returns != nil && !isNone(fd.Returns) {
		// "-> None" is how TVM prints a function without a result; a
		// scalar type (-> T.int64) declares the value `return` gives.
		dt, ok := tDType(dotted(fd.Returns))
		if !ok {
			p.failAt(fd.Returns.at(), "unsupported return annotation of T.prim_func %q (want a scalar type such as -> T.int64, or -> None)", fd.Name)
		}
		if dt.Lanes != 1 || !(dt.IsInt() || ir.IsBool(dt) || dt == ir.Float32 || dt == ir.Float64) {
			p.failAt(fd.Returns.at(), "T.prim_func %q returns %s: a function returns a scalar integer, bool, float32 or float64", fd.Name, dt)
		}
		p.retType = dt
	}
	root := &blockBuilder{root: true, name: ir.RootBlockName}
	body := p.stmts(fd.Body, root, true)
	if rb := ir.RootBlock(body); rb != nil && len(root.allocs) == 0 {
		// An explicit `with T.block("root"):` already.
	} else if len(root.allocs) > 0 || containsBlock(body) {
		body = ir.NewRootBlock(body, root.allocs...)
	}
	if body == nil {
		body = &ir.Evaluate{Value: ir.I32(0)}
	}
	f = &ir.PrimFunc{Params: p.params, BufferMap: p.bufferMap, Body: body, RetType: p.retType, Attrs: p.attrs}
	if verr := ir.Verify(f); verr != nil {
		msg := strings.ReplaceAll(verr.Error(), `function "prim_func": `, "")
		if name, ok := p.attrs[ir.AttrGlobalSymbol].(string); ok {
			msg = strings.ReplaceAll(msg, fmt.Sprintf("function %q: ", name), "")
		}
		p.failAt(fd.P, "function %q is ill-formed: %s", fd.Name, msg)
	}
	return f, nil
}

func containsBlock(s ir.Stmt) bool {
	found := false
	ir.Visit(s, func(n ir.Node) bool {
		if _, ok := n.(*ir.BlockRealize); ok {
			found = true
		}
		return !found
	})
	return found
}

func (p *tirParser) param(prm pyParam) {
	if prm.Star != "" {
		p.failAt(prm.P, "variadic parameters are not supported")
	}
	if prm.Default != nil {
		p.failAt(prm.Default.at(), "parameter defaults are not supported")
	}
	if prm.Annotation == nil {
		p.failAt(prm.P, "parameter %q needs a type annotation (T.Buffer(...), T.handle, T.int32…)", prm.Name)
	}
	switch ann := prm.Annotation.(type) {
	case *pyCall:
		if dotted(ann.Fn) == "T.Buffer" {
			v := ir.NewVar(prm.Name, ir.Handle)
			b := p.bufferCall(prm.Name, ann, 0)
			p.params = append(p.params, v)
			p.bufferMap[v] = b
			p.define(prm.Name, b)
			return
		}
	case *pyAttr:
		name := dotted(ann)
		if name == "T.handle" {
			v := ir.NewVar(prm.Name, ir.Handle)
			p.params = append(p.params, v)
			p.define(prm.Name, v)
			return
		}
		if dt, ok := tDType(name); ok {
			v := ir.NewVar(prm.Name, dt)
			p.params = append(p.params, v)
			p.define(prm.Name, v)
			return
		}
	}
	p.failAt(prm.Annotation.at(), "unsupported annotation of parameter %q (want T.Buffer(...), T.handle or a scalar type such as T.int32)", prm.Name)
}

// tDType parses "T.float32" and friends.
func tDType(name string) (ir.DType, bool) {
	s, ok := strings.CutPrefix(name, "T.")
	if !ok || s == "handle" {
		return ir.DType{}, false
	}
	dt, err := ndarray.ParseDType(s)
	if err != nil {
		return ir.DType{}, false
	}
	return dt, true
}

// bufferArgs are the parameters of T.Buffer, T.alloc_buffer,
// T.decl_buffer and (after its first) T.match_buffer, in order.
var bufferArgs = []string{"shape", "dtype", "data", "strides", "elem_offset", "scope", "align", "offset_factor", "buffer_type", "axis_separators"}

// bufferCall builds a buffer from a call; skip is the number of leading
// positional arguments that are not buffer arguments (match_buffer's
// parameter).
func (p *tirParser) bufferCall(name string, c *pyCall, skip int) *ir.Buffer {
	args := map[string]pyExpr{}
	pos := c.Args[min(skip, len(c.Args)):]
	if len(pos) > len(bufferArgs) {
		p.failAt(pos[len(bufferArgs)].at(), "too many arguments to %s", dotted(c.Fn))
	}
	for i, a := range pos {
		args[bufferArgs[i]] = a
	}
	for _, kw := range c.Kwargs {
		if kw.Name == "" {
			p.failAt(kw.P, "**kwargs are not supported")
		}
		known := false
		for _, n := range bufferArgs {
			known = known || n == kw.Name
		}
		if !known {
			p.failAt(kw.P, "unknown argument %q of %s", kw.Name, dotted(c.Fn))
		}
		if _, dup := args[kw.Name]; dup {
			p.failAt(kw.P, "argument %q given twice", kw.Name)
		}
		args[kw.Name] = kw.Value
	}
	shapeE, ok := args["shape"]
	if !ok {
		p.failAt(c.P, "%s needs a shape", dotted(c.Fn))
	}
	b := &ir.Buffer{Name: name, DType: ir.Float32, Shape: p.shape(shapeE), Scope: "global"}
	if d, ok := args["dtype"]; ok {
		b.DType = p.dtype(d)
	}
	if d, ok := args["data"]; ok && !isNone(d) {
		v, ok := p.expr(d).(*ir.Var)
		if !ok || !ir.IsHandle(v.Type) {
			p.failAt(d.at(), "data of buffer %q must be a handle variable such as B.data", name)
		}
		b.Data = v
	} else {
		b.Data = ir.NewVar(name, ir.Handle)
	}
	if s, ok := args["strides"]; ok && !isNone(s) {
		b.Strides = p.shape(s)
		if len(b.Strides) != len(b.Shape) {
			p.failAt(s.at(), "buffer %q has %d strides for %d dimensions", name, len(b.Strides), len(b.Shape))
		}
	}
	if e, ok := args["elem_offset"]; ok && !isNone(e) {
		b.ElemOffset = p.indexExpr(e, "elem_offset")
	}
	if s, ok := args["scope"]; ok {
		b.Scope = p.str(s, "scope")
	}
	for _, ignored := range []string{"align", "offset_factor", "buffer_type", "axis_separators"} {
		if e, ok := args[ignored]; ok {
			switch e := e.(type) {
			case *pyInt, *pyStr, *pyConst:
			case *pyList:
				if len(e.Elts) != 0 {
					p.failAt(e.P, "%s is not supported", ignored)
				}
			default:
				p.failAt(e.at(), "%s must be a constant", ignored)
			}
		}
	}
	return b
}

func isNone(e pyExpr) bool {
	c, ok := e.(*pyConst)
	return ok && c.Value == "None"
}

func (p *tirParser) str(e pyExpr, what string) string {
	s, ok := e.(*pyStr)
	if !ok {
		p.failAt(e.at(), "%s must be a string", what)
	}
	return s.Value
}

func (p *tirParser) dtype(e pyExpr) ir.DType {
	switch e := e.(type) {
	case *pyStr:
		if e.Value == "void" {
			return ir.Void
		}
		dt, err := ndarray.ParseDType(e.Value)
		if err != nil {
			p.failAt(e.P, "unknown dtype %q", e.Value)
		}
		return dt
	case *pyAttr:
		if dt, ok := tDType(dotted(e)); ok {
			return dt
		}
		if dotted(e) == "T.handle" {
			return ir.Handle
		}
	}
	p.failAt(e.at(), "expected a dtype such as \"float32\"")
	return ir.DType{}
}

// shape converts a tuple or list of extents, or one extent.
func (p *tirParser) shape(e pyExpr) []ir.Expr {
	var elts []pyExpr
	switch e := e.(type) {
	case *pyTuple:
		elts = e.Elts
	case *pyList:
		elts = e.Elts
	default:
		elts = []pyExpr{e}
	}
	out := make([]ir.Expr, len(elts))
	for i, x := range elts {
		out[i] = p.indexExpr(x, "extent")
	}
	return out
}

func (p *tirParser) indexExpr(e pyExpr, what string) ir.Expr {
	x := p.expr(e)
	if !ir.IsIndexType(x.DType()) {
		p.failAt(e.at(), "%s %s has dtype %s, want an integer", what, x, x.DType())
	}
	return x
}

// stmts converts a statement list. top reports the function's top level,
// where T.func_attr, T.match_buffer and size variables are allowed.
func (p *tirParser) stmts(list []pyStmt, bb *blockBuilder, top bool) ir.Stmt {
	var out []ir.Stmt
	for i := 0; i < len(list); i++ {
		s := list[i]
		// Statements that wrap the rest of the list.
		switch s := s.(type) {
		case *pyAssign:
			if c, ok := s.Value.(*pyCall); ok && len(s.Targets) == 1 && dotted(c.Fn) == "T.decl_buffer" {
				name := p.targetName(s.Targets[0])
				b := p.bufferCall(name, c, 0)
				_, hasData := callArg(c, "data", 2)
				p.push()
				p.define(name, b)
				rest := p.stmts(list[i+1:], bb, top)
				p.pop()
				if rest == nil {
					rest = &ir.Evaluate{Value: ir.I32(0)}
				}
				if hasData {
					out = append(out, &ir.DeclBuffer{Buffer: b, Body: rest})
				} else {
					out = append(out, &ir.Allocate{Buffer: b, Body: rest})
				}
				return ir.Seq(out...)
			}
			if v, x, ok := p.letBinding(s.Targets, nil, s.Value); ok {
				out = append(out, p.letRest(v, x, list[i+1:], bb, top))
				return ir.Seq(out...)
			}
		case *pyAnnAssign:
			if s.Value != nil {
				if _, ok := s.Target.(*pyName); ok {
					v, x, _ := p.letBinding([]pyExpr{s.Target}, s.Annotation, s.Value)
					out = append(out, p.letRest(v, x, list[i+1:], bb, top))
					return ir.Seq(out...)
				}
			}
		}
		if st := p.stmt(s, bb, top); st != nil {
			out = append(out, st)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return ir.Seq(out...)
}

func (p *tirParser) letRest(v *ir.Var, x ir.Expr, rest []pyStmt, bb *blockBuilder, top bool) ir.Stmt {
	p.push()
	p.define(v.Name, v)
	body := p.stmts(rest, bb, top)
	p.pop()
	if body == nil {
		body = &ir.Evaluate{Value: ir.I32(0)}
	}
	return &ir.LetStmt{Var: v, Value: x, Body: body}
}

// letBinding recognizes `x = expr` and `x: T.int32 = expr` whose value is
// an expression (not a buffer, an axis or a declaration).
func (p *tirParser) letBinding(targets []pyExpr, ann, value pyExpr) (*ir.Var, ir.Expr, bool) {
	if len(targets) != 1 {
		return nil, nil, false
	}
	name, ok := targets[0].(*pyName)
	if !ok {
		return nil, nil, false
	}
	if c, ok := value.(*pyCall); ok {
		fn := dotted(c.Fn)
		switch {
		case strings.HasPrefix(fn, "T.axis."), fn == "T.alloc_buffer", fn == "T.match_buffer", fn == "T.Buffer", fn == "T.decl_buffer", fn == "T.var":
			if ann != nil {
				p.failAt(ann.at(), "unexpected annotation")
			}
			return nil, nil, false
		}
		if _, isType := tDType(fn); isType && len(c.Args) == 0 && len(c.Kwargs) == 0 {
			return nil, nil, false // size variable declaration
		}
	}
	x := p.expr(value)
	t := x.DType()
	if ann != nil {
		t = p.dtype(ann)
		x = p.convertTo(value, x, t)
	}
	return ir.NewVar(name.ID, t), x, true
}

// convertTo casts constants to t and fails on other mismatches.
func (p *tirParser) convertTo(at pyExpr, x ir.Expr, t ir.DType) ir.Expr {
	if x.DType() == t {
		return x
	}
	switch x.(type) {
	case *ir.IntImm, *ir.FloatImm:
		return ir.NewCast(t, x)
	}
	p.failAt(at.at(), "dtype mismatch: %s has dtype %s, want %s", x, x.DType(), t)
	return nil
}

func (p *tirParser) targetName(e pyExpr) string {
	n, ok := e.(*pyName)
	if !ok {
		p.failAt(e.at(), "expected a name on the left of '='")
	}
	return n.ID
}

// callArg finds argument name (or positional index i) of c.
func callArg(c *pyCall, name string, i int) (pyExpr, bool) {
	for _, kw := range c.Kwargs {
		if kw.Name == name {
			return kw.Value, !isNone(kw.Value)
		}
	}
	if i >= 0 && i < len(c.Args) {
		return c.Args[i], !isNone(c.Args[i])
	}
	return nil, false
}

func (p *tirParser) stmt(s pyStmt, bb *blockBuilder, top bool) ir.Stmt {
	switch s := s.(type) {
	case *pyPass:
		return nil
	case *pyExprStmt:
		return p.exprStmt(s, bb, top)
	case *pyAssign:
		return p.assign(s, bb, top)
	case *pyAnnAssign:
		p.failAt(s.P, "an annotated assignment needs a name and a value")
	case *pyAugAssign:
		sub, ok := s.Target.(*pySubscript)
		if !ok {
			p.failAt(s.P, "augmented assignment needs a buffer element on the left")
		}
		op := map[string]string{"+": "+", "-": "-", "*": "*", "/": "/", "//": "//", "%": "%"}[s.Op]
		if op == "" {
			p.failAt(s.P, "unsupported augmented assignment %q", s.Op+"=")
		}
		return p.store(sub, &pyBinOp{P: s.P, Op: op, L: sub, R: s.Value})
	case *pyFor:
		if s.Else != nil {
			p.failAt(s.P, "for-else is not supported")
		}
		return p.forStmt(s, bb)
	case *pyWith:
		return p.with(s, bb)
	case *pyIf:
		cond := p.cond(s.Cond, "if condition")
		p.push()
		then := p.stmts(s.Body, bb, false)
		p.pop()
		if then == nil {
			then = &ir.Evaluate{Value: ir.I32(0)}
		}
		var els ir.Stmt
		if s.Else != nil {
			p.push()
			els = p.stmts(s.Else, bb, false)
			p.pop()
		}
		return &ir.IfThenElse{Cond: cond, Then: then, Else: els}
	case *pyAssert:
		cond := p.cond(s.Cond, "assert condition")
		msg := ""
		if s.Msg != nil {
			msg = p.str(s.Msg, "assert message")
		}
		return &ir.AssertStmt{Cond: cond, Message: msg}
	case *pyReturn:
		return p.ret(s)
	case *pyWhile:
		p.failAt(s.P, "while loops are not supported")
	case *pyFuncDef:
		p.failAt(s.P, "nested functions are not supported")
	case *pyClassDef:
		p.failAt(s.P, "classes are not supported inside a T.prim_func")
	case *pyImport:
		p.failAt(s.P, "imports are not supported inside a T.prim_func")
	}
	p.failAt(s.at(), "unsupported statement")
	return nil
}

// ret converts `return value` (TVM's T.ret): a constant takes the declared
// result type, any other value must have it already.
func (p *tirParser) ret(s *pyReturn) ir.Stmt {
	if ir.IsVoid(p.retType) {
		p.failAt(s.P, "return in a T.prim_func without a result type: declare one (def f(...) -> T.int64:)")
	}
	if s.X == nil {
		p.failAt(s.P, "return needs a value of the declared result type %s", p.retType)
	}
	x := p.expr(s.X)
	if x.DType() != p.retType {
		switch x.(type) {
		case *ir.IntImm, *ir.FloatImm:
			if x.DType().Lanes == 1 {
				x = ir.NewCast(p.retType, x)
			}
		}
	}
	if x.DType() != p.retType {
		p.failAt(s.X.at(), "return %s has dtype %s, the function returns %s", x, x.DType(), p.retType)
	}
	return ir.Ret(x)
}

func (p *tirParser) cond(e pyExpr, what string) ir.Expr {
	x := p.expr(e)
	if !ir.IsBool(x.DType()) {
		p.failAt(e.at(), "%s %s has dtype %s, want bool", what, x, x.DType())
	}
	return x
}

func (p *tirParser) exprStmt(s *pyExprStmt, bb *blockBuilder, top bool) ir.Stmt {
	if _, ok := s.X.(*pyStr); ok {
		return nil // docstring
	}
	c, ok := s.X.(*pyCall)
	if !ok {
		p.failAt(s.P, "expression statement has no effect")
	}
	fn := dotted(c.Fn)
	switch fn {
	case "T.func_attr":
		if !top {
			p.failAt(c.P, "T.func_attr must be at the top level of the function")
		}
		p.nargs(c, 1, 1)
		d, ok := c.Args[0].(*pyDict)
		if !ok {
			p.failAt(c.Args[0].at(), "T.func_attr takes a dict")
		}
		for k, v := range p.attrDict(d) {
			p.attrs[k] = v
		}
		return nil
	case "T.reads", "T.writes":
		if bb.root {
			p.failAt(c.P, "%s outside a block", fn)
		}
		var regions []ir.BufferRegion
		args := c.Args
		if len(args) == 1 {
			if l, ok := args[0].(*pyList); ok {
				args = l.Elts
			} else if t, ok := args[0].(*pyTuple); ok && t.Paren {
				args = t.Elts
			}
		}
		for _, a := range args {
			regions = append(regions, p.region(a))
		}
		if fn == "T.reads" {
			bb.reads, bb.hasReads = append(bb.reads, regions...), true
		} else {
			bb.writes, bb.hasWrite = append(bb.writes, regions...), true
		}
		return nil
	case "T.where":
		if bb.root {
			p.failAt(c.P, "T.where outside a block")
		}
		p.nargs(c, 1, 1)
		bb.where = p.cond(c.Args[0], "block predicate")
		return nil
	case "T.block_attr":
		if bb.root {
			p.failAt(c.P, "T.block_attr outside a block")
		}
		p.nargs(c, 1, 1)
		d, ok := c.Args[0].(*pyDict)
		if !ok {
			p.failAt(c.Args[0].at(), "T.block_attr takes a dict")
		}
		if bb.annots == nil {
			bb.annots = map[string]any{}
		}
		for k, v := range p.attrDict(d) {
			bb.annots[k] = v
		}
		return nil
	case "T.evaluate":
		p.nargs(c, 1, 1)
		return &ir.Evaluate{Value: p.expr(c.Args[0])}
	}
	return &ir.Evaluate{Value: p.expr(c)}
}

func (p *tirParser) nargs(c *pyCall, lo, hi int) {
	if len(c.Kwargs) > 0 {
		p.failAt(c.Kwargs[0].P, "%s takes no keyword arguments", dotted(c.Fn))
	}
	if len(c.Args) < lo || len(c.Args) > hi {
		want := fmt.Sprint(lo)
		if hi != lo {
			want = fmt.Sprintf("%d to %d", lo, hi)
		}
		p.failAt(c.P, "%s takes %s arguments, got %d", dotted(c.Fn), want, len(c.Args))
	}
	for _, a := range c.Args {
		if st, ok := a.(*pyStarred); ok {
			p.failAt(st.P, "*args are not supported")
		}
	}
}

func (p *tirParser) attrDict(d *pyDict) map[string]any {
	out := map[string]any{}
	for i, k := range d.Keys {
		ks, ok := k.(*pyStr)
		if !ok {
			p.failAt(k.at(), "attribute keys must be strings")
		}
		out[ks.Value] = p.attrValue(d.Values[i])
	}
	return out
}

func (p *tirParser) attrValue(e pyExpr) any {
	switch e := e.(type) {
	case *pyInt:
		return e.Value
	case *pyFloat:
		return e.Value
	case *pyStr:
		return e.Value
	case *pyConst:
		switch e.Value {
		case "True":
			return true
		case "False":
			return false
		case "None":
			return nil
		}
	case *pyUnary:
		if e.Op == "-" {
			switch x := e.X.(type) {
			case *pyInt:
				return -x.Value
			case *pyFloat:
				return -x.Value
			}
		}
	case *pyList:
		out := []any{}
		for _, x := range e.Elts {
			out = append(out, p.attrValue(x))
		}
		return out
	case *pyTuple:
		out := []any{}
		for _, x := range e.Elts {
			out = append(out, p.attrValue(x))
		}
		return out
	case *pyDict:
		return p.attrDict(e)
	case *pyCall:
		if dotted(e.Fn) == "T.bool" && len(e.Args) == 1 {
			if c, ok := e.Args[0].(*pyConst); ok && (c.Value == "True" || c.Value == "False") {
				return c.Value == "True"
			}
		}
		if dt, ok := tDType(dotted(e.Fn)); ok && dt.IsInt() && len(e.Args) == 1 {
			if x, ok := p.expr(e).(*ir.IntImm); ok {
				return x.Value
			}
		}
	}
	return p.expr(e)
}

func (p *tirParser) assign(s *pyAssign, bb *blockBuilder, top bool) ir.Stmt {
	if len(s.Targets) != 1 {
		p.failAt(s.P, "chained assignment is not supported")
	}
	target := s.Targets[0]
	if sub, ok := target.(*pySubscript); ok {
		return p.store(sub, s.Value)
	}
	c, ok := s.Value.(*pyCall)
	if !ok {
		p.failAt(s.P, "unsupported assignment")
	}
	fn := dotted(c.Fn)
	switch {
	case fn == "T.axis.remap":
		p.remap(s, c, bb)
		return nil
	case strings.HasPrefix(fn, "T.axis."):
		p.axis(s, c, bb)
		return nil
	case fn == "T.alloc_buffer":
		name := p.targetName(target)
		b := p.bufferCall(name, c, 0)
		bb.allocs = append(bb.allocs, b)
		p.define(name, b)
		return nil
	case fn == "T.Buffer":
		name := p.targetName(target)
		b := p.bufferCall(name, c, 0)
		if _, ok := callArg(c, "data", 2); !ok {
			p.failAt(c.P, "a T.Buffer declared in the body needs data=… (use T.alloc_buffer or T.decl_buffer to allocate)")
		}
		p.define(name, b)
		return nil
	case fn == "T.match_buffer":
		if !top {
			p.failAt(c.P, "T.match_buffer must be at the top level of the function")
		}
		name := p.targetName(target)
		if len(c.Args) == 0 {
			p.failAt(c.P, "T.match_buffer needs a parameter")
		}
		pn, ok := c.Args[0].(*pyName)
		var param *ir.Var
		if ok {
			v, _ := p.lookup(pn.ID)
			param, _ = v.(*ir.Var)
		}
		if param == nil || !ir.IsHandle(param.Type) || !p.isParam(param) {
			p.failAt(c.Args[0].at(), "T.match_buffer needs a T.handle parameter")
		}
		if p.bufferMap[param] != nil {
			p.failAt(c.Args[0].at(), "parameter %q is already matched to a buffer", param.Name)
		}
		b := p.bufferCall(name, c, 1)
		p.bufferMap[param] = b
		p.define(name, b)
		return nil
	case fn == "T.var":
		name := p.targetName(target)
		p.nargs(c, 1, 1)
		p.define(name, ir.NewVar(name, p.dtype(c.Args[0])))
		return nil
	}
	if dt, ok := tDType(fn); ok && len(c.Args) == 0 && len(c.Kwargs) == 0 {
		name := p.targetName(target)
		p.define(name, ir.NewVar(name, dt))
		return nil
	}
	p.failAt(s.P, "unsupported assignment")
	return nil
}

func (p *tirParser) isParam(v *ir.Var) bool {
	for _, q := range p.params {
		if q == v {
			return true
		}
	}
	return false
}

func (p *tirParser) buffer(e pyExpr) *ir.Buffer {
	n, ok := e.(*pyName)
	if !ok {
		p.failAt(e.at(), "expected a buffer")
	}
	v, ok := p.lookup(n.ID)
	if !ok {
		p.failAt(n.P, "undefined name %q", n.ID)
	}
	b, ok := v.(*ir.Buffer)
	if !ok {
		p.failAt(n.P, "%q is not a buffer", n.ID)
	}
	return b
}

func (p *tirParser) indices(sub *pySubscript, b *ir.Buffer) []ir.Expr {
	if len(sub.Index) == 1 && !sub.Trailing {
		if t, ok := sub.Index[0].(*pyTuple); ok && len(t.Elts) == 0 {
			if len(b.Shape) != 0 {
				p.failAt(sub.P, "buffer %q has %d dimensions, indexed with 0", b.Name, len(b.Shape))
			}
			return nil
		}
	}
	ix := make([]ir.Expr, len(sub.Index))
	for i, e := range sub.Index {
		if _, ok := e.(*pySlice); ok {
			p.failAt(e.at(), "slices are only allowed in T.reads and T.writes")
		}
		x := p.expr(e)
		if !x.DType().IsInt() {
			p.failAt(e.at(), "index %s of buffer %q has dtype %s, want an integer", x, b.Name, x.DType())
		}
		ix[i] = x
	}
	if len(ix) != len(b.Shape) {
		p.failAt(sub.P, "buffer %q has %d dimensions, indexed with %d", b.Name, len(b.Shape), len(ix))
	}
	return ix
}

func (p *tirParser) store(sub *pySubscript, value pyExpr) ir.Stmt {
	b := p.buffer(sub.X)
	ix := p.indices(sub, b)
	x := p.expr(value)
	want := b.DType
	for _, i := range ix {
		if l := i.DType().Lanes; l > 1 {
			want = want.WithLanes(int(l) * int(want.Lanes))
		}
	}
	if x.DType().Lanes == 1 && want.Lanes > 1 {
		if c, ok := x.(*ir.IntImm); ok {
			x = ir.NewBroadcast(ir.NewCast(want.Scalar(), c), int(want.Lanes))
		} else if c, ok := x.(*ir.FloatImm); ok {
			x = ir.NewBroadcast(ir.NewCast(want.Scalar(), c), int(want.Lanes))
		}
	}
	x = p.convertTo(value, x, want)
	return &ir.BufferStore{Buffer: b, Value: x, Indices: ix}
}

// region converts A[i, j], A[lo:hi, j] or A (the whole buffer).
func (p *tirParser) region(e pyExpr) ir.BufferRegion {
	if n, ok := e.(*pyName); ok {
		return p.buffer(n).FullRegion()
	}
	sub, ok := e.(*pySubscript)
	if !ok {
		p.failAt(e.at(), "expected a buffer region such as A[i, 0:4]")
	}
	b := p.buffer(sub.X)
	if len(sub.Index) == 1 && len(b.Shape) == 0 {
		if t, ok := sub.Index[0].(*pyTuple); ok && len(t.Elts) == 0 {
			return ir.BufferRegion{Buffer: b}
		}
	}
	if len(sub.Index) != len(b.Shape) {
		p.failAt(sub.P, "buffer %q has %d dimensions, region has %d", b.Name, len(b.Shape), len(sub.Index))
	}
	r := make([]ir.Range, len(sub.Index))
	for i, x := range sub.Index {
		if sl, ok := x.(*pySlice); ok {
			if sl.Step != nil {
				p.failAt(sl.Step.at(), "slice steps are not supported")
			}
			var lo, hi ir.Expr
			if sl.Lower != nil {
				lo = p.indexExpr(sl.Lower, "slice bound")
			} else {
				lo = ir.NewIntImm(b.Shape[i].DType(), 0)
			}
			if sl.Upper != nil {
				hi = p.indexExpr(sl.Upper, "slice bound")
			} else {
				hi = b.Shape[i]
			}
			r[i] = ir.Range{Min: lo, Extent: extentOf(lo, hi)}
			continue
		}
		ix := p.indexExpr(x, "index")
		r[i] = ir.Range{Min: ix, Extent: ir.NewIntImm(ix.DType(), 1)}
	}
	return ir.BufferRegion{Buffer: b, Region: r}
}

// extentOf returns hi - lo, simplified for the forms the printer writes
// (lo + e, constants), so that printing and parsing are stable.
func extentOf(lo, hi ir.Expr) ir.Expr {
	if c, ok := lo.(*ir.IntImm); ok && c.Value == 0 && lo.DType() == hi.DType() {
		return hi
	}
	if b, ok := hi.(*ir.Binary); ok && b.Op == ir.OpAdd && ir.Equal(b.A, lo) {
		return b.B
	}
	cl, okl := lo.(*ir.IntImm)
	ch, okh := hi.(*ir.IntImm)
	if okl && okh {
		lo, hi = ir.Promote(lo, hi)
		return ir.NewIntImm(hi.DType(), ch.Value-cl.Value)
	}
	return ir.Sub(hi, lo)
}

func (p *tirParser) forStmt(s *pyFor, bb *blockBuilder) ir.Stmt {
	c, ok := s.Iter.(*pyCall)
	if !ok {
		p.failAt(s.Iter.at(), "a loop must iterate over range(…), T.grid(…), T.serial(…), T.parallel(…), T.vectorized(…), T.unroll(…) or T.thread_binding(…)")
	}
	fn := dotted(c.Fn)
	var names []*pyName
	switch t := s.Target.(type) {
	case *pyName:
		names = []*pyName{t}
	case *pyTuple:
		for _, e := range t.Elts {
			n, ok := e.(*pyName)
			if !ok {
				p.failAt(e.at(), "loop variables must be names")
			}
			names = append(names, n)
		}
	default:
		p.failAt(s.Target.at(), "loop variables must be names")
	}
	type loop struct {
		min, extent ir.Expr
		kind        ir.ForKind
		tag         string
		annots      map[string]any
	}
	var loops []loop
	if fn == "T.grid" {
		p.nargs(c, 1, 64)
		if len(names) != len(c.Args) {
			p.failAt(s.Target.at(), "T.grid has %d extents for %d loop variables", len(c.Args), len(names))
		}
		for _, a := range c.Args {
			ext := p.indexExpr(a, "loop extent")
			loops = append(loops, loop{min: ir.NewIntImm(ext.DType(), 0), extent: ext})
		}
	} else {
		kind, ok := map[string]ir.ForKind{"range": ir.ForSerial, "T.serial": ir.ForSerial, "T.parallel": ir.ForParallel,
			"T.vectorized": ir.ForVectorized, "T.unroll": ir.ForUnrolled, "T.thread_binding": ir.ForThreadBinding}[fn]
		if !ok {
			p.failAt(c.P, "unsupported loop iterator %q", fn)
		}
		if len(names) != 1 {
			p.failAt(s.Target.at(), "%s defines one loop variable, got %d", fn, len(names))
		}
		l := loop{kind: kind}
		args := c.Args
		for _, kw := range c.Kwargs {
			switch {
			case kw.Name == "annotations" && fn != "range":
				d, ok := kw.Value.(*pyDict)
				if !ok {
					p.failAt(kw.P, "annotations must be a dict")
				}
				l.annots = p.attrDict(d)
			case kw.Name == "thread" && kind == ir.ForThreadBinding:
				l.tag = p.str(kw.Value, "thread")
			default:
				p.failAt(kw.P, "unknown argument %q of %s", kw.Name, fn)
			}
		}
		if kind == ir.ForThreadBinding && l.tag == "" && len(args) > 0 {
			if st, ok := args[len(args)-1].(*pyStr); ok {
				l.tag = st.Value
				args = args[:len(args)-1]
			}
		}
		if kind == ir.ForThreadBinding && l.tag == "" {
			p.failAt(c.P, "T.thread_binding needs thread=\"…\"")
		}
		switch len(args) {
		case 1:
			l.extent = p.indexExpr(args[0], "loop extent")
			l.min = ir.NewIntImm(l.extent.DType(), 0)
		case 2:
			lo, hi := p.indexExpr(args[0], "loop start"), p.indexExpr(args[1], "loop end")
			lo, hi = ir.Promote(lo, hi)
			l.min, l.extent = lo, extentOf(lo, hi)
		default:
			if len(args) == 3 && fn == "range" {
				p.failAt(args[2].at(), "range steps are not supported")
			}
			p.failAt(c.P, "%s takes an extent or a start and an end", fn)
		}
		for _, a := range args {
			if st, ok := a.(*pyStarred); ok {
				p.failAt(st.P, "*args are not supported")
			}
		}
		loops = append(loops, l)
	}
	p.push()
	vars := make([]*ir.Var, len(loops))
	for i, l := range loops {
		vars[i] = ir.NewVar(names[i].ID, l.extent.DType())
		p.loops[vars[i]] = ir.Range{Min: l.min, Extent: l.extent}
		p.define(names[i].ID, vars[i])
	}
	body := p.stmts(s.Body, bb, false)
	p.pop()
	if body == nil {
		body = &ir.Evaluate{Value: ir.I32(0)}
	}
	for i := len(loops) - 1; i >= 0; i-- {
		l := loops[i]
		body = &ir.For{Var: vars[i], Min: l.min, Extent: l.extent, Kind: l.kind, ThreadTag: l.tag, Annotations: l.annots, Body: body}
	}
	return body
}

func (p *tirParser) with(s *pyWith, bb *blockBuilder) ir.Stmt {
	c, ok := s.Item.(*pyCall)
	if !ok {
		p.failAt(s.Item.at(), "unsupported with statement")
	}
	fn := dotted(c.Fn)
	if s.As != nil && fn != "T.decl_buffer" && fn != "T.LetStmt" {
		p.failAt(s.As.at(), "'as' is not supported here")
	}
	switch fn {
	case "T.decl_buffer", "T.LetStmt":
		if s.As == nil {
			p.failAt(c.P, "with %s needs 'as NAME'", fn)
		}
		name := p.targetName(s.As)
		var bind any
		var mk func(body ir.Stmt) ir.Stmt
		if fn == "T.decl_buffer" {
			b := p.bufferCall(name, c, 0)
			_, hasData := callArg(c, "data", 2)
			bind = b
			mk = func(body ir.Stmt) ir.Stmt {
				if hasData {
					return &ir.DeclBuffer{Buffer: b, Body: body}
				}
				return &ir.Allocate{Buffer: b, Body: body}
			}
		} else {
			p.nargs(c, 1, 2)
			x := p.expr(c.Args[0])
			t := x.DType()
			if len(c.Args) == 2 {
				t = p.dtype(c.Args[1])
				x = p.convertTo(c.Args[0], x, t)
			}
			v := ir.NewVar(name, t)
			bind = v
			mk = func(body ir.Stmt) ir.Stmt { return &ir.LetStmt{Var: v, Value: x, Body: body} }
		}
		p.push()
		p.define(name, bind)
		body := p.stmts(s.Body, bb, false)
		p.pop()
		if body == nil {
			body = &ir.Evaluate{Value: ir.I32(0)}
		}
		return mk(body)
	case "T.block":
		return p.block(s, c, bb)
	case "T.init":
		p.nargs(c, 0, 0)
		if bb.root {
			p.failAt(c.P, "T.init outside a block")
		}
		if bb.init != nil {
			p.failAt(c.P, "block %q has two T.init", bb.name)
		}
		p.push()
		init := p.stmts(s.Body, bb, false)
		p.pop()
		if init == nil {
			init = &ir.Evaluate{Value: ir.I32(0)}
		}
		bb.init = init
		return nil
	case "T.attr":
		p.nargs(c, 3, 3)
		var node ir.Expr
		if !isNone(c.Args[0]) {
			node = p.expr(c.Args[0])
		}
		key := p.str(c.Args[1], "attribute key")
		value := p.expr(c.Args[2])
		p.push()
		body := p.stmts(s.Body, bb, false)
		p.pop()
		if body == nil {
			body = &ir.Evaluate{Value: ir.I32(0)}
		}
		return &ir.AttrStmt{Node: node, Key: key, Value: value, Body: body}
	default:
		p.failAt(c.P, "unsupported with statement %q", fn)
	}
	return nil
}

func (p *tirParser) block(s *pyWith, c *pyCall, outer *blockBuilder) ir.Stmt {
	name := ""
	if len(c.Args) > 1 {
		p.failAt(c.P, "T.block takes one name")
	}
	if len(c.Args) == 1 {
		name = p.str(c.Args[0], "block name")
	}
	for _, kw := range c.Kwargs {
		if kw.Name == "no_realize" {
			continue
		}
		p.failAt(kw.P, "unknown argument %q of T.block", kw.Name)
	}
	bb := &blockBuilder{name: name}
	p.push()
	body := p.stmts(s.Body, bb, false)
	p.pop()
	if body == nil {
		body = &ir.Evaluate{Value: ir.I32(0)}
	}
	blk := &ir.Block{Name: name, IterVars: bb.iterVars, Init: bb.init, Body: body, AllocBuffers: bb.allocs, Annotations: bb.annots}
	blk.Reads, blk.Writes = bb.reads, bb.writes
	if !bb.hasReads || !bb.hasWrite {
		reads, writes := inferRegions(blk)
		if !bb.hasReads {
			blk.Reads = reads
		}
		if !bb.hasWrite {
			blk.Writes = writes
		}
	}
	pred := bb.where
	if pred == nil {
		pred = ir.BoolImm(true)
	}
	return &ir.BlockRealize{IterValues: bb.values, Predicate: pred, Block: blk}
}

// axis handles v = T.axis.spatial(dom, value), T.axis.reduce, T.axis.S,
// T.axis.R and T.axis.opaque.
func (p *tirParser) axis(s *pyAssign, c *pyCall, bb *blockBuilder) {
	fn := dotted(c.Fn)
	kind, ok := map[string]ir.IterKind{"T.axis.spatial": ir.IterSpatial, "T.axis.S": ir.IterSpatial,
		"T.axis.reduce": ir.IterReduce, "T.axis.R": ir.IterReduce, "T.axis.opaque": ir.IterOpaque}[fn]
	if !ok {
		p.failAt(c.P, "unknown axis kind %q", fn)
	}
	if bb.root {
		p.failAt(c.P, "%s outside a block", fn)
	}
	name := p.targetName(s.Targets[0])
	var domE, valE pyExpr
	for _, kw := range c.Kwargs {
		switch kw.Name {
		case "dom":
			domE = kw.Value
		case "binding":
			valE = kw.Value
		case "dtype":
		default:
			p.failAt(kw.P, "unknown argument %q of %s", kw.Name, fn)
		}
	}
	if len(c.Args) > 0 && domE == nil {
		domE = c.Args[0]
	}
	if len(c.Args) > 1 && valE == nil {
		valE = c.Args[1]
	}
	if domE == nil || valE == nil || len(c.Args) > 2 {
		p.failAt(c.P, "%s takes a domain and a value", fn)
	}
	val := p.indexExpr(valE, "binding")
	var dom ir.Range
	if t, ok := domE.(*pyTuple); ok {
		if len(t.Elts) != 2 {
			p.failAt(t.P, "an axis domain is an extent or a (start, end) pair")
		}
		lo := p.convertTo(t.Elts[0], p.indexExpr(t.Elts[0], "domain start"), val.DType())
		hi := p.convertTo(t.Elts[1], p.indexExpr(t.Elts[1], "domain end"), val.DType())
		dom = ir.Range{Min: lo, Extent: extentOf(lo, hi)}
	} else {
		ext := p.convertTo(domE, p.indexExpr(domE, "domain"), val.DType())
		dom = ir.Range{Min: ir.NewIntImm(val.DType(), 0), Extent: ext}
	}
	v := ir.NewVar(name, val.DType())
	bb.iterVars = append(bb.iterVars, ir.IterVar{Var: v, Dom: dom, Kind: kind})
	bb.values = append(bb.values, val)
	p.define(name, v)
}

// remap handles v_i, v_j = T.axis.remap("SS", [i, j]).
func (p *tirParser) remap(s *pyAssign, c *pyCall, bb *blockBuilder) {
	if bb.root {
		p.failAt(c.P, "T.axis.remap outside a block")
	}
	p.nargs(c, 2, 2)
	kinds := p.str(c.Args[0], "T.axis.remap kinds")
	l, ok := c.Args[1].(*pyList)
	if !ok {
		if t, ok2 := c.Args[1].(*pyTuple); ok2 {
			l = &pyList{P: t.P, Elts: t.Elts}
		} else {
			p.failAt(c.Args[1].at(), "T.axis.remap takes a list of loop variables")
		}
	}
	var targets []pyExpr
	switch t := s.Targets[0].(type) {
	case *pyTuple:
		targets = t.Elts
	default:
		targets = []pyExpr{t}
	}
	if len(kinds) != len(l.Elts) || len(targets) != len(l.Elts) {
		p.failAt(c.P, "T.axis.remap has %d kinds, %d loop variables and %d targets", len(kinds), len(l.Elts), len(targets))
	}
	for i, e := range l.Elts {
		var kind ir.IterKind
		switch kinds[i] {
		case 'S':
			kind = ir.IterSpatial
		case 'R':
			kind = ir.IterReduce
		case 'O':
			kind = ir.IterOpaque
		default:
			p.failAt(c.Args[0].at(), "T.axis.remap kind %q is not S, R or O", kinds[i])
		}
		x := p.expr(e)
		lv, ok := x.(*ir.Var)
		rng, isLoop := p.loops[lv]
		if !ok || !isLoop {
			p.failAt(e.at(), "T.axis.remap needs loop variables, %s is not one", x)
		}
		name := p.targetName(targets[i])
		v := ir.NewVar(name, lv.Type)
		bb.iterVars = append(bb.iterVars, ir.IterVar{Var: v, Dom: rng, Kind: kind})
		bb.values = append(bb.values, lv)
		p.define(name, v)
	}
}

// inferRegions computes the regions a block without T.reads/T.writes
// accesses: one point region per buffer accessed at a single index tuple,
// the whole buffer otherwise. Buffers the block allocates are left out; in
// a reduction the written buffers are not counted as read.
func inferRegions(b *ir.Block) (reads, writes []ir.BufferRegion) {
	type acc struct {
		buf     *ir.Buffer
		indices [][]ir.Expr
	}
	collect := func(list *[]*acc, buf *ir.Buffer, ix []ir.Expr) {
		for _, a := range *list {
			if a.buf == buf {
				for _, prev := range a.indices {
					if ir.Equal(&ir.BufferLoad{Buffer: buf, Indices: prev}, &ir.BufferLoad{Buffer: buf, Indices: ix}) {
						return
					}
				}
				a.indices = append(a.indices, ix)
				return
			}
		}
		*list = append(*list, &acc{buf: buf, indices: [][]ir.Expr{ix}})
	}
	local := map[*ir.Buffer]bool{}
	for _, a := range b.AllocBuffers {
		local[a] = true
	}
	var rs, ws []*acc
	var walk func(n ir.Node) bool
	walk = func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.BlockRealize:
			for _, r := range n.Block.Reads {
				collect(&rs, r.Buffer, nil)
			}
			for _, w := range n.Block.Writes {
				collect(&ws, w.Buffer, nil)
			}
			return false
		case *ir.BufferLoad:
			if !local[n.Buffer] {
				collect(&rs, n.Buffer, n.Indices)
			}
		case *ir.BufferStore:
			if !local[n.Buffer] {
				collect(&ws, n.Buffer, n.Indices)
			}
		}
		return true
	}
	ir.Visit(b.Body, walk)
	if b.Init != nil {
		ir.Visit(b.Init, walk)
	}
	toRegions := func(list []*acc, skip map[*ir.Buffer]bool) []ir.BufferRegion {
		out := []ir.BufferRegion{}
		for _, a := range list {
			if skip[a.buf] {
				continue
			}
			if len(a.indices) == 1 && a.indices[0] != nil && scalarIndices(a.indices[0]) {
				out = append(out, ir.PointRegion(a.buf, a.indices[0]...))
			} else {
				out = append(out, a.buf.FullRegion())
			}
		}
		return out
	}
	skip := map[*ir.Buffer]bool{}
	if b.Init != nil {
		for _, w := range ws {
			skip[w.buf] = true
		}
	}
	return toRegions(rs, skip), toRegions(ws, nil)
}

func scalarIndices(ix []ir.Expr) bool {
	for _, e := range ix {
		if e.DType().Lanes != 1 {
			return false
		}
	}
	return true
}

// expr converts an expression.
func (p *tirParser) expr(e pyExpr) ir.Expr {
	switch e := e.(type) {
	case *pyName:
		v, ok := p.lookup(e.ID)
		if !ok {
			p.failAt(e.P, "undefined name %q", e.ID)
		}
		switch v := v.(type) {
		case *ir.Var:
			return v
		case *ir.Buffer:
			p.failAt(e.P, "buffer %q used as a value (index it: %s[…])", e.ID, e.ID)
		}
	case *pyInt:
		if e.Value >= math.MinInt32 && e.Value <= math.MaxInt32 {
			return ir.I32(e.Value)
		}
		return ir.I64(e.Value)
	case *pyFloat:
		return ir.F32(e.Value)
	case *pyStr:
		return ir.Str(e.Value)
	case *pyConst:
		switch e.Value {
		case "True":
			return ir.BoolImm(true)
		case "False":
			return ir.BoolImm(false)
		}
		p.failAt(e.P, "%s is not an expression", e.Value)
	case *pyBinOp:
		return p.binOp(e)
	case *pyUnary:
		x := p.expr(e.X)
		switch e.Op {
		case "+":
			return x
		case "-":
			switch c := x.(type) {
			case *ir.IntImm:
				if !ir.IsBool(c.Type) {
					return &ir.IntImm{Type: c.Type, Value: -c.Value}
				}
			case *ir.FloatImm:
				return &ir.FloatImm{Type: c.Type, Value: -c.Value}
			}
			p.numeric(e.X, x, "-")
			return ir.Sub(ir.Const(x.DType(), 0), x)
		case "not":
			return ir.LogicalNot(x)
		}
		p.failAt(e.P, "operator %q is not supported", e.Op)
	case *pyBoolOp:
		l, r := p.expr(e.L), p.expr(e.R)
		if e.Op == "and" {
			return ir.And(l, r)
		}
		return ir.Or(l, r)
	case *pyCompare:
		var out ir.Expr
		prev := p.expr(e.Xs[0])
		for i, op := range e.Ops {
			next := p.expr(e.Xs[i+1])
			bop, ok := map[string]ir.BinaryOp{"==": ir.OpEQ, "!=": ir.OpNE, "<": ir.OpLT, "<=": ir.OpLE, ">": ir.OpGT, ">=": ir.OpGE}[op]
			if !ok {
				p.failAt(e.P, "operator %q is not supported", op)
			}
			p.numeric(e.Xs[i], prev, op)
			p.numeric(e.Xs[i+1], next, op)
			c := ir.Arith(bop, prev, next)
			if out == nil {
				out = c
			} else {
				out = ir.And(out, c)
			}
			prev = next
		}
		return out
	case *pySubscript:
		if a, ok := e.X.(*pyAttr); ok {
			p.failAt(a.P, "unsupported subscript of %s", dotted(a))
		}
		b := p.buffer(e.X)
		return &ir.BufferLoad{Buffer: b, Indices: p.indices(e, b)}
	case *pyAttr:
		if n, ok := e.X.(*pyName); ok {
			if v, ok := p.lookup(n.ID); ok {
				if b, ok := v.(*ir.Buffer); ok && e.Name == "data" {
					return b.Data
				}
			}
		}
		p.failAt(e.P, "unsupported attribute %q", dotted(e))
	case *pyCall:
		return p.call(e)
	case *pyIfExp:
		p.failAt(e.P, "conditional expressions are not supported (use T.Select or T.if_then_else)")
	case *pySlice:
		p.failAt(e.P, "slices are only allowed in T.reads and T.writes")
	case *pyTuple, *pyList, *pyDict:
		p.failAt(e.at(), "a tuple, list or dict is not an expression here")
	case *pyStarred:
		p.failAt(e.P, "*args are not supported")
	}
	p.failAt(e.at(), "unsupported expression")
	return nil
}

// numeric rejects strings and handles as operands of arithmetic.
func (p *tirParser) numeric(at pyExpr, x ir.Expr, op string) {
	if t := x.DType(); ir.IsHandle(t) || ir.IsVoid(t) {
		p.failAt(at.at(), "operand %s of %q has dtype %s", x, op, t)
	}
}

func (p *tirParser) binOp(e *pyBinOp) ir.Expr {
	l, r := p.expr(e.L), p.expr(e.R)
	p.numeric(e.L, l, e.Op)
	p.numeric(e.R, r, e.Op)
	if l.DType().Lanes != r.DType().Lanes && l.DType().Lanes != 1 && r.DType().Lanes != 1 {
		p.failAt(e.P, "operands of %q have %d and %d lanes", e.Op, l.DType().Lanes, r.DType().Lanes)
	}
	switch e.Op {
	case "+":
		return ir.Add(l, r)
	case "-":
		return ir.Sub(l, r)
	case "*":
		return ir.Mul(l, r)
	case "/":
		return ir.Div(l, r)
	case "//":
		return ir.FloorDiv(l, r)
	case "%":
		return ir.FloorMod(l, r)
	case "**":
		return p.intrin(e, "pow", []ir.Expr{l, r}, []pyExpr{e.L, e.R})
	}
	p.failAt(e.P, "operator %q is not supported", e.Op)
	return nil
}

func (p *tirParser) intrin(at pyExpr, op string, args []ir.Expr, src []pyExpr) ir.Expr {
	in := ir.Intrinsics[op]
	if len(args) != in.Arity {
		p.failAt(at.at(), "T.%s takes %d arguments, got %d", op, in.Arity, len(args))
	}
	for i, a := range args {
		p.numeric(src[i], a, op)
	}
	if len(args) == 2 {
		args[0], args[1] = ir.Promote(args[0], args[1])
	}
	if in.FloatOnly && !args[0].DType().IsFloat() {
		p.failAt(at.at(), "T.%s of %s, want a float", op, args[0].DType())
	}
	return ir.CallIntrin(op, args...)
}

func (p *tirParser) call(c *pyCall) ir.Expr {
	fn := dotted(c.Fn)
	if dt, ok := tDType(fn); ok {
		return p.typedConst(c, dt)
	}
	op, isT := strings.CutPrefix(fn, "T.")
	if !isT {
		p.failAt(c.P, "unknown function %q", fn)
	}
	if _, ok := ir.Intrinsics[op]; ok {
		p.nargs(c, 0, 8)
		args := make([]ir.Expr, len(c.Args))
		for i, a := range c.Args {
			args[i] = p.expr(a)
		}
		return p.intrin(c, op, args, c.Args)
	}
	args := func(lo, hi int) []ir.Expr {
		p.nargs(c, lo, hi)
		out := make([]ir.Expr, len(c.Args))
		for i, a := range c.Args {
			out[i] = p.expr(a)
		}
		return out
	}
	switch op {
	case "max", "min", "floordiv", "floormod", "truncdiv", "truncmod":
		a := args(2, 2)
		p.numeric(c.Args[0], a[0], op)
		p.numeric(c.Args[1], a[1], op)
		bop := map[string]ir.BinaryOp{"max": ir.OpMax, "min": ir.OpMin, "floordiv": ir.OpFloorDiv,
			"floormod": ir.OpFloorMod, "truncdiv": ir.OpDiv, "truncmod": ir.OpMod}[op]
		return ir.Arith(bop, a[0], a[1])
	case "min_value", "max_value":
		p.nargs(c, 1, 1)
		dt := p.dtype(c.Args[0])
		v, err := limitValue(dt, op == "max_value")
		if err != nil {
			p.failAt(c.P, "T.%s: %v", op, err)
		}
		return v
	case "Cast", "cast":
		p.nargs(c, 2, 2)
		dtArg, valArg := c.Args[0], c.Args[1]
		if op == "cast" {
			dtArg, valArg = valArg, dtArg
		}
		dt := p.dtype(dtArg)
		x := p.expr(valArg)
		if x.DType().Lanes != dt.Lanes {
			p.failAt(c.P, "cast from %s to %s changes the lane count", x.DType(), dt)
		}
		if x.DType() == dt {
			return x
		}
		return &ir.Cast{Type: dt, Value: x}
	case "Select":
		a := args(3, 3)
		if !ir.IsBool(a[0].DType()) {
			p.failAt(c.Args[0].at(), "select condition %s has dtype %s, want bool", a[0], a[0].DType())
		}
		return ir.NewSelect(a[0], a[1], a[2])
	case "if_then_else":
		a := args(3, 3)
		if !ir.IsBool(a[0].DType()) {
			p.failAt(c.Args[0].at(), "condition %s has dtype %s, want bool", a[0], a[0].DType())
		}
		return ir.NewIfThenElse(a[0], a[1], a[2])
	case "tvm_warp_shuffle_down":
		a := args(5, 5)
		for i, x := range a {
			if i != 1 && (!x.DType().IsInt() || x.DType().Lanes != 1) {
				p.failAt(c.Args[i].at(), "T.tvm_warp_shuffle_down(mask, value, delta, width, warp_size): argument %d is %s, want a scalar integer", i+1, x.DType())
			}
		}
		if a[1].DType().Lanes != 1 {
			p.failAt(c.Args[1].at(), "T.tvm_warp_shuffle_down shuffles a scalar, not %s", a[1].DType())
		}
		return &ir.Call{Type: a[1].DType(), Op: ir.OpWarpShuffleDown, Args: a}
	case "ptx_mma":
		// T.ptx_mma("float32", shape, A_layout, B_layout, A_dtype, B_dtype,
		// C_dtype, a.data, a_index, b.data, b_index, c.data, c_index,
		// saturate), as TVM prints it.
		p.nargs(c, 14, 14)
		if dt := p.dtype(c.Args[0]); dt != ir.Float32 {
			p.failAt(c.Args[0].at(), "T.ptx_mma accumulates in float32, not %s", dt)
		}
		want := []string{"shape", "m16n8k16", "row", "col", "", "", "fp32"}
		a := make([]ir.Expr, 13)
		for i := 1; i <= 6; i++ {
			v := p.str(c.Args[i], "T.ptx_mma argument")
			if w := want[i]; (w != "" && v != w) || (w == "" && v != "fp16" && v != "bf16") {
				p.failAt(c.Args[i].at(), "T.ptx_mma: only m16n8k16, row, col, fp16 or bf16 operands and fp32 accumulators are supported, not %q", v)
			}
			a[i-1] = ir.Str(v)
		}
		if a[3].(*ir.StringImm).Value != a[4].(*ir.StringImm).Value {
			p.failAt(c.Args[5].at(), "T.ptx_mma: A and B have one dtype")
		}
		for i := 7; i < 14; i++ {
			a[i-1] = p.expr(c.Args[i])
			if i == 7 || i == 9 || i == 11 {
				if l, ok := a[i-1].(*ir.BufferLoad); ok {
					n := map[int]int{7: 8, 9: 4, 11: 4}[i]
					if _, ok := ir.PtxMmaFragment(l, n); !ok {
						p.failAt(c.Args[i].at(), "T.ptx_mma: argument %d loads %s, want the %d elements of a fragment (last index T.Ramp(first, 1, %d))", i+1, l, n, n)
					}
				} else if a[i-1].DType() != ir.Handle {
					p.failAt(c.Args[i].at(), "T.ptx_mma: argument %d is %s, want a buffer's data or a load of a fragment", i+1, a[i-1].DType())
				}
			}
		}
		return &ir.Call{Type: ir.Void, Op: ir.OpPtxMma, Args: a}
	case "call_extern", "call_pure_extern", "call_intrin":
		p.nargs(c, 2, 64)
		dt := p.dtype(c.Args[0])
		name := p.str(c.Args[1], "function name")
		rest := make([]ir.Expr, 0, len(c.Args)-2)
		for _, a := range c.Args[2:] {
			rest = append(rest, p.expr(a))
		}
		if op == "call_intrin" {
			if name == ir.OpCallExtern {
				p.failAt(c.Args[1].at(), "use T.call_extern")
			}
			return &ir.Call{Type: dt, Op: name, Args: rest}
		}
		return ir.NewCallExtern(dt, name, rest...)
	case "Ramp":
		a := args(3, 3)
		lanes := p.lanes(c.Args[2], a[2])
		if !ir.IsIndexType(a[0].DType()) {
			p.failAt(c.Args[0].at(), "Ramp base must be a scalar integer")
		}
		return ir.NewRamp(a[0], a[1], lanes)
	case "Broadcast":
		a := args(2, 2)
		if a[0].DType().Lanes != 1 {
			p.failAt(c.Args[0].at(), "Broadcast of a vector")
		}
		return ir.NewBroadcast(a[0], p.lanes(c.Args[1], a[1]))
	case "Let":
		p.nargs(c, 3, 3)
		n, ok := c.Args[0].(*pyName)
		if !ok {
			p.failAt(c.Args[0].at(), "T.Let binds a name: T.Let(x, value, body)")
		}
		val := p.expr(c.Args[1])
		v := ir.NewVar(n.ID, val.DType())
		p.push()
		p.define(n.ID, v)
		body := p.expr(c.Args[2])
		p.pop()
		return ir.NewLet(v, val, body)
	case "likely":
		return args(1, 1)[0]
	}
	p.failAt(c.P, "unknown function %q", fn)
	return nil
}

func (p *tirParser) lanes(at pyExpr, x ir.Expr) int {
	c, ok := x.(*ir.IntImm)
	if !ok || c.Value < 1 || c.Value > 65535 {
		p.failAt(at.at(), "lanes must be a constant from 1 to 65535")
	}
	return int(c.Value)
}

// typedConst handles T.float32(0.0), T.int64(1), T.bool(True), T.int32(x)
// (a cast) and T.float32("inf").
func (p *tirParser) typedConst(c *pyCall, dt ir.DType) ir.Expr {
	if len(c.Args) == 0 && len(c.Kwargs) == 0 {
		p.failAt(c.P, "T.%s() declares a variable: assign it to a name at the top of the function", dt)
	}
	p.nargs(c, 1, 1)
	a := c.Args[0]
	neg := false
	if u, ok := a.(*pyUnary); ok && u.Op == "-" {
		switch u.X.(type) {
		case *pyInt, *pyFloat:
			neg, a = true, u.X
		}
	}
	sign := func(f float64) float64 {
		if neg {
			return -f
		}
		return f
	}
	switch v := a.(type) {
	case *pyInt:
		switch {
		case dt.IsFloat():
			return ir.NewFloatImm(dt, sign(float64(v.Value)))
		case ir.IsBool(dt):
			return ir.BoolImm(v.Value != 0)
		case dt.IsInt():
			x := v.Value
			if neg {
				x = -x
			}
			if !fitsInt(dt, x) {
				p.failAt(v.P, "%d does not fit in %s", x, dt)
			}
			return ir.NewIntImm(dt, x)
		}
	case *pyFloat:
		if dt.IsFloat() {
			return ir.NewFloatImm(dt, sign(v.Value))
		}
		p.failAt(v.P, "T.%s of a float literal", dt)
	case *pyConst:
		if v.Value == "True" || v.Value == "False" {
			if ir.IsBool(dt) || dt.IsInt() {
				b := int64(0)
				if v.Value == "True" {
					b = 1
				}
				return ir.NewIntImm(dt, b)
			}
		}
	case *pyStr:
		if dt.IsFloat() {
			switch v.Value {
			case "inf":
				return ir.NewFloatImm(dt, math.Inf(1))
			case "-inf":
				return ir.NewFloatImm(dt, math.Inf(-1))
			case "nan":
				return ir.NewFloatImm(dt, math.NaN())
			}
		}
		p.failAt(v.P, "T.%s of a string", dt)
	}
	x := p.expr(c.Args[0])
	if x.DType().Lanes != dt.Lanes && x.DType().Lanes != 1 {
		p.failAt(c.P, "cast from %s to %s changes the lane count", x.DType(), dt)
	}
	p.numeric(c.Args[0], x, "T."+dt.String())
	return ir.NewCast(dt, x)
}

func fitsInt(dt ir.DType, v int64) bool {
	if dt.Bits >= 64 {
		return dt.Code == ndarray.Int || v >= 0
	}
	if dt.Code == ndarray.UInt {
		return v >= 0 && v < int64(1)<<dt.Bits
	}
	lim := int64(1) << (dt.Bits - 1)
	return v >= -lim && v < lim
}

// limitValue is T.min_value / T.max_value: the lowest or highest finite
// value of dt, as TVM defines them.
func limitValue(dt ir.DType, max bool) (ir.Expr, error) {
	sign := -1.0
	if max {
		sign = 1
	}
	switch {
	case dt.IsFloat():
		var m float64
		switch {
		case dt.Code == ndarray.BFloat && dt.Bits == 16:
			m = 3.3895313892515355e38
		case dt.Bits == 16:
			m = 65504
		case dt.Bits == 32:
			m = math.MaxFloat32
		case dt.Bits == 64:
			m = math.MaxFloat64
		default:
			return nil, fmt.Errorf("no limits known for %s", dt)
		}
		return ir.NewFloatImm(dt, sign*m), nil
	case ir.IsBool(dt):
		if max {
			return ir.NewIntImm(dt, 1), nil
		}
		return ir.NewIntImm(dt, 0), nil
	case dt.Code == ndarray.Int && dt.Bits <= 64:
		if max {
			return ir.NewIntImm(dt, int64(uint64(1)<<(dt.Bits-1)-1)), nil
		}
		return ir.NewIntImm(dt, -int64(uint64(1)<<(dt.Bits-1))), nil
	case dt.Code == ndarray.UInt && dt.Bits < 64:
		if max {
			return ir.NewIntImm(dt, int64(uint64(1)<<dt.Bits-1)), nil
		}
		return ir.NewIntImm(dt, 0), nil
	case dt.Code == ndarray.UInt && dt.Bits == 64 && !max:
		return ir.NewIntImm(dt, 0), nil
	}
	return nil, fmt.Errorf("%s has no limit that kiln's integer constants can hold", dt)
}
