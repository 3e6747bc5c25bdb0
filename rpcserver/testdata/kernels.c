// Kernels for the device daemon's tests: a real computation, an empty one,
// one that crashes the worker, one that blocks and one that leaves a
// process behind.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "kiln_abi.h"

KILN_DEFINE_LAST_ERROR()

// vadd: C[i] = A[i] + B[i] for float32 vectors.
KILN_EXPORT int32_t vadd(KilnValue* args, int32_t* codes, int32_t n) {
  DLTensor* a = (DLTensor*)args[0].v_handle;
  DLTensor* b = (DLTensor*)args[1].v_handle;
  DLTensor* c = (DLTensor*)args[2].v_handle;
  const float* pa = (const float*)((char*)a->data + a->byte_offset);
  const float* pb = (const float*)((char*)b->data + b->byte_offset);
  float* pc = (float*)((char*)c->data + c->byte_offset);
  for (int64_t i = 0; i < a->shape[0]; i++) pc[i] = pa[i] + pb[i];
  return 0;
}

// nop does nothing.
KILN_EXPORT int32_t nop(KilnValue* args, int32_t* codes, int32_t n) { return 0; }

// crash writes through a null pointer: SIGSEGV.
KILN_EXPORT int32_t crash(KilnValue* args, int32_t* codes, int32_t n) {
  volatile int* p = (volatile int*)(uintptr_t)args[0].v_int64;
  *p = 42;
  return 0;
}

// abort_now calls abort(): SIGABRT.
KILN_EXPORT int32_t abort_now(KilnValue* args, int32_t* codes, int32_t n) {
  abort();
  return 0;
}

// sleep_ms sleeps for its argument in milliseconds.
KILN_EXPORT int32_t sleep_ms(KilnValue* args, int32_t* codes, int32_t n) {
  int64_t ms = args[0].v_int64;
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {}
  return 0;
}

// fail fails with a message.
KILN_EXPORT int32_t fail(KilnValue* args, int32_t* codes, int32_t n) {
  kiln_set_last_error("fail: this kernel always fails");
  return 3;
}

// orphan double-forks: the grandchild sleeps for args[1] ms, outliving the
// call and its parent, and its pid is written to the int64 tensor args[0].
KILN_EXPORT int32_t orphan(KilnValue* args, int32_t* codes, int32_t n) {
  DLTensor* out = (DLTensor*)args[0].v_handle;
  int64_t ms = args[1].v_int64;
  int fds[2];
  if (pipe(fds) != 0) {
    kiln_set_last_error("orphan: pipe failed");
    return 1;
  }
  pid_t child = fork();
  if (child < 0) {
    kiln_set_last_error("orphan: fork failed");
    return 1;
  }
  if (child == 0) {
    pid_t g = fork();
    if (g == 0) {
      struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
      while (nanosleep(&ts, &ts) != 0) {}
      _exit(0);
    }
    if (write(fds[1], &g, sizeof g) != sizeof g) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  pid_t g = -1;
  if (read(fds[0], &g, sizeof g) != sizeof g) g = -1;
  close(fds[0]);
  waitpid(child, NULL, 0);
  *(int64_t*)((char*)out->data + out->byte_offset) = g;
  return 0;
}

// intrude attacks another session: it reads the file whose NUL-terminated
// path is the uint8 tensor args[0], appends to it, and sends SIGKILL to
// process args[1]. out (args[2], int64[3]) gets, for each, the bytes read
// or written, or 0 for the signal, or -errno when refused.
KILN_EXPORT int32_t intrude(KilnValue* args, int32_t* codes, int32_t n) {
  DLTensor* p = (DLTensor*)args[0].v_handle;
  int64_t pid = args[1].v_int64;
  DLTensor* o = (DLTensor*)args[2].v_handle;
  const char* path = (const char*)p->data + p->byte_offset;
  int64_t* out = (int64_t*)((char*)o->data + o->byte_offset);
  char buf[256];
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    out[0] = -errno;
  } else {
    ssize_t r = read(fd, buf, sizeof buf);
    out[0] = r < 0 ? -errno : r;
    close(fd);
  }
  fd = open(path, O_WRONLY | O_APPEND);
  if (fd < 0) {
    out[1] = -errno;
  } else {
    ssize_t w = write(fd, "intruder", 8);
    out[1] = w < 0 ? -errno : w;
    close(fd);
  }
  out[2] = kill((pid_t)pid, SIGKILL) == 0 ? 0 : -errno;
  return 0;
}

// fill writes args[1] MiB to a new file at the path in the uint8 tensor
// args[0], a MiB at a time, until done or refused; out (args[2], int64[2])
// gets the bytes written and -errno of the write that failed (0: none).
// With args[1] negative it writes -args[1] MiB and fails, saying why,
// when a write is refused.
KILN_EXPORT int32_t fill(KilnValue* args, int32_t* codes, int32_t n) {
  DLTensor* p = (DLTensor*)args[0].v_handle;
  int64_t mib = args[1].v_int64;
  int strict = mib < 0;
  if (strict) mib = -mib;
  DLTensor* o = (DLTensor*)args[2].v_handle;
  const char* path = (const char*)p->data + p->byte_offset;
  int64_t* out = (int64_t*)((char*)o->data + o->byte_offset);
  static char chunk[1 << 20];
  memset(chunk, 7, sizeof chunk);
  out[0] = 0;
  out[1] = 0;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    out[1] = -errno;
    return 0;
  }
  for (int64_t i = 0; i < mib; i++) {
    size_t done = 0;
    while (done < sizeof chunk) {
      ssize_t w = write(fd, chunk + done, sizeof chunk - done);
      if (w < 0) {
        out[1] = -errno;
        close(fd);
        if (strict) {
          char msg[128];
          snprintf(msg, sizeof msg, "fill: write: %s", strerror((int)-out[1]));
          kiln_set_last_error(msg);
          return 1;
        }
        return 0;
      }
      done += (size_t)w;
      out[0] += w;
    }
  }
  if (fsync(fd) != 0) out[1] = -errno;
  close(fd);
  return 0;
}

// hog allocates and touches args[0] MiB; it fails when malloc does.
KILN_EXPORT int32_t hog(KilnValue* args, int32_t* codes, int32_t n) {
  size_t sz = (size_t)args[0].v_int64 << 20;
  volatile char* p = malloc(sz);
  if (p == NULL) {
    kiln_set_last_error("hog: out of memory");
    return 1;
  }
  for (size_t i = 0; i < sz; i += 4096) p[i] = 1;  // touch every page
  free((void*)p);
  return 0;
}

// privs reports what the worker may do to the machine: out (int64[4])
// gets its effective capabilities (CapEff), its NoNewPrivs flag, the
// result of writing kernel.printk_ratelimit_burst's own value back (the
// bytes written, or -errno: the host is unchanged either way) and the
// host uid its uid 0 maps to (-1 when none does).
KILN_EXPORT int32_t privs(KilnValue* args, int32_t* codes, int32_t n) {
  DLTensor* o = (DLTensor*)args[0].v_handle;
  int64_t* out = (int64_t*)((char*)o->data + o->byte_offset);
  char buf[4096];
  out[0] = out[1] = out[2] = out[3] = -1;
  int fd = open("/proc/self/status", O_RDONLY);
  if (fd >= 0) {
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[r > 0 ? r : 0] = 0;
    char* p = strstr(buf, "CapEff:");
    if (p) out[0] = strtoll(p + 7, NULL, 16);
    p = strstr(buf, "NoNewPrivs:");
    if (p) out[1] = strtoll(p + 11, NULL, 10);
  }
  const char* sysctl = "/proc/sys/kernel/printk_ratelimit_burst";
  fd = open(sysctl, O_RDONLY);
  ssize_t len = -1;
  if (fd >= 0) {
    len = read(fd, buf, sizeof buf - 1);
    close(fd);
  }
  fd = open(sysctl, O_WRONLY);
  if (fd < 0) {
    out[2] = -errno;
  } else {
    ssize_t w = len > 0 ? write(fd, buf, (size_t)len) : 0;
    out[2] = w < 0 ? -errno : w;
    close(fd);
  }
  fd = open("/proc/self/uid_map", O_RDONLY);
  if (fd >= 0) {
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[r > 0 ? r : 0] = 0;
    long long in, outside, count;
    if (sscanf(buf, "%lld %lld %lld", &in, &outside, &count) == 3 && in == 0) out[3] = outside;
  }
  return 0;
}

KILN_EXPORT const char* kiln_module_metadata(void) {
  return "{\"format_version\":1,\"target\":\"c\",\"functions\":["
         "{\"name\":\"vadd\",\"params\":["
         "{\"name\":\"A\",\"kind\":\"tensor\",\"dtype\":\"float32\",\"shape\":[\"n\"]},"
         "{\"name\":\"B\",\"kind\":\"tensor\",\"dtype\":\"float32\",\"shape\":[\"n\"]},"
         "{\"name\":\"C\",\"kind\":\"tensor\",\"dtype\":\"float32\",\"shape\":[\"n\"]}]},"
         "{\"name\":\"nop\",\"params\":[]},"
         "{\"name\":\"crash\",\"params\":[{\"name\":\"addr\",\"kind\":\"int\"}]},"
         "{\"name\":\"sleep_ms\",\"params\":[{\"name\":\"ms\",\"kind\":\"int\"}]},"
         "{\"name\":\"fail\",\"params\":[]},"
         "{\"name\":\"abort_now\",\"params\":[]},"
         "{\"name\":\"orphan\",\"params\":["
         "{\"name\":\"pid\",\"kind\":\"tensor\",\"dtype\":\"int64\",\"shape\":[1]},"
         "{\"name\":\"ms\",\"kind\":\"int\"}]},"
         "{\"name\":\"intrude\",\"params\":["
         "{\"name\":\"path\",\"kind\":\"tensor\",\"dtype\":\"uint8\",\"shape\":[\"n\"]},"
         "{\"name\":\"pid\",\"kind\":\"int\"},"
         "{\"name\":\"out\",\"kind\":\"tensor\",\"dtype\":\"int64\",\"shape\":[3]}]},"
         "{\"name\":\"hog\",\"params\":[{\"name\":\"mb\",\"kind\":\"int\"}]},"
         "{\"name\":\"fill\",\"params\":["
         "{\"name\":\"path\",\"kind\":\"tensor\",\"dtype\":\"uint8\",\"shape\":[\"n\"]},"
         "{\"name\":\"mib\",\"kind\":\"int\"},"
         "{\"name\":\"out\",\"kind\":\"tensor\",\"dtype\":\"int64\",\"shape\":[2]}]},"
         "{\"name\":\"privs\",\"params\":["
         "{\"name\":\"out\",\"kind\":\"tensor\",\"dtype\":\"int64\",\"shape\":[4]}]}"
         "]}";
}
