package topi

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
)

// Normalizations: softmax and log_softmax (TVM's stages
// T_softmax_maxelem, T_softmax_exp, T_softmax_expsum, T_softmax_norm),
// layer_norm and batch_norm (inference).

// dropAxis returns shape without dimension axis.
func dropAxis(shape []ir.Expr, axis int) []ir.Expr {
	return append(append([]ir.Expr{}, shape[:axis]...), shape[axis+1:]...)
}

// withAxis returns idx with v inserted at position axis.
func withAxis(idx []ir.Expr, axis int, v ir.Expr) []ir.Expr {
	out := append([]ir.Expr{}, idx[:axis]...)
	out = append(out, v)
	return append(out, idx[axis:]...)
}

// softmaxStages builds the max and the sum of exp(x - max) along axis;
// with keepExp, exp(x - max) is a stage of its own (T_softmax_exp) that
// the sum reads, so the caller reuses it rather than computing it again.
func softmaxStages(op string, x *te.Tensor, axis int64, keepExp bool) (ax int, maxel, exps, expsum *te.Tensor, err error) {
	if err := checkInputs(op, x); err != nil {
		return 0, nil, nil, nil, err
	}
	if err := checkFloat(op, x); err != nil {
		return 0, nil, nil, nil, err
	}
	if ax, err = normAxis(op, axis, len(x.Shape)); err != nil {
		return 0, nil, nil, nil, err
	}
	red := dropAxis(x.Shape, ax)
	n := len(red)
	k := te.ReduceAxis(ir.RangeFromExtent(x.Shape[ax]), "k")
	if maxel, err = finish(te.Compute(red, func(idx []ir.Expr) ir.Expr {
		return te.Max(x.At(withAxis(idx, ax, k)...), k)
	}, "T_softmax_maxelem", names("i", n)...)); err != nil {
		return 0, nil, nil, nil, err
	}
	expAt := func(idx []ir.Expr) ir.Expr {
		return ir.Exp(ir.Sub(x.At(idx...), maxel.At(dropAxis(idx, ax)...)))
	}
	if keepExp {
		if exps, err = finish(te.Compute(x.Shape, expAt, "T_softmax_exp", names("i", len(x.Shape))...)); err != nil {
			return 0, nil, nil, nil, err
		}
		expAt = func(idx []ir.Expr) ir.Expr { return exps.At(idx...) }
	}
	k2 := te.ReduceAxis(ir.RangeFromExtent(x.Shape[ax]), "k")
	expsum, err = finish(te.Compute(red, func(idx []ir.Expr) ir.Expr {
		return te.Sum(expAt(withAxis(idx, ax, k2)), k2)
	}, "T_softmax_expsum", names("i", n)...))
	return ax, maxel, exps, expsum, err
}

// Softmax returns exp(x - max) / sum(exp(x - max)) along axis, each
// exponential computed once.
func Softmax(x *te.Tensor, axis int64) (*te.Tensor, error) {
	ax, _, exps, expsum, err := softmaxStages("softmax", x, axis, true)
	if err != nil {
		return nil, err
	}
	return finish(te.Compute(x.Shape, func(idx []ir.Expr) ir.Expr {
		return ir.Div(exps.At(idx...), expsum.At(dropAxis(idx, ax)...))
	}, "T_softmax_norm", names("i", len(x.Shape))...))
}

// LogSoftmax returns x - max - log(sum(exp(x - max))) along axis.
func LogSoftmax(x *te.Tensor, axis int64) (*te.Tensor, error) {
	ax, maxel, _, expsum, err := softmaxStages("log_softmax", x, axis, false)
	if err != nil {
		return nil, err
	}
	return finish(te.Compute(x.Shape, func(idx []ir.Expr) ir.Expr {
		r := dropAxis(idx, ax)
		return ir.Sub(ir.Sub(x.At(idx...), maxel.At(r...)), ir.Log(expsum.At(r...)))
	}, "compute", names("i", len(x.Shape))...))
}

// LayerNorm normalizes x over axes: (x - mean) / sqrt(var + epsilon),
// times gamma when scale, plus beta when center (gamma and beta have the
// shape of the normalized dimensions; either may be nil when unused).
// Stages T_layer_norm_sum, T_layer_norm_sqsum, T_layer_norm.
func LayerNorm(x, gamma, beta *te.Tensor, axes []int64, epsilon float64, center, scale bool) (*te.Tensor, error) {
	const op = "layer_norm"
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	if err := checkFloat(op, x); err != nil {
		return nil, err
	}
	if len(axes) == 0 {
		return nil, fmt.Errorf("%s: no axes to normalize", op)
	}
	p, err := planReduce(op, x, axes, true)
	if err != nil {
		return nil, err
	}
	ax, _ := normAxes(op, axes, len(x.Shape))
	want := make([]ir.Expr, len(ax))
	for i, a := range ax {
		want[i] = x.Shape[a]
	}
	for _, s := range []struct {
		name string
		t    *te.Tensor
		used bool
	}{{"gamma", gamma, scale}, {"beta", beta, center}} {
		if !s.used {
			continue
		}
		if s.t == nil {
			return nil, fmt.Errorf("%s: missing %s", op, s.name)
		}
		if err := checkInputs(op, s.t); err != nil {
			return nil, err
		}
		if err := sameDType(op, x, s.t); err != nil {
			return nil, err
		}
		if !dimsEqual(s.t.Shape, want) {
			return nil, fmt.Errorf("%s: %s has shape %s, want %s for data of shape %s", op, s.name, shapeStr(s.t.Shape), shapeStr(want), shapeStr(x.Shape))
		}
	}
	dt := x.DType
	n := castScalar(p.count(), dt)
	sum, err := p.compute("T_layer_norm_sum", te.Sum, func(_, sub []ir.Expr) ir.Expr { return x.At(sub...) })
	if err != nil {
		return nil, err
	}
	sq, err := p.compute("T_layer_norm_sqsum", te.Sum, func(_, sub []ir.Expr) ir.Expr {
		d := ir.Sub(x.At(sub...), ir.Div(sum.At(p.outIndex(sub)...), n))
		return ir.Mul(d, d)
	})
	if err != nil {
		return nil, err
	}
	return finish(te.Compute(x.Shape, func(idx []ir.Expr) ir.Expr {
		r := p.outIndex(idx)
		v := ir.Mul(ir.Sub(x.At(idx...), ir.Div(sum.At(r...), n)),
			ir.Rsqrt(ir.Add(ir.Div(sq.At(r...), n), ir.Const(dt, epsilon))))
		sub := make([]ir.Expr, len(ax))
		for i, a := range ax {
			sub[i] = idx[a]
		}
		if scale {
			v = ir.Mul(v, gamma.At(sub...))
		}
		if center {
			v = ir.Add(v, beta.At(sub...))
		}
		return v
	}, "T_layer_norm", names("ax", len(x.Shape))...))
}

func dimsEqual(a, b []ir.Expr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !ir.DimEqual(a[i], b[i]) {
			return false
		}
	}
	return true
}

// BatchNorm is inference-mode batch normalization along axis:
// (x - mean[c]) / sqrt(var[c] + epsilon), times gamma[c] when scale, plus
// beta[c] when center. It returns the result (stage T_batch_norm) and
// copies of the moving mean and variance (T_batch_norm_mean,
// T_batch_norm_var), the three outputs of Relax's batch_norm.
func BatchNorm(x, gamma, beta, mean, variance *te.Tensor, axis int64, epsilon float64, center, scale bool) ([]*te.Tensor, error) {
	const op = "batch_norm"
	if err := checkInputs(op, x, gamma, beta, mean, variance); err != nil {
		return nil, err
	}
	if err := checkFloat(op, x); err != nil {
		return nil, err
	}
	if err := sameDType(op, x, gamma, beta, mean, variance); err != nil {
		return nil, err
	}
	ax, err := normAxis(op, axis, len(x.Shape))
	if err != nil {
		return nil, err
	}
	c := []ir.Expr{x.Shape[ax]}
	for _, s := range []*te.Tensor{gamma, beta, mean, variance} {
		if !dimsEqual(s.Shape, c) {
			return nil, fmt.Errorf("%s: %s has shape %s, want %s for data of shape %s", op, s.Name, shapeStr(s.Shape), shapeStr(c), shapeStr(x.Shape))
		}
	}
	dt := x.DType
	out, err := finish(te.Compute(x.Shape, func(idx []ir.Expr) ir.Expr {
		ch := idx[ax]
		v := ir.Mul(ir.Sub(x.At(idx...), mean.At(ch)), ir.Rsqrt(ir.Add(variance.At(ch), ir.Const(dt, epsilon))))
		if scale {
			v = ir.Mul(v, gamma.At(ch))
		}
		if center {
			v = ir.Add(v, beta.At(ch))
		}
		return v
	}, "T_batch_norm", names("ax", len(x.Shape))...))
	if err != nil {
		return nil, err
	}
	outs := []*te.Tensor{out}
	for _, s := range []struct {
		t    *te.Tensor
		name string
	}{{mean, "T_batch_norm_mean"}, {variance, "T_batch_norm_var"}} {
		cp, err := finish(te.Compute(c, func(i ir.Expr) ir.Expr { return s.t.At(i) }, s.name, "ax0"))
		if err != nil {
			return nil, err
		}
		outs = append(outs, cp)
	}
	return outs, nil
}
