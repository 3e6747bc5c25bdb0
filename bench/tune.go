package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/compiler/topi"
	"github.com/kiln-ml/kiln/compiler/tune"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
	"github.com/kiln-ml/kiln/compilernode"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
	"github.com/kiln-ml/kiln/tunefleet"
)

func init() {
	// The in-process fleet runs this binary as its compiler node's job
	// process and its daemons' session workers.
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "rpcserver-worker":
			os.Exit(rpcserver.WorkerMain())
		case "compiler-job":
			if len(os.Args) != 3 {
				os.Exit(2)
			}
			if err := compilernode.RunJob(context.Background(), os.Args[2], os.Stdout); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	register(benchmark{
		name:    "tune",
		summary: "kiln tune on 1024³ fp32 matmul from bare te.compute on an in-process fleet (256 trials): tuned vs hand schedule (one core and all threads) vs numpy, trials to 90%, trials/min with 1 and 2 daemons, conv2d, depthwise conv2d and softmax tuned vs default and vs a numpy peer on one thread (the implicit GEMM, a copy of the bytes), the candidates of each half of the space",
		run:     runTuneBench,
	})
}

// tuneResult is the tune benchmark's report. The search measures each
// candidate on a daemon whose session worker is pinned to one core and
// runs kernels on one thread; the tuned kernel and the hand
// schedule are timed again there side by side (device figures). The
// GFLOPS of the tuned kernel, the hand schedule, the default and numpy
// are medians of interleaved rounds in this process (all threads), as in
// the matmul benchmark.
type tuneResult struct {
	Name          string   `json:"name"`
	Sizes         sizesNMK `json:"sizes"`
	Trials        int      `json:"trials"`
	Invalid       int      `json:"invalid"`
	TrialsTo90    int      `json:"trials_to_90"`
	BestDeviceMS  float64  `json:"best_device_ms"` // the best candidate's median during the search
	GFLOPSTuned   float64  `json:"gflops_tuned"`
	GFLOPSHand    float64  `json:"gflops_hand"`
	GFLOPSDefault float64  `json:"gflops_default"`
	GFLOPSNumpy   float64  `json:"gflops_numpy,omitempty"`
	TunedVsHand   float64  `json:"tuned_vs_hand"`
	TunedVsNumpy  float64  `json:"tuned_vs_numpy,omitempty"`
	// TunedVsDefault is in this process (all threads); the default
	// (unscheduled) kernel on the daemon is DefaultDeviceMS.
	TunedVsDefault float64 `json:"tuned_vs_default"`
	// The tensor-expression tutorial's schedule of this matmul
	// (s[C].parallel(C.op.axis[0]), what kiln demo shows before tuning),
	// in this process: the tuned kernel against it.
	GFLOPSTutorial  float64 `json:"gflops_tutorial"`
	TunedVsTutorial float64 `json:"tuned_vs_tutorial"`
	Numpy           string  `json:"numpy,omitempty"`
	NoReference     string  `json:"no_reference,omitempty"`
	TuneSeconds     float64 `json:"tune_seconds"`
	// The tuned kernel and the hand schedule timed again on one daemon
	// (one core, one thread), side by side, the best of three batches;
	// the default as timed when the search computed its reference.
	TunedDeviceMS     float64 `json:"tuned_device_ms"`
	HandDeviceMS      float64 `json:"hand_device_ms"`
	DefaultDeviceMS   float64 `json:"default_device_ms"`
	TunedVsHandDevice float64 `json:"tuned_vs_hand_device"`
	// Trials per minute of the search itself (builds and measurements on
	// two daemons).
	SearchPerMin float64 `json:"trials_per_min_search"`
	// Where the search's time went: the mean milliseconds of each stage
	// of a candidate (queue and compile of its build job, then upload,
	// load, check, time and wait on a device), the work stages' shares
	// of their summed time (they add up to 1), and the seconds the tuner
	// spent fitting its cost model and proposing candidates.
	SearchStages  map[string]float64 `json:"stages_ms_search"`
	SearchShares  map[string]float64 `json:"shares_search"`
	SearchSeconds float64            `json:"search_seconds"`
	searchPace    string
	// Trials per minute measuring the same candidates (the search's last
	// valid ones, built beforehand, so the figure is the devices'
	// pipeline) on one and on two daemons.
	ThroughputTrials int     `json:"throughput_trials"`
	PerMin1          float64 `json:"trials_per_min_1_daemon"`
	PerMin2          float64 `json:"trials_per_min_2_daemons"`
	Scaling          float64 `json:"scaling_2_over_1"`
	// Rounds are each round's trials per minute with 1 and 2 daemons.
	Rounds [][2]float64 `json:"throughput_rounds"`
	// Stages are the mean milliseconds per candidate of each stage of a
	// measurement on a device (upload, load, check, time; wait: a device
	// idle until its next candidate), with 1 and 2 daemons.
	Stages1 map[string]float64 `json:"stages_ms_1_daemon"`
	Stages2 map[string]float64 `json:"stages_ms_2_daemons"`
	// Others are a convolution and a softmax tuned with a smaller budget:
	// tuned vs default on the daemons.
	Others []otherTune `json:"others"`
	Load   float64     `json:"loadavg_before"` // 1-minute load average, -1 when unknown
	Trace  []string    `json:"trace"`
	// Halves are the matmul's searched candidates of each half of the
	// space; BestSchedule is what the best record is: "default" (the
	// default schedule), "rules" (the default rules with other choices)
	// or "schedule rules".
	Halves       halves `json:"halves"`
	BestSchedule string `json:"best_schedule"`
	// DefaultScheduleMS is the default schedule's median on the
	// daemons during the search, BestVsDefaultSchedule its ratio to the
	// best record's.
	DefaultScheduleMS     float64 `json:"default_schedule_ms"`
	BestVsDefaultSchedule float64 `json:"best_vs_default_schedule"`
	Quick                 bool    `json:"quick,omitempty"`
	// Part is the part of the benchmark that ran (--part), when not all.
	Part string `json:"part,omitempty"`
}

// otherTune is one more kernel tuned by the benchmark.
type otherTune struct {
	Name           string  `json:"name"`
	Shape          string  `json:"shape"`
	Trials         int     `json:"trials"`
	Invalid        int     `json:"invalid"`
	DefaultMS      float64 `json:"default_device_ms"` // the unscheduled kernel
	BestMS         float64 `json:"best_device_ms"`
	TunedVsDefault float64 `json:"tuned_vs_default"`
	// The default schedule (what kiln builds the kernel with untuned),
	// which the search measures first: the best against it, and the best
	// of the other candidates (the space's own) against it.
	DefaultScheduleMS     float64 `json:"default_schedule_ms"`
	TunedVsDefaultSched   float64 `json:"tuned_vs_default_schedule"`
	BestSearchedMS        float64 `json:"best_searched_ms"`
	SearchedVsDefaultSchd float64 `json:"searched_vs_default_schedule"`
	// HeadToHead are the default schedule and the best candidate timed
	// again one after the other at the end of the search (no build in
	// flight), when the best was not the default, and the default's time
	// over the best's: the fair comparison of the two on a machine whose
	// load changes during the search.
	HeadToHeadDefaultMS float64 `json:"head_to_head_default_ms,omitempty"`
	HeadToHeadBestMS    float64 `json:"head_to_head_best_ms,omitempty"`
	HeadToHeadRatio     float64 `json:"head_to_head_ratio,omitempty"`
	// Halves are the searched candidates of each half of the space.
	Halves halves `json:"halves"`
	// Peer is what a faster schedule has to beat, timed on one thread
	// in the same run (empty without numpy): for the convolution numpy's
	// (OpenBLAS's) matrix product of its implicit GEMM (output positions
	// × filters × input channels·window; the im2col copy not counted),
	// for the depthwise convolution and the softmax numpy copying the
	// kernel's output size of floats (the bytes the kernel reads and
	// writes at least once). DefaultVsPeer is the default schedule's
	// time (side by side, else in the search) over the peer's: near 1
	// or below, the default is at that bound.
	Peer          string  `json:"peer,omitempty"`
	PeerMS        float64 `json:"peer_ms,omitempty"`
	DefaultVsPeer float64 `json:"default_vs_peer,omitempty"`
}

// halves counts the measured candidates of each half of a task's design
// space (the default schedule itself apart) and the best of each.
type halves struct {
	// ScheduleRules are the candidates of compiler/tune/rules' schedule
	// rules (multi-level tiling…), DefaultRules those of the default
	// rules with other choices than their own.
	ScheduleRules half `json:"schedule_rules"`
	DefaultRules  half `json:"default_rules"`
}

// half is one half's count of measured candidates, how many of them were
// invalid, and the best valid one's median (0: none).
type half struct {
	Trials  int     `json:"trials"`
	Invalid int     `json:"invalid"`
	BestMS  float64 `json:"best_ms,omitempty"`
}

// defaultScheduleMS is the median of the default schedule's last valid
// record of the search in db for a workload (a head-to-head's apart), in
// milliseconds (0: none).
func defaultScheduleMS(db *tune.Database, hash string) float64 {
	ms := 0.0
	for _, rec := range db.Records(hash) {
		if rec.Valid() && rec.Schedule == tune.DefaultSchedule && rec.Pair == 0 {
			ms = sig(rec.Median()*1e3, 4)
		}
	}
	return ms
}

// halvesOf counts the records of the search in db for a workload by
// half.
func halvesOf(db *tune.Database, hash string) halves {
	var h halves
	for _, rec := range db.Records(hash) {
		if rec.Pair != 0 {
			continue // a head-to-head's timing, not a searched candidate
		}
		var x *half
		switch rec.Schedule {
		case "":
			x = &h.ScheduleRules
		case tune.RulesSchedule:
			x = &h.DefaultRules
		default:
			continue
		}
		x.Trials++
		if !rec.Valid() {
			x.Invalid++
			continue
		}
		if ms := sig(rec.Median()*1e3, 4); x.BestMS == 0 || ms < x.BestMS {
			x.BestMS = ms
		}
	}
	return h
}

func (h halves) String() string {
	return fmt.Sprintf("searched %d of the schedule rules (best %.3g ms), %d of the default rules' choices (best %.3g ms)",
		h.ScheduleRules.Trials, h.ScheduleRules.BestMS, h.DefaultRules.Trials, h.DefaultRules.BestMS)
}

func (r tuneResult) Line() string {
	switch r.Part {
	case "others":
		return "tune:" + r.othersLine()[1:]
	case "scaling":
		return fmt.Sprintf("tune: %d×%d×%d fp32, %d trials in %.0f s (%.1f a minute: %s); measuring %d built candidates: %.1f trials/min with 1 daemon, %.1f with 2 (×%.2f; rounds %v); ms per candidate with 1 daemon %v, with 2 %v",
			r.Sizes.N, r.Sizes.M, r.Sizes.K, r.Trials, r.TuneSeconds, r.SearchPerMin, r.searchPace, r.ThroughputTrials, r.PerMin1, r.PerMin2, r.Scaling, r.Rounds, r.Stages1, r.Stages2)
	}
	s := fmt.Sprintf("tune: %d×%d×%d fp32, %d trials (%d invalid, 90%% of the best after %d) in %.0f s: on one core tuned %.3g ms, hand %.3g ms (tuned/hand %.2f), default %.4g ms; all threads: tuned %.1f GFLOPS, hand %.1f, default %.2f",
		r.Sizes.N, r.Sizes.M, r.Sizes.K, r.Trials, r.Invalid, r.TrialsTo90, r.TuneSeconds, r.TunedDeviceMS, r.HandDeviceMS, r.TunedVsHandDevice, r.DefaultDeviceMS,
		r.GFLOPSTuned, r.GFLOPSHand, r.GFLOPSDefault)
	s += fmt.Sprintf(", the tutorial's schedule %.2f (tuned ×%.0f)", r.GFLOPSTutorial, r.TunedVsTutorial)
	if r.GFLOPSNumpy > 0 {
		s += fmt.Sprintf(", numpy %.1f; tuned/hand %.2f, tuned/numpy %.2f", r.GFLOPSNumpy, r.TunedVsHand, r.TunedVsNumpy)
	} else {
		s += fmt.Sprintf("; tuned/hand %.2f; no numpy: %s", r.TunedVsHand, r.NoReference)
	}
	s += fmt.Sprintf("; %v, the best a candidate of %q, ×%.2f the default schedule (%.4g ms); search %.1f trials/min (%s); measuring built candidates %.1f trials/min with 1 daemon, %.1f with 2 (×%.2f)", r.Halves, r.BestSchedule, r.BestVsDefaultSchedule, r.DefaultScheduleMS, r.SearchPerMin, r.searchPace, r.PerMin1, r.PerMin2, r.Scaling)
	return s + r.othersLine()
}

// othersLine renders the other kernels, each after "; ".
func (r tuneResult) othersLine() string {
	var s string
	for _, o := range r.Others {
		s += fmt.Sprintf("; %s %s: tuned %.3g ms vs unscheduled %.4g ms (×%.1f), vs the default schedule %.3g ms (×%.2f; the best searched candidate ×%.2f), %d trials: %v",
			o.Name, o.Shape, o.BestMS, o.DefaultMS, o.TunedVsDefault, o.DefaultScheduleMS, o.TunedVsDefaultSched, o.SearchedVsDefaultSchd, o.Trials, o.Halves)
		if o.HeadToHeadRatio > 0 {
			s += fmt.Sprintf("; timed again side by side: the default %.3g ms, the best %.3g ms (×%.2f)", o.HeadToHeadDefaultMS, o.HeadToHeadBestMS, o.HeadToHeadRatio)
		}
		if o.PeerMS > 0 {
			s += fmt.Sprintf("; %s %.3g ms (the default ×%.2f of it)", o.Peer, o.PeerMS, o.DefaultVsPeer)
		}
	}
	return s
}

func runTuneBench(ctx context.Context, opt options) (result, error) {
	n, trials, batch, thr, thrRounds, otherTrials, rounds, minBatch := 1024, 256, 16, 16, 3, 32, 5, 200*time.Millisecond
	if opt.quick {
		n, trials, batch, thr, thrRounds, otherTrials, rounds, minBatch = 64, 4, 2, 2, 1, 2, 1, time.Millisecond
	}
	if opt.trials > 0 {
		trials, otherTrials = opt.trials, max(opt.trials/8, 2)
	}
	switch opt.part {
	case "", "scaling":
	case "others":
		if opt.trials > 0 {
			otherTrials = opt.trials
		}
	default:
		return nil, fmt.Errorf("--part %q: want scaling or others", opt.part)
	}
	r := tuneResult{Name: "tune", Sizes: sizesNMK{n, n, n}, Quick: opt.quick, Load: loadAvg()}
	f, err := matmulFunc(n, n, n)
	if err != nil {
		return nil, err
	}
	f = f.WithAttr(ir.AttrGlobalSymbol, "matmul")
	target, info, err := benchTargetInfo(opt.target)
	if err != nil {
		return nil, err
	}
	rtarget, err := target.TuneTarget()
	if err != nil {
		return nil, err
	}
	task, err := tune.NewTask("matmul", f, 1, rtarget)
	if err != nil {
		return nil, err
	}
	s, err := schedule.New(f)
	if err != nil {
		return nil, err
	}
	mr, nr, lanes := matmulHandTile(info)
	if err := scheduleMatmul(s, mr, nr, lanes); err != nil {
		return nil, fmt.Errorf("hand schedule: %w", err)
	}
	hand := s.Func()
	tutorial, err := tutorialSchedule(f)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kiln-bench-tune-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	// A build cache of its own: every candidate is compiled, here and in
	// any later run.
	if err := os.Setenv("XDG_CACHE_HOME", filepath.Join(dir, "cache")); err != nil {
		return nil, err
	}
	fl, err := startBenchFleet(ctx, dir, 2)
	if err != nil {
		return nil, err
	}
	defer fl.stop()
	// The search's runner times each task's unscheduled function (the
	// default figures); later runners, and the scaling part's, need only
	// the reference result.
	noDefault := opt.part == "scaling"
	open := func(devices int) (*tunefleet.Runner, error) {
		return tunefleet.Open(ctx, tunefleet.Config{Tracker: fl.client, Key: "cpu", Token: fl.tok, Target: target.String(),
			Devices: devices, User: "bench tune", NoDefault: noDefault, Time: client.TimeOptions{Number: 1, Repeat: 6, MinRepeatMS: 10}})
	}

	// The search, on both daemons; then the other kernels.
	runner, err := open(2)
	if err != nil {
		return nil, err
	}
	defer runner.Close()
	if opt.part == "others" {
		r.Part = opt.part
		r.Others, err = tuneOthers(ctx, runner, rtarget, numpyEnv(target), otherTrials, opt.quick)
		return r, err
	}
	db := tune.NewDatabase(target.String())
	start := time.Now()
	var search time.Duration
	sum, err := tune.Tune(ctx, []*tune.Task{task}, db, runner, tune.Options{Trials: trials, Batch: batch, Seed: 1, Progress: func(p tune.Progress) { search = p.Search }})
	if err != nil {
		return nil, fmt.Errorf("tuning: %w", err)
	}
	st := runner.Stages()
	r.SearchStages, r.SearchShares, r.SearchSeconds = st.Map(), st.Shares(), sig(search.Seconds(), 3)
	for k, v := range r.SearchShares {
		r.SearchShares[k] = sig(v, 3)
	}
	r.searchPace = fmt.Sprintf("%s; the search itself %.3g s", st, search.Seconds())
	r.Trials, r.Invalid, r.TrialsTo90, r.TuneSeconds = sum[0].Trials, sum[0].Invalid, sum[0].TrialsTo90, time.Since(start).Seconds()
	r.SearchPerMin = sig(float64(r.Trials)/r.TuneSeconds*60, 3)
	if d, ok := runner.Default(task); ok {
		r.DefaultDeviceMS = sig(d*1e3, 4)
	}
	best, ok := db.Best(task.Workload.Hash)
	if !ok {
		return nil, errors.New("tuning measured no valid candidate")
	}
	r.BestDeviceMS = sig(best.Median()*1e3, 4)
	tuned, err := task.Space.Candidate(best)
	if err != nil {
		return nil, err
	}
	r.Trace = tuned.Trace
	r.Halves, r.BestSchedule = halvesOf(db, task.Workload.Hash), best.Schedule
	if best.Schedule == "" {
		r.BestSchedule = "schedule rules"
	}
	if d := defaultScheduleMS(db, task.Workload.Hash); d > 0 {
		r.DefaultScheduleMS, r.BestVsDefaultSchedule = d, sig(d/r.BestDeviceMS, 3)
	}
	noDefault = true
	if opt.part == "scaling" {
		r.Part = opt.part
		runner.Close()
		if err := tuneThroughput(ctx, &r, open, task, db, thr, thrRounds); err != nil {
			return nil, err
		}
		return r, nil
	}
	if r.Others, err = tuneOthers(ctx, runner, rtarget, numpyEnv(target), otherTrials, opt.quick); err != nil {
		return nil, err
	}
	runner.Close()

	// One daemon: the tuned kernel and the hand schedule side by side,
	// then the throughput figures.
	if err := compareOnDevice(ctx, &r, open, task, tuned.Func, hand); err != nil {
		return nil, err
	}
	if err := tuneThroughput(ctx, &r, open, task, db, thr, thrRounds); err != nil {
		return nil, err
	}
	fl.stop()

	// The tuned kernel, the hand schedule, the default and numpy, here.
	kdir := filepath.Join(dir, "kernels")
	if err := os.MkdirAll(kdir, 0o755); err != nil {
		return nil, err
	}
	var kerns []*kernel
	for _, k := range []struct {
		name string
		fn   *ir.PrimFunc
	}{{"matmul_tuned", tuned.Func}, {"matmul_hand", hand}, {"matmul_default", f}, {"matmul_tutorial", tutorial}} {
		// The default is the unscheduled function: built as it is.
		kern, err := buildKernel(ctx, k.fn, k.name, kdir, target, compiler.BuildOptions{NoDefaultSchedule: k.fn == f})
		if err != nil {
			return nil, err
		}
		defer kern.close()
		kerns = append(kerns, kern)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	a, err := randomArray(rng, n, n)
	if err != nil {
		return nil, err
	}
	b, err := randomArray(rng, n, n)
	if err != nil {
		return nil, err
	}
	c, err := randomArray(rng, n, n)
	if err != nil {
		return nil, err
	}
	args := []packedfunc.Value{packedfunc.Array(a), packedfunc.Array(b), packedfunc.Array(c)}
	for _, kern := range kerns {
		if _, err := kern.fn.Call(args...); err != nil {
			return nil, fmt.Errorf("%s: %w", kern.name, err)
		}
		if _, _, err := checkMatmul(rng, a, b, c, n, n, n, opt.quick); err != nil {
			return nil, fmt.Errorf("%s: %w", kern.name, err)
		}
		if err := fillRandom(rng, c); err != nil {
			return nil, err
		}
	}
	flops := 2 * float64(n) * float64(n) * float64(n)
	g := make([][]float64, len(kerns))
	var gn []float64
	for range rounds {
		for i, kern := range kerns {
			if i >= 2 && len(g[i]) > 0 {
				continue // the default and the tutorial's are slow and steady: one round
			}
			t, err := timeCalls(ctx, func() error { _, err := kern.fn.Call(args...); return err }, minBatch)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", kern.name, err)
			}
			g[i] = append(g[i], flops/t/1e9)
		}
		if r.NoReference != "" {
			continue
		}
		ref, err := runNumpyEnv(ctx, numpyEnv(target), "matmul", n, n, n, 1)
		if errors.Is(err, errNoReference) {
			r.NoReference = err.Error()
			continue
		}
		if err != nil {
			return nil, err
		}
		r.Numpy = numpyName(ref)
		gn = append(gn, num(ref, "gflops"))
	}
	r.GFLOPSTuned, r.GFLOPSHand, r.GFLOPSDefault = sig(median(g[0]), 4), sig(median(g[1]), 4), sig(median(g[2]), 3)
	r.GFLOPSTutorial = sig(median(g[3]), 3)
	r.TunedVsTutorial = sig(r.GFLOPSTuned/r.GFLOPSTutorial, 3)
	r.TunedVsHand, r.TunedVsDefault = sig(r.GFLOPSTuned/r.GFLOPSHand, 3), sig(r.GFLOPSTuned/r.GFLOPSDefault, 3)
	if len(gn) > 0 {
		r.GFLOPSNumpy = sig(median(gn), 4)
		r.TunedVsNumpy = sig(r.GFLOPSTuned/r.GFLOPSNumpy, 3)
	}
	return r, nil
}

// tutorialSchedule is the tensor-expression tutorial's schedule of the
// matmul f: its first loop in parallel.
func tutorialSchedule(f *ir.PrimFunc) (*ir.PrimFunc, error) {
	s, err := schedule.New(f)
	if err != nil {
		return nil, err
	}
	c, err := s.GetBlock("C")
	if err != nil {
		return nil, err
	}
	l, err := s.GetLoops(c)
	if err != nil {
		return nil, err
	}
	if err := s.Parallel(l[0]); err != nil {
		return nil, err
	}
	return s.Func(), nil
}

// compareOnDevice times the tuned kernel and the hand schedule side by
// side on one daemon, as the search timed its candidates: built once,
// measured in compareRounds batches, each kernel's best median kept (on a
// loaded machine a round can be slowed down by other work; never sped
// up).
func compareOnDevice(ctx context.Context, r *tuneResult, open func(int) (*tunefleet.Runner, error), task *tune.Task, tuned, hand *ir.PrimFunc) error {
	runner, err := open(1)
	if err != nil {
		return err
	}
	defer runner.Close()
	built, err := runner.Build(ctx, task, []*tune.Candidate{{Func: tuned}, {Func: hand}})
	if err != nil {
		return fmt.Errorf("tuned and hand schedule on one daemon: %w", err)
	}
	best := []float64{math.Inf(1), math.Inf(1)}
	for range compareRounds {
		res, err := runner.Measure(ctx, task, built)
		if err != nil {
			return fmt.Errorf("tuned and hand schedule on one daemon: %w", err)
		}
		for i, x := range res {
			if x.Error != "" {
				return fmt.Errorf("%s on the daemon: %s: %s", []string{"the tuned kernel", "the hand schedule"}[i], x.Stage, x.Error)
			}
			best[i] = min(best[i], median(x.Times))
		}
	}
	t, h := best[0], best[1]
	r.TunedDeviceMS, r.HandDeviceMS, r.TunedVsHandDevice = sig(t*1e3, 4), sig(h*1e3, 4), sig(h/t, 3)
	return nil
}

// compareRounds is how many times compareOnDevice measures the pair.
const compareRounds = 3

// tuneThroughput measures the same candidates (the search's last valid
// ones), built once beforehand, on one daemon and on two, alternately in
// rounds: the figure is the devices' pipeline (upload, load, run, check,
// time), the part that daemons scale; builds are the compiler nodes'
// part. Both daemons stay leased throughout (the one-daemon rounds leave
// the second idle). The rates are the rounds' medians, the scaling the
// median of the rounds' ratios.
func tuneThroughput(ctx context.Context, r *tuneResult, open func(int) (*tunefleet.Runner, error), task *tune.Task, db *tune.Database, n, rounds int) error {
	var cands []*tune.Candidate
	recs := db.Records(task.Workload.Hash)
	for i := len(recs) - 1; i >= 0 && len(cands) < n; i-- {
		if !recs[i].Valid() {
			continue
		}
		c, err := task.Space.Candidate(recs[i])
		if err != nil {
			return err
		}
		cands = append(cands, c)
	}
	r.ThroughputTrials = len(cands)
	runner, err := open(2)
	if err != nil {
		return err
	}
	defer runner.Close()
	if got := len(runner.Devices()); got != 2 {
		return fmt.Errorf("throughput: %d daemon(s) leased, want 2", got)
	}
	built, err := runner.Build(ctx, task, cands)
	if err != nil {
		return fmt.Errorf("throughput: %w", err)
	}
	if err := runner.Prepare(ctx, task); err != nil {
		return fmt.Errorf("throughput: %w", err)
	}
	var rates [2][]float64
	var stages [2]tunefleet.Stages
	for range rounds {
		for k := range 2 {
			runner.ResetStages()
			start := time.Now()
			if _, err := runner.MeasureOn(ctx, task, built, k+1); err != nil {
				return fmt.Errorf("throughput with %d daemon(s): %w", k+1, err)
			}
			rates[k] = append(rates[k], float64(len(built))/time.Since(start).Minutes())
			st := runner.Stages()
			for i := range st.Total {
				stages[k].Total[i] += st.Total[i]
				stages[k].Count[i] += st.Count[i]
			}
		}
	}
	var ratios []float64
	for i := range rates[0] {
		ratios = append(ratios, rates[1][i]/rates[0][i])
		r.Rounds = append(r.Rounds, [2]float64{sig(rates[0][i], 3), sig(rates[1][i], 3)})
	}
	r.PerMin1, r.PerMin2, r.Scaling = sig(median(rates[0]), 3), sig(median(rates[1]), 3), sig(median(ratios), 3)
	r.Stages1, r.Stages2 = stages[0].Map(), stages[1].Map()
	return nil
}

// tuneOthers tunes a 3×3 convolution (a ResNet layer's shape), a 3×3
// depthwise convolution (a MobileNetV2 layer's) and a softmax with trials
// each on runner and reports them against their unscheduled functions
// and default schedules.
func tuneOthers(ctx context.Context, runner *tunefleet.Runner, target rules.Target, env []string, trials int, quick bool) ([]otherTune, error) {
	c, hw, dc, rows, cols := int64(64), int64(56), int64(144), int64(512), int64(1024)
	if quick {
		c, hw, dc, rows, cols = 8, 8, 8, 8, 16
	}
	x := te.Placeholder(te.Shape(1, c, hw, hw), ir.Float32, "data")
	w := te.Placeholder(te.Shape(c, c, 3, 3), ir.Float32, "weight")
	y, err := topi.Conv2D(x, w, topi.Conv2DAttrs{Padding: [4]int64{1, 1, 1, 1}})
	if err != nil {
		return nil, err
	}
	conv, err := te.CreatePrimFunc([]*te.Tensor{x, w, y})
	if err != nil {
		return nil, err
	}
	dx := te.Placeholder(te.Shape(1, dc, hw, hw), ir.Float32, "data")
	dw := te.Placeholder(te.Shape(dc, 1, 3, 3), ir.Float32, "weight")
	dy, err := topi.Conv2D(dx, dw, topi.Conv2DAttrs{Padding: [4]int64{1, 1, 1, 1}, Groups: dc})
	if err != nil {
		return nil, err
	}
	depthwise, err := te.CreatePrimFunc([]*te.Tensor{dx, dw, dy})
	if err != nil {
		return nil, err
	}
	sx := te.Placeholder(te.Shape(rows, cols), ir.Float32, "x")
	sy, err := topi.Softmax(sx, 1)
	if err != nil {
		return nil, err
	}
	sm, err := te.CreatePrimFunc([]*te.Tensor{sx, sy})
	if err != nil {
		return nil, err
	}
	var out []otherTune
	// The peers, on one thread as the daemons' workers.
	env = append(slices.Clone(env), "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1")
	for _, k := range []struct {
		name, shape string
		fn          *ir.PrimFunc
		peer        string
		peerArgs    []int
	}{
		{"conv2d", fmt.Sprintf("1×%d×%d×%d, %d 3×3 filters, pad 1", c, hw, hw, c), conv, "matmul", []int{int(hw * hw), int(c), int(c * 9), 5}},
		{"depthwise_conv2d", fmt.Sprintf("1×%d×%d×%d, 3×3 depthwise, pad 1", dc, hw, hw), depthwise, "copy", []int{int(dc * hw * hw), 5}},
		{"softmax", fmt.Sprintf("%d×%d", rows, cols), sm, "copy", []int{int(rows * cols), 5}},
	} {
		task, err := tune.NewTask(k.name, k.fn.WithAttr(ir.AttrGlobalSymbol, k.name), 1, target)
		if err != nil {
			return nil, err
		}
		db := tune.NewDatabase("cpu")
		sum, err := tune.Tune(ctx, []*tune.Task{task}, db, runner, tune.Options{Trials: trials, Batch: min(trials, 16), Seed: 1, HeadToHead: true})
		if err != nil {
			return nil, fmt.Errorf("tuning %s: %w", k.name, err)
		}
		o := otherTune{Name: k.name, Shape: k.shape, Trials: sum[0].Trials, Invalid: sum[0].Invalid, BestMS: sig(sum[0].Best*1e3, 4)}
		if d, ok := runner.Default(task); ok && sum[0].Best > 0 {
			o.DefaultMS, o.TunedVsDefault = sig(d*1e3, 4), sig(d/sum[0].Best, 3)
		}
		searched := math.Inf(1)
		for _, rec := range db.Records(task.Workload.Hash) {
			if rec.Valid() && rec.Schedule != tune.DefaultSchedule && rec.Pair == 0 {
				searched = min(searched, rec.Median())
			}
		}
		o.DefaultScheduleMS = defaultScheduleMS(db, task.Workload.Hash)
		if o.DefaultScheduleMS > 0 && sum[0].Best > 0 {
			o.TunedVsDefaultSched = sig(o.DefaultScheduleMS/(sum[0].Best*1e3), 3)
		}
		if !math.IsInf(searched, 1) {
			o.BestSearchedMS = sig(searched*1e3, 4)
			if o.DefaultScheduleMS > 0 {
				o.SearchedVsDefaultSchd = sig(o.DefaultScheduleMS/o.BestSearchedMS, 3)
			}
		}
		if h := sum[0].HeadToHead; h != nil && h.Best > 0 {
			o.HeadToHeadDefaultMS, o.HeadToHeadBestMS = sig(h.Default*1e3, 4), sig(h.Best*1e3, 4)
			o.HeadToHeadRatio = sig(h.Default/h.Best, 3)
		}
		o.Halves = halvesOf(db, task.Workload.Hash)
		if err := o.timePeer(ctx, env, k.peer, k.peerArgs); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// timePeer times the kernel's peer (numpy's op with args on one thread)
// and compares the default schedule with it; without numpy it records
// nothing.
func (o *otherTune) timePeer(ctx context.Context, env []string, op string, args []int) error {
	ref, err := runNumpyEnv(ctx, env, op, args...)
	if errors.Is(err, errNoReference) {
		return nil
	}
	if err != nil {
		return err
	}
	sec := num(ref, "seconds")
	if sec <= 0 {
		return fmt.Errorf("numpy reference %s: no seconds in %v", op, ref)
	}
	o.PeerMS = sig(sec*1e3, 4)
	switch op {
	case "matmul":
		o.Peer = fmt.Sprintf("%s's %d×%d×%d matrix product (the implicit GEMM), one thread", numpyName(ref), args[0], args[1], args[2])
	default:
		o.Peer = fmt.Sprintf("%s copying %d floats, one thread", numpyName(ref), args[0])
	}
	d := o.HeadToHeadDefaultMS
	if d <= 0 {
		d = o.DefaultScheduleMS
	}
	if d > 0 {
		o.DefaultVsPeer = sig(d/o.PeerMS, 3)
	}
	return nil
}

// benchFleet is an in-process tracker, compiler node and CPU device
// daemons whose session workers are pinned each to its own core and run
// kernels on one thread.
type benchFleet struct {
	client *client.Tracker
	tok    string
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

func startBenchFleet(ctx context.Context, dir string, daemons int) (*benchFleet, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	fl := &benchFleet{tok: "bench-tune", cancel: cancel}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tr, err := tracker.New(tracker.Config{Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, "tracker"), Token: fl.tok, Logger: log})
	if err != nil {
		cancel()
		return nil, err
	}
	fl.go_(func() { tr.Run(ctx) })
	topts := client.TrackerOptions{Token: fl.tok, Logger: log}
	for i := range daemons {
		d, err := rpcserver.New(rpcserver.Config{Listen: "127.0.0.1:0", Key: "cpu", Token: fl.tok, Dir: filepath.Join(dir, fmt.Sprint("sessions", i)),
			Logger: log, Worker: rpcserver.WorkerSpec{Path: exe, Env: []string{cpu.EnvThreads + "=1"}, Wrapper: []string{"taskset", "-c", fmt.Sprint(i)}, OwnSession: true}})
		if err != nil {
			fl.stop()
			return nil, err
		}
		reg := client.NewRegistrar(tr.Addr(), topts, proto.RegisterArgs{Role: proto.NodeDevice, Key: "cpu", Addr: d.Addr().String(), Attrs: rpcserver.NodeAttrs("bench")})
		d.SetTracker(reg)
		fl.go_(func() { d.Run(ctx) })
	}
	ready := make(chan struct{})
	fl.go_(func() {
		compilernode.Run(ctx, compilernode.Config{Tracker: tr.Addr(), Options: topts, Command: []string{exe, "compiler-job"},
			WorkDir: filepath.Join(dir, "compiler"), Ready: ready, Version: "bench", Logger: log, Concurrency: 2})
	})
	if fl.client, err = client.DialTracker(ctx, tr.Addr(), topts); err != nil {
		fl.stop()
		return nil, err
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	select {
	case <-ready:
	case <-wctx.Done():
		fl.stop()
		return nil, errors.New("the compiler node did not register")
	}
	for {
		s, err := fl.client.Query(wctx, 0)
		if err != nil {
			fl.stop()
			return nil, err
		}
		for _, k := range s.Keys {
			if k.Key == "cpu" && k.Free >= daemons {
				return fl, nil
			}
		}
		select {
		case <-wctx.Done():
			fl.stop()
			return nil, errors.New("the device daemons did not register")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (fl *benchFleet) go_(f func()) {
	fl.wg.Add(1)
	go func() {
		defer fl.wg.Done()
		f()
	}()
}

func (fl *benchFleet) stop() {
	fl.once.Do(func() {
		if fl.client != nil {
			fl.client.Close()
		}
		fl.cancel()
		fl.wg.Wait()
	})
}
