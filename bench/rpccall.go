package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/rpcserver"
)

// benchWorkerEnv makes this binary (bench, or its test binary) run as a
// device daemon's session worker: the daemons the rpc-call, upload and
// timing-fidelity benchmarks start serve each session in a subprocess of
// this binary, as `kiln rpcserver` does with `kiln rpcserver-worker`.
const benchWorkerEnv = "KILN_BENCH_WORKER"

func init() {
	if os.Getenv(benchWorkerEnv) == "1" {
		os.Exit(rpcserver.WorkerMain())
	}
	register(benchmark{
		name:    "rpc-call",
		summary: "round trip of an empty remote function (rpcserver.nop) through a device daemon and its worker on loopback",
		run:     runRPCCall,
	})
}

// rpcCallGoalUS is the goal for the median round trip (about twice a bare
// two-process TCP ping-pong on loopback).
const rpcCallGoalUS = 30

// rpcCallResult is the rpc-call benchmark's report.
type rpcCallResult struct {
	Name      string  `json:"name"`
	MedianUS  float64 `json:"median_us"` // median of single calls, µs
	P99US     float64 `json:"p99_us"`    // 99th percentile, µs
	MeanUS    float64 `json:"mean_us"`
	MinUS     float64 `json:"min_us"`
	GoalUS    float64 `json:"goal_us"` // the target for MedianUS
	MeetsGoal bool    `json:"meets_goal"`
	Calls     int     `json:"calls"`
	// FloorMedianUS and FloorP99US are a bare one-byte TCP ping-pong
	// between this process and a subprocess, measured in the same run:
	// what two processes on loopback cost with no protocol. Ratio is
	// MedianUS / FloorMedianUS.
	FloorMedianUS float64 `json:"floor_median_us"`
	FloorP99US    float64 `json:"floor_p99_us"`
	Ratio         float64 `json:"ratio_to_floor"`
	Quick         bool    `json:"quick,omitempty"`
}

func (r rpcCallResult) Line() string {
	return fmt.Sprintf("rpc-call: empty remote function round trip median %.1f µs, p99 %.1f µs, mean %.1f µs, min %.1f µs (goal median ≤ %.0f µs) over %d calls; bare TCP ping-pong between two processes median %.1f µs, p99 %.1f µs (ratio %.1f)",
		r.MedianUS, r.P99US, r.MeanUS, r.MinUS, r.GoalUS, r.Calls, r.FloorMedianUS, r.FloorP99US, r.Ratio)
}

// benchDaemon is a device daemon in this process on 127.0.0.1:0 whose
// session workers are subprocesses of this binary.
type benchDaemon struct {
	d      *rpcserver.Daemon
	dir    string
	cancel context.CancelFunc
	done   chan error
}

// startBenchDaemon starts a daemon with no tracker (sessions need no
// lease) and its session files in a temporary directory; configure
// changes its configuration first.
func startBenchDaemon(ctx context.Context, configure ...func(*rpcserver.Config)) (*benchDaemon, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench daemon: %w", err)
	}
	dir, err := os.MkdirTemp("", "kiln-bench-daemon-")
	if err != nil {
		return nil, fmt.Errorf("bench daemon: %w", err)
	}
	env := []string{benchWorkerEnv + "=1",
		// A race-enabled binary sleeps a second at exit unless told not to.
		"GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")}
	cfg := rpcserver.Config{
		Listen: "127.0.0.1:0", Key: "bench", Dir: dir, DrainTimeout: time.Second,
		Worker: rpcserver.WorkerSpec{Path: exe, Args: rpcserver.DefaultWorkerArgs, Env: env},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, f := range configure {
		f(&cfg)
	}
	d, err := rpcserver.New(cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("bench daemon: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	bd := &benchDaemon{d: d, dir: dir, cancel: cancel, done: make(chan error, 1)}
	go func() { bd.done <- d.Run(ctx) }()
	return bd, nil
}

// connect opens a session on the daemon.
func (bd *benchDaemon) connect(ctx context.Context) (*client.Session, error) {
	s, err := client.Connect(ctx, bd.d.Addr().String(), client.SessionOptions{})
	if err != nil {
		return nil, fmt.Errorf("bench daemon: %w", err)
	}
	return s, nil
}

// stop stops the daemon, waits for it and removes its files.
func (bd *benchDaemon) stop() error {
	bd.cancel()
	err := <-bd.done
	return errors.Join(err, os.RemoveAll(bd.dir))
}

// runRPCCall times single calls of the worker's empty global function.
func runRPCCall(ctx context.Context, opt options) (_ result, err error) {
	calls, warm := 20000, 500
	if opt.quick {
		calls, warm = 50, 10
	}
	bd, err := startBenchDaemon(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, bd.stop()) }()
	s, err := bd.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	nop, err := s.GetGlobal(ctx, rpcserver.GlobalNop)
	if err != nil {
		return nil, err
	}
	for range warm {
		if _, err := nop.Call(ctx); err != nil {
			return nil, fmt.Errorf("warm-up call: %w", err)
		}
	}
	lat := make([]float64, calls)
	for i := range lat {
		start := time.Now()
		if _, err := nop.Call(ctx); err != nil {
			return nil, fmt.Errorf("call %d: %w", i, err)
		}
		lat[i] = float64(time.Since(start).Nanoseconds()) / 1e3
	}
	var sum float64
	for _, x := range lat {
		sum += x
	}
	slices.Sort(lat)
	floor, err := pingPong(ctx, calls)
	if err != nil {
		return nil, err
	}
	r := rpcCallResult{
		Name: "rpc-call", MedianUS: round(median(lat), 2), P99US: round(percentile(lat, 0.99), 2),
		MeanUS: round(sum/float64(len(lat)), 2), MinUS: round(lat[0], 2), GoalUS: rpcCallGoalUS,
		Calls: calls, Quick: opt.quick,
		FloorMedianUS: round(median(floor), 2), FloorP99US: round(percentile(floor, 0.99), 2),
	}
	if r.FloorMedianUS > 0 {
		r.Ratio = round(r.MedianUS/r.FloorMedianUS, 2)
	}
	r.MeetsGoal = r.MedianUS <= rpcCallGoalUS
	return r, nil
}

// percentile returns the p-quantile (0 ≤ p ≤ 1) of sorted xs, nearest rank.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
