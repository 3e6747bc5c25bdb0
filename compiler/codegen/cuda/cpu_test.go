package cuda_test

import (
	"context"
	"encoding/binary"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/codegen/cuda"
	vmgen "github.com/kiln-ml/kiln/compiler/codegen/vm"
	"github.com/kiln-ml/kiln/compiler/frontend/nn"
	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	relaxtransform "github.com/kiln-ml/kiln/compiler/relax/transform"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// defaultScheduled is every module whose functions the tests build for
// cuda with the default GPU schedules, unscheduled: the generator's
// unscheduled.py (shared-memory matmuls, row sums, GEMV, softmax, layer
// norm, injective kernels), its tensor-core matmuls (TestTensorCoreMatmul's;
// the bfloat16 ones are skipped: the CPU backend has no bfloat16), each module restored from
// TVM's documents (graph modules after the default pipeline), the
// IRModule tutorial's MLP after the default pipeline (its fused kernels)
// and the tensor-expression document's matmul (at 128³ here, 1024³ in
// the compiler's build test: the same schedule with fewer blocks).
func defaultScheduled(t *testing.T) map[string]*ir.IRModule {
	t.Helper()
	parse := func(name, text string) *ir.IRModule {
		m, err := script.Parse(name, text)
		check.NoError(t, err)
		if vmgen.HasGraphFunctions(m) {
			m, err = relaxtransform.RunPipeline(m, compiler.DefaultPipeline)
			check.NoError(t, err, name)
		}
		return m
	}
	text, err := os.ReadFile(filepath.Join("testdata", "unscheduled.py"))
	check.NoError(t, err)
	mma := ir.NewIRModule()
	for name, src := range cuda.TensorCoreMatmuls() {
		mm := parse(name+".py", src).PrimFunc("mm")
		mma = mma.With("mm_"+name, mm.WithAttr(ir.AttrGlobalSymbol, "mm_"+name))
	}
	mods := map[string]*ir.IRModule{
		"unscheduled.py":      parse("unscheduled.py", string(text)),
		"tensor-core matmuls": mma,
	}
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "..", "shared", "seeds", "restored", "*.py"))
	check.NoError(t, err)
	for _, file := range files {
		text, err := os.ReadFile(file)
		check.NoError(t, err)
		mods[filepath.Base(file)] = parse(filepath.Base(file), string(text))
	}
	mlp := nn.NewNamedSequential(
		nn.Named("fc1", nn.NewLinear(784, 256, true)),
		nn.Named("relu1", nn.NewReLU()),
		nn.Named("fc2", nn.NewLinear(256, 10, true)),
	)
	m, _, err := nn.Export(mlp, nn.Spec{Inputs: []nn.Input{{Name: "x", Shape: []int64{1, 784}, DType: ir.Float32}}, Seed: 7})
	check.NoError(t, err)
	m, err = relaxtransform.RunPipeline(m, compiler.DefaultPipeline)
	check.NoError(t, err)
	mods["MLP"] = m

	const size = 128
	n := ir.NewIntImm(ir.Int64, size)
	A := te.Placeholder([]ir.Expr{n, n}, ir.Float32, "A")
	B := te.Placeholder([]ir.Expr{n, n}, ir.Float32, "B")
	k := te.ReduceAxis(ir.RangeFromExtent(n), "k")
	C := te.Compute([]ir.Expr{n, n}, func(i, j ir.Expr) ir.Expr { return te.Sum(ir.Mul(A.At(i, k), B.At(k, j)), k) }, "C")
	mm, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	check.NoError(t, err)
	mods["tensor-expression matmul"] = ir.NewIRModule().With("matmul", mm.WithAttr(ir.AttrGlobalSymbol, "matmul"))
	return mods
}

// TestDefaultSchedulesAgreeWithCPU gives every function of every module
// the tests build for cuda (defaultScheduled) the default GPU schedule,
// generates its CUDA, compiles it with NVRTC for every architecture (no
// spills, shared memory within the limit), and runs it two ways on the
// same random inputs: the scheduled TensorIR in the reference interpreter
// with CUDA's semantics (blocks, threads, barriers, warp shuffles,
// ptx_mma, shared-memory race checks), and the generated CUDA source
// compiled for the host with the emulation header. Both must agree with
// the CPU backend's build of the unscheduled function, up to the rounding
// of sums taken in another order (float16 ones: float16's rounding of the
// CPU's sequential sum). A function that appears in several modules runs
// once.
func TestDefaultSchedulesAgreeWithCPU(t *testing.T) {
	seen := map[string]bool{}
	mods := defaultScheduled(t)
	names := slices.Sorted(func(yield func(string) bool) {
		for name := range mods {
			if !yield(name) {
				return
			}
		}
	})
	for _, modName := range names {
		t.Run(modName, func(t *testing.T) {
			orig, scheduled := ir.NewIRModule(), ir.NewIRModule()
			n := 0
			for name, f := range mods[modName].PrimFuncs() {
				text := name + "\n" + script.Print(f)
				if seen[text] {
					continue
				}
				seen[text] = true
				g, err := auto.GPUFunc(f, auto.GPUOptions{})
				check.NoError(t, err, name)
				orig, scheduled = orig.With(name, f), scheduled.With(name, g)
				n++
			}
			if n == 0 {
				t.Skip("every function was checked in another module")
			}
			lowered, err := transform.LowerModule(scheduled, cuda.LowerOptions())
			check.NoError(t, err)
			src, ks, err := cuda.Generate(lowered, cuda.SM80(t))
			check.NoError(t, err)
			check.Equal(t, len(ks), n, "kernels")
			t.Run("nvrtc", func(t *testing.T) { cuda.CompileAll(t, src, ks) })

			forCPU := ir.NewIRModule()
			for name, f := range orig.PrimFuncs() {
				if !slices.ContainsFunc(slices.Collect(maps.Values(f.BufferMap)), func(b *ir.Buffer) bool { return b.DType == ndarray.BFloat16 }) {
					forCPU = forCPU.With(name, f)
				}
			}
			a, err := compiler.Build(context.Background(), forCPU, compiler.MustParseTarget("cpu"), compiler.BuildOptions{})
			check.NoError(t, err)
			so := filepath.Join(t.TempDir(), artifact.HostLib)
			check.NoError(t, os.WriteFile(so, a.Files[artifact.HostLib], 0o755))
			lib, err := cpu.LoadModule(so)
			check.NoError(t, err)
			t.Cleanup(func() { lib.Close() })
			bin := cuda.EmulateBuild(t, src, ks, maps.Collect(orig.PrimFuncs()))
			for _, k := range ks {
				t.Run(k.Name, func(t *testing.T) {
					f, g := orig.PrimFunc(k.Name), scheduled.PrimFunc(k.Name)
					check.True(t, f != nil, "no function", k.Name)
					agreeWithCPU(t, lib, bin, k, f, g)
				})
			}
		})
	}
}

// agreeWithCPU runs f compiled for the CPU (in lib), its scheduled
// version g in the interpreter and kernel k emulated on the host on the
// same random inputs and compares every buffer.
func agreeWithCPU(t *testing.T, lib *cpu.Module, bin string, k cuda.Kernel, f, g *ir.PrimFunc) {
	rng := rand.New(rand.NewPCG(11, 11))
	var cArgs []packedfunc.Value
	var iArgs []any
	var cArr, iArr []*ndarray.NDArray
	var bufs [][]byte
	for _, p := range f.Params {
		b, ok := f.BufferMap[p]
		if !ok {
			cArgs, iArgs = append(cArgs, packedfunc.Float(1.5)), append(iArgs, float32(1.5))
			continue
		}
		if b.DType == ndarray.BFloat16 {
			t.Skip("the CPU backend has no bfloat16: compared with the interpreter's run of the unscheduled function in TestTensorCoreMatmul")
		}
		check.True(t, b.DType == ndarray.Float32 || b.DType == ndarray.Float16, "buffer", b.Name, "of", b.DType)
		shape := ndarray.Shape{}
		for _, s := range b.Shape {
			v, ok := ir.IsConstInt(s)
			check.True(t, ok, "buffer", b.Name, "has a symbolic shape")
			shape = append(shape, v)
		}
		raw := make([]byte, shape.NumElements()*int64(b.DType.Size()))
		for j := range shape.NumElements() {
			// Multiples of 1/64 in [-1, 1]: exact in float16, and their
			// products' sums exact in float32 while below 2^12.
			x := float32(rng.IntN(129)-64) / 64
			if b.DType == ndarray.Float16 {
				binary.LittleEndian.PutUint16(raw[2*j:], half(x))
			} else {
				binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(x))
			}
		}
		ca, err := ndarray.FromBytes(slices.Clone(raw), shape, b.DType, devices.CPUDevice)
		check.NoError(t, err)
		ia, err := ndarray.FromBytes(slices.Clone(raw), shape, b.DType, devices.CPUDevice)
		check.NoError(t, err)
		cArr, iArr = append(cArr, ca), append(iArr, ia)
		cArgs, iArgs = append(cArgs, packedfunc.Array(ca)), append(iArgs, ia)
		bufs = append(bufs, raw)
	}
	fn, err := lib.GetFunction(k.Name)
	check.NoError(t, err)
	_, err = fn.Call(cArgs...)
	check.NoError(t, err)
	check.NoError(t, interp.Run(g, iArgs...), "interpreter")
	emulated := cuda.EmulateKernel(t, bin, k, bufs)
	for i, ca := range cArr {
		wantRaw, err := ca.Bytes()
		check.NoError(t, err)
		interpRaw, err := iArr[i].Bytes()
		check.NoError(t, err)
		want := cuda.DecodeFloats(ca.DType(), wantRaw)
		tol := 1e-5
		if ca.DType() == ndarray.Float16 {
			tol = 64 * math.Ldexp(1, -11) // up to 64 additions, each within float16's unit roundoff
		}
		for _, run := range []struct {
			name string
			raw  []byte
		}{{"interpreter", interpRaw}, {"emulated CUDA", emulated[i]}} {
			got := cuda.DecodeFloats(ca.DType(), run.raw)
			check.Equal(t, len(got), len(want), run.name, "buffer", i)
			for j := range want {
				w, h := float64(want[j]), float64(got[j])
				if h != w && !(math.Abs(h-w) <= tol*math.Max(1, math.Abs(w))) {
					t.Fatalf("%s buffer %d element %d: %s %g, CPU backend %g", k.Name, i, j, run.name, h, w)
				}
			}
		}
	}
}

// half is the float16 bits of x, a multiple of 1/64 in [-1, 1].
func half(x float32) uint16 {
	if x == 0 {
		return 0
	}
	b := math.Float32bits(x)
	return uint16(b>>16)&0x8000 | uint16(int(b>>23&0xff)-127+15)<<10 | uint16(b>>13&0x3ff)
}
