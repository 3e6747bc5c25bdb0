package auto

import (
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// The row pipeline rule takes a function whose last block is spatial
// over [rows…, K] and writes a parameter, and whose earlier blocks each
// write an intermediate, either spatial over the same [rows…, K] or a
// reduction over the same rows with one reduced variable over K, each
// reading the intermediates only at its own row (the layer norm's sum,
// sum of squares, normalization and scale; softmax's maximum,
// exponentials, their sum and quotient). It computes every earlier
// block at the last block's innermost row loop (compute_at, last
// first), so a row's steps run one after the other while the row is in
// the L1 cache and the intermediates shrink to one row; the row loops
// are fused and run in parallel where the function's work reaches
// genericParallelFactor × Options.ParallelFlops; each spatial block's
// loop over K is split into vectors (where the lanes divide K) and
// vectorized, and each reduction keeps a vector of partial results
// (vectorRowsOn). The generic rule ran the blocks one after the other over
// the whole tensor, each in its own pass over memory, with an
// intermediate of the whole tensor (ConvNeXt's layer norms over 56×56
// rows of 96 channels: 1.2 MB, beyond the L1 and L2 working set).
func scheduleRowPipeline(in cpuIn) (*scheduled, bool, error) {
	f, opts := in.f, in.opts
	blocks := topBlocks(f)
	if len(blocks) < 2 {
		return nil, false, skip("fewer than two blocks")
	}
	for _, br := range blocks {
		if !unscheduled(f, br) {
			return nil, false, skip("block %q is scheduled", br.Block.Name)
		}
	}
	last := blocks[len(blocks)-1]
	n := len(last.Block.IterVars)
	st, ok := last.Block.Body.(*ir.BufferStore)
	if n < 2 || !ok || !isSpatial(last.Block) || !isParam(f, st.Buffer) {
		return nil, false, skip("the last block is not spatial over rows into a parameter")
	}
	exts := make([]int64, n)
	for i, iv := range last.Block.IterVars {
		if exts[i], ok = ir.IsConstInt(iv.Dom.Extent); !ok || exts[i] < 1 {
			return nil, false, skip("block %q: extents", last.Block.Name)
		}
	}
	inter := map[*ir.Buffer]bool{}
	reductions := 0
	work := int64(0)
	for _, br := range blocks {
		b := br.Block
		bst, ok := b.Body.(*ir.BufferStore)
		m := len(b.IterVars)
		if !ok || m < n || len(b.AllocBuffers) > 0 {
			return nil, false, skip("block %q is not a step of rows", b.Name)
		}
		spatial := isSpatial(b)
		if spatial && m != n {
			return nil, false, skip("block %q is not over the rows of %q", b.Name, last.Block.Name)
		}
		if !spatial {
			if b.Init == nil || b.IterVars[m-1].Kind != ir.IterReduce {
				return nil, false, skip("block %q is not a row reduction", b.Name)
			}
			reductions++
		}
		// A reduction's rows may keep the reduced axis as one (keepdims).
		for i, iv := range b.IterVars {
			e, ok := ir.IsConstInt(iv.Dom.Extent)
			want, kind := int64(1), ir.IterSpatial
			switch {
			case i < n-1:
				want = exts[i]
			case i == m-1:
				want = exts[n-1]
				if !spatial {
					kind = ir.IterReduce
				}
			}
			if !ok || e != want || iv.Kind != kind {
				return nil, false, skip("block %q is not over the rows of %q", b.Name, last.Block.Name)
			}
		}
		// Rows are read at the block's own row only.
		bad := false
		ir.Visit(b, func(nd ir.Node) bool {
			if l, ok := nd.(*ir.BufferLoad); ok && inter[l.Buffer] {
				if len(l.Indices) < n-1 {
					bad = true
				}
				for i := 0; i < n-1 && !bad; i++ {
					bad = !isVar(l.Indices[i], b.IterVars[i].Var)
				}
			}
			return !bad
		})
		if bad {
			return nil, false, skip("block %q reads another row", b.Name)
		}
		if br != last {
			if isParam(f, bst.Buffer) || inter[bst.Buffer] {
				return nil, false, skip("block %q does not write an intermediate of its own", b.Name)
			}
			inter[bst.Buffer] = true
		}
		work += rowWork(exts)
	}
	if reductions == 0 {
		return nil, false, skip("no row reduction")
	}
	s, err := schedule.New(f)
	if err != nil {
		return nil, false, err
	}
	lb, err := s.GetBlock(last.Block.Name)
	if err != nil {
		return nil, false, err
	}
	loops, err := s.GetLoops(lb)
	if err != nil {
		return nil, false, err
	}
	if len(loops) != n {
		return nil, false, skip("block %q: loops", last.Block.Name)
	}
	for i := len(blocks) - 2; i >= 0; i-- {
		b, err := s.GetBlock(blocks[i].Block.Name)
		if err != nil {
			return nil, false, err
		}
		if err := s.ComputeAt(b, loops[n-2]); err != nil {
			return nil, false, err
		}
	}
	for _, br := range blocks {
		if !isSpatial(br.Block) {
			continue
		}
		if err := vectorizeInner(s, br.Block.Name, exts[n-1], opts); err != nil {
			return nil, false, err
		}
	}
	// The row loops fused into the parallel one: all of them (the
	// rule's own pick, where the work is enough), the outer ones, or
	// none.
	k := int64(0)
	if opts.ParallelFlops > 0 && work >= genericParallelFactor*opts.ParallelFlops && rowWork(exts[:n-1]) >= 2 {
		k = int64(n - 1)
	}
	cands := []int64{0}
	if opts.ParallelFlops > 0 {
		cands = upTo0(int64(n - 1))
	}
	if k, err = opts.choose(s, RuleRowPipeline+"/"+last.Block.Name+"/parallel", cands, k); err != nil {
		return nil, false, err
	}
	if k > 0 {
		par := loops[0]
		if k > 1 {
			if par, err = s.Fuse(loops[:k]...); err != nil {
				return nil, false, err
			}
		}
		if err := s.Parallel(par); err != nil {
			return nil, false, err
		}
	}
	if _, err := vectorRowsOn(s, opts, RuleRowPipeline); err != nil {
		return nil, false, err
	}
	return done(s), true, nil
}

// rowWork is the product of exts.
func rowWork(exts []int64) int64 {
	w := int64(1)
	for _, e := range exts {
		w *= e
	}
	return w
}

// vectorizeInner splits the innermost loop of block name, of extent k,
// into vectors and vectorizes them, where the lanes of its output's
// element type divide k (or as chooseLanes chooses).
func vectorizeInner(s *schedule.Schedule, name string, k int64, opts Options) error {
	b, loops, err := blockLoops(s, name)
	if err != nil {
		return err
	}
	br, err := s.BlockRealize(b)
	if err != nil {
		return err
	}
	st, ok := br.Block.Body.(*ir.BufferStore)
	if !ok || len(loops) == 0 || parallelExtent(s, loops[len(loops)-1]) != k {
		return nil
	}
	lanes, err := chooseLanes(s, RuleRowPipeline+"/"+name+"/vector", k, int64(st.Buffer.DType.Size()), opts)
	if err != nil || lanes < 2 {
		return err
	}
	parts, err := s.Split(loops[len(loops)-1], -1, lanes)
	if err != nil {
		return err
	}
	return s.Vectorize(parts[1])
}
