package onnx

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Operators whose output shape depends on the values of their input:
// NonZero, Unique, Compress and NonMaxSuppression. kiln's graphs have
// static shapes, so these are computed at import time from inputs known
// then (constants, initializers, or model inputs fixed with
// Options.Known); an input computed at run time is a clear error naming
// it. Compress needs only its condition known: the data is gathered at
// run time.

func init() {
	reg("NonZero", 9, func(im *importer, n *node) ([]*value, error) {
		x, err := n.knownInput(0, "X (the nonzero positions decide the output's shape)")
		if err != nil {
			return nil, err
		}
		if x == nil {
			return nil, fmt.Errorf("input 0 is missing")
		}
		var at []int64
		for i := range int(x.NumElements()) {
			if x.elem(i) != 0 {
				at = append(at, int64(i))
			}
		}
		r := len(x.Shape)
		out := newTensor(ir.Int64, []int64{int64(r), int64(len(at))})
		str := stridesOf(x.Shape)
		for j, f := range at {
			for d := range r {
				putInt(out.Data, ir.Int64, d*len(at)+j, f/str[d]%x.Shape[d])
			}
		}
		return []*value{constant(out)}, nil
	})
	reg("Compress", 9, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		c, err := n.knownInput(1, "condition (it decides the output's shape)")
		if err != nil {
			return nil, err
		}
		if c == nil || len(c.Shape) != 1 {
			return nil, fmt.Errorf("input 1 (condition) must be 1-D")
		}
		axis := 0
		if a, ok := n.attrs["axis"]; ok {
			if axis, err = normAxis(a.GetI(), x.rank()); err != nil {
				return nil, err
			}
		} else if x, err = im.reshape(x, []int64{numElements(x.shape())}); err != nil {
			return nil, err
		}
		d := x.shape()[axis]
		if c.Shape[0] > d {
			return nil, fmt.Errorf("condition has %d values for an axis of %d", c.Shape[0], d)
		}
		var idx []int64
		for i := range c.Shape[0] {
			if c.elem(int(i)) != 0 {
				idx = append(idx, i)
			}
		}
		return ret(im.take(x, idx, axis))
	})
	reg("Unique", 11, func(im *importer, n *node) ([]*value, error) {
		x, err := n.knownInput(0, "X (the distinct values decide the output's shape)")
		if err != nil {
			return nil, err
		}
		if x == nil {
			return nil, fmt.Errorf("input 0 is missing")
		}
		axis := -1
		if a, ok := n.attrs["axis"]; ok {
			if axis, err = normAxis(a.GetI(), len(x.Shape)); err != nil {
				return nil, err
			}
		}
		return hostUnique(x, axis, n.attrInt("sorted", 1) != 0), nil
	})
	reg("NonMaxSuppression", 10, convertNMS)
}

// hostUnique is Unique of x along axis (−1: of the flattened x): the
// distinct slices (sorted, or in order of first appearance), the index of
// each one's first appearance, each slice's index among them, and the
// count of each.
func hostUnique(x *Tensor, axis int, sorted bool) []*value {
	if axis < 0 {
		x = x.reshaped([]int64{x.NumElements()})
		axis = 0
	}
	d := x.Shape[axis]
	outer, inner := numElements(x.Shape[:axis]), numElements(x.Shape[axis+1:])
	es := int64(x.DType.Size())
	// slice i as comparable values and as bytes
	vals := func(i int64) []float64 {
		v := make([]float64, 0, outer*inner)
		for o := range outer {
			for k := range inner {
				v = append(v, x.elem(int((o*d+i)*inner+k)))
			}
		}
		return v
	}
	key := func(i int64) []byte {
		var b []byte
		for o := range outer {
			at := ((o*d + i) * inner) * es
			b = append(b, x.Data[at:at+inner*es]...)
		}
		return b
	}
	var first []int64 // first appearance of each distinct slice
	of := make([]int64, d)
	for i := range d {
		j := slices.IndexFunc(first, func(f int64) bool { return bytes.Equal(key(f), key(i)) })
		if j < 0 {
			j = len(first)
			first = append(first, i)
		}
		of[i] = int64(j)
	}
	order := make([]int, len(first))
	for i := range order {
		order[i] = i
	}
	if sorted {
		sort.SliceStable(order, func(a, b int) bool {
			return slices.Compare(vals(first[order[a]]), vals(first[order[b]])) < 0
		})
	}
	pos := make([]int64, len(first)) // position in the output of distinct slice j
	for p, j := range order {
		pos[j] = int64(p)
	}
	u := int64(len(first))
	idx := make([]int64, u)
	counts := make([]int64, u)
	inverse := make([]int64, d)
	for p, j := range order {
		idx[p] = first[j]
	}
	for i := range d {
		inverse[i] = pos[of[i]]
		counts[pos[of[i]]]++
	}
	y, _ := hostGather(x, intTensor(idx), axis)
	return []*value{constant(y), constant(intTensor(idx)), constant(intTensor(inverse)), constant(intTensor(counts))}
}

// convertNMS is NonMaxSuppression: per batch and class, boxes taken in
// order of falling score (ties by lower index) above score_threshold,
// each kept unless its IoU with one kept already exceeds iou_threshold,
// at most max_output_boxes_per_class of them; the output lists [batch,
// class, box] of each kept box.
func convertNMS(im *importer, n *node) ([]*value, error) {
	boxes, err := n.knownInput(0, "boxes (the boxes kept decide the output's shape)")
	if err != nil {
		return nil, err
	}
	scores, err := n.knownInput(1, "scores (the boxes kept decide the output's shape)")
	if err != nil {
		return nil, err
	}
	if boxes == nil || scores == nil || len(boxes.Shape) != 3 || boxes.Shape[2] != 4 || len(scores.Shape) != 3 ||
		scores.Shape[0] != boxes.Shape[0] || scores.Shape[2] != boxes.Shape[1] {
		return nil, fmt.Errorf("want boxes [B, N, 4] and scores [B, C, N]")
	}
	maxOut, iouT, scoreT := int64(0), 0.0, math.Inf(-1)
	for i, dst := range []any{&maxOut, &iouT, &scoreT} {
		t, err := n.knownInput(i+2, []string{"max_output_boxes_per_class", "iou_threshold", "score_threshold"}[i])
		if err != nil {
			return nil, err
		}
		if t == nil || t.NumElements() == 0 {
			continue
		}
		switch p := dst.(type) {
		case *int64:
			*p = t.ielem(0)
		case *float64:
			*p = t.elem(0)
		}
	}
	center := n.attrInt("center_point_box", 0) != 0
	nb, nc, nbox := boxes.Shape[0], scores.Shape[1], boxes.Shape[1]
	corners := func(b, i int64) (y1, x1, y2, x2 float64) {
		v := func(k int64) float64 { return boxes.elem(int((b*nbox+i)*4 + k)) }
		if center {
			xc, yc, w, h := v(0), v(1), v(2), v(3)
			return yc - h/2, xc - w/2, yc + h/2, xc + w/2
		}
		return math.Min(v(0), v(2)), math.Min(v(1), v(3)), math.Max(v(0), v(2)), math.Max(v(1), v(3))
	}
	suppress := func(b, i, j int64) bool {
		ay1, ax1, ay2, ax2 := corners(b, i)
		by1, bx1, by2, bx2 := corners(b, j)
		ih := math.Min(ay2, by2) - math.Max(ay1, by1)
		iw := math.Min(ax2, bx2) - math.Max(ax1, bx1)
		if ih <= 0 || iw <= 0 {
			return false
		}
		inter := ih * iw
		a1, a2 := (ay2-ay1)*(ax2-ax1), (by2-by1)*(bx2-bx1)
		union := a1 + a2 - inter
		if a1 <= 0 || a2 <= 0 || union <= 0 {
			return false
		}
		return inter/union > iouT
	}
	var sel []int64
	for b := range nb {
		for c := range nc {
			var cand []int64
			for i := range nbox {
				if scores.elem(int((b*nc+c)*nbox+i)) > scoreT {
					cand = append(cand, i)
				}
			}
			score := func(i int64) float64 { return scores.elem(int((b*nc+c)*nbox + i)) }
			sort.SliceStable(cand, func(p, q int) bool { return score(cand[p]) > score(cand[q]) })
			var kept []int64
			for _, i := range cand {
				if int64(len(kept)) >= maxOut {
					break
				}
				if !slices.ContainsFunc(kept, func(j int64) bool { return suppress(b, i, j) }) {
					kept = append(kept, i)
					sel = append(sel, b, c, i)
				}
			}
		}
	}
	return []*value{constant(intTensor(sel, int64(len(sel)/3), 3))}, nil
}
