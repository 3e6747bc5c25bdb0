package auto

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// gpuRuleCase is a function one GPU rule schedules.
type gpuRuleCase struct {
	name string
	src  string
}

// scheduleGPURule applies the GPU rule named rule to f on the schedule of
// f with its producers inlined, requires it to apply, and returns the
// schedule.
func scheduleGPURule(t *testing.T, f *ir.PrimFunc, rule func(*schedule.Schedule, []*ir.BlockRealize, GPUOptions) (bool, error)) *schedule.Schedule {
	t.Helper()
	in := &gpuIn{f: f, opts: GPUOptions{ThreadsPerBlock: 256}}
	blocks, err := in.prepare()
	check.NoError(t, err)
	s := in.inlined.Copy()
	ok, err := rule(s, blocks, in.opts)
	check.NoError(t, err)
	check.True(t, ok, "the rule does not apply")
	return s
}

// checkGPURule: the rule's trace replays to the same function, and the
// scheduled function (run with CUDA's thread semantics and shared-memory
// race checks) computes what the unscheduled one does, within tol.
func checkGPURule(t *testing.T, f *ir.PrimFunc, s *schedule.Schedule, tol float64) {
	t.Helper()
	r, err := schedule.Replay(f, s.Trace())
	check.NoError(t, err)
	check.Equal(t, script.Print(r.Func()), script.Print(s.Func()))
	sameOutput(t, f, s.Func(), tol)
}

// TestSharedMatmulRule: the shared-memory matmul rule, made of schedule
// primitives only, on sizes whose tiles leave a guarded tail in the
// copies (48×40 threads of 12×10, tiles of k of 12), with a bias and
// ReLU epilogue inlined into the copy back, and on a plain matmul whose
// output is a parameter.
func TestSharedMatmulRule(t *testing.T) {
	for _, c := range []gpuRuleCase{
		{"dense", fusedDense(48, 40, 24, false)},
		{"matmul", `
@T.prim_func(private=True)
def mm(A: T.Buffer((96, 40), "float32"), B: T.Buffer((40, 64), "float32"), C: T.Buffer((96, 64), "float32")):
    T.func_attr({"tir.noalias": T.bool(True)})
    for i, j, k in T.grid(96, 64, 40):
        with T.block("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0.0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
`},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := parseFunc(t, c.src)
			s := scheduleGPURule(t, f, sharedMatmul)
			checkGPURule(t, f, s, 0)
			// The accumulator is one thread's register tile of 4×4.
			var accs []string
			ir.Visit(s.Func().Body, func(n ir.Node) bool {
				if b, ok := n.(*ir.Block); ok {
					for _, a := range b.AllocBuffers {
						if a.StorageScope() == "local" {
							accs = append(accs, a.Name)
						}
					}
				}
				return true
			})
			check.Equal(t, len(accs), 1)
		})
	}
}

// TestRowReductionRule: the row-reduction rule, made of schedule
// primitives only (its cross-thread sum lowered by
// lower_cross_thread_reduction), on a row sum whose threads do not divide
// the row (77 values, 64 threads), over two fused spatial loops, and on a
// GEMV whose intermediate sum feeds a bias add and ReLU.
func TestRowReductionRule(t *testing.T) {
	for _, c := range []gpuRuleCase{
		{"row_sum", `
@T.prim_func(private=True)
def row_sum(A: T.Buffer((10, 77), "float32"), S: T.Buffer((10,), "float32")):
    for i, k in T.grid(10, 77):
        with T.block("S"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                S[vi] = T.float32(0)
            S[vi] = S[vi] + A[vi, vk]
`},
		{"row_sum_2d", `
@T.prim_func(private=True)
def row_sum_2d(A: T.Buffer((3, 5, 300), "float32"), S: T.Buffer((3, 5), "float32")):
    for i, j, k in T.grid(3, 5, 300):
        with T.block("S"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                S[vi, vj] = T.float32(0)
            S[vi, vj] = S[vi, vj] + A[vi, vj, vk] * T.float32(0.5)
`},
		{"gemv_bias_relu", `
@T.prim_func(private=True)
def gemv(A: T.Buffer((7, 130), "float32"), x: T.Buffer((130,), "float32"), b: T.Buffer((7,), "float32"), y: T.Buffer((7,), "float32")):
    t = T.alloc_buffer((7,), "float32")
    u = T.alloc_buffer((7,), "float32")
    for i, k in T.grid(7, 130):
        with T.block("t"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                t[vi] = T.float32(0)
            t[vi] = t[vi] + A[vi, vk] * x[vk]
    for i in range(7):
        with T.block("u"):
            vi = T.axis.spatial(7, i)
            u[vi] = t[vi] + b[vi]
    for i in range(7):
        with T.block("y"):
            vi = T.axis.spatial(7, i)
            y[vi] = T.max(u[vi], T.float32(0))
`},
	} {
		t.Run(c.name, func(t *testing.T) { checkFuncRule(t, c.src, rowReduction) })
	}
}

// checkFuncRule applies rule, one that schedules a function as it is, to
// the function of src, requires it to apply, and checks it as
// checkGPURule does (results within rounding of a reordered sum).
func checkFuncRule(t *testing.T, src string, rule func(*schedule.Schedule, GPUOptions) (bool, error)) {
	t.Helper()
	f := parseFunc(t, src)
	s, err := schedule.New(f)
	check.NoError(t, err)
	ok, err := rule(s, GPUOptions{})
	check.NoError(t, err)
	check.True(t, ok, "the rule does not apply")
	checkGPURule(t, f, s, 1e-5)
}

// TestRowPipelineRule: the row-pipeline rule, made of schedule
// primitives only, on a softmax whose threads do not divide the row (77
// values, 64 threads) and a layer norm over two fused spatial loops (rows
// of 40, 32 threads).
func TestRowPipelineRule(t *testing.T) {
	for _, c := range []gpuRuleCase{
		{"softmax", `
@T.prim_func(private=True)
def softmax(A: T.Buffer((5, 77), "float32"), B: T.Buffer((5, 77), "float32")):
    mx = T.alloc_buffer((5,), "float32")
    e = T.alloc_buffer((5, 77), "float32")
    s = T.alloc_buffer((5,), "float32")
    for i, k in T.grid(5, 77):
        with T.block("max"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                mx[vi] = T.float32(-3.4028234663852886e38)
            mx[vi] = T.max(mx[vi], A[vi, vk])
    for i, j in T.grid(5, 77):
        with T.block("exp"):
            vi, vj = T.axis.remap("SS", [i, j])
            e[vi, vj] = T.exp(A[vi, vj] - mx[vi])
    for i, k in T.grid(5, 77):
        with T.block("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                s[vi] = T.float32(0)
            s[vi] = s[vi] + e[vi, vk]
    for i, j in T.grid(5, 77):
        with T.block("norm"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = e[vi, vj] / s[vi]
`},
		{"layer_norm", `
@T.prim_func(private=True)
def layer_norm(A: T.Buffer((3, 2, 40), "float32"), B: T.Buffer((3, 2, 40), "float32")):
    s = T.alloc_buffer((3, 2), "float32")
    v = T.alloc_buffer((3, 2), "float32")
    for i, j, k in T.grid(3, 2, 40):
        with T.block("sum"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                s[vi, vj] = T.float32(0)
            s[vi, vj] = s[vi, vj] + A[vi, vj, vk]
    for i, j, k in T.grid(3, 2, 40):
        with T.block("var"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                v[vi, vj] = T.float32(0)
            v[vi, vj] = v[vi, vj] + (A[vi, vj, vk] - s[vi, vj] * T.float32(0.025)) * (A[vi, vj, vk] - s[vi, vj] * T.float32(0.025))
    for i, j, k in T.grid(3, 2, 40):
        with T.block("norm"):
            vi, vj, vk = T.axis.remap("SSS", [i, j, k])
            B[vi, vj, vk] = (A[vi, vj, vk] - s[vi, vj] * T.float32(0.025)) / T.sqrt(v[vi, vj] * T.float32(0.025) + T.float32(1e-5))
`},
	} {
		t.Run(c.name, func(t *testing.T) { checkFuncRule(t, c.src, rowPipeline) })
	}
}

// checkGPUChoices schedules f with the default GPU rules under draws
// random sets of choices (seeded, so a failure repeats) and checks each
// against the unscheduled function in the interpreter (CUDA's thread
// semantics, shared-memory race checks) within tol, and that its trace,
// where the rule has one, replays to it; the rule must be rule each
// time. It returns the sites the rule asked. Functions of bfloat16
// operands run on operands exact in bfloat16 (see bf16Output).
func checkGPUChoices(t *testing.T, f *ir.PrimFunc, rule string, draws int, tol float64) []string {
	t.Helper()
	sites := map[string]bool{}
	for seed := range draws {
		d := &drawn{rng: rand.New(rand.NewPCG(uint64(seed), 11)), picked: map[string]int{}}
		a, err := ApplyGPU(f, GPUOptions{Decide: d})
		if err != nil {
			t.Fatalf("draw %d %v: %v", seed, d.picked, err)
		}
		check.Equal(t, a.Rule, rule, "draw ", seed)
		for s := range d.picked {
			sites[s] = true
		}
		check.NoError(t, ir.Verify(a.Func))
		if f.ParamBuffer(0).DType == ndarray.BFloat16 {
			check.Equal(t, bf16Output(t, a.Func), bf16Output(t, f), "draw ", seed, d.picked)
		} else {
			sameOutput(t, f, a.Func, tol)
		}
		r, err := schedule.Replay(f, a.Trace)
		check.NoError(t, err)
		check.Equal(t, script.Print(r.Func()), script.Print(a.Func), "draw ", seed, ": the trace replays to another function")
	}
	out := make([]string, 0, len(sites))
	for s := range sites {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// bf16Output runs f, whose parameters but the last are bfloat16 and
// whose last is float32, on operands that are multiples of 1/64 in
// [-1, 1] (exact in bfloat16, their products and sums exact in float32
// for short sums) and returns the last parameter's elements.
func bf16Output(t *testing.T, f *ir.PrimFunc) []float32 {
	t.Helper()
	rng := rand.New(rand.NewPCG(5, 1))
	var args []any
	var out *ndarray.NDArray
	for i := range f.Params {
		b := f.ParamBuffer(i)
		shape := ndarray.Shape{}
		for _, e := range b.Shape {
			v, ok := ir.IsConstInt(e)
			check.True(t, ok, "static shape")
			shape = append(shape, v)
		}
		n := shape.NumElements()
		raw := make([]byte, n*int64(b.DType.Size()))
		for j := range n {
			x := float32(rng.IntN(129)-64) / 64
			switch b.DType {
			case ndarray.BFloat16:
				binary.LittleEndian.PutUint16(raw[2*j:], uint16(math.Float32bits(x)>>16))
			case ir.Float32:
				binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(x))
			default:
				t.Fatalf("parameter %q is %s", b.Name, b.DType)
			}
		}
		a, err := ndarray.FromBytes(raw, shape, b.DType, devices.CPUDevice)
		check.NoError(t, err)
		args, out = append(args, a), a
	}
	check.NoError(t, interp.Run(f, args...))
	vs, err := ndarray.ToSlice[float32](out)
	check.NoError(t, err)
	return vs
}

// TestGPUChoices: every GPU rule's choices (threads per block; the
// shared-memory matmul's register tile, threads and tile of k; the
// tensor-core matmul's fragments and warps per warp and block and tile of
// k) give, whatever is drawn, a schedule that computes what the
// unscheduled function does, on sizes that leave tails.
func TestGPUChoices(t *testing.T) {
	for _, c := range []struct {
		name, rule string
		src        string
		tol        float64
		sites      []string
	}{
		{"fallback", "fallback", `
@T.prim_func(private=True)
def relu(A: T.Buffer((9, 111), "float32"), B: T.Buffer((9, 111), "float32")):
    for i, j in T.grid(9, 111):
        with T.block("B"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = T.max(A[vi, vj], T.float32(0))
`, 0, []string{"gpu_fallback/B/threads"}},
		{"row_reduction", "row reduction", `
@T.prim_func(private=True)
def row_sum(A: T.Buffer((6, 300), "float32"), S: T.Buffer((6,), "float32")):
    for i, k in T.grid(6, 300):
        with T.block("S"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                S[vi] = T.float32(0)
            S[vi] = S[vi] + A[vi, vk]
`, 1e-5, []string{"gpu_row_reduction/S/threads"}},
		{"row_pipeline", "row pipeline", `
@T.prim_func(private=True)
def softmax(A: T.Buffer((3, 200), "float32"), B: T.Buffer((3, 200), "float32")):
    mx = T.alloc_buffer((3,), "float32")
    s = T.alloc_buffer((3,), "float32")
    for i, k in T.grid(3, 200):
        with T.block("max"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                mx[vi] = T.float32(-3.4028234663852886e38)
            mx[vi] = T.max(mx[vi], A[vi, vk])
    for i, k in T.grid(3, 200):
        with T.block("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                s[vi] = T.float32(0)
            s[vi] = s[vi] + T.exp(A[vi, vk] - mx[vi])
    for i, j in T.grid(3, 200):
        with T.block("norm"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = T.exp(A[vi, vj] - mx[vi]) / s[vi]
`, 1e-5, []string{"gpu_row_pipeline/norm/threads"}},
		{"shared_matmul", "shared-memory matmul", fusedDense(48, 40, 24, false), 1e-5,
			[]string{"gpu_matmul_shared/matmul/threads_x", "gpu_matmul_shared/matmul/threads_y", "gpu_matmul_shared/matmul/tile_cols", "gpu_matmul_shared/matmul/tile_k", "gpu_matmul_shared/matmul/tile_rows"}},
		{"tensor_core", "tensor-core matmul", `
@T.prim_func(private=True)
def mm(A: T.Buffer((64, 64), "bfloat16"), B: T.Buffer((64, 48), "bfloat16"), C: T.Buffer((64, 48), "float32")):
    for i, j, k in T.grid(64, 48, 64):
        with T.block("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + T.Cast("float32", A[vi, vk]) * T.Cast("float32", B[vk, vj])
`, 1e-5, []string{"gpu_mma/C/frags_m", "gpu_mma/C/frags_n", "gpu_mma/C/tile_k", "gpu_mma/C/warps_m", "gpu_mma/C/warps_n"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			draws := 6
			if testing.Short() {
				draws = 3
			}
			check.Equal(t, strings.Join(checkGPUChoices(t, parseFunc(t, c.src), c.rule, draws, c.tol), " "), strings.Join(c.sites, " "))
		})
	}
}
