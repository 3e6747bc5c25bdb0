package cuda_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestFakeDriver runs this package's GPU tests in a child process against
// a fake libcuda.so.1 and libnvrtc.so built from testdata/fakecuda, so the
// whole path from Go through cgo to the driver API (contexts, copies,
// streams, module loading, kernelParams, events) runs on machines without
// a GPU. The fake checks what the real driver checks; it does not run PTX.
func TestFakeDriver(t *testing.T) {
	if os.Getenv("KILN_FAKE_CUDA") != "" {
		t.Skip("already running on the fake driver")
	}
	if testing.Short() {
		t.Skip("builds C libraries and runs a child process")
	}
	dir := buildFakeDriver(t)

	gpuTests := []string{"TestConformance", "TestAttrs", "TestVAdd", "TestParamKinds", "TestLaunchErrors",
		"TestModuleClose", "TestLoadErrors", "TestCompilePTX", "TestNVRTCCompileError", "TestEvents", "TestEventTimer", "TestPeerCopy", "TestInterleavedDevices"}
	tests := []struct {
		name string
		env  []string
		run  []string
		pass []string
	}{
		{"TwoDevices", []string{"KILN_FAKE_CUDA_DEVICES=2"}, gpuTests, gpuTests},
		{"FixturePTX", []string{"KILN_FAKE_CUDA_DEVICES=1", "KILN_CUDA_TEST_PTX_FIXTURE=1"},
			[]string{"TestVAdd", "TestParamKinds", "TestModuleClose", "TestLoadErrors"},
			[]string{"TestVAdd", "TestParamKinds", "TestModuleClose", "TestLoadErrors"}},
		{"NoNVRTC", []string{"KILN_FAKE_CUDA_DEVICES=1", "KILN_NVRTC=" + filepath.Join(dir, "missing", "libnvrtc.so")},
			[]string{"TestNVRTCAbsent", "TestVAdd"}, []string{"TestNVRTCAbsent", "TestVAdd"}},
		{"NoDevice", []string{"KILN_FAKE_CUDA_DEVICES=0", "KILN_FAKE_CUDA_WANT_REASON=cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected"},
			[]string{"TestAbsent"}, []string{"TestAbsent"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^("+strings.Join(tc.run, "|")+")$", "-test.v", "-test.count=1", "-test.timeout=5m")
			// The fake honours CUDA_VISIBLE_DEVICES, as the driver does:
			// a machine's own setting must not hide its devices.
			env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") })
			cmd.Env = append(env,
				"LD_LIBRARY_PATH="+dir+string(os.PathListSeparator)+os.Getenv("LD_LIBRARY_PATH"),
				"KILN_FAKE_CUDA="+dir)
			cmd.Env = append(cmd.Env, tc.env...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child tests failed: %v\n%s", err, out)
			}
			for _, name := range tc.pass {
				check.True(t, strings.Contains(string(out), "--- PASS: "+name+" "), name, "did not pass on the fake driver:\n", string(out))
			}
			if testing.Verbose() {
				t.Logf("child output:\n%s", out)
			}
		})
	}
}

// buildFakeDriver builds the fake libcuda.so.1 and libnvrtc.so into a
// temporary directory and returns it (skipping without gcc).
func buildFakeDriver(t *testing.T) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc to build the fake driver")
	}
	dir := t.TempDir()
	for _, lib := range []struct{ src, out string }{
		{"cuda.c", "libcuda.so.1"},
		{"nvrtc.c", "libnvrtc.so"},
	} {
		cmd := exec.Command(gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", filepath.Join(dir, lib.out),
			filepath.Join("testdata", "fakecuda", lib.src), "-lpthread")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", lib.out, err, out)
		}
	}
	return dir
}
