package tune

import (
	"context"
	"hash/fnv"
	"math"
	"sort"
	"sync"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// cutoffRunner times each candidate as a runner with a Cutoff does: a
// first repeat, cold (up to 1.9× the candidate's true time, drawn from its
// key), then, unless the cutoff stops it there, five more within 2% of
// the true time. Everything is a function of the candidate: the run is
// deterministic.
type cutoffRunner struct {
	cut  *Cutoff
	mu   sync.Mutex
	true map[string]float64 // each measured candidate's true time
}

func (r *cutoffRunner) Stream(ctx context.Context, task *Task, cands []*Candidate, each func(int, Result)) error {
	for i, c := range cands {
		if err := ctx.Err(); err != nil {
			return err
		}
		v := Features(c.Func)
		tt := 1e-3 * (1 + math.Abs(v[3]-3) + math.Abs(v[21]-5) + v[6]/4)
		h := fnv.New32a()
		h.Write([]byte(c.Key()))
		x := h.Sum32()
		r.mu.Lock()
		r.true[c.Key()] = tt
		r.mu.Unlock()
		first := tt * (1 + 0.9*float64(x%1000)/999)
		if r.cut.Stop(task.Workload.Hash, first) {
			each(i, Result{Times: []float64{first}, Validity: Validity{Stopped: true}})
			continue
		}
		times := []float64{first}
		for k := range 5 {
			times = append(times, tt*(1+0.02*float64((x>>(4*k))%16)/15))
		}
		s := append([]float64(nil), times...)
		sort.Float64s(s)
		r.cut.Observe(task.Workload.Hash, (s[2]+s[3])/2)
		each(i, Result{Times: times})
	}
	return nil
}

// TestCutoffKeepsTheBest: with the default cutoff, a search whose
// candidates' first repeats run up to 1.9× slow stops the timing of
// many candidates, and never that of the candidate that is truly the
// fastest: the database's best is it.
func TestCutoffKeepsTheBest(t *testing.T) {
	task, err := NewTask("mm", matmulFunc(t, 64, 64, 64), 1, testTarget)
	check.NoError(t, err)
	db := NewDatabase("cpu")
	r := &cutoffRunner{cut: NewCutoff(DefaultCutoff), true: map[string]float64{}}
	sum, err := Tune(context.Background(), []*Task{task}, db, r, Options{Trials: 96, Batch: 16, Seed: 5})
	check.NoError(t, err)
	check.Equal(t, sum[0].Trials, 96)
	fastest, key := math.Inf(1), ""
	for k, tt := range r.true {
		if tt < fastest {
			fastest, key = tt, k
		}
	}
	stopped := 0
	for _, rec := range db.Records(task.Workload.Hash) {
		if rec.Stopped {
			stopped++
			// Candidates of the same features tie: none of the fastest
			// may be stopped.
			check.True(t, r.true[candidateKey(rec.Schedule, rec.Decisions)] > fastest, "a fastest candidate's timing was stopped:", key)
		}
	}
	check.True(t, stopped > 0, "no candidate's timing was stopped: the test shows nothing")
	best, ok := db.Best(task.Workload.Hash)
	check.True(t, ok, "no best record")
	check.Equal(t, r.true[candidateKey(best.Schedule, best.Decisions)], fastest, "the best record is not a fastest candidate")
	check.True(t, !best.Stopped, "the best record was stopped")
}

func TestCutoffStop(t *testing.T) {
	var zero Cutoff
	zero.Observe("w", 1)
	check.True(t, !zero.Stop("w", 100), "the zero Cutoff stopped")
	c := NewCutoff(2)
	check.True(t, !c.Stop("w", 100), "stopped before any best")
	c.Observe("w", 0.010)
	c.Observe("w", 0.020) // not the best
	c.Observe("v", 0.001) // another workload
	check.True(t, !c.Stop("w", 0.020), "stopped at 2× the best")
	check.True(t, c.Stop("w", 0.0201), "not stopped past 2× the best")
	check.True(t, !c.Stop("u", 1), "stopped a workload it never saw")
}
