package topi

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
)

// finish returns t with the error its definition recorded, if any.
func finish(t *te.Tensor) (*te.Tensor, error) {
	if err := t.Err(); err != nil {
		return nil, err
	}
	return t, nil
}

// checkInputs rejects nil tensors and tensors whose definition failed.
func checkInputs(op string, ts ...*te.Tensor) error {
	for i, t := range ts {
		if t == nil {
			return fmt.Errorf("%s: input %d is nil", op, i)
		}
		if err := t.Err(); err != nil {
			return fmt.Errorf("%s: input %q: %w", op, t.Name, err)
		}
	}
	return nil
}

// names returns prefix0, prefix1, … (n names): TVM's C++ compute names its
// indices ax0, ax1…, a Python lambda *i names them i0, i1….
func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// iconst returns the integer constant v with like's dtype (an index type).
func iconst(like ir.Expr, v int64) ir.Expr {
	t := ir.Int64
	if like != nil && ir.IsIndexType(like.DType()) {
		t = like.DType()
	}
	return ir.NewIntImm(t, v)
}

// constDim returns a dimension's value when it folds to a constant.
func constDim(e ir.Expr) (int64, bool) { return ir.ConstDim(e) }

// shapeStr prints a shape for messages: (2, 3).
func shapeStr(s []ir.Expr) string { return ir.ShapeString(s) }

// normAxis maps axis into [0, ndim) or fails naming op.
func normAxis(op string, axis int64, ndim int) (int, error) {
	if axis < -int64(ndim) || axis >= int64(ndim) {
		return 0, fmt.Errorf("%s: axis %d out of range for a tensor of rank %d", op, axis, ndim)
	}
	if axis < 0 {
		axis += int64(ndim)
	}
	return int(axis), nil
}

// normAxes maps axes into [0, ndim), rejecting repeats.
func normAxes(op string, axes []int64, ndim int) ([]int, error) {
	out := make([]int, len(axes))
	seen := make([]bool, ndim)
	for i, a := range axes {
		n, err := normAxis(op, a, ndim)
		if err != nil {
			return nil, err
		}
		if seen[n] {
			return nil, fmt.Errorf("%s: axis %d repeated", op, a)
		}
		seen[n] = true
		out[i] = n
	}
	return out, nil
}

// product multiplies dimensions, folding constants.
func product(dims []ir.Expr) ir.Expr {
	var p ir.Expr
	for _, d := range dims {
		if p == nil {
			p = d
			continue
		}
		p = foldMul(p, d)
	}
	if p == nil {
		return ir.I64(1)
	}
	return p
}

// foldMul multiplies two dimensions, folding constants and ones.
func foldMul(a, b ir.Expr) ir.Expr {
	x, aok := constDim(a)
	y, bok := constDim(b)
	switch {
	case aok && bok:
		return iconst(a, x*y)
	case aok && x == 1:
		return b
	case bok && y == 1:
		return a
	}
	return ir.Mul(a, b)
}

// checkFloat rejects a non-float dtype for operators defined on floats.
func checkFloat(op string, t *te.Tensor) error {
	if !t.DType.IsFloat() {
		return fmt.Errorf("%s: input %q has dtype %s, want a float type", op, t.Name, t.DType)
	}
	return nil
}

// sameDType rejects inputs of different dtypes.
func sameDType(op string, ts ...*te.Tensor) error {
	for _, t := range ts[1:] {
		if t.DType != ts[0].DType {
			return fmt.Errorf("%s: dtypes %s and %s differ", op, ts[0].DType, t.DType)
		}
	}
	return nil
}

// toI64 converts an integer expression to int64, folding constants.
func toI64(e ir.Expr) ir.Expr {
	if e.DType() == ir.Int64 {
		return e
	}
	if c, ok := e.(*ir.IntImm); ok {
		return ir.I64(c.Value)
	}
	return ir.NewCast(ir.Int64, e)
}
