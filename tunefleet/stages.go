package tunefleet

import (
	"sync"
	"time"
)

// Stage names the parts of one candidate's measurement on a device.
type Stage int

const (
	StageUpload Stage = iota // the artifact to the daemon
	StageLoad                // loading it in the session's worker and looking its function up
	StageCheck               // poisoning the outputs, one call, reading the outputs back, comparing
	StageTime                // the device-side time evaluator
	StageWait                // a device waiting for its next built candidate
	numStages
)

var stageNames = [numStages]string{"upload", "load", "check", "time", "wait"}

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
