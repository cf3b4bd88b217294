/* test_cake.c — CAKE (policies/cake.c, ../shared/POLICY_SPEC_2.md §2.2):
 *  - golden example G-CAKE through the pure parts (cake_internal.h): H_l, V_l, P_l, the raw indicator of layer 0
 *    head 0, the pooled group-mean indicator S of every layer, ADJUST's (6, 1, 2), the cascade stages (8), (7, 2),
 *    (6, 1, 2), to a relative 1e-5 as the spec asks;
 *  - the same example through the policy's allocation pass and instances (keys one-hot, queries = logits / scale,
 *    so s·q·k reproduces the spec's z): per-layer budgets b_l + w = (8, 3, 4) and the kept sets exactly;
 *  - CK4 invariants on many preference vectors: Σ b_l = L·(B − w) whenever L·cap allows it, and the cascade's
 *    final budget of a layer is the minimum of its stage budgets (nested sets);
 *  - decode: FIXED at B_l with the current token and the last w kept, checked on a generated trace through the
 *    engine (every attended set has exactly min(n, B_l) entries, the newest w of them included); lossless (every
 *    position attended, zero output error) when the budget covers the trace;
 *  - notes for the degenerate budgets.
 * Data: the spec's hand-set logits, or GENERATED Gaussian streams (tests/util/gen_trace.h), never a model's.
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

#include "../policies/cake_internal.h"
#include "../policies/registry.h"
#include "../sim/policy.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"

#define NEG (-INFINITY)

/* G-CAKE inputs: z[layer][head][row][key], L = 3, G = 2, w = 2, P = 10. */
static const double gz[3][2][2][10] = {
    {{{0.1, 2, 1.8, -0.8, -0.4, -0.8, 0.9, -0.1, 1.1, NEG}, {2.3, -0.1, 1, -0.2, -0.6, 0.7, 1.2, -0.3, -0.2, 1}},
     {{-1.3, -2.3, 0.6, -1, -2.9, -1.2, -0.7, -1.8, -2.2, NEG}, {1.3, -0.3, -1.1, 0.6, 1.1, -0.5, 0.8, 1.6, -0.3, -1.2}}},
    {{{0.5, 0.4, 1.6, -1.9, -1, -1.3, -2.6, 0.2, 0.8, NEG}, {2.1, 1.2, 0.9, 0.6, 1.4, -2, 0.9, 0.9, -2.7, 0.5}},
     {{-0.4, 1.2, -0.7, 0, 0.5, -1.3, 0.9, -0.2, 0.7, NEG}, {1.6, 0.9, -0.3, 0.9, 1.9, 2.7, -2.4, 1.3, 0.7, -0.1}}},
    {{{-1.5, 1.9, -1.9, 0.9, 2, -2.4, -0.5, -2, 0.4, NEG}, {3, -2.7, -0.9, 1.1, 2.4, 0.6, -1.1, 0.4, 0, -0.3}},
     {{-1.1, 0.6, 0.5, -0.1, -0.3, -1.9, -0.7, 1.8, -0.3, NEG}, {2, 0.8, 3.2, 0.1, -0.7, -2.2, 2, 3.9, -1.2, -1}}},
};
static const double gH[3] = {6.324313, 6.439926, 5.296883};
static const double gV[3] = {0.2796717, 0.1829892, 0.2123329};
static const double gP[3] = {0.130995, 0.04587901, 0.05889197};
static const double gS[3][8] = {
    {4.898198, 4.912578, 5.144873, 3.751236, 2.909501, 0.8770257, 0.862646, 0.6303502},
    {1.784085, 1.829477, 2.0224, 2.963342, 2.997739, 2.051818, 2.006427, 1.813504},
    {4.032288, 4.108437, 4.28942, 1.841519, 0.5104372, 0.4050815, 0.3289325, 0.1479495},
};
static const double gI00[8] = {12.94973, 8.700751, 2.701766, 0.04441058, 0.03167746, 0.4347592, 0.1882319, 0.04540655};
static const int32_t gkeep0[] = {0, 1, 2, 3, 4, 5, 8, 9}, gkeep1[] = {4, 8, 9}, gkeep2[] = {1, 2, 8, 9};

static void close_rel(double got, double want, double rel) {
    double tol = fabs(want) * rel;
    if (tol < 1e-7) tol = 1e-7;
    if (fabs(got - want) > tol) fail_msg("got %.9g, want %.9g", got, want);
}

/* Pooled group mean the way the policy computes it: AVGPOOL_5 with zero padding (divisor 5), then the mean. */
static void pool5(const double *x, int n, double *out) {
    for (int j = 0; j < n; j++) {
        double s = 0;
        for (int t = j - 2; t <= j + 2; t++)
            if (t >= 0 && t < n) s += x[t];
        out[j] = s / 5.0;
    }
}

static void test_gcake_statistics(void **state) {
    (void)state;
    double prob[20], ind[8], pooled[8];
    for (int l = 0; l < 3; l++) {
        double H = 0, V = 0, S[8] = {0};
        for (int h = 0; h < 2; h++) {
            kvs_cake_head_stats(&gz[l][h][0][0], 2, 10, 200.0, &H, &V, ind, prob);
            if (l == 0 && h == 0)
                for (int j = 0; j < 8; j++) close_rel(ind[j], gI00[j], 1e-5);
            pool5(ind, 8, pooled);
            for (int j = 0; j < 8; j++) S[j] += pooled[j] / 2.0;
        }
        close_rel(H, gH[l], 1e-5);
        close_rel(V, gV[l], 1e-5);
        close_rel(pow(H, 1.0 / 1.6) * pow(V, 1.0 / 0.4), gP[l], 1e-5);
        for (int j = 0; j < 8; j++) close_rel(S[j], gS[l][j], 1e-5);
    }
}

static void test_gcake_adjust_and_cascade(void **state) {
    (void)state;
    const double raw[3] = {5.00053, 1.75136, 2.24811};
    int64_t b[3], stages[9];
    kvs_cake_adjust(raw, 3, 9, 8, b);
    assert_true(b[0] == 6 && b[1] == 1 && b[2] == 2);
    assert_int_equal(kvs_cake_budgets(gP, 3, 9, 8, 1, b, stages), KVS_OK);
    assert_true(stages[0] == 8);                     /* stage 0: 9 clamped to the cap, the excess dropped */
    assert_true(stages[3] == 7 && stages[4] == 2);   /* stage 1 */
    assert_true(stages[6] == 6 && stages[7] == 1 && stages[8] == 2);
    assert_true(b[0] == 6 && b[1] == 1 && b[2] == 2);
    assert_int_equal(kvs_cake_budgets(gP, 3, 9, 8, 0, b, NULL), KVS_OK);
    assert_true(b[0] == 6 && b[1] == 1 && b[2] == 2);
}

/* G-CAKE through the policy: d = 10 one-hot keys, so q = z / scale gives the spec's logits exactly enough. */
static void test_gcake_through_the_policy(void **state) {
    (void)state;
    enum { P = 10, D = 10 };
    const float scale = 0.5f;
    static float k[P][D], v[P][D], q[3][P][2][D];
    for (int j = 0; j < P; j++) {
        k[j][j] = 1.0f;
        v[j][j % D] = 1.0f;
    }
    for (int l = 0; l < 3; l++)
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < P; j++) {
                    double zz = gz[l][h][i][j];
                    q[l][8 + i][h][j] = isfinite(zz) ? (float)(zz / scale) : 0.0f; /* key 9 is masked for row 0 */
                }
    kvs_policy_model m = {.n_layers = 3, .n_heads = 2, .n_kv_heads = 1, .group = 2, .head_dim = D, .scale = scale,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = 12, .prompt_len = P};
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse("cake:window=2,tau1=1.6,tau2=0.4,gamma=200,kernel=5", &cfg), KVS_OK);
    void *alloc = NULL;
    assert_int_equal(cfg.ops->alloc_begin(&cfg, &m, 5, &alloc), KVS_OK);
    kvs_policy_view view[3];
    for (int l = 0; l < 3; l++) {
        view[l] = (kvs_policy_view){.n = P, .group = 2, .head_dim = D, .scale = scale, .k = &k[0][0], .v = &v[0][0],
                                    .q = &q[l][0][0][0], .q_first = 0, .n_q = P, .turn_begin = 0, .prompt_end = P,
                                    .block_begin = 0, .last_block = 1};
        assert_int_equal(cfg.ops->alloc_prefill(alloc, l, 0, &view[l]), KVS_OK);
    }
    int64_t budgets[3];
    assert_int_equal(cfg.ops->alloc_end(alloc, budgets), KVS_OK);
    cfg.ops->alloc_free(alloc);
    assert_true(budgets[0] == 8 && budgets[1] == 3 && budgets[2] == 4);
    const int32_t *want[3] = {gkeep0, gkeep1, gkeep2};
    for (int l = 0; l < 3; l++) {
        kvs_policy_init init = {.model = &m, .cfg = &cfg, .layer = l, .budget = budgets[l], .budget_nominal = 5};
        void *st = NULL;
        assert_int_equal(cfg.ops->create(&init, &st), KVS_OK);
        assert_int_equal(cfg.ops->prefill(st, &view[l]), KVS_OK);
        int32_t held[P];
        assert_int_equal(cfg.ops->stored(st, 0, held), budgets[l]);
        assert_memory_equal(held, want[l], (size_t)budgets[l] * sizeof(int32_t));
        cfg.ops->free(st);
    }
}

/* CK4: after ADJUST the layers' total is T whenever L·cap >= T (each layer <= cap, >= 0), on many preference
 * vectors (the excess of clamped layers is passed on, not lost); the cascade's final budgets never exceed a layer's
 * budget at any stage after its own, and the last layer's is its own stage's. */
static void test_ck4_invariants(void **state) {
    (void)state;
    uint64_t x = 12345;
    for (int trial = 0; trial < 2000; trial++) {
        int L = 1 + (int)(x % 9);
        double pref[9];
        for (int l = 0; l < L; l++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            pref[l] = (double)(x >> 40) / (double)(1ULL << 24) + (trial % 7 == 0 && l == 0 ? 50.0 : 0.0);
        }
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        int64_t cap = 1 + (int64_t)(x % 40), T = (int64_t)((x >> 20) % (uint64_t)(L * cap + 1));
        int64_t b[9], stages[81];
        for (int cascade = 0; cascade < 2; cascade++) {
            assert_int_equal(kvs_cake_budgets(pref, L, T, cap, cascade, b, stages), KVS_OK);
            int64_t sum = 0;
            for (int l = 0; l < L; l++) {
                assert_true(b[l] >= 0); /* not <= cap: the reference's single pass may push a layer over it */
                sum += b[l];
            }
            if (!cascade) assert_true(sum == T);
            for (int s = 0; cascade && s < L; s++)
                for (int l = 0; l <= s; l++) assert_true(b[l] <= stages[s * L + l]);
            if (cascade) assert_true(b[L - 1] == stages[(L - 1) * L + L - 1]);
        }
    }
}

/* Decode through the engine on a generated trace: every attended set has min(n, B_l) entries, holds the current
 * token and the w newest held positions; the budgets differ between layers and average to B. */
typedef struct {
    int64_t budgets[64];
    int Hkv, w, checked, bad;
} dec_rec;

static void dec_on_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    dec_rec *r = user;
    (void)config;
    int64_t B = r->budgets[layer * r->Hkv + kv_head], n = sel->n[0], want = pos + 1 < B ? pos + 1 : B;
    r->checked++;
    if (n != want || sel->idx[0][n - 1] != pos) {
        r->bad++;
        return;
    }
    for (int64_t i = 0; i < r->w; i++)
        if (sel->idx[0][n - 1 - i] != pos - i) r->bad++; /* the newest w positions are the last w */
}

static void test_decode_keeps_budget_and_window(void **state) {
    (void)state;
    kvs_gen_trace_opts o = kvs_test_grouped_opts(1, 2, 120, 80, 8, 7);
    o.n_layers = 4;
    kvs_test_replay_fixture f;
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 11, &f), KVS_OK);
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse("cake:window=4", &cfg), KVS_OK);
    dec_rec rec = {.Hkv = f.Hkv, .w = 4};
    kvs_replay_hooks hooks = {.user = &rec, .on_select = NULL};
    kvs_replay_config rc = {.policy = cfg, .budget = 24, .budget_fraction = -1};
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    kvs_replay_opts ro = {.configs = &rc, .n_configs = 1, .threads = 1, .measure = KVS_MEASURE_DECODE,
                          .hooks = &hooks};
    /* the budgets come from the allocation pass: run once to learn them, then check */
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &ro, &r), KVS_OK);
    assert_int_equal(r->runs[0].status, KVS_OK);
    int64_t sum = 0, lo = 1 << 30, hi = 0;
    for (int c = 0; c < o.n_layers * f.Hkv; c++) {
        rec.budgets[c] = r->runs[0].budgets[c];
        sum += rec.budgets[c];
        if (rec.budgets[c] < lo) lo = rec.budgets[c];
        if (rec.budgets[c] > hi) hi = rec.budgets[c];
    }
    kvs_replay_result_free(r);
    assert_true(sum == (int64_t)24 * o.n_layers * f.Hkv); /* Σ_l B_l = L·B */
    assert_true(lo < hi);                                 /* the layers' preferences differ */
    hooks.on_select = dec_on_select;
    assert_int_equal(kvs_replay_execute(&src, &ro, &r), KVS_OK);
    assert_int_equal(r->runs[0].status, KVS_OK);
    kvs_replay_result_free(r);
    assert_true(rec.checked > 0);
    assert_int_equal(rec.bad, 0);
    /* lossless when the budget covers the trace: no prefill compression, every position attended at every step */
    dec_rec all = {.Hkv = f.Hkv, .w = 4};
    for (int c = 0; c < 64; c++) all.budgets[c] = 1 << 30;
    hooks.user = &all;
    rc.budget = f.N;
    assert_int_equal(kvs_replay_execute(&src, &ro, &r), KVS_OK);
    assert_int_equal(r->runs[0].status, KVS_OK);
    for (int c = 0; c < o.n_layers * f.Hkv; c++) assert_true(r->runs[0].budgets[c] == f.N);
    assert_true(r->runs[0].run_agg.out_err.mean == 0);
    kvs_replay_result_free(r);
    assert_true(all.checked > 0);
    assert_int_equal(all.bad, 0);
    kvs_test_replay_fixture_free(&f);
}

static void test_notes(void **state) {
    (void)state;
    kvs_policy_config cfg;
    kvs_policy_model m = {.n_layers = 2, .n_heads = 2, .n_kv_heads = 1, .group = 2, .head_dim = 4, .scale = 0.5f,
                          .n_positions = 500, .prompt_len = 200};
    char buf[512];
    assert_int_equal(kvs_policy_parse("cake", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 16, buf, sizeof buf), 1);
    assert_non_null(strstr(buf, "budget <= window=32"));
    assert_int_equal(kvs_policy_notes(&cfg, &m, 180, buf, sizeof buf), 1);
    assert_non_null(strstr(buf, "no prefill compression"));
    assert_int_equal(kvs_policy_notes(&cfg, &m, 64, buf, sizeof buf), 0);
    assert_int_equal(kvs_policy_parse("cake:kernel=4", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 64), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "kernel must be odd"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gcake_statistics),
        cmocka_unit_test(test_gcake_adjust_and_cascade),
        cmocka_unit_test(test_gcake_through_the_policy),
        cmocka_unit_test(test_ck4_invariants),
        cmocka_unit_test(test_decode_keeps_budget_and_window),
        cmocka_unit_test(test_notes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
