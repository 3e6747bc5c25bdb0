package transform

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

func parseFile(t *testing.T, path string) *ir.IRModule {
	t.Helper()
	src, err := os.ReadFile(path)
	check.NoError(t, err)
	m, err := script.Parse(filepath.Base(path), string(src))
	check.NoError(t, err)
	return m
}

func seed(t *testing.T, name string) *ir.IRModule {
	return parseFile(t, filepath.Join("..", "..", "script", "testdata", name))
}

func runVerified(t *testing.T, m *ir.IRModule, names ...string) *ir.IRModule {
	t.Helper()
	ps, err := Passes(names)
	check.NoError(t, err)
	out, err := RunPasses(m, ps, Options{Verify: true})
	check.NoError(t, err)
	return out
}

func TestSeed001Legalize(t *testing.T) {
	want := seed(t, "001_after_legalize_ops.py")
	got := runVerified(t, seed(t, "001_from_torch.py"), "LegalizeOps")
	check.Equal(t, script.Print(got), script.Print(want))
	check.True(t, ir.StructuralEqual(got, want))
}

func TestSeed001Zero(t *testing.T) {
	want := seed(t, "001_after_zero_pipeline.py")
	got := runVerified(t, seed(t, "001_after_legalize_ops.py"), "AnnotateTIROpPattern", "FoldConstant", "FuseOps", "FuseTIR")
	check.Equal(t, script.Print(got), script.Print(want))
	check.True(t, ir.StructuralEqual(got, want))
}
