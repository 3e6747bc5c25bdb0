package compiler_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/toolchain"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// diffCase is one function of testdata/cases.py with its inputs and a Go
// reference. Every tensor parameter is filled with deterministic random
// data; the reference updates the outputs in place.
type diffCase struct {
	fn      string
	sizes   map[string]int64   // symbolic dimensions
	scalars map[string]float64 // scalar parameters
	ref     func(a map[string][]float64, s map[string]float64)
	tol     float64 // relative and absolute tolerance; 0 means exact
}

var f32 = func(x float64) float64 { return float64(float32(x)) }

var diffCases = []diffCase{
	{fn: "vecadd", sizes: map[string]int64{"n": 1000}, ref: func(a map[string][]float64, _ map[string]float64) {
		for i := range a["C"] {
			a["C"][i] = f32(a["A"][i] + a["B"][i])
		}
	}},
	{fn: "matmul", tol: 1e-5, ref: func(a map[string][]float64, _ map[string]float64) {
		matmulRef(a["A"], a["B"], a["C"], 64, 32, 48)
	}},
	{fn: "microkernel", tol: 1e-5, ref: func(a map[string][]float64, _ map[string]float64) {
		matmulRef(a["A"], a["B"], a["C"], 16, 24, 32)
	}},
	{fn: "select_if", ref: func(a map[string][]float64, _ map[string]float64) {
		for i := range 37 {
			x := a["A"][i]
			if x > 0 {
				a["B"][i] = x
			} else {
				a["B"][i] = f32(x * 0.25)
			}
			switch {
			case i%3 == 0:
				a["C"][i] = 1
			case x < -0.5:
				a["C"][i] = 3
				if i > 10 {
					a["C"][i] = 2
				}
			default:
				a["C"][i] = float64(max(i/4, 5) - min(i%7, 2))
			}
		}
	}},
	{fn: "intrinsics", tol: 2e-6, ref: func(a map[string][]float64, _ map[string]float64) {
		fs := []func(x float64) float64{
			math.Exp,
			func(x float64) float64 { return math.Log(math.Abs(x) + 1) },
			func(x float64) float64 { return math.Sqrt(math.Abs(x)) },
			math.Tanh,
			func(x float64) float64 { return 1 / (1 + math.Exp(-x)) },
			math.Erf,
			func(x float64) float64 { return math.Pow(math.Abs(x), 1.5) },
			func(x float64) float64 { return math.Floor(f32(x * 3)) },
			func(x float64) float64 { return math.Ceil(f32(x * 3)) },
			func(x float64) float64 { return math.RoundToEven(f32(x * 4)) },
			func(x float64) float64 { return 1 / math.Sqrt(f32(math.Abs(x)+0.5)) },
			func(x float64) float64 { return math.Max(x, 0) },
		}
		for r, fn := range fs {
			for i := range 32 {
				a["B"][r*32+i] = f32(fn(a["A"][i]))
			}
		}
	}},
	{fn: "casts", ref: func(a map[string][]float64, _ map[string]float64) {
		for i := range 16 {
			b := int32(float32(a["A"][i]) * 10)
			a["B"][i] = float64(b)
			a["C"][i] = float64(float32(a["A"][i]))*2 + float64(i)
			a["D"][i] = float64(floorDiv(int64(b)*3000000000, 7))
		}
	}},
	{fn: "local_alloc", tol: 1e-5, ref: func(a map[string][]float64, _ map[string]float64) {
		for i := range 8 {
			s := float32(0)
			for j := range 16 {
				x := float32(a["A"][i*16+j])
				s += x * x
			}
			a["B"][i] = float64(s)
		}
	}},
	{fn: "split_pred", ref: func(a map[string][]float64, _ map[string]float64) {
		for i := range 30 {
			a["B"][i] = f32(f32(a["A"][i]*2) + 1)
		}
	}},
	{fn: "scale_sym", sizes: map[string]int64{"m": 5}, scalars: map[string]float64{"alpha": 1.5, "off": -3}, tol: 1e-6, // the C compiler contracts x*alpha+off into an fma
		ref: func(a map[string][]float64, s map[string]float64) {
			for i := range a["X"] {
				a["X"][i] = f32(f32(a["X"][i]*s["alpha"]) + s["off"])
			}
		}},
}

// valuesAsAny passes packed values to interp.Run.
func valuesAsAny(vs []packedfunc.Value) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		out[i] = v
	}
	return out
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func matmulRef(A, B, C []float64, n, k, m int) {
	for i := range n {
		for j := range m {
			s := float32(0)
			for kk := range k {
				s += float32(A[i*k+kk]) * float32(B[kk*m+j])
			}
			C[i*m+j] = float64(s)
		}
	}
}

// casesModule parses testdata/cases.py.
func casesModule(t *testing.T) *ir.IRModule {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", "cases.py"))
	check.NoError(t, err)
	m, err := script.Parse("cases.py", string(src))
	check.NoError(t, err)
	return m
}

var (
	built     sync.Once
	builtMod  *cpu.Module
	builtErr  error
	builtArt  *artifact.Artifact
	builtPath string
)

// casesLibrary builds testdata/cases.py once per test binary and loads it.
func casesLibrary(t *testing.T) (*cpu.Module, *artifact.Artifact) {
	t.Helper()
	built.Do(func() {
		src, err := os.ReadFile(filepath.Join("testdata", "cases.py"))
		if err != nil {
			builtErr = err
			return
		}
		m, err := script.Parse("cases.py", string(src))
		if err != nil {
			builtErr = err
			return
		}
		dir, err := os.MkdirTemp("", "kiln-compiler-test-")
		if err != nil {
			builtErr = err
			return
		}
		a, err := compiler.Build(context.Background(), m, compiler.MustParseTarget("cpu"), compiler.BuildOptions{NoCache: true, VerifyIR: true})
		if err != nil {
			builtErr = err
			return
		}
		builtArt = a
		builtPath = filepath.Join(dir, artifact.HostLib)
		if builtErr = os.WriteFile(builtPath, a.Files[artifact.HostLib], 0o755); builtErr != nil {
			return
		}
		builtMod, builtErr = cpu.LoadModule(builtPath)
	})
	check.NoError(t, builtErr)
	return builtMod, builtArt
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builtMod != nil {
		builtMod.Close()
		os.RemoveAll(filepath.Dir(builtPath))
	}
	os.Exit(code)
}

// fill makes deterministic test data for a parameter.
func fill(rng *rand.Rand, dt ndarray.DType, n int64) []float64 {
	out := make([]float64, n)
	for i := range out {
		if dt.IsFloat() {
			out[i] = float64(float32(rng.Float64()*4 - 2))
		} else {
			out[i] = float64(rng.IntN(101) - 50)
		}
	}
	return out
}

func toArray(t *testing.T, dt ndarray.DType, shape ndarray.Shape, v []float64) *ndarray.NDArray {
	t.Helper()
	var a *ndarray.NDArray
	var err error
	switch dt {
	case ndarray.Float32:
		s := make([]float32, len(v))
		for i, x := range v {
			s[i] = float32(x)
		}
		a, err = ndarray.FromSlice(s, shape)
	case ndarray.Float64:
		a, err = ndarray.FromSlice(append([]float64(nil), v...), shape)
	case ndarray.Int32:
		s := make([]int32, len(v))
		for i, x := range v {
			s[i] = int32(x)
		}
		a, err = ndarray.FromSlice(s, shape)
	case ndarray.Int64:
		s := make([]int64, len(v))
		for i, x := range v {
			s[i] = int64(x)
		}
		a, err = ndarray.FromSlice(s, shape)
	default:
		t.Fatalf("no test data for dtype %s", dt)
	}
	check.NoError(t, err)
	return a
}

func fromArray(t *testing.T, a *ndarray.NDArray) []float64 {
	t.Helper()
	var out []float64
	switch a.DType() {
	case ndarray.Float32:
		s, err := ndarray.ToSlice[float32](a)
		check.NoError(t, err)
		for _, x := range s {
			out = append(out, float64(x))
		}
	case ndarray.Float64:
		s, err := ndarray.ToSlice[float64](a)
		check.NoError(t, err)
		out = s
	case ndarray.Int32:
		s, err := ndarray.ToSlice[int32](a)
		check.NoError(t, err)
		for _, x := range s {
			out = append(out, float64(x))
		}
	case ndarray.Int64:
		s, err := ndarray.ToSlice[int64](a)
		check.NoError(t, err)
		for _, x := range s {
			out = append(out, float64(x))
		}
	}
	return out
}

// shapeOf resolves a parameter's shape with the case's sizes.
func shapeOf(t *testing.T, p abi.ParamInfo, sizes map[string]int64) ndarray.Shape {
	t.Helper()
	shape := make(ndarray.Shape, len(p.Shape))
	for i, d := range p.Shape {
		if d.Name == "" {
			shape[i] = d.Value
			continue
		}
		v, ok := sizes[d.Name]
		if !ok {
			t.Fatalf("parameter %q: no size for %q", p.Name, d.Name)
		}
		shape[i] = v
	}
	return shape
}

func compare(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	check.Equal(t, len(got), len(want), what, "length")
	for i := range got {
		g, w := got[i], want[i]
		if g == w || (math.IsNaN(g) && math.IsNaN(w)) {
			continue
		}
		if tol > 0 && math.Abs(g-w) <= tol*math.Max(1, math.Abs(w)) {
			continue
		}
		t.Fatalf("%s[%d] = %v, want %v", what, i, g, w)
	}
}

// TestDifferential runs every case as compiled C (through devices/cpu)
// and checks it against the Go reference.
func TestDifferential(t *testing.T) {
	mod, art := casesLibrary(t)
	m := casesModule(t)
	for _, tc := range diffCases {
		t.Run(tc.fn, func(t *testing.T) {
			f := m.PrimFunc(tc.fn)
			check.True(t, f != nil, "function in cases.py")
			sig := transform.Signature(f)
			fi, ok := art.Function(tc.fn)
			check.True(t, ok, "function in the manifest")
			check.Equal(t, fi, sig)

			rng := rand.New(rand.NewPCG(1, uint64(len(tc.fn))))
			data := map[string][]float64{}
			var args []packedfunc.Value
			arrays := map[string]*ndarray.NDArray{}
			for _, p := range sig.Params {
				if p.Kind != abi.ParamTensor {
					v := tc.scalars[p.Name]
					if p.Kind == abi.ParamFloat {
						args = append(args, packedfunc.Float(v))
					} else {
						args = append(args, packedfunc.Int(int64(v)))
					}
					continue
				}
				dt := ndarray.MustParseDType(p.DType)
				shape := shapeOf(t, p, tc.sizes)
				data[p.Name] = fill(rng, dt, shape.NumElements())
				a := toArray(t, dt, shape, data[p.Name])
				arrays[p.Name] = a
				args = append(args, packedfunc.Array(a))
			}
			before := map[string][]float64{}
			for n, d := range data {
				before[n] = slices.Clone(d)
			}
			tc.ref(data, tc.scalars)
			// The signature marks as outputs the tensors the function
			// writes: every other one keeps its values.
			outputs := 0
			for _, p := range sig.Params {
				if p.Kind != abi.ParamTensor {
					continue
				}
				if p.Output {
					outputs++
					continue
				}
				check.True(t, slices.Equal(data[p.Name], before[p.Name]), tc.fn, "writes", p.Name, "which its signature does not mark as an output")
			}
			check.True(t, outputs > 0, tc.fn, "has no parameter marked as an output")

			// The same inputs through three engines: the interpreter on the
			// IR as written, the interpreter on the lowered IR (before the
			// packed API), and the compiled C.
			lowered, err := transform.Lower(f, transform.Options{StopAfter: "storage_rewrite", Verify: true})
			check.NoError(t, err)
			engines := []struct {
				name string
				run  func(args []packedfunc.Value) error
			}{
				{"interp", func(args []packedfunc.Value) error { return interp.Run(f, valuesAsAny(args)...) }},
				{"interp lowered", func(args []packedfunc.Value) error { return interp.Run(lowered, valuesAsAny(args)...) }},
				{"C", func(args []packedfunc.Value) error {
					fn, err := mod.GetFunction(tc.fn)
					if err != nil {
						return err
					}
					_, err = fn.Call(args...)
					return err
				}},
			}
			for _, e := range engines {
				// Fresh copies of the inputs for each engine.
				var eargs []packedfunc.Value
				earrays := map[string]*ndarray.NDArray{}
				for i, p := range sig.Params {
					if a, ok := arrays[p.Name]; ok {
						c := toArray(t, a.DType(), a.Shape(), fromArray(t, a))
						earrays[p.Name] = c
						eargs = append(eargs, packedfunc.Array(c))
					} else {
						eargs = append(eargs, args[i])
					}
				}
				check.NoError(t, e.run(eargs), e.name)
				for name, a := range earrays {
					compare(t, e.name+": "+name, fromArray(t, a), data[name], tc.tol)
				}
			}
		})
	}
}

// TestBadArguments checks calls that the loader rejects before entering
// C, through the metadata Build wrote.
func TestBadArguments(t *testing.T) {
	mod, _ := casesLibrary(t)
	fn, err := mod.GetFunction("vecadd")
	check.NoError(t, err)
	mk := func(dt ndarray.DType, n int64) packedfunc.Value {
		a, err := ndarray.Empty(ndarray.Shape{n}, dt, devices.CPUDevice)
		check.NoError(t, err)
		return packedfunc.Array(a)
	}
	f32a := func(n int64) packedfunc.Value { return mk(ndarray.Float32, n) }
	tests := []struct {
		name string
		args []packedfunc.Value
		want []string
	}{
		{"arity", []packedfunc.Value{f32a(4), f32a(4)}, []string{"vecadd", "want 3, got 2"}},
		{"dtype", []packedfunc.Value{f32a(4), mk(ndarray.Int32, 4), f32a(4)}, []string{"vecadd", `"B"`, "int32", "want float32"}},
		{"symbolic shape", []packedfunc.Value{f32a(4), f32a(5), f32a(4)}, []string{"vecadd", `"B"`, "n is already 4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := fn.Call(tt.args...)
			check.Error(t, err, tt.want...)
		})
	}
}

func TestBuildCache(t *testing.T) {
	m := ir.NewIRModule().With("vecadd", casesModule(t).PrimFunc("vecadd"))
	cache := &toolchain.Cache{Dir: t.TempDir()}
	ctx := context.Background()
	target := compiler.MustParseTarget("cpu")
	// -O0 keeps the C compiler quick; the flags are still part of the key.
	first, err := compiler.BuildWithResult(ctx, m, target, compiler.BuildOptions{Cache: cache, CFlags: []string{"-O0"}})
	check.NoError(t, err)
	check.True(t, !first.Cached, "first build is cold")
	second, err := compiler.BuildWithResult(ctx, m, target, compiler.BuildOptions{Cache: cache, CFlags: []string{"-O0"}})
	check.NoError(t, err)
	check.True(t, second.Cached, "second build comes from the cache")
	check.Equal(t, second.Key, first.Key)
	check.Equal(t, second.Artifact.Manifest.Functions, first.Artifact.Manifest.Functions)
	check.True(t, strings.Contains(first.Artifact.Manifest.Toolchain, "-O0"), "manifest names the toolchain flags")
	check.Equal(t, first.Artifact.Manifest.Target, "cpu")

	// Other flags make another key; dumps and kept sources bypass the cache.
	var dump strings.Builder
	keep := t.TempDir()
	third, err := compiler.BuildWithResult(ctx, m, target, compiler.BuildOptions{Cache: cache, CFlags: []string{"-O1"},
		DumpIR: []string{"simplify"}, Dump: &dump, KeepSource: keep})
	check.NoError(t, err)
	check.True(t, !third.Cached && third.Key != first.Key, "flags are part of the key")
	check.True(t, strings.Contains(dump.String(), "# after simplify: vecadd"), dump.String())
	kept, err := os.ReadFile(filepath.Join(keep, compiler.SourceName))
	check.NoError(t, err)
	check.Equal(t, string(kept), third.Source)
}

func TestBuildErrors(t *testing.T) {
	ctx := context.Background()
	cpuT := compiler.MustParseTarget("cpu")
	t.Run("compile error", func(t *testing.T) {
		// A math function called without its argument fails in the C
		// compiler.
		src := `# from tvm.script import tir as T
@T.prim_func
def broken(A: T.Buffer((4,), "float32")):
    T.func_attr({"global_symbol": "broken"})
    for i in range(4):
        A[i] = T.call_extern("float32", "sqrtf")
`
		m, err := script.Parse("broken.py", src)
		check.NoError(t, err)
		_, err = compiler.Build(ctx, m, cpuT, compiler.BuildOptions{NoCache: true, CFlags: []string{"-O0"}})
		var ce *toolchain.CompileError
		check.True(t, errors.As(err, &ce), fmt.Sprintf("want a CompileError, got %v", err))
		check.Error(t, err, "sqrtf")
		check.True(t, len(ce.Diags) > 0 && strings.Contains(ce.Diags[0].Source, "sqrtf"), "diagnostic shows the generated line")
	})
	t.Run("unknown extern", func(t *testing.T) {
		// A function that is neither the math library's nor the module's
		// is refused before the C compiler runs, naming it.
		src := `# from tvm.script import tir as T
@T.prim_func
def broken(A: T.Buffer((4,), "int32")):
    T.func_attr({"global_symbol": "broken"})
    for i in range(4):
        A[i] = T.call_extern("int32", "no_such_function", i)
`
		m, err := script.Parse("broken.py", src)
		check.NoError(t, err)
		_, err = compiler.Build(ctx, m, cpuT, compiler.BuildOptions{NoCache: true})
		var ce *toolchain.CompileError
		check.True(t, !errors.As(err, &ce), fmt.Sprintf("want a refusal before the C compiler, got %v", err))
		check.Error(t, err, `call_extern of "no_such_function" refused`, "exp,", "broken")
	})
	t.Run("dynamic vectorize", func(t *testing.T) {
		src := `# from tvm.script import tir as T
@T.prim_func
def dyn(var_A: T.handle):
    T.func_attr({"global_symbol": "dyn"})
    n = T.int32()
    A = T.match_buffer(var_A, (n,))
    for i in T.vectorized(n):
        A[i] = T.float32(1)
`
		m, err := script.Parse("dyn.py", src)
		check.NoError(t, err)
		_, err = compiler.Build(ctx, m, cpuT, compiler.BuildOptions{NoCache: true})
		check.Error(t, err, `pass "vectorize"`, `function "dyn"`, `loop "i"`, "not a constant")
	})
	t.Run("no functions", func(t *testing.T) {
		_, err := compiler.Build(ctx, ir.NewIRModule(), cpuT, compiler.BuildOptions{NoCache: true})
		check.Error(t, err, "no PrimFuncs")
	})
	t.Run("unknown dump pass", func(t *testing.T) {
		_, err := compiler.Build(ctx, casesModule(t), cpuT, compiler.BuildOptions{NoCache: true, DumpIR: []string{"nope"}})
		check.Error(t, err, `unknown pass "nope"`, "flatten_buffers")
	})
}

func TestCUDATarget(t *testing.T) {
	lim, err := compiler.MustParseTarget("cuda -arch=sm_90").CUDA()
	check.NoError(t, err)
	check.Equal(t, lim.Arch, "sm_90")
	check.Equal(t, lim.MaxThreadsPerBlock, int64(1024))
	check.Equal(t, lim.WarpSize, int64(32))
	_, err = compiler.MustParseTarget("cpu").CUDA()
	check.Error(t, err, `target "cpu" is not a cuda target`)
	_, err = compiler.Build(context.Background(), ir.NewIRModule(), compiler.MustParseTarget("cuda"), compiler.BuildOptions{NoCache: true})
	check.Error(t, err, `target "cuda -arch=sm_80": no CUDA compiler (NVRTC) is linked into this program`)
}

func TestParseTarget(t *testing.T) {
	tests := []struct {
		in   string
		want string
		err  string
	}{
		{in: "cpu", want: "cpu"},
		{in: "llvm", want: "cpu"},
		{in: "cpu -mcpu=znver4", want: "cpu -mcpu=znver4"},
		{in: "cpu -mtriple=aarch64-linux-gnu", want: "cpu -mtriple=aarch64-linux-gnu"},
		{in: "cuda", want: "cuda -arch=sm_80"},
		{in: "cuda -arch=sm_90", want: "cuda -arch=sm_90"},
		{in: "nvptx -arch=sm_86", want: "cuda -arch=sm_86"},
		{in: "cuda -arch=sm_70", err: `cuda architecture "sm_70" is not supported (want one of sm_80, sm_86, sm_89, sm_90)`},
		{in: "cuda -mcpu=x", err: `option "-mcpu=x": a cuda target takes -arch=sm_80|sm_86|sm_89|sm_90`},
		{in: "tpu", err: `unknown kind "tpu"`},
		{in: "cpu -O3", err: `option "-O3"`},
		{in: "cpu -mfoo=1", err: `unknown option "-mfoo"`},
		{in: "", err: "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := compiler.ParseTarget(tt.in)
			if tt.err != "" {
				check.Error(t, err, tt.err)
				return
			}
			check.NoError(t, err)
			check.Equal(t, got.String(), tt.want)
		})
	}
}

// buildCPU builds m for the CPU and loads its host library (closed when
// the test ends).
func buildCPU(t *testing.T, m *ir.IRModule, opts compiler.BuildOptions) (*artifact.Artifact, *cpu.Module) {
	t.Helper()
	a, err := compiler.Build(context.Background(), m, compiler.MustParseTarget("cpu"), opts)
	check.NoError(t, err)
	so := filepath.Join(t.TempDir(), artifact.HostLib)
	check.NoError(t, os.WriteFile(so, a.Files[artifact.HostLib], 0o755))
	mod, err := cpu.LoadModule(so)
	check.NoError(t, err)
	t.Cleanup(func() { mod.Close() })
	return a, mod
}

// TestSeedModule builds the IRModule tutorial's module after the zero pipeline (fused
// PrimFuncs with int64 shapes and intermediate buffers, beside a Relax
// function that Build leaves out) and checks every function's compiled C
// against the reference interpreter on the same random inputs.
func TestSeedModule(t *testing.T) {
	path := filepath.Join("..", "..", "shared", "seeds", "restored", "001_after_zero_pipeline.py")
	src, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("TVM's example modules (shared/seeds/restored beside the repository) not present")
	}
	check.NoError(t, err)
	m, err := script.Parse(filepath.Base(path), string(src))
	check.NoError(t, err)
	a, mod := buildCPU(t, m, compiler.BuildOptions{NoCache: true, VerifyIR: true})
	for name, f := range m.PrimFuncs() {
		t.Run(name, func(t *testing.T) {
			fi, ok := a.Function(name)
			check.True(t, ok, "function in the manifest")
			rng := rand.New(rand.NewPCG(7, 7))
			var cArgs, iArgs []packedfunc.Value
			var cArr, iArr []*ndarray.NDArray
			for _, p := range fi.Params {
				dt := ndarray.MustParseDType(p.DType)
				shape := shapeOf(t, p, nil)
				data := fill(rng, dt, shape.NumElements())
				ca, ia := toArray(t, dt, shape, data), toArray(t, dt, shape, data)
				cArr, iArr = append(cArr, ca), append(iArr, ia)
				cArgs, iArgs = append(cArgs, packedfunc.Array(ca)), append(iArgs, packedfunc.Array(ia))
			}
			fn, err := mod.GetFunction(name)
			check.NoError(t, err)
			_, err = fn.Call(cArgs...)
			check.NoError(t, err)
			check.NoError(t, interp.Run(f, valuesAsAny(iArgs)...))
			for i := range cArr {
				compare(t, fi.Params[i].Name, fromArray(t, cArr[i]), fromArray(t, iArr[i]), 1e-5)
			}
		})
	}
}
