package ir

import "slices"

// This file holds the walkers of the graph level: a pre-order and a
// post-order visitor over graph expressions, a post-order rewriter that
// can also drop, replace or insert bindings (RMutator), free variables and
// the def-use relation of a function. The TensorIR walkers are in
// visit.go; these do not descend into TensorIR (PrimFunc bodies) or into
// the expressions of struct info.

// RVisit walks e pre-order: it calls f on e and, when f returns true, on
// e's children. The children of a SeqExpr are the values of its bindings,
// in order, then its body; of a Function, its body; of an RIf, the
// condition and both branches; of an RCall, the callee then the
// arguments. Defining occurrences of variables (parameters, bound
// variables) are not visited, their uses are.
func RVisit(e RExpr, f func(RExpr) bool) {
	if e == nil || !f(e) {
		return
	}
	rchildren(e, func(c RExpr) { RVisit(c, f) })
}

// RPostOrderVisit calls f on every graph expression under e (see RVisit)
// after its children.
func RPostOrderVisit(e RExpr, f func(RExpr)) {
	var walk func(RExpr)
	walk = func(e RExpr) {
		if e == nil {
			return
		}
		rchildren(e, walk)
		f(e)
	}
	walk(e)
}

func rchildren(e RExpr, f func(RExpr)) {
	switch e := e.(type) {
	case *RCall:
		f(e.Op)
		for _, a := range e.Args {
			f(a)
		}
	case *RTuple:
		for _, x := range e.Fields {
			f(x)
		}
	case *TupleGetItem:
		f(e.Tuple)
	case *RIf:
		f(e.Cond)
		if e.Then != nil {
			f(e.Then)
		}
		if e.Else != nil {
			f(e.Else)
		}
	case *SeqExpr:
		for _, b := range e.Blocks {
			for _, bd := range b.Bindings {
				f(bd.BoundValue())
			}
		}
		f(e.Body)
	case *Function:
		if e.Body != nil {
			f(e.Body)
		}
	}
}

// RMutator is a post-order rewriter of graph expressions: it rebuilds a
// tree bottom-up, copying a node only when one of its children changed
// (the input is never modified), and offers each rebuilt node to its
// hooks. Nil hooks leave nodes as they are.
//
//	m := &ir.RMutator{Binding: func(b ir.Binding) []ir.Binding { … }}
//	g := m.RewriteFunc(f)
type RMutator struct {
	// Expr sees each expression after its children were rewritten and
	// returns its replacement (or the argument). Uses of variables pass
	// through it (after Subst); defining occurrences do not. Where a
	// *SeqExpr is required (a function body, a branch) and Expr returns
	// another expression, it is wrapped in a SeqExpr without blocks.
	Expr func(e RExpr) RExpr
	// Binding sees each binding after its value was rewritten and returns
	// the bindings that take its place: none drops it, several insert.
	// When it returns exactly one binding of another variable, uses of
	// the old variable are replaced by the new one from there on;
	// otherwise a hook that removes a variable still in use records its
	// replacement in Subst.
	Binding func(b Binding) []Binding
	// Block sees each binding block after its bindings were rewritten;
	// returning nil drops it. Blocks left without bindings are dropped
	// before the hook.
	Block func(b *BindingBlock) *BindingBlock
	// Subst replaces uses of variables (before the Expr hook sees them).
	// Hooks may add entries while a rewrite runs; it is created on
	// demand.
	Subst map[*RVar]RExpr
}

// RewriteExpr rewrites a graph expression.
func (m *RMutator) RewriteExpr(e RExpr) RExpr { return m.expr(e) }

// RewriteSeq rewrites a sequence; it returns s itself when nothing
// changed.
func (m *RMutator) RewriteSeq(s *SeqExpr) *SeqExpr { return m.asSeq(m.expr(s)) }

// RewriteFunc rewrites a function's body; it returns f itself when nothing
// changed. Parameters are kept (Subst does not apply to their
// definitions).
func (m *RMutator) RewriteFunc(f *Function) *Function {
	if f.Body == nil {
		return f
	}
	body := m.RewriteSeq(f.Body)
	if body == f.Body {
		return f
	}
	return f.WithBody(body)
}

func (m *RMutator) asSeq(e RExpr) *SeqExpr {
	if s, ok := e.(*SeqExpr); ok {
		return s
	}
	return &SeqExpr{Body: e}
}

func (m *RMutator) hook(e RExpr) RExpr {
	if m.Expr == nil {
		return e
	}
	return m.Expr(e)
}

func (m *RMutator) exprs(es []RExpr) ([]RExpr, bool) {
	var out []RExpr
	for i, e := range es {
		n := m.expr(e)
		if n != e && out == nil {
			out = slices.Clone(es[:i:i])
		}
		if out != nil {
			out = append(out, n)
		}
	}
	if out == nil {
		return es, false
	}
	return out, true
}

func (m *RMutator) expr(e RExpr) RExpr {
	switch e := e.(type) {
	case nil:
		return nil
	case *RVar:
		if r, ok := m.Subst[e]; ok {
			return m.hook(r)
		}
		return m.hook(e)
	case *RCall:
		op := m.expr(e.Op)
		args, changed := m.exprs(e.Args)
		if op != e.Op || changed {
			c := *e
			c.Op, c.Args = op, args
			return m.hook(&c)
		}
		return m.hook(e)
	case *RTuple:
		if fs, changed := m.exprs(e.Fields); changed {
			return m.hook(&RTuple{Fields: fs})
		}
		return m.hook(e)
	case *TupleGetItem:
		if t := m.expr(e.Tuple); t != e.Tuple {
			return m.hook(&TupleGetItem{Tuple: t, Index: e.Index})
		}
		return m.hook(e)
	case *RIf:
		c := m.expr(e.Cond)
		th, el := e.Then, e.Else
		if th != nil {
			th = m.asSeq(m.expr(th))
		}
		if el != nil {
			el = m.asSeq(m.expr(el))
		}
		if c != e.Cond || th != e.Then || el != e.Else {
			n := *e
			n.Cond, n.Then, n.Else = c, th, el
			return m.hook(&n)
		}
		return m.hook(e)
	case *SeqExpr:
		return m.hook(m.seq(e))
	case *Function:
		if e.Body != nil {
			if b := m.asSeq(m.expr(e.Body)); b != e.Body {
				return m.hook(e.WithBody(b))
			}
		}
		return m.hook(e)
	}
	return m.hook(e)
}

func (m *RMutator) seq(s *SeqExpr) *SeqExpr {
	changed := false
	blocks := make([]*BindingBlock, 0, len(s.Blocks))
	for _, b := range s.Blocks {
		nb := m.block(b)
		if nb != b {
			changed = true
		}
		if nb != nil {
			blocks = append(blocks, nb)
		}
	}
	body := m.expr(s.Body)
	if !changed && body == s.Body {
		return s
	}
	return &SeqExpr{Blocks: blocks, Body: body}
}

func (m *RMutator) block(b *BindingBlock) *BindingBlock {
	changed := false
	out := make([]Binding, 0, len(b.Bindings))
	for _, bd := range b.Bindings {
		nbd := m.binding(bd)
		if len(nbd) != 1 || nbd[0] != bd {
			changed = true
		}
		out = append(out, nbd...)
	}
	nb := b
	if changed {
		nb = &BindingBlock{Dataflow: b.Dataflow, Bindings: out}
	}
	if len(nb.Bindings) == 0 {
		return nil
	}
	if m.Block != nil {
		nb = m.Block(nb)
	}
	return nb
}

func (m *RMutator) binding(bd Binding) []Binding {
	val := bd.BoundValue()
	nv := m.expr(val)
	if nv != val {
		switch b := bd.(type) {
		case *VarBinding:
			bd = &VarBinding{Var: b.Var, Value: nv}
		case *MatchCast:
			bd = &MatchCast{Var: b.Var, Value: nv, Info: b.Info}
		}
	}
	if m.Binding == nil {
		return []Binding{bd}
	}
	old := bd.BoundVar()
	out := m.Binding(bd)
	if len(out) == 1 && out[0].BoundVar() != old {
		if m.Subst == nil {
			m.Subst = map[*RVar]RExpr{}
		}
		m.Subst[old] = out[0].BoundVar()
	}
	return out
}

// FreeRVars returns the graph variables that e uses but does not define,
// in order of first use.
func FreeRVars(e RExpr) []*RVar {
	defined := map[*RVar]bool{}
	seen := map[*RVar]bool{}
	var out []*RVar
	var walk func(RExpr)
	walk = func(e RExpr) {
		switch e := e.(type) {
		case nil:
			return
		case *RVar:
			if !defined[e] && !seen[e] {
				seen[e] = true
				out = append(out, e)
			}
			return
		case *SeqExpr:
			for _, b := range e.Blocks {
				for _, bd := range b.Bindings {
					walk(bd.BoundValue())
					defined[bd.BoundVar()] = true
				}
			}
			walk(e.Body)
			return
		case *Function:
			for _, p := range e.Params {
				defined[p] = true
			}
		}
		rchildren(e, walk)
	}
	walk(e)
	return out
}

// DefUse is the def-use relation of the variables of a graph function.
type DefUse struct {
	// Bindings maps each variable bound in the function (at any depth) to
	// its binding. Parameters are not in it.
	Bindings map[*RVar]Binding
	// Order lists the bound variables in binding order.
	Order []*RVar
	// Users maps each variable to the bound variables whose values use
	// it, in binding order and once each. A use inside a branch of an if
	// counts as a use by the variable the if is bound to, and by any
	// variable bound inside the branch that uses it.
	Users map[*RVar][]*RVar
	// Results holds the variables that the body of a SeqExpr (the
	// function's result or a branch's) uses.
	Results map[*RVar]bool
}

// DefUseOf returns the def-use relation of f.
func DefUseOf(f *Function) *DefUse {
	du := &DefUse{Bindings: map[*RVar]Binding{}, Users: map[*RVar][]*RVar{}, Results: map[*RVar]bool{}}
	var users []*RVar // the enclosing bound variables
	use := func(x *RVar) {
		for _, u := range users {
			if !slices.Contains(du.Users[x], u) {
				du.Users[x] = append(du.Users[x], u)
			}
		}
	}
	var walk func(RExpr)
	var seq func(*SeqExpr)
	walk = func(e RExpr) {
		switch e := e.(type) {
		case nil:
		case *RVar:
			use(e)
		case *SeqExpr:
			seq(e)
		default:
			rchildren(e, walk)
		}
	}
	seq = func(s *SeqExpr) {
		for _, b := range s.Blocks {
			for _, bd := range b.Bindings {
				x := bd.BoundVar()
				du.Bindings[x] = bd
				du.Order = append(du.Order, x)
				users = append(users, x)
				walk(bd.BoundValue())
				users = users[:len(users)-1]
			}
		}
		RVisit(s.Body, func(e RExpr) bool {
			if x, ok := e.(*RVar); ok {
				du.Results[x] = true
			}
			_, nested := e.(*SeqExpr)
			return !nested
		})
		walk(s.Body)
	}
	if f.Body != nil {
		seq(f.Body)
	}
	return du
}

// Used reports whether x has a user or is used by a result.
func (du *DefUse) Used(x *RVar) bool { return len(du.Users[x]) > 0 || du.Results[x] }
