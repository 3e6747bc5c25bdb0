/* The C half of `go run ./bench python`: calls an empty kernel through
 * libkiln's C API in a loop and prints the best mean µs per call of five
 * rounds. Usage: python_capi ARTIFACT CALLS */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kiln.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int die(const char* what) {
  fprintf(stderr, "%s: %s\n", what, kiln_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: python_capi ARTIFACT CALLS\n");
    return 2;
  }
  KilnHandle s, m, f, a;
  if (kiln_local(&s)) return die("local session");
  if (kiln_session_load_module(s, argv[1], &m)) return die("load module");
  if (kiln_module_get_function(m, "empty", &f)) return die("get function");
  int64_t shape[1] = {1};
  DLDataType dt = {kDLFloat, 32, 1};
  DLDevice dev = {kDLCPU, 0};
  if (kiln_array_empty(s, 1, shape, dt, dev, &a)) return die("array");
  KilnArg args[1];
  int32_t codes[1] = {KILN_ARRAY};
  args[0].v_handle = a;
  KilnArg ret;
  int32_t rc;
  int n = atoi(argv[2]);
  for (int i = 0; i < 1000; i++)
    if (kiln_call(f, args, codes, 1, 0, &ret, &rc)) return die("call");
  double best = 1e9;
  for (int r = 0; r < 5; r++) {
    double t0 = now();
    for (int i = 0; i < n; i++)
      if (kiln_call(f, args, codes, 1, 0, &ret, &rc)) return die("call");
    double us = (now() - t0) / n * 1e6;
    if (us < best) best = us;
  }
  kiln_free(a);
  kiln_free(f);
  kiln_free(m);
  kiln_free(s);
  printf("%.4f %lld\n", best, (long long)kiln_live_handles());
  return 0;
}
