package tunefleet

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Stage names the parts of one candidate's measurement on a device.
type Stage int

const (
	StageUpload  Stage = iota // the artifact to the daemon
	StageLoad                 // loading it in the session's worker and looking its function up
	StageCheck                // poisoning the outputs, one call, reading the outputs back, comparing
	StageTime                 // the device-side time evaluator
	StageWait                 // a device waiting for its next built candidate
	StageQueue                // a build job waiting for a compiler node
	StageCompile              // a build job on its compiler node: lowering, generating C, the C compiler
	numStages
)

var stageNames = [numStages]string{"upload", "load", "check", "time", "wait", "queue", "compile"}

// workStages are the stages that do a candidate's work (queue and wait
// are waits): Shares divides their time.
var workStages = []Stage{StageCompile, StageUpload, StageLoad, StageCheck, StageTime}

func (s Stage) String() string { return stageNames[s] }

// Stages is where the devices' time went: per stage, the total over
// every device and the number of times it was entered.
type Stages struct {
	Total [numStages]time.Duration
	Count [numStages]int
}

// Mean is the mean time of one entry of stage s.
func (s Stages) Mean(st Stage) time.Duration {
	if s.Count[st] == 0 {
		return 0
	}
	return s.Total[st] / time.Duration(s.Count[st])
}

// Map returns the mean milliseconds per entry of each stage entered, by
// name.
func (s Stages) Map() map[string]float64 {
	out := map[string]float64{}
	for st := range numStages {
		if s.Count[st] > 0 {
			out[st.String()] = float64(s.Mean(st).Microseconds()) / 1e3
		}
	}
	return out
}

// Shares returns each work stage's share of the time of all of them
// (compile, upload, load, check and time; fractions that add up to 1),
// by name: where a candidate's work goes, whatever ran at once. Empty
// before any stage was entered.
func (s Stages) Shares() map[string]float64 {
	var total time.Duration
	for _, st := range workStages {
		total += s.Total[st]
	}
	out := map[string]float64{}
	if total <= 0 {
		return out
	}
	for _, st := range workStages {
		if s.Count[st] > 0 {
			out[st.String()] = float64(s.Total[st]) / float64(total)
		}
	}
	return out
}

// String renders the shares, the largest first, and the mean of each
// work stage: "compile 61% (2.1s), time 30% (1s), …".
func (s Stages) String() string {
	sh := s.Shares()
	order := slices.Clone(workStages)
	slices.SortStableFunc(order, func(a, b Stage) int { return cmp.Compare(sh[b.String()], sh[a.String()]) })
	var parts []string
	for _, st := range order {
		if s.Count[st] > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f%% (%s each)", st, 100*sh[st.String()], roundDuration(s.Mean(st))))
		}
	}
	return strings.Join(parts, ", ")
}

// roundDuration keeps two or three significant digits of d.
func roundDuration(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

// stageClock accumulates Stages; safe for concurrent use.
type stageClock struct {
	mu sync.Mutex
	s  Stages
}

func (c *stageClock) add(st Stage, d time.Duration) {
	c.mu.Lock()
	c.s.Total[st] += d
	c.s.Count[st]++
	c.mu.Unlock()
}

// since adds the time since *t to st and moves *t to now.
func (c *stageClock) since(st Stage, t *time.Time) {
	now := time.Now()
	c.add(st, now.Sub(*t))
	*t = now
}

// Stages returns where the devices' time went since the runner opened
// (or since the last ResetStages).
func (r *Runner) Stages() Stages {
	r.clock.mu.Lock()
	defer r.clock.mu.Unlock()
	return r.clock.s
}

// ResetStages starts Stages afresh.
func (r *Runner) ResetStages() {
	r.clock.mu.Lock()
	r.clock.s = Stages{}
	r.clock.mu.Unlock()
}
