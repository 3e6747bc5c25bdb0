package transform

import (
	"errors"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/internal/check"
)

// oneOp returns a module whose main binds one call of the operator name
// over parameters of the given struct infos.
func oneOp(t *testing.T, name string, params []ir.StructInfo, attrs map[string]any) *ir.IRModule {
	t.Helper()
	var ps []*ir.RVar
	var args []ir.RExpr
	for i, s := range params {
		p := ir.NewRVar(string(rune('a'+i)), s)
		ps = append(ps, p)
		args = append(args, p)
	}
	c, err := op.Call(name, args, attrs)
	check.NoError(t, err)
	gv := ir.NewRVar("gv", c.Info)
	body := &ir.SeqExpr{Blocks: []*ir.BindingBlock{{Dataflow: true, Bindings: []ir.Binding{&ir.VarBinding{Var: gv, Value: c}}}}, Body: gv}
	fn := ir.NewFunction(ps, body, map[string]any{ir.AttrGlobalSymbol: "main"})
	return ir.NewIRModule().With("main", fn)
}

// onlyPrimFunc returns the single PrimFunc of m and its name.
func onlyPrimFunc(t *testing.T, m *ir.IRModule) (string, *ir.PrimFunc) {
	t.Helper()
	var name string
	var f *ir.PrimFunc
	for n, pf := range m.PrimFuncs() {
		check.True(t, f == nil, "one PrimFunc")
		name, f = n, pf
	}
	check.True(t, f != nil, "a PrimFunc")
	return name, f
}

func TestAnnotateTIROpPattern(t *testing.T) {
	f32 := func(dims ...int64) ir.StructInfo { return ir.TensorOfShape(ir.Float32, dims...) }
	tests := []struct {
		op     string
		params []ir.StructInfo
		attrs  map[string]any
		name   string
		want   OpPattern
	}{
		{"relax.add", []ir.StructInfo{f32(2, 3), f32(2, 3)}, nil, "add", PatternElemWise},
		{"relax.add", []ir.StructInfo{f32(2, 3), f32(3)}, nil, "add", PatternElemWise}, // elementwise wins over broadcast
		{"relax.add", []ir.StructInfo{f32(3), f32(2, 3)}, nil, "add", PatternElemWise},
		{"relax.nn.relu", []ir.StructInfo{f32(4)}, nil, "relu", PatternElemWise},
		{"relax.broadcast_to", []ir.StructInfo{f32(1, 3), ir.ShapeOf(ir.Dims(2, 3)...)}, nil, "broadcast_to", PatternBroadcast},
		{"relax.permute_dims", []ir.StructInfo{f32(2, 3)}, nil, "transpose", PatternInjective},
		{"relax.sum", []ir.StructInfo{f32(2, 3)}, map[string]any{"axis": []any{int64(1)}}, "sum", PatternCommReduce},
		{"relax.matmul", []ir.StructInfo{f32(2, 3), f32(3, 4)}, nil, "matmul", PatternOutEWiseFusable},
		{"relax.nn.conv2d", []ir.StructInfo{f32(1, 2, 5, 5), f32(3, 2, 3, 3)}, nil, "conv2d", PatternOutEWiseFusable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var m *ir.IRModule
			if tc.op == "relax.broadcast_to" {
				x := ir.NewRVar("a", tc.params[0])
				c, err := op.Call(tc.op, []ir.RExpr{x, &ir.ShapeExpr{Values: ir.Dims(2, 3)}}, nil)
				check.NoError(t, err)
				gv := ir.NewRVar("gv", c.Info)
				fn := ir.NewFunction([]*ir.RVar{x}, &ir.SeqExpr{Blocks: []*ir.BindingBlock{{Dataflow: true,
					Bindings: []ir.Binding{&ir.VarBinding{Var: gv, Value: c}}}}, Body: gv}, nil)
				m = ir.NewIRModule().With("main", fn)
			} else {
				m = oneOp(t, tc.op, tc.params, tc.attrs)
			}
			out := runVerified(t, m, "LegalizeOps", "AnnotateTIROpPattern")
			name, f := onlyPrimFunc(t, out)
			check.Equal(t, name, tc.name)
			check.Equal(t, f.Attrs[ir.AttrOpPattern], any(int64(tc.want)))
			_, hasSym := f.Attrs[ir.AttrGlobalSymbol]
			check.True(t, !hasSym, "legalized PrimFuncs are private")
		})
	}
	// An existing op_pattern is kept.
	m := oneOp(t, "relax.add", []ir.StructInfo{f32(2), f32(2)}, nil)
	m = runVerified(t, m, "LegalizeOps")
	name, f := onlyPrimFunc(t, m)
	m = m.With(name, f.WithAttr(ir.AttrOpPattern, int64(PatternOpaque)))
	_, f = onlyPrimFunc(t, runVerified(t, m, "AnnotateTIROpPattern"))
	check.Equal(t, f.Attrs[ir.AttrOpPattern], any(int64(PatternOpaque)))
}

func TestLegalizeOpsSharesAndNames(t *testing.T) {
	// Two adds of the same shapes share one PrimFunc; a third of another
	// shape is add1.
	f32 := func(dims ...int64) ir.StructInfo { return ir.TensorOfShape(ir.Float32, dims...) }
	x, y := ir.NewRVar("x", f32(2)), ir.NewRVar("y", f32(3))
	a := op.MustCall("relax.add", []ir.RExpr{x, x}, nil)
	va := ir.NewDataflowVar("x", a.Info)
	b := op.MustCall("relax.add", []ir.RExpr{va, va}, nil)
	vb := ir.NewDataflowVar("x", b.Info)
	c := op.MustCall("relax.add", []ir.RExpr{y, y}, nil)
	gv := ir.NewRVar("gv", ir.Tuple(b.Info, c.Info))
	vc := ir.NewDataflowVar("c", c.Info)
	body := &ir.SeqExpr{Blocks: []*ir.BindingBlock{{Dataflow: true, Bindings: []ir.Binding{
		&ir.VarBinding{Var: va, Value: a}, &ir.VarBinding{Var: vb, Value: b}, &ir.VarBinding{Var: vc, Value: c},
		&ir.VarBinding{Var: gv, Value: &ir.RTuple{Fields: []ir.RExpr{vb, vc}}}}}}, Body: gv}
	m := ir.NewIRModule().With("main", ir.NewFunction([]*ir.RVar{x, y}, body, nil))
	out := runVerified(t, m, "LegalizeOps")
	check.Equal(t, len(out.Names()), 3)
	check.True(t, out.PrimFunc("add") != nil && out.PrimFunc("add1") != nil)
	check.Equal(t, out.Names()[2], "main", "PrimFuncs first, as TVM prints")
}

func TestLegalizeOpsRegistryHook(t *testing.T) {
	// relax.prod has no topi body: a legalizer registered with the
	// operator registry is used, named by its global_symbol.
	f32 := ir.TensorOfShape(ir.Float32, 4)
	leg := func(c *ir.RCall) (*ir.PrimFunc, error) {
		x := te.Placeholder(ir.Dims(4), ir.Float32, "x")
		y := te.Compute(ir.Dims(), func(...ir.Expr) ir.Expr {
			return ir.Mul(ir.Mul(x.At(ir.I64(0)), x.At(ir.I64(1))), ir.Mul(x.At(ir.I64(2)), x.At(ir.I64(3))))
		}, "prod_red")
		f, err := te.CreatePrimFunc([]*te.Tensor{x, y})
		if err != nil {
			return nil, err
		}
		return f.WithAttr(ir.AttrGlobalSymbol, "my_prod"), nil
	}
	check.NoError(t, op.SetLegalize("relax.prod", leg))
	t.Cleanup(func() { check.NoError(t, op.SetLegalize("relax.prod", nil)) })
	m := oneOp(t, "relax.prod", []ir.StructInfo{f32}, nil)
	out := runVerified(t, m, "LegalizeOps")
	name, f := onlyPrimFunc(t, out)
	check.Equal(t, name, "my_prod")
	_, hasSym := f.Attrs[ir.AttrGlobalSymbol]
	check.True(t, !hasSym)

	tests := []struct {
		name string
		leg  op.Legalizer
		want []string
	}{
		{"error", func(*ir.RCall) (*ir.PrimFunc, error) { return nil, errors.New("cannot") },
			[]string{`LegalizeOps: function "main": binding "gv": legalize R.prod: cannot`}},
		{"arity", func(*ir.RCall) (*ir.PrimFunc, error) {
			x := te.Placeholder(ir.Dims(4), ir.Float32, "x")
			z := te.Placeholder(ir.Dims(4), ir.Float32, "z")
			y := te.Compute(ir.Dims(4), func(i ir.Expr) ir.Expr { return ir.Add(x.At(i), z.At(i)) }, "y")
			return te.CreatePrimFunc([]*te.Tensor{x, z, y})
		}, []string{"legalize R.prod: the PrimFunc takes 3 parameters, want 2 (1 tensor inputs, 1 outputs)"}},
		{"panic", func(*ir.RCall) (*ir.PrimFunc, error) { panic("broken legalizer") },
			[]string{"LegalizeOps: internal error: broken legalizer"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			check.NoError(t, op.SetLegalize("relax.prod", tc.leg))
			_, err := Run(m, []string{"LegalizeOps"})
			check.Error(t, err, tc.want...)
		})
	}
}

func TestLegalizeOpsKeepsUnknownShapes(t *testing.T) {
	x := ir.NewRVar("x", ir.TensorNDim(ir.Float32, 2))
	c := op.MustCall("relax.nn.relu", []ir.RExpr{x}, nil)
	gv := ir.NewRVar("gv", c.Info)
	fn := ir.NewFunction([]*ir.RVar{x}, &ir.SeqExpr{Blocks: []*ir.BindingBlock{{Dataflow: true,
		Bindings: []ir.Binding{&ir.VarBinding{Var: gv, Value: c}}}}, Body: gv}, nil)
	m := ir.NewIRModule().With("main", fn)
	out := runVerified(t, m, "LegalizeOps")
	check.True(t, out == m, "nothing to legalize: the same module")
}

func TestFuseTIRErrors(t *testing.T) {
	// A Primitive function calling an operator cannot become TensorIR.
	x := ir.NewRVar("x", ir.TensorOfShape(ir.Float32, 2))
	c := op.MustCall("relax.nn.relu", []ir.RExpr{x}, nil)
	gv := ir.NewRVar("gv", c.Info)
	fn := ir.NewFunction([]*ir.RVar{x}, &ir.SeqExpr{Blocks: []*ir.BindingBlock{{Dataflow: true,
		Bindings: []ir.Binding{&ir.VarBinding{Var: gv, Value: c}}}}, Body: gv}, map[string]any{AttrPrimitive: int64(1)})
	m := ir.NewIRModule().With("fused_relu", fn)
	_, err := Run(m, []string{"FuseTIR"})
	check.Error(t, err, `FuseTIR: function "fused_relu": binding "gv": only call_tir can be fused, got a call of nn_relu`)
}
