package transform

import (
	"github.com/kiln-ml/kiln/compiler/ir"
)

// DeadCodeElimination removes, in every graph function, the bindings
// whose variable is never used and whose value has no side effect (pure
// operator calls, call_tir, calls of pure functions, tuples, constants…;
// match_cast stays, as it checks at run time), repeating until none is
// left, and folds a dataflow output bound to a dataflow variable used
// nowhere else (lv = f(x); gv = lv becomes gv = f(x)). Then it removes
// the functions that no entry function reaches through calls. Entry
// functions are those with a "global_symbol" attribute, and "main".
func DeadCodeElimination(mod *ir.IRModule) (*ir.IRModule, error) {
	out := mod
	for name, f := range mod.Funcs() {
		fn, ok := f.(*ir.Function)
		if !ok {
			continue
		}
		if g := foldOutputAliases(removeUnused(fn, mod)); g != fn {
			out = out.With(name, g)
		}
	}
	return removeUnreachable(out, isEntry), nil
}

// isEntry reports the functions a module exports.
func isEntry(name string, f ir.BaseFunc) bool {
	_, public := f.FuncAttrs()[ir.AttrGlobalSymbol]
	return public || name == "main"
}

// removeUnused drops unused pure bindings of f until none is left.
func removeUnused(f *ir.Function, mod *ir.IRModule) *ir.Function {
	for range 1000 { // each round removes at least one binding
		du := ir.DefUseOf(f)
		m := &ir.RMutator{Binding: func(b ir.Binding) []ir.Binding {
			x := b.BoundVar()
			if du.Used(x) || !removable(b, mod) {
				return []ir.Binding{b}
			}
			return nil
		}}
		g := m.RewriteFunc(f)
		if g == f {
			return f
		}
		f = g
	}
	return f
}

// removable reports a binding that may go when its variable is unused.
func removable(b ir.Binding, mod *ir.IRModule) bool {
	vb, ok := b.(*ir.VarBinding)
	if !ok {
		return false
	}
	pure := true
	ir.RVisit(vb.Value, func(e ir.RExpr) bool {
		switch e := e.(type) {
		case *ir.RCall:
			if !ir.IsPureCall(e, mod) {
				pure = false
			}
		case *ir.Function:
			return false
		}
		return pure
	})
	return pure
}

// foldOutputAliases rewrites, in dataflow blocks, lv = value; …; gv = lv,
// where gv is a block output and lv a dataflow variable used only there,
// into gv = value at lv's place.
func foldOutputAliases(f *ir.Function) *ir.Function {
	du := ir.DefUseOf(f)
	alias := map[*ir.RVar]*ir.RVar{} // lv → gv
	drop := map[*ir.RVar]bool{}      // gv
	var walk func(s *ir.SeqExpr)
	walk = func(s *ir.SeqExpr) {
		for _, blk := range s.Blocks {
			if !blk.Dataflow {
				continue
			}
			bound := map[*ir.RVar]bool{}
			for _, b := range blk.Bindings {
				vb, ok := b.(*ir.VarBinding)
				if !ok {
					bound[b.BoundVar()] = true
					continue
				}
				if lv, ok := vb.Value.(*ir.RVar); ok && !vb.Var.Dataflow && lv.Dataflow && bound[lv] &&
					len(du.Users[lv]) == 1 && du.Users[lv][0] == vb.Var && !du.Results[lv] {
					if _, isVB := du.Bindings[lv].(*ir.VarBinding); isVB {
						alias[lv] = vb.Var
						drop[vb.Var] = true
					}
				}
				bound[vb.Var] = true
			}
		}
	}
	walk(f.Body)
	if len(alias) == 0 {
		return f
	}
	m := &ir.RMutator{Binding: func(b ir.Binding) []ir.Binding {
		if drop[b.BoundVar()] {
			return nil
		}
		if gv, ok := alias[b.BoundVar()]; ok {
			return []ir.Binding{&ir.VarBinding{Var: gv, Value: b.BoundValue()}}
		}
		return []ir.Binding{b}
	}}
	return m.RewriteFunc(f)
}

// removeUnreachable drops the functions that no entry function reaches
// through references to GlobalVars.
func removeUnreachable(mod *ir.IRModule, entry func(string, ir.BaseFunc) bool) *ir.IRModule {
	reached := map[string]bool{}
	var work []string
	for n, f := range mod.Funcs() {
		if entry(n, f) {
			reached[n] = true
			work = append(work, n)
		}
	}
	for len(work) > 0 {
		n := work[len(work)-1]
		work = work[:len(work)-1]
		for _, c := range callees(mod, n) {
			if !reached[c] {
				reached[c] = true
				work = append(work, c)
			}
		}
	}
	out := mod
	for n := range mod.Funcs() {
		if !reached[n] {
			out = out.Without(n)
		}
	}
	return out
}

// callees returns the names of the functions of mod that function name
// refers to.
func callees(mod *ir.IRModule, name string) []string {
	f, _ := mod.Lookup(name)
	fn, ok := f.(*ir.Function)
	if !ok {
		return nil
	}
	var out []string
	ir.RVisit(fn, func(e ir.RExpr) bool {
		if gv, ok := e.(*ir.GlobalVar); ok {
			if _, exists := mod.Lookup(gv.Name); exists {
				out = append(out, gv.Name)
			}
		}
		return true
	})
	return out
}
