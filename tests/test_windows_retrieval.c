/* test_windows_retrieval.c — sliding-window layers (sim/replay.h "Sliding-window layers") for the retrieval and
 * structured policies: quest, sparq, shadowkv, rocketkv, rocketkv_mt, hsa, duo, duo_heuristic, ea, ea_decode, rkv
 * (each file's "Sliding-window layers" paragraph says what its window_evict does).
 *
 * A GENERATED trace (tests/util/gen_trace.h) long enough for pages, chunks, landmarks, stage-1 windows and R-KV's
 * buffer to matter: 240 positions in 2 turns (60 prompt + 60 generated each), 3 layers whose windows are 40 (shorter
 * than the first prompt: the window slides from the first prefill), 80 (longer than it: the window starts sliding
 * while decoding the first turn) and full. Every policy of the list, its presets and the variants that take other
 * paths (small pages, per-query-head lists, fill=tokens, group estimates, small stage-1 windows, streaming heads with
 * a window of their own, uniform head budgets, R-KV's short buffer), at budgets 16, 40, 48, 80 and 96 (40 and 80 are
 * exactly the windows: the edge case of a budget that covers one):
 * - both engines (sim/replay.c and the naive sim/replay_ref.c) give the same numbers bit for bit (every statistic of
 *   every layer, the series), and every run passes the host's selection check (nothing selected or stored before
 *   the window's first position);
 * - a budget covering a layer's window (40 and up on the 40-window, 80 and up on the 80-window; the KV head's budget
 *   after the allocation pass, which for ea's Ada-KV pool may be below B) attends exactly the window:
 *   output error 0 at every step (except where the method itself is lossy whatever the budget: ShadowKV's low-rank
 *   keys, Duo's streaming heads whose n_s + n_r is below the window), and with it the attended count is the window's;
 * - resident KV bytes and attended positions on a windowed layer never exceed the window;
 * - stored() and readable() (the host store of rocketkv_mt, ShadowKV's values) hold nothing before the window after
 *   every step (an on_step_end hook);
 * - the full-attention layer is untouched by the windows of the others: its statistics equal a replay of the same
 *   trace without windows, bit for bit;
 * - coverage: every policy of the list really replayed (validated, run OK) at two budgets or more;
 * - mutations, per policy: window_evict made a no-op, and a drop off by one (first - 1), each fail the run in both
 *   engines with the selection check's "outside the layer's sliding window";
 * - SparQ with every dimension (r = d: the estimate is the exact logit) selects, at every step of the 40-window layer,
 *   the top k of q.k over the window's positions computed here (nothing before the window, everything in it competes);
 * - Quest (pages of 4, tokens, per head) selects, at every step of the 40-window layer, what its rule gives over the
 *   live pages computed here: the page across the edge ranked by min/max that still cover its dropped keys (those
 *   folded since the turn's prefill) and contributing its live tokens only;
 * - the page helpers for a window's partial oldest page (kvs_page_select_span, kvs_page_softmax_add_span) against
 *   their rule written out here, and against kvs_page_select / kvs_page_softmax_add when nothing was dropped.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/kvs.h"
#include "common/kvs_math.h"
#include "policies/registry.h"
#include "sim/replay.h"
#include "sim/replay_mem.h"
#include "tests/util/gen_trace.h"
#include "tests/util/replay_fixture.h"
#include "tests/util/testenv.h"

static const char *const covered[] = {"quest", "sparq", "shadowkv", "rocketkv", "rocketkv_mt", "hsa",
                                      "duo", "duo_heuristic", "ea", "ea_decode", "rkv"};
enum { N_COVERED = sizeof covered / sizeof covered[0], N_LAYERS = 3 };
static const int32_t windows[N_LAYERS] = {40, 80, 0};
static const int64_t budgets[] = {16, 40, 48, 80, 96}; /* 40 and 80: exactly a window */

/* Variants beyond the defaults and presets (which the loop adds for every covered policy); lossy = 1 when the method
 * loses information whatever the budget (no zero-error check). "@P" stands for the duo pattern file's path. */
static const struct {
    const char *spec;
    int lossy;
} variants[] = {
    {"quest:page=4", 0},
    {"quest:page=4,fill=tokens,gqa=head", 0},
    {"quest:page=0", 0},
    {"quest:page=5,split=attend", 0},
    {"sparq:gqa=group", 0},
    {"sparq:r=2,split=attend,gqa=group", 0},
    {"shadowkv:c=4,local_chunks=1,outliers=2", 0},
    {"shadowkv:c=4,local_chunks=1,outliers=1,rank=3", 1},
    {"rocketkv:window=8,kernel=7", 0},
    {"rocketkv:window=8,kernel=7,rounding=gptfast", 0},
    {"rocketkv_mt:window=8,kernel=7", 0},
    {"hsa:rounding=gptfast", 0},
    {"duo:pattern=@P", 0},
    {"duo:pattern=@P,n_s=4,n_r=16", 1},
    {"duo:pattern=@P,n_s=8,n_r=80,threshold=0.5", 0},
    {"duo_heuristic:n_s=4,n_r=16,probe=16", 1},
    {"duo_heuristic:n_s=2,n_r=80,probe=8,score=mass", 0},
    {"ea:n_sink=2", 0},
    {"ea:head_alloc=uniform,use_cov=0", 0},
    {"ea_decode:qbuf=16", 0},
    {"ea_decode:qbuf=8,n_sink=0", 0},
    {"rkv:window=4,buffer=8", 0},
    {"rkv:window=2,buffer=1", 0},
};

/* Presets that are lossy whatever the budget (the defaults are not: ShadowKV's default rank is full on d = 8). */
static int preset_lossy(const char *spec) { return !strcmp(spec, "shadowkv@small-model"); }

static int covered_index(const char *name) {
    for (int i = 0; i < N_COVERED; i++)
        if (!strcmp(covered[i], name)) return i;
    return -1;
}

/* The duo gate file: one line per layer, 2 KV heads (sparsity 0.5 makes 3 of the 6 heads streaming). */
static void write_pattern(const char *path) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("0.9\t0.1\n0.2\t0.8\n0.3\t0.7\n", f);
    fclose(f);
}

/* Replaces "@P" in spec by the pattern path. */
static void expand(const char *spec, const char *pattern, char *out, size_t cap) {
    const char *at = strstr(spec, "@P");
    if (!at) {
        snprintf(out, cap, "%s", spec);
        return;
    }
    snprintf(out, cap, "%.*s%s%s", (int)(at - spec), spec, pattern, at + 2);
}

static void make_fixture(kvs_test_replay_fixture *f) {
    kvs_gen_trace_opts go = kvs_test_grouped_opts(2, 2, 240, -1, 8, 11);
    go.n_layers = N_LAYERS;
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 7, f), KVS_OK);
}

enum { MAX_CONFIGS = 512 };
static kvs_replay_config cfg[MAX_CONFIGS];
static char names[MAX_CONFIGS][160];
static int lossy[MAX_CONFIGS];

/* Every configuration of the list that validates on the source: defaults, presets and the variants, at each budget. */
static int build_configs(const kvs_replay_source *src, const char *pattern) {
    int n = 0;
    int n_specs = 0;
    static char specs[128][128];
    static int spec_lossy[128];
    for (int i = 0; i < N_COVERED; i++) {
        const struct kvs_policy_ops *ops = kvs_policy_find(covered[i]);
        assert_non_null(ops);
        for (int k = -1; k < ops->n_presets; k++) {
            if (k < 0) snprintf(specs[n_specs], sizeof specs[0], "%s", ops->name);
            else snprintf(specs[n_specs], sizeof specs[0], "%s@%s", ops->name, ops->presets[k].name);
            spec_lossy[n_specs] = preset_lossy(specs[n_specs]);
            /* duo needs its gate file */
            if (!strcmp(ops->name, "duo")) {
                char tmp[128];
                snprintf(tmp, sizeof tmp, "%s:pattern=@P", specs[n_specs]);
                expand(tmp, pattern, specs[n_specs], sizeof specs[0]);
            }
            n_specs++;
        }
    }
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        expand(variants[v].spec, pattern, specs[n_specs], sizeof specs[0]);
        spec_lossy[n_specs++] = variants[v].lossy;
    }
    for (int sidx = 0; sidx < n_specs; sidx++)
        for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
            kvs_replay_config c = {.budget = budgets[b], .budget_fraction = -1};
            if (kvs_policy_parse(specs[sidx], &c.policy) != KVS_OK)
                fail_msg("%s: %s", specs[sidx], kvs_last_error());
            if (kvs_policy_validate(&c.policy, &src->model, c.budget) != KVS_OK) continue;
            assert_true(n < MAX_CONFIGS);
            snprintf(names[n], sizeof names[n], "%.128s at budget %lld", specs[sidx], (long long)c.budget);
            lossy[n] = spec_lossy[sidx];
            cfg[n++] = c;
        }
    return n;
}

/* on_step_end: after every prefill and decode step of a windowed layer, stored() and readable() of every list hold no
 * position before the window of the next position (pos + 2 - W). */
typedef struct {
    int group;
    int failures;
    char first_failure[256];
    int64_t checked;
} hold_check;

static void check_hold(void *user, int config, int layer, int kv_head, int64_t pos, void *state,
                       const struct kvs_policy_ops *ops, float *k, float *v, int64_t n) {
    (void)kv_head;
    (void)k;
    (void)v;
    hold_check *hc = user;
    int32_t w = windows[layer];
    if (w <= 0) return;
    int64_t lo = pos + 2 - w;
    if (lo <= 0) return;
    int32_t *buf = malloc((size_t)(n + 1) * sizeof *buf);
    assert_non_null(buf);
    int lists = kvs_policy_layout(&cfg[config].policy) == KVS_SEL_PER_QUERY_HEAD ? hc->group : 1;
    for (int g = 0; g < lists; g++)
        for (int which = 0; which < 2; which++) {
            int64_t (*fn)(void *, int, int32_t *) = which ? ops->readable : ops->stored;
            if (!fn) continue;
            int64_t m = fn(state, g, buf);
            hc->checked++;
            for (int64_t j = 0; j < m; j++)
                if (buf[j] < lo) {
                    if (!hc->failures++)
                        snprintf(hc->first_failure, sizeof hc->first_failure,
                                 "%.100s: layer %d pos %lld: %s holds position %d before the window (%lld)", names[config],
                                 layer, (long long)pos, which ? "readable()" : "stored()", (int)buf[j], (long long)lo);
                    break;
                }
        }
    free(buf);
}

/* Every configuration through both engines: bit for bit, run OK (the selection check), zero error where the budget
 * covers the window, bytes and attended counts within the window; then a fast run with the hold check; then the
 * full layer against a replay without windows; then the coverage. */
static void test_retrieval_windows_engines(void **state) {
    kvs_test_tmp *tmp = *state;
    char pattern[256];
    kvs_test_tmp_path(tmp, "duo_pattern.tsv", pattern, sizeof pattern);
    write_pattern(pattern);
    kvs_test_replay_fixture f;
    make_fixture(&f);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    src.layer_window = windows;
    int n = build_configs(&src, pattern);
    assert_true(n >= 200);
    kvs_replay_opts o = {.configs = cfg, .n_configs = n, .threads = 2, .measure = KVS_MEASURE_DECODE, .series_every = 1};
    kvs_replay_result *fast = NULL, *ref = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &fast), KVS_OK);
    assert_int_equal(kvs_replay_reference(&src, &o, &ref), KVS_OK);
    double pos_bytes = 2.0 * (double)f.d * 2; /* K and V of one position, 2 bytes an element */
    int budgets_ok[N_COVERED] = {0};
    int64_t budget_seen[N_COVERED][sizeof budgets / sizeof budgets[0]];
    int64_t zero_checked = 0;
    for (int i = 0; i < n; i++) {
        const kvs_replay_run_result *x = &fast->runs[i], *y = &ref->runs[i];
        char why[512];
        if (kvs_test_runs_differ(x, y, why, sizeof why)) fail_msg("%s: %s", names[i], why);
        int per_q = kvs_policy_layout(&cfg[i].policy) == KVS_SEL_PER_QUERY_HEAD;
        for (int64_t k = 0; k < x->n_steps; k++) {
            const kvs_results_step *a = &x->steps[k];
            int32_t w = windows[a->layer];
            if (w <= 0) continue;
            int64_t in_window = a->position + 1 < w ? a->position + 1 : w;
            if (a->v[KVS_M_ATTENDED] > (double)in_window)
                fail_msg("%s: layer %d pos %lld attends %g positions, the window holds %lld", names[i], (int)a->layer,
                         (long long)a->position, a->v[KVS_M_ATTENDED], (long long)in_window);
            if (a->v[KVS_M_STORAGE_KV] > (double)w * pos_bytes * (per_q ? f.G : 1))
                fail_msg("%s: layer %d pos %lld holds %g KV bytes, above the window's", names[i], (int)a->layer,
                         (long long)a->position, a->v[KVS_M_STORAGE_KV]);
            /* a budget covering the window attends exactly the window once the window slides (the host told the
             * policy: every position of the 40-window layer; on the 80-window layer from position 80 on). The budget
             * is the KV head's after the allocation pass: Ada-KV's pool (ea's default) may give a head less than B */
            int64_t head_budget = x->budgets[(size_t)a->layer * (size_t)f.Hkv + (size_t)(a->q_head / f.G)];
            if (!lossy[i] && head_budget >= w && a->position >= w) {
                zero_checked++;
                if (a->v[KVS_M_OUT_ERR] != 0 || a->v[KVS_M_ATTENDED] != (double)w)
                    fail_msg("%s: layer %d pos %lld error %.9g attended %g with the budget covering the window %d",
                             names[i], (int)a->layer, (long long)a->position, a->v[KVS_M_OUT_ERR],
                             a->v[KVS_M_ATTENDED], (int)w);
            }
        }
        int ci = covered_index(cfg[i].policy.ops->name);
        assert_true(ci >= 0);
        int seen = 0;
        for (int b = 0; b < budgets_ok[ci]; b++) seen |= budget_seen[ci][b] == cfg[i].budget;
        if (!seen) budget_seen[ci][budgets_ok[ci]++] = cfg[i].budget;
    }
    assert_true(zero_checked > 1000);
    for (int ci = 0; ci < N_COVERED; ci++)
        if (budgets_ok[ci] < 2) fail_msg("%s replayed at %d budget(s) only", covered[ci], budgets_ok[ci]);
    kvs_replay_result_free(ref);

    /* nothing held or readable before the window, after every step (a fast run with the hook: no memo) */
    hold_check hc = {.group = f.G};
    kvs_replay_hooks hooks = {.user = &hc, .on_step_end = check_hold};
    kvs_replay_opts oh = o;
    oh.hooks = &hooks;
    oh.threads = 1;
    kvs_replay_result *hooked = NULL;
    assert_int_equal(kvs_replay_execute(&src, &oh, &hooked), KVS_OK);
    for (int i = 0; i < n; i++) assert_int_equal(hooked->runs[i].status, KVS_OK);
    if (hc.failures) fail_msg("%d hold failures, the first: %s", hc.failures, hc.first_failure);
    assert_true(hc.checked > 10000);
    kvs_replay_result_free(hooked);

    /* the full-attention layer: the same numbers as a replay without any window */
    kvs_replay_source plain = src;
    plain.layer_window = NULL;
    kvs_replay_result *full = NULL;
    assert_int_equal(kvs_replay_execute(&plain, &o, &full), KVS_OK);
    for (int i = 0; i < n; i++) {
        assert_int_equal(full->runs[i].status, KVS_OK);
        char what[256];
        snprintf(what, sizeof what, "%.160s, full layer with and without the other layers' windows", names[i]);
        char why[512];
        if (kvs_test_aggs_differ(what, &fast->runs[i].layer_aggs[2], &full->runs[i].layer_aggs[2], why, sizeof why))
            fail_msg("%s", why);
    }
    kvs_replay_result_free(full);
    kvs_replay_result_free(fast);
    kvs_test_replay_fixture_free(&f);
}

/* ---- SparQ with r = d by hand: the window's keys, and only they, compete ---- */

typedef struct {
    const kvs_test_replay_fixture *f;
    int64_t k;          /* the quota */
    int64_t checked;
    int failures;
    char first_failure[256];
} hand_check;

/* Counts list g of sel against the positions want[0..nw) computed by hand; keeps the first difference. */
static void hand_compare(hand_check *sh, const kvs_policy_sel *sel, int g, int64_t pos, int kv_head,
                         const int32_t *want, int64_t nw) {
    sh->checked++;
    if (sel->n[g] != nw || memcmp(sel->idx[g], want, (size_t)nw * sizeof *want)) {
        if (!sh->failures++)
            snprintf(sh->first_failure, sizeof sh->first_failure, "pos %lld kv head %d list %d: %lld entries, "
                     "first %d (by hand %lld, first %d)", (long long)pos, kv_head, g, (long long)sel->n[g],
                     sel->n[g] ? (int)sel->idx[g][0] : -1, (long long)nw, (int)want[0]);
    }
}

/* Replays `spec` at B = 16 on the windowed fixture in the fast engine with on_select checking each list by hand
 * (quota k): every decode list checked (each decode position is past the window of 40), none differing. The run's
 * result is returned for the caller to compare (free it). */
typedef void (*select_hook)(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel);
static kvs_replay_result *run_by_hand(const char *spec, int64_t k, select_hook on_select, kvs_test_replay_fixture *f,
                                      kvs_replay_source *src, kvs_replay_config *c) {
    make_fixture(f);
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, src), KVS_OK);
    src->layer_window = windows;
    *c = (kvs_replay_config){.budget = 16, .budget_fraction = -1};
    assert_int_equal(kvs_policy_parse(spec, &c->policy), KVS_OK);
    hand_check sh = {.f = f, .k = k};
    kvs_replay_hooks hooks = {.user = &sh, .on_select = on_select};
    kvs_replay_opts o = {.configs = c, .n_configs = 1, .threads = 1, .measure = KVS_MEASURE_DECODE, .hooks = &hooks};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(src, &o, &r), KVS_OK);
    assert_int_equal(r->runs[0].status, KVS_OK);
    if (sh.failures) fail_msg("%s: %d lists differ, the first: %s", spec, sh.failures, sh.first_failure);
    assert_int_equal(sh.checked, 120 * f->Hkv * f->G);
    return r;
}

/* At every decode step of the 40-window layer: each query head's list is the k positions of [p - 39, p] with the
 * largest logit q.k (fp64, dimensions in ascending order: SparQ's estimate with every dimension kept), ties to the
 * older position. */
static void sparq_on_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    (void)config;
    hand_check *sh = user;
    const kvs_test_replay_fixture *f = sh->f;
    if (layer != 0 || pos + 1 <= windows[0]) return;
    size_t d = (size_t)f->d, N = (size_t)f->N, row = (size_t)f->H * d, krow = (size_t)f->Hkv * d;
    int64_t lo = pos - windows[0] + 1, m = pos - lo + 1;
    double sc[64];
    int32_t want[64] = {0};
    for (int g = 0; g < f->G; g++) {
        const float *q = f->g->q + ((size_t)layer * N + (size_t)pos) * row + (size_t)(kv_head * f->G + g) * d;
        for (int64_t j = 0; j < m; j++) {
            const float *kj = f->g->k + (size_t)layer * N * krow + (size_t)(lo + j) * krow + (size_t)kv_head * d;
            double x = 0;
            for (size_t i = 0; i < d; i++) x += (double)q[i] * (double)kj[i];
            sc[j] = x;
        }
        char taken[64] = {0};
        for (int64_t t = 0; t < sh->k; t++) { /* the best not yet taken, the older among equals */
            int64_t b = -1;
            for (int64_t j = 0; j < m; j++)
                if (!taken[j] && (b < 0 || sc[j] > sc[b])) b = j;
            taken[b] = 1;
        }
        int64_t nw = 0;
        for (int64_t j = 0; j < m; j++)
            if (taken[j]) want[nw++] = (int32_t)(lo + j);
        hand_compare(sh, sel, g, pos, kv_head, want, nw);
    }
}

static void test_sparq_window_by_hand(void **state) {
    (void)state;
    kvs_test_replay_fixture f;
    kvs_replay_source src;
    kvs_replay_config c;
    kvs_replay_result *r = run_by_hand("sparq:r=8,split=attend,gqa=head", 16, sparq_on_select, &f, &src, &c), *ref = NULL;
    /* the fast engine calls on_select; the reference gives the same statistics (so the same selections' metrics) */
    kvs_replay_opts o = {.configs = &c, .n_configs = 1, .threads = 1, .measure = KVS_MEASURE_DECODE};
    assert_int_equal(kvs_replay_reference(&src, &o, &ref), KVS_OK);
    assert_int_equal(ref->runs[0].status, KVS_OK);
    char why[512];
    if (kvs_test_aggs_differ("sparq r = d, layer 0", &r->runs[0].layer_aggs[0], &ref->runs[0].layer_aggs[0], why,
                             sizeof why))
        fail_msg("%s", why);
    kvs_replay_result_free(r);
    kvs_replay_result_free(ref);
    kvs_test_replay_fixture_free(&f);
}

/* ---- Quest by hand: the page across the window's edge ---- */

/* At every decode step of the 40-window layer, quest:page=4,fill=tokens,gqa=head at B = 16 (k = 8 tokens): the live
 * pages are those holding a position of [p - 39, p]; page pi's min/max cover the keys of [max(4 pi, F), min(4 pi + 4,
 * p + 1)), F = the window's first position at the turn's prefill (the summaries are rebuilt there and then only
 * grow; a page across the edge keeps its dropped keys); each head ranks the live pages by Quest's bound (larger
 * first, the lower page among equals) and takes them whole while they fit, the first that does not fit giving its
 * oldest live tokens. */
static void quest_on_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    (void)config;
    hand_check *sh = user;
    const kvs_test_replay_fixture *f = sh->f;
    enum { P = 4 };
    if (layer != 0) return;
    size_t d = (size_t)f->d, N = (size_t)f->N, row = (size_t)f->H * d, krow = (size_t)f->Hkv * d;
    int64_t lo = pos - windows[0] + 1, F = pos < 180 ? 60 - windows[0] + 1 : 180 - windows[0] + 1;
    int64_t fp = lo / P, np = pos / P - fp + 1;
    float kmin[16][8], kmax[16][8];
    assert_true(np <= 16 && d == 8);
    for (int64_t i = 0; i < np; i++) {
        int64_t a = (fp + i) * P > F ? (fp + i) * P : F, b = (fp + i) * P + P < pos + 1 ? (fp + i) * P + P : pos + 1;
        for (int64_t j = a; j < b; j++) {
            const float *kj = f->g->k + (size_t)layer * N * krow + (size_t)j * krow + (size_t)kv_head * d;
            for (size_t e = 0; e < d; e++) {
                kmin[i][e] = j == a || kj[e] < kmin[i][e] ? kj[e] : kmin[i][e];
                kmax[i][e] = j == a || kj[e] > kmax[i][e] ? kj[e] : kmax[i][e];
            }
        }
    }
    for (int g = 0; g < f->G; g++) {
        const float *q = f->g->q + ((size_t)layer * N + (size_t)pos) * row + (size_t)(kv_head * f->G + g) * d;
        double sc[16];
        kvs_page_scores(q, NULL, d, NULL, &kmin[0][0], &kmax[0][0], d, (size_t)np, sc);
        char used[16] = {0};
        int64_t take[16] = {0}, got = 0;
        while (got < sh->k) {
            int64_t b = -1;
            for (int64_t i = 0; i < np; i++)
                if (!used[i] && (b < 0 || sc[i] > sc[b])) b = i;
            used[b] = 1;
            int64_t x = (fp + b) * P > lo ? (fp + b) * P : lo, y = (fp + b) * P + P < pos + 1 ? (fp + b) * P + P : pos + 1;
            take[b] = y - x < sh->k - got ? y - x : sh->k - got;
            got += take[b];
        }
        int32_t want[64] = {0};
        int64_t nw = 0;
        for (int64_t i = 0; i < np; i++) {
            int64_t x = (fp + i) * P > lo ? (fp + i) * P : lo;
            for (int64_t j = 0; j < take[i]; j++) want[nw++] = (int32_t)(x + j);
        }
        hand_compare(sh, sel, g, pos, kv_head, want, nw);
    }
}

static void test_quest_window_by_hand(void **state) {
    (void)state;
    kvs_test_replay_fixture f;
    kvs_replay_source src;
    kvs_replay_config c;
    kvs_replay_result_free(run_by_hand("quest:page=4,fill=tokens,gqa=head", 8, quest_on_select, &f, &src, &c));
    kvs_test_replay_fixture_free(&f);
}

/* ---- mutations: window_evict a no-op, or one position short ---- */

static const struct kvs_policy_ops *mut_orig; /* the policy under mutation (the runs below use one thread) */
static kvs_status evict_noop(void *state, int64_t first) {
    (void)state;
    (void)first;
    return KVS_OK;
}
static kvs_status evict_short(void *state, int64_t first) {
    return first - 1 > 0 ? mut_orig->window_evict(state, first - 1) : KVS_OK;
}

/* Every covered policy (defaults; duo with its gate file) at budget 96, which holds the 40-window whole: its
 * window_evict made a no-op, then one that drops one position too few; both engines fail the run with the selection
 * check's message; the policy as it is passes. */
static void test_retrieval_windows_mutations(void **state) {
    kvs_test_tmp *tmp = *state;
    char pattern[256], spec[384];
    kvs_test_tmp_path(tmp, "duo_pattern.tsv", pattern, sizeof pattern);
    write_pattern(pattern);
    kvs_test_replay_fixture f;
    make_fixture(&f);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    src.layer_window = windows;
    for (int i = 0; i < N_COVERED; i++) {
        const struct kvs_policy_ops *ops = kvs_policy_find(covered[i]);
        assert_non_null(ops);
        assert_non_null(ops->window_evict);
        if (!strcmp(covered[i], "duo")) snprintf(spec, sizeof spec, "duo:pattern=%s", pattern);
        else snprintf(spec, sizeof spec, "%s", covered[i]);
        for (int mut = 0; mut < 3; mut++) {
            struct kvs_policy_ops m = *ops;
            mut_orig = ops;
            if (mut == 1) m.window_evict = evict_noop;
            if (mut == 2) m.window_evict = evict_short;
            kvs_replay_config c = {.budget = 96, .budget_fraction = -1};
            assert_int_equal(kvs_policy_parse(spec, &c.policy), KVS_OK);
            c.policy.ops = &m;
            kvs_replay_opts o = {.configs = &c, .n_configs = 1, .threads = 1, .measure = KVS_MEASURE_DECODE};
            for (int engine = 0; engine < 2; engine++) {
                kvs_replay_result *r = NULL;
                assert_int_equal(engine ? kvs_replay_reference(&src, &o, &r) : kvs_replay_execute(&src, &o, &r), KVS_OK);
                if (mut == 0 && r->runs[0].status != KVS_OK)
                    fail_msg("%s, engine %d: %s", covered[i], engine, r->runs[0].error);
                if (mut > 0 && (r->runs[0].status != KVS_ERR_STATE ||
                                !strstr(r->runs[0].error, "outside the layer's sliding window")))
                    fail_msg("%s with window_evict %s, engine %d: status %s (%s)", covered[i],
                             mut == 1 ? "a no-op" : "one short", engine, kvs_strerror(r->runs[0].status),
                             r->runs[0].error);
                kvs_replay_result_free(r);
            }
        }
    }
    kvs_test_replay_fixture_free(&f);
}

/* ---- the span helpers of common/kvs_math.h (the oldest live page of a window holds only its slots from lo) ---- */

/* kvs_page_select_span's rule written out: pages by score (larger first, ties to the lower page), each taken with
 * its live slots while they fit, the first that does not fit cut to its first live slots (or, whole, dropped). */
static int64_t select_span_naive(const double *score, size_t page, size_t lo, size_t hi, size_t k, int whole,
                                 int32_t *out) {
    size_t fp = lo / page, np = (hi - 1) / page - fp + 1;
    char used[64] = {0}, take[64] = {0};
    size_t cut_cnt[64] = {0}, got = 0;
    if (k > hi - lo) k = hi - lo;
    for (size_t r = 0; r < np && got < k; r++) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < np; i++)
            if (!used[i] && (best == SIZE_MAX || score[i] > score[best])) best = i;
        used[best] = 1;
        size_t a = (fp + best) * page > lo ? (fp + best) * page : lo, b = (fp + best + 1) * page < hi ? (fp + best + 1) * page : hi;
        size_t cnt = b - a;
        if (cnt > k - got) {
            if (whole) break;
            cnt = k - got;
        }
        take[best] = 1;
        cut_cnt[best] = cnt;
        got += cnt;
    }
    int64_t m = 0;
    for (size_t i = 0; i < np; i++)
        if (take[i]) {
            size_t a = (fp + i) * page > lo ? (fp + i) * page : lo;
            for (size_t j = 0; j < cut_cnt[i]; j++) out[m++] = (int32_t)(a + j);
        }
    return m;
}

static void test_page_span_helpers(void **state) {
    (void)state;
    uint64_t rng = 7;
    double score[64], out1[64], out2[64];
    int32_t a[512], b[512], scratch[64];
    for (int trial = 0; trial < 400; trial++) {
        size_t page = 1 + trial % 6, hi = 1 + (size_t)(trial * 7) % 200, lo = trial % 3 ? (size_t)(trial * 13) % hi : 0;
        if (hi / page >= 60) continue;
        size_t fp = lo / page, np = (hi - 1) / page - fp + 1;
        for (size_t i = 0; i < np; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            score[i] = (double)((rng >> 40) % 9) - 4.0; /* few values: ties */
        }
        size_t k = (size_t)(trial * 5) % (hi - lo + 3);
        for (int whole = 0; whole < 2; whole++) {
            int64_t n1 = kvs_page_select_span(score, page, lo, hi, k, whole, a, scratch);
            int64_t n2 = select_span_naive(score, page, lo, hi, k, whole, b);
            assert_int_equal(n1, n2);
            assert_memory_equal(a, b, (size_t)n1 * sizeof *a);
            if (lo == 0 && !whole) { /* the plain helper's slots */
                int64_t n3 = kvs_page_select(score, np, page, hi, k, b, scratch);
                assert_int_equal(n1, n3);
                assert_memory_equal(a, b, (size_t)n1 * sizeof *a);
            }
        }
        /* the softmax: bit for bit the plain one at lo = 0; otherwise each token its page's score, summed over tokens */
        memset(out1, 0, sizeof out1);
        memset(out2, 0, sizeof out2);
        kvs_page_softmax_add_span(score, page, lo, hi, 1.7, out1);
        if (lo == 0) {
            kvs_page_softmax_add(score, np, page, hi, 1.7, out2);
            assert_memory_equal(out1, out2, np * sizeof *out1);
        }
        double mx = -INFINITY, z = 0, total = 0;
        for (size_t j = lo; j < hi; j++) mx = fmax(mx, score[j / page - fp] / 1.7);
        for (size_t j = lo; j < hi; j++) z += exp(score[j / page - fp] / 1.7 - mx);
        for (size_t i = 0; i < np; i++) {
            double want = exp(score[i] / 1.7 - mx) / z;
            assert_true(fabs(out1[i] - want) <= 1e-14 * want);
            size_t x = (fp + i) * page > lo ? (fp + i) * page : lo, y = (fp + i + 1) * page < hi ? (fp + i + 1) * page : hi;
            total += out1[i] * (double)(y - x);
        }
        assert_true(fabs(total - 1.0) < 1e-12); /* every live token's probability, once */
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_page_span_helpers),
        cmocka_unit_test(test_sparq_window_by_hand),
        cmocka_unit_test(test_quest_window_by_hand),
        cmocka_unit_test_setup_teardown(test_retrieval_windows_engines, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_retrieval_windows_mutations, kvs_test_tmp_setup, kvs_test_tmp_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
