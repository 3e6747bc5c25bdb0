package cli

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// benchInputs saves vadd's two inputs and returns their --input flags.
func benchInputs(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	a, err := ndarray.FromSlice(make([]float32, 256), ndarray.Shape{256})
	check.NoError(t, err)
	p := filepath.Join(dir, "a.npy")
	check.NoError(t, ndarray.SaveNPY(p, a))
	return []string{"--input", "A=" + p, "--input", "B=" + p}
}

func TestBenchReport(t *testing.T) {
	art := kernelArtifact(t)
	in := benchInputs(t)
	args := append([]string{"bench", art, "--func", "vadd", "--min-repeat-ms", "1"}, in...)

	out, errOut, err := runApp(t, append(args, "--repeat", "6", "--json")...)
	check.NoError(t, err, errOut)
	var res proto.TimeResult
	check.NoError(t, json.Unmarshal([]byte(out), &res), out)
	rep := res.Report
	check.True(t, rep != nil, "bench --json has the report:", out)
	check.Equal(t, rep.N, 6)
	check.Equal(t, rep.StableWithin, 0.02)
	check.True(t, rep.Verdict == proto.VerdictStable || rep.Verdict == proto.VerdictNoisy && strings.HasPrefix(rep.Reason, "median's 95% CI ±"), out)
	check.True(t, rep.CILow <= rep.Median && rep.Median <= rep.CIHigh, out)
	check.True(t, rep.Machine.CPUs > 0, out)
	check.True(t, strings.Contains(out, `"until_stable"`) == false, out)

	out, errOut, err = runApp(t, append(args, "--repeat", "3", "--stable-within", "5%")...)
	check.NoError(t, err, errOut)
	for _, want := range []string{"spread: cv ", "(n=3)", "machine: ", " CPUs", "other sessions", "verdict: noisy: too few samples (n=3) for a 95% interval"} {
		check.True(t, strings.Contains(out, want), "bench output lacks", want, "in", out)
	}
	out, errOut, err = runApp(t, append(args, "--repeat", "6", "--stable-within", "100%")...)
	check.Error(t, err, "--stable-within", `"100%" is not a percentage`)
	check.Equal(t, out, "", errOut)
}

func TestBenchUntilStable(t *testing.T) {
	art := kernelArtifact(t)
	args := append([]string{"bench", art, "--func", "vadd", "--min-repeat-ms", "1", "--repeat", "2", "--until-stable", "--max-time", "20s"}, benchInputs(t)...)
	// 2 repeats a batch cannot be stable alone: at least three batches.
	out, errOut, err := runApp(t, append(args, "--stable-within", "50%", "--json")...)
	check.NoError(t, err, errOut)
	var res struct {
		proto.TimeResult
		UntilStable *untilStable `json:"until_stable"`
	}
	check.NoError(t, json.Unmarshal([]byte(out), &res), out)
	u := res.UntilStable
	check.True(t, u != nil, out)
	check.Equal(t, len(res.Results), 2*u.Batches, out)
	check.Equal(t, res.Report.N, len(res.Results))
	check.Equal(t, u.Stable, res.Report.Verdict == proto.VerdictStable, out)
	check.True(t, u.Batches >= 3 || !u.Stable, out)

	// A cap too short for a second batch: one batch, not stable, and
	// the text says so.
	out, errOut, err = runApp(t, append(args, "--max-time", "1ns")...)
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(out, "until stable: not stable within --max-time 1ns (1 batch, 2 repeats in "), out)
}
