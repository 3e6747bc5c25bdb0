package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/compiler/frontend/onnx/conformance"
)

func init() {
	register(benchmark{
		name:    "onnx-conformance",
		summary: "ONNX's backend node tests (922 models) imported, built and run on the CPU: passed / failed / unsupported, per operator",
		run:     runONNXConformance,
	})
}

// onnxConformanceResult is the report: counts over the suite and per
// operator (the op type of each test's last node).
type onnxConformanceResult struct {
	Name        string                       `json:"name"`
	Suite       string                       `json:"suite"`
	Passed      int                          `json:"passed"`
	Failed      int                          `json:"failed"`
	Unsupported int                          `json:"unsupported"`
	Total       int                          `json:"total"`
	PassRate    float64                      `json:"pass_rate"`
	Seconds     float64                      `json:"seconds"`
	ByOp        map[string]conformance.Count `json:"by_op"`
	FailedTests map[string]string            `json:"failed_tests,omitempty"`
	Quick       bool                         `json:"quick,omitempty"`
}

func (r onnxConformanceResult) Line() string {
	var worst []string
	type opc struct {
		op string
		c  conformance.Count
	}
	var ops []opc
	for op, c := range r.ByOp {
		if c.Failed+c.Unsupported > 0 {
			ops = append(ops, opc{op, c})
		}
	}
	sort.Slice(ops, func(i, j int) bool {
		a, b := ops[i].c.Failed+ops[i].c.Unsupported, ops[j].c.Failed+ops[j].c.Unsupported
		return a > b || a == b && ops[i].op < ops[j].op
	})
	for _, o := range ops[:min(8, len(ops))] {
		worst = append(worst, fmt.Sprintf("%s %d", o.op, o.c.Failed+o.c.Unsupported))
	}
	return fmt.Sprintf("onnx-conformance: %d of %d passed (%.1f%%), %d failed, %d unsupported in %.1f s; most not passing: %s",
		r.Passed, r.Total, 100*r.PassRate, r.Failed, r.Unsupported, r.Seconds, strings.Join(worst, ", "))
}

// onnxSuiteDir finds ONNX's backend node tests: $KILN_ONNX_BACKEND_TESTS,
// else shared/onnx-backend-tests/node beside the repository.
func onnxSuiteDir() (string, error) {
	if d := os.Getenv("KILN_ONNX_BACKEND_TESTS"); d != "" {
		return d, nil
	}
	suite := filepath.Join("shared", "onnx-backend-tests", "node")
	for up := 1; up <= 3; up++ {
		d := filepath.Join(strings.Repeat(".."+string(filepath.Separator), up), suite)
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			return filepath.Abs(d)
		}
	}
	return "", fmt.Errorf("ONNX backend node tests not found: set KILN_ONNX_BACKEND_TESTS to a folder of them, such as onnx/backend/test/data/node in an ONNX source checkout (looked for %s next to the repository's folder)", suite)
}

func runONNXConformance(ctx context.Context, opt options) (result, error) {
	dir, err := onnxSuiteDir()
	if err != nil {
		return nil, err
	}
	o := conformance.Options{}
	if opt.quick {
		o.Filter = "test_relu"
	}
	start := time.Now()
	rep, err := conformance.Run(ctx, dir, o)
	if err != nil {
		return nil, err
	}
	r := onnxConformanceResult{Name: "onnx-conformance", Suite: dir, Passed: rep.Passed, Failed: rep.Failed,
		Unsupported: rep.Unsupported, Total: rep.Total, ByOp: rep.ByOp, Seconds: time.Since(start).Seconds(), Quick: opt.quick}
	if rep.Total > 0 {
		r.PassRate = float64(rep.Passed) / float64(rep.Total)
	}
	for _, t := range rep.Results {
		if t.Status == conformance.Failed {
			if r.FailedTests == nil {
				r.FailedTests = map[string]string{}
			}
			r.FailedTests[t.Name] = t.Detail
		}
	}
	return r, nil
}
