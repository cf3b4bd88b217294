/* test_lagkv.c — LagKV (policies/lagkv.c, ../shared/POLICY_SPEC_2.md §2.4):
 *  - golden example G-LAG: the key and value partition scores of partitions {2,3,4} and {5,6,7} against their lag
 *    references, and the policy's resident set {0, 1, 2, 5, 8, 9, 10, 11} after the 12-token prefill (S 2, L 3,
 *    r 0.5);
 *  - the resident size |Res(n)| = S + ⌊rL⌋·m(n) + tail(n) of §2.4 at every decode step of a long generated stream,
 *    recomputed here from the formula, and use_then_compress: the triggering step attends the uncompressed cache
 *    (one more than the previous step), with 0 the compressed one;
 *  - attention-free (claim LG4): every query replaced, the same positions kept at every step;
 *  - r = 1 keeps everything (lossless).
 * Data: hand-set arrays (G-LAG) and GENERATED Gaussian streams (tests/util/gen_trace.h).
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

#include "../policies/held.h"
#include "../policies/lagkv_internal.h"
#include "../policies/registry.h"
#include "../sim/policy.h"
#include "util/replay_fixture.h"

static void assert_close(double got, double want, const char *what) {
    if (!(fabs(got - want) <= 2e-6 * fabs(want) + 1e-9)) {
        print_error("%s: got %.9g, want %.9g\n", what, got, want);
        fail();
    }
}

static const float gk[12][4] = {{2, -2.6f, 0.4f, -0.6f}, {-0.5f, -0.2f, -2, -0.2f}, {-0.9f, 3.3f, 0.2f, -0.4f},
                                {-0.3f, -0.7f, -1.1f, -0.4f}, {0.5f, -0.2f, 1, -0.2f}, {0, 1.5f, 0.5f, -0.5f},
                                {-0.2f, 0.5f, 1.9f, -0.3f}, {-0.2f, 1, -0.9f, -0.3f}, {0.9f, 0.6f, 0.1f, 0.7f},
                                {-2.8f, 1, -1, -1.7f}, {0.3f, 0.7f, -0.4f, -1.1f}, {0, -0.1f, 1.4f, 0.7f}};
static const float gv[12][4] = {{0.2f, 1.1f, -0.2f, -0.9f}, {0.6f, 0.6f, -0.2f, -0.8f}, {0.2f, -2.5f, 0.7f, 0.5f},
                                {-1.6f, 0.1f, -1, 0.8f}, {-2, -0.9f, 0.7f, 1.2f}, {-2.2f, -0.5f, 0.3f, -0.6f},
                                {1.6f, -1.2f, 0.4f, -1}, {1.4f, 0, -0.4f, -1.7f}, {1.7f, 0.8f, 0.8f, 1.1f},
                                {0.3f, -0.6f, -0.8f, -0.8f}, {1.4f, -1.5f, -0.6f, -0.3f}, {0.2f, 0.6f, -1.2f, -1.7f}};

static void test_glag_scores(void **state) {
    (void)state;
    const int32_t p0[3] = {2, 3, 4}, r0[3] = {5, 6, 7}, p1[3] = {5, 6, 7}, r1[3] = {8, 9, 10};
    double sk[3], sv[3];
    kvs_lagkv_partition_scores(&gk[0][0], p0, 3, r0, 3, 4, sk);
    kvs_lagkv_partition_scores(&gv[0][0], p0, 3, r0, 3, 4, sv);
    const double wk0[3] = {0.6350714, 0.09532817, 0.2696004}, wv0[3] = {0.3534572, 0.3398031, 0.3067397};
    const double ws0[3] = {0.9885286, 0.4351313, 0.5763401};
    for (int i = 0; i < 3; i++) {
        assert_close(sk[i], wk0[i], "sc_K {2,3,4}");
        assert_close(sv[i], wv0[i], "sc_V {2,3,4}");
        assert_close(sk[i] + sv[i], ws0[i], "score {2,3,4}");
    }
    kvs_lagkv_partition_scores(&gk[0][0], p1, 3, r1, 3, 4, sk);
    kvs_lagkv_partition_scores(&gv[0][0], p1, 3, r1, 3, 4, sv);
    const double wk1[3] = {0.3096649, 0.4825893, 0.2077457}, wv1[3] = {0.4750371, 0.2528201, 0.2721428};
    const double ws1[3] = {0.784702, 0.7354094, 0.4798886};
    for (int i = 0; i < 3; i++) {
        assert_close(sk[i], wk1[i], "sc_K {5,6,7}");
        assert_close(sv[i], wv1[i], "sc_V {5,6,7}");
        assert_close(sk[i] + sv[i], ws1[i], "score {5,6,7}");
    }
}

static void test_glag_through_the_policy(void **state) {
    (void)state;
    float q[12][4] = {{0}};
    kvs_policy_model m = {.n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .group = 1, .head_dim = 4, .scale = 0.5f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = 12, .prompt_len = 12};
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse("lagkv:sink=2,lag=3,ratio=0.5", &cfg), KVS_OK);
    kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = 5, .budget_nominal = 5};
    void *st = NULL;
    assert_int_equal(cfg.ops->create(&init, &st), KVS_OK);
    kvs_policy_view view = {.n = 12, .group = 1, .head_dim = 4, .scale = 0.5f, .k = &gk[0][0], .v = &gv[0][0],
                            .q = &q[0][0], .q_first = 0, .n_q = 12, .turn_begin = 0, .prompt_end = 12, .last_block = 1};
    assert_int_equal(cfg.ops->prefill(st, &view), KVS_OK);
    int32_t held[16];
    const int32_t want[8] = {0, 1, 2, 5, 8, 9, 10, 11};
    assert_int_equal(cfg.ops->stored(st, 0, held), 8);
    assert_memory_equal(held, want, sizeof want);
    cfg.ops->free(st);
}

/* ---- a long stream driven directly --------------------------------------------------------------------- */

typedef struct {
    kvs_test_replay_fixture f;
    int32_t *buf, *held;
    const float **rk, **rv;
    kvs_policy_sel sel;
    int32_t *lists[1];
    const float **rks[1], **rvs[1];
    int64_t cnt[1];
} stream;

static void stream_make(stream *s, uint64_t seed, int n_pos, int prompt) {
    kvs_gen_trace_opts go = kvs_gen_trace_defaults();
    go.n_positions = n_pos;
    go.prompt_len = prompt;
    go.n_kv_heads = 1;
    go.n_heads = 2;
    go.head_dim = 8;
    go.n_layers = 1;
    go.seed = seed;
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 16, &s->f), KVS_OK);
    s->buf = calloc((size_t)n_pos, sizeof(int32_t));
    s->held = calloc((size_t)n_pos, sizeof(int32_t));
    s->rk = calloc((size_t)n_pos, sizeof *s->rk);
    s->rv = calloc((size_t)n_pos, sizeof *s->rv);
    assert_true(s->buf && s->held && s->rk && s->rv);
    s->lists[0] = s->buf;
    s->rks[0] = s->rk;
    s->rvs[0] = s->rv;
    s->sel = (kvs_policy_sel){.idx = s->lists, .n = s->cnt, .n_lists = 1, .cap = n_pos, .row_k = s->rks,
                              .row_v = s->rvs};
}

static void stream_free(stream *s) {
    kvs_test_replay_fixture_free(&s->f);
    free(s->buf);
    free(s->held);
    free(s->rk);
    free(s->rv);
}

static kvs_policy_view view_at(const stream *s, const float *q, int64_t n, int64_t prompt) {
    const kvs_test_replay_fixture *f = &s->f;
    int prefill = n == prompt;
    return (kvs_policy_view){.n = n, .group = f->G, .head_dim = f->d, .scale = f->scale, .k = f->g->k, .v = f->g->v,
                             .q = prefill ? q : q + (size_t)(n - 1) * (size_t)f->G * (size_t)f->d,
                             .q_first = prefill ? 0 : n - 1, .n_q = prefill ? n : 1, .turn_begin = 0,
                             .prompt_end = prompt, .block_begin = prefill ? 0 : n - 1, .last_block = 1};
}

static int64_t formula(int64_t n, int64_t S, int64_t L, int64_t keep) {
    if (n < S + 2 * L) return n;
    int64_t m = (n - S) / L - 1;
    return S + keep * m + (n - S) - m * L;
}

/* Runs spec over the stream; attended[p] and held[p] (counts) at every decode position p. */
static void run_stream(stream *s, const char *spec, const float *q, int64_t prompt, int64_t *attended,
                       int64_t *n_held, int32_t *last_held) {
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_OK);
    kvs_policy_init init = {.model = &s->f.mem.model, .cfg = &cfg, .budget = 8, .budget_nominal = 8};
    void *st = NULL;
    assert_int_equal(cfg.ops->create(&init, &st), KVS_OK);
    kvs_policy_view v = view_at(s, q, prompt, prompt);
    assert_int_equal(cfg.ops->prefill(st, &v), KVS_OK);
    for (int64_t p = prompt; p < s->f.N; p++) {
        v = view_at(s, q, p + 1, prompt);
        assert_int_equal(cfg.ops->select(st, &v, &s->sel), KVS_OK);
        attended[p] = s->cnt[0];
        n_held[p] = cfg.ops->stored(st, 0, s->held);
    }
    if (last_held) memcpy(last_held, s->held, (size_t)n_held[s->f.N - 1] * sizeof(int32_t));
    cfg.ops->free(st);
}

static void test_resident_size_follows_the_formula(void **state) {
    (void)state;
    stream s;
    stream_make(&s, 21, 300, 50);
    int64_t att[300], held[300];
    const int64_t S = 4, L = 16, keep = 8; /* ratio 0.5 */
    run_stream(&s, "lagkv:sink=4,lag=16,ratio=0.5", s.f.g->q, 50, att, held, NULL);
    int triggers = 0;
    for (int64_t p = 50; p < 300; p++) {
        int64_t n = p + 1;
        assert_int_equal(held[p], formula(n, S, L, keep));
        /* use_then_compress: the step attends what it held before plus itself */
        assert_int_equal(att[p], formula(n - 1, S, L, keep) + 1);
        triggers += att[p] != held[p];
    }
    assert_true(triggers >= 250 / 16 - 1);
    /* use_then_compress = 0: every step attends the compressed set */
    run_stream(&s, "lagkv:sink=4,lag=16,ratio=0.5,use_then_compress=0", s.f.g->q, 50, att, held, NULL);
    for (int64_t p = 50; p < 300; p++) assert_int_equal(att[p], formula(p + 1, S, L, keep));
    /* ratio 1 keeps everything */
    run_stream(&s, "lagkv:sink=4,lag=16,ratio=1", s.f.g->q, 50, att, held, NULL);
    for (int64_t p = 50; p < 300; p++) assert_int_equal(held[p], p + 1);
    stream_free(&s);
}

/* Sliding-window layers: the policy against a plain model of the recursive rule written with a flag per held entry
 * (sink or compressed: never scored again) instead of the policy's `base` index. The host's window (W) drops the
 * entries before p - W + 1: before the prefill (a prompt longer than the window: its sinks never arrive), and at
 * every decode step, where use_then_compress's compression runs after that drop once the window moves (before it,
 * in select(), as on a full layer). The scored partitions are the runs of L unflagged entries, oldest first, the
 * last full one their reference. Windows 40, 23 (longer than the prompt's window), 64 (it moves during decode), 12
 * and 13 (so short that the edge eats the uncompressed tail, where compressing before or after the drop differ).
 * Every step's selection and stored set must match. */
typedef struct {
    int32_t pos[400];
    char done[400];
    int64_t n;
} lag_model;

static void model_drop(lag_model *m, int64_t first) {
    int64_t w = 0;
    for (int64_t j = 0; j < m->n; j++)
        if (m->pos[j] >= first) m->pos[w] = m->pos[j], m->done[w++] = m->done[j];
    m->n = w;
}

static void model_compress(lag_model *m, const float *k, const float *v, int d, int64_t L, int64_t keep) {
    int64_t u = 0; /* the first unflagged entry: flagged ones precede it */
    while (u < m->n && m->done[u]) u++;
    for (int64_t j = u; j < m->n; j++) assert_false(m->done[j]);
    int64_t M = (m->n - u) / L;
    if (M < 2) return;
    char keepm[400];
    memset(keepm, 1, sizeof keepm);
    double sk[64], sv[64];
    int32_t scratch[64];
    for (int64_t p = 0; p + 1 < M; p++) {
        const int32_t *part = m->pos + u + p * L;
        kvs_lagkv_partition_scores(k, part, L, part + L, L, d, sk);
        kvs_lagkv_partition_scores(v, part, L, part + L, L, d, sv);
        for (int64_t i = 0; i < L; i++) sk[i] += sv[i]; /* v_weight 1 */
        kvs_held_top_mask(sk, L, keep, keepm + u + p * L, scratch);
        for (int64_t i = 0; i < L; i++) m->done[u + p * L + i] = 1;
    }
    int64_t w = 0;
    for (int64_t j = 0; j < m->n; j++)
        if (keepm[j]) m->pos[w] = m->pos[j], m->done[w++] = m->done[j];
    m->n = w;
}

static void test_window_against_a_flagged_model(void **state) {
    (void)state;
    enum { N = 300, P = 50 };
    static const int64_t windows[5] = {40, 23, 64, 12, 13}; /* 12, 13: the edge reaches the uncompressed tail */
    static const char *const specs[2] = {"lagkv:sink=4,lag=6,ratio=0.5", "lagkv:sink=4,lag=6,ratio=0.5,use_then_compress=0"};
    const int64_t S = 4, L = 6, keep = 3;
    stream s;
    stream_make(&s, 23, N, P);
    const float *k = s.f.g->k, *v = s.f.g->v;
    int d = s.f.d;
    int64_t checked = 0;
    for (int wi = 0; wi < 5; wi++)
        for (int si = 0; si < 2; si++) {
            int64_t W = windows[wi];
            int use_then = si == 0;
            kvs_policy_config cfg;
            assert_int_equal(kvs_policy_parse(specs[si], &cfg), KVS_OK);
            kvs_policy_init init = {.model = &s.f.mem.model, .cfg = &cfg, .budget = 8, .budget_nominal = 8};
            void *st = NULL;
            assert_int_equal(cfg.ops->create(&init, &st), KVS_OK);
            lag_model m = {.n = 0};
            int64_t first = P - W + 1 > 0 ? P - W + 1 : 0;
            if (first > 0) assert_int_equal(cfg.ops->window_evict(st, first), KVS_OK);
            kvs_policy_view pv = view_at(&s, s.f.g->q, P, P);
            assert_int_equal(cfg.ops->prefill(st, &pv), KVS_OK);
            for (int64_t p = first; p < P; p++) m.pos[m.n] = (int32_t)p, m.done[m.n++] = p < S;
            model_compress(&m, k, v, d, L, keep);
            for (int64_t p = P; p < N; p++) {
                kvs_policy_view dv = view_at(&s, s.f.g->q, p + 1, P);
                assert_int_equal(cfg.ops->select(st, &dv, &s.sel), KVS_OK);
                m.pos[m.n] = (int32_t)p, m.done[m.n++] = p < S;
                if (!use_then) model_compress(&m, k, v, d, L, keep);
                assert_int_equal(s.cnt[0], m.n);
                assert_memory_equal(s.buf, m.pos, (size_t)m.n * sizeof(int32_t));
                int moved = p + 1 - W > 0; /* the window of p already started after 0 */
                int64_t next = p + 2 - W;  /* the first position p + 1 attends */
                if (use_then && !moved) model_compress(&m, k, v, d, L, keep);
                if (next > 0) {
                    assert_int_equal(cfg.ops->window_evict(st, next), KVS_OK);
                    model_drop(&m, next);
                }
                if (use_then && moved) model_compress(&m, k, v, d, L, keep);
                int64_t ns = cfg.ops->stored(st, 0, s.held);
                assert_int_equal(ns, m.n);
                assert_memory_equal(s.held, m.pos, (size_t)m.n * sizeof(int32_t));
                checked++;
            }
            cfg.ops->free(st);
        }
    assert_true(checked == 5 * 2 * (N - P));
    stream_free(&s);
}

static void test_attention_free(void **state) {
    (void)state;
    stream s;
    stream_make(&s, 22, 200, 70);
    size_t nq = (size_t)s.f.N * (size_t)s.f.H * (size_t)s.f.d;
    float *q2 = malloc(nq * sizeof(float));
    assert_non_null(q2);
    for (size_t i = 0; i < nq; i++) q2[i] = 3.0f * s.f.g->q[i] - 1.0f;
    int64_t a1[200], h1[200], a2[200], h2[200];
    int32_t l1[200], l2[200];
    run_stream(&s, "lagkv:sink=2,lag=8,ratio=0.25", s.f.g->q, 70, a1, h1, l1);
    run_stream(&s, "lagkv:sink=2,lag=8,ratio=0.25", q2, 70, a2, h2, l2);
    assert_memory_equal(a1 + 70, a2 + 70, 130 * sizeof(int64_t));
    assert_memory_equal(h1 + 70, h2 + 70, 130 * sizeof(int64_t));
    assert_memory_equal(l1, l2, (size_t)h1[199] * sizeof(int32_t));
    free(q2);
    stream_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_glag_scores),
        cmocka_unit_test(test_glag_through_the_policy),
        cmocka_unit_test(test_resident_size_follows_the_formula),
        cmocka_unit_test(test_window_against_a_flagged_model),
        cmocka_unit_test(test_attention_free),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
