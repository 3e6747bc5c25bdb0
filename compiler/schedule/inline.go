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
	if err := s.accessedOutside(scopeBR, buf); err != nil {
		return err
	}
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

// ReverseComputeInline removes block b and computes what it stores in
// the block that produces the buffer it reads (TVM's
// sch.reverse_compute_inline): the producer stores b's value, with the
// producer's value in place of the load, straight into b's output. Block
// b must be a spatial block whose body is one store, that reads one
// intermediate buffer written in the scope, at its iteration variables
// one to one over the buffer's whole shape, and no other buffer that a
// block after the producer writes. The producer must be the buffer's only
// writer, a spatial block that stores the buffer at its own iteration
// variables over the whole shape. No other block may read the buffer,
// which goes away, or touch b's output between the two.
func (s *Schedule) ReverseComputeInline(b BlockRV) error {
	if err := s.reverseComputeInline(b); err != nil {
		return fmt.Errorf("reverse_compute_inline: %w", err)
	}
	s.record("sch.reverse_compute_inline(%s)", s.bn(b))
	return nil
}

func (s *Schedule) reverseComputeInline(b BlockRV) error {
	bs, err := s.block("", b)
	if err != nil {
		return err
	}
	br := bs.realize()
	blk := br.Block
	if err := spatialStore(blk); err != nil {
		return err
	}
	store := blk.Body.(*ir.BufferStore)
	scopeBR := bs.scope()
	blocks := s.scopeBlocks(scopeBR)
	// The producer: the one block of the scope that writes a buffer b reads.
	var prod *site
	var buf *ir.Buffer
	for i := range blocks {
		o := blocks[i].realize().Block
		if o == blk {
			continue
		}
		for _, rg := range blk.Reads {
			if writes(o, rg.Buffer) {
				if prod != nil && prod.realize().Block != o {
					return fmt.Errorf("block %q reads buffers that two blocks, %q and %q, produce", blk.Name, prod.realize().Block.Name, o.Name)
				}
				if buf != nil && buf != rg.Buffer {
					return fmt.Errorf("block %q reads two buffers, %q and %q, that block %q produces", blk.Name, buf.Name, rg.Buffer.Name, o.Name)
				}
				prod, buf = &blocks[i], rg.Buffer
			}
		}
	}
	if prod == nil {
		return fmt.Errorf("block %q reads no buffer that a block of its scope produces", blk.Name)
	}
	if isParam(s.fn, buf) {
		return fmt.Errorf("block %q reads %q, a parameter of the function", blk.Name, buf.Name)
	}
	if err := s.accessedOutside(scopeBR, buf); err != nil {
		return err
	}
	pbr := prod.realize()
	pblk := pbr.Block
	if err := spatialStore(pblk); err != nil {
		return fmt.Errorf("the producer of %q: %w", buf.Name, err)
	}
	pstore := pblk.Body.(*ir.BufferStore)
	if pstore.Buffer != buf || len(pblk.Writes) != 1 {
		return fmt.Errorf("the producer %q writes buffers other than %q", pblk.Name, buf.Name)
	}
	if _, err := wholeBufferVars(pblk, pstore.Indices, buf); err != nil {
		return fmt.Errorf("the producer %q %w", pblk.Name, err)
	}
	if !domainGuard(pbr) {
		return fmt.Errorf("the producer %q runs under the predicate %s, so it may not write all of %q", pblk.Name, pbr.Predicate, buf.Name)
	}
	// The consumer's loads of buf: all at the same iteration variables.
	var vars []*ir.Var
	var bad error
	ir.Visit(store.Value, func(n ir.Node) bool {
		l, ok := n.(*ir.BufferLoad)
		if !ok || l.Buffer != buf || bad != nil {
			return bad == nil
		}
		vs, err := wholeBufferVars(blk, l.Indices, buf)
		switch {
		case err != nil:
			bad = fmt.Errorf("block %q %w", blk.Name, err)
		case vars != nil && !slices.Equal(vs, vars):
			bad = fmt.Errorf("block %q loads %q at two different points", blk.Name, buf.Name)
		}
		vars = vs
		return true
	})
	if bad != nil {
		return bad
	}
	if vars == nil {
		return fmt.Errorf("block %q declares a read of %q but does not load it", blk.Name, buf.Name)
	}
	if len(vars) != len(blk.IterVars) {
		return fmt.Errorf("block %q has iteration variables that do not index %q: it would store the same value more than once", blk.Name, buf.Name)
	}
	if loadsBuffer(store.Value, store.Buffer) {
		return fmt.Errorf("block %q reads the buffer %q it writes", blk.Name, store.Buffer.Name)
	}
	// Nothing between the producer and b may write what b reads or touch
	// what b writes; nothing else may read buf.
	po, co := order(scopeBR, pbr), order(scopeBR, br)
	for _, st := range blocks {
		o := st.realize()
		if o == br || o == pbr {
			continue
		}
		if reads(o.Block, buf) || loadsBuffer(o.Block.Body, buf) {
			return fmt.Errorf("block %q also reads %q", o.Block.Name, buf.Name)
		}
		if writes(o.Block, store.Buffer) {
			return fmt.Errorf("%q has another producer, block %q", store.Buffer.Name, o.Block.Name)
		}
		at := order(scopeBR, o)
		if at < po || at > co {
			continue
		}
		if reads(o.Block, store.Buffer) {
			return fmt.Errorf("block %q, between %q and %q, reads %q", o.Block.Name, pblk.Name, blk.Name, store.Buffer.Name)
		}
		for _, rg := range blk.Reads {
			if rg.Buffer != buf && writes(o.Block, rg.Buffer) {
				return fmt.Errorf("block %q, between %q and %q, writes %q that %q reads", o.Block.Name, pblk.Name, blk.Name, rg.Buffer.Name, blk.Name)
			}
		}
	}
	// b's iteration variables become the producer's: vars[d] indexes
	// dimension d, which the producer stores at pstore.Indices[d].
	vmap := map[*ir.Var]ir.Expr{}
	for d, v := range vars {
		vmap[v] = pstore.Indices[d]
	}
	value := ir.SubstituteExpr(store.Value, vmap)
	value = rewrite(&ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
		if l, ok := e.(*ir.BufferLoad); ok && l.Buffer == buf {
			return pstore.Value
		}
		return e
	}}, ir.NewBufferStore(store.Buffer, value, store.Indices...)).(*ir.BufferStore).Value
	idx := make([]ir.Expr, len(store.Indices))
	for d, x := range store.Indices {
		idx[d] = ir.SubstituteExpr(x, vmap)
	}
	np := *pblk
	np.Body = &ir.BufferStore{Buffer: store.Buffer, Value: value, Indices: idx}
	np.Writes = []ir.BufferRegion{substRegion(blk.Writes[0], vmap)}
	np.Reads = slices.Clone(pblk.Reads)
	for _, rg := range blk.Reads {
		if rg.Buffer == buf {
			continue
		}
		rg = substRegion(rg, vmap)
		if i := slices.IndexFunc(np.Reads, func(r ir.BufferRegion) bool { return r.Buffer == rg.Buffer }); i >= 0 {
			np.Reads[i] = unionRegion(np.Reads[i], rg)
			continue
		}
		np.Reads = append(np.Reads, rg)
	}
	repl := map[ir.Stmt]ir.Stmt{
		pbr: &ir.BlockRealize{IterValues: pbr.IterValues, Predicate: pbr.Predicate, Block: &np},
		br:  nil,
	}
	body := replace(scopeBR.Block.Body, repl)
	var drop *ir.Buffer
	if slices.Contains(scopeBR.Block.AllocBuffers, buf) {
		drop = buf
	}
	if err := s.commit("reverse_compute_inline", replace(s.fn.Body, map[ir.Stmt]ir.Stmt{scopeBR: withAlloc(scopeBR, body, nil, drop)})); err != nil {
		return err
	}
	s.dropBlock(blk.Name, "inlined into its producer")
	return nil
}

// domainGuard reports whether the predicate of br only keeps bindings
// inside their domains (as Split's guards do): each conjunct is
// binding < extent for an iteration variable ranging from 0.
func domainGuard(br *ir.BlockRealize) bool {
	for _, c := range conjuncts(br.Predicate) {
		lt, ok := c.(*ir.Binary)
		if !ok || lt.Op != ir.OpLT {
			return false
		}
		if !slices.ContainsFunc(br.Block.IterVars, func(iv ir.IterVar) bool {
			i := slices.IndexFunc(br.Block.IterVars, func(x ir.IterVar) bool { return x.Var == iv.Var })
			m, ok := ir.IsConstInt(iv.Dom.Min)
			return ok && m == 0 && ir.Equal(iv.Dom.Extent, lt.B) && ir.Equal(br.IterValues[i], lt.A)
		}) {
			return false
		}
	}
	return true
}

// spatialStore checks that blk is a spatial block without init whose body
// is a single store and that allocates nothing.
func spatialStore(blk *ir.Block) error {
	if blk.Init != nil {
		return fmt.Errorf("block %q is a reduction (it has an init)", blk.Name)
	}
	for _, iv := range blk.IterVars {
		if iv.Kind != ir.IterSpatial {
			return fmt.Errorf("block %q has the %s iteration variable %q", blk.Name, iv.Kind, iv.Var.Name)
		}
	}
	if _, ok := blk.Body.(*ir.BufferStore); !ok {
		return fmt.Errorf("the body of block %q is not a single store", blk.Name)
	}
	if len(blk.AllocBuffers) > 0 {
		return fmt.Errorf("block %q allocates buffers", blk.Name)
	}
	return nil
}

// wholeBufferVars checks that indices of buf are distinct iteration
// variables of blk whose domains are buf's dimensions, and returns them.
// Its errors read after the block's name: "does not …".
func wholeBufferVars(blk *ir.Block, indices []ir.Expr, buf *ir.Buffer) ([]*ir.Var, error) {
	vars := make([]*ir.Var, len(indices))
	for d, ix := range indices {
		v, ok := ix.(*ir.Var)
		i := slices.IndexFunc(blk.IterVars, func(iv ir.IterVar) bool { return iv.Var == v })
		if !ok || slices.Contains(vars, v) || i < 0 {
			return nil, fmt.Errorf("does not access %q at its iteration variables one to one (index %d is %s)", buf.Name, d, ix)
		}
		dom := blk.IterVars[i].Dom
		if c, ok := ir.IsConstInt(dom.Min); !ok || c != 0 || !ir.Equal(dom.Extent, buf.Shape[d]) {
			return nil, fmt.Errorf("does not cover dimension %d of %q: %q ranges over [%s, %s + %s), the dimension is %s", d, buf.Name, v.Name, dom.Min, dom.Min, dom.Extent, buf.Shape[d])
		}
		vars[d] = v
	}
	return vars, nil
}

// substRegion substitutes vmap in a region's bounds.
func substRegion(r ir.BufferRegion, vmap map[*ir.Var]ir.Expr) ir.BufferRegion {
	out := ir.BufferRegion{Buffer: r.Buffer, Region: make([]ir.Range, len(r.Region))}
	for d, rg := range r.Region {
		out.Region[d] = ir.Range{Min: ir.SubstituteExpr(rg.Min, vmap), Extent: ir.SubstituteExpr(rg.Extent, vmap)}
	}
	return out
}

// unionRegion is the smallest region holding a and b where their bounds
// differ by constants, the whole buffer in the other dimensions.
func unionRegion(a, b ir.BufferRegion) ir.BufferRegion {
	out := ir.BufferRegion{Buffer: a.Buffer, Region: slices.Clone(a.Region)}
	for d := range a.Region {
		sa, sb := rangeSpan(a.Region[d]), rangeSpan(b.Region[d])
		u, ok := unionSpan(sa, sb)
		if !ok {
			out.Region[d] = ir.RangeFromExtent(a.Buffer.Shape[d])
			continue
		}
		ext := u.hi.add(u.lo, -1).add(constAffine(u.lo.t, 1), 1)
		out.Region[d] = ir.Range{Min: u.lo.expr(), Extent: ext.expr()}
	}
	return out
}

// rangeSpan is the inclusive span of a range.
func rangeSpan(r ir.Range) span {
	lo := toAffine(r.Min)
	return span{lo: lo, hi: lo.add(toAffine(r.Extent), 1).add(constAffine(lo.t, 1), -1)}
}

// accessedOutside reports a block outside the scope block (not under it)
// that accesses buf: inlining inside the scope would not reach it.
func (s *Schedule) accessedOutside(scope *ir.BlockRealize, buf *ir.Buffer) error {
	inside := map[*ir.Block]bool{}
	ir.Visit(scope, func(n ir.Node) bool {
		if b, ok := n.(*ir.Block); ok {
			inside[b] = true
		}
		return true
	})
	var err error
	ir.Visit(s.fn.Body, func(n ir.Node) bool {
		b, ok := n.(*ir.Block)
		if !ok || err != nil || inside[b] || b.Name == ir.RootBlockName {
			return err == nil
		}
		if reads(b, buf) || writes(b, buf) {
			err = fmt.Errorf("block %q, outside block %q where the inlining happens, accesses %q", b.Name, scope.Block.Name, buf.Name)
		}
		return err == nil
	})
	return err
}
