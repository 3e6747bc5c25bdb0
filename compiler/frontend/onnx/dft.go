package onnx

import (
	"fmt"
	"math"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// DFT and STFT as matrix products: the signal axis (moved last) is
// multiplied by the cosine and sine matrices of the transform, built at
// import. The products run in float64, so that the outputs that are
// zero in exact arithmetic come out within ONNX's absolute tolerance.

func init() {
	reg("DFT", 17, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		r := x.rank()
		if r < 2 || x.shape()[r-1] != 1 && x.shape()[r-1] != 2 || !x.dtype().IsFloat() {
			return nil, fmt.Errorf("want float input whose last axis holds 1 (real) or 2 (complex) values, got %s%v", x.dtype(), x.shape())
		}
		axis := n.attrInt("axis", 1)
		if n.opset >= 20 {
			if t, err := n.knownInput(2, "axis"); err != nil {
				return nil, err
			} else if t != nil {
				axis = t.ielem(0)
			}
		}
		a, err := normAxis(axis, r-1)
		if err != nil {
			return nil, err
		}
		length := x.shape()[a]
		if t, err := n.knownInput(1, "dft_length"); err != nil {
			return nil, err
		} else if t != nil && t.NumElements() == 1 {
			length = t.ielem(0)
		}
		inverse, onesided := n.attrInt("inverse", 0) != 0, n.attrInt("onesided", 0) != 0
		if inverse && onesided {
			return nil, unsupported("DFT with both inverse and onesided")
		}
		g := im.builder()
		// Pad or cut the signal to the length.
		if d := x.shape()[a]; length > d {
			x = g.do(func() (*value, error) { return im.padConst(x, a, 0, length-d, 0) })
		} else if length < d {
			x = g.slice1(x, a, 0, length)
		}
		return g.result(im.dftAxis(g, x, a, length, inverse, onesided))
	})
	reg("STFT", 17, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		if x.rank() != 3 || !x.dtype().IsFloat() {
			return nil, fmt.Errorf("want a float signal [batch, length, 1 or 2], got %s%v", x.dtype(), x.shape())
		}
		st, err := n.knownInput(1, "frame_step")
		if err != nil {
			return nil, err
		}
		if st == nil || st.NumElements() != 1 || st.ielem(0) <= 0 {
			return nil, fmt.Errorf("input 1 (frame_step) must be one positive value")
		}
		step := st.ielem(0)
		win := n.input(2)
		frame := int64(-1)
		if win != nil {
			if win.rank() != 1 {
				return nil, fmt.Errorf("input 2 (window) of shape %v, want 1-D", win.shape())
			}
			frame = win.shape()[0]
		}
		if t, err := n.knownInput(3, "frame_length"); err != nil {
			return nil, err
		} else if t != nil {
			frame = t.ielem(0)
		}
		sig := x.shape()[1]
		if frame <= 0 || frame > sig || win != nil && (win.rank() != 1 || win.shape()[0] != frame) {
			return nil, fmt.Errorf("frame length %d does not fit a signal of %d (and the window, if given, must be 1-D of that length)", frame, sig)
		}
		frames := (sig-frame)/step + 1
		idx := newTensor(ir.Int64, []int64{frames, frame})
		for f := range frames {
			for k := range frame {
				putInt(idx.Data, ir.Int64, int(f*frame+k), f*step+k)
			}
		}
		g := im.builder()
		fr := g.op("take", map[string]any{"axis": int64(1)}, x, constant(idx)) // [B, F, L, c]
		if win != nil {
			fr = g.op("multiply", nil, fr, g.reshape(win, []int64{1, 1, frame, 1}))
		}
		return g.result(im.dftAxis(g, fr, 2, frame, false, n.attrInt("onesided", 1) != 0))
	})
}

// dftAxis transforms axis a of x [..., c] (c = 1 real, 2 complex) of
// length n, giving [..., 2] with the axis n long (n/2+1 when onesided).
func (im *importer) dftAxis(g *gb, x *value, a int, n int64, inverse, onesided bool) *value {
	if g.err != nil {
		return nil
	}
	r := x.rank()
	dt := x.dtype()
	k := n
	if onesided {
		k = n/2 + 1
	}
	// [..., n, c] → real and imaginary parts [..., n], the axis last.
	perm, inv := axisLast(r-1, a)
	part := func(i int64) *value {
		p := g.reshape(g.slice1(x, r-1, i, i+1), x.shape()[:r-1])
		if a != r-2 {
			p = g.permute(p, perm)
		}
		return g.cast(p, ir.Float64)
	}
	re := part(0)
	var imag *value
	if x.shape()[r-1] == 2 {
		imag = part(1)
	}
	// e^(∓2πi·jk/n): cos and ∓sin matrices [n, k].
	cos, sin := newTensor(ir.Float64, []int64{n, k}), newTensor(ir.Float64, []int64{n, k})
	sign, scale := -1.0, 1.0
	if inverse {
		sign, scale = 1, 1/float64(n)
	}
	for j := range n {
		for q := range k {
			t := 2 * math.Pi * float64((j*q)%n) / float64(n)
			setElem(cos.Data, ir.Float64, int(j*k+q), math.Cos(t)*scale)
			setElem(sin.Data, ir.Float64, int(j*k+q), sign*math.Sin(t)*scale)
		}
	}
	// (re + i·im)(cos + i·sin) = re·cos − im·sin + i(re·sin + im·cos)
	outRe := g.op("matmul", nil, re, constant(cos))
	outIm := g.op("matmul", nil, re, constant(sin))
	if imag != nil {
		outRe = g.op("subtract", nil, outRe, g.op("matmul", nil, imag, constant(sin)))
		outIm = g.op("add", nil, outIm, g.op("matmul", nil, imag, constant(cos)))
	}
	back := func(v *value) *value {
		if a != r-2 {
			v = g.permute(v, inv)
		}
		return g.op("expand_dims", map[string]any{"axis": anyInts([]int{r - 1})}, g.cast(v, dt))
	}
	return g.concat([]*value{back(outRe), back(outIm)}, r-1)
}
