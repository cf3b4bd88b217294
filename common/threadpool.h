/* threadpool.h — a persistent pthread pool, shared by the CPU reference forward pass (matrix-vector
 * products, per-head attention) and the trace writer (compressing a block's chunks). Workers are created once and sleep on a condition variable between jobs,
 * so a decode step pays a wake-up per parallel section, not a thread creation.
 *
 * A job is fn(ctx, worker, n_workers) run once on every worker (the calling thread is worker 0); each
 * worker picks its own static share of the work from its index, so results never depend on timing.
 * A pool belongs to one thread at a time (kvs_threadpool_run is not reentrant); successive runs may
 * come from different threads.
 */
#ifndef KVS_THREADPOOL_H
#define KVS_THREADPOOL_H

#include "kvs.h"

typedef struct kvs_threadpool kvs_threadpool;

typedef void (*kvs_threadpool_fn)(void *ctx, int worker, int n_workers);

/*! kvs_threadpool_create() : a pool of n_threads workers in total (the caller counts as one, so
 *  n_threads - 1 threads are started); n_threads <= 0 means kvs_n_cpus(). Caller frees with
 *  kvs_threadpool_free. @return KVS_OK, KVS_ERR_INVALID_ARG (n_threads > 1024) or KVS_ERR_NOMEM. */
kvs_status kvs_threadpool_create(int n_threads, kvs_threadpool **out);

/*! kvs_threadpool_free() : stops and joins the workers. Accepts NULL. */
void kvs_threadpool_free(kvs_threadpool *p);

/*! kvs_threadpool_size() : number of workers (>= 1); 1 for a NULL pool. */
int kvs_threadpool_size(const kvs_threadpool *p);

/*! kvs_threadpool_run() : runs fn on every worker and returns when all have finished. With a NULL pool
 *  (or one worker) fn(ctx, 0, 1) runs on the caller. */
void kvs_threadpool_run(kvs_threadpool *p, kvs_threadpool_fn fn, void *ctx);

#endif /* KVS_THREADPOOL_H */
