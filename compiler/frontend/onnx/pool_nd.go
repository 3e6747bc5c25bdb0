package onnx

import (
	"fmt"
	"math"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Pooling over any number of spatial axes (3-D data and more) and
// MaxPool's Indices output, composed of strided slices: one slice of the
// padded input per kernel offset, combined by maximum or sum. The index
// of a maximum is the position in the unpadded input (over all of N, C
// and the spatial axes, as ONNX's Indices are; row-major, or column-major
// over the spatial axes with storage_order 1) of the first offset that
// reaches it.

// slicePool pools x [N, C, d…] with the window attributes; it returns
// the pooled values and, for max pooling, the indices.
func (im *importer) slicePool(n *node, x *value, kernel, strides, dil, pads []int64, isMax bool) (y, idx *value, err error) {
	if n.attrInt("ceil_mode", 0) != 0 {
		return nil, nil, unsupported("%s with ceil_mode of %d-D data", n.p.GetOpType(), x.rank()-2)
	}
	if !x.dtype().IsFloat() {
		return nil, nil, unsupported("%s of %s", n.p.GetOpType(), x.dtype())
	}
	xs := x.shape()
	k := len(kernel)
	out := make([]int64, k)
	for i := range k {
		out[i] = (xs[i+2]+pads[i]+pads[i+k]-(kernel[i]-1)*dil[i]-1)/strides[i] + 1
		if out[i] < 1 {
			return nil, nil, fmt.Errorf("the window of %v does not fit the input %v", kernel, xs)
		}
	}
	fill := 0.0
	if isMax {
		fill = math.Inf(-1)
	}
	g := im.builder()
	xp := x
	for i := range k {
		xp = g.do(func() (*value, error) { return im.padConst(xp, i+2, pads[i], pads[i+k], fill) })
	}
	axes := make([]int, k)
	for i := range axes {
		axes[i] = i + 2
	}
	count := numElements(kernel)
	// The host-side valid-element count per output window (AveragePool
	// without count_include_pad).
	valid := newTensor(x.dtype(), append([]int64{1, 1}, out...))
	outStr := stridesOf(out)
	var base *value // flat offset of (n, c) in the input, [N, C, 1…]
	if isMax {
		b := newTensor(ir.Int64, append([]int64{xs[0], xs[1]}, slices.Repeat([]int64{1}, k)...))
		plane := numElements(xs[2:])
		for i := range xs[0] * xs[1] {
			putInt(b.Data, ir.Int64, int(i), i*plane)
		}
		base = constant(b)
	}
	inStr := stridesOf(xs[2:])
	if n.attrInt("storage_order", 0) != 0 {
		// Column-major indices: the first spatial axis varies fastest.
		acc := int64(1)
		for i := range k {
			inStr[i] = acc
			acc *= xs[i+2]
		}
	}
	off := make([]int64, k)
	for o := range count {
		rem := o
		for i := k - 1; i >= 0; i-- {
			off[i] = rem % kernel[i]
			rem /= kernel[i]
		}
		begin, end := make([]int64, k), make([]int64, k)
		for i := range k {
			begin[i] = off[i] * dil[i]
			end[i] = begin[i] + (out[i]-1)*strides[i] + 1
		}
		s := g.slice(xp, axes, begin, end, strides)
		// Where each output's tap lies in the unpadded input.
		pos := newTensor(ir.Int64, append([]int64{1, 1}, out...))
		for f := range numElements(out) {
			flat, in := int64(0), true
			for i := range k {
				c := f/outStr[i]%out[i]*strides[i] + off[i]*dil[i] - pads[i]
				in = in && c >= 0 && c < xs[i+2]
				flat += c * inStr[i]
			}
			putInt(pos.Data, ir.Int64, int(f), flat)
			if in {
				setElem(valid.Data, valid.DType, int(f), valid.elem(int(f))+1)
			}
		}
		switch {
		case y == nil:
			y = s
			if isMax {
				idx = g.op("add", nil, base, constant(pos))
			}
		case isMax:
			better := g.op("greater", nil, s, y)
			idx = g.op("where", nil, better, g.op("add", nil, base, constant(pos)), idx)
			y = g.op("maximum", nil, y, s)
		default:
			y = g.op("add", nil, y, s)
		}
	}
	if !isMax {
		if n.attrInt("count_include_pad", 0) != 0 {
			y = g.op("divide", nil, y, scalar(x.dtype(), float64(count)))
		} else {
			y = g.op("divide", nil, y, constant(valid))
		}
	}
	if g.err != nil {
		return nil, nil, g.err
	}
	if isMax && idx != nil && !slices.Equal(idx.shape(), y.shape()) {
		idx = g.op("broadcast_to", nil, idx, &ir.ShapeExpr{Values: ir.Dims(y.shape()...)})
	}
	return y, idx, g.err
}
