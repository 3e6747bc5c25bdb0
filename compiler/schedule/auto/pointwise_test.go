package auto

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/internal/check"
)

// pointwiseCases are convCases' pointwise convolutions.
func pointwiseCases() []convCase {
	var out []convCase
	for _, cc := range convCases() {
		for _, p := range []string{"pointwise_", "oihw_1x1_", "blocks_of_8_1x1"} {
			if strings.HasPrefix(cc.name, p) {
				out = append(out, cc)
			}
		}
	}
	return out
}

// TestChoicesOfPointwise: the pointwise rule's choices (vectors and
// channels per tile, tiles of positions outside, the parallel loop) are
// valid whatever is drawn.
func TestChoicesOfPointwise(t *testing.T) {
	asked := map[string]bool{}
	cases := pointwiseCases()
	check.True(t, len(cases) >= 8, "pointwise cases: ", len(cases))
	for _, cc := range cases {
		opts := cc.opts
		if opts.ParallelFlops == 0 {
			opts.ParallelFlops = 1
		}
		f := cc.primFunc(t)
		if _, rule, err := FuncRule(f, opts); err != nil || rule != RulePointwise {
			// The 1×1 convolution over blocks of 8 channels is left
			// to the conv2d rule.
			check.True(t, err == nil && cc.name == "blocks_of_8_1x1", cc.name, ": rule ", rule, ", ", err)
			continue
		}
		for _, site := range checkChoices(t, f, opts, 4) {
			check.True(t, strings.HasPrefix(site, "pointwise/"), cc.name, ": site ", site)
			asked[site[strings.LastIndex(site, "/")+1:]] = true
		}
	}
	for _, want := range []string{"vectors", "channels", "positions_outer", "parallel"} {
		check.True(t, asked[want], "site ", want, " never asked: ", asked)
	}
}

// forced is a Decider that answers the sites ending in its keys with
// their values and the others with the rule's own pick.
type forced map[string]int64

func (d forced) Choose(s *schedule.Schedule, site string, cands []int64, def int) (int64, error) {
	for k, v := range d {
		if strings.HasSuffix(site, "/"+k) {
			for i, c := range cands {
				if c == v {
					def = i
				}
			}
		}
	}
	return s.SampleCategorical(nil, cands, Uniform(len(cands)), def)
}

// TestPointwiseShortTail: a plane whose last tile of positions needs
// fewer vectors than the others (13×13: 11 vectors in tiles of 3) takes only
// those, with no guard left once lowered, serially and in parallel over
// the tiles of channels; in a parallel loop over all the tiles the last
// one moves back instead (split_overlap).
func TestPointwiseShortTail(t *testing.T) {
	blocks := convCase{name: "blocks_of_8_13x13", n: 1, c: 16, h: 13, w: 13, f: 32, kh: 1, kw: 1, stride: 1, block: 8, epilogue: "relu6"}
	f := blocks.primFunc(t)
	for _, tt := range []struct {
		name string
		opts Options
		tail bool
	}{
		{"serial", Options{}, true},
		{"parallel channels", Options{ParallelFlops: 1}, true},
		{"parallel tiles", Options{ParallelFlops: 1, Decide: forced{"parallel": pointwiseFused}}, false},
	} {
		a, err := Apply(f, tt.opts)
		check.NoError(t, err)
		check.Equal(t, a.Rule, RulePointwise, tt.name)
		tr := strings.Join(a.Trace, "\n")
		check.Equal(t, strings.Contains(tr, "split_overlap_tail("), tt.tail, tt.name, ": ", tr)
		check.True(t, strings.Contains(tr, "decision=") && strings.Contains(tr, "sample_categorical"), tt.name, ": choices in the trace")
		if tt.tail {
			check.Equal(t, guardedLowering(t, a.Func, nil), false, tt.name, ": guards left after partition_loops")
			check.Equal(t, scalarStores(t, a.Func), 0, tt.name, ": stores of single lanes")
		}
		sameOutput(t, f, a.Func, 1e-4)
	}
	// An OIHW kernel in tiles of 3 vectors over a plane of 55: 4
	// vectors, the last tile one.
	g := convCaseNamed(t, "pointwise_55_plane").primFunc(t)
	a, err := Apply(g, Options{Decide: forced{"vectors": 3}})
	check.NoError(t, err)
	check.True(t, strings.Contains(strings.Join(a.Trace, "\n"), "split_overlap_tail("), "trace")
	check.Equal(t, guardedLowering(t, a.Func, nil), false, "guards left after partition_loops")
	sameOutput(t, g, a.Func, 1e-4)
	check.NoError(t, ir.Verify(a.Func))
}

// scalarStores lowers f and counts its stores of one lane.
func scalarStores(t *testing.T, f *ir.PrimFunc) int {
	t.Helper()
	g, err := transform.Lower(f, transform.Options{StopAfter: "storage_rewrite", Verify: true})
	check.NoError(t, err)
	n := 0
	ir.Visit(g.Body, func(x ir.Node) bool {
		if st, ok := x.(*ir.BufferStore); ok && st.Value.DType().Lanes == 1 {
			n++
		}
		return true
	})
	return n
}

// TestPointwiseChannelsOverlap: 58 channels (2·29) take a tile of
// channels that does not divide them, its last tile moved back
// (split_overlap on the channels), serially and in parallel, and compute
// what the unscheduled function does.
func TestPointwiseChannelsOverlap(t *testing.T) {
	f := convCaseNamed(t, "pointwise_prime_channels").primFunc(t)
	for _, par := range []int64{pointwiseSerial, pointwiseFused, pointwiseChannels} {
		a, err := Apply(f, Options{VectorBytes: 32, ParallelFlops: 1, Decide: forced{"parallel": par}})
		check.NoError(t, err)
		check.Equal(t, a.Rule, RulePointwise)
		tr := strings.Join(a.Trace, "\n")
		check.True(t, strings.Contains(tr, "split_overlap(loop=ff,"), "parallel ", par, ": no tile of channels moved back: ", tr)
		sameOutput(t, f, a.Func, 1e-4)
	}
	ft, _ := pointwiseTile(58, 49, 8, 12, DefaultFMAChains)
	check.True(t, 58%ft != 0, "tile of ", ft, " channels divides 58")
}

// convCaseNamed is the case of convCases named name.
func convCaseNamed(t *testing.T, name string) convCase {
	t.Helper()
	for _, cc := range convCases() {
		if cc.name == name {
			return cc
		}
	}
	t.Fatalf("no conv case %q", name)
	return convCase{}
}
