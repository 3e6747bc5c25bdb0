package transform

import (
	"fmt"
	"slices"
	"strings"

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
	return AlterDenseLayoutWith(vectorBytes, nil)(mod)
}

// DenseSites lists the dense layers of mod's graph functions whose weight
// AlterDenseLayout could pack, one LayoutSite per signature (Key: "dense
// 1x512 * 512x1000", x's shape then the weight's) in the order they first
// appear. A site's Layouts are AlterDenseLayout's first: the weight in
// panels of P columns ("NK40n": (N/P, K, P), the default schedule's tile
// then P columns wide) for every P the dense rule takes a panel of, and
// "KN", the weight as it is (the rule then picks the column tile).
func DenseSites(mod *ir.IRModule, vectorBytes int64) []LayoutSite {
	var sites []LayoutSite
	at := map[string]int{}
	// Collecting only: the rewrite changes nothing and cannot fail.
	_, _ = denseRewrite(mod, vectorBytes, func(vb *ir.VarBinding, call *ir.RCall, d denseLayer) ([]ir.Binding, error) {
		i, seen := at[d.key]
		if !seen {
			i, at[d.key] = len(sites), len(sites)
			sites = append(sites, LayoutSite{Key: d.key, Layouts: d.layouts})
		}
		sites[i].Sources = ir.AddSources(sites[i].Sources, call.Sources...)
		return nil, nil
	})
	return sites
}

// AlterDenseLayoutWith is AlterDenseLayout with the weight layout of each
// dense site (by Key, see DenseSites) that layouts names, one of the
// site's Layouts; the others take their first. A layout the site cannot
// take is an error.
func AlterDenseLayoutWith(vectorBytes int64, layouts map[string]string) func(mod *ir.IRModule) (*ir.IRModule, error) {
	return func(mod *ir.IRModule) (*ir.IRModule, error) {
		return denseRewrite(mod, vectorBytes, func(vb *ir.VarBinding, call *ir.RCall, d denseLayer) ([]ir.Binding, error) {
			layout := d.layouts[0]
			if l, ok := layouts[d.key]; ok {
				if !slices.Contains(d.layouts, l) {
					return nil, fmt.Errorf("matmul %s (%s): weight layout %q is not one it can take (%s)", vb.Var.Name, d.key, l, strings.Join(d.layouts, ", "))
				}
				layout = l
			}
			var p int64
			if _, err := fmt.Sscanf(layout, "NK%dn", &p); err != nil {
				return nil, nil // "KN": the weight as it is
			}
			bs, e := packDense(vb, call, d.k, d.n, p)
			if e != nil {
				return nil, fmt.Errorf("matmul %s: pack its weight: %w", vb.Var.Name, e)
			}
			return bs, nil
		})
	}
}

// denseLayer is a dense layer whose weight can be packed: the weight's
// K and N, the site's Key and its Layouts (see DenseSites).
type denseLayer struct {
	k, n    int64
	key     string
	layouts []string
}

// denseRewrite rewrites, with rewrite, the bindings of every dense layer
// of mod's graph functions whose weight can be packed (a weight as
// AlterDenseLayout defines one, in a layer denseToPack takes).
func denseRewrite(mod *ir.IRModule, vectorBytes int64, rewrite func(vb *ir.VarBinding, call *ir.RCall, d denseLayer) ([]ir.Binding, error)) (*ir.IRModule, error) {
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
			d, ok := denseToPack(call, vectorBytes)
			if !ok || !isWeight(call.Args[1]) {
				return nil, nil
			}
			return rewrite(vb, call, d)
		}
	})
}

// denseToPack returns the dense layer call is when it is a matmul whose
// weight AlterDenseLayout can pack: float32, a 2-D weight and data of
// constant shape, and some panel width the dense rule takes.
func denseToPack(call *ir.RCall, vectorBytes int64) (denseLayer, bool) {
	o, ok := call.Op.(*ir.Op)
	if !ok || o.Name != "relax.matmul" || len(call.Args) != 2 {
		return denseLayer{}, false
	}
	if dt, _ := call.Attrs["out_dtype"].(string); dt != "" && dt != "void" {
		return denseLayer{}, false
	}
	x, ok1 := ir.StructInfoOf(call.Args[0]).(*ir.TensorStructInfo)
	w, ok2 := ir.StructInfoOf(call.Args[1]).(*ir.TensorStructInfo)
	if !ok1 || !ok2 || x.DType != ir.Float32 || w.DType != ir.Float32 || len(w.Shape) != 2 || len(x.Shape) < 2 {
		return denseLayer{}, false
	}
	rows := int64(1)
	var xs []string
	for i, d := range x.Shape {
		v, ok := ir.ConstDim(d)
		if !ok {
			return denseLayer{}, false
		}
		if i < len(x.Shape)-1 {
			rows *= v
		}
		xs = append(xs, fmt.Sprint(v))
	}
	k, ok1 := ir.ConstDim(w.Shape[0])
	n, ok2 := ir.ConstDim(w.Shape[1])
	if !ok1 || !ok2 {
		return denseLayer{}, false
	}
	vectorBytes = max(vectorBytes, 16)
	p := denseTileWidth(rows, n, vectorBytes)
	first := "KN"
	if p != 0 && p != n {
		first = fmt.Sprintf("NK%dn", p)
	}
	layouts := []string{first}
	for _, q := range auto.DensePanels(rows, n, vectorBytes, denseRegisters(vectorBytes)) {
		if l := fmt.Sprintf("NK%dn", q); l != first {
			layouts = append(layouts, l)
		}
	}
	if first != "KN" {
		layouts = append(layouts, "KN")
	}
	if len(layouts) == 1 && first == "KN" {
		return denseLayer{}, false
	}
	return denseLayer{k: k, n: n, key: fmt.Sprintf("dense %s * %dx%d", strings.Join(xs, "x"), k, n), layouts: layouts}, true
}

// denseTileWidth is the column tile of the default CPU schedule's dense
// rule for float32 (compiler/schedule/auto's DenseTileWidth: the schedule
// takes a packed weight only in tiles of its panel) on a CPU with vectors
// of vectorBytes (at least 16) and the register file that width implies
// (32 with 64-byte vectors, else 16). 0 when no vector width divides n.
func denseTileWidth(rows, n, vectorBytes int64) int64 {
	vectorBytes = max(vectorBytes, 16)
	return auto.DenseTileWidth(rows, n, vectorBytes, denseRegisters(vectorBytes))
}

// denseRegisters is the vector registers a CPU with vectors of
// vectorBytes has: 32 with 64-byte vectors, else 16.
func denseRegisters(vectorBytes int64) int64 {
	if vectorBytes < 64 {
		return 16
	}
	return 32
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
