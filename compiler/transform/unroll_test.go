package transform

import (
	"fmt"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestUnrollBudget: a loop of 128 iterations is left for the C compiler
// to unroll; an unrolled loop of n iterations around it is repeated in
// the IR when the n × 128 unrolled bodies stay within maxUnrollNodes
// (n = 4), and becomes a serial loop when they would not (n = 32: a
// tuned candidate's nest like it took gcc minutes), the inner one left
// unrolled either way.
func TestUnrollBudget(t *testing.T) {
	for _, c := range []struct {
		n      int
		copies int
		outer  ir.ForKind
	}{{4, 4, ir.ForSerial}, {32, 1, ir.ForSerial}} {
		m, err := script.Parse("nest.py", fmt.Sprintf(`# from tvm.script import tir as T
@T.prim_func
def nest(A: T.Buffer((%[1]d, 128), "float32"), B: T.Buffer((%[1]d, 128), "float32")):
    for i in T.unroll(%[1]d):
        for j in T.unroll(128):
            B[i, j] = A[i, j] * T.float32(2.0) + T.float32(1.0)
`, c.n))
		check.NoError(t, err)
		out, err := Unroll(m.PrimFunc("nest"))
		check.NoError(t, err)
		var loops []*ir.For
		ir.Visit(out.Body, func(n ir.Node) bool {
			if fr, ok := n.(*ir.For); ok {
				loops = append(loops, fr)
			}
			return true
		})
		inner := 0
		for _, fr := range loops {
			if ext, _ := ir.IsConstInt(fr.Extent); ext == 128 {
				inner++
				check.Equal(t, fr.Kind, ir.ForUnrolled, c.n)
			} else {
				check.Equal(t, fr.Kind, c.outer, c.n, "the outer loop")
			}
		}
		check.Equal(t, inner, c.copies, c.n)
		check.Equal(t, len(loops)-inner, map[bool]int{true: 0, false: 1}[c.copies > 1], c.n)
	}
}
