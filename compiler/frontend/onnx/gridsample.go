package onnx

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// GridSample of 4-D data: each output pixel reads the input at the
// location its grid entry names, through nearest, bilinear or bicubic
// taps. The locations, the taps' indices and weights are computed by
// elementwise graph operators from the grid, and each tap is one gather
// from the flattened image, as ONNX's reference defines it: a location
// outside the image is first clamped (border) or reflected (reflection)
// when the padding mode says so, and each tap outside the image reads
// zero, the border pixel or the reflected pixel.

func init() {
	reg("GridSample", 16, convertGridSample)
}

// gsAxis is one spatial axis of a GridSample: its size and the bounds a
// location may take.
type gsAxis struct {
	size   int64
	lo, hi float64
}

func convertGridSample(im *importer, n *node) ([]*value, error) {
	in, err := n.inputs(2)
	if err != nil {
		return nil, err
	}
	x, grid := in[0], in[1]
	xs, gs := x.shape(), grid.shape()
	if len(xs) != 4 || len(gs) != 4 || gs[3] != 2 || gs[0] != xs[0] || !x.dtype().IsFloat() {
		return nil, unsupported("GridSample of %s%v with a grid of %v (kiln imports 4-D float data and an [N, H, W, 2] grid)", x.dtype(), xs, gs)
	}
	mode := n.attrString("mode", "bilinear")
	switch mode {
	case "linear":
		mode = "bilinear"
	case "cubic":
		mode = "bicubic"
	case "bilinear", "bicubic", "nearest":
	default:
		return nil, fmt.Errorf("mode %q is not bilinear, bicubic or nearest", mode)
	}
	pad := n.attrString("padding_mode", "zeros")
	if pad != "zeros" && pad != "border" && pad != "reflection" {
		return nil, fmt.Errorf("padding_mode %q is not zeros, border or reflection", pad)
	}
	align := n.attrInt("align_corners", 0) != 0
	nn, c, h, w := xs[0], xs[1], xs[2], xs[3]
	ho, wo := gs[1], gs[2]
	axes := [2]gsAxis{{size: w, lo: -0.5, hi: float64(w) - 0.5}, {size: h, lo: -0.5, hi: float64(h) - 0.5}}
	if align {
		axes = [2]gsAxis{{size: w, lo: 0, hi: float64(w - 1)}, {size: h, lo: 0, hi: float64(h - 1)}}
	}
	g := im.builder()
	dt := x.dtype()
	k := func(v float64) *value { return scalar(dt, v) }
	// Locations in pixels, [N, Ho, Wo] each.
	var loc [2]*value
	var out *value // any coordinate outside its bounds
	for i, a := range axes {
		gv := g.reshape(g.slice1(grid, 3, int64(i), int64(i+1)), []int64{nn, ho, wo})
		if align {
			loc[i] = g.op("multiply", nil, g.op("add", nil, gv, k(1)), k(float64(a.size-1)/2))
		} else {
			loc[i] = g.op("divide", nil, g.op("subtract", nil, g.op("multiply", nil, g.op("add", nil, gv, k(1)), k(float64(a.size))), k(1)), k(2))
		}
		if mode == "nearest" {
			loc[i] = g.op("round", nil, loc[i])
		}
		o := g.op("maximum", nil, g.op("less", nil, loc[i], k(a.lo)), g.op("greater", nil, loc[i], k(a.hi)))
		if out == nil {
			out = o
		} else {
			out = g.op("maximum", nil, out, o)
		}
	}
	if pad != "zeros" {
		for i, a := range axes {
			var moved *value
			if pad == "border" {
				moved = g.do(func() (*value, error) { return im.clip(loc[i], 0, float64(a.size-1), true, true) })
			} else {
				moved = gsReflect(g, loc[i], a.lo, a.hi)
			}
			loc[i] = g.op("where", nil, out, moved, loc[i])
		}
	}
	// Taps per axis: their coordinates and weights.
	type tap struct{ at, wt *value }
	taps := [2][]tap{}
	for i := range axes {
		l := loc[i]
		switch mode {
		case "nearest":
			taps[i] = []tap{{at: l}}
		case "bilinear":
			f := g.op("floor", nil, l)
			d := g.op("subtract", nil, l, f)
			taps[i] = []tap{{f, g.op("subtract", nil, k(1), d)}, {g.op("add", nil, f, k(1)), d}}
		default:
			f := g.op("floor", nil, l)
			d := g.op("subtract", nil, l, f)
			for j := range 4 {
				at := g.op("add", nil, f, k(float64(j-1)))
				taps[i] = append(taps[i], tap{at, cubicCoeff(g, d, j)})
			}
		}
	}
	// Each tap's index in the flat image and whether it reads zero.
	fix := func(t *value, a gsAxis) (idx, valid *value) {
		switch pad {
		case "zeros":
			valid = g.op("minimum", nil, g.op("greater_equal", nil, t, k(0)), g.op("less", nil, t, k(float64(a.size))))
		case "reflection":
			t = gsReflect(g, t, a.lo, a.hi)
			// int() of the reflected location: toward zero.
			t = g.op("where", nil, g.op("less", nil, t, k(0)), g.op("ceil", nil, t), g.op("floor", nil, t))
		}
		t = g.do(func() (*value, error) { return im.clip(t, 0, float64(a.size-1), true, true) })
		return g.cast(t, ir.Int64), valid
	}
	flat := g.reshape(x, []int64{nn, c, h * w})
	var sum *value
	for _, ty := range taps[1] {
		iy, vy := fix(ty.at, axes[1])
		for _, tx := range taps[0] {
			ix, vx := fix(tx.at, axes[0])
			idx := g.op("add", nil, g.op("multiply", nil, iy, scalar(ir.Int64, float64(w))), ix)
			idx = g.op("broadcast_to", nil, g.reshape(idx, []int64{nn, 1, ho * wo}), &ir.ShapeExpr{Values: ir.Dims(nn, c, ho*wo)})
			px := g.do(func() (*value, error) { return im.gatherElements(flat, idx, 2) })
			px = g.reshape(px, []int64{nn, c, ho, wo})
			var wt *value // nil: weight 1 (nearest)
			if ty.wt != nil {
				wt = g.op("multiply", nil, ty.wt, tx.wt)
			}
			if vy != nil {
				m := g.cast(g.op("minimum", nil, vy, vx), dt)
				if wt == nil {
					wt = m
				} else {
					wt = g.op("multiply", nil, wt, m)
				}
			}
			if wt != nil {
				px = g.op("multiply", nil, px, g.reshape(wt, []int64{nn, 1, ho, wo}))
			}
			if sum == nil {
				sum = px
			} else {
				sum = g.op("add", nil, sum, px)
			}
		}
	}
	return g.result(sum)
}

// gsReflect folds location t into [lo, hi] by reflecting at the near
// border as often as needed.
func gsReflect(g *gb, t *value, lo, hi float64) *value {
	if g.err != nil {
		return nil
	}
	dt := t.dtype()
	k := func(v float64) *value { return scalar(dt, v) }
	rng := hi - lo
	fold := func(dx *value, near, far float64) *value {
		// n = ⌊dx/rng⌋, r = dx − n·rng: near ± r for even n, far ∓ r for odd.
		nq := g.op("floor", nil, g.op("divide", nil, dx, k(rng)))
		r := g.op("subtract", nil, dx, g.op("multiply", nil, nq, k(rng)))
		odd := g.op("greater", nil, g.op("subtract", nil, nq, g.op("multiply", nil, g.op("floor", nil, g.op("divide", nil, nq, k(2))), k(2))), k(0.5))
		sign := 1.0
		if near > far {
			sign = -1
		}
		even := g.op("add", nil, k(near), g.op("multiply", nil, r, k(sign)))
		oddV := g.op("subtract", nil, k(far), g.op("multiply", nil, r, k(sign)))
		return g.op("where", nil, odd, oddV, even)
	}
	below := fold(g.op("subtract", nil, k(lo), t), lo, hi)
	above := fold(g.op("subtract", nil, t, k(hi)), hi, lo)
	return g.op("where", nil, g.op("less", nil, t, k(lo)), below, g.op("where", nil, g.op("greater", nil, t, k(hi)), above, t))
}

// cubicCoeff is the weight of cubic tap j (at ⌊x⌋ − 1 + j) for the
// fraction d = x − ⌊x⌋, Keys' kernel with a = −0.75.
func cubicCoeff(g *gb, d *value, j int) *value {
	dt := d.dtype()
	k := func(v float64) *value { return scalar(dt, v) }
	const a = -0.75
	// distance of the tap from x
	var s *value
	switch j {
	case 0:
		s = g.op("add", nil, d, k(1))
	case 1:
		s = d
	case 2:
		s = g.op("subtract", nil, k(1), d)
	default:
		s = g.op("subtract", nil, k(2), d)
	}
	if j == 1 || j == 2 {
		// ((a+2)s − (a+3))s² + 1
		p := g.op("subtract", nil, g.op("multiply", nil, s, k(a+2)), k(a+3))
		return g.op("add", nil, g.op("multiply", nil, g.op("multiply", nil, p, s), s), k(1))
	}
	// ((a·s − 5a)s + 8a)s − 4a
	p := g.op("subtract", nil, g.op("multiply", nil, s, k(a)), k(5*a))
	p = g.op("add", nil, g.op("multiply", nil, p, s), k(8*a))
	return g.op("subtract", nil, g.op("multiply", nil, p, s), k(4*a))
}
