/* A C program against kiln.h and libkiln.so (capi_test.go builds and runs
 * it): local build, module, arrays from and to host memory and DLPack,
 * calls, the time evaluator, errors (thread-local, with their class) and
 * live handles back to zero. Prints "ok" and exits 0 when every check
 * holds; otherwise names the check that failed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

#define CHECK(cond, what)                                                   \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "FAIL %s (line %d): last error: %s\n", what, __LINE__, \
              kiln_last_error());                                           \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

static const char* src =
    "@T.prim_func\n"
    "def add_one(A: T.Buffer((4,), \"float32\"), B: T.Buffer((4,), \"float32\")):\n"
    "    for i in range(4):\n"
    "        with T.block(\"B\"):\n"
    "            vi = T.axis.spatial(4, i)\n"
    "            B[vi] = A[vi] + T.float32(1)\n";

static int lines;
static void progress(const char* line, void* user) {
  (void)line;
  (*(int*)user)++;
}

static void* other_thread(void* arg) {
  (void)arg;
  /* This thread has not failed: its last error is empty whatever the main
   * thread's is. */
  CHECK(strcmp(kiln_last_error(), "") == 0, "last error is per thread");
  CHECK(kiln_free(987654321) == -1, "free of an unknown handle fails");
  CHECK(strstr(kiln_last_error(), "987654321") != NULL, "the error names the handle");
  return NULL;
}

static int deleted;
static void my_deleter(DLManagedTensor* t) { deleted++; (void)t; }

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: smoke OUTDIR\n");
    return 2;
  }
  char out[4096];
  snprintf(out, sizeof out, "%s/add_one.kiln", argv[1]);
  char* path = NULL;
  CHECK(kiln_build(src, "add_one.py", "cpu", 0, out, progress, &lines, 0, &path) == 0, "build");
  CHECK(strcmp(path, out) == 0 && lines >= 1, "build returns the path and reports progress");
  kiln_string_free(path);

  CHECK(kiln_build("def broken(:", "broken.py", "cpu", 0, out, NULL, NULL, 0, &path) == -1, "a parse error fails");
  CHECK(kiln_last_error_kind() == KILN_ERR_BUILD, "a parse error is a build error");
  CHECK(strstr(kiln_last_error(), "broken.py") != NULL, "the error names the file");

  KilnHandle s, m, f, a, b;
  CHECK(kiln_local(&s) == 0, "local session");
  CHECK(kiln_session_load_module(s, out, &m) == 0, "load module");
  CHECK(kiln_module_get_function(m, "nope", &f) == -1 && kiln_last_error_kind() == KILN_ERR_ARGUMENT, "unknown function");
  CHECK(strstr(kiln_last_error(), "add_one") != NULL, "the error lists the module's functions");
  CHECK(kiln_module_get_function(m, "add_one", &f) == 0, "get function");

  int64_t shape[1] = {4};
  DLDataType f32 = {kDLFloat, 32, 1};
  DLDevice cpu = {kDLCPU, 0};
  CHECK(kiln_array_empty(s, 1, shape, f32, cpu, &a) == 0, "empty a");
  float host[4] = {1, 2, 3, 4};
  DLTensor t = {host, cpu, 1, f32, shape, NULL, 0};
  CHECK(kiln_array_copy_from(a, &t, 0) == 0, "copy from host");

  /* b borrows this program's memory through DLPack. */
  float bmem[4] = {0};
  DLManagedTensor mt = {{bmem, cpu, 1, f32, shape, NULL, 0}, NULL, my_deleter};
  CHECK(kiln_array_from_dlpack(&mt, &b) == 0, "from DLPack");

  KilnArg args[2];
  int32_t codes[2] = {KILN_ARRAY, KILN_ARRAY};
  args[0].v_handle = a;
  args[1].v_handle = b;
  KilnArg ret;
  int32_t rc;
  CHECK(kiln_call(f, args, codes, 2, 0, &ret, &rc) == 0 && rc == KILN_NULL, "call");
  CHECK(bmem[0] == 2 && bmem[3] == 5, "the kernel wrote the borrowed memory");

  /* A wrong shape is refused with an argument error naming the parameter. */
  int64_t shape3[1] = {3};
  KilnHandle c;
  CHECK(kiln_array_empty(s, 1, shape3, f32, cpu, &c) == 0, "empty c");
  args[1].v_handle = c;
  CHECK(kiln_call(f, args, codes, 2, 0, &ret, &rc) == -1, "a wrong shape fails");
  CHECK(kiln_last_error_kind() == KILN_ERR_ARGUMENT && strstr(kiln_last_error(), "\"B\"") != NULL, "and names B");

  pthread_t th;
  pthread_create(&th, NULL, other_thread, NULL);
  pthread_join(th, NULL);
  CHECK(strstr(kiln_last_error(), "\"B\"") != NULL, "another thread's failure leaves this thread's error");

  char* json = NULL;
  args[1].v_handle = b;
  CHECK(kiln_time_evaluator(f, args, codes, 2, 3, 2, 0, 0, &json) == 0, "time evaluator");
  CHECK(strstr(json, "\"results\"") != NULL && strstr(json, "\"median\"") != NULL, "timing JSON");
  CHECK(strstr(json, "\"verdict\":\"noisy\",\"reason\":\"too few samples (n=2)") != NULL, "its validity report");
  kiln_string_free(json);

  /* Export a: the tensor keeps the memory alive after the handle is freed. */
  DLManagedTensor* ex = NULL;
  CHECK(kiln_array_to_dlpack(a, &ex) == 0, "to DLPack");
  CHECK(((float*)ex->dl_tensor.data)[2] == 3, "exported memory");

  CHECK(kiln_free(a) == 0, "free a");
  CHECK(((float*)ex->dl_tensor.data)[2] == 3, "exported memory outlives the handle");
  ex->deleter(ex);
  args[0].v_handle = a;
  CHECK(kiln_call(f, args, codes, 2, 0, &ret, &rc) == -1, "a freed array is refused");
  CHECK(strstr(kiln_last_error(), "freed") != NULL && kiln_last_error_kind() == KILN_ERR_ARGUMENT, "saying it was freed");

  CHECK(kiln_free(b) == 0 && deleted == 1, "freeing b calls the DLPack deleter once");
  kiln_free(c);
  kiln_free(f);
  kiln_free(m);
  kiln_free(s);
  CHECK(kiln_live_handles() == 0, "no live handles left");
  printf("ok\n");
  return 0;
}
