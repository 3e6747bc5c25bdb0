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
