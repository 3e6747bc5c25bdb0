package schedule

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// IndexMap maps the indices of a buffer to those of a new layout: Vars
// stand for the old indices, one per dimension, and Indices are the new
// ones, integer expressions of Vars with + - * // % and constants (TVM's
// IndexMap, written lambda i, j: (i // 16, j, i % 16) in a trace).
type IndexMap struct {
	Vars    []*ir.Var
	Indices []ir.Expr
}

// NewIndexMap returns the map of n indices (int32 variables named i0, i1
// …) that f gives.
func NewIndexMap(n int, f func(ix ...ir.Expr) []ir.Expr) *IndexMap {
	m := &IndexMap{}
	args := make([]ir.Expr, n)
	for i := range n {
		v := ir.NewVar(fmt.Sprintf("i%d", i), ir.Int32)
		m.Vars = append(m.Vars, v)
		args[i] = v
	}
	m.Indices = f(args...)
	return m
}

// ParseIndexMap reads an index map as String prints it:
// lambda i, j: (i // 16, j, i % 16). The variables are int32.
func ParseIndexMap(text string) (*IndexMap, error) {
	p := &pyParser{src: text}
	if p.ident() != "lambda" {
		return nil, fmt.Errorf("index map %q: want lambda vars: (indices)", text)
	}
	m, err := p.indexMap()
	if err != nil {
		return nil, fmt.Errorf("index map %q: %w", text, err)
	}
	p.space()
	if p.pos != len(p.src) {
		return nil, fmt.Errorf("index map %q: unexpected %q at the end", text, p.src[p.pos:])
	}
	return m, nil
}

// String prints the map as a Python lambda.
func (m *IndexMap) String() string {
	names := make([]string, len(m.Vars))
	for i, v := range m.Vars {
		names[i] = v.Name
	}
	ix := make([]string, len(m.Indices))
	for i, e := range m.Indices {
		ix[i] = pyExpr(e, 0)
	}
	tuple := strings.Join(ix, ", ")
	if len(ix) == 1 {
		tuple += ","
	}
	return fmt.Sprintf("lambda %s: (%s)", strings.Join(names, ", "), tuple)
}

// apply returns the new indices of old indices idx.
func (m *IndexMap) apply(idx []ir.Expr) []ir.Expr {
	vmap := map[*ir.Var]ir.Expr{}
	for i, v := range m.Vars {
		vmap[v] = idx[i]
	}
	out := make([]ir.Expr, len(m.Indices))
	for i, e := range m.Indices {
		out[i] = ir.SubstituteExpr(e, vmap)
		if len(idx) > 0 && idx[0].DType() != ir.Int32 {
			// The map's constants take the type of the buffer's indices.
			t := idx[0].DType()
			out[i] = (&ir.Rewriter{Expr: func(x ir.Expr) ir.Expr {
				if n, ok := x.(*ir.IntImm); ok && n.Type == ir.Int32 {
					return ir.NewIntImm(t, n.Value)
				}
				return x
			}}).RewriteExpr(out[i])
		}
	}
	return out
}

// compile returns a function computing the map at a point into out; it
// reports false on a division by zero.
func (m *IndexMap) compile() (func(point, out []int64) bool, error) {
	fs := make([]func([]int64) (int64, bool), len(m.Indices))
	for i, e := range m.Indices {
		f, err := compileInt(e, m.Vars)
		if err != nil {
			return nil, err
		}
		fs[i] = f
	}
	return func(point, out []int64) bool {
		for i, f := range fs {
			x, ok := f(point)
			if !ok {
				return false
			}
			out[i] = x
		}
		return true
	}, nil
}

// compileInt compiles integer arithmetic over vars (point[i] is vars[i]).
func compileInt(e ir.Expr, vars []*ir.Var) (func([]int64) (int64, bool), error) {
	switch n := e.(type) {
	case *ir.IntImm:
		c := n.Value
		return func([]int64) (int64, bool) { return c, true }, nil
	case *ir.Var:
		i := slices.Index(vars, n)
		if i < 0 {
			return nil, fmt.Errorf("%q is not a variable of the map", n.Name)
		}
		return func(p []int64) (int64, bool) { return p[i], true }, nil
	case *ir.Cast:
		return compileInt(n.Value, vars)
	case *ir.Binary:
		a, err := compileInt(n.A, vars)
		if err != nil {
			return nil, err
		}
		b, err := compileInt(n.B, vars)
		if err != nil {
			return nil, err
		}
		var op func(x, y int64) (int64, bool)
		switch n.Op {
		case ir.OpAdd:
			op = func(x, y int64) (int64, bool) { return x + y, true }
		case ir.OpSub:
			op = func(x, y int64) (int64, bool) { return x - y, true }
		case ir.OpMul:
			op = func(x, y int64) (int64, bool) { return x * y, true }
		case ir.OpFloorDiv:
			op = func(x, y int64) (int64, bool) { return floorDivSafe(x, y) }
		case ir.OpFloorMod:
			op = func(x, y int64) (int64, bool) {
				q, ok := floorDivSafe(x, y)
				return x - q*y, ok
			}
		case ir.OpMin:
			op = func(x, y int64) (int64, bool) { return min(x, y), true }
		case ir.OpMax:
			op = func(x, y int64) (int64, bool) { return max(x, y), true }
		default:
			return nil, fmt.Errorf("%s is not integer arithmetic an index map can hold", e)
		}
		return func(p []int64) (int64, bool) {
			x, ok1 := a(p)
			y, ok2 := b(p)
			if !ok1 || !ok2 {
				return 0, false
			}
			return op(x, y)
		}, nil
	}
	return nil, fmt.Errorf("%s is not integer arithmetic an index map can hold", e)
}

func floorDivSafe(x, y int64) (int64, bool) {
	if y == 0 {
		return 0, false
	}
	return floorDiv(x, y), true
}

// pyExpr prints an index expression in Python, parenthesized for the
// precedence prec of its context (0 none, 1 + -, 2 * // %).
func pyExpr(e ir.Expr, prec int) string {
	switch n := e.(type) {
	case *ir.IntImm:
		if n.Value < 0 && prec > 0 {
			return fmt.Sprintf("(%d)", n.Value)
		}
		return fmt.Sprint(n.Value)
	case *ir.Var:
		return n.Name
	case *ir.Cast:
		return pyExpr(n.Value, prec)
	case *ir.Binary:
		var op string
		p := 2
		switch n.Op {
		case ir.OpAdd:
			op, p = "+", 1
		case ir.OpSub:
			op, p = "-", 1
		case ir.OpMul:
			op = "*"
		case ir.OpFloorDiv:
			op = "//"
		case ir.OpFloorMod:
			op = "%"
		case ir.OpMin, ir.OpMax:
			name := "min"
			if n.Op == ir.OpMax {
				name = "max"
			}
			return fmt.Sprintf("%s(%s, %s)", name, pyExpr(n.A, 0), pyExpr(n.B, 0))
		default:
			return e.String()
		}
		s := pyExpr(n.A, p) + " " + op + " " + pyExpr(n.B, p+1)
		if p < prec {
			s = "(" + s + ")"
		}
		return s
	}
	return e.String()
}

// indexMap reads "vars: (indices)" after the word lambda.
func (p *pyParser) indexMap() (*IndexMap, error) {
	m := &IndexMap{}
	env := map[string]*ir.Var{}
	for {
		name := p.ident()
		if name == "" {
			return nil, p.errorf("want a variable name after lambda")
		}
		if env[name] != nil {
			return nil, p.errorf("variable %q appears twice", name)
		}
		v := ir.NewVar(name, ir.Int32)
		env[name] = v
		m.Vars = append(m.Vars, v)
		if p.eat(":") {
			break
		}
		if !p.eat(",") {
			return nil, p.errorf("want , or : after the lambda's variables")
		}
	}
	paren := p.eat("(")
	for {
		if paren && p.eat(")") {
			break
		}
		e, err := p.indexExpr(env, 0)
		if err != nil {
			return nil, err
		}
		m.Indices = append(m.Indices, e)
		if !p.eat(",") {
			if paren && !p.eat(")") {
				return nil, p.errorf("want , or ) in the lambda's indices")
			}
			break
		}
		if !paren && (p.peek() == ',' || p.peek() == ')' || p.peek() == 0) {
			break
		}
	}
	if len(m.Indices) == 0 {
		return nil, p.errorf("the lambda has no indices")
	}
	return m, nil
}

// indexExpr reads an integer expression of the lambda's variables with
// operators of precedence at least prec.
func (p *pyParser) indexExpr(env map[string]*ir.Var, prec int) (ir.Expr, error) {
	var lhs ir.Expr
	switch c := p.peek(); {
	case c == '(':
		p.pos++
		e, err := p.indexExpr(env, 0)
		if err != nil {
			return nil, err
		}
		if !p.eat(")") {
			return nil, p.errorf("want )")
		}
		lhs = e
	case c == '-':
		p.pos++
		e, err := p.indexExpr(env, 3)
		if err != nil {
			return nil, err
		}
		if k, ok := ir.IsConstInt(e); ok {
			lhs = ir.I32(-k)
		} else {
			lhs = ir.NewBinary(ir.OpSub, ir.I32(0), e)
		}
	case c >= '0' && c <= '9':
		start := p.pos
		for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
			p.pos++
		}
		var k int64
		if _, err := fmt.Sscan(p.src[start:p.pos], &k); err != nil {
			return nil, p.errorf("bad integer %q", p.src[start:p.pos])
		}
		lhs = ir.I32(k)
	default:
		name := p.ident()
		switch {
		case name == "min" || name == "max":
			if !p.eat("(") {
				return nil, p.errorf("want ( after %s", name)
			}
			a, err := p.indexExpr(env, 0)
			if err != nil {
				return nil, err
			}
			if !p.eat(",") {
				return nil, p.errorf("want , in %s(a, b)", name)
			}
			b, err := p.indexExpr(env, 0)
			if err != nil {
				return nil, err
			}
			if !p.eat(")") {
				return nil, p.errorf("want ) after %s(a, b", name)
			}
			op := ir.OpMin
			if name == "max" {
				op = ir.OpMax
			}
			lhs = ir.NewBinary(op, a, b)
		case env[name] != nil:
			lhs = env[name]
		case name == "":
			return nil, p.errorf("want an index expression")
		default:
			return nil, p.errorf("%q is not a variable of the lambda", name)
		}
	}
	for {
		var op ir.BinaryOp
		var q int
		switch {
		case p.eat("//"):
			op, q = ir.OpFloorDiv, 2
		case p.peek() == '*':
			p.pos++
			op, q = ir.OpMul, 2
		case p.peek() == '%':
			p.pos++
			op, q = ir.OpFloorMod, 2
		case p.peek() == '+':
			p.pos++
			op, q = ir.OpAdd, 1
		case p.peek() == '-':
			p.pos++
			op, q = ir.OpSub, 1
		default:
			return lhs, nil
		}
		if q < prec {
			// Not ours: give the operator back.
			p.pos -= len(map[ir.BinaryOp]string{ir.OpFloorDiv: "//"}[op])
			if op != ir.OpFloorDiv {
				p.pos--
			}
			return lhs, nil
		}
		rhs, err := p.indexExpr(env, q+1)
		if err != nil {
			return nil, err
		}
		lhs = ir.NewBinary(op, lhs, rhs)
	}
}
