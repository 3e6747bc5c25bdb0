package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// parallelKernels has two kernels whose loop runs on the pool: one reads
// far outside its input in every chunk but the first (a crash inside the
// parallel loop, on whichever pool thread claims the chunk), one doubles
// its input.
const parallelKernels = `
@I.ir_module
class Module:
    @T.prim_func
    def crash_par(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
        for i in T.parallel(64):
            with T.block("B"):
                vi = T.axis.remap("S", [i])
                B[vi] = A[vi * 268435456]

    @T.prim_func
    def double_par(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
        for i in T.parallel(64):
            with T.block("B"):
                vi = T.axis.remap("S", [i])
                B[vi] = A[vi] * T.float32(2)
`

// TestParallelKernelCrash runs, on a leased device, a kernel that crashes
// inside a parallel loop: the error names the signal and the function, and
// the device then runs a parallel kernel of the same artifact correctly.
func TestParallelKernelCrash(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "par.py")
	check.NoError(t, os.WriteFile(src, []byte(parallelKernels), 0o644))
	art := filepath.Join(dir, "par.kiln")
	_, errOut, err := runApp(t, "build", src, "-o", art)
	check.NoError(t, err, errOut)
	fl, tok := testFleet(t, dir, "tok")
	remote := []string{"--tracker", fl.tracker.Addr(), "--key", "cpu", "--token-file", tok}

	_, _, err = runApp(t, append([]string{"run", art, "--func", "crash_par", "--allow-missing", "--output", filepath.Join(dir, "crash")}, remote...)...)
	check.ErrorIs(t, err, proto.ErrCrashed)
	check.Error(t, err, "SIGSEGV", `"crash_par"`)
	t.Logf("a kernel crashing in a parallel loop: %v", err)

	xs := make([]float32, 64)
	for i := range xs {
		xs[i] = float32(i)
	}
	x, err := ndarray.FromSlice(xs, ndarray.Shape{64})
	check.NoError(t, err)
	xf := filepath.Join(dir, "x.npy")
	check.NoError(t, ndarray.SaveNPY(xf, x))
	out := filepath.Join(dir, "out")
	_, errOut, err = runApp(t, append([]string{"run", art, "--func", "double_par", "--input", "A=" + xf, "--output", out, "--wait", "1m"}, remote...)...)
	check.NoError(t, err, errOut)
	b, err := ndarray.LoadNPY(filepath.Join(out, "B.npy"))
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](b)
	check.NoError(t, err)
	for i, v := range got {
		check.Equal(t, v, 2*float32(i), "B", i)
	}
}
