package schedule

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// CacheRead adds a block that copies the buffer block b reads as its
// readIndex-th read region into a new buffer of storage scope scope
// ("global", "local", "shared"…), and makes every block of the scope that
// reads the buffer read the copy instead (TVM's sch.cache_read). The copy
// covers the whole buffer and runs right after the buffer's producer, or
// first when the buffer is an input; ComputeAt moves it closer to its
// readers. The new block and buffer are named buffer_scope (A_local).
func (s *Schedule) CacheRead(b BlockRV, readIndex int, scope string) (BlockRV, error) {
	out, err := s.cacheRead(b, readIndex, scope)
	if err != nil {
		return BlockRV{}, fmt.Errorf("cache_read: %w", err)
	}
	s.record("%s = sch.cache_read(%s, %d, %q)", s.bn(out), s.bn(b), readIndex, scope)
	return out, nil
}

func (s *Schedule) cacheRead(b BlockRV, readIndex int, scope string) (BlockRV, error) {
	bs, err := s.block("", b)
	if err != nil {
		return BlockRV{}, err
	}
	if scope == "" {
		return BlockRV{}, errors.New("empty storage scope")
	}
	blk := bs.realize().Block
	if readIndex < 0 || readIndex >= len(blk.Reads) {
		return BlockRV{}, fmt.Errorf("block %q has %d read regions, no read %d", blk.Name, len(blk.Reads), readIndex)
	}
	buf := blk.Reads[readIndex].Buffer
	if writes(blk, buf) {
		return BlockRV{}, fmt.Errorf("block %q both reads and writes %q", blk.Name, buf.Name)
	}
	scopeBR := bs.scope()
	var producer ir.Stmt
	var consumers []site
	for _, st := range s.scopeBlocks(scopeBR) {
		o := st.realize().Block
		if writes(o, buf) {
			if producer != nil {
				return BlockRV{}, fmt.Errorf("%q has more than one producer", buf.Name)
			}
			producer = topOf(st, scopeBR)
		}
		if reads(o, buf) {
			if writes(o, buf) {
				return BlockRV{}, fmt.Errorf("block %q both reads and writes %q", o.Name, buf.Name)
			}
			consumers = append(consumers, st)
		}
	}
	name := s.uniqueName(buf.Name + "_" + scope)
	cache := ir.NewBuffer(name, buf.DType, buf.Shape, scope)
	nest := copyNest(name, buf, cache)
	repl := map[ir.Stmt]ir.Stmt{}
	for _, c := range consumers {
		if producer != nil && c.under(producer) {
			return BlockRV{}, fmt.Errorf("block %q reads %q inside the loops of its producer", c.realize().Block.Name, buf.Name)
		}
		repl[c.realize()] = replaceBuffer(c.realize(), buf, cache, true)
	}
	body := replace(scopeBR.Block.Body, repl)
	if producer != nil {
		body = replace(body, map[ir.Stmt]ir.Stmt{producer: ir.Seq(producer, nest)})
	} else {
		body = ir.Seq(nest, body)
	}
	newScope := withAlloc(scopeBR, body, []*ir.Buffer{cache}, nil)
	if err := s.commit("cache_read", replace(s.fn.Body, map[ir.Stmt]ir.Stmt{scopeBR: newScope})); err != nil {
		return BlockRV{}, err
	}
	return s.blockRV(name), nil
}

// CacheWrite makes block b write its writeIndex-th written buffer into a
// new buffer of storage scope scope and adds a block, right after b's
// loop nest, that copies the new buffer back (TVM's sch.cache_write).
// Block b must be the buffer's only producer, a block of the root block
// (not one inside a block that Blockize made) and, when it updates the
// buffer, one with its init. It returns the copy-back block, named
// buffer_scope (C_local) like the new buffer; move it with
// ReverseComputeAt.
func (s *Schedule) CacheWrite(b BlockRV, writeIndex int, scope string) (BlockRV, error) {
	out, err := s.cacheWrite(b, writeIndex, scope, ir.Void)
	if err != nil {
		return BlockRV{}, fmt.Errorf("cache_write: %w", err)
	}
	s.record("%s = sch.cache_write(%s, %d, %q)", s.bn(out), s.bn(b), writeIndex, scope)
	return out, nil
}

// cacheWrite is CacheWrite, with a cache of dtype dt unless dt is Void
// (see CacheWriteDType).
func (s *Schedule) cacheWrite(b BlockRV, writeIndex int, scope string, dt ir.DType) (BlockRV, error) {
	bs, err := s.block("", b)
	if err != nil {
		return BlockRV{}, err
	}
	if scope == "" {
		return BlockRV{}, errors.New("empty storage scope")
	}
	blk := bs.realize().Block
	if writeIndex < 0 || writeIndex >= len(blk.Writes) {
		return BlockRV{}, fmt.Errorf("block %q has %d write regions, no write %d", blk.Name, len(blk.Writes), writeIndex)
	}
	buf := blk.Writes[writeIndex].Buffer
	if blk.Init == nil && (reads(blk, buf) || loadsBuffer(blk.Body, buf)) {
		return BlockRV{}, fmt.Errorf("block %q updates %q without an init of its own: the cache would start without the values it adds to", blk.Name, buf.Name)
	}
	scopeBR := bs.scope()
	if ir.RootBlock(s.fn.Body) != scopeBR.Block {
		// The copy back would copy the whole buffer once per instance of
		// the enclosing block, over what its other instances wrote.
		return BlockRV{}, fmt.Errorf("block %q is inside block %q: cache_write works on blocks of the root block", blk.Name, scopeBR.Block.Name)
	}
	for _, st := range s.scopeBlocks(scopeBR) {
		o := st.realize().Block
		if o != blk && writes(o, buf) {
			return BlockRV{}, fmt.Errorf("%q has another producer, block %q", buf.Name, o.Name)
		}
	}
	top := topOf(bs, scopeBR)
	// Readers of the buffer inside the producer's loop nest need the copy
	// back inside the nest: right after the producer's part of the
	// innermost loop that holds them all.
	var readers []site
	for _, st := range s.scopeBlocks(scopeBR) {
		if st.realize() != bs.realize() && reads(st.realize().Block, buf) && st.under(top) {
			readers = append(readers, st)
		}
	}
	var lca *ir.For
	if len(readers) > 0 {
		for _, p := range bs.path {
			f, ok := p.(*ir.For)
			if ok && !slices.ContainsFunc(readers, func(st site) bool { return !st.under(f) }) {
				lca = f
			}
		}
		if lca == nil {
			return BlockRV{}, fmt.Errorf("block %q reads %q inside the loop nest of its producer", readers[0].realize().Block.Name, buf.Name)
		}
		at := childHolding(lca.Body, blk.Name)
		for _, st := range readers {
			if st.realize() == at || st.under(at) {
				return BlockRV{}, fmt.Errorf("block %q reads %q inside the loops of its producer %q", st.realize().Block.Name, buf.Name, blk.Name)
			}
		}
	}
	if dt == ir.Void {
		dt = buf.DType
	}
	if err := accumDTypeOK(buf, dt); err != nil {
		return BlockRV{}, err
	}
	name := s.uniqueName(buf.Name + "_" + scope)
	cache := ir.NewBuffer(name, dt, buf.Shape, scope)
	nest := castCopyNest(name, cache, buf)
	newTop := replace(top, map[ir.Stmt]ir.Stmt{bs.realize(): replaceBuffer(widenStores(bs.realize(), buf, cache), buf, cache, false)})
	body := replace(scopeBR.Block.Body, map[ir.Stmt]ir.Stmt{top: ir.Seq(newTop, nest)})
	newScope := withAlloc(scopeBR, body, []*ir.Buffer{cache}, nil)
	saved := s.fn
	if err := s.commit("cache_write", replace(s.fn.Body, map[ir.Stmt]ir.Stmt{scopeBR: newScope})); err != nil {
		return BlockRV{}, err
	}
	if lca != nil {
		// after and lca are untouched by the rewrite above except where
		// they hold the producer: find them again by their contents.
		wb := site{path: findBlock(s.fn.Body, name)}
		ls := site{path: findPath(s.fn.Body, func(st ir.Stmt) bool {
			f, ok := st.(*ir.For)
			return ok && f.Var == lca.Var
		})}
		at := childHolding(ls.loop().Body, blk.Name)
		if err := s.moveUnder("cache_write", wb, ls, true, at); err != nil {
			s.fn = saved
			return BlockRV{}, err
		}
	}
	return s.blockRV(name), nil
}

// childHolding returns the statement of body (body itself or an element
// of its sequence) that holds block name.
func childHolding(body ir.Stmt, name string) ir.Stmt {
	if q, ok := body.(*ir.SeqStmt); ok {
		for _, c := range q.Seq {
			if findBlock(c, name) != nil {
				return c
			}
		}
	}
	return body
}
