package cpu

/*
#cgo CFLAGS: -I${SRCDIR}/../../abi
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include "pool.h"

// The loops pool_test.go runs: each records what ran where, so a test can
// tell whether every iteration ran once, which threads took part and how
// the pool behaved when a thread stalled, failed or launched again.
enum { CHECK_COUNT, CHECK_WAIT_CALLER, CHECK_STALL, CHECK_FAIL, CHECK_NESTED };

typedef struct {
  int mode;
  int64_t n;
  uint32_t* counts;    // runs of each iteration
  pthread_t caller;
  uint32_t caller_chunks;
  uint32_t worker_chunks;
  uint32_t iters_done;
  uint32_t stalling;   // a worker has taken the stalling chunk
  pthread_t staller;
  uint32_t staller_chunks;
  uint32_t timed_out;  // a bounded wait gave up
  uint32_t bad_nested; // an inner launch did not run at once on its caller
  int64_t fail_at;
  kiln_pool* pool;
} check_job;

static void check_sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

// check_wait waits (bounded: 10 s) until *flag >= want.
static int check_wait(uint32_t* flag, uint32_t want) {
  for (int i = 0; i < 100000; i++) {
    if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) >= want) return 1;
    check_sleep_us(100);
  }
  return 0;
}

typedef struct {
  pthread_t thread;
  uint32_t calls;
  int64_t begin, end;
} check_inner;

static int32_t check_inner_fn(int64_t begin, int64_t end, void* cl) {
  check_inner* in = cl;
  in->thread = pthread_self();
  in->calls++;
  in->begin = begin;
  in->end = end;
  return 0;
}

static int32_t check_fn(int64_t begin, int64_t end, void* cl) {
  check_job* j = cl;
  int on_caller = pthread_equal(pthread_self(), j->caller);
  __atomic_add_fetch(on_caller ? &j->caller_chunks : &j->worker_chunks, 1, __ATOMIC_SEQ_CST);
  switch (j->mode) {
  case CHECK_WAIT_CALLER:
    if (!on_caller && !check_wait(&j->caller_chunks, 1)) __atomic_store_n(&j->timed_out, 1, __ATOMIC_SEQ_CST);
    break;
  case CHECK_STALL: {
    uint32_t zero = 0;
    if (!on_caller && __atomic_compare_exchange_n(&j->stalling, &zero, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
      // This thread stalls, as if descheduled, until the others have
      // run every other iteration.
      j->staller = pthread_self();
      __atomic_store_n(&j->staller_chunks, 1, __ATOMIC_SEQ_CST);
      if (!check_wait(&j->iters_done, (uint32_t)(j->n - (end - begin)))) __atomic_store_n(&j->timed_out, 1, __ATOMIC_SEQ_CST);
    } else {
      if (__atomic_load_n(&j->stalling, __ATOMIC_SEQ_CST) && pthread_equal(pthread_self(), j->staller)) {
        __atomic_add_fetch(&j->staller_chunks, 1, __ATOMIC_SEQ_CST);
      }
      check_sleep_us(2000); // long enough for the workers to wake
    }
    break;
  }
  case CHECK_FAIL:
    if (begin <= j->fail_at && j->fail_at < end) return 7;
    break;
  case CHECK_NESTED: {
    check_inner in = {0};
    int32_t rc = kiln_pool_run(j->pool, check_inner_fn, &in, 10);
    if (rc != 0 || in.calls != 1 || !pthread_equal(in.thread, pthread_self()) || in.begin != 0 || in.end != 10) {
      __atomic_store_n(&j->bad_nested, 1, __ATOMIC_SEQ_CST);
    }
    break;
  }
  }
  for (int64_t i = begin; i < end; i++) __atomic_add_fetch(&j->counts[i], 1, __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&j->iters_done, (uint32_t)(end - begin), __ATOMIC_SEQ_CST);
  return 0;
}

static int32_t check_run(kiln_pool* p, check_job* j) {
  j->caller = pthread_self();
  j->pool = p;
  return kiln_pool_run(p, check_fn, j, j->n);
}

// check_pin_one pins the calling thread to the first CPU of its mask and
// stores the old mask in *old.
static int check_pin_one(cpu_set_t* old) {
  if (sched_getaffinity(0, sizeof *old, old) != 0) return -1;
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (CPU_ISSET(c, old)) {
      CPU_SET(c, &one);
      break;
    }
  }
  return sched_setaffinity(0, sizeof one, &one);
}

static int check_unpin(cpu_set_t* old) { return sched_setaffinity(0, sizeof *old, old); }
*/
import "C"

import (
	"errors"
	"runtime"
	"time"
	"unsafe"
)

// checkMode is what poolCheck's loop does in each chunk.
type checkMode int

const (
	checkCount      checkMode = C.CHECK_COUNT       // count the iterations
	checkWaitCaller checkMode = C.CHECK_WAIT_CALLER // workers wait until the caller has run a chunk
	checkStall      checkMode = C.CHECK_STALL       // one worker stalls in its first chunk until the rest is done
	checkFail       checkMode = C.CHECK_FAIL        // the chunk with iteration failAt returns 7
	checkNested     checkMode = C.CHECK_NESTED      // each chunk launches an inner loop on the same pool
)

// poolCheck is what one run of poolCheckRun saw.
type poolCheck struct {
	rc            int32
	counts        []uint32 // runs of each iteration
	workers       int      // worker threads the pool started
	callerChunks  int
	workerChunks  int
	stallerChunks int  // chunks the stalled worker ran (checkStall)
	timedOut      bool // a chunk's bounded wait gave up
	badNested     bool // an inner launch did not run serially on its caller
}

// poolCheckRun makes a pool of threads threads that spins for spin, runs a
// loop of n iterations in mode on it, and frees it. With pinOne the pool
// and the caller are confined to one CPU.
func poolCheckRun(threads int, spin time.Duration, n int64, mode checkMode, failAt int64, pinOne bool) (poolCheck, error) {
	if pinOne {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var old C.cpu_set_t
		if C.check_pin_one(&old) != 0 {
			return poolCheck{}, errors.New("cannot pin the thread to one CPU")
		}
		defer C.check_unpin(&old)
	}
	counts := (*C.uint32_t)(C.calloc(C.size_t(max(n, 1)), 4))
	defer C.free(unsafe.Pointer(counts))
	j := (*C.check_job)(C.calloc(1, C.size_t(unsafe.Sizeof(C.check_job{}))))
	defer C.free(unsafe.Pointer(j))
	j.mode = C.int(mode)
	j.n = C.int64_t(n)
	j.counts = counts
	j.fail_at = C.int64_t(failAt)
	p := C.kiln_pool_new(C.int(threads), C.int64_t(spin.Nanoseconds()))
	if p == nil {
		return poolCheck{}, errors.New("kiln_pool_new failed")
	}
	defer C.kiln_pool_free(p)
	rc := C.check_run(p, j)
	out := poolCheck{
		rc: int32(rc), workers: int(C.kiln_pool_workers(p)),
		callerChunks: int(j.caller_chunks), workerChunks: int(j.worker_chunks), stallerChunks: int(j.staller_chunks),
		timedOut: j.timed_out != 0, badNested: j.bad_nested != 0,
	}
	out.counts = make([]uint32, n)
	copy(out.counts, unsafe.Slice((*uint32)(unsafe.Pointer(counts)), n))
	return out, nil
}
