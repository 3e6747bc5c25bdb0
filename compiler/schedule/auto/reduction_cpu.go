package auto

import (
	"github.com/kiln-ml/kiln/compiler/ir"
)

// vectorRows rewrites each row reduction of f that the generic rule
// left serial so that its inner loop runs on vectors: a block
// y[rows] = y[rows] + E(rows, k) (or max(y, E)) from a constant init,
// whose one reduction variable k is bound directly to the innermost
// serial loop of constant extent K, a multiple of L lanes (L = the
// vector's bytes over y's element size). The loop over k becomes
//
//	partial[0:L] = init                          (vectorized)
//	for ko in K/L: partial[0:L] op= E(rows, ko*L + 0:L)   (vectorized)
//	y[rows] = init; for l in L: y[rows] op= partial[l]
//
// with partial a local buffer of L lanes. A sum is added in another
// order than the serial loop's (L partial sums), so results differ from
// it by rounding; a maximum is the same. The block becomes plain loops
// (it is scheduled: nothing schedules it again). Reductions whose E
// does not vectorize (a math call on k) still gain the L independent
// chains, which the C compiler overlaps.
func vectorRows(f *ir.PrimFunc, vectorBytes int64) (*ir.PrimFunc, bool) {
	changed := false
	r := &ir.Rewriter{Stmt: func(s ir.Stmt) ir.Stmt {
		fr, ok := s.(*ir.For)
		if !ok {
			return s
		}
		if out, ok := vectorRow(fr, vectorBytes); ok {
			changed = true
			return out
		}
		return s
	}}
	body := r.RewriteStmt(f.Body)
	if !changed {
		return f, false
	}
	return f.WithBody(body), true
}

// vectorRow rewrites loop fr when it is the reduction loop of a row
// reduction vectorRows takes.
func vectorRow(fr *ir.For, vectorBytes int64) (ir.Stmt, bool) {
	br, ok := fr.Body.(*ir.BlockRealize)
	if !ok || fr.Kind != ir.ForSerial || br.Block == nil || br.Block.Init == nil || !isTrue(br.Predicate) {
		return nil, false
	}
	b := br.Block
	n := len(b.IterVars)
	if n < 2 || len(br.IterValues) != n || len(b.AllocBuffers) > 0 || !isVar(br.IterValues[n-1], fr.Var) {
		return nil, false
	}
	for i, iv := range b.IterVars {
		if (iv.Kind == ir.IterReduce) != (i == n-1) {
			return nil, false
		}
	}
	st, ok := b.Body.(*ir.BufferStore)
	if !ok {
		return nil, false
	}
	red, ok := reduction(b, st)
	if !ok {
		return nil, false
	}
	K, ok := ir.IsConstInt(fr.Extent)
	size := int64(st.Buffer.DType.Size())
	if m, isConst := ir.IsConstInt(fr.Min); !ok || !isConst || m != 0 || size <= 0 || st.Buffer.DType.Lanes != 1 {
		return nil, false
	}
	L := vectorBytes / size
	if L < 2 || L&(L-1) != 0 || K%L != 0 || K < 2*L {
		return nil, false
	}
	kt := fr.Var.Type
	ko := ir.NewVar(fr.Var.Name+"_o", kt)
	l0 := ir.NewVar(fr.Var.Name+"_i", kt)
	l := ir.NewVar(fr.Var.Name+"_l", kt)
	l2 := ir.NewVar(fr.Var.Name+"_r", kt)
	bind := map[*ir.Var]ir.Expr{}
	for i, iv := range b.IterVars[:n-1] {
		bind[iv.Var] = br.IterValues[i]
	}
	bind[b.IterVars[n-1].Var] = ir.Add(ir.Mul(ko, ir.NewIntImm(kt, L)), l)
	term := ir.SubstituteExpr(red.term, bind)
	rows := make([]ir.Expr, len(st.Indices))
	for i, e := range st.Indices {
		rows[i] = ir.SubstituteExpr(e, bind)
	}
	partial := ir.NewBuffer(st.Buffer.Name+"_partial", st.Buffer.DType, []ir.Expr{ir.NewIntImm(kt, L)}, "local")
	zero, lanes := ir.NewIntImm(kt, 0), ir.NewIntImm(kt, L)
	combine := func(a, b ir.Expr) ir.Expr { return ir.NewBinary(red.op, a, b) }
	body := ir.Seq(
		ir.NewFor(l0, zero, lanes, ir.ForVectorized, ir.NewBufferStore(partial, red.init, l0)),
		ir.NewFor(ko, zero, ir.NewIntImm(kt, K/L), ir.ForSerial,
			ir.NewFor(l, zero, lanes, ir.ForVectorized,
				ir.NewBufferStore(partial, combine(ir.NewBufferLoad(partial, l), term), l))),
		ir.NewBufferStore(st.Buffer, red.init, rows...),
		ir.NewFor(l2, zero, lanes, ir.ForSerial,
			ir.NewBufferStore(st.Buffer, combine(ir.NewBufferLoad(st.Buffer, rows...), ir.NewBufferLoad(partial, l2)), rows...)),
	)
	return &ir.Allocate{Buffer: partial, Body: body}, true
}
