/* test_shadowkv.c — policies/shadowkv.c (../shared/POLICY_SPEC_2.md §2.10): the golden example G-SKV through the
 * policy itself (singular values of the pre-RoPE keys, chunk outlier scores, landmark probabilities, the selected
 * chunks, the attended set with its reconstructed keys, and the output O' recomputed here from the selection), the
 * reuse-cache misses, the budget split, and the accounting of the host values and transfers.
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

#include "../common/kvs_rope.h"
#include "../policies/registry.h"
#include "../policies/shadowkv_internal.h"

static void assert_rel(double got, double want) {
    double tol = 1e-5 * fmax(fabs(want), 1e-2);
    if (fabs(got - want) > tol) fail_msg("got %.9g want %.9g", got, want);
}

static const double khat[17][4] = {
    {-0.8, 0.2, -1.7, 0.7}, {1.1, -0.5, 0.4, 0.3},   {-0.4, -0.9, -2, 1.4},  {0, 2.5, 0.8, 0.3},
    {-0.7, 1.4, -0.5, 1.6}, {-0.4, 0.2, -1.5, 2.3},  {-0.1, -0.4, 0.8, -0.9}, {0.8, -1.2, 0.5, -1},
    {-1.8, -0.6, -1.5, 0.6}, {0, 0.5, 0.1, -0.4},    {0, 1.1, -0.2, -0.8},   {-1, -0.2, -0.7, 1.9},
    {-1.2, -1.1, -0.3, 0.7}, {-0.3, -1, -0.8, -0.4}, {1, -1, -0.1, -0.6},    {0.3, 0.4, -1.5, 2.4},
    {0.2, 1.2, 0.9, 0.3}};
static const float vals[17][4] = {
    {0.2f, -0.5f, -0.9f, -0.3f}, {0, 0.6f, 0, 0.5f},        {-1.6f, -0.8f, -1, 0.2f},   {0.5f, -1.5f, -0.2f, 0.7f},
    {0.9f, -1.1f, 0.6f, 0.3f},   {-0.4f, 2, -1.1f, -0.3f},  {0.5f, 0.2f, -0.2f, 1.4f},  {1.4f, 0.9f, 1, -0.1f},
    {-1.2f, 2.2f, -1, 2.2f},     {-0.1f, 0.2f, -0.2f, 1},   {-0.5f, 1.8f, 0.5f, 0.2f},  {-0.6f, 0.3f, 0, 1.9f},
    {0.9f, -1.6f, 1.5f, -2.4f},  {1.5f, -1.9f, 0, 0.8f},    {0, -1.1f, 1.2f, -1.8f},    {-1.5f, 1.4f, -0.9f, 0.2f},
    {0.9f, -0.5f, -0.8f, -1}};

typedef struct {
    const struct kvs_policy_ops *ops;
    kvs_policy_config cfg;
    kvs_policy_model m;
    float k[17][4], q[2][4];
    void *st;
} gskv;

static void gskv_setup(gskv *g, const char *spec, int64_t budget) {
    memset(g, 0, sizeof *g);
    g->ops = kvs_policy_find("shadowkv");
    assert_non_null(g->ops);
    if (kvs_policy_parse(spec, &g->cfg) != KVS_OK) fail_msg("%s: %s", spec, kvs_last_error());
    g->m = (kvs_policy_model){.n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .group = 1, .head_dim = 4, .scale = 0.5f,
                              .kv_bytes = 2, .aux_bytes = 4, .n_positions = 17, .prompt_len = 16,
                              .rope_theta = 10000.0f, .rope_layout = 1};
    double freq[2];
    kvs_rope_freqs(10000.0, 4, NULL, freq);
    for (int j = 0; j < 17; j++) { /* post-RoPE keys R(j) k̂_j, as the model would have written them */
        double x[4];
        memcpy(x, khat[j], sizeof x);
        kvs_rope_apply_f64(x, 4, 1, j, freq);
        for (int a = 0; a < 4; a++) g->k[j][a] = (float)x[a];
    }
    const float q16[4] = {0.8f, -0.1f, 0.3f, 0.1f};
    memcpy(g->q[0], q16, sizeof q16);
    kvs_policy_init init = {.model = &g->m, .cfg = &g->cfg, .budget = budget, .budget_nominal = budget};
    assert_int_equal(g->ops->create(&init, &g->st), KVS_OK);
    kvs_policy_view pv = {.n = 16, .group = 1, .head_dim = 4, .scale = 0.5f, .k = &g->k[0][0], .v = &vals[0][0],
                          .q = &g->q[0][0], .q_first = 0, .n_q = 0, .turn_begin = 0, .prompt_end = 16,
                          .block_begin = 0, .last_block = 1};
    assert_int_equal(g->ops->prefill(g->st, &pv), KVS_OK);
    assert_int_equal(g->ops->layer_sync(&g->st, 1, KVS_SYNC_PREFILL), KVS_OK);
}

typedef struct {
    int32_t idx[32];
    const float *rk[32], *rv[32];
    int64_t n;
} selection;

static void gskv_step(gskv *g, selection *out) {
    memset(out, 0, sizeof *out);
    int32_t *lists[1] = {out->idx};
    const float **rk[1] = {out->rk}, **rv[1] = {out->rv};
    kvs_policy_sel sel = {.idx = lists, .n = &out->n, .n_lists = 1, .cap = 32, .row_k = rk, .row_v = rv};
    kvs_policy_view dv = {.n = 17, .group = 1, .head_dim = 4, .scale = 0.5f, .k = &g->k[0][0], .v = &vals[0][0],
                          .q = &g->q[0][0], .q_first = 16, .n_q = 1, .turn_begin = 0, .prompt_end = 16,
                          .block_begin = 16, .last_block = 1};
    assert_int_equal(g->ops->select(g->st, &dv, &sel), KVS_OK);
}

static void test_golden_gskv(void **state) {
    (void)state;
    gskv g;
    /* B = local 2 + one outlier chunk of 2 + sparse budget 4 */
    gskv_setup(&g, "shadowkv:c=2,local_chunks=1,outliers=1,rank=2", 8);
    kvs_shadowkv_debug dbg = kvs_shadowkv_inspect(g.st);
    const double sig[4] = {6.24358, 4.193027, 2.656766, 1.848736};
    assert_int_equal(dbg.n_sigma, 4);
    for (int i = 0; i < 4; i++) assert_rel(dbg.sigma[i], sig[i]);
    assert_int_equal(dbg.rank, 2);
    assert_int_equal(dbg.n_chunks, 7);
    assert_int_equal(dbg.local_lo, 14);
    assert_int_equal(dbg.sparse_tokens, 4);
    const double o[7] = {-0.1950056, 0.5709233, 0.8688609, 0.9724026, -0.0316609, 0.1362952, 0.6847319};
    for (int m = 0; m < 7; m++) assert_rel(dbg.ocos[m], o[m]);
    for (int m = 0; m < 7; m++) assert_int_equal(dbg.outlier[m], m == 0);
    /* the new token's post-RoPE key, as the spec gives it */
    const double k16[4] = {0.06758109, 1.136877, -0.9194742, 0.48735};
    for (int a = 0; a < 4; a++) assert_rel(g.k[16][a], k16[a]);
    selection s;
    gskv_step(&g, &s);
    dbg = kvs_shadowkv_inspect(g.st);
    const double pi[6] = {0.2197511, 0.1300046, 0.1871662, 0.192885, 0.1443874, 0.1258056};
    for (int m = 1; m < 7; m++) assert_rel(dbg.pi[m], pi[m - 1]);
    /* attend set {0, 1 (outlier), 2, 3, 8, 9 (reconstructed), 14, 15 (local), 16} */
    const int32_t want[9] = {0, 1, 2, 3, 8, 9, 14, 15, 16};
    int32_t got[9];
    assert_int_equal(s.n, 9);
    memcpy(got, s.idx, sizeof got);
    for (int i = 1; i < 9; i++) /* sort a copy */
        for (int j = i; j > 0 && got[j - 1] > got[j]; j--) {
            int32_t t = got[j];
            got[j] = got[j - 1];
            got[j - 1] = t;
        }
    for (int i = 0; i < 9; i++) assert_int_equal(got[i], want[i]);
    const double rk2[4] = {1.853349, -1.022957, -0.0448169, 1.466135}, rk3[4] = {-0.2696781, 2.468562, -0.7655857,
                                                                                0.4437136};
    double lg[9], mx = -INFINITY, sum = 0, out[4] = {0};
    for (int i = 0; i < 9; i++) {
        int32_t j = s.idx[i];
        int merged = j == 2 || j == 3 || j == 8 || j == 9;
        assert_int_equal(s.rk[i] != NULL, merged);
        assert_int_equal(s.rv[i] != NULL, merged);
        const float *kr = merged ? s.rk[i] : g.k[j];
        const float *vr = merged ? s.rv[i] : vals[j];
        if (j == 2)
            for (int a = 0; a < 4; a++) assert_rel(kr[a], rk2[a]);
        if (j == 3)
            for (int a = 0; a < 4; a++) assert_rel(kr[a], rk3[a]);
        if (merged)
            for (int a = 0; a < 4; a++) assert_true(vr[a] == vals[j][a]); /* values fetched exactly */
        double dot = 0;
        for (int a = 0; a < 4; a++) dot += (double)g.q[0][a] * kr[a];
        lg[i] = 0.5 * dot;
        if (lg[i] > mx) mx = lg[i];
    }
    for (int i = 0; i < 9; i++) sum += exp(lg[i] - mx);
    for (int i = 0; i < 9; i++) {
        const float *vr = s.rv[i] ? s.rv[i] : vals[s.idx[i]];
        for (int a = 0; a < 4; a++) out[a] += exp(lg[i] - mx) / sum * vr[a];
    }
    const double Op[4] = {-0.6482895, 0.2174317, -0.4999382, 0.3071165};
    for (int a = 0; a < 4; a++) assert_rel(out[a], Op[a]);
    /* a second step with the same query selects the same chunks: the reuse cache misses nothing */
    assert_int_equal(kvs_shadowkv_inspect(g.st).misses, 2);
    gskv_step(&g, &s);
    assert_int_equal(kvs_shadowkv_inspect(g.st).misses, 0);
    g.ops->free(g.st);
}

/* Accounting at the golden's first step: host = every prompt value, D2H them once, H2D the two missed chunks' values;
 * the second step transfers nothing. */
static void test_accounting(void **state) {
    (void)state;
    gskv g;
    gskv_setup(&g, "shadowkv:c=2,local_chunks=1,outliers=1,rank=2", 8);
    selection s;
    kvs_policy_cost c;
    for (int step = 0; step < 2; step++) {
        gskv_step(&g, &s);
        memset(&c, 0, sizeof c);
        int32_t *lists[1] = {s.idx};
        kvs_policy_sel sel = {.idx = lists, .n = &s.n, .n_lists = 1, .cap = 32};
        kvs_policy_view dv = {.n = 17, .group = 1, .head_dim = 4, .scale = 0.5f, .k = &g.k[0][0], .v = &vals[0][0],
                              .q = &g.q[0][0], .q_first = 16, .n_q = 1, .prompt_end = 16, .block_begin = 16};
        g.ops->account(g.st, &dv, &sel, &c);
        assert_true(c.host_bytes == 2.0 * 4 * 16);                  /* d P values at 2 bytes */
        assert_true(c.d2h_bytes == (step == 0 ? 2.0 * 4 * 16 : 0)); /* offloaded once */
        assert_true(c.h2d_bytes == (step == 0 ? 2.0 * 4 * 4 : 0));  /* 4 tokens fetched, then reused */
        /* device KV: local 2 + outlier 2 + generated 1 exact, plus the sparse buffer of 4 */
        assert_true(c.kv_bytes == 2.0 * 2 * 4 * 9);
        /* AUX: landmarks d (C - outliers) = 24, U_r P r / Hkv = 32, SV r d = 8 elements, plus 2 chunk indices */
        assert_true(c.aux_bytes == 2.0 * (24 + 32 + 8) + 4.0 * 2);
    }
    g.ops->free(g.st);
}

/* A budget covering the prompt at full rank attends every position with its exact key (nothing merged). */
static void test_lossless_at_full_rank(void **state) {
    (void)state;
    gskv g;
    gskv_setup(&g, "shadowkv:c=2,local_chunks=1,outliers=1", 16);
    selection s;
    gskv_step(&g, &s);
    assert_int_equal(s.n, 17);
    for (int i = 0; i < 17; i++) assert_null(s.rk[i]);
    g.ops->free(g.st);
}

/* The trace does not record Llama-3's RoPE scaling: auto refuses such a model, an explicit choice is accepted. */
static void test_llama3_scaling_must_be_given(void **state) {
    (void)state;
    kvs_policy_config cfg;
    kvs_policy_model m = {.n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .group = 2, .head_dim = 4, .scale = 0.5f,
                          .n_positions = 6, .prompt_len = 6, .rope_theta = 500000.0f, .rope_layout = 1};
    snprintf(m.model_name, sizeof m.model_name, "Meta-Llama-3.1-8B");
    assert_int_equal(kvs_policy_parse("shadowkv", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 8), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "rope_scaling"));
    assert_int_equal(kvs_policy_parse("shadowkv:rope_scaling=llama31", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 8), KVS_OK);
    m.rope_theta = 0;
    assert_int_equal(kvs_policy_validate(&cfg, &m, 8), KVS_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_gskv),
        cmocka_unit_test(test_accounting),
        cmocka_unit_test(test_lossless_at_full_rank),
        cmocka_unit_test(test_llama3_scaling_must_be_given),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
