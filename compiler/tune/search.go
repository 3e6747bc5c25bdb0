package tune

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
)

// Task is one PrimFunc to tune, with its weight (how many times the
// program calls it).
type Task struct {
	Name string
	// Funcs are the names of the module's functions that are this
	// workload (a model's identical layers), Name first.
	Funcs    []string
	Func     *ir.PrimFunc
	Weight   int
	Workload Workload
	// Flops is the arithmetic of one call (for GFLOPS figures).
	Flops float64
	Space *Space
	// Site and Layout, for a kernel of a convolution or dense site in
	// one of its layouts (see LayoutTasks), name them; SiteDefault says the
	// layout is the site's default. The model's time counts a site at
	// its cheapest layout.
	Site, Layout string
	SiteDefault  bool
}

// NewTask makes the task of f (its design space for target); an
// untunable function is ErrUntunable.
func NewTask(name string, f *ir.PrimFunc, weight int, target rules.Target) (*Task, error) {
	sp, err := NewSpace(f, target)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	w := WorkloadOf(f)
	if w.Name == "" {
		// A graph's fused kernels are private: the records name them
		// after the module's function.
		w.Name = name
	}
	return &Task{Name: name, Funcs: []string{name}, Func: f, Weight: max(weight, 1), Workload: w, Flops: Flops(f), Space: sp}, nil
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

// Runner builds and measures candidates. Stream measures cands, calling
// each(i, result) once per candidate the moment its result is known (from
// any goroutine, possibly several at once), and returns when every
// candidate has its result; every call of each returns before Stream
// does. An error means it could not go on (the
// context ended, the fleet is gone): the results already given stand and
// are recorded; the candidates without one are not.
type Runner interface {
	Stream(ctx context.Context, t *Task, cands []*Candidate, each func(i int, r Result)) error
}

// AloneRunner is a Runner that can also time candidates alone: StreamAlone
// is Stream with every candidate built first and then timed one after the
// other on one device, so that no build or other timing shares the
// machine with a timing. The head-to-heads use it where the runner has
// it: a default schedule timed beside the compile of the candidate it is
// pitted against (on a host whose cores the compiler nodes and devices
// share) reads up to 2× slow.
type AloneRunner interface {
	Runner
	StreamAlone(ctx context.Context, t *Task, cands []*Candidate, each func(i int, r Result)) error
}

// Options control Tune.
type Options struct {
	// Trials is how many candidates to measure, over all tasks.
	Trials int
	// Batch is how many candidates are in flight at most (default 16):
	// a batch of them is proposed whenever half of those in flight are
	// measured, so the devices never wait for a batch's slowest build.
	Batch int
	// Seed seeds the random source.
	Seed uint64
	// Epsilon is the share of each batch drawn at random rather than by
	// the model (default 0.2).
	Epsilon float64
	// Population and Generations shape the evolutionary search (default
	// 64 and 3).
	Population, Generations int
	// Progress, when set, is called before the first trial and after
	// every measured trial (from Tune's goroutine).
	Progress func(Progress)
	// HeadToHead, at the end of the run, times each task's default
	// schedule and best candidate once more, one after the other, and
	// records the pair (see Record.Pair): the faster of the two is the
	// one Database.Best returns.
	HeadToHead bool
}

// Progress is the state of a tuning run after a trial.
type Progress struct {
	Done, Total int
	Elapsed     time.Duration
	// Search is the part of Elapsed Tune spent fitting the cost models
	// and proposing candidates (its own goroutine's work; builds and
	// measurements run meanwhile).
	Search time.Duration
	Tasks  []TaskSummary
	// Last is the trial just measured (nil before the first).
	Last *Trial
}

// Trial is one measured candidate as Progress reports it.
type Trial struct {
	Task string
	// Seconds is the candidate's median time (0 when it is invalid);
	// Error and Stage say why it is invalid.
	Seconds      float64
	Error, Stage string
	// Best is the task's best time after this trial (0: none valid yet),
	// Default its default schedule's (0: not measured yet), Trials how
	// many of its candidates this run has measured.
	Best, Default float64
	Trials        int
}

// Latency estimates the program's time per run from its tasks' times:
// the sum of weight × time over the tasks with a valid measurement, with
// each task's best time (best) and with its default schedule's (dflt;
// the best time for a task whose default is not measured). A
// convolution site (TaskSummary.Site) counts once, at its cheapest
// layout whose kernels are all measured for best, at its default layout
// for dflt. Kernels that are not tasks are not in it.
func (p Progress) Latency() (best, dflt float64) {
	sites := map[string]map[string]*[2]float64{} // site → layout → best, dflt
	siteDefault := map[string]string{}
	for _, t := range p.Tasks {
		w := float64(t.Weight)
		b, d := w*t.Best, w*t.Default
		if t.Default <= 0 {
			d = b
		}
		if t.Best <= 0 {
			b, d = math.Inf(1), math.Inf(1)
		}
		if t.Site == "" {
			if !math.IsInf(b, 1) {
				best += b
				dflt += d
			}
			continue
		}
		if sites[t.Site] == nil {
			sites[t.Site] = map[string]*[2]float64{}
		}
		v := sites[t.Site][t.Layout]
		if v == nil {
			v = &[2]float64{}
			sites[t.Site][t.Layout] = v
		}
		v[0] += b
		v[1] += d
		if t.SiteDefault {
			siteDefault[t.Site] = t.Layout
		}
	}
	for site, layouts := range sites {
		lo := math.Inf(1)
		for _, v := range layouts {
			lo = math.Min(lo, v[0])
		}
		if math.IsInf(lo, 1) {
			continue
		}
		best += lo
		if v := layouts[siteDefault[site]]; v != nil && !math.IsInf(v[1], 1) {
			dflt += v[1]
		} else {
			dflt += lo
		}
	}
	return best, dflt
}

// PerMinute is the pace so far in trials a minute.
func (p Progress) PerMinute() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Done) / p.Elapsed.Minutes()
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
	// Default is the default schedule's time (0 before it is measured):
	// Best is never above it.
	Default float64 `json:"default_seconds,omitempty"`
	// HeadToHead is the end of the run's timing of the default schedule
	// and the best candidate one after the other (nil when the default
	// was the best or the run was interrupted).
	HeadToHead *HeadToHead `json:"head_to_head,omitempty"`
	// History is the best time after each trial of this run.
	History []float64 `json:"-"`
	// TrialsTo90 is the trial of this run after which the best time was
	// within 90% of the final best's throughput.
	TrialsTo90 int `json:"trials_to_90,omitempty"`
	// Site and Layout name the convolution site and kernel layout of a
	// task of one (Task.Site); SiteDefault says it is the default layout.
	Site        string `json:"site,omitempty"`
	Layout      string `json:"layout,omitempty"`
	SiteDefault bool   `json:"site_default,omitempty"`
}

// HeadToHead is a head-to-head's two times (seconds): the build takes the
// best candidate only if it won (Best < Default).
type HeadToHead struct {
	Default float64 `json:"default_seconds"`
	Best    float64 `json:"best_seconds"`
}

// ErrNoTrials is Tune's error for a budget below one trial.
var ErrNoTrials = errors.New("the trial budget is 0: nothing to measure")

// taskState is the search state of one task.
type taskState struct {
	task     *Task
	measured map[string]bool
	pending  map[string]bool // in flight
	dirty    bool            // measured since the model was last fitted
	feats    [][]float64
	times    []float64 // +Inf for invalid
	points   []point
	best     float64
	dflt     float64 // the default schedule's time (+Inf: not measured)
	model    *Model
	sum      TaskSummary
	// launched counts the batches of this run; rounds is the best time
	// after each of them ended (see pick); exhausted is set once the
	// space has no candidate left to propose.
	launched  int
	rounds    []float64
	exhausted bool
}

// Tune searches every task's space, measuring opts.Trials candidates in
// all through runner, appending each measured candidate to db the moment
// its result comes, and spending trials where the expected fall of the
// program's latency (weight × time) is largest (see pick). Candidates are
// kept in flight as a pipeline: whenever half of the opts.Batch in flight
// have a result, the model is retrained and a new batch proposed, so a
// slow build holds up nothing but itself.
// Records already in db for a task's workload count as measured: they
// train the model and are never measured again (resume). A cancelled ctx
// stops the search; every result that came before it ended is in db.
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
		st := &taskState{task: t, measured: map[string]bool{}, pending: map[string]bool{}, best: math.Inf(1), dflt: math.Inf(1), model: NewModel(),
			sum: TaskSummary{Name: t.Name, Workload: t.Workload.Hash, Weight: t.Weight, Site: t.Site, Layout: t.Layout, SiteDefault: t.SiteDefault}}
		for _, r := range db.Records(t.Workload.Hash) {
			st.learnRecord(r)
			st.sum.Previous++
		}
		st.fit()
		states[i] = st
	}
	p := pipeline{ctx: ctx, db: db, runner: runner, opts: opts, states: states, start: time.Now(),
		arrived: make(chan arrival), ended: make(chan batchEnd)}
	p.run(rng)
	if err := ctx.Err(); err != nil {
		return summaries(states), err
	}
	if p.err == nil && opts.HeadToHead {
		for _, st := range states {
			if err := p.headToHead(st); err != nil {
				if ctx.Err() != nil {
					return summaries(states), ctx.Err()
				}
				return summaries(states), err
			}
		}
		if err := p.layoutHeadToHead(tasks); err != nil {
			if ctx.Err() != nil {
				return summaries(states), ctx.Err()
			}
			return summaries(states), err
		}
	}
	return summaries(states), p.err
}

// headToHead times the default schedule and the task's best candidate
// once more, one after the other, and records both with one Pair id (see
// Record.Pair), when the best is not the default: timings taken minutes
// apart on a loaded machine differ by more than the schedules do, and the
// default must not lose to a candidate that was only timed at a quieter
// moment. The task's summary says which one won.
func (p *pipeline) headToHead(st *taskState) error {
	if math.IsInf(st.dflt, 1) || st.best >= st.dflt {
		return nil
	}
	top := st.topMeasured(1)
	if len(top) == 0 {
		return nil
	}
	dflt, err := st.task.Space.Default()
	if err != nil {
		return nil
	}
	best, err := st.task.Space.replay(top[0].schedule, top[0].decisions)
	if err != nil {
		return nil
	}
	cands := []*Candidate{dflt, best}
	res, got, err := p.measure(st.task, cands)
	if err != nil {
		return err
	}
	id := time.Now().UnixNano()
	var recs []Record
	for i, c := range cands {
		if !got[i] {
			return nil
		}
		r := p.newRecord(st.task, c, res[i])
		r.Pair = id
		if err := p.db.Append(r); err != nil {
			return err
		}
		recs = append(recs, r)
	}
	if recs[0].Valid() && recs[1].Valid() {
		st.sum.HeadToHead = &HeadToHead{Default: recs[0].Median(), Best: recs[1].Median()}
	}
	return nil
}

// measure times cands of task through the runner, outside the search's
// pipeline (alone, with an AloneRunner): each one's result, and whether
// it came.
func (p *pipeline) measure(task *Task, cands []*Candidate) ([]Result, []bool, error) {
	res := make([]Result, len(cands))
	got := make([]bool, len(cands))
	var mu sync.Mutex
	stream := p.runner.Stream
	if a, ok := p.runner.(AloneRunner); ok {
		stream = a.StreamAlone
	}
	err := stream(p.ctx, task, cands, func(i int, r Result) {
		mu.Lock()
		defer mu.Unlock()
		if i >= 0 && i < len(res) {
			res[i], got[i] = r, true
		}
	})
	return res, got, err
}

// layoutPairRounds is how many times a layout head-to-head times each
// layout's kernels: one timing of each can be off by 2× (a hiccup of the
// machine), and the choice goes by the median over the rounds.
const layoutPairRounds = 3

// layoutHeadToHead times again, for every site whose cheapest layout by
// the best records is not its default, the best record of each kernel of
// the default layout and then of that one, one after the other, in
// layoutPairRounds rounds (the other layout first in every other round),
// and records them with one LayoutPair id: the layouts' kernels were
// timed minutes apart, under other loads, and the default must not lose
// to a layout only timed at a quieter moment.
func (p *pipeline) layoutHeadToHead(tasks []*Task) error {
	_, made := ChooseLayouts(VariantsOf(tasks), p.db)
	for _, c := range made {
		if c.Layout == c.DefaultLayout {
			continue
		}
		id := time.Now().UnixNano()
		for round := range layoutPairRounds {
			// Each round the other layout first, so that a drift of the
			// machine's speed over the rounds favours neither.
			order := []string{c.DefaultLayout, c.Layout}
			if round%2 == 1 {
				order[0], order[1] = order[1], order[0]
			}
			if err := p.timeLayouts(tasks, c.Site, order, id); err != nil {
				return err
			}
		}
	}
	return nil
}

// timeLayouts times the best record of each kernel of site's layouts, in
// order, one kernel after the other, and records them with LayoutPair id.
func (p *pipeline) timeLayouts(tasks []*Task, site string, order []string, id int64) error {
	for _, layout := range order {
		for _, t := range tasks {
			if t.Site != site || t.Layout != layout {
				continue
			}
			best, ok := p.db.Best(t.Workload.Hash)
			if !ok {
				continue
			}
			cand, err := t.Space.Candidate(best)
			if err != nil {
				continue
			}
			res, got, err := p.measure(t, []*Candidate{cand})
			if err != nil {
				return err
			}
			if !got[0] {
				continue
			}
			r := p.newRecord(t, cand, res[0])
			r.LayoutPair = id
			if err := p.db.Append(r); err != nil {
				return err
			}
		}
	}
	return nil
}

// pipeline is one Tune call's candidates in flight: batches streamed by
// the runner in goroutines of their own, their results taken in order of
// arrival by the loop of run.
type pipeline struct {
	ctx    context.Context
	db     *Database
	runner Runner
	opts   Options
	states []*taskState
	start  time.Time

	arrived chan arrival
	ended   chan batchEnd
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	done, inflight, batches int
	search                  time.Duration // fitting and proposing
	stop                    bool
	err                     error // the first error that stopped the search
}

// arrival is one candidate's result.
type arrival struct {
	st  *taskState
	c   *Candidate
	res Result
}

// batchEnd is the end of one Stream call: the candidates it left without
// a result, and its error.
type batchEnd struct {
	st   *taskState
	lost []*Candidate
	err  error
}

func (p *pipeline) run(rng *rand.Rand) {
	rctx, cancel := context.WithCancel(p.ctx)
	p.cancel = cancel
	defer func() {
		cancel()
		p.wg.Wait()
	}()
	p.report(nil)
	for {
		for !p.stop && p.ctx.Err() == nil && p.inflight <= p.opts.Batch/2 && p.done+p.inflight < p.opts.Trials {
			st := pick(p.states, rng)
			if st == nil {
				// Every space is exhausted (each candidate measured).
				p.stop = true
				break
			}
			n := min(p.opts.Batch-p.inflight, p.opts.Trials-p.done-p.inflight)
			if st.launched == 0 {
				// First rounds take at most half the budget between them:
				// with few trials for many tasks, a round is the default
				// schedule alone, which still gives the task its weight.
				n = min(n, max(1, p.opts.Trials/(2*len(p.states))))
			}
			t := time.Now()
			st.refit()
			cands := st.propose(rng, n, p.opts)
			p.search += time.Since(t)
			if len(cands) == 0 {
				if len(st.pending) > 0 {
					break // what is in flight may teach the model more
				}
				st.exhausted = true
				continue
			}
			st.launched++
			p.launch(rctx, st, cands)
		}
		if p.batches == 0 {
			return
		}
		select {
		case a := <-p.arrived:
			p.record(a)
		case e := <-p.ended:
			p.batches--
			for _, c := range e.lost {
				delete(e.st.pending, c.Key())
				p.inflight--
			}
			e.st.endRound()
			if e.err != nil {
				p.fail(e.err)
			}
		}
	}
}

// launch streams cands of st's task through the runner.
func (p *pipeline) launch(ctx context.Context, st *taskState, cands []*Candidate) {
	for _, c := range cands {
		st.pending[c.Key()] = true
	}
	p.inflight += len(cands)
	p.batches++
	p.wg.Go(func() {
		var once sync.Mutex
		given := make([]bool, len(cands))
		err := p.runner.Stream(ctx, st.task, cands, func(i int, r Result) {
			once.Lock()
			dup := i < 0 || i >= len(cands) || given[i]
			if !dup {
				given[i] = true
			}
			once.Unlock()
			if !dup {
				p.arrived <- arrival{st, cands[i], r}
			}
		})
		// The candidates left without a result are no longer in flight.
		once.Lock()
		var lost []*Candidate
		for i, g := range given {
			if !g {
				lost = append(lost, cands[i])
			}
		}
		once.Unlock()
		if err == nil && len(lost) > 0 {
			err = fmt.Errorf("tune: the runner gave no result for %d of %d candidates", len(lost), len(cands))
		}
		p.ended <- batchEnd{st, lost, err}
	})
}

// record appends a's result to the database and teaches it to its task.
func (p *pipeline) record(a arrival) {
	st, c, res := a.st, a.c, a.res
	delete(st.pending, c.Key())
	p.inflight--
	r := p.newRecord(st.task, c, res)
	if err := p.db.Append(r); err != nil {
		p.fail(err)
		return
	}
	st.learnRecord(r)
	st.dirty = true
	st.sum.Trials++
	if !r.Valid() {
		st.sum.Invalid++
	}
	st.sum.History = append(st.sum.History, st.best)
	p.done++
	tr := &Trial{Task: st.task.Name, Error: r.Error, Stage: r.Stage, Trials: st.sum.Trials}
	if !math.IsInf(st.dflt, 1) {
		tr.Default = st.dflt
	}
	if r.Valid() {
		tr.Seconds = r.Median()
	}
	if !math.IsInf(st.best, 1) {
		tr.Best = st.best
	}
	p.report(tr)
}

// newRecord is the database record of candidate c of task t measured as
// res.
func (p *pipeline) newRecord(t *Task, c *Candidate, res Result) Record {
	return Record{Workload: t.Workload, Target: p.db.Target(), Device: res.Device, Decisions: c.Decisions, Schedule: c.Schedule,
		Trace: c.Trace, Times: res.Times, Error: res.Error, Stage: res.Stage, Unix: time.Now().Unix(), Validity: res.Validity}
}

// fail stops the search at its first error: no more batches, and those
// in flight are told to stop (their results still come and are kept).
func (p *pipeline) fail(err error) {
	if p.err == nil && p.ctx.Err() == nil {
		p.err = err
	}
	p.stop = true
	p.cancel()
}

func (p *pipeline) report(last *Trial) {
	if p.opts.Progress == nil {
		return
	}
	pr := Progress{Done: p.done, Total: p.opts.Trials, Elapsed: time.Since(p.start), Search: p.search, Last: last}
	for _, st := range p.states {
		pr.Tasks = append(pr.Tasks, st.summary())
	}
	p.opts.Progress(pr)
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
	if !math.IsInf(st.dflt, 1) {
		s.Default = st.dflt
	}
	if !math.IsInf(st.best, 1) {
		s.Best = st.best
		if h := s.HeadToHead; h != nil {
			// The head-to-head's times are the comparable ones, and
			// the build takes the faster of the two.
			s.Best, s.Default = math.Min(h.Best, h.Default), h.Default
		}
		if st.task.Flops > 0 {
			s.GFLOPS = st.task.Flops / s.Best / 1e9
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
	st.points = append(st.points, point{r.Schedule, r.Decisions})
	if t < st.best {
		st.best = t
	}
	if r.Schedule == DefaultSchedule && t < st.dflt {
		st.dflt = t
	}
}

// refit retrains the model when the task has data it was not fitted on.
func (st *taskState) refit() {
	if st.dirty {
		st.fit()
		st.dirty = false
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
		if st.measured[k] || st.pending[k] || seen[k] {
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
	dflt, _ := st.task.Space.Default()
	take(dflt)
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
	// The default schedule is always a parent: the search explores
	// around it (its mutations are the default rules' neighbours).
	add(dflt)
	for _, pt := range st.topMeasured(16) {
		if c, err := st.task.Space.replay(pt.schedule, pt.decisions); err == nil {
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
			if c, err := st.task.Space.complete(rng, a.c.Schedule, m); err == nil {
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

// point is a measured candidate's place in the space: the half of the
// space (Candidate.Schedule) and its decisions there.
type point struct {
	schedule  string
	decisions []Decision
}

// topMeasured returns the points of the k best valid measurements.
func (st *taskState) topMeasured(k int) []point {
	idx := make([]int, 0, len(st.times))
	for i, t := range st.times {
		if !math.IsInf(t, 1) {
			idx = append(idx, i)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool { return st.times[idx[a]] < st.times[idx[b]] })
	var out []point
	for _, i := range idx {
		if len(out) == k {
			break
		}
		out = append(out, st.points[i])
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
