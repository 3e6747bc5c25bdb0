package transform

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
)

// AlterConvLayout gives every convolution of one group over NCHW data
// with an OIHW kernel of static shape (R.nn.conv2d's defaults, what the
// ONNX importer makes) its kernel in HWIO, output channels innermost:
//
//	y = R.nn.conv2d(x, w)
//
// becomes
//
//	w_hwio = R.permute_dims(w, axes=[2, 3, 1, 0])
//	y = R.nn.conv2d(x, w_hwio, kernel_layout="HWIO", out_layout="NCHW")
//
// The result is unchanged; LegalizeOps then computes the sums with the
// output channels contiguous (topi.Conv2D's conv2d_hwio stage), which
// the default CPU schedule (compiler/schedule/auto) keeps in vector
// registers. When the kernel is a weight, LiftTransformParams moves the
// permutation out of the per-call path (FoldConstant folds it when the
// kernel is a constant), so the kernel is repacked once, not per call.
// Pointwise convolutions whose rows vectorize (a multiple of 8 wide,
// stride 1) are left in OIHW: the CPU schedule vectorizes those along
// the rows.
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
			perm, e := op.Call("relax.permute_dims", []ir.RExpr{call.Args[1]}, map[string]any{"axes": []any{int64(2), int64(3), int64(1), int64(0)}})
			if e != nil {
				err = fmt.Errorf("conv2d %s: permute its kernel: %w", vb.Var.Name, e)
				return []ir.Binding{b}
			}
			w := ir.NewRVar(vb.Var.Name+"_hwio", perm.Info)
			w.Dataflow = vb.Var.Dataflow
			attrs := make(map[string]any, len(call.Attrs))
			for k, v := range call.Attrs {
				attrs[k] = v
			}
			attrs["kernel_layout"], attrs["out_layout"] = "HWIO", "NCHW"
			conv, e := op.Call("relax.nn.conv2d", []ir.RExpr{call.Args[0], w}, attrs)
			if e != nil {
				err = fmt.Errorf("conv2d %s: kernel in HWIO: %w", vb.Var.Name, e)
				return []ir.Binding{b}
			}
			return []ir.Binding{&ir.VarBinding{Var: w, Value: perm}, &ir.VarBinding{Var: vb.Var, Value: conv}}
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
	if rowsVectorize(call) {
		return false
	}
	for _, d := range w.Shape {
		if _, ok := ir.ConstDim(d); !ok {
			return false
		}
	}
	return true
}

// rowsVectorize reports a pointwise (1×1) convolution whose output rows
// are a multiple of 8 wide with a stride of 1 along them: its default
// CPU schedule vectorizes along the rows in OIHW, loading each run of
// input once for several output channels and storing whole vectors,
// which measured faster than the HWIO tile on mobilenet_v2's 112- and
// 56-wide 1×1 convolutions (2–3× with their 16 to 96 channels). Larger
// kernels take the HWIO tile: resnet18's 56-wide 3×3 convolutions run
// 1.6× faster in it than along the rows.
func rowsVectorize(call *ir.RCall) bool {
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
	ow, ok := ir.ConstDim(out.Shape[3])
	strides, _ := call.Attrs["strides"].([]any)
	return ok && ow%8 == 0 && len(strides) == 2 && strides[1] == any(int64(1))
}
