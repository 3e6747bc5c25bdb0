package cuda

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/transform"
	cudadev "github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/internal/check"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func sm80(t *testing.T) Limits {
	t.Helper()
	lim, err := ArchLimits("sm_80")
	check.NoError(t, err)
	return lim
}

// lower parses a TVMScript module and lowers it for this generator.
func lower(t *testing.T, name, src string) *ir.IRModule {
	t.Helper()
	m, err := script.Parse(name, src)
	check.NoError(t, err)
	l, err := transform.LowerModule(m, LowerOptions())
	check.NoError(t, err)
	return l
}

func kernelsModule(t *testing.T) *ir.IRModule {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", "kernels.py"))
	check.NoError(t, err)
	return lower(t, "kernels.py", string(src))
}

// TestGolden compares each kernel's generated CUDA with
// testdata/NAME.golden and checks its launch metadata.
func TestGolden(t *testing.T) {
	m := kernelsModule(t)
	want := map[string]Kernel{
		"add":     {Name: "add", Grid: [3]int64{16, 1, 1}, Block: [3]int64{256, 1, 1}},
		"scale2d": {Name: "scale2d", Grid: [3]int64{3, 8, 1}, Block: [3]int64{32, 8, 1}},
		"rowsum":  {Name: "rowsum", Grid: [3]int64{2, 1, 1}, Block: [3]int64{64, 1, 1}},
		// Shared memory: a barrier between threads' write and another
		// thread's read (shared_reverse), none where each thread reads its
		// own element (shared_same_thread), and in a loop of tiles one
		// before the read and one at the end of the body, before the next
		// tile overwrites what other threads still read (tiled_shift).
		"shared_reverse": {Name: "shared_reverse", Grid: [3]int64{4, 1, 1}, Block: [3]int64{64, 1, 1}, SharedBytes: 256},
		// Dynamic shared memory: two buffers, the second at 256 bytes.
		"dyn_reverse":        {Name: "dyn_reverse", Grid: [3]int64{4, 1, 1}, Block: [3]int64{64, 1, 1}, DynSharedBytes: 512},
		"shared_same_thread": {Name: "shared_same_thread", Grid: [3]int64{4, 1, 1}, Block: [3]int64{64, 1, 1}, SharedBytes: 256},
		"tiled_shift":        {Name: "tiled_shift", Grid: [3]int64{8, 1, 1}, Block: [3]int64{64, 1, 1}, SharedBytes: 256},
		"half_axpy":          {Name: "half_axpy", Grid: [3]int64{2, 1, 1}, Block: [3]int64{256, 1, 1}},
		"bf16_axpy":          {Name: "bf16_axpy", Grid: [3]int64{2, 1, 1}, Block: [3]int64{256, 1, 1}},
		"half_rowsum":        {Name: "half_rowsum", Grid: [3]int64{1, 1, 1}, Block: [3]int64{64, 1, 1}},
	}
	barriers := map[string]int{"add": 0, "scale2d": 0, "rowsum": 0, "shared_reverse": 1, "dyn_reverse": 1, "shared_same_thread": 0, "tiled_shift": 2}
	for name, f := range m.PrimFuncs() {
		t.Run(name, func(t *testing.T) {
			src, ks, err := Generate(ir.NewIRModule().With(name, f), sm80(t))
			check.NoError(t, err)
			check.Equal(t, len(ks), 1)
			w := want[name]
			check.Equal(t, ks[0].Grid, w.Grid)
			check.Equal(t, ks[0].Block, w.Block)
			check.Equal(t, ks[0].SharedBytes, w.SharedBytes)
			check.Equal(t, ks[0].DynSharedBytes, w.DynSharedBytes)
			check.Equal(t, strings.Count(src, "__syncthreads();"), barriers[name], "barriers in", name, src)
			path := filepath.Join("testdata", name+".golden")
			if *update {
				check.NoError(t, os.WriteFile(path, []byte(src), 0o644))
			}
			golden, err := os.ReadFile(path)
			check.NoError(t, err, "run go test -update")
			check.Equal(t, src, string(golden))
		})
	}
}

// TestNVRTC compiles every generated kernel to PTX and to a cubin for
// each architecture the installed NVRTC knows, and checks ptxas's resource
// report: no spills, shared memory as generated and within the limit.
func TestNVRTC(t *testing.T) {
	src, ks, err := Generate(kernelsModule(t), sm80(t))
	check.NoError(t, err)
	check.Equal(t, len(ks), 10)
	compileAll(t, src, ks)
}

// compileAll compiles src to PTX and to a cubin for every architecture the
// installed NVRTC knows (skipping when there is none) and checks ptxas's
// report of each kernel of ks.
func compileAll(t *testing.T, src string, ks []Kernel) {
	t.Helper()
	major, minor, _, err := cudadev.NVRTCVersion()
	if errors.Is(err, cudadev.ErrNoNVRTC) {
		t.Skipf("NVRTC is not installed (%v)", err)
	}
	check.NoError(t, err)
	for _, arch := range Archs {
		t.Run(arch, func(t *testing.T) {
			if need := nvrtcFor[arch]; major*10+minor < need {
				t.Skipf("NVRTC %d.%d cannot compile for %s (needs %d.%d)", major, minor, arch, need/10, need%10)
			}
			ptx, log, err := cudadev.CompilePTX(src, "kernels.cu", []string{"--gpu-architecture=compute_" + strings.TrimPrefix(arch, "sm_")})
			check.NoError(t, err, log)
			for _, k := range ks {
				check.True(t, strings.Contains(ptx, ".entry "+k.Name+"("), "no entry for", k.Name, "in PTX")
			}
			cubin, log, err := cudadev.CompileCUBIN(src, "kernels.cu", []string{"--gpu-architecture=" + arch, "--ptxas-options=-v"})
			check.NoError(t, err, log)
			check.True(t, len(cubin) > 4 && string(cubin[1:4]) == "ELF", "the cubin is not an ELF file")
			report, err := ParsePTXASReport(log)
			check.NoError(t, err)
			lim, err := ArchLimits(arch)
			check.NoError(t, err)
			for _, k := range ks {
				res, ok := report[k.Name]
				check.True(t, ok, "ptxas reported nothing for", k.Name, "in", log)
				check.Equal(t, res.Arch, arch)
				check.True(t, res.Registers > 0, k.Name, "uses no registers?", log)
				check.Equal(t, res.SharedBytes, k.SharedBytes, k.Name)
				check.NoError(t, res.Check(k.Name, lim))
			}
		})
	}
}

// nvrtcFor is the NVRTC version (major*10+minor) that first compiles for
// each architecture.
var nvrtcFor = map[string]int{"sm_80": 110, "sm_86": 111, "sm_89": 118, "sm_90": 118}

func TestErrors(t *testing.T) {
	kernel := func(body string) string {
		return `# from tvm.script import tir as T
@T.prim_func
def k(A: T.Buffer((4096,), "float32")):
    T.func_attr({"global_symbol": "k"})
` + body
	}
	cases := []struct{ name, src, want string }{
		{"read out of bounds", kernel(`    for bx in T.thread_binding(16, thread="blockIdx.x"):
        for tx in T.thread_binding(256, thread="threadIdx.x"):
            with T.block("A"):
                vi = T.axis.spatial(4096, bx * 256 + tx)
                A[vi] = A[vi + 1] * T.float32(2)
`), `kernel "k" reads "A" at`},
		{"write out of bounds", kernel(`    for bx in T.thread_binding(17, thread="blockIdx.x"):
        for tx in T.thread_binding(256, thread="threadIdx.x"):
            A[bx * 256 + tx] = T.float32(2)
`), `which reaches 4351: outside its 4096 elements`},
		{"misaligned vector copy", kernel(`    B = T.alloc_buffer((1024,), scope="shared")
    for tx in T.thread_binding(255, thread="threadIdx.x"):
        for v in T.vectorized(4):
            with T.block("B"):
                vi = T.axis.spatial(1024, tx * 4 + v)
                B[vi] = A[vi + 2]
        with T.block("A"):
            vi = T.axis.spatial(255, tx)
            A[vi] = B[vi]
`), `kernel "k": vector access to "A" at T.Ramp(((tx * 4) + 2), 1, 4) is not provably aligned to its 16 bytes (the first index must be a multiple of 4)`},
		{"too many threads", kernel(`    for ty in T.thread_binding(2, thread="threadIdx.y"):
        for tx in T.thread_binding(1024, thread="threadIdx.x"):
            with T.block("A"):
                vi = T.axis.spatial(4096, ty * 1024 + tx)
                A[vi] = T.float32(1)
`), `kernel "k": 2048 threads per block exceed sm_80's limit 1024`},
		{"block dim", kernel(`    for tz in T.thread_binding(128, thread="threadIdx.z"):
        with T.block("A"):
            vi = T.axis.spatial(4096, tz)
            A[vi] = T.float32(1)
`), `kernel "k": threadIdx.z extent 128 exceeds sm_80's limit 64`},
		{"inconsistent", kernel(`    for bx in T.thread_binding(2, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.block("A"):
                vi = T.axis.spatial(4096, bx * 128 + tx)
                A[vi] = T.float32(1)
        for tx2 in T.thread_binding(128, thread="threadIdx.x"):
            with T.block("B"):
                vi = T.axis.spatial(4096, bx * 128 + tx2)
                A[vi] = T.float32(2)
`), `kernel "k": threadIdx.x is bound with extent 64 and with extent 128 (loop "tx2")`},
		{"two nests", kernel(`    for bx in T.thread_binding(4, thread="blockIdx.x"):
        with T.block("A"):
            vi = T.axis.spatial(4096, bx)
            A[vi] = T.float32(1)
    for bx2 in T.thread_binding(4, thread="blockIdx.x"):
        with T.block("B"):
            vi = T.axis.spatial(4096, bx2 + 4)
            A[vi] = A[vi - 4]
`), `kernel "k": 2 thread-bound loop nests in sequence`},
		{"unbound store", kernel(`    for i in range(4096):
        with T.block("A"):
            vi = T.axis.spatial(4096, i)
            A[vi] = T.float32(1)
`), `kernel "k": store to "A" outside every thread-bound loop`},
		{"unknown axis", kernel(`    for v in T.thread_binding(4, thread="warpIdx.x"):
        with T.block("A"):
            vi = T.axis.spatial(4096, v)
            A[vi] = T.float32(1)
`), `kernel "k": loop "v" is bound to "warpIdx.x", which is not a CUDA thread axis`},
		{"parallel", kernel(`    for i in T.parallel(4096):
        with T.block("A"):
            vi = T.axis.spatial(4096, i)
            A[vi] = T.float32(1)
`), `kernel "k": loop "i" is parallel`},
		{"shared past limit", kernel(`    S = T.alloc_buffer((16384,), scope="shared")
    for tx in T.thread_binding(64, thread="threadIdx.x"):
        for j in range(256):
            with T.block("S"):
                vi = T.axis.spatial(16384, tx * 256 + j)
                S[vi] = A[vi % 4096]
        with T.block("A"):
            vi = T.axis.spatial(4096, tx)
            A[vi] = S[vi * 4]
`), `kernel "k": 65536 bytes of shared memory exceed sm_80's limit 49152 per block`},
		{"dynamic shared past limit", kernel(`    S = T.alloc_buffer((50000,), scope="shared.dyn")
    for tx in T.thread_binding(50, thread="threadIdx.x"):
        for j in range(1000):
            with T.block("S"):
                vi = T.axis.spatial(50000, tx * 1000 + j)
                S[vi] = A[vi % 4096]
        with T.block("A"):
            vi = T.axis.spatial(4096, tx)
            A[vi] = S[vi * 1000]
`), `kernel "k": 0 bytes of static and 200000 of dynamic shared memory exceed sm_80's limit 166912 per block`},
		{"vector", kernel(`    for tx in T.thread_binding(64, thread="threadIdx.x"):
        for v in T.vectorized(4):
            with T.block("A"):
                vi = T.axis.spatial(4096, tx * 4 + v)
                A[vi] = A[vi] + T.float32(1)
`), `kernel "k": vector type float32x4`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := Generate(lower(t, "k.py", c.src), sm80(t))
			check.Error(t, err, c.want)
		})
	}
	t.Run("packed", func(t *testing.T) {
		m, err := script.Parse("k.py", kernel(`    for tx in T.thread_binding(4, thread="threadIdx.x"):
        with T.block("A"):
            vi = T.axis.spatial(4096, tx)
            A[vi] = T.float32(1)
`))
		check.NoError(t, err)
		l, err := transform.LowerModule(m, transform.Options{})
		check.NoError(t, err)
		_, _, err = Generate(l, sm80(t))
		check.Error(t, err, "packed API")
	})
	t.Run("arch", func(t *testing.T) {
		_, err := ArchLimits("sm_70")
		check.Error(t, err, `"sm_70" is not supported`)
	})
}

// TestVectorAlignment: a vector copy whose addresses are multiples of its
// size becomes vector loads and stores; one whose index, or whose buffer's
// elem_offset, is not provably a multiple of the lanes is refused naming
// the kernel and the buffer (on the GPU it would fault).
func TestVectorAlignment(t *testing.T) {
	copyKernel := func(param, index string) string {
		return `# from tvm.script import tir as T
@T.prim_func
def k(` + param + `, B: T.Buffer((1024,), "float32")):
    T.func_attr({"global_symbol": "k"})
    for tx in T.thread_binding(255, thread="threadIdx.x"):
        for v in T.vectorized(4):
            with T.block("B"):
                vi = T.axis.spatial(1024, tx * 4 + v)
                B[vi] = A[` + index + `]
`
	}
	src, _, err := Generate(lower(t, "k.py", copyKernel(`A: T.Buffer((1024,), "float32")`, "vi")), sm80(t))
	check.NoError(t, err)
	check.True(t, strings.Contains(src, "kiln_vstore_float32x4(&B[(tx * 4)], kiln_vload_float32x4(&A[(tx * 4)]));"), "no vector copy in", src)
	_, _, err = Generate(lower(t, "k.py", copyKernel(`A: T.Buffer((1024,), "float32")`, "vi + 1")), sm80(t))
	check.Error(t, err, `kernel "k": vector access to "A" at T.Ramp(((tx * 4) + 1), 1, 4) is not provably aligned to its 16 bytes (the first index must be a multiple of 4)`)
	_, _, err = Generate(lower(t, "k.py", copyKernel(`A: T.Buffer((1024,), "float32", elem_offset=2)`, "vi")), sm80(t))
	check.Error(t, err, `kernel "k": vector access to "A" at T.Ramp(((tx * 4) + 2), 1, 4) is not provably aligned`)
	_, _, err = Generate(lower(t, "k.py", copyKernel(`A: T.Buffer((1024,), "float32", elem_offset=8)`, "vi")), sm80(t))
	check.NoError(t, err)
}
