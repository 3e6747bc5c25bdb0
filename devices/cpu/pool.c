/*
 * pool.c — kiln's thread pool for the parallel loops of CPU modules.
 *
 * A launch splits [0, n) into chunks (about kChunksPerThread per thread, one
 * iteration each when n is smaller) which the caller and the workers claim
 * one at a time from a shared counter: a thread the OS deschedules delays
 * only the chunk it holds, and the others take the rest. The caller runs
 * chunks too, then waits for the chunks others hold. Idle workers spin for a
 * bounded time (spin_ns), so that back-to-back kernels find them awake, then
 * sleep on a futex: between kernels they take no CPU from other processes.
 *
 * The claim counter holds the launch's generation in its high 32 bits and the
 * next chunk in its low 32 bits. A launch first closes the counter, then
 * writes the job, then opens the counter at chunk 0 of the new generation; a
 * worker reads the counter, then the job, then claims with a compare-and-swap
 * on the value it read, so a claim succeeds only for the job it read.
 *
 * A launch from a thread that is running a chunk (a nested parallel loop), or
 * while another thread's launch holds the pool, runs serially on its caller.
 *
 * Portable C11 with GCC atomics; Linux futexes (a mutex and condition
 * variable elsewhere).
 */
#define _GNU_SOURCE
#include "pool.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

enum { kChunksPerThread = 4 };

#define CLOSED 0xffffffffu

/* The words that different threads write live on cache lines of their own,
 * apart from the job, which workers only read. */
#define LINE _Alignas(64)

struct kiln_pool {
  int nworkers;
  int64_t spin_ns;
  pthread_t* workers;
  uint32_t gen; /* the launching thread's generation counter */

  /* The job; written by the launching thread while the counter is closed. */
  LINE KilnParallelFunc fn;
  void* closure;
  int64_t n;
  int64_t chunk;
  uint32_t nchunks;

  LINE uint64_t claim; /* generation << 32 | next chunk */
  LINE uint32_t done;  /* chunks finished; the caller's futex word */
  uint32_t caller_waiting;
  LINE uint32_t abort; /* a chunk failed: later chunks are skipped */
  int32_t rc;          /* the first failure */
  LINE uint32_t epoch; /* bumped by each launch; the workers' futex word */
  LINE uint32_t sleepers;
  LINE uint32_t busy; /* a launch holds the pool */
  uint32_t stop;
};

/* Set on a thread while it runs chunks (for life on workers). */
static __thread int kiln_in_parallel;

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield" ::: "memory");
#elif defined(__riscv)
  __asm__ __volatile__(".insn i 0x0F, 0, x0, x0, 0x010" ::: "memory"); /* pause */
#endif
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#ifdef __linux__
static void futex_wait(uint32_t* addr, uint32_t val) {
  syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}
static void futex_wake(uint32_t* addr, int count) {
  syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}
#else
static pthread_mutex_t futex_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t futex_cv = PTHREAD_COND_INITIALIZER;
static void futex_wait(uint32_t* addr, uint32_t val) {
  pthread_mutex_lock(&futex_mu);
  if (__atomic_load_n(addr, __ATOMIC_SEQ_CST) == val) pthread_cond_wait(&futex_cv, &futex_mu);
  pthread_mutex_unlock(&futex_mu);
}
static void futex_wake(uint32_t* addr, int count) {
  (void)addr;
  (void)count;
  pthread_mutex_lock(&futex_mu);
  pthread_cond_broadcast(&futex_cv);
  pthread_mutex_unlock(&futex_mu);
}
#endif

/* spin_until_change spins while *addr == val, for up to spin_ns; it reports
 * whether the value changed. */
static int spin_until_change(const uint32_t* addr, uint32_t val, int64_t spin_ns) {
  if (spin_ns <= 0) return __atomic_load_n(addr, __ATOMIC_ACQUIRE) != val;
  int64_t deadline = now_ns() + spin_ns;
  for (;;) {
    for (int i = 0; i < 64; i++) {
      if (__atomic_load_n(addr, __ATOMIC_ACQUIRE) != val) return 1;
      cpu_relax();
    }
    if (now_ns() >= deadline) return 0;
  }
}

/* finish adds the chunks a thread ran to the job's count, waking the caller
 * when they were the last. */
static void finish(kiln_pool* p, uint32_t ran, uint32_t nchunks) {
  if (ran == 0) return;
  if (__atomic_add_fetch(&p->done, ran, __ATOMIC_SEQ_CST) == nchunks &&
      __atomic_load_n(&p->caller_waiting, __ATOMIC_SEQ_CST)) {
    futex_wake(&p->done, 1);
  }
}

/* participate claims and runs chunks until none of the current job is left.
 * It reads the job again only when the generation changes: a claim that
 * succeeds for the generation the job was read under is a chunk of it. */
static void participate(kiln_pool* p) {
  uint64_t w = __atomic_load_n(&p->claim, __ATOMIC_ACQUIRE);
  uint32_t gen = 0, nchunks = 0, ran = 0;
  int have = 0;
  KilnParallelFunc fn = NULL;
  void* closure = NULL;
  int64_t n = 0, chunk = 0;
  for (;;) {
    uint32_t idx = (uint32_t)w;
    if (!have || (uint32_t)(w >> 32) != gen) {
      finish(p, ran, nchunks);
      ran = 0;
      if (idx == CLOSED) return;
      nchunks = __atomic_load_n(&p->nchunks, __ATOMIC_ACQUIRE);
      fn = __atomic_load_n(&p->fn, __ATOMIC_ACQUIRE);
      closure = __atomic_load_n(&p->closure, __ATOMIC_ACQUIRE);
      n = __atomic_load_n(&p->n, __ATOMIC_ACQUIRE);
      chunk = __atomic_load_n(&p->chunk, __ATOMIC_ACQUIRE);
      gen = (uint32_t)(w >> 32);
      have = 1;
    }
    if (idx >= nchunks) break;
    if (!__atomic_compare_exchange_n(&p->claim, &w, w + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)) {
      /* w now holds the counter's value: maybe a newer generation, whose
       * job the next round reads; but what was read under a closed or
       * newer counter is not trusted. */
      if ((uint32_t)(w >> 32) != gen) have = 0;
      continue;
    }
    int64_t begin = (int64_t)idx * chunk;
    int64_t end = begin + chunk < n ? begin + chunk : n;
    if (!__atomic_load_n(&p->abort, __ATOMIC_ACQUIRE)) {
      int32_t rc = fn(begin, end, closure);
      if (rc != 0) {
        int32_t zero = 0;
        __atomic_compare_exchange_n(&p->rc, &zero, rc, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
        __atomic_store_n(&p->abort, 1, __ATOMIC_RELEASE);
      }
    }
    ran++;
    w = __atomic_load_n(&p->claim, __ATOMIC_ACQUIRE);
  }
  finish(p, ran, nchunks);
}

static void* worker_main(void* arg) {
  kiln_pool* p = arg;
  kiln_in_parallel = 1;
  uint32_t seen = 0; /* the epoch the pool started with, whenever this thread starts */
  for (;;) {
    if (!spin_until_change(&p->epoch, seen, p->spin_ns)) {
      __atomic_add_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
      while (__atomic_load_n(&p->epoch, __ATOMIC_SEQ_CST) == seen) futex_wait(&p->epoch, seen);
      __atomic_sub_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
    }
    if (__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) return NULL;
    seen = __atomic_load_n(&p->epoch, __ATOMIC_ACQUIRE);
    participate(p);
  }
}

kiln_pool* kiln_pool_new(int threads, int64_t spin_ns) {
  kiln_pool* p = NULL;
  if (posix_memalign((void**)&p, 64, sizeof *p) != 0) return NULL;
  memset(p, 0, sizeof *p);
  p->spin_ns = spin_ns;
  p->claim = CLOSED;
  if (threads < 1) threads = 1;
  p->workers = calloc((size_t)threads, sizeof(pthread_t));
  if (p->workers == NULL) {
    free(p);
    return NULL;
  }
  /* Workers take no signals: the process's handlers (Go's) run elsewhere. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  for (int i = 0; i < threads - 1; i++) {
    if (pthread_create(&p->workers[p->nworkers], NULL, worker_main, p) != 0) break;
    p->nworkers++;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return p;
}

void kiln_pool_free(kiln_pool* p) {
  if (p == NULL) return;
  __atomic_store_n(&p->stop, 1, __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&p->epoch, 1, __ATOMIC_SEQ_CST);
  futex_wake(&p->epoch, INT_MAX);
  for (int i = 0; i < p->nworkers; i++) pthread_join(p->workers[i], NULL);
  free(p->workers);
  free(p);
}

int kiln_pool_workers(const kiln_pool* p) { return p ? p->nworkers : 0; }

static int32_t run_serial(KilnParallelFunc fn, void* closure, int64_t n) {
  int outer = kiln_in_parallel;
  kiln_in_parallel = 1;
  int32_t rc = fn(0, n, closure);
  kiln_in_parallel = outer;
  return rc;
}

int32_t kiln_pool_run(kiln_pool* p, KilnParallelFunc fn, void* closure, int64_t n) {
  if (n <= 0) return 0;
  uint32_t free_ = 0;
  if (p == NULL || p->nworkers == 0 || n == 1 || kiln_in_parallel ||
      !__atomic_compare_exchange_n(&p->busy, &free_, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
    return run_serial(fn, closure, n);
  }
  int64_t threads = (int64_t)p->nworkers + 1;
  int64_t want = threads * kChunksPerThread;
  int64_t chunk = n <= want ? 1 : (n + want - 1) / want;
  uint32_t nchunks = (uint32_t)((n + chunk - 1) / chunk);

  uint64_t gen = ++p->gen;
  __atomic_exchange_n(&p->claim, gen << 32 | CLOSED, __ATOMIC_SEQ_CST);
  __atomic_store_n(&p->done, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&p->abort, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&p->rc, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&p->fn, fn, __ATOMIC_RELEASE);
  __atomic_store_n(&p->closure, closure, __ATOMIC_RELEASE);
  __atomic_store_n(&p->n, n, __ATOMIC_RELEASE);
  __atomic_store_n(&p->chunk, chunk, __ATOMIC_RELEASE);
  __atomic_store_n(&p->nchunks, nchunks, __ATOMIC_RELEASE);
  __atomic_store_n(&p->claim, gen << 32, __ATOMIC_SEQ_CST);

  __atomic_add_fetch(&p->epoch, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST) > 0) {
    int wake = (int)(nchunks - 1 < (uint32_t)p->nworkers ? nchunks - 1 : (uint32_t)p->nworkers);
    futex_wake(&p->epoch, wake);
  }

  kiln_in_parallel = 1;
  participate(p);
  kiln_in_parallel = 0;

  /* Wait for the chunks other threads hold. */
  uint32_t d;
  while ((d = __atomic_load_n(&p->done, __ATOMIC_ACQUIRE)) != nchunks) {
    if (spin_until_change(&p->done, d, p->spin_ns)) continue;
    __atomic_store_n(&p->caller_waiting, 1, __ATOMIC_SEQ_CST);
    d = __atomic_load_n(&p->done, __ATOMIC_SEQ_CST);
    if (d != nchunks) futex_wait(&p->done, d);
    __atomic_store_n(&p->caller_waiting, 0, __ATOMIC_SEQ_CST);
  }
  int32_t rc = __atomic_load_n(&p->rc, __ATOMIC_ACQUIRE);
  __atomic_store_n(&p->busy, 0, __ATOMIC_RELEASE);
  return rc;
}

/* The process pool, started by the first launch. */
static int proc_threads = 1;
static int64_t proc_spin_ns = 0;
static kiln_pool* proc_pool;
static pthread_once_t proc_once = PTHREAD_ONCE_INIT;

void kiln_pool_configure(int threads, int64_t spin_ns) {
  proc_threads = threads;
  proc_spin_ns = spin_ns;
}

static void proc_start(void) { proc_pool = kiln_pool_new(proc_threads, proc_spin_ns); }

int32_t kiln_pool_launch(KilnParallelFunc fn, void* closure, int64_t n) {
  if (n <= 0) return 0;
  if (n == 1 || kiln_in_parallel) return run_serial(fn, closure, n);
  pthread_once(&proc_once, proc_start);
  return kiln_pool_run(proc_pool, fn, closure, n);
}

void kiln_pool_set_launch(void* slot) {
  __atomic_store_n((KilnParallelLaunch*)slot, kiln_pool_launch, __ATOMIC_RELEASE);
}
