package main

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"

	cudadev "github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestCUDAArchFor: a device runs the newest architecture kiln builds for
// that is not newer than it.
func TestCUDAArchFor(t *testing.T) {
	for cc, want := range map[string]string{"8.0": "sm_80", "8.6": "sm_86", "8.7": "sm_86", "8.9": "sm_89", "9.0": "sm_90", "10.0": "sm_90", "12.0": "sm_90"} {
		got, err := cudaArchFor(cc)
		check.NoError(t, err, cc)
		check.Equal(t, got, want, cc)
	}
	_, err := cudaArchFor("7.5")
	check.Error(t, err, "compute capability 7.5 is older than sm_80")
	_, err = cudaArchFor("nine")
	check.Error(t, err, `compute capability "nine"`)
}

// TestGPUOperands: the GPU runs' float16 operands are exact and decode
// back to what was drawn; relErr compares outputs.
func TestGPUOperands(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	h := randomBytes(rng, 1000, true)
	rng = rand.New(rand.NewPCG(1, 2))
	f := randomBytes(rng, 1000, false)
	hs, fs := gpuFloats(h, true), gpuFloats(f, false)
	check.Equal(t, len(hs), 1000)
	for i := range hs {
		check.Equal(t, hs[i], fs[i], "element", i)
	}
	check.Equal(t, gpuFloats([]byte{0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00}, true), []float64{1, -2, math.Ldexp(1, -24)})
	check.Equal(t, relErr([]float64{1, 2.5}, []float64{1, 2}), 0.25)
	check.True(t, math.IsInf(relErr([]float64{math.NaN()}, []float64{1}), 1), "a NaN is an infinite error")
	check.True(t, math.IsInf(relErr([]float64{1}, []float64{1, 2}), 1), "a length that differs is an infinite error")
}

// TestGPUCheckWithoutGPU: scripts/gpu-check says that this machine has
// no usable GPU and exits 2, whether it would build here or run prebuilt
// binaries, and names what is wrong with its arguments.
func TestGPUCheckWithoutGPU(t *testing.T) {
	if ok, _ := cudadev.Available(); ok {
		t.Skip("this machine has a GPU: scripts/gpu-check runs the check")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	dir := t.TempDir()
	check.NoError(t, os.MkdirAll(dir+"/bin", 0o755))
	env := append(os.Environ(), "LD_LIBRARY_PATH=", "PATH=/usr/bin:/bin")
	for _, c := range []struct {
		args   []string
		status int
		says   string
	}{
		{nil, 2, "gpu-check: this machine has no usable NVIDIA GPU: no NVIDIA driver (libcuda.so.1 is not installed)"},
		{[]string{"--prebuilt", dir}, 2, "no usable NVIDIA GPU"},
		{[]string{"--prebuilt", dir + "/missing"}, 1, "has no bin/ (make it with scripts/gpu-check --build"},
		{[]string{"--build"}, 64, "gpu-check: --build needs a directory"},
		{[]string{"--frobnicate"}, 64, "gpu-check: unknown argument --frobnicate"},
	} {
		cmd := exec.Command("bash", append([]string{"../scripts/gpu-check"}, c.args...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		check.True(t, err != nil && errors.As(err, &ee), c.args, "did not fail:", string(out))
		check.Equal(t, ee.ExitCode(), c.status, c.args, string(out))
		check.True(t, strings.Contains(string(out), c.says), c.args, "says", string(out))
	}
	out, err := exec.Command("bash", "../scripts/gpu-check", "--help").CombinedOutput()
	check.NoError(t, err, string(out))
	check.True(t, strings.Contains(string(out), "--prebuilt DIR"), string(out))
}
