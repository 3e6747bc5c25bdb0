package schedule

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// The built-in tensor intrinsics: kiln.vec_fma_f32x4, x8 and x16, the
// vector microkernel of a CPU matmul's inner loop, C[j] += A[0] · B[j]
// over W lanes as one vector multiply-add (a broadcast of A, vector loads
// of B and C along their last dimension, one vector store).
func init() {
	for _, w := range []int64{4, 8, 16} {
		if err := RegisterTensorIntrin(vecFMA(w)); err != nil {
			panic(err)
		}
	}
}

// VecFMAIntrin names the built-in vector multiply-add of w float32 lanes.
func VecFMAIntrin(w int64) string { return fmt.Sprintf("kiln.vec_fma_f32x%d", w) }

func vecFMA(w int64) *TensorIntrin {
	A := ir.NewBuffer("A", ir.Float32, []ir.Expr{ir.I32(1)}, "")
	B := ir.NewBuffer("B", ir.Float32, []ir.Expr{ir.I32(w)}, "")
	C := ir.NewBuffer("C", ir.Float32, []ir.Expr{ir.I32(w)}, "")
	j := ir.NewVar("j", ir.Int32)
	vj := ir.NewVar("vj", ir.Int32)
	blk := &ir.Block{
		Name:     "update",
		IterVars: []ir.IterVar{{Var: vj, Dom: ir.RangeFromExtent(ir.I32(w)), Kind: ir.IterSpatial}},
		Reads:    []ir.BufferRegion{ir.PointRegion(C, vj), ir.PointRegion(A, ir.I32(0)), ir.PointRegion(B, vj)},
		Writes:   []ir.BufferRegion{ir.PointRegion(C, vj)},
		Body:     C.Store(ir.Add(C.Load(vj), ir.Mul(A.Load(ir.I32(0)), B.Load(vj))), vj),
	}
	loop := ir.NewFor(j, ir.I32(0), ir.I32(w), ir.ForSerial, &ir.BlockRealize{IterValues: []ir.Expr{j}, Predicate: ir.BoolImm(true), Block: blk})
	desc := ir.NewPrimFunc([]*ir.Buffer{A, B, C}, ir.NewRootBlock(loop), nil)
	impl := func(rs []ir.BufferRegion) (ir.Stmt, error) {
		a, b, c := rs[0], rs[1], rs[2]
		for _, r := range []ir.BufferRegion{b, c} {
			if n := len(r.Buffer.Strides); n > 0 {
				if s, ok := ir.IsConstInt(r.Buffer.Strides[n-1]); !ok || s != 1 {
					return nil, fmt.Errorf("%q is not contiguous in its last dimension", r.Buffer.Name)
				}
			}
		}
		vec := func(r ir.BufferRegion) []ir.Expr {
			idx := make([]ir.Expr, len(r.Region))
			for d, rg := range r.Region {
				idx[d] = rg.Min
			}
			last := idx[len(idx)-1]
			idx[len(idx)-1] = ir.NewRamp(last, ir.NewIntImm(last.DType(), 1), int(w))
			return idx
		}
		at := make([]ir.Expr, len(a.Region))
		for d, rg := range a.Region {
			at[d] = rg.Min
		}
		ci := vec(c)
		v := ir.Add(c.Buffer.Load(ci...), ir.Mul(ir.NewBroadcast(a.Buffer.Load(at...), int(w)), b.Buffer.Load(vec(b)...)))
		return &ir.BufferStore{Buffer: c.Buffer, Value: v, Indices: ci}, nil
	}
	return &TensorIntrin{Name: VecFMAIntrin(w), Desc: desc, Impl: impl}
}

// PtxMmaIntrin is the built-in tensor-core intrinsic
// kiln.ptx_mma_m16n8k16_f16: C (16×8, float32) += A (16×16, float16) ·
// B (16×8, float16), products in float32, as one warp's ptx_mma m16n8k16.
// Its implementation is a threadIdx.x loop of 32 lanes: each lane loads
// its fragments of A, B and C (PTX's layout for the shape) into local
// buffers, the warp runs the mma, each lane stores its fragment of C back.
// The tensorized block must run where one warp may take a threadIdx.x
// loop of 32 (under blockIdx loops, not inside another threadIdx.x loop).
const PtxMmaIntrin = "kiln.ptx_mma_m16n8k16_f16"

func init() {
	if err := RegisterTensorIntrin(ptxMma()); err != nil {
		panic(err)
	}
}

func ptxMma() *TensorIntrin {
	A := ir.NewBuffer("A", ir.Float16, []ir.Expr{ir.I32(16), ir.I32(16)}, "")
	B := ir.NewBuffer("B", ir.Float16, []ir.Expr{ir.I32(16), ir.I32(8)}, "")
	C := ir.NewBuffer("C", ir.Float32, []ir.Expr{ir.I32(16), ir.I32(8)}, "")
	vi, vj, vk := ir.NewVar("vi", ir.Int32), ir.NewVar("vj", ir.Int32), ir.NewVar("vk", ir.Int32)
	blk := &ir.Block{
		Name: "update",
		IterVars: []ir.IterVar{
			{Var: vi, Dom: ir.RangeFromExtent(ir.I32(16)), Kind: ir.IterSpatial},
			{Var: vj, Dom: ir.RangeFromExtent(ir.I32(8)), Kind: ir.IterSpatial},
			{Var: vk, Dom: ir.RangeFromExtent(ir.I32(16)), Kind: ir.IterReduce},
		},
		Reads:  []ir.BufferRegion{ir.PointRegion(C, vi, vj), ir.PointRegion(A, vi, vk), ir.PointRegion(B, vk, vj)},
		Writes: []ir.BufferRegion{ir.PointRegion(C, vi, vj)},
		Body:   C.Store(ir.Add(C.Load(vi, vj), ir.Mul(ir.NewCast(ir.Float32, A.Load(vi, vk)), ir.NewCast(ir.Float32, B.Load(vk, vj)))), vi, vj),
	}
	return &TensorIntrin{Name: PtxMmaIntrin, Desc: mmaDesc(blk, A, B, C), Impl: ptxMmaImpl}
}

// ptxMmaImpl is the warp's mma over the regions of A, B and C.
func ptxMmaImpl(rs []ir.BufferRegion) (ir.Stmt, error) {
	tx := ir.NewVar("tx", ir.Int32)
	// at returns the indices of element (row, col) of a region: its
	// leading indices, then the last two offset by row and col.
	at := func(r ir.BufferRegion, row, col int64, g, t ir.Expr, gr, gc, tr, tc int64) []ir.Expr {
		n := len(r.Region)
		idx := make([]ir.Expr, n)
		for d, rg := range r.Region {
			idx[d] = rg.Min
		}
		typ := idx[n-1].DType()
		lane := func(base ir.Expr, c, gk, tk int64) ir.Expr {
			e := ir.Add(base, ir.NewIntImm(typ, c))
			if gk != 0 {
				e = ir.Add(e, ir.Mul(ir.NewCast(typ, g), ir.NewIntImm(typ, gk)))
			}
			if tk != 0 {
				e = ir.Add(e, ir.Mul(ir.NewCast(typ, t), ir.NewIntImm(typ, tk)))
			}
			return e
		}
		idx[n-2] = lane(idx[n-2], row, gr, tr)
		idx[n-1] = lane(idx[n-1], col, gc, tc)
		return idx
	}
	a, b, c := rs[0], rs[1], rs[2]
	g := ir.FloorDiv(tx, ir.I32(4))
	t := ir.FloorMod(tx, ir.I32(4))
	af := ir.NewBuffer(a.Buffer.Name+"_frag", ir.Float16, []ir.Expr{ir.I32(8)}, "local")
	bf := ir.NewBuffer(b.Buffer.Name+"_frag", ir.Float16, []ir.Expr{ir.I32(4)}, "local")
	cf := ir.NewBuffer(c.Buffer.Name+"_frag", ir.Float32, []ir.Expr{ir.I32(4)}, "local")
	var ss []ir.Stmt
	// PTX's fragments of mma.m16n8k16 (lane = 4g + t): A holds rows
	// g + 8·(i/2 % 2), columns 2t + i%2 + 8·(i/4); B rows 2t + i%2 + 8·(i/2),
	// column g; C rows g + 8·(i/2), columns 2t + i%2.
	for i := int64(0); i < 8; i++ {
		ss = append(ss, af.Store(a.Buffer.Load(at(a, 8*((i/2)%2), i%2+8*(i/4), g, t, 1, 0, 0, 2)...), ir.I32(i)))
	}
	for i := int64(0); i < 4; i++ {
		ss = append(ss, bf.Store(b.Buffer.Load(at(b, i%2+8*(i/2), 0, g, t, 0, 1, 2, 0)...), ir.I32(i)))
	}
	cAt := func(i int64) []ir.Expr { return at(c, 8*(i/2), i%2, g, t, 1, 0, 0, 2) }
	for i := int64(0); i < 4; i++ {
		ss = append(ss, cf.Store(c.Buffer.Load(cAt(i)...), ir.I32(i)))
	}
	ss = append(ss, &ir.Evaluate{Value: ir.PtxMma("fp16", af.Data, ir.I32(0), bf.Data, ir.I32(0), cf.Data, ir.I32(0))})
	for i := int64(0); i < 4; i++ {
		ss = append(ss, c.Buffer.Store(cf.Load(ir.I32(i)), cAt(i)...))
	}
	body := &ir.Allocate{Buffer: af, Body: &ir.Allocate{Buffer: bf, Body: &ir.Allocate{Buffer: cf, Body: ir.Seq(ss...)}}}
	return &ir.For{Var: tx, Min: ir.I32(0), Extent: ir.I32(32), Kind: ir.ForThreadBinding, ThreadTag: "threadIdx.x", Body: body}, nil
}
