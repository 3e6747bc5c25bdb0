package tune

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
)

// Decision is one sampling decision of a candidate (see rules.Decision).
type Decision = rules.Decision

// Space is the design space of one PrimFunc for one target, in two
// halves: the schedule rules of compiler/tune/rules registered for the
// target's kind, applied in order (candidates of Schedule ""), and the
// default rules of compiler/schedule/auto with their choices (tile sizes,
// vector counts, which loop is parallel…) made by the tuner's decider
// (candidates of Schedule RulesSchedule, and the default schedule, every
// choice at the rule's own pick, of Schedule DefaultSchedule).
type Space struct {
	fn     *ir.PrimFunc
	target rules.Target
	rules  []rules.Rule
	// meta: the schedule rules make at least one choice on fn; dflt is
	// the default schedule's candidate (its decisions say whether the
	// default rules make any).
	meta bool
	dflt *Candidate
}

// ErrUntunable is returned by NewSpace for a function neither half of
// the space has a choice to make on (no loops, only symbolic extents…).
var ErrUntunable = errors.New("nothing to tune")

// NewSpace returns the design space of f for target. It checks that one
// of its halves makes at least one choice on f; a function both leave
// alone is ErrUntunable.
func NewSpace(f *ir.PrimFunc, target rules.Target) (*Space, error) {
	rs := rules.For(target.Kind)
	if len(rs) == 0 {
		return nil, fmt.Errorf("tune: no schedule rules for target kind %q", target.Kind)
	}
	sp := &Space{fn: f, target: target, rules: rs}
	c, err := sp.apply(rand.New(rand.NewPCG(1, 1)), nil)
	if err != nil {
		return nil, fmt.Errorf("tune: %w", err)
	}
	sp.meta = len(c.Decisions) > 0
	d, err := sp.rulesCandidate(nil, nil)
	if err != nil {
		return nil, fmt.Errorf("tune: the default schedule: %w", err)
	}
	d.Schedule = DefaultSchedule
	sp.dflt = d
	if !sp.meta && len(d.Decisions) == 0 {
		return nil, fmt.Errorf("%w: the schedule rules (%s) and the default rules make no choice on this function", ErrUntunable, sp.ruleNames())
	}
	return sp, nil
}

func (sp *Space) ruleNames() string {
	var n []string
	for _, r := range sp.rules {
		n = append(n, r.Name())
	}
	return strings.Join(n, ", ")
}

// Func returns the function the space schedules.
func (sp *Space) Func() *ir.PrimFunc { return sp.fn }

// Candidate is one point of a space: its decisions, the function they
// give and the schedule's trace. Schedule says which half of the space
// it is a point of: "" the schedule rules', RulesSchedule (or
// DefaultSchedule, every choice at its default) the default rules'.
type Candidate struct {
	Decisions []Decision
	Func      *ir.PrimFunc
	Trace     []string
	Schedule  string
}

// DefaultSchedule is the Schedule of the default schedule's candidate
// and record: the schedule kiln gives a kernel nobody tuned, the default
// rules with each choice at the rule's own pick. Its decisions are those
// picks (none in records of kilns before the rules had choices, which
// replay to the default schedule all the same).
const DefaultSchedule = "default"

// RulesSchedule is the Schedule of the candidates of the default rules
// whose choices are not all the rules' own: their decisions replay
// through the rules' sites (RULE/BLOCK/what).
const RulesSchedule = "rules"

// Key identifies a candidate by its half and decisions.
func (c *Candidate) Key() string { return candidateKey(c.Schedule, c.Decisions) }

// candidateKey is the key of a candidate or record: its decisions, with
// the half of the space they are decisions of. A point of the default
// rules is known by its decisions whether it is labelled the default or
// not; with no decisions it is the default schedule.
func candidateKey(schedule string, ds []Decision) string {
	switch schedule {
	case "":
		return DecisionsKey(ds)
	case DefaultSchedule, RulesSchedule:
		if len(ds) == 0 {
			return "schedule=" + DefaultSchedule + ";"
		}
		return "rules:" + DecisionsKey(ds)
	}
	return "schedule=" + schedule + ";"
}

// Default returns the candidate of the default schedule: the one
// compiler/schedule/auto gives the function (what kiln builds a kernel
// of a graph module with when no record applies) with the decisions of
// its rule's choices and its trace, or the function as it is when auto
// has no rule for it. The search measures it like any other candidate,
// so a tuned kernel is never slower than the default one.
func (sp *Space) Default() (*Candidate, error) {
	c := *sp.dflt
	return &c, nil
}

// rulesCandidate schedules the function with the default rules, their
// choices replayed from ds by site and the others drawn around the
// default from rng (the rules' own picks with no rng). It is labelled
// DefaultSchedule when its decisions are the default's.
func (sp *Space) rulesCandidate(rng *rand.Rand, ds []Decision) (*Candidate, error) {
	d := newDecider(rng, ds)
	if sp.target.Kind != "cpu" {
		// Only CPU kernels are tuned: a GPU kernel's default schedule
		// (its threads bound by auto.ApplyGPU) is the build's, given to
		// the function as it is.
		return &Candidate{Func: sp.fn, Schedule: DefaultSchedule}, nil
	}
	opts := sp.target.AutoOptions()
	opts.Decide = d
	a, err := auto.Apply(sp.fn, opts)
	if err != nil {
		return nil, err
	}
	if err := ir.Verify(a.Func); err != nil {
		return nil, fmt.Errorf("the default rules' schedule does not verify: %w", err)
	}
	c := &Candidate{Decisions: d.Decisions(), Func: a.Func, Trace: a.Trace, Schedule: RulesSchedule}
	if sp.dflt != nil && c.Key() == sp.dflt.Key() {
		c.Schedule = DefaultSchedule
	}
	return c, nil
}

// Candidate returns the candidate a record measured: its decisions
// replayed in the half of the space its Schedule names.
func (sp *Space) Candidate(r Record) (*Candidate, error) {
	switch r.Schedule {
	case "", DefaultSchedule, RulesSchedule:
		return sp.replay(r.Schedule, r.Decisions)
	}
	return nil, fmt.Errorf("unknown schedule %q (recorded by a newer kiln?)", r.Schedule)
}

// replay gives the candidate of decisions ds of the half schedule names.
func (sp *Space) replay(schedule string, ds []Decision) (*Candidate, error) {
	if schedule == "" {
		return sp.Replay(ds)
	}
	if len(ds) == 0 {
		return sp.Default()
	}
	return sp.rulesCandidate(nil, ds)
}

// DecisionsKey is the canonical text of a list of decisions.
func DecisionsKey(ds []Decision) string {
	var b strings.Builder
	for _, d := range ds {
		b.WriteString(d.Site)
		b.WriteByte('=')
		if d.Kind == rules.KindTile {
			fmt.Fprint(&b, d.Tile)
		} else {
			fmt.Fprint(&b, d.Choice)
		}
		b.WriteByte(';')
	}
	return b.String()
}

// Sample draws a random candidate: with both halves of the space making
// choices, from either with equal odds (the default rules' choices drawn
// around the default, see keepDefault).
func (sp *Space) Sample(rng *rand.Rand) (*Candidate, error) {
	rulesHalf := len(sp.dflt.Decisions) > 0
	if rulesHalf && (!sp.meta || rng.IntN(2) == 0) {
		return sp.rulesCandidate(rng, nil)
	}
	return sp.apply(rng, nil)
}

// Replay applies recorded decisions of the schedule rules (Schedule "");
// every choice must have one.
func (sp *Space) Replay(ds []Decision) (*Candidate, error) {
	return sp.apply(nil, ds)
}

// complete applies ds in the half schedule names, drawing choices ds has
// no decision for from rng (after a mutation changed which choices are
// made).
func (sp *Space) complete(rng *rand.Rand, schedule string, ds []Decision) (*Candidate, error) {
	if schedule == "" {
		return sp.apply(rng, ds)
	}
	return sp.rulesCandidate(rng, ds)
}

func (sp *Space) apply(rng *rand.Rand, ds []Decision) (c *Candidate, err error) {
	s, err := schedule.New(sp.fn)
	if err != nil {
		return nil, err
	}
	x := rules.NewSampler(rng, ds)
	ctx := &rules.Context{Target: sp.target, Sampler: x}
	for _, r := range sp.rules {
		if err := applyRule(r, ctx, s); err != nil {
			return nil, fmt.Errorf("rule %s: %w", r.Name(), err)
		}
	}
	f := s.Func()
	if err := ir.Verify(f); err != nil {
		return nil, fmt.Errorf("the scheduled function does not verify: %w", err)
	}
	return &Candidate{Decisions: x.Decisions(), Func: f, Trace: s.Trace()}, nil
}

// applyRule runs one rule, turning a panic (a broken invariant in a
// primitive) into an error naming the rule.
func applyRule(r rules.Rule, c *rules.Context, s *schedule.Schedule) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return r.Apply(c, s)
}

// Mutate returns a copy of ds with one decision changed: a tile decision
// moves a factor from one level to another (keeping the product and the
// innermost limit), a categorical one picks another index. It reports
// false when no decision can change.
func Mutate(rng *rand.Rand, ds []Decision) ([]Decision, bool) {
	out := make([]Decision, len(ds))
	copy(out, ds)
	for _, i := range rng.Perm(len(ds)) {
		d := ds[i]
		switch d.Kind {
		case rules.KindCategorical:
			if d.N < 2 {
				continue
			}
			c := rng.IntN(d.N - 1)
			if c >= d.Choice {
				c++
			}
			d.Choice = c
			out[i] = d
			return out, true
		case rules.KindTile:
			if t, ok := moveFactor(rng, d.Tile, d.Max); ok {
				d.Tile = t
				out[i] = d
				return out, true
			}
		}
	}
	return nil, false
}

// moveFactor moves a prime factor of one tile level to another level.
func moveFactor(rng *rand.Rand, tile []int64, maxInner int64) ([]int64, bool) {
	n := len(tile)
	if n < 2 {
		return nil, false
	}
	for range 8 {
		from, to := rng.IntN(n), rng.IntN(n-1)
		if to >= from {
			to++
		}
		p := smallestPrime(tile[from])
		if p == 0 {
			continue
		}
		t := append([]int64(nil), tile...)
		// Move a random power of the prime that divides the level.
		for t[from]%p == 0 {
			t[from] /= p
			t[to] *= p
			if rng.IntN(2) == 0 {
				break
			}
		}
		if maxInner > 0 && t[n-1] > maxInner {
			continue
		}
		return t, true
	}
	return nil, false
}

func smallestPrime(x int64) int64 {
	if x < 2 {
		return 0
	}
	for p := int64(2); p*p <= x; p++ {
		if x%p == 0 {
			return p
		}
	}
	return x
}
