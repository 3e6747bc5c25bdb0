// Package interp is kiln's reference interpreter of TensorIR: it evaluates
// expressions (Eval) and runs whole PrimFuncs (Run) on host ndarrays, so
// that passes and code generators can be checked against it (the
// differential tests: interpreter against compiled C).
//
// # Semantics
//
// Values (Value) are scalars or vectors of any ir dtype. Integers wrap
// around to their dtype's width (two's complement); Div and Mod truncate
// toward zero as in C, FloorDiv and FloorMod round toward negative
// infinity as in Python; integer division by zero is an error
// (ErrDivisionByZero), never a panic. float32 arithmetic rounds to float32
// after every operation; float16 and bfloat16 are computed in float32 and
// rounded to the 16-bit format (round half to even). Casts follow C: float
// to integer truncates toward zero (NaN gives 0, values beyond int64
// saturate, then the result wraps to the target width), integer to
// integer wraps, anything to bool is "!= 0". Min and Max on floats are
// C's (a < b ? a : b) and (a > b ? a : b), so a NaN in a gives b. Round is
// C's nearbyint under the default rounding mode: halves go to even (TVM's
// rule for T.round); code generators emit nearbyint for it. Math
// intrinsics on float32 are computed in float64 and rounded, so they may
// differ from a C library's expf by an ulp: compare with a tolerance.
// Select evaluates both sides; if_then_else only the taken one.
//
// Run executes every statement kind serially (parallel, vectorized and
// thread-bound loops too), before lowering (blocks with iteration
// variables, predicates, Init, multi-dimensional buffers) and after it
// (flat buffers, Allocate, DeclBuffer, thread_extent attributes).
// Memory belongs to a buffer's Data variable, so buffers that alias
// (a flattened view declared over a parameter) share it. Every access is
// checked against the buffer's shape and the memory behind it: an out of
// bounds access is an error (ErrOutOfBounds) naming the buffer and index.
//
// This package is pure computation on host memory: it imports compiler/ir,
// ndarray and packedfunc, and must not import devices backends, code
// generators, passes or compiler/arith (arith's tests use this package).
package interp
