package compiler_test

import (
	"context"
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/codegen/cuda"
	"github.com/kiln-ml/kiln/compiler/frontend/nn"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	cudadev "github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/internal/check"
)

// needNVRTC skips a test when NVRTC is not installed, saying so.
func needNVRTC(t *testing.T) {
	t.Helper()
	if _, err := (cudadev.NVRTC{}).Identity(); err != nil {
		t.Skipf("NVRTC is not installed, so nothing can be built for cuda here: %v", err)
	}
}

// buildCUDA builds mod for arch and checks what every cuda artifact must
// hold: the host library exporting the launch hook, PTX and a cubin with
// every kernel, launch metadata naming each host function's kernels, no
// spills and shared memory within the architecture's limit.
func buildCUDA(t *testing.T, mod *ir.IRModule, arch string) *artifact.Artifact {
	t.Helper()
	major, minor, _, err := cudadev.NVRTCVersion()
	check.NoError(t, err)
	if need := map[string]int{"sm_80": 110, "sm_86": 111, "sm_89": 118, "sm_90": 118}[arch]; major*10+minor < need {
		t.Skipf("NVRTC %d.%d cannot compile for %s (needs %d.%d)", major, minor, arch, need/10, need%10)
	}
	target, err := compiler.ParseTarget("cuda -arch=" + arch)
	check.NoError(t, err)
	a, err := compiler.Build(context.Background(), mod, target, compiler.BuildOptions{NoCache: true, CUDA: cudadev.NVRTC{}})
	check.NoError(t, err)
	check.Equal(t, a.Manifest.Target, "cuda -arch="+arch)
	dm, err := abi.ParseDeviceMetadata(a.Files[abi.DeviceMetadataName])
	check.NoError(t, err)
	check.Equal(t, dm.Arch, arch)
	ptx := string(a.Files[dm.PTX])
	cubin := a.Files[dm.Cubins[arch]]
	check.True(t, len(cubin) > 4 && string(cubin[1:4]) == "ELF", "the cubin is not an ELF file")
	lim, err := cuda.ArchLimits(arch)
	check.NoError(t, err)
	funcs := map[string]bool{}
	for _, f := range a.Manifest.Functions {
		funcs[f.Name] = true
		check.True(t, f.Params != nil, f.Name)
	}
	check.True(t, len(dm.Kernels) >= len(funcs), "fewer kernels than functions:", len(dm.Kernels), len(funcs))
	for _, k := range dm.Kernels {
		check.True(t, funcs[k.Func], "kernel", k.Name, "names no host function:", k.Func)
		check.True(t, strings.Contains(ptx, ".entry "+k.Name+"("), "no entry for", k.Name, "in the PTX")
		res, ok := k.Resources[arch]
		check.True(t, ok, "no resources of", k.Name, "on", arch)
		check.True(t, res.Registers > 0, k.Name)
		check.Equal(t, res.SpillStores+res.SpillLoads, int64(0), k.Name, "spills")
		check.True(t, res.SharedBytes <= lim.MaxSharedMemPerBlock, k.Name, "shared memory", res.SharedBytes)
		threads := k.Block[0] * k.Block[1] * k.Block[2]
		check.True(t, threads >= 1 && threads <= lim.MaxThreadsPerBlock, k.Name, "threads", threads)
	}
	// The host library exports the variables the cuda backend fills in.
	dir := t.TempDir()
	so := filepath.Join(dir, "host.so")
	check.NoError(t, os.WriteFile(so, a.Files[artifact.HostLib], 0o644))
	ef, err := elf.Open(so)
	check.NoError(t, err)
	defer ef.Close()
	syms, err := ef.DynamicSymbols()
	check.NoError(t, err)
	exported := map[string]bool{}
	for _, s := range syms {
		exported[s.Name] = true
	}
	for _, name := range []string{abi.DeviceLaunchHook, abi.DeviceModuleSymbol, "kiln_module_metadata"} {
		check.True(t, exported[name], "host.so does not export", name)
	}
	return a
}

// TestBuildCUDASeeds builds every module restored from TVM's documents
// (the IRModule tutorial's module and each stage of its MLP) for sm_80 and
// sm_90 with the default GPU schedules.
func TestBuildCUDASeeds(t *testing.T) {
	needNVRTC(t)
	dir := filepath.Join("..", "..", "shared", "seeds", "restored")
	files, err := filepath.Glob(filepath.Join(dir, "*.py"))
	check.NoError(t, err)
	if len(files) == 0 {
		t.Skip("TVM's example modules (shared/seeds/restored beside the repository) not present")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			text, err := os.ReadFile(file)
			check.NoError(t, err)
			mod, err := script.Parse(filepath.Base(file), string(text))
			check.NoError(t, err)
			for _, arch := range []string{"sm_80", "sm_90"} {
				buildCUDA(t, mod, arch)
			}
		})
	}
}

// TestBuildCUDATensorExpression builds the tensor-expression document's
// programs for cuda: the vector add over a symbolic length and the matmul,
// both with the default GPU schedule; the vector add's grid is computed by
// the host from n at each call.
func TestBuildCUDATensorExpression(t *testing.T) {
	needNVRTC(t)
	n := te.Var("n")
	A := te.Placeholder([]ir.Expr{n}, ir.Float32, "A")
	B := te.Placeholder([]ir.Expr{n}, ir.Float32, "B")
	C := te.Compute([]ir.Expr{n}, func(i ir.Expr) ir.Expr { return ir.Add(A.At(i), B.At(i)) }, "C")
	add, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	check.NoError(t, err)

	const size = 1024
	MA := te.Placeholder([]ir.Expr{ir.NewIntImm(ir.Int64, size), ir.NewIntImm(ir.Int64, size)}, ir.Float32, "A")
	MB := te.Placeholder([]ir.Expr{ir.NewIntImm(ir.Int64, size), ir.NewIntImm(ir.Int64, size)}, ir.Float32, "B")
	k := te.ReduceAxis(ir.RangeFromExtent(ir.NewIntImm(ir.Int64, size)), "k")
	MC := te.Compute([]ir.Expr{ir.NewIntImm(ir.Int64, size), ir.NewIntImm(ir.Int64, size)}, func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(MA.At(i, k), MB.At(k, j)), k)
	}, "C")
	mm, err := te.CreatePrimFunc([]*te.Tensor{MA, MB, MC})
	check.NoError(t, err)

	mod := ir.NewIRModule().
		With("vector_add", add.WithAttr(ir.AttrGlobalSymbol, "vector_add")).
		With("matmul", mm.WithAttr(ir.AttrGlobalSymbol, "matmul"))
	a := buildCUDA(t, mod, "sm_80")
	dm, err := abi.ParseDeviceMetadata(a.Files[abi.DeviceMetadataName])
	check.NoError(t, err)
	grids := map[string][3]int64{}
	for _, k := range dm.Kernels {
		grids[k.Name] = k.Grid
	}
	check.Equal(t, grids["vector_add_kernel"], [3]int64{0, 1, 1})             // computed from n
	check.Equal(t, grids["matmul_kernel"], [3]int64{size / 64, size / 64, 1}) // 64×64 tiles of C per block
}

// TestBuildCUDAMLP builds the IRModule tutorial's MLP (the graph module
// with its weights) for cuda.
func TestBuildCUDAMLP(t *testing.T) {
	needNVRTC(t)
	mod, _, err := nn.Export(seedMLP(), nn.Spec{Inputs: []nn.Input{{Name: "x", Shape: []int64{1, 784}, DType: ir.Float32}}, Seed: 7})
	check.NoError(t, err)
	a := buildCUDA(t, mod, "sm_90")
	_, ok := a.Files[artifact.VMExec]
	check.True(t, ok, "no VM executable in the MLP's artifact")
}

type noNVRTC struct{}

func (noNVRTC) CompilePTX(string, string, []string) (string, string, error) {
	return "", "", errors.New("unreachable")
}
func (noNVRTC) CompileCUBIN(string, string, []string) ([]byte, string, error) {
	return nil, "", errors.New("unreachable")
}
func (noNVRTC) Identity() (string, error) {
	return "", errors.New("nvrtc: no NVRTC library (tried libnvrtc.so)")
}

// TestBuildCUDAErrors: what cannot be built for cuda is refused with an
// error naming the function, the kernel or the limit.
func TestBuildCUDAErrors(t *testing.T) {
	parse := func(src string) *ir.IRModule {
		t.Helper()
		m, err := script.Parse("bad.py", "# from tvm.script import tir as T\n"+src)
		check.NoError(t, err)
		return m
	}
	ctx := context.Background()
	cudaTarget := compiler.MustParseTarget("cuda -arch=sm_80")
	add := parse(`@T.prim_func
def add(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32")):
    T.func_attr({"global_symbol": "add"})
    for i in range(8):
        with T.block("B"):
            vi = T.axis.spatial(8, i)
            B[vi] = A[vi] + T.float32(1)
`)
	_, err := compiler.Build(ctx, add, cudaTarget, compiler.BuildOptions{NoCache: true, CUDA: noNVRTC{}})
	check.Error(t, err, `build: target "cuda -arch=sm_80": building for cuda needs NVRTC: nvrtc: no NVRTC library`)

	needNVRTC(t)
	nv := compiler.BuildOptions{NoCache: true, CUDA: cudadev.NVRTC{}}
	for _, tc := range []struct{ name, src, want string }{
		{"too many threads", `@T.prim_func
def wide(A: T.Buffer((2048,), "float32")):
    T.func_attr({"global_symbol": "wide"})
    for tx in T.thread_binding(2048, thread="threadIdx.x"):
        with T.block("A"):
            vi = T.axis.spatial(2048, tx)
            A[vi] = T.float32(0)
`, `kernel "wide_kernel": threadIdx.x extent 2048 exceeds sm_80's limit 1024`},
		{"shared memory past the limit", `@T.prim_func
def big(A: T.Buffer((128,), "float32")):
    T.func_attr({"global_symbol": "big"})
    S = T.alloc_buffer((16384,), scope="shared")
    for tx in T.thread_binding(128, thread="threadIdx.x"):
        for j in range(128):
            with T.block("S"):
                vi = T.axis.spatial(16384, tx * 128 + j)
                S[vi] = A[tx]
        with T.block("A"):
            vt = T.axis.spatial(128, tx)
            A[vt] = S[vt * 128]
`, `kernel "big_kernel": 65536 bytes of shared memory exceed sm_80's limit 49152 per block`},
		{"store on the host", `@T.prim_func
def host_store(A: T.Buffer((8,), "float32")):
    T.func_attr({"global_symbol": "host_store"})
    with T.block("first"):
        A[0] = T.float32(1)
    for tx in T.thread_binding(8, thread="threadIdx.x"):
        with T.block("A"):
            vi = T.axis.spatial(8, tx)
            A[vi] = T.float32(0)
`, `split host/device: function "host_store": store to "A" outside every thread-bound loop`},
		{"not a thread axis", `@T.prim_func
def lanes(A: T.Buffer((8,), "float32")):
    T.func_attr({"global_symbol": "lanes"})
    for tx in T.thread_binding(8, thread="warp.x"):
        with T.block("A"):
            vi = T.axis.spatial(8, tx)
            A[vi] = T.float32(0)
`, `"warp.x", which is not a GPU thread axis`},
		{"no default schedule", `@T.prim_func
def two(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32"), S: T.Buffer((1,), "float32")):
    T.func_attr({"global_symbol": "two"})
    for i in range(8):
        with T.block("B"):
            vi = T.axis.spatial(8, i)
            B[vi] = A[vi]
    for k in range(8):
        with T.block("S"):
            vk = T.axis.reduce(8, k)
            with T.init():
                S[0] = T.float32(0)
            S[0] = S[0] + B[vk]
`, `build: function "two": no default GPU schedule applies`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := compiler.Build(ctx, parse(tc.src), cudaTarget, nv)
			check.Error(t, err, tc.want)
		})
	}
}
