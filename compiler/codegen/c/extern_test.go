package c

import (
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/internal/check"
)

// externModule is a module whose function f calls name with call_extern
// and a string argument arg, and whose second function g it may call.
func externModule(t *testing.T, name, arg string) *ir.IRModule {
	t.Helper()
	src := `# from tvm.script import tir as T
from tvm.script import ir as I
@I.ir_module
class M:
    @T.prim_func
    def f(A: T.Buffer((4,), "float32")):
        T.func_attr({"global_symbol": "f"})
        for i in range(4):
            T.evaluate(T.call_extern("int32", "placeholder", "arg"))
            A[i] = T.float32(1)

    @T.prim_func
    def g(A: T.Buffer((4,), "float32")):
        T.func_attr({"global_symbol": "g"})
        A[0] = T.float32(2)
`
	m, err := script.Parse("m.py", src)
	check.NoError(t, err)
	l, err := transform.LowerModule(m, transform.Options{})
	check.NoError(t, err)
	// Put the names in after parsing and lowering, so that the code
	// generator's own check is what refuses them.
	out := ir.NewIRModule()
	for n, fn := range l.PrimFuncs() {
		nf := (&ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
			if c, ok := e.(*ir.Call); ok && c.Op == ir.OpCallExtern {
				if s, ok := c.Args[0].(*ir.StringImm); ok && s.Value == "placeholder" {
					return ir.NewCallExtern(c.Type, name, ir.Str(arg))
				}
			}
			return e
		}}).RewriteFunc(fn)
		out = out.With(n, nf)
	}
	return out
}

func TestCallExternNames(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{`x); }` + "\n" + `#include "/etc/passwd"` + "\n" + `int y(`, "must be a C identifier"},
		{"__asm__", "refused"},
		{"asm", "refused"},
		{"_Pragma", "refused"},
		{"system", "refused"},
		{"printf", "refused"},
		{"f\n#pragma GCC poison x", "must be a C identifier"},
		{`f"`, "must be a C identifier"},
		{"", "must be a C identifier"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := externModule(t, tc.name, `.incbin "/etc/passwd"`)
			_, _, err := Generate(m, Options{})
			check.Error(t, err, `function "f"`, "call_extern of "+strconv.Quote(tc.name), tc.want)
			if tc.want == "refused" {
				check.Error(t, err, "exp,", "kiln_tensor_data", "(f, g)")
			}
			// The IR verifier refuses what is not an identifier too.
			if tc.want != "refused" {
				for _, f := range m.PrimFuncs() {
					if err := ir.Verify(f); err != nil {
						check.Error(t, err, "must be a C identifier")
					}
				}
			}
		})
	}
	for _, name := range []string{"expf", "tanh", "g", "kiln_tensor_ndim"} {
		t.Run("allowed "+name, func(t *testing.T) {
			src, _, err := Generate(externModule(t, name, "a\"b\\c\n#include <x>??="), Options{})
			check.NoError(t, err)
			// The string is one C literal: its quote, backslash and
			// newline escaped, no line of it a preprocessor line.
			check.True(t, strings.Contains(src, name+`("a\"b\\c\n#include <x>\?\?=")`), src)
			for _, line := range strings.Split(src, "\n") {
				check.True(t, !strings.HasPrefix(strings.TrimSpace(line), "#include <x>"), line)
			}
		})
	}
}
