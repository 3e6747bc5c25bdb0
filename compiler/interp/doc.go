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
// Loops bound to GPU thread axes run with CUDA's semantics as far as they
// can serially: each iteration of a blockIdx loop is a new block, whose
// "shared" buffers hold nothing its threads have written, and the threads
// of a block (the threadIdx loops) run one after another. Every access to
// shared memory inside a threadIdx loop is checked: reading what another
// thread of the block wrote, overwriting it, or reading what no thread of
// the block wrote is ErrDataRace, naming the buffer, the element and both
// threads. Sibling threadIdx loop nests are separated by a barrier (the
// one barrier insertion places between them, as TVM's thread sync does);
// within one nest there is none. A vector access is checked at its first
// element. A threadIdx.x loop that shuffles values between the lanes of a
// warp (tvm_warp_shuffle_down) runs its threads in lockstep from shuffle to
// shuffle (one after another between shuffles); a shuffle that not every
// lane of a warp reaches is an error naming both threads.
// Memory belongs to a buffer's Data variable, so buffers that alias
// (a flattened view declared over a parameter) share it. Every access is
// checked against the buffer's shape and the memory behind it: an out of
// bounds access is an error (ErrOutOfBounds) naming the buffer and index.
//
// This package is pure computation on host memory: it imports compiler/ir,
// ndarray and packedfunc, and must not import devices backends, code
// generators, passes or compiler/arith (arith's tests use this package).
package interp
