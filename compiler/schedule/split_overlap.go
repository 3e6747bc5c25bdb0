package schedule

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// AnnRecomputedIterations annotates the outer loop of a SplitOverlap
// whose last iteration overlaps the one before: every iteration writes
// what it reads of the buffers its blocks write, so that buffer
// compaction (compiler/transform's CompactBuffers) may give each
// iteration its own copy although their regions overlap.
const AnnRecomputedIterations = "recomputed_iterations"

// SplitOverlap splits loop l as Split does, the first factor -1 (inferred),
// but where the others do not divide the extent the last iteration of
// the outer loop moves back to end at the extent instead of running under
// a predicate: with factors (-1, 16) over 20 iterations the outer loop's
// two iterations cover 0…15 and 4…19, recomputing 4…15. No block then
// runs under a guard, so a tile of whole vectors stays whole. The
// overlapped iterations must compute the same values again: every block
// under l binds l only in spatial iteration variables, and a buffer that
// a block under l reads and a block under l writes is first written in
// the iteration by a block that does not read it (an init block) or by
// a reduction block with its init whose reduction loops are all under
// l. A parallel outer loop writes the overlapped outputs twice, with the
// same values. The extent must be a constant of at least the product of
// the other factors. When they divide it, SplitOverlap is Split. The
// checks hold for the loop nest as it is: a later Reorder that moves a
// reduction loop outside the outer loop makes the overlap reduce twice,
// so split the reductions' tile first.
func (s *Schedule) SplitOverlap(l LoopRV, factors ...int64) ([]LoopRV, error) {
	out, err := s.splitOverlap(l, factors, false)
	if err != nil {
		return nil, fmt.Errorf("split_overlap: %w", err)
	}
	s.record("%ssch.split_overlap(loop=%s, factors=%s)", s.assignLoops(out), s.ln(l), pyInts(factors, true))
	return out, nil
}

// splitOverlap is SplitOverlap, or with tail SplitOverlapTail.
func (s *Schedule) splitOverlap(l LoopRV, factors []int64, tail bool) ([]LoopRV, error) {
	st, err := s.loop("", l)
	if err != nil {
		return nil, err
	}
	f := st.loop()
	if len(factors) < 2 || factors[0] != -1 {
		return nil, fmt.Errorf("factors %v of loop %q: want -1 and then at least one positive factor", factors, f.Var.Name)
	}
	inner := int64(1)
	for i, x := range factors[1:] {
		if x < 1 {
			return nil, fmt.Errorf("factor %d of loop %q is %d, want a positive integer", i+1, f.Var.Name, x)
		}
		inner *= x
	}
	ext, ok := ir.IsConstInt(f.Extent)
	if !ok {
		return nil, fmt.Errorf("loop %q has the symbolic extent %s; the last iteration can only move back within a constant one", f.Var.Name, f.Extent)
	}
	if inner > ext {
		return nil, fmt.Errorf("factors %v of loop %q cover %d iterations at once, the loop has %d", factors, f.Var.Name, inner, ext)
	}
	if ext%inner == 0 {
		return s.split(l, factors)
	}
	if f.Kind != ir.ForSerial {
		return nil, fmt.Errorf("loop %q is %s; split loops before changing their kind", f.Var.Name, f.Kind)
	}
	if err := s.recomputable(st); err != nil {
		return nil, err
	}
	t := f.Var.Type
	vars := make([]*ir.Var, len(factors))
	extents := make([]ir.Expr, len(factors))
	for i := range factors {
		vars[i] = ir.NewVar(fmt.Sprintf("%s_%d", f.Var.Name, i), t)
		extents[i] = ir.NewIntImm(t, factors[i])
	}
	outer := (ext + inner - 1) / inner
	extents[0] = ir.NewIntImm(t, outer)
	// value = min(v0·inner, ext − back) + (v1·e2 + v2)… + min, back the
	// iterations the last tile runs (inner, or with tail its whole units).
	var rest ir.Expr = ir.NewIntImm(t, 0)
	for i := 1; i < len(vars); i++ {
		rest = ir.NewBinary(ir.OpAdd, ir.NewBinary(ir.OpMul, rest, extents[i]), vars[i])
	}
	back, guard := inner, ir.Expr(nil)
	if tail {
		back, guard = overlapTail(ext, factors, vars)
	}
	start := ir.NewBinary(ir.OpMin, ir.NewBinary(ir.OpMul, vars[0], ir.NewIntImm(t, inner)), ir.NewIntImm(t, ext-back))
	b := bounds{}
	var value ir.Expr = ir.NewBinary(ir.OpAdd, start, b.simplify(rest))
	if mn, ok := ir.IsConstInt(f.Min); !ok || mn != 0 {
		value = ir.NewBinary(ir.OpAdd, f.Min, value)
	}
	var nest ir.Stmt = substitute(f.Body, map[*ir.Var]ir.Expr{f.Var: value})
	if guard != nil {
		nest = addPredicate(nest, guard)
	}
	for i := len(vars) - 1; i >= 0; i-- {
		loop := &ir.For{Var: vars[i], Min: ir.NewIntImm(t, 0), Extent: extents[i], Kind: ir.ForSerial, Body: nest}
		if i == 0 {
			loop.Annotations = map[string]any{AnnRecomputedIterations: true}
		}
		nest = loop
	}
	nest = simplifyBindings(nest, st.loops())
	if err := s.commit("split_overlap", replace(s.fn.Body, map[ir.Stmt]ir.Stmt{f: nest})); err != nil {
		return nil, err
	}
	out := make([]LoopRV, len(vars))
	for i, v := range vars {
		out[i] = LoopRV{v: v}
	}
	return out, nil
}

// recomputable checks that running an iteration of the loop at st again
// gives the same results (see SplitOverlap).
func (s *Schedule) recomputable(st site) error {
	f := st.loop()
	var blocks []site
	var walk func(path []ir.Stmt)
	walk = func(path []ir.Stmt) {
		n := path[len(path)-1]
		if _, ok := n.(*ir.BlockRealize); ok {
			blocks = append(blocks, site{path: slices.Clone(path)})
			return
		}
		for _, c := range children(n) {
			walk(append(path, c))
		}
	}
	walk(slices.Clone(st.path))
	written := map[*ir.Buffer]bool{}
	for _, b := range blocks {
		for _, w := range b.realize().Block.Writes {
			written[w.Buffer] = true
		}
	}
	ready := map[*ir.Buffer]bool{} // written whole in this iteration before any read
	for _, bs := range blocks {
		br := bs.realize()
		blk := br.Block
		inner := map[*ir.Var]bool{}
		for _, lf := range bs.loops() {
			if bs.under(f) && lf != f && !slices.Contains(st.loops(), lf) {
				inner[lf.Var] = true
			}
		}
		for i, iv := range blk.IterVars {
			if i >= len(br.IterValues) {
				break
			}
			uses := usesVar(br.IterValues[i], map[*ir.Var]bool{f.Var: true})
			if uses && iv.Kind != ir.IterSpatial {
				return fmt.Errorf("block %q binds loop %q in its reduction variable %q: running an iteration again would reduce twice", blk.Name, f.Var.Name, iv.Var.Name)
			}
			if iv.Kind == ir.IterReduce && blk.Init != nil {
				for _, lf := range bs.loops() {
					if usesVar(br.IterValues[i], map[*ir.Var]bool{lf.Var: true}) && !inner[lf.Var] && lf != f {
						return fmt.Errorf("block %q reduces over loop %q outside loop %q: running an iteration again would reduce twice", blk.Name, lf.Var.Name, f.Var.Name)
					}
				}
			}
		}
		for _, r := range blk.Reads {
			if !written[r.Buffer] || ready[r.Buffer] {
				continue
			}
			selfInit := blk.Init != nil && writes(blk, r.Buffer)
			if !selfInit {
				return fmt.Errorf("block %q reads %q, which blocks under loop %q write, before any block there writes it without reading it: running an iteration again could read what the one before wrote", blk.Name, r.Buffer.Name, f.Var.Name)
			}
		}
		for _, w := range blk.Writes {
			if !reads(blk, w.Buffer) || blk.Init != nil {
				ready[w.Buffer] = true
			}
		}
	}
	return nil
}
