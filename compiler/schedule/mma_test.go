package schedule

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/codegen/cuda"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/internal/check"
)

// halfMatmul returns C (float32) = A · B for float16 A: m×k and B: k×n,
// the products in float32.
func halfMatmul(m, n, k int64) *ir.PrimFunc {
	A := te.Placeholder(te.Shape(m, k), ir.Float16, "A")
	B := te.Placeholder(te.Shape(k, n), ir.Float16, "B")
	r := te.ReduceAxis(ir.RangeFromExtent(ir.I32(k)), "k")
	C := te.Compute(te.Shape(m, n), func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(ir.NewCast(ir.Float32, A.At(i, r)), ir.NewCast(ir.Float32, B.At(r, j))), r)
	}, "C")
	return mustFunc(A, B, C)
}

// mmaSchedule tiles C into 16×8 tiles on blockIdx, accumulates each tile
// in shared memory (so that barriers order the threads' init, the warp's
// mma and the copy back), hoists the init, binds the copies to the
// threads and tensorizes each tile's 16×8×16 steps of k.
func mmaSchedule(t *testing.T, s *Schedule) {
	c := must[BlockRV](t)(s.GetBlock("C"))
	ls := must[[]LoopRV](t)(s.GetLoops(c))
	i := must[[]LoopRV](t)(s.Split(ls[0], -1, 16))
	j := must[[]LoopRV](t)(s.Split(ls[1], -1, 8))
	k := must[[]LoopRV](t)(s.Split(ls[2], -1, 16))
	check.NoError(t, s.Reorder(i[0], j[0], k[0], i[1], j[1], k[1]))
	check.NoError(t, s.Bind(i[0], "blockIdx.y"))
	check.NoError(t, s.Bind(j[0], "blockIdx.x"))
	cw := must[BlockRV](t)(s.CacheWrite(c, 0, "shared"))
	check.NoError(t, s.ReverseComputeAt(cw, j[0]))
	init := must[BlockRV](t)(s.DecomposeReduction(c, k[0]))
	for _, b := range []BlockRV{init, cw} {
		l := must[[]LoopRV](t)(s.GetLoops(b))
		f := must[LoopRV](t)(s.Fuse(l[len(l)-2], l[len(l)-1]))
		th := must[[]LoopRV](t)(s.Split(f, -1, 32))
		check.NoError(t, s.Bind(th[1], "threadIdx.x"))
	}
	check.NoError(t, s.Tensorize(i[1], PtxMmaIntrin))
}

// TestTensorizePtxMma tensorizes a float16 matmul with ptx_mma and runs
// it in the interpreter (which runs a warp's mma as PTX lays out the
// fragments), and generates its CUDA.
func TestTensorizePtxMma(t *testing.T) {
	runCases(t, []schedCase{
		{name: "tensorize_ptx_mma", fn: func() *ir.PrimFunc { return halfMatmul(32, 16, 48) }, apply: mmaSchedule},
	})
	s, err := New(halfMatmul(32, 16, 48))
	check.NoError(t, err)
	mmaSchedule(t, s)
	lim, err := cuda.ArchLimits("sm_80")
	check.NoError(t, err)
	l, err := transform.LowerModule(ir.NewIRModule().With("mma", s.Func().WithAttr(ir.AttrGlobalSymbol, "mma")), cuda.LowerOptions())
	check.NoError(t, err)
	src, kernels, err := cuda.Generate(l, lim)
	check.NoError(t, err)
	check.True(t, strings.Contains(src, "kiln_mma_m16n8k16_f32_fp16(&C_shared_frag[0], &A_frag[0], &B_frag[0]);"), "no mma in\n", src)
	check.Equal(t, strings.Count(src, "__syncthreads();"), 2, "barriers in\n", src)
	check.Equal(t, len(kernels), 1)
	check.Equal(t, kernels[0].Block, [3]int64{32, 1, 1})
}

func TestTensorizePtxMmaErrors(t *testing.T) {
	s, err := New(matmul(32, 16, 32))
	check.NoError(t, err)
	ls := loopsOf(t, s, "C")
	i := must[[]LoopRV](t)(s.Split(ls[0], -1, 16))
	j := must[[]LoopRV](t)(s.Split(ls[1], -1, 8))
	k := must[[]LoopRV](t)(s.Split(ls[2], -1, 16))
	check.NoError(t, s.Reorder(i[0], j[0], k[0], i[1], j[1], k[1]))
	check.Equal(t, s.Tensorize(i[1], PtxMmaIntrin).Error(), `tensorize: block "C" does not match "kiln.ptx_mma_m16n8k16_f16": A[v_i, v_k] is not T.Cast("float32", A[vi, vk])`)
}
