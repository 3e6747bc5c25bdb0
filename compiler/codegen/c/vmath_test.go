package c_test

import (
	"math"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/script"
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
`

// TestVectorExp: a vectorized loop of exp on a CPU target computes on
// vectors (no libm call per lane) within 2 ulp of exp over the whole
// float range: +inf above 88.38, zero where exp is subnormal, NaN kept.
func TestVectorExp(t *testing.T) {
	mod, err := script.Parse("vexp.py", vexpSrc)
	check.NoError(t, err)
	src := ckernel.Source(t, mod)
	check.True(t, strings.Contains(src, "kiln_vexp_float32x16(") && !strings.Contains(src, "expf("), "exp computed on vectors:\n", src)

	xs := make([]float32, 1024)
	special := []float32{0, 1, -1, 89.4, 89.3762, 89.38, 200, -87.3, -87.4, -100, -1e30, 1e30, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1 + 1e-7}
	copy(xs, special)
	for i := len(special); i < len(xs); i++ {
		xs[i] = 1 - 90 + 180*float32(i)/float32(len(xs)) // (-89, 91) after the - 1
	}
	x, err := ndarray.FromSlice(xs, ndarray.Shape{1024})
	check.NoError(t, err)
	y, err := ndarray.FromSlice(make([]float32, 1024), ndarray.Shape{1024})
	check.NoError(t, err)
	m := ckernel.Load(t, src, "-O2", "-march=native")
	fn, err := m.GetFunction("vexp")
	check.NoError(t, err)
	_, err = fn.Call(packedfunc.Array(x), packedfunc.Array(y))
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](y)
	check.NoError(t, err)
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
}

// ulp is the spacing of float32 numbers at v.
func ulp(v float32) float64 {
	b := math.Float32bits(v)
	return math.Abs(float64(math.Float32frombits(b+1) - v))
}
