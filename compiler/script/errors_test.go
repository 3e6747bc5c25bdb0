package script

import (
	"errors"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

const header = "@T.prim_func\ndef f(A: T.Buffer((4, 4), \"float32\")):\n"

// TestParseErrors checks that malformed input gives an *Error naming the
// file, line and column, with the line and a caret.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		want string
	}{
		{"missing colon after for", header + "    for i in T.grid(4, 4)\n        A[i, i] = T.float32(0)\n",
			"bad.py:3:26: expected \":\" after for header\n    for i in T.grid(4, 4)\n                         ^"},
		{"unclosed call", header + "    for i, j in T.grid(4, 4:\n        pass\n",
			"bad.py:3:28: expected \")\" to close the call opened at 3:23, found \":\"\n    for i, j in T.grid(4, 4:\n                           ^"},
		{"undefined name", header + "    for i in range(4):\n        A[i, j] = T.float32(0)\n",
			"bad.py:4:14: undefined name \"j\"\n    A[i, j] = T.float32(0)\n         ^"},
		{"wrong index count", header + "    for i in range(4):\n        A[i] = T.float32(0)\n",
			"bad.py:4:9: buffer \"A\" has 2 dimensions, indexed with 1\n    A[i] = T.float32(0)\n    ^"},
		{"bad indentation", header + "    for i in range(4):\n            A[i, i] = T.float32(0)\n          A[i, i] = T.float32(1)\n",
			"bad.py:5:11: unindent does not match any outer indentation level\n    A[i, i] = T.float32(1)\n    ^"},
		{"tabs that depend on the tab size", header + "    for i in range(4):\n        A[i, i] = T.float32(0)\n   \t A[i, 0] = T.float32(1)\n",
			"bad.py:5:6: inconsistent use of tabs and spaces in indentation"},
		{"missing block", header + "    for i in range(4):\n    A[0, 0] = T.float32(0)\n",
			"bad.py:4:5: expected an indented block after for header\n    A[0, 0] = T.float32(0)\n    ^"},
		{"unknown dtype", "@T.prim_func\ndef f(A: T.Buffer((4,), \"float33\")):\n    pass\n",
			"bad.py:2:25: unknown dtype \"float33\"\n    def f(A: T.Buffer((4,), \"float33\")):\n                            ^"},
		{"unknown function", header + "    A[0, 0] = T.expp(A[0, 1])\n",
			"bad.py:3:15: unknown function \"T.expp\"\n    A[0, 0] = T.expp(A[0, 1])\n              ^"},
		{"intrinsic arity", header + "    A[0, 0] = T.exp(A[0, 1], A[0, 2])\n",
			"bad.py:3:15: T.exp takes 1 arguments, got 2"},
		{"store dtype mismatch", header + "    A[0, 0] = T.int32(3) + T.int32(4)\n",
			"bad.py:3:15: dtype mismatch: 3 + 4 has dtype int32, want float32"},
		{"remap of non-loop", header + "    with T.block(\"b\"):\n        vi = T.axis.remap(\"S\", [T.int32(1)])\n        A[vi, vi] = T.float32(0)\n",
			"bad.py:4:33: T.axis.remap needs loop variables, 1 is not one"},
		{"remap count", header + "    for i in range(4):\n        with T.block(\"b\"):\n            vi, vj = T.axis.remap(\"SS\", [i])\n",
			"bad.py:5:22: T.axis.remap has 2 kinds, 1 loop variables and 2 targets"},
		{"reads outside block", header + "    T.reads(A[0, 0])\n", "bad.py:3:5: T.reads outside a block"},
		{"unterminated string", "@T.prim_func\ndef f(A: T.Buffer((4,), \"float32)):\n", "bad.py:2:25: unterminated string"},
		{"unexpected character", header + "    A[0, 0] = $\n", "bad.py:3:15: unexpected character '$'"},
		{"no decorator", "def f():\n    pass\n", "bad.py:1:1: function \"f\" needs one decorator: @T.prim_func or @R.function"},
		{"bad decorator", "@T.primfunc\ndef f():\n    pass\n", "bad.py:1:2: unsupported decorator \"T.primfunc\" (want @T.prim_func or @R.function)"},
		{"missing annotation", "@T.prim_func\ndef f(A):\n    pass\n", "bad.py:2:7: parameter \"A\" needs a type annotation"},
		{"return annotation", "@T.prim_func\ndef f() -> T.handle:\n    pass\n", "bad.py:2:12: unsupported return annotation of T.prim_func \"f\" (want a scalar type such as -> T.int64, or -> None)"},
		{"vector result", "@T.prim_func\ndef f() -> T.float32x4:\n    pass\n", "bad.py:2:12: T.prim_func \"f\" returns float32x4: a function returns a scalar integer, bool, float32 or float64"},
		{"return without result type", "@T.prim_func\ndef f():\n    return T.int64(1)\n", "bad.py:3:5: return in a T.prim_func without a result type: declare one (def f(...) -> T.int64:)"},
		{"return without value", "@T.prim_func\ndef f() -> T.int64:\n    return\n", "bad.py:3:5: return needs a value of the declared result type int64"},
		{"return of another dtype", "@T.prim_func\ndef f(x: T.int32) -> T.int64:\n    return x\n", "bad.py:3:12: return x has dtype int32, the function returns int64"},
		{"return in a loop", "@T.prim_func\ndef f() -> T.int64:\n    for i in range(4):\n        return T.int64(1)\n", "bad.py:2:1: function \"f\" is ill-formed: return T.int64(1) inside a loop: a function returns from its top level only"},
		{"duplicate function", "@T.prim_func\ndef f():\n    pass\n@T.prim_func\ndef f():\n    pass\n", "bad.py:5:1: function \"f\" defined twice"},
		{"buffer as value", header + "    A[0, 0] = A\n", "bad.py:3:15: buffer \"A\" used as a value"},
		{"int literal too big", header + "    A[0, 0] = T.float32(99999999999999999999)\n", "bad.py:3:25: integer 99999999999999999999 does not fit in 64 bits"},
		{"nested too deep", header + "    A[0, 0] = " + deep(300) + "\n", "expression nested too deeply"},
		{"reduce var in init", header + "    for i, k in T.grid(4, 4):\n        with T.block(\"b\"):\n            vi, vk = T.axis.remap(\"SR\", [i, k])\n            with T.init():\n                A[vi, vk] = T.float32(0)\n            A[vi, 0] = A[vi, 0] + T.float32(1)\n",
			"bad.py:2:1: function \"f\" is ill-formed: block \"b\": store to \"A\": reduction variable \"vk\" used outside a reduction context (the block's init)"},
		{"ir_module without decorator", "class Module:\n    pass\n", "bad.py:1:1: class \"Module\" needs the decorator @I.ir_module"},
		{"else without if", header + "    else:\n        pass\n", "bad.py:3:5: 'else' without a matching 'if'"},
		{"condition not bool", header + "    if 3:\n        pass\n", "bad.py:3:8: if condition 3 has dtype int32, want bool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Parse("bad.py", tc.src)
			check.True(t, m == nil, "no module on error")
			check.Error(t, err, tc.want)
			var perr *Error
			check.True(t, errors.As(err, &perr), "the error is a *script.Error")
			check.True(t, perr.Line > 0 && perr.Col > 0, "error has a position")
		})
	}
}

func deep(n int) string {
	s := "T.float32(0)"
	for i := 0; i < n; i++ {
		s = "(" + s + ")"
	}
	return s
}

// TestPrimFuncReturnsNone: "-> None", as TVM writes a kernel without a
// result, parses as a function without the annotation.
func TestPrimFuncReturnsNone(t *testing.T) {
	src := "@T.prim_func\ndef f(A: T.Buffer((4,), \"float32\")) -> None:\n    for i in range(4):\n        A[i] = T.float32(0)\n"
	m, err := Parse("none.py", src)
	check.NoError(t, err)
	check.True(t, m.PrimFunc("f") != nil, "f parsed")
}
