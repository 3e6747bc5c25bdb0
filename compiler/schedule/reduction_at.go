package schedule

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// A reduction block reads the buffer it writes: its update out = out op
// x. ReverseComputeAt moves one under a loop as TVM's reverse_compute_at
// does (the write-back block of rfactor under the loop of its rfactor
// block), when the new loops cover the whole domain of every reduction
// iteration variable: each iteration of the loop then runs the init and
// the whole reduction of the elements it writes, never a part of it.

// updatesInPlace reports whether blk reads buf only as a reduction block
// reads its own output: blk has an init storing buf at the indices its
// body stores it, and buf is the one buffer it writes.
func updatesInPlace(blk *ir.Block, buf *ir.Buffer) bool {
	st, ok := blk.Body.(*ir.BufferStore)
	if !ok || blk.Init == nil || len(blk.Writes) != 1 || st.Buffer != buf {
		return false
	}
	init, ok := blk.Init.(*ir.BufferStore)
	if !ok || init.Buffer != buf || !slices.EqualFunc(init.Indices, st.Indices, func(a, b ir.Expr) bool { return ir.Equal(a, b) }) {
		return false
	}
	_, _, ok = combiner(st)
	return ok
}

// wholeReduction checks that a new loop of extent ext from lo covers the
// domain of reduction iteration variable iv of block blk (the iterations
// outside it are guarded).
func wholeReduction(blk *ir.Block, iv ir.IterVar, lo, ext affine) error {
	if iv.Kind != ir.IterReduce {
		return nil
	}
	l, ok1 := lo.isConst()
	e, ok2 := ext.isConst()
	m, ok3 := ir.IsConstInt(iv.Dom.Min)
	n, ok4 := ir.IsConstInt(iv.Dom.Extent)
	// A loop past the domain is guarded by the block's predicate.
	if !ok1 || !ok2 || !ok3 || !ok4 || l > m || l+e < m+n {
		return fmt.Errorf("the loop would cover %s of the reduction iteration variable %q of block %q, not its whole domain [%s, %s + %s): its init would run for a part of the reduction", spanString(lo, ext), iv.Var.Name, blk.Name, iv.Dom.Min, iv.Dom.Min, iv.Dom.Extent)
	}
	return nil
}

func spanString(lo, ext affine) string {
	return fmt.Sprintf("[%s, %s + %s)", lo.expr(), lo.expr(), ext.expr())
}

// ownNest returns the outermost of the loops of the block at bs whose
// body holds no other block of blocks (the scope's) and that encloses
// every loop binding a reduction variable (reduce): the loop nest of
// the block's own, which rfactor replaces when the loops above it are
// shared with other blocks. It returns nil when there is none.
func ownNest(blocks []site, bs site, loops []*ir.For, reduce map[*ir.Var]bool) *ir.For {
	for i, f := range loops {
		shared := false
		for _, st := range blocks {
			if st.realize() != bs.realize() && st.under(f) {
				shared = true
				break
			}
		}
		if shared {
			continue
		}
		for _, g := range loops[:i] {
			if reduce[g.Var] {
				return nil
			}
		}
		return f
	}
	return nil
}

// loopSet is the set of the variables of loops.
func loopSet(loops []*ir.For) map[*ir.Var]bool {
	out := map[*ir.Var]bool{}
	for _, f := range loops {
		out[f.Var] = true
	}
	return out
}
