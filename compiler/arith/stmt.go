package arith

import (
	"github.com/kiln-ml/kiln/compiler/ir"
)

// SimplifyStmt simplifies every expression in s: loop variables are bound
// to their ranges inside their loops, block iteration variables to their
// domains inside their blocks, let variables to their values' bounds and
// thread_extent attributes' variables to [0, extent). It also removes
// `if`s and asserts with provable conditions, blocks whose predicate is
// false, loops of extent 0 (or provably empty) and inlines loops of
// extent 1 (substituting the loop minimum; thread-bound loops are kept).
// A statement that vanishes entirely becomes Evaluate(0). s is not
// modified; the Analyzer's bindings are as before when it returns.
func (a *Analyzer) SimplifyStmt(s ir.Stmt) ir.Stmt {
	out := a.stmt(s)
	if out == nil {
		return &ir.Evaluate{Value: ir.I32(0)}
	}
	return out
}

// SimplifyFunc simplifies a PrimFunc's body; variables that are whole
// dimensions of parameter buffers are known to be non-negative. It returns
// f itself when nothing changes.
func (a *Analyzer) SimplifyFunc(f *ir.PrimFunc) *ir.PrimFunc {
	var restore []func()
	for _, b := range f.BufferMap {
		for _, d := range b.Shape {
			if v, ok := d.(*ir.Var); ok {
				if _, known := a.vars[v]; !known {
					restore = append(restore, a.scope(v))
					a.BindBound(v, 0, typeRange(v.Type).hi)
				}
			}
		}
	}
	body := a.SimplifyStmt(f.Body)
	for i := len(restore) - 1; i >= 0; i-- {
		restore[i]()
	}
	if body == f.Body {
		return f
	}
	return f.WithBody(body)
}

// isNoOp reports statements that do nothing: Evaluate of a constant.
func isNoOp(s ir.Stmt) bool {
	if s == nil {
		return true
	}
	if e, ok := s.(*ir.Evaluate); ok {
		return isConst(e.Value)
	}
	return false
}

// stmt simplifies s; nil means s does nothing and can go.
func (a *Analyzer) stmt(s ir.Stmt) ir.Stmt {
	switch s := s.(type) {
	case nil:
		return nil
	case *ir.For:
		return a.forStmt(s)
	case *ir.BlockRealize:
		return a.blockRealize(s)
	case *ir.BufferStore:
		v := a.Simplify(s.Value)
		ix, changed := a.simplifyList(s.Indices)
		if v == s.Value && !changed {
			return s
		}
		return &ir.BufferStore{Buffer: s.Buffer, Value: v, Indices: ix}
	case *ir.Allocate:
		body := a.stmt(s.Body)
		if body == s.Body {
			return s
		}
		if body == nil {
			return nil
		}
		return &ir.Allocate{Buffer: s.Buffer, Body: body}
	case *ir.DeclBuffer:
		body := a.stmt(s.Body)
		if body == s.Body {
			return s
		}
		if body == nil {
			return nil
		}
		return &ir.DeclBuffer{Buffer: s.Buffer, Body: body}
	case *ir.SeqStmt:
		var out []ir.Stmt
		changed := false
		for _, c := range s.Seq {
			nc := a.stmt(c)
			changed = changed || nc != c
			if !isNoOp(nc) {
				out = append(out, nc)
			} else {
				changed = true
			}
		}
		switch {
		case !changed:
			return s
		case len(out) == 0:
			return nil
		}
		return ir.Seq(out...)
	case *ir.IfThenElse:
		c := a.Simplify(s.Cond)
		if v, ok := ir.IsConstInt(c); ok {
			if v != 0 {
				return a.stmt(s.Then)
			}
			return a.stmt(s.Else)
		}
		t, e := a.stmt(s.Then), a.stmt(s.Else)
		if isNoOp(t) && isNoOp(e) {
			return nil
		}
		if c == s.Cond && t == s.Then && e == s.Else {
			return s
		}
		if t == nil {
			if e == nil {
				return nil
			}
			return &ir.IfThenElse{Cond: a.Simplify(ir.LogicalNot(c)), Then: e}
		}
		return &ir.IfThenElse{Cond: c, Then: t, Else: e}
	case *ir.LetStmt:
		v := a.Simplify(s.Value)
		restore := a.scope(s.Var)
		a.BindValue(s.Var, v)
		body := a.stmt(s.Body)
		restore()
		if v == s.Value && body == s.Body {
			return s
		}
		if body == nil {
			return nil
		}
		return &ir.LetStmt{Var: s.Var, Value: v, Body: body}
	case *ir.Evaluate:
		v := a.Simplify(s.Value)
		if v == s.Value {
			return s
		}
		return &ir.Evaluate{Value: v}
	case *ir.AttrStmt:
		v := a.Simplify(s.Value)
		var restore func()
		if tv, ok := s.Node.(*ir.Var); ok && (s.Key == "thread_extent" || s.Key == "virtual_thread") && linearType(tv.Type) && v.DType() == tv.Type {
			restore = a.scope(tv)
			a.Bind(tv, ir.Range{Min: &ir.IntImm{Type: tv.Type, Value: 0}, Extent: v})
		}
		body := a.stmt(s.Body)
		if restore != nil {
			restore()
		}
		if v == s.Value && body == s.Body {
			return s
		}
		if body == nil {
			body = &ir.Evaluate{Value: ir.I32(0)}
		}
		return &ir.AttrStmt{Node: s.Node, Key: s.Key, Value: v, Body: body}
	case *ir.AssertStmt:
		c := a.Simplify(s.Cond)
		if a.CanProve(c) {
			return nil
		}
		if c == s.Cond {
			return s
		}
		return &ir.AssertStmt{Cond: c, Message: s.Message}
	}
	return s
}

func (a *Analyzer) simplifyList(es []ir.Expr) ([]ir.Expr, bool) {
	out := make([]ir.Expr, len(es))
	changed := false
	for i, e := range es {
		out[i] = a.Simplify(e)
		changed = changed || out[i] != e
	}
	if !changed {
		return es, false
	}
	return out, true
}

func (a *Analyzer) forStmt(s *ir.For) ir.Stmt {
	mn, ext := a.Simplify(s.Min), a.Simplify(s.Extent)
	if b := a.bound(ext); b.hi <= 0 {
		return nil
	}
	if v, ok := ir.IsConstInt(ext); ok && v == 1 && s.Kind != ir.ForThreadBinding && mn.DType() == s.Var.Type {
		body := ir.Substitute(s.Body, map[*ir.Var]ir.Expr{s.Var: mn})
		return a.stmt(body)
	}
	restore := a.scope(s.Var)
	a.Bind(s.Var, ir.Range{Min: mn, Extent: ext})
	body := a.stmt(s.Body)
	restore()
	if body == nil {
		return nil
	}
	if mn == s.Min && ext == s.Extent && body == s.Body {
		return s
	}
	c := *s
	c.Min, c.Extent, c.Body = mn, ext, body
	return &c
}

func (a *Analyzer) blockRealize(s *ir.BlockRealize) ir.Stmt {
	vals, c1 := a.simplifyList(s.IterValues)
	pred := s.Predicate
	if pred != nil {
		pred = a.Simplify(pred)
		if v, ok := ir.IsConstInt(pred); ok && v == 0 {
			return nil
		}
	}
	b := s.Block
	var restore []func()
	for _, iv := range b.IterVars {
		restore = append(restore, a.scope(iv.Var))
		a.Bind(iv.Var, iv.Dom)
	}
	init := a.stmt(b.Init)
	body := a.stmt(b.Body)
	reads, c2 := a.regions(b.Reads)
	writes, c3 := a.regions(b.Writes)
	for i := len(restore) - 1; i >= 0; i-- {
		restore[i]()
	}
	if body == nil {
		body = &ir.Evaluate{Value: ir.I32(0)}
	}
	blockChanged := init != b.Init || body != b.Body || c2 || c3
	if !c1 && pred == s.Predicate && !blockChanged {
		return s
	}
	nb := b
	if blockChanged {
		cp := *b
		cp.Init, cp.Body, cp.Reads, cp.Writes = init, body, reads, writes
		nb = &cp
	}
	return &ir.BlockRealize{IterValues: vals, Predicate: pred, Block: nb}
}

func (a *Analyzer) regions(rs []ir.BufferRegion) ([]ir.BufferRegion, bool) {
	changed := false
	out := make([]ir.BufferRegion, len(rs))
	for i, r := range rs {
		reg := make([]ir.Range, len(r.Region))
		for j, rg := range r.Region {
			mn, ext := a.Simplify(rg.Min), a.Simplify(rg.Extent)
			changed = changed || mn != rg.Min || ext != rg.Extent
			reg[j] = ir.Range{Min: mn, Extent: ext}
		}
		out[i] = ir.BufferRegion{Buffer: r.Buffer, Region: reg}
	}
	if !changed {
		return rs, false
	}
	return out, true
}
