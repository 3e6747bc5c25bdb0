package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/load"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/rpcserver/timer"
)

func init() {
	register(benchmark{
		name:    "timing-fidelity",
		summary: "a ~1 ms CPU kernel timed by a device daemon's time evaluator against the same kernel timed in-process",
		run:     runFidelity,
	})
}

// fidelityGoal is the timing contract's goal: the remote figure within 3% of the
// in-process one.
const fidelityGoal = 0.03

// spinSource is a kernel whose time is set by its argument: a chain of
// dependent floating-point operations, so neither the compiler nor the
// CPU can shorten it.
const spinSource = `#include "kiln_abi.h"

KILN_DEFINE_LAST_ERROR()

static volatile double spin_sink;

KILN_EXPORT int32_t spin(KilnValue* args, int32_t* codes, int32_t n) {
  if (n != 1 || codes[0] != KILN_ARG_INT) {
    kiln_set_last_error("spin: want one int argument");
    return 1;
  }
  int64_t iters = args[0].v_int64;
  double x = 1.0;
  for (int64_t i = 0; i < iters; i++) x = x * 1.0000001 + 1e-9;
  spin_sink = x;
  return 0;
}

KILN_EXPORT const char* kiln_module_metadata(void) {
  return "{\"format_version\":1,\"target\":\"c\",\"functions\":["
         "{\"name\":\"spin\",\"params\":[{\"name\":\"iters\",\"kind\":\"int\"}]}]}";
}
`

// fidelityResult is the timing-fidelity benchmark's report. Times are the
// time evaluator's seconds per call, in ms.
type fidelityResult struct {
	Name        string    `json:"name"`
	Ratio       float64   `json:"ratio"`        // remote median / local median, the median over rounds
	RatioMin    float64   `json:"ratio_min"`    // remote min / local min, the median over rounds
	RoundRatios []float64 `json:"round_ratios"` // each round's median ratio
	LocalMS     float64   `json:"local_ms"`     // in-process median, the median over rounds
	RemoteMS    float64   `json:"remote_ms"`    // device-side median, the median over rounds
	Iters       int64     `json:"iters"`        // the kernel's argument
	Rounds      int       `json:"rounds"`
	Repeat      int       `json:"repeat"`
	MinRepeatMS int       `json:"min_repeat_ms"`
	Goal        float64   `json:"goal"` // |Ratio-1| at most this
	MeetsGoal   bool      `json:"meets_goal"`
	Quick       bool      `json:"quick,omitempty"`
}

func (r fidelityResult) Line() string {
	return fmt.Sprintf("timing-fidelity: remote/in-process %.4f (min %.4f; goal within %.0f%%): device side %.4f ms, in-process %.4f ms per call, median of %d rounds of %d repeats ≥ %d ms",
		r.Ratio, r.RatioMin, r.Goal*100, r.RemoteMS, r.LocalMS, r.Rounds, r.Repeat, r.MinRepeatMS)
}

// runFidelity builds the spin kernel, sizes it to about 1 ms here, and then
// alternates rounds: the time evaluator in this process, and the same
// evaluator on a device daemon's worker through a session.
func runFidelity(ctx context.Context, opt options) (_ result, err error) {
	target, rounds, repeat, minRepeatMS := time.Millisecond, 7, 10, 50
	if opt.quick {
		target, rounds, repeat, minRepeatMS = 50*time.Microsecond, 1, 3, 1
	}
	dir, err := os.MkdirTemp("", "kiln-fidelity-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	art, err := buildSpin(ctx, dir)
	if err != nil {
		return nil, err
	}
	artBytes, err := art.Bytes()
	if err != nil {
		return nil, err
	}
	mod, err := load.Artifact(art, load.Options{Dir: dir})
	if err != nil {
		return nil, err
	}
	defer mod.Close()
	f, err := mod.GetFunction("spin")
	if err != nil {
		return nil, err
	}
	opts := timer.Options{Number: 1, Repeat: repeat, MinRepeatMS: minRepeatMS}
	local := func(iters int64) (timer.Result, error) {
		ev := timer.Evaluator{Call: func() error {
			_, err := f.Call(packedfunc.Int(iters))
			return err
		}}
		return ev.Evaluate(ctx, opts)
	}

	// Size the kernel: time 100,000 iterations and scale.
	const probe = 100_000
	calEv := timer.Evaluator{Call: func() error {
		_, err := f.Call(packedfunc.Int(probe))
		return err
	}}
	cal, err := calEv.Evaluate(ctx, timer.Options{Number: 1, Repeat: 5, MinRepeatMS: 10})
	if err != nil {
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	iters := max(int64(float64(probe)*target.Seconds()/cal.Min), 1)

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
	if err := s.Upload(ctx, "spin.kiln", artBytes); err != nil {
		return nil, err
	}
	rmod, err := s.LoadModule(ctx, "spin.kiln")
	if err != nil {
		return nil, err
	}
	rf, err := rmod.GetFunction(ctx, "spin")
	if err != nil {
		return nil, err
	}
	remote := func() (client.TimeResult, error) {
		return s.TimeEvaluator(ctx, rf, client.TimeOptions{Number: 1, Repeat: repeat, MinRepeatMS: minRepeatMS}, iters)
	}

	var ratios, minRatios, locals, remotes []float64
	for i := range rounds {
		var l timer.Result
		var r client.TimeResult
		var lerr, rerr error
		if i%2 == 0 { // alternate which goes first
			l, lerr = local(iters)
			r, rerr = remote()
		} else {
			r, rerr = remote()
			l, lerr = local(iters)
		}
		if err := errors.Join(lerr, rerr); err != nil {
			return nil, fmt.Errorf("round %d: %w", i, err)
		}
		ratios = append(ratios, r.Median/l.Median)
		minRatios = append(minRatios, r.Min/l.Min)
		locals = append(locals, l.Median)
		remotes = append(remotes, r.Median)
	}
	res := fidelityResult{
		Name: "timing-fidelity", RoundRatios: make([]float64, len(ratios)),
		Iters: iters, Rounds: rounds, Repeat: repeat, MinRepeatMS: minRepeatMS, Goal: fidelityGoal, Quick: opt.quick,
	}
	for i, x := range ratios {
		res.RoundRatios[i] = round(x, 4)
	}
	res.Ratio = round(median(slices.Clone(ratios)), 4)
	res.RatioMin = round(median(minRatios), 4)
	res.LocalMS = round(median(locals)*1e3, 4)
	res.RemoteMS = round(median(remotes)*1e3, 4)
	res.MeetsGoal = res.Ratio >= 1-fidelityGoal && res.Ratio <= 1+fidelityGoal
	return res, nil
}

// buildSpin compiles spinSource with the system C compiler into an
// artifact.
func buildSpin(ctx context.Context, dir string) (*artifact.Artifact, error) {
	src := filepath.Join(dir, "spin.c")
	if err := os.WriteFile(src, []byte(spinSource), 0o644); err != nil {
		return nil, fmt.Errorf("write kernel: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, abi.HeaderName), []byte(abi.Header), 0o644); err != nil {
		return nil, fmt.Errorf("write header: %w", err)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	so := filepath.Join(dir, "spin.so")
	out, err := exec.CommandContext(ctx, cc, "-O2", "-shared", "-fPIC", "-o", so, src).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("compile %q with %q: %w\n%s", src, cc, err, out)
	}
	lib, err := os.ReadFile(so)
	if err != nil {
		return nil, err
	}
	a := artifact.New("c", cc+" -O2")
	if err := a.Add(artifact.HostLib, lib); err != nil {
		return nil, err
	}
	a.Manifest.Functions = []abi.FuncInfo{{Name: "spin", Params: []abi.ParamInfo{{Name: "iters", Kind: abi.ParamInt}}}}
	return a, nil
}
