package cli

import (
	"context"
	"encoding/json"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/load"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
	"github.com/kiln-ml/kiln/tracker/ui"
)

// TestResultsProfileCompare: kiln bench --profile on a leased device
// records the profile with its kernels (each one's time within each
// inference); kiln results show lists them, compare prints a row per
// kernel, and a build whose first convolution is left unscheduled
// (--no-default-schedule) shows as slower in that kernel's row and fails
// the comparison. The console's pages draw the same kernels.
func TestResultsProfileCompare(t *testing.T) {
	dir := t.TempDir()
	fast, slow := filepath.Join(dir, "cnn.kiln"), filepath.Join(dir, "cnn-unscheduled.kiln")
	model := filepath.Join(onnxTestdata, "smallcnn.onnx")
	_, errOut, err := runApp(t, "build", model, "--input-shape", "x=2x3x16x16", "-o", fast)
	check.NoError(t, err, errOut)
	_, errOut, err = runApp(t, "build", model, "--input-shape", "x=2x3x16x16", "--no-default-schedule", "-o", slow)
	check.NoError(t, err, errOut)
	x := "x=" + filepath.Join(onnxTestdata, "smallcnn_x.npy")
	fl, tokFile := testFleet(t, dir, "tok")
	conn := []string{"--tracker", fl.tracker.Addr(), "--token-file", tokFile}
	const rounds = 12
	profile := func(art string, extra ...string) []string {
		return append(append([]string{"bench", art, "--input", x, "--profile", "--rounds", "12", "--key", "cpu"}, conn...), extra...)
	}

	// Recorded by default, with --json: the profile and the result's id.
	out, errOut, err := runApp(t, profile(fast, "--label", "prof-a", "--json")...)
	check.NoError(t, err, errOut)
	var pa struct {
		load.Profile
		Recorded string `json:"recorded"`
	}
	check.NoError(t, json.Unmarshal([]byte(out), &pa), out)
	checkCNNProfile(t, pa.Profile, rounds, "cpu:0")
	check.Equal(t, len(pa.ModelSamples), rounds)
	for _, k := range pa.Kernels {
		check.Equal(t, len(k.Samples), rounds, k.Name)
		for _, s := range k.Samples {
			check.True(t, s > 0, k.Name, "was called in every inference:", k.Samples)
		}
	}
	check.True(t, strings.HasPrefix(pa.Recorded, "r-"), out)
	// The table, then the result's id.
	out, errOut, err = runApp(t, profile(fast, "--label", "prof-a2")...)
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(out, "PER INFERENCE") && strings.Contains(out, "recorded as r-"), out)
	_, errOut, err = runApp(t, profile(slow, "--label", "prof-b")...)
	check.NoError(t, err, errOut)
	_, errOut, err = runApp(t, profile(fast, "--label", "prof-none", "--record=false")...)
	check.NoError(t, err, errOut)
	_, _, err = runApp(t, "bench", fast, "--input", x, "--profile", "--label", "prof-a")
	check.Error(t, err, "need --tracker")

	out, errOut, err = runApp(t, append([]string{"results", "list", "--label", "prof-none", "--json"}, conn...)...)
	check.NoError(t, err, errOut)
	var none proto.ResultList
	check.NoError(t, json.Unmarshal([]byte(out), &none), out)
	check.Equal(t, none.Total, 0)
	out, errOut, err = runApp(t, append([]string{"results", "list", "--source", "profile", "--json"}, conn...)...)
	check.NoError(t, err, errOut)
	var profiles proto.ResultList
	check.NoError(t, json.Unmarshal([]byte(out), &profiles), out)
	check.Equal(t, profiles.Total, 3)
	_, _, err = runApp(t, append([]string{"results", "list", "--source", "profiles"}, conn...)...)
	check.Error(t, err, `--source "profiles": want one of bench, time_evaluator, tune, profile`)

	// As stored: the model's time per inference, each kernel's within it.
	out, errOut, err = runApp(t, append([]string{"results", "show", pa.Recorded, "--json"}, conn...)...)
	check.NoError(t, err, errOut)
	var r proto.Result
	check.NoError(t, json.Unmarshal([]byte(out), &r), out)
	check.Equal(t, r.Source, proto.ResultSourceProfile)
	check.Equal(t, r.Function, "main")
	check.Equal(t, r.Label, "prof-a")
	check.Equal(t, r.Inputs[0], "x:float32[2,3,16,16]")
	check.Equal(t, r.Time.Results, pa.ModelSamples)
	check.Equal(t, r.Time.Device, "cpu:0")
	check.True(t, r.Time.Report != nil && r.Time.Report.N == rounds && r.Time.Median > 0, r.Time)
	check.Equal(t, len(r.Kernels), len(pa.Kernels))
	for i, k := range r.Kernels {
		check.Equal(t, k.Name, pa.Kernels[i].Name)
		check.Equal(t, k.Results, pa.Kernels[i].Samples)
		check.Equal(t, k.Calls, pa.Kernels[i].Calls)
		check.True(t, len(k.Ops) == len(pa.Kernels[i].Ops) && len(k.Ops) > 0, k)
	}
	out, errOut, err = runApp(t, append([]string{"results", "show", pa.Recorded}, conn...)...)
	check.NoError(t, err, errOut)
	for _, want := range []string{"profile", "6 kernels (medians per inference):", "KERNEL", "PER INFERENCE", "SHARE", "CALLS", "OPERATORS",
		"/conv1/Conv (Conv), /relu/Relu (Relu)", "/fc/Gemm (Gemm)"} {
		check.True(t, strings.Contains(out, want), "show lacks", want, "in", out)
	}

	// Two profiles of one build: a row for the model and one per kernel,
	// each of the rounds on either side. (Their verdicts are whatever
	// the shared machine made them.)
	cmp := append([]string{"results", "compare"}, conn...)
	out, _, _ = runApp(t, append(cmp, "prof-a", "prof-a2", "--json")...)
	var same struct {
		Comparisons []comparison `json:"comparisons"`
		Unmatched   []string     `json:"unmatched"`
	}
	check.NoError(t, json.Unmarshal([]byte(out), &same), out)
	check.Equal(t, len(same.Comparisons), 1+len(pa.Kernels))
	check.Equal(t, len(same.Unmatched), 0)
	var kernels []string
	for _, c := range same.Comparisons {
		check.Equal(t, c.Function, "main")
		check.True(t, c.NA == rounds && c.NB == rounds && c.RatioLow <= c.Ratio && c.Ratio <= c.RatioHigh, c)
		if c.Kernel != "" {
			kernels = append(kernels, c.Kernel)
		}
	}
	var want []string
	for _, k := range pa.Kernels {
		want = append(want, k.Name)
	}
	slices.Sort(want)
	check.Equal(t, kernels, want)
	out, _, _ = runApp(t, append(cmp, "prof-a", "prof-a2")...)
	rows := map[string]bool{}
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "main" {
			rows[f[1]] = true
		}
	}
	for _, k := range append(want, "-") {
		check.True(t, rows[k], "compare lacks a row for", k, "in", out)
	}

	// The unscheduled build's first convolution is slower, in its row,
	// and the comparison fails.
	out, _, err = runApp(t, append(cmp, "prof-a", "prof-b")...)
	check.ErrorIs(t, err, ErrRegression)
	check.True(t, strings.Contains(err.Error(), "main/fused_conv2d_add_relu"), err)
	row := ""
	for line := range strings.Lines(out) {
		if strings.Contains(line, "fused_conv2d_add_relu") {
			row = line
		}
	}
	check.True(t, strings.Contains(row, "slower"), "the unscheduled convolution's row:", row, "in", out)
	out, _, err = runApp(t, append(cmp, "prof-a", "prof-b", "--json")...)
	check.ErrorIs(t, err, ErrRegression)
	var diff struct {
		Comparisons []comparison `json:"comparisons"`
	}
	check.NoError(t, json.Unmarshal([]byte(out), &diff), out)
	var conv comparison
	for _, c := range diff.Comparisons {
		if c.Kernel == "fused_conv2d_add_relu" {
			conv = c
		}
	}
	check.Equal(t, conv.Verdict, timer.Slower)
	check.True(t, conv.Ratio > 1 && conv.RatioLow > 1 && conv.P < 0.05, conv)

	// The console: the result's page draws a bar per kernel, the
	// comparison's one per kernel row.
	con, err := ui.New(ui.Config{Tracker: fl.tracker, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	check.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { con.Serve(ctx, ln) })
	base := "http://" + ln.Addr().String()
	jar, err := cookiejar.New(nil)
	check.NoError(t, err)
	web := &http.Client{Jar: jar}
	resp, err := web.PostForm(base+"/login", url.Values{"token": {"tok"}, "next": {"/results"}})
	check.NoError(t, err)
	resp.Body.Close()
	check.Equal(t, resp.StatusCode, http.StatusOK) // followed to the results page
	page := func(p string) string {
		t.Helper()
		resp, err := web.Get(base + p)
		check.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		check.NoError(t, err)
		check.Equal(t, resp.StatusCode, http.StatusOK, p, string(b))
		return string(b)
	}
	body := page("/results/" + pa.Recorded)
	check.True(t, strings.Contains(body, "Kernels (median per inference") && strings.Contains(body, "<h2>Inferences</h2>"), body)
	kb := chartOf(t, body, "kernels")
	check.Equal(t, len(kb.Bars), len(pa.Kernels))
	for _, b := range kb.Bars {
		check.True(t, slices.Contains(want, b.Name) && b.Value > 0, b)
	}
	body = page("/compare?a=prof-a&b=prof-b")
	check.True(t, strings.Contains(body, "main/fused_conv2d_add_relu"), body)
	cd := chartOf(t, body, "comparison")
	check.Equal(t, len(cd.Bars), 1+len(pa.Kernels))
	for _, b := range cd.Bars {
		if b.Name == "main/fused_conv2d_add_relu" {
			check.Equal(t, b.Class, "slower")
		}
	}
}

// chartBars is what a console chart's data-chart attribute says of its
// bars.
type chartBars struct {
	Bars []struct {
		Name  string  `json:"name"`
		Value float64 `json:"value"`
		Class string  `json:"class"`
	} `json:"bars"`
}

// chartOf reads the chart of element id from a console page.
func chartOf(t *testing.T, page, id string) chartBars {
	t.Helper()
	_, rest, ok := strings.Cut(page, `id="`+id+`" data-chart="`)
	check.True(t, ok, "no chart", id, "in", page)
	attr, _, _ := strings.Cut(rest, `"`)
	var c chartBars
	check.NoError(t, json.Unmarshal([]byte(html.UnescapeString(attr)), &c), attr)
	return c
}
