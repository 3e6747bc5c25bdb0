package auto

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// gpuReduceThreads is the most threads the row-reduction rule gives one
// row; gpuReduceMinK is the shortest reduction it takes.
const (
	gpuReduceThreads = 256
	gpuReduceMinK    = 64
	gpuWarp          = 32
)

// rowReduction gives f, when its one block is a sum over one reduction
// loop into an output indexed by its spatial iteration variables
// (y[i…] = y[i…] + E(i…, k), initialized to 0: a GEMV, a row sum), a
// cross-thread schedule: one block of T threads (a power of two up to
// 256) per output element; thread t sums E over k = t, t+T, t+2T… into
// shared memory, then the block adds the partial sums pairwise through
// shared memory down to 64 (barriers between the steps, placed by barrier
// insertion), and each warp adds the last 64 with warp shuffles
// (tvm_warp_shuffle_down: five steps, no barrier, no shared memory; every
// lane of every warp takes part, so no shuffle is in divergent code);
// thread 0 stores the total. The sum's order is not the serial loop's, so results
// differ from it by rounding. Spatial blocks after the sum that read it
// (and each other) element for element, a bias add and an activation,
// are computed by thread 0 from the total; intermediates only they read
// are never stored. It returns nil when f is not such a function, or is a
// matmul the matmul or tensor-core rule takes.
func rowReduction(f *ir.PrimFunc) *ir.PrimFunc {
	blocks := topBlocks(f)
	if len(blocks) == 0 {
		return nil
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
		return nil // the matmul rule's
	}
	if _, mm := matchMmaMatmul(br); mm {
		return nil // the tensor-core rule's
	}
	b := br.Block
	n := len(b.IterVars)
	if n < 2 || b.Init == nil || len(br.IterValues) != n || !isTrue(br.Predicate) || len(b.AllocBuffers) > 0 {
		return nil
	}
	exts := make([]int64, n)
	for i, iv := range b.IterVars {
		want := ir.IterSpatial
		if i == n-1 {
			want = ir.IterReduce
		}
		e, ok := ir.IsConstInt(iv.Dom.Extent)
		if iv.Kind != want || !ok || e < 1 {
			return nil
		}
		if m, ok := ir.IsConstInt(iv.Dom.Min); !ok || m != 0 {
			return nil
		}
		if _, ok := br.IterValues[i].(*ir.Var); !ok {
			return nil
		}
		exts[i] = e
	}
	K := exts[n-1]
	if K < gpuReduceMinK {
		return nil
	}
	// The body: y[i…] = y[i…] + E, with y indexed by the spatial
	// variables in order; the init: y[i…] = 0.
	st, ok := b.Body.(*ir.BufferStore)
	if !ok || len(st.Indices) != n-1 || st.Buffer.DType.Lanes != 1 || !st.Buffer.DType.IsFloat() {
		return nil
	}
	for i, idx := range st.Indices {
		if !isVar(idx, b.IterVars[i].Var) {
			return nil
		}
	}
	sum, ok := st.Value.(*ir.Binary)
	if !ok || sum.Op != ir.OpAdd {
		return nil
	}
	self, ok := sum.A.(*ir.BufferLoad)
	if !ok || self.Buffer != st.Buffer || len(self.Indices) != n-1 {
		return nil
	}
	for i, idx := range self.Indices {
		if !isVar(idx, b.IterVars[i].Var) {
			return nil
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
		return nil
	}
	if z, ok := init.Value.(*ir.FloatImm); !ok || z.Value != 0 {
		return nil
	}
	N := int64(1)
	for _, e := range exts[:n-1] {
		N *= e
	}
	if N > 1<<31-1 {
		return nil
	}
	T := int64(gpuReduceThreads)
	for T > K {
		T /= 2
	}

	i32 := func(v int64) ir.Expr { return ir.NewIntImm(ir.Int32, v) }
	bx := ir.NewVar("bx", ir.Int32)
	t := ir.NewVar("tx", ir.Int32)
	kk := ir.NewVar("ko", ir.Int32)
	dt := st.Buffer.DType
	S := ir.NewBuffer("partial", dt, []ir.Expr{i32(T)}, "shared")
	// The spatial variables from bx (row-major), k from ko and tx.
	vmap := map[*ir.Var]ir.Expr{}
	rest := ir.Expr(bx)
	for i := n - 2; i >= 0; i-- {
		v := b.IterVars[i].Var
		if i == 0 {
			vmap[v] = ir.NewCast(v.Type, rest)
		} else {
			vmap[v] = ir.NewCast(v.Type, ir.FloorMod(rest, i32(exts[i])))
			rest = ir.FloorDiv(rest, i32(exts[i]))
		}
	}
	k := ir.Add(ir.Mul(kk, i32(T)), t)
	vmap[b.IterVars[n-1].Var] = ir.NewCast(b.IterVars[n-1].Var.Type, k)
	zero := ir.NewFloatImm(dt, 0)
	acc := ir.Stmt(ir.NewBufferStore(S, ir.Add(ir.NewBufferLoad(S, t), ir.SubstituteExpr(term, vmap)), t))
	if K%T != 0 {
		acc = &ir.IfThenElse{Cond: ir.LT(k, i32(K)), Then: acc}
	}
	thread := func(body ir.Stmt) ir.Stmt {
		tv := ir.NewVar("tx", ir.Int32)
		return &ir.For{Var: tv, Min: i32(0), Extent: i32(T), Kind: ir.ForThreadBinding, ThreadTag: "threadIdx.x",
			Body: ir.Substitute(body, map[*ir.Var]ir.Expr{t: tv})}
	}
	steps := []ir.Stmt{thread(ir.Seq(
		ir.NewBufferStore(S, zero, t),
		&ir.For{Var: kk, Min: i32(0), Extent: i32((K + T - 1) / T), Kind: ir.ForSerial, Body: acc},
	))}
	for s := T / 2; s >= 2*gpuWarp; s /= 2 {
		steps = append(steps, thread(&ir.IfThenElse{Cond: ir.LT(t, i32(s)),
			Then: ir.NewBufferStore(S, ir.Add(ir.NewBufferLoad(S, t), ir.NewBufferLoad(S, ir.Add(t, i32(s)))), t)}))
	}
	// The last 64 partial sums: every warp adds S[l] and S[l+32] for its
	// lanes l and folds them with shuffles (all lanes of all warps take
	// part, so no shuffle is in divergent code); warp 0's lane 0 has the
	// total.
	lanes := ir.FloorMod(t, i32(gpuWarp))
	vars := []*ir.Var{ir.NewVar("v0", dt)}
	for d := int64(gpuWarp / 2); d >= 1; d /= 2 {
		vars = append(vars, ir.NewVar(fmt.Sprintf("v%d", len(vars)), dt))
	}
	total := vars[len(vars)-1]
	warpSum := func(rest ir.Stmt) ir.Stmt {
		body := rest
		for i := len(vars) - 1; i >= 1; i-- {
			d := int64(gpuWarp) >> i
			body = &ir.LetStmt{Var: vars[i], Value: ir.Add(vars[i-1], ir.WarpShuffleDown(vars[i-1], d)), Body: body}
		}
		return &ir.LetStmt{Var: vars[0], Value: ir.Add(ir.NewBufferLoad(S, lanes), ir.NewBufferLoad(S, ir.Add(lanes, i32(gpuWarp)))), Body: body}
	}
	outIdx := make([]ir.Expr, n-1)
	for i := range outIdx {
		outIdx[i] = vmap[b.IterVars[i].Var]
	}
	// Thread 0 stores the total and computes the epilogues from it.
	values := map[*ir.Buffer]ir.Expr{st.Buffer: total}
	var stores []ir.Stmt
	if !inter[st.Buffer] {
		stores = append(stores, ir.NewBufferStore(st.Buffer, values[st.Buffer], outIdx...))
	}
	for _, e := range blocks[1:] {
		buf, v, ok := epilogue(e, exts[:n-1], outIdx, values)
		if !ok {
			return nil
		}
		values[buf] = v
		if !inter[buf] {
			stores = append(stores, ir.NewBufferStore(buf, v, outIdx...))
		}
	}
	if len(stores) == 0 {
		return nil
	}
	steps = append(steps, thread(warpSum(&ir.IfThenElse{Cond: ir.EQ(t, i32(0)), Then: ir.Seq(stores...)})))
	body := &ir.For{Var: bx, Min: i32(0), Extent: i32(N), Kind: ir.ForThreadBinding, ThreadTag: "blockIdx.x",
		Body: &ir.Allocate{Buffer: S, Body: ir.Seq(steps...)}}
	return f.WithBody(ir.NewRootBlock(body))
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
	own := func(idx []ir.Expr) bool {
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
