package auto

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/schedule"
)

// A Decider makes the choices of the default rules: a register tile's
// rows and vectors, how many channels a panel holds, which loop runs in
// parallel, whether a panel is copied. Each rule asks for a choice
// through Options.choose (or GPUOptions.choose) with the values that are
// valid for the function and the one the rule itself would pick; the
// default schedule is the rules with every choice at that value. The
// tuner passes a Decider of its own that replays recorded decisions or
// draws others around the default, so its candidates are the default
// rules' neighbours (compiler/tune).
//
// A rule that fails with one choice and is tried again (withEpilogue
// tries a second time without the epilogue on a new schedule) asks for
// the same site again: a Decider must answer a site the same way each
// time within one scheduling of a function.
type Decider interface {
	// Choose returns one of cands for the choice named site (the rule,
	// the block and what is chosen); def is the index of the rule's own
	// pick. It records the choice in s's trace (SampleCategorical with
	// its decision), so the trace replays to the same function.
	Choose(s *schedule.Schedule, site string, cands []int64, def int) (int64, error)
}

// DefaultDecider takes each rule's own pick: the default schedule.
type DefaultDecider struct{}

// Choose returns cands[def], recorded in s's trace.
func (DefaultDecider) Choose(s *schedule.Schedule, site string, cands []int64, def int) (int64, error) {
	return s.SampleCategorical(nil, cands, Uniform(len(cands)), def)
}

// Uniform returns n equal probabilities.
func Uniform(n int) []float64 {
	p := make([]float64, n)
	for i := range p {
		p[i] = 1
	}
	return p
}

// choose asks d for the choice named site among cands, def the rule's
// own pick (which must be one of cands). Repeated candidates count once;
// a choice of one candidate is not asked (nothing to decide, nothing in
// the trace). A Decider's answer that is not one of cands is an error.
func choose(d Decider, s *schedule.Schedule, site string, cands []int64, def int64) (int64, error) {
	var cs []int64
	for _, c := range cands {
		if !slices.Contains(cs, c) {
			cs = append(cs, c)
		}
	}
	i := slices.Index(cs, def)
	if i < 0 {
		return 0, fmt.Errorf("choice %q: the rule's pick %d is not among the candidates %v", site, def, cs)
	}
	if len(cs) == 1 {
		return def, nil
	}
	if d == nil {
		d = DefaultDecider{}
	}
	v, err := d.Choose(s, site, cs, i)
	if err != nil {
		return 0, fmt.Errorf("choice %q: %w", site, err)
	}
	if !slices.Contains(cs, v) {
		return 0, fmt.Errorf("choice %q: the decider chose %d, not one of the candidates %v", site, v, cs)
	}
	return v, nil
}

// choose asks the options' Decider (the default one when none is set)
// for the choice named site among cands; def is the rule's own pick.
func (o Options) choose(s *schedule.Schedule, site string, cands []int64, def int64) (int64, error) {
	return choose(o.Decide, s, site, cands, def)
}

// choose is Options.choose for the GPU rules.
func (o GPUOptions) choose(s *schedule.Schedule, site string, cands []int64, def int64) (int64, error) {
	return choose(o.Decide, s, site, cands, def)
}

// chooseBool asks for a yes-or-no choice (1 is yes), def the rule's own.
func (o Options) chooseBool(s *schedule.Schedule, site string, def bool) (bool, error) {
	d := int64(0)
	if def {
		d = 1
	}
	v, err := o.choose(s, site, []int64{0, 1}, d)
	return v == 1, err
}
