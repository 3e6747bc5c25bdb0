package transform

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// LowerInit replaces each block's T.init by a statement at the start of
// its body that runs the init when every reduction iteration variable is
// at the minimum of its domain (TVM's LowerInitBlock).
func LowerInit(f *ir.PrimFunc) (*ir.PrimFunc, error) {
	r := &ir.Rewriter{Stmt: func(s ir.Stmt) ir.Stmt {
		br, ok := s.(*ir.BlockRealize)
		if !ok || br.Block.Init == nil {
			return s
		}
		b := br.Block
		var cond ir.Expr
		for _, iv := range b.IterVars {
			if iv.Kind != ir.IterReduce {
				continue
			}
			c := ir.EQ(iv.Var, iv.Dom.Min)
			if cond == nil {
				cond = c
			} else {
				cond = ir.And(cond, c)
			}
		}
		init := b.Init
		if cond != nil {
			init = &ir.IfThenElse{Cond: cond, Then: b.Init}
		}
		nb := *b
		nb.Init = nil
		nb.Body = ir.Seq(init, b.Body)
		return &ir.BlockRealize{IterValues: br.IterValues, Predicate: br.Predicate, Block: &nb}
	}}
	return seqSafe(r).RewriteFunc(f), nil
}

// LowerBlocks turns every block realize into plain statements: the block's
// iteration variables are replaced by their bound values, a predicate other
// than true becomes an if, and the block's alloc_buffers become Allocate
// statements around its body (TVM's ConvertBlocksToOpaque and
// LowerOpaqueBlock). Blocks must have no Init left (run lower_init first).
func LowerBlocks(f *ir.PrimFunc) (*ir.PrimFunc, error) {
	var err error
	r := &ir.Rewriter{Stmt: func(s ir.Stmt) ir.Stmt {
		br, ok := s.(*ir.BlockRealize)
		if !ok {
			return s
		}
		b := br.Block
		if b.Init != nil && err == nil {
			err = fmt.Errorf("block %q still has an init: run lower_init first", b.Name)
		}
		if len(br.IterValues) != len(b.IterVars) {
			if err == nil {
				err = fmt.Errorf("block %q: %d iteration variables bound to %d values", b.Name, len(b.IterVars), len(br.IterValues))
			}
			return s
		}
		vmap := map[*ir.Var]ir.Expr{}
		for i, iv := range b.IterVars {
			vmap[iv.Var] = br.IterValues[i]
		}
		body := b.Body
		allocs := b.AllocBuffers
		if len(vmap) > 0 {
			// Substitute in the body and in the shapes of allocated buffers
			// (the rewriter maps each buffer once, so loads and the
			// Allocate below see the same new buffer).
			sub := substituteBuffers(vmap)
			body = sub.RewriteStmt(body)
			na := make([]*ir.Buffer, len(allocs))
			for i, a := range allocs {
				na[i] = sub.buffer(a)
			}
			allocs = na
		}
		for i := len(allocs) - 1; i >= 0; i-- {
			body = &ir.Allocate{Buffer: allocs[i], Body: body}
		}
		if br.Predicate != nil {
			if c, ok := br.Predicate.(*ir.IntImm); !ok || c.Value == 0 {
				pred := br.Predicate
				if len(vmap) > 0 {
					pred = ir.SubstituteExpr(pred, vmap)
				}
				body = &ir.IfThenElse{Cond: pred, Then: body}
			}
		}
		return body
	}}
	g := seqSafe(r).RewriteFunc(f)
	if err != nil {
		return nil, err
	}
	return g.WithBody(sinkAllocations(g.Body)), nil
}

// sinkAllocations moves each allocation down to the smallest statement
// that holds all its uses (TVM's PlanAndUpdateBufferAllocationLocation),
// going through sequences, bindings and parallel loops. Moving into a
// parallel loop gives each iteration its own storage, which a root-level
// cache buffer used only inside the loop needs; serial loops are not
// entered, as values may flow between their iterations.
func sinkAllocations(s ir.Stmt) ir.Stmt {
	r := &ir.Rewriter{Stmt: func(s ir.Stmt) ir.Stmt {
		a, ok := s.(*ir.Allocate)
		if !ok {
			return s
		}
		if body, ok := sinkInto(a.Buffer, a.Body); ok {
			return body
		}
		return s
	}}
	return seqSafe(r).RewriteStmt(s)
}

// sinkInto places the allocation of b deeper inside body when it can,
// returning the new body (which then holds the allocation) and true.
func sinkInto(b *ir.Buffer, body ir.Stmt) (ir.Stmt, bool) {
	switch s := body.(type) {
	case *ir.SeqStmt:
		at := -1
		for i, c := range s.Seq {
			if usesData(c, b.Data) {
				if at >= 0 {
					return nil, false
				}
				at = i
			}
		}
		if at < 0 {
			return nil, false
		}
		seq := append([]ir.Stmt(nil), s.Seq...)
		seq[at] = placeAlloc(b, s.Seq[at])
		return &ir.SeqStmt{Seq: seq}, true
	case *ir.For:
		if s.Kind != ir.ForParallel || exprUsesData(s.Extent, b.Data) || exprUsesData(s.Min, b.Data) {
			return nil, false
		}
		c := *s
		c.Body = placeAlloc(b, s.Body)
		return &c, true
	case *ir.LetStmt:
		if exprUsesData(s.Value, b.Data) || bufferUsesVar(b, s.Var) {
			return nil, false
		}
		return &ir.LetStmt{Var: s.Var, Value: s.Value, Body: placeAlloc(b, s.Body)}, true
	case *ir.Allocate:
		return &ir.Allocate{Buffer: s.Buffer, Body: placeAlloc(b, s.Body)}, true
	}
	return nil, false
}

func placeAlloc(b *ir.Buffer, s ir.Stmt) ir.Stmt {
	if body, ok := sinkInto(b, s); ok {
		return body
	}
	return &ir.Allocate{Buffer: b, Body: s}
}

func usesData(s ir.Node, data *ir.Var) bool {
	found := false
	ir.Visit(s, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.BufferLoad:
			found = found || n.Buffer.Data == data
		case *ir.BufferStore:
			found = found || n.Buffer.Data == data
		case *ir.DeclBuffer:
			found = found || n.Buffer.Data == data
		case *ir.Var:
			found = found || n == data
		}
		return !found
	})
	return found
}

func exprUsesData(e ir.Expr, data *ir.Var) bool { return e != nil && usesData(e, data) }

func bufferUsesVar(b *ir.Buffer, v *ir.Var) bool {
	for _, e := range bufferExprs(b) {
		if usesData(e, v) {
			return true
		}
	}
	return false
}

func bufferExprs(b *ir.Buffer) []ir.Expr {
	es := append([]ir.Expr(nil), b.Shape...)
	es = append(es, b.Strides...)
	if b.ElemOffset != nil {
		es = append(es, b.ElemOffset)
	}
	return es
}

// bufferSubst substitutes variables in statements and in the shapes of the
// buffers they use, remembering each buffer's replacement.
type bufferSubst struct {
	*ir.Rewriter
	bufs map[*ir.Buffer]*ir.Buffer
	vmap map[*ir.Var]ir.Expr
}

func substituteBuffers(vmap map[*ir.Var]ir.Expr) *bufferSubst {
	s := &bufferSubst{bufs: map[*ir.Buffer]*ir.Buffer{}, vmap: vmap}
	s.Rewriter = &ir.Rewriter{
		Expr: func(e ir.Expr) ir.Expr {
			if v, ok := e.(*ir.Var); ok {
				if ne, ok := vmap[v]; ok {
					return ne
				}
			}
			return e
		},
		Buffer: s.buffer,
	}
	seqSafe(s.Rewriter)
	return s
}

func (s *bufferSubst) buffer(b *ir.Buffer) *ir.Buffer {
	if nb, ok := s.bufs[b]; ok {
		return nb
	}
	changed := false
	sub := func(es []ir.Expr) []ir.Expr {
		if es == nil {
			return nil
		}
		out := make([]ir.Expr, len(es))
		for i, e := range es {
			out[i] = ir.SubstituteExpr(e, s.vmap)
			changed = changed || out[i] != e
		}
		return out
	}
	shape, strides := sub(b.Shape), sub(b.Strides)
	var off ir.Expr
	if b.ElemOffset != nil {
		off = ir.SubstituteExpr(b.ElemOffset, s.vmap)
		changed = changed || off != b.ElemOffset
	}
	nb := b
	if changed {
		c := *b
		c.Shape, c.Strides, c.ElemOffset = shape, strides, off
		nb = &c
	}
	s.bufs[b] = nb
	return nb
}
