package vm

import (
	"cmp"
	"slices"
	"time"
)

// KernelTime is what a profiling VM (Options.Profile) measured of one
// kernel: how many times it was called and the wall time spent in those
// calls, summed over every invocation since the VM was made or its profile
// last reset.
type KernelTime struct {
	Name  string
	Calls int64
	Total time.Duration
	// Median is the median time of one call (over the last
	// maxProfileSamples calls): on a machine shared with other work it
	// is steadier than Total/Calls, which a few descheduled calls
	// dominate.
	Median time.Duration
}

// maxProfileSamples bounds the call times a profile keeps per kernel for
// its median; older ones are overwritten.
const maxProfileSamples = 1 << 12

// KernelEvent is one kernel call a tracing profile (VM.Trace) recorded.
type KernelEvent struct {
	Name  string
	Start time.Time
	Dur   time.Duration
}

// maxTraceEvents bounds the calls a trace keeps; later ones are dropped.
const maxTraceEvents = 1 << 16

// profile accumulates KernelTime by kernel call site name.
type profile struct {
	byName map[string]*kernelSamples
	trace  bool
	events []KernelEvent
}

type kernelSamples struct {
	KernelTime
	samples []time.Duration
}

func (p *profile) add(name string, t0 time.Time, d time.Duration) {
	if p.trace && len(p.events) < maxTraceEvents {
		p.events = append(p.events, KernelEvent{Name: name, Start: t0, Dur: d})
	}
	ks := p.byName[name]
	if ks == nil {
		ks = &kernelSamples{KernelTime: KernelTime{Name: name}}
		p.byName[name] = ks
	}
	if len(ks.samples) < maxProfileSamples {
		ks.samples = append(ks.samples, d)
	} else {
		ks.samples[ks.Calls%maxProfileSamples] = d
	}
	ks.Calls++
	ks.Total += d
}

// Profile returns the kernel times measured so far, the most expensive
// first (nil when the VM was not made with Options.Profile).
func (m *VM) Profile() []KernelTime {
	if m.prof == nil {
		return nil
	}
	out := make([]KernelTime, 0, len(m.prof.byName))
	for _, ks := range m.prof.byName {
		kt := ks.KernelTime
		s := slices.Clone(ks.samples)
		slices.Sort(s)
		if len(s) > 0 {
			kt.Median = s[len(s)/2]
		}
		out = append(out, kt)
	}
	slices.SortFunc(out, func(a, b KernelTime) int {
		if c := cmp.Compare(b.Total, a.Total); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return out
}

// ResetProfile forgets the kernel times measured so far (a warm-up's).
func (m *VM) ResetProfile() {
	if m.prof != nil {
		clear(m.prof.byName)
	}
}

// Trace turns the recording of every kernel call (its start and duration)
// on or off; Events returns what was recorded. A VM not made with
// Options.Profile records nothing.
func (m *VM) Trace(on bool) {
	if m.prof != nil {
		m.prof.trace = on
	}
}

// Events returns the kernel calls recorded while tracing was on, in
// order, and forgets them.
func (m *VM) Events() []KernelEvent {
	if m.prof == nil {
		return nil
	}
	ev := m.prof.events
	m.prof.events = nil
	return ev
}

// Totals returns each kernel's time so far by name (nil when the VM was
// not made with Options.Profile): cheaper than Profile, for a caller that
// takes the difference across one invocation.
func (m *VM) Totals() map[string]time.Duration {
	if m.prof == nil {
		return nil
	}
	out := make(map[string]time.Duration, len(m.prof.byName))
	for name, ks := range m.prof.byName {
		out[name] = ks.Total
	}
	return out
}
