package topi

import (
	"fmt"
	"math"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	relaxop "github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/ndarray"
)

// Convolution and padding. Layouts are strings of dimension letters: data
// and outputs a permutation of "NCHW" (NCHW, NHWC), kernels of "OIHW"
// (OIHW, HWIO, OHWI), optionally followed by a block of output channels
// as TVM writes it: "OIHW32o" is a kernel of shape [O/32, I, H, W, 32],
// each block of 32 output channels contiguous (one group only).

// Conv2DAttrs are the attributes of a 2-D convolution, as Relax's
// conv2d has them.
type Conv2DAttrs struct {
	Strides  [2]int64 // (height, width); zero values mean 1
	Padding  [4]int64 // (top, left, bottom, right)
	Dilation [2]int64 // zero values mean 1
	Groups   int64    // 0 means 1
	// DataLayout defaults to NCHW, KernelLayout to OIHW and OutLayout to
	// DataLayout.
	DataLayout, KernelLayout, OutLayout string
	// OutDType, when not Void, is the accumulation and output dtype.
	OutDType ir.DType
}

// layoutIndex returns the position of each letter of letters in layout.
func layoutIndex(op, layout, letters string) (map[byte]int, error) {
	bad := fmt.Errorf("%s: unsupported layout %q (want a permutation of %q)", op, layout, letters)
	if len(layout) != len(letters) {
		return nil, bad
	}
	idx := map[byte]int{}
	for i := 0; i < len(layout); i++ {
		ch := layout[i]
		if !strings.ContainsRune(letters, rune(ch)) {
			return nil, bad
		}
		if _, dup := idx[ch]; dup {
			return nil, fmt.Errorf("%s: layout %q repeats %q", op, layout, string(ch))
		}
		idx[ch] = i
	}
	return idx, nil
}

func orOne(v int64) int64 {
	if v == 0 {
		return 1
	}
	return v
}

// window returns base*stride + r*dilation as an index expression.
func window(base ir.Expr, stride int64, r ir.Expr, dilation int64) ir.Expr {
	b := base
	if stride != 1 {
		b = ir.Mul(base, iconst(base, stride))
	}
	rr := r
	if dilation != 1 {
		rr = ir.Mul(r, iconst(r, dilation))
	}
	return ir.Add(b, rr)
}

// windowOut is the number of positions of a window of kernel (dilated)
// over in plus padding; ceil rounds the last partial stride up.
func windowOut(in ir.Expr, padLo, padHi int64, kernel ir.Expr, stride, dilation int64, ceil bool) ir.Expr {
	eff := ir.FoldDim(ir.Add(ir.Mul(iconst(kernel, dilation), ir.Sub(kernel, iconst(kernel, 1))), iconst(kernel, 1)))
	span := ir.FoldDim(ir.Sub(ir.Add(in, iconst(in, padLo+padHi)), eff))
	if ceil {
		span = ir.FoldDim(ir.Add(span, iconst(in, stride-1)))
	}
	return ir.FoldDim(ir.Add(ir.FloorDiv(span, iconst(in, stride)), iconst(in, 1)))
}

// lowest is the smallest value of dtype t (the identity of a maximum).
func lowest(t ir.DType) ir.Expr {
	switch {
	case t.IsFloat():
		m := math.MaxFloat64
		switch t.Bits {
		case 16:
			m = 65504
		case 32:
			m = math.MaxFloat32
		}
		return ir.NewFloatImm(t, -m)
	case t.Code == ndarray.Int:
		return ir.NewIntImm(t, -(1 << (t.Bits - 1)))
	}
	return ir.NewIntImm(t, 0)
}

// Pad returns x padded with value (stage pad_temp by default, as TVM's
// topi.nn.pad): before[d] and after[d] elements on each side of
// dimension d. Reads outside x take value through T.if_then_else.
func Pad(x *te.Tensor, before, after []int64, value ir.Expr, name string) (*te.Tensor, error) {
	const op = "pad"
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	if len(before) != len(x.Shape) || len(after) != len(x.Shape) {
		return nil, fmt.Errorf("%s: %d and %d paddings for a tensor of rank %d", op, len(before), len(after), len(x.Shape))
	}
	if name == "" {
		name = "pad_temp"
	}
	if value == nil {
		value = ir.Const(x.DType, 0)
	}
	value = castScalar(value, x.DType)
	out := make([]ir.Expr, len(x.Shape))
	for d, s := range x.Shape {
		if before[d] < 0 || after[d] < 0 {
			return nil, fmt.Errorf("%s: negative padding on dimension %d", op, d)
		}
		out[d] = ir.FoldDim(ir.Add(s, iconst(s, before[d]+after[d])))
	}
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		var cond ir.Expr
		and := func(c ir.Expr) {
			if cond == nil {
				cond = c
			} else {
				cond = ir.And(cond, c)
			}
		}
		sub := make([]ir.Expr, len(idx))
		for d, i := range idx {
			sub[d] = i
			if before[d] > 0 {
				and(ir.LE(iconst(i, before[d]), i))
				sub[d] = ir.Sub(i, iconst(i, before[d]))
			}
			if after[d] > 0 {
				and(ir.LT(i, ir.FoldDim(ir.Add(x.Shape[d], iconst(i, before[d])))))
			}
		}
		if cond == nil {
			return x.At(sub...)
		}
		return ir.NewIfThenElse(cond, x.At(sub...), value)
	}, name, names("i", len(out))...))
}

// Conv2D is a 2-D convolution (cross-correlation) of data with weight:
// stage pad_temp when there is padding, then conv2d_nchw / conv2d_nhwc
// (group_conv2d_… with groups > 1) with indices nn, ff, yy, xx and reduce
// axes rc, ry, rx.
func Conv2D(data, weight *te.Tensor, a Conv2DAttrs) (*te.Tensor, error) {
	const op = "conv2d"
	if err := checkInputs(op, data, weight); err != nil {
		return nil, err
	}
	if a.DataLayout == "" {
		a.DataLayout = "NCHW"
	}
	if a.KernelLayout == "" {
		a.KernelLayout = "OIHW"
	}
	if a.OutLayout == "" {
		a.OutLayout = a.DataLayout
	}
	di, err := layoutIndex(op, a.DataLayout, "NCHW")
	if err != nil {
		return nil, err
	}
	kl, block := relaxop.KernelBlock(a.KernelLayout)
	ki, err := layoutIndex(op, kl, "OIHW")
	if err != nil {
		return nil, err
	}
	oi, err := layoutIndex(op, a.OutLayout, "NCHW")
	if err != nil {
		return nil, err
	}
	for _, t := range []*te.Tensor{data, weight} {
		want := 4
		if t == weight && block > 0 {
			want = 5
		}
		if len(t.Shape) != want {
			return nil, fmt.Errorf("%s: %s has shape %s, want %d dimensions", op, t.Name, shapeStr(t.Shape), want)
		}
	}
	if ir.IsVoid(a.OutDType) {
		if err := sameDType(op, data, weight); err != nil {
			return nil, err
		}
	}
	sh, sw := orOne(a.Strides[0]), orOne(a.Strides[1])
	dh, dw := orOne(a.Dilation[0]), orOne(a.Dilation[1])
	groups := orOne(a.Groups)
	if sh < 1 || sw < 1 || dh < 1 || dw < 1 || groups < 1 {
		return nil, fmt.Errorf("%s: strides, dilation and groups must be positive", op)
	}
	for _, p := range a.Padding {
		if p < 0 {
			return nil, fmt.Errorf("%s: negative padding %v", op, a.Padding)
		}
	}
	ds, ws := data.Shape, weight.Shape
	cin, kin, cout := ds[di['C']], ws[ki['I']], ws[ki['O']]
	if block > 0 {
		if b, ok := constDim(ws[4]); !ok || b != block || groups != 1 {
			return nil, fmt.Errorf("%s: kernel layout %s takes a weight of shape [.., %d] and one group, not %s and %d groups", op, a.KernelLayout, block, shapeStr(ws), groups)
		}
		cout = ir.FoldDim(ir.Mul(cout, iconst(cout, block)))
	}
	if !ir.DimEqual(cin, ir.FoldDim(ir.Mul(kin, iconst(kin, groups)))) {
		return nil, fmt.Errorf("%s: data of shape %s (layout %s) has %s channels, weight of shape %s (layout %s) takes %s × %d groups",
			op, shapeStr(ds), a.DataLayout, ir.DimString(cin), shapeStr(ws), a.KernelLayout, ir.DimString(kin), groups)
	}
	perGroup := cout
	if groups > 1 {
		o, ok := constDim(cout)
		if !ok || o%groups != 0 {
			return nil, fmt.Errorf("%s: %s output channels do not divide into %d groups", op, ir.DimString(cout), groups)
		}
		perGroup = iconst(cout, o/groups)
	}
	kh, kw := ws[ki['H']], ws[ki['W']]
	oh := windowOut(ds[di['H']], a.Padding[0], a.Padding[2], kh, sh, dh, false)
	ow := windowOut(ds[di['W']], a.Padding[1], a.Padding[3], kw, sw, dw, false)
	for _, d := range []ir.Expr{oh, ow} {
		if n, ok := constDim(d); ok && n < 1 {
			return nil, fmt.Errorf("%s: data of shape %s is smaller than the kernel of shape %s", op, shapeStr(ds), shapeStr(ws))
		}
	}
	src := data
	if a.Padding != [4]int64{} {
		before, after := make([]int64, 4), make([]int64, 4)
		before[di['H']], before[di['W']] = a.Padding[0], a.Padding[1]
		after[di['H']], after[di['W']] = a.Padding[2], a.Padding[3]
		if src, err = Pad(data, before, after, nil, "pad_temp"); err != nil {
			return nil, err
		}
	}
	dims := map[byte]ir.Expr{'N': ds[di['N']], 'C': cout, 'H': oh, 'W': ow}
	axisName := map[byte]string{'N': "nn", 'C': "ff", 'H': "yy", 'W': "xx"}
	out := make([]ir.Expr, 4)
	axes := make([]string, 4)
	for i := 0; i < 4; i++ {
		out[i] = dims[a.OutLayout[i]]
		axes[i] = axisName[a.OutLayout[i]]
	}
	rc := te.ReduceAxis(ir.RangeFromExtent(kin), "rc")
	ry := te.ReduceAxis(ir.RangeFromExtent(kh), "ry")
	rx := te.ReduceAxis(ir.RangeFromExtent(kw), "rx")
	conv := func(e ir.Expr) ir.Expr {
		if ir.IsVoid(a.OutDType) || e.DType() == a.OutDType {
			return e
		}
		return ir.NewCast(a.OutDType, e)
	}
	stage := "conv2d_" + strings.ToLower(a.DataLayout)
	if groups > 1 {
		stage = "group_" + stage
	}
	body := func(n, f, y, x ir.Expr) ir.Expr {
		var ch ir.Expr = rc
		if groups > 1 {
			ch = ir.Add(ir.Mul(ir.FloorDiv(f, perGroup), kin), rc)
		}
		in := make([]ir.Expr, 4)
		in[di['N']], in[di['C']] = n, ch
		in[di['H']], in[di['W']] = window(y, sh, ry, dh), window(x, sw, rx, dw)
		w := make([]ir.Expr, 4, 5)
		w[ki['O']], w[ki['I']], w[ki['H']], w[ki['W']] = f, rc, ry, rx
		if block > 0 {
			w[ki['O']] = ir.FloorDiv(f, iconst(f, block))
			w = append(w, ir.FloorMod(f, iconst(f, block)))
		}
		return te.Sum(ir.Mul(conv(src.At(in...)), conv(weight.At(w...))), rc, ry, rx)
	}
	if groups == 1 && (a.KernelLayout == "HWIO" || block > 0) && a.OutLayout != "NHWC" {
		// Output channels are contiguous in the kernel: the sums are
		// computed with them innermost (stage conv2d_hwio, [N, H, W, C]),
		// where a CPU schedule keeps a tile of them in vector registers,
		// and stage OutLayout reads them back in the layout asked for.
		acc, err := finish(te.Compute([]ir.Expr{dims['N'], oh, ow, cout}, func(idx []ir.Expr) ir.Expr {
			return body(idx[0], idx[3], idx[1], idx[2])
		}, "conv2d_hwio", "nn", "yy", "xx", "ff"))
		if err != nil {
			return nil, err
		}
		return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
			return acc.At(idx[oi['N']], idx[oi['H']], idx[oi['W']], idx[oi['C']])
		}, stage, axes...))
	}
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		return body(idx[oi['N']], idx[oi['C']], idx[oi['H']], idx[oi['W']])
	}, stage, axes...))
}
