package rules

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
)

// Rule is one schedule rule: Apply transforms s, drawing its choices from
// c. Rules are applied in registration order; a rule that does not apply
// to a function leaves it alone and returns nil. An error means the
// candidate being generated is invalid (a replayed decision that no
// longer fits, for instance).
type Rule interface {
	Name() string
	Apply(c *Context, s *schedule.Schedule) error
}

// Target is what rules know of the machine they schedule for.
type Target struct {
	// Kind is the target kind ("cpu").
	Kind string
	// VectorBytes is the width of a vector register (64 with AVX-512).
	VectorBytes int64
	// Defaults are the options of the CPU rules of compiler/schedule/auto
	// the build's default schedules use on this machine (its vector
	// width, registers and caches: compiler.Target.TuneTarget fills them
	// from compiler.TargetInfo.CPUOptions), so that the tuner's default
	// candidate is what the build gives an untuned kernel. Zero: the
	// rules' defaults for VectorBytes.
	Defaults auto.Options
}

// AutoOptions are the options the default schedule of a function is
// made with for t: Defaults, or the rules' defaults for VectorBytes when
// they are not given.
func (t Target) AutoOptions() auto.Options {
	if t.Defaults != (auto.Options{}) {
		return t.Defaults
	}
	return auto.Options{VectorBytes: max(t.VectorBytes, 16)}
}

// Lanes returns how many elements of t fit in one vector register.
func (t Target) Lanes(dt ir.DType) int64 {
	b := int64(dt.Bits) / 8
	if b < 1 {
		b = 1
	}
	v := t.VectorBytes
	if v <= 0 {
		v = 16
	}
	return max(v/b, 1)
}

// Context is what a rule sees: the target and the sampler.
type Context struct {
	Target  Target
	Sampler *Sampler
}

type registered struct {
	kinds []string
	rule  Rule
}

var registry []registered

// Register adds rule for the given target kinds. It is called from init
// functions; registering two rules of one name panics.
func Register(rule Rule, kinds ...string) {
	for _, r := range registry {
		if r.rule.Name() == rule.Name() {
			panic(fmt.Sprintf("rules: rule %q registered twice", rule.Name()))
		}
	}
	registry = append(registry, registered{kinds: kinds, rule: rule})
}

// For returns the rules registered for a target kind, in the order they
// apply (by their Order, then name).
func For(kind string) []Rule {
	var out []Rule
	for _, r := range registry {
		if slices.Contains(r.kinds, kind) {
			out = append(out, r.rule)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return order(out[i]) < order(out[j]) })
	return out
}

// Ordered is implemented by rules that must run at a given point: lower
// first. Rules without it run at 100.
type Ordered interface{ Order() int }

func order(r Rule) int {
	if o, ok := r.(Ordered); ok {
		return o.Order()
	}
	return 100
}

// Decision kinds.
const (
	KindTile        = "tile"
	KindCategorical = "categorical"
)

// Decision is one sampling decision of a candidate: the factors a
// perfect tile drew, or the index a categorical draw chose.
type Decision struct {
	// Site names the choice: the rule, the block and the loop or buffer.
	Site string `json:"site"`
	Kind string `json:"kind"`
	// Tile are the factors, outermost first (KindTile); Max is the
	// largest innermost factor allowed.
	Tile []int64 `json:"tile,omitempty"`
	Max  int64   `json:"max,omitempty"`
	// Choice is the index chosen among N candidates (KindCategorical).
	Choice int `json:"choice"`
	N      int `json:"n,omitempty"`
}

// ErrNoDecision is returned when a replay meets a choice it has no
// decision for and has no random source to draw one.
var ErrNoDecision = errors.New("no decision for this choice")

// Sampler draws a rule's choices from a random source, or replays them
// from recorded decisions, and keeps every decision made.
type Sampler struct {
	rng    *rand.Rand
	replay map[string]Decision
	made   []Decision
	seen   map[string]bool
}

// NewSampler returns a sampler that replays the decisions given (by
// site) and draws the others from rng; with a nil rng a missing decision
// is ErrNoDecision.
func NewSampler(rng *rand.Rand, replay []Decision) *Sampler {
	m := make(map[string]Decision, len(replay))
	for _, d := range replay {
		m[d.Site] = d
	}
	return &Sampler{rng: rng, replay: m, seen: map[string]bool{}}
}

// Decisions returns the decisions made so far, in order.
func (x *Sampler) Decisions() []Decision { return slices.Clone(x.made) }

func (x *Sampler) site(site string) (string, error) {
	if x.seen[site] {
		return "", fmt.Errorf("rules: two choices at site %q", site)
	}
	x.seen[site] = true
	return site, nil
}

// Tile draws (or replays) n perfect-tile factors of loop l with an
// innermost factor of at most max, through s.SamplePerfectTile.
func (x *Sampler) Tile(s *schedule.Schedule, site string, l schedule.LoopRV, n int, max int64) ([]int64, error) {
	site, err := x.site(site)
	if err != nil {
		return nil, err
	}
	var dec []int64
	if d, ok := x.replay[site]; ok {
		if d.Kind != KindTile {
			return nil, fmt.Errorf("site %q: recorded decision is %s, want %s", site, d.Kind, KindTile)
		}
		dec = d.Tile
	} else if x.rng == nil {
		return nil, fmt.Errorf("site %q: %w", site, ErrNoDecision)
	}
	f, err := s.SamplePerfectTile(x.rng, l, n, max, dec)
	if err != nil {
		return nil, fmt.Errorf("site %q: %w", site, err)
	}
	x.made = append(x.made, Decision{Site: site, Kind: KindTile, Tile: f, Max: max})
	return f, nil
}

// Choose draws (or replays) an index among n choices with the given
// weights (nil: uniform), through s.SampleCategorical.
func (x *Sampler) Choose(s *schedule.Schedule, site string, n int, weights []float64) (int, error) {
	return x.choose(s, site, n, weights, -1)
}

// ChooseOr is Choose for a choice newer than some recorded candidates:
// a replay that has no decision for the site takes old, what the rules
// did before they made the choice, so that those candidates replay as
// they were measured.
func (x *Sampler) ChooseOr(s *schedule.Schedule, site string, n int, weights []float64, old int) (int, error) {
	return x.choose(s, site, n, weights, old)
}

func (x *Sampler) choose(s *schedule.Schedule, site string, n int, weights []float64, old int) (int, error) {
	site, err := x.site(site)
	if err != nil {
		return 0, err
	}
	if weights == nil {
		weights = make([]float64, n)
		for i := range weights {
			weights[i] = 1
		}
	}
	dec := -1
	if d, ok := x.replay[site]; ok {
		if d.Kind != KindCategorical {
			return 0, fmt.Errorf("site %q: recorded decision is %s, want %s", site, d.Kind, KindCategorical)
		}
		dec = d.Choice
	} else if x.rng == nil && old >= 0 {
		dec = old
	} else if x.rng == nil {
		return 0, fmt.Errorf("site %q: %w", site, ErrNoDecision)
	}
	cands := make([]int64, n)
	for i := range cands {
		cands[i] = int64(i)
	}
	v, err := s.SampleCategorical(x.rng, cands, weights, dec)
	if err != nil {
		return 0, fmt.Errorf("site %q: %w", site, err)
	}
	x.made = append(x.made, Decision{Site: site, Kind: KindCategorical, Choice: int(v), N: n})
	return int(v), nil
}

// blockNames returns the names of f's blocks (not the root) in program
// order.
func blockNames(f *ir.PrimFunc) []string {
	var out []string
	ir.Visit(f.Body, func(n ir.Node) bool {
		if b, ok := n.(*ir.Block); ok && b.Name != ir.RootBlockName {
			out = append(out, b.Name)
		}
		return true
	})
	return out
}

// loopKinds classifies the loops around block b: for each loop, the kind
// of the block iteration variable it binds. ok is false unless every loop
// has a constant extent, is serial and binds exactly one iteration
// variable directly (the block as TE made it, no earlier transforms).
func loopKinds(s *schedule.Schedule, b schedule.BlockRV) (loops []schedule.LoopRV, kinds []ir.IterKind, extents []int64, ok bool) {
	br, err := s.BlockRealize(b)
	if err != nil {
		return nil, nil, nil, false
	}
	loops, err = s.GetLoops(b)
	if err != nil || len(loops) != len(br.IterValues) || len(loops) == 0 {
		return nil, nil, nil, false
	}
	for _, l := range loops {
		f, err := s.LoopFor(l)
		if err != nil || f.Kind != ir.ForSerial {
			return nil, nil, nil, false
		}
		ext, ok := ir.IsConstInt(f.Extent)
		if !ok {
			return nil, nil, nil, false
		}
		found := -1
		for i, v := range br.IterValues {
			if vv, isVar := v.(*ir.Var); isVar && vv == f.Var {
				found = i
			}
		}
		if found < 0 {
			return nil, nil, nil, false
		}
		kinds = append(kinds, br.Block.IterVars[found].Kind)
		extents = append(extents, ext)
	}
	return loops, kinds, extents, true
}

// isParamBuffer reports whether buf is one of f's parameters.
func isParamBuffer(f *ir.PrimFunc, buf *ir.Buffer) bool {
	for _, b := range f.BufferMap {
		if b == buf {
			return true
		}
	}
	return false
}
