package script

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
)

// relaxFunc prints a graph-level function as TVMScript; class is the
// module class name that `cls = …` refers to.
func (p *printer) relaxFunc(name string, f *ir.Function, class string) {
	attrs := map[string]any{}
	for k, v := range f.Attrs {
		attrs[k] = v
	}
	var flags []string
	if !f.Pure {
		flags = append(flags, "pure=False")
	}
	if gs, ok := attrs[ir.AttrGlobalSymbol].(string); ok && gs == name {
		delete(attrs, ir.AttrGlobalSymbol)
	} else {
		flags = append(flags, "private=True")
	}
	if len(flags) == 0 {
		p.line("@R.function")
	} else {
		p.line("@R.function(" + strings.Join(flags, ", ") + ")")
	}
	p.uses = usedRVars(f)
	// Symbolic variables first seen in parameters print as strings there
	// and are declared at the top of the body.
	var syms []*ir.Var
	params := make([]string, len(f.Params))
	for i, v := range f.Params {
		for _, d := range sinfoDimsOf(v.Info) {
			ir.PostOrderVisit(d, func(n ir.Node) {
				if x, ok := n.(*ir.Var); ok {
					if _, named := p.names[x]; !named {
						p.varName(x)
						syms = append(syms, x)
					}
				}
			})
		}
		params[i] = p.rvarName(v) + ": " + p.sinfo(v.Info, true)
	}
	head := "def " + sanitize(name) + "(" + strings.Join(params, ", ") + ")"
	if f.Ret != nil {
		head += " -> " + p.sinfo(f.Ret, false)
	}
	p.line(head + ":")
	p.indent++
	for _, x := range syms {
		p.line(p.varName(x) + " = T." + x.Type.String() + "()")
	}
	if len(attrs) > 0 {
		p.line("R.func_attr(" + p.attrValue(attrs) + ")")
	}
	if usesGlobals(f) {
		p.cls = "cls"
		p.line("cls = " + class)
	}
	if f.Body == nil {
		p.line("return R.tuple()")
	} else {
		p.seqBlocks(f.Body)
		p.line("return " + p.rexpr(f.Body.Body))
	}
	p.indent--
}

// usedRVars counts the uses of each graph variable in f.
func usedRVars(f *ir.Function) map[*ir.RVar]bool {
	used := map[*ir.RVar]bool{}
	var expr func(e ir.RExpr)
	var seq func(s *ir.SeqExpr)
	expr = func(e ir.RExpr) {
		switch e := e.(type) {
		case *ir.RVar:
			used[e] = true
		case *ir.RCall:
			expr(e.Op)
			for _, a := range e.Args {
				expr(a)
			}
		case *ir.RTuple:
			for _, a := range e.Fields {
				expr(a)
			}
		case *ir.TupleGetItem:
			expr(e.Tuple)
		case *ir.RIf:
			expr(e.Cond)
			seq(e.Then)
			seq(e.Else)
		case *ir.SeqExpr:
			seq(e)
		case *ir.Function:
			seq(e.Body)
		}
	}
	seq = func(s *ir.SeqExpr) {
		if s == nil {
			return
		}
		for _, b := range s.Blocks {
			for _, bd := range b.Bindings {
				expr(bd.BoundValue())
			}
		}
		expr(s.Body)
	}
	seq(f.Body)
	return used
}

// usesGlobals reports whether f refers to functions of its module.
func usesGlobals(f *ir.Function) bool {
	found := false
	var expr func(e ir.RExpr)
	var seq func(s *ir.SeqExpr)
	expr = func(e ir.RExpr) {
		switch e := e.(type) {
		case *ir.GlobalVar:
			found = true
		case *ir.RCall:
			expr(e.Op)
			for _, a := range e.Args {
				expr(a)
			}
		case *ir.RTuple:
			for _, a := range e.Fields {
				expr(a)
			}
		case *ir.TupleGetItem:
			expr(e.Tuple)
		case *ir.RIf:
			expr(e.Cond)
			seq(e.Then)
			seq(e.Else)
		}
	}
	seq = func(s *ir.SeqExpr) {
		if s == nil {
			return
		}
		for _, b := range s.Blocks {
			for _, bd := range b.Bindings {
				expr(bd.BoundValue())
			}
		}
		expr(s.Body)
	}
	seq(f.Body)
	return found
}

func sinfoDimsOf(s ir.StructInfo) []ir.Expr {
	switch s := s.(type) {
	case *ir.TensorStructInfo:
		return s.Shape
	case *ir.ShapeStructInfo:
		return s.Values
	case *ir.PrimStructInfo:
		if s.Value != nil {
			return []ir.Expr{s.Value}
		}
	case *ir.TupleStructInfo:
		var out []ir.Expr
		for _, f := range s.Fields {
			out = append(out, sinfoDimsOf(f)...)
		}
		return out
	case *ir.FuncStructInfo:
		var out []ir.Expr
		for _, f := range s.Params {
			out = append(out, sinfoDimsOf(f)...)
		}
		return append(out, sinfoDimsOf(s.Ret)...)
	}
	return nil
}

// rvarName names a graph variable; an unused variable called "_" stays
// "_" without taking the name.
func (p *printer) rvarName(v *ir.RVar) string {
	if v.Name == "_" && !p.uses[v] {
		return "_"
	}
	return p.name(v, v.Name)
}

func (p *printer) seqBlocks(s *ir.SeqExpr) {
	for _, b := range s.Blocks {
		if !b.Dataflow {
			for _, bd := range b.Bindings {
				p.rbinding(bd)
			}
			continue
		}
		p.line("with R.dataflow():")
		p.indent++
		var outs []string
		for _, bd := range b.Bindings {
			p.rbinding(bd)
			if v := bd.BoundVar(); !v.Dataflow {
				outs = append(outs, p.rvarName(v))
			}
		}
		p.line("R.output(" + strings.Join(outs, ", ") + ")")
		p.indent--
	}
}

func (p *printer) rbinding(bd ir.Binding) {
	switch bd := bd.(type) {
	case *ir.MatchCast:
		val := p.rexpr(bd.Value)
		p.line(p.rvarName(bd.Var) + " = R.match_cast(" + val + ", " + p.sinfo(bd.Info, false) + ")")
	case *ir.VarBinding:
		if e, ok := bd.Value.(*ir.RIf); ok {
			p.ifBinding(bd.Var, e)
			return
		}
		val := p.rexpr(bd.Value)
		name := p.rvarName(bd.Var)
		if c, ok := bd.Value.(*ir.RCall); ok && len(c.SInfoArgs) > 0 && sameInfo(c.Info, bd.Var.Info) {
			p.line(name + " = " + val)
			return
		}
		p.line(name + ": " + p.sinfo(bd.Var.Info, false) + " = " + val)
	}
}

func sameInfo(a, b ir.StructInfo) bool {
	if a == nil || b == nil {
		return a == b
	}
	return ir.Equal(a, b)
}

func (p *printer) ifBinding(v *ir.RVar, e *ir.RIf) {
	p.line("if " + p.rexpr(e.Cond) + ":")
	name := ""
	branch := func(s *ir.SeqExpr) {
		p.indent++
		p.seqBlocks(s)
		val := p.rexpr(s.Body)
		if name == "" {
			name = p.rvarName(v)
		}
		if sameInfo(v.Info, e.Info) {
			p.line(name + " = " + val)
		} else {
			p.line(name + ": " + p.sinfo(v.Info, false) + " = " + val)
		}
		p.indent--
	}
	branch(e.Then)
	p.line("else:")
	branch(e.Else)
}

// dim prints a dimension: int64 constants bare, other expressions as in
// TensorIR.
func (p *printer) dim(e ir.Expr) string { return p.dimPrec(e, 0) }

func (p *printer) dimPrec(e ir.Expr, ctx int) string {
	switch e := e.(type) {
	case *ir.IntImm:
		if e.Type == ir.Int64 {
			s := strconv.FormatInt(e.Value, 10)
			if e.Value < 0 {
				return paren(s, precUnary, ctx)
			}
			return s
		}
	case *ir.Binary:
		var prec int
		switch e.Op {
		case ir.OpAdd, ir.OpSub:
			prec = precAdd
		case ir.OpMul, ir.OpFloorDiv, ir.OpFloorMod:
			prec = precMul
		default:
			return p.exprPrec(e, ctx)
		}
		if e.A.DType() != ir.Int64 || e.B.DType() != ir.Int64 {
			return p.exprPrec(e, ctx)
		}
		return paren(p.dimPrec(e.A, prec)+" "+e.Op.Symbol()+" "+p.dimPrec(e.B, prec+1), prec, ctx)
	}
	return p.exprPrec(e, ctx)
}

func (p *printer) dims(es []ir.Expr, param bool) []string {
	out := make([]string, len(es))
	for i, e := range es {
		if x, ok := e.(*ir.Var); ok && param && x.Type == ir.Int64 {
			out[i] = pyQuote(p.varName(x))
			continue
		}
		out[i] = p.dim(e)
	}
	return out
}

// sinfo prints struct info; param prints bare symbolic dimensions as
// strings, as TVM does in parameter annotations.
func (p *printer) sinfo(s ir.StructInfo, param bool) string {
	switch s := s.(type) {
	case nil, *ir.ObjectStructInfo:
		return "R.Object"
	case *ir.PrimStructInfo:
		if s.Value != nil {
			return "R.Prim(value=" + p.dim(s.Value) + ")"
		}
		if ir.IsVoid(s.DType) {
			return "R.Prim"
		}
		return "R.Prim(" + pyQuote(s.DType.String()) + ")"
	case *ir.ShapeStructInfo:
		switch {
		case s.Values != nil:
			return "R.Shape([" + strings.Join(p.dims(s.Values, param), ", ") + "])"
		case s.NDim >= 0:
			return "R.Shape(ndim=" + strconv.Itoa(s.NDim) + ")"
		}
		return "R.Shape"
	case *ir.TensorStructInfo:
		var args []string
		if s.Shape != nil {
			ds := p.dims(s.Shape, param)
			if len(ds) == 1 {
				args = append(args, "("+ds[0]+",)")
			} else {
				args = append(args, "("+strings.Join(ds, ", ")+")")
			}
		}
		if !ir.IsVoid(s.DType) {
			args = append(args, "dtype="+pyQuote(s.DType.String()))
		}
		if s.Shape == nil && s.NDim >= 0 {
			args = append(args, "ndim="+strconv.Itoa(s.NDim))
		}
		if len(args) == 0 {
			return "R.Tensor"
		}
		return "R.Tensor(" + strings.Join(args, ", ") + ")"
	case *ir.TupleStructInfo:
		if len(s.Fields) == 0 {
			return "R.Tuple"
		}
		parts := make([]string, len(s.Fields))
		for i, f := range s.Fields {
			parts[i] = p.sinfo(f, param)
		}
		return "R.Tuple(" + strings.Join(parts, ", ") + ")"
	case *ir.FuncStructInfo:
		if s.Params == nil {
			return "R.Callable"
		}
		parts := make([]string, len(s.Params))
		for i, f := range s.Params {
			parts[i] = p.sinfo(f, param)
		}
		ps := "(" + strings.Join(parts, ", ") + ")"
		if len(parts) == 1 {
			ps = "(" + parts[0] + ",)"
		}
		pure := "False"
		if s.Pure {
			pure = "True"
		}
		return "R.Callable(" + ps + ", " + p.sinfo(s.Ret, param) + ", " + pure + ")"
	}
	return fmt.Sprintf("R.Object  # unprintable %T", s)
}

// rexpr prints a graph-level expression.
func (p *printer) rexpr(e ir.RExpr) string {
	switch e := e.(type) {
	case nil:
		return "None"
	case *ir.RVar:
		return p.rvarName(e)
	case *ir.GlobalVar:
		cls := p.cls
		if cls == "" {
			cls = "cls"
		}
		return cls + "." + e.Name
	case *ir.RCall:
		return p.call(e)
	case *ir.RTuple:
		parts := make([]string, len(e.Fields))
		for i, f := range e.Fields {
			parts[i] = p.rexpr(f)
		}
		if len(parts) == 1 {
			return "(" + parts[0] + ",)"
		}
		return "(" + strings.Join(parts, ", ") + ")"
	case *ir.TupleGetItem:
		return p.rexpr(e.Tuple) + "[" + strconv.Itoa(e.Index) + "]"
	case *ir.Constant:
		return p.constant(e)
	case *ir.ShapeExpr:
		return "R.shape([" + strings.Join(p.dims(e.Values, false), ", ") + "])"
	case *ir.PrimValue:
		return "R.prim_value(" + p.dim(e.Value) + ")"
	case *ir.RString:
		return "R.str(" + pyQuote(e.Value) + ")"
	case *ir.DataTypeImm:
		return "R.dtype(" + pyQuote(e.DType.String()) + ")"
	case *ir.ExternFunc:
		return "R.ExternFunc(" + pyQuote(e.Name) + ")"
	case *ir.Op:
		return "R." + strings.TrimPrefix(e.Name, "relax.")
	}
	return fmt.Sprintf("<unprintable %T>", e)
}

func (p *printer) call(c *ir.RCall) string {
	args := make([]string, 0, len(c.Args)+len(c.Attrs))
	switch fn := c.Op.(type) {
	case *ir.Op:
		switch fn.Name {
		case ir.OpCallTIR:
			if len(c.Args) >= 2 {
				args = append(args, p.rexpr(c.Args[0]), p.rexpr(c.Args[1]))
				out := "None"
				if len(c.SInfoArgs) == 1 {
					if t, ok := c.SInfoArgs[0].(*ir.TupleStructInfo); ok && len(t.Fields) > 0 {
						fs := make([]string, len(t.Fields))
						for i, f := range t.Fields {
							fs[i] = p.sinfo(f, false)
						}
						out = "[" + strings.Join(fs, ", ") + "]"
					} else {
						out = p.sinfo(c.SInfoArgs[0], false)
					}
				}
				args = append(args, "out_sinfo="+out)
				if len(c.Args) == 3 {
					args = append(args, "tir_vars="+p.rexpr(c.Args[2]))
				}
				return "R.call_tir(" + strings.Join(args, ", ") + ")"
			}
		case ir.OpCallPacked:
			if len(c.Args) >= 1 {
				if ef, ok := c.Args[0].(*ir.ExternFunc); ok {
					args = append(args, pyQuote(ef.Name))
					for _, a := range c.Args[1:] {
						args = append(args, p.rexpr(a))
					}
					ss := make([]string, len(c.SInfoArgs))
					for i, s := range c.SInfoArgs {
						ss[i] = p.sinfo(s, false)
					}
					sa := "(" + strings.Join(ss, ", ") + ")"
					if len(ss) == 1 {
						sa = "(" + ss[0] + ",)"
					}
					args = append(args, "sinfo_args="+sa)
					return "R.call_packed(" + strings.Join(args, ", ") + ")"
				}
			}
		}
		for _, a := range c.Args {
			args = append(args, p.rexpr(a))
		}
		if def, ok := op.Lookup(fn.Name); ok {
			for _, a := range def.Attrs {
				if v, ok := c.Attrs[a.Name]; ok {
					args = append(args, a.Name+"="+p.relaxAttr(v))
				}
			}
		} else {
			keys := make([]string, 0, len(c.Attrs))
			for k := range c.Attrs {
				keys = append(keys, k)
			}
			sortStrings(keys)
			for _, k := range keys {
				args = append(args, k+"="+p.relaxAttr(c.Attrs[k]))
			}
		}
		return p.rexpr(fn) + "(" + strings.Join(args, ", ") + ")"
	}
	for _, a := range c.Args {
		args = append(args, p.rexpr(a))
	}
	return p.rexpr(c.Op) + "(" + strings.Join(args, ", ") + ")"
}

// relaxAttr prints an operator attribute value.
func (p *printer) relaxAttr(v any) string {
	switch v := v.(type) {
	case nil:
		return "None"
	case bool:
		if v {
			return "True"
		}
		return "False"
	case []any:
		parts := make([]string, len(v))
		for i, x := range v {
			parts[i] = p.relaxAttr(x)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case float64:
		return floatText(v)
	}
	return p.attrValue(v)
}

func floatText(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return `float("inf")`
	case math.IsInf(f, -1):
		return `float("-inf")`
	case math.IsNaN(f):
		return `float("nan")`
	}
	return ir.FormatFloat(f)
}

// constant prints R.const(value, "dtype") with nested lists for tensors.
func (p *printer) constant(c *ir.Constant) string {
	size := c.DType.Size()
	n := int(c.Shape.NumElements())
	if size <= 0 || len(c.Data) != n*size {
		return fmt.Sprintf("R.const(0, %s)  # unprintable constant", pyQuote(c.DType.String()))
	}
	vals := make([]string, n)
	for i := range vals {
		vals[i] = scalarText(c.DType, c.Data[i*size:(i+1)*size])
	}
	var nest func(depth, off int) (string, int)
	nest = func(depth, off int) (string, int) {
		if depth == len(c.Shape) {
			return vals[off], off + 1
		}
		parts := make([]string, c.Shape[depth])
		for i := range parts {
			parts[i], off = nest(depth+1, off)
		}
		return "[" + strings.Join(parts, ", ") + "]", off
	}
	s, _ := nest(0, 0)
	return "R.const(" + s + ", " + pyQuote(c.DType.String()) + ")"
}

func scalarText(dt ir.DType, b []byte) string {
	switch {
	case dt == ir.Float32:
		return floatText(float64(math.Float32frombits(binary.LittleEndian.Uint32(b))))
	case dt == ir.Float64:
		return floatText(math.Float64frombits(binary.LittleEndian.Uint64(b)))
	case ir.IsBool(dt):
		if b[0] != 0 {
			return "True"
		}
		return "False"
	case dt.IsInt():
		var u uint64
		switch dt.Bits {
		case 8:
			u = uint64(b[0])
		case 16:
			u = uint64(binary.LittleEndian.Uint16(b))
		case 32:
			u = uint64(binary.LittleEndian.Uint32(b))
		case 64:
			u = binary.LittleEndian.Uint64(b)
		}
		if dt.Code == ir.Int32.Code && dt.Bits < 64 {
			shift := 64 - uint(dt.Bits)
			return strconv.FormatInt(int64(u<<shift)>>shift, 10)
		}
		if dt.Code == ir.Int32.Code {
			return strconv.FormatInt(int64(u), 10)
		}
		return strconv.FormatUint(u, 10)
	}
	return "0"
}
