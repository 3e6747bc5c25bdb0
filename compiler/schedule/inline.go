package schedule

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// ComputeInline removes block b and substitutes the value it computes into
// every block that reads its output (TVM's sch.compute_inline). Block b
// must be a spatial block (no reduction, no init) whose body is one store
// to an intermediate buffer (not a parameter) at its iteration variables,
// one to one; it must be the buffer's only producer. The buffer goes away.
func (s *Schedule) ComputeInline(b BlockRV) error {
	if err := s.computeInline(b); err != nil {
		return fmt.Errorf("compute_inline: %w", err)
	}
	s.record("sch.compute_inline(%s)", s.bn(b))
	return nil
}

func (s *Schedule) computeInline(b BlockRV) error {
	bs, err := s.block("", b)
	if err != nil {
		return err
	}
	br := bs.realize()
	blk := br.Block
	if blk.Init != nil {
		return fmt.Errorf("block %q is a reduction (it has an init)", blk.Name)
	}
	for _, iv := range blk.IterVars {
		if iv.Kind != ir.IterSpatial {
			return fmt.Errorf("block %q has the %s iteration variable %q", blk.Name, iv.Kind, iv.Var.Name)
		}
	}
	store, ok := blk.Body.(*ir.BufferStore)
	if !ok {
		return fmt.Errorf("the body of block %q is not a single store", blk.Name)
	}
	buf := store.Buffer
	if isParam(s.fn, buf) {
		return fmt.Errorf("block %q writes %q, a parameter of the function", blk.Name, buf.Name)
	}
	if len(blk.AllocBuffers) > 0 {
		return fmt.Errorf("block %q allocates buffers", blk.Name)
	}
	vars := make([]*ir.Var, len(store.Indices))
	for d, ix := range store.Indices {
		v, ok := ix.(*ir.Var)
		if !ok || slices.Contains(vars, v) || !slices.ContainsFunc(blk.IterVars, func(iv ir.IterVar) bool { return iv.Var == v }) {
			return fmt.Errorf("block %q does not store to %q at its iteration variables one to one (index %d is %s)", blk.Name, buf.Name, d, ix)
		}
		vars[d] = v
	}
	if len(vars) != len(blk.IterVars) {
		return fmt.Errorf("block %q has iteration variables that do not index %q", blk.Name, buf.Name)
	}
	if loadsBuffer(store.Value, buf) {
		return fmt.Errorf("block %q reads the buffer %q it writes", blk.Name, buf.Name)
	}
	scopeBR := bs.scope()
	repl := map[ir.Stmt]ir.Stmt{}
	for _, st := range s.scopeBlocks(scopeBR) {
		o := st.realize()
		if o == br {
			continue
		}
		if writes(o.Block, buf) {
			return fmt.Errorf("%q has another producer, block %q", buf.Name, o.Block.Name)
		}
		if reads(o.Block, buf) || loadsBuffer(o.Block.Body, buf) {
			repl[o] = inlineInto(o, buf, vars, store.Value)
		}
	}
	body := replace(scopeBR.Block.Body, repl)
	body = replace(body, map[ir.Stmt]ir.Stmt{br: nil})
	var drop *ir.Buffer
	if slices.Contains(scopeBR.Block.AllocBuffers, buf) {
		drop = buf
	}
	if err := s.commit("compute_inline", replace(s.fn.Body, map[ir.Stmt]ir.Stmt{scopeBR: withAlloc(scopeBR, body, nil, drop)})); err != nil {
		return err
	}
	s.dropBlock(blk.Name, "inlined into its consumers")
	return nil
}

// loadsBuffer reports whether n loads from buf.
func loadsBuffer(n ir.Node, buf *ir.Buffer) bool {
	found := false
	ir.Visit(n, func(m ir.Node) bool {
		if l, ok := m.(*ir.BufferLoad); ok && l.Buffer == buf {
			found = true
		}
		return !found
	})
	return found
}

// inlineInto replaces loads of buf in the consumer realize by value with
// vars bound to the load's indices, and recomputes its read regions.
func inlineInto(br *ir.BlockRealize, buf *ir.Buffer, vars []*ir.Var, value ir.Expr) *ir.BlockRealize {
	var accesses []*ir.BufferLoad
	r := &ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
		l, ok := e.(*ir.BufferLoad)
		if !ok || l.Buffer != buf {
			return e
		}
		vmap := map[*ir.Var]ir.Expr{}
		for d, v := range vars {
			vmap[v] = l.Indices[d]
		}
		out := ir.SubstituteExpr(value, vmap)
		ir.Visit(out, func(n ir.Node) bool {
			if ld, ok := n.(*ir.BufferLoad); ok {
				accesses = append(accesses, ld)
			}
			return true
		})
		return out
	}}
	blk := *br.Block
	blk.Body = rewrite(r, blk.Body)
	if blk.Init != nil {
		blk.Init = rewrite(r, blk.Init)
	}
	var newReads []ir.BufferRegion
	for _, rg := range blk.Reads {
		if rg.Buffer != buf {
			newReads = append(newReads, rg)
		}
	}
	for _, l := range accesses {
		i := slices.IndexFunc(newReads, func(rg ir.BufferRegion) bool { return rg.Buffer == l.Buffer })
		if i < 0 {
			newReads = append(newReads, ir.PointRegion(l.Buffer, l.Indices...))
			continue
		}
		newReads[i] = widen(newReads[i], l.Indices)
	}
	blk.Reads = newReads
	return &ir.BlockRealize{IterValues: br.IterValues, Predicate: br.Predicate, Block: &blk}
}

// widen returns region r grown to hold the point at indices: dimensions
// where the point lies at a constant distance grow to include it, others
// cover the whole buffer.
func widen(r ir.BufferRegion, indices []ir.Expr) ir.BufferRegion {
	out := ir.BufferRegion{Buffer: r.Buffer, Region: slices.Clone(r.Region)}
	for d, rg := range r.Region {
		lo := toAffine(rg.Min)
		hi := lo.add(toAffine(rg.Extent), 1).add(constAffine(lo.t, 1), -1)
		p := toAffine(indices[d])
		nlo, ok1 := unionSpan(span{lo: lo, hi: hi}, span{lo: p, hi: p})
		if !ok1 {
			out.Region[d] = ir.RangeFromExtent(r.Buffer.Shape[d])
			continue
		}
		ext := nlo.hi.add(nlo.lo, -1).add(constAffine(lo.t, 1), 1)
		out.Region[d] = ir.Range{Min: nlo.lo.expr(), Extent: ext.expr()}
	}
	return out
}
