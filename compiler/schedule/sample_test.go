package schedule

import (
	"math/rand/v2"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"

	"github.com/kiln-ml/kiln/internal/check"
)

func TestSamplePerfectTileReplays(t *testing.T) {
	for seed := uint64(0); seed < 20; seed++ {
		s := must[*Schedule](t)(New(matmul(48, 16, 12)))
		ls := loopsOf(t, s, "C")
		got := must[[]int64](t)(s.SamplePerfectTile(rand.New(rand.NewPCG(seed, 1)), ls[0], 3, 4, nil))
		prod := int64(1)
		for _, f := range got {
			prod *= f
		}
		check.Equal(t, prod, int64(48), "product of", got)
		check.True(t, got[2] <= 4, "innermost factor of", got)
		must[[]LoopRV](t)(s.Split(ls[0], got...))

		r := must[*Schedule](t)(New(matmul(48, 16, 12)))
		rl := loopsOf(t, r, "C")
		again := must[[]int64](t)(r.SamplePerfectTile(nil, rl[0], 3, 4, got))
		must[[]LoopRV](t)(r.Split(rl[0], again...))
		check.Equal(t, r.Trace(), s.Trace(), "seed", seed)
		check.True(t, ir.StructuralEqual(r.Func(), s.Func()), "replayed function differs, seed", seed)
	}
}

func TestSamplePerfectTileRejectsBadDecision(t *testing.T) {
	s := must[*Schedule](t)(New(matmul(48, 16, 12)))
	ls := loopsOf(t, s, "C")
	before := len(s.Trace())
	_, err := s.SamplePerfectTile(nil, ls[0], 2, 4, []int64{6, 8})
	check.Error(t, err, `sample_perfect_tile: loop "i": decision [6 8] does not tile extent 48`)
	_, err = s.SamplePerfectTile(nil, ls[0], 2, 4, []int64{48})
	check.Error(t, err, "has 1 factors, want 2")
	_, err = s.SamplePerfectTile(nil, ls[0], 2, 4, nil)
	check.Error(t, err, "no random source")
	check.Equal(t, len(s.Trace()), before, "failed samples are not recorded")
}

func TestSampleCategorical(t *testing.T) {
	s := must[*Schedule](t)(New(matmul(4, 4, 4)))
	r := rand.New(rand.NewPCG(7, 7))
	seen := map[int64]int{}
	for range 200 {
		seen[must[int64](t)(s.SampleCategorical(r, []int64{0, 16, 64}, []float64{0, 1, 3}, -1))]++
	}
	check.Equal(t, seen[0], 0, "a candidate of probability 0 was drawn")
	check.True(t, seen[64] > seen[16] && seen[16] > 0, "draws", seen)
	check.Equal(t, must[int64](t)(s.SampleCategorical(nil, []int64{0, 16, 64}, []float64{0, 1, 3}, 1)), int64(16))
	tr := s.Trace()
	check.Equal(t, tr[len(tr)-1], "sch.sample_categorical(candidates=[0, 16, 64], probs=[0, 1, 3], decision=1)")
	_, err := s.SampleCategorical(nil, []int64{1}, []float64{1, 2}, -1)
	check.Error(t, err, "1 candidates and 2 probabilities")
	_, err = s.SampleCategorical(nil, []int64{1, 2}, []float64{1, 2}, 2)
	check.Error(t, err, "decision 2 is out of range")
}
