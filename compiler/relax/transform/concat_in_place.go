package transform

import (
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// ConcatInPlace makes the producers of a concatenation write straight
// into the concatenation's output, as TVM's view-based memory planning
// does, and leaves every other allocation to the VM. For a binding
//
//	y = R.call_tir(cls.concatenate, (a, b), out_sinfo=R.Tensor((1, 128, 55, 55), dtype="float32"))
//
// where
//   - the PrimFunc is a plain concatenation (recognised by its body: one
//     block over the output whose value picks, by the position along one
//     axis, the matching element of one input: what LegalizeOps makes of
//     R.concat; a concatenation fused with anything else is not one),
//   - every dimension of y before the concatenation axis is 1, so each
//     input is one contiguous range of y's memory, each starting at a
//     multiple of 64 bytes (the alignment of the VM's storage blocks,
//     which kernels' vector loads and stores may rely on), and all
//     shapes are static with one dtype,
//   - each input is bound, in the same block, to a call_tir with one
//     tensor output, and used by nothing but this concatenation (not
//     twice, not by the result), and y does not escape (see
//     StaticPlanBlockMemory),
//
// y's storage is allocated before the first input's producer runs, each
// producer writes into its view of it (R.memory.alloc_tensor at the
// input's byte offset), and the concatenation is replaced by the
// full-size view:
//
//	storage = R.memory.alloc_storage(R.shape([1548800]), R.prim_value(0), R.str("global"), R.dtype("float32"))
//	alloc = R.memory.alloc_tensor(storage, R.prim_value(0), R.shape([1, 64, 55, 55]), R.dtype("float32"))
//	_: R.Tuple = cls.f(x, alloc)
//	a: R.Tensor((1, 64, 55, 55), dtype="float32") = alloc
//	alloc1 = R.memory.alloc_tensor(storage, R.prim_value(774400), R.shape([1, 64, 55, 55]), R.dtype("float32"))
//	_: R.Tuple = cls.g(x, alloc1)
//	b: R.Tensor((1, 64, 55, 55), dtype="float32") = alloc1
//	alloc2 = R.memory.alloc_tensor(storage, R.prim_value(0), R.shape([1, 128, 55, 55]), R.dtype("float32"))
//	y: R.Tensor((1, 128, 55, 55), dtype="float32") = alloc2
//
// Storages of concatenations whose lives do not overlap are shared, as
// StaticPlanBlockMemory shares them, and a concatenation PrimFunc no
// longer called is removed. Other call_tirs stay as they are.
// A function where this applies becomes impure and its blocks one plain
// block, as under StaticPlanBlockMemory; other functions are unchanged.
// StaticPlanBlockMemory does the same for the concatenations it plans,
// so a pipeline that plans all memory does not need this pass.
func ConcatInPlace(mod *ir.IRModule) (*ir.IRModule, error) {
	return planModule(mod, true)
}

// concatViewAlign is the byte alignment of the inputs of a
// concatenation written in place: that of the VM's storage blocks.
const concatViewAlign = 64

// concatGroup is one concatenation whose inputs are written in place.
type concatGroup struct {
	concat  int     // binding index of the concatenation
	inputs  []int   // binding indices of the inputs' producers, in order
	offsets []int64 // byte offset of each input in the output
}

// concatPrimFunc reports whether f is a plain concatenation of its
// inputs along one axis (the PrimFunc LegalizeOps makes of R.concat):
// every parameter a compact global buffer of static shape and one dtype,
// the last one the output, and a body that is a loop nest over the
// output with one block storing, at each output index, the element of
// input k at that index less k's offset along the axis, the input chosen
// by comparisons of the axis index with the offsets. It returns the
// axis.
func concatPrimFunc(f *ir.PrimFunc) (int, bool) {
	n := len(f.Params)
	if n < 3 {
		return 0, false
	}
	bufs := make([]*ir.Buffer, n)
	shapes := make([][]int64, n)
	for i := range f.Params {
		b := f.ParamBuffer(i)
		if b == nil || b.Strides != nil || (b.Scope != "" && b.Scope != "global") || b.DType != f.ParamBuffer(0).DType {
			return 0, false
		}
		if b.ElemOffset != nil {
			if v, ok := ir.IsConstInt(b.ElemOffset); !ok || v != 0 {
				return 0, false
			}
		}
		dims, ok := constDims(b.Shape)
		if !ok || len(dims) != len(f.ParamBuffer(0).Shape) || len(dims) == 0 {
			return 0, false
		}
		bufs[i], shapes[i] = b, dims
	}
	out := bufs[n-1]
	rank := len(shapes[n-1])
	// The root block, then the loop nest over the output.
	s := f.Body
	if br, ok := s.(*ir.BlockRealize); ok && len(br.Block.IterVars) == 0 {
		if br.Block.Init != nil || len(br.Block.AllocBuffers) != 0 {
			return 0, false
		}
		s = br.Block.Body
	}
	var loops []*ir.Var
	for {
		fr, ok := s.(*ir.For)
		if !ok {
			break
		}
		if m, ok := ir.IsConstInt(fr.Min); !ok || m != 0 || fr.Kind == ir.ForThreadBinding {
			return 0, false
		}
		e, ok := ir.IsConstInt(fr.Extent)
		if !ok || len(loops) >= rank || e != shapes[n-1][len(loops)] {
			return 0, false
		}
		loops = append(loops, fr.Var)
		s = fr.Body
	}
	br, ok := s.(*ir.BlockRealize)
	if !ok || len(loops) != rank || len(br.IterValues) != rank || len(br.Block.IterVars) != rank {
		return 0, false
	}
	if br.Predicate != nil {
		if v, ok := ir.IsConstInt(br.Predicate); !ok || v != 1 {
			return 0, false
		}
	}
	blk := br.Block
	if blk.Init != nil || len(blk.AllocBuffers) != 0 {
		return 0, false
	}
	iv := make([]*ir.Var, rank)
	for d := range rank {
		v, ok := br.IterValues[d].(*ir.Var)
		it := blk.IterVars[d]
		if !ok || v != loops[d] || it.Kind != ir.IterSpatial {
			return 0, false
		}
		if m, ok := ir.IsConstInt(it.Dom.Min); !ok || m != 0 {
			return 0, false
		}
		if e, ok := ir.IsConstInt(it.Dom.Extent); !ok || e != shapes[n-1][d] {
			return 0, false
		}
		iv[d] = it.Var
	}
	st, ok := blk.Body.(*ir.BufferStore)
	if !ok || st.Buffer != out || len(st.Indices) != rank {
		return 0, false
	}
	for d, x := range st.Indices {
		if x != ir.Expr(iv[d]) {
			return 0, false
		}
	}
	// The value: a tree of conditionals on the axis index whose leaves
	// load the inputs. Each leaf is reached for an interval [lo, hi) of
	// the axis index and must cover exactly its input.
	type leaf struct{ lo, hi, off int64 }
	leaves := map[int]leaf{}
	// The axis is the one the outermost condition compares.
	axis := -1
	var cond ir.Expr
	switch e := st.Value.(type) {
	case *ir.Call:
		if e.Op == ir.OpIfThenElse && len(e.Args) == 3 {
			cond = e.Args[0]
		}
	case *ir.Select:
		cond = e.Cond
	}
	if c, ok := cond.(*ir.Binary); ok {
		if v, ok := c.A.(*ir.Var); ok {
			axis = slices.Index(iv, v)
		}
	}
	if axis < 0 {
		return 0, false
	}
	var walk func(e ir.Expr, lo, hi int64) bool
	branch := func(cond, t, f ir.Expr, lo, hi int64) bool {
		c, ok := cond.(*ir.Binary)
		if !ok || c.Op != ir.OpLT || c.A != ir.Expr(iv[axis]) {
			return false
		}
		k, ok := ir.IsConstInt(c.B)
		return ok && walk(t, lo, min(hi, k)) && walk(f, max(lo, k), hi)
	}
	walk = func(e ir.Expr, lo, hi int64) bool {
		switch e := e.(type) {
		case *ir.Call:
			if e.Op != ir.OpIfThenElse || len(e.Args) != 3 {
				return false
			}
			return branch(e.Args[0], e.Args[1], e.Args[2], lo, hi)
		case *ir.Select:
			return branch(e.Cond, e.True, e.False, lo, hi)
		case *ir.BufferLoad:
			k := slices.Index(bufs[:n-1], e.Buffer)
			if k < 0 || len(e.Indices) != rank {
				return false
			}
			if _, dup := leaves[k]; dup {
				return false
			}
			var off int64
			for d, x := range e.Indices {
				if x == ir.Expr(iv[d]) {
					continue
				}
				b, ok := x.(*ir.Binary)
				if d != axis || !ok || b.Op != ir.OpSub || b.A != ir.Expr(iv[d]) {
					return false
				}
				if off, ok = ir.IsConstInt(b.B); !ok || off <= 0 {
					return false
				}
			}
			leaves[k] = leaf{lo, hi, off}
			return true
		}
		return false
	}
	if !walk(st.Value, 0, shapes[n-1][axis]) || len(leaves) != n-1 {
		return 0, false
	}
	// Input k is read exactly where it lies in the output.
	var at int64
	for k := range n - 1 {
		l := leaves[k]
		for d := range rank {
			if d != axis && shapes[k][d] != shapes[n-1][d] {
				return 0, false
			}
		}
		ext := shapes[k][axis]
		if ext <= 0 || l.off != at || l.lo != at || l.hi != at+ext {
			return 0, false
		}
		at += ext
	}
	if at != shapes[n-1][axis] {
		return 0, false
	}
	return axis, true
}

// constDims returns the constant extents of shape.
func constDims(shape []ir.Expr) ([]int64, bool) {
	out := make([]int64, len(shape))
	for i, d := range shape {
		v, ok := ir.IsConstInt(d)
		if !ok {
			return nil, false
		}
		out[i] = v
	}
	return out, true
}

// concatGroups finds the concatenations of bindings (a function's
// top-level bindings; blockOf gives each one's block) whose inputs can
// be written in place (see ConcatInPlace). produced holds the tokens of
// each call_tir binding, escaped those that leave the function's
// plannable memory.
func concatGroups(mod *ir.IRModule, fn *ir.Function, bindings []ir.Binding, blockOf []int, produced [][]*planToken, escaped map[*planToken]bool) []*concatGroup {
	uses := map[*ir.RVar]int{}
	ir.RVisit(fn.Body, func(e ir.RExpr) bool {
		if v, ok := e.(*ir.RVar); ok {
			uses[v]++
		}
		return true
	})
	defAt := map[*ir.RVar]int{}
	for i, bd := range bindings {
		if isCallTIR(bd.BoundValue()) {
			defAt[bd.BoundVar()] = i
		}
	}
	var groups []*concatGroup
	grouped := map[int]bool{} // outputs of the groups found so far
	for i, bd := range bindings {
		if !isCallTIR(bd.BoundValue()) || len(produced[i]) != 1 {
			continue
		}
		c := bd.BoundValue().(*ir.RCall)
		y := produced[i][0]
		if _, tuple := c.SInfoArgs[0].(*ir.TupleStructInfo); tuple || escaped[y] || y.bytes <= 0 {
			continue
		}
		pf := mod.PrimFunc(c.Args[0].(*ir.GlobalVar).Name)
		if pf == nil {
			continue
		}
		axis, ok := concatPrimFunc(pf)
		args, isTuple := c.Args[1].(*ir.RTuple)
		if !ok || !isTuple || len(args.Fields) != len(pf.Params)-1 {
			continue
		}
		dims, _ := y.info.KnownShape()
		if !slices.Equal(dims, bufferDims(pf.ParamBuffer(len(pf.Params)-1))) {
			continue
		}
		contiguous := true
		for _, d := range dims[:axis] {
			contiguous = contiguous && d == 1
		}
		if !contiguous {
			continue
		}
		g := &concatGroup{concat: i}
		var at int64
		for k, a := range args.Fields {
			v, ok := a.(*ir.RVar)
			if !ok {
				break
			}
			// An input that is itself a concatenation written in place
			// keeps its own storage.
			p, ok := defAt[v]
			if !ok || uses[v] != 1 || blockOf[p] != blockOf[i] || len(produced[p]) != 1 || grouped[p] {
				break
			}
			t := produced[p][0]
			if _, tuple := bindings[p].BoundValue().(*ir.RCall).SInfoArgs[0].(*ir.TupleStructInfo); tuple ||
				escaped[t] || t.info.DType != y.info.DType {
				break
			}
			td, _ := t.info.KnownShape()
			if !slices.Equal(td, bufferDims(pf.ParamBuffer(k))) || at%concatViewAlign != 0 {
				break
			}
			g.inputs = append(g.inputs, p)
			g.offsets = append(g.offsets, at)
			at += t.bytes
		}
		if len(g.inputs) != len(args.Fields) || at != y.bytes {
			continue
		}
		groups = append(groups, g)
		grouped[i] = true
	}
	return groups
}

// bufferDims returns b's constant extents (nil when one is not).
func bufferDims(b *ir.Buffer) []int64 {
	dims, ok := constDims(b.Shape)
	if !ok {
		return nil
	}
	return dims
}
