package cli

import (
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// TestRunTupleOutputs runs a graph function with two results, here and on
// a remote daemon: each result is written as out_0.npy, out_1.npy.
func TestRunTupleOutputs(t *testing.T) {
	dir := t.TempDir()
	art := filepath.Join(dir, "pair.kiln")
	_, errOut, err := runApp(t, "build", "testdata/pair.py", "-o", art)
	check.NoError(t, err, errOut)
	xa, err := ndarray.FromSlice([]float32{0, 1, 2, 3}, ndarray.Shape{4})
	check.NoError(t, err)
	in := filepath.Join(dir, "x.npy")
	check.NoError(t, ndarray.SaveNPY(in, xa))

	checkOutputs := func(outDir string) {
		t.Helper()
		for name, want := range map[string][]float32{"out_0": {0, 2, 4, 6}, "out_1": {0, 1, 4, 9}} {
			a, err := ndarray.LoadNPY(filepath.Join(outDir, name+".npy"))
			check.NoError(t, err, name)
			got, err := ndarray.ToSlice[float32](a)
			check.NoError(t, err)
			check.Equal(t, got, want, name)
		}
	}
	local := filepath.Join(dir, "local")
	_, errOut, err = runApp(t, "run", art, "--input", "x="+in, "--output", local)
	check.NoError(t, err, errOut)
	checkOutputs(local)

	fl, tokFile := testFleet(t, dir, "tok")
	remote := filepath.Join(dir, "remote")
	_, errOut, err = runApp(t, "run", art, "--tracker", fl.tracker.Addr(), "--key", "cpu", "--token-file", tokFile,
		"--input", "x="+in, "--output", remote)
	check.NoError(t, err, errOut)
	checkOutputs(remote)
}
