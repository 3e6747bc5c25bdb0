package vm

import (
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// Value is what a register holds and what a VM function returns: a
// packedfunc.Value (NDArray, int, float, string, shape, dtype…), a tuple of
// Values, or a storage block made by vm.builtin.alloc_storage. The zero
// Value is nil.
type Value struct {
	v   packedfunc.Value
	tup *tuple
	st  *storage // the storage itself (v nil, tup nil) or the one a tensor lives in
}

type tuple struct{ fields []Value }

// ValueOf wraps a packedfunc.Value.
func ValueOf(v packedfunc.Value) Value { return Value{v: v} }

// ArrayValue wraps an NDArray.
func ArrayValue(a *ndarray.NDArray) Value { return Value{v: packedfunc.Array(a)} }

// TupleOf makes a tuple.
func TupleOf(fields ...Value) Value {
	return Value{tup: &tuple{fields: append([]Value{}, fields...)}}
}

// IsTuple reports a tuple.
func (v Value) IsTuple() bool { return v.tup != nil }

// IsStorage reports a storage block.
func (v Value) IsStorage() bool { return v.st != nil && v.tup == nil && v.v.IsNil() }

// IsNil reports the nil Value.
func (v Value) IsNil() bool { return v.tup == nil && v.st == nil && v.v.IsNil() }

// Fields are a tuple's fields (nil for other values); callers must not
// modify them.
func (v Value) Fields() []Value {
	if v.tup == nil {
		return nil
	}
	return v.tup.fields
}

// Packed is the value as a packedfunc.Value (a tuple as a packedfunc
// tuple of its fields); a storage block has none and gives an error.
func (v Value) Packed() (packedfunc.Value, error) {
	switch {
	case v.tup != nil:
		fields := make([]packedfunc.Value, len(v.tup.fields))
		for i, f := range v.tup.fields {
			p, err := f.Packed()
			if err != nil {
				return packedfunc.Nil, fmt.Errorf("tuple field %d: %w", i, err)
			}
			fields[i] = p
		}
		return packedfunc.Tuple(fields...), nil
	case v.IsStorage():
		return packedfunc.Nil, fmt.Errorf("%w: want a plain value, got a storage block", packedfunc.ErrType)
	}
	return v.v, nil
}

// Array returns the NDArray the value holds.
func (v Value) Array() (*ndarray.NDArray, error) {
	if v.tup != nil || v.IsStorage() {
		return nil, fmt.Errorf("%w: want ndarray, got %s", packedfunc.ErrType, v.kindName())
	}
	return v.v.AsArray()
}

// Arrays flattens the value into its NDArrays in order: an NDArray gives
// itself, a tuple its fields' arrays; anything else is an error.
func (v Value) Arrays() ([]*ndarray.NDArray, error) {
	var out []*ndarray.NDArray
	var walk func(Value) error
	walk = func(x Value) error {
		if x.tup != nil {
			for _, f := range x.tup.fields {
				if err := walk(f); err != nil {
					return err
				}
			}
			return nil
		}
		a, err := x.Array()
		if err != nil {
			return err
		}
		out = append(out, a)
		return nil
	}
	return out, walk(v)
}

func (v Value) kindName() string {
	switch {
	case v.tup != nil:
		return "tuple"
	case v.IsStorage():
		return "storage"
	}
	return v.v.Kind().String()
}

// String formats the value for messages.
func (v Value) String() string {
	switch {
	case v.tup != nil:
		parts := make([]string, len(v.tup.fields))
		for i, f := range v.tup.fields {
			parts[i] = f.String()
		}
		if len(parts) == 1 {
			return "(" + parts[0] + ",)"
		}
		return "(" + strings.Join(parts, ", ") + ")"
	case v.IsStorage():
		return v.st.String()
	}
	return v.v.String()
}
