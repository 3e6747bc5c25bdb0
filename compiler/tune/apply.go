package tune

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
)

// Applied says what Apply did to a module's functions.
type Applied struct {
	// Tuned are the functions that got their best record's schedule,
	// with that record's median time.
	Tuned map[string]float64
	// Records are the records the Tuned functions got (a record of
	// Schedule DefaultSchedule gave the default schedule).
	Records map[string]Record
	// Specialized are the functions with symbolic sizes that were bound
	// to a shape (as "N=1024,M=1024") to take a record tuned for it.
	Specialized map[string]string
	// Missing are the tunable functions the database has no valid record
	// for.
	Missing []string
}

// Apply gives every PrimFunc of mod that db holds a valid record for
// (by workload hash) the schedule of its best record, replayed from the
// record's decisions; functions already scheduled or with nothing to
// tune are left as they are.
//
// A function with symbolic sizes is first bound to shape (the part of it
// naming its size variables), or, with no such binding given, to the
// shape its records were tuned for when they were all tuned for one
// (several shapes are an error asking to choose); the function in the
// returned module is then the specialized one, which takes those sizes
// only.
func Apply(mod *ir.IRModule, db *Database, target rules.Target, shape map[string]int64) (*ir.IRModule, Applied, error) {
	out := mod
	res := Applied{Tuned: map[string]float64{}, Records: map[string]Record{}, Specialized: map[string]string{}}
	used := map[string]bool{}
	for _, name := range mod.Names() {
		f := mod.PrimFunc(name)
		if f == nil {
			continue
		}
		bind := bindFor(f, shape)
		if len(bind) == 0 && len(SizeVars(f)) > 0 {
			var err error
			if bind, err = recordedShape(db, f); err != nil {
				return nil, res, fmt.Errorf("tuning database: %q: %w", name, err)
			}
		}
		for k := range bind {
			used[k] = true
		}
		g := f
		if len(bind) > 0 {
			var err error
			if g, err = Bind(f, bind); err != nil {
				return nil, res, fmt.Errorf("%q: %w", name, err)
			}
		}
		sp, err := NewSpace(g, target)
		if errors.Is(err, ErrUntunable) {
			continue
		}
		if err != nil {
			return nil, res, fmt.Errorf("tuning database: %q: %w", name, err)
		}
		best, ok := db.Best(WorkloadOf(g).Hash)
		if !ok {
			res.Missing = append(res.Missing, name)
			continue
		}
		c, err := sp.Candidate(best)
		if err != nil {
			return nil, res, fmt.Errorf("tuning database: %q: the best record does not replay (recorded by another version of the rules?): %w", name, err)
		}
		out = out.With(name, c.Func)
		res.Tuned[name] = best.Median()
		res.Records[name] = best
		if len(bind) > 0 {
			res.Specialized[name] = FormatShape(bind)
		}
	}
	for k := range shape {
		if !used[k] {
			return nil, res, fmt.Errorf("--shape %s: no function of the module has a symbolic size %q", k, k)
		}
	}
	return out, res, nil
}

// recordedShape returns the shape db's valid records for f (a function
// with symbolic sizes) were tuned for, nil when there are none.
func recordedShape(db *Database, f *ir.PrimFunc) (map[string]int64, error) {
	shapes := map[string]map[string]int64{}
	for _, r := range db.Records(genericKey(WorkloadOf(f).Hash)) {
		if r.Valid() {
			shapes[FormatShape(r.Workload.Shape)] = r.Workload.Shape
		}
	}
	switch len(shapes) {
	case 0:
		return nil, nil
	case 1:
		for _, s := range shapes {
			return s, nil
		}
	}
	names := make([]string, 0, len(shapes))
	for k := range shapes {
		names = append(names, k)
	}
	sort.Strings(names)
	return nil, fmt.Errorf("records for %d shapes (%s): choose one with --shape", len(names), strings.Join(names, "; "))
}
