package topi

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/arith"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
)

// Pooling over the H and W dimensions of 4-D data, as TVM's topi.nn.pool2d
// (stages pad_temp, pool_max or pool_sum then pool_avg; reduce axes rv0,
// rv1) and adaptive_pool (adaptive_pool_sum, adaptive_pool_avg).

// Pool2DAttrs are the attributes of max_pool2d and avg_pool2d.
type Pool2DAttrs struct {
	PoolSize [2]int64 // (height, width)
	Strides  [2]int64 // zero values mean 1
	Padding  [4]int64 // (top, left, bottom, right)
	Dilation [2]int64 // zero values mean 1
	// CeilMode rounds the output size up: the last window may reach past
	// the padding (those positions are ignored).
	CeilMode bool
	// CountIncludePad makes an average divide by the window's size within
	// the padded data rather than by its valid elements.
	CountIncludePad bool
	// Layout defaults to NCHW, OutLayout to Layout.
	Layout, OutLayout string
}

// MaxPool2D returns the maximum of each window (stage pool_max).
func MaxPool2D(x *te.Tensor, a Pool2DAttrs) (*te.Tensor, error) {
	return pool2D("max_pool2d", x, a, true)
}

// AvgPool2D returns the average of each window (stages pool_sum,
// pool_avg).
func AvgPool2D(x *te.Tensor, a Pool2DAttrs) (*te.Tensor, error) {
	return pool2D("avg_pool2d", x, a, false)
}

func pool2D(op string, x *te.Tensor, a Pool2DAttrs, isMax bool) (*te.Tensor, error) {
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	if a.Layout == "" {
		a.Layout = "NCHW"
	}
	if a.OutLayout == "" {
		a.OutLayout = a.Layout
	}
	li, err := layoutIndex(op, a.Layout, "NCHW")
	if err != nil {
		return nil, err
	}
	oi, err := layoutIndex(op, a.OutLayout, "NCHW")
	if err != nil {
		return nil, err
	}
	if len(x.Shape) != 4 {
		return nil, fmt.Errorf("%s: data has shape %s, want 4 dimensions", op, shapeStr(x.Shape))
	}
	k := [2]int64{a.PoolSize[0], a.PoolSize[1]}
	s := [2]int64{orOne(a.Strides[0]), orOne(a.Strides[1])}
	d := [2]int64{orOne(a.Dilation[0]), orOne(a.Dilation[1])}
	if k[0] < 1 || k[1] < 1 || s[0] < 1 || s[1] < 1 || d[0] < 1 || d[1] < 1 {
		return nil, fmt.Errorf("%s: pool_size, strides and dilation must be positive", op)
	}
	for _, p := range a.Padding {
		if p < 0 {
			return nil, fmt.Errorf("%s: negative padding %v", op, a.Padding)
		}
	}
	padLo := [2]int64{a.Padding[0], a.Padding[1]}
	padHi := [2]int64{a.Padding[2], a.Padding[3]}
	dimLetter := [2]byte{'H', 'W'}
	in := [2]ir.Expr{x.Shape[li['H']], x.Shape[li['W']]}
	var outHW [2]ir.Expr
	var extra [2]int64 // padding past padHi that ceil mode needs
	for i := range 2 {
		outHW[i] = windowOut(in[i], padLo[i], padHi[i], iconst(in[i], k[i]), s[i], d[i], a.CeilMode)
		o, ok := constDim(outHW[i])
		if ok && o < 1 {
			return nil, fmt.Errorf("%s: data of shape %s is smaller than the window %v", op, shapeStr(x.Shape), a.PoolSize)
		}
		if a.CeilMode {
			n, nok := constDim(in[i])
			if !ok || !nok {
				return nil, fmt.Errorf("%s: ceil_mode needs constant spatial dimensions, data has shape %s", op, shapeStr(x.Shape))
			}
			need := (o-1)*s[i] + (k[i]-1)*d[i] + 1 // padded extent the windows reach
			extra[i] = max(0, need-(n+padLo[i]+padHi[i]))
		}
	}
	src := x
	if a.Padding != [4]int64{} || extra != [2]int64{} {
		before, after := make([]int64, 4), make([]int64, 4)
		for i, l := range dimLetter {
			before[li[l]], after[li[l]] = padLo[i], padHi[i]+extra[i]
		}
		pad := ir.Const(x.DType, 0)
		if isMax {
			pad = lowest(x.DType)
		}
		if src, err = Pad(x, before, after, pad, "pad_temp"); err != nil {
			return nil, err
		}
	}
	dims := map[byte]ir.Expr{'N': x.Shape[li['N']], 'C': x.Shape[li['C']], 'H': outHW[0], 'W': outHW[1]}
	out := make([]ir.Expr, 4)
	for i := 0; i < 4; i++ {
		out[i] = dims[a.OutLayout[i]]
	}
	rv := [2]*te.Axis{
		te.ReduceAxis(ir.RangeFromExtent(iconst(in[0], k[0])), "rv0"),
		te.ReduceAxis(ir.RangeFromExtent(iconst(in[1], k[1])), "rv1"),
	}
	load := func(idx []ir.Expr) ir.Expr {
		sub := make([]ir.Expr, 4)
		sub[li['N']], sub[li['C']] = idx[oi['N']], idx[oi['C']]
		for i, l := range dimLetter {
			sub[li[l]] = window(idx[oi[l]], s[i], rv[i], d[i])
		}
		return src.At(sub...)
	}
	axes := names("ax", 4)
	if isMax {
		return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
			return te.Max(load(idx), rv[0], rv[1])
		}, "pool_max", axes...))
	}
	sum, err := finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		return te.Sum(load(idx), rv[0], rv[1])
	}, "pool_sum", axes...))
	if err != nil {
		return nil, err
	}
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		an := arith.NewAnalyzer()
		for i, v := range idx {
			if iv, ok := v.(*ir.Var); ok {
				an.Bind(iv, ir.RangeFromExtent(out[i]))
			}
		}
		var count ir.Expr
		for i, l := range dimLetter {
			y := idx[oi[l]]
			start := ir.Sub(ir.Mul(y, iconst(y, s[i])), iconst(y, padLo[i]))
			end := ir.Add(start, iconst(y, (k[i]-1)*d[i]))
			var n ir.Expr
			if a.CountIncludePad {
				// Positions inside the data and its padding.
				end = ir.Min(end, ir.Sub(ir.Add(in[i], iconst(y, padHi[i])), iconst(y, 1)))
				n = ir.Add(ir.FloorDiv(ir.Sub(end, start), iconst(y, d[i])), iconst(y, 1))
			} else {
				// Positions inside the data only: the first window
				// position at or past 0 and the last before in.
				first := ir.NewSelect(ir.LT(start, iconst(y, 0)),
					ir.Add(start, ir.Mul(ir.FloorDiv(ir.Sub(iconst(y, d[i]-1), start), iconst(y, d[i])), iconst(y, d[i]))), start)
				last := ir.Min(end, ir.Sub(in[i], iconst(y, 1)))
				n = ir.Max(ir.Add(ir.FloorDiv(ir.Sub(last, first), iconst(y, d[i])), iconst(y, 1)), iconst(y, 0))
			}
			if count == nil {
				count = n
			} else {
				count = ir.Mul(count, n)
			}
		}
		count = ir.Max(an.Simplify(count), iconst(count, 1))
		return ir.Div(sum.At(idx...), castScalar(count, x.DType))
	}, "pool_avg", axes...))
}

// AdaptiveAvgPool2D averages x over windows that split H and W into
// outSize (nil: the input's size) nearly equal parts: output position i
// covers [floor(i*H/OH), ceil((i+1)*H/OH)). Spatial dimensions must be
// constants. Stages adaptive_pool_sum, adaptive_pool_avg.
func AdaptiveAvgPool2D(x *te.Tensor, outSize []int64, layout, outLayout string) (*te.Tensor, error) {
	const op = "adaptive_avg_pool2d"
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	if layout == "" {
		layout = "NCHW"
	}
	if outLayout == "" {
		outLayout = layout
	}
	li, err := layoutIndex(op, layout, "NCHW")
	if err != nil {
		return nil, err
	}
	oi, err := layoutIndex(op, outLayout, "NCHW")
	if err != nil {
		return nil, err
	}
	if len(x.Shape) != 4 {
		return nil, fmt.Errorf("%s: data has shape %s, want 4 dimensions", op, shapeStr(x.Shape))
	}
	dimLetter := [2]byte{'H', 'W'}
	var in, osz, maxWin [2]int64
	for i, l := range dimLetter {
		n, ok := constDim(x.Shape[li[l]])
		if !ok {
			return nil, fmt.Errorf("%s: spatial dimensions of shape %s must be constants", op, shapeStr(x.Shape))
		}
		in[i], osz[i] = n, n
	}
	switch len(outSize) {
	case 0:
	case 1:
		osz = [2]int64{outSize[0], outSize[0]}
	case 2:
		osz = [2]int64{outSize[0], outSize[1]}
	default:
		return nil, fmt.Errorf("%s: output_size has %d values, want 1 or 2", op, len(outSize))
	}
	for i := range 2 {
		if osz[i] < 1 {
			return nil, fmt.Errorf("%s: output size %v must be positive", op, osz)
		}
		for j := int64(0); j < osz[i]; j++ {
			lo, hi := j*in[i]/osz[i], ((j+1)*in[i]+osz[i]-1)/osz[i]
			maxWin[i] = max(maxWin[i], hi-lo)
		}
	}
	like := x.Shape[li['H']]
	dims := map[byte]ir.Expr{'N': x.Shape[li['N']], 'C': x.Shape[li['C']], 'H': iconst(like, osz[0]), 'W': iconst(like, osz[1])}
	out := make([]ir.Expr, 4)
	for i := 0; i < 4; i++ {
		out[i] = dims[outLayout[i]]
	}
	bounds := func(y ir.Expr, i int) (ir.Expr, ir.Expr) {
		lo := ir.FloorDiv(ir.Mul(y, iconst(y, in[i])), iconst(y, osz[i]))
		hi := ir.FloorDiv(ir.Add(ir.Mul(y, iconst(y, in[i])), iconst(y, in[i]+osz[i]-1)), iconst(y, osz[i]))
		return lo, hi
	}
	rv := [2]*te.Axis{
		te.ReduceAxis(ir.RangeFromExtent(iconst(like, maxWin[0])), "rv0"),
		te.ReduceAxis(ir.RangeFromExtent(iconst(like, maxWin[1])), "rv1"),
	}
	axes := names("ax", 4)
	sum, err := finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		sub := make([]ir.Expr, 4)
		sub[li['N']], sub[li['C']] = idx[oi['N']], idx[oi['C']]
		var cond ir.Expr
		for i, l := range dimLetter {
			lo, hi := bounds(idx[oi[l]], i)
			p := ir.Add(lo, rv[i])
			sub[li[l]] = p
			if in[i]%osz[i] != 0 {
				c := ir.LT(p, hi)
				if cond == nil {
					cond = c
				} else {
					cond = ir.And(cond, c)
				}
			}
		}
		v := x.At(sub...)
		if cond != nil {
			v = ir.NewIfThenElse(cond, v, ir.Const(x.DType, 0))
		}
		return te.Sum(v, rv[0], rv[1])
	}, "adaptive_pool_sum", axes...))
	if err != nil {
		return nil, err
	}
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		var count ir.Expr
		for i, l := range dimLetter {
			lo, hi := bounds(idx[oi[l]], i)
			n := ir.Sub(hi, lo)
			if in[i]%osz[i] == 0 {
				n = iconst(lo, in[i]/osz[i])
			}
			if count == nil {
				count = n
			} else {
				count = ir.Mul(count, n)
			}
		}
		if c, ok := constDim(count); ok {
			count = iconst(count, c)
		}
		return ir.Div(sum.At(idx...), castScalar(count, x.DType))
	}, "adaptive_pool_avg", axes...))
}
