package auto

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// rowPipeline gives the function of s, when its blocks all run over the
// same rows and one last axis of the same length K (softmax, layer norm:
// sums and maxima of a row, then elementwise work over the row that
// reads them), a cross-thread schedule made of schedule primitives, as
// DLight's general-reduction rule: one block of T threads (a power of two
// from 32 to 256, at most K) per row. Elementwise intermediates are
// inlined into their readers (recomputed, never stored); the last block,
// elementwise into an output, gets the rows fused into blockIdx.x and
// the row split over the threads (thread t computes k = t, t+T…); each
// reduction of a row (y[rows] = y[rows] + E or max(y[rows], E), from a
// constant init, into an intermediate) is moved under the row's blockIdx.x
// loop (compute_at, last first) and reduced across the threads as the
// row-reduction rule does (rfactor into a "local" partial result per
// thread, then a cross-thread reduction over threadIdx.x, which lowering
// turns into a tree through shared memory and warp shuffles), its total a
// "local" value that every thread of the row gets. A reduction's total is
// read by later blocks only at its own row. It reports false when the
// function is not such a function (at least one reduction is needed).
func rowPipeline(s *schedule.Schedule, opts GPUOptions) (bool, error) {
	f := s.Func()
	blocks := topBlocks(f)
	if len(blocks) < 2 {
		return false, nil
	}
	if _, _, _, _, _, mm := gpuMatmulTiles(blocks[0]); mm {
		return false, nil
	}
	inter := map[*ir.Buffer]bool{}
	if root := ir.RootBlock(f.Body); root != nil {
		for _, b := range root.AllocBuffers {
			inter[b] = true
		}
	}
	var exts []int64
	totals := map[*ir.Buffer]bool{}   // the reductions' outputs
	computed := map[*ir.Buffer]bool{} // the outputs of the blocks so far
	var reds, inlined []string
	for j, br := range blocks {
		b := br.Block
		n := len(b.IterVars)
		if n < 2 || len(br.IterValues) != n || !isTrue(br.Predicate) || len(b.AllocBuffers) > 0 {
			return false, nil
		}
		if exts == nil {
			exts = make([]int64, n)
		} else if len(exts) != n {
			return false, nil
		}
		isRed := b.Init != nil
		for i, iv := range b.IterVars {
			want := ir.IterSpatial
			if i == n-1 && isRed {
				want = ir.IterReduce
			}
			e, ok := ir.IsConstInt(iv.Dom.Extent)
			if iv.Kind != want || !ok || e < 1 || (exts[i] != 0 && exts[i] != e) {
				return false, nil
			}
			if m, ok := ir.IsConstInt(iv.Dom.Min); !ok || m != 0 {
				return false, nil
			}
			if _, ok := br.IterValues[i].(*ir.Var); !ok {
				return false, nil
			}
			exts[i] = e
		}
		st, ok := b.Body.(*ir.BufferStore)
		if !ok || st.Buffer.DType.Lanes != 1 || !st.Buffer.DType.IsFloat() {
			return false, nil
		}
		own := n
		if isRed {
			own = n - 1
		}
		if len(st.Indices) != own || !ownIndices(&ir.Block{IterVars: b.IterVars[:own]}, st.Indices) {
			return false, nil
		}
		value := st.Value
		if isRed {
			r, ok := reduction(b, st)
			if !ok || !inter[st.Buffer] {
				return false, nil
			}
			value = r.term
		}
		// Totals are read at their own row; intermediates after they
		// are computed.
		good := true
		ir.Visit(value, func(nd ir.Node) bool {
			if l, ok := nd.(*ir.BufferLoad); ok {
				if totals[l.Buffer] && !ownIndices(&ir.Block{IterVars: b.IterVars[:n-1]}, l.Indices) {
					good = false
				}
				if inter[l.Buffer] && !computed[l.Buffer] {
					good = false
				}
			}
			return good
		})
		if !good {
			return false, nil
		}
		computed[st.Buffer] = true
		switch last := j == len(blocks)-1; {
		case isRed:
			totals[st.Buffer] = true
			reds = append(reds, b.Name)
		case last && inter[st.Buffer], !last && !inter[st.Buffer]:
			return false, nil // one output, the last block's
		case !last:
			inlined = append(inlined, b.Name)
		}
	}
	n := len(exts)
	K := exts[n-1]
	if len(reds) == 0 || K < 32 {
		return false, nil
	}
	N := int64(1)
	for _, e := range exts[:n-1] {
		N *= e
	}
	if N > 1<<31-1 {
		return false, nil
	}
	T, err := reduceThreads(s, opts, "gpu_row_pipeline/"+blocks[len(blocks)-1].Block.Name+"/threads", K)
	if err != nil {
		return false, err
	}
	fail := func(err error) (bool, error) { return false, fmt.Errorf("row pipeline: %w", err) }
	for _, name := range inlined {
		b, err := s.GetBlock(name)
		if err != nil {
			return fail(err)
		}
		if err := s.ComputeInline(b); err != nil {
			return false, nil // read where it cannot be recomputed
		}
	}
	// The output: the rows on blockIdx.x, the row over the threads.
	out, err := s.GetBlock(blocks[len(blocks)-1].Block.Name)
	if err != nil {
		return fail(err)
	}
	loops, err := s.GetLoops(out)
	if err != nil {
		return fail(err)
	}
	rows := loops[0]
	if n > 2 {
		if rows, err = s.Fuse(loops[:n-1]...); err != nil {
			return fail(err)
		}
	}
	ks, err := s.Split(loops[n-1], -1, T)
	if err != nil {
		return fail(err)
	}
	if err := s.Reorder(ks[1], ks[0]); err != nil {
		return fail(err)
	}
	if err := s.Bind(rows, "blockIdx.x"); err != nil {
		return fail(err)
	}
	if err := s.Bind(ks[1], "threadIdx.x"); err != nil {
		return fail(err)
	}
	// The reductions in the same block of threads, last first (each is
	// read only under the row's loop by then): each reduced across the
	// threads in a nest of its own, then moved under the row's loop.
	for i := len(reds) - 1; i >= 0; i-- {
		if err := crossThreadSum(s, reds[i], T); err != nil {
			return fail(err)
		}
		b, err := s.GetBlock(reds[i])
		if err != nil {
			return fail(err)
		}
		rf, err := s.GetBlock(reds[i] + "_rf")
		if err != nil {
			return fail(err)
		}
		for _, x := range []schedule.BlockRV{b, rf} {
			if err := s.ComputeAt(x, rows); err != nil {
				return fail(err)
			}
		}
		bl, err := s.GetLoops(b)
		if err != nil {
			return fail(err)
		}
		if err := s.Bind(bl[len(bl)-1], "threadIdx.x"); err != nil {
			return fail(err)
		}
		// The partial results' loops: the row's (one iteration), k's outer
		// part, the threads.
		rl, err := s.GetLoops(rf)
		if err != nil {
			return fail(err)
		}
		ko, tx := rl[len(rl)-2], rl[len(rl)-1]
		if err := s.Reorder(tx, ko); err != nil {
			return fail(err)
		}
		if err := s.Bind(tx, "threadIdx.x"); err != nil {
			return fail(err)
		}
		if err := s.SetScope(b, 0, "local"); err != nil {
			return fail(err)
		}
	}
	return true, nil
}

// reduced is a reduction block's update: y = op(y, term) from init.
type reduced struct {
	op   ir.BinaryOp
	init ir.Expr
	term ir.Expr
}

// reduction reads block b's update st as y[rows] = y[rows] + E or
// max(y[rows], E) (E not reading y) with a constant init.
func reduction(b *ir.Block, st *ir.BufferStore) (reduced, bool) {
	var r reduced
	bin, ok := st.Value.(*ir.Binary)
	if !ok || (bin.Op != ir.OpAdd && bin.Op != ir.OpMax) {
		return r, false
	}
	self, ok := bin.A.(*ir.BufferLoad)
	if !ok || self.Buffer != st.Buffer || len(self.Indices) != len(st.Indices) {
		return r, false
	}
	for i, idx := range self.Indices {
		if !isVar(idx, b.IterVars[i].Var) {
			return r, false
		}
	}
	if readsAny(bin.B, map[*ir.Buffer]bool{st.Buffer: true}) {
		return r, false
	}
	init, ok := b.Init.(*ir.BufferStore)
	if !ok || init.Buffer != st.Buffer {
		return r, false
	}
	if _, ok := init.Value.(*ir.FloatImm); !ok {
		return r, false
	}
	return reduced{op: bin.Op, init: init.Value, term: bin.B}, true
}
