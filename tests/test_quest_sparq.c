/* test_quest_sparq.c — Quest and SparQ, RocketKV's dynamic-selection baselines (policies/quest.c, sparq.c;
 * POLICY_SPEC §2.6 B9-B10, §3):
 *  - a NAIVE reference written here (double precision, dense loops: page min/max straight from the keys, Quest's
 *    bound as sum_i max(q_i Kmax_i, q_i Kmin_i), SparQ's top-r |q| dimensions by repeated scan, its temperature and
 *    softmax per token, selection by repeated scan with ties to the older token) compared with the engine's
 *    selection at every decode step: page sizes 16, 4, 3 and the even-split derivation, split even and attend,
 *    group and per-head layouts, r derived or fixed, MHA and GQA 2-3, one and two turns;
 *  - the parameter rules (quota, page size, r) and the per-head layout's lists;
 *  - the reported costs of a step by hand (page summaries, the key copy, the estimate's reads).
 * Their Table 1 rows are checked with RocketKV's in tests/test_rocketkv.c, and that Quest's decode reads no key
 * but the current one (and that SparQ's does) there too.
 * Data: GENERATED Gaussian streams (tests/util/gen_trace.h), never a model's.
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
#include "../sim/policy.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"
#include "util/sets.h"

typedef kvs_test_replay_fixture fixture;

static void fixture_make(fixture *f, int n_turns, int group, int n_pos, int prompt_len, int d, uint64_t seed) {
    kvs_gen_trace_opts o = kvs_test_grouped_opts(n_turns, group, n_pos, prompt_len, d, seed);
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 11, f), KVS_OK);
}

static kvs_policy_config parse(const char *spec) {
    kvs_policy_config cfg;
    if (kvs_policy_parse(spec, &cfg) != KVS_OK) fail_msg("%s: %s", spec, kvs_last_error());
    return cfg;
}

/* ---- recording ----------------------------------------------------------------------------------------- */

typedef struct {
    const fixture *f;
    kvs_test_sets s; /* cell = ((l*Hkv+h)*N + p)*G + list */
} recorder;

static size_t cell(const fixture *f, int l, int h, int64_t p, int li) {
    return (((size_t)l * (size_t)f->Hkv + (size_t)h) * (size_t)f->N + (size_t)p) * (size_t)f->G + (size_t)li;
}

static void rec_init(recorder *r, const fixture *f) {
    r->f = f;
    assert_int_equal(kvs_test_sets_init(&r->s, (size_t)f->L * (size_t)f->Hkv * (size_t)f->N * (size_t)f->G, f->N), KVS_OK);
}

static void rec_free(recorder *r) { kvs_test_sets_free(&r->s); }

static void put(recorder *r, int l, int h, int64_t p, int li, const int32_t *idx, int64_t n) {
    kvs_test_sets_put(&r->s, cell(r->f, l, h, p, li), idx, n);
}

static void on_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    (void)config;
    for (int li = 0; li < sel->n_lists; li++) put(user, layer, kv_head, pos, li, sel->idx[li], sel->n[li]);
}

static kvs_replay_result *run_engine(const fixture *f, const char *spec, int64_t budget, recorder *rec, int series) {
    kvs_replay_config cfg = {.policy = parse(spec), .budget = budget, .budget_fraction = -1};
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, &src), KVS_OK);
    kvs_replay_hooks hooks = {.user = rec, .on_select = on_select};
    kvs_replay_opts o = {.configs = &cfg, .n_configs = 1, .threads = 2, .measure = KVS_MEASURE_DECODE,
                         .series_every = series, .hooks = rec ? &hooks : NULL};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
    if (r->runs[0].status != KVS_OK) fail_msg("%s: %s", spec, r->runs[0].error);
    return r;
}

static int64_t compare(const recorder *a, const recorder *b, const char *what) {
    const fixture *f = a->f;
    int64_t compared = 0, c = kvs_test_sets_diff(&a->s, &b->s, &compared);
    if (c >= 0) {
        size_t pc = (size_t)c / (size_t)f->G;
        fail_msg("%s: selection differs at layer %zu kv head %zu position %zu list %zu (%lld vs %lld entries)", what,
                 pc / (size_t)f->N / (size_t)f->Hkv, pc / (size_t)f->N % (size_t)f->Hkv, pc % (size_t)f->N,
                 (size_t)c % (size_t)f->G, (long long)a->s.n[c], (long long)b->s.n[c]);
    }
    return compared;
}

/* ---- the naive references (POLICY_SPEC §2.6 B9, B10) ------------------------------------------------- */

static const float *nq(const fixture *f, int l, int64_t p, int qh) {
    return f->g->q + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)f->H + (size_t)qh) * (size_t)f->d;
}
static const float *nk(const fixture *f, int l, int64_t p, int h) {
    return f->g->k + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)f->Hkv + (size_t)h) * (size_t)f->d;
}

static int64_t take_best(const double *x, char *taken, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || x[i] > x[best])) best = i;
    if (best < 0) fail_msg("nothing left to take");
    taken[best] = 1;
    return best;
}

/* Takes the k best of tok[0..n) (ties to the older token) into list, ascending. */
static int64_t take_k(const double *tok, int64_t n, int64_t k, char *taken, int32_t *list) {
    memset(taken, 0, (size_t)n);
    if (k > n) k = n;
    for (int64_t j = 0; j < k; j++) take_best(tok, taken, n);
    int64_t m = 0;
    for (int64_t j = 0; j < n; j++)
        if (taken[j]) list[m++] = (int32_t)j;
    return m;
}

typedef struct {
    int64_t page;   /* > 0 fixed; 0 = ceil(2 S/t) */
    int even, head; /* split=even; gqa=head */
    int tokens;     /* fill=tokens (0: fill=pages, whole pages with the current one) */
} quest_cfg;

/* fill=pages: the current page (the last, pages - 1) and the best K - 1 of the others, whole, K = max(1,
 * floor(quota/P)); the newest `quota` tokens when the current page holds more. U: page scores. */
static int64_t take_pages(const double *U, int64_t pages, int64_t P, int64_t n, int64_t quota, char *taken,
                          int32_t *list) {
    int64_t cur = pages - 1, K = quota / P, m = 0;
    if (n - cur * P > quota) {
        for (int64_t j = n - quota; j < n; j++) list[m++] = (int32_t)j;
        return m;
    }
    memset(taken, 0, (size_t)pages);
    taken[cur] = 1;
    for (int64_t k = 1; k < K && k < pages; k++) take_best(U, taken, pages);
    for (int64_t j = 0; j < n; j++)
        if (taken[j / P]) list[m++] = (int32_t)j;
    return m;
}

static void naive_quest(const fixture *f, const quest_cfg *c, int64_t B, recorder *out) {
    int64_t N = f->N, G = f->G, d = f->d, max_new = f->mem.model.max_new_tokens;
    int64_t quota = c->even ? B / 2 : B;
    if (quota < 1) quota = 1;
    double *U = malloc((size_t)N * sizeof *U), *tot = malloc((size_t)N * sizeof *tot), *tok = malloc((size_t)N * sizeof *tok);
    char *taken = malloc((size_t)N);
    int32_t *list = malloc((size_t)N * sizeof *list);
    for (int l = 0; l < f->L; l++)
        for (int h = 0; h < f->Hkv; h++)
            for (int64_t t = 0; t < f->n_turns; t++) {
                const kvs_turn *tu = &f->turns[t];
                int64_t P = c->page;
                if (P == 0) {
                    double cc = (double)(tu->prompt_end + max_new) / (double)B;
                    P = (int64_t)ceil(2.0 * (cc < 1 ? 1 : cc));
                }
                for (int64_t p = tu->prompt_end; p < tu->end; p++) {
                    int64_t n = p + 1, pages = (n + P - 1) / P;
                    if (n <= quota) {
                        for (int64_t j = 0; j < n; j++) list[j] = (int32_t)j;
                        for (int li = 0; li < (c->head ? G : 1); li++) put(out, l, h, p, li, list, n);
                        continue;
                    }
                    for (int64_t pi = 0; pi < pages; pi++) tot[pi] = 0;
                    for (int64_t g = 0; g < G; g++) {
                        const float *q = nq(f, l, p, (int)(h * G + g));
                        for (int64_t pi = 0; pi < pages; pi++) {
                            double s = 0;
                            for (int64_t i = 0; i < d; i++) {
                                double mn = INFINITY, mx = -INFINITY;
                                for (int64_t j = pi * P; j < n && j < (pi + 1) * P; j++) {
                                    double kv = nk(f, l, j, h)[i];
                                    if (kv < mn) mn = kv;
                                    if (kv > mx) mx = kv;
                                }
                                double a = (double)q[i] * mx, b = (double)q[i] * mn;
                                s += a > b ? a : b;
                            }
                            U[pi] = s;
                            tot[pi] += s;
                        }
                        if (c->head) {
                            for (int64_t j = 0; j < n; j++) tok[j] = U[j / P];
                            put(out, l, h, p, (int)g, list,
                                c->tokens ? take_k(tok, n, quota, taken, list) : take_pages(U, pages, P, n, quota, taken, list));
                        }
                    }
                    if (!c->head) {
                        for (int64_t j = 0; j < n; j++) tok[j] = tot[j / P];
                        put(out, l, h, p, 0, list,
                            c->tokens ? take_k(tok, n, quota, taken, list) : take_pages(tot, pages, P, n, quota, taken, list));
                    }
                }
            }
    free(U);
    free(tot);
    free(tok);
    free(taken);
    free(list);
}

typedef struct {
    int64_t r;      /* > 0 fixed */
    int even, head; /* split=even; gqa=head */
} sparq_cfg;

static void naive_sparq(const fixture *f, const sparq_cfg *c, int64_t B, recorder *out) {
    int64_t N = f->N, G = f->G, d = f->d, max_new = f->mem.model.max_new_tokens;
    int64_t quota = c->even ? B / 2 : B;
    if (quota < 1) quota = 1;
    double *a = malloc((size_t)d * sizeof *a), *est = malloc((size_t)N * sizeof *est), *tot = malloc((size_t)N * sizeof *tot);
    char *taken = malloc((size_t)N), *dsel = malloc((size_t)d);
    int32_t *list = malloc((size_t)N * sizeof *list);
    for (int l = 0; l < f->L; l++)
        for (int h = 0; h < f->Hkv; h++)
            for (int64_t t = 0; t < f->n_turns; t++) {
                const kvs_turn *tu = &f->turns[t];
                int64_t r = c->r;
                if (r == 0) r = c->even ? (int64_t)floor((double)B * (double)d / (double)(tu->prompt_end + max_new))
                                        : (int64_t)nearbyint((double)d / 8.0);
                if (r < 1) r = 1;
                if (r > d) r = d;
                for (int64_t p = tu->prompt_end; p < tu->end; p++) {
                    int64_t n = p + 1;
                    if (n <= quota) {
                        for (int64_t j = 0; j < n; j++) list[j] = (int32_t)j;
                        for (int li = 0; li < (c->head ? G : 1); li++) put(out, l, h, p, li, list, n);
                        continue;
                    }
                    for (int64_t j = 0; j < n; j++) tot[j] = 0;
                    if (!c->head) { /* dimensions of the group: sum_g |q_g| */
                        for (int64_t i = 0; i < d; i++) {
                            a[i] = 0;
                            for (int64_t g = 0; g < G; g++) a[i] += fabs((double)nq(f, l, p, (int)(h * G + g))[i]);
                        }
                        for (int64_t i = 0; i < d; i++) taken[i] = 0;
                        for (int64_t k = 0; k < r; k++) take_best(a, taken, d);
                        memcpy(dsel, taken, (size_t)d);
                    }
                    for (int64_t g = 0; g < G; g++) {
                        const float *q = nq(f, l, p, (int)(h * G + g));
                        if (c->head) {
                            for (int64_t i = 0; i < d; i++) a[i] = fabs((double)q[i]);
                            for (int64_t i = 0; i < d; i++) taken[i] = 0;
                            for (int64_t k = 0; k < r; k++) take_best(a, taken, d);
                            memcpy(dsel, taken, (size_t)d);
                        }
                        double part = 0, all = 0, m = -INFINITY, sum = 0;
                        for (int64_t i = 0; i < d; i++) {
                            all += fabs((double)q[i]);
                            if (dsel[i]) part += fabs((double)q[i]);
                        }
                        double tau = all > 0 ? sqrt((double)d * part / all) : 1.0;
                        for (int64_t j = 0; j < n; j++) {
                            const float *k = nk(f, l, j, h);
                            double e = 0;
                            for (int64_t i = 0; i < d; i++)
                                if (dsel[i]) e += (double)q[i] * (double)k[i];
                            est[j] = e / tau;
                            if (est[j] > m) m = est[j];
                        }
                        for (int64_t j = 0; j < n; j++) sum += exp(est[j] - m);
                        for (int64_t j = 0; j < n; j++) est[j] = exp(est[j] - m) / sum; /* SparQ's s_hat */
                        if (c->head) put(out, l, h, p, (int)g, list, take_k(est, n, quota, taken, list));
                        else
                            for (int64_t j = 0; j < n; j++) tot[j] += est[j];
                    }
                    if (!c->head) put(out, l, h, p, 0, list, take_k(tot, n, quota, taken, list));
                }
            }
    free(a);
    free(est);
    free(tot);
    free(taken);
    free(dsel);
    free(list);
}

/* ---- tests --------------------------------------------------------------------------------------------- */

static void test_quest_matches_naive_reference(void **state) {
    (void)state;
    const struct {
        int turns, group, n_pos, prompt, d;
        const char *spec;
        int64_t B;
        quest_cfg c;
    } cases[] = {
        {1, 2, 96, 64, 16, "quest", 40, {16, 1, 0, 0}},
        {1, 2, 96, 64, 16, "quest", 16, {16, 1, 0, 0}}, /* quota 8 < one page */
        {1, 2, 96, 64, 16, "quest:page=4", 16, {4, 1, 0, 0}},
        {1, 1, 96, 64, 8, "quest:page=3", 11, {3, 1, 0, 0}},
        {1, 3, 96, 64, 16, "quest:page=4,gqa=head", 14, {4, 1, 1, 0}},
        {1, 2, 96, 64, 16, "quest@reference", 32, {16, 0, 1, 0}},
        {1, 2, 96, 64, 16, "quest@reference", 50, {16, 0, 1, 0}}, /* 3 pages, 50 not a multiple of 16 */
        {1, 2, 96, 64, 16, "quest:page=0", 12, {0, 1, 0, 0}},
        {2, 2, 128, -1, 16, "quest:page=0,split=attend", 10, {0, 0, 0, 0}},
        {2, 3, 128, -1, 8, "quest:page=5,gqa=head", 9, {5, 1, 1, 0}},
        {1, 2, 96, 64, 16, "quest:page=4", 1, {4, 1, 0, 0}}, /* quota raised to 1 */
        {1, 2, 96, 64, 16, "quest:fill=tokens", 40, {16, 1, 0, 1}},
        {1, 2, 96, 64, 16, "quest:fill=tokens", 16, {16, 1, 0, 1}},
        {1, 2, 96, 64, 16, "quest:page=4,fill=tokens", 16, {4, 1, 0, 1}},
        {1, 1, 96, 64, 8, "quest:page=3,fill=tokens", 11, {3, 1, 0, 1}},
        {1, 3, 96, 64, 16, "quest:page=4,gqa=head,fill=tokens", 14, {4, 1, 1, 1}},
        {1, 2, 96, 64, 16, "quest@reference:fill=tokens", 32, {16, 0, 1, 1}},
        {1, 2, 96, 64, 16, "quest:page=0,fill=tokens", 12, {0, 1, 0, 1}},
        {2, 2, 128, -1, 16, "quest:page=0,split=attend,fill=tokens", 10, {0, 0, 0, 1}},
        {2, 3, 128, -1, 8, "quest:page=5,gqa=head,fill=tokens", 9, {5, 1, 1, 1}},
        {1, 2, 96, 64, 16, "quest:page=4,fill=tokens", 1, {4, 1, 0, 1}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fixture f;
        fixture_make(&f, cases[c].turns, cases[c].group, cases[c].n_pos, cases[c].prompt, cases[c].d, 800 + c);
        recorder eng, ref;
        rec_init(&eng, &f);
        rec_init(&ref, &f);
        kvs_replay_result *r = run_engine(&f, cases[c].spec, cases[c].B, &eng, 0);
        naive_quest(&f, &cases[c].c, cases[c].B, &ref);
        char what[128];
        snprintf(what, sizeof what, "%s at budget %lld", cases[c].spec, (long long)cases[c].B);
        assert_true(compare(&eng, &ref, what) > 0);
        kvs_replay_result_free(r);
        rec_free(&eng);
        rec_free(&ref);
        kvs_test_replay_fixture_free(&f);
    }
}

static void test_sparq_matches_naive_reference(void **state) {
    (void)state;
    const struct {
        int turns, group, n_pos, prompt, d;
        const char *spec;
        int64_t B;
        sparq_cfg c;
    } cases[] = {
        {1, 2, 96, 64, 16, "sparq", 16, {0, 1, 1}},
        {1, 2, 96, 64, 16, "sparq:gqa=group", 16, {0, 1, 0}},
        {1, 3, 96, 64, 16, "sparq:gqa=group", 40, {0, 1, 0}},
        {1, 1, 96, 64, 8, "sparq", 11, {0, 1, 1}},
        {1, 2, 96, 64, 16, "sparq:r=3", 12, {3, 1, 1}},
        {1, 2, 96, 64, 16, "sparq:r=5,gqa=group,split=attend", 12, {5, 0, 0}},
        {1, 2, 96, 64, 16, "sparq@reference", 10, {0, 0, 1}},
        {2, 2, 128, -1, 16, "sparq", 20, {0, 1, 1}},
        {2, 3, 128, -1, 8, "sparq:gqa=group,r=20", 9, {20, 1, 0}}, /* r above d: every dimension */
        {1, 2, 96, 64, 16, "sparq", 1, {0, 1, 1}},                  /* quota raised to 1 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fixture f;
        fixture_make(&f, cases[c].turns, cases[c].group, cases[c].n_pos, cases[c].prompt, cases[c].d, 900 + c);
        recorder eng, ref;
        rec_init(&eng, &f);
        rec_init(&ref, &f);
        kvs_replay_result *r = run_engine(&f, cases[c].spec, cases[c].B, &eng, 0);
        naive_sparq(&f, &cases[c].c, cases[c].B, &ref);
        char what[128];
        snprintf(what, sizeof what, "%s at budget %lld", cases[c].spec, (long long)cases[c].B);
        assert_true(compare(&eng, &ref, what) > 0);
        kvs_replay_result_free(r);
        rec_free(&eng);
        rec_free(&ref);
        kvs_test_replay_fixture_free(&f);
    }
}

/* Layouts and the attended counts: even split attends floor(B/2), attend mode B; per-head lists for gqa=head. */
static void test_layouts_and_quotas(void **state) {
    (void)state;
    kvs_policy_config c = parse("quest");
    assert_int_equal(kvs_policy_layout(&c), KVS_SEL_PER_KV_HEAD);
    c = parse("quest@reference");
    assert_int_equal(kvs_policy_layout(&c), KVS_SEL_PER_QUERY_HEAD);
    c = parse("sparq");
    assert_int_equal(kvs_policy_layout(&c), KVS_SEL_PER_QUERY_HEAD);
    c = parse("sparq:gqa=group");
    assert_int_equal(kvs_policy_layout(&c), KVS_SEL_PER_KV_HEAD);
    fixture f;
    fixture_make(&f, 1, 2, 64, 40, 8, 30);
    const struct {
        const char *spec;
        int lists;
        int64_t per_list;
    } cases[] = {{"quest:fill=tokens", 1, 6}, {"quest@reference:fill=tokens", 2, 13}, {"sparq", 2, 6},
                 {"sparq@reference", 2, 13}, {"sparq:gqa=group,split=attend", 1, 13}, {"quest:page=2,fill=tokens", 1, 6},
                 {"quest:page=1,split=attend", 1, 13}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        recorder rec;
        rec_init(&rec, &f);
        kvs_replay_result *r = run_engine(&f, cases[i].spec, 13, &rec, 0);
        for (int l = 0; l < f.L; l++)
            for (int h = 0; h < f.Hkv; h++)
                for (int64_t p = 40; p < 64; p++)
                    for (int li = 0; li < f.G; li++)
                        assert_int_equal(rec.s.n[cell(&f, l, h, p, li)], li < cases[i].lists ? cases[i].per_list : -1);
        assert_int_equal(r->runs[0].max_attended, cases[i].per_list);
        kvs_replay_result_free(r);
        rec_free(&rec);
    }
    kvs_test_replay_fixture_free(&f);
}

/* The costs of one step by hand (kv_bytes 2, aux_bytes 4). */
static void test_step_costs_by_hand(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 2, 96, 64, 16, 31);
    const double kb = 2, d = 16, G = 2;
    /* Quest page 4 at position 94 (n = 95): 24 pages, 94 % 4 = 2 (the page exists: read-modify-write) */
    kvs_replay_result *r = run_engine(&f, "quest:page=4", 16, NULL, 1);
    const kvs_results_step *s = NULL;
    for (int64_t i = 0; i < r->runs[0].n_steps && !s; i++)
        if (r->runs[0].steps[i].position == 94 && r->runs[0].steps[i].q_head == 0 && r->runs[0].steps[i].layer == 0)
            s = &r->runs[0].steps[i];
    assert_non_null(s);
    assert_true(s->storage_kv_bytes == 95 * 2 * d * kb);
    assert_true(s->storage_aux_bytes == 24 * 2 * d * kb);
    /* fill=pages: floor(8/4) = 2 whole pages, the current one (positions 92-94) and the best other: 7 tokens */
    assert_true(s->traffic_kv_bytes == 7 * 2 * d * kb);
    assert_true(s->traffic_aux_bytes == (24 * 2 * d + 2 * d) * kb);
    assert_true(s->write_bytes == (2 * d + 2 * d) * kb);
    assert_true(s->storage_peak_bytes == s->storage_bytes + (G + 1) * 24 * 4);
    assert_true(s->attended_tokens == 7);
    kvs_replay_result_free(r);
    /* SparQ per head: r = floor(16 * 16 / (64 + 32)) = 2 dims of 95 keys per head, 8 tokens per head */
    r = run_engine(&f, "sparq", 16, NULL, 1);
    s = NULL;
    for (int64_t i = 0; i < r->runs[0].n_steps && !s; i++)
        if (r->runs[0].steps[i].position == 94 && r->runs[0].steps[i].q_head == 0 && r->runs[0].steps[i].layer == 0)
            s = &r->runs[0].steps[i];
    assert_non_null(s);
    assert_true(s->storage_kv_bytes == 95 * 2 * d * kb);
    assert_true(s->storage_aux_bytes == 95 * d * kb);
    assert_true(s->traffic_kv_bytes == G * 8 * 2 * d * kb); /* the two heads' lists, summed */
    assert_true(s->traffic_aux_bytes == G * 2 * 95 * kb);
    assert_true(s->write_bytes == (2 * d + d) * kb);
    assert_true(s->attended_tokens == 8);
    kvs_replay_result_free(r);
    kvs_test_replay_fixture_free(&f);
}

/* Written out: a budget that is not a multiple of the page size. d = 1, G = 1, q = 1, page 4, split=attend, B = 10,
 * 14 positions: pages 0 [0-3], 1 [4-7], 2 [8-11], 3 [12-13] (current, partial) with the bounds U = the page's
 * largest key 5, 1, 3, 0.
 *   fill=pages:  floor(10/4) = 2 pages, the current one and the best other (page 0): {0-3, 12, 13}, 6 tokens;
 *   fill=tokens: 10 tokens, pages 0 and 2 whole and the oldest 2 of page 1: {0-3, 4, 5, 8-11}. */
static void test_quest_fill_at_a_budget_off_the_pages(void **state) {
    (void)state;
    enum { N = 14 };
    float k[N] = {5, 1, 2, 0, 1, -1, 0, 1, 3, 2, 0, 1, 0, -2}, v[N] = {0}, q[N];
    for (int j = 0; j < N; j++) q[j] = 1;
    const struct {
        const char *spec;
        int64_t n;
        int32_t want[10];
    } cases[] = {{"quest:page=4,split=attend", 6, {0, 1, 2, 3, 12, 13}},
                 {"quest:page=4,split=attend,fill=pages", 6, {0, 1, 2, 3, 12, 13}},
                 {"quest:page=4,split=attend,fill=tokens", 10, {0, 1, 2, 3, 4, 5, 8, 9, 10, 11}}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kvs_policy_config cfg = parse(cases[c].spec);
        kvs_policy_model m = {.n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .group = 1, .head_dim = 1, .scale = 1.0f,
                              .kv_bytes = 2, .aux_bytes = 4, .n_positions = N, .prompt_len = N - 1};
        kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = 10, .budget_nominal = 10};
        void *st = NULL;
        assert_int_equal(kvs_policy_quest.create(&init, &st), KVS_OK);
        kvs_policy_view pv = {.n = N - 1, .group = 1, .head_dim = 1, .scale = 1.0f, .k = k, .v = v, .q = q, .q_first = 0,
                              .n_q = N - 1, .turn_begin = 0, .prompt_end = N - 1, .block_begin = 0, .last_block = 1};
        assert_int_equal(kvs_policy_quest.prefill(st, &pv), KVS_OK);
        int32_t buf[N], *idx[1] = {buf};
        int64_t nsel[1] = {0};
        const float *rk[N] = {0}, *rv[N] = {0}, **rkp[1] = {rk}, **rvp[1] = {rv};
        kvs_policy_sel sel = {.idx = idx, .n = nsel, .n_lists = 1, .cap = N, .row_k = rkp, .row_v = rvp};
        kvs_policy_view dv = {.n = N, .group = 1, .head_dim = 1, .scale = 1.0f, .k = k, .v = v, .q = q + N - 1,
                              .q_first = N - 1, .n_q = 1, .turn_begin = 0, .prompt_end = N - 1, .block_begin = N - 1,
                              .last_block = 1};
        assert_int_equal(kvs_policy_quest.select(st, &dv, &sel), KVS_OK);
        if (nsel[0] != cases[c].n) fail_msg("%s: %lld tokens, want %lld", cases[c].spec, (long long)nsel[0], (long long)cases[c].n);
        assert_memory_equal(buf, cases[c].want, (size_t)cases[c].n * sizeof *buf);
        kvs_policy_quest.free(st);
    }
    /* the canonical string names the setting */
    kvs_policy_config cfg = parse("quest");
    assert_string_equal(cfg.canonical, "page=16,split=even,gqa=group,max_new=0,fill=pages");
    cfg = parse("quest:fill=tokens");
    assert_string_equal(cfg.canonical, "page=16,split=even,gqa=group,max_new=0,fill=tokens");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quest_fill_at_a_budget_off_the_pages),
        cmocka_unit_test(test_quest_matches_naive_reference),
        cmocka_unit_test(test_sparq_matches_naive_reference),
        cmocka_unit_test(test_layouts_and_quotas),
        cmocka_unit_test(test_step_costs_by_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
