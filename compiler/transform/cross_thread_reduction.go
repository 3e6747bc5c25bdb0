package transform

import (
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// crossThreadWarp is the number of lanes of a warp, over which the last
// steps of a cross-thread reduction shuffle.
const crossThreadWarp = 32

// LowerCrossThreadReduction lowers each cross-thread reduction of f (TVM's
// LowerCrossThreadReduction and LowerThreadAllreduce): a reduction block
// y[…] = op(y[…], E) (op +, min or max, with an init) whose one reduction
// iteration variable is bound to the variable of the threadIdx.x loop
// right around it, of T threads (a power of two from 32 to 1024). The
// loop becomes: each thread t stores E at t into a "shared" buffer of T
// elements; the threads fold it pairwise (t < w takes t + w) down to 64;
// every warp combines elements lane and lane + 32 and folds them with
// five warp shuffles (tvm_warp_shuffle_down, every lane taking part);
// thread 0 stores op(init, total) into y, or, when y is "local" (each
// thread's own), puts the total in shared memory, from which every thread
// stores op(init, total) into its y. Barrier insertion places the
// barriers between the steps. The block's other iteration variables take
// their bound values. A reduction over a threadIdx loop that is not of
// this form is an error naming the block: it would be computed by every
// thread in turn, which no GPU does.
func LowerCrossThreadReduction(f *ir.PrimFunc) (*ir.PrimFunc, error) {
	threadIdx := map[*ir.Var]*ir.For{}
	var err error
	r := &ir.Rewriter{}
	r.PreStmt = func(s ir.Stmt) (ir.Stmt, bool) {
		l, ok := s.(*ir.For)
		if !ok || err != nil {
			return nil, false
		}
		if l.Kind == ir.ForThreadBinding && strings.HasPrefix(l.ThreadTag, "threadIdx.") {
			threadIdx[l.Var] = l
			defer delete(threadIdx, l.Var)
			if br, ok := l.Body.(*ir.BlockRealize); ok {
				if v := crossThreadVar(br, threadIdx); v != nil {
					if v != l.Var {
						err = fmt.Errorf("lower_cross_thread_reduction: block %q reduces over threadIdx loop %q, which is not the loop right around it", br.Block.Name, v.Name)
						return s, true
					}
					var out ir.Stmt
					out, err = allreduce(l, br)
					return out, true
				}
			}
		}
		n := *l
		n.Body = r.RewriteStmt(l.Body)
		return &n, true
	}
	r.Stmt = func(s ir.Stmt) ir.Stmt {
		if br, ok := s.(*ir.BlockRealize); ok && err == nil {
			if v := crossThreadVar(br, threadIdx); v != nil {
				err = fmt.Errorf("lower_cross_thread_reduction: block %q reduces over threadIdx loop %q, which is not the loop right around it", br.Block.Name, v.Name)
			}
		}
		return s
	}
	body := r.RewriteStmt(f.Body)
	if err != nil {
		return nil, err
	}
	return f.WithBody(body), nil
}

// crossThreadVar returns the threadIdx loop variable (of threads) that a
// reduction iteration variable of br is bound with, or nil.
func crossThreadVar(br *ir.BlockRealize, threads map[*ir.Var]*ir.For) *ir.Var {
	for i, iv := range br.Block.IterVars {
		if iv.Kind != ir.IterReduce || i >= len(br.IterValues) {
			continue
		}
		var found *ir.Var
		ir.Visit(br.IterValues[i], func(n ir.Node) bool {
			if v, ok := n.(*ir.Var); ok && threads[v] != nil {
				found = v
			}
			return found == nil
		})
		if found != nil {
			return found
		}
	}
	return nil
}

// allreduce lowers the cross-thread reduction block br over threadIdx.x
// loop l.
func allreduce(l *ir.For, br *ir.BlockRealize) (ir.Stmt, error) {
	b := br.Block
	fail := func(format string, args ...any) (ir.Stmt, error) {
		return nil, fmt.Errorf("lower_cross_thread_reduction: block %q over threadIdx loop %q: %s", b.Name, l.Var.Name, fmt.Sprintf(format, args...))
	}
	T, ok := ir.IsConstInt(l.Extent)
	if l.ThreadTag != "threadIdx.x" || !ok || T < crossThreadWarp || T > 1024 || T&(T-1) != 0 {
		return fail("want a threadIdx.x loop of a power of two from %d to 1024 threads, have %s of %s", crossThreadWarp, l.ThreadTag, l.Extent)
	}
	if m, ok := ir.IsConstInt(l.Min); !ok || m != 0 {
		return fail("the loop does not start at 0")
	}
	if c, ok := ir.IsConstInt(br.Predicate); !ok || c == 0 {
		return fail("the block has a predicate")
	}
	st, ok := b.Body.(*ir.BufferStore)
	init, ok2 := b.Init.(*ir.BufferStore)
	if !ok || !ok2 || init.Buffer != st.Buffer || len(b.AllocBuffers) > 0 {
		return fail("want a block that stores one buffer, with an init that stores it")
	}
	bin, ok := st.Value.(*ir.Binary)
	if !ok || (bin.Op != ir.OpAdd && bin.Op != ir.OpMax && bin.Op != ir.OpMin) {
		return fail("want y = y + E, max(y, E) or min(y, E)")
	}
	self, ok := bin.A.(*ir.BufferLoad)
	if !ok || self.Buffer != st.Buffer || !sameIndices(self.Indices, st.Indices) || !sameIndices(init.Indices, st.Indices) || loads(bin.B, st.Buffer) || loads(init.Value, st.Buffer) {
		return fail("want y = y + E, max(y, E) or min(y, E), E not reading y, with the init storing y at the same element")
	}
	nred := 0
	for _, iv := range b.IterVars {
		if iv.Kind == ir.IterReduce {
			nred++
		}
	}
	if nred != 1 {
		return fail("the block has %d reduction iteration variables, want 1", nred)
	}
	// The values at thread t: the iteration variables bound, l's
	// variable replaced by t.
	at := func(e ir.Expr, t *ir.Var) ir.Expr {
		m := map[*ir.Var]ir.Expr{}
		for i, iv := range b.IterVars {
			m[iv.Var] = ir.SubstituteExpr(br.IterValues[i], map[*ir.Var]ir.Expr{l.Var: t})
		}
		return ir.SubstituteExpr(e, m)
	}
	op := func(x, y ir.Expr) ir.Expr { return ir.Arith(bin.Op, x, y) }
	dt := st.Buffer.DType
	typ := l.Var.Type
	c := func(v int64) ir.Expr { return ir.NewIntImm(typ, v) }
	red := ir.NewBuffer("red_buf", dt, []ir.Expr{c(T)}, "shared")
	thread := func(body func(t *ir.Var) ir.Stmt) ir.Stmt {
		t := ir.NewVar(l.Var.Name, typ)
		n := *l
		n.Var, n.Body = t, body(t)
		return &n
	}
	// A "local" y is each thread's own: every thread gets the total,
	// through shared memory.
	var bcast *ir.Buffer
	if st.Buffer.StorageScope() == "local" {
		bcast = ir.NewBuffer("red_total", dt, []ir.Expr{c(1)}, "shared")
	}
	steps := []ir.Stmt{thread(func(t *ir.Var) ir.Stmt { return ir.NewBufferStore(red, at(bin.B, t), t) })}
	for w := T / 2; w >= 2*crossThreadWarp; w /= 2 {
		steps = append(steps, thread(func(t *ir.Var) ir.Stmt {
			return &ir.IfThenElse{Cond: ir.LT(t, c(w)), Then: ir.NewBufferStore(red, op(ir.NewBufferLoad(red, t), ir.NewBufferLoad(red, ir.Add(t, c(w)))), t)}
		}))
	}
	steps = append(steps, thread(func(t *ir.Var) ir.Stmt {
		lane := ir.FloorMod(t, c(crossThreadWarp))
		first := ir.Expr(ir.NewBufferLoad(red, lane))
		if T >= 2*crossThreadWarp {
			first = op(first, ir.NewBufferLoad(red, ir.Add(lane, c(crossThreadWarp))))
		}
		vars := []*ir.Var{ir.NewVar("red0", dt)}
		for d := int64(crossThreadWarp / 2); d >= 1; d /= 2 {
			vars = append(vars, ir.NewVar(fmt.Sprintf("red%d", len(vars)), dt))
		}
		total := vars[len(vars)-1]
		idx := make([]ir.Expr, len(st.Indices))
		for i, x := range st.Indices {
			idx[i] = at(x, t)
		}
		var body ir.Stmt = &ir.IfThenElse{Cond: ir.EQ(t, c(0)), Then: ir.NewBufferStore(st.Buffer, op(at(init.Value, t), total), idx...)}
		if bcast != nil {
			body = &ir.IfThenElse{Cond: ir.EQ(t, c(0)), Then: ir.NewBufferStore(bcast, total, c(0))}
		}
		for i := len(vars) - 1; i >= 1; i-- {
			body = &ir.LetStmt{Var: vars[i], Value: op(vars[i-1], ir.WarpShuffleDown(vars[i-1], int64(crossThreadWarp)>>i)), Body: body}
		}
		return &ir.LetStmt{Var: vars[0], Value: first, Body: body}
	}))
	if bcast != nil {
		steps = append(steps, thread(func(t *ir.Var) ir.Stmt {
			idx := make([]ir.Expr, len(st.Indices))
			for i, x := range st.Indices {
				idx[i] = at(x, t)
			}
			return ir.NewBufferStore(st.Buffer, op(at(init.Value, t), ir.NewBufferLoad(bcast, c(0))), idx...)
		}))
		return &ir.Allocate{Buffer: red, Body: &ir.Allocate{Buffer: bcast, Body: ir.Seq(steps...)}}, nil
	}
	return &ir.Allocate{Buffer: red, Body: ir.Seq(steps...)}, nil
}

// sameIndices reports structurally equal index lists.
func sameIndices(a, b []ir.Expr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !ir.StructuralEqual(a[i], b[i]) {
			return false
		}
	}
	return true
}

// loads reports whether e loads buffer b.
func loads(e ir.Expr, b *ir.Buffer) bool {
	found := false
	ir.Visit(e, func(n ir.Node) bool {
		if l, ok := n.(*ir.BufferLoad); ok && l.Buffer == b {
			found = true
		}
		return !found
	})
	return found
}
