package cli

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/load"
	"github.com/kiln-ml/kiln/ndarray"
)

// checkTraceFile checks a trace file against Chrome's trace-event format
// (the JSON object form): a traceEvents array whose events have a name, a
// category, a phase of the format's, numeric timestamps and durations and
// process and thread ids; complete events ("X") carry a duration. It
// returns the events.
func checkTraceFile(t *testing.T, file string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(file)
	check.NoError(t, err)
	var doc map[string]any
	check.NoError(t, json.Unmarshal(b, &doc), string(b))
	raw, ok := doc["traceEvents"].([]any)
	check.True(t, ok && len(raw) > 0, "no traceEvents array in", string(b))
	if u, ok := doc["displayTimeUnit"]; ok {
		check.True(t, u == "ms" || u == "ns", "displayTimeUnit", u)
	}
	phases := []string{"B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "V", "v", "R", "c", "(", ")"}
	var events []map[string]any
	for i, r := range raw {
		e, ok := r.(map[string]any)
		check.True(t, ok, "event", i, "is not an object:", r)
		name, ok := e["name"].(string)
		check.True(t, ok && name != "", "event", i, "has no name:", e)
		_, ok = e["cat"].(string)
		check.True(t, ok, "event", i, "has no category:", e)
		ph, ok := e["ph"].(string)
		check.True(t, ok && slices.Contains(phases, ph), "event", i, "has phase", e["ph"])
		for _, k := range []string{"ts", "pid", "tid"} {
			_, ok := e[k].(float64)
			check.True(t, ok, "event", i, k, "is not a number:", e)
		}
		if ph == "X" {
			d, ok := e["dur"].(float64)
			check.True(t, ok && d >= 0, "complete event", i, "has duration", e["dur"])
		}
		if a, ok := e["args"]; ok {
			_, ok := a.(map[string]any)
			check.True(t, ok, "event", i, "args is not an object:", a)
		}
		events = append(events, e)
	}
	return events
}

// checkCNNProfile checks a profile of the ONNX test model: its kernels
// with the model operators they came from, the most expensive first, and
// both the kernels' sum and the whole model's time.
func checkCNNProfile(t *testing.T, p load.Profile, rounds int, device string) {
	t.Helper()
	check.Equal(t, p.Function, "main")
	check.Equal(t, p.Rounds, rounds)
	check.Equal(t, p.Device, device)
	check.True(t, p.KernelSeconds > 0 && p.ModelSeconds > 0, "kernels", p.KernelSeconds, "model", p.ModelSeconds)
	ops := map[string]string{}
	for i, k := range p.Kernels {
		check.True(t, k.Calls >= 1 && k.Share > 0, k)
		if i > 0 {
			check.True(t, p.Kernels[i-1].Seconds >= k.Seconds, "not the most expensive first:", p.Kernels)
		}
		for _, o := range k.Ops {
			ops[o.Name] = o.Op
		}
	}
	for name, op := range map[string]string{"/conv1/Conv": "Conv", "/relu/Relu": "Relu", "/conv2/Conv": "Conv", "/relu6/Clip": "Clip",
		"/pool/MaxPool": "MaxPool", "/avgpool/GlobalAveragePool": "GlobalAveragePool", "/fc/Gemm": "Gemm"} {
		check.Equal(t, ops[name], op, "node", name, "in", p.Kernels)
	}
}

// TestBenchProfile: kiln bench --profile of an ONNX model, here and on a
// device leased from an in-process fleet (measured there, sent back):
// the table, --json, and --trace in the trace-event format. There the
// device binds the model's bundled weights, so main takes its input alone.
func TestBenchProfile(t *testing.T) {
	dir := t.TempDir()
	art := filepath.Join(dir, "cnn.kiln")
	_, errOut, err := runApp(t, "build", filepath.Join(onnxTestdata, "smallcnn.onnx"), "--input-shape", "x=2x3x16x16", "-o", art)
	check.NoError(t, err, errOut)
	x := "x=" + filepath.Join(onnxTestdata, "smallcnn_x.npy")

	out, errOut, err := runApp(t, "bench", art, "--input", x, "--profile", "--rounds", "3")
	check.NoError(t, err, errOut)
	for _, want := range []string{"main on this machine (cpu:0): profile of 3 inferences", "KERNEL", "PER INFERENCE", "SHARE", "CALLS", "OPERATORS",
		"/conv1/Conv (Conv), /relu/Relu (Relu)", "/fc/Gemm (Gemm)", "per inference (sum of the above); whole model "} {
		check.True(t, strings.Contains(out, want), "bench --profile output lacks", want, "in", out)
	}

	trace := filepath.Join(dir, "cnn.trace.json")
	out, errOut, err = runApp(t, "bench", art, "--input", x, "--profile", "--rounds", "4", "--json", "--trace", trace)
	check.NoError(t, err, errOut)
	var p load.Profile
	check.NoError(t, json.Unmarshal([]byte(out), &p), out)
	checkCNNProfile(t, p, 4, "cpu:0")
	events := checkTraceFile(t, trace)
	check.Equal(t, len(events), len(p.Trace))
	check.Equal(t, events[0]["name"], "main")
	check.Equal(t, events[0]["cat"], "function")
	var kernels int
	for _, e := range events[1:] {
		check.Equal(t, e["cat"], "kernel")
		check.True(t, e["ts"].(float64)+e["dur"].(float64) <= events[0]["dur"].(float64), "a kernel call outside the inference:", e)
		kernels++
		if e["name"] == p.Kernels[0].Name {
			check.True(t, strings.Contains(e["args"].(map[string]any)["operators"].(string), p.Kernels[0].Ops[0].Name), e)
		}
	}
	var calls int64
	for _, k := range p.Kernels {
		calls += k.Calls
	}
	check.Equal(t, int64(kernels), calls)

	// An artifact of kernels has no graph function to profile.
	_, _, err = runApp(t, append([]string{"bench", kernelArtifact(t), "--func", "vadd", "--profile"}, benchInputs(t)...)...)
	check.Error(t, err, "--profile is for graph-level artifacts")

	// On a leased device: measured there, the same profile comes back.
	fl, tok := testFleet(t, dir, "tok")
	remoteTrace := filepath.Join(dir, "remote.trace.json")
	out, errOut, err = runApp(t, "bench", art, "--input", x, "--profile", "--rounds", "3", "--json", "--trace", remoteTrace,
		"--tracker", fl.tracker.Addr(), "--key", "cpu", "--token-file", tok)
	check.NoError(t, err, errOut)
	var rp load.Profile
	check.NoError(t, json.Unmarshal([]byte(out), &rp), out)
	checkCNNProfile(t, rp, 3, "cpu:0")
	check.Equal(t, len(checkTraceFile(t, remoteTrace)), len(rp.Trace))

	// The device binds the bundled weights: main takes its input alone
	// there, as it does here.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lease, err := fl.client.RequestLease(ctx, client.LeaseRequest{Key: "cpu", User: t.Name()})
	check.NoError(t, err)
	defer lease.Release(context.Background())
	s, err := client.Connect(ctx, lease.Addr, client.SessionOptions{Token: "tok", LeaseToken: lease.Token})
	check.NoError(t, err)
	defer s.Close()
	b, err := os.ReadFile(art)
	check.NoError(t, err)
	check.NoError(t, s.Upload(ctx, "cnn.kiln", b))
	mod, err := s.LoadModule(ctx, "cnn.kiln")
	check.NoError(t, err)
	main, err := mod.GetFunction(ctx, "main")
	check.NoError(t, err)
	xa, err := ndarray.LoadNPY(filepath.Join(onnxTestdata, "smallcnn_x.npy"))
	check.NoError(t, err)
	rx, err := s.Empty(ctx, xa.Shape(), xa.DType(), devices.CPUDevice)
	check.NoError(t, err)
	check.NoError(t, s.CopyFrom(ctx, rx, xa))
	res, err := main.Call(ctx, rx)
	check.NoError(t, err)
	ry, ok := res.(*client.Array)
	check.True(t, ok, "main returned", res)
	y, err := s.CopyTo(ctx, ry)
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](y)
	check.NoError(t, err)
	wantArr, err := ndarray.LoadNPY(filepath.Join(onnxTestdata, "smallcnn_y.npy"))
	check.NoError(t, err)
	want, err := ndarray.ToSlice[float32](wantArr)
	check.NoError(t, err)
	check.Equal(t, len(got), len(want))
	for i := range want {
		if math.Abs(float64(got[i]-want[i])) > 1e-4*math.Max(1, math.Abs(float64(want[i]))) {
			t.Fatalf("remote output %d = %g, want %g", i, got[i], want[i])
		}
	}
	_, err = main.Call(ctx)
	check.Error(t, err, "want the inputs x (the weights are bundled), got 0 arguments")
}
