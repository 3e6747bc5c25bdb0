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

// mmaMatmulRule gives f, when its first block is a matmul of 16-bit float
// operands (see matchMmaMatmul) and the blocks after it are elementwise
// epilogues over C, a tensor-core schedule: a block of warps computes a
// BM × BN tile of C, each warp an (16·FM) × (8·FN) part of it as FM × FN
// tiles of 16×8 float32 accumulators held in registers across all of k.
// For each BK values of k the threads copy the block's BM × BK tile of A
// and BK × BN tile of B into shared memory (vector copies of 16 bytes
// where the layout allows; the tiles are not padded or swizzled, so the
// fragment loads meet bank conflicts); then for each 16
// of them every thread loads its fragments of A and B from shared memory
// (plain loads, in the layout PTX gives mma.m16n8k16's operands) and the
// warp runs FM × FN ptx_mma m16n8k16 (tensor cores, float32
// accumulation). Barrier insertion places the __syncthreads(). Each C
// element's sum runs over k in order; for operands multiplied in their own
// 16-bit dtype it is accumulated in float32 and rounded once at the end.
// The epilogues are computed by each thread from its accumulators. The
// block's threads are one threadIdx.x axis of 32 lanes per warp. It
// returns nil when f is not such a function.
func mmaMatmulRule(s *schedule.Schedule, blocks []*ir.BlockRealize, opts GPUOptions) (*ir.PrimFunc, error) {
	f := s.Func()
	m, ok := matchMmaMatmul(blocks[0])
	if !ok {
		return nil, nil
	}
	inter := map[*ir.Buffer]bool{}
	if root := ir.RootBlock(f.Body); root != nil {
		for _, a := range root.AllocBuffers {
			inter[a] = true
		}
	}
	if readsAny(m.a, inter) || readsAny(m.b, inter) {
		return nil, nil
	}
	FM, FN, WM, WN, BK, err := mmaTiles(s, opts, blocks[0].Block.Name, m)
	if err != nil {
		return nil, err
	}
	BM, BN := 16*FM*WM, 8*FN*WN
	T := 32 * WM * WN
	i32 := func(v int64) ir.Expr { return ir.NewIntImm(ir.Int32, v) }
	cast := func(v *ir.Var, e ir.Expr) ir.Expr { return ir.NewCast(v.Type, e) }
	by, bx, ko := ir.NewVar("by", ir.Int32), ir.NewVar("bx", ir.Int32), ir.NewVar("ko", ir.Int32)
	acc := ir.NewBuffer(m.st.Buffer.Name+"_acc", ir.Float32, []ir.Expr{i32(FM * FN * 4)}, "local")
	As := ir.NewBuffer(m.a.Buffer.Name+"_shared", m.operandDType, []ir.Expr{i32(BM), i32(BK)}, "shared")
	Bs := ir.NewBuffer(m.b.Buffer.Name+"_shared", m.operandDType, []ir.Expr{i32(BK), i32(BN)}, "shared")

	// lane gives the parts of thread tx: its warp's row and column in the
	// block (wm, wn), its group g (lane / 4) and its place t in the group.
	type lane struct{ tx, wm, wn, g, t ir.Expr }
	threads := func(body func(l lane) ir.Stmt) ir.Stmt {
		tx := ir.NewVar("tx", ir.Int32)
		w := ir.FloorDiv(tx, i32(32))
		ln := ir.FloorMod(tx, i32(32))
		l := lane{tx: tx, wm: ir.FloorDiv(w, i32(WN)), wn: ir.FloorMod(w, i32(WN)), g: ir.FloorDiv(ln, i32(4)), t: ir.FloorMod(ln, i32(4))}
		return &ir.For{Var: tx, Min: i32(0), Extent: i32(T), Kind: ir.ForThreadBinding, ThreadTag: "threadIdx.x", Body: body(l)}
	}
	unrolled := func(name string, n int64, body func(v ir.Expr) ir.Stmt) ir.Stmt {
		v := ir.NewVar(name, ir.Int32)
		return &ir.For{Var: v, Min: i32(0), Extent: i32(n), Kind: ir.ForUnrolled, Body: body(v)}
	}
	// accElem runs body for each accumulator of the thread: element r of
	// fragment (fm, fn), with its slot in acc and its row and column in C.
	accElem := func(l lane, body func(slot, row, col ir.Expr) ir.Stmt) ir.Stmt {
		return unrolled("fm", FM, func(fm ir.Expr) ir.Stmt {
			return unrolled("fn", FN, func(fn ir.Expr) ir.Stmt {
				var ss []ir.Stmt
				for r := range int64(4) {
					slot := ir.Add(ir.Mul(ir.Add(ir.Mul(fm, i32(FN)), fn), i32(4)), i32(r))
					row := ir.Add(ir.Add(ir.Add(ir.Mul(by, i32(BM)), ir.Mul(l.wm, i32(16*FM))), ir.Mul(fm, i32(16))), ir.Add(l.g, i32(8*(r/2))))
					col := ir.Add(ir.Add(ir.Add(ir.Mul(bx, i32(BN)), ir.Mul(l.wn, i32(8*FN))), ir.Mul(fn, i32(8))), ir.Add(ir.Mul(l.t, i32(2)), i32(r%2)))
					ss = append(ss, body(slot, row, col))
				}
				return ir.Seq(ss...)
			})
		})
	}

	initNest := threads(func(l lane) ir.Stmt {
		return accElem(l, func(slot, row, col ir.Expr) ir.Stmt {
			v := ir.SubstituteExpr(m.init.Value, map[*ir.Var]ir.Expr{m.vi: cast(m.vi, row), m.vj: cast(m.vj, col)})
			if v.DType() != ir.Float32 {
				v = ir.NewCast(ir.Float32, v)
			}
			return ir.NewBufferStore(acc, v, slot)
		})
	})

	kAt := func(kk ir.Expr) ir.Expr { return cast(m.vk, ir.Add(ir.Mul(ko, i32(BK)), kk)) }
	copyNest := threads(func(l lane) ir.Stmt {
		return ir.Seq(
			tileCopy(As, BM, BK, T, m.a, func(rr, cc ir.Expr) map[*ir.Var]ir.Expr {
				return map[*ir.Var]ir.Expr{m.vi: cast(m.vi, ir.Add(ir.Mul(by, i32(BM)), rr)), m.vk: kAt(cc)}
			}, m.vk, l.tx),
			tileCopy(Bs, BK, BN, T, m.b, func(rr, cc ir.Expr) map[*ir.Var]ir.Expr {
				return map[*ir.Var]ir.Expr{m.vk: kAt(rr), m.vj: cast(m.vj, ir.Add(ir.Mul(bx, i32(BN)), cc))}
			}, m.vj, l.tx))
	})

	computeNest := threads(func(l lane) ir.Stmt {
		af := ir.NewBuffer(m.a.Buffer.Name+"_frag", m.operandDType, []ir.Expr{i32(FM * 8)}, "local")
		bf := ir.NewBuffer(m.b.Buffer.Name+"_frag", m.operandDType, []ir.Expr{i32(FN * 4)}, "local")
		body := unrolled("kk", BK/16, func(kk ir.Expr) ir.Stmt {
			k0 := ir.Mul(kk, i32(16))
			loadA := unrolled("fm", FM, func(fm ir.Expr) ir.Stmt {
				var ss []ir.Stmt
				for i := range int64(8) {
					row := ir.Add(ir.Add(ir.Mul(l.wm, i32(16*FM)), ir.Mul(fm, i32(16))), ir.Add(l.g, i32(8*((i/2)%2))))
					col := ir.Add(k0, ir.Add(ir.Mul(l.t, i32(2)), i32(i%2+8*(i/4))))
					ss = append(ss, ir.NewBufferStore(af, ir.NewBufferLoad(As, row, col), ir.Add(ir.Mul(fm, i32(8)), i32(i))))
				}
				return ir.Seq(ss...)
			})
			loadB := unrolled("fn", FN, func(fn ir.Expr) ir.Stmt {
				var ss []ir.Stmt
				for i := range int64(4) {
					row := ir.Add(k0, ir.Add(ir.Mul(l.t, i32(2)), i32(i%2+8*(i/2))))
					col := ir.Add(ir.Add(ir.Mul(l.wn, i32(8*FN)), ir.Mul(fn, i32(8))), l.g)
					ss = append(ss, ir.NewBufferStore(bf, ir.NewBufferLoad(Bs, row, col), ir.Add(ir.Mul(fn, i32(4)), i32(i))))
				}
				return ir.Seq(ss...)
			})
			mma := unrolled("fm", FM, func(fm ir.Expr) ir.Stmt {
				return unrolled("fn", FN, func(fn ir.Expr) ir.Stmt {
					return &ir.Evaluate{Value: ir.PtxMma(m.ab, af.Data, ir.Mul(fm, i32(8)), bf.Data, ir.Mul(fn, i32(4)),
						acc.Data, ir.Mul(ir.Add(ir.Mul(fm, i32(FN)), fn), i32(4)))}
				})
			})
			return ir.Seq(loadA, loadB, mma)
		})
		return &ir.Allocate{Buffer: af, Body: &ir.Allocate{Buffer: bf, Body: body}}
	})

	var fail bool
	storeNest := threads(func(l lane) ir.Stmt {
		return accElem(l, func(slot, row, col ir.Expr) ir.Stmt {
			c := ir.Expr(ir.NewBufferLoad(acc, slot))
			if m.st.Buffer.DType != ir.Float32 {
				c = ir.NewCast(m.st.Buffer.DType, c)
			}
			s, ok := matmulStores(m.st.Buffer, c, []*ir.Var{m.vi, m.vj}, []ir.Expr{row, col}, blocks[1:], []int64{m.M, m.N}, inter)
			fail = fail || !ok
			return s
		})
	})
	if fail {
		return nil, nil
	}
	kernel := ir.Seq(initNest,
		&ir.For{Var: ko, Min: i32(0), Extent: i32(m.K / BK), Kind: ir.ForSerial, Body: ir.Seq(copyNest, computeNest)},
		storeNest)
	var body ir.Stmt = &ir.Allocate{Buffer: As, Body: &ir.Allocate{Buffer: Bs, Body: &ir.Allocate{Buffer: acc, Body: kernel}}}
	body = &ir.For{Var: by, Min: i32(0), Extent: i32(m.M / BM), Kind: ir.ForThreadBinding, ThreadTag: "blockIdx.y",
		Body: &ir.For{Var: bx, Min: i32(0), Extent: i32(m.N / BN), Kind: ir.ForThreadBinding, ThreadTag: "blockIdx.x", Body: body}}
	return f.WithBody(ir.NewRootBlock(body)), nil
}

// mmaRule is the tensor-core rule on the function with its producers
// inlined; its choices are recorded on a copy of that schedule, the loops
// being built by hand.
func mmaRule(in *gpuIn) (*scheduled, bool, error) {
	blocks, err := in.prepare()
	if err != nil {
		return nil, false, err
	}
	g, err := mmaMatmulRule(in.inlined.Copy(), blocks, in.opts)
	if err != nil {
		return nil, false, fmt.Errorf("tensor-core matmul of block %q: %w", blocks[0].Block.Name, err)
	}
	return found(g)
}

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

// matmulStores returns the stores of one element of a matmul's output c
// (value v, at out, in the dtypes of the iteration variables ivs) and of
// its elementwise epilogues (see epilogue) over an M × N output (exts),
// except those of intermediates (inter), which are never stored; ok is
// false when an epilogue is not elementwise or nothing would be stored.
func matmulStores(c *ir.Buffer, v ir.Expr, ivs []*ir.Var, out []ir.Expr, epilogues []*ir.BlockRealize, exts []int64, inter map[*ir.Buffer]bool) (ir.Stmt, bool) {
	values := map[*ir.Buffer]ir.Expr{c: v}
	var stores []ir.Stmt
	if !inter[c] {
		stores = append(stores, ir.NewBufferStore(c, v, ir.NewCast(ivs[0].Type, out[0]), ir.NewCast(ivs[1].Type, out[1])))
	}
	for _, e := range epilogues {
		buf, ev, ok := epilogue(e, exts, out, values)
		if !ok {
			return &ir.Evaluate{Value: ir.NewIntImm(ir.Int32, 0)}, false
		}
		values[buf] = ev
		if !inter[buf] {
			stores = append(stores, ir.NewBufferStore(buf, ev, epilogueIndex(e, out)...))
		}
	}
	return ir.Seq(stores...), len(stores) > 0
}

// tileCopy returns thread's share (thread is its index among the T threads
// of the block) of the copy of a rows × cols tile into dst[rr, cc] from
// src at the iteration variables at(rr, cc): vector e of vw elements of
// the tile (row-major) is copied by thread e mod T, as one vector load and
// store when vw > 1 (see copyVector).
func tileCopy(dst *ir.Buffer, rows, cols, T int64, src *ir.BufferLoad, at func(rr, cc ir.Expr) map[*ir.Var]ir.Expr, col *ir.Var, thread ir.Expr) ir.Stmt {
	i32 := func(v int64) ir.Expr { return ir.NewIntImm(ir.Int32, v) }
	vw := int64(1)
	if len(src.Indices) == 2 && isVar(src.Indices[1], col) {
		vw = copyVector(src, cols)
	}
	it, v := ir.NewVar("it", ir.Int32), ir.NewVar("v", ir.Int32)
	e := ir.Add(ir.Mul(it, i32(T)), thread)
	rr, cc := ir.FloorDiv(e, i32(cols/vw)), ir.Mul(ir.FloorMod(e, i32(cols/vw)), i32(vw))
	if vw > 1 {
		cc = ir.Add(cc, v)
	}
	var s ir.Stmt = ir.NewBufferStore(dst, ir.SubstituteExpr(src, at(rr, cc)), rr, cc)
	if vw > 1 {
		s = &ir.For{Var: v, Min: i32(0), Extent: i32(vw), Kind: ir.ForVectorized, Body: s}
	}
	n := rows * cols / vw
	if n%T != 0 {
		s = &ir.IfThenElse{Cond: ir.LT(e, i32(n)), Then: s}
	}
	return &ir.For{Var: it, Min: i32(0), Extent: i32((n + T - 1) / T), Kind: ir.ForUnrolled, Body: s}
}

// epilogueIndex is the index an epilogue block (see epilogue) stores at
// for the output element out, in its iteration variables' dtypes.
func epilogueIndex(br *ir.BlockRealize, out []ir.Expr) []ir.Expr {
	idx := make([]ir.Expr, len(out))
	for i, iv := range br.Block.IterVars {
		idx[i] = ir.NewCast(iv.Var.Type, out[i])
	}
	return idx
}

// epilogue returns the buffer block br stores and the value it stores at
// out, when br is a spatial block over the same extents whose loads of
// the buffers in values are at its own iteration variables; the loads are
// replaced by their values and the variables by out.
func epilogue(br *ir.BlockRealize, exts []int64, out []ir.Expr, values map[*ir.Buffer]ir.Expr) (*ir.Buffer, ir.Expr, bool) {
	b := br.Block
	if b.Init != nil || len(b.IterVars) != len(exts) || len(b.AllocBuffers) > 0 || !isTrue(br.Predicate) || len(br.IterValues) != len(exts) {
		return nil, nil, false
	}
	vmap := map[*ir.Var]ir.Expr{}
	for i, iv := range b.IterVars {
		e, ok := ir.IsConstInt(iv.Dom.Extent)
		if iv.Kind != ir.IterSpatial || !ok || e != exts[i] {
			return nil, nil, false
		}
		if _, ok := br.IterValues[i].(*ir.Var); !ok {
			return nil, nil, false
		}
		vmap[iv.Var] = ir.NewCast(iv.Var.Type, out[i])
	}
	st, ok := b.Body.(*ir.BufferStore)
	if !ok || len(st.Indices) != len(exts) {
		return nil, nil, false
	}
	own := func(idx []ir.Expr) bool { return ownIndices(b, idx) }
	if !own(st.Indices) {
		return nil, nil, false
	}
	good := true
	r := &ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
		l, ok := e.(*ir.BufferLoad)
		if !ok {
			return e
		}
		v, known := values[l.Buffer]
		if !known {
			return e
		}
		if !own(l.Indices) {
			good = false
		}
		return v
	}}
	// Replace the loads first (their indices are the iteration
	// variables), then the variables.
	val := r.RewriteExpr(st.Value)
	if !good {
		return nil, nil, false
	}
	return st.Buffer, ir.SubstituteExpr(val, vmap), true
}
