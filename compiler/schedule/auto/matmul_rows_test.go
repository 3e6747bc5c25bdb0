package auto

import (
	"fmt"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

// dense4 is x[1, h, w, k] × w[k, n]: rows over two loops, one weight.
func dense4(h, w, n, k int) string {
	return fmt.Sprintf(`
@T.prim_func(private=True)
def dense4(x: T.Buffer((T.int64(1), T.int64(%[1]d), T.int64(%[2]d), T.int64(%[4]d)), "float32"), w: T.Buffer((T.int64(%[4]d), T.int64(%[3]d)), "float32"), c: T.Buffer((T.int64(1), T.int64(%[1]d), T.int64(%[2]d), T.int64(%[3]d)), "float32")):
    T.func_attr({"tir.noalias": T.bool(True)})
    for b, i, l, j, k in T.grid(T.int64(1), T.int64(%[1]d), T.int64(%[2]d), T.int64(%[3]d), T.int64(%[4]d)):
        with T.block("matmul"):
            v_b, v_i, v_l, v_j, v_k = T.axis.remap("SSSSR", [b, i, l, j, k])
            T.reads(x[v_b, v_i, v_l, v_k], w[v_k, v_j])
            T.writes(c[v_b, v_i, v_l, v_j])
            with T.init():
                c[v_b, v_i, v_l, v_j] = T.float32(0.0)
            c[v_b, v_i, v_l, v_j] = c[v_b, v_i, v_l, v_j] + x[v_b, v_i, v_l, v_k] * w[v_k, v_j]
`, h, w, n, k)
}

// TestMatmulRowsOverLoops: a dense layer over a [1, H, W, K] activation
// (ConvNeXt's Linear layers after the permute) gets the matmul rule with
// its rows over two loops: fused when the row tile is a whole row (7×7 in
// tiles of 7), else tiled along the last row loop; the result is the
// unscheduled function's, in the interpreter, lowered or not.
func TestMatmulRowsOverLoops(t *testing.T) {
	for _, sh := range [][4]int{{7, 7, 32, 16}, {14, 14, 32, 8}, {12, 10, 16, 4}, {3, 9, 48, 5}} {
		f := parseFunc(t, dense4(sh[0], sh[1], sh[2], sh[3]))
		g, rule, err := FuncRule(f, Options{ParallelFlops: 1})
		check.NoError(t, err)
		check.Equal(t, rule, RuleMatmul, sh)
		check.NoError(t, ir.Verify(g))
		sameOutput(t, f, g, 1e-5)
	}
}
