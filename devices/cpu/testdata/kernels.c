// Hand-written kernels following kiln_abi.h, used by the loader's tests.
#include <stdio.h>
#include "kiln_abi.h"

KILN_DEFINE_LAST_ERROR()

// vadd: C[i] = A[i] + B[i] for n elements; checks its arguments itself.
KILN_EXPORT int32_t vadd(KilnValue* args, int32_t* codes, int32_t n) {
  if (n != 3) { kiln_set_last_error("vadd: want 3 arguments"); return -1; }
  for (int i = 0; i < 3; i++) {
    if (codes[i] != KILN_ARG_DLTENSOR) { kiln_set_last_error("vadd: want tensors"); return -1; }
  }
  DLTensor* a = (DLTensor*)args[0].v_handle;
  DLTensor* b = (DLTensor*)args[1].v_handle;
  DLTensor* c = (DLTensor*)args[2].v_handle;
  int64_t len = a->shape[0];
  const float* pa = (const float*)((char*)a->data + a->byte_offset);
  const float* pb = (const float*)((char*)b->data + b->byte_offset);
  float* pc = (float*)((char*)c->data + c->byte_offset);
  for (int64_t i = 0; i < len; i++) pc[i] = pa[i] + pb[i];
  return 0;
}

// scale: X[i, j] *= alpha, X of shape (m, 4).
KILN_EXPORT int32_t scale(KilnValue* args, int32_t* codes, int32_t n) {
  DLTensor* x = (DLTensor*)args[0].v_handle;
  double alpha = args[1].v_float64;
  int64_t count = x->shape[0] * x->shape[1];
  double* p = (double*)((char*)x->data + x->byte_offset);
  for (int64_t i = 0; i < count; i++) p[i] *= alpha;
  return 0;
}

// fill_index: X[i] = i + offset.
KILN_EXPORT int32_t fill_index(KilnValue* args, int32_t* codes, int32_t n) {
  DLTensor* x = (DLTensor*)args[0].v_handle;
  int64_t off = args[1].v_int64;
  int32_t* p = (int32_t*)((char*)x->data + x->byte_offset);
  for (int64_t i = 0; i < x->shape[0]; i++) p[i] = (int32_t)(i + off);
  return 0;
}

// fail always fails with a message naming its input.
KILN_EXPORT int32_t fail(KilnValue* args, int32_t* codes, int32_t n) {
  char buf[128];
  snprintf(buf, sizeof buf, "fail: input was %lld", (long long)args[0].v_int64);
  kiln_set_last_error(buf);
  return 7;
}

KILN_EXPORT const char* kiln_module_metadata(void) {
  return "{\"format_version\":1,\"target\":\"c\",\"functions\":["
         "{\"name\":\"vadd\",\"params\":["
         "{\"name\":\"A\",\"kind\":\"tensor\",\"dtype\":\"float32\",\"shape\":[\"n\"]},"
         "{\"name\":\"B\",\"kind\":\"tensor\",\"dtype\":\"float32\",\"shape\":[\"n\"]},"
         "{\"name\":\"C\",\"kind\":\"tensor\",\"dtype\":\"float32\",\"shape\":[\"n\"]}]},"
         "{\"name\":\"scale\",\"params\":["
         "{\"name\":\"X\",\"kind\":\"tensor\",\"dtype\":\"float64\",\"shape\":[\"m\",4]},"
         "{\"name\":\"alpha\",\"kind\":\"float\"}]},"
         "{\"name\":\"fill_index\",\"params\":["
         "{\"name\":\"X\",\"kind\":\"tensor\",\"dtype\":\"int32\"},"
         "{\"name\":\"offset\",\"kind\":\"int\"}]},"
         "{\"name\":\"fail\",\"params\":[{\"name\":\"x\",\"kind\":\"int\"}]}"
         "]}";
}
