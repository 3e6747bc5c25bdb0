package ir

import "github.com/kiln-ml/kiln/ndarray"

// DType is the element type of expressions and buffers; it is ndarray's
// DType (a DLPack code, a bit width and a lane count).
type DType = ndarray.DType

// Common dtypes, for brevity in passes and tests.
var (
	Bool    = ndarray.BoolT
	Int8    = ndarray.Int8
	Int16   = ndarray.Int16
	Int32   = ndarray.Int32
	Int64   = ndarray.Int64
	Uint8   = ndarray.Uint8
	Uint32  = ndarray.Uint32
	Uint64  = ndarray.Uint64
	Float16 = ndarray.Float16
	Float32 = ndarray.Float32
	Float64 = ndarray.Float64
	// Handle is the dtype of pointers: buffer data variables and the handle
	// parameters of a PrimFunc.
	Handle = DType{Code: ndarray.Handle, Bits: 64, Lanes: 1}
	// Void is the zero DType; a PrimFunc whose RetType is Void returns nothing.
	Void = DType{}
)

// IsVoid reports whether d is Void.
func IsVoid(d DType) bool { return d == Void }

// IsBool reports whether d is a boolean type (of any lane count).
func IsBool(d DType) bool { return d.Code == ndarray.Bool }

// IsHandle reports whether d is a handle (pointer) type.
func IsHandle(d DType) bool { return d.Code == ndarray.Handle }

// IsIndexType reports whether d is a scalar integer type usable as a
// loop variable, an index or an extent.
func IsIndexType(d DType) bool { return d.IsInt() && d.Lanes == 1 }
