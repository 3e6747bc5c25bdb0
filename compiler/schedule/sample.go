package schedule

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// SamplePerfectTile draws n factors, outermost first, whose product is the
// constant extent of loop l and whose innermost factor is at most
// maxInnermost (TVM's sch.sample_perfect_tile). The draw is recorded in
// the trace with its decision, so the trace replays to the same factors;
// passing a non-nil decision replays it instead of drawing, after checking
// it still fits the loop.
func (s *Schedule) SamplePerfectTile(r *rand.Rand, l LoopRV, n int, maxInnermost int64, decision []int64) ([]int64, error) {
	out, err := s.samplePerfectTile(r, l, n, maxInnermost, decision)
	if err != nil {
		return nil, fmt.Errorf("sample_perfect_tile: %w", err)
	}
	s.record("sch.sample_perfect_tile(loop=%s, n=%d, max_innermost_factor=%d, decision=%s)", s.ln(l), n, maxInnermost, pyInts(out, false))
	return out, nil
}

func (s *Schedule) samplePerfectTile(r *rand.Rand, l LoopRV, n int, maxInnermost int64, decision []int64) ([]int64, error) {
	st, err := s.loop("", l)
	if err != nil {
		return nil, err
	}
	f := st.loop()
	ext, ok := ir.IsConstInt(f.Extent)
	if !ok {
		return nil, fmt.Errorf("loop %q has the symbolic extent %s", f.Var.Name, f.Extent)
	}
	if n < 1 {
		return nil, fmt.Errorf("loop %q: n is %d, want at least 1", f.Var.Name, n)
	}
	if maxInnermost < 1 {
		return nil, fmt.Errorf("loop %q: max_innermost_factor is %d, want at least 1", f.Var.Name, maxInnermost)
	}
	if decision != nil {
		if len(decision) != n {
			return nil, fmt.Errorf("loop %q: decision %v has %d factors, want %d", f.Var.Name, decision, len(decision), n)
		}
		prod := int64(1)
		for _, x := range decision {
			if x < 1 {
				return nil, fmt.Errorf("loop %q: decision %v has a factor below 1", f.Var.Name, decision)
			}
			prod *= x
		}
		if prod != ext || decision[n-1] > maxInnermost {
			return nil, fmt.Errorf("loop %q: decision %v does not tile extent %d with innermost factor at most %d", f.Var.Name, decision, ext, maxInnermost)
		}
		return append([]int64(nil), decision...), nil
	}
	if r == nil {
		return nil, fmt.Errorf("loop %q: no random source and no decision", f.Var.Name)
	}
	out := make([]int64, n)
	rest := ext
	// Innermost first: a divisor of the extent no larger than maxInnermost.
	for i := n - 1; i > 0; i-- {
		var divs []int64
		for d := int64(1); d <= rest; d++ {
			if rest%d == 0 && (i != n-1 || d <= maxInnermost) {
				divs = append(divs, d)
			}
		}
		out[i] = divs[r.IntN(len(divs))]
		rest /= out[i]
	}
	out[0] = rest
	if n == 1 && out[0] > maxInnermost {
		return nil, fmt.Errorf("loop %q: extent %d exceeds max_innermost_factor %d with n=1", f.Var.Name, ext, maxInnermost)
	}
	return out, nil
}

// SampleCategorical draws one of candidates with the given probabilities
// (TVM's sch.sample_categorical) and records the drawn index as the
// decision; a decision of 0 or more replays that index instead of drawing.
func (s *Schedule) SampleCategorical(r *rand.Rand, candidates []int64, probs []float64, decision int) (int64, error) {
	if len(candidates) == 0 || len(candidates) != len(probs) {
		return 0, fmt.Errorf("sample_categorical: %d candidates and %d probabilities, want the same positive number", len(candidates), len(probs))
	}
	total := 0.0
	for i, p := range probs {
		if p < 0 {
			return 0, fmt.Errorf("sample_categorical: probability %d is %g, want at least 0", i, p)
		}
		total += p
	}
	if total <= 0 {
		return 0, fmt.Errorf("sample_categorical: probabilities %v sum to %g, want more than 0", probs, total)
	}
	switch {
	case decision >= len(candidates):
		return 0, fmt.Errorf("sample_categorical: decision %d is out of range for %d candidates", decision, len(candidates))
	case decision < 0 && r == nil:
		return 0, fmt.Errorf("sample_categorical: no random source and no decision")
	case decision < 0:
		x := r.Float64() * total
		decision = len(candidates) - 1
		for i, p := range probs {
			if x < p {
				decision = i
				break
			}
			x -= p
		}
	}
	cs := make([]string, len(candidates))
	for i, c := range candidates {
		cs[i] = fmt.Sprint(c)
	}
	ps := make([]string, len(probs))
	for i, p := range probs {
		ps[i] = fmt.Sprint(p)
	}
	s.record("sch.sample_categorical(candidates=[%s], probs=[%s], decision=%d)", strings.Join(cs, ", "), strings.Join(ps, ", "), decision)
	return candidates[decision], nil
}
