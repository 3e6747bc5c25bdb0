package auto

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/ckernel"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// stemCases are first convolutions: few input channels, mostly of stride
// 2, at sizes the interpreter runs quickly.
func stemCases() []convCase {
	return []convCase{
		// squeezenet1_1's (3×3/2, no padding), rows of 18: a tile
		// overlapping the one before it.
		{name: "squeezenet_like", n: 1, c: 3, h: 9, w: 37, f: 64, kh: 3, kw: 3, stride: 2, block: 32, epilogue: "bias_relu", opts: Options{ParallelFlops: 1}},
		// mobilenet_v2's (3×3/2, padding 1, Clip).
		{name: "mobilenet_like", n: 1, c: 3, h: 9, w: 41, f: 32, kh: 3, kw: 3, stride: 2, pad: 1, block: 32, epilogue: "relu6"},
		// resnet18's (7×7/2, padding 3), an odd height.
		{name: "resnet_like", n: 1, c: 3, h: 9, w: 45, f: 64, kh: 7, kw: 7, stride: 2, pad: 3, block: 32, epilogue: "bias_relu", opts: Options{ParallelFlops: 1}},
		{name: "hwio_residual_batch2", n: 2, c: 2, h: 9, w: 20, f: 24, kh: 3, kw: 3, stride: 2, pad: 1, epilogue: "residual"},
		{name: "stride1_rows_of_5", n: 1, c: 4, h: 6, w: 7, f: 16, kh: 3, kw: 3, stride: 1, epilogue: "bias_relu"},
		{name: "kernel_2x3_stride2", n: 1, c: 1, h: 8, w: 26, f: 8, kh: 2, kw: 3, stride: 2, pad: 1, block: 8},
		{name: "avx2", n: 1, c: 3, h: 11, w: 35, f: 32, kh: 3, kw: 3, stride: 2, pad: 1, block: 16, epilogue: "bias_relu", opts: Options{VectorBytes: 32}},
		{name: "int32", n: 1, c: 3, h: 9, w: 40, f: 16, kh: 3, kw: 3, stride: 2, int32: true, epilogue: "relu6", opts: Options{ParallelFlops: 1}},
		// A kernel in OHWI blocks of 8 channels, tiles of 16.
		{name: "ohwi8o", n: 1, c: 3, h: 9, w: 30, f: 16, kh: 3, kw: 3, stride: 2, pad: 1, block: 8, ohwi: true, epilogue: "bias_relu"},
		// ConvNeXt's patchify stem (4×4, stride 4: four phases).
		{name: "patchify_4x4_stride4", n: 1, c: 3, h: 12, w: 44, f: 24, kh: 4, kw: 4, stride: 4, block: 8, epilogue: "bias_relu", opts: Options{ParallelFlops: 1}},
	}
}

// TestStem checks that first convolutions take the stem rule and agree
// with the unscheduled function in the interpreter.
func TestStem(t *testing.T) {
	for _, cc := range stemCases() {
		t.Run(cc.name, func(t *testing.T) {
			f := cc.primFunc(t)
			g, ok := scheduleChecked(t, f, cc.opts, true)
			check.True(t, ok)
			a, err := Apply(f, cc.opts)
			check.NoError(t, err)
			check.Equal(t, a.Rule, RuleConvStem)
			check.True(t, len(a.Trace) > 0, "the stem rule's schedule is a trace")
			// The padded input, or a copy in phases of the stride, is
			// computed for each row of the output.
			tr := strings.Join(a.Trace, "\n")
			if cc.pad > 0 || cc.stride > 1 {
				check.True(t, strings.Contains(tr, "sch.compute_at("), "a strip per row: ", tr)
			}
			if cc.stride > 1 {
				check.True(t, strings.Contains(tr, fmt.Sprintf("i3 %% %d, i2, i3 // %d)", cc.stride, cc.stride)), "phases of the stride: ", tr)
			}
			nearSlices(t, outputOf(t, g), outputOf(t, f))
		})
	}
	// Rows narrower than a vector of 4, and many input channels, are not
	// stems.
	for _, cc := range []convCase{
		{n: 1, c: 3, h: 7, w: 7, f: 16, kh: 3, kw: 3, stride: 2, epilogue: "bias_relu"},
		{n: 1, c: 8, h: 9, w: 20, f: 16, kh: 3, kw: 3, stride: 2, epilogue: "bias_relu"},
	} {
		_, rule, err := FuncRule(cc.primFunc(t), cc.opts)
		check.NoError(t, err)
		check.True(t, rule != RuleConvStem, "not a stem: ", cc.c, "channels, rows of ", cc.w)
	}
}

func TestStemTile(t *testing.T) {
	for _, c := range []struct{ x, f, maxLanes, lanes, fi, xv int64 }{
		// squeezenet1_1's rows of 111: seven vectors of 16, the last
		// overlapping.
		{111, 64, 16, 16, 16, 1},
		// resnet18's and mobilenet_v2's 112.
		{112, 64, 16, 16, 16, 1},
		{112, 32, 16, 16, 16, 1},
		// Rows of whole vectors take them at once when the channels allow.
		{32, 64, 16, 16, 16, 1},
		{48, 64, 16, 16, 8, 3},
		{5, 24, 16, 4, 12, 1},
		{18, 64, 8, 8, 16, 1},
	} {
		lanes, fi, xv, ok := stemDefaultTile(c.x, c.f, c.maxLanes, Options{}.withDefaults().accumulators())
		check.True(t, ok)
		check.Equal(t, [3]int64{lanes, fi, xv}, [3]int64{c.lanes, c.fi, c.xv}, c.x, "×", c.f)
	}
	_, _, _, ok := stemDefaultTile(3, 16, 16, Options{}.withDefaults().accumulators())
	check.True(t, !ok, "rows of 3")
}

// TestStemCompiled compiles the stems, the three models' among them, and
// checks them against the unscheduled functions compiled alike.
func TestStemCompiled(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C")
	}
	cases := append(stemCases(),
		convCase{name: "squeezenet1_1", n: 1, c: 3, h: 224, w: 224, f: 64, kh: 3, kw: 3, stride: 2, block: 32, epilogue: "bias_relu"},
		convCase{name: "mobilenet_v2", n: 1, c: 3, h: 224, w: 224, f: 32, kh: 3, kw: 3, stride: 2, pad: 1, block: 32, epilogue: "relu6"},
		convCase{name: "resnet18", n: 1, c: 3, h: 224, w: 224, f: 64, kh: 7, kw: 7, stride: 2, pad: 3, block: 32, epilogue: "bias_relu"},
	)
	var fs []*ir.PrimFunc
	var opts []Options
	for _, cc := range cases {
		fs, opts = append(fs, cc.primFunc(t)), append(opts, cc.opts)
	}
	checkAgainstUnscheduled(t, "stem", fs, opts)
}

// checkAgainstUnscheduled compiles fs scheduled and unscheduled into one
// library and checks that each pair agrees on the same random inputs.
func checkAgainstUnscheduled(t *testing.T, prefix string, fs []*ir.PrimFunc, opts []Options) {
	t.Helper()
	mod := ir.NewIRModule()
	for i, f := range fs {
		g, ok, err := Func(f, opts[i])
		check.NoError(t, err)
		check.True(t, ok, "scheduled", i)
		name := fmt.Sprintf("%s%d", prefix, i)
		mod = mod.With(name, g.WithAttr(ir.AttrGlobalSymbol, name))
		mod = mod.With(name+"_ref", f.WithAttr(ir.AttrGlobalSymbol, name+"_ref"))
	}
	m := ckernel.Load(t, ckernel.Source(t, mod), "-O1")
	for i, f := range fs {
		name := fmt.Sprintf("%s%d", prefix, i)
		t.Run(name, func(t *testing.T) { nearSlices(t, runCompiled(t, m, name, f), runCompiled(t, m, name+"_ref", f)) })
	}
}

// runCompiled calls function name of m on random inputs for f (the same
// as outputOf's) and returns its output.
func runCompiled(t *testing.T, m *cpu.Module, name string, f *ir.PrimFunc) []float32 {
	t.Helper()
	args := randomArgs(t, f, 7)
	vals := make([]packedfunc.Value, len(args))
	for i, a := range args {
		vals[i] = packedfunc.Array(a.(*ndarray.NDArray))
	}
	fn, err := m.GetFunction(name)
	check.NoError(t, err)
	_, err = fn.Call(vals...)
	check.NoError(t, err)
	out, err := ndarray.ToSlice[float32](args[len(args)-1].(*ndarray.NDArray))
	check.NoError(t, err)
	return out
}

// TestChoicesOfStem: the stem rule's choices are valid whatever is
// drawn, and each is asked where it has more than one candidate.
func TestChoicesOfStem(t *testing.T) {
	cases := stemCases()
	draws := 3
	if testing.Short() {
		draws = 2
	}
	all := map[string]bool{}
	for _, cc := range cases {
		if testing.Short() && cc.kh*cc.kw*cc.f > 1000 {
			continue // resnet_like: the interpreter takes seconds a run
		}
		t.Run(cc.name, func(t *testing.T) {
			for _, s := range checkChoices(t, cc.primFunc(t), cc.opts, draws) {
				all[s[strings.LastIndex(s, "/")+1:]] = true
			}
		})
	}
	for _, what := range []string{"lanes", "vectors", "channels", "rows", "pack", "unroll", "parallel"} {
		check.True(t, all[what], "no case asked for the stem's ", what)
	}
}
