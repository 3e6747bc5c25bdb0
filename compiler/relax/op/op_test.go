package op

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

func tv(dt ir.DType, dims ...int64) ir.RExpr { return ir.NewRVar("t", ir.TensorOfShape(dt, dims...)) }

func f32(dims ...int64) ir.RExpr { return tv(ir.Float32, dims...) }

func shape(dims ...int64) ir.RExpr { return &ir.ShapeExpr{Values: ir.Dims(dims...)} }

func tuple(es ...ir.RExpr) ir.RExpr { return &ir.RTuple{Fields: es} }

// TestInfer checks the struct info each operator infers, and the errors
// for ill-typed calls, which name the operator and the shapes.
func TestInfer(t *testing.T) {
	n := ir.NewVar("n", ir.Int64)
	sym := ir.NewRVar("s", ir.Tensor(ir.Float32, n, ir.I64(4)))
	unknown := ir.NewRVar("u", ir.TensorNDim(ir.Float32, -1))
	for _, tc := range []struct {
		name  string
		op    string
		args  []ir.RExpr
		attrs map[string]any
		want  string // struct info, or the error
		err   bool
	}{
		{"add same", "relax.add", []ir.RExpr{f32(2, 3), f32(2, 3)}, nil, `R.Tensor((2, 3), dtype="float32")`, false},
		{"add broadcast", "relax.add", []ir.RExpr{f32(1, 256), f32(256)}, nil, `R.Tensor((1, 256), dtype="float32")`, false},
		{"add broadcast both", "relax.multiply", []ir.RExpr{f32(4, 1, 3), f32(5, 1)}, nil, `R.Tensor((4, 5, 3), dtype="float32")`, false},
		{"add no broadcast", "relax.add", []ir.RExpr{f32(2, 3), f32(4)}, nil, "add: shapes (2, 3) and (4,) do not broadcast", true},
		{"add dtypes", "relax.add", []ir.RExpr{f32(2), tv(ir.Int32, 2)}, nil, "add: dtypes float32 and int32 differ", true},
		{"add symbolic", "relax.add", []ir.RExpr{sym, f32(1, 4)}, nil, `R.Tensor((n, 4), dtype="float32")`, false},
		{"add symbolic vs constant", "relax.add", []ir.RExpr{sym, f32(3, 4)}, nil, `R.Tensor(dtype="float32", ndim=2)`, false},
		{"add unknown rank", "relax.add", []ir.RExpr{unknown, f32(3)}, nil, `R.Tensor(dtype="float32")`, false},
		{"subtract", "relax.subtract", []ir.RExpr{f32(3), f32(3)}, nil, `R.Tensor((3,), dtype="float32")`, false},
		{"divide", "relax.divide", []ir.RExpr{f32(3), f32()}, nil, `R.Tensor((3,), dtype="float32")`, false},
		{"power", "relax.power", []ir.RExpr{f32(3), f32(1)}, nil, `R.Tensor((3,), dtype="float32")`, false},
		{"maximum", "relax.maximum", []ir.RExpr{f32(2, 1), f32(1, 2)}, nil, `R.Tensor((2, 2), dtype="float32")`, false},
		{"minimum", "relax.minimum", []ir.RExpr{f32(2), f32(3)}, nil, "minimum: shapes (2,) and (3,) do not broadcast", true},
		{"less is bool", "relax.less", []ir.RExpr{f32(2), f32(2)}, nil, `R.Tensor((2,), dtype="bool")`, false},
		{"exp", "relax.exp", []ir.RExpr{f32(2, 2)}, nil, `R.Tensor((2, 2), dtype="float32")`, false},
		{"relu", "relax.nn.relu", []ir.RExpr{f32(1, 256)}, nil, `R.Tensor((1, 256), dtype="float32")`, false},
		{"gelu", "relax.nn.gelu", []ir.RExpr{f32(3)}, nil, `R.Tensor((3,), dtype="float32")`, false},
		{"silu", "relax.nn.silu", []ir.RExpr{f32(3)}, nil, `R.Tensor((3,), dtype="float32")`, false},
		{"unary arity", "relax.log", []ir.RExpr{f32(3), f32(3)}, nil, "log takes 1 arguments (x), got 2", true},
		{"unary of a shape", "relax.sqrt", []ir.RExpr{shape(2)}, nil, `sqrt: argument "x" is R.Shape([2]), want a tensor`, true},
		{"astype", "relax.astype", []ir.RExpr{f32(2, 3)}, map[string]any{"dtype": "float16"}, `R.Tensor((2, 3), dtype="float16")`, false},
		{"astype bad dtype", "relax.astype", []ir.RExpr{f32(2)}, map[string]any{"dtype": "float33"}, `astype: attribute "dtype": unknown dtype "float33"`, true},
		{"clip", "relax.clip", []ir.RExpr{f32(2), &ir.PrimValue{Value: ir.F64(0)}, &ir.PrimValue{Value: ir.F64(6)}}, nil, `R.Tensor((2,), dtype="float32")`, false},
		{"where", "relax.where", []ir.RExpr{tv(ir.Bool, 2, 1), f32(3), f32(1)}, nil, `R.Tensor((2, 3), dtype="float32")`, false},
		{"where cond dtype", "relax.where", []ir.RExpr{f32(2), f32(2), f32(2)}, nil, "where: condition has dtype float32, want bool", true},
		{"matmul", "relax.matmul", []ir.RExpr{f32(1, 784), f32(784, 256)}, map[string]any{"out_dtype": "void"}, `R.Tensor((1, 256), dtype="float32")`, false},
		{"matmul batched", "relax.matmul", []ir.RExpr{f32(8, 1, 2, 3), f32(4, 3, 5)}, nil, `R.Tensor((8, 4, 2, 5), dtype="float32")`, false},
		{"matmul vector", "relax.matmul", []ir.RExpr{f32(3), f32(3, 5)}, nil, `R.Tensor((5,), dtype="float32")`, false},
		{"matmul out_dtype", "relax.matmul", []ir.RExpr{tv(ir.Int8, 2, 3), tv(ir.Int8, 3, 2)}, map[string]any{"out_dtype": "int32"}, `R.Tensor((2, 2), dtype="int32")`, false},
		{"matmul mismatch", "relax.matmul", []ir.RExpr{f32(1, 784), f32(256, 10)}, nil, "matmul: shapes (1, 784) and (256, 10) do not match: reduction dimensions 784 and 256 differ", true},
		{"matmul batch mismatch", "relax.matmul", []ir.RExpr{f32(2, 1, 3), f32(3, 3, 1)}, nil, "matmul: batch dimensions of shapes (2, 1, 3) and (3, 3, 1) do not broadcast", true},
		{"permute_dims None", "relax.permute_dims", []ir.RExpr{f32(256, 784)}, map[string]any{"axes": nil}, `R.Tensor((784, 256), dtype="float32")`, false},
		{"permute_dims axes", "relax.permute_dims", []ir.RExpr{f32(1, 2, 3)}, map[string]any{"axes": []any{int64(0), int64(2), int64(1)}}, `R.Tensor((1, 3, 2), dtype="float32")`, false},
		{"permute_dims bad axes", "relax.permute_dims", []ir.RExpr{f32(1, 2, 3)}, map[string]any{"axes": []any{int64(0), int64(1)}}, "permute_dims: 2 axes for a tensor of shape (1, 2, 3)", true},
		{"reshape", "relax.reshape", []ir.RExpr{f32(2, 3), shape(3, 2)}, nil, `R.Tensor((3, 2), dtype="float32")`, false},
		{"reshape -1", "relax.reshape", []ir.RExpr{f32(2, 3, 4), shape(-1, 4)}, nil, `R.Tensor((6, 4), dtype="float32")`, false},
		{"reshape bad", "relax.reshape", []ir.RExpr{f32(2, 3), shape(4, 2)}, nil, "reshape: cannot reshape (2, 3) (6 elements) to (4, 2) (8 elements)", true},
		{"flatten", "relax.flatten", []ir.RExpr{f32(2, 3, 4)}, nil, `R.Tensor((24,), dtype="float32")`, false},
		{"concat", "relax.concat", []ir.RExpr{tuple(f32(2, 3), f32(2, 5))}, map[string]any{"axis": 1}, `R.Tensor((2, 8), dtype="float32")`, false},
		{"concat mismatch", "relax.concat", []ir.RExpr{tuple(f32(2, 3), f32(3, 5))}, map[string]any{"axis": 1}, "concat: shapes (2, 3) and (3, 5) differ outside axis 1", true},
		{"split sections", "relax.split", []ir.RExpr{f32(4, 6)}, map[string]any{"indices_or_sections": 3, "axis": 1}, `R.Tuple(R.Tensor((4, 2), dtype="float32"), R.Tensor((4, 2), dtype="float32"), R.Tensor((4, 2), dtype="float32"))`, false},
		{"split indices", "relax.split", []ir.RExpr{f32(10)}, map[string]any{"indices_or_sections": []any{2, 7}}, `R.Tuple(R.Tensor((2,), dtype="float32"), R.Tensor((5,), dtype="float32"), R.Tensor((3,), dtype="float32"))`, false},
		{"split uneven", "relax.split", []ir.RExpr{f32(10)}, map[string]any{"indices_or_sections": 3}, "split: dimension 0 of shape (10,) does not split into 3 equal sections", true},
		{"strided_slice", "relax.strided_slice", []ir.RExpr{f32(10, 8)}, map[string]any{"axes": []any{0, 1}, "begin": []any{1, 0}, "end": []any{8, 100}, "strides": []any{2, 3}}, `R.Tensor((4, 3), dtype="float32")`, false},
		{"strided_slice negative", "relax.strided_slice", []ir.RExpr{f32(10)}, map[string]any{"axes": []any{0}, "begin": []any{-1}, "end": []any{-11}, "strides": []any{-1}}, `R.Tensor((10,), dtype="float32")`, false},
		{"take axis", "relax.take", []ir.RExpr{f32(5, 7), tv(ir.Int64, 2, 3)}, map[string]any{"axis": 1}, `R.Tensor((5, 2, 3), dtype="float32")`, false},
		{"take float indices", "relax.take", []ir.RExpr{f32(5), f32(2)}, nil, "take: indices have dtype float32, want an integer type", true},
		{"broadcast_to", "relax.broadcast_to", []ir.RExpr{f32(1, 3), shape(4, 2, 3)}, nil, `R.Tensor((4, 2, 3), dtype="float32")`, false},
		{"broadcast_to bad", "relax.broadcast_to", []ir.RExpr{f32(2, 3), shape(4, 3)}, nil, "broadcast_to: cannot broadcast shape (2, 3) to (4, 3)", true},
		{"expand_dims", "relax.expand_dims", []ir.RExpr{f32(2, 3)}, map[string]any{"axis": []any{0, -1}}, `R.Tensor((1, 2, 3, 1), dtype="float32")`, false},
		{"squeeze all", "relax.squeeze", []ir.RExpr{f32(1, 2, 1, 3)}, nil, `R.Tensor((2, 3), dtype="float32")`, false},
		{"squeeze axis", "relax.squeeze", []ir.RExpr{f32(1, 2, 1)}, map[string]any{"axis": []any{2}}, `R.Tensor((1, 2), dtype="float32")`, false},
		{"squeeze not 1", "relax.squeeze", []ir.RExpr{f32(1, 2)}, map[string]any{"axis": []any{1}}, "squeeze: axis 1 of shape (1, 2) is not 1", true},
		{"sum all", "relax.sum", []ir.RExpr{f32(2, 3)}, nil, `R.Tensor((), dtype="float32")`, false},
		{"sum axis keepdims", "relax.sum", []ir.RExpr{f32(2, 3, 4)}, map[string]any{"axis": []any{1}, "keepdims": true}, `R.Tensor((2, 1, 4), dtype="float32")`, false},
		{"mean", "relax.mean", []ir.RExpr{f32(2, 3, 4)}, map[string]any{"axis": []any{-1, 0}}, `R.Tensor((3,), dtype="float32")`, false},
		{"max axis int", "relax.max", []ir.RExpr{f32(2, 3)}, map[string]any{"axis": 1}, `R.Tensor((2,), dtype="float32")`, false},
		{"min out of range", "relax.min", []ir.RExpr{f32(2, 3)}, map[string]any{"axis": 2}, "min: axis 2 out of range for a tensor of rank 2", true},
		{"argmax", "relax.argmax", []ir.RExpr{f32(2, 3)}, map[string]any{"axis": 1}, `R.Tensor((2,), dtype="int64")`, false},
		{"softmax", "relax.nn.softmax", []ir.RExpr{f32(2, 10)}, nil, `R.Tensor((2, 10), dtype="float32")`, false},
		{"log_softmax axis", "relax.nn.log_softmax", []ir.RExpr{f32(2, 10)}, map[string]any{"axis": 3}, "nn.log_softmax: axis 3 out of range for a tensor of rank 2", true},
		{"layer_norm", "relax.nn.layer_norm", []ir.RExpr{f32(2, 8, 16), f32(16), f32(16)}, nil, `R.Tensor((2, 8, 16), dtype="float32")`, false},
		{"layer_norm gamma", "relax.nn.layer_norm", []ir.RExpr{f32(2, 16), f32(8), f32(16)}, nil, "nn.layer_norm: gamma has shape (8,), want (16,) for data of shape (2, 16)", true},
		{"batch_norm", "relax.nn.batch_norm", []ir.RExpr{f32(1, 3, 8, 8), f32(3), f32(3), f32(3), f32(3)}, nil,
			`R.Tuple(R.Tensor((1, 3, 8, 8), dtype="float32"), R.Tensor((3,), dtype="float32"), R.Tensor((3,), dtype="float32"))`, false},
		{"conv2d NCHW", "relax.nn.conv2d", []ir.RExpr{f32(1, 3, 32, 32), f32(16, 3, 3, 3)}, map[string]any{"padding": []any{1, 1}}, `R.Tensor((1, 16, 32, 32), dtype="float32")`, false},
		{"conv2d strides dilation", "relax.nn.conv2d", []ir.RExpr{f32(1, 3, 32, 32), f32(8, 3, 3, 3)}, map[string]any{"strides": []any{2, 2}, "dilation": 2}, `R.Tensor((1, 8, 14, 14), dtype="float32")`, false},
		{"conv2d NHWC groups", "relax.nn.conv2d", []ir.RExpr{f32(2, 16, 16, 8), f32(3, 3, 4, 8)},
			map[string]any{"data_layout": "NHWC", "kernel_layout": "HWIO", "groups": 2}, `R.Tensor((2, 14, 14, 8), dtype="float32")`, false},
		{"conv2d channels", "relax.nn.conv2d", []ir.RExpr{f32(1, 3, 8, 8), f32(4, 4, 3, 3)}, nil,
			"nn.conv2d: data of shape (1, 3, 8, 8) (layout NCHW) has 3 channels, weight of shape (4, 4, 3, 3) (layout OIHW) takes 4 × 1 groups", true},
		{"conv2d blocked kernel", "relax.nn.conv2d", []ir.RExpr{f32(1, 3, 8, 8), f32(2, 3, 3, 3, 16)}, map[string]any{"kernel_layout": "OHWI16o", "padding": []any{1, 1}}, `R.Tensor((1, 32, 8, 8), dtype="float32")`, false},
		{"conv2d blocked kernel block", "relax.nn.conv2d", []ir.RExpr{f32(1, 3, 8, 8), f32(2, 3, 3, 3, 8)}, map[string]any{"kernel_layout": "OHWI16o"}, "nn.conv2d: kernel layout OHWI16o takes a weight of shape [.., 16] and one group", true},
		{"conv2d layout", "relax.nn.conv2d", []ir.RExpr{f32(1, 3, 8, 8), f32(4, 3, 3, 3)}, map[string]any{"data_layout": "NCWX"}, `nn.conv2d: unsupported layout "NCWX" (want a permutation of "NCHW")`, true},
		{"max_pool2d", "relax.nn.max_pool2d", []ir.RExpr{f32(1, 4, 32, 32)}, map[string]any{"pool_size": []any{2, 2}, "strides": []any{2, 2}}, `R.Tensor((1, 4, 16, 16), dtype="float32")`, false},
		{"avg_pool2d NHWC ceil", "relax.nn.avg_pool2d", []ir.RExpr{f32(1, 7, 7, 4)}, map[string]any{"pool_size": []any{2, 2}, "strides": []any{2, 2}, "layout": "NHWC", "ceil_mode": true}, `R.Tensor((1, 4, 4, 4), dtype="float32")`, false},
		{"adaptive_avg_pool2d", "relax.nn.adaptive_avg_pool2d", []ir.RExpr{f32(1, 4, 7, 7)}, map[string]any{"output_size": []any{1, 1}}, `R.Tensor((1, 4, 1, 1), dtype="float32")`, false},
		{"linear", "relax.nn.linear", []ir.RExpr{f32(1, 784), f32(256, 784), f32(256)}, nil, `R.Tensor((1, 256), dtype="float32")`, false},
		{"linear features", "relax.nn.linear", []ir.RExpr{f32(1, 784), f32(256, 700)}, nil, "nn.linear: data of shape (1, 784) has 784 features, weight of shape (256, 700) takes 700", true},
		{"alloc_tensor", "relax.vm.alloc_tensor", []ir.RExpr{ir.NewRVar("s", ir.Object()), &ir.PrimValue{Value: ir.I64(0)}, shape(2, 2), &ir.DataTypeImm{DType: ir.Float32}}, nil, `R.Tensor((2, 2), dtype="float32")`, false},
		{"alloc_storage", "relax.vm.alloc_storage", []ir.RExpr{shape(4), &ir.PrimValue{Value: ir.I64(0)}, &ir.DataTypeImm{DType: ir.Float32}, &ir.RString{Value: "global"}}, nil, "R.Object", false},
		{"unknown attribute", "relax.add", []ir.RExpr{f32(2), f32(2)}, map[string]any{"axis": 1}, `add has no attribute "axis"`, true},
		{"unknown operator", "relax.nope", nil, nil, `unknown operator "relax.nope"`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Call(tc.op, tc.args, tc.attrs)
			if tc.err {
				check.Error(t, err, tc.want)
				return
			}
			check.NoError(t, err)
			check.Equal(t, c.Info.String(), tc.want)
		})
	}
}

// TestRegistry checks that the operators are registered, with
// script names, and reach compiler/ir.
func TestRegistry(t *testing.T) {
	for _, n := range []string{"add", "subtract", "multiply", "divide", "power", "maximum", "minimum",
		"exp", "log", "sqrt", "tanh", "sigmoid", "nn.relu", "nn.gelu", "nn.silu", "abs", "negative", "erf", "astype", "clip", "where",
		"matmul", "permute_dims", "reshape", "flatten", "concat", "split", "strided_slice", "take", "broadcast_to", "expand_dims", "squeeze",
		"sum", "mean", "max", "min", "argmax", "nn.softmax", "nn.log_softmax", "nn.layer_norm", "nn.batch_norm",
		"nn.conv2d", "nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d", "nn.linear",
		"vm.alloc_storage", "vm.alloc_tensor", "builtin.alloc_tensor", "memory.alloc_storage", "memory.alloc_tensor"} {
		d, ok := Lookup("relax." + n)
		check.True(t, ok, n)
		s, ok := ByScriptName("R." + n)
		check.True(t, ok && s == d, "R."+n)
		_, ok = ir.LookupOp("relax." + n)
		check.True(t, ok, n, "in ir's registry")
	}
	check.True(t, len(Names()) >= 40, "at least 40 operators")
	d, _ := Lookup("relax.vm.alloc_storage")
	check.True(t, !d.IsPure(), "alloc_storage is impure")
	check.Error(t, Register(&Def{Name: "relax.add", Infer: inferUnary}), `register operator "relax.add": already registered`)
	check.Error(t, SetLegalize("relax.nope", nil), `unknown operator "relax.nope"`)
	check.NoError(t, SetLegalize("relax.add", func(*ir.RCall) (*ir.PrimFunc, error) { return nil, nil }))
	check.True(t, d.Legalize() == nil)
	a, _ := Lookup("relax.add")
	check.True(t, a.Legalize() != nil)
	check.NoError(t, SetLegalize("relax.add", nil))
}

// TestNormalizeAttrs checks defaults and canonical values.
func TestNormalizeAttrs(t *testing.T) {
	d, _ := Lookup("relax.nn.conv2d")
	m, err := d.NormalizeAttrs(map[string]any{"strides": 2, "groups": 1})
	check.NoError(t, err)
	check.Equal(t, m["strides"], any([]any{int64(2)}))
	check.Equal(t, m["padding"], any([]any{int64(0), int64(0), int64(0), int64(0)}))
	check.Equal(t, m["out_layout"], any(nil))
	_, err = d.NormalizeAttrs(map[string]any{"groups": "two"})
	check.Error(t, err, `nn.conv2d: attribute "groups": want an integer, got "two"`)
}
