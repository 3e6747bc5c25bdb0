package tune

import (
	"errors"
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	relaxtransform "github.com/kiln-ml/kiln/compiler/relax/transform"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
)

// Tasks returns the tasks of mod's PrimFuncs: one per distinct workload
// (functions of one structural hash, as two identical layers of a model
// lower to, are one task, its Funcs naming them all), weighted by how many
// times the module's graph functions call them (1 for a module of
// PrimFuncs alone). Calls from a graph function the VM runs once per set
// of weights (LiftTransformParams' transform_params) do not count: a
// kernel called only there is skipped. Functions with symbolic sizes
// named in shape are bound to it (see Bind) and tuned as the bound
// function; a name in shape that no function has is an error. Functions
// with nothing to tune are listed in skipped with the reason.
func Tasks(mod *ir.IRModule, target rules.Target, shape map[string]int64) (tasks []*Task, skipped []string, err error) {
	calls := CallCounts(mod)
	graph := false
	for _, fn := range mod.Funcs() {
		if _, ok := fn.(ir.RExpr); ok {
			graph = true
			break
		}
	}
	used := map[string]bool{}
	byHash := map[string]*Task{}
	for _, name := range mod.Names() {
		f := mod.PrimFunc(name)
		if f == nil {
			continue
		}
		w := calls[name]
		if !graph {
			w = 1
		}
		if w == 0 {
			if graph && cachedCallee(mod, name) {
				skipped = append(skipped, fmt.Sprintf("%s: runs once per set of weights (transform_params), not per call: not tuned", name))
			}
			continue
		}
		bind := bindFor(f, shape)
		g := f
		if len(bind) > 0 {
			for k := range bind {
				used[k] = true
			}
			if g, err = Bind(f, bind); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", name, err)
			}
		}
		if rest := SizeVars(g); len(rest) > 0 {
			// Candidates are measured on arrays of one shape.
			skipped = append(skipped, fmt.Sprintf("%s: %v: %s; bind them with --shape NAME=SIZE", name, ErrUntunable, describeSizes(rest)))
			continue
		}
		if t := byHash[WorkloadOf(g).Hash]; t != nil {
			t.Weight += w
			t.Funcs = append(t.Funcs, name)
			continue
		}
		t, err := NewTask(name, g, w, target)
		if errors.Is(err, ErrUntunable) {
			skipped = append(skipped, err.Error())
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if len(bind) > 0 {
			t.Workload.Shape, t.Workload.Generic = bind, WorkloadOf(f).Hash
		}
		byHash[t.Workload.Hash] = t
		tasks = append(tasks, t)
	}
	for k := range shape {
		if !used[k] {
			return nil, nil, fmt.Errorf("--shape %s: no kernel has a symbolic size %q", k, k)
		}
	}
	return tasks, skipped, nil
}

// CallCounts counts, for each function name, the places mod's graph
// functions refer to it (calls of call_tir and the like), leaving out the
// graph functions the VM runs once per set of weights (marked
// relaxtransform.AttrCallCached): their kernels do not run per call.
func CallCounts(mod *ir.IRModule) map[string]int {
	out := map[string]int{}
	for _, fn := range mod.Funcs() {
		e, ok := fn.(ir.RExpr)
		if !ok || callCached(e) {
			continue
		}
		ir.RVisit(e, func(n ir.RExpr) bool {
			if g, ok := n.(*ir.GlobalVar); ok {
				out[g.Name]++
			}
			return true
		})
	}
	return out
}

// callCached reports whether e is a graph function the VM runs once per
// set of weights.
func callCached(e ir.RExpr) bool {
	f, ok := e.(*ir.Function)
	return ok && f.Attrs[relaxtransform.AttrCallCached] != nil
}

// cachedCallee reports whether a graph function run once per set of
// weights calls the function name.
func cachedCallee(mod *ir.IRModule, name string) bool {
	found := false
	for _, fn := range mod.Funcs() {
		e, ok := fn.(ir.RExpr)
		if !ok || !callCached(e) {
			continue
		}
		ir.RVisit(e, func(n ir.RExpr) bool {
			if g, ok := n.(*ir.GlobalVar); ok && g.Name == name {
				found = true
			}
			return !found
		})
	}
	return found
}
