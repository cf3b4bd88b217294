/* test_rkv.c — R-KV (policies/rkv.c, ../shared/POLICY_SPEC_2.md §2.9):
 *  - golden example G-RKV: the pooled importance I, the redundancy softmax R (column-0 quirk on) and the final
 *    scores F of the six candidates, the kept set {2, 3, 5} + window {6, 7} (of the near-duplicates 1, 4, 5 only
 *    the latest survives), and with the quirk off F_0 = -0.1030314 and the same set; then the same set through the
 *    policy (prefill of the 8 tokens, the last two prompt queries cached);
 *  - PEAK budget: on a generated stream the attended size never exceeds B, the cache is cut to B - Δ exactly when
 *    it fills, so compressions come every Δ steps once full; the window (the last α positions) is always held;
 *  - a budget covering the trace evicts nothing (the replay's error is the full cache's, 0);
 *  - small budgets: the buffer is cut to ⌈(B − α)/2⌉ (the notes say so).
 * Data: hand-set arrays (G-RKV) and GENERATED Gaussian streams (tests/util/gen_trace.h).
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

#include "../common/kvs_math.h"
#include "../policies/registry.h"
#include "../policies/rkv_internal.h"
#include "../sim/policy.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"

static void assert_close(double got, double want, const char *what) {
    if (!(fabs(got - want) <= 2e-6 * fabs(want) + 1e-8)) {
        print_error("%s: got %.9g, want %.9g\n", what, got, want);
        fail();
    }
}

static const float gk[8][3] = {{0.4f, 1.5f, -1.8f}, {1.7f, 0, -0.8f}, {-0.8f, -1.1f, -0.2f}, {0.8f, 0.6f, 0.6f},
                               {2.1f, 0.1f, -0.9f}, {1.5f, 0, -0.7f}, {-1, 1.3f, 0.6f}, {0.2f, -0.8f, 0}};
/* cached queries of positions 6 and 7, [row][group][d] */
static const float gq[2][2][3] = {{{-0.1f, 0.9f, 0.1f}, {1.6f, -0.8f, 0.5f}}, {{0.5f, -0.9f, -1.2f}, {1, 0.5f, -0.2f}}};

static void test_grkv_scores(void **state) {
    (void)state;
    int32_t idx[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    kvs_rkv_opts o = {.lambda = 0.1, .kernel = 3, .sim_thr = 0.5, .ref_quirks = 1};
    void *scratch = malloc(kvs_rkv_scratch_bytes(8));
    assert_non_null(scratch);
    double F[6], I[6], R[8];
    kvs_rkv_scores(&gk[0][0], idx, 8, 6, &gq[0][0][0], 2, 2, 3, (float)(1.0 / sqrt(3.0)), &o, F, I, R, scratch);
    const double wI[6] = {0.2106929, 0.2106929, 0.2106929, 0.2798633, 0.2798633, 0.2798633};
    const double wR[8] = {0.1354747, 0.1655056, 0.08750488, 0.1336437, 0.1461133, 0.1289179, 0.09065564, 0.1121842};
    const double wF[6] = {-0.100858, -0.1278858, -0.05768511, -0.09229303, -0.1035157, -0.08803976};
    for (int j = 0; j < 6; j++) assert_close(I[j], wI[j], "I");
    for (int j = 0; j < 8; j++) assert_close(R[j], wR[j], "R");
    for (int j = 0; j < 6; j++) assert_close(F[j], wF[j], "F");
    o.ref_quirks = 0;
    kvs_rkv_scores(&gk[0][0], idx, 8, 6, &gq[0][0][0], 2, 2, 3, (float)(1.0 / sqrt(3.0)), &o, F, I, R, scratch);
    assert_close(F[0], -0.1030314, "F_0 without the quirk");
    /* only ρ_0 changes (to 0.0659016; ρ_1 = 0.2456559 as before): R's ratio shows it; the softmax's sum moves the
     * other F_j a little, not their order: still {2, 3, 5} */
    assert_close(log(R[0] / R[1]), 0.0659016 - 0.2456559, "rho_0 - rho_1 without the quirk");
    int32_t top[3];
    kvs_topk_f64(F, 6, 3, top);
    kvs_sort_positions(top, 3);
    const int32_t want[3] = {2, 3, 5};
    assert_memory_equal(top, want, sizeof want);
    free(scratch);
}

static void grkv_policy(const char *spec) {
    float q[8][2][3] = {{{0}}};
    memcpy(q[6], gq, sizeof gq);
    kvs_policy_model m = {.n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .group = 2, .head_dim = 3,
                          .scale = (float)(1.0 / sqrt(3.0)), .kv_bytes = 2, .aux_bytes = 4, .n_positions = 9,
                          .prompt_len = 8};
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_OK);
    /* buffer 1: T = B - 1 = 5 (the reference's compression to 5) */
    kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = 6, .budget_nominal = 6};
    void *st = NULL;
    assert_int_equal(cfg.ops->create(&init, &st), KVS_OK);
    kvs_policy_view view = {.n = 8, .group = 2, .head_dim = 3, .scale = m.scale, .k = &gk[0][0], .v = &gk[0][0],
                            .q = &q[0][0][0], .q_first = 0, .n_q = 8, .turn_begin = 0, .prompt_end = 8, .last_block = 1};
    assert_int_equal(cfg.ops->prefill(st, &view), KVS_OK);
    int32_t held[8];
    const int32_t want[5] = {2, 3, 5, 6, 7};
    assert_int_equal(cfg.ops->stored(st, 0, held), 5);
    assert_memory_equal(held, want, sizeof want);
    cfg.ops->free(st);
}

static void test_grkv_through_the_policy(void **state) {
    (void)state;
    grkv_policy("rkv:window=2,buffer=1,kernel=3,ref_quirks=1");
    grkv_policy("rkv:window=2,buffer=1,kernel=3");
}

/* ---- a generated stream driven directly ------------------------------------------------------------------ */

enum { NPOS = 260, PROMPT = 40 };

static void test_peak_budget_and_period(void **state) {
    (void)state;
    kvs_gen_trace_opts go = kvs_gen_trace_defaults();
    go.n_positions = NPOS;
    go.prompt_len = PROMPT;
    go.n_kv_heads = 1;
    go.n_heads = 2;
    go.head_dim = 8;
    go.n_layers = 1;
    go.seed = 41;
    kvs_test_replay_fixture f;
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 16, &f), KVS_OK);
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse("rkv:window=4,buffer=16", &cfg), KVS_OK);
    const int64_t B = 64, T = 48;
    kvs_policy_init init = {.model = &f.mem.model, .cfg = &cfg, .budget = B, .budget_nominal = B};
    void *st = NULL;
    assert_int_equal(cfg.ops->create(&init, &st), KVS_OK);
    kvs_policy_view v = {.n = PROMPT, .group = 2, .head_dim = 8, .scale = f.scale, .k = f.g->k, .v = f.g->v,
                         .q = f.g->q, .q_first = 0, .n_q = PROMPT, .turn_begin = 0, .prompt_end = PROMPT,
                         .last_block = 1};
    assert_int_equal(cfg.ops->prefill(st, &v), KVS_OK);
    int32_t buf[NPOS], held[NPOS];
    const float *rk[NPOS] = {0}, *rv[NPOS] = {0};
    int32_t *lists[1] = {buf};
    const float **rks[1] = {rk}, **rvs[1] = {rv};
    int64_t cnt[1];
    kvs_policy_sel sel = {.idx = lists, .n = cnt, .n_lists = 1, .cap = NPOS, .row_k = rks, .row_v = rvs};
    int64_t last_cut = -1, cuts = 0, prev = PROMPT;
    for (int64_t p = PROMPT; p < NPOS; p++) {
        v = (kvs_policy_view){.n = p + 1, .group = 2, .head_dim = 8, .scale = f.scale, .k = f.g->k, .v = f.g->v,
                              .q = f.g->q + (size_t)p * 16, .q_first = p, .n_q = 1, .turn_begin = 0,
                              .prompt_end = PROMPT, .block_begin = p, .last_block = 1};
        assert_int_equal(cfg.ops->select(st, &v, &sel), KVS_OK);
        /* the step's cut comes after its attention, in observe() (rkv ignores the probabilities) */
        assert_int_equal(cfg.ops->observe(st, &v, &sel, NULL), KVS_OK);
        int64_t n = cfg.ops->stored(st, 0, held);
        assert_true(cnt[0] <= B);
        assert_int_equal(cnt[0], prev + 1);
        assert_int_equal(buf[cnt[0] - 1], p);
        if (cnt[0] == B) { /* filled: cut to T after this step's attention */
            assert_int_equal(n, T);
            if (last_cut >= 0) assert_int_equal(p - last_cut, B - T);
            last_cut = p;
            cuts++;
        } else {
            assert_int_equal(n, cnt[0]);
        }
        for (int64_t j = 0; j < 4; j++) assert_int_equal(held[n - 4 + j], p - 3 + j); /* the window */
        prev = n;
    }
    assert_true(cuts >= (NPOS - B) / (B - T) - 1);
    cfg.ops->free(st);
    /* a prompt of B - 1 positions is kept whole (the next step attends B), one of B is cut to T */
    for (int64_t b = PROMPT; b <= PROMPT + 1; b++) {
        init.budget = init.budget_nominal = b;
        assert_int_equal(cfg.ops->create(&init, &st), KVS_OK);
        v = (kvs_policy_view){.n = PROMPT, .group = 2, .head_dim = 8, .scale = f.scale, .k = f.g->k, .v = f.g->v,
                              .q = f.g->q, .q_first = 0, .n_q = PROMPT, .turn_begin = 0, .prompt_end = PROMPT,
                              .last_block = 1};
        assert_int_equal(cfg.ops->prefill(st, &v), KVS_OK);
        assert_int_equal(cfg.ops->stored(st, 0, held), b == PROMPT ? PROMPT - 16 : PROMPT);
        cfg.ops->free(st);
    }
    kvs_test_replay_fixture_free(&f);
}

static void test_covering_budget_is_lossless(void **state) {
    (void)state;
    kvs_test_replay_fixture f;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(1, 2, 60, 30, 8, 42);
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 11, &f), KVS_OK);
    const char *specs[] = {"rkv", "rkv@fixed", "rkv:window=2,buffer=5"};
    for (size_t i = 0; i < 3; i++) {
        kvs_policy_config cfg;
        assert_int_equal(kvs_policy_parse(specs[i], &cfg), KVS_OK);
        for (int64_t B = 59; B <= 60; B++) {
            kvs_replay_config rc = {.policy = cfg, .budget = B, .budget_fraction = -1};
            kvs_replay_source src;
            assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
            kvs_replay_opts o = {.configs = &rc, .n_configs = 1, .threads = 1, .measure = KVS_MEASURE_DECODE};
            kvs_replay_result *r = NULL;
            assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
            assert_int_equal(r->runs[0].status, KVS_OK);
            if (B == 60) assert_true(r->runs[0].run_agg.out_err.mean == 0.0); /* nothing evicted */
            else assert_true(r->runs[0].run_agg.out_err.mean > 0.0);          /* the last step: one evicted */
            kvs_replay_result_free(r);
        }
    }
    kvs_test_replay_fixture_free(&f);
}

static void test_small_budget_notes(void **state) {
    (void)state;
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse("rkv", &cfg), KVS_OK);
    kvs_policy_model m = {.n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .group = 2, .head_dim = 8, .scale = 0.3f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = 1000, .prompt_len = 500};
    char buf[512];
    assert_int_equal(kvs_policy_notes(&cfg, &m, 64, buf, sizeof buf), 1);
    assert_non_null(strstr(buf, "window 8 and buffer 28 used"));
    assert_int_equal(kvs_policy_notes(&cfg, &m, 137, buf, sizeof buf), 0);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 2, buf, sizeof buf), 1);
    assert_non_null(strstr(buf, "a sliding window"));
    assert_int_equal(kvs_policy_parse("rkv:kernel=4", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 64), KVS_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grkv_scores),
        cmocka_unit_test(test_grkv_through_the_policy),
        cmocka_unit_test(test_peak_budget_and_period),
        cmocka_unit_test(test_covering_budget_is_lossless),
        cmocka_unit_test(test_small_budget_notes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
