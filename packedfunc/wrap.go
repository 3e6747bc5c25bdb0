package packedfunc

import (
	"fmt"
	"reflect"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
)

var (
	typeValue   = reflect.TypeFor[Value]()
	typeError   = reflect.TypeFor[error]()
	typeArray   = reflect.TypeFor[*ndarray.NDArray]()
	typeDevice  = reflect.TypeFor[devices.Device]()
	typeDType   = reflect.TypeFor[ndarray.DType]()
	typeShape   = reflect.TypeFor[ndarray.Shape]()
	typeFunc    = reflect.TypeFor[*Func]()
	typeModule  = reflect.TypeFor[Module]()
	typeBytes   = reflect.TypeFor[[]byte]()
	typeValues  = reflect.TypeFor[[]Value]()
	typeStringT = reflect.TypeFor[string]()
)

type converter struct {
	from func(Value) (reflect.Value, error) // Value -> Go
	to   func(reflect.Value) Value          // Go -> Value
}

func converterFor(t reflect.Type) (converter, bool) {
	switch t {
	case typeValue:
		return converter{
			func(v Value) (reflect.Value, error) { return reflect.ValueOf(v), nil },
			func(r reflect.Value) Value { return r.Interface().(Value) }}, true
	case typeArray:
		return converter{
			func(v Value) (reflect.Value, error) { a, err := v.AsArray(); return reflect.ValueOf(a), err },
			func(r reflect.Value) Value { return Array(r.Interface().(*ndarray.NDArray)) }}, true
	case typeDevice:
		return converter{
			func(v Value) (reflect.Value, error) { d, err := v.AsDevice(); return reflect.ValueOf(d), err },
			func(r reflect.Value) Value { return DeviceValue(r.Interface().(devices.Device)) }}, true
	case typeDType:
		return converter{
			func(v Value) (reflect.Value, error) { d, err := v.AsDType(); return reflect.ValueOf(d), err },
			func(r reflect.Value) Value { return DTypeValue(r.Interface().(ndarray.DType)) }}, true
	case typeShape:
		return converter{
			func(v Value) (reflect.Value, error) { s, err := v.AsShape(); return reflect.ValueOf(s), err },
			func(r reflect.Value) Value { return ShapeValue(r.Interface().(ndarray.Shape)) }}, true
	case typeFunc:
		return converter{
			func(v Value) (reflect.Value, error) { f, err := v.AsFunc(); return reflect.ValueOf(f), err },
			func(r reflect.Value) Value { return FuncValue(r.Interface().(*Func)) }}, true
	case typeModule:
		return converter{
			func(v Value) (reflect.Value, error) {
				m, err := v.AsModule()
				rv := reflect.New(typeModule).Elem()
				if m != nil {
					rv.Set(reflect.ValueOf(m))
				}
				return rv, err
			},
			func(r reflect.Value) Value {
				if r.IsNil() {
					return Nil
				}
				return ModuleValue(r.Interface().(Module))
			}}, true
	case typeBytes:
		return converter{
			func(v Value) (reflect.Value, error) { b, err := v.AsBytes(); return reflect.ValueOf(b), err },
			func(r reflect.Value) Value { return Bytes(r.Bytes()) }}, true
	}
	switch t.Kind() {
	case reflect.Bool:
		return converter{
			func(v Value) (reflect.Value, error) {
				n, err := v.AsInt()
				return reflect.ValueOf(n != 0).Convert(t), err
			},
			func(r reflect.Value) Value {
				if r.Bool() {
					return Int(1)
				}
				return Int(0)
			}}, true
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return converter{
			func(v Value) (reflect.Value, error) {
				n, err := v.AsInt()
				if err != nil {
					return reflect.Value{}, err
				}
				rv := reflect.New(t).Elem()
				if rv.OverflowInt(n) {
					return reflect.Value{}, fmt.Errorf("%w: %d overflows %s", ErrType, n, t)
				}
				rv.SetInt(n)
				return rv, nil
			},
			func(r reflect.Value) Value { return Int(r.Int()) }}, true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return converter{
			func(v Value) (reflect.Value, error) {
				n, err := v.AsInt()
				if err != nil {
					return reflect.Value{}, err
				}
				rv := reflect.New(t).Elem()
				if n < 0 || rv.OverflowUint(uint64(n)) {
					return reflect.Value{}, fmt.Errorf("%w: %d does not fit %s", ErrType, n, t)
				}
				rv.SetUint(uint64(n))
				return rv, nil
			},
			func(r reflect.Value) Value { return Int(int64(r.Uint())) }}, true
	case reflect.Float32, reflect.Float64:
		return converter{
			func(v Value) (reflect.Value, error) {
				f, err := v.AsFloat()
				return reflect.ValueOf(f).Convert(t), err
			},
			func(r reflect.Value) Value { return Float(r.Float()) }}, true
	case reflect.String:
		return converter{
			func(v Value) (reflect.Value, error) {
				s, err := v.AsString()
				return reflect.ValueOf(s).Convert(t), err
			},
			func(r reflect.Value) Value { return String(r.Convert(typeStringT).Interface().(string)) }}, true
	}
	return converter{}, false
}

// Wrap turns a typed Go function into a Func whose calls check the number
// and kinds of their arguments. Parameters and the result may be Value,
// bool, integers, floats, string, []byte, *ndarray.NDArray, devices.Device,
// ndarray.DType, ndarray.Shape, *Func or Module; a final ...Value parameter
// takes the remaining arguments. The function may return nothing, a
// result, an error, or a result and an error.
func Wrap(name string, fn any) (*Func, error) {
	rv := reflect.ValueOf(fn)
	t := rv.Type()
	if t.Kind() != reflect.Func {
		return nil, fmt.Errorf("wrap %q: %T is not a function", name, fn)
	}
	nin := t.NumIn()
	variadic := t.IsVariadic()
	if variadic {
		if t.In(nin-1) != typeValues {
			return nil, fmt.Errorf("wrap %q: a variadic parameter must be ...Value", name)
		}
		nin--
	}
	ins := make([]converter, nin)
	for i := range nin {
		c, ok := converterFor(t.In(i))
		if !ok {
			return nil, fmt.Errorf("wrap %q: parameter %d has unsupported type %s", name, i, t.In(i))
		}
		ins[i] = c
	}
	var out *converter
	hasErr := false
	switch t.NumOut() {
	case 0:
	case 1:
		if t.Out(0) == typeError {
			hasErr = true
		} else {
			c, ok := converterFor(t.Out(0))
			if !ok {
				return nil, fmt.Errorf("wrap %q: unsupported result type %s", name, t.Out(0))
			}
			out = &c
		}
	case 2:
		if t.Out(1) != typeError {
			return nil, fmt.Errorf("wrap %q: second result must be error", name)
		}
		c, ok := converterFor(t.Out(0))
		if !ok {
			return nil, fmt.Errorf("wrap %q: unsupported result type %s", name, t.Out(0))
		}
		out, hasErr = &c, true
	default:
		return nil, fmt.Errorf("wrap %q: at most two results", name)
	}
	impl := func(args []Value) (Value, error) {
		if len(args) < nin || (!variadic && len(args) != nin) {
			want := fmt.Sprint(nin)
			if variadic {
				want = "at least " + want
			}
			return Nil, fmt.Errorf("%s: %w: want %s, got %d", name, ErrArity, want, len(args))
		}
		in := make([]reflect.Value, nin, len(args))
		for i, c := range ins {
			v, err := c.from(args[i])
			if err != nil {
				return Nil, fmt.Errorf("%s: argument %d: %w", name, i, err)
			}
			in[i] = v
		}
		for _, a := range args[nin:] {
			in = append(in, reflect.ValueOf(a))
		}
		res := rv.Call(in)
		if hasErr {
			if e := res[len(res)-1]; !e.IsNil() {
				return Nil, e.Interface().(error)
			}
		}
		if out == nil {
			return Nil, nil
		}
		return out.to(res[0]), nil
	}
	return New(name, impl), nil
}
