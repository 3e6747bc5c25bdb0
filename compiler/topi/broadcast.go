package topi

import (
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
)

// Binary elementwise operators with numpy broadcasting, named after
// TVM's topi (stage T_add, T_multiply…, indices ax0, ax1…).

// BroadcastShape returns the numpy broadcast of shapes: dimensions are
// aligned on the right, a dimension of 1 stretches to the other. Two
// different constants, or a symbolic dimension against a constant other
// than 1 or against a different expression, are errors naming op.
func BroadcastShape(op string, shapes ...[]ir.Expr) ([]ir.Expr, error) {
	n := 0
	for _, s := range shapes {
		n = max(n, len(s))
	}
	out := make([]ir.Expr, n)
	for i := 0; i < n; i++ {
		var cur ir.Expr
		for _, s := range shapes {
			j := len(s) - n + i
			if j < 0 {
				continue
			}
			d := s[j]
			if cur == nil {
				cur = d
				continue
			}
			switch cd, cok := constDim(cur); {
			case cok && cd == 1:
				cur = d
			case isOne(d) || ir.DimEqual(cur, d):
			default:
				return nil, broadcastErr(op, shapes)
			}
		}
		out[i] = cur
	}
	return out, nil
}

func isOne(d ir.Expr) bool {
	v, ok := constDim(d)
	return ok && v == 1
}

func broadcastErr(op string, shapes [][]ir.Expr) error {
	strs := make([]string, len(shapes))
	for i, s := range shapes {
		strs[i] = shapeStr(s)
	}
	and := strings.Join(strs, " and ")
	if len(strs) > 2 {
		and = strings.Join(strs[:len(strs)-1], ", ") + " and " + strs[len(strs)-1]
	}
	return fmt.Errorf("%s: shapes %s do not broadcast", op, and)
}

// broadcastIndex maps output indices to the indices of an input of shape
// in, broadcast to out: a dimension of 1 against a larger one reads index
// 0 (TVM's InputIndexFromBroadcast).
func broadcastIndex(in, out []ir.Expr, idx []ir.Expr) []ir.Expr {
	off := len(out) - len(in)
	res := make([]ir.Expr, len(in))
	for j, d := range in {
		o := off + j
		if isOne(d) && !isOne(out[o]) {
			res[j] = iconst(idx[o], 0)
		} else {
			res[j] = idx[o]
		}
	}
	return res
}

// broadcastBinary builds stage name computing fn(a[…], b[…]) over the
// broadcast shape.
func broadcastBinary(op, stage string, a, b *te.Tensor, fn func(x, y ir.Expr) ir.Expr) (*te.Tensor, error) {
	if err := checkInputs(op, a, b); err != nil {
		return nil, err
	}
	if err := sameDType(op, a, b); err != nil {
		return nil, err
	}
	out, err := BroadcastShape(op, a.Shape, b.Shape)
	if err != nil {
		return nil, err
	}
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		return fn(a.At(broadcastIndex(a.Shape, out, idx)...), b.At(broadcastIndex(b.Shape, out, idx)...))
	}, stage, names("ax", len(out))...))
}

// Add returns a + b (stage T_add).
func Add(a, b *te.Tensor) (*te.Tensor, error) { return broadcastBinary("add", "T_add", a, b, ir.Add) }

// Subtract returns a - b (stage T_subtract).
func Subtract(a, b *te.Tensor) (*te.Tensor, error) {
	return broadcastBinary("subtract", "T_subtract", a, b, ir.Sub)
}

// Multiply returns a * b (stage T_multiply).
func Multiply(a, b *te.Tensor) (*te.Tensor, error) {
	return broadcastBinary("multiply", "T_multiply", a, b, ir.Mul)
}

// Divide returns a / b (stage T_divide): true division for floats,
// truncating division for integers, as TVM's topi.divide.
func Divide(a, b *te.Tensor) (*te.Tensor, error) {
	return broadcastBinary("divide", "T_divide", a, b, ir.Div)
}

// FloorDivide returns floor(a / b) (stage T_floor_divide).
func FloorDivide(a, b *te.Tensor) (*te.Tensor, error) {
	return broadcastBinary("floor_divide", "T_floor_divide", a, b, func(x, y ir.Expr) ir.Expr {
		if x.DType().IsFloat() {
			return ir.Floor(ir.Div(x, y))
		}
		return ir.FloorDiv(x, y)
	})
}

// Power returns a ** b (stage T_power). Integer operands are raised in
// float64 and converted back.
func Power(a, b *te.Tensor) (*te.Tensor, error) {
	return broadcastBinary("power", "T_power", a, b, func(x, y ir.Expr) ir.Expr {
		if x.DType().IsFloat() {
			return ir.Pow(x, y)
		}
		return ir.NewCast(x.DType(), ir.Pow(ir.NewCast(ir.Float64, x), ir.NewCast(ir.Float64, y)))
	})
}

// Maximum returns max(a, b) elementwise (stage T_maximum).
func Maximum(a, b *te.Tensor) (*te.Tensor, error) {
	return broadcastBinary("maximum", "T_maximum", a, b, ir.Max)
}

// Minimum returns min(a, b) elementwise (stage T_minimum).
func Minimum(a, b *te.Tensor) (*te.Tensor, error) {
	return broadcastBinary("minimum", "T_minimum", a, b, ir.Min)
}

// Compare returns the boolean tensor a OP b for op one of "equal",
// "not_equal", "less", "less_equal", "greater", "greater_equal" (stage
// T_<op>).
func Compare(op string, a, b *te.Tensor) (*te.Tensor, error) {
	fns := map[string]func(x, y ir.Expr) ir.Expr{
		"equal": ir.EQ, "not_equal": ir.NE, "less": ir.LT, "less_equal": ir.LE, "greater": ir.GT, "greater_equal": ir.GE,
	}
	fn, ok := fns[op]
	if !ok {
		return nil, fmt.Errorf("compare: unknown comparison %q", op)
	}
	return broadcastBinary(op, "T_"+op, a, b, fn)
}

// BroadcastTo returns x broadcast to shape (stage T_broadcast_to).
func BroadcastTo(x *te.Tensor, shape []ir.Expr) (*te.Tensor, error) {
	const op = "broadcast_to"
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	if len(shape) < len(x.Shape) {
		return nil, fmt.Errorf("%s: cannot broadcast shape %s to %s", op, shapeStr(x.Shape), shapeStr(shape))
	}
	off := len(shape) - len(x.Shape)
	for j, d := range x.Shape {
		if !isOne(d) && !ir.DimEqual(d, shape[off+j]) {
			return nil, fmt.Errorf("%s: cannot broadcast shape %s to %s", op, shapeStr(x.Shape), shapeStr(shape))
		}
	}
	return finish(te.Compute(shape, func(idx []ir.Expr) ir.Expr {
		return x.At(broadcastIndex(x.Shape, shape, idx)...)
	}, "T_broadcast_to", names("ax", len(shape))...))
}
