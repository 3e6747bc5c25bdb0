package onnx

import (
	"github.com/kiln-ml/kiln/compiler/ir"
)

// Linear quantization: QuantizeLinear, DequantizeLinear,
// DynamicQuantizeLinear, and the integer and quantized products
// MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv. Integer
// products run in int32 on the zero-point-shifted operands; requantizing
// rounds half to even and saturates to the output's 8-bit range.

func init() {
	reg("QuantizeLinear", 10, func(im *importer, n *node) ([]*value, error) {
		in, err := n.inputs(2)
		if err != nil {
			return nil, err
		}
		x, scale := in[0], in[1]
		out := ir.Uint8
		zp := n.input(2)
		if zp != nil {
			out = zp.dtype()
		}
		g := im.builder()
		axis := n.attrInt("axis", 1)
		scale = g.do(func() (*value, error) { return im.perAxis(scale, axis, x.rank()) })
		if zp != nil {
			zp = g.do(func() (*value, error) { return im.perAxis(zp, axis, x.rank()) })
		}
		return g.result(g.do(func() (*value, error) { return im.quantize(g.op("divide", nil, x, scale), zp, out) }))
	})
	reg("DequantizeLinear", 10, func(im *importer, n *node) ([]*value, error) {
		in, err := n.inputs(2)
		if err != nil {
			return nil, err
		}
		x, scale := in[0], in[1]
		g := im.builder()
		axis := n.attrInt("axis", 1)
		scale = g.do(func() (*value, error) { return im.perAxis(scale, axis, x.rank()) })
		xi := g.cast(x, ir.Int32)
		if zp := n.input(2); zp != nil {
			zp = g.do(func() (*value, error) { return im.perAxis(zp, axis, x.rank()) })
			xi = g.op("subtract", nil, xi, g.cast(zp, ir.Int32))
		}
		if g.err != nil {
			return nil, g.err
		}
		return g.result(g.op("multiply", nil, g.cast(xi, scale.dtype()), scale))
	})
	reg("DynamicQuantizeLinear", 11, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		dt := x.dtype()
		g := im.builder()
		all := map[string]any{"axis": nil, "keepdims": false}
		lo := g.op("minimum", nil, g.op("min", all, x), scalar(dt, 0))
		hi := g.op("maximum", nil, g.op("max", all, x), scalar(dt, 0))
		scale := g.op("divide", nil, g.op("subtract", nil, hi, lo), scalar(dt, 255))
		zp := g.do(func() (*value, error) {
			return im.quantize(g.op("divide", nil, g.op("negative", nil, lo), scale), nil, ir.Uint8)
		})
		y := g.do(func() (*value, error) { return im.quantize(g.op("divide", nil, x, scale), zp, ir.Uint8) })
		return g.result(y, scale, zp)
	})
	reg("MatMulInteger", 10, func(im *importer, n *node) ([]*value, error) {
		in, err := n.inputs(2)
		if err != nil {
			return nil, err
		}
		g := im.builder()
		a := im.shifted(g, in[0], n.input(2), -2, in[0].rank())
		b := im.shifted(g, in[1], n.input(3), -1, in[1].rank())
		return g.result(g.op("matmul", nil, a, b))
	})
	reg("QLinearMatMul", 10, func(im *importer, n *node) ([]*value, error) {
		in, err := n.inputs(8)
		if err != nil {
			return nil, err
		}
		g := im.builder()
		a := im.shifted(g, in[0], in[2], -2, in[0].rank())
		b := im.shifted(g, in[3], in[5], -1, in[3].rank())
		acc := g.op("matmul", nil, a, b)
		return g.result(im.requantize(g, acc, g.op("multiply", nil, in[1], in[4]), in[6], in[7]))
	})
	reg("ConvInteger", 10, func(im *importer, n *node) ([]*value, error) {
		in, err := n.inputs(2)
		if err != nil {
			return nil, err
		}
		g := im.builder()
		x := im.shifted(g, in[0], n.input(2), 1, in[0].rank())
		w := im.shifted(g, in[1], n.input(3), 0, in[1].rank())
		return g.result(im.intConv(g, n, x, w, nil))
	})
	reg("QLinearConv", 10, func(im *importer, n *node) ([]*value, error) {
		in, err := n.inputs(8)
		if err != nil {
			return nil, err
		}
		g := im.builder()
		x := im.shifted(g, in[0], in[2], 1, in[0].rank())
		w := im.shifted(g, in[3], in[5], 0, in[3].rank())
		acc := im.intConv(g, n, x, w, n.input(8))
		// The weight scale is one value or one per output channel.
		ws := in[4]
		if g.err == nil && ws.rank() == 1 && ws.shape()[0] > 1 {
			ws = g.do(func() (*value, error) { return im.perAxis(ws, 1, acc.rank()) })
		}
		return g.result(im.requantize(g, acc, g.op("multiply", nil, in[1], ws), in[6], in[7]))
	})
}

// perAxis shapes a scale or zero point to broadcast against data of rank
// r: a scalar or one value stays, a 1-D one lies along axis.
func (im *importer) perAxis(v *value, axis int64, r int) (*value, error) {
	if v.rank() == 0 || v.rank() == 1 && v.shape()[0] == 1 && r != 1 {
		return v, nil
	}
	if v.rank() != 1 {
		return nil, unsupported("blocked quantization (a scale of shape %v)", v.shape())
	}
	a, err := normAxis(axis, r)
	if err != nil {
		return nil, err
	}
	s := make([]int64, r)
	for i := range s {
		s[i] = 1
	}
	s[a] = v.shape()[0]
	return im.reshape(v, s)
}

// quantize rounds q half to even, adds the zero point and saturates to
// dtype out (uint8 or int8).
func (im *importer) quantize(q, zp *value, out ir.DType) (*value, error) {
	lo, hi := 0.0, 255.0
	switch out {
	case ir.Uint8:
	case ir.Int8:
		lo, hi = -128, 127
	default:
		return nil, unsupported("quantizing to %s", out)
	}
	g := im.builder()
	r := g.op("round", nil, q)
	if zp != nil {
		r = g.op("add", nil, r, g.cast(zp, q.dtype()))
	}
	r = g.do(func() (*value, error) { return im.clip(r, lo, hi, true, true) })
	return g.one(g.cast(r, out))
}

// shifted is x − zp in int32; a 1-D zero point of more than one value
// lies along axis of x (of rank r): a matrix's rows (−2) or columns (−1),
// a weight's output channels (0).
func (im *importer) shifted(g *gb, x, zp *value, axis int64, r int) *value {
	xi := g.cast(x, ir.Int32)
	if zp == nil || g.err != nil {
		return xi
	}
	if zp.rank() == 1 && zp.shape()[0] > 1 {
		zp = g.do(func() (*value, error) { return im.perAxis(zp, axis, r) })
	}
	return g.op("subtract", nil, xi, g.cast(zp, ir.Int32))
}

// requantize turns an int32 accumulator into the output's 8-bit dtype:
// acc·scale/yScale, rounded, plus yZP, saturated.
func (im *importer) requantize(g *gb, acc, scale, yScale, yZP *value) *value {
	if g.err != nil {
		return nil
	}
	f := g.op("multiply", nil, g.cast(acc, scale.dtype()), g.op("divide", nil, scale, yScale))
	return g.do(func() (*value, error) { return im.quantize(f, yZP, yZP.dtype()) })
}

// intConv is the node's convolution of int32 operands, plus bias.
func (im *importer) intConv(g *gb, n *node, x, w, bias *value) *value {
	if g.err != nil {
		return nil
	}
	c := *n
	c.in = []*value{x, w, bias}
	return g.do(func() (*value, error) {
		vs, err := convertConv(im, &c)
		if err != nil {
			return nil, err
		}
		return vs[0], nil
	})
}
