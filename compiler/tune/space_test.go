package tune

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/compiler/topi"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"

	_ "github.com/kiln-ml/kiln/devices/cpu" // host arrays for the interpreter
)

var testTarget = rules.Target{Kind: "cpu", VectorBytes: 32}

func matmulFunc(t testing.TB, n, m, k int64) *ir.PrimFunc {
	t.Helper()
	A := te.Placeholder(te.Shape(n, k), ir.Float32, "A")
	B := te.Placeholder(te.Shape(k, m), ir.Float32, "B")
	rk := te.ReduceAxis(ir.RangeFromExtent(ir.I32(k)), "k")
	C := te.Compute(te.Shape(n, m), func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(A.At(i, rk), B.At(rk, j)), rk)
	}, "C")
	f, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	check.NoError(t, err)
	return f
}

// reluMatmul adds an injective producer (relu of A) for auto-inline and
// an injective consumer.
func reluMatmul(t testing.TB, n, m, k int64) *ir.PrimFunc {
	t.Helper()
	A := te.Placeholder(te.Shape(n, k), ir.Float32, "A")
	B := te.Placeholder(te.Shape(k, m), ir.Float32, "B")
	R := te.Compute(te.Shape(n, k), func(i, j ir.Expr) ir.Expr { return ir.Max(A.At(i, j), ir.F32(0)) }, "R")
	rk := te.ReduceAxis(ir.RangeFromExtent(ir.I32(k)), "k")
	C := te.Compute(te.Shape(n, m), func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(R.At(i, rk), B.At(rk, j)), rk)
	}, "C")
	f, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	check.NoError(t, err)
	return f
}

// rowMax is a reduction followed by a consumer: max over each row, then
// x - max (a softmax's first half).
func rowMax(t testing.TB, n, m int64) *ir.PrimFunc { return rowReduce(t, n, m, "M", te.Max) }

// rowSum is a row sum (of small integers: exact in any order) and its
// consumer.
func rowSum(t testing.TB, n, m int64) *ir.PrimFunc { return rowReduce(t, n, m, "S", te.Sum) }

// rowReduce reduces each row of X with reduce into the block name, then
// subtracts the result from the row.
func rowReduce(t testing.TB, n, m int64, name string, reduce func(ir.Expr, ...*te.Axis) ir.Expr) *ir.PrimFunc {
	t.Helper()
	X := te.Placeholder(te.Shape(n, m), ir.Float32, "X")
	rk := te.ReduceAxis(ir.RangeFromExtent(ir.I32(m)), "k")
	R := te.Compute(te.Shape(n), func(i ir.Expr) ir.Expr { return reduce(X.At(i, rk), rk) }, name)
	Y := te.Compute(te.Shape(n, m), func(i, j ir.Expr) ir.Expr { return ir.Sub(X.At(i, j), R.At(i)) }, "Y")
	f, err := te.CreatePrimFunc([]*te.Tensor{X, Y})
	check.NoError(t, err)
	return f
}

// run runs f on the interpreter with small-integer inputs and returns the
// last parameter's contents.
func run(t testing.TB, f *ir.PrimFunc) []float32 {
	t.Helper()
	var args []any
	var last *ndarray.NDArray
	for i, p := range f.Params {
		b := f.BufferMap[p]
		shape := make(ndarray.Shape, len(b.Shape))
		n := int64(1)
		for d, e := range b.Shape {
			v, ok := ir.IsConstInt(e)
			check.True(t, ok, "static shape")
			shape[d] = v
			n *= v
		}
		data := make([]float32, n)
		for j := range data {
			data[j] = float32((j*7+i*3)%11 - 5)
			if i == len(f.Params)-1 {
				data[j] = float32(math.NaN())
			}
		}
		a, err := ndarray.FromSlice(data, shape)
		check.NoError(t, err)
		args = append(args, a)
		last = a
	}
	check.NoError(t, interp.RunOptions(f, interp.Options{Poison: true, MaxSteps: 50_000_000}, args...))
	out, err := ndarray.ToSlice[float32](last)
	check.NoError(t, err)
	// The interpreter holds the arrays' memory, not the arrays: keep
	// them from being collected (and freed) while it runs.
	runtime.KeepAlive(args)
	return out
}

// TestSpaceSamplesComputeTheSame draws candidates from the spaces of
// three functions; every one must verify, compute what the unscheduled
// function computes, and replay from its decisions to the same function.

func TestSpaceSamplesComputeTheSame(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   *ir.PrimFunc
		want []string // choices that some sample must make
	}{
		{"matmul", matmulFunc(t, 24, 32, 12), []string{"tile/C/i", "cache_write/C", "cache_read/C/B", "parallel_fuse/", "unroll/"}},
		{"relu_matmul", reluMatmul(t, 16, 16, 8), []string{"tile/C/k"}},
		{"row_max", rowMax(t, 8, 24), []string{"compute_location/M", "vectorize/Y"}},
		{"row_sum", rowSum(t, 4, 64), []string{"compute_location/S", "vector_accumulate/S"}},
		{"row_sum_odd_rows", rowSum(t, 7, 48), []string{"vector_accumulate/S"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := run(t, tc.fn)
			sp, err := NewSpace(tc.fn, testTarget)
			check.NoError(t, err)
			rng := rand.New(rand.NewPCG(7, 8))
			sites := map[string]bool{}
			for i := range 24 {
				c, err := sp.Sample(rng)
				check.NoError(t, err)
				for _, d := range c.Decisions {
					sites[d.Site] = true
				}
				got := run(t, c.Func)
				for j := range want {
					if got[j] != want[j] {
						t.Fatalf("sample %d: element %d = %v, want %v\ntrace:\n%s\n%s", i, j, got[j], want[j], strings.Join(c.Trace, "\n"), script.Print(c.Func))
					}
				}
				r, err := sp.Candidate(Record{Schedule: c.Schedule, Decisions: c.Decisions})
				check.NoError(t, err)
				check.True(t, ir.StructuralEqual(r.Func, c.Func), "replay differs")
				check.Equal(t, strings.Join(r.Trace, "\n"), strings.Join(c.Trace, "\n"))
				if m, ok := Mutate(rng, c.Decisions); ok {
					mc, err := sp.complete(rng, c.Schedule, m)
					if err == nil {
						got := run(t, mc.Func)
						for j := range want {
							check.Equal(t, got[j], want[j], fmt.Sprint("mutant element ", j))
						}
					}
				}
			}
			for _, w := range tc.want {
				found := false
				for s := range sites {
					found = found || strings.HasPrefix(s, w)
				}
				check.True(t, found, "no choice", w, "among", sites)
			}
		})
	}
}

// TestSpaceParallel: parallelism is not a sampled yes/no (candidates are
// often timed on one core, where it cannot show): every candidate of a
// large matmul whose tiling leaves an outer spatial loop of more than one
// iteration runs a loop in parallel, and a small nest stays serial.
func TestSpaceParallel(t *testing.T) {
	sp, err := NewSpace(matmulFunc(t, 1024, 1024, 1024), rules.Target{Kind: "cpu", VectorBytes: 64})
	check.NoError(t, err)
	rng := rand.New(rand.NewPCG(5, 6))
	for range 40 {
		c, err := sp.apply(rng, nil)
		check.NoError(t, err)
		outer := int64(1)
		for _, d := range c.Decisions {
			if d.Site == "tile/C/i" || d.Site == "tile/C/j" {
				outer *= d.Tile[0] * d.Tile[1]
			}
		}
		trace := strings.Join(c.Trace, "\n")
		if outer > 1 {
			check.True(t, strings.Contains(trace, "sch.parallel("), "no parallel loop:\n", trace)
		}
	}
	small, err := NewSpace(rowMax(t, 8, 24), testTarget)
	check.NoError(t, err)
	c, err := small.apply(rng, nil)
	check.NoError(t, err)
	check.True(t, !strings.Contains(strings.Join(c.Trace, "\n"), "sch.parallel("), c.Trace)
}

// TestComputeLocationMoves: a row's maximum may be computed at the root or
// under its consumer's row loop, never under the loop over the row's
// elements (it would be computed again for each element).
func TestComputeLocationMoves(t *testing.T) {
	sp, err := NewSpace(rowMax(t, 8, 24), testTarget)
	check.NoError(t, err)
	c, err := sp.apply(rand.New(rand.NewPCG(1, 1)), nil)
	check.NoError(t, err)
	found := false
	for _, d := range c.Decisions {
		if d.Site == "compute_location/M" {
			found = true
			check.Equal(t, d.N, 2) // the root or the consumer's i
		}
	}
	check.True(t, found, c.Decisions)
}

// TestSpaceUntunable: a function without loops has nothing to tune.
func TestSpaceUntunable(t *testing.T) {
	A := te.Placeholder(te.Shape(), ir.Float32, "A")
	B := te.Compute(te.Shape(), func(_ ...ir.Expr) ir.Expr { return ir.Add(A.At(), ir.F32(1)) }, "B")
	f, err := te.CreatePrimFunc([]*te.Tensor{A, B})
	check.NoError(t, err)
	_, err = NewSpace(f, testTarget)
	check.True(t, errors.Is(err, ErrUntunable), err)
	check.Error(t, err, "make no choice")
}

// TestReplayRefusesBadDecisions: a decision that does not fit, or a
// missing one, is an error naming the site.
func TestReplayRefusesBadDecisions(t *testing.T) {
	sp, err := NewSpace(matmulFunc(t, 16, 16, 8), testTarget)
	check.NoError(t, err)
	c, err := sp.apply(rand.New(rand.NewPCG(1, 2)), nil)
	check.NoError(t, err)
	bad := append([]Decision(nil), c.Decisions...)
	bad[0].Tile = []int64{3, 1, 1, 1}
	_, err = sp.Replay(bad)
	check.Error(t, err, bad[0].Site, "does not tile")
	_, err = sp.Replay(c.Decisions[1:])
	check.Error(t, err, c.Decisions[0].Site, "no decision")
}

// TestSoftmaxSpace: the space of a softmax keeps or inlines its
// exponentials, accumulates its reductions in vectors, and moves its
// stages under the normalization's row loop; every candidate computes
// what the unscheduled function does (within rounding: vector partial
// sums add in another order), and records made before the choices
// existed still replay (as the inlined, serial schedule they measured).
func TestSoftmaxSpace(t *testing.T) {
	x := te.Placeholder(te.Shape(4, 64), ir.Float32, "x")
	y, err := topi.Softmax(x, 1)
	check.NoError(t, err)
	f, err := te.CreatePrimFunc([]*te.Tensor{x, y})
	check.NoError(t, err)
	want := run(t, f)
	sp, err := NewSpace(f, testTarget)
	check.NoError(t, err)
	rng := rand.New(rand.NewPCG(3, 4))
	seen := map[string]bool{}
	for i := range 24 {
		c, err := sp.apply(rng, nil)
		check.NoError(t, err)
		for _, d := range c.Decisions {
			seen[fmt.Sprint(d.Site, "=", d.Choice)] = true
		}
		trace := strings.Join(c.Trace, "\n")
		if strings.Contains(trace, "compute_at(T_softmax_maxelem") && strings.Contains(trace, "compute_at(T_softmax_expsum") {
			seen["row fused"] = true
		}
		got := run(t, c.Func)
		for j := range want {
			if !(math.Abs(float64(got[j]-want[j])) <= 1e-6+1e-5*math.Abs(float64(want[j]))) {
				t.Fatalf("sample %d: element %d = %v, want %v\n%s\n%s", i, j, got[j], want[j], trace, script.Print(c.Func))
			}
		}
		r, err := sp.Replay(c.Decisions)
		check.NoError(t, err)
		check.True(t, ir.StructuralEqual(r.Func, c.Func), "replay differs")
		// The printed trace alone replays it too.
		rt, err := schedule.Replay(f, c.Trace)
		check.NoError(t, err, trace)
		check.True(t, ir.StructuralEqual(rt.Func(), c.Func), "the trace replays to another function:\n", trace)
		// A record made before the newer choices existed: the same
		// candidate with serial reductions (the other choices that this
		// changes drawn again), without the inline and vector_accumulate
		// decisions.
		serial := slices.Clone(c.Decisions)
		for i := range serial {
			if strings.HasPrefix(serial[i].Site, "vector_accumulate/") {
				serial[i].Choice = 0
			}
		}
		sc, err := sp.complete(rng, "", serial)
		check.NoError(t, err)
		var old []Decision
		for _, d := range sc.Decisions {
			if !strings.HasPrefix(d.Site, "inline/") && !strings.HasPrefix(d.Site, "vector_accumulate/") {
				old = append(old, d)
			}
		}
		o, err := sp.Replay(old)
		check.NoError(t, err)
		ot := strings.Join(o.Trace, "\n")
		check.True(t, strings.Contains(ot, "compute_inline(T_softmax_exp)") && !strings.Contains(ot, "rfactor"), ot)
	}
	for _, w := range []string{"inline/T_softmax_exp=0", "inline/T_softmax_exp=1", "vector_accumulate/T_softmax_maxelem=1",
		"vector_accumulate/T_softmax_expsum=2", "row fused"} {
		check.True(t, seen[w], "no sample with", w, "among", seen)
	}
}

// TestFeaturesSeeVectorAccumulation: a reduction vector_accumulate
// gave a vector of partial results still counts in the cost model's features,
// so accumulating in one vector register or in two are told apart.
func TestFeaturesSeeVectorAccumulation(t *testing.T) {
	x := te.Placeholder(te.Shape(4, 64), ir.Float32, "x")
	y, err := topi.Softmax(x, 1)
	check.NoError(t, err)
	f, err := te.CreatePrimFunc([]*te.Tensor{x, y})
	check.NoError(t, err)
	sp, err := NewSpace(f, testTarget)
	check.NoError(t, err)
	c, err := sp.apply(rand.New(rand.NewPCG(5, 5)), nil)
	check.NoError(t, err)
	with := func(vectors int) []float64 {
		ds := append([]Decision(nil), c.Decisions...)
		for i := range ds {
			if strings.HasPrefix(ds[i].Site, "vector_accumulate/") {
				ds[i].Choice = vectors
			}
		}
		// The loops the vector of partials makes have choices of their
		// own, drawn from the same seed for both.
		r, err := sp.complete(rand.New(rand.NewPCG(6, 6)), "", ds)
		check.NoError(t, err)
		check.True(t, strings.Contains(strings.Join(r.Trace, "\n"), "sch.rfactor("), r.Trace)
		return Features(r.Func)
	}
	one, two := with(1), with(2)
	check.True(t, !slices.Equal(one, two), "the same features for one and two vector registers:", one)
}

// TestUnrollCountsLanes: the schedule rules' unrolling counts the lanes
// of a vectorized loop inside the loops it unrolls, so no candidate's
// unrolled body has more than the largest unroll step of iterations and
// lanes (a bigger one costs the C compiler seconds and buys nothing).
func TestUnrollCountsLanes(t *testing.T) {
	sp, err := NewSpace(matmulFunc(t, 256, 256, 256), testTarget)
	check.NoError(t, err)
	rng := rand.New(rand.NewPCG(3, 4))
	unrolled := 0
	for i := 0; i < 64; i++ {
		c, err := sp.Sample(rng)
		check.NoError(t, err)
		if c.Schedule != "" {
			continue // the default rules' half unrolls as they choose
		}
		ir.Visit(c.Func.Body, func(n ir.Node) bool {
			f, ok := n.(*ir.For)
			if !ok || f.Kind != ir.ForUnrolled {
				return true
			}
			unrolled++
			if w := nestIterations(f); w > 256 {
				t.Fatalf("sample %d: an unrolled nest of %d iterations and lanes (the largest step is 256)\ntrace:\n%s", i, w, strings.Join(c.Trace, "\n"))
			}
			return false
		})
	}
	check.True(t, unrolled > 0, "no sample unrolled a loop")
}

// nestIterations is the largest product of constant loop extents along
// a path of nested loops from n down.
func nestIterations(n ir.Node) int64 {
	best := int64(1)
	ir.Visit(n, func(m ir.Node) bool {
		f, ok := m.(*ir.For)
		if !ok {
			return true
		}
		ext, _ := ir.IsConstInt(f.Extent)
		best = max(best, max(ext, 1)*nestIterations(f.Body))
		return false
	})
	return best
}
