package transform

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
)

// storageMatchRange bounds reuse: a free storage is reused for a tensor
// when neither size is more than this factor of the other (TVM's
// TokenAllocator1D match range).
const storageMatchRange = 16

// StaticPlanBlockMemory makes the memory of every graph function (but
// Primitive ones) explicit, as TVM's CallTIRRewrite, StaticPlanBlockMemory
// and ToNonDataflow do together. Each top-level binding
//
//	x = R.call_tir(cls.f, (a, b), out_sinfo=R.Tensor((1, 256), dtype="float32"))
//
// becomes
//
//	storage = R.memory.alloc_storage(R.shape([1024]), R.prim_value(0), R.str("global"), R.dtype("float32"))
//	alloc = R.memory.alloc_tensor(storage, R.prim_value(0), R.shape([1, 256]), R.dtype("float32"))
//	_: R.Tuple = cls.f(a, b, alloc)
//	x: R.Tensor((1, 256), dtype="float32") = alloc
//
// where storage (size in bytes, the dtype of the first tensor placed in
// it) is allocated just before its first tensor and reused, by liveness,
// for later tensors of the same dtype whose size is within a factor of 16
// (a storage takes the largest size placed in it); the storage is emitted
// once with that size. After the binding that last uses a planned tensor
// comes R.memory.kill_tensor(alloc); before the return, one
// R.memory.kill_storage per storage. Tensors of symbolic shape, and
// tensors that escape (reach the result, a tuple, or anything but an
// argument of a call or an alias binding), are allocated with
// R.builtin.alloc_tensor(R.shape(dims), R.dtype(dt), R.prim_value(0)) and
// never reused. A tuple out_sinfo allocates one tensor per field and binds
// x to the tuple of them.
//
// A concatenation whose inputs can be written in place (see
// ConcatInPlace: a plain concatenation PrimFunc, every dimension before
// its axis 1, each input a call_tir result used only by it) is planned as
// one tensor, live from its first input's producer to its last use: each
// producer writes into R.memory.alloc_tensor(storage, byte offset, its
// shape), and the concatenation's binding becomes the full-size view at
// offset 0. The inputs are views, never storages or kills of their own;
// a concatenation PrimFunc no longer called is removed from the module.
//
// The function becomes impure (pure=False) and its dataflow blocks plain
// blocks, merged into one; the variables keep their names. Bindings other
// than call_tir stay as they are, and so do call_tirs inside if branches.
//
// What the VM code generator gets: only these forms — memory.alloc_storage
// (size in bytes as a 1-D shape, device index 0, scope, dtype),
// memory.alloc_tensor (storage, byte offset, shape, dtype; the offset is
// 0 but for the inputs of a concatenation written in place),
// builtin.alloc_tensor, direct calls of PrimFuncs in
// destination-passing style returning R.Tuple(), aliases, kill_tensor
// and kill_storage, and whatever operator calls were not legalized.
func StaticPlanBlockMemory(mod *ir.IRModule) (*ir.IRModule, error) {
	return planModule(mod, false)
}

// planModule plans the graph functions of mod: all their call_tirs, or
// only the concatenations written in place (concatOnly, ConcatInPlace).
// The PrimFuncs of concatenations written in place that nothing calls
// any more are removed.
func planModule(mod *ir.IRModule, concatOnly bool) (*ir.IRModule, error) {
	out := mod
	dropped := map[string]bool{}
	for name, f := range mod.Funcs() {
		fn, ok := f.(*ir.Function)
		if !ok || isPrimitive(fn) || fn.Body == nil {
			continue
		}
		if !hasTopLevelCallTIR(fn) {
			continue
		}
		g, err := planFunction(mod, fn, concatOnly, dropped)
		if err != nil {
			return nil, funcError(name, err)
		}
		if g != nil {
			out = out.With(name, g)
		}
	}
	if len(dropped) > 0 {
		for name, f := range out.Funcs() {
			if _, ok := f.(*ir.Function); ok {
				for _, c := range callees(out, name) {
					delete(dropped, c)
				}
			}
		}
		for name := range dropped {
			out = out.Without(name)
		}
	}
	return out, nil
}

func hasTopLevelCallTIR(fn *ir.Function) bool {
	for _, b := range fn.Body.Blocks {
		for _, bd := range b.Bindings {
			if isCallTIR(bd.BoundValue()) {
				return true
			}
		}
	}
	return false
}

func isCallTIR(e ir.RExpr) bool {
	c, ok := e.(*ir.RCall)
	if !ok {
		return false
	}
	o, ok := c.Op.(*ir.Op)
	return ok && o.Name == ir.OpCallTIR && len(c.Args) == 2 && len(c.SInfoArgs) == 1
}

// planToken is one tensor a call_tir writes.
type planToken struct {
	info    *ir.TensorStructInfo
	bytes   int64
	storage int // index into storages, -1 when not planned
	alloc   *ir.RVar
	start   int // binding index from which its storage is needed
	lastUse int // binding index of the last use
	// view, when set, is the output of the concatenation this tensor is
	// an input of: the tensor lives in view's storage at byte offset.
	view   *planToken
	offset int64
	// concat is set on the output of a concatenation written in place.
	concat bool
}

type planStorage struct {
	dtype ir.DType
	bytes int64
	v     *ir.RVar
	free  bool
}

// planFunction returns fn with its memory planned, or nil when
// concatOnly and no concatenation can be written in place. It adds the
// PrimFuncs of the concatenations it drops to dropped.
func planFunction(mod *ir.IRModule, fn *ir.Function, concatOnly bool, dropped map[string]bool) (*ir.Function, error) {
	var bindings []ir.Binding
	var blockOf []int
	for k, b := range fn.Body.Blocks {
		bindings = append(bindings, b.Bindings...)
		for range b.Bindings {
			blockOf = append(blockOf, k)
		}
	}
	// Tokens of each bound variable (aliases share them).
	tokensOf := map[*ir.RVar][]*planToken{}
	produced := make([][]*planToken, len(bindings))
	escaped := map[*planToken]bool{}
	for i, bd := range bindings {
		x := bd.BoundVar()
		if isCallTIR(bd.BoundValue()) {
			c := bd.BoundValue().(*ir.RCall)
			outs, ok := tensorFields(c.SInfoArgs[0])
			if !ok {
				return nil, fmt.Errorf("binding %q: out_sinfo %s is not tensors", x.Name, c.SInfoArgs[0])
			}
			for _, o := range outs {
				t := &planToken{info: o, storage: -1, start: i, lastUse: i}
				if dims, ok := o.KnownShape(); ok && !ir.IsVoid(o.DType) {
					n := int64(1)
					for _, d := range dims {
						n *= d
					}
					t.bytes = n * ((int64(o.DType.Bits)*int64(o.DType.Lanes) + 7) / 8)
				} else {
					t.bytes = -1
					escaped[t] = true
				}
				produced[i] = append(produced[i], t)
			}
			tokensOf[x] = produced[i]
			// Uses by the call's arguments.
			for _, v := range ir.FreeRVars(c.Args[1]) {
				for _, t := range tokensOf[v] {
					t.lastUse = i
				}
			}
			continue
		}
		if v, ok := bd.BoundValue().(*ir.RVar); ok {
			if ts, ok := tokensOf[v]; ok {
				tokensOf[x] = ts
				for _, t := range ts {
					t.lastUse = i
				}
				continue
			}
		}
		_, isCall := bd.BoundValue().(*ir.RCall)
		for _, v := range ir.FreeRVars(bd.BoundValue()) {
			for _, t := range tokensOf[v] {
				t.lastUse = i
				if !isCall {
					escaped[t] = true
				}
			}
		}
	}
	for _, v := range ir.FreeRVars(fn.Body.Body) {
		for _, t := range tokensOf[v] {
			escaped[t] = true
		}
	}
	// Concatenations whose inputs are written in place: the output's
	// storage is needed from the first input's producer on; the inputs
	// are views of it.
	groups := concatGroups(mod, fn, bindings, blockOf, produced, escaped)
	if concatOnly && len(groups) == 0 {
		return nil, nil
	}
	starts := make([][]*planToken, len(bindings))
	for _, g := range groups {
		dropped[bindings[g.concat].BoundValue().(*ir.RCall).Args[0].(*ir.GlobalVar).Name] = true
		y := produced[g.concat][0]
		y.concat, y.start = true, g.inputs[0]
		for k, p := range g.inputs {
			t := produced[p][0]
			t.view, t.offset = y, g.offsets[k]
			y.start = min(y.start, p)
		}
	}
	for i := range bindings {
		for _, t := range produced[i] {
			if t.view == nil && !escaped[t] && (t.concat || !concatOnly) {
				starts[t.start] = append(starts[t.start], t)
			}
		}
	}
	// Assign storages by liveness.
	var storages []*planStorage
	for i := range bindings {
		for _, t := range starts[i] {
			best := -1
			for s, st := range storages {
				if !st.free || st.dtype != t.info.DType {
					continue
				}
				if st.bytes*storageMatchRange < t.bytes || t.bytes*storageMatchRange < st.bytes {
					continue
				}
				if best < 0 || absDiff(st.bytes, t.bytes) < absDiff(storages[best].bytes, t.bytes) {
					best = s
				}
			}
			if best < 0 {
				storages = append(storages, &planStorage{dtype: t.info.DType})
				best = len(storages) - 1
			}
			st := storages[best]
			st.free = false
			st.bytes = max(st.bytes, t.bytes)
			t.storage = best
		}
		// Tokens whose last use is this binding free their storage for
		// the bindings after it.
		for _, ts := range produced[:i+1] {
			for _, t := range ts {
				if t.storage >= 0 && t.lastUse == i {
					storages[t.storage].free = true
				}
			}
		}
	}
	// Emit.
	subst := map[*ir.RVar]ir.RExpr{}
	rewrite := func(e ir.RExpr) ir.RExpr { return (&ir.RMutator{Subst: subst}).RewriteExpr(e) }
	var out []ir.Binding
	emit := func(name string, value ir.RExpr) *ir.RVar {
		v := ir.NewRVar(name, ir.StructInfoOf(value))
		out = append(out, &ir.VarBinding{Var: v, Value: value})
		return v
	}
	call := func(name string, args ...ir.RExpr) (*ir.RCall, error) {
		c, err := op.Call(name, args, nil)
		if err != nil {
			return nil, fmt.Errorf("build %s: %w", name, err)
		}
		return c, nil
	}
	dev := &ir.PrimValue{Value: ir.I64(0)}
	for i, bd := range bindings {
		x := bd.BoundVar()
		nx := x
		if x.Dataflow {
			nx = &ir.RVar{Name: x.Name, Info: x.Info}
			subst[x] = nx
		}
		if !isCallTIR(bd.BoundValue()) || concatOnly && keptCallTIR(produced[i]) {
			val := rewrite(bd.BoundValue())
			switch b := bd.(type) {
			case *ir.MatchCast:
				out = append(out, &ir.MatchCast{Var: nx, Value: val, Info: b.Info})
			default:
				out = append(out, &ir.VarBinding{Var: nx, Value: val})
			}
		} else if y := produced[i][0]; y.concat {
			// The inputs are already in place: y is the whole view.
			a, err := call("relax.memory.alloc_tensor", storages[y.storage].v, &ir.PrimValue{Value: ir.I64(0)},
				&ir.ShapeExpr{Values: y.info.Shape}, &ir.DataTypeImm{DType: y.info.DType})
			if err != nil {
				return nil, err
			}
			y.alloc = emit("alloc", a)
			out = append(out, &ir.VarBinding{Var: nx, Value: y.alloc})
		} else {
			c := bd.BoundValue().(*ir.RCall)
			var allocs []ir.RExpr
			for _, t := range produced[i] {
				shape := &ir.ShapeExpr{Values: t.info.Shape}
				dt := &ir.DataTypeImm{DType: t.info.DType}
				storage, offset := t.storage, int64(0)
				if t.view != nil {
					storage, offset = t.view.storage, t.offset
				}
				if storage < 0 {
					a, err := call("relax.builtin.alloc_tensor", shape, dt, dev)
					if err != nil {
						return nil, err
					}
					t.alloc = emit("alloc", a)
				} else {
					st := storages[storage]
					if st.v == nil {
						s, err := call("relax.memory.alloc_storage", &ir.ShapeExpr{Values: []ir.Expr{ir.I64(st.bytes)}}, dev,
							&ir.RString{Value: "global"}, &ir.DataTypeImm{DType: st.dtype})
						if err != nil {
							return nil, err
						}
						st.v = emit("storage", s)
					}
					a, err := call("relax.memory.alloc_tensor", st.v, &ir.PrimValue{Value: ir.I64(offset)}, shape, dt)
					if err != nil {
						return nil, err
					}
					t.alloc = emit("alloc", a)
				}
				allocs = append(allocs, t.alloc)
			}
			gv := c.Args[0].(*ir.GlobalVar)
			args := flattenTensors(rewrite(c.Args[1]))
			args = append(args, allocs...)
			pc := &ir.RCall{Op: gv, Args: args, Info: ir.VoidInfo(), Sources: c.Sources}
			if pf := mod.PrimFunc(gv.Name); pf != nil {
				pc.Info = ir.PrimFuncResult(pf)
			}
			emit("_", pc)
			var val ir.RExpr = allocs[0]
			if _, isTuple := c.SInfoArgs[0].(*ir.TupleStructInfo); isTuple {
				val = &ir.RTuple{Fields: allocs}
			}
			out = append(out, &ir.VarBinding{Var: nx, Value: val})
		}
		// Kill the planned tensors whose life ends here.
		for _, ts := range produced[:i+1] {
			for _, t := range ts {
				if t.storage >= 0 && t.lastUse == i && t.alloc != nil {
					k, err := call("relax.memory.kill_tensor", t.alloc)
					if err != nil {
						return nil, err
					}
					emit("_", k)
				}
			}
		}
	}
	for _, st := range storages {
		if st.v == nil {
			continue
		}
		k, err := call("relax.memory.kill_storage", st.v)
		if err != nil {
			return nil, err
		}
		emit("_", k)
	}
	body := &ir.SeqExpr{Blocks: []*ir.BindingBlock{{Bindings: out}}, Body: rewrite(fn.Body.Body)}
	g := fn.WithBody(body)
	g.Pure = false
	return g, nil
}

// keptCallTIR reports whether ConcatInPlace leaves the call_tir that
// produces ts as it is: it writes no view and is no concatenation.
func keptCallTIR(ts []*planToken) bool {
	for _, t := range ts {
		if t.view != nil || t.concat {
			return false
		}
	}
	return true
}

func absDiff(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}
