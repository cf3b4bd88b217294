/* test_policy_v2.c — the replay interface v2 (sim/policy.h "Interface v2 capabilities"), each capability
 * exercised by a test-only policy, and metric VALUES checked against hand computation and an independent
 * naive computation (double precision, written here, not the engine's kvs_attention):
 *  - hand-computable case (1 layer, 1 KV head, G = 2, d = 2): every metric of one decode step by hand;
 *  - naive reference: err, err_abs, cos, recall, overlap, attended, storage, traffic of window and
 *    h2o:gqa=expand at every (layer, query head, step) of a generated stream;
 *  - merged slots (policy-owned K/V rows, recall vs merged recall);
 *  - chunked prefill: block boundaries, prompt measurement against what the policy holds, peak storage with
 *    the block, and the leak check between blocks catching a policy that reads a prompt key it evicted;
 *  - shared prepass data (alloc_shared) reaching every instance and outliving it;
 *  - STRING and FILE parameters (sha256 in the canonical string, a changed file refused);
 *  - host storage and host<->device transfers (cost model v2), readable() wider than stored().
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
#include <fcntl.h>
#include <unistd.h>

#include "../common/kvs_math.h"
#include "../sim/policy.h"
#include "../policies/registry.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"

typedef kvs_test_replay_fixture fixture;

static void fixture_make(fixture *f, int n_turns, int n_positions, uint64_t seed) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = n_positions;
    o.n_turns = n_turns;
    o.n_kv_heads = 2;
    o.n_heads = 4;
    o.head_dim = 8;
    o.seed = seed;
    o.q_scale = 2.0f;
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 5, f), KVS_OK);
}

/* Row accessors of a fixture: q of query head qh, k/v of KV head h, at (layer, position). */
static const float *fq(const fixture *f, int l, int64_t p, int qh) {
    return f->g->q + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)f->H + (size_t)qh) * (size_t)f->d;
}
static const float *fk(const fixture *f, int l, int64_t p, int h) {
    return f->g->k + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)f->Hkv + (size_t)h) * (size_t)f->d;
}
static const float *fv(const fixture *f, int l, int64_t p, int h) {
    return f->g->v + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)f->Hkv + (size_t)h) * (size_t)f->d;
}

/* Naive attention in double over n rows given as pointers: probs[n], out[d]. */
static void naive_attention(const float *q, const float *const *krows, const float *const *vrows, int64_t n, int d,
                            double scale, double *probs, double *out) {
    double mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        double z = 0;
        for (int i = 0; i < d; i++) z += (double)q[i] * (double)krows[j][i];
        probs[j] = z * scale;
        if (probs[j] > mx) mx = probs[j];
    }
    double sum = 0;
    for (int64_t j = 0; j < n; j++) sum += probs[j] = exp(probs[j] - mx);
    for (int i = 0; i < d; i++) out[i] = 0;
    for (int64_t j = 0; j < n; j++) {
        probs[j] /= sum;
        for (int i = 0; i < d; i++) out[i] += probs[j] * (double)vrows[j][i];
    }
}

static kvs_replay_result *run_one(const kvs_replay_mem *mem, const kvs_policy_config *cfg, int64_t budget,
                                  kvs_replay_measure measure, const kvs_replay_hooks *hooks, int threads) {
    kvs_replay_config rc = {.policy = *cfg, .budget = budget, .budget_fraction = -1};
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(mem, &src), KVS_OK);
    kvs_replay_opts o = {.configs = &rc, .n_configs = 1, .threads = threads, .measure = measure, .series_every = 1,
                         .hooks = hooks};
    kvs_replay_result *r = NULL;
    kvs_status st = kvs_replay_execute(&src, &o, &r);
    if (st != KVS_OK) print_error("%s\n", kvs_last_error());
    assert_int_equal(st, KVS_OK);
    if (r->runs[0].status != KVS_OK) print_error("policy %s: %s\n", cfg->ops->name, r->runs[0].error);
    assert_int_equal(r->runs[0].status, KVS_OK);
    return r;
}

static void assert_close(double got, double want, double tol, const char *what) {
    if (!(fabs(got - want) <= tol * (1.0 + fabs(want)))) {
        print_error("%s: got %.9g, want %.9g\n", what, got, want);
        fail();
    }
}

/* ================================================================================================
 * Hand-computable case
 * ============================================================================================== */

/* 1 layer, 1 KV head, G = 2, d = 2, prompt 0..2, one generated position 3; window budget 2 attends {2, 3}.
 * k = (0,0) (1,0) (2,0) (0,0); v = (1,0) (0,1) (1,1) (2,0); scale 1/sqrt(2).
 * Query head 0: q = 0 -> uniform 1/4. Query head 1: q = (sqrt(2) ln 2, 0) -> e^z = 1, 2, 4, 1 -> 1/8 2/8 4/8 1/8. */
static void test_hand_computed_metrics(void **state) {
    (void)state;
    const double ln2 = log(2.0), s2 = sqrt(2.0);
    float q[4][2][2] = {{{0}}};
    q[3][1][0] = (float)(s2 * ln2);
    float k[4][2] = {{0, 0}, {1, 0}, {2, 0}, {0, 0}}, v[4][2] = {{1, 0}, {0, 1}, {1, 1}, {2, 0}};
    kvs_turn turn = {.begin = 0, .prompt_end = 3, .end = 4};
    kvs_replay_mem mem = {
        .model = {.n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .group = 2, .head_dim = 2, .scale = (float)(1 / s2),
                  .kv_bytes = 2, .aux_bytes = 4, .n_positions = 4, .prompt_len = 3, .max_new_tokens = 1},
        .turns = &turn, .n_turns = 1, .q = &q[0][0][0], .k = &k[0][0], .v = &v[0][0], .block_positions = 2,
    };
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse("window", &cfg), KVS_OK);
    kvs_replay_result *r = run_one(&mem, &cfg, 2, KVS_MEASURE_DECODE, NULL, 1);
    const kvs_replay_run_result *run = &r->runs[0];
    assert_int_equal(run->n_steps, 2);
    /* head 0: O = (1, 0.5), O' = mean(v2, v3) = (1.5, 0.5) */
    double want_abs[2] = {0.5, sqrt(0.325 * 0.325 + 0.05 * 0.05)};
    double want_rel[2] = {0.5 / sqrt(1.25), want_abs[1] / (sqrt(85.0) / 8)};
    double want_cos[2] = {1.75 / (sqrt(1.25) * sqrt(2.5)), (7.0 / 8 * 1.2 + 6.0 / 8 * 0.8) / (sqrt(85.0) / 8 * sqrt(2.08))};
    double want_recall[2] = {0.5, 0.625}, want_overlap[2] = {0.0, 0.5}; /* head 0 ties: top-2 = {0, 1} */
    for (int i = 0; i < 2; i++) {
        const kvs_results_step *s = &run->steps[i];
        int g = s->q_head;
        assert_int_equal(s->position, 3);
        assert_close(s->out_err, want_rel[g], 1e-6, "out_err");
        assert_close(s->out_err_abs, want_abs[g], 1e-6, "out_err_abs");
        assert_close(s->out_cos, want_cos[g], 1e-6, "out_cos");
        assert_close(s->attn_recall, want_recall[g], 1e-6, "attn_recall");
        assert_close(s->attn_recall_merged, want_recall[g], 1e-6, "attn_recall_merged");
        assert_true(s->topk_overlap == want_overlap[g]);
        assert_true(s->attended_tokens == 2);
        assert_true(s->storage_bytes == 2 * 2 * 2 * 2); /* 2 tokens x (K + V) x d 2 x 2 bytes */
        assert_true(s->storage_kv_bytes == 16 && s->storage_aux_bytes == 0 && s->storage_dedup_bytes == 16);
        assert_true(s->traffic_bytes == 16 && s->traffic_kv_bytes == 16);
        assert_true(s->write_bytes == 8); /* the new token's K and V */
        assert_true(s->compression_ratio == 2.0); /* 4 positions x 8 bytes / 16 */
        assert_true(s->storage_peak_bytes == 16 && s->transfer_bytes == 0 && s->storage_host_bytes == 0);
    }
    const kvs_results_agg *a = &run->run_agg;
    assert_int_equal(a->out_err.n, 2);
    assert_close(a->out_err.mean, (want_rel[0] + want_rel[1]) / 2, 1e-6, "mean err");
    assert_close(a->out_err.max, want_rel[0], 1e-6, "max err");
    assert_close(a->attn_recall.min, 0.5, 1e-7, "min recall");
    assert_true(a->storage_bytes.max == 16 && a->traffic_bytes.mean == 16 && a->attended_tokens.max == 2);
    kvs_replay_result_free(r);
}

/* ================================================================================================
 * Naive reference over a generated stream: every sample of the series recomputed independently
 * ============================================================================================== */

typedef struct {
    const fixture *f;
    int lists;
    int32_t *sel;  /* [L][Hkv][N][G][N] */
    int64_t *n;    /* [L][Hkv][N][G] */
} sel_log;

static size_t cell(const fixture *f, int l, int h, int64_t p, int li) {
    return (((size_t)l * (size_t)f->Hkv + (size_t)h) * (size_t)f->N + (size_t)p) * (size_t)f->G + (size_t)li;
}

static void log_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    (void)config;
    sel_log *lg = user;
    for (int li = 0; li < sel->n_lists; li++) {
        size_t c = cell(lg->f, layer, kv_head, pos, li);
        memcpy(lg->sel + c * (size_t)lg->f->N, sel->idx[li], (size_t)sel->n[li] * sizeof(int32_t));
        lg->n[c] = sel->n[li];
    }
}

static void check_against_naive(const char *spec, int64_t budget, int expect_window_storage) {
    fixture f;
    fixture_make(&f, 2, 40, 11);
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_OK);
    size_t cells = (size_t)f.L * (size_t)f.Hkv * (size_t)f.N * (size_t)f.G;
    sel_log lg = {.f = &f, .sel = calloc(cells * (size_t)f.N, sizeof(int32_t)), .n = calloc(cells, sizeof(int64_t))};
    assert_non_null(lg.sel);
    assert_non_null(lg.n);
    kvs_replay_hooks hooks = {.user = &lg, .on_select = log_select};
    kvs_replay_result *r = run_one(&f.mem, &cfg, budget, KVS_MEASURE_DECODE, &hooks, 2);
    const kvs_replay_run_result *run = &r->runs[0];
    int per_q = kvs_policy_layout(&cfg) == KVS_SEL_PER_QUERY_HEAD;
    double *pf = malloc((size_t)f.N * sizeof(double)), *pp = malloc((size_t)f.N * sizeof(double));
    const float **kr = malloc((size_t)f.N * sizeof *kr), **vr = malloc((size_t)f.N * sizeof *vr);
    int32_t *order = malloc((size_t)f.N * sizeof(int32_t));
    assert_true(pf && pp && kr && vr && order);
    int64_t checked = 0;
    for (int64_t i = 0; i < run->n_steps; i++) {
        const kvs_results_step *s = &run->steps[i];
        int l = s->layer, qh = s->q_head, h = qh / f.G, g = qh % f.G;
        int64_t p = s->position, n = p + 1;
        /* full attention */
        for (int64_t j = 0; j < n; j++) {
            kr[j] = fk(&f, l, j, h);
            vr[j] = fv(&f, l, j, h);
        }
        double of[64], op[64];
        naive_attention(fq(&f, l, p, qh), kr, vr, n, f.d, f.scale, pf, of);
        /* the policy's set */
        size_t c = cell(&f, l, h, p, per_q ? g : 0);
        const int32_t *S = lg.sel + c * (size_t)f.N;
        int64_t m = lg.n[c];
        for (int64_t j = 0; j < m; j++) {
            kr[j] = fk(&f, l, S[j], h);
            vr[j] = fv(&f, l, S[j], h);
        }
        naive_attention(fq(&f, l, p, qh), kr, vr, m, f.d, f.scale, pp, op);
        double d2 = 0, n2 = 0, dot = 0, p2 = 0, recall = 0;
        for (int x = 0; x < f.d; x++) {
            d2 += (of[x] - op[x]) * (of[x] - op[x]);
            n2 += of[x] * of[x];
            p2 += op[x] * op[x];
            dot += of[x] * op[x];
        }
        for (int64_t j = 0; j < m; j++) recall += pf[S[j]];
        /* top-|S| of the full attention by insertion ranking, ties to the lower position */
        for (int64_t j = 0; j < n; j++) order[j] = (int32_t)j;
        for (int64_t a = 1; a < n; a++)
            for (int64_t b = a; b > 0 && (pf[order[b]] > pf[order[b - 1]]); b--) {
                int32_t tmp = order[b];
                order[b] = order[b - 1];
                order[b - 1] = tmp;
            }
        int64_t hit = 0;
        for (int64_t j = 0; j < m; j++)
            for (int64_t rnk = 0; rnk < m; rnk++) hit += order[rnk] == S[j];
        assert_close(s->out_err, sqrt(d2 / n2), 2e-5, "naive out_err");
        assert_close(s->out_err_abs, sqrt(d2), 2e-5, "naive out_err_abs");
        assert_close(s->out_cos, dot / sqrt(n2 * p2), 2e-5, "naive cos");
        assert_close(s->attn_recall, recall, 2e-5, "naive recall");
        assert_true(s->attended_tokens == (double)m);
        assert_close(s->topk_overlap, (double)hit / (double)m, 1e-7, "naive overlap"); /* float sample */
        if (expect_window_storage) {
            double kvb = 2.0 * f.d * 2; /* K + V, 2-byte elements */
            assert_true(s->storage_bytes == kvb * (double)m && s->traffic_bytes == kvb * (double)m);
            assert_true(s->compression_ratio == (double)n / (double)m);
        }
        checked++;
    }
    assert_true(checked == (int64_t)f.L * f.H * (f.N - f.turns[0].prompt_end - (f.turns[1].prompt_end - f.turns[1].begin)));
    free(pf);
    free(pp);
    free((void *)kr);
    free((void *)vr);
    free(order);
    free(lg.sel);
    free(lg.n);
    kvs_replay_result_free(r);
    kvs_test_replay_fixture_free(&f);
}

static void test_window_matches_naive_metrics(void **state) {
    (void)state;
    check_against_naive("window", 7, 1);
}

static void test_h2o_expand_matches_naive_metrics(void **state) {
    (void)state;
    check_against_naive("h2o:gqa=expand", 9, 0);
}

/* ================================================================================================
 * Merged slots
 * ============================================================================================== */

/* Keeps a merged slot attributed to position 0 whose K/V are the mean of positions 0 and 1 (computed in the
 * first prefill, when both are readable), plus a window of the most recent B-1 positions from 2 on. */
typedef struct {
    int64_t budget, seen;
    int d;
    float *mk, *mv;
} merge_state;

static kvs_status merge_create(const kvs_policy_init *init, void **st) {
    merge_state *s = calloc(1, sizeof *s);
    s->budget = init->budget;
    s->d = init->model->head_dim;
    s->mk = calloc((size_t)s->d, sizeof(float));
    s->mv = calloc((size_t)s->d, sizeof(float));
    *st = s;
    return KVS_OK;
}
static void merge_free(void *st) {
    merge_state *s = st;
    if (!s) return;
    free(s->mk);
    free(s->mv);
    free(s);
}
static kvs_status merge_prefill(void *st, const kvs_policy_view *v) {
    merge_state *s = st;
    if (v->turn == 0)
        for (int i = 0; i < s->d; i++) {
            s->mk[i] = 0.5f * (v->k[i] + v->k[s->d + i]);
            s->mv[i] = 0.5f * (v->v[i] + v->v[s->d + i]);
        }
    s->seen = v->n;
    return KVS_OK;
}
static int64_t merge_window_lo(const merge_state *s, int64_t n) {
    int64_t lo = n - (s->budget - 1);
    return lo < 2 ? 2 : lo;
}
static kvs_status merge_select(void *st, const kvs_policy_view *v, kvs_policy_sel *sel) {
    merge_state *s = st;
    int64_t m = 0;
    sel->idx[0][m] = 0;
    sel->row_k[0][m] = s->mk;
    sel->row_v[0][m] = s->mv;
    m++;
    for (int64_t j = merge_window_lo(s, v->n); j < v->n; j++) sel->idx[0][m++] = (int32_t)j;
    sel->n[0] = m;
    s->seen = v->n;
    return KVS_OK;
}
static int64_t merge_stored(void *st, int g, int32_t *out) {
    merge_state *s = st;
    (void)g;
    int64_t m = 0;
    out[m++] = 0;
    for (int64_t j = merge_window_lo(s, s->seen + 1); j < s->seen; j++) out[m++] = (int32_t)j;
    return m;
}
static const struct kvs_policy_ops merge_ops = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "merge_test", .summary = "test: one merged slot + window", .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP, .create = merge_create, .free = merge_free, .prefill = merge_prefill,
    .select = merge_select, .stored = merge_stored,
};

static void test_merged_slots_attend_policy_rows(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 30, 12);
    kvs_policy_config cfg;
    kvs_policy_defaults(&merge_ops, &cfg);
    const int64_t B = 6;
    kvs_replay_result *r = run_one(&f.mem, &cfg, B, KVS_MEASURE_DECODE, NULL, 2);
    const kvs_replay_run_result *run = &r->runs[0];
    assert_true(run->n_steps > 0);
    double pf[64], pp[64], of[64], op[64];
    const float *kr[64], *vr[64];
    float mk[16], mv[16];
    int merged_mass_seen = 0;
    for (int64_t i = 0; i < run->n_steps; i++) {
        const kvs_results_step *s = &run->steps[i];
        int l = s->layer, qh = s->q_head, h = qh / f.G;
        int64_t p = s->position, n = p + 1;
        for (int64_t j = 0; j < n; j++) {
            kr[j] = fk(&f, l, j, h);
            vr[j] = fv(&f, l, j, h);
        }
        naive_attention(fq(&f, l, p, qh), kr, vr, n, f.d, f.scale, pf, of);
        for (int x = 0; x < f.d; x++) {
            mk[x] = 0.5f * (fk(&f, l, 0, h)[x] + fk(&f, l, 1, h)[x]);
            mv[x] = 0.5f * (fv(&f, l, 0, h)[x] + fv(&f, l, 1, h)[x]);
        }
        int64_t m = 0, lo = n - (B - 1) < 2 ? 2 : n - (B - 1);
        kr[m] = mk;
        vr[m++] = mv;
        double recall = 0;
        for (int64_t j = lo; j < n; j++) {
            kr[m] = fk(&f, l, j, h);
            vr[m++] = fv(&f, l, j, h);
            recall += pf[j];
        }
        naive_attention(fq(&f, l, p, qh), kr, vr, m, f.d, f.scale, pp, op);
        double d2 = 0, n2 = 0;
        for (int x = 0; x < f.d; x++) {
            d2 += (of[x] - op[x]) * (of[x] - op[x]);
            n2 += of[x] * of[x];
        }
        assert_close(s->out_err, sqrt(d2 / n2), 2e-5, "merged out_err");
        assert_close(s->attn_recall, recall, 2e-5, "recall counts unmerged entries only");
        assert_close(s->attn_recall_merged, recall + pf[0], 2e-5, "merged recall counts the conserved position");
        merged_mass_seen |= pf[0] > 1e-6;
        assert_true(s->attended_tokens == (double)m);
    }
    assert_true(merged_mass_seen);
    kvs_replay_result_free(r);
    kvs_test_replay_fixture_free(&f);
}

/* ================================================================================================
 * Chunked prefill
 * ============================================================================================== */

#define CHUNK_BLOCK 4
#define CHUNK_KEEP 3

typedef struct {
    int64_t bb, n, n_q;
    int last;
} chunk_call;

static chunk_call chunk_log[64];
static int n_chunk_log;

typedef struct {
    int leaky, log;
    int32_t kept[CHUNK_KEEP + CHUNK_BLOCK];
    int64_t n_kept, seen, prompt_end;
} chunk_state;

static const kvs_policy_param chunk_params[] = {
    {"leaky", KVS_PARAM_BOOL, 0, 0, 1, NULL, "read the key of position 0 after evicting it", NULL, NULL},
};

static kvs_status chunk_create(const kvs_policy_init *init, void **st) {
    chunk_state *s = calloc(1, sizeof *s);
    s->leaky = kvs_policy_param_get(init->cfg, "leaky") != 0;
    s->log = init->layer == 0 && init->kv_head == 0;
    *st = s;
    return KVS_OK;
}
static void chunk_free(void *st) { free(st); }
static int64_t chunk_block(void *st) {
    (void)st;
    return CHUNK_BLOCK;
}
/* Keeps the CHUNK_KEEP positions with the largest first key component among what it held and the block. */
static kvs_status chunk_prefill(void *st, const kvs_policy_view *v) {
    chunk_state *s = st;
    if (s->log && n_chunk_log < 64) chunk_log[n_chunk_log++] = (chunk_call){v->block_begin, v->n, v->n_q, v->last_block};
    assert_true(v->n_q == v->n - v->block_begin && v->q_first == v->block_begin);
    for (int64_t j = v->block_begin; j < v->n; j++) s->kept[s->n_kept++] = (int32_t)j;
    /* The leak: after the first block, the parity of a function of position 0's key (which this policy may
     * have evicted) decides whether the worst or the second-worst candidate goes. */
    int flip = s->leaky && v->block_begin > 0 && fmodf(fabsf(v->k[0]) * 1e4f, 2.0f) >= 1.0f;
    while (s->n_kept > CHUNK_KEEP) {
        int64_t worst = 0, second = -1;
        for (int64_t j = 1; j < s->n_kept; j++) {
            float a = v->k[(size_t)s->kept[j] * (size_t)v->head_dim];
            if (a < v->k[(size_t)s->kept[worst] * (size_t)v->head_dim]) {
                second = worst;
                worst = j;
            } else if (second < 0 || a < v->k[(size_t)s->kept[second] * (size_t)v->head_dim]) {
                second = j;
            }
        }
        int64_t go = flip && second >= 0 ? second : worst;
        s->kept[go] = s->kept[--s->n_kept];
    }
    s->seen = v->n;
    s->prompt_end = v->prompt_end;
    return KVS_OK;
}
static kvs_status chunk_select(void *st, const kvs_policy_view *v, kvs_policy_sel *sel) {
    chunk_state *s = st;
    int64_t m = 0;
    for (int64_t j = 0; j < s->n_kept; j++) sel->idx[0][m++] = s->kept[j];
    for (int64_t j = s->prompt_end; j < v->n; j++) sel->idx[0][m++] = (int32_t)j;
    sel->n[0] = m;
    s->seen = v->n;
    return KVS_OK;
}
static int64_t chunk_stored(void *st, int g, int32_t *out) {
    chunk_state *s = st;
    (void)g;
    int64_t m = 0;
    for (int64_t j = 0; j < s->n_kept; j++) out[m++] = s->kept[j];
    for (int64_t j = s->prompt_end; j < s->seen; j++) out[m++] = (int32_t)j;
    return m;
}
static const struct kvs_policy_ops chunk_ops = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "chunk_test", .summary = "test: block-wise prefill keeping 3 prompt positions",
    .granularity = KVS_SEL_PER_KV_HEAD, .budget_scope = KVS_BUDGET_PROMPT, .params = chunk_params, .n_params = 1,
    .create = chunk_create, .free = chunk_free, .prefill = chunk_prefill, .select = chunk_select,
    .stored = chunk_stored, .prefill_block = chunk_block,
};

/* Scrambles, after every prefill block and decode step, the K/V rows the policy may not read. */
typedef struct {
    const fixture *f;
    int scramble;
    uint64_t rng;
    int32_t *sel; /* [L][Hkv][N][N] */
    int64_t *n;
} scr_log;

static void scr_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    (void)config;
    scr_log *lg = user;
    size_t c = ((size_t)layer * (size_t)lg->f->Hkv + (size_t)kv_head) * (size_t)lg->f->N + (size_t)pos;
    memcpy(lg->sel + c * (size_t)lg->f->N, sel->idx[0], (size_t)sel->n[0] * sizeof(int32_t));
    lg->n[c] = sel->n[0];
}
static void scr_step_end(void *user, int config, int layer, int kv_head, int64_t pos, void *state,
                         const struct kvs_policy_ops *ops, float *k, float *v, int64_t n) {
    (void)config;
    (void)layer;
    (void)kv_head;
    (void)pos;
    scr_log *lg = user;
    if (!lg->scramble) return;
    int32_t *buf = malloc((size_t)lg->f->N * sizeof *buf);
    char *keep = calloc((size_t)n, 1);
    int64_t m = ops->readable ? ops->readable(state, 0, buf) : ops->stored(state, 0, buf);
    for (int64_t j = 0; j < m; j++) keep[buf[j]] = 1;
    for (int64_t j = 0; j < n; j++)
        if (!keep[j])
            for (int i = 0; i < lg->f->d; i++) {
                lg->rng = lg->rng * 6364136223846793005ull + 1442695040888963407ull;
                k[(size_t)j * (size_t)lg->f->d + (size_t)i] = (float)((int64_t)(lg->rng >> 40) - (1 << 23)) / 1e3f;
                v[(size_t)j * (size_t)lg->f->d + (size_t)i] = -k[(size_t)j * (size_t)lg->f->d + (size_t)i];
            }
    free(buf);
    free(keep);
}

/* 1 when the runs with and without scrambling chose differently anywhere. */
static int chunk_run_differs(const fixture *f, int leaky) {
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse_ops(&chunk_ops, leaky ? "leaky=true" : NULL, &cfg), KVS_OK);
    size_t cells = (size_t)f->L * (size_t)f->Hkv * (size_t)f->N;
    scr_log a = {.f = f, .sel = calloc(cells * (size_t)f->N, 4), .n = calloc(cells, 8), .rng = 99};
    scr_log b = a;
    b.sel = calloc(cells * (size_t)f->N, 4);
    b.n = calloc(cells, 8);
    b.scramble = 1;
    kvs_replay_hooks ha = {.user = &a, .on_select = scr_select, .on_step_end = scr_step_end};
    kvs_replay_hooks hb = {.user = &b, .on_select = scr_select, .on_step_end = scr_step_end};
    kvs_replay_result *ra = run_one(&f->mem, &cfg, 3, KVS_MEASURE_DECODE, &ha, 1);
    kvs_replay_result *rb = run_one(&f->mem, &cfg, 3, KVS_MEASURE_DECODE, &hb, 1);
    int differ = memcmp(a.n, b.n, cells * 8) != 0 || memcmp(a.sel, b.sel, cells * (size_t)f->N * 4) != 0;
    free(a.sel);
    free(a.n);
    free(b.sel);
    free(b.n);
    kvs_replay_result_free(ra);
    kvs_replay_result_free(rb);
    return differ;
}

static void test_chunked_prefill_blocks_and_leak_check(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 38, 13); /* prompt 19: blocks [0,4) [4,8) [8,12) [12,16) [16,19) */
    assert_int_equal(f.turns[0].prompt_end, 19);
    kvs_policy_config cfg;
    kvs_policy_defaults(&chunk_ops, &cfg);
    n_chunk_log = 0;
    kvs_replay_result *r = run_one(&f.mem, &cfg, 3, KVS_MEASURE_DECODE, NULL, 1);
    kvs_replay_result_free(r);
    assert_int_equal(n_chunk_log, 5);
    for (int b = 0; b < 5; b++) {
        assert_int_equal(chunk_log[b].bb, 4 * b);
        assert_int_equal(chunk_log[b].n, b < 4 ? 4 * b + 4 : 19);
        assert_int_equal(chunk_log[b].last, b == 4);
    }
    /* the honest policy reads only what it holds; the leaky one is caught between blocks */
    assert_false(chunk_run_differs(&f, 0));
    assert_true(chunk_run_differs(&f, 1));
    kvs_test_replay_fixture_free(&f);
}

/* --measure prefill: a prompt position of block b attends what the policy held after block b-1 (positions
 * before the block) plus the block up to itself; the peak counts the whole block. */
static void test_chunked_prefill_is_measured_against_what_is_held(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 38, 14);
    kvs_policy_config cfg;
    kvs_policy_defaults(&chunk_ops, &cfg);
    kvs_replay_result *r = run_one(&f.mem, &cfg, 3, KVS_MEASURE_PREFILL, NULL, 1);
    const kvs_replay_run_result *run = &r->runs[0];
    assert_int_equal(run->n_steps, (int64_t)f.L * f.H * 19);
    double kvb = 2.0 * f.d * 2;
    for (int64_t i = 0; i < run->n_steps; i++) {
        const kvs_results_step *s = &run->steps[i];
        int64_t p = s->position, bb = p / CHUNK_BLOCK * CHUNK_BLOCK, be = bb + CHUNK_BLOCK > 19 ? 19 : bb + CHUNK_BLOCK;
        int64_t held = bb == 0 ? 0 : CHUNK_KEEP; /* the policy keeps 3 after every block */
        assert_true(s->attended_tokens == (double)(held + p - bb + 1));
        assert_true(s->storage_bytes == kvb * (double)(held + p - bb + 1));
        assert_true(s->storage_peak_bytes == kvb * (double)(held + be - bb));
        if (bb == 0) assert_true(s->out_err == 0); /* turn 0, first block: full causal attention */
    }
    assert_true(run->run_agg.storage_peak_bytes.max == kvb * (CHUNK_KEEP + CHUNK_BLOCK));
    kvs_replay_result_free(r);
    kvs_test_replay_fixture_free(&f);
}

/* ================================================================================================
 * Shared prepass data
 * ============================================================================================== */

#define SHARED_MAGIC 0x5eed5eedu

typedef struct {
    uint32_t magic;
    int L, Hkv;
    double sumk[64]; /* [L][Hkv]: sum of the first key component over the first prompt */
} shared_prepass;

static double shared_seen[64];
static int shared_bad_free;

typedef struct {
    const shared_prepass *sp;
    int64_t budget, seen;
} shared_state;

static kvs_status sh_alloc_begin(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, void **out) {
    (void)cfg;
    (void)budget;
    shared_prepass *a = calloc(1, sizeof *a);
    a->magic = SHARED_MAGIC;
    a->L = m->n_layers;
    a->Hkv = m->n_kv_heads;
    *out = a;
    return KVS_OK;
}
static kvs_status sh_alloc_prefill(void *alloc, int layer, int kv_head, const kvs_policy_view *v) {
    shared_prepass *a = alloc;
    for (int64_t j = 0; j < v->n; j++) a->sumk[layer * a->Hkv + kv_head] += v->k[(size_t)j * (size_t)v->head_dim];
    return KVS_OK;
}
static kvs_status sh_alloc_end(void *alloc, int64_t *budgets) {
    shared_prepass *a = alloc;
    for (int i = 0; i < a->L * a->Hkv; i++) budgets[i] = 2 + i % 3; /* per-head budgets from the pass */
    return KVS_OK;
}
static void sh_alloc_free(void *alloc) {
    shared_prepass *a = alloc;
    a->magic = 0;
    free(a);
}
static const void *sh_alloc_shared(void *alloc) { return alloc; }
static kvs_status sh_create(const kvs_policy_init *init, void **st) {
    shared_state *s = calloc(1, sizeof *s);
    s->sp = init->shared;
    s->budget = init->budget;
    assert_non_null(s->sp);
    shared_seen[init->layer * init->model->n_kv_heads + init->kv_head] =
        s->sp->sumk[init->layer * s->sp->Hkv + init->kv_head];
    *st = s;
    return KVS_OK;
}
static void sh_free(void *st) {
    shared_state *s = st;
    if (!s) return;
    if (s->sp->magic != SHARED_MAGIC) shared_bad_free = 1; /* the prepass object died before the instance */
    free(s);
}
static kvs_status sh_prefill(void *st, const kvs_policy_view *v) {
    ((shared_state *)st)->seen = v->n;
    return KVS_OK;
}
static kvs_status sh_select(void *st, const kvs_policy_view *v, kvs_policy_sel *sel) {
    shared_state *s = st;
    int64_t m = 0, lo = v->n - s->budget < 0 ? 0 : v->n - s->budget;
    for (int64_t j = lo; j < v->n; j++) sel->idx[0][m++] = (int32_t)j;
    sel->n[0] = m;
    s->seen = v->n;
    return KVS_OK;
}
static const struct kvs_policy_ops shared_ops = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "shared_test", .summary = "test: shared prepass data", .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP, .create = sh_create, .free = sh_free, .prefill = sh_prefill,
    .select = sh_select, .alloc_begin = sh_alloc_begin, .alloc_prefill = sh_alloc_prefill, .alloc_end = sh_alloc_end,
    .alloc_free = sh_alloc_free, .alloc_shared = sh_alloc_shared,
};

static void test_shared_prepass_reaches_every_instance(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 40, 15);
    kvs_policy_config cfg;
    kvs_policy_defaults(&shared_ops, &cfg);
    memset(shared_seen, 0, sizeof shared_seen);
    shared_bad_free = 0;
    kvs_replay_result *r = run_one(&f.mem, &cfg, 4, KVS_MEASURE_DECODE, NULL, 2);
    for (int l = 0; l < f.L; l++)
        for (int h = 0; h < f.Hkv; h++) {
            double want = 0;
            for (int64_t j = 0; j < f.turns[0].prompt_end; j++) want += fk(&f, l, j, h)[0];
            assert_close(shared_seen[l * f.Hkv + h], want, 1e-9, "shared prepass value");
            assert_int_equal(r->runs[0].budgets[l * f.Hkv + h], 2 + (l * f.Hkv + h) % 3);
        }
    assert_false(shared_bad_free);
    kvs_replay_result_free(r);
    kvs_test_replay_fixture_free(&f);
}

/* ================================================================================================
 * STRING and FILE parameters
 * ============================================================================================== */

static const kvs_policy_param text_params[] = {
    {"tag", KVS_PARAM_STRING, 0, 0, 0, NULL, "free text", "abc", NULL},
    {"calib", KVS_PARAM_FILE, 0, 0, 0, NULL, "a calibration file", NULL, NULL},
    {"k", KVS_PARAM_INT, 4, 1, 64, NULL, "an integer", NULL, NULL},
};
static const struct kvs_policy_ops text_ops = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "text_test", .summary = "test: text parameters", .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP, .params = text_params, .n_params = 3, .create = sh_create,
    .free = sh_free, .prefill = sh_prefill, .select = sh_select,
};

/* Test-only tables are not in the registry: parse their parameter part with the explicit-ops entry. */
static kvs_status parse_text(const char *params, kvs_policy_config *cfg) {
    return kvs_policy_parse_ops(&text_ops, params, cfg);
}

static void test_string_and_file_parameters(void **state) {
    (void)state;
    kvs_policy_config cfg;
    assert_int_equal(parse_text(NULL, &cfg), KVS_OK);
    assert_string_equal(kvs_policy_param_str(&cfg, "tag"), "abc");
    assert_string_equal(kvs_policy_param_str(&cfg, "calib"), "");
    assert_string_equal(cfg.canonical, "tag=abc,calib=,k=4");
    char path[] = "/tmp/kvs_calib_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "abc", 3), 3);
    close(fd);
    char spec[512];
    snprintf(spec, sizeof spec, "tag=run-7/x.y,calib=%s", path);
    assert_int_equal(parse_text(spec, &cfg), KVS_OK);
    assert_string_equal(kvs_policy_param_str(&cfg, "tag"), "run-7/x.y");
    assert_string_equal(kvs_policy_param_str(&cfg, "calib"), path);
    assert_string_equal(kvs_policy_param_sha256(&cfg, "calib"),
                        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    char want[600];
    snprintf(want, sizeof want, "tag=run-7/x.y,calib=%s@sha256:%s,k=4", path,
             "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    assert_string_equal(cfg.canonical, want);
    /* the canonical string parses back to itself while the file is unchanged */
    kvs_policy_config again;
    assert_int_equal(parse_text(cfg.canonical, &again), KVS_OK);
    assert_string_equal(again.canonical, cfg.canonical);
    /* a changed file is refused against its recorded hash */
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "abd", 3), 3);
    close(fd);
    assert_int_equal(parse_text(cfg.canonical, &again), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "changed since it was recorded"));
    unlink(path);
    assert_int_equal(parse_text(spec, &again), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "calib"));
    assert_int_equal(parse_text("tag=a=b", &again), KVS_ERR_INVALID_ARG);
    assert_int_equal(parse_text("calib=x@sha256:XYZ", &again), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "sha256"));
}

/* ================================================================================================
 * Host storage and transfers
 * ============================================================================================== */

/* The full cache lives on the host (readable), a window of B on the device (stored); every new token is
 * copied device->host, and every third step two rows are fetched host->device. */
typedef struct {
    int64_t budget, seen;
    kvs_policy_model m;
} host_state;

static kvs_status host_create(const kvs_policy_init *init, void **st) {
    host_state *s = calloc(1, sizeof *s);
    s->budget = init->budget;
    s->m = *init->model;
    *st = s;
    return KVS_OK;
}
static kvs_status host_prefill(void *st, const kvs_policy_view *v) {
    ((host_state *)st)->seen = v->n;
    return KVS_OK;
}
static kvs_status host_select(void *st, const kvs_policy_view *v, kvs_policy_sel *sel) {
    host_state *s = st;
    int64_t m = 0, lo = v->n - s->budget < 0 ? 0 : v->n - s->budget;
    for (int64_t j = lo; j < v->n; j++) sel->idx[0][m++] = (int32_t)j;
    sel->n[0] = m;
    s->seen = v->n;
    return KVS_OK;
}
static int64_t host_stored(void *st, int g, int32_t *out) {
    host_state *s = st;
    (void)g;
    int64_t m = 0, lo = s->seen - s->budget < 0 ? 0 : s->seen - s->budget;
    for (int64_t j = lo; j < s->seen; j++) out[m++] = (int32_t)j;
    return m;
}
static int64_t host_readable(void *st, int g, int32_t *out) {
    host_state *s = st;
    (void)g;
    for (int64_t j = 0; j < s->seen; j++) out[j] = (int32_t)j;
    return s->seen;
}
static void host_account(void *st, const kvs_policy_view *v, const kvs_policy_sel *sel, kvs_policy_cost *c) {
    host_state *s = st;
    (void)sel;
    c->host_bytes = kvs_policy_kv_bytes(&s->m, (double)v->n);
    c->d2h_bytes = kvs_policy_kv_bytes(&s->m, 1);
    c->h2d_bytes = v->n % 3 == 0 ? kvs_policy_kv_bytes(&s->m, 2) : 0;
    c->aux_bytes = 16; /* a small index */
}
static const struct kvs_policy_ops host_ops = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "host_test", .summary = "test: host store + transfers", .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP, .create = host_create, .free = free, .prefill = host_prefill,
    .select = host_select, .stored = host_stored, .readable = host_readable, .account = host_account,
};

static void test_host_storage_and_transfers(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 30, 17);
    kvs_policy_config cfg;
    kvs_policy_defaults(&host_ops, &cfg);
    const int64_t B = 4;
    kvs_replay_result *r = run_one(&f.mem, &cfg, B, KVS_MEASURE_DECODE, NULL, 2);
    const kvs_results_agg *a = &r->runs[0].run_agg;
    double kvb = 2.0 * f.d * 2, host = 0, h2d = 0, cnt = 0;
    for (int64_t p = f.turns[0].prompt_end; p < f.N; p++, cnt++) {
        host += kvb * (double)(p + 1);
        h2d += (p + 1) % 3 == 0 ? 2 * kvb : 0;
    }
    assert_close(a->storage_host_bytes.mean, host / cnt, 1e-6, "host bytes");
    assert_close(a->h2d_bytes.mean, h2d / cnt, 1e-6, "h2d");
    assert_true(a->d2h_bytes.mean == kvb && a->d2h_bytes.min == kvb);
    assert_close(a->transfer_bytes.mean, h2d / cnt + kvb, 1e-6, "transfer = h2d + d2h");
    assert_true(a->storage_kv_bytes.max == kvb * B && a->storage_aux_bytes.max == 16);
    assert_true(a->storage_bytes.max == kvb * B + 16); /* device only: the host store is not device storage */
    /* the scrambling leak check leaves host-readable rows alone: choices unchanged */
    kvs_replay_result_free(r);
    kvs_test_replay_fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_computed_metrics),
        cmocka_unit_test(test_window_matches_naive_metrics),
        cmocka_unit_test(test_h2o_expand_matches_naive_metrics),
        cmocka_unit_test(test_merged_slots_attend_policy_rows),
        cmocka_unit_test(test_chunked_prefill_blocks_and_leak_check),
        cmocka_unit_test(test_chunked_prefill_is_measured_against_what_is_held),
        cmocka_unit_test(test_shared_prepass_reaches_every_instance),
        cmocka_unit_test(test_string_and_file_parameters),
        cmocka_unit_test(test_host_storage_and_transfers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
