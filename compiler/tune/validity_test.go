package tune

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// validityRunner is fakeRunner with a verdict on each valid timing.
type validityRunner struct{ fakeRunner }

func (r *validityRunner) Stream(ctx context.Context, task *Task, cands []*Candidate, each func(int, Result)) error {
	return r.fakeRunner.Stream(ctx, task, cands, func(i int, res Result) {
		if res.Error == "" {
			res.Validity = Validity{Verdict: "noisy", Noise: "median's 95% CI ±4.1% > ±2%", CV: 0.03, Remeasured: true}
		}
		each(i, res)
	})
}

// TestRecordValidity: the runner's verdict on each timing is stored with
// its record and read back; records without one still read.
func TestRecordValidity(t *testing.T) {
	task, err := NewTask("mm", matmulFunc(t, 16, 16, 16), 1, testTarget)
	check.NoError(t, err)
	path := filepath.Join(t.TempDir(), "db.jsonl")
	db, _, err := OpenDatabase(path, "cpu")
	check.NoError(t, err)
	_, err = Tune(context.Background(), []*Task{task}, db, &validityRunner{fakeRunner{runs: map[string]int{}}}, Options{Trials: 8, Batch: 4, Seed: 1})
	check.NoError(t, err)
	check.NoError(t, db.Close())

	db, notes, err := OpenDatabase(path, "cpu")
	check.NoError(t, err)
	check.Equal(t, len(notes), 0, notes)
	valid := 0
	for _, r := range db.Records(task.Workload.Hash) {
		if !r.Valid() {
			check.Equal(t, r.Verdict, "", "no verdict on a failed candidate")
			continue
		}
		valid++
		check.Equal(t, r.Validity, Validity{Verdict: "noisy", Noise: "median's 95% CI ±4.1% > ±2%", CV: 0.03, Remeasured: true})
		b, err := json.Marshal(r)
		check.NoError(t, err)
		check.True(t, strings.Contains(string(b), `"verdict":"noisy","noise":"median's 95% CI ±4.1% \u003e ±2%","cv":0.03,"remeasured":true`), string(b))
	}
	check.True(t, valid > 0, "some candidates were valid")

	old := NewDatabase("cpu")
	_, err = old.Read("old.jsonl", strings.NewReader(`{"workload":{"hash":"00ab"},"target":"cpu","decisions":[],"times":[0.5]}`))
	check.NoError(t, err)
	check.Equal(t, old.Records("00ab")[0].Validity, Validity{})
}
