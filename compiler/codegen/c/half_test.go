package c_test

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/ckernel"
)

const halfScaleSrc = `
@T.prim_func
def hscale(x: T.Buffer((T.int64(64),), "float16"), s: T.Buffer((T.int64(1),), "float16"), y: T.Buffer((T.int64(64),), "float16")):
    T.func_attr({"tir.noalias": T.bool(True), "kiln.vector_bytes": T.int64(32)})
    for i in T.vectorized(T.int64(64)):
        with T.block("scale"):
            v = T.axis.spatial(T.int64(64), i)
            y[v] = x[v] * s[T.int64(0)] + s[T.int64(0)]
`

// TestHalfBroadcastOnAVX2: a float16 scalar beside a vector of float16 is
// broadcast explicitly, so that the C compiles for a CPU without
// half-precision arithmetic (Haswell: GCC computes the scalar in float
// and refuses to truncate it into the vector implicitly).
func TestHalfBroadcastOnAVX2(t *testing.T) {
	mod, err := script.Parse("hscale.py", halfScaleSrc)
	check.NoError(t, err)
	src := ckernel.Source(t, mod)
	check.True(t, strings.Contains(src, "kiln_bcast_float16x16("), "the scalar broadcast explicitly:\n", src)
	ckernel.Load(t, src, "-O2", "-march=haswell")
}
