package op

import (
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

func parseDType(s string) (ir.DType, error) {
	t, err := ndarray.ParseDType(s)
	if err != nil {
		return ir.Void, fmt.Errorf("unknown dtype %q", s)
	}
	return t, nil
}

// name is the operator's short name for messages.
func name(c *ir.RCall) string {
	if o, ok := c.Op.(*ir.Op); ok {
		return strings.TrimPrefix(o.Name, "relax.")
	}
	return "call"
}

// tensor returns argument i's tensor struct info; an argument of unknown
// struct info is a tensor of unknown rank and dtype.
func tensor(c *ir.RCall, i int) (*ir.TensorStructInfo, error) {
	if i >= len(c.Args) {
		return nil, fmt.Errorf("%s: missing argument %d", name(c), i)
	}
	switch s := ir.StructInfoOf(c.Args[i]).(type) {
	case *ir.TensorStructInfo:
		return s, nil
	case *ir.ObjectStructInfo:
		return ir.TensorNDim(ir.Void, -1), nil
	default:
		return nil, fmt.Errorf("%s: argument %d is %s, want a tensor", name(c), i, s)
	}
}

// shapeStr prints a tensor's shape for messages: (2, 3), or a rank.
func shapeStr(t *ir.TensorStructInfo) string {
	switch {
	case t.Shape != nil:
		return ir.ShapeString(t.Shape)
	case t.NDim >= 0:
		return fmt.Sprintf("(rank %d)", t.NDim)
	}
	return "(unknown)"
}

func attrInt(c *ir.RCall, key string) (int64, bool) {
	n, ok := toInt(c.Attrs[key])
	return n, ok
}

func attrInts(c *ir.RCall, key string) ([]int64, bool) {
	l, ok := toInts(c.Attrs[key])
	if !ok {
		return nil, false
	}
	out := make([]int64, len(l))
	for i, x := range l {
		out[i] = x.(int64)
	}
	return out, true
}

func attrString(c *ir.RCall, key string, def string) string {
	if s, ok := c.Attrs[key].(string); ok {
		return s
	}
	return def
}

func attrBool(c *ir.RCall, key string) bool {
	b, _ := c.Attrs[key].(bool)
	return b
}

// attrDType returns a dtype attribute, Void for "void".
func attrDType(c *ir.RCall, key string) (ir.DType, error) {
	s := attrString(c, key, "void")
	if s == "void" || s == "" {
		return ir.Void, nil
	}
	return parseDType(s)
}

// normAxis maps axis into [0, ndim), or fails.
func normAxis(c *ir.RCall, axis int64, ndim int) (int, error) {
	if axis < -int64(ndim) || axis >= int64(ndim) {
		return 0, fmt.Errorf("%s: axis %d out of range for a tensor of rank %d", name(c), axis, ndim)
	}
	if axis < 0 {
		axis += int64(ndim)
	}
	return int(axis), nil
}

// normAxes maps axes into [0, ndim) and rejects repeats.
func normAxes(c *ir.RCall, axes []int64, ndim int) ([]int, error) {
	out := make([]int, len(axes))
	seen := map[int]bool{}
	for i, a := range axes {
		n, err := normAxis(c, a, ndim)
		if err != nil {
			return nil, err
		}
		if seen[n] {
			return nil, fmt.Errorf("%s: axis %d repeated", name(c), a)
		}
		seen[n] = true
		out[i] = n
	}
	return out, nil
}

// unifyDType returns the common dtype of a and b (Void when unknown) or an
// error when both are known and differ.
func unifyDType(c *ir.RCall, a, b ir.DType) (ir.DType, error) {
	switch {
	case ir.IsVoid(a):
		return b, nil
	case ir.IsVoid(b) || a == b:
		return a, nil
	}
	return ir.Void, fmt.Errorf("%s: dtypes %s and %s differ", name(c), a, b)
}

// broadcastShapes applies numpy broadcasting to two shapes. ok is false
// when a dimension cannot be decided statically (symbolic against a
// constant other than 1); the result then has only a rank.
func broadcastShapes(a, b []ir.Expr) (out []ir.Expr, known bool, err error) {
	n := max(len(a), len(b))
	out = make([]ir.Expr, n)
	known = true
	for i := 0; i < n; i++ {
		var x, y ir.Expr
		if j := len(a) - n + i; j >= 0 {
			x = a[j]
		}
		if j := len(b) - n + i; j >= 0 {
			y = b[j]
		}
		switch {
		case x == nil:
			out[i] = y
		case y == nil:
			out[i] = x
		default:
			cx, xok := ir.ConstDim(x)
			cy, yok := ir.ConstDim(y)
			switch {
			case xok && cx == 1:
				out[i] = y
			case yok && cy == 1:
				out[i] = x
			case xok && yok:
				if cx != cy {
					return nil, false, fmt.Errorf("dimension %d: %d against %d", i, cx, cy)
				}
				out[i] = x
			case ir.DimEqual(x, y):
				out[i] = x
			default:
				known = false
			}
		}
	}
	return out, known, nil
}

// broadcast returns the struct info of an elementwise operation over ts
// with result dtype dt (Void: unify the inputs' dtypes).
func broadcast(c *ir.RCall, dt ir.DType, ts ...*ir.TensorStructInfo) (ir.StructInfo, error) {
	common := ir.Void
	var err error
	for _, t := range ts {
		if common, err = unifyDType(c, common, t.DType); err != nil {
			return nil, err
		}
	}
	if ir.IsVoid(dt) {
		dt = common
	}
	ndim, allKnown := 0, true
	for _, t := range ts {
		if t.NDim < 0 {
			return ir.TensorNDim(dt, -1), nil
		}
		ndim = max(ndim, t.NDim)
		allKnown = allKnown && t.Shape != nil
	}
	if !allKnown {
		return ir.TensorNDim(dt, ndim), nil
	}
	shape := ts[0].Shape
	for _, t := range ts[1:] {
		out, known, err := broadcastShapes(shape, t.Shape)
		if err != nil {
			strs := make([]string, len(ts))
			for j, t := range ts {
				strs[j] = shapeStr(t)
			}
			return nil, fmt.Errorf("%s: shapes %s do not broadcast", name(c), joinAnd(strs))
		}
		if !known {
			return ir.TensorNDim(dt, ndim), nil
		}
		shape = out
	}
	return ir.Tensor(dt, shape...), nil
}

func joinAnd(s []string) string {
	if len(s) <= 2 {
		return strings.Join(s, " and ")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

func dimAdd(a, b ir.Expr) ir.Expr { return ir.FoldDim(ir.Add(a, b)) }
func dimSub(a, b ir.Expr) ir.Expr { return ir.FoldDim(ir.Sub(a, b)) }
func dimMul(a, b ir.Expr) ir.Expr { return ir.FoldDim(ir.Mul(a, b)) }
func dimDiv(a, b ir.Expr) ir.Expr { return ir.FoldDim(ir.FloorDiv(a, b)) }
func i64(v int64) ir.Expr         { return ir.I64(v) }

// product multiplies dimensions.
func product(dims []ir.Expr) ir.Expr {
	var p ir.Expr = ir.I64(1)
	for _, d := range dims {
		p = dimMul(p, d)
	}
	return p
}
