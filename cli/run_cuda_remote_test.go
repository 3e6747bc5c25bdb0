package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

const cudaAddSrc = `# from tvm.script import tir as T
@T.prim_func
def add_f32(A: T.Buffer((1024,), "float32"), B: T.Buffer((1024,), "float32"), C: T.Buffer((1024,), "float32")):
    T.func_attr({"global_symbol": "add_f32", "tir.noalias": T.bool(True)})
    for i in range(1024):
        with T.block("C"):
            vi = T.axis.spatial(1024, i)
            C[vi] = A[vi] + B[vi]
`

// buildCUDA writes TVMScript src to dir/name.py and builds it for cuda
// (sm_80) into dir/name.kiln, whose path it returns.
func buildCUDA(t *testing.T, dir, name, src string) string {
	t.Helper()
	file := filepath.Join(dir, name+".py")
	check.NoError(t, os.WriteFile(file, []byte(src), 0o644))
	art := filepath.Join(dir, name+".kiln")
	_, stderr, err := runApp(t, "build", file, "--target", "cuda -arch=sm_80", "-o", art, "--no-cache")
	check.NoError(t, err, stderr)
	check.True(t, strings.Contains(stderr, "for cuda -arch=sm_80"), stderr)
	return art
}

// TestRunCUDARemote runs cuda artifacts through a tracker on a `kiln
// rpcserver` process whose machine has a CUDA device: the fake libcuda,
// which computes kiln's add_f32_kernel and records every launch. A
// function's inputs go up as numpy arrays and its output comes back with
// the right numbers, the device code loaded once per session and the
// kernel launched with the grid and block the host function computed; the
// MLP's graph runs in the VM on the GPU (each kernel launched once, the
// result back in its shape), and timed there runs again and again on
// weights copied to the GPU once; kiln bench times on the device between
// CUDA events; a failed launch comes back naming the kernel and the CUDA error.
// A daemon without a CUDA device is not leased for a cuda artifact, and
// refuses one loaded there directly, saying why.
func TestRunCUDARemote(t *testing.T) {
	if _, err := (cuda.NVRTC{}).Identity(); err != nil {
		t.Skipf("NVRTC is not installed, so nothing can be built for cuda: %v", err)
	}
	dir := t.TempDir()
	addArt := buildCUDA(t, dir, "add", cudaAddSrc)
	scaleArt := buildCUDA(t, dir, "scale", cudaScaleSrc)
	mlpSrc, pfile, xfile, _ := mlpFiles(t, dir)
	mlpArt := filepath.Join(dir, "mlp.kiln")
	_, stderr, err := runApp(t, "build", mlpSrc, "--target", "cuda -arch=sm_80", "--params", pfile, "-o", mlpArt, "--no-cache")
	check.NoError(t, err, stderr)

	as, bs := make([]float32, 1024), make([]float32, 1024)
	for i := range as {
		as[i], bs[i] = float32(i), 0.5*float32(i%7)
	}
	npy := func(name string, xs []float32) string {
		x, err := ndarray.FromSlice(xs, ndarray.Shape{int64(len(xs))})
		check.NoError(t, err)
		path := filepath.Join(dir, name+".npy")
		check.NoError(t, ndarray.SaveNPY(path, x))
		return path
	}
	afile, bfile := npy("a", as), npy("b", bs)

	lib := fakeLibCUDA(t, dir)
	log := filepath.Join(dir, "driver.log")
	f := newProcFleet(t, procGuard)
	f.startTracker("")
	f.devices = append(f.devices, startProcEnv(t, "cuda device", []string{"LD_LIBRARY_PATH=" + lib, "KILN_FAKE_CUDA_DEVICES=1", "CUDA_VISIBLE_DEVICES=0"},
		"rpcserver", "--key", "gpu", "--tracker", f.trackerAddr, "--listen", "127.0.0.1:0", "--token-file", f.tokFile,
		"--dir", filepath.Join(dir, "gpu"), "--sandbox", "off",
		"--worker-env", "KILN_FAKE_CUDA_DEVICES=1", "--worker-env", "KILN_FAKE_CUDA_LOG="+log,
		"--worker-env", "KILN_FAKE_CUDA_FAIL_LAUNCH=scale_kernel"))
	// A daemon whose machine has no CUDA device: the fake driver with none
	// (its workers too), in place of any real one.
	f.devices = append(f.devices, startProcEnv(t, "cpu device", []string{"LD_LIBRARY_PATH=" + lib, "KILN_FAKE_CUDA_DEVICES=0"},
		"rpcserver", "--key", "cpu", "--tracker", f.trackerAddr, "--listen", "127.0.0.1:0", "--token-file", f.tokFile,
		"--dir", filepath.Join(dir, "cpu"), "--sandbox", "off", "--worker-env", "KILN_FAKE_CUDA_DEVICES=0"))
	f.waitFree("gpu", 1)
	f.waitFree("cpu", 1)
	remote := func(key string) []string {
		return []string{"--tracker", f.trackerAddr, "--key", key, "--token-file", f.tokFile}
	}
	driverLog := func() string {
		t.Helper()
		b, err := os.ReadFile(log)
		check.NoError(t, err)
		check.NoError(t, os.Remove(log)) // the next session's log starts empty
		return string(b)
	}

	// A function: C = A + B computed by the fake from kiln's kernel.
	out := filepath.Join(dir, "add-out")
	_, stderr, err = runApp(t, append([]string{"run", addArt, "--func", "add_f32", "--input", "A=" + afile, "--input", "B=" + bfile, "--output", out}, remote("gpu")...)...)
	check.NoError(t, err, stderr)
	text := driverLog()
	check.Equal(t, strings.Count(text, "load ptx"), 1, text)
	check.Equal(t, strings.Count(text, "launch add_f32_kernel grid 4 1 1 block 256 1 1 smem 0 stream default dev 0 params "), 1, text)
	c, err := ndarray.LoadNPY(filepath.Join(out, "C.npy"))
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](c)
	check.NoError(t, err)
	check.Equal(t, len(got), 1024)
	for i := range got {
		if got[i] != as[i]+bs[i] {
			t.Fatalf("C[%d] = %g, want %g", i, got[i], as[i]+bs[i])
		}
	}

	// The MLP's graph in the VM on the GPU: each kernel launched once, the
	// device code loaded once, the result back in its shape.
	out = filepath.Join(dir, "mlp-out")
	_, stderr, err = runApp(t, append([]string{"run", mlpArt, "--input", "x=" + xfile, "--output", out}, remote("gpu")...)...)
	check.NoError(t, err, stderr)
	text = driverLog()
	check.Equal(t, strings.Count(text, "load ptx"), 1, text)
	for _, k := range []string{"fused_matmul_add_relu_kernel", "fused_matmul1_add1_kernel"} {
		check.Equal(t, strings.Count(text, "launch "+k+" "), 1, k, "launches in", text)
	}
	res, err := ndarray.LoadNPY(filepath.Join(out, "output.npy"))
	check.NoError(t, err)
	check.Equal(t, res.Shape(), ndarray.Shape{1, 10})

	// Timed there, the graph runs once to warm up and once a repeat on
	// the weights and input copied to the GPU once (each of the 5 sizes),
	// their transposes made once and cached.
	stdout, stderr, err := runApp(t, append([]string{"bench", mlpArt, "--input", "x=" + xfile,
		"--number", "1", "--repeat", "2", "--min-repeat-ms", "0", "--json"}, remote("gpu")...)...)
	check.NoError(t, err, stderr)
	var tr struct {
		Results []float64 `json:"results"`
		Number  int       `json:"number"`
		Device  string    `json:"device"`
	}
	check.NoError(t, json.Unmarshal([]byte(stdout), &tr), stdout)
	check.Equal(t, tr.Device, "cuda:0")
	check.Equal(t, len(tr.Results), 2)
	text = driverLog()
	check.Equal(t, strings.Count(text, "load ptx"), 1, text)
	check.Equal(t, strings.Count(text, "launch fused_matmul_add_relu_kernel "), 1+2*tr.Number, text)
	check.Equal(t, strings.Count(text, "launch transpose_kernel "), 1, text)
	copies := map[string]int{}
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "copy htod ") {
			copies[l]++
		}
	}
	check.Equal(t, len(copies), 5, text)
	for l, n := range copies {
		check.Equal(t, n, 1, l, "in", text)
	}

	// kiln bench times on the device, between events on the GPU.
	stdout, stderr, err = runApp(t, append([]string{"bench", addArt, "--func", "add_f32", "--input", "A=" + afile,
		"--number", "2", "--repeat", "3", "--min-repeat-ms", "0", "--json"}, remote("gpu")...)...)
	check.NoError(t, err, stderr)
	check.NoError(t, json.Unmarshal([]byte(stdout), &tr), stdout)
	check.Equal(t, tr.Device, "cuda:0")
	check.Equal(t, len(tr.Results), 3)
	text = driverLog()
	check.True(t, strings.Count(text, "launch add_f32_kernel ") >= 7, "a warm-up and 3 repeats of 2 calls at least:", text)
	_, _, err = runApp(t, append([]string{"bench", addArt, "--func", "add_f32", "--cache-flush-bytes", "4096"}, remote("gpu")...)...)
	check.Error(t, err, "not supported on cuda:0")

	// A launch that fails names the kernel and the CUDA error.
	_, _, err = runApp(t, append([]string{"run", scaleArt, "--func", "scale", "--input", "A=" + afile, "--output", filepath.Join(dir, "scale-out")}, remote("gpu")...)...)
	check.Error(t, err, "kernel scale_kernel: cuLaunchKernel (grid 4x1x1, block 256x1x1", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested for launch")

	// No device of key cpu has a CUDA device: refused before leasing.
	_, _, err = runApp(t, append([]string{"run", mlpArt, "--input", "x=" + xfile, "--output", filepath.Join(dir, "cpu-out")}, remote("cpu")...)...)
	check.Error(t, err, `the artifact is built for "cuda -arch=sm_80", and no device under key "cpu" has a cuda device (they serve cpu)`)

	// Loaded there directly, the daemon refuses it, saying why.
	ctx, cancel := context.WithTimeout(context.Background(), 2*procGuard)
	defer cancel()
	tc := f.dialTracker(ctx)
	lease, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "cpu", User: t.Name()})
	check.NoError(t, err)
	defer lease.Release(context.Background())
	s, err := client.Connect(ctx, lease.Addr, client.SessionOptions{Token: f.tok, LeaseToken: lease.Token})
	check.NoError(t, err)
	defer s.Close()
	b, err := os.ReadFile(mlpArt)
	check.NoError(t, err)
	check.NoError(t, s.Upload(ctx, "mlp.kiln", b))
	_, err = s.LoadModule(ctx, "mlp.kiln")
	check.Error(t, err, `load module "mlp.kiln"`,
		"the artifact is built for cuda -arch=sm_80, and this device daemon has no usable cuda device: cuInit: CUDA_ERROR_NO_DEVICE")
}

// TestRPCServerWorkerEnv: --worker-env takes NAME=VALUE, and says so.
func TestRPCServerWorkerEnv(t *testing.T) {
	dir := t.TempDir()
	for _, bad := range []string{"NOVALUE", "=x", "A B=c"} {
		_, _, err := runApp(t, "rpcserver", "--key", "cpu", "--listen", "127.0.0.1:0", "--dir", dir, "--worker-env", bad)
		check.Error(t, err, fmt.Sprintf("--worker-env %q: want NAME=VALUE", bad))
	}
}

// TestCUDAKey: a cuda artifact is refused at once for a key none of whose
// devices has a GPU new enough for its device code, and for a selector
// alone when no registered device has one and the client would not wait;
// otherwise the lease goes ahead.
func TestCUDAKey(t *testing.T) {
	dev := func(key, compute string, types ...string) proto.NodeSummary {
		return proto.NodeSummary{Key: key, Attrs: proto.NodeAttrs{DeviceTypes: types, CUDACompute: compute}}
	}
	cpuOnly := proto.TrackerSummary{Devices: []proto.NodeSummary{dev("cpu", "", "cpu"), dev("arm", "", "cpu")}}
	mixed := proto.TrackerSummary{Devices: []proto.NodeSummary{dev("cpu", "", "cpu"), dev("a100", "8.0", "cpu", "cuda"), dev("h100", "9.0", "cpu", "cuda")}}
	for _, tc := range []struct {
		name, need string
		sum        proto.TrackerSummary
		key        string
		wait       bool
		want       string // "" for no error
	}{
		{"key without a gpu", "8.0", mixed, "cpu", false, `no device under key "cpu" has a cuda device (they serve cpu)`},
		{"key without a gpu, waiting", "8.0", mixed, "cpu", true, `no device under key "cpu" has a cuda device`},
		{"key with a gpu", "8.0", mixed, "a100", false, ""},
		{"key with a newer gpu", "8.6", mixed, "h100", false, ""},
		{"key with an older gpu", "9.0", mixed, "a100", true, `needs a GPU of compute capability 9.0 or newer, and the cuda devices under key "a100" have 8.0`},
		{"unregistered key", "8.0", mixed, "b200", false, ""},
		{"selector, a gpu registered", "8.0", mixed, "", false, ""},
		{"selector, only older gpus", "10.0", mixed, "", false, "needs a GPU of compute capability 10.0 or newer, and the cuda devices registered with the tracker have 8.0, 9.0"},
		{"selector, no gpu", "8.0", cpuOnly, "", false, "no device registered with the tracker has a cuda device (the registered devices serve cpu); pass --wait"},
		{"selector, nothing registered", "8.0", proto.TrackerSummary{}, "", false, "(no device is registered)"},
		{"selector, no gpu, waiting", "8.0", cpuOnly, "", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := cudaKey(tc.sum, tc.key, "cuda -arch=sm_XY", tc.need, tc.wait)
			if tc.want == "" {
				check.NoError(t, err)
				return
			}
			check.Error(t, err, `the artifact is built for "cuda -arch=sm_XY"`, tc.want)
			check.ErrorIs(t, err, proto.ErrNotFound)
		})
	}
}

// TestCUDASessionGPUs: a daemon on a board of two GPUs serving two
// sessions at once gives each a GPU of its own (its worker sees that one
// alone, as cuda:0): the two sessions' kernels launch on the two GPUs, and
// each gets its own sums back.
func TestCUDASessionGPUs(t *testing.T) {
	if _, err := (cuda.NVRTC{}).Identity(); err != nil {
		t.Skipf("NVRTC is not installed, so nothing can be built for cuda: %v", err)
	}
	dir := t.TempDir()
	data, err := os.ReadFile(buildCUDA(t, dir, "add", cudaAddSrc))
	check.NoError(t, err)
	lib := fakeLibCUDA(t, dir)
	log := filepath.Join(dir, "driver.log")
	tok := filepath.Join(dir, "token")
	check.NoError(t, os.WriteFile(tok, []byte("gputok\n"), 0o600))
	p := startProcEnv(t, "two-gpu device", []string{"LD_LIBRARY_PATH=" + lib, "KILN_FAKE_CUDA_DEVICES=2", "CUDA_VISIBLE_DEVICES=0,1"},
		"rpcserver", "--key", "gpu2", "--listen", "127.0.0.1:0", "--token-file", tok, "--dir", filepath.Join(dir, "d"),
		"--sandbox", "off", "--max-sessions", "2", "--insecure-shared",
		"--worker-env", "KILN_FAKE_CUDA_DEVICES=2", "--worker-env", "KILN_FAKE_CUDA_LOG="+log)
	addr := p.addr(t)

	ctx, cancel := context.WithTimeout(context.Background(), 2*procGuard)
	defer cancel()
	gpu := devices.Device{Type: devices.CUDA}
	var sums [2][]float32
	var sessions [2]*client.Session
	for i := range sessions {
		s, err := client.Connect(ctx, addr, client.SessionOptions{Token: "gputok"})
		check.NoError(t, err)
		defer s.Close()
		sessions[i] = s
	}
	for i, s := range sessions { // both open at once
		check.NoError(t, s.Upload(ctx, "add.kiln", data))
		mod, err := s.LoadModule(ctx, "add.kiln")
		check.NoError(t, err)
		fn, err := mod.GetFunction(ctx, "add_f32")
		check.NoError(t, err)
		var args []any
		for _, scale := range []float32{1, float32(10 * (i + 1))} {
			xs := make([]float32, 1024)
			for j := range xs {
				xs[j] = scale * float32(j)
			}
			h, err := ndarray.FromSlice(xs, ndarray.Shape{1024})
			check.NoError(t, err)
			a, err := s.Empty(ctx, h.Shape(), h.DType(), gpu)
			check.NoError(t, err)
			check.NoError(t, s.CopyFrom(ctx, a, h))
			args = append(args, a)
		}
		c, err := s.Empty(ctx, ndarray.Shape{1024}, ndarray.Float32, gpu)
		check.NoError(t, err)
		_, err = fn.Call(ctx, append(args, c)...)
		check.NoError(t, err)
		out, err := s.CopyTo(ctx, c)
		check.NoError(t, err)
		sums[i], err = ndarray.ToSlice[float32](out)
		check.NoError(t, err)
	}
	for i := range sums {
		want := float32(1+10*(i+1)) * 1023
		check.Equal(t, sums[i][1023], want, "session", i)
	}
	text, err := os.ReadFile(log)
	check.NoError(t, err)
	for _, dev := range []string{"dev 0", "dev 1"} {
		check.Equal(t, strings.Count(string(text), "launch add_f32_kernel grid 4 1 1 block 256 1 1 smem 0 stream default "+dev+" "), 1, dev, "in", string(text))
	}
}
