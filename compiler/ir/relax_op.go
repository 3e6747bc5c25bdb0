package ir

import (
	"fmt"
	"slices"
	"sync"
)

// OpDef is a graph-level operator as the IR sees it: its name, whether it
// is pure, and how to infer the struct info of a call. The operator
// library (compiler/relax/op) defines them and registers them here with
// RegisterOp; Verify and the text parser look them up by name.
type OpDef interface {
	// OpName is the operator's full name, "relax.add".
	OpName() string
	// IsPure reports an operator without side effects.
	IsPure() bool
	// InferStructInfo returns the struct info of call's result, or an
	// error naming the operator and the offending arguments.
	InferStructInfo(call *RCall) (StructInfo, error)
}

var opRegistry = struct {
	sync.RWMutex
	m map[string]OpDef
}{m: map[string]OpDef{}}

// RegisterOp adds def to the registry; a second definition of one name is
// an error.
func RegisterOp(def OpDef) error {
	opRegistry.Lock()
	defer opRegistry.Unlock()
	name := def.OpName()
	if _, dup := opRegistry.m[name]; dup {
		return fmt.Errorf("register operator %q: already registered", name)
	}
	opRegistry.m[name] = def
	return nil
}

// LookupOp returns the operator called name.
func LookupOp(name string) (OpDef, bool) {
	opRegistry.RLock()
	defer opRegistry.RUnlock()
	d, ok := opRegistry.m[name]
	return d, ok
}

// OpNames returns the registered operator names, sorted.
func OpNames() []string {
	opRegistry.RLock()
	defer opRegistry.RUnlock()
	names := make([]string, 0, len(opRegistry.m))
	for n := range opRegistry.m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// InferCall returns the struct info of c by its callee: a registered
// operator's inference, the result of a function of mod (which may be
// nil) or of a function-typed variable, or Object when nothing is known.
func InferCall(c *RCall, mod *IRModule) (StructInfo, error) {
	switch op := c.Op.(type) {
	case *Op:
		switch op.Name {
		case OpCallTIR:
			return inferCallTIR(c, mod)
		case OpCallPacked:
			if len(c.Args) == 0 {
				return nil, fmt.Errorf("call_packed: no function to call")
			}
			if len(c.SInfoArgs) != 1 {
				return nil, fmt.Errorf("call_packed: want one sinfo_args, got %d", len(c.SInfoArgs))
			}
			return c.SInfoArgs[0], nil
		}
		def, ok := LookupOp(op.Name)
		if !ok {
			return nil, fmt.Errorf("unknown operator %q", op.Name)
		}
		return def.InferStructInfo(c)
	case *GlobalVar:
		if mod == nil {
			break
		}
		f, ok := mod.Lookup(op.Name)
		if !ok {
			return nil, fmt.Errorf("call of %q: no such function in the module", op.Name)
		}
		switch f := f.(type) {
		case *Function:
			if len(c.Args) != len(f.Params) {
				return nil, fmt.Errorf("call of %q: %d arguments, the function takes %d", op.Name, len(c.Args), len(f.Params))
			}
			for i, a := range c.Args {
				if msg := Conflict(f.Params[i].Info, StructInfoOf(a)); msg != "" {
					return nil, fmt.Errorf("call of %q: argument %d (%s): %s", op.Name, i, f.Params[i].Name, msg)
				}
			}
			return f.Ret, nil
		case *PrimFunc:
			return PrimFuncResult(f), nil
		}
	case *RVar:
		if fs, ok := op.Info.(*FuncStructInfo); ok && fs.Ret != nil {
			return fs.Ret, nil
		}
	}
	if len(c.SInfoArgs) == 1 {
		return c.SInfoArgs[0], nil
	}
	return Object(), nil
}

// PrimFuncResult is the struct info of calling f directly from a graph
// function: the empty tuple when f returns nothing, else a scalar.
func PrimFuncResult(f *PrimFunc) StructInfo {
	if IsVoid(f.RetType) {
		return VoidInfo()
	}
	return &PrimStructInfo{DType: f.RetType}
}

// IsPureCall reports whether c is known to have no side effects: a pure
// operator (call_tir is pure) or a call of a pure function of mod. Calls
// of PrimFuncs (other than through call_tir), of packed functions and of
// functions mod does not resolve are not.
func IsPureCall(c *RCall, mod *IRModule) bool {
	pure, known := callPurity(c, mod)
	return pure && known
}

// callPurity reports whether c is pure, and whether that is known.
func callPurity(c *RCall, mod *IRModule) (pure, known bool) {
	switch op := c.Op.(type) {
	case *Op:
		switch op.Name {
		case OpCallTIR:
			return true, true
		case OpCallPacked:
			return false, true
		}
		def, ok := LookupOp(op.Name)
		return ok && def.IsPure(), ok
	case *GlobalVar:
		if mod == nil {
			return false, false
		}
		f, _ := mod.Lookup(op.Name)
		fn, ok := f.(*Function)
		return ok && fn.Pure, true
	case *RVar:
		fs, ok := op.Info.(*FuncStructInfo)
		return ok && fs.Pure, ok
	case *ExternFunc:
		return false, true
	}
	return false, false
}

func inferCallTIR(c *RCall, mod *IRModule) (StructInfo, error) {
	if len(c.Args) < 2 || len(c.Args) > 3 {
		return nil, fmt.Errorf("call_tir: want a function and a tuple of arguments, got %d arguments", len(c.Args))
	}
	gv, ok := c.Args[0].(*GlobalVar)
	if !ok {
		return nil, fmt.Errorf("call_tir: the callee is a %T, want a function of the module", c.Args[0])
	}
	if _, ok := c.Args[1].(*RTuple); !ok {
		if _, ok := StructInfoOf(c.Args[1]).(*TupleStructInfo); !ok {
			return nil, fmt.Errorf("call_tir of %q: the arguments are not a tuple", gv.Name)
		}
	}
	if len(c.SInfoArgs) != 1 {
		return nil, fmt.Errorf("call_tir of %q: want one out_sinfo, got %d", gv.Name, len(c.SInfoArgs))
	}
	out := c.SInfoArgs[0]
	outs := []StructInfo{out}
	if t, ok := out.(*TupleStructInfo); ok {
		outs = t.Fields
	}
	for _, o := range outs {
		if _, ok := o.(*TensorStructInfo); !ok {
			return nil, fmt.Errorf("call_tir of %q: out_sinfo %s is not a tensor or a tuple of tensors", gv.Name, out)
		}
	}
	if mod != nil {
		f, ok := mod.Lookup(gv.Name)
		if !ok {
			return nil, fmt.Errorf("call_tir of %q: no such function in the module", gv.Name)
		}
		if pf, ok := f.(*PrimFunc); ok {
			nargs := 0
			if t, ok := StructInfoOf(c.Args[1]).(*TupleStructInfo); ok {
				nargs = len(t.Fields)
			}
			if want := len(pf.Params); len(c.Args) == 2 && nargs+len(outs) != want {
				return nil, fmt.Errorf("call_tir of %q: %d inputs and %d outputs, the PrimFunc takes %d parameters", gv.Name, nargs, len(outs), want)
			}
		}
	}
	return out, nil
}
