package script

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestPrimFuncReturns parses the functions with a result (-> T.int64 and
// return) of compiler/testdata/returns.py, prints them back as TVM does and parses the print to the same
// functions.
func TestPrimFuncReturns(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "testdata", "returns.py"))
	check.NoError(t, err)
	m, err := Parse("returns.py", string(src))
	check.NoError(t, err)
	want := map[string]ir.DType{"func_without_arg": ir.Int64, "func_with_arg": ir.Int64, "total": ir.Int64, "half": ir.Float32, "positive": ir.Bool, "maybe": ir.Int64}
	check.Equal(t, m.Len(), len(want))
	for name, want := range want {
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
	for _, s := range []string{"def func_without_arg() -> T.int64:", "return T.int64(42)", "def half(x: T.float64) -> T.float32:", "def positive(x: T.int64) -> T.bool:", "return T.int64(-1)"} {
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
