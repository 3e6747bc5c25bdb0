package tune

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

// improvingRunner times every task's k-th candidate at base × (1 +
// 4/(k+1)): each round finds something faster, the same for every task,
// so only the weights tell the tasks apart.
type improvingRunner struct {
	base    float64
	mu      sync.Mutex
	given   map[string]int
	batches []string // the task of each batch, in order
}

func (r *improvingRunner) Stream(ctx context.Context, task *Task, cands []*Candidate, each func(int, Result)) error {
	r.mu.Lock()
	r.batches = append(r.batches, task.Name)
	r.mu.Unlock()
	for i := range cands {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.mu.Lock()
		k := r.given[task.Name]
		r.given[task.Name]++
		r.mu.Unlock()
		each(i, Result{Times: []float64{r.base * (1 + 4/float64(k+1))}})
	}
	return nil
}

// TestSchedulerHeavierTask: of two tasks alike but for their weight (10
// calls against 1), each first gets a round, the heavier one first, and
// then the heavier one gets most of the trials, the lighter one some.
func TestSchedulerHeavierTask(t *testing.T) {
	heavy, err := NewTask("heavy", matmulFunc(t, 32, 32, 32), 10, testTarget)
	check.NoError(t, err)
	light, err := NewTask("light", matmulFunc(t, 32, 32, 16), 1, testTarget)
	check.NoError(t, err)
	r := &improvingRunner{base: 1e-3, given: map[string]int{}}
	sum, err := Tune(context.Background(), []*Task{light, heavy}, NewDatabase("cpu"), r, Options{Trials: 48, Batch: 1, Seed: 1, Population: 8, Generations: 1})
	check.NoError(t, err)
	check.Equal(t, strings.Join(r.batches[:2], ","), "heavy,light")
	byName := map[string]TaskSummary{}
	for _, s := range sum {
		byName[s.Name] = s
	}
	h, l := byName["heavy"], byName["light"]
	t.Log("heavy", h.Trials, "light", l.Trials)
	check.Equal(t, h.Trials+l.Trials, 48)
	check.True(t, l.Trials >= 2, "the lighter task got", l.Trials, "trials")
	check.True(t, h.Trials >= 4*l.Trials, "heavy", h.Trials, "light", l.Trials)
	check.True(t, h.Default > 0 && h.Best < h.Default, h)
}

// TestSchedulerSkipsInvalidTask: a task none of whose candidates is
// valid gets its first round and then only what the others leave.
func TestSchedulerSkipsInvalidTask(t *testing.T) {
	good, err := NewTask("good", matmulFunc(t, 32, 32, 32), 1, testTarget)
	check.NoError(t, err)
	bad, err := NewTask("bad", matmulFunc(t, 64, 64, 64), 1, testTarget)
	check.NoError(t, err)
	r := &failingRunner{improvingRunner: improvingRunner{base: 1e-3, given: map[string]int{}}, fail: "bad"}
	sum, err := Tune(context.Background(), []*Task{good, bad}, NewDatabase("cpu"), r, Options{Trials: 16, Batch: 2, Seed: 1, Population: 8, Generations: 1})
	check.NoError(t, err)
	for _, s := range sum {
		if s.Name == "bad" {
			check.Equal(t, s.Trials, 2, "trials of the invalid task")
			check.Equal(t, s.Invalid, 2)
		}
	}
}

// failingRunner is improvingRunner but every candidate of task fail
// fails its check.
type failingRunner struct {
	improvingRunner
	fail string
}

func (r *failingRunner) Stream(ctx context.Context, task *Task, cands []*Candidate, each func(int, Result)) error {
	if task.Name != r.fail {
		return r.improvingRunner.Stream(ctx, task, cands, each)
	}
	for i := range cands {
		each(i, Result{Error: "wrong result", Stage: "check"})
	}
	return nil
}

// TestTuneResumeTasks: a run over two tasks interrupted after 10 trials
// keeps those 10 records on disk; a resumed run (the budget less what the
// database holds) measures the rest, never a candidate twice, and leaves
// the first run's records as they were.
func TestTuneResumeTasks(t *testing.T) {
	a, err := NewTask("a", matmulFunc(t, 32, 32, 32), 3, testTarget)
	check.NoError(t, err)
	b, err := NewTask("b", matmulFunc(t, 32, 32, 16), 1, testTarget)
	check.NoError(t, err)
	tasks := []*Task{a, b}
	path := filepath.Join(t.TempDir(), "db.jsonl")
	db, _, err := OpenDatabase(path, "cpu")
	check.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &fakeRunner{runs: map[string]int{}}
	_, err = Tune(ctx, tasks, db, r, Options{Trials: 24, Batch: 4, Seed: 1, Progress: func(p Progress) {
		if p.Done == 10 {
			cancel()
		}
	}})
	check.True(t, errors.Is(err, context.Canceled), err)
	check.NoError(t, db.Close())
	first, err := os.ReadFile(path)
	check.NoError(t, err)
	had := strings.Count(string(first), "\n")
	check.True(t, had >= 10 && had < 24, had)

	db, _, err = OpenDatabase(path, "cpu")
	check.NoError(t, err)
	sum, err := Tune(context.Background(), tasks, db, r, Options{Trials: 24 - had, Batch: 4, Seed: 2})
	check.NoError(t, err)
	check.NoError(t, db.Close())
	after, err := os.ReadFile(path)
	check.NoError(t, err)
	check.True(t, strings.HasPrefix(string(after), string(first)), "the first run's records changed")
	check.Equal(t, strings.Count(string(after), "\n"), 24)
	prev := 0
	for _, s := range sum {
		prev += s.Previous
	}
	check.Equal(t, prev, had)
	disk := NewDatabase("cpu")
	_, err = disk.Load(path)
	check.NoError(t, err)
	for _, tk := range tasks {
		seen := map[string]bool{}
		for _, rec := range disk.Records(tk.Workload.Hash) {
			k := candidateKey(rec.Schedule, rec.Decisions)
			check.True(t, !seen[k], tk.Name, "measured twice:", k)
			seen[k] = true
		}
	}
}

// driftRunner times the default schedule at 2 ms the first time (a busy
// moment) and at 1 ms after that, every other candidate at 1.5 ms.
type driftRunner struct {
	mu       sync.Mutex
	defaults int
}

func (r *driftRunner) Stream(ctx context.Context, task *Task, cands []*Candidate, each func(int, Result)) error {
	for i, c := range cands {
		t := 1.5e-3
		if c.Schedule == DefaultSchedule {
			r.mu.Lock()
			r.defaults++
			t = 1e-3
			if r.defaults == 1 {
				t = 2e-3
			}
			r.mu.Unlock()
		}
		each(i, Result{Times: []float64{t}})
	}
	return nil
}

// TestHeadToHead: a default schedule timed at a busy moment looks slower
// than the search's best; the head-to-head at the end times both again,
// one after the other, the default wins, and the database's best record
// (what kiln build applies) is the default schedule again.
func TestHeadToHead(t *testing.T) {
	task, err := NewTask("mm", matmulFunc(t, 32, 32, 32), 1, testTarget)
	check.NoError(t, err)
	for _, h2h := range []bool{false, true} {
		db := NewDatabase("cpu")
		r := &driftRunner{}
		sum, err := Tune(context.Background(), []*Task{task}, db, r, Options{Trials: 6, Batch: 3, Seed: 1, HeadToHead: h2h})
		check.NoError(t, err)
		best, ok := db.Best(task.Workload.Hash)
		check.True(t, ok)
		pairs := 0
		for _, rec := range db.Records(task.Workload.Hash) {
			if rec.Pair != 0 {
				pairs++
			}
		}
		if !h2h {
			check.True(t, best.Schedule != DefaultSchedule, "without a head-to-head the drifted timing decides")
			check.Equal(t, pairs, 0)
			check.True(t, sum[0].HeadToHead == nil)
			continue
		}
		check.Equal(t, pairs, 2)
		check.Equal(t, best.Schedule, DefaultSchedule)
		check.Equal(t, best.Median(), 1e-3)
		check.True(t, sum[0].HeadToHead != nil && sum[0].HeadToHead.Default < sum[0].HeadToHead.Best, sum[0].HeadToHead)
		out, _, err := Apply(ir.NewIRModule().With("mm", task.Func), db, testTarget, nil)
		check.NoError(t, err)
		dflt, err := task.Space.Default()
		check.NoError(t, err)
		check.True(t, ir.StructuralEqual(out.PrimFunc("mm"), dflt.Func), "Apply did not give the default schedule")
	}
}
