package onnx

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// TopK without a sort: along the axis every element's rank is the count
// of elements that come before it in the order asked for (larger, or
// smaller, with ties broken by the lower index first, as ONNX wants),
// and output j is the element whose rank is j. The rank costs n² compares
// per row, which suits the short axes TopK is used on.

func init() {
	reg("TopK", 1, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		k := n.attrInt("k", -1)
		if n.opset >= 10 {
			t, err := n.knownInput(1, "K")
			if err != nil {
				return nil, err
			}
			if t == nil || t.NumElements() != 1 {
				return nil, fmt.Errorf("input 1 (K) must be one value")
			}
			k = t.ielem(0)
		}
		axis, err := normAxis(n.attrInt("axis", -1), x.rank())
		if err != nil {
			return nil, err
		}
		if d := x.shape()[axis]; k < 0 || k > d {
			return nil, fmt.Errorf("K = %d for an axis of %d elements", k, d)
		}
		// sorted=0 allows any order; the sorted one is an order.
		return im.topK(x, axis, k, n.attrInt("largest", 1) != 0)
	})
}

// topK returns the k largest (or smallest) elements of x along axis and
// their int64 indices, in order.
func (im *importer) topK(x *value, axis int, k int64, largest bool) ([]*value, error) {
	r := x.rank()
	d := x.shape()[axis]
	g := im.builder()
	// Move the axis last: xs is [..., d].
	perm, inv := axisLast(r, axis)
	xs := x
	if axis != r-1 {
		xs = g.permute(x, perm)
	}
	// before[..., i, j]: element j comes before element i.
	xi := g.op("expand_dims", map[string]any{"axis": anyInts([]int{r})}, xs)     // [..., d, 1]
	xj := g.op("expand_dims", map[string]any{"axis": anyInts([]int{r - 1})}, xs) // [..., 1, d]
	cmp := "less"
	if largest {
		cmp = "greater"
	}
	ties := newTensor(ir.Bool, []int64{d, d})
	for i := range d {
		for j := range i {
			setIElem(ties.Data, ir.Bool, int(i*d+j), 1)
		}
	}
	tie := g.op("minimum", nil, g.op("equal", nil, xj, xi), constant(ties))
	before := g.op("maximum", nil, g.op(cmp, nil, xj, xi), tie)
	rank := g.sum(g.cast(before, ir.Int64), []int{r}, false) // [..., d]
	// pick[..., o, i]: element i is output o.
	pick := g.op("equal", nil, g.op("expand_dims", map[string]any{"axis": anyInts([]int{r - 1})}, rank), iotaAlong(ir.Int64, k, r-1, r+1))
	idx := g.sum(g.op("where", nil, pick, iotaAlong(ir.Int64, d, r, r+1), scalar(ir.Int64, 0)), []int{r}, false) // [..., k]
	vals := g.do(func() (*value, error) { return im.gatherElements(xs, idx, r-1) })
	if axis != r-1 {
		vals, idx = g.permute(vals, inv), g.permute(idx, inv)
	}
	return g.result(vals, idx)
}
