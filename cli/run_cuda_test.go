package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

const cudaScaleSrc = `# from tvm.script import tir as T
@T.prim_func
def scale(A: T.Buffer((1024,), "float32"), B: T.Buffer((1024,), "float32")):
    T.func_attr({"global_symbol": "scale", "tir.noalias": T.bool(True)})
    for i in range(1024):
        with T.block("B"):
            vi = T.axis.spatial(1024, i)
            B[vi] = A[vi] * T.float32(2)
`

// TestRunCUDA builds a function for cuda and runs it with kiln run: here
// (without a GPU, an error saying so; with one, the right numbers), and in
// a kiln process on the fake libcuda, whose log shows the module loaded
// once and the kernel launched with the grid and block the host function
// computed, and whose output comes back (the fake computes nothing: B
// stays as it was sent, zeros).
func TestRunCUDA(t *testing.T) {
	if _, err := (cuda.NVRTC{}).Identity(); err != nil {
		t.Skipf("NVRTC is not installed, so nothing can be built for cuda: %v", err)
	}
	dir := t.TempDir()
	art := buildCUDA(t, dir, "scale", cudaScaleSrc)
	xs := make([]float32, 1024)
	for i := range xs {
		xs[i] = float32(i)
	}
	x, err := ndarray.FromSlice(xs, ndarray.Shape{1024})
	check.NoError(t, err)
	in := filepath.Join(dir, "a.npy")
	check.NoError(t, ndarray.SaveNPY(in, x))

	out := filepath.Join(dir, "here")
	_, _, err = runApp(t, "run", art, "--func", "scale", "--input", "A="+in, "--output", out)
	if ok, _ := cuda.Available(); ok {
		check.NoError(t, err)
		b, err := ndarray.LoadNPY(filepath.Join(out, "B.npy"))
		check.NoError(t, err)
		got, err := ndarray.ToSlice[float32](b)
		check.NoError(t, err)
		check.Equal(t, got[1023], float32(2046))
	} else {
		check.Error(t, err, "the artifact is built for cuda -arch=sm_80, and this machine has no usable cuda device")
	}

	lib := fakeLibCUDA(t, dir)
	log := filepath.Join(dir, "driver.log")
	out = filepath.Join(dir, "fake-out")
	cmd := exec.Command(os.Args[0], "run", art, "--func", "scale", "--input", "A="+in, "--output", out)
	cmd.Env = fakeEnv(lib, log, 1)
	b, err := cmd.CombinedOutput()
	check.NoError(t, err, string(b))
	check.True(t, strings.Contains(string(b), "B.npy"), string(b))
	text, err := os.ReadFile(log)
	check.NoError(t, err)
	check.Equal(t, strings.Count(string(text), "load ptx"), 1, string(text))
	check.True(t, strings.Contains(string(text), "launch scale_kernel grid 4 1 1 block 256 1 1 smem 0 stream default dev 0 params "), string(text))
	res, err := ndarray.LoadNPY(filepath.Join(out, "B.npy"))
	check.NoError(t, err)
	check.Equal(t, res.Shape(), ndarray.Shape{1024})

	// --device picks the GPU: the second of two.
	check.NoError(t, os.Remove(log))
	cmd = exec.Command(os.Args[0], "run", art, "--func", "scale", "--input", "A="+in, "--output", out, "--device", "cuda:1")
	cmd.Env = fakeEnv(lib, log, 2)
	b, err = cmd.CombinedOutput()
	check.NoError(t, err, string(b))
	text, err = os.ReadFile(log)
	check.NoError(t, err)
	check.True(t, strings.Contains(string(text), "launch scale_kernel grid 4 1 1 block 256 1 1 smem 0 stream default dev 1 params "), string(text))
	for _, bad := range []struct{ device, want string }{
		{"cpu", `--device cpu: the artifact is built for "cuda -arch=sm_80", which runs on cuda devices`},
		{"cuda:1 --tracker 127.0.0.1:1", "--device cuda:1 with --tracker: a session on a device daemon runs on one cuda device, cuda:0"},
	} {
		dev, rest, _ := strings.Cut(bad.device, " ")
		args := append([]string{"run", art, "--func", "scale", "--input", "A=" + in, "--device", dev}, strings.Fields(rest)...)
		_, _, err = runApp(t, args...)
		check.Error(t, err, bad.want)
	}

	// kiln bench times it between events on the GPU.
	cmd = exec.Command(os.Args[0], "bench", art, "--func", "scale", "--input", "A="+in, "--number", "2", "--repeat", "3", "--json")
	cmd.Env = fakeEnv(lib, log, 1)
	b, err = cmd.Output()
	check.NoError(t, err, string(b))
	var tr struct {
		Results []float64 `json:"results"`
		Device  string    `json:"device"`
	}
	check.NoError(t, json.Unmarshal(b, &tr), string(b))
	check.Equal(t, tr.Device, "cuda:0")
	check.Equal(t, len(tr.Results), 3)
}

// fakeEnv is the environment of a kiln process (this test binary) on the
// fake driver in lib with n devices, logging to log: without this
// machine's CUDA_VISIBLE_DEVICES, which the fake honours as the driver does.
func fakeEnv(lib, log string, n int) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") })
	return append(env, testMainEnv+"=1", "LD_LIBRARY_PATH="+lib, fmt.Sprintf("KILN_FAKE_CUDA_DEVICES=%d", n), "KILN_FAKE_CUDA_LOG="+log)
}

// fakeLibCUDA builds the fake libcuda into dir/fake and returns that
// directory (for LD_LIBRARY_PATH), skipping without gcc.
func fakeLibCUDA(t *testing.T, dir string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc to build the fake driver")
	}
	lib := filepath.Join(dir, "fake")
	check.NoError(t, os.MkdirAll(lib, 0o755))
	build := exec.Command(gcc, "-shared", "-fPIC", "-O1", "-o", filepath.Join(lib, "libcuda.so.1"),
		filepath.Join("..", "devices", "cuda", "testdata", "fakecuda", "cuda.c"), "-lpthread")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the fake driver: %v\n%s", err, b)
	}
	return lib
}

// TestRunCUDAGraph builds the IRModule tutorial's MLP (weights bundled) for
// cuda and runs its graph function with kiln run: here (without a GPU, an
// error saying so; with one, the right numbers), and in a kiln process on
// the fake libcuda, where the VM runs on the GPU: the module is loaded
// once, every kernel of the graph is launched once, and the result comes
// back in its shape (the fake computes nothing). TestRunCUDARemote runs it
// on a device daemon.
func TestRunCUDAGraph(t *testing.T) {
	if _, err := (cuda.NVRTC{}).Identity(); err != nil {
		t.Skipf("NVRTC is not installed, so nothing can be built for cuda: %v", err)
	}
	dir := t.TempDir()
	src, pfile, xfile, checkOut := mlpFiles(t, dir)
	art := filepath.Join(dir, "mlp.kiln")
	_, _, err := runApp(t, "build", src, "--target", "cuda -arch=sm_80", "--params", pfile, "-o", art, "--no-cache")
	check.NoError(t, err)
	out := filepath.Join(dir, "here")
	_, _, err = runApp(t, "run", art, "--input", "x="+xfile, "--output", out)
	if ok, _ := cuda.Available(); ok {
		check.NoError(t, err)
		checkOut(filepath.Join(out, "output.npy"))
	} else {
		check.Error(t, err, "the artifact is built for cuda -arch=sm_80, and this machine has no usable cuda device")
	}

	lib := fakeLibCUDA(t, dir)
	log := filepath.Join(dir, "driver.log")
	out = filepath.Join(dir, "fake-out")
	cmd := exec.Command(os.Args[0], "run", art, "--input", "x="+xfile, "--output", out)
	cmd.Env = fakeEnv(lib, log, 1)
	b, err := cmd.CombinedOutput()
	check.NoError(t, err, string(b))
	text, err := os.ReadFile(log)
	check.NoError(t, err)
	check.Equal(t, strings.Count(string(text), "load ptx"), 1, string(text))
	for _, k := range []string{"fused_matmul_add_relu_kernel", "fused_matmul1_add1_kernel"} {
		check.Equal(t, strings.Count(string(text), "launch "+k+" "), 1, k, "launches in", string(text))
	}
	res, err := ndarray.LoadNPY(filepath.Join(out, "output.npy"))
	check.NoError(t, err)
	check.Equal(t, res.Shape(), ndarray.Shape{1, 10})

}

// TestCompilerTargets: a compiler node builds cpu, and cuda where NVRTC
// loads (no GPU needed); asking for cuda without NVRTC is an error.
func TestCompilerTargets(t *testing.T) {
	_, nvErr := cuda.NVRTC{}.Identity()
	got, err := compilerTargets(nil)
	check.NoError(t, err)
	if nvErr == nil {
		check.Equal(t, got, []string{"cpu", "cuda"})
	} else {
		check.Equal(t, got, []string{"cpu"})
		_, err = compilerTargets([]string{"cuda"})
		check.Error(t, err, "--target cuda: building for cuda needs NVRTC on this machine")
	}
	got, err = compilerTargets([]string{"cpu"})
	check.NoError(t, err)
	check.Equal(t, got, []string{"cpu"})
}
