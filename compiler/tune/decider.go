package tune

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
)

// keepDefault is the probability that a drawn choice of the default
// rules keeps the rule's own pick; otherwise one of the other candidates
// is drawn uniformly. A candidate drawn around the default thus changes
// about half of its choices: near enough to keep what makes the default
// fast, far enough to reach the other corners of the space.
const keepDefault = 0.5

// decider is the tuner's auto.Decider: it makes the choices of the
// default rules (compiler/schedule/auto) for one candidate. A choice it
// has a recorded decision for (by site) replays it; any other is drawn
// around the default from rng (see keepDefault), or, with no rng, is
// the rule's own pick, so a record made before a rule had a choice
// replays as it was measured. Completing a mutant (with rng), a recorded
// decision whose candidates changed (a tile's rows after its vectors
// changed: the rows that fit are others) is drawn again, so a mutation
// of one choice moves the choices that depend on it with it; replaying a
// record (no rng), it is an error. It keeps the decisions it made, in the
// order the rules asked them, in the rules.Decision shape (the index of
// the candidate among N; the values are in the trace's
// sample_categorical line).
type decider struct {
	rng    *rand.Rand
	replay map[string]Decision
	made   []Decision
	at     map[string]int // site → index in made
}

func newDecider(rng *rand.Rand, replay []Decision) *decider {
	m := make(map[string]Decision, len(replay))
	for _, d := range replay {
		m[d.Site] = d
	}
	return &decider{rng: rng, replay: m, at: map[string]int{}}
}

// Choose implements auto.Decider. A site asked again within one
// scheduling (a rule tried a second time on a new schedule) gets the
// same answer.
func (d *decider) Choose(s *schedule.Schedule, site string, cands []int64, def int) (int64, error) {
	n := len(cands)
	i := def
	if k, ok := d.at[site]; ok {
		if d.made[k].N != n {
			return 0, fmt.Errorf("site %q asked with %d candidates, then %d", site, d.made[k].N, n)
		}
		i = d.made[k].Choice
	} else if r, ok := d.replay[site]; ok && (d.rng == nil || r.Kind == rules.KindCategorical && r.N == n) {
		switch {
		case r.Kind != rules.KindCategorical:
			return 0, fmt.Errorf("site %q: recorded decision is %s, want %s", site, r.Kind, rules.KindCategorical)
		case r.N != n:
			return 0, fmt.Errorf("site %q: recorded among %d candidates, the rule has %d (recorded by another version of the rules?)", site, r.N, n)
		case r.Choice < 0 || r.Choice >= n:
			return 0, fmt.Errorf("site %q: recorded choice %d is not among %d candidates", site, r.Choice, n)
		}
		i = r.Choice
	} else if d.rng != nil && d.rng.Float64() >= keepDefault {
		i = d.rng.IntN(n - 1)
		if i >= def {
			i++
		}
	}
	v, err := s.SampleCategorical(nil, cands, auto.Uniform(n), i)
	if err != nil {
		return 0, err
	}
	if _, ok := d.at[site]; !ok {
		d.at[site] = len(d.made)
		d.made = append(d.made, Decision{Site: site, Kind: rules.KindCategorical, Choice: i, N: n})
	}
	return v, nil
}

// Decisions returns the decisions made, in order.
func (d *decider) Decisions() []Decision { return slices.Clone(d.made) }
