/* matmul.c — tiled, multi-threaded Y = X W^T (+ b) over fp32 / fp16 / bf16 weights for the CPU forward pass; see
 * matmul.h for the arithmetic contract (an element's value depends only on its x row, its w row and the instruction
 * set) and the dispatch.
 *
 * Two kernels: packed 16-bit panels take the outer-product kernel of the "packed" section below; unpacked matrices
 * (fp32) the dot-product tiles described here. Unpacked loop nest, per worker (the workers split the output rows
 * in groups of MR weight rows):
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

#include <math.h>
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
    if (w.packed) { /* the panel copy: the mapped source pages may have been dropped */
        const uint16_t *s =
            w.packed + (r / KVS_PANEL) * cols * KVS_PANEL + (size_t)kvs_wmat_slot(w.dtype, (int)(r % KVS_PANEL));
        for (size_t k = 0; k < cols; k++)
            dst[k] = w.dtype == KVS_DTYPE_BF16 ? kvs_bf16_to_f32(s[k * KVS_PANEL]) : kvs_f16_to_f32(s[k * KVS_PANEL]);
        return;
    }
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

/* ---- packed 16-bit panels: the outer-product kernel (matmul.h, KVS_PANEL) ----
 *
 * Per worker (the workers split the panels of all outputs evenly):
 *   for each k-block of PK_KC columns (the whole reduction for a single position: decode streams each panel once),
 *     copy the block's k-block of X tile by tile into [k][nr] (contiguous broadcasts; 256 KB on the heap, in L2),
 *     for each group of PK_GROUP panels of an output (their k-block, 256 KB, stays in L2 for every tile),
 *       for each tile of NR positions, for each panel: NR x 32 accumulators in registers over the k-block,
 *       loaded from / stored to Y between k-blocks.
 * An element's accumulator is carried through Y in fp32 between k-blocks, so its value is one fmaf chain over k
 * in ascending order whatever the k-block, tile or panel grouping. */

#define PK_KC 512
#define PK_GROUP 8
#define PK_NR_MAX 12
#define PK_NP_MAX 4

kvs_status kvs_wmat_pack(kvs_wmat *w, int rows, int cols) {
    if (w->dtype != KVS_DTYPE_BF16 && w->dtype != KVS_DTYPE_F16)
        return kvs_fail(KVS_ERR_INVALID_ARG, "matmul: only 16-bit matrices are packed (dtype %d)", (int)w->dtype);
    if (rows <= 0 || cols <= 0 || !w->data)
        return kvs_fail(KVS_ERR_INVALID_ARG, "matmul: cannot pack a %d x %d matrix", rows, cols);
    size_t np = ((size_t)rows + KVS_PANEL - 1) / KVS_PANEL, pel = (size_t)cols * KVS_PANEL;
    size_t bytes = (np * pel * sizeof(uint16_t) + 63) & ~(size_t)63;
    uint16_t *d = aligned_alloc(64, bytes);
    if (!d) return kvs_fail(KVS_ERR_NOMEM, "matmul: out of memory packing a %d x %d matrix", rows, cols);
    const uint8_t *src = w->data;
    int slot[KVS_PANEL];
    for (int r = 0; r < KVS_PANEL; r++) slot[r] = kvs_wmat_slot(w->dtype, r);
    for (size_t p = 0; p < np; p++) {
        uint16_t *pd = d + p * pel;
        int nr = (p + 1) * KVS_PANEL > (size_t)rows ? (int)((size_t)rows - p * KVS_PANEL) : KVS_PANEL;
        if (nr < KVS_PANEL) memset(pd, 0, pel * sizeof *pd);
        /* 16 columns at a time: 32 short row reads, 1 KB of panel written (in L1) instead of 2-byte stores
         * scattered over the whole panel once per row */
        for (int k0 = 0; k0 < cols; k0 += 16) {
            int kn = cols - k0 < 16 ? cols - k0 : 16;
            for (int r = 0; r < nr; r++) {
                const uint8_t *s = src + ((p * KVS_PANEL + (size_t)r) * (size_t)cols + (size_t)k0) * 2;
                uint16_t *o = pd + (size_t)k0 * KVS_PANEL + (size_t)slot[r];
                for (int k = 0; k < kn; k++) o[(size_t)k * KVS_PANEL] = (uint16_t)(s[2 * k] | (s[2 * k + 1] << 8));
            }
        }
    }
    w->packed = d;
    return KVS_OK;
}

float kvs_wmat_packed_at(const kvs_wmat *w, int cols, int r, int k) {
    uint16_t h = w->packed[((size_t)(r / KVS_PANEL) * (size_t)cols + (size_t)k) * KVS_PANEL +
                           (size_t)kvs_wmat_slot(w->dtype, r % KVS_PANEL)];
    return w->dtype == KVS_DTYPE_BF16 ? kvs_bf16_to_f32(h) : kvs_f16_to_f32(h);
}

/* A tile kernel: y[i][r] (i < nr, r < min(valid, np * 32)) = (first ? +0 : y[i][r]) + sum over k < kl of
 * xt[k * nr + i] * w(r, k) as an fmaf chain, then + bias[r] when bias != NULL (the last k-block). wp: the first
 * panel's k-block, panels wps elements apart. The vector variants bake nr and np in. */
typedef void (*pk_fn)(int nr, const float *xt, const uint16_t *wp, size_t wps, int kl, float *y, size_t ldy, int valid,
                      const float *bias, int first);

typedef struct {
    const float *x;
    size_t ldx;
    int n, cols;
    const kvs_gemm_out *outs;
    int n_outs;
    long panels;            /* over all outputs */
    int NR;                 /* positions per tile */
    int NP;                 /* panels of `wide` */
    const pk_fn *tile;      /* [nr - 1]: nr positions x 1 panel */
    pk_fn wide;             /* 1 position x NP panels (decode: NP weight streams at once), or NULL */
    int kc;                 /* k-block */
    float *xbuf;            /* [workers][n * kc]: each worker's copy of X's k-block, or NULL when n <= NR */
} pk_job;

static void pk_worker(void *ctx, int worker, int n_workers) {
    const pk_job *job = ctx;
    float small[PK_NR_MAX * PK_KC]; /* a block of at most one tile (24 KB) */
    long p0 = job->panels * worker / n_workers, p1 = job->panels * (worker + 1) / n_workers;
    int cols = job->cols, n = job->n, kc = job->kc;
    float *xbuf = job->xbuf ? job->xbuf + (size_t)worker * (size_t)n * (size_t)kc : small;
    size_t wps = (size_t)cols * KVS_PANEL;
    if (p0 >= p1) return;
    for (int k0 = 0; k0 < cols; k0 += kc) {
        int kl = cols - k0 < kc ? cols - k0 : kc, first = k0 == 0, last = k0 + kl == cols;
        /* the block's k-block of X, tile by tile: tile i0 at xbuf + i0 * kl as [kl][nr] (a lone position reads X) */
        if (n > 1)
            for (int i0 = 0; i0 < n; i0 += job->NR) {
                int nr = n - i0 < job->NR ? n - i0 : job->NR;
                float *xt = xbuf + (size_t)i0 * (size_t)kl;
                for (int i = 0; i < nr; i++) {
                    const float *xr = job->x + (size_t)(i0 + i) * job->ldx + (size_t)k0;
                    for (int k = 0; k < kl; k++) xt[(size_t)k * (size_t)nr + (size_t)i] = xr[k];
                }
            }
        long base = 0;
        for (int j = 0; j < job->n_outs; j++) {
            const kvs_gemm_out *o = &job->outs[j];
            long np = (o->rows + KVS_PANEL - 1) / KVS_PANEL;
            long q0 = p0 - base > 0 ? p0 - base : 0, q1 = p1 - base < np ? p1 - base : np;
            base += np;
            for (long qg = q0; qg < q1; qg += PK_GROUP) {
                long qe = qg + PK_GROUP < q1 ? qg + PK_GROUP : q1;
                for (int i0 = 0; i0 < n; i0 += job->NR) {
                    int nr = n - i0 < job->NR ? n - i0 : job->NR;
                    const float *xt = n > 1 ? xbuf + (size_t)i0 * (size_t)kl : job->x + (size_t)k0;
                    float *yt = o->y + (size_t)i0 * o->ldy;
                    for (long q = qg; q < qe;) {
                        const uint16_t *wp = o->w.packed + (size_t)q * wps + (size_t)k0 * KVS_PANEL;
                        int valid = o->rows - (int)q * KVS_PANEL;
                        const float *b = last && o->bias ? o->bias + q * KVS_PANEL : NULL;
                        float *y = yt + (size_t)q * KVS_PANEL;
                        if (nr == 1 && job->wide && qe - q >= job->NP) {
                            job->wide(1, xt, wp, wps, kl, y, o->ldy, valid, b, first);
                            q += job->NP;
                        } else {
                            job->tile[nr - 1](nr, xt, wp, wps, kl, y, o->ldy, valid, b, first);
                            q++;
                        }
                    }
                }
            }
        }
    }
}

/* Scalar: the reference order itself (one fmaf chain per element). */
#define PK_NR_SCALAR 4

static inline void pk_scalar(kvs_dtype dt, int nr, const float *xt, const uint16_t *wp, int kl, float *y, size_t ldy,
                             int valid, const float *bias, int first) {
    int nv = valid < KVS_PANEL ? valid : KVS_PANEL;
    for (int i = 0; i < nr; i++)
        for (int r = 0; r < nv; r++) {
            const uint16_t *w = wp + kvs_wmat_slot(dt, r);
            float acc = first ? 0.0f : y[(size_t)i * ldy + (size_t)r];
            for (int k = 0; k < kl; k++) {
                uint16_t h = w[(size_t)k * KVS_PANEL];
                float wv = dt == KVS_DTYPE_BF16 ? kvs_bf16_to_f32(h) : kvs_f16_to_f32(h);
                acc = fmaf(xt[(size_t)k * (size_t)nr + (size_t)i], wv, acc);
            }
            if (bias) acc += bias[r];
            y[(size_t)i * ldy + (size_t)r] = acc;
        }
}

static void pk_scalar_bf16(int nr, const float *xt, const uint16_t *wp, size_t wps, int kl, float *y, size_t ldy,
                           int valid, const float *bias, int first) {
    (void)wps;
    pk_scalar(KVS_DTYPE_BF16, nr, xt, wp, kl, y, ldy, valid, bias, first);
}
static void pk_scalar_f16(int nr, const float *xt, const uint16_t *wp, size_t wps, int kl, float *y, size_t ldy,
                          int valid, const float *bias, int first) {
    (void)wps;
    pk_scalar(KVS_DTYPE_F16, nr, xt, wp, kl, y, ldy, valid, bias, first);
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

/* ---- packed panels, AVX-512: NR positions x NP panels x 2 vectors of 16 rows ---- */

#define PK_NR_512 12
#define PK_NP_512 4

T_512 static INLINE void pk512(const int NR, const int NP, const int F16, const float *xt, const uint16_t *wp,
                               size_t wps, int kl, float *y, size_t ldy, int valid, const float *bias, int first) {
    __m512 acc[PK_NR_512][PK_NP_512][2];
    __mmask16 m[PK_NP_512][2];
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            int c = valid - p * 32 - h * 16;
            c = c < 0 ? 0 : c > 16 ? 16 : c;
            m[p][h] = (__mmask16)((1u << c) - 1u);
        }
#pragma GCC unroll 12
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++)
                acc[i][p][h] = first ? _mm512_setzero_ps()
                                     : _mm512_maskz_loadu_ps(m[p][h], y + (size_t)i * ldy + (size_t)(p * 32 + h * 16));
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    for (int k = 0; k < kl; k++) {
        __m512 w[PK_NP_512][2];
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            const uint16_t *s = wp + (size_t)p * wps + (size_t)k * KVS_PANEL;
            if (F16) {
                w[p][0] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)s));
                w[p][1] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(s + 16)));
            } else {
                __m512i raw = _mm512_loadu_si512((const void *)s);
                w[p][0] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
                w[p][1] = _mm512_castsi512_ps(_mm512_and_si512(raw, hi));
            }
        }
#pragma GCC unroll 12
        for (int i = 0; i < NR; i++) {
            __m512 b = _mm512_set1_ps(xt[(size_t)k * (size_t)NR + (size_t)i]);
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++)
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) acc[i][p][h] = _mm512_fmadd_ps(b, w[p][h], acc[i][p][h]);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m512 v = acc[i][p][h];
                if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m[p][h], bias + p * 32 + h * 16));
                _mm512_mask_storeu_ps(y + (size_t)i * ldy + (size_t)(p * 32 + h * 16), m[p][h], v);
            }
}

#define PK512_FN(NAME, NR, NP, F16)                                                                                  \
    T_512 static void NAME(int nr, const float *xt, const uint16_t *wp, size_t wps, int kl, float *y, size_t ldy,    \
                           int valid, const float *bias, int first) {                                              \
        (void)nr;                                                                                                   \
        pk512(NR, NP, F16, xt, wp, wps, kl, y, ldy, valid, bias, first);                                            \
    }
#define PK512_BOTH(NR) PK512_FN(pk512_b##NR, NR, 1, 0) PK512_FN(pk512_h##NR, NR, 1, 1)
PK512_BOTH(1) PK512_BOTH(2) PK512_BOTH(3) PK512_BOTH(4) PK512_BOTH(5) PK512_BOTH(6)
PK512_BOTH(7) PK512_BOTH(8) PK512_BOTH(9) PK512_BOTH(10) PK512_BOTH(11) PK512_BOTH(12)
PK512_FN(pk512_bw, 1, PK_NP_512, 0)
PK512_FN(pk512_hw, 1, PK_NP_512, 1)

static const pk_fn pk512_tile[2][PK_NR_512] = {
    {pk512_b1, pk512_b2, pk512_b3, pk512_b4, pk512_b5, pk512_b6, pk512_b7, pk512_b8, pk512_b9, pk512_b10, pk512_b11,
     pk512_b12},
    {pk512_h1, pk512_h2, pk512_h3, pk512_h4, pk512_h5, pk512_h6, pk512_h7, pk512_h8, pk512_h9, pk512_h10, pk512_h11,
     pk512_h12}};

/* ---- packed panels, AVX2: NR positions x NP panels x 4 vectors of 8 rows ---- */

#define PK_NR_AVX2 3
#define PK_NP_AVX2 2

T_AVX2 static INLINE void pk_avx2(const int NR, const int NP, const int F16, const float *xt, const uint16_t *wp,
                                  size_t wps, int kl, float *y, size_t ldy, int valid, const float *bias, int first) {
    static const int32_t ones[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    __m256 acc[PK_NR_AVX2][PK_NP_AVX2][4];
    __m256i m[PK_NP_AVX2][4];
#pragma GCC unroll 2
    for (int p = 0; p < NP; p++)
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            int c = valid - p * 32 - h * 8;
            c = c < 0 ? 0 : c > 8 ? 8 : c;
            m[p][h] = _mm256_loadu_si256((const __m256i *)(const void *)(ones + 8 - c));
        }
#pragma GCC unroll 3
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++)
#pragma GCC unroll 4
            for (int h = 0; h < 4; h++)
                acc[i][p][h] = first ? _mm256_setzero_ps()
                                     : _mm256_maskload_ps(y + (size_t)i * ldy + (size_t)(p * 32 + h * 8), m[p][h]);
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    for (int k = 0; k < kl; k++) {
        __m256 b[PK_NR_AVX2];
#pragma GCC unroll 3
        for (int i = 0; i < NR; i++) b[i] = _mm256_broadcast_ss(xt + (size_t)k * (size_t)NR + (size_t)i);
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) {
            const uint16_t *s = wp + (size_t)p * wps + (size_t)k * KVS_PANEL;
#pragma GCC unroll 4
            for (int h = 0; h < 4; h++) {
                __m256 w;
                if (F16) {
                    w = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(s + 8 * h)));
                } else {
                    /* words 0-7 hold rows 0-7 (low) and 16-23 (high), words 8-15 rows 8-15 and 24-31 */
                    __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(s + 16 * (h & 1)));
                    w = _mm256_castsi256_ps(h < 2 ? _mm256_slli_epi32(raw, 16) : _mm256_and_si256(raw, hi));
                }
#pragma GCC unroll 3
                for (int i = 0; i < NR; i++) acc[i][p][h] = _mm256_fmadd_ps(b[i], w, acc[i][p][h]);
            }
        }
    }
#pragma GCC unroll 3
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++)
#pragma GCC unroll 4
            for (int h = 0; h < 4; h++) {
                __m256 v = acc[i][p][h];
                if (bias) v = _mm256_add_ps(v, _mm256_maskload_ps(bias + p * 32 + h * 8, m[p][h]));
                _mm256_maskstore_ps(y + (size_t)i * ldy + (size_t)(p * 32 + h * 8), m[p][h], v);
            }
}

#define PKAVX2_FN(NAME, NR, NP, F16)                                                                                 \
    T_AVX2 static void NAME(int nr, const float *xt, const uint16_t *wp, size_t wps, int kl, float *y, size_t ldy,   \
                            int valid, const float *bias, int first) {                                             \
        (void)nr;                                                                                                   \
        pk_avx2(NR, NP, F16, xt, wp, wps, kl, y, ldy, valid, bias, first);                                          \
    }
PKAVX2_FN(pkavx2_b1, 1, 1, 0) PKAVX2_FN(pkavx2_b2, 2, 1, 0) PKAVX2_FN(pkavx2_b3, 3, 1, 0)
PKAVX2_FN(pkavx2_h1, 1, 1, 1) PKAVX2_FN(pkavx2_h2, 2, 1, 1) PKAVX2_FN(pkavx2_h3, 3, 1, 1)
PKAVX2_FN(pkavx2_bw, 1, PK_NP_AVX2, 0)
PKAVX2_FN(pkavx2_hw, 1, PK_NP_AVX2, 1)

static const pk_fn pkavx2_tile[2][PK_NR_AVX2] = {{pkavx2_b1, pkavx2_b2, pkavx2_b3}, {pkavx2_h1, pkavx2_h2, pkavx2_h3}};

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

/* kvs_gemm_test_scratch_fail(): 1 = every blocked product takes the out-of-memory path */
static int scratch_fail;

/* The products of packed matrices (all of one dtype). */
static void gemm_packed(kvs_threadpool *pool, kvs_gemm_isa isa, const float *x, size_t ldx, int n, int cols,
                        const kvs_gemm_out *outs, int n_outs) {
    static const pk_fn scalar_tile[2][PK_NR_SCALAR] = {{pk_scalar_bf16, pk_scalar_bf16, pk_scalar_bf16, pk_scalar_bf16},
                                                       {pk_scalar_f16, pk_scalar_f16, pk_scalar_f16, pk_scalar_f16}};
    int f16 = outs[0].w.dtype == KVS_DTYPE_F16;
    pk_job job = {.x = x, .ldx = ldx, .n = n, .cols = cols, .outs = outs, .n_outs = n_outs, .NR = PK_NR_SCALAR,
                  .NP = 1, .tile = scalar_tile[f16], .wide = NULL};
#ifdef KVS_HAVE_GEMM_X86
    if (isa == KVS_GEMM_AVX512) {
        job.NR = PK_NR_512;
        job.NP = PK_NP_512;
        job.tile = pk512_tile[f16];
        job.wide = f16 ? pk512_hw : pk512_bw;
    } else if (isa == KVS_GEMM_AVX2) {
        job.NR = PK_NR_AVX2;
        job.NP = PK_NP_AVX2;
        job.tile = pkavx2_tile[f16];
        job.wide = f16 ? pkavx2_hw : pkavx2_bw;
    }
#else
    (void)isa;
#endif
    double macs = 0;
    for (int j = 0; j < n_outs; j++) {
        job.panels += (outs[j].rows + KVS_PANEL - 1) / KVS_PANEL;
        macs += (double)n * outs[j].rows * cols;
    }
    if (n <= 0 || job.panels == 0) return;
    if (macs < 65536) pool = NULL; /* below ~64K multiply-adds a thread wake-up costs more than it saves */
    job.kc = n == 1 ? cols : PK_KC;
    if (n > job.NR) {
        /* a worker's X copy, n x kc floats (256 KB for a 128-position block): on the heap, not a worker's stack */
        size_t workers = (size_t)kvs_threadpool_size(pool);
        job.xbuf = scratch_fail ? NULL : malloc(workers * (size_t)n * (size_t)job.kc * sizeof(float));
        if (!job.xbuf) {
            /* out of memory: tile by tile, the same bits (an element's value does not depend on its block) */
            for (int i0 = 0; i0 < n; i0 += job.NR)
                for (int j = 0; j < n_outs; j++) {
                    kvs_gemm_out o = outs[j];
                    o.y += (size_t)i0 * o.ldy;
                    gemm_packed(pool, isa, x + (size_t)i0 * ldx, ldx, n - i0 < job.NR ? n - i0 : job.NR, cols, &o, 1);
                }
            return;
        }
    }
    kvs_threadpool_run(pool, pk_worker, &job);
    free(job.xbuf);
}

void kvs_gemm_test_scratch_fail(int on) { scratch_fail = on != 0; }

void kvs_gemm_multi(kvs_threadpool *pool, const float *x, size_t ldx, int n, int cols, const kvs_gemm_out *outs,
                    int n_outs) {
    kvs_gemm_isa isa = kvs_gemm_isa_get();
    int n_packed = 0, any_packed = 0;
    for (int j = 0; j < n_outs; j++) {
        n_packed += outs[j].w.packed != NULL && outs[j].w.dtype == outs[0].w.dtype;
        any_packed |= outs[j].w.packed != NULL;
    }
    if (n_packed == n_outs && n_outs > 0) {
        gemm_packed(pool, isa, x, ldx, n, cols, outs, n_outs);
        return;
    }
    if (any_packed) { /* packed beside unpacked (or of two dtypes): each product on its own */
        for (int j = 0; j < n_outs; j++) kvs_gemm_multi(pool, x, ldx, n, cols, &outs[j], 1);
        return;
    }
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
