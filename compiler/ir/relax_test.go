package ir_test

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/internal/check"
)

// mlp builds the IRModule tutorial's MLP graph function in Go.
func mlp() *ir.Function {
	x := ir.NewRVar("x", ir.TensorOfShape(ir.Float32, 1, 784))
	w := ir.NewRVar("w", ir.TensorOfShape(ir.Float32, 256, 784))
	b := ir.NewRVar("b", ir.TensorOfShape(ir.Float32, 256))
	wt := op.MustCall("relax.permute_dims", []ir.RExpr{w}, nil)
	lv0 := ir.NewDataflowVar("lv0", wt.Info)
	mm := op.MustCall("relax.matmul", []ir.RExpr{x, lv0}, nil)
	lv1 := ir.NewDataflowVar("lv1", mm.Info)
	add := op.MustCall("relax.add", []ir.RExpr{lv1, b}, nil)
	lv2 := ir.NewDataflowVar("lv2", add.Info)
	relu := op.MustCall("relax.nn.relu", []ir.RExpr{lv2}, nil)
	gv := ir.NewRVar("gv", relu.Info)
	body := &ir.SeqExpr{Blocks: []*ir.BindingBlock{{Dataflow: true, Bindings: []ir.Binding{
		&ir.VarBinding{Var: lv0, Value: wt},
		&ir.VarBinding{Var: lv1, Value: mm},
		&ir.VarBinding{Var: lv2, Value: add},
		&ir.VarBinding{Var: gv, Value: relu},
	}}}, Body: gv}
	return ir.NewFunction([]*ir.RVar{x, w, b}, body, map[string]any{ir.AttrGlobalSymbol: "main"})
}

func TestFunctionBasics(t *testing.T) {
	f := mlp()
	check.Equal(t, f.Ret.String(), `R.Tensor((1, 256), dtype="float32")`)
	check.NoError(t, ir.VerifyFunction("main", f, nil))
	m := ir.NewIRModule().With("main", f)
	check.NoError(t, ir.VerifyModule(m))
	check.Equal(t, f.FuncInfo().String(),
		`R.Callable((R.Tensor((1, 784), dtype="float32"), R.Tensor((256, 784), dtype="float32"), R.Tensor((256,), dtype="float32")), R.Tensor((1, 256), dtype="float32"), True)`)
}

func TestFunctionStructuralEquality(t *testing.T) {
	a, b := mlp(), mlp()
	check.True(t, ir.StructuralEqual(a, b), "two builds are equal")
	check.Equal(t, ir.StructuralHash(a), ir.StructuralHash(b))
	check.True(t, !ir.Equal(a, b), "but not identical")
	check.True(t, ir.Equal(a, a))

	renamed := mlp()
	renamed.Params[0].Name = "input"
	check.True(t, ir.StructuralEqual(a, renamed), "names do not count")

	c := mlp()
	blk := c.Body.Blocks[0]
	relu := blk.Bindings[3].(*ir.VarBinding)
	blk.Bindings[3] = &ir.VarBinding{Var: relu.Var, Value: op.MustCall("relax.nn.gelu", relu.Value.(*ir.RCall).Args, nil)}
	check.True(t, !ir.StructuralEqual(a, c), "a different operator differs")

	d := mlp()
	d.Attrs["num_input"] = int64(1)
	check.True(t, !ir.StructuralEqual(a, d), "attributes count")
}

func TestVerifyFunction(t *testing.T) {
	x := ir.NewRVar("x", ir.TensorOfShape(ir.Float32, 2, 3))
	exp := op.MustCall("relax.exp", []ir.RExpr{x}, nil)
	for _, tc := range []struct {
		name  string
		build func() *ir.Function
		want  string
	}{
		{"undefined variable", func() *ir.Function {
			ghost := ir.NewRVar("ghost", x.Info)
			return ir.NewFunction([]*ir.RVar{x}, &ir.SeqExpr{Body: ghost}, nil)
		}, `function "f": body: variable "ghost" is not defined here`},
		{"dataflow variable outside its block", func() *ir.Function {
			lv := ir.NewDataflowVar("lv", exp.Info)
			return ir.NewFunction([]*ir.RVar{x}, &ir.SeqExpr{Blocks: []*ir.BindingBlock{{Dataflow: true,
				Bindings: []ir.Binding{&ir.VarBinding{Var: lv, Value: exp}}}}, Body: lv}, nil)
		}, `function "f": body: dataflow variable "lv" used outside its dataflow block`},
		{"dataflow variable in a plain block", func() *ir.Function {
			lv := ir.NewDataflowVar("lv", exp.Info)
			return ir.NewFunction([]*ir.RVar{x}, &ir.SeqExpr{Blocks: []*ir.BindingBlock{{
				Bindings: []ir.Binding{&ir.VarBinding{Var: lv, Value: exp}}}}, Body: x}, nil)
		}, `binding "lv": dataflow variable bound outside a dataflow block`},
		{"struct info mismatch", func() *ir.Function {
			v := ir.NewRVar("v", ir.TensorOfShape(ir.Float32, 3, 2))
			return ir.NewFunction([]*ir.RVar{x}, &ir.SeqExpr{Blocks: []*ir.BindingBlock{{
				Bindings: []ir.Binding{&ir.VarBinding{Var: v, Value: exp}}}}, Body: v}, nil)
		}, `binding "v": struct info R.Tensor((3, 2), dtype="float32") does not match the value's R.Tensor((2, 3), dtype="float32")`},
		{"ill-typed call", func() *ir.Function {
			y := ir.NewRVar("y", ir.TensorOfShape(ir.Float32, 4))
			v := ir.NewRVar("v", ir.Object())
			bad := &ir.RCall{Op: &ir.Op{Name: "relax.add"}, Args: []ir.RExpr{x, y}, Attrs: map[string]any{}}
			return ir.NewFunction([]*ir.RVar{x, y}, &ir.SeqExpr{Blocks: []*ir.BindingBlock{{
				Bindings: []ir.Binding{&ir.VarBinding{Var: v, Value: bad}}}}, Body: v}, nil)
		}, `binding "v": add: shapes (2, 3) and (4,) do not broadcast`},
		{"unknown operator", func() *ir.Function {
			v := ir.NewRVar("v", ir.Object())
			bad := &ir.RCall{Op: &ir.Op{Name: "relax.frobnicate"}, Args: []ir.RExpr{x}}
			return ir.NewFunction([]*ir.RVar{x}, &ir.SeqExpr{Blocks: []*ir.BindingBlock{{
				Bindings: []ir.Binding{&ir.VarBinding{Var: v, Value: bad}}}}, Body: v}, nil)
		}, `binding "v": unknown operator "relax.frobnicate"`},
		{"defined twice", func() *ir.Function {
			return ir.NewFunction([]*ir.RVar{x}, &ir.SeqExpr{Blocks: []*ir.BindingBlock{{
				Bindings: []ir.Binding{&ir.VarBinding{Var: x, Value: exp}}}}, Body: x}, nil)
		}, `binding "x": variable "x" defined twice`},
		{"undefined symbolic dimension", func() *ir.Function {
			n := ir.NewVar("n", ir.Int64)
			v := ir.NewRVar("v", ir.Tensor(ir.Float32, n, ir.I64(3)))
			return ir.NewFunction([]*ir.RVar{x}, &ir.SeqExpr{Blocks: []*ir.BindingBlock{{
				Bindings: []ir.Binding{&ir.VarBinding{Var: v, Value: x}}}}, Body: x}, nil)
		}, `binding "v": symbolic dimension "n" is not defined`},
		{"wrong result", func() *ir.Function {
			f := ir.NewFunction([]*ir.RVar{x}, &ir.SeqExpr{Body: x}, nil)
			f.Ret = ir.TensorOfShape(ir.Int32, 2, 3)
			return f
		}, `return value: result R.Tensor((2, 3), dtype="float32") does not match the declared R.Tensor((2, 3), dtype="int32")`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ir.VerifyFunction("f", tc.build(), nil)
			check.Error(t, err, tc.want)
			check.ErrorIs(t, err, ir.ErrIllFormed)
		})
	}
}

func TestStructInfoRelations(t *testing.T) {
	n := ir.NewVar("n", ir.Int64)
	full := ir.TensorOfShape(ir.Float32, 2, 3)
	rank := ir.TensorNDim(ir.Float32, 2)
	anyT := ir.TensorNDim(ir.Void, -1)
	symb := ir.Tensor(ir.Float32, n, ir.I64(3))
	check.True(t, ir.IsBaseOf(rank, full) && ir.IsBaseOf(anyT, full) && ir.IsBaseOf(ir.Object(), full))
	check.True(t, !ir.IsBaseOf(full, rank))
	check.Equal(t, ir.Conflict(full, rank), "")
	check.Equal(t, ir.Conflict(full, symb), "")
	check.Equal(t, ir.Conflict(full, ir.TensorOfShape(ir.Float32, 3, 3)), `R.Tensor((3, 3), dtype="float32") is not R.Tensor((2, 3), dtype="float32")`)
	check.Equal(t, ir.Unify(full, ir.TensorOfShape(ir.Float32, 4, 3)).String(), `R.Tensor(dtype="float32", ndim=2)`)
	check.Equal(t, ir.Unify(full, ir.TensorOfShape(ir.Float32, 2, 3)).String(), `R.Tensor((2, 3), dtype="float32")`)
	check.Equal(t, ir.Unify(full, ir.Tuple()).String(), "R.Object")
	check.Equal(t, ir.DimString(ir.FoldDim(ir.Mul(ir.Add(ir.I64(2), ir.I64(2)), n))), "4 * n")
	check.True(t, ir.DimEqual(ir.Mul(ir.I64(2), ir.I64(2)), ir.I64(4)))
}

func TestConstant(t *testing.T) {
	c, err := ir.ConstantFromBytes(ir.Float32, []int64{2}, make([]byte, 8))
	check.NoError(t, err)
	check.Equal(t, ir.StructInfoOf(c).String(), `R.Tensor((2,), dtype="float32")`)
	_, err = ir.ConstantFromBytes(ir.Float32, []int64{2}, make([]byte, 7))
	check.Error(t, err, "constant of shape (2,) and dtype float32 needs 8 bytes, got 7")
}
