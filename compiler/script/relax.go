package script

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/ndarray"
)

// relaxParser converts the syntax tree of one @R.function into an
// *ir.Function. Errors panic with bail and are recovered by
// parseRelaxFunc. Symbolic dimensions live in the embedded tirParser's
// scopes (so prim expressions like n * 2 resolve); graph variables live
// in vars.
type relaxParser struct {
	tp     *tirParser
	vars   []map[string]*ir.RVar
	module *moduleInfo
	// alias is the name bound to the module (cls = Module).
	alias string
	attrs map[string]any
}

// moduleInfo is what a graph function sees of its module while the module
// is parsed: the class name and every function's kind and signature.
type moduleInfo struct {
	class string
	funcs map[string]calleeInfo
}

type calleeInfo struct {
	prim *ir.PrimFunc
	// ret is a graph function's declared result, with symbolic dimensions
	// erased; nil when it declares none.
	ret   ir.StructInfo
	relax bool
	pure  bool
}

func (p *relaxParser) failAt(at pos, format string, args ...any) {
	p.tp.failAt(at, format, args...)
}

func (p *relaxParser) push() { p.vars = append(p.vars, map[string]*ir.RVar{}) }
func (p *relaxParser) pop()  { p.vars = p.vars[:len(p.vars)-1] }

func (p *relaxParser) lookupVar(name string) (*ir.RVar, bool) {
	for i := len(p.vars) - 1; i >= 0; i-- {
		if v, ok := p.vars[i][name]; ok {
			return v, true
		}
	}
	return nil, false
}

func (p *relaxParser) defineVar(name string, v *ir.RVar) { p.vars[len(p.vars)-1][name] = v }

// relaxFlags reads pure= and private= from @R.function(...).
func (fp *fileParser) relaxFlags(d pyExpr) (pure, private bool, err error) {
	pure = true
	c, ok := d.(*pyCall)
	if !ok {
		return pure, false, nil
	}
	if len(c.Args) != 0 {
		return false, false, fp.errorf(c.Args[0].at(), "R.function takes only keyword arguments")
	}
	for _, kw := range c.Kwargs {
		b, ok := kw.Value.(*pyConst)
		if !ok || (b.Value != "True" && b.Value != "False") {
			return false, false, fp.errorf(kw.P, "%s=…: want True or False", kw.Name)
		}
		switch kw.Name {
		case "pure":
			pure = b.Value == "True"
		case "private":
			private = b.Value == "True"
		case "check_well_formed":
		default:
			return false, false, fp.errorf(kw.P, "unknown argument %q of R.function", kw.Name)
		}
	}
	return pure, private, nil
}

// relaxSignature parses only the declared result of fd, for callers
// elsewhere in the module; symbolic dimensions become unknown.
func relaxSignature(file, src string, fd *pyFuncDef) (ret ir.StructInfo) {
	if fd.Returns == nil {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(bail); !ok {
				panic(r)
			}
			ret = nil // reported when the function itself is parsed
		}
	}()
	p := newRelaxParser(file, src, &moduleInfo{funcs: map[string]calleeInfo{}})
	p.prescanSymbolic(fd.Body)
	return eraseSymbolic(p.sinfo(fd.Returns, true))
}

// eraseSymbolic replaces dimensions that are not constants by unknowns.
func eraseSymbolic(s ir.StructInfo) ir.StructInfo {
	switch s := s.(type) {
	case *ir.TensorStructInfo:
		if s.Shape != nil {
			if _, ok := s.KnownShape(); !ok {
				return ir.TensorNDim(s.DType, s.NDim)
			}
		}
	case *ir.ShapeStructInfo:
		for _, v := range s.Values {
			if _, ok := ir.ConstDim(v); !ok {
				return &ir.ShapeStructInfo{NDim: s.NDim}
			}
		}
	case *ir.PrimStructInfo:
		if s.Value != nil {
			if _, ok := ir.ConstDim(s.Value); !ok {
				return &ir.PrimStructInfo{DType: s.DType}
			}
		}
	case *ir.TupleStructInfo:
		fs := make([]ir.StructInfo, len(s.Fields))
		for i, f := range s.Fields {
			fs[i] = eraseSymbolic(f)
		}
		return ir.Tuple(fs...)
	case *ir.FuncStructInfo:
		return &ir.FuncStructInfo{Pure: s.Pure}
	}
	return s
}

func newRelaxParser(file, src string, mod *moduleInfo) *relaxParser {
	tp := &tirParser{file: file, src: src, loops: map[*ir.Var]ir.Range{}, attrs: map[string]any{}, bufferMap: map[*ir.Var]*ir.Buffer{}}
	tp.push()
	p := &relaxParser{tp: tp, module: mod, attrs: map[string]any{}}
	p.push()
	return p
}

// parseRelaxFunc converts fd.
func parseRelaxFunc(file, src string, fd *pyFuncDef, pure, private bool, mod *moduleInfo) (f *ir.Function, err *Error) {
	p := newRelaxParser(file, src, mod)
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
	p.prescanSymbolic(fd.Body)
	var params []*ir.RVar
	for _, prm := range fd.Params {
		switch {
		case prm.Star != "":
			p.failAt(prm.P, "variadic parameters are not supported")
		case prm.Default != nil:
			p.failAt(prm.Default.at(), "parameter defaults are not supported")
		case prm.Annotation == nil:
			p.failAt(prm.P, "parameter %q needs a struct info annotation (R.Tensor(...), R.Shape…)", prm.Name)
		}
		if _, dup := p.lookupVar(prm.Name); dup {
			p.failAt(prm.P, "parameter %q defined twice", prm.Name)
		}
		v := ir.NewRVar(prm.Name, p.sinfo(prm.Annotation, true))
		p.defineVar(prm.Name, v)
		params = append(params, v)
	}
	var ret ir.StructInfo
	if fd.Returns != nil {
		ret = p.sinfo(fd.Returns, false)
	}
	body := p.body(fd.Body, fd.P, true)
	if ret == nil {
		ret = ir.StructInfoOf(body)
	} else if msg := ir.Conflict(ret, ir.StructInfoOf(body)); msg != "" {
		p.failAt(fd.Returns.at(), "function %q returns %s, declared %s", fd.Name, ir.StructInfoOf(body), ret)
	}
	return &ir.Function{Params: params, Body: body, Ret: ret, Pure: pure, Attrs: p.attrs}, nil
}

// prescanSymbolic defines the symbolic variables that the function body
// declares at its top level (n = T.int64()), so parameters may use them.
func (p *relaxParser) prescanSymbolic(body []pyStmt) {
	for _, s := range body {
		a, ok := s.(*pyAssign)
		if !ok || len(a.Targets) != 1 {
			continue
		}
		n, ok := a.Targets[0].(*pyName)
		if !ok {
			continue
		}
		if dt, ok := symbolicDecl(a.Value); ok {
			if _, defined := p.tp.lookup(n.ID); !defined {
				p.tp.define(n.ID, ir.NewVar(n.ID, dt))
			}
		}
	}
}

// symbolicDecl recognizes T.int64() and T.int32().
func symbolicDecl(e pyExpr) (ir.DType, bool) {
	c, ok := e.(*pyCall)
	if !ok || len(c.Args) != 0 || len(c.Kwargs) != 0 {
		return ir.Void, false
	}
	switch dotted(c.Fn) {
	case "T.int64":
		return ir.Int64, true
	case "T.int32":
		return ir.Int32, true
	}
	return ir.Void, false
}

// body converts a function body or an if branch: statements that bind,
// then return (top) or a final assignment (branches, handled by ifBinding).
func (p *relaxParser) body(stmts []pyStmt, at pos, top bool) *ir.SeqExpr {
	var blocks []*ir.BindingBlock
	var cur *ir.BindingBlock
	flush := func() {
		if cur != nil && len(cur.Bindings) > 0 {
			blocks = append(blocks, cur)
		}
		cur = nil
	}
	add := func(b ir.Binding) {
		if cur == nil {
			cur = &ir.BindingBlock{}
		}
		cur.Bindings = append(cur.Bindings, b)
	}
	for i, s := range stmts {
		last := i == len(stmts)-1
		switch s := s.(type) {
		case *pyReturn:
			if !last {
				p.failAt(stmts[i+1].at(), "statement after return")
			}
			if !top {
				p.failAt(s.P, "return inside an if branch is not supported (assign the branch's value instead)")
			}
			if s.X == nil {
				p.failAt(s.P, "a graph function returns a value")
			}
			flush()
			return &ir.SeqExpr{Blocks: blocks, Body: p.rexpr(s.X)}
		case *pyPass:
		case *pyExprStmt:
			if _, ok := s.X.(*pyStr); ok {
				continue // docstring
			}
			if c, ok := s.X.(*pyCall); ok {
				switch dotted(c.Fn) {
				case "R.func_attr":
					if !top {
						p.failAt(s.P, "R.func_attr belongs at the top of the function")
					}
					p.funcAttr(c)
					continue
				case "R.output":
					p.failAt(s.P, "R.output outside a dataflow block")
				}
			}
			add(p.binding(s.P, "_", nil, s.X, false))
		case *pyWith:
			c, ok := s.Item.(*pyCall)
			if !ok || dotted(c.Fn) != "R.dataflow" || s.As != nil {
				p.failAt(s.P, "unsupported with statement (want with R.dataflow():)")
			}
			if len(c.Args)+len(c.Kwargs) != 0 {
				p.failAt(c.P, "R.dataflow takes no arguments")
			}
			flush()
			blocks = append(blocks, p.dataflow(s))
		case *pyAssign:
			if len(s.Targets) != 1 {
				p.failAt(s.P, "chained assignment is not supported")
			}
			if n, ok := s.Targets[0].(*pyName); ok {
				if dt, ok := symbolicDecl(s.Value); ok {
					p.symbolic(s.P, n.ID, dt)
					continue
				}
				if v, ok := s.Value.(*pyName); ok && v.ID == p.module.class && p.module.class != "" {
					p.alias = n.ID
					continue
				}
			}
			if !top && last {
				return p.branchEnd(blocks, cur, s.Targets[0], nil, s.Value)
			}
			name := p.targetName(s.Targets[0])
			add(p.binding(s.P, name, nil, s.Value, false))
		case *pyAnnAssign:
			if s.Value == nil {
				p.failAt(s.P, "annotation without a value")
			}
			if !top && last {
				return p.branchEnd(blocks, cur, s.Target, s.Annotation, s.Value)
			}
			add(p.binding(s.P, p.targetName(s.Target), s.Annotation, s.Value, false))
		case *pyIf:
			if !top && last {
				p.failAt(s.P, "an if branch must end with an assignment")
			}
			add(p.ifBinding(s))
		default:
			p.failAt(s.at(), "unsupported statement in a graph function")
		}
	}
	if top {
		p.failAt(at, "graph function without a return statement")
	}
	p.failAt(at, "an if branch must end with an assignment")
	return nil
}

// branchEnd closes an if branch whose last statement assigns target.
func (p *relaxParser) branchEnd(blocks []*ir.BindingBlock, cur *ir.BindingBlock, target, ann, value pyExpr) *ir.SeqExpr {
	if cur != nil && len(cur.Bindings) > 0 {
		blocks = append(blocks, cur)
	}
	name := p.targetName(target)
	body := p.rexpr(value)
	seq := &ir.SeqExpr{Blocks: blocks, Body: body}
	p.vars[len(p.vars)-1]["\x00target"] = &ir.RVar{Name: name}
	if ann != nil {
		p.vars[len(p.vars)-1]["\x00ann"] = ir.NewRVar(name, p.sinfo(ann, false))
	}
	return seq
}

func (p *relaxParser) symbolic(at pos, name string, dt ir.DType) {
	if v, ok := p.tp.lookup(name); ok {
		if x, ok := v.(*ir.Var); ok && x.Type == dt {
			return // declared by the prescan or a parameter
		}
		p.failAt(at, "symbolic variable %q defined twice", name)
	}
	p.tp.define(name, ir.NewVar(name, dt))
}

func (p *relaxParser) targetName(e pyExpr) string {
	n, ok := e.(*pyName)
	if !ok {
		p.failAt(e.at(), "assignment target must be a name")
	}
	return n.ID
}

func (p *relaxParser) funcAttr(c *pyCall) {
	if len(c.Args) != 1 || len(c.Kwargs) != 0 {
		p.failAt(c.P, "R.func_attr takes one dict")
	}
	d, ok := c.Args[0].(*pyDict)
	if !ok {
		p.failAt(c.Args[0].at(), "R.func_attr takes one dict")
	}
	for k, v := range p.tp.attrDict(d) {
		p.attrs[k] = v
	}
}

// dataflow converts a with R.dataflow(): block; R.output names the
// variables visible after it.
func (p *relaxParser) dataflow(s *pyWith) *ir.BindingBlock {
	b := &ir.BindingBlock{Dataflow: true}
	bound := map[string]*ir.RVar{}
	var outputs []*pyCall
	for i, st := range s.Body {
		if es, ok := st.(*pyExprStmt); ok {
			if _, ok := es.X.(*pyStr); ok {
				continue
			}
			if c, ok := es.X.(*pyCall); ok && dotted(c.Fn) == "R.output" {
				if i != len(s.Body)-1 {
					p.failAt(s.Body[i+1].at(), "statement after R.output")
				}
				outputs = append(outputs, c)
				continue
			}
		}
		var bd ir.Binding
		switch st := st.(type) {
		case *pyAssign:
			if len(st.Targets) != 1 {
				p.failAt(st.P, "chained assignment is not supported")
			}
			bd = p.binding(st.P, p.targetName(st.Targets[0]), nil, st.Value, true)
		case *pyAnnAssign:
			if st.Value == nil {
				p.failAt(st.P, "annotation without a value")
			}
			bd = p.binding(st.P, p.targetName(st.Target), st.Annotation, st.Value, true)
		case *pyExprStmt:
			bd = p.binding(st.P, "_", nil, st.X, true)
		case *pyPass:
			continue
		default:
			p.failAt(st.at(), "unsupported statement in a dataflow block (want bindings and R.output)")
		}
		b.Bindings = append(b.Bindings, bd)
		bound[bd.BoundVar().Name] = bd.BoundVar()
	}
	for _, c := range outputs {
		if len(c.Kwargs) != 0 {
			p.failAt(c.P, "R.output takes variables")
		}
		for _, a := range c.Args {
			n, ok := a.(*pyName)
			if !ok {
				p.failAt(a.at(), "R.output takes variables bound in the dataflow block")
			}
			v, ok := bound[n.ID]
			if !ok {
				p.failAt(a.at(), "R.output of %q, which the dataflow block does not bind", n.ID)
			}
			v.Dataflow = false
		}
	}
	// Dataflow variables end with their block.
	for name, v := range bound {
		if cur, _ := p.lookupVar(name); cur == v && v.Dataflow {
			delete(p.vars[len(p.vars)-1], name)
			p.vars[len(p.vars)-1]["\x00df:"+name] = v
		}
	}
	return b
}

// binding converts one assignment; ann may be nil.
func (p *relaxParser) binding(at pos, name string, ann, value pyExpr, dataflow bool) ir.Binding {
	if c, ok := value.(*pyCall); ok && dotted(c.Fn) == "R.match_cast" {
		if len(c.Args) != 2 || len(c.Kwargs) != 0 {
			p.failAt(c.P, "R.match_cast takes a value and a struct info")
		}
		val := p.rexpr(c.Args[0])
		info := p.sinfo(c.Args[1], true)
		if msg := ir.Conflict(info, ir.StructInfoOf(val)); msg != "" {
			p.failAt(c.P, "binding %q: match_cast of %s to %s can never succeed", name, ir.StructInfoOf(val), info)
		}
		v := &ir.RVar{Name: name, Info: info, Dataflow: dataflow}
		p.defineVar(name, v)
		return &ir.MatchCast{Var: v, Value: val, Info: info}
	}
	val := p.rexprIn(value, name)
	info := ir.StructInfoOf(val)
	if ann != nil {
		want := p.sinfo(ann, false)
		if ir.Conflict(want, info) != "" {
			p.failAt(ann.at(), "binding %q: annotated %s, but the value is %s", name, want, info)
		}
		info = want
	}
	v := &ir.RVar{Name: name, Info: info, Dataflow: dataflow}
	p.defineVar(name, v)
	return &ir.VarBinding{Var: v, Value: val}
}

// ifBinding converts if/else whose branches end by assigning one name.
func (p *relaxParser) ifBinding(s *pyIf) ir.Binding {
	cond := p.rexpr(s.Cond)
	if s.Else == nil {
		p.failAt(s.P, "an if in a graph function needs an else branch")
	}
	branch := func(stmts []pyStmt) (*ir.SeqExpr, string, *ir.RVar) {
		p.push()
		defer p.pop()
		seq := p.body(stmts, s.P, false)
		target := p.vars[len(p.vars)-1]["\x00target"]
		return seq, target.Name, p.vars[len(p.vars)-1]["\x00ann"]
	}
	then, tname, tann := branch(s.Body)
	els, ename, eann := branch(s.Else)
	if tname != ename {
		p.failAt(s.P, "the branches of an if assign %q and %q; they must assign the same name", tname, ename)
	}
	e := ir.NewIf(cond, then, els)
	info := e.Info
	for _, ann := range []*ir.RVar{tann, eann} {
		if ann != nil {
			if ir.Conflict(ann.Info, info) != "" {
				p.failAt(s.P, "binding %q: annotated %s, but the if computes %s", tname, ann.Info, info)
			}
			info = ann.Info
		}
	}
	v := &ir.RVar{Name: tname, Info: info}
	p.defineVar(tname, v)
	return &ir.VarBinding{Var: v, Value: e}
}

// rexpr converts a graph-level expression.
func (p *relaxParser) rexpr(e pyExpr) ir.RExpr { return p.rexprIn(e, "") }

// rexprIn converts e; binding names the variable being bound, for errors.
func (p *relaxParser) rexprIn(e pyExpr, binding string) ir.RExpr {
	switch e := e.(type) {
	case *pyName:
		if v, ok := p.lookupVar(e.ID); ok {
			return v
		}
		if v, ok := p.lookupVar("\x00df:" + e.ID); ok {
			p.failAt(e.P, "dataflow variable %q used outside its dataflow block (list it in R.output)", v.Name)
		}
		if _, ok := p.tp.lookup(e.ID); ok {
			p.failAt(e.P, "symbolic variable %q used as a value (wrap it in R.prim_value)", e.ID)
		}
		p.failAt(e.P, "undefined name %q", e.ID)
	case *pyAttr:
		if gv := p.global(e); gv != nil {
			return gv
		}
		p.failAt(e.P, "unsupported expression %s", dotted(e))
	case *pyTuple:
		fs := make([]ir.RExpr, len(e.Elts))
		for i, x := range e.Elts {
			fs[i] = p.rexpr(x)
		}
		return &ir.RTuple{Fields: fs}
	case *pySubscript:
		x := p.rexpr(e.X)
		if len(e.Index) != 1 || e.Trailing {
			p.failAt(e.P, "index a tuple with one integer")
		}
		n, ok := e.Index[0].(*pyInt)
		if !ok {
			p.failAt(e.Index[0].at(), "index a tuple with an integer literal")
		}
		t, isTuple := ir.StructInfoOf(x).(*ir.TupleStructInfo)
		if !isTuple {
			p.failAt(e.P, "indexing %s, which is not a tuple", ir.StructInfoOf(x))
		}
		if n.Value < 0 || n.Value >= int64(len(t.Fields)) {
			p.failAt(e.Index[0].at(), "index %d of a tuple of %d fields", n.Value, len(t.Fields))
		}
		return &ir.TupleGetItem{Tuple: x, Index: int(n.Value)}
	case *pyStr:
		return &ir.RString{Value: e.Value}
	case *pyCall:
		return p.call(e, binding)
	case *pyInt, *pyFloat, *pyConst:
		p.failAt(e.at(), "a literal is not a graph value here (use R.const or R.prim_value)")
	}
	p.failAt(e.at(), "unsupported expression in a graph function")
	return nil
}

// global resolves cls.fn (or Module.fn) to a GlobalVar.
func (p *relaxParser) global(e *pyAttr) *ir.GlobalVar {
	base, ok := e.X.(*pyName)
	if !ok || (base.ID != p.alias || p.alias == "") && (base.ID != p.module.class || p.module.class == "") {
		return nil
	}
	if _, ok := p.module.funcs[e.Name]; !ok {
		p.failAt(e.P, "the module has no function %q", e.Name)
	}
	return &ir.GlobalVar{Name: e.Name}
}

func (p *relaxParser) call(c *pyCall, binding string) ir.RExpr {
	fn := dotted(c.Fn)
	switch fn {
	case "R.call_tir":
		return p.callTIR(c)
	case "R.call_packed":
		return p.callPacked(c)
	case "R.const":
		return p.constant(c)
	case "R.shape":
		p.onlyArgs(c, 1)
		return &ir.ShapeExpr{Values: p.dimList(c.Args[0], false)}
	case "R.prim_value":
		p.onlyArgs(c, 1)
		return &ir.PrimValue{Value: p.primArg(c.Args[0])}
	case "R.str":
		p.onlyArgs(c, 1)
		return &ir.RString{Value: p.tp.str(c.Args[0], "R.str")}
	case "R.dtype":
		p.onlyArgs(c, 1)
		return &ir.DataTypeImm{DType: p.tp.dtype(c.Args[0])}
	case "R.ExternFunc":
		p.onlyArgs(c, 1)
		return &ir.ExternFunc{Name: p.tp.str(c.Args[0], "R.ExternFunc")}
	case "R.tuple":
		return &ir.RTuple{Fields: p.posArgs(c)}
	case "R.match_cast":
		p.failAt(c.P, "R.match_cast must be bound directly to a variable")
	}
	if a, ok := c.Fn.(*pyAttr); ok {
		if gv := p.global(a); gv != nil {
			return p.callGlobal(c, gv, binding)
		}
	}
	if n, ok := c.Fn.(*pyName); ok {
		if v, ok := p.lookupVar(n.ID); ok {
			args := p.posArgs(c)
			call := &ir.RCall{Op: v, Args: args}
			info, err := ir.InferCall(call, nil)
			if err != nil {
				p.failAt(c.P, "%s", p.bindingMsg(binding, err))
			}
			call.Info = info
			return call
		}
	}
	if strings.HasPrefix(fn, "R.") {
		def, ok := op.ByScriptName(fn)
		if !ok {
			p.failAt(c.Fn.at(), "unknown operator %q", fn)
		}
		return p.opCall(c, def, binding)
	}
	if fn == "" {
		p.failAt(c.P, "unsupported call")
	}
	p.failAt(c.Fn.at(), "unknown function %q", fn)
	return nil
}

func (p *relaxParser) bindingMsg(binding string, err error) string {
	if binding == "" || binding == "_" {
		return err.Error()
	}
	return fmt.Sprintf("binding %q: %v", binding, err)
}

func (p *relaxParser) onlyArgs(c *pyCall, n int) {
	if len(c.Args) != n || len(c.Kwargs) != 0 {
		p.failAt(c.P, "%s takes %d argument(s)", dotted(c.Fn), n)
	}
}

func (p *relaxParser) posArgs(c *pyCall) []ir.RExpr {
	if len(c.Kwargs) != 0 {
		p.failAt(c.Kwargs[0].P, "keyword arguments are not supported here")
	}
	args := make([]ir.RExpr, len(c.Args))
	for i, a := range c.Args {
		args[i] = p.rexpr(a)
	}
	return args
}

func (p *relaxParser) callGlobal(c *pyCall, gv *ir.GlobalVar, binding string) ir.RExpr {
	args := p.posArgs(c)
	call := &ir.RCall{Op: gv, Args: args}
	info := p.module.funcs[gv.Name]
	switch {
	case info.prim != nil:
		if len(args) != len(info.prim.Params) {
			p.failAt(c.P, "%s", p.bindingMsg(binding, fmt.Errorf("call of %q: %d arguments, the function takes %d", gv.Name, len(args), len(info.prim.Params))))
		}
		call.Info = ir.PrimFuncResult(info.prim)
	case info.ret != nil:
		call.Info = info.ret
	default:
		call.Info = ir.Object()
	}
	return call
}

func (p *relaxParser) callTIR(c *pyCall) ir.RExpr {
	if len(c.Args) != 2 {
		p.failAt(c.P, "R.call_tir takes a function and a tuple of arguments, and out_sinfo=")
	}
	a, ok := c.Args[0].(*pyAttr)
	var gv *ir.GlobalVar
	if ok {
		gv = p.global(a)
	}
	if gv == nil {
		p.failAt(c.Args[0].at(), "R.call_tir calls a function of the module (cls.name)")
	}
	if info := p.module.funcs[gv.Name]; info.prim == nil {
		p.failAt(c.Args[0].at(), "R.call_tir of %q, which is not a T.prim_func", gv.Name)
	}
	args := p.rexpr(c.Args[1])
	if _, ok := args.(*ir.RTuple); !ok {
		args = &ir.RTuple{Fields: []ir.RExpr{args}}
	}
	var out ir.StructInfo
	var tirVars ir.RExpr
	for _, kw := range c.Kwargs {
		switch kw.Name {
		case "out_sinfo":
			if l, ok := kw.Value.(*pyList); ok {
				fs := make([]ir.StructInfo, len(l.Elts))
				for i, x := range l.Elts {
					fs[i] = p.sinfo(x, false)
				}
				out = ir.Tuple(fs...)
			} else {
				out = p.sinfo(kw.Value, false)
			}
		case "tir_vars":
			tirVars = p.shapeValue(kw.Value)
		default:
			p.failAt(kw.P, "unknown argument %q of R.call_tir", kw.Name)
		}
	}
	if out == nil {
		p.failAt(c.P, "R.call_tir needs out_sinfo=")
	}
	call := ir.CallTIR(gv, args.(*ir.RTuple).Fields, out)
	if tirVars != nil {
		call.Args = append(call.Args, tirVars)
	}
	info, err := ir.InferCall(call, nil)
	if err != nil {
		p.failAt(c.P, "%v", err)
	}
	call.Info = info
	if pf := p.module.funcs[gv.Name].prim; pf != nil && tirVars == nil {
		nout := 1
		if t, ok := out.(*ir.TupleStructInfo); ok {
			nout = len(t.Fields)
		}
		if got := len(args.(*ir.RTuple).Fields) + nout; got != len(pf.Params) {
			p.failAt(c.P, "R.call_tir of %q: %d inputs and %d outputs, the function takes %d parameters",
				gv.Name, len(args.(*ir.RTuple).Fields), nout, len(pf.Params))
		}
	}
	return call
}

func (p *relaxParser) callPacked(c *pyCall) ir.RExpr {
	if len(c.Args) == 0 {
		p.failAt(c.P, "R.call_packed takes a function name")
	}
	name := p.tp.str(c.Args[0], "R.call_packed")
	args := []ir.RExpr{&ir.ExternFunc{Name: name}}
	for _, a := range c.Args[1:] {
		args = append(args, p.rexpr(a))
	}
	var sinfo []ir.StructInfo
	for _, kw := range c.Kwargs {
		if kw.Name != "sinfo_args" {
			p.failAt(kw.P, "unknown argument %q of R.call_packed", kw.Name)
		}
		switch v := kw.Value.(type) {
		case *pyTuple:
			for _, x := range v.Elts {
				sinfo = append(sinfo, p.sinfo(x, false))
			}
		case *pyList:
			for _, x := range v.Elts {
				sinfo = append(sinfo, p.sinfo(x, false))
			}
		default:
			sinfo = append(sinfo, p.sinfo(v, false))
		}
	}
	if len(sinfo) != 1 {
		p.failAt(c.P, "R.call_packed needs sinfo_args= with one struct info")
	}
	return &ir.RCall{Op: &ir.Op{Name: ir.OpCallPacked}, Args: args, SInfoArgs: sinfo, Info: sinfo[0]}
}

// opCall converts a call of a registered operator, placing keyword
// arguments by the schema.
func (p *relaxParser) opCall(c *pyCall, def *op.Def, binding string) ir.RExpr {
	if len(c.Args) > len(def.Args) {
		p.failAt(c.Args[len(def.Args)].at(), "%s takes at most %d positional arguments", def.ScriptName(), len(def.Args))
	}
	args := make([]ir.RExpr, len(def.Args))
	for i, a := range c.Args {
		args[i] = p.argOf(def.Args[i].Kind, a)
	}
	attrs := map[string]any{}
	for _, kw := range c.Kwargs {
		if kw.Name == "" {
			p.failAt(kw.P, "**kwargs are not supported")
		}
		if i := slices.IndexFunc(def.Args, func(a op.Arg) bool { return a.Name == kw.Name }); i >= 0 {
			if args[i] != nil {
				p.failAt(kw.P, "%s: argument %q given twice", def.ScriptName(), kw.Name)
			}
			args[i] = p.argOf(def.Args[i].Kind, kw.Value)
			continue
		}
		if !slices.ContainsFunc(def.Attrs, func(a op.Attr) bool { return a.Name == kw.Name }) {
			p.failAt(kw.P, "%s has no argument or attribute %q", def.ScriptName(), kw.Name)
		}
		attrs[kw.Name] = p.attrLiteral(kw.Value)
	}
	n := len(args)
	for n > 0 && args[n-1] == nil {
		n--
	}
	for i := 0; i < n; i++ {
		if args[i] == nil {
			p.failAt(c.P, "%s: missing argument %q", def.ScriptName(), def.Args[i].Name)
		}
	}
	args = args[:n]
	norm, err := def.NormalizeAttrs(attrs)
	if err != nil {
		p.failAt(c.P, "%s", p.bindingMsg(binding, err))
	}
	call := &ir.RCall{Op: &ir.Op{Name: def.Name}, Args: args, Attrs: norm}
	info, err := def.InferStructInfo(call)
	if err != nil {
		p.failAt(c.P, "%s", p.bindingMsg(binding, err))
	}
	call.Info = info
	return call
}

// argOf converts an operator argument, turning literals into the kind's
// expression.
func (p *relaxParser) argOf(kind op.ArgKind, a pyExpr) ir.RExpr {
	switch kind {
	case op.ArgShape:
		switch a.(type) {
		case *pyList, *pyTuple:
			return &ir.ShapeExpr{Values: p.dimList(a, false)}
		}
	case op.ArgPrim:
		switch v := a.(type) {
		case *pyInt, *pyUnary, *pyBinOp:
			return &ir.PrimValue{Value: p.primArg(a)}
		case *pyFloat:
			return &ir.PrimValue{Value: ir.F64(v.Value)}
		case *pyName:
			if _, ok := p.tp.lookup(v.ID); ok {
				return &ir.PrimValue{Value: p.primArg(a)}
			}
		case *pyCall:
			if strings.HasPrefix(dotted(v.Fn), "T.") {
				return &ir.PrimValue{Value: p.primArg(a)}
			}
		}
	case op.ArgDType:
		if s, ok := a.(*pyStr); ok {
			return &ir.DataTypeImm{DType: p.tp.dtype(s)}
		}
	case op.ArgString:
		if s, ok := a.(*pyStr); ok {
			return &ir.RString{Value: s.Value}
		}
	}
	return p.rexpr(a)
}

// attrLiteral converts an attribute value: None, bools, numbers, strings
// and lists or tuples of them.
func (p *relaxParser) attrLiteral(e pyExpr) any {
	switch e := e.(type) {
	case *pyConst:
		switch e.Value {
		case "None":
			return nil
		case "True":
			return true
		case "False":
			return false
		}
	case *pyInt:
		return e.Value
	case *pyFloat:
		return e.Value
	case *pyUnary:
		if e.Op == "-" {
			switch v := p.attrLiteral(e.X).(type) {
			case int64:
				return -v
			case float64:
				return -v
			}
		}
	case *pyStr:
		return e.Value
	case *pyList:
		out := make([]any, len(e.Elts))
		for i, x := range e.Elts {
			out[i] = p.attrLiteral(x)
		}
		return out
	case *pyTuple:
		out := make([]any, len(e.Elts))
		for i, x := range e.Elts {
			out[i] = p.attrLiteral(x)
		}
		return out
	case *pyCall:
		if dotted(e.Fn) == "T.int64" || dotted(e.Fn) == "T.int32" {
			if c, ok := p.tp.expr(e).(*ir.IntImm); ok {
				return c.Value
			}
		}
	}
	p.failAt(e.at(), "unsupported attribute value (want None, True, False, a number, a string or a list)")
	return nil
}

// primArg converts a scalar: integer literals become int64.
func (p *relaxParser) primArg(e pyExpr) ir.Expr {
	if f, ok := e.(*pyFloat); ok {
		return ir.F64(f.Value)
	}
	x := p.dim(e, false)
	return x
}

// shapeValue converts a shape argument: a list or tuple of dimensions, or
// a graph expression.
func (p *relaxParser) shapeValue(e pyExpr) ir.RExpr {
	switch e.(type) {
	case *pyList, *pyTuple:
		return &ir.ShapeExpr{Values: p.dimList(e, false)}
	}
	return p.rexpr(e)
}

// dimList converts a list or tuple of dimensions.
func (p *relaxParser) dimList(e pyExpr, define bool) []ir.Expr {
	var elts []pyExpr
	switch l := e.(type) {
	case *pyList:
		elts = l.Elts
	case *pyTuple:
		elts = l.Elts
	default:
		p.failAt(e.at(), "want a list or tuple of dimensions")
	}
	out := make([]ir.Expr, len(elts))
	for i, x := range elts {
		out[i] = p.dim(x, define)
	}
	return out
}

// dim converts a dimension: an integer (int64), a symbolic variable (a
// string "n" defines it when define is set), or an integer expression.
func (p *relaxParser) dim(e pyExpr, define bool) ir.Expr {
	switch e := e.(type) {
	case *pyInt:
		return ir.I64(e.Value)
	case *pyStr:
		if v, ok := p.tp.lookup(e.Value); ok {
			if x, ok := v.(*ir.Var); ok {
				return x
			}
		}
		if !define {
			p.failAt(e.P, "undefined symbolic variable %q", e.Value)
		}
		if e.Value == "" || !isIdent(e.Value) {
			p.failAt(e.P, "bad symbolic variable name %q", e.Value)
		}
		x := ir.NewVar(e.Value, ir.Int64)
		p.tp.define(e.Value, x)
		return x
	case *pyUnary:
		if e.Op == "-" {
			if n, ok := e.X.(*pyInt); ok {
				return ir.I64(-n.Value)
			}
		}
	case *pyBinOp:
		l, r := p.dim(e.L, false), p.dim(e.R, false)
		var x ir.Expr
		switch e.Op {
		case "+":
			x = ir.Add(l, r)
		case "-":
			x = ir.Sub(l, r)
		case "*":
			x = ir.Mul(l, r)
		case "//":
			x = ir.FloorDiv(l, r)
		case "%":
			x = ir.FloorMod(l, r)
		default:
			p.failAt(e.P, "operator %q in a dimension", e.Op)
		}
		return ir.FoldDim(x)
	}
	x := p.tp.expr(e)
	if !ir.IsIndexType(x.DType()) {
		p.failAt(e.at(), "dimension %s has dtype %s, want an integer", x, x.DType())
	}
	return ir.FoldDim(x)
}

func isIdent(s string) bool {
	for i, r := range s {
		if r != '_' && !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || i > 0 && '0' <= r && r <= '9') {
			return false
		}
	}
	return !isReserved(s)
}

// sinfo converts a struct info annotation; define lets strings in shapes
// define symbolic variables (parameters, match_cast).
func (p *relaxParser) sinfo(e pyExpr, define bool) ir.StructInfo {
	var c *pyCall
	fn := dotted(e)
	if call, ok := e.(*pyCall); ok {
		c, fn = call, dotted(call.Fn)
	}
	arg := func(i int, kw string) pyExpr {
		if c == nil {
			return nil
		}
		if i >= 0 && i < len(c.Args) {
			return c.Args[i]
		}
		for _, k := range c.Kwargs {
			if k.Name == kw {
				return k.Value
			}
		}
		return nil
	}
	checkKw := func(allowed ...string) {
		if c == nil {
			return
		}
		for _, k := range c.Kwargs {
			if !slices.Contains(allowed, k.Name) {
				p.failAt(k.P, "unknown argument %q of %s", k.Name, fn)
			}
		}
	}
	switch fn {
	case "R.Tensor":
		checkKw("shape", "dtype", "ndim")
		if c != nil && len(c.Args) > 2 {
			p.failAt(c.Args[2].at(), "R.Tensor takes a shape and a dtype")
		}
		t := &ir.TensorStructInfo{NDim: -1}
		if s := arg(0, "shape"); s != nil && !isNone(s) {
			if _, isStr := s.(*pyStr); isStr && arg(1, "dtype") == nil && len(c.Args) == 1 {
				// R.Tensor("float32"): a dtype only.
				t.DType = p.tp.dtype(s)
				return t
			}
			t.Shape = p.dimList(s, define)
			t.NDim = len(t.Shape)
		}
		if d := arg(1, "dtype"); d != nil && !isNone(d) {
			if s, ok := d.(*pyStr); !ok || s.Value != "void" {
				t.DType = p.tp.dtype(d)
			}
		}
		if n := arg(-1, "ndim"); n != nil {
			k, ok := n.(*pyInt)
			var v int64
			if ok {
				v = k.Value
			} else if u, isU := n.(*pyUnary); isU && u.Op == "-" {
				if k, ok2 := u.X.(*pyInt); ok2 {
					v, ok = -k.Value, true
				}
			}
			if !ok || v < -1 || v > 64 {
				p.failAt(n.at(), "ndim must be an integer from -1 to 64")
			}
			if t.Shape != nil && int(v) != t.NDim && v != -1 {
				p.failAt(n.at(), "ndim=%d for a shape of %d dimensions", v, t.NDim)
			}
			if t.Shape == nil {
				t.NDim = int(v)
			}
		}
		return t
	case "R.Tuple":
		if c == nil {
			return ir.Tuple()
		}
		checkKw()
		elts := c.Args
		if len(elts) == 1 {
			if l, ok := elts[0].(*pyList); ok {
				elts = l.Elts
			}
		}
		fs := make([]ir.StructInfo, len(elts))
		for i, x := range elts {
			fs[i] = p.sinfo(x, define)
		}
		return ir.Tuple(fs...)
	case "R.Shape":
		checkKw("values", "ndim")
		s := &ir.ShapeStructInfo{NDim: -1}
		if v := arg(0, "values"); v != nil && !isNone(v) {
			s.Values = p.dimList(v, define)
			s.NDim = len(s.Values)
		}
		if n := arg(-1, "ndim"); n != nil && s.Values == nil {
			k, ok := n.(*pyInt)
			if !ok || k.Value < -1 || k.Value > 64 {
				p.failAt(n.at(), "ndim must be an integer from -1 to 64")
			}
			s.NDim = int(k.Value)
		}
		return s
	case "R.Object":
		if c != nil {
			checkKw()
			if len(c.Args) > 0 {
				p.failAt(c.P, "R.Object takes no arguments")
			}
		}
		return ir.Object()
	case "R.Prim":
		checkKw("dtype", "value")
		s := &ir.PrimStructInfo{}
		if d := arg(0, "dtype"); d != nil {
			s.DType = p.tp.dtype(d)
		}
		if v := arg(-1, "value"); v != nil {
			s.Value = p.dim(v, define)
			s.DType = s.Value.DType()
		}
		return s
	case "R.Callable":
		if c == nil {
			return &ir.FuncStructInfo{}
		}
		checkKw("params", "ret", "purity")
		fs := &ir.FuncStructInfo{Ret: ir.Object(), Pure: true}
		if ps := arg(0, "params"); ps != nil {
			var elts []pyExpr
			switch l := ps.(type) {
			case *pyTuple:
				elts = l.Elts
			case *pyList:
				elts = l.Elts
			default:
				p.failAt(ps.at(), "R.Callable parameters are a tuple of struct infos")
			}
			fs.Params = make([]ir.StructInfo, len(elts))
			for i, x := range elts {
				fs.Params[i] = p.sinfo(x, define)
			}
		}
		if r := arg(1, "ret"); r != nil {
			fs.Ret = p.sinfo(r, define)
		}
		if pu := arg(2, "purity"); pu != nil {
			b, ok := pu.(*pyConst)
			if !ok || b.Value != "True" && b.Value != "False" {
				p.failAt(pu.at(), "purity must be True or False")
			}
			fs.Pure = b.Value == "True"
		}
		return fs
	}
	p.failAt(e.at(), "unsupported struct info %q (want R.Tensor, R.Tuple, R.Shape, R.Object, R.Prim or R.Callable)", fn)
	return nil
}

// constant converts R.const(value, dtype): a number or nested lists.
func (p *relaxParser) constant(c *pyCall) ir.RExpr {
	if len(c.Args) < 1 || len(c.Args) > 2 {
		p.failAt(c.P, "R.const takes a value and a dtype")
	}
	var dtE pyExpr
	if len(c.Args) == 2 {
		dtE = c.Args[1]
	}
	for _, kw := range c.Kwargs {
		if kw.Name != "dtype" || dtE != nil {
			p.failAt(kw.P, "unknown argument %q of R.const", kw.Name)
		}
		dtE = kw.Value
	}
	var shape ndarray.Shape
	var vals []pyExpr
	var walk func(e pyExpr, depth int)
	walk = func(e pyExpr, depth int) {
		if l, ok := e.(*pyList); ok {
			if depth == len(shape) {
				shape = append(shape, int64(len(l.Elts)))
			} else if depth > len(shape) || shape[depth] != int64(len(l.Elts)) {
				p.failAt(l.P, "R.const: ragged nested lists")
			}
			for _, x := range l.Elts {
				walk(x, depth+1)
			}
			return
		}
		if depth != len(shape) {
			p.failAt(e.at(), "R.const: ragged nested lists")
		}
		vals = append(vals, e)
	}
	walk(c.Args[0], 0)
	if int64(len(vals)) != max(shape.NumElements(), 0) && !(len(shape) == 0 && len(vals) == 1) {
		p.failAt(c.P, "R.const: ragged nested lists")
	}
	dt := ir.Float32
	if dtE != nil {
		dt = p.tp.dtype(dtE)
	} else if len(vals) > 0 {
		switch v := vals[0].(type) {
		case *pyInt:
			dt = ir.Int64
		case *pyConst:
			if v.Value == "True" || v.Value == "False" {
				dt = ir.Bool
			}
		}
	}
	size := dt.Size()
	if size <= 0 || dt.Lanes != 1 {
		p.failAt(c.P, "R.const of dtype %s is not supported", dt)
	}
	data := make([]byte, len(vals)*size)
	for i, v := range vals {
		f, isInt, n := p.number(v)
		if err := putScalar(data[i*size:], dt, f, isInt, n); err != nil {
			p.failAt(v.at(), "R.const: %v", err)
		}
	}
	k, err := ir.ConstantFromBytes(dt, shape, data)
	if err != nil {
		p.failAt(c.P, "R.const: %v", err)
	}
	return k
}

// number reads a numeric literal (with sign) or True/False.
func (p *relaxParser) number(e pyExpr) (f float64, isInt bool, n int64) {
	switch e := e.(type) {
	case *pyInt:
		return float64(e.Value), true, e.Value
	case *pyFloat:
		return e.Value, false, 0
	case *pyConst:
		switch e.Value {
		case "True":
			return 1, true, 1
		case "False":
			return 0, true, 0
		}
	case *pyUnary:
		if e.Op == "-" {
			f, isInt, n := p.number(e.X)
			return -f, isInt, -n
		}
	case *pyName:
		switch e.ID {
		case "inf":
			return math.Inf(1), false, 0
		case "nan":
			return math.NaN(), false, 0
		}
	case *pyCall:
		if dotted(e.Fn) == "float" && len(e.Args) == 1 {
			if s, ok := e.Args[0].(*pyStr); ok {
				switch strings.ToLower(s.Value) {
				case "inf", "+inf":
					return math.Inf(1), false, 0
				case "-inf":
					return math.Inf(-1), false, 0
				case "nan":
					return math.NaN(), false, 0
				}
			}
		}
	}
	p.failAt(e.at(), "R.const values must be numbers")
	return 0, false, 0
}

// putScalar encodes one value of dt, little-endian.
func putScalar(b []byte, dt ir.DType, f float64, isInt bool, n int64) error {
	if !isInt {
		n = int64(f)
	} else {
		f = float64(n)
	}
	switch {
	case dt == ir.Float32:
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(f)))
	case dt == ir.Float64:
		binary.LittleEndian.PutUint64(b, math.Float64bits(f))
	case ir.IsBool(dt):
		if n != 0 {
			b[0] = 1
		} else {
			b[0] = 0
		}
	case dt.IsInt() && !isInt:
		return fmt.Errorf("float value %v for dtype %s", f, dt)
	case dt.IsInt():
		switch dt.Bits {
		case 8:
			b[0] = byte(n)
		case 16:
			binary.LittleEndian.PutUint16(b, uint16(n))
		case 32:
			binary.LittleEndian.PutUint32(b, uint32(n))
		case 64:
			binary.LittleEndian.PutUint64(b, uint64(n))
		default:
			return fmt.Errorf("dtype %s is not supported", dt)
		}
	default:
		return fmt.Errorf("dtype %s is not supported", dt)
	}
	return nil
}
