package script

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestMinMaxValue parses T.min_value / T.max_value (a max reduction's
// initial value, as TVM writes it) and checks the constants they become.
func TestMinMaxValue(t *testing.T) {
	src := `@T.prim_func
def rowmax(A: T.Buffer((4, 8), "float32"), B: T.Buffer((4,), "float32"), C: T.Buffer((4,), "int8")):
    for i, k in T.grid(4, 8):
        with T.block("B"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                B[vi] = T.min_value("float32")
            B[vi] = T.max(B[vi], A[vi, vk])
    for i in range(4):
        with T.block("C"):
            vi = T.axis.spatial(4, i)
            C[vi] = T.max_value("int8")
`
	m, err := Parse("rowmax.py", src)
	check.NoError(t, err)
	out := Print(m)
	check.True(t, strings.Contains(out, "-3.4028234663852886e+38"), "float32 min_value:", out)
	check.True(t, strings.Contains(out, "127"), "int8 max_value:", out)
	again, err := Parse("again.py", out)
	check.NoError(t, err)
	check.Equal(t, Print(again), out)

	for _, bad := range []string{`T.max_value("uint64")`, `T.min_value("float32", 1)`} {
		_, err := Parse("bad.py", strings.Replace(src, `T.max_value("int8")`, bad, 1))
		check.True(t, err != nil, "parsed", bad)
	}
}
