/* test_policies.c — every baseline policy (policies/<name>.c) run through the replay engine on small GENERATED
 * streams (tests/util/gen_trace.h: seeded Gaussian q/k/v, not a model) and compared, at every step, with a
 * NAIVE reference written here: dense arrays and plain loops that recompute the policy's choice from scratch
 * each step, following POLICY_SPEC §2.6 (B1 full, B2 Exact-TopK, B3 window/StreamingLLM, B4 H2O with the MorphKV
 * repository's variant and KeyDiff's block-wise prompt processing, B8 TOVA with its block mode).
 * Attention itself comes from common/kvs_math.h (the one shared implementation) in both.
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
#include "../sim/policy.h"
#include "../policies/registry.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"

/* ---- fixture: generated data as an in-memory source ---------------------------------------------- */

typedef kvs_test_replay_fixture fixture;

static void fixture_make(fixture *f, int n_turns, int group, int n_pos, uint64_t seed) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = n_pos;
    o.n_turns = n_turns;
    o.n_kv_heads = 2;
    o.n_heads = 2 * group;
    o.head_dim = 8;
    o.block_positions = 7;
    o.seed = seed;
    o.q_scale = 2.0f; /* sharper attention: choices differ between policies */
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 7, f), KVS_OK);
}

static void fixture_free(fixture *f) { kvs_test_replay_fixture_free(f); }

/* ---- selections recorded from the engine, or produced by a reference ----------------------------- */

typedef struct {
    int L, Hkv, G;
    int64_t N;
    int32_t **set;   /* [(l*Hkv+h)*N + p][li] -> sorted positions, NULL when no selection */
    int64_t *n;
    int *n_lists;    /* per (l, h, p) */
} selections;

static void sel_init(selections *s, const fixture *f) {
    s->L = f->L;
    s->Hkv = f->Hkv;
    s->G = f->G;
    s->N = f->N;
    size_t cells = (size_t)f->L * (size_t)f->Hkv * (size_t)f->N;
    s->set = calloc(cells * (size_t)f->G, sizeof *s->set);
    s->n = calloc(cells * (size_t)f->G, sizeof *s->n);
    s->n_lists = calloc(cells, sizeof *s->n_lists);
    assert_non_null(s->set);
    assert_non_null(s->n);
    assert_non_null(s->n_lists);
}

static void sel_free(selections *s) {
    size_t cells = (size_t)s->L * (size_t)s->Hkv * (size_t)s->N;
    for (size_t i = 0; i < cells * (size_t)s->G; i++) free(s->set[i]);
    free(s->set);
    free(s->n);
    free(s->n_lists);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void sel_put(selections *s, int l, int h, int64_t p, int li, int n_lists, const int32_t *idx, int64_t n) {
    size_t cell = ((size_t)l * (size_t)s->Hkv + (size_t)h) * (size_t)s->N + (size_t)p;
    s->n_lists[cell] = n_lists;
    int32_t *c = malloc((size_t)(n > 0 ? n : 1) * sizeof *c);
    assert_non_null(c);
    memcpy(c, idx, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_i32);
    free(s->set[cell * (size_t)s->G + (size_t)li]);
    s->set[cell * (size_t)s->G + (size_t)li] = c;
    s->n[cell * (size_t)s->G + (size_t)li] = n;
}

static void on_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    (void)config;
    selections *s = user;
    for (int li = 0; li < sel->n_lists; li++) sel_put(s, layer, kv_head, pos, li, sel->n_lists, sel->idx[li], sel->n[li]);
}

/* Compares every recorded selection; returns the number of cells compared. */
static int64_t sel_compare(const selections *a, const selections *b) {
    int64_t compared = 0;
    size_t cells = (size_t)a->L * (size_t)a->Hkv * (size_t)a->N;
    for (size_t c = 0; c < cells; c++) {
        assert_int_equal(a->n_lists[c], b->n_lists[c]);
        for (int li = 0; li < a->n_lists[c]; li++) {
            size_t k = c * (size_t)a->G + (size_t)li;
            if (a->n[k] != b->n[k] || memcmp(a->set[k], b->set[k], (size_t)a->n[k] * sizeof(int32_t))) {
                print_error("selection differs at layer %zu kv head %zu position %zu list %d (engine %lld vs reference %lld entries)\n",
                            c / ((size_t)a->Hkv * (size_t)a->N), (c / (size_t)a->N) % (size_t)a->Hkv, c % (size_t)a->N, li,
                            (long long)a->n[k], (long long)b->n[k]);
                fail();
            }
            compared++;
        }
    }
    return compared;
}

static kvs_replay_result *run_engine(const fixture *f, const char *spec, int64_t budget, selections *rec) {
    kvs_replay_config cfg = {.budget = budget, .budget_fraction = -1};
    assert_int_equal(kvs_policy_parse(spec, &cfg.policy), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, &src), KVS_OK);
    kvs_replay_hooks hooks = {.user = rec, .on_select = on_select};
    kvs_replay_opts o = {.configs = &cfg, .n_configs = 1, .threads = 2, .measure = KVS_MEASURE_DECODE,
                         .hooks = rec ? &hooks : NULL};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
    assert_int_equal(r->runs[0].status, KVS_OK);
    return r;
}

/* ---- reference helpers ---------------------------------------------------------------------------- */

static const float *ref_k(const fixture *f, int l, int h) { return f->g->k + ((size_t)l * (size_t)f->N * (size_t)f->Hkv + (size_t)h) * (size_t)f->d; }
static const float *ref_v(const fixture *f, int l, int h) { return f->g->v + ((size_t)l * (size_t)f->N * (size_t)f->Hkv + (size_t)h) * (size_t)f->d; }
static const float *ref_q(const fixture *f, int l, int64_t p, int qh) {
    return f->g->q + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)f->H + (size_t)qh) * (size_t)f->d;
}

/* Attention probabilities of query head (h, g) at query position qp over the listed positions. */
static void ref_probs(const fixture *f, int l, int h, int g, int64_t qp, const int32_t *idx, int64_t n, float *probs) {
    float out[64];
    kvs_attention(ref_q(f, l, qp, h * f->G + g), ref_k(f, l, h), ref_v(f, l, h), (size_t)f->Hkv * (size_t)f->d, idx,
                  (size_t)n, (size_t)f->d, f->scale, probs, out);
}

/* Positions p with mask[p] set, ascending. */
static int64_t ref_list(const char *mask, int64_t n, int32_t *out) {
    int64_t m = 0;
    for (int64_t p = 0; p < n; p++)
        if (mask[p]) out[m++] = (int32_t)p;
    return m;
}

static int turn_of_pos(const fixture *f, int64_t p) {
    for (int64_t t = 0; t < f->n_turns; t++)
        if (p < f->turns[t].end) return (int)t;
    return (int)f->n_turns - 1;
}

static int is_decode(const fixture *f, int64_t p) { return p >= f->turns[turn_of_pos(f, p)].prompt_end; }

/* ---- full, window, streaming: closed forms --------------------------------------------------------- */

static void ref_window(const fixture *f, int64_t B, int64_t sinks, selections *out) {
    int32_t *buf = malloc((size_t)f->N * sizeof *buf);
    for (int l = 0; l < f->L; l++)
        for (int h = 0; h < f->Hkv; h++)
            for (int64_t p = 0; p < f->N; p++) {
                if (!is_decode(f, p)) continue;
                int64_t m = 0;
                for (int64_t j = 0; j <= p; j++) {
                    int in_sink = j < sinks, in_recent = j > p - (B - sinks);
                    if (in_sink || in_recent) buf[m++] = (int32_t)j;
                }
                sel_put(out, l, h, p, 0, 1, buf, m);
            }
    free(buf);
}

static void test_full_matches_reference_and_has_zero_error(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 2, 60, 11);
    selections eng, ref;
    sel_init(&eng, &f);
    sel_init(&ref, &f);
    kvs_replay_result *r = run_engine(&f, "full", 8, &eng);
    ref_window(&f, f.N, 0, &ref); /* a window wider than the trace = everything */
    assert_true(sel_compare(&eng, &ref) > 0);
    assert_true(r->runs[0].run_agg.out_err.max == 0.0);
    assert_true(fabs(r->runs[0].run_agg.attn_recall.min - 1.0) < 1e-5); /* a sum of fp32 probabilities */
    assert_true(r->runs[0].run_agg.topk_overlap.min == 1.0);
    kvs_replay_result_free(r);
    sel_free(&eng);
    sel_free(&ref);
    fixture_free(&f);
}

static void test_window_matches_reference(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 2, 60, 12);
    for (int64_t B = 1; B <= 40; B += 13) {
        selections eng, ref;
        sel_init(&eng, &f);
        sel_init(&ref, &f);
        kvs_replay_result *r = run_engine(&f, "window", B, &eng);
        ref_window(&f, B, 0, &ref);
        assert_true(sel_compare(&eng, &ref) > 0);
        assert_true(r->runs[0].max_attended <= B);
        kvs_replay_result_free(r);
        sel_free(&eng);
        sel_free(&ref);
    }
    fixture_free(&f);
}

static void test_streaming_matches_reference(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 2, 64, 13);
    const int64_t sinks[] = {0, 4, 9};
    for (int si = 0; si < 3; si++) {
        char spec[64];
        snprintf(spec, sizeof spec, "streaming:sinks=%lld", (long long)sinks[si]);
        selections eng, ref;
        sel_init(&eng, &f);
        sel_init(&ref, &f);
        kvs_replay_result *r = run_engine(&f, spec, 12, &eng);
        ref_window(&f, 12, sinks[si], &ref);
        assert_true(sel_compare(&eng, &ref) > 0);
        kvs_replay_result_free(r);
        sel_free(&eng);
        sel_free(&ref);
    }
    fixture_free(&f);
}

/* ---- H2O (B4) ------------------------------------------------------------------------------------- */

/* Dense reference: resident mask + acc per (layer, KV head, cache list); scores recomputed from scratch.
 * Variants: prefill_budget (only the turn's last B prompt queries score, MorphKV repo), window > 0 (keep the
 * last `window` + the current token, B - window - 1 heavy hitters), block > 0 (the prompt in blocks of that
 * many positions from the turn's start, compressed after each). */
static void ref_h2o_ex(const fixture *f, int64_t B, double recent_frac, int mean, int prefill_budget, int64_t window,
                       int64_t block, selections *out) {
    int64_t heavy = window > 0 ? B - 1 - window : (int64_t)((1.0 - recent_frac) * (double)B);
    if (heavy > B - 1) heavy = B - 1;
    if (heavy < 0) heavy = 0;
    int64_t recent = B - heavy;
    int n_lists = mean ? 1 : f->G;
    char *res = malloc((size_t)f->N);
    double *acc = malloc((size_t)f->N * sizeof *acc);
    int32_t *list = malloc((size_t)f->N * sizeof *list);
    float *pr = malloc((size_t)f->N * sizeof *pr);
    for (int l = 0; l < f->L; l++)
        for (int h = 0; h < f->Hkv; h++)
            for (int li = 0; li < n_lists; li++) {
                int g_lo = mean ? 0 : li, g_hi = mean ? f->G : li + 1;
                memset(res, 0, (size_t)f->N);
                for (int64_t j = 0; j < f->N; j++) acc[j] = 0;
                for (int64_t t = 0; t < f->n_turns; t++) {
                    const kvs_turn *tu = &f->turns[t];
                    /* prefill: every (scoring) prompt query adds its causal attention over cache + prompt so
                     * far; the candidates are compressed at the end of every block (one block: the prompt) */
                    for (int64_t i = tu->begin; i < tu->prompt_end; i++) {
                        res[i] = 1;
                        int64_t m = ref_list(res, i + 1, list);
                        if (!prefill_budget || i >= tu->prompt_end - B) {
                            double *a = calloc((size_t)m, sizeof *a);
                            for (int g = g_lo; g < g_hi; g++) {
                                ref_probs(f, l, h, g, i, list, m, pr);
                                for (int64_t j = 0; j < m; j++) a[j] += pr[j];
                            }
                            for (int64_t j = 0; j < m; j++) acc[list[j]] += a[j] / (g_hi - g_lo);
                            free(a);
                        }
                        int block_end = i == tu->prompt_end - 1 || (block > 0 && (i - tu->begin + 1) % block == 0);
                        if (!block_end) continue;
                        m = ref_list(res, i + 1, list);
                        if (m > B - 1) {
                            /* keep the last recent-1 and the heavy best (acc desc, older first) of the rest */
                            int64_t old = m - (recent - 1), want = (B - 1) - (recent - 1);
                            for (int64_t j = 0; j < old; j++) res[list[j]] = 0;
                            for (int64_t k = 0; k < want; k++) {
                                int64_t best = -1;
                                for (int64_t j = 0; j < old; j++)
                                    if (!res[list[j]] && (best < 0 || acc[list[j]] > acc[list[best]])) best = j;
                                if (best < 0) break;
                                res[list[best]] = 1;
                            }
                        }
                    }
                    for (int64_t p = tu->prompt_end; p < tu->end; p++) {
                        res[p] = 1;
                        acc[p] = 0;
                        int64_t m = ref_list(res, p + 1, list);
                        sel_put(out, l, h, p, li, n_lists, list, m);
                        double *a = calloc((size_t)m, sizeof *a);
                        for (int g = g_lo; g < g_hi; g++) {
                            ref_probs(f, l, h, g, p, list, m, pr);
                            for (int64_t j = 0; j < m; j++) a[j] += pr[j];
                        }
                        for (int64_t j = 0; j < m; j++) acc[list[j]] += mean ? a[j] / f->G : a[j];
                        free(a);
                        if (m == B) {
                            int64_t cand = m - recent, victim = 0;
                            for (int64_t j = 0; j < cand; j++)
                                if (acc[list[j]] <= acc[list[victim]]) victim = j;
                            res[list[victim]] = 0;
                        }
                    }
                }
            }
    free(res);
    free(acc);
    free(list);
    free(pr);
}

static void ref_h2o(const fixture *f, int64_t B, double recent_frac, int mean, selections *out) {
    ref_h2o_ex(f, B, recent_frac, mean, 0, 0, 0, out);
}

static void test_h2o_matches_reference(void **state) {
    (void)state;
    const struct {
        int turns, group;
        const char *spec;
        int64_t B;
        double recent;
        int mean;
    } cases[] = {
        {1, 2, "h2o", 10, 0.5, 0},          {1, 2, "h2o:gqa=mean", 10, 0.5, 1},
        {2, 2, "h2o:recent=0.25", 13, 0.25, 0}, {1, 1, "h2o:recent=1", 6, 1.0, 0},
        {2, 3, "h2o:gqa=mean,recent=0.3", 9, 0.3, 1}, {1, 2, "h2o", 1, 0.5, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fixture f;
        fixture_make(&f, cases[c].turns, cases[c].group, 56, 20 + c);
        selections eng, ref;
        sel_init(&eng, &f);
        sel_init(&ref, &f);
        kvs_replay_result *r = run_engine(&f, cases[c].spec, cases[c].B, &eng);
        ref_h2o(&f, cases[c].B, cases[c].recent, cases[c].mean, &ref);
        assert_true(sel_compare(&eng, &ref) > 0);
        kvs_replay_result_free(r);
        sel_free(&eng);
        sel_free(&ref);
        fixture_free(&f);
    }
}

/* ---- TOVA (B8) ------------------------------------------------------------------------------------ */

/* block > 0: the prompt in blocks of that many positions from the turn's start, each scored by its last query
 * over what is kept plus the block and cut to B-1 (one block: the whole prompt, the last prompt query). */
static void ref_tova_ex(const fixture *f, int64_t B, int layer_mode, int protect, int64_t block, selections *out) {
    int HH = f->Hkv;
    char *res = malloc((size_t)HH * (size_t)f->N);
    int32_t *list = malloc((size_t)f->N * sizeof *list);
    float *pr = malloc((size_t)f->N * sizeof *pr);
    double *sc = malloc((size_t)HH * (size_t)f->N * sizeof *sc); /* per KV head: group-mean score by position */
    for (int l = 0; l < f->L; l++) {
        memset(res, 0, (size_t)HH * (size_t)f->N);
        for (int64_t t = 0; t < f->n_turns; t++) {
            const kvs_turn *tu = &f->turns[t];
            for (int phase = 0; phase < 2; phase++) {
                int64_t p_lo = phase == 0 ? tu->begin : tu->prompt_end, p_hi = phase == 0 ? tu->prompt_end : tu->end;
                if (phase == 0 && tu->prompt_end <= tu->begin) continue;
                for (int64_t p = p_lo; p < p_hi; p++) {
                    if (phase == 0 && p != tu->prompt_end - 1 && !(block > 0 && (p - tu->begin + 1) % block == 0))
                        continue; /* prefill: block ends only */
                    int64_t m = 0;
                    for (int h = 0; h < HH; h++) {
                        char *r = res + (size_t)h * (size_t)f->N;
                        if (phase == 0)
                            for (int64_t j = block > 0 ? p - (p - tu->begin) % block : tu->begin; j <= p; j++) r[j] = 1;
                        else
                            r[p] = 1;
                        m = ref_list(r, p + 1, list);
                        if (phase == 1) sel_put(out, l, h, p, 0, 1, list, m);
                        for (int64_t j = 0; j < m; j++) sc[(size_t)h * (size_t)f->N + (size_t)list[j]] = 0;
                        for (int g = 0; g < f->G; g++) {
                            ref_probs(f, l, h, g, p, list, m, pr);
                            for (int64_t j = 0; j < m; j++) sc[(size_t)h * (size_t)f->N + (size_t)list[j]] += pr[j];
                        }
                        for (int64_t j = 0; j < m; j++) sc[(size_t)h * (size_t)f->N + (size_t)list[j]] /= f->G;
                    }
                    for (int h = 0; h < HH; h++) {
                        if (layer_mode && h > 0) break; /* layer mode: head 0 decides for all */
                        char *r = res + (size_t)h * (size_t)f->N;
                        m = ref_list(r, p + 1, list);
                        double *score = calloc((size_t)m, sizeof *score);
                        for (int64_t j = 0; j < m; j++) {
                            if (layer_mode) {
                                for (int hh = 0; hh < HH; hh++) score[j] += sc[(size_t)hh * (size_t)f->N + (size_t)list[j]];
                                score[j] /= HH;
                            } else {
                                score[j] = sc[(size_t)h * (size_t)f->N + (size_t)list[j]];
                            }
                        }
                        char *targets[64];
                        int nt = 0;
                        if (layer_mode)
                            for (int hh = 0; hh < HH; hh++) targets[nt++] = res + (size_t)hh * (size_t)f->N;
                        else
                            targets[nt++] = r;
                        if (phase == 0 && m > B - 1) {
                            /* keep the B-1 best by float score, older first on ties; last prompt token if protected */
                            char *keep = calloc((size_t)m, 1);
                            int64_t want = B - 1;
                            if (protect) {
                                if (m > 0) keep[m - 1] = 1;
                                want--;
                            }
                            for (int64_t k = 0; k < want; k++) {
                                int64_t best = -1;
                                for (int64_t j = 0; j < m; j++)
                                    if (!keep[j] && (best < 0 || (float)score[j] > (float)score[best])) best = j;
                                if (best < 0) break;
                                keep[best] = 1;
                            }
                            for (int64_t j = 0; j < m; j++)
                                if (!keep[j])
                                    for (int k = 0; k < nt; k++) targets[k][list[j]] = 0;
                            free(keep);
                        } else if (phase == 1 && m == B) {
                            int64_t lim = protect ? m - 1 : m, v = 0;
                            for (int64_t j = 0; j < lim; j++)
                                if (score[j] <= score[v]) v = j;
                            for (int k = 0; k < nt; k++) targets[k][list[v]] = 0;
                        }
                        free(score);
                    }
                }
            }
        }
    }
    free(res);
    free(list);
    free(pr);
    free(sc);
}

static void ref_tova(const fixture *f, int64_t B, int layer_mode, int protect, selections *out) {
    ref_tova_ex(f, B, layer_mode, protect, 0, out);
}

static void test_tova_matches_reference(void **state) {
    (void)state;
    const struct {
        int turns, group;
        const char *spec;
        int64_t B;
        int layer, protect;
    } cases[] = {
        {1, 2, "tova", 10, 1, 0},
        {1, 2, "tova:mode=group", 10, 0, 0},
        {2, 2, "tova:protect_current=true", 8, 1, 1},
        {2, 3, "tova:mode=group,protect_current=1", 7, 0, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fixture f;
        fixture_make(&f, cases[c].turns, cases[c].group, 50, 40 + c);
        selections eng, ref;
        sel_init(&eng, &f);
        sel_init(&ref, &f);
        kvs_replay_result *r = run_engine(&f, cases[c].spec, cases[c].B, &eng);
        ref_tova(&f, cases[c].B, cases[c].layer, cases[c].protect, &ref);
        assert_true(sel_compare(&eng, &ref) > 0);
        kvs_replay_result_free(r);
        sel_free(&eng);
        sel_free(&ref);
        fixture_free(&f);
    }
}

/* The variants, each against the extended reference: the MorphKV repository's prefill (last B queries) and
 * absolute window, KeyDiff's block-wise prompt processing (blocks from each turn's start, 1 = token by token,
 * larger than the prompt = one block), and their combinations. */
static void test_h2o_variants_match_reference(void **state) {
    (void)state;
    const struct {
        int turns, group;
        const char *spec;
        int64_t B;
        double recent;
        int mean, prefill_budget;
        int64_t window, block;
    } cases[] = {
        {1, 2, "h2o:prefill=budget", 10, 0.5, 0, 1, 0, 0},
        {2, 2, "h2o:gqa=mean,prefill=budget", 7, 0.5, 1, 1, 0, 0},
        {1, 2, "h2o:window=3", 9, 0.5, 0, 0, 3, 0},
        {2, 3, "h2o:gqa=mean,window=4,prefill=budget", 12, 0.5, 1, 1, 4, 0},
        {1, 2, "h2o:window=20", 10, 0.5, 0, 0, 20, 0}, /* no heavy hitter left: a window */
        {1, 2, "h2o:block=5", 8, 0.5, 0, 0, 0, 5},
        {2, 2, "h2o:gqa=mean,block=4,recent=0.25", 9, 0.25, 1, 0, 0, 4},
        {1, 3, "h2o:block=1", 6, 0.5, 0, 0, 0, 1},
        {2, 2, "h2o:gqa=mean,block=6,prefill=budget,window=2", 8, 0.5, 1, 1, 2, 6},
        {1, 2, "h2o@keydiff", 10, 0.5, 1, 0, 0, 128}, /* a block longer than the prompt: one pass */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fixture f;
        fixture_make(&f, cases[c].turns, cases[c].group, 56, 80 + c);
        selections eng, ref;
        sel_init(&eng, &f);
        sel_init(&ref, &f);
        kvs_replay_result *r = run_engine(&f, cases[c].spec, cases[c].B, &eng);
        ref_h2o_ex(&f, cases[c].B, cases[c].recent, cases[c].mean, cases[c].prefill_budget, cases[c].window,
                   cases[c].block, &ref);
        assert_true(sel_compare(&eng, &ref) > 0);
        assert_true(r->runs[0].max_attended <= cases[c].B);
        kvs_replay_result_free(r);
        sel_free(&eng);
        sel_free(&ref);
        fixture_free(&f);
    }
}

/* The variants change the choices (the data would not catch a variant that is ignored otherwise). */
static void test_h2o_variants_change_the_choices(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 2, 56, 90);
    selections base;
    sel_init(&base, &f);
    kvs_replay_result *r0 = run_engine(&f, "h2o", 10, &base);
    const char *variants[] = {"h2o:prefill=budget", "h2o:window=2", "h2o:block=4"};
    for (int i = 0; i < 3; i++) {
        selections v;
        sel_init(&v, &f);
        kvs_replay_result *r = run_engine(&f, variants[i], 10, &v);
        int differ = 0;
        size_t cells = (size_t)f.L * (size_t)f.Hkv * (size_t)f.N * (size_t)f.G;
        for (size_t k = 0; k < cells && !differ; k++)
            differ = base.n[k] != v.n[k] || (base.n[k] && memcmp(base.set[k], v.set[k], (size_t)base.n[k] * sizeof(int32_t)));
        if (!differ) fail_msg("%s chose exactly what h2o chose", variants[i]);
        kvs_replay_result_free(r);
        sel_free(&v);
    }
    kvs_replay_result_free(r0);
    sel_free(&base);
    fixture_free(&f);
}

static void test_tova_block_mode_matches_reference(void **state) {
    (void)state;
    const struct {
        int turns, group;
        const char *spec;
        int64_t B;
        int layer, protect;
        int64_t block;
    } cases[] = {
        {1, 2, "tova:block=5", 10, 1, 0, 5},
        {1, 2, "tova:mode=group,block=4", 7, 0, 0, 4},
        {2, 2, "tova:protect_current=true,block=3", 8, 1, 1, 3},
        {2, 3, "tova:mode=group,protect_current=1,block=1", 6, 0, 1, 1},
        {1, 2, "tova@keydiff", 9, 0, 0, 128},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fixture f;
        fixture_make(&f, cases[c].turns, cases[c].group, 50, 100 + c);
        selections eng, ref;
        sel_init(&eng, &f);
        sel_init(&ref, &f);
        kvs_replay_result *r = run_engine(&f, cases[c].spec, cases[c].B, &eng);
        ref_tova_ex(&f, cases[c].B, cases[c].layer, cases[c].protect, cases[c].block, &ref);
        assert_true(sel_compare(&eng, &ref) > 0);
        if (c == 0) { /* and blocks change the choices: the whole-prompt reference differs somewhere */
            selections whole;
            sel_init(&whole, &f);
            ref_tova_ex(&f, cases[c].B, cases[c].layer, cases[c].protect, 0, &whole);
            int differ = 0;
            size_t cells = (size_t)f.L * (size_t)f.Hkv * (size_t)f.N * (size_t)f.G;
            for (size_t k = 0; k < cells && !differ; k++)
                differ = eng.n[k] != whole.n[k] ||
                         (eng.n[k] && memcmp(eng.set[k], whole.set[k], (size_t)eng.n[k] * sizeof(int32_t)));
            assert_true(differ);
            sel_free(&whole);
        }
        kvs_replay_result_free(r);
        sel_free(&eng);
        sel_free(&ref);
        fixture_free(&f);
    }
}

/* ---- Exact-TopK oracle (B2) ----------------------------------------------------------------------- */

static void ref_topk(const fixture *f, int64_t B, int per_head, selections *out) {
    float *pr = malloc((size_t)f->G * (size_t)f->N * sizeof *pr), *sum = malloc((size_t)f->N * sizeof *sum);
    int32_t *list = malloc((size_t)f->N * sizeof *list);
    char *pick = malloc((size_t)f->N);
    for (int l = 0; l < f->L; l++)
        for (int h = 0; h < f->Hkv; h++)
            for (int64_t p = 0; p < f->N; p++) {
                if (!is_decode(f, p)) continue;
                for (int g = 0; g < f->G; g++) ref_probs(f, l, h, g, p, NULL, p + 1, pr + (size_t)g * (size_t)f->N);
                int n_lists = per_head ? f->G : 1;
                for (int li = 0; li < n_lists; li++) {
                    for (int64_t j = 0; j <= p; j++) {
                        float a = 0;
                        if (per_head) a = pr[(size_t)li * (size_t)f->N + (size_t)j];
                        else
                            for (int g = 0; g < f->G; g++) a += pr[(size_t)g * (size_t)f->N + (size_t)j];
                        sum[j] = a;
                    }
                    memset(pick, 0, (size_t)f->N);
                    int64_t k = B < p + 1 ? B : p + 1;
                    for (int64_t r = 0; r < k; r++) {
                        int64_t best = -1;
                        for (int64_t j = 0; j <= p; j++)
                            if (!pick[j] && (best < 0 || sum[j] > sum[best])) best = j;
                        if (best < 0) break;
                        pick[best] = 1;
                    }
                    int64_t m = ref_list(pick, p + 1, list);
                    sel_put(out, l, h, p, li, n_lists, list, m);
                }
            }
    free(pr);
    free(sum);
    free(list);
    free(pick);
}

static void test_topk_oracle_matches_reference(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 2, 48, 60);
    for (int per_head = 0; per_head < 2; per_head++) {
        selections eng, ref;
        sel_init(&eng, &f);
        sel_init(&ref, &f);
        kvs_replay_result *r = run_engine(&f, per_head ? "topk:gqa=head" : "topk", 9, &eng);
        ref_topk(&f, 9, per_head, &ref);
        assert_true(sel_compare(&eng, &ref) > 0);
        if (per_head) assert_true(r->runs[0].run_agg.topk_overlap.min == 1.0); /* its own top-k, by definition */
        kvs_replay_result_free(r);
        sel_free(&eng);
        sel_free(&ref);
    }
    fixture_free(&f);
}

/* ---- GQA storage: per-query-head caches are counted G times --------------------------------------- */

static void test_h2o_expand_stores_group_copies(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 3, 40, 70);
    kvs_replay_result *ex = run_engine(&f, "h2o:gqa=expand", 8, NULL);
    kvs_replay_result *mn = run_engine(&f, "h2o:gqa=mean", 8, NULL);
    /* Once both caches are full, every step stores 8 slots (+8 fp32 scores) per cache: G = 3 caches vs 1. */
    double one = 8.0 * 2 * f.d * 2 + 8.0 * 4;
    assert_true(fabs(ex->runs[0].run_agg.storage_bytes.max - 3 * one) < 1e-6);
    assert_true(fabs(mn->runs[0].run_agg.storage_bytes.max - one) < 1e-6);
    kvs_replay_result_free(ex);
    kvs_replay_result_free(mn);
    fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_matches_reference_and_has_zero_error),
        cmocka_unit_test(test_window_matches_reference),
        cmocka_unit_test(test_streaming_matches_reference),
        cmocka_unit_test(test_h2o_matches_reference),
        cmocka_unit_test(test_tova_matches_reference),
        cmocka_unit_test(test_h2o_variants_match_reference),
        cmocka_unit_test(test_h2o_variants_change_the_choices),
        cmocka_unit_test(test_tova_block_mode_matches_reference),
        cmocka_unit_test(test_topk_oracle_matches_reference),
        cmocka_unit_test(test_h2o_expand_stores_group_copies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
