package schedule

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// SplitOverlapTail is SplitOverlap with a shorter last tile: the
// innermost factor is a unit that stays whole (a vector), and where the
// factors do not divide the extent the last iteration of the outer loop
// runs only as many units as cover the iterations the others leave,
// moved back to end at the extent; the units past them do not run (a
// predicate on the units' loops, not on those inside a unit). With
// factors (-1, 3, 16) over 169 iterations the outer loop's four
// iterations cover 0…47, 48…95, 96…143 and, in two units, 137…168: 11
// units where SplitOverlap runs 12 (its last tile 121…168). The
// overlapped iterations are recomputed as with SplitOverlap, under the
// same checks, and the outer loop is annotated alike. With two factors,
// or when the last tile's units fill it, it is SplitOverlap; when the
// factors divide the extent, Split.
func (s *Schedule) SplitOverlapTail(l LoopRV, factors ...int64) ([]LoopRV, error) {
	out, err := s.splitOverlap(l, factors, true)
	if err != nil {
		return nil, fmt.Errorf("split_overlap_tail: %w", err)
	}
	s.record("%ssch.split_overlap_tail(loop=%s, factors=%s)", s.assignLoops(out), s.ln(l), pyInts(factors, true))
	return out, nil
}

// overlapTail returns how many iterations the last tile of a
// SplitOverlapTail of ext by factors (vars the new loops) runs, and the
// predicate that keeps the units within them (nil when they fill the
// tile): v0·units per tile + the unit's index within the tile < the
// units that cover ext.
func overlapTail(ext int64, factors []int64, vars []*ir.Var) (int64, ir.Expr) {
	unit := factors[len(factors)-1]
	perTile := int64(1)
	for _, x := range factors[1 : len(factors)-1] {
		perTile *= x
	}
	units := (ext + unit - 1) / unit
	outer := (units + perTile - 1) / perTile
	last := units - (outer-1)*perTile
	if last == perTile {
		return perTile * unit, nil
	}
	t := vars[0].Type
	var idx ir.Expr = ir.NewBinary(ir.OpMul, vars[0], ir.NewIntImm(t, perTile))
	var within ir.Expr = ir.NewIntImm(t, 0)
	for i := 1; i < len(vars)-1; i++ {
		within = ir.NewBinary(ir.OpAdd, ir.NewBinary(ir.OpMul, within, ir.NewIntImm(t, factors[i])), vars[i])
	}
	idx = bounds{}.simplify(ir.NewBinary(ir.OpAdd, idx, within))
	return last * unit, ir.NewBinary(ir.OpLT, idx, ir.NewIntImm(t, units))
}
