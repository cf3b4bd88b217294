/* test_replay_page.c — page granularity (a paged cache, sim/host.h "page granularity"; kvs_replay_opts.pages;
 * `kvsim replay --page N`) against independent computations on GENERATED traces (tests/util/gen_trace.h, seeded
 * Gaussian q/k/v, not a model): a window and H2O with pages of 4 positions worked out by hand step by step (which
 * pages, the attended set, its output error, the resident and read bytes); pages of one position give the
 * token-level numbers bit for bit; no look-ahead (positions after a step, its own page's included, replaced: nothing
 * up to that step changes); the run's identity by page size; the command line (--page lists, bad values exit 1, the
 * runs.page column and the run label). The page score rules (max, sum, count) by hand with a test policy of known
 * scores; every policy with scores() under each rule, and pages with a codec, fast against reference bit for bit;
 * a window's bytes under pages with a codec (int4, token-axis K groups of 32, pages of 16) by hand. The fast and the
 * reference replay with pages are also compared bit for bit in tests/test_replay_ref.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvs_math.h"
#include "sim/codec.h"
#include "sim/host.h"
#include "policies/registry.h"
#include "sim/policy.h"
#include "sim/replay.h"
#include "sim/replay_mem.h"
#include "tests/util/cli_run.h"
#include "tests/util/gen_trace.h"
#include "tests/util/replay_fixture.h"
#include "tests/util/testenv.h"

enum { MAXN = 64 };

/* Each list of S_t of (layer 0, KV head 0) at each position, recorded by the on_select hook. */
typedef struct {
    int32_t sel[MAXN][2][MAXN];
    int64_t n[MAXN][2];
    int n_lists;
} sel_log;

static void log_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    sel_log *g = user;
    if (config != 0 || layer != 0 || kv_head != 0 || pos >= MAXN) return;
    assert_true(sel->n_lists <= 2);
    g->n_lists = sel->n_lists;
    for (int li = 0; li < sel->n_lists; li++) {
        g->n[pos][li] = sel->n[li];
        memcpy(g->sel[pos][li], sel->idx[li], (size_t)sel->n[li] * sizeof(int32_t));
    }
}

/* The series sample of (layer 0, query head qh) at position p. */
static const kvs_results_step *step_at(const kvs_replay_run_result *r, int qh, int64_t p) {
    for (int64_t k = 0; k < r->n_steps; k++)
        if (r->steps[k].layer == 0 && r->steps[k].q_head == qh && r->steps[k].position == p) return &r->steps[k];
    fail_msg("no series sample at position %lld", (long long)p);
    return NULL;
}

/* The relative L2 error of query head qh's attention over att[0..m) against the full attention at p, layer 0. */
static double err_over(const kvs_test_replay_fixture *f, int qh, int64_t p, const int32_t *att, int64_t m) {
    int d = f->d, h = qh / f->G;
    float kr[MAXN * 16], vr[MAXN * 16], probs[MAXN], out[16], ref[16];
    assert_true(d <= 16 && f->N <= MAXN);
    for (int64_t j = 0; j <= p; j++) {
        memcpy(kr + j * d, f->g->k + ((size_t)j * f->Hkv + h) * d, d * sizeof(float));
        memcpy(vr + j * d, f->g->v + ((size_t)j * f->Hkv + h) * d, d * sizeof(float));
    }
    const float *q = f->g->q + ((size_t)p * f->H + qh) * d;
    kvs_attention(q, kr, vr, d, att, (size_t)m, d, f->scale, probs, out);
    kvs_attention(q, kr, vr, d, NULL, (size_t)p + 1, d, f->scale, probs, ref);
    double e2 = 0, r2 = 0;
    for (int i = 0; i < d; i++) e2 += ((double)ref[i] - out[i]) * ((double)ref[i] - out[i]), r2 += (double)ref[i] * ref[i];
    return (float)sqrt(e2 / r2);
}

/* A window at budget 8 with pages of 4 (C = 2 pages), by hand: at position p = 4a + r, S_t = p-7..p; the newest page
 * a holds r + 1 of them, page a-1 all 4, page a-2 the other 3 - r. The second page is a-1 (4 > 3 - r): attended
 * 4(a-1)..p, 5 + r positions; resident pages a-2 (while r < 3), a-1 and a, 4 slots each (the partial newest one
 * too), at 2 x d x 2 bytes a slot. H2O at budget 8, pages of 4: its S_t recorded, its pages chosen here by the rule
 * (most selected positions, the newer among equals), the attended set and its error recomputed. */
static void test_window_and_h2o_by_hand(void **state) {
    (void)state;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(1, 2, 40, 16, 8, 5);
    kvs_test_replay_fixture f;
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 11, &f), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    kvs_replay_config cfg[2] = {{.budget = 8, .budget_fraction = -1}, {.budget = 8, .budget_fraction = -1}};
    assert_int_equal(kvs_policy_parse("h2o", &cfg[0].policy), KVS_OK);
    assert_int_equal(kvs_policy_parse("window", &cfg[1].policy), KVS_OK);
    const int64_t pages[2] = {4, 4};
    const int rules[2] = {KVS_PAGE_SCORE_COUNT, KVS_PAGE_SCORE_AUTO}; /* H2O by the count rule; the window counts */
    static sel_log lg;
    memset(&lg, 0, sizeof lg);
    kvs_replay_hooks hooks = {.user = &lg, .on_select = log_select};
    kvs_replay_opts o = {.configs = cfg, .n_configs = 2, .threads = 1, .measure = KVS_MEASURE_DECODE,
                         .series_every = 1, .hooks = &hooks, .pages = pages, .page_scores = rules};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
    assert_int_equal(r->runs[0].status, KVS_OK);
    assert_int_equal(r->runs[1].status, KVS_OK);
    const double slot = 2.0 * f.d * 2; /* bytes of one K/V slot */
    const int64_t P = f.turns[0].prompt_end;
    int32_t att[MAXN];
    int h2o_differs = 0;
    for (int64_t p = P; p < f.N; p++) {
        /* the window */
        int64_t a = p / 4, rr = p % 4, m = 0;
        for (int64_t x = 4 * (a - 1); x <= p; x++) att[m++] = (int32_t)x;
        assert_int_equal(m, 5 + rr);
        for (int qh = 0; qh < f.G; qh++) {
            const kvs_results_step *s = step_at(&r->runs[1], qh, p);
            assert_int_equal((int64_t)s->v[KVS_M_ATTENDED], m);
            assert_float_equal(s->v[KVS_M_STORAGE_KV], (rr < 3 ? 12 : 8) * slot, 0);
            assert_float_equal(s->v[KVS_M_TRAFFIC_KV], (double)m * slot, 0);
            assert_float_equal(s->v[KVS_M_OUT_ERR], err_over(&f, qh, p, att, m), 1e-6);
        }
        /* H2O (a list per query head): each list of its S_t, then the pages by the rule, by hand */
        double held_slots = 0;
        for (int li = 0; li < lg.n_lists; li++) {
            const int32_t *sl = lg.sel[p][li];
            int64_t n = lg.n[p][li], cnt[MAXN / 4 + 1] = {0}, best = -1;
            assert_true(n >= 1 && n <= 8);
            for (int64_t j = 0; j < n; j++) cnt[sl[j] / 4]++;
            for (int64_t q = a - 1; q >= 0; q--) /* newer first: the newer page wins a tie */
                if (cnt[q] > 0 && (best < 0 || cnt[q] > cnt[best])) best = q;
            for (int64_t q = 0; q <= a; q++) held_slots += 4.0 * (cnt[q] > 0 || q == a);
            m = 0;
            for (int64_t j = 0; j < n; j++) /* S_t's entries on the two pages in S_t's order, then the rest ascending */
                if (sl[j] / 4 == a || sl[j] / 4 == best) att[m++] = sl[j];
            for (int64_t x = 0; x <= p; x++) {
                int in_sel = 0;
                for (int64_t j = 0; j < n; j++) in_sel |= sl[j] == x;
                if ((x / 4 == a || x / 4 == best) && !in_sel) att[m++] = (int32_t)x;
            }
            h2o_differs |= m != n;
            for (int qh = 0; qh < f.G; qh++) {
                if (lg.n_lists > 1 && qh != li) continue;
                const kvs_results_step *s = step_at(&r->runs[0], qh, p);
                assert_int_equal((int64_t)s->v[KVS_M_ATTENDED], m);
                assert_float_equal(s->v[KVS_M_OUT_ERR], err_over(&f, qh, p, att, m), 1e-6);
            }
        }
        double read = 0;
        for (int qh = 0; qh < lg.n_lists; qh++) read += step_at(&r->runs[0], qh, p)->v[KVS_M_ATTENDED];
        const kvs_results_step *s0 = step_at(&r->runs[0], 0, p);
        assert_float_equal(s0->v[KVS_M_STORAGE_KV], held_slots * slot, 0);
        assert_float_equal(s0->v[KVS_M_TRAFFIC_KV], read * slot, 0);
    }
    assert_true(h2o_differs); /* the pages attended something else than H2O's own set at some step */
    kvs_replay_result_free(r);
    kvs_test_replay_fixture_free(&f);
}

static void assert_runs_same(const char *what, const kvs_replay_run_result *x, const kvs_replay_run_result *y) {
    assert_int_equal(x->status, KVS_OK);
    assert_int_equal(y->status, KVS_OK);
    for (int k = 0; k < KVS_N_METRICS; k++) {
        const kvs_results_stat *a = &x->run_agg.m[k], *b = &y->run_agg.m[k];
        const double xs[6] = {(double)a->n, a->mean, a->p50, a->p95, a->min, a->max};
        const double ys[6] = {(double)b->n, b->mean, b->p50, b->p95, b->min, b->max};
        if (memcmp(xs, ys, sizeof xs))
            fail_msg("%s, %s: mean %.17g against %.17g", what, kvs_metric_table[k].name, xs[1],
                     ys[1]);
    }
    assert_int_equal(x->n_steps, y->n_steps);
    for (int64_t k = 0; k < x->n_steps; k++)
        if (memcmp(x->steps[k].v, y->steps[k].v, sizeof x->steps[k].v)) fail_msg("%s: step %lld differs", what, (long long)k);
}

/* Pages of one position are the token level: every statistic and step of every metric, bit for bit, for policies
 * of each kind (shared list, per-query-head lists, merged slots, prompt-only budget, selection over the full cache,
 * the full cache, a layer-wide policy), on both engines; pages of 4 change H2O's numbers (the comparison can fail).
 * (Only for policies whose S_t holds the current position, as policy.h asks: the newest page is always attended, so
 * the top-k oracle, which may leave the current position out, attends one more entry then.) */
static void test_page_one_is_token_level(void **state) {
    (void)state;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(2, 4, 96, -1, 16, 7);
    kvs_test_replay_fixture f;
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 11, &f), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    snprintf(src.content_hash, sizeof src.content_hash, "pages");
    static const char *const specs[] = {"window", "h2o", "h2o:gqa=mean", "d2o", "snapkv", "quest", "quest:gqa=head",
                                        "full", "tova", "streaming", "scissorhands"};
    enum { NS = sizeof specs / sizeof *specs };
    kvs_replay_config cfg[2 * NS + 1];
    int64_t pages[2 * NS + 1];
    for (int i = 0; i < NS; i++) {
        cfg[2 * i] = (kvs_replay_config){.budget = 12, .budget_fraction = -1};
        assert_int_equal(kvs_policy_parse(specs[i], &cfg[2 * i].policy), KVS_OK);
        cfg[2 * i + 1] = cfg[2 * i];
        pages[2 * i] = 0, pages[2 * i + 1] = 1;
    }
    cfg[2 * NS] = cfg[2]; /* h2o, pages of 4 */
    pages[2 * NS] = 4;
    for (int reference = 0; reference < 2; reference++) {
        kvs_replay_opts o = {.configs = cfg, .n_configs = 2 * NS + 1, .threads = 2, .measure = KVS_MEASURE_ALL,
                             .series_every = 3, .pages = pages};
        kvs_replay_result *r = NULL;
        assert_int_equal((reference ? kvs_replay_reference : kvs_replay_execute)(&src, &o, &r), KVS_OK);
        for (int i = 0; i < NS; i++) assert_runs_same(specs[i], &r->runs[2 * i], &r->runs[2 * i + 1]);
        assert_int_equal(r->runs[2 * NS].status, KVS_OK);
        assert_true(r->runs[2 * NS].run_agg.m[KVS_M_OUT_ERR].mean != r->runs[2].run_agg.m[KVS_M_OUT_ERR].mean);
        assert_true(r->runs[2 * NS].run_agg.m[KVS_M_ATTENDED].mean != r->runs[2].run_agg.m[KVS_M_ATTENDED].mean);
        kvs_replay_result_free(r);
    }
    kvs_test_replay_fixture_free(&f);
}

/* No look-ahead: with the q/k/v of every position after a cut replaced (the rest of the cut's own page included),
 * every series sample up to the cut is unchanged bit for bit, for H2O, TOVA, SnapKV and D2O with pages of 4 and 16
 * (every position measured); replacing the cut itself changes the step at the cut (the check bites). */
static void test_page_no_look_ahead(void **state) {
    (void)state;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(1, 2, 80, 30, 16, 9);
    kvs_test_replay_fixture f;
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 11, &f), KVS_OK);
    size_t nq = (size_t)f.L * f.N * f.H * f.d, nk = (size_t)f.L * f.N * f.Hkv * f.d;
    float *q2 = malloc(nq * sizeof(float)), *k2 = malloc(nk * sizeof(float)), *v2 = malloc(nk * sizeof(float));
    assert_true(q2 && k2 && v2);
    static const char *const specs[] = {"h2o", "tova", "snapkv", "d2o"};
    static const int64_t page_sizes[] = {4, 16};
    kvs_replay_config cfg[8];
    int64_t pages[8];
    int n = 0;
    for (int s = 0; s < 4; s++)
        for (int k = 0; k < 2; k++) {
            cfg[n] = (kvs_replay_config){.budget = 20, .budget_fraction = -1};
            assert_int_equal(kvs_policy_parse(specs[s], &cfg[n].policy), KVS_OK);
            pages[n++] = page_sizes[k];
        }
    static const int64_t cuts[] = {41, 57};
    for (int ci = 0; ci < 2; ci++)
        for (int self = 0; self < 2; self++) {
            int64_t cut = cuts[ci], from = self ? cut : cut + 1;
            memcpy(q2, f.mem.q, nq * sizeof(float));
            memcpy(k2, f.mem.k, nk * sizeof(float));
            memcpy(v2, f.mem.v, nk * sizeof(float));
            uint64_t rng = 12345;
            for (int l = 0; l < f.L; l++)
                for (int64_t p = from; p < f.N; p++) {
                    for (int i = 0; i < f.H * f.d; i++) {
                        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                        q2[((size_t)l * f.N + p) * f.H * f.d + i] = (float)((int64_t)(rng >> 40) % 1000) / 100.0f;
                    }
                    for (int i = 0; i < f.Hkv * f.d; i++) {
                        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                        k2[((size_t)l * f.N + p) * f.Hkv * f.d + i] = (float)((int64_t)(rng >> 40) % 1000) / 100.0f;
                        v2[((size_t)l * f.N + p) * f.Hkv * f.d + i] = -(float)((int64_t)(rng >> 41) % 1000) / 100.0f;
                    }
                }
            kvs_replay_mem m2 = f.mem;
            m2.q = q2, m2.k = k2, m2.v = v2;
            kvs_replay_source a, b;
            assert_int_equal(kvs_replay_source_from_memory(&f.mem, &a), KVS_OK);
            assert_int_equal(kvs_replay_source_from_memory(&m2, &b), KVS_OK);
            kvs_replay_opts o = {.configs = cfg, .n_configs = n, .threads = 2, .measure = KVS_MEASURE_ALL,
                                 .series_every = 1, .pages = pages};
            kvs_replay_result *ra = NULL, *rb = NULL;
            assert_int_equal(kvs_replay_execute(&a, &o, &ra), KVS_OK);
            assert_int_equal(kvs_replay_execute(&b, &o, &rb), KVS_OK);
            for (int c = 0; c < n; c++) {
                const kvs_replay_run_result *x = &ra->runs[c], *y = &rb->runs[c];
                assert_int_equal(x->status, KVS_OK);
                assert_int_equal(y->status, KVS_OK);
                assert_int_equal(x->n_steps, y->n_steps);
                int at_cut_differs = 0;
                for (int64_t k = 0; k < x->n_steps; k++) {
                    int64_t p = x->steps[k].position;
                    int same = !memcmp(x->steps[k].v, y->steps[k].v, sizeof x->steps[k].v);
                    if (p < from && !same)
                        fail_msg("%s page %lld: step at %lld differs with positions from %lld replaced", specs[c / 2],
                                 (long long)pages[c], (long long)p, (long long)from);
                    if (p == cut && !same) at_cut_differs = 1;
                }
                if (self) assert_true(at_cut_differs);
            }
            kvs_replay_result_free(ra);
            kvs_replay_result_free(rb);
        }
    free(q2), free(k2), free(v2);
    kvs_test_replay_fixture_free(&f);
}


/* ---- the page score rules -------------------------------------------------------------------------------------- */

/* A test policy of known retention scores: S_t = p and every third position before it, p-3, p-6, ... (budget B
 * bounds it); score(x) = (37 x) mod 11, the current position kept whatever (INFINITY). */
static double scored_of(int32_t x) { return (double)((37 * x) % 11); }

typedef struct {
    int64_t budget;
} scored_state;

static kvs_status scored_create(const kvs_policy_init *init, void **state) {
    scored_state *s = calloc(1, sizeof *s);
    if (!s) return KVS_ERR_NOMEM;
    s->budget = init->budget;
    *state = s;
    return KVS_OK;
}
static void scored_free(void *state) { free(state); }
static kvs_status scored_prefill(void *state, const kvs_policy_view *view) {
    (void)state, (void)view;
    return KVS_OK;
}
static kvs_status scored_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    scored_state *s = state;
    int64_t n = 0;
    for (int64_t x = view->n - 1; x >= 0 && n < s->budget; x -= 3) sel->idx[0][n++] = (int32_t)x;
    sel->n[0] = n;
    return KVS_OK;
}
static int scored_scores(void *state, int g, const int32_t *idx, int64_t n, double *out) {
    (void)state, (void)g;
    int32_t newest = 0;
    for (int64_t j = 0; j < n; j++) newest = idx[j] > newest ? idx[j] : newest;
    for (int64_t j = 0; j < n; j++) out[j] = idx[j] == newest ? INFINITY : scored_of(idx[j]);
    return 1;
}
static const struct kvs_policy_ops scored_ops = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "scored_test", .summary = "test: every third position, known scores", .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP, .create = scored_create, .free = scored_free, .prefill = scored_prefill,
    .select = scored_select, .scores = scored_scores,
};

/* The rules by hand: budget 10, pages of 4 (C = 2: the newest and one more). S_t = p, p-3, ..., p-27; a page's score
 * under max / sum is the max / sum of its S_t positions' scores (the newest page aside), ties by count then the newer
 * page; count: the most positions, the newer page among equals. The attended set is the two pages' positions <= p:
 * its size and its error recomputed here for every query head and step, for each rule; and the three rules choose
 * different pages at some step (each comparison can fail). */
static void test_score_rules_by_hand(void **state) {
    (void)state;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(1, 2, 56, 16, 8, 5);
    kvs_test_replay_fixture f;
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 11, &f), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    kvs_replay_config cfg[3];
    const int64_t pages[3] = {4, 4, 4};
    const int rules[3] = {KVS_PAGE_SCORE_MAX, KVS_PAGE_SCORE_SUM, KVS_PAGE_SCORE_COUNT};
    for (int i = 0; i < 3; i++) {
        cfg[i] = (kvs_replay_config){.budget = 10, .budget_fraction = -1};
        assert_int_equal(kvs_policy_parse_ops(&scored_ops, NULL, &cfg[i].policy), KVS_OK);
    }
    for (int reference = 0; reference < 2; reference++) {
        kvs_replay_opts o = {.configs = cfg, .n_configs = 3, .threads = 1, .measure = KVS_MEASURE_DECODE,
                             .series_every = 1, .pages = pages, .page_scores = rules};
        kvs_replay_result *r = NULL;
        assert_int_equal((reference ? kvs_replay_reference : kvs_replay_execute)(&src, &o, &r), KVS_OK);
        const int64_t P = f.turns[0].prompt_end;
        int differs_max_count = 0, differs_sum_count = 0, differs_max_sum = 0;
        for (int64_t p = P; p < f.N; p++) {
            int64_t a = p / 4, best[3];
            for (int rule = 0; rule < 3; rule++) {
                double score[MAXN / 4 + 1];
                int64_t cnt[MAXN / 4 + 1] = {0};
                for (int64_t q = 0; q <= a; q++) score[q] = rule == 1 ? 0 : -INFINITY;
                for (int64_t x = p, k = 0; x >= 0 && k < 10; x -= 3, k++) {
                    double e = x == p ? INFINITY : scored_of((int32_t)x);
                    cnt[x / 4]++;
                    score[x / 4] = rule == 1 ? score[x / 4] + e : fmax(score[x / 4], e);
                }
                best[rule] = -1;
                for (int64_t q = a - 1; q >= 0; q--) { /* newer first: a full tie goes to the newer page */
                    if (cnt[q] == 0) continue;
                    if (best[rule] < 0) { best[rule] = q; continue; }
                    int64_t b = best[rule];
                    int better = rule == 2 ? cnt[q] > cnt[b]
                                           : score[q] > score[b] || (score[q] == score[b] && cnt[q] > cnt[b]);
                    if (better) best[rule] = q;
                }
                int32_t att[MAXN];
                int64_t m = 0;
                for (int64_t x = 0; x <= p; x++)
                    if (x / 4 == a || x / 4 == best[rule]) att[m++] = (int32_t)x;
                for (int qh = 0; qh < f.G; qh++) {
                    const kvs_results_step *s = step_at(&r->runs[rule], qh, p);
                    assert_int_equal((int64_t)s->v[KVS_M_ATTENDED], m);
                    assert_float_equal(s->v[KVS_M_OUT_ERR], err_over(&f, qh, p, att, m), 1e-6);
                }
            }
            differs_max_count |= best[0] != best[2];
            differs_sum_count |= best[1] != best[2];
            differs_max_sum |= best[0] != best[1];
        }
        assert_true(differs_max_count && differs_sum_count && differs_max_sum);
        kvs_replay_result_free(r);
    }
    kvs_test_replay_fixture_free(&f);
}

/* Every policy with scores() under each rule with pages of 4, and pages of 8 with a codec, fast against reference,
 * every statistic and step bit for bit; max and count differ for H2O (the rule reaches the numbers), and a policy
 * without scores() gives the same numbers whatever the rule (it always counts). */
static void test_score_rules_fast_vs_reference(void **state) {
    (void)state;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(2, 4, 96, -1, 16, 7);
    kvs_test_replay_fixture f;
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 11, &f), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    snprintf(src.content_hash, sizeof src.content_hash, "rules");
    kvs_codec *c4 = NULL;
    assert_int_equal(kvs_codec_parse("int:bits=4,group=8", &c4), KVS_OK);
    static const char *const specs[] = {"h2o", "h2o:gqa=mean", "tova", "tova:mode=layer", "snapkv:window=4",
                                        "pyramidkv:window=4", "adakv:window=4", "scissorhands", "keyformer", "knorm", "window"};
    enum { NS = sizeof specs / sizeof *specs, NR = 4 };
    static const int rules[NR] = {KVS_PAGE_SCORE_MAX, KVS_PAGE_SCORE_SUM, KVS_PAGE_SCORE_COUNT, KVS_PAGE_SCORE_MAX};
    kvs_replay_config cfg[NS * NR];
    int64_t pages[NS * NR];
    int ps[NS * NR];
    const kvs_codec *codecs[NS * NR];
    for (int i = 0; i < NS; i++)
        for (int k = 0; k < NR; k++) {
            int c = i * NR + k;
            cfg[c] = (kvs_replay_config){.budget = 12, .budget_fraction = -1};
            assert_int_equal(kvs_policy_parse(specs[i], &cfg[c].policy), KVS_OK);
            pages[c] = k == 3 ? 8 : 4;
            ps[c] = rules[k];
            codecs[c] = k == 3 ? c4 : NULL; /* the last: pages of 8 over int4 rows */
        }
    kvs_replay_result *r[2] = {NULL, NULL};
    for (int reference = 0; reference < 2; reference++) {
        kvs_replay_opts o = {.configs = cfg, .n_configs = NS * NR, .threads = 2, .measure = KVS_MEASURE_ALL,
                             .series_every = 2, .pages = pages, .page_scores = ps, .codecs = codecs};
        assert_int_equal((reference ? kvs_replay_reference : kvs_replay_execute)(&src, &o, &r[reference]), KVS_OK);
    }
    for (int c = 0; c < NS * NR; c++) {
        char what[96];
        snprintf(what, sizeof what, "%s rule %d page %lld%s (fast, reference)", specs[c / NR], ps[c],
                 (long long)pages[c], codecs[c] ? " int4" : "");
        assert_runs_same(what, &r[0]->runs[c], &r[1]->runs[c]);
    }
    /* H2O: max against count */
    assert_true(r[0]->runs[0].run_agg.m[KVS_M_OUT_ERR].mean != r[0]->runs[2].run_agg.m[KVS_M_OUT_ERR].mean);
    /* the window has no scores(): every rule counts */
    assert_runs_same("window max = count", &r[0]->runs[(NS - 1) * NR], &r[0]->runs[(NS - 1) * NR + 2]);
    kvs_replay_result_free(r[0]);
    kvs_replay_result_free(r[1]);
    kvs_codec_free(c4);
    kvs_test_replay_fixture_free(&f);
}

/* ---- pages with a codec ---------------------------------------------------------------------------------------- */

/* A window at budget 32 over int4 rows (K in token-axis groups of 32, V in channel-axis groups of 32: one group per
 * row of d = 16), pages of 16, one KV head's bytes by hand at every decode step p (n = p + 1):
 *   K of a position x: quantized (x < 32 floor(n/32)): d/2 bytes of codes, its token group's fp16 scale and zero per
 *   channel (4d bytes) once per group with a resident quantized position; else 16 bits, 2d;
 *   V of a position: d/2 codes + 4 (one group's scale and zero);
 *   a padding slot of the newest page (16 (p/16 + 1) - n of them): the codec's nominal position, d/2 + 4d/32 + d/2 + 4.
 * Resident: the pages of positions p-31..p, whole; read: the two attended pages (the newest, and page p/16 - 1,
 * which holds 16 of S_t), their positions <= p, no padding. */
static double int4_rows_bytes(int64_t lo, int64_t hi, int64_t n, int d) {
    int64_t qk = 32 * (n / 32), last_group = -1;
    double b = 0;
    for (int64_t x = lo; x <= hi; x++) {
        if (x < qk) {
            b += d / 2.0;
            if (x / 32 != last_group) b += 4.0 * d, last_group = x / 32;
        } else {
            b += 2.0 * d;
        }
        b += d / 2.0 + 4;
    }
    return b;
}

static void test_codec_pages_bytes_by_hand(void **state) {
    (void)state;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(1, 2, 120, 40, 16, 3);
    kvs_test_replay_fixture f;
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 11, &f), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    kvs_codec *c4 = NULL;
    assert_int_equal(kvs_codec_parse("int:bits=4,group=32", &c4), KVS_OK);
    assert_string_equal(kvs_codec_spec(c4), "int:bits=4,group=32,k_axis=token,v_axis=channel");
    kvs_replay_config cfg = {.budget = 32, .budget_fraction = -1};
    assert_int_equal(kvs_policy_parse("window", &cfg.policy), KVS_OK);
    const int64_t pages = 16;
    const kvs_codec *codecs[1] = {c4};
    const int d = f.d;
    assert_int_equal(d, 16);
    for (int reference = 0; reference < 2; reference++) {
        kvs_replay_opts o = {.configs = &cfg, .n_configs = 1, .threads = 1, .measure = KVS_MEASURE_DECODE,
                             .series_every = 1, .pages = &pages, .codecs = codecs};
        kvs_replay_result *r = NULL;
        assert_int_equal((reference ? kvs_replay_reference : kvs_replay_execute)(&src, &o, &r), KVS_OK);
        assert_int_equal(r->runs[0].status, KVS_OK);
        const int64_t P = f.turns[0].prompt_end;
        for (int64_t p = P; p < f.N; p++) {
            int64_t n = p + 1, a = p / 16, lo = 16 * ((p - 31 < 0 ? 0 : p - 31) / 16);
            double pad = (double)(16 * (a + 1) - n) * (d / 2.0 + 4.0 * d / 32 + d / 2.0 + 4);
            double resident = int4_rows_bytes(lo, p, n, d) + pad;
            double read = int4_rows_bytes(16 * (a - 1), p, n, d);
            const kvs_results_step *s = step_at(&r->runs[0], 0, p);
            assert_int_equal((int64_t)s->v[KVS_M_ATTENDED], p - 16 * (a - 1) + 1);
            assert_float_equal(s->v[KVS_M_STORAGE_KV], resident, 0);
            assert_float_equal(s->v[KVS_M_TRAFFIC_KV], read, 0);
        }
        kvs_replay_result_free(r);
    }
    kvs_codec_free(c4);
    kvs_test_replay_fixture_free(&f);
}

/* A run's identity: the page size changes the seed, 0 keeps the token-level one; a score rule changes it beside a
 * page size (max and sum apart), the count rule keeps the seed of a paged run of before. */
static void test_identity_by_page(void **state) {
    (void)state;
    kvs_policy_config pc;
    assert_int_equal(kvs_policy_parse("window", &pc), KVS_OK);
    kvs_policy_model m = {.n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .group = 2, .head_dim = 16, .kv_bytes = 2,
                          .aux_bytes = 4};
    kvs_host_identity id = {.content_hash = "h", .policy = &pc, .budget = 16};
    uint64_t none = kvs_host_run_seed(&id, &m);
    id.page_tokens = 0;
    assert_true(kvs_host_run_seed(&id, &m) == none);
    id.page_tokens = 16;
    uint64_t s16 = kvs_host_run_seed(&id, &m);
    id.page_tokens = 32;
    uint64_t s32 = kvs_host_run_seed(&id, &m);
    id.page_tokens = 1;
    uint64_t s1 = kvs_host_run_seed(&id, &m);
    assert_true(s16 != none && s32 != none && s1 != none && s16 != s32 && s1 != s16);
    id.page_tokens = 16;
    id.page_score = KVS_PAGE_SCORE_COUNT;
    assert_true(kvs_host_run_seed(&id, &m) == s16);
    id.page_score = KVS_PAGE_SCORE_MAX;
    uint64_t smax = kvs_host_run_seed(&id, &m);
    id.page_score = KVS_PAGE_SCORE_SUM;
    uint64_t ssum = kvs_host_run_seed(&id, &m);
    assert_true(smax != s16 && ssum != s16 && smax != ssum);
    id.page_tokens = 0; /* a rule without pages is nothing */
    assert_true(kvs_host_run_seed(&id, &m) == none);
}

/* The command line: --page 0,16,32 is three runs per (policy, budget), labelled, in runs.page and the options; bad
 * values exit 1 with nothing recorded. */
static void test_cli_page(void **state) {
    (void)state;
    char dir[] = "/tmp/kvs_replay_page_XXXXXX", db[128], out[160], err[160], trace[4096];
    assert_non_null(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/r.db", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(err, sizeof err, "%s/err", dir);
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    static const char *const bad[] = {"-1", "x", "16,", "", "1e3", "16,16x", "100000", "nonee"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *argv[] = {"replay", trace, "--db", db, "--policy", "window", "--budgets", "32", "--page",
                        (char *)bad[i], NULL};
        assert_int_equal(kvs_test_cli(out, err, (const char *const *)argv), 1);
        char *e = kvs_test_slurp(err, NULL);
        assert_non_null(strstr(e, "page"));
        free(e);
        assert_true(access(db, F_OK) != 0);
    }
    { /* given twice */
        char *argv[] = {"replay", trace, "--db", db, "--policy", "window", "--budgets", "32", "--page", "16",
                        "--page", "32", NULL};
        assert_int_equal(kvs_test_cli(out, err, (const char *const *)argv), 2);
    }
    static const char *const bad_rule[] = {"avg", "", "MAX"};
    for (size_t i = 0; i < sizeof bad_rule / sizeof *bad_rule; i++) { /* a bad rule: a usage error */
        char *argv[] = {"replay", trace, "--db", db, "--policy", "window", "--budgets", "32", "--page", "16",
                        "--page-score", (char *)bad_rule[i], NULL};
        assert_int_equal(kvs_test_cli(out, err, (const char *const *)argv), 2);
        char *e = kvs_test_slurp(err, NULL);
        assert_non_null(strstr(e, "--page-score"));
        free(e);
        assert_true(access(db, F_OK) != 0);
    }
    { /* the rule given twice */
        char *argv[] = {"replay", trace, "--db", db, "--policy", "window", "--budgets", "32", "--page", "16",
                        "--page-score", "max", "--page-score", "sum", NULL};
        assert_int_equal(kvs_test_cli(out, err, (const char *const *)argv), 2);
    }
    char *argv[] = {"replay", trace, "--db", db, "--policy", "window", "--budgets", "32", "--page", "none,16,32",
                    "--no-progress", NULL};
    assert_int_equal(kvs_test_cli(out, err, (const char *const *)argv), 0);
    char *o = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(o, "[page 16]"));
    assert_non_null(strstr(o, "[page 32]"));
    free(o);
    char *runs[] = {"runs", db, "--json", NULL};
    assert_int_equal(kvs_test_cli(out, err, (const char *const *)runs), 0);
    o = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(o, "\"page\":16"));
    assert_non_null(strstr(o, "\"page\":32"));
    assert_non_null(strstr(o, "\"page\":null"));
    assert_non_null(strstr(o, "series_every=0,page=16,page_score=count\""));
    free(o);
    /* compare keeps the page sizes apart, three series each named by its label */
    char *cmp[] = {"compare", db, "--match", "mem", "--at", "2048", NULL};
    assert_int_equal(kvs_test_cli(out, err, (const char *const *)cmp), 0);
    o = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(o, ": 3 series"));
    assert_non_null(strstr(o, "- [page 16]"));
    assert_non_null(strstr(o, "- [page 32]"));
    free(o);
    /* the rules: H2O by default max, by --page-score count the count rule, the window always counts; a codec with
     * pages runs; each labelled and recorded as it ran, compare keeping H2O's two rules apart */
    unlink(db);
    char *a1[] = {"replay", trace, "--db", db, "--policy", "window", "--policy", "h2o", "--budgets", "32", "--page",
                  "16", "--no-progress", NULL};
    assert_int_equal(kvs_test_cli(out, err, (const char *const *)a1), 0);
    char *a2[] = {"replay", trace, "--db", db, "--policy", "h2o", "--budgets", "32", "--page", "16", "--page-score",
                  "count", "--codec", "none", "--codec", "int:bits=4", "--no-progress", NULL};
    assert_int_equal(kvs_test_cli(out, err, (const char *const *)a2), 0);
    assert_int_equal(kvs_test_cli(out, err, (const char *const *)runs), 0);
    o = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(o, "series_every=0,page=16,page_score=max\""));
    assert_non_null(strstr(o, "series_every=0,page=16,page_score=count\""));
    assert_non_null(strstr(o, "v_axis=channel,page=16,page_score=count\""));
    free(o);
    char *cmp2[] = {"compare", db, "--match", "mem", "--at", "100000", NULL};
    assert_int_equal(kvs_test_cli(out, err, (const char *const *)cmp2), 0);
    o = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(o, ": 4 series"));
    assert_non_null(strstr(o, "block=0 [page 16 max]"));
    assert_non_null(strstr(o, "block=0 [page 16]"));
    assert_non_null(strstr(o, "v_axis=channel] [page 16]"));
    assert_null(strstr(o, "- [page 16 max]")); /* the window counts */
    free(o);
    unlink(db), unlink(out), unlink(err);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_and_h2o_by_hand),
        cmocka_unit_test(test_page_one_is_token_level),
        cmocka_unit_test(test_page_no_look_ahead),
        cmocka_unit_test(test_score_rules_by_hand),
        cmocka_unit_test(test_score_rules_fast_vs_reference),
        cmocka_unit_test(test_codec_pages_bytes_by_hand),
        cmocka_unit_test(test_identity_by_page),
        cmocka_unit_test(test_cli_page),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
