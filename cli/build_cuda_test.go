package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestBuildCUDADocuments builds TVM's documents' programs with `kiln build
// --target cuda` (the default GPU schedules, NVRTC): the tensor-expression
// document's 1024³ matmul (te.compute of A×B over a reduce axis, printed
// as TVMScript) and every module restored from TVM's documents (the
// IRModule tutorial's module and each stage of its MLP). The graph-level
// MLP with its weights is built by TestRunCUDAGraph.
func TestBuildCUDADocuments(t *testing.T) {
	if _, err := (cuda.NVRTC{}).Identity(); err != nil {
		t.Skipf("NVRTC is not installed, so nothing can be built for cuda: %v", err)
	}
	dir := t.TempDir()
	const size = 1024
	n := ir.NewIntImm(ir.Int64, size)
	A := te.Placeholder([]ir.Expr{n, n}, ir.Float32, "A")
	B := te.Placeholder([]ir.Expr{n, n}, ir.Float32, "B")
	k := te.ReduceAxis(ir.RangeFromExtent(n), "k")
	C := te.Compute([]ir.Expr{n, n}, func(i, j ir.Expr) ir.Expr { return te.Sum(ir.Mul(A.At(i, k), B.At(k, j)), k) }, "C")
	mm, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	check.NoError(t, err)
	teFile := filepath.Join(dir, "te_matmul.py")
	text := script.Print(ir.NewIRModule().With("matmul", mm.WithAttr(ir.AttrGlobalSymbol, "matmul")))
	check.NoError(t, os.WriteFile(teFile, []byte(text), 0o644))
	files := []string{teFile}
	seeds, err := filepath.Glob(filepath.Join("..", "..", "shared", "seeds", "restored", "*.py"))
	check.NoError(t, err)
	if len(seeds) == 0 {
		t.Log("TVM's example modules (shared/seeds/restored beside the repository) not present: only the matmul is built")
	}
	for _, file := range append(files, seeds...) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			art := filepath.Join(dir, strings.TrimSuffix(filepath.Base(file), ".py")+".kiln")
			_, stderr, err := runApp(t, "build", file, "--target", "cuda", "-o", art, "--no-cache")
			check.NoError(t, err, stderr)
			check.True(t, strings.Contains(stderr, "for cuda"), stderr)
			_, err = os.Stat(art)
			check.NoError(t, err)
		})
	}
}
