package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/node"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/tune"
	tunefleet "github.com/kiln-ml/kiln/compiler/tune/fleet"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
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
			if err := node.RunJob(context.Background(), os.Args[2]); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	register(benchmark{
		name:    "tune",
		summary: "kiln tune on 1024³ fp32 matmul from bare te.compute on an in-process fleet: tuned vs hand schedule vs numpy, trials to 90%, trials/min with 1 and 2 daemons",
		run:     runTuneBench,
	})
}

// tuneResult is the tune benchmark's report. The GFLOPS of the tuned
// kernel, the hand schedule and numpy are medians of interleaved rounds
// in this process (all threads), as in the matmul benchmark; the tuning
// itself measured each candidate on a daemon whose worker is pinned to
// one core with one OpenMP thread.
type tuneResult struct {
	Name           string   `json:"name"`
	Sizes          sizesNMK `json:"sizes"`
	Trials         int      `json:"trials"`
	Invalid        int      `json:"invalid"`
	TrialsTo90     int      `json:"trials_to_90"`
	BestDeviceMS   float64  `json:"best_device_ms"` // the best candidate's median on its daemon
	GFLOPSTuned    float64  `json:"gflops_tuned"`
	GFLOPSHand     float64  `json:"gflops_hand"`
	GFLOPSDefault  float64  `json:"gflops_default"`
	GFLOPSNumpy    float64  `json:"gflops_numpy,omitempty"`
	TunedVsHand    float64  `json:"tuned_vs_hand"`
	TunedVsNumpy   float64  `json:"tuned_vs_numpy,omitempty"`
	TunedVsDefault float64  `json:"tuned_vs_default"`
	Numpy          string   `json:"numpy,omitempty"`
	NoReference    string   `json:"no_reference,omitempty"`
	TuneSeconds    float64  `json:"tune_seconds"`
	// Trials per minute measuring the same number of new candidates on
	// one and on two daemons (each worker pinned to its own core).
	ThroughputTrials int      `json:"throughput_trials"`
	PerMin1          float64  `json:"trials_per_min_1_daemon"`
	PerMin2          float64  `json:"trials_per_min_2_daemons"`
	Scaling          float64  `json:"scaling_2_over_1"`
	Load             float64  `json:"loadavg_before"` // 1-minute load average, -1 when unknown
	Trace            []string `json:"trace"`
	Quick            bool     `json:"quick,omitempty"`
}

func (r tuneResult) Line() string {
	s := fmt.Sprintf("tune: %d×%d×%d fp32, %d trials (%d invalid, 90%% of the best after %d) in %.0f s: tuned %.1f GFLOPS, hand %.1f, default %.2f",
		r.Sizes.N, r.Sizes.M, r.Sizes.K, r.Trials, r.Invalid, r.TrialsTo90, r.TuneSeconds, r.GFLOPSTuned, r.GFLOPSHand, r.GFLOPSDefault)
	if r.GFLOPSNumpy > 0 {
		s += fmt.Sprintf(", numpy %.1f; tuned/hand %.2f, tuned/numpy %.2f", r.GFLOPSNumpy, r.TunedVsHand, r.TunedVsNumpy)
	} else {
		s += fmt.Sprintf("; tuned/hand %.2f; no numpy: %s", r.TunedVsHand, r.NoReference)
	}
	return s + fmt.Sprintf("; %.1f trials/min with 1 daemon, %.1f with 2 (×%.2f)", r.PerMin1, r.PerMin2, r.Scaling)
}

func runTuneBench(ctx context.Context, opt options) (result, error) {
	n, trials, thr, rounds, minBatch := 1024, 64, 16, 5, 200*time.Millisecond
	if opt.quick {
		n, trials, thr, rounds, minBatch = 64, 2, 1, 1, time.Millisecond
	}
	r := tuneResult{Name: "tune", Sizes: sizesNMK{n, n, n}, Quick: opt.quick, ThroughputTrials: thr, Load: loadAvg()}
	f, err := matmulFunc(n, n, n)
	if err != nil {
		return nil, err
	}
	f = f.WithAttr(ir.AttrGlobalSymbol, "matmul")
	target := compiler.Target{Kind: "cpu"}
	task, err := tune.NewTask("matmul", f, 1, rules.Target{Kind: "cpu", VectorBytes: target.VectorBytes()})
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

	measure := func(devices int, trials int, seed uint64, db *tune.Database) ([]tune.TaskSummary, time.Duration, error) {
		runner, err := tunefleet.Open(ctx, tunefleet.Config{Tracker: fl.client, Key: "cpu", Token: fl.tok, Target: target.String(),
			Devices: devices, User: "bench tune", Time: client.TimeOptions{Number: 1, Repeat: 3, MinRepeatMS: 20}})
		if err != nil {
			return nil, 0, err
		}
		defer runner.Close()
		start := time.Now()
		sum, err := tune.Tune(ctx, []*tune.Task{task}, db, runner, tune.Options{Trials: trials, Batch: 8, Seed: seed})
		return sum, time.Since(start), err
	}
	db := tune.NewDatabase(target.String())
	sum, took, err := measure(2, trials, 1, db)
	if err != nil {
		return nil, fmt.Errorf("tuning: %w", err)
	}
	r.Trials, r.Invalid, r.TrialsTo90, r.TuneSeconds = sum[0].Trials, sum[0].Invalid, sum[0].TrialsTo90, took.Seconds()
	best, ok := db.Best(task.Workload.Hash)
	if !ok {
		return nil, errors.New("tuning measured no valid candidate")
	}
	r.BestDeviceMS = best.Median() * 1e3
	tuned, err := task.Space.Replay(best.Decisions)
	if err != nil {
		return nil, err
	}
	r.Trace = tuned.Trace

	// Trials per minute: the same number of new candidates on one daemon,
	// then on two.
	for i, devs := range []int{1, 2} {
		_, took, err := measure(devs, thr, uint64(100+i), tune.NewDatabase(target.String()))
		if err != nil {
			return nil, fmt.Errorf("throughput with %d daemon(s): %w", devs, err)
		}
		rate := float64(thr) / took.Minutes()
		if devs == 1 {
			r.PerMin1 = rate
		} else {
			r.PerMin2 = rate
		}
	}
	r.Scaling = sig(r.PerMin2/r.PerMin1, 3)
	fl.stop()

	// The tuned kernel, the hand schedule, the default and numpy, here.
	s, err := schedule.New(f)
	if err != nil {
		return nil, err
	}
	if err := scheduleMatmul(s, matmulMR, matmulNR, matmulLanes); err != nil {
		return nil, fmt.Errorf("hand schedule: %w", err)
	}
	kdir := filepath.Join(dir, "kernels")
	if err := os.MkdirAll(kdir, 0o755); err != nil {
		return nil, err
	}
	var kerns []*kernel
	for _, k := range []struct {
		name string
		fn   *ir.PrimFunc
	}{{"matmul_tuned", tuned.Func}, {"matmul_hand", s.Func()}, {"matmul_default", f}} {
		kern, err := buildKernel(ctx, k.fn, k.name, kdir, compiler.BuildOptions{})
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
			if i == 2 && len(g[2]) > 0 {
				continue // the default is slow and steady: one round
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
		ref, err := runNumpy(ctx, "matmul", n, n, n, 1)
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
	r.TunedVsHand, r.TunedVsDefault = sig(r.GFLOPSTuned/r.GFLOPSHand, 3), sig(r.GFLOPSTuned/r.GFLOPSDefault, 3)
	if len(gn) > 0 {
		r.GFLOPSNumpy = sig(median(gn), 4)
		r.TunedVsNumpy = sig(r.GFLOPSTuned/r.GFLOPSNumpy, 3)
	}
	return r, nil
}

// benchFleet is an in-process tracker, compiler node and CPU device
// daemons whose session workers are pinned each to its own core and run
// kernels on one OpenMP thread.
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
			Logger: log, Worker: rpcserver.WorkerSpec{Path: exe, Env: []string{"OMP_NUM_THREADS=1"}, Wrapper: []string{"taskset", "-c", fmt.Sprint(i)}}})
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
		node.Run(ctx, node.Config{Tracker: tr.Addr(), Options: topts, Command: []string{exe, "compiler-job"},
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
