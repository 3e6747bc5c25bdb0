package c_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// matmulFunc is C = A·B in fp32, A n×k, B k×m.
func matmulFunc(t testing.TB, n, m, k int64) *ir.PrimFunc {
	t.Helper()
	A := te.Placeholder(te.Shape(n, k), ir.Float32, "A")
	B := te.Placeholder(te.Shape(k, m), ir.Float32, "B")
	rk := te.ReduceAxis(ir.RangeFromExtent(ir.I32(k)), "k")
	C := te.Compute(te.Shape(n, m), func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(A.At(i, rk), B.At(rk, j)), rk)
	}, "C")
	f, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	check.NoError(t, err)
	return f
}

// registerBlocked applies the register-blocked schedule of the matmul
// benchmark (compiler/schedule's TestMatmulRegisterBlocked): an mr×nr tile
// of C accumulates in a local buffer over the whole reduction, its rows
// unrolled and its columns one vector; with pack, a panel of B (all of k,
// nr columns) is copied before the row tiles that use it.
func registerBlocked(t testing.TB, f *ir.PrimFunc, mr, nr int64, pack bool) *ir.PrimFunc {
	t.Helper()
	s, err := schedule.New(f)
	check.NoError(t, err)
	must := func(err error) {
		t.Helper()
		check.NoError(t, err)
	}
	c, err := s.GetBlock("C")
	must(err)
	ls, err := s.GetLoops(c)
	must(err)
	i, err := s.Split(ls[0], -1, mr)
	must(err)
	j, err := s.Split(ls[1], -1, nr)
	must(err)
	k := ls[2]
	outer := []schedule.LoopRV{i[0], j[0]}
	if pack {
		outer = []schedule.LoopRV{j[0], i[0]}
	}
	must(s.Reorder(outer[0], outer[1], k, i[1], j[1]))
	cl, err := s.CacheWrite(c, 0, "local")
	must(err)
	must(s.ReverseComputeAt(cl, outer[1]))
	init, err := s.DecomposeReduction(c, k)
	must(err)
	must(s.Unroll(i[1]))
	must(s.Vectorize(j[1]))
	il, err := s.GetLoops(init)
	must(err)
	must(s.Unroll(il[len(il)-2]))
	must(s.Vectorize(il[len(il)-1]))
	wl, err := s.GetLoops(cl)
	must(err)
	must(s.Vectorize(wl[len(wl)-1]))
	if pack {
		bp, err := s.CacheRead(c, 2, "global")
		must(err)
		must(s.ComputeAt(bp, outer[0]))
		pl, err := s.GetLoops(bp)
		must(err)
		must(s.Vectorize(pl[len(pl)-1]))
		must(s.Parallel(outer[0]))
		return s.Func()
	}
	fused, err := s.Fuse(outer[0], outer[1])
	must(err)
	must(s.Parallel(fused))
	return s.Func()
}

var keepLoaded []*cpu.Module

type builtKernel struct {
	mod    *cpu.Module
	fn     *packedfunc.Func
	source string
}

// buildKernel builds f for the host and loads it.
func buildKernel(t testing.TB, f *ir.PrimFunc, name string) *builtKernel {
	t.Helper()
	return loadKernel(t, buildFor(t, f, name, compiler.Target{Kind: "cpu"}), name)
}

// buildFor compiles f for target with the system C compiler, whether or
// not this host can run the result.
func buildFor(t testing.TB, f *ir.PrimFunc, name string, target compiler.Target) *compiler.Result {
	t.Helper()
	mod := ir.NewIRModule().With(name, f.WithAttr(ir.AttrGlobalSymbol, name))
	res, err := compiler.BuildWithResult(context.Background(), mod, target, compiler.BuildOptions{NoCache: true})
	check.NoError(t, err, target)
	if d := os.Getenv("KILN_KEEP_SOURCE"); d != "" {
		check.NoError(t, os.WriteFile(filepath.Join(d, name+".c"), []byte(res.Source), 0o644))
	}
	return res
}

// loadKernel loads a built artifact into this process.
func loadKernel(t testing.TB, res *compiler.Result, name string) *builtKernel {
	t.Helper()
	dir := t.TempDir()
	m, err := cpu.LoadArtifact(res.Artifact, dir)
	check.NoError(t, err)
	// Modules stay loaded for the whole process: unloading a library that
	// brought in libgomp while OpenMP's worker threads sleep in it crashes
	// (devices/cpu unloads a module when it is garbage collected).
	keepLoaded = append(keepLoaded, m)
	fn, err := m.GetFunction(name)
	check.NoError(t, err)
	return &builtKernel{mod: m, fn: fn, source: res.Source}
}

func randomMatrix(t testing.TB, rng *rand.Rand, r, c int64) *ndarray.NDArray {
	t.Helper()
	data := make([]float32, r*c)
	for i := range data {
		data[i] = rng.Float32()
	}
	a, err := ndarray.FromSlice(data, ndarray.Shape{r, c})
	check.NoError(t, err)
	return a
}

// checkMatmul compares c with A·B computed in float64.
func checkMatmul(t testing.TB, a, b, c *ndarray.NDArray, n, m, k int64, samples int, rng *rand.Rand) {
	t.Helper()
	av, err := ndarray.ToSlice[float32](a)
	check.NoError(t, err)
	bv, err := ndarray.ToSlice[float32](b)
	check.NoError(t, err)
	cv, err := ndarray.ToSlice[float32](c)
	check.NoError(t, err)
	for s := 0; s < samples; s++ {
		i, j := rng.Int64N(n), rng.Int64N(m)
		if samples >= int(n*m) {
			i, j = int64(s)/m, int64(s)%m
		}
		var want, mag float64
		for x := range k {
			p := float64(av[i*k+x]) * float64(bv[x*m+j])
			want += p
			mag += math.Abs(p)
		}
		got := float64(cv[i*m+j])
		check.True(t, math.Abs(got-want) <= 1e-5*max(mag, 1), "C", i, j, "=", got, "want", want)
	}
}

// matmulCases are the register-blocked variants checked and measured.
var matmulCases = []struct {
	name   string
	mr, nr int64
	pack   bool
}{
	{"tile8x32", 8, 32, false},
	{"tile8x32_packed", 8, 32, true},
	{"tile4x64", 4, 64, false},
	{"tile6x32", 6, 32, false},
}

// x86Targets are the x86 vector widths the C generator's register tiles
// are checked for, each with its vector type: an AVX-512 core's 64-byte
// registers and an AVX2 core's 32-byte ones. Each is built with the system
// C compiler wherever the tests run and executed where the host can.
var x86Targets = []struct {
	name, target string
	lanes        int // float32 lanes of one register
}{
	{"avx512", "cpu -mcpu=skylake-avx512", 16},
	{"avx2", "cpu -mcpu=haswell", 8},
}

// TestMatmulRegisterBlocked builds the register-blocked matmul (the 8×32
// accumulator compacted by transform's compact_buffers, rows unrolled,
// columns split into native vectors) for an AVX-512 and an AVX2 target,
// checks the generated C: the accumulator tile is 8×32/lanes vector
// variables of the target's width, never an array, so the k loop neither
// reloads nor stores it; and, where this host runs the target's code,
// checks every entry of a product against float64 (also with a packed
// panel of B, and at a ragged size where guards cut the edge tiles).
func TestMatmulRegisterBlocked(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("builds for x86 targets with the system C compiler, which targets " + runtime.GOARCH)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	tests := []struct {
		name    string
		n, m, k int64
		pack    bool
		regs    bool // check the accumulator is in variables
	}{
		{"fused", 64, 96, 40, false, true},
		{"packed", 64, 96, 40, true, true},
		// Guards on the edge tiles keep the j loop from vectorizing (its
		// body is an if on j): correct, slower code.
		{"ragged", 37, 80, 13, false, false},
	}
	for _, x := range x86Targets {
		target := compiler.MustParseTarget(x.target)
		check.Equal(t, target.VectorBytes(), int64(4*x.lanes), x.target)
		for _, tt := range tests {
			t.Run(x.name+"/"+tt.name, func(t *testing.T) {
				f := registerBlocked(t, matmulFunc(t, tt.n, tt.m, tt.k), 8, 32, tt.pack)
				res := buildFor(t, f, "mm", target)
				if tt.regs {
					vec := fmt.Sprintf("float32x%d", x.lanes)
					for i := 0; i < 8*32/x.lanes; i++ {
						check.True(t, strings.Contains(res.Source, fmt.Sprintf("%s C_local_%d = {0};", vec, x.lanes*i)), "accumulator variable", i, "missing:\n", res.Source)
					}
					check.True(t, !strings.Contains(res.Source, "C_local["), "C_local is still an array:\n", res.Source)
					check.True(t, !strings.Contains(res.Source, fmt.Sprintf("float32x%d", 2*x.lanes)), "vectors wider than the target's", 4*x.lanes, "bytes:\n", res.Source)
				}
				if err := target.RunsOnHost(); err != nil {
					t.Skipf("built and checked, not run: %v", err)
				}
				kern := loadKernel(t, res, "mm")
				a, b := randomMatrix(t, rng, tt.n, tt.k), randomMatrix(t, rng, tt.k, tt.m)
				c := randomMatrix(t, rng, tt.n, tt.m)
				_, err := kern.fn.Call(packedfunc.Array(a), packedfunc.Array(b), packedfunc.Array(c))
				check.NoError(t, err)
				checkMatmul(t, a, b, c, tt.n, tt.m, tt.k, int(tt.n*tt.m), rng)
			})
		}
	}
}

// BenchmarkMatmulRegisterBlocked measures the register-blocked variants
// on fp32 1024³ (GFLOPS as a custom metric), and numpy's matmul in the
// same run when /usr/bin/python3 has numpy. No figure is asserted.
func BenchmarkMatmulRegisterBlocked(b *testing.B) {
	const n = 1024
	rng := rand.New(rand.NewPCG(7, 8))
	A, B, C := randomMatrix(b, rng, n, n), randomMatrix(b, rng, n, n), randomMatrix(b, rng, n, n)
	args := []packedfunc.Value{packedfunc.Array(A), packedfunc.Array(B), packedfunc.Array(C)}
	for _, tc := range matmulCases {
		b.Run(tc.name, func(b *testing.B) {
			kern := buildKernel(b, registerBlocked(b, matmulFunc(b, n, n, n), tc.mr, tc.nr, tc.pack), "mm_"+tc.name)
			_, err := kern.fn.Call(args...)
			check.NoError(b, err)
			checkMatmul(b, A, B, C, n, n, n, 64, rng)
			b.ResetTimer()
			for b.Loop() {
				if _, err := kern.fn.Call(args...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(2*n*n*n*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOPS")
		})
	}
	b.Run("numpy", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		script := `import numpy as np, time, sys
n = 1024
a = np.random.rand(n, n).astype(np.float32); b = np.random.rand(n, n).astype(np.float32); c = np.empty((n, n), np.float32)
np.matmul(a, b, out=c)
reps = int(sys.argv[1]); t = time.perf_counter()
for _ in range(reps): np.matmul(a, b, out=c)
print(time.perf_counter() - t)`
		out, err := exec.CommandContext(ctx, "/usr/bin/python3", "-c", script, fmt.Sprint(max(b.N, 1))).Output()
		if err != nil {
			b.Skipf("numpy: %v", err)
		}
		var secs float64
		_, err = fmt.Sscan(strings.TrimSpace(string(out)), &secs)
		check.NoError(b, err)
		b.ReportMetric(2*n*n*n*float64(max(b.N, 1))/secs/1e9, "GFLOPS")
	})
}
