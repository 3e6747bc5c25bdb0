package rules

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
)

// Postprocessor is a rule that rewrites the scheduled function once every
// rule has applied (MetaSchedule's postprocessors), for a change the
// schedule's primitives do not express. Its choices go through the
// sampler with s, the schedule, for their trace; it returns the function
// and a line per rewrite for the candidate's trace.
type Postprocessor interface {
	Rule
	Postprocess(c *Context, s *schedule.Schedule, f *ir.PrimFunc) (*ir.PrimFunc, []string, error)
}

// vectorAccumulate gives row reductions vector accumulators, without
// rfactor: a reduction y[rows] op= E(rows, k) (a sum or a maximum from a
// constant init) whose loop over k is the innermost, with an extent that
// is a multiple of the lanes, keeps a local vector of partial results
// over k (vectorized), then combines its lanes (see
// compiler/schedule/auto's vectorRowsOn: the default schedule does the
// same with one vector register). The choice, per reduction: serial as
// scheduled, one vector register of partial results, or two (two
// independent chains, which hides the latency of the adds: a softmax's
// sum of exponentials). It runs after the other rules, so the reduction
// may have been moved under its consumer's loop (compute_at) or
// parallelized over rows already; an unrolled loop over k becomes the
// serial loop over vectors.
type vectorAccumulate struct{}

func init() { Register(vectorAccumulate{}, "cpu") }

func (vectorAccumulate) Name() string { return "vector_accumulate" }
func (vectorAccumulate) Order() int   { return 95 }

func (vectorAccumulate) Apply(*Context, *schedule.Schedule) error { return nil }

func (vectorAccumulate) Postprocess(c *Context, s *schedule.Schedule, f *ir.PrimFunc) (*ir.PrimFunc, []string, error) {
	var trace []string
	var ferr error
	width := c.Target.VectorBytes
	if width <= 0 {
		width = 16
	}
	r := &ir.Rewriter{Stmt: func(st ir.Stmt) ir.Stmt {
		fr, ok := st.(*ir.For)
		if !ok || ferr != nil {
			return st
		}
		br, ok := fr.Body.(*ir.BlockRealize)
		if !ok || br.Block == nil || br.Block.Init == nil || (fr.Kind != ir.ForSerial && fr.Kind != ir.ForUnrolled) {
			return st
		}
		serial := *fr
		serial.Kind = ir.ForSerial
		// The widths that apply: one register, two.
		var outs []ir.Stmt
		for _, w := range []int64{width, 2 * width} {
			out, ok := auto.VectorRow(&serial, w)
			if !ok {
				break
			}
			outs = append(outs, out)
		}
		if len(outs) == 0 {
			return st
		}
		weights := []float64{1, 2, 2}[:len(outs)+1]
		name := br.Block.Name
		// Before this rule existed reductions stayed serial.
		v, err := c.Sampler.ChooseOr(s, fmt.Sprintf("vector_accumulate/%s", name), len(outs)+1, weights, 0)
		if err != nil {
			ferr = err
			return st
		}
		if v == 0 {
			return st
		}
		trace = append(trace, fmt.Sprintf("vector_accumulate(%q, vectors=%d)", name, v))
		return outs[v-1]
	}}
	body := r.RewriteStmt(f.Body)
	if ferr != nil {
		return nil, nil, ferr
	}
	if len(trace) == 0 {
		return f, nil, nil
	}
	return f.WithBody(body), trace, nil
}
