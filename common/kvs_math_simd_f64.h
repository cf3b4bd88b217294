/* kvs_math_simd_f64.h — runtime-dispatched fp64 kernels for the policies' own scoring (the replay sweep's speed,
 * sim/BENCH.md): KeyDiff/KNorm's key norms and anchor cosines (POLICY_SPEC §2.5, §2.6
 * B12), Quest's page upper bounds (§2.6 B9) and the fp64 top-k's filter. kvs_math.c calls these; policies call
 * kvs_math.h, never this header.
 *
 * Bit-exact by construction: each output is the fp64 sum of its terms in ascending order, exactly as the scalar
 * loop computes it. The vector variants put one OUTPUT per lane (4 keys or 4 pages at a time, the rows
 * transposed in registers) instead of splitting one sum across lanes, so every rounding happens in the same
 * order and every instruction set gives the scalar table's results bit for bit (tests/test_simd_f64.c asserts
 * equality, and the policies' golden values in POLICY_SPEC §7 are unchanged by construction). The vectors only
 * overlap independent sums, which is where the scalar loops lost their time (one dependent fp64 add per term).
 *
 * The instruction set is kvs_math_simd.h's choice (kvs_math_isa_active(), KVS_SIMD). The vector kernels are the
 * AVX2 arithmetic in two builds: "avx2" (16 registers) and, for the avx2x32 table on a CPU with AVX-512VL,
 * "avx2x32" (32 registers, kvs_math_simd_f64_vec.h); the avx512 table has page_scores(_rows), wsum and heads_add on
 * 8 fp64 lanes (still one output per lane) and avx2x32's others.
 */
#ifndef KVS_MATH_SIMD_F64_H
#define KVS_MATH_SIMD_F64_H

#include <stddef.h>
#include <stdint.h>

#include "kvs_math_simd.h"

/* Rows: row j of `keys` is keys + (idx ? idx[j] : j) * stride (floats). All sums over i = 0..d-1 ascending,
 * each term rounded to fp64 and added to a running fp64 sum starting at 0. */
typedef struct {
    const char *name;
    /* out[j] = sqrt(sum_i (double)k_j[i] * (double)k_j[i]), j < n */
    void (*norms)(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d, double *out);
    /* out[j] = sum_i (double)k_j[i] * v[i], j < n (v: [d] doubles) */
    void (*dots)(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d, const double *v,
                 double *out);
    /* out[pi] = sum_i (double)q[i] * (double)(up[i] ? kmax : kmin)[pi * stride + i], pi < n_pages (up: [d]) */
    void (*page_scores)(const float *q, const uint8_t *up, const float *kmin, const float *kmax, size_t stride,
                        size_t n_pages, size_t d, double *out);
    /* acc[i] += w[j] * (double)k_j[i] for j = 0..n-1 in order, i < d (each element its own running sum, as n
     * axpys one key after another): KeyDiff's anchor (w: [n] the keys' weights) */
    void (*wsum)(const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d, const double *w,
                 double *acc);
    /* the first j in [from, n) with x[j] > thr (ordered compare: NaN never), or n: kvs_topk_f64's filter */
    size_t (*first_above)(const double *x, size_t from, size_t n, double thr);
    /* page_scores of nq query rows over the same pages (Quest's G heads), out[r * n_pages + pi] = row r's
     * out[pi]: q [nq][d], up [nq][d]. Each page row is read (and widened) once for all nq rows; every output is
     * page_scores' for its row bit for bit (the same fp64 sum in the same order). */
    void (*page_scores_rows)(const float *q, size_t nq, const uint8_t *up, const float *kmin, const float *kmax,
                             size_t stride, size_t n_pages, size_t d, double *out);
    /* The replay's output metrics of nr query heads (sim/replay.c, kvs_rel_l2 and kvs_cosine's sums): for row r,
     * with a = (double)ref[r][i], b = (double)out[r][i], sums[4r..4r+3] = the sums over i of (a - b)^2, a * a,
     * b * b and a * b, each its own running fp64 sum (four rows per pass, one per lane). */
    void (*out_sums)(const float *const *ref, const float *const *out, size_t nr, size_t d, double *sums);
    /* The replay's attention recall and top-k hits of 1 <= m <= 4 query heads (sim/replay.c measure_heads): for lane
     * k < m, over the n[k] entries x = list[k][j] of its list in order, r[k] = the fp64 sum from 0 of
     * (double)fp[k][x], and hit[k] = how many have rank[k][x] < n[k] (0 when rank is NULL). The vector variants
     * step 4 lanes together over the entries all of them have, then finish each lane alone, in order. */
    void (*recall4)(int m, const float *const fp[4], const int32_t *const list[4], const int32_t *const rank[4],
                    const int64_t n[4], double r[4], int64_t hit[4]);
    /* The prefill column sums' heads (kvs_attn_colsum, SUM and MEAN in fp64): for j < n, out[j] += t_j, or t_j / nh
     * when `mean`, t_j = 0 + p[0][j] + p[1][j] + ... + p[nh-1][j] in fp64 in head order (nh >= 1); a power-of-two
     * nh divides as the product with its exact reciprocal (the same quotient). */
    void (*heads_add)(const float *const *p, size_t nh, size_t n, int mean, double *out);
} kvs_math_f64_kernels;

/*! kvs_math_f64_kernels_for() : the table of `isa`, or NULL when this CPU (or build) lacks it. Borrowed, static. */
const kvs_math_f64_kernels *kvs_math_f64_kernels_for(kvs_isa isa);

/*! kvs_math_f64_kernels_active() : the table of kvs_math_isa_active(). */
const kvs_math_f64_kernels *kvs_math_f64_kernels_active(void);

#endif /* KVS_MATH_SIMD_F64_H */
