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

func TestPrintPasses(t *testing.T) {
	src := "../compiler/script/testdata/001_from_torch.py"
	zero, err := os.ReadFile("../compiler/script/testdata/001_after_zero_pipeline.golden")
	check.NoError(t, err)
	tests := []struct {
		name string
		args []string
		want string // the whole output, or a substring with err
		err  string
	}{
		{"pipeline zero", []string{"print", src, "--pipeline", "zero"}, string(zero), ""},
		{"passes", []string{"print", src, "--passes", "LegalizeOps, AnnotateTIROpPattern,FuseOps,FuseTIR"}, string(zero), ""},
		{"pipeline then passes", []string{"print", src, "--pipeline", "O0", "--passes", "AnnotateTIROpPattern,FuseOps,FuseTIR"}, string(zero), ""},
		{"O3 plans memory", []string{"print", src, "--pipeline", "O3"}, "R.memory.alloc_storage(R.shape([802816])", ""},
		{"unknown pipeline", []string{"print", src, "--pipeline", "O7"}, "", `unknown pipeline "O7" (pipelines: O0, O1, O2, O3, zero)`},
		{"unknown pass", []string{"print", src, "--passes", "LegalizeOps,Nope"}, "", `unknown pass "Nope" (passes: `},
		{"order", []string{"print", src, "--passes", "FuseTIR,FuseOps"}, "", "pass FuseOps must run before FuseTIR"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := runApp(t, tc.args...)
			if tc.err != "" {
				check.Error(t, err, tc.err)
				return
			}
			check.NoError(t, err)
			check.True(t, strings.Contains(out, tc.want), out)
		})
	}
}

func TestPrintDumpIR(t *testing.T) {
	out, _, err := runApp(t, "print", "testdata/vadd.py", "--dump-ir", "after:lower_blocks,after:make_packed_api")
	check.NoError(t, err)
	check.True(t, strings.Contains(out, "# after lower_blocks: vadd") && strings.Contains(out, "# after make_packed_api: vadd"), out)
	check.True(t, strings.Contains(out, "kiln_tensor_ndim"), "argument checks after make_packed_api:", out)
	_, _, err = runApp(t, "print", "testdata/vadd.py", "--dump-ir", "after:bogus")
	check.Error(t, err, `unknown pass "bogus"`, "lower_blocks")
}
