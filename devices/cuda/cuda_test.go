package cuda_test

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/devices/devicetest"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

var gpu0 = devices.Device{Type: devices.CUDA, ID: 0}

// kernelSrc is compiled with NVRTC by the tests that run on a GPU.
const kernelSrc = `
extern "C" __global__ void vadd(float* a, float* b, float* c, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void scale_f32(float* x, float s, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) x[i] = x[i] * s;
}

extern "C" __global__ void axpy_f64(double alpha, const double* x, double* y, long long n) {
	long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) y[i] = alpha * x[i] + y[i];
}
`

var kernelInfos = []cuda.KernelInfo{
	{Name: "vadd", Params: []cuda.ParamKind{cuda.ParamPtr, cuda.ParamPtr, cuda.ParamPtr, cuda.ParamInt32}},
	{Name: "scale_f32", Params: []cuda.ParamKind{cuda.ParamPtr, cuda.ParamFloat32, cuda.ParamInt32}},
	{Name: "axpy_f64", Params: []cuda.ParamKind{cuda.ParamFloat64, cuda.ParamPtr, cuda.ParamPtr, cuda.ParamInt64}},
}

// needGPU skips the test, with the reason, when CUDA is not usable here.
func needGPU(t *testing.T) devices.DeviceAPI {
	t.Helper()
	ok, why := cuda.Available()
	if !ok {
		t.Skip("cuda is absent: " + why)
	}
	api, err := devices.Get(devices.CUDA)
	check.NoError(t, err)
	return api
}

var update = flag.Bool("update", false, "rewrite testdata/kernels.ptx from kernelSrc with NVRTC")

// kernelsPTX is kernelSrc compiled by NVRTC 11.8 (PTX ISA 7.8, sm_52: any
// driver from CUDA 11.8 on loads it). Tests use it where NVRTC is absent.
const kernelsPTX = "testdata/kernels.ptx"

// TestKernelsPTX refreshes testdata/kernels.ptx with -update.
func TestKernelsPTX(t *testing.T) {
	if !*update {
		b, err := os.ReadFile(kernelsPTX)
		check.NoError(t, err)
		for _, k := range kernelInfos {
			check.True(t, strings.Contains(string(b), ".entry "+k.Name+"("), kernelsPTX, "lacks", k.Name)
		}
		return
	}
	ptx, _, err := cuda.CompilePTX(kernelSrc, "kernels.cu", nil)
	check.NoError(t, err)
	check.NoError(t, os.WriteFile(kernelsPTX, []byte(ptx), 0o644))
}

// kernelPTX compiles kernelSrc with NVRTC, or reads testdata/kernels.ptx
// where NVRTC is absent or KILN_CUDA_TEST_PTX_FIXTURE is set.
func kernelPTX(t *testing.T) string {
	t.Helper()
	_, _, _, err := cuda.NVRTCVersion()
	if os.Getenv("KILN_CUDA_TEST_PTX_FIXTURE") != "" {
		err = errors.New("KILN_CUDA_TEST_PTX_FIXTURE is set")
	}
	if err != nil {
		t.Logf("not compiling (%v); using %s", err, kernelsPTX)
		b, err := os.ReadFile(kernelsPTX)
		check.NoError(t, err)
		return string(b)
	}
	ptx, log, err := cuda.CompilePTX(kernelSrc, "kernels.cu", nil)
	check.NoError(t, err, "compile")
	if log != "" {
		t.Logf("nvrtc log: %s", log)
	}
	return ptx
}

// loadKernels loads kernelSrc's kernels on gpu0.
func loadKernels(t *testing.T) *cuda.Module {
	t.Helper()
	needGPU(t)
	ptx := kernelPTX(t)
	check.True(t, strings.Contains(ptx, ".entry vadd"), "ptx has no vadd entry")
	m, err := cuda.LoadModule(gpu0, ptx, kernelInfos)
	check.NoError(t, err, "load")
	t.Cleanup(func() { check.NoError(t, m.Close(), "close module") })
	return m
}

func float32Bytes(xs []float32) []byte {
	b := make([]byte, 4*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bytesFloat32(b []byte) []float32 {
	xs := make([]float32, len(b)/4)
	for i := range xs {
		xs[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return xs
}

func float64Bytes(xs []float64) []byte {
	b := make([]byte, 8*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
	}
	return b
}

func bytesFloat64(b []byte) []float64 {
	xs := make([]float64, len(b)/8)
	for i := range xs {
		xs[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return xs
}

func upload(t *testing.T, b []byte, n int64, dt ndarray.DType) *ndarray.NDArray {
	t.Helper()
	a, err := ndarray.FromBytes(b, ndarray.Shape{n}, dt, gpu0)
	check.NoError(t, err, "upload")
	t.Cleanup(func() { _ = a.Release() })
	return a
}

func ints(xs ...int64) []packedfunc.Value {
	out := make([]packedfunc.Value, len(xs))
	for i, x := range xs {
		out[i] = packedfunc.Int(x)
	}
	return out
}

// --- tests that run everywhere -------------------------------------------

func TestAbsent(t *testing.T) {
	ok, why := cuda.Available()
	if ok {
		t.Skip("cuda is present")
	}
	check.True(t, why != "", "absent reason is empty")
	mentions := false
	for _, s := range []string{"libcuda.so.1", "cuInit", "cuDeviceGetCount", "lacks"} {
		mentions = mentions || strings.Contains(why, s)
	}
	check.True(t, mentions, fmt.Sprintf("reason %q does not say what was missing", why))
	if want := os.Getenv("KILN_FAKE_CUDA_WANT_REASON"); want != "" {
		check.True(t, strings.Contains(why, want), fmt.Sprintf("reason %q does not contain %q", why, want))
	}
	t.Logf("reason: %s", why)
	check.Equal(t, devices.Absent(devices.CUDA), why)

	_, err := devices.Get(devices.CUDA)
	check.ErrorIs(t, err, devices.ErrNoBackend)
	check.Error(t, err, why)
	_, err = devices.For(gpu0)
	check.ErrorIs(t, err, devices.ErrNoBackend)

	// The package's entry points fail cleanly.
	_, err = cuda.LoadPTX(gpu0, ".version 8.0", nil)
	check.ErrorIs(t, err, devices.ErrNoBackend)
	_, err = cuda.NewEvent(gpu0)
	check.ErrorIs(t, err, devices.ErrNoBackend)
	_, err = cuda.TimeKernel(gpu0, 0, func() error { return nil })
	check.ErrorIs(t, err, devices.ErrNoBackend)
	_, err = cuda.Telemetry(gpu0) // NVML may still be there; it must not panic
	t.Logf("telemetry: %v", err)
}

func TestNVRTCAbsent(t *testing.T) {
	_, _, _, err := cuda.NVRTCVersion()
	if err == nil {
		t.Skip("nvrtc is present")
	}
	check.ErrorIs(t, err, cuda.ErrNoNVRTC)
	check.Error(t, err, "libnvrtc.so")
	_, _, err = cuda.CompilePTX(kernelSrc, "kernels.cu", nil)
	check.ErrorIs(t, err, cuda.ErrNoNVRTC)
	t.Logf("nvrtc: %v", err)
}

func TestTelemetryNotCUDA(t *testing.T) {
	_, err := cuda.Telemetry(devices.CPUDevice)
	check.Error(t, err, "not a cuda device")
}

// --- tests that need a GPU -----------------------------------------------

func TestConformance(t *testing.T) {
	api := needGPU(t)
	devicetest.Run(t, api, gpu0, devicetest.MinAlign(256), devicetest.BadScopes("shared.dyn", "shared", "local", "warp"))
}

func TestAttrs(t *testing.T) {
	api := needGPU(t)
	v, err := api.Attr(gpu0, devices.AttrComputeVersion)
	check.NoError(t, err)
	check.True(t, regexp.MustCompile(`^\d+\.\d+$`).MatchString(v.(string)), fmt.Sprintf("compute version %q", v))
	v, err = api.Attr(gpu0, devices.AttrWarpSize)
	check.NoError(t, err)
	check.Equal(t, v, any(int64(32)))
	for _, k := range []devices.AttrKind{devices.AttrMaxThreadsPerBlock, devices.AttrMultiProcessorCount,
		devices.AttrTotalGlobalMemory, devices.AttrAvailableGlobalMemory, devices.AttrDriverVersion} {
		v, err := api.Attr(gpu0, k)
		check.NoError(t, err, k)
		check.True(t, v.(int64) > 0, k, "is", v)
	}
	_, err = api.Attr(devices.Device{Type: devices.CUDA, ID: int32(api.Count())}, devices.AttrName)
	check.ErrorIs(t, err, devices.ErrNoDevice)
}

func TestVAdd(t *testing.T) {
	m := loadKernels(t)
	f, err := m.GetFunction("vadd")
	check.NoError(t, err)
	const n = 1 << 20
	a, b := make([]float32, n), make([]float32, n)
	for i := range a {
		a[i] = float32(i)*0.5 - 1000
		b[i] = float32(math.Sin(float64(i)))
	}
	da := upload(t, float32Bytes(a), n, ndarray.Float32)
	db := upload(t, float32Bytes(b), n, ndarray.Float32)
	dc, err := ndarray.Empty(ndarray.Shape{n}, ndarray.Float32, gpu0)
	check.NoError(t, err)
	defer dc.Release()

	const block = 256
	args := append([]packedfunc.Value{packedfunc.Array(da), packedfunc.Array(db), packedfunc.Array(dc)},
		ints(n, (n+block-1)/block, 1, 1, block, 1, 1)...)
	_, err = f.Call(args...)
	check.NoError(t, err, "launch")
	out, err := dc.Bytes()
	check.NoError(t, err)
	got := bytesFloat32(out)
	for i := range got {
		if want := a[i] + b[i]; got[i] != want {
			t.Fatalf("c[%d] = %v, want %v", i, got[i], want)
		}
	}

	t.Run("Stream", func(t *testing.T) {
		api := needGPU(t)
		s, err := api.CreateStream(gpu0)
		check.NoError(t, err)
		defer api.FreeStream(gpu0, s)
		m.SetStream(s)
		defer m.SetStream(0)
		check.Equal(t, m.Stream(), s)
		zero := make([]byte, 4*n)
		check.NoError(t, api.CopyFromHost(dc.Data(), gpu0, zero, s))
		d, err := cuda.TimeKernel(gpu0, s, func() error { _, err := f.Call(args...); return err })
		check.NoError(t, err, "timed launch")
		check.True(t, d >= 0, "negative kernel time", d)
		t.Logf("vadd of %d floats: %v", n, d)
		check.NoError(t, api.StreamSync(gpu0, s))
		out, err := dc.Bytes()
		check.NoError(t, err)
		got := bytesFloat32(out)
		for i := range got {
			if want := a[i] + b[i]; got[i] != want {
				t.Fatalf("on a stream: c[%d] = %v, want %v", i, got[i], want)
			}
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		const workers, size = 4, 4096
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Go(func() {
				x := make([]float32, size)
				for i := range x {
					x[i] = float32(w*size + i)
				}
				if err := vaddOnce(f, x); err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

// vaddOnce computes x+x on the GPU and checks the result.
func vaddOnce(f *packedfunc.Func, x []float32) error {
	n := int64(len(x))
	for range 10 {
		a, err := ndarray.FromBytes(float32Bytes(x), ndarray.Shape{n}, ndarray.Float32, gpu0)
		if err != nil {
			return err
		}
		c, err := ndarray.Empty(ndarray.Shape{n}, ndarray.Float32, gpu0)
		if err != nil {
			return err
		}
		args := append([]packedfunc.Value{packedfunc.Array(a), packedfunc.Array(a), packedfunc.Array(c)}, ints(n, (n+127)/128, 1, 1, 128, 1, 1)...)
		if _, err := f.Call(args...); err != nil {
			return err
		}
		out, err := c.Bytes()
		if err != nil {
			return err
		}
		for i, v := range bytesFloat32(out) {
			if v != x[i]+x[i] {
				return fmt.Errorf("c[%d] = %v, want %v", i, v, x[i]+x[i])
			}
		}
		_ = a.Release()
		_ = c.Release()
	}
	return nil
}

func TestParamKinds(t *testing.T) {
	m := loadKernels(t)
	const n = 1000
	t.Run("float32", func(t *testing.T) {
		f, err := m.GetFunction("scale_f32")
		check.NoError(t, err)
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(i) - 17.25
		}
		dx := upload(t, float32Bytes(x), n, ndarray.Float32)
		_, err = f.Call(append([]packedfunc.Value{packedfunc.Array(dx), packedfunc.Float(-1.5), packedfunc.Int(n)}, ints(4, 1, 1, 256, 1, 1)...)...)
		check.NoError(t, err)
		out, err := dx.Bytes()
		check.NoError(t, err)
		for i, v := range bytesFloat32(out) {
			if want := x[i] * -1.5; v != want {
				t.Fatalf("x[%d] = %v, want %v", i, v, want)
			}
		}
	})
	t.Run("float64_int64", func(t *testing.T) {
		f, err := m.GetFunction("axpy_f64")
		check.NoError(t, err)
		x, y := make([]float64, n), make([]float64, n)
		for i := range x {
			x[i], y[i] = float64(i), float64(i)*0.5 // exact in any rounding: alpha*x+y
		}
		dx := upload(t, float64Bytes(x), n, ndarray.Float64)
		dy := upload(t, float64Bytes(y), n, ndarray.Float64)
		_, err = f.Call(append([]packedfunc.Value{packedfunc.Float(2.5), packedfunc.Array(dx), packedfunc.Array(dy), packedfunc.Int(n)}, ints(8, 1, 1, 128, 1, 1)...)...)
		check.NoError(t, err)
		out, err := dy.Bytes()
		check.NoError(t, err)
		for i, v := range bytesFloat64(out) {
			if want := 2.5*x[i] + y[i]; v != want {
				t.Fatalf("y[%d] = %v, want %v", i, v, want)
			}
		}
	})
}

func TestLaunchErrors(t *testing.T) {
	m := loadKernels(t)
	f, err := m.GetFunction("vadd")
	check.NoError(t, err)
	g := upload(t, make([]byte, 64), 16, ndarray.Float32)
	h, err := ndarray.Empty(ndarray.Shape{16}, ndarray.Float32, devices.CPUDevice)
	check.NoError(t, err)
	released, err := ndarray.Empty(ndarray.Shape{16}, ndarray.Float32, gpu0)
	check.NoError(t, err)
	check.NoError(t, released.Release())
	A := packedfunc.Array
	dims := ints(1, 1, 1, 16, 1, 1)
	with := func(vs ...packedfunc.Value) []packedfunc.Value { return append(vs, dims...) }
	tests := []struct {
		name string
		args []packedfunc.Value
		want []string
	}{
		{"TooFew", []packedfunc.Value{A(g)}, []string{"vadd", "wrong number of arguments", "want 10"}},
		{"CPUArray", with(A(g), A(h), A(g), packedfunc.Int(16)), []string{"vadd", "argument 1", "cpu:0"}},
		{"Released", with(A(g), A(g), A(released), packedfunc.Int(16)), []string{"vadd", "argument 2", "released"}},
		{"IntForArray", with(packedfunc.Int(3), A(g), A(g), packedfunc.Int(16)), []string{"vadd", "argument 0", "want ndarray"}},
		{"Int32Overflow", with(A(g), A(g), A(g), packedfunc.Int(1<<40)), []string{"vadd", "argument 3", "int32"}},
		{"StringForInt", with(A(g), A(g), A(g), packedfunc.String("16")), []string{"vadd", "argument 3"}},
		{"ZeroGrid", append(with(A(g), A(g), A(g), packedfunc.Int(16))[:4], ints(0, 1, 1, 16, 1, 1)...), []string{"vadd", "argument 4", "gridX"}},
		{"HugeBlock", append(with(A(g), A(g), A(g), packedfunc.Int(16))[:4], ints(1, 1, 1, 64, 64, 1)...), []string{"vadd", "4096 threads"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.Call(tc.args...)
			check.Error(t, err, tc.want...)
		})
	}
}

func TestModuleClose(t *testing.T) {
	needGPU(t)
	m, err := cuda.LoadPTX(gpu0, kernelPTX(t), kernelInfos[:1])
	check.NoError(t, err)
	check.Equal(t, m.Type(), "cuda")
	check.Equal(t, m.Functions(), []string{"vadd"})
	_, err = m.GetFunction("nope")
	check.ErrorIs(t, err, packedfunc.ErrNotFound)
	f, err := m.GetFunction("vadd")
	check.NoError(t, err)
	check.NoError(t, m.Close())
	check.NoError(t, m.Close(), "second close")
	g := upload(t, make([]byte, 64), 16, ndarray.Float32)
	_, err = f.Call(append([]packedfunc.Value{packedfunc.Array(g), packedfunc.Array(g), packedfunc.Array(g), packedfunc.Int(16)}, ints(1, 1, 1, 16, 1, 1)...)...)
	check.ErrorIs(t, err, cuda.ErrClosed)
}

func TestLoadErrors(t *testing.T) {
	needGPU(t)
	_, err := cuda.LoadPTX(gpu0, "this is not ptx", kernelInfos[:1])
	var cerr *cuda.Error
	check.True(t, errors.As(err, &cerr), fmt.Sprintf("loading garbage: %v is not a *cuda.Error", err))
	check.Error(t, err, "cuda load ptx on cuda:0")
	t.Logf("garbage ptx: %v", err)

	ptx := kernelPTX(t)
	_, err = cuda.LoadPTX(gpu0, ptx, []cuda.KernelInfo{{Name: "missing"}})
	check.Error(t, err, `"missing"`, "CUDA_ERROR_NOT_FOUND")
	_, err = cuda.LoadPTX(gpu0, ptx, []cuda.KernelInfo{{Name: "vadd", Params: []cuda.ParamKind{"pointer"}}})
	check.Error(t, err, `unknown kind "pointer"`)
	_, err = cuda.LoadPTX(gpu0, ptx, []cuda.KernelInfo{{Name: "vadd", Params: []cuda.ParamKind{cuda.ParamPtr, cuda.ParamPtr, cuda.ParamPtr}}})
	if err == nil {
		t.Log("the driver cannot report kernel parameters (cuFuncGetParamInfo needs CUDA 12.4)")
	} else {
		check.Error(t, err, `kernel "vadd" takes more than the 3 parameters`)
	}
	_, err = cuda.LoadPTX(gpu0, ptx, []cuda.KernelInfo{{Name: "vadd", Params: []cuda.ParamKind{cuda.ParamPtr, cuda.ParamPtr, cuda.ParamPtr, cuda.ParamInt64}}})
	if err != nil {
		check.Error(t, err, `kernel "vadd" parameter 3 is 4 bytes`)
	}
}

// TestCompilePTX needs NVRTC only: compiling runs on the CPU.
func TestCompilePTX(t *testing.T) {
	if _, _, _, err := cuda.NVRTCVersion(); err != nil {
		t.Skip("nvrtc is absent: " + err.Error())
	}
	tests := []struct {
		name string
		opts []string
		want []string
	}{
		{"Default", nil, []string{".entry vadd(", ".entry scale_f32(", ".entry axpy_f64("}},
		{"Arch", []string{"--gpu-architecture=compute_80", "-lineinfo"}, []string{".target sm_80", ".entry vadd("}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ptx, log, err := cuda.CompilePTX(kernelSrc, "kernels.cu", tc.opts)
			check.NoError(t, err, "log:", log)
			for _, w := range tc.want {
				check.True(t, strings.Contains(ptx, w), fmt.Sprintf("ptx lacks %q:\n%s", w, ptx))
			}
			check.True(t, !strings.Contains(ptx, "\x00"), "ptx holds a NUL byte")
		})
	}
	_, _, err := cuda.CompilePTX(kernelSrc, "kernels.cu", []string{"--no-such-option"})
	check.Error(t, err, "nvrtc compile", `"kernels.cu"`)
	t.Logf("bad option: %v", err)
}

func TestNVRTCCompileError(t *testing.T) {
	if _, _, _, err := cuda.NVRTCVersion(); err != nil {
		t.Skip("nvrtc is absent: " + err.Error())
	}
	major, minor, path, _ := cuda.NVRTCVersion()
	t.Logf("nvrtc %d.%d from %s", major, minor, path)
	_, log, err := cuda.CompilePTX("#error kiln-test-marker\n", "broken.cu", nil)
	check.Error(t, err, "nvrtc compile", `"broken.cu"`, "kiln-test-marker")
	check.True(t, strings.Contains(log, "kiln-test-marker"), "log", log)
}

func TestEvents(t *testing.T) {
	api := needGPU(t)
	s, err := api.CreateStream(gpu0)
	check.NoError(t, err)
	defer api.FreeStream(gpu0, s)
	start, err := cuda.NewEvent(gpu0)
	check.NoError(t, err)
	end, err := cuda.NewEvent(gpu0)
	check.NoError(t, err)
	check.NoError(t, start.Record(s))
	p, err := api.Alloc(gpu0, 1<<20, 256, "")
	check.NoError(t, err)
	defer api.Free(gpu0, p)
	check.NoError(t, api.CopyFromHost(p, gpu0, make([]byte, 1<<20), s))
	check.NoError(t, end.Record(s))
	check.NoError(t, end.Synchronize())
	d, err := start.Elapsed(end)
	check.NoError(t, err)
	check.True(t, d >= 0, "negative elapsed time", d)
	check.NoError(t, start.Close())
	check.NoError(t, end.Close())
	check.NoError(t, end.Close(), "second close")
	check.True(t, end.Record(s) != nil, "record on a closed event succeeded")
}

// TestEventTimer times a copy on the default stream between the timer's
// events, twice, and closes it twice.
func TestEventTimer(t *testing.T) {
	api := needGPU(t)
	tm, err := cuda.NewEventTimer(gpu0)
	check.NoError(t, err)
	p, err := api.Alloc(gpu0, 1<<20, 256, "")
	check.NoError(t, err)
	defer api.Free(gpu0, p)
	for range 2 {
		check.NoError(t, tm.Start())
		check.NoError(t, api.CopyFromHost(p, gpu0, make([]byte, 1<<20), 0))
		d, err := tm.Stop()
		check.NoError(t, err)
		check.True(t, d >= 0, "negative elapsed time", d)
	}
	check.NoError(t, tm.Close())
	check.NoError(t, tm.Close(), "second close")
	check.True(t, tm.Start() != nil, "start on a closed timer succeeded")
}

func TestTelemetry(t *testing.T) {
	needGPU(t)
	if os.Getenv("KILN_FAKE_CUDA") != "" {
		t.Skip("the fake driver has no NVML")
	}
	tm, err := cuda.Telemetry(gpu0)
	check.NoError(t, err)
	t.Logf("%+v", tm)
	check.True(t, tm.Name != "", "empty name")
	check.True(t, tm.MemoryTotal > 0, "zero total memory")
	check.True(t, tm.MemoryUsed <= tm.MemoryTotal, "used memory above total")
	check.True(t, tm.GPUUtilization <= 100 && tm.MemoryUtilization <= 100, "utilization above 100%")
	check.True(t, tm.TemperatureC < 150, "temperature", tm.TemperatureC)
	if !slicesContains(tm.Missing, "sm_clock") {
		check.True(t, tm.SMClockMHz > 0, "zero SM clock")
	}
}

func slicesContains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

func TestPeerCopy(t *testing.T) {
	api := needGPU(t)
	if api.Count() < 2 {
		t.Skip("one GPU")
	}
	gpu1 := devices.Device{Type: devices.CUDA, ID: 1}
	const n = 1 << 16
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i * 7)
	}
	a, err := ndarray.FromBytes(want, ndarray.Shape{n}, ndarray.Uint8, gpu0)
	check.NoError(t, err)
	defer a.Release()
	b, err := a.CopyTo(gpu1)
	check.NoError(t, err, "copy cuda:0 -> cuda:1")
	defer b.Release()
	check.Equal(t, b.Device(), gpu1)
	got, err := b.Bytes()
	check.NoError(t, err)
	check.True(t, string(got) == string(want), "peer copy changed the data")

	s, err := api.CreateStream(gpu1)
	check.NoError(t, err)
	defer api.FreeStream(gpu1, s)
	c, err := ndarray.Empty(ndarray.Shape{n}, ndarray.Uint8, gpu1)
	check.NoError(t, err)
	defer c.Release()
	check.NoError(t, api.Copy(c.Data(), gpu1, a.Data(), gpu0, n, s), "peer copy on a stream")
	check.NoError(t, api.StreamSync(gpu1, s))
	got, err = c.Bytes()
	check.NoError(t, err)
	check.True(t, string(got) == string(want), "peer copy on a stream changed the data")
}

// TestInterleavedDevices alternates between two GPUs on the same
// goroutines: every driver call must make its own device's context current,
// whatever the thread ran before.
func TestInterleavedDevices(t *testing.T) {
	api := needGPU(t)
	if api.Count() < 2 {
		t.Skip("one GPU")
	}
	devs := []devices.Device{gpu0, {Type: devices.CUDA, ID: 1}}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Go(func() {
			for i := range 50 {
				want := []byte(fmt.Sprintf("worker %d iteration %d", w, i))
				var ptrs [2]devices.Ptr
				for j, d := range devs {
					p, err := api.Alloc(d, int64(len(want)), 256, "")
					if err != nil {
						errs <- err
						return
					}
					ptrs[j] = p
				}
				for j, d := range devs {
					if err := api.CopyFromHost(ptrs[j], d, want, 0); err != nil {
						errs <- err
						return
					}
				}
				for j, d := range devs {
					got := make([]byte, len(want))
					if err := api.CopyToHost(got, ptrs[j], d, 0); err != nil {
						errs <- err
						return
					}
					if string(got) != string(want) {
						errs <- fmt.Errorf("%s: got %q, want %q", d, got, want)
						return
					}
				}
				for j, d := range devs {
					if err := api.Free(d, ptrs[j]); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
