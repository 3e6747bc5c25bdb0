package compiler

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
)

// ScheduleKind is where the schedule a PrimFunc was built with came from.
type ScheduleKind uint8

const (
	// Unscheduled: the function as written (no default rule applies, or
	// BuildOptions.NoDefaultSchedule).
	Unscheduled ScheduleKind = iota
	// DefaultSchedule: a rule of compiler/schedule/auto (FuncSchedule.Rule).
	DefaultSchedule
	// AlreadyScheduled: the function came scheduled (auto.Scheduled;
	// FuncSchedule.Rule says what shows it) and was kept as it is.
	AlreadyScheduled
	// OptionSchedule: BuildOptions.Schedule rewrote it (kiln build
	// --tuning-db: a tuning database's record).
	OptionSchedule
)

// FuncSchedule is the schedule one PrimFunc of a build got.
type FuncSchedule struct {
	Name string
	Kind ScheduleKind
	// Rule is the default rule (DefaultSchedule) or the sign of the
	// function's own schedule (AlreadyScheduled).
	Rule string
}

// String says it as kiln build does: "unscheduled", "default schedule
// (matmul)", "already scheduled (loop i is parallel)", "scheduled by
// the build's schedule option".
func (s FuncSchedule) String() string {
	switch s.Kind {
	case DefaultSchedule:
		return fmt.Sprintf("default schedule (%s)", s.Rule)
	case AlreadyScheduled:
		return fmt.Sprintf("already scheduled (%s)", s.Rule)
	case OptionSchedule:
		return "scheduled by the build's schedule option"
	}
	return "unscheduled"
}

// defaultSchedules gives every PrimFunc of mod that needs one its default
// schedule and says, per function, which schedule it has. before is mod
// as it was before BuildOptions.Schedule ran: the functions that hook
// changed are its own. Other functions that are already scheduled keep
// their schedule: on CPUs as auto.Scheduled says, on a target whose
// functions need threads (TargetInfo.ThreadBound: GPUs) when a loop is
// bound to a thread axis (a GPU kernel needs nothing else, and one
// without gets the GPU rules whatever the options say). The rules read
// the target's vector width, registers and caches from info.
func defaultSchedules(before, mod *ir.IRModule, info TargetInfo, opts BuildOptions) (*ir.IRModule, []FuncSchedule, error) {
	var out []FuncSchedule
	for name, f := range mod.PrimFuncs() {
		s := FuncSchedule{Name: name}
		hooked := opts.Schedule != nil && before.PrimFunc(name) != f
		if hooked {
			s.Kind = OptionSchedule
		}
		switch {
		case info.ThreadBound && hasThreadBinding(f):
			if !hooked {
				s.Kind, s.Rule = AlreadyScheduled, "loops bound to threads"
			}
		case info.ThreadBound:
			// A GPU kernel runs only with its loops bound to threads: it
			// gets the GPU rules even with NoDefaultSchedule.
			g, err := auto.GPUFunc(f, auto.GPUOptions{})
			if err != nil {
				return nil, nil, fmt.Errorf("function %q: no default GPU schedule applies (%w); schedule it by hand (bind its loops to blockIdx/threadIdx)", name, err)
			}
			mod = mod.With(name, g)
			s.Kind, s.Rule = DefaultSchedule, "gpu"
		case opts.NoDefaultSchedule:
			if !hooked {
				if ok, sign := auto.Scheduled(f); ok {
					s.Kind, s.Rule = AlreadyScheduled, sign
				}
			}
		case hooked:
		default:
			if ok, sign := auto.Scheduled(f); ok {
				s.Kind, s.Rule = AlreadyScheduled, sign
				break
			}
			g, rule, err := auto.FuncRule(f, info.CPUOptions())
			if err != nil {
				return nil, nil, fmt.Errorf("default schedule of %q: %w", name, err)
			}
			if rule != "" {
				mod = mod.With(name, g)
				s.Kind, s.Rule = DefaultSchedule, rule
			}
		}
		out = append(out, s)
	}
	return mod, out, nil
}

// CPUOptions are the CPU rules' options for the target: its vector width
// (a target without vectors is tiled as for 128-bit ones; its vectorized
// loops stay serial, see Vectorize), registers and caches. Build schedules
// with them; whatever else asks auto for the default schedule of a
// target's function (a tuner's default candidate) should too.
func (info TargetInfo) CPUOptions() auto.Options {
	return auto.Options{
		VectorBytes:     max(info.VectorBytes, 16),
		VectorRegisters: info.VectorRegisters,
		L1DBytes:        info.L1DBytes,
		L2Bytes:         info.L2Bytes,
	}
}

// TuneTarget is what the tuner's rules know of t: its kind, its vector
// width and the options of the default schedules a build for t gives
// (TargetInfo.CPUOptions), so that a tuning run's default candidate is
// the schedule the build gives the kernel untuned.
func (t Target) TuneTarget() (rules.Target, error) {
	info, err := t.Info()
	if err != nil {
		return rules.Target{}, err
	}
	rt := rules.Target{Kind: info.Kind, VectorBytes: t.VectorBytes()}
	if !info.ThreadBound {
		rt.Defaults = info.CPUOptions()
	}
	return rt, nil
}
