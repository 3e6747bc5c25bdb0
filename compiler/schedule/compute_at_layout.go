package schedule

import (
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// partlyOneToOne maps the dimensions of write region r of block b to b's
// iteration variables as oneToOne does, where some dimensions are indexed
// by expressions of iteration variables instead (a layout's w % 2 and
// w // 2): those dimensions map to -1, and the variables they use must
// index no dimension directly; ComputeAt then runs those variables over
// their whole domain, a region that covers any the consumers read. Every
// dimension must be a single point.
func partlyOneToOne(b *ir.Block, r ir.BufferRegion) ([]int, bool) {
	dims := make([]int, len(r.Region))
	direct := map[*ir.Var]bool{}
	for d, rg := range r.Region {
		if c, ok := ir.IsConstInt(rg.Extent); !ok || c != 1 {
			return nil, false
		}
		dims[d] = -1
		if v, ok := rg.Min.(*ir.Var); ok {
			idx := slices.IndexFunc(b.IterVars, func(iv ir.IterVar) bool { return iv.Var == v })
			if idx < 0 || direct[v] {
				return nil, false
			}
			direct[v], dims[d] = true, idx
		}
	}
	for d, rg := range r.Region {
		if dims[d] >= 0 {
			continue
		}
		bad := false
		ir.Visit(rg.Min, func(n ir.Node) bool {
			if v, ok := n.(*ir.Var); ok && direct[v] {
				bad = true
			}
			return !bad
		})
		if bad {
			return nil, false
		}
	}
	return dims, true
}

// widen returns a in the wider integer type t, its atoms cast to t (the
// region of an int64 buffer indexed by int32 variables).
func (a affine) widen(t ir.DType) affine {
	w := affine{t: t, c: a.c}
	for _, tm := range a.terms {
		w.terms = append(w.terms, term{atom: ir.NewCast(t, tm.atom), coef: tm.coef})
	}
	return w
}

// widenSpan returns sp in iteration variable dtype t when its indices
// are a narrower integer type.
func widenSpan(sp span, t ir.DType) span {
	from := sp.lo.t
	if from == t || !from.IsInt() || !t.IsInt() || from.Bits > t.Bits || from.Lanes != 1 || t.Lanes != 1 {
		return sp
	}
	return span{lo: sp.lo.widen(t), hi: sp.hi.widen(t)}
}
