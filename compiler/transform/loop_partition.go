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
// terms (v + 1 < 113, 2·j + 1 < 58) against the other side, or with
// terms of inner loops' variables (v·16 + l < 49 over lanes l of a
// vector), cut where it holds for some and for every value of those.
// Each piece
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
	bindInner(a, fr.Body)
	var cuts []int64
	ir.Visit(fr.Body, func(n ir.Node) bool {
		b, ok := n.(*ir.Binary)
		if !ok || !b.Op.IsCompare() || b.Op == ir.OpEQ || b.Op == ir.OpNE || !b.A.DType().IsInt() {
			return true
		}
		for _, c := range changeAt(a, b, fr.Var) {
			if c > lo && c < hi && !slices.Contains(cuts, c) {
				cuts = append(cuts, c)
			}
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

// bindInner binds the variables of the loops and lets in s to their
// ranges in a, so that a comparison of the loop variable with a term of
// an inner loop's (a guarded vector's lanes) has bounds.
func bindInner(a *arith.Analyzer, s ir.Stmt) {
	ir.Visit(s, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.For:
			a.Bind(n.Var, ir.Range{Min: n.Min, Extent: n.Extent})
		case *ir.LetStmt:
			a.BindValue(n.Var, n.Value)
		}
		return true
	})
}

// changeAt returns the values of v from which comparison b changes value
// for some or for every value of the inner loops' variables, when b
// compares d·v + e with 0 for a constant d ≠ 0 and a term e bounded by
// constants: cutting there, b is the same over each piece (v·16 + l < 49
// with lanes l in [0, 16) holds for every l up to v = 2 and for some up
// to v = 3).
func changeAt(a *arith.Analyzer, b *ir.Binary, v *ir.Var) []int64 {
	e := ir.Sub(b.A, b.B)
	at := func(x int64) (int64, int64, bool) {
		lo, hi := a.ConstIntBound(a.Simplify(ir.SubstituteExpr(e, map[*ir.Var]ir.Expr{v: ir.NewIntImm(v.Type, x)})))
		return lo, hi, lo != arith.NegInf && hi != arith.PosInf
	}
	lo0, hi0, ok0 := at(0)
	lo1, hi1, ok1 := at(1)
	lo2, hi2, ok2 := at(2)
	d := lo1 - lo0
	if !ok0 || !ok1 || !ok2 || d == 0 || lo2-lo1 != d || hi1-hi0 != d || hi2-hi1 != d {
		return nil
	}
	var out []int64
	for _, c := range []int64{lo0, hi0} {
		if x, ok := linearChange(b.Op, d, c); ok && !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// linearChange returns the value of x from which d·x + c op 0 changes
// value.
func linearChange(op ir.BinaryOp, d, c int64) (int64, bool) {
	holds := func(x int64) bool {
		y := d*x + c
		switch op {
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
