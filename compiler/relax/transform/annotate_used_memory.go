package transform

import (
	"errors"
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Attributes written by AnnotateUsedMemory.
const (
	// AttrUsedMemory is set on every primitive function called from main:
	// a []any of int64, the bytes live at each of its call sites in program
	// order.
	AttrUsedMemory = "used_memory"
	// AttrIOUsedMemory is set on main: an int64, the bytes of its
	// parameters and of its result.
	AttrIOUsedMemory = "io_used_memory"
)

// ErrDynamicShape is returned (wrapped) by AnnotateUsedMemory when a
// tensor it must size has a symbolic or unknown shape or dtype. Its
// message is the one TVM gives.
var ErrDynamicShape = errors.New("AnnotateUsedMemory does not support dynamic shapes")

func init() {
	if err := Register(Pass{Name: "AnnotateUsedMemory", Fn: AnnotateUsedMemory}); err != nil {
		panic(err)
	}
}

// AnnotateUsedMemory is TVM's AnnotateUsedMemory (TVM's AnnotateUsedMemory tests) on graph
// functions. It belongs after FuseOps, which makes the functions whose
// attribute AttrPrimitive is non-zero. Each such function that main
// calls through a GlobalVar gets AttrUsedMemory: for each call site, in
// program order, the bytes of every tensor live at that call, that is
// the call's arguments, its result (counted even when nothing uses it),
// and every earlier value (main's parameters included) still used after
// it. main gets AttrIOUsedMemory, the bytes of its parameters plus its
// result. Other functions are left as they are.
//
// main must be straight-line code in A-normal form (one call per
// binding; bindings may sit in dataflow blocks). A tensor takes the
// product of its dimensions times ceil(bits×lanes/8) bytes, a tuple the
// sum of its fields; shapes, scalars and functions take none. Bindings
// that only rename or regroup values (y = x, t = (a, b), t[0],
// match_cast) allocate nothing: they keep their sources alive instead.
// Constants live in the constant pool and are not counted. A tensor of
// symbolic or unknown shape that must be sized is an error wrapping
// ErrDynamicShape.
func AnnotateUsedMemory(mod *ir.IRModule) (*ir.IRModule, error) {
	bf, ok := mod.Lookup("main")
	if !ok {
		return nil, fmt.Errorf("annotate used memory: the module has no function \"main\"")
	}
	main, ok := bf.(*ir.Function)
	if !ok {
		return nil, fmt.Errorf("annotate used memory: \"main\" is a %T, want a graph function", bf)
	}
	a := &usedMemoryAnalysis{
		mod:     mod,
		rootOf:  map[*ir.RVar][]int{},
		tupleOf: map[*ir.RVar][][]int{},
		lastUse: map[int]int{},
	}
	io, err := a.ioBytes(main)
	if err != nil {
		return nil, fmt.Errorf("annotate used memory of \"main\": %w", err)
	}
	sites, err := a.callSites(main)
	if err != nil {
		return nil, fmt.Errorf("annotate used memory of \"main\": %w", err)
	}
	out := mod
	for _, name := range mod.Names() {
		figs, ok := sites[name]
		if !ok {
			continue
		}
		f, _ := mod.Lookup(name)
		out = out.With(name, f.(*ir.Function).WithAttr(AttrUsedMemory, figs))
	}
	bf, _ = out.Lookup("main") // main itself may have been annotated above
	return out.With("main", bf.(*ir.Function).WithAttr(AttrIOUsedMemory, io)), nil
}

// usedMemoryAnalysis holds the liveness state of one run over main.
// Values are grouped into roots: one per parameter and per binding that
// allocates; aliases map to the roots they keep alive.
type usedMemoryAnalysis struct {
	mod *ir.IRModule
	// rootOf maps each variable to the roots it keeps alive.
	rootOf map[*ir.RVar][]int
	// tupleOf maps variables bound to a tuple literal to each field's roots.
	tupleOf map[*ir.RVar][][]int
	// roots: the variable that defines each root, and the binding index
	// where it is defined (-1 for parameters).
	rootVar []*ir.RVar
	rootDef []int
	// lastUse is the last binding index (len(bindings) for the result)
	// that uses each root.
	lastUse map[int]int
}

// ioBytes is the size of main's parameters plus its result.
func (a *usedMemoryAnalysis) ioBytes(main *ir.Function) (int64, error) {
	var total int64
	for _, p := range main.Params {
		n, err := usedMemoryBytes(p.Info)
		if err != nil {
			return 0, fmt.Errorf("parameter %q: %w", p.Name, err)
		}
		total += n
	}
	ret := main.Ret
	if ret == nil {
		ret = ir.StructInfoOf(main.Body)
	}
	n, err := usedMemoryBytes(ret)
	if err != nil {
		// The declared result may be less precise than the body's.
		n2, err2 := usedMemoryBytes(ir.StructInfoOf(main.Body))
		if err2 != nil {
			return 0, fmt.Errorf("result: %w", err)
		}
		n = n2
	}
	return total + n, nil
}

// callSites returns, per primitive function main calls, the bytes live
// at each of its call sites in program order.
func (a *usedMemoryAnalysis) callSites(main *ir.Function) (map[string][]any, error) {
	for _, p := range main.Params {
		a.rootOf[p] = []int{a.newRoot(p, -1)}
	}
	var bindings []ir.Binding
	for _, b := range main.Body.Blocks {
		bindings = append(bindings, b.Bindings...)
	}
	// Pass 1: roots and last uses.
	for i, b := range bindings {
		v, val := b.BoundVar(), b.BoundValue()
		if _, ok := val.(*ir.RIf); ok {
			return nil, fmt.Errorf("binding %q: control flow in main is not supported", v.Name)
		}
		for _, r := range a.uses(val) {
			a.lastUse[r] = i
		}
		a.bind(b, i)
	}
	for _, r := range a.uses(main.Body.Body) {
		a.lastUse[r] = len(bindings)
	}
	// Pass 2: the live bytes at each primitive call.
	sites := map[string][]any{}
	for i, b := range bindings {
		call, ok := b.BoundValue().(*ir.RCall)
		if !ok {
			continue
		}
		gv, ok := call.Op.(*ir.GlobalVar)
		if !ok || !a.isPrimitive(gv.Name) {
			continue
		}
		var total int64
		for r, v := range a.rootVar {
			def := a.rootDef[r]
			last, used := a.lastUse[r]
			live := def == i || def < i && used && last >= i
			if !live {
				continue
			}
			n, err := usedMemoryBytes(v.Info)
			if err != nil {
				what := fmt.Sprintf("live value %q", v.Name)
				if def == i {
					what = "its result"
				}
				return nil, fmt.Errorf("call of %q bound to %q: %s: %w", gv.Name, b.BoundVar().Name, what, err)
			}
			total += n
		}
		sites[gv.Name] = append(sites[gv.Name], total)
	}
	return sites, nil
}

func (a *usedMemoryAnalysis) newRoot(v *ir.RVar, def int) int {
	a.rootVar = append(a.rootVar, v)
	a.rootDef = append(a.rootDef, def)
	return len(a.rootVar) - 1
}

// bind records what the variable of b, binding i, keeps alive.
func (a *usedMemoryAnalysis) bind(b ir.Binding, i int) {
	v := b.BoundVar()
	if mc, ok := b.(*ir.MatchCast); ok {
		a.rootOf[v] = a.uses(mc.Value) // a checked rename
		return
	}
	switch val := b.BoundValue().(type) {
	case *ir.RVar:
		a.rootOf[v] = a.uses(val)
		if t, ok := a.tupleOf[val]; ok {
			a.tupleOf[v] = t
		}
	case *ir.RTuple:
		fields := make([][]int, len(val.Fields))
		var all []int
		for k, f := range val.Fields {
			fields[k] = a.uses(f)
			all = append(all, fields[k]...)
		}
		a.rootOf[v] = all
		a.tupleOf[v] = fields
	case *ir.TupleGetItem:
		if t, ok := val.Tuple.(*ir.RVar); ok {
			if fields, ok := a.tupleOf[t]; ok && val.Index >= 0 && val.Index < len(fields) {
				a.rootOf[v] = fields[val.Index]
				return
			}
		}
		// A field of a value that was allocated whole keeps all of it.
		a.rootOf[v] = a.uses(val.Tuple)
	case *ir.Constant:
		// The constant pool, not counted.
	case *ir.ShapeExpr, *ir.PrimValue, *ir.RString, *ir.DataTypeImm, *ir.GlobalVar, *ir.ExternFunc, *ir.Op, *ir.Function:
		// Values that take no tensor memory.
	default:
		a.rootOf[v] = []int{a.newRoot(v, i)}
	}
}

// uses returns the roots kept alive by the variables e refers to.
func (a *usedMemoryAnalysis) uses(e ir.RExpr) []int {
	var out []int
	seen := map[int]bool{}
	ir.RVisit(e, func(x ir.RExpr) bool {
		if v, ok := x.(*ir.RVar); ok {
			for _, r := range a.rootOf[v] {
				if !seen[r] {
					seen[r] = true
					out = append(out, r)
				}
			}
		}
		return true
	})
	return out
}

// isPrimitive reports a graph function of the module whose attribute
// Primitive is non-zero.
func (a *usedMemoryAnalysis) isPrimitive(name string) bool {
	f, ok := a.mod.Lookup(name)
	if !ok {
		return false
	}
	fn, ok := f.(*ir.Function)
	if !ok {
		return false
	}
	switch v := fn.Attrs[AttrPrimitive].(type) {
	case int64:
		return v != 0
	case int:
		return v != 0
	case bool:
		return v
	case *ir.IntImm:
		return v.Value != 0
	}
	return false
}

// usedMemoryBytes is the size of a value of struct info s: TVM's
// GetMemorySizeBytes for tensors, the sum of the fields for tuples.
func usedMemoryBytes(s ir.StructInfo) (int64, error) {
	switch s := s.(type) {
	case *ir.TensorStructInfo:
		dims, ok := s.KnownShape()
		if !ok || ir.IsVoid(s.DType) {
			return 0, fmt.Errorf("%s: %w", s, ErrDynamicShape)
		}
		n := int64(1)
		for _, d := range dims {
			if d < 0 {
				return 0, fmt.Errorf("%s: negative dimension", s)
			}
			n *= d
		}
		return n * int64((int(s.DType.Bits)*int(max(s.DType.Lanes, 1))+7)/8), nil
	case *ir.TupleStructInfo:
		var total int64
		for _, f := range s.Fields {
			n, err := usedMemoryBytes(f)
			if err != nil {
				return 0, err
			}
			total += n
		}
		return total, nil
	case *ir.ShapeStructInfo, *ir.PrimStructInfo, *ir.FuncStructInfo:
		return 0, nil
	}
	return 0, fmt.Errorf("%s: %w", s, ErrDynamicShape)
}
