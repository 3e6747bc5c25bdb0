package transform

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// layerNormModule is main(x, w, b) = the layer norm of x over axes
// written out as PyTorch exports it (mean, subtract, power, mean, add ε,
// sqrt, divide), times w plus b; body replaces the bindings when not
// empty.
func layerNormModule(t *testing.T, xs, ws, axes, body string) *ir.IRModule {
	t.Helper()
	if body == "" {
		body = fmt.Sprintf(`            m = R.mean(x, axis=%[1]s, keepdims=True)
            d = R.subtract(x, m)
            p = R.power(d, R.const(2.0, "float32"))
            v = R.mean(p, axis=%[1]s, keepdims=True)
            a = R.add(v, R.const(1e-06, "float32"))
            s = R.sqrt(a)
            n = R.divide(d, s)
            nw = R.multiply(n, w)
            y = R.add(nw, b)`, axes)
	}
	src := fmt.Sprintf(`# from tvm.script import ir as I
# from tvm.script import relax as R
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor(%[1]s, dtype="float32"), w: R.Tensor(%[2]s, dtype="float32"), b: R.Tensor(%[2]s, dtype="float32")) -> R.Tensor(%[1]s, dtype="float32"):
        with R.dataflow():
%[3]s
            R.output(y)
        return y
`, xs, ws, body)
	m, err := script.Parse("layer_norm.py", src)
	check.NoError(t, err)
	return m
}

// TestFoldLayerNorm checks that written-out layer norms over the last
// axis and over the last two (odd sizes), with the variance as a power
// or a product and the division as a multiply by rsqrt, become one
// R.nn.layer_norm with no mean left, computing what the written-out
// module computes; and that a norm whose intermediate is also a result,
// or whose two means differ in axes, is left as it is.
func TestFoldLayerNorm(t *testing.T) {
	const squared = `            m = R.mean(x, axis=[-1], keepdims=True)
            d = R.subtract(x, m)
            p = R.multiply(d, d)
            v = R.mean(p, axis=[-1], keepdims=True)
            a = R.add(R.const(1e-05, "float32"), v)
            s = R.rsqrt(a)
            n = R.multiply(s, d)
            nw = R.multiply(n, w)
            y = R.add(nw, b)`
	tests := []struct {
		name, x, w, axes, body string
		folds                  bool
	}{
		{name: "last axis", x: "(1, 7, 5, 19)", w: "(19,)", axes: "[-1]", folds: true},
		{name: "last two axes", x: "(3, 5, 7)", w: "(5, 7)", axes: "[1, 2]", folds: true},
		{name: "product and rsqrt", x: "(2, 33)", w: "(33,)", body: squared, folds: true},
		{name: "mean also a result", x: "(2, 9)", w: "(9,)", body: `            m = R.mean(x, axis=[-1], keepdims=True)
            d = R.subtract(x, m)
            p = R.power(d, R.const(2.0, "float32"))
            v = R.mean(p, axis=[-1], keepdims=True)
            a = R.add(v, R.const(1e-06, "float32"))
            s = R.sqrt(a)
            n = R.divide(d, s)
            nw = R.multiply(n, w)
            y0 = R.add(nw, b)
            y = R.add(y0, m)`},
		{name: "means over other axes", x: "(4, 6)", w: "(4, 6)", body: `            m = R.mean(x, axis=[-1], keepdims=True)
            d = R.subtract(x, m)
            p = R.power(d, R.const(2.0, "float32"))
            v = R.mean(p, axis=[0, 1], keepdims=True)
            a = R.add(v, R.const(1e-06, "float32"))
            s = R.sqrt(a)
            n = R.divide(d, s)
            nw = R.multiply(n, w)
            y = R.add(nw, b)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := layerNormModule(t, tc.x, tc.w, tc.axes, tc.body)
			out := runVerified(t, in, "FoldLayerNorm")
			text := script.Print(out)
			if tc.folds {
				check.Equal(t, strings.Count(text, "R.nn.layer_norm("), 1, "layer norms in\n%s", text)
				check.True(t, !strings.Contains(text, "R.mean("), "a mean is left in\n%s", text)
			} else {
				check.Equal(t, text, script.Print(in), "the module changed")
			}
			inputs := randomInputs(t, in)
			sameResults(t, runMain(t, runVerified(t, out, "LegalizeOps"), inputs), runMain(t, runVerified(t, in, "LegalizeOps"), inputs))
		})
	}
}
