package compiler_test

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// gpuScheduleMatmuls are tensor-core matmuls (float16 operands, float32
// and float16 accumulation, one with a bias and ReLU epilogue) beside the CUDA generator's test functions.
const gpuScheduleMatmuls = `# from tvm.script import tir as T
@T.prim_func
def mm_fp32acc(A: T.Buffer((64, 48), "float16"), B: T.Buffer((48, 96), "float16"), C: T.Buffer((64, 96), "float32")):
    T.func_attr({"global_symbol": "mm_fp32acc", "tir.noalias": T.bool(True)})
    for i, j, k in T.grid(64, 96, 48):
        with T.block("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + T.Cast("float32", A[vi, vk]) * T.Cast("float32", B[vk, vj])
@T.prim_func
def mm_fp16(A: T.Buffer((32, 32), "float16"), B: T.Buffer((32, 64), "float16"), C: T.Buffer((32, 64), "float16")):
    T.func_attr({"global_symbol": "mm_fp16", "tir.noalias": T.bool(True)})
    for i, j, k in T.grid(32, 64, 32):
        with T.block("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float16(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
@T.prim_func
def mm_bias_relu_fp16(A: T.Buffer((32, 64), "float16"), B: T.Buffer((64, 16), "float16"), bias: T.Buffer((16,), "float16"), D: T.Buffer((32, 16), "float16")):
    T.func_attr({"global_symbol": "mm_bias_relu_fp16", "tir.noalias": T.bool(True)})
    C = T.alloc_buffer((32, 16), "float16")
    for i, j, k in T.grid(32, 16, 64):
        with T.block("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float16(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
    for i, j in T.grid(32, 16):
        with T.block("D"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = T.max(C[vi, vj] + bias[vj], T.float16(0))
`

// TestGPUSchedulesAgreeWithCPU runs the functions the CUDA generator's
// default-schedule test uses (codegen/cuda/testdata/unscheduled.py: the
// shared-memory matmuls, the cross-thread reductions, softmax, layer norm,
// the fallback) and two tensor-core matmuls both ways on the same random inputs: unscheduled, compiled for the CPU
// backend, and scheduled for the GPU, in the reference interpreter with
// CUDA's semantics (blocks, threads, barriers, warp shuffles, ptx_mma).
// The outputs agree up to the rounding of sums taken in another order
// (float16 ones: float16's rounding of the CPU's sequential sum). The
// CUDA-on-CPU harness is compared with the same interpreter runs in
// compiler/codegen/cuda.
func TestGPUSchedulesAgreeWithCPU(t *testing.T) {
	text, err := os.ReadFile(filepath.Join("codegen", "cuda", "testdata", "unscheduled.py"))
	check.NoError(t, err)
	m, err := script.Parse("unscheduled.py", string(text))
	check.NoError(t, err)
	mm, err := script.Parse("matmuls.py", gpuScheduleMatmuls)
	check.NoError(t, err)
	for name, f := range mm.PrimFuncs() {
		m = m.With(name, f)
	}
	_, mod := buildCPU(t, m, compiler.BuildOptions{NoCache: true})
	for name, f := range m.PrimFuncs() {
		t.Run(name, func(t *testing.T) {
			g, err := auto.GPUFunc(f, auto.GPUOptions{})
			check.NoError(t, err)
			if mm.PrimFunc(name) != nil {
				mma := false
				ir.Visit(g.Body, func(n ir.Node) bool {
					if c, ok := n.(*ir.Call); ok && c.Op == ir.OpPtxMma {
						mma = true
					}
					return !mma
				})
				check.True(t, mma, name, "does not run on the tensor cores")
			}
			rng := rand.New(rand.NewPCG(11, 11))
			var cArgs []packedfunc.Value
			var iArgs []any
			var cArr, iArr []*ndarray.NDArray
			for _, p := range f.Params {
				b, ok := f.BufferMap[p]
				if !ok {
					cArgs, iArgs = append(cArgs, packedfunc.Float(1.5)), append(iArgs, float32(1.5))
					continue
				}
				shape := ndarray.Shape{}
				for _, s := range b.Shape {
					v, _ := ir.IsConstInt(s)
					shape = append(shape, v)
				}
				raw := make([]byte, shape.NumElements()*int64(b.DType.Size()))
				for j := range shape.NumElements() {
					// Multiples of 1/64 in [-1, 1]: exact in float16.
					x := float32(rng.IntN(129)-64) / 64
					if b.DType == ndarray.Float16 {
						binary.LittleEndian.PutUint16(raw[2*j:], half(x))
					} else {
						binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(x))
					}
				}
				ca, err := ndarray.FromBytes(append([]byte(nil), raw...), shape, b.DType, devices.CPUDevice)
				check.NoError(t, err)
				ia, err := ndarray.FromBytes(raw, shape, b.DType, devices.CPUDevice)
				check.NoError(t, err)
				cArr, iArr = append(cArr, ca), append(iArr, ia)
				cArgs, iArgs = append(cArgs, packedfunc.Array(ca)), append(iArgs, ia)
			}
			fn, err := mod.GetFunction(name)
			check.NoError(t, err)
			_, err = fn.Call(cArgs...)
			check.NoError(t, err)
			check.NoError(t, interp.Run(g, iArgs...))
			for i := range cArr {
				want, got := floats(t, cArr[i]), floats(t, iArr[i])
				tol := 1e-5
				if cArr[i].DType() == ndarray.Float16 {
					tol = 64 * math.Ldexp(1, -11) // up to 64 additions, each within float16's unit roundoff
				}
				compare(t, name, got, want, tol)
			}
		})
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

// floats decodes a float32 or float16 array.
func floats(t *testing.T, a *ndarray.NDArray) []float64 {
	t.Helper()
	raw, err := a.Bytes()
	check.NoError(t, err)
	var out []float64
	switch a.DType() {
	case ndarray.Float32:
		for j := 0; j < len(raw); j += 4 {
			out = append(out, float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[j:]))))
		}
	case ndarray.Float16:
		for j := 0; j < len(raw); j += 2 {
			h := binary.LittleEndian.Uint16(raw[j:])
			e, m := int(h>>10&0x1f), float64(h&0x3ff)
			v := math.Ldexp(1024+m, e-25)
			if e == 0 {
				v = math.Ldexp(m, -24)
			}
			if h&0x8000 != 0 {
				v = -v
			}
			out = append(out, v)
		}
	default:
		t.Fatalf("dtype %s", a.DType())
	}
	return out
}
