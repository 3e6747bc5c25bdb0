package timer

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
)

// fakeTimer returns scripted durations, one per measurement, repeating the
// last one; it records the calls made inside each measurement.
type fakeTimer struct {
	script  []time.Duration
	calls   *int
	starts  int
	numbers []int // calls seen by each measurement
	startAt int
}

func (f *fakeTimer) Start() error {
	f.startAt = *f.calls
	return nil
}

func (f *fakeTimer) Stop() (time.Duration, error) {
	f.numbers = append(f.numbers, *f.calls-f.startAt)
	i := min(f.starts, len(f.script)-1)
	f.starts++
	return f.script[i], nil
}

// clockTimer advances a fake clock by cost per call.
type clockTimer struct {
	now   *time.Duration
	start time.Duration
}

func (c *clockTimer) Start() error                 { c.start = *c.now; return nil }
func (c *clockTimer) Stop() (time.Duration, error) { return *c.now - c.start, nil }

func TestEvaluateScripted(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name        string
		opts        Options
		script      []time.Duration
		wantNumbers []int
		wantResults []float64
		wantNumber  int
	}{
		{
			// 1 ms at number 1: grow to max(10/1+1, 1.618) = 11; 9 ms at 11:
			// grow to max(10/(9/11)+1 = 13.2, 11×1.618 = 17.8) = 17; 10 ms: done.
			name:        "grows to min_repeat_ms then by the golden ratio",
			opts:        Options{Number: 1, Repeat: 1, MinRepeatMS: 10},
			script:      []time.Duration{1 * ms, 9 * ms, 10 * ms},
			wantNumbers: []int{1, 11, 17},
			wantResults: []float64{0.010 / 17},
			wantNumber:  17,
		},
		{
			name:        "no min_repeat_ms keeps number",
			opts:        Options{Number: 3, Repeat: 3},
			script:      []time.Duration{3 * ms, 6 * ms, 9 * ms},
			wantNumbers: []int{3, 3, 3},
			wantResults: []float64{0.001, 0.002, 0.003},
			wantNumber:  3,
		},
		{
			// The grown number carries over to the next repeat.
			name:        "number carries across repeats",
			opts:        Options{Number: 1, Repeat: 2, MinRepeatMS: 4},
			script:      []time.Duration{1 * ms, 5 * ms, 5 * ms},
			wantNumbers: []int{1, 5, 5},
			wantResults: []float64{0.005 / 5, 0.005 / 5},
			wantNumber:  5,
		},
		{
			name:        "zero time stops after limit_zero_time_iterations",
			opts:        Options{Number: 2, Repeat: 1, MinRepeatMS: 1, LimitZeroTimeIterations: 4},
			script:      []time.Duration{0},
			wantNumbers: []int{2, 2, 2, 2},
			wantResults: []float64{0},
			wantNumber:  2,
		},
		{
			name:        "defaults",
			opts:        Options{},
			script:      []time.Duration{2 * ms},
			wantNumbers: []int{1},
			wantResults: []float64{0.002},
			wantNumber:  1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			ft := &fakeTimer{script: tc.script, calls: &calls}
			e := &Evaluator{Call: func() error { calls++; return nil }, Timer: ft}
			r, err := e.Evaluate(context.Background(), tc.opts)
			check.NoError(t, err)
			check.Equal(t, ft.numbers, tc.wantNumbers)
			check.Equal(t, r.Number, tc.wantNumber)
			check.Equal(t, len(r.Results), len(tc.wantResults))
			for i := range r.Results {
				check.True(t, math.Abs(r.Results[i]-tc.wantResults[i]) < 1e-12, "result", i, r.Results[i], tc.wantResults[i])
			}
			sum := 1 // the warm-up
			for _, n := range ft.numbers {
				sum += n
			}
			check.Equal(t, calls, sum, "calls: one warm-up plus every measurement")
		})
	}
}

func TestEvaluateFakeClock(t *testing.T) {
	// Each call costs 0.3 ms on a fake clock: every measurement that ends a
	// repeat lasts at least min_repeat_ms, and the result is the cost.
	var now time.Duration
	cost := 300 * time.Microsecond
	e := &Evaluator{
		Call:  func() error { now += cost; return nil },
		Timer: &clockTimer{now: &now},
	}
	r, err := e.Evaluate(context.Background(), Options{Number: 1, Repeat: 4, MinRepeatMS: 5})
	check.NoError(t, err)
	check.Equal(t, len(r.Results), 4)
	for _, v := range r.Results {
		check.True(t, math.Abs(v-cost.Seconds()) < 1e-12, v)
	}
	check.True(t, time.Duration(r.Number)*cost >= 5*time.Millisecond, r.Number)
	check.True(t, r.Std < 1e-12 && r.Min == r.Max && r.Mean == r.Median, r)
}

func TestEvaluateHooks(t *testing.T) {
	var events []string
	calls := 0
	ft := &fakeTimer{script: []time.Duration{time.Millisecond}, calls: &calls}
	e := &Evaluator{
		Call:  func() error { calls++; return nil },
		Timer: ft,
		Sync:  func() error { events = append(events, "sync"); return nil },
		Flush: func(n int64) error {
			check.Equal(t, n, int64(1024))
			events = append(events, "flush")
			return nil
		},
		Sleep: func(ctx context.Context, d time.Duration) error {
			check.Equal(t, d, 7*time.Millisecond)
			events = append(events, "sleep")
			return nil
		},
	}
	_, err := e.Evaluate(context.Background(), Options{Repeat: 5, CooldownIntervalMS: 7, RepeatsToCooldown: 2, CacheFlushBytes: 1024})
	check.NoError(t, err)
	// Warm-up sync, then per repeat flush, sync (start), sync (stop); a
	// cooldown after repeats 0, 2 and 4.
	want := []string{"sync"}
	for i := range 5 {
		want = append(want, "flush", "sync", "sync")
		if i%2 == 0 {
			want = append(want, "sleep")
		}
	}
	check.Equal(t, events, want)
}

func TestEvaluateErrors(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name string
		e    *Evaluator
		opts Options
		want error
		msg  string
	}{
		{"no call", &Evaluator{}, Options{}, ErrOptions, "no function"},
		{"negative min_repeat_ms", &Evaluator{Call: func() error { return nil }}, Options{MinRepeatMS: -1}, ErrOptions, "min_repeat_ms"},
		{"huge flush", &Evaluator{Call: func() error { return nil }}, Options{CacheFlushBytes: MaxCacheFlushBytes + 1}, ErrOptions, "cache_flush_bytes"},
		{"huge repeat", &Evaluator{Call: func() error { return nil }}, Options{Repeat: MaxRepeat + 1}, ErrOptions, "repeat"},
		{"too many calls", &Evaluator{Call: func() error { return nil }}, Options{Number: MaxNumber, Repeat: 2}, ErrOptions, "number × repeat"},
		{"warm-up fails", &Evaluator{Call: func() error { return boom }}, Options{}, boom, "warm-up"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.e.Evaluate(context.Background(), tc.opts)
			check.ErrorIs(t, err, tc.want)
			check.Error(t, err, tc.msg)
		})
	}

	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		n := 0
		e := &Evaluator{Call: func() error {
			n++
			if n == 3 {
				cancel()
			}
			return nil
		}}
		_, err := e.Evaluate(ctx, Options{Repeat: 10})
		check.ErrorIs(t, err, context.Canceled)
		check.Equal(t, n, 3)
	})
}

func TestEvaluateMonotonic(t *testing.T) {
	// The real clock: whatever the machine's speed, a repeat ends only once
	// its measurement lasted min_repeat_ms (1 ms here).
	sink := 0
	e := &Evaluator{Call: func() error { sink++; return nil }}
	r, err := e.Evaluate(context.Background(), Options{Repeat: 3, MinRepeatMS: 1})
	check.NoError(t, err)
	check.Equal(t, len(r.Results), 3)
	for _, v := range r.Results {
		check.True(t, v > 0, v)
	}
	check.True(t, r.Results[2]*float64(r.Number) >= 0.001*(1-1e-9), r)
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		name string
		in   []float64
		want Result
	}{
		{"empty", nil, Result{}},
		{"one", []float64{2}, Result{Results: []float64{2}, Mean: 2, Median: 2, Min: 2, Max: 2}},
		{"even", []float64{4, 1, 3, 2}, Result{Results: []float64{4, 1, 3, 2}, Mean: 2.5, Median: 2.5, Min: 1, Max: 4, Std: math.Sqrt(1.25)}},
		{"odd", []float64{3, 1, 2}, Result{Results: []float64{3, 1, 2}, Mean: 2, Median: 2, Min: 1, Max: 3, Std: math.Sqrt(2.0 / 3)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			check.Equal(t, Summarize(tc.in), tc.want)
		})
	}
}

func TestGrowCaps(t *testing.T) {
	check.Equal(t, grow(MaxNumber/2, time.Nanosecond, 1000), MaxNumber)
	check.Equal(t, grow(10, 10*time.Millisecond, 0), 16)
}

func TestEvaluatePreprocRunsOncePerRepeat(t *testing.T) {
	var events []string
	calls := 0
	// The first measurement of each repeat is too short for MinRepeatMS:
	// number grows within the repeat, f_preproc is not run again.
	ft := &fakeTimer{script: []time.Duration{time.Millisecond, 20 * time.Millisecond}, calls: &calls}
	e := &Evaluator{
		Call:    func() error { calls++; events = append(events, "call"); return nil },
		Timer:   ft,
		Preproc: func() error { events = append(events, "pre"); return nil },
	}
	_, err := e.Evaluate(context.Background(), Options{Number: 1, Repeat: 2, MinRepeatMS: 10})
	check.NoError(t, err)
	pre := 0
	for _, ev := range events {
		if ev == "pre" {
			pre++
		}
	}
	check.Equal(t, pre, 2)
	check.Equal(t, events[0], "call") // the warm-up comes before the first f_preproc
	check.Equal(t, events[1], "pre")

	boom := errors.New("boom")
	e.Preproc = func() error { return boom }
	_, err = e.Evaluate(context.Background(), Options{Number: 1, Repeat: 1})
	check.ErrorIs(t, err, boom)
}
