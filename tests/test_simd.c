/* test_simd.c — the runtime-dispatched kernels of common/kvs_math_simd.h: every variant this CPU has
 * against the scalar reference and against naive fp64 loops written here (dot, axpy, grouped scores, output,
 * softmax/LSE and the softmax without it, the vector exp against libm's expf, top-k's filter, dots_loose within
 * the any-order bound); a row's result independent of the rows
 * computed with it (kvs_attention_group, the blocked causal full attention of kvs_attention_causal_block equal
 * kvs_attention row by row, bit for bit); top-k with the vector filter against a sort; and the replay's
 * per-layer numbers through the CLI with KVS_SIMD=scalar against the default kernels; the avx2x32 table equal to the
 * AVX2 one bit for bit, kernel by kernel and through the CLI.
 * Variants the CPU lacks are skipped, saying so.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvs.h"
#include "common/kvs_math.h"
#include "common/kvs_math_simd.h"
#include "tests/util/cli_run.h"
#include "tests/util/gen_trace.h"

/* deterministic values in [-1, 1) */
static uint64_t rng_state = 0x243F6A8885A308D3ull;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}
static void fill(float *x, size_t n, float amp) {
    for (size_t i = 0; i < n; i++) x[i] = amp * frand();
}

/* The tables to check besides the scalar one; prints the variants this CPU lacks. */
static int variants(const kvs_math_kernels **out) {
    int n = 0;
    for (int i = 1; i < KVS_ISA_COUNT; i++) {
        const kvs_math_kernels *k = kvs_math_kernels_for((kvs_isa)i);
        if (k) out[n++] = k;
        else print_message("variant %s: not available on this CPU, skipped\n", kvs_math_isa_name((kvs_isa)i));
    }
    return n;
}

static const size_t dims[] = {1, 3, 8, 13, 16, 24, 64, 67, 128};

/* fp64 dot and its error scale sum |a_i b_i| (a fp32 sum in any order is within n*eps of it, times that) */
static double dot64(const float *a, const float *b, size_t n, double *mag) {
    double s = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        s += (double)a[i] * b[i];
        m += fabs((double)a[i] * b[i]);
    }
    *mag = m;
    return s;
}
#define F32_EPS 1.1920929e-7

/* dots_loose (any order of the adds) within the any-order bound gamma_d sum |v_i k_i| of the fp64 dot, on every
 * table: key counts around the 8-key pass, dimensions around the 8-lane chunk, rows by index and in place. */
static void test_dots_loose_within_the_bound(void **state) {
    (void)state;
    const kvs_math_kernels *v[KVS_ISA_COUNT];
    int nv = variants(v);
    v[nv++] = kvs_math_kernels_for(KVS_ISA_SCALAR);
    enum { ROWS = 40, MAXD = 128 };
    static float keys[ROWS * MAXD];
    float q[MAXD], out[ROWS];
    int32_t idx[ROWS];
    for (size_t j = 0; j < ROWS; j++) idx[j] = (int32_t)((j * 7 + 3) % ROWS);
    for (int k = 0; k < nv; k++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (size_t n = 0; n <= 17; n += (n < 9 ? 1 : 8)) {
                size_t d = dims[di];
                fill(keys, ROWS * d, 3);
                fill(q, d, 1);
                for (int byidx = 0; byidx < 2; byidx++) {
                    v[k]->dots_loose(q, keys, d, byidx ? idx : NULL, n, d, out);
                    for (size_t j = 0; j < n; j++) {
                        double mag, ref = dot64(q, keys + (size_t)(byidx ? idx[j] : (int32_t)j) * d, d, &mag);
                        if (!(fabs(out[j] - ref) <= (double)d * F32_EPS * mag + 1e-30))
                            fail_msg("%s d %zu n %zu key %zu: %.9g vs %.9g", v[k]->name, d, n, j, out[j], ref);
                    }
                }
            }
}

static void test_dot_and_axpy_match_fp64(void **state) {
    (void)state;
    const kvs_math_kernels *v[KVS_ISA_COUNT];
    int nv = variants(v);
    v[nv++] = kvs_math_kernels_for(KVS_ISA_SCALAR);
    float a[300], b[300], o1[300], o2[300];
    for (int k = 0; k < nv; k++)
        for (size_t n = 0; n < 300; n += (n < 40 ? 1 : 37)) {
            fill(a, n, 1);
            fill(b, n, 2);
            double mag, ref = dot64(a, b, n, &mag);
            float got = v[k]->dot(a, b, n);
            assert_true(fabs(got - ref) <= (double)(n + 1) * F32_EPS * mag + 1e-30);
            fill(o1, n, 1);
            memcpy(o2, o1, n * sizeof *o1);
            v[k]->axpy(o1, 0.37f, b, n);
            for (size_t i = 0; i < n; i++) assert_true(fabs(o1[i] - ((double)o2[i] + 0.37 * b[i])) <= 4 * F32_EPS * 3);
        }
}

/* Grouped scores with and without an index list, rows at a stride, against fp64 and the scalar table. */
static void test_scores_match_reference(void **state) {
    (void)state;
    const kvs_math_kernels *v[KVS_ISA_COUNT], *sc = kvs_math_kernels_for(KVS_ISA_SCALAR);
    int nv = variants(v);
    enum { MAXN = 23, MAXR = 7 };
    for (int k = 0; k < nv; k++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            size_t d = dims[di], stride = d + 3;
            float *keys = malloc(40 * stride * sizeof *keys), *q = malloc(MAXR * d * sizeof *q);
            fill(keys, 40 * stride, 1);
            fill(q, MAXR * d, 1);
            int32_t idx[MAXN];
            for (int j = 0; j < MAXN; j++) idx[j] = (int32_t)((j * 7 + 3) % 40);
            for (size_t nr = 1; nr <= MAXR; nr++)
                for (size_t n = 1; n <= MAXN; n += 2) /* every residue mod 3 and 4 (the tiles) */
                    for (int use_idx = 0; use_idx < 2; use_idx++) {
                        float got[MAXR][MAXN + 2], ref[MAXR][MAXN + 2];
                        float *gr[MAXR], *rr[MAXR];
                        for (size_t r = 0; r < nr; r++) gr[r] = got[r], rr[r] = ref[r];
                        v[k]->scores(q, nr, keys, stride, use_idx ? idx : NULL, n, d, 0.125f, gr, 2);
                        sc->scores(q, nr, keys, stride, use_idx ? idx : NULL, n, d, 0.125f, rr, 2);
                        for (size_t r = 0; r < nr; r++)
                            for (size_t j = 0; j < n; j++) {
                                const float *kr = keys + (use_idx ? (size_t)idx[j] : j) * stride;
                                double mag, exact = 0.125 * dot64(q + r * d, kr, d, &mag);
                                double tol = (double)(d + 2) * F32_EPS * 0.125 * mag + 1e-30;
                                assert_true(fabs(got[r][2 + j] - exact) <= tol);
                                assert_true(fabs(ref[r][2 + j] - exact) <= tol);
                                /* the row alone gives the same bits as the row among others */
                                float one[MAXN + 2], *op = one;
                                v[k]->scores(q + r * d, 1, keys, stride, use_idx ? idx : NULL, n, d, 0.125f, &op, 2);
                                assert_memory_equal(&one[2 + j], &got[r][2 + j], sizeof(float));
                            }
                    }
            free(keys);
            free(q);
        }
}

static void test_output_matches_reference(void **state) {
    (void)state;
    const kvs_math_kernels *v[KVS_ISA_COUNT];
    int nv = variants(v);
    enum { MAXN = 300, MAXR = 6 };
    for (int k = 0; k < nv; k++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            size_t d = dims[di], stride = d + 1;
            float *vals = malloc(MAXN * stride * sizeof *vals), *p = malloc(MAXR * (MAXN + 1) * sizeof *p);
            float *out = malloc(MAXR * d * sizeof *out), *one = malloc(d * sizeof *one);
            fill(vals, MAXN * stride, 1);
            for (size_t i = 0; i < MAXR * (MAXN + 1); i++) p[i] = 0.5f * (frand() + 1.0f);
            int32_t idx[MAXN];
            for (int j = 0; j < MAXN; j++) idx[j] = (int32_t)((j * 11 + 5) % MAXN);
            for (size_t nr = 1; nr <= MAXR; nr++)
                for (size_t n = 1; n <= MAXN; n = n * 3 + 1)
                    for (int use_idx = 0; use_idx < 2; use_idx++) {
                        const float *pr[MAXR];
                        float *orow[MAXR];
                        for (size_t r = 0; r < nr; r++) {
                            pr[r] = p + r * (MAXN + 1);
                            orow[r] = out + r * d;
                            for (size_t i = 0; i < d; i++) orow[r][i] = 0.25f; /* it adds */
                        }
                        v[k]->output_add(pr, nr, 1, vals, stride, use_idx ? idx : NULL, n, d, orow);
                        for (size_t r = 0; r < nr; r++) {
                            for (size_t i = 0; i < d; i++) {
                                double s = 0.25, mag = 0.25;
                                for (size_t j = 0; j < n; j++) {
                                    double x = (double)pr[r][1 + j] *
                                               vals[(use_idx ? (size_t)idx[j] : j) * stride + i];
                                    s += x;
                                    mag += fabs(x);
                                }
                                assert_true(fabs(orow[r][i] - s) <= (double)(n + 2) * F32_EPS * mag);
                            }
                            for (size_t i = 0; i < d; i++) one[i] = 0.25f;
                            v[k]->output_add(&pr[r], 1, 1, vals, stride, use_idx ? idx : NULL, n, d, &one);
                            assert_memory_equal(one, orow[r], d * sizeof *one);
                        }
                    }
            free(vals);
            free(p);
            free(out);
            free(one);
        }
}

/* The vector exp against libm's expf: relative error <= KVS_SIMD_EXP_REL_ERR where expf is normal, 0 below
 * KVS_SIMD_EXP_LO, NaN through. */
static void test_exp_accuracy_against_libm(void **state) {
    (void)state;
    const kvs_math_kernels *v[KVS_ISA_COUNT];
    int nv = variants(v);
    enum { N = 200003 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    for (size_t i = 0; i < N; i++) x[i] = -100.0f + 188.3f * (float)i / (float)(N - 1);
    x[0] = NAN;
    x[1] = -INFINITY;
    x[2] = 0.0f;
    x[3] = -0.0f;
    for (int k = 0; k < nv; k++) {
        v[k]->exp(x, N, y);
        double worst = 0;
        assert_true(isnan(y[0]));
        assert_true(y[1] == 0.0f);
        assert_true(y[2] == 1.0f && y[3] == 1.0f);
        for (size_t i = 4; i < N; i++) {
            double ref = expf(x[i]);
            if (x[i] < KVS_SIMD_EXP_LO) {
                assert_true(y[i] == 0.0f);
            } else if (ref >= 1.17549435e-38) {
                double rel = fabs(y[i] - ref) / ref;
                if (rel > worst) worst = rel;
            } else {
                assert_true(fabs(y[i] - ref) <= 1.2e-38);
            }
        }
        print_message("%s exp: worst relative error %.3g against expf on [%g, 88.3]\n", v[k]->name, worst,
                      (double)KVS_SIMD_EXP_LO);
        assert_true(worst <= KVS_SIMD_EXP_REL_ERR);
        /* odd lengths: the tail goes through the same lanes */
        float y5[5];
        v[k]->exp(x + 1000, 5, y5);
        assert_memory_equal(y5, y + 1000, sizeof y5);
    }
    free(x);
    free(y);
}

static void test_softmax_and_lse_match_fp64(void **state) {
    (void)state;
    const kvs_math_kernels *v[KVS_ISA_COUNT];
    int nv = variants(v);
    float x[1030], y[1030];
    for (int k = 0; k < nv; k++)
        for (size_t n = 1; n <= 1030; n = n * 2 + 1) {
            fill(x, n, 12);
            if (n > 4) x[3] = -INFINITY; /* a masked entry: probability 0 */
            memcpy(y, x, n * sizeof *x);
            double lse = v[k]->softmax(y, n);
            float yp[1030]; /* the entry without the LSE: the same probabilities, bit for bit */
            memcpy(yp, x, n * sizeof *x);
            v[k]->softmax_probs(yp, n);
            assert_memory_equal(yp, y, n * sizeof *y);
            double m = -INFINITY, z = 0;
            for (size_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
            for (size_t j = 0; j < n; j++) z += exp((double)x[j] - m);
            assert_true(fabs(lse - (m + log(z))) <= 1e-6 * (1 + fabs(lse)));
            for (size_t j = 0; j < n; j++) {
                /* x[j] - m is rounded to fp32 before the exp: a relative (|x[j] - m| + 2) eps on top */
                double p = exp((double)x[j] - m) / z, dx = fabs((double)x[j] - m);
                assert_true(fabs(y[j] - p) <= (isinf(dx) ? 0 : (dx + 4) * F32_EPS * p) + 1e-37);
            }
        }
    /* a NaN poisons the row as in the reference */
    for (int k = 0; k < nv; k++) {
        for (size_t j = 0; j < 19; j++) x[j] = (float)j;
        x[9] = NAN;
        memcpy(y, x, 19 * sizeof *x);
        v[k]->softmax(x, 19);
        assert_true(isnan(x[9]) && isnan(x[0]));
        v[k]->softmax_probs(y, 19);
        assert_memory_equal(y, x, 19 * sizeof *x);
    }
}

/* The AVX2 softmax (both 256-bit tables) element by element: its exp pass runs software-pipelined and its maximum
 * over four running maxima, and neither may change a bit. Each probability must be the table's own exp of x - m
 * times (float)(1 / sum), with m the row's maximum (NaN skipped) and the sum in the kernel's documented order (two
 * fp64 accumulators of 4 lanes, then (l0 + l1) + (l2 + l3), then the n % 8 tail one by one): every length 1..80 and
 * some long ones, with -inf entries, a +0/-0 tie at the maximum, and a NaN; softmax_probs' the same bits. */
static void test_softmax_avx2_equals_its_exp(void **state) {
    (void)state;
    const kvs_isa isas[3] = {KVS_ISA_AVX2, KVS_ISA_AVX2X32, KVS_ISA_AVX512};
    static float x[2100], y[2100], t[2100], e[2100];
    for (int v = 0; v < 3; v++) {
        const kvs_math_kernels *k = kvs_math_kernels_for(isas[v]);
        if (!k) continue;
        for (size_t n = 1; n <= 2100; n = n < 80 ? n + 1 : n * 3 + 7) {
            for (int variant = 0; variant < 4; variant++) {
                fill(x, n, 20);
                if (variant == 1 && n > 5) x[n / 2] = -INFINITY, x[n - 1] = -INFINITY;
                if (variant == 2) { /* the maximum tied between +0 and -0 */
                    for (size_t j = 0; j < n; j++) x[j] = -fabsf(x[j]) - 1.0f;
                    x[n / 3] = 0.0f;
                    x[n - 1] = -0.0f;
                }
                if (variant == 3 && n > 2) x[n / 2] = NAN;
                memcpy(y, x, n * sizeof *x);
                k->softmax(y, n);
                memcpy(t, x, n * sizeof *x); /* softmax_probs: the same probabilities, bit for bit */
                k->softmax_probs(t, n);
                assert_memory_equal(t, y, n * sizeof *y);
                if (variant == 3 && n > 2) {
                    for (size_t j = 0; j < n; j++) assert_true(isnan(y[j]) || y[j] == 0.0f);
                    assert_true(isnan(y[n / 2]));
                    continue;
                }
                float m = -INFINITY;
                for (size_t j = 0; j < n; j++)
                    if (x[j] > m) m = x[j];
                for (size_t j = 0; j < n; j++) t[j] = x[j] - m;
                k->exp(t, n, e);
                double lane[8] = {0}, sum;
                size_t n8 = n & ~(size_t)7;
                for (size_t j = 0; j < n8; j++) lane[j % 8] += (double)e[j];
                sum = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
                for (size_t j = n8; j < n; j++) sum += (double)e[j];
                float inv = (float)(1.0 / sum);
                for (size_t j = 0; j < n; j++) assert_true(y[j] == e[j] * inv);
            }
        }
    }
}

static void test_first_above_matches_scalar(void **state) {
    (void)state;
    const kvs_math_kernels *v[KVS_ISA_COUNT], *sc = kvs_math_kernels_for(KVS_ISA_SCALAR);
    int nv = variants(v);
    float x[101];
    fill(x, 101, 1);
    x[50] = NAN;
    x[60] = 0.5f;
    for (int k = 0; k < nv; k++)
        for (size_t from = 0; from <= 101; from += 3)
            for (float thr = -1.1f; thr < 1.1f; thr += 0.05f)
                assert_int_equal(v[k]->first_above(x, from, 101, thr), sc->first_above(x, from, 101, thr));
}

/* kvs_topk (vector filter) against a full sort with the same order: descending, ties to the lower index,
 * NaN last; many ties and NaNs. */
static int cmp_desc(const void *a, const void *b, const float *x) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float u = x[i], w = x[j];
    if (isnan(u) != isnan(w)) return isnan(u) ? 1 : -1;
    if (!isnan(u) && u != w) return u > w ? -1 : 1;
    return (i > j) - (i < j);
}
static const float *sort_x;
static int cmp_desc_q(const void *a, const void *b) { return cmp_desc(a, b, sort_x); }

static void test_topk_matches_sort(void **state) {
    (void)state;
    enum { N = 997 };
    float x[N];
    int32_t got[N], ref[N];
    for (int rep = 0; rep < 6; rep++) {
        for (int i = 0; i < N; i++) x[i] = (float)(int)(8 * frand()) * 0.25f; /* heavy ties */
        if (rep % 2) x[(rep * 97) % N] = NAN, x[5] = NAN;
        if (rep == 4) x[0] = NAN; /* a NaN root early */
        for (int i = 0; i < N; i++) ref[i] = i;
        sort_x = x;
        qsort(ref, N, sizeof *ref, cmp_desc_q);
        for (size_t k = 1; k <= N; k = k * 4 + 1) {
            kvs_topk(x, N, k, got);
            assert_memory_equal(got, ref, k * sizeof *got);
        }
    }
}

/* kvs_attention_group and the blocked causal attention equal kvs_attention row by row, bit for bit. */
/* The avx2x32 table (AVX-512VL's 32 registers, wider tiles) and the avx512 table (the same arithmetic on 16 lanes)
 * compute every value exactly as the AVX2 table does: scores, output, softmax and the 16-bit entries (fp16 and bf16)
 * equal bit for bit over row counts 1..9, 12 and 17 (the 4-row tiles, the rows past them, and at d 1024 the avx512
 * scores' blocks of 4 packed rows), list lengths of every residue mod 8, head_dims with and without 8-, 16-, 32-, 64-
 * and 128-float tails, value lists that cross the output tiles' passes, with and without an index list. */
static void wide_equals_avx2(const kvs_math_kernels *a, const kvs_math_kernels *b) {
    { /* the exponential on the special values and a dense grid, 1 to 40 elements (16-, 8-lane blocks, tails) */
        enum { NE = 4000 };
        static float x[NE], ya[NE], yb[NE];
        static const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, -1e30f, -100.0f, -87.5f, -87.33f,
                                        -87.3f, 88.3f, 88.38f, 89.0f, 1e30f, 1e-40f, -1e-40f};
        size_t ns = sizeof special / sizeof special[0];
        for (size_t i = 0; i < NE; i++) x[i] = i < ns ? special[i] : -90.0f + 180.0f * (float)(i - ns) / (NE - ns);
        for (size_t n = 1; n <= 40; n++) {
            memset(ya, 0, sizeof ya);
            memset(yb, 0, sizeof yb);
            for (size_t off = 0; off + n <= NE; off += n) {
                a->exp(x + off, n, ya + off);
                b->exp(x + off, n, yb + off);
            }
            assert_memory_equal(ya, yb, sizeof ya);
        }
    }
    /* 200: a 128-column pass and a tail; 1024: 4 query rows per avx512 block */
    static const size_t xd[] = {1, 7, 8, 13, 32, 40, 64, 67, 100, 128, 200, 256, 1024};
    static const size_t xr[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 17};
    enum { MAXR = 17, MAXN = 301, ROWS = 320 };
    for (size_t di = 0; di < sizeof xd / sizeof xd[0]; di++) {
        size_t d = xd[di], stride = d + 5;
        float *kv = malloc(ROWS * stride * sizeof *kv), *q = malloc(MAXR * d * sizeof *q);
        uint16_t *h = malloc(ROWS * stride * sizeof *h);
        float *pa = malloc(MAXR * (MAXN + 3) * sizeof *pa), *pb = malloc(MAXR * (MAXN + 3) * sizeof *pb);
        float *oa = malloc(MAXR * d * sizeof *oa), *ob = malloc(MAXR * d * sizeof *ob);
        fill(kv, ROWS * stride, 1);
        fill(q, MAXR * d, 2);
        int32_t idx[MAXN];
        for (int j = 0; j < MAXN; j++) idx[j] = (int32_t)((j * 13 + 7) % ROWS);
        for (size_t ri = 0; ri < sizeof xr / sizeof xr[0]; ri++)
            for (size_t n = 1; n <= MAXN; n += (n < 12 ? 1 : 29)) {
                size_t nr = xr[ri];
                if (nr > 9 && d < 1024 && d != 128) continue; /* the wide row counts where blocks matter */
                for (int use_idx = 0; use_idx < 2; use_idx++) {
                    const int32_t *ix = use_idx ? idx : NULL;
                    float *ra[MAXR], *rb[MAXR], *wa[MAXR], *wb[MAXR];
                    for (size_t r = 0; r < nr; r++)
                        ra[r] = pa + r * (MAXN + 3), rb[r] = pb + r * (MAXN + 3), wa[r] = oa + r * d, wb[r] = ob + r * d;
                    a->scores(q, nr, kv, stride, ix, n, d, 0.3f, ra, 3);
                    b->scores(q, nr, kv, stride, ix, n, d, 0.3f, rb, 3);
                    for (size_t r = 0; r < nr; r++) assert_memory_equal(ra[r] + 3, rb[r] + 3, n * sizeof(float));
                    for (size_t r = 0; r < nr; r++) {
                        double la = a->softmax(ra[r] + 3, n), lb = b->softmax(rb[r] + 3, n);
                        assert_memory_equal(&la, &lb, sizeof la);
                        assert_memory_equal(ra[r] + 3, rb[r] + 3, n * sizeof(float));
                    }
                    fill(oa, nr * d, 1);
                    memcpy(ob, oa, nr * d * sizeof *oa);
                    a->output_add((const float *const *)ra, nr, 3, kv, stride, ix, n, d, wa);
                    b->output_add((const float *const *)rb, nr, 3, kv, stride, ix, n, d, wb);
                    assert_memory_equal(oa, ob, nr * d * sizeof *oa);
                    for (int t = 0; t < 2; t++) {
                        kvs_dtype dt = t ? KVS_DTYPE_BF16 : KVS_DTYPE_F16;
                        for (size_t i = 0; i < ROWS * stride; i++)
                            h[i] = t ? kvs_f32_to_bf16(kv[i]) : kvs_f32_to_f16(kv[i]);
                        a->scores16(q, nr, h, dt, stride, ix, n, d, 0.3f, ra, 3);
                        b->scores16(q, nr, h, dt, stride, ix, n, d, 0.3f, rb, 3);
                        for (size_t r = 0; r < nr; r++) assert_memory_equal(ra[r] + 3, rb[r] + 3, n * sizeof(float));
                        for (size_t r = 0; r < nr; r++) a->softmax(ra[r] + 3, n), b->softmax(rb[r] + 3, n);
                        fill(oa, nr * d, 1);
                        memcpy(ob, oa, nr * d * sizeof *oa);
                        a->output_add16((const float *const *)ra, nr, 3, h, dt, stride, ix, n, d, wa);
                        b->output_add16((const float *const *)rb, nr, 3, h, dt, stride, ix, n, d, wb);
                        assert_memory_equal(oa, ob, nr * d * sizeof *oa);
                    }
                }
            }
        free(kv);
        free(q);
        free(h);
        free(pa);
        free(pb);
        free(oa);
        free(ob);
    }
}

/* desc_keys (the rankings' radix keys): every table equals kvs_desc_key element by element on special values
 * (signed zeros, infinities, NaNs of either sign and payload, subnormals, the largest finite values) and random
 * bit patterns, at every length 1..40 (the 8-wide steps and their tails). */
static void test_desc_keys_match_scalar(void **state) {
    (void)state;
    enum { NK = 4096 };
    static float x[NK];
    static uint32_t got[NK];
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                                       0x7f800001u, 0xffffffffu, 0x00000001u, 0x80000001u, 0x7f7fffffu, 0xff7fffffu,
                                       0x3f800000u, 0xbf800000u, 0x7fffffffu};
    size_t ns = sizeof special / sizeof special[0];
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < NK; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t b = i < ns ? special[i] : (uint32_t)(st >> 32);
        memcpy(&x[i], &b, sizeof b);
    }
    for (int isa = 0; isa < KVS_ISA_COUNT; isa++) {
        const kvs_math_kernels *k = kvs_math_kernels_for((kvs_isa)isa);
        if (!k) continue;
        for (size_t n = 1; n <= 40; n++)
            for (size_t off = 0; off + n <= NK; off += n) {
                k->desc_keys(x + off, n, got + off);
                for (size_t i = off; i < off + n; i++) assert_int_equal(got[i], kvs_desc_key(x[i]));
            }
    }
}

/* wide_equals_avx2 on the table of `isa` (named `name`), skipped where the CPU lacks it or AVX2. */
static void wide_table_equals_avx2(kvs_isa isa, const char *name) {
    const kvs_math_kernels *a = kvs_math_kernels_for(KVS_ISA_AVX2), *b = kvs_math_kernels_for(isa);
    if (!a || !b) {
        print_message("avx2 or %s not available on this CPU: skipped\n", name);
        skip();
    }
    wide_equals_avx2(a, b);
}

static void test_avx2x32_equals_avx2_bit_for_bit(void **state) {
    (void)state;
    wide_table_equals_avx2(KVS_ISA_AVX2X32, "avx2x32");
}

static void test_avx512_equals_avx2_bit_for_bit(void **state) {
    (void)state;
    wide_table_equals_avx2(KVS_ISA_AVX512, "avx512");
}

static void test_blocked_causal_attention_equals_rows(void **state) {
    (void)state;
    const size_t G = 3, nb = 5, p0 = 37, n = p0 + nb;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        size_t d = dims[di];
        float *k = malloc(n * d * sizeof *k), *v = malloc(n * d * sizeof *v), *q = malloc(nb * G * d * sizeof *q);
        float *pb = malloc(nb * G * n * sizeof *pb), *ob = malloc(nb * G * d * sizeof *ob);
        float *pr = malloc(n * sizeof *pr), *orow = malloc(d * sizeof *orow);
        fill(k, n * d, 1);
        fill(v, n * d, 1);
        fill(q, nb * G * d, 2);
        float *prow[15], *opr[15], *srow[15], *sb = malloc(nb * G * n * sizeof *sb);
        double lse[15];
        for (size_t r = 0; r < nb * G; r++) prow[r] = pb + r * n, opr[r] = ob + r * d, srow[r] = sb + r * n;
        kvs_attention_causal_block(q, nb, G, k, v, d, p0, 0.3f, prow, opr, lse, srow);
        for (size_t r = 0; r < nb * G; r++) {
            size_t len = p0 + 1 + r / G;
            kvs_attn_scores(q + r * d, k, d, NULL, len, d, 0.3f, pr); /* the kept scores: the row's own */
            assert_memory_equal(pr, srow[r], len * sizeof *pr);
            double l = kvs_attention(q + r * d, k, v, d, NULL, len, d, 0.3f, pr, orow);
            assert_memory_equal(pr, prow[r], len * sizeof *pr);
            assert_memory_equal(orow, opr[r], d * sizeof *orow);
            assert_true(l == lse[r]);
            /* and against fp64: output within 1e-5 relative */
            double m = -INFINITY, z = 0;
            double *s = malloc(len * sizeof *s);
            for (size_t j = 0; j < len; j++) {
                double mag;
                s[j] = 0.3 * dot64(q + r * d, k + j * d, d, &mag);
                m = s[j] > m ? s[j] : m;
            }
            for (size_t j = 0; j < len; j++) z += exp(s[j] - m);
            for (size_t i = 0; i < d; i++) {
                double o = 0;
                for (size_t j = 0; j < len; j++) o += exp(s[j] - m) / z * v[j * d + i];
                assert_true(fabs(o - orow[i]) <= 1e-5);
            }
            free(s);
        }
        /* a shared selection for the group: equal to each row alone */
        int32_t idx[9] = {0, 3, 4, 9, 10, 20, 30, 36, 41};
        float *gout = malloc(G * d * sizeof *gout);
        double glse[3];
        kvs_attention_group(q, G, k, v, d, idx, 9, d, 0.3f, prow, gout, glse);
        for (size_t g = 0; g < G; g++) {
            double l = kvs_attention(q + g * d, k, v, d, idx, 9, d, 0.3f, pr, orow);
            assert_memory_equal(pr, prow[g], 9 * sizeof *pr);
            assert_memory_equal(orow, gout + g * d, d * sizeof *orow);
            assert_true(l == glse[g]);
        }
        /* the same from the last block position's kept scores (its rows see all n positions): gathered, not
         * computed, and the same bits, over a list and over the whole prefix (idx NULL) */
        float *sout = malloc(G * d * sizeof *sout), *sprob[3], *sp = malloc(G * n * sizeof *sp);
        for (size_t g = 0; g < G; g++) sprob[g] = sp + g * n;
        const float *const *last = (const float *const *)(srow + (nb - 1) * G);
        kvs_attention_group_scored(last, G, v, NULL, KVS_DTYPE_F32, d, idx, 9, d, sprob, sout);
        kvs_attention_group(q + (nb - 1) * G * d, G, k, v, d, idx, 9, d, 0.3f, prow, gout, NULL);
        for (size_t g = 0; g < G; g++) assert_memory_equal(sprob[g], prow[g], 9 * sizeof *pr);
        assert_memory_equal(sout, gout, G * d * sizeof *sout);
        kvs_attention_group_scored(last, G, v, NULL, KVS_DTYPE_F32, d, NULL, n, d, sprob, sout);
        kvs_attention_group(q + (nb - 1) * G * d, G, k, v, d, NULL, n, d, 0.3f, prow, gout, NULL);
        for (size_t g = 0; g < G; g++) assert_memory_equal(sprob[g], prow[g], n * sizeof *pr);
        assert_memory_equal(sout, gout, G * d * sizeof *sout);
        free(sout);
        free(sp);
        free(sb);
        free(gout);
        free(k);
        free(v);
        free(q);
        free(pb);
        free(ob);
        free(pr);
        free(orow);
    }
}

/* ---- the replay's per-layer numbers: KVS_SIMD=scalar (the reference) against the default kernels ---- */

/* Replays `trace` into `db` with the KVS_SIMD value given (NULL = unset); @return kvsim's exit status. */
static int replay_with(const char *simd, const char *trace, const char *db, const char *dir) {
    char out[256], err[256];
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(err, sizeof err, "%s/err", dir);
    if (simd) setenv("KVS_SIMD", simd, 1);
    else unsetenv("KVS_SIMD");
    const char *args[] = {"replay", trace, "--db", db, "--policy", "full", "--policy", "window", "--policy", "topk",
                          "--policy", "h2o", "--policy", "snapkv", "--budgets", "8,16", NULL};
    int rc = kvs_test_cli(out, err, args);
    unsetenv("KVS_SIMD");
    return rc;
}

/* `kvsim runs DB --all --csv`: one row per (run, layer), every metric's statistics; the caller frees. */
static char *layer_csv(const char *db, const char *dir) {
    char out[256];
    snprintf(out, sizeof out, "%s/layers.csv", dir);
    const char *args[] = {"runs", db, "--all", "--csv", NULL};
    assert_int_equal(kvs_test_cli(out, NULL, args), 0);
    char *text = NULL;
    size_t n = 0;
    assert_int_equal(kvs_read_file(out, &text, &n), KVS_OK);
    return text;
}

/* The next RFC 4180 field of *s (quotes kept, enough for comparing) into buf; @return 0 at the end of the line. */
static int next_field(const char **s, char *buf, size_t cap) {
    const char *p = *s;
    if (*p == '\n' || *p == 0) return 0;
    size_t n = 0;
    int quoted = 0;
    for (; *p && (quoted || (*p != ',' && *p != '\n')); p++) {
        if (*p == '"') quoted = !quoted;
        if (n + 1 < cap) buf[n++] = *p;
    }
    buf[n] = 0;
    if (*p == ',') p++;
    *s = p;
    return 1;
}

/* Compares the two CSV tables cell by cell: same header and text cells; numbers within rel + abs_tol, except the
 * columns that are not results (run ids, wall times). @return the numbers compared. */
static int csv_close(const char *a, const char *b, double rel, double abs_tol) {
    char names[256][512], fa[512], fb[512];
    int ncol = 0, compared = 0;
    const char *pa = a, *pb = b;
    while (next_field(&pa, fa, sizeof fa)) {
        assert_true(next_field(&pb, fb, sizeof fb));
        assert_string_equal(fa, fb);
        if (ncol < 256) memcpy(names[ncol++], fa, sizeof fa);
    }
    for (;;) {
        if (*pa == '\n') pa++;
        if (*pb == '\n') pb++;
        if (!*pa || !*pb) break;
        for (int c = 0; next_field(&pa, fa, sizeof fa); c++) {
            assert_true(next_field(&pb, fb, sizeof fb));
            const char *name = c < ncol ? names[c] : "";
            if (strstr(name, "run_id") || strstr(name, "wall") || strstr(name, "created_at") || !strcmp(name, "trace"))
                continue;
            char *ea, *eb;
            double x = strtod(fa, &ea), y = strtod(fb, &eb);
            if (fa[0] && !*ea && fb[0] && !*eb) {
                if (!(fabs(x - y) <= rel * fabs(x) + abs_tol))
                    fail_msg("column %s: %.17g (scalar) vs %.17g (vector)", name, x, y);
                compared++;
            } else {
                assert_string_equal(fa, fb);
            }
        }
    }
    assert_true(!*pa && !*pb);
    return compared;
}

static void test_replay_numbers_scalar_vs_vector(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) {
        print_message("KVSIM_BIN is not set (run through `make test`): skipping CLI test\n");
        skip();
    }
    if (kvs_math_isa_active() == KVS_ISA_SCALAR && !kvs_math_kernels_for(KVS_ISA_AVX2)) {
        print_message("no vector variant on this CPU: scalar vs vector replay skipped\n");
        skip();
    }
    char dir[] = "/tmp/kvs_simd_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char trace[128], db1[128], db2[128], cmd[200];
    snprintf(trace, sizeof trace, "%s/t.kvt", dir);
    snprintf(db1, sizeof db1, "%s/scalar.db", dir);
    snprintf(db2, sizeof db2, "%s/vector.db", dir);
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = 160;
    o.prompt_len = 64;
    o.n_layers = 2;
    kvs_gen_trace *g = NULL;
    assert_int_equal(kvs_gen_trace_create(&o, &g), KVS_OK);
    assert_int_equal(kvs_gen_trace_write(g, trace), KVS_OK);
    kvs_gen_trace_free(g);
    assert_int_equal(replay_with("scalar", trace, db1, dir), 0);
    char *a = layer_csv(db1, dir);
    assert_int_equal(replay_with(NULL, trace, db2, dir), 0);
    char *b = layer_csv(db2, dir);
    /* Stated tolerance of the replay's numbers between kernels: 1e-4 relative + 1e-6 absolute (the metrics are
     * ratios of sums of ~1e2..1e4 fp32 terms computed in different orders; a top-k or recall count can move by
     * one only where two probabilities tie within that rounding, which this data does not have). */
    int n = csv_close(a, b, 1e-4, 1e-6);
    print_message("%d numbers compared (KVS_SIMD=scalar vs %s)\n", n, kvs_math_isa_name(kvs_math_isa_active()));
    assert_true(n > 500);
    /* every other vector table, AVX2's arithmetic in other tiles: the default's numbers exactly */
    static const kvs_isa wide[] = {KVS_ISA_AVX2, KVS_ISA_AVX2X32, KVS_ISA_AVX512};
    for (size_t w = 0; w < sizeof wide / sizeof wide[0]; w++) {
        if (wide[w] == kvs_math_isa_active() || !kvs_math_kernels_for(wide[w])) continue;
        char db4[128];
        snprintf(db4, sizeof db4, "%s/%s.db", dir, kvs_math_isa_name(wide[w]));
        assert_int_equal(replay_with(kvs_math_isa_name(wide[w]), trace, db4, dir), 0);
        char *c = layer_csv(db4, dir);
        print_message("%d numbers equal (KVS_SIMD=%s vs %s)\n", csv_close(b, c, 0, 0), kvs_math_isa_name(wide[w]),
                      kvs_math_isa_name(kvs_math_isa_active()));
        free(c);
    }
    free(a);
    free(b);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* list_plain (the replay's check of a selection list): every variant equals the scalar table and a naive check,
 * on lists of 1..40 entries (the 8-wide steps and their tails): ascending, a repeat or a descent at each place, a
 * first entry below 0 or a last past p, and one row pointer set (K or V) at each place. */
static int naive_plain(const int32_t *idx, const void *const *rk, const void *const *rv, size_t n, int64_t p) {
    for (size_t j = 0; j < n; j++) {
        if (rk[j] || rv[j] || idx[j] < 0 || idx[j] > p) return 0;
        if (j > 0 && idx[j] <= idx[j - 1]) return 0;
    }
    return 1;
}

static void test_list_plain_matches_scalar(void **state) {
    (void)state;
    const kvs_math_kernels *v[KVS_ISA_COUNT], *sc = kvs_math_kernels_for(KVS_ISA_SCALAR);
    int nv = variants(v);
    enum { NMAX = 40 };
    int32_t idx[NMAX];
    const void *rk[NMAX], *rv[NMAX];
    static const int marker = 1;
    int checked = 0;
    for (size_t n = 1; n <= NMAX; n++)
        for (int fault = -1; fault < 6 * (int)n; fault++) {
            for (size_t j = 0; j < n; j++) idx[j] = (int32_t)(3 * j + 1), rk[j] = rv[j] = NULL;
            int64_t p = (int64_t)idx[n - 1];
            size_t at = fault >= 0 ? (size_t)fault % n : 0;
            switch (fault < 0 ? -1 : fault / (int)n) {
            case 0: if (at > 0) idx[at] = idx[at - 1]; break;     /* a repeat */
            case 1: if (at > 0) idx[at] = idx[at - 1] - 1; break; /* a descent */
            case 2: idx[0] = -1 - (int32_t)at; break;              /* below 0 */
            case 3: p = idx[n - 1] - 1 - (int64_t)at; break;        /* past p */
            case 4: rk[at] = &marker; break;
            case 5: rv[at] = &marker; break;
            default: break;
            }
            int want = naive_plain(idx, rk, rv, n, p);
            assert_int_equal(sc->list_plain(idx, rk, rv, n, p), want);
            for (int k = 0; k < nv; k++) assert_int_equal(v[k]->list_plain(idx, rk, rv, n, p), want);
            checked += !want;
        }
    assert_true(checked > 1000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dot_and_axpy_match_fp64),
        cmocka_unit_test(test_scores_match_reference),
        cmocka_unit_test(test_output_matches_reference),
        cmocka_unit_test(test_exp_accuracy_against_libm),
        cmocka_unit_test(test_softmax_and_lse_match_fp64),
        cmocka_unit_test(test_softmax_avx2_equals_its_exp),
        cmocka_unit_test(test_first_above_matches_scalar),
        cmocka_unit_test(test_list_plain_matches_scalar),
        cmocka_unit_test(test_dots_loose_within_the_bound),
        cmocka_unit_test(test_topk_matches_sort),
        cmocka_unit_test(test_blocked_causal_attention_equals_rows),
        cmocka_unit_test(test_desc_keys_match_scalar),
        cmocka_unit_test(test_avx2x32_equals_avx2_bit_for_bit),
        cmocka_unit_test(test_avx512_equals_avx2_bit_for_bit),
        cmocka_unit_test(test_replay_numbers_scalar_vs_vector),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
