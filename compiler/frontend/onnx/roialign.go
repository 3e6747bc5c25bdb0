package onnx

import (
	"fmt"
	"math"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// RoiAlign (average mode): each output bin averages bilinear samples of
// its region of interest. Where the samples fall depends on the regions,
// so the regions must be known at import: the samples' weights are then a
// matrix [R, H·W, bins] built here, and the output is each region's image
// (gathered by batch index at run time) times its matrix.

func init() {
	reg("RoiAlign", 10, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		rois, err := n.knownInput(1, "rois (the sample positions depend on them)")
		if err != nil {
			return nil, err
		}
		bi, err := n.need(2)
		if err != nil {
			return nil, err
		}
		xs := x.shape()
		if len(xs) != 4 || !x.dtype().IsFloat() || rois == nil || len(rois.Shape) != 2 || rois.Shape[1] != 4 {
			return nil, fmt.Errorf("want float X [N, C, H, W] and rois [R, 4], got %s%v", x.dtype(), xs)
		}
		if mode := n.attrString("mode", "avg"); mode != "avg" {
			return nil, unsupported("RoiAlign mode %q", mode)
		}
		offset := 0.0
		if n.opset >= 16 && n.attrString("coordinate_transformation_mode", "half_pixel") == "half_pixel" {
			offset = 0.5
		}
		oh, ow := n.attrInt("output_height", 1), n.attrInt("output_width", 1)
		ratio, scale := n.attrInt("sampling_ratio", 0), n.attrFloat("spatial_scale", 1)
		h, w := xs[2], xs[3]
		nr := rois.Shape[0]
		wt := newTensor(x.dtype(), []int64{nr, h * w, oh * ow})
		add := func(r, y, x, bin int64, v float64) {
			at := int((r*h*w+y*w+x)*oh*ow + bin)
			setElem(wt.Data, wt.DType, at, wt.elem(at)+v)
		}
		for r := range nr {
			c := func(k int64) float64 { return rois.elem(int(r*4+k))*scale - offset }
			x0, y0, x1, y1 := c(0), c(1), c(2), c(3)
			rw, rh := x1-x0, y1-y0
			if offset == 0 {
				rw, rh = math.Max(rw, 1), math.Max(rh, 1)
			}
			bh, bw := rh/float64(oh), rw/float64(ow)
			gh, gw := ratio, ratio
			if ratio <= 0 {
				gh, gw = int64(math.Ceil(rh/float64(oh))), int64(math.Ceil(rw/float64(ow)))
			}
			count := float64(max(gh*gw, 1))
			for ph := range oh {
				for pw := range ow {
					bin := ph*ow + pw
					for iy := range gh {
						y := y0 + float64(ph)*bh + (float64(iy)+0.5)*bh/float64(gh)
						for ix := range gw {
							xx := x0 + float64(pw)*bw + (float64(ix)+0.5)*bw/float64(gw)
							bilinearTaps(y, xx, h, w, func(ty, tx int64, v float64) { add(r, ty, tx, bin, v/count) })
						}
					}
				}
			}
		}
		g := im.builder()
		flat := g.reshape(x, []int64{xs[0], xs[1], h * w})
		per := g.op("take", map[string]any{"axis": int64(0)}, flat, g.cast(bi, ir.Int64)) // [R, C, H·W]
		y := g.op("matmul", nil, per, constant(wt))                                       // [R, C, bins]
		return g.result(g.reshape(y, []int64{nr, xs[1], oh, ow}))
	})
}

// bilinearTaps calls tap with the four pixels (and weights) a bilinear
// sample at (y, x) reads in an h×w image, nothing when it lies more than
// a pixel outside (as RoiAlign samples).
func bilinearTaps(y, x float64, h, w int64, tap func(ty, tx int64, v float64)) {
	if y < -1 || y > float64(h) || x < -1 || x > float64(w) {
		return
	}
	y, x = math.Max(y, 0), math.Max(x, 0)
	yl, xl := int64(y), int64(x)
	yh, xh := yl+1, xl+1
	if yl >= h-1 {
		yl, yh, y = h-1, h-1, float64(h-1)
	}
	if xl >= w-1 {
		xl, xh, x = w-1, w-1, float64(w-1)
	}
	ly, lx := y-float64(yl), x-float64(xl)
	hy, hx := 1-ly, 1-lx
	tap(yl, xl, hy*hx)
	tap(yl, xh, hy*lx)
	tap(yh, xl, ly*hx)
	tap(yh, xh, ly*lx)
}
