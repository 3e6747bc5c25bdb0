package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/compiler/tune"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
	"github.com/kiln-ml/kiln/tunefleet"
)

const tuneMatmulPy = `# from tvm.script import tir as T

@T.prim_func
def mm(A: T.Buffer((32, 16), "float32"), B: T.Buffer((16, 32), "float32"), C: T.Buffer((32, 32), "float32")):
    T.func_attr({"global_symbol": "mm", "tir.noalias": T.bool(True)})
    for i, j, k in T.grid(32, 32, 16):
        with T.block("C"):
            v_i, v_j, v_k = T.axis.remap("SSR", [i, j, k])
            T.reads(A[v_i, v_k], B[v_k, v_j])
            T.writes(C[v_i, v_j])
            with T.init():
                C[v_i, v_j] = T.float32(0.0)
            C[v_i, v_j] = C[v_i, v_j] + A[v_i, v_k] * B[v_k, v_j]
`

const tuneScalarPy = `# from tvm.script import tir as T

@T.prim_func
def one(A: T.Buffer((), "float32"), B: T.Buffer((), "float32")):
    T.func_attr({"global_symbol": "one", "tir.noalias": T.bool(True)})
    with T.block("B"):
        T.reads(A[()])
        T.writes(B[()])
        B[()] = A[()] + T.float32(1.0)
`

const tuneSymbolicPy = `# from tvm.script import tir as T

@T.prim_func
def matrix_multiply(var_A: T.handle, var_B: T.handle, var_C: T.handle):
    T.func_attr({"tir.noalias": T.bool(True)})
    N = T.int32()
    K = T.int32()
    M = T.int32()
    A = T.match_buffer(var_A, (N, K))
    B = T.match_buffer(var_B, (K, M))
    C = T.match_buffer(var_C, (N, M))
    for i, j, k in T.grid(N, M, K):
        with T.block("C"):
            v_i, v_j, v_k = T.axis.remap("SSR", [i, j, k])
            T.reads(A[v_i, v_k], B[v_k, v_j])
            T.writes(C[v_i, v_j])
            with T.init():
                C[v_i, v_j] = T.float32(0.0)
            C[v_i, v_j] = C[v_i, v_j] + A[v_i, v_k] * B[v_k, v_j]
`

// TestTuneSymbolicShape: a matmul with symbolic sizes is refused without
// --shape, tuned bound to --shape, and kiln build --tuning-db specializes
// it to the tuned shape (or the shape --shape picks).
func TestTuneSymbolicShape(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "mm.py")
	check.NoError(t, os.WriteFile(src, []byte(tuneSymbolicPy), 0o644))
	db := filepath.Join(dir, "tuning.jsonl")

	_, _, err := runApp(t, "tune", src, "--trials", "3", "--db", db)
	check.Error(t, err, "symbolic sizes: K, M, N; bind them with --shape")
	_, _, err = runApp(t, "tune", src, "--trials", "3", "--db", db, "--shape", "N=32,Q=4")
	check.Error(t, err, `no kernel has a symbolic size "Q"`)
	_, _, err = runApp(t, "tune", src, "--trials", "3", "--db", db, "--shape", "N=0")
	check.Error(t, err, "at least 1")

	out, errOut, err := runApp(t, "tune", src, "--trials", "3", "--batch", "3", "--db", db, "--shape", "N=32,M=32", "--shape", "K=16", "--seed", "1", "--json")
	check.NoError(t, err, errOut)
	s := decodeTuneSummary(t, out)
	check.Equal(t, s.Trials, 3)
	check.True(t, s.Tasks[0].Best > 0, s.Tasks[0])
	check.True(t, strings.Contains(readFile(t, db), `"shape":{"K":16,"M":32,"N":32}`), readFile(t, db))

	_, errOut, err = runApp(t, "build", src, "--tuning-db", db, "-o", filepath.Join(dir, "mm.kiln"), "--no-cache")
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(errOut, "matrix_multiply: specialized to K=16,M=32,N=32"), errOut)
	check.True(t, strings.Contains(scheduleLine(errOut, "matrix_multiply"), "the best record in "+db), errOut)

	_, errOut, err = runApp(t, "build", src, "--tuning-db", db, "--shape", "N=64,M=32,K=16", "-o", filepath.Join(dir, "mm.kiln"), "--no-cache")
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(errOut, "matrix_multiply: no record in "+db), errOut)
	_, _, err = runApp(t, "build", src, "--shape", "N=64", "-o", filepath.Join(dir, "mm.kiln"))
	check.Error(t, err, "needs --tuning-db")
}

func decodeTuneSummary(t *testing.T, out string) tuneSummary {
	t.Helper()
	var s tuneSummary
	check.NoError(t, json.Unmarshal([]byte(out), &s), out)
	return s
}

// TestTuneInProcess tunes a small matmul on kiln tune's in-process fleet
// (two device daemons), applies the database with kiln build
// --tuning-db, resumes, and reads a database with a bad line and another
// target's record.
func TestTuneInProcess(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "mm.py")
	check.NoError(t, os.WriteFile(src, []byte(tuneMatmulPy), 0o644))
	db := filepath.Join(dir, "tuning.jsonl")

	out, errOut, err := runApp(t, "tune", src, "--trials", "6", "--batch", "3", "--db", db, "--devices", "2", "--seed", "1", "--json")
	check.NoError(t, err, errOut)
	s := decodeTuneSummary(t, out)
	check.Equal(t, s.Trials, 6)
	check.Equal(t, len(s.Devices), 2, s.Devices)
	check.Equal(t, len(s.Tasks), 1)
	check.True(t, s.Tasks[0].Best > 0 && s.Tasks[0].GFLOPS > 0, s.Tasks[0])
	lines := strings.Split(strings.TrimSpace(readFile(t, db)), "\n")
	check.Equal(t, len(lines), 6)
	// Where the time went: every stage a candidate passes, the work
	// stages' shares adding up to 1.
	check.True(t, s.Pace != nil, "no pace in the summary")
	for _, st := range []string{"queue", "compile", "upload", "load", "check", "time"} {
		check.True(t, s.Pace.StageMS[st] > 0, "no time in stage", st, s.Pace.StageMS)
	}
	total := 0.0
	for _, v := range s.Pace.Shares {
		total += v
	}
	check.True(t, math.Abs(total-1) < 1e-6, "shares add up to", total, s.Pace.Shares)
	check.True(t, s.Pace.Search > 0, "no search time")

	// The database's best record schedules the kernel of kiln build.
	_, errOut, err = runApp(t, "build", src, "--tuning-db", db, "-o", filepath.Join(dir, "mm.kiln"), "--no-cache")
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(scheduleLine(errOut, "mm"), "the best record in "+db), errOut)

	// --resume with the same budget: nothing left to do.
	out, errOut, err = runApp(t, "tune", src, "--trials", "6", "--db", db, "--resume", "--json")
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(errOut, "resuming: 6 records"), errOut)
	s = decodeTuneSummary(t, out)
	check.Equal(t, s.Trials, 0)
	check.Equal(t, s.Tasks[0].Previous, 6)

	// A line that does not parse and another target's record: noted,
	// the rest used, two more trials measured.
	f, err := os.OpenFile(db, os.O_APPEND|os.O_WRONLY, 0)
	check.NoError(t, err)
	f.WriteString("{\"workload\": \n")
	f.WriteString(`{"workload":{"hash":"0123"},"target":"cpu -mtriple=aarch64-linux-gnu","decisions":[],"times":[0.1]}` + "\n")
	check.NoError(t, f.Close())
	out, errOut, err = runApp(t, "tune", src, "--trials", "2", "--batch", "2", "--db", db, "--json")
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(errOut, "tuning.jsonl:7: skipped: line does not parse"), errOut)
	check.True(t, strings.Contains(errOut, `ignored 1 records for target "cpu -mtriple=aarch64-linux-gnu"`), errOut)
	s = decodeTuneSummary(t, out)
	check.Equal(t, s.Trials, 2)
	check.Equal(t, s.Tasks[0].Previous, 6)
	_, errOut, err = runApp(t, "build", src, "--tuning-db", db, "-o", filepath.Join(dir, "mm.kiln"))
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(errOut, "tuning.jsonl:7: skipped"), errOut)

	// A kernel with no record is named.
	other := filepath.Join(dir, "other.jsonl")
	check.NoError(t, os.WriteFile(other, nil, 0o644))
	_, errOut, err = runApp(t, "build", src, "--tuning-db", other, "-o", filepath.Join(dir, "mm.kiln"))
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(errOut, `mm: no record in `+other), errOut)
}

// scheduleLine is kiln build's line on the schedule of function name
// ("" when there is none).
func scheduleLine(errOut, name string) string {
	for _, l := range strings.Split(errOut, "\n") {
		if rest, ok := strings.CutPrefix(l, "build: "+name+": "); ok && !strings.HasPrefix(rest, "specialized") {
			return l
		}
	}
	return ""
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	check.NoError(t, err)
	return string(b)
}

// TestTuneBadInput: a budget of 0, no budget, no database, and a
// workload with nothing to tune fail with errors saying so.
func TestTuneBadInput(t *testing.T) {
	dir := t.TempDir()
	mm := filepath.Join(dir, "mm.py")
	check.NoError(t, os.WriteFile(mm, []byte(tuneMatmulPy), 0o644))
	scalar := filepath.Join(dir, "one.py")
	check.NoError(t, os.WriteFile(scalar, []byte(tuneScalarPy), 0o644))
	db := filepath.Join(dir, "db.jsonl")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"zero trials", []string{mm, "--trials", "0", "--db", db}, "trial budget is 0"},
		{"no trials", []string{mm, "--db", db}, "--trials is required"},
		{"no db", []string{mm, "--trials", "3"}, "--db is required"},
		{"untunable", []string{scalar, "--trials", "3", "--db", db}, "one: nothing to tune"},
		{"bad target", []string{mm, "--trials", "3", "--db", db, "--target", "tpu"}, "tpu"},
		{"cutoff below 1", []string{mm, "--trials", "3", "--db", db, "--cutoff", "0.5"}, "--cutoff 0.5: want 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runApp(t, append([]string{"tune"}, tc.args...)...)
			check.Error(t, err, tc.want)
		})
	}
	_, err := os.Stat(db)
	check.True(t, os.IsNotExist(err), "a failed start wrote the database")
}

// TestTuneCrashingCandidate: on a fleet, a candidate whose kernel crashes
// (it reads far outside its input) is reported invalid at the run stage
// and the device stays in the pool: the next batch is measured on it.
func TestTuneCrashingCandidate(t *testing.T) {
	dir := t.TempDir()
	fl, _ := testFleet(t, dir, "tok")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	A := te.Placeholder(te.Shape(64), ir.Float32, "A")
	B := te.Compute(te.Shape(64), func(i ir.Expr) ir.Expr { return ir.Add(A.At(i), ir.F32(1)) }, "B")
	good, err := te.CreatePrimFunc([]*te.Tensor{A, B})
	check.NoError(t, err)
	// The same function reading A 2^28 elements (1 GiB) away.
	A2 := te.Placeholder(te.Shape(64), ir.Float32, "A")
	B2 := te.Compute(te.Shape(64), func(i ir.Expr) ir.Expr {
		return ir.Add(A2.At(ir.Add(i, ir.I32(1<<28))), ir.F32(1))
	}, "B")
	bad, err := te.CreatePrimFunc([]*te.Tensor{A2, B2})
	check.NoError(t, err)
	task, err := tune.NewTask("add1", good, 1, rules.Target{Kind: "cpu", VectorBytes: 32})
	check.NoError(t, err)
	r, err := tunefleet.Open(ctx, tunefleet.Config{Tracker: fl.client, Key: "cpu", Token: "tok", Target: "cpu",
		Time: client.TimeOptions{Number: 1, Repeat: 1, MinRepeatMS: 1}})
	check.NoError(t, err)
	defer r.Close()
	res, err := r.Run(ctx, task, []*tune.Candidate{{Func: bad}, {Func: good}})
	check.NoError(t, err)
	check.Equal(t, res[0].Stage, "run", res[0])
	check.True(t, strings.Contains(res[0].Error, "crash") || strings.Contains(res[0].Error, "signal"), res[0].Error)
	// One repeat is too few for an interval: the timing is noisy and
	// taken once more.
	check.True(t, len(res[1].Times) == 2 && res[1].Remeasured && res[1].Error == "", res[1])
	check.Equal(t, len(r.Devices()), 1)
	res, err = r.Run(ctx, task, []*tune.Candidate{{Func: good}})
	check.NoError(t, err)
	check.True(t, len(res[0].Times) == 2, res[0])
}

// TestTuneProcesses tunes through a real fleet: a tracker, a compiler
// node and two device daemons, each its own process. Both devices
// measure; when one is killed in the middle of a run, the other measures
// the rest and the run completes its budget.
func TestTuneProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	f, src, db := tuneProcFleet(t, 2, false)
	out, errOut, err := runApp(t, "tune", src, "--tracker", f.trackerAddr, "--token-file", f.tokFile, "--key", "cpu",
		"--trials", "4", "--batch", "4", "--db", db, "--seed", "1", "--json")
	check.NoError(t, err, errOut)
	s := decodeTuneSummary(t, out)
	check.Equal(t, s.Trials, 4)
	check.Equal(t, len(s.Devices), 2, s.Devices)
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(readFile(t, db)), "\n") {
		var r tune.Record
		check.NoError(t, json.Unmarshal([]byte(line), &r))
		check.True(t, r.Valid(), r.Error)
		seen[r.Device["addr"]] = true
	}
	check.Equal(t, len(seen), 2, "devices that measured:", seen)

	// Kill one daemon once the next run has measured something.
	f.waitFree("cpu", 2)
	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		out, errOut, runErr = runApp(t, "tune", src, "--tracker", f.trackerAddr, "--token-file", f.tokFile, "--key", "cpu",
			"--trials", "8", "--batch", "4", "--db", db, "--seed", "2", "--json")
	}()
	finishedFirst := waitRecords(t, db, 5, done)
	f.devices[1].kill9(t)
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		t.Fatal("kiln tune did not finish after a device died")
	}
	check.NoError(t, runErr, errOut)
	s = decodeTuneSummary(t, out)
	check.Equal(t, s.Trials, 8)
	lines := strings.Split(strings.TrimSpace(readFile(t, db)), "\n")
	check.Equal(t, len(lines), 12)
	if !finishedFirst {
		// The survivor measured what was left.
		var last tune.Record
		check.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &last))
		check.Equal(t, last.Device["addr"], f.devices[0].addr(t))
	}
}

// TestTuneTasksGraph: a graph module's tasks are the kernels its pipeline
// makes, weighted by how many times the graph calls them.
func TestTuneTasksGraph(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "compiler", "script", "testdata", "001_from_relax.py"))
	check.NoError(t, err)
	mod, err := script.Parse("001_from_relax.py", string(src))
	check.NoError(t, err)
	target, err := compiler.ParseTarget("cpu")
	check.NoError(t, err)
	tasks, _, err := tuneTasks(mod, target, "", nil)
	check.NoError(t, err)
	check.True(t, len(tasks) >= 2, "tasks:", len(tasks))
	total := 0
	for _, tk := range tasks {
		check.True(t, tk.Weight >= 1, tk.Name, tk.Weight)
		check.True(t, tk.Flops > 0, tk.Name)
		total += tk.Weight
	}
	check.True(t, total >= len(tasks), total)
}

// TestTuneTrackerRestart: the tracker, a real process, is killed in the
// middle of a kiln tune run and started again on the same address and
// data directory; the run reconnects (the client fails over to the
// restarted tracker), goes on with what was in flight and measures its
// whole budget. Every record of before the restart stays in the
// database.
func TestTuneTrackerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	f, src, db := tuneProcFleet(t, 1, true)
	done := make(chan struct{})
	var out, errOut string
	var runErr error
	go func() {
		defer close(done)
		out, errOut, runErr = runApp(t, "tune", src, "--tracker", f.trackerAddr, "--token-file", f.tokFile, "--key", "cpu",
			"--trials", "8", "--batch", "2", "--db", db, "--seed", "3", "--lease-ttl", "2s", "--json")
	}()
	if waitRecords(t, db, 1, done) {
		t.Fatalf("kiln tune ended before the restart: %v\n%s", runErr, errOut)
	}
	before := countLines(t, db)
	addr := f.trackerAddr
	f.tracker.kill9(t)
	f.startTracker(addr)
	check.Equal(t, f.trackerAddr, addr)
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		t.Fatal("kiln tune did not finish after the tracker restarted")
	}
	check.NoError(t, runErr, errOut)
	s := decodeTuneSummary(t, out)
	check.Equal(t, s.Trials, 8)
	lines := strings.Split(strings.TrimSpace(readFile(t, db)), "\n")
	check.Equal(t, len(lines), 8)
	check.True(t, before >= 1 && before < 8, before)
	for _, line := range lines {
		var r tune.Record
		check.NoError(t, json.Unmarshal([]byte(line), &r))
		check.True(t, r.Valid(), r.Error)
	}
}

// TestTuneRunnerRedials: a tracker down for longer than the client keeps
// failing over (shortened here) makes the runner's calls fail; the runner
// then dials the tracker again with a backoff until it is back, leases
// its device again and measures the batch, saying so through OnEvent.
// The leases last an hour: the runner releases the old one through the
// connection it came from rather than waiting for it to lapse (the test's
// context would end first).
func TestTuneRunnerRedials(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	f, _, _ := tuneProcFleet(t, 1, false)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	mod, err := script.Parse("mm.py", tuneMatmulPy)
	check.NoError(t, err)
	tasks, _, err := tune.Tasks(mod, rules.Target{Kind: "cpu", VectorBytes: 32}, nil)
	check.NoError(t, err)
	task := tasks[0]
	var mu sync.Mutex
	var notes []string
	addr := f.trackerAddr
	topts := client.TrackerOptions{Token: f.tok, FailoverTimeout: 200 * time.Millisecond}
	r, err := tunefleet.Open(ctx, tunefleet.Config{
		Dial: func(ctx context.Context) (*client.Tracker, error) { return client.DialTracker(ctx, addr, topts) },
		Key:  "cpu", Token: f.tok, Target: "cpu", LeaseTTL: time.Hour,
		Time: client.TimeOptions{Number: 1, Repeat: 1, MinRepeatMS: 1},
		OnEvent: func(e tunefleet.Event) {
			if e.Note != "" {
				mu.Lock()
				notes = append(notes, e.Note)
				mu.Unlock()
			}
		}})
	check.NoError(t, err)
	defer r.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	sample := func(n int) []*tune.Candidate {
		var out []*tune.Candidate
		for range n {
			c, err := task.Space.Sample(rng)
			check.NoError(t, err)
			out = append(out, c)
		}
		return out
	}
	res, err := r.Run(ctx, task, sample(2))
	check.NoError(t, err)
	check.True(t, len(res[0].Times) == 2, res[0])

	// Down for a second, far past the client's failover, while a batch
	// runs.
	f.tracker.kill9(t)
	cands := sample(2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, err = r.Run(ctx, task, cands)
	}()
	time.Sleep(time.Second)
	f.startTracker(addr)
	<-done
	check.NoError(t, err)
	for _, x := range res {
		check.True(t, len(x.Times) == 2, x)
	}
	mu.Lock()
	all := strings.Join(notes, "\n")
	mu.Unlock()
	check.True(t, strings.Contains(all, "tracker connection lost") && strings.Contains(all, "tracker back after"), all)
}

// tuneProcFleet starts a tracker, a compiler node and n "cpu" device
// daemons, each a process, and writes the small matmul to tune; it
// returns the fleet, the source and where the database goes. With
// freshCache the compiler node builds with an empty build cache of its
// own, so every candidate is compiled (a run lasts long enough to be
// interrupted).
func tuneProcFleet(t *testing.T, n int, freshCache bool) (f *procFleet, src, db string) {
	f = newProcFleet(t, 200*time.Millisecond)
	f.startTracker("")
	for range n {
		f.startDevice("cpu")
	}
	if freshCache {
		f.compiler = startProcEnv(t, "compiler", []string{"KILN_CACHE=" + filepath.Join(f.dir, "build-cache")}, "compiler",
			"--tracker", f.trackerAddr, "--token-file", f.tokFile, "--work-dir", filepath.Join(f.dir, "compiler"))
	} else {
		f.startCompiler()
	}
	f.waitFree("cpu", n)
	src = filepath.Join(f.dir, "mm.py")
	check.NoError(t, os.WriteFile(src, []byte(tuneMatmulPy), 0o644))
	return f, src, filepath.Join(f.dir, "tuning.jsonl")
}

// waitRecords waits until the database at path holds n records, or the
// run (done) ended first, which it reports. Builds are slow on a loaded
// machine: it waits up to a few minutes.
func waitRecords(t *testing.T, path string, n int, done <-chan struct{}) (ended bool) {
	t.Helper()
	deadline := time.Now().Add(4 * time.Minute)
	for countLines(t, path) < n {
		select {
		case <-done:
			return true
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d records in %s after 4 minutes", n, path)
		}
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// interruptTune runs kiln tune with args and cancels its context (a
// Ctrl-C) once the database at db holds n records; it returns the run's
// stdout, stderr and error. A run that ends first fails the test.
func interruptTune(t *testing.T, db string, n int, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		app := App()
		app.Writer, app.ErrWriter = &out, &errOut
		err = Run(ctx, app, append([]string{"kiln", "tune"}, args...))
	}()
	if waitRecords(t, db, n, done) {
		t.Fatalf("kiln tune ended before it was interrupted: %v\n%s", err, errOut.String())
	}
	cancel()
	<-done
	return out.String(), errOut.String(), err
}

// countLines counts the complete lines of the file at path (0 when it
// does not exist yet).
func countLines(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return 0
	}
	check.NoError(t, err)
	return strings.Count(string(b), "\n")
}

// TestTuneInterrupted: a Ctrl-C (the command's context cancelled) after a
// few of the first batch's 16 candidates were measured leaves exactly the
// measured ones in the database, each announced by a trial line on
// stderr (not a terminal), and says the run was interrupted.
func TestTuneInterrupted(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "mm.py")
	check.NoError(t, os.WriteFile(src, []byte(tuneMatmulPy), 0o644))
	db := filepath.Join(dir, "tuning.jsonl")
	out, stderr, runErr := interruptTune(t, db, 3, src, "--trials", "64", "--batch", "16", "--db", db, "--seed", "1", "--json")
	check.Error(t, runErr, "interrupted")
	s := decodeTuneSummary(t, out)
	check.True(t, s.Interrupted, s)
	lines := countLines(t, db)
	check.Equal(t, s.Trials, lines)
	check.True(t, lines >= 3 && lines < 64, lines)
	check.True(t, strings.Contains(stderr, fmt.Sprintf("interrupted after %d trials", lines)), stderr)
	for i := 1; i <= lines; i++ {
		check.True(t, strings.Contains(stderr, fmt.Sprintf("tune: mm trial %d/64: ", i)), "no line for trial", i, stderr)
	}
	check.True(t, strings.Contains(stderr, "trials/min, ETA "), stderr)
}

// TestTuneBuildTimeout: candidates whose build passes --build-timeout are
// killed and recorded invalid at the build stage, saying why.
func TestTuneBuildTimeout(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "mm.py")
	check.NoError(t, os.WriteFile(src, []byte(tuneMatmulPy), 0o644))
	db := filepath.Join(dir, "tuning.jsonl")
	_, _, err := runApp(t, "tune", src, "--trials", "2", "--db", db, "--build-timeout", "0s")
	check.Error(t, err, "--build-timeout 0s: want a positive duration")
	out, errOut, err := runApp(t, "tune", src, "--trials", "2", "--batch", "2", "--db", db, "--seed", "1", "--build-timeout", "1ms", "--json")
	check.NoError(t, err, errOut)
	s := decodeTuneSummary(t, out)
	check.Equal(t, s.Trials, 2)
	check.Equal(t, s.Tasks[0].Invalid, 2)
	for _, line := range strings.Split(strings.TrimSpace(readFile(t, db)), "\n") {
		var r tune.Record
		check.NoError(t, json.Unmarshal([]byte(line), &r))
		check.Equal(t, r.Stage, "build")
		check.True(t, strings.Contains(r.Error, "build timed out") && strings.Contains(r.Error, "--build-timeout"), r.Error)
	}
	check.True(t, strings.Contains(errOut, "invalid at build: build timed out"), errOut)
}

// TestTuneCancelsQueuedBuilds: when the tuning context ends, the build
// jobs the runner queued and no compiler node took are cancelled at the
// tracker, not left for the nodes to build for nobody.
func TestTuneCancelsQueuedBuilds(t *testing.T) {
	dir := t.TempDir()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	tr, err := tracker.New(tracker.Config{Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, "tracker"), Token: "tok", Logger: quiet})
	check.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { tr.Run(ctx) })
	topts := client.TrackerOptions{Token: "tok", Logger: quiet}
	// A compiler node that takes no job, and one device.
	reg := client.NewRegistrar(tr.Addr(), topts, proto.RegisterArgs{Role: proto.NodeCompiler, Attrs: proto.NodeAttrs{Targets: []string{"cpu"}}})
	wg.Go(func() { reg.Run(ctx) })
	<-reg.Ready()
	exe, err := os.Executable()
	check.NoError(t, err)
	d, err := rpcserver.New(rpcserver.Config{Listen: "127.0.0.1:0", Key: "cpu", Token: "tok", Dir: filepath.Join(dir, "sessions"),
		Version: Version(), Logger: quiet, Worker: rpcserver.WorkerSpec{Path: exe}})
	check.NoError(t, err)
	dreg := client.NewRegistrar(tr.Addr(), topts, proto.RegisterArgs{Role: proto.NodeDevice, Key: "cpu", Addr: d.Addr().String(), Attrs: rpcserver.NodeAttrs(Version())})
	d.SetTracker(dreg)
	wg.Go(func() { d.Run(ctx) })

	tc, err := client.DialTracker(ctx, tr.Addr(), topts)
	check.NoError(t, err)
	defer tc.Close()
	r, err := tunefleet.Open(ctx, tunefleet.Config{Tracker: tc, Key: "cpu", Token: "tok", Target: "cpu", Time: client.TimeOptions{Number: 1, Repeat: 1}})
	check.NoError(t, err)
	defer r.Close()
	mod, err := script.Parse("mm.py", tuneMatmulPy)
	check.NoError(t, err)
	tasks, _, err := tune.Tasks(mod, rules.Target{Kind: "cpu", VectorBytes: 32}, nil)
	check.NoError(t, err)
	sctx, scancel := context.WithCancel(ctx)
	streamed := make(chan error, 1)
	go func() {
		streamed <- r.Stream(sctx, tasks[0], []*tune.Candidate{{Func: tasks[0].Func}}, func(int, tune.Result) {})
	}()
	queued := func() []proto.BuildJob {
		s, err := tc.Query(ctx, 0)
		check.NoError(t, err)
		return s.BuildQueue
	}
	for len(queued()) == 0 {
		select {
		case err := <-streamed:
			t.Fatalf("the stream ended before its build was queued: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	job := queued()[0]
	check.Equal(t, job.Class, proto.JobBulk)
	check.True(t, job.CancelOnDisconnect, job)
	scancel()
	check.ErrorIs(t, <-streamed, context.Canceled)
	check.Equal(t, len(queued()), 0)
	j, err := tc.BuildStatus(ctx, job.ID)
	check.NoError(t, err)
	check.Equal(t, j.State, proto.JobCancelled)
}
