package schedule

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/internal/check"
)

// epilogue returns D[j, i] = (A × B)[i, j] + bias[j] through the
// intermediate C: a reduction with a transposing consumer.
func epilogue(m, n, k int64) *ir.PrimFunc {
	A := te.Placeholder(te.Shape(m, k), ir.Float32, "A")
	B := te.Placeholder(te.Shape(k, n), ir.Float32, "B")
	bias := te.Placeholder(te.Shape(n), ir.Float32, "bias")
	r := te.ReduceAxis(ir.RangeFromExtent(ir.I32(k)), "k")
	C := te.Compute(te.Shape(m, n), func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(A.At(i, r), B.At(r, j)), r)
	}, "C")
	D := te.Compute(te.Shape(n, m), func(j, i ir.Expr) ir.Expr { return ir.Add(C.At(i, j), bias.At(j)) }, "D")
	return mustFunc(A, B, bias, D)
}

// transposed returns C[j, i] = (A[i, j] + 1) * 3 through B.
func transposed(m, n int64) *ir.PrimFunc {
	A := te.Placeholder(te.Shape(m, n), ir.Float32, "A")
	B := te.Compute(A.Shape, func(i, j ir.Expr) ir.Expr { return ir.Add(A.At(i, j), ir.F32(1)) }, "B")
	C := te.Compute(te.Shape(n, m), func(j, i ir.Expr) ir.Expr { return ir.Mul(B.At(i, j), ir.F32(3)) }, "C")
	return mustFunc(A, C)
}

func TestReverseComputeInline(t *testing.T) {
	runCases(t, []schedCase{
		{name: "reverse_compute_inline", fn: func() *ir.PrimFunc { return chain(5, 7) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			check.NoError(t, s.ReverseComputeInline(must[BlockRV](t)(s.GetBlock("C"))))
		}},
		{name: "reverse_compute_inline_transposed", fn: func() *ir.PrimFunc { return transposed(5, 3) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "B")
			must[[]LoopRV](t)(s.Split(ls[1], -1, 2))
			check.NoError(t, s.ReverseComputeInline(must[BlockRV](t)(s.GetBlock("C"))))
		}},
	})
}

func TestReverseComputeInlineErrors(t *testing.T) {
	for _, tt := range []struct {
		name  string
		fn    *ir.PrimFunc
		block string
		want  string
	}{
		{"no producer", chain(4, 4), "B", `reverse_compute_inline: block "B" reads no buffer that a block of its scope produces`},
		{"reduction producer", epilogue(4, 4, 3), "D", `reverse_compute_inline: the producer of "C": block "C" is a reduction (it has an init)`},
		{"reduction", matmul(4, 4, 4), "C", `reverse_compute_inline: block "C" is a reduction (it has an init)`},
		{"other reader", twoStage(4, 4), "D", `reverse_compute_inline: block "B" reads "B" … `},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.fn)
			check.NoError(t, err)
			before := s.Func()
			err = s.ReverseComputeInline(must[BlockRV](t)(s.GetBlock(tt.block)))
			check.True(t, err != nil, "no error")
			if !strings.HasSuffix(tt.want, "… ") {
				check.Equal(t, err.Error(), tt.want)
			}
			check.True(t, s.Func() == before, "the schedule changed")
			check.Equal(t, len(s.Trace()), 1, "a failed primitive is not recorded")
		})
	}
}

func TestBufferPrimitives(t *testing.T) {
	runCases(t, []schedCase{
		{name: "set_scope", fn: func() *ir.PrimFunc { return chain(5, 7) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			check.NoError(t, s.SetScope(must[BlockRV](t)(s.GetBlock("B")), 0, "local"))
		}},
		{name: "storage_align", fn: func() *ir.PrimFunc { return chain(5, 7) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			b := must[BlockRV](t)(s.GetBlock("B"))
			check.NoError(t, s.StorageAlign(b, 0, 0, 8, 1))
			check.NoError(t, s.StorageAlign(b, 0, -1, 4, 2))
			check.NoError(t, s.StorageAlign(b, 0, 0, 16, 3)) // replaces the first
		}},
		{name: "storage_align_cache_read", fn: func() *ir.PrimFunc { return matmul(6, 10, 5) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			bl := must[BlockRV](t)(s.CacheRead(c, 1, "global"))
			check.NoError(t, s.StorageAlign(bl, 0, 0, 32, 8))
			check.NoError(t, s.SetScope(bl, 0, "local"))
		}},
	})
}

func TestBufferPrimitiveErrors(t *testing.T) {
	for _, tt := range []struct {
		name  string
		apply func(s *Schedule, b BlockRV) error
		block string
		want  string
	}{
		{"scope of a parameter", func(s *Schedule, b BlockRV) error { return s.SetScope(b, 0, "local") }, "C", `set_scope: block "C" writes "C", a parameter of the function: only a buffer that a block allocates can change`},
		{"unknown scope", func(s *Schedule, b BlockRV) error { return s.SetScope(b, 0, "texture") }, "B", `set_scope: unknown storage scope "texture" (want one of [global local shared shared.dyn])`},
		{"no such write", func(s *Schedule, b BlockRV) error { return s.SetScope(b, 1, "local") }, "B", `set_scope: block "B" has 1 write regions, no write 1`},
		{"axis", func(s *Schedule, b BlockRV) error { return s.StorageAlign(b, 0, 2, 8, 0) }, "B", `storage_align: axis 2 is out of range for "B", which has 2 dimensions`},
		{"factor", func(s *Schedule, b BlockRV) error { return s.StorageAlign(b, 0, 0, 0, 0) }, "B", `storage_align: factor 0 is not positive`},
		{"offset", func(s *Schedule, b BlockRV) error { return s.StorageAlign(b, 0, 0, 8, 8) }, "B", `storage_align: offset 8 is not in [0, factor 8)`},
		{"align a parameter", func(s *Schedule, b BlockRV) error { return s.StorageAlign(b, 0, 0, 8, 1) }, "C", `storage_align: block "C" writes "C", a parameter of the function: only a buffer that a block allocates can change`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(chain(4, 4))
			check.NoError(t, err)
			before := s.Func()
			err = tt.apply(s, must[BlockRV](t)(s.GetBlock(tt.block)))
			check.True(t, err != nil, "no error")
			check.Equal(t, err.Error(), tt.want)
			check.True(t, s.Func() == before, "the schedule changed")
		})
	}
}

// rowReduce returns C[i] = Σ or max over k of A[i, k].
func rowReduce(m, k int64, max bool) *ir.PrimFunc {
	A := te.Placeholder(te.Shape(m, k), ir.Float32, "A")
	r := te.ReduceAxis(ir.RangeFromExtent(ir.I32(k)), "k")
	C := te.Compute(te.Shape(m), func(i ir.Expr) ir.Expr {
		if max {
			return te.Max(A.At(i, r), r)
		}
		return te.Sum(A.At(i, r), r)
	}, "C")
	return mustFunc(A, C)
}

func TestRFactor(t *testing.T) {
	runCases(t, []schedCase{
		{name: "rfactor", fn: func() *ir.PrimFunc { return rowReduce(3, 10, false) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			k := must[[]LoopRV](t)(s.Split(ls[1], -1, 4))
			rf := must[BlockRV](t)(s.RFactor(k[1], 0))
			check.Equal(t, rf.String(), "C_rf")
			// k_1 binds a spatial variable of C_rf now: it can be the
			// vector loop once it is innermost.
			check.NoError(t, s.Reorder(ls[0], k[0], k[1]))
			must[BlockRV](t)(s.DecomposeReduction(rf, k[0]))
			check.NoError(t, s.Vectorize(k[1]))
			check.NoError(t, s.Parallel(loopsOf(t, s, "C")[0]))
		}},
		{name: "rfactor_max_last_axis", fn: func() *ir.PrimFunc { return rowReduce(4, 9, true) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			k := must[[]LoopRV](t)(s.Split(ls[1], 3, -1))
			must[BlockRV](t)(s.RFactor(k[0], -1))
		}},
		{name: "rfactor_matmul", fn: func() *ir.PrimFunc { return matmul(5, 6, 7) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			must[BlockRV](t)(s.RFactor(ls[2], 1))
		}},
	})
}

func TestRFactorErrors(t *testing.T) {
	for _, tt := range []struct {
		name  string
		fn    *ir.PrimFunc
		apply func(s *Schedule, ls []LoopRV) error
		want  string
	}{
		{"spatial loop", matmul(4, 4, 4), func(s *Schedule, ls []LoopRV) error { _, err := s.RFactor(ls[0], 0); return err },
			`rfactor: loop "i" binds no reduction iteration variable of a block under it`},
		{"axis", matmul(4, 4, 4), func(s *Schedule, ls []LoopRV) error { _, err := s.RFactor(ls[2], 3); return err },
			`rfactor: factor axis 3 is out of range for the 2 dimensions of "C" and one more`},
		{"no init", matmul(4, 4, 4), func(s *Schedule, ls []LoopRV) error {
			c := must[BlockRV](t)(s.GetBlock("C"))
			if _, err := s.DecomposeReduction(c, ls[2]); err != nil {
				return err
			}
			_, err := s.RFactor(ls[2], 0)
			return err
		}, `rfactor: block "C_update" has no init (decompose_reduction separated it? rfactor it first)`},
		{"gone loop", matmul(4, 4, 4), func(s *Schedule, ls []LoopRV) error {
			if _, err := s.Split(ls[2], 2, 2); err != nil {
				return err
			}
			_, err := s.RFactor(ls[2], 0)
			return err
		}, `rfactor: loop "k" no longer exists`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.fn)
			check.NoError(t, err)
			err = tt.apply(s, loopsOf(t, s, "C"))
			check.True(t, err != nil, "no error")
			check.Equal(t, err.Error(), tt.want)
		})
	}
}
