package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/frontend/nn"
	"github.com/kiln-ml/kiln/compiler/frontend/onnx"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/devices"
	cudadev "github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/load"
	_ "github.com/kiln-ml/kiln/load/cudaload" // cuda artifacts load
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

// cudaGPURun is one measurement on the GPU: kiln's median time and, where
// cuBLAS computes the same thing, cuBLAS's in the same run and their
// ratio (cuBLAS's time over kiln's: above 1 kiln is faster); MaxRelErr
// is the largest difference of kiln's output from the reference (cuBLAS,
// or the CPU build, or the model's stored output) relative to the
// reference's largest magnitude.
type cudaGPURun struct {
	Name      string  `json:"name"`
	KilnMS    float64 `json:"kiln_ms"`
	CuBLASMS  float64 `json:"cublas_ms,omitempty"`
	VsCuBLAS  float64 `json:"vs_cublas,omitempty"`
	TFLOPS    float64 `json:"tflops,omitempty"`
	MaxRelErr float64 `json:"max_rel_err"`
	Reference string  `json:"reference"`
	// Timed says what the times cover: "kernel" (between two events on
	// the stream around the launch) or "call" (the whole call from the
	// host, its output copied back).
	Timed string `json:"timed"`
}

// cudaGPUDevice is the GPU the runs were measured on.
type cudaGPUDevice struct {
	Name    string `json:"name"`
	Compute string `json:"compute"`
	Arch    string `json:"arch"`
	CuBLAS  string `json:"cublas"`
}

// cudaArchs are the architectures kiln builds for, oldest first.
var cudaArchs = []string{"sm_80", "sm_86", "sm_89", "sm_90"}

// cudaArchFor is the newest architecture kiln builds for that a device of
// compute capability cc ("9.0") runs.
func cudaArchFor(cc string) (string, error) {
	var major, minor int
	if _, err := fmt.Sscanf(cc, "%d.%d", &major, &minor); err != nil {
		return "", fmt.Errorf("compute capability %q: %w", cc, err)
	}
	best := ""
	for _, a := range cudaArchs {
		var n int
		fmt.Sscanf(strings.TrimPrefix(a, "sm_"), "%d", &n)
		if n <= major*10+minor {
			best = a
		}
	}
	if best == "" {
		return "", fmt.Errorf("compute capability %s is older than %s, the oldest architecture kiln builds for", cc, cudaArchs[0])
	}
	return best, nil
}

// errNoGPU is runCUDAGPU's error on a machine without a usable GPU.
var errNoGPU = errors.New("no usable CUDA GPU")

// runCUDAGPU measures on GPU 0: the fp32 and fp16 n×n×n matmuls (the
// shared-memory and tensor-core rules) against cuBLAS (cublasSgemm, and
// cublasGemmEx over float16 accumulating in float32), the IRModule tutorial's MLP
// against its CPU build (and cuBLAS's two GEMMs of its layers), and a CNN
// from ONNX (model, from the bench onnx cache; the committed test CNN in
// quick mode) against its stored output.
func runCUDAGPU(ctx context.Context, quick bool, model string) (cudaGPUDevice, []cudaGPURun, error) {
	var info cudaGPUDevice
	if ok, why := cudadev.Available(); !ok {
		return info, nil, fmt.Errorf("%w: %s", errNoGPU, why)
	}
	dev := devices.Device{Type: devices.CUDA, ID: 0}
	api, err := devices.Get(devices.CUDA)
	if err != nil {
		return info, nil, err
	}
	if v, err := api.Attr(dev, devices.AttrName); err == nil {
		info.Name = fmt.Sprint(v)
	}
	cc, err := api.Attr(dev, devices.AttrComputeVersion)
	if err != nil {
		return info, nil, err
	}
	info.Compute = fmt.Sprint(cc)
	if info.Arch, err = cudaArchFor(info.Compute); err != nil {
		return info, nil, err
	}
	target, err := compiler.ParseTarget("cuda -arch=" + info.Arch)
	if err != nil {
		return info, nil, err
	}
	// Without cuBLAS kiln's runs are timed alone.
	blas, err := newCuBLAS()
	if err != nil {
		info.CuBLAS = "absent (" + err.Error() + ")"
	} else {
		defer blas.Close()
		info.CuBLAS, _ = openCuBLAS()
	}
	g := &gpuBench{ctx: ctx, dev: dev, api: api, target: target, rounds: 20}
	if err == nil {
		g.blas = blas
	}
	n := 4096
	if quick {
		n, g.rounds = 128, 3
	}
	var runs []cudaGPURun
	for _, half := range []bool{false, true} {
		r, err := g.matmul(n, half)
		if err != nil {
			return info, runs, err
		}
		runs = append(runs, r)
	}
	r, err := g.mlp()
	if err != nil {
		return info, runs, err
	}
	runs = append(runs, r)
	if r, err = g.cnn(quick, model); err != nil {
		return info, runs, err
	}
	return info, append(runs, r), nil
}

// gpuBench holds what the GPU runs share.
type gpuBench struct {
	ctx    context.Context
	dev    devices.Device
	api    devices.DeviceAPI
	target compiler.Target
	blas   *cublasHandle
	rounds int
}

// timeKernel is the median over the rounds (after two warm-up runs) of
// the time between two events around what run queues.
func (g *gpuBench) timeKernel(run func() error) (float64, error) {
	return g.timeRounds(run, func() (time.Duration, error) { return cudadev.TimeKernel(g.dev, 0, run) })
}

// timeCall is the median over the rounds (after two warm-up calls) of
// the wall time of run, which ends with the stream synchronized.
func (g *gpuBench) timeCall(run func() error) (float64, error) {
	return g.timeRounds(run, func() (time.Duration, error) {
		t0 := time.Now()
		err := run()
		return time.Since(t0), err
	})
}

// timeRounds runs run twice to warm up, then returns the median in
// milliseconds of the rounds' times as timed takes them.
func (g *gpuBench) timeRounds(run func() error, timed func() (time.Duration, error)) (float64, error) {
	for range 2 {
		if err := run(); err != nil {
			return 0, err
		}
	}
	var ts []float64
	for range g.rounds {
		if err := g.ctx.Err(); err != nil {
			return 0, err
		}
		d, err := timed()
		if err != nil {
			return 0, err
		}
		ts = append(ts, ms(d))
	}
	return median(ts), nil
}

// load builds mod for the GPU and loads it there.
func (g *gpuBench) load(mod *ir.IRModule, params []byte) (*load.Module, error) {
	a, err := compiler.Build(g.ctx, mod, g.target, compiler.BuildOptions{NoCache: true, CUDA: cudadev.NVRTC{}, Params: params})
	if err != nil {
		return nil, err
	}
	return loadOn(a, g.dev)
}

func loadOn(a *artifact.Artifact, dev devices.Device) (*load.Module, error) {
	return load.Artifact(a, load.Options{Device: dev, MemoryCfg: vm.MemoryPooled})
}

// randomBytes is n elements of dtype (float32 or float16) drawn in
// [-1, 1) as multiples of 1/256 (exact in float16).
func randomBytes(rng *rand.Rand, n int64, half bool) []byte {
	if half {
		b := make([]byte, 2*n)
		for i := range n {
			binary.LittleEndian.PutUint16(b[2*i:], halfBits(float32(rng.IntN(512)-256)/256))
		}
		return b
	}
	b := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(rng.IntN(512)-256)/256))
	}
	return b
}

// halfBits is the float16 of x, a multiple of 1/256 in [-1, 1] (exact).
func halfBits(x float32) uint16 {
	if x == 0 {
		return 0
	}
	bits := math.Float32bits(x)
	sign := uint16(bits>>16) & 0x8000
	exp := int((bits>>23)&0xff) - 127 + 15
	return sign | uint16(exp)<<10 | uint16((bits>>13)&0x3ff)
}

// gpuFloats decodes float32 or float16 elements.
func gpuFloats(b []byte, half bool) []float64 {
	if !half {
		out := make([]float64, len(b)/4)
		for i := range out {
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		}
		return out
	}
	out := make([]float64, len(b)/2)
	for i := range out {
		h := binary.LittleEndian.Uint16(b[2*i:])
		sign := 1.0
		if h&0x8000 != 0 {
			sign = -1
		}
		e, m := int(h>>10)&0x1f, float64(h&0x3ff)
		switch e {
		case 0:
			out[i] = sign * m * math.Ldexp(1, -24)
		case 31:
			out[i] = math.NaN()
		default:
			out[i] = sign * (1 + m/1024) * math.Ldexp(1, e-15)
		}
	}
	return out
}

// relErr is the largest |got - want| over the largest |want| (+Inf for a
// NaN or a length that differs).
func relErr(got, want []float64) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var d, scale float64
	for i := range got {
		if math.IsNaN(got[i]) || math.IsNaN(want[i]) {
			return math.Inf(1)
		}
		d = max(d, math.Abs(got[i]-want[i]))
		scale = max(scale, math.Abs(want[i]))
	}
	if scale == 0 {
		return d
	}
	return d / scale
}

// onDevice copies host bytes to a new array on the GPU.
func (g *gpuBench) onDevice(b []byte, shape ndarray.Shape, dt ndarray.DType) (*ndarray.NDArray, error) {
	return ndarray.FromBytes(b, shape, dt, g.dev)
}

// matmul times kiln's default schedule of the n×n×n matmul (fp32, or
// fp16 operands and output) and cuBLAS's on the same operands.
func (g *gpuBench) matmul(n int, half bool) (cudaGPURun, error) {
	name, dtype, dt := "matmul", "float32", ir.Float32
	if half {
		name, dtype, dt = "matmul_fp16", "float16", ir.Float16
	}
	r := cudaGPURun{Name: fmt.Sprintf("%s %d×%d×%d", name, n, n, n), Reference: "cuBLAS", Timed: "kernel"}
	fail := func(err error) (cudaGPURun, error) { return r, fmt.Errorf("%s: %w", r.Name, err) }
	mod, err := script.Parse(name+".py", "# from tvm.script import tir as T\n"+cudaMatmul(name, n, dtype))
	if err != nil {
		return fail(err)
	}
	m, err := g.load(mod, nil)
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	f, err := m.GetFunction(name)
	if err != nil {
		return fail(err)
	}
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	shape := ndarray.Shape{int64(n), int64(n)}
	count := int64(n) * int64(n)
	a, err := g.onDevice(randomBytes(rng, count, half), shape, dt)
	if err != nil {
		return fail(err)
	}
	b, err := g.onDevice(randomBytes(rng, count, half), shape, dt)
	if err != nil {
		return fail(err)
	}
	c, err := ndarray.Empty(shape, dt, g.dev)
	if err != nil {
		return fail(err)
	}
	ref, err := ndarray.Empty(shape, dt, g.dev)
	if err != nil {
		return fail(err)
	}
	for _, x := range []*ndarray.NDArray{a, b, c, ref} {
		defer x.Release()
	}
	args := []packedfunc.Value{packedfunc.Array(a), packedfunc.Array(b), packedfunc.Array(c)}
	if r.KilnMS, err = g.timeKernel(func() error { _, err := f.Call(args...); return err }); err != nil {
		return fail(err)
	}
	r.TFLOPS = sig(2*math.Pow(float64(n), 3)/(r.KilnMS*1e-3)/1e12, 3)
	r.KilnMS = sig(r.KilnMS, 3)
	if g.blas == nil {
		r.Reference = "none (no cuBLAS)"
		return r, nil
	}
	if r.CuBLASMS, err = g.timeKernel(func() error { return g.blas.gemm(half, n, n, n, a.Data(), b.Data(), ref.Data()) }); err != nil {
		return fail(err)
	}
	got, err := c.Bytes()
	if err != nil {
		return fail(err)
	}
	want, err := ref.Bytes()
	if err != nil {
		return fail(err)
	}
	r.MaxRelErr = sig(relErr(gpuFloats(got, half), gpuFloats(want, half)), 3)
	r.VsCuBLAS = sig(r.CuBLASMS/r.KilnMS, 3)
	r.CuBLASMS = sig(r.CuBLASMS, 3)
	return r, nil
}

// mlp times the IRModule tutorial's MLP (784 → 256 → ReLU → 10, batch 1) built for the
// GPU, checks its output against the CPU build's on the same weights and
// input, and times cuBLAS's GEMMs of its two layers (no bias or ReLU),
// both as whole calls ending in a synchronized stream.
func (g *gpuBench) mlp() (cudaGPURun, error) {
	r := cudaGPURun{Name: "mlp 784-256-10 batch 1", Reference: "CPU build; time: cuBLAS's two GEMMs", Timed: "call"}
	fail := func(err error) (cudaGPURun, error) { return r, fmt.Errorf("%s: %w", r.Name, err) }
	mod, params, err := nn.Export(mlpModel(), nn.Spec{Inputs: []nn.Input{{Name: "x", Shape: []int64{1, 784}, DType: ir.Float32}}, Seed: 1})
	if err != nil {
		return fail(err)
	}
	rng := rand.New(rand.NewPCG(5, 5))
	xb := randomBytes(rng, 784, false)
	outOf := func(m *load.Module, dev devices.Device) (func() ([]byte, error), error) {
		x, err := ndarray.FromBytes(xb, ndarray.Shape{1, 784}, ir.Float32, dev)
		if err != nil {
			return nil, err
		}
		ps, err := params.NDArrays(dev)
		if err != nil {
			return nil, err
		}
		args := []packedfunc.Value{packedfunc.Array(x)}
		for _, name := range params.Names() {
			args = append(args, packedfunc.Array(ps[name]))
		}
		return func() ([]byte, error) {
			out, err := m.Invoke("main", args...)
			if err != nil {
				return nil, err
			}
			oa, err := out.Array()
			if err != nil {
				return nil, err
			}
			return oa.Bytes()
		}, nil
	}
	cpuA, err := compiler.Build(g.ctx, mod, compiler.Target{Kind: "cpu"}, compiler.BuildOptions{})
	if err != nil {
		return fail(err)
	}
	cm, err := loadOn(cpuA, devices.CPUDevice)
	if err != nil {
		return fail(err)
	}
	defer cm.Close()
	cpuRun, err := outOf(cm, devices.CPUDevice)
	if err != nil {
		return fail(err)
	}
	want, err := cpuRun()
	if err != nil {
		return fail(err)
	}
	gm, err := g.load(mod, nil)
	if err != nil {
		return fail(err)
	}
	defer gm.Close()
	gpuRun, err := outOf(gm, g.dev)
	if err != nil {
		return fail(err)
	}
	var got []byte
	if r.KilnMS, err = g.timeCall(func() error { var err error; got, err = gpuRun(); return err }); err != nil {
		return fail(err)
	}
	r.MaxRelErr = sig(relErr(gpuFloats(got, false), gpuFloats(want, false)), 3)
	r.KilnMS = sig(r.KilnMS, 3)
	if g.blas == nil {
		r.Reference = "CPU build (no cuBLAS)"
		return r, nil
	}
	// cuBLAS: x·W1 (1×784 · 784×256), then h·W2 (1×256 · 256×10).
	var bufs []*ndarray.NDArray
	for _, s := range []ndarray.Shape{{1, 784}, {784, 256}, {1, 256}, {256, 10}, {1, 10}} {
		a, err := g.onDevice(randomBytes(rng, s.NumElements(), false), s, ir.Float32)
		if err != nil {
			return fail(err)
		}
		defer a.Release()
		bufs = append(bufs, a)
	}
	if r.CuBLASMS, err = g.timeCall(func() error {
		if err := g.blas.gemm(false, 1, 256, 784, bufs[0].Data(), bufs[1].Data(), bufs[2].Data()); err != nil {
			return err
		}
		if err := g.blas.gemm(false, 1, 10, 256, bufs[2].Data(), bufs[3].Data(), bufs[4].Data()); err != nil {
			return err
		}
		return g.api.StreamSync(g.dev, 0)
	}); err != nil {
		return fail(err)
	}
	r.VsCuBLAS = sig(r.CuBLASMS/r.KilnMS, 3)
	r.CuBLASMS = sig(r.CuBLASMS, 3)
	return r, nil
}

// cnn times an ONNX CNN built for the GPU, batch 1, as whole calls (the
// output copied back) and compares its output with the model's stored
// one (PyTorch's, from bench onnx's export; the committed test model's in
// quick mode).
func (g *gpuBench) cnn(quick bool, model string) (cudaGPURun, error) {
	if model == "" {
		model = "squeezenet1_1"
	}
	r := cudaGPURun{Name: model + " (ONNX) batch 1", Reference: "stored output", Timed: "call"}
	fail := func(err error) (cudaGPURun, error) { return r, fmt.Errorf("%s: %w", r.Name, err) }
	var x *ndarray.NDArray
	var want []float32
	opts := onnx.Options{}
	var path string
	if quick {
		td := filepath.Join("compiler", "frontend", "onnx", "testdata")
		if _, err := os.Stat(td); err != nil {
			td = filepath.Join("..", td)
		}
		path, r.Name = filepath.Join(td, "smallcnn.onnx"), "smallcnn (ONNX) batch 2"
		var err error
		if x, err = ndarray.LoadNPY(filepath.Join(td, "smallcnn_x.npy")); err != nil {
			return fail(err)
		}
		y, err := ndarray.LoadNPY(filepath.Join(td, "smallcnn_y.npy"))
		if err != nil {
			return fail(err)
		}
		if want, err = ndarray.ToSlice[float32](y); err != nil {
			return fail(err)
		}
		opts.InputShapes = map[string][]int64{"x": {2, 3, 16, 16}}
	} else {
		cache, err := benchCacheDir()
		if err != nil {
			return fail(err)
		}
		path = filepath.Join(cache, model+".onnx")
		if _, err := os.Stat(path); err != nil {
			return fail(fmt.Errorf("%s is not exported: run go run ./bench onnx --model %s once (it writes the model and its input and output there), or copy it there: %w", path, model, err))
		}
		xs, err := readF32(filepath.Join(cache, model+"_x.bin"))
		if err != nil {
			return fail(err)
		}
		if x, err = ndarray.FromSlice(xs, ndarray.Shape(ortShape(model))); err != nil {
			return fail(err)
		}
		if want, err = readF32(filepath.Join(cache, model+"_y.bin")); err != nil {
			return fail(err)
		}
	}
	mod, weights, err := onnx.ImportFile(path, opts)
	if err != nil {
		return fail(err)
	}
	m, err := g.load(mod, weights)
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	xb, err := x.Bytes()
	if err != nil {
		return fail(err)
	}
	xd, err := g.onDevice(xb, x.Shape(), x.DType())
	if err != nil {
		return fail(err)
	}
	defer xd.Release()
	var got []byte
	if r.KilnMS, err = g.timeCall(func() error {
		out, err := m.Invoke("main", packedfunc.Array(xd))
		if err != nil {
			return err
		}
		oa, err := out.Array()
		if err != nil {
			return err
		}
		got, err = oa.Bytes()
		return err
	}); err != nil {
		return fail(err)
	}
	w := make([]float64, len(want))
	for i, v := range want {
		w[i] = float64(v)
	}
	r.MaxRelErr = sig(relErr(gpuFloats(got, false), w), 3)
	r.KilnMS = sig(r.KilnMS, 3)
	return r, nil
}
