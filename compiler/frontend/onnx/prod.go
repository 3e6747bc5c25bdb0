package onnx

import (
	"slices"
)

// Products over axes, which the graph IR has no reducer for: each axis
// is multiplied down by halves (the first half times the second, an odd
// element carried over), log₂ n elementwise products, exact in every
// dtype.

// prod multiplies x over axes (already normalized), keeping them as
// dimensions of 1 when keep is set.
func (im *importer) prod(x *value, axes []int, keep bool) (*value, error) {
	var err error
	for _, a := range axes {
		if x, err = im.prodAxis(x, a); err != nil {
			return nil, err
		}
	}
	if keep {
		return x, nil
	}
	var out []int64
	for i, d := range x.shape() {
		if !slices.Contains(axes, i) {
			out = append(out, d)
		}
	}
	return im.reshape(x, out)
}

// prodAxis multiplies x over axis a, leaving a dimension of 1.
func (im *importer) prodAxis(x *value, a int) (*value, error) {
	d := x.shape()[a]
	if d == 0 {
		s := slices.Clone(x.shape())
		s[a] = 1
		return constant(hostExpand(scalarTensor(x.dtype(), 1), s)), nil
	}
	g := im.builder()
	for d > 1 {
		h := d / 2
		m := g.op("multiply", nil, g.slice1(x, a, 0, h), g.slice1(x, a, h, 2*h))
		if d%2 == 1 {
			m = g.concat([]*value{m, g.slice1(x, a, 2*h, d)}, a)
		}
		x, d = m, d-h
	}
	return g.one(x)
}
