package tunefleet

import (
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler/tune"
	must "github.com/kiln-ml/kiln/internal/check"
)

// TestCutoffSparesTheDefault: with a best of 1 ms timed, the default
// schedule's candidate is timed every repeat however slow its checking
// call or first repeat was (it is the figure the best is compared with);
// another candidate is stopped at its first repeat past twice the best,
// and at its checking call only when that call was as long as a repeat
// (a shorter one is mostly a round trip and a cold start).
func TestCutoffSparesTheDefault(t *testing.T) {
	r := &Runner{cfg: Config{Time: client.TimeOptions{Number: 1, Repeat: 6, MinRepeatMS: 10}}, cutoff: tune.NewCutoff(tune.DefaultCutoff)}
	task := &tune.Task{Workload: tune.Workload{Hash: "w"}}
	r.cutoff.Observe("w", 1e-3)

	dflt := timingOf(&tune.Candidate{Schedule: tune.DefaultSchedule})
	must.Equal(t, dflt, everyRepeat)
	for _, c := range []*tune.Candidate{{Schedule: tune.RulesSchedule}, {}} {
		must.Equal(t, timingOf(c), cutoffApplies)
	}

	for _, tc := range []struct {
		name  string
		tm    timing
		took  time.Duration
		check bool // stopped at the checking call
	}{
		{"default, slow call", everyRepeat, time.Second, false},
		{"default, call past the cutoff", everyRepeat, 5 * time.Millisecond, false},
		{"candidate, call shorter than a repeat", cutoffApplies, 5 * time.Millisecond, false},
		{"candidate, call as long as a repeat", cutoffApplies, 10 * time.Millisecond, true},
		{"candidate, call within the cutoff", cutoffApplies, 1500 * time.Microsecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			must.Equal(t, r.stopAtCheck(task, tc.tm, tc.took), tc.check)
		})
	}
	must.True(t, !r.stopAtFirst(task, everyRepeat, 1), "the default schedule's timing stopped at its first repeat")
	must.True(t, r.stopAtFirst(task, cutoffApplies, 3e-3), "a candidate at 3× the best was not stopped at its first repeat")
	must.True(t, !r.stopAtFirst(task, cutoffApplies, 1.9e-3), "a candidate within the cutoff was stopped at its first repeat")

	// With one repeat there is nothing to cut short.
	r.cfg.Time.Repeat = 1
	must.True(t, !r.stopAtCheck(task, cutoffApplies, time.Second), "a one-repeat timing stopped at its checking call")
}
