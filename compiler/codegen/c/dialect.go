package c

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/ndarray"
)

// Dialect is what differs between the C-like languages the Renderer
// prints. Nil hooks take C's behaviour.
type Dialect struct {
	// Name names the target in error messages ("c", "cuda").
	Name string
	// Prelude is printed first: includes and the helpers that lowered code
	// calls (see transform's Helper* names).
	Prelude string
	// Restrict qualifies pointers that do not alias ("restrict",
	// "__restrict__").
	Restrict string
	// Signature returns the line that opens function f (up to and
	// including the "{"); nil gives the packed C signature.
	Signature func(r *Renderer, name string, f *ir.PrimFunc) (string, error)
	// Loop returns the lines that open a loop of a kind other than serial
	// (pragmas and the for header, ending in "{"), or handled=false for
	// the default (C: parallel loops outlined and launched on the
	// loader's thread pool, GCC unroll pragmas, thread-bound loops
	// rejected).
	Loop func(r *Renderer, f *ir.For) (lines []string, handled bool, err error)
	// Intrinsic returns the call of a math intrinsic on scalar arguments
	// already printed, or ok=false for the default (libm).
	Intrinsic func(op string, t ir.DType, args []string) (string, bool)
	// Fail returns the statement that reports message and leaves the
	// function; inParallel is set inside a parallel loop's body (in C an
	// outlined function, whose failure its launch passes on).
	Fail func(message string, inParallel bool) string
	// Allocate returns the declaration of a buffer allocated inside a
	// function (a storage scope the dialect owns, such as CUDA's shared
	// memory), or handled=false for the default (C: registers, stack or
	// heap).
	Allocate func(r *Renderer, b *ir.Buffer) (decl string, handled bool, err error)
	// Externs are the functions of the dialect's prelude that lowered code
	// may call (call_extern) beside the C math library and the module's
	// own functions; no other name is printed as a call.
	Externs map[string]bool
	// Return is the statement that ends a function; "" is "return 0;".
	Return string
	// VectorDecl, when set, returns the declaration of vector type t (of
	// elements elem) with its kiln_vload_T and kiln_vstore_T helpers, in
	// place of GCC's vector_size typedef and helpers (C).
	VectorDecl func(t ir.DType, elem string) string
	// BFloat16 says the dialect's prelude defines bfloat16Type, bfloat16
	// with float's arithmetic rounded to bfloat16 after each operation;
	// otherwise bfloat16 has no type (C).
	BFloat16 bool
	// Call returns the code of a call of an instruction only some
	// dialects have (a warp shuffle, ir.OpWarpShuffleDown; a tensor-core
	// multiply-accumulate, ir.OpPtxMma), or handled=false when this
	// dialect does not have it, which is an error naming the dialect;
	// nil has none (C). An error says what is wrong with the call.
	Call func(r *Renderer, e *ir.Call) (code string, handled bool, err error)
	// Float8 says the dialect's prelude defines the 8-bit float types
	// (see Float8Type), storage types converted through float; otherwise
	// they have no type (C).
	Float8 bool
}

// Float8Type is the type of 8-bit float dtype t in a dialect with Float8:
// kiln_fp8_e4m3 or kiln_fp8_e5m2.
func Float8Type(t ir.DType) string {
	if t.Code == ndarray.Float8E5M2 {
		return "kiln_fp8_e5m2"
	}
	return "kiln_fp8_e4m3"
}

// bfloat16Type is the type of bfloat16 values in a dialect with BFloat16.
const bfloat16Type = "kiln_bf16"

// C returns the dialect for host C compiled by GCC or Clang.
func C() Dialect {
	return Dialect{Name: "c", Prelude: cPrelude + parallelPrelude, Restrict: "restrict", Externs: PackedHelpers()}
}

// PackedHelpers are the helpers of the packed API (transform's Helper*
// names) that cPrelude defines, as Dialect.Externs.
func PackedHelpers() map[string]bool {
	m := map[string]bool{}
	for _, n := range []string{transform.HelperArgType, transform.HelperArgInt, transform.HelperArgFloat,
		transform.HelperArgHandle, transform.HelperIsNull, transform.HelperNDim, transform.HelperShape,
		transform.HelperStride, transform.HelperCompact, transform.HelperDTypeCode, transform.HelperDTypeBits,
		transform.HelperDTypeLanes, transform.HelperDeviceType, transform.HelperData,
		transform.HelperRetInt, transform.HelperRetFloat} {
		m[n] = true
	}
	return m
}

func cFail(msg string, _ bool) string {
	if msg == transform.KeepLastError {
		// The failed call (a kernel launch) has set the message.
		return "{ return -1; }"
	}
	return fmt.Sprintf("{ kiln_set_last_error(%s); return -1; }", cString(msg))
}

// cPrelude defines the helpers of lowered code for the C kernel ABI.
const cPrelude = `#define _GNU_SOURCE
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln_abi.h"

/* Vector helpers pass GCC vector types by value; without -march flags that
 * enable them GCC warns that the ABI differs, which is harmless here. */
#pragma GCC diagnostic ignored "-Wpsabi"

KILN_DEFINE_LAST_ERROR()

static inline int32_t kiln_arg_type(const void* codes, int32_t i) { return ((const int32_t*)codes)[i]; }
static inline int64_t kiln_arg_int(const void* args, int32_t i) { return ((const KilnValue*)args)[i].v_int64; }
static inline double kiln_arg_float(const void* args, int32_t i) { return ((const KilnValue*)args)[i].v_float64; }
static inline void* kiln_arg_handle(const void* args, int32_t i) { return ((const KilnValue*)args)[i].v_handle; }
static inline void kiln_ret_int(void* rv, void* tc, int64_t v) { ((KilnValue*)rv)->v_int64 = v; *(int32_t*)tc = KILN_ARG_INT; }
static inline void kiln_ret_float(void* rv, void* tc, double v) { ((KilnValue*)rv)->v_float64 = v; *(int32_t*)tc = KILN_ARG_FLOAT; }
static inline bool kiln_is_null(const void* h) { return h == NULL; }
static inline int32_t kiln_tensor_ndim(const void* t) { return ((const DLTensor*)t)->ndim; }
static inline int64_t kiln_tensor_shape(const void* t, int32_t j) { return ((const DLTensor*)t)->shape[j]; }
static inline int32_t kiln_tensor_dtype_code(const void* t) { return ((const DLTensor*)t)->dtype.code; }
static inline int32_t kiln_tensor_dtype_bits(const void* t) { return ((const DLTensor*)t)->dtype.bits; }
static inline int32_t kiln_tensor_dtype_lanes(const void* t) { return ((const DLTensor*)t)->dtype.lanes; }
static inline int32_t kiln_tensor_device_type(const void* t) { return ((const DLTensor*)t)->device.device_type; }
static inline void* kiln_tensor_data(const void* t) {
  const DLTensor* x = (const DLTensor*)t;
  return (char*)x->data + x->byte_offset;
}
static inline int64_t kiln_tensor_stride(const void* t, int32_t j) {
  const DLTensor* x = (const DLTensor*)t;
  if (x->strides != NULL) return x->strides[j];
  int64_t s = 1;
  for (int32_t k = x->ndim - 1; k > j; k--) s *= x->shape[k];
  return s;
}
static inline bool kiln_tensor_is_compact(const void* t) {
  const DLTensor* x = (const DLTensor*)t;
  if (x->strides == NULL) return true;
  int64_t s = 1;
  for (int32_t k = x->ndim - 1; k >= 0; k--) {
    if (x->shape[k] != 1 && x->strides[k] != s) return false;
    s *= x->shape[k];
  }
  return true;
}
static inline void* kiln_alloc(int64_t nbytes) {
  void* p = NULL;
  if (posix_memalign(&p, 64, nbytes > 0 ? (size_t)nbytes : 1) != 0) return NULL;
  return p;
}
#define KILN_MIN(a, b) ({ __typeof__(a) a_ = (a); __typeof__(b) b_ = (b); a_ < b_ ? a_ : b_; })
#define KILN_MAX(a, b) ({ __typeof__(a) a_ = (a); __typeof__(b) b_ = (b); a_ > b_ ? a_ : b_; })
#define KILN_FLOORDIV(a, b) ({ __typeof__(a) a_ = (a); __typeof__(b) b_ = (b); __typeof__(a) q_ = a_ / b_; \
  (q_ * b_ != a_ && ((a_ < 0) != (b_ < 0))) ? q_ - 1 : q_; })
#define KILN_FLOORMOD(a, b) ({ __typeof__(a) a_ = (a); __typeof__(b) b_ = (b); __typeof__(a) r_ = a_ % b_; \
  (r_ != 0 && ((r_ < 0) != (b_ < 0))) ? r_ + b_ : r_; })
#define KILN_ABS(a) ({ __typeof__(a) a_ = (a); a_ < 0 ? -a_ : a_; })
`
