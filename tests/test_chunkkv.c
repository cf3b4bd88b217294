/* test_chunkkv.c — ChunkKV (policies/chunkkv.c, ../shared/POLICY_SPEC_2.md §2.3):
 *  - golden example G-CK: PAPER mode's chunk sums and kept set {6..13} (where token-level top-k would keep
 *    {0, 4, 6, 7, 8, 11}), REF mode's chunk scores and kept set {9..13} (5 tokens, not 7), through the selection;
 *  - the policy against a NAIVE reference written here (dense causal softmax in double for the window queries,
 *    average pooling with zero padding, group mean, sum over the layer's KV heads, whole chunks chosen by a
 *    repeated scan), both modes, on a generated stream: every KV head of a layer keeps the same positions, exactly
 *    the reference's, at most B of them; scope=head keeps each head's own;
 *  - a budget covering the prompt keeps all of it (lossless); generated tokens are all kept.
 * Data: hand-set arrays (G-CK) and GENERATED Gaussian streams (tests/util/gen_trace.h).
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
#include "../policies/chunkkv_internal.h"
#include "../policies/registry.h"
#include "../sim/policy.h"
#include "util/replay_fixture.h"

static void assert_close(double got, double want, const char *what) {
    if (!(fabs(got - want) <= 1e-6 * fabs(want) + 1e-9)) {
        print_error("%s: got %.9g, want %.9g\n", what, got, want);
        fail();
    }
}

static const double g_sigma0[12] = {0.30, 0.05, 0.02, 0.10, 0.40, 0.01, 0.20, 0.20, 0.20, 0.02, 0.03, 0.50};
static const double g_sigma1[12] = {0.10, 0.10, 0.10, 0.30, 0.30, 0.00, 0.05, 0.05, 0.05, 0.60, 0.00, 0.00};

static void test_gck_paper(void **state) {
    (void)state;
    char keep[14];
    int32_t scratch[14];
    double cs[14];
    int64_t kept = kvs_chunkkv_select(g_sigma0, 12, 14, 3, 8, KVS_CHUNKKV_PAPER, 0, keep, scratch, cs);
    const double sums[4] = {0.37, 0.51, 0.60, 0.55};
    for (int c = 0; c < 4; c++) assert_close(cs[c], sums[c], "chunk sum");
    assert_int_equal(kept, 8);
    for (int j = 0; j < 14; j++) assert_int_equal(keep[j], j >= 6);
    /* token-level top 6 of the same scores: {0, 4, 6, 7, 8, 11} */
    float f[12];
    for (int j = 0; j < 12; j++) f[j] = (float)g_sigma0[j];
    int32_t top[6];
    kvs_topk_sorted(f, 12, 6, top);
    const int32_t want[6] = {0, 4, 6, 7, 8, 11};
    assert_memory_equal(top, want, sizeof want);
}

static void test_gck_ref(void **state) {
    (void)state;
    double layer[12], mx = 0;
    for (int j = 0; j < 12; j++) {
        layer[j] = g_sigma0[j] + g_sigma1[j];
        if (g_sigma0[j] > mx) mx = g_sigma0[j];
        if (g_sigma1[j] > mx) mx = g_sigma1[j];
    }
    assert_close(mx + 1, 1.60, "window value");
    char keep[14];
    int32_t scratch[14];
    double cs[14];
    /* cr = 0.5 keeps int(5 x 0.5) = 2 chunks: the budget B = 6 (floor(6/3) = 2 chunks) */
    int64_t kept = kvs_chunkkv_select(layer, 12, 14, 3, 6, KVS_CHUNKKV_REF, 2 * (mx + 1), keep, scratch, cs);
    const double scores[5] = {0.2233333, 0.37, 0.25, 0.3833333, 3.2};
    for (int c = 0; c < 5; c++) assert_close(cs[c], scores[c], "chunk score");
    assert_int_equal(kept, 5);
    for (int j = 0; j < 14; j++) assert_int_equal(keep[j], j >= 9);
    /* B < c: the last B positions */
    kept = kvs_chunkkv_select(layer, 12, 14, 3, 2, KVS_CHUNKKV_REF, 2 * (mx + 1), keep, scratch, cs);
    assert_int_equal(kept, 2);
    for (int j = 0; j < 14; j++) assert_int_equal(keep[j], j >= 12);
}

/* ---- the policy against a naive reference --------------------------------------------------------------- */

enum { HKV = 2, GRP = 2, D = 8, NPOS = 90, PROMPT = 60 };

typedef struct {
    kvs_test_replay_fixture f;
    float k[HKV][NPOS][D], v[HKV][NPOS][D], q[HKV][NPOS][GRP][D]; /* layer 0, split by KV head */
} stream;

static void stream_make(stream *s, uint64_t seed) {
    kvs_gen_trace_opts go = kvs_gen_trace_defaults();
    go.n_positions = NPOS;
    go.prompt_len = PROMPT;
    go.n_kv_heads = HKV;
    go.n_heads = HKV * GRP;
    go.head_dim = D;
    go.n_layers = 1;
    go.seed = seed;
    go.q_scale = 2.0f;
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 16, &s->f), KVS_OK);
    for (int h = 0; h < HKV; h++)
        for (int p = 0; p < NPOS; p++) {
            memcpy(s->k[h][p], s->f.g->k + ((size_t)p * HKV + (size_t)h) * D, sizeof s->k[h][p]);
            memcpy(s->v[h][p], s->f.g->v + ((size_t)p * HKV + (size_t)h) * D, sizeof s->v[h][p]);
            for (int g = 0; g < GRP; g++)
                memcpy(s->q[h][p][g], s->f.g->q + (((size_t)p * HKV + (size_t)h) * GRP + (size_t)g) * D,
                       sizeof s->q[h][p][g]);
        }
}

/* σ_kv of head h over the prefix [0, P − w): window attention summed over rows, pooled (avg, zero pad, kernel
 * 5), mean over the group — all in double, dense loops. */
static void naive_sigma(const stream *s, int h, int w, double *sigma) {
    int m = PROMPT - w;
    double u[PROMPT];
    for (int j = 0; j < m; j++) sigma[j] = 0;
    for (int g = 0; g < GRP; g++) {
        for (int j = 0; j < PROMPT; j++) u[j] = 0;
        for (int i = PROMPT - w; i < PROMPT; i++) {
            double l[PROMPT], mx = -INFINITY, z = 0;
            for (int j = 0; j <= i; j++) {
                double dot = 0;
                for (int c = 0; c < D; c++) dot += (double)s->q[h][i][g][c] * (double)s->k[h][j][c];
                l[j] = dot * (double)s->f.scale;
                if (l[j] > mx) mx = l[j];
            }
            for (int j = 0; j <= i; j++) z += exp(l[j] - mx);
            for (int j = 0; j <= i; j++) u[j] += exp(l[j] - mx) / z;
        }
        for (int j = 0; j < m; j++) {
            double acc = 0;
            for (int t = j - 2; t <= j + 2; t++)
                if (t >= 0 && t < m) acc += u[t];
            sigma[j] += acc / 5.0 / GRP;
        }
    }
}

/* The chunks a repeated scan picks: PAPER over the prefix (partial last chunk: mean x c), keep n_chunks best. */
static void naive_keep(const double *layer, int m, int c, int n_keep, char *keep) {
    int nch = (m + c - 1) / c;
    double score[PROMPT];
    char used[PROMPT] = {0};
    for (int ci = 0; ci < nch; ci++) {
        int a = ci * c, b = a + c < m ? a + c : m;
        double sum = 0;
        for (int j = a; j < b; j++) sum += layer[j];
        score[ci] = sum / (b - a) * c;
    }
    memset(keep, 0, PROMPT);
    for (int t = 0; t < n_keep && t < nch; t++) {
        int best = -1;
        for (int ci = 0; ci < nch; ci++)
            if (!used[ci] && (best < 0 || score[ci] > score[best])) best = ci;
        used[best] = 1;
        for (int j = best * c; j < best * c + c && j < m; j++) keep[j] = 1;
    }
    for (int j = m; j < PROMPT; j++) keep[j] = 1;
}

/* The policy's held sets after prefill (+ layer_sync) for both KV heads. */
static void policy_held(const stream *s, const char *spec, int64_t budget, int32_t held[HKV][NPOS], int64_t n[HKV]) {
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_OK);
    void *st[HKV];
    for (int h = 0; h < HKV; h++) {
        kvs_policy_init init = {.model = &s->f.mem.model, .cfg = &cfg, .kv_head = h, .budget = budget,
                                .budget_nominal = budget};
        assert_int_equal(cfg.ops->create(&init, &st[h]), KVS_OK);
        kvs_policy_view view = {.n = PROMPT, .group = GRP, .head_dim = D, .scale = s->f.scale, .k = &s->k[h][0][0],
                                .v = &s->v[h][0][0], .q = &s->q[h][0][0][0], .q_first = 0, .n_q = PROMPT,
                                .turn_begin = 0, .prompt_end = PROMPT, .last_block = 1};
        assert_int_equal(cfg.ops->prefill(st[h], &view), KVS_OK);
    }
    assert_int_equal(cfg.ops->layer_sync(st, HKV, KVS_SYNC_PREFILL), KVS_OK);
    for (int h = 0; h < HKV; h++) {
        n[h] = cfg.ops->stored(st[h], 0, held[h]);
        cfg.ops->free(st[h]);
    }
}

static void test_policy_matches_a_naive_reference(void **state) {
    (void)state;
    stream *s = malloc(sizeof *s);
    assert_non_null(s);
    stream_make(s, 31);
    const int w = 8, c = 5;
    double sig[HKV][PROMPT], layer[PROMPT];
    for (int h = 0; h < HKV; h++) naive_sigma(s, h, w, sig[h]);
    for (int j = 0; j < PROMPT - w; j++) layer[j] = sig[0][j] + sig[1][j];
    const int64_t budgets[] = {9, 20, 31, 44};
    for (size_t bi = 0; bi < sizeof budgets / sizeof budgets[0]; bi++) {
        int64_t B = budgets[bi];
        int32_t held[HKV][NPOS];
        int64_t n[HKV];
        policy_held(s, "chunkkv:window=8,chunk=5", B, held, n);
        char keep[PROMPT];
        naive_keep(layer, PROMPT - w, c, (int)((B - w) / c), keep);
        int64_t want = 0;
        for (int j = 0; j < PROMPT; j++) want += keep[j];
        assert_true(want <= B);
        for (int h = 0; h < HKV; h++) {
            assert_int_equal(n[h], want);
            for (int64_t t = 0; t < n[h]; t++) assert_true(keep[held[h][t]]);
        }
        /* REF: window forced, chunks over everything, floor(B / c) chunks: scores are the chunk means */
        policy_held(s, "chunkkv:window=8,chunk=5,select=ref", B, held, n);
        double full[PROMPT], mx = 0;
        for (int h = 0; h < HKV; h++)
            for (int j = 0; j < PROMPT - w; j++)
                if (sig[h][j] > mx) mx = sig[h][j];
        for (int j = 0; j < PROMPT; j++) full[j] = j < PROMPT - w ? layer[j] : HKV * (mx + 1);
        /* with c dividing P, REF's means rank as PAPER's sums over the whole grid */
        naive_keep(full, PROMPT, c, (int)(B / c), keep);
        want = 0;
        for (int j = 0; j < PROMPT; j++) want += keep[j];
        for (int h = 0; h < HKV; h++) {
            assert_int_equal(n[h], want);
            for (int64_t t = 0; t < n[h]; t++) assert_true(keep[held[h][t]]);
        }
        /* scope=head: head h alone, by its own σ */
        policy_held(s, "chunkkv:window=8,chunk=5,scope=head", B, held, n);
        for (int h = 0; h < HKV; h++) {
            naive_keep(sig[h], PROMPT - w, c, (int)((B - w) / c), keep);
            for (int64_t t = 0; t < n[h]; t++) assert_true(keep[held[h][t]]);
        }
    }
    /* a budget covering the prompt keeps it all */
    int32_t held[HKV][NPOS];
    int64_t n[HKV];
    policy_held(s, "chunkkv", PROMPT, held, n);
    assert_int_equal(n[0], PROMPT);
    assert_int_equal(n[1], PROMPT);
    kvs_test_replay_fixture_free(&s->f);
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gck_paper),
        cmocka_unit_test(test_gck_ref),
        cmocka_unit_test(test_policy_matches_a_naive_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
