package cuda

import (
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/transform"
	cudadev "github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// TestDefaultSchedule gives each function of testdata/unscheduled.py the
// default GPU schedule, generates CUDA, compiles it with NVRTC for every
// architecture (no spills), and runs it on the host against the
// interpreter's run of the unscheduled function.
func TestDefaultSchedule(t *testing.T) {
	text, err := os.ReadFile(filepath.Join("testdata", "unscheduled.py"))
	check.NoError(t, err)
	orig, err := script.Parse("unscheduled.py", string(text))
	check.NoError(t, err)
	scheduled := ir.NewIRModule()
	for name, f := range orig.PrimFuncs() {
		g, err := auto.GPUFunc(f, auto.GPUOptions{})
		check.NoError(t, err, name)
		scheduled = scheduled.With(name, g)
	}
	lowered, err := transform.LowerModule(scheduled, LowerOptions())
	check.NoError(t, err)
	src, ks, err := Generate(lowered, sm80(t))
	check.NoError(t, err)
	want := map[string][2]int64{"relu": {19, 256}, "add_bias": {128, 256}, "row_sum": {100, 64}, "row_sum_long": {6, 256}, "small": {1, 5},
		"gemv_bias": {40, 64}, "scale_relu": {2, 256}, "matmul": {2, 12}, "matmul_bias_relu": {1, 16},
		"softmax": {8, 32}, "softmax_3d": {6, 128}, "layer_norm": {8, 32}}
	check.Equal(t, len(ks), len(want))
	for _, k := range ks {
		check.Equal(t, [2]int64{k.Grid[0], k.Block[0]}, want[k.Name], k.Name)
	}
	// The matmuls stage tiles of A and B in shared memory: a 64×16 tile of
	// A and a 16×48 (16×64) tile of B per block. matmul's 192 threads copy
	// A's 256 vectors in two rounds, the second guarded, and its buffer
	// covers the rows of both whole rounds (96).
	shared := map[string]int64{}
	for _, k := range ks {
		shared[k.Name] = k.SharedBytes
	}
	check.Equal(t, shared["matmul"], int64((96*16+16*48)*4))
	check.Equal(t, shared["matmul_bias_relu"], int64((64*16+16*64)*4))
	// The cross-thread sums end in warp shuffles.
	check.True(t, strings.Count(src, "__shfl_down_sync(") >= 5*9, "warp shuffles in the row sums, the GEMV, softmax and layer norm")
	// Their global→shared copies are float4 loads and stores.
	check.True(t, strings.Contains(src, "kiln_vstore_float32x4(&A_shared["), "no vector copy of A's tile in", src)
	check.True(t, strings.Contains(src, "kiln_vstore_float32x4(&B_shared["), "no vector copy of B's tile")
	t.Run("nvrtc", func(t *testing.T) {
		compileAll(t, src, ks)
		ptx, log, err := cudadev.CompilePTX(src, "kernels.cu", []string{"--gpu-architecture=compute_80"})
		check.NoError(t, err, log)
		check.True(t, strings.Contains(ptx, ".v4.f32"), "the tile copies are no vector loads in the PTX")
	})
	t.Run("emulate", func(t *testing.T) { emulate(t, orig, src, ks) })
	t.Run("interpreter", func(t *testing.T) {
		interpretBoth(t, orig, scheduled, map[string]bool{"row_sum": true, "row_sum_long": true, "gemv_bias": true, "softmax": true, "softmax_3d": true, "layer_norm": true})
	})
}

// interpretBoth runs every function of ref and its scheduled version in
// got with the interpreter (the scheduled one with CUDA's block and thread
// semantics and its shared-memory race checks) on the same random inputs,
// and requires the same bits in every buffer (equal up to rounding for the
// functions in reordered, whose sums run in another order).
func interpretBoth(t *testing.T, ref, got *ir.IRModule, reordered map[string]bool) {
	rng := rand.New(rand.NewSource(2))
	for name, f := range ref.PrimFuncs() {
		g := got.PrimFunc(name)
		check.True(t, g != nil, "no scheduled", name)
		var want, have []any
		var wantArrays, haveArrays []*ndarray.NDArray
		for _, p := range f.Params {
			b, ok := f.BufferMap[p]
			if !ok {
				want, have = append(want, float32(1.5)), append(have, float32(1.5))
				continue
			}
			shape := ndarray.Shape{}
			for _, s := range b.Shape {
				v, ok := ir.IsConstInt(s)
				check.True(t, ok, name, "buffer", b.Name, "has a symbolic shape")
				shape = append(shape, v)
			}
			data := make([]float32, shape.NumElements())
			for j := range data {
				data[j] = rng.Float32()*2 - 1
			}
			a, err := ndarray.FromSlice(append([]float32(nil), data...), shape)
			check.NoError(t, err)
			c, err := ndarray.FromSlice(data, shape)
			check.NoError(t, err)
			want, have = append(want, a), append(have, c)
			wantArrays, haveArrays = append(wantArrays, a), append(haveArrays, c)
		}
		check.NoError(t, interp.Run(f, want...), name)
		check.NoError(t, interp.Run(g, have...), name, "scheduled")
		for i := range wantArrays {
			w, err := ndarray.ToSlice[float32](wantArrays[i])
			check.NoError(t, err)
			h, err := ndarray.ToSlice[float32](haveArrays[i])
			check.NoError(t, err)
			if !reordered[name] {
				check.Equal(t, h, w, name, "buffer", i)
				continue
			}
			// A cross-thread sum adds in another order: equal up to rounding.
			for j := range w {
				if d := math.Abs(float64(h[j]) - float64(w[j])); d > 1e-5*math.Max(1, math.Abs(float64(w[j]))) {
					t.Fatalf("%s buffer %d element %d: scheduled %g, unscheduled %g", name, i, j, h[j], w[j])
				}
			}
		}
	}
}

func TestDefaultScheduleErrors(t *testing.T) {
	// The sum reads all of B, which no one thread produced: it cannot run
	// in the threads of block B.
	src := `# from tvm.script import tir as T
@T.prim_func
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
`
	m, err := script.Parse("two.py", src)
	check.NoError(t, err)
	for _, f := range m.PrimFuncs() {
		_, err := auto.GPUFunc(f, auto.GPUOptions{})
		check.Error(t, err, `gpu schedule: block "S" cannot run in the threads of block "B"`)
	}
}
