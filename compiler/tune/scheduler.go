package tune

import (
	"math"
	"math/rand/v2"
	"sort"
)

// The task scheduler decides which task the next batch of candidates
// goes to, as MetaSchedule's gradient-based task scheduler does
// (task_scheduler/gradient_based.cc): every task first gets one round
// (its first batch, which measures its default schedule), then each
// batch goes to the task whose weighted latency is expected to fall the
// most from one more round. For a task of weight w (calls per run of the
// program) whose best time after its rounds 1…n was b₁…bₙ, that gradient
// is
//
//	w · (α · (bₙ₋w − bₙ)/W + (1 − α) · bₙ/n)
//
// the first term the recent improvement per round over a window of W
// rounds (0 before there are W+1), the second the optimistic bet that
// another round gains as much as the average one did. A task with no
// valid measurement yet goes last; ties are broken at random.
//
// A kernel of one layout of a convolution site (Task.Site) lowers the
// model's time only as far as it makes its layout the site's cheapest:
// its gradient is how far one round's expected gain g takes its layout's
// cost (the sum of weight × best over the layout's kernels) below the
// site's cheapest layout, max(0, cheapest − (cost − g)), which is g for
// a kernel of the cheapest layout.
const (
	gradientAlpha  = 0.2
	gradientWindow = 3
)

// pick returns the task the next batch goes to, nil when every space is
// exhausted.
func pick(states []*taskState, rng *rand.Rand) *taskState {
	var alive []*taskState
	for _, st := range states {
		if !st.exhausted {
			alive = append(alive, st)
		}
	}
	if len(alive) == 0 {
		return nil
	}
	// The first round of each task, heaviest arithmetic first (its time
	// is not known yet), so a budget smaller than the number of tasks
	// goes where most of the work is.
	var fresh []*taskState
	for _, st := range alive {
		if st.launched == 0 {
			fresh = append(fresh, st)
		}
	}
	if len(fresh) > 0 {
		sort.SliceStable(fresh, func(i, j int) bool {
			return float64(fresh[i].task.Weight)*fresh[i].task.Flops > float64(fresh[j].task.Weight)*fresh[j].task.Flops
		})
		return fresh[0]
	}
	cost, cheapest := layoutCosts(states)
	best, hi, lo := alive[0], math.Inf(-1), math.Inf(1)
	for _, st := range alive {
		g := st.gradient()
		if site := st.task.Site; site != "" && !math.IsInf(g, -1) {
			if c, lo := cost[[2]string{site, st.task.Layout}], cheapest[site]; !math.IsInf(lo, 1) && !math.IsInf(c, 1) {
				g = math.Max(0, lo-(c-g))
			}
		}
		if g > hi {
			best, hi = st, g
		}
		lo = math.Min(lo, g)
	}
	if hi == lo {
		return alive[rng.IntN(len(alive))]
	}
	return best
}

// layoutCosts is, for each layout of each convolution site among states'
// tasks, the sum of weight × best time over its kernels (+Inf while one
// has no valid time), and each site's cheapest.
func layoutCosts(states []*taskState) (cost map[[2]string]float64, cheapest map[string]float64) {
	cost, cheapest = map[[2]string]float64{}, map[string]float64{}
	for _, st := range states {
		if st.task.Site != "" {
			cost[[2]string{st.task.Site, st.task.Layout}] += float64(st.task.Weight) * st.best
		}
	}
	for k, c := range cost {
		if lo, ok := cheapest[k[0]]; !ok || c < lo {
			cheapest[k[0]] = c
		}
	}
	return cost, cheapest
}

// gradient is the expected fall of the task's weighted latency from one
// more round (see pick); -Inf for a task with no valid measurement.
func (st *taskState) gradient() float64 {
	if math.IsInf(st.best, 1) {
		return math.Inf(-1)
	}
	n := max(len(st.rounds), 1)
	g1 := 0.0
	if len(st.rounds) >= 1+gradientWindow {
		g1 = (st.rounds[len(st.rounds)-1-gradientWindow] - st.best) / gradientWindow
	}
	g2 := st.best / float64(n)
	return float64(st.task.Weight) * (gradientAlpha*g1 + (1-gradientAlpha)*g2)
}

// endRound notes the end of one of the task's batches: its best time
// after the round, when it has one.
func (st *taskState) endRound() {
	if !math.IsInf(st.best, 1) {
		st.rounds = append(st.rounds, st.best)
	}
}
