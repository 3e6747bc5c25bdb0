package cuda_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// hostModuleSrc has a function the default GPU schedule binds (scale, a
// grid of 4 blocks), one over a symbolic length (its grid is computed at
// each call) and one with a shared-memory buffer (static shared memory:
// the launch asks for no dynamic shared memory), and one with 64 KiB of
// dynamic shared memory (shared.dyn: past 48 KiB, so the kernel opts in
// when the module loads, and each launch asks for it).
const hostModuleSrc = `# from tvm.script import ir as I
# from tvm.script import tir as T
@I.ir_module
class Module:
    @T.prim_func
    def scale(A: T.Buffer((1024,), "float32"), B: T.Buffer((1024,), "float32")):
        T.func_attr({"global_symbol": "scale", "tir.noalias": T.bool(True)})
        for i in range(1024):
            with T.block("B"):
                vi = T.axis.spatial(1024, i)
                B[vi] = A[vi] * T.float32(2)

    @T.prim_func
    def vadd(a: T.handle, b: T.handle, c: T.handle):
        T.func_attr({"global_symbol": "vadd", "tir.noalias": T.bool(True)})
        n = T.int32()
        A = T.match_buffer(a, (n,), "float32")
        B = T.match_buffer(b, (n,), "float32")
        C = T.match_buffer(c, (n,), "float32")
        for i in range(n):
            with T.block("C"):
                vi = T.axis.spatial(n, i)
                C[vi] = A[vi] + B[vi]

    @T.prim_func
    def reverse(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
        T.func_attr({"global_symbol": "reverse", "tir.noalias": T.bool(True)})
        S = T.alloc_buffer((64,), scope="shared")
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.block("S"):
                vi = T.axis.spatial(64, tx)
                S[vi] = A[vi]
            with T.block("B"):
                vi = T.axis.spatial(64, tx)
                B[vi] = S[vi]

    @T.prim_func
    def dyn(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
        T.func_attr({"global_symbol": "dyn", "tir.noalias": T.bool(True)})
        S = T.alloc_buffer((16384,), scope="shared.dyn")
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            for j in range(256):
                with T.block("S"):
                    vi = T.axis.spatial(16384, tx * 256 + j)
                    S[vi] = A[vi % 64]
            with T.block("B"):
                vi = T.axis.spatial(64, tx)
                B[vi] = S[vi * 256]
`

// buildHostModule builds hostModuleSrc for sm_80 with this machine's NVRTC,
// skipping when there is none.
func buildHostModule(t *testing.T) *artifact.Artifact {
	t.Helper()
	if _, err := (cuda.NVRTC{}).Identity(); err != nil {
		t.Skipf("NVRTC is not installed, so no cuda artifact can be built here: %v", err)
	}
	mod, err := script.Parse("host.py", hostModuleSrc)
	check.NoError(t, err)
	a, err := compiler.Build(context.Background(), mod, compiler.MustParseTarget("cuda -arch=sm_80"), compiler.BuildOptions{NoCache: true, CUDA: cuda.NVRTC{}})
	check.NoError(t, err)
	return a
}

// TestHostModuleOnFakeDriver builds a cuda artifact with the real NVRTC,
// then loads and calls it in a child process on the fake driver, which
// logs every module load, function lookup and launch: the test checks the
// grid and block of each launch (computed by the host function, from n for
// vadd), no dynamic shared memory, the default stream, the device pointers
// and scalars passed, one module load for many calls, and the errors of a
// failed launch, of arrays on the wrong device and of a closed module.
func TestHostModuleOnFakeDriver(t *testing.T) {
	if os.Getenv("KILN_FAKE_CUDA") != "" {
		t.Skip("already running on the fake driver")
	}
	if testing.Short() {
		t.Skip("builds C libraries and runs a child process")
	}
	a := buildHostModule(t)
	dir := buildFakeDriver(t)
	art := filepath.Join(dir, "host.kiln")
	check.NoError(t, a.Save(art))
	log := filepath.Join(dir, "driver.log")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHostModuleChild$", "-test.v", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(),
		"LD_LIBRARY_PATH="+dir+string(os.PathListSeparator)+os.Getenv("LD_LIBRARY_PATH"),
		"KILN_FAKE_CUDA="+dir, "KILN_FAKE_CUDA_DEVICES=2",
		"KILN_CUDA_TEST_ARTIFACT="+art, "KILN_FAKE_CUDA_LOG="+log)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child test failed: %v\n%s", err, out)
	}
	check.True(t, strings.Contains(string(out), "--- PASS: TestHostModuleChild "), "the child test did not pass:\n", string(out))
}

// TestHostModuleChild is the child of TestHostModuleOnFakeDriver.
func TestHostModuleChild(t *testing.T) {
	path := os.Getenv("KILN_CUDA_TEST_ARTIFACT")
	if path == "" || os.Getenv("KILN_FAKE_CUDA") == "" {
		t.Skip("runs as the child of TestHostModuleOnFakeDriver")
	}
	needGPU(t)
	logPath := os.Getenv("KILN_FAKE_CUDA_LOG")
	a, err := artifact.Load(path)
	check.NoError(t, err)
	m, err := cuda.LoadArtifact(gpu0, a, t.TempDir())
	check.NoError(t, err)
	check.Equal(t, m.Type(), "cuda")
	check.Equal(t, m.Image(), "PTX for sm_80") // the fake device is sm_90; the artifact has an sm_80 cubin
	check.Equal(t, len(m.DeviceMetadata().Kernels), 4)

	array := func(n int64) *ndarray.NDArray {
		x, err := ndarray.Empty(ndarray.Shape{n}, ndarray.Float32, gpu0)
		check.NoError(t, err)
		t.Cleanup(func() { _ = x.Release() })
		return x
	}
	call := func(name string, args ...*ndarray.NDArray) error {
		f, err := m.GetFunction(name)
		check.NoError(t, err)
		vals := make([]packedfunc.Value, len(args))
		for i, x := range args {
			vals[i] = packedfunc.Array(x)
		}
		_, err = f.Call(vals...)
		return err
	}
	hex := func(xs ...*ndarray.NDArray) string {
		var s []string
		for _, x := range xs {
			s = append(s, fmt.Sprintf("%#x", x.Data()))
		}
		return strings.Join(s, " ")
	}
	A, B := array(1024), array(1024)
	check.NoError(t, call("scale", A, B))
	check.NoError(t, call("scale", B, A))
	x, y, z := array(1000), array(1000), array(1000)
	check.NoError(t, call("vadd", x, y, z))
	S, R := array(64), array(64)
	check.NoError(t, call("reverse", S, R))
	check.NoError(t, call("dyn", S, R))

	text, err := os.ReadFile(logPath)
	check.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(text)), "\n")
	var launches []string
	loads := 0
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "launch "):
			launches = append(launches, l)
		case strings.HasPrefix(l, "load ptx"):
			loads++
		}
	}
	check.Equal(t, loads, 1, "module loads:\n", string(text))
	check.True(t, strings.Contains(string(text), "function vadd_kernel params 4\n"), "vadd_kernel's lookup (3 pointers and n):\n", string(text))
	check.Equal(t, launches, []string{
		"launch scale_kernel grid 4 1 1 block 256 1 1 smem 0 stream default dev 0 params " + hex(A, B),
		"launch scale_kernel grid 4 1 1 block 256 1 1 smem 0 stream default dev 0 params " + hex(B, A),
		"launch vadd_kernel grid 4 1 1 block 256 1 1 smem 0 stream default dev 0 params " + hex(x, y, z) + " 0x3e8",
		"launch reverse_kernel grid 1 1 1 block 64 1 1 smem 0 stream default dev 0 params " + hex(S, R),
		"launch dyn_kernel grid 1 1 1 block 64 1 1 smem 65536 stream default dev 0 params " + hex(S, R),
	})

	// Arrays on the host, or on the other GPU, are refused before C.
	h, err := ndarray.Empty(ndarray.Shape{1024}, ndarray.Float32, devices.CPUDevice)
	check.NoError(t, err)
	defer h.Release()
	check.Error(t, call("scale", h, B), `"A": array is on cpu:0, want cuda:0`)
	other, err := ndarray.Empty(ndarray.Shape{1024}, ndarray.Float32, devices.Device{Type: devices.CUDA, ID: 1})
	check.NoError(t, err)
	defer other.Release()
	check.Error(t, call("scale", A, other), `"B": array is on cuda:1, want cuda:0`)
	// A shape the host function checks.
	check.Error(t, call("vadd", x, y, array(999)), "vadd")

	// A launch the driver refuses names the function, the kernel and the
	// CUDA error.
	t.Setenv("KILN_FAKE_CUDA_FAIL_LAUNCH", "scale_kernel")
	err = call("scale", A, B)
	check.Error(t, err, "scale", "kernel scale_kernel: cuLaunchKernel (grid 4x1x1, block 256x1x1, 0 bytes of dynamic shared memory): CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested for launch")
	os.Unsetenv("KILN_FAKE_CUDA_FAIL_LAUNCH")

	check.NoError(t, m.Close())
	check.NoError(t, m.Close())
	check.Error(t, call("scale", A, B), "closed")
}

// TestHostModuleRefusals: a cuda artifact's host library is refused by the
// CPU loader (a CPU-only daemon says what it is), and the cuda loader
// refuses artifacts for other targets and without device code.
func TestHostModuleRefusals(t *testing.T) {
	a := buildHostModule(t)
	dir := t.TempDir()
	_, err := cpu.LoadArtifact(a, dir)
	check.Error(t, err, `the module is built for "cuda -arch=sm_80": its functions launch device code and run only where a cuda backend loads it, not on cpu`)

	cpuArt := artifact.New("cpu", "gcc")
	_, err = cuda.LoadArtifact(gpu0, cpuArt, dir)
	check.Error(t, err, `the artifact is built for "cpu", not cuda`)
	noDevice := artifact.New("cuda -arch=sm_80", "gcc")
	_, err = cuda.LoadArtifact(gpu0, noDevice, dir)
	check.Error(t, err, "no device/kernels.json in it")
}

// TestCubinSelectionOnFakeDriver loads cuda artifacts built for sm_80 and
// sm_90 on fake devices of compute capability 8.0 and 9.0: a device gets
// the artifact's cubin of its own architecture (the driver sees an ELF
// image and looks the kernels up in it, no PTX is loaded), the PTX where
// the artifact has no cubin for it, and an error naming both
// architectures where the device is older than the artifact's.
func TestCubinSelectionOnFakeDriver(t *testing.T) {
	if os.Getenv("KILN_FAKE_CUDA") != "" {
		t.Skip("already running on the fake driver")
	}
	if testing.Short() {
		t.Skip("builds C libraries and runs child processes")
	}
	if _, err := (cuda.NVRTC{}).Identity(); err != nil {
		t.Skipf("NVRTC is not installed, so no cuda artifact can be built here: %v", err)
	}
	mod, err := script.Parse("host.py", hostModuleSrc)
	check.NoError(t, err)
	dir := buildFakeDriver(t)
	arts := map[string]string{}
	for _, arch := range []string{"sm_80", "sm_90"} {
		a, err := compiler.Build(context.Background(), mod, compiler.MustParseTarget("cuda -arch="+arch), compiler.BuildOptions{NoCache: true, CUDA: cuda.NVRTC{}})
		check.NoError(t, err)
		arts[arch] = filepath.Join(dir, arch+".kiln")
		check.NoError(t, a.Save(arts[arch]))
	}
	for _, c := range []struct{ arch, cc, want, load string }{
		{"sm_90", "90", "cubin sm_90", "load cubin"},
		{"sm_80", "80", "cubin sm_80", "load cubin"},
		{"sm_80", "90", "PTX for sm_80", "load ptx"},
		{"sm_90", "80", "error: cuda:0 is sm_80 (compute capability 8.0); the artifact is built for sm_90 and needs a device at least that new", ""},
	} {
		t.Run(c.arch+" on "+c.cc, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "driver.log")
			cmd := exec.Command(os.Args[0], "-test.run=^TestCubinSelectionChild$", "-test.v", "-test.count=1", "-test.timeout=5m")
			cmd.Env = append(os.Environ(),
				"LD_LIBRARY_PATH="+dir+string(os.PathListSeparator)+os.Getenv("LD_LIBRARY_PATH"),
				"KILN_FAKE_CUDA="+dir, "KILN_FAKE_CUDA_CC="+c.cc,
				"KILN_CUDA_TEST_ARTIFACT="+arts[c.arch], "KILN_CUDA_TEST_WANT="+c.want, "KILN_FAKE_CUDA_LOG="+log)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child test failed: %v\n%s", err, out)
			}
			check.True(t, strings.Contains(string(out), "--- PASS: TestCubinSelectionChild "), "the child test did not pass:\n", string(out))
			text, _ := os.ReadFile(log)
			var loads []string
			for _, l := range strings.Split(string(text), "\n") {
				if strings.HasPrefix(l, "load ") {
					loads = append(loads, strings.Join(strings.Fields(l)[:2], " "))
				}
			}
			if c.load == "" {
				check.Equal(t, len(loads), 0, "module loads:\n", string(text))
				return
			}
			check.Equal(t, loads, []string{c.load}, "module loads:\n", string(text))
			if c.load == "load cubin" {
				for _, k := range []string{"scale_kernel", "vadd_kernel", "reverse_kernel"} {
					check.True(t, strings.Contains(string(text), "function "+k+" in cubin\n"), k, "looked up in the cubin:\n", string(text))
				}
			}
		})
	}
}

// TestCubinSelectionChild is the child of TestCubinSelectionOnFakeDriver.
func TestCubinSelectionChild(t *testing.T) {
	path, want := os.Getenv("KILN_CUDA_TEST_ARTIFACT"), os.Getenv("KILN_CUDA_TEST_WANT")
	if path == "" || want == "" || os.Getenv("KILN_FAKE_CUDA") == "" {
		t.Skip("runs as the child of TestCubinSelectionOnFakeDriver")
	}
	needGPU(t)
	a, err := artifact.Load(path)
	check.NoError(t, err)
	m, err := cuda.LoadArtifact(gpu0, a, t.TempDir())
	if msg, isErr := strings.CutPrefix(want, "error: "); isErr {
		check.Error(t, err, msg)
		return
	}
	check.NoError(t, err)
	defer m.Close()
	check.Equal(t, m.Image(), want)
	check.Equal(t, len(m.DeviceMetadata().Kernels), 4)
}
