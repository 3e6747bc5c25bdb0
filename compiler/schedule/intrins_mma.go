package schedule

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

// The tensor-core intrinsics over register fragments,
// kiln.ptx_mma_frag_m16n8k16_fp16 and _bf16: C (16×8, float32) +=
// A (16×16) · B (16×8) of 16-bit operands, products in float32, where A,
// B and C are "local" buffers already in PTX's per-lane layout of
// mma.m16n8k16 (MmaLayoutA, MmaLayoutB, MmaLayoutC): their last two
// dimensions are the 32 lanes of the warp and each lane's elements (8 of
// A, 4 of B, 4 of C). The implementation is a threadIdx.x loop of 32
// lanes, each running ptx_mma on its own fragments in place: nothing is
// copied, so the fragments may live in registers across many updates (a
// "local" buffer outside the threadIdx loops is private to each thread,
// and compaction keeps only one thread's part). The tensorized block must
// run where one warp may take a threadIdx.x loop of 32, and lane l of
// every fragment must be written by thread l.

// MmaFragIntrin names the fragment intrinsic for operands of dtype ab
// ("fp16" or "bf16").
func MmaFragIntrin(ab string) string { return "kiln.ptx_mma_frag_m16n8k16_" + ab }

func init() {
	for _, ab := range []string{"fp16", "bf16"} {
		if err := RegisterTensorIntrin(mmaFrag(ab)); err != nil {
			panic(err)
		}
	}
}

// The per-lane layouts of mma.m16n8k16 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"): lane 4g + t of the warp holds
// A[g + 8·(r/2 % 2), 2t + r%2 + 8·(r/4)] as its element r (0-7), B[2t +
// r%2 + 8·(r/2), g] (r 0-3) and C[g + 8·(r/2), 2t + r%2] (r 0-3). Over a
// whole buffer the maps below also give each 16×16 (A), 16×8 (B, C) tile
// its place in the first two dimensions.

// MmaLayoutA maps A[i, k] (rows of 16, columns of 16) to [i // 16,
// k // 16, lane, r] in the layout of mma.m16n8k16's operand A.
func MmaLayoutA() *IndexMap {
	return NewIndexMap(2, func(ix ...ir.Expr) []ir.Expr {
		i, k := ix[0], ix[1]
		return append([]ir.Expr{ir.FloorDiv(i, ir.I32(16)), ir.FloorDiv(k, ir.I32(16))}, mmaLaneA(i, k)...)
	})
}

// MmaLayoutB maps B[k, j] (rows of 16, columns of 8) to [k // 16, j // 8,
// lane, r] in the layout of mma.m16n8k16's operand B.
func MmaLayoutB() *IndexMap {
	return NewIndexMap(2, func(ix ...ir.Expr) []ir.Expr {
		k, j := ix[0], ix[1]
		return append([]ir.Expr{ir.FloorDiv(k, ir.I32(16)), ir.FloorDiv(j, ir.I32(8))}, mmaLaneB(k, j)...)
	})
}

// MmaLayoutC maps C[i, j] (rows of 16, columns of 8) to [i // 16, j // 8,
// lane, r] in the layout of mma.m16n8k16's accumulator C.
func MmaLayoutC() *IndexMap {
	return NewIndexMap(2, func(ix ...ir.Expr) []ir.Expr {
		i, j := ix[0], ix[1]
		return append([]ir.Expr{ir.FloorDiv(i, ir.I32(16)), ir.FloorDiv(j, ir.I32(8))}, mmaLaneC(i, j)...)
	})
}

func laneMod(e ir.Expr, c int64) ir.Expr { return ir.FloorMod(e, ir.NewIntImm(e.DType(), c)) }
func laneDiv(e ir.Expr, c int64) ir.Expr { return ir.FloorDiv(e, ir.NewIntImm(e.DType(), c)) }
func laneMul(e ir.Expr, c int64) ir.Expr { return ir.Mul(e, ir.NewIntImm(e.DType(), c)) }

// mmaLaneA is the lane and element of A[i, k] within its 16×16 tile.
func mmaLaneA(i, k ir.Expr) []ir.Expr {
	lane := ir.Add(laneMul(laneMod(i, 8), 4), laneDiv(laneMod(k, 8), 2))
	r := ir.Add(ir.Add(laneMod(k, 2), laneMul(laneDiv(laneMod(i, 16), 8), 2)), laneMul(laneDiv(laneMod(k, 16), 8), 4))
	return []ir.Expr{lane, r}
}

// mmaLaneB is the lane and element of B[k, j] within its 16×8 tile.
func mmaLaneB(k, j ir.Expr) []ir.Expr {
	lane := ir.Add(laneMul(laneMod(j, 8), 4), laneDiv(laneMod(k, 8), 2))
	r := ir.Add(laneMod(k, 2), laneMul(laneDiv(laneMod(k, 16), 8), 2))
	return []ir.Expr{lane, r}
}

// mmaLaneC is the lane and element of C[i, j] within its 16×8 tile.
func mmaLaneC(i, j ir.Expr) []ir.Expr {
	lane := ir.Add(laneMul(laneMod(i, 8), 4), laneDiv(laneMod(j, 8), 2))
	r := ir.Add(laneMod(j, 2), laneMul(laneDiv(laneMod(i, 16), 8), 2))
	return []ir.Expr{lane, r}
}

func mmaFrag(ab string) *TensorIntrin {
	dt := ir.Float16
	if ab == "bf16" {
		dt = ndarray.BFloat16
	}
	A := ir.NewBuffer("A", dt, []ir.Expr{ir.I32(32), ir.I32(8)}, "local")
	B := ir.NewBuffer("B", dt, []ir.Expr{ir.I32(32), ir.I32(4)}, "local")
	C := ir.NewBuffer("C", ir.Float32, []ir.Expr{ir.I32(32), ir.I32(4)}, "local")
	vi, vj, vk := ir.NewVar("vi", ir.Int32), ir.NewVar("vj", ir.Int32), ir.NewVar("vk", ir.Int32)
	ca, aa, ba := mmaLaneC(vi, vj), mmaLaneA(vi, vk), mmaLaneB(vk, vj)
	blk := &ir.Block{
		Name: "update",
		IterVars: []ir.IterVar{
			{Var: vi, Dom: ir.RangeFromExtent(ir.I32(16)), Kind: ir.IterSpatial},
			{Var: vj, Dom: ir.RangeFromExtent(ir.I32(8)), Kind: ir.IterSpatial},
			{Var: vk, Dom: ir.RangeFromExtent(ir.I32(16)), Kind: ir.IterReduce},
		},
		Reads:  []ir.BufferRegion{ir.PointRegion(C, ca...), ir.PointRegion(A, aa...), ir.PointRegion(B, ba...)},
		Writes: []ir.BufferRegion{ir.PointRegion(C, ca...)},
		Body:   C.Store(ir.Add(C.Load(ca...), ir.Mul(ir.NewCast(ir.Float32, A.Load(aa...)), ir.NewCast(ir.Float32, B.Load(ba...)))), ca...),
	}
	impl := func(rs []ir.BufferRegion) (ir.Stmt, error) { return mmaFragImpl(ab, rs) }
	return &TensorIntrin{Name: MmaFragIntrin(ab), Desc: mmaDesc(blk, A, B, C), Impl: impl}
}

// mmaDesc is the description of an m16n8k16 update: loops i, j, k of 16,
// 8 and 16 around block blk (whose iteration variables they bind), over
// parameters A, B and C.
func mmaDesc(blk *ir.Block, A, B, C *ir.Buffer) *ir.PrimFunc {
	i, j, k := ir.NewVar("i", ir.Int32), ir.NewVar("j", ir.Int32), ir.NewVar("k", ir.Int32)
	var nest ir.Stmt = &ir.BlockRealize{IterValues: []ir.Expr{i, j, k}, Predicate: ir.BoolImm(true), Block: blk}
	nest = ir.NewFor(k, ir.I32(0), ir.I32(16), ir.ForSerial, nest)
	nest = ir.NewFor(j, ir.I32(0), ir.I32(8), ir.ForSerial, nest)
	nest = ir.NewFor(i, ir.I32(0), ir.I32(16), ir.ForSerial, nest)
	return ir.NewPrimFunc([]*ir.Buffer{A, B, C}, ir.NewRootBlock(nest), nil)
}

// mmaFragImpl is the warp's mma over fragment regions of A, B and C: lane
// tx runs ptx_mma on the elements of its row of each.
func mmaFragImpl(ab string, rs []ir.BufferRegion) (ir.Stmt, error) {
	tx := ir.NewVar("tx", ir.Int32)
	var frags []*ir.BufferLoad
	for n, r := range rs {
		b := r.Buffer
		if b.StorageScope() != "local" {
			return nil, fmt.Errorf("fragment %q is in scope %q, not in registers (\"local\")", b.Name, b.StorageScope())
		}
		if len(b.Strides) != 0 || (b.ElemOffset != nil && !isZero(b.ElemOffset)) {
			return nil, fmt.Errorf("fragment %q has strides or an offset", b.Name)
		}
		d := len(r.Region)
		idx := make([]ir.Expr, d)
		for x, rg := range r.Region {
			idx[x] = rg.Min
		}
		lane := idx[d-2]
		idx[d-2] = ir.Add(lane, ir.NewCast(lane.DType(), tx))
		if isZero(lane) {
			idx[d-2] = ir.NewCast(lane.DType(), tx)
		}
		idx[d-1] = ir.NewRamp(idx[d-1], ir.NewIntImm(idx[d-1].DType(), 1), []int{8, 4, 4}[n])
		frags = append(frags, b.Load(idx...))
	}
	mma := &ir.Evaluate{Value: ir.PtxMmaFragments(ab, frags[0], frags[1], frags[2])}
	return &ir.For{Var: tx, Min: ir.I32(0), Extent: ir.I32(32), Kind: ir.ForThreadBinding, ThreadTag: "threadIdx.x", Body: mma}, nil
}

func isZero(e ir.Expr) bool {
	c, ok := ir.IsConstInt(e)
	return ok && c == 0
}
