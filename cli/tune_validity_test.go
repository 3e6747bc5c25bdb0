package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/tune"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestTuneRecordsVerdict: the tuner records the time evaluator's verdict
// with each candidate, and a noisy timing (3 repeats are too few for an
// interval) is timed once more before it is ranked (no cutoff: every
// candidate is timed in full).
func TestTuneRecordsVerdict(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "mm.py")
	check.NoError(t, os.WriteFile(src, []byte(tuneMatmulPy), 0o644))
	db := filepath.Join(dir, "tuning.jsonl")
	_, errOut, err := runApp(t, "tune", src, "--trials", "2", "--batch", "2", "--db", db, "--devices", "1", "--seed", "1", "--repeat", "3", "--cutoff", "0", "--json")
	check.NoError(t, err, errOut)
	valid := 0
	for _, line := range strings.Split(strings.TrimSpace(readFile(t, db)), "\n") {
		var r tune.Record
		check.NoError(t, json.Unmarshal([]byte(line), &r), line)
		if !r.Valid() {
			continue
		}
		valid++
		check.True(t, r.Verdict == "stable" || r.Verdict == "noisy" && r.Noise != "", line)
		check.True(t, r.Remeasured, "a timing of 3 repeats is noisy and timed again:", line)
		check.Equal(t, len(r.Times), 6, line)
		check.True(t, r.CV >= 0, line)
	}
	check.True(t, valid > 0, "no valid record in", readFile(t, db))
}
