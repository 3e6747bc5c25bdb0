package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"time"
	"unsafe"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/load"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

func init() {
	register(benchmark{
		name:    "matmul",
		summary: "fp32 1024³ matmul built from TE: hand-written schedule, default schedule and unscheduled, GFLOPS against numpy (OpenBLAS) on the same ISA (--target)",
		run:     runMatmul,
	})
}

// matmulResult is the matmul benchmark's report. Each GFLOPS figure is the
// median over rounds; in every round kiln's variants and numpy are each
// measured once (a batch of calls lasting at least minBatch), and a ratio
// is the median of the rounds' kiln/numpy pairs, so load from elsewhere on
// the machine shifts both sides of a pair together. Ratios are absent when
// numpy cannot run here.
type matmulResult struct {
	Name            string   `json:"name"`
	Sizes           sizesNMK `json:"sizes"`
	Target          string   `json:"target"`     // what kiln built for
	ISA             string   `json:"isa"`        // the vector ISA of kiln's code
	HandTile        []int64  `json:"hand_tile"`  // the hand schedule's rows, columns and lanes (from the target)
	NumpyCore       string   `json:"numpy_core"` // OPENBLAS_CORETYPE given to numpy ("" : its own choice)
	Repeats         int      `json:"repeats"`
	MinBatchMS      float64  `json:"min_batch_ms"`
	GFLOPSScheduled float64  `json:"gflops_scheduled"`
	GFLOPSAuto      float64  `json:"gflops_default_schedule"` // the default schedule (compiler/schedule/auto)
	GFLOPSDefault   float64  `json:"gflops_default"`          // unscheduled
	GFLOPSNumpy     float64  `json:"gflops_numpy,omitempty"`
	Ratio           float64  `json:"ratio,omitempty"`                  // scheduled / numpy
	RatioAuto       float64  `json:"ratio_default_schedule,omitempty"` // default schedule / numpy
	RatioDefault    float64  `json:"ratio_default,omitempty"`          // unscheduled / numpy
	Numpy           string   `json:"numpy,omitempty"`                  // numpy version, BLAS and its kernels
	NoReference     string   `json:"no_reference,omitempty"`           // why there is no ratio
	Trace           []string `json:"trace"`                            // the scheduled variant's schedule
	MaxRelErr       float64  `json:"max_rel_err"`                      // largest relative error of both variants' checked entries
	Checked         int      `json:"checked"`                          // entries of C checked against a Go reference, per variant
	Quick           bool     `json:"quick,omitempty"`
}

// sizesNMK are a matmul's sizes: A is n×k, B k×m, C n×m.
type sizesNMK struct {
	N int `json:"n"`
	M int `json:"m"`
	K int `json:"k"`
}

func (r matmulResult) Line() string {
	s := fmt.Sprintf("matmul: %d×%d×%d fp32, kiln %s (%s): scheduled %.1f GFLOPS, default schedule %.1f, unscheduled %.2f", r.Sizes.N, r.Sizes.M, r.Sizes.K, r.Target, r.ISA, r.GFLOPSScheduled, r.GFLOPSAuto, r.GFLOPSDefault)
	if r.GFLOPSNumpy > 0 {
		s += fmt.Sprintf("; %s %.1f GFLOPS; ratio %.3f (default schedule %.3f, unscheduled %.4f)", r.Numpy, r.GFLOPSNumpy, r.Ratio, r.RatioAuto, r.RatioDefault)
	} else {
		s += fmt.Sprintf("; no ratio: %s", r.NoReference)
	}
	return s + fmt.Sprintf(" [median of %d]", r.Repeats)
}

// matmulHandTile is the register block of the hand schedule for a target
// (see scheduleMatmul): lanes fp32 to a vector register, an mr×nr tile
// of C kept in mr·nr/lanes accumulators, two vectors of B a row and as
// many rows as three quarters of the registers hold accumulators for
// (at most 8, the loads of B and the broadcasts of A in the rest). With
// 32 vector registers (AVX-512) 8 rows: 16 accumulators. With 16 (AVX2)
// 6 rows, 12 accumulators (BLIS's 6×16 Haswell kernel), the last tile of
// 1024 rows overlapping the one before; 4 rows, 8 accumulators, ran at
// 0.6× of it on a Zen 3 core.
func matmulHandTile(info compiler.TargetInfo) (mr, nr, lanes int64) {
	lanes = max(info.VectorBytes/4, 4)
	mr = min(8, max(1, info.VectorRegisters*3/4/2))
	return mr, 2 * lanes, lanes
}

// runMatmul builds C = A·B from tensor expressions three times (the
// unscheduled function, the default schedule, and scheduleMatmul's
// register-blocked schedule), checks each against a Go reference and
// times them interleaved with numpy, whose OpenBLAS runs the kernels of
// the ISA kiln builds for.
func runMatmul(ctx context.Context, opt options) (result, error) {
	n, m, k, rounds, minBatch := 1024, 1024, 1024, 5, 200*time.Millisecond
	if opt.quick {
		n, m, k, rounds, minBatch = 64, 64, 32, 1, time.Millisecond
	}
	target, info, err := benchTargetInfo(opt.target)
	if err != nil {
		return nil, err
	}
	env := numpyEnv(target)
	r := matmulResult{Name: "matmul", Sizes: sizesNMK{n, m, k}, Target: target.String(), ISA: targetISA(target),
		NumpyCore: os.Getenv("OPENBLAS_CORETYPE"), Repeats: rounds, MinBatchMS: float64(minBatch) / 1e6, Quick: opt.quick}
	if len(env) > 0 {
		r.NumpyCore = strings.TrimPrefix(env[0], "OPENBLAS_CORETYPE=")
	}

	f, err := matmulFunc(n, m, k)
	if err != nil {
		return nil, err
	}
	s, err := schedule.New(f)
	if err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	mr, nr, lanes := matmulHandTile(info)
	r.HandTile = []int64{mr, nr, lanes}
	if err := scheduleMatmul(s, mr, nr, lanes); err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	r.Trace = s.Trace()

	dir, err := os.MkdirTemp("", "kiln-bench-matmul-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var kernels []*kernel
	defer func() {
		for _, kern := range kernels {
			kern.close()
		}
	}()
	for _, v := range []struct {
		name string
		f    *ir.PrimFunc
		opts compiler.BuildOptions
	}{
		{"matmul_scheduled", s.Func(), compiler.BuildOptions{}},
		{"matmul_default_schedule", f, compiler.BuildOptions{}},
		{"matmul_default", f, compiler.BuildOptions{NoDefaultSchedule: true}},
	} {
		kern, err := buildKernel(ctx, v.f, v.name, dir, target, v.opts)
		if err != nil {
			return nil, err
		}
		kernels = append(kernels, kern)
	}

	rng := rand.New(rand.NewPCG(1, 2))
	a, err := randomArray(rng, n, k)
	if err != nil {
		return nil, err
	}
	b, err := randomArray(rng, k, m)
	if err != nil {
		return nil, err
	}
	c, err := randomArray(rng, n, m) // garbage, so a kernel that skips its init shows
	if err != nil {
		return nil, err
	}
	args := []packedfunc.Value{packedfunc.Array(a), packedfunc.Array(b), packedfunc.Array(c)}
	for _, kern := range kernels {
		if _, err := kern.fn.Call(args...); err != nil {
			return nil, fmt.Errorf("%s: %w", kern.name, err)
		}
		checked, rel, err := checkMatmul(rng, a, b, c, n, m, k, opt.quick)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", kern.name, err)
		}
		r.Checked, r.MaxRelErr = checked, max(r.MaxRelErr, rel)
		if err := fillRandom(rng, c); err != nil {
			return nil, err
		}
	}

	flops := 2 * float64(n) * float64(m) * float64(k)
	g := make([][]float64, len(kernels)) // per kernel, per round
	rs := make([][]float64, len(kernels))
	var gn []float64
	for range rounds {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for x, kern := range kernels {
			t, err := timeCalls(ctx, func() error { _, err := kern.fn.Call(args...); return err }, minBatch)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", kern.name, err)
			}
			g[x] = append(g[x], flops/t/1e9)
		}
		if r.NoReference != "" {
			continue
		}
		ref, err := runNumpyEnv(ctx, env, "matmul", n, m, k, 1)
		if errors.Is(err, errNoReference) {
			r.NoReference = err.Error()
			continue
		}
		if err != nil {
			return nil, err
		}
		gr := num(ref, "gflops")
		if gr <= 0 {
			return nil, fmt.Errorf("numpy reference: no gflops in %v", ref)
		}
		r.Numpy = numpyName(ref)
		gn = append(gn, gr)
		for x := range kernels {
			rs[x] = append(rs[x], g[x][len(g[x])-1]/gr)
		}
	}
	r.GFLOPSScheduled, r.GFLOPSAuto, r.GFLOPSDefault = sig(median(g[0]), 4), sig(median(g[1]), 4), sig(median(g[2]), 3)
	if len(gn) > 0 {
		r.GFLOPSNumpy = sig(median(gn), 4)
		r.Ratio, r.RatioAuto, r.RatioDefault = sig(median(rs[0]), 3), sig(median(rs[1]), 3), sig(median(rs[2]), 3)
	}
	return r, nil
}

// matmulFunc is C[i, j] = sum over k of A[i, k]·B[k, j] in fp32 as a
// PrimFunc with parameters A, B, C.
func matmulFunc(n, m, k int) (*ir.PrimFunc, error) {
	A := te.Placeholder(te.Shape(int64(n), int64(k)), ir.Float32, "A")
	B := te.Placeholder(te.Shape(int64(k), int64(m)), ir.Float32, "B")
	rk := te.ReduceAxis(ir.RangeFromExtent(ir.I32(int64(k))), "k")
	C := te.Compute(te.Shape(int64(n), int64(m)), func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(A.At(i, rk), B.At(rk, j)), rk)
	}, "C")
	f, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	if err != nil {
		return nil, fmt.Errorf("matmul: %w", err)
	}
	return f, nil
}

// scheduleMatmul is the hand-written schedule of the benchmark,
// a register-blocked kernel:
//
//   - C is cut into mr×nr tiles: split i (its last tile overlapping the
//     one before where mr does not divide the rows) and j, then j's tile into
//     vectors of lanes, reordered to j_0, i_0, k, i_1, j_1_0, j_1_1;
//   - each tile accumulates in a "local" buffer (cache_write, computed at
//     the tile loop i_0) whose init is split off the reduction
//     (decompose_reduction), so GCC keeps the mr·nr/lanes accumulators in
//     vector registers while k runs over the whole reduction;
//   - the tile's rows and vectors are unrolled, each vector is one GCC
//     vector type (vectorize);
//   - the column panel of B that a j_0 iteration reads is copied once per
//     panel (cache_read, computed at j_0), so the k loop walks
//     freshly-cached rows instead of 4 KiB strides that collide in the
//     cache;
//   - the outer loop j_0 runs in parallel.
//
// The outer loop is not fused with i_0: a fused loop indexes through
// floordiv/floormod, which the C code generator recomputes in the inner
// loop. One vector per lanes (16 fp32 = one AVX-512 register) rather
// than per nr: GCC spills two-register vector types.
func scheduleMatmul(s *schedule.Schedule, mr, nr, lanes int64) error {
	c, err := s.GetBlock("C")
	if err != nil {
		return err
	}
	l, err := s.GetLoops(c)
	if err != nil {
		return err
	}
	rows, err := s.LoopFor(l[0])
	if err != nil {
		return err
	}
	split := s.Split
	if ext, ok := ir.IsConstInt(rows.Extent); !ok || ext%mr != 0 {
		split = s.SplitOverlap // the last tile of rows overlaps the one before
	}
	i, err := split(l[0], -1, mr)
	if err != nil {
		return err
	}
	j, err := s.Split(l[1], -1, nr)
	if err != nil {
		return err
	}
	jv, err := s.Split(j[1], -1, lanes)
	if err != nil {
		return err
	}
	k := l[2]
	if err := s.Reorder(j[0], i[0], k, i[1], jv[0], jv[1]); err != nil {
		return err
	}
	wb, err := s.CacheWrite(c, 0, "local")
	if err != nil {
		return err
	}
	if err := s.ReverseComputeAt(wb, i[0]); err != nil {
		return err
	}
	init, err := s.DecomposeReduction(c, k)
	if err != nil {
		return err
	}
	il, err := s.GetLoops(init)
	if err != nil {
		return err
	}
	wl, err := s.GetLoops(wb)
	if err != nil {
		return err
	}
	for _, u := range []schedule.LoopRV{i[1], jv[0], il[len(il)-3], il[len(il)-2]} {
		if err := s.Unroll(u); err != nil {
			return err
		}
	}
	for _, v := range []schedule.LoopRV{jv[1], il[len(il)-1], wl[len(wl)-1]} {
		if err := s.Vectorize(v); err != nil {
			return err
		}
	}
	// After decompose_reduction the update block reads C_local, A, B.
	bp, err := s.CacheRead(c, 2, "global")
	if err != nil {
		return err
	}
	if err := s.ComputeAt(bp, j[0]); err != nil {
		return err
	}
	pl, err := s.GetLoops(bp)
	if err != nil {
		return err
	}
	if err := s.Vectorize(pl[len(pl)-1]); err != nil {
		return err
	}
	return s.Parallel(j[0])
}

// checkMatmul compares C with a float64 Go reference: every entry in
// quick mode, else 512 random entries and the four corners. It returns
// how many entries it checked and the largest relative error; an error
// above 1e-5 (the tolerance of TVM's tutorial) fails.
func checkMatmul(rng *rand.Rand, a, b, c *ndarray.NDArray, n, m, k int, all bool) (int, float64, error) {
	af, bf, cf := floats(a), floats(b), floats(c)
	type ij struct{ i, j int }
	var at []ij
	if all {
		for i := range n {
			for j := range m {
				at = append(at, ij{i, j})
			}
		}
	} else {
		at = []ij{{0, 0}, {0, m - 1}, {n - 1, 0}, {n - 1, m - 1}}
		for range 512 {
			at = append(at, ij{rng.IntN(n), rng.IntN(m)})
		}
	}
	worst := 0.0
	for _, p := range at {
		var want, mag float64
		for x := range k {
			t := float64(af[p.i*k+x]) * float64(bf[x*m+p.j])
			want += t
			mag += math.Abs(t)
		}
		got := float64(cf[p.i*m+p.j])
		rel := math.Abs(got-want) / max(mag, 1e-30)
		if !(rel <= 1e-5) { // also catches NaN
			return 0, 0, fmt.Errorf("C[%d, %d] = %g, want %g (relative error %.2g)", p.i, p.j, got, want, rel)
		}
		worst = max(worst, rel)
	}
	return len(at), worst, nil
}

// kernel is one built and loaded PrimFunc.
type kernel struct {
	name string
	mod  *load.Module
	fn   *packedfunc.Func
	res  *compiler.Result
}

// buildKernel builds f as a one-function module named name (also its
// exported symbol) for target and loads it; dir receives the host
// library.
func buildKernel(ctx context.Context, f *ir.PrimFunc, name, dir string, target compiler.Target, opts compiler.BuildOptions) (*kernel, error) {
	mod := ir.NewIRModule().With(name, f.WithAttr(ir.AttrGlobalSymbol, name))
	res, err := compiler.BuildWithResult(ctx, mod, target, opts)
	if err != nil {
		return nil, fmt.Errorf("build %s: %w", name, err)
	}
	m, err := load.Artifact(res.Artifact, load.Options{Dir: dir})
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", name, err)
	}
	fn, err := m.GetFunction(name)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("load %s: %w", name, err)
	}
	return &kernel{name: name, mod: m, fn: fn, res: res}, nil
}

func (k *kernel) close() { k.mod.Close() }

// timeCalls runs batches of calls, growing the batch until one lasts at
// least minBatch, and returns that batch's seconds per call (as the numpy
// reference does). The caller warms up: the benchmarks' checking call
// comes first.
func timeCalls(ctx context.Context, call func() error, minBatch time.Duration) (float64, error) {
	n := 1
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		start := time.Now()
		for range n {
			if err := call(); err != nil {
				return 0, err
			}
		}
		dt := time.Since(start)
		if dt >= minBatch {
			return dt.Seconds() / float64(n), nil
		}
		n = max(2*n, int(float64(n)*float64(minBatch)/float64(max(dt, 1)))+1)
	}
}

// randomArray allocates a CPU fp32 array filled with uniform [0, 1) values.
func randomArray(rng *rand.Rand, shape ...int) (*ndarray.NDArray, error) {
	s := make(ndarray.Shape, len(shape))
	for i, d := range shape {
		s[i] = int64(d)
	}
	a, err := ndarray.Empty(s, ndarray.Float32, devices.CPUDevice)
	if err != nil {
		return nil, err
	}
	if err := fillRandom(rng, a); err != nil {
		return nil, err
	}
	return a, nil
}

func fillRandom(rng *rand.Rand, a *ndarray.NDArray) error {
	if _, err := a.HostBytes(); err != nil {
		return err
	}
	fs := floats(a)
	for i := range fs {
		fs[i] = rng.Float32()
	}
	return nil
}

// floats views a compact CPU fp32 array's memory as a Go slice (nil for
// an empty or non-host array).
func floats(a *ndarray.NDArray) []float32 {
	b, err := a.HostBytes()
	if err != nil || len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// numpyName is "numpy VERSION (BLAS)" from a reference result.
func numpyName(ref map[string]any) string {
	v, _ := ref["numpy"].(string)
	s := "numpy " + v
	blas, _ := ref["blas"].(string)
	if core, ok := ref["blas_core"].(string); ok && core != "" {
		blas += ", " + core + " kernels"
	}
	if blas != "" {
		s += " (" + strings.TrimPrefix(blas, ", ") + ")"
	}
	return s
}
