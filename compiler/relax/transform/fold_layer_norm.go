package transform

import (
	"encoding/binary"
	"math"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/ndarray"
)

// FoldLayerNorm replaces a layer norm written out as means and
// elementwise operators, as PyTorch exports LayerNorm below ONNX opset
// 17 (ReduceMean, Sub, Pow 2, ReduceMean, Add ε, Sqrt, Div),
//
//	m = R.mean(x, axis, keepdims=True)
//	d = R.subtract(x, m)
//	p = R.power(d, 2)              (or R.multiply(d, d))
//	v = R.mean(p, axis, keepdims=True)
//	s = R.sqrt(R.add(v, ε))
//	y = R.divide(d, s)             (or R.multiply(d, R.rsqrt(R.add(v, ε))))
//
// by y = R.nn.layer_norm(x, ones, zeros, axes=axis, epsilon=ε) over the
// same axes, with a unit scale and a zero shift (the model's own scale
// and shift stay the multiply and add after it, which FuseOps fuses into
// the norm's kernel). Written out, FuseOps cannot fuse the means with
// the elementwise blocks that read both them and x, so the norm ran as
// four kernels, each reading or writing the whole tensor (ConvNeXt's
// stem and every block, the transformer layers); as one it reads x once
// per row. The bindings the norm no longer needs are removed. Only
// float32 tensors of constant shape whose intermediate values have no
// other use are rewritten.
func FoldLayerNorm(mod *ir.IRModule) (*ir.IRModule, error) {
	out, err := rewriteCalls(mod, func(fn *ir.Function) callRewrite {
		du := ir.DefUseOf(fn)
		return func(vb *ir.VarBinding, call *ir.RCall) ([]ir.Binding, error) {
			ln := matchLayerNorm(du, call)
			if ln == nil {
				return nil, nil
			}
			c, err := op.Call("relax.nn.layer_norm", []ir.RExpr{ln.x, ln.ones, ln.zeros},
				map[string]any{"axes": ln.axes, "epsilon": ln.eps})
			if err != nil {
				return nil, err
			}
			return []ir.Binding{&ir.VarBinding{Var: vb.Var, Value: c}}, nil
		}
	})
	if err != nil {
		return nil, err
	}
	if out == mod {
		return mod, nil
	}
	return DeadCodeElimination(out)
}

// layerNorm is a matched layer norm: its input, axes, ε, and the unit
// scale and zero shift of the normalized shape.
type layerNorm struct {
	x           ir.RExpr
	axes        []any
	eps         float64
	ones, zeros *ir.Constant
}

// matchLayerNorm matches call as the last step of a written-out layer
// norm (see FoldLayerNorm), or returns nil.
func matchLayerNorm(du *ir.DefUse, call *ir.RCall) *layerNorm {
	var d, a, s ir.RExpr
	switch opName(call) {
	case "relax.divide":
		sq := boundCall(du, call.Args[1], "relax.sqrt", 1)
		if sq == nil {
			return nil
		}
		d, a, s = call.Args[0], sq.Args[0], call.Args[1]
	case "relax.multiply":
		for i := range 2 {
			if r := boundCall(du, call.Args[1-i], "relax.rsqrt", 1); r != nil {
				d, a, s = call.Args[i], r.Args[0], call.Args[1-i]
				break
			}
		}
		if d == nil {
			return nil
		}
	default:
		return nil
	}
	sub := boundCall(du, d, "relax.subtract", 2)
	add := boundCall(du, a, "relax.add", 2)
	if sub == nil || add == nil {
		return nil
	}
	x := sub.Args[0]
	m := boundCall(du, sub.Args[1], "relax.mean", 1)
	if m == nil || m.Args[0] != x {
		return nil
	}
	var v *ir.RCall
	var vr ir.RExpr
	eps, ok := 0.0, false
	for i := range 2 {
		if e, isScalar := scalarF32(add.Args[1-i]); isScalar {
			vr, eps, ok = add.Args[i], e, true
			v = boundCall(du, vr, "relax.mean", 1)
			break
		}
	}
	if !ok || v == nil {
		return nil
	}
	sq := v.Args[0]
	if p := boundCall(du, sq, "relax.power", 2); p != nil {
		if e, ok := scalarF32(p.Args[1]); !ok || e != 2 || p.Args[0] != d {
			return nil
		}
	} else if p := boundCall(du, sq, "relax.multiply", 2); p == nil || p.Args[0] != d || p.Args[1] != d {
		return nil
	}
	info, ok := ir.StructInfoOf(x).(*ir.TensorStructInfo)
	if !ok || info.DType != ir.Float32 || len(info.Shape) == 0 {
		return nil
	}
	shape := make([]int64, len(info.Shape))
	for i, dim := range info.Shape {
		if shape[i], ok = ir.ConstDim(dim); !ok {
			return nil
		}
	}
	axes, ok := keptAxes(m, len(shape))
	if !ok {
		return nil
	}
	if va, ok := keptAxes(v, len(shape)); !ok || !slices.Equal(va, axes) {
		return nil
	}
	// What the norm replaces is used only inside it.
	only := func(e ir.RExpr, users int) bool {
		x, ok := e.(*ir.RVar)
		return ok && !du.Results[x] && len(du.Users[x]) == users
	}
	if !only(sub.Args[1], 1) || !only(d, 2) || !only(sq, 1) || !only(vr, 1) || !only(a, 1) || !only(s, 1) {
		return nil
	}
	var norm []int64
	for _, ax := range axes {
		norm = append(norm, shape[ax])
	}
	ones, zeros := filledF32(norm, 1), filledF32(norm, 0)
	if ones == nil || zeros == nil {
		return nil
	}
	anyAxes := make([]any, len(axes))
	for i, ax := range axes {
		anyAxes[i] = int64(ax)
	}
	return &layerNorm{x: x, axes: anyAxes, eps: eps, ones: ones, zeros: zeros}
}

// opName is the name of the operator call calls, or "".
func opName(call *ir.RCall) string {
	if o, ok := call.Op.(*ir.Op); ok {
		return o.Name
	}
	return ""
}

// boundCall returns the call of operator name with n arguments that e,
// a variable, is bound to, or nil.
func boundCall(du *ir.DefUse, e ir.RExpr, name string, n int) *ir.RCall {
	x, ok := e.(*ir.RVar)
	if !ok {
		return nil
	}
	vb, ok := du.Bindings[x].(*ir.VarBinding)
	if !ok {
		return nil
	}
	c, ok := vb.Value.(*ir.RCall)
	if !ok || opName(c) != name || len(c.Args) != n {
		return nil
	}
	return c
}

// keptAxes returns the axes (in [0, rank), ascending) of a mean that
// keeps its dimensions, and whether call is one.
func keptAxes(call *ir.RCall, rank int) ([]int, bool) {
	if keep, _ := call.Attrs["keepdims"].(bool); !keep {
		return nil, false
	}
	list, ok := call.Attrs["axis"].([]any)
	if !ok || len(list) == 0 {
		return nil, false
	}
	var axes []int
	for _, a := range list {
		var ax int64
		switch a := a.(type) {
		case int64:
			ax = a
		case int:
			ax = int64(a)
		default:
			return nil, false
		}
		if ax < 0 {
			ax += int64(rank)
		}
		if ax < 0 || ax >= int64(rank) || slices.Contains(axes, int(ax)) {
			return nil, false
		}
		axes = append(axes, int(ax))
	}
	slices.Sort(axes)
	return axes, true
}

// scalarF32 returns the value of e when it is a float32 constant of one
// element.
func scalarF32(e ir.RExpr) (float64, bool) {
	c, ok := e.(*ir.Constant)
	if !ok || c.DType != ir.Float32 || len(c.Data) != 4 {
		return 0, false
	}
	return float64(math.Float32frombits(binary.LittleEndian.Uint32(c.Data))), true
}

// filledF32 is a float32 constant of shape whose elements are all v.
func filledF32(shape []int64, v float32) *ir.Constant {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	b := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	c, err := ir.ConstantFromBytes(ir.Float32, ndarray.Shape(shape), b)
	if err != nil {
		return nil
	}
	return c
}
