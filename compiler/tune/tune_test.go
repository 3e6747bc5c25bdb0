package tune

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// localRunner builds candidates in this process, runs them on the host
// and checks them against the unscheduled function's result.
type localRunner struct {
	t    *testing.T
	dir  string
	args []packedfunc.Value
	outs []*ndarray.NDArray
	want [][]float32
	fail func(c *Candidate) bool // candidates to report as crashed
	mu   sync.Mutex              // one batch at a time: the arrays are shared
	n    int                     // modules built
}

func (r *localRunner) build(f *ir.PrimFunc, name string) (*cpu.Module, *packedfunc.Func, error) {
	mod := ir.NewIRModule().With(name, f.WithAttr(ir.AttrGlobalSymbol, name))
	res, err := compiler.BuildWithResult(context.Background(), mod, compiler.Target{Kind: "cpu"}, compiler.BuildOptions{NoCache: true})
	if err != nil {
		return nil, nil, err
	}
	m, err := cpu.LoadArtifact(res.Artifact, r.dir)
	if err != nil {
		return nil, nil, err
	}
	fn, err := m.GetFunction(name)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, fn, nil
}

func (r *localRunner) Stream(ctx context.Context, task *Task, cands []*Candidate, each func(int, Result)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.args == nil {
		rng := rand.New(rand.NewPCG(1, 1))
		f := task.Func
		for i, p := range f.Params {
			b := f.BufferMap[p]
			shape := make(ndarray.Shape, len(b.Shape))
			for d, e := range b.Shape {
				shape[d], _ = ir.IsConstInt(e)
			}
			data := make([]float32, shape.NumElements())
			for j := range data {
				data[j] = rng.Float32()
			}
			a, err := ndarray.FromSlice(data, shape)
			check.NoError(r.t, err)
			r.args = append(r.args, packedfunc.Array(a))
			if i == len(f.Params)-1 {
				r.outs = append(r.outs, a)
			}
		}
		m, fn, err := r.build(f, "ref")
		check.NoError(r.t, err)
		defer m.Close()
		_, err = fn.Call(r.args...)
		check.NoError(r.t, err)
		for _, o := range r.outs {
			d, err := ndarray.ToSlice[float32](o)
			check.NoError(r.t, err)
			r.want = append(r.want, d)
		}
	}
	for i, c := range cands {
		if err := ctx.Err(); err != nil {
			return err
		}
		each(i, r.measure(c))
	}
	return nil
}

// measure builds, runs, checks and times one candidate.
func (r *localRunner) measure(c *Candidate) Result {
	if r.fail != nil && r.fail(c) {
		return Result{Error: "worker killed by signal SIGSEGV", Stage: "run"}
	}
	r.n++
	m, fn, err := r.build(c.Func, fmt.Sprintf("cand%d", r.n))
	if err != nil {
		return Result{Error: err.Error(), Stage: "build"}
	}
	defer m.Close()
	{
		for _, o := range r.outs {
			nan, err := ndarray.FromSlice(make([]float32, o.NumElements()), o.Shape())
			check.NoError(r.t, err)
			d, _ := nan.HostBytes()
			for j := range d {
				d[j] = 0xff // NaN
			}
			check.NoError(r.t, o.CopyFrom(nan))
		}
	}
	if _, err := fn.Call(r.args...); err != nil {
		return Result{Error: err.Error(), Stage: "run"}
	}
	if msg := r.check(); msg != "" {
		return Result{Error: msg, Stage: "check"}
	}
	start := time.Now()
	for range 3 {
		fn.Call(r.args...)
	}
	return Result{Times: []float64{time.Since(start).Seconds() / 3}, Device: map[string]string{"device": "test"}}
}

func (r *localRunner) check() string {
	for k, o := range r.outs {
		got, _ := ndarray.ToSlice[float32](o)
		for j, w := range r.want[k] {
			if !(math.Abs(float64(got[j]-w)) <= 1e-4*math.Max(1, math.Abs(float64(w)))) {
				return fmt.Sprintf("element %d = %g, want %g", j, got[j], w)
			}
		}
	}
	return ""
}

// TestTuneLocal tunes a small matmul with a budget of 12 trials: every
// trial is recorded once, the best is correct, a resumed run adds new
// candidates only, and Apply replays the best record.
func TestTuneLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds C kernels")
	}
	f := matmulFunc(t, 32, 32, 16).WithAttr(ir.AttrGlobalSymbol, "mm")
	task, err := NewTask("mm", f, 1, testTarget)
	check.NoError(t, err)
	path := filepath.Join(t.TempDir(), "db.jsonl")
	db, notes, err := OpenDatabase(path, "cpu")
	check.NoError(t, err)
	check.Equal(t, len(notes), 0)
	r := &localRunner{t: t, dir: t.TempDir()}
	var progress []Progress
	sum, err := Tune(context.Background(), []*Task{task}, db, r, Options{Trials: 12, Batch: 4, Seed: 1, Progress: func(p Progress) { progress = append(progress, p) }})
	check.NoError(t, err)
	check.NoError(t, db.Close())
	check.Equal(t, sum[0].Trials, 12)
	check.True(t, sum[0].Best > 0 && sum[0].GFLOPS > 0, sum[0])
	check.Equal(t, len(progress), 13) // before the first trial, then one per trial
	check.True(t, progress[0].Last == nil, progress[0])
	for i, p := range progress[1:] {
		check.Equal(t, p.Done, i+1)
		check.True(t, p.Last != nil && p.Last.Task == "mm", p)
		check.True(t, (p.Last.Seconds > 0) == (p.Last.Error == ""), p.Last)
	}

	db2, notes, err := OpenDatabase(path, "cpu")
	check.NoError(t, err)
	check.Equal(t, len(notes), 0, notes)
	check.Equal(t, db2.Len(), 12)
	sum, err = Tune(context.Background(), []*Task{task}, db2, r, Options{Trials: 4, Batch: 4, Seed: 2})
	check.NoError(t, err)
	check.Equal(t, sum[0].Previous, 12)
	check.NoError(t, db2.Close())
	keys := map[string]bool{}
	for _, rec := range db2.Records(task.Workload.Hash) {
		k := candidateKey(rec.Schedule, rec.Decisions)
		check.True(t, !keys[k], "measured twice:", k)
		keys[k] = true
	}
	check.Equal(t, len(keys), 16)

	mod := ir.NewIRModule().With("mm", f)
	out, applied, err := Apply(mod, db2, testTarget, nil)
	check.NoError(t, err)
	check.Equal(t, len(applied.Missing), 0)
	best, _ := db2.Best(task.Workload.Hash)
	c, err := task.Space.Candidate(best)
	check.NoError(t, err)
	check.True(t, ir.StructuralEqual(out.PrimFunc("mm"), c.Func), "Apply did not give the best record's schedule")
}

// fakeRunner "measures" without building: the time is a function of the
// candidate's features, and some candidates fail.
type fakeRunner struct {
	mu    sync.Mutex
	runs  map[string]int
	given int // results given
}

func (r *fakeRunner) Stream(ctx context.Context, task *Task, cands []*Candidate, each func(int, Result)) error {
	for i, c := range cands {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := c.Key()
		r.mu.Lock()
		r.runs[k]++
		r.given++
		r.mu.Unlock()
		h := fnv.New32a()
		h.Write([]byte(k))
		if h.Sum32()%4 == 0 {
			each(i, Result{Error: "wrong result", Stage: "check"})
			continue
		}
		v := Features(c.Func)
		each(i, Result{Times: []float64{1e-3 * (1 + math.Abs(v[3]-3) + math.Abs(v[21]-5) + v[6]/4)}})
	}
	return nil
}

// TestTuneNeverRetries: over 80 trials of a fake runner, no candidate is
// measured twice, invalid ones included, and the search beats its first
// random batch.
func TestTuneNeverRetries(t *testing.T) {
	task, err := NewTask("mm", matmulFunc(t, 64, 64, 64), 1, testTarget)
	check.NoError(t, err)
	db := NewDatabase("cpu")
	r := &fakeRunner{runs: map[string]int{}}
	sum, err := Tune(context.Background(), []*Task{task}, db, r, Options{Trials: 80, Batch: 16, Seed: 3})
	check.NoError(t, err)
	check.Equal(t, sum[0].Trials, 80)
	check.True(t, sum[0].Invalid > 0, "no invalid candidate")
	for k, n := range r.runs {
		check.Equal(t, n, 1, "runs of", k)
	}
	first := math.Inf(1)
	for _, rec := range db.Records(task.Workload.Hash)[:16] {
		first = math.Min(first, rec.Median())
	}
	check.True(t, sum[0].Best <= first, "best", sum[0].Best, "first batch", first)
}

// defaultRunner times the default schedule at dflt and every other
// candidate at other.
type defaultRunner struct {
	dflt, other float64
	mu          sync.Mutex
	batches     [][]string // the candidates' keys, per batch
}

func (r *defaultRunner) Stream(ctx context.Context, task *Task, cands []*Candidate, each func(int, Result)) error {
	var keys []string
	for _, c := range cands {
		keys = append(keys, c.Key())
	}
	r.mu.Lock()
	r.batches = append(r.batches, keys)
	r.mu.Unlock()
	for i, c := range cands {
		res := Result{Times: []float64{r.other}}
		if c.Schedule == DefaultSchedule {
			res.Times = []float64{r.dflt}
		}
		each(i, res)
	}
	return nil
}

// TestTuneSeedsDefault: the default schedule is measured in the first
// batch, once (a resumed run does not measure it again), recorded as
// such; when it is the fastest, it is the best record and Apply gives
// the function the default schedule.
func TestTuneSeedsDefault(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    *ir.PrimFunc
	}{{"matmul", matmulFunc(t, 64, 64, 64)}, {"rowmax", rowMax(t, 64, 256)}} {
		t.Run(tc.name, func(t *testing.T) {
			task, err := NewTask(tc.name, tc.f, 1, testTarget)
			check.NoError(t, err)
			dflt, err := task.Space.Default()
			check.NoError(t, err)
			check.Equal(t, dflt.Schedule, DefaultSchedule)
			db := NewDatabase("cpu")
			r := &defaultRunner{dflt: 1e-3, other: 2e-3}
			_, err = Tune(context.Background(), []*Task{task}, db, r, Options{Trials: 8, Batch: 4, Seed: 1})
			check.NoError(t, err)
			check.Equal(t, r.batches[0][0], dflt.Key())
			_, err = Tune(context.Background(), []*Task{task}, db, r, Options{Trials: 4, Batch: 4, Seed: 2})
			check.NoError(t, err)
			n := 0
			for _, b := range r.batches {
				for _, k := range b {
					if k == dflt.Key() {
						n++
					}
				}
			}
			check.Equal(t, n, 1, "the default schedule measured", n, "times")
			best, ok := db.Best(task.Workload.Hash)
			check.True(t, ok)
			check.Equal(t, best.Schedule, DefaultSchedule)
			out, applied, err := Apply(ir.NewIRModule().With(tc.name, tc.f), db, testTarget, nil)
			check.NoError(t, err)
			check.Equal(t, applied.Tuned[tc.name], 1e-3)
			check.True(t, ir.StructuralEqual(out.PrimFunc(tc.name), dflt.Func), "Apply did not give the default schedule")
		})
	}
}

// TestTuneBadInput: a budget of 0 and an untunable workload.
func TestTuneBadInput(t *testing.T) {
	task, err := NewTask("mm", matmulFunc(t, 8, 8, 8), 1, testTarget)
	check.NoError(t, err)
	_, err = Tune(context.Background(), []*Task{task}, NewDatabase("cpu"), &fakeRunner{runs: map[string]int{}}, Options{Trials: 0})
	check.True(t, errors.Is(err, ErrNoTrials), err)
	check.Error(t, err, "trial budget is 0")
}

// TestTuneCancel: a context cancelled in the middle of a batch (after 6
// of its 16 candidates were measured, as a Ctrl-C would) stops the
// search with every measured candidate on disk, in the database file.
func TestTuneCancel(t *testing.T) {
	task, err := NewTask("mm", matmulFunc(t, 16, 16, 16), 1, testTarget)
	check.NoError(t, err)
	path := filepath.Join(t.TempDir(), "db.jsonl")
	db, _, err := OpenDatabase(path, "cpu")
	check.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &fakeRunner{runs: map[string]int{}}
	_, err = Tune(ctx, []*Task{task}, db, r, Options{Trials: 64, Batch: 16, Progress: func(p Progress) {
		if p.Done == 6 {
			cancel()
		}
	}})
	check.True(t, errors.Is(err, context.Canceled), err)
	check.NoError(t, db.Close())
	disk, _, err := OpenDatabase(path, "cpu")
	check.NoError(t, err)
	defer disk.Close()
	check.True(t, r.given >= 6 && r.given < 64, "results given:", r.given)
	check.Equal(t, disk.Len(), r.given)
}

// gatedRunner holds back the result of one candidate of its first batch
// (its "slow build") until release is closed, measuring the rest.
type gatedRunner struct {
	fakeRunner
	release chan struct{}
	batches atomic.Int32
}

func (r *gatedRunner) Stream(ctx context.Context, task *Task, cands []*Candidate, each func(int, Result)) error {
	if r.batches.Add(1) > 1 {
		return r.fakeRunner.Stream(ctx, task, cands, each)
	}
	if err := r.fakeRunner.Stream(ctx, task, cands[1:], func(i int, res Result) { each(i+1, res) }); err != nil {
		return err
	}
	select {
	case <-r.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return r.fakeRunner.Stream(ctx, task, cands[:1], each)
}

// TestTunePipeline: while one candidate of the first batch is held back
// (a slow build), the search goes on proposing and measuring new batches
// up to the budget less that candidate; released, it completes the run.
func TestTunePipeline(t *testing.T) {
	task, err := NewTask("mm", matmulFunc(t, 64, 64, 64), 1, testTarget)
	check.NoError(t, err)
	db := NewDatabase("cpu")
	r := &gatedRunner{fakeRunner: fakeRunner{runs: map[string]int{}}, release: make(chan struct{})}
	sum, err := Tune(context.Background(), []*Task{task}, db, r, Options{Trials: 24, Batch: 8, Seed: 1, Progress: func(p Progress) {
		if p.Done == 23 {
			close(r.release) // every other candidate came first
		}
	}})
	check.NoError(t, err)
	check.Equal(t, sum[0].Trials, 24)
	check.True(t, r.batches.Load() >= 3, "batches:", r.batches.Load())
	for k, n := range r.runs {
		check.Equal(t, n, 1, "runs of", k)
	}
}

// TestDatabaseReadNotes: lines that do not parse are skipped with a note
// naming the line, other targets' records are ignored with a note, and
// two files merge by concatenation.
func TestDatabaseReadNotes(t *testing.T) {
	good := `{"workload":{"hash":"00ab"},"target":"cpu","decisions":[{"site":"tile/C/i","kind":"tile","tile":[2,4],"choice":0}],"times":[0.5]}`
	other := `{"workload":{"hash":"00ab"},"target":"cuda -arch=sm_90","decisions":[],"times":[0.1]}`
	dflt := `{"workload":{"hash":"00ab"},"target":"cpu","decisions":[],"schedule":"default","times":[0.75]}`
	unknown := `{"workload":{"hash":"00ab"},"target":"cpu","decisions":[],"schedule":"handmade","times":[0.1]}`
	src := strings.Join([]string{good, `{"workload":`, other, `{"workload":{"hash":"00ab"},"target":"cpu","times":[-1]}`, "", good, dflt, unknown}, "\n")
	db := NewDatabase("cpu")
	notes, err := db.Read("db.jsonl", strings.NewReader(src))
	check.NoError(t, err)
	check.Equal(t, db.Len(), 3)
	check.Equal(t, len(notes), 4, notes)
	check.True(t, strings.HasPrefix(notes[0], "db.jsonl:2: skipped:"), notes[0])
	check.True(t, strings.HasPrefix(notes[1], "db.jsonl:4: skipped:") && strings.Contains(notes[1], "not a positive number"), notes[1])
	check.True(t, strings.HasPrefix(notes[2], "db.jsonl:8: skipped:") && strings.Contains(notes[2], `unknown schedule "handmade"`), notes[2])
	check.True(t, strings.Contains(notes[3], `ignored 1 records for target "cuda -arch=sm_90"`), notes[3])
	check.Equal(t, db.Records("00ab")[2].Schedule, DefaultSchedule)

	// Another kind of file: no line is a record, the first not JSON.
	_, err = NewDatabase("cpu").Read("model.onnx", strings.NewReader("\x08\x07\x12\x0bkiln\n{\"workload\":"))
	check.ErrorIs(t, err, ErrNotDatabase)
	check.Error(t, err, "model.onnx:1 is not a JSON object")
	// A file that is all broken records is a database with notes.
	notes, err = NewDatabase("cpu").Read("db.jsonl", strings.NewReader(`{"workload":`))
	check.NoError(t, err)
	check.Equal(t, len(notes), 1)

	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	check.NoError(t, os.WriteFile(a, []byte(good+"\n"), 0o644))
	check.NoError(t, os.WriteFile(b, []byte(strings.Replace(good, "0.5", "0.25", 1)+"\n"), 0o644))
	merged := filepath.Join(dir, "merged.jsonl")
	da, _ := os.ReadFile(a)
	dbb, _ := os.ReadFile(b)
	check.NoError(t, os.WriteFile(merged, append(da, dbb...), 0o644))
	m, notes, err := OpenDatabase(merged, "cpu")
	check.NoError(t, err)
	check.Equal(t, len(notes), 0)
	best, ok := m.Best("00ab")
	check.True(t, ok)
	check.Equal(t, best.Median(), 0.25)
	check.NoError(t, m.Close())
}

// TestModelLearnsOrder: the trees rank held-out points of a nonlinear
// function in nearly the right order.
func TestModelLearnsOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	f := func(x []float64) float64 {
		return math.Exp(-math.Pow(x[0]-3, 2)) * (1 + x[1]) / (1 + math.Abs(x[2]-x[0]))
	}
	var xs [][]float64
	var ys []float64
	for range 300 {
		x := []float64{rng.Float64() * 6, rng.Float64(), rng.Float64() * 6, rng.Float64()}
		xs = append(xs, x)
		ys = append(ys, f(x))
	}
	m := NewModel()
	m.Fit(xs[:200], ys[:200])
	var pred []float64
	for _, x := range xs[200:] {
		pred = append(pred, m.Predict(x))
	}
	rho := rankCorrelation(pred, ys[200:])
	check.True(t, rho > 0.8, "rank correlation", rho)
}

// FuzzDatabaseRead: any input reads without a panic; every line is
// either a record or a note.
func FuzzDatabaseRead(f *testing.F) {
	f.Add(`{"workload":{"hash":"00ab"},"target":"cpu","decisions":[{"site":"a","kind":"tile","tile":[2,4],"choice":0}],"times":[0.5]}`)
	f.Add("{\"workload\":\n\n{}")
	f.Add(`{"workload":{"hash":"1"},"target":"cpu","times":[1e400]}`)
	f.Fuzz(func(t *testing.T, src string) {
		db := NewDatabase("cpu")
		notes, err := db.Read("fuzz", strings.NewReader(src))
		if errors.Is(err, ErrNotDatabase) {
			check.Equal(t, db.Len(), 0)
			return
		}
		check.NoError(t, err)
		for _, n := range notes {
			check.True(t, strings.HasPrefix(n, "fuzz"), n)
		}
	})
}
