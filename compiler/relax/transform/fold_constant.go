package transform

import (
	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/devices"
	_ "github.com/kiln-ml/kiln/devices/cpu" // host arrays for the interpreter
	"github.com/kiln-ml/kiln/ndarray"
)

// Limits of FoldConstant: results larger than foldMaxBytes, and
// PrimFuncs that need more than foldMaxSteps loop iterations, are not
// folded.
const (
	foldMaxBytes = 16 << 20
	foldMaxSteps = 50_000_000
)

// FoldConstant evaluates, in every graph function, the bindings whose
// value is a call_tir of a PrimFunc, or an operator call with a
// legalizer, all of whose tensor arguments are constants (R.const, or
// variables bound to constants earlier), and binds the result as a
// constant instead; uses of variables bound to constants become the
// constants. PrimFuncs run in the reference interpreter
// (compiler/interp). Calls with outputs of unknown or symbolic shape,
// results over 16 MiB and computations over 5×10⁷ steps are left alone;
// so is a call the interpreter fails on. Bindings left unused are for
// DeadCodeElimination to remove.
func FoldConstant(mod *ir.IRModule) (*ir.IRModule, error) {
	out := mod
	for name, f := range mod.Funcs() {
		fn, ok := f.(*ir.Function)
		if !ok {
			continue
		}
		consts := map[*ir.RVar]*ir.Constant{}
		m := &ir.RMutator{Expr: func(e ir.RExpr) ir.RExpr {
			if v, ok := e.(*ir.RVar); ok {
				if c, ok := consts[v]; ok {
					return c
				}
			}
			return e
		}}
		m.Binding = func(b ir.Binding) []ir.Binding {
			vb, ok := b.(*ir.VarBinding)
			if !ok {
				return []ir.Binding{b}
			}
			switch v := vb.Value.(type) {
			case *ir.Constant:
				consts[vb.Var] = v
			case *ir.RCall:
				if c := foldCall(mod, v, consts); c != nil {
					consts[vb.Var] = c
					return []ir.Binding{&ir.VarBinding{Var: vb.Var, Value: c}}
				}
			}
			return []ir.Binding{b}
		}
		if g := m.RewriteFunc(fn); g != fn {
			out = out.With(name, g)
		}
	}
	return out, nil
}

// constArg returns the constant that e is, or is bound to.
func constArg(e ir.RExpr, consts map[*ir.RVar]*ir.Constant) *ir.Constant {
	switch e := e.(type) {
	case *ir.Constant:
		return e
	case *ir.RVar:
		return consts[e]
	}
	return nil
}

// foldCall evaluates c when its tensor inputs are constants, or returns
// nil.
func foldCall(mod *ir.IRModule, c *ir.RCall, consts map[*ir.RVar]*ir.Constant) *ir.Constant {
	o, ok := c.Op.(*ir.Op)
	if !ok {
		return nil
	}
	var f *ir.PrimFunc
	var inputs []ir.RExpr
	var outInfo ir.StructInfo
	switch o.Name {
	case ir.OpCallPacked:
		return nil
	case ir.OpCallTIR:
		if len(c.Args) != 2 || len(c.SInfoArgs) != 1 {
			return nil
		}
		gv, ok := c.Args[0].(*ir.GlobalVar)
		t, tok := c.Args[1].(*ir.RTuple)
		if !ok || !tok {
			return nil
		}
		if f = mod.PrimFunc(gv.Name); f == nil {
			return nil
		}
		inputs, outInfo = t.Fields, c.SInfoArgs[0]
	default:
		def, ok := op.Lookup(o.Name)
		if !ok || def.Legalize() == nil || !def.IsPure() {
			return nil
		}
		for _, a := range c.Args {
			if _, isTensor := ir.StructInfoOf(a).(*ir.TensorStructInfo); isTensor {
				inputs = append(inputs, a)
			} else if _, isTuple := ir.StructInfoOf(a).(*ir.TupleStructInfo); isTuple {
				return nil
			}
		}
		if len(inputs) == 0 {
			return nil // creation ops (zeros, full): folding only grows the module
		}
		outInfo = c.Info
		for _, a := range inputs {
			if constArg(a, consts) == nil {
				return nil
			}
		}
		var err error
		if f, err = def.Legalize()(c); err != nil || f == nil {
			return nil
		}
	}
	out, ok := outInfo.(*ir.TensorStructInfo)
	if !ok || ir.IsVoid(out.DType) {
		return nil
	}
	dims, ok := out.KnownShape()
	if !ok {
		return nil
	}
	shape := ndarray.Shape(dims)
	if shape.Validate() != nil || shape.NumElements()*int64(out.DType.Size()) > foldMaxBytes {
		return nil
	}
	if len(f.Params) != len(inputs)+1 {
		return nil
	}
	var args []any
	for _, a := range inputs {
		k := constArg(a, consts)
		if k == nil {
			return nil
		}
		arr, err := ndarray.FromBytes(k.Data, k.Shape, k.DType, devices.CPUDevice)
		if err != nil {
			return nil
		}
		defer arr.Release()
		args = append(args, arr)
	}
	res, err := ndarray.Zeros(shape, out.DType, devices.CPUDevice)
	if err != nil {
		return nil
	}
	defer res.Release()
	args = append(args, res)
	if err := interp.RunOptions(f, interp.Options{MaxSteps: foldMaxSteps}, args...); err != nil {
		return nil
	}
	k, err := ir.NewConstant(res)
	if err != nil {
		return nil
	}
	return k
}
