package auto

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/internal/check"
)

// pick is a Decider that answers every site with the candidate at a
// fixed index, or the value it was told to give.
type pick struct {
	index int
	value int64
	asked []string
}

func (p *pick) Choose(s *schedule.Schedule, site string, cands []int64, def int) (int64, error) {
	p.asked = append(p.asked, site)
	if p.value != 0 {
		return p.value, nil
	}
	return s.SampleCategorical(nil, cands, Uniform(len(cands)), p.index)
}

// TestChoose checks the choices' plumbing: the default pick, a Decider's
// pick recorded in the trace, repeated and single candidates, and the
// errors of a pick that is not a candidate.
func TestChoose(t *testing.T) {
	f := globalPoolFunc(t, [4]int64{1, 2, 3, 3}, false)
	s, err := schedule.New(f)
	check.NoError(t, err)

	v, err := Options{}.choose(s, "r/b/rows", []int64{4, 6, 4, 8}, 6)
	check.NoError(t, err)
	check.Equal(t, v, int64(6))
	tr := strings.Join(s.Trace(), "\n")
	check.True(t, strings.Contains(tr, "sample_categorical(candidates=[4, 6, 8]"), "trace: %s", tr)
	check.True(t, strings.Contains(tr, "decision=1"), "trace: %s", tr)

	p := &pick{index: 2}
	v, err = Options{Decide: p}.choose(s, "r/b/cols", []int64{1, 2, 3}, 1)
	check.NoError(t, err)
	check.Equal(t, v, int64(3))
	check.Equal(t, strings.Join(p.asked, ","), "r/b/cols")

	// One candidate: nothing asked.
	v, err = Options{Decide: p}.choose(s, "r/b/one", []int64{5, 5}, 5)
	check.NoError(t, err)
	check.Equal(t, v, int64(5))
	check.Equal(t, len(p.asked), 1)

	_, err = Options{}.choose(s, "r/b/bad", []int64{1, 2}, 3)
	check.True(t, err != nil && strings.Contains(err.Error(), `"r/b/bad"`), "err: %v", err)
	_, err = Options{Decide: &pick{value: 9}}.choose(s, "r/b/wild", []int64{1, 2}, 1)
	check.True(t, err != nil && strings.Contains(err.Error(), "not one of the candidates"), "err: %v", err)

	yes, err := Options{}.chooseBool(s, "r/b/copy", true)
	check.NoError(t, err)
	check.True(t, yes, "default yes")
}

// drawn is a Decider that picks a candidate at random for each site (the
// same one when a site is asked again) and keeps what it picked.
type drawn struct {
	rng    *rand.Rand
	picked map[string]int
}

func (d *drawn) Choose(s *schedule.Schedule, site string, cands []int64, def int) (int64, error) {
	i, ok := d.picked[site]
	if !ok || i >= len(cands) {
		i = d.rng.IntN(len(cands))
		d.picked[site] = i
	}
	return s.SampleCategorical(nil, cands, Uniform(len(cands)), i)
}

// checkChoices schedules f with the default rules under draws random
// sets of choices (seeded, so a failure repeats) and checks each against
// the unscheduled function in the interpreter, and that its trace replays
// to it; it returns the sites the rules asked. A rule whose choices are
// not all valid for the function fails here.
func checkChoices(t *testing.T, f *ir.PrimFunc, opts Options, draws int) []string {
	t.Helper()
	sites := map[string]bool{}
	for seed := range draws {
		d := &drawn{rng: rand.New(rand.NewPCG(uint64(seed), 7)), picked: map[string]int{}}
		o := opts
		o.Decide = d
		a, err := Apply(f, o)
		if err != nil {
			t.Fatalf("draw %d %v: %v", seed, d.picked, err)
		}
		for s := range d.picked {
			sites[s] = true
		}
		if a.Rule == "" {
			t.Fatalf("draw %d %v: no rule applies", seed, d.picked)
		}
		check.NoError(t, ir.Verify(a.Func))
		sameOutput(t, f, a.Func, 1e-4)
		r, err := schedule.Replay(f, a.Trace)
		check.NoError(t, err)
		check.True(t, ir.StructuralEqual(r.Func(), a.Func), "draw ", seed, ": the trace replays to another function")
	}
	out := make([]string, 0, len(sites))
	for s := range sites {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// drawnOpts is opts with a Decider that draws each choice at random,
// seeded.
func drawnOpts(opts Options, seed uint64) Options {
	opts.Decide = &drawn{rng: rand.New(rand.NewPCG(seed, 7)), picked: map[string]int{}}
	return opts
}
