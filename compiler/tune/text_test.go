package tune

import (
	"math/rand/v2"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestCandidatesRoundTripText: candidates print as TVMScript that parses
// back to the same function (what a compiler node receives).
func TestCandidatesRoundTripText(t *testing.T) {
	for _, f := range []*ir.PrimFunc{matmulFunc(t, 64, 64, 32), rowMax(t, 8, 24), reluMatmul(t, 16, 16, 8)} {
		sp, err := NewSpace(f, testTarget)
		check.NoError(t, err)
		rng := rand.New(rand.NewPCG(1, 9))
		for range 30 {
			c, err := sp.Sample(rng)
			check.NoError(t, err)
			mod := ir.NewIRModule().With("k", c.Func.WithAttr(ir.AttrGlobalSymbol, "k"))
			txt := script.Print(mod)
			m2, err := script.Parse("x.py", txt)
			check.NoError(t, err, txt)
			check.True(t, ir.StructuralEqual(m2.PrimFunc("k"), mod.PrimFunc("k")), txt)
		}
	}
}
