package onnx

import (
	"fmt"
	"maps"

	"github.com/kiln-ml/kiln/compiler/frontend/onnx/onnxpb"
	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Normalizations composed from elementwise operators and reductions:
// MeanVarianceNormalization and LRN (local response normalization across
// channels), and Upsample, the Resize of opsets 7 to 9.

func init() {
	reg("MeanVarianceNormalization", 9, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		if !x.dtype().IsFloat() {
			return nil, unsupported("MeanVarianceNormalization of %s", x.dtype())
		}
		axes, ok := n.attrInts("axes")
		if !ok {
			axes = []int64{0, 2, 3}
		}
		ax, err := normAxes(axes, x.rank())
		if err != nil {
			return nil, err
		}
		// (x − E[x]) / (sqrt(E[x²] − E[x]²) + 1e-9), as ONNX's function
		// body computes it.
		g := im.builder()
		attrs := map[string]any{"axis": anyInts(ax), "keepdims": true}
		mean := g.op("mean", attrs, x)
		meanSq := g.op("mean", attrs, g.op("multiply", nil, x, x))
		std := g.op("sqrt", nil, g.op("subtract", nil, meanSq, g.op("multiply", nil, mean, mean)))
		return g.result(g.op("divide", nil, g.op("subtract", nil, x, mean), g.op("add", nil, std, scalar(x.dtype(), 1e-9))))
	})
	reg("LRN", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		size := n.attrInt("size", 0)
		if size <= 0 || x.rank() < 3 || !x.dtype().IsFloat() {
			return nil, fmt.Errorf("LRN wants a positive size and float data of rank 3 or more (size %d, %s%v)", size, x.dtype(), x.shape())
		}
		alpha, beta, bias := n.attrFloat("alpha", 1e-4), n.attrFloat("beta", 0.75), n.attrFloat("bias", 1)
		// The squares summed over a window of size channels around each
		// (zero-padded): size slices of the padded squares added.
		lo := (size - 1) / 2
		c := x.shape()[1]
		g := im.builder()
		sq := g.op("multiply", nil, x, x)
		sq = g.do(func() (*value, error) { return im.padConst(sq, 1, lo, size-1-lo, 0) })
		var sum *value
		for k := range size {
			part := g.slice1(sq, 1, k, k+c)
			if sum == nil {
				sum = part
			} else {
				sum = g.op("add", nil, sum, part)
			}
		}
		dt := x.dtype()
		den := g.op("add", nil, g.op("multiply", nil, sum, scalar(dt, alpha/float64(size))), scalar(dt, bias))
		return g.result(g.op("divide", nil, x, g.op("power", nil, den, scalar(dt, beta))))
	})
	reg("Upsample", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		// Resize of opset 10 computes what Upsample did (asymmetric
		// coordinates), with the scales as its second input.
		r := *n
		r.opset = 10
		r.attrs = maps.Clone(n.attrs)
		r.attrs["nearest_mode"] = &onnxpb.AttributeProto{Name: proto.String("nearest_mode"), Type: onnxpb.AttributeProto_STRING.Enum(), S: []byte("floor")}
		if n.opset < 9 {
			sc, ok := n.attrs["scales"]
			if !ok {
				return nil, fmt.Errorf("Upsample has no scales attribute")
			}
			t := newTensor(ir.Float32, []int64{int64(len(sc.GetFloats()))})
			for i, f := range sc.GetFloats() {
				setElem(t.Data, ir.Float32, i, float64(f))
			}
			r.in = []*value{x, constant(t)}
		}
		if mode := n.attrString("mode", "nearest"); mode != "nearest" && mode != "linear" {
			return nil, fmt.Errorf("Upsample mode %q is not nearest or linear", mode)
		}
		return convertResize(im, &r)
	})
}
