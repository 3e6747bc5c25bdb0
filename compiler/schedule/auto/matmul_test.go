package auto

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/transform"
	_ "github.com/kiln-ml/kiln/devices/cpu" // host arrays for the interpreter
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/ckernel"
	"github.com/kiln-ml/kiln/ndarray"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// fusedDense is the shape FuseTIR gives a Linear layer after
// LiftTransformParams: x[m, k] times w[k, n] (n contiguous), plus bias,
// then relu. With wT the weight is read as w[j, k] instead.
func fusedDense(m, n, k int, wT bool) string {
	wShape, wIdx := fmt.Sprintf("T.int64(%d), T.int64(%d)", k, n), "w[v_k, v_j]"
	if wT {
		wShape, wIdx = fmt.Sprintf("T.int64(%d), T.int64(%d)", n, k), "w[v_j, v_k]"
	}
	return fmt.Sprintf(`
@T.prim_func(private=True)
def dense(x: T.Buffer((T.int64(%[1]d), T.int64(%[3]d)), "float32"), w: T.Buffer((%[4]s), "float32"), b: T.Buffer((T.int64(%[2]d),), "float32"), out: T.Buffer((T.int64(%[1]d), T.int64(%[2]d)), "float32")):
    T.func_attr({"tir.noalias": T.bool(True)})
    mm = T.alloc_buffer((T.int64(%[1]d), T.int64(%[2]d)))
    for i, j, k in T.grid(T.int64(%[1]d), T.int64(%[2]d), T.int64(%[3]d)):
        with T.block("matmul"):
            v_i, v_j, v_k = T.axis.remap("SSR", [i, j, k])
            T.reads(x[v_i, v_k], %[5]s)
            T.writes(mm[v_i, v_j])
            with T.init():
                mm[v_i, v_j] = T.float32(0.0)
            mm[v_i, v_j] = mm[v_i, v_j] + x[v_i, v_k] * %[5]s
    for i, j in T.grid(T.int64(%[1]d), T.int64(%[2]d)):
        with T.block("compute"):
            v_i, v_j = T.axis.remap("SS", [i, j])
            T.reads(mm[v_i, v_j], b[v_j])
            T.writes(out[v_i, v_j])
            out[v_i, v_j] = T.max(mm[v_i, v_j] + b[v_j], T.float32(0.0))
`, m, n, k, wShape, wIdx)
}

// residualDense is a transformer's second feed-forward layer: x[1, m, k]
// times w[k, n], plus bias, plus the residual r[1, m, n].
func residualDense(m, n, k int) string {
	return fmt.Sprintf(`
@T.prim_func(private=True)
def ffn(x: T.Buffer((T.int64(1), T.int64(%[1]d), T.int64(%[3]d)), "float32"), w: T.Buffer((T.int64(%[3]d), T.int64(%[2]d)), "float32"), b: T.Buffer((T.int64(%[2]d),), "float32"), r: T.Buffer((T.int64(1), T.int64(%[1]d), T.int64(%[2]d)), "float32"), out: T.Buffer((T.int64(1), T.int64(%[1]d), T.int64(%[2]d)), "float32")):
    T.func_attr({"tir.noalias": T.bool(True)})
    mm = T.alloc_buffer((T.int64(1), T.int64(%[1]d), T.int64(%[2]d)))
    biased = T.alloc_buffer((T.int64(1), T.int64(%[1]d), T.int64(%[2]d)))
    for a, i, j, k in T.grid(T.int64(1), T.int64(%[1]d), T.int64(%[2]d), T.int64(%[3]d)):
        with T.block("matmul"):
            v_a, v_i, v_j, v_k = T.axis.remap("SSSR", [a, i, j, k])
            T.reads(x[v_a, v_i, v_k], w[v_k, v_j])
            T.writes(mm[v_a, v_i, v_j])
            with T.init():
                mm[v_a, v_i, v_j] = T.float32(0.0)
            mm[v_a, v_i, v_j] = mm[v_a, v_i, v_j] + x[v_a, v_i, v_k] * w[v_k, v_j]
    for a, i, j in T.grid(T.int64(1), T.int64(%[1]d), T.int64(%[2]d)):
        with T.block("bias"):
            v_a, v_i, v_j = T.axis.remap("SSS", [a, i, j])
            T.reads(mm[v_a, v_i, v_j], b[v_j])
            T.writes(biased[v_a, v_i, v_j])
            biased[v_a, v_i, v_j] = mm[v_a, v_i, v_j] + b[v_j]
    for a, i, j in T.grid(T.int64(1), T.int64(%[1]d), T.int64(%[2]d)):
        with T.block("residual"):
            v_a, v_i, v_j = T.axis.remap("SSS", [a, i, j])
            T.reads(r[v_a, v_i, v_j], biased[v_a, v_i, v_j])
            T.writes(out[v_a, v_i, v_j])
            out[v_a, v_i, v_j] = r[v_a, v_i, v_j] + biased[v_a, v_i, v_j]
`, m, n, k)
}

// batchMatmul is a batched matmul a[b, m, k] × w[b, k, n].
func batchMatmul(bs, m, n, k int) string {
	return fmt.Sprintf(`
@T.prim_func(private=True)
def bmm(a: T.Buffer((T.int64(%[1]d), T.int64(%[2]d), T.int64(%[4]d)), "float32"), w: T.Buffer((T.int64(%[1]d), T.int64(%[4]d), T.int64(%[3]d)), "float32"), c: T.Buffer((T.int64(%[1]d), T.int64(%[2]d), T.int64(%[3]d)), "float32")):
    T.func_attr({"tir.noalias": T.bool(True)})
    for b, i, j, k in T.grid(T.int64(%[1]d), T.int64(%[2]d), T.int64(%[3]d), T.int64(%[4]d)):
        with T.block("matmul"):
            v_b, v_i, v_j, v_k = T.axis.remap("SSSR", [b, i, j, k])
            T.reads(a[v_b, v_i, v_k], w[v_b, v_k, v_j])
            T.writes(c[v_b, v_i, v_j])
            with T.init():
                c[v_b, v_i, v_j] = T.float32(0.0)
            c[v_b, v_i, v_j] = c[v_b, v_i, v_j] + a[v_b, v_i, v_k] * w[v_b, v_k, v_j]
`, bs, m, n, k)
}

// sharedWeight is x[b, m, k] × w[k, n]: rows over two loops, one weight.
func sharedWeight(bs, m, n, k int) string {
	return fmt.Sprintf(`
@T.prim_func(private=True)
def dense3(x: T.Buffer((T.int64(%[1]d), T.int64(%[2]d), T.int64(%[4]d)), "float32"), w: T.Buffer((T.int64(%[4]d), T.int64(%[3]d)), "float32"), c: T.Buffer((T.int64(%[1]d), T.int64(%[2]d), T.int64(%[3]d)), "float32")):
    T.func_attr({"tir.noalias": T.bool(True)})
    for b, i, j, k in T.grid(T.int64(%[1]d), T.int64(%[2]d), T.int64(%[3]d), T.int64(%[4]d)):
        with T.block("matmul"):
            v_b, v_i, v_j, v_k = T.axis.remap("SSSR", [b, i, j, k])
            T.reads(x[v_b, v_i, v_k], w[v_k, v_j])
            T.writes(c[v_b, v_i, v_j])
            with T.init():
                c[v_b, v_i, v_j] = T.float32(0.0)
            c[v_b, v_i, v_j] = c[v_b, v_i, v_j] + x[v_b, v_i, v_k] * w[v_k, v_j]
`, bs, m, n, k)
}

func parseFunc(t *testing.T, src string) *ir.PrimFunc {
	t.Helper()
	mod, err := script.Parse("test.py", src)
	check.NoError(t, err)
	for _, f := range mod.PrimFuncs() {
		return f
	}
	t.Fatal("no PrimFunc")
	return nil
}

// randomArgs makes one array per buffer parameter of f, filled with
// values in [-1, 1).
func randomArgs(t *testing.T, f *ir.PrimFunc, seed uint64) []any {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	var args []any
	for i := range f.Params {
		b := f.ParamBuffer(i)
		shape := make(ndarray.Shape, len(b.Shape))
		n := 1
		for d, e := range b.Shape {
			c, ok := e.(*ir.IntImm)
			check.True(t, ok, "static shape")
			shape[d] = c.Value
			n *= int(c.Value)
		}
		xs := make([]float32, n)
		for j := range xs {
			xs[j] = rng.Float32()*2 - 1
		}
		a, err := ndarray.FromSlice(xs, shape)
		check.NoError(t, err)
		args = append(args, a)
	}
	return args
}

// outputOf runs f (through the interpreter) on fresh copies of the
// same inputs and returns its last argument's elements.
func outputOf(t *testing.T, f *ir.PrimFunc) []float32 {
	t.Helper()
	key := script.Print(f)
	if out, ok := outputs.Load(key); ok {
		return out.([]float32)
	}
	args := randomArgs(t, f, 7)
	check.NoError(t, interp.Run(f, args...))
	out, err := ndarray.ToSlice[float32](args[len(args)-1].(*ndarray.NDArray))
	check.NoError(t, err)
	outputs.Store(key, out)
	return out
}

// outputs holds outputOf's results by the function's text: the
// interpreter runs each unscheduled function once, although the tests of
// a schedule and of its compiled code both compare with it.
var outputs sync.Map

func TestFunc(t *testing.T) {
	cases := []struct {
		name      string
		src       string
		opts      Options
		scheduled bool
		golden    bool
		// allocs are the root block's buffers after scheduling: with
		// the bias and relu computed on the register tile, the matmul's
		// own output (mm) is gone.
		allocs string
	}{
		{name: "gemv_vector", src: fusedDense(1, 64, 24, false), scheduled: true, golden: true, allocs: "mm_local"},
		{name: "gemv_tail_scalar", src: fusedDense(1, 10, 32, false), scheduled: true, golden: true, allocs: "mm mm_local"},
		{name: "gemv_wide", src: fusedDense(1, 512, 8, false), scheduled: true},
		{name: "dense_rows", src: fusedDense(8, 32, 16, false), scheduled: true, allocs: "mm_local"},
		{name: "dense_odd_rows", src: fusedDense(3, 48, 5, false), scheduled: true, allocs: "mm_local"},
		{name: "dense_40_columns", src: fusedDense(2, 40, 7, false), scheduled: true},
		{name: "parallel", src: fusedDense(8, 64, 16, false), opts: Options{ParallelFlops: 1}, scheduled: true, allocs: "mm_local"},
		{name: "avx2_lanes", src: fusedDense(2, 24, 9, false), opts: Options{VectorBytes: 32}, scheduled: true},
		{name: "eight_rows_three_vectors", src: fusedDense(16, 96, 7, false), scheduled: true, allocs: "mm_local"},
		{name: "gemv_half_vectors", src: fusedDense(1, 1000, 5, false), opts: Options{ParallelFlops: 1}, scheduled: true, allocs: "mm_local"},
		{name: "residual_rows", src: residualDense(24, 64, 11), opts: Options{ParallelFlops: 1}, scheduled: true, allocs: "mm_local"},
		{name: "residual_odd_rows", src: residualDense(7, 32, 3), scheduled: true, allocs: "mm_local"},
		{name: "batched", src: batchMatmul(2, 4, 32, 8), scheduled: true},
		{name: "shared_weight_unit_batch", src: sharedWeight(1, 12, 48, 5), scheduled: true, allocs: "c_local"},
		{name: "shared_weight_rows_outside", src: sharedWeight(6, 1, 32, 7), opts: Options{ParallelFlops: 1}, scheduled: true},
		{name: "shared_weight_odd", src: sharedWeight(3, 5, 40, 3), opts: Options{ParallelFlops: 1}, scheduled: true},
		// Not a matmul the register tile takes (B is read across k): the
		// generic rule vectorizes its bias and relu only.
		{name: "weight_not_transposed", src: fusedDense(1, 64, 24, true), scheduled: true, allocs: "mm"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := parseFunc(t, tc.src)
			g, ok := scheduleChecked(t, f, tc.opts, tc.scheduled)
			if !ok {
				return
			}
			if tc.allocs != "" {
				check.Equal(t, strings.Join(rootAllocs(g), " "), tc.allocs, "root buffers")
			}
			sameOutput(t, f, g, 1e-5)
			if tc.golden {
				golden(t, tc.name, script.Print(g))
			}
		})
	}
}

// sameOutput runs f and its schedule g, as it is and lowered, in the
// interpreter on the same inputs; every element agrees within tol
// (relative to the larger of 1 and the element).
func sameOutput(t *testing.T, f, g *ir.PrimFunc, tol float64) {
	t.Helper()
	want := outputOf(t, f)
	lowered, err := transform.Lower(g, transform.Options{StopAfter: "storage_rewrite", Verify: true})
	check.NoError(t, err)
	for _, h := range []*ir.PrimFunc{g, lowered} {
		got := outputOf(t, h)
		check.Equal(t, len(got), len(want))
		for i := range got {
			if d := math.Abs(float64(got[i] - want[i])); d > tol*math.Max(1, math.Abs(float64(want[i]))) {
				t.Fatalf("element %d: got %g, want %g", i, got[i], want[i])
			}
		}
	}
}

// scheduledSource schedules each function of fs with its options (each
// must be scheduled) and returns the C of a module of them, named
// PREFIX0, PREFIX1…, and the unscheduled originals by name.
func scheduledSource(t *testing.T, prefix string, fs []*ir.PrimFunc, opts []Options) (string, map[string]*ir.PrimFunc) {
	t.Helper()
	mod := ir.NewIRModule()
	funcs := map[string]*ir.PrimFunc{}
	for i, f := range fs {
		g, ok, err := Func(f, opts[i])
		check.NoError(t, err)
		check.True(t, ok, "scheduled", i)
		name := fmt.Sprintf("%s%d", prefix, i)
		funcs[name] = f
		mod = mod.With(name, g.WithAttr(ir.AttrGlobalSymbol, name))
	}
	return ckernel.Source(t, mod), funcs
}

// checkCompiled compiles src (C for scheduled functions) and runs each
// function of funcs (name → the unscheduled original) on the same inputs
// as the original in the interpreter; outputs agree.
func checkCompiled(t *testing.T, src string, funcs map[string]*ir.PrimFunc) {
	t.Helper()
	m := ckernel.Load(t, src, "-O1")
	for name, f := range funcs {
		t.Run(name, func(t *testing.T) { nearSlices(t, runCompiled(t, m, name, f), outputOf(t, f)) })
	}
}

// scheduleChecked schedules f, checks that Func did (or did not) and
// that the result is well formed, and that scheduling it again does
// nothing: the loops are no longer the block's own.
func scheduleChecked(t *testing.T, f *ir.PrimFunc, opts Options, scheduled bool) (*ir.PrimFunc, bool) {
	t.Helper()
	g, ok, err := Func(f, opts)
	check.NoError(t, err)
	check.Equal(t, ok, scheduled, "scheduled")
	check.NoError(t, ir.Verify(g))
	if !ok {
		check.True(t, g == f, "unchanged")
		return g, false
	}
	_, again, err := Func(g, opts)
	check.NoError(t, err)
	check.True(t, !again, "a scheduled function is left alone")
	return g, true
}

func TestMatmulTile(t *testing.T) {
	cases := []struct {
		rows, n, maxLanes, regs int64
		lanes, mr, nt           int64
		vector                  bool
	}{
		// A transformer's feed-forward layers and its QKV projection.
		{32, 2048, 16, 32, 16, 8, 32, true},
		{32, 128, 16, 32, 16, 8, 32, true},
		{32, 384, 16, 32, 16, 8, 48, true},
		// A classifier: 1000 columns take vectors of 8, one row.
		{1, 1000, 16, 32, 8, 1, 40, true},
		{1, 64, 16, 32, 16, 1, 64, true},
		{6, 64, 16, 32, 16, 6, 64, true},
		{3, 48, 16, 32, 16, 3, 48, true},
		// AVX2's 16 registers: 6 rows of two vectors (12 accumulators),
		// the last tile overlapping, not 4 rows (8) nor 8 of one vector.
		{32, 128, 8, 16, 8, 6, 16, true},
		{1024, 1024, 8, 16, 8, 6, 16, true},
		{1008, 1024, 8, 16, 8, 6, 16, true},
		// 40 columns of 8 lanes: 4 rows of all five vectors, not 8 of one;
		// 7 rows (a prime) take 2 rows of five vectors (the last tile
		// overlapping) rather than 7 of one.
		{8, 40, 16, 32, 8, 4, 40, true},
		{7, 40, 8, 16, 8, 2, 40, true},
		// Many rows: at most maxMatmulVectors vectors a row, so 8 rows
		// of two, not 6 rows of the four that would fit beside them.
		{1024, 1024, 16, 32, 16, 8, 32, true},
		{4, 24, 8, 16, 8, 4, 24, true},
		{3, 10, 16, 32, 1, 1, 10, false},
	}
	for _, c := range cases {
		lanes, mr, nt, vector := matmulTile(c.rows, c.n, c.maxLanes, c.regs)
		check.Equal(t, [4]int64{lanes, mr, nt, b2i(vector)}, [4]int64{c.lanes, c.mr, c.nt, b2i(c.vector)}, c.rows, "×", c.n)
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// TestMatmulCompiled compiles scheduled dense layers (odd rows, columns
// and reductions, epilogues) and batched matmuls to C and checks them
// against the interpreter on the unscheduled functions, and that each
// accumulator tile became variables (vector registers), not an array.
func TestMatmulCompiled(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C")
	}
	srcs := []string{
		fusedDense(16, 96, 7, false), fusedDense(3, 48, 5, false), fusedDense(1, 1000, 5, false),
		fusedDense(5, 40, 13, false), residualDense(24, 64, 11), residualDense(7, 32, 3),
		batchMatmul(3, 8, 32, 5), sharedWeight(3, 5, 48, 9),
	}
	var fs []*ir.PrimFunc
	var opts []Options
	for i, src := range srcs {
		o := Options{}
		if i%2 == 1 {
			o.ParallelFlops = 1
		}
		fs, opts = append(fs, parseFunc(t, src)), append(opts, o)
	}
	src, funcs := scheduledSource(t, "mm", fs, opts)
	if i := strings.Index(src, "_local["); i >= 0 {
		t.Fatalf("an accumulator tile was left in memory: %s", src[max(0, i-3000):i+200])
	}
	checkCompiled(t, src, funcs)
}

// TestFuncRule: FuncRule names the rule that scheduled a function.
func TestFuncRule(t *testing.T) {
	mod, err := script.Parse("test.py", "@I.ir_module\nclass Module:"+indent(fusedDense(1, 32, 8, false))+indent(strings.ReplaceAll(fusedDense(1, 32, 8, true), "def dense", "def dense_t")))
	check.NoError(t, err)
	g, rule, err := FuncRule(mod.PrimFunc("dense"), Options{})
	check.NoError(t, err)
	check.Equal(t, rule, RuleMatmul)
	check.True(t, g != mod.PrimFunc("dense"), "dense scheduled")
	g, rule, err = FuncRule(mod.PrimFunc("dense_t"), Options{})
	check.NoError(t, err)
	check.Equal(t, rule, RuleGeneric)
	par, vec := loopKinds(g)
	check.Equal(t, [2]int{par, vec}, [2]int{0, 1}, "dense_t: the generic rule vectorized its epilogue")
}

func indent(s string) string {
	return strings.ReplaceAll(s, "\n", "\n    ")
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		check.NoError(t, os.MkdirAll("testdata", 0o755))
		check.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	check.NoError(t, err, "run go test -update")
	check.Equal(t, got, string(want))
}

// TestPackedMatmulCompiled: dense layers over weights packed in panels
// (relax.matmul_packed) take the register tile of the panel's width, the
// panel read with vector loads at plain offsets (no division left), and
// compute what the interpreter computes on the unscheduled functions.
func TestPackedMatmulCompiled(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C")
	}
	fs := []*ir.PrimFunc{
		legalized(t, "matmul_packed", nil, []int64{1, 16, 32}, []int64{2, 32, 32}), // 16 rows × 64 columns
		legalized(t, "matmul_packed", nil, []int64{1, 64}, []int64{5, 64, 8}),      // a classifier's row
		legalized(t, "matmul_packed", nil, []int64{3, 48}, []int64{3, 48, 48}),     // 3 rows, 3 vectors
	}
	for _, f := range fs {
		g, ok, err := Func(f, Options{})
		check.NoError(t, err)
		check.True(t, ok, "scheduled")
		check.True(t, strings.Contains(script.Print(g), "T.vectorized"), "a vector tile")
	}
	src, funcs := scheduledSource(t, "pk", fs, []Options{{}, {ParallelFlops: 1}, {}})
	if i := strings.Index(src, "_local["); i >= 0 {
		t.Fatalf("an accumulator tile was left in memory: %s", src[max(0, i-3000):i+200])
	}
	// Only the prelude's definitions name the floor division macros.
	check.True(t, strings.Count(src, "KILN_FLOORDIV(") == 1 && strings.Count(src, "KILN_FLOORMOD(") == 1, "no division in the loops:\n", src)
	checkCompiled(t, src, funcs)
}

// TestChoicesOfMatmul: the matmul rule's choices (register tile rows and
// vectors within the accumulators, steps of k unrolled, the order of the
// tile loops, the panel copy) are valid whatever is
// drawn, on dense layers with and without epilogues, batches, a shared
// weight with rows outside the tiles, rows over two loops and a packed
// weight, on AVX-512 and AVX2 register files.
func TestChoicesOfMatmul(t *testing.T) {
	cases := []struct {
		name string
		f    *ir.PrimFunc
		opts Options
		want []string // sites some draw must ask
	}{
		{"dense_rows", parseFunc(t, fusedDense(8, 32, 16, false)), Options{ParallelFlops: 1},
			[]string{"rows", "vectors", "k_unroll", "columns_outer", "copy_panel"}},
		{"dense_odd_rows_avx2", parseFunc(t, fusedDense(3, 48, 5, false)), Options{VectorBytes: 32}, []string{"rows", "vectors", "k_unroll"}},
		{"gemv_tail_scalar", parseFunc(t, fusedDense(1, 10, 32, false)), Options{}, []string{"k_unroll", "columns_outer"}},
		{"residual", parseFunc(t, residualDense(24, 64, 12)), Options{ParallelFlops: 1}, []string{"rows", "vectors", "columns_outer"}},
		{"batched", parseFunc(t, batchMatmul(2, 4, 32, 8)), Options{ParallelFlops: 1}, []string{"rows", "columns_outer"}},
		{"shared_weight_rows_outside", parseFunc(t, sharedWeight(6, 1, 32, 7)), Options{ParallelFlops: 1}, []string{"columns_outer", "k_unroll"}},
		{"rows_over_loops", parseFunc(t, dense4(7, 7, 32, 16)), Options{ParallelFlops: 1}, []string{"vectors", "k_unroll"}},
		{"rows_over_loops_tiled", parseFunc(t, dense4(12, 10, 16, 4)), Options{ParallelFlops: 1}, []string{"rows", "columns_outer"}},
		{"packed", legalized(t, "matmul_packed", nil, []int64{3, 48}, []int64{3, 48, 48}), Options{}, []string{"rows", "k_unroll"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sites := checkChoices(t, tc.f, tc.opts, 6)
			for _, w := range tc.want {
				found := false
				for _, s := range sites {
					found = found || strings.HasPrefix(s, "matmul/") && strings.HasSuffix(s, "/"+w)
				}
				check.True(t, found, "no choice", w, "among", sites)
			}
		})
	}
}

// TestMatmulDefaultChoices: with no Decider the rule's picks are today's
// (the default schedule): the trace records each choice at its default,
// and a Decider that picks the default index everywhere gives the same
// function.
func TestMatmulDefaultChoices(t *testing.T) {
	f := parseFunc(t, fusedDense(16, 96, 7, false))
	a, err := Apply(f, Options{ParallelFlops: 1})
	check.NoError(t, err)
	check.Equal(t, a.Rule, RuleMatmul)
	tr := strings.Join(a.Trace, "\n")
	// 16 rows: 8 rows of 2 vectors of 16 lanes on AVX-512 (96 = 6 vectors;
	// 8 × 3 would be 24 accumulators and 3 loads: 28 of 32, allowed).
	// Any count of rows is a candidate (a count that does not divide 16
	// overlaps its last tile).
	check.True(t, strings.Contains(tr, "sample_categorical(candidates=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], probs="), tr)
	d := &defaultIndex{}
	b, err := Apply(f, Options{ParallelFlops: 1, Decide: d})
	check.NoError(t, err)
	check.True(t, ir.StructuralEqual(a.Func, b.Func), "the default picks give the default schedule")
	check.True(t, len(d.asked) >= 4, d.asked)
}

// defaultIndex is a Decider that takes the rule's own pick and lists the
// sites asked.
type defaultIndex struct{ asked []string }

func (d *defaultIndex) Choose(s *schedule.Schedule, site string, cands []int64, def int) (int64, error) {
	d.asked = append(d.asked, site)
	return s.SampleCategorical(nil, cands, Uniform(len(cands)), def)
}

// TestChoicesOfMatmulCompiled: schedules of the matmul rule under drawn
// choices compile to C that computes what the interpreter computes on
// the unscheduled functions (the panel copy and the unrolled steps of k
// included).
func TestChoicesOfMatmulCompiled(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C")
	}
	fs := []*ir.PrimFunc{
		parseFunc(t, fusedDense(16, 96, 8, false)),
		parseFunc(t, sharedWeight(1, 24, 64, 12)),
		parseFunc(t, batchMatmul(2, 4, 32, 8)),
	}
	mod := ir.NewIRModule()
	funcs := map[string]*ir.PrimFunc{}
	for i, f := range fs {
		for seed := range 3 {
			d := &drawn{rng: rand.New(rand.NewPCG(uint64(seed), 11)), picked: map[string]int{}}
			a, err := Apply(f, Options{ParallelFlops: 1, Decide: d})
			check.NoError(t, err)
			check.Equal(t, a.Rule, RuleMatmul)
			name := fmt.Sprintf("mm%d_%d", i, seed)
			funcs[name] = f
			mod = mod.With(name, a.Func.WithAttr(ir.AttrGlobalSymbol, name))
		}
	}
	checkCompiled(t, ckernel.Source(t, mod), funcs)
}
