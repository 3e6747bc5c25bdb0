package schedule

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/compiler/codegen/c"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/toolchain"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// runCompiled lowers f, generates C, compiles it with the host's C
// compiler and runs it on runFunc's inputs, returning what runFunc
// returns. It skips the test when the host has no C compiler.
func runCompiled(t *testing.T, f *ir.PrimFunc, sizes map[string]int64) map[string][]float64 {
	t.Helper()
	ctx := context.Background()
	tc, err := toolchain.Find(ctx, toolchain.Options{Flags: []string{"-O1", "-Wall", "-Werror", "-Wno-unused-variable", "-Wno-unused-function"}})
	if err != nil {
		t.Skip("no C compiler:", err)
	}
	f = f.WithAttr(ir.AttrGlobalSymbol, "kernel")
	l, err := transform.LowerModule(ir.NewIRModule().With("kernel", f), transform.Options{Verify: true})
	check.NoError(t, err)
	text, _, err := c.Generate(l, c.Options{})
	check.NoError(t, err)
	so := filepath.Join(t.TempDir(), "k.so")
	check.NoError(t, tc.BuildShared(ctx, []toolchain.Source{{Name: "k.c", Text: text}}, so, ""), "compiling the generated C:\n", text)
	mod, err := cpu.LoadModule(so)
	check.NoError(t, err)
	defer mod.Close()
	fn, err := mod.GetFunction("kernel")
	check.NoError(t, err)
	args, arrays := inputs(t, f, sizes)
	vals := make([]packedfunc.Value, len(args))
	for i, a := range args {
		vals[i] = packedfunc.Array(a.(*ndarray.NDArray))
	}
	_, err = fn.Call(vals...)
	check.NoError(t, err)
	return contents(t, arrays)
}
