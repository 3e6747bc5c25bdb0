package transform

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/compiler/topi"
)

// primFuncNames are the names TVM gives the PrimFunc that legalizes an
// operator (the topi function's name), where it differs from the
// operator's last name component.
var primFuncNames = map[string]string{
	"relax.permute_dims": "transpose",
	"relax.astype":       "cast",
	"relax.flatten":      "reshape",
	"relax.concat":       "concatenate",
	"relax.nn.conv2d":    "conv2d",
}

// PrimFuncNameHint is the name LegalizeOps gives the PrimFunc of a call
// of the operator opName ("relax.permute_dims" → "transpose", "relax.nn.relu"
// → "relu").
func PrimFuncNameHint(opName string) string {
	if n, ok := primFuncNames[opName]; ok {
		return n
	}
	return opName[strings.LastIndex(opName, ".")+1:]
}

// LegalizeOps replaces each operator call bound in a graph function by a
// call_tir of a PrimFunc that computes it, added to the module. The
// operator library compiler/topi (topi.LegalizeCall) gives the PrimFunc
// in destination-passing style (the call's tensor arguments, the fields
// of tuple arguments in order, then the outputs), the call_tir arguments
// and TVM's name for it; operators topi does not cover fall back to the
// legalizer registered with op.SetLegalize, whose PrimFunc takes the
// tensor arguments then the outputs and is named by its "global_symbol"
// when that is not "main", else by PrimFuncNameHint. A name already taken
// gets 1, 2, … added ("add", "add1"), and a PrimFunc structurally equal
// to one already in the module is shared instead of added. The PrimFuncs
// are private (no global_symbol); the module's functions are then sorted
// as TVM prints them (SortFunctions).
//
// Calls whose tensor arguments or result have unknown shape or dtype, and
// operators without a legalizer, are left as they are. A legalizer's
// error is an error naming the function and the binding.
func LegalizeOps(mod *ir.IRModule) (*ir.IRModule, error) {
	l := &legalizer{mod: mod, known: map[uint64][]string{}}
	for name, f := range mod.PrimFuncs() {
		h := ir.StructuralHash(f)
		l.known[h] = append(l.known[h], name)
	}
	changed := false
	for name, f := range mod.Funcs() {
		fn, ok := f.(*ir.Function)
		if !ok {
			continue
		}
		var err error
		m := &ir.RMutator{Binding: func(b ir.Binding) []ir.Binding {
			if err != nil {
				return []ir.Binding{b}
			}
			vb, ok := b.(*ir.VarBinding)
			if !ok {
				return []ir.Binding{b}
			}
			call, ok := vb.Value.(*ir.RCall)
			if !ok {
				return []ir.Binding{b}
			}
			nc, e := l.call(call)
			if e != nil {
				err = fmt.Errorf("binding %q: %w", vb.Var.Name, e)
				return []ir.Binding{b}
			}
			if nc == nil {
				return []ir.Binding{b}
			}
			return []ir.Binding{&ir.VarBinding{Var: vb.Var, Value: nc}}
		}}
		g := m.RewriteFunc(fn)
		if err != nil {
			return nil, funcError(name, err)
		}
		if g != fn {
			l.mod = l.mod.With(name, g)
			changed = true
		}
	}
	if !changed {
		return mod, nil
	}
	return SortFunctions(l.mod), nil
}

type legalizer struct {
	mod   *ir.IRModule
	known map[uint64][]string // structural hash → PrimFunc names
}

// call returns the call_tir that replaces c, or nil to keep c.
func (l *legalizer) call(c *ir.RCall) (*ir.RCall, error) {
	o, ok := c.Op.(*ir.Op)
	if !ok || o.Name == ir.OpCallTIR || o.Name == ir.OpCallPacked {
		return nil, nil
	}
	def, ok := op.Lookup(o.Name)
	if !ok {
		return nil, nil
	}
	leg := def.Legalize()
	if leg == nil {
		return nil, nil
	}
	info := c.Info
	if info == nil {
		var err error
		if info, err = ir.InferCall(c, l.mod); err != nil {
			return nil, err
		}
	}
	outs, ok := tensorFields(info)
	if !ok || !allKnown(outs) {
		return nil, nil
	}
	var args []ir.RExpr
	for _, a := range c.Args {
		switch s := ir.StructInfoOf(a).(type) {
		case *ir.TensorStructInfo:
			if !allKnown([]*ir.TensorStructInfo{s}) {
				return nil, nil
			}
			args = append(args, a)
		case *ir.TupleStructInfo:
			ts, ok := tensorFields(s)
			if !ok || !allKnown(ts) {
				return nil, nil
			}
			if t, isTuple := a.(*ir.RTuple); isTuple {
				args = append(args, t.Fields...)
				continue
			}
			for i := range ts {
				args = append(args, &ir.TupleGetItem{Tuple: a, Index: i})
			}
		}
	}
	var f *ir.PrimFunc
	hint := PrimFuncNameHint(o.Name)
	r, err := topi.LegalizeCall(c)
	switch {
	case err == nil:
		f, args, info = r.Func, r.Args, r.Out
		if r.NameHint != "" {
			hint = r.NameHint
		}
		if outs, ok = tensorFields(info); !ok {
			return nil, fmt.Errorf("legalize %s: the result %s is not tensors", def.ScriptName(), info)
		}
	case errors.Is(err, topi.ErrNoLegalizer):
		if f, err = leg(c); err != nil {
			return nil, fmt.Errorf("legalize %s: %w", def.ScriptName(), err)
		}
		if f == nil {
			return nil, nil
		}
		if gs, ok := f.Attrs[ir.AttrGlobalSymbol].(string); ok && gs != "" && gs != "main" {
			hint = gs
		}
	default:
		return nil, err
	}
	if f == nil {
		return nil, nil
	}
	if want := len(args) + len(outs); len(f.Params) != want {
		return nil, fmt.Errorf("legalize %s: the PrimFunc takes %d parameters, want %d (%d tensor inputs, %d outputs)",
			def.ScriptName(), len(f.Params), want, len(args), len(outs))
	}
	f = withoutAttr(f, ir.AttrGlobalSymbol)
	name := l.add(hint, f)
	call := ir.CallTIR(l.mod.GlobalVar(name), args, info)
	call.Sources = c.Sources
	return call, nil
}

// add puts f in the module under a fresh name derived from hint, or
// returns the name of an equal PrimFunc already there.
func (l *legalizer) add(hint string, f *ir.PrimFunc) string {
	h := ir.StructuralHash(f)
	for _, n := range l.known[h] {
		if g := l.mod.PrimFunc(n); g != nil && ir.StructuralEqual(f, g) {
			return n
		}
	}
	name := FreshName(l.mod, hint)
	l.mod = l.mod.With(name, f)
	l.known[h] = append(l.known[h], name)
	return name
}

// FreshName returns hint, or hint followed by the smallest positive
// number, whichever names no function of mod (TVM's "add", "add1", …).
func FreshName(mod *ir.IRModule, hint string) string {
	if _, taken := mod.Lookup(hint); !taken {
		return hint
	}
	for i := 1; ; i++ {
		n := hint + strconv.Itoa(i)
		if _, taken := mod.Lookup(n); !taken {
			return n
		}
	}
}

// tensorFields returns the tensors of a tensor or tuple-of-tensors struct
// info.
func tensorFields(s ir.StructInfo) ([]*ir.TensorStructInfo, bool) {
	switch s := s.(type) {
	case *ir.TensorStructInfo:
		return []*ir.TensorStructInfo{s}, true
	case *ir.TupleStructInfo:
		out := make([]*ir.TensorStructInfo, 0, len(s.Fields))
		for _, f := range s.Fields {
			t, ok := f.(*ir.TensorStructInfo)
			if !ok {
				return nil, false
			}
			out = append(out, t)
		}
		return out, true
	}
	return nil, false
}

// allKnown reports tensors whose shape and dtype are known (dimensions may
// be symbolic).
func allKnown(ts []*ir.TensorStructInfo) bool {
	for _, t := range ts {
		if t.Shape == nil || ir.IsVoid(t.DType) {
			return false
		}
	}
	return true
}

// withoutAttr returns f without attribute key.
func withoutAttr(f *ir.PrimFunc, key string) *ir.PrimFunc {
	if _, ok := f.Attrs[key]; !ok {
		return f
	}
	g := *f
	g.Attrs = map[string]any{}
	for k, v := range f.Attrs {
		if k != key {
			g.Attrs[k] = v
		}
	}
	return &g
}
