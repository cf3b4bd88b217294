/* kvs_math_simd_f64.c — the fp64 scoring kernels behind kvs_math.c's key scores, page scores and fp64 top-k
 * (the replay sweep's speed; POLICY_SPEC §2.5 KeyDiff, §2.6 B9 Quest and B12 KNorm). See kvs_math_simd_f64.h:
 * every variant returns the scalar reference's bits, because each lane carries one output's whole sum in the
 * scalar order.
 *
 * How the AVX2 variants reach the vector units: 8 rows (keys or pages) per pass as two groups of 4 lanes; for
 * each chunk of 8 dimensions the 4 rows of a group are loaded as 8 floats each, transposed in registers into 8
 * vectors of 4 rows (one per dimension, in ascending order) and widened to fp64, then multiplied and added
 * dimension by dimension (separate multiply and add, as the scalar `s += a * b` rounds). Two independent groups
 * hide the add latency that bounds the scalar loop. The d % 8 last dimensions finish lane by lane in scalar, in
 * order, after the vector part.
 */
#include "kvs_math_simd_f64.h"

#include <math.h>
#include <string.h>

static const float *row_at(const float *base, size_t stride, const int32_t *idx, size_t j) {
    return base + (idx ? (size_t)idx[j] : j) * stride;
}

/* ---- scalar reference: the loops kvs_math.c had (KVS_SIMD=scalar runs these) ---- */

static double norm_scalar(const float *k, size_t from, size_t d, double s) {
    for (size_t i = from; i < d; i++) s += (double)k[i] * (double)k[i];
    return s;
}

static double dot_scalar(const float *k, const double *v, size_t from, size_t d, double s) {
    for (size_t i = from; i < d; i++) s += (double)k[i] * v[i];
    return s;
}

static double page_scalar(const float *q, const uint8_t *up, const float *lo, const float *hi, size_t from, size_t d,
                          double s) {
    for (size_t i = from; i < d; i++) s += (double)q[i] * (double)(up[i] ? hi[i] : lo[i]);
    return s;
}

/* Quest's rows r0..r0+nr-1 (q, up: [nq][d]) at pages pi..pi+lanes-1: each page's sum continued from its lane sum
 * s[r * lanes + l] (dimensions 0..d8-1 done) over the rest in order, into out[row * n_pages + page]. The vector
 * page_scores_rows' ending. */
static void page_rows_finish(const float *q, const uint8_t *up, const float *kmin, const float *kmax, size_t stride,
                             size_t n_pages, size_t d, size_t d8, size_t r0, size_t nr, size_t pi, size_t lanes,
                             const double *s, double *out) {
    for (size_t r = 0; r < nr; r++)
        for (size_t l = 0; l < lanes; l++)
            out[(r0 + r) * n_pages + pi + l] = page_scalar(q + r * d, up + r * d, kmin + (pi + l) * stride,
                                                           kmax + (pi + l) * stride, d8, d, s[r * lanes + l]);
}

static void norms_scalar(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d, double *out) {
    for (size_t j = 0; j < n; j++) out[j] = sqrt(norm_scalar(row_at(keys, stride, idx, j), 0, d, 0));
}

static void dots_scalar(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d, const double *v,
                        double *out) {
    for (size_t j = 0; j < n; j++) out[j] = dot_scalar(row_at(keys, stride, idx, j), v, 0, d, 0);
}

static void page_scores_scalar(const float *q, const uint8_t *up, const float *kmin, const float *kmax, size_t stride,
                               size_t n_pages, size_t d, double *out) {
    for (size_t pi = 0; pi < n_pages; pi++) out[pi] = page_scalar(q, up, kmin + pi * stride, kmax + pi * stride, 0, d, 0);
}

static void page_scores_rows_scalar(const float *q, size_t nq, const uint8_t *up, const float *kmin,
                                    const float *kmax, size_t stride, size_t n_pages, size_t d, double *out) {
    for (size_t r = 0; r < nq; r++)
        page_scores_scalar(q + r * d, up + r * d, kmin, kmax, stride, n_pages, d, out + r * n_pages);
}

static void wsum_scalar(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d, const double *w,
                        double *acc) {
    for (size_t j = 0; j < n; j++) {
        const float *k = row_at(keys, stride, idx, j);
        for (size_t i = 0; i < d; i++) acc[i] += w[j] * (double)k[i];
    }
}

static size_t first_above_scalar(const double *x, size_t from, size_t n, double thr) {
    for (size_t j = from; j < n; j++)
        if (x[j] > thr) return j;
    return n;
}

/* One row's four sums continued over dimensions from..d-1 (s: err2, ref2, out2, dot so far), in order. */
static void out_sums_row(const float *a, const float *b, size_t from, size_t d, double *s) {
    double err2 = s[0], ref2 = s[1], out2 = s[2], dot = s[3];
    for (size_t i = from; i < d; i++) {
        double x = (double)a[i] - (double)b[i];
        err2 += x * x;
        ref2 += (double)a[i] * (double)a[i];
        out2 += (double)b[i] * (double)b[i];
        dot += (double)a[i] * (double)b[i];
    }
    s[0] = err2, s[1] = ref2, s[2] = out2, s[3] = dot;
}

static void out_sums_scalar(const float *const *ref, const float *const *out, size_t nr, size_t d, double *sums) {
    for (size_t r = 0; r < nr; r++) {
        double *s = sums + 4 * r;
        s[0] = s[1] = s[2] = s[3] = 0;
        out_sums_row(ref[r], out[r], 0, d, s);
    }
}

/* Lane k's recall (and hits) over entries from..n-1 of its list, continued in order. */
static void recall_lane(const float *fp, const int32_t *list, const int32_t *rank, int64_t thr, size_t from,
                        size_t n, double *r, int64_t *hit) {
    double s = *r;
    int64_t h = *hit;
    for (size_t j = from; j < n; j++) {
        s += (double)fp[list[j]];
        if (rank) h += rank[list[j]] < thr;
    }
    *r = s, *hit = h;
}

static void recall4_scalar(int m, const float *const fp[4], const int32_t *const list[4],
                           const int32_t *const rank[4], const int64_t n[4], double r[4], int64_t hit[4]) {
    for (int k = 0; k < m; k++) {
        r[k] = 0, hit[k] = 0;
        recall_lane(fp[k], list[k], rank ? rank[k] : NULL, n[k], 0, (size_t)n[k], &r[k], &hit[k]);
    }
}

/* heads_add's columns from .. n-1, one by one: the scalar table, and the vector tables' rest */
static void heads_cols(const float *const *p, size_t nh, size_t from, size_t n, int mean, double *out) {
    int pow2 = (nh & (nh - 1)) == 0;
    double inv = 1.0 / (double)nh;
    for (size_t j = from; j < n; j++) {
        double t = 0.0;
        for (size_t h = 0; h < nh; h++) t += p[h][j];
        if (mean) t = pow2 ? t * inv : t / (double)nh;
        out[j] += t;
    }
}

static void heads_add_scalar(const float *const *p, size_t nh, size_t n, int mean, double *out) {
    heads_cols(p, nh, 0, n, mean, out);
}

static const kvs_math_f64_kernels f64_scalar = {
    /* .name = */ "scalar",
    /* .norms = */ norms_scalar,
    /* .dots = */ dots_scalar,
    /* .page_scores = */ page_scores_scalar,
    /* .wsum = */ wsum_scalar,
    /* .first_above = */ first_above_scalar,
    /* .page_scores_rows = */ page_scores_rows_scalar,
    /* .out_sums = */ out_sums_scalar,
    /* .recall4 = */ recall4_scalar,
    /* .heads_add = */ heads_add_scalar,
};

/* ---- AVX2, and AVX2 with AVX-512VL's 32 registers (kvs_math_simd_f64_vec.h, compiled once for each) ---- */

#if defined(__x86_64__) && defined(__GNUC__)
#define KVS_HAVE_AVX2_F64 1
#include <immintrin.h>

/* Rows per pass: GROUPS groups of 4 lanes. Each group's fp64 sum is a chain of dependent adds, so the groups are
 * what overlaps: 4 chains (16 keys or pages a pass) ran KeyDiff's anchor and cosines in 0.13 s against 0.15 s with
 * 2, in an ad-hoc harness (512 keys, d 128); 6 gained nothing more. The order within a sum is the
 * same whatever GROUPS is. */
#define GROUPS 4
/* keys ahead that wsum prefetches a scattered row slice for: `bench_speed kernels` "KeyDiff one eviction" (the anchor
 * over 1024 random keys), d 128, 21.0-22.1 ns a key against 24.2 without the prefetch */
#define WSUM_AHEAD 8

/* Fully unrolls a loop over a small constant count, so that the vectors of an array indexed by it (acc[g], x[m])
 * can live in registers: gcc -O2 does not unroll these on its own and kept them in memory. */
#define UNROLL _Pragma("GCC unroll 16")

#define F64_TARGET __attribute__((target("avx2,fma")))
#define F64_FN(name) name##_avx2
#define F64_TABLE_NAME "avx2"
#include "kvs_math_simd_f64_vec.h"
#undef F64_TARGET
#undef F64_FN
#undef F64_TABLE_NAME

#define F64_TARGET __attribute__((target("avx2,fma,avx512f,avx512vl")))
#define F64_FN(name) name##_avx2x32
#define F64_TABLE_NAME "avx2x32"
#include "kvs_math_simd_f64_vec.h"
#undef F64_TARGET
#undef F64_FN
#undef F64_TABLE_NAME


/* ---- AVX-512: the kernels whose lanes are outputs, on 8 fp64 lanes (the rest as avx2x32) ----
 * One output per lane as above, so the same bits: the lanes are only twice as many. Used by the avx512 table
 * (kvs_math_simd.h: where 512-bit FMAs run at full rate). */
#define F64_512 __attribute__((target("avx2,fma,avx512f,avx512vl")))

/* Rows r[0..7] (8 doubles each, dimensions i..i+7) -> x[m] = the 8 rows' dimension i+m. */
__attribute__((always_inline)) F64_512 static inline void transpose8x8_pd(const __m512d r[8], __m512d x[8]) {
    __m512d t0 = _mm512_unpacklo_pd(r[0], r[1]), t1 = _mm512_unpackhi_pd(r[0], r[1]);
    __m512d t2 = _mm512_unpacklo_pd(r[2], r[3]), t3 = _mm512_unpackhi_pd(r[2], r[3]);
    __m512d t4 = _mm512_unpacklo_pd(r[4], r[5]), t5 = _mm512_unpackhi_pd(r[4], r[5]);
    __m512d t6 = _mm512_unpacklo_pd(r[6], r[7]), t7 = _mm512_unpackhi_pd(r[6], r[7]);
    /* u0: dims 0 and 4 of rows 0-3; u1: 2, 6; u2: 1, 5; u3: 3, 7; u4..u7 the same of rows 4-7 */
    __m512d u0 = _mm512_shuffle_f64x2(t0, t2, 0x88), u1 = _mm512_shuffle_f64x2(t0, t2, 0xDD);
    __m512d u2 = _mm512_shuffle_f64x2(t1, t3, 0x88), u3 = _mm512_shuffle_f64x2(t1, t3, 0xDD);
    __m512d u4 = _mm512_shuffle_f64x2(t4, t6, 0x88), u5 = _mm512_shuffle_f64x2(t4, t6, 0xDD);
    __m512d u6 = _mm512_shuffle_f64x2(t5, t7, 0x88), u7 = _mm512_shuffle_f64x2(t5, t7, 0xDD);
    x[0] = _mm512_shuffle_f64x2(u0, u4, 0x88), x[4] = _mm512_shuffle_f64x2(u0, u4, 0xDD);
    x[2] = _mm512_shuffle_f64x2(u1, u5, 0x88), x[6] = _mm512_shuffle_f64x2(u1, u5, 0xDD);
    x[1] = _mm512_shuffle_f64x2(u2, u6, 0x88), x[5] = _mm512_shuffle_f64x2(u2, u6, 0xDD);
    x[3] = _mm512_shuffle_f64x2(u3, u7, 0x88), x[7] = _mm512_shuffle_f64x2(u3, u7, 0xDD);
}

/* 8 consecutive rows of `base` (stride apart) at dimensions i..i+7, widened and transposed. */
__attribute__((always_inline)) F64_512 static inline void rows8_pd(const float *base, size_t stride, size_t i,
                                                                    __m512d x[8]) {
    __m512d r[8];
    UNROLL
    for (int l = 0; l < 8; l++) r[l] = _mm512_cvtps_pd(_mm256_loadu_ps(base + (size_t)l * stride + i));
    transpose8x8_pd(r, x);
}

/* page_scores_rows with 8 pages a pass: each page's kmin and kmax rows widened and transposed once per 8
 * dimensions for up to 4 query rows; a row's lane takes kmax or kmin whole per dimension (its up[i], as a mask),
 * then the same multiply and add in the same order as page_scores. The n_pages % 8 last pages in scalar. */
F64_512 static void page_scores_rows_avx512(const float *q, size_t nq, const uint8_t *up, const float *kmin,
                                            const float *kmax, size_t stride, size_t n_pages, size_t d, double *out) {
    enum { ROWS = 4 };
    size_t d8 = d & ~(size_t)7;
    for (size_t r0 = 0; r0 < nq; r0 += ROWS) {
        size_t nr = nq - r0 < ROWS ? nq - r0 : ROWS, pi = 0;
        const float *qr = q + r0 * d;
        const uint8_t *ur = up + r0 * d;
        for (; pi + 8 <= n_pages; pi += 8) {
            __m512d acc[ROWS];
            for (size_t r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_pd();
            for (size_t i = 0; i < d8; i += 8) {
                __m512d xl[8], xh[8];
                rows8_pd(kmin + pi * stride, stride, i, xl);
                rows8_pd(kmax + pi * stride, stride, i, xh);
                for (size_t r = 0; r < nr; r++)
                    UNROLL
                    for (size_t m = 0; m < 8; m++) {
                        __mmask8 k = (__mmask8)(ur[r * d + i + m] != 0 ? 0xFF : 0);
                        __m512d x = _mm512_mask_blend_pd(k, xl[m], xh[m]);
                        acc[r] = _mm512_add_pd(acc[r], _mm512_mul_pd(x, _mm512_set1_pd((double)qr[r * d + i + m])));
                    }
            }
            double s8[ROWS * 8];
            for (size_t r = 0; r < nr; r++) _mm512_storeu_pd(s8 + 8 * r, acc[r]);
            page_rows_finish(qr, ur, kmin, kmax, stride, n_pages, d, d8, r0, nr, pi, 8, s8, out);
        }
        static const double zero[ROWS] = {0};
        for (; pi < n_pages; pi++) page_rows_finish(qr, ur, kmin, kmax, stride, n_pages, d, 0, r0, nr, pi, 1, zero, out);
    }
}

/* One row: page_scores_rows' every output equals page_scores' (the same sum in the same order). */
F64_512 static void page_scores_avx512(const float *q, const uint8_t *up, const float *kmin, const float *kmax,
                                       size_t stride, size_t n_pages, size_t d, double *out) {
    page_scores_rows_avx512(q, 1, up, kmin, kmax, stride, n_pages, d, out);
}

/* wsum with 64 dimensions a pass in 8 registers of 8 sums, each the scalar loop's chain in key order; the d % 64
 * last dimensions through avx2x32's (the same chains, 32 and 4 at a time, then one by one). */
F64_512 static void wsum_avx512(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                                const double *w, double *acc) {
    size_t i = 0;
    for (; i + 64 <= d; i += 64) {
        __m512d a[8];
        UNROLL
        for (int m = 0; m < 8; m++) a[m] = _mm512_loadu_pd(acc + i + 8 * (size_t)m);
        for (size_t j = 0; j < n; j++) {
            const float *k = row_at(keys, stride, idx, j) + i;
            if (idx && j + WSUM_AHEAD < n) { /* scattered rows: a later one's 256 bytes on their way */
                const char *ahead = (const char *)(row_at(keys, stride, idx, j + WSUM_AHEAD) + i);
                for (int b = 0; b < 256; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
            }
            __m512d wv = _mm512_set1_pd(w[j]);
            UNROLL
            for (int m = 0; m < 8; m++)
                a[m] = _mm512_add_pd(a[m], _mm512_mul_pd(wv, _mm512_cvtps_pd(_mm256_loadu_ps(k + 8 * m))));
        }
        UNROLL
        for (int m = 0; m < 8; m++) _mm512_storeu_pd(acc + i + 8 * (size_t)m, a[m]);
    }
    if (i < d) wsum_avx2x32(keys + i, stride, idx, n, d - i, w, acc + i);
}

/* heads_add 8 columns a vector, each lane the scalar table's operations on its column; the rest as avx2x32. */
F64_512 static void heads_add_avx512(const float *const *p, size_t nh, size_t n, int mean, double *out) {
    int pow2 = (nh & (nh - 1)) == 0;
    __m512d vinv = _mm512_set1_pd(1.0 / (double)nh), vnh = _mm512_set1_pd((double)nh);
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m512d t = _mm512_setzero_pd();
        for (size_t h = 0; h < nh; h++) t = _mm512_add_pd(t, _mm512_cvtps_pd(_mm256_loadu_ps(p[h] + j)));
        if (mean) t = pow2 ? _mm512_mul_pd(t, vinv) : _mm512_div_pd(t, vnh);
        _mm512_storeu_pd(out + j, _mm512_add_pd(_mm512_loadu_pd(out + j), t));
    }
    heads_cols(p, nh, j, n, mean, out);
}

static const kvs_math_f64_kernels f64_avx512 = {
    /* .name = */ "avx512",
    /* .norms = */ norms_avx2x32,
    /* .dots = */ dots_avx2x32,
    /* .page_scores = */ page_scores_avx512,
    /* .wsum = */ wsum_avx512,
    /* .first_above = */ first_above_avx2x32,
    /* .page_scores_rows = */ page_scores_rows_avx512,
    /* .out_sums = */ out_sums_avx2x32,
    /* .recall4 = */ recall4_avx2x32,
    /* .heads_add = */ heads_add_avx512,
};
#endif /* x86-64 */

/* ---- dispatch: kvs_math_simd.h's instruction set ---- */

const kvs_math_f64_kernels *kvs_math_f64_kernels_for(kvs_isa isa) {
    if (isa == KVS_ISA_SCALAR) return &f64_scalar;
#ifdef KVS_HAVE_AVX2_F64
    if (!kvs_math_kernels_for(isa)) return NULL; /* this CPU lacks it */
    if (isa == KVS_ISA_AVX512) return &f64_avx512;
    /* avx2x32: the AVX2 arithmetic with 32 registers where the CPU has AVX-512VL */
    if (isa != KVS_ISA_AVX2 && kvs_math_kernels_for(KVS_ISA_AVX2X32)) return &f64_avx2x32;
    return &f64_avx2;
#endif
    return NULL;
}

const kvs_math_f64_kernels *kvs_math_f64_kernels_active(void) {
    const kvs_math_f64_kernels *k = kvs_math_f64_kernels_for(kvs_math_isa_active());
    return k ? k : &f64_scalar;
}
