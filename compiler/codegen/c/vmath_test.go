package c_test

import (
	"math"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/ckernel"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

const vexpSrc = `
@T.prim_func
def vexp(x: T.Buffer((T.int64(1024),), "float32"), y: T.Buffer((T.int64(1024),), "float32")):
    T.func_attr({"tir.noalias": T.bool(True), "kiln.vector_bytes": T.int64(64)})
    for i in T.vectorized(T.int64(1024)):
        with T.block("exp"):
            v = T.axis.spatial(T.int64(1024), i)
            y[v] = T.exp(x[v] - T.float32(1.0))

@T.prim_func
def verf(x: T.Buffer((T.int64(1024),), "float32"), y: T.Buffer((T.int64(1024),), "float32")):
    T.func_attr({"tir.noalias": T.bool(True), "kiln.vector_bytes": T.int64(64)})
    for i in T.vectorized(T.int64(1024)):
        with T.block("erf"):
            v = T.axis.spatial(T.int64(1024), i)
            y[v] = T.erf(x[v] - T.float32(1.0))

@T.prim_func
def vsigmoid(x: T.Buffer((T.int64(1024),), "float32"), y: T.Buffer((T.int64(1024),), "float32")):
    T.func_attr({"tir.noalias": T.bool(True), "kiln.vector_bytes": T.int64(64)})
    for i in T.vectorized(T.int64(1024)):
        with T.block("sigmoid"):
            v = T.axis.spatial(T.int64(1024), i)
            y[v] = (x[v] - T.float32(1.0)) * T.sigmoid(x[v] - T.float32(1.0))
`

// TestVectorExp: vectorized loops of exp, erf and sigmoid on a CPU target
// compute on vectors (no libm call per lane): exp within 2 ulp of exp over
// the whole float range (+inf above 88.38, zero where exp is subnormal),
// erf within 4.1e-7 relative of erf, SiLU (x·sigmoid(x)) within 4 ulp of
// x/(1+e^-x) where that is not subnormal, NaN kept by all.
func TestVectorExp(t *testing.T) {
	mod, err := script.Parse("vexp.py", vexpSrc)
	check.NoError(t, err)
	src := ckernel.Source(t, mod)
	check.True(t, strings.Contains(src, "kiln_vexp_float32x16(") && !strings.Contains(src, "expf("), "exp computed on vectors:\n", src)
	check.True(t, strings.Contains(src, "kiln_verf_float32x16(") && !strings.Contains(src, "erff("), "erf computed on vectors:\n", src)
	check.True(t, strings.Contains(src, "kiln_vsigmoid_float32x16("), "sigmoid computed on vectors:\n", src)

	m := ckernel.Load(t, src, "-O2", "-march=native")
	special := []float32{0, 1, -1, 89.4, 89.3762, 89.38, 200, -87.3, -87.4, -100, -1e30, 1e30, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1 + 1e-7, 1 + 1e-20}
	xs, got := runVectorMath(t, m, "vexp", special, -89, 91)
	for i, v := range xs {
		a := float32(v - 1)
		want := float32(math.Exp(float64(a)))
		g := got[i]
		switch {
		case math.IsNaN(float64(want)):
			check.True(t, math.IsNaN(float64(g)), "exp(", a, ") =", g, "want NaN")
		case a < -88.3762626647949:
			check.Equal(t, g, float32(0), "exp(", a, ")")
		case math.IsInf(float64(want), 1) || a > 88.3762626647949:
			check.True(t, math.IsInf(float64(g), 1) || math.Abs(float64(g-want)) <= 2*ulp(want), "exp(", a, ") =", g, "want", want)
		default:
			check.True(t, math.Abs(float64(g-want)) <= 2*ulp(want), "exp(", a, ") =", g, "want", want)
		}
	}
	xs, got = runVectorMath(t, m, "verf", special, -6, 6)
	for i, v := range xs {
		a := float64(v - 1)
		want := math.Erf(a)
		g := float64(got[i])
		if math.IsNaN(want) {
			check.True(t, math.IsNaN(g), "erf(", a, ") =", g, "want NaN")
			continue
		}
		check.True(t, math.Abs(g-want) <= 4.1e-7*math.Max(math.Abs(want), 1e-30) || math.Abs(g-want) <= 1e-44, "erf(", a, ") =", g, "want", want)
	}
	xs, got = runVectorMath(t, m, "vsigmoid", special, -100, 100)
	for i, v := range xs {
		a := float64(v - 1)
		want := float32(a / (1 + math.Exp(-a)))
		g := got[i]
		switch {
		case math.IsNaN(a):
			check.True(t, math.IsNaN(float64(g)), "silu(", a, ") =", g, "want NaN")
		case math.IsInf(a, 1):
			check.True(t, math.IsInf(float64(g), 1), "silu(", a, ") =", g, "want +Inf")
		case math.IsInf(a, -1):
			check.True(t, math.IsNaN(float64(g)), "silu(", a, ") =", g, "want NaN (-Inf × 0)")
		case a < -88.3762626647949 || math.Abs(float64(want)) < 1.2e-38:
			// e^-x overflows (the gate is 0, as x·e^x < 1e-35 there)
			// or the product is subnormal.
			check.True(t, math.Abs(float64(g-want)) <= 1e-35, "silu(", a, ") =", g, "want", want)
		default:
			check.True(t, math.Abs(float64(g-want)) <= 4*ulp(want), "silu(", a, ") =", g, "want", want)
		}
	}
}

// runVectorMath calls fn on the special values then a sweep of (lo, hi)
// (plus 1, which the functions subtract) and returns its inputs and
// outputs.
func runVectorMath(t *testing.T, m *cpu.Module, fn string, special []float32, lo, hi float32) (xs, got []float32) {
	t.Helper()
	xs = make([]float32, 1024)
	copy(xs, special)
	for i := len(special); i < len(xs); i++ {
		xs[i] = 1 + lo + (hi-lo)*float32(i)/float32(len(xs))
	}
	x, err := ndarray.FromSlice(xs, ndarray.Shape{1024})
	check.NoError(t, err)
	y, err := ndarray.FromSlice(make([]float32, 1024), ndarray.Shape{1024})
	check.NoError(t, err)
	f, err := m.GetFunction(fn)
	check.NoError(t, err)
	_, err = f.Call(packedfunc.Array(x), packedfunc.Array(y))
	check.NoError(t, err)
	got, err = ndarray.ToSlice[float32](y)
	check.NoError(t, err)
	return xs, got
}

// ulp is the spacing of float32 numbers at v.
func ulp(v float32) float64 {
	b := math.Float32bits(v)
	return math.Abs(float64(math.Float32frombits(b+1) - v))
}
