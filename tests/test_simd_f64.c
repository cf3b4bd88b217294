/* test_simd_f64.c — the fp64 scoring kernels of common/kvs_math_simd_f64.h: every
 * variant this CPU has returns the scalar reference's bits (key norms, key . vector dot products, Quest's page
 * bounds, the fp64 weighted key sums, top-k's fp64 filter, the replay's output-error sums and its recall and top-k
 * hits, the prefill column sums' heads), the scalar reference equals naive fp64 loops written here, and
 * the public kvs_math.h routines built on them (kvs_key_scores, kvs_key_anchor, kvs_page_scores, kvs_topk_f64)
 * equal naive references bit for bit, on awkward shapes (d not a multiple of 8, n not a multiple of the tile,
 * index lists, zero, huge and NaN keys); kvs_attn_colsum's batched prompt rows equal a row-by-row reference bit
 * for bit; kvs_sort_positions' radix sort equals qsort. Variants the CPU lacks are skipped, saying so.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/kvs_math.h"
#include "common/kvs_math_simd.h"
#include "common/kvs_math_simd_f64.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}
static void fill(float *x, size_t n, float amp) {
    for (size_t i = 0; i < n; i++) x[i] = amp * frand();
}

static int variants(const kvs_math_f64_kernels **out) {
    int n = 0;
    for (int i = 1; i < KVS_ISA_COUNT; i++) {
        const kvs_math_f64_kernels *k = kvs_math_f64_kernels_for((kvs_isa)i);
        if (k) out[n++] = k;
        else print_message("variant %s: not available on this CPU, skipped\n", kvs_math_isa_name((kvs_isa)i));
    }
    return n;
}

/* bitwise equality of doubles (NaN payloads included) */
static void assert_same_f64(const double *a, const double *b, size_t n) { assert_memory_equal(a, b, n * sizeof *a); }

static const size_t dims[] = {1, 5, 8, 13, 16, 64, 67, 100, 128, 200};
static const size_t counts[] = {0, 1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 33, 40};

/* naive references, written from the header's definitions */
static double naive_norm(const float *k, size_t d) {
    double s = 0;
    for (size_t i = 0; i < d; i++) s += (double)k[i] * (double)k[i];
    return sqrt(s);
}
static double naive_dot(const float *k, const double *v, size_t d) {
    double s = 0;
    for (size_t i = 0; i < d; i++) s += (double)k[i] * v[i];
    return s;
}

static void test_norms_and_dots_bit_exact(void **state) {
    (void)state;
    const kvs_math_f64_kernels *v[KVS_ISA_COUNT], *sc = kvs_math_f64_kernels_for(KVS_ISA_SCALAR);
    int nv = variants(v);
    enum { ROWS = 64, MAXD = 200 };
    float *keys = malloc(ROWS * (MAXD + 3) * sizeof *keys);
    double vec[MAXD], ref[ROWS], got[ROWS];
    int32_t idx[ROWS];
    assert_non_null(keys);
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        size_t d = dims[di], stride = d + 3;
        fill(keys, ROWS * stride, 3);
        keys[2 * stride] = 1e30f; /* a huge key (its square overflows fp32, not fp64) */
        for (size_t i = 0; i < d; i++) keys[5 * stride + i] = 0; /* a zero key */
        keys[11 * stride + d / 2] = NAN;
        for (size_t i = 0; i < d; i++) vec[i] = (double)frand() * 0.1 + 1e-3 * (double)i;
        for (size_t j = 0; j < ROWS; j++) idx[j] = (int32_t)((j * 37 + 5) % ROWS);
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
            for (int use_idx = 0; use_idx < 2; use_idx++) {
                size_t n = counts[ci];
                const int32_t *ix = use_idx ? idx : NULL;
                sc->norms(keys, stride, ix, n, d, ref);
                for (size_t j = 0; j < n; j++) {
                    double want = naive_norm(keys + (ix ? (size_t)ix[j] : j) * stride, d);
                    assert_memory_equal(&ref[j], &want, sizeof want);
                }
                for (int k = 0; k < nv; k++) {
                    v[k]->norms(keys, stride, ix, n, d, got);
                    assert_same_f64(got, ref, n);
                }
                sc->dots(keys, stride, ix, n, d, vec, ref);
                for (size_t j = 0; j < n; j++) {
                    double want = naive_dot(keys + (ix ? (size_t)ix[j] : j) * stride, vec, d);
                    assert_memory_equal(&ref[j], &want, sizeof want);
                }
                for (int k = 0; k < nv; k++) {
                    v[k]->dots(keys, stride, ix, n, d, vec, got);
                    assert_same_f64(got, ref, n);
                }
            }
    }
    free(keys);
}

static void test_page_scores_bit_exact(void **state) {
    (void)state;
    const kvs_math_f64_kernels *v[KVS_ISA_COUNT], *sc = kvs_math_f64_kernels_for(KVS_ISA_SCALAR);
    int nv = variants(v);
    enum { PAGES = 40, MAXD = 200 };
    float *lo = malloc(PAGES * MAXD * sizeof *lo), *hi = malloc(PAGES * MAXD * sizeof *hi), q[MAXD];
    double ref[PAGES], got[PAGES];
    uint8_t up[MAXD];
    assert_non_null(lo);
    assert_non_null(hi);
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        size_t d = dims[di];
        fill(lo, PAGES * d, 2);
        for (size_t i = 0; i < PAGES * d; i++) hi[i] = lo[i] + 0.5f * (frand() + 1.0f);
        fill(q, d, 1);
        q[0] = 0;
        for (size_t i = 0; i < d; i++) up[i] = (uint8_t)(q[i] >= 0 ? (i % 3 ? 1 : 7) : 0); /* any non-zero = max */
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
            size_t n = counts[ci];
            sc->page_scores(q, up, lo, hi, d, n, d, ref);
            for (size_t pi = 0; pi < n; pi++) {
                double want = 0;
                for (size_t i = 0; i < d; i++) want += (double)q[i] * (double)(up[i] ? hi : lo)[pi * d + i];
                assert_memory_equal(&ref[pi], &want, sizeof want);
            }
            for (int k = 0; k < nv; k++) {
                v[k]->page_scores(q, up, lo, hi, d, n, d, got);
                assert_same_f64(got, ref, n);
            }
        }
    }
    free(lo);
    free(hi);
}

/* page_scores_rows (Quest's G heads at once) against page_scores row by row, on every table, and the public
 * kvs_page_scores_rows against kvs_page_scores: the same bits. Rows padded (stride > d), signed zeros in q. */
static void test_page_scores_rows_bit_exact(void **state) {
    (void)state;
    const kvs_math_f64_kernels *v[KVS_ISA_COUNT], *sc = kvs_math_f64_kernels_for(KVS_ISA_SCALAR);
    int nv = variants(v);
    enum { PAGES = 40, MAXD = 200, PAD = 3, MAXQ = 9 };
    const size_t nqs[] = {1, 2, 3, 4, 5, 9};
    size_t stride_max = MAXD + PAD;
    float *lo = malloc(PAGES * stride_max * sizeof *lo), *hi = malloc(PAGES * stride_max * sizeof *hi);
    float *q = malloc(MAXQ * MAXD * sizeof *q);
    double *ref = malloc(MAXQ * PAGES * sizeof *ref), *got = malloc(MAXQ * PAGES * sizeof *got);
    uint8_t *up = malloc(MAXQ * MAXD);
    assert_true(lo && hi && q && ref && got && up);
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        size_t d = dims[di], stride = d + PAD;
        fill(lo, PAGES * stride, 2);
        for (size_t i = 0; i < PAGES * stride; i++) hi[i] = lo[i] + 0.5f * (frand() + 1.0f);
        fill(q, MAXQ * d, 1);
        q[0] = 0.0f;
        if (MAXQ * d > 1) q[1] = -0.0f;
        for (size_t i = 0; i < MAXQ * d; i++) up[i] = (uint8_t)(q[i] >= 0 ? (i % 3 ? 1 : 7) : 0);
        for (size_t qi = 0; qi < sizeof nqs / sizeof nqs[0]; qi++)
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                size_t nq = nqs[qi], n = counts[ci];
                for (size_t r = 0; r < nq; r++) sc->page_scores(q + r * d, up + r * d, lo, hi, stride, n, d, ref + r * n);
                for (int k = 0; k < nv; k++) {
                    memset(got, 0xff, MAXQ * PAGES * sizeof *got);
                    v[k]->page_scores_rows(q, nq, up, lo, hi, stride, n, d, got);
                    assert_same_f64(got, ref, nq * n);
                }
                for (size_t r = 0; r < nq; r++)
                    kvs_page_scores(q + r * d, NULL, d, NULL, lo, hi, stride, n, ref + r * n);
                memset(got, 0xff, MAXQ * PAGES * sizeof *got);
                kvs_page_scores_rows(q, nq, d, lo, hi, stride, n, got);
                assert_same_f64(got, ref, nq * n);
            }
    }
    free(lo);
    free(hi);
    free(q);
    free(ref);
    free(got);
    free(up);
}

/* wsum (KeyDiff's anchor): the scalar table against n axpys written out (key after key, each element its own
 * chain), every variant against the scalar table bit for bit, onto a nonzero start; keys scattered through an
 * index list and contiguous, n across a tile of 0..9 keys and 33, d with and without the tails of d % 32 and
 * d % 4, weights that are 1 and that are not, an infinity and a NaN in one key. */
static void test_wsum_and_first_above_bit_exact(void **state) {
    (void)state;
    const kvs_math_f64_kernels *v[KVS_ISA_COUNT], *sc = kvs_math_f64_kernels_for(KVS_ISA_SCALAR);
    int nv = variants(v);
    enum { NK = 40, D = 203 };
    float *keys = malloc(NK * D * sizeof *keys);
    assert_non_null(keys);
    fill(keys, NK * D, 4);
    keys[7 * D + 3] = INFINITY;
    keys[11 * D + 64] = NAN;
    int32_t idx[NK];
    for (int j = 0; j < NK; j++) idx[j] = (int32_t)((j * 17 + 5) % NK); /* a permutation */
    double w[NK], a0[D], ref[D], got[D], x[103];
    for (size_t i = 0; i < D; i++) a0[i] = (double)frand() / 3.0;
    const size_t widths[] = {0, 1, 3, 4, 5, 31, 32, 35, 64, 67, 128, 131};
    const size_t ns[] = {0, 1, 2, 3, 5, 8, 9, 33};
    for (int unit = 0; unit < 2; unit++) {
        for (size_t j = 0; j < NK; j++) w[j] = unit ? 1.0 : 1.0 / (1.0 + 0.37 * (double)j);
        for (size_t di = 0; di < sizeof widths / sizeof *widths; di++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
                for (int scattered = 0; scattered < 2; scattered++) {
                    size_t d = widths[di], n = ns[ni];
                    const int32_t *list = scattered ? idx : NULL;
                    memcpy(ref, a0, sizeof a0);
                    sc->wsum(keys, D, list, n, d, w, ref);
                    double want[D];
                    memcpy(want, a0, sizeof a0);
                    for (size_t j = 0; j < n; j++) { /* the axpys, key after key */
                        const float *k = keys + (size_t)(list ? list[j] : (int32_t)j) * D;
                        for (size_t i = 0; i < d; i++) want[i] = want[i] + w[j] * (double)k[i];
                    }
                    assert_same_f64(ref, want, D);
                    for (int vi = 0; vi < nv; vi++) {
                        memcpy(got, a0, sizeof a0);
                        v[vi]->wsum(keys, D, list, n, d, w, got);
                        assert_same_f64(got, ref, D);
                    }
                }
    }
    free(keys);
    for (size_t i = 0; i < 103; i++) x[i] = (double)frand();
    x[40] = NAN;
    x[70] = 0.75;
    for (int j = 0; j < nv; j++)
        for (size_t from = 0; from <= 103; from += 2)
            for (double thr = -1.1; thr < 1.1; thr += 0.07)
                assert_int_equal(v[j]->first_above(x, from, 103, thr), sc->first_above(x, from, 103, thr));
}

/* out_sums (the replay's output-error sums): the scalar table against the naive loop, every variant against the
 * scalar table, bit for bit, for 1..9 rows (a partial pass of 4 and the scalar rest), d with and without a tail
 * of d % 4, rows that alias (ref == out: err2 exactly 0), and an infinity and a NaN in one row only. */
static void test_out_sums_bit_exact(void **state) {
    (void)state;
    const kvs_math_f64_kernels *v[KVS_ISA_COUNT], *sc = kvs_math_f64_kernels_for(KVS_ISA_SCALAR);
    int nv = variants(v);
    enum { R = 9, D = 203 };
    float a[R * D], b[R * D];
    fill(a, R * D, 3);
    fill(b, R * D, 3);
    for (size_t i = 0; i < R * D; i += 7) b[i] = a[i] + 1e-4f * b[i]; /* near outputs: small errors */
    a[5 * D + 2] = INFINITY;
    b[6 * D + 1] = NAN;
    const size_t widths[] = {1, 3, 4, 7, 64, 67, 128, 131};
    for (size_t di = 0; di < sizeof widths / sizeof *widths; di++)
        for (size_t nr = 1; nr <= R; nr++) {
            size_t d = widths[di];
            const float *ra[R], *rb[R];
            for (size_t r = 0; r < nr; r++) ra[r] = a + r * D, rb[r] = r == 2 ? ra[r] : b + r * D;
            double want[4 * R], got[4 * R];
            for (size_t r = 0; r < nr; r++) { /* the replay's formula, written out */
                double e = 0, f = 0, o = 0, t = 0;
                for (size_t i = 0; i < d; i++) {
                    double x = (double)ra[r][i] - (double)rb[r][i];
                    e += x * x;
                    f += (double)ra[r][i] * ra[r][i];
                    o += (double)rb[r][i] * rb[r][i];
                    t += (double)ra[r][i] * rb[r][i];
                }
                want[4 * r] = e, want[4 * r + 1] = f, want[4 * r + 2] = o, want[4 * r + 3] = t;
            }
            sc->out_sums(ra, rb, nr, d, got);
            assert_memory_equal(got, want, 4 * nr * sizeof(double));
            if (nr > 2) assert_true(got[4 * 2] == 0.0);
            for (int j = 0; j < nv; j++) {
                memset(got, 0xA5, sizeof got);
                v[j]->out_sums(ra, rb, nr, d, got);
                assert_memory_equal(got, want, 4 * nr * sizeof(double));
            }
        }
}

/* heads_add (the prefill column sums' heads, SUM and MEAN): the scalar table against the loop written from the
 * header, every variant against the scalar table, bit for bit: 1 to 8 heads (powers of two and not: the mean's
 * product and quotient), column counts around the 4-lane vector, probabilities of mixed magnitude (so the order
 * of the adds shows), a NaN and an infinity, out holding running sums. */
static void test_heads_add_bit_exact(void **state) {
    (void)state;
    const kvs_math_f64_kernels *v[KVS_ISA_COUNT], *sc = kvs_math_f64_kernels_for(KVS_ISA_SCALAR);
    int nv = variants(v);
    enum { H = 8, N = 41 };
    float rows[H][N];
    for (size_t h = 0; h < H; h++)
        for (size_t j = 0; j < N; j++) rows[h][j] = ldexpf(fabsf(frand()), -(int)((h * 7 + j * 3) % 40));
    rows[2][17] = NAN;
    rows[5][30] = INFINITY;
    for (size_t j = 3; j < N; j += 9) /* heads 0-2 in order round 1 + 2^-53 + 2^-53 to 1; from 2 up, to 1 + 2^-52 */
        rows[0][j] = 1.0f, rows[1][j] = ldexpf(1.0f, -53), rows[2][j] = ldexpf(1.0f, -53);
    const float *p[H];
    for (size_t h = 0; h < H; h++) p[h] = rows[h];
    for (size_t nh = 1; nh <= H; nh++)
        for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++)
            for (int mean = 0; mean < 2; mean++) {
                size_t n = counts[ci];
                double want[N], got[N];
                for (size_t j = 0; j < n; j++) {
                    double t = 0.0;
                    for (size_t h = 0; h < nh; h++) t += rows[h][j];
                    if (mean) t = (nh & (nh - 1)) == 0 ? t * (1.0 / (double)nh) : t / (double)nh;
                    want[j] = 0.125 * (double)j + t;
                }
                for (size_t j = 0; j < n; j++) got[j] = 0.125 * (double)j;
                sc->heads_add(p, nh, n, mean, got);
                assert_same_f64(got, want, n);
                for (int k = 0; k < nv; k++) {
                    for (size_t j = 0; j < n; j++) got[j] = 0.125 * (double)j;
                    v[k]->heads_add(p, nh, n, mean, got);
                    assert_same_f64(got, want, n);
                }
            }
}

/* recall4 (the replay's recall and top-k hits of up to 4 heads): the scalar table against the naive loop, every
 * variant against the scalar table, bit for bit: 1 to 4 lanes, one list shared by the lanes and lists of their
 * own, with and without ranks, lanes of equal lengths 0..37 and of lengths 0..37 apart (the vector part over the
 * entries all 4 lanes have and each lane's rest), rows in 4 separate allocations, probabilities of mixed
 * magnitude (so the order of the adds shows), an infinity in one lane and a NaN in another. */
static void test_recall4_bit_exact(void **state) {
    (void)state;
    const kvs_math_f64_kernels *v[KVS_ISA_COUNT], *sc = kvs_math_f64_kernels_for(KVS_ISA_SCALAR);
    int nv = variants(v);
    enum { P = 97, NMAX = 37 };
    float *fp[4];
    int32_t *rank[4], list_own[4][NMAX], list_one[NMAX];
    for (int k = 0; k < 4; k++) {
        fp[k] = malloc(P * sizeof *fp[k]);
        rank[k] = malloc(P * sizeof *rank[k]);
        assert_non_null(fp[k]);
        assert_non_null(rank[k]);
        for (int x = 0; x < P; x++) {
            fp[k][x] = frand() * (x % 3 == 0 ? 1e7f : x % 3 == 1 ? 1.0f : 1e-7f);
            rank[k][x] = (int32_t)((x * 31 + k * 17) % P);
        }
        for (int j = 0; j < NMAX; j++) list_own[k][j] = (int32_t)((j * (5 + 2 * k) + k) % P);
    }
    for (int j = 0; j < NMAX; j++) list_one[j] = (int32_t)((j * 13 + 3) % P);
    fp[1][list_own[1][4]] = INFINITY;
    fp[2][list_one[6]] = NAN;
    for (int m = 1; m <= 4; m++)
        for (int own = 0; own < 2; own++)
            for (int with_rank = 0; with_rank < 2; with_rank++)
                for (int apart = 0; apart < 2; apart++)
                    for (int64_t len = 0; len <= NMAX; len++) {
                        const float *f[4];
                        const int32_t *l[4], *rk[4];
                        int64_t n[4];
                        double want[4], got[4];
                        int64_t want_hit[4], got_hit[4];
                        for (int k = 0; k < m; k++) {
                            f[k] = fp[k], l[k] = own ? list_own[k] : list_one, rk[k] = rank[k];
                            n[k] = apart ? (len + 11 * k) % (NMAX + 1) : len;
                            want[k] = 0, want_hit[k] = 0;
                            for (int64_t j = 0; j < n[k]; j++) { /* the replay's loop, written out */
                                want[k] += (double)f[k][l[k][j]];
                                if (with_rank) want_hit[k] += rk[k][l[k][j]] < n[k];
                            }
                        }
                        const int32_t *const *ranks = with_rank ? rk : NULL;
                        for (int j = -1; j < nv; j++) {
                            const kvs_math_f64_kernels *kf = j < 0 ? sc : v[j];
                            memset(got, 0xA5, sizeof got);
                            memset(got_hit, 0xA5, sizeof got_hit);
                            kf->recall4(m, f, l, ranks, n, got, got_hit);
                            assert_memory_equal(got, want, (size_t)m * sizeof *want);
                            assert_memory_equal(got_hit, want_hit, (size_t)m * sizeof *want_hit);
                        }
                    }
    for (int k = 0; k < 4; k++) {
        free(fp[k]);
        free(rank[k]);
    }
}

/* kvs_topk_f64 (vector filter) against a full sort: descending, ties to the lower index, NaN last. */
static const double *sort_x;
static int cmp_desc(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    double u = sort_x[i], w = sort_x[j];
    if (isnan(u) != isnan(w)) return isnan(u) ? 1 : -1;
    if (!isnan(u) && u != w) return u > w ? -1 : 1;
    return (i > j) - (i < j);
}

static void test_topk_f64_matches_sort(void **state) {
    (void)state;
    enum { N = 613 };
    double x[N];
    int32_t got[N], ref[N];
    for (int rep = 0; rep < 6; rep++) {
        for (int i = 0; i < N; i++) x[i] = rep < 3 ? (double)(int)(8 * frand()) * 0.25 : (double)frand(); /* ties */
        if (rep % 2) x[(rep * 97) % N] = NAN, x[5] = NAN;
        if (rep == 3) x[0] = NAN; /* a NaN root early */
        if (rep == 5) x[9] = -0.0, x[10] = 0.0;
        for (int i = 0; i < N; i++) ref[i] = i;
        sort_x = x;
        qsort(ref, N, sizeof *ref, cmp_desc);
        for (size_t k = 1; k <= N; k = k * 3 + 1) {
            kvs_topk_f64(x, N, k, got);
            assert_memory_equal(got, ref, k * sizeof *got);
        }
        kvs_topk_f64(x, N, N - 1, got); /* KeyDiff's eviction: all but one */
        assert_memory_equal(got, ref, (N - 1) * sizeof *got);
        /* kvs_topk_f64_set: the same members in any order; k past n is capped, k = 0 writes nothing */
        static const size_t set_k[] = {0, 1, 3, 40, 200, N - 1, N, N + 5};
        for (size_t t = 0; t < sizeof set_k / sizeof set_k[0]; t++) {
            size_t k = set_k[t], m = k < N ? k : N;
            int32_t want[N];
            memcpy(want, ref, m * sizeof *want);
            got[0] = -7;
            kvs_topk_f64_set(x, N, k, got);
            if (k == 0) {
                assert_int_equal(got[0], -7);
                continue;
            }
            kvs_sort_positions(want, m);
            kvs_sort_positions(got, m);
            assert_memory_equal(got, want, m * sizeof *got);
        }
    }
}

/* The public key and page scores (through the active kernels) against naive loops of their definitions. */
static void test_key_and_page_scores_match_naive(void **state) {
    (void)state;
    enum { N = 45, D = 67 };
    float keys[N * D], q[D];
    int32_t idx[N];
    double score[N], scratch[N + D], mu[D], want_mu[D], norm[N];
    fill(keys, N * D, 2);
    for (size_t i = 0; i < D; i++) keys[3 * D + i] = 0;
    for (size_t j = 0; j < N; j++) idx[j] = (int32_t)((j * 7 + 2) % N);
    for (int normalized = 0; normalized < 2; normalized++) {
        for (size_t i = 0; i < D; i++) want_mu[i] = 0;
        for (size_t j = 0; j < N; j++) {
            const float *k = keys + (size_t)idx[j] * D;
            norm[j] = naive_norm(k, D);
            double w = normalized ? 1.0 / (norm[j] > 1e-12 ? norm[j] : 1e-12) : 1.0;
            for (size_t i = 0; i < D; i++) want_mu[i] += w * (double)k[i];
        }
        for (size_t i = 0; i < D; i++) want_mu[i] /= (double)N;
        kvs_key_anchor(keys, D, idx, N, D, normalized, mu);
        assert_memory_equal(mu, want_mu, sizeof mu);
        kvs_key_scores(keys, D, idx, N, D, normalized ? KVS_KEY_SCORE_ANCHOR : KVS_KEY_SCORE_ANCHOR_RAW, score, scratch);
        double nmu = 0;
        for (size_t i = 0; i < D; i++) nmu += want_mu[i] * want_mu[i];
        nmu = sqrt(nmu);
        for (size_t j = 0; j < N; j++) {
            double den = norm[j] * nmu, want = -naive_dot(keys + (size_t)idx[j] * D, want_mu, D) / (den > 1e-8 ? den : 1e-8);
            assert_memory_equal(&score[j], &want, sizeof want);
        }
    }
    kvs_key_scores(keys, D, NULL, N, D, KVS_KEY_SCORE_L2NORM, score, scratch);
    for (size_t j = 0; j < N; j++) {
        double want = -naive_norm(keys + j * D, D);
        assert_memory_equal(&score[j], &want, sizeof want);
    }
    /* the anchor over more keys than kvs_key_anchor's norm chunk, without an index list */
    enum { M = 150 };
    float *many = malloc(M * D * sizeof *many);
    assert_non_null(many);
    fill(many, M * D, 1);
    for (size_t i = 0; i < D; i++) want_mu[i] = 0;
    for (size_t j = 0; j < M; j++) {
        double nk = naive_norm(many + j * D, D);
        for (size_t i = 0; i < D; i++) want_mu[i] += (1.0 / nk) * (double)many[j * D + i];
    }
    for (size_t i = 0; i < D; i++) want_mu[i] /= (double)M;
    kvs_key_anchor(many, D, NULL, M, D, 1, mu);
    assert_memory_equal(mu, want_mu, sizeof mu);
    free(many);
    /* Quest's bound: each dimension by q's sign, and a given use_max */
    float lo[N * D], hi[N * D];
    uint8_t use_max[D];
    fill(lo, N * D, 1);
    for (size_t i = 0; i < N * D; i++) hi[i] = lo[i] + 0.25f;
    fill(q, D, 1);
    for (size_t i = 0; i < D; i++) use_max[i] = (uint8_t)(i % 2);
    for (int given = 0; given < 2; given++) {
        kvs_page_scores(q, NULL, D, given ? use_max : NULL, lo, hi, D, N, score);
        for (size_t pi = 0; pi < N; pi++) {
            double want = 0;
            for (size_t i = 0; i < D; i++) {
                int up = given ? use_max[i] : q[i] >= 0;
                want += (double)q[i] * (double)(up ? hi : lo)[pi * D + i];
            }
            assert_memory_equal(&score[pi], &want, sizeof want);
        }
    }
}


/* kvs_attn_colsum's batched rows (the candidates every row of a batch sees scored in one kernel call) against a
 * row-by-row reference written here from kvs_math.h's definition, through the same kvs_attn_scores and
 * kvs_softmax: equal bit for bit, for both precisions and every reducer, more rows than one batch holds, an index
 * list with gaps (rows whose visible prefix grows by 0, 1 or more candidates) and d with a tail. */
static void colsum_reference(const kvs_attn_src *src, const kvs_colsum_opts *o, float *out32, double *out64) {
    size_t n = (size_t)src->n_cand, n_out = (size_t)o->n_out, d = (size_t)src->d;
    float *p = malloc((size_t)o->n_heads * n * sizeof *p), *col = calloc(n, sizeof *col), *mx = calloc(n, sizeof *mx);
    double *t = calloc(n, sizeof *t);
    int64_t *vis = malloc((size_t)o->n_rows * sizeof *vis);
    assert_true(p && col && mx && t && vis);
    for (int64_t r = 0; r < o->n_rows; r++) { /* visible candidates: position <= the query's */
        int64_t pos = src->q_first + o->row_first + r, v = 0;
        while (v < src->n_cand && (src->idx ? src->idx[v] : v) <= pos) v++;
        vis[r] = v;
    }
    if (out32) {
        for (int32_t hh = 0; hh < o->n_heads; hh++) {
            memset(col, 0, n * sizeof *col);
            for (int64_t r = 0; r < o->n_rows; r++) {
                const float *q = src->q + ((size_t)(o->row_first + r) * (size_t)src->group + (size_t)(o->head_first + hh)) * d;
                kvs_attn_scores(q, src->keys, d, src->idx, (size_t)vis[r], d, src->scale, p);
                kvs_softmax(p, (size_t)vis[r]);
                for (size_t j = 0; j < (size_t)vis[r] && j < n_out; j++) col[j] += p[j];
            }
            for (size_t j = 0; j < n_out; j++) {
                if (o->reduce == KVS_GQA_SUM) out32[j] += col[j];
                else if (o->reduce == KVS_GQA_MEAN) out32[j] += col[j] / (float)o->n_heads;
                else if (o->reduce == KVS_GQA_MAX) mx[j] = hh == 0 || col[j] > mx[j] ? col[j] : mx[j];
                else out32[(size_t)hh * n_out + j] += col[j];
            }
        }
        if (o->reduce == KVS_GQA_MAX)
            for (size_t j = 0; j < n_out; j++) out32[j] += mx[j];
    } else {
        for (int64_t r = 0; r < o->n_rows; r++) {
            size_t lim = (size_t)vis[r] < n_out ? (size_t)vis[r] : n_out;
            for (int32_t hh = 0; hh < o->n_heads; hh++) {
                const float *q = src->q + ((size_t)(o->row_first + r) * (size_t)src->group + (size_t)(o->head_first + hh)) * d;
                kvs_attn_scores(q, src->keys, d, src->idx, (size_t)vis[r], d, src->scale, p);
                kvs_softmax(p, (size_t)vis[r]);
                for (size_t j = 0; j < lim; j++) {
                    if (o->reduce == KVS_GQA_NONE) out64[(size_t)hh * n_out + j] += p[j];
                    else if (o->reduce == KVS_GQA_MAX) t[j] = hh == 0 || p[j] > t[j] ? p[j] : t[j];
                    else t[j] = (hh == 0 ? 0.0 : t[j]) + p[j];
                }
            }
            for (size_t j = 0; j < lim; j++) {
                if (o->reduce == KVS_GQA_MEAN) out64[j] += t[j] / (double)o->n_heads;
                else if (o->reduce != KVS_GQA_NONE) out64[j] += t[j];
            }
        }
    }
    free(p);
    free(col);
    free(mx);
    free(t);
    free(vis);
}

static void test_colsum_batched_equals_rows(void **state) {
    (void)state;
    enum { NQ = 70, G = 4, NK = 160 };
    const size_t ds[] = {8, 67};
    for (size_t di = 0; di < 2; di++) {
        size_t d = ds[di];
        float *q = malloc(NQ * G * d * sizeof *q), *k = malloc(NK * d * sizeof *k);
        int32_t idx[NK];
        assert_true(q && k);
        fill(q, NQ * G * d, 2);
        fill(k, NK * d, 1);
        /* candidates: positions 0..59 every other one, then 60..159 except a few gaps (queries at 90..159) */
        int64_t nc = 0;
        for (int32_t p = 0; p < NK; p++)
            if ((p < 60 && p % 2 == 0) || (p >= 60 && p % 7 != 3)) idx[nc++] = p;
        for (int use_idx = 0; use_idx < 2; use_idx++) {
            kvs_attn_src src = {.q = q, .q_first = NK - NQ, .n_q = NQ, .group = G, .d = (int32_t)d, .scale = 0.3f,
                                .keys = k, .idx = use_idx ? idx : NULL, .n_cand = use_idx ? nc : NK};
            void *scratch = malloc(kvs_attn_colsum_scratch_bytes(src.n_cand));
            assert_non_null(scratch);
            for (int reduce = 0; reduce <= KVS_GQA_MAX; reduce++)
                for (int32_t nh = 1; nh <= G; nh += 3) {
                    kvs_colsum_opts o = {.row_first = 3, .n_rows = NQ - 5, .head_first = G - nh, .n_heads = nh,
                                         .reduce = (kvs_gqa_reduce)reduce, .n_out = src.n_cand - 4};
                    size_t len = (size_t)(reduce == KVS_GQA_NONE ? nh : 1) * (size_t)o.n_out;
                    float *o32 = calloc(len, sizeof *o32), *r32 = calloc(len, sizeof *r32);
                    double *o64 = calloc(len, sizeof *o64), *r64 = calloc(len, sizeof *r64);
                    assert_true(o32 && r32 && o64 && r64);
                    for (size_t j = 0; j < len; j++) o32[j] = r32[j] = 0.5f, o64[j] = r64[j] = 0.25;
                    kvs_attn_colsum(&src, &o, o32, NULL, scratch);
                    colsum_reference(&src, &o, r32, NULL);
                    assert_memory_equal(o32, r32, len * sizeof *o32);
                    kvs_attn_colsum(&src, &o, NULL, o64, scratch);
                    colsum_reference(&src, &o, NULL, r64);
                    assert_memory_equal(o64, r64, len * sizeof *o64);
                    free(o32);
                    free(r32);
                    free(o64);
                    free(r64);
                }
            free(scratch);
        }
        free(q);
        free(k);
    }
}


/* kvs_sort_positions (insertion for short lists, radix for long ones) against qsort: sizes around the switch,
 * duplicates, negative and extreme values, already sorted and reversed input. */
static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void test_sort_positions_matches_qsort(void **state) {
    (void)state;
    const size_t sizes[] = {0, 1, 2, 31, 32, 33, 100, 1000, 5000};
    int32_t *a = malloc(5000 * sizeof *a), *ref = malloc(5000 * sizeof *ref);
    assert_true(a && ref);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int kind = 0; kind < 5; kind++) {
            size_t n = sizes[si];
            for (size_t i = 0; i < n; i++) {
                uint32_t r = (uint32_t)((frand() + 1.0f) * 1048576.0f) * 2654435761u;
                switch (kind) {
                case 0: a[i] = (int32_t)(r % 4096); break;                 /* positions with duplicates */
                case 1: a[i] = (int32_t)(r ^ 0x5bd1e995u); break;          /* any int32, negatives too */
                case 2: a[i] = (int32_t)i * 3; break;                      /* already sorted */
                case 3: a[i] = (int32_t)(n - i) * 7; break;                /* reversed */
                default: a[i] = i % 3 ? INT32_MAX : INT32_MIN; break;     /* extremes only */
                }
            }
            memcpy(ref, a, n * sizeof *a);
            qsort(ref, n, sizeof *ref, cmp_i32);
            kvs_sort_positions(a, n);
            assert_memory_equal(a, ref, n * sizeof *a);
        }
    free(a);
    free(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_norms_and_dots_bit_exact),
        cmocka_unit_test(test_page_scores_bit_exact),
        cmocka_unit_test(test_page_scores_rows_bit_exact),
        cmocka_unit_test(test_wsum_and_first_above_bit_exact),
        cmocka_unit_test(test_out_sums_bit_exact),
        cmocka_unit_test(test_recall4_bit_exact),
        cmocka_unit_test(test_heads_add_bit_exact),
        cmocka_unit_test(test_topk_f64_matches_sort),
        cmocka_unit_test(test_key_and_page_scores_match_naive),
        cmocka_unit_test(test_colsum_batched_equals_rows),
        cmocka_unit_test(test_sort_positions_matches_qsort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
