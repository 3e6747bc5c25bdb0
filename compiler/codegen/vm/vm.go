// Package vm is the VM code generator: it turns the graph-level functions
// of an IRModule into bytecode for kiln's virtual machine (package
// github.com/kiln-ml/kiln/vm), one VM function per graph function.
//
// Its input is a module whose operator calls have been legalized: what is
// left are calls of PrimFuncs (directly, in destination-passing style, or
// through call_tir), of other graph functions, the VM's and the memory
// planner's allocation operators (R.vm.alloc_storage, R.vm.alloc_tensor,
// R.builtin.alloc_tensor, R.memory.*), tuples, constants and
// conditionals. PrimFuncs become the VM's external kernels under their
// names in the module; the caller compiles them into the same artifact.
// Calls of a graph function marked AttrCallCached (the weight transforms
// LiftTransformParams lifts) become vm.builtin.call_cached, so the VM runs
// them once per set of weight arrays.
//
// The package imports compiler/ir and the vm runtime (for its builder); the
// runtime never imports the compiler.
package vm

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
	rt "github.com/kiln-ml/kiln/vm"
)

// AttrCallCached marks a graph function whose calls go through
// vm.builtin.call_cached: it runs once per set of argument arrays (the
// weight transforms compiler/relax/transform.LiftTransformParams lifts;
// that package spells the same key).
const AttrCallCached = "kiln.call_cached"

// ErrUnsupported is wrapped by errors for graph code the VM code generator
// cannot translate (an operator that was not legalized, a symbolic shape
// the VM cannot compute).
var ErrUnsupported = errors.New("not supported by the VM code generator")

// Generate translates every graph function of mod into one executable.
func Generate(mod *ir.IRModule) (*rt.Executable, error) {
	b := rt.NewBuilder()
	n := 0
	for _, name := range mod.Names() {
		f, ok := lookup(mod, name).(*ir.Function)
		if !ok {
			continue
		}
		g := &gen{mod: mod, b: b, regs: map[*ir.RVar]rt.Reg{}, fn: name}
		if err := g.function(name, f); err != nil {
			return nil, fmt.Errorf("vm codegen: function %q: %w", name, err)
		}
		n++
	}
	if n == 0 {
		return nil, errors.New("vm codegen: the module has no graph functions")
	}
	exe, err := b.Build()
	if err != nil {
		return nil, fmt.Errorf("vm codegen: %w", err)
	}
	return exe, nil
}

// HasGraphFunctions reports whether mod holds graph-level functions (and so
// needs a VM executable).
func HasGraphFunctions(mod *ir.IRModule) bool {
	for _, name := range mod.Names() {
		if _, ok := lookup(mod, name).(*ir.Function); ok {
			return true
		}
	}
	return false
}

// lookup is mod's function of that name, or nil.
func lookup(mod *ir.IRModule, name string) ir.BaseFunc {
	f, _ := mod.Lookup(name)
	return f
}

type gen struct {
	mod  *ir.IRModule
	b    rt.Builder
	f    rt.FunctionBuilder
	fn   string
	regs map[*ir.RVar]rt.Reg
	// binding names the binding being translated, for errors.
	binding string
}

func (g *gen) errorf(format string, a ...any) error {
	err := fmt.Errorf(format, a...)
	if g.binding != "" {
		return fmt.Errorf("binding %q: %w", g.binding, err)
	}
	return err
}

func (g *gen) function(name string, f *ir.Function) error {
	params := make([]rt.Param, len(f.Params))
	for i, p := range f.Params {
		params[i] = paramSpec(p)
	}
	g.f = g.b.Function(name, params...)
	for i, p := range f.Params {
		g.regs[p] = g.f.Param(i)
	}
	r, err := g.seq(f.Body)
	if err != nil {
		return err
	}
	g.f.Ret(r)
	return nil
}

// paramSpec is what the VM checks of a parameter at Invoke.
func paramSpec(p *ir.RVar) rt.Param {
	switch si := p.Info.(type) {
	case *ir.TensorStructInfo:
		if si.NDim < 0 || si.Shape == nil {
			prm := rt.KindParam(p.Name, rt.ParamTensor)
			if si.DType != ir.Void {
				prm.DType = si.DType
			}
			prm.NDim = si.NDim
			return prm
		}
		dims := make([]rt.Dim, len(si.Shape))
		for i, d := range si.Shape {
			switch d := d.(type) {
			case *ir.IntImm:
				dims[i] = rt.Static(d.Value)
			case *ir.Var:
				dims[i] = rt.Sym(d.Name)
			default:
				// A computed dimension (n * 2): only the rank is checked.
				prm := rt.KindParam(p.Name, rt.ParamTensor)
				prm.NDim = len(si.Shape)
				if si.DType != ir.Void {
					prm.DType = si.DType
				}
				return prm
			}
		}
		dt := si.DType
		if dt == ir.Void {
			dt = ir.DType{}
		}
		return rt.TensorParam(p.Name, dt, dims...)
	case *ir.TupleStructInfo:
		return rt.KindParam(p.Name, rt.ParamTuple)
	case *ir.ShapeStructInfo:
		return rt.KindParam(p.Name, rt.ParamShape)
	case *ir.PrimStructInfo:
		if si.DType.Code == ir.Float32.Code {
			return rt.KindParam(p.Name, rt.ParamFloat)
		}
		return rt.KindParam(p.Name, rt.ParamInt)
	}
	return rt.AnyParam(p.Name)
}

// seq translates the bindings of s and returns the register of its body.
func (g *gen) seq(s *ir.SeqExpr) (rt.Reg, error) {
	for _, blk := range s.Blocks {
		for _, bd := range blk.Bindings {
			v := bd.BoundVar()
			g.binding = v.Name
			if mc, ok := bd.(*ir.MatchCast); ok {
				r, err := g.reg(mc.Value)
				if err != nil {
					return 0, err
				}
				g.regs[v] = r
				continue
			}
			r, err := g.reg(bd.BoundValue())
			if err != nil {
				return 0, err
			}
			g.regs[v] = r
		}
	}
	g.binding = ""
	return g.reg(s.Body)
}

// reg translates e into a register holding its value.
func (g *gen) reg(e ir.RExpr) (rt.Reg, error) {
	switch e := e.(type) {
	case *ir.RVar:
		r, ok := g.regs[e]
		if !ok {
			return 0, g.errorf("variable %q used before it is bound", e.Name)
		}
		return r, nil
	case *ir.RCall:
		return g.call(e)
	case *ir.RTuple:
		ops, err := g.operands(e.Fields)
		if err != nil {
			return 0, err
		}
		return g.f.Call(rt.BuiltinMakeTuple, ops...), nil
	case *ir.TupleGetItem:
		t, err := g.reg(e.Tuple)
		if err != nil {
			return 0, err
		}
		return g.f.Call(rt.BuiltinTupleGetItem, t, rt.Imm(e.Index)), nil
	case *ir.RIf:
		return g.ifExpr(e)
	case *ir.SeqExpr:
		return g.seq(e)
	}
	// Constants and other leaves: materialize the operand in a register.
	op, err := g.operand(e)
	if err != nil {
		return 0, err
	}
	return g.f.Call(rt.BuiltinCopy, op), nil
}

// operand translates e into a call operand: constants stay constants.
func (g *gen) operand(e ir.RExpr) (rt.Operand, error) {
	switch e := e.(type) {
	case *ir.Constant:
		return g.b.Constant(rt.Constant{Kind: rt.ConstTensor, DType: e.DType, Shape: e.Shape, Data: e.Data}), nil
	case *ir.ShapeExpr:
		dims, err := g.constDims(e.Values)
		if err != nil {
			return nil, err
		}
		return g.b.Shape(dims...), nil
	case *ir.PrimValue:
		switch v := e.Value.(type) {
		case *ir.IntImm:
			return rt.Imm(v.Value), nil
		case *ir.FloatImm:
			return g.b.Float(v.Value), nil
		}
		return nil, g.errorf("prim value %s is not a constant: %w", e.Value, ErrUnsupported)
	case *ir.RString:
		return g.b.String(e.Value), nil
	case *ir.DataTypeImm:
		return g.b.DType(e.DType), nil
	case *ir.GlobalVar:
		return nil, g.errorf("function %q used as a value: %w", e.Name, ErrUnsupported)
	}
	return g.reg(e)
}

func (g *gen) operands(es []ir.RExpr) ([]rt.Operand, error) {
	out := make([]rt.Operand, len(es))
	for i, e := range es {
		op, err := g.operand(e)
		if err != nil {
			return nil, err
		}
		out[i] = op
	}
	return out, nil
}

func (g *gen) constDims(vals []ir.Expr) ([]int64, error) {
	dims := make([]int64, len(vals))
	for i, v := range vals {
		c, ok := v.(*ir.IntImm)
		if !ok {
			return nil, g.errorf("shape dimension %s is symbolic: %w", v, ErrUnsupported)
		}
		dims[i] = c.Value
	}
	return dims, nil
}

// call translates a call of an operator, a function or an extern.
func (g *gen) call(c *ir.RCall) (rt.Reg, error) {
	switch op := c.Op.(type) {
	case *ir.GlobalVar:
		args, err := g.operands(c.Args)
		if err != nil {
			return 0, err
		}
		switch callee := lookup(g.mod, op.Name).(type) {
		case *ir.Function:
			if callee.Attrs[AttrCallCached] != nil {
				return g.f.Call(rt.BuiltinCallCached, append([]rt.Operand{g.b.String(op.Name)}, args...)...), nil
			}
			return g.f.Call(op.Name, args...), nil
		case *ir.PrimFunc:
			g.sources(op.Name, c)
			return g.f.Call(op.Name, args...), nil
		case nil:
			return 0, g.errorf("call of %q, which is not in the module", op.Name)
		}
		return 0, g.errorf("call of %q: %w", op.Name, ErrUnsupported)
	case *ir.ExternFunc:
		args, err := g.operands(c.Args)
		if err != nil {
			return 0, err
		}
		return g.f.Call(op.Name, args...), nil
	case *ir.Op:
		return g.opCall(op.Name, c)
	}
	return 0, g.errorf("call of a function value: %w", ErrUnsupported)
}

func (g *gen) opCall(name string, c *ir.RCall) (rt.Reg, error) {
	arg := func(i int) (rt.Operand, error) {
		if i >= len(c.Args) {
			return nil, g.errorf("%s: missing argument %d", name, i)
		}
		return g.operand(c.Args[i])
	}
	args := func(idx ...int) ([]rt.Operand, error) {
		out := make([]rt.Operand, len(idx))
		for k, i := range idx {
			op, err := arg(i)
			if err != nil {
				return nil, err
			}
			out[k] = op
		}
		return out, nil
	}
	switch name {
	case "relax.vm.alloc_storage": // size, device index, dtype, scope
		ops, err := args(0, 1, 2, 3)
		if err != nil {
			return 0, err
		}
		return g.f.Call(rt.BuiltinAllocStorage, ops...), nil
	case "relax.memory.alloc_storage": // size, virtual device index, scope, dtype
		ops, err := args(0, 1, 3, 2)
		if err != nil {
			return 0, err
		}
		return g.f.Call(rt.BuiltinAllocStorage, ops...), nil
	case "relax.vm.alloc_tensor", "relax.memory.alloc_tensor": // storage, offset, shape, dtype
		ops, err := args(0, 1, 2, 3)
		if err != nil {
			return 0, err
		}
		return g.f.Call(rt.BuiltinAllocTensor, ops...), nil
	case "relax.builtin.alloc_tensor": // shape, dtype, device index, [scope]
		ops, err := args(0, 1, 2)
		if err != nil {
			return 0, err
		}
		scope := rt.Operand(g.b.String("global"))
		if len(c.Args) > 3 {
			if scope, err = arg(3); err != nil {
				return 0, err
			}
		}
		st := g.f.Call(rt.BuiltinAllocStorage, ops[0], ops[2], ops[1], scope)
		return g.f.Call(rt.BuiltinAllocTensor, st, rt.Imm(0), ops[0], ops[1]), nil
	case "relax.vm.kill_object", "relax.memory.kill_storage", "relax.memory.kill_tensor":
		// Storage lifetimes end with the invocation (naive) or go back to
		// the pool; an early kill is an optimization the VM does not need.
		return g.f.Call(rt.BuiltinNullValue), nil
	case "relax.call_tir":
		return g.callTIR(c)
	case "relax.call_packed":
		if len(c.Args) == 0 {
			return 0, g.errorf("call_packed without a callee")
		}
		callee, ok := c.Args[0].(*ir.ExternFunc)
		if !ok {
			return 0, g.errorf("call_packed: callee is not an extern function: %w", ErrUnsupported)
		}
		ops, err := g.operands(c.Args[1:])
		if err != nil {
			return 0, err
		}
		return g.f.Call(callee.Name, ops...), nil
	}
	return 0, g.errorf("operator %s has not been legalized (run LegalizeOps first): %w", name, ErrUnsupported)
}

// sources records the model operators call c of kernel name computes,
// for profiles.
func (g *gen) sources(name string, c *ir.RCall) {
	for _, s := range c.Sources {
		g.b.AddSources(name, rt.Source{Name: s.Name, Op: s.Op})
	}
}

// callTIR allocates the outputs, calls the PrimFunc in destination-passing
// style and returns the output (or a tuple of them).
func (g *gen) callTIR(c *ir.RCall) (rt.Reg, error) {
	if len(c.Args) < 1 {
		return 0, g.errorf("call_tir without a callee")
	}
	gv, ok := c.Args[0].(*ir.GlobalVar)
	if !ok {
		return 0, g.errorf("call_tir callee is not a global function: %w", ErrUnsupported)
	}
	if _, ok := lookup(g.mod, gv.Name).(*ir.PrimFunc); !ok {
		return 0, g.errorf("call_tir of %q, which is not a PrimFunc of the module", gv.Name)
	}
	var ins []rt.Operand
	if len(c.Args) > 1 {
		switch a := c.Args[1].(type) {
		case *ir.RTuple:
			ops, err := g.operands(a.Fields)
			if err != nil {
				return 0, err
			}
			ins = ops
		default:
			op, err := g.operand(a)
			if err != nil {
				return 0, err
			}
			ins = []rt.Operand{op}
		}
	}
	outInfos := c.SInfoArgs
	if len(outInfos) == 1 {
		if t, ok := outInfos[0].(*ir.TupleStructInfo); ok {
			outInfos = t.Fields
		}
	}
	if len(outInfos) == 0 {
		return 0, g.errorf("call_tir of %q has no out_sinfo", gv.Name)
	}
	outs := make([]rt.Reg, len(outInfos))
	for i, si := range outInfos {
		t, ok := si.(*ir.TensorStructInfo)
		if !ok || t.Shape == nil || t.DType == ir.Void {
			return 0, g.errorf("call_tir of %q: output %d has no static tensor shape and dtype (%s): %w", gv.Name, i, si, ErrUnsupported)
		}
		dims, err := g.constDims(t.Shape)
		if err != nil {
			return 0, err
		}
		shape, dt := g.b.Shape(dims...), g.b.DType(t.DType)
		st := g.f.Call(rt.BuiltinAllocStorage, shape, rt.Imm(0), dt, g.b.String("global"))
		outs[i] = g.f.Call(rt.BuiltinAllocTensor, st, rt.Imm(0), shape, dt)
	}
	args := slices.Clone(ins)
	for _, r := range outs {
		args = append(args, r)
	}
	g.sources(gv.Name, c)
	g.f.CallTo(rt.NoReg, gv.Name, args...)
	if len(outs) == 1 && !isTupleOut(c.SInfoArgs) {
		return outs[0], nil
	}
	ops := make([]rt.Operand, len(outs))
	for i, r := range outs {
		ops[i] = r
	}
	return g.f.Call(rt.BuiltinMakeTuple, ops...), nil
}

func isTupleOut(infos []ir.StructInfo) bool {
	if len(infos) != 1 {
		return len(infos) > 1
	}
	_, ok := infos[0].(*ir.TupleStructInfo)
	return ok
}

// ifExpr translates a conditional into If/Goto with one result register.
func (g *gen) ifExpr(e *ir.RIf) (rt.Reg, error) {
	c, err := g.reg(e.Cond)
	if err != nil {
		return 0, err
	}
	cond := g.f.Call(rt.BuiltinReadIfCond, c)
	out := g.f.NewReg()
	elseL, endL := g.f.NewLabel(), g.f.NewLabel()
	g.f.If(cond, elseL)
	saved := g.binding
	r, err := g.seq(e.Then)
	if err != nil {
		return 0, err
	}
	g.f.CallTo(out, rt.BuiltinCopy, r)
	g.f.Goto(endL)
	g.f.Bind(elseL)
	r, err = g.seq(e.Else)
	if err != nil {
		return 0, err
	}
	g.f.CallTo(out, rt.BuiltinCopy, r)
	g.f.Bind(endL)
	g.binding = saved
	return out, nil
}
