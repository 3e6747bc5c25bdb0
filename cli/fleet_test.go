package cli

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

func TestDemo(t *testing.T) {
	out, errOut, err := runApp(t, "demo", "--size", "24", "--tune-size", "24", "--tune-trials", "4")
	check.NoError(t, err, errOut)
	// Not a terminal: the steps are listed, no spinner is drawn.
	check.True(t, strings.Contains(errOut, "build (queued): done in") && !strings.ContainsAny(errOut, "\r⠋⠙"),
		"demo progress off a terminal:", errOut)
	for _, want := range []string{"build (queued)", "succeeded", "max relative error", "GFLOPS", "tuned", "faster; records in tuning.jsonl"} {
		check.True(t, strings.Contains(out, want), "demo output lacks", want, "in", out)
	}
}

// TestRemoteCommands runs build, run, bench and query against an
// in-process fleet, as a user with a token file would.
func TestRemoteCommands(t *testing.T) {
	dir := t.TempDir()
	fl, tokFile := testFleet(t, dir, "tok123")
	addr := fl.tracker.Addr()

	art := filepath.Join(dir, "vadd.kiln")
	_, errOut, err := runApp(t, "build", "testdata/vadd.py", "--tracker", addr, "--token-file", tokFile, "-o", art)
	check.NoError(t, err)
	check.True(t, strings.Contains(errOut, "succeeded"), "build progress:", errOut)
	// Not a terminal: a line per step of the job, with the time since it
	// was submitted.
	for _, re := range []string{`job \S+ queued at \S+`, `job \S+ claimed by compiler node \S+`, `job \S+: succeeded on \S+.*`, `download the artifact \(.*\)`} {
		check.True(t, regexp.MustCompile(`(?m)^build: `+re+` \([0-9]+\.[0-9]+ s\)$`).MatchString(errOut), "no line", re, "in", errOut)
	}

	x := make([]float32, 1024)
	for i := range x {
		x[i] = float32(i) / 2
	}
	xa, err := ndarray.FromSlice(x, ndarray.Shape{1024})
	check.NoError(t, err)
	check.NoError(t, ndarray.SaveNPY(filepath.Join(dir, "x.npy"), xa))
	outDir := filepath.Join(dir, "out")
	_, _, err = runApp(t, "run", art, "--tracker", addr, "--key", "cpu", "--token-file", tokFile,
		"--input", "A="+filepath.Join(dir, "x.npy"), "--input", "B="+filepath.Join(dir, "x.npy"), "--output", outDir)
	check.NoError(t, err)
	c, err := ndarray.LoadNPY(filepath.Join(outDir, "C.npy"))
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](c)
	check.NoError(t, err)
	check.Equal(t, got[1023], float32(1023))

	out, _, err := runApp(t, "bench", art, "--tracker", addr, "--key", "cpu", "--token-file", tokFile,
		"--repeat", "3", "--min-repeat-ms", "5", "--json")
	check.NoError(t, err)
	var res proto.TimeResult
	check.NoError(t, json.Unmarshal([]byte(out), &res), out)
	check.Equal(t, len(res.Results), 3)
	check.True(t, res.Min > 0 && res.Min <= res.Median && res.Median <= res.Max, "stats:", out)
	// The device's validity report comes back with the figures.
	check.True(t, res.Report != nil && res.Report.N == 3 && res.Report.Machine.CPUs > 0, "report:", out)
	check.True(t, strings.HasPrefix(res.Report.Reason, "too few samples (n=3) for a 95% interval"), out)

	out, _, err = runApp(t, "query", "--tracker", addr, "--token-file", tokFile)
	check.NoError(t, err)
	check.True(t, strings.Contains(out, "cpu") && strings.Contains(out, "compiler"), "query:", out)

	// Errors a user meets: no token, an unknown key that nobody serves.
	_, _, err = runApp(t, "query", "--tracker", addr)
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	check.True(t, strings.Contains(err.Error(), "no token was given") && strings.Contains(err.Error(), "--token-file"),
		"a missing token should say so and name the flag:", err)
	_, _, err = runApp(t, "run", art, "--tracker", addr, "--key", "tpu", "--token-file", tokFile,
		"--input", "A="+filepath.Join(dir, "x.npy"), "--input", "B="+filepath.Join(dir, "x.npy"))
	check.ErrorIs(t, err, proto.ErrNotFound)
	check.True(t, strings.Contains(err.Error(), `"tpu"`) && strings.Contains(err.Error(), `"cpu"`) && strings.Contains(err.Error(), "--wait"),
		"an unknown key should name it, the known keys and --wait:", err)
	_, _, err = runApp(t, "run", art, "--tracker", addr, "--key", "tpu", "--token-file", tokFile, "--wait", "300ms",
		"--input", "A="+filepath.Join(dir, "x.npy"), "--input", "B="+filepath.Join(dir, "x.npy"))
	check.ErrorIs(t, err, proto.ErrDeadline)
}
