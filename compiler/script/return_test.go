package script

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

// returnsSrc is TVM's test_compiled_function_with_zero_arguments module
// (tests/python/runtime/test_runtime_rpc.py) with a function that returns
// from a branch.
const returnsSrc = `@I.ir_module
class Module:
    @T.prim_func
    def func_without_arg() -> T.int64:
        return T.int64(42)

    @T.prim_func
    def func_with_arg(unused: T.int64) -> T.int64:
        return T.int64(42)

    @T.prim_func
    def sign(x: T.float64) -> T.float32:
        if x < T.float64(0):
            return T.float32(-1)
        return T.Cast("float32", x)
`

// TestPrimFuncReturns parses functions with a result (-> T.int64 and
// return), prints them back as TVM does and parses the print to the same
// functions.
func TestPrimFuncReturns(t *testing.T) {
	m, err := Parse("returns.py", returnsSrc)
	check.NoError(t, err)
	for name, want := range map[string]ir.DType{"func_without_arg": ir.Int64, "func_with_arg": ir.Int64, "sign": ir.Float32} {
		f := m.PrimFunc(name)
		check.True(t, f != nil, name)
		check.Equal(t, f.RetType, want, name)
		var rets []ir.Expr
		ir.Visit(f.Body, func(n ir.Node) bool {
			if s, ok := n.(ir.Stmt); ok {
				if v := ir.RetValue(s); v != nil {
					rets = append(rets, v)
				}
			}
			return true
		})
		check.True(t, len(rets) > 0, name+" has a return")
		for _, v := range rets {
			check.Equal(t, v.DType(), want, name)
		}
	}
	v, ok := ir.IsConstInt(ir.RetValue(m.PrimFunc("func_without_arg").Body))
	check.True(t, ok && v == 42, "func_without_arg returns 42")

	text := Print(m)
	for _, s := range []string{"def func_without_arg() -> T.int64:", "return T.int64(42)", "def sign(x: T.float64) -> T.float32:", "return T.float32(-1.0)"} {
		check.True(t, strings.Contains(text, s), "the print has "+s+":\n"+text)
	}
	again, err := Parse("printed.py", text)
	check.NoError(t, err, text)
	for name, f := range m.PrimFuncs() {
		check.True(t, ir.StructuralEqual(f, again.PrimFunc(name)), name+" prints and parses back to itself")
	}
	// A result type is part of the function: the same body without one
	// is another function.
	plain, err := Parse("plain.py", "@T.prim_func\ndef func_without_arg():\n    T.evaluate(0)\n")
	check.NoError(t, err)
	check.True(t, ir.StructuralHash(plain.PrimFunc("func_without_arg")) != ir.StructuralHash(m.PrimFunc("func_without_arg")), "RetType is hashed")
}
