package script

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Print returns the TVMScript text of n: an *ir.IRModule (as an
// `@I.ir_module class Module:`), an *ir.PrimFunc (a bare `@T.prim_func`),
// an *ir.Function (a bare `@R.function`), an ir.StructInfo, an ir.RExpr,
// or an ir.Stmt or ir.Expr (fragments, for messages and tests). Modules
// and functions parse back with Parse to structurally equal nodes.
func Print(n ir.Node) string {
	p := newPrinter()
	switch n := n.(type) {
	case *ir.IRModule:
		p.module(n)
	case *ir.PrimFunc:
		p.line("# from tvm.script import tir as T")
		p.line("")
		name, _ := n.Attrs[ir.AttrGlobalSymbol].(string)
		if name == "" {
			name = "main"
		}
		p.primFunc(name, n)
	case *ir.Function:
		p.line("# from tvm.script import relax as R")
		p.line("")
		name, _ := n.Attrs[ir.AttrGlobalSymbol].(string)
		if name == "" {
			name = "main"
		}
		p.relaxFunc(name, n, "Module")
	case ir.StructInfo:
		return p.sinfo(n, false)
	case ir.RExpr:
		return p.rexpr(n)
	case ir.Stmt:
		p.stmt(n)
	case ir.Expr:
		return p.expr(n)
	default:
		return fmt.Sprintf("<unprintable %T>", n)
	}
	return p.b.String()
}

type printer struct {
	b      strings.Builder
	indent int
	names  map[any]string
	used   map[string]bool
	data   map[*ir.Var]*ir.Buffer // data variables printed as B.data
	loops  map[*ir.Var]*ir.For
	uses   map[*ir.RVar]bool // graph variables that are used (relax_print.go)
	cls    string            // the name bound to the module in a graph function
}

func newPrinter() *printer {
	return &printer{names: map[any]string{}, used: map[string]bool{}, data: map[*ir.Var]*ir.Buffer{}, loops: map[*ir.Var]*ir.For{}}
}

func (p *printer) line(s string) {
	if s != "" {
		p.b.WriteString(strings.Repeat("    ", p.indent))
	}
	p.b.WriteString(s)
	p.b.WriteByte('\n')
}

func (p *printer) module(m *ir.IRModule) {
	relax := false
	for _, f := range m.Funcs() {
		if _, ok := f.(*ir.Function); ok {
			relax = true
		}
	}
	p.line("# from tvm.script import ir as I")
	p.line("# from tvm.script import tir as T")
	if relax {
		p.line("# from tvm.script import relax as R")
	}
	p.line("")
	p.line("@I.ir_module")
	p.line("class Module:")
	p.indent++
	if len(m.Attrs) > 0 {
		p.line("I.module_attrs(" + p.attrValue(m.Attrs) + ")")
	}
	first := true
	for name, f := range m.Funcs() {
		if !first {
			p.line("")
		}
		first = false
		switch f := f.(type) {
		case *ir.PrimFunc:
			fp := newPrinter()
			fp.indent = p.indent
			fp.primFunc(name, f)
			p.b.WriteString(fp.b.String())
		case *ir.Function:
			fp := newPrinter()
			fp.indent = p.indent
			fp.relaxFunc(name, f, "Module")
			p.b.WriteString(fp.b.String())
		default:
			p.line(fmt.Sprintf("# unprintable function %q of kind %T", name, f))
		}
	}
	if first {
		p.line("pass")
	}
	p.indent--
}

var printReserved = map[string]bool{"T": true, "I": true, "R": true, "range": true, "print": true}

// name returns the unique printed name of a variable or buffer, assigning
// one on first use.
func (p *printer) name(obj any, hint string) string {
	if n, ok := p.names[obj]; ok {
		return n
	}
	base := sanitize(hint)
	n := base
	for i := 1; p.used[n]; i++ {
		n = base + "_" + strconv.Itoa(i)
	}
	p.used[n] = true
	p.names[obj] = n
	return n
}

// release frees the names of objects whose scope ended, so later siblings
// may reuse them (TVMScript prints i0 again in the next loop nest).
func (p *printer) release(objs ...any) {
	for _, o := range objs {
		if n, ok := p.names[o]; ok {
			delete(p.used, n)
			delete(p.names, o)
		}
	}
}

func sortStrings(s []string) { sort.Strings(s) }

func sanitize(s string) string {
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) && i > 0:
			b.WriteRune(r)
		case unicode.IsDigit(r):
			b.WriteString("v_")
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	out := b.String()
	if out == "" {
		out = "v"
	}
	if isReserved(out) || printReserved[out] {
		out += "_"
	}
	return out
}

func (p *printer) varName(v *ir.Var) string { return p.name(v, v.Name) }

func (p *printer) bufName(b *ir.Buffer) string {
	n := p.name(b, b.Name)
	if b.Data != nil {
		if _, ok := p.data[b.Data]; !ok {
			p.data[b.Data] = b
		}
	}
	return n
}

// hasVars reports whether any of es mentions a variable.
func hasVars(es ...ir.Expr) bool {
	found := false
	for _, e := range es {
		if e == nil {
			continue
		}
		ir.Visit(e, func(n ir.Node) bool {
			if _, ok := n.(*ir.Var); ok {
				found = true
			}
			return !found
		})
	}
	return found
}

func (p *printer) primFunc(name string, f *ir.PrimFunc) {
	attrs := map[string]any{}
	for k, v := range f.Attrs {
		attrs[k] = v
	}
	gs, hasGS := attrs[ir.AttrGlobalSymbol].(string)
	if hasGS && gs == name {
		delete(attrs, ir.AttrGlobalSymbol)
		p.line("@T.prim_func")
	} else {
		p.line("@T.prim_func(private=True)")
	}
	// Parameters: buffers with static layouts print as T.Buffer
	// annotations, the others as T.handle with a T.match_buffer.
	var params []string
	var matched []*ir.Var
	for _, v := range f.Params {
		b, ok := f.BufferMap[v]
		switch {
		case ok && !hasVars(append(append(slices.Clone(b.Shape), b.Strides...), b.ElemOffset)...):
			params = append(params, p.bufName(b)+": "+p.bufferDecl("T.Buffer", b, true))
		case ok:
			hint := v.Name
			if hint == b.Name {
				hint = "var_" + b.Name
			}
			params = append(params, p.name(v, hint)+": T.handle")
			matched = append(matched, v)
		case ir.IsHandle(v.Type):
			params = append(params, p.varName(v)+": T.handle")
		default:
			params = append(params, p.varName(v)+": T."+v.Type.String())
		}
	}
	ret := ""
	if _, packed := f.Attrs["calling_conv"]; !ir.IsVoid(f.RetType) && !packed {
		// A lowered (packed) function's RetType is its status code, not a
		// result the source declared.
		ret = " -> T." + f.RetType.String()
	}
	p.line("def " + sanitize(name) + "(" + strings.Join(params, ", ") + ")" + ret + ":")
	p.indent++
	if len(attrs) > 0 {
		p.line("T.func_attr(" + p.attrValue(attrs) + ")")
	}
	// Size variables first defined by matched buffers.
	for _, v := range matched {
		b := f.BufferMap[v]
		for _, e := range append(append(slices.Clone(b.Shape), b.Strides...), b.ElemOffset) {
			if e == nil {
				continue
			}
			ir.PostOrderVisit(e, func(n ir.Node) {
				x, ok := n.(*ir.Var)
				if !ok {
					return
				}
				if _, named := p.names[x]; named {
					return
				}
				p.line(p.varName(x) + " = T." + x.Type.String() + "()")
			})
		}
	}
	for _, v := range matched {
		b := f.BufferMap[v]
		bn := p.bufName(b)
		p.line(bn + " = " + p.bufferDecl("T.match_buffer", b, false, p.names[v]))
	}
	if f.Body == nil {
		p.line("T.evaluate(0)")
	} else if rb := ir.RootBlock(f.Body); rb != nil && plainRoot(f.Body.(*ir.BlockRealize)) {
		p.line(`# with T.block("root"):`)
		for _, a := range rb.AllocBuffers {
			p.alloc(a)
		}
		p.stmt(rb.Body)
	} else {
		p.stmt(f.Body)
	}
	p.indent--
}

// plainRoot reports a root block that TVMScript leaves implicit.
func plainRoot(br *ir.BlockRealize) bool {
	b := br.Block
	if c, ok := br.Predicate.(*ir.IntImm); br.Predicate != nil && (!ok || c.Value != 1) {
		return false
	}
	return len(br.IterValues) == 0 && len(b.Reads) == 0 && len(b.Writes) == 0 && b.Init == nil && len(b.Annotations) == 0
}

// bufferDecl prints T.Buffer((shape), "dtype", …) and friends. dtypeAlways
// prints the dtype even when it is the default float32; lead are leading
// positional arguments.
func (p *printer) bufferDecl(fn string, b *ir.Buffer, dtypeAlways bool, lead ...string) string {
	args := slices.Clone(lead)
	args = append(args, p.tuple(b.Shape))
	if dtypeAlways || b.DType != ir.Float32 {
		args = append(args, strconv.Quote(b.DType.String()))
	}
	if len(b.Strides) > 0 {
		args = append(args, "strides="+p.tuple(b.Strides))
	}
	if b.ElemOffset != nil {
		if c, ok := b.ElemOffset.(*ir.IntImm); !ok || c.Value != 0 {
			args = append(args, "elem_offset="+p.expr(b.ElemOffset))
		}
	}
	if s := b.StorageScope(); s != "global" {
		args = append(args, "scope="+pyQuote(s))
	}
	return fn + "(" + strings.Join(args, ", ") + ")"
}

func (p *printer) tuple(es []ir.Expr) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = p.expr(e)
	}
	if len(parts) == 1 {
		return "(" + parts[0] + ",)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

func (p *printer) alloc(b *ir.Buffer) {
	n := p.bufName(b)
	p.line(n + " = " + p.bufferDecl("T.alloc_buffer", b, false))
}

// stmt prints s; last reports that s ends its statement list, so binding
// forms (let, decl_buffer) may print flat instead of as with-blocks.
func (p *printer) stmt(s ir.Stmt) { p.stmtAt(s, true) }

func (p *printer) body(s ir.Stmt) {
	p.indent++
	p.stmt(s)
	p.indent--
}

func (p *printer) stmtAt(s ir.Stmt, last bool) {
	switch s := s.(type) {
	case nil:
		p.line("T.evaluate(0)")
	case *ir.SeqStmt:
		if len(s.Seq) == 0 {
			p.line("T.evaluate(0)")
		}
		for i, c := range s.Seq {
			p.stmtAt(c, last && i == len(s.Seq)-1)
		}
	case *ir.For:
		p.forStmt(s)
	case *ir.BlockRealize:
		p.block(s)
	case *ir.BufferStore:
		p.line(p.load(s.Buffer, s.Indices) + " = " + p.expr(s.Value))
	case *ir.Allocate:
		decl := p.bufferDecl("T.decl_buffer", s.Buffer, false)
		p.binding(p.bufName(s.Buffer), decl, s.Body, last)
		p.release(s.Buffer)
	case *ir.DeclBuffer:
		decl := p.bufferDecl("T.decl_buffer", s.Buffer, false)
		data := ""
		if s.Buffer.Data != nil {
			data = p.expr(s.Buffer.Data)
		}
		decl = strings.TrimSuffix(decl, ")") + ", data=" + data + ")"
		p.binding(p.bufName(s.Buffer), decl, s.Body, last)
		p.release(s.Buffer)
	case *ir.LetStmt:
		val := p.expr(s.Value)
		name := p.varName(s.Var)
		if last {
			p.line(name + ": T." + s.Var.Type.String() + " = " + val)
			p.stmt(s.Body)
		} else {
			p.line("with T.LetStmt(" + val + ", T." + s.Var.Type.String() + ") as " + name + ":")
			p.body(s.Body)
		}
		p.release(s.Var)
	case *ir.IfThenElse:
		p.line("if " + p.expr(s.Cond) + ":")
		p.body(s.Then)
		for s.Else != nil {
			if elif, ok := s.Else.(*ir.IfThenElse); ok {
				p.line("elif " + p.expr(elif.Cond) + ":")
				p.body(elif.Then)
				s = elif
				continue
			}
			p.line("else:")
			p.body(s.Else)
			break
		}
	case *ir.Evaluate:
		if v := ir.RetValue(s); v != nil {
			p.line("return " + p.expr(v))
		} else if c, ok := s.Value.(*ir.Call); ok {
			p.line(p.expr(c))
		} else {
			p.line("T.evaluate(" + p.expr(s.Value) + ")")
		}
	case *ir.AttrStmt:
		node := "None"
		if s.Node != nil {
			node = p.expr(s.Node)
		}
		p.line("with T.attr(" + node + ", " + pyQuote(s.Key) + ", " + p.expr(s.Value) + "):")
		p.body(s.Body)
	case *ir.AssertStmt:
		p.line("assert " + p.expr(s.Cond) + ", " + pyQuote(s.Message))
	default:
		p.line(fmt.Sprintf("# unprintable statement %T", s))
	}
}

// binding prints `name = decl` followed by body, or a with-block when more
// statements follow.
func (p *printer) binding(name, decl string, body ir.Stmt, last bool) {
	if last {
		p.line(name + " = " + decl)
		p.stmt(body)
		return
	}
	p.line("with " + decl + " as " + name + ":")
	p.body(body)
}

func isZero(e ir.Expr) bool {
	c, ok := e.(*ir.IntImm)
	return ok && c.Value == 0
}

func plainLoop(f *ir.For) bool {
	return f.Kind == ir.ForSerial && isZero(f.Min) && len(f.Annotations) == 0
}

func (p *printer) forStmt(f *ir.For) {
	if plainLoop(f) {
		chain := []*ir.For{f}
		for {
			inner, ok := chain[len(chain)-1].Body.(*ir.For)
			if !ok || !plainLoop(inner) || usesAny(inner.Extent, chain) {
				break
			}
			chain = append(chain, inner)
		}
		names := make([]string, len(chain))
		exts := make([]string, len(chain))
		for i, c := range chain {
			exts[i] = p.expr(c.Extent)
			names[i] = p.varName(c.Var)
			p.loops[c.Var] = c
		}
		if len(chain) == 1 {
			p.line("for " + names[0] + " in range(" + exts[0] + "):")
		} else {
			p.line("for " + strings.Join(names, ", ") + " in T.grid(" + strings.Join(exts, ", ") + "):")
		}
		p.body(chain[len(chain)-1].Body)
		for _, c := range chain {
			p.release(c.Var)
		}
		return
	}
	fn := map[ir.ForKind]string{ir.ForSerial: "T.serial", ir.ForParallel: "T.parallel", ir.ForVectorized: "T.vectorized",
		ir.ForUnrolled: "T.unroll", ir.ForThreadBinding: "T.thread_binding"}[f.Kind]
	if f.Kind == ir.ForSerial && len(f.Annotations) == 0 {
		fn = "range"
	}
	var args []string
	if isZero(f.Min) {
		args = append(args, p.expr(f.Extent))
	} else {
		args = append(args, p.expr(f.Min), p.expr(rangeEnd(f.Min, f.Extent)))
	}
	if f.Kind == ir.ForThreadBinding {
		args = append(args, "thread="+pyQuote(f.ThreadTag))
	}
	if len(f.Annotations) > 0 {
		args = append(args, "annotations="+p.attrValue(f.Annotations))
	}
	name := p.varName(f.Var)
	p.loops[f.Var] = f
	p.line("for " + name + " in " + fn + "(" + strings.Join(args, ", ") + "):")
	p.body(f.Body)
	p.release(f.Var)
}

// rangeEnd is min + extent, folded for constants of one dtype; the parser
// recovers the extent from either form.
func rangeEnd(min, extent ir.Expr) ir.Expr {
	a, ok1 := min.(*ir.IntImm)
	b, ok2 := extent.(*ir.IntImm)
	if ok1 && ok2 && a.Type == b.Type {
		return ir.NewIntImm(a.Type, a.Value+b.Value)
	}
	return &ir.Binary{Op: ir.OpAdd, A: min, B: extent}
}

func usesAny(e ir.Expr, loops []*ir.For) bool {
	found := false
	ir.Visit(e, func(n ir.Node) bool {
		if v, ok := n.(*ir.Var); ok {
			for _, l := range loops {
				if l.Var == v {
					found = true
				}
			}
		}
		return !found
	})
	return found
}

func (p *printer) block(br *ir.BlockRealize) {
	b := br.Block
	p.line("with T.block(" + pyQuote(b.Name) + "):")
	p.indent++
	// Iteration variables: runs of loop variables over their loops' full
	// ranges print as T.axis.remap, others one by one.
	remappable := func(i int) bool {
		if i >= len(br.IterValues) {
			return false
		}
		iv := b.IterVars[i]
		v, ok := br.IterValues[i].(*ir.Var)
		if !ok || v.Type != iv.Var.Type {
			return false
		}
		l, ok := p.loops[v]
		if !ok || !isZero(l.Min) || !isZero(iv.Dom.Min) || !ir.Equal(l.Extent, iv.Dom.Extent) ||
			iv.Dom.Min.DType() != iv.Var.Type {
			return false
		}
		for j := 0; j < i; j++ {
			if br.IterValues[j] == v {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(b.IterVars); {
		if remappable(i) {
			j := i
			var kinds, targets, values []string
			for j < len(b.IterVars) && remappable(j) {
				kinds = append(kinds, map[ir.IterKind]string{ir.IterSpatial: "S", ir.IterReduce: "R", ir.IterOpaque: "O"}[b.IterVars[j].Kind])
				values = append(values, p.expr(br.IterValues[j]))
				targets = append(targets, p.varName(b.IterVars[j].Var))
				j++
			}
			p.line(strings.Join(targets, ", ") + " = T.axis.remap(" + pyQuote(strings.Join(kinds, "")) + ", [" + strings.Join(values, ", ") + "])")
			i = j
			continue
		}
		iv := b.IterVars[i]
		dom := p.expr(iv.Dom.Extent)
		if !isZero(iv.Dom.Min) {
			dom = "(" + p.expr(iv.Dom.Min) + ", " + p.expr(rangeEnd(iv.Dom.Min, iv.Dom.Extent)) + ")"
		}
		val := "None"
		if i < len(br.IterValues) {
			val = p.expr(br.IterValues[i])
		}
		p.line(p.varName(iv.Var) + " = T.axis." + iv.Kind.String() + "(" + dom + ", " + val + ")")
		i++
	}
	if br.Predicate != nil {
		if c, ok := br.Predicate.(*ir.IntImm); !ok || c.Value != 1 {
			p.line("T.where(" + p.expr(br.Predicate) + ")")
		}
	}
	p.line("T.reads(" + p.regions(b.Reads) + ")")
	p.line("T.writes(" + p.regions(b.Writes) + ")")
	if len(b.Annotations) > 0 {
		p.line("T.block_attr(" + p.attrValue(b.Annotations) + ")")
	}
	for _, a := range b.AllocBuffers {
		p.alloc(a)
	}
	if b.Init != nil {
		p.line("with T.init():")
		p.body(b.Init)
	}
	p.stmt(b.Body)
	p.indent--
	for _, iv := range b.IterVars {
		p.release(iv.Var)
	}
	for _, a := range b.AllocBuffers {
		p.release(a)
	}
}

func (p *printer) regions(rs []ir.BufferRegion) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		idx := make([]string, len(r.Region))
		for j, rg := range r.Region {
			if c, ok := rg.Extent.(*ir.IntImm); ok && c.Value == 1 && rg.Extent.DType() == rg.Min.DType() {
				idx[j] = p.expr(rg.Min)
				continue
			}
			hi := rg.Extent
			if !isZero(rg.Min) || rg.Min.DType() != rg.Extent.DType() {
				hi = rangeEnd(rg.Min, rg.Extent)
			}
			idx[j] = p.expr(rg.Min) + ":" + p.expr(hi)
		}
		if len(idx) == 0 {
			parts[i] = p.bufName(r.Buffer) + "[()]"
		} else {
			parts[i] = p.bufName(r.Buffer) + "[" + strings.Join(idx, ", ") + "]"
		}
	}
	return strings.Join(parts, ", ")
}

func (p *printer) load(b *ir.Buffer, ix []ir.Expr) string {
	if len(ix) == 0 {
		return p.bufName(b) + "[()]"
	}
	parts := make([]string, len(ix))
	for i, e := range ix {
		parts[i] = p.expr(e)
	}
	return p.bufName(b) + "[" + strings.Join(parts, ", ") + "]"
}

// attrValue prints an attribute value (see ir.PrimFunc.Attrs).
func (p *printer) attrValue(v any) string {
	switch v := v.(type) {
	case nil:
		return "None"
	case bool:
		if v {
			return "T.bool(True)"
		}
		return "T.bool(False)"
	case int:
		return strconv.Itoa(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case int32:
		return strconv.FormatInt(int64(v), 10)
	case float64:
		return ir.FormatFloat(v)
	case string:
		return pyQuote(v)
	case []any:
		parts := make([]string, len(v))
		for i, x := range v {
			parts[i] = p.attrValue(x)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = pyQuote(k) + ": " + p.attrValue(v[k])
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case ir.Expr:
		return p.expr(v)
	}
	return pyQuote(fmt.Sprint(v))
}

// pyQuote quotes s as a Python string literal.
func pyQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r == unicode.ReplacementChar || !unicode.IsPrint(r):
			if r > 0xffff {
				fmt.Fprintf(&b, `\U%08x`, r)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// Precedence levels of Python operators, loosest first.
const (
	precOr = iota + 1
	precAnd
	precNot
	precCompare
	precAdd
	precMul
	precUnary
	precPower
	precAtom
)

func (p *printer) expr(e ir.Expr) string { return p.exprPrec(e, 0) }

func paren(s string, prec, ctx int) string {
	if prec < ctx {
		return "(" + s + ")"
	}
	return s
}

func (p *printer) exprPrec(e ir.Expr, ctx int) string {
	switch e := e.(type) {
	case nil:
		return "None"
	case *ir.IntImm:
		if e.Type == ir.Int32 {
			s := strconv.FormatInt(e.Value, 10)
			if e.Value < 0 {
				return paren(s, precUnary, ctx)
			}
			return s
		}
		return e.String()
	case *ir.FloatImm:
		return e.String()
	case *ir.StringImm:
		return pyQuote(e.Value)
	case *ir.Var:
		if b, ok := p.data[e]; ok {
			if _, named := p.names[e]; !named {
				return p.bufName(b) + ".data"
			}
		}
		return p.varName(e)
	case *ir.Binary:
		var sym string
		var prec int
		switch e.Op {
		case ir.OpAdd, ir.OpSub:
			sym, prec = e.Op.Symbol(), precAdd
		case ir.OpMul, ir.OpFloorDiv, ir.OpFloorMod:
			sym, prec = e.Op.Symbol(), precMul
		case ir.OpDiv:
			if e.A.DType().IsFloat() {
				sym, prec = "/", precMul
			} else {
				return "T.truncdiv(" + p.expr(e.A) + ", " + p.expr(e.B) + ")"
			}
		case ir.OpMod:
			return "T.truncmod(" + p.expr(e.A) + ", " + p.expr(e.B) + ")"
		case ir.OpMin:
			return "T.min(" + p.expr(e.A) + ", " + p.expr(e.B) + ")"
		case ir.OpMax:
			return "T.max(" + p.expr(e.A) + ", " + p.expr(e.B) + ")"
		case ir.OpAnd:
			sym, prec = "and", precAnd
		case ir.OpOr:
			sym, prec = "or", precOr
		default:
			sym, prec = e.Op.Symbol(), precCompare
			return paren(p.exprPrec(e.A, prec+1)+" "+sym+" "+p.exprPrec(e.B, prec+1), prec, ctx)
		}
		return paren(p.exprPrec(e.A, prec)+" "+sym+" "+p.exprPrec(e.B, prec+1), prec, ctx)
	case *ir.Not:
		return paren("not "+p.exprPrec(e.A, precNot), precNot, ctx)
	case *ir.Cast:
		return "T.Cast(" + pyQuote(e.Type.String()) + ", " + p.expr(e.Value) + ")"
	case *ir.Select:
		return "T.Select(" + p.expr(e.Cond) + ", " + p.expr(e.True) + ", " + p.expr(e.False) + ")"
	case *ir.BufferLoad:
		return p.load(e.Buffer, e.Indices)
	case *ir.Call:
		args := make([]string, len(e.Args))
		for i, a := range e.Args {
			args[i] = p.expr(a)
		}
		switch {
		case e.Op == ir.OpCallExtern:
			dt := e.Type.String()
			if ir.IsVoid(e.Type) {
				dt = "void"
			}
			return "T.call_extern(" + strings.Join(append([]string{pyQuote(dt)}, args...), ", ") + ")"
		case e.Op == ir.OpIfThenElse:
			return "T.if_then_else(" + strings.Join(args, ", ") + ")"
		case e.Op == ir.OpWarpShuffleDown && len(e.Args) == 5:
			return "T.tvm_warp_shuffle_down(" + strings.Join(args, ", ") + ")"
		case e.Op == ir.OpPtxMma && len(e.Args) == 13:
			return "T.ptx_mma(" + strings.Join(append([]string{pyQuote("float32")}, args...), ", ") + ")"
		}
		if _, ok := ir.Intrinsics[e.Op]; ok && len(e.Args) > 0 && e.Args[0].DType() == e.Type {
			return "T." + e.Op + "(" + strings.Join(args, ", ") + ")"
		}
		return "T.call_intrin(" + strings.Join(append([]string{pyQuote(e.Type.String()), pyQuote(e.Op)}, args...), ", ") + ")"
	case *ir.Ramp:
		return "T.Ramp(" + p.expr(e.Base) + ", " + p.expr(e.Stride) + ", " + strconv.Itoa(e.Lanes) + ")"
	case *ir.Broadcast:
		return "T.Broadcast(" + p.expr(e.Value) + ", " + strconv.Itoa(e.Lanes) + ")"
	case *ir.Let:
		val := p.expr(e.Value)
		name := p.varName(e.Var)
		out := "T.Let(" + name + ", " + val + ", " + p.expr(e.Body) + ")"
		p.release(e.Var)
		return out
	}
	return fmt.Sprintf("<unprintable %T>", e)
}
