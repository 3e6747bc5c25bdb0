package transform

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// convChoiceModule is a graph of a 3×3 convolution of 24 output channels
// (blocks of 8 divide them, 16 and 32 do not), a second
// one of the same signature, and a pointwise one after them, each with a
// bias and relu after it.
const convChoiceModule = `# from tvm.script import ir as I
# from tvm.script import relax as R
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 4, 6, 7), dtype="float32"), w: R.Tensor((24, 4, 3, 3), dtype="float32"), w2: R.Tensor((24, 24, 3, 3), dtype="float32"), p: R.Tensor((16, 24, 1, 1), dtype="float32"), b: R.Tensor((1, 24, 1, 1), dtype="float32")) -> R.Tensor((1, 16, 6, 7), dtype="float32"):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            c: R.Tensor((1, 24, 6, 7), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            cb: R.Tensor((1, 24, 6, 7), dtype="float32") = R.add(c, b)
            r: R.Tensor((1, 24, 6, 7), dtype="float32") = R.nn.relu(cb)
            c2: R.Tensor((1, 24, 6, 7), dtype="float32") = R.nn.conv2d(r, w2, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            r2: R.Tensor((1, 24, 6, 7), dtype="float32") = R.nn.relu(c2)
            c3: R.Tensor((1, 24, 6, 7), dtype="float32") = R.nn.conv2d(r2, w2, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            gv: R.Tensor((1, 16, 6, 7), dtype="float32") = R.nn.conv2d(c3, p, strides=[1, 1], padding=[0, 0, 0, 0], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            R.output(gv)
        return gv
`

// TestConvSitesAndLayouts lists the module's convolution sites (one per
// signature: the two 24→24 convolutions are one) with the layouts each
// can take, the default first, and checks that every choice of layout,
// through O2, computes what the legalized input does; a layout a site
// cannot take is an error naming it and the ones it can.
func TestConvSitesAndLayouts(t *testing.T) {
	in, err := script.Parse("choice.py", convChoiceModule)
	check.NoError(t, err)
	sites := ConvSites(in)
	check.Equal(t, len(sites), 3, sites)
	want := map[string][]string{
		"conv2d 1x4x6x7 * 24x4x3x3 strides 1,1 padding 1,1,1,1 dilation 1,1":   {"OIHW8o", "HWIO", "OIHW"},
		"conv2d 1x24x6x7 * 24x24x3x3 strides 1,1 padding 1,1,1,1 dilation 1,1": {"OIHW8o", "HWIO", "OIHW"},
		"conv2d 1x24x6x7 * 16x24x1x1 strides 1,1 padding 0,0,0,0 dilation 1,1": {"OIHW16o", "OIHW8o", "HWIO", "OIHW"},
	}
	for _, s := range sites {
		check.Equal(t, strings.Join(s.Layouts, " "), strings.Join(want[s.Key], " "), s.Key)
	}
	ref := runVerified(t, in, "LegalizeOps")
	inputs := randomInputs(t, in)
	expect := runMain(t, ref, inputs)
	for i := range 5 {
		choice := map[string]string{}
		var names []string
		for _, s := range sites {
			l := want[s.Key][i%len(want[s.Key])]
			choice[s.Key] = l
			names = append(names, l)
		}
		t.Run(strings.Join(names, "_"), func(t *testing.T) {
			ps, err := Pipeline("O2")
			check.NoError(t, err)
			ps[0] = Pass{Name: "AlterConvLayout", Fn: AlterConvLayoutWith(choice)}
			out, err := RunPasses(in, ps, Options{Verify: true})
			check.NoError(t, err)
			text := script.Print(out)
			for _, l := range names {
				if l != "OIHW" {
					check.True(t, strings.Contains(text, fmt.Sprintf("kernel_layout=%q", l)) || strings.Contains(text, strings.ToLower(l)), l)
				}
			}
			sameResults(t, runMain(t, out, inputs), expect)
		})
	}
	_, err = AlterConvLayoutWith(map[string]string{sites[0].Key: "OIHW16o"})(in)
	check.Error(t, err, `kernel layout "OIHW16o" is not one it can take (OIHW8o, HWIO, OIHW)`, sites[0].Key)
}
