package auto

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/compiler/topi"
	"github.com/kiln-ml/kiln/internal/check"
)

// globalPoolFunc is a global average (a mean) or maximum pool over NCHW
// data of the given shape.
func globalPoolFunc(t *testing.T, sh [4]int64, max bool) *ir.PrimFunc {
	t.Helper()
	x := te.Placeholder(ir.Dims(sh[0], sh[1], sh[2], sh[3]), ir.Float32, "x")
	pool := topi.Mean
	if max {
		pool = topi.Max
	}
	y, err := pool(x, []int64{2, 3}, true)
	check.NoError(t, err)
	f, err := te.CreatePrimFunc([]*te.Tensor{x, y})
	check.NoError(t, err)
	return f
}

// TestGlobalMaxPool checks global max pooling, whose reduction writes the
// output with no epilogue after it, against the unscheduled function, in
// the interpreter and compiled.
func TestGlobalMaxPool(t *testing.T) {
	var fs []*ir.PrimFunc
	var opts []Options
	for _, sh := range [][4]int64{{1, 5, 13, 13}, {2, 3, 4, 4}, {1, 3, 1, 3}} {
		f := globalPoolFunc(t, sh, true)
		g, rule, err := FuncRule(f, Options{ParallelFlops: 1})
		check.NoError(t, err)
		check.Equal(t, rule, RuleGlobalPool)
		check.NoError(t, ir.Verify(g))
		nearSlices(t, outputOf(t, g), outputOf(t, f))
		fs, opts = append(fs, f), append(opts, Options{ParallelFlops: 1})
	}
	if testing.Short() {
		return
	}
	src, funcs := scheduledSource(t, "global_max_pool", fs, opts)
	checkCompiled(t, src, funcs)
}

// TestReductionTraces replays the traces of the global pooling rule and
// of the row reductions' vectors on the unscheduled functions: the
// printed primitives give the same PrimFunc as the rule.
func TestReductionTraces(t *testing.T) {
	t.Run("global_pool", func(t *testing.T) {
		f := globalPoolFunc(t, [4]int64{1, 6, 7, 7}, false)
		s, err := inlinedAfter(f, "x_red")
		check.NoError(t, err)
		check.NoError(t, globalPoolSchedule(s, "x_red", "T_divide", 16, 49, true))
		replayed(t, f, s)
		g, _, err := Func(f, Options{ParallelFlops: 1})
		check.NoError(t, err)
		check.True(t, ir.StructuralEqual(g, s.Func()), "the rule's function is the trace's")
	})
	t.Run("vector_rows", func(t *testing.T) {
		f := legalized(t, "sum", map[string]any{"axis": []int64{1}}, []int64{5, 64})
		s, err := schedule.New(f)
		check.NoError(t, err)
		n, err := vectorRowsOn(s, Options{VectorBytes: 64}, RuleGeneric)
		check.NoError(t, err)
		check.Equal(t, n, 1, "row reductions scheduled")
		replayed(t, f, s)
		sameOutput(t, f, s.Func(), 1e-5)
	})
}

// replayed checks that s's trace, replayed on f, gives s's function.
func replayed(t *testing.T, f *ir.PrimFunc, s *schedule.Schedule) {
	t.Helper()
	trace := s.Trace()
	r, err := schedule.Replay(f, trace)
	check.NoError(t, err, strings.Join(trace, "\n"))
	check.True(t, ir.StructuralEqual(r.Func(), s.Func()), "replayed function differs:\n%s\nwant\n%s", script.Print(r.Func()), script.Print(s.Func()))
}
