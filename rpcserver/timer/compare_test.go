package timer

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// samples returns n figures around center with a relative spread of
// ±spread, from a fixed seed.
func samples(seed uint64, n int, center, spread float64) []float64 {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([]float64, n)
	for i := range out {
		out[i] = center * (1 + spread*(2*rng.Float64()-1))
	}
	return out
}

func TestMannWhitneyExact(t *testing.T) {
	// Complete separation of 5 and 5: 2 of the C(10,5) = 252 orderings
	// are as extreme.
	u, p, exact := MannWhitney([]float64{1, 2, 3, 4, 5}, []float64{6, 7, 8, 9, 10})
	check.True(t, exact)
	check.Equal(t, u, 0.0)
	check.True(t, math.Abs(p-2.0/252) < 1e-12, p)
	u, p, _ = MannWhitney([]float64{6, 7, 8, 9, 10}, []float64{1, 2, 3, 4, 5})
	check.Equal(t, u, 25.0)
	check.True(t, math.Abs(p-2.0/252) < 1e-12, p)
	// 3 and 3 interleaved a b a b a b: U = 3 of 9, P(U ≤ 3) = 7/20.
	_, p, _ = MannWhitney([]float64{1, 3, 5}, []float64{2, 4, 6})
	check.True(t, math.Abs(p-0.7) < 1e-12, p)
}

// permutationP is the two-sided p-value of a's U by enumerating every
// split of the pooled figures: the exact test, ties included.
func permutationP(a, b []float64) float64 {
	pool := append(append([]float64{}, a...), b...)
	n1, n := len(a), len(pool)
	mu := float64(n1*len(b)) / 2
	uOf := func(mask int) float64 {
		var u float64
		for i := range n {
			if mask&(1<<i) == 0 {
				continue
			}
			for j := range n {
				if mask&(1<<j) != 0 {
					continue
				}
				switch {
				case pool[i] > pool[j]:
					u++
				case pool[i] == pool[j]:
					u += 0.5
				}
			}
		}
		return u
	}
	obs := math.Abs(uOf(1<<n1-1) - mu)
	var hit, total float64
	for mask := range 1 << n {
		if popcount(mask) != n1 {
			continue
		}
		total++
		if math.Abs(uOf(mask)-mu) >= obs-1e-9 {
			hit++
		}
	}
	return hit / total
}

func popcount(x int) int {
	c := 0
	for ; x != 0; x &= x - 1 {
		c++
	}
	return c
}

func TestMannWhitneyTies(t *testing.T) {
	a := []float64{1, 2, 2, 3, 3, 4, 5}
	b := []float64{3, 3, 4, 5, 5, 6, 7}
	u, p, exact := MannWhitney(a, b)
	check.True(t, !exact, "ties: normal approximation")
	check.Equal(t, u, 8.5) // 5 pairs with a larger, 7 tied
	want := permutationP(a, b)
	check.True(t, math.Abs(p-want) < 0.02, "normal approximation", p, "permutation test", want)
	_, p, _ = MannWhitney([]float64{2, 2, 2}, []float64{2, 2, 2, 2})
	check.Equal(t, p, 1.0)
}

func TestMannWhitneyApproximation(t *testing.T) {
	// Past exactLimit the normal approximation is used; at the limit both
	// are computed and agree.
	a, b := samples(1, 20, 1e-3, 0.05), samples(2, 20, 1.03e-3, 0.05)
	u, pExact, exact := MannWhitney(a, b)
	check.True(t, exact)
	N := 40.0
	z := (math.Abs(u-200) - 0.5) / math.Sqrt(400.0/12*(N+1))
	pNormal := math.Erfc(z / math.Sqrt2)
	check.True(t, math.Abs(pExact-pNormal) < 0.01, pExact, pNormal)
	_, _, exact = MannWhitney(samples(1, 21, 1, 0.1), samples(2, 20, 1, 0.1))
	check.True(t, !exact)
}

func TestCompare(t *testing.T) {
	base := samples(1, 30, 1e-3, 0.02)
	for _, tc := range []struct {
		name      string
		b         []float64
		threshold float64
		verdict   string
		ratio     float64 // the true ratio, inside the interval
	}{
		{"10% slower", samples(2, 30, 1.1e-3, 0.02), 0.02, Slower, 1.1},
		{"10% faster", samples(3, 30, 0.9e-3, 0.02), 0.02, Faster, 0.9},
		{"same distribution", samples(4, 30, 1e-3, 0.02), 0.02, NoDifference, 1},
		{"slower, within the threshold", samples(5, 30, 1.1e-3, 0.02), 0.15, NoDifference, 1.1},
		{"identical figures", base, 0.02, NoDifference, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Compare(base, tc.b, tc.threshold)
			check.Equal(t, c.Verdict, tc.verdict, c)
			check.True(t, c.RatioLow <= c.Ratio && c.Ratio <= c.RatioHigh, c)
			check.True(t, c.RatioLow <= tc.ratio*1.01 && tc.ratio*0.99 <= c.RatioHigh, "true ratio outside the interval:", c)
			if tc.verdict != NoDifference {
				check.True(t, c.P < 1e-6 && (c.RatioHigh < 1 || c.RatioLow > 1), c)
			}
		})
	}
	// The interval comes from a fixed seed: the same at every run.
	check.Equal(t, Compare(base, samples(2, 30, 1.1e-3, 0.02), 0.02), Compare(base, samples(2, 30, 1.1e-3, 0.02), 0.02))
	// Too few figures for a difference to be significant.
	c := Compare([]float64{1}, []float64{2}, 0.02)
	check.Equal(t, c.Verdict, NoDifference)
	check.Equal(t, c.Ratio, 2.0)
}
