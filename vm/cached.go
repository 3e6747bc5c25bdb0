package vm

import (
	"fmt"

	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// BuiltinCallCached is vm.builtin.call_cached(name string, args...): it
// calls the VM function name on args the first time and returns the same
// result afterwards while every argument is the same NDArray (by
// identity) as on that call. The code generator emits it for the
// functions LiftTransformParams makes out of weight transforms (a
// transposed weight, a packed layout), which then run once per set of
// weights instead of once per call, as TVM's transform_params.
//
// Contract: the arguments are treated as constant while the same arrays
// are passed. A caller that writes new data into an array it passed
// before must call VM.ClearCache (or set Options.NoCallCache). A call with
// an argument that is not an NDArray is never cached. The cached result's
// storage is pinned: VM.Recycle leaves it alone.
const BuiltinCallCached = "vm.builtin.call_cached"

// callCache is one call_cached instruction's memory: the arguments it
// was computed from and the result.
type callCache struct {
	keys  []*ndarray.NDArray
	value Value
	valid bool
}

// hit reports whether args are the arrays the cache was computed from.
func (c *callCache) hit(args []Value) bool {
	if !c.valid || len(args) != len(c.keys) {
		return false
	}
	for i := range args {
		a, ok := args[i].v.AsArray()
		if ok != nil || args[i].tup != nil || a != c.keys[i] {
			return false
		}
	}
	return true
}

// arrayKeys are the arrays args hold; ok is false when one is not an
// NDArray (no caching then).
func arrayKeys(args []Value) (keys []*ndarray.NDArray, ok bool) {
	keys = make([]*ndarray.NDArray, len(args))
	for i := range args {
		a, err := args[i].v.AsArray()
		if err != nil || a == nil || args[i].tup != nil {
			return nil, false
		}
		keys[i] = a
	}
	return keys, true
}

// set remembers value as computed from the arrays keys and pins it.
func (c *callCache) set(keys []*ndarray.NDArray, value Value) {
	c.keys, c.value, c.valid = keys, value, true
	pin(value)
}

// pin marks the storage reachable from v as escaped (the invocation does
// not give it back) and pinned (Recycle does not either).
func pin(v Value) {
	if v.st != nil {
		v.st.escaped, v.st.pinned = true, true
	}
	if v.tup != nil {
		for _, f := range v.tup.fields {
			pin(f)
		}
	}
}

// ClearCache forgets every vm.builtin.call_cached result: the next call
// recomputes it. Use it after writing new data into weight arrays that
// were passed before.
func (m *VM) ClearCache() {
	for i := range m.funcs {
		for j := range m.funcs[i].code {
			if c := m.funcs[i].code[j].cache; c != nil {
				*c = callCache{}
			}
		}
	}
}

// biCallCached is call_cached when its callee could not be linked (the
// first operand is not a constant string naming a VM function).
func biCallCached(m *VM, args []Value) (Value, error) {
	s, err := args[0].v.AsString()
	if err != nil || args[0].tup != nil {
		return Value{}, fmt.Errorf("call_cached: callee: %w: want a constant string naming a VM function, got %s", packedfunc.ErrType, args[0].kindName())
	}
	return Value{}, fmt.Errorf("call_cached: callee %q: %w", s, ErrNoFunction)
}

// linkCached turns a call_cached whose callee is a constant naming a VM
// function into lopCached.
func (m *VM) linkCached(li *linkedInstr) {
	if len(li.args) == 0 || li.args[0].Kind != ArgConst {
		return
	}
	s, err := m.consts[li.args[0].Value].v.AsString()
	if err != nil {
		return
	}
	fi, ok := m.byName[s]
	if !ok || len(m.exec.Functions[fi].Params) != len(li.args)-1 {
		return
	}
	li.op, li.callee, li.cache = lopCached, int32(fi), &callCache{}
}
