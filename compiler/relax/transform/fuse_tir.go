package transform

import (
	"fmt"
	"strconv"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// FuseTIR turns every graph function marked Primitive (FuseOps' groups)
// into one PrimFunc of the same name, as TVM does: its parameters are
// buffers named after the function's tensor parameters (tuple parameters
// flattened, name_0, name_1…), then the outputs; the bodies of the
// PrimFuncs its bindings call_tir are placed one after the other (loop
// and block variables renewed, duplicate block names made unique with _1,
// _2…), each intermediate result in a buffer "<output name>_intermediate"
// allocated in the root block, the final ones becoming output parameters.
// The PrimFunc has only the attribute tir.noalias. Calls of the grouped
// functions become call_tir of the PrimFuncs; the grouped functions, and
// PrimFuncs that only they called, leave the module. Finally, an output
// bound to a dataflow variable used only there (lv = f(x); gv = lv) is
// bound directly (gv = f(x)).
func FuseTIR(mod *ir.IRModule) (*ir.IRModule, error) {
	fused := map[string]*ir.PrimFunc{}
	for name, f := range mod.Funcs() {
		fn, ok := f.(*ir.Function)
		if !ok || !isPrimitive(fn) {
			continue
		}
		pf, err := fuseTIR(mod, fn)
		if err != nil {
			return nil, funcError(name, err)
		}
		fused[name] = pf
	}
	before := map[string]bool{}
	for n, f := range mod.Funcs() {
		if fn, ok := f.(*ir.Function); ok && !isPrimitive(fn) {
			for _, c := range callees(mod, n) {
				before[c] = true
			}
		}
	}
	out := mod
	for name, pf := range fused {
		out = out.With(name, pf)
	}
	for name, f := range mod.Funcs() {
		fn, ok := f.(*ir.Function)
		if !ok || isPrimitive(fn) {
			continue
		}
		m := &ir.RMutator{Expr: func(e ir.RExpr) ir.RExpr {
			c, ok := e.(*ir.RCall)
			if !ok {
				return e
			}
			gv, ok := c.Op.(*ir.GlobalVar)
			if !ok || fused[gv.Name] == nil {
				return e
			}
			var args []ir.RExpr
			for _, a := range c.Args {
				args = append(args, flattenTensors(a)...)
			}
			info := c.Info
			if info == nil {
				info = StructInfoOfFunc(mod, gv.Name)
			}
			call := ir.CallTIR(out.GlobalVar(gv.Name), args, info)
			call.Sources = c.Sources
			return call
		}}
		if g := foldOutputAliases(m.RewriteFunc(fn)); g != fn {
			out = out.With(name, g)
		}
	}
	// Drop PrimFuncs that only grouped functions called.
	after := map[string]bool{}
	for n, f := range out.Funcs() {
		if _, ok := f.(*ir.Function); ok {
			for _, c := range callees(out, n) {
				after[c] = true
			}
		}
	}
	for name, f := range mod.Funcs() {
		if _, isPrim := f.(*ir.PrimFunc); isPrim && fused[name] == nil && !before[name] && !after[name] && calledByPrimitive(mod, name) {
			out = out.Without(name)
		}
	}
	if len(fused) == 0 {
		return out, nil
	}
	return SortFunctions(out), nil
}

// StructInfoOfFunc is the result struct info of function name of mod.
func StructInfoOfFunc(mod *ir.IRModule, name string) ir.StructInfo {
	f, _ := mod.Lookup(name)
	if fn, ok := f.(*ir.Function); ok {
		return fn.Ret
	}
	return ir.Object()
}

// calledByPrimitive reports whether a Primitive graph function of mod
// refers to name.
func calledByPrimitive(mod *ir.IRModule, name string) bool {
	for n, f := range mod.Funcs() {
		if fn, ok := f.(*ir.Function); ok && isPrimitive(fn) {
			for _, c := range callees(mod, n) {
				if c == name {
					return true
				}
			}
		}
	}
	return false
}

// flattenTensors returns the tensors of an argument: tuples are expanded
// (with TupleGetItem where the tuple is not literal).
func flattenTensors(a ir.RExpr) []ir.RExpr {
	if t, ok := a.(*ir.RTuple); ok {
		var out []ir.RExpr
		for _, f := range t.Fields {
			out = append(out, flattenTensors(f)...)
		}
		return out
	}
	if ts, ok := ir.StructInfoOf(a).(*ir.TupleStructInfo); ok {
		var out []ir.RExpr
		for i := range ts.Fields {
			out = append(out, flattenTensors(&ir.TupleGetItem{Tuple: a, Index: i})...)
		}
		return out
	}
	return []ir.RExpr{a}
}

// fuseTIR builds the PrimFunc of one grouped function.
func fuseTIR(mod *ir.IRModule, fn *ir.Function) (*ir.PrimFunc, error) {
	bufs := map[ir.RExpr][]*ir.Buffer{}
	var params []*ir.Buffer
	for _, p := range fn.Params {
		bs, err := paramBuffers(p.Name, p.Info, -1)
		if err != nil {
			return nil, fmt.Errorf("parameter %q: %w", p.Name, err)
		}
		bufs[p] = bs
		params = append(params, bs...)
	}
	var allocs []*ir.Buffer
	var bodies []ir.Stmt
	var value func(e ir.RExpr) ([]*ir.Buffer, error)
	value = func(e ir.RExpr) ([]*ir.Buffer, error) {
		switch e := e.(type) {
		case *ir.RVar:
			bs, ok := bufs[e]
			if !ok {
				return nil, fmt.Errorf("variable %q has no buffer", e.Name)
			}
			return bs, nil
		case *ir.RTuple:
			var out []*ir.Buffer
			for _, f := range e.Fields {
				bs, err := value(f)
				if err != nil {
					return nil, err
				}
				out = append(out, bs...)
			}
			return out, nil
		case *ir.TupleGetItem:
			bs, err := value(e.Tuple)
			if err != nil {
				return nil, err
			}
			ts, ok := ir.StructInfoOf(e.Tuple).(*ir.TupleStructInfo)
			if !ok || e.Index >= len(ts.Fields) {
				return nil, fmt.Errorf("tuple index %d of %s", e.Index, ir.StructInfoOf(e.Tuple))
			}
			begin := 0
			for _, f := range ts.Fields[:e.Index] {
				begin += countTensors(f)
			}
			return bs[begin : begin+countTensors(ts.Fields[e.Index])], nil
		case *ir.RCall:
			o, ok := e.Op.(*ir.Op)
			if !ok || o.Name != ir.OpCallTIR || len(e.Args) != 2 || len(e.SInfoArgs) != 1 {
				return nil, fmt.Errorf("only call_tir can be fused, got a call of %s", calleeHint(e))
			}
			gv, _ := e.Args[0].(*ir.GlobalVar)
			if gv == nil {
				return nil, fmt.Errorf("call_tir of a %T", e.Args[0])
			}
			pf := mod.PrimFunc(gv.Name)
			if pf == nil {
				return nil, fmt.Errorf("call_tir of %q: no such PrimFunc", gv.Name)
			}
			root := ir.RootBlock(pf.Body)
			if root == nil {
				return nil, fmt.Errorf("call_tir of %q: only PrimFuncs whose body is a root block can be fused", gv.Name)
			}
			ins, err := value(e.Args[1])
			if err != nil {
				return nil, err
			}
			outs, ok := tensorFields(e.SInfoArgs[0])
			if !ok {
				return nil, fmt.Errorf("call_tir of %q: out_sinfo is not tensors", gv.Name)
			}
			if len(pf.Params) != len(ins)+len(outs) {
				return nil, fmt.Errorf("call_tir of %q: %d inputs and %d outputs for %d parameters", gv.Name, len(ins), len(outs), len(pf.Params))
			}
			bmap := map[*ir.Buffer]*ir.Buffer{}
			vmap := map[*ir.Var]ir.Expr{}
			for i, target := range ins {
				b := pf.ParamBuffer(i)
				if b == nil {
					return nil, fmt.Errorf("call_tir of %q: parameter %d is not a buffer", gv.Name, i)
				}
				if err := matchShape(b, target.Shape, vmap); err != nil {
					return nil, fmt.Errorf("call_tir of %q: argument %d: %w", gv.Name, i, err)
				}
				bmap[b] = target
			}
			var results []*ir.Buffer
			for j, o := range outs {
				i := len(ins) + j
				b := pf.ParamBuffer(i)
				if b == nil || o.Shape == nil {
					return nil, fmt.Errorf("call_tir of %q: output %d has no buffer or shape", gv.Name, j)
				}
				if err := matchShape(b, o.Shape, vmap); err != nil {
					return nil, fmt.Errorf("call_tir of %q: output %d: %w", gv.Name, j, err)
				}
				nb := &ir.Buffer{Name: pf.Params[i].Name + "_intermediate", DType: b.DType, Shape: o.Shape,
					Scope: b.StorageScope(), Data: ir.NewVar(pf.Params[i].Name+"_intermediate", ir.Handle)}
				bmap[b] = nb
				results = append(results, nb)
			}
			body, rootAllocs := renewDefs(root, bmap, vmap)
			allocs = append(allocs, rootAllocs...)
			allocs = append(allocs, results...)
			bodies = append(bodies, body)
			return results, nil
		}
		return nil, fmt.Errorf("cannot fuse a %T", e)
	}
	for _, blk := range fn.Body.Blocks {
		for _, bd := range blk.Bindings {
			if _, ok := bd.(*ir.VarBinding); !ok {
				return nil, fmt.Errorf("binding %q: match_cast cannot be fused", bd.BoundVar().Name)
			}
			bs, err := value(bd.BoundValue())
			if err != nil {
				return nil, fmt.Errorf("binding %q: %w", bd.BoundVar().Name, err)
			}
			bufs[bd.BoundVar()] = bs
		}
	}
	results, err := value(fn.Body.Body)
	if err != nil {
		return nil, fmt.Errorf("result: %w", err)
	}
	isOut := map[*ir.Buffer]bool{}
	for _, r := range results {
		isOut[r] = true
	}
	var kept []*ir.Buffer
	for _, a := range allocs {
		if !isOut[a] {
			kept = append(kept, a)
		}
	}
	params = append(params, results...)
	body := dedupBlockNames(ir.Seq(bodies...))
	return ir.NewPrimFunc(params, ir.NewRootBlock(body, kept...), map[string]any{ir.AttrNoAlias: true}), nil
}

func countTensors(s ir.StructInfo) int {
	if t, ok := s.(*ir.TupleStructInfo); ok {
		n := 0
		for _, f := range t.Fields {
			n += countTensors(f)
		}
		return n
	}
	return 1
}

// paramBuffers makes the buffers of a grouped function's parameter.
func paramBuffers(name string, s ir.StructInfo, index int) ([]*ir.Buffer, error) {
	switch s := s.(type) {
	case *ir.TensorStructInfo:
		if s.Shape == nil || ir.IsVoid(s.DType) {
			return nil, fmt.Errorf("a tensor of unknown shape or dtype (%s) cannot be fused", s)
		}
		n := name
		if index >= 0 {
			n = name + "_" + strconv.Itoa(index)
		}
		return []*ir.Buffer{ir.NewBuffer(n, s.DType, s.Shape, "")}, nil
	case *ir.TupleStructInfo:
		if index < 0 {
			index = 0
		}
		var out []*ir.Buffer
		for _, f := range s.Fields {
			bs, err := paramBuffers(name, f, index)
			if err != nil {
				return nil, err
			}
			out = append(out, bs...)
			index += len(bs)
		}
		return out, nil
	}
	return nil, fmt.Errorf("parameters of struct info %s cannot be fused", s)
}

// matchShape binds the symbolic dimensions of b to the target shape, and
// checks the constant ones.
func matchShape(b *ir.Buffer, shape []ir.Expr, vmap map[*ir.Var]ir.Expr) error {
	if len(b.Shape) != len(shape) {
		return fmt.Errorf("buffer %q has %d dimensions, the value %d", b.Name, len(b.Shape), len(shape))
	}
	for i, d := range b.Shape {
		if v, ok := d.(*ir.Var); ok {
			if prev, seen := vmap[v]; seen && !ir.DimEqual(prev, shape[i]) {
				return fmt.Errorf("buffer %q: dimension %s is both %s and %s", b.Name, v.Name, ir.DimString(prev), ir.DimString(shape[i]))
			}
			vmap[v] = shape[i]
			continue
		}
		if !ir.DimEqual(ir.FoldDim(ir.SubstituteExpr(d, vmap)), shape[i]) {
			return fmt.Errorf("buffer %q of shape %s gets a value of shape %s", b.Name, ir.ShapeString(b.Shape), ir.ShapeString(shape))
		}
	}
	return nil
}

// renewDefs copies the body of a root block with fresh loop, block and
// let variables and fresh allocated buffers, buffers in bmap replaced and
// variables in vmap substituted. It returns the body and the root's
// allocations.
func renewDefs(root *ir.Block, bmap map[*ir.Buffer]*ir.Buffer, vmap map[*ir.Var]ir.Expr) (ir.Stmt, []*ir.Buffer) {
	fresh := map[*ir.Var]*ir.Var{}
	def := func(v *ir.Var) *ir.Var {
		if nv, ok := fresh[v]; ok {
			return nv
		}
		nv := ir.NewVar(v.Name, v.Type)
		fresh[v] = nv
		return nv
	}
	ir.Visit(root.Body, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.For:
			def(n.Var)
		case *ir.Block:
			for _, iv := range n.IterVars {
				def(iv.Var)
			}
		case *ir.LetStmt:
			def(n.Var)
		case *ir.Let:
			def(n.Var)
		}
		return true
	})
	sub := func(e ir.Expr) ir.Expr {
		return ir.SubstituteExpr(e, vmap)
	}
	var rw *ir.Rewriter
	rw = &ir.Rewriter{
		Expr: func(e ir.Expr) ir.Expr {
			switch e := e.(type) {
			case *ir.Var:
				if nv, ok := fresh[e]; ok {
					return nv
				}
				if r, ok := vmap[e]; ok {
					return r
				}
			case *ir.Let:
				if nv, ok := fresh[e.Var]; ok {
					return &ir.Let{Var: nv, Value: e.Value, Body: e.Body}
				}
			}
			return e
		},
		Stmt: func(s ir.Stmt) ir.Stmt {
			switch s := s.(type) {
			case *ir.For:
				c := *s
				c.Var = def(s.Var)
				return &c
			case *ir.LetStmt:
				return &ir.LetStmt{Var: def(s.Var), Value: s.Value, Body: s.Body}
			case *ir.BlockRealize:
				blk := *s.Block
				blk.IterVars = make([]ir.IterVar, len(s.Block.IterVars))
				for i, iv := range s.Block.IterVars {
					blk.IterVars[i] = ir.IterVar{Var: def(iv.Var), Dom: iv.Dom, Kind: iv.Kind}
				}
				return &ir.BlockRealize{IterValues: s.IterValues, Predicate: s.Predicate, Block: &blk}
			}
			return s
		},
		Buffer: func(b *ir.Buffer) *ir.Buffer {
			if t, ok := bmap[b]; ok {
				return t
			}
			nb := *b
			nb.Data = ir.NewVar(b.Data.Name, b.Data.Type)
			nb.Shape = make([]ir.Expr, len(b.Shape))
			for i, d := range b.Shape {
				nb.Shape[i] = sub(d)
			}
			if b.Strides != nil {
				nb.Strides = make([]ir.Expr, len(b.Strides))
				for i, d := range b.Strides {
					nb.Strides[i] = sub(d)
				}
			}
			if b.ElemOffset != nil {
				nb.ElemOffset = sub(b.ElemOffset)
			}
			return &nb
		},
	}
	// Rewrite the root block itself so that its allocations go through the
	// same buffer map as the body.
	out := rw.RewriteStmt(&ir.BlockRealize{Predicate: ir.BoolImm(true), Block: root}).(*ir.BlockRealize)
	return out.Block.Body, out.Block.AllocBuffers
}

// dedupBlockNames renames blocks whose name an earlier block has (T_add,
// T_add_1, …), as TVM's FuseTIR does.
func dedupBlockNames(s ir.Stmt) ir.Stmt {
	count := map[string]int{}
	return (&ir.Rewriter{PreStmt: nil, Stmt: func(s ir.Stmt) ir.Stmt {
		br, ok := s.(*ir.BlockRealize)
		if !ok {
			return s
		}
		name := br.Block.Name
		unique := name
		for {
			if _, taken := count[unique]; !taken {
				break
			}
			count[name]++
			unique = name + "_" + strconv.Itoa(count[name])
		}
		count[unique] = 0
		if unique == name {
			return s
		}
		blk := *br.Block
		blk.Name = unique
		return &ir.BlockRealize{IterValues: br.IterValues, Predicate: br.Predicate, Block: &blk}
	}}).RewriteStmt(s)
}
