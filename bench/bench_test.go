package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	cudadev "github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/internal/check"
)

// headline is the figure each benchmark must report, besides its name.
var headline = map[string]string{
	"copy":             "ratio",
	"matmul":           "gflops_scheduled",
	"tune":             "gflops_tuned",
	"vecadd":           "gbps",
	"callov":           "ns_per_call",
	"compile":          "cold_ms",
	"mlp":              "pooled_us",
	"rpc-call":         "median_us",
	"upload":           "gb_per_s",
	"tracker":          "leases_per_s",
	"tracker-ha":       "leases_per_s_bbolt",
	"timing-fidelity":  "ratio",
	"cuda":             "median_nvrtc_ms",
	"python":           "ratio_remote_call",
	"onnx":             "kiln_ms",
	"onnx-conformance": "total",
	"cross":            "native_cold_ms",
}

// TestQuickJSON runs every registered benchmark in quick mode and checks it
// prints one JSON object naming itself. It asserts nothing about timings.
func TestQuickJSON(t *testing.T) {
	for _, name := range names() {
		t.Run(name, func(t *testing.T) {
			if _, _, _, err := cudadev.NVRTCVersion(); name == "cuda" && err != nil {
				t.Skipf("NVRTC is not installed: %v", err)
			}
			if _, err := onnxSuiteDir(); name == "onnx-conformance" && err != nil {
				t.Skipf("%v", err)
			}
			var out, errOut bytes.Buffer
			err := run(context.Background(), []string{name, "--json", "--quick"}, &out, &errOut)
			check.NoError(t, err, "stderr:", errOut.String())
			dec := json.NewDecoder(&out)
			var obj map[string]any
			check.NoError(t, dec.Decode(&obj), "output:", out.String())
			check.True(t, !dec.More(), "more than one JSON value in", out.String())
			check.Equal(t, obj["name"], any(name))
			key, ok := headline[name]
			check.True(t, ok, "benchmark", name, "has no headline figure in the test table")
			v, ok := obj[key].(float64)
			check.True(t, ok, "field", key, "missing or not a number in", out.String())
			check.True(t, v > 0, "field", key, "is", v)
		})
	}
}

func TestQuickLine(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"--quick", "copy"}, &out, &errOut)
	check.NoError(t, err)
	check.True(t, strings.HasPrefix(out.String(), "copy: "), "line:", out.String())
	check.Equal(t, strings.Count(out.String(), "\n"), 1)
}

// TestList: without a name the benchmarks are listed and nothing fails.
func TestList(t *testing.T) {
	var out, errOut bytes.Buffer
	check.NoError(t, run(context.Background(), nil, &out, &errOut))
	for _, n := range names() {
		check.True(t, strings.Contains(out.String(), "  "+n+" "), "list lacks", n, "in", out.String())
	}
}

func TestBadArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown", []string{"nope"}, `unknown benchmark "nope"`},
		{"extra", []string{"copy", "more"}, `unexpected argument "more"`},
		{"bad flag", []string{"copy", "--fast"}, "flag provided but not defined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tc.args, &out, &errOut)
			check.Error(t, err, tc.want)
			check.Equal(t, out.String(), "")
		})
	}
}

// TestTuneParts runs the tune benchmark's parts alone in quick mode:
// each reports its own figures and says which part ran.
func TestTuneParts(t *testing.T) {
	for part, key := range map[string]string{"scaling": "scaling_2_over_1", "others": "others"} {
		t.Run(part, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), []string{"tune", "--json", "--quick", "--part", part}, &out, &errOut)
			check.NoError(t, err, "stderr:", errOut.String())
			var obj map[string]any
			check.NoError(t, json.Unmarshal(out.Bytes(), &obj), "output:", out.String())
			check.Equal(t, obj["part"], any(part))
			switch v := obj[key].(type) {
			case float64:
				check.True(t, v > 0, key, "is", v)
			case []any:
				check.Equal(t, len(v), 3)
			default:
				t.Fatalf("%s: %v in %s", key, obj[key], out.String())
			}
		})
	}
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"tune", "--quick", "--part", "nope"}, &out, &errOut)
	check.Error(t, err, "--part", "nope")
}
