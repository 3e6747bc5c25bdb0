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
}

// profile accumulates KernelTime by kernel call site name.
type profile struct {
	byName map[string]*KernelTime
}

func (p *profile) add(name string, d time.Duration) {
	kt := p.byName[name]
	if kt == nil {
		kt = &KernelTime{Name: name}
		p.byName[name] = kt
	}
	kt.Calls++
	kt.Total += d
}

// Profile returns the kernel times measured so far, the most expensive
// first (nil when the VM was not made with Options.Profile).
func (m *VM) Profile() []KernelTime {
	if m.prof == nil {
		return nil
	}
	out := make([]KernelTime, 0, len(m.prof.byName))
	for _, kt := range m.prof.byName {
		out = append(out, *kt)
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
