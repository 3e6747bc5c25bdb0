package ndarray

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Code is a DLPack data type code.
type Code uint8

// Type codes as in DLPack.
const (
	Int    Code = 0
	UInt   Code = 1
	Float  Code = 2
	Handle Code = 3
	BFloat Code = 4
	Bool   Code = 6
	// Float8E4M3 is an 8-bit float of 4 exponent and 3 mantissa bits,
	// finite only (no infinities; NaN is all ones), largest 448: OCP's
	// E4M3, CUDA's __nv_fp8_e4m3, DLPack's kDLFloat8_e4m3fn.
	Float8E4M3 Code = 10
	// Float8E5M2 is an 8-bit float of 5 exponent and 2 mantissa bits with
	// IEEE infinities and NaNs, largest finite 57344: CUDA's
	// __nv_fp8_e5m2, DLPack's kDLFloat8_e5m2.
	Float8E5M2 Code = 12
)

// DType is an element type: a code, a width in bits and a vector lane count.
// It has the layout of DLPack's DLDataType.
type DType struct {
	Code  Code
	Bits  uint8
	Lanes uint16
}

// Common dtypes.
var (
	BoolT    = DType{Bool, 8, 1}
	Int8     = DType{Int, 8, 1}
	Int16    = DType{Int, 16, 1}
	Int32    = DType{Int, 32, 1}
	Int64    = DType{Int, 64, 1}
	Uint8    = DType{UInt, 8, 1}
	Uint16   = DType{UInt, 16, 1}
	Uint32   = DType{UInt, 32, 1}
	Uint64   = DType{UInt, 64, 1}
	Float16  = DType{Float, 16, 1}
	BFloat16 = DType{BFloat, 16, 1}
	Float32  = DType{Float, 32, 1}
	Float64  = DType{Float, 64, 1}
	// Float8_E4M3 and Float8_E5M2 are "float8_e4m3" and "float8_e5m2".
	Float8_E4M3 = DType{Float8E4M3, 8, 1}
	Float8_E5M2 = DType{Float8E5M2, 8, 1}
)

// ErrBadDType reports a dtype string that does not parse.
var ErrBadDType = errors.New("unknown dtype")

// float8Names are the names of the 8-bit float dtypes (TVM's e4m3fn
// spelling too).
var float8Names = map[string]Code{"float8_e4m3": Float8E4M3, "float8_e4m3fn": Float8E4M3, "float8_e5m2": Float8E5M2}

// ParseDType parses "float32", "int8", "bool", "bfloat16", "float32x4",
// "uint1", "float8_e4m3", "float8_e5m2"… A lane suffix "xN" makes a
// vector type.
func ParseDType(s string) (DType, error) {
	if c, ok := float8Names[s]; ok {
		return DType{c, 8, 1}, nil
	}
	base, lanes := s, uint16(1)
	if i := strings.LastIndexByte(s, 'x'); i > 0 {
		n, err := strconv.ParseUint(s[i+1:], 10, 16)
		if err != nil || n == 0 {
			return DType{}, fmt.Errorf("%w %q: bad lane count %q", ErrBadDType, s, s[i+1:])
		}
		base, lanes = s[:i], uint16(n)
	}
	if c, ok := float8Names[base]; ok {
		return DType{c, 8, lanes}, nil
	}
	if base == "bool" {
		return DType{Bool, 8, lanes}, nil
	}
	var code Code
	var rest string
	switch {
	case strings.HasPrefix(base, "bfloat"):
		code, rest = BFloat, base[len("bfloat"):]
	case strings.HasPrefix(base, "float"):
		code, rest = Float, base[len("float"):]
	case strings.HasPrefix(base, "uint"):
		code, rest = UInt, base[len("uint"):]
	case strings.HasPrefix(base, "int"):
		code, rest = Int, base[len("int"):]
	case base == "handle":
		return DType{Handle, 64, lanes}, nil
	default:
		return DType{}, fmt.Errorf("%w %q", ErrBadDType, s)
	}
	bits, err := strconv.ParseUint(rest, 10, 8)
	if err != nil {
		return DType{}, fmt.Errorf("%w %q: bad bit width %q", ErrBadDType, s, rest)
	}
	d := DType{code, uint8(bits), lanes}
	if !d.valid() {
		return DType{}, fmt.Errorf("%w %q: %s has no %d-bit type", ErrBadDType, s, strings.TrimRight(base, "0123456789"), bits)
	}
	return d, nil
}

// MustParseDType is ParseDType for constants in code; it panics on error.
func MustParseDType(s string) DType {
	d, err := ParseDType(s)
	if err != nil {
		panic(err)
	}
	return d
}

func (d DType) valid() bool {
	switch d.Code {
	case Int, UInt:
		return d.Bits == 8 || d.Bits == 16 || d.Bits == 32 || d.Bits == 64 || (d.Code == UInt && d.Bits == 1)
	case Float:
		return d.Bits == 16 || d.Bits == 32 || d.Bits == 64
	case BFloat:
		return d.Bits == 16
	case Float8E4M3, Float8E5M2:
		return d.Bits == 8
	case Bool:
		return d.Bits == 8
	case Handle:
		return d.Bits == 64
	}
	return false
}

// String prints the dtype as ParseDType reads it.
func (d DType) String() string {
	var s string
	switch d.Code {
	case Int:
		s = "int" + strconv.Itoa(int(d.Bits))
	case UInt:
		s = "uint" + strconv.Itoa(int(d.Bits))
	case Float:
		s = "float" + strconv.Itoa(int(d.Bits))
	case BFloat:
		s = "bfloat" + strconv.Itoa(int(d.Bits))
	case Float8E4M3:
		s = "float8_e4m3"
	case Float8E5M2:
		s = "float8_e5m2"
	case Bool:
		s = "bool"
	case Handle:
		s = "handle"
	default:
		s = fmt.Sprintf("custom[%d]%d", d.Code, d.Bits)
	}
	if d.Lanes > 1 {
		s += "x" + strconv.Itoa(int(d.Lanes))
	}
	return s
}

// Scalar returns the dtype with one lane.
func (d DType) Scalar() DType { d.Lanes = 1; return d }

// WithLanes returns the dtype with n lanes.
func (d DType) WithLanes(n int) DType { d.Lanes = uint16(n); return d }

// Size is the number of bytes one element (all lanes) occupies.
func (d DType) Size() int {
	return (int(d.Bits)*int(d.Lanes) + 7) / 8
}

// IsFloat reports float, bfloat and 8-bit float types.
func (d DType) IsFloat() bool { return d.Code == Float || d.Code == BFloat || d.IsFloat8() }

// IsFloat8 reports the 8-bit float types (float8_e4m3, float8_e5m2).
func (d DType) IsFloat8() bool { return d.Code == Float8E4M3 || d.Code == Float8E5M2 }

// IsInt reports signed and unsigned integer types (not bool).
func (d DType) IsInt() bool { return d.Code == Int || d.Code == UInt }
