// Package packedfunc owns kiln's calling convention: Value (a tagged union
// of everything a function can take or return), Func (a function over
// Values), the Module interface (a bag of Funcs with imports) and the
// process-wide registry of global functions.
//
// packedfunc imports ndarray and devices and nothing else from kiln.
package packedfunc

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
)

// Kind is the type tag of a Value.
type Kind uint8

// Value kinds.
const (
	KindNil Kind = iota
	KindInt
	KindFloat
	KindString
	KindBytes
	KindNDArray
	KindDevice
	KindDType
	KindShape
	KindFunc
	KindModule
	KindTuple
)

var kindNames = [...]string{"nil", "int", "float", "string", "bytes", "ndarray", "device", "dtype", "shape", "func", "module", "tuple"}

// String names the kind.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// ErrType reports a Value of the wrong kind.
var ErrType = errors.New("wrong argument type")

// Value is one argument or result. The zero Value is nil.
type Value struct {
	kind Kind
	i    int64
	f    float64
	ref  any
}

// Nil is the nil Value.
var Nil = Value{}

// Int makes an integer Value.
func Int(v int64) Value { return Value{kind: KindInt, i: v} }

// Float makes a float Value.
func Float(v float64) Value { return Value{kind: KindFloat, f: v} }

// String makes a string Value.
func String(s string) Value { return Value{kind: KindString, ref: s} }

// Bytes makes a bytes Value.
func Bytes(b []byte) Value { return Value{kind: KindBytes, ref: b} }

// Array makes an NDArray Value; a nil array makes the nil Value.
func Array(a *ndarray.NDArray) Value {
	if a == nil {
		return Nil
	}
	return Value{kind: KindNDArray, ref: a}
}

// DeviceValue makes a Device Value.
func DeviceValue(d devices.Device) Value {
	return Value{kind: KindDevice, i: int64(d.Type)<<32 | int64(uint32(d.ID))}
}

// DTypeValue makes a DType Value.
func DTypeValue(d ndarray.DType) Value {
	return Value{kind: KindDType, i: int64(d.Code) | int64(d.Bits)<<8 | int64(d.Lanes)<<16}
}

// ShapeValue makes a Shape Value.
func ShapeValue(s ndarray.Shape) Value { return Value{kind: KindShape, ref: s.Clone()} }

// FuncValue makes a Func Value.
func FuncValue(f *Func) Value {
	if f == nil {
		return Nil
	}
	return Value{kind: KindFunc, ref: f}
}

// ModuleValue makes a Module Value.
func ModuleValue(m Module) Value {
	if m == nil {
		return Nil
	}
	return Value{kind: KindModule, ref: m}
}

// Tuple makes a tuple Value of fields (a graph function's several
// results).
func Tuple(fields ...Value) Value {
	return Value{kind: KindTuple, ref: append([]Value(nil), fields...)}
}

// AsTuple returns a tuple Value's fields.
func (v Value) AsTuple() ([]Value, error) {
	t, _ := v.ref.([]Value)
	return t, v.want(KindTuple)
}

// Kind is the Value's type tag.
func (v Value) Kind() Kind { return v.kind }

// IsNil reports the nil Value.
func (v Value) IsNil() bool { return v.kind == KindNil }

func (v Value) want(k Kind) error {
	if v.kind != k {
		return fmt.Errorf("%w: want %s, got %s", ErrType, k, v.kind)
	}
	return nil
}

// AsInt returns an int Value's integer.
func (v Value) AsInt() (int64, error) { return v.i, v.want(KindInt) }

// AsFloat returns a float Value's number; an int converts.
func (v Value) AsFloat() (float64, error) {
	if v.kind == KindInt {
		return float64(v.i), nil
	}
	return v.f, v.want(KindFloat)
}

// AsString returns a string Value's text.
func (v Value) AsString() (string, error) {
	s, _ := v.ref.(string)
	return s, v.want(KindString)
}

// AsBytes returns a bytes Value's bytes.
func (v Value) AsBytes() ([]byte, error) {
	b, _ := v.ref.([]byte)
	return b, v.want(KindBytes)
}

// AsArray returns an NDArray Value's array.
func (v Value) AsArray() (*ndarray.NDArray, error) {
	a, _ := v.ref.(*ndarray.NDArray)
	return a, v.want(KindNDArray)
}

// AsDevice returns a Device Value's device.
func (v Value) AsDevice() (devices.Device, error) {
	return devices.Device{Type: devices.Type(v.i >> 32), ID: int32(uint32(v.i))}, v.want(KindDevice)
}

// AsDType returns a DType Value's dtype.
func (v Value) AsDType() (ndarray.DType, error) {
	return ndarray.DType{Code: ndarray.Code(v.i & 0xff), Bits: uint8(v.i >> 8), Lanes: uint16(v.i >> 16)}, v.want(KindDType)
}

// AsShape returns a Shape Value's shape.
func (v Value) AsShape() (ndarray.Shape, error) {
	s, _ := v.ref.(ndarray.Shape)
	return s, v.want(KindShape)
}

// AsFunc returns a Func Value's function.
func (v Value) AsFunc() (*Func, error) {
	f, _ := v.ref.(*Func)
	return f, v.want(KindFunc)
}

// AsModule returns a Module Value's module.
func (v Value) AsModule() (Module, error) {
	m, _ := v.ref.(Module)
	return m, v.want(KindModule)
}

// String formats the Value for messages.
func (v Value) String() string {
	switch v.kind {
	case KindNil:
		return "nil"
	case KindInt:
		return strconv.FormatInt(v.i, 10)
	case KindFloat:
		return strconv.FormatFloat(v.f, 'g', -1, 64)
	case KindString:
		return strconv.Quote(v.ref.(string))
	case KindBytes:
		return fmt.Sprintf("bytes[%d]", len(v.ref.([]byte)))
	case KindNDArray:
		return v.ref.(*ndarray.NDArray).String()
	case KindDevice:
		d, _ := v.AsDevice()
		return d.String()
	case KindDType:
		d, _ := v.AsDType()
		return d.String()
	case KindShape:
		return v.ref.(ndarray.Shape).String()
	case KindFunc:
		return "func " + strconv.Quote(v.ref.(*Func).Name())
	case KindModule:
		return "module " + strconv.Quote(v.ref.(Module).Type())
	}
	return v.kind.String()
}
