/* kvs_math_simd.c — the kernel tables behind kvs_math.h: the scalar reference and the vector tables avx2
 * (AVX2+FMA), avx2x32 and avx512, one chosen once per process by a CPU check (../shared/STYLE.md rules 6 and 9).
 * See kvs_math_simd.h for the contract: a vector variant computes every dot product, output element and
 * exponential the same way whatever the tiling, so a row's result does not depend on how many rows were computed
 * with it.
 *
 * The avx2x32 and avx512 tables compute the AVX2 arithmetic in wider tiles (32 registers; 16 lanes), so all three
 * vector tables give the same bits and the choice between them is speed alone: avx512 where 512-bit FMAs run at
 * full rate (a timed probe), else avx2x32 (see choose_isa).
 *
 * How the AVX2 kernels reach the FMA units (sim/BENCH.md has the floor computations):
 *  - scores: groups of 4 query rows against 3 key rows (12 accumulators; each 8-float chunk of a key row, loaded
 *    once, serves 4 FMAs), and tiles of 2 query rows x 4 key rows for the rows beyond the groups of 4; the sums
 *    leave the registers through one transposing add tree. Every dot product is one accumulator over the 8-lane
 *    chunks of d, reduced by that same tree, plus a scalar tail when d % 8 != 0 (adding the +0 tail otherwise
 *    would change no bit: a lane sum is never -0).
 *  - output: a tile of 4 rows x 16 floats (8 accumulators) reads 2 value vectors and 4 broadcast weights per 8
 *    FMAs; one row alone uses 64 floats of the output per pass. Value rows are walked in chunks that stay in
 *    L2 across the passes. Each output element is fma(p_j, v_j, acc) over ascending j in every path.
 *  - 16-bit K/V rows (scores16, output_add16): converted a tile at a time into L1 (vcvtph2ps for fp16, a shift
 *    for bf16) and computed by the fp32 kernels above, so they equal them bit for bit (see "16-bit K/V rows").
 *  - softmax: a Cephes-style exp (range reduction by ln 2 in two parts, degree-5 polynomial) on 8 lanes; the
 *    denominator summed in fp64 as the scalar reference does. softmax_probs is the same without the LSE's log.
 *  - dots_loose (a screen's fp32 dots, any order of the adds): 8 key rows a pass, one fma chain each.
 */
#include "kvs_math_simd.h"

#include "kvs_math.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- scalar reference: the loops kvs_math.c had before the kernels (kept so KVS_SIMD=scalar reproduces
 * earlier numbers bit for bit) ---- */

static float dot_scalar(const float *a, const float *b, size_t n) {
    /* Four partial sums so the loop vectorises without -ffast-math. */
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* `restrict`: -O2's cheap vectoriser refuses loops that would need a runtime alias check. */
static void axpy_scalar(float *restrict out, float w, const float *restrict v, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] += w * v[i];
}

static const float *row_of(const float *base, size_t stride, const int32_t *idx, size_t j) {
    return base + (idx ? (size_t)idx[j] : j) * stride;
}

static void scores_scalar(const float *q, size_t nr, const float *keys, size_t stride, const int32_t *idx, size_t n,
                          size_t d, float scale, float *const *out_rows, size_t col0) {
    for (size_t r = 0; r < nr; r++)
        for (size_t j = 0; j < n; j++)
            out_rows[r][col0 + j] = scale * dot_scalar(q + r * d, row_of(keys, stride, idx, j), d);
}

static void output_add_scalar(const float *const *p_rows, size_t nr, size_t col0, const float *values, size_t stride,
                              const int32_t *idx, size_t n, size_t d, float *const *out_rows) {
    for (size_t r = 0; r < nr; r++)
        for (size_t j = 0; j < n; j++) axpy_scalar(out_rows[r], p_rows[r][col0 + j], row_of(values, stride, idx, j), d);
}

/* The softmax's probabilities in x and its denominator (returned), its maximum in *mo. */
static double softmax_sum_scalar(float *x, size_t n, float *mo) {
    float m = -INFINITY;
    for (size_t j = 0; j < n; j++)
        if (x[j] > m) m = x[j];
    double sum = 0;
    for (size_t j = 0; j < n; j++) {
        float e = expf(x[j] - m);
        x[j] = e;
        sum += e;
    }
    float inv = (float)(1.0 / sum);
    for (size_t j = 0; j < n; j++) x[j] *= inv;
    *mo = m;
    return sum;
}

static double softmax_scalar(float *x, size_t n) {
    float m;
    double sum = softmax_sum_scalar(x, n, &m);
    return (double)m + log(sum);
}

static void softmax_probs_scalar(float *x, size_t n) {
    float m;
    (void)softmax_sum_scalar(x, n, &m);
}

static void exp_scalar(const float *x, size_t n, float *y) {
    for (size_t i = 0; i < n; i++) y[i] = expf(x[i]);
}

static size_t first_above_scalar(const float *x, size_t from, size_t n, float thr) {
    for (size_t j = from; j < n; j++)
        if (x[j] > thr) return j;
    return n;
}

/* ---- 16-bit K/V rows (K/V kept in the trace's 16-bit form, half the bytes to read; sim/BENCH.md "K/V in 16
 * bits") ----
 * The scalar table computes scores16 / output_add16 on tiles: a tile of rows is converted to fp32 into a buffer
 * that stays in L1 (16 KiB), and the table's own fp32 kernel runs on the tile; the AVX2 table does the same for 4
 * query rows or more (fewer convert in registers: KV16_TILED_ROWS below), the avx2x32 and avx512 tables convert
 * the rows in registers as they load them. The fp32 kernels compute each dot product and each output element the
 * same way whatever the tiling (kvs_math_simd.h), and each output element accumulates its rows in ascending order
 * from the value it holds, so either way gives the fp32 kernel's bits on the converted rows. The rows come from
 * memory at 2 bytes an element; a tile's conversion is amortised over the nr query rows that read it. */

/* fp32 floats of one tile: TILE_FLOATS / d rows (a multiple of 4, the scores kernels' key tile), at most 64. */
#define KV16_TILE_FLOATS 4096

static size_t kv16_tile_rows(size_t d) {
    size_t t = d ? KV16_TILE_FLOATS / d : 64;
    if (t > 64) t = 64;
    return t & ~(size_t)3; /* >= 4 for d <= KVS_KV16_MAX_DIM */
}

/* dst[t][0..d-1] = fp32 of row (idx ? idx[j0+t] : j0+t) of src, t < nt. */
typedef void (*kv16_convert_fn)(const uint16_t *src, kvs_dtype dtype, size_t stride, const int32_t *idx, size_t j0,
                                size_t nt, size_t d, float *dst);
typedef void (*scores_fn)(const float *q, size_t nr, const float *keys, size_t stride, const int32_t *idx, size_t n,
                          size_t d, float scale, float *const *out_rows, size_t col0);
typedef void (*output_add_fn)(const float *const *p_rows, size_t nr, size_t col0, const float *values, size_t stride,
                              const int32_t *idx, size_t n, size_t d, float *const *out_rows);

static const uint16_t *row16_of(const uint16_t *base, size_t stride, const int32_t *idx, size_t j) {
    return base + (idx ? (size_t)idx[j] : j) * stride;
}

static void scores16_tiled(scores_fn f32, kv16_convert_fn cvt, const float *q, size_t nr, const uint16_t *keys,
                           kvs_dtype dtype, size_t stride, const int32_t *idx, size_t n, size_t d, float scale,
                           float *const *out_rows, size_t col0) {
    KVS_ASSERT(d <= KVS_KV16_MAX_DIM && (dtype == KVS_DTYPE_F16 || dtype == KVS_DTYPE_BF16));
    _Alignas(64) float tile[KV16_TILE_FLOATS];
    size_t rows = kv16_tile_rows(d);
    for (size_t j0 = 0; j0 < n; j0 += rows) {
        size_t nt = n - j0 < rows ? n - j0 : rows;
        cvt(keys, dtype, stride, idx, j0, nt, d, tile);
        f32(q, nr, tile, d, NULL, nt, d, scale, out_rows, col0 + j0);
    }
}

static void output_add16_tiled(output_add_fn f32, kv16_convert_fn cvt, const float *const *p_rows, size_t nr,
                               size_t col0, const uint16_t *values, kvs_dtype dtype, size_t stride, const int32_t *idx,
                               size_t n, size_t d, float *const *out_rows) {
    KVS_ASSERT(d <= KVS_KV16_MAX_DIM && (dtype == KVS_DTYPE_F16 || dtype == KVS_DTYPE_BF16));
    _Alignas(64) float tile[KV16_TILE_FLOATS];
    size_t rows = kv16_tile_rows(d);
    for (size_t j0 = 0; j0 < n; j0 += rows) {
        size_t nt = n - j0 < rows ? n - j0 : rows;
        cvt(values, dtype, stride, idx, j0, nt, d, tile);
        f32(p_rows, nr, col0 + j0, tile, d, NULL, nt, d, out_rows);
    }
}

/* The scalar conversions of common/kvs.h (exact; vcvtph2ps gives the same bits, tests/test_common.c). */
static void kv16_convert_scalar(const uint16_t *src, kvs_dtype dtype, size_t stride, const int32_t *idx, size_t j0,
                                size_t nt, size_t d, float *dst) {
    for (size_t t = 0; t < nt; t++) {
        const uint16_t *row = row16_of(src, stride, idx, j0 + t);
        float *o = dst + t * d;
        if (dtype == KVS_DTYPE_BF16)
            for (size_t i = 0; i < d; i++) o[i] = kvs_bf16_to_f32(row[i]);
        else
            for (size_t i = 0; i < d; i++) o[i] = kvs_f16_to_f32(row[i]);
    }
}

static void scores16_scalar(const float *q, size_t nr, const uint16_t *keys, kvs_dtype dtype, size_t stride,
                            const int32_t *idx, size_t n, size_t d, float scale, float *const *out_rows, size_t col0) {
    scores16_tiled(scores_scalar, kv16_convert_scalar, q, nr, keys, dtype, stride, idx, n, d, scale, out_rows, col0);
}

static void output_add16_scalar(const float *const *p_rows, size_t nr, size_t col0, const uint16_t *values,
                                kvs_dtype dtype, size_t stride, const int32_t *idx, size_t n, size_t d,
                                float *const *out_rows) {
    output_add16_tiled(output_add_scalar, kv16_convert_scalar, p_rows, nr, col0, values, dtype, stride, idx, n, d,
                       out_rows);
}

static void dots_loose_scalar(const float *v, const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                              float *out) {
    for (size_t j = 0; j < n; j++) out[j] = dot_scalar(v, row_of(keys, stride, idx, j), d);
}

static int list_plain_scalar(const int32_t *idx, const void *const *row_k, const void *const *row_v, size_t n,
                             int64_t p) {
    int descents = 0;
    uintptr_t rows = 0;
    for (size_t j = 1; j < n; j++) descents |= idx[j] <= idx[j - 1];
    for (size_t j = 0; j < n; j++) rows |= (uintptr_t)row_k[j] | (uintptr_t)row_v[j];
    return !descents && !rows && idx[0] >= 0 && idx[n - 1] <= p;
}

static void desc_keys_scalar(const float *x, size_t n, uint32_t *key) {
    for (size_t i = 0; i < n; i++) key[i] = kvs_desc_key(x[i]);
}

static const kvs_math_kernels kernels_scalar = {
    /* .name = */ "scalar",
    /* .dot = */ dot_scalar,
    /* .axpy = */ axpy_scalar,
    /* .scores = */ scores_scalar,
    /* .output_add = */ output_add_scalar,
    /* .softmax = */ softmax_scalar,
    /* .softmax_probs = */ softmax_probs_scalar,
    /* .exp = */ exp_scalar,
    /* .first_above = */ first_above_scalar,
    /* .scores16 = */ scores16_scalar,
    /* .output_add16 = */ output_add16_scalar,
    /* .list_plain = */ list_plain_scalar,
    /* .dots_loose = */ dots_loose_scalar,
    /* .desc_keys = */ desc_keys_scalar,
};

/* ---- AVX2 + FMA ---- */

#if defined(__x86_64__) && defined(__GNUC__)
#define KVS_HAVE_AVX2_KERNELS 1
#include <cpuid.h>
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))

/* The 8 sums of 8 accumulators: lane k = (low half of a_k summed pairwise) + (high half summed pairwise). */
AVX2 static inline __m256 reduce8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                                  __m256 a7) {
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* One accumulator's sum, in reduce8's order. */
AVX2 static inline float reduce1(__m256 a) {
    __m256 t = _mm256_hadd_ps(a, a);
    t = _mm256_hadd_ps(t, t);
    return _mm_cvtss_f32(_mm256_castps256_ps128(t)) + _mm_cvtss_f32(_mm256_extractf128_ps(t, 1));
}

/* The d % 8 elements past the last full chunk, fused as the vector lanes are. */
AVX2 static inline float tail_dot(const float *a, const float *b, size_t from, size_t d) {
    float t = 0;
    for (size_t i = from; i < d; i++) t = fmaf(a[i], b[i], t);
    return t;
}

AVX2 static float dot_avx2(const float *a, const float *b, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    return reduce1(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3))) + tail_dot(a, b, i, n);
}

/* dots_loose: 8 keys a pass, one accumulator each (8 independent fma chains; one key at a time waited on its
 * chain's latency), their sums by reduce8. Any order of the adds is this entry's contract. */
AVX2 static void dots_loose_avx2(const float *v, const float *keys, size_t stride, const int32_t *idx, size_t n,
                                 size_t d, float *out) {
    size_t d8 = d & ~(size_t)7, j = 0;
    for (; j + 8 <= n; j += 8) {
        const float *k[8];
        for (size_t c = 0; c < 8; c++) k[c] = row_of(keys, stride, idx, j + c);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (size_t i = 0; i < d8; i += 8) {
            __m256 x = _mm256_loadu_ps(v + i);
            a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[0] + i), a0);
            a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[1] + i), a1);
            a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[2] + i), a2);
            a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[3] + i), a3);
            a4 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[4] + i), a4);
            a5 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[5] + i), a5);
            a6 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[6] + i), a6);
            a7 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[7] + i), a7);
        }
        _mm256_storeu_ps(out + j, reduce8(a0, a1, a2, a3, a4, a5, a6, a7));
        if (d8 < d)
            for (size_t c = 0; c < 8; c++) out[j + c] += tail_dot(v, k[c], d8, d);
    }
    for (; j < n; j++) out[j] = dot_avx2(v, row_of(keys, stride, idx, j), d);
}

AVX2 static void axpy_avx2(float *out, float w, const float *v, size_t n) {
    __m256 wv = _mm256_set1_ps(w);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(out + i)));
    for (; i < n; i++) out[i] = fmaf(w, v[i], out[i]);
}

/* One score: the single-accumulator dot product every tile computes. When d is a multiple of 8 the tail (+0) is
 * not added: that changes no bit, since a lane sum is never -0 (the accumulators start at +0 and an FMA whose exact
 * result is zero gives +0), so the score equals the 16-bit kernels' lane sum + tail too. */
AVX2 static inline float score1(const float *q, const float *k, size_t d, size_t d8) {
    __m256 a = _mm256_setzero_ps();
    for (size_t i = 0; i < d8; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), a);
    return d8 == d ? reduce1(a) : reduce1(a) + tail_dot(q, k, d8, d);
}

/* Rows in pairs (and one left over) against 4 keys at a time: the rows of scores_avx2 beyond its groups of 4. */
AVX2 static void scores_2x4(const float *q, size_t nr, const float *keys, size_t stride, const int32_t *idx, size_t n,
                            size_t d, float scale, float *const *out_rows, size_t col0) {
    size_t d8 = d & ~(size_t)7, j = 0;
    float s[8];
    for (; j + 4 <= n; j += 4) {
        const float *k0 = row_of(keys, stride, idx, j), *k1 = row_of(keys, stride, idx, j + 1);
        const float *k2 = row_of(keys, stride, idx, j + 2), *k3 = row_of(keys, stride, idx, j + 3);
        const float *kr[4] = {k0, k1, k2, k3};
        size_t r = 0;
        for (; r + 2 <= nr; r += 2) {
            const float *q0 = q + r * d, *q1 = q0 + d;
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
            __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
            for (size_t i = 0; i < d8; i += 8) {
                __m256 x0 = _mm256_loadu_ps(q0 + i), x1 = _mm256_loadu_ps(q1 + i);
                __m256 y = _mm256_loadu_ps(k0 + i);
                a00 = _mm256_fmadd_ps(x0, y, a00);
                a10 = _mm256_fmadd_ps(x1, y, a10);
                y = _mm256_loadu_ps(k1 + i);
                a01 = _mm256_fmadd_ps(x0, y, a01);
                a11 = _mm256_fmadd_ps(x1, y, a11);
                y = _mm256_loadu_ps(k2 + i);
                a02 = _mm256_fmadd_ps(x0, y, a02);
                a12 = _mm256_fmadd_ps(x1, y, a12);
                y = _mm256_loadu_ps(k3 + i);
                a03 = _mm256_fmadd_ps(x0, y, a03);
                a13 = _mm256_fmadd_ps(x1, y, a13);
            }
            __m256 sum = reduce8(a00, a01, a02, a03, a10, a11, a12, a13);
            if (d8 == d) { /* no tail: the 8 scaled scores leave in two 4-float stores */
                sum = _mm256_mul_ps(_mm256_set1_ps(scale), sum);
                _mm_storeu_ps(out_rows[r] + col0 + j, _mm256_castps256_ps128(sum));
                _mm_storeu_ps(out_rows[r + 1] + col0 + j, _mm256_extractf128_ps(sum, 1));
                continue;
            }
            _mm256_storeu_ps(s, sum);
            for (int c = 0; c < 4; c++) {
                out_rows[r][col0 + j + (size_t)c] = scale * (s[c] + tail_dot(q0, kr[c], d8, d));
                out_rows[r + 1][col0 + j + (size_t)c] = scale * (s[4 + c] + tail_dot(q1, kr[c], d8, d));
            }
        }
        if (r < nr) {
            const float *q0 = q + r * d;
            __m256 z = _mm256_setzero_ps(), a0 = z, a1 = z, a2 = z, a3 = z;
            for (size_t i = 0; i < d8; i += 8) {
                __m256 x0 = _mm256_loadu_ps(q0 + i);
                a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k0 + i), a0);
                a1 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k1 + i), a1);
                a2 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k2 + i), a2);
                a3 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k3 + i), a3);
            }
            __m256 sum = reduce8(a0, a1, a2, a3, z, z, z, z);
            if (d8 == d) {
                _mm_storeu_ps(out_rows[r] + col0 + j, _mm_mul_ps(_mm_set1_ps(scale), _mm256_castps256_ps128(sum)));
                continue;
            }
            _mm256_storeu_ps(s, sum);
            for (int c = 0; c < 4; c++) out_rows[r][col0 + j + (size_t)c] = scale * (s[c] + tail_dot(q0, kr[c], d8, d));
        }
    }
    for (; j < n; j++) {
        const float *k = row_of(keys, stride, idx, j);
        for (size_t r = 0; r < nr; r++) out_rows[r][col0 + j] = scale * score1(q + r * d, k, d, d8);
    }
}

/* Fetches a key row into L1 ahead of its tile (a selection's rows are scattered, which the hardware prefetcher
 * does not follow). */
AVX2 static inline void prefetch_row(const float *row, size_t d) {
    for (size_t i = 0; i < d; i += 16) _mm_prefetch((const char *)(row + i), _MM_HINT_T0);
}

/* A scaled score from its lane sum: the tail (d % 8) added when there is one, as score1 does. */
AVX2 static inline float finish_score(float lanes, const float *q, const float *k, size_t d8, size_t d, float scale) {
    return scale * (d8 == d ? lanes : lanes + tail_dot(q, k, d8, d));
}

/* Groups of 4 query rows (a GQA group of 4, or 4 rows of a block) against 3 keys at a time: 12 accumulators, and
 * each 8-float chunk of a key row, loaded once (often from L2: a selection's rows are scattered), serves 4 FMAs
 * (the 2 x 4 tile read every key chunk once per row pair: 61% of the FMA peak against 82% in an L2-resident
 * microbenchmark at d 128). Rows beyond the groups of 4 take the 2 x 4 tiles. Every score is the same single
 * accumulator reduced by reduce8's tree, as in every other path. */
AVX2 static void scores_avx2(const float *q, size_t nr, const float *keys, size_t stride, const int32_t *idx, size_t n,
                             size_t d, float scale, float *const *out_rows, size_t col0) {
    size_t d8 = d & ~(size_t)7, r4 = nr & ~(size_t)3, j = 0;
    if (r4 > 0) {
        float s[16];
        for (; j + 3 <= n; j += 3) {
            const float *k0 = row_of(keys, stride, idx, j), *k1 = row_of(keys, stride, idx, j + 1);
            const float *k2 = row_of(keys, stride, idx, j + 2);
            if (idx && j + 6 <= n) /* the next tile's scattered rows (+3% in the microbenchmark) */
                for (size_t c = 3; c < 6; c++) prefetch_row(keys + (size_t)idx[j + c] * stride, d);
            for (size_t r = 0; r < r4; r += 4) {
                const float *q0 = q + r * d, *q1 = q0 + d, *q2 = q1 + d, *q3 = q2 + d;
                __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
                __m256 a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
                for (size_t i = 0; i < d8; i += 8) {
                    __m256 y0 = _mm256_loadu_ps(k0 + i), y1 = _mm256_loadu_ps(k1 + i), y2 = _mm256_loadu_ps(k2 + i);
                    __m256 x = _mm256_loadu_ps(q0 + i);
                    a00 = _mm256_fmadd_ps(x, y0, a00);
                    a01 = _mm256_fmadd_ps(x, y1, a01);
                    a02 = _mm256_fmadd_ps(x, y2, a02);
                    x = _mm256_loadu_ps(q1 + i);
                    a10 = _mm256_fmadd_ps(x, y0, a10);
                    a11 = _mm256_fmadd_ps(x, y1, a11);
                    a12 = _mm256_fmadd_ps(x, y2, a12);
                    x = _mm256_loadu_ps(q2 + i);
                    a20 = _mm256_fmadd_ps(x, y0, a20);
                    a21 = _mm256_fmadd_ps(x, y1, a21);
                    a22 = _mm256_fmadd_ps(x, y2, a22);
                    x = _mm256_loadu_ps(q3 + i);
                    a30 = _mm256_fmadd_ps(x, y0, a30);
                    a31 = _mm256_fmadd_ps(x, y1, a31);
                    a32 = _mm256_fmadd_ps(x, y2, a32);
                }
                __m256 z = _mm256_setzero_ps();
                _mm256_storeu_ps(s, reduce8(a00, a01, a02, a10, a11, a12, a20, a21));
                _mm256_storeu_ps(s + 8, reduce8(a22, a30, a31, a32, z, z, z, z));
                const float *qr[4] = {q0, q1, q2, q3}, *kc[3] = {k0, k1, k2};
                for (size_t x = 0; x < 4; x++)
                    for (size_t c = 0; c < 3; c++)
                        out_rows[r + x][col0 + j + c] = finish_score(s[3 * x + c], qr[x], kc[c], d8, d, scale);
            }
        }
        for (; j < n; j++) {
            const float *k = row_of(keys, stride, idx, j);
            for (size_t r = 0; r < r4; r++) out_rows[r][col0 + j] = scale * score1(q + r * d, k, d, d8);
        }
    }
    if (r4 < nr) scores_2x4(q + r4 * d, nr - r4, keys, stride, idx, n, d, scale, out_rows + r4, col0);
}

/* Value rows per pass of the output tiles: 256 rows of d = 128 are 128 KiB, resident in L2 while every row
 * tile and column chunk of the output walks them. */
#define OUTPUT_ROWS_PER_PASS 256

/* One output row's 64 columns in 8 named accumulators: the one-row paths below run their fma chains through these.
 * As an array (`__m256 c[8]`, a loop over k) gcc -O2 kept them on the stack, each FMA a load and a store behind the
 * last (a one-row call ran at 14-25% of the FMA peak); a struct's members are scalarised into
 * registers once the helpers are inlined. */
typedef struct {
    __m256 c0, c1, c2, c3, c4, c5, c6, c7;
} acc64;

__attribute__((always_inline)) AVX2 static inline acc64 acc64_load(const float *o) {
    return (acc64){_mm256_loadu_ps(o),      _mm256_loadu_ps(o + 8),  _mm256_loadu_ps(o + 16),
                   _mm256_loadu_ps(o + 24), _mm256_loadu_ps(o + 32), _mm256_loadu_ps(o + 40),
                   _mm256_loadu_ps(o + 48), _mm256_loadu_ps(o + 56)};
}

__attribute__((always_inline)) AVX2 static inline void acc64_store(float *o, acc64 a) {
    _mm256_storeu_ps(o, a.c0);
    _mm256_storeu_ps(o + 8, a.c1);
    _mm256_storeu_ps(o + 16, a.c2);
    _mm256_storeu_ps(o + 24, a.c3);
    _mm256_storeu_ps(o + 32, a.c4);
    _mm256_storeu_ps(o + 40, a.c5);
    _mm256_storeu_ps(o + 48, a.c6);
    _mm256_storeu_ps(o + 56, a.c7);
}

/* a += w * v[0..64), each column its own fma */
__attribute__((always_inline)) AVX2 static inline void acc64_fma(acc64 *a, __m256 w, const float *v) {
    a->c0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v), a->c0);
    a->c1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8), a->c1);
    a->c2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 16), a->c2);
    a->c3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 24), a->c3);
    a->c4 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 32), a->c4);
    a->c5 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 40), a->c5);
    a->c6 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 48), a->c6);
    a->c7 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 56), a->c7);
}

AVX2 static void output_add_avx2(const float *const *p_rows, size_t nr, size_t col0, const float *values,
                                 size_t stride, const int32_t *idx, size_t n, size_t d, float *const *out_rows) {
    for (size_t jb = 0; jb < n; jb += OUTPUT_ROWS_PER_PASS) {
        size_t je = jb + OUTPUT_ROWS_PER_PASS < n ? jb + OUTPUT_ROWS_PER_PASS : n;
        size_t r = 0;
        for (; r + 4 <= nr; r += 4) {
            const float *p0 = p_rows[r] + col0, *p1 = p_rows[r + 1] + col0, *p2 = p_rows[r + 2] + col0,
                        *p3 = p_rows[r + 3] + col0;
            float *o0 = out_rows[r], *o1 = out_rows[r + 1], *o2 = out_rows[r + 2], *o3 = out_rows[r + 3];
            size_t i = 0;
            for (; i + 16 <= d; i += 16) {
                __m256 c00 = _mm256_loadu_ps(o0 + i), c01 = _mm256_loadu_ps(o0 + i + 8);
                __m256 c10 = _mm256_loadu_ps(o1 + i), c11 = _mm256_loadu_ps(o1 + i + 8);
                __m256 c20 = _mm256_loadu_ps(o2 + i), c21 = _mm256_loadu_ps(o2 + i + 8);
                __m256 c30 = _mm256_loadu_ps(o3 + i), c31 = _mm256_loadu_ps(o3 + i + 8);
                for (size_t j = jb; j < je; j++) {
                    const float *v = row_of(values, stride, idx, j) + i;
                    __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
                    __m256 w = _mm256_broadcast_ss(p0 + j);
                    c00 = _mm256_fmadd_ps(w, v0, c00);
                    c01 = _mm256_fmadd_ps(w, v1, c01);
                    w = _mm256_broadcast_ss(p1 + j);
                    c10 = _mm256_fmadd_ps(w, v0, c10);
                    c11 = _mm256_fmadd_ps(w, v1, c11);
                    w = _mm256_broadcast_ss(p2 + j);
                    c20 = _mm256_fmadd_ps(w, v0, c20);
                    c21 = _mm256_fmadd_ps(w, v1, c21);
                    w = _mm256_broadcast_ss(p3 + j);
                    c30 = _mm256_fmadd_ps(w, v0, c30);
                    c31 = _mm256_fmadd_ps(w, v1, c31);
                }
                _mm256_storeu_ps(o0 + i, c00);
                _mm256_storeu_ps(o0 + i + 8, c01);
                _mm256_storeu_ps(o1 + i, c10);
                _mm256_storeu_ps(o1 + i + 8, c11);
                _mm256_storeu_ps(o2 + i, c20);
                _mm256_storeu_ps(o2 + i + 8, c21);
                _mm256_storeu_ps(o3 + i, c30);
                _mm256_storeu_ps(o3 + i + 8, c31);
            }
            for (; i < d; i++) { /* d % 16 leftovers, element by element in the same fused order */
                float c0 = o0[i], c1 = o1[i], c2 = o2[i], c3 = o3[i];
                for (size_t j = jb; j < je; j++) {
                    float v = row_of(values, stride, idx, j)[i];
                    c0 = fmaf(p0[j], v, c0);
                    c1 = fmaf(p1[j], v, c1);
                    c2 = fmaf(p2[j], v, c2);
                    c3 = fmaf(p3[j], v, c3);
                }
                o0[i] = c0;
                o1[i] = c1;
                o2[i] = c2;
                o3[i] = c3;
            }
        }
        for (; r < nr; r++) {
            const float *p = p_rows[r] + col0;
            float *o = out_rows[r];
            size_t i = 0;
            for (; i + 64 <= d; i += 64) {
                acc64 a = acc64_load(o + i);
                for (size_t j = jb; j < je; j++)
                    acc64_fma(&a, _mm256_broadcast_ss(p + j), row_of(values, stride, idx, j) + i);
                acc64_store(o + i, a);
            }
            for (; i + 8 <= d; i += 8) {
                __m256 c = _mm256_loadu_ps(o + i);
                for (size_t j = jb; j < je; j++)
                    c = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_loadu_ps(row_of(values, stride, idx, j) + i), c);
                _mm256_storeu_ps(o + i, c);
            }
            for (; i < d; i++) {
                float c = o[i];
                for (size_t j = jb; j < je; j++) c = fmaf(p[j], row_of(values, stride, idx, j)[i], c);
                o[i] = c;
            }
        }
    }
}

/* exp on 8 lanes (Cephes expf's reduction and polynomial): x = n ln2 + r, |r| <= ln2/2, ln2 split in a part
 * exact in fp32 and a correction; exp(r) = 1 + r + r^2 P(r); times 2^n through the exponent bits. NaN passes
 * through; below KVS_SIMD_EXP_LO the result is 0; arguments above 88.376 are clamped there (a softmax's are
 * <= 0). */
/* exp8 in two stages, so that a loop can run the first stage of one block of 8 beside the second stage of the
 * previous one (exp_pipe below): the same operations on every lane in the same order, so the same bits. */
typedef struct { /* the NaN and underflow masks are taken from x in the second stage: 2 registers fewer live between
                  * the stages of a pipelined loop (with them, 0.59 ns an element of softmax, 0.52 without) */
    __m256 x, r, scale_bits;
} exp8_mid;

AVX2 static inline exp8_mid exp8_first(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(KVS_SIMD_EXP_LO);
    exp8_mid m;
    m.x = x;
    __m256 c = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), c);
    m.r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    m.scale_bits = _mm256_castsi256_ps(e);
    return m;
}

AVX2 static inline __m256 exp8_second(exp8_mid m) {
    __m256 r = m.r;
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    y = _mm256_mul_ps(y, m.scale_bits);
    y = _mm256_andnot_ps(_mm256_cmp_ps(m.x, _mm256_set1_ps(KVS_SIMD_EXP_LO), _CMP_LT_OQ), y);
    return _mm256_blendv_ps(y, m.x, _mm256_cmp_ps(m.x, m.x, _CMP_UNORD_Q));
}

AVX2 static inline __m256 exp8(__m256 x) { return exp8_second(exp8_first(x)); }

/* The last n % 8 elements through the same 8-lane exp (so one element's value never depends on where it sits);
 * padding lanes hold 0 and are dropped. */
AVX2 static inline __m256 exp8_partial(const float *x, size_t k, float *y) {
    float buf[8] = {0};
    memcpy(buf, x, k * sizeof *buf);
    __m256 e = exp8(_mm256_loadu_ps(buf));
    _mm256_storeu_ps(buf, e);
    memcpy(y, buf, k * sizeof *buf);
    return e;
}

AVX2 static void exp_avx2(const float *x, size_t n, float *y) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
    if (i < n) exp8_partial(x + i, n - i, y + i);
}

/* The softmax's last n - j (< 8) exponentials, exp(x - m) in place through the 8-lane exp (so an element's value
 * never depends on where it sits), each added to sum in order; @return the sum (every vector table's softmax). */
AVX2 static inline double exp_tail_sum(float *x, size_t j, size_t n, float m, double sum) {
    if (j >= n) return sum;
    float t[8];
    for (size_t k = 0; k < n - j; k++) t[k] = x[j + k] - m;
    exp8_partial(t, n - j, x + j);
    for (; j < n; j++) sum += x[j];
    return sum;
}

/* The softmax's two fp64 sums over x[0..n8), n8 a multiple of 8, block by block in order: lanes 0-3 of each block to
 * s0, lanes 4-7 to s1 (the scalar reference's order). A pass of its own after the exponentials: in the same loop,
 * the sums' conversions and adds sit in the out-of-order window beside the exp chains and hold fewer blocks in
 * flight (0.59 against 0.52 ns an element in `bench_speed kernels`' softmax line). */
AVX2 static inline void sum_blocks(const float *x, size_t n8, __m256d *s0, __m256d *s1) {
    for (size_t k = 0; k < n8; k += 8) {
        __m256 e = _mm256_loadu_ps(x + k);
        *s0 = _mm256_add_pd(*s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        *s1 = _mm256_add_pd(*s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
}

/* The softmax's probabilities in x and its denominator (returned), its maximum in *mo: inlined into the two
 * entries below. */
__attribute__((always_inline)) AVX2 static inline double softmax_sum_avx2(float *x, size_t n, float *mo) {
    /* max: vmaxps returns its second operand when either is NaN, so a NaN element is skipped as the scalar
     * reference's `x > m` skips it */
    __m256 mv = _mm256_set1_ps(-INFINITY), mv1 = mv, mv2 = mv, mv3 = mv;
    size_t j = 0;
    /* four running maxima (a max is the same whatever the order; a +0/-0 tie changes no x - m below) */
    for (; j + 32 <= n; j += 32) {
        mv = _mm256_max_ps(_mm256_loadu_ps(x + j), mv);
        mv1 = _mm256_max_ps(_mm256_loadu_ps(x + j + 8), mv1);
        mv2 = _mm256_max_ps(_mm256_loadu_ps(x + j + 16), mv2);
        mv3 = _mm256_max_ps(_mm256_loadu_ps(x + j + 24), mv3);
    }
    mv = _mm256_max_ps(_mm256_max_ps(mv, mv1), _mm256_max_ps(mv2, mv3));
    for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(_mm256_loadu_ps(x + j), mv);
    float lanes[8];
    _mm256_storeu_ps(lanes, mv);
    float m = -INFINITY;
    for (int k = 0; k < 8; k++)
        if (lanes[k] > m) m = lanes[k];
    for (; j < n; j++)
        if (x[j] > m) m = x[j];
    __m256 mb = _mm256_set1_ps(m);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    j = 0;
    /* Software-pipelined two blocks deep: the first stage of block j + 16 is issued before the second stage of
     * block j. One exp8 is a dependent chain of ~60 cycles; in one piece, the out-of-order window held too few
     * blocks to cover it (0.73 ns per element on the development VM, 2.7 cycles). */
    if (n >= 16) {
        exp8_mid cur = exp8_first(_mm256_sub_ps(_mm256_loadu_ps(x), mb));
        exp8_mid nxt = exp8_first(_mm256_sub_ps(_mm256_loadu_ps(x + 8), mb));
        for (; j + 24 <= n; j += 8) {
            exp8_mid next = exp8_first(_mm256_sub_ps(_mm256_loadu_ps(x + j + 16), mb));
            _mm256_storeu_ps(x + j, exp8_second(cur));
            cur = nxt;
            nxt = next;
        }
        _mm256_storeu_ps(x + j, exp8_second(cur));
        _mm256_storeu_ps(x + j + 8, exp8_second(nxt));
        j += 16;
    }
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mb)));
    sum_blocks(x, j, &s0, &s1);
    double sd[4];
    _mm256_storeu_pd(sd, _mm256_add_pd(s0, s1));
    double sum = (sd[0] + sd[1]) + (sd[2] + sd[3]);
    sum = exp_tail_sum(x, j, n, m, sum);
    __m256 inv = _mm256_set1_ps((float)(1.0 / sum));
    j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), inv));
    float invs = (float)(1.0 / sum);
    for (; j < n; j++) x[j] *= invs;
    *mo = m;
    return sum;
}

AVX2 static double softmax_avx2(float *x, size_t n) {
    float m;
    double sum = softmax_sum_avx2(x, n, &m);
    return (double)m + log(sum);
}

AVX2 static void softmax_probs_avx2(float *x, size_t n) {
    float m;
    (void)softmax_sum_avx2(x, n, &m);
}

AVX2 static size_t first_above_avx2(const float *x, size_t from, size_t n, float thr) {
    __m256 t = _mm256_set1_ps(thr);
    size_t j = from;
    for (; j + 8 <= n; j += 8) {
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), t, _CMP_GT_OQ));
        if (mask) return j + (size_t)__builtin_ctz((unsigned)mask);
    }
    for (; j < n; j++)
        if (x[j] > thr) return j;
    return n;
}

/* 8 halves to 8 floats in registers: vcvtph2ps (F16C) for fp16; bf16 is the top half of an fp32, so a 16-bit
 * shift of the zero-extended lanes. The d % 8 tail through the scalar conversions (same bits). */
__attribute__((target("avx2,f16c"))) static void kv16_convert_avx2(const uint16_t *src, kvs_dtype dtype,
                                                                    size_t stride, const int32_t *idx, size_t j0,
                                                                    size_t nt, size_t d, float *dst) {
    size_t d8 = d & ~(size_t)7;
    for (size_t t = 0; t < nt; t++) {
        const uint16_t *row = row16_of(src, stride, idx, j0 + t);
        float *o = dst + t * d;
        if (dtype == KVS_DTYPE_BF16) {
            for (size_t i = 0; i < d8; i += 8) {
                __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + i)));
                _mm256_storeu_ps(o + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
            }
            for (size_t i = d8; i < d; i++) o[i] = kvs_bf16_to_f32(row[i]);
        } else {
            for (size_t i = 0; i < d8; i += 8)
                _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + i))));
            for (size_t i = d8; i < d; i++) o[i] = kvs_f16_to_f32(row[i]);
        }
    }
}

/* Few query rows (nr < KV16_TILED_ROWS): converting a tile into L1 costs a store and a reload per 8 elements that
 * only nr rows share, so the rows are converted in registers as they are read, in the fp32 kernels' own order:
 * each score is one accumulator over the 8-lane chunks of d, reduced by reduce8 / reduce1, plus the fused scalar
 * tail; each output element is fma(p_j, v_j, acc) over ascending j from the value it holds. So these equal
 * scores_avx2 / output_add_avx2 on the converted rows bit for bit, as the tiled path does (tests/test_kv16.c). */
#define KV16_TILED_ROWS 4
#define AVX2_F16C __attribute__((target("avx2,fma,f16c")))

AVX2_F16C static inline __m256 load8h(const uint16_t *p, int bf16) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    return bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
}

static inline float half1(uint16_t h, int bf16) { return bf16 ? kvs_bf16_to_f32(h) : kvs_f16_to_f32(h); }

AVX2_F16C static inline float tail_dot16(const float *a, const uint16_t *b, size_t from, size_t d, int bf16) {
    float t = 0;
    for (size_t i = from; i < d; i++) t = fmaf(a[i], half1(b[i], bf16), t);
    return t;
}

__attribute__((always_inline)) AVX2_F16C static inline void
scores16_rows(const float *q, size_t nr, const uint16_t *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
              float scale, float *const *out_rows, size_t col0, int bf16) {
    size_t d8 = d & ~(size_t)7, j = 0;
    float s[8];
    for (; j + 4 <= n; j += 4) {
        const uint16_t *kr[4];
        for (int c = 0; c < 4; c++) kr[c] = row16_of(keys, stride, idx, j + (size_t)c);
        size_t r = 0;
        for (; r + 2 <= nr; r += 2) {
            const float *q0 = q + r * d, *q1 = q0 + d;
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
            __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
            for (size_t i = 0; i < d8; i += 8) {
                __m256 x0 = _mm256_loadu_ps(q0 + i), x1 = _mm256_loadu_ps(q1 + i);
                __m256 y = load8h(kr[0] + i, bf16);
                a00 = _mm256_fmadd_ps(x0, y, a00);
                a10 = _mm256_fmadd_ps(x1, y, a10);
                y = load8h(kr[1] + i, bf16);
                a01 = _mm256_fmadd_ps(x0, y, a01);
                a11 = _mm256_fmadd_ps(x1, y, a11);
                y = load8h(kr[2] + i, bf16);
                a02 = _mm256_fmadd_ps(x0, y, a02);
                a12 = _mm256_fmadd_ps(x1, y, a12);
                y = load8h(kr[3] + i, bf16);
                a03 = _mm256_fmadd_ps(x0, y, a03);
                a13 = _mm256_fmadd_ps(x1, y, a13);
            }
            _mm256_storeu_ps(s, reduce8(a00, a01, a02, a03, a10, a11, a12, a13));
            for (int c = 0; c < 4; c++) {
                out_rows[r][col0 + j + (size_t)c] = scale * (s[c] + tail_dot16(q0, kr[c], d8, d, bf16));
                out_rows[r + 1][col0 + j + (size_t)c] = scale * (s[4 + c] + tail_dot16(q1, kr[c], d8, d, bf16));
            }
        }
        if (r < nr) {
            const float *q0 = q + r * d;
            __m256 z = _mm256_setzero_ps(), a0 = z, a1 = z, a2 = z, a3 = z;
            for (size_t i = 0; i < d8; i += 8) {
                __m256 x0 = _mm256_loadu_ps(q0 + i);
                a0 = _mm256_fmadd_ps(x0, load8h(kr[0] + i, bf16), a0);
                a1 = _mm256_fmadd_ps(x0, load8h(kr[1] + i, bf16), a1);
                a2 = _mm256_fmadd_ps(x0, load8h(kr[2] + i, bf16), a2);
                a3 = _mm256_fmadd_ps(x0, load8h(kr[3] + i, bf16), a3);
            }
            _mm256_storeu_ps(s, reduce8(a0, a1, a2, a3, z, z, z, z));
            for (int c = 0; c < 4; c++)
                out_rows[r][col0 + j + (size_t)c] = scale * (s[c] + tail_dot16(q0, kr[c], d8, d, bf16));
        }
    }
    for (; j < n; j++) {
        const uint16_t *k = row16_of(keys, stride, idx, j);
        for (size_t r = 0; r < nr; r++) {
            const float *q0 = q + r * d;
            __m256 a = _mm256_setzero_ps();
            for (size_t i = 0; i < d8; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i), load8h(k + i, bf16), a);
            out_rows[r][col0 + j] = scale * (reduce1(a) + tail_dot16(q0, k, d8, d, bf16));
        }
    }
}

/* acc64_fma over 16-bit values, converted in registers */
__attribute__((always_inline)) AVX2_F16C static inline void acc64_fma16(acc64 *a, __m256 w, const uint16_t *v,
                                                                        int bf16) {
    a->c0 = _mm256_fmadd_ps(w, load8h(v, bf16), a->c0);
    a->c1 = _mm256_fmadd_ps(w, load8h(v + 8, bf16), a->c1);
    a->c2 = _mm256_fmadd_ps(w, load8h(v + 16, bf16), a->c2);
    a->c3 = _mm256_fmadd_ps(w, load8h(v + 24, bf16), a->c3);
    a->c4 = _mm256_fmadd_ps(w, load8h(v + 32, bf16), a->c4);
    a->c5 = _mm256_fmadd_ps(w, load8h(v + 40, bf16), a->c5);
    a->c6 = _mm256_fmadd_ps(w, load8h(v + 48, bf16), a->c6);
    a->c7 = _mm256_fmadd_ps(w, load8h(v + 56, bf16), a->c7);
}

/* Row by row, 64 output floats per pass as output_add_avx2's single-row path (8 accumulators). */
__attribute__((always_inline)) AVX2_F16C static inline void
output_add16_rows(const float *const *p_rows, size_t nr, size_t col0, const uint16_t *values, size_t stride,
                  const int32_t *idx, size_t n, size_t d, float *const *out_rows, int bf16) {
    for (size_t r = 0; r < nr; r++) {
        const float *p = p_rows[r] + col0;
        float *o = out_rows[r];
        size_t i = 0;
        for (; i + 64 <= d; i += 64) {
            acc64 a = acc64_load(o + i);
            for (size_t j = 0; j < n; j++)
                acc64_fma16(&a, _mm256_broadcast_ss(p + j), row16_of(values, stride, idx, j) + i, bf16);
            acc64_store(o + i, a);
        }
        for (; i + 8 <= d; i += 8) {
            __m256 c = _mm256_loadu_ps(o + i);
            for (size_t j = 0; j < n; j++)
                c = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), load8h(row16_of(values, stride, idx, j) + i, bf16), c);
            _mm256_storeu_ps(o + i, c);
        }
        for (; i < d; i++) {
            float c = o[i];
            for (size_t j = 0; j < n; j++) c = fmaf(p[j], half1(row16_of(values, stride, idx, j)[i], bf16), c);
            o[i] = c;
        }
    }
}

AVX2_F16C static void scores16_rows_f16(const float *q, size_t nr, const uint16_t *keys, size_t stride,
                                        const int32_t *idx, size_t n, size_t d, float scale, float *const *out_rows,
                                        size_t col0) {
    scores16_rows(q, nr, keys, stride, idx, n, d, scale, out_rows, col0, 0);
}
AVX2_F16C static void scores16_rows_bf16(const float *q, size_t nr, const uint16_t *keys, size_t stride,
                                         const int32_t *idx, size_t n, size_t d, float scale, float *const *out_rows,
                                         size_t col0) {
    scores16_rows(q, nr, keys, stride, idx, n, d, scale, out_rows, col0, 1);
}
AVX2_F16C static void output_add16_rows_f16(const float *const *p_rows, size_t nr, size_t col0, const uint16_t *values,
                                            size_t stride, const int32_t *idx, size_t n, size_t d,
                                            float *const *out_rows) {
    output_add16_rows(p_rows, nr, col0, values, stride, idx, n, d, out_rows, 0);
}
AVX2_F16C static void output_add16_rows_bf16(const float *const *p_rows, size_t nr, size_t col0,
                                             const uint16_t *values, size_t stride, const int32_t *idx, size_t n,
                                             size_t d, float *const *out_rows) {
    output_add16_rows(p_rows, nr, col0, values, stride, idx, n, d, out_rows, 1);
}

static void scores16_avx2(const float *q, size_t nr, const uint16_t *keys, kvs_dtype dtype, size_t stride,
                          const int32_t *idx, size_t n, size_t d, float scale, float *const *out_rows, size_t col0) {
    if (nr >= KV16_TILED_ROWS)
        scores16_tiled(scores_avx2, kv16_convert_avx2, q, nr, keys, dtype, stride, idx, n, d, scale, out_rows, col0);
    else if (dtype == KVS_DTYPE_BF16)
        scores16_rows_bf16(q, nr, keys, stride, idx, n, d, scale, out_rows, col0);
    else
        scores16_rows_f16(q, nr, keys, stride, idx, n, d, scale, out_rows, col0);
}

static void output_add16_avx2(const float *const *p_rows, size_t nr, size_t col0, const uint16_t *values,
                              kvs_dtype dtype, size_t stride, const int32_t *idx, size_t n, size_t d,
                              float *const *out_rows) {
    if (nr >= KV16_TILED_ROWS)
        output_add16_tiled(output_add_avx2, kv16_convert_avx2, p_rows, nr, col0, values, dtype, stride, idx, n, d,
                           out_rows);
    else if (dtype == KVS_DTYPE_BF16)
        output_add16_rows_bf16(p_rows, nr, col0, values, stride, idx, n, d, out_rows);
    else
        output_add16_rows_f16(p_rows, nr, col0, values, stride, idx, n, d, out_rows);
}

/* 32-byte loads: 4 pointers of each row array, 8 positions compared with their predecessors, a step (the
 * compiler's SSE2 loops take 16 bytes, and the check is on every selection of a sweep). */
AVX2 static int list_plain_avx2(const int32_t *idx, const void *const *row_k, const void *const *row_v, size_t n,
                                int64_t p) {
    __m256i rows = _mm256_setzero_si256(), rows1 = rows;
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        rows = _mm256_or_si256(rows, _mm256_or_si256(_mm256_loadu_si256((const __m256i *)(const void *)(row_k + j)),
                                                     _mm256_loadu_si256((const __m256i *)(const void *)(row_v + j))));
        rows1 = _mm256_or_si256(rows1,
                                _mm256_or_si256(_mm256_loadu_si256((const __m256i *)(const void *)(row_k + j + 4)),
                                                _mm256_loadu_si256((const __m256i *)(const void *)(row_v + j + 4))));
    }
    uintptr_t tail = 0;
    for (; j < n; j++) tail |= (uintptr_t)row_k[j] | (uintptr_t)row_v[j];
    rows = _mm256_or_si256(rows, rows1);
    if (tail || !_mm256_testz_si256(rows, rows)) return 0;
    __m256i up = _mm256_set1_epi32(-1); /* lanes where idx[j] > idx[j - 1] so far */
    for (j = 1; j + 8 <= n; j += 8)
        up = _mm256_and_si256(up, _mm256_cmpgt_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(idx + j)),
                                                     _mm256_loadu_si256((const __m256i *)(const void *)(idx + j - 1))));
    int descents = _mm256_movemask_epi8(up) != -1;
    for (; j < n; j++) descents |= idx[j] <= idx[j - 1];
    return !descents && idx[0] >= 0 && idx[n - 1] <= p;
}

/* kvs_desc_key 8 keys a vector (the scalar loop takes 2.7 cycles a position, more than a ranking's histogram
 * after it): the same bit operations, the selects as masks. */
AVX2 static void desc_keys_avx2(const float *x, size_t n, uint32_t *key) {
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u), absmask = _mm256_set1_epi32(0x7fffffff);
    const __m256i inf = _mm256_set1_epi32(0x7f800000), ones = _mm256_set1_epi32(-1), zero = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(x + i));
        __m256i mag = _mm256_and_si256(b, absmask);
        b = _mm256_andnot_si256(_mm256_cmpeq_epi32(mag, zero), b);       /* -0 ranks as +0 */
        __m256i neg = _mm256_srai_epi32(b, 31);                          /* sign set: all ones */
        __m256i pos = _mm256_xor_si256(_mm256_or_si256(b, sign), ones); /* ~(b | sign) */
        __m256i k = _mm256_blendv_epi8(pos, b, neg);
        k = _mm256_add_epi32(k, _mm256_cmpeq_epi32(k, ones));            /* UINT32_MAX -> UINT32_MAX - 1 */
        k = _mm256_or_si256(k, _mm256_cmpgt_epi32(mag, inf));            /* NaN -> UINT32_MAX */
        _mm256_storeu_si256((__m256i *)(void *)(key + i), k);
    }
    for (; i < n; i++) key[i] = kvs_desc_key(x[i]);
}

static const kvs_math_kernels kernels_avx2 = {
    /* .name = */ "avx2",
    /* .dot = */ dot_avx2,
    /* .axpy = */ axpy_avx2,
    /* .scores = */ scores_avx2,
    /* .output_add = */ output_add_avx2,
    /* .softmax = */ softmax_avx2,
    /* .softmax_probs = */ softmax_probs_avx2,
    /* .exp = */ exp_avx2,
    /* .first_above = */ first_above_avx2,
    /* .scores16 = */ scores16_avx2,
    /* .output_add16 = */ output_add16_avx2,
    /* .list_plain = */ list_plain_avx2,
    /* .dots_loose = */ dots_loose_avx2,
    /* .desc_keys = */ desc_keys_avx2,
};

/* F16C (the 16-bit kernels' vcvtph2ps) from CPUID leaf 1, ECX bit 29, as common/kvs.c reads it: clang's
 * __builtin_cpu_supports does not know "f16c". Every AVX2 CPU has it; checked all the same. */
static int cpu_check_avx2(void) {
    __builtin_cpu_init();
    unsigned a = 0, b = 0, c = 0, d = 0;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* The answer is cached: CPUID traps to the hypervisor in a VM (microseconds), and kvs_math_f64_kernels_active()
 * asks on every policy scoring call (uncached, the checks were 45% of a Quest sweep's samples). Racing first calls
 * store the same value. */
static int cpu_has_avx2(void) {
    static atomic_int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        v = cpu_check_avx2();
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

/* ---- AVX2 tiles with AVX-512VL's 32 vector registers (the "avx2x32" table) ----
 * The same 8-lane arithmetic as the AVX2 kernels, compiled with AVX-512VL so that the compiler may use ymm16-31
 * (EVEX encoding, still 256-bit operations: no 512-bit units, no frequency change). With 32 registers a scores
 * tile holds 4 query rows x 4 keys (16 accumulators, 4 key chunks, a query chunk): each key chunk serves 4 FMAs
 * and each query chunk 4, 8 loads per 16 FMAs (the 16-register 4 x 3 tile: 7 per 12), and one reduction tree per
 * 8 scores lands 4 scores of a row in one 128-bit store (the 4 x 3 tile finished its 12 scores one by one: at d 64
 * that was as much work as the FMAs). The output tile holds 4 rows x 32 columns (16 accumulators): per value row 4
 * loads and 4 broadcasts per 16 FMAs, against 2 and 4 per 8. Every score and output element is computed exactly as
 * in the AVX2 table (one 8-lane accumulator per score over the chunks of d, reduce8's tree, the fused tail; one
 * fma chain over ascending j per output element), so this table equals the AVX2 one bit for bit
 * (tests/test_simd.c checks it). */
#define AVX2_X32 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl")))

/* Scattered key rows prefetched this many rows ahead of the tile that reads them. */
#define X32_PREFETCH_ROWS 4

/* The element kinds one tile body serves (a constant at every call, so each entry below compiles to its own
 * straight-line kernel): fp32 rows, or 16-bit rows converted in registers as they are loaded (vcvtph2ps, or
 * bf16's shift) instead of a tile of rows converted into L1 first and read back. The same operations on the same
 * fp32 values in the same order, so the 16-bit entries equal the fp32 ones on the converted rows bit for bit. */
enum { X32_F32 = 0, X32_F16 = 1, X32_BF16 = 2 };

__attribute__((always_inline)) AVX2_X32 static inline const void *x32_row(const void *base, int kind, size_t stride,
                                                                          const int32_t *idx, size_t j) {
    size_t r = idx ? (size_t)idx[j] : j;
    return kind == X32_F32 ? (const void *)((const float *)base + r * stride)
                           : (const void *)((const uint16_t *)base + r * stride);
}

__attribute__((always_inline)) AVX2_X32 static inline __m256 x32_load(const void *row, size_t i, int kind) {
    return kind == X32_F32 ? _mm256_loadu_ps((const float *)row + i) : load8h((const uint16_t *)row + i, kind == X32_BF16);
}

/* A scaled score from its lane sum and the fused d % 8 tail (none when d8 == d), as score1 / finish_score. */
__attribute__((always_inline)) AVX2_X32 static inline float x32_finish(float lanes, const float *q, const void *row,
                                                                       size_t d8, size_t d, float scale, int kind) {
    if (d8 == d) return scale * lanes;
    float tail = kind == X32_F32 ? tail_dot(q, (const float *)row, d8, d)
                                 : tail_dot16(q, (const uint16_t *)row, d8, d, kind == X32_BF16);
    return scale * (lanes + tail);
}

/* Scores of the first nr & ~3 query rows (the caller takes the rest): 4 x 4 tiles, the n % 4 last keys one by one. */
__attribute__((always_inline)) AVX2_X32 static inline void x32_scores(const float *q, size_t nr, const void *keys,
                                                                      size_t stride, const int32_t *idx, size_t n,
                                                                      size_t d, float scale, float *const *out_rows,
                                                                      size_t col0, int kind) {
    size_t d8 = d & ~(size_t)7, r4 = nr & ~(size_t)3, j = 0;
    size_t row_bytes = d * (kind == X32_F32 ? sizeof(float) : sizeof(uint16_t));
    const __m256 sc = _mm256_set1_ps(scale);
    for (; j + 4 <= n; j += 4) {
        const void *k0 = x32_row(keys, kind, stride, idx, j), *k1 = x32_row(keys, kind, stride, idx, j + 1);
        const void *k2 = x32_row(keys, kind, stride, idx, j + 2), *k3 = x32_row(keys, kind, stride, idx, j + 3);
        if (idx && j + X32_PREFETCH_ROWS + 4 <= n) /* the next tile's scattered rows, a cache line at a time */
            for (size_t c = 0; c < 4; c++) {
                const char *row = x32_row(keys, kind, stride, idx, j + X32_PREFETCH_ROWS + c);
                for (size_t b = 0; b < row_bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
            }
        for (size_t r = 0; r < r4; r += 4) {
            const float *q0 = q + r * d, *q1 = q0 + d, *q2 = q1 + d, *q3 = q2 + d;
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00;
            __m256 a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00;
            __m256 a33 = a00;
            for (size_t i = 0; i < d8; i += 8) {
                __m256 y0 = x32_load(k0, i, kind), y1 = x32_load(k1, i, kind);
                __m256 y2 = x32_load(k2, i, kind), y3 = x32_load(k3, i, kind);
                __m256 x = _mm256_loadu_ps(q0 + i);
                a00 = _mm256_fmadd_ps(x, y0, a00);
                a01 = _mm256_fmadd_ps(x, y1, a01);
                a02 = _mm256_fmadd_ps(x, y2, a02);
                a03 = _mm256_fmadd_ps(x, y3, a03);
                x = _mm256_loadu_ps(q1 + i);
                a10 = _mm256_fmadd_ps(x, y0, a10);
                a11 = _mm256_fmadd_ps(x, y1, a11);
                a12 = _mm256_fmadd_ps(x, y2, a12);
                a13 = _mm256_fmadd_ps(x, y3, a13);
                x = _mm256_loadu_ps(q2 + i);
                a20 = _mm256_fmadd_ps(x, y0, a20);
                a21 = _mm256_fmadd_ps(x, y1, a21);
                a22 = _mm256_fmadd_ps(x, y2, a22);
                a23 = _mm256_fmadd_ps(x, y3, a23);
                x = _mm256_loadu_ps(q3 + i);
                a30 = _mm256_fmadd_ps(x, y0, a30);
                a31 = _mm256_fmadd_ps(x, y1, a31);
                a32 = _mm256_fmadd_ps(x, y2, a32);
                a33 = _mm256_fmadd_ps(x, y3, a33);
            }
            __m256 s01 = reduce8(a00, a01, a02, a03, a10, a11, a12, a13);
            __m256 s23 = reduce8(a20, a21, a22, a23, a30, a31, a32, a33);
            if (d8 == d) { /* no tail: each row's 4 scaled scores leave in one 4-float store */
                s01 = _mm256_mul_ps(sc, s01);
                s23 = _mm256_mul_ps(sc, s23);
                _mm_storeu_ps(out_rows[r] + col0 + j, _mm256_castps256_ps128(s01));
                _mm_storeu_ps(out_rows[r + 1] + col0 + j, _mm256_extractf128_ps(s01, 1));
                _mm_storeu_ps(out_rows[r + 2] + col0 + j, _mm256_castps256_ps128(s23));
                _mm_storeu_ps(out_rows[r + 3] + col0 + j, _mm256_extractf128_ps(s23, 1));
                continue;
            }
            float s[16];
            _mm256_storeu_ps(s, s01);
            _mm256_storeu_ps(s + 8, s23);
            const float *qr[4] = {q0, q1, q2, q3};
            const void *kc[4] = {k0, k1, k2, k3};
            for (size_t x = 0; x < 4; x++)
                for (size_t c = 0; c < 4; c++)
                    out_rows[r + x][col0 + j + c] = x32_finish(s[4 * x + c], qr[x], kc[c], d8, d, scale, kind);
        }
    }
    for (; j < n; j++) {
        const void *k = x32_row(keys, kind, stride, idx, j);
        for (size_t r = 0; r < r4; r++) {
            const float *q0 = q + r * d;
            __m256 a = _mm256_setzero_ps();
            for (size_t i = 0; i < d8; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i), x32_load(k, i, kind), a);
            out_rows[r][col0 + j] = x32_finish(reduce1(a), q0, k, d8, d, scale, kind);
        }
    }
}

enum { X32_ROWS = 64 }; /* row pointers per call of the output's column remainder (on the stack) */

/* Output of the first nr & ~3 rows (the caller takes the rest): 4 x 32 tiles over passes of 8192 / d value rows
 * (32 KiB of fp32 rows, in L1; 64 rows at d 128: 4-8% faster than 256 rows from L2 on the development VM), the
 * columns past the last 32 through the AVX2 table's kernels. */
__attribute__((always_inline)) AVX2_X32 static inline void x32_output(const float *const *p_rows, size_t nr,
                                                                      size_t col0, const void *values, size_t stride,
                                                                      const int32_t *idx, size_t n, size_t d,
                                                                      float *const *out_rows, int kind) {
    size_t r4 = nr & ~(size_t)3, d32 = d & ~(size_t)31;
    size_t pass = d >= 512 ? 16 : 8192 / d;
    for (size_t jb = 0; jb < n && d32 > 0; jb += pass) {
        size_t je = jb + pass < n ? jb + pass : n;
        for (size_t r = 0; r < r4; r += 4) {
            const float *p0 = p_rows[r] + col0, *p1 = p_rows[r + 1] + col0, *p2 = p_rows[r + 2] + col0,
                        *p3 = p_rows[r + 3] + col0;
            float *o0 = out_rows[r], *o1 = out_rows[r + 1], *o2 = out_rows[r + 2], *o3 = out_rows[r + 3];
            for (size_t i = 0; i < d32; i += 32) {
                __m256 c00 = _mm256_loadu_ps(o0 + i), c01 = _mm256_loadu_ps(o0 + i + 8);
                __m256 c02 = _mm256_loadu_ps(o0 + i + 16), c03 = _mm256_loadu_ps(o0 + i + 24);
                __m256 c10 = _mm256_loadu_ps(o1 + i), c11 = _mm256_loadu_ps(o1 + i + 8);
                __m256 c12 = _mm256_loadu_ps(o1 + i + 16), c13 = _mm256_loadu_ps(o1 + i + 24);
                __m256 c20 = _mm256_loadu_ps(o2 + i), c21 = _mm256_loadu_ps(o2 + i + 8);
                __m256 c22 = _mm256_loadu_ps(o2 + i + 16), c23 = _mm256_loadu_ps(o2 + i + 24);
                __m256 c30 = _mm256_loadu_ps(o3 + i), c31 = _mm256_loadu_ps(o3 + i + 8);
                __m256 c32 = _mm256_loadu_ps(o3 + i + 16), c33 = _mm256_loadu_ps(o3 + i + 24);
                for (size_t j = jb; j < je; j++) {
                    const void *v = x32_row(values, kind, stride, idx, j);
                    __m256 v0 = x32_load(v, i, kind), v1 = x32_load(v, i + 8, kind);
                    __m256 v2 = x32_load(v, i + 16, kind), v3 = x32_load(v, i + 24, kind);
                    __m256 w = _mm256_broadcast_ss(p0 + j);
                    c00 = _mm256_fmadd_ps(w, v0, c00);
                    c01 = _mm256_fmadd_ps(w, v1, c01);
                    c02 = _mm256_fmadd_ps(w, v2, c02);
                    c03 = _mm256_fmadd_ps(w, v3, c03);
                    w = _mm256_broadcast_ss(p1 + j);
                    c10 = _mm256_fmadd_ps(w, v0, c10);
                    c11 = _mm256_fmadd_ps(w, v1, c11);
                    c12 = _mm256_fmadd_ps(w, v2, c12);
                    c13 = _mm256_fmadd_ps(w, v3, c13);
                    w = _mm256_broadcast_ss(p2 + j);
                    c20 = _mm256_fmadd_ps(w, v0, c20);
                    c21 = _mm256_fmadd_ps(w, v1, c21);
                    c22 = _mm256_fmadd_ps(w, v2, c22);
                    c23 = _mm256_fmadd_ps(w, v3, c23);
                    w = _mm256_broadcast_ss(p3 + j);
                    c30 = _mm256_fmadd_ps(w, v0, c30);
                    c31 = _mm256_fmadd_ps(w, v1, c31);
                    c32 = _mm256_fmadd_ps(w, v2, c32);
                    c33 = _mm256_fmadd_ps(w, v3, c33);
                }
                _mm256_storeu_ps(o0 + i, c00);
                _mm256_storeu_ps(o0 + i + 8, c01);
                _mm256_storeu_ps(o0 + i + 16, c02);
                _mm256_storeu_ps(o0 + i + 24, c03);
                _mm256_storeu_ps(o1 + i, c10);
                _mm256_storeu_ps(o1 + i + 8, c11);
                _mm256_storeu_ps(o1 + i + 16, c12);
                _mm256_storeu_ps(o1 + i + 24, c13);
                _mm256_storeu_ps(o2 + i, c20);
                _mm256_storeu_ps(o2 + i + 8, c21);
                _mm256_storeu_ps(o2 + i + 16, c22);
                _mm256_storeu_ps(o2 + i + 24, c23);
                _mm256_storeu_ps(o3 + i, c30);
                _mm256_storeu_ps(o3 + i + 8, c31);
                _mm256_storeu_ps(o3 + i + 16, c32);
                _mm256_storeu_ps(o3 + i + 24, c33);
            }
        }
    }
    if (r4 > 0 && d32 < d) /* the columns past the last 32, through the AVX2 table's kernels */
        for (size_t r0 = 0; r0 < r4; r0 += X32_ROWS) {
            size_t m = r4 - r0 < X32_ROWS ? r4 - r0 : X32_ROWS;
            float *o[X32_ROWS];
            for (size_t r = 0; r < m; r++) o[r] = out_rows[r0 + r] + d32;
            if (kind == X32_F32)
                output_add_avx2(p_rows + r0, m, col0, (const float *)values + d32, stride, idx, n, d - d32, o);
            else
                output_add16_rows(p_rows + r0, m, col0, (const uint16_t *)values + d32, stride, idx, n, d - d32, o,
                                  kind == X32_BF16);
        }
}

/* The entries. Rows past the groups of 4 (and calls of fewer than 4 rows) go through the AVX2 table's kernels:
 * every score and every output element (its own fma chain over ascending j) is computed the same way whichever
 * kernel computes it, so the split changes no bit. */
AVX2_X32 static void scores_x32(const float *q, size_t nr, const float *keys, size_t stride, const int32_t *idx,
                                size_t n, size_t d, float scale, float *const *out_rows, size_t col0) {
    size_t r4 = nr & ~(size_t)3;
    if (r4 > 0) x32_scores(q, r4, keys, stride, idx, n, d, scale, out_rows, col0, X32_F32);
    if (r4 < nr) scores_2x4(q + r4 * d, nr - r4, keys, stride, idx, n, d, scale, out_rows + r4, col0);
}

AVX2_X32 static void scores16_x32_f16(const float *q, size_t nr, const uint16_t *keys, size_t stride,
                                      const int32_t *idx, size_t n, size_t d, float scale, float *const *out_rows,
                                      size_t col0) {
    x32_scores(q, nr, keys, stride, idx, n, d, scale, out_rows, col0, X32_F16);
}
AVX2_X32 static void scores16_x32_bf16(const float *q, size_t nr, const uint16_t *keys, size_t stride,
                                       const int32_t *idx, size_t n, size_t d, float scale, float *const *out_rows,
                                       size_t col0) {
    x32_scores(q, nr, keys, stride, idx, n, d, scale, out_rows, col0, X32_BF16);
}

/* A wide table's 16-bit scores entry: its kernel of the dtype on the groups of 4 rows, the rest through the AVX2
 * table's (the same bits either way). */
typedef void (*scores16_rows4_fn)(const float *q, size_t nr, const uint16_t *keys, size_t stride, const int32_t *idx,
                                  size_t n, size_t d, float scale, float *const *out_rows, size_t col0);

static void scores16_wide(scores16_rows4_fn f16, scores16_rows4_fn bf16, const float *q, size_t nr,
                          const uint16_t *keys, kvs_dtype dtype, size_t stride, const int32_t *idx, size_t n, size_t d,
                          float scale, float *const *out_rows, size_t col0) {
    size_t r4 = nr & ~(size_t)3;
    if (r4 > 0) (dtype == KVS_DTYPE_BF16 ? bf16 : f16)(q, r4, keys, stride, idx, n, d, scale, out_rows, col0);
    if (r4 < nr) scores16_avx2(q + r4 * d, nr - r4, keys, dtype, stride, idx, n, d, scale, out_rows + r4, col0);
}

static void scores16_x32(const float *q, size_t nr, const uint16_t *keys, kvs_dtype dtype, size_t stride,
                         const int32_t *idx, size_t n, size_t d, float scale, float *const *out_rows, size_t col0) {
    scores16_wide(scores16_x32_f16, scores16_x32_bf16, q, nr, keys, dtype, stride, idx, n, d, scale, out_rows, col0);
}

/* One output row, 128 columns a pass in 16 accumulators: each value row is read once per pass where the AVX2
 * table's single-row path (8 accumulators, 64 columns) reads it in two; the columns past the last 128 through that
 * path. Passes of OUTPUT_ROWS_PER_PASS value rows as there, so a head_dim past 128 finds its rows in L2 on the next
 * column pass. The same fma chain over ascending j per element. */
AVX2_X32 static void x32_output1(const float *p, const float *values, size_t stride, const int32_t *idx, size_t n,
                                 size_t d, float *o) {
    size_t d128 = d & ~(size_t)127;
    for (size_t jb = 0; jb < n && d128 > 0; jb += OUTPUT_ROWS_PER_PASS) {
        size_t je = jb + OUTPUT_ROWS_PER_PASS < n ? jb + OUTPUT_ROWS_PER_PASS : n;
        for (size_t i = 0; i < d128; i += 128) {
            acc64 a = acc64_load(o + i), b = acc64_load(o + i + 64);
            for (size_t j = jb; j < je; j++) {
                const float *v = row_of(values, stride, idx, j) + i;
                __m256 w = _mm256_broadcast_ss(p + j);
                acc64_fma(&a, w, v);
                acc64_fma(&b, w, v + 64);
            }
            acc64_store(o + i, a);
            acc64_store(o + i + 64, b);
        }
    }
    if (d128 < d) {
        float *orow = o + d128;
        output_add_avx2(&p, 1, 0, values + d128, stride, idx, n, d - d128, &orow);
    }
}

AVX2_X32 static void output_add_x32(const float *const *p_rows, size_t nr, size_t col0, const float *values,
                                    size_t stride, const int32_t *idx, size_t n, size_t d, float *const *out_rows) {
    size_t r4 = nr & ~(size_t)3;
    x32_output(p_rows, nr, col0, values, stride, idx, n, d, out_rows, X32_F32);
    for (size_t r = r4; r < nr; r++) x32_output1(p_rows[r] + col0, values, stride, idx, n, d, out_rows[r]);
}

AVX2_X32 static void output_add16_x32_f16(const float *const *p_rows, size_t nr, size_t col0, const uint16_t *values,
                                          size_t stride, const int32_t *idx, size_t n, size_t d,
                                          float *const *out_rows) {
    x32_output(p_rows, nr, col0, values, stride, idx, n, d, out_rows, X32_F16);
}
AVX2_X32 static void output_add16_x32_bf16(const float *const *p_rows, size_t nr, size_t col0,
                                           const uint16_t *values, size_t stride, const int32_t *idx, size_t n,
                                           size_t d, float *const *out_rows) {
    x32_output(p_rows, nr, col0, values, stride, idx, n, d, out_rows, X32_BF16);
}

static void output_add16_x32(const float *const *p_rows, size_t nr, size_t col0, const uint16_t *values,
                             kvs_dtype dtype, size_t stride, const int32_t *idx, size_t n, size_t d,
                             float *const *out_rows) {
    size_t r4 = nr & ~(size_t)3;
    if (r4 > 0) {
        if (dtype == KVS_DTYPE_BF16)
            output_add16_x32_bf16(p_rows, r4, col0, values, stride, idx, n, d, out_rows);
        else
            output_add16_x32_f16(p_rows, r4, col0, values, stride, idx, n, d, out_rows);
    }
    if (r4 < nr) output_add16_avx2(p_rows + r4, nr - r4, col0, values, dtype, stride, idx, n, d, out_rows + r4);
}

/* The softmax with 32 vector registers: softmax_sum_avx2's operations (the same bits), but the pipelined exp's
 * constants and the two blocks in flight stay in registers; compiled for AVX2's 16, gcc kept five of the
 * polynomial's constants on the stack, a load beside each multiply-add. */
AVX2_X32 static double softmax_x32(float *x, size_t n) {
    float m;
    double sum = softmax_sum_avx2(x, n, &m);
    return (double)m + log(sum);
}

AVX2_X32 static void softmax_probs_x32(float *x, size_t n) {
    float m;
    (void)softmax_sum_avx2(x, n, &m);
}

static const kvs_math_kernels kernels_avx2x32 = {
    /* .name = */ "avx2x32",
    /* .dot = */ dot_avx2,
    /* .axpy = */ axpy_avx2,
    /* .scores = */ scores_x32,
    /* .output_add = */ output_add_x32,
    /* .softmax = */ softmax_x32,
    /* .softmax_probs = */ softmax_probs_x32,
    /* .exp = */ exp_avx2,
    /* .first_above = */ first_above_avx2,
    /* .scores16 = */ scores16_x32,
    /* .output_add16 = */ output_add16_x32,
    /* .list_plain = */ list_plain_avx2,
    /* .dots_loose = */ dots_loose_avx2,
    /* .desc_keys = */ desc_keys_avx2,
};

static int cpu_has_avx2x32(void) {
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
}

/* ---- AVX-512: the AVX2 arithmetic on 16 lanes (the "avx512" table) ----
 * Where the CPU's 512-bit FMAs run at full rate (twice the 256-bit peak: kvs_peak measured 1.29e11 against
 * 6.5e10 fp32 FMA/s on one core of an AMD EPYC of family 26), the 8-lane kernels above reach at most half of the
 * machine's FMA peak. These tiles hold two of the AVX2 kernels' 8-lane computations in each zmm register:
 *  - scores: two query rows in the two halves of a register (the rows packed in pairs once per call), each
 *    8-float key chunk broadcast to both halves; every score is one 8-lane accumulator over the chunks of d,
 *    reduced by reduce8's tree (each horizontal add an even + odd shuffle pair and one add: the same adds of the
 *    same operands), plus the fused d % 8 tail. A 2 x 8 tile (two row pairs, 8 keys: 16 accumulators) loads a
 *    pair chunk per 8 FMAs and a key chunk per 2.
 *  - output: 16 columns a register, each element its own fma chain over ascending j; 4 rows x 64 columns (16
 *    accumulators) a tile, one row 128 columns a pass.
 *  - 16-bit K/V converted in registers as they are loaded (vcvtph2ps on 16 halves, bf16's shift), as avx2x32 does.
 * So this table equals the AVX2 one bit for bit (tests/test_simd.c, tests/test_kv16.c), and choosing it changes
 * only the speed. The rest of the table (softmax, dot, filters) is AVX2's. */
#define X512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl")))

/* _mm256_hadd_ps on each 256-bit half: per 128-bit lane [a0 + a1, a2 + a3, b0 + b1, b2 + b3]. */
__attribute__((always_inline)) X512 static inline __m512 x512_hadd(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* reduce8 on both halves at once: with lo(a) and hi(a) the 256-bit halves, the result's 128-bit lanes are
 * reduce8(lo(a0..a7)) lanes 0-3, reduce8(hi(a0..a7)) lanes 0-3, then lanes 4-7 of each. */
__attribute__((always_inline)) X512 static inline __m512 x512_reduce8(__m512 a0, __m512 a1, __m512 a2, __m512 a3,
                                                                      __m512 a4, __m512 a5, __m512 a6, __m512 a7) {
    __m512 u0 = x512_hadd(x512_hadd(a0, a1), x512_hadd(a2, a3));
    __m512 u1 = x512_hadd(x512_hadd(a4, a5), x512_hadd(a6, a7));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The 8 elements of row[i..i+8) as floats, in both halves of a register. */
__attribute__((always_inline)) X512 static inline __m512 x512_bcast8(const void *row, size_t i, int kind) {
    if (kind == X32_F32)
        return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps((const float *)row + i))));
    __m256i h = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)row + i)));
    if (kind == X32_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The 16 elements of row[i..i+16) as floats. */
__attribute__((always_inline)) X512 static inline __m512 x512_load16(const void *row, size_t i, int kind) {
    if (kind == X32_F32) return _mm512_loadu_ps((const float *)row + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)((const uint16_t *)row + i));
    if (kind == X32_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Rows of `kind` elements from row j on: the same rows through (idx + j) or (keys + j rows). */
__attribute__((always_inline)) X512 static inline const void *x512_rows_from(const void *base, int kind, size_t stride,
                                                                             const int32_t *idx, size_t j) {
    return idx ? base : x32_row(base, kind, stride, NULL, j);
}

/* Packed query rows: pair p's chunk c at qp + (p * nch + c) * 16, row 2p in the low half, row 2p + 1 in the high. */
enum { X512_QP_FLOATS = 4096 };

/* One 2 x 8 tile's 32 lane sums over nch chunks: rows r, r+1 (pair x0p) and r+2, r+3 (pair x1p) against keys
 * k[0..7]. Its own function: inlined in the tile loop, gcc -O2 kept a pair chunk on the stack (an FMA with a memory
 * operand each) with 10 of the 32 registers free. */
__attribute__((always_inline)) X512 static inline void x512_tile(const float *x0p, const float *x1p,
                                                                 const void *const *kk, size_t nch, int kind,
                                                                 __m512 *out0, __m512 *out1) {
    __m512 a0[8], a1[8]; /* pair 0 (rows r, r+1) and pair 1 (rows r+2, r+3) against key k */
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) a0[k] = a1[k] = _mm512_setzero_ps();
    for (size_t c = 0; c < nch; c++) {
        __m512 x0 = _mm512_load_ps(x0p + 16 * c), x1 = _mm512_load_ps(x1p + 16 * c);
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
            __m512 y = x512_bcast8(kk[k], 8 * c, kind);
            a0[k] = _mm512_fmadd_ps(x0, y, a0[k]);
            a1[k] = _mm512_fmadd_ps(x1, y, a1[k]);
        }
    }
    /* out0: [row r keys 0-3 | row r+1 keys 0-3 | row r keys 4-7 | row r+1 keys 4-7]; out1 rows r+2, r+3 */
    *out0 = x512_reduce8(a0[0], a0[1], a0[2], a0[3], a0[4], a0[5], a0[6], a0[7]);
    *out1 = x512_reduce8(a1[0], a1[1], a1[2], a1[3], a1[4], a1[5], a1[6], a1[7]);
}

#define X512_TILE_ENTRY(NAME, KIND)                                                                              \
    __attribute__((noinline)) X512 static void NAME(const float *x0p, const float *x1p, const void *const *kk,   \
                                                    size_t nch, __m512 *out0, __m512 *out1) {                   \
        x512_tile(x0p, x1p, kk, nch, KIND, out0, out1);                                                         \
    }
X512_TILE_ENTRY(x512_tile_f32, X32_F32)
X512_TILE_ENTRY(x512_tile_f16, X32_F16)
X512_TILE_ENTRY(x512_tile_bf16, X32_BF16)
#undef X512_TILE_ENTRY

/* Scores of nr query rows, nr a multiple of 4: 2 x 8 tiles, the n % 8 last keys through avx2x32's 4 x 4 tiles. */
__attribute__((always_inline)) X512 static inline void x512_scores(const float *q, size_t nr, const void *keys,
                                                                   size_t stride, const int32_t *idx, size_t n,
                                                                   size_t d, float scale, float *const *out_rows,
                                                                   size_t col0, int kind) {
    size_t d8 = d & ~(size_t)7, nch = d8 / 8, n8 = n & ~(size_t)7;
    /* query rows packed per block: >= 4 for any head_dim the trace format takes (KVS_KV16_MAX_DIM) */
    size_t rows_blk = d8 > 0 ? (X512_QP_FLOATS / d8) & ~(size_t)3 : 0;
    if (rows_blk == 0 || n8 == 0) { /* d < 8, d > 1024 or fewer than 8 keys: avx2x32's tiles */
        x32_scores(q, nr, keys, stride, idx, n, d, scale, out_rows, col0, kind);
        return;
    }
    size_t row_bytes = d * (kind == X32_F32 ? sizeof(float) : sizeof(uint16_t));
    const __m512 sc = _mm512_set1_ps(scale);
    float qp[X512_QP_FLOATS] __attribute__((aligned(64)));
    for (size_t rb = 0; rb < nr; rb += rows_blk) {
        size_t m = nr - rb < rows_blk ? nr - rb : rows_blk; /* a multiple of 4, as nr and rows_blk */
        for (size_t p = 0; p < m / 2; p++) {
            const float *q0 = q + (rb + 2 * p) * d, *q1 = q0 + d;
            for (size_t c = 0; c < nch; c++) {
                memcpy(qp + (p * nch + c) * 16, q0 + 8 * c, 8 * sizeof(float));
                memcpy(qp + (p * nch + c) * 16 + 8, q1 + 8 * c, 8 * sizeof(float));
            }
        }
        for (size_t j = 0; j < n8; j += 8) {
            const void *k0 = x32_row(keys, kind, stride, idx, j), *k1 = x32_row(keys, kind, stride, idx, j + 1);
            const void *k2 = x32_row(keys, kind, stride, idx, j + 2), *k3 = x32_row(keys, kind, stride, idx, j + 3);
            const void *k4 = x32_row(keys, kind, stride, idx, j + 4), *k5 = x32_row(keys, kind, stride, idx, j + 5);
            const void *k6 = x32_row(keys, kind, stride, idx, j + 6), *k7 = x32_row(keys, kind, stride, idx, j + 7);
            if (idx && j + 16 <= n) /* the next tile's scattered rows, a cache line at a time */
                for (size_t c = 8; c < 16; c++) {
                    const char *row = x32_row(keys, kind, stride, idx, j + c);
                    for (size_t b = 0; b < row_bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
                }
            for (size_t r = 0; r < m; r += 4) {
                const float *x0p = qp + (r / 2) * nch * 16, *x1p = x0p + nch * 16;
                const void *kk[8] = {k0, k1, k2, k3, k4, k5, k6, k7};
                __m512 s0, s1;
                if (kind == X32_F32) x512_tile_f32(x0p, x1p, kk, nch, &s0, &s1);
                else if (kind == X32_F16) x512_tile_f16(x0p, x1p, kk, nch, &s0, &s1);
                else x512_tile_bf16(x0p, x1p, kk, nch, &s0, &s1);
                float *o0 = out_rows[rb + r] + col0 + j, *o1 = out_rows[rb + r + 1] + col0 + j;
                float *o2 = out_rows[rb + r + 2] + col0 + j, *o3 = out_rows[rb + r + 3] + col0 + j;
                if (d8 == d) { /* no tail: each row's 8 scaled scores in one 8-float store */
                    s0 = _mm512_shuffle_f32x4(_mm512_mul_ps(sc, s0), _mm512_mul_ps(sc, s0), _MM_SHUFFLE(3, 1, 2, 0));
                    s1 = _mm512_shuffle_f32x4(_mm512_mul_ps(sc, s1), _mm512_mul_ps(sc, s1), _MM_SHUFFLE(3, 1, 2, 0));
                    _mm256_storeu_ps(o0, _mm512_castps512_ps256(s0));
                    _mm256_storeu_ps(o1, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s0), 1)));
                    _mm256_storeu_ps(o2, _mm512_castps512_ps256(s1));
                    _mm256_storeu_ps(o3, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s1), 1)));
                    continue;
                }
                float s[32];
                _mm512_storeu_ps(s, s0);
                _mm512_storeu_ps(s + 16, s1);
                const float *qr[4] = {q + (rb + r) * d, q + (rb + r + 1) * d, q + (rb + r + 2) * d,
                                      q + (rb + r + 3) * d};
                float *orow[4] = {o0, o1, o2, o3};
                const void *kc[8] = {k0, k1, k2, k3, k4, k5, k6, k7};
                for (size_t x = 0; x < 4; x++) /* row x: half x % 2 of s[16 * (x / 2)..], keys 0-3 then 4-7 */
                    for (size_t c = 0; c < 8; c++)
                        orow[x][c] = x32_finish(s[16 * (x / 2) + 8 * (c / 4) + 4 * (x % 2) + c % 4], qr[x], kc[c], d8,
                                                d, scale, kind);
            }
        }
        if (n8 < n)
            x32_scores(q + rb * d, m, x512_rows_from(keys, kind, stride, idx, n8), stride, idx ? idx + n8 : NULL,
                       n - n8, d, scale, out_rows + rb, col0 + n8, kind);
    }
}

/* One output row's 64 columns in 4 registers (a struct's members are scalarised into registers, as acc64), with
 * load / fma / store helpers: the output tiles below are written with these. */
typedef struct {
    __m512 c0, c1, c2, c3;
} zrow64;

__attribute__((always_inline)) X512 static inline zrow64 zrow64_load(const float *o) {
    return (zrow64){_mm512_loadu_ps(o), _mm512_loadu_ps(o + 16), _mm512_loadu_ps(o + 32), _mm512_loadu_ps(o + 48)};
}

__attribute__((always_inline)) X512 static inline void zrow64_store(float *o, zrow64 a) {
    _mm512_storeu_ps(o, a.c0);
    _mm512_storeu_ps(o + 16, a.c1);
    _mm512_storeu_ps(o + 32, a.c2);
    _mm512_storeu_ps(o + 48, a.c3);
}

/* a += w * v, each column its own fma */
__attribute__((always_inline)) X512 static inline void zrow64_fma(zrow64 *a, __m512 w, zrow64 v) {
    a->c0 = _mm512_fmadd_ps(w, v.c0, a->c0);
    a->c1 = _mm512_fmadd_ps(w, v.c1, a->c1);
    a->c2 = _mm512_fmadd_ps(w, v.c2, a->c2);
    a->c3 = _mm512_fmadd_ps(w, v.c3, a->c3);
}

/* Value row v's 64 columns from i, as floats. */
__attribute__((always_inline)) X512 static inline zrow64 zrow64_value(const void *v, size_t i, int kind) {
    return (zrow64){x512_load16(v, i, kind), x512_load16(v, i + 16, kind), x512_load16(v, i + 32, kind),
                    x512_load16(v, i + 48, kind)};
}

/* The columns [c0, d) of nr rows (a multiple of 4) through avx2x32's output tiles: the same fma chains. */
__attribute__((always_inline)) X512 static inline void x512_output_cols(const float *const *p_rows, size_t nr,
                                                                        size_t col0, const void *values, size_t stride,
                                                                        const int32_t *idx, size_t n, size_t c0,
                                                                        size_t d, float *const *out_rows, int kind) {
    const void *v = kind == X32_F32 ? (const void *)((const float *)values + c0)
                                    : (const void *)((const uint16_t *)values + c0);
    for (size_t r0 = 0; r0 < nr; r0 += X32_ROWS) {
        size_t m = nr - r0 < X32_ROWS ? nr - r0 : X32_ROWS;
        float *o[X32_ROWS];
        for (size_t r = 0; r < m; r++) o[r] = out_rows[r0 + r] + c0;
        x32_output(p_rows + r0, m, col0, v, stride, idx, n, d - c0, o, kind);
    }
}

/* Output of nr rows, nr a multiple of 4: 4 x 64 tiles over passes of 8192 / d value rows (32 KiB of fp32 rows, in
 * L1, as x32_output), the columns past the last 64 through avx2x32's tiles. */
__attribute__((always_inline)) X512 static inline void x512_output(const float *const *p_rows, size_t nr,
                                                                   size_t col0, const void *values, size_t stride,
                                                                   const int32_t *idx, size_t n, size_t d,
                                                                   float *const *out_rows, int kind) {
    size_t d64 = d & ~(size_t)63;
    size_t pass = d >= 512 ? 16 : 8192 / d;
    for (size_t jb = 0; jb < n && d64 > 0; jb += pass) {
        size_t je = jb + pass < n ? jb + pass : n;
        for (size_t r = 0; r < nr; r += 4) {
            const float *p0 = p_rows[r] + col0, *p1 = p_rows[r + 1] + col0, *p2 = p_rows[r + 2] + col0,
                        *p3 = p_rows[r + 3] + col0;
            float *o0 = out_rows[r], *o1 = out_rows[r + 1], *o2 = out_rows[r + 2], *o3 = out_rows[r + 3];
            for (size_t i = 0; i < d64; i += 64) {
                zrow64 c0 = zrow64_load(o0 + i), c1 = zrow64_load(o1 + i), c2 = zrow64_load(o2 + i);
                zrow64 c3 = zrow64_load(o3 + i);
                for (size_t j = jb; j < je; j++) {
                    const void *v = x32_row(values, kind, stride, idx, j);
                    zrow64 x = zrow64_value(v, i, kind);
                    zrow64_fma(&c0, _mm512_set1_ps(p0[j]), x);
                    zrow64_fma(&c1, _mm512_set1_ps(p1[j]), x);
                    zrow64_fma(&c2, _mm512_set1_ps(p2[j]), x);
                    zrow64_fma(&c3, _mm512_set1_ps(p3[j]), x);
                }
                zrow64_store(o0 + i, c0);
                zrow64_store(o1 + i, c1);
                zrow64_store(o2 + i, c2);
                zrow64_store(o3 + i, c3);
            }
        }
    }
    if (nr > 0 && d64 < d) x512_output_cols(p_rows, nr, col0, values, stride, idx, n, d64, d, out_rows, kind);
}

/* One output row: 128 columns a pass (each value row read once a pass), then 64 and 16 at a time, over passes of
 * OUTPUT_ROWS_PER_PASS value rows as the AVX2 single-row path; the d % 16 last columns through the AVX2 table. */
__attribute__((always_inline)) X512 static inline void x512_output1(const float *p, const void *values,
                                                                    size_t stride, const int32_t *idx, size_t n,
                                                                    size_t d, float *o, int kind) {
    size_t d16 = d & ~(size_t)15;
    for (size_t jb = 0; jb < n && d16 > 0; jb += OUTPUT_ROWS_PER_PASS) {
        size_t je = jb + OUTPUT_ROWS_PER_PASS < n ? jb + OUTPUT_ROWS_PER_PASS : n;
        size_t i = 0;
        for (; i + 128 <= d; i += 128) {
            zrow64 a = zrow64_load(o + i), b = zrow64_load(o + i + 64);
            for (size_t j = jb; j < je; j++) {
                const void *v = x32_row(values, kind, stride, idx, j);
                __m512 w = _mm512_set1_ps(p[j]);
                zrow64_fma(&a, w, zrow64_value(v, i, kind));
                zrow64_fma(&b, w, zrow64_value(v, i + 64, kind));
            }
            zrow64_store(o + i, a);
            zrow64_store(o + i + 64, b);
        }
        for (; i + 64 <= d; i += 64) {
            zrow64 a = zrow64_load(o + i);
            for (size_t j = jb; j < je; j++)
                zrow64_fma(&a, _mm512_set1_ps(p[j]), zrow64_value(x32_row(values, kind, stride, idx, j), i, kind));
            zrow64_store(o + i, a);
        }
        for (; i < d16; i += 16) {
            __m512 c = _mm512_loadu_ps(o + i);
            for (size_t j = jb; j < je; j++)
                c = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), x512_load16(x32_row(values, kind, stride, idx, j), i, kind), c);
            _mm512_storeu_ps(o + i, c);
        }
    }
    if (d16 < d) {
        float *orow = o + d16;
        if (kind == X32_F32)
            output_add_avx2(&p, 1, 0, (const float *)values + d16, stride, idx, n, d - d16, &orow);
        else
            output_add16_avx2(&p, 1, 0, (const uint16_t *)values + d16, kind == X32_BF16 ? KVS_DTYPE_BF16 : KVS_DTYPE_F16,
                              stride, idx, n, d - d16, &orow);
    }
}

/* The entries. Rows past the groups of 4 go through the AVX2 table's kernels (scores) or the single-row path
 * (output): every score and output element is computed the same way whichever kernel computes it. */
X512 static void scores_x512(const float *q, size_t nr, const float *keys, size_t stride, const int32_t *idx, size_t n,
                             size_t d, float scale, float *const *out_rows, size_t col0) {
    size_t r4 = nr & ~(size_t)3;
    if (r4 > 0) x512_scores(q, r4, keys, stride, idx, n, d, scale, out_rows, col0, X32_F32);
    if (r4 < nr) scores_2x4(q + r4 * d, nr - r4, keys, stride, idx, n, d, scale, out_rows + r4, col0);
}

X512 static void scores16_x512_f16(const float *q, size_t nr, const uint16_t *keys, size_t stride, const int32_t *idx,
                                   size_t n, size_t d, float scale, float *const *out_rows, size_t col0) {
    x512_scores(q, nr, keys, stride, idx, n, d, scale, out_rows, col0, X32_F16);
}
X512 static void scores16_x512_bf16(const float *q, size_t nr, const uint16_t *keys, size_t stride,
                                    const int32_t *idx, size_t n, size_t d, float scale, float *const *out_rows,
                                    size_t col0) {
    x512_scores(q, nr, keys, stride, idx, n, d, scale, out_rows, col0, X32_BF16);
}

static void scores16_x512(const float *q, size_t nr, const uint16_t *keys, kvs_dtype dtype, size_t stride,
                          const int32_t *idx, size_t n, size_t d, float scale, float *const *out_rows, size_t col0) {
    scores16_wide(scores16_x512_f16, scores16_x512_bf16, q, nr, keys, dtype, stride, idx, n, d, scale, out_rows, col0);
}

X512 static void output_add_x512(const float *const *p_rows, size_t nr, size_t col0, const float *values,
                                 size_t stride, const int32_t *idx, size_t n, size_t d, float *const *out_rows) {
    size_t r4 = nr & ~(size_t)3;
    if (r4 > 0) x512_output(p_rows, r4, col0, values, stride, idx, n, d, out_rows, X32_F32);
    for (size_t r = r4; r < nr; r++) x512_output1(p_rows[r] + col0, values, stride, idx, n, d, out_rows[r], X32_F32);
}

X512 static void output_add16_x512_kind(const float *const *p_rows, size_t nr, size_t col0, const uint16_t *values,
                                        size_t stride, const int32_t *idx, size_t n, size_t d, float *const *out_rows,
                                        int kind) {
    size_t r4 = nr & ~(size_t)3;
    if (r4 > 0) x512_output(p_rows, r4, col0, values, stride, idx, n, d, out_rows, kind);
    for (size_t r = r4; r < nr; r++) x512_output1(p_rows[r] + col0, values, stride, idx, n, d, out_rows[r], kind);
}

X512 static void output_add16_x512_f16(const float *const *p_rows, size_t nr, size_t col0, const uint16_t *values,
                                       size_t stride, const int32_t *idx, size_t n, size_t d, float *const *out_rows) {
    output_add16_x512_kind(p_rows, nr, col0, values, stride, idx, n, d, out_rows, X32_F16);
}
X512 static void output_add16_x512_bf16(const float *const *p_rows, size_t nr, size_t col0, const uint16_t *values,
                                        size_t stride, const int32_t *idx, size_t n, size_t d, float *const *out_rows) {
    output_add16_x512_kind(p_rows, nr, col0, values, stride, idx, n, d, out_rows, X32_BF16);
}

static void output_add16_x512(const float *const *p_rows, size_t nr, size_t col0, const uint16_t *values,
                              kvs_dtype dtype, size_t stride, const int32_t *idx, size_t n, size_t d,
                              float *const *out_rows) {
    if (dtype == KVS_DTYPE_BF16)
        output_add16_x512_bf16(p_rows, nr, col0, values, stride, idx, n, d, out_rows);
    else
        output_add16_x512_f16(p_rows, nr, col0, values, stride, idx, n, d, out_rows);
}

/* exp8 on 16 lanes: the same operations on each lane (vroundps as vrndscaleps with the same rounding, the masks in
 * mask registers), so the same bits; in two stages for a pipelined loop, as exp8. */
typedef struct {
    __m512 x, r, scale_bits;
} exp16_mid;

__attribute__((always_inline)) X512 static inline exp16_mid exp16_first(__m512 x) {
    const __m512 hi = _mm512_set1_ps(88.3762626647949f), lo = _mm512_set1_ps(KVS_SIMD_EXP_LO);
    exp16_mid m;
    m.x = x;
    __m512 c = _mm512_max_ps(_mm512_min_ps(x, hi), lo);
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), c);
    m.r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    m.scale_bits = _mm512_castsi512_ps(e);
    return m;
}

__attribute__((always_inline)) X512 static inline __m512 exp16_second(exp16_mid m) {
    __m512 r = m.r;
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    y = _mm512_mul_ps(y, m.scale_bits);
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(m.x, _mm512_set1_ps(KVS_SIMD_EXP_LO), _CMP_LT_OQ),
                           _mm512_setzero_ps());
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(m.x, m.x, _CMP_UNORD_Q), m.x);
}

__attribute__((always_inline)) X512 static inline __m512 exp16(__m512 x) { return exp16_second(exp16_first(x)); }

X512 static void exp_x512(const float *x, size_t n, float *y) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp16(_mm512_loadu_ps(x + i)));
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
    if (i < n) exp8_partial(x + i, n - i, y + i);
}

/* softmax_sum_avx2 on 16 lanes. The maximum is the same value (a +0 / -0 tie aside, which changes no x - m); the
 * exponentials are exp8's bits; the fp64 sums are the same 8 running sums over the blocks of 8 in order (lanes 0-3
 * of a block to s0, 4-7 to s1, here the low and high halves of one 8-double register: each block's 8 floats widened
 * and added in turn), combined as there; the same tail and normalisation. */
__attribute__((always_inline)) X512 static inline double softmax_sum_x512(float *x, size_t n, float *mo) {
    __m512 mv = _mm512_set1_ps(-INFINITY), mv1 = mv;
    size_t j = 0;
    for (; j + 32 <= n; j += 32) { /* vmaxps returns its second operand when either is NaN: NaN skipped */
        mv = _mm512_max_ps(_mm512_loadu_ps(x + j), mv);
        mv1 = _mm512_max_ps(_mm512_loadu_ps(x + j + 16), mv1);
    }
    mv = _mm512_max_ps(mv, mv1);
    for (; j + 16 <= n; j += 16) mv = _mm512_max_ps(_mm512_loadu_ps(x + j), mv);
    float lanes[16];
    _mm512_storeu_ps(lanes, mv);
    float m = -INFINITY;
    for (int k = 0; k < 16; k++)
        if (lanes[k] > m) m = lanes[k];
    for (; j < n; j++)
        if (x[j] > m) m = x[j];
    __m512 mb = _mm512_set1_ps(m);
    j = 0;
    if (n >= 32) { /* pipelined two blocks deep, as softmax_sum_avx2 */
        exp16_mid cur = exp16_first(_mm512_sub_ps(_mm512_loadu_ps(x), mb));
        exp16_mid nxt = exp16_first(_mm512_sub_ps(_mm512_loadu_ps(x + 16), mb));
        for (; j + 48 <= n; j += 16) {
            exp16_mid next = exp16_first(_mm512_sub_ps(_mm512_loadu_ps(x + j + 32), mb));
            _mm512_storeu_ps(x + j, exp16_second(cur));
            cur = nxt;
            nxt = next;
        }
        _mm512_storeu_ps(x + j, exp16_second(cur));
        _mm512_storeu_ps(x + j + 16, exp16_second(nxt));
        j += 32;
    }
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(x + j, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), mb)));
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(x + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), _mm256_set1_ps(m))));
    __m512d s = _mm512_setzero_pd();
    for (size_t k = 0; k < j; k += 8) s = _mm512_add_pd(s, _mm512_cvtps_pd(_mm256_loadu_ps(x + k)));
    double sd[4];
    _mm256_storeu_pd(sd, _mm256_add_pd(_mm512_castpd512_pd256(s), _mm512_extractf64x4_pd(s, 1)));
    double sum = (sd[0] + sd[1]) + (sd[2] + sd[3]);
    sum = exp_tail_sum(x, j, n, m, sum);
    float invs = (float)(1.0 / sum);
    __m512 inv = _mm512_set1_ps(invs);
    j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(x + j, _mm512_mul_ps(_mm512_loadu_ps(x + j), inv));
    for (; j < n; j++) x[j] *= invs;
    *mo = m;
    return sum;
}

X512 static double softmax_x512(float *x, size_t n) {
    float m;
    double sum = softmax_sum_x512(x, n, &m);
    return (double)m + log(sum);
}

X512 static void softmax_probs_x512(float *x, size_t n) {
    float m;
    (void)softmax_sum_x512(x, n, &m);
}

/* The low and high 8 lanes added: a 16-lane accumulator to 8 lanes. */
__attribute__((always_inline)) X512 static inline __m256 fold16(__m512 a) {
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/* dots_loose on 16 lanes: 8 keys a pass, one 16-lane fma chain each over the 16-float chunks of d, each folded to 8
 * lanes and the 8 reduced by reduce8; the d % 16 tail as a scalar fused chain. Any order of the adds is this entry's
 * contract (its screen re-checks near the boundary in fp64), so it needs no other table's bits. */
X512 static void dots_loose_x512(const float *v, const float *keys, size_t stride, const int32_t *idx, size_t n,
                                 size_t d, float *out) {
    size_t d16 = d & ~(size_t)15, j = 0;
    for (; j + 8 <= n; j += 8) {
        const float *k0 = row_of(keys, stride, idx, j), *k1 = row_of(keys, stride, idx, j + 1);
        const float *k2 = row_of(keys, stride, idx, j + 2), *k3 = row_of(keys, stride, idx, j + 3);
        const float *k4 = row_of(keys, stride, idx, j + 4), *k5 = row_of(keys, stride, idx, j + 5);
        const float *k6 = row_of(keys, stride, idx, j + 6), *k7 = row_of(keys, stride, idx, j + 7);
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (size_t i = 0; i < d16; i += 16) {
            __m512 x = _mm512_loadu_ps(v + i);
            a0 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k0 + i), a0);
            a1 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k1 + i), a1);
            a2 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k2 + i), a2);
            a3 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k3 + i), a3);
            a4 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k4 + i), a4);
            a5 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k5 + i), a5);
            a6 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k6 + i), a6);
            a7 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k7 + i), a7);
        }
        _mm256_storeu_ps(out + j, reduce8(fold16(a0), fold16(a1), fold16(a2), fold16(a3), fold16(a4), fold16(a5),
                                          fold16(a6), fold16(a7)));
        if (d16 < d) {
            const float *kc[8] = {k0, k1, k2, k3, k4, k5, k6, k7};
            for (size_t c = 0; c < 8; c++) out[j + c] += tail_dot(v, kc[c], d16, d);
        }
    }
    for (; j < n; j++) out[j] = dot_avx2(v, row_of(keys, stride, idx, j), d);
}

static const kvs_math_kernels kernels_avx512 = {
    /* .name = */ "avx512",
    /* .dot = */ dot_avx2,
    /* .axpy = */ axpy_avx2,
    /* .scores = */ scores_x512,
    /* .output_add = */ output_add_x512,
    /* .softmax = */ softmax_x512,
    /* .softmax_probs = */ softmax_probs_x512,
    /* .exp = */ exp_x512,
    /* .first_above = */ first_above_avx2,
    /* .scores16 = */ scores16_x512,
    /* .output_add16 = */ output_add16_x512,
    /* .list_plain = */ list_plain_avx2,
    /* .dots_loose = */ dots_loose_x512,
    /* .desc_keys = */ desc_keys_avx2,
};

static int cpu_has_avx512(void) { return cpu_has_avx2x32(); }

/* ---- do 512-bit FMAs run at full rate here? ----
 * The same arithmetic either way (above), so the choice between avx2x32 and avx512 is speed alone, and only a
 * measurement tells it: AVX-512 CPUs execute a 512-bit FMA in one pass (AMD Zen 5, Intel server cores with two FMA
 * units: twice the 256-bit rate) or in two (Zen 4, one-unit Intel cores: the same rate, where 512-bit code gains
 * nothing over avx2x32's). Twelve independent FMA chains on registers, 256-bit then 512-bit, three rounds alternating,
 * the best time of each: about 0.2 ms once per process. */
enum { FMA_PROBE_ITERS = 4096 };

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define FMA_PROBE_BODY(T, SET1, FMA, ADD, ITERS)                                                                  \
    T a0 = SET1(1.0f), a1 = SET1(1.1f), a2 = SET1(1.2f), a3 = SET1(1.3f), a4 = SET1(1.4f), a5 = SET1(1.5f);      \
    T a6 = SET1(1.6f), a7 = SET1(1.7f), a8 = SET1(1.8f), a9 = SET1(1.9f), a10 = SET1(2.0f), a11 = SET1(2.1f);    \
    const T m = SET1(0.999999f), c = SET1(1e-7f);                                                              \
    double t0 = now_seconds();                                                                                 \
    for (int it = 0; it < (ITERS); it++) {                                                                     \
        a0 = FMA(a0, m, c), a1 = FMA(a1, m, c), a2 = FMA(a2, m, c), a3 = FMA(a3, m, c);                        \
        a4 = FMA(a4, m, c), a5 = FMA(a5, m, c), a6 = FMA(a6, m, c), a7 = FMA(a7, m, c);                        \
        a8 = FMA(a8, m, c), a9 = FMA(a9, m, c), a10 = FMA(a10, m, c), a11 = FMA(a11, m, c);                    \
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));                     \
        __asm__ volatile("" : "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));                   \
    }                                                                                                          \
    double t = now_seconds() - t0;                                                                             \
    T sum = ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7)));                                  \
    sum = ADD(sum, ADD(ADD(a8, a9), ADD(a10, a11)));                                                           \
    float out[16];                                                                                             \
    memcpy(out, &sum, sizeof sum);                                                                             \
    *sink += out[0];                                                                                           \
    return t

AVX2 static double fma_probe256(float *sink) {
    FMA_PROBE_BODY(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, FMA_PROBE_ITERS);
}

X512 static double fma_probe512(float *sink) {
    FMA_PROBE_BODY(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, FMA_PROBE_ITERS);
}
#undef FMA_PROBE_BODY

/* 512-bit FMA lanes per second over 256-bit ones (about 2 at full rate, 1 double-pumped); 0 without AVX-512VL. */
static double fma512_speedup(void) {
    if (!cpu_has_avx512()) return 0;
    float sink = 0;
    double t256 = INFINITY, t512 = INFINITY;
    for (int round = 0; round < 3; round++) {
        double t = fma_probe256(&sink);
        t256 = t < t256 ? t : t256;
        t = fma_probe512(&sink);
        t512 = t < t512 ? t : t512;
    }
    volatile float keep = sink; /* the loops' results are used */
    (void)keep;
    return t512 > 0 ? 2.0 * t256 / t512 : 0;
}
#endif /* x86-64 */

/* ---- dispatch ---- */

const kvs_math_kernels *kvs_math_kernels_for(kvs_isa isa) {
    switch (isa) {
    case KVS_ISA_SCALAR:
        return &kernels_scalar;
    case KVS_ISA_AVX2:
#ifdef KVS_HAVE_AVX2_KERNELS
        return cpu_has_avx2() ? &kernels_avx2 : NULL;
#else
        return NULL;
#endif
    case KVS_ISA_AVX2X32:
#ifdef KVS_HAVE_AVX2_KERNELS
        return cpu_has_avx2x32() ? &kernels_avx2x32 : NULL;
#else
        return NULL;
#endif
    case KVS_ISA_AVX512:
#ifdef KVS_HAVE_AVX2_KERNELS
        return cpu_has_avx512() ? &kernels_avx512 : NULL;
#else
        return NULL;
#endif
    case KVS_ISA_COUNT:
        break;
    }
    return NULL;
}

const char *kvs_math_isa_name(kvs_isa isa) {
    return isa == KVS_ISA_AVX512    ? "avx512"
           : isa == KVS_ISA_AVX2X32 ? "avx2x32"
           : isa == KVS_ISA_AVX2    ? "avx2"
                                    : "scalar";
}

/* The measured speedup behind the default (0 until chosen, or when KVS_SIMD chose, or without AVX-512VL). */
static _Atomic double fma512_measured;

/* KVS_SIMD's choice, capped by what the CPU has (falling back to the best below it); otherwise avx512 where a
 * 512-bit FMA does at least 1.5x the 256-bit lanes per second (fma512_speedup: about 2 where the units are 512 bits
 * wide), else avx2x32 (AVX2's results in wider tiles: the S_t attention 1.2-1.5x faster; sim/BENCH.md "Kernel
 * tables"). Every vector table gives AVX2's bits, so the choice moves no number. */
static kvs_isa choose_isa(void) {
    kvs_isa want = KVS_ISA_COUNT;
    const char *env = getenv("KVS_SIMD");
    if (env && env[0])
        for (int i = 0; i < KVS_ISA_COUNT; i++)
            if (!strcmp(env, kvs_math_isa_name((kvs_isa)i))) want = (kvs_isa)i;
    if (want == KVS_ISA_COUNT) {
#ifdef KVS_HAVE_AVX2_KERNELS
        double x = fma512_speedup();
        atomic_store(&fma512_measured, x);
        want = x >= 1.5 ? KVS_ISA_AVX512 : KVS_ISA_AVX2X32;
#else
        want = KVS_ISA_AVX2X32;
#endif
    }
    for (int i = (int)want; i > 0; i--)
        if (kvs_math_kernels_for((kvs_isa)i)) return (kvs_isa)i;
    return KVS_ISA_SCALAR;
}

double kvs_math_fma512_speedup(void) {
    (void)kvs_math_isa_active();
    return atomic_load(&fma512_measured);
}

kvs_isa kvs_math_isa_active(void) {
    /* Racing first calls may time the probe differently: the first choice stored is every caller's (the tables
     * give the same bits either way, but one process runs one table). */
    static atomic_int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_acquire);
    if (v < 0) {
        int expected = -1, mine = (int)choose_isa();
        v = atomic_compare_exchange_strong(&cached, &expected, mine) ? mine : expected;
    }
    return (kvs_isa)v;
}

const kvs_math_kernels *kvs_math_kernels_active(void) {
#ifdef KVS_HAVE_AVX2_KERNELS
    kvs_isa isa = kvs_math_isa_active(); /* only chosen when the CPU has it */
    if (isa == KVS_ISA_AVX512) return &kernels_avx512;
    if (isa == KVS_ISA_AVX2X32) return &kernels_avx2x32;
    if (isa == KVS_ISA_AVX2) return &kernels_avx2;
#endif
    return &kernels_scalar;
}

int kvs_math_kv16_default(void) {
    const char *env = getenv("KVS_KV16");
    return env && env[0] ? strcmp(env, "0") != 0 : 1;
}
