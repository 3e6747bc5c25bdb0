package topi

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
)

// Reductions over axes, as TVM's topi.sum/max/min (stage <input>_red,
// spatial indices ax0…, reduce axes k<dim>), mean (then T_divide),
// variance and std, and argmax/argmin (stages <input>_red_temp and
// <input>_red).

// reducePlan describes a reduction of x over some axes.
type reducePlan struct {
	x       *te.Tensor
	reduced []bool
	keep    bool
	out     []ir.Expr // output shape
}

// planReduce checks axes (nil = all) against x.
func planReduce(op string, x *te.Tensor, axes []int64, keep bool) (*reducePlan, error) {
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	p := &reducePlan{x: x, reduced: make([]bool, len(x.Shape)), keep: keep}
	if axes == nil {
		for i := range p.reduced {
			p.reduced[i] = true
		}
	} else {
		ax, err := normAxes(op, axes, len(x.Shape))
		if err != nil {
			return nil, err
		}
		for _, a := range ax {
			p.reduced[a] = true
		}
	}
	for i, d := range x.Shape {
		switch {
		case !p.reduced[i]:
			p.out = append(p.out, d)
		case keep:
			p.out = append(p.out, iconst(d, 1))
		}
	}
	return p, nil
}

// count is the number of elements each output element reduces.
func (p *reducePlan) count() ir.Expr {
	var dims []ir.Expr
	for i, d := range p.x.Shape {
		if p.reduced[i] {
			dims = append(dims, d)
		}
	}
	return product(dims)
}

// axes returns one reduce axis per reduced dimension (k<dim>).
func (p *reducePlan) axes() []*te.Axis {
	var ks []*te.Axis
	for i, d := range p.x.Shape {
		if p.reduced[i] {
			ks = append(ks, te.ReduceAxis(ir.RangeFromExtent(d), fmt.Sprintf("k%d", i)))
		}
	}
	return ks
}

// source returns x's index for output index idx and reduce axes ks.
func (p *reducePlan) source(idx []ir.Expr, ks []*te.Axis) []ir.Expr {
	sub := make([]ir.Expr, len(p.x.Shape))
	j, r := 0, 0
	for i := range p.x.Shape {
		if p.reduced[i] {
			sub[i] = ks[r]
			r++
			if p.keep {
				j++
			}
			continue
		}
		sub[i] = idx[j]
		j++
	}
	return sub
}

// outIndex maps an index of x (with reduced dimensions at any value) to
// the reduction's output index.
func (p *reducePlan) outIndex(sub []ir.Expr) []ir.Expr {
	var out []ir.Expr
	for i, e := range sub {
		switch {
		case !p.reduced[i]:
			out = append(out, e)
		case p.keep:
			out = append(out, iconst(p.x.Shape[i], 0))
		}
	}
	return out
}

// compute builds a stage reducing fn(x[…]) with reducer red (te.Sum,
// te.Max or te.Min); a reduction over no axis copies fn(x[…]).
func (p *reducePlan) compute(stage string, red func(ir.Expr, ...*te.Axis) ir.Expr, fn func(idx, sub []ir.Expr) ir.Expr) (*te.Tensor, error) {
	ks := p.axes()
	return finish(te.Compute(p.out, func(idx []ir.Expr) ir.Expr {
		sub := p.source(idx, ks)
		v := fn(idx, sub)
		if len(ks) == 0 {
			return v
		}
		return red(v, ks...)
	}, stage, names("ax", len(p.out))...))
}

// Sum adds x over axes (nil: all); keepdims keeps them as dimensions of 1.
func Sum(x *te.Tensor, axes []int64, keepdims bool) (*te.Tensor, error) {
	return commReduce("sum", x, axes, keepdims, te.Sum)
}

// Max is the maximum of x over axes (nil: all).
func Max(x *te.Tensor, axes []int64, keepdims bool) (*te.Tensor, error) {
	return commReduce("max", x, axes, keepdims, te.Max)
}

// Min is the minimum of x over axes (nil: all).
func Min(x *te.Tensor, axes []int64, keepdims bool) (*te.Tensor, error) {
	return commReduce("min", x, axes, keepdims, te.Min)
}

func commReduce(op string, x *te.Tensor, axes []int64, keep bool, red func(ir.Expr, ...*te.Axis) ir.Expr) (*te.Tensor, error) {
	p, err := planReduce(op, x, axes, keep)
	if err != nil {
		return nil, err
	}
	return p.compute(x.Name+"_red", red, func(_, sub []ir.Expr) ir.Expr { return x.At(sub...) })
}

// Mean is the average of x over axes (nil: all): a sum, then T_divide by
// the count (integer division for integer dtypes).
func Mean(x *te.Tensor, axes []int64, keepdims bool) (*te.Tensor, error) {
	p, err := planReduce("mean", x, axes, keepdims)
	if err != nil {
		return nil, err
	}
	s, err := p.compute(x.Name+"_red", te.Sum, func(_, sub []ir.Expr) ir.Expr { return x.At(sub...) })
	if err != nil {
		return nil, err
	}
	n := castScalar(p.count(), x.DType)
	return finish(te.Compute(p.out, func(idx []ir.Expr) ir.Expr {
		return ir.Div(s.At(idx...), n)
	}, "T_divide", names("ax", len(p.out))...))
}

// Variance is the population variance of x over axes (nil: all): the
// mean (kept dimensions), the sum of squared deviations, T_divide by the
// count. With std it is followed by T_sqrt.
func Variance(x *te.Tensor, axes []int64, keepdims, std bool) (*te.Tensor, error) {
	op := "variance"
	if std {
		op = "std"
	}
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	if err := checkFloat(op, x); err != nil {
		return nil, err
	}
	mean, err := Mean(x, axes, true)
	if err != nil {
		return nil, err
	}
	pm, _ := planReduce(op, x, axes, true)
	p, _ := planReduce(op, x, axes, keepdims)
	sq, err := p.compute("T_multiply_red", te.Sum, func(_, sub []ir.Expr) ir.Expr {
		d := ir.Sub(x.At(sub...), mean.At(pm.outIndex(sub)...))
		return ir.Mul(d, d)
	})
	if err != nil {
		return nil, err
	}
	n := castScalar(p.count(), x.DType)
	v, err := finish(te.Compute(p.out, func(idx []ir.Expr) ir.Expr {
		return ir.Div(sq.At(idx...), n)
	}, "T_divide_1", names("ax", len(p.out))...))
	if err != nil || !std {
		return v, err
	}
	return Unary("sqrt", v)
}

// Argmax returns the int64 index of the first maximum of x along axis, or
// in the flattened x when axis is nil.
func Argmax(x *te.Tensor, axis *int64, keepdims bool) (*te.Tensor, error) {
	return argReduce("argmax", x, axis, keepdims, te.Max)
}

// Argmin returns the int64 index of the first minimum of x along axis, or
// in the flattened x when axis is nil.
func Argmin(x *te.Tensor, axis *int64, keepdims bool) (*te.Tensor, error) {
	return argReduce("argmin", x, axis, keepdims, te.Min)
}

func argReduce(op string, x *te.Tensor, axis *int64, keep bool, red func(ir.Expr, ...*te.Axis) ir.Expr) (*te.Tensor, error) {
	var axes []int64
	if axis != nil {
		axes = []int64{*axis}
	}
	p, err := planReduce(op, x, axes, keep)
	if err != nil {
		return nil, err
	}
	best, err := p.compute(x.Name+"_red_temp", red, func(_, sub []ir.Expr) ir.Expr { return x.At(sub...) })
	if err != nil {
		return nil, err
	}
	// The first position holding the best value: the smallest linear
	// index over the reduced dimensions where x equals it.
	var rdims []ir.Expr
	for i, d := range x.Shape {
		if p.reduced[i] {
			rdims = append(rdims, d)
		}
	}
	total := toI64(product(rdims))
	return p.compute(x.Name+"_red", te.Min, func(idx, sub []ir.Expr) ir.Expr {
		var lin ir.Expr
		for i, d := range x.Shape {
			switch {
			case !p.reduced[i]:
			case lin == nil:
				lin = toI64(sub[i])
			default:
				lin = ir.Add(ir.Mul(lin, toI64(d)), toI64(sub[i]))
			}
		}
		if lin == nil {
			return ir.I64(0)
		}
		return ir.NewSelect(ir.EQ(x.At(sub...), best.At(idx...)), lin, total)
	})
}
