package schedule

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

func TestTransformBlockLayout(t *testing.T) {
	runCases(t, []schedCase{
		// The plane of an NCHW block flattened: C[n, c, p // 5, p % 5].
		{name: "transform_block_layout_plane", fn: func() *ir.PrimFunc { return nchw(2, 3, 4, 5) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			check.NoError(t, s.TransformBlockLayout(c, imap(t, "lambda n, c, h, w: (n, c, h * 5 + w)")))
			ls := loopsOf(t, s, "C")
			check.Equal(t, len(ls), 3)
			p := must[[]LoopRV](t)(s.Split(ls[2], -1, 4))
			check.NoError(t, s.Vectorize(p[1]))
		}},
		// A reduction fused with a permutation: (j, i) outside, k kept.
		{name: "transform_block_layout_matmul", fn: func() *ir.PrimFunc { return matmul(3, 4, 5) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			check.NoError(t, s.TransformBlockLayout(c, imap(t, "lambda i, j, k: (j * 3 + i, k)")))
		}},
		// A cache written in the flattened layout: the write-back,
		// transformed alike, reads it at its own variable again.
		{name: "transform_block_layout_cache", fn: func() *ir.PrimFunc { return matmul(4, 6, 3) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			wb := must[BlockRV](t)(s.CacheWriteLayout(c, 0, "local", imap(t, "lambda i, j: (i * 6 + j,)"), nil))
			check.NoError(t, s.TransformBlockLayout(c, imap(t, "lambda i, j, k: (i * 6 + j, k)")))
			check.NoError(t, s.TransformBlockLayout(wb, imap(t, "lambda i, j: (i * 6 + j,)")))
			ls := loopsOf(t, s, "C")
			p := must[[]LoopRV](t)(s.Split(ls[0], -1, 8))
			check.NoError(t, s.ReverseComputeAt(wb, p[0]))
		}},
	})
}

func TestTransformBlockLayoutErrors(t *testing.T) {
	for _, tt := range []struct {
		name  string
		fn    *ir.PrimFunc
		apply func(s *Schedule, c BlockRV) error
		want  string
	}{
		{"arity", matmul(4, 4, 4), func(s *Schedule, c BlockRV) error {
			return s.TransformBlockLayout(c, imap(t, "lambda i, j: (i, j)"))
		}, `transform_block_layout: index map lambda i, j: (i, j) takes 2 indices, block "C" has 3 iteration variables`},
		{"spatial and reduction", matmul(4, 4, 4), func(s *Schedule, c BlockRV) error {
			return s.TransformBlockLayout(c, imap(t, "lambda i, j, k: (i, j * 4 + k)"))
		}, `transform_block_layout: index 1 of lambda i, j, k: (i, j * 4 + k) fuses spatial and reduce iteration variables of block "C"`},
		{"not one to one", matmul(4, 4, 4), func(s *Schedule, c BlockRV) error {
			return s.TransformBlockLayout(c, imap(t, "lambda i, j, k: (i * 3 + j, k)"))
		}, `transform_block_layout: index map lambda i, j, k: (i * 3 + j, k) over block "C": index 0 (i * 3 + j) is not one to one over the extents [4 4 4]: i takes 3, want 4`},
		{"split", matmul(4, 4, 4), func(s *Schedule, c BlockRV) error {
			return s.TransformBlockLayout(c, imap(t, "lambda i, j, k: (i // 2, j, k)"))
		}, `transform_block_layout: index map lambda i, j, k: (i // 2, j, k) over block "C": index 0 (i // 2) is not a sum of the variables times positive constants`},
		{"variable twice", matmul(4, 4, 4), func(s *Schedule, c BlockRV) error {
			return s.TransformBlockLayout(c, imap(t, "lambda i, j, k: (i, i * 4 + j, k)"))
		}, `transform_block_layout: index map lambda i, j, k: (i, i * 4 + j, k) over block "C": variable i is in more than one index`},
		{"split loops", matmul(4, 4, 4), func(s *Schedule, c BlockRV) error {
			ls := must[[]LoopRV](t)(s.GetLoops(c))
			if _, err := s.Split(ls[0], -1, 2); err != nil {
				return err
			}
			return s.TransformBlockLayout(c, imap(t, "lambda i, j, k: (i * 4 + j, k)"))
		}, `transform_block_layout: the loops of block "C" do not bind its iteration variables one each with nothing else in them`},
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

func TestSplitOverlap(t *testing.T) {
	runCases(t, []schedCase{
		// 20 iterations in tiles of 8: 0…7, 8…15, 12…19.
		{name: "split_overlap", fn: func() *ir.PrimFunc { return chain(3, 20) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			j := must[[]LoopRV](t)(s.SplitOverlap(ls[1], -1, 2, 4))
			check.NoError(t, s.Vectorize(j[2]))
		}},
		// A register tile over a plane no tile divides: the reduction's
		// init and the write-back run in every tile, the last one moved
		// back.
		{name: "split_overlap_tile", fn: func() *ir.PrimFunc { return matmul(5, 13, 4) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			wb := must[BlockRV](t)(s.CacheWrite(c, 0, "local"))
			ls := loopsOf(t, s, "C")
			j := must[[]LoopRV](t)(s.SplitOverlap(ls[1], -1, 4))
			check.NoError(t, s.Reorder(ls[0], j[0], ls[2], j[1]))
			must[BlockRV](t)(s.DecomposeReduction(c, ls[2]))
			check.NoError(t, s.ReverseComputeAt(wb, j[0]))
			check.NoError(t, s.Vectorize(j[1]))
		}},
		// Factors that divide the extent: a split.
		{name: "split_overlap_exact", fn: func() *ir.PrimFunc { return chain(3, 16) }, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			must[[]LoopRV](t)(s.SplitOverlap(ls[1], -1, 8))
		}},
	})
}

func TestSplitOverlapErrors(t *testing.T) {
	for _, tt := range []struct {
		name  string
		fn    *ir.PrimFunc
		apply func(s *Schedule, ls []LoopRV) error
		want  string
	}{
		{"outer factor", chain(3, 20), func(s *Schedule, ls []LoopRV) error {
			_, err := s.SplitOverlap(ls[1], 4, -1)
			return err
		}, `split_overlap: factors [4 -1] of loop "j": want -1 and then at least one positive factor`},
		{"too wide", chain(3, 20), func(s *Schedule, ls []LoopRV) error {
			_, err := s.SplitOverlap(ls[1], -1, 32)
			return err
		}, `split_overlap: factors [-1 32] of loop "j" cover 32 iterations at once, the loop has 20`},
		// The reduction loop outside the split one: the overlapped
		// iterations would add twice.
		{"reduction outside", matmul(4, 6, 3), func(s *Schedule, ls []LoopRV) error {
			if err := s.Reorder(ls[2], ls[0], ls[1]); err != nil {
				return err
			}
			_, err := s.SplitOverlap(ls[1], -1, 4)
			return err
		}, `split_overlap: block "C" reduces over loop "k" outside loop "j": running an iteration again would reduce twice`},
		{"split reduction", matmul(4, 6, 3), func(s *Schedule, ls []LoopRV) error {
			_, err := s.SplitOverlap(ls[2], -1, 2)
			return err
		}, `split_overlap: block "C" binds loop "k" in its reduction variable "v_k": running an iteration again would reduce twice`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.fn)
			check.NoError(t, err)
			b := must[BlockRV](t)(s.GetBlock("C"))
			err = tt.apply(s, must[[]LoopRV](t)(s.GetLoops(b)))
			check.True(t, err != nil, "no error")
			check.Equal(t, err.Error(), tt.want)
		})
	}
}
