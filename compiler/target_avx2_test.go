package compiler_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// TestMatmulDefaultScheduleX86 builds a bare te matmul with the default
// schedule for an AVX2 target (16 registers of 8 float32 lanes), an
// AVX-512 one and the host, whatever the host is: the matmul rule
// schedules it, the generated C uses the target's own vector type and
// none wider, and where this host runs the target's code (an AVX-512
// host runs AVX2 code) every entry matches a Go reference, at sizes with
// ragged edges and at one whose B is copied in panels (1024 columns).
func TestMatmulDefaultScheduleX86(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("builds for x86 targets with the system C compiler, which targets " + runtime.GOARCH)
	}
	rng := rand.New(rand.NewPCG(26, 2))
	for _, ts := range []string{"cpu -mcpu=haswell", "cpu -mcpu=skylake-avx512", "cpu"} {
		target := compiler.MustParseTarget(ts)
		lanes := target.VectorBytes() / 4
		for _, sz := range [][3]int{{64, 1024, 24}, {96, 40, 17}, {37, 80, 13}} {
			n, m, k := sz[0], sz[1], sz[2]
			t.Run(fmt.Sprintf("%s/%dx%dx%d", ts, n, m, k), func(t *testing.T) {
				f := teMatmul(t, n, m, k)
				mod := ir.NewIRModule().With("mm", f.WithAttr(ir.AttrGlobalSymbol, "mm"))
				// No build cache: a cached result has no source to check.
				res, err := compiler.BuildWithResult(context.Background(), mod, target, compiler.BuildOptions{NoCache: true})
				check.NoError(t, err)
				check.Equal(t, len(res.Schedules), 1)
				check.Equal(t, res.Schedules[0].String(), "default schedule (matmul)")
				if m%int(lanes) == 0 {
					check.True(t, strings.Contains(res.Source, fmt.Sprintf("float32x%d ", lanes)), "no", lanes, "-lane vectors:\n", res.Source)
				}
				check.True(t, !strings.Contains(res.Source, fmt.Sprintf("float32x%d", 2*lanes)), "vectors wider than the target's:\n", res.Source)
				if err := target.RunsOnHost(); err != nil {
					t.Skipf("built and checked, not run: %v", err)
				}
				so := filepath.Join(t.TempDir(), artifact.HostLib)
				check.NoError(t, os.WriteFile(so, res.Artifact.Files[artifact.HostLib], 0o755))
				lib, err := cpu.LoadModule(so)
				check.NoError(t, err)
				defer lib.Close()
				fn, err := lib.GetFunction("mm")
				check.NoError(t, err)
				a, b := fill(rng, ndarray.Float32, int64(n*k)), fill(rng, ndarray.Float32, int64(k*m))
				c := fill(rng, ndarray.Float32, int64(n*m)) // garbage: the kernel must initialize C
				A := toArray(t, ndarray.Float32, ndarray.Shape{int64(n), int64(k)}, a)
				B := toArray(t, ndarray.Float32, ndarray.Shape{int64(k), int64(m)}, b)
				C := toArray(t, ndarray.Float32, ndarray.Shape{int64(n), int64(m)}, c)
				_, err = fn.Call(packedfunc.Array(A), packedfunc.Array(B), packedfunc.Array(C))
				check.NoError(t, err)
				want := make([]float64, n*m)
				matmulRef(a, b, want, n, k, m)
				compare(t, "C", fromArray(t, C), want, 1e-4)
			})
		}
	}
}

// teMatmul is C[i, j] = sum over k of A[i, k]·B[k, j] in float32 from
// tensor expressions, unscheduled.
func teMatmul(t *testing.T, n, m, k int) *ir.PrimFunc {
	t.Helper()
	A := te.Placeholder(te.Shape(int64(n), int64(k)), ir.Float32, "A")
	B := te.Placeholder(te.Shape(int64(k), int64(m)), ir.Float32, "B")
	rk := te.ReduceAxis(ir.RangeFromExtent(ir.I32(int64(k))), "k")
	C := te.Compute(te.Shape(int64(n), int64(m)), func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(A.At(i, rk), B.At(rk, j)), rk)
	}, "C")
	f, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	check.NoError(t, err)
	return f
}
