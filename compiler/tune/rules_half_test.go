package tune

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/compiler/topi"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestDefaultIsATrace: the default schedule's candidate carries the
// default rule's decisions (each at the rule's own pick) and its trace,
// which schedule.Replay replays to the function the build gives the
// kernel (auto with the target's options); the record written of it
// round-trips through the database and replays to the same function.
func TestDefaultIsATrace(t *testing.T) {
	f := matmulFunc(t, 64, 96, 32)
	sp, err := NewSpace(f, testTarget)
	check.NoError(t, err)
	d, err := sp.Default()
	check.NoError(t, err)
	check.Equal(t, d.Schedule, DefaultSchedule)
	check.True(t, len(d.Decisions) > 0, "the matmul rule's choices are decisions")
	for _, x := range d.Decisions {
		check.True(t, strings.HasPrefix(x.Site, "matmul/"), x.Site)
		check.Equal(t, x.Kind, rules.KindCategorical)
	}
	build, rule, err := auto.FuncRule(f, testTarget.AutoOptions())
	check.NoError(t, err)
	check.Equal(t, rule, auto.RuleMatmul)
	check.True(t, ir.StructuralEqual(d.Func, build), "the default candidate is the build's schedule")
	tr := strings.Join(d.Trace, "\n")
	check.True(t, strings.Contains(tr, "sample_categorical(") && strings.Contains(tr, "split("), tr)
	r, err := schedule.Replay(f, d.Trace)
	check.NoError(t, err)
	check.True(t, ir.StructuralEqual(r.Func(), build), "the trace replays to the build's schedule")

	db := NewDatabase("cpu")
	line, err := json.Marshal(Record{Workload: WorkloadOf(f), Target: "cpu", Decisions: d.Decisions, Schedule: d.Schedule, Trace: d.Trace, Times: []float64{1e-3}})
	check.NoError(t, err)
	notes, err := db.Read("db.jsonl", strings.NewReader(string(line)))
	check.NoError(t, err)
	check.Equal(t, len(notes), 0, notes)
	rec, ok := db.Best(WorkloadOf(f).Hash)
	check.True(t, ok)
	c, err := sp.Candidate(rec)
	check.NoError(t, err)
	check.Equal(t, c.Schedule, DefaultSchedule)
	check.Equal(t, c.Key(), d.Key())
	check.True(t, ir.StructuralEqual(c.Func, build), "the record replays to the default schedule")
	rt, err := schedule.Replay(f, rec.Trace)
	check.NoError(t, err)
	check.True(t, ir.StructuralEqual(rt.Func(), build), "the record's trace replays to the default schedule")
}

// TestOldDefaultRecord: a record of the default schedule written before
// the rules had choices (no decisions, a trace naming the rule) still
// loads, replays to the default schedule and is what Apply gives.
func TestOldDefaultRecord(t *testing.T) {
	f := matmulFunc(t, 32, 32, 16)
	w := WorkloadOf(f)
	line := `{"workload":{"hash":"` + w.Hash + `"},"target":"cpu","decisions":[],"schedule":"default","trace":["default schedule: rule \"matmul\" of compiler/schedule/auto"],"times":[0.001]}`
	db := NewDatabase("cpu")
	notes, err := db.Read("old.jsonl", strings.NewReader(line))
	check.NoError(t, err)
	check.Equal(t, len(notes), 0, notes)
	out, applied, err := Apply(ir.NewIRModule().With("mm", f), db, testTarget, nil)
	check.NoError(t, err)
	check.Equal(t, applied.Records["mm"].Schedule, DefaultSchedule)
	build, _, err := auto.FuncRule(f, testTarget.AutoOptions())
	check.NoError(t, err)
	check.True(t, ir.StructuralEqual(out.PrimFunc("mm"), build), "the old record gives the default schedule")
}

// TestRulesHalf: candidates of the default rules drawn around the
// default compute what the unscheduled function does, replay from their
// decisions (labelled the default when every decision is the default's),
// and mutate to other valid candidates of the same half; a recorded
// decision that no longer fits the rule is an error naming its site.
func TestRulesHalf(t *testing.T) {
	f := matmulFunc(t, 24, 64, 12)
	want := run(t, f)
	sp, err := NewSpace(f, testTarget)
	check.NoError(t, err)
	dflt, err := sp.Default()
	check.NoError(t, err)
	rng := rand.New(rand.NewPCG(3, 4))
	changed := map[string]bool{}
	for i := range 16 {
		c, err := sp.rulesCandidate(rng, nil)
		check.NoError(t, err)
		check.True(t, c.Schedule == RulesSchedule || c.Key() == dflt.Key(), c.Schedule, c.Key())
		for j, d := range c.Decisions {
			if d.Choice != dflt.Decisions[j].Choice {
				changed[d.Site] = true
			}
		}
		check.Equal(t, run(t, c.Func), want, "candidate", i)
		r, err := sp.Candidate(Record{Schedule: c.Schedule, Decisions: c.Decisions})
		check.NoError(t, err)
		check.True(t, ir.StructuralEqual(r.Func, c.Func), "replay differs")
		rp, err := schedule.Replay(f, c.Trace)
		check.NoError(t, err)
		check.True(t, ir.StructuralEqual(rp.Func(), c.Func), "the trace replays to another function")
	}
	check.True(t, len(changed) >= 3, "draws change several choices:", changed)

	m, ok := Mutate(rng, dflt.Decisions)
	check.True(t, ok)
	c, err := sp.complete(rng, dflt.Schedule, m)
	check.NoError(t, err)
	check.Equal(t, c.Schedule, RulesSchedule)
	check.True(t, c.Key() != dflt.Key(), "a mutant of the default is another candidate")
	check.Equal(t, run(t, c.Func), want, "mutant")

	bad := append([]Decision(nil), dflt.Decisions...)
	bad[0].N++
	_, err = sp.Candidate(Record{Schedule: RulesSchedule, Decisions: bad})
	check.Error(t, err, bad[0].Site, "another version of the rules")
}

// halfRunner times candidates of the default rules' half at 1 ms, the
// default at 2 ms and the schedule rules' candidates at 3 ms.
type halfRunner struct{}

func (r *halfRunner) Stream(ctx context.Context, task *Task, cands []*Candidate, each func(int, Result)) error {
	for i, c := range cands {
		t := 3e-3
		switch c.Schedule {
		case DefaultSchedule:
			t = 2e-3
		case RulesSchedule:
			t = 1e-3
		}
		each(i, Result{Times: []float64{t}})
	}
	return nil
}

// TestSearchAroundDefault: the search proposes candidates of both
// halves, mutates around the default, and when a candidate of the
// default rules is the fastest, it is the best record and Apply (what
// kiln build --tuning-db does) gives its function.
func TestSearchAroundDefault(t *testing.T) {
	f := matmulFunc(t, 32, 64, 16)
	task, err := NewTask("mm", f, 1, testTarget)
	check.NoError(t, err)
	db := NewDatabase("cpu")
	_, err = Tune(context.Background(), []*Task{task}, db, &halfRunner{}, Options{Trials: 24, Batch: 8, Seed: 3, Population: 16, Generations: 2})
	check.NoError(t, err)
	halves := map[string]int{}
	for _, r := range db.Records(task.Workload.Hash) {
		halves[r.Schedule]++
	}
	check.Equal(t, halves[DefaultSchedule], 1, halves)
	check.True(t, halves[RulesSchedule] > 0 && halves[""] > 0, "both halves searched:", halves)
	best, ok := db.Best(task.Workload.Hash)
	check.True(t, ok)
	check.Equal(t, best.Schedule, RulesSchedule)
	c, err := task.Space.Candidate(best)
	check.NoError(t, err)
	out, _, err := Apply(ir.NewIRModule().With("mm", f), db, testTarget, nil)
	check.NoError(t, err)
	check.True(t, ir.StructuralEqual(out.PrimFunc("mm"), c.Func), "Apply gives the best record's function")
}

// TestMutantsComplete: every mutant of a convolution's default that
// changes one choice completes to a valid candidate computing what the
// unscheduled function does, also when the choice changes the candidates
// of a later one (the vectors along a row change how many output
// channels fit the tile): that later choice is drawn again.
func TestMutantsComplete(t *testing.T) {
	x := te.Placeholder(te.Shape(1, 6, 5, 16), ir.Float32, "data")
	w := te.Placeholder(te.Shape(12, 6, 3, 3), ir.Float32, "weight")
	y, err := topi.Conv2D(x, w, topi.Conv2DAttrs{Padding: [4]int64{1, 1, 1, 1}})
	check.NoError(t, err)
	f, err := te.CreatePrimFunc([]*te.Tensor{x, w, y})
	check.NoError(t, err)
	want := run(t, f)
	sp, err := NewSpace(f, testTarget)
	check.NoError(t, err)
	dflt, err := sp.Default()
	check.NoError(t, err)
	check.True(t, len(dflt.Decisions) > 3, dflt.Decisions)
	rng := rand.New(rand.NewPCG(5, 6))
	redrawn := 0
	for i, d := range dflt.Decisions {
		for c := range d.N {
			if c == d.Choice {
				continue
			}
			m := append([]Decision(nil), dflt.Decisions...)
			m[i].Choice = c
			got, err := sp.complete(rng, RulesSchedule, m)
			check.NoError(t, err, d.Site, "choice", c)
			check.Equal(t, run(t, got.Func), want, d.Site, "choice", c)
			for _, g := range got.Decisions {
				for _, o := range m {
					if o.Site == g.Site && o.N != g.N {
						redrawn++
					}
				}
			}
		}
	}
	check.True(t, redrawn > 0, "no mutant changed a later choice's candidates: the test does not test the redraw")
}
