// Package timer owns kiln's time evaluator: the measuring loop of DESIGN.md's
// timing contract, with Apache TVM's semantics (one untimed warm-up call; per
// repeat, the calls per measurement grow by 1.618×, or to what should reach
// min_repeat_ms, until a measurement lasts at least min_repeat_ms; each
// result is the mean seconds per call of its measurement), the statistics
// of its results, and their validity report: the spread, the median's
// confidence interval, the machine's state around the measurements and a
// verdict (stable or noisy, and why).
//
// The device daemon's worker runs it next to the kernel, so no round trip is
// in the figures and the machine read is the device's; `kiln bench` runs it
// in-process. timer knows nothing of devices: callers hand it the call, a
// device synchronization and a cache flush as Go functions. It imports
// nothing from kiln but rpcserver/proto, whose wire types it fills.
package timer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// GoldenRatio is the factor by which the calls per measurement grow.
const GoldenRatio = 1.618

// DefaultLimitZeroTimeIterations bounds the measurements that read zero time
// when Options.LimitZeroTimeIterations is 0, as TVM does.
const DefaultLimitZeroTimeIterations = 100

// MaxNumber bounds the calls per measurement, so that a function too fast
// for the clock cannot make the count overflow.
const MaxNumber = 1 << 40

// MaxRepeat bounds the measurements of one evaluation (each is a result
// the client receives).
const MaxRepeat = 1 << 20

// MaxCalls bounds the calls an evaluation may ask for (number × repeat):
// a request that could never finish is refused before it runs, rather
// than left to its deadline.
const MaxCalls = 1 << 40

// MaxCacheFlushBytes bounds Options.CacheFlushBytes (1 GiB).
const MaxCacheFlushBytes = 1 << 30

// ErrOptions reports options that cannot be run.
var ErrOptions = errors.New("invalid time evaluator options")

// Options are the parameters of one evaluation, with TVM's names.
type Options struct {
	// Number is the calls per measurement at the start (1 when ≤ 0).
	Number int
	// Repeat is the number of measurements, hence of results (1 when ≤ 0).
	Repeat int
	// MinRepeatMS is the shortest a measurement may last; a shorter one is
	// run again with more calls. 0 keeps Number as it is.
	MinRepeatMS int
	// LimitZeroTimeIterations bounds, per repeat, the measurements that
	// read zero time (DefaultLimitZeroTimeIterations when 0).
	LimitZeroTimeIterations int
	// CooldownIntervalMS is a pause after repeat i when i %
	// RepeatsToCooldown == 0 (none when 0).
	CooldownIntervalMS int
	// RepeatsToCooldown is the period of the pauses (1 when ≤ 0).
	RepeatsToCooldown int
	// CacheFlushBytes, when positive, asks for a cache flush before each
	// measurement (see Evaluator.Flush).
	CacheFlushBytes int64
	// StableWithin is the validity report's threshold (see Assess;
	// DefaultStableWithin when 0).
	StableWithin float64
}

// OptionsOf returns the evaluator's options for the wire's.
func OptionsOf(o proto.TimeOptions) Options {
	return Options{
		Number: o.Number, Repeat: o.Repeat, MinRepeatMS: o.MinRepeatMS,
		LimitZeroTimeIterations: o.LimitZeroTimeIterations, CooldownIntervalMS: o.CooldownIntervalMS,
		RepeatsToCooldown: o.RepeatsToCooldown, CacheFlushBytes: o.CacheFlushBytes, StableWithin: o.StableWithin,
	}
}

// Result is what an evaluation measured; times are seconds per call.
type Result struct {
	// Results holds each repeat's mean seconds per call.
	Results []float64
	Mean    float64
	Median  float64
	Min     float64
	Max     float64
	// Std is the population standard deviation of Results.
	Std float64
	// Number is the calls per measurement of the last repeat.
	Number int
	// Report is the validity report of Results (Evaluate's; zero from
	// Summarize).
	Report proto.TimeReport
}

// Wire returns r as the wire's result, for a timing on device ("cpu:0").
func (r Result) Wire(device string) proto.TimeResult {
	rep := r.Report
	return proto.TimeResult{
		Results: r.Results, Mean: r.Mean, Median: r.Median, Min: r.Min, Max: r.Max, Std: r.Std,
		Number: r.Number, Device: device, Emulated: rep.Machine.Emulated, Report: &rep,
	}
}

// Timer measures one measurement: Start just before the first call, Stop
// just after the last (after any device synchronization), returning the
// elapsed time.
type Timer interface {
	Start() error
	Stop() (time.Duration, error)
}

// Evaluator times one function. Call is required; the others are optional.
type Evaluator struct {
	// Call runs the function once.
	Call func() error
	// Sync waits for the device's queued work (before each measurement
	// starts and before it stops); nil for synchronous devices.
	Sync func() error
	// Flush flushes the caches before each measurement when
	// Options.CacheFlushBytes is positive; nil uses a CPU flush that copies
	// a buffer of that size.
	Flush func(nbytes int64) error
	// Preproc, when set, runs before each repeat, untimed (TVM's
	// f_preproc).
	Preproc func() error
	// Timer measures each measurement; nil uses the monotonic clock.
	Timer Timer
	// Sleep pauses for the cooldown; nil sleeps on the wall clock until ctx
	// ends.
	Sleep func(ctx context.Context, d time.Duration) error
	// Probe reads the machine's state before and after the measurements,
	// for the report; nil reads this host's.
	Probe *Probe
}

// Evaluate runs the evaluation of o: one untimed warm-up call, then
// o.Repeat measurements. ctx is checked between measurements; a cancelled
// ctx ends the evaluation with its error.
func (e *Evaluator) Evaluate(ctx context.Context, o Options) (Result, error) {
	if e.Call == nil {
		return Result{}, fmt.Errorf("time evaluator: no function: %w", ErrOptions)
	}
	o, err := o.normalize()
	if err != nil {
		return Result{}, err
	}
	tm := e.Timer
	if tm == nil {
		tm = &monotonic{}
	}
	sleep := e.Sleep
	if sleep == nil {
		sleep = sleepCtx
	}
	sync := e.Sync
	if sync == nil {
		sync = func() error { return nil }
	}
	flush := e.Flush
	if flush == nil && o.CacheFlushBytes > 0 {
		flush = (&cpuFlusher{}).flush
	}

	probe := e.Probe
	if probe == nil {
		probe = &Probe{}
	}
	before := probe.Read()
	if err := e.Call(); err != nil {
		return Result{}, fmt.Errorf("time evaluator: warm-up call: %w", err)
	}
	if err := sync(); err != nil {
		return Result{}, fmt.Errorf("time evaluator: sync: %w", err)
	}
	number := o.Number
	results := make([]float64, 0, o.Repeat)
	for i := 0; i < o.Repeat; i++ {
		if e.Preproc != nil {
			if err := e.Preproc(); err != nil {
				return Result{}, fmt.Errorf("time evaluator: f_preproc before repeat %d: %w", i, err)
			}
		}
		var duration time.Duration
		zeros := 0
		for {
			if err := ctx.Err(); err != nil {
				return Result{}, fmt.Errorf("time evaluator: repeat %d: %w", i, err)
			}
			if duration > 0 {
				number = grow(number, duration, o.MinRepeatMS)
			}
			if o.CacheFlushBytes > 0 {
				if err := flush(o.CacheFlushBytes); err != nil {
					return Result{}, fmt.Errorf("time evaluator: cache flush: %w", err)
				}
			}
			if err := sync(); err != nil {
				return Result{}, fmt.Errorf("time evaluator: sync: %w", err)
			}
			if err := tm.Start(); err != nil {
				return Result{}, fmt.Errorf("time evaluator: start timer: %w", err)
			}
			for j := 0; j < number; j++ {
				if err := e.Call(); err != nil {
					return Result{}, fmt.Errorf("time evaluator: repeat %d, call %d: %w", i, j, err)
				}
			}
			if err := sync(); err != nil {
				return Result{}, fmt.Errorf("time evaluator: sync: %w", err)
			}
			d, err := tm.Stop()
			if err != nil {
				return Result{}, fmt.Errorf("time evaluator: stop timer: %w", err)
			}
			if d <= 0 {
				zeros++
				d = 0
			}
			duration = d
			if float64(duration) >= float64(o.MinRepeatMS)*float64(time.Millisecond) ||
				zeros >= o.LimitZeroTimeIterations || number >= MaxNumber {
				break
			}
		}
		results = append(results, duration.Seconds()/float64(number))
		if o.CooldownIntervalMS > 0 && i%o.RepeatsToCooldown == 0 {
			if err := sleep(ctx, time.Duration(o.CooldownIntervalMS)*time.Millisecond); err != nil {
				return Result{}, fmt.Errorf("time evaluator: cooldown after repeat %d: %w", i, err)
			}
		}
	}
	r := Summarize(results)
	r.Number = number
	r.Report = Assess(results, MergeState(before, probe.Read()), o.StableWithin)
	return r, nil
}

// normalize applies the defaults and checks o.
func (o Options) normalize() (Options, error) {
	if o.Number <= 0 {
		o.Number = 1
	}
	if o.Repeat <= 0 {
		o.Repeat = 1
	}
	if o.LimitZeroTimeIterations <= 0 {
		o.LimitZeroTimeIterations = DefaultLimitZeroTimeIterations
	}
	if o.RepeatsToCooldown <= 0 {
		o.RepeatsToCooldown = 1
	}
	switch {
	case o.MinRepeatMS < 0:
		return o, fmt.Errorf("time evaluator: min_repeat_ms %d is negative: %w", o.MinRepeatMS, ErrOptions)
	case o.CooldownIntervalMS < 0:
		return o, fmt.Errorf("time evaluator: cooldown_interval_ms %d is negative: %w", o.CooldownIntervalMS, ErrOptions)
	case o.StableWithin < 0 || math.IsNaN(o.StableWithin) || o.StableWithin >= 1:
		return o, fmt.Errorf("time evaluator: stable_within %g is not a fraction in [0, 1): %w", o.StableWithin, ErrOptions)
	case o.CacheFlushBytes > MaxCacheFlushBytes:
		return o, fmt.Errorf("time evaluator: cache_flush_bytes %d exceeds %d: %w", o.CacheFlushBytes, MaxCacheFlushBytes, ErrOptions)
	case o.Number > MaxNumber:
		return o, fmt.Errorf("time evaluator: number %d exceeds %d: %w", o.Number, MaxNumber, ErrOptions)
	case o.Repeat > MaxRepeat:
		return o, fmt.Errorf("time evaluator: repeat %d exceeds %d: %w", o.Repeat, MaxRepeat, ErrOptions)
	case int64(o.Number)*int64(o.Repeat) > MaxCalls:
		return o, fmt.Errorf("time evaluator: number × repeat = %d calls exceeds %d: %w", int64(o.Number)*int64(o.Repeat), int64(MaxCalls), ErrOptions)
	}
	return o, nil
}

// grow returns the next calls per measurement after one of number calls
// lasted d: TVM's max(min_repeat_ms / (d / number) + 1, number × 1.618),
// truncated, at most MaxNumber.
func grow(number int, d time.Duration, minRepeatMS int) int {
	ms := float64(d) / float64(time.Millisecond)
	next := math.Max(float64(minRepeatMS)/(ms/float64(number))+1, float64(number)*GoldenRatio)
	if next >= MaxNumber || math.IsNaN(next) {
		return MaxNumber
	}
	return int(next)
}

// Summarize computes the statistics of results (all zero when empty).
func Summarize(results []float64) Result {
	r := Result{Results: slices.Clone(results)}
	n := len(results)
	if n == 0 {
		return r
	}
	sorted := slices.Clone(results)
	slices.Sort(sorted)
	r.Min, r.Max = sorted[0], sorted[n-1]
	if n%2 == 1 {
		r.Median = sorted[n/2]
	} else {
		r.Median = (sorted[n/2-1] + sorted[n/2]) / 2
	}
	var sum float64
	for _, v := range results {
		sum += v
	}
	r.Mean = sum / float64(n)
	var ss float64
	for _, v := range results {
		ss += (v - r.Mean) * (v - r.Mean)
	}
	r.Std = math.Sqrt(ss / float64(n))
	return r
}

// monotonic is the default Timer: Go's monotonic clock.
type monotonic struct{ start time.Time }

func (m *monotonic) Start() error { m.start = time.Now(); return nil }

func (m *monotonic) Stop() (time.Duration, error) { return time.Since(m.start), nil }

// cpuFlusher flushes the CPU caches by copying one buffer into another, as
// TVM does with two arrays of cache_flush_bytes.
type cpuFlusher struct{ a, b []byte }

func (f *cpuFlusher) flush(n int64) error {
	if int64(len(f.a)) != n {
		f.a, f.b = make([]byte, n), make([]byte, n)
		for i := range f.b {
			f.b[i] = byte(i)
		}
	}
	copy(f.a, f.b)
	return nil
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
