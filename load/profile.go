package load

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
	"github.com/kiln-ml/kiln/vm"
)

// ProfileFunc is the function of a loaded graph artifact that profiles one
// of its graph functions where it runs (on a device daemon, so the figures
// are the device's): profile(name, rounds, args…) returns the Profile as
// JSON. A graph function of that name shadows it.
const ProfileFunc = "profile"

// MaxProfileSamples bounds the inferences whose figures a profile keeps
// (ModelSamples and each kernel's Samples): those of the first
// MaxProfileSamples rounds.
const MaxProfileSamples = 1000

// Profile is what profiling a graph function measured: each kernel's time
// per inference, the model operators it computes, and the whole model's
// time beside the kernels' sum (the rest is the VM's own work: allocation,
// argument checks, builtins).
type Profile struct {
	Function string `json:"function"`
	Device   string `json:"device"`
	// Rounds is the number of inferences measured (after two warm-ups).
	Rounds int `json:"rounds"`
	// ModelSeconds is the median time of one inference of the whole
	// function.
	ModelSeconds float64 `json:"model_seconds"`
	// KernelSeconds is the sum of the kernels' Seconds: their time in
	// one inference.
	KernelSeconds float64 `json:"kernel_seconds"`
	// ModelSamples is each measured inference's time in seconds, in the
	// order measured (the first MaxProfileSamples rounds).
	ModelSamples []float64 `json:"model_samples"`
	// Machine is the state of the machine the profile ran on, read before
	// and after the measured inferences (for a validity report).
	Machine *proto.MachineState `json:"machine,omitempty"`
	// Kernels are the kernels, the most expensive first.
	Kernels []KernelProfile `json:"kernels"`
	// Trace is the calls of the last inference, in order, in
	// microseconds from its start.
	Trace []TraceEvent `json:"trace"`
}

// KernelProfile is one kernel's part of an inference.
type KernelProfile struct {
	Name string `json:"name"`
	// Seconds is its time per inference: the median time of one call
	// times Calls (steadier on a shared machine than the mean, which a
	// few descheduled calls dominate).
	Seconds float64 `json:"seconds"`
	// MeanSeconds is its mean time per inference.
	MeanSeconds float64 `json:"mean_seconds"`
	// Share is Seconds over the profile's KernelSeconds.
	Share float64 `json:"share"`
	// Calls is the number of calls in one inference.
	Calls int64 `json:"calls"`
	// Samples is its time within each inference of ModelSamples, in
	// seconds: the sum of its calls in that inference (0 where it was
	// not called).
	Samples []float64 `json:"samples"`
	// Ops are the model operators it computes (ONNX node names and op
	// types), as the compiler carried them; empty when not known.
	Ops []vm.Source `json:"ops"`
}

// TraceEvent is one call in a profile's trace: a kernel, or the whole
// inference (Kernel false).
type TraceEvent struct {
	Name    string  `json:"name"`
	Kernel  bool    `json:"kernel"`
	StartUS float64 `json:"start_us"`
	DurUS   float64 `json:"dur_us"`
}

// Profile runs graph function name rounds times (after two warm-up
// inferences) on a VM that times every kernel call, made beside the
// module's own from the same kernels, and reports each kernel's part.
// args are every parameter, or the inputs alone when weights are bundled.
// Kernels must run synchronously for their times to mean anything, so a
// module on a GPU is refused.
func (m *Module) Profile(name string, rounds int, args ...packedfunc.Value) (*Profile, error) {
	if m.vm == nil {
		return nil, fmt.Errorf("profile %q: the artifact has no graph functions (profiles are of a graph function's kernels)", name)
	}
	if m.dev.Type != devices.CPU {
		return nil, fmt.Errorf("profile %q: kernels on %s run asynchronously, so their calls cannot be timed one by one; profile a cpu build", name, m.dev)
	}
	if rounds < 1 {
		return nil, fmt.Errorf("profile %q: rounds must be at least 1, got %d", name, rounds)
	}
	info, ok := m.vm.Executable().Function(name)
	if !ok {
		return nil, fmt.Errorf("profile: no graph function %q (the artifact has %v): %w", name, m.vm.Functions(), packedfunc.ErrNotFound)
	}
	if m.weights != nil && len(args) != len(info.Params) {
		full, err := m.bind(name, args)
		if err != nil {
			return nil, fmt.Errorf("profile: %w", err)
		}
		args = full
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.prof == nil {
		p, err := vm.New(m.vm.Executable(), m.kernels, m.dev, vm.Options{MemoryCfg: m.memoryCfg, Profile: true})
		if err != nil {
			return nil, fmt.Errorf("profile %q: the profiling VM: %w", name, err)
		}
		m.prof = p
	}
	p := m.prof
	// The machine's state is read before the warm-ups, which settle the
	// caches the reading disturbs.
	var probe timer.Probe
	before := probe.Read()
	for range 2 {
		if _, err := p.Invoke(name, args...); err != nil {
			return nil, fmt.Errorf("profile %q: %w", name, err)
		}
	}
	p.ResetProfile()
	times := make([]time.Duration, rounds)
	kept := min(rounds, MaxProfileSamples)
	perRound := make([]map[string]time.Duration, 0, kept) // kernel totals after each kept round
	var start time.Time
	var lastDur time.Duration // the traced inference's time
	for i := range rounds {
		last := i == rounds-1
		p.Trace(last)
		t0 := time.Now()
		_, err := p.Invoke(name, args...)
		times[i] = time.Since(t0)
		if err != nil {
			p.Trace(false)
			return nil, fmt.Errorf("profile %q: %w", name, err)
		}
		if i < kept {
			perRound = append(perRound, p.Totals())
		}
		if last {
			start, lastDur = t0, times[i]
		}
	}
	p.Trace(false)
	events := p.Events()
	machine := timer.MergeState(before, probe.Read())
	// A module does not know its daemon's other sessions.
	machine.Unread = append(machine.Unread, "other sessions")
	out := &Profile{Function: name, Device: m.dev.String(), Rounds: rounds, Machine: &machine, ModelSamples: make([]float64, kept)}
	for i := range kept {
		out.ModelSamples[i] = times[i].Seconds()
	}
	slices.Sort(times)
	out.ModelSeconds = times[len(times)/2].Seconds()
	sources := map[string][]vm.Source{}
	for _, r := range p.Executable().FuncTable {
		if len(r.Sources) > 0 {
			sources[r.Name] = r.Sources
		}
	}
	for _, k := range p.Profile() {
		calls := k.Calls / int64(rounds)
		kp := KernelProfile{
			Name: k.Name, Calls: calls, Ops: sources[k.Name],
			Seconds:     k.Median.Seconds() * float64(calls),
			MeanSeconds: k.Total.Seconds() / float64(rounds),
			Samples:     make([]float64, kept),
		}
		var prev time.Duration
		for i, totals := range perRound {
			kp.Samples[i] = (totals[k.Name] - prev).Seconds()
			prev = totals[k.Name]
		}
		if kp.Ops == nil {
			kp.Ops = []vm.Source{}
		}
		out.KernelSeconds += kp.Seconds
		out.Kernels = append(out.Kernels, kp)
	}
	for i := range out.Kernels {
		if out.KernelSeconds > 0 {
			out.Kernels[i].Share = out.Kernels[i].Seconds / out.KernelSeconds
		}
	}
	slices.SortStableFunc(out.Kernels, func(a, b KernelProfile) int {
		if c := cmp.Compare(b.Seconds, a.Seconds); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	out.Trace = []TraceEvent{{Name: name, DurUS: us(lastDur)}}
	for _, e := range events {
		out.Trace = append(out.Trace, TraceEvent{Name: e.Name, Kernel: true, StartUS: us(e.Start.Sub(start)), DurUS: us(e.Dur)})
	}
	return out, nil
}

// profileFunc is ProfileFunc: profile(name, rounds, args…) as JSON.
func (m *Module) profileFunc() *packedfunc.Func {
	return packedfunc.New(ProfileFunc, func(args []packedfunc.Value) (packedfunc.Value, error) {
		if len(args) < 2 {
			return packedfunc.Nil, fmt.Errorf("%s: %w: want (function name, rounds, its arguments…), got %d arguments", ProfileFunc, packedfunc.ErrArity, len(args))
		}
		name, err := args[0].AsString()
		if err != nil {
			return packedfunc.Nil, fmt.Errorf("%s: argument 0 (the function's name): %w", ProfileFunc, err)
		}
		rounds, err := args[1].AsInt()
		if err != nil {
			return packedfunc.Nil, fmt.Errorf("%s: argument 1 (rounds): %w", ProfileFunc, err)
		}
		p, err := m.Profile(name, int(rounds), args[2:]...)
		if err != nil {
			return packedfunc.Nil, err
		}
		b, err := json.Marshal(p)
		if err != nil {
			return packedfunc.Nil, err
		}
		return packedfunc.String(string(b)), nil
	})
}
