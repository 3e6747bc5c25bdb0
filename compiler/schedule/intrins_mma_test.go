package schedule

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/codegen/cuda"
	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// fragLanes splits the two innermost loops of block b, over rows and
// columns of whole tiles of buffer kind ('A', 'B' or 'C'), so that the
// lane of mma.m16n8k16's layout is one loop, bound to threadIdx.x, around
// each lane's elements: lane = 4·(row % 8) + (col % 8) / 2 for A and C,
// 4·(col % 8) + (row % 8) / 2 for B (row being k).
func fragLanes(t *testing.T, s *Schedule, b BlockRV, kind byte) {
	t.Helper()
	ls := must[[]LoopRV](t)(s.GetLoops(b))
	row, col := ls[len(ls)-2], ls[len(ls)-1]
	var outer, inner LoopRV
	var rest []LoopRV
	if kind == 'B' {
		r := must[[]LoopRV](t)(s.Split(row, -1, 4, 2))
		c := must[[]LoopRV](t)(s.Split(col, -1, 8))
		outer, inner, rest = c[1], r[1], []LoopRV{r[0], c[0], r[2]}
	} else {
		r := must[[]LoopRV](t)(s.Split(row, -1, 8))
		c := must[[]LoopRV](t)(s.Split(col, -1, 4, 2))
		outer, inner, rest = r[1], c[1], []LoopRV{r[0], c[0], c[2]}
	}
	check.NoError(t, s.Reorder(append([]LoopRV{outer, inner}, rest...)...))
	check.NoError(t, s.Bind(must[LoopRV](t)(s.Fuse(outer, inner)), "threadIdx.x"))
}

// mmaFragSchedule tiles C into 16×8 tiles on blockIdx, accumulates each
// tile in registers in mma's layout of C across all of k, copies each
// 16×16 tile of A and 16×8 tile of B into register fragments in mma's
// layouts, every thread its own lane, and tensorizes the 16×8×16 update
// with the fragment intrinsic.
func mmaFragSchedule(t *testing.T, s *Schedule) { mmaFragScheduleOf(t, s, ir.Void) }

// mmaFragScheduleOf is mmaFragSchedule with an accumulator of dtype acc
// (CacheWriteDType) unless acc is Void.
func mmaFragScheduleOf(t *testing.T, s *Schedule, acc ir.DType) {
	check.NoError(t, s.Tensorize(mmaFragTiles(t, s, acc), MmaFragIntrin("fp16")))
}

// mmaFragTiles is mmaFragScheduleOf up to the tensorize: it returns the
// loop to tensorize.
func mmaFragTiles(t *testing.T, s *Schedule, acc ir.DType) LoopRV {
	c := must[BlockRV](t)(s.GetBlock("C"))
	ls := must[[]LoopRV](t)(s.GetLoops(c))
	i := must[[]LoopRV](t)(s.Split(ls[0], -1, 16))
	j := must[[]LoopRV](t)(s.Split(ls[1], -1, 8))
	k := must[[]LoopRV](t)(s.Split(ls[2], -1, 16))
	check.NoError(t, s.Reorder(i[0], j[0], k[0], i[1], j[1], k[1]))
	check.NoError(t, s.Bind(i[0], "blockIdx.y"))
	check.NoError(t, s.Bind(j[0], "blockIdx.x"))
	var cw BlockRV
	if acc == ir.Void {
		cw = must[BlockRV](t)(s.CacheWrite(c, 0, "local"))
	} else {
		cw = must[BlockRV](t)(s.CacheWriteDType(c, 0, "local", acc))
	}
	check.NoError(t, s.ReverseComputeAt(cw, j[0]))
	fragments(t, s, c, cw, k[0])
	return i[1]
}

// fragments gives the accumulator of block c (written back by cw) mma's
// layout of C, decomposes c's reduction at loop ko and copies A and B
// into register fragments at ko in mma's layouts, every copy's lane loop
// bound to threadIdx.x.
func fragments(t *testing.T, s *Schedule, c, cw BlockRV, ko LoopRV) {
	t.Helper()
	check.NoError(t, s.TransformLayout(c, BufferIndex{Write: true}, MmaLayoutC(), nil))
	init := must[BlockRV](t)(s.DecomposeReduction(c, ko))
	fragLanes(t, s, init, 'C')
	fragLanes(t, s, cw, 'C')
	for n, layout := range []*IndexMap{MmaLayoutA(), MmaLayoutB()} {
		r := must[BlockRV](t)(s.CacheRead(c, n+1, "local"))
		check.NoError(t, s.ComputeAt(r, ko))
		check.NoError(t, s.TransformLayout(r, BufferIndex{Write: true}, layout, nil))
		fragLanes(t, s, r, "AB"[n])
	}
}

// lowerCompacted lowers g through compaction and flattening.
func lowerCompacted(t *testing.T, g *ir.PrimFunc) *ir.PrimFunc {
	t.Helper()
	low, err := transform.Run(g, []string{"lower_init", "lower_blocks", "compact_buffers", "flatten_buffers"}, transform.Options{})
	check.NoError(t, err)
	return low
}

// cudaOf generates the CUDA of g for sm_80.
func cudaOf(t *testing.T, g *ir.PrimFunc) (string, []cuda.Kernel) {
	t.Helper()
	lim, err := cuda.ArchLimits("sm_80")
	check.NoError(t, err)
	l, err := transform.LowerModule(ir.NewIRModule().With("mma", g.WithAttr(ir.AttrGlobalSymbol, "mma")), cuda.LowerOptions())
	check.NoError(t, err)
	src, kernels, err := cuda.Generate(l, lim)
	check.NoError(t, err)
	return src, kernels
}

// TestTensorizeMmaFragments tensorizes a float16 matmul with the fragment
// intrinsic and runs it in the interpreter, as scheduled and lowered
// through compaction (where every fragment is one thread's registers) and
// flattening (where ptx_mma takes each fragment's data and offset), and
// generates its CUDA.
func TestTensorizeMmaFragments(t *testing.T) {
	runCases(t, []schedCase{
		{name: "tensorize_mma_fragments", fn: func() *ir.PrimFunc { return halfMatmul(32, 16, 48) }, apply: mmaFragSchedule},
	})
	f := halfMatmul(32, 16, 48)
	s, err := New(f)
	check.NoError(t, err)
	mmaFragSchedule(t, s)
	low := lowerCompacted(t, s.Func())
	check.Equal(t, localAllocs(low), "C_local[4] A_local[8] B_local[4]", "one thread's fragments")
	sameResults(t, runFunc(t, low, nil), runFunc(t, f, nil))

	src, kernels := cudaOf(t, s.Func())
	check.True(t, strings.Contains(src, "kiln_mma_m16n8k16_f32_fp16(&C_local[0], &A_local[0], &B_local[0]);"), "no mma in\n", src)
	check.Equal(t, strings.Count(src, "__syncthreads();"), 0, "barriers in\n", src)
	check.Equal(t, len(kernels), 1)
	check.Equal(t, kernels[0].Block, [3]int64{32, 1, 1})
}

// mmaWarpsSchedule is mmaFragSchedule with two warps along threadIdx.y,
// each computing two 16×8 tiles of C (rows by the warp, then by the
// fragment) and loading its own fragments of A.
func mmaWarpsSchedule(t *testing.T, s *Schedule) {
	c := must[BlockRV](t)(s.GetBlock("C"))
	ls := must[[]LoopRV](t)(s.GetLoops(c))
	i := must[[]LoopRV](t)(s.Split(ls[0], -1, 2, 2, 16))
	j := must[[]LoopRV](t)(s.Split(ls[1], -1, 8))
	k := must[[]LoopRV](t)(s.Split(ls[2], -1, 16))
	check.NoError(t, s.Reorder(i[0], j[0], i[1], k[0], i[2], i[3], j[1], k[1]))
	check.NoError(t, s.Bind(i[0], "blockIdx.y"))
	check.NoError(t, s.Bind(j[0], "blockIdx.x"))
	check.NoError(t, s.Bind(i[1], "threadIdx.y"))
	cw := must[BlockRV](t)(s.CacheWrite(c, 0, "local"))
	check.NoError(t, s.ReverseComputeAt(cw, i[1]))
	fragments(t, s, c, cw, k[0])
	check.NoError(t, s.Tensorize(i[3], MmaFragIntrin("fp16")))
}

// TestMmaFragmentsWarps: warps along threadIdx.y, each with its own
// accumulators across k (two tiles: 8 floats a thread), in the
// interpreter (a warp is the 32 threadIdx.x lanes of one threadIdx.y) as
// scheduled and as lowered, and in CUDA.
func TestMmaFragmentsWarps(t *testing.T) {
	runCases(t, []schedCase{
		{name: "tensorize_mma_warps", fn: func() *ir.PrimFunc { return halfMatmul(128, 16, 48) }, apply: mmaWarpsSchedule},
	})
	f := halfMatmul(128, 16, 48)
	s, err := New(f)
	check.NoError(t, err)
	mmaWarpsSchedule(t, s)
	low := lowerCompacted(t, s.Func())
	check.Equal(t, localAllocs(low), "C_local[8] A_local[16] B_local[4]", "one thread's fragments")
	sameResults(t, runFunc(t, low, nil), runFunc(t, f, nil))
	src, kernels := cudaOf(t, s.Func())
	check.True(t, strings.Contains(src, "kiln_mma_m16n8k16_f32_fp16(&C_local["), "no mma on the registers in\n", src)
	check.Equal(t, len(kernels), 1)
	check.Equal(t, kernels[0].Block, [3]int64{32, 2, 1})
}

// localAllocs lists the "local" allocations of f with their sizes.
func localAllocs(f *ir.PrimFunc) string {
	var regs []string
	ir.Visit(f.Body, func(n ir.Node) bool {
		if a, ok := n.(*ir.Allocate); ok && a.Buffer.StorageScope() == "local" {
			regs = append(regs, a.Buffer.Name+"["+a.Buffer.Shape[0].String()+"]")
		}
		return true
	})
	return strings.Join(regs, " ")
}

// TestMmaFragmentsHalfOutput: a float16 sum of float16 products
// accumulates in a float32 cache (CacheWriteDType), which makes its update
// the fragment intrinsic's (float32 products of the operands), and is
// rounded once by the copy back.
func TestMmaFragmentsHalfOutput(t *testing.T) {
	runCases(t, []schedCase{
		{name: "tensorize_mma_half_output", fn: func() *ir.PrimFunc { return halfDot(32, 16, 48) }, apply: func(t *testing.T, s *Schedule) {
			mmaFragScheduleOf(t, s, ir.Float32)
		}},
	})
}

// TestMmaFragmentsLane: a thread that computes a lane of a fragment other
// than its own leaves the lowered function wrong, which the interpreter
// (giving each thread its own registers) shows.
func TestMmaFragmentsLane(t *testing.T) {
	f := halfMatmul(16, 8, 16)
	s, err := New(f)
	check.NoError(t, err)
	mmaFragSchedule(t, s)
	// Rebind B's copy: thread tx copies lane 31 - tx.
	g := (&ir.Rewriter{Stmt: func(st ir.Stmt) ir.Stmt {
		if fr, ok := st.(*ir.For); ok && fr.ThreadTag == "threadIdx.x" {
			if br, ok := fr.Body.(*ir.For); ok {
				if strings.Contains(stmtText(br), "B_local") && !strings.Contains(stmtText(br), "ptx_mma") {
					n := *fr
					n.Body = ir.Substitute(fr.Body, map[*ir.Var]ir.Expr{fr.Var: ir.Sub(ir.I32(31), fr.Var)})
					return &n
				}
			}
		}
		return st
	}}).RewriteStmt(s.Func().Body)
	low := lowerCompacted(t, s.Func().WithBody(g))
	got, want := runFunc(t, low, nil), runFunc(t, f, nil)
	check.True(t, !equalFloats(got["C"], want["C"]), "a wrong lane gives the right result")
}

func stmtText(s ir.Stmt) string {
	var b strings.Builder
	ir.Visit(s, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.BufferLoad:
			b.WriteString(n.Buffer.Name + " ")
		case *ir.BufferStore:
			b.WriteString(n.Buffer.Name + " ")
		case *ir.Call:
			b.WriteString(n.Op + " ")
		}
		return true
	})
	return b.String()
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestTensorizeMmaFragmentsErrors(t *testing.T) {
	tiles := func(t *testing.T) (*Schedule, BlockRV, []LoopRV) {
		s, err := New(halfMatmul(32, 16, 32))
		check.NoError(t, err)
		c := must[BlockRV](t)(s.GetBlock("C"))
		ls := must[[]LoopRV](t)(s.GetLoops(c))
		i := must[[]LoopRV](t)(s.Split(ls[0], -1, 16))
		j := must[[]LoopRV](t)(s.Split(ls[1], -1, 8))
		k := must[[]LoopRV](t)(s.Split(ls[2], -1, 16))
		check.NoError(t, s.Reorder(i[0], j[0], k[0], i[1], j[1], k[1]))
		return s, c, []LoopRV{i[0], j[0], k[0], i[1]}
	}
	t.Run("row_major_buffers", func(t *testing.T) {
		s, _, l := tiles(t)
		check.Equal(t, s.Tensorize(l[3], MmaFragIntrin("fp16")).Error(),
			`tensorize: block "C" does not match "kiln.ptx_mma_frag_m16n8k16_fp16": "C" is accessed at v_i in dimension 0, not at the intrinsic's "C" index (((vi % 8) * 4) + ((vj % 8) // 2)) plus an offset: the two differ by ((((v_i_o * 16) + i_1) - ((i_1 % 8) * 4)) - (j_1 // 2))`)
	})
	t.Run("not_the_layout", func(t *testing.T) {
		s, c, l := tiles(t)
		cw := must[BlockRV](t)(s.CacheWrite(c, 0, "local"))
		check.NoError(t, s.ReverseComputeAt(cw, l[1]))
		// Each lane's elements in another order than mma's.
		check.NoError(t, s.TransformLayout(c, BufferIndex{Write: true}, imap(t, "lambda i, j: (i // 16, j // 8, i % 8 * 4 + j % 8 // 2, j % 2 * 2 + i % 16 // 8)"), nil))
		check.Equal(t, s.Tensorize(l[3], MmaFragIntrin("fp16")).Error(),
			`tensorize: block "C" does not match "kiln.ptx_mma_frag_m16n8k16_fp16": "C_local" is accessed at (((v_j % 2) * 2) + ((v_i % 16) // 8)) in dimension 3, not at the intrinsic's "C" index ((vj % 2) + (((vi % 16) // 8) * 2)) plus an offset: the two differ by ((j_1 % 2) - (i_1 // 8))`)
	})
	t.Run("shared_fragments", func(t *testing.T) {
		s, c, l := tiles(t)
		cw := must[BlockRV](t)(s.CacheWrite(c, 0, "shared"))
		check.NoError(t, s.ReverseComputeAt(cw, l[1]))
		check.NoError(t, s.TransformLayout(c, BufferIndex{Write: true}, MmaLayoutC(), nil))
		must[BlockRV](t)(s.DecomposeReduction(c, l[2]))
		for n := 1; n <= 2; n++ {
			r := must[BlockRV](t)(s.CacheRead(c, n, "local"))
			check.NoError(t, s.ComputeAt(r, l[2]))
			check.NoError(t, s.TransformLayout(r, BufferIndex{Write: true}, []*IndexMap{MmaLayoutA(), MmaLayoutB()}[n-1], nil))
		}
		check.Equal(t, s.Tensorize(l[3], MmaFragIntrin("fp16")).Error(),
			`tensorize: "kiln.ptx_mma_frag_m16n8k16_fp16": fragment "C_shared" is in scope "shared", not in registers ("local")`)
	})
}

// TestMmaFragmentsBF16: the bfloat16 variant, on small integers (exact in
// bfloat16), against the unscheduled function in the interpreter.
func TestMmaFragmentsBF16(t *testing.T) {
	A := te.Placeholder(te.Shape(32, 32), ndarray.BFloat16, "A")
	B := te.Placeholder(te.Shape(32, 16), ndarray.BFloat16, "B")
	r := te.ReduceAxis(ir.RangeFromExtent(ir.I32(32)), "k")
	C := te.Compute(te.Shape(32, 16), func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(ir.NewCast(ir.Float32, A.At(i, r)), ir.NewCast(ir.Float32, B.At(r, j))), r)
	}, "C")
	f := mustFunc(A, B, C)
	s, err := New(f)
	check.NoError(t, err)
	l := mmaFragTiles(t, s, ir.Void)
	check.Equal(t, s.Tensorize(l, MmaFragIntrin("fp16")).Error(),
		`tensorize: block "C_update" does not match "kiln.ptx_mma_frag_m16n8k16_fp16": "A_local" is bfloat16, the intrinsic's "A" float16`)
	check.NoError(t, s.Tensorize(l, MmaFragIntrin("bf16")))
	checkReplay(t, f, s)
	run := func(g *ir.PrimFunc) []float32 {
		var args []any
		var out *ndarray.NDArray
		for n, p := range g.Params {
			buf := g.BufferMap[p]
			shape := ndarray.Shape{}
			for _, e := range buf.Shape {
				v, _ := ir.IsConstInt(e)
				shape = append(shape, v)
			}
			a, err := ndarray.Empty(shape, buf.DType, devices.CPUDevice)
			check.NoError(t, err)
			raw := make([]byte, shape.NumElements()*int64(buf.DType.Size()))
			for e := range shape.NumElements() {
				x := float32((e*7+int64(n)*3)%11 - 5)
				if buf.DType == ndarray.BFloat16 {
					binary.LittleEndian.PutUint16(raw[2*e:], uint16(math.Float32bits(x)>>16))
				}
			}
			check.NoError(t, a.CopyFromBytes(raw))
			args = append(args, a)
			out = a
		}
		check.NoError(t, interp.RunOptions(g, interp.Options{Poison: true}, args...))
		v, err := ndarray.ToSlice[float32](out)
		check.NoError(t, err)
		return v
	}
	check.Equal(t, run(s.Func()), run(f))
	src, _ := cudaOf(t, s.Func())
	check.True(t, strings.Contains(src, "kiln_mma_m16n8k16_f32_bf16(&C_local[0], &A_local[0], &B_local[0]);"), "no bf16 mma in\n", src)
}

// TestMmaFragmentsScript: a ptx_mma over fragment loads prints and parses
// (runCases checks the round trip); a load of the wrong number of
// elements is refused when parsed.
func TestMmaFragmentsScript(t *testing.T) {
	s, err := New(halfMatmul(16, 8, 16))
	check.NoError(t, err)
	mmaFragSchedule(t, s)
	text := script.Print(s.Func())
	bad := strings.Replace(text, ", 1, 8)], 0, B_local", ", 1, 4)], 0, B_local", 1)
	check.True(t, bad != text, "no fragment of A in\n", text)
	_, err = script.Parse("bad.py", bad)
	check.Error(t, err, `T.ptx_mma: argument 8 loads A_local[`, `, 1, 4)], want the 8 elements of a fragment (last index T.Ramp(first, 1, 8))`)
}
