package onnx

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// ReverseSequence, MaxUnpool and BatchNormalization in training mode.

func init() {
	reg("ReverseSequence", 10, func(im *importer, n *node) ([]*value, error) {
		in, err := n.inputs(2)
		if err != nil {
			return nil, err
		}
		x, lens := in[0], in[1]
		r := x.rank()
		ta, err := normAxis(n.attrInt("time_axis", 0), r)
		if err != nil {
			return nil, err
		}
		ba, err := normAxis(n.attrInt("batch_axis", 1), r)
		if err != nil {
			return nil, err
		}
		if ta == ba || lens.rank() != 1 || lens.shape()[0] != x.shape()[ba] {
			return nil, fmt.Errorf("want distinct time and batch axes and one length per batch entry, got %v for data %v", lens.shape(), x.shape())
		}
		// Element t of entry b comes from len[b] − 1 − t while t < len[b]:
		// a gather along the time axis.
		g := im.builder()
		ls := make([]int64, r)
		for i := range ls {
			ls[i] = 1
		}
		ls[ba] = x.shape()[ba]
		l := g.reshape(g.cast(lens, ir.Int64), ls)
		t := iotaAlong(ir.Int64, x.shape()[ta], ta, r)
		rev := g.op("subtract", nil, g.op("subtract", nil, l, scalar(ir.Int64, 1)), t)
		idx := g.op("where", nil, g.op("less", nil, t, l), rev, t)
		idx = g.op("broadcast_to", nil, idx, &ir.ShapeExpr{Values: ir.Dims(x.shape()...)})
		return g.result(g.do(func() (*value, error) { return im.gatherElements(x, idx, ta) }))
	})
	reg("MaxUnpool", 9, func(im *importer, n *node) ([]*value, error) {
		in, err := n.inputs(2)
		if err != nil {
			return nil, err
		}
		x, at := in[0], in[1]
		xs := x.shape()
		k, ok := n.attrInts("kernel_shape")
		if !ok || len(k) != len(xs)-2 || !slices.Equal(at.shape(), xs) {
			return nil, fmt.Errorf("want kernel_shape for each spatial axis and indices shaped as X %v", xs)
		}
		strides, _, pads, err := spatialAttrs(n, xs[2:], k)
		if err != nil {
			return nil, err
		}
		out := slices.Clone(xs)
		for i := range k {
			out[i+2] = (xs[i+2]-1)*strides[i] + k[i] - pads[i] - pads[i+len(k)]
		}
		want := out
		if t, err := n.knownInput(2, "output_shape"); err != nil {
			return nil, err
		} else if t != nil {
			want = t.Ints()
		}
		fits := len(want) == len(xs) && want[0] == xs[0] && want[1] == xs[1]
		for a := 2; fits && a < len(out); a++ {
			fits = want[a] >= out[a]
		}
		if !fits {
			return nil, fmt.Errorf("output_shape %v does not fit X %v (at least %v)", want, xs, out)
		}
		// The output is zeros with X's values at the flat positions the
		// indices (MaxPool's) name.
		total, nx := numElements(out), numElements(xs)
		g := im.builder()
		data := constant(newTensor(x.dtype(), []int64{total, 1}))
		pos := g.reshape(g.cast(at, ir.Int64), []int64{nx})
		upd := g.reshape(x, []int64{nx, 1})
		y := g.do(func() (*value, error) { return im.scatterRows(data, pos, upd, "none") })
		y = g.reshape(y, out)
		// A larger output_shape adds zeros at the end of each axis; the
		// indices stay those of the shape MaxPool saw.
		for a := 2; a < len(out); a++ {
			if want[a] > out[a] && g.err == nil {
				y = g.do(func() (*value, error) { return im.padConst(y, a, 0, want[a]-out[a], 0) })
			}
		}
		return g.result(y)
	})
}

// batchNormTraining normalizes with the batch's own mean and (population)
// variance per channel and also returns the running statistics updated
// with momentum.
func batchNormTraining(im *importer, n *node) ([]*value, error) {
	in, err := n.inputs(5)
	if err != nil {
		return nil, err
	}
	x := in[0]
	if x.rank() < 2 {
		return nil, fmt.Errorf("input of shape %v, want [N, C, …]", x.shape())
	}
	c := x.shape()[1]
	cs := channelShape(c, x.rank())
	var axes []int
	for i := range x.rank() {
		if i != 1 {
			axes = append(axes, i)
		}
	}
	dt := x.dtype()
	eps, mom := n.attrFloat("epsilon", 1e-5), n.attrFloat("momentum", 0.9)
	g := im.builder()
	attrs := map[string]any{"axis": anyInts(axes), "keepdims": true}
	mean := g.op("mean", attrs, x)
	d := g.op("subtract", nil, x, mean)
	v := g.op("mean", attrs, g.op("multiply", nil, d, d))
	xn := g.op("divide", nil, d, g.op("sqrt", nil, g.op("add", nil, v, scalar(dt, eps))))
	y := g.op("add", nil, g.op("multiply", nil, xn, g.reshape(in[1], cs)), g.reshape(in[2], cs))
	run := func(old, cur *value) *value {
		return g.op("add", nil, g.op("multiply", nil, old, scalar(dt, mom)), g.op("multiply", nil, g.reshape(cur, []int64{c}), scalar(dt, 1-mom)))
	}
	return g.result(y, run(in[3], mean), run(in[4], v))
}
