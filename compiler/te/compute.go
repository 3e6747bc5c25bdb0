package te

import (
	"errors"
	"fmt"
	"math"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

// ComputeFunc is the closure of a Compute stage: it maps index expressions
// (one per dimension) to the element's value. Fixed-arity forms read like
// TVM's lambdas; the variadic and slice forms serve any rank.
type ComputeFunc interface {
	func(ir.Expr) ir.Expr |
		func(ir.Expr, ir.Expr) ir.Expr |
		func(ir.Expr, ir.Expr, ir.Expr) ir.Expr |
		func(ir.Expr, ir.Expr, ir.Expr, ir.Expr) ir.Expr |
		func(...ir.Expr) ir.Expr |
		func([]ir.Expr) ir.Expr
}

// defaultAxisNames names the index variables of a stage when the caller
// gives no names: i, j, k, l, then i4, i5 … beyond four dimensions.
var defaultAxisNames = []string{"i", "j", "k", "l"}

// Compute returns the tensor of the given shape whose element at indices
// is fn(indices) (TVM's te.compute). The value may be a reduction (Sum,
// Max, Min) as its outermost expression. axisNames optionally names the
// index variables (default i, j, k, l); the generated loops and block
// variables take these names.
//
// A mistake in the definition does not panic: the returned tensor carries
// the error (Err) and CreatePrimFunc reports it.
func Compute[F ComputeFunc](shape []ir.Expr, fn F, name string, axisNames ...string) *Tensor {
	t := &Tensor{Name: name, Shape: append([]ir.Expr(nil), shape...)}
	fail := func(err error) *Tensor {
		t.err = fmt.Errorf("compute %q: %w", name, err)
		if t.DType == (ir.DType{}) {
			t.DType = ir.Float32
		}
		t.buf = nil
		return t
	}
	if err := checkShape(name, shape); err != nil {
		return fail(errors.Unwrap(err))
	}
	axes := make([]*ir.Var, len(shape))
	idx := make([]ir.Expr, len(shape))
	for d, ext := range shape {
		n := ""
		switch {
		case d < len(axisNames) && axisNames[d] != "":
			n = axisNames[d]
		case len(shape) <= len(defaultAxisNames):
			n = defaultAxisNames[d]
		default:
			n = fmt.Sprintf("i%d", d)
		}
		axes[d] = ir.NewVar(n, ext.DType())
		idx[d] = axes[d]
	}
	body, err := call(fn, idx)
	if err != nil {
		return fail(err)
	}
	op, err := resolve(axes, body)
	if err != nil {
		return fail(err)
	}
	t.op = op
	if op.red != nil {
		t.DType = op.red.source.DType()
	} else {
		t.DType = op.value.DType()
	}
	if t.DType.Lanes != 1 {
		return fail(fmt.Errorf("value has vector dtype %s", t.DType))
	}
	t.buf = ir.NewBuffer(name, t.DType, t.Shape, "global")
	return t
}

// call applies fn to idx, turning an arity mismatch or a panic in the
// user's closure into an error.
func call[F ComputeFunc](fn F, idx []ir.Expr) (out ir.Expr, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the compute function panicked: %v", r)
		}
	}()
	arity := func(n int) error {
		if len(idx) != n {
			return fmt.Errorf("the compute function takes %d indices, the shape has %d dimensions", n, len(idx))
		}
		return nil
	}
	switch f := any(fn).(type) {
	case func(ir.Expr) ir.Expr:
		if err := arity(1); err != nil {
			return nil, err
		}
		out = f(idx[0])
	case func(ir.Expr, ir.Expr) ir.Expr:
		if err := arity(2); err != nil {
			return nil, err
		}
		out = f(idx[0], idx[1])
	case func(ir.Expr, ir.Expr, ir.Expr) ir.Expr:
		if err := arity(3); err != nil {
			return nil, err
		}
		out = f(idx[0], idx[1], idx[2])
	case func(ir.Expr, ir.Expr, ir.Expr, ir.Expr) ir.Expr:
		if err := arity(4); err != nil {
			return nil, err
		}
		out = f(idx[0], idx[1], idx[2], idx[3])
	case func(...ir.Expr) ir.Expr:
		out = f(idx...)
	case func([]ir.Expr) ir.Expr:
		out = f(idx)
	}
	if out == nil {
		return nil, errors.New("the compute function returned nil")
	}
	return out, nil
}

// reduceKind is the combiner of a reduction.
type reduceKind uint8

const (
	reduceSum reduceKind = iota
	reduceMax
	reduceMin
)

func (k reduceKind) String() string {
	return [...]string{"te.Sum", "te.Max", "te.Min"}[k]
}

// reduceExpr is Sum, Max or Min before Compute resolves it. It is an
// ir.Expr (of the source's dtype) by embedding.
type reduceExpr struct {
	*ir.Call
	kind   reduceKind
	source ir.Expr
	axes   []*Axis
}

func newReduce(kind reduceKind, source ir.Expr, axes []*Axis) ir.Expr {
	t := ir.Float32
	if source != nil {
		t = source.DType()
	}
	return &reduceExpr{Call: &ir.Call{Type: t, Op: kind.String()}, kind: kind, source: source, axes: axes}
}

// Sum is the sum of source over the reduce axes (TVM's te.sum); its
// identity is 0. It must be the outermost expression of a Compute.
func Sum(source ir.Expr, axes ...*Axis) ir.Expr { return newReduce(reduceSum, source, axes) }

// Max is the maximum of source over the reduce axes; its identity is the
// lowest value of the dtype.
func Max(source ir.Expr, axes ...*Axis) ir.Expr { return newReduce(reduceMax, source, axes) }

// Min is the minimum of source over the reduce axes; its identity is the
// highest value of the dtype.
func Min(source ir.Expr, axes ...*Axis) ir.Expr { return newReduce(reduceMin, source, axes) }

// identity returns the reducer's initial value in dtype t (TVM's min_value
// and max_value for Max and Min).
func (k reduceKind) identity(t ir.DType) ir.Expr {
	if k == reduceSum {
		return ir.Const(t, 0)
	}
	lo, hi := limits(t)
	if k == reduceMax {
		return lo
	}
	return hi
}

// limits returns the lowest and highest values of dtype t.
func limits(t ir.DType) (ir.Expr, ir.Expr) {
	switch {
	case t.IsFloat():
		m := math.MaxFloat64
		switch t.Bits {
		case 16:
			m = 65504
		case 32:
			m = math.MaxFloat32
		}
		return ir.NewFloatImm(t, -m), ir.NewFloatImm(t, m)
	case ir.IsBool(t):
		return ir.NewIntImm(t, 0), ir.NewIntImm(t, 1)
	case t.Code == ndarray.Int && t.Bits < 64:
		return ir.NewIntImm(t, -(1 << (t.Bits - 1))), ir.NewIntImm(t, 1<<(t.Bits-1)-1)
	case t.Code == ndarray.Int:
		return ir.NewIntImm(t, math.MinInt64), ir.NewIntImm(t, math.MaxInt64)
	case t.Bits < 64:
		return ir.NewIntImm(t, 0), ir.NewIntImm(t, 1<<t.Bits-1)
	}
	return ir.NewIntImm(t, 0), ir.NewIntImm(t, -1) // uint64: all ones
}

// combine applies the reducer to the accumulator and a new value.
func (k reduceKind) combine(acc, x ir.Expr) ir.Expr {
	switch k {
	case reduceMax:
		return ir.Max(acc, x)
	case reduceMin:
		return ir.Min(acc, x)
	}
	return ir.Add(acc, x)
}

// resolve checks a closure's result and replaces the package's
// placeholders (elements, axes, reductions) by plain IR.
func resolve(axes []*ir.Var, body ir.Expr) (*computeOp, error) {
	op := &computeOp{axes: axes}
	seen := map[*Tensor]bool{}
	var errs []error
	var active map[*Axis]bool // the axes of the reduction being resolved
	r := &ir.Rewriter{}
	r.Expr = func(e ir.Expr) ir.Expr {
		switch e := e.(type) {
		case *element:
			t := e.t
			if t.err != nil {
				errs = append(errs, fmt.Errorf("reads %q: %w", t.Name, t.err))
				return e.BufferLoad
			}
			if len(e.Indices) != len(t.Shape) {
				errs = append(errs, fmt.Errorf("tensor %q has %d dimensions, indexed with %d indices", t.Name, len(t.Shape), len(e.Indices)))
			}
			idx := make([]ir.Expr, len(e.Indices))
			for i, x := range e.Indices {
				if x == nil {
					errs = append(errs, fmt.Errorf("tensor %q indexed with a nil index", t.Name))
					return e.BufferLoad
				}
				idx[i] = r.RewriteExpr(x)
				if !ir.IsIndexType(idx[i].DType()) {
					errs = append(errs, fmt.Errorf("tensor %q indexed with %s of dtype %s, want an integer", t.Name, idx[i], idx[i].DType()))
				}
			}
			if !seen[t] {
				seen[t] = true
				op.inputs = append(op.inputs, t)
			}
			return &ir.BufferLoad{Buffer: t.buf, Indices: idx}
		case *Axis:
			if !active[e] {
				errs = append(errs, fmt.Errorf("reduce axis %q used outside a reduction over it", e.Name))
			}
			return e.Var
		case *reduceExpr:
			errs = append(errs, fmt.Errorf("%s must be the outermost expression of the compute", e.kind))
			return e.Call
		case *ir.BufferLoad:
			errs = append(errs, fmt.Errorf("reads buffer %q, which is not a tensor (use Tensor.At)", e.Buffer.Name))
		}
		return e
	}
	if red, ok := body.(*reduceExpr); ok {
		if red.source == nil {
			return nil, fmt.Errorf("%s of a nil source", red.kind)
		}
		if len(red.axes) == 0 {
			return nil, fmt.Errorf("%s over no reduce axis", red.kind)
		}
		active = map[*Axis]bool{}
		for _, a := range red.axes {
			if a == nil || a.Dom.Min == nil || a.Dom.Extent == nil {
				return nil, fmt.Errorf("%s over an incomplete reduce axis", red.kind)
			}
			if active[a] {
				return nil, fmt.Errorf("%s lists reduce axis %q twice", red.kind, a.Name)
			}
			active[a] = true
		}
		src := r.RewriteExpr(red.source)
		op.red = &reduction{kind: red.kind, source: src, axes: red.axes}
	} else {
		op.value = r.RewriteExpr(body)
	}
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return op, nil
}
