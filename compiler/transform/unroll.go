package transform

import (
	"github.com/kiln-ml/kiln/compiler/ir"
)

// Unroll limits: a loop is repeated in the IR only when its extent is at
// most maxUnrollExtent and the unrolled body has at most maxUnrollNodes
// nodes (the unrolled loops left inside it counted unrolled); otherwise an
// unrolled loop stays one and the C code generator asks the compiler to
// unroll it (#pragma GCC unroll), unless unrolled it too would be over
// maxUnrollNodes: then it becomes a serial loop.
const (
	maxUnrollExtent = 64
	maxUnrollNodes  = 8192
)

// Unroll replaces each unrolled loop of small constant extent by copies of
// its body, one per iteration, with the loop variable replaced by its
// value; variables and buffers defined inside the body are renamed in each
// copy. Inner loops are unrolled first. Other unrolled loops are kept for
// the code generator.
//
// A serial loop within the same limits whose body indexes a "local"
// buffer with the loop variable is unrolled too: local buffers are meant
// for registers, and the code generator keeps one in variables only when
// every index into it is a constant (TVM leaves this to LLVM's full
// unrolling and mem2reg).
func Unroll(f *ir.PrimFunc) (*ir.PrimFunc, error) {
	r := &ir.Rewriter{Stmt: func(s ir.Stmt) ir.Stmt {
		fr, ok := s.(*ir.For)
		if !ok || !(fr.Kind == ir.ForUnrolled || fr.Kind == ir.ForSerial && indexesLocal(fr)) {
			return s
		}
		ext, ok := ir.IsConstInt(foldExpr(fr.Extent))
		if ok && fr.Kind == ir.ForUnrolled && ext*unrolledSize(fr.Body) > maxUnrollNodes {
			// Unrolled by the compiler, its body would be over the
			// limit too (a tuned candidate's nest of unrolled loops,
			// each within it, made gcc take minutes): a serial loop.
			c := *fr
			c.Kind = ir.ForSerial
			return &c
		}
		if !ok || ext > maxUnrollExtent || ext*unrolledSize(fr.Body) > maxUnrollNodes {
			return s
		}
		if ext <= 0 {
			return &ir.SeqStmt{}
		}
		copies := make([]ir.Stmt, ext)
		for i := range ext {
			val := foldExpr(ir.Add(fr.Min, ir.NewIntImm(fr.Var.Type, i)))
			body := fr.Body
			if i > 0 {
				body = freshen(body)
			}
			copies[i] = substitute(body, map[*ir.Var]ir.Expr{fr.Var: val})
		}
		return ir.Seq(copies...)
	}}
	return f.WithBody(seqSafe(r).RewriteStmt(f.Body)), nil
}

// indexesLocal reports a loop whose body loads or stores a buffer of scope
// "local" at an index that uses the loop variable.
func indexesLocal(fr *ir.For) bool {
	found := false
	uses := func(idx []ir.Expr) bool {
		for _, e := range idx {
			if usesData(e, fr.Var) {
				return true
			}
		}
		return false
	}
	ir.Visit(fr.Body, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.BufferLoad:
			found = found || n.Buffer.Scope == "local" && uses(n.Indices)
		case *ir.BufferStore:
			found = found || n.Buffer.Scope == "local" && uses(n.Indices)
		}
		return !found
	})
	return found
}

// unrolledSize counts the nodes under s once every unrolled loop left in
// it (for the C compiler to unroll) is unrolled: such a loop counts its
// extent times its body.
func unrolledSize(s ir.Stmt) int64 {
	n := int64(0)
	ir.Visit(s, func(x ir.Node) bool {
		if fr, ok := x.(*ir.For); ok && fr.Kind == ir.ForUnrolled {
			if ext, ok := ir.IsConstInt(foldExpr(fr.Extent)); ok && ext > 1 {
				n += 1 + ext*unrolledSize(fr.Body)
				return false
			}
		}
		n++
		return true
	})
	return n
}

// freshen returns a copy of s in which every variable and buffer that s
// defines (loop and let variables, allocated and declared buffers with
// their data variables) is replaced by a new one, so the copy can sit
// beside the original.
func freshen(s ir.Stmt) ir.Stmt {
	vars := map[*ir.Var]ir.Expr{}
	newVar := func(v *ir.Var) *ir.Var {
		if nv, ok := vars[v]; ok {
			return nv.(*ir.Var)
		}
		nv := ir.NewVar(v.Name, v.Type)
		vars[v] = nv
		return nv
	}
	bufs := map[*ir.Buffer]bool{}
	ir.Visit(s, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.For:
			newVar(n.Var)
		case *ir.LetStmt:
			newVar(n.Var)
		case *ir.Let:
			newVar(n.Var)
		case *ir.Allocate:
			newVar(n.Buffer.Data)
			bufs[n.Buffer] = true
		case *ir.DeclBuffer:
			bufs[n.Buffer] = true
		}
		return true
	})
	if len(vars) == 0 && len(bufs) == 0 {
		return s
	}
	sub := substituteBuffers(vars)
	inner := sub.Buffer
	sub.Buffer = func(b *ir.Buffer) *ir.Buffer {
		nb := inner(b)
		if !bufs[b] {
			return nb
		}
		c := *nb
		if nv, ok := vars[b.Data]; ok {
			c.Data = nv.(*ir.Var)
		}
		return &c
	}
	sub.bufs = map[*ir.Buffer]*ir.Buffer{}
	// Buffer replacements must be memoised across the whole rewrite so
	// that an Allocate and the loads under it agree.
	memo := map[*ir.Buffer]*ir.Buffer{}
	outer := sub.Buffer
	sub.Buffer = func(b *ir.Buffer) *ir.Buffer {
		if nb, ok := memo[b]; ok {
			return nb
		}
		nb := outer(b)
		memo[b] = nb
		return nb
	}
	expr := sub.Expr
	sub.Expr = func(e ir.Expr) ir.Expr {
		if l, ok := e.(*ir.Let); ok {
			if nv, ok := vars[l.Var]; ok {
				return &ir.Let{Var: nv.(*ir.Var), Value: l.Value, Body: l.Body}
			}
		}
		return expr(e)
	}
	sub.Stmt = func(s ir.Stmt) ir.Stmt {
		switch s := s.(type) {
		case *ir.For:
			if nv, ok := vars[s.Var]; ok {
				c := *s
				c.Var = nv.(*ir.Var)
				return &c
			}
		case *ir.LetStmt:
			if nv, ok := vars[s.Var]; ok {
				return &ir.LetStmt{Var: nv.(*ir.Var), Value: s.Value, Body: s.Body}
			}
		}
		return s
	}
	return sub.RewriteStmt(s)
}
