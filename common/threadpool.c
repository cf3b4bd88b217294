/* threadpool.c — persistent pthread pool (see threadpool.h). A generation counter under one mutex
 * starts a job; a countdown of unfinished workers ends it. Condition variables rather than spinning,
 * because the CI machine shares its few cores with other processes.
 */
#include "threadpool.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

struct kvs_threadpool {
    int n;                 /* workers including the caller */
    pthread_t *threads;    /* [n - 1] */
    int started;           /* threads successfully created */
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    uint64_t generation;   /* incremented per job */
    int unfinished;        /* workers (other than the caller) still running the current job */
    int stop;
    kvs_threadpool_fn fn;
    void *ctx;
};

typedef struct {
    kvs_threadpool *pool;
    int index;
} worker_arg;

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    kvs_threadpool *p = wa.pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->cv_job, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        kvs_threadpool_fn fn = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        fn(ctx, wa.index, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->unfinished == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

kvs_status kvs_threadpool_create(int n_threads, kvs_threadpool **out) {
    *out = NULL;
    if (n_threads <= 0) n_threads = kvs_n_cpus();
    if (n_threads > 1024) return kvs_fail(KVS_ERR_INVALID_ARG, "threads: %d is more than 1024", n_threads);
    kvs_threadpool *p = calloc(1, sizeof *p);
    if (!p) return kvs_fail(KVS_ERR_NOMEM, "threadpool: out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_job, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            kvs_threadpool_free(p);
            return kvs_fail(KVS_ERR_NOMEM, "threadpool: out of memory");
        }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (wa) {
                wa->pool = p;
                wa->index = i;
            }
            if (!wa || pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
                free(wa);
                kvs_threadpool_free(p);
                return kvs_fail(KVS_ERR_NOMEM, "threadpool: cannot start worker thread %d of %d", i, n_threads);
            }
            p->started++;
        }
    }
    *out = p;
    return KVS_OK;
}

void kvs_threadpool_free(kvs_threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv_job);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->started; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_job);
    pthread_cond_destroy(&p->cv_done);
    free(p->threads);
    free(p);
}

int kvs_threadpool_size(const kvs_threadpool *p) { return p ? p->n : 1; }

void kvs_threadpool_run(kvs_threadpool *p, kvs_threadpool_fn fn, void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->unfinished = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->cv_job);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    pthread_mutex_lock(&p->mu);
    while (p->unfinished > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
