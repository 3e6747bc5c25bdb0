package topi

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/internal/check"
)

// refBroadcast computes fn over the numpy broadcast of a and b.
func refBroadcast(dt ir.DType, fn func(x, y float64) float64, as ...arr) arr {
	n := 0
	for _, a := range as {
		n = max(n, len(a.shape))
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = 1
		for _, a := range as {
			if j := len(a.shape) - n + i; j >= 0 && a.shape[j] != 1 {
				out[i] = a.shape[j]
			}
		}
	}
	read := func(a arr, idx []int64) float64 {
		sub := make([]int64, len(a.shape))
		for j := range sub {
			if a.shape[j] != 1 {
				sub[j] = idx[n-len(a.shape)+j]
			}
		}
		return a.at(sub...)
	}
	return fill(dt, out, func(idx []int64) float64 {
		if len(as) == 3 {
			if read(as[0], idx) != 0 {
				return read(as[1], idx)
			}
			return read(as[2], idx)
		}
		return fn(read(as[0], idx), read(as[1], idx))
	})
}

func TestBinary(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	type fn = func(a, b *te.Tensor) (*te.Tensor, error)
	cases := []struct {
		name   string
		f      fn
		ref    func(x, y float64) float64
		dt     ir.DType
		sa, sb []int64
	}{
		{"add", Add, func(x, y float64) float64 { return f32(x + y) }, ir.Float32, []int64{2, 3}, []int64{3}},
		{"add_both_ways", Add, func(x, y float64) float64 { return f32(x + y) }, ir.Float32, []int64{4, 1, 3}, []int64{2, 1}},
		{"subtract", Subtract, func(x, y float64) float64 { return f32(x - y) }, ir.Float32, []int64{1, 3}, []int64{2, 1}},
		{"multiply", Multiply, func(x, y float64) float64 { return f32(x * y) }, ir.Float32, []int64{2, 3}, []int64{2, 3}},
		{"divide", Divide, func(x, y float64) float64 { return f32(x / y) }, ir.Float32, []int64{3}, []int64{1}},
		{"divide_int", Divide, func(x, y float64) float64 {
			if y == 0 {
				return 0
			}
			return math.Trunc(x / y)
		}, ir.Int32, []int64{5}, []int64{5}},
		{"floor_divide_int", FloorDivide, func(x, y float64) float64 { return math.Floor(x / y) }, ir.Int32, []int64{5}, []int64{5}},
		{"power", Power, func(x, y float64) float64 { return f32(math.Pow(math.Abs(x), y)) }, ir.Float32, []int64{2, 2}, []int64{2}},
		{"maximum", Maximum, math.Max, ir.Float32, []int64{2, 3}, []int64{}},
		{"minimum", Minimum, math.Min, ir.Int64, []int64{3, 1}, []int64{1, 4}},
		{"greater", func(a, b *te.Tensor) (*te.Tensor, error) { return Compare("greater", a, b) }, func(x, y float64) float64 {
			if x > y {
				return 1
			}
			return 0
		}, ir.Float32, []int64{2, 3}, []int64{3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := randArr(rng, c.dt, c.sa...), randArr(rng, c.dt, c.sb...)
			if c.name == "power" {
				for i := range a.data {
					a.data[i] = math.Abs(a.data[i])
				}
			}
			if c.name == "divide_int" || c.name == "floor_divide_int" {
				for i := range b.data {
					if b.data[i] == 0 {
						b.data[i] = 3
					}
				}
			}
			A, B := placeholder("a", c.dt, c.sa...), placeholder("b", c.dt, c.sb...)
			out, err := c.f(A, B)
			check.NoError(t, err)
			want := refBroadcast(out.DType, c.ref, a, b)
			got := runTE(t, []*te.Tensor{A, B}, []*te.Tensor{out}, []arr{a, b})
			near(t, got[0], want, 1e-6)
		})
	}
}

func TestBinaryErrors(t *testing.T) {
	cases := []struct {
		name string
		a, b *te.Tensor
		want string
	}{
		{"shapes", placeholder("a", ir.Float32, 2, 3), placeholder("b", ir.Float32, 4), "add: shapes (2, 3) and (4,) do not broadcast"},
		{"dtypes", placeholder("a", ir.Float32, 2), placeholder("b", ir.Int32, 2), "add: dtypes float32 and int32 differ"},
		{"symbolic", te.Placeholder([]ir.Expr{ir.NewVar("n", ir.Int64)}, ir.Float32, "a"), placeholder("b", ir.Float32, 3), "do not broadcast"},
		{"nil", nil, placeholder("b", ir.Float32, 3), "add: input 0 is nil"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Add(c.a, c.b)
			check.Error(t, err, c.want)
		})
	}
}

func TestBinarySymbolic(t *testing.T) {
	n := ir.NewVar("n", ir.Int64)
	A := te.Placeholder([]ir.Expr{n, ir.I64(3)}, ir.Float32, "a")
	B := te.Placeholder([]ir.Expr{ir.I64(3)}, ir.Float32, "b")
	out, err := Add(A, B)
	check.NoError(t, err)
	check.True(t, ir.DimEqual(out.Shape[0], n), "output keeps n")
	rng := rand.New(rand.NewPCG(1, 2))
	a, b := randArr(rng, ir.Float32, 4, 3), randArr(rng, ir.Float32, 3)
	f, err := te.CreatePrimFunc([]*te.Tensor{A, B, out})
	check.NoError(t, err)
	got := runPrimFunc(t, f, []arr{a, b}, []arr{newArr(ir.Float32, 4, 3)})
	near(t, got[0], refBroadcast(ir.Float32, func(x, y float64) float64 { return f32(x + y) }, a, b), 1e-6)
}

func TestUnary(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 1))
	sigmoid := func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
	cases := []struct {
		op  string
		dt  ir.DType
		ref func(x float64) float64
		pos bool // positive inputs only
	}{
		{"exp", ir.Float32, math.Exp, false},
		{"log", ir.Float32, math.Log, true},
		{"sqrt", ir.Float32, math.Sqrt, true},
		{"rsqrt", ir.Float32, func(x float64) float64 { return 1 / math.Sqrt(x) }, true},
		{"tanh", ir.Float32, math.Tanh, false},
		{"sigmoid", ir.Float32, sigmoid, false},
		{"erf", ir.Float32, math.Erf, false},
		{"floor", ir.Float32, math.Floor, false},
		{"ceil", ir.Float64, math.Ceil, false},
		{"round", ir.Float32, math.RoundToEven, false},
		{"sin", ir.Float32, math.Sin, false},
		{"cos", ir.Float32, math.Cos, false},
		{"asin", ir.Float32, math.Asin, false},
		{"acos", ir.Float64, math.Acos, false},
		{"atan", ir.Float32, math.Atan, false},
		{"asinh", ir.Float32, math.Asinh, false},
		{"acosh", ir.Float32, math.Acosh, true},
		{"atanh", ir.Float32, math.Atanh, false},
		{"abs", ir.Float32, math.Abs, false},
		{"abs", ir.Int32, math.Abs, false},
		{"negative", ir.Float32, func(x float64) float64 { return -x }, false},
		{"negative", ir.Int64, func(x float64) float64 { return -x }, false},
		{"square", ir.Float32, func(x float64) float64 { return x * x }, false},
		{"relu", ir.Float32, func(x float64) float64 { return math.Max(x, 0) }, false},
		{"relu", ir.Int32, func(x float64) float64 { return math.Max(x, 0) }, false},
		{"gelu", ir.Float32, func(x float64) float64 { return x * 0.5 * (1 + math.Erf(x/math.Sqrt2)) }, false},
		{"gelu_tanh", ir.Float32, func(x float64) float64 {
			return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
		}, false},
		{"silu", ir.Float32, func(x float64) float64 { return x * sigmoid(x) }, false},
	}
	for _, c := range cases {
		t.Run(c.op+"_"+c.dt.String(), func(t *testing.T) {
			x := randArr(rng, c.dt, 2, 3, 2)
			for i := range x.data {
				switch {
				case c.op == "acosh":
					x.data[i] = math.Abs(x.data[i]) + 1 // acosh's domain
				case c.pos:
					x.data[i] = math.Abs(x.data[i]) + 0.1
				case c.op == "asin" || c.op == "acos" || c.op == "atanh":
					x.data[i] = float64(float32(math.Tanh(x.data[i]) * 0.9)) // in (-1, 1)
				}
			}
			X := placeholder("x", c.dt, 2, 3, 2)
			out, err := Unary(c.op, X)
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
			want := fill(c.dt, x.shape, func(idx []int64) float64 { return c.ref(x.at(idx...)) })
			near(t, got[0], want, 2e-6)
		})
	}
}

func TestUnaryErrors(t *testing.T) {
	_, err := Unary("exp", placeholder("x", ir.Int32, 2))
	check.Error(t, err, `exp: input "x" has dtype int32, want a float type`)
	_, err = Unary("nope", placeholder("x", ir.Float32, 2))
	check.Error(t, err, `unknown operator "nope"`)
}

func TestCastClipWhere(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 1))
	t.Run("cast", func(t *testing.T) {
		x := randArr(rng, ir.Float32, 3, 4)
		for i := range x.data {
			x.data[i] *= 5
		}
		X := placeholder("x", ir.Float32, 3, 4)
		out, err := Cast(X, ir.Int32)
		check.NoError(t, err)
		got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
		near(t, got[0], fill(ir.Int32, x.shape, func(idx []int64) float64 { return math.Trunc(x.at(idx...)) }), 0)
	})
	t.Run("clip", func(t *testing.T) {
		x := randArr(rng, ir.Float32, 7)
		X := placeholder("x", ir.Float32, 7)
		out, err := Clip(X, ir.I64(-0), ir.F64(0.5))
		check.NoError(t, err)
		got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
		near(t, got[0], fill(ir.Float32, x.shape, func(idx []int64) float64 { return math.Min(math.Max(x.at(idx...), 0), 0.5) }), 0)
	})
	t.Run("where", func(t *testing.T) {
		c, a, b := randArr(rng, ir.Bool, 2, 1), randArr(rng, ir.Float32, 3), randArr(rng, ir.Float32, 2, 3)
		C, A, B := placeholder("c", ir.Bool, 2, 1), placeholder("a", ir.Float32, 3), placeholder("b", ir.Float32, 2, 3)
		out, err := Where(C, A, B)
		check.NoError(t, err)
		got := runTE(t, []*te.Tensor{C, A, B}, []*te.Tensor{out}, []arr{c, a, b})
		near(t, got[0], refBroadcast(ir.Float32, nil, c, a, b), 0)
	})
	t.Run("broadcast_to", func(t *testing.T) {
		x := randArr(rng, ir.Float32, 3, 1)
		X := placeholder("x", ir.Float32, 3, 1)
		out, err := BroadcastTo(X, ir.Dims(2, 3, 4))
		check.NoError(t, err)
		got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
		near(t, got[0], fill(ir.Float32, []int64{2, 3, 4}, func(idx []int64) float64 { return x.at(idx[1], 0) }), 0)
		_, err = BroadcastTo(X, ir.Dims(2, 4))
		check.Error(t, err, "broadcast_to: cannot broadcast shape (3, 1) to (2, 4)")
	})
}
