package onnx

import (
	"fmt"
	"math"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Neural-network operators: convolution, pooling, dense layers,
// normalizations, softmax and reductions.

func registerNNOps() {
	reg("Conv", 7, convertConv)
	reg("MaxPool", 7, func(im *importer, n *node) ([]*value, error) { return convertPool(im, n, true) })
	reg("AveragePool", 7, func(im *importer, n *node) ([]*value, error) { return convertPool(im, n, false) })
	reg("GlobalAveragePool", 7, func(im *importer, n *node) ([]*value, error) { return convertGlobalPool(im, n, "relax.mean") })
	reg("GlobalMaxPool", 7, func(im *importer, n *node) ([]*value, error) { return convertGlobalPool(im, n, "relax.max") })
	reg("Gemm", 7, convertGemm)
	reg("MatMul", 7, func(im *importer, n *node) ([]*value, error) {
		a, err := n.need(0)
		if err != nil {
			return nil, err
		}
		b, err := n.need(1)
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.matmul", nil, a, b))
	})
	reg("Softmax", 7, func(im *importer, n *node) ([]*value, error) { return convertSoftmax(im, n, "relax.nn.softmax") })
	reg("LogSoftmax", 7, func(im *importer, n *node) ([]*value, error) { return convertSoftmax(im, n, "relax.nn.log_softmax") })
	reg("BatchNormalization", 7, convertBatchNorm)
	reg("InstanceNormalization", 7, convertInstanceNorm)
	reg("LayerNormalization", 17, convertLayerNorm)
	for onnxName, r := range map[string]string{
		"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min", "ReduceProd": "prod",
		"ReduceSumSquare": "sumsquare", "ReduceL1": "l1", "ReduceL2": "l2", "ReduceLogSum": "logsum", "ReduceLogSumExp": "logsumexp",
	} {
		reg(onnxName, 7, func(im *importer, n *node) ([]*value, error) { return convertReduce(im, n, r) })
	}
	for onnxName, r := range map[string]string{"ArgMax": "relax.argmax", "ArgMin": "relax.argmin"} {
		reg(onnxName, 7, func(im *importer, n *node) ([]*value, error) {
			x, err := n.need(0)
			if err != nil {
				return nil, err
			}
			axis, err := normAxis(n.attrInt("axis", 0), x.rank())
			if err != nil {
				return nil, err
			}
			attrs := map[string]any{"axis": int64(axis), "keepdims": n.attrInt("keepdims", 1) != 0}
			if n.attrInt("select_last_index", 0) == 0 {
				return ret(im.emit(r, attrs, x))
			}
			// The last extreme: the first one of the reversed axis,
			// counted back from the end.
			dim := x.shape()[axis]
			rev, err := im.slice(x, []int{axis}, []int64{dim - 1}, []int64{-1}, []int64{-1})
			if err != nil {
				return nil, err
			}
			i, err := im.emit(r, attrs, rev)
			if err != nil {
				return nil, err
			}
			return ret(im.emit("relax.subtract", nil, scalar(ir.Int64, float64(dim-1)), i))
		})
	}
	reg("Pad", 7, convertPad)
}

// spatialAttrs reads kernel-window attributes for k spatial dims:
// strides, dilations and pads (resolved from auto_pad).
func spatialAttrs(n *node, in, kernel []int64) (strides, dil, pads []int64, err error) {
	k := len(kernel)
	ones := func() []int64 {
		o := make([]int64, k)
		for i := range o {
			o[i] = 1
		}
		return o
	}
	strides, dil = ones(), ones()
	if s, ok := n.attrInts("strides"); ok {
		strides = s
	}
	if d, ok := n.attrInts("dilations"); ok {
		dil = d
	}
	pads = make([]int64, 2*k)
	if p, ok := n.attrInts("pads"); ok {
		pads = p
	}
	if len(strides) != k || len(dil) != k || len(pads) != 2*k {
		return nil, nil, nil, fmt.Errorf("strides %v, dilations %v and pads %v do not match %d spatial dims", strides, dil, pads, k)
	}
	switch ap := n.attrString("auto_pad", "NOTSET"); ap {
	case "NOTSET", "":
	case "VALID":
		pads = make([]int64, 2*k)
	case "SAME_UPPER", "SAME_LOWER":
		for i := range k {
			out := (in[i] + strides[i] - 1) / strides[i]
			total := max((out-1)*strides[i]+(kernel[i]-1)*dil[i]+1-in[i], 0)
			lo := total / 2
			if ap == "SAME_LOWER" {
				lo = total - total/2
			}
			pads[i], pads[i+k] = lo, total-lo
		}
	default:
		return nil, nil, nil, unsupported("auto_pad=%q", ap)
	}
	return strides, dil, pads, nil
}

// to2D turns 1-D window attributes into 2-D ones (a height of 1).
func to2D(strides, dil, pads []int64) ([]int64, []int64, []int64) {
	if len(strides) == 2 {
		return strides, dil, pads
	}
	return []int64{1, strides[0]}, []int64{1, dil[0]}, []int64{0, pads[0], 0, pads[1]}
}

func convertConv(im *importer, n *node) ([]*value, error) {
	x, err := n.need(0)
	if err != nil {
		return nil, err
	}
	w, err := n.need(1)
	if err != nil {
		return nil, err
	}
	xs, ws := x.shape(), w.shape()
	if len(xs) != 3 && len(xs) != 4 || len(ws) != len(xs) {
		return nil, unsupported("Conv of %d-D data (kiln imports 1-D and 2-D convolutions)", len(xs)-2)
	}
	if ks, ok := n.attrInts("kernel_shape"); ok && !slices.Equal(ks, ws[2:]) {
		return nil, fmt.Errorf("kernel_shape %v disagrees with the weight's shape %v", ks, ws)
	}
	strides, dil, pads, err := spatialAttrs(n, xs[2:], ws[2:])
	if err != nil {
		return nil, err
	}
	oneD := len(xs) == 3
	if oneD {
		if x, err = im.reshape(x, []int64{xs[0], xs[1], 1, xs[2]}); err != nil {
			return nil, err
		}
		if w, err = im.reshape(w, []int64{ws[0], ws[1], 1, ws[2]}); err != nil {
			return nil, err
		}
		strides, dil, pads = to2D(strides, dil, pads)
	}
	var y *value
	if n.attrInt("group", 1) == 1 && im.opts.Im2Col && x.dtype() == ir.Float32 {
		y, err = im.convMatmul(x, w, strides, pads, dil)
	} else {
		y, err = im.emit("relax.nn.conv2d", map[string]any{
			"strides": anyInts(strides), "padding": anyInts(pads), "dilation": anyInts(dil),
			"groups": n.attrInt("group", 1),
		}, x, w)
	}
	if err != nil {
		return nil, err
	}
	if b := n.input(2); b != nil {
		bb, err := im.reshape(b, []int64{1, ws[0], 1, 1})
		if err != nil {
			return nil, err
		}
		if y, err = im.emit("relax.add", nil, y, bb); err != nil {
			return nil, err
		}
	}
	if oneD {
		s := y.shape()
		return ret(im.reshape(y, []int64{s[0], s[1], s[3]}))
	}
	return []*value{y}, nil
}

func convertPool(im *importer, n *node, isMax bool) ([]*value, error) {
	x, err := n.need(0)
	if err != nil {
		return nil, err
	}
	xs := x.shape()
	if len(xs) < 3 {
		return nil, fmt.Errorf("%s of data of shape %v, want [N, C, d…]", n.p.GetOpType(), xs)
	}
	kernel, ok := n.attrInts("kernel_shape")
	if !ok || len(kernel) != len(xs)-2 {
		return nil, fmt.Errorf("kernel_shape %v does not match %d spatial dims", kernel, len(xs)-2)
	}
	strides, dil, pads, err := spatialAttrs(n, xs[2:], kernel)
	if err != nil {
		return nil, err
	}
	if indices := len(n.p.GetOutput()) > 1 && n.p.GetOutput()[1] != ""; indices || len(xs) > 4 {
		y, idx, err := im.slicePool(n, x, kernel, strides, dil, pads, isMax)
		if err != nil {
			return nil, err
		}
		return []*value{y, idx}, nil
	}
	if !isMax && slices.ContainsFunc(dil, func(d int64) bool { return d != 1 }) {
		return nil, unsupported("AveragePool with dilations")
	}
	oneD := len(xs) == 3
	if oneD {
		if x, err = im.reshape(x, []int64{xs[0], xs[1], 1, xs[2]}); err != nil {
			return nil, err
		}
		strides, dil, pads = to2D(strides, dil, pads)
		kernel = []int64{1, kernel[0]}
	}
	opName := "relax.nn.avg_pool2d"
	if isMax {
		opName = "relax.nn.max_pool2d"
	}
	y, err := im.emit(opName, map[string]any{
		"pool_size": anyInts(kernel), "strides": anyInts(strides), "padding": anyInts(pads), "dilation": anyInts(dil),
		"ceil_mode": n.attrInt("ceil_mode", 0) != 0, "count_include_pad": n.attrInt("count_include_pad", 0) != 0,
	}, x)
	if err != nil {
		return nil, err
	}
	if oneD {
		s := y.shape()
		return ret(im.reshape(y, []int64{s[0], s[1], s[3]}))
	}
	return []*value{y}, nil
}

func convertGlobalPool(im *importer, n *node, opName string) ([]*value, error) {
	x, err := n.need(0)
	if err != nil {
		return nil, err
	}
	var axes []int64
	for i := 2; i < x.rank(); i++ {
		axes = append(axes, int64(i))
	}
	return ret(im.emit(opName, map[string]any{"axis": anyInts(axes), "keepdims": true}, x))
}

func convertGemm(im *importer, n *node) ([]*value, error) {
	a, err := n.need(0)
	if err != nil {
		return nil, err
	}
	b, err := n.need(1)
	if err != nil {
		return nil, err
	}
	if a.rank() != 2 || b.rank() != 2 {
		return nil, fmt.Errorf("A of shape %v and B of shape %v: Gemm takes matrices", a.shape(), b.shape())
	}
	if n.attrInt("transA", 0) != 0 {
		if a, err = im.transpose2(a); err != nil {
			return nil, err
		}
	}
	if n.attrInt("transB", 0) != 0 {
		if b, err = im.transpose2(b); err != nil {
			return nil, err
		}
	}
	y, err := im.emit("relax.matmul", nil, a, b)
	if err != nil {
		return nil, err
	}
	if alpha := n.attrFloat("alpha", 1); alpha != 1 {
		if y, err = im.emit("relax.multiply", nil, y, scalar(y.dtype(), alpha)); err != nil {
			return nil, err
		}
	}
	if c := n.input(2); c != nil {
		if beta := n.attrFloat("beta", 1); beta != 1 {
			if c.known() {
				c = constant(c.c.cast(ir.Float64))
				t, _ := hostBinary(c.c, scalarTensor(ir.Float64, beta), y.dtype(), func(x, y float64) float64 { return x * y }, nil)
				c = constant(t)
			} else if c, err = im.emit("relax.multiply", nil, c, scalar(y.dtype(), beta)); err != nil {
				return nil, err
			}
		}
		if y, err = im.emit("relax.add", nil, y, c); err != nil {
			return nil, err
		}
	}
	return []*value{y}, nil
}

// transpose2 swaps the axes of a matrix (on the host when it is known,
// so that a weight stored transposed becomes a transposed weight).
func (im *importer) transpose2(x *value) (*value, error) {
	if x.known() {
		t := hostTranspose(x.c, []int{1, 0})
		t.Name = x.c.Name
		return &value{c: t, init: x.init}, nil
	}
	return im.emit("relax.permute_dims", map[string]any{"axes": anyInts([]int{1, 0})}, x)
}

func convertSoftmax(im *importer, n *node, opName string) ([]*value, error) {
	x, err := n.need(0)
	if err != nil {
		return nil, err
	}
	s := x.shape()
	if n.opset >= 13 {
		axis, err := normAxis(n.attrInt("axis", -1), len(s))
		if err != nil {
			return nil, err
		}
		return ret(im.emit(opName, map[string]any{"axis": int64(axis)}, x))
	}
	// Before opset 13 the input is coerced to 2-D at axis.
	axis, err := normAxis(n.attrInt("axis", 1), max(len(s), 1))
	if err != nil {
		return nil, err
	}
	flat, err := im.reshape(x, []int64{numElements(s[:axis]), numElements(s[axis:])})
	if err != nil {
		return nil, err
	}
	y, err := im.emit(opName, map[string]any{"axis": int64(1)}, flat)
	if err != nil {
		return nil, err
	}
	return ret(im.reshape(y, s))
}

// channelShape is [C, 1, …] for broadcasting a per-channel vector over
// data of rank r (channels on axis 1).
func channelShape(c int64, r int) []int64 {
	s := []int64{c}
	for i := 2; i < r; i++ {
		s = append(s, 1)
	}
	return s
}

func convertBatchNorm(im *importer, n *node) ([]*value, error) {
	if n.attrInt("training_mode", 0) != 0 || len(n.p.GetOutput()) > 1 && slices.ContainsFunc(n.p.GetOutput()[1:], func(s string) bool { return s != "" }) {
		if n.opset < 14 {
			return nil, unsupported("BatchNormalization in training mode before opset 14")
		}
		return batchNormTraining(im, n)
	}
	x, err := n.need(0)
	if err != nil {
		return nil, err
	}
	var p [4]*value
	for i := range p {
		if p[i], err = n.need(i + 1); err != nil {
			return nil, err
		}
	}
	eps := n.attrFloat("epsilon", 1e-5)
	c := x.shape()[1]
	cs := channelShape(c, x.rank())
	if p[0].known() && p[1].known() && p[2].known() && p[3].known() {
		// y = x·s + (β − mean·s), s = γ/√(var + ε), computed here.
		scale, shift := newTensor(x.dtype(), cs), newTensor(x.dtype(), cs)
		for i := range int(c) {
			s := p[0].c.elem(i) / math.Sqrt(p[3].c.elem(i)+eps)
			setElem(scale.Data, x.dtype(), i, s)
			setElem(shift.Data, x.dtype(), i, p[1].c.elem(i)-p[2].c.elem(i)*s)
		}
		scale.Name, shift.Name = n.p.GetName()+"_scale", n.p.GetName()+"_shift"
		y, err := im.emit("relax.multiply", nil, x, &value{c: scale, init: true})
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.add", nil, y, &value{c: shift, init: true}))
	}
	var r [4]*value
	for i := range p {
		if r[i], err = im.reshape(p[i], cs); err != nil {
			return nil, err
		}
	}
	ve, err := im.emit("relax.add", nil, r[3], scalar(x.dtype(), eps))
	if err != nil {
		return nil, err
	}
	sd, err := im.emit("relax.sqrt", nil, ve)
	if err != nil {
		return nil, err
	}
	xm, err := im.emit("relax.subtract", nil, x, r[2])
	if err != nil {
		return nil, err
	}
	xn, err := im.emit("relax.divide", nil, xm, sd)
	if err != nil {
		return nil, err
	}
	xs, err := im.emit("relax.multiply", nil, xn, r[0])
	if err != nil {
		return nil, err
	}
	return ret(im.emit("relax.add", nil, xs, r[1]))
}

func convertInstanceNorm(im *importer, n *node) ([]*value, error) {
	x, err := n.need(0)
	if err != nil {
		return nil, err
	}
	scale, err := n.need(1)
	if err != nil {
		return nil, err
	}
	bias, err := n.need(2)
	if err != nil {
		return nil, err
	}
	var axes []int64
	for i := 2; i < x.rank(); i++ {
		axes = append(axes, int64(i))
	}
	attrs := map[string]any{"axis": anyInts(axes), "keepdims": true}
	mean, err := im.emit("relax.mean", attrs, x)
	if err != nil {
		return nil, err
	}
	vr, err := im.emit("relax.variance", attrs, x)
	if err != nil {
		return nil, err
	}
	ve, err := im.emit("relax.add", nil, vr, scalar(x.dtype(), n.attrFloat("epsilon", 1e-5)))
	if err != nil {
		return nil, err
	}
	sd, err := im.emit("relax.sqrt", nil, ve)
	if err != nil {
		return nil, err
	}
	xm, err := im.emit("relax.subtract", nil, x, mean)
	if err != nil {
		return nil, err
	}
	xn, err := im.emit("relax.divide", nil, xm, sd)
	if err != nil {
		return nil, err
	}
	cs := channelShape(x.shape()[1], x.rank())
	s, err := im.reshape(scale, cs)
	if err != nil {
		return nil, err
	}
	b, err := im.reshape(bias, cs)
	if err != nil {
		return nil, err
	}
	xs, err := im.emit("relax.multiply", nil, xn, s)
	if err != nil {
		return nil, err
	}
	return ret(im.emit("relax.add", nil, xs, b))
}

func convertLayerNorm(im *importer, n *node) ([]*value, error) {
	stats := false
	if outs := n.p.GetOutput(); len(outs) > 1 && slices.ContainsFunc(outs[1:], func(s string) bool { return s != "" }) {
		stats = true
	}
	x, err := n.need(0)
	if err != nil {
		return nil, err
	}
	s := x.shape()
	axis, err := normAxis(n.attrInt("axis", -1), len(s))
	if err != nil {
		return nil, err
	}
	norm := s[axis:]
	var axes []int64
	for i := axis; i < len(s); i++ {
		axes = append(axes, int64(i))
	}
	fit := func(v *value, fill float64) (*value, error) {
		if v == nil {
			t := newTensor(x.dtype(), norm)
			for i := range int(t.NumElements()) {
				setElem(t.Data, t.DType, i, fill)
			}
			return constant(t), nil
		}
		if slices.Equal(v.shape(), norm) {
			return v, nil
		}
		bs, err := broadcastShape(v.shape(), norm)
		if err != nil || !slices.Equal(bs, norm) {
			return nil, fmt.Errorf("scale or bias of shape %v does not broadcast to the normalized shape %v", v.shape(), norm)
		}
		if v.known() {
			return constant(hostExpand(v.c, norm)), nil
		}
		return im.emit("relax.broadcast_to", nil, v, &ir.ShapeExpr{Values: ir.Dims(norm...)})
	}
	scale, err := n.need(1)
	if err != nil {
		return nil, err
	}
	if scale, err = fit(scale, 1); err != nil {
		return nil, err
	}
	bias, err := fit(n.input(2), 0)
	if err != nil {
		return nil, err
	}
	eps := n.attrFloat("epsilon", 1e-5)
	if !stats {
		return ret(im.emit("relax.nn.layer_norm", map[string]any{"axes": anyInts(axes), "epsilon": eps}, x, scale, bias))
	}
	// The Mean and InvStdDev outputs asked for: compose the
	// normalization so they are values of the graph.
	keep := map[string]any{"axis": anyInts(axes), "keepdims": true}
	mean, err := im.emit("relax.mean", keep, x)
	if err != nil {
		return nil, err
	}
	d, err := im.emit("relax.subtract", nil, x, mean)
	if err != nil {
		return nil, err
	}
	d2, err := im.emit("relax.multiply", nil, d, d)
	if err != nil {
		return nil, err
	}
	vr, err := im.emit("relax.mean", keep, d2)
	if err != nil {
		return nil, err
	}
	ve, err := im.emit("relax.add", nil, vr, scalar(x.dtype(), eps))
	if err != nil {
		return nil, err
	}
	inv, err := im.emit("relax.rsqrt", nil, ve)
	if err != nil {
		return nil, err
	}
	xn, err := im.emit("relax.multiply", nil, d, inv)
	if err != nil {
		return nil, err
	}
	xs, err := im.emit("relax.multiply", nil, xn, scale)
	if err != nil {
		return nil, err
	}
	y, err := im.emit("relax.add", nil, xs, bias)
	if err != nil {
		return nil, err
	}
	return []*value{y, mean, inv}, nil
}

func convertReduce(im *importer, n *node, kind string) ([]*value, error) {
	x, err := n.need(0)
	if err != nil {
		return nil, err
	}
	since := int64(18)
	if n.p.GetOpType() == "ReduceSum" {
		since = 13
	}
	axes, _, err := axesOf(n, since, 1)
	if err != nil {
		return nil, err
	}
	keep := n.attrInt("keepdims", 1) != 0
	if len(axes) == 0 {
		if n.attrInt("noop_with_empty_axes", 0) != 0 {
			return ret(im.emit("relax.add", nil, x, scalar(x.dtype(), 0)))
		}
		for i := range x.rank() {
			axes = append(axes, int64(i))
		}
	}
	ax, err := normAxes(axes, x.rank())
	if err != nil {
		return nil, err
	}
	attrs := map[string]any{"axis": anyInts(ax), "keepdims": keep}
	switch kind {
	case "mean", "sum", "max", "min":
		return ret(im.emit("relax."+kind, attrs, x))
	case "prod":
		return ret(im.prod(x, ax, keep))
	case "sumsquare", "l2":
		sq, err := im.emit("relax.multiply", nil, x, x)
		if err != nil {
			return nil, err
		}
		s, err := im.emit("relax.sum", attrs, sq)
		if err != nil || kind == "sumsquare" {
			return []*value{s}, err
		}
		return ret(im.emit("relax.sqrt", nil, s))
	case "l1":
		a, err := im.emit("relax.abs", nil, x)
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.sum", attrs, a))
	case "logsum":
		s, err := im.emit("relax.sum", attrs, x)
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.log", nil, s))
	case "logsumexp":
		m, err := im.emit("relax.max", map[string]any{"axis": anyInts(ax), "keepdims": true}, x)
		if err != nil {
			return nil, err
		}
		xm, err := im.emit("relax.subtract", nil, x, m)
		if err != nil {
			return nil, err
		}
		e, err := im.emit("relax.exp", nil, xm)
		if err != nil {
			return nil, err
		}
		s, err := im.emit("relax.sum", attrs, e)
		if err != nil {
			return nil, err
		}
		l, err := im.emit("relax.log", nil, s)
		if err != nil {
			return nil, err
		}
		if !keep {
			if m, err = im.reshape(m, l.shape()); err != nil {
				return nil, err
			}
		}
		return ret(im.emit("relax.add", nil, l, m))
	}
	return nil, unsupported("reduction %s", kind)
}

// convertPad pads in constant mode by concatenating blocks of the pad
// value (and slicing for negative pads); in edge, reflect and wrap modes
// each padded axis is one gather of the indices the mode reads.
func convertPad(im *importer, n *node) ([]*value, error) {
	x, err := n.need(0)
	if err != nil {
		return nil, err
	}
	mode := n.attrString("mode", "constant")
	switch mode {
	case "constant", "edge", "reflect":
	case "wrap":
		if n.opset < 19 {
			return nil, unsupported("Pad mode %q before opset 19", mode)
		}
	default:
		return nil, fmt.Errorf("Pad mode %q is not one of constant, edge, reflect, wrap", mode)
	}
	r := x.rank()
	var pads []int64
	fill := 0.0
	if n.opset < 11 {
		pads, _ = n.attrInts("pads")
		fill = n.attrFloat("value", 0)
	} else {
		t, err := n.knownInput(1, "pads")
		if err != nil {
			return nil, err
		}
		if t == nil {
			return nil, fmt.Errorf("input 1 (pads) is missing")
		}
		pads = t.Ints()
		if v, err := n.knownInput(2, "constant_value"); err != nil {
			return nil, err
		} else if v != nil && v.NumElements() == 1 {
			fill = v.elem(0)
		}
	}
	axes := make([]int, r)
	for i := range axes {
		axes[i] = i
	}
	if t, err := n.knownInput(3, "axes"); err != nil {
		return nil, err
	} else if t != nil {
		if axes, err = normAxes(t.Ints(), r); err != nil {
			return nil, err
		}
	}
	k := len(axes)
	if len(pads) != 2*k {
		return nil, fmt.Errorf("pads %v: want %d values", pads, 2*k)
	}
	for i, a := range axes {
		lo, hi := pads[i], pads[i+k]
		s := x.shape()
		if lo < 0 || hi < 0 {
			b, e := max(-lo, 0), s[a]-max(-hi, 0)
			if e < b {
				return nil, fmt.Errorf("pads %v remove more than axis %d holds", pads, a)
			}
			if x, err = im.slice(x, []int{a}, []int64{b}, []int64{e}, []int64{1}); err != nil {
				return nil, err
			}
			lo, hi = max(lo, 0), max(hi, 0)
		}
		if lo == 0 && hi == 0 {
			continue
		}
		if mode == "constant" {
			x, err = im.padConst(x, a, lo, hi, fill)
		} else {
			x, err = im.padGather(x, a, lo, hi, mode)
		}
		if err != nil {
			return nil, err
		}
	}
	return []*value{x}, nil
}

// padConst pads axis a of x with lo and hi elements of value fill.
func (im *importer) padConst(x *value, a int, lo, hi int64, fill float64) (*value, error) {
	block := func(w int64) *value {
		bs := slices.Clone(x.shape())
		bs[a] = w
		t := newTensor(x.dtype(), bs)
		if fill != 0 {
			for j := range int(t.NumElements()) {
				setElem(t.Data, t.DType, j, fill)
			}
		}
		return constant(t)
	}
	var parts []*value
	if lo > 0 {
		parts = append(parts, block(lo))
	}
	parts = append(parts, x)
	if hi > 0 {
		parts = append(parts, block(hi))
	}
	if len(parts) == 1 {
		return x, nil
	}
	return im.concat(parts, a)
}

// padGather pads axis a of x by reading, for each output position, the
// element that Pad's edge, reflect or wrap mode names.
func (im *importer) padGather(x *value, a int, lo, hi int64, mode string) (*value, error) {
	d := x.shape()[a]
	if d == 0 || mode == "reflect" && d == 1 && lo+hi > 0 {
		return nil, fmt.Errorf("Pad mode %q of an axis of %d elements", mode, d)
	}
	idx := make([]int64, d+lo+hi)
	for o := range idx {
		i := int64(o) - lo
		switch mode {
		case "edge":
			i = max(0, min(i, d-1))
		case "wrap":
			i = ((i % d) + d) % d
		default: // reflect, without repeating the edge
			p := 2 * (d - 1)
			i = ((i % p) + p) % p
			if i >= d {
				i = p - i
			}
		}
		idx[o] = i
	}
	return im.take(x, idx, a)
}

// convMatmul computes a 2-D convolution (groups 1, NCHW) as a matrix
// product, so that it runs in the scheduled matmul kernel: the input's
// patches are gathered (im2col: one strided slice per kernel offset,
// concatenated) into [N, C·kh·kw, OH·OW] and multiplied by the weight
// viewed as [O, C·kh·kw], which gives [N, O, OH·OW], NCHW already. A 1×1
// convolution of stride 1 needs no gathering.
func (im *importer) convMatmul(x, w *value, strides, pads, dil []int64) (*value, error) {
	xs, ws := x.shape(), w.shape()
	nn, c, h, wd := xs[0], xs[1], xs[2], xs[3]
	o, kh, kw := ws[0], ws[2], ws[3]
	oh := (h+pads[0]+pads[2]-(kh-1)*dil[0]-1)/strides[0] + 1
	ow := (wd+pads[1]+pads[3]-(kw-1)*dil[1]-1)/strides[1] + 1
	if oh < 1 || ow < 1 {
		return nil, fmt.Errorf("data of shape %v is smaller than the kernel of shape %v", xs, ws)
	}
	wm, err := im.reshape(w, []int64{o, c * kh * kw})
	if err != nil {
		return nil, err
	}
	var cols *value
	if kh == 1 && kw == 1 && strides[0] == 1 && strides[1] == 1 && pads[0]+pads[1]+pads[2]+pads[3] == 0 {
		if cols, err = im.reshape(x, []int64{nn, c, h * wd}); err != nil {
			return nil, err
		}
	} else {
		xp := x
		if pads[0]+pads[1]+pads[2]+pads[3] > 0 {
			if xp, err = im.padZeros(x, pads); err != nil {
				return nil, err
			}
		}
		var parts []*value
		for dy := range kh {
			for dx := range kw {
				b := []int64{dy * dil[0], dx * dil[1]}
				e := []int64{b[0] + (oh-1)*strides[0] + 1, b[1] + (ow-1)*strides[1] + 1}
				p, err := im.slice(xp, []int{2, 3}, b, e, strides)
				if err != nil {
					return nil, err
				}
				if p, err = im.reshape(p, []int64{nn, c, 1, oh * ow}); err != nil {
					return nil, err
				}
				parts = append(parts, p)
			}
		}
		if len(parts) == 1 {
			cols = parts[0]
		} else if cols, err = im.concat(parts, 2); err != nil {
			return nil, err
		}
		if cols, err = im.reshape(cols, []int64{nn, c * kh * kw, oh * ow}); err != nil {
			return nil, err
		}
	}
	if nn == 1 {
		// One image: a plain 2-D product, the shape the matmul schedule
		// takes.
		if cols, err = im.reshape(cols, []int64{c * kh * kw, oh * ow}); err != nil {
			return nil, err
		}
	}
	y, err := im.emit("relax.matmul", nil, wm, cols)
	if err != nil {
		return nil, err
	}
	return im.reshape(y, []int64{nn, o, oh, ow})
}

// padZeros pads the last two axes of x with zeros: pads is [top, left,
// bottom, right].
func (im *importer) padZeros(x *value, pads []int64) (*value, error) {
	var err error
	for i, a := range []int{2, 3} {
		if x, err = im.padConst(x, a, pads[i], pads[i+2], 0); err != nil {
			return nil, err
		}
	}
	return x, nil
}
