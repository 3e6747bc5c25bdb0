package c_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/kiln-ml/kiln/compiler/codegen/c"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/toolchain"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// parallelSrc has parallel loops in the shapes outlining must handle: in a
// serial loop, reading a scalar parameter and the serial loop's variable;
// nested (the inner one runs serially in the outer one's chunk); with a
// non-zero start and an int32 variable; and one whose body can fail.
const parallelSrc = `# from tvm.script import ir as I
# from tvm.script import tir as T
@I.ir_module
class Module:
    @T.prim_func
    def par(A: T.Buffer((64,), "float32"), B: T.Buffer((8, 64), "float32"), C: T.Buffer((16,), "int32"), k: T.int32):
        T.func_attr({"global_symbol": "par", "tir.noalias": T.bool(True)})
        for r in range(2):
            for i in T.parallel(64):
                B[r, i] = A[i] * T.Cast("float32", k + r)
        for i in T.parallel(6):
            for j in T.parallel(64):
                B[i + 2, j] = T.Cast("float32", i * 100 + j)
        for i in T.parallel(4, 16):
            C[i] = i * k

    @T.prim_func
    def fails(A: T.Buffer((64,), "float32"), k: T.int64):
        T.func_attr({"global_symbol": "fails", "tir.noalias": T.bool(True)})
        for i in T.parallel(T.int64(64)):
            assert i != k, "fails: iteration k"
            A[i] = T.float32(1)
`

func TestParallelLoops(t *testing.T) {
	m, err := script.Parse("par.py", parallelSrc)
	check.NoError(t, err)
	l, err := transform.LowerModule(m, transform.Options{Verify: true})
	check.NoError(t, err)
	text, _, err := c.Generate(l, c.Options{})
	check.NoError(t, err)
	check.True(t, !strings.Contains(text, "#pragma omp"), "generated C uses OpenMP")
	check.Equal(t, strings.Count(text, "kiln_parallel_run(kiln_parallel_"), 4, "launches (the nested loop runs serially)")

	ctx := context.Background()
	tc, err := toolchain.Find(ctx, toolchain.Options{Flags: []string{"-O1", "-Wall", "-Werror"}})
	check.NoError(t, err)
	so := filepath.Join(t.TempDir(), "par.so")
	check.NoError(t, tc.BuildShared(ctx, []toolchain.Source{{Name: "par.c", Text: text}}, so, ""))
	mod, err := cpu.LoadModule(so)
	check.NoError(t, err)
	defer mod.Close()
	slot := mod.Symbol("kiln_parallel_launch")
	check.True(t, slot != nil && *(*unsafe.Pointer)(slot) != nil, "the loader gave the module no pool")

	arr := func(dt ndarray.DType, shape ...int64) *ndarray.NDArray {
		a, err := ndarray.Empty(ndarray.Shape(shape), dt, devices.CPUDevice)
		check.NoError(t, err)
		return a
	}
	a, b, cc := arr(ndarray.Float32, 64), arr(ndarray.Float32, 8, 64), arr(ndarray.Int32, 16)
	av := unsafe.Slice((*float32)(a.Data().Unsafe()), 64)
	for i := range av {
		av[i] = float32(i)
	}
	f, err := mod.GetFunction("par")
	check.NoError(t, err)
	// par checks one call's outputs; t.Error, not Fatal: goroutines call it.
	par := func(a, b, cc *ndarray.NDArray, k int) {
		if _, err := f.Call(packedfunc.Array(a), packedfunc.Array(b), packedfunc.Array(cc), packedfunc.Int(int64(k))); err != nil {
			t.Error(err)
			return
		}
		bv := unsafe.Slice((*float32)(b.Data().Unsafe()), 8*64)
		cv := unsafe.Slice((*int32)(cc.Data().Unsafe()), 16)
		bad := 0
		for r := 0; r < 2; r++ {
			for i := 0; i < 64; i++ {
				if bv[r*64+i] != float32(i*(k+r)) {
					bad++
				}
			}
		}
		for i := 0; i < 6; i++ {
			for j := 0; j < 64; j++ {
				if bv[(i+2)*64+j] != float32(i*100+j) {
					bad++
				}
			}
		}
		for i := 4; i < 16; i++ {
			if cv[i] != int32(i*k) {
				bad++
			}
		}
		if bad > 0 {
			t.Errorf("par with k=%d: %d wrong elements", k, bad)
		}
	}
	for round := 0; round < 20; round++ {
		par(a, b, cc, 3)
	}

	// Calls from several threads at once share the process's pool: a
	// launch that finds it taken runs on its caller.
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		b, cc := arr(ndarray.Float32, 8, 64), arr(ndarray.Int32, 16)
		wg.Go(func() {
			for round := 0; round < 50; round++ {
				par(a, b, cc, g+round)
			}
		})
	}
	wg.Wait()

	// A module whose launch variable is NULL (loaded by anything but the
	// loader) runs its loops serially, with the same results.
	saved := *(*unsafe.Pointer)(slot)
	*(*unsafe.Pointer)(slot) = nil
	par(a, b, cc, 5)
	*(*unsafe.Pointer)(slot) = saved

	// A failed assert in a chunk fails the call with its message, on
	// whichever thread the chunk ran.
	fails, err := mod.GetFunction("fails")
	check.NoError(t, err)
	for _, at := range []int64{0, 31, 63} {
		_, err = fails.Call(packedfunc.Array(a), packedfunc.Int(at))
		var ke *cpu.KernelError
		check.True(t, errors.As(err, &ke), "want a KernelError, got", err)
		check.Equal(t, ke.Msg, "fails: iteration k")
	}
	_, err = fails.Call(packedfunc.Array(a), packedfunc.Int(64))
	check.NoError(t, err)
	for i, v := range av {
		check.Equal(t, v, float32(1), "A", i)
	}
}
