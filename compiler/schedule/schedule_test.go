package schedule

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/internal/check"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the printer's output")

// matmul returns C = A × B for A: m×k, B: k×n.
func matmul(m, n, k int64) *ir.PrimFunc {
	A := te.Placeholder(te.Shape(m, k), ir.Float32, "A")
	B := te.Placeholder(te.Shape(k, n), ir.Float32, "B")
	r := te.ReduceAxis(ir.RangeFromExtent(ir.I32(k)), "k")
	C := te.Compute(te.Shape(m, n), func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(A.At(i, r), B.At(r, j)), r)
	}, "C")
	return mustFunc(A, B, C)
}

// vecadd returns C = A + B over a symbolic length n.
func vecadd() *ir.PrimFunc {
	n := te.Var("n")
	A := te.Placeholder([]ir.Expr{n}, ir.Float32, "A")
	B := te.Placeholder([]ir.Expr{n}, ir.Float32, "B")
	C := te.Compute(A.Shape, func(i ir.Expr) ir.Expr { return ir.Add(A.At(i), B.At(i)) }, "C")
	return mustFunc(A, B, C)
}

// twoStage returns D = relu(A * 2) + 1 through the intermediate B, and a
// row sum E of B: a producer with two consumers.
func twoStage(m, n int64) *ir.PrimFunc {
	A := te.Placeholder(te.Shape(m, n), ir.Float32, "A")
	B := te.Compute(A.Shape, func(i, j ir.Expr) ir.Expr { return ir.Max(ir.Mul(A.At(i, j), ir.F32(2)), ir.F32(0)) }, "B")
	D := te.Compute(A.Shape, func(i, j ir.Expr) ir.Expr { return ir.Add(B.At(i, j), ir.F32(1)) }, "D")
	return mustFunc(A, D, B)
}

// chain returns C = (A + 1) * 3 through the intermediate B.
func chain(m, n int64) *ir.PrimFunc {
	A := te.Placeholder(te.Shape(m, n), ir.Float32, "A")
	B := te.Compute(A.Shape, func(i, j ir.Expr) ir.Expr { return ir.Add(A.At(i, j), ir.F32(1)) }, "B")
	C := te.Compute(A.Shape, func(i, j ir.Expr) ir.Expr { return ir.Mul(B.At(i, j), ir.F32(3)) }, "C")
	return mustFunc(A, C)
}

func mustFunc(ts ...*te.Tensor) *ir.PrimFunc {
	f, err := te.CreatePrimFunc(ts)
	if err != nil {
		panic(err)
	}
	return f
}

// golden compares text with testdata/name.golden (rewritten with -update).
func golden(t *testing.T, name, text string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		check.NoError(t, os.MkdirAll("testdata", 0o755))
		check.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	}
	want, err := os.ReadFile(path)
	check.NoError(t, err, "run go test -update to create", path)
	if text != string(want) {
		t.Fatalf("%s differs from %s (run go test -update to accept):\n%s", name, path, text)
	}
}

// schedCase is one differential test: a function, a schedule applied to
// it, the expected text (golden file) and the sizes to run it with.
type schedCase struct {
	name  string
	fn    func() *ir.PrimFunc
	sizes map[string]int64
	apply func(t *testing.T, s *Schedule)
	// compiled also runs the scheduled function as generated C.
	compiled bool
}

// runCases schedules each case, compares the printed result with its
// golden file, checks that it prints and parses back, and runs the
// scheduled and unscheduled functions on the same inputs.
func runCases(t *testing.T, cases []schedCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := c.fn()
			s, err := New(f)
			check.NoError(t, err)
			c.apply(t, s)
			g := s.Func()
			check.NoError(t, ir.Verify(g))
			text := script.Print(g)
			golden(t, c.name, text)
			m, err := script.Parse(c.name+".py", text)
			check.NoError(t, err)
			check.Equal(t, script.Print(m.PrimFunc("main")), text, "print(parse(print(f)))")
			want := runFunc(t, f, c.sizes)
			sameResults(t, runFunc(t, g, c.sizes), want)
			checkReplay(t, f, s)
			if c.compiled {
				sameResults(t, runCompiled(t, g, c.sizes), want)
			}
		})
	}
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		check.NoError(t, err)
		return v
	}
}

func loopsOf(t *testing.T, s *Schedule, block string) []LoopRV {
	t.Helper()
	b, err := s.GetBlock(block)
	check.NoError(t, err)
	ls, err := s.GetLoops(b)
	check.NoError(t, err)
	return ls
}

func TestLoopPrimitives(t *testing.T) {
	runCases(t, []schedCase{
		{name: "split", fn: func() *ir.PrimFunc { return matmul(16, 16, 8) }, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			must[[]LoopRV](t)(s.Split(ls[0], -1, 2, 4))
		}},
		{name: "split_guarded", fn: func() *ir.PrimFunc { return matmul(10, 6, 3) }, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			must[[]LoopRV](t)(s.Split(ls[1], 4, -1))
			must[[]LoopRV](t)(s.Split(ls[0], 3, 4))
		}},
		{name: "split_symbolic", fn: vecadd, sizes: map[string]int64{"n": 37}, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			io := must[[]LoopRV](t)(s.Split(ls[0], -1, 8))
			check.NoError(t, s.Parallel(io[0]))
		}},
		{name: "fuse", fn: func() *ir.PrimFunc { return matmul(6, 10, 4) }, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			f := must[LoopRV](t)(s.Fuse(ls[0], ls[1]))
			must[[]LoopRV](t)(s.Split(f, -1, 4))
		}},
		{name: "reorder", fn: func() *ir.PrimFunc { return matmul(8, 8, 8) }, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			i := must[[]LoopRV](t)(s.Split(ls[0], -1, 4))
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 4))
			check.NoError(t, s.Reorder(i[0], j[0], ls[2], i[1], j[1]))
			check.NoError(t, s.Vectorize(j[1]))
			check.NoError(t, s.Unroll(i[1]))
			check.NoError(t, s.Annotate(ls[2], "pragma_auto_unroll_max_step", int64(16)))
		}},
		{name: "parallel_seed003", fn: func() *ir.PrimFunc { return matmul(8, 8, 8) }, apply: func(t *testing.T, s *Schedule) {
			check.NoError(t, s.Parallel(loopsOf(t, s, "C")[0]))
		}},
		{name: "bind", fn: func() *ir.PrimFunc { return matmul(8, 64, 4) }, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 32))
			check.NoError(t, s.Bind(ls[0], "blockIdx.x"))
			check.NoError(t, s.Bind(j[1], "threadIdx.x"))
		}},
	})
}

func TestDataflowPrimitives(t *testing.T) {
	runCases(t, []schedCase{
		{name: "cache_read", fn: func() *ir.PrimFunc { return matmul(8, 8, 4) }, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			must[BlockRV](t)(s.CacheRead(c, 1, "global"))
		}},
		{name: "cache_write", fn: func() *ir.PrimFunc { return matmul(8, 8, 4) }, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			must[BlockRV](t)(s.CacheWrite(c, 0, "local"))
		}},
		{name: "compute_at", fn: func() *ir.PrimFunc { return chain(8, 12) }, apply: func(t *testing.T, s *Schedule) {
			b := must[BlockRV](t)(s.GetBlock("B"))
			ls := loopsOf(t, s, "C")
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 4))
			check.NoError(t, s.ComputeAt(b, j[0]))
		}},
		{name: "compute_at_guarded", fn: func() *ir.PrimFunc { return chain(8, 10) }, apply: func(t *testing.T, s *Schedule) {
			b := must[BlockRV](t)(s.GetBlock("B"))
			ls := loopsOf(t, s, "C")
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 4))
			check.NoError(t, s.ComputeAt(b, j[0]))
		}},
		{name: "compute_at_cache_read", fn: func() *ir.PrimFunc { return matmul(8, 16, 8) }, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			ls := loopsOf(t, s, "C")
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 4))
			check.NoError(t, s.Reorder(j[0], ls[0]))
			bl := must[BlockRV](t)(s.CacheRead(c, 1, "global"))
			check.NoError(t, s.ComputeAt(bl, j[0]))
		}},
		{name: "compute_at_stencil", fn: stencil, apply: func(t *testing.T, s *Schedule) {
			b := must[BlockRV](t)(s.GetBlock("B"))
			i := must[[]LoopRV](t)(s.Split(loopsOf(t, s, "C")[0], -1, 4))
			check.NoError(t, s.ComputeAt(b, i[0]))
		}},
		{name: "cache_write_inside_nest", fn: func() *ir.PrimFunc { return chain(4, 8) }, apply: func(t *testing.T, s *Schedule) {
			b := must[BlockRV](t)(s.GetBlock("B"))
			check.NoError(t, s.ComputeAt(b, loopsOf(t, s, "C")[0]))
			must[BlockRV](t)(s.CacheWrite(b, 0, "local"))
		}},
		{name: "reverse_compute_at", fn: func() *ir.PrimFunc { return chain(8, 12) }, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			ls := loopsOf(t, s, "B")
			i := must[[]LoopRV](t)(s.Split(ls[0], -1, 2))
			check.NoError(t, s.ReverseComputeAt(c, i[0]))
		}},
		{name: "compute_inline", fn: func() *ir.PrimFunc { return chain(4, 6) }, apply: func(t *testing.T, s *Schedule) {
			check.NoError(t, s.ComputeInline(must[BlockRV](t)(s.GetBlock("B"))))
		}},
		{name: "decompose_reduction", fn: func() *ir.PrimFunc { return matmul(8, 8, 4) }, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			ls := loopsOf(t, s, "C")
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 4))
			check.NoError(t, s.Reorder(ls[2], j[1]))
			init := must[BlockRV](t)(s.DecomposeReduction(c, ls[2]))
			check.Equal(t, init.String(), "C_init")
			check.NoError(t, s.Vectorize(j[1]))
			ils := must[[]LoopRV](t)(s.GetLoops(init))
			check.NoError(t, s.Vectorize(ils[len(ils)-1]))
			// The handle follows the renamed block.
			ls2 := must[[]LoopRV](t)(s.GetLoops(c))
			check.Equal(t, len(ls2), 4)
		}},
	})
}

// checkReplay replays the trace of s on f and wants the same function
// and the same trace.
func checkReplay(t *testing.T, f *ir.PrimFunc, s *Schedule) {
	t.Helper()
	r, err := Replay(f, s.Trace())
	check.NoError(t, err)
	if !ir.StructuralEqual(r.Func(), s.Func()) {
		t.Fatalf("the replayed trace gives another function:\n%s\nwant\n%s", script.Print(r.Func()), script.Print(s.Func()))
	}
	check.Equal(t, strings.Join(r.Trace(), "\n"), strings.Join(s.Trace(), "\n"), "trace of the replay")
}
