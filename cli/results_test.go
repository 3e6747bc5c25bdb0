package cli

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestResultsCommands records timings with kiln bench --tracker and reads
// them back with kiln results list, show, export and compare, which fails
// on a significant regression.
func TestResultsCommands(t *testing.T) {
	art := kernelArtifact(t)
	dir := t.TempDir()
	fl, tokFile := testFleet(t, dir, "tok")
	addr := fl.tracker.Addr()
	conn := []string{"--tracker", addr, "--token-file", tokFile}
	bench := append(append([]string{"bench", art, "--func", "vadd", "--key", "cpu", "--min-repeat-ms", "1", "--repeat", "6"}, conn...), benchInputs(t)...)

	out, errOut, err := runApp(t, append(bench, "--label", "base", "--json")...)
	check.NoError(t, err, errOut)
	var res struct {
		proto.TimeResult
		Recorded string `json:"recorded"`
	}
	check.NoError(t, json.Unmarshal([]byte(out), &res), out)
	check.True(t, strings.HasPrefix(res.Recorded, "r-"), out)
	out, errOut, err = runApp(t, append(bench, "--label", "base")...)
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(out, "recorded as r-"), out)
	_, errOut, err = runApp(t, append(bench, "--record=false", "--label", "none")...)
	check.NoError(t, err, errOut)
	_, _, err = runApp(t, "bench", art, "--func", "vadd", "--label", "x")
	check.Error(t, err, "need --tracker")

	out, errOut, err = runApp(t, append([]string{"results", "list", "--label", "base", "--json"}, conn...)...)
	check.NoError(t, err, errOut)
	var l proto.ResultList
	check.NoError(t, json.Unmarshal([]byte(out), &l), out)
	check.Equal(t, l.Total, 2)
	check.Equal(t, l.Results[1].ID, res.Recorded)
	got := l.Results[1]
	check.Equal(t, got.Function, "vadd")
	check.Equal(t, got.DeviceKey, "cpu")
	check.Equal(t, got.KilnVersion, Version())
	check.Equal(t, got.Inputs[:2], []string{"A:float32[256]", "B:float32[256]"})
	check.Equal(t, got.Time.Results, res.Results)
	check.True(t, got.Time.Report != nil && got.Time.Report.N == 6 && len(got.Artifact) == 64, got)
	out, _, err = runApp(t, append([]string{"results", "list", "--label", "none"}, conn...)...)
	check.NoError(t, err)
	check.Equal(t, strings.Count(out, "\n"), 1) // the header alone

	out, errOut, err = runApp(t, append([]string{"results", "show", res.Recorded}, conn...)...)
	check.NoError(t, err, errOut)
	for _, want := range []string{res.Recorded, "vadd", "A:float32[256]", "6 repeats", "verdict: ", "device.cpu=true"} {
		check.True(t, strings.Contains(out, want), "show lacks", want, "in", out)
	}
	_, _, err = runApp(t, append([]string{"results", "show", "r-none"}, conn...)...)
	check.ErrorIs(t, err, proto.ErrNotFound)

	out, errOut, err = runApp(t, append([]string{"results", "export", "--csv", "--function", "vadd"}, conn...)...)
	check.NoError(t, err, errOut)
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	check.NoError(t, err, out)
	check.Equal(t, len(rows), 3) // the header and the two recorded (not --record=false)
	check.Equal(t, rows[0], resultsCSVHeader)
	check.Equal(t, len(strings.Split(rows[2][len(rows[2])-1], ";")), 6)
	out, _, err = runApp(t, append([]string{"results", "export", "--json", "--label", "base"}, conn...)...)
	check.NoError(t, err)
	check.Equal(t, strings.Count(out, "\n"), 2)

	// Two sets whose figures differ by 20% and a kernel by nothing.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	record := func(label string, scale float64) {
		figs := make([]float64, 12)
		for i := range figs {
			figs[i] = scale * (1 + float64(i%6)/100) * 1e-3
		}
		kern := []float64{1e-4, 1.01e-4, 1.02e-4, 0.99e-4, 1e-4, 1.01e-4}
		_, err := fl.client.RecordResult(ctx, proto.Result{Function: "mlp", Label: label, Time: proto.TimeResult{Results: figs},
			Kernels: []proto.KernelTime{{Name: "fused_matmul", Results: kern}}})
		check.NoError(t, err)
	}
	record("fast", 1)
	record("slow", 1.2)
	cmp := append([]string{"results", "compare"}, conn...)
	out, _, err = runApp(t, append(cmp, "fast", "slow")...)
	check.ErrorIs(t, err, ErrRegression)
	check.True(t, strings.Contains(err.Error(), "mlp"), err)
	check.True(t, strings.Contains(out, "slower") && strings.Contains(out, "fused_matmul"), out)
	out, errOut, err = runApp(t, append(cmp, "slow", "fast", "--json")...)
	check.NoError(t, err, errOut)
	var cj struct {
		Comparisons []comparison `json:"comparisons"`
	}
	check.NoError(t, json.Unmarshal([]byte(out), &cj), out)
	check.Equal(t, len(cj.Comparisons), 2)
	check.Equal(t, cj.Comparisons[0].Verdict, "faster")
	check.True(t, cj.Comparisons[0].Ratio < 0.85 && cj.Comparisons[0].P < 0.05, cj.Comparisons[0])
	check.Equal(t, cj.Comparisons[1].Kernel, "fused_matmul")
	check.Equal(t, cj.Comparisons[1].Verdict, "no difference")
	// A 20% regression within a 25% threshold passes.
	_, _, err = runApp(t, append(cmp, "fast", "slow", "--threshold", "25%")...)
	check.NoError(t, err)
	_, _, err = runApp(t, append(cmp, "base", "nothing")...)
	check.ErrorIs(t, err, proto.ErrNotFound)
}
