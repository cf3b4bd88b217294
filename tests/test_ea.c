/* test_ea.c — policies/ea.c, Expected Attention (../shared/POLICY_SPEC_2.md §2.1): the golden example G-EA (scores
 * with eps 0 and 0.01, the kept set at B_p = 4 through the policy itself, and the kept set without covariance and
 * value norm), G-ADAKV (the layer-wide allocation and its tie rule), the closed-form expectation
 * E[exp(s q.k)] = exp(s mu.k + s^2/2 k^T Sigma k) against Monte-Carlo (claim EA2), the Llama-3 refusal, and that a
 * budget covering the prompt keeps every position (lossless).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../common/kvs_rng.h"
#include "../common/kvs_rope.h"
#include "../policies/ea_internal.h"
#include "../policies/registry.h"

static void assert_rel(double got, double want) {
    double tol = 1e-5 * fmax(fabs(want), 1e-2);
    if (fabs(got - want) > tol) fail_msg("got %.9g want %.9g", got, want);
}

/* G-EA inputs (post-RoPE), d = 4, layout 1, theta_b = 10000, P = 6, G = 2 */
static const float gq[6][2][4] = {
    {{0, 0.3f, -0.3f, -0.9f}, {-0.5f, -1, 0.1f, 1.3f}},      {{-0.5f, -0.6f, 0.5f, 0.4f}, {0.1f, -0.9f, 0, 0.7f}},
    {{-1.3f, -0.5f, -1.9f, -1.3f}, {-1.8f, -0.2f, -1.3f, 0.3f}}, {{0.2f, -0.2f, -2.5f, -0.5f}, {0, 0.1f, -1.5f, -0.5f}},
    {{-1, -0.8f, 1.1f, -0.8f}, {0, 0.9f, -0.6f, -0.1f}},      {{0.1f, 0.1f, -1.2f, 0.1f}, {1.4f, -1.5f, 0.9f, 0.1f}}};
static const float gk[6][4] = {{-0.6f, 2, 0.8f, -1.2f}, {0.1f, 0.6f, -0.2f, 0.7f}, {-0.1f, 0.7f, 1.4f, -0.7f},
                               {0.2f, -0.5f, 0.1f, -1.2f}, {-0.6f, -0.2f, 0.9f, 1.1f}, {-1.3f, -0.8f, 0.6f, -2}};
static const float gv[6][4] = {{-0.5f, -0.1f, 1.3f, 0.7f}, {-0.3f, -0.4f, -0.3f, 1.5f}, {-0.4f, -0.3f, 0.4f, -0.1f},
                               {-0.2f, -1.1f, 0, -0.4f},   {1.2f, 0.7f, 0, 0.7f},         {-0.3f, 1.1f, 0, 0.6f}};

static void gea_scores(double eps, int cov, int vnorm, double *score) {
    kvs_ea_params p = {.n_future = 4, .n_sink = 2, .use_cov = cov, .use_vnorm = vnorm, .eps = eps};
    double freq[2];
    kvs_rope_freqs(10000.0, 4, NULL, freq);
    int32_t cand[6] = {0, 1, 2, 3, 4, 5};
    assert_int_equal(kvs_ea_scores(&p, freq, 1, 0.5, 2, 4, &gq[0][0][0], 0, 6, 6, &gk[0][0], &gv[0][0], cand, 6, score),
                     KVS_OK);
}

static void test_golden_gea_scores(void **state) {
    (void)state;
    double s[6];
    gea_scores(0, 1, 1, s);
    const double w0[4] = {0.119613, 0.2378004, 0.2747565, 0.5650307};
    for (int j = 0; j < 4; j++) assert_rel(s[2 + j], w0[j]);
    assert_rel(s[0], 0.5650307 + 1); /* sinks: max + 1 */
    assert_rel(s[1], 0.5650307 + 1);
    gea_scores(0.01, 1, 1, s);
    const double w1[4] = {0.1260938, 0.2496747, 0.2903128, 0.5779148};
    for (int j = 0; j < 4; j++) assert_rel(s[2 + j], w1[j]);
    /* without covariance and value norm: the ranking 5, 3, 2, 4 */
    gea_scores(0, 0, 0, s);
    assert_true(s[5] > s[3] && s[3] > s[2] && s[2] > s[4]);
    /* the group-mean attention (no |v|): a = (0.1845669, 0.200264, 0.1766202, 0.4385489) */
    gea_scores(0, 1, 0, s);
    const double wa[4] = {0.1845669, 0.200264, 0.1766202, 0.4385489};
    for (int j = 0; j < 4; j++) assert_rel(s[2 + j], wa[j]);
}

/* The policy on G-EA (uniform allocation, eps 0, B_p = 4): kept {0, 1, 4, 5}; without covariance and |v|:
 * {0, 1, 3, 5}. */
static void run_policy(const char *spec, const int32_t *want) {
    const struct kvs_policy_ops *ops = kvs_policy_find("ea");
    assert_non_null(ops);
    kvs_policy_config cfg;
    if (kvs_policy_parse(spec, &cfg) != KVS_OK) fail_msg("%s: %s", spec, kvs_last_error());
    kvs_policy_model m = {.n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .group = 2, .head_dim = 4, .scale = 0.5f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = 6, .prompt_len = 6, .rope_theta = 10000.0f,
                          .rope_layout = 1};
    assert_int_equal(kvs_policy_validate(&cfg, &m, 4), KVS_OK);
    kvs_policy_view view = {.n = 6, .group = 2, .head_dim = 4, .scale = 0.5f, .k = &gk[0][0], .v = &gv[0][0],
                            .q = &gq[0][0][0], .q_first = 0, .n_q = 6, .turn_begin = 0, .prompt_end = 6,
                            .block_begin = 0, .last_block = 1};
    kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = 4, .budget_nominal = 4};
    void *st = NULL;
    assert_int_equal(ops->create(&init, &st), KVS_OK);
    assert_int_equal(ops->prefill(st, &view), KVS_OK);
    int32_t out[8];
    assert_int_equal(ops->stored(st, 0, out), 4);
    for (int i = 0; i < 4; i++) assert_int_equal(out[i], want[i]);
    ops->free(st);
}

static void test_golden_gea_kept_sets(void **state) {
    (void)state;
    const int32_t a[4] = {0, 1, 4, 5}, b[4] = {0, 1, 3, 5};
    run_policy("ea@kvpress-class:n_future=4,n_sink=2", a);
    run_policy("ea@kvpress-class:n_future=4,n_sink=2,use_cov=0,use_vnorm=0", b);
}

static void test_golden_gadakv(void **state) {
    (void)state;
    const double sc[20] = {0.30, 0.01, 0.02, 0.25, 0.05, 0.04, 0.03, 0.20, 0.06, 0.04,
                           0.09, 0.12, 0.11, 0.10, 0.08, 0.13, 0.07, 0.10, 0.09, 0.11};
    uint8_t keep[20];
    int64_t cnt[2];
    assert_int_equal(kvs_ea_adakv_counts(sc, 2, 10, 5, 0.2, keep, cnt), KVS_OK);
    assert_int_equal(cnt[0], 3);
    assert_int_equal(cnt[1], 7);
    const int k0[10] = {1, 0, 0, 1, 0, 0, 0, 1, 0, 0}, k1[10] = {0, 1, 1, 1, 0, 1, 0, 1, 1, 1};
    for (int j = 0; j < 10; j++) {
        assert_int_equal(keep[j], k0[j]);
        assert_int_equal(keep[10 + j], k1[j]);
    }
    /* each head's own top-count under the prune order reproduces the layer's kept set (the tie at 0.09 too) */
    int32_t out[10];
    kvs_ea_keep_top(sc + 10, 10, 7, out);
    const int32_t w1[7] = {1, 2, 3, 5, 7, 8, 9};
    for (int i = 0; i < 7; i++) assert_int_equal(out[i], w1[i]);
    kvs_ea_keep_top(sc, 10, 3, out);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[1], 3);
    assert_int_equal(out[2], 7);
}

/* EA2: E[exp(s q.k)] for q ~ N(mu, Sigma) is exp(s mu.k + s^2/2 k^T Sigma k): 10^6 samples, relative error < 1e-2.
 * The score's logit is that expression (checked through G-EA); here the identity itself. */
static void test_ea2_gaussian_expectation(void **state) {
    (void)state;
    const double mu[3] = {0.3, -0.2, 0.5}, L[3][3] = {{0.8, 0, 0}, {0.3, 0.5, 0}, {-0.2, 0.1, 0.4}};
    const double k[3] = {0.7, -0.4, 1.1}, s = 0.6;
    double Sk[3] = {0}, quad = 0, lin = 0; /* Sigma = L L^T */
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            double sab = 0;
            for (int c = 0; c < 3; c++) sab += L[a][c] * L[b][c];
            Sk[a] += sab * k[b];
        }
    for (int a = 0; a < 3; a++) quad += k[a] * Sk[a], lin += mu[a] * k[a];
    double closed = exp(s * lin + 0.5 * s * s * quad);
    kvs_rng r;
    kvs_rng_seed(&r, 3, 7);
    double acc = 0;
    const int N = 1000000;
    for (int i = 0; i < N; i++) {
        double z[3], q[3];
        for (int a = 0; a < 3; a += 1) { /* Box-Muller */
            double u1 = kvs_rng_open01(&r), u2 = kvs_rng_open01(&r);
            z[a] = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
        }
        double dot = 0;
        for (int a = 0; a < 3; a++) {
            q[a] = mu[a];
            for (int c = 0; c < 3; c++) q[a] += L[a][c] * z[c];
            dot += q[a] * k[a];
        }
        acc += exp(s * dot);
    }
    assert_true(fabs(acc / N / closed - 1) < 1e-2);
}

static void test_validation(void **state) {
    (void)state;
    kvs_policy_config cfg;
    kvs_policy_model m = {.n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .group = 2, .head_dim = 4, .scale = 0.5f,
                          .n_positions = 6, .prompt_len = 6, .rope_theta = 500000.0f, .rope_layout = 1};
    snprintf(m.model_name, sizeof m.model_name, "Llama-3.1-8B-Instruct");
    assert_int_equal(kvs_policy_parse("ea", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 4), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "rope_scaling"));
    assert_int_equal(kvs_policy_parse("ea:rope_scaling=llama31", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 4), KVS_OK);
    assert_int_equal(kvs_policy_parse("ea:rope_scaling=none", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 4), KVS_OK);
    m.rope_theta = 0;
    assert_int_equal(kvs_policy_parse("ea", &cfg), KVS_OK);
    snprintf(m.model_name, sizeof m.model_name, "stories260K");
    assert_int_equal(kvs_policy_validate(&cfg, &m, 4), KVS_ERR_INVALID_ARG);
}

/* A budget at least the prompt keeps it whole (no compression when P <= B_p). */
static void test_lossless_when_budget_covers_prompt(void **state) {
    (void)state;
    const int32_t all[6] = {0, 1, 2, 3, 4, 5};
    const struct kvs_policy_ops *ops = kvs_policy_find("ea");
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse("ea:n_future=4,n_sink=2", &cfg), KVS_OK);
    kvs_policy_model m = {.n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .group = 2, .head_dim = 4, .scale = 0.5f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = 6, .prompt_len = 6, .rope_theta = 10000.0f,
                          .rope_layout = 1};
    kvs_policy_view view = {.n = 6, .group = 2, .head_dim = 4, .scale = 0.5f, .k = &gk[0][0], .v = &gv[0][0],
                            .q = &gq[0][0][0], .q_first = 0, .n_q = 6, .turn_begin = 0, .prompt_end = 6,
                            .block_begin = 0, .last_block = 1};
    kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = 6, .budget_nominal = 6};
    void *st = NULL;
    void *alloc = (void *)1;
    assert_int_equal(ops->alloc_begin(&cfg, &m, 6, &alloc), KVS_OK);
    assert_null(alloc); /* nothing to pool */
    assert_int_equal(ops->create(&init, &st), KVS_OK);
    assert_int_equal(ops->prefill(st, &view), KVS_OK);
    int32_t out[8];
    assert_int_equal(ops->stored(st, 0, out), 6);
    for (int i = 0; i < 6; i++) assert_int_equal(out[i], all[i]);
    ops->free(st);
}

/* ea_decode on G-EA's six positions plus a seventh: budget 6, so the seventh step holds 7 and cuts one. The evicted
 * one is the lowest of the expected-attention scores computed here directly (statistics of the buffered queries,
 * sinks 0 and 1 excluded, future from a0 = 6, candidates 0..5, without |v|, which would always evict position 2).
 * The seventh query was chosen so that the evicted position changes with a0 (7 evicts 2), without the current query
 * in the statistics (4), and with a buffer of 5 queries instead of 4 (3): the assertions below pin each. */
static void ea_decode_step(const char *spec, int64_t first, int want_evicted) {
    const struct kvs_policy_ops *ops = kvs_policy_find("ea_decode");
    assert_non_null(ops);
    kvs_policy_config cfg;
    if (kvs_policy_parse(spec, &cfg) != KVS_OK) fail_msg("%s: %s", spec, kvs_last_error());
    float q[7][2][4], k[7][4], v[7][4];
    memcpy(q, gq, sizeof gq);
    memcpy(k, gk, sizeof gk);
    memcpy(v, gv, sizeof gv);
    const float q6[2][4] = {{0, 1.4f, 1.5f, -1.5f}, {-0.9f, -1.8f, 0.1f, 1.5f}};
    const float k6[4] = {0.3f, 0.9f, -0.4f, 0.2f}, v6[4] = {0.1f, 0.2f, -0.3f, 0.4f};
    memcpy(q[6], q6, sizeof q6);
    memcpy(k[6], k6, sizeof k6);
    memcpy(v[6], v6, sizeof v6);
    kvs_policy_model m = {.n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .group = 2, .head_dim = 4, .scale = 0.5f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = 7, .prompt_len = 6, .rope_theta = 10000.0f,
                          .rope_layout = 1};
    kvs_policy_view pv = {.n = 6, .group = 2, .head_dim = 4, .scale = 0.5f, .k = &k[0][0], .v = &v[0][0],
                          .q = &q[0][0][0], .q_first = 0, .n_q = 6, .turn_begin = 0, .prompt_end = 6,
                          .block_begin = 0, .last_block = 1};
    kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = 6, .budget_nominal = 6};
    void *st = NULL;
    assert_int_equal(ops->create(&init, &st), KVS_OK);
    assert_int_equal(ops->prefill(st, &pv), KVS_OK);
    int32_t idx[8];
    int64_t n = 0;
    int32_t *lists[1] = {idx};
    kvs_policy_sel sel = {.idx = lists, .n = &n, .n_lists = 1, .cap = 8};
    kvs_policy_view dv = {.n = 7, .group = 2, .head_dim = 4, .scale = 0.5f, .k = &k[0][0], .v = &v[0][0],
                          .q = &q[6][0][0], .q_first = 6, .n_q = 1, .turn_begin = 0, .prompt_end = 6,
                          .block_begin = 6, .last_block = 1};
    assert_int_equal(ops->select(st, &dv, &sel), KVS_OK);
    assert_int_equal(n, 6);
    kvs_ea_params p = {.n_future = 4, .n_sink = 2, .use_cov = 1, .use_vnorm = 0, .eps = 0};
    double freq[2], sc[6];
    kvs_rope_freqs(10000.0, 4, NULL, freq);
    int32_t cand[6] = {0, 1, 2, 3, 4, 5};
    assert_int_equal(kvs_ea_scores(&p, freq, 1, 0.5, 2, 4, &q[first][0][0], first, 7 - first, 6, &k[0][0], &v[0][0],
                                   cand, 6, sc),
                     KVS_OK);
    int worst = 2; /* sinks 0, 1 score max + 1 */
    for (int j = 3; j < 6; j++)
        if (sc[j] < sc[worst]) worst = j;
    assert_int_equal(worst, want_evicted);
    int32_t want[6], w = 0;
    for (int j = 0; j < 7; j++)
        if (j != worst) want[w++] = j;
    for (int i = 0; i < 6; i++) assert_int_equal(idx[i], want[i]);
    ops->free(st);
}

static void test_ea_decode_step(void **state) {
    (void)state;
    ea_decode_step("ea_decode:n_future=4,n_sink=2,use_vnorm=0", 0, 3);
    ea_decode_step("ea_decode:n_future=4,n_sink=2,use_vnorm=0,qbuf=4", 3, 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_gea_scores),
        cmocka_unit_test(test_golden_gea_kept_sets),
        cmocka_unit_test(test_golden_gadakv),
        cmocka_unit_test(test_ea2_gaussian_expectation),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_lossless_when_budget_covers_prompt),
        cmocka_unit_test(test_ea_decode_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
