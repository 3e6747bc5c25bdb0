package auto

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// gpuReduceThreads is the most threads the row-reduction rule gives one
// row; gpuReduceMinK is the shortest reduction it takes.
const (
	gpuReduceThreads = 256
	gpuReduceMinK    = 64
)

// rowReduction gives the function of s, when its one block is a sum over
// one reduction loop into an output indexed by its spatial iteration
// variables (y[i…] = y[i…] + E(i…, k), initialized to 0: a GEMV, a row
// sum), a cross-thread schedule made of schedule primitives, as DLight's
// GEMV rule: one block of T threads (a power of two up to 256) per output
// element (the spatial loops fused and bound to blockIdx.x); the
// reduction loop is split by T and its inner part rfactored into a
// "local" partial sum per thread (thread t sums E over k = t, t+T, t+2T…
// in order), and the sum itself, moved under the same blockIdx.x loop
// (reverse_compute_at), reduces the partial sums over a threadIdx.x loop:
// a cross-thread reduction, which lowering (lower_cross_thread_reduction)
// turns into pairwise sums through shared memory down to 64 (barriers
// between the steps, placed by barrier insertion) and five warp shuffles
// (tvm_warp_shuffle_down, every lane of every warp taking part), thread 0
// storing the total. The sum's order is not the serial loop's, so
// results differ from it by rounding. Spatial blocks after the sum that
// read it (and each other) element for element, a bias add and an
// activation, are moved under the blockIdx.x loop and computed by thread
// 0 (their one element split over the threads); intermediates only they
// read become "local", so they are never stored. It reports false when
// the function is not such a function, or is a matmul the matmul or
// tensor-core rule takes.
func rowReduction(s *schedule.Schedule, opts GPUOptions) (bool, error) {
	f := s.Func()
	blocks := topBlocks(f)
	if len(blocks) == 0 {
		return false, nil
	}
	// Intermediates of the function: never stored when only the
	// epilogues read them (their values are substituted).
	inter := map[*ir.Buffer]bool{}
	if root := ir.RootBlock(f.Body); root != nil {
		for _, b := range root.AllocBuffers {
			inter[b] = true
		}
	}
	br := blocks[0]
	if _, _, _, _, _, mm := gpuMatmulTiles(br); mm {
		return false, nil // the matmul rule's
	}
	if _, mm := matchMmaMatmul(br); mm {
		return false, nil // the tensor-core rule's
	}
	b := br.Block
	n := len(b.IterVars)
	if n < 2 || b.Init == nil || len(br.IterValues) != n || !isTrue(br.Predicate) || len(b.AllocBuffers) > 0 {
		return false, nil
	}
	exts := make([]int64, n)
	for i, iv := range b.IterVars {
		want := ir.IterSpatial
		if i == n-1 {
			want = ir.IterReduce
		}
		e, ok := ir.IsConstInt(iv.Dom.Extent)
		if iv.Kind != want || !ok || e < 1 {
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
	K := exts[n-1]
	if K < gpuReduceMinK {
		return false, nil
	}
	// The body: y[i…] = y[i…] + E, with y indexed by the spatial
	// variables in order; the init: y[i…] = 0.
	st, ok := b.Body.(*ir.BufferStore)
	if !ok || len(st.Indices) != n-1 || st.Buffer.DType.Lanes != 1 || !st.Buffer.DType.IsFloat() {
		return false, nil
	}
	for i, idx := range st.Indices {
		if !isVar(idx, b.IterVars[i].Var) {
			return false, nil
		}
	}
	sum, ok := st.Value.(*ir.Binary)
	if !ok || sum.Op != ir.OpAdd {
		return false, nil
	}
	self, ok := sum.A.(*ir.BufferLoad)
	if !ok || self.Buffer != st.Buffer || len(self.Indices) != n-1 {
		return false, nil
	}
	for i, idx := range self.Indices {
		if !isVar(idx, b.IterVars[i].Var) {
			return false, nil
		}
	}
	term := sum.B
	usesY := false
	ir.Visit(term, func(nd ir.Node) bool {
		if l, ok := nd.(*ir.BufferLoad); ok && l.Buffer == st.Buffer {
			usesY = true
		}
		return !usesY
	})
	init, ok := b.Init.(*ir.BufferStore)
	if usesY || !ok || init.Buffer != st.Buffer || readsAny(term, inter) {
		return false, nil
	}
	if z, ok := init.Value.(*ir.FloatImm); !ok || z.Value != 0 {
		return false, nil
	}
	N := int64(1)
	for _, e := range exts[:n-1] {
		N *= e
	}
	if N > 1<<31-1 {
		return false, nil
	}
	if !elementwiseEpilogues(st.Buffer, blocks[1:], exts[:n-1], inter) {
		return false, nil
	}
	T, err := reduceThreads(s, opts, "gpu_row_reduction/"+b.Name+"/threads", K)
	if err != nil {
		return false, err
	}
	fail := func(err error) (bool, error) {
		return false, fmt.Errorf("row reduction of block %q: %w", b.Name, err)
	}
	if err := crossThreadSum(s, b.Name, T); err != nil {
		return fail(err)
	}
	if inter[st.Buffer] {
		sb, err := s.GetBlock(b.Name)
		if err != nil {
			return fail(err)
		}
		if err := s.SetScope(sb, 0, "local"); err != nil {
			return fail(err)
		}
	}
	rows, err := rowLoop(s, b.Name)
	if err != nil {
		return fail(err)
	}
	// Thread 0 computes the epilogues from the total.
	for _, e := range blocks[1:] {
		eb, err := s.GetBlock(e.Block.Name)
		if err != nil {
			return fail(err)
		}
		if err := s.ReverseComputeAt(eb, rows); err != nil {
			return fail(err)
		}
		if inter[e.Block.Body.(*ir.BufferStore).Buffer] {
			if err := s.SetScope(eb, 0, "local"); err != nil {
				return fail(err)
			}
		}
		el, err := s.GetLoops(eb)
		if err != nil {
			return fail(err)
		}
		inner := el[1:]
		l := inner[0]
		if len(inner) > 1 {
			if l, err = s.Fuse(inner...); err != nil {
				return fail(err)
			}
		}
		parts, err := s.Split(l, -1, T)
		if err != nil {
			return fail(err)
		}
		if err := s.Bind(parts[1], "threadIdx.x"); err != nil {
			return fail(err)
		}
	}
	return true, nil
}

// reduceThreads chooses the threads that reduce one row of K values: a
// power of two from a warp to the most a block has, no more than K; the
// rule's own pick is the largest up to gpuReduceThreads.
func reduceThreads(s *schedule.Schedule, opts GPUOptions, site string, K int64) (int64, error) {
	T := int64(gpuReduceThreads)
	for T > K {
		T /= 2
	}
	cands := []int64{T}
	for _, t := range gpuPowers(32, gpuMaxThreads) {
		if t <= K {
			cands = append(cands, t)
		}
	}
	return opts.choose(s, site, cands, T)
}

// crossThreadSum gives reduction block name (spatial loops around one
// reduction loop) one block of T threads (a power of two from 32) per
// output element: the spatial loops fused into blockIdx.x, and the
// reduction across the threads (see crossThreadAt).
func crossThreadSum(s *schedule.Schedule, name string, T int64) error {
	_, loops, err := blockLoops(s, name)
	if err != nil {
		return err
	}
	n := len(loops)
	rows := loops[0]
	if n > 2 {
		if rows, err = s.Fuse(loops[:n-1]...); err != nil {
			return err
		}
	}
	if err := s.Bind(rows, "blockIdx.x"); err != nil {
		return err
	}
	return crossThreadAt(s, name, loops[n-1], rows, T)
}

// crossThreadAt reduces block name across the T threads of each
// iteration of loop rows, bound to blockIdx.x: its reduction loop k is
// split by T and its inner part rfactored into a "local" partial result
// per thread (thread t reduces k = t, t+T… in order), and the block
// itself, under rows (reverse_compute_at), reduces the partial results
// over a threadIdx.x loop of T: a cross-thread reduction, which
// lower_cross_thread_reduction turns into a tree through shared memory
// and warp shuffles.
func crossThreadAt(s *schedule.Schedule, name string, k, rows schedule.LoopRV, T int64) error {
	b, err := s.GetBlock(name)
	if err != nil {
		return err
	}
	ks, err := s.Split(k, -1, T)
	if err != nil {
		return err
	}
	rf, err := s.RFactor(ks[1], 0)
	if err != nil {
		return err
	}
	if err := s.SetScope(rf, 0, "local"); err != nil {
		return err
	}
	if err := s.Reorder(ks[1], ks[0]); err != nil {
		return err
	}
	if err := s.Bind(ks[1], "threadIdx.x"); err != nil {
		return err
	}
	if err := s.ReverseComputeAt(b, rows); err != nil {
		return err
	}
	bl, err := s.GetLoops(b)
	if err != nil {
		return err
	}
	return s.Bind(bl[len(bl)-1], "threadIdx.x")
}

// rowLoop returns the blockIdx.x loop of block name.
func rowLoop(s *schedule.Schedule, name string) (schedule.LoopRV, error) {
	_, loops, err := blockLoops(s, name)
	if err != nil {
		return schedule.LoopRV{}, err
	}
	return loops[0], nil
}

// readsAny reports whether e loads one of bufs.
func readsAny(e ir.Expr, bufs map[*ir.Buffer]bool) bool {
	found := false
	ir.Visit(e, func(n ir.Node) bool {
		if l, ok := n.(*ir.BufferLoad); ok && bufs[l.Buffer] {
			found = true
		}
		return !found
	})
	return found
}

// onFunc makes a GPU rule of one that schedules the function as it is,
// reporting false when it does not apply.
func onFunc(r func(*schedule.Schedule, GPUOptions) (bool, error)) func(*gpuIn) (*scheduled, bool, error) {
	return func(in *gpuIn) (*scheduled, bool, error) {
		s, err := schedule.New(in.f)
		if err != nil {
			return nil, false, skip("gpu schedule: %v", err)
		}
		ok, err := r(s, in.opts)
		if err != nil || !ok {
			return nil, false, err
		}
		return done(s), true, nil
	}
}
