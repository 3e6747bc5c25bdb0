package auto

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/ndarray"
)

// Tensor-core matmul tiling: a warp computes mmaFragsM × mmaFragsN tiles
// of 16×8 elements of C (one ptx_mma m16n8k16 each per 16 values of k); a
// block has up to mmaWarpsM × mmaWarpsN warps and stages tiles of up to
// mmaTileK values of k in shared memory.
const (
	mmaFragsM = 4
	mmaFragsN = 4
	mmaWarpsM = 2
	mmaWarpsN = 4
	mmaTileK  = 32
)

// mmaMatmul is a 2-D matmul the tensor-core rule takes.
type mmaMatmul struct {
	st, init     *ir.BufferStore
	self         *ir.BufferLoad // C[vi, vj] in the sum
	a, b         *ir.BufferLoad // the operands indexed by (i, k) and (k, j)
	vi, vj, vk   *ir.Var
	M, N, K      int64
	ab           string // "fp16" or "bf16"
	operandDType ir.DType
}

// matchMmaMatmul reports whether br is C[i, j] = C[i, j] + A(i, k) ·
// B(k, j) over 16-bit float operands (float16 or bfloat16, both the same)
// read directly from 2-D buffers (in either index order), either in the
// operands' dtype (C of the same dtype) or as float32 products of the
// operands cast to float32 (C float32), with an init, sizes that tensor
// cores tile (M a multiple of 16, N of 8, K of 16) and no predicate.
func matchMmaMatmul(br *ir.BlockRealize) (mmaMatmul, bool) {
	var m mmaMatmul
	b := br.Block
	if len(b.IterVars) != 3 || len(br.IterValues) != 3 || !isTrue(br.Predicate) || len(b.AllocBuffers) > 0 {
		return m, false
	}
	kinds := []ir.IterKind{ir.IterSpatial, ir.IterSpatial, ir.IterReduce}
	ext := make([]int64, 3)
	for i, iv := range b.IterVars {
		e, ok := ir.IsConstInt(iv.Dom.Extent)
		mn, ok2 := ir.IsConstInt(iv.Dom.Min)
		if iv.Kind != kinds[i] || !ok || !ok2 || mn != 0 {
			return m, false
		}
		if _, ok := br.IterValues[i].(*ir.Var); !ok {
			return m, false
		}
		ext[i] = e
	}
	m.M, m.N, m.K = ext[0], ext[1], ext[2]
	if m.M%16 != 0 || m.N%8 != 0 || m.K%16 != 0 {
		return m, false
	}
	m.vi, m.vj, m.vk = b.IterVars[0].Var, b.IterVars[1].Var, b.IterVars[2].Var
	var ok bool
	if m.st, ok = b.Body.(*ir.BufferStore); !ok || len(m.st.Indices) != 2 || !isVar(m.st.Indices[0], m.vi) || !isVar(m.st.Indices[1], m.vj) {
		return m, false
	}
	if m.init, ok = b.Init.(*ir.BufferStore); !ok || m.init.Buffer != m.st.Buffer || readsAny(m.init.Value, map[*ir.Buffer]bool{m.st.Buffer: true}) {
		return m, false
	}
	sum, ok := m.st.Value.(*ir.Binary)
	if !ok || sum.Op != ir.OpAdd {
		return m, false
	}
	if m.self, ok = sum.A.(*ir.BufferLoad); !ok || m.self.Buffer != m.st.Buffer || len(m.self.Indices) != 2 || !isVar(m.self.Indices[0], m.vi) || !isVar(m.self.Indices[1], m.vj) {
		return m, false
	}
	prod, ok := sum.B.(*ir.Binary)
	if !ok || prod.Op != ir.OpMul {
		return m, false
	}
	cdt := m.st.Buffer.DType
	operand := func(e ir.Expr) (*ir.BufferLoad, bool) {
		if c, isCast := e.(*ir.Cast); isCast {
			if c.Type != ir.Float32 || cdt != ir.Float32 {
				return nil, false
			}
			e = c.Value
		}
		l, isLoad := e.(*ir.BufferLoad)
		if !isLoad || len(l.Indices) != 2 || len(l.Buffer.Shape) != 2 {
			return nil, false
		}
		if e.DType() != cdt && cdt != ir.Float32 {
			return nil, false
		}
		return l, true
	}
	x, ok1 := operand(prod.A)
	y, ok2 := operand(prod.B)
	if !ok1 || !ok2 || x.DType() != y.DType() || prod.A.DType() != cdt || prod.B.DType() != cdt {
		return m, false
	}
	switch x.DType() {
	case ir.Float16:
		m.ab = "fp16"
	case ndarray.BFloat16:
		m.ab = "bf16"
	default:
		return m, false
	}
	m.operandDType = x.DType()
	switch {
	case usesExactly(x, m.vi, m.vk) && usesExactly(y, m.vk, m.vj):
		m.a, m.b = x, y
	case usesExactly(y, m.vi, m.vk) && usesExactly(x, m.vk, m.vj):
		m.a, m.b = y, x
	default:
		return m, false
	}
	for _, l := range []*ir.BufferLoad{m.a, m.b} {
		for _, idx := range l.Indices {
			if _, ok := idx.(*ir.Var); !ok {
				return m, false
			}
		}
	}
	return m, true
}

// mmaMatmulRule schedules s, when its first block is a matmul of 16-bit
// float operands (see matchMmaMatmul) and the blocks after it are
// elementwise epilogues over C, for the tensor cores with schedule
// primitives only: a block of WM × WN warps (threadIdx.y, each of 32
// lanes on threadIdx.x) computes a BM × BN tile of C, each warp an
// (16·FM) × (8·FN) part of it as FM × FN tiles of 16×8 float32
// accumulators held in registers across all of k (a "local" cache of C in
// PTX's per-lane layout of mma.m16n8k16's accumulator, MmaLayoutC; a C of
// the operands' dtype accumulates in a float32 cache, rounded once when
// copied back). For each BK values of k the threads copy the block's
// tiles of A and B into shared memory (vector copies of 16 bytes where
// the layout allows; the tiles are not padded or swizzled, so the
// fragment loads meet bank conflicts); then for each 16 of them every
// thread loads its fragments of A and B from shared memory into registers
// in PTX's layouts (MmaLayoutA, MmaLayoutB) and the warp runs FM × FN
// ptx_mma m16n8k16 on them (the fragment intrinsic, MmaFragIntrin).
// Barrier insertion places the __syncthreads(). Each C element's sum runs
// over k in order. The epilogues are inlined into the copy back of the
// accumulators, which each thread does for its own lanes. It returns
// false when s's function is not such a function.
func mmaMatmulRule(s *schedule.Schedule, blocks []*ir.BlockRealize, opts GPUOptions) (bool, error) {
	m, ok := matchMmaMatmul(blocks[0])
	if !ok {
		return false, nil
	}
	inter := map[*ir.Buffer]bool{}
	if root := ir.RootBlock(s.Func().Body); root != nil {
		for _, a := range root.AllocBuffers {
			inter[a] = true
		}
	}
	if readsAny(m.a, inter) || readsAny(m.b, inter) || !elementwiseEpilogues(m.st.Buffer, blocks[1:], []int64{m.M, m.N}, inter) {
		return false, nil
	}
	name := blocks[0].Block.Name
	FM, FN, WM, WN, BK, err := mmaTiles(s, opts, name, m)
	if err != nil {
		return false, err
	}
	ok, err = mmaSchedule(s, name, m, blocks[1:], FM, FN, WM, WN, BK)
	if err != nil {
		return false, fmt.Errorf("tensor-core matmul of block %q: %w", name, err)
	}
	return ok, nil
}

// mmaSchedule applies mmaMatmulRule's primitives to the matmul m of block
// name with its epilogues, for the tiles chosen; false when an epilogue
// cannot be inlined.
func mmaSchedule(s *schedule.Schedule, name string, m mmaMatmul, epilogues []*ir.BlockRealize, FM, FN, WM, WN, BK int64) (bool, error) {
	c, err := s.GetBlock(name)
	if err != nil {
		return false, err
	}
	ls, err := s.GetLoops(c)
	if err != nil {
		return false, err
	}
	is, err := s.Split(ls[0], m.M/(16*FM*WM), WM, FM, 16)
	if err != nil {
		return false, err
	}
	js, err := s.Split(ls[1], m.N/(8*FN*WN), WN, FN, 8)
	if err != nil {
		return false, err
	}
	ks, err := s.Split(ls[2], m.K/BK, BK/16, 16)
	if err != nil {
		return false, err
	}
	by, wm, fm, i16 := is[0], is[1], is[2], is[3]
	bx, wn, fn, j8 := js[0], js[1], js[2], js[3]
	ko, kk := ks[0], ks[1]
	if err := s.Reorder(by, bx, ko, wm, wn, kk, fm, fn, i16, j8, ks[2]); err != nil {
		return false, err
	}
	if err := bindAll(s, []schedule.LoopRV{by, bx}, []string{"blockIdx.y", "blockIdx.x"}); err != nil {
		return false, err
	}

	// The accumulators in mma's layout of C, the epilogues inlined into
	// their copy back.
	var wb schedule.BlockRV
	if m.st.Buffer.DType == ir.Float32 {
		wb, err = s.CacheWrite(c, 0, "local")
	} else {
		wb, err = s.CacheWriteDType(c, 0, "local", ir.Float32)
	}
	if err != nil {
		return false, err
	}
	var later []schedule.BlockRV
	for _, e := range epilogues {
		eb, err := s.GetBlock(e.Block.Name)
		if err != nil {
			return false, err
		}
		if t := s.Copy(); t.ReverseComputeInline(eb) == nil {
			*s = *t
			continue
		}
		later = append(later, eb)
	}
	if err := s.ReverseComputeAt(wb, bx); err != nil {
		return false, err
	}
	if err := s.TransformLayout(c, schedule.BufferIndex{Write: true}, schedule.MmaLayoutC(), nil); err != nil {
		return false, err
	}
	var unroll []schedule.LoopRV
	// The copy back: thread (lane, warp) copies its lane of each of its
	// warp's tiles.
	wl, err := s.GetLoops(wb)
	if err != nil {
		return false, err
	}
	wr, err := s.Split(wl[len(wl)-2], WM, FM, 2, 8)
	if err != nil {
		return false, err
	}
	wc, err := s.Split(wl[len(wl)-1], WN, FN, 4, 2)
	if err != nil {
		return false, err
	}
	if err := s.Reorder(wr[0], wc[0], wr[3], wc[2], wr[1], wc[1], wr[2], wc[3]); err != nil {
		return false, err
	}
	if err := fuseBind(s, wr[0], wc[0], "threadIdx.y"); err != nil {
		return false, err
	}
	if err := fuseBind(s, wr[3], wc[2], "threadIdx.x"); err != nil {
		return false, err
	}
	unroll = append(unroll, wr[1], wc[1], wr[2], wc[3])
	for _, e := range later {
		if err := s.ReverseComputeAt(e, wc[3]); err != nil {
			return false, err
		}
	}
	// The init, before the warps' loops are fused (DecomposeReduction
	// does not take a fused loop between its loop and the block).
	init, err := s.DecomposeReduction(c, ko)
	if err != nil {
		return false, err
	}
	if err := fuseBind(s, wm, wn, "threadIdx.y"); err != nil {
		return false, err
	}
	il, err := s.GetLoops(init)
	if err != nil {
		return false, err
	}
	n := len(il)
	if err := fuseBind(s, il[n-6], il[n-5], "threadIdx.y"); err != nil {
		return false, err
	}
	lanes, err := mmaLanes(s, init, 0)
	if err != nil {
		return false, err
	}
	unroll = append(unroll, il[n-4], il[n-3])
	unroll = append(unroll, lanes...)

	// The tiles of A and B in shared memory, copied by all the threads
	// for each tile of k; each warp's fragments from there for each 16
	// values of k.
	for _, op := range []struct {
		load   *ir.BufferLoad
		layout *schedule.IndexMap // over the operand's (row, column)
		row    *ir.Var
		outer  int // the dimension whose index mod 8 is the lane's group
	}{{m.a, schedule.MmaLayoutA(), m.vi, 0}, {m.b, schedule.MmaLayoutB(), m.vk, 1}} {
		cr, err := s.BlockRealize(c)
		if err != nil {
			return false, err
		}
		at := slices.IndexFunc(cr.Block.Reads, func(rg ir.BufferRegion) bool { return rg.Buffer == op.load.Buffer })
		if at < 0 {
			return false, fmt.Errorf("block %q does not read %q", name, op.load.Buffer.Name)
		}
		fr, err := s.CacheRead(c, at, "local")
		if err != nil {
			return false, err
		}
		sh, err := s.CacheRead(fr, 0, "shared")
		if err != nil {
			return false, err
		}
		if err := s.ComputeAt(fr, kk); err != nil {
			return false, err
		}
		if err := s.ComputeAt(sh, ko); err != nil {
			return false, err
		}
		// The fragments' layout, over the operand's dimensions in the
		// order of its buffer.
		layout, outer := op.layout, op.outer
		if !isVar(op.load.Indices[0], op.row) {
			layout = &schedule.IndexMap{Vars: []*ir.Var{layout.Vars[1], layout.Vars[0]}, Indices: layout.Indices}
			outer = 1 - outer
		}
		if err := s.TransformLayout(fr, schedule.BufferIndex{Write: true}, layout, nil); err != nil {
			return false, err
		}
		lanes, err := mmaLanes(s, fr, outer)
		if err != nil {
			return false, err
		}
		unroll = append(unroll, lanes...)
		// Vector e of the shared tile (row-major) is copied by thread
		// e mod T.
		cols := map[*ir.Var]int64{m.vi: 16 * FM * WM, m.vj: 8 * FN * WN, m.vk: BK}[op.load.Indices[1].(*ir.Var)]
		cl, err := s.GetLoops(sh)
		if err != nil {
			return false, err
		}
		rows, col := cl[len(cl)-2], cl[len(cl)-1]
		var vec []schedule.LoopRV
		if vw := copyVector(op.load, cols); vw > 1 {
			cs, err := s.Split(col, cols/vw, vw)
			if err != nil {
				return false, err
			}
			col, vec = cs[0], cs[1:]
		}
		f, err := s.Fuse(rows, col)
		if err != nil {
			return false, err
		}
		parts, err := s.Split(f, -1, WM*WN, 32)
		if err != nil {
			return false, err
		}
		if err := s.Reorder(parts[1], parts[2], parts[0]); err != nil {
			return false, err
		}
		if err := bindAll(s, parts[1:], []string{"threadIdx.y", "threadIdx.x"}); err != nil {
			return false, err
		}
		unroll = append(unroll, parts[0])
		for _, v := range vec {
			if err := s.Vectorize(v); err != nil {
				return false, err
			}
		}
	}
	if err := s.Tensorize(i16, schedule.MmaFragIntrin(m.ab)); err != nil {
		return false, err
	}
	for _, u := range append(unroll, kk, fm, fn) {
		if err := s.Unroll(u); err != nil {
			return false, err
		}
	}
	return true, nil
}

// fuseBind fuses loops a and b and binds the fused loop to thread axis
// tag.
func fuseBind(s *schedule.Schedule, a, b schedule.LoopRV, tag string) error {
	f, err := s.Fuse(a, b)
	if err != nil {
		return err
	}
	return s.Bind(f, tag)
}

// mmaLanes splits the two innermost loops of block b, a copy over whole
// 16×8 or 16×16 tiles of a buffer in an mma layout, so that the lane of
// the layout is one loop, bound to threadIdx.x: lane = 4·(x % 8) +
// (y % 8) / 2 for x the loop at position outer (0 or 1) of the two and y
// the other. It returns the loops of each lane's elements.
func mmaLanes(s *schedule.Schedule, b schedule.BlockRV, outer int) ([]schedule.LoopRV, error) {
	ls, err := s.GetLoops(b)
	if err != nil {
		return nil, err
	}
	two := ls[len(ls)-2:]
	x, err := s.Split(two[outer], -1, 8)
	if err != nil {
		return nil, err
	}
	y, err := s.Split(two[1-outer], -1, 4, 2)
	if err != nil {
		return nil, err
	}
	if err := s.Reorder(x[1], y[1], x[0], y[0], y[2]); err != nil {
		return nil, err
	}
	if err := fuseBind(s, x[1], y[1], "threadIdx.x"); err != nil {
		return nil, err
	}
	return []schedule.LoopRV{x[0], y[0], y[2]}, nil
}

// mmaRule is the tensor-core rule on the function with its producers
// inlined.
func mmaRule(in *gpuIn) (*scheduled, bool, error) { return onInlinedSchedule(mmaMatmulRule)(in) }

// Limits of the tensor-core rule's choices: up to mmaMaxFrags fragments
// of 16×8 per warp (4 float32 accumulators each per thread) along each
// side and mmaMaxWarpFrags in all, up to mmaMaxWarps warps per block
// along each side and mmaMaxBlockWarps in all, tiles of k of up to
// mmaMaxTileK in gpuMaxShared bytes of shared memory.
const (
	mmaMaxFrags      = 8
	mmaMaxWarpFrags  = 16
	mmaMaxWarps      = 8
	mmaMaxBlockWarps = 8
	mmaMaxTileK      = 64
)

// mmaTiles makes the tensor-core rule's choices for matmul m: each warp's
// fragments (fm × fn), the warps of a block (wm × wn) and the tile of k
// (bk), each among the sizes that divide what is left within the limits
// above; the rule's own picks are the largest divisors up to mmaFragsM,
// mmaFragsN, mmaWarpsM and mmaWarpsN, and mmaTileK where it divides K
// (else 16).
func mmaTiles(s *schedule.Schedule, opts GPUOptions, name string, m mmaMatmul) (fm, fn, wm, wn, bk int64, err error) {
	site := "gpu_mma/" + name + "/"
	if fm, err = opts.choose(s, site+"frags_m", gpuDivisors(m.M/16, mmaMaxFrags), largestDivisor(m.M/16, mmaFragsM)); err != nil {
		return
	}
	var fns []int64
	for _, d := range gpuDivisors(m.N/8, mmaMaxFrags) {
		if fm*d <= mmaMaxWarpFrags {
			fns = append(fns, d)
		}
	}
	if fn, err = opts.choose(s, site+"frags_n", fns, largestIn(fns, mmaFragsN)); err != nil {
		return
	}
	if wm, err = opts.choose(s, site+"warps_m", gpuDivisors(m.M/(16*fm), mmaMaxWarps), largestDivisor(m.M/(16*fm), mmaWarpsM)); err != nil {
		return
	}
	var wns []int64
	for _, d := range gpuDivisors(m.N/(8*fn), mmaMaxWarps) {
		if wm*d <= mmaMaxBlockWarps {
			wns = append(wns, d)
		}
	}
	if wn, err = opts.choose(s, site+"warps_n", wns, largestIn(wns, mmaWarpsN)); err != nil {
		return
	}
	bk0 := int64(16)
	if m.K%mmaTileK == 0 {
		bk0 = mmaTileK
	}
	// 16 always fits: (16·8·8 + 8·8·8)·16 two-byte elements are 48 KB.
	var bks []int64
	for k := int64(16); k <= mmaMaxTileK; k *= 2 {
		if m.K%k == 0 && (16*fm*wm+8*fn*wn)*k*int64(m.operandDType.Size()) <= gpuMaxShared {
			bks = append(bks, k)
		}
	}
	if !slices.Contains(bks, bk0) {
		bk0 = bks[0]
	}
	bk, err = opts.choose(s, site+"tile_k", bks, bk0)
	return
}
