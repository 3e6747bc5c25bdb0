package tune

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
)

// Task is one PrimFunc to tune, with its weight (how many times the
// program calls it).
type Task struct {
	Name     string
	Func     *ir.PrimFunc
	Weight   int
	Workload Workload
	// Flops is the arithmetic of one call (for GFLOPS figures).
	Flops float64
	Space *Space
}

// NewTask makes the task of f (its design space for target); an
// untunable function is ErrUntunable.
func NewTask(name string, f *ir.PrimFunc, weight int, target rules.Target) (*Task, error) {
	sp, err := NewSpace(f, target)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &Task{Name: name, Func: f, Weight: max(weight, 1), Workload: WorkloadOf(f), Flops: Flops(f), Space: sp}, nil
}

// Flops counts the arithmetic operations of one call of f: for each
// block, its iterations times the operators of its body.
func Flops(f *ir.PrimFunc) float64 {
	total := 0.0
	leafBlocks(f, func(br *ir.BlockRealize, loops []*ir.For) {
		_, w := blockFeatureVector(br, loops)
		total += w
	})
	return total
}

// Result is what measuring one candidate gave.
type Result struct {
	// Times are seconds per call, one per repeat (empty on failure).
	Times []float64
	// Error and Stage say why and where the candidate failed: "build",
	// "run" (the kernel failed or crashed) or "check" (wrong result).
	Error, Stage string
	// Device describes the board that measured it.
	Device map[string]string
	// Validity is the time evaluator's verdict on Times.
	Validity
}

// Runner builds and measures candidates. Run returns one result per
// candidate, in order; an error means the batch could not be measured
// at all (the context ended, the fleet is gone) and nothing is recorded.
type Runner interface {
	Run(ctx context.Context, t *Task, cands []*Candidate) ([]Result, error)
}

// Options control Tune.
type Options struct {
	// Trials is how many candidates to measure, over all tasks.
	Trials int
	// Batch is how many candidates are measured together (default 16).
	Batch int
	// Seed seeds the random source.
	Seed uint64
	// Epsilon is the share of each batch drawn at random rather than by
	// the model (default 0.2).
	Epsilon float64
	// Population and Generations shape the evolutionary search (default
	// 64 and 3).
	Population, Generations int
	// Progress, when set, is called after every measured batch.
	Progress func(Progress)
}

// Progress is the state of a tuning run after a batch.
type Progress struct {
	Done, Total int
	Elapsed     time.Duration
	Tasks       []TaskSummary
}

// ETA estimates the time left from the pace so far.
func (p Progress) ETA() time.Duration {
	if p.Done == 0 {
		return 0
	}
	return time.Duration(float64(p.Elapsed) / float64(p.Done) * float64(p.Total-p.Done))
}

// TaskSummary is one task's state.
type TaskSummary struct {
	Name     string  `json:"name"`
	Workload string  `json:"workload"`
	Weight   int     `json:"weight"`
	Trials   int     `json:"trials"`
	Invalid  int     `json:"invalid"`
	Previous int     `json:"previous,omitempty"` // records from the database before this run
	Best     float64 `json:"best_seconds,omitempty"`
	GFLOPS   float64 `json:"gflops,omitempty"`
	// History is the best time after each trial of this run.
	History []float64 `json:"-"`
	// TrialsTo90 is the trial of this run after which the best time was
	// within 90% of the final best's throughput.
	TrialsTo90 int `json:"trials_to_90,omitempty"`
}

// ErrNoTrials is Tune's error for a budget below one trial.
var ErrNoTrials = errors.New("the trial budget is 0: nothing to measure")

// taskState is the search state of one task.
type taskState struct {
	task     *Task
	measured map[string]bool
	feats    [][]float64
	times    []float64 // +Inf for invalid
	decs     [][]Decision
	best     float64
	model    *Model
	sum      TaskSummary
}

// Tune searches every task's space, measuring opts.Trials candidates in
// all through runner, appending each measured candidate to db, and
// spending trials where weight × best time is largest. Records already
// in db for a task's workload count as measured: they train the model
// and are never measured again (resume). A cancelled ctx stops after the
// batch in flight is dropped; everything recorded stays.
func Tune(ctx context.Context, tasks []*Task, db *Database, runner Runner, opts Options) ([]TaskSummary, error) {
	if opts.Trials < 1 {
		return nil, ErrNoTrials
	}
	if len(tasks) == 0 {
		return nil, errors.New("tune: no tasks")
	}
	if opts.Batch <= 0 {
		opts.Batch = 16
	}
	if opts.Epsilon <= 0 {
		opts.Epsilon = 0.2
	}
	if opts.Population <= 0 {
		opts.Population = 64
	}
	if opts.Generations <= 0 {
		opts.Generations = 3
	}
	rng := rand.New(rand.NewPCG(opts.Seed, 0x6b696c6e))
	states := make([]*taskState, len(tasks))
	for i, t := range tasks {
		st := &taskState{task: t, measured: map[string]bool{}, best: math.Inf(1), model: NewModel(),
			sum: TaskSummary{Name: t.Name, Workload: t.Workload.Hash, Weight: t.Weight}}
		for _, r := range db.Records(t.Workload.Hash) {
			st.learnRecord(r)
			st.sum.Previous++
		}
		st.fit()
		states[i] = st
	}
	start := time.Now()
	done := 0
	report := func() {
		if opts.Progress == nil {
			return
		}
		p := Progress{Done: done, Total: opts.Trials, Elapsed: time.Since(start)}
		for _, st := range states {
			p.Tasks = append(p.Tasks, st.summary())
		}
		opts.Progress(p)
	}
	report()
	stuck := 0
	for done < opts.Trials {
		if err := ctx.Err(); err != nil {
			return summaries(states), err
		}
		st := pick(states)
		n := min(opts.Batch, opts.Trials-done)
		cands := st.propose(rng, n, opts)
		if len(cands) == 0 {
			// This space is exhausted (every candidate measured).
			stuck++
			if stuck >= len(states) {
				break
			}
			st.exhausted()
			continue
		}
		stuck = 0
		res, err := runner.Run(ctx, st.task, cands)
		if err != nil {
			return summaries(states), err
		}
		if len(res) != len(cands) {
			return summaries(states), fmt.Errorf("tune: the runner returned %d results for %d candidates", len(res), len(cands))
		}
		for i, c := range cands {
			r := Record{Workload: st.task.Workload, Target: db.Target(), Device: res[i].Device, Decisions: c.Decisions, Schedule: c.Schedule,
				Trace: c.Trace, Times: res[i].Times, Error: res[i].Error, Stage: res[i].Stage, Unix: time.Now().Unix()}
			r.Validity = res[i].Validity
			if err := db.Append(r); err != nil {
				return summaries(states), err
			}
			st.learnRecord(r)
			st.sum.Trials++
			if !r.Valid() {
				st.sum.Invalid++
			}
			st.sum.History = append(st.sum.History, st.best)
			done++
		}
		st.fit()
		report()
	}
	return summaries(states), nil
}

func summaries(states []*taskState) []TaskSummary {
	var out []TaskSummary
	for _, st := range states {
		out = append(out, st.summary())
	}
	return out
}

func (st *taskState) summary() TaskSummary {
	s := st.sum
	s.History = append([]float64(nil), s.History...)
	if !math.IsInf(st.best, 1) {
		s.Best = st.best
		if st.task.Flops > 0 {
			s.GFLOPS = st.task.Flops / st.best / 1e9
		}
		for i, b := range s.History {
			if !math.IsInf(b, 1) && st.best/b >= 0.9 {
				s.TrialsTo90 = i + 1
				break
			}
		}
	}
	return s
}

// exhausted marks a task that has nothing left to propose so pick skips
// it.
func (st *taskState) exhausted() { st.task.Weight = 0 }

// pick returns the task to measure next: one with no valid measurement
// yet, else the one where weight × best time is largest.
func pick(states []*taskState) *taskState {
	var best *taskState
	score := -1.0
	for _, st := range states {
		if st.task.Weight == 0 {
			continue
		}
		if math.IsInf(st.best, 1) {
			return st
		}
		if s := float64(st.task.Weight) * st.best; s > score {
			best, score = st, s
		}
	}
	if best == nil {
		return states[0]
	}
	return best
}

// learnRecord adds a measured record (of this run or from the
// database) to the task's data.
func (st *taskState) learnRecord(r Record) {
	key := candidateKey(r.Schedule, r.Decisions)
	if st.measured[key] {
		return
	}
	st.measured[key] = true
	c, err := st.task.Space.Candidate(r)
	if err != nil {
		return // a record of another version of the rules
	}
	st.feats = append(st.feats, Features(c.Func))
	t := r.Median()
	st.times = append(st.times, t)
	st.decs = append(st.decs, r.Decisions)
	if t < st.best {
		st.best = t
	}
}

// fit retrains the task's model on normalized throughput.
func (st *taskState) fit() {
	if len(st.feats) == 0 || math.IsInf(st.best, 1) {
		return
	}
	y := make([]float64, len(st.times))
	for i, t := range st.times {
		if !math.IsInf(t, 1) {
			y[i] = st.best / t
		}
	}
	st.model.Fit(st.feats, y)
}

type scored struct {
	c     *Candidate
	score float64
}

// propose returns up to n unmeasured candidates: random samples until
// the model has data, then the evolutionary search's best predictions
// with a share of random ones (epsilon-greedy).
func (st *taskState) propose(rng *rand.Rand, n int, opts Options) []*Candidate {
	seen := map[string]bool{}
	var out []*Candidate
	take := func(c *Candidate) bool {
		k := c.Key()
		if st.measured[k] || seen[k] {
			return false
		}
		seen[k] = true
		out = append(out, c)
		return true
	}
	random := func(want int) {
		for tries := 0; len(out) < want && tries < 20*want+20; tries++ {
			if c, err := st.task.Space.Sample(rng); err == nil {
				take(c)
			}
		}
	}
	// The default schedule first: the search never ends slower than it.
	if c, err := st.task.Space.Default(); err == nil {
		take(c)
	}
	valid := 0
	for _, t := range st.times {
		if !math.IsInf(t, 1) {
			valid++
		}
	}
	if !st.model.Trained() || valid < 4 {
		random(n)
		return out
	}
	// Seed the population with the best measured candidates and random
	// samples, then evolve it by mutation under the model.
	pool := map[string]scored{}
	add := func(c *Candidate) {
		k := c.Key()
		if _, ok := pool[k]; ok {
			return
		}
		pool[k] = scored{c, st.model.Predict(Features(c.Func))}
	}
	for _, d := range st.topMeasured(16) {
		if c, err := st.task.Space.Replay(d); err == nil {
			add(c)
		}
	}
	for range opts.Population {
		if c, err := st.task.Space.Sample(rng); err == nil {
			add(c)
		}
	}
	for range opts.Generations {
		parents := topScored(pool, opts.Population)
		for range opts.Population {
			// Tournament of two: the better predicted parent mutates.
			a, b := parents[rng.IntN(len(parents))], parents[rng.IntN(len(parents))]
			if b.score > a.score {
				a = b
			}
			m, ok := Mutate(rng, a.c.Decisions)
			if !ok {
				continue
			}
			if c, err := st.task.Space.complete(rng, m); err == nil {
				add(c)
			}
		}
	}
	explore := int(math.Round(opts.Epsilon * float64(n)))
	for _, s := range topScored(pool, len(pool)) {
		if len(out) >= n-explore {
			break
		}
		take(s.c)
	}
	random(n)
	return out
}

// topMeasured returns the decisions of the k best valid measurements.
func (st *taskState) topMeasured(k int) [][]Decision {
	idx := make([]int, 0, len(st.times))
	for i, t := range st.times {
		if !math.IsInf(t, 1) {
			idx = append(idx, i)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool { return st.times[idx[a]] < st.times[idx[b]] })
	var out [][]Decision
	for _, i := range idx {
		if len(out) == k {
			break
		}
		if len(st.decs[i]) > 0 { // not the default schedule
			out = append(out, st.decs[i])
		}
	}
	return out
}

func topScored(pool map[string]scored, k int) []scored {
	out := make([]scored, 0, len(pool))
	for _, s := range pool {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].score != out[j].score {
			return out[i].score > out[j].score
		}
		return out[i].c.Key() < out[j].c.Key()
	})
	return out[:min(k, len(out))]
}
