package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

func TestBuildThenRun(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "vadd.kiln")
	stdout, _, err := runApp(t, "build", "testdata/vadd.py", "-o", out, "--no-cache", "--dump-ir", "after:lower_blocks")
	check.NoError(t, err)
	check.True(t, strings.Contains(stdout, "C[i] = A[i] + B[i]"), "dump after lower_blocks:", stdout)
	a, err := artifact.Load(out)
	check.NoError(t, err)
	check.Equal(t, a.Names(), []string{"host.so"})

	x := make([]float32, 1024)
	for i := range x {
		x[i] = float32(i)
	}
	xa, err := ndarray.FromSlice(x, ndarray.Shape{1024})
	check.NoError(t, err)
	check.NoError(t, ndarray.SaveNPY(filepath.Join(dir, "x.npy"), xa))
	_, _, err = runApp(t, "run", out, "--input", "A="+filepath.Join(dir, "x.npy"), "--input", "B="+filepath.Join(dir, "x.npy"), "--output", dir)
	check.NoError(t, err)
	c, err := ndarray.LoadNPY(filepath.Join(dir, "C.npy"))
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](c)
	check.NoError(t, err)
	check.Equal(t, got[1023], float32(2046))
}

func TestBuildErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.py")
	check.NoError(t, os.WriteFile(bad, []byte("@T.prim_func\ndef f(A: T.Buffer((4,), \"float32\")):\n    A[0] = = 1\n"), 0o644))
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"syntax", []string{"build", bad}, "bad.py:3:"},
		{"missing", []string{"build", filepath.Join(dir, "none.py")}, "no such file"},
		{"target", []string{"build", "testdata/vadd.py", "--target", "tpu", "-o", filepath.Join(dir, "x.kiln")}, "tpu"},
		{"dump-ir", []string{"build", "testdata/vadd.py", "--dump-ir", "after:nope", "-o", filepath.Join(dir, "x.kiln")}, "nope"},
		{"cc fails", []string{"build", "testdata/vadd.py", "--no-cache", "--cflags", "-fno-such-flag-kiln", "-o", filepath.Join(dir, "x.kiln")}, "no-such-flag-kiln"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runApp(t, tc.args...)
			check.Error(t, err, tc.want)
		})
	}
}
