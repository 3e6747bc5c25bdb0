package tune

import (
	"errors"
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
)

// Applied says what Apply did to a module's functions.
type Applied struct {
	// Tuned are the functions that got their best record's schedule,
	// with that record's median time.
	Tuned map[string]float64
	// Missing are the tunable functions the database has no valid record
	// for.
	Missing []string
}

// Apply gives every PrimFunc of mod that db holds a valid record for
// (by workload hash) the schedule of its best record, replayed from the
// record's decisions; functions already scheduled or with nothing to
// tune are left as they are.
func Apply(mod *ir.IRModule, db *Database, target rules.Target) (*ir.IRModule, Applied, error) {
	out := mod
	res := Applied{Tuned: map[string]float64{}}
	for _, name := range mod.Names() {
		f := mod.PrimFunc(name)
		if f == nil {
			continue
		}
		sp, err := NewSpace(f, target)
		if errors.Is(err, ErrUntunable) {
			continue
		}
		if err != nil {
			return nil, res, fmt.Errorf("tuning database: %q: %w", name, err)
		}
		best, ok := db.Best(WorkloadOf(f).Hash)
		if !ok {
			res.Missing = append(res.Missing, name)
			continue
		}
		c, err := sp.Replay(best.Decisions)
		if err != nil {
			return nil, res, fmt.Errorf("tuning database: %q: the best record does not replay (recorded by another version of the rules?): %w", name, err)
		}
		out = out.With(name, c.Func)
		res.Tuned[name] = best.Median()
	}
	return out, res, nil
}

// Tasks returns the tasks of mod's PrimFuncs, weighted by how many times
// the module's graph functions call each (1 for a module of PrimFuncs
// alone). Functions with nothing to tune are listed in skipped with the
// reason.
func Tasks(mod *ir.IRModule, target rules.Target) (tasks []*Task, skipped []string, err error) {
	calls := CallCounts(mod)
	for _, name := range mod.Names() {
		f := mod.PrimFunc(name)
		if f == nil {
			continue
		}
		w := calls[name]
		if len(calls) == 0 {
			w = 1
		}
		if w == 0 {
			continue // never called
		}
		t, err := NewTask(name, f, w, target)
		if errors.Is(err, ErrUntunable) {
			skipped = append(skipped, err.Error())
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		tasks = append(tasks, t)
	}
	return tasks, skipped, nil
}

// CallCounts counts, for each function name, the places mod's graph
// functions refer to it (calls of call_tir and the like).
func CallCounts(mod *ir.IRModule) map[string]int {
	out := map[string]int{}
	for _, fn := range mod.Funcs() {
		e, ok := fn.(ir.RExpr)
		if !ok {
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
