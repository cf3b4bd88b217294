/* test_simlayerkv.c — SimLayerKV (policies/simlayerkv.c, ../shared/POLICY_SPEC_2.md §2.6):
 *  - golden example G-SLK: λ = 0.775 (decode1) and 0.675 (prefill_last) on the spec's two rows, and the decisions at
 *    δ = 0.7, 0.9 (Llama-3) and 0.65 (Llama-2), through the score and through the presets' thresholds;
 *  - the per-layer decision through the engine on a generated trace, against λ recomputed here from the generator's
 *    own q/k in double (a naive softmax of the first generated query, or the last prompt query, of every head of the
 *    layer): δ is set between two layers' λ so that some layers are lazy and some not; lazy layers then attend
 *    exactly n_init + n_recent positions (sliding) or grow by one per step after the trim (once), the others all;
 *  - the first decode step attends everything under decode1 (the detection needs the full attention);
 *  - validate() of the budgeted mode and the no-op note of n_recent = 1024 on short traces.
 * Data: the spec's hand-set rows or GENERATED Gaussian streams (tests/util/gen_trace.h), never a model's.
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

#include "../policies/registry.h"
#include "../policies/simlayerkv_internal.h"
#include "../sim/policy.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"

static void test_gslk(void **state) {
    (void)state;
    const double a0[10] = {0.30, 0.05, 0.05, 0.02, 0.03, 0.05, 0.10, 0.15, 0.10, 0.15};
    const double a1[10] = {0.50, 0.02, 0.02, 0.02, 0.02, 0.02, 0.05, 0.05, 0.10, 0.20};
    double mean[10];
    for (int j = 0; j < 10; j++) mean[j] = (a0[j] + a1[j]) / 2.0;
    double d1 = kvs_slk_lazy_score(mean, 10, 1, 3, 0), pl = kvs_slk_lazy_score(mean, 10, 1, 3, 1);
    assert_true(fabs(d1 - 0.775) < 1e-12);
    assert_true(fabs(pl - 0.675) < 1e-12);
    assert_true(d1 > 0.7 && !(pl > 0.7));
    /* the presets' thresholds: Llama-3 flags neither, Llama-2 both */
    kvs_policy_config c3, c2;
    assert_int_equal(kvs_policy_parse("simlayerkv@llama3", &c3), KVS_OK);
    assert_int_equal(kvs_policy_parse("simlayerkv@llama2", &c2), KVS_OK);
    double t3 = kvs_policy_param_get(&c3, "delta"), t2 = kvs_policy_param_get(&c2, "delta");
    assert_true(!(d1 > t3) && !(pl > t3));
    assert_true(d1 > t2 && pl > t2);
    /* overlap counted twice when n < n_init + n_recent (REF) */
    assert_true(kvs_slk_lazy_score(mean, 10, 4, 8, 0) > 1.0);
}

/* ---- through the engine ------------------------------------------------------------------------ */

enum { NL = 4, NINIT = 2, NREC = 10, NPOS = 100, PROMPT = 60 };

/* λ of every layer from the generator's q/k: query position qp over keys 0..qp, own column dropped if prefill_last. */
static void naive_lambda(const kvs_test_replay_fixture *f, int64_t qp, int prefill_last, double *lambda) {
    for (int l = 0; l < f->L; l++) {
        double sum = 0;
        for (int h = 0; h < f->H; h++) {
            int kvh = h / f->G;
            const float *q = f->g->q + (((size_t)l * (size_t)f->N + (size_t)qp) * (size_t)f->H + (size_t)h) * (size_t)f->d;
            double p[NPOS], mx = -INFINITY, z = 0;
            for (int64_t j = 0; j <= qp; j++) {
                const float *k =
                    f->g->k + (((size_t)l * (size_t)f->N + (size_t)j) * (size_t)f->Hkv + (size_t)kvh) * (size_t)f->d;
                double s = 0;
                for (int i = 0; i < f->d; i++) s += (double)q[i] * (double)k[i];
                p[j] = s * (double)f->scale;
                if (p[j] > mx) mx = p[j];
            }
            for (int64_t j = 0; j <= qp; j++) z += (p[j] = exp(p[j] - mx));
            int64_t cols = prefill_last ? qp : qp + 1;
            for (int64_t j = 0; j < cols; j++)
                if (j < NINIT || j >= cols - NREC) sum += p[j] / z;
        }
        lambda[l] = sum / (double)f->H;
    }
}

typedef struct {
    int64_t first[NL], last[NL]; /* attended count at the first decode step and at the last position, KV head 0 */
    int64_t last_pos;
} slk_rec;

static void slk_on_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    slk_rec *r = user;
    (void)config;
    if (kv_head != 0) return;
    if (pos == PROMPT) r->first[layer] = sel->n[0];
    if (pos == r->last_pos) r->last[layer] = sel->n[0];
}

static void run_mode(const char *mode, int prefill_last, int once) {
    kvs_gen_trace_opts o = kvs_test_grouped_opts(1, 2, NPOS, PROMPT, 8, 11);
    o.n_layers = NL;
    kvs_test_replay_fixture f;
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 11, &f), KVS_OK);
    double lambda[NL], sorted[NL];
    naive_lambda(&f, prefill_last ? PROMPT - 1 : PROMPT, prefill_last, lambda);
    memcpy(sorted, lambda, sizeof sorted);
    for (int i = 0; i < NL; i++)
        for (int j = i + 1; j < NL; j++)
            if (sorted[j] < sorted[i]) {
                double t = sorted[i];
                sorted[i] = sorted[j];
                sorted[j] = t;
            }
    double delta = (sorted[1] + sorted[2]) / 2.0; /* two layers lazy, two not */
    assert_true(sorted[2] - sorted[1] > 1e-6);
    char spec[256];
    snprintf(spec, sizeof spec, "simlayerkv:n_init=%d,n_recent=%d,delta=%.17g,%s", NINIT, NREC, delta, mode);
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_OK);
    slk_rec rec = {.last_pos = NPOS - 1};
    kvs_replay_hooks hooks = {.user = &rec, .on_select = slk_on_select};
    kvs_replay_config rc = {.policy = cfg, .budget = 16, .budget_fraction = -1};
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    kvs_replay_opts ro = {.configs = &rc, .n_configs = 1, .threads = 1, .measure = KVS_MEASURE_DECODE, .hooks = &hooks};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &ro, &r), KVS_OK);
    assert_int_equal(r->runs[0].status, KVS_OK);
    kvs_replay_result_free(r);
    int lazy_seen = 0;
    for (int l = 0; l < NL; l++) {
        int lazy = lambda[l] > delta;
        lazy_seen += lazy;
        int64_t full_first = PROMPT + 1, full_last = NPOS;
        if (!prefill_last || !lazy) assert_int_equal(rec.first[l], full_first);
        else assert_int_equal(rec.first[l], NINIT + NREC);
        if (!lazy) assert_int_equal(rec.last[l], full_last);
        else if (!once) assert_int_equal(rec.last[l], NINIT + NREC);
        else assert_int_equal(rec.last[l], NINIT + NREC + (NPOS - 1 - PROMPT)); /* trimmed once, then grown */
    }
    assert_int_equal(lazy_seen, 2);
    kvs_test_replay_fixture_free(&f);
}

static void test_decode1_sliding_matches_naive_lambda(void **state) {
    (void)state;
    run_mode("detect=decode1,lazy_evict=sliding", 0, 0);
}
static void test_decode1_once_matches_naive_lambda(void **state) {
    (void)state;
    run_mode("detect=decode1,lazy_evict=once", 0, 1);
}
static void test_prefill_last_sliding_matches_naive_lambda(void **state) {
    (void)state;
    run_mode("detect=prefill_last,lazy_evict=sliding", 1, 0);
}

/* kvsim's kvpress preset: detected on the last prompt query, trimmed to n_init + n_recent − 1 prompt positions at
 * prefill, then grown by one per step. */
static void test_prefill_last_once_matches_naive_lambda(void **state) {
    (void)state;
    run_mode("detect=prefill_last,lazy_evict=once", 1, 1);
}

static void test_validate_and_notes(void **state) {
    (void)state;
    kvs_policy_config cfg;
    kvs_policy_model m = {.n_layers = 2, .n_heads = 2, .n_kv_heads = 1, .group = 2, .head_dim = 4, .scale = 0.5f,
                          .n_positions = 500, .prompt_len = 200};
    char buf[512];
    assert_int_equal(kvs_policy_parse("simlayerkv", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 64, buf, sizeof buf), 1);
    assert_non_null(strstr(buf, "n_init + n_recent = 1028 covers the trace's 500 positions"));
    assert_int_equal(kvs_policy_parse("simlayerkv:n_recent=0", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 64, buf, sizeof buf), 0);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 4), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "needs budget 4 > n_init=4"));
    assert_int_equal(kvs_policy_validate(&cfg, &m, 5), KVS_OK);
}

/* Sliding-window layers: the lazy score is the attention the windowed layer computes, by position. A 10-position
 * prompt, window 6 (the host's first = 5 before the prefill; the last prompt query attends 4..9), n_init 2, n_recent 2,
 * delta 0.3. Key 0 would take almost all of a full layer's attention (lazy: sink mass > 0.99) but lies outside the
 * window; inside it key 4 (the host already evicted it for the next token, but the last prompt query attends it)
 * dominates, so the recent mass is ~0.01 and the layer is not lazy (without key 4 the row would be uniform over 5..9,
 * recent mass 0.4: lazy): it keeps its window 5..9 (a lazy one would keep 7..9: n_recent - 1 + the 2 initial slots
 * the window took). decode1: the first decode
 * step's probabilities over 5..10 put 0.94 on position 5 and 0.012 elsewhere: not lazy (0.024 on 9 and 10), window
 * 6..10 kept (a row read by selection index would give position 0 the 0.94 and call the layer lazy: 7..10). */
static void test_window_lazy_score_by_position(void **state) {
    (void)state;
    enum { D = 2, P = 10, W = 6 };
    float k[(P + 1) * D] = {0}, v[(P + 1) * D] = {0}, q[(P + 1) * D] = {0};
    k[0] = 10.0f; /* key 0: (10, 0) */
    k[4 * D] = 5.0f; /* key 4: (5, 0) */
    for (int p = 0; p <= P; p++) q[p * D] = 1.0f;
    kvs_policy_model m = {.n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .group = 1, .head_dim = D, .scale = 1.0f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = P + 1, .prompt_len = P};
    static const char *const specs[2] = {"simlayerkv:detect=prefill_last,n_init=2,n_recent=2,delta=0.3",
                                         "simlayerkv:detect=decode1,n_init=2,n_recent=2,delta=0.3"};
    for (int t = 0; t < 2; t++) {
        kvs_policy_config cfg;
        assert_int_equal(kvs_policy_parse(specs[t], &cfg), KVS_OK);
        kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = 8, .budget_nominal = 8};
        void *st = NULL;
        assert_int_equal(cfg.ops->create(&init, &st), KVS_OK);
        void *states[1] = {st};
        assert_int_equal(cfg.ops->window_evict(st, P - W + 1), KVS_OK);
        kvs_policy_view pv = {.n = P, .group = 1, .head_dim = D, .scale = 1.0f, .k = k, .v = v, .q = q, .q_first = 0,
                              .n_q = P, .turn_begin = 0, .prompt_end = P, .block_begin = 0, .last_block = 1};
        assert_int_equal(cfg.ops->prefill(st, &pv), KVS_OK);
        assert_int_equal(cfg.ops->layer_sync(states, 1, KVS_SYNC_PREFILL), KVS_OK);
        int32_t out[P + 1];
        if (t == 0) {
            static const int32_t want[5] = {5, 6, 7, 8, 9};
            assert_int_equal(cfg.ops->stored(st, 0, out), 5);
            assert_memory_equal(out, want, sizeof want);
            cfg.ops->free(st);
            continue;
        }
        int32_t buf[P + 1], *idx[1] = {buf};
        int64_t nsel[1];
        kvs_policy_sel sel = {.idx = idx, .n = nsel, .n_lists = 1, .cap = P + 1};
        kvs_policy_view dv = {.n = P + 1, .group = 1, .head_dim = D, .scale = 1.0f, .k = k, .v = v, .q = q + P * D,
                              .q_first = P, .n_q = 1, .turn_begin = 0, .prompt_end = P, .block_begin = P, .last_block = 1};
        assert_int_equal(cfg.ops->select(st, &dv, &sel), KVS_OK);
        assert_int_equal(nsel[0], 6); /* 5..10 */
        assert_int_equal(buf[0], 5);
        assert_int_equal(cfg.ops->window_evict(st, P + 2 - W), KVS_OK);
        const float row[6] = {0.94f, 0.012f, 0.012f, 0.012f, 0.012f, 0.012f}, *probs[1] = {row};
        assert_int_equal(cfg.ops->observe(st, &dv, &sel, probs), KVS_OK);
        assert_int_equal(cfg.ops->layer_sync(states, 1, KVS_SYNC_DECODE), KVS_OK);
        static const int32_t want[5] = {6, 7, 8, 9, 10};
        assert_int_equal(cfg.ops->stored(st, 0, out), 5);
        assert_memory_equal(out, want, sizeof want);
        cfg.ops->free(st);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gslk),
        cmocka_unit_test(test_window_lazy_score_by_position),
        cmocka_unit_test(test_decode1_sliding_matches_naive_lambda),
        cmocka_unit_test(test_decode1_once_matches_naive_lambda),
        cmocka_unit_test(test_prefill_last_sliding_matches_naive_lambda),
        cmocka_unit_test(test_prefill_last_once_matches_naive_lambda),
        cmocka_unit_test(test_validate_and_notes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
