package transform

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestAlterDenseLayout packs the dense layer over w1 (and no other
// matmul: w2's layer, 8 rows × 40 columns, is one tile of 4 rows × all
// five 8-lane vectors, with nothing to pack), then the O2 pipeline lifts the packing into the
// transform-params function; main computes what the legalized input
// computes.
func TestAlterDenseLayout(t *testing.T) {
	in := parseFile(t, filepath.Join("testdata", "alter_dense_layout.py"))
	packed, err := AlterDenseLayout(in, 64)
	check.NoError(t, err)
	text := script.Print(packed)
	golden(t, "alter_dense_layout", text)
	back, err := script.Parse("alter_dense_layout.golden", text)
	check.NoError(t, err)
	check.True(t, ir.StructuralEqual(back, packed), "parses back to the same module")
	check.Equal(t, strings.Count(text, "R.matmul_packed("), 1, "packed layers")
	check.Equal(t, strings.Count(text, "R.matmul("), 4, "layers left")

	out := runVerified(t, packed, pipelines["O2"]...)
	golden(t, "alter_dense_layout_O2", script.Print(out))
	inputs := randomInputs(t, in)
	sameResults(t, runMain(t, out, inputs), runMain(t, runVerified(t, in, "LegalizeOps"), inputs))

	// Narrower vectors, narrower panels: 8 lanes and 16 registers give
	// w1's layer tiles of 4 rows × 16 columns (8 rows would leave room
	// for one vector each).
	narrow, err := AlterDenseLayout(in, 32)
	check.NoError(t, err)
	check.True(t, strings.Contains(script.Print(narrow), "R.Tensor((4, 32, 16)"), "w1 in panels of 16")
}

func TestDenseTileWidth(t *testing.T) {
	for _, c := range []struct{ rows, n, vb, want int64 }{
		{32, 2048, 64, 32}, {32, 128, 64, 32}, {32, 384, 64, 48}, {1, 1000, 64, 40},
		{1, 64, 64, 64}, {32, 128, 32, 16}, {1024, 1024, 32, 16}, {3, 10, 64, 0},
	} {
		check.Equal(t, denseTileWidth(c.rows, c.n, c.vb), c.want, c.rows, "×", c.n, "on", c.vb, "bytes")
	}
}

// TestDenseSites lists the dense layers whose weight can be packed, each
// with the default layout first, the other panel widths the dense rule
// takes, and the weight as it is; AlterDenseLayoutWith packs each layer
// as chosen, and the O2 pipeline's results are the module's as written.
func TestDenseSites(t *testing.T) {
	in := parseFile(t, filepath.Join("testdata", "alter_dense_layout.py"))
	var got []string
	for _, s := range DenseSites(in, 64) {
		got = append(got, s.Key+": "+strings.Join(s.Layouts, " "))
	}
	check.Equal(t, strings.Join(got, "; "), "dense 1x8x32 * 32x64: NK32n NK16n KN; dense 1x8x64 * 64x40: KN NK8n",
		"w3's 16 columns are one vector of 16 lanes: no site")
	got = nil
	for _, s := range DenseSites(in, 32) {
		got = append(got, s.Key+": "+strings.Join(s.Layouts, " "))
	}
	check.Equal(t, strings.Join(got, "; "), "dense 1x8x32 * 32x64: NK16n NK8n KN; dense 1x8x64 * 64x40: KN NK8n; dense 1x8x40 * 40x16: KN NK8n")

	chosen, err := AlterDenseLayoutWith(64, map[string]string{"dense 1x8x32 * 32x64": "KN", "dense 1x8x64 * 64x40": "NK8n"})(in)
	check.NoError(t, err)
	text := script.Print(chosen)
	check.Equal(t, strings.Count(text, "R.matmul_packed("), 1, "packed layers")
	check.True(t, strings.Contains(text, "R.Tensor((5, 64, 8)"), "w2 in panels of 8")
	out := runVerified(t, chosen, pipelines["O2"]...)
	inputs := randomInputs(t, in)
	sameResults(t, runMain(t, out, inputs), runMain(t, runVerified(t, in, "LegalizeOps"), inputs))

	_, err = AlterDenseLayoutWith(64, map[string]string{"dense 1x8x32 * 32x64": "NK24n"})(in)
	check.Error(t, err, `weight layout "NK24n" is not one it can take (NK32n, NK16n, KN)`)
}
