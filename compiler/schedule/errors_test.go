package schedule

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/internal/check"
)

// fanout returns C = (A + 1) * 3 and D = (A + 1) * 2 through B.
func fanout() *ir.PrimFunc {
	A := te.Placeholder(te.Shape(4, 8), ir.Float32, "A")
	B := te.Compute(A.Shape, func(i, j ir.Expr) ir.Expr { return ir.Add(A.At(i, j), ir.F32(1)) }, "B")
	C := te.Compute(A.Shape, func(i, j ir.Expr) ir.Expr { return ir.Mul(B.At(i, j), ir.F32(3)) }, "C")
	D := te.Compute(A.Shape, func(i, j ir.Expr) ir.Expr { return ir.Mul(B.At(i, j), ir.F32(2)) }, "D")
	return mustFunc(A, C, D)
}

// TestPreconditions applies primitives where they cannot apply: each
// fails with an error naming the primitive and the reason, and leaves
// the schedule as it was.
func TestPreconditions(t *testing.T) {
	cases := []struct {
		name  string
		fn    func() *ir.PrimFunc
		apply func(t *testing.T, s *Schedule) error
		want  []string
	}{
		{"unknown block", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			_, err := s.GetBlock("X")
			return err
		}, []string{`get_block: no block named "X"`}},
		{"split stale loop", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			ls := loopsOf(t, s, "C")
			must[[]LoopRV](t)(s.Split(ls[0], 2, 2))
			_, err := s.Split(ls[0], 2, 2)
			return err
		}, []string{`split: loop "i" no longer exists`}},
		{"split two inferred factors", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			_, err := s.Split(loopsOf(t, s, "C")[0], -1, -1)
			return err
		}, []string{"split: factors [-1 -1] of loop", "at most one may be -1"}},
		{"split zero factor", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			_, err := s.Split(loopsOf(t, s, "C")[0], 0, 4)
			return err
		}, []string{`split: factor 0 of loop "i" is 0`}},
		{"split one factor", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			_, err := s.Split(loopsOf(t, s, "C")[0], 4)
			return err
		}, []string{`split: loop "i" needs at least two factors, got 1`}},
		{"split too small", func() *ir.PrimFunc { return matmul(16, 4, 4) }, func(t *testing.T, s *Schedule) error {
			_, err := s.Split(loopsOf(t, s, "C")[0], 2, 4)
			return err
		}, []string{`split: factors [2 4] of loop "i" cover 8 iterations, the loop has 16`}},
		{"split symbolic without inferred factor", vecadd, func(t *testing.T, s *Schedule) error {
			_, err := s.Split(loopsOf(t, s, "C")[0], 4, 4)
			return err
		}, []string{`split: loop "i" has the symbolic extent n; give one factor as -1`}},
		{"split parallel loop", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			l := loopsOf(t, s, "C")[0]
			check.NoError(t, s.Parallel(l))
			_, err := s.Split(l, 2, 2)
			return err
		}, []string{`split: loop "i" is parallel; split loops before changing their kind`}},
		{"fuse not nested", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			ls := loopsOf(t, s, "C")
			_, err := s.Fuse(ls[0], ls[2])
			return err
		}, []string{`fuse: loop "k" is not directly and alone inside loop "i"`}},
		{"fuse one loop", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			_, err := s.Fuse(loopsOf(t, s, "C")[0])
			return err
		}, []string{"fuse: needs at least two loops, got 1"}},
		{"reorder across nests", chain4x4, func(t *testing.T, s *Schedule) error {
			return s.Reorder(loopsOf(t, s, "B")[0], loopsOf(t, s, "C")[1])
		}, []string{`reorder: loop "i" is not in the nest of loop "j"`}},
		{"reorder with a statement between", func() *ir.PrimFunc { return matmul(8, 8, 4) }, func(t *testing.T, s *Schedule) error {
			c := must[BlockRV](t)(s.GetBlock("C"))
			ls := loopsOf(t, s, "C")
			must[BlockRV](t)(s.DecomposeReduction(c, ls[2]))
			return s.Reorder(ls[2], ls[1])
		}, []string{`reorder: loop "j" has statements beside loop "k"`}},
		{"parallel reduction loop", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			return s.Parallel(loopsOf(t, s, "C")[2])
		}, []string{`parallel: loop "k" is bound to the reduce iteration variable "v_k" of block "C"`}},
		{"vectorize dynamic extent", vecadd, func(t *testing.T, s *Schedule) error {
			return s.Vectorize(loopsOf(t, s, "C")[0])
		}, []string{`vectorize: cannot vectorize loop "i": extent n is not constant`}},
		{"vectorize reduction loop", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			return s.Vectorize(loopsOf(t, s, "C")[2])
		}, []string{`vectorize: loop "k" is bound to the reduce iteration variable "v_k"`}},
		{"bind unknown thread", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			return s.Bind(loopsOf(t, s, "C")[0], "threadIdx.w")
		}, []string{`bind: unknown thread axis "threadIdx.w"`}},
		{"bind twice to one axis", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			ls := loopsOf(t, s, "C")
			check.NoError(t, s.Bind(ls[0], "threadIdx.x"))
			return s.Bind(ls[1], "threadIdx.x")
		}, []string{`bind: loop "j" is inside loop "i", already bound to "threadIdx.x"`}},
		{"annotate bad value", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			return s.Annotate(loopsOf(t, s, "C")[0], "x", []int{1})
		}, []string{`annotate: value [1] of "x" has type []int`}},
		{"cache_read bad index", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			_, err := s.CacheRead(must[BlockRV](t)(s.GetBlock("C")), 5, "local")
			return err
		}, []string{`cache_read: block "C" has 2 read regions, no read 5`}},
		{"cache_write bad index", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			_, err := s.CacheWrite(must[BlockRV](t)(s.GetBlock("C")), 1, "local")
			return err
		}, []string{`cache_write: block "C" has 1 write regions, no write 1`}},
		{"compute_at loop does not cover a reader", fanout, func(t *testing.T, s *Schedule) error {
			return s.ComputeAt(must[BlockRV](t)(s.GetBlock("B")), loopsOf(t, s, "C")[1])
		}, []string{`compute_at: loop "j" does not cover the region block "D" reads`}},
		{"compute_at of an output block", chain4x4, func(t *testing.T, s *Schedule) error {
			return s.ComputeAt(must[BlockRV](t)(s.GetBlock("C")), loopsOf(t, s, "B")[1])
		}, []string{`compute_at: block "C" comes after loop "j"`}},
		{"compute_at writes a parameter", func() *ir.PrimFunc { return twoStage(4, 4) }, func(t *testing.T, s *Schedule) error {
			return s.ComputeAt(must[BlockRV](t)(s.GetBlock("B")), loopsOf(t, s, "D")[0])
		}, []string{`compute_at: block "B" writes "B", a parameter of the function`}},
		{"compute_at into its own loops", chain4x4, func(t *testing.T, s *Schedule) error {
			return s.ComputeAt(must[BlockRV](t)(s.GetBlock("B")), loopsOf(t, s, "B")[1])
		}, []string{`compute_at: block "B" is already under loop "j"`}},
		{"reverse_compute_at before its producer", chain4x4, func(t *testing.T, s *Schedule) error {
			return s.ReverseComputeAt(must[BlockRV](t)(s.GetBlock("B")), loopsOf(t, s, "C")[0])
		}, []string{`reverse_compute_at: block "B" comes before loop "i"`}},
		{"compute_inline a reduction", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			return s.ComputeInline(must[BlockRV](t)(s.GetBlock("C")))
		}, []string{`compute_inline: block "C" is a reduction`}},
		{"compute_inline an output", chain4x4, func(t *testing.T, s *Schedule) error {
			return s.ComputeInline(must[BlockRV](t)(s.GetBlock("C")))
		}, []string{`compute_inline: block "C" writes "C", a parameter of the function`}},
		{"inlined block is gone", chain4x4, func(t *testing.T, s *Schedule) error {
			b := must[BlockRV](t)(s.GetBlock("B"))
			check.NoError(t, s.ComputeInline(b))
			_, err := s.GetLoops(b)
			return err
		}, []string{`get_loops: block "B" no longer exists (inlined into its consumers)`}},
		{"decompose without init", chain4x4, func(t *testing.T, s *Schedule) error {
			_, err := s.DecomposeReduction(must[BlockRV](t)(s.GetBlock("B")), loopsOf(t, s, "B")[0])
			return err
		}, []string{`decompose_reduction: block "B" has no init`}},
		{"decompose at a loop that does not enclose", chain4x4, func(t *testing.T, s *Schedule) error {
			_, err := s.DecomposeReduction(must[BlockRV](t)(s.GetBlock("B")), loopsOf(t, s, "C")[0])
			return err
		}, []string{`decompose_reduction: block "B" has no init`}},
		{"decompose below the reduction loop", func() *ir.PrimFunc { return matmul(4, 4, 4) }, func(t *testing.T, s *Schedule) error {
			ls := loopsOf(t, s, "C")
			check.NoError(t, s.Reorder(ls[2], ls[1]))
			_, err := s.DecomposeReduction(must[BlockRV](t)(s.GetBlock("C")), ls[1])
			return err
		}, []string{`decompose_reduction: loop "k", above loop "j", carries the reduction of block "C"`}},
		{"decompose over a loop that repeats the update", twoStageReduce, func(t *testing.T, s *Schedule) error {
			sb := must[BlockRV](t)(s.GetBlock("S"))
			pl := loopsOf(t, s, "P")
			check.NoError(t, s.ComputeAt(sb, pl[1]))
			_, err := s.DecomposeReduction(sb, pl[0])
			return err
		}, []string{`decompose_reduction: cannot prove that loop "j", between loop "i" and block "S"`}},
		{"decompose at a foreign loop", func() *ir.PrimFunc { return twoStageReduce() }, func(t *testing.T, s *Schedule) error {
			_, err := s.DecomposeReduction(must[BlockRV](t)(s.GetBlock("S")), loopsOf(t, s, "P")[0])
			return err
		}, []string{`decompose_reduction: loop "i" does not enclose block "S"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := New(c.fn())
			check.NoError(t, err)
			err = c.apply(t, s)
			check.Error(t, err, c.want...)
			before := s.Func()
			check.NoError(t, ir.Verify(before))
		})
	}
}

func chain4x4() *ir.PrimFunc { return chain(4, 4) }

// twoStageReduce returns P = A / S with S the row sums of A.
func twoStageReduce() *ir.PrimFunc {
	A := te.Placeholder(te.Shape(4, 8), ir.Float32, "A")
	k := te.ReduceAxis(ir.RangeFromExtent(ir.I32(8)), "k")
	S := te.Compute(te.Shape(4), func(i ir.Expr) ir.Expr { return te.Sum(A.At(i, k), k) }, "S")
	P := te.Compute(A.Shape, func(i, j ir.Expr) ir.Expr { return ir.Div(A.At(i, j), S.At(i)) }, "P")
	return mustFunc(A, P)
}

// TestFailureLeavesStateUnchanged checks that a failing primitive keeps
// the function and the trace as they were.
func TestFailureLeavesStateUnchanged(t *testing.T) {
	s, err := New(matmul(8, 8, 8))
	check.NoError(t, err)
	ls := loopsOf(t, s, "C")
	f, trace := s.Func(), s.Trace()
	check.True(t, s.Parallel(ls[2]) != nil)
	_, err = s.Split(ls[0], 3, 2)
	check.True(t, err != nil)
	check.True(t, s.Func() == f, "function unchanged")
	check.Equal(t, s.Trace(), trace)
}

// TestCopyAndTrace forks a schedule and prints what each branch applied.
func TestCopyAndTrace(t *testing.T) {
	s, err := New(matmul(8, 8, 8))
	check.NoError(t, err)
	c := must[BlockRV](t)(s.GetBlock("C"))
	ls := must[[]LoopRV](t)(s.GetLoops(c))
	s2 := s.Copy()
	must[[]LoopRV](t)(s.Split(ls[0], -1, 4))
	check.NoError(t, s2.Parallel(ls[0]))
	check.Equal(t, s.Trace(), []string{`C = sch.get_block("C")`, "i, j, k = sch.get_loops(C)", "i_0, i_1 = sch.split(loop=i, factors=[None, 4])"})
	check.Equal(t, s2.Trace(), []string{`C = sch.get_block("C")`, "i, j, k = sch.get_loops(C)", "sch.parallel(i)"})
	// The loop split in s still exists in s2.
	must[[]LoopRV](t)(s2.Split(ls[1], 2, 4))
}

// TestNew rejects functions that are not TensorIR.
func TestNew(t *testing.T) {
	a := ir.NewBuffer("A", ir.Float32, te.Shape(4), "")
	i := ir.NewVar("i", ir.Int32)
	f := ir.NewPrimFunc([]*ir.Buffer{a}, ir.NewFor(i, ir.I32(0), ir.I32(4), ir.ForSerial, a.Store(ir.F32(0), i)), nil)
	_, err := New(f)
	check.Error(t, err, "not a root block")
	_, err = New(nil)
	check.Error(t, err, "nil function")
	_, err = FromModule(ir.NewIRModule(), "main")
	check.Error(t, err, `module has no PrimFunc "main"`)
}
