package auto

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// gpuTileK is the most of the reduction one shared-memory tile holds.
const gpuTileK = 16

// sharedMatmul gives the function of s, when its first block is a 2-D
// matmul the matmul rule takes (C[i, j] = C[i, j] + A(i, k) * B(k, j), see
// gpuMatmulTiles) and the blocks after it are elementwise epilogues over C
// (a bias add, an activation), a shared-memory tiled schedule: a block of
// ty × tx threads computes a tile of (ty·rt) × (tx·ct) elements of C, each
// thread an rt × ct register tile whose rows are ty apart and whose
// columns are tx apart (so the threads of a warp read consecutive columns
// of shared memory and store consecutive elements of C). The rows split
// into blockIdx.y, the tile and threadIdx.y, the columns into blockIdx.x,
// the tile and threadIdx.x, and k into tiles of bk (up to 16) values:
// for each, cache_read and compute_at copy the block's bm × bk tile of the
// operand indexed by (i, k) and its bk × bn tile of the operand indexed by
// (k, j) into "shared" buffers (the copy's loops fused and split over the
// threads, so consecutive threads read consecutive addresses, as 16-byte
// vectors where the layout allows), then each thread accumulates its
// register tile from them. The accumulator is a "local" cache_write of C
// in the layout (block row, block column, thread row, thread column, tile
// row, tile column), so each thread's part compacts to its rt × ct
// registers; decompose_reduction puts its init before the k tiles, and its
// copy back (reverse_compute_at under the block, split over the threads
// as the products are) stores C. Barrier insertion places the
// __syncthreads() between the copy and the products, and after the
// products before the next tile's copy overwrites what they read. The sum
// for each element of C runs over k in order, as the unscheduled loop's.
// An epilogue is inlined into the copy back when it reads an intermediate
// C (reverse_compute_inline), else computed by each thread element for
// element after the copy back (reverse_compute_at); an intermediate only
// the epilogues read is never stored. It reports false when the function
// is not such a function (the register-only matmul rule then applies).
func sharedMatmul(s *schedule.Schedule, blocks []*ir.BlockRealize, opts GPUOptions) (bool, error) {
	br := blocks[0]
	m, RT, CT, TY, TX, ok := gpuMatmulTiles(br)
	if !ok {
		return false, nil
	}
	M, N, K := m.extents[0], m.extents[1], m.extents[2]
	BK := largestDivisor(K, gpuTileK)
	if BK < 2 {
		return false, nil
	}
	var err error
	b := br.Block
	vi, vj, vk := b.IterVars[0].Var, b.IterVars[1].Var, b.IterVars[2].Var
	st := b.Body.(*ir.BufferStore)
	init, ok := b.Init.(*ir.BufferStore)
	if !ok || init.Buffer != st.Buffer || len(st.Indices) != 2 || !isVar(st.Indices[0], vi) || len(b.AllocBuffers) > 0 {
		return false, nil
	}
	if st.Buffer.DType.Lanes != 1 || !isTrue(br.Predicate) {
		return false, nil
	}
	inter := map[*ir.Buffer]bool{}
	if root := ir.RootBlock(s.Func().Body); root != nil {
		for _, a := range root.AllocBuffers {
			inter[a] = true
		}
	}
	sum := st.Value.(*ir.Binary)
	self := sum.A.(*ir.BufferLoad)
	if len(self.Indices) != 2 || !isVar(self.Indices[0], vi) || !isVar(self.Indices[1], vj) {
		return false, nil
	}
	if readsAny(sum.B, inter) || readsAny(sum.B, map[*ir.Buffer]bool{st.Buffer: true}) || readsAny(init.Value, map[*ir.Buffer]bool{st.Buffer: true}) {
		return false, nil
	}
	prod := sum.B.(*ir.Binary)
	aLoad, bLoad := prod.A.(*ir.BufferLoad), prod.B.(*ir.BufferLoad)
	aStaged := usesExactly(aLoad, vi, vk)
	bStaged := usesExactly(bLoad, vk, vj)
	if !aStaged && !bStaged {
		return false, nil
	}
	if !elementwiseEpilogues(st.Buffer, blocks[1:], []int64{M, N}, inter) {
		return false, nil
	}
	fail := func(err error) (bool, error) {
		return false, fmt.Errorf("shared-memory matmul of block %q: %w", b.Name, err)
	}
	elem := int64(0)
	for _, l := range []*ir.BufferLoad{aLoad, bLoad} {
		elem = max(elem, int64(l.Buffer.DType.Size()))
	}
	if RT, CT, TY, TX, BK, err = sharedTiles(s, opts, b.Name, M, N, K, RT, CT, BK, elem); err != nil {
		return fail(err)
	}
	BM, BN := TY*RT, TX*CT

	c, err := s.GetBlock(b.Name)
	if err != nil {
		return fail(err)
	}
	loops, err := s.GetLoops(c)
	if err != nil {
		return fail(err)
	}
	is, err := s.Split(loops[0], M/BM, RT, TY)
	if err != nil {
		return fail(err)
	}
	js, err := s.Split(loops[1], N/BN, CT, TX)
	if err != nil {
		return fail(err)
	}
	ks, err := s.Split(loops[2], K/BK, BK)
	if err != nil {
		return fail(err)
	}
	by, r, ty := is[0], is[1], is[2]
	bx, cl, tx := js[0], js[1], js[2]
	ko, kk := ks[0], ks[1]
	if err := s.Reorder(by, bx, ko, ty, tx, kk, r, cl); err != nil {
		return fail(err)
	}
	if err := bindAll(s, []schedule.LoopRV{by, bx, ty, tx}, []string{"blockIdx.y", "blockIdx.x", "threadIdx.y", "threadIdx.x"}); err != nil {
		return fail(err)
	}

	// The accumulator and its copy back, with the epilogues that read an
	// intermediate C inlined into it.
	wb, err := s.CacheWrite(c, 0, "local")
	if err != nil {
		return fail(err)
	}
	var later []schedule.BlockRV
	for _, e := range blocks[1:] {
		eb, err := s.GetBlock(e.Block.Name)
		if err != nil {
			return fail(err)
		}
		if t := s.Copy(); t.ReverseComputeInline(eb) == nil {
			*s = *t
			continue
		}
		later = append(later, eb)
	}
	if err := s.ReverseComputeAt(wb, bx); err != nil {
		return fail(err)
	}
	wl, err := s.GetLoops(wb)
	if err != nil {
		return fail(err)
	}
	wr, err := s.Split(wl[len(wl)-2], RT, TY)
	if err != nil {
		return fail(err)
	}
	wc, err := s.Split(wl[len(wl)-1], CT, TX)
	if err != nil {
		return fail(err)
	}
	if err := s.Reorder(wr[1], wc[1], wr[0], wc[0]); err != nil {
		return fail(err)
	}
	if err := bindAll(s, []schedule.LoopRV{wr[1], wc[1]}, []string{"threadIdx.y", "threadIdx.x"}); err != nil {
		return fail(err)
	}
	unroll := []schedule.LoopRV{r, cl, wr[0], wc[0]}
	for _, e := range later {
		if err := s.ReverseComputeAt(e, wc[0]); err != nil {
			return fail(err)
		}
	}
	initB, err := s.DecomposeReduction(c, ko)
	if err != nil {
		return fail(err)
	}
	il, err := s.GetLoops(initB)
	if err != nil {
		return fail(err)
	}
	unroll = append(unroll, il[len(il)-2:]...)
	// Each thread's accumulators apart from the others': the layout
	// (block row, block column, thread row, thread column, tile row, tile
	// column) of C's element (i, j).
	layout := schedule.NewIndexMap(2, func(ix ...ir.Expr) []ir.Expr {
		i, j := ix[0], ix[1]
		return []ir.Expr{ir.FloorDiv(i, ir.I32(BM)), ir.FloorDiv(j, ir.I32(BN)), ir.FloorMod(i, ir.I32(TY)), ir.FloorMod(j, ir.I32(TX)),
			ir.FloorDiv(ir.FloorMod(i, ir.I32(BM)), ir.I32(TY)), ir.FloorDiv(ir.FloorMod(j, ir.I32(BN)), ir.I32(TX))}
	})
	if err := s.TransformLayout(wb, schedule.BufferIndex{}, layout, nil); err != nil {
		return fail(err)
	}

	// The tiles of the operands, copied by all the threads for each
	// tile of k.
	for _, op := range []struct {
		load   *ir.BufferLoad
		staged bool
		col    *ir.Var
		cols   int64
	}{{aLoad, aStaged, vk, BK}, {bLoad, bStaged, vj, BN}} {
		if !op.staged {
			continue
		}
		cr, err := s.BlockRealize(c)
		if err != nil {
			return fail(err)
		}
		at := slices.IndexFunc(cr.Block.Reads, func(rg ir.BufferRegion) bool { return rg.Buffer == op.load.Buffer })
		if at < 0 {
			return fail(fmt.Errorf("block %q does not read %q", b.Name, op.load.Buffer.Name))
		}
		cp, err := s.CacheRead(c, at, "shared")
		if err != nil {
			return fail(err)
		}
		if err := s.ComputeAt(cp, ko); err != nil {
			return fail(err)
		}
		vw := int64(1)
		if len(op.load.Indices) == 2 && isVar(op.load.Indices[1], op.col) {
			vw = copyVector(op.load, op.cols)
		}
		cl, err := s.GetLoops(cp)
		if err != nil {
			return fail(err)
		}
		// Vector e of the tile (row-major) is copied by thread e mod T.
		rows, cols := cl[len(cl)-2], cl[len(cl)-1]
		var vec []schedule.LoopRV
		if vw > 1 {
			cs, err := s.Split(cols, op.cols/vw, vw)
			if err != nil {
				return fail(err)
			}
			cols, vec = cs[0], cs[1:]
		}
		f, err := s.Fuse(rows, cols)
		if err != nil {
			return fail(err)
		}
		parts, err := s.Split(f, -1, TY, TX)
		if err != nil {
			return fail(err)
		}
		if err := s.Reorder(parts[1], parts[2], parts[0]); err != nil {
			return fail(err)
		}
		if err := bindAll(s, parts[1:], []string{"threadIdx.y", "threadIdx.x"}); err != nil {
			return fail(err)
		}
		unroll = append(unroll, parts[0])
		for _, v := range vec {
			if err := s.Vectorize(v); err != nil {
				return fail(err)
			}
		}
	}
	for _, u := range unroll {
		if err := s.Unroll(u); err != nil {
			return fail(err)
		}
	}
	return true, nil
}

// Limits of the shared-memory matmul's choices: a register tile of up
// to gpuMaxTile × gpuMaxTile, up to gpuMaxSide threads along each side of
// a block and gpuMaxBlockThreads in all, no more than gpuMaxAccumulators
// accumulators per block (registers: 64 K per block), tiles of k of up
// to gpuMaxTileK in gpuMaxShared bytes of shared memory (CUDA's static
// limit).
const (
	gpuMaxTile         = 8
	gpuMaxSide         = 32
	gpuMaxBlockThreads = 512
	gpuMaxAccumulators = 8192
	gpuMaxTileK        = 32
	gpuMaxShared       = 48 << 10
)

// sharedTiles makes the shared-memory matmul's choices for an M × N × K
// matmul of operands of elem bytes: the register tile (rt × ct), the
// threads (ty × tx) and the tile of k (bk). Each choice's candidates are
// the sizes that divide what is left and keep the block within CUDA's
// limits (see above); the rule's own picks are rt0, ct0 and bk0 with
// ty and tx the largest divisors up to gpuBlockSide (gpuMatmulTiles).
func sharedTiles(s *schedule.Schedule, opts GPUOptions, name string, M, N, K, rt0, ct0, bk0, elem int64) (rt, ct, ty, tx, bk int64, err error) {
	site := "gpu_matmul_shared/" + name + "/"
	if rt, err = opts.choose(s, site+"tile_rows", gpuDivisors(M, gpuMaxTile), rt0); err != nil {
		return
	}
	if ct, err = opts.choose(s, site+"tile_cols", gpuDivisors(N, gpuMaxTile), ct0); err != nil {
		return
	}
	fits := func(ty, tx int64) bool { return ty*tx <= gpuMaxBlockThreads && ty*tx*rt*ct <= gpuMaxAccumulators }
	var tys []int64
	for _, y := range gpuDivisors(M/rt, gpuMaxSide) {
		if fits(y, 1) {
			tys = append(tys, y)
		}
	}
	if ty, err = opts.choose(s, site+"threads_y", tys, largestIn(tys, gpuBlockSide)); err != nil {
		return
	}
	var txs []int64
	for _, x := range gpuDivisors(N/ct, gpuMaxSide) {
		if fits(ty, x) {
			txs = append(txs, x)
		}
	}
	if tx, err = opts.choose(s, site+"threads_x", txs, largestIn(txs, gpuBlockSide)); err != nil {
		return
	}
	var bks []int64
	for _, k := range gpuDivisors(K, gpuMaxTileK) {
		if k >= 2 && (ty*rt+tx*ct)*k*elem <= gpuMaxShared {
			bks = append(bks, k)
		}
	}
	if len(bks) == 0 {
		bks = []int64{bk0}
	}
	bk, err = opts.choose(s, site+"tile_k", bks, largestIn(bks, bk0))
	return
}

// largestIn returns the largest of cands up to limit (cands sorted, the
// first when none is).
func largestIn(cands []int64, limit int64) int64 {
	best := cands[0]
	for _, c := range cands {
		if c <= limit {
			best = c
		}
	}
	return best
}

// bindAll binds each loop of ls to the thread axis of the same index in
// tags.
func bindAll(s *schedule.Schedule, ls []schedule.LoopRV, tags []string) error {
	for i, l := range ls {
		if err := s.Bind(l, tags[i]); err != nil {
			return err
		}
	}
	return nil
}

// elementwiseEpilogues reports whether the blocks after a matmul into c
// over an M × N output (exts) are spatial blocks over the same extents
// that read c and each other's outputs only at their own iteration
// variables, and whether at least one buffer is stored (c or an epilogue's
// output that is not an intermediate of inter).
func elementwiseEpilogues(c *ir.Buffer, epilogues []*ir.BlockRealize, exts []int64, inter map[*ir.Buffer]bool) bool {
	known := map[*ir.Buffer]bool{c: true}
	stored := !inter[c]
	for _, br := range epilogues {
		b := br.Block
		if b.Init != nil || len(b.IterVars) != len(exts) || len(b.AllocBuffers) > 0 || !isTrue(br.Predicate) || len(br.IterValues) != len(exts) {
			return false
		}
		for i, iv := range b.IterVars {
			e, ok := ir.IsConstInt(iv.Dom.Extent)
			if iv.Kind != ir.IterSpatial || !ok || e != exts[i] {
				return false
			}
			if _, ok := br.IterValues[i].(*ir.Var); !ok {
				return false
			}
		}
		st, ok := b.Body.(*ir.BufferStore)
		if !ok || !ownIndices(b, st.Indices) {
			return false
		}
		good := true
		ir.Visit(st.Value, func(n ir.Node) bool {
			if l, ok := n.(*ir.BufferLoad); ok && known[l.Buffer] && !ownIndices(b, l.Indices) {
				good = false
			}
			return good
		})
		if !good {
			return false
		}
		known[st.Buffer] = true
		stored = stored || !inter[st.Buffer]
	}
	return stored
}

// ownIndices reports whether idx are block b's iteration variables, in
// order.
func ownIndices(b *ir.Block, idx []ir.Expr) bool {
	if len(idx) != len(b.IterVars) {
		return false
	}
	for i, x := range idx {
		if !isVar(x, b.IterVars[i].Var) {
			return false
		}
	}
	return true
}

// usesExactly reports whether the indices of l use the variables x and y,
// both, and no other variable.
func usesExactly(l *ir.BufferLoad, x, y *ir.Var) bool {
	seen := map[*ir.Var]bool{}
	other := false
	for _, idx := range l.Indices {
		ir.Visit(idx, func(n ir.Node) bool {
			if v, ok := n.(*ir.Var); ok {
				if v == x || v == y {
					seen[v] = true
				} else {
					other = true
				}
			}
			return true
		})
	}
	return !other && seen[x] && seen[y]
}

// copyVector returns the lanes of the vector copies of a tile cols wide
// from l's buffer: 16 bytes of elements when l reads its (row, column)
// directly, from a buffer of constant shape without strides or offset
// whose rows, like the tile's, are a whole number of vectors (so that
// every vector is aligned to its size in a buffer aligned to 16 bytes, as
// CUDA's allocations are); 1 otherwise.
func copyVector(l *ir.BufferLoad, cols int64) int64 {
	b := l.Buffer
	vw := int64(16 / b.DType.Size())
	if vw < 2 || b.DType.Lanes != 1 || len(l.Indices) != 2 || len(b.Shape) != 2 || b.Strides != nil || cols%vw != 0 {
		return 1
	}
	if b.ElemOffset != nil {
		if off, ok := ir.IsConstInt(b.ElemOffset); !ok || off != 0 {
			return 1
		}
	}
	for _, x := range l.Indices {
		if _, ok := x.(*ir.Var); !ok {
			return 1
		}
	}
	w, ok := ir.IsConstInt(b.Shape[1])
	if !ok || w%vw != 0 {
		return 1
	}
	return vw
}

// onInlinedSchedule makes a GPU rule of one that schedules a copy of the
// schedule of the function with its producers inlined (see prepare),
// reporting false when it does not apply.
func onInlinedSchedule(r func(*schedule.Schedule, []*ir.BlockRealize, GPUOptions) (bool, error)) func(*gpuIn) (*scheduled, bool, error) {
	return func(in *gpuIn) (*scheduled, bool, error) {
		blocks, err := in.prepare()
		if err != nil {
			return nil, false, err
		}
		s := in.inlined.Copy()
		ok, err := r(s, blocks, in.opts)
		if err != nil || !ok {
			return nil, false, err
		}
		return done(s), true, nil
	}
}
