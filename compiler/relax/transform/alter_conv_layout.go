package transform

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/ndarray"
)

// AlterConvLayout gives every convolution of one group over NCHW data
// with an OIHW kernel of static shape (R.nn.conv2d's defaults, what the
// ONNX importer makes) its kernel in blocks of output channels, each
// block's weights contiguous with the channels innermost (TVM's
// conv2d_NCHWc kernel layout with one input channel per block):
//
//	y = R.nn.conv2d(x, w)                  # w: [64, 32, 3, 3]
//
// becomes
//
//	w_oblocks = R.reshape(w, [2, 32, 32, 3, 3])
//	w_oihw32o = R.permute_dims(w_oblocks, axes=[0, 2, 3, 4, 1])
//	y = R.nn.conv2d(x, w_oihw32o, kernel_layout="OIHW32o", out_layout="NCHW")
//
// with blocks of 32 channels where they divide the output channels, else
// 16, else 8; other channel counts take the kernel in HWIO (one
// permute_dims, kernel_layout="HWIO"). The result is unchanged;
// LegalizeOps then computes the sums with the output channels contiguous
// (topi.Conv2D's conv2d_hwio stage), which the default CPU schedule
// (compiler/schedule/auto) keeps in vector registers, reading a block's
// weights in order (in HWIO, the weights of a block of channels are
// rows of a power-of-two stride apart for 256 or 512 channels, which
// share cache sets). When the kernel is a weight, LiftTransformParams
// moves the repacking out of the per-call path (FoldConstant folds it
// when the kernel is a constant), so the kernel is repacked once, not
// per call.
// Pointwise convolutions (1×1, stride 1, unpadded), which the CPU
// schedule computes as a matrix product over the flattened plane, take
// their kernel in panels of 8 output channels (OIHW8o, never padded) or
// keep it in OIHW (see pointwiseLayout).
// It plays the part of TVM's AlterOpLayout for conv2d on x86.
func AlterConvLayout(mod *ir.IRModule) (*ir.IRModule, error) {
	return AlterConvLayoutWith(nil)(mod)
}

// LayoutSite is a graph-level layout choice the tuner searches: every
// operator of one signature (Key) takes one layout of its weight. For a
// convolution (ConvSites, AlterConvLayoutWith) the Key is its data and
// kernel shapes, strides, padding and dilation, and the layout its
// kernel's; for a dense layer (DenseSites, AlterDenseLayoutWith) the Key
// is its data and weight shapes, and the layout its weight's.
type LayoutSite struct {
	// Key is the signature, as "conv2d 1x64x56x56 * 64x64x3x3 strides
	// 1,1 padding 1,1,1,1 dilation 1,1" or "dense 1x512 * 512x1000".
	Key string
	// Layouts are the layouts it can take, the one the pass gives it
	// without a choice first. A convolution's kernel: blocks of 32, 16 or
	// 8 output channels that divide them ("OIHW32o"; the default may pad
	// the channels, see paddedChannels), "HWIO", or "OIHW" (the kernel as
	// it is).
	Layouts []string
	// Sources are the model operators of its calls.
	Sources []ir.Source
}

// Lowering lowers a model through the graph pipeline with graph-level
// layout choices: Sites are the choices it has, and Lower lowers it with
// a choice (a site's Key to one of its Layouts; sites it leaves out, or
// a nil map, take their first).
type Lowering struct {
	Sites []LayoutSite
	Lower func(layouts map[string]string) (*ir.IRModule, error)
}

// ConvSites lists the convolutions of mod's graph functions that
// AlterConvLayout would repack, one LayoutSite per signature in the order
// they first appear.
func ConvSites(mod *ir.IRModule) []LayoutSite {
	var sites []LayoutSite
	at := map[string]int{}
	for _, name := range mod.Names() {
		f, _ := mod.Lookup(name)
		fn, ok := f.(*ir.Function)
		if !ok || isPrimitive(fn) || fn.Body == nil {
			continue
		}
		m := &ir.RMutator{}
		m.Binding = func(b ir.Binding) []ir.Binding {
			call, ok := b.BoundValue().(*ir.RCall)
			if !ok || !convEligible(call) {
				return []ir.Binding{b}
			}
			key := convKey(call)
			i, seen := at[key]
			if !seen {
				i, at[key] = len(sites), len(sites)
				sites = append(sites, LayoutSite{Key: key, Layouts: convLayouts(call)})
			}
			sites[i].Sources = ir.AddSources(sites[i].Sources, call.Sources...)
			return []ir.Binding{b}
		}
		m.RewriteFunc(fn)
	}
	return sites
}

// AlterConvLayoutWith is AlterConvLayout with the kernel layout of each
// convolution site (by Key, see ConvSites) that layouts names, one of the site's Layouts; the
// others take their first. A layout the site cannot take is an error.
func AlterConvLayoutWith(layouts map[string]string) func(mod *ir.IRModule) (*ir.IRModule, error) {
	return func(mod *ir.IRModule) (*ir.IRModule, error) {
		return rewriteCalls(mod, func(*ir.Function) callRewrite {
			return func(vb *ir.VarBinding, call *ir.RCall) ([]ir.Binding, error) {
				if !convEligible(call) {
					return nil, nil
				}
				options := convLayouts(call)
				layout := options[0]
				if l, ok := layouts[convKey(call)]; ok {
					if !slices.Contains(options, l) {
						return nil, fmt.Errorf("conv2d %s (%s): kernel layout %q is not one it can take (%s)", vb.Var.Name, convKey(call), l, strings.Join(options, ", "))
					}
					layout = l
				}
				if layout == "OIHW" {
					return nil, nil
				}
				return alterConv(vb, call, layout)
			}
		})
	}
}

// alterConv is the bindings that compute vb, a convolution, with its
// kernel repacked in layout.
func alterConv(vb *ir.VarBinding, call *ir.RCall, layout string) ([]ir.Binding, error) {
	bs, channels, e := convKernel(vb.Var, call.Args[1], layout)
	if e != nil {
		return nil, fmt.Errorf("conv2d %s: repack its kernel: %w", vb.Var.Name, e)
	}
	attrs := make(map[string]any, len(call.Attrs))
	for k, v := range call.Attrs {
		attrs[k] = v
	}
	attrs["kernel_layout"], attrs["out_layout"] = layout, "NCHW"
	conv, e := op.Call("relax.nn.conv2d", []ir.RExpr{call.Args[0], bs[len(bs)-1].(*ir.VarBinding).Var}, attrs)
	if e != nil {
		return nil, fmt.Errorf("conv2d %s: kernel in %s: %w", vb.Var.Name, layout, e)
	}
	if channels == 0 {
		return append(bs, &ir.VarBinding{Var: vb.Var, Value: conv}), nil
	}
	// The kernel was padded with zero channels: the first ones
	// are the convolution's.
	all := ir.NewRVar(vb.Var.Name+"_padded", conv.Info)
	all.Dataflow = vb.Var.Dataflow
	slice, e := op.Call("relax.strided_slice", []ir.RExpr{all}, map[string]any{"axes": []any{int64(1)}, "begin": []any{int64(0)}, "end": []any{channels}})
	if e != nil {
		return nil, fmt.Errorf("conv2d %s: its first %d channels: %w", vb.Var.Name, channels, e)
	}
	return append(bs, &ir.VarBinding{Var: all, Value: conv}, &ir.VarBinding{Var: vb.Var, Value: slice}), nil
}

// convLayouts is the kernel layouts convolution call can take (see
// LayoutSite.Layouts), AlterConvLayout's first: for a pointwise one the
// layout pointwiseLayout gives it, for the others blocks of 32, 16 or 8
// of its channels padded as paddedChannels says, else HWIO.
func convLayouts(call *ir.RCall) []string {
	o, _ := ir.ConstDim(ir.StructInfoOf(call.Args[1]).(*ir.TensorStructInfo).Shape[0])
	first := pointwiseLayout(call)
	if first == "" {
		first = "HWIO"
		if b := outputBlock(paddedChannels(o)); b > 0 {
			first = fmt.Sprintf("OIHW%do", b)
		}
	}
	out := []string{first}
	for _, b := range []int64{32, 16, 8} {
		if l := fmt.Sprintf("OIHW%do", b); o%b == 0 && l != first {
			out = append(out, l)
		}
	}
	for _, l := range []string{"HWIO", "OIHW"} {
		if l != first {
			out = append(out, l)
		}
	}
	return out
}

// convKey is the signature of convolution call (LayoutSite.Key).
func convKey(call *ir.RCall) string {
	shape := func(e ir.RExpr) string {
		var ds []string
		for _, d := range ir.StructInfoOf(e).(*ir.TensorStructInfo).Shape {
			if c, ok := ir.ConstDim(d); ok {
				ds = append(ds, fmt.Sprint(c))
			} else {
				ds = append(ds, fmt.Sprint(d))
			}
		}
		return strings.Join(ds, "x")
	}
	list := func(k string) string {
		vs, _ := call.Attrs[k].([]any)
		var out []string
		for _, v := range vs {
			out = append(out, fmt.Sprint(v))
		}
		return strings.Join(out, ",")
	}
	return fmt.Sprintf("conv2d %s * %s strides %s padding %s dilation %s", shape(call.Args[0]), shape(call.Args[1]), list("strides"), list("padding"), list("dilation"))
}

// callRewrite returns the bindings that replace vb, a binding of call:
// nil keeps vb as it is.
type callRewrite func(vb *ir.VarBinding, call *ir.RCall) ([]ir.Binding, error)

// rewriteCalls rewrites the bindings of a variable to a call in every
// graph function of mod (but Primitive ones) with the rewrite forFunc
// makes for that function; the first error stops it, named after the
// function.
func rewriteCalls(mod *ir.IRModule, forFunc func(fn *ir.Function) callRewrite) (*ir.IRModule, error) {
	out := mod
	for name, f := range mod.Funcs() {
		fn, ok := f.(*ir.Function)
		if !ok || isPrimitive(fn) || fn.Body == nil {
			continue
		}
		rewrite := forFunc(fn)
		var err error
		m := &ir.RMutator{}
		m.Binding = func(b ir.Binding) []ir.Binding {
			vb, ok := b.(*ir.VarBinding)
			if !ok || err != nil {
				return []ir.Binding{b}
			}
			call, ok := vb.Value.(*ir.RCall)
			if !ok {
				return []ir.Binding{b}
			}
			bs, e := rewrite(vb, call)
			if e != nil {
				err = e
			}
			if bs == nil {
				return []ir.Binding{b}
			}
			// What replaces the call computes its model operators.
			for _, r := range bs {
				if c, ok := r.BoundValue().(*ir.RCall); ok && c.Sources == nil {
					c.Sources = call.Sources
				}
			}
			return bs
		}
		g := m.RewriteFunc(fn)
		if err != nil {
			return nil, funcError(name, err)
		}
		if g != fn {
			out = out.With(name, g)
		}
	}
	return out, nil
}

// convKernel returns the bindings that repack kernel w (OIHW, of
// constant shape) for convolution y in layout (HWIO or OIHW{b}o), the
// last one binding the repacked kernel; when blocks of b channels do not
// divide the output channels it pads the kernel with zero ones and
// channels is the count before padding.
func convKernel(y *ir.RVar, w ir.RExpr, layout string) (bs []ir.Binding, channels int64, err error) {
	bind := func(suffix string, value *ir.RCall) *ir.RVar {
		v := ir.NewRVar(y.Name+suffix, value.Info)
		v.Dataflow = y.Dataflow
		bs = append(bs, &ir.VarBinding{Var: v, Value: value})
		return v
	}
	info := ir.StructInfoOf(w).(*ir.TensorStructInfo)
	dims := make([]int64, 4)
	for i, d := range info.Shape {
		dims[i], _ = ir.ConstDim(d)
	}
	if layout == "HWIO" {
		perm, err := op.Call("relax.permute_dims", []ir.RExpr{w}, map[string]any{"axes": []any{int64(2), int64(3), int64(1), int64(0)}})
		if err != nil {
			return nil, 0, err
		}
		bind("_hwio", perm)
		return bs, 0, nil
	}
	var block int64
	if _, err := fmt.Sscanf(layout, "OIHW%do", &block); err != nil || block <= 0 {
		return nil, 0, fmt.Errorf("kernel layout %q (want HWIO or OIHW followed by a block of output channels, as OIHW32o)", layout)
	}
	if o := (dims[0] + block - 1) / block * block; o > dims[0] {
		zero := &ir.Constant{DType: info.DType, Shape: ndarray.Shape{}, Data: make([]byte, info.DType.Size())}
		zeros, err := op.Call("relax.broadcast_to", []ir.RExpr{zero, &ir.ShapeExpr{Values: ir.Dims(o-dims[0], dims[1], dims[2], dims[3])}}, nil)
		if err != nil {
			return nil, 0, err
		}
		padded, err := op.Call("relax.concat", []ir.RExpr{&ir.RTuple{Fields: []ir.RExpr{w, bind("_zeros", zeros)}}}, map[string]any{"axis": int64(0)})
		if err != nil {
			return nil, 0, err
		}
		w, channels, dims[0] = bind("_padded_kernel", padded), dims[0], o
	}
	split, err := op.Call("relax.reshape", []ir.RExpr{w, &ir.ShapeExpr{Values: ir.Dims(dims[0]/block, block, dims[1], dims[2], dims[3])}}, nil)
	if err != nil {
		return nil, 0, err
	}
	perm, err := op.Call("relax.permute_dims", []ir.RExpr{bind("_oblocks", split)}, map[string]any{"axes": []any{int64(0), int64(2), int64(3), int64(4), int64(1)}})
	if err != nil {
		return nil, 0, err
	}
	bind("_"+strings.ToLower(layout), perm)
	return bs, channels, nil
}

// paddedChannels is the output channels a kernel of o channels is padded
// to with zeros: 256 or more that blocks of 32 do not divide (a
// 1000-class convolution classifier, squeezenet1_1's) go up to the next
// multiple of 32, a few percent more multiply-adds for twice the vector
// width (blocks of 8 channels fill half an AVX-512 vector); the
// convolution's result is then sliced back to o channels.
func paddedChannels(o int64) int64 {
	if o < 256 || o%32 == 0 {
		return o
	}
	return (o + 31) / 32 * 32
}

// outputBlock is the block of output channels of a repacked kernel: 32,
// 16 or 8, the first that divides o, else 0 (HWIO). A block of 32 is two
// AVX-512 vectors of channels, what the CPU schedule's register tile
// takes at most along the channels with 7 or more output positions.
func outputBlock(o int64) int64 {
	for _, b := range []int64{32, 16, 8} {
		if o%b == 0 {
			return b
		}
	}
	return 0
}

// convEligible reports whether call is an R.nn.conv2d whose kernel
// AlterConvLayout chooses a layout for: one group, NCHW data and output,
// an OIHW float32 kernel of constant shape, no out_dtype.
func convEligible(call *ir.RCall) bool {
	o, ok := call.Op.(*ir.Op)
	if !ok || o.Name != "relax.nn.conv2d" || len(call.Args) != 2 {
		return false
	}
	str := func(k string) string { s, _ := call.Attrs[k].(string); return s }
	if g, _ := call.Attrs["groups"].(int64); g != 1 {
		return false
	}
	if str("data_layout") != "NCHW" || str("kernel_layout") != "OIHW" || (str("out_layout") != "" && str("out_layout") != "NCHW") {
		return false
	}
	if dt := str("out_dtype"); dt != "" && dt != "void" {
		return false
	}
	w, ok := ir.StructInfoOf(call.Args[1]).(*ir.TensorStructInfo)
	if !ok || w.DType != ir.Float32 || len(w.Shape) != 4 {
		return false
	}
	for _, d := range w.Shape {
		if _, ok := ir.ConstDim(d); !ok {
			return false
		}
	}
	return true
}

// pointwisePanel is the panel of output channels of a pointwise
// convolution's packed kernel: 8 channels, a tile of 8 channels × up to
// 3 vectors of positions in the CPU schedule.
const pointwisePanel = 8

// maxPanelPlane bounds the planes of pointwise convolutions whose kernel
// comes in panels: each panel of 8 channels reads the whole input again,
// which for mobilenet_v2's 112×112 planes (1.6 MB of input) is slower
// than the OIHW tile of all 16 output channels at once.
const maxPanelPlane = 64 * 64

// pointwiseLayout returns the kernel layout of a pointwise (1×1)
// convolution with a stride of 1 and no padding whose default CPU
// schedule computes it as a matrix product over the flattened output
// plane (each channel's plane is contiguous): whole vectors of
// positions times several output channels, whatever the rows' width
// (squeezenet1_1's 55-, 27- and 13-wide 1×1 convolutions ran 2–4× slower
// in the HWIO or OIHW32o tile: stores scattered across the channels'
// planes). The kernel comes in panels of pointwisePanel output channels
// ("OIHW8o"), each panel's weights for an input channel one run that
// the tile broadcasts from, where OIHW rows lie as many floats apart as
// the input channels (for 256 or 512 a power of two that sends every
// row to the same few cache sets): squeezenet1_1's 1×1 convolutions run
// 1.1–1.3× faster so (mobilenet_v2's at 56×56 to 14×14 up to 1.8×), its 512→1000 classifier 1.15× faster than in the
// OIHW32o tile, whose stores scatter 13 positions × 32 channels one float
// at a time. Planes larger than maxPanelPlane, and output channels no
// panel divides, keep the kernel in OIHW ("OIHW"), as long as the
// convolution reduces fewer than 256 input channels or its rows are a
// multiple of 8 wide. It returns "" for the others, which take the
// blocked tile: convolutions reducing 256 or more input channels over
// even rows no vector divides (mobilenet_v2's 14×14 576→96 projections,
// as fast or 1.06× faster blocked, 7 positions × 2 vectors a tile), planes that
// whole vectors of 16 positions would overrun by more than an eighth
// (7×7: 64 for 49), and larger kernels (resnet18's 56-wide 3×3
// convolutions run 1.6× faster in the blocked tile than along the
// rows).
func pointwiseLayout(call *ir.RCall) string {
	out, ok := call.Info.(*ir.TensorStructInfo)
	if !ok || len(out.Shape) != 4 {
		return ""
	}
	w, ok := ir.StructInfoOf(call.Args[1]).(*ir.TensorStructInfo)
	if !ok || len(w.Shape) != 4 {
		return ""
	}
	for _, d := range w.Shape[2:] {
		if k, ok := ir.ConstDim(d); !ok || k != 1 {
			return ""
		}
	}
	strides, _ := call.Attrs["strides"].([]any)
	if len(strides) != 2 || strides[0] != any(int64(1)) || strides[1] != any(int64(1)) {
		return ""
	}
	pad, _ := call.Attrs["padding"].([]any)
	for _, p := range pad {
		if p != any(int64(0)) {
			return ""
		}
	}
	h, ok1 := ir.ConstDim(out.Shape[2])
	wd, ok2 := ir.ConstDim(out.Shape[3])
	plane := h * wd
	if !ok1 || !ok2 || (plane+15)/16*16*8 > plane*9 {
		return ""
	}
	in, ok1 := ir.ConstDim(w.Shape[1])
	o, ok2 := ir.ConstDim(w.Shape[0])
	if !ok1 || !ok2 {
		return ""
	}
	oihw := in < 256 || wd%8 == 0
	switch {
	case o%pointwisePanel == 0 && plane <= maxPanelPlane && (oihw || wd%2 == 1):
		return fmt.Sprintf("OIHW%do", pointwisePanel)
	case oihw:
		return "OIHW"
	}
	return ""
}
