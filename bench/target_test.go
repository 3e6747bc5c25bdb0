package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestMatmulTargetAVX2 runs the matmul benchmark for an AVX2 target on
// any host that runs AVX2 code (an AVX-512 one included): its three
// kernels are checked against the Go reference inside the benchmark, and
// the result names the ISA of kiln's side and numpy's OpenBLAS kernels.
func TestMatmulTargetAVX2(t *testing.T) {
	if err := compiler.MustParseTarget("cpu -mcpu=haswell").RunsOnHost(); err != nil {
		t.Skipf("this host cannot run AVX2 code: %v", err)
	}
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"matmul", "--json", "--quick", "--target", "avx2"}, &out, &errOut)
	check.NoError(t, err, "stderr:", errOut.String())
	var r matmulResult
	check.NoError(t, json.Unmarshal(out.Bytes(), &r), "output:", out.String())
	check.Equal(t, r.Target, "cpu -mcpu=haswell")
	check.Equal(t, r.ISA, "AVX2")
	check.Equal(t, r.HandTile, []int64{6, 16, 8})
	check.True(t, r.Checked > 0 && r.GFLOPSScheduled > 0 && r.GFLOPSAuto > 0, "result", out.String())
	if _, set := os.LookupEnv("OPENBLAS_CORETYPE"); !set {
		check.Equal(t, r.NumpyCore, "Haswell")
	}
	if r.NoReference == "" && strings.Contains(r.Numpy, "openblas") {
		check.True(t, strings.Contains(r.Numpy, "Haswell kernels"), "numpy is", r.Numpy)
	}
}

// TestBenchTargetErrors: --target refuses what is not a CPU target this
// host runs, naming it.
func TestBenchTargetErrors(t *testing.T) {
	for _, tc := range []struct{ target, want string }{
		{"cuda", "want a cpu target"},
		{"cpu -mcpu=nosuchcore", "nosuchcore"},
		{"gpu", `unknown kind "gpu"`},
		{"cpu -mtriple=aarch64-linux-gnu", "aarch64"},
	} {
		_, err := benchTarget(tc.target)
		check.True(t, err != nil && strings.Contains(err.Error(), tc.want), tc.target, "gave", err)
	}
	if _, err := benchTarget("avx512"); err == nil {
		ti, _ := compiler.MustParseTarget("cpu -mcpu=skylake-avx512").Info()
		check.Equal(t, ti.VectorBytes, int64(64))
	}
}
