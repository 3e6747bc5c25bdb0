package transform

import (
	"github.com/kiln-ml/kiln/compiler/ir"
)

// AttrNumInput is the attribute that tells how many leading parameters of
// a graph function are inputs; the parameters after them are weights
// (R.func_attr({"num_input": 1})).
const AttrNumInput = "num_input"

// AttrCallCached marks a graph function made by LiftTransformParams: the
// VM code generator calls it through vm.builtin.call_cached, so it runs
// once per set of weight arrays (compiler/codegen/vm spells the same key).
const AttrCallCached = "kiln.call_cached"

// LiftTransformParams moves, in every graph function with a "num_input"
// attribute, the pure calls that depend only on weights (the parameters
// after the first num_input) into a new function "<name>_transform_params"
// that takes those weights and returns a tuple of the values the rest of
// the function uses, as TVM's LiftTransformParams. The original function
// calls it once, at the first lifted binding, and binds each lifted value
// it uses to a field of the result, so its printed form stays readable:
//
//	lv = R.call_tir(cls.transpose, (w,), …)
//
// becomes
//
//	params = cls.main_transform_params(w)
//	lv = params[0]
//
// The new function carries AttrCallCached: the VM runs it through
// vm.builtin.call_cached, which keeps its result while the same weight
// arrays are passed (the weights are then treated as constants, as TVM's
// transform_params). Functions that lift nothing are left as they are.
func LiftTransformParams(mod *ir.IRModule) (*ir.IRModule, error) {
	out := mod
	for _, name := range mod.Names() {
		f, ok := lookupFunc(mod, name)
		if !ok || f.Attrs[AttrCallCached] != nil {
			continue
		}
		k, ok := numInput(f.Attrs[AttrNumInput])
		if !ok || k >= len(f.Params) {
			continue
		}
		tpName := FreshName(out, name+"_transform_params")
		tp, rewrite := liftWeights(f, k, mod)
		if tp == nil {
			continue
		}
		out = out.With(tpName, tp)
		out = out.With(name, rewrite(out.GlobalVar(tpName)))
	}
	return out, nil
}

func lookupFunc(mod *ir.IRModule, name string) (*ir.Function, bool) {
	f, ok := mod.Lookup(name)
	if !ok {
		return nil, false
	}
	fn, ok := f.(*ir.Function)
	return fn, ok
}

// numInput decodes the num_input attribute.
func numInput(v any) (int, bool) {
	switch n := v.(type) {
	case int64:
		return int(n), n >= 0
	case int:
		return n, n >= 0
	case int32:
		return int(n), n >= 0
	}
	return 0, false
}

// liftWeights finds f's top-level bindings computable from weights alone
// and returns the transform function and a rewrite of f that calls the
// function named by its argument; tp is nil when nothing lifts.
func liftWeights(f *ir.Function, k int, mod *ir.IRModule) (tp *ir.Function, rewrite func(*ir.GlobalVar) *ir.Function) {
	weights := map[*ir.RVar]bool{}
	for _, p := range f.Params[k:] {
		weights[p] = true
	}
	lifted := map[*ir.RVar]bool{}
	var order []*ir.VarBinding
	for _, blk := range f.Body.Blocks {
		for _, b := range blk.Bindings {
			vb, ok := b.(*ir.VarBinding)
			if !ok {
				continue
			}
			call, ok := vb.Value.(*ir.RCall)
			if !ok || !ir.IsPureCall(call, mod) {
				continue
			}
			free := ir.FreeRVars(vb.Value)
			liftable := len(free) > 0
			for _, v := range free {
				if !weights[v] && !lifted[v] {
					liftable = false
					break
				}
			}
			if liftable {
				lifted[vb.Var] = true
				order = append(order, vb)
			}
		}
	}
	if len(order) == 0 {
		return nil, nil
	}
	// Outputs: lifted values used by what stays (or by the result).
	du := ir.DefUseOf(f)
	index := map[*ir.RVar]int{}
	var outputs []*ir.RVar
	for _, vb := range order {
		used := du.Results[vb.Var]
		for _, u := range du.Users[vb.Var] {
			if !lifted[u] {
				used = true
			}
		}
		if used {
			index[vb.Var] = len(outputs)
			outputs = append(outputs, vb.Var)
		}
	}
	if len(outputs) == 0 {
		return nil, nil
	}

	// The transform function: the used weights in parameter order.
	subst := map[*ir.RVar]ir.RExpr{}
	usedWeights := map[*ir.RVar]bool{}
	for _, vb := range order {
		for _, v := range ir.FreeRVars(vb.Value) {
			if weights[v] {
				usedWeights[v] = true
			}
		}
	}
	var params []*ir.RVar
	var args []ir.RExpr
	for _, p := range f.Params[k:] {
		if usedWeights[p] {
			np := ir.NewRVar(p.Name, p.Info)
			subst[p] = np
			params = append(params, np)
			args = append(args, p)
		}
	}
	var bindings []ir.Binding
	for _, vb := range order {
		m := &ir.RMutator{Subst: subst}
		val := m.RewriteExpr(vb.Value)
		nv := ir.NewDataflowVar(vb.Var.Name, vb.Var.Info)
		subst[vb.Var] = nv
		bindings = append(bindings, &ir.VarBinding{Var: nv, Value: val})
	}
	fields := make([]ir.RExpr, len(outputs))
	infos := make([]ir.StructInfo, len(outputs))
	for i, o := range outputs {
		fields[i] = subst[o]
		infos[i] = o.Info
	}
	tupleInfo := ir.Tuple(infos...)
	res := ir.NewRVar("params", tupleInfo)
	bindings = append(bindings, &ir.VarBinding{Var: res, Value: &ir.RTuple{Fields: fields}})
	body := &ir.SeqExpr{Blocks: []*ir.BindingBlock{{Dataflow: true, Bindings: bindings}}, Body: res}
	tp = ir.NewFunction(params, body, map[string]any{AttrCallCached: int64(1)})

	rewrite = func(gv *ir.GlobalVar) *ir.Function {
		call := ir.NewRVar("params", tupleInfo)
		first := true
		m := &ir.RMutator{Binding: func(b ir.Binding) []ir.Binding {
			if !lifted[b.BoundVar()] {
				return []ir.Binding{b}
			}
			var out []ir.Binding
			if first {
				first = false
				out = append(out, &ir.VarBinding{Var: call, Value: &ir.RCall{Op: gv, Args: args, Info: tupleInfo}})
			}
			if i, ok := index[b.BoundVar()]; ok {
				out = append(out, &ir.VarBinding{Var: b.BoundVar(), Value: &ir.TupleGetItem{Tuple: call, Index: i}})
			}
			return out
		}}
		return m.RewriteFunc(f)
	}
	return tp, rewrite
}
