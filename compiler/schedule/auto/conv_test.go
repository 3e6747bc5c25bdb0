package auto

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/compiler/topi"
	"github.com/kiln-ml/kiln/internal/check"
)

// convCase is a convolution over NCHW data with an HWIO kernel (what
// AlterConvLayout gives the graph), followed by an epilogue as FuseTIR
// leaves it: one block per operator.
type convCase struct {
	name              string
	n, c, h, w, f     int64
	kh, kw            int64
	stride, pad       int64
	groups            int64
	oihw              bool  // the kernel in OIHW (depthwise, grouped)
	block             int64 // the kernel in OIHW (OHWI with ohwi) with blocks of this many output channels
	ohwi              bool
	epilogue          string // "", "bias_relu", "residual", "relu6", "mean"
	slice             int64  // the first slice output channels only (a padded kernel)
	int32             bool   // te.Shape's int32 dimensions
	opts              Options
	scheduled, inTile bool // inTile: the epilogue runs on the register tile
}

func (cc convCase) primFunc(t *testing.T) *ir.PrimFunc {
	t.Helper()
	g := max(cc.groups, 1)
	dims := ir.Dims
	if cc.int32 {
		dims = te.Shape
	}
	x := te.Placeholder(dims(cc.n, cc.c, cc.h, cc.w), ir.Float32, "x")
	w := te.Placeholder(dims(cc.kh, cc.kw, cc.c/g, cc.f), ir.Float32, "w")
	kl := "HWIO"
	if cc.oihw {
		w, kl = te.Placeholder(dims(cc.f, cc.c/g, cc.kh, cc.kw), ir.Float32, "w"), "OIHW"
	}
	switch {
	case cc.block > 0 && cc.ohwi:
		w, kl = te.Placeholder(dims(cc.f/cc.block, cc.kh, cc.kw, cc.c, cc.block), ir.Float32, "w"), fmt.Sprintf("OHWI%do", cc.block)
	case cc.block > 0:
		w, kl = te.Placeholder(dims(cc.f/cc.block, cc.c, cc.kh, cc.kw, cc.block), ir.Float32, "w"), fmt.Sprintf("OIHW%do", cc.block)
	}
	args := []*te.Tensor{x, w}
	y, err := topi.Conv2D(x, w, topi.Conv2DAttrs{
		Strides: [2]int64{cc.stride, cc.stride}, Padding: [4]int64{cc.pad, cc.pad, cc.pad, cc.pad},
		Groups: g, KernelLayout: kl, OutLayout: "NCHW",
	})
	check.NoError(t, err)
	f := cc.f
	if cc.slice > 0 {
		y, err = topi.StridedSlice(y, []int64{1}, []int64{0}, []int64{cc.slice}, nil)
		check.NoError(t, err)
		f = cc.slice
	}
	switch cc.epilogue {
	case "bias_relu", "residual", "relu6":
		b := te.Placeholder(dims(1, f, 1, 1), ir.Float32, "b")
		args = append(args, b)
		y, err = topi.Add(y, b)
		check.NoError(t, err)
		if cc.epilogue == "residual" {
			r := te.Placeholder(y.Shape, ir.Float32, "r")
			args = append(args, r)
			sum := y
			y = te.Compute(y.Shape, func(i []ir.Expr) ir.Expr { return ir.Add(sum.At(i...), r.At(i...)) }, "T_add_residual")
			check.NoError(t, y.Err())
		}
		if cc.epilogue == "relu6" {
			y, err = topi.Clip(y, ir.Const(ir.Float32, 0), ir.Const(ir.Float32, 6))
		} else {
			y, err = topi.Relu(y)
		}
		check.NoError(t, err)
	case "silu": // efficientnet_b0's: y·sigmoid(y) after the bias
		b := te.Placeholder(dims(1, f, 1, 1), ir.Float32, "b")
		args = append(args, b)
		y, err = topi.Add(y, b)
		check.NoError(t, err)
		sig, err := topi.Sigmoid(y)
		check.NoError(t, err)
		y, err = topi.Multiply(y, sig)
		check.NoError(t, err)
	case "mean":
		y, err = topi.Mean(y, []int64{2, 3}, true)
		check.NoError(t, err)
	}
	fn, err := te.CreatePrimFunc(append(args, y))
	check.NoError(t, err)
	return fn
}

func convCases() []convCase {
	return []convCase{
		{name: "3x3_pad1_odd_width", n: 1, c: 8, h: 9, w: 9, f: 32, kh: 3, kw: 3, stride: 1, pad: 1, epilogue: "bias_relu", scheduled: true, inTile: true},
		{name: "residual", n: 1, c: 4, h: 6, w: 8, f: 16, kh: 3, kw: 3, stride: 1, pad: 1, epilogue: "residual", scheduled: true, inTile: true},
		{name: "7x7_stride2_pad3", n: 1, c: 3, h: 13, w: 11, f: 16, kh: 7, kw: 7, stride: 2, pad: 3, epilogue: "bias_relu", scheduled: true, inTile: true},
		{name: "1x1_48_channels", n: 1, c: 16, h: 5, w: 7, f: 48, kh: 1, kw: 1, stride: 1, epilogue: "relu6", scheduled: true, inTile: true},
		{name: "1x1_stride2_batch2", n: 2, c: 8, h: 7, w: 7, f: 32, kh: 1, kw: 1, stride: 2, scheduled: true, inTile: true},
		{name: "24_channels_8_lanes", n: 1, c: 5, h: 4, w: 13, f: 24, kh: 3, kw: 1, stride: 1, pad: 1, epilogue: "bias_relu", scheduled: true, inTile: true},
		{name: "20_channels_4_lanes", n: 1, c: 3, h: 5, w: 5, f: 20, kh: 2, kw: 2, stride: 1, scheduled: true, inTile: true},
		{name: "avx2", n: 1, c: 4, h: 8, w: 12, f: 32, kh: 3, kw: 3, stride: 1, pad: 1, epilogue: "bias_relu", opts: Options{VectorBytes: 32}, scheduled: true, inTile: true},
		{name: "parallel", n: 1, c: 8, h: 10, w: 10, f: 32, kh: 3, kw: 3, stride: 1, pad: 1, epilogue: "residual", opts: Options{ParallelFlops: 1}, scheduled: true, inTile: true},
		{name: "parallel_int32", n: 1, c: 8, h: 10, w: 10, f: 32, kh: 3, kw: 3, stride: 1, pad: 1, int32: true, opts: Options{ParallelFlops: 1}, scheduled: true, inTile: true},
		{name: "blocks_of_32", n: 1, c: 8, h: 9, w: 7, f: 64, kh: 3, kw: 3, stride: 1, pad: 1, block: 32, epilogue: "bias_relu", opts: Options{ParallelFlops: 1}, scheduled: true, inTile: true},
		{name: "blocks_of_32_residual", n: 1, c: 5, h: 6, w: 14, f: 32, kh: 3, kw: 3, stride: 2, pad: 1, block: 32, epilogue: "residual", scheduled: true, inTile: true},
		{name: "blocks_ohwi", n: 1, c: 6, h: 5, w: 7, f: 32, kh: 3, kw: 2, stride: 1, pad: 1, block: 16, ohwi: true, epilogue: "bias_relu", scheduled: true, inTile: true},
		{name: "blocks_of_8_1x1", n: 1, c: 16, h: 5, w: 13, f: 40, kh: 1, kw: 1, stride: 1, block: 8, epilogue: "relu6", scheduled: true, inTile: true},
		{name: "blocks_of_64_in_tiles", n: 1, c: 4, h: 4, w: 7, f: 128, kh: 3, kw: 3, stride: 1, pad: 1, block: 64, epilogue: "bias_relu", scheduled: true, inTile: true},
		{name: "blocks_prime_row", n: 1, c: 4, h: 3, w: 13, f: 32, kh: 3, kw: 3, stride: 1, pad: 1, block: 32, epilogue: "residual", scheduled: true, inTile: true},
		{name: "blocks_avx2", n: 1, c: 4, h: 5, w: 6, f: 32, kh: 3, kw: 3, stride: 1, pad: 1, block: 16, epilogue: "bias_relu", opts: Options{VectorBytes: 32}, scheduled: true, inTile: true},
		// AVX2's 2 vectors × 5 positions over a row of 14: the last tile
		// overlaps the one before.
		{name: "blocks_avx2_overlap", n: 1, c: 5, h: 4, w: 14, f: 32, kh: 3, kw: 3, stride: 1, pad: 1, block: 32, epilogue: "residual", opts: Options{VectorBytes: 32, ParallelFlops: 1}, scheduled: true, inTile: true},
		{name: "mean_after", n: 1, c: 4, h: 6, w: 6, f: 16, kh: 3, kw: 3, stride: 1, pad: 1, epilogue: "mean", scheduled: true},
		{name: "6_channels", n: 1, c: 5, h: 6, w: 6, f: 6, kh: 3, kw: 3, stride: 1, pad: 1},
		// No epilogue: the generic rule would inline one (not a convolution schedule).
		{name: "groups_6_wide", n: 1, c: 8, h: 6, w: 6, f: 16, kh: 3, kw: 3, stride: 1, pad: 1, groups: 2},
		{name: "depthwise_rows_of_16", n: 1, c: 6, h: 5, w: 16, f: 6, kh: 3, kw: 3, stride: 1, pad: 1, groups: 6, oihw: true, epilogue: "relu6", scheduled: true, inTile: true},
		{name: "depthwise_rows_of_24", n: 1, c: 3, h: 4, w: 24, f: 3, kh: 3, kw: 3, stride: 1, pad: 1, groups: 3, oihw: true, epilogue: "bias_relu", opts: Options{ParallelFlops: 1}, scheduled: true, inTile: true},
		{name: "grouped_rows_of_12", n: 2, c: 4, h: 3, w: 12, f: 6, kh: 2, kw: 3, stride: 1, pad: 1, groups: 2, oihw: true, epilogue: "residual", scheduled: true, inTile: true},
		{name: "oihw_1x1_rows_of_32", n: 1, c: 5, h: 3, w: 32, f: 12, kh: 1, kw: 1, stride: 1, oihw: true, epilogue: "relu6", scheduled: true, inTile: true},
		// Pointwise convolutions over the flattened plane (pointwise.go):
		// planes no tile divides end with an overlapping tile.
		{name: "pointwise_55_plane", n: 1, c: 16, h: 5, w: 11, f: 64, kh: 1, kw: 1, stride: 1, oihw: true, epilogue: "bias_relu", scheduled: true, inTile: true},
		{name: "pointwise_residual_batch2", n: 2, c: 7, h: 3, w: 13, f: 24, kh: 1, kw: 1, stride: 1, oihw: true, epilogue: "residual", opts: Options{ParallelFlops: 1}, scheduled: true, inTile: true},
		{name: "pointwise_avx2", n: 1, c: 4, h: 3, w: 5, f: 12, kh: 1, kw: 1, stride: 1, oihw: true, epilogue: "relu6", opts: Options{VectorBytes: 32}, scheduled: true, inTile: true},
		// 58 channels (2·29): tiles of channels that do not divide
		// them, the last moved back.
		{name: "pointwise_prime_channels", n: 1, c: 6, h: 7, w: 7, f: 58, kh: 1, kw: 1, stride: 1, oihw: true, epilogue: "bias_relu", opts: Options{VectorBytes: 32, ParallelFlops: 1}, scheduled: true, inTile: true},
		// An input too large to read once per tile of channels: tiles
		// of positions outside, a last tile of two vectors.
		// (16 channels × 8 vectors of 16 = 8 KiB, over an L2 of 4 KiB).
		{name: "pointwise_streaming_plane", n: 1, c: 16, h: 8, w: 16, f: 12, kh: 1, kw: 1, stride: 1, oihw: true, epilogue: "relu6", opts: Options{ParallelFlops: 1, L2Bytes: 4 << 10}, scheduled: true, inTile: true},
		{name: "pointwise_6_positions", n: 1, c: 3, h: 2, w: 3, f: 5, kh: 1, kw: 1, stride: 1, oihw: true, scheduled: true, inTile: true},
		{name: "pointwise_int32", n: 1, c: 9, h: 4, w: 9, f: 20, kh: 1, kw: 1, stride: 1, oihw: true, int32: true, epilogue: "bias_relu", opts: Options{ParallelFlops: 1}, scheduled: true, inTile: true},
		{name: "oihw_3x3_rows_of_16", n: 2, c: 3, h: 4, w: 16, f: 7, kh: 3, kw: 3, stride: 1, pad: 1, oihw: true, epilogue: "residual", opts: Options{ParallelFlops: 1}, scheduled: true, inTile: true},
		{name: "oihw_rows_mean_after", n: 1, c: 3, h: 5, w: 8, f: 5, kh: 3, kw: 3, stride: 1, pad: 1, oihw: true, epilogue: "mean", scheduled: true},
		// Pointwise convolutions over a kernel in panels of 8 output
		// channels (OIHW8o) take the plane too, a tile per panel; only
		// the channels a slice keeps are computed.
		{name: "panels_13x13", n: 1, c: 24, h: 13, w: 13, f: 32, kh: 1, kw: 1, stride: 1, block: 8, epilogue: "bias_relu", opts: Options{ParallelFlops: 1}, scheduled: true, inTile: true},
		{name: "panels_sliced", n: 1, c: 9, h: 13, w: 13, f: 32, kh: 1, kw: 1, stride: 1, block: 8, slice: 24, epilogue: "bias_relu", scheduled: true, inTile: true},
		{name: "panels_residual_batch2", n: 2, c: 7, h: 9, w: 15, f: 16, kh: 1, kw: 1, stride: 1, block: 8, epilogue: "residual", opts: Options{ParallelFlops: 1}, scheduled: true, inTile: true},
		{name: "panels_avx2", n: 1, c: 5, h: 3, w: 5, f: 16, kh: 1, kw: 1, stride: 1, block: 8, opts: Options{VectorBytes: 32}, scheduled: true, inTile: true},
		// A 14×14 plane in panels of 8, its last tile overlapping.
		{name: "panels_14x14_residual", n: 1, c: 16, h: 14, w: 14, f: 32, kh: 1, kw: 1, stride: 1, block: 8, epilogue: "residual", opts: Options{ParallelFlops: 1}, scheduled: true, inTile: true},
		// Depthwise rows no vector divides, or of stride 2: a plane per
		// channel (depthwise_plane.go).
		{name: "depthwise_stride2", n: 1, c: 4, h: 9, w: 16, f: 4, kh: 3, kw: 3, stride: 2, pad: 1, groups: 4, oihw: true, scheduled: true, inTile: true},
		{name: "depthwise_7_wide", n: 1, c: 4, h: 7, w: 7, f: 4, kh: 3, kw: 3, stride: 1, pad: 1, groups: 4, oihw: true, scheduled: true, inTile: true},
		{name: "depthwise_14_wide_relu6", n: 1, c: 5, h: 14, w: 14, f: 5, kh: 3, kw: 3, stride: 1, pad: 1, groups: 5, oihw: true, epilogue: "relu6", opts: Options{ParallelFlops: 1}, scheduled: true, inTile: true},
		{name: "depthwise_stride2_odd_residual", n: 2, c: 3, h: 11, w: 13, f: 3, kh: 3, kw: 3, stride: 2, pad: 1, groups: 3, oihw: true, epilogue: "residual", scheduled: true, inTile: true},
		{name: "depthwise_5x5_stride2_28_wide", n: 1, c: 2, h: 9, w: 56, f: 2, kh: 5, kw: 5, stride: 2, pad: 2, groups: 2, oihw: true, epilogue: "bias_relu", scheduled: true, inTile: true},
		{name: "depthwise_no_padding", n: 1, c: 3, h: 6, w: 10, f: 3, kh: 3, kw: 3, stride: 1, groups: 3, oihw: true, epilogue: "relu6", scheduled: true, inTile: true},
		{name: "depthwise_int32", n: 1, c: 3, h: 6, w: 6, f: 3, kh: 3, kw: 3, stride: 1, pad: 1, groups: 3, oihw: true, int32: true, epilogue: "relu6", scheduled: true, inTile: true},
	}
}

// TestConv checks each convolution schedule against the unscheduled
// function in the interpreter, then (below) compiled.
func TestConv(t *testing.T) {
	for _, cc := range convCases() {
		t.Run(cc.name, func(t *testing.T) {
			f := cc.primFunc(t)
			g, ok := scheduleChecked(t, f, cc.opts, cc.scheduled)
			if !ok {
				return
			}
			// On the tile, the epilogue's intermediate buffers are gone
			// (PadEinsum's padded copies and a kernel packed by a cache
			// read, as the stem rule's of a convolution of at most 4
			// input channels, are not the epilogue's).
			allocs := slices.DeleteFunc(rootAllocs(g), func(name string) bool {
				return strings.HasSuffix(name, "_pad") || strings.HasSuffix(name, "_global")
			})
			check.Equal(t, len(allocs) <= 2, cc.inTile, "allocations %v", rootAllocs(g))
			want := outputOf(t, f)
			got := outputOf(t, g)
			nearSlices(t, got, want)
		})
	}
}

// rootAllocs names the buffers the root block allocates.
func rootAllocs(f *ir.PrimFunc) []string {
	var out []string
	ir.Visit(f.Body, func(n ir.Node) bool {
		if b, ok := n.(*ir.Block); ok && b.Name == ir.RootBlockName {
			for _, a := range b.AllocBuffers {
				out = append(out, a.Name)
			}
			return false
		}
		return true
	})
	return out
}

func nearSlices(t *testing.T, got, want []float32) {
	t.Helper()
	check.Equal(t, len(got), len(want))
	for i := range got {
		if d := math.Abs(float64(got[i] - want[i])); d > 1e-4*math.Max(1, math.Abs(float64(want[i]))) {
			t.Fatalf("element %d: got %g, want %g", i, got[i], want[i])
		}
	}
}

// TestConvCompiled compiles the scheduled convolutions to C and checks
// them against the interpreter, and that each accumulator tile became
// variables (vector registers), not an array.
func TestConvCompiled(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C")
	}
	var fs []*ir.PrimFunc
	var opts []Options
	for _, cc := range convCases() {
		if cc.scheduled && !cc.int32 { // int32 loops keep casts in the tile's indices
			fs, opts = append(fs, cc.primFunc(t)), append(opts, cc.opts)
		}
	}
	src, funcs := scheduledSource(t, "conv", fs, opts)
	if i := strings.Index(src, "_local["); i >= 0 {
		t.Fatalf("an accumulator tile was left in memory: %s", src[max(0, i-3000):i+200])
	}
	checkCompiled(t, src, funcs)
}

func TestConvTile(t *testing.T) {
	cases := []struct {
		x, f, maxLanes, regs int64
		lanes, vecs, xi      int64
	}{
		// AVX-512 (32 registers): resnet18's rows in blocks of 32
		// channels; 56 and 28 end with an overlapping tile of 10.
		{56, 32, 16, 32, 16, 2, 10},
		{28, 32, 16, 32, 16, 2, 10},
		{14, 32, 16, 32, 16, 2, 7},
		{7, 32, 16, 32, 16, 2, 7},
		// squeezenet1_1's prime rows: 13 positions of one vector.
		{13, 32, 16, 32, 16, 1, 13},
		{13, 16, 16, 32, 16, 1, 13},
		{13, 8, 16, 32, 8, 1, 13},
		// AVX2 (16 registers): 2 vectors × 5 positions, an overlapping
		// last tile, where a divisor would leave accumulators unused;
		// a row of 7 takes one vector of all 7.
		{56, 32, 8, 16, 8, 2, 5},
		{28, 32, 8, 16, 8, 2, 5},
		{13, 32, 8, 16, 8, 2, 5},
		{7, 32, 8, 16, 8, 1, 7},
		{7, 8, 8, 16, 8, 1, 7},
		// 20 channels: vectors of 4 lanes.
		{55, 20, 8, 16, 4, 1, 8},
	}
	for _, c := range cases {
		lanes, vecs, xi, ok := convTile(c.x, c.f, c.maxLanes, c.regs)
		check.True(t, ok, c.x, c.f)
		check.Equal(t, [3]int64{lanes, vecs, xi}, [3]int64{c.lanes, c.vecs, c.xi}, c.x, "×", c.f, "with", c.regs, "registers")
		// No tile beats the pick; its accumulators and operands fit.
		check.True(t, vecs*xi <= c.regs*3/4 && vecs*xi+vecs+xi-1 <= c.regs, "tile", vecs, "×", xi, "over", c.regs, "registers")
		for v := int64(1); v <= 4; v++ {
			for x := int64(1); (c.f/lanes)%v == 0 && x <= c.x && v*x <= c.regs*3/4 && v*x+v+x-1 <= c.regs; x++ {
				check.True(t, !convBetter(c.x, v, x, vecs, xi), v, "×", x, "beats", vecs, "×", xi, "over", c.x)
			}
		}
	}
	_, _, _, ok := convTile(7, 6, 8, 16)
	check.True(t, !ok, "6 channels take no vector")
}

// TestConvOverlapTile checks that a row no tile of the registers'
// choice divides ends with an overlapping tile (AVX2: 5 positions over
// 14), and that a row one divides does not.
func TestConvOverlapTile(t *testing.T) {
	for _, c := range []struct {
		w       int64
		overlap string
	}{{14, "sch.split_overlap("}, {10, ""}} {
		cc := convCase{n: 1, c: 5, h: 4, w: c.w, f: 32, kh: 3, kw: 3, stride: 1, pad: 1, block: 32, opts: Options{VectorBytes: 32}}
		a, err := Apply(cc.primFunc(t), cc.opts)
		check.NoError(t, err)
		check.Equal(t, a.Rule, RuleConv)
		trace := strings.Join(a.Trace, "\n")
		check.Equal(t, strings.Contains(trace, "sch.split_overlap("), c.overlap != "", "row of", c.w, trace)
		check.True(t, strings.Contains(trace, "factors=[-1, 5]") || strings.Contains(trace, "factors=[None, 5]"), "row of", c.w, "in tiles of 5:", trace)
	}
}

// TestConvReduceOrder checks that the reductions run in the order the
// kernel's indices take them, so that the kernel is read in order.
func TestConvReduceOrder(t *testing.T) {
	for _, cc := range []struct {
		ohwi bool
		want []int // rc, ry, rx positions in the loop order
	}{{false, []int{0, 1, 2}}, {true, []int{1, 2, 0}}} {
		f := convCase{n: 1, c: 4, h: 5, w: 7, f: 32, kh: 3, kw: 3, stride: 1, pad: 1, block: 32, ohwi: cc.ohwi}.primFunc(t)
		cs := findConvs(f)
		check.Equal(t, len(cs), 1)
		check.Equal(t, fmt.Sprint(cs[0].reduceOrder), fmt.Sprint(cc.want), "ohwi", cc.ohwi)
	}
}

// TestPointwise checks that pointwise convolutions over NCHW take the
// flattened plane (pointwise.go) and the tiles it picks.
func TestPointwise(t *testing.T) {
	for _, cc := range convCases() {
		panels := strings.HasPrefix(cc.name, "panels_")
		if !panels && (!cc.oihw || cc.kh != 1 || cc.kw != 1 || cc.stride != 1 || cc.groups > 1) {
			continue
		}
		g, rule, err := FuncRule(cc.primFunc(t), cc.opts)
		check.NoError(t, err)
		check.Equal(t, rule, RulePointwise, cc.name)
		flat := false
		ir.Visit(g.Body, func(n ir.Node) bool {
			if b, ok := n.(*ir.Block); ok {
				for _, a := range b.AllocBuffers {
					flat = flat || a.StorageScope() == "local" && len(a.Shape) == 3
				}
			}
			return !flat
		})
		check.True(t, flat, cc.name, "accumulates over the flattened plane")
		if cc.opts.L2Bytes > 0 {
			// Only an input larger than the L2 runs its tiles of
			// positions outside.
			o := cc.opts
			o.L2Bytes = 0
			d, _, err := Func(cc.primFunc(t), o)
			check.NoError(t, err)
			check.True(t, script.Print(d) != script.Print(g), cc.name, "is scheduled as with the default L2:", script.Print(g))
		}
	}
	for _, c := range []struct{ f, p, lanes, limit, ft, pv int64 }{
		// squeezenet1_1: 55×55, 27×27 and 13×13 planes.
		{16, 3025, 16, 24, 16, 1},
		{64, 3025, 16, 24, 16, 1},
		{128, 729, 16, 24, 16, 1},
		{48, 169, 16, 24, 24, 1},
		{1000, 169, 16, 24, 20, 1},
		// shufflenet_v2's channels (2·29, 4·29) on AVX2: at least 8
		// accumulators, the last tile of channels moved back.
		{116, 196, 8, 12, 9, 1},
		{58, 784, 8, 12, 12, 1},
		{58, 3136, 8, 12, 12, 1},
		// A plane of whole tiles of three vectors.
		{64, 96, 16, 24, 8, 3},
		{5, 6, 4, 24, 5, 1},
	} {
		ft, pv := pointwiseTile(c.f, c.p, c.lanes, c.limit, DefaultFMAChains)
		check.Equal(t, [2]int64{ft, pv}, [2]int64{c.ft, c.pv}, c.f, "×", c.p)
	}
	// Tiles of positions outside: three vectors, the most channels
	// beside them (mobilenet_v2's 112×112 planes).
	for _, c := range []struct{ f, p, lanes, limit, ft, pv int64 }{
		{16, 12544, 16, 24, 8, 3}, {96, 12544, 16, 24, 8, 3}, {12, 4160, 16, 24, 6, 3}, {5, 20, 16, 24, 5, 1},
	} {
		ft, pv := streamingPointwiseTile(c.f, c.p, c.lanes, c.limit)
		check.Equal(t, [2]int64{ft, pv}, [2]int64{c.ft, c.pv}, c.f, "×", c.p)
	}
	// Panels of 8 channels take three vectors; with 12 accumulators one,
	// and no more vectors than the plane holds.
	for _, c := range []struct{ ft, p, lanes, limit, pv int64 }{
		{8, 169, 16, 24, 3}, {8, 3025, 16, 24, 3}, {8, 196, 16, 24, 3}, {8, 169, 8, 12, 1}, {8, 40, 16, 24, 2},
	} {
		check.Equal(t, packedPointwiseTile(c.ft, c.p, c.lanes, c.limit), c.pv, c.ft, "×", c.p)
	}
}

// TestConvChoices schedules every convolution case under random choices
// of its rule (the tile, the loop order, the unrolled steps, the
// padding, the parallel loops, the epilogue) and checks each against the
// unscheduled function and its trace's replay; the conv2d rule's cases
// ask for every kind of choice.
func TestConvChoices(t *testing.T) {
	asked := map[string]bool{}
	for _, cc := range convCases() {
		if !cc.scheduled {
			continue
		}
		t.Run(cc.name, func(t *testing.T) {
			for _, s := range checkChoices(t, cc.primFunc(t), cc.opts, 3) {
				asked[s[strings.LastIndex(s, "/")+1:]] = true
				asked[s[:strings.Index(s, "/")]] = true
			}
		})
	}
	for _, what := range []string{RuleConv, RuleRowConv, "lanes", "vectors", "positions", "channels_outer", "reduce_order", "unroll", "padding", "parallel", "epilogue", "rows", "rows_inner"} {
		check.True(t, asked[what], "no case asked for", what)
	}
}

// TestConvChoicesCompiled compiles the convolutions scheduled under
// random choices (two draws of each case) to C and checks them against
// the interpreter.
func TestConvChoicesCompiled(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C")
	}
	var fs []*ir.PrimFunc
	var opts []Options
	for _, cc := range convCases() {
		if cc.scheduled {
			fs, opts = append(fs, cc.primFunc(t)), append(opts, cc.opts)
		}
	}
	checkDrawnCompiled(t, "conv_drawn", fs, opts, 2)
}

// checkDrawnCompiled schedules each function of fs with its options
// under draws sets of random choices, compiles them to C and checks each
// against the interpreter.
func checkDrawnCompiled(t *testing.T, prefix string, fs []*ir.PrimFunc, opts []Options, draws int) {
	t.Helper()
	var dfs []*ir.PrimFunc
	var dopts []Options
	for i, f := range fs {
		for d := range draws {
			dfs, dopts = append(dfs, f), append(dopts, drawnOpts(opts[i], uint64(100+draws*i+d)))
		}
	}
	src, funcs := scheduledSource(t, prefix, dfs, dopts)
	checkCompiled(t, src, funcs)
}

// TestTileSizes checks the candidate sizes of a tile: the divisors, then
// the overlapping sizes beyond the largest of them.
func TestTileSizes(t *testing.T) {
	check.Equal(t, fmt.Sprint(tileSizes(56, 12)), "[1 2 4 7 8 9 10 11 12]")
	check.Equal(t, fmt.Sprint(tileSizes(13, 24)), "[1 13]")
	check.Equal(t, fmt.Sprint(tileSizes(7, 3)), "[1 2 3]")
	check.Equal(t, fmt.Sprint(tileSizes(64, 24)), "[1 2 4 8 16 17 18 19 20 21 22 23 24]")
}

// TestConvChoiceSites checks which choices a convolution asks for (each
// the first candidate; no epilogue on the tile asks for the epilogue
// again on the schedule without it): a 1×1 kernel has one reduction of
// more than one step (no order to choose) and no padding; a 3×3 one
// with padding asks for both.
func TestConvChoiceSites(t *testing.T) {
	sites := func(cc convCase) string {
		p := &pick{}
		_, err := Apply(cc.primFunc(t), Options{ParallelFlops: 1, Decide: p})
		check.NoError(t, err)
		var out []string
		for _, s := range p.asked {
			if what := s[strings.LastIndex(s, "/")+1:]; !slices.Contains(out, what) {
				out = append(out, what)
			}
		}
		return strings.Join(out, " ")
	}
	check.Equal(t, sites(convCase{n: 1, c: 16, h: 5, w: 7, f: 32, kh: 1, kw: 1, stride: 1, block: 32}),
		"lanes vectors positions epilogue channels_outer unroll input_rows parallel")
	check.Equal(t, sites(convCase{n: 1, c: 8, h: 9, w: 7, f: 64, kh: 3, kw: 3, stride: 1, pad: 1, block: 32, epilogue: "bias_relu"}),
		"lanes vectors positions epilogue channels_outer reduce_order unroll padding parallel")
	check.Equal(t, sites(convCase{n: 1, c: 64, h: 8, w: 56, f: 64, kh: 3, kw: 3, stride: 1, pad: 1, oihw: true}),
		"lanes vectors rows out_rows rows_inner reduce_order unroll padding parallel")
}

// TestConvChannelsBesideRows checks the copy of a 1×1 convolution's input
// with the channels next to each row's positions: the default makes it
// (in the trace, read by the convolution), declining it reads the input
// where it is, both equal to the unscheduled function, serial and
// parallel; a padded 3×3 convolution is not asked.
func TestConvChannelsBesideRows(t *testing.T) {
	for _, cc := range []convCase{
		{n: 1, c: 16, h: 5, w: 7, f: 32, kh: 1, kw: 1, stride: 1, block: 32},
		{n: 1, c: 12, h: 9, w: 9, f: 16, kh: 1, kw: 1, stride: 2, block: 16, epilogue: "bias_relu"},
	} {
		f := cc.primFunc(t)
		for _, par := range []int64{0, 1} {
			for _, on := range []int64{1, 0} {
				a, err := Apply(f, Options{ParallelFlops: par, Decide: forced{"input_rows": on}})
				check.NoError(t, err)
				check.Equal(t, a.Rule, RuleConv)
				tr := strings.Join(a.Trace, "\n")
				check.Equal(t, strings.Contains(tr, "cache_read"), on == 1, "input_rows ", on, ": ", tr)
				if on == 1 && par == 1 {
					check.True(t, strings.Count(tr, "parallel(") == 2, "the copy and the convolution run in parallel: ", tr)
				}
				sameOutput(t, f, a.Func, 1e-4)
			}
		}
	}
	p := &pick{}
	_, err := Apply(convCase{n: 1, c: 8, h: 9, w: 7, f: 64, kh: 3, kw: 3, stride: 1, pad: 1, block: 32}.primFunc(t), Options{ParallelFlops: 1, Decide: p})
	check.NoError(t, err)
	for _, site := range p.asked {
		check.True(t, !strings.HasSuffix(site, "/input_rows"), "a padded convolution asked ", site)
	}
}
