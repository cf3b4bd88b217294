/* test_kv16.c — K/V kept in the trace's 16-bit form (issue 14; common/kvs_math_simd.h scores16 / output_add16,
 * common/kvs_math.h kvs_attention_group16 / kvs_attention_causal_block16, the replay engine's 16-bit history):
 *  - every kernel table this CPU has (the scalar reference included), fp16 and bf16: the 16-bit entries equal the
 *    same table's fp32 entries on the rows' exact fp32 conversion, bit for bit (strides, index lists, head_dims
 *    with tails, more rows than one conversion tile, special values);
 *  - the same against an independent fp64 reference whose half/bfloat16 decoding is written here (ldexp), within
 *    the fp32 dot-product bound, so the vector variants are checked against the reference on every ISA;
 *  - the attention functions against their fp32 counterparts, bit for bit;
 *  - the replay's per-layer numbers with the 16-bit history (KVS_KV16=1) equal to the fp32 history's
 *    (KVS_KV16=0), text for text, on an fp16 and a bf16 trace, through the CLI.
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

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static const kvs_dtype dtypes[] = {KVS_DTYPE_F16, KVS_DTYPE_BF16};

/* Independent decoding of one 16-bit element (not common/kvs.c's): sign, exponent, mantissa by ldexp. Finite
 * values only (the fp64 check skips the rows with special values). */
static double half_value(uint16_t h, kvs_dtype t) {
    if (t == KVS_DTYPE_BF16) {
        int e = (h >> 7) & 0xff, m = h & 0x7f;
        double v = e ? ldexp(1.0 + m / 128.0, e - 127) : ldexp(m / 128.0, -126);
        return (h & 0x8000) ? -v : v;
    }
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
    return (h & 0x8000) ? -v : v;
}

/* n random 16-bit elements of dtype t (amplitude amp) in h, and their exact fp32 conversion in f. Every 97th
 * element is a special value: +-0, subnormals, the largest finite fp16 (bf16: 65280; its largest would overflow the fp32 sums) (when `specials`). */
static void fill16(uint16_t *h, float *f, size_t n, kvs_dtype t, float amp, int specials) {
    static const uint16_t spec_f16[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x7bff};
    static const uint16_t spec_bf16[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x477f};
    for (size_t i = 0; i < n; i++) {
        float x = amp * frand();
        h[i] = t == KVS_DTYPE_BF16 ? kvs_f32_to_bf16(x) : kvs_f32_to_f16(x);
        if (specials && i % 97 == 13) h[i] = (t == KVS_DTYPE_BF16 ? spec_bf16 : spec_f16)[(i / 97) % 6];
    }
    kvs_decode(t, h, n, f); /* little-endian bytes = the uint16_t values on x86 */
}

/* The tables to check: every variant this CPU has and the scalar reference (last). */
static int tables(const kvs_math_kernels **out) {
    int n = 0;
    for (int i = 1; i < KVS_ISA_COUNT; i++) {
        const kvs_math_kernels *k = kvs_math_kernels_for((kvs_isa)i);
        if (k) out[n++] = k;
        else print_message("variant %s: not available on this CPU, skipped\n", kvs_math_isa_name((kvs_isa)i));
    }
    out[n++] = kvs_math_kernels_for(KVS_ISA_SCALAR);
    return n;
}

#define F32_EPS 1.1920929e-7
static const size_t dims[] = {1, 3, 8, 13, 64, 67, 128, 1024};

static void test_scores16_equal_fp32_and_fp64(void **state) {
    (void)state;
    const kvs_math_kernels *v[KVS_ISA_COUNT];
    int nv = tables(v);
    enum { ROWS = 150, MAXR = 9 };
    const size_t ns[] = {1, 4, 7, 33, 70, 150};
    for (int k = 0; k < nv; k++)
        for (size_t ti = 0; ti < 2; ti++)
            for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
                size_t d = dims[di], stride = d + 3;
                kvs_dtype t = dtypes[ti];
                uint16_t *k16 = malloc(ROWS * stride * sizeof *k16);
                float *k32 = malloc(ROWS * stride * sizeof *k32), *q = malloc(MAXR * d * sizeof *q);
                float *got = malloc(MAXR * (ROWS + 2) * sizeof *got), *ref = malloc(MAXR * (ROWS + 2) * sizeof *ref);
                fill16(k16, k32, ROWS * stride, t, 2.0f, 1);
                for (size_t i = 0; i < MAXR * d; i++) q[i] = frand();
                int32_t idx[ROWS];
                for (int j = 0; j < ROWS; j++) idx[j] = (int32_t)((j * 37 + 11) % ROWS);
                for (size_t nr = 1; nr <= MAXR; nr += 4)
                    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                        for (int use_idx = 0; use_idx < 2; use_idx++) {
                            size_t n = ns[ni];
                            float *gr[MAXR], *rr[MAXR];
                            for (size_t r = 0; r < nr; r++) gr[r] = got + r * (ROWS + 2), rr[r] = ref + r * (ROWS + 2);
                            const int32_t *ix = use_idx ? idx : NULL;
                            v[k]->scores16(q, nr, k16, t, stride, ix, n, d, 0.125f, gr, 2);
                            v[k]->scores(q, nr, k32, stride, ix, n, d, 0.125f, rr, 2);
                            for (size_t r = 0; r < nr; r++) {
                                assert_memory_equal(gr[r] + 2, rr[r] + 2, n * sizeof(float));
                                for (size_t j = 0; j < n; j++) {
                                    const uint16_t *kr = k16 + (ix ? (size_t)ix[j] : j) * stride;
                                    double s = 0, mag = 0;
                                    for (size_t i = 0; i < d; i++) {
                                        double x = (double)q[r * d + i] * half_value(kr[i], t);
                                        s += x;
                                        mag += fabs(x);
                                    }
                                    double tol = (double)(d + 2) * F32_EPS * 0.125 * mag + 1e-30;
                                    if (!(fabs(gr[r][2 + j] - 0.125 * s) <= tol))
                                        fail_msg("%s %s d %zu row %zu key %zu: %.9g vs fp64 %.9g", v[k]->name,
                                                 kvs_dtype_name(t), d, r, j, gr[r][2 + j], 0.125 * s);
                                }
                            }
                        }
                free(k16);
                free(k32);
                free(q);
                free(got);
                free(ref);
            }
}

static void test_output_add16_equal_fp32_and_fp64(void **state) {
    (void)state;
    const kvs_math_kernels *v[KVS_ISA_COUNT];
    int nv = tables(v);
    enum { ROWS = 300, MAXR = 6 };
    const size_t ns[] = {1, 5, 64, 65, 300};
    for (int k = 0; k < nv; k++)
        for (size_t ti = 0; ti < 2; ti++)
            for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
                size_t d = dims[di], stride = d + 1;
                kvs_dtype t = dtypes[ti];
                uint16_t *v16 = malloc(ROWS * stride * sizeof *v16);
                float *v32 = malloc(ROWS * stride * sizeof *v32), *p = malloc(MAXR * (ROWS + 1) * sizeof *p);
                float *got = malloc(MAXR * d * sizeof *got), *ref = malloc(MAXR * d * sizeof *ref);
                fill16(v16, v32, ROWS * stride, t, 1.0f, 1);
                for (size_t i = 0; i < MAXR * (ROWS + 1); i++) p[i] = 0.5f * (frand() + 1.0f);
                int32_t idx[ROWS];
                for (int j = 0; j < ROWS; j++) idx[j] = (int32_t)((j * 11 + 5) % ROWS);
                for (size_t nr = 1; nr <= MAXR; nr += 5)
                    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                        for (int use_idx = 0; use_idx < 2; use_idx++) {
                            size_t n = ns[ni];
                            const int32_t *ix = use_idx ? idx : NULL;
                            const float *pr[MAXR];
                            float *go[MAXR], *ro[MAXR];
                            for (size_t r = 0; r < nr; r++) {
                                pr[r] = p + r * (ROWS + 1);
                                go[r] = got + r * d;
                                ro[r] = ref + r * d;
                                for (size_t i = 0; i < d; i++) go[r][i] = ro[r][i] = 0.25f; /* they add */
                            }
                            v[k]->output_add16(pr, nr, 1, v16, t, stride, ix, n, d, go);
                            v[k]->output_add(pr, nr, 1, v32, stride, ix, n, d, ro);
                            assert_memory_equal(got, ref, nr * d * sizeof(float));
                            for (size_t r = 0; r < nr; r++)
                                for (size_t i = 0; i < d; i++) {
                                    double s = 0.25, mag = 0.25;
                                    for (size_t j = 0; j < n; j++) {
                                        double x = (double)pr[r][1 + j] *
                                                   half_value(v16[(ix ? (size_t)ix[j] : j) * stride + i], t);
                                        s += x;
                                        mag += fabs(x);
                                    }
                                    if (!(fabs(go[r][i] - s) <= (double)(n + 2) * F32_EPS * mag))
                                        fail_msg("%s %s d %zu n %zu: %.9g vs fp64 %.9g", v[k]->name, kvs_dtype_name(t),
                                                 d, n, go[r][i], s);
                                }
                        }
                free(v16);
                free(v32);
                free(p);
                free(got);
                free(ref);
            }
}

/* NaN and infinities in the rows: the 16-bit entries give the fp32 entries' bits (the conversion keeps them). */
static void test_kv16_special_values_as_fp32(void **state) {
    (void)state;
    const kvs_math_kernels *v[KVS_ISA_COUNT];
    int nv = tables(v);
    enum { D = 24, N = 8 };
    for (int k = 0; k < nv; k++)
        for (size_t ti = 0; ti < 2; ti++) {
            kvs_dtype t = dtypes[ti];
            uint16_t h[N * D];
            float f[N * D], q[D], s16[N], s32[N], o16[D] = {0}, o32[D] = {0}, p[N];
            fill16(h, f, N * D, t, 1.0f, 0);
            /* row 1: +inf, row 2: -inf, row 3: a NaN, in lanes and in the d % 8 tail */
            uint16_t inf = t == KVS_DTYPE_BF16 ? 0x7f80 : 0x7c00, nan = t == KVS_DTYPE_BF16 ? 0x7fc1 : 0x7e01;
            h[1 * D + 2] = inf;
            h[2 * D + 20] = (uint16_t)(inf | 0x8000);
            h[3 * D + 5] = nan;
            kvs_decode(t, h, N * D, f);
            for (int i = 0; i < D; i++) q[i] = frand();
            for (int j = 0; j < N; j++) p[j] = 0.1f * (float)(j + 1);
            float *r16 = s16, *r32 = s32, *or16 = o16, *or32 = o32;
            const float *pp = p;
            v[k]->scores16(q, 1, h, t, D, NULL, N, D, 1.0f, &r16, 0);
            v[k]->scores(q, 1, f, D, NULL, N, D, 1.0f, &r32, 0);
            assert_memory_equal(s16, s32, sizeof s16);
            assert_true(isnan(s16[3]));
            v[k]->output_add16(&pp, 1, 0, h, t, D, NULL, N, D, &or16);
            v[k]->output_add(&pp, 1, 0, f, D, NULL, N, D, &or32);
            assert_memory_equal(o16, o32, sizeof o16);
        }
}

/* kvs_attention_group16 / kvs_attention_causal_block16 against the fp32 functions, bit for bit (active table). */
static void test_attention16_equals_fp32(void **state) {
    (void)state;
    const size_t G = 4, nb = 6, p0 = 700, n = p0 + nb;
    const size_t ds[] = {13, 64, 128};
    for (size_t ti = 0; ti < 2; ti++)
        for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
            size_t d = ds[di];
            kvs_dtype t = dtypes[ti];
            uint16_t *k16 = malloc(n * d * 2), *v16 = malloc(n * d * 2);
            float *k = malloc(n * d * sizeof *k), *v = malloc(n * d * sizeof *v), *q = malloc(nb * G * d * sizeof *q);
            float *pa = malloc(nb * G * n * sizeof *pa), *pb = malloc(nb * G * n * sizeof *pb);
            float *oa = malloc(nb * G * d * sizeof *oa), *ob = malloc(nb * G * d * sizeof *ob);
            fill16(k16, k, n * d, t, 1.0f, 0);
            fill16(v16, v, n * d, t, 1.0f, 0);
            for (size_t i = 0; i < nb * G * d; i++) q[i] = 3.0f * frand();
            float *ra[24], *rb[24], *qa[24], *qb[24];
            double la[24], lb[24];
            for (size_t r = 0; r < nb * G; r++) {
                ra[r] = pa + r * n, rb[r] = pb + r * n;
                qa[r] = oa + r * d, qb[r] = ob + r * d;
            }
            kvs_attention_causal_block16(q, nb, G, k16, v16, t, d, p0, 0.2f, ra, qa, la);
            kvs_attention_causal_block(q, nb, G, k, v, d, p0, 0.2f, rb, qb, lb);
            for (size_t r = 0; r < nb * G; r++) {
                assert_memory_equal(ra[r], rb[r], (p0 + 1 + r / G) * sizeof(float));
                assert_memory_equal(qa[r], qb[r], d * sizeof(float));
                assert_memory_equal(&la[r], &lb[r], sizeof(double));
            }
            int32_t idx[300];
            for (int j = 0; j < 300; j++) idx[j] = (int32_t)(j * 2 + (j % 3));
            kvs_attention_group16(q, G, k16, v16, t, d, idx, 300, d, 0.2f, ra, oa, la);
            kvs_attention_group(q, G, k, v, d, idx, 300, d, 0.2f, rb, ob, lb);
            for (size_t r = 0; r < G; r++) assert_memory_equal(ra[r], rb[r], 300 * sizeof(float));
            assert_memory_equal(oa, ob, G * d * sizeof(float));
            assert_memory_equal(la, lb, G * sizeof(double));
            free(k16);
            free(v16);
            free(k);
            free(v);
            free(q);
            free(pa);
            free(pb);
            free(oa);
            free(ob);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scores16_equal_fp32_and_fp64),
        cmocka_unit_test(test_output_add16_equal_fp32_and_fp64),
        cmocka_unit_test(test_kv16_special_values_as_fp32),
        cmocka_unit_test(test_attention16_equals_fp32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
