package script

import (
	"errors"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

const rhead = "@R.function\ndef f(x: R.Tensor((2, 3), dtype=\"float32\"), y: R.Tensor((4,), dtype=\"float32\")):\n"

// TestRelaxParseErrors checks the errors for bad graph-level input: each
// names the file, line and column, and for ill-typed graphs the binding
// and the shapes.
func TestRelaxParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		want string
	}{
		{"add does not broadcast", rhead + "    z = R.add(x, y)\n    return z\n",
			"bad.py:3:9: binding \"z\": add: shapes (2, 3) and (4,) do not broadcast\n    z = R.add(x, y)\n        ^"},
		{"matmul does not match", rhead + "    with R.dataflow():\n        lv = R.matmul(x, x)\n        R.output(lv)\n    return lv\n",
			"bad.py:4:14: binding \"lv\": matmul: shapes (2, 3) and (2, 3) do not match: reduction dimensions 3 and 2 differ"},
		{"unknown operator", rhead + "    z = R.nn.reluu(x)\n    return z\n",
			"bad.py:3:9: unknown operator \"R.nn.reluu\"\n    z = R.nn.reluu(x)\n        ^"},
		{"wrong argument count", rhead + "    z = R.add(x)\n    return z\n",
			"bad.py:3:9: binding \"z\": add takes 2 arguments (x1, x2), got 1"},
		{"unknown attribute", rhead + "    z = R.sum(x, axes=[0])\n    return z\n",
			"bad.py:3:18: R.sum has no argument or attribute \"axes\""},
		{"bad attribute", rhead + "    z = R.sum(x, axis=\"a\")\n    return z\n",
			"bad.py:3:9: binding \"z\": sum: attribute \"axis\": want a list of integers, got \"a\""},
		{"axis out of range", rhead + "    z = R.sum(x, axis=[2])\n    return z\n",
			"bad.py:3:9: binding \"z\": sum: axis 2 out of range for a tensor of rank 2"},
		{"annotation mismatch", rhead + "    z: R.Tensor((3, 2), dtype=\"float32\") = R.nn.relu(x)\n    return z\n",
			"bad.py:3:8: binding \"z\": annotated R.Tensor((3, 2), dtype=\"float32\"), but the value is R.Tensor((2, 3), dtype=\"float32\")"},
		{"dataflow var outside", rhead + "    with R.dataflow():\n        a = R.exp(x)\n        b = R.exp(a)\n        R.output(b)\n    return a\n",
			"bad.py:7:12: dataflow variable \"a\" used outside its dataflow block (list it in R.output)"},
		{"undefined name", rhead + "    z = R.exp(q)\n    return z\n", "bad.py:3:15: undefined name \"q\""},
		{"no return", rhead + "    z = R.exp(x)\n", "bad.py:2:1: graph function without a return statement"},
		{"output of unbound", rhead + "    with R.dataflow():\n        a = R.exp(x)\n        R.output(b)\n    return a\n",
			"bad.py:5:18: R.output of \"b\", which the dataflow block does not bind"},
		{"unknown function", "@I.ir_module\nclass Module:\n    @R.function\n    def f(x: R.Tensor((2,), dtype=\"float32\")):\n        cls = Module\n        y = cls.g(x)\n        return y\n",
			"bad.py:6:13: the module has no function \"g\""},
		{"call_tir arity", "@I.ir_module\nclass Module:\n    @T.prim_func\n    def k(A: T.Buffer((2,), \"float32\"), B: T.Buffer((2,), \"float32\")):\n        B[0] = A[0]\n" +
			"    @R.function\n    def f(x: R.Tensor((2,), dtype=\"float32\")):\n        cls = Module\n        y = R.call_tir(cls.k, (x, x), out_sinfo=R.Tensor((2,), dtype=\"float32\"))\n        return y\n",
			"bad.py:9:13: R.call_tir of \"k\": 2 inputs and 1 outputs, the function takes 2 parameters"},
		{"impure in pure", rhead + "    s = R.vm.alloc_storage(R.shape([4]), 0, \"float32\", \"global\")\n    return x\n",
			"bad.py:2:1: function \"f\" is ill-formed: binding \"s\": impure call of \"relax.vm.alloc_storage\" in a pure function (mark it pure=False)"},
		{"missing parameter annotation", "@R.function\ndef f(x):\n    return x\n",
			"bad.py:2:7: parameter \"x\" needs a struct info annotation"},
		{"bad struct info", "@R.function\ndef f(x: R.Tensr((2,))):\n    return x\n",
			"bad.py:2:10: unsupported struct info \"R.Tensr\""},
		{"undefined symbolic", "@R.function\ndef f(x: R.Tensor((2,), dtype=\"float32\")) -> R.Tensor((m,), dtype=\"float32\"):\n    return x\n",
			"bad.py:2:56: undefined name \"m\""},
		{"tuple index", rhead + "    t = (x, y)\n    z = t[2]\n    return z\n", "bad.py:4:11: index 2 of a tuple of 2 fields"},
		{"if branches", rhead + "    c = R.const(True, \"bool\")\n    if c:\n        a = x\n    else:\n        b = x\n    return x\n",
			"bad.py:4:5: the branches of an if assign \"a\" and \"b\"; they must assign the same name"},
		{"bad pure flag", "@R.function(pure=1)\ndef f(x: R.Tensor((2,), dtype=\"float32\")):\n    return x\n", "bad.py:1:13: pure=…: want True or False"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Parse("bad.py", tc.src)
			check.True(t, m == nil, "no module on error")
			check.Error(t, err, tc.want)
			var perr *Error
			check.True(t, errors.As(err, &perr), "the error is a *script.Error")
		})
	}
}
