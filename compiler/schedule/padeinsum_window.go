package schedule

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// padInput is how a PadEinsum block loads one of its inputs: at indices
// each an affine form of iteration variables (a variable, or a window's
// y·s + ry), the variables they use, and the extent each dimension must
// have over the padded domain (the largest over the input's loads).
type padInput struct {
	vars []*ir.Var
	need []int64
}

// windowLoad adds a load of an input of block blk to in, its indices as
// PadEinsum accepts them: each a sum of iteration variables times
// non-negative constants plus a non-negative constant, so that over the
// padded domain (extents exts) dimension d reaches need[d]-1 at most.
// Its errors read after "block B loads A".
func (in *padInput) windowLoad(indices []ir.Expr, index map[*ir.Var]int, exts []int64) error {
	if in.need == nil {
		in.need = make([]int64, len(indices))
	}
	for d, ix := range indices {
		a := toAffine(bounds{}.simplify(ix))
		if a.c < 0 {
			return fmt.Errorf("at %s in dimension %d, below 0 at the domain's start", ix, d)
		}
		top := a.c
		for _, t := range a.terms {
			atom := t.atom
			if c, ok := atom.(*ir.Cast); ok && c.DType().IsInt() && c.Value.DType().IsInt() && c.DType().Bits >= c.Value.DType().Bits {
				atom = c.Value // a variable widened to the index type
			}
			v, ok := atom.(*ir.Var)
			i, isIter := index[v]
			if !ok || !isIter || t.coef < 0 {
				return fmt.Errorf("at %s in dimension %d, not a sum of iteration variables times non-negative constants", ix, d)
			}
			top += t.coef * (exts[i] - 1)
			if !slices.Contains(in.vars, v) {
				in.vars = append(in.vars, v)
			}
		}
		in.need[d] = max(in.need[d], top+1)
	}
	return nil
}

// paddedShape returns the shape of the zero-padded copy of input buf that
// in needs, or nil when buf already covers what the padded domain reads.
func (in *padInput) paddedShape(buf *ir.Buffer) []ir.Expr {
	shape := make([]ir.Expr, len(buf.Shape))
	grows := false
	for d, ext := range buf.Shape {
		n, ok := ir.IsConstInt(ext)
		if ok && in.need[d] > n {
			shape[d], grows = ir.NewIntImm(ext.DType(), in.need[d]), true
		} else {
			shape[d] = ext
		}
	}
	if !grows {
		return nil
	}
	return shape
}

// zeroAlong reports whether load l reads zeros wherever iteration
// variable v runs in its padding (from its unpadded extent dim): one of
// its indices is v itself, along a dimension of dim elements.
func zeroAlong(l *ir.BufferLoad, v *ir.Var, dim int64) bool {
	for d, ix := range l.Indices {
		if n, ok := ir.IsConstInt(l.Buffer.Shape[d]); ok && ix == ir.Expr(v) && n == dim {
			return true
		}
	}
	return false
}
