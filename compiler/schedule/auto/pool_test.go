package auto

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/compiler/topi"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/internal/check"
)

// poolCase is a pooling window over NCHW data.
type poolCase struct {
	name            string
	n, c, h, w      int64
	k, stride, pad  int64
	max, includePad bool
	ceil            bool
	plane           bool // computed as a plane per channel (depthwise_plane.go)
	rows            bool // computed on vectors along the input's rows (pool.go)
}

func (pc poolCase) primFunc(t *testing.T) *ir.PrimFunc {
	t.Helper()
	x := te.Placeholder(ir.Dims(pc.n, pc.c, pc.h, pc.w), ir.Float32, "x")
	a := topi.Pool2DAttrs{PoolSize: [2]int64{pc.k, pc.k}, Strides: [2]int64{pc.stride, pc.stride},
		Padding: [4]int64{pc.pad, pc.pad, pc.pad, pc.pad}, CountIncludePad: pc.includePad, CeilMode: pc.ceil}
	pool := topi.AvgPool2D
	if pc.max {
		pool = topi.MaxPool2D
	}
	y, err := pool(x, a)
	check.NoError(t, err)
	f, err := te.CreatePrimFunc([]*te.Tensor{x, y})
	check.NoError(t, err)
	return f
}

func poolCases() []poolCase {
	return []poolCase{
		// resnet18's: a padded plane per channel instead of a padding stage.
		{name: "max_3x3_stride2_pad1", n: 1, c: 3, h: 12, w: 12, k: 3, stride: 2, pad: 1, max: true, plane: true},
		{name: "max_3x3_stride2_pad1_odd", n: 2, c: 2, h: 9, w: 11, k: 3, stride: 2, pad: 1, max: true, plane: true},
		{name: "avg_3x3_pad1_valid_count", n: 1, c: 3, h: 7, w: 14, k: 3, stride: 1, pad: 1, plane: true},
		{name: "avg_2x2_stride2_pad1_include", n: 1, c: 2, h: 6, w: 6, k: 2, stride: 2, pad: 1, includePad: true, plane: true},
		// squeezenet1_1's: no padding (ceil mode, its sizes exact),
		// vectors of stride-2 loads along the rows.
		{name: "max_3x3_stride2_unpadded", n: 1, c: 3, h: 11, w: 11, k: 3, stride: 2, max: true, rows: true},
		{name: "max_3x3_stride2_ceil_exact", n: 2, c: 3, h: 13, w: 41, k: 3, stride: 2, max: true, ceil: true, rows: true},
		{name: "max_3x3_stride2_ceil_padded", n: 1, c: 2, h: 12, w: 12, k: 3, stride: 2, max: true, ceil: true, plane: true},
		{name: "avg_2x2_stride2_unpadded", n: 1, c: 3, h: 8, w: 10, k: 2, stride: 2, rows: true},
		{name: "max_2x2_stride1_unpadded", n: 1, c: 2, h: 6, w: 9, k: 2, stride: 1, max: true, rows: true},
		{name: "max_3x3_stride3_unpadded", n: 1, c: 2, h: 9, w: 15, k: 3, stride: 3, max: true, rows: true},
		// Rows of 3 take no vector.
		{name: "max_3x3_stride2_rows_of_3", n: 1, c: 2, h: 7, w: 7, k: 3, stride: 2, max: true},
	}
}

// TestPool checks the pooling windows' schedules against the unscheduled
// function in the interpreter.
func TestPool(t *testing.T) {
	for _, pc := range poolCases() {
		t.Run(pc.name, func(t *testing.T) {
			f := pc.primFunc(t)
			g, rule, err := FuncRule(f, Options{})
			check.NoError(t, err)
			check.NoError(t, ir.Verify(g))
			check.Equal(t, rule == RuleDepthwisePlane, pc.plane, "a plane per channel")
			check.Equal(t, rule == RulePoolRows, pc.rows, "vectors along the rows")
			if pc.rows {
				text := script.Print(g)
				check.True(t, strings.Contains(text, "T.vectorized") && strings.Contains(text, `scope="local"`), "vectors of a local tile:\n%s", text)
			}
			nearSlices(t, outputOf(t, g), outputOf(t, f))
		})
	}
}

// TestChoicesOfPool: the pooling rows rule's choices (vectors per tile,
// the parallel loop) are valid whatever is drawn.
func TestChoicesOfPool(t *testing.T) {
	asked := map[string]bool{}
	for _, pc := range poolCases() {
		if !pc.rows {
			continue
		}
		for _, site := range checkChoices(t, pc.primFunc(t), Options{VectorBytes: 16, ParallelFlops: 1}, 6) {
			asked[site[strings.LastIndex(site, "/")+1:]] = true
		}
	}
	check.True(t, asked["vectors"] && asked["parallel"], "sites asked: %v", asked)
}

// TestPoolCompiled compiles the planes to C and checks them against the
// interpreter.
func TestPoolCompiled(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C")
	}
	var fs []*ir.PrimFunc
	var opts []Options
	for _, pc := range poolCases() {
		if pc.plane || pc.rows {
			fs, opts = append(fs, pc.primFunc(t)), append(opts, Options{ParallelFlops: 1})
		}
	}
	src, funcs := scheduledSource(t, "pool", fs, opts)
	checkCompiled(t, src, funcs)
}

// TestPoolModels checks the pooling windows of squeezenet1_1 (after its
// stem, fire3 and fire5) and resnet18, compiled, against the unscheduled
// functions compiled alike.
func TestPoolModels(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C")
	}
	var fs []*ir.PrimFunc
	var opts []Options
	for _, pc := range []poolCase{
		{n: 1, c: 64, h: 111, w: 111, k: 3, stride: 2, max: true, ceil: true},
		{n: 1, c: 128, h: 55, w: 55, k: 3, stride: 2, max: true, ceil: true},
		{n: 1, c: 256, h: 27, w: 27, k: 3, stride: 2, max: true, ceil: true},
		{n: 1, c: 64, h: 112, w: 112, k: 3, stride: 2, pad: 1, max: true},
	} {
		fs, opts = append(fs, pc.primFunc(t)), append(opts, Options{})
	}
	checkAgainstUnscheduled(t, "pool", fs, opts)
}

// TestGlobalPool checks global average pooling (a mean over each
// channel's plane) against the unscheduled function, in the interpreter
// and compiled.
func TestGlobalPool(t *testing.T) {
	var fs []*ir.PrimFunc
	var opts []Options
	for _, sh := range [][4]int64{{1, 5, 13, 13}, {2, 3, 7, 7}, {1, 4, 2, 2}, {1, 3, 1, 5}} {
		x := te.Placeholder(ir.Dims(sh[0], sh[1], sh[2], sh[3]), ir.Float32, "x")
		y, err := topi.Mean(x, []int64{2, 3}, true)
		check.NoError(t, err)
		f, err := te.CreatePrimFunc([]*te.Tensor{x, y})
		check.NoError(t, err)
		g, ok := scheduleChecked(t, f, Options{}, true)
		check.True(t, ok, "scheduled")
		check.True(t, strings.Contains(script.Print(g), "x_red_rf"), "a vector of partial sums (rfactor)")
		nearSlices(t, outputOf(t, g), outputOf(t, f))
		if sh[2]*sh[3] > 4 && sh[2]*sh[3]%4 != 0 {
			// The widest vectors, which do not divide the plane: the
			// loop over them partitioned, the guard of their lanes
			// gone from the lowering (only the lanes of the last, a
			// tail of its own, are computed), and there without it.
			check.Equal(t, guardedLowering(t, g, nil), false, sh, "guards left after partition_loops")
			check.Equal(t, guardedLowering(t, g, []string{"partition_loops"}), true, sh, "guards without partition_loops")
		}
		fs, opts = append(fs, f), append(opts, Options{ParallelFlops: 1})
	}
	if testing.Short() {
		return
	}
	src, funcs := scheduledSource(t, "global_pool", fs, opts)
	checkCompiled(t, src, funcs)
}

// guardedLowering lowers f, skipping the passes skip, and reports
// whether an if statement is left.
func guardedLowering(t *testing.T, f *ir.PrimFunc, skip []string) bool {
	t.Helper()
	g, err := transform.Lower(f, transform.Options{StopAfter: "storage_rewrite", Skip: skip, Verify: true})
	check.NoError(t, err)
	found := false
	ir.Visit(g.Body, func(n ir.Node) bool {
		_, ok := n.(*ir.IfThenElse)
		found = found || ok
		return !found
	})
	return found
}
