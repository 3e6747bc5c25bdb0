package te

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// CreatePrimFunc returns the TensorIR PrimFunc computing the given tensors
// (TVM's te.create_prim_func). args are the function's parameters in
// order: every placeholder the computation reads and the outputs. Compute
// stages reached from args that are not among them become intermediate
// buffers allocated by the root block. Each Compute stage becomes one loop
// nest (spatial loops, then reduce loops) around one block named after the
// stage, with T.axis.spatial/reduce iteration variables, read and write
// regions and, for reductions, an init statement holding the reducer's
// identity. The function's attributes are global_symbol "main" and
// tir.noalias.
func CreatePrimFunc(args []*Tensor) (*ir.PrimFunc, error) {
	f, err := createPrimFunc(args)
	if err != nil {
		return nil, fmt.Errorf("create_prim_func: %w", err)
	}
	return f, nil
}

func createPrimFunc(args []*Tensor) (*ir.PrimFunc, error) {
	isArg := map[*Tensor]bool{}
	for i, t := range args {
		if t == nil {
			return nil, fmt.Errorf("argument %d is nil", i)
		}
		if isArg[t] {
			return nil, fmt.Errorf("tensor %q is passed twice", t.Name)
		}
		isArg[t] = true
	}
	// Topological order of the compute stages: inputs before users.
	var stages []*Tensor
	state := map[*Tensor]int{} // 1 visiting, 2 done
	var visit func(t, user *Tensor) error
	visit = func(t, user *Tensor) error {
		if t.err != nil {
			return t.err
		}
		switch state[t] {
		case 1:
			return fmt.Errorf("tensor %q depends on itself", t.Name)
		case 2:
			return nil
		}
		state[t] = 1
		if t.op == nil {
			if !isArg[t] {
				return fmt.Errorf("placeholder %q read by %q is not among the arguments", t.Name, user.Name)
			}
		} else {
			for _, in := range t.op.inputs {
				if err := visit(in, t); err != nil {
					return err
				}
			}
			stages = append(stages, t)
		}
		state[t] = 2
		return nil
	}
	for _, t := range args {
		if err := visit(t, nil); err != nil {
			return nil, err
		}
	}
	names := map[string]*Tensor{}
	for _, t := range append(slices.Clone(args), stages...) {
		if o, ok := names[t.Name]; ok && o != t {
			return nil, fmt.Errorf("two tensors are named %q", t.Name)
		}
		names[t.Name] = t
	}
	var params, allocs []*ir.Buffer
	for _, t := range args {
		params = append(params, t.buf)
	}
	for _, t := range stages {
		if !isArg[t] {
			allocs = append(allocs, t.buf)
		}
	}
	var body []ir.Stmt
	for _, t := range stages {
		body = append(body, stageNest(t))
	}
	if len(body) == 0 {
		return nil, errors.New("no compute stage among the arguments")
	}
	f := ir.NewPrimFunc(params, ir.NewRootBlock(ir.Seq(body...), allocs...),
		map[string]any{ir.AttrGlobalSymbol: "main", ir.AttrNoAlias: true})
	if err := checkSizeVars(f, params); err != nil {
		return nil, err
	}
	if err := ir.Verify(f); err != nil {
		return nil, err
	}
	return f, nil
}

// checkSizeVars reports a size variable that no argument's shape defines.
func checkSizeVars(f *ir.PrimFunc, params []*ir.Buffer) error {
	defined := map[*ir.Var]bool{}
	for _, b := range params {
		for _, e := range b.Shape {
			ir.PostOrderVisit(e, func(n ir.Node) {
				if v, ok := n.(*ir.Var); ok {
					defined[v] = true
				}
			})
		}
	}
	var err error
	ir.Visit(f.Body, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.For:
			defined[n.Var] = true
		case *ir.Block:
			for _, iv := range n.IterVars {
				defined[iv.Var] = true
			}
			for _, b := range n.AllocBuffers {
				for _, e := range b.Shape {
					ir.PostOrderVisit(e, func(m ir.Node) {
						if v, ok := m.(*ir.Var); ok && !defined[v] && err == nil {
							err = fmt.Errorf("size variable %q of %q is not defined by the shape of any argument", v.Name, b.Name)
						}
					})
				}
			}
		case *ir.Var:
			if !defined[n] && err == nil {
				err = fmt.Errorf("variable %q is not defined by the shape of any argument", n.Name)
			}
		}
		return err == nil
	})
	return err
}

// stageNest builds the loop nest and block of one Compute stage.
func stageNest(t *Tensor) ir.Stmt {
	op := t.op
	var ivs []ir.IterVar
	var loops []*ir.Var
	var values []ir.Expr
	vmap := map[*ir.Var]ir.Expr{}
	addIter := func(v *ir.Var, dom ir.Range, kind ir.IterKind) {
		lv := ir.NewVar(v.Name, v.Type)
		bv := ir.NewVar("v_"+v.Name, v.Type)
		loops = append(loops, lv)
		ivs = append(ivs, ir.IterVar{Var: bv, Dom: dom, Kind: kind})
		values = append(values, lv)
		vmap[v] = bv
	}
	for d, a := range op.axes {
		addIter(a, ir.RangeFromExtent(t.Shape[d]), ir.IterSpatial)
	}
	if op.red != nil {
		for _, a := range op.red.axes {
			addIter(a.Var, a.Dom, ir.IterReduce)
		}
	}
	idx := make([]ir.Expr, len(op.axes))
	for d, a := range op.axes {
		idx[d] = vmap[a]
	}
	blk := &ir.Block{Name: t.Name, IterVars: ivs, Writes: []ir.BufferRegion{ir.PointRegion(t.buf, idx...)}}
	if op.red == nil {
		value := ir.SubstituteExpr(op.value, vmap)
		blk.Reads = readRegions(value)
		blk.Body = t.buf.Store(value, idx...)
	} else {
		src := ir.SubstituteExpr(op.red.source, vmap)
		blk.Reads = readRegions(src)
		blk.Init = t.buf.Store(op.red.kind.identity(t.DType), idx...)
		blk.Body = t.buf.Store(op.red.kind.combine(t.buf.Load(idx...), src), idx...)
	}
	var s ir.Stmt = &ir.BlockRealize{IterValues: values, Predicate: ir.BoolImm(true), Block: blk}
	for i := len(loops) - 1; i >= 0; i-- {
		dom := ivs[i].Dom
		s = ir.NewFor(loops[i], dom.Min, dom.Extent, ir.ForSerial, s)
	}
	return s
}

// readRegions returns the regions of the buffers that e loads, in order of
// first use. Accesses to one buffer that differ by constants along a
// dimension merge into a range; accesses that differ otherwise cover the
// whole dimension.
func readRegions(e ir.Expr) []ir.BufferRegion {
	var order []*ir.Buffer
	acc := map[*ir.Buffer][][]ir.Expr{}
	ir.PostOrderVisit(e, func(n ir.Node) {
		if l, ok := n.(*ir.BufferLoad); ok {
			if _, seen := acc[l.Buffer]; !seen {
				order = append(order, l.Buffer)
			}
			acc[l.Buffer] = append(acc[l.Buffer], l.Indices)
		}
	})
	out := make([]ir.BufferRegion, len(order))
	for i, b := range order {
		out[i] = ir.BufferRegion{Buffer: b, Region: mergeAccesses(b, acc[b])}
	}
	return out
}

// mergeAccesses returns the smallest region this package can prove covers
// the accesses (index lists) of b.
func mergeAccesses(b *ir.Buffer, accesses [][]ir.Expr) []ir.Range {
	region := make([]ir.Range, len(b.Shape))
	for d := range b.Shape {
		base, off := splitOffset(accesses[0][d])
		lo, hi := off, off
		same := true
		for _, ix := range accesses[1:] {
			b2, o2 := splitOffset(ix[d])
			if !sameExpr(base, b2) {
				same = false
				break
			}
			lo, hi = min(lo, o2), max(hi, o2)
		}
		t := accesses[0][d].DType()
		switch {
		case !same:
			region[d] = ir.RangeFromExtent(b.Shape[d])
		case lo == hi:
			region[d] = ir.Range{Min: accesses[0][d], Extent: ir.NewIntImm(t, 1)}
		default:
			region[d] = ir.Range{Min: withOffset(base, lo, t), Extent: ir.NewIntImm(t, hi-lo+1)}
		}
	}
	return region
}

// splitOffset returns e as base + constant (base nil for a constant).
func splitOffset(e ir.Expr) (ir.Expr, int64) {
	if c, ok := ir.IsConstInt(e); ok {
		return nil, c
	}
	if bin, ok := e.(*ir.Binary); ok && (bin.Op == ir.OpAdd || bin.Op == ir.OpSub) {
		if c, ok := ir.IsConstInt(bin.B); ok {
			base, off := splitOffset(bin.A)
			if bin.Op == ir.OpSub {
				c = -c
			}
			return base, off + c
		}
	}
	return e, 0
}

func withOffset(base ir.Expr, off int64, t ir.DType) ir.Expr {
	switch {
	case base == nil:
		return ir.NewIntImm(t, off)
	case off == 0:
		return base
	case off < 0:
		return ir.Sub(base, ir.NewIntImm(t, -off))
	}
	return ir.Add(base, ir.NewIntImm(t, off))
}

func sameExpr(a, b ir.Expr) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return ir.Equal(a, b)
}
