package rules

import (
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
)

// vectorAccumulate gives row reductions vector accumulators: a reduction
// y[rows] op= E(rows, k) (a sum or a maximum from a constant init) whose
// loop over k is the innermost, with an extent that is a multiple of the
// lanes, keeps a local vector of partial results over k (vectorized),
// then combines its lanes. It applies the default schedule's primitives
// for this (compiler/schedule/auto's VectorRows: split, rfactor,
// decompose_reduction, vectorize, set_scope), so the candidate's trace
// replays it. The choice, per reduction: serial as scheduled, one vector
// register of partial results, or two (two independent chains, which
// hides the latency of the adds: a softmax's sum of exponentials). It
// runs after the tiling and compute-location rules, so a reduction may
// have been moved under its consumer's loop (compute_at), and before
// parallel_vectorize_unroll, which then parallelizes, vectorizes and
// unrolls the loops it made like any other.
type vectorAccumulate struct{}

func init() { Register(vectorAccumulate{}, "cpu") }

func (vectorAccumulate) Name() string { return "vector_accumulate" }
func (vectorAccumulate) Order() int   { return 85 }

func (vectorAccumulate) Apply(c *Context, s *schedule.Schedule) error {
	width := c.Target.VectorBytes
	if width <= 0 {
		width = 16
	}
	opts := auto.Options{VectorBytes: width, Decide: samplerDecider{c.Sampler}}
	_, err := auto.VectorRows(s, opts, func(block string) string { return "vector_accumulate/" + block })
	return err
}

// samplerDecider makes the default rules' choices with a rule's Sampler:
// candidate i of n is drawn with weight 1 for the first (the reductions
// stay serial, as before this rule existed, and what a replay without
// the decision takes) and 2 for the others.
type samplerDecider struct{ x *Sampler }

func (d samplerDecider) Choose(s *schedule.Schedule, site string, cands []int64, _ int) (int64, error) {
	weights := make([]float64, len(cands))
	for i := range weights {
		weights[i] = 2
	}
	weights[0] = 1
	i, err := d.x.ChooseOr(s, site, len(cands), weights, 0)
	if err != nil {
		return 0, err
	}
	return cands[i], nil
}
