package auto

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/compiler/topi"
	"github.com/kiln-ml/kiln/internal/check"
)

// poolCase is a pooling window over NCHW data.
type poolCase struct {
	name            string
	n, c, h, w      int64
	k, stride, pad  int64
	max, includePad bool
	plane           bool // computed as a plane per channel (depthwise_plane.go)
}

func (pc poolCase) primFunc(t *testing.T) *ir.PrimFunc {
	t.Helper()
	x := te.Placeholder(ir.Dims(pc.n, pc.c, pc.h, pc.w), ir.Float32, "x")
	a := topi.Pool2DAttrs{PoolSize: [2]int64{pc.k, pc.k}, Strides: [2]int64{pc.stride, pc.stride},
		Padding: [4]int64{pc.pad, pc.pad, pc.pad, pc.pad}, CountIncludePad: pc.includePad}
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
		// squeezenet's: no padding, left to the generic rule.
		{name: "max_3x3_stride2_unpadded", n: 1, c: 3, h: 11, w: 11, k: 3, stride: 2, max: true},
	}
}

// TestPool checks the pooling windows' schedules against the unscheduled
// function in the interpreter.
func TestPool(t *testing.T) {
	for _, pc := range poolCases() {
		t.Run(pc.name, func(t *testing.T) {
			f := pc.primFunc(t)
			g, _, err := Func(f, Options{})
			check.NoError(t, err)
			check.NoError(t, ir.Verify(g))
			planes := strings.Contains(script.Print(g), "plane")
			check.Equal(t, planes, pc.plane, "a plane per channel")
			nearSlices(t, outputOf(t, g), outputOf(t, f))
		})
	}
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
		if pc.plane {
			fs, opts = append(fs, pc.primFunc(t)), append(opts, Options{ParallelFlops: 1})
		}
	}
	src, funcs := scheduledSource(t, "pool", fs, opts)
	checkCompiled(t, src, funcs)
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
		check.True(t, strings.Contains(script.Print(g), "part"), "a vector of partial sums")
		nearSlices(t, outputOf(t, g), outputOf(t, f))
		fs, opts = append(fs, f), append(opts, Options{ParallelFlops: 1})
	}
	if testing.Short() {
		return
	}
	src, funcs := scheduledSource(t, "global_pool", fs, opts)
	checkCompiled(t, src, funcs)
}
