package topi

import (
	"encoding/binary"
	"errors"
	"flag"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the printer's output")

func tvar(name string, dt ir.DType, shape ...int64) *ir.RVar {
	return ir.NewRVar(name, ir.TensorOfShape(dt, shape...))
}

// legalizeSeed001 legalizes the operator calls of the IRModule tutorial's MLP, named as
// the seed names their functions.
func legalizeSeed001(t *testing.T) map[string]*Result {
	t.Helper()
	f32 := ir.Float32
	inp, b1, w1 := tvar("inp_0", f32, 1, 784), tvar("fc1_bias", f32, 256), tvar("fc1_weight", f32, 256, 784)
	b2, w2 := tvar("fc2_bias", f32, 10), tvar("fc2_weight", f32, 10, 256)
	calls := []struct {
		fn, bind, op string
		args         []ir.RExpr
	}{
		{"transpose", "lv", "relax.permute_dims", []ir.RExpr{w1}},
		{"matmul", "lv1", "relax.matmul", []ir.RExpr{inp, nil}},
		{"add", "lv2", "relax.add", []ir.RExpr{nil, b1}},
		{"relu", "lv3", "relax.nn.relu", []ir.RExpr{nil}},
		{"transpose1", "lv4", "relax.permute_dims", []ir.RExpr{w2}},
		{"matmul1", "lv5", "relax.matmul", []ir.RExpr{nil, nil}},
		{"add1", "lv6", "relax.add", []ir.RExpr{nil, b2}},
	}
	vars := map[string]*ir.RVar{}
	prev := []string{"", "lv", "lv1", "lv2", "", "lv3", "lv5"}
	second := map[string]string{"matmul": "lv", "matmul1": "lv4"}
	out := map[string]*Result{}
	for i, c := range calls {
		args := slices.Clone(c.args)
		for j, a := range args {
			if a != nil {
				continue
			}
			if j == 0 {
				args[j] = vars[prev[i]]
			} else {
				args[j] = vars[second[c.fn]]
			}
		}
		call, err := op.Call(c.op, args, nil)
		check.NoError(t, err, c.fn)
		r, err := LegalizeCall(call)
		check.NoError(t, err, c.fn)
		check.Equal(t, ir.StructuralEqual(r.Out, call.Info), true, c.fn, "output struct info", r.Out, call.Info)
		vars[c.bind] = ir.NewDataflowVar(c.bind, r.Out)
		out[c.fn] = r
	}
	return out
}

func TestSeed001Legalization(t *testing.T) {
	got := legalizeSeed001(t)
	src, err := os.ReadFile("../script/testdata/001_after_legalize_ops.py")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("TVM's IRModule tutorial text not found")
	}
	check.NoError(t, err)
	mod, err := script.Parse("001_after_legalize_ops.py", string(src))
	check.NoError(t, err)
	hints := map[string]string{"transpose": "transpose", "transpose1": "transpose", "matmul": "matmul", "matmul1": "matmul",
		"add": "add", "add1": "add", "relu": "relu"}
	for name, r := range got {
		t.Run(name, func(t *testing.T) {
			want := mod.PrimFunc(name)
			check.True(t, want != nil, "seed has", name)
			if !ir.StructuralEqual(r.Func, want) {
				t.Fatalf("legalized %s differs from the seed:\n%s\nwant:\n%s", name, script.Print(r.Func), script.Print(want))
			}
			check.Equal(t, r.NameHint, hints[name])
			_, private := r.Func.Attrs[ir.AttrGlobalSymbol]
			check.Equal(t, private, false, "no global_symbol")
		})
	}
}

// TestLegalizeGolden prints the legalized functions of representative
// calls; refresh with -update.
func TestLegalizeGolden(t *testing.T) {
	f32 := ir.Float32
	n := ir.NewVar("n", ir.Int64)
	cases := []struct {
		name string
		op   string
		args []ir.RExpr
		attr map[string]any
	}{
		{"add_symbolic", "relax.add", []ir.RExpr{ir.NewRVar("x", ir.Tensor(f32, n, ir.I64(4))), tvar("y", f32, 4)}, nil},
		{"exp", "relax.exp", []ir.RExpr{tvar("x", f32, 2, 3)}, nil},
		{"matmul_batched", "relax.matmul", []ir.RExpr{tvar("a", f32, 2, 1, 3, 4), tvar("b", f32, 5, 4, 6)}, nil},
		{"reshape", "relax.reshape", []ir.RExpr{tvar("x", f32, 2, 3, 4), &ir.ShapeExpr{Values: ir.Dims(6, -1)}}, nil},
		{"concat", "relax.concat", []ir.RExpr{&ir.RTuple{Fields: []ir.RExpr{tvar("a", f32, 2, 3), tvar("b", f32, 2, 1)}}}, map[string]any{"axis": 1}},
		{"sum", "relax.sum", []ir.RExpr{tvar("x", f32, 2, 3, 4)}, map[string]any{"axis": []int64{1}, "keepdims": true}},
		{"softmax", "relax.nn.softmax", []ir.RExpr{tvar("x", f32, 2, 8)}, nil},
		{"conv2d", "relax.nn.conv2d", []ir.RExpr{tvar("data", f32, 1, 3, 8, 8), tvar("weight", f32, 4, 3, 3, 3)},
			map[string]any{"padding": []int64{1, 1}, "strides": []int64{2, 2}}},
		{"max_pool2d", "relax.nn.max_pool2d", []ir.RExpr{tvar("x", f32, 1, 2, 6, 6)},
			map[string]any{"pool_size": []int64{3, 3}, "strides": []int64{2, 2}, "padding": []int64{1}}},
		{"linear", "relax.nn.linear", []ir.RExpr{tvar("x", f32, 2, 4), tvar("w", f32, 3, 4), tvar("b", f32, 3)}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			call, err := op.Call(c.op, c.args, c.attr)
			check.NoError(t, err)
			r, err := LegalizeCall(call)
			check.NoError(t, err)
			text := script.Print(r.Func.WithAttr(ir.AttrGlobalSymbol, r.NameHint))
			path := filepath.Join("testdata", c.name+".golden")
			if *update {
				check.NoError(t, os.MkdirAll("testdata", 0o755))
				check.NoError(t, os.WriteFile(path, []byte(text), 0o644))
				return
			}
			want, err := os.ReadFile(path)
			check.NoError(t, err, "run go test -update to create", path)
			if string(want) != text {
				t.Fatalf("%s changed; got:\n%s", path, text)
			}
			// The text parses back to the same function.
			mod, err := script.Parse(path, text)
			check.NoError(t, err)
			check.True(t, ir.StructuralEqual(mod.PrimFunc(r.NameHint), r.Func.WithAttr(ir.AttrGlobalSymbol, r.NameHint)), "round trip")
		})
	}
}

// legalizeCases gives, for every operator this package legalizes, a call
// over small concrete shapes.
func legalizeCases() map[string]struct {
	args []ir.RExpr
	attr map[string]any
} {
	f32, i64 := ir.Float32, ir.Int64
	type c = struct {
		args []ir.RExpr
		attr map[string]any
	}
	x := func() *ir.RVar { return tvar("x", f32, 2, 3) }
	y := func() *ir.RVar { return tvar("y", f32, 3) }
	cases := map[string]c{}
	for _, name := range []string{"add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "minimum",
		"equal", "not_equal", "less", "less_equal", "greater", "greater_equal"} {
		cases["relax."+name] = c{args: []ir.RExpr{x(), y()}}
	}
	for name, u := range unaryOps {
		full := "relax." + name
		if u.stage != "" {
			full = "relax.nn." + name
		}
		cases[full] = c{args: []ir.RExpr{x()}}
	}
	cases["relax.astype"] = c{[]ir.RExpr{x()}, map[string]any{"dtype": "int32"}}
	cases["relax.clip"] = c{args: []ir.RExpr{x(), &ir.PrimValue{Value: ir.F32(-0.5)}, &ir.PrimValue{Value: ir.F32(0.5)}}}
	cases["relax.where"] = c{args: []ir.RExpr{tvar("c", ir.Bool, 2, 1), x(), y()}}
	cases["relax.matmul"] = c{args: []ir.RExpr{x(), tvar("w", f32, 3, 4)}}
	cases["relax.matmul_packed"] = c{args: []ir.RExpr{x(), tvar("w", f32, 2, 3, 2)}}
	cases["relax.nn.linear"] = c{args: []ir.RExpr{x(), tvar("w", f32, 4, 3), tvar("b", f32, 4)}}
	cases["relax.permute_dims"] = c{[]ir.RExpr{tvar("x", f32, 2, 3, 4)}, map[string]any{"axes": []int64{1, 2, 0}}}
	cases["relax.reshape"] = c{args: []ir.RExpr{x(), &ir.ShapeExpr{Values: ir.Dims(3, -1)}}}
	cases["relax.flatten"] = c{args: []ir.RExpr{x()}}
	cases["relax.broadcast_to"] = c{args: []ir.RExpr{y(), &ir.ShapeExpr{Values: ir.Dims(2, 3)}}}
	cases["relax.concat"] = c{[]ir.RExpr{&ir.RTuple{Fields: []ir.RExpr{x(), tvar("z", f32, 1, 3)}}}, map[string]any{"axis": 0}}
	cases["relax.split"] = c{[]ir.RExpr{tvar("x", f32, 2, 6)}, map[string]any{"indices_or_sections": []int64{2, 5}, "axis": 1}}
	cases["relax.strided_slice"] = c{[]ir.RExpr{x()}, map[string]any{"axes": []int64{1}, "begin": []int64{-1}, "end": []int64{-4}, "strides": []int64{-2}}}
	cases["relax.take"] = c{[]ir.RExpr{x(), tvar("i", i64, 4)}, map[string]any{"axis": 1}}
	cases["relax.expand_dims"] = c{[]ir.RExpr{x()}, map[string]any{"axis": []int64{1}}}
	cases["relax.squeeze"] = c{[]ir.RExpr{tvar("x", f32, 2, 1, 3)}, nil}
	for _, name := range []string{"sum", "mean", "max", "min", "variance", "std"} {
		cases["relax."+name] = c{[]ir.RExpr{x()}, map[string]any{"axis": []int64{1}}}
	}
	cases["relax.argmax"] = c{[]ir.RExpr{x()}, map[string]any{"axis": 0, "keepdims": true}}
	cases["relax.argmin"] = c{[]ir.RExpr{x()}, nil}
	cases["relax.nn.softmax"] = c{args: []ir.RExpr{x()}}
	cases["relax.nn.log_softmax"] = c{[]ir.RExpr{x()}, map[string]any{"axis": 0}}
	cases["relax.nn.layer_norm"] = c{args: []ir.RExpr{x(), y(), y()}}
	cases["relax.nn.batch_norm"] = c{args: []ir.RExpr{tvar("x", f32, 2, 3, 2, 2), y(), y(), y(), y()}}
	cases["relax.nn.conv2d"] = c{[]ir.RExpr{tvar("x", f32, 1, 4, 5, 5), tvar("w", f32, 2, 2, 3, 3)}, map[string]any{"groups": 2, "padding": []int64{1}}}
	cases["relax.nn.max_pool2d"] = c{[]ir.RExpr{tvar("x", f32, 1, 5, 5, 2)}, map[string]any{"pool_size": []int64{2}, "layout": "NHWC", "ceil_mode": true}}
	cases["relax.nn.avg_pool2d"] = c{[]ir.RExpr{tvar("x", f32, 1, 2, 5, 5)}, map[string]any{"pool_size": []int64{3}, "padding": []int64{1}}}
	cases["relax.nn.adaptive_avg_pool2d"] = c{[]ir.RExpr{tvar("x", f32, 1, 2, 5, 5)}, map[string]any{"output_size": []int64{2}}}
	return cases
}

// TestLegalizeEveryOp legalizes a call of every operator, checks the
// output struct info against the registry's inference, verifies the
// function and runs it in the interpreter.
func TestLegalizeEveryOp(t *testing.T) {
	cases := legalizeCases()
	rng := rand.New(rand.NewPCG(20, 1))
	for _, name := range Ops() {
		t.Run(name, func(t *testing.T) {
			c, ok := cases[name]
			check.True(t, ok, "a test case for", name)
			call, err := op.Call(name, c.args, c.attr)
			check.NoError(t, err)
			r, err := LegalizeCall(call)
			check.NoError(t, err)
			check.True(t, ir.StructuralEqual(r.Out, call.Info), "output", r.Out, "matches the inference", call.Info)
			check.NoError(t, ir.Verify(r.Func))
			def, _ := op.Lookup(name)
			check.True(t, def.Legalize() != nil, "legalizer attached to the registry")
			var ins, outs []arr
			for _, a := range r.Args {
				ts := ir.StructInfoOf(a).(*ir.TensorStructInfo)
				shape, _ := ts.KnownShape()
				in := randArr(rng, ts.DType, shape...)
				if name == "relax.log" || name == "relax.sqrt" || name == "relax.rsqrt" || name == "relax.power" {
					for i := range in.data {
						in.data[i] = f32(in.data[i]*in.data[i] + 0.1)
					}
				}
				ins = append(ins, in)
			}
			infos := []ir.StructInfo{r.Out}
			if tup, ok := r.Out.(*ir.TupleStructInfo); ok {
				infos = tup.Fields
			}
			for _, si := range infos {
				ts := si.(*ir.TensorStructInfo)
				shape, _ := ts.KnownShape()
				outs = append(outs, newArr(ts.DType, shape...))
			}
			check.Equal(t, len(r.Func.Params), len(ins)+len(outs), "parameters")
			runPrimFunc(t, r.Func, ins, outs)
		})
	}
}

// TestLegalizeNumerics checks legalized functions against references on
// random inputs for a few operators end to end (the operator functions'
// own tests cover every operator).
func TestLegalizeNumerics(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 1))
	f32t := ir.Float32
	t.Run("linear", func(t *testing.T) {
		r, err := Build("nn.linear", []ir.StructInfo{ir.TensorOfShape(f32t, 3, 4), ir.TensorOfShape(f32t, 2, 4), ir.TensorOfShape(f32t, 2)}, nil)
		check.NoError(t, err)
		x, w, b := randArr(rng, f32t, 3, 4), randArr(rng, f32t, 2, 4), randArr(rng, f32t, 2)
		got := runPrimFunc(t, r.Func, []arr{x, w, b}, []arr{newArr(f32t, 3, 2)})
		want := fill(f32t, []int64{3, 2}, func(idx []int64) float64 {
			s := b.at(idx[1])
			for k := int64(0); k < 4; k++ {
				s += x.at(idx[0], k) * w.at(idx[1], k)
			}
			return s
		})
		near(t, got[0], want, 1e-5)
	})
	t.Run("conv2d_nhwc", func(t *testing.T) {
		r, err := Build("nn.conv2d", []ir.StructInfo{ir.TensorOfShape(f32t, 1, 5, 5, 2), ir.TensorOfShape(f32t, 3, 3, 2, 4)},
			map[string]any{"data_layout": "NHWC", "kernel_layout": "HWIO", "padding": []int64{1, 1}, "dilation": 2})
		check.NoError(t, err)
		x, w := randArr(rng, f32t, 1, 2, 5, 5), randArr(rng, f32t, 4, 2, 3, 3)
		want := refConv2D(x, w, [2]int64{1, 1}, [2]int64{1, 1}, [2]int64{2, 2}, [2]int64{1, 1}, 1)
		got := runPrimFunc(t, r.Func, []arr{permuteTo(x, "NCHW", "NHWC"), permuteTo(w, "OIHW", "HWIO")},
			[]arr{newArr(f32t, constShape(t, r.Out.(*ir.TensorStructInfo).Shape)...)})
		near(t, got[0], permuteTo(want, "NCHW", "NHWC"), 1e-5)
	})
	t.Run("split_tuple", func(t *testing.T) {
		r, err := Build("split", []ir.StructInfo{ir.TensorOfShape(f32t, 4, 2)}, map[string]any{"indices_or_sections": 2})
		check.NoError(t, err)
		check.Equal(t, r.Out.String(), `R.Tuple(R.Tensor((2, 2), dtype="float32"), R.Tensor((2, 2), dtype="float32"))`)
		x := randArr(rng, f32t, 4, 2)
		got := runPrimFunc(t, r.Func, []arr{x}, []arr{newArr(f32t, 2, 2), newArr(f32t, 2, 2)})
		near(t, got[0], arr{shape: []int64{2, 2}, dt: f32t, data: x.data[:4]}, 0)
		near(t, got[1], arr{shape: []int64{2, 2}, dt: f32t, data: x.data[4:]}, 0)
	})
	t.Run("power_of_constant_two", func(t *testing.T) {
		// x ** 2 with a constant 2 is x * x: the constant is no argument
		// and no pow is called; any other exponent stays a power.
		for _, e := range []float32{2, 3} {
			c, err := ir.ConstantFromBytes(f32t, nil, binary.LittleEndian.AppendUint32(nil, math.Float32bits(e)))
			check.NoError(t, err)
			call, err := op.Call("relax.power", []ir.RExpr{tvar("x", f32t, 2, 3), c}, nil)
			check.NoError(t, err)
			r, err := LegalizeCall(call)
			check.NoError(t, err)
			check.Equal(t, len(r.Args), map[float32]int{2: 1, 3: 2}[e], "arguments")
			check.Equal(t, strings.Contains(script.Print(r.Func), "T.pow"), e != 2, "pow")
			x := randArr(rng, f32t, 2, 3)
			ins := []arr{x}
			if e != 2 {
				ins = append(ins, arr{dt: f32t, data: []float64{float64(e)}})
			}
			got := runPrimFunc(t, r.Func, ins, []arr{newArr(f32t, 2, 3)})
			want := fill(f32t, []int64{2, 3}, func(idx []int64) float64 {
				return float64(f32(math.Pow(x.at(idx...), float64(e))))
			})
			near(t, got[0], want, 1e-6)
		}
	})
	t.Run("symbolic_matmul", func(t *testing.T) {
		n := ir.NewVar("n", ir.Int64)
		r, err := Build("matmul", []ir.StructInfo{ir.Tensor(f32t, n, ir.I64(3)), ir.TensorOfShape(f32t, 3, 2)}, nil)
		check.NoError(t, err)
		check.Equal(t, r.Out.String(), `R.Tensor((n, 2), dtype="float32")`)
		a, b := randArr(rng, f32t, 5, 3), randArr(rng, f32t, 3, 2)
		got := runPrimFunc(t, r.Func, []arr{a, b}, []arr{newArr(f32t, 5, 2)})
		near(t, got[0], refMatmul(a, b), 1e-5)
	})
}

// TestLegalizeSymbolicBatch legalizes operators over a symbolic batch
// dimension and runs them with a concrete one.
func TestLegalizeSymbolicBatch(t *testing.T) {
	f32 := ir.Float32
	n := ir.NewVar("n", ir.Int64)
	cases := []struct {
		op    string
		args  []ir.StructInfo
		attrs map[string]any
		out   string
	}{
		{"nn.conv2d", []ir.StructInfo{ir.Tensor(f32, n, ir.I64(2), ir.I64(5), ir.I64(5)), ir.TensorOfShape(f32, 3, 2, 3, 3)},
			map[string]any{"padding": 1}, `R.Tensor((n, 3, 5, 5), dtype="float32")`},
		{"nn.max_pool2d", []ir.StructInfo{ir.Tensor(f32, n, ir.I64(2), ir.I64(5), ir.I64(5))},
			map[string]any{"pool_size": 2, "strides": 2, "ceil_mode": true}, `R.Tensor((n, 2, 3, 3), dtype="float32")`},
		{"nn.avg_pool2d", []ir.StructInfo{ir.Tensor(f32, n, ir.I64(5), ir.I64(5), ir.I64(2))},
			map[string]any{"pool_size": 3, "padding": 1, "layout": "NHWC"}, `R.Tensor((n, 5, 5, 2), dtype="float32")`},
		{"nn.softmax", []ir.StructInfo{ir.Tensor(f32, n, ir.I64(4))}, nil, `R.Tensor((n, 4), dtype="float32")`},
		{"nn.layer_norm", []ir.StructInfo{ir.Tensor(f32, n, ir.I64(4)), ir.TensorOfShape(f32, 4), ir.TensorOfShape(f32, 4)}, nil,
			`R.Tensor((n, 4), dtype="float32")`},
		{"sum", []ir.StructInfo{ir.Tensor(f32, n, ir.I64(4))}, map[string]any{"axis": []int64{0}}, `R.Tensor((4,), dtype="float32")`},
		{"reshape", []ir.StructInfo{ir.Tensor(f32, n, ir.I64(2), ir.I64(2)), ir.ShapeOf(n, ir.I64(-1))}, nil, `R.Tensor((n, 4), dtype="float32")`},
		{"permute_dims", []ir.StructInfo{ir.Tensor(f32, n, ir.I64(3))}, nil, `R.Tensor((3, n), dtype="float32")`},
		{"nn.linear", []ir.StructInfo{ir.Tensor(f32, n, ir.I64(3)), ir.TensorOfShape(f32, 2, 3)}, nil, `R.Tensor((n, 2), dtype="float32")`},
	}
	rng := rand.New(rand.NewPCG(22, 1))
	for _, c := range cases {
		t.Run(c.op, func(t *testing.T) {
			r, err := Build(c.op, c.args, c.attrs)
			check.NoError(t, err)
			check.Equal(t, r.Out.String(), c.out)
			check.NoError(t, ir.Verify(r.Func))
			// Run with n = 2.
			concrete := func(si ir.StructInfo) []int64 {
				ts := si.(*ir.TensorStructInfo)
				shape := make([]int64, len(ts.Shape))
				for i, d := range ts.Shape {
					if v, ok := ir.ConstDim(d); ok {
						shape[i] = v
					} else {
						shape[i] = 2
					}
				}
				return shape
			}
			var ins []arr
			for _, a := range r.Args {
				ins = append(ins, randArr(rng, f32, concrete(ir.StructInfoOf(a))...))
			}
			runPrimFunc(t, r.Func, ins, []arr{newArr(f32, concrete(r.Out)...)})
		})
	}
}

func TestLegalizeNames(t *testing.T) {
	f32 := ir.Float32
	t.Run("clash_with_stage", func(t *testing.T) {
		call := op.MustCall("relax.add", []ir.RExpr{tvar("T_add", f32, 2), tvar("b", f32, 2)}, nil)
		r, err := LegalizeCall(call)
		check.NoError(t, err)
		check.Equal(t, r.Func.ParamBuffer(0).Name, "T_add_1")
		check.Equal(t, r.Func.ParamBuffer(2).Name, "T_add")
	})
	t.Run("same_var_twice", func(t *testing.T) {
		x := tvar("x", f32, 2)
		r, err := LegalizeCall(op.MustCall("relax.multiply", []ir.RExpr{x, x}, nil))
		check.NoError(t, err)
		check.Equal(t, []string{r.Func.ParamBuffer(0).Name, r.Func.ParamBuffer(1).Name}, []string{"x", "x_1"})
		check.Equal(t, len(r.Args), 2)
	})
	t.Run("tuple_var", func(t *testing.T) {
		tup := ir.NewRVar("tup", ir.Tuple(ir.TensorOfShape(f32, 2), ir.TensorOfShape(f32, 3)))
		r, err := LegalizeCall(op.MustCall("relax.concat", []ir.RExpr{tup}, nil))
		check.NoError(t, err)
		check.Equal(t, r.NameHint, "concatenate")
		check.Equal(t, len(r.Args), 2)
		g, ok := r.Args[1].(*ir.TupleGetItem)
		check.True(t, ok && g.Index == 1 && g.Tuple == tup, "second argument is tup[1]")
		check.Equal(t, r.Func.ParamBuffer(1).Name, "tup_1")
	})
	t.Run("constant_argument", func(t *testing.T) {
		k, err := ir.ConstantFromBytes(f32, []int64{2}, make([]byte, 8))
		check.NoError(t, err)
		r, err := LegalizeCall(op.MustCall("relax.add", []ir.RExpr{tvar("x", f32, 2), k}, nil))
		check.NoError(t, err)
		check.Equal(t, r.Func.ParamBuffer(1).Name, "x2")
		check.True(t, r.Args[1] == ir.RExpr(k), "the constant is passed")
	})
}

func TestLegalizeErrors(t *testing.T) {
	f32 := ir.Float32
	cases := []struct {
		name string
		call func() (*Result, error)
		want []string
	}{
		{"unknown_shape", func() (*Result, error) {
			return LegalizeCall(op.MustCall("relax.exp", []ir.RExpr{ir.NewRVar("x", ir.TensorNDim(f32, 2))}, nil))
		}, []string{"legalize: exp: argument \"x\" has unknown shape"}},
		{"unknown_dtype", func() (*Result, error) {
			return LegalizeCall(op.MustCall("relax.exp", []ir.RExpr{ir.NewRVar("x", ir.Tensor(ir.Void, ir.I64(2)))}, nil))
		}, []string{"unknown dtype"}},
		{"not_broadcast", func() (*Result, error) {
			return Build("add", []ir.StructInfo{ir.TensorOfShape(f32, 2, 3), ir.TensorOfShape(f32, 4)}, nil)
		}, []string{"legalize: add: shapes (2, 3) and (4,) do not broadcast"}},
		{"axis", func() (*Result, error) {
			return Build("sum", []ir.StructInfo{ir.TensorOfShape(f32, 2, 3)}, map[string]any{"axis": []int64{2}})
		}, []string{"sum: axis 2 out of range for a tensor of rank 2"}},
		{"reshape_size", func() (*Result, error) {
			return Build("reshape", []ir.StructInfo{ir.TensorOfShape(f32, 2, 3), ir.ShapeOf(ir.Dims(4, 2)...)}, nil)
		}, []string{"reshape: cannot reshape (2, 3) (6 elements) to (4, 2) (8 elements)"}},
		{"bad_attr", func() (*Result, error) {
			return Build("nn.softmax", []ir.StructInfo{ir.TensorOfShape(f32, 2, 3)}, map[string]any{"axes": 1})
		}, []string{`nn.softmax has no attribute "axes"`}},
		{"bad_padding", func() (*Result, error) {
			return Build("nn.conv2d", []ir.StructInfo{ir.TensorOfShape(f32, 1, 1, 4, 4), ir.TensorOfShape(f32, 1, 1, 3, 3)},
				map[string]any{"padding": []int64{1, 2, 3}})
		}, []string{"nn.conv2d: padding has 3 values, want 1, 2 or 4"}},
		{"clip_symbolic", func() (*Result, error) {
			return Build("clip", []ir.StructInfo{ir.TensorOfShape(f32, 2), &ir.PrimStructInfo{DType: f32}, &ir.PrimStructInfo{DType: f32}}, nil)
		}, []string{`clip: argument "min" must be a known scalar`}},
		{"not_a_tensor", func() (*Result, error) {
			return Build("exp", []ir.StructInfo{ir.ShapeOf(ir.Dims(2)...)}, nil)
		}, []string{"exp: argument \"x\" is R.Shape([2]), want a tensor"}},
		{"unknown_op", func() (*Result, error) { return Build("nope", nil, nil) }, []string{`unknown operator "relax.nope"`}},
		{"missing_argument", func() (*Result, error) { return Build("add", []ir.StructInfo{ir.TensorOfShape(f32, 2)}, nil) },
			[]string{"legalize: add takes 2 arguments, got 1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.call()
			check.Error(t, err, c.want...)
		})
	}
	t.Run("no_legalizer", func(t *testing.T) {
		_, err := LegalizeCall(op.MustCall("relax.shape_of", []ir.RExpr{tvar("x", f32, 2)}, nil))
		check.ErrorIs(t, err, ErrNoLegalizer)
		_, err = LegalizeCall(&ir.RCall{Op: &ir.GlobalVar{Name: "f"}})
		check.ErrorIs(t, err, ErrNoLegalizer)
	})
}

// TestCoverage lists the registry's operators without a legalization, so
// a new operator is noticed.
func TestCoverage(t *testing.T) {
	var missing []string
	for _, name := range op.Names() {
		if _, ok := legalizers[name]; !ok {
			missing = append(missing, strings.TrimPrefix(name, "relax."))
		}
	}
	check.Equal(t, strings.Join(missing, " "),
		"builtin.alloc_tensor memory.alloc_storage memory.alloc_tensor memory.kill_storage memory.kill_tensor prod shape_of "+
			"vm.alloc_storage vm.alloc_tensor vm.kill_object")
}

// TestLegalizeNoPanic feeds every legalizer malformed calls (missing and
// extra arguments, arguments of the wrong kind or rank, odd attributes):
// each gives an error or a function, never a panic.
func TestLegalizeNoPanic(t *testing.T) {
	cases := legalizeCases()
	f32 := ir.Float32
	odd := []ir.RExpr{
		ir.NewRVar("obj", ir.Object()),
		ir.NewRVar("scalar", ir.Tensor(f32)),
		tvar("big", f32, 1, 2, 1, 2, 1),
		tvar("ints", ir.Int32, 3, 1),
		tvar("empty", f32, 0, 3),
		&ir.ShapeExpr{Values: ir.Dims(-1, -1)},
		&ir.PrimValue{Value: ir.I64(3)},
		&ir.RTuple{},
		nil,
	}
	oddAttrs := []map[string]any{
		{"axis": int64(-100)}, {"axis": []any{int64(7)}}, {"axes": []any{int64(0), int64(0)}},
		{"padding": []any{int64(-1)}}, {"strides": []any{int64(0)}}, {"pool_size": []any{int64(0), int64(9)}},
		{"groups": int64(0)}, {"indices_or_sections": int64(0)}, {"indices_or_sections": []any{int64(9), int64(1)}},
		{"output_size": []any{int64(0)}}, {"data_layout": "NCHWX"}, {"layout": "XYZW"}, {"begin": []any{int64(1)}},
		{"dtype": "int8"}, {"out_dtype": "float64"}, {"epsilon": -1.0}, {"keepdims": true, "axis": nil},
	}
	try := func(t *testing.T, call *ir.RCall) {
		t.Helper()
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("panic on %s: %v", script.Print(call), r)
			}
		}()
		if r, err := LegalizeCall(call); err == nil {
			check.NoError(t, ir.Verify(r.Func))
		}
	}
	for _, name := range Ops() {
		t.Run(name, func(t *testing.T) {
			c := cases[name]
			mk := func(args []ir.RExpr, attrs map[string]any) *ir.RCall {
				return &ir.RCall{Op: &ir.Op{Name: name}, Args: args, Attrs: attrs}
			}
			for k := 0; k <= len(c.args)+1; k++ {
				args := slices.Clone(c.args)
				if k <= len(args) {
					args = args[:k]
				} else {
					args = append(args, tvar("extra", f32, 2))
				}
				try(t, mk(args, c.attr))
			}
			for i := range c.args {
				for _, o := range odd {
					args := slices.Clone(c.args)
					args[i] = o
					try(t, mk(args, c.attr))
				}
			}
			def, _ := op.Lookup(name)
			tried := 0
			for _, a := range oddAttrs {
				merged := map[string]any{}
				for k, v := range c.attr {
					merged[k] = v
				}
				known := true
				for k, v := range a {
					known = known && slices.ContainsFunc(def.Attrs, func(x op.Attr) bool { return x.Name == k })
					merged[k] = v
				}
				if known {
					tried++
					try(t, mk(c.args, merged))
				}
			}
			if len(def.Attrs) > 0 {
				check.True(t, tried > 0, "odd attributes tried")
			}
		})
	}
}
