package op

import (
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Neural-network operators: softmax, log_softmax, layer_norm, batch_norm
// (inference: the outputs are the result and the moving mean and
// variance), conv2d, max_pool2d, avg_pool2d, adaptive_avg_pool2d and
// linear. Layouts are strings of dimension letters: data "NCHW" or
// "NHWC", kernels "OIHW", "HWIO" or "OHWI", optionally with a block of
// output channels at the end ("OIHW32o": a kernel of shape [O/32, I, H,
// W, 32], for one group only).

func init() {
	for _, n := range []string{"nn.softmax", "nn.log_softmax"} {
		mustRegister(&Def{Name: "relax." + n, Args: []Arg{{Name: "data"}},
			Attrs: []Attr{{Name: "axis", Kind: AttrInt, Default: int64(-1)}}, Infer: inferSoftmax})
	}
	mustRegister(&Def{Name: "relax.nn.layer_norm", Args: []Arg{{Name: "data"}, {Name: "gamma"}, {Name: "beta"}},
		Attrs: []Attr{{Name: "axes", Kind: AttrInts, Default: []any{int64(-1)}}, {Name: "epsilon", Kind: AttrFloat, Default: 1e-5},
			{Name: "center", Kind: AttrBool, Default: true}, {Name: "scale", Kind: AttrBool, Default: true}},
		Infer: inferLayerNorm})
	mustRegister(&Def{Name: "relax.nn.batch_norm",
		Args: []Arg{{Name: "data"}, {Name: "gamma"}, {Name: "beta"}, {Name: "moving_mean"}, {Name: "moving_var"}},
		Attrs: []Attr{{Name: "axis", Kind: AttrInt, Default: int64(1)}, {Name: "epsilon", Kind: AttrFloat, Default: 1e-5},
			{Name: "center", Kind: AttrBool, Default: true}, {Name: "scale", Kind: AttrBool, Default: true},
			{Name: "momentum", Kind: AttrFloat, Default: 0.1}},
		Infer: inferBatchNorm})
	mustRegister(&Def{Name: "relax.nn.conv2d", Args: []Arg{{Name: "data"}, {Name: "weight"}},
		Attrs: []Attr{{Name: "strides", Kind: AttrInts, Default: []any{int64(1), int64(1)}},
			{Name: "padding", Kind: AttrInts, Default: []any{int64(0), int64(0), int64(0), int64(0)}},
			{Name: "dilation", Kind: AttrInts, Default: []any{int64(1), int64(1)}},
			{Name: "groups", Kind: AttrInt, Default: int64(1)},
			{Name: "data_layout", Kind: AttrString, Default: "NCHW"},
			{Name: "kernel_layout", Kind: AttrString, Default: "OIHW"},
			{Name: "out_layout", Kind: AttrOptString},
			{Name: "out_dtype", Kind: AttrDType, Default: "void"}},
		Infer: inferConv2D})
	for _, n := range []string{"nn.max_pool2d", "nn.avg_pool2d"} {
		mustRegister(&Def{Name: "relax." + n, Args: []Arg{{Name: "data"}},
			Attrs: []Attr{{Name: "pool_size", Kind: AttrInts, Default: []any{int64(1), int64(1)}},
				{Name: "strides", Kind: AttrInts, Default: []any{int64(1), int64(1)}},
				{Name: "padding", Kind: AttrInts, Default: []any{int64(0), int64(0), int64(0), int64(0)}},
				{Name: "dilation", Kind: AttrInts, Default: []any{int64(1), int64(1)}},
				{Name: "ceil_mode", Kind: AttrBool, Default: false},
				{Name: "count_include_pad", Kind: AttrBool, Default: false},
				{Name: "layout", Kind: AttrString, Default: "NCHW"},
				{Name: "out_layout", Kind: AttrOptString}},
			Infer: inferPool2D})
	}
	mustRegister(&Def{Name: "relax.nn.adaptive_avg_pool2d", Args: []Arg{{Name: "data"}},
		Attrs: []Attr{{Name: "output_size", Kind: AttrOptInts}, {Name: "layout", Kind: AttrString, Default: "NCHW"},
			{Name: "out_layout", Kind: AttrOptString}},
		Infer: inferAdaptivePool2D})
	mustRegister(&Def{Name: "relax.nn.linear", Args: []Arg{{Name: "data"}, {Name: "weight"}, {Name: "bias", Optional: true}},
		Attrs: []Attr{{Name: "out_dtype", Kind: AttrDType, Default: "void"}}, Infer: inferLinear})
}

func inferSoftmax(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	if !ir.IsVoid(x.DType) && !x.DType.IsFloat() {
		return nil, fmt.Errorf("%s: input has dtype %s, want a float type", name(c), x.DType)
	}
	if x.NDim >= 0 {
		axis, _ := attrInt(c, "axis")
		if _, err := normAxis(c, axis, x.NDim); err != nil {
			return nil, err
		}
	}
	return x, nil
}

// sameShape checks that t has exactly the dimensions want (where known).
func sameShape(c *ir.RCall, what string, t *ir.TensorStructInfo, want []ir.Expr, of *ir.TensorStructInfo) error {
	if t.NDim >= 0 && t.NDim != len(want) {
		return fmt.Errorf("%s: %s has shape %s, want %s for data of shape %s", name(c), what, shapeStr(t), ir.ShapeString(want), shapeStr(of))
	}
	if t.Shape == nil {
		return nil
	}
	for i := range want {
		a, aok := ir.ConstDim(t.Shape[i])
		b, bok := ir.ConstDim(want[i])
		if aok && bok && a != b {
			return fmt.Errorf("%s: %s has shape %s, want %s for data of shape %s", name(c), what, shapeStr(t), ir.ShapeString(want), shapeStr(of))
		}
	}
	return nil
}

func inferLayerNorm(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	axes, _ := attrInts(c, "axes")
	if x.NDim < 0 {
		return x, nil
	}
	ax, err := normAxes(c, axes, x.NDim)
	if err != nil {
		return nil, err
	}
	for i, what := range []string{"gamma", "beta"} {
		t, err := tensor(c, i+1)
		if err != nil {
			return nil, err
		}
		if _, err := unifyDType(c, x.DType, t.DType); err != nil {
			return nil, err
		}
		if x.Shape != nil {
			want := make([]ir.Expr, len(ax))
			for j, a := range ax {
				want[j] = x.Shape[a]
			}
			if err := sameShape(c, what, t, want, x); err != nil {
				return nil, err
			}
		}
	}
	return x, nil
}

func inferBatchNorm(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	axisV, _ := attrInt(c, "axis")
	var channel []ir.Expr
	if x.NDim >= 0 {
		axis, err := normAxis(c, axisV, x.NDim)
		if err != nil {
			return nil, err
		}
		if x.Shape != nil {
			channel = []ir.Expr{x.Shape[axis]}
		}
	}
	for i, what := range []string{"gamma", "beta", "moving_mean", "moving_var"} {
		t, err := tensor(c, i+1)
		if err != nil {
			return nil, err
		}
		if _, err := unifyDType(c, x.DType, t.DType); err != nil {
			return nil, err
		}
		if channel != nil {
			if err := sameShape(c, what, t, channel, x); err != nil {
				return nil, err
			}
		}
	}
	stat := ir.TensorNDim(x.DType, 1)
	if channel != nil {
		stat = ir.Tensor(x.DType, channel...)
	}
	return ir.Tuple(x, stat, stat), nil
}

// pair expands a 1- or 2-element attribute to 2 values.
func pair(c *ir.RCall, key string) ([2]int64, error) {
	v, _ := attrInts(c, key)
	switch len(v) {
	case 1:
		return [2]int64{v[0], v[0]}, nil
	case 2:
		return [2]int64{v[0], v[1]}, nil
	}
	return [2]int64{}, fmt.Errorf("%s: %s has %d values, want 1 or 2", name(c), key, len(v))
}

// padding4 expands padding to (top, left, bottom, right).
func padding4(c *ir.RCall) ([4]int64, error) {
	v, _ := attrInts(c, "padding")
	switch len(v) {
	case 1:
		return [4]int64{v[0], v[0], v[0], v[0]}, nil
	case 2:
		return [4]int64{v[0], v[1], v[0], v[1]}, nil
	case 4:
		return [4]int64{v[0], v[1], v[2], v[3]}, nil
	}
	return [4]int64{}, fmt.Errorf("%s: padding has %d values, want 1, 2 or 4", name(c), len(v))
}

// layoutIndex returns the positions of letters in layout, which must hold
// each exactly once and nothing else.
// KernelBlock splits a kernel layout such as "OHWI32o" into its
// dimension letters ("OHWI") and its block of output channels (32); a
// layout without a block comes back whole with a block of 0.
func KernelBlock(layout string) (letters string, block int64) {
	n := len(layout)
	if n < 2 || layout[n-1] != 'o' {
		return layout, 0
	}
	i := n - 1
	for i > 0 && layout[i-1] >= '0' && layout[i-1] <= '9' {
		i--
	}
	if i == n-1 {
		return layout, 0
	}
	for _, ch := range layout[i : n-1] {
		block = block*10 + int64(ch-'0')
		if block > 1<<20 {
			return layout, 0
		}
	}
	if block == 0 {
		return layout, 0
	}
	return layout[:i], block
}

func layoutIndex(c *ir.RCall, layout, letters string) (map[byte]int, error) {
	if len(layout) != len(letters) {
		return nil, fmt.Errorf("%s: unsupported layout %q (want a permutation of %q)", name(c), layout, letters)
	}
	idx := map[byte]int{}
	for i := 0; i < len(layout); i++ {
		ch := layout[i]
		if !strings.ContainsRune(letters, rune(ch)) {
			return nil, fmt.Errorf("%s: unsupported layout %q (want a permutation of %q)", name(c), layout, letters)
		}
		if _, dup := idx[ch]; dup {
			return nil, fmt.Errorf("%s: layout %q repeats %q", name(c), layout, string(ch))
		}
		idx[ch] = i
	}
	return idx, nil
}

// windowOut is the output extent of a sliding window.
func windowOut(in ir.Expr, padLo, padHi, kernel ir.Expr, stride, dilation int64, ceil bool) ir.Expr {
	eff := dimAdd(dimMul(i64(dilation), dimSub(kernel, i64(1))), i64(1))
	span := dimSub(dimAdd(dimAdd(in, padLo), padHi), eff)
	if ceil {
		span = dimAdd(span, i64(stride-1))
	}
	return dimAdd(dimDiv(span, i64(stride)), i64(1))
}

func arrange(layout string, dims map[byte]ir.Expr) []ir.Expr {
	out := make([]ir.Expr, len(layout))
	for i := 0; i < len(layout); i++ {
		out[i] = dims[layout[i]]
	}
	return out
}

func outLayout(c *ir.RCall, key string) string {
	if s, ok := c.Attrs["out_layout"].(string); ok {
		return s
	}
	return attrString(c, key, "NCHW")
}

func inferConv2D(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	w, err := tensor(c, 1)
	if err != nil {
		return nil, err
	}
	dt, err := attrDType(c, "out_dtype")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name(c), err)
	}
	if ir.IsVoid(dt) {
		if dt, err = unifyDType(c, x.DType, w.DType); err != nil {
			return nil, err
		}
	}
	dl, kl, ol := attrString(c, "data_layout", "NCHW"), attrString(c, "kernel_layout", "OIHW"), outLayout(c, "data_layout")
	di, err := layoutIndex(c, dl, "NCHW")
	if err != nil {
		return nil, err
	}
	kletters, block := KernelBlock(kl)
	ki, err := layoutIndex(c, kletters, "OIHW")
	if err != nil {
		return nil, err
	}
	if _, err := layoutIndex(c, ol, "NCHW"); err != nil {
		return nil, err
	}
	for _, t := range []struct {
		what string
		t    *ir.TensorStructInfo
		ndim int
	}{{"data", x, 4}, {"weight", w, 4 + min(int(block), 1)}} {
		if t.t.NDim >= 0 && t.t.NDim != t.ndim {
			return nil, fmt.Errorf("%s: %s has shape %s, want %d dimensions", name(c), t.what, shapeStr(t.t), t.ndim)
		}
	}
	strides, err := pair(c, "strides")
	if err != nil {
		return nil, err
	}
	dil, err := pair(c, "dilation")
	if err != nil {
		return nil, err
	}
	pad, err := padding4(c)
	if err != nil {
		return nil, err
	}
	groups, _ := attrInt(c, "groups")
	if groups < 1 {
		return nil, fmt.Errorf("%s: groups %d, want at least 1", name(c), groups)
	}
	if strides[0] < 1 || strides[1] < 1 || dil[0] < 1 || dil[1] < 1 {
		return nil, fmt.Errorf("%s: strides and dilation must be positive", name(c))
	}
	if x.Shape == nil || w.Shape == nil {
		return ir.TensorNDim(dt, 4), nil
	}
	cin, kin, cout := x.Shape[di['C']], w.Shape[ki['I']], w.Shape[ki['O']]
	if block > 0 {
		if b, ok := ir.ConstDim(w.Shape[4]); !ok || b != block || groups != 1 {
			return nil, fmt.Errorf("%s: kernel layout %s takes a weight of shape [.., %d] and one group, not %s and %d groups", name(c), kl, block, shapeStr(w), groups)
		}
		cout = dimMul(cout, i64(block))
	}
	if a, ok := ir.ConstDim(cin); ok {
		if b, ok := ir.ConstDim(kin); ok && a != b*groups {
			return nil, fmt.Errorf("%s: data of shape %s (layout %s) has %d channels, weight of shape %s (layout %s) takes %d × %d groups",
				name(c), shapeStr(x), dl, a, shapeStr(w), kl, b, groups)
		}
	}
	if o, ok := ir.ConstDim(cout); ok && o%groups != 0 {
		return nil, fmt.Errorf("%s: %d output channels do not divide into %d groups", name(c), o, groups)
	}
	dims := map[byte]ir.Expr{
		'N': x.Shape[di['N']],
		'C': cout,
		'H': windowOut(x.Shape[di['H']], i64(pad[0]), i64(pad[2]), w.Shape[ki['H']], strides[0], dil[0], false),
		'W': windowOut(x.Shape[di['W']], i64(pad[1]), i64(pad[3]), w.Shape[ki['W']], strides[1], dil[1], false),
	}
	for _, k := range []byte{'H', 'W'} {
		if n, ok := ir.ConstDim(dims[k]); ok && n < 1 {
			return nil, fmt.Errorf("%s: data of shape %s is smaller than the kernel of shape %s", name(c), shapeStr(x), shapeStr(w))
		}
	}
	return ir.Tensor(dt, arrange(ol, dims)...), nil
}

func inferPool2D(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	l, ol := attrString(c, "layout", "NCHW"), outLayout(c, "layout")
	li, err := layoutIndex(c, l, "NCHW")
	if err != nil {
		return nil, err
	}
	if _, err := layoutIndex(c, ol, "NCHW"); err != nil {
		return nil, err
	}
	if x.NDim >= 0 && x.NDim != 4 {
		return nil, fmt.Errorf("%s: data has shape %s, want 4 dimensions", name(c), shapeStr(x))
	}
	size, err := pair(c, "pool_size")
	if err != nil {
		return nil, err
	}
	strides, err := pair(c, "strides")
	if err != nil {
		return nil, err
	}
	dil, err := pair(c, "dilation")
	if err != nil {
		return nil, err
	}
	pad, err := padding4(c)
	if err != nil {
		return nil, err
	}
	if strides[0] < 1 || strides[1] < 1 || dil[0] < 1 || dil[1] < 1 || size[0] < 1 || size[1] < 1 {
		return nil, fmt.Errorf("%s: pool_size, strides and dilation must be positive", name(c))
	}
	if x.Shape == nil {
		return ir.TensorNDim(x.DType, 4), nil
	}
	ceil := attrBool(c, "ceil_mode")
	dims := map[byte]ir.Expr{
		'N': x.Shape[li['N']],
		'C': x.Shape[li['C']],
		'H': windowOut(x.Shape[li['H']], i64(pad[0]), i64(pad[2]), i64(size[0]), strides[0], dil[0], ceil),
		'W': windowOut(x.Shape[li['W']], i64(pad[1]), i64(pad[3]), i64(size[1]), strides[1], dil[1], ceil),
	}
	for _, k := range []byte{'H', 'W'} {
		if n, ok := ir.ConstDim(dims[k]); ok && n < 1 {
			return nil, fmt.Errorf("%s: data of shape %s is smaller than the window %v", name(c), shapeStr(x), size)
		}
	}
	return ir.Tensor(x.DType, arrange(ol, dims)...), nil
}

func inferAdaptivePool2D(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	l, ol := attrString(c, "layout", "NCHW"), outLayout(c, "layout")
	li, err := layoutIndex(c, l, "NCHW")
	if err != nil {
		return nil, err
	}
	if _, err := layoutIndex(c, ol, "NCHW"); err != nil {
		return nil, err
	}
	if x.NDim >= 0 && x.NDim != 4 {
		return nil, fmt.Errorf("%s: data has shape %s, want 4 dimensions", name(c), shapeStr(x))
	}
	if x.Shape == nil {
		return ir.TensorNDim(x.DType, 4), nil
	}
	dims := map[byte]ir.Expr{'N': x.Shape[li['N']], 'C': x.Shape[li['C']], 'H': x.Shape[li['H']], 'W': x.Shape[li['W']]}
	if size, ok := attrInts(c, "output_size"); ok {
		switch len(size) {
		case 1:
			dims['H'], dims['W'] = i64(size[0]), i64(size[0])
		case 2:
			dims['H'], dims['W'] = i64(size[0]), i64(size[1])
		default:
			return nil, fmt.Errorf("%s: output_size has %d values, want 1 or 2", name(c), len(size))
		}
	}
	return ir.Tensor(x.DType, arrange(ol, dims)...), nil
}

func inferLinear(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	w, err := tensor(c, 1)
	if err != nil {
		return nil, err
	}
	dt, err := attrDType(c, "out_dtype")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name(c), err)
	}
	if ir.IsVoid(dt) {
		if dt, err = unifyDType(c, x.DType, w.DType); err != nil {
			return nil, err
		}
	}
	if w.NDim >= 0 && w.NDim != 2 {
		return nil, fmt.Errorf("%s: weight has shape %s, want (out_features, in_features)", name(c), shapeStr(w))
	}
	if x.NDim == 0 {
		return nil, fmt.Errorf("%s: data is a scalar", name(c))
	}
	if x.Shape == nil || w.Shape == nil {
		return ir.TensorNDim(dt, x.NDim), nil
	}
	in, k := x.Shape[len(x.Shape)-1], w.Shape[1]
	if a, ok := ir.ConstDim(in); ok {
		if b, ok := ir.ConstDim(k); ok && a != b {
			return nil, fmt.Errorf("%s: data of shape %s has %d features, weight of shape %s takes %d", name(c), shapeStr(x), a, shapeStr(w), b)
		}
	}
	out := append(append([]ir.Expr{}, x.Shape[:len(x.Shape)-1]...), w.Shape[0])
	if len(c.Args) == 3 {
		b, err := tensor(c, 2)
		if err != nil {
			return nil, err
		}
		if err := sameShape(c, "bias", b, []ir.Expr{w.Shape[0]}, x); err != nil {
			return nil, err
		}
	}
	return ir.Tensor(dt, out...), nil
}
