package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

func TestPrint(t *testing.T) {
	src := "../compiler/script/testdata/001_after_zero_pipeline.py"
	out, _, err := runApp(t, "print", src)
	check.NoError(t, err)
	check.True(t, strings.Contains(out, "def fused_matmul1_add1("), out)
	// The printed form is canonical: printing it again changes nothing.
	p := filepath.Join(t.TempDir(), "m.py")
	check.NoError(t, os.WriteFile(p, []byte(out), 0o644))
	again, _, err := runApp(t, "print", p)
	check.NoError(t, err)
	check.Equal(t, again, out)

	bad := filepath.Join(t.TempDir(), "bad.py")
	check.NoError(t, os.WriteFile(bad, []byte("@T.prim_func\ndef f(A: T.Buffer((4,), \"float32\")):\n    A[0] = = 1\n"), 0o644))
	_, _, err = runApp(t, "print", bad)
	check.Error(t, err, "bad.py:3:")
}
