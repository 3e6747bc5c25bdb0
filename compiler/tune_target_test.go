package compiler

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/compiler/topi"
	"github.com/kiln-ml/kiln/compiler/tune"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestTuneTargetDefault: on a host whose L2 is not the rules' default
// (1 MiB), the tuner's default candidate for a pointwise convolution is
// the schedule the build gives it, not the one the vector width alone
// gives.
func TestTuneTargetDefault(t *testing.T) {
	saved := cacheDir
	defer func() { cacheDir = saved }()
	// A 16 KiB L2: the convolution's 32 KiB input no longer fits, so the
	// pointwise rule streams it in tiles of positions.
	cacheDir = sysfsCaches(t, [3]string{"1", "Data", "32K"}, [3]string{"2", "Unified", "16K"})

	x := te.Placeholder(ir.Dims(1, 32, 16, 16), ir.Float32, "x")
	w := te.Placeholder(ir.Dims(64, 32, 1, 1), ir.Float32, "w")
	b := te.Placeholder(ir.Dims(1, 64, 1, 1), ir.Float32, "b")
	y, err := topi.Conv2D(x, w, topi.Conv2DAttrs{Strides: [2]int64{1, 1}, Groups: 1, KernelLayout: "OIHW", OutLayout: "NCHW"})
	check.NoError(t, err)
	y, err = topi.Add(y, b)
	check.NoError(t, err)
	y, err = topi.Relu(y)
	check.NoError(t, err)
	f, err := te.CreatePrimFunc([]*te.Tensor{x, w, b, y})
	check.NoError(t, err)

	target := Target{Kind: "cpu"}
	info, err := target.Info()
	check.NoError(t, err)
	check.Equal(t, info.L2Bytes, int64(16<<10))
	mod := ir.NewIRModule().With("conv", f)
	built, scheds, err := defaultSchedules(mod, mod, info, BuildOptions{})
	check.NoError(t, err)
	check.Equal(t, len(scheds), 1)
	check.Equal(t, scheds[0].Kind, DefaultSchedule)

	rt, err := target.TuneTarget()
	check.NoError(t, err)
	check.Equal(t, rt.AutoOptions(), info.CPUOptions())
	sp, err := tune.NewSpace(f, rt)
	check.NoError(t, err)
	// Each call schedules anew: the same function always gets the same
	// schedule (the flat views are declared in a fixed order).
	for range 8 {
		c, err := sp.Default()
		check.NoError(t, err)
		check.True(t, ir.StructuralEqual(c.Func, built.PrimFunc("conv")), "the tuner's default candidate differs from the build's default schedule:\n"+script.Print(c.Func)+"\nwant\n"+script.Print(built.PrimFunc("conv")))
	}

	// The host's caches matter here: the vector width alone gives another
	// schedule.
	g, _, err := auto.FuncRule(f, auto.Options{VectorBytes: max(info.VectorBytes, 16)})
	check.NoError(t, err)
	check.True(t, !ir.StructuralEqual(g, built.PrimFunc("conv")), "the schedule does not depend on the L2 size")
}
