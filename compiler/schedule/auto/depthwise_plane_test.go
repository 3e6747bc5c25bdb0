package auto

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// planeCases are depthwise convolutions and pooling windows of odd sizes
// the plane rule schedules: strides of 1 and 2, rows that vectors divide
// and rows they do not, a stride-2 parameter read in place (no padding
// stage: the plane is a cache read in the deinterleaved layout).
func planeCases() []convCase {
	return []convCase{
		{name: "stride2_unpadded_param", n: 1, c: 3, h: 9, w: 13, f: 3, kh: 3, kw: 3, stride: 2, groups: 3, oihw: true, epilogue: "relu6"},
		{name: "stride2_5x5_odd", n: 1, c: 2, h: 11, w: 11, f: 2, kh: 5, kw: 5, stride: 2, pad: 2, groups: 2, oihw: true, epilogue: "bias_relu"},
		{name: "stride1_whole_vectors", n: 1, c: 2, h: 5, w: 32, f: 2, kh: 3, kw: 3, stride: 1, pad: 1, groups: 2, oihw: true, epilogue: "residual"},
		{name: "stride1_3_wide_avx2", n: 2, c: 3, h: 4, w: 3, f: 3, kh: 3, kw: 3, stride: 1, pad: 1, groups: 3, oihw: true, opts: Options{VectorBytes: 32}},
		{name: "stride2_parallel", n: 1, c: 4, h: 7, w: 9, f: 4, kh: 3, kw: 3, stride: 2, pad: 1, groups: 4, oihw: true, epilogue: "relu6", opts: Options{ParallelFlops: 1}},
	}
}

// TestDepthwisePlane checks the plane rule's schedules against the
// unscheduled functions in the interpreter, and that each one's trace
// replays on the function to the same scheduled function.
func TestDepthwisePlane(t *testing.T) {
	for _, cc := range planeCases() {
		t.Run(cc.name, func(t *testing.T) {
			f := cc.primFunc(t)
			g, rule, err := FuncRule(f, cc.opts)
			check.NoError(t, err)
			check.Equal(t, rule, RuleDepthwisePlane)
			check.NoError(t, ir.Verify(g))
			nearSlices(t, outputOf(t, g), outputOf(t, f))
			checkPlaneTrace(t, f, cc.opts)
		})
	}
	for _, pc := range poolCases() {
		if pc.plane {
			t.Run("pool_"+pc.name, func(t *testing.T) { checkPlaneTrace(t, pc.primFunc(t), Options{}) })
		}
	}
}

// checkPlaneTrace replays the plane rule's trace on f: the same function,
// with the rule's decisions (lanes, rows of the tile) in the trace.
func checkPlaneTrace(t *testing.T, f *ir.PrimFunc, opts Options) {
	t.Helper()
	cs := findRowConvs(f)
	check.Equal(t, len(cs), 1)
	s, err := depthwisePlaneSchedule(f, cs[0], opts.withDefaults())
	check.NoError(t, err)
	trace := s.Trace()
	text := strings.Join(trace, "\n")
	for _, want := range []string{"sch.sample_categorical(", "sch.sample_perfect_tile(", "sch.pad_einsum(", "sch.compute_at("} {
		check.True(t, strings.Contains(text, want), want, "in the trace:\n", text)
	}
	r, err := schedule.Replay(f, trace)
	check.NoError(t, err)
	if !ir.StructuralEqual(r.Func(), s.Func()) {
		t.Fatalf("the replayed trace gives another function:\n%s\nwant\n%s", script.Print(r.Func()), script.Print(s.Func()))
	}
}

// TestDepthwisePlaneCompiled compiles the plane cases to C and checks them
// against the interpreter.
func TestDepthwisePlaneCompiled(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C")
	}
	var fs []*ir.PrimFunc
	var opts []Options
	for _, cc := range planeCases() {
		fs, opts = append(fs, cc.primFunc(t)), append(opts, cc.opts)
	}
	src, funcs := scheduledSource(t, "plane", fs, opts)
	if i := strings.Index(src, "_local["); i >= 0 {
		t.Fatalf("an accumulator tile was left in memory: %s", src[max(0, i-3000):i+200])
	}
	checkCompiled(t, src, funcs)
}
