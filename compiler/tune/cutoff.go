package tune

import "sync"

// DefaultCutoff is the factor over a workload's best time past which a
// candidate's first repeat ends its timing. A first repeat runs cold
// (caches, page faults, a loaded machine): well under 2× on the kernels
// a search measures, so twice the best never stops a candidate that
// could have been the best.
const DefaultCutoff = 2.0

// Cutoff stops the timing of candidates already far slower than the best
// of their workload, as TVM's runners stop a candidate past its time
// budget: a runner times a candidate's first repeat (or the call that
// checks its result), asks Stop, and when it says so records that time
// alone (Validity.Stopped) instead of timing every repeat. It learns each workload's best from the valid
// results it is told of (Observe). Safe for concurrent use; the zero
// value never stops.
type Cutoff struct {
	// Factor is how many times the best a first repeat may take before
	// the timing stops (0: never).
	Factor float64

	mu   sync.Mutex
	best map[string]float64
}

// NewCutoff returns a Cutoff of factor.
func NewCutoff(factor float64) *Cutoff { return &Cutoff{Factor: factor} }

// Observe tells c of a valid timing's median of workload.
func (c *Cutoff) Observe(workload string, median float64) {
	if c == nil || median <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.best == nil {
		c.best = map[string]float64{}
	}
	if b, ok := c.best[workload]; !ok || median < b {
		c.best[workload] = median
	}
}

// Stop reports whether a candidate of workload whose first repeat took
// first seconds is slower than Factor times the best timed so far.
func (c *Cutoff) Stop(workload string, first float64) bool {
	if c == nil || c.Factor <= 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.best[workload]
	return ok && first > c.Factor*b
}
