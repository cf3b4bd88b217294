/* test_cur.c — CurDKV (policies/cur.c, ../shared/POLICY_SPEC_2.md §2.7):
 *  - golden example G-CUR: the key and value leverages, their local normalisation, the normalised product and the
 *    kept set {0, 1, 5}, and without local normalisation the scores and the kept set {0, 2, 5}, through the
 *    scoring function and through the policy (create, prefill, stored) on the hand-made 6-token stream;
 *  - the sketch: proj_r > 0 gives the same scores for the same layer twice, and a different Γ per layer;
 *  - prompt-only: generated tokens are all kept; a budget covering the prompt keeps everything (lossless: the
 *    replay's error equals the full cache's, 0);
 *  - attention-free: scrambling every query changes nothing.
 * Data: hand-set arrays (G-CUR) and GENERATED Gaussian streams (tests/util/gen_trace.h).
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

#include "../policies/cur_internal.h"
#include "../policies/registry.h"
#include "../sim/policy.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"

static void assert_close(double got, double want, const char *what) {
    if (!(fabs(got - want) <= 1e-6 * fabs(want) + 1e-9)) {
        print_error("%s: got %.9g, want %.9g\n", what, got, want);
        fail();
    }
}

static const float gk[6][3] = {{1, 0, 2}, {0.5f, 0.5f, 0.5f}, {2, 1, 0}, {0, 0.1f, 0.2f}, {1, 1, 1}, {3, 0, 0}};
static const float gv[6][3] = {{0.2f, 0.1f, 0}, {1, 1, 0}, {0.5f, 0, 0.5f}, {2, 0, 0}, {0, 0.3f, 0.4f}, {1, 2, 2}};

static void test_gcur_scores(void **state) {
    (void)state;
    double score[6], nu[6];
    kvs_cur_opts o = {.type = KVS_CUR_KEY, .local_w = 2, .sinks = 0};
    /* key leverage alone, locally normalised, then divided by its total (3 windows of 1 each: total 3) */
    kvs_cur_scores(&gk[0][0], &gv[0][0], NULL, 6, 3, &o, score, nu);
    const double kap[6] = {0.8695652, 0.1304348, 0.990099, 0.00990099, 0.25, 0.75};
    const double nul[6] = {0.02439024, 0.9756098, 0.1111111, 0.8888889, 0.02702703, 0.972973};
    for (int j = 0; j < 6; j++) assert_close(score[j] * 3, kap[j], "local kappa");
    for (int j = 0; j < 6; j++) assert_close(nu[j], nul[j], "local nu");
    o.type = KVS_CUR_KV_PRODUCT;
    o.sinks = 1;
    kvs_cur_scores(&gk[0][0], &gv[0][0], NULL, 6, 3, &o, score, nu);
    const double prod[6] = {1, 0.1267767, 0.1095988, 0.008767906, 0.006731442, 0.7269957};
    for (int j = 0; j < 6; j++) assert_close(score[j], prod[j], "normalised product");
    o.local_w = 0;
    kvs_cur_scores(&gk[0][0], &gv[0][0], NULL, 6, 3, &o, score, nu);
    const double plain[6] = {1, 0.01740139, 0.02900232, 0.002320186, 0.008700696, 0.9396752};
    for (int j = 0; j < 6; j++) assert_close(score[j], plain[j], "product without local normalisation");
}

/* The policy on the 6-token prompt with budget 3: stored() after prefill. */
static void gcur_policy(const char *spec, const int32_t want[3]) {
    float q[6][3] = {{0}};
    kvs_policy_model m = {.n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .group = 1, .head_dim = 3, .scale = 0.5f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = 6, .prompt_len = 6};
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_OK);
    kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = 3, .budget_nominal = 3};
    void *st = NULL;
    assert_int_equal(cfg.ops->create(&init, &st), KVS_OK);
    kvs_policy_view view = {.n = 6, .group = 1, .head_dim = 3, .scale = 0.5f, .k = &gk[0][0], .v = &gv[0][0],
                            .q = &q[0][0], .q_first = 0, .n_q = 6, .turn_begin = 0, .prompt_end = 6, .last_block = 1};
    assert_int_equal(cfg.ops->prefill(st, &view), KVS_OK);
    int32_t held[8];
    assert_int_equal(cfg.ops->stored(st, 0, held), 3);
    assert_memory_equal(held, want, 3 * sizeof(int32_t));
    cfg.ops->free(st);
}

static void test_gcur_through_the_policy(void **state) {
    (void)state;
    const int32_t local[3] = {0, 1, 5}, plain[3] = {0, 2, 5};
    gcur_policy("cur:local_w=2,sinks=1", local);
    gcur_policy("cur:local_w=0,sinks=1", plain);
}

/* Direct drive on a generated stream with one KV head (rows of one layer are contiguous): the positions held
 * after a prefill of the first n positions. */
static int64_t held_after_prefill(const char *spec, const kvs_test_replay_fixture *f, const float *q, int layer,
                                  int64_t n, int64_t budget, int32_t *held) {
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_OK);
    kvs_policy_init init = {.model = &f->mem.model, .cfg = &cfg, .layer = layer, .budget = budget,
                            .budget_nominal = budget};
    void *st = NULL;
    assert_int_equal(cfg.ops->create(&init, &st), KVS_OK);
    size_t lo = (size_t)layer * (size_t)f->N * (size_t)f->d;
    kvs_policy_view view = {.n = n, .group = f->G, .head_dim = f->d, .scale = f->scale, .k = f->g->k + lo,
                            .v = f->g->v + lo, .q = q + lo * (size_t)f->G, .q_first = 0, .n_q = n, .turn_begin = 0,
                            .prompt_end = n, .last_block = 1};
    assert_int_equal(cfg.ops->prefill(st, &view), KVS_OK);
    int64_t c = cfg.ops->stored(st, 0, held);
    cfg.ops->free(st);
    return c;
}

static void one_head_fixture(kvs_test_replay_fixture *f, uint64_t seed) {
    kvs_gen_trace_opts go = kvs_gen_trace_defaults();
    go.n_positions = 40;
    go.n_kv_heads = 1;
    go.n_heads = 2;
    go.head_dim = 8;
    go.n_layers = 2;
    go.seed = seed;
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 8, f), KVS_OK);
}

/* The sketch: an identity Γ (r = d) gives the exact row norms; the policy's Γ is a function of the layer only. */
static void test_sketch(void **state) {
    (void)state;
    kvs_test_replay_fixture f;
    one_head_fixture(&f, 3);
    float eye[8 * 8] = {0};
    for (int i = 0; i < 8; i++) eye[i * 8 + i] = 1;
    double a[30], b[30], nu[30];
    kvs_cur_opts o = {.type = KVS_CUR_KV_PRODUCT, .local_w = 16, .sinks = 4};
    kvs_cur_scores(f.g->k, f.g->v, NULL, 30, 8, &o, a, nu);
    o.proj_r = 8;
    o.gamma = eye;
    kvs_cur_scores(f.g->k, f.g->v, NULL, 30, 8, &o, b, nu);
    for (int j = 0; j < 30; j++) assert_close(b[j], a[j], "identity sketch");
    int32_t h0[64], h1[64], h2[64];
    assert_int_equal(held_after_prefill("cur:proj_r=2", &f, f.g->q, 0, 30, 10, h0), 10);
    assert_int_equal(held_after_prefill("cur:proj_r=2", &f, f.g->q, 0, 30, 10, h1), 10);
    assert_memory_equal(h0, h1, 10 * sizeof(int32_t));
    /* layer 1's keys scored under layer 0's Γ would be a different run; here: the sketch changes the choice */
    assert_int_equal(held_after_prefill("cur:proj_r=0", &f, f.g->q, 0, 30, 10, h2), 10);
    assert_memory_not_equal(h0, h2, 10 * sizeof(int32_t));
    kvs_test_replay_fixture_free(&f);
}

/* Attention-free: every query replaced, the same positions kept. */
static void test_attention_free(void **state) {
    (void)state;
    kvs_test_replay_fixture f;
    one_head_fixture(&f, 4);
    size_t nq = (size_t)f.L * (size_t)f.N * (size_t)f.H * (size_t)f.d;
    float *q2 = malloc(nq * sizeof(float));
    assert_non_null(q2);
    for (size_t i = 0; i < nq; i++) q2[i] = -2.0f * f.g->q[i] + 0.25f;
    int32_t h0[64], h1[64];
    for (int l = 0; l < 2; l++) {
        assert_int_equal(held_after_prefill("cur:local_w=4", &f, f.g->q, l, 30, 9, h0), 9);
        assert_int_equal(held_after_prefill("cur:local_w=4", &f, q2, l, 30, 9, h1), 9);
        assert_memory_equal(h0, h1, 9 * sizeof(int32_t));
    }
    free(q2);
    kvs_test_replay_fixture_free(&f);
}

/* ---- through the engine ------------------------------------------------------------------------------ */

static kvs_replay_result *run_one(const kvs_replay_mem *mem, const char *spec, int64_t budget) {
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_OK);
    kvs_replay_config rc = {.policy = cfg, .budget = budget, .budget_fraction = -1};
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(mem, &src), KVS_OK);
    kvs_replay_opts o = {.configs = &rc, .n_configs = 1, .threads = 1, .measure = KVS_MEASURE_DECODE};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
    assert_int_equal(r->runs[0].status, KVS_OK);
    return r;
}

static void test_prompt_only_and_lossless(void **state) {
    (void)state;
    kvs_test_replay_fixture f;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(1, 2, 60, 30, 8, 11);
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 11, &f), KVS_OK);
    /* budget 30 covers the 30-position prompt: the full cache's selections, error 0 */
    kvs_replay_result *r = run_one(&f.mem, "cur", 30);
    assert_true(r->runs[0].run_agg.out_err.mean == 0.0);
    assert_true(r->runs[0].max_attended == 60);
    kvs_replay_result_free(r);
    /* budget 8: the attended set at the last step is 8 prompt + 30 generated */
    r = run_one(&f.mem, "cur", 8);
    assert_true(r->runs[0].run_agg.out_err.mean > 0.0);
    assert_true(r->runs[0].max_attended == 38);
    kvs_replay_result_free(r);
    kvs_test_replay_fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gcur_scores),
        cmocka_unit_test(test_gcur_through_the_policy),
        cmocka_unit_test(test_sketch),
        cmocka_unit_test(test_prompt_only_and_lossless),
        cmocka_unit_test(test_attention_free),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
