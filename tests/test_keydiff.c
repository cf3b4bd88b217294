/* test_keydiff.c — KeyDiff (policies/keydiff.c, POLICY_SPEC §2.5, §4 items 5-8) and KNorm (policies/knorm.c,
 * §2.6 B12), and the shared key scores they use (common/kvs_math.h kvs_key_scores):
 *  - golden vector G6 (POLICY_SPEC §7): Eq. 7 and Eq. 8 scores to 5 decimals, the anchor, the ratio n|mu| for
 *    every key, the keep order 3, 0, 1, 2 and N = 2 keeping keys 3 and 0, through the shared scoring function
 *    and through the policy on a hand-made 4-key stream (directly and through the replay engine);
 *  - memory: the engine's storage_peak metric never exceeds B - 1 + block positions in prefill (the whole block
 *    counted) and B in decode plus exactly the eviction's scoring temporaries, with --measure prefill and decode;
 *  - KNorm keeps exactly the smallest-norm keys seen so far, whatever the block size;
 *  - a NAIVE reference written here (dense masks, double precision, a repeated scan instead of top-k) compared
 *    selection by selection — what is attended at every decode step and what is held after every prefill block
 *    and decode step — with both policies on generated traces: anchor normalized/raw, pairwise, the window
 *    variant, several block sizes, GQA groups 1-3, one and two turns;
 *  - the sliding window's size W = floor(f (B - 1)) (the paper's N = B - 1): a hand-made stream whose
 *    protected and kept sets are written out, where floor(f B) would protect one position more;
 *  - Eq. 7 and Eq. 8 choose the same keys (§4 item 7 identity);
 *  - norms kept from a key's entry (kvs_key_norms + kvs_key_scores_normed) give kvs_key_scores' bits;
 *  - the leak check between prefill blocks (rows the policy does not hold scrambled after every block and step);
 *  - validate() and notes() messages.
 * Data: GENERATED Gaussian streams (tests/util/gen_trace.h) or hand-set arrays, never a model's.
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
#include "../sim/policy.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"

typedef kvs_test_replay_fixture fixture;

/* 5-decimal agreement with a golden value given to 5 decimals. */
static void assert_5dp(double got, double want, const char *what) {
    if (!(fabs(got - want) < 5e-6)) {
        print_error("%s: got %.8f, want %.5f\n", what, got, want);
        fail();
    }
}

/* ================================================================================================
 * G6 (POLICY_SPEC §7)
 * ============================================================================================== */

static const float g6_keys[4][2] = {{1.0f, 0.0f}, {0.9f, 0.1f}, {0.0f, 1.0f}, {-0.5f, 0.5f}};
static const double g6_eq7[4] = {-1.28678, -1.47962, -1.81754, -0.37530};
static const double g6_eq8[4] = {-0.57782, -0.66442, -0.81616, -0.16853};

static void test_g6_through_the_shared_scores(void **state) {
    (void)state;
    double s7[4], s8[4], mu[2], work[4 + 2];
    kvs_key_scores(&g6_keys[0][0], 2, NULL, 4, 2, KVS_KEY_SCORE_PAIRWISE, s7, work);
    kvs_key_scores(&g6_keys[0][0], 2, NULL, 4, 2, KVS_KEY_SCORE_ANCHOR, s8, work);
    kvs_key_anchor(&g6_keys[0][0], 2, NULL, 4, 2, 1, mu);
    assert_5dp(mu[0], 0.32169, "anchor x");
    assert_5dp(mu[1], 0.45438, "anchor y");
    double nmu = sqrt(mu[0] * mu[0] + mu[1] * mu[1]);
    assert_5dp(nmu, 0.55673, "|anchor|");
    for (int i = 0; i < 4; i++) {
        assert_5dp(s7[i], g6_eq7[i], "Eq. 7 score");
        assert_5dp(s8[i], g6_eq8[i], "Eq. 8 score");
        assert_5dp(s7[i] / s8[i], 2.22694, "Eq. 7 / Eq. 8");
        assert_5dp(4 * nmu, 2.22694, "n |anchor|");
    }
    /* keep order (best first) 3, 0, 1, 2 under both equations; N = 2 keeps 3 and 0 */
    int32_t order[4];
    const int32_t want[4] = {3, 0, 1, 2};
    kvs_topk_f64(s8, 4, 4, order);
    assert_memory_equal(order, want, sizeof want);
    kvs_topk_f64(s7, 4, 4, order);
    assert_memory_equal(order, want, sizeof want);
    kvs_topk_f64(s8, 4, 2, order);
    assert_memory_equal(order, want, 2 * sizeof(int32_t));
    /* an index list selects rows: the same keys in reverse order score the same */
    const int32_t rev[4] = {3, 2, 1, 0};
    double r8[4];
    kvs_key_scores(&g6_keys[0][0], 2, rev, 4, 2, KVS_KEY_SCORE_ANCHOR, r8, work);
    for (int i = 0; i < 4; i++) assert_5dp(r8[i], g6_eq8[3 - i], "Eq. 8 score through idx");
    /* KNorm: -|k| */
    double sn[4];
    kvs_key_scores(&g6_keys[0][0], 2, NULL, 4, 2, KVS_KEY_SCORE_L2NORM, sn, work);
    assert_5dp(sn[1], -sqrt(0.81 + 0.01), "-|k1|");
    assert_5dp(sn[3], -sqrt(0.5), "-|k3|");
}

/* kvs_key_norms against a naive fp64 norm (the sum of squares in ascending i, then sqrt) and
 * kvs_key_scores_normed with those norms against kvs_key_scores, bit for bit, for every kind: what lets
 * KeyDiff/KNorm keep a key's norm from the step it entered instead of recomputing it. Rows through
 * an index list in shuffled order, head_dims with vector tails, a zero key (the norm guard). */
static void test_kept_norms_give_the_same_scores(void **state) {
    (void)state;
    enum { N_ROWS = 41, MAX_D = 67 };
    static float keys[N_ROWS * MAX_D];
    const size_t dims[] = {1, 5, 8, 64, 67};
    uint32_t r = 12345u;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        r = r * 1664525u + 1013904223u;
        keys[i] = (float)((int32_t)(r >> 8) - (1 << 23)) / (float)(1 << 22);
    }
    int32_t idx[N_ROWS - 4];
    for (int j = 0; j < N_ROWS - 4; j++) idx[j] = (int32_t)((j * 17 + 3) % N_ROWS); /* a permutation's prefix */
    const size_t n = sizeof idx / sizeof idx[0];
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        size_t d = dims[di];
        memset(keys + (size_t)idx[2] * d, 0, d * sizeof(float)); /* a zero key */
        double norm[N_ROWS], want[N_ROWS], got[N_ROWS], work[N_ROWS + MAX_D];
        kvs_key_norms(keys, d, idx, n, d, norm);
        for (size_t j = 0; j < n; j++) {
            double ss = 0;
            for (size_t i = 0; i < d; i++) ss += (double)keys[(size_t)idx[j] * d + i] * (double)keys[(size_t)idx[j] * d + i];
            assert_true(sqrt(ss) == norm[j]);
        }
        for (int kind = KVS_KEY_SCORE_ANCHOR; kind <= KVS_KEY_SCORE_L2NORM; kind++) {
            kvs_key_scores(keys, d, idx, n, d, (kvs_key_score)kind, want, work);
            for (size_t j = 0; j < n; j++) got[j] = -1234.5;
            kvs_key_scores_normed(keys, d, idx, n, d, (kvs_key_score)kind, norm, got, work);
            assert_memory_equal(got, want, n * sizeof(double));
        }
    }
}

/* kvs_key_scores_resumed against kvs_key_scores_normed, bit for bit, as KeyDiff drives it: a held list that loses
 * a key (at its start, inside a chunk, on a chunk edge, at its end) and gains one at its end, step after step,
 * with the checkpoints lowered to the first changed key's chunk; the list crossing whole chunks both ways (40 to
 * 200 keys), both anchor kinds, head_dims 8 and 67 (vector tails). Kinds without an anchor leave the
 * checkpoints alone. */
static void test_resumed_anchor_gives_the_same_scores(void **state) {
    (void)state;
    enum { N_ROWS = 600, MAX_D = 67, CHUNK = KVS_KEY_ANCHOR_CHUNK };
    static float keys[N_ROWS * MAX_D];
    uint32_t r = 777u;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        r = r * 1664525u + 1013904223u;
        keys[i] = (float)((int32_t)(r >> 8) - (1 << 23)) / (float)(1 << 21);
    }
    const size_t dims[] = {8, 67};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (int kind = KVS_KEY_SCORE_ANCHOR; kind <= KVS_KEY_SCORE_ANCHOR_RAW; kind++) {
            size_t d = dims[di];
            static int32_t held[N_ROWS];
            static double norm[N_ROWS], want[N_ROWS], got[N_ROWS], ck[(N_ROWS / CHUNK + 1) * MAX_D];
            double work[MAX_D + 1];
            size_t n = 40, next = 40, ck_valid = 0;
            for (size_t j = 0; j < n; j++) held[j] = (int32_t)j;
            for (int step = 0; step < 400 && next < N_ROWS; step++) {
                /* grow to 200 keys, then shrink back (two out a step), then steady (one out, one in) */
                int grow = step < 160, shrink = step >= 160 && step < 240;
                if (!shrink || step % 2) held[n++] = (int32_t)next++;
                kvs_key_norms(keys, d, held, n, d, norm);
                kvs_key_scores_normed(keys, d, held, n, d, (kvs_key_score)kind, norm, want, work);
                kvs_key_scores_resumed(keys, d, held, n, d, (kvs_key_score)kind, norm, got, work, ck, &ck_valid);
                assert_memory_equal(got, want, n * sizeof(double));
                assert_int_equal(ck_valid, n / CHUNK);
                if (grow && step % 3) continue; /* nothing out: the checkpoints all hold */
                size_t outs = shrink ? 2 : 1;
                for (size_t o = 0; o < outs && n > 1; o++) {
                    size_t e;
                    switch ((step + (int)o) % 5) {
                    case 0: e = 0; break;
                    case 1: e = CHUNK < n ? CHUNK : n - 1; break; /* the first key of chunk 1 */
                    case 2: e = n - 1; break;
                    case 3: e = CHUNK - 1 < n ? CHUNK - 1 : n / 2; break; /* the last of chunk 0 */
                    default: e = (size_t)(step * 37) % n; break;
                    }
                    memmove(held + e, held + e + 1, (n - e - 1) * sizeof *held);
                    n--;
                    if (e / CHUNK < ck_valid) ck_valid = e / CHUNK;
                }
            }
            /* no anchor, no checkpoints touched */
            size_t before = ck_valid;
            kvs_key_scores_resumed(keys, d, held, n, d, KVS_KEY_SCORE_L2NORM, norm, got, work, ck, &ck_valid);
            assert_int_equal(ck_valid, before);
        }
}

/* kd_last_ranked's order over the fp64 scores, written here: the lowest, the later among equals, the last NaN
 * before any number. */
static size_t naive_last_lowest(const double *score, size_t m) {
    size_t w = 0;
    for (size_t j = 1; j < m; j++)
        if (isnan(score[j]) || (!isnan(score[w]) && score[j] <= score[w])) w = j;
    return w;
}

/* kvs_key_scores_lowest (the fp32 screen, then fp64 for the keys it cannot rule out) names the key the fp64
 * scores rank last, with its fp64 score, for every kind: random keys; near-duplicates of the key the anchor
 * leans to (cosines closer than fp32 can tell apart, so the screen alone would pick at random among them);
 * exact duplicates (a tie: the later); a zero, a NaN, an inf, a huge and a tiny key (no bound: always
 * candidates); all keys tiny (an anchor outside the screen's range: every score in fp64); a window (m < n). */
static void test_lowest_key_is_the_fp64_scores_lowest(void **state) {
    (void)state;
    enum { N = 300, MAX_D = 128 };
    static float keys[N * MAX_D];
    static int32_t held[N];
    static double norm[N], want[N], got[N], ck[(N / KVS_KEY_ANCHOR_CHUNK + 1) * MAX_D];
    static double work[N + MAX_D];
    static unsigned char scratch[(N + MAX_D) * (sizeof(double) + sizeof(float)) + 2 * N * sizeof(int32_t)];
    assert_true(kvs_key_scores_lowest_scratch_bytes(N, MAX_D) <= sizeof scratch);
    const size_t dims[] = {8, 67, 128};
    uint32_t r = 4242u;
    int screened_near_ties = 0;
    for (int trial = 0; trial < 160; trial++) {
        size_t d = dims[trial % 3], n = 2 + (size_t)(trial * 37) % (N - 2);
        int setup = trial % 8;
        for (size_t i = 0; i < n * d; i++) {
            r = r * 1664525u + 1013904223u;
            keys[i] = (float)((int32_t)(r >> 8) - (1 << 23)) / (float)(1 << 21);
        }
        if (setup == 1 || setup == 2) { /* a third of the keys one vector, each a last-bit step away or not */
            for (size_t j = 1; j < n; j += 3)
                for (size_t i = 0; i < d; i++) {
                    float v = keys[i] + 40.0f;
                    keys[j * d + i] = setup == 2 ? v : nextafterf(v, (j + i) % 2 ? INFINITY : -INFINITY);
                }
            screened_near_ties++;
        }
        if (setup == 3) { /* keys without a bound */
            keys[(n / 2) * d] = NAN;
            if (n > 3) {
                for (size_t i = 0; i < d; i++) keys[(n / 3) * d + i] = 0;
                keys[(n / 4) * d + 1] = INFINITY;
            }
        }
        if (setup == 4 && n > 4) {
            for (size_t i = 0; i < d; i++) keys[(n / 4) * d + i] *= 1e30f;
            for (size_t i = 0; i < d; i++) keys[(n / 3) * d + i] *= 1e-30f;
        }
        if (setup == 5)
            for (size_t i = 0; i < n * d; i++) keys[i] *= 1e-15f; /* |mu| below 2^-40 for the raw anchor */
        for (size_t j = 0; j < n; j++) held[j] = (int32_t)(n - 1 - j); /* held rows in any order */
        if (setup >= 6) /* ascending; setup 7 passes no index (rows in place), the same rows */
            for (size_t j = 0; j < n; j++) held[j] = (int32_t)j;
        kvs_key_norms(keys, d, held, n, d, norm);
        for (int kind = KVS_KEY_SCORE_ANCHOR; kind <= KVS_KEY_SCORE_L2NORM; kind++) {
            if (kind == KVS_KEY_SCORE_PAIRWISE && n > 80) continue;
            size_t ms[] = {n, n > 3 ? n - 3 : 1, 1};
            for (size_t mi = 0; mi < 3; mi++) {
                size_t m = ms[mi], ck_valid = 0, ck_valid_want = 0;
                kvs_key_scores_resumed(keys, d, held, n, d, (kvs_key_score)kind, norm, want, work, ck, &ck_valid_want);
                size_t w = naive_last_lowest(want, m);
                int64_t g = kvs_key_scores_lowest(keys, d, setup == 7 ? NULL : held, n, m, d, (kvs_key_score)kind,
                                                  norm, got, scratch, ck, &ck_valid);
                /* the same key, and its score's bits (a NaN as a NaN: C leaves a NaN's sign to the compiler, and
                 * -O1 and -O2 builds negate it in different places) */
                int same = (size_t)g == w &&
                           (isnan(got[g]) ? isnan(want[w]) : !memcmp(&got[g], &want[w], sizeof(double)));
                if (!same)
                    fail_msg("trial %d (setup %d, d %zu, n %zu, m %zu, kind %d): key %lld (%.17g), want %zu (%.17g)",
                             trial, setup, d, n, m, kind, (long long)g, got[g], w, want[w]);
                assert_int_equal(ck_valid, ck_valid_want);
            }
        }
    }
    assert_true(screened_near_ties > 0);
}

/* The hand-made stream: the 4 G6 keys as the prompt, then one generated position with key (0.3, -0.7). One
 * layer, one KV head, G = 1, d = 2; queries and values are irrelevant to the choice (KeyDiff is
 * attention-free) and set to simple numbers. */
typedef struct {
    float q[5][2], k[5][2], v[5][2];
    kvs_turn turn;
    kvs_replay_mem mem;
} g6_stream;

static void g6_stream_make(g6_stream *s) {
    memset(s, 0, sizeof *s);
    memcpy(s->k, g6_keys, sizeof g6_keys);
    s->k[4][0] = 0.3f;
    s->k[4][1] = -0.7f;
    for (int p = 0; p < 5; p++) {
        s->q[p][0] = 0.5f;
        s->v[p][0] = (float)p;
        s->v[p][1] = 1.0f;
    }
    s->turn = (kvs_turn){.begin = 0, .prompt_end = 4, .end = 5};
    s->mem = (kvs_replay_mem){
        .model = {.n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .group = 1, .head_dim = 2, .scale = 0.70710678f,
                  .kv_bytes = 2, .aux_bytes = 4, .n_positions = 5, .prompt_len = 4, .max_new_tokens = 1},
        .turns = &s->turn, .n_turns = 1, .q = &s->q[0][0], .k = &s->k[0][0], .v = &s->v[0][0], .block_positions = 2,
    };
}

typedef struct {
    int32_t sel[8];
    int64_t n;
} one_sel;

static void g6_on_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    (void)config;
    (void)layer;
    (void)kv_head;
    one_sel *o = user;
    assert_int_equal(pos, 4);
    assert_true(sel->n[0] <= 8);
    o->n = sel->n[0];
    memcpy(o->sel, sel->idx[0], (size_t)o->n * sizeof(int32_t));
}

/* One run; with hooks on one thread (the recorders' scrambling generator is not shared across threads). */
static kvs_replay_result *run_one(const kvs_replay_mem *mem, const kvs_policy_config *cfg, int64_t budget,
                                  kvs_replay_measure measure, const kvs_replay_hooks *hooks) {
    kvs_replay_config rc = {.policy = *cfg, .budget = budget, .budget_fraction = -1};
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(mem, &src), KVS_OK);
    kvs_replay_opts o = {.configs = &rc, .n_configs = 1, .threads = hooks ? 1 : 2, .measure = measure,
                         .series_every = 1, .hooks = hooks};
    kvs_replay_result *r = NULL;
    kvs_status st = kvs_replay_execute(&src, &o, &r);
    if (st != KVS_OK) print_error("%s\n", kvs_last_error());
    assert_int_equal(st, KVS_OK);
    if (r->runs[0].status != KVS_OK) print_error("policy %s: %s\n", cfg->ops->name, r->runs[0].error);
    assert_int_equal(r->runs[0].status, KVS_OK);
    return r;
}

static void test_g6_through_the_policy(void **state) {
    (void)state;
    g6_stream s;
    g6_stream_make(&s);
    /* Directly: one prefill of the 4 keys with capacity N = B - 1 = 2 holds keys 3 and 0. */
    const char *specs[] = {"keydiff", "keydiff:pairwise=true", "keydiff:block=4"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kvs_policy_config cfg;
        assert_int_equal(kvs_policy_parse(specs[i], &cfg), KVS_OK);
        kvs_policy_init init = {.model = &s.mem.model, .cfg = &cfg, .budget = 3, .budget_nominal = 3};
        void *st = NULL;
        assert_int_equal(cfg.ops->create(&init, &st), KVS_OK);
        assert_true(cfg.ops->prefill_block(st) >= 4);
        kvs_policy_view view = {.n = 4, .group = 1, .head_dim = 2, .scale = s.mem.model.scale, .k = &s.k[0][0],
                                .v = &s.v[0][0], .q = &s.q[0][0], .q_first = 0, .n_q = 4, .turn_begin = 0,
                                .prompt_end = 4, .block_begin = 0, .last_block = 1};
        assert_int_equal(cfg.ops->prefill(st, &view), KVS_OK);
        int32_t held[8];
        assert_int_equal(cfg.ops->stored(st, 0, held), 2);
        assert_int_equal(held[0], 0);
        assert_int_equal(held[1], 3);
        cfg.ops->free(st);
    }
    /* Through the engine: the generated position attends what the prefill kept + itself; budgets 2..5 follow
     * the keep order 3, 0, 1, 2 (B - 1 prompt keys held). */
    const int32_t want[4][5] = {{3, 4}, {0, 3, 4}, {0, 1, 3, 4}, {0, 1, 2, 3, 4}};
    for (int64_t B = 2; B <= 5; B++)
        for (size_t i = 0; i < 2; i++) {
            kvs_policy_config cfg;
            assert_int_equal(kvs_policy_parse(specs[i], &cfg), KVS_OK);
            one_sel o = {.n = -1};
            kvs_replay_hooks hooks = {.user = &o, .on_select = g6_on_select};
            kvs_replay_result *r = run_one(&s.mem, &cfg, B, KVS_MEASURE_DECODE, &hooks);
            assert_int_equal(o.n, B);
            assert_memory_equal(o.sel, want[B - 2], (size_t)B * sizeof(int32_t));
            kvs_replay_result_free(r);
        }
}

/* ================================================================================================
 * Generated streams: recorder, naive reference
 * ============================================================================================== */

static void fixture_make(fixture *f, int n_turns, int group, int n_pos, uint64_t seed) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = n_pos;
    o.n_turns = n_turns;
    o.n_kv_heads = 2;
    o.n_heads = 2 * group;
    o.head_dim = 8;
    o.block_positions = 7;
    o.seed = seed;
    o.q_scale = 2.0f;
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 7, f), KVS_OK);
}

static const float *fk(const fixture *f, int l, int64_t p, int h) {
    return f->g->k + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)f->Hkv + (size_t)h) * (size_t)f->d;
}

/* Sets of positions per (layer, KV head, position): what was attended (on_select) and what is held after a
 * prefill block or a decode step (on_step_end, through the policy's stored()). */
typedef struct {
    const fixture *f;
    int32_t *att, *held; /* [cells][N], sorted */
    int64_t *n_att, *n_held;
    int scramble;
    uint64_t rng;
} recorder;

static size_t cell(const fixture *f, int l, int h, int64_t p) {
    return ((size_t)l * (size_t)f->Hkv + (size_t)h) * (size_t)f->N + (size_t)p;
}

static void rec_init(recorder *r, const fixture *f) {
    memset(r, 0, sizeof *r);
    r->f = f;
    size_t cells = (size_t)f->L * (size_t)f->Hkv * (size_t)f->N;
    r->att = calloc(cells * (size_t)f->N, sizeof(int32_t));
    r->held = calloc(cells * (size_t)f->N, sizeof(int32_t));
    r->n_att = malloc(cells * sizeof(int64_t));
    r->n_held = malloc(cells * sizeof(int64_t));
    assert_true(r->att && r->held && r->n_att && r->n_held);
    for (size_t c = 0; c < cells; c++) r->n_att[c] = r->n_held[c] = -1; /* -1 = no record */
    r->rng = 77;
}

static void rec_free(recorder *r) {
    free(r->att);
    free(r->held);
    free(r->n_att);
    free(r->n_held);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void rec_put(const fixture *f, int32_t *sets, int64_t *counts, size_t c, const int32_t *idx, int64_t n) {
    int32_t *dst = sets + c * (size_t)f->N;
    memcpy(dst, idx, (size_t)n * sizeof(int32_t));
    qsort(dst, (size_t)n, sizeof(int32_t), cmp_i32);
    counts[c] = n;
}

static void on_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    (void)config;
    recorder *r = user;
    assert_int_equal(sel->n_lists, 1);
    rec_put(r->f, r->att, r->n_att, cell(r->f, layer, kv_head, pos), sel->idx[0], sel->n[0]);
}

/* Records what the policy holds, then (scramble) overwrites the K/V of every row it does not hold. */
static void on_step_end(void *user, int config, int layer, int kv_head, int64_t pos, void *state,
                        const struct kvs_policy_ops *ops, float *k, float *v, int64_t n) {
    (void)config;
    recorder *r = user;
    int32_t *buf = malloc((size_t)r->f->N * sizeof *buf);
    char *keep = calloc((size_t)n, 1);
    assert_true(buf && keep);
    int64_t m = ops->stored(state, 0, buf);
    rec_put(r->f, r->held, r->n_held, cell(r->f, layer, kv_head, pos), buf, m);
    for (int64_t j = 0; j < m; j++) keep[buf[j]] = 1;
    if (r->scramble) kvs_test_scramble_rows(k, v, n, r->f->d, keep, &r->rng);
    free(buf);
    free(keep);
}

static kvs_replay_result *run_recorded(const fixture *f, const char *spec, int64_t budget, recorder *rec) {
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_OK);
    kvs_replay_hooks hooks = {.user = rec, .on_select = on_select, .on_step_end = on_step_end};
    return run_one(&f->mem, &cfg, budget, KVS_MEASURE_DECODE, &hooks);
}

/* Every record of a and b equal (cells recorded by either); returns the number of sets compared. */
static int64_t rec_compare(const recorder *a, const recorder *b, const char *what) {
    const fixture *f = a->f;
    size_t cells = (size_t)f->L * (size_t)f->Hkv * (size_t)f->N;
    int64_t compared = 0;
    for (int kind = 0; kind < 2; kind++) {
        const int64_t *na = kind ? a->n_held : a->n_att, *nb = kind ? b->n_held : b->n_att;
        const int32_t *sa = kind ? a->held : a->att, *sb = kind ? b->held : b->att;
        for (size_t c = 0; c < cells; c++) {
            if (na[c] != nb[c] || (na[c] > 0 && memcmp(sa + c * (size_t)f->N, sb + c * (size_t)f->N,
                                                       (size_t)na[c] * sizeof(int32_t)))) {
                print_error("%s: %s set differs at layer %zu kv head %zu position %zu (%lld vs %lld entries)\n", what,
                            kind ? "held" : "attended", c / ((size_t)f->Hkv * (size_t)f->N),
                            (c / (size_t)f->N) % (size_t)f->Hkv, c % (size_t)f->N, (long long)na[c], (long long)nb[c]);
                fail();
            }
            compared += na[c] >= 0;
        }
    }
    return compared;
}

/* ---- the naive reference ------------------------------------------------------------------------- */

typedef enum { REF_ANCHOR, REF_RAW, REF_PAIRWISE, REF_NORM } ref_kind;

typedef struct {
    ref_kind kind;
    int64_t B, block;
    double window_frac;
} ref_cfg;

static double ref_dot(const float *a, const float *b, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)a[i] * (double)b[i];
    return s;
}

/* The held positions (mask) down to C = B - 1 when they exceed it: the newest W = floor(f C) stay (the paper's
 * N = C), the others keep their best C - W scores, found by a repeated scan (highest score, the older on ties). */
static void ref_evict(const fixture *f, int l, int h, const ref_cfg *rc, char *mask, int64_t upto) {
    int d = f->d;
    int64_t C = rc->B - 1, nc = 0;
    int32_t *cand = malloc((size_t)upto * sizeof *cand);
    assert_non_null(cand);
    for (int64_t p = 0; p < upto; p++)
        if (mask[p]) cand[nc++] = (int32_t)p;
    if (nc <= C) {
        free(cand);
        return;
    }
    int64_t W = (int64_t)floor(rc->window_frac * (double)C);
    double mu[64] = {0};
    double *score = malloc((size_t)nc * sizeof *score);
    char *keep = calloc((size_t)nc, 1);
    assert_true(score && keep && d <= 64);
    if (rc->kind == REF_ANCHOR || rc->kind == REF_RAW) {
        for (int64_t j = 0; j < nc; j++) {
            const float *kj = fk(f, l, cand[j], h);
            double w = rc->kind == REF_ANCHOR ? 1.0 / sqrt(ref_dot(kj, kj, d)) : 1.0;
            for (int i = 0; i < d; i++) mu[i] += w * kj[i] / (double)nc;
        }
        double nmu = 0;
        for (int i = 0; i < d; i++) nmu += mu[i] * mu[i];
        for (int64_t j = 0; j < nc; j++) {
            const float *kj = fk(f, l, cand[j], h);
            double dot = 0;
            for (int i = 0; i < d; i++) dot += kj[i] * mu[i];
            score[j] = -dot / (sqrt(ref_dot(kj, kj, d)) * sqrt(nmu));
        }
    } else if (rc->kind == REF_PAIRWISE) {
        for (int64_t a = 0; a < nc; a++) {
            const float *ka = fk(f, l, cand[a], h);
            score[a] = 0;
            for (int64_t b = 0; b < nc; b++) {
                const float *kb = fk(f, l, cand[b], h);
                score[a] -= ref_dot(ka, kb, d) / sqrt(ref_dot(ka, ka, d) * ref_dot(kb, kb, d));
            }
        }
    } else {
        for (int64_t j = 0; j < nc; j++) {
            const float *kj = fk(f, l, cand[j], h);
            score[j] = -sqrt(ref_dot(kj, kj, d));
        }
    }
    for (int64_t j = nc - W; j < nc; j++) keep[j] = 1;
    for (int64_t r = 0; r < C - W; r++) {
        int64_t best = -1;
        for (int64_t j = 0; j < nc - W; j++)
            if (!keep[j] && (best < 0 || score[j] > score[best])) best = j;
        assert_true(best >= 0);
        keep[best] = 1;
    }
    for (int64_t j = 0; j < nc; j++)
        if (!keep[j]) mask[cand[j]] = 0;
    free(cand);
    free(score);
    free(keep);
}

static int64_t ref_list(const char *mask, int64_t n, int32_t *out) {
    int64_t m = 0;
    for (int64_t p = 0; p < n; p++)
        if (mask[p]) out[m++] = (int32_t)p;
    return m;
}

/* The whole process (Eq. 6 blocks per turn, then attend-then-evict decode), recorded as the engine's hooks
 * record it. */
static void ref_run(const fixture *f, const ref_cfg *rc, recorder *out) {
    char *mask = malloc((size_t)f->N);
    int32_t *list = malloc((size_t)f->N * sizeof *list);
    assert_true(mask && list);
    for (int l = 0; l < f->L; l++)
        for (int h = 0; h < f->Hkv; h++) {
            memset(mask, 0, (size_t)f->N);
            for (int64_t t = 0; t < f->n_turns; t++) {
                const kvs_turn *tu = &f->turns[t];
                for (int64_t bb = tu->begin; bb < tu->prompt_end; bb += rc->block) {
                    int64_t be = bb + rc->block < tu->prompt_end ? bb + rc->block : tu->prompt_end;
                    memset(mask + bb, 1, (size_t)(be - bb));
                    ref_evict(f, l, h, rc, mask, be);
                    rec_put(f, out->held, out->n_held, cell(f, l, h, be - 1), list, ref_list(mask, be, list));
                }
                for (int64_t p = tu->prompt_end; p < tu->end; p++) {
                    mask[p] = 1;
                    rec_put(f, out->att, out->n_att, cell(f, l, h, p), list, ref_list(mask, p + 1, list));
                    ref_evict(f, l, h, rc, mask, p + 1);
                    rec_put(f, out->held, out->n_held, cell(f, l, h, p), list, ref_list(mask, p + 1, list));
                }
            }
        }
    free(mask);
    free(list);
}

static void test_policies_match_the_naive_reference(void **state) {
    (void)state;
    const struct {
        const char *spec;
        ref_cfg rc;
        int turns, group;
    } cases[] = {
        {"keydiff", {REF_ANCHOR, 9, 128, 0}, 1, 2},
        {"keydiff:block=4", {REF_ANCHOR, 7, 4, 0}, 2, 2},
        {"keydiff:block=1", {REF_ANCHOR, 5, 1, 0}, 2, 1},
        {"keydiff:anchor=raw,block=5", {REF_RAW, 8, 5, 0}, 2, 3},
        {"keydiff@paper:block=3", {REF_RAW, 6, 3, 0}, 1, 2},
        {"keydiff:pairwise=true,block=3", {REF_PAIRWISE, 6, 3, 0}, 2, 2},
        {"keydiff:window_frac=0.25,block=4", {REF_ANCHOR, 9, 4, 0.25}, 2, 2},
        {"keydiff:anchor=raw,window_frac=0.5,block=6", {REF_RAW, 7, 6, 0.5}, 2, 3},
        {"keydiff:window_frac=1,block=2", {REF_ANCHOR, 6, 2, 1.0}, 1, 2},
        {"knorm", {REF_NORM, 6, 128, 0}, 1, 2},
        {"knorm:block=4", {REF_NORM, 7, 4, 0}, 2, 2},
        {"knorm:window_frac=0.3,block=2", {REF_NORM, 10, 2, 0.3}, 2, 1},
        /* more than two chunks of held keys (kvs_key_scores_resumed's checkpoints, evictions anywhere) */
        {"keydiff:block=16", {REF_ANCHOR, 150, 16, 0}, 2, 2},
        {"keydiff:anchor=raw,window_frac=0.1,block=40", {REF_RAW, 140, 40, 0.1}, 1, 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fixture f;
        fixture_make(&f, cases[c].turns, cases[c].group, cases[c].rc.B > 64 ? 400 : 80, 100 + c);
        recorder eng, ref;
        rec_init(&eng, &f);
        rec_init(&ref, &f);
        kvs_replay_result *r = run_recorded(&f, cases[c].spec, cases[c].rc.B, &eng);
        ref_run(&f, &cases[c].rc, &ref);
        assert_true(rec_compare(&eng, &ref, cases[c].spec) > 0);
        assert_true(r->runs[0].max_attended == cases[c].rc.B);
        kvs_replay_result_free(r);
        rec_free(&eng);
        rec_free(&ref);
        kvs_test_replay_fixture_free(&f);
    }
}

/* §4 item 7: sum_j cos(k_i, k_j) = n |mu| cos(k_i, mu), so Eq. 7 and Eq. 8 keep the same keys. */
static void test_pairwise_keeps_what_the_anchor_keeps(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 2, 90, 31);
    const char *pair[][2] = {{"keydiff:block=4", "keydiff:block=4,pairwise=true"},
                             {"keydiff:block=1,window_frac=0.2", "keydiff:block=1,window_frac=0.2,pairwise=1"}};
    for (int i = 0; i < 2; i++) {
        recorder a, b;
        rec_init(&a, &f);
        rec_init(&b, &f);
        kvs_replay_result *ra = run_recorded(&f, pair[i][0], 10, &a);
        kvs_replay_result *rb = run_recorded(&f, pair[i][1], 10, &b);
        assert_true(rec_compare(&a, &b, pair[i][1]) > 0);
        kvs_replay_result_free(ra);
        kvs_replay_result_free(rb);
        rec_free(&a);
        rec_free(&b);
    }
    kvs_test_replay_fixture_free(&f);
}

/* Without a window, KNorm holds the B - 1 smallest-norm keys of every position seen, whatever the block size:
 * each decode step attends exactly those plus the current token. */
static void test_knorm_keeps_the_smallest_norms(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 2, 80, 41);
    const char *specs[] = {"knorm", "knorm:block=1", "knorm:block=3", "knorm:block=16"};
    const int64_t B = 8;
    double *norm = malloc((size_t)f.N * sizeof *norm);
    int32_t *want = malloc((size_t)f.N * sizeof *want);
    char *taken = malloc((size_t)f.N);
    assert_true(norm && want && taken);
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        recorder eng;
        rec_init(&eng, &f);
        kvs_replay_result *r = run_recorded(&f, specs[i], B, &eng);
        int64_t checked = 0;
        for (int l = 0; l < f.L; l++)
            for (int h = 0; h < f.Hkv; h++)
                for (int64_t p = 0; p < f.N; p++) {
                    size_t c = cell(&f, l, h, p);
                    if (eng.n_att[c] < 0) continue;
                    for (int64_t j = 0; j < p; j++) norm[j] = sqrt(ref_dot(fk(&f, l, j, h), fk(&f, l, j, h), f.d));
                    memset(taken, 0, (size_t)f.N);
                    int64_t m = p < B - 1 ? p : B - 1;
                    for (int64_t r2 = 0; r2 < m; r2++) { /* the m smallest norms among 0..p-1 */
                        int64_t best = -1;
                        for (int64_t j = 0; j < p; j++)
                            if (!taken[j] && (best < 0 || norm[j] < norm[best])) best = j;
                        assert_true(best >= 0);
                        taken[best] = 1;
                    }
                    taken[p] = 1;
                    int64_t nw = ref_list(taken, p + 1, want);
                    assert_int_equal(eng.n_att[c], nw);
                    assert_memory_equal(eng.att + c * (size_t)f.N, want, (size_t)nw * sizeof(int32_t));
                    checked++;
                }
        assert_true(checked > 0);
        kvs_replay_result_free(r);
        rec_free(&eng);
    }
    free(norm);
    free(want);
    free(taken);
    kvs_test_replay_fixture_free(&f);
}

/* The leak check between prefill blocks: scrambling the K/V of every row the policy does not hold, after
 * every prefill block and decode step, changes nothing it attends or holds. */
static void test_reads_only_what_it_holds_between_blocks(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 2, 80, 51);
    const char *specs[] = {"keydiff:block=3", "keydiff:block=5,anchor=raw,window_frac=0.3", "keydiff:block=2,pairwise=1",
                           "knorm:block=3"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        recorder a, b;
        rec_init(&a, &f);
        rec_init(&b, &f);
        b.scramble = 1;
        kvs_replay_result *ra = run_recorded(&f, specs[i], 7, &a);
        kvs_replay_result *rb = run_recorded(&f, specs[i], 7, &b);
        assert_true(rec_compare(&a, &b, specs[i]) > 0);
        kvs_replay_result_free(ra);
        kvs_replay_result_free(rb);
        rec_free(&a);
        rec_free(&b);
    }
    kvs_test_replay_fixture_free(&f);
}

/* ================================================================================================
 * Memory: storage_peak with --measure prefill and decode
 * ============================================================================================== */

static void test_peak_memory_is_bounded_by_budget_plus_block(void **state) {
    (void)state;
    const struct {
        const char *spec;
        int64_t B, block;
        double aux_per_cand, aux_fixed; /* scoring temporaries: aux_per_cand * n_c + aux_fixed elements */
    } cases[] = {
        {"keydiff:block=5", 6, 5, 1, 8},
        {"keydiff:block=1", 9, 1, 1, 8},
        {"keydiff:block=16", 11, 16, 1, 8},
        {"keydiff:block=4,pairwise=true", 7, 4, 2, 0},
        {"keydiff:block=7,window_frac=0.3,anchor=raw", 10, 7, 1, 8},
        {"knorm:block=6", 6, 6, 1, 0},
    };
    const kvs_replay_measure measures[] = {KVS_MEASURE_PREFILL, KVS_MEASURE_DECODE};
    fixture f;
    fixture_make(&f, 2, 2, 100, 61); /* two turns of 25 prompt + 25 generated positions */
    const double kv_tok = 2.0 * f.d * 2, aux = 4; /* kv_bytes 2, aux_bytes 4 */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int mi = 0; mi < 2; mi++) {
            kvs_policy_config cfg;
            assert_int_equal(kvs_policy_parse(cases[c].spec, &cfg), KVS_OK);
            kvs_replay_result *r = run_one(&f.mem, &cfg, cases[c].B, measures[mi], NULL);
            const kvs_replay_run_result *run = &r->runs[0];
            int64_t B = cases[c].B, blk = cases[c].block, n_prompt = 0, n_decode = 0;
            double prompt_peak_max = 0;
            for (int64_t i = 0; i < run->n_steps; i++) {
                const kvs_results_step *s = &run->steps[i];
                int64_t p = s->position, tk = p < f.turns[0].end ? 0 : 1;
                const kvs_turn *tu = &f.turns[tk];
                assert_true(s->storage_aux_bytes == 0 && s->storage_bytes == s->storage_kv_bytes);
                assert_true(s->traffic_aux_bytes == 0);
                if (p < tu->prompt_end) {
                    /* a prompt position of block [bb, be) attends what was held after the previous block plus the
                     * block up to itself; the peak holds the whole block */
                    int64_t bb = tu->begin + (p - tu->begin) / blk * blk;
                    int64_t be = bb + blk < tu->prompt_end ? bb + blk : tu->prompt_end;
                    int64_t held = (int64_t)s->attended_tokens - (p - bb + 1);
                    assert_true(held >= 0 && held <= B - 1);
                    if (tk == 0 && bb == 0) assert_int_equal(held, 0);
                    assert_true(s->storage_peak_bytes == kv_tok * (double)(held + be - bb));
                    assert_true(s->storage_peak_bytes <= kv_tok * (double)(B - 1 + blk));
                    if (s->storage_peak_bytes > prompt_peak_max) prompt_peak_max = s->storage_peak_bytes;
                    n_prompt++;
                } else {
                    /* decode: S_t (<= B) resident; a full S_t evicts after attention, scoring n_c = B candidates */
                    double n = s->attended_tokens;
                    assert_true(n <= (double)B);
                    assert_true(s->storage_kv_bytes == kv_tok * n);
                    int evicts = n == (double)B;
                    double tmp = evicts ? aux * (cases[c].aux_per_cand * n + cases[c].aux_fixed) : 0;
                    assert_true(s->storage_peak_bytes == s->storage_kv_bytes + tmp);
                    assert_true(s->traffic_aux_unfused_bytes == (evicts ? n * f.d * 2 : 0));
                    n_decode++;
                }
            }
            if (measures[mi] == KVS_MEASURE_PREFILL) {
                assert_true(n_prompt > 0 && n_decode == 0);
                /* 25-position prompts: some block starts with B - 1 held and is whole */
                assert_true(prompt_peak_max == kv_tok * (double)(B - 1 + (blk < 25 ? blk : 25)));
                assert_true(run->run_agg.storage_peak_bytes.max == prompt_peak_max);
            } else {
                assert_true(n_decode > 0 && n_prompt == 0);
                assert_true(run->run_agg.storage_kv_bytes.max == kv_tok * (double)B);
            }
            kvs_replay_result_free(r);
        }
    kvs_test_replay_fixture_free(&f);
}

/* ================================================================================================
 * The sliding window's size (§3.2, POLICY_SPEC §2.5): W = floor(f N) with the paper's N = B - 1
 * ============================================================================================== */

/* B = 6 (N = C = 5), window_frac = 0.5: W = floor(0.5 * 5) = 2, not floor(0.5 * 6) = 3. Eight 2-d prompt keys in
 * one block, then one generated key; the protected and kept sets written out (cosines to the normalised anchor,
 * computed by hand):
 *   prefill, candidates 0..7, cos = 0.198 0.980 0.989 -0.980 0.969 0.982 0.980 0.980: the window protects 6, 7;
 *     of 0..5 the three least anchor-like stay (3, 0, 4): held {0, 3, 4, 6, 7}. (W = 3 would have protected
 *     5 and kept only 3, 0: {0, 3, 5, 6, 7}.)
 *   decode at position 8, candidates {0, 3, 4, 6, 7, 8}, cos = 0.308 -0.952 0.935 0.952 0.952 0.957: the window
 *     protects 7, 8; of {0, 3, 4, 6} the most anchor-like (6) goes: held {0, 3, 4, 7, 8}. */
static void test_window_is_a_share_of_the_held_capacity(void **state) {
    (void)state;
    static const float keys[9][2] = {{0, 1},  {1, 0},     {1, 0.05f}, {-1, 0}, {1, -0.05f},
                                     {1, 0.01f}, {1, 0}, {1, 0},      {1, 0.02f}};
    float q[9][2] = {{0}}, v[9][2] = {{0}};
    kvs_policy_model model = {.n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .group = 1, .head_dim = 2,
                              .scale = 0.70710678f, .kv_bytes = 2, .aux_bytes = 4, .n_positions = 9, .prompt_len = 8,
                              .max_new_tokens = 1};
    const char *specs[] = {"keydiff:window_frac=0.5", "knorm:window_frac=0.5"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kvs_policy_config cfg;
        assert_int_equal(kvs_policy_parse(specs[i], &cfg), KVS_OK);
        kvs_policy_init init = {.model = &model, .cfg = &cfg, .budget = 6, .budget_nominal = 6};
        void *st = NULL;
        assert_int_equal(cfg.ops->create(&init, &st), KVS_OK);
        kvs_policy_view view = {.n = 8, .group = 1, .head_dim = 2, .scale = model.scale, .k = &keys[0][0],
                                .v = &v[0][0], .q = &q[0][0], .q_first = 0, .n_q = 8, .turn_begin = 0,
                                .prompt_end = 8, .block_begin = 0, .last_block = 1};
        assert_int_equal(cfg.ops->prefill(st, &view), KVS_OK);
        int32_t held[16];
        int64_t n = cfg.ops->stored(st, 0, held);
        if (i == 0) {
            const int32_t want[5] = {0, 3, 4, 6, 7};
            assert_int_equal(n, 5);
            assert_memory_equal(held, want, sizeof want);
        } else {
            /* KNorm runs the same framework: of 0..5 the three smallest norms (0, 1, 3 at exactly 1; 5 is
             * 1.00005) stay; W = 3 would have protected 5 and kept 0, 1 only */
            const int32_t want[5] = {0, 1, 3, 6, 7};
            assert_int_equal(n, 5);
            assert_memory_equal(held, want, sizeof want);
        }
        if (i == 0) {
            int32_t idx[16], *lists[1] = {idx};
            int64_t cnt[1] = {0};
            kvs_policy_sel sel = {.idx = lists, .n = cnt, .n_lists = 1, .cap = 16};
            view = (kvs_policy_view){.n = 9, .group = 1, .head_dim = 2, .scale = model.scale, .k = &keys[0][0],
                                     .v = &v[0][0], .q = &q[8][0], .q_first = 8, .n_q = 1, .turn_begin = 0,
                                     .prompt_end = 8};
            assert_int_equal(cfg.ops->select(st, &view, &sel), KVS_OK);
            assert_int_equal(cnt[0], 6);
            assert_int_equal(cfg.ops->observe(st, &view, &sel, NULL), KVS_OK);
            const int32_t want[5] = {0, 3, 4, 7, 8};
            assert_int_equal(cfg.ops->stored(st, 0, held), 5);
            assert_memory_equal(held, want, sizeof want);
        }
        cfg.ops->free(st);
    }
}

/* ================================================================================================
 * validate() and notes()
 * ============================================================================================== */

static void test_validate_and_notes(void **state) {
    (void)state;
    kvs_policy_model m = {.n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .group = 2, .head_dim = 8, .scale = 0.35f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = 400, .prompt_len = 100};
    kvs_policy_config cfg;
    char buf[512];
    assert_int_equal(kvs_policy_parse("keydiff:pairwise=true,anchor=raw", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 10), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "policy keydiff: pairwise=true (Eq. 7) has no anchor; anchor=raw would be ignored");
    assert_int_equal(kvs_policy_parse("keydiff:pairwise=true", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 10), KVS_OK);
    assert_int_equal(kvs_policy_parse("knorm:window_frac=0.5", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 10), KVS_OK);

    /* default block 128 >= the 100-position prompt: one-shot prefill */
    const char *one_shot = "block=128 covers the whole 100-position first prompt: one-shot prefill (M_blk = L), no "
                           "block-wise eviction of the first prompt";
    assert_int_equal(kvs_policy_parse("keydiff", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 10, buf, sizeof buf), 1);
    assert_string_equal(buf, one_shot);
    assert_int_equal(kvs_policy_parse("knorm", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 10, buf, sizeof buf), 1);
    assert_string_equal(buf, one_shot);
    assert_int_equal(kvs_policy_parse("keydiff:block=16", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 10, buf, sizeof buf), 0);
    assert_string_equal(buf, "");
    /* window_frac = 1: W = B - 1, nothing scored */
    assert_int_equal(kvs_policy_parse("keydiff:block=16,window_frac=1", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 10, buf, sizeof buf), 1);
    assert_string_equal(buf, "window_frac=1 reserves every held position for the sliding window: no key is scored "
                             "(a sliding window)");
    /* W = floor(f (B - 1)): 0.9 of C = 9 is 8 < 9, no finding (floor(0.9 B) = 9 = C would have been one) */
    assert_int_equal(kvs_policy_parse("knorm:block=16,window_frac=0.9", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 10, buf, sizeof buf), 0);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 11, buf, sizeof buf), 0); /* floor(9) = 9 < 10 */
    /* floor(0.05 * 9) = 0: no window at this budget, one at 40 (floor(1.95) = 1) */
    assert_int_equal(kvs_policy_parse("keydiff:block=16,window_frac=0.05", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 10, buf, sizeof buf), 1);
    assert_string_equal(buf, "window_frac=0.05 rounds to an empty window at this budget: no sliding window, the "
                             "current token is not protected");
    assert_int_equal(kvs_policy_notes(&cfg, &m, 40, buf, sizeof buf), 0);
    /* both findings at once, "; "-separated */
    assert_int_equal(kvs_policy_parse("keydiff:window_frac=1", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 10, buf, sizeof buf), 2);
    assert_non_null(strstr(buf, "one-shot prefill (M_blk = L), no block-wise eviction of the first prompt; window_frac=1"));
    /* budget 1 holds nothing: no window finding */
    assert_int_equal(kvs_policy_parse("keydiff:block=16,window_frac=0.5", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 1, buf, sizeof buf), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_g6_through_the_shared_scores),
        cmocka_unit_test(test_g6_through_the_policy),
        cmocka_unit_test(test_kept_norms_give_the_same_scores),
        cmocka_unit_test(test_resumed_anchor_gives_the_same_scores),
        cmocka_unit_test(test_lowest_key_is_the_fp64_scores_lowest),
        cmocka_unit_test(test_policies_match_the_naive_reference),
        cmocka_unit_test(test_pairwise_keeps_what_the_anchor_keeps),
        cmocka_unit_test(test_knorm_keeps_the_smallest_norms),
        cmocka_unit_test(test_reads_only_what_it_holds_between_blocks),
        cmocka_unit_test(test_peak_memory_is_bounded_by_budget_plus_block),
        cmocka_unit_test(test_window_is_a_share_of_the_held_capacity),
        cmocka_unit_test(test_validate_and_notes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
