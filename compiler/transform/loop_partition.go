package transform

import (
	"slices"

	"github.com/kiln-ml/kiln/compiler/arith"
	"github.com/kiln-ml/kiln/compiler/ir"
)

// AttrLoopPartitionHint is the loop annotation (TVM's
// pragma_loop_partition_hint) that asks PartitionLoops to split the loop
// where the conditions in its body change value.
const AttrLoopPartitionHint = "pragma_loop_partition_hint"

// maxPartitionPieces bounds the loops one annotated loop becomes.
const maxPartitionPieces = 8

// PartitionLoops splits each serial loop of constant bounds annotated
// with AttrLoopPartitionHint (TVM's LoopPartition, for hinted loops) at
// the iterations where a comparison in its body changes value: a
// comparison of a linear function of the loop variable with constant
// terms (v + 1 < 113, 2·j + 1 < 58) against the other side. Each piece
// is a loop of its own over which simplify proves those comparisons, so
// that a padding stage's interior becomes a plain copy (which the C
// compiler vectorizes) and only its border keeps the conditions. Loops
// nested in an annotated loop are partitioned first, then copied into
// each piece.
func PartitionLoops(f *ir.PrimFunc) (*ir.PrimFunc, error) {
	body := (&ir.Rewriter{Stmt: func(s ir.Stmt) ir.Stmt {
		fr, ok := s.(*ir.For)
		if !ok || fr.Kind != ir.ForSerial || !hinted(fr) {
			return s
		}
		return partitionLoop(fr)
	}}).RewriteStmt(f.Body)
	return f.WithBody(body), nil
}

func hinted(fr *ir.For) bool {
	switch v := fr.Annotations[AttrLoopPartitionHint].(type) {
	case bool:
		return v
	case int64:
		return v != 0
	}
	return false
}

// partitionLoop returns fr split at its cuts, or fr itself.
func partitionLoop(fr *ir.For) ir.Stmt {
	lo, ok1 := ir.IsConstInt(fr.Min)
	ext, ok2 := ir.IsConstInt(fr.Extent)
	if !ok1 || !ok2 || ext < 2 {
		return fr
	}
	hi := lo + ext
	a := arith.NewAnalyzer()
	var cuts []int64
	ir.Visit(fr.Body, func(n ir.Node) bool {
		b, ok := n.(*ir.Binary)
		if !ok || !b.Op.IsCompare() || b.Op == ir.OpEQ || b.Op == ir.OpNE || !b.A.DType().IsInt() {
			return true
		}
		if c, ok := changeAt(a, b, fr.Var); ok && c > lo && c < hi && !slices.Contains(cuts, c) {
			cuts = append(cuts, c)
		}
		return true
	})
	if len(cuts) == 0 || len(cuts) >= maxPartitionPieces {
		return fr
	}
	slices.Sort(cuts)
	bounds := append(append([]int64{lo}, cuts...), hi)
	var pieces []ir.Stmt
	t := fr.Var.Type
	for i := 0; i+1 < len(bounds); i++ {
		v := ir.NewVar(fr.Var.Name, t)
		piece := *fr
		piece.Var, piece.Min, piece.Extent = v, ir.NewIntImm(t, bounds[i]), ir.NewIntImm(t, bounds[i+1]-bounds[i])
		piece.Annotations = nil
		piece.Body = ir.Substitute(fr.Body, map[*ir.Var]ir.Expr{fr.Var: v})
		if i > 0 {
			piece.Body = freshen(piece.Body) // each copy defines its own variables
		}
		pieces = append(pieces, &piece)
	}
	return ir.Seq(pieces...)
}

// changeAt returns the value of v from which comparison b changes value,
// when b compares d·v + c with 0 for constants d ≠ 0 and c.
func changeAt(a *arith.Analyzer, b *ir.Binary, v *ir.Var) (int64, bool) {
	e := ir.Sub(b.A, b.B)
	at := func(x int64) (int64, bool) {
		return ir.IsConstInt(a.Simplify(ir.SubstituteExpr(e, map[*ir.Var]ir.Expr{v: ir.NewIntImm(v.Type, x)})))
	}
	c, ok0 := at(0)
	c1, ok1 := at(1)
	c2, ok2 := at(2)
	d := c1 - c
	if !ok0 || !ok1 || !ok2 || d == 0 || c2-c1 != d {
		return 0, false
	}
	holds := func(x int64) bool {
		y := d*x + c
		switch b.Op {
		case ir.OpLT:
			return y < 0
		case ir.OpLE:
			return y <= 0
		case ir.OpGT:
			return y > 0
		default:
			return y >= 0
		}
	}
	t := -c / d
	for x := t - 1; x <= t+2; x++ {
		if holds(x) != holds(x-1) {
			return x, true
		}
	}
	return 0, false
}
