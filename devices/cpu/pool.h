/*
 * pool.h — the thread pool that runs the parallel loops of CPU modules.
 *
 * One pool per process runs every loaded module's loops (the loader points
 * each module's kiln_parallel_launch at kiln_pool_launch). See pool.c for how
 * a launch splits, claims and waits.
 */
#ifndef KILN_POOL_H_
#define KILN_POOL_H_

#include <stdint.h>

#include "kiln_abi.h"

typedef struct kiln_pool kiln_pool;

/* kiln_pool_new makes a pool that runs loops on threads threads in all: the
 * caller of a launch and threads-1 workers, started at once. Idle workers
 * spin for spin_ns nanoseconds, then sleep. NULL when out of memory. */
kiln_pool* kiln_pool_new(int threads, int64_t spin_ns);

/* kiln_pool_free stops and joins the workers. No launch may be running. */
void kiln_pool_free(kiln_pool* p);

/* kiln_pool_run runs fn over [0, n) on p (see kiln_abi.h's KilnParallelLaunch). */
int32_t kiln_pool_run(kiln_pool* p, KilnParallelFunc fn, void* closure, int64_t n);

/* kiln_pool_workers is the number of worker threads p started. */
int kiln_pool_workers(const kiln_pool* p);

/* kiln_pool_configure sizes the process pool; it takes effect only before
 * the first kiln_pool_launch, which starts the pool. */
void kiln_pool_configure(int threads, int64_t spin_ns);

/* kiln_pool_launch runs fn over [0, n) on the process pool. */
int32_t kiln_pool_launch(KilnParallelFunc fn, void* closure, int64_t n);

/* kiln_pool_set_launch stores kiln_pool_launch in a module's
 * kiln_parallel_launch variable (slot). */
void kiln_pool_set_launch(void* slot);

#endif /* KILN_POOL_H_ */
