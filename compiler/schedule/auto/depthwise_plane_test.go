package auto

import (
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// planeCases are depthwise convolutions and pooling windows of odd sizes
// the plane rule schedules: strides of 1 and 2, rows that vectors divide,
// rows they do not (padded, or the last vector moved back), a stride-2
// parameter read in place (no padding stage: the plane is a cache read in
// the deinterleaved layout).
func planeCases() []convCase {
	return []convCase{
		{name: "stride2_unpadded_param", n: 1, c: 3, h: 9, w: 13, f: 3, kh: 3, kw: 3, stride: 2, groups: 3, oihw: true, epilogue: "relu6"},
		{name: "stride2_5x5_odd", n: 1, c: 2, h: 11, w: 11, f: 2, kh: 5, kw: 5, stride: 2, pad: 2, groups: 2, oihw: true, epilogue: "bias_relu"},
		{name: "stride1_whole_vectors", n: 1, c: 2, h: 5, w: 32, f: 2, kh: 3, kw: 3, stride: 1, pad: 1, groups: 2, oihw: true, epilogue: "residual"},
		{name: "stride1_3_wide_avx2", n: 2, c: 3, h: 4, w: 3, f: 3, kh: 3, kw: 3, stride: 1, pad: 1, groups: 3, oihw: true, opts: Options{VectorBytes: 32}},
		{name: "stride1_14_wide_avx2_overlap", n: 1, c: 2, h: 5, w: 14, f: 2, kh: 3, kw: 3, stride: 1, pad: 1, groups: 2, oihw: true, epilogue: "residual", opts: Options{VectorBytes: 32}},
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
	for _, want := range []string{"sch.sample_categorical(", "sch.split(", "sch.compute_at("} {
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

// TestChoicesOfDepthwisePlane: the plane rule's choices are valid
// whatever is drawn, on the plane cases and the depthwise convolutions of
// convCases, and each case asks the choices its shape offers (the
// overlap only where no vector of the lanes drawn divides the row).
func TestChoicesOfDepthwisePlane(t *testing.T) {
	cases := planeCases()
	for _, cc := range convCases() {
		if cc.groups > 1 && cc.groups == cc.c && cc.c == cc.f {
			cases = append(cases, cc)
		}
	}
	asked := map[string]bool{}
	planes := 0
	for _, cc := range cases {
		t.Run(cc.name, func(t *testing.T) {
			f := cc.primFunc(t)
			_, rule, err := FuncRule(f, cc.opts)
			check.NoError(t, err)
			if rule != RuleDepthwisePlane {
				return
			}
			planes++
			sites := checkChoices(t, f, cc.opts, 6)
			for _, s := range sites {
				check.True(t, strings.HasPrefix(s, "plane/"), "site %q", s)
				asked[s[strings.LastIndex(s, "/")+1:]] = true
			}
			check.True(t, slices.ContainsFunc(sites, func(s string) bool { return strings.HasSuffix(s, "/lanes") }), "lanes asked: %v", sites)
			check.True(t, slices.ContainsFunc(sites, func(s string) bool { return strings.HasSuffix(s, "/unroll_ry") }), "unroll_ry asked: %v", sites)
		})
	}
	check.True(t, planes >= len(planeCases()), "%d cases take the plane rule", planes)
	for _, what := range []string{"lanes", "overlap", "vectors", "rows", "unroll_ry", "loads_in_registers", "parallel", "phase_outer"} {
		check.True(t, asked[what], "no case asked %q: %v", what, asked)
	}
}

// TestDepthwisePlaneOverlap: a row that no vector divides is stored
// where it belongs, its last vector moved back (no padded output, no
// copy), and one padded to whole vectors when the overlap is declined.
func TestDepthwisePlaneOverlap(t *testing.T) {
	cc := convCase{n: 1, c: 3, h: 6, w: 28, f: 3, kh: 3, kw: 3, stride: 1, pad: 1, groups: 3, oihw: true, epilogue: "relu6"}
	f := cc.primFunc(t)
	for _, overlap := range []int64{1, 0} {
		d := &fixed{values: map[string]int64{"lanes": 16, "overlap": overlap}}
		a, err := Apply(f, Options{Decide: d})
		check.NoError(t, err)
		check.Equal(t, a.Rule, RuleDepthwisePlane)
		text := strings.Join(a.Trace, "\n")
		check.Equal(t, strings.Contains(text, "sch.split_overlap("), overlap == 1, "split_overlap in the trace:\n", text)
		check.Equal(t, strings.Contains(text, "sch.pad_einsum("), overlap == 0, "pad_einsum in the trace:\n", text)
		padded := slices.ContainsFunc(rootAllocs(a.Func), func(n string) bool { return strings.HasSuffix(n, "_pad") })
		check.Equal(t, padded, overlap == 0, "padded buffers %v", rootAllocs(a.Func))
		sameOutput(t, f, a.Func, 1e-4)
	}
}

// fixed is a Decider that answers the sites whose last part it has a
// value for with that value (when it is a candidate), the others with
// the rule's pick.
type fixed struct{ values map[string]int64 }

func (p *fixed) Choose(s *schedule.Schedule, site string, cands []int64, def int) (int64, error) {
	i := def
	if v, ok := p.values[site[strings.LastIndex(site, "/")+1:]]; ok && slices.Contains(cands, v) {
		i = slices.Index(cands, v)
	}
	return s.SampleCategorical(nil, cands, Uniform(len(cands)), i)
}

// picks is a Decider that takes the rule's pick at every site and
// records it by the site's last part.
type picks map[string]int64

func (p picks) Choose(s *schedule.Schedule, site string, cands []int64, def int) (int64, error) {
	p[site[strings.LastIndex(site, "/")+1:]] = cands[def]
	return s.SampleCategorical(nil, cands, Uniform(len(cands)), def)
}

// TestDepthwisePlaneDefaultTile: with 16 vector registers (AVX2), the
// default tile of a 56-wide 3×3 depthwise convolution is a column of
// one vector over eight rows with the window's rows unrolled, whose rows
// share the loads of the plane (planeTileCost), not a row of seven
// vectors that loads each tap's vectors anew; the rows are unrolled by
// default only when a tile has more than one.
func TestDepthwisePlaneDefaultTile(t *testing.T) {
	avx2 := Options{VectorBytes: 32, VectorRegisters: 16}
	for _, tc := range []struct {
		name                  string
		cc                    convCase
		vectors, rows, unroll int64 // 0: not asked (one candidate)
	}{
		{"56_wide", convCase{n: 1, c: 2, h: 56, w: 56, f: 2, kh: 3, kw: 3, stride: 1, pad: 1, groups: 2, oihw: true, opts: avx2}, 1, 8, 1},
		{"7_wide", convCase{n: 1, c: 2, h: 7, w: 7, f: 2, kh: 3, kw: 3, stride: 1, pad: 1, groups: 2, oihw: true, opts: avx2}, 0, 7, 1},
		{"one_row", convCase{n: 1, c: 2, h: 1, w: 34, f: 2, kh: 1, kw: 3, stride: 1, groups: 2, oihw: true, opts: avx2}, 4, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.cc.primFunc(t)
			p := picks{}
			opts := tc.cc.opts
			opts.Decide = p
			a, err := Apply(f, opts)
			check.NoError(t, err)
			check.Equal(t, a.Rule, RuleDepthwisePlane)
			check.Equal(t, p["lanes"], int64(8))
			check.Equal(t, p["vectors"], tc.vectors, p)
			check.Equal(t, p["rows"], tc.rows, p)
			if tc.cc.kh > 1 {
				check.Equal(t, p["unroll_ry"], tc.unroll, p)
			}
			sameOutput(t, f, a.Func, 1e-4)
		})
	}
	// The cost that picks it: a row of the plane's seven vectors costs
	// more than a column of eight rows.
	cc := convCase{n: 1, c: 2, h: 56, w: 56, f: 2, kh: 3, kw: 3, stride: 1, pad: 1, groups: 2, oihw: true}
	_, d, err := matchPlaneFunc(cc.primFunc(t), findRowConvs(cc.primFunc(t))[0])
	check.NoError(t, err)
	check.True(t, d.planeTileCost(8, 1, 8) < d.planeTileCost(8, 7, 1), "a column of 8 rows costs", d.planeTileCost(8, 1, 8), "a row of 7 vectors", d.planeTileCost(8, 7, 1))
}

// TestDepthwisePlaneLoadsInRegisters: with the window's rows unrolled,
// the tile's loop is annotated to keep the loads its rows share in
// registers by default where the tile's registers (tileRegisters) fit:
// AVX-512's 8-row column of a 56-wide 3×3 plane with a Clip, not AVX2's
// 16 registers, nor a SiLU's constants beside it, nor a 7×7 window;
// either way, and drawn either way, the function computes the same,
// interpreted and compiled to C (where the annotated loads are
// kiln_vload_reg).
func TestDepthwisePlaneLoadsInRegisters(t *testing.T) {
	const key = `"` + ir.AttrVectorLoadsInRegisters + `", True`
	avx512 := Options{VectorBytes: 64, VectorRegisters: 32}
	avx2 := Options{VectorBytes: 32, VectorRegisters: 16}
	cc := convCase{n: 1, c: 2, h: 16, w: 56, f: 2, kh: 3, kw: 3, stride: 1, pad: 1, groups: 2, oihw: true, epilogue: "relu6"}
	f := cc.primFunc(t)
	var fs []*ir.PrimFunc
	var opts []Options
	for _, tc := range []struct {
		name string
		opts Options
		want int64
	}{{"avx512", avx512, 1}, {"avx2", avx2, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			p := picks{}
			o := tc.opts
			o.Decide = p
			a, err := Apply(f, o)
			check.NoError(t, err)
			check.Equal(t, a.Rule, RuleDepthwisePlane)
			check.Equal(t, p["unroll_ry"], int64(1), p)
			check.Equal(t, p["loads_in_registers"], tc.want, p)
			check.Equal(t, strings.Contains(strings.Join(a.Trace, "\n"), key), tc.want == 1, "the annotation in the trace:\n", strings.Join(a.Trace, "\n"))
			for _, on := range []int64{0, 1} {
				o := tc.opts
				o.Decide = &fixed{values: map[string]int64{"loads_in_registers": on}}
				a, err := Apply(f, o)
				check.NoError(t, err)
				check.Equal(t, strings.Contains(strings.Join(a.Trace, "\n"), key), on == 1)
				sameOutput(t, f, a.Func, 1e-4)
				fs, opts = append(fs, f), append(opts, o)
			}
		})
	}
	for _, tc := range []struct {
		name      string
		cc        convCase
		registers int64
	}{
		{"3x3_clip", cc, 8 + 7*3 + 2},
		{"3x3_silu", convCase{n: 1, c: 2, h: 16, w: 56, f: 2, kh: 3, kw: 3, stride: 1, pad: 1, groups: 2, oihw: true, epilogue: "silu"}, 8 + 7*3 + 12},
		{"7x7", convCase{n: 1, c: 2, h: 16, w: 56, f: 2, kh: 7, kw: 7, stride: 1, pad: 3, groups: 2, oihw: true, epilogue: "bias_relu"}, 8 + 7*7 + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.cc.primFunc(t)
			_, d, err := matchPlaneFunc(f, findRowConvs(f)[0])
			check.NoError(t, err)
			check.Equal(t, d.tileRegisters(8, 1, true), tc.registers)
			p := picks{}
			a, err := Apply(f, Options{VectorBytes: 64, VectorRegisters: 32, Decide: p})
			check.NoError(t, err)
			check.Equal(t, a.Rule, RuleDepthwisePlane)
			if p["rows"] == 8 && p["vectors"] <= 1 {
				check.Equal(t, p["loads_in_registers"], map[bool]int64{true: 1, false: 0}[tc.registers <= 32], p)
			}
			sameOutput(t, f, a.Func, 1e-4)
		})
	}
	if testing.Short() {
		return
	}
	src, funcs := scheduledSource(t, "pinned", fs, opts)
	check.True(t, strings.Contains(src, "kiln_vload_reg_float32x16(&") && strings.Contains(src, "kiln_vload_reg_float32x8(&"), "loads kept in registers")
	checkCompiled(t, src, funcs)
}
