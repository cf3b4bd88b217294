/* kvs_peak.c — the machine's measured FMA peak and read bandwidth (kvs_peak.h), the yardsticks `make bench`
 * reports against (sim/BENCH.md). The FMA loops are one per instruction set, compiled with
 * __attribute__((target)) and run only after a CPU check, so the default build (no ISA flags) still measures the
 * widest units the machine has. Both probes run one share per worker of a common/threadpool.h pool: neither
 * needs a thread of its own or a pinned core (each worker times itself; the read probe lines its workers up
 * with a barrier, which opens because every worker of a pool runs the job at once).
 */
#include "kvs_peak.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvs.h"
#include "threadpool.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVS_PEAK_X86 1
#endif

/* Inner repetitions between clock reads: 12 accumulators x 4096 = 49152 vector FMAs (~10-30 us). */
#define PEAK_INNER 4096

/* Each loop: 12 independent dependency chains (more than latency x throughput = 4 x 2 on current cores), acc =
 * acc * b + c with b slightly below 1 so the values stay finite; returns vector FMAs done and the sum to keep the
 * loop alive. */
#ifdef KVS_PEAK_X86
#define PEAK_LOOP_BODY(VT, SET1, FMA, ADD, STORE, LANES)                                                    \
    VT b = SET1(0.999999f), c = SET1(1e-7f);                                                                \
    VT a0 = SET1(1.0f), a1 = SET1(1.1f), a2 = SET1(1.2f), a3 = SET1(1.3f), a4 = SET1(1.4f), a5 = SET1(1.5f); \
    VT a6 = SET1(1.6f), a7 = SET1(1.7f), a8 = SET1(1.8f), a9 = SET1(1.9f), a10 = SET1(2.0f), a11 = SET1(2.1f); \
    double t0 = kvs_now_s();                                                                                \
    long reps = 0;                                                                                          \
    do {                                                                                                    \
        for (int i = 0; i < PEAK_INNER; i++) {                                                              \
            a0 = FMA(a0, b, c);                                                                             \
            a1 = FMA(a1, b, c);                                                                             \
            a2 = FMA(a2, b, c);                                                                             \
            a3 = FMA(a3, b, c);                                                                             \
            a4 = FMA(a4, b, c);                                                                             \
            a5 = FMA(a5, b, c);                                                                             \
            a6 = FMA(a6, b, c);                                                                             \
            a7 = FMA(a7, b, c);                                                                             \
            a8 = FMA(a8, b, c);                                                                             \
            a9 = FMA(a9, b, c);                                                                             \
            a10 = FMA(a10, b, c);                                                                           \
            a11 = FMA(a11, b, c);                                                                           \
        }                                                                                                   \
        reps++;                                                                                             \
    } while (kvs_now_s() - t0 < seconds);                                                                   \
    *elapsed = kvs_now_s() - t0;                                                                            \
    VT s = ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7)));                               \
    s = ADD(s, ADD(ADD(a8, a9), ADD(a10, a11)));                                                            \
    float out[16];                                                                                          \
    STORE(out, s);                                                                                          \
    *sink = out[0];                                                                                         \
    return (double)reps * PEAK_INNER * 12.0 * LANES;

static inline __m128 sse_muladd(__m128 a, __m128 b, __m128 c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }
static double loop_sse2(double seconds, double *elapsed, float *sink) {
    PEAK_LOOP_BODY(__m128, _mm_set1_ps, sse_muladd, _mm_add_ps, _mm_storeu_ps, 4)
}

__attribute__((target("avx2,fma"))) static double loop_avx2(double seconds, double *elapsed, float *sink) {
    PEAK_LOOP_BODY(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps, 8)
}

__attribute__((target("avx512f"))) static double loop_avx512(double seconds, double *elapsed, float *sink) {
    PEAK_LOOP_BODY(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps, 16)
}
#endif

int kvs_peak_isa_available(kvs_peak_isa isa) {
#ifdef KVS_PEAK_X86
    __builtin_cpu_init();
    switch (isa) {
    case KVS_PEAK_SSE2:
        return 1;
    case KVS_PEAK_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case KVS_PEAK_AVX512:
        return __builtin_cpu_supports("avx512f");
    case KVS_PEAK_COUNT:
        break;
    }
#else
    (void)isa;
#endif
    return 0;
}

const char *kvs_peak_isa_name(kvs_peak_isa isa) {
    static const char *const names[KVS_PEAK_COUNT] = {"sse2", "avx2+fma", "avx512f"};
    return isa < KVS_PEAK_COUNT ? names[isa] : "?";
}

/* One worker's share of a probe and what it measured. */
typedef struct {
    double fma, elapsed;    /* FMA probe: vector FMAs done and the seconds they took */
    float sink;             /* keeps the loops' results alive */
    const float *buf;       /* read probe: this worker's part of the buffer */
    size_t n;               /* floats */
    double best;            /* read probe: fastest pass, seconds */
} peak_share;

typedef struct {
    kvs_peak_isa isa;
    double seconds;         /* FMA probe: how long each worker runs its loop */
    int reps;               /* read probe: timed passes after the warm-up */
    pthread_barrier_t *bar; /* read probe: the workers start and end every pass together */
    peak_share *share;      /* [workers] */
} peak_job;

static void fma_worker(void *arg, int worker, int n_workers) {
    (void)n_workers;
    peak_job *job = arg;
    peak_share *w = &job->share[worker];
#ifdef KVS_PEAK_X86
    if (job->isa == KVS_PEAK_AVX512) w->fma = loop_avx512(job->seconds, &w->elapsed, &w->sink);
    else if (job->isa == KVS_PEAK_AVX2) w->fma = loop_avx2(job->seconds, &w->elapsed, &w->sink);
    else w->fma = loop_sse2(job->seconds, &w->elapsed, &w->sink);
#else
    (void)w;
#endif
}

double kvs_peak_fma(kvs_peak_isa isa, int threads, double seconds) {
    if (threads < 1 || !kvs_peak_isa_available(isa)) return 0;
    kvs_threadpool *pool = NULL;
    peak_share *share = calloc((size_t)threads, sizeof *share);
    double total = 0;
    if (share && kvs_threadpool_create(threads, &pool) == KVS_OK) {
        peak_job job = {.isa = isa, .seconds = seconds, .share = share};
        kvs_threadpool_run(pool, fma_worker, &job);
        for (int i = 0; i < threads; i++)
            if (share[i].elapsed > 0) total += share[i].fma / share[i].elapsed;
    }
    kvs_threadpool_free(pool);
    free(share);
    return total;
}

/* Sum of a part of the buffer, 8 independent float sums (the compiler vectorises it with SSE2). */
static float sum_floats(const float *x, size_t n) {
    float s[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += x[i + (size_t)k];
    for (; i < n; i++) s[0] += x[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static void read_worker(void *arg, int worker, int n_workers) {
    (void)n_workers;
    peak_job *job = arg;
    peak_share *w = &job->share[worker];
    w->best = 1e30;
    for (int r = 0; r <= job->reps; r++) {
        pthread_barrier_wait(job->bar);
        double t0 = kvs_now_s();
        w->sink += sum_floats(w->buf, w->n);
        double el = kvs_now_s() - t0;
        pthread_barrier_wait(job->bar);
        if (r > 0 && el < w->best) w->best = el; /* pass 0 warms up (page faults) */
    }
}

double kvs_peak_read_bandwidth(size_t bytes, int threads, int reps) {
    if (threads < 1 || reps < 1) return 0;
    size_t n = bytes / sizeof(float);
    float *buf = malloc(n * sizeof *buf);
    peak_share *share = calloc((size_t)threads, sizeof *share);
    kvs_threadpool *pool = NULL;
    pthread_barrier_t bar;
    double bw = 0;
    if (buf && share && kvs_threadpool_create(threads, &pool) == KVS_OK &&
        pthread_barrier_init(&bar, NULL, (unsigned)threads) == 0) {
        for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 1023) * 1e-3f;
        size_t per = n / (size_t)threads;
        for (int i = 0; i < threads; i++) share[i] = (peak_share){.buf = buf + (size_t)i * per, .n = per};
        peak_job job = {.reps = reps, .bar = &bar, .share = share};
        kvs_threadpool_run(pool, read_worker, &job);
        double slowest = 0;
        for (int i = 0; i < threads; i++)
            if (share[i].best > slowest) slowest = share[i].best;
        bw = (double)(per * (size_t)threads * sizeof(float)) / slowest;
        pthread_barrier_destroy(&bar);
    }
    kvs_threadpool_free(pool);
    free(buf);
    free(share);
    return bw;
}
