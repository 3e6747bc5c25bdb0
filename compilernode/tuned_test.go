package compilernode

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestTunedBundle unpacks what TunedBundle packs and refuses a bundle
// that is not one, or whose database is garbled, naming what was wrong.
func TestTunedBundle(t *testing.T) {
	b, err := TunedBundle([]byte("model bytes"), []byte("{}\n"))
	check.NoError(t, err)
	model, db, err := openTunedBundle(b)
	check.NoError(t, err)
	check.Equal(t, string(model), "model bytes")
	check.Equal(t, string(db), "{}\n")

	_, _, err = openTunedBundle([]byte("not a zip"))
	check.Error(t, err, "tuned bundle")

	target, err := compiler.ParseTarget("cpu")
	check.NoError(t, err)
	_, err = tunedSchedule([]byte("not json\n"), target, "")
	check.Error(t, err, "tuning database", "tuning.jsonl:1")
	_, err = tunedSchedule(nil, target, "n=x")
	check.Error(t, err, "build option shape")
}
