package interp

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	_ "github.com/kiln-ml/kiln/devices/cpu" // host arrays for the tests
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

func f32s(t *testing.T, a *ndarray.NDArray) []float32 {
	t.Helper()
	s, err := ndarray.ToSlice[float32](a)
	check.NoError(t, err)
	return s
}

func randArray(t *testing.T, rng *rand.Rand, shape ...int64) *ndarray.NDArray {
	t.Helper()
	data := make([]float32, ndarray.Shape(shape).NumElements())
	for i := range data {
		data[i] = float32(rng.NormFloat64())
	}
	a, err := ndarray.FromSlice(data, shape)
	check.NoError(t, err)
	return a
}

func zeros(t *testing.T, shape ...int64) *ndarray.NDArray {
	t.Helper()
	a, err := ndarray.FromSlice(make([]float32, ndarray.Shape(shape).NumElements()), shape)
	check.NoError(t, err)
	return a
}

// vecAdd builds C[i] = A[i] + B[i] over a symbolic length n.
func vecAdd() *ir.PrimFunc {
	n := ir.NewVar("n", ir.Int64)
	a := ir.NewBuffer("A", ir.Float32, []ir.Expr{n}, "")
	b := ir.NewBuffer("B", ir.Float32, []ir.Expr{n}, "")
	c := ir.NewBuffer("C", ir.Float32, []ir.Expr{n}, "")
	i := ir.NewVar("i", ir.Int64)
	body := ir.NewFor(i, ir.I64(0), n, ir.ForSerial, c.Store(ir.Add(a.Load(i), b.Load(i)), i))
	return ir.NewPrimFunc([]*ir.Buffer{a, b, c}, body, map[string]any{ir.AttrGlobalSymbol: "vecadd"})
}

func TestRunVectorAdd(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	f := vecAdd()
	for _, n := range []int64{0, 1, 7, 33} {
		a, b, c := randArray(t, rng, n), randArray(t, rng, n), zeros(t, n)
		check.NoError(t, Run(f, a, b, c))
		av, bv, cv := f32s(t, a), f32s(t, b), f32s(t, c)
		for i := range cv {
			check.Equal(t, cv[i], av[i]+bv[i], "element", i)
		}
	}
	// packedfunc values work as arguments too.
	a, b, c := randArray(t, rng, 3), randArray(t, rng, 3), zeros(t, 3)
	check.NoError(t, Run(f, packedfunc.Array(a), packedfunc.Array(b), packedfunc.Array(c)))
	check.Equal(t, f32s(t, c)[2], f32s(t, a)[2]+f32s(t, b)[2])
}

const matmulSrc = `
# from tvm.script import tir as T
@T.prim_func
def matmul(A: T.Buffer((4, 6), "float32"), B: T.Buffer((6, 5), "float32"), C: T.Buffer((4, 5), "float32")):
    T.func_attr({"global_symbol": "matmul", "tir.noalias": T.bool(True)})
    for i, j, k in T.grid(4, 5, 6):
        with T.block("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            T.reads(A[vi, vk], B[vk, vj])
            T.writes(C[vi, vj])
            with T.init():
                C[vi, vj] = T.float32(0.0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
`

func parseFunc(t *testing.T, name, src, fn string) *ir.PrimFunc {
	t.Helper()
	mod, err := script.Parse(name, src)
	check.NoError(t, err)
	f := mod.PrimFunc(fn)
	check.True(t, f != nil, "function", fn, "in", name)
	return f
}

// refMatmul computes a (n×k) @ b (k×m) in float32, accumulating in order.
func refMatmul(a, b []float32, n, k, m int) []float32 {
	out := make([]float32, n*m)
	for i := range n {
		for j := range m {
			var acc float32
			for r := range k {
				acc = acc + a[i*k+r]*b[r*m+j]
			}
			out[i*m+j] = acc
		}
	}
	return out
}

func TestRunMatmulBlocks(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	f := parseFunc(t, "matmul.py", matmulSrc, "matmul")
	a, b := randArray(t, rng, 4, 6), randArray(t, rng, 6, 5)
	c := randArray(t, rng, 4, 5) // garbage: T.init must reset it
	check.NoError(t, Run(f, a, b, c))
	want := refMatmul(f32s(t, a), f32s(t, b), 4, 6, 5)
	check.Equal(t, f32s(t, c), want)
}

// closeTo compares float32 slices with a relative tolerance.
func closeTo(t *testing.T, got, want []float32, what string) {
	t.Helper()
	check.Equal(t, len(got), len(want), what, "length")
	for i := range got {
		d := math.Abs(float64(got[i] - want[i]))
		if d > 1e-4*math.Max(1, math.Abs(float64(want[i]))) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

func TestRunSeeds(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	transpose := func(x []float32, r, c int) []float32 {
		out := make([]float32, r*c)
		for i := range r {
			for j := range c {
				out[j*r+i] = x[i*c+j]
			}
		}
		return out
	}
	addBias := func(x, b []float32) []float32 {
		out := make([]float32, len(x))
		for i := range x {
			out[i] = x[i] + b[i%len(b)]
		}
		return out
	}
	relu := func(x []float32) []float32 {
		out := make([]float32, len(x))
		for i, v := range x {
			out[i] = max(v, 0)
		}
		return out
	}
	// ref computes the last argument from the others, by function name.
	refs := map[string]func(in [][]float32, shapes []ndarray.Shape) []float32{
		"add":  func(in [][]float32, _ []ndarray.Shape) []float32 { return addBias(in[0], in[1]) },
		"add1": func(in [][]float32, _ []ndarray.Shape) []float32 { return addBias(in[0], in[1]) },
		"relu": func(in [][]float32, _ []ndarray.Shape) []float32 { return relu(in[0]) },
		"transpose": func(in [][]float32, s []ndarray.Shape) []float32 {
			return transpose(in[0], int(s[0][0]), int(s[0][1]))
		},
		"matmul": func(in [][]float32, s []ndarray.Shape) []float32 {
			return refMatmul(in[0], in[1], int(s[0][0]), int(s[0][1]), int(s[1][1]))
		},
		"fused_matmul_add_relu": func(in [][]float32, s []ndarray.Shape) []float32 {
			return relu(addBias(refMatmul(in[0], in[1], int(s[0][0]), int(s[0][1]), int(s[1][1])), in[2]))
		},
		"fused_matmul1_add1": func(in [][]float32, s []ndarray.Shape) []float32 {
			return addBias(refMatmul(in[0], in[1], int(s[0][0]), int(s[0][1]), int(s[1][1])), in[2])
		},
	}
	refs["transpose1"], refs["matmul1"] = refs["transpose"], refs["matmul"]
	for _, file := range []string{"001_after_legalize_ops.py", "001_after_zero_pipeline.py"} {
		src, err := os.ReadFile("../script/testdata/" + file)
		check.NoError(t, err)
		mod, err := script.Parse(file, string(src))
		check.NoError(t, err)
		for name, f := range mod.PrimFuncs() {
			t.Run(file+"/"+name, func(t *testing.T) {
				ref, ok := refs[name]
				check.True(t, ok, "a reference for", name)
				var args []any
				var ins [][]float32
				var shapes []ndarray.Shape
				for i := range f.Params {
					b := f.ParamBuffer(i)
					shape := make([]int64, len(b.Shape))
					for d, e := range b.Shape {
						shape[d], _ = ir.IsConstInt(e)
					}
					a := randArray(t, rng, shape...)
					args = append(args, a)
					if i < len(f.Params)-1 {
						ins = append(ins, f32s(t, a))
						shapes = append(shapes, shape)
					}
				}
				check.NoError(t, Run(f, args...))
				out := args[len(args)-1].(*ndarray.NDArray)
				closeTo(t, f32s(t, out), ref(ins, shapes), name)
			})
		}
	}
}

func TestRunLowered(t *testing.T) {
	src, err := os.ReadFile("../script/testdata/extra/lowered.py")
	check.NoError(t, err)
	f := parseFunc(t, "lowered.py", string(src), "lowered")
	a, b := zeros(t, 64), zeros(t, 64)
	check.NoError(t, Run(f, a, b))
	av, bv := f32s(t, a), f32s(t, b)
	// Replay the program in Go.
	wa, wb := make([]float32, 64), make([]float32, 64)
	for i := range 8 {
		wa[i] = 1
	}
	var tmp [8]float32
	for i := range 8 {
		tmp[i] = wa[i] * 2
	}
	wb[0] = tmp[0]
	sig := func(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }
	for i := 1; i < 9; i++ {
		for l := range 4 {
			wb[i*4+l] = wa[i*4+l] + 1
		}
		s := sig(wa[(i-1)*8+1])
		wa[(i-1)*8] = s*s + float32(math.Tanh(math.Log(float64(wb[0])))) + float32(math.Erf(1/math.Sqrt(float64(wb[1]))))
	}
	closeTo(t, av, wa, "A")
	closeTo(t, bv, wb, "B")
}

// TestRunFlatAndVector runs lowered-style IR: an Allocate'd local buffer,
// a flat view declared over a 2-D parameter, and vector loads and stores.
func TestRunFlatAndVector(t *testing.T) {
	a := ir.NewBuffer("A", ir.Float32, []ir.Expr{ir.I32(4), ir.I32(8)}, "")
	b := ir.NewBuffer("B", ir.Float32, []ir.Expr{ir.I32(4), ir.I32(8)}, "")
	af := &ir.Buffer{Name: "A_flat", DType: ir.Float32, Shape: []ir.Expr{ir.I32(32)}, Scope: "global", Data: a.Data}
	bf := &ir.Buffer{Name: "B_flat", DType: ir.Float32, Shape: []ir.Expr{ir.I32(32)}, Scope: "global", Data: b.Data}
	tmp := ir.NewBuffer("tmp", ir.Float32, []ir.Expr{ir.I32(8)}, "local")
	i := ir.NewVar("i", ir.Int32)
	ramp := ir.NewRamp(ir.Mul(i, ir.I32(8)), ir.I32(1), 8)
	var body ir.Stmt = ir.NewFor(i, ir.I32(0), ir.I32(4), ir.ForParallel, ir.Seq(
		tmp.Store(ir.Mul(af.Load(ramp), ir.NewBroadcast(ir.F32(2), 8)), ir.NewRamp(ir.I32(0), ir.I32(1), 8)),
		bf.Store(ir.Add(tmp.Load(ir.NewRamp(ir.I32(0), ir.I32(1), 8)), ir.NewBroadcast(ir.F32(1), 8)), ramp),
	))
	body = &ir.DeclBuffer{Buffer: af, Body: &ir.DeclBuffer{Buffer: bf, Body: &ir.Allocate{Buffer: tmp, Body: body}}}
	f := ir.NewPrimFunc([]*ir.Buffer{a, b}, body, nil)
	rng := rand.New(rand.NewPCG(7, 8))
	in, out := randArray(t, rng, 4, 8), zeros(t, 4, 8)
	check.NoError(t, Run(f, in, out))
	iv, ov := f32s(t, in), f32s(t, out)
	for k := range ov {
		check.Equal(t, ov[k], iv[k]*2+1, "element", k)
	}
}

func TestRunScalarsAndControl(t *testing.T) {
	// out[0] = sum of i*s for i in [0, n) where i is odd, with an assert.
	out := ir.NewBuffer("out", ir.Int64, []ir.Expr{ir.I64(1)}, "")
	n := ir.NewVar("n", ir.Int32)
	s := ir.NewVar("s", ir.Int64)
	i := ir.NewVar("i", ir.Int32)
	acc := ir.NewVar("acc", ir.Int64)
	body := ir.Seq(
		&ir.AssertStmt{Cond: ir.GE(n, ir.I32(0)), Message: "n must not be negative"},
		out.Store(ir.I64(0), ir.I64(0)),
		ir.NewFor(i, ir.I32(0), n, ir.ForSerial, &ir.IfThenElse{
			Cond: ir.EQ(ir.FloorMod(i, ir.I32(2)), ir.I32(1)),
			Then: &ir.LetStmt{Var: acc, Value: ir.Mul(ir.NewCast(ir.Int64, i), s), Body: out.Store(ir.Add(out.Load(ir.I64(0)), acc), ir.I64(0))},
		}),
	)
	f := &ir.PrimFunc{Params: []*ir.Var{ir.NewVar("out", ir.Handle), n, s}, BufferMap: map[*ir.Var]*ir.Buffer{}, Body: body, Attrs: map[string]any{}}
	f.BufferMap[f.Params[0]] = out
	arr, err := ndarray.FromSlice([]int64{99}, ndarray.Shape{1})
	check.NoError(t, err)
	check.NoError(t, Run(f, arr, 7, int64(3)))
	got, err := ndarray.ToSlice[int64](arr)
	check.NoError(t, err)
	check.Equal(t, got[0], int64((1+3+5)*3))
	err = Run(f, arr, -1, int64(3))
	check.ErrorIs(t, err, ErrAssert)
	check.Error(t, err, "n must not be negative")
	check.Error(t, Run(f, arr, 1.5, int64(3)), `parameter "n"`)
}

func TestRunErrors(t *testing.T) {
	f := vecAdd()
	mk := func(n int64) *ndarray.NDArray { return zeros(t, n) }
	i64, err := ndarray.FromSlice([]int64{1, 2}, ndarray.Shape{2})
	check.NoError(t, err)
	m := parseFunc(t, "matmul.py", matmulSrc, "matmul")

	// An off-by-one store past the end.
	x := ir.NewBuffer("X", ir.Float32, []ir.Expr{ir.I32(4)}, "")
	i := ir.NewVar("i", ir.Int32)
	oob := ir.NewPrimFunc([]*ir.Buffer{x}, ir.NewFor(i, ir.I32(0), ir.I32(4), ir.ForSerial, x.Store(ir.F32(1), ir.Add(i, ir.I32(1)))), nil)
	// A division by zero.
	divz := ir.NewPrimFunc([]*ir.Buffer{x}, x.Store(ir.NewCast(ir.Float32, ir.Div(ir.I32(1), ir.Sub(i, i))), ir.I32(0)), nil)
	divz = divz.WithBody(ir.NewFor(i, ir.I32(0), ir.I32(1), ir.ForSerial, divz.Body))

	tests := []struct {
		name string
		f    *ir.PrimFunc
		args []any
		want []string
	}{
		{"arg count", f, []any{mk(2), mk(2)}, []string{"2 arguments for 3 parameters"}},
		{"not an array", f, []any{mk(2), 3, mk(2)}, []string{`parameter "B"`, "ndarray"}},
		{"dtype", f, []any{mk(2), i64, mk(2)}, []string{`buffer "B"`, "dtype int64, want float32"}},
		{"symbolic mismatch", f, []any{mk(2), mk(3), mk(2)}, []string{`buffer "B"`, "dimension 0 must be 2"}},
		{"ndim", m, []any{mk(24), zeros(t, 6, 5), zeros(t, 4, 5)}, []string{`buffer "A"`, "1 dimensions"}},
		{"static shape", m, []any{zeros(t, 4, 7), zeros(t, 6, 5), zeros(t, 4, 5)}, []string{`buffer "A"`, "dimension 1 must be 6"}},
		{"out of bounds", oob, []any{mk(4)}, []string{`store to "X"`, "index [4] out of bounds of shape [4]"}},
		{"division by zero", divz, []any{mk(4)}, []string{"division by zero"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			check.Error(t, Run(tc.f, tc.args...), tc.want...)
		})
	}
	check.ErrorIs(t, Run(oob, mk(4)), ErrOutOfBounds)
	check.ErrorIs(t, Run(divz, mk(4)), ErrDivisionByZero)
	check.Error(t, RunOptions(f, Options{MaxSteps: 3}, mk(5), mk(5), mk(5)), "more than 3 steps")
}

func TestRunStridedView(t *testing.T) {
	// A 2×3 view with row stride 4 inside a 2×4 array, through a buffer
	// with symbolic strides.
	base, err := ndarray.FromSlice([]float32{1, 2, 3, 4, 5, 6, 7, 8}, ndarray.Shape{2, 4})
	check.NoError(t, err)
	view, err := base.StridedView(ndarray.Shape{2, 3}, ndarray.Float32, []int64{4, 1}, 4)
	check.NoError(t, err)
	s0, s1 := ir.NewVar("s0", ir.Int64), ir.NewVar("s1", ir.Int64)
	a := ir.NewBuffer("A", ir.Float32, []ir.Expr{ir.I64(2), ir.I64(3)}, "")
	a.Strides = []ir.Expr{s0, s1}
	i, j := ir.NewVar("i", ir.Int64), ir.NewVar("j", ir.Int64)
	body := ir.NewFor(i, ir.I64(0), ir.I64(2), ir.ForSerial, ir.NewFor(j, ir.I64(0), ir.I64(3), ir.ForSerial,
		a.Store(ir.Mul(a.Load(i, j), ir.F32(10)), i, j)))
	f := ir.NewPrimFunc([]*ir.Buffer{a}, body, nil)
	check.NoError(t, Run(f, view))
	check.Equal(t, f32s(t, base), []float32{1, 20, 30, 40, 5, 60, 70, 80})
	// A compact buffer refuses the strided view.
	b := ir.NewBuffer("B", ir.Float32, []ir.Expr{ir.I64(2), ir.I64(3)}, "")
	check.Error(t, Run(ir.NewPrimFunc([]*ir.Buffer{b}, &ir.Evaluate{Value: ir.I32(0)}, nil), view), "not compact")
}

func TestRunPoison(t *testing.T) {
	out := ir.NewBuffer("out", ir.Float32, []ir.Expr{ir.I32(1)}, "")
	tmp := ir.NewBuffer("tmp", ir.Float32, []ir.Expr{ir.I32(1)}, "local")
	f := ir.NewPrimFunc([]*ir.Buffer{out}, &ir.Allocate{Buffer: tmp, Body: out.Store(tmp.Load(ir.I32(0)), ir.I32(0))}, nil)
	o := zeros(t, 1)
	check.NoError(t, Run(f, o))
	check.Equal(t, f32s(t, o)[0], float32(0))
	check.NoError(t, RunOptions(f, Options{Poison: true}, o))
	check.True(t, math.IsNaN(float64(f32s(t, o)[0])), "poisoned memory reads as NaN")
}
