package cli

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/tune"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// TestTuneModel tunes the small CNN test model from its .onnx file on the
// in-process fleet: a run interrupted (a Ctrl-C) after a few trials keeps
// every measured record, --resume measures the rest of the budget, and
// kiln build --tuning-db gives each fused kernel its best record (the
// others the default schedule, said per kernel); the artifact computes
// what numpy did. A missing or garbled database is refused, naming it.
func TestTuneModel(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(onnxTestdata, "smallcnn.onnx")
	db := filepath.Join(dir, "tuning.jsonl")

	_, _, err := runApp(t, "tune", model, "--trials", "4", "--db", db)
	check.Error(t, err, `input "x": dim 0 is symbolic ("N")`, "--input-shape")
	src := filepath.Join(dir, "mm.py")
	check.NoError(t, os.WriteFile(src, []byte(tuneMatmulPy), 0o644))
	_, _, err = runApp(t, "tune", src, "--trials", "4", "--db", db, "--input-shape", "x=1x2")
	check.Error(t, err, "--input-shape is for ONNX models")
	_, _, err = runApp(t, "tune", model, "--input-shape", "x=2x3x16x16", "--trials", "4", "--db", db, "--build-jobs", "0")
	check.Error(t, err, "--build-jobs 0: want at least 1")

	out, stderr, runErr := interruptTune(t, db, 3, model, "--input-shape", "x=2x3x16x16", "--trials", "64", "--batch", "4",
		"--db", db, "--seed", "1", "--json")
	check.Error(t, runErr, "interrupted")
	s := decodeTuneSummary(t, out)
	check.True(t, s.Interrupted, s)
	had := countLines(t, db)
	check.Equal(t, s.Trials, had)
	check.True(t, strings.Contains(stderr, "fused_reshape_transpose: runs once per set of weights"), stderr)
	check.True(t, strings.Contains(stderr, "trial 1/64: "), stderr)
	check.True(t, strings.Contains(stderr, "kernels to tune: fused_"), stderr)
	first := readFile(t, db)

	// Every kernel gets a first round before any gets a second, and each
	// line names the kernel's own trial and the model estimate.
	total := had + 6
	out2, errOut2, err := runApp(t, "tune", model, "--input-shape", "x=2x3x16x16", "--trials", fmt.Sprint(total), "--batch", "2",
		"--db", db, "--seed", "2", "--resume", "--json")
	check.NoError(t, err, errOut2)
	check.True(t, strings.Contains(errOut2, fmt.Sprintf("resuming: %d records in %s, 6 trials to go", had, db)), errOut2)
	check.True(t, strings.Contains(errOut2, "its trial 1; model "), errOut2)
	s = decodeTuneSummary(t, out2)
	check.Equal(t, s.Trials, 6)
	check.True(t, strings.HasPrefix(readFile(t, db), first), "the interrupted run's records changed")
	// Besides the trials, a head-to-head of default and best for each
	// kernel whose best was not the default (two records of one pair).
	pairs := strings.Count(readFile(t, db), `"pair":`)
	// And a layout head-to-head for each convolution whose cheapest
	// kernel layout was not its default (a record per kernel of each).
	layoutPairs := strings.Count(readFile(t, db), `"layout_pair":`)
	check.Equal(t, countLines(t, db)-pairs-layoutPairs, total)
	h2h := 0
	for _, tk := range s.Tasks {
		if tk.HeadToHead != nil {
			h2h++
		}
	}
	check.Equal(t, pairs, 2*h2h)
	check.True(t, len(s.Tasks) >= 5, s.Tasks)
	timed := 0
	for _, tk := range s.Tasks {
		if tk.Best > 0 {
			timed++
			check.True(t, tk.Default == 0 || tk.Best <= tk.Default, tk.Name, "best", tk.Best, "default", tk.Default)
		}
	}
	check.True(t, timed >= 2, s.Tasks)
	check.True(t, s.Model > 0 && s.Model <= s.ModelDefault, s.Model, s.ModelDefault)

	// The build applies the records, kernel by kernel.
	art := filepath.Join(dir, "smallcnn.kiln")
	_, errOut3, err := runApp(t, "build", model, "--input-shape", "x=2x3x16x16", "--tuning-db", db, "-o", art, "--no-cache")
	check.NoError(t, err, errOut3)
	layouts := 0
	// A build that took another kernel layout than the default for a
	// convolution (it says so) lowers the model to other kernels, whose
	// names may differ from the default lowering's.
	renamed := strings.Contains(errOut3, ": kernel layout ")
	for _, tk := range s.Tasks {
		if tk.Site != "" && !tk.SiteDefault {
			// A kernel of another layout of a convolution than the
			// default: the build has it only when its records make that
			// layout the cheapest.
			layouts++
			continue
		}
		if renamed {
			continue
		}
		line := scheduleLine(errOut3, tk.Name)
		if tk.Best > 0 {
			check.True(t, strings.Contains(line, "the best record in "+db), tk.Name, errOut3)
		} else {
			// No trial reached it (a loaded machine measures fewer in
			// the run): its default schedule, or none where no default
			// rule takes it.
			check.True(t, strings.Contains(line, "no record in "+db) && (strings.Contains(line, "default schedule") || strings.HasSuffix(line, ": unscheduled")), tk.Name, errOut3)
		}
	}
	check.True(t, layouts > 0, "the convolutions' other kernel layouts are tasks too", s.Tasks)
	check.True(t, len(s.Layouts) > 0, "the summary says which layout each convolution takes")
	for _, l := range s.Layouts {
		check.True(t, l.Layout != "" && l.DefaultLayout != "" && l.Seconds > 0 && l.Seconds <= l.DefaultSeconds, l)
	}
	built := 0
	for _, tk := range s.Tasks {
		if tk.Best > 0 && (tk.Site == "" || tk.SiteDefault) {
			built++
		}
	}
	check.True(t, strings.Count(errOut3, "the best record in "+db) >= built, errOut3)
	res := filepath.Join(dir, "out")
	_, _, err = runApp(t, "run", art, "--input", "x="+filepath.Join(onnxTestdata, "smallcnn_x.npy"), "--output", res)
	check.NoError(t, err)
	wantArr, err := ndarray.LoadNPY(filepath.Join(onnxTestdata, "smallcnn_y.npy"))
	check.NoError(t, err)
	want, err := ndarray.ToSlice[float32](wantArr)
	check.NoError(t, err)
	gotArr, err := ndarray.LoadNPY(filepath.Join(res, "output.npy"))
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](gotArr)
	check.NoError(t, err)
	for i := range want {
		if math.Abs(float64(got[i]-want[i])) > 1e-4*math.Max(1, math.Abs(float64(want[i]))) {
			t.Fatalf("output %d = %g, want %g", i, got[i], want[i])
		}
	}

	// A database that is not there, or is another kind of file.
	_, _, err = runApp(t, "build", model, "--input-shape", "x=2x3x16x16", "--tuning-db", filepath.Join(dir, "none.jsonl"), "-o", art)
	check.Error(t, err, "--tuning-db", "none.jsonl", "no such file")
	_, _, err = runApp(t, "build", model, "--input-shape", "x=2x3x16x16", "--tuning-db", model, "-o", art)
	check.ErrorIs(t, err, tune.ErrNotDatabase)
	check.Error(t, err, "smallcnn.onnx:1 is not a JSON object")
}
