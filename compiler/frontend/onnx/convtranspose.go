package onnx

import (
	"fmt"
	"slices"
)

// ConvTranspose is a convolution of the input with zeros inserted between
// its elements (stride − 1 of them), padded by the kernel's extent less
// the pads, with the kernel flipped and its channel axes swapped per
// group. The weight must be known at import time (it is rearranged here).

func init() { reg("ConvTranspose", 7, convertConvTranspose) }

func convertConvTranspose(im *importer, n *node) ([]*value, error) {
	x, err := n.need(0)
	if err != nil {
		return nil, err
	}
	w, err := n.knownInput(1, "weight")
	if err != nil {
		return nil, err
	}
	if w == nil {
		return nil, fmt.Errorf("input 1 (weight) is missing")
	}
	xs, ws := x.shape(), w.Shape
	if len(xs) != 3 && len(xs) != 4 || len(ws) != len(xs) {
		return nil, unsupported("ConvTranspose of %d-D data (kiln imports 1-D and 2-D)", len(xs)-2)
	}
	if !x.dtype().IsFloat() || w.DType != x.dtype() {
		return nil, unsupported("ConvTranspose of %s", x.dtype())
	}
	oneD := len(xs) == 3
	if oneD {
		xs = []int64{xs[0], xs[1], 1, xs[2]}
		if x, err = im.reshape(x, xs); err != nil {
			return nil, err
		}
		w = w.reshaped([]int64{ws[0], ws[1], 1, ws[2]})
		ws = w.Shape
	}
	k := 2
	get := func(name string, def int64, size int) ([]int64, error) {
		v, ok := n.attrInts(name)
		if !ok {
			v = slices.Repeat([]int64{def}, size)
		}
		if oneD && len(v) == size/2 {
			if size == 4 {
				v = []int64{def, v[0], def, v[1]}
			} else {
				v = []int64{def, v[0]}
			}
		}
		if len(v) != size {
			return nil, fmt.Errorf("%s %v: want %d values", name, v, size)
		}
		return v, nil
	}
	strides, err := get("strides", 1, k)
	if err != nil {
		return nil, err
	}
	dil, err := get("dilations", 1, k)
	if err != nil {
		return nil, err
	}
	outPad, err := get("output_padding", 0, k)
	if err != nil {
		return nil, err
	}
	pads, err := get("pads", 0, 2*k)
	if err != nil {
		return nil, err
	}
	groups := n.attrInt("group", 1)
	cin, coutG := ws[0], ws[1]
	if groups < 1 || cin%groups != 0 || xs[1] != cin {
		return nil, fmt.Errorf("weight of shape %v does not fit data of shape %v in %d groups", ws, xs, groups)
	}
	kext := []int64{(ws[2]-1)*dil[0] + 1, (ws[3]-1)*dil[1] + 1}
	full := func(i int) int64 { return strides[i]*(xs[2+i]-1) + outPad[i] + kext[i] }
	if os, ok := n.attrInts("output_shape"); ok {
		if oneD && len(os) == 1 {
			os = []int64{1, os[0]}
		}
		if len(os) != k {
			return nil, fmt.Errorf("output_shape %v: want %d values", os, k)
		}
		upper := n.attrString("auto_pad", "NOTSET") != "SAME_LOWER"
		for i := range k {
			total := full(i) - os[i]
			lo, hi := total-total/2, total/2
			if upper {
				lo, hi = total/2, total-total/2
			}
			pads[i], pads[i+k] = lo, hi
		}
	} else {
		switch ap := n.attrString("auto_pad", "NOTSET"); ap {
		case "NOTSET", "", "VALID":
			if ap == "VALID" {
				pads = make([]int64, 2*k)
			}
		case "SAME_UPPER", "SAME_LOWER":
			for i := range k {
				total := full(i) - xs[2+i]*strides[i]
				lo, hi := total-total/2, total/2
				if ap == "SAME_UPPER" {
					lo, hi = total/2, total-total/2
				}
				pads[i], pads[i+k] = lo, hi
			}
		default:
			return nil, unsupported("auto_pad=%q", ap)
		}
	}
	// Insert stride − 1 zeros after each element along H and W.
	if strides[0] > 1 || strides[1] > 1 {
		if x, err = im.dilate(x, strides); err != nil {
			return nil, err
		}
	}
	// Pad (or crop) by the kernel's extent less the pads.
	var convPad [4]int64
	for i := range k {
		lo, hi := kext[i]-1-pads[i], kext[i]-1-pads[i+k]+outPad[i]
		if lo < 0 || hi < 0 {
			s := x.shape()
			b, e := max(-lo, 0), s[2+i]-max(-hi, 0)
			if e <= b {
				return nil, fmt.Errorf("pads %v crop away the output", pads)
			}
			if x, err = im.slice(x, []int{2 + i}, []int64{b}, []int64{e}, []int64{1}); err != nil {
				return nil, err
			}
		}
		convPad[i], convPad[i+2] = max(lo, 0), max(hi, 0)
	}
	// The kernel: flipped, [Cin, Cout/g, kh, kw] → [Cout, Cin/g, kh, kw].
	cinG, kh, kw := cin/groups, ws[2], ws[3]
	nw := newTensor(w.DType, []int64{coutG * groups, cinG, kh, kw})
	es := w.DType.Size()
	for g := range groups {
		for oc := range coutG {
			for ic := range cinG {
				for y := range kh {
					for xx := range kw {
						src := (((g*cinG+ic)*coutG+oc)*kh+(kh-1-y))*kw + (kw - 1 - xx)
						dst := (((g*coutG+oc)*cinG+ic)*kh+y)*kw + xx
						copy(nw.Data[dst*int64(es):(dst+1)*int64(es)], w.Data[src*int64(es):(src+1)*int64(es)])
					}
				}
			}
		}
	}
	nw.Name = n.p.GetInput()[1]
	y, err := im.emit("relax.nn.conv2d", map[string]any{
		"strides": anyInts([]int64{1, 1}), "padding": anyInts(convPad[:]), "dilation": anyInts(dil), "groups": groups,
	}, x, &value{c: nw, init: n.input(1).init})
	if err != nil {
		return nil, err
	}
	if b := n.input(2); b != nil {
		bb, err := im.reshape(b, []int64{1, coutG * groups, 1, 1})
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

// dilate inserts s−1 zeros after every element of the last two axes of
// x (N, C, H, W), giving (N, C, (H−1)·sh+1, (W−1)·sw+1).
func (im *importer) dilate(x *value, s []int64) (*value, error) {
	sh := x.shape()
	nn, c, h, w := sh[0], sh[1], sh[2], sh[3]
	v, err := im.reshape(x, []int64{nn, c, h, 1, w, 1})
	if err != nil {
		return nil, err
	}
	zeros := func(shape []int64) *value { return constant(newTensor(x.dtype(), shape)) }
	if s[0] > 1 {
		if v, err = im.concat([]*value{v, zeros([]int64{nn, c, h, s[0] - 1, w, 1})}, 3); err != nil {
			return nil, err
		}
	}
	if s[1] > 1 {
		if v, err = im.concat([]*value{v, zeros([]int64{nn, c, h, s[0], w, s[1] - 1})}, 5); err != nil {
			return nil, err
		}
	}
	if v, err = im.reshape(v, []int64{nn, c, h * s[0], w * s[1]}); err != nil {
		return nil, err
	}
	return im.slice(v, []int{2, 3}, []int64{0, 0}, []int64{(h-1)*s[0] + 1, (w-1)*s[1] + 1}, []int64{1, 1})
}
