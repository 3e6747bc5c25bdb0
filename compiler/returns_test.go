package compiler_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

// TestPrimFuncResults builds testdata/returns.py's functions with a
// result for the CPU, calls
// the compiled C and checks each value against the reference interpreter
// on the same arguments, and the metadata's result types.
func TestPrimFuncResults(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "returns.py"))
	check.NoError(t, err)
	m, err := script.Parse("returns.py", string(src))
	check.NoError(t, err)
	_, mod := buildCPU(t, m, compiler.BuildOptions{NoCache: true})
	meta := mod.Metadata()
	check.Equal(t, meta.FormatVersion, abi.VersionRet)
	rets := map[string]string{}
	for _, fi := range meta.Functions {
		rets[fi.Name] = fi.Ret
	}
	check.Equal(t, rets, map[string]string{"func_without_arg": "int64", "func_with_arg": "int64", "total": "int64", "half": "float32", "positive": "bool", "maybe": "int64"})

	arr := make([]int32, 16)
	sum := int64(0)
	for i := range arr {
		arr[i] = int32(3*i - 7)
		sum += 1024 * int64(arr[i])
	}
	A, err := ndarray.FromSlice(arr, ndarray.Shape{16})
	check.NoError(t, err)
	for _, tc := range []struct {
		fn   string
		args []packedfunc.Value
		want packedfunc.Value
	}{
		{"func_without_arg", nil, packedfunc.Int(42)},
		{"func_with_arg", []packedfunc.Value{packedfunc.Int(0)}, packedfunc.Int(42)},
		{"total", []packedfunc.Value{packedfunc.Array(A), packedfunc.Int(5)}, packedfunc.Int(sum + 5)},
		{"total", []packedfunc.Value{packedfunc.Array(A), packedfunc.Int(-3)}, packedfunc.Int(-1)},
		{"half", []packedfunc.Value{packedfunc.Float(3)}, packedfunc.Float(1.5)},
		{"positive", []packedfunc.Value{packedfunc.Int(7)}, packedfunc.Int(1)},
		{"positive", []packedfunc.Value{packedfunc.Int(-7)}, packedfunc.Int(0)},
		{"maybe", []packedfunc.Value{packedfunc.Int(21)}, packedfunc.Int(42)},
		{"maybe", []packedfunc.Value{packedfunc.Int(-1)}, packedfunc.Nil},
	} {
		f, err := mod.GetFunction(tc.fn)
		check.NoError(t, err, tc.fn)
		got, err := f.Call(tc.args...)
		check.NoError(t, err, tc.fn)
		check.Equal(t, got.String(), tc.want.String(), tc.fn)

		// The interpreter runs the parsed function to the same value.
		v, ok, err := interp.RunResult(m.PrimFunc(tc.fn), interp.Options{}, valuesAsAny(tc.args)...)
		check.NoError(t, err, tc.fn)
		check.Equal(t, ok, !tc.want.IsNil(), tc.fn+" returned")
		if ok {
			var iv packedfunc.Value
			if v.IsFloat() {
				iv = packedfunc.Float(v.AsFloat())
			} else {
				iv = packedfunc.Int(v.AsInt())
			}
			check.Equal(t, iv.String(), tc.want.String(), tc.fn+" in the interpreter")
		}
	}
	f, err := mod.GetFunction("func_with_arg")
	check.NoError(t, err)
	_, err = f.Call()
	check.True(t, err != nil && strings.Contains(err.Error(), "want 1"), "a missing argument is refused: %v", err)
}

// TestGraphCallsPrimFuncResult: a graph function calls a PrimFunc with a
// result directly (TVM's `cls.addone(x)` with R.Prim) and the VM passes
// the value on as the graph function's result.
func TestGraphCallsPrimFuncResult(t *testing.T) {
	m, err := buildVM(t, `@I.ir_module
class Module:
    @T.prim_func
    def addone(x: T.int64) -> T.int64:
        return x + T.int64(1)

    @R.function(pure=False)
    def main(x: R.Prim("int64")) -> R.Prim("int64"):
        cls = Module
        y = cls.addone(x)
        z = cls.addone(y)
        return z
`, vm.MemoryPooled)
	check.NoError(t, err)
	out, err := m.Invoke("main", packedfunc.Int(40))
	check.NoError(t, err)
	check.Equal(t, out.String(), packedfunc.Int(42).String())
}
