/* matmul.c — tiled, multi-threaded Y = X W^T (+ b) over fp32 / fp16 / bf16 weights for the CPU forward pass; see
 * matmul.h for the arithmetic contract (an element's value depends only on its x row, its w row and the instruction
 * set) and the dispatch.
 *
 * Loop nest, per worker (the workers split the output rows in groups of MR weight rows):
 *   for each chunk of KVS_GEMM_KC columns (the block's X chunk, n x KC floats, stays in L2 for all groups: with
 *   the group loop outside, a 4 MB X of the down projection was streamed from L3 once per group, 0.6x the speed;
 *   a small X, as in decode, takes the group loop outside instead: run_passes),
 *     for each group of MR weight rows:
 *       widen the group's chunk to fp32 into a MR x KC buffer on the stack (L1-resident; fp32 weights are read in
 *       place instead), then for each tile of NR positions: NR x MR accumulators over the chunk, one vector FMA
 *       chain each, reduced to NR x MR sums that are added to Y in chunk order.
 * The widened tile is reused by every position of the block: one conversion and one read of each weight per block.
 */
#include "matmul.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- conversions ---- */

static void widen_scalar(kvs_dtype dt, const void *src, size_t n, float *dst) {
    if (dt == KVS_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = (uint16_t)(p[2 * i] | (p[2 * i + 1] << 8));
        dst[i] = dt == KVS_DTYPE_BF16 ? kvs_bf16_to_f32(h) : kvs_f16_to_f32(h);
    }
}

void kvs_wmat_row_f32(kvs_wmat w, size_t cols, size_t r, float *dst) {
    widen_scalar(w.dtype, (const uint8_t *)w.data + r * cols * kvs_dtype_size(w.dtype), cols, dst);
}

/* ---- the work split, shared by every instruction set ---- */

typedef struct {
    const float *x;
    size_t ldx;
    int n, cols;
    const kvs_gemm_out *outs;
    int n_outs;
    int mr;      /* weight rows per group of the active kernel */
    long groups; /* row groups over all outputs */
} gemm_job;

/* Adds chunk sums s[i][j] (i < nr, j < mr) into y; `first` stores instead of adding. */
static void store_tile(const kvs_gemm_out *o, int i0, int nr, int r0, int mr, const float *s, int stride, int first) {
    for (int i = 0; i < nr; i++) {
        float *y = o->y + (size_t)(i0 + i) * o->ldy + (size_t)r0;
        for (int j = 0; j < mr; j++) y[j] = first ? s[i * stride + j] : y[j] + s[i * stride + j];
    }
}

static void add_bias(const kvs_gemm_out *o, int n, int r0, int mr) {
    if (!o->bias) return;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < mr; j++) o->y[(size_t)i * o->ldy + (size_t)(r0 + j)] += o->bias[r0 + j];
}

/* Group index -> (output, first row, rows). */
static const kvs_gemm_out *group_at(const gemm_job *job, long g, int *r0, int *mr) {
    *r0 = *mr = 0;
    for (int j = 0; j < job->n_outs; j++) {
        long ng = (job->outs[j].rows + job->mr - 1) / job->mr;
        if (g < ng) {
            *r0 = (int)g * job->mr;
            *mr = job->outs[j].rows - *r0 < job->mr ? job->outs[j].rows - *r0 : job->mr;
            return &job->outs[j];
        }
        g -= ng;
    }
    return NULL;
}

/* Row stride of the widened tile: a cache line past KC, so that its rows (4 KB apart otherwise) do not all fall
 * into the same L1 sets. */
#define BUF_LD (KVS_GEMM_KC + 16)

/* The rows of a group as fp32 pointers for the chunk at column k0: in place for fp32 weights, else widened into
 * buf [mr][BUF_LD]. Rows past mr repeat row 0 (computed, never stored). */
static void chunk_rows(const kvs_wmat *w, int cols, int r0, int mr, int MR, int k0, int kl, float *buf,
                       const float **rows, void (*widen)(kvs_dtype, const void *, size_t, float *)) {
    size_t esz = kvs_dtype_size(w->dtype);
    for (int j = 0; j < mr; j++) {
        const uint8_t *src = (const uint8_t *)w->data + ((size_t)(r0 + j) * (size_t)cols + (size_t)k0) * esz;
        if (w->dtype == KVS_DTYPE_F32) {
            rows[j] = (const float *)(const void *)src;
        } else {
            widen(w->dtype, src, (size_t)kl, buf + (size_t)j * BUF_LD);
            rows[j] = buf + (size_t)j * BUF_LD;
        }
    }
    for (int j = mr; j < MR; j++) rows[j] = rows[0];
}

/* ---- scalar reference: 8 partial sums per element per chunk ---- */

#define MR_SCALAR 4

static float dot8(const float *a, const float *b, int n) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
    for (; i < n; i++) s[i & 7] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* The order of a worker's (chunk, group) passes: chunks outside groups when the block's X is large (its chunk then
 * stays in L2 for all groups), groups outside chunks when it is small, as in decode (each weight row is then read
 * from memory in one sequential run). Either way every element's chunk sums are added in ascending chunk order, so
 * the order changes the speed only. */
#define X_SMALL_BYTES ((size_t)512 << 10)

typedef void (*pass_fn)(const gemm_job *job, long g, int k0, void *scratch);

static void run_passes(const gemm_job *job, int worker, int n_workers, pass_fn pass, void *scratch) {
    long g0 = job->groups * worker / n_workers, g1 = job->groups * (worker + 1) / n_workers;
    if ((size_t)job->n * (size_t)job->cols * sizeof(float) <= X_SMALL_BYTES) {
        for (long g = g0; g < g1; g++)
            for (int k0 = 0; k0 < job->cols; k0 += KVS_GEMM_KC) pass(job, g, k0, scratch);
    } else {
        for (int k0 = 0; k0 < job->cols; k0 += KVS_GEMM_KC)
            for (long g = g0; g < g1; g++) pass(job, g, k0, scratch);
    }
}

static void pass_scalar(const gemm_job *job, long g, int k0, void *scratch) {
    float *buf = scratch;
    const float *rows[MR_SCALAR];
    float s[MR_SCALAR];
    int kl = job->cols - k0 < KVS_GEMM_KC ? job->cols - k0 : KVS_GEMM_KC;
    int r0 = 0, mr = 0;
    const kvs_gemm_out *o = group_at(job, g, &r0, &mr);
    chunk_rows(&o->w, job->cols, r0, mr, MR_SCALAR, k0, kl, buf, rows, widen_scalar);
    for (int i = 0; i < job->n; i++) {
        const float *x = job->x + (size_t)i * job->ldx + (size_t)k0;
        for (int j = 0; j < mr; j++) s[j] = dot8(x, rows[j], kl);
        store_tile(o, i, 1, r0, mr, s, MR_SCALAR, k0 == 0);
    }
    if (k0 + kl == job->cols) add_bias(o, job->n, r0, mr);
}

static void worker_scalar(void *ctx, int worker, int n_workers) {
    float buf[MR_SCALAR * BUF_LD];
    run_passes(ctx, worker, n_workers, pass_scalar, buf);
}

/* ---- x86-64 vector kernels ---- */

#if defined(__x86_64__) && defined(__GNUC__)
#define KVS_HAVE_GEMM_X86 1
#include <cpuid.h>
#include <immintrin.h>

#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define T_512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl")))
#define INLINE inline __attribute__((always_inline))

T_AVX2 static void widen_avx2(kvs_dtype dt, const void *src, size_t n, float *dst) {
    const uint8_t *p = src;
    size_t i = 0;
    if (dt == KVS_DTYPE_BF16) {
        for (; i + 8 <= n; i += 8) {
            __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 2 * i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
        }
    } else if (dt == KVS_DTYPE_F16) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 2 * i))));
    }
    if (i < n) widen_scalar(dt, p + i * kvs_dtype_size(dt), n - i, dst + i);
}

T_512 static void widen_512(kvs_dtype dt, const void *src, size_t n, float *dst) {
    const uint8_t *p = src;
    size_t i = 0;
    if (dt == KVS_DTYPE_BF16) {
        for (; i + 16 <= n; i += 16) {
            __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p + 2 * i)));
            _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
        }
    } else if (dt == KVS_DTYPE_F16) {
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p + 2 * i))));
    }
    if (i < n) widen_scalar(dt, p + i * kvs_dtype_size(dt), n - i, dst + i);
}

/* AVX2: 3 positions x 4 weight rows = 12 ymm accumulators, 8 lanes each. */
#define NR_AVX2 3
#define MR_AVX2 4

T_AVX2 static INLINE float hsum8(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

T_AVX2 static INLINE void micro_avx2(const int NR, const float *x, size_t ldx, const float *const *w, int kl, float *s) {
    __m256 acc[NR_AVX2][MR_AVX2];
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < MR_AVX2; j++) acc[i][j] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= kl; k += 8) {
        __m256 xv[NR_AVX2];
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++) xv[i] = _mm256_loadu_ps(x + (size_t)i * ldx + k);
#pragma GCC unroll 4
        for (int j = 0; j < MR_AVX2; j++) {
            __m256 wv = _mm256_loadu_ps(w[j] + k);
#pragma GCC unroll 4
            for (int i = 0; i < NR; i++) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
    if (k < kl) {
        static const int32_t ones[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
        __m256i m = _mm256_loadu_si256((const __m256i *)(const void *)(ones + 8 - (kl - k)));
        __m256 xv[NR_AVX2];
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++) xv[i] = _mm256_maskload_ps(x + (size_t)i * ldx + k, m);
#pragma GCC unroll 4
        for (int j = 0; j < MR_AVX2; j++) {
            __m256 wv = _mm256_maskload_ps(w[j] + k, m);
#pragma GCC unroll 4
            for (int i = 0; i < NR; i++) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < MR_AVX2; j++) s[i * MR_AVX2 + j] = hsum8(acc[i][j]);
}

T_AVX2 static void micro_avx2_1(const float *x, size_t ldx, const float *const *w, int kl, float *s) {
    micro_avx2(1, x, ldx, w, kl, s);
}
T_AVX2 static void micro_avx2_2(const float *x, size_t ldx, const float *const *w, int kl, float *s) {
    micro_avx2(2, x, ldx, w, kl, s);
}
T_AVX2 static void micro_avx2_3(const float *x, size_t ldx, const float *const *w, int kl, float *s) {
    micro_avx2(3, x, ldx, w, kl, s);
}

/* AVX-512: 4 positions x 6 weight rows = 24 zmm accumulators, 16 lanes each. */
#define NR_512 4
#define MR_512 6

T_512 static INLINE void micro_512(const int NR, const float *x, size_t ldx, const float *const *w, int kl, float *s) {
    __m512 acc[NR_512][MR_512];
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 6
        for (int j = 0; j < MR_512; j++) acc[i][j] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= kl; k += 16) {
        __m512 xv[NR_512];
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++) xv[i] = _mm512_loadu_ps(x + (size_t)i * ldx + k);
#pragma GCC unroll 6
        for (int j = 0; j < MR_512; j++) {
            __m512 wv = _mm512_loadu_ps(w[j] + k);
#pragma GCC unroll 4
            for (int i = 0; i < NR; i++) acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
    if (k < kl) {
        __mmask16 m = (__mmask16)((1u << (kl - k)) - 1u);
        __m512 xv[NR_512];
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++) xv[i] = _mm512_maskz_loadu_ps(m, x + (size_t)i * ldx + k);
#pragma GCC unroll 6
        for (int j = 0; j < MR_512; j++) {
            __m512 wv = _mm512_maskz_loadu_ps(m, w[j] + k);
#pragma GCC unroll 4
            for (int i = 0; i < NR; i++) acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 6
        for (int j = 0; j < MR_512; j++) s[i * MR_512 + j] = _mm512_reduce_add_ps(acc[i][j]);
}

T_512 static void micro_512_1(const float *x, size_t ldx, const float *const *w, int kl, float *s) {
    micro_512(1, x, ldx, w, kl, s);
}
T_512 static void micro_512_2(const float *x, size_t ldx, const float *const *w, int kl, float *s) {
    micro_512(2, x, ldx, w, kl, s);
}
T_512 static void micro_512_3(const float *x, size_t ldx, const float *const *w, int kl, float *s) {
    micro_512(3, x, ldx, w, kl, s);
}
T_512 static void micro_512_4(const float *x, size_t ldx, const float *const *w, int kl, float *s) {
    micro_512(4, x, ldx, w, kl, s);
}

typedef void (*micro_fn)(const float *x, size_t ldx, const float *const *w, int kl, float *s);

/* A vector ISA's tile: `micro[nr - 1]` computes nr positions against MR weight rows. */
typedef struct {
    int NR, MR;
    const micro_fn *micro;
    void (*widen)(kvs_dtype, const void *, size_t, float *);
    float *buf;
} vec_scratch;

static void pass_vec(const gemm_job *job, long g, int k0, void *scratch) {
    const vec_scratch *v = scratch;
    const float *rows[MR_512];
    float s[NR_512 * MR_512];
    int kl = job->cols - k0 < KVS_GEMM_KC ? job->cols - k0 : KVS_GEMM_KC;
    int r0 = 0, mr = 0;
    const kvs_gemm_out *o = group_at(job, g, &r0, &mr);
    chunk_rows(&o->w, job->cols, r0, mr, v->MR, k0, kl, v->buf, rows, v->widen);
    for (int i0 = 0; i0 < job->n; i0 += v->NR) {
        int nr = job->n - i0 < v->NR ? job->n - i0 : v->NR;
        v->micro[nr - 1](job->x + (size_t)i0 * job->ldx + (size_t)k0, job->ldx, rows, kl, s);
        store_tile(o, i0, nr, r0, mr, s, v->MR, k0 == 0);
    }
    if (k0 + kl == job->cols) add_bias(o, job->n, r0, mr);
}

static void worker_avx2(void *ctx, int worker, int n_workers) {
    static const micro_fn m[NR_AVX2] = {micro_avx2_1, micro_avx2_2, micro_avx2_3};
    float buf[MR_AVX2 * BUF_LD];
    vec_scratch v = {NR_AVX2, MR_AVX2, m, widen_avx2, buf};
    run_passes(ctx, worker, n_workers, pass_vec, &v);
}

static void worker_512(void *ctx, int worker, int n_workers) {
    static const micro_fn m[NR_512] = {micro_512_1, micro_512_2, micro_512_3, micro_512_4};
    float buf[MR_512 * BUF_LD];
    vec_scratch v = {NR_512, MR_512, m, widen_512, buf};
    run_passes(ctx, worker, n_workers, pass_vec, &v);
}

static int cpu_avx2(void) {
    __builtin_cpu_init();
    unsigned a = 0, b = 0, c = 0, d = 0;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static int cpu_512(void) {
    return cpu_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
}
#endif /* x86-64 */

/* ---- dispatch ---- */

static int isa_sel = -1; /* set once on first use (racing first calls store the same value) or by kvs_gemm_isa_set */

int kvs_gemm_isa_available(kvs_gemm_isa isa) {
    switch (isa) {
    case KVS_GEMM_SCALAR: return 1;
#ifdef KVS_HAVE_GEMM_X86
    case KVS_GEMM_AVX2: return cpu_avx2();
    case KVS_GEMM_AVX512: return cpu_512();
#endif
    default: return 0;
    }
}

const char *kvs_gemm_isa_name(kvs_gemm_isa isa) {
    static const char *const names[KVS_GEMM_COUNT] = {"scalar", "avx2", "avx512"};
    return (unsigned)isa < KVS_GEMM_COUNT ? names[isa] : "?";
}

kvs_gemm_isa kvs_gemm_isa_get(void) {
    int v = __atomic_load_n(&isa_sel, __ATOMIC_RELAXED);
    if (v >= 0) return (kvs_gemm_isa)v;
    int want = KVS_GEMM_COUNT - 1;
    const char *env = getenv("KVS_SIMD");
    if (env && env[0]) {
        if (!strcmp(env, "scalar")) want = KVS_GEMM_SCALAR;
        else if (!strcmp(env, "avx2") || !strcmp(env, "avx2x32")) want = KVS_GEMM_AVX2;
    }
    while (want > 0 && !kvs_gemm_isa_available((kvs_gemm_isa)want)) want--;
    __atomic_store_n(&isa_sel, want, __ATOMIC_RELAXED);
    return (kvs_gemm_isa)want;
}

kvs_status kvs_gemm_isa_set(kvs_gemm_isa isa) {
    if (!kvs_gemm_isa_available(isa))
        return kvs_fail(KVS_ERR_UNSUPPORTED, "matmul: instruction set %s is not available on this CPU",
                        kvs_gemm_isa_name(isa));
    __atomic_store_n(&isa_sel, (int)isa, __ATOMIC_RELAXED);
    return KVS_OK;
}

void kvs_gemm_multi(kvs_threadpool *pool, const float *x, size_t ldx, int n, int cols, const kvs_gemm_out *outs,
                    int n_outs) {
    kvs_gemm_isa isa = kvs_gemm_isa_get();
    kvs_threadpool_fn fn = worker_scalar;
    int mr = MR_SCALAR;
#ifdef KVS_HAVE_GEMM_X86
    if (isa == KVS_GEMM_AVX512) {
        fn = worker_512;
        mr = MR_512;
    } else if (isa == KVS_GEMM_AVX2) {
        fn = worker_avx2;
        mr = MR_AVX2;
    }
#else
    (void)isa;
#endif
    gemm_job job = {.x = x, .ldx = ldx, .n = n, .cols = cols, .outs = outs, .n_outs = n_outs, .mr = mr};
    double macs = 0;
    for (int j = 0; j < n_outs; j++) {
        job.groups += (outs[j].rows + mr - 1) / mr;
        macs += (double)n * outs[j].rows * cols;
    }
    if (n <= 0 || job.groups == 0) return;
    /* below ~64K multiply-adds a thread wake-up costs more than it saves */
    if (macs < 65536 || !pool) fn(&job, 0, 1);
    else kvs_threadpool_run(pool, fn, &job);
}

void kvs_gemm(kvs_threadpool *pool, const float *x, size_t ldx, int n, int cols, kvs_wmat w, const float *bias,
              int rows, float *y, size_t ldy) {
    kvs_gemm_out o = {w, bias, y, ldy, rows};
    kvs_gemm_multi(pool, x, ldx, n, cols, &o, 1);
}
