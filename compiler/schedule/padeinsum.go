package schedule

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// PadEinsum pads the iteration domain of block b to whole multiples of
// padding, one factor per iteration variable (TVM's sch.pad_einsum), so
// that the loops tile exactly into vectors or register tiles. Each input
// the block reads along a padded variable is first copied, with zeros in
// the padding, into a padded buffer input_pad (by a block of that name);
// when a spatial variable is padded, the block computes into a padded
// buffer output_pad that a block output_unpad copies back. Block b must
// be an einsum: one store to an output at its spatial iteration variables,
// loads at iteration variables or at windows over them (sums of
// variables times non-negative constants, a convolution's x·s + rx: the
// copy then holds what the padded domain reads; an input that already
// holds it is read in place), and, when a reduction variable is padded, a
// sum whose terms are products with a load at that variable (so the
// padding adds zero). Its loops must be its own, one per
// iteration variable (pad before splitting them) and its predicate true.
func (s *Schedule) PadEinsum(b BlockRV, padding []int64) error {
	if err := s.padEinsum(b, padding); err != nil {
		return fmt.Errorf("pad_einsum: %w", err)
	}
	s.record("sch.pad_einsum(%s, %s)", s.bn(b), pyInts(padding, false))
	return nil
}

func (s *Schedule) padEinsum(b BlockRV, padding []int64) error {
	bs, err := s.block("", b)
	if err != nil {
		return err
	}
	br := bs.realize()
	blk := br.Block
	if len(padding) != len(blk.IterVars) {
		return fmt.Errorf("%d padding factors for the %d iteration variables of block %q", len(padding), len(blk.IterVars), blk.Name)
	}
	dims := make([]int64, len(padding))
	exts := make([]int64, len(padding))
	index := map[*ir.Var]int{}
	padded := map[*ir.Var]bool{}
	for i, iv := range blk.IterVars {
		if padding[i] < 1 {
			return fmt.Errorf("padding factor %d of %q is below 1", padding[i], iv.Var.Name)
		}
		d, ok := ir.IsConstInt(iv.Dom.Extent)
		if !ok {
			return fmt.Errorf("iteration variable %q of block %q has the symbolic extent %s", iv.Var.Name, blk.Name, iv.Dom.Extent)
		}
		if iv.Kind == ir.IterOpaque {
			return fmt.Errorf("block %q has the opaque iteration variable %q", blk.Name, iv.Var.Name)
		}
		dims[i] = d
		exts[i] = (d + padding[i] - 1) / padding[i] * padding[i]
		index[iv.Var] = i
		padded[iv.Var] = exts[i] != d
	}
	if slices.Equal(dims, exts) {
		return nil
	}
	nest, loopOf, ok := perfectNest(bs)
	if !ok {
		return fmt.Errorf("the loops of block %q are not one loop per iteration variable, from 0 over its domain, serial and around this block alone (pad before split, fuse or compute_at)", blk.Name)
	}
	if c, ok := ir.IsConstInt(br.Predicate); !ok || c == 0 {
		return fmt.Errorf("block %q runs under the predicate %s", blk.Name, br.Predicate)
	}
	if len(blk.AllocBuffers) > 0 {
		return fmt.Errorf("block %q allocates buffers", blk.Name)
	}
	store, ok := blk.Body.(*ir.BufferStore)
	if !ok {
		return fmt.Errorf("the body of block %q is not a single store", blk.Name)
	}
	out := store.Buffer
	outVars, err := iterIndices(blk, store.Indices, index)
	if err != nil {
		return fmt.Errorf("block %q stores %q %w", blk.Name, out.Name, err)
	}
	for _, v := range outVars {
		if blk.IterVars[index[v]].Kind != ir.IterSpatial {
			return fmt.Errorf("block %q stores %q at the reduction variable %q", blk.Name, out.Name, v.Name)
		}
	}
	value := store.Value
	var x ir.Expr
	reducePadded := false
	for _, iv := range blk.IterVars {
		reducePadded = reducePadded || iv.Kind == ir.IterReduce && padded[iv.Var]
	}
	if blk.Init != nil {
		op, term, ok := combiner(store)
		if !ok {
			return fmt.Errorf("block %q does not store %s = %s op x for op one of +, *, min and max", blk.Name, out.Name, out.Name)
		}
		if reducePadded && op != ir.OpAdd {
			return fmt.Errorf("block %q reduces with %s: only a sum can run over padding", blk.Name, strings.ToLower(op.String()))
		}
		x = term
	} else if reducePadded {
		return fmt.Errorf("block %q has reduction variables but no init", blk.Name)
	}
	// The inputs: loaded at iteration variables or windows over them
	// (padInput).
	at := map[*ir.Buffer]*padInput{}
	var inputs []*ir.Buffer
	var bad error
	ir.Visit(value, func(n ir.Node) bool {
		l, ok := n.(*ir.BufferLoad)
		if !ok || bad != nil || l.Buffer == out {
			return bad == nil
		}
		if at[l.Buffer] == nil {
			at[l.Buffer] = &padInput{}
			inputs = append(inputs, l.Buffer)
		}
		if err := at[l.Buffer].windowLoad(l.Indices, index, exts); err != nil {
			bad = fmt.Errorf("block %q loads %q %w", blk.Name, l.Buffer.Name, err)
		}
		return bad == nil
	})
	if bad != nil {
		return bad
	}
	if loadsBuffer(value, out) && blk.Init == nil {
		return fmt.Errorf("block %q reads the buffer %q it writes", blk.Name, out.Name)
	}
	// A padded reduction variable must meet a zero: some factor of the
	// summed product loads an input along it.
	if reducePadded {
		factors := mulFactors(x)
		for _, iv := range blk.IterVars {
			if iv.Kind != ir.IterReduce || !padded[iv.Var] {
				continue
			}
			if !slices.ContainsFunc(factors, func(f ir.Expr) bool {
				l, ok := f.(*ir.BufferLoad)
				return ok && l.Buffer != out && zeroAlong(l, iv.Var, dims[index[iv.Var]])
			}) {
				return fmt.Errorf("padding the reduction variable %q of block %q would add %s at the padded iterations: the summed term is not a product with a load along %q", iv.Var.Name, blk.Name, x, iv.Var.Name)
			}
		}
	}
	scopeBR := bs.scope()
	top := topOf(bs, scopeBR)
	paddedShape := func(vs []*ir.Var, like []ir.Expr) []ir.Expr {
		shape := make([]ir.Expr, len(vs))
		for d, v := range vs {
			shape[d] = ir.NewIntImm(like[d].DType(), exts[index[v]])
		}
		return shape
	}
	anyPadded := func(vs []*ir.Var) bool { return slices.ContainsFunc(vs, func(v *ir.Var) bool { return padded[v] }) }
	nbr := br
	var before, after []ir.Stmt
	var allocs []*ir.Buffer
	for _, in := range inputs {
		shape := at[in].paddedShape(in)
		if !anyPadded(at[in].vars) || shape == nil {
			continue
		}
		name := s.uniqueName(in.Name + "_pad")
		pb := ir.NewBuffer(name, in.DType, shape, in.StorageScope())
		allocs = append(allocs, pb)
		before = append(before, padCopy(name, in, pb))
		nbr = replaceBuffer(nbr, in, pb, false)
	}
	if anyPadded(outVars) {
		name := s.uniqueName(out.Name + "_pad")
		ob := ir.NewBuffer(name, out.DType, paddedShape(outVars, out.Shape), out.StorageScope())
		allocs = append(allocs, ob)
		nbr = replaceBuffer(nbr, out, ob, false)
		after = append(after, copyNest(s.uniqueName(out.Name+"_unpad"), ob, out))
		// copyNest runs over the destination's shape: the output's.
	}
	nblk := *nbr.Block
	nblk.IterVars = slices.Clone(nblk.IterVars)
	for i := range nblk.IterVars {
		nblk.IterVars[i].Dom = ir.RangeFromExtent(ir.NewIntImm(nblk.IterVars[i].Dom.Extent.DType(), exts[i]))
	}
	nbr = &ir.BlockRealize{IterValues: nbr.IterValues, Predicate: nbr.Predicate, Block: &nblk}
	newNest := rebuildNest(nest, loopOf, exts, nbr)
	newTop := replace(top, map[ir.Stmt]ir.Stmt{nest[0]: newNest})
	seq := append(append(before, newTop), after...)
	body := replace(scopeBR.Block.Body, map[ir.Stmt]ir.Stmt{top: ir.Seq(seq...)})
	return s.commit("pad_einsum", replace(s.fn.Body, map[ir.Stmt]ir.Stmt{scopeBR: withAlloc(scopeBR, body, allocs, nil)}))
}

// iterIndices checks that each index is an iteration variable of blk and
// returns them; its errors read after "block B loads A".
func iterIndices(blk *ir.Block, indices []ir.Expr, index map[*ir.Var]int) ([]*ir.Var, error) {
	vs := make([]*ir.Var, len(indices))
	for d, ix := range indices {
		v, ok := ix.(*ir.Var)
		if _, isIter := index[v]; !ok || !isIter {
			return nil, fmt.Errorf("at %s in dimension %d, not at an iteration variable", ix, d)
		}
		vs[d] = v
	}
	return vs, nil
}

// mulFactors flattens a product into its factors.
func mulFactors(e ir.Expr) []ir.Expr {
	if b, ok := e.(*ir.Binary); ok && b.Op == ir.OpMul {
		return append(mulFactors(b.A), mulFactors(b.B)...)
	}
	return []ir.Expr{e}
}

// padCopy returns loops over the padded buffer dst around a block named
// name that copies src into it, zero outside src's shape.
func padCopy(name string, src, dst *ir.Buffer) ir.Stmt {
	return pointNest(name, dst.Shape, func(idx []ir.Expr) (ir.Stmt, []ir.BufferRegion, []ir.Expr) {
		var cond ir.Expr = ir.BoolImm(true)
		for d, ext := range dst.Shape {
			if !ir.Equal(ext, src.Shape[d]) {
				cond = conjoin(cond, ir.LT(idx[d], src.Shape[d]))
			}
		}
		return dst.Store(ir.NewIfThenElse(cond, src.Load(idx...), ir.Const(dst.DType, 0)), idx...), []ir.BufferRegion{ir.PointRegion(src, idx...)}, idx
	}, dst)
}
