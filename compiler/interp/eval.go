package interp

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Env supplies what an expression reads: variables and buffer elements.
type Env interface {
	// Var returns the value bound to v.
	Var(v *ir.Var) (Value, bool)
	// Load returns the element of b at indices (one per dimension of b);
	// the result has b's dtype.
	Load(b *ir.Buffer, indices []int64) (Value, error)
}

// Vars is an Env that binds variables only; loads fail.
type Vars map[*ir.Var]Value

// Var returns the value bound to v.
func (m Vars) Var(v *ir.Var) (Value, bool) {
	x, ok := m[v]
	return x, ok
}

// Load fails: Vars holds no buffers.
func (m Vars) Load(b *ir.Buffer, _ []int64) (Value, error) {
	return Value{}, fmt.Errorf("load from %q: no buffers in this environment", b.Name)
}

// ErrUnbound reports a variable read without a value.
var ErrUnbound = errors.New("unbound variable")

// Eval evaluates e in env. It fails (never panics) on unbound variables,
// integer division by zero, failed loads and unsupported calls.
func Eval(e ir.Expr, env Env) (Value, error) {
	ev := evaluator{env: env}
	return ev.eval(e)
}

// EvalInt evaluates a scalar integer expression (an index, an extent).
func EvalInt(e ir.Expr, env Env) (int64, error) {
	v, err := Eval(e, env)
	if err != nil {
		return 0, err
	}
	if v.Lanes() != 1 || v.IsFloat() {
		return 0, fmt.Errorf("evaluate %s: want a scalar integer, got %s", e, v.Type)
	}
	return v.AsInt(), nil
}

// evaluator evaluates expressions; lets holds Let bindings in scope, which
// shadow env.
type evaluator struct {
	env  Env
	lets map[*ir.Var]Value
}

func (ev *evaluator) eval(e ir.Expr) (Value, error) {
	switch e := e.(type) {
	case nil:
		return Value{}, errors.New("evaluate a nil expression")
	case *ir.IntImm:
		return Int(e.Type, e.Value), nil
	case *ir.FloatImm:
		return Float(e.Type, e.Value), nil
	case *ir.Var:
		if v, ok := ev.lets[e]; ok {
			return v, nil
		}
		if v, ok := ev.env.Var(e); ok {
			return v, nil
		}
		return Value{}, fmt.Errorf("%w %q", ErrUnbound, e.Name)
	case *ir.Binary:
		a, err := ev.eval(e.A)
		if err != nil {
			return Value{}, err
		}
		b, err := ev.eval(e.B)
		if err != nil {
			return Value{}, err
		}
		return Binary(e.Op, a, b)
	case *ir.Not:
		a, err := ev.eval(e.A)
		if err != nil {
			return Value{}, err
		}
		out := make([]uint64, a.Lanes())
		for i := range out {
			out[i] = b2u(!a.Lane(i).AsBool())
		}
		return fromLanes(ir.Bool, out), nil
	case *ir.Cast:
		v, err := ev.eval(e.Value)
		if err != nil {
			return Value{}, err
		}
		return Cast(e.Type, v)
	case *ir.Select:
		c, err := ev.eval(e.Cond)
		if err != nil {
			return Value{}, err
		}
		t, err := ev.eval(e.True)
		if err != nil {
			return Value{}, err
		}
		f, err := ev.eval(e.False)
		if err != nil {
			return Value{}, err
		}
		return selectLanes(c, t, f)
	case *ir.Let:
		v, err := ev.eval(e.Value)
		if err != nil {
			return Value{}, err
		}
		old, had := ev.lets[e.Var]
		if ev.lets == nil {
			ev.lets = map[*ir.Var]Value{}
		}
		ev.lets[e.Var] = v
		r, err := ev.eval(e.Body)
		if had {
			ev.lets[e.Var] = old
		} else {
			delete(ev.lets, e.Var)
		}
		return r, err
	case *ir.Ramp:
		base, err := ev.eval(e.Base)
		if err != nil {
			return Value{}, err
		}
		stride, err := ev.eval(e.Stride)
		if err != nil {
			return Value{}, err
		}
		if base.Lanes() != 1 || stride.Lanes() != 1 || e.Lanes < 1 {
			return Value{}, fmt.Errorf("evaluate %s: ramp needs scalar base and stride and lanes >= 1", e)
		}
		stride, err = Cast(base.Type, stride)
		if err != nil {
			return Value{}, err
		}
		out := make([]uint64, e.Lanes)
		cur := base
		for i := range out {
			out[i] = cur.bits
			if i+1 < len(out) {
				if cur, err = Binary(ir.OpAdd, cur, stride); err != nil {
					return Value{}, err
				}
			}
		}
		return fromLanes(base.Type, out), nil
	case *ir.Broadcast:
		v, err := ev.eval(e.Value)
		if err != nil {
			return Value{}, err
		}
		if v.Lanes() != 1 {
			return Value{}, fmt.Errorf("evaluate %s: broadcast of a vector", e)
		}
		return Broadcast(v, e.Lanes), nil
	case *ir.BufferLoad:
		return ev.load(e)
	case *ir.Call:
		return ev.call(e)
	case *ir.StringImm:
		return Value{}, fmt.Errorf("evaluate %s: a string has no value", e)
	}
	return Value{}, fmt.Errorf("evaluate %T: unknown expression", e)
}

// Binary applies op to a and b. A scalar operand meets a vector one as a
// broadcast; operands of different dtypes are an error.
func Binary(op ir.BinaryOp, a, b Value) (Value, error) {
	if a.Type.Scalar() != b.Type.Scalar() {
		return Value{}, fmt.Errorf("%s of %s and %s: operand dtypes differ", op, a.Type, b.Type)
	}
	n, err := laneCount(a, b)
	if err != nil {
		return Value{}, fmt.Errorf("%s: %w", op, err)
	}
	t := a.Type.Scalar()
	rt := t
	if op.IsCompare() || op.IsLogical() {
		rt = ir.Bool
	}
	if n == 1 {
		r, err := binaryLane(op, t, a.bits, b.bits)
		if err != nil {
			return Value{}, err
		}
		return Value{Type: rt, bits: r}, nil
	}
	out := make([]uint64, n)
	for i := range out {
		r, err := binaryLane(op, t, lane(a, i), lane(b, i))
		if err != nil {
			return Value{}, err
		}
		out[i] = r
	}
	return fromLanes(rt, out), nil
}

// lane returns lane i of v, or its only lane when v is a scalar.
func lane(v Value, i int) uint64 {
	if v.lanes == nil {
		return v.bits
	}
	return v.lanes[i]
}

// laneCount is the lane count two operands meet at.
func laneCount(vs ...Value) (int, error) {
	n := 1
	for _, v := range vs {
		switch l := v.Lanes(); {
		case l == 1:
		case n == 1:
			n = l
		case n != l:
			return 0, fmt.Errorf("lane counts %d and %d differ", n, l)
		}
	}
	return n, nil
}

// Cast converts v to t with C semantics (see the package doc). A scalar is
// broadcast when t has more lanes.
func Cast(t ir.DType, v Value) (Value, error) {
	if t.Code == ir.Handle.Code || v.Type.Code == ir.Handle.Code {
		return Value{}, fmt.Errorf("cast %s to %s: handles have no value", v.Type, t)
	}
	n := int(max(t.Lanes, 1))
	if v.Lanes() != 1 && v.Lanes() != n {
		return Value{}, fmt.Errorf("cast %s to %s: lane counts differ", v.Type, t)
	}
	if n == 1 {
		return Value{Type: t.Scalar(), bits: castLane(t, v.Type, v.bits)}, nil
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = castLane(t, v.Type, lane(v, i))
	}
	return fromLanes(t, out), nil
}

func selectLanes(c, t, f Value) (Value, error) {
	if t.Type.Scalar() != f.Type.Scalar() {
		return Value{}, fmt.Errorf("select of %s and %s: dtypes differ", t.Type, f.Type)
	}
	n, err := laneCount(c, t, f)
	if err != nil {
		return Value{}, fmt.Errorf("select: %w", err)
	}
	if n == 1 {
		if c.AsBool() {
			return t, nil
		}
		return f, nil
	}
	out := make([]uint64, n)
	for i := range out {
		if (Value{Type: c.Type.Scalar(), bits: lane(c, i)}).AsBool() {
			out[i] = lane(t, i)
		} else {
			out[i] = lane(f, i)
		}
	}
	return fromLanes(t.Type, out), nil
}

// load evaluates a BufferLoad; vector indices (Ramp) load lane by lane.
func (ev *evaluator) load(e *ir.BufferLoad) (Value, error) {
	var idxBuf [6]Value
	var flatBuf [6]int64
	idx := idxBuf[:0]
	for i, ix := range e.Indices {
		v, err := ev.eval(ix)
		if err != nil {
			return Value{}, err
		}
		if v.IsFloat() {
			return Value{}, fmt.Errorf("load from %q: index %d is a float (%s)", e.Buffer.Name, i, v.Type)
		}
		idx = append(idx, v)
	}
	n, err := laneCount(idx...)
	if err != nil {
		return Value{}, fmt.Errorf("load from %q: %w", e.Buffer.Name, err)
	}
	var flat []int64
	if len(idx) <= len(flatBuf) {
		flat = flatBuf[:len(idx)]
	} else {
		flat = make([]int64, len(idx))
	}
	if n == 1 {
		for i, v := range idx {
			flat[i] = v.AsInt()
		}
		return ev.loadOne(e.Buffer, flat)
	}
	lanes := make([]Value, n)
	for l := range lanes {
		for i, v := range idx {
			flat[i] = int64(lane(v, l))
		}
		x, err := ev.loadOne(e.Buffer, flat)
		if err != nil {
			return Value{}, err
		}
		lanes[l] = x
	}
	return Vector(lanes...)
}

// loadOne loads one element, calling the interpreter's memory directly
// when it is the environment.
func (ev *evaluator) loadOne(b *ir.Buffer, idx []int64) (Value, error) {
	if m, ok := ev.env.(*machine); ok {
		return m.Load(b, idx)
	}
	return ev.env.Load(b, slices.Clone(idx))
}

func (ev *evaluator) call(e *ir.Call) (Value, error) {
	switch e.Op {
	case ir.OpIfThenElse:
		if len(e.Args) != 3 {
			return Value{}, fmt.Errorf("evaluate %s: if_then_else takes 3 arguments", e)
		}
		c, err := ev.eval(e.Args[0])
		if err != nil {
			return Value{}, err
		}
		if c.Lanes() != 1 {
			// A vector condition needs both sides, lane by lane.
			t, err := ev.eval(e.Args[1])
			if err != nil {
				return Value{}, err
			}
			f, err := ev.eval(e.Args[2])
			if err != nil {
				return Value{}, err
			}
			return selectLanes(c, t, f)
		}
		if c.AsBool() {
			return ev.eval(e.Args[1])
		}
		return ev.eval(e.Args[2])
	case ir.OpCallExtern:
		return Value{}, fmt.Errorf("evaluate %s: external calls are not supported by the interpreter", e)
	case ir.OpWarpShuffleDown:
		if len(e.Args) != 5 {
			return Value{}, fmt.Errorf("evaluate %s: tvm_warp_shuffle_down takes 5 arguments", e)
		}
		m, ok := ev.env.(*machine)
		if !ok {
			return Value{}, fmt.Errorf("evaluate %s: a warp shuffle outside a function run", e)
		}
		args := make([]Value, 5)
		for i, a := range e.Args {
			v, err := ev.eval(a)
			if err != nil {
				return Value{}, err
			}
			if i != 1 && (v.Lanes() != 1 || v.IsFloat()) {
				return Value{}, fmt.Errorf("evaluate %s: argument %d is not an integer", e, i)
			}
			args[i] = v
		}
		return m.shuffle(e, args[1], args[2].AsInt(), args[3].AsInt(), args[4].AsInt())
	case ir.OpPtxMma:
		m, ok := ev.env.(*machine)
		if !ok {
			return Value{}, fmt.Errorf("evaluate %s: a ptx_mma outside a function run", e)
		}
		return Value{}, m.mma(e)
	}
	in, ok := ir.Intrinsics[e.Op]
	if !ok {
		return Value{}, fmt.Errorf("evaluate %s: unknown call %q", e, e.Op)
	}
	if len(e.Args) != in.Arity {
		return Value{}, fmt.Errorf("evaluate %s: %q takes %d arguments, got %d", e, e.Op, in.Arity, len(e.Args))
	}
	args := make([]Value, len(e.Args))
	for i, a := range e.Args {
		v, err := ev.eval(a)
		if err != nil {
			return Value{}, err
		}
		if args[i], err = Cast(e.Type.Scalar().WithLanes(v.Lanes()), v); err != nil {
			return Value{}, err
		}
	}
	n, err := laneCount(args...)
	if err != nil {
		return Value{}, fmt.Errorf("evaluate %s: %w", e, err)
	}
	t := e.Type.Scalar()
	out := make([]uint64, n)
	in64 := make([]uint64, len(args))
	for l := range out {
		for i, a := range args {
			in64[i] = lane(a, l)
		}
		r, err := intrinsicLane(e.Op, t, in64)
		if err != nil {
			return Value{}, err
		}
		out[l] = r
	}
	return fromLanes(t, out), nil
}
