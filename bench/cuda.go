package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/codegen/cuda"
	"github.com/kiln-ml/kiln/compiler/frontend/nn"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/transform"
	cudadev "github.com/kiln-ml/kiln/devices/cuda"
)

func init() {
	register(benchmark{
		name:    "cuda",
		summary: "NVRTC compile time, cubin size, registers and shared memory of default-scheduled CUDA kernels (no GPU needed); on a machine with a GPU, the fp32 and fp16 matmuls against cuBLAS, the IRModule tutorial's MLP and a CNN from ONNX (--model, default squeezenet1_1) timed on it",
		run:     runCUDA,
	})
}

// cudaKernel is one kernel's figures: the median NVRTC time to a cubin
// (with ptxas), its ratio to the empty kernel's in the same run (the
// fixed cost of an NVRTC compile, the floor), and ptxas's report.
type cudaKernel struct {
	Func       string  `json:"func"`
	Arch       string  `json:"arch"`
	Grid       int64   `json:"grid"`
	Block      int64   `json:"block"`
	NVRTCMS    float64 `json:"nvrtc_ms"`
	VsFloor    float64 `json:"vs_empty_kernel"`
	CubinBytes int     `json:"cubin_bytes"`
	PTXBytes   int     `json:"ptx_bytes"`
	Registers  int64   `json:"registers"`
	SharedMem  int64   `json:"smem_bytes"`
	Spills     int64   `json:"spill_bytes"`
	// TensorCores is set when the kernel's PTX runs mma.sync (the
	// tensor-core rule of float16 and bfloat16 matmuls).
	TensorCores bool `json:"tensor_cores,omitempty"`
}

type cudaResult struct {
	Name    string       `json:"name"`
	NVRTC   string       `json:"nvrtc"`
	Repeats int          `json:"repeats"`
	FloorMS float64      `json:"empty_kernel_ms"`
	Median  float64      `json:"median_nvrtc_ms"`
	Kernels []cudaKernel `json:"kernels"`
	// MLP is the IRModule tutorial's MLP (784 → 256 → ReLU → 10) built with kiln build
	// --target cuda for each architecture: the whole build's time (graph
	// pipeline, lowering, NVRTC to PTX and a cubin, host C) and each
	// kernel's ptxas report from the artifact's launch metadata.
	MLP []cudaMLPBuild `json:"mlp"`
	// GPU is the GPU the runs were timed on (see runCUDAGPU); NoGPU says
	// why none was, on a machine without one.
	GPU     *cudaGPUDevice `json:"gpu,omitempty"`
	GPURuns []cudaGPURun   `json:"gpu_runs,omitempty"`
	NoGPU   string         `json:"no_gpu,omitempty"`
	Note    string         `json:"note"`
	Quick   bool           `json:"quick,omitempty"`
}

type cudaMLPBuild struct {
	Arch    string       `json:"arch"`
	BuildMS float64      `json:"build_ms"`
	Kernels []cudaKernel `json:"kernels"`
}

func (r cudaResult) Line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cuda: NVRTC %s, empty kernel %.1f ms [median of %d]", r.NVRTC, r.FloorMS, r.Repeats)
	for _, k := range r.Kernels {
		fmt.Fprintf(&b, "\n  %s (%s, %d×%d): %.1f ms (%.2f× empty), cubin %d B, %d registers, %d B smem, %d B spilled",
			k.Func, k.Arch, k.Grid, k.Block, k.NVRTCMS, k.VsFloor, k.CubinBytes, k.Registers, k.SharedMem, k.Spills)
		if k.TensorCores {
			b.WriteString(", tensor cores (mma.sync)")
		}
	}
	for _, m := range r.MLP {
		fmt.Fprintf(&b, "\n  IRModule tutorial's MLP built for %s in %.0f ms:", m.Arch, m.BuildMS)
		for _, k := range m.Kernels {
			fmt.Fprintf(&b, "\n    %s (%d×%d): %d registers, %d B smem, %d B spilled", k.Func, k.Grid, k.Block, k.Registers, k.SharedMem, k.Spills)
		}
	}
	switch {
	case r.GPU != nil:
		fmt.Fprintf(&b, "\n  on %s (compute %s, built for %s; cuBLAS %s):", r.GPU.Name, r.GPU.Compute, r.GPU.Arch, r.GPU.CuBLAS)
		fmt.Fprintf(&b, "\n    %-34s %10s %10s %9s %8s %10s  %s", "run", "kiln ms", "cuBLAS ms", "vs cuBLAS", "TFLOP/s", "max rel err", "reference (timed)")
		for _, g := range r.GPURuns {
			cb, vs, tf := "-", "-", "-"
			if g.CuBLASMS > 0 {
				cb, vs = fmt.Sprintf("%.3g", g.CuBLASMS), fmt.Sprintf("%.2f×", g.VsCuBLAS)
			}
			if g.TFLOPS > 0 {
				tf = fmt.Sprintf("%.3g", g.TFLOPS)
			}
			fmt.Fprintf(&b, "\n    %-34s %10.3g %10s %9s %8s %10.2g  %s (%s)", g.Name, g.KilnMS, cb, vs, tf, g.MaxRelErr, g.Reference, g.Timed)
		}
	case r.NoGPU != "":
		fmt.Fprintf(&b, "\n  not timed on a GPU: %s", r.NoGPU)
	}
	return b.String()
}

// cudaMLP builds the IRModule tutorial's MLP for arch (no build cache) and reports the
// build's time and each kernel's resources.
func cudaMLP(ctx context.Context, arch string) (cudaMLPBuild, error) {
	mod, _, err := nn.Export(mlpModel(), nn.Spec{Inputs: []nn.Input{{Name: "x", Shape: []int64{1, 784}, DType: ir.Float32}}, Seed: 1})
	if err != nil {
		return cudaMLPBuild{}, err
	}
	target, err := compiler.ParseTarget("cuda -arch=" + arch)
	if err != nil {
		return cudaMLPBuild{}, err
	}
	start := time.Now()
	a, err := compiler.Build(ctx, mod, target, compiler.BuildOptions{NoCache: true, CUDA: cudadev.NVRTC{}})
	if err != nil {
		return cudaMLPBuild{}, fmt.Errorf("mlp for %s: %w", arch, err)
	}
	out := cudaMLPBuild{Arch: arch, BuildMS: sig(ms(time.Since(start)), 3)}
	dm, err := abi.ParseDeviceMetadata(a.Files[abi.DeviceMetadataName])
	if err != nil {
		return cudaMLPBuild{}, err
	}
	for _, k := range dm.Kernels {
		res := k.Resources[arch]
		out.Kernels = append(out.Kernels, cudaKernel{Func: k.Name, Arch: arch, Grid: k.Grid[0] * k.Grid[1] * k.Grid[2], Block: k.Block[0] * k.Block[1] * k.Block[2],
			CubinBytes: len(a.Files[dm.Cubins[arch]]), PTXBytes: len(a.Files[dm.PTX]),
			Registers: res.Registers, SharedMem: res.SharedBytes, Spills: res.SpillStores + res.SpillLoads})
	}
	return out, nil
}

// cudaMatmul is an n×n×n matmul of dtype named name, as TVMScript.
func cudaMatmul(name string, n int, dtype string) string {
	return fmt.Sprintf(`@T.prim_func
def %[2]s(A: T.Buffer((%[1]d, %[1]d), "%[3]s"), B: T.Buffer((%[1]d, %[1]d), "%[3]s"), C: T.Buffer((%[1]d, %[1]d), "%[3]s")):
    T.func_attr({"global_symbol": "%[2]s", "tir.noalias": T.bool(True)})
    for i, j, k in T.grid(%[1]d, %[1]d, %[1]d):
        with T.block("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.%[3]s(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
`, n, name, dtype)
}

// cudaKernels are the functions the benchmark schedules with the default
// GPU rule, as TVMScript, at full and at quick size.
func cudaKernels(quick bool) map[string]string {
	n, m := 4096, 4096
	if quick {
		n, m = 64, 64
	}
	return map[string]string{
		"add": fmt.Sprintf(`@T.prim_func
def add(A: T.Buffer((%[1]d, %[2]d), "float32"), B: T.Buffer((%[1]d, %[2]d), "float32"), C: T.Buffer((%[1]d, %[2]d), "float32")):
    T.func_attr({"global_symbol": "add", "tir.noalias": T.bool(True)})
    for i, j in T.grid(%[1]d, %[2]d):
        with T.block("C"):
            vi, vj = T.axis.remap("SS", [i, j])
            C[vi, vj] = A[vi, vj] + B[vi, vj]
`, n, m),
		"gemv": fmt.Sprintf(`@T.prim_func
def gemv(A: T.Buffer((%[1]d, %[2]d), "float32"), x: T.Buffer((%[2]d,), "float32"), y: T.Buffer((%[1]d,), "float32")):
    T.func_attr({"global_symbol": "gemv", "tir.noalias": T.bool(True)})
    for i, k in T.grid(%[1]d, %[2]d):
        with T.block("y"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                y[vi] = T.float32(0)
            y[vi] = y[vi] + A[vi, vk] * x[vk]
`, n, m),
		"matmul":      cudaMatmul("matmul", n, "float32"),
		"matmul_fp16": cudaMatmul("matmul_fp16", n, "float16"),
		"softmax": fmt.Sprintf(`@T.prim_func
def softmax(A: T.Buffer((%[1]d, %[2]d), "float32"), B: T.Buffer((%[1]d, %[2]d), "float32")):
    T.func_attr({"global_symbol": "softmax", "tir.noalias": T.bool(True)})
    mx = T.alloc_buffer((%[1]d,), "float32")
    e = T.alloc_buffer((%[1]d, %[2]d), "float32")
    s = T.alloc_buffer((%[1]d,), "float32")
    for i, k in T.grid(%[1]d, %[2]d):
        with T.block("max"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                mx[vi] = T.float32(-3.4028234663852886e38)
            mx[vi] = T.max(mx[vi], A[vi, vk])
    for i, j in T.grid(%[1]d, %[2]d):
        with T.block("exp"):
            vi, vj = T.axis.remap("SS", [i, j])
            e[vi, vj] = T.exp(A[vi, vj] - mx[vi])
    for i, k in T.grid(%[1]d, %[2]d):
        with T.block("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                s[vi] = T.float32(0)
            s[vi] = s[vi] + e[vi, vk]
    for i, j in T.grid(%[1]d, %[2]d):
        with T.block("norm"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = e[vi, vj] / s[vi]
`, n, m),
		"layer_norm": fmt.Sprintf(`@T.prim_func
def layer_norm(A: T.Buffer((%[1]d, %[2]d), "float32"), gamma: T.Buffer((%[2]d,), "float32"), beta: T.Buffer((%[2]d,), "float32"), B: T.Buffer((%[1]d, %[2]d), "float32")):
    T.func_attr({"global_symbol": "layer_norm", "tir.noalias": T.bool(True)})
    s = T.alloc_buffer((%[1]d,), "float32")
    v = T.alloc_buffer((%[1]d,), "float32")
    for i, k in T.grid(%[1]d, %[2]d):
        with T.block("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                s[vi] = T.float32(0)
            s[vi] = s[vi] + A[vi, vk]
    for i, k in T.grid(%[1]d, %[2]d):
        with T.block("var"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                v[vi] = T.float32(0)
            v[vi] = v[vi] + (A[vi, vk] - s[vi] * T.float32(%[3]g)) * (A[vi, vk] - s[vi] * T.float32(%[3]g))
    for i, j in T.grid(%[1]d, %[2]d):
        with T.block("norm"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = (A[vi, vj] - s[vi] * T.float32(%[3]g)) / T.sqrt(v[vi] * T.float32(%[3]g) + T.float32(1e-5)) * gamma[vj] + beta[vj]
`, n, m, 1/float64(m)),
	}
}

func runCUDA(ctx context.Context, opt options) (result, error) {
	major, minor, _, err := cudadev.NVRTCVersion()
	if err != nil {
		return nil, err
	}
	repeats := 5
	if opt.quick {
		repeats = 1
	}
	archs := []string{"sm_80", "sm_90"}
	r := cudaResult{Name: "cuda", NVRTC: fmt.Sprintf("%d.%d", major, minor), Repeats: repeats, Quick: opt.quick,
		Note: "default GPU schedules: 2-D matmuls tiled in shared memory (tiles of A and B copied 16 bytes at a time, float4 or eight float16) and in registers (4x4 per thread, 16x16 threads), sums over one reduction (GEMV) a cross-thread tree in shared memory per output element ending in warp shuffles, softmax and layer norm one block of threads per row (each row reduction across the threads), everything else the fallback rule (fused spatial loops on blockIdx.x/threadIdx.x); grid and block are total blocks and threads per block; no kernel timed on a GPU"}
	timeIt := func(src, arch string) (float64, []byte, string, error) {
		var ts []float64
		var cubin []byte
		var log string
		for range repeats {
			if err := ctx.Err(); err != nil {
				return 0, nil, "", err
			}
			start := time.Now()
			var err error
			cubin, log, err = cudadev.CompileCUBIN(src, "bench.cu", []string{"--gpu-architecture=" + arch, "--ptxas-options=-v"})
			if err != nil {
				return 0, nil, "", err
			}
			ts = append(ts, ms(time.Since(start)))
		}
		return median(ts), cubin, log, nil
	}
	// The first compile loads NVRTC's builtins; time from the second.
	if _, _, err := cudadev.CompileCUBIN(`extern "C" __global__ void warm() {}`, "warm.cu", []string{"--gpu-architecture=" + archs[0]}); err != nil {
		return nil, fmt.Errorf("nvrtc: %w", err)
	}
	floor, _, _, err := timeIt(`extern "C" __global__ void empty() {}`, archs[0])
	if err != nil {
		return nil, fmt.Errorf("empty kernel: %w", err)
	}
	r.FloorMS = sig(floor, 3)
	var all []float64
	for _, name := range []string{"add", "gemv", "matmul", "matmul_fp16", "softmax", "layer_norm"} {
		src := cudaKernels(opt.quick)[name]
		m, err := script.Parse(name+".py", "# from tvm.script import tir as T\n"+src)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		f := m.PrimFunc(name)
		if f == nil {
			for _, g := range m.PrimFuncs() {
				f = g
			}
		}
		g, err := auto.GPUFunc(f, auto.GPUOptions{})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		l, err := transform.LowerModule(ir.NewIRModule().With(name, g), cuda.LowerOptions())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		for _, arch := range archs {
			lim, err := cuda.ArchLimits(arch)
			if err != nil {
				return nil, err
			}
			cu, ks, err := cuda.Generate(l, lim)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			ptx, _, err := cudadev.CompilePTX(cu, name+".cu", []string{"--gpu-architecture=compute_" + strings.TrimPrefix(arch, "sm_")})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			t, cubin, log, err := timeIt(cu, arch)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			rep, err := cuda.ParsePTXASReport(log)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			res := rep[name]
			r.Kernels = append(r.Kernels, cudaKernel{Func: name + " " + shapeOf(src), Arch: arch, Grid: ks[0].Grid[0] * ks[0].Grid[1] * ks[0].Grid[2], Block: ks[0].Threads(),
				NVRTCMS: sig(t, 3), VsFloor: sig(t/floor, 3), CubinBytes: len(cubin), PTXBytes: len(ptx),
				Registers: res.Registers, SharedMem: res.SharedBytes, Spills: res.SpillStores + res.SpillLoads,
				TensorCores: strings.Contains(ptx, "mma.sync.")})
			all = append(all, t)
		}
	}
	r.Median = sig(median(all), 3)
	for _, arch := range archs {
		m, err := cudaMLP(ctx, arch)
		if err != nil {
			return nil, err
		}
		r.MLP = append(r.MLP, m)
	}
	dev, runs, err := runCUDAGPU(ctx, opt.quick, opt.model)
	switch {
	case errors.Is(err, errNoGPU):
		r.NoGPU = err.Error()
	case err != nil:
		return nil, fmt.Errorf("on the GPU: %w", err)
	default:
		r.GPU, r.GPURuns = &dev, runs
		r.Note = strings.Replace(r.Note, "; no kernel timed on a GPU", "; gpu_runs: timed on the GPU against cuBLAS (vs_cublas is cuBLAS's time over kiln's)", 1)
	}
	return r, nil
}

// shapeOf is the first buffer's shape in a kernel's TVMScript.
func shapeOf(src string) string {
	_, rest, _ := strings.Cut(src, "T.Buffer(")
	shape, _, _ := strings.Cut(rest, ", \"")
	return shape
}
