package transform

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
)

// AlterDenseLayout packs the weight of every dense layer for the CPU's
// register tile: a float32 R.matmul(x, w) whose w is a (K, N) weight of
// constant shape (a parameter after the function's "num_input" inputs, a
// constant, or computed from those alone) and whose x has constant shape
// becomes
//
//	w_packed = R.permute_dims(R.reshape(w, (K, N/P, P)), axes=[1, 0, 2])
//	y = R.matmul_packed(x, w_packed)
//
// with P the tile width the default CPU schedule gives the layer's
// columns (denseTileWidth): each tile of P columns then reads its K×P
// panel of the weight from contiguous memory, where a row-major (K, N)
// weight has it in K runs N floats apart (which hardware prefetchers
// follow poorly and which, with N a multiple of 1024, fall into the same
// few cache sets). LiftTransformParams moves the packing out of the
// per-call path (FoldConstant folds it for a constant weight), so the
// weight is packed once per set of weights. Layers whose tile is all N
// columns (nothing to gain) are left as they are. It plays the part of
// TVM's AlterOpLayout for dense on x86 (the weight in NK[n]k blocks); it
// is for CPU targets with vectors of vectorBytes (compiler.Build runs it
// before the graph pipeline there).
func AlterDenseLayout(mod *ir.IRModule, vectorBytes int64) (*ir.IRModule, error) {
	return rewriteCalls(mod, func(fn *ir.Function) callRewrite {
		weights := map[*ir.RVar]bool{}
		if k, ok := numInput(fn.Attrs[AttrNumInput]); ok && k < len(fn.Params) {
			for _, p := range fn.Params[k:] {
				weights[p] = true
			}
		}
		isWeight := func(e ir.RExpr) bool {
			for _, v := range ir.FreeRVars(e) {
				if !weights[v] {
					return false
				}
			}
			return true
		}
		return func(vb *ir.VarBinding, call *ir.RCall) ([]ir.Binding, error) {
			if ir.IsPureCall(call, mod) && len(ir.FreeRVars(call)) > 0 && isWeight(call) {
				weights[vb.Var] = true
				return nil, nil
			}
			k, n, p := denseToPack(call, vectorBytes)
			if p == 0 || !isWeight(call.Args[1]) {
				return nil, nil
			}
			bs, e := packDense(vb, call, k, n, p)
			if e != nil {
				return nil, fmt.Errorf("matmul %s: pack its weight: %w", vb.Var.Name, e)
			}
			return bs, nil
		}
	})
}

// denseToPack returns the weight's K and N and the tile width P when call
// is a matmul AlterDenseLayout packs (else P = 0).
func denseToPack(call *ir.RCall, vectorBytes int64) (k, n, p int64) {
	o, ok := call.Op.(*ir.Op)
	if !ok || o.Name != "relax.matmul" || len(call.Args) != 2 {
		return 0, 0, 0
	}
	if dt, _ := call.Attrs["out_dtype"].(string); dt != "" && dt != "void" {
		return 0, 0, 0
	}
	x, ok1 := ir.StructInfoOf(call.Args[0]).(*ir.TensorStructInfo)
	w, ok2 := ir.StructInfoOf(call.Args[1]).(*ir.TensorStructInfo)
	if !ok1 || !ok2 || x.DType != ir.Float32 || w.DType != ir.Float32 || len(w.Shape) != 2 || len(x.Shape) < 2 {
		return 0, 0, 0
	}
	rows := int64(1)
	for _, d := range x.Shape[:len(x.Shape)-1] {
		v, ok := ir.ConstDim(d)
		if !ok {
			return 0, 0, 0
		}
		rows *= v
	}
	k, ok1 = ir.ConstDim(w.Shape[0])
	n, ok2 = ir.ConstDim(w.Shape[1])
	if !ok1 || !ok2 {
		return 0, 0, 0
	}
	p = denseTileWidth(rows, n, vectorBytes)
	if p == 0 || p == n {
		return 0, 0, 0
	}
	return k, n, p
}

// denseTileWidth is the column tile of the default CPU schedule's dense
// rule for float32 (compiler/schedule/auto's DenseTileWidth: the schedule
// takes a packed weight only in tiles of its panel) on a CPU with vectors
// of vectorBytes (at least 16) and the register file that width implies
// (32 with 64-byte vectors, else 16). 0 when no vector width divides n.
func denseTileWidth(rows, n, vectorBytes int64) int64 {
	vectorBytes = max(vectorBytes, 16)
	regs := int64(32)
	if vectorBytes < 64 {
		regs = 16
	}
	return auto.DenseTileWidth(rows, n, vectorBytes, regs)
}

// packDense returns the bindings that pack vb's weight and call
// relax.matmul_packed in its place.
func packDense(vb *ir.VarBinding, call *ir.RCall, k, n, p int64) ([]ir.Binding, error) {
	r, err := op.Call("relax.reshape", []ir.RExpr{call.Args[1], &ir.ShapeExpr{Values: ir.Dims(k, n/p, p)}}, nil)
	if err != nil {
		return nil, err
	}
	rv := ir.NewRVar(vb.Var.Name+"_w", r.Info)
	rv.Dataflow = vb.Var.Dataflow
	perm, err := op.Call("relax.permute_dims", []ir.RExpr{rv}, map[string]any{"axes": []any{int64(1), int64(0), int64(2)}})
	if err != nil {
		return nil, err
	}
	pv := ir.NewRVar(vb.Var.Name+"_w_packed", perm.Info)
	pv.Dataflow = vb.Var.Dataflow
	mm, err := op.Call("relax.matmul_packed", []ir.RExpr{call.Args[0], pv}, nil)
	if err != nil {
		return nil, err
	}
	return []ir.Binding{&ir.VarBinding{Var: rv, Value: r}, &ir.VarBinding{Var: pv, Value: perm}, &ir.VarBinding{Var: vb.Var, Value: mm}}, nil
}
