/* test_rope.c — common/kvs_rope.c: RoPE, its inverse, the position-averaged rotation R̄ and the Jacobi
 * eigen-solver (../shared/POLICY_SPEC_2.md §1.1 golden R0, §1.2 golden R1), and the round trip against the capture
 * itself: the real models' layer-0 keys and queries (post-RoPE, as the CPU forward pass records them) inverted with
 * the trace header's theta/layout are the same vector for every occurrence of a token id (§1.1 validation test) on
 * the adjacent layout (llama2.c stories260K), the halves layout (HF tinystories-656K) and Llama-3 scaling (the
 * llama3_tiny fixture), and fail by O(1) with the wrong layout or without the scaling.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_rng.h"
#include "../common/kvs_rope.h"
#include "../gpu_capture/model.h"
#include "util/testenv.h"

static void assert_close(double got, double want, double rel) {
    double tol = rel * fmax(1.0, fabs(want));
    if (fabs(got - want) > tol) fail_msg("got %.9g want %.9g (tol %.3g)", got, want, tol);
}

/* §1.1 golden R0: x = (0.5, -1, 2, 0.25), d = 4, theta_b = 10000, so theta = (1, 0.01). */
static void test_golden_r0_forward_and_inverse(void **state) {
    (void)state;
    const double x[4] = {0.5, -1.0, 2.0, 0.25};
    const double want[2][2][4] = {
        {{-0.3538762, 1.060553, 1.991601, 0.3098785}, {-0.0752062, -1.115502, 0.8702369, 1.818018}},
        {{-0.7772363, -1.007049, -1.909425, 0.219892}, {1.443891, -0.7506701, 1.471455, -0.7063954}}};
    const int64_t pos[2] = {3, 100};
    const double freq[2] = {1.0, 0.01}; /* exact, as the spec's numpy computation */
    double f2[2];
    kvs_rope_freqs(10000.0, 4, NULL, f2);
    assert_close(f2[0], 1.0, 1e-12);
    assert_close(f2[1], 0.01, 1e-7); /* capture rounds the frequencies to fp32 */
    for (int layout = 0; layout < 2; layout++)
        for (int pi = 0; pi < 2; pi++) {
            double y[4], back[4];
            memcpy(y, x, sizeof y);
            kvs_rope_apply_f64(y, 4, layout, pos[pi], freq);
            for (int i = 0; i < 4; i++) assert_close(y[i], want[layout][pi][i], 2e-6);
            kvs_rope_invert_f64(y, back, 4, layout, pos[pi], freq);
            for (int i = 0; i < 4; i++) assert_true(fabs(back[i] - x[i]) <= 1e-12);
        }
}

/* §1.2 golden R1: theta = (1, 0.01), a = 6, T = 4; closed form against the T-term loop. */
static void test_golden_r1_rope_average(void **state) {
    (void)state;
    const double freq[2] = {1.0, 0.01};
    double c[2], s[2];
    kvs_rope_avg(4, 6, 4, freq, c, s);
    assert_close(c[0], 0.1643606, 1e-6);
    assert_close(c[1], 0.9971265, 1e-6);
    assert_close(s[0], 0.4447620, 1e-6);
    assert_close(s[1], 0.07492502, 1e-6);
    /* loop form at a longer horizon and a large position */
    const double f3[3] = {0.7, 0.013, 1e-5};
    double c3[3], s3[3];
    kvs_rope_avg(6, 100000, 512, f3, c3, s3);
    for (int i = 0; i < 3; i++) {
        double lc = 0, ls = 0;
        for (int64_t t = 100000; t < 100000 + 512; t++) lc += cos((double)t * f3[i]), ls += sin((double)t * f3[i]);
        assert_true(fabs(c3[i] - lc / 512) < 1e-9);
        assert_true(fabs(s3[i] - ls / 512) < 1e-9);
    }
}

/* fp32 round trip as capture rotates (fp32 cos/sin, fp32 arithmetic) on both layouts, with and without Llama-3
 * scaling, positions up to 10^5: every coordinate back to within 2 ulp of the vector's largest coordinate. */
static void test_fp32_round_trip_within_ulps(void **state) {
    (void)state;
    kvs_rng r;
    kvs_rng_seed(&r, 11, 3);
    const kvs_rope_scaling l3 = {.factor = 8, .low = 1, .high = 4, .orig = 8192};
    for (int layout = 0; layout < 2; layout++)
        for (int sc = 0; sc < 2; sc++) {
            double freq[64];
            kvs_rope_freqs(500000.0, 128, sc ? &l3 : NULL, freq);
            for (int trial = 0; trial < 200; trial++) {
                float x[128], y[128], back[128];
                float mx = 0;
                for (int i = 0; i < 128; i++) {
                    x[i] = (float)(4.0 * kvs_rng_open01(&r) - 2.0);
                    mx = fmaxf(mx, fabsf(x[i]));
                }
                int64_t p = (int64_t)(kvs_rng_open01(&r) * 100000.0);
                memcpy(y, x, sizeof y);
                kvs_rope_apply(y, 128, layout, p, freq);
                kvs_rope_invert(y, back, 128, layout, p, freq);
                for (int i = 0; i < 128; i++)
                    if (fabsf(back[i] - x[i]) > 2.0f * mx * 0x1p-23f)
                        fail_msg("layout %d scaling %d pos %lld coord %d: %.9g vs %.9g", layout, sc, (long long)p,
                                 i, (double)back[i], (double)x[i]);
            }
        }
}

/* The §1.1 validation test against the CPU forward pass itself. Feeds `n` tokens that repeat (ids tok[i]) and
 * returns the worst relative disagreement, over repeated ids, of the inverse-rotated layer-0 keys (every KV head)
 * and queries (every query head) under (layout, scaling). */
static double layer0_disagreement(const char *path, int layout_override, int drop_scaling) {
    kvs_model *m = NULL;
    kvs_model_state *s = NULL;
    if (kvs_model_load(path, &m) != KVS_OK) fail_msg("%s: %s", path, kvs_last_error());
    const kvs_model_info *info = kvs_model_info_get(m);
    const kvs_model_config *c = &info->config;
    int d = c->head_dim, H = c->n_heads, Hkv = c->n_kv_heads, n = 40;
    assert_int_equal(kvs_model_state_create(m, n, NULL, &s), KVS_OK);
    kvs_rope_scaling sc = {.factor = info->rope_factor, .low = info->rope_low_freq_factor,
                           .high = info->rope_high_freq_factor, .orig = info->rope_original_max_pos};
    double freq[KVS_TRACE_MAX_HEAD_DIM / 2];
    kvs_rope_freqs(c->rope_theta, d, info->rope_llama3 && !drop_scaling ? &sc : NULL, freq);
    int layout = layout_override >= 0 ? layout_override : c->rope_layout;
    int nv = H + Hkv;
    float *pre = malloc((size_t)n * (size_t)nv * (size_t)d * sizeof *pre);
    int32_t tok[40];
    assert_non_null(pre);
    for (int p = 0; p < n; p++) {
        tok[p] = 3 + (p * 7) % 5; /* five ids, each at 8 positions */
        const float *logits;
        assert_int_equal(kvs_model_forward(s, tok[p], p, &logits), KVS_OK);
        kvs_layer_record rec;
        assert_int_equal(kvs_model_state_layer(s, 0, &rec), KVS_OK);
        for (int h = 0; h < H; h++)
            kvs_rope_invert(rec.q + (size_t)h * d, pre + ((size_t)p * nv + h) * d, d, layout, p, freq);
        for (int h = 0; h < Hkv; h++)
            kvs_rope_invert(rec.k + (size_t)h * d, pre + ((size_t)p * nv + H + h) * d, d, layout, p, freq);
    }
    double worst = 0;
    for (int p = 0; p < n; p++)
        for (int r = 0; r < p; r++) {
            if (tok[r] != tok[p]) continue;
            for (int h = 0; h < nv; h++) {
                const float *a = pre + ((size_t)p * nv + h) * d, *b = pre + ((size_t)r * nv + h) * d;
                double num = 0, den = 0;
                for (int i = 0; i < d; i++) num += (a[i] - b[i]) * (double)(a[i] - b[i]), den += (double)b[i] * b[i];
                if (den > 0) worst = fmax(worst, sqrt(num / den));
            }
        }
    free(pre);
    kvs_model_state_free(s);
    kvs_model_free(m);
    return worst;
}

static void model_path(const char *rel, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", kvs_test_root(), rel);
}

static void test_capture_round_trip_adjacent_llama2c(void **state) {
    (void)state;
    char p[1024];
    model_path("../shared/models/stories260K.bin", p, sizeof p);
    if (!kvs_test_exists(p)) skip();
    double ok = layer0_disagreement(p, -1, 0), bad = layer0_disagreement(p, 1, 0);
    assert_true(ok <= 1e-5);
    assert_true(bad > 0.05); /* the wrong layout breaks it by O(1) */
}

static void test_capture_round_trip_halves_hf(void **state) {
    (void)state;
    char p[1024];
    model_path("../shared/models/tinystories-656K", p, sizeof p);
    if (!kvs_test_exists(p)) skip();
    double ok = layer0_disagreement(p, -1, 0), bad = layer0_disagreement(p, 0, 0);
    assert_true(ok <= 1e-5);
    assert_true(bad > 0.05);
}

static void test_capture_round_trip_llama3_scaling(void **state) {
    (void)state;
    char p[1024];
    model_path("tests/fixtures/llama3_tiny", p, sizeof p);
    double ok = layer0_disagreement(p, -1, 0), unscaled = layer0_disagreement(p, -1, 1);
    assert_true(ok <= 1e-5);
    assert_true(unscaled > 0.05); /* a missing llama3 scaling is caught */
}

/* Jacobi: a known spectrum, descending order, orthonormal vectors, A V = V diag(w), sign rule. */
static void test_sym_eig(void **state) {
    (void)state;
    enum { N = 6 };
    kvs_rng r;
    kvs_rng_seed(&r, 5, 9);
    double B[N * N], A[N * N], A0[N * N], w[N], V[N * N];
    for (int i = 0; i < N * N; i++) B[i] = kvs_rng_open01(&r) - 0.5;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            double x = 0;
            for (int k = 0; k < N; k++) x += B[k * N + i] * B[k * N + j];
            A[i * N + j] = A0[i * N + j] = x;
        }
    assert_int_equal(kvs_sym_eig(A, N, w, V), KVS_OK);
    for (int c = 0; c < N; c++) {
        if (c) assert_true(w[c] <= w[c - 1]);
        int big = 0;
        for (int i = 0; i < N; i++) {
            double av = 0;
            for (int k = 0; k < N; k++) av += A0[i * N + k] * V[k * N + c];
            assert_true(fabs(av - w[c] * V[i * N + c]) < 1e-10);
            if (fabs(V[i * N + c]) > fabs(V[big * N + c])) big = i;
        }
        assert_true(V[big * N + c] > 0);
        for (int c2 = 0; c2 < N; c2++) {
            double dot = 0;
            for (int k = 0; k < N; k++) dot += V[k * N + c] * V[k * N + c2];
            assert_true(fabs(dot - (c == c2)) < 1e-12);
        }
    }
}

/* A larger rank-deficient Gram matrix (the shape ShadowKV factors: more columns than the rank) converges and
 * reconstructs: A V = V diag(w) to 1e-9 of |A|, and the eigenvalues beyond the rank vanish. */
static void test_sym_eig_rank_deficient(void **state) {
    (void)state;
    enum { N = 48, R = 20 };
    kvs_rng r;
    kvs_rng_seed(&r, 8, 1);
    double *B = malloc(sizeof(double) * R * N), *A = malloc(sizeof(double) * N * N), *A0 = malloc(sizeof(double) * N * N),
           *V = malloc(sizeof(double) * N * N), w[N];
    assert_true(B && A && A0 && V);
    for (int i = 0; i < R * N; i++) B[i] = kvs_rng_open01(&r) - 0.5;
    double fro = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            double x = 0;
            for (int k = 0; k < R; k++) x += B[k * N + i] * B[k * N + j];
            A[i * N + j] = A0[i * N + j] = x;
            fro += x * x;
        }
    fro = sqrt(fro);
    assert_int_equal(kvs_sym_eig(A, N, w, V), KVS_OK);
    for (int c = 0; c < N; c++) {
        if (c >= R) assert_true(fabs(w[c]) < 1e-12 * fro);
        for (int i = 0; i < N; i++) {
            double av = 0;
            for (int k = 0; k < N; k++) av += A0[i * N + k] * V[k * N + c];
            assert_true(fabs(av - w[c] * V[i * N + c]) < 1e-9 * fro);
        }
    }
    free(B), free(A), free(A0), free(V);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_r0_forward_and_inverse),
        cmocka_unit_test(test_golden_r1_rope_average),
        cmocka_unit_test(test_fp32_round_trip_within_ulps),
        cmocka_unit_test(test_capture_round_trip_adjacent_llama2c),
        cmocka_unit_test(test_capture_round_trip_halves_hf),
        cmocka_unit_test(test_capture_round_trip_llama3_scaling),
        cmocka_unit_test(test_sym_eig),
        cmocka_unit_test(test_sym_eig_rank_deficient),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
