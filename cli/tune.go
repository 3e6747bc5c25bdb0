package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/frontend/onnx"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/tune"
	"github.com/kiln-ml/kiln/compilernode"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tunefleet"
)

func tuneCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "tune",
		Usage:     "search schedules for a module's kernels on the fleet and record them in a tuning database",
		UsageText: "kiln tune FILE --trials N --db tuning.jsonl [--target cpu] [--shape NAME=SIZE] [--input-shape NAME=D1xD2…] [--tracker HOST:PORT --key KEY] [--devices K] [--build-timeout D] [--resume] [--json]",
		Description: `Searches schedules for every kernel (PrimFunc) of FILE the way TVM's
MetaSchedule does: schedule rules (multi-level tiling with cache_write and
cache_read, auto-inline, random compute location, parallel-vectorize-unroll)
make a design space whose sampling decisions are recorded; an evolutionary
search guided by a cost model (gradient-boosted trees over features of the
loop nest, retrained after every batch, with a share of random picks)
proposes batches of candidates. Each candidate is built as a build job on the
fleet's compiler nodes, run on a leased device, checked against the
unscheduled kernel's result and only then timed by the device-side time
evaluator. Candidates that fail to build, crash, fail or compute a wrong
result are recorded as invalid and never tried again; so is a candidate
whose build takes longer than --build-timeout (the compiler node kills it).

Candidates flow as a pipeline: each is measured as soon as its build is
done, and a new batch is proposed (the model retrained) whenever half of
--batch in flight have a result, so no batch waits for its slowest build.
The candidates are bulk build jobs: a kiln build --tracker goes ahead of
them in the queue. Every measured candidate is appended to --db as one JSON
line (workload hash and text, target, device, decisions, trace, times or
error) the moment it is measured, and a line per trial on stderr says its
time, the best so far, the pace and the ETA. Ctrl-C loses no measured
record and cancels the candidates' build jobs still queued at the tracker
(if kiln tune is killed, the tracker cancels them once its connection has
been gone for the tracker's --job-orphan-grace). Databases merge by concatenation (cat
a.jsonl b.jsonl > c.jsonl). Records already in --db are never measured again
and train the model; with --resume they also count against --trials, so an
interrupted run continues where it stopped. kiln build --tuning-db applies the
best record of each kernel.

FILE is TVMScript: PrimFuncs are tuned as they are, a kernel with symbolic
sizes (T.match_buffer(a, (N, K)) with N = T.int32()) bound to the sizes
--shape gives (N=1024,K=1024,M=1024): the records are those of the bound
kernel, and kiln build --tuning-db specializes the symbolic kernel to the
shape it was tuned for. A module with @R.function, or an ONNX model
(FILE.onnx, its symbolic dimensions fixed with --input-shape as for kiln
build), goes through the graph pipeline first, the same lowering kiln build
does, and its fused kernels are tuned: each distinct kernel (by structural
hash: a model's identical layers are one) is a task weighted by how many
times the graph calls it, and trials go where the model's latency (weight ×
time, from the default schedule's time on) is expected to fall most, as
MetaSchedule's gradient task scheduler does: every kernel first gets a round
that measures its default schedule, then each round goes to the kernel whose
recent and average gain per round, times its weight, is largest. Each trial's
line names its kernel, its best and default times and the estimated model
latency (the sum over the tuned kernels of weight × best time). kiln build
FILE --tuning-db then gives every fused kernel its best record. The layout of
each convolution's kernel (blocks of 32, 16 or 8 output channels, HWIO, OIHW)
and, on the CPU, of each dense layer's weight (panels of the widths the dense
rule takes, NK40n, or as it is, KN) is searched too: the model is lowered once
per layout, the kernels of every layout are tasks (those of layouts other than
the default named after it, as fused_conv2d_add_relu_oihw16o), a convolution or
dense layer counts once in the model's latency, at its cheapest layout, and
kiln build --tuning-db takes for each signature the layout whose kernels' best
records add up to the least.

Without --tracker an in-process fleet runs here (a tracker, compiler nodes
building --build-jobs candidates at once, by default as many as the machine
has cores, and --devices CPU device daemons on loopback), as kiln demo does.

With --tracker, --record also records every measured candidate in the
tracker's results store (source "tune", the task's name as function) under
--label (default tune-YYYYMMDD-HHMMSS): kiln results lists them and the web
console's tuning page plots the run's best time so far against its trials.

Examples:
   kiln tune matmul.py --trials 64 --db tuning.jsonl
   kiln tune mlp.py --tracker 127.0.0.1:9190 --key cpu --trials 256 --db tuning.jsonl --devices 4
   kiln tune matmul.py --trials 64 --db tuning.jsonl --resume
   kiln tune symbolic_matmul.py --shape N=1024,M=1024,K=1024 --trials 64 --db tuning.jsonl
   kiln tune resnet18.onnx --input-shape input=1x3x224x224 --trials 2000 --db resnet18.jsonl
   kiln build matmul.py --tuning-db tuning.jsonl -o matmul.kiln`,
		Flags: append([]ucli.Flag{
			&ucli.StringFlag{Name: "target", Value: "cpu", Usage: "target string: cpu [-mcpu=NAME] [-mtriple=TRIPLE] [-mattr=+FEATURE,...]"},
			&ucli.IntFlag{Name: "trials", Usage: "candidates to measure, over all kernels (required, at least 1)"},
			&ucli.StringFlag{Name: "db", Usage: "tuning database (JSON lines) to read and append to (required)"},
			trackerFlag("HOST:PORT of the fleet's tracker (default: an in-process fleet)", false),
			&ucli.StringFlag{Name: "key", Value: "cpu", Usage: "device key to lease"},
			&ucli.IntFlag{Name: "devices", Usage: "measure on at most K devices (default: every free one; 1 in-process)"},
			&ucli.IntFlag{Name: "build-jobs", Usage: "in-process fleet: candidates its compiler nodes build at once (default: the machine's cores)"},
			&ucli.BoolFlag{Name: "resume", Usage: "count the records --db already holds for these kernels against --trials"},
			&ucli.IntFlag{Name: "batch", Value: 16, Usage: "candidates in flight at most; half of them are proposed anew whenever half have a result"},
			&ucli.DurationFlag{Name: "build-timeout", Value: tunefleet.DefaultBuildTimeout, Usage: "longest a candidate's build may take on a compiler node; a slower one is killed and recorded invalid"},
			&ucli.Uint64Flag{Name: "seed", Usage: "seed of the search's random source (default: from the clock)"},
			&ucli.StringSliceFlag{Name: "shape", Usage: "NAME=SIZE binds a symbolic size of the kernels for tuning, e.g. N=1024 (repeatable, or comma-separated)"},
			&ucli.StringSliceFlag{Name: "input-shape", Usage: "ONNX models: NAME=D1xD2… fixes the shape of an input with symbolic dims, as for kiln build (repeatable)"},
			&ucli.StringFlag{Name: "pipeline", Usage: "graph-level pipeline for modules with @R.function and ONNX models (default O2)"},
			&ucli.IntFlag{Name: "repeat", Value: 6, Usage: "time evaluator repeats per candidate (6 or more give the median a 95% interval; fewer are always noisy and timed twice)"},
			&ucli.IntFlag{Name: "min-repeat-ms", Value: 10, Usage: "time evaluator: shortest repeat in milliseconds"},
			&ucli.Float64Flag{Name: "cutoff", Value: tune.DefaultCutoff, Usage: "stop a candidate's timing after its first repeat when that took over this many times its kernel's best so far (0: time every repeat)"},
			&ucli.DurationFlag{Name: "lease-ttl", Value: 15 * time.Second, Usage: "life of the device leases between renewals; after a tracker restart that lost its state, the devices are leased again once their old leases lapse"},
			&ucli.BoolFlag{Name: "head-to-head", Usage: "at the end, time each kernel's default schedule and best candidate again one after the other; the build takes the faster (default: on for several kernels, a model's)"},
			&ucli.BoolFlag{Name: "json", Usage: "print a JSON summary at the end"},
			&ucli.BoolFlag{Name: "verbose", Usage: "log each build and measurement (and the in-process fleet's logs)"},
		}, append(tuneRecordFlags(), connFlags()...)...),
		OnUsageError: usageError,
		Action:       runTune,
	}
}

// tuneSummary is kiln tune's --json output.
type tuneSummary struct {
	File         string             `json:"file"`
	Target       string             `json:"target"`
	DB           string             `json:"db"`
	Trials       int                `json:"trials"`
	Devices      []string           `json:"devices"`
	Seconds      float64            `json:"seconds"`
	TrialsPerMin float64            `json:"trials_per_minute"`
	Interrupted  bool               `json:"interrupted,omitempty"`
	Notes        []string           `json:"notes,omitempty"`
	Skipped      []string           `json:"skipped,omitempty"`
	Tasks        []tune.TaskSummary `json:"tasks"`
	// Unscheduled is each kernel's time as written, without any schedule
	// (seconds), measured once on the fleet with the reference result.
	Unscheduled map[string]float64 `json:"unscheduled_seconds,omitempty"`
	// DefaultSchedule is each kernel's best time under kiln's default
	// schedule (the search's first candidate), from the database.
	DefaultSchedule map[string]float64 `json:"default_schedule_seconds,omitempty"`
	// Model and ModelDefault estimate a run of the graph (seconds): the
	// sum over its tuned kernels of weight × best time, and of weight ×
	// the default schedule's time (for a module of several kernels).
	Model        float64 `json:"model_seconds,omitempty"`
	ModelDefault float64 `json:"model_default_seconds,omitempty"`
	// Pace is where the run's time went.
	Pace *tunePace `json:"pace,omitempty"`
	// Layouts are the layouts kiln build --tuning-db takes for the
	// model's convolution and dense sites, by the database after the run.
	Layouts []tune.LayoutChoice `json:"layouts,omitempty"`
}

// tunePace is where a tuning run's time went: per stage of a
// candidate's build and measurement, the mean milliseconds of one entry
// and the share of the work stages' time (compile, upload, load, check,
// time; the shares add up to 1); queue is a build job waiting for a
// compiler node, wait a device waiting for its next built candidate.
// Search is the seconds the tuner itself spent fitting its cost models
// and proposing candidates.
type tunePace struct {
	StageMS map[string]float64 `json:"stage_ms"`
	Shares  map[string]float64 `json:"shares"`
	Search  float64            `json:"search_seconds"`
	line    string
}

// newTunePace summarizes the runner's stages and the search's time.
func newTunePace(st tunefleet.Stages, search time.Duration) *tunePace {
	return &tunePace{StageMS: st.Map(), Shares: st.Shares(), Search: search.Seconds(),
		line: fmt.Sprintf("%s; queued %s a build, devices idle %s a candidate; the search itself %s",
			st, st.Mean(tunefleet.StageQueue).Round(time.Millisecond), st.Mean(tunefleet.StageWait).Round(time.Millisecond), search.Round(time.Millisecond))}
}

// estimate fills in the model latency estimates from the kernels'
// summaries.
func (r *tuneSummary) estimate() {
	if len(r.Tasks) < 2 {
		return
	}
	for i, t := range r.Tasks {
		if t.Default == 0 {
			r.Tasks[i].Default = r.DefaultSchedule[t.Name]
		}
	}
	r.Model, r.ModelDefault = tune.Progress{Tasks: r.Tasks}.Latency()
}

// defaultScheduleTimes returns each task's best valid time under the
// default schedule among db's records.
func defaultScheduleTimes(tasks []*tune.Task, db *tune.Database) map[string]float64 {
	out := map[string]float64{}
	for _, t := range tasks {
		for _, r := range db.Records(t.Workload.Hash) {
			if r.Schedule != tune.DefaultSchedule || !r.Valid() {
				continue
			}
			if m := r.Median(); out[t.Name] == 0 || m < out[t.Name] {
				out[t.Name] = m
			}
		}
	}
	return out
}

func runTune(c *ucli.Context) error {
	if c.NArg() != 1 {
		return fmt.Errorf("tune: want one file, got %d arguments (see \"kiln tune --help\")", c.NArg())
	}
	path := c.Args().First()
	trials := c.Int("trials")
	if !c.IsSet("trials") {
		return errors.New("tune: --trials is required (how many candidates to measure)")
	}
	if trials < 1 {
		return fmt.Errorf("tune: --trials %d: %w", trials, tune.ErrNoTrials)
	}
	dbPath := c.String("db")
	if dbPath == "" {
		return errors.New("tune: --db is required (the tuning database to append records to)")
	}
	if c.Int("batch") < 1 {
		return fmt.Errorf("tune: --batch %d: want at least 1", c.Int("batch"))
	}
	if c.Int("build-jobs") < 0 || c.IsSet("build-jobs") && c.Int("build-jobs") == 0 {
		return fmt.Errorf("tune: --build-jobs %d: want at least 1", c.Int("build-jobs"))
	}
	if c.IsSet("build-jobs") && c.String("tracker") != "" {
		return errors.New("tune: --build-jobs is for the in-process fleet; a fleet's compiler nodes set their own (kiln compiler --jobs)")
	}
	if c.Int("devices") < 0 {
		return fmt.Errorf("tune: --devices %d: want at least 1", c.Int("devices"))
	}
	if c.Duration("build-timeout") <= 0 {
		return fmt.Errorf("tune: --build-timeout %s: want a positive duration, e.g. 1m", c.Duration("build-timeout"))
	}
	cutoff := c.Float64("cutoff")
	switch {
	case cutoff < 0 || cutoff > 0 && cutoff < 1:
		return fmt.Errorf("tune: --cutoff %g: want 0 (time every repeat) or a factor of at least 1", cutoff)
	case cutoff == 0:
		cutoff = -1 // the runner's "never"
	}
	target, err := compiler.ParseTarget(c.String("target"))
	if err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	mod, err := tuneModule(path, c.StringSlice("input-shape"))
	if err != nil {
		return err
	}
	shape, err := tune.ParseShape(c.StringSlice("shape"))
	if err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	tasks, skipped, err := tuneTasks(mod, target, c.String("pipeline"), shape)
	if err != nil {
		return fmt.Errorf("tune %s: %w", path, err)
	}
	if len(tasks) == 0 {
		return fmt.Errorf("tune %s: no kernel to tune: %s", path, strings.Join(skipped, "; "))
	}
	errw := c.App.ErrWriter
	db, notes, err := tune.OpenDatabase(dbPath, target.String())
	if err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	defer db.Close()
	for _, n := range notes {
		fmt.Fprintf(errw, "tune: warning: %s\n", n)
	}
	for _, s := range skipped {
		fmt.Fprintf(errw, "tune: skipped %s\n", s)
	}
	if len(tasks) > 1 {
		fmt.Fprintf(errw, "tune: %d kernels to tune: %s\n", len(tasks), describeTasks(tasks))
	}
	if c.Bool("resume") {
		had := 0
		for _, t := range tasks {
			for _, r := range db.Records(t.Workload.Hash) {
				if r.Pair == 0 { // a head-to-head's records are not trials
					had++
				}
			}
		}
		trials -= had
		fmt.Fprintf(errw, "tune: resuming: %d records in %s, %d trials to go\n", had, dbPath, max(trials, 0))
	}

	ctx := c.Context
	res := tuneSummary{File: path, Target: target.String(), DB: dbPath, Notes: notes, Skipped: skipped}
	if trials <= 0 {
		res.Tasks = tuneSummaries(tasks, db)
		res.DefaultSchedule = defaultScheduleTimes(tasks, db)
		res.estimate()
		return printTuneSummary(c, res)
	}
	tok, tlsCfg, err := clientAuth(c)
	if err != nil {
		return err
	}
	addr := c.String("tracker")
	// The results store gets each measured candidate (--record).
	rec, err := newTuneRecorder(ctx, c, addr, client.TrackerOptions{Token: tok, TLS: tlsCfg, Logger: slog.New(slog.DiscardHandler)}, db, tasks, target.String())
	if err != nil {
		return err
	}
	defer rec.close()
	if addr == "" {
		n := max(c.Int("devices"), 1)
		spin := startProgress(c, fmt.Sprintf("starting an in-process fleet (tracker, compiler node, %d device daemon(s))", n))
		fl, err := startTuneFleet(ctx, c, n)
		spin.done()
		if err != nil {
			return fmt.Errorf("tune: %w", err)
		}
		defer fl.stop()
		addr, tok, tlsCfg = fl.tracker.Addr(), fl.token, nil
	}
	// The runner dials the tracker, and again if it restarts mid-tuning.
	topts := client.TrackerOptions{Token: tok, TLS: tlsCfg, Logger: slog.New(slog.DiscardHandler)}
	dial := func(ctx context.Context) (*client.Tracker, error) { return client.DialTracker(ctx, addr, topts) }

	display := newTuneDisplay(c)
	rlog := slog.New(slog.DiscardHandler)
	if c.Bool("verbose") {
		rlog = logger(c)
	}
	if c.Bool("verbose") {
		topts.Logger = rlog
	}
	runner, err := tunefleet.Open(ctx, tunefleet.Config{Dial: dial, Key: c.String("key"), Token: tok, TLS: tlsCfg, Target: target.String(),
		BuildTimeout: c.Duration("build-timeout"), Cutoff: cutoff, Devices: c.Int("devices"), LeaseTTL: c.Duration("lease-ttl"), User: "kiln tune", Logger: rlog, OnEvent: display.event,
		Time: client.TimeOptions{Number: 1, Repeat: max(c.Int("repeat"), 1), MinRepeatMS: max(c.Int("min-repeat-ms"), 0)}})
	if err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	defer runner.Close()
	res.Devices = runner.Devices()
	seed := c.Uint64("seed")
	if !c.IsSet("seed") {
		seed = uint64(time.Now().UnixNano())
	}
	start := time.Now()
	h2h := len(tasks) > 1
	if c.IsSet("head-to-head") {
		h2h = c.Bool("head-to-head")
	}
	var search time.Duration
	onProgress := rec.progress(display.progress)
	progress := func(p tune.Progress) {
		search = p.Search
		onProgress(p)
	}
	sum, err := tune.Tune(ctx, tasks, db, runner, tune.Options{Trials: trials, Batch: c.Int("batch"), Seed: seed, Progress: progress, HeadToHead: h2h})
	display.done()
	res.Seconds = time.Since(start).Seconds()
	res.Pace = newTunePace(runner.Stages(), search)
	res.Tasks = sum
	for _, t := range tasks {
		if d, ok := runner.Default(t); ok {
			if res.Unscheduled == nil {
				res.Unscheduled = map[string]float64{}
			}
			res.Unscheduled[t.Name] = d
		}
	}
	res.DefaultSchedule = defaultScheduleTimes(tasks, db)
	_, res.Layouts = tune.ChooseLayouts(tune.VariantsOf(tasks), db)
	res.estimate()
	for _, t := range sum {
		res.Trials += t.Trials
	}
	if res.Seconds > 0 {
		res.TrialsPerMin = float64(res.Trials) / res.Seconds * 60
	}
	if err != nil && ctx.Err() != nil {
		res.Interrupted = true
		fmt.Fprintf(errw, "tune: interrupted after %d trials; every record measured is in %s (kiln tune --resume continues)\n", res.Trials, dbPath)
		if perr := printTuneSummary(c, res); perr != nil {
			return perr
		}
		return errors.New("tune: interrupted")
	}
	if err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	if err := db.Close(); err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	return printTuneSummary(c, res)
}

// tuneModule reads the module kiln tune tunes: TVMScript, or an ONNX
// model imported with its input shapes (as kiln build imports it; the
// weights are not needed, the kernels take them as arguments).
func tuneModule(path string, inputShapes []string) (*ir.IRModule, error) {
	shapes, err := onnx.ParseInputShapes(inputShapes)
	if err != nil {
		return nil, fmt.Errorf("tune: %w", err)
	}
	if onnx.IsModelPath(path) {
		mod, _, err := onnx.ImportFile(path, onnx.Options{InputShapes: shapes})
		if err != nil {
			return nil, fmt.Errorf("tune: %w", err)
		}
		return mod, nil
	}
	if len(shapes) > 0 {
		return nil, fmt.Errorf("tune: --input-shape is for ONNX models (FILE.onnx); a TVMScript kernel's symbolic sizes are bound with --shape")
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tune: %w", err)
	}
	return script.Parse(path, string(src))
}

// tuneTasks returns the tasks of mod: its PrimFuncs, or for a module with
// graph functions the distinct kernels the graph pipeline leaves, lowered
// as kiln build lowers them (compiler.GraphPipeline).
func tuneTasks(mod *ir.IRModule, target compiler.Target, pipeline string, shape map[string]int64) ([]*tune.Task, []string, error) {
	rt, err := target.TuneTarget()
	if err != nil {
		return nil, nil, err
	}
	if lower := compiler.LayoutLowering(mod, target, pipeline, false); lower != nil {
		// The kernels of every layout of every convolution and dense
		// layer.
		tasks, skipped, _, err := tune.LayoutTasks(lower, rt, shape)
		return tasks, skipped, err
	}
	mod, err = compiler.GraphPipeline(mod, target, pipeline, false, nil)
	if err != nil {
		return nil, nil, err
	}
	return tune.Tasks(mod, rt, shape)
}

// describeTasks is "a ×2, b, c (also c1)": the tasks with their weights
// and the other functions of the same workload; the kernels of other
// layouts than the default of convolution sites are counted after them.
func describeTasks(tasks []*tune.Task) string {
	var parts []string
	others, sites := 0, map[string]bool{}
	for _, t := range tasks {
		if t.Site != "" && !t.SiteDefault {
			others++
			sites[t.Site] = true
			continue
		}
		p := t.Name
		if t.Weight > 1 {
			p += fmt.Sprintf(" ×%d", t.Weight)
		}
		if len(t.Funcs) > 1 {
			p += " (also " + strings.Join(t.Funcs[1:], ", ") + ")"
		}
		parts = append(parts, p)
	}
	out := strings.Join(parts, ", ")
	if others > 0 {
		out += fmt.Sprintf("; and %d kernels of the other layouts of %d convolutions and dense layers", others, len(sites))
	}
	return out
}

// tuneSummaries summarizes what db holds for tasks (nothing measured in
// this run).
func tuneSummaries(tasks []*tune.Task, db *tune.Database) []tune.TaskSummary {
	var out []tune.TaskSummary
	for _, t := range tasks {
		s := tune.TaskSummary{Name: t.Name, Workload: t.Workload.Hash, Weight: t.Weight, Previous: len(db.Records(t.Workload.Hash))}
		if b, ok := db.Best(t.Workload.Hash); ok {
			s.Best = b.Median()
			if t.Flops > 0 {
				s.GFLOPS = t.Flops / s.Best / 1e9
			}
		}
		out = append(out, s)
	}
	return out
}

func printTuneSummary(c *ucli.Context, r tuneSummary) error {
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(r)
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	// SPEEDUP is the best time's against the default schedule's (what a
	// build without the database gets), else against the unscheduled time.
	fmt.Fprintln(tw, "KERNEL\tWEIGHT\tTRIALS\tINVALID\tEARLIER\tUNSCHEDULED\tDEFAULT SCHEDULE\tBEST\tGFLOPS\tSPEEDUP")
	for _, t := range r.Tasks {
		unsched, dflt, best, gf, up := "-", "-", "-", "-", "-"
		u, d := r.Unscheduled[t.Name], r.DefaultSchedule[t.Name]
		if t.Default > 0 {
			d = t.Default // this run's, the head-to-head's when there was one
		}
		if u > 0 {
			unsched = fmtSeconds(u)
		}
		if d > 0 {
			dflt = fmtSeconds(d)
		}
		if t.Best > 0 {
			best, gf = fmtSeconds(t.Best), fmt.Sprintf("%.2f", t.GFLOPS)
			switch {
			case d > 0:
				up = fmt.Sprintf("%.2f× default", d/t.Best)
			case u > 0:
				up = fmt.Sprintf("%.1f× unscheduled", u/t.Best)
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", t.Name, t.Weight, t.Trials, t.Invalid, t.Previous, unsched, dflt, best, gf, up)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range r.Tasks {
		if h := t.HeadToHead; h != nil {
			kept := "the best candidate"
			if h.Default <= h.Best {
				kept = "the default schedule"
			}
			fmt.Fprintf(c.App.ErrWriter, "tune: %s head to head, timed one after the other: default %s, best %s: the build takes %s\n",
				t.Name, fmtSeconds(h.Default), fmtSeconds(h.Best), kept)
		}
	}
	for _, l := range r.Layouts {
		if l.Other == "" || (l.Layout == l.DefaultLayout && !l.HeadToHead) {
			continue
		}
		how := "by the best records"
		if l.HeadToHead {
			how = "head to head, timed one after the other"
		}
		fmt.Fprintf(c.App.ErrWriter, "tune: %s: %ss %s: default %s %s, %s %s: the build takes %s\n",
			l.Site, siteLayout(l.Site), how, l.DefaultLayout, fmtSeconds(l.DefaultSeconds), l.Other, fmtSeconds(l.OtherSeconds), l.Layout)
	}
	if r.Model > 0 {
		timed := 0
		for _, t := range r.Tasks {
			if t.Best > 0 {
				timed++
			}
		}
		fmt.Fprintf(c.App.ErrWriter, "tune: estimated model latency (Σ weight × time over the %d of %d kernels timed): %s tuned, %s with the default schedules (%.2f×)\n",
			timed, len(r.Tasks), fmtSeconds(r.Model), fmtSeconds(r.ModelDefault), r.ModelDefault/r.Model)
	}
	if r.Trials > 0 {
		fmt.Fprintf(c.App.ErrWriter, "tune: %d trials in %s (%.1f a minute) on %s; records in %s\n", r.Trials,
			time.Duration(r.Seconds*float64(time.Second)).Round(time.Millisecond), r.TrialsPerMin, strings.Join(r.Devices, ", "), r.DB)
	}
	if r.Pace != nil && r.Pace.line != "" {
		fmt.Fprintf(c.App.ErrWriter, "tune: where the time went: %s\n", r.Pace.line)
	}
	return nil
}

// tuneDisplay shows the search's progress: a line per measured trial
// (its time, the kernel's best, the pace, the ETA), and on a terminal
// below them a line redrawn in place (trials done/total, each kernel's
// best time and GFLOPS, candidates in flight per device, ETA).
type tuneDisplay struct {
	c      *ucli.Context
	spin   *progress
	w      io.Writer
	quiet  bool
	mu     sync.Mutex
	flight map[string]int
	last   tune.Progress
	// finished is set once the search returned: no more trial lines.
	finished bool
}

func newTuneDisplay(c *ucli.Context) *tuneDisplay {
	d := &tuneDisplay{c: c, w: c.App.ErrWriter, flight: map[string]int{}, quiet: c.Bool("json")}
	d.spin = startProgress(c, "tune: starting")
	return d
}

func (d *tuneDisplay) event(e tunefleet.Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e.Note != "" {
		// Notes are warnings: printed with --json too.
		fmt.Fprintf(d.w, "tune: %s\n", e.Note)
		return
	}
	if e.Dropped != "" {
		delete(d.flight, e.Device)
		if !d.quiet {
			fmt.Fprintf(d.w, "tune: device %s left the pool: %s\n", e.Device, e.Dropped)
		}
	} else {
		d.flight[e.Device] = e.InFlight
	}
	d.redraw()
}

func (d *tuneDisplay) progress(p tune.Progress) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.last = p
	if p.Last != nil && !d.finished {
		if d.spin != nil {
			d.spin.bar.Clear()
		}
		fmt.Fprintln(d.w, trialLine(p))
	}
	d.redraw()
}

// trialLine is the line of the trial p reports: "tune: mm trial 7/64:
// 1.230ms (best 0.980ms, default 1.100ms, 5.1 trials/min, ETA 11m0s)";
// with several kernels also the kernel's own trial count and the
// estimated model latency: "(best 0.980ms, default 1.100ms, its trial 3;
// model 2.31ms, default 2.50ms; 5.1 trials/min, ETA 11m0s)".
func trialLine(p tune.Progress) string {
	t := p.Last
	var b strings.Builder
	fmt.Fprintf(&b, "tune: %s trial %d/%d: ", t.Task, p.Done, p.Total)
	if t.Error != "" {
		msg := strings.Join(strings.Fields(t.Error), " ")
		if len(msg) > 120 {
			msg = msg[:117] + "..."
		}
		fmt.Fprintf(&b, "invalid at %s: %s", t.Stage, msg)
	} else {
		b.WriteString(fmtSeconds(t.Seconds))
	}
	b.WriteString(" (best ")
	if t.Best > 0 {
		b.WriteString(fmtSeconds(t.Best))
	} else {
		b.WriteString("none yet")
	}
	if t.Default > 0 {
		fmt.Fprintf(&b, ", default %s", fmtSeconds(t.Default))
	}
	sep := ","
	if len(p.Tasks) > 1 {
		fmt.Fprintf(&b, ", its trial %d", t.Trials)
		if best, dflt := p.Latency(); best > 0 {
			fmt.Fprintf(&b, "; model %s, default %s", fmtSeconds(best), fmtSeconds(dflt))
		}
		sep = ";"
	}
	fmt.Fprintf(&b, "%s %.1f trials/min", sep, p.PerMinute())
	if p.Done < p.Total {
		fmt.Fprintf(&b, ", ETA %s", p.ETA().Round(time.Second))
	}
	b.WriteString(")")
	return b.String()
}

func (d *tuneDisplay) line() string {
	p := d.last
	var b strings.Builder
	fmt.Fprintf(&b, "tune: %d/%d trials", p.Done, p.Total)
	if len(p.Tasks) > 3 {
		// A model's kernels do not fit one line: its estimated latency.
		if best, dflt := p.Latency(); best > 0 {
			fmt.Fprintf(&b, ", model %s (default %s)", fmtSeconds(best), fmtSeconds(dflt))
		}
	} else {
		for _, t := range p.Tasks {
			if t.Best > 0 {
				fmt.Fprintf(&b, ", %s %s (%.1f GFLOPS)", t.Name, fmtSeconds(t.Best), t.GFLOPS)
			}
		}
	}
	if len(d.flight) > 0 {
		devs := make([]string, 0, len(d.flight))
		for k := range d.flight {
			devs = append(devs, k)
		}
		sort.Strings(devs)
		var fl []string
		for _, k := range devs {
			fl = append(fl, fmt.Sprintf("%s:%d", k, d.flight[k]))
		}
		fmt.Fprintf(&b, ", in flight %s", strings.Join(fl, " "))
	}
	if p.Done > 0 && p.Done < p.Total {
		fmt.Fprintf(&b, ", ETA %s", p.ETA().Round(time.Second))
	}
	return b.String()
}

func (d *tuneDisplay) redraw() {
	if d.spin != nil {
		d.spin.describe(d.line())
	}
}

func (d *tuneDisplay) done() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.spin.done()
	d.spin = nil
	d.quiet = true
	d.finished = true
}

// tuneFleet is an in-process fleet for kiln tune: the demo's tracker,
// compiler node and device daemon, plus more device daemons.
type tuneFleet struct {
	*fleet
	token  string
	cancel context.CancelFunc
	wg     sync.WaitGroup
	extra  []*rpcserver.Daemon
	dir    string
}

// stop stops the extra daemons, then the demo's fleet, and removes the
// fleet's files.
func (tf *tuneFleet) stop() error {
	tf.cancel()
	tf.wg.Wait()
	err := tf.fleet.stop()
	os.RemoveAll(tf.dir)
	return err
}

// startTuneFleet starts an in-process fleet with n CPU device daemons
// (key "cpu") whose files live in a temporary directory.
func startTuneFleet(ctx context.Context, c *ucli.Context, n int) (*tuneFleet, error) {
	dir, err := os.MkdirTemp("", "kiln-tune-")
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.DiscardHandler)
	if c.Bool("verbose") {
		log = logger(c)
	}
	b := make([]byte, 16)
	rand.Read(b)
	tok := hex.EncodeToString(b)
	// Several daemons in this one process start each worker in a session of
	// its own: under Linux's autogroup they then get the CPU as separate
	// daemons would, rather than splitting this process's share.
	worker := rpcserver.WorkerSpec{Path: exe, OwnSession: n > 1}
	fl, err := startFleet(ctx, dir, tok, worker, log)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	tf := &tuneFleet{fleet: fl, token: tok}
	dctx, cancel := context.WithCancel(ctx)
	tf.cancel = cancel
	stopAll := func() {
		cancel()
		tf.wg.Wait()
		fl.stop()
		os.RemoveAll(dir)
	}
	for i := 1; i < n; i++ {
		d, err := rpcserver.New(rpcserver.Config{Listen: "127.0.0.1:0", Key: "cpu", Token: tok, Dir: filepath.Join(dir, fmt.Sprintf("sessions%d", i)),
			Version: Version(), Logger: log, Worker: worker})
		if err != nil {
			stopAll()
			return nil, fmt.Errorf("device daemon: %w", err)
		}
		reg := client.NewRegistrar(fl.tracker.Addr(), client.TrackerOptions{Token: tok, Logger: log}, proto.RegisterArgs{
			Role: proto.NodeDevice, Key: "cpu", Addr: d.Addr().String(), Attrs: rpcserver.NodeAttrs(Version()),
		})
		reg.OnHealthCheck = deviceHealthCheck
		d.SetTracker(reg)
		tf.extra = append(tf.extra, d)
		tf.wg.Add(1)
		go func() {
			defer tf.wg.Done()
			d.Run(dctx)
		}()
	}
	// Candidates are built by as many jobs at once as asked: the demo's
	// compiler node builds one, a second node the rest.
	jobs := c.Int("build-jobs")
	if jobs == 0 {
		jobs = runtime.NumCPU()
	}
	if jobs > 1 {
		ready, ended := make(chan struct{}), make(chan error, 1)
		tf.wg.Add(1)
		go func() {
			defer tf.wg.Done()
			err := compilernode.Run(dctx, compilernode.Config{Tracker: fl.tracker.Addr(), Options: client.TrackerOptions{Token: tok, Logger: log},
				Command: []string{exe, "compiler-job"}, WorkDir: filepath.Join(dir, "compiler2"), Concurrency: jobs - 1, Ready: ready,
				Version: Version(), Logger: log})
			if err != nil && dctx.Err() == nil {
				log.Error("in-process compiler node", "err", err)
			}
			ended <- err
		}()
		select {
		case <-ready:
		case err := <-ended:
			if err == nil {
				err = errors.New("stopped before it registered")
			}
			stopAll()
			return nil, fmt.Errorf("compiler node: %w", err)
		case <-time.After(30 * time.Second):
			stopAll()
			return nil, errors.New("the second compiler node did not register in 30 s")
		}
	}
	// Wait until every device is free at the tracker.
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	for {
		s, err := fl.client.Query(wctx, 0)
		if err != nil {
			stopAll()
			return nil, err
		}
		free := 0
		for _, k := range s.Keys {
			if k.Key == "cpu" {
				free = k.Free
			}
		}
		if free >= n {
			break
		}
		select {
		case <-wctx.Done():
			stopAll()
			return nil, fmt.Errorf("%d of %d device daemons registered: %w", free, n, wctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	tf.dir = dir
	return tf, nil
}

// demoTune is kiln demo's tuning step: the demo's matmul (symbolic N, M,
// K) bound to n×n×n as kiln tune --shape binds it, timed on the device
// with the demo's schedule, then tuned for trials candidates on the
// demo's fleet and the best one reported.
func demoTune(ctx context.Context, tc *client.Tracker, tok string, n, trials int, dir string, begin func(string), step func(string, time.Time, string, ...any)) error {
	start := time.Now()
	begin(fmt.Sprintf("tune the demo's matmul bound to N=M=K=%d: %d candidates built on the compiler node, timed on the device", n, trials))
	f, err := teMatmulDef()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "matmul_def.py"), []byte(script.Print(f)), 0o644); err != nil {
		return err
	}
	target, err := compiler.ParseTarget("cpu")
	if err != nil {
		return err
	}
	shape := map[string]int64{"N": int64(n), "M": int64(n), "K": int64(n)}
	rt, err := target.TuneTarget()
	if err != nil {
		return err
	}
	tasks, skipped, err := tune.Tasks(ir.NewIRModule().With("matrix_multiply", f), rt, shape)
	if err != nil {
		return err
	}
	if len(tasks) != 1 {
		return fmt.Errorf("the matmul is not tunable: %s", strings.Join(skipped, "; "))
	}
	task := tasks[0]
	demo, _, err := teMatmulScheduled()
	if err != nil {
		return err
	}
	if demo, err = tune.Bind(demo, shape); err != nil {
		return err
	}
	runner, err := tunefleet.Open(ctx, tunefleet.Config{Tracker: tc, Key: "cpu", Token: tok, Target: target.String(), Devices: 1, User: "kiln demo",
		Time: client.TimeOptions{Number: 1, Repeat: 3, MinRepeatMS: 20}, NoDefault: true})
	if err != nil {
		return err
	}
	defer runner.Close()
	before, err := runner.Run(ctx, task, []*tune.Candidate{{Func: demo}})
	if err != nil {
		return err
	}
	if before[0].Error != "" {
		return fmt.Errorf("the demo's matmul: %s", before[0].Error)
	}
	rec := tune.Record{Times: before[0].Times}
	t0 := rec.Median()
	db, _, err := tune.OpenDatabase(filepath.Join(dir, "tuning.jsonl"), target.String())
	if err != nil {
		return err
	}
	defer db.Close()
	// Two batches: random samples, then the model's picks.
	sum, err := tune.Tune(ctx, []*tune.Task{task}, db, runner, tune.Options{Trials: trials, Batch: max((trials+1)/2, 4), Seed: 1})
	if err != nil {
		return err
	}
	if sum[0].Best <= 0 {
		return fmt.Errorf("no valid candidate among %d", trials)
	}
	step("tune", start, "the tutorial's matmul at %d×%d×%d from its unscheduled definition (kiln tune matmul_def.py --shape %s): with the tutorial's schedule %s (%.2f GFLOPS), tuned %s (%.2f GFLOPS) after %d trials (%d invalid): %.1f× faster; records in tuning.jsonl (kiln build matmul_def.py --tuning-db tuning.jsonl)",
		n, n, n, tune.FormatShape(shape), fmtSeconds(t0), task.Flops/t0/1e9, fmtSeconds(sum[0].Best), sum[0].GFLOPS, sum[0].Trials, sum[0].Invalid, t0/sum[0].Best)
	return nil
}
