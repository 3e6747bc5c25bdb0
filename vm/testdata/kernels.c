// Hand-written kernels following kiln_abi.h for the VM's tests: the Relax VM storage-scope example's
// add, three small elementwise kernels for the overhead benchmark, and the
// kernels of the IRModule tutorial's MLP after the zero pipeline (two transposes, a
// fused matmul+add+relu and a fused matmul+add). The Go loader checks the
// arguments against the metadata before a call enters C.
#include "kiln_abi.h"

KILN_DEFINE_LAST_ERROR()

#define T(i) ((DLTensor*)args[i].v_handle)
#define F32(t) ((float*)((char*)(t)->data + (t)->byte_offset))

static int64_t numel(const DLTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

// add: output = arg0 + arg1, all (2, 2) float32 (the Relax VM storage-scope example).
KILN_EXPORT int32_t add(KilnValue* args, int32_t* codes, int32_t n) {
  const float* a = F32(T(0));
  const float* b = F32(T(1));
  float* o = F32(T(2));
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) o[i * 2 + j] = a[i * 2 + j] + b[i * 2 + j];
  return 0;
}

// vadd: C = A + B over n float32 elements.
KILN_EXPORT int32_t vadd(KilnValue* args, int32_t* codes, int32_t n) {
  const float* a = F32(T(0));
  const float* b = F32(T(1));
  float* c = F32(T(2));
  int64_t len = numel(T(0));
  for (int64_t i = 0; i < len; i++) c[i] = a[i] + b[i];
  return 0;
}

// vmul: C = A * B.
KILN_EXPORT int32_t vmul(KilnValue* args, int32_t* codes, int32_t n) {
  const float* a = F32(T(0));
  const float* b = F32(T(1));
  float* c = F32(T(2));
  int64_t len = numel(T(0));
  for (int64_t i = 0; i < len; i++) c[i] = a[i] * b[i];
  return 0;
}

// vrelu: B = max(A, 0).
KILN_EXPORT int32_t vrelu(KilnValue* args, int32_t* codes, int32_t n) {
  const float* a = F32(T(0));
  float* b = F32(T(1));
  int64_t len = numel(T(0));
  for (int64_t i = 0; i < len; i++) b[i] = a[i] > 0 ? a[i] : 0;
  return 0;
}

// transpose: B (k, m) = A (m, k) transposed.
KILN_EXPORT int32_t transpose(KilnValue* args, int32_t* codes, int32_t n) {
  const float* a = F32(T(0));
  float* b = F32(T(1));
  int64_t m = T(0)->shape[0], k = T(0)->shape[1];
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < k; j++) b[j * m + i] = a[i * k + j];
  return 0;
}

static void matmul_add(const DLTensor* x, const DLTensor* w, const DLTensor* bias, DLTensor* out, int relu) {
  const float* px = F32(x);
  const float* pw = F32(w);
  const float* pb = F32(bias);
  float* po = F32(out);
  int64_t m = x->shape[0], k = x->shape[1], n = w->shape[1];
  for (int64_t i = 0; i < m; i++) {
    for (int64_t j = 0; j < n; j++) po[i * n + j] = 0;
    for (int64_t p = 0; p < k; p++) {
      float xv = px[i * k + p];
      const float* row = pw + p * n;
      float* orow = po + i * n;
      for (int64_t j = 0; j < n; j++) orow[j] += xv * row[j];
    }
    for (int64_t j = 0; j < n; j++) {
      float v = po[i * n + j] + pb[j];
      po[i * n + j] = relu && v < 0 ? 0 : v;
    }
  }
}

// fused_matmul_add_relu: out (m, n) = relu(x (m, k) @ w (k, n) + b (n,)).
KILN_EXPORT int32_t fused_matmul_add_relu(KilnValue* args, int32_t* codes, int32_t n) {
  matmul_add(T(0), T(1), T(2), T(3), 1);
  return 0;
}

// fused_matmul1_add1: out (m, n) = x (m, k) @ w (k, n) + b (n,).
KILN_EXPORT int32_t fused_matmul1_add1(KilnValue* args, int32_t* codes, int32_t n) {
  matmul_add(T(0), T(1), T(2), T(3), 0);
  return 0;
}

// fail always fails.
KILN_EXPORT int32_t fail(KilnValue* args, int32_t* codes, int32_t n) {
  kiln_set_last_error("fail: this kernel always fails");
  return 3;
}

#define TENSOR(name, dims) "{\"name\":\"" name "\",\"kind\":\"tensor\",\"dtype\":\"float32\",\"shape\":[" dims "]}"

KILN_EXPORT const char* kiln_module_metadata(void) {
  return "{\"format_version\":1,\"target\":\"c\",\"functions\":["
         "{\"name\":\"add\",\"params\":[" TENSOR("arg0", "2,2") "," TENSOR("arg1", "2,2") "," TENSOR("output", "2,2") "]},"
         "{\"name\":\"vadd\",\"params\":[" TENSOR("A", "\"n\"") "," TENSOR("B", "\"n\"") "," TENSOR("C", "\"n\"") "]},"
         "{\"name\":\"vmul\",\"params\":[" TENSOR("A", "\"n\"") "," TENSOR("B", "\"n\"") "," TENSOR("C", "\"n\"") "]},"
         "{\"name\":\"vrelu\",\"params\":[" TENSOR("A", "\"n\"") "," TENSOR("B", "\"n\"") "]},"
         "{\"name\":\"transpose\",\"params\":[" TENSOR("A", "\"m\",\"k\"") "," TENSOR("B", "\"k\",\"m\"") "]},"
         "{\"name\":\"fused_matmul_add_relu\",\"params\":[" TENSOR("x", "\"m\",\"k\"") "," TENSOR("w", "\"k\",\"n\"") ","
         TENSOR("b", "\"n\"") "," TENSOR("out", "\"m\",\"n\"") "]},"
         "{\"name\":\"fused_matmul1_add1\",\"params\":[" TENSOR("x", "\"m\",\"k\"") "," TENSOR("w", "\"k\",\"n\"") ","
         TENSOR("b", "\"n\"") "," TENSOR("out", "\"m\",\"n\"") "]},"
         "{\"name\":\"fail\",\"params\":[]}"
         "]}";
}
