// Kernels for the tests of a session's memory and process caps: many
// processes that together take more than the session may.
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include "kiln_abi.h"

KILN_DEFINE_LAST_ERROR()

#define MAX_CHILDREN 64

// hold_children forks args[0] children (at most 64) that each allocate and
// touch args[1] MiB and then hold it; out (args[2], int64[2]) gets how
// many children held their memory and how many died first (killed for
// want of memory). The children are ended before it returns.
KILN_EXPORT int32_t hold_children(KilnValue* args, int32_t* codes, int32_t n) {
  int64_t kids = args[0].v_int64;
  size_t sz = (size_t)args[1].v_int64 << 20;
  DLTensor* o = (DLTensor*)args[2].v_handle;
  int64_t* out = (int64_t*)((char*)o->data + o->byte_offset);
  if (kids > MAX_CHILDREN) kids = MAX_CHILDREN;
  pid_t pids[MAX_CHILDREN];
  int fds[2];
  if (pipe(fds) != 0) {
    kiln_set_last_error("hold_children: pipe failed");
    return 1;
  }
  int started = 0;
  for (; started < kids; started++) {
    pid_t c = fork();
    if (c < 0) break;
    if (c == 0) {
      close(fds[0]);
      volatile char* p = malloc(sz);
      if (p == NULL) _exit(2);
      for (size_t i = 0; i < sz; i += 4096) p[i] = 1;  // touch every page
      char b = 1;
      if (write(fds[1], &b, 1) != 1) _exit(3);
      for (;;) pause();
    }
    pids[started] = c;
  }
  close(fds[1]);
  int held = 0, died = 0;
  int alive[MAX_CHILDREN];
  for (int i = 0; i < started; i++) alive[i] = 1;
  // Each child either says it holds its memory or dies: wait for all.
  while (held + died < started) {
    struct pollfd pf = {fds[0], POLLIN, 0};
    if (poll(&pf, 1, 50) > 0) {
      char b;
      if (read(fds[0], &b, 1) == 1) held++;
    }
    for (int i = 0; i < started; i++) {
      if (alive[i] && waitpid(pids[i], NULL, WNOHANG) == pids[i]) {
        alive[i] = 0;
        died++;
      }
    }
  }
  close(fds[0]);
  for (int i = 0; i < started; i++) {
    if (alive[i]) {
      kill(pids[i], SIGKILL);
      waitpid(pids[i], NULL, 0);
    }
  }
  out[0] = held;
  out[1] = died;
  return 0;
}

// fork_many forks up to args[0] children that wait until it is done;
// out (args[1], int64[2]) gets how many it forked and -errno of the fork
// that failed (0: none). The children are ended before it returns.
KILN_EXPORT int32_t fork_many(KilnValue* args, int32_t* codes, int32_t n) {
  int64_t want = args[0].v_int64;
  DLTensor* o = (DLTensor*)args[1].v_handle;
  int64_t* out = (int64_t*)((char*)o->data + o->byte_offset);
  int fds[2];
  if (pipe(fds) != 0) {
    kiln_set_last_error("fork_many: pipe failed");
    return 1;
  }
  out[0] = 0;
  out[1] = 0;
  for (int64_t i = 0; i < want; i++) {
    pid_t c = fork();
    if (c < 0) {
      out[1] = -errno;
      break;
    }
    if (c == 0) {
      close(fds[1]);
      char b;
      while (read(fds[0], &b, 1) < 0 && errno == EINTR) {}
      _exit(0);
    }
    out[0]++;
  }
  close(fds[0]);
  close(fds[1]);  // the children's reads end: they exit
  for (int64_t i = 0; i < out[0]; i++) wait(NULL);
  return 0;
}

KILN_EXPORT const char* kiln_module_metadata(void) {
  return "{\"format_version\":1,\"target\":\"c\",\"functions\":["
         "{\"name\":\"hold_children\",\"params\":["
         "{\"name\":\"children\",\"kind\":\"int\"},"
         "{\"name\":\"mib\",\"kind\":\"int\"},"
         "{\"name\":\"out\",\"kind\":\"tensor\",\"dtype\":\"int64\",\"shape\":[2]}]},"
         "{\"name\":\"fork_many\",\"params\":["
         "{\"name\":\"n\",\"kind\":\"int\"},"
         "{\"name\":\"out\",\"kind\":\"tensor\",\"dtype\":\"int64\",\"shape\":[2]}]}"
         "]}";
}
