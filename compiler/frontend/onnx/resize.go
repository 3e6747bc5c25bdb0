package onnx

import (
	"fmt"
	"math"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Resize is separable: along each resized axis, every output element is a
// weighted sum of a few input elements (one for nearest, two for linear,
// four for cubic) whose indices and weights depend only on the shapes, so
// they are computed here and the graph gathers (R.take) and blends them.

func init() { reg("Resize", 10, convertResize) }

func convertResize(im *importer, n *node) ([]*value, error) {
	x, err := n.need(0)
	if err != nil {
		return nil, err
	}
	if !x.dtype().IsFloat() {
		return nil, unsupported("Resize of %s", x.dtype())
	}
	mode := n.attrString("mode", "nearest")
	ct := n.attrString("coordinate_transformation_mode", "half_pixel")
	if n.opset < 11 {
		ct = "asymmetric"
	}
	switch ct {
	case "half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize":
	default:
		return nil, unsupported("Resize coordinate_transformation_mode %q", ct)
	}
	if n.attrInt("antialias", 0) != 0 {
		return nil, unsupported("Resize with antialias")
	}
	if p := n.attrString("keep_aspect_ratio_policy", "stretch"); p != "stretch" {
		return nil, unsupported("Resize keep_aspect_ratio_policy %q", p)
	}
	shape := x.shape()
	r := len(shape)
	axes := make([]int, r)
	for i := range axes {
		axes[i] = i
	}
	if a, ok := n.attrInts("axes"); ok {
		if axes, err = normAxes(a, r); err != nil {
			return nil, err
		}
	}
	scalesAt, sizesAt := 2, 3
	if n.opset < 11 {
		scalesAt, sizesAt = 1, -1
	}
	scales, err := n.knownInput(scalesAt, "scales")
	if err != nil {
		return nil, err
	}
	var sizes *Tensor
	if sizesAt > 0 {
		if sizes, err = n.knownInput(sizesAt, "sizes"); err != nil {
			return nil, err
		}
	}
	out := make([]int64, len(axes))
	scale := make([]float64, len(axes))
	switch {
	case sizes != nil && sizes.NumElements() > 0:
		if int(sizes.NumElements()) != len(axes) {
			return nil, fmt.Errorf("sizes has %d values for %d axes", sizes.NumElements(), len(axes))
		}
		for i, s := range sizes.Ints() {
			out[i], scale[i] = s, float64(s)/float64(shape[axes[i]])
		}
	case scales != nil && scales.NumElements() > 0:
		if int(scales.NumElements()) != len(axes) {
			return nil, fmt.Errorf("scales has %d values for %d axes", scales.NumElements(), len(axes))
		}
		for i, s := range scales.Floats() {
			if s <= 0 {
				return nil, fmt.Errorf("scale %g is not positive", s)
			}
			out[i], scale[i] = int64(math.Floor(float64(shape[axes[i]])*s)), s
		}
	default:
		return nil, fmt.Errorf("neither scales nor sizes given")
	}
	var roi []float64
	if ct == "tf_crop_and_resize" {
		t, err := n.knownInput(1, "roi")
		if err != nil {
			return nil, err
		}
		if t == nil || int(t.NumElements()) != 2*len(axes) {
			return nil, fmt.Errorf("tf_crop_and_resize wants roi of %d values", 2*len(axes))
		}
		roi = t.Floats()
	}
	var outside *value // the outputs a crop puts outside the input
	for i, a := range axes {
		var crop []float64
		if roi != nil {
			crop = []float64{roi[i], roi[i+len(axes)]}
		}
		taps, oor, err := resizeTaps(n, mode, ct, shape[a], out[i], scale[i]*float64(shape[a]), crop)
		if err != nil {
			return nil, err
		}
		if x, err = im.blend(x, a, taps); err != nil {
			return nil, err
		}
		if oor != nil {
			ms := make([]int64, r)
			for j := range ms {
				ms[j] = 1
			}
			ms[a] = out[i]
			m := newTensor(ir.Bool, ms)
			for o, b := range oor {
				setElem(m.Data, ir.Bool, o, b2f(b))
			}
			if outside == nil {
				outside = constant(m)
			} else if outside, err = im.emit("relax.maximum", nil, outside, constant(m)); err != nil {
				return nil, err
			}
		}
	}
	if outside != nil {
		return ret(im.emit("relax.where", nil, outside, scalar(x.dtype(), n.attrFloat("extrapolation_value", 0)), x))
	}
	return []*value{x}, nil
}

// tap is one input element's share in every output element of an axis.
type tap struct {
	idx []int64
	w   []float64
}

// resizeTaps computes an axis's taps; outF is the output length before
// rounding down (in·scale), which align_corners divides by as ONNX does.
// With tf_crop_and_resize, crop is the axis's [start, end] of the roi and
// oor marks the outputs that fall outside the input.
func resizeTaps(n *node, mode, ct string, in, out int64, outF float64, crop []float64) (taps []tap, oor []bool, err error) {
	scale := outF / float64(in)
	orig := func(o int64) float64 {
		xo := float64(o)
		switch ct {
		case "tf_crop_and_resize":
			if out > 1 {
				return crop[0]*float64(in-1) + xo*(crop[1]-crop[0])*float64(in-1)/float64(out-1)
			}
			return 0.5 * (crop[0] + crop[1]) * float64(in-1)
		case "half_pixel":
			return (xo+0.5)/scale - 0.5
		case "pytorch_half_pixel":
			if out > 1 {
				return (xo+0.5)/scale - 0.5
			}
			return 0
		case "align_corners":
			if out == 1 {
				return 0
			}
			return xo * float64(in-1) / (outF - 1)
		case "tf_half_pixel_for_nn":
			return (xo + 0.5) / scale
		}
		return xo / scale
	}
	clampIdx := func(i int64) int64 { return max(0, min(i, in-1)) }
	switch mode {
	case "nearest":
		t := tap{idx: make([]int64, out), w: make([]float64, out)}
		nm := n.attrString("nearest_mode", "round_prefer_floor")
		for o := range out {
			xo := orig(o)
			var i float64
			switch nm {
			case "round_prefer_floor":
				if xo-math.Floor(xo) == 0.5 {
					i = math.Floor(xo)
				} else {
					i = math.Round(xo)
				}
			case "round_prefer_ceil":
				i = math.Floor(xo + 0.5)
			case "floor":
				i = math.Floor(xo)
			case "ceil":
				i = math.Ceil(xo)
			default:
				return nil, nil, unsupported("Resize nearest_mode %q", nm)
			}
			t.idx[o], t.w[o] = clampIdx(int64(i)), 1
		}
		return []tap{t}, outsideOf(ct, in, out, orig), nil
	case "linear", "cubic":
		k := 2
		if mode == "cubic" {
			k = 4
		}
		a := n.attrFloat("cubic_coeff_a", -0.75)
		exclude := n.attrInt("exclude_outside", 0) != 0
		taps = make([]tap, k)
		for j := range taps {
			taps[j] = tap{idx: make([]int64, out), w: make([]float64, out)}
		}
		for o := range out {
			xo := orig(o)
			i0 := int64(math.Floor(xo))
			r := xo - float64(i0)
			var ws []float64
			var first int64
			if k == 2 {
				ws, first = []float64{1 - r, r}, i0
			} else {
				ws = []float64{
					((a*(r+1)-5*a)*(r+1)+8*a)*(r+1) - 4*a,
					((a+2)*r-(a+3))*r*r + 1,
					((a+2)*(1-r)-(a+3))*(1-r)*(1-r) + 1,
					((a*(2-r)-5*a)*(2-r)+8*a)*(2-r) - 4*a,
				}
				first = i0 - 1
			}
			if exclude {
				sum := 0.0
				for j := range ws {
					if i := first + int64(j); i < 0 || i >= in {
						ws[j] = 0
					}
					sum += ws[j]
				}
				if sum != 0 {
					for j := range ws {
						ws[j] /= sum
					}
				}
			}
			for j := range ws {
				taps[j].idx[o], taps[j].w[o] = clampIdx(first+int64(j)), ws[j]
			}
		}
		return taps, outsideOf(ct, in, out, orig), nil
	}
	return nil, nil, unsupported("Resize mode %q", mode)
}

// outsideOf marks, for tf_crop_and_resize, the outputs whose position in
// the input lies outside it (nil for the other transformations).
func outsideOf(ct string, in, out int64, orig func(int64) float64) []bool {
	if ct != "tf_crop_and_resize" {
		return nil
	}
	oor := make([]bool, out)
	for o := range out {
		x := orig(o)
		oor[o] = x < 0 || x > float64(in-1)
	}
	return oor
}

// blend computes Σ take(x, tap.idx, axis)·tap.w along axis.
func (im *importer) blend(x *value, axis int, taps []tap) (*value, error) {
	s := x.shape()
	if len(taps) == 1 && int64(len(taps[0].idx)) == s[axis] {
		ident := true
		for i, v := range taps[0].idx {
			ident = ident && v == int64(i)
		}
		if ident {
			return x, nil
		}
	}
	wshape := make([]int64, len(s))
	for i := range wshape {
		wshape[i] = 1
	}
	var acc *value
	for _, t := range taps {
		g, err := im.take(x, t.idx, axis)
		if err != nil {
			return nil, err
		}
		if len(taps) > 1 {
			wshape[axis] = int64(len(t.w))
			w := newTensor(x.dtype(), wshape)
			for i, v := range t.w {
				setElem(w.Data, w.DType, i, v)
			}
			if g, err = im.emit("relax.multiply", nil, g, constant(w)); err != nil {
				return nil, err
			}
		}
		if acc == nil {
			acc = g
		} else if acc, err = im.emit("relax.add", nil, acc, g); err != nil {
			return nil, err
		}
	}
	return acc, nil
}
