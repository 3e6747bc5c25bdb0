package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/internal/check"
)

// stageLine matches a stage line of kiln build: "build: STAGE (1.2 s)".
func stageLine(stage string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^build: ` + regexp.QuoteMeta(stage) + ` \([0-9]+\.[0-9]+ s\)$`)
}

// TestBuildStages: with the error stream a buffer (not a terminal), a
// local build of a kernel and of an ONNX model prints one line per
// stage with its elapsed time, and no spinner.
func TestBuildStages(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "conv.py")
	check.NoError(t, os.WriteFile(src, []byte(userConv2D(4, 8)), 0o644))
	_, errOut, err := runApp(t, "build", src, "-o", filepath.Join(dir, "conv.kiln"), "--no-cache")
	check.NoError(t, err, errOut)
	for _, stage := range []string{"schedule", "lower and generate code", "C compile of 1 function(s)", "pack the artifact"} {
		check.True(t, stageLine(stage).MatchString(errOut), "no line for", stage, "in", errOut)
	}
	check.True(t, !strings.ContainsAny(errOut, "\r⠋⠙"), "a spinner off a terminal:", errOut)

	_, errOut, err = runApp(t, "build", "../compiler/frontend/onnx/testdata/smallcnn.onnx", "--input-shape", "x=1x3x16x16",
		"-o", filepath.Join(dir, "cnn.kiln"), "--no-cache")
	check.NoError(t, err, errOut)
	for _, stage := range []string{"import smallcnn.onnx", "graph pipeline O2", "schedule", "lower and generate code"} {
		check.True(t, stageLine(stage).MatchString(errOut), "no line for", stage, "in", errOut)
	}
	check.True(t, regexp.MustCompile(`(?m)^build: C compile of [0-9]+ function\(s\) \([0-9.]+ s\)$`).MatchString(errOut), errOut)
	check.True(t, regexp.MustCompile(`(?m)^build: bundle [0-9.]+ MB of weights into the artifact \([0-9.]+ s\)$`).MatchString(errOut), errOut)
	check.True(t, strings.Contains(errOut, "build: fused_matmul_add1: default schedule (matmul)\n"), errOut)
}

// TestReportSchedulesGroups: a module of many functions gets one line per
// kind of schedule, and a function with a tuning database's note its own.
func TestReportSchedulesGroups(t *testing.T) {
	var scheds []compiler.FuncSchedule
	for i := range 6 {
		scheds = append(scheds, compiler.FuncSchedule{Name: fmt.Sprintf("conv%d", i), Kind: compiler.DefaultSchedule, Rule: "conv2d"})
	}
	scheds = append(scheds, compiler.FuncSchedule{Name: "reshape", Kind: compiler.Unscheduled},
		compiler.FuncSchedule{Name: "mm", Kind: compiler.OptionSchedule}, compiler.FuncSchedule{Name: "add", Kind: compiler.DefaultSchedule, Rule: "elementwise and reductions"})
	var b strings.Builder
	reportSchedules(&b, scheds, map[string]string{"mm": "tuned, the best record in db.jsonl (…)", "add": "no record in db.jsonl for target \"cpu\":"})
	check.Equal(t, b.String(), `build: mm: tuned, the best record in db.jsonl (…)
build: add: no record in db.jsonl for target "cpu": default schedule (elementwise and reductions)
build: 6 functions: default schedule (conv2d) (conv0, conv1, conv2 and 3 more)
build: reshape: unscheduled
`)
}
