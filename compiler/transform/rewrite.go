package transform

import "github.com/kiln-ml/kiln/compiler/ir"

// seqSafe makes r rewrite sequences itself. ir.Rewriter loses a change to
// the first statement of a SeqStmt (it rebuilds the sequence from
// n.Seq[:0], which is nil); until that is fixed there, every rewriter in
// this package goes through seqSafe. Buffer hooks used with it must be
// memoised by the caller, as each child is rewritten by its own call.
func seqSafe(r *ir.Rewriter) *ir.Rewriter {
	pre := r.PreStmt
	r.PreStmt = func(s ir.Stmt) (ir.Stmt, bool) {
		if pre != nil {
			if ns, ok := pre(s); ok {
				return ns, true
			}
		}
		seq, ok := s.(*ir.SeqStmt)
		if !ok {
			return nil, false
		}
		changed := false
		out := make([]ir.Stmt, len(seq.Seq))
		for i, c := range seq.Seq {
			out[i] = r.RewriteStmt(c)
			changed = changed || out[i] != c
		}
		var res ir.Stmt = seq
		if changed {
			res = &ir.SeqStmt{Seq: out}
		}
		if r.Stmt != nil {
			res = r.Stmt(res)
		}
		return res, true
	}
	return r
}

// substitute replaces variables in s and in the shapes of the buffers it
// uses (ir.Substitute, with the sequence fix of seqSafe).
func substitute(s ir.Stmt, vmap map[*ir.Var]ir.Expr) ir.Stmt {
	return substituteBuffers(vmap).RewriteStmt(s)
}
