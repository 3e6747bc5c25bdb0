/*
 * kiln_abi.h — the kernel ABI of kiln's compiled CPU modules.
 *
 * Every exported function has one packed signature:
 *
 *     int32_t f(KilnValue* args, int32_t* type_codes, int32_t num_args);
 *
 * A non-zero return means failure; kiln_last_error() then returns the calling
 * thread's message. Tensors are passed as DLTensor pointers (type code
 * KILN_ARG_DLTENSOR), scalars by value. Each module also exports
 * kiln_module_metadata(): a NUL-terminated JSON document describing the
 * format version, the target and every function's signature.
 *
 * The DLPack structs below are laid out exactly as in dlpack.h (v0.8), so
 * code written against DLPack can use them unchanged.
 */
#ifndef KILN_ABI_H_
#define KILN_ABI_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_ABI_VERSION 1

#ifndef DLPACK_VERSION
typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
} DLDeviceType;

typedef struct {
  int32_t device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;
#endif

/* Type codes of packed arguments (the values TVM uses). */
enum {
  KILN_ARG_INT = 0,
  KILN_ARG_UINT = 1,
  KILN_ARG_FLOAT = 2,
  KILN_ARG_HANDLE = 3,
  KILN_ARG_NULL = 4,
  KILN_ARG_DTYPE = 5,
  KILN_ARG_DEVICE = 6,
  KILN_ARG_DLTENSOR = 7,
  KILN_ARG_STR = 11,
  KILN_ARG_BYTES = 12,
};

/* KilnValue is one packed argument. */
typedef union {
  int64_t v_int64;
  double v_float64;
  void* v_handle;
  const char* v_str;
  DLDataType v_type;
  DLDevice v_device;
} KilnValue;

/* KilnPackedFunc is the signature of every exported kernel. */
typedef int32_t (*KilnPackedFunc)(KilnValue* args, int32_t* type_codes, int32_t num_args);

/* KilnPackedFuncRet is the signature of a function that returns a scalar
 * (its metadata names the dtype in "ret"; the module's metadata has format
 * version 2): TVM's packed signature, with the place of the result. The
 * caller sets *ret_tcode to KILN_ARG_NULL; the function stores its result
 * in *ret_value and KILN_ARG_INT or KILN_ARG_FLOAT in *ret_tcode. */
typedef int32_t (*KilnPackedFuncRet)(KilnValue* args, int32_t* type_codes, int32_t num_args, KilnValue* ret_value,
                                     int32_t* ret_tcode);

/* Parallel loops. A generated module outlines each parallel loop into a
 * KilnParallelFunc that runs iterations [begin, end) of it, and runs the loop
 * through the module's exported variable kiln_parallel_launch, which the
 * loader sets after dlopen to the runtime's thread pool: launch(fn, closure, n)
 * runs fn over [0, n) in chunks on the pool's threads and the caller's, and
 * returns 0 or the first non-zero return of a chunk. A module whose variable
 * stays NULL runs its loops serially on the calling thread. */
typedef int32_t (*KilnParallelFunc)(int64_t begin, int64_t end, void* closure);
typedef int32_t (*KilnParallelLaunch)(KilnParallelFunc fn, void* closure, int64_t n);

/* Helpers for generated and hand-written modules. KILN_DEFINE_LAST_ERROR()
 * defines kiln_last_error() and kiln_set_last_error() in one translation unit. */
#define KILN_EXPORT __attribute__((visibility("default")))

#define KILN_DEFINE_LAST_ERROR()                                              \
  static __thread char kiln_error_buf_[1024];                                 \
  KILN_EXPORT const char* kiln_last_error(void) { return kiln_error_buf_; }   \
  static void kiln_set_last_error(const char* msg) {                          \
    int i = 0;                                                                \
    for (; msg[i] != 0 && i < (int)sizeof(kiln_error_buf_) - 1; i++)          \
      kiln_error_buf_[i] = msg[i];                                            \
    kiln_error_buf_[i] = 0;                                                   \
  }

#ifdef __cplusplus
}
#endif
#endif /* KILN_ABI_H_ */
