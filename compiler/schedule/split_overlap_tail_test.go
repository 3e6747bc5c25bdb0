package schedule

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/arith"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

func TestSplitOverlapTail(t *testing.T) {
	runCases(t, []schedCase{
		// 21 iterations in tiles of 2 units of 4: 0…7, 8…15, then one
		// unit, 17…20 (SplitOverlap's last tile is 13…20).
		{name: "split_overlap_tail", fn: func() *ir.PrimFunc { return chain(3, 21) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			j := must[[]LoopRV](t)(s.SplitOverlapTail(ls[1], -1, 2, 4))
			check.NoError(t, s.Vectorize(j[2]))
		}},
		// A register tile of 3 units of 4 over 13 columns: the tiles
		// 0…11 and, in one unit, 9…12; the init, the update and the
		// write-back each run only the units of their tile.
		{name: "split_overlap_tail_tile", fn: func() *ir.PrimFunc { return matmul(3, 13, 4) }, compiled: true, apply: func(t *testing.T, s *Schedule) {
			c := must[BlockRV](t)(s.GetBlock("C"))
			wb := must[BlockRV](t)(s.CacheWrite(c, 0, "local"))
			ls := loopsOf(t, s, "C")
			j := must[[]LoopRV](t)(s.SplitOverlapTail(ls[1], -1, 3, 4))
			check.NoError(t, s.Reorder(ls[0], j[0], ls[2], j[1], j[2]))
			must[BlockRV](t)(s.DecomposeReduction(c, ls[2]))
			check.NoError(t, s.ReverseComputeAt(wb, j[0]))
			check.NoError(t, s.Unroll(j[1]))
			check.NoError(t, s.Vectorize(j[2]))
		}},
		// The last tile's units fill it: SplitOverlap's tile, no
		// predicate (22 = 2·8 + 6, the last tile 14…21).
		{name: "split_overlap_tail_full", fn: func() *ir.PrimFunc { return chain(3, 22) }, apply: func(t *testing.T, s *Schedule) {
			ls := loopsOf(t, s, "C")
			must[[]LoopRV](t)(s.SplitOverlapTail(ls[1], -1, 2, 4))
		}},
	})
}

// TestSplitOverlapTailUnits checks the tiles' iterations for extents and
// factors around the edges: every iteration is covered, only the last
// tile overlaps the one before, and it runs no more units than the
// iterations left need.
func TestSplitOverlapTailUnits(t *testing.T) {
	for _, tt := range []struct{ ext, tile, unit int64 }{
		{169, 3, 16}, {21, 2, 4}, {17, 2, 8}, {25, 3, 8}, {40, 3, 8}, {9, 2, 4}, {10, 1, 4}, {33, 4, 8},
	} {
		s, err := New(chain(1, tt.ext))
		check.NoError(t, err)
		ls := loopsOf(t, s, "C")
		_, err = s.SplitOverlapTail(ls[1], -1, tt.tile, tt.unit)
		check.NoError(t, err)
		var br *ir.BlockRealize
		var loops []*ir.For
		ir.Visit(s.Func().Body, func(n ir.Node) bool {
			switch n := n.(type) {
			case *ir.For:
				loops = append(loops, n)
			case *ir.BlockRealize:
				if n.Block.Name == "C" {
					br = n
				}
			}
			return true
		})
		v0, v1, v2 := loops[len(loops)-3], loops[len(loops)-2], loops[len(loops)-1]
		outer, _ := ir.IsConstInt(v0.Extent)
		covered := map[int64]int{}
		units := (tt.ext + tt.unit - 1) / tt.unit
		ran := int64(0)
		for a := range outer {
			for b := range tt.tile {
				env := map[*ir.Var]ir.Expr{v0.Var: ir.NewIntImm(v0.Var.Type, a), v1.Var: ir.NewIntImm(v1.Var.Type, b), v2.Var: ir.NewIntImm(v2.Var.Type, 0)}
				if br.Predicate != nil {
					p, ok := ir.IsConstInt(arith.NewAnalyzer().Simplify(ir.SubstituteExpr(br.Predicate, env)))
					check.True(t, ok, "predicate %s", br.Predicate)
					if p == 0 {
						continue
					}
				}
				ran++
				for c := range tt.unit {
					env[v2.Var] = ir.NewIntImm(v2.Var.Type, c)
					j, ok := ir.IsConstInt(arith.NewAnalyzer().Simplify(ir.SubstituteExpr(br.IterValues[1], env)))
					check.True(t, ok && j >= 0 && j < tt.ext, "%v: iteration %d of %d", tt, j, tt.ext)
					covered[j]++
				}
			}
		}
		check.Equal(t, int64(len(covered)), tt.ext, "iterations covered", tt)
		check.Equal(t, ran, units, "units run", tt)
		if tt.ext%(tt.tile*tt.unit) != 0 && units%tt.tile != 0 {
			check.True(t, strings.Contains(strings.Join(s.Trace(), "\n"), "split_overlap_tail"), "trace")
		}
	}
}
