package timer

import (
	"math"
	"math/rand/v2"
	"slices"
)

// Verdicts of a Comparison.
const (
	Faster       = "faster"
	Slower       = "slower"
	NoDifference = "no difference"
)

// Alpha is the significance level of a comparison's test.
const Alpha = 0.05

// bootstrapResamples is how many resamples the ratio's interval is
// computed from; bootstrapSeed makes it the same at every run.
const (
	bootstrapResamples = 2000
	bootstrapSeed      = 0x6b696c6e
)

// exactLimit is the largest n1·n2 for which the Mann–Whitney p-value is
// computed exactly (when there are no ties).
const exactLimit = 400

// Comparison compares the timings of a baseline (A) and a candidate (B).
type Comparison struct {
	NA, NB int
	// MedianA and MedianB are the samples' medians; Ratio is
	// MedianB / MedianA (above 1: B is slower).
	MedianA, MedianB float64
	Ratio            float64
	// RatioLow and RatioHigh bound the ratio's 95% confidence interval
	// (a percentile bootstrap with a fixed seed).
	RatioLow, RatioHigh float64
	// U is the Mann–Whitney statistic of A (the pairs in which A's
	// figure is the larger, ties counting half) and P its two-sided
	// p-value; Exact says it came from the exact distribution rather
	// than the normal approximation (with tie correction).
	U     float64
	P     float64
	Exact bool
	// Verdict is Slower or Faster when P < Alpha and the ratio is beyond
	// the threshold (1 ± threshold), NoDifference otherwise.
	Verdict string
}

// Compare tests whether b's timings differ from a's, calling a difference
// smaller than threshold (0.02 for 2%) no difference.
func Compare(a, b []float64, threshold float64) Comparison {
	c := Comparison{NA: len(a), NB: len(b), Verdict: NoDifference, P: 1, Ratio: math.NaN(), RatioLow: math.NaN(), RatioHigh: math.NaN()}
	if len(a) == 0 || len(b) == 0 {
		return c
	}
	c.MedianA, c.MedianB = median(a), median(b)
	if c.MedianA > 0 {
		c.Ratio = c.MedianB / c.MedianA
		c.RatioLow, c.RatioHigh = ratioCI(a, b)
	}
	c.U, c.P, c.Exact = MannWhitney(a, b)
	if c.P < Alpha && !math.IsNaN(c.Ratio) {
		switch {
		case c.Ratio > 1+threshold:
			c.Verdict = Slower
		case c.Ratio < 1-threshold:
			c.Verdict = Faster
		}
	}
	return c
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// ratioCI is the percentile bootstrap 95% interval of median(b)/median(a).
func ratioCI(a, b []float64) (lo, hi float64) {
	rng := rand.New(rand.NewPCG(bootstrapSeed, uint64(len(a))<<32|uint64(len(b))))
	ra, rb := make([]float64, len(a)), make([]float64, len(b))
	ratios := make([]float64, 0, bootstrapResamples)
	for range bootstrapResamples {
		for i := range ra {
			ra[i] = a[rng.IntN(len(a))]
		}
		for i := range rb {
			rb[i] = b[rng.IntN(len(b))]
		}
		if ma := median(ra); ma > 0 {
			ratios = append(ratios, median(rb)/ma)
		}
	}
	if len(ratios) == 0 {
		return math.NaN(), math.NaN()
	}
	slices.Sort(ratios)
	at := func(q float64) float64 { return ratios[min(len(ratios)-1, int(q*float64(len(ratios))))] }
	return at(0.025), at(0.975)
}

// MannWhitney returns the Mann–Whitney U statistic of a against b (the
// pairs (x in a, y in b) with x > y, ties counting half) and its two-sided
// p-value: exact when there are no ties and len(a)·len(b) ≤ 400, else by
// the normal approximation with tie and continuity corrections.
func MannWhitney(a, b []float64) (u, p float64, exact bool) {
	n1, n2 := len(a), len(b)
	if n1 == 0 || n2 == 0 {
		return 0, 1, false
	}
	type obs struct {
		v     float64
		fromA bool
	}
	all := make([]obs, 0, n1+n2)
	for _, x := range a {
		all = append(all, obs{x, true})
	}
	for _, y := range b {
		all = append(all, obs{y, false})
	}
	slices.SortFunc(all, func(x, y obs) int {
		switch {
		case x.v < y.v:
			return -1
		case x.v > y.v:
			return 1
		}
		return 0
	})
	// Ranks from 1, ties given their mean rank; tieSum is Σ(t³ − t).
	var rankA, tieSum float64
	for i := 0; i < len(all); {
		j := i
		for j < len(all) && all[j].v == all[i].v {
			j++
		}
		r := float64(i+j+1) / 2 // mean of ranks i+1 … j
		for k := i; k < j; k++ {
			if all[k].fromA {
				rankA += r
			}
		}
		if t := float64(j - i); t > 1 {
			tieSum += t*t*t - t
		}
		i = j
	}
	u = rankA - float64(n1*(n1+1))/2
	if tieSum == 0 && n1*n2 <= exactLimit {
		return u, exactP(n1, n2, u), true
	}
	N := float64(n1 + n2)
	mu := float64(n1*n2) / 2
	sigma2 := float64(n1*n2) / 12 * (N + 1 - tieSum/(N*(N-1)))
	if sigma2 <= 0 {
		return u, 1, false // every figure equal
	}
	z := math.Max(math.Abs(u-mu)-0.5, 0) / math.Sqrt(sigma2)
	return u, math.Min(1, math.Erfc(z/math.Sqrt2)), false
}

// exactP is the two-sided p-value of U = u for samples of n1 and n2
// without ties: twice the smaller tail of U's exact distribution.
func exactP(n1, n2 int, u float64) float64 {
	// counts[k] is the number of orderings of n1 a's and n2 b's with
	// U = k, built up one sample at a time: f(m, n) = f(m−1, n) shifted
	// by n (the new a exceeds every b) + f(m, n−1).
	maxU := n1 * n2
	prev := make([][]float64, n2+1) // f(m−1, ·)
	for n := range prev {
		prev[n] = []float64{1} // f(0, n): U is 0
	}
	for m := 1; m <= n1; m++ {
		cur := make([][]float64, n2+1)
		cur[0] = []float64{1} // f(m, 0)
		for n := 1; n <= n2; n++ {
			f := make([]float64, m*n+1)
			for k, c := range prev[n] {
				f[k+n] += c
			}
			for k, c := range cur[n-1] {
				f[k] += c
			}
			cur[n] = f
		}
		prev = cur
	}
	counts := prev[n2]
	var total, low, high float64
	k := int(math.Round(u))
	for i := 0; i <= maxU; i++ {
		c := counts[i]
		total += c
		if i <= k {
			low += c
		}
		if i >= k {
			high += c
		}
	}
	return math.Min(1, 2*math.Min(low, high)/total)
}
