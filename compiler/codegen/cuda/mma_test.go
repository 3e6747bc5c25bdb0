package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/devices"
	cudadev "github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// mmaMatmulSource is an m×n×k matmul C = A·B of operands of dtype dt:
// with acc "float32" the products of the operands cast to float32 are
// summed into a float32 C (mixed precision); with acc = dt everything is
// in dt. transposed stores B as (n, k).
func mmaMatmulSource(m, n, k int, dt, acc string, transposed bool) string {
	a, b := "A[vi, vk]", "B[vk, vj]"
	bShape := fmt.Sprintf("(%d, %d)", k, n)
	if transposed {
		b, bShape = "B[vj, vk]", fmt.Sprintf("(%d, %d)", n, k)
	}
	prod := a + " * " + b
	if acc != dt {
		prod = fmt.Sprintf(`T.Cast("float32", %s) * T.Cast("float32", %s)`, a, b)
	}
	return fmt.Sprintf(`# from tvm.script import tir as T
@T.prim_func
def mm(A: T.Buffer((%[1]d, %[3]d), "%[4]s"), B: T.Buffer(%[6]s, "%[4]s"), C: T.Buffer((%[1]d, %[2]d), "%[5]s")):
    T.func_attr({"global_symbol": "mm", "tir.noalias": T.bool(True)})
    for i, j, k in T.grid(%[1]d, %[2]d, %[3]d):
        with T.block("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.%[5]s(0)
            C[vi, vj] = C[vi, vj] + %[7]s
`, m, n, k, dt, acc, bShape, prod)
}

// tensorCoreSource is the TVMScript of a tensorCoreCases entry (its
// function named mm): mmaMatmulSource, and for a name ending in _bias_relu
// D = max(C + bias, 0) with C an intermediate.
func tensorCoreSource(name string, m, n, k int, dt, acc string, transposed bool) string {
	src := mmaMatmulSource(m, n, k, dt, acc, transposed)
	if strings.HasSuffix(name, "_bias_relu") {
		src = strings.Replace(src, `C: T.Buffer((32, 16), "float16")):`, `bias: T.Buffer((16,), "float16"), D: T.Buffer((32, 16), "float16")):
    C = T.alloc_buffer((32, 16), "float16")`, 1)
		src += `    for i, j in T.grid(32, 16):
        with T.block("D"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = T.max(C[vi, vj] + bias[vj], T.float16(0))
`
	}
	return src
}

// tensorCoreCases are the matmuls the default GPU schedule runs on the
// tensor cores in the tests (TestTensorCoreMatmul here; against the CPU
// backend, TestDefaultSchedulesAgreeWithCPU).
var tensorCoreCases = []struct {
	name       string
	m, n, k    int
	dt, acc    string
	transposed bool
	shared     int64
}{
	{"fp16", 128, 128, 64, "float16", "float16", false, (128*32 + 32*128) * 2},
	{"bf16", 128, 128, 64, "bfloat16", "bfloat16", false, (128*32 + 32*128) * 2},
	{"fp16_fp32acc", 64, 96, 48, "float16", "float32", false, (64*16 + 16*96) * 2},
	{"bf16_fp32acc_nt", 32, 64, 32, "bfloat16", "float32", true, (32*32 + 32*64) * 2},
	{"fp16_bias_relu", 32, 16, 64, "float16", "float16", false, (32*32 + 32*16) * 2},
}

// TestTensorCoreMatmul gives float16 and bfloat16 matmuls (accumulating in
// their own dtype or, mixed precision, in float32; B stored (k, n) or
// (n, k)) the default GPU schedule: tensor cores through ptx_mma
// m16n8k16. NVRTC compiles the kernels for every architecture with no
// spills; the host emulation of the generated CUDA (the inline PTX's
// semantics on the 32 threads of each warp) matches the interpreter's run
// of the scheduled TensorIR (CUDA's semantics, mma's fragment layout); and
// that run matches the unscheduled function's: bit for bit when it sums in
// float32, within float16's or bfloat16's rounding of its sequential sum
// otherwise. A matmul with a bias and ReLU epilogue computes them from the
// accumulators.
func TestTensorCoreMatmul(t *testing.T) {
	for _, tc := range tensorCoreCases {
		t.Run(tc.name, func(t *testing.T) {
			src := tensorCoreSource(tc.name, tc.m, tc.n, tc.k, tc.dt, tc.acc, tc.transposed)
			orig, err := script.Parse("mm.py", src)
			check.NoError(t, err)
			g, err := auto.GPUFunc(orig.PrimFunc("mm"), auto.GPUOptions{})
			check.NoError(t, err)
			scheduled := ir.NewIRModule().With("mm", g)
			lowered, err := transform.LowerModule(scheduled, LowerOptions())
			check.NoError(t, err)
			cu, ks, err := Generate(lowered, sm80(t))
			check.NoError(t, err)
			check.Equal(t, len(ks), 1)
			check.Equal(t, ks[0].SharedBytes, tc.shared)
			ab := map[string]string{"float16": "fp16", "bfloat16": "bf16"}[tc.dt]
			check.True(t, strings.Contains(cu, "kiln_mma_m16n8k16_f32_"+ab+"(&C_local["), "no tensor-core call in", cu)
			ptx16 := map[string]string{"float16": "f16", "bfloat16": "bf16"}[tc.dt]
			check.True(t, strings.Contains(cu, `KILN_MMA(kiln_mma_m16n8k16_f32_`+ab+`, "`+ptx16+`"`), "no inline mma.sync for", ab)
			check.True(t, strings.Contains(cu, `asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." AB "." AB ".f32`), "no inline mma.sync")
			t.Run("nvrtc", func(t *testing.T) {
				compileAll(t, cu, ks)
				// The fragments live in registers: mma.sync in the PTX, no
				// stack frame in the cubin.
				ptx, log, err := cudadev.CompilePTX(cu, "kernels.cu", []string{"--gpu-architecture=compute_80"})
				check.NoError(t, err, log)
				check.True(t, strings.Contains(ptx, "mma.sync.aligned.m16n8k16.row.col.f32."+ptx16+"."+ptx16+".f32"), "no mma.sync in the PTX")
				_, log, err = cudadev.CompileCUBIN(cu, "kernels.cu", []string{"--gpu-architecture=sm_80", "--ptxas-options=-v"})
				check.NoError(t, err, log)
				report, err := ParsePTXASReport(log)
				check.NoError(t, err)
				check.Equal(t, report["mm"].StackBytes, int64(0), log)
			})
			t.Run("emulate", func(t *testing.T) { emulate(t, scheduled, cu, ks) })
			if strings.HasSuffix(tc.name, "_bias_relu") {
				return // compared with the CPU backend in TestDefaultSchedulesAgreeWithCPU
			}
			t.Run("interpreter", func(t *testing.T) { compareMatmul(t, orig.PrimFunc("mm"), g, tc.dt, tc.acc, tc.k) })
		})
	}
}

// compareMatmul runs the unscheduled matmul f and its scheduled version g
// with the interpreter on the same random operands (multiples of 1/128 in
// [-1, 1], exact in both 16-bit dtypes) and compares C: bit for bit when
// acc is float32 (both sum the exact products in float32, over k in
// order); otherwise g (float32 sums rounded once) must lie within the
// rounding error of f's sum of k products each rounded to dt.
func compareMatmul(t *testing.T, f, g *ir.PrimFunc, dt, acc string, k int) {
	rng := rand.New(rand.NewSource(3))
	var want, have []*ndarray.NDArray
	for _, p := range f.Params {
		b := f.BufferMap[p]
		shape := ndarray.Shape{}
		for _, s := range b.Shape {
			v, _ := ir.IsConstInt(s)
			shape = append(shape, v)
		}
		raw := make([]byte, shape.NumElements()*int64(b.DType.Size()))
		for j := int64(0); j < shape.NumElements(); j++ {
			x := float32(rng.Intn(257)-128) / 128
			switch b.DType.String() {
			case "float16":
				binary.LittleEndian.PutUint16(raw[2*j:], exactHalf(x))
			case "bfloat16":
				binary.LittleEndian.PutUint16(raw[2*j:], uint16(math.Float32bits(x)>>16))
			case "float32":
				binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(x))
			}
		}
		w, err := ndarray.FromBytes(append([]byte(nil), raw...), shape, b.DType, devices.CPUDevice)
		check.NoError(t, err)
		h, err := ndarray.FromBytes(raw, shape, b.DType, devices.CPUDevice)
		check.NoError(t, err)
		want, have = append(want, w), append(have, h)
	}
	wargs, hargs := make([]any, len(want)), make([]any, len(have))
	for i := range want {
		wargs[i], hargs[i] = want[i], have[i]
	}
	check.NoError(t, interp.Run(f, wargs...))
	check.NoError(t, interp.Run(g, hargs...))
	wb, err := want[2].Bytes()
	check.NoError(t, err)
	hb, err := have[2].Bytes()
	check.NoError(t, err)
	if acc == "float32" {
		w, h := bytesFloat32(wb), bytesFloat32(hb)
		for j := range w {
			if math.Float32bits(h[j]) != math.Float32bits(w[j]) {
				t.Fatalf("C element %d: scheduled %g, unscheduled %g", j, h[j], w[j])
			}
		}
		return
	}
	decode := halfFloats
	eps := math.Ldexp(1, -11) // float16's unit roundoff
	if dt == "bfloat16" {
		decode, eps = bf16Floats, math.Ldexp(1, -8)
	}
	w, h := decode(wb), decode(hb)
	// The reference rounds each of its k products and k partial sums to
	// dt, by at most eps relative to values that stay of order 1 for these
	// operands; the scheduled result rounds once.
	tol := float64(k) * eps
	diffs := 0
	for j := range w {
		d := math.Abs(float64(h[j]) - float64(w[j]))
		if d > tol {
			t.Fatalf("C element %d: scheduled %g, unscheduled %g", j, h[j], w[j])
		}
		if d > 0 {
			diffs++
		}
	}
	t.Logf("%d of %d elements differ from the sequential %s sum (by at most %g)", diffs, len(w), dt, tol)
}

// TestTensorCoreScript prints a tensor-core schedule as TVMScript (ptx_mma
// as TVM's T.ptx_mma) and reads it back to the same function; a ptx_mma
// kiln does not run is refused when parsed.
func TestTensorCoreScript(t *testing.T) {
	orig, err := script.Parse("mm.py", mmaMatmulSource(32, 16, 16, "float16", "float32", false))
	check.NoError(t, err)
	g, err := auto.GPUFunc(orig.PrimFunc("mm"), auto.GPUOptions{})
	check.NoError(t, err)
	text := script.Print(g)
	check.True(t, strings.Contains(text, `T.ptx_mma("float32", "m16n8k16", "row", "col", "fp16", "fp16", "fp32", A_local[`), text)
	again, err := script.Parse("again.py", "# from tvm.script import tir as T\n"+text)
	check.NoError(t, err)
	check.Equal(t, script.Print(again.PrimFunc("mm")), text)
	bad := strings.Replace(text, `"m16n8k16", "row"`, `"m16n8k8", "row"`, 1)
	_, err = script.Parse("bad.py", "# from tvm.script import tir as T\n"+bad)
	check.Error(t, err, `T.ptx_mma: only m16n8k16, row, col, fp16 or bf16 operands and fp32 accumulators are supported, not "m16n8k8"`)
}
