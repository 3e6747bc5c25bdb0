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
		// A factor larger than the extent: k_1 = 10 … 15 never runs, and
		// the write-back skips those parts of C_rf.
		{name: "rfactor_wide_factor", fn: func() *ir.PrimFunc { return rowReduce(3, 10, false) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			k := must[[]LoopRV](t)(s.Split(ls[1], -1, 16))
			must[BlockRV](t)(s.RFactor(k[1], 0))
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

func imap(t *testing.T, text string) *IndexMap {
	t.Helper()
	m, err := ParseIndexMap(text)
	check.NoError(t, err)
	return m
}

func zero() *float64 { z := 0.0; return &z }

// nchw returns C = relu(A) over an NCHW tensor.
func nchw(n, c, h, w int64) *ir.PrimFunc {
	A := te.Placeholder(te.Shape(n, c, h, w), ir.Float32, "A")
	C := te.Compute(A.Shape, func(i ...ir.Expr) ir.Expr { return ir.Max(A.At(i...), ir.F32(0)) }, "C")
	return mustFunc(A, C)
}

func TestTransformLayout(t *testing.T) {
	runCases(t, []schedCase{
		{name: "transform_layout", fn: func() *ir.PrimFunc { return chain(8, 6) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			b := must[BlockRV](t)(s.GetBlock("B"))
			check.NoError(t, s.TransformLayout(b, BufferIndex{Write: true}, imap(t, "lambda i, j: (j, i)"), nil))
		}},
		{name: "transform_layout_padded", fn: func() *ir.PrimFunc { return chain(10, 6) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			check.NoError(t, s.TransformLayout(c, BufferIndex{Index: 0}, imap(t, "lambda i, j: (i // 4, j, i % 4)"), zero()))
		}},
		{name: "cache_read_packed_panels", fn: func() *ir.PrimFunc { return matmul(13, 20, 7) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			ls := loopsOf(t, s, "C")
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 8))
			check.NoError(t, s.Reorder(j[0], ls[0], ls[2], j[1]))
			// Move the copy to its panel first: compute_at wants the copy
			// to store at its iteration variables.
			p := must[BlockRV](t)(s.CacheRead(c, 1, "global"))
			check.NoError(t, s.ComputeAt(p, j[0]))
			check.NoError(t, s.TransformLayout(p, BufferIndex{Write: true}, imap(t, "lambda k, n: (n // 8, k, n % 8)"), zero()))
			check.NoError(t, s.Vectorize(j[1]))
		}},
		{name: "cache_read_packed_whole", fn: func() *ir.PrimFunc { return matmul(13, 20, 7) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			must[BlockRV](t)(s.CacheReadLayout(c, 1, "global", imap(t, "lambda k, n: (n // 8, k, n % 8)"), zero()))
		}},
		{name: "cache_read_nchwc", fn: func() *ir.PrimFunc { return nchw(1, 6, 3, 5) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			must[BlockRV](t)(s.CacheReadLayout(c, 0, "global", imap(t, "lambda n, c, h, w: (n, c // 4, h, w, c % 4)"), zero()))
		}},
		{name: "cache_write_tiled", fn: func() *ir.PrimFunc { return matmul(6, 10, 3) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			must[BlockRV](t)(s.CacheWriteLayout(c, 0, "global", imap(t, "lambda i, j: (i // 4, j // 4, i % 4, j % 4)"), zero()))
		}},
	})
}

func TestTransformLayoutErrors(t *testing.T) {
	for _, tt := range []struct {
		name, block string
		bi          BufferIndex
		m           string
		pad         *float64
		want        string
	}{
		{"not injective", "B", BufferIndex{Write: true}, "lambda i, j: (i // 2, j)", nil, `transform_layout: index map lambda i, j: (i // 2, j) is not injective over "B": [0 0] and [1 0] both map to [0 0]`},
		{"pads", "B", BufferIndex{Write: true}, "lambda i, j: (i // 4, j, i % 4)", nil, `transform_layout: index map lambda i, j: (i // 4, j, i % 4) is not onto its image's shape (2, 6, 4) over "B" of shape (6, 6): it pads the buffer; give a pad value`},
		{"below 0", "B", BufferIndex{Write: true}, "lambda i, j: (i - 1, j)", nil, `transform_layout: index map lambda i, j: (i - 1, j) maps [0 0] of "B" to [-1 0], below 0`},
		{"arity", "B", BufferIndex{Write: true}, "lambda i: (i,)", nil, `transform_layout: index map lambda i: (i,) takes 1 indices, "B" has 2 dimensions`},
		{"parameter", "B", BufferIndex{Index: 0}, "lambda i, j: (j, i)", nil, `transform_layout: "A" is a parameter of the function: changing its layout would change the function's signature (transform the layout of a cache_read or cache_write copy instead)`},
		{"no region", "B", BufferIndex{Write: true, Index: 1}, "lambda i, j: (j, i)", nil, `transform_layout: block "B" has 1 write regions, no write 1`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(chain(6, 6))
			check.NoError(t, err)
			before := s.Func()
			err = s.TransformLayout(must[BlockRV](t)(s.GetBlock(tt.block)), tt.bi, imap(t, tt.m), tt.pad)
			check.True(t, err != nil, "no error")
			check.Equal(t, err.Error(), tt.want)
			check.True(t, s.Func() == before, "the schedule changed")
		})
	}
}

func TestParseIndexMap(t *testing.T) {
	for _, text := range []string{
		"lambda i, j: (j, i)",
		"lambda i: (i // 16, i % 16)",
		"lambda n, c, h, w: (n, c // 4, h, w, c % 4)",
		"lambda i, j: (i * 8 + j, (i + 1) // 2 - j, 0 - i, min(i, 3), max(j, i) % 5)",
		"lambda i: (i,)",
	} {
		m := imap(t, text)
		check.Equal(t, m.String(), text)
	}
	for text, want := range map[string]string{
		"i, j: (i, j)":         `index map "i, j: (i, j)": want lambda vars: (indices)`,
		"lambda i, i: (i, i)":  `index map "lambda i, i: (i, i)": column 12: variable "i" appears twice`,
		"lambda i: (k,)":       `index map "lambda i: (k,)": column 13: "k" is not a variable of the lambda`,
		"lambda i: (i / 2,)":   `index map "lambda i: (i / 2,)": column 14: want , or ) in the lambda's indices`,
		"lambda i: (i,) extra": `index map "lambda i: (i,) extra": unexpected "extra" at the end`,
	} {
		_, err := ParseIndexMap(text)
		check.True(t, err != nil, text)
		check.Equal(t, err.Error(), want)
	}
}

func TestPadEinsum(t *testing.T) {
	runCases(t, []schedCase{
		{name: "pad_einsum", fn: func() *ir.PrimFunc { return matmul(13, 20, 7) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			check.NoError(t, s.PadEinsum(c, []int64{4, 8, 4}))
			// The padded loops split exactly: no guards.
			ls := must[[]LoopRV](t)(s.GetLoops(c))
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 8))
			check.NoError(t, s.Reorder(j[0], ls[2], j[1]))
			check.NoError(t, s.Vectorize(j[1]))
		}},
		{name: "pad_einsum_spatial", fn: func() *ir.PrimFunc { return rowReduce(5, 9, true) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			check.NoError(t, s.PadEinsum(must[BlockRV](t)(s.GetBlock("C")), []int64{4, 1}))
		}},
	})
}

func TestPadEinsumErrors(t *testing.T) {
	for _, tt := range []struct {
		name  string
		fn    *ir.PrimFunc
		apply func(s *Schedule, c BlockRV) error
		want  string
	}{
		{"max over padding", rowReduce(4, 9, true), func(s *Schedule, c BlockRV) error { return s.PadEinsum(c, []int64{1, 4}) },
			`pad_einsum: block "C" reduces with max: only a sum can run over padding`},
		{"factors", matmul(4, 4, 4), func(s *Schedule, c BlockRV) error { return s.PadEinsum(c, []int64{4, 4}) },
			`pad_einsum: 2 padding factors for the 3 iteration variables of block "C"`},
		{"factor below 1", matmul(4, 4, 4), func(s *Schedule, c BlockRV) error { return s.PadEinsum(c, []int64{4, 0, 4}) },
			`pad_einsum: padding factor 0 of "v_j" is below 1`},
		{"split loops", matmul(5, 4, 4), func(s *Schedule, c BlockRV) error {
			ls := must[[]LoopRV](t)(s.GetLoops(c))
			if _, err := s.Split(ls[0], -1, 2); err != nil {
				return err
			}
			return s.PadEinsum(c, []int64{4, 1, 1})
		}, `pad_einsum: the loops of block "C" are not one loop per iteration variable, from 0 over its domain, serial and around this block alone (pad before split, fuse or compute_at)`},
		{"not an einsum", reversed(), func(s *Schedule, c BlockRV) error { return s.PadEinsum(c, []int64{16}) },
			`pad_einsum: block "C" loads "A" at (7 - v_i) in dimension 0, not a sum of iteration variables times non-negative constants`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.fn)
			check.NoError(t, err)
			err = tt.apply(s, must[BlockRV](t)(s.GetBlock("C")))
			check.True(t, err != nil, "no error")
			check.Equal(t, err.Error(), tt.want)
		})
	}
}

func TestBlockize(t *testing.T) {
	runCases(t, []schedCase{
		{name: "blockize", fn: func() *ir.PrimFunc { return matmul(5, 10, 3) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 4))
			check.NoError(t, s.Reorder(j[0], ls[2], j[1]))
			o := must[BlockRV](t)(s.Blockize(j[1]))
			check.Equal(t, o.String(), "C_o")
		}},
		{name: "blockize_tile", fn: func() *ir.PrimFunc { return chain(8, 6) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "B")
			i := must[[]LoopRV](t)(s.Split(ls[0], -1, 4))
			check.NoError(t, s.Reorder(i[0], ls[1], i[1]))
			must[BlockRV](t)(s.Blockize(ls[1]))
		}},
	})
}

func TestDecomposeReductionCases(t *testing.T) {
	runCases(t, []schedCase{
		// The spatial loops fused and split around the reduction loop:
		// i = x // 6 and j = x % 6 give x back, so each iteration of the
		// inner part is a distinct instance.
		{name: "decompose_reduction_fused", fn: func() *ir.PrimFunc { return matmul(4, 6, 5) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			ls := must[[]LoopRV](t)(s.GetLoops(c))
			f := must[LoopRV](t)(s.Fuse(ls[0], ls[1]))
			sp := must[[]LoopRV](t)(s.Split(f, -1, 4))
			check.NoError(t, s.Reorder(sp[0], ls[2], sp[1]))
			must[BlockRV](t)(s.DecomposeReduction(c, ls[2]))
		}},
		// A blockized reduction: the outer block holds the init.
		{name: "decompose_reduction_blockized", fn: func() *ir.PrimFunc { return matmul(5, 10, 3) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 4))
			check.NoError(t, s.Reorder(j[0], ls[2], j[1]))
			o := must[BlockRV](t)(s.Blockize(j[1]))
			_, err := s.DecomposeReduction(must[BlockRV](t)(s.GetBlock("C")), j[1])
			check.Equal(t, err.Error(), `decompose_reduction: block "C" has no init (it is not a reduction)`)
			init := must[BlockRV](t)(s.DecomposeReduction(o, ls[2]))
			check.Equal(t, init.String(), "C_o_init")
		}},
	})
}

func TestBlockizeErrors(t *testing.T) {
	s, err := New(twoStage(4, 4))
	check.NoError(t, err)
	_, err = s.Blockize(LoopRV{})
	check.Equal(t, err.Error(), "blockize: nil loop handle")
	s, err = New(chain(4, 6))
	check.NoError(t, err)
	check.NoError(t, s.ComputeAt(must[BlockRV](t)(s.GetBlock("B")), loopsOf(t, s, "C")[0]))
	_, err = s.Blockize(loopsOf(t, s, "C")[0])
	check.Equal(t, err.Error(), `blockize: loop "i" holds 2 blocks, want one`)
	s, err = New(matmul(4, 6, 4))
	check.NoError(t, err)
	ls := loopsOf(t, s, "C")
	f := must[LoopRV](t)(s.Fuse(ls[0], ls[1]))
	sp := must[[]LoopRV](t)(s.Split(f, -1, 4))
	_, err = s.Blockize(sp[1])
	check.Equal(t, err.Error(), `blockize: the binding (((i_j_fused_0 * 4) + i_j_fused_1) // 6) of "v_i" mixes loops inside and outside loop "i_j_fused_1"`)
}

func TestTensorize(t *testing.T) {
	runCases(t, []schedCase{
		{name: "tensorize_vec_fma", fn: func() *ir.PrimFunc { return matmul(5, 32, 3) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			ls := must[[]LoopRV](t)(s.GetLoops(c))
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 16))
			check.NoError(t, s.Reorder(ls[0], j[0], ls[2], j[1]))
			init := must[BlockRV](t)(s.DecomposeReduction(c, ls[2]))
			il := must[[]LoopRV](t)(s.GetLoops(init))
			check.NoError(t, s.Vectorize(il[len(il)-1]))
			check.NoError(t, s.Tensorize(j[1], VecFMAIntrin(16)))
		}},
		{name: "tensorize_with_init", fn: func() *ir.PrimFunc { return matmul(3, 16, 5) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			ls := must[[]LoopRV](t)(s.GetLoops(c))
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 8))
			check.NoError(t, s.Reorder(ls[0], j[0], ls[2], j[1]))
			check.NoError(t, s.Tensorize(j[1], VecFMAIntrin(8)))
		}},
		{name: "tensorize_padded", fn: func() *ir.PrimFunc { return matmul(3, 13, 5) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			check.NoError(t, s.PadEinsum(c, []int64{1, 8, 1}))
			ls := must[[]LoopRV](t)(s.GetLoops(c))
			j := must[[]LoopRV](t)(s.Split(ls[1], -1, 8))
			check.NoError(t, s.Reorder(ls[0], j[0], ls[2], j[1]))
			must[BlockRV](t)(s.DecomposeReduction(c, ls[2]))
			check.NoError(t, s.Tensorize(j[1], VecFMAIntrin(8)))
		}},
	})
}

func TestTensorizeErrors(t *testing.T) {
	setup := func(t *testing.T, n int64, decompose bool) (*Schedule, []LoopRV) {
		s, err := New(matmul(4, n, 3))
		check.NoError(t, err)
		c := must[BlockRV](t)(s.GetBlock("C"))
		ls := must[[]LoopRV](t)(s.GetLoops(c))
		j := must[[]LoopRV](t)(s.Split(ls[1], -1, 8))
		check.NoError(t, s.Reorder(ls[0], j[0], ls[2], j[1]))
		if decompose {
			must[BlockRV](t)(s.DecomposeReduction(c, ls[2]))
		}
		return s, j
	}
	s, j := setup(t, 16, true)
	check.Equal(t, s.Tensorize(j[1], VecFMAIntrin(16)).Error(), `tensorize: loop "j_1" runs over 8 from 0, loop 0 of "kiln.vec_fma_f32x16" over 16 from 0`)
	check.Equal(t, s.Tensorize(j[1], "nope").Error(), `tensorize: no tensor intrinsic "nope" (registered: [kiln.ptx_mma_frag_m16n8k16_bf16 kiln.ptx_mma_frag_m16n8k16_fp16 kiln.ptx_mma_m16n8k16_f16 kiln.vec_fma_f32x16 kiln.vec_fma_f32x4 kiln.vec_fma_f32x8])`)
	s, j = setup(t, 12, true)
	check.Equal(t, s.Tensorize(j[1], VecFMAIntrin(8)).Error(), `tensorize: block "C_update" runs under the predicate (((v_j_o * 8) + j_1) < 12): the intrinsic would compute the padding too (pad_einsum first)`)
	check.True(t, RegisterTensorIntrin(vecFMA(8)) != nil, "registered twice")
}

// TestReplay replays traces written by hand: TVM's keyword arguments and
// variable names, and lines that are wrong.
func TestReplay(t *testing.T) {
	f := matmul(8, 16, 4)
	s, err := Replay(f, []string{
		`b0 = sch.get_block(name="C")`,
		`l1, l2, l3 = sch.get_loops(block=b0)`,
		`l4, l5 = sch.split(loop=l2, factors=[None, 8])`,
		`sch.reorder(l1, l4, l3, l5)`,
		`b6 = sch.cache_read(block=b0, read_buffer_index=1, storage_scope="global")`,
		`sch.compute_at(block=b6, loop=l4)`,
		`sch.transform_layout(b6, ("write", 0), lambda k, n: (n // 8, k, n % 8))`,
		`sch.annotate(block_or_loop=l1, ann_key="pragma_auto_unroll_max_step", ann_val=16)`,
		`sch.vectorize(loop=l5)`,
	})
	check.NoError(t, err)
	want, err := New(f)
	check.NoError(t, err)
	c := must[BlockRV](t)(want.GetBlock("C"))
	ls := must[[]LoopRV](t)(want.GetLoops(c))
	j := must[[]LoopRV](t)(want.Split(ls[1], -1, 8))
	check.NoError(t, want.Reorder(ls[0], j[0], ls[2], j[1]))
	p := must[BlockRV](t)(want.CacheRead(c, 1, "global"))
	check.NoError(t, want.ComputeAt(p, j[0]))
	check.NoError(t, want.TransformLayout(p, BufferIndex{Write: true}, imap(t, "lambda k, n: (n // 8, k, n % 8)"), nil))
	check.NoError(t, want.Annotate(ls[0], "pragma_auto_unroll_max_step", int64(16)))
	check.NoError(t, want.Vectorize(j[1]))
	check.True(t, ir.StructuralEqual(s.Func(), want.Func()), "the hand-written trace gives another function")
	// The replayed schedule prints the trace's own names.
	check.Equal(t, s.Trace()[1], "l1, l2, l3 = sch.get_loops(b0)")

	for _, tt := range []struct {
		lines []string
		want  string
	}{
		{[]string{`sch.parallel(i)`}, `replay: line 1 "sch.parallel(i)": parallel: loop is name i, not a loop that an earlier line assigned`},
		{[]string{`C = sch.get_block("C")`, `sch.fly(C)`}, `replay: line 2 "sch.fly(C)": unknown primitive sch.fly`},
		{[]string{`C = sch.get_block("C"`}, `replay: line 1 "C = sch.get_block(\"C\"": column 22: want , or ) between arguments`},
		{[]string{`C = sch.get_block("D")`}, `replay: line 1 "C = sch.get_block(\"D\")": get_block: no block named "D"`},
		{[]string{`C = sch.get_block("C")`, `i, j = sch.get_loops(C)`}, `replay: line 2 "i, j = sch.get_loops(C)": get_loops returned 3 handles, the line assigns 2`},
		{[]string{`C = sch.get_block("C")`, `i, j, k = sch.get_loops(C)`, `sch.split(i, [None, "4"])`}, `replay: line 3 "sch.split(i, [None, \"4\"])": split: element 1 of factors is "4", want an integer`},
		{[]string{`x = 3`}, `replay: line 1 "x = 3": want sch.primitive(…)`},
	} {
		_, err := Replay(f, tt.lines)
		check.True(t, err != nil, tt.lines)
		check.Equal(t, err.Error(), tt.want)
	}
}

func TestApply(t *testing.T) {
	s, err := New(matmul(8, 8, 8))
	check.NoError(t, err)
	c, err := s.Apply("get_block", "C")
	check.NoError(t, err)
	ls, err := s.Apply("get_loops", c)
	check.NoError(t, err)
	rf, err := s.Apply("rfactor", ls.([]LoopRV)[2], int64(0))
	check.NoError(t, err)
	check.Equal(t, rf.(BlockRV).String(), "C_rf")
	_, err = s.Apply("rfactor", ls.([]LoopRV)[2])
	check.Equal(t, err.Error(), "rfactor takes 2 arguments (loop, factor_axis), not 1")
	_, err = s.Apply("rfactor", ls.([]LoopRV)[2], 0)
	check.Equal(t, err.Error(), "rfactor: argument 2 (factor_axis) is int")
	_, err = s.Apply("fly")
	check.Equal(t, err.Error(), `unknown primitive "fly"`)
}
