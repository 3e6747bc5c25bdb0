package auto

import (
	"github.com/kiln-ml/kiln/compiler/ir"
)

// gpuTileK is the most of the reduction one shared-memory tile holds.
const gpuTileK = 16

// sharedMatmul gives f, when its first block is a 2-D matmul the matmul
// rule takes (C[i, j] = C[i, j] + A(i, k) * B(k, j), see gpuMatmulTiles)
// and the blocks after it are elementwise epilogues over C (a bias add, an
// activation), a shared-memory tiled schedule: a block of ty × tx threads
// computes a tile of (ty·rt) × (tx·ct) elements of C, each thread an rt ×
// ct register tile whose rows are ty apart and whose columns are tx apart
// (so the threads of a warp read consecutive columns of shared memory and
// store consecutive elements of C). The reduction runs over tiles of bk
// (up to 16) values of k: the threads first copy the block's bm × bk tile
// of the operand indexed by (i, k) and its bk × bn tile of the operand
// indexed by (k, j) from global into shared memory, each thread a strided
// share of the elements (consecutive threads read consecutive addresses),
// then each thread accumulates its register tile (a "local" buffer that
// lives across the tiles) from shared memory. Barrier insertion places the
// __syncthreads() between the copy and the products, and after the
// products before the next tile's copy overwrites what they read. The sum
// for each element of C runs over k in order, as the unscheduled loop's. The
// epilogues are computed by each thread from its accumulators; an
// intermediate only they read is never stored. It returns nil when f is
// not such a function (the register-only matmul rule then applies).
func sharedMatmul(f *ir.PrimFunc, blocks []*ir.BlockRealize) *ir.PrimFunc {
	br := blocks[0]
	m, RT, CT, TY, TX, ok := gpuMatmulTiles(br)
	if !ok {
		return nil
	}
	M, N, K := m.extents[0], m.extents[1], m.extents[2]
	BK := largestDivisor(K, gpuTileK)
	if BK < 2 {
		return nil
	}
	b := br.Block
	vi, vj, vk := b.IterVars[0].Var, b.IterVars[1].Var, b.IterVars[2].Var
	st := b.Body.(*ir.BufferStore)
	init, ok := b.Init.(*ir.BufferStore)
	if !ok || init.Buffer != st.Buffer || len(st.Indices) != 2 || !isVar(st.Indices[0], vi) || len(b.AllocBuffers) > 0 {
		return nil
	}
	if st.Buffer.DType.Lanes != 1 || !isTrue(br.Predicate) {
		return nil
	}
	inter := map[*ir.Buffer]bool{}
	if root := ir.RootBlock(f.Body); root != nil {
		for _, a := range root.AllocBuffers {
			inter[a] = true
		}
	}
	sum := st.Value.(*ir.Binary)
	self := sum.A.(*ir.BufferLoad)
	if len(self.Indices) != 2 || !isVar(self.Indices[0], vi) || !isVar(self.Indices[1], vj) {
		return nil
	}
	if readsAny(sum.B, inter) || readsAny(sum.B, map[*ir.Buffer]bool{st.Buffer: true}) || readsAny(init.Value, map[*ir.Buffer]bool{st.Buffer: true}) {
		return nil
	}
	prod := sum.B.(*ir.Binary)
	aLoad, bLoad := prod.A.(*ir.BufferLoad), prod.B.(*ir.BufferLoad)
	aStaged := usesExactly(aLoad, vi, vk)
	bStaged := usesExactly(bLoad, vk, vj)
	if !aStaged && !bStaged {
		return nil
	}
	BM, BN, T := TY*RT, TX*CT, TY*TX
	i32 := func(v int64) ir.Expr { return ir.NewIntImm(ir.Int32, v) }
	by, bx := ir.NewVar("by", ir.Int32), ir.NewVar("bx", ir.Int32)
	ko := ir.NewVar("ko", ir.Int32)
	cast := func(v *ir.Var, e ir.Expr) ir.Expr { return ir.NewCast(v.Type, e) }
	dt := st.Buffer.DType
	acc := ir.NewBuffer(st.Buffer.Name+"_local", dt, []ir.Expr{i32(RT * CT)}, "local")
	As := ir.NewBuffer(aLoad.Buffer.Name+"_shared", aLoad.Buffer.DType, []ir.Expr{i32(BM), i32(BK)}, "shared")
	Bs := ir.NewBuffer(bLoad.Buffer.Name+"_shared", bLoad.Buffer.DType, []ir.Expr{i32(BK), i32(BN)}, "shared")

	// threads runs body in every thread of the block, as a nest of
	// threadIdx.y over threadIdx.x.
	threads := func(body func(ty, tx ir.Expr) ir.Stmt) ir.Stmt {
		ty, tx := ir.NewVar("ty", ir.Int32), ir.NewVar("tx", ir.Int32)
		return &ir.For{Var: ty, Min: i32(0), Extent: i32(TY), Kind: ir.ForThreadBinding, ThreadTag: "threadIdx.y",
			Body: &ir.For{Var: tx, Min: i32(0), Extent: i32(TX), Kind: ir.ForThreadBinding, ThreadTag: "threadIdx.x", Body: body(ty, tx)}}
	}
	// tile runs body for each element (r, c) of a thread's register tile.
	tile := func(body func(r, c ir.Expr) ir.Stmt) ir.Stmt {
		r, c := ir.NewVar("r", ir.Int32), ir.NewVar("c", ir.Int32)
		return &ir.For{Var: r, Min: i32(0), Extent: i32(RT), Kind: ir.ForUnrolled,
			Body: &ir.For{Var: c, Min: i32(0), Extent: i32(CT), Kind: ir.ForUnrolled, Body: body(r, c)}}
	}
	row := func(r, ty ir.Expr) ir.Expr { return ir.Add(ir.Add(ir.Mul(by, i32(BM)), ir.Mul(r, i32(TY))), ty) }
	col := func(c, tx ir.Expr) ir.Expr { return ir.Add(ir.Add(ir.Mul(bx, i32(BN)), ir.Mul(c, i32(TX))), tx) }
	slot := func(r, c ir.Expr) ir.Expr { return ir.Add(ir.Mul(r, i32(CT)), c) }

	initNest := threads(func(ty, tx ir.Expr) ir.Stmt {
		return tile(func(r, c ir.Expr) ir.Stmt {
			v := ir.SubstituteExpr(init.Value, map[*ir.Var]ir.Expr{vi: cast(vi, row(r, ty)), vj: cast(vj, col(c, tx))})
			return ir.NewBufferStore(acc, v, slot(r, c))
		})
	})

	copyTile := func(dst *ir.Buffer, rows, cols int64, src *ir.BufferLoad, at func(rr, cc ir.Expr) map[*ir.Var]ir.Expr, col *ir.Var) func(ty, tx ir.Expr) ir.Stmt {
		return func(ty, tx ir.Expr) ir.Stmt {
			return tileCopy(dst, rows, cols, T, src, at, col, ir.Add(ir.Mul(ty, i32(TX)), tx))
		}
	}
	kAt := func(kk ir.Expr) ir.Expr { return cast(vk, ir.Add(ir.Mul(ko, i32(BK)), kk)) }
	var copies []func(ty, tx ir.Expr) ir.Stmt
	if aStaged {
		copies = append(copies, copyTile(As, BM, BK, aLoad, func(rr, cc ir.Expr) map[*ir.Var]ir.Expr {
			return map[*ir.Var]ir.Expr{vi: cast(vi, ir.Add(ir.Mul(by, i32(BM)), rr)), vk: kAt(cc)}
		}, vk))
	}
	if bStaged {
		copies = append(copies, copyTile(Bs, BK, BN, bLoad, func(rr, cc ir.Expr) map[*ir.Var]ir.Expr {
			return map[*ir.Var]ir.Expr{vk: kAt(rr), vj: cast(vj, ir.Add(ir.Mul(bx, i32(BN)), cc))}
		}, vj))
	}
	copyNest := threads(func(ty, tx ir.Expr) ir.Stmt {
		var ss []ir.Stmt
		for _, c := range copies {
			ss = append(ss, c(ty, tx))
		}
		return ir.Seq(ss...)
	})
	kk := ir.NewVar("kk", ir.Int32)
	computeNest := threads(func(ty, tx ir.Expr) ir.Stmt {
		body := tile(func(r, c ir.Expr) ir.Stmt {
			loads := map[*ir.BufferLoad]ir.Expr{self: ir.NewBufferLoad(acc, slot(r, c))}
			if aStaged {
				loads[aLoad] = ir.NewBufferLoad(As, ir.Add(ir.Mul(r, i32(TY)), ty), kk)
			}
			if bStaged {
				loads[bLoad] = ir.NewBufferLoad(Bs, kk, ir.Add(ir.Mul(c, i32(TX)), tx))
			}
			v := (&ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
				if l, ok := e.(*ir.BufferLoad); ok {
					if x, found := loads[l]; found {
						return x
					}
				}
				return e
			}}).RewriteExpr(st.Value)
			v = ir.SubstituteExpr(v, map[*ir.Var]ir.Expr{vi: cast(vi, row(r, ty)), vj: cast(vj, col(c, tx)), vk: kAt(kk)})
			return ir.NewBufferStore(acc, v, slot(r, c))
		})
		return &ir.For{Var: kk, Min: i32(0), Extent: i32(BK), Kind: ir.ForSerial, Body: body}
	})

	// The stores of C and of the epilogues, from the accumulators.
	var fail bool
	storeNest := threads(func(ty, tx ir.Expr) ir.Stmt {
		return tile(func(r, c ir.Expr) ir.Stmt {
			out := []ir.Expr{row(r, ty), col(c, tx)}
			values := map[*ir.Buffer]ir.Expr{st.Buffer: ir.NewBufferLoad(acc, slot(r, c))}
			s, ok := matmulStores(st.Buffer, values[st.Buffer], []*ir.Var{vi, vj}, out, blocks[1:], []int64{M, N}, inter)
			fail = fail || !ok
			return s
		})
	})
	if fail {
		return nil
	}
	kernel := ir.Seq(initNest,
		&ir.For{Var: ko, Min: i32(0), Extent: i32(K / BK), Kind: ir.ForSerial, Body: ir.Seq(copyNest, computeNest)},
		storeNest)
	var body ir.Stmt = &ir.Allocate{Buffer: acc, Body: kernel}
	if bStaged {
		body = &ir.Allocate{Buffer: Bs, Body: body}
	}
	if aStaged {
		body = &ir.Allocate{Buffer: As, Body: body}
	}
	body = &ir.For{Var: by, Min: i32(0), Extent: i32(M / BM), Kind: ir.ForThreadBinding, ThreadTag: "blockIdx.y",
		Body: &ir.For{Var: bx, Min: i32(0), Extent: i32(N / BN), Kind: ir.ForThreadBinding, ThreadTag: "blockIdx.x", Body: body}}
	return f.WithBody(ir.NewRootBlock(body))
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

// epilogueIndex is the index an epilogue block (see epilogue) stores at
// for the output element out, in its iteration variables' dtypes.
func epilogueIndex(br *ir.BlockRealize, out []ir.Expr) []ir.Expr {
	idx := make([]ir.Expr, len(out))
	for i, iv := range br.Block.IterVars {
		idx[i] = ir.NewCast(iv.Var.Type, out[i])
	}
	return idx
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
