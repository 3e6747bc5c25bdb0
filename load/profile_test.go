package load

import (
	"math"
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/packedfunc"
)

// TestProfileSamples: a profile keeps each inference's whole time and
// each kernel's time within it (the sum of its calls there, which lies
// inside the inference and adds up to the kernel's mean), for at most
// MaxProfileSamples inferences, and the machine's state it ran in.
func TestProfileSamples(t *testing.T) {
	m, x := loadSmallCNN(t)
	const rounds = 7
	p, err := m.Profile("main", rounds, packedfunc.Array(x))
	check.NoError(t, err)
	check.Equal(t, len(p.ModelSamples), rounds)
	check.True(t, p.Machine != nil && p.Machine.CPUs > 0 && slices.Contains(p.Machine.Unread, "other sessions"), p.Machine)
	within := make([]float64, rounds)
	for _, k := range p.Kernels {
		check.Equal(t, len(k.Samples), rounds, k.Name)
		var sum float64
		for i, s := range k.Samples {
			check.True(t, s > 0, k.Name, "not timed in inference", i, k.Samples)
			within[i] += s
			sum += s
		}
		check.True(t, math.Abs(sum/rounds-k.MeanSeconds) <= 1e-9*k.MeanSeconds, k.Name, "samples sum to", sum, "mean", k.MeanSeconds)
	}
	for i, s := range p.ModelSamples {
		check.True(t, within[i] > 0 && within[i] <= s, "inference", i, "took", s, "its kernels", within[i])
	}

	p, err = m.Profile("main", MaxProfileSamples+3, packedfunc.Array(x))
	check.NoError(t, err)
	check.Equal(t, p.Rounds, MaxProfileSamples+3)
	check.Equal(t, len(p.ModelSamples), MaxProfileSamples)
	for _, k := range p.Kernels {
		check.Equal(t, len(k.Samples), MaxProfileSamples, k.Name)
	}
}
