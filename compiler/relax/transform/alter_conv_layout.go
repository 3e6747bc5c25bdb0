package transform

import (
	"fmt"
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
// Pointwise convolutions (1×1, stride 1, unpadded) are left in OIHW:
// the CPU schedule computes those as a matrix product over the
// flattened plane.
// It plays the part of TVM's AlterOpLayout for conv2d on x86.
func AlterConvLayout(mod *ir.IRModule) (*ir.IRModule, error) {
	out := mod
	for name, f := range mod.Funcs() {
		fn, ok := f.(*ir.Function)
		if !ok || isPrimitive(fn) {
			continue
		}
		var err error
		m := &ir.RMutator{}
		m.Binding = func(b ir.Binding) []ir.Binding {
			vb, ok := b.(*ir.VarBinding)
			if !ok || err != nil {
				return []ir.Binding{b}
			}
			call, ok := vb.Value.(*ir.RCall)
			if !ok || !convToAlter(call) {
				return []ir.Binding{b}
			}
			bs, layout, channels, e := convKernel(vb.Var, call.Args[1])
			if e != nil {
				err = fmt.Errorf("conv2d %s: repack its kernel: %w", vb.Var.Name, e)
				return []ir.Binding{b}
			}
			attrs := make(map[string]any, len(call.Attrs))
			for k, v := range call.Attrs {
				attrs[k] = v
			}
			attrs["kernel_layout"], attrs["out_layout"] = layout, "NCHW"
			conv, e := op.Call("relax.nn.conv2d", []ir.RExpr{call.Args[0], bs[len(bs)-1].(*ir.VarBinding).Var}, attrs)
			if e != nil {
				err = fmt.Errorf("conv2d %s: kernel in %s: %w", vb.Var.Name, layout, e)
				return []ir.Binding{b}
			}
			if channels == 0 {
				return append(bs, &ir.VarBinding{Var: vb.Var, Value: conv})
			}
			// The kernel was padded with zero channels: the first ones
			// are the convolution's.
			all := ir.NewRVar(vb.Var.Name+"_padded", conv.Info)
			all.Dataflow = vb.Var.Dataflow
			slice, e := op.Call("relax.strided_slice", []ir.RExpr{all}, map[string]any{"axes": []any{int64(1)}, "begin": []any{int64(0)}, "end": []any{channels}})
			if e != nil {
				err = fmt.Errorf("conv2d %s: its first %d channels: %w", vb.Var.Name, channels, e)
				return []ir.Binding{b}
			}
			return append(bs, &ir.VarBinding{Var: all, Value: conv}, &ir.VarBinding{Var: vb.Var, Value: slice})
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
// constant shape) for convolution y, the last one binding the repacked
// kernel, and its layout; when it pads the kernel with zero output
// channels (see paddedChannels), channels is the count before padding.
func convKernel(y *ir.RVar, w ir.RExpr) (bs []ir.Binding, layout string, channels int64, err error) {
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
	if o := paddedChannels(dims[0]); o > dims[0] {
		zero := &ir.Constant{DType: info.DType, Shape: ndarray.Shape{}, Data: make([]byte, info.DType.Size())}
		zeros, err := op.Call("relax.broadcast_to", []ir.RExpr{zero, &ir.ShapeExpr{Values: ir.Dims(o-dims[0], dims[1], dims[2], dims[3])}}, nil)
		if err != nil {
			return nil, "", 0, err
		}
		padded, err := op.Call("relax.concat", []ir.RExpr{&ir.RTuple{Fields: []ir.RExpr{w, bind("_zeros", zeros)}}}, map[string]any{"axis": int64(0)})
		if err != nil {
			return nil, "", 0, err
		}
		w, channels, dims[0] = bind("_padded_kernel", padded), dims[0], o
	}
	block := outputBlock(dims[0])
	if block == 0 {
		perm, err := op.Call("relax.permute_dims", []ir.RExpr{w}, map[string]any{"axes": []any{int64(2), int64(3), int64(1), int64(0)}})
		if err != nil {
			return nil, "", 0, err
		}
		bind("_hwio", perm)
		return bs, "HWIO", channels, nil
	}
	split, err := op.Call("relax.reshape", []ir.RExpr{w, &ir.ShapeExpr{Values: ir.Dims(dims[0]/block, block, dims[1], dims[2], dims[3])}}, nil)
	if err != nil {
		return nil, "", 0, err
	}
	layout = fmt.Sprintf("OIHW%do", block)
	perm, err := op.Call("relax.permute_dims", []ir.RExpr{bind("_oblocks", split)}, map[string]any{"axes": []any{int64(0), int64(2), int64(3), int64(4), int64(1)}})
	if err != nil {
		return nil, "", 0, err
	}
	bind("_"+strings.ToLower(layout), perm)
	return bs, layout, channels, nil
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

// convToAlter reports whether call is an R.nn.conv2d that AlterConvLayout
// rewrites: one group, NCHW data and output, an OIHW float32 kernel of
// constant shape, no out_dtype.
func convToAlter(call *ir.RCall) bool {
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
	if pointwisePlane(call) {
		return false
	}
	for _, d := range w.Shape {
		if _, ok := ir.ConstDim(d); !ok {
			return false
		}
	}
	return true
}

// pointwisePlane reports a pointwise (1×1) convolution with a stride of
// 1 and no padding: its default CPU schedule computes it in OIHW as a
// matrix product over the flattened output plane (each channel's plane
// is contiguous), whole vectors of positions times several output
// channels, whatever the rows' width: squeezenet1_1's 55-, 27- and
// 13-wide 1×1 convolutions ran 2–4× slower in the HWIO or OIHW32o tile
// (stores scattered across the channels' planes, reductions of 16 to 64
// channels). Planes that whole vectors of 16 positions would overrun by
// more than an eighth (7×7: 64 for 49) keep the blocked tile, which
// computes no extra positions, and so do reductions of 256 or more input
// channels over rows no vector divides (squeezenet1_1's 512→1000
// classifier, mobilenet_v2's 14×14 576→96 projections: 1.05–1.1×
// faster blocked, where the tile's weights come from one run, not from
// a row of each output channel). Larger kernels take the blocked tile: resnet18's 56-wide
// 3×3 convolutions run 1.6× faster in it than along the rows.
func pointwisePlane(call *ir.RCall) bool {
	out, ok := call.Info.(*ir.TensorStructInfo)
	if !ok || len(out.Shape) != 4 {
		return false
	}
	w, ok := ir.StructInfoOf(call.Args[1]).(*ir.TensorStructInfo)
	if !ok || len(w.Shape) != 4 {
		return false
	}
	for _, d := range w.Shape[2:] {
		if k, ok := ir.ConstDim(d); !ok || k != 1 {
			return false
		}
	}
	strides, _ := call.Attrs["strides"].([]any)
	if len(strides) != 2 || strides[0] != any(int64(1)) || strides[1] != any(int64(1)) {
		return false
	}
	pad, _ := call.Attrs["padding"].([]any)
	for _, p := range pad {
		if p != any(int64(0)) {
			return false
		}
	}
	h, ok1 := ir.ConstDim(out.Shape[2])
	wd, ok2 := ir.ConstDim(out.Shape[3])
	plane := h * wd
	if !ok1 || !ok2 || (plane+15)/16*16*8 > plane*9 {
		return false
	}
	in, ok := ir.ConstDim(w.Shape[1])
	return ok && (in < 256 || wd%8 == 0)
}
