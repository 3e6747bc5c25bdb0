package onnx

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// The optimizers of ONNX's training preview (domain
// ai.onnx.preview.training): Adagrad, Momentum (standard and Nesterov)
// and Adam, one update step of any number of tensors, elementwise.

// trainingConverters are the converters of the training domain's ops.
var trainingConverters = map[string]converter{
	"Adagrad":  {1, convertAdagrad},
	"Momentum": {1, convertMomentum},
	"Adam":     {1, convertAdam},
}

// optimizerInputs splits R, T and groups of per-tensor inputs.
func optimizerInputs(n *node, groups int) (r, t *value, sets [][]*value, err error) {
	if len(n.in) < 2 || (len(n.in)-2)%groups != 0 {
		return nil, nil, nil, fmt.Errorf("%d inputs: want R, T and %d per optimized tensor", len(n.in), groups)
	}
	in, err := n.inputs(len(n.in))
	if err != nil {
		return nil, nil, nil, err
	}
	k := (len(in) - 2) / groups
	for g := range groups {
		sets = append(sets, in[2+g*k:2+(g+1)*k])
	}
	return in[0], in[1], sets, nil
}

// regularized is norm_coefficient·X + G.
func regularized(g *gb, n *node, x, grad *value) *value {
	c := n.attrFloat("norm_coefficient", 0)
	if c == 0 {
		return grad
	}
	return g.op("add", nil, g.op("multiply", nil, x, scalar(x.dtype(), c)), grad)
}

func convertAdagrad(im *importer, n *node) ([]*value, error) {
	r, t, sets, err := optimizerInputs(n, 3)
	if err != nil {
		return nil, err
	}
	g := im.builder()
	dt := r.dtype()
	// r / (1 + T·decay_factor)
	tf := g.cast(t, dt)
	rate := g.op("divide", nil, r, g.op("add", nil, scalar(dt, 1), g.op("multiply", nil, tf, scalar(dt, n.attrFloat("decay_factor", 0)))))
	eps := n.attrFloat("epsilon", 1e-6)
	var xs, hs []*value
	for i := range sets[0] {
		x, grad, h := sets[0][i], sets[1][i], sets[2][i]
		gr := regularized(g, n, x, grad)
		hn := g.op("add", nil, h, g.op("multiply", nil, gr, gr))
		ad := g.op("add", nil, g.op("sqrt", nil, hn), scalar(dt, eps))
		xs = append(xs, g.op("subtract", nil, x, g.op("divide", nil, g.op("multiply", nil, rate, gr), ad)))
		hs = append(hs, hn)
	}
	return g.result(append(xs, hs...)...)
}

func convertMomentum(im *importer, n *node) ([]*value, error) {
	r, t, sets, err := optimizerInputs(n, 3)
	if err != nil {
		return nil, err
	}
	mode := n.attrString("mode", "standard")
	if mode != "standard" && mode != "nesterov" {
		return nil, fmt.Errorf("mode %q is not standard or nesterov", mode)
	}
	g := im.builder()
	dt := r.dtype()
	alpha, beta := n.attrFloat("alpha", 0), n.attrFloat("beta", 0)
	// The first step (T = 0) takes the whole gradient.
	b := g.op("where", nil, g.op("greater", nil, t, scalar(t.dtype(), 0)), scalar(dt, beta), scalar(dt, 1))
	var xs, vs []*value
	for i := range sets[0] {
		x, grad, v := sets[0][i], sets[1][i], sets[2][i]
		gr := regularized(g, n, x, grad)
		vn := g.op("add", nil, g.op("multiply", nil, v, scalar(dt, alpha)), g.op("multiply", nil, b, gr))
		step := vn
		if mode == "nesterov" {
			step = g.op("add", nil, gr, g.op("multiply", nil, vn, scalar(dt, alpha)))
		}
		xs = append(xs, g.op("subtract", nil, x, g.op("multiply", nil, r, step)))
		vs = append(vs, vn)
	}
	return g.result(append(xs, vs...)...)
}

func convertAdam(im *importer, n *node) ([]*value, error) {
	r, t, sets, err := optimizerInputs(n, 4)
	if err != nil {
		return nil, err
	}
	g := im.builder()
	dt := r.dtype()
	alpha, beta := n.attrFloat("alpha", 0.9), n.attrFloat("beta", 0.999)
	eps, post := n.attrFloat("epsilon", 1e-6), n.attrFloat("norm_coefficient_post", 0)
	// R·sqrt(1 − βᵀ)/(1 − αᵀ) after the first step, R on it.
	tf := g.cast(t, ir.Float64)
	pw := func(base float64) *value { return g.op("power", nil, scalar(ir.Float64, base), tf) }
	adj := g.op("divide", nil, g.op("sqrt", nil, g.op("subtract", nil, scalar(ir.Float64, 1), pw(beta))), g.op("subtract", nil, scalar(ir.Float64, 1), pw(alpha)))
	adj = g.op("where", nil, g.op("greater", nil, t, scalar(t.dtype(), 0)), adj, scalar(ir.Float64, 1))
	rate := g.op("multiply", nil, r, g.cast(adj, dt))
	var xs, vs, hs []*value
	for i := range sets[0] {
		x, grad, v, h := sets[0][i], sets[1][i], sets[2][i], sets[3][i]
		gr := regularized(g, n, x, grad)
		vn := g.op("add", nil, g.op("multiply", nil, v, scalar(dt, alpha)), g.op("multiply", nil, gr, scalar(dt, 1-alpha)))
		hn := g.op("add", nil, g.op("multiply", nil, h, scalar(dt, beta)), g.op("multiply", nil, g.op("multiply", nil, gr, gr), scalar(dt, 1-beta)))
		hs2 := g.op("add", nil, g.op("sqrt", nil, hn), scalar(dt, eps))
		xn := g.op("subtract", nil, x, g.op("divide", nil, g.op("multiply", nil, rate, vn), hs2))
		if post != 0 {
			xn = g.op("multiply", nil, xn, scalar(dt, 1-post))
		}
		xs, vs, hs = append(xs, xn), append(vs, vn), append(hs, hn)
	}
	return g.result(append(append(xs, vs...), hs...)...)
}
