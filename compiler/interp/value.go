package interp

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

// Value is a scalar or vector value of an ir dtype. The zero Value is
// invalid (Type is Void). Integer lanes are kept wrapped to the dtype's
// width (sign-extended for signed types, zero-extended for unsigned ones,
// 0 or 1 for bool); float lanes are kept rounded to the dtype's precision.
type Value struct {
	// Type is the dtype, with its lane count.
	Type ir.DType
	// bits is lane 0 when Type.Lanes <= 1: an int64 bit pattern for
	// integers and bools, math.Float64bits for floats.
	bits uint64
	// lanes holds every lane when Type.Lanes > 1.
	lanes []uint64
}

// Int returns the integer (or bool) value v of scalar type t, wrapped to
// t's width. A float t gives the float value v.
func Int(t ir.DType, v int64) Value {
	t = t.Scalar()
	if t.IsFloat() {
		return Float(t, float64(v))
	}
	return Value{Type: t, bits: uint64(wrap(t, v))}
}

// Uint returns the unsigned value v of scalar type t, wrapped to t's width.
func Uint(t ir.DType, v uint64) Value {
	t = t.Scalar()
	if t.IsFloat() {
		return Float(t, float64(v))
	}
	return Value{Type: t, bits: uint64(wrap(t, int64(v)))}
}

// Float returns the float value v of scalar type t, rounded to t's
// precision. An integer t gives v converted as a C cast would.
func Float(t ir.DType, v float64) Value {
	t = t.Scalar()
	if !t.IsFloat() {
		return Value{Type: t, bits: castLane(t, ir.Float64, math.Float64bits(v))}
	}
	return Value{Type: t, bits: math.Float64bits(roundFloat(t, v))}
}

// Bool returns the boolean value b.
func Bool(b bool) Value {
	if b {
		return Value{Type: ir.Bool, bits: 1}
	}
	return Value{Type: ir.Bool}
}

// Vector returns the vector whose lanes are the given scalars, which must
// all have the same dtype; it returns the scalar itself for one lane.
func Vector(lanes ...Value) (Value, error) {
	if len(lanes) == 0 {
		return Value{}, fmt.Errorf("vector of no lanes")
	}
	t := lanes[0].Type
	if len(lanes) == 1 {
		return lanes[0], nil
	}
	if len(lanes) > math.MaxUint16 {
		return Value{}, fmt.Errorf("vector of %d lanes is too wide", len(lanes))
	}
	bits := make([]uint64, len(lanes))
	for i, l := range lanes {
		if l.Type != t || l.Lanes() != 1 {
			return Value{}, fmt.Errorf("vector lane %d has dtype %s, lane 0 has %s", i, l.Type, t)
		}
		bits[i] = l.bits
	}
	return Value{Type: t.WithLanes(len(lanes)), lanes: bits}, nil
}

// Broadcast returns v (a scalar) repeated in n lanes.
func Broadcast(v Value, n int) Value {
	if n <= 1 {
		return v
	}
	bits := make([]uint64, n)
	for i := range bits {
		bits[i] = v.lane(0)
	}
	return Value{Type: v.Type.Scalar().WithLanes(n), lanes: bits}
}

// fromLanes builds a value of scalar type t from raw lanes (already
// normalized), taking ownership of bits.
func fromLanes(t ir.DType, bits []uint64) Value {
	t = t.Scalar()
	if len(bits) == 1 {
		return Value{Type: t, bits: bits[0]}
	}
	return Value{Type: t.WithLanes(len(bits)), lanes: bits}
}

// Lanes is the number of lanes (1 for a scalar).
func (v Value) Lanes() int {
	if v.Type.Lanes <= 1 {
		return 1
	}
	return int(v.Type.Lanes)
}

func (v Value) lane(i int) uint64 {
	if v.lanes == nil {
		return v.bits
	}
	return v.lanes[i]
}

// Lane returns lane i as a scalar. It panics when i is out of range (a
// caller's bug).
func (v Value) Lane(i int) Value {
	if i < 0 || i >= v.Lanes() {
		panic(fmt.Sprintf("interp: lane %d of a %d-lane value", i, v.Lanes()))
	}
	return Value{Type: v.Type.Scalar(), bits: v.lane(i)}
}

// IsFloat reports a float dtype.
func (v Value) IsFloat() bool { return v.Type.IsFloat() }

// IntLane returns lane i as an int64: integers as they are (a uint64 beyond
// MaxInt64 as its bit pattern), bools as 0 or 1, floats truncated as by a
// C cast.
func (v Value) IntLane(i int) int64 {
	if v.IsFloat() {
		return int64(castLane(ir.Int64, v.Type.Scalar(), v.lane(i)))
	}
	return int64(v.lane(i))
}

// FloatLane returns lane i as a float64 (integers converted).
func (v Value) FloatLane(i int) float64 {
	if v.IsFloat() {
		return math.Float64frombits(v.lane(i))
	}
	if v.Type.Code == ndarray.UInt {
		return float64(v.lane(i))
	}
	return float64(int64(v.lane(i)))
}

// AsInt returns lane 0 as an int64 (see IntLane).
func (v Value) AsInt() int64 { return v.IntLane(0) }

// AsFloat returns lane 0 as a float64 (see FloatLane).
func (v Value) AsFloat() float64 { return v.FloatLane(0) }

// AsBool returns whether lane 0 is non-zero.
func (v Value) AsBool() bool {
	if v.IsFloat() {
		return math.Float64frombits(v.lane(0)) != 0
	}
	return v.lane(0) != 0
}

// Equal reports whether v and o have the same dtype and the same lanes, bit
// for bit (so a NaN equals the same NaN, and 0.0 differs from -0.0).
func (v Value) Equal(o Value) bool {
	if v.Type != o.Type {
		return false
	}
	for i := range v.Lanes() {
		if v.lane(i) != o.lane(i) {
			return false
		}
	}
	return true
}

// String prints the value: "int32(7)", "float32(0.5)", "bool(true)",
// "int32x4[0, 1, 2, 3]".
func (v Value) String() string {
	if v.Type == ir.Void {
		return "<invalid>"
	}
	one := func(i int) string {
		switch {
		case v.IsFloat():
			return strconv.FormatFloat(v.FloatLane(i), 'g', -1, 64)
		case ir.IsBool(v.Type):
			return strconv.FormatBool(v.lane(i) != 0)
		case v.Type.Code == ndarray.UInt:
			return strconv.FormatUint(v.lane(i), 10)
		}
		return strconv.FormatInt(int64(v.lane(i)), 10)
	}
	if v.Lanes() == 1 {
		return v.Type.String() + "(" + one(0) + ")"
	}
	parts := make([]string, v.Lanes())
	for i := range parts {
		parts[i] = one(i)
	}
	return v.Type.String() + "[" + strings.Join(parts, ", ") + "]"
}

// wrap truncates v to the width of integer or bool type t: sign-extended for
// signed types, zero-extended for unsigned ones, 0 or 1 for bool.
func wrap(t ir.DType, v int64) int64 {
	switch {
	case ir.IsBool(t):
		if v != 0 {
			return 1
		}
		return 0
	case t.Bits >= 64 || t.Bits == 0:
		return v
	case t.Code == ndarray.UInt:
		return int64(uint64(v) & (uint64(1)<<t.Bits - 1))
	}
	shift := 64 - uint(t.Bits)
	return v << shift >> shift
}

// roundFloat rounds f to the precision of float type t.
func roundFloat(t ir.DType, f float64) float64 {
	switch {
	case t.IsFloat8():
		return ndarray.Float8Value(t.Code, ndarray.Float8Bits(t.Code, f))
	case t.Code == ndarray.BFloat:
		return float64(bfloat16ToFloat32(float32ToBfloat16(float32(f))))
	case t.Bits == 16:
		return float64(halfToFloat32(float32ToHalf(float32(f))))
	case t.Bits == 32:
		return float64(float32(f))
	}
	return f
}

// float32ToHalf converts f to IEEE binary16 bits, rounding half to even.
func float32ToHalf(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	switch {
	case exp == 0xff: // inf or NaN
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp == 0 && mant == 0:
		return sign
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00 // overflow to infinity
	}
	if e <= 0 {
		// Subnormal half (or zero): shift the full mantissa.
		if e < -10 {
			return sign
		}
		m := mant | 0x800000
		shift := uint32(14 - e)
		h := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // may carry into the exponent, up to infinity: still correct
	}
	return sign | uint16(h)
}

// halfToFloat32 converts IEEE binary16 bits to a float32.
func halfToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		f := float32(mant) / (1 << 24)
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// float32ToBfloat16 converts f to bfloat16 bits, rounding half to even.
func float32ToBfloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// bfloat16ToFloat32 converts bfloat16 bits to a float32.
func bfloat16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }
