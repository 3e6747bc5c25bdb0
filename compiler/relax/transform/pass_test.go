package transform

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares text with testdata/name.golden (rewritten by -update).
func golden(t *testing.T, name, text string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		check.NoError(t, os.WriteFile(path, []byte(text), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	check.NoError(t, err, "run go test -update to create it")
	check.Equal(t, text, string(want))
}

// TestPassGoldens runs pass lists over modules and compares the printed
// result with a golden file; the result must verify after every pass,
// print back to itself, and compute what the input computes.
func TestPassGoldens(t *testing.T) {
	tests := []struct {
		name   string
		input  string // file in testdata, or seed:NAME for compiler/script/testdata
		passes []string
		noEval bool
	}{
		{"seed001_legalize", "seed:001_from_torch.py", []string{"LegalizeOps"}, true},
		{"seed001_annotate", "seed:001_after_legalize_ops.py", []string{"AnnotateTIROpPattern"}, true},
		{"seed001_fuse_ops", "seed:001_after_legalize_ops.py", []string{"AnnotateTIROpPattern", "FuseOps"}, true},
		{"seed001_zero", "seed:001_tvmscript_source.py", pipelines["zero"], true},
		{"seed001_O1", "seed:001_from_torch.py", pipelines["O1"], true},
		{"seed001_O3", "seed:001_from_torch.py", pipelines["O3"], true},
		{"mlp_small_zero", "mlp_small.py", pipelines["zero"], false},
		{"mlp_small_O3", "mlp_small.py", pipelines["O3"], false},
		{"fuse_diamond", "fuse_diamond.py", pipelines["O2"], false},
		{"fuse_diamond_O3", "fuse_diamond.py", pipelines["O3"], false},
		{"fuse_injective", "fuse_injective.py", pipelines["O2"], false},
		{"fuse_shared", "fuse_shared.py", []string{"LegalizeOps", "AnnotateTIROpPattern", "FuseOps"}, false},
		{"fuse_shared_tir", "fuse_shared.py", pipelines["O3"], false},
		{"fold_constant", "fold_constant.py", []string{"LegalizeOps", "FoldConstant"}, false},
		{"fold_constant_dce", "fold_constant.py", []string{"LegalizeOps", "FoldConstant", "DeadCodeElimination"}, false},
		{"dce", "dce.py", []string{"DeadCodeElimination"}, true},
		{"lift_transform_params", "lift_transform_params.py", []string{"LegalizeOps", "LiftTransformParams"}, false},
		{"lift_transform_params_O2", "lift_transform_params.py", pipelines["O2"], false},
		{"lift_transform_params_O3", "lift_transform_params.py", []string{"LegalizeOps", "AnnotateTIROpPattern", "FoldConstant",
			"FuseOps", "FuseTIR", "DeadCodeElimination", "LiftTransformParams", "StaticPlanBlockMemory"}, false},
		{"mlp_small_O2", "mlp_small.py", pipelines["O2"], false},
		{"alter_conv_layout", "alter_conv_layout.py", []string{"AlterConvLayout"}, true},
		{"alter_conv_layout_O2", "alter_conv_layout.py", pipelines["O2"], false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var in *ir.IRModule
			if name, ok := strings.CutPrefix(tc.input, "seed:"); ok {
				in = seed(t, name)
			} else {
				in = parseFile(t, filepath.Join("testdata", tc.input))
			}
			out := runVerified(t, in, tc.passes...)
			text := script.Print(out)
			golden(t, tc.name, text)
			back, err := script.Parse(tc.name+".golden", text)
			check.NoError(t, err)
			check.True(t, ir.StructuralEqual(back, out), "parses back to the same module")
			check.Equal(t, script.Print(back), text)
			if tc.noEval {
				return
			}
			// The passes preserve what main computes. Before legalization
			// there is nothing to run: compare with the legalized input.
			ref := in
			if tc.passes[0] == "LegalizeOps" || tc.passes[0] == "AlterConvLayout" {
				ref = runVerified(t, in, "LegalizeOps")
			}
			inputs := randomInputs(t, in)
			sameResults(t, runMain(t, out, inputs), runMain(t, ref, inputs))
		})
	}
}

func TestPassesDoNotModifyInput(t *testing.T) {
	in := seed(t, "001_from_torch.py")
	before := script.Print(in)
	_, err := RunPipeline(in, "O3")
	check.NoError(t, err)
	check.Equal(t, script.Print(in), before)
}

func TestPipelinesAndErrors(t *testing.T) {
	check.Equal(t, strings.Join(PipelineNames(), ","), "O0,O1,O2,O3,zero")
	ps, err := Pipeline("zero")
	check.NoError(t, err)
	check.Equal(t, len(ps), 6)
	m := seed(t, "001_from_torch.py")
	tests := []struct {
		name string
		run  func() error
		want []string
	}{
		{"unknown pipeline", func() error { _, err := RunPipeline(m, "O9"); return err },
			[]string{`unknown pipeline "O9" (pipelines: O0, O1, O2, O3, zero)`}},
		{"unknown pass", func() error { _, err := Run(m, []string{"LegalizeOps", "Fuse"}); return err },
			[]string{`unknown pass "Fuse" (passes: `, "FuseOps, FuseTIR"}},
		{"order", func() error { _, err := Run(m, []string{"FuseTIR", "FuseOps"}); return err },
			[]string{"pass FuseOps must run before FuseTIR"}},
		{"panic", func() error {
			_, err := RunPasses(m, []Pass{{Name: "Boom", Fn: func(*ir.IRModule) (*ir.IRModule, error) { panic("boom") }}}, Options{})
			return err
		}, []string{"Boom: internal error: boom"}},
		{"error", func() error {
			_, err := RunPasses(m, []Pass{{Name: "Fail", Fn: func(*ir.IRModule) (*ir.IRModule, error) { return nil, errors.New("no") }}}, Options{})
			return err
		}, []string{"Fail: no"}},
		{"ill-formed", func() error {
			bad := func(mod *ir.IRModule) (*ir.IRModule, error) {
				f, _ := mod.Lookup("main")
				fn := f.(*ir.Function)
				return mod.With("main", fn.WithBody(&ir.SeqExpr{Body: ir.NewRVar("nowhere", ir.Object())})), nil
			}
			_, err := RunPasses(m, []Pass{{Name: "Bad", Fn: bad}}, Options{Verify: true})
			return err
		}, []string{"Bad produced an ill-formed module", `"nowhere" is not defined`}},
		{"duplicate", func() error { return Register(Pass{Name: "FuseOps", Fn: FuseOps}) }, []string{`register pass "FuseOps": already registered`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			check.Error(t, tc.run(), tc.want...)
		})
	}
}

// TestAlterConvLayoutPaddedChannels checks what a convolution whose
// kernel AlterConvLayout pads with zero channels (260 to 288) and whose
// result it slices back computes, through O2, against the legalized
// input; with a weight (num_input = 1) its bias and relu fuse after it.
func TestAlterConvLayoutPaddedChannels(t *testing.T) {
	in, err := script.Parse("padded.py", `# from tvm.script import ir as I
# from tvm.script import relax as R
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 4, 3, 5), dtype="float32"), w: R.Tensor((260, 4, 3, 3), dtype="float32"), b: R.Tensor((1, 260, 1, 1), dtype="float32")) -> R.Tensor((1, 260, 3, 5), dtype="float32"):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            c: R.Tensor((1, 260, 3, 5), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            cb: R.Tensor((1, 260, 3, 5), dtype="float32") = R.add(c, b)
            gv: R.Tensor((1, 260, 3, 5), dtype="float32") = R.nn.relu(cb)
            R.output(gv)
        return gv
`)
	check.NoError(t, err)
	out := runVerified(t, in, pipelines["O2"]...)
	text := script.Print(out)
	check.True(t, strings.Contains(text, "(9, 4, 3, 3, 32)"), "a kernel in 9 blocks of 32 channels (OIHW32o)")
	check.True(t, strings.Contains(text, "fused_conv2d_strided_slice_add_relu"), "the slice, bias and relu fuse after the convolution")
	inputs := randomInputs(t, in)
	sameResults(t, runMain(t, out, inputs), runMain(t, runVerified(t, in, "LegalizeOps"), inputs))
}

// TestAlterConvLayoutPointwise checks the kernel layout of 1×1
// convolutions: stride 1, no padding and a plane whole vectors of 16
// overrun by at most an eighth take the flattened plane, their kernel in
// panels of 8 output channels (OIHW8o) up to 64×64 positions when 8
// divides the output channels, else in OIHW, unless they reduce 256 or
// more input channels over even rows no vector divides; the others take
// blocks of 32 channels (OIHW32o).
func TestAlterConvLayoutPointwise(t *testing.T) {
	for _, c := range []struct {
		hw, stride, pad, in, out int
		layout                   string
	}{
		{13, 1, 0, 8, 32, "OIHW8o"}, {55, 1, 0, 8, 32, "OIHW8o"}, {14, 1, 0, 8, 32, "OIHW8o"},
		{13, 1, 0, 512, 1000, "OIHW8o"}, {27, 1, 0, 256, 32, "OIHW8o"}, {16, 1, 0, 256, 32, "OIHW8o"},
		{112, 1, 0, 32, 16, "OIHW"}, {13, 1, 0, 8, 20, "OIHW"},
		{7, 1, 0, 8, 32, "OIHW32o"}, {13, 2, 0, 8, 32, "OIHW32o"}, {13, 1, 1, 8, 32, "OIHW32o"}, {14, 1, 0, 256, 32, "OIHW32o"},
	} {
		o := (c.hw+2*c.pad-1)/c.stride + 1
		in, err := script.Parse("pointwise.py", fmt.Sprintf(`# from tvm.script import ir as I
# from tvm.script import relax as R
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, %[5]d, %[1]d, %[1]d), dtype="float32"), w: R.Tensor((%[6]d, %[5]d, 1, 1), dtype="float32")) -> R.Tensor((1, %[6]d, %[2]d, %[2]d), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((1, %[6]d, %[2]d, %[2]d), dtype="float32") = R.nn.conv2d(x, w, strides=[%[3]d, %[3]d], padding=[%[4]d, %[4]d, %[4]d, %[4]d], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            R.output(gv)
        return gv
`, c.hw, o, c.stride, c.pad, c.in, c.out))
		check.NoError(t, err)
		text := script.Print(runVerified(t, in, "AlterConvLayout"))
		layout := "OIHW"
		if m := regexp.MustCompile(`kernel_layout="(OIHW\d+o)"`).FindStringSubmatch(text); m != nil {
			layout = m[1]
		}
		check.Equal(t, layout, c.layout, c)
		// The 1000 channels need no padding in panels of 8.
		check.True(t, !strings.Contains(text, "strided_slice"), c)
	}
}
