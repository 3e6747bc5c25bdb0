package c_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/ckernel"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// stridedSrc is a function y[o, l] = x[o·stride·lanes + l·stride + off]
// over vectors of lanes: each vector loads x with a stride.
func stridedSrc(name string, lanes, stride, off, vectors int) string {
	n := (vectors-1)*stride*lanes + (lanes-1)*stride + off + 1 // the last element read
	return fmt.Sprintf(`
@T.prim_func
def %s(x: T.Buffer((T.int64(%d),), "float32"), y: T.Buffer((T.int64(%d),), "float32")):
    T.func_attr({"tir.noalias": T.bool(True), "kiln.vector_bytes": T.int64(64)})
    for o in range(T.int64(%d)):
        for l in T.vectorized(T.int64(%d)):
            with T.block("load"):
                vo, vl = T.axis.remap("SS", [o, l])
                y[vo * T.int64(%d) + vl] = x[vo * T.int64(%d) + vl * T.int64(%d) + T.int64(%d)]
`, name, n, vectors*lanes, vectors, lanes, lanes, stride*lanes, stride, off)
}

// TestStridedLoad checks vector loads of every other element (two loads
// and a shuffle) and of other strides (a load per lane) for 4, 8 and 16
// lanes, the input ending at the last element read.
func TestStridedLoad(t *testing.T) {
	type kase struct {
		name               string
		lanes, stride, off int
	}
	var cases []kase
	for _, lanes := range []int{4, 8, 16} {
		for _, stride := range []int{2, 3, 4} {
			for _, off := range []int{0, 1} {
				cases = append(cases, kase{fmt.Sprintf("s%d_l%d_o%d", stride, lanes, off), lanes, stride, off})
			}
		}
	}
	const vectors = 3
	var src strings.Builder
	for _, c := range cases {
		src.WriteString(stridedSrc(c.name, c.lanes, c.stride, c.off, vectors))
	}
	mod, err := script.Parse("strided.py", src.String())
	check.NoError(t, err)
	csrc := ckernel.Source(t, mod)
	for _, lanes := range []int{4, 8, 16} {
		check.True(t, strings.Contains(csrc, fmt.Sprintf("kiln_vload2_float32x%d(&x[", lanes)), "stride 2 in a shuffle of two loads:\n", csrc)
	}
	m := ckernel.Load(t, csrc, "-O2", "-march=native")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := (vectors-1)*c.stride*c.lanes + (c.lanes-1)*c.stride + c.off + 1
			xs := make([]float32, n)
			for i := range xs {
				xs[i] = float32(i) + 0.5
			}
			x, err := ndarray.FromSlice(xs, ndarray.Shape{int64(n)})
			check.NoError(t, err)
			y, err := ndarray.FromSlice(make([]float32, vectors*c.lanes), ndarray.Shape{int64(vectors * c.lanes)})
			check.NoError(t, err)
			f, err := m.GetFunction(c.name)
			check.NoError(t, err)
			_, err = f.Call(packedfunc.Array(x), packedfunc.Array(y))
			check.NoError(t, err)
			got, err := ndarray.ToSlice[float32](y)
			check.NoError(t, err)
			for o := 0; o < vectors; o++ {
				for l := 0; l < c.lanes; l++ {
					check.Equal(t, got[o*c.lanes+l], xs[o*c.stride*c.lanes+l*c.stride+c.off], "vector", o, "lane", l)
				}
			}
		})
	}
}
