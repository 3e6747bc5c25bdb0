package auto

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// rowPipeline gives f, when its blocks all run over the same rows and one
// last axis of the same length K (softmax, layer norm: sums and maxima of
// a row, then elementwise work over the row that reads them), a
// cross-thread schedule: one block of T threads (a power of two from 32 to
// 256, at most K) per row. Each reduction of a row (y[rows] = y[rows] + E
// or max(y[rows], E), from a constant init) is summed by the threads
// (thread t takes k = t, t+T…) into shared memory, folded pairwise down to
// 64 and then with warp shuffles, and its total is put in shared memory
// for every thread (barriers between the steps, placed by barrier
// insertion); each elementwise block over the row is computed by the
// threads, k = t, t+T…. Intermediates computed element for element are
// recomputed where they are read (inlined), never stored; a reduction's
// total is read by later blocks only at its own row. It returns nil when
// f is not such a function (at least one reduction is needed).
func rowPipeline(f *ir.PrimFunc) *ir.PrimFunc {
	blocks := topBlocks(f)
	if len(blocks) < 2 {
		return nil
	}
	if _, _, _, _, _, mm := gpuMatmulTiles(blocks[0]); mm {
		return nil
	}
	inter := map[*ir.Buffer]bool{}
	if root := ir.RootBlock(f.Body); root != nil {
		for _, b := range root.AllocBuffers {
			inter[b] = true
		}
	}
	var exts []int64
	type red struct {
		op    ir.BinaryOp
		init  ir.Expr
		term  ir.Expr
		out   *ir.Buffer
		total *ir.Buffer
	}
	type step struct {
		b   *ir.Block
		red *red
		st  *ir.BufferStore
	}
	var steps []step
	reductions := 0
	for _, br := range blocks {
		b := br.Block
		n := len(b.IterVars)
		if n < 2 || len(br.IterValues) != n || !isTrue(br.Predicate) || len(b.AllocBuffers) > 0 {
			return nil
		}
		if exts == nil {
			exts = make([]int64, n)
		} else if len(exts) != n {
			return nil
		}
		isRed := b.Init != nil
		for i, iv := range b.IterVars {
			want := ir.IterSpatial
			if i == n-1 && isRed {
				want = ir.IterReduce
			}
			e, ok := ir.IsConstInt(iv.Dom.Extent)
			if iv.Kind != want || !ok || e < 1 || (exts[i] != 0 && exts[i] != e) {
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
		st, ok := b.Body.(*ir.BufferStore)
		if !ok || st.Buffer.DType.Lanes != 1 || !st.Buffer.DType.IsFloat() {
			return nil
		}
		own := n
		if isRed {
			own = n - 1
		}
		if len(st.Indices) != own {
			return nil
		}
		for i, idx := range st.Indices {
			if !isVar(idx, b.IterVars[i].Var) {
				return nil
			}
		}
		s := step{b: b, st: st}
		if isRed {
			reductions++
			r, ok := reduction(b, st)
			if !ok {
				return nil
			}
			r2 := &red{op: r.op, init: r.init, term: r.term, out: st.Buffer}
			s.red = r2
		}
		steps = append(steps, s)
	}
	n := len(exts)
	K := exts[n-1]
	if reductions == 0 || K < 32 {
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
	rows := make([]ir.Expr, n-1)
	rest := ir.Expr(bx)
	for i := n - 2; i >= 0; i-- {
		if i == 0 {
			rows[i] = rest
		} else {
			rows[i] = ir.FloorMod(rest, i32(exts[i]))
			rest = ir.FloorDiv(rest, i32(exts[i]))
		}
	}
	thread := func(body ir.Stmt) ir.Stmt {
		tv := ir.NewVar("tx", ir.Int32)
		return &ir.For{Var: tv, Min: i32(0), Extent: i32(T), Kind: ir.ForThreadBinding, ThreadTag: "threadIdx.x",
			Body: ir.Substitute(body, map[*ir.Var]ir.Expr{t: tv})}
	}
	// overK runs body for k = ko*T + t < K.
	overK := func(body func(k ir.Expr) ir.Stmt) ir.Stmt {
		ko := ir.NewVar("ko", ir.Int32)
		k := ir.Add(ir.Mul(ko, i32(T)), t)
		s := body(k)
		if K%T != 0 {
			s = &ir.IfThenElse{Cond: ir.LT(k, i32(K)), Then: s}
		}
		return &ir.For{Var: ko, Min: i32(0), Extent: i32((K + T - 1) / T), Kind: ir.ForSerial, Body: s}
	}
	// Loads of earlier results: a total at its own row, an inlined
	// element anywhere.
	totals := map[*ir.Buffer]*ir.Buffer{}
	type elem struct {
		vars []*ir.Var
		val  ir.Expr
	}
	elems := map[*ir.Buffer]elem{}
	var subst func(b *ir.Block, e ir.Expr) (ir.Expr, bool)
	subst = func(b *ir.Block, e ir.Expr) (ir.Expr, bool) {
		good := true
		r := &ir.Rewriter{Expr: func(x ir.Expr) ir.Expr {
			l, ok := x.(*ir.BufferLoad)
			if !ok {
				return x
			}
			if tot, ok := totals[l.Buffer]; ok {
				for i, idx := range l.Indices {
					if i >= n-1 || !isVar(idx, b.IterVars[i].Var) {
						good = false
					}
				}
				return ir.NewBufferLoad(tot, i32(0))
			}
			if el, ok := elems[l.Buffer]; ok {
				m := map[*ir.Var]ir.Expr{}
				for i, v := range el.vars {
					m[v] = l.Indices[i]
				}
				return ir.SubstituteExpr(el.val, m)
			}
			if inter[l.Buffer] {
				good = false // read before it is computed
			}
			return x
		}}
		out := r.RewriteExpr(e)
		return out, good
	}
	at := func(b *ir.Block, e ir.Expr, k ir.Expr) ir.Expr {
		m := map[*ir.Var]ir.Expr{}
		for i, iv := range b.IterVars {
			if i < n-1 {
				m[iv.Var] = ir.NewCast(iv.Var.Type, rows[i])
			} else {
				m[iv.Var] = ir.NewCast(iv.Var.Type, k)
			}
		}
		return ir.SubstituteExpr(e, m)
	}
	var body []ir.Stmt
	var allocs []*ir.Buffer
	var S *ir.Buffer
	for j, s := range steps {
		if s.red == nil {
			val, ok := subst(s.b, s.st.Value)
			if !ok {
				return nil
			}
			vars := make([]*ir.Var, n)
			for i, iv := range s.b.IterVars {
				vars[i] = iv.Var
			}
			elems[s.st.Buffer] = elem{vars: vars, val: val}
			if !inter[s.st.Buffer] {
				b := s.b
				body = append(body, thread(overK(func(k ir.Expr) ir.Stmt {
					idx := append(append([]ir.Expr{}, rows...), k)
					return ir.NewBufferStore(s.st.Buffer, at(b, val, k), idx...)
				})))
			}
			continue
		}
		r := s.red
		term, ok := subst(s.b, r.term)
		if !ok {
			return nil
		}
		dt := s.st.Buffer.DType
		if S == nil {
			S = ir.NewBuffer("partial", dt, []ir.Expr{i32(T)}, "shared")
			allocs = append(allocs, S)
		} else if S.DType != dt {
			return nil
		}
		combine := func(a, b ir.Expr) ir.Expr { return ir.Arith(r.op, a, b) }
		b := s.b
		body = append(body, thread(ir.Seq(
			ir.NewBufferStore(S, r.init, t),
			overK(func(k ir.Expr) ir.Stmt {
				return ir.NewBufferStore(S, combine(ir.NewBufferLoad(S, t), at(b, term, k)), t)
			}),
		)))
		for w := T / 2; w >= 2*gpuWarp; w /= 2 {
			body = append(body, thread(&ir.IfThenElse{Cond: ir.LT(t, i32(w)),
				Then: ir.NewBufferStore(S, combine(ir.NewBufferLoad(S, t), ir.NewBufferLoad(S, ir.Add(t, i32(w)))), t)}))
		}
		lane := ir.FloorMod(t, i32(gpuWarp))
		first := ir.Expr(ir.NewBufferLoad(S, lane))
		if T >= 2*gpuWarp {
			first = combine(first, ir.NewBufferLoad(S, ir.Add(lane, i32(gpuWarp))))
		}
		vars := []*ir.Var{ir.NewVar("v0", dt)}
		for d := int64(gpuWarp / 2); d >= 1; d /= 2 {
			vars = append(vars, ir.NewVar(fmt.Sprintf("v%d", len(vars)), dt))
		}
		tot := ir.NewBuffer(fmt.Sprintf("total%d", j), dt, []ir.Expr{i32(1)}, "shared")
		allocs = append(allocs, tot)
		totals[s.st.Buffer] = tot
		last := vars[len(vars)-1]
		stores := []ir.Stmt{ir.NewBufferStore(tot, last, i32(0))}
		if !inter[s.st.Buffer] {
			stores = append(stores, ir.NewBufferStore(s.st.Buffer, last, rows...))
		}
		var ws ir.Stmt = &ir.IfThenElse{Cond: ir.EQ(t, i32(0)), Then: ir.Seq(stores...)}
		for i := len(vars) - 1; i >= 1; i-- {
			ws = &ir.LetStmt{Var: vars[i], Value: combine(vars[i-1], ir.WarpShuffleDown(vars[i-1], int64(gpuWarp)>>i)), Body: ws}
		}
		body = append(body, thread(&ir.LetStmt{Var: vars[0], Value: first, Body: ws}))
	}
	var kernel ir.Stmt = ir.Seq(body...)
	for i := len(allocs) - 1; i >= 0; i-- {
		kernel = &ir.Allocate{Buffer: allocs[i], Body: kernel}
	}
	return f.WithBody(ir.NewRootBlock(&ir.For{Var: bx, Min: i32(0), Extent: i32(N), Kind: ir.ForThreadBinding, ThreadTag: "blockIdx.x", Body: kernel}))
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
