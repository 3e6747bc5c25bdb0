package nn

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
)

// Tensor is a graph value produced while tracing Forward: a function
// input, a parameter or the result of an operator.
type Tensor struct {
	v *ir.RVar
}

// Var is the graph variable holding the tensor.
func (t *Tensor) Var() *ir.RVar { return t.v }

// Info is the tensor's struct info.
func (t *Tensor) Info() ir.StructInfo { return t.v.Info }

// Shape returns the tensor's dimensions when they are all known
// constants.
func (t *Tensor) Shape() ([]int64, bool) {
	ts, ok := t.v.Info.(*ir.TensorStructInfo)
	if !ok {
		return nil, false
	}
	return ts.KnownShape()
}

// DType is the tensor's element type (Void when unknown).
func (t *Tensor) DType() ir.DType {
	if ts, ok := t.v.Info.(*ir.TensorStructInfo); ok {
		return ts.DType
	}
	return ir.Void
}

// Builder records the operator calls of one traced function as bindings
// of a dataflow block. Forward methods call Emit (or the helpers built on
// it) and Param; Export creates the builder.
type Builder struct {
	bindings []ir.Binding
	next     map[string]int
	used     map[string]bool
	params   map[*Parameter]*Tensor
}

func newBuilder() *Builder {
	return &Builder{next: map[string]int{}, used: map[string]bool{}, params: map[*Parameter]*Tensor{}}
}

// name returns base, or base1, base2… when base is taken, as TVM names
// the variables of a traced function.
func (b *Builder) name(base string) string {
	for {
		n := b.next[base]
		b.next[base] = n + 1
		cand := base
		if n > 0 {
			cand += strconv.Itoa(n)
		}
		if !b.used[cand] {
			b.used[cand] = true
			return cand
		}
	}
}

// Param returns the graph value of a parameter of the model being
// exported; a parameter that is not part of the model is an error.
func (b *Builder) Param(p *Parameter) (*Tensor, error) {
	t, ok := b.params[p]
	if !ok {
		return nil, fmt.Errorf("parameter of shape %v is not registered by any module of the model", p.shape)
	}
	return t, nil
}

// Emit binds a call of the operator opName ("relax.matmul") with args
// (each a *Tensor or an ir.RExpr) and attrs to a fresh variable named
// after the operator, and returns it. Shape errors come from the
// operator's inference.
func (b *Builder) Emit(opName string, attrs map[string]any, args ...any) (*Tensor, error) {
	exprs := make([]ir.RExpr, len(args))
	for i, a := range args {
		switch a := a.(type) {
		case *Tensor:
			exprs[i] = a.v
		case ir.RExpr:
			exprs[i] = a
		default:
			return nil, fmt.Errorf("emit %s: argument %d is a %T, want a *Tensor or an ir.RExpr", opName, i, a)
		}
	}
	call, err := op.Call(opName, exprs, attrs)
	if err != nil {
		return nil, fmt.Errorf("emit %s: %w", opName, err)
	}
	base := strings.TrimPrefix(opName, "relax.")
	if i := strings.LastIndexByte(base, '.'); i >= 0 {
		base = base[i+1:]
	}
	v := ir.NewDataflowVar(b.name(base), call.Info)
	b.bindings = append(b.bindings, &ir.VarBinding{Var: v, Value: call})
	return &Tensor{v: v}, nil
}

// Tuple returns a tuple expression of ts, for operators that take one
// (R.concat).
func Tuple(ts ...*Tensor) ir.RExpr {
	fs := make([]ir.RExpr, len(ts))
	for i, t := range ts {
		fs[i] = t.v
	}
	return &ir.RTuple{Fields: fs}
}

// ShapeOf returns a shape argument (R.shape([...])) of constant dims.
func ShapeOf(dims ...int64) ir.RExpr {
	return &ir.ShapeExpr{Values: ir.Dims(dims...)}
}

// Add emits R.add(x, y).
func (b *Builder) Add(x, y *Tensor) (*Tensor, error) { return b.Emit("relax.add", nil, x, y) }

// Matmul emits R.matmul(x, y) with the result's dtype inferred
// (out_dtype="void").
func (b *Builder) Matmul(x, y *Tensor) (*Tensor, error) { return b.Emit("relax.matmul", nil, x, y) }

// PermuteDims emits R.permute_dims(x, axes); nil axes reverse them.
func (b *Builder) PermuteDims(x *Tensor, axes []int64) (*Tensor, error) {
	var a any
	if axes != nil {
		a = ints(axes)
	}
	return b.Emit("relax.permute_dims", map[string]any{"axes": a}, x)
}

// Reshape emits R.reshape(x, R.shape(dims)); one dim may be -1.
func (b *Builder) Reshape(x *Tensor, dims ...int64) (*Tensor, error) {
	return b.Emit("relax.reshape", nil, x, ShapeOf(dims...))
}

// ReLU emits R.nn.relu(x).
func (b *Builder) ReLU(x *Tensor) (*Tensor, error) { return b.Emit("relax.nn.relu", nil, x) }

func ints(xs []int64) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}
