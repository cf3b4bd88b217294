/* test_synckv.c — SyncKV (policies/synckv.c; ../shared/POLICY_SPEC.md §2.4, §7 G5, §8.4a):
 *  - G5: the Mem% -> k/P table exactly, infeasible cells included, and validate() rejecting them;
 *  - a naive double-precision reference of the whole schedule (prompt top-k split into static and dynamic sets,
 *    anticipation every m steps from the representative's exact attention, suspension in between, visibility
 *    latency, nr_recent, exclude_static, "w/o Anticipation") compared selection by selection on generated data;
 *  - leak: every NR selection lies in what the unit held on the device after the previous step (plus the new
 *    token), and its dynamic part changes only at period boundaries;
 *  - accounting: device, host, h2d and d2h bytes of R and NR units step by step;
 *  - clusters=prefill against a naive recomputation of the similarity (representatives found by the policy);
 *  - the CLI: an infeasible Mem% is a failed run with its reason and exit status 1.
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
#include <unistd.h>

#include "../common/head_clusters.h"
#include "../policies/synckv_internal.h"
#include "../sim/metrics.h"
#include "../sim/policy.h"
#include "../policies/registry.h"
#include "../sim/replay.h"
#include "util/cli_run.h"
#include "util/replay_fixture.h"
#include "util/testenv.h"

static char tmp_dir[64]; /* mkdtemp'd by the group setup, removed (empty) by its teardown */

static int group_setup(void **state) {
    (void)state;
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/kvs_synckv_XXXXXX");
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int group_teardown(void **state) {
    (void)state;
    return rmdir(tmp_dir);
}

/* ---- G5 ------------------------------------------------------------------------------------------------- */

static void test_g5_mem_to_k_table(void **state) {
    (void)state;
    /* POLICY_SPEC §7 G5: (H, N_r) rows, Mem% 20/30/50 columns; k/P to 4 decimals, <= 0 infeasible */
    const struct {
        int H, nr;
        double kp[3];
    } rows[] = {
        {8, 2, {-0.0667, 0.0667, 0.3333}},
        {4, 1, {-0.0667, 0.0667, 0.3333}},
        {8, 1, {0.0857, 0.2000, 0.4286}},
    };
    const double mem[3] = {0.2, 0.3, 0.5};
    for (size_t r = 0; r < 3; r++)
        for (int c = 0; c < 3; c++) {
            double kp = kvs_synckv_k_ratio(mem[c], rows[r].H, rows[r].nr);
            assert_true(fabs(kp - rows[r].kp[c]) < 5e-5);
            /* k for a 3000-token prompt, from the fraction and from the budget B = Mem% P, agree */
            int64_t k1 = kvs_synckv_k_mem(mem[c], 3000, rows[r].H, rows[r].nr);
            int64_t k2 = kvs_synckv_k_budget((int64_t)llround(mem[c] * 3000), 3000, rows[r].H, rows[r].nr);
            assert_true(k1 == k2);
            assert_true((k1 <= 0) == (rows[r].kp[c] <= 0));
        }
    /* exact k: Llama (8, 2) at 30 % of 3000: (2.4 - 2) 3000 / 6 = 200; at 20 %: -200 */
    assert_int_equal(kvs_synckv_k_mem(0.3, 3000, 8, 2), 200);
    assert_int_equal(kvs_synckv_k_budget(600, 3000, 8, 2), -200);
    assert_int_equal(kvs_synckv_k_budget(601, 3000, 8, 2), -199); /* floor of -198.67 */
    assert_int_equal(kvs_synckv_k_budget(1000, 3000, 8, 1), 714); /* (8000 - 3000) / 7 = 714.3 */
    assert_int_equal(kvs_synckv_default_nr(8), 2);
    assert_int_equal(kvs_synckv_default_nr(4), 1);

    /* validate(): the infeasible cells are rejected with the reason, the feasible ones accepted */
    kvs_policy_model m = {.n_layers = 2, .n_heads = 32, .n_kv_heads = 8, .group = 4, .head_dim = 128, .scale = 1,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = 4000, .prompt_len = 3000};
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse("synckv", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 600), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "infeasible"));
    assert_non_null(strstr(kvs_last_error(), "N_r = 2 of 8"));
    assert_int_equal(kvs_policy_validate(&cfg, &m, 900), KVS_OK);
    assert_int_equal(kvs_policy_parse("synckv:nr=1", &cfg), KVS_OK); /* Qwen2.5-14B's row: 20 % feasible */
    assert_int_equal(kvs_policy_validate(&cfg, &m, 600), KVS_OK);
    m.n_kv_heads = 4;
    m.group = 7;
    assert_int_equal(kvs_policy_parse("synckv", &cfg), KVS_OK); /* N_r = 1 of 4 (Qwen2.5-7B) */
    assert_int_equal(kvs_policy_validate(&cfg, &m, 600), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 900), KVS_OK);
    /* option contradictions */
    assert_int_equal(kvs_policy_parse("synckv:m=2,fetch_latency_steps=2", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 900), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "fetch_latency_steps"));
    assert_int_equal(kvs_policy_parse("synckv:anticipation=0,nr_recent=since_anticipation", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 900), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_policy_parse("synckv:nr=5", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_validate(&cfg, &m, 900), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "nr=5"));
}

/* ---- fixture and recording -------------------------------------------------------------------------------- */

typedef kvs_test_replay_fixture fixture;

#define N_POS 60
#define PROMPT 30

static void fixture_make(fixture *f, int n_kv_heads, uint64_t seed) {
    kvs_gen_trace_opts o = kvs_test_grouped_opts(1, 2, N_POS, PROMPT, 8, seed);
    o.n_kv_heads = n_kv_heads;
    o.n_heads = 2 * n_kv_heads;
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 11, f), KVS_OK);
}

/* Selections [L][Hkv][N] (sorted) and, after each step, the NR device set (stored()). */
typedef struct {
    const fixture *f;
    int32_t *sel, *dev;  /* [cells][N] */
    int64_t *n_sel, *n_dev;
} recorder;

static size_t cell(const fixture *f, int l, int h, int64_t p) {
    return ((size_t)l * (size_t)f->Hkv + (size_t)h) * (size_t)f->N + (size_t)p;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void rec_init(recorder *r, const fixture *f) {
    size_t cells = (size_t)f->L * (size_t)f->Hkv * (size_t)f->N;
    r->f = f;
    r->sel = calloc(cells * (size_t)f->N, sizeof *r->sel);
    r->dev = calloc(cells * (size_t)f->N, sizeof *r->dev);
    r->n_sel = calloc(cells, sizeof *r->n_sel);
    r->n_dev = calloc(cells, sizeof *r->n_dev);
    for (size_t c = 0; c < cells; c++) r->n_sel[c] = r->n_dev[c] = -1;
    assert_true(r->sel && r->dev && r->n_sel && r->n_dev);
}

static void rec_free(recorder *r) {
    free(r->sel);
    free(r->dev);
    free(r->n_sel);
    free(r->n_dev);
}

static void on_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    (void)config;
    recorder *r = user;
    size_t c = cell(r->f, layer, kv_head, pos);
    memcpy(r->sel + c * (size_t)r->f->N, sel->idx[0], (size_t)sel->n[0] * sizeof(int32_t));
    qsort(r->sel + c * (size_t)r->f->N, (size_t)sel->n[0], sizeof(int32_t), cmp_i32);
    r->n_sel[c] = sel->n[0];
}

static void on_step_end(void *user, int config, int layer, int kv_head, int64_t pos, void *state,
                        const struct kvs_policy_ops *ops, float *k, float *v, int64_t n) {
    (void)config;
    (void)k;
    (void)v;
    (void)n;
    recorder *r = user;
    size_t c = cell(r->f, layer, kv_head, pos);
    r->n_dev[c] = ops->stored(state, 0, r->dev + c * (size_t)r->f->N);
    qsort(r->dev + c * (size_t)r->f->N, (size_t)r->n_dev[c], sizeof(int32_t), cmp_i32);
}

static kvs_replay_result *run(const fixture *f, const char *spec, int64_t budget, recorder *rec) {
    kvs_policy_config cfg;
    if (kvs_policy_parse(spec, &cfg) != KVS_OK) fail_msg("%s: %s", spec, kvs_last_error());
    kvs_replay_config rc = {.policy = cfg, .budget = budget, .budget_fraction = -1};
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, &src), KVS_OK);
    kvs_replay_hooks hooks = {.user = rec, .on_select = on_select, .on_step_end = on_step_end};
    kvs_replay_opts o = {.configs = &rc, .n_configs = 1, .threads = 1, .measure = KVS_MEASURE_DECODE,
                         .series_every = 1, .hooks = rec ? &hooks : NULL};
    kvs_replay_result *r = NULL;
    if (kvs_replay_execute(&src, &o, &r) != KVS_OK) fail_msg("%s: %s", spec, kvs_last_error());
    if (r->runs[0].status != KVS_OK) fail_msg("%s: %s", spec, r->runs[0].error);
    return r;
}

/* A clusters file: every layer one cluster of all units, `rep` its representative. */
static void write_one_cluster(const fixture *f, int rep, char *path, size_t cap) {
    snprintf(path, cap, "%s/synckv_clusters_%d_%d.txt", tmp_dir, (int)getpid(), rep);
    kvs_head_clusters *c;
    assert_int_equal(kvs_head_clusters_create(f->L, f->Hkv, &c), KVS_OK);
    for (int l = 0; l < f->L; l++) {
        c->n_clusters[l] = 1;
        for (int h = 0; h < f->Hkv; h++) {
            c->cluster[l * f->Hkv + h] = 0;
            c->is_rep[l * f->Hkv + h] = h == rep;
        }
    }
    assert_int_equal(kvs_head_clusters_write(c, path), KVS_OK);
    kvs_head_clusters_free(c);
}

/* ---- the naive reference -------------------------------------------------------------------------------- */

/* Max over the group's query heads of the causal softmax attention (double) of KV head h's queries at position
 * p over 0..p. out: [p+1]. */
static void naive_pooled(const fixture *f, int l, int h, int64_t p, double *out) {
    int H = f->H, d = f->d;
    for (int64_t j = 0; j <= p; j++) out[j] = -1;
    for (int g = 0; g < f->G; g++) {
        const float *q = f->g->q + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)H + (size_t)(h * f->G + g)) * (size_t)d;
        double *z = malloc((size_t)(p + 1) * sizeof *z), mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= p; j++) {
            const float *k = f->g->k + (((size_t)l * (size_t)f->N + (size_t)j) * (size_t)f->Hkv + (size_t)h) * (size_t)d;
            double s = 0;
            for (int i = 0; i < d; i++) s += (double)q[i] * (double)k[i];
            z[j] = s * f->scale;
            if (z[j] > mx) mx = z[j];
        }
        for (int64_t j = 0; j <= p; j++) sum += exp(z[j] - mx);
        for (int64_t j = 0; j <= p; j++) {
            double a = exp(z[j] - mx) / sum;
            if (a > out[j]) out[j] = a;
        }
        free(z);
    }
}

/* Indices of the k largest of x[0..n-1] (ties to the lower index) in descending order, by selection sort. */
static void naive_topk(const double *x, int64_t n, int64_t k, int32_t *out) {
    char *used = calloc((size_t)n, 1);
    for (int64_t r = 0; r < k; r++) {
        int64_t best = -1;
        for (int64_t j = 0; j < n; j++)
            if (!used[j] && (best < 0 || x[j] > x[best])) best = j;
        used[best] = 1;
        out[r] = (int32_t)best;
    }
    free(used);
}

typedef struct {
    int m, latency, anticipation, recent, exclude_static;
} sched_opts;

/* The NR unit's expected selections of layer l under representative `rep` with per-unit k: exp[t][..] for decode
 * positions p = PROMPT .. N-1 (sorted), counts in exp_n. The schedule written out directly from POLICY_SPEC
 * §2.4 "Initialisation" and "Decode step", independently of the policy's code. */
static void naive_schedule(const fixture *f, int l, int rep, int64_t k, double rho, const sched_opts *o, int32_t *exp,
                           int64_t *exp_n) {
    int64_t N = f->N, P = PROMPT, k_dyn = (int64_t)floor((1 - rho) * (double)k);
    double *a = malloc((size_t)N * sizeof *a);
    int32_t *top = malloc((size_t)N * sizeof *top);
    char *in_stat = calloc((size_t)N, 1), *dyn = calloc((size_t)N, 1), *pend = calloc((size_t)N, 1);
    naive_pooled(f, l, rep, P - 1, a);
    naive_topk(a, P, k, top);
    for (int64_t i = 0; i < k - k_dyn; i++) in_stat[top[i]] = 1;
    for (int64_t i = k - k_dyn; i < k; i++) dyn[top[i]] = 1;
    int64_t pend_at = -1, anchor = P - 1, pend_anchor = 0;
    for (int64_t p = P; p < N; p++) {
        int64_t t = p - P + 1;
        if (pend_at >= 0 && t >= pend_at) {
            memcpy(dyn, pend, (size_t)N);
            anchor = pend_anchor;
            pend_at = -1;
        }
        int32_t *row = exp + (size_t)(p - P) * (size_t)N;
        int64_t w = 0;
        for (int64_t j = 0; j <= p; j++) {
            int recent = o->recent && j > anchor && j < p;
            if (in_stat[j] || dyn[j] || recent || j == p) row[w++] = (int32_t)j;
        }
        exp_n[p - P] = w;
        if (o->anticipation && t % o->m == 0) { /* the representative's exact attention at this step */
            naive_pooled(f, l, rep, p, a);
            if (o->exclude_static)
                for (int64_t j = 0; j <= p; j++)
                    if (in_stat[j]) a[j] = -INFINITY;
            int64_t kd = k_dyn;
            naive_topk(a, p + 1, kd, top);
            memset(pend, 0, (size_t)N);
            for (int64_t i = 0; i < kd; i++) pend[top[i]] = 1;
            pend_at = t + 1 + o->latency;
            pend_anchor = p;
        }
    }
    free(a);
    free(top);
    free(in_stat);
    free(dyn);
    free(pend);
}

/* Runs `spec` (with the clusters file appended) and compares the NR unit of every layer with the reference. */
static void check_schedule(const fixture *f, const char *clusters, int rep, const char *params, const sched_opts *o,
                           int64_t budget, int64_t k) {
    char spec[1024];
    snprintf(spec, sizeof spec, "synckv:clusters=%s%s%s", clusters, params[0] ? "," : "", params);
    recorder rec;
    rec_init(&rec, f);
    kvs_replay_result *r = run(f, spec, budget, &rec);
    int64_t T = f->N - PROMPT;
    int32_t *exp = malloc((size_t)T * (size_t)f->N * sizeof *exp);
    int64_t *exp_n = malloc((size_t)T * sizeof *exp_n);
    int nr = 1 - rep;
    for (int l = 0; l < f->L; l++) {
        naive_schedule(f, l, rep, k, 0.5, o, exp, exp_n);
        for (int64_t p = PROMPT; p < f->N; p++) {
            size_t c = cell(f, l, nr, p);
            const int32_t *got = rec.sel + c * (size_t)f->N, *want = exp + (size_t)(p - PROMPT) * (size_t)f->N;
            if (rec.n_sel[c] != exp_n[p - PROMPT] || memcmp(got, want, (size_t)exp_n[p - PROMPT] * sizeof *got)) {
                print_error("%s: layer %d position %lld: %lld positions, expected %lld\n", spec, l, (long long)p,
                            (long long)rec.n_sel[c], (long long)exp_n[p - PROMPT]);
                fail();
            }
            /* the representative attends everything */
            assert_int_equal(rec.n_sel[cell(f, l, rep, p)], p + 1);
        }
    }
    free(exp);
    free(exp_n);
    kvs_replay_result_free(r);
    rec_free(&rec);
}

static void test_schedule_matches_naive_reference(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 21);
    char path[512];
    write_one_cluster(&f, 0, path, sizeof path);
    /* H = 2, N_r = 1: k = 2B - P. B = 20 -> k = 10, k_dyn = 5 */
    const int64_t B = 20, k = 10;
    struct {
        const char *params;
        sched_opts o;
    } cases[] = {
        {"", {5, 0, 1, 0, 0}},
        {"m=1", {1, 0, 1, 0, 0}},
        {"m=3,fetch_latency_steps=2", {3, 2, 1, 0, 0}},
        {"anticipation=0", {5, 0, 0, 0, 0}},
        {"m=4,nr_recent=since_anticipation", {4, 0, 1, 1, 0}},
        {"m=2,exclude_static=1", {2, 0, 1, 0, 1}},
        {"m=3,fetch_latency_steps=1,nr_recent=since_anticipation,delta=1", {3, 1, 1, 1, 0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_schedule(&f, path, 0, cases[i].params, &cases[i].o, B, k);
    /* the other representative: the hand-off follows the file */
    char path1[512];
    write_one_cluster(&f, 1, path1, sizeof path1);
    sched_opts o = {5, 0, 1, 0, 0};
    check_schedule(&f, path1, 1, "", &o, B, k);
    unlink(path);
    unlink(path1);
    kvs_test_replay_fixture_free(&f);
}

/* The reference must be able to disagree: a wrong period is caught. */
static void test_schedule_reference_catches_a_wrong_period(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 22);
    char path[512], spec[700];
    write_one_cluster(&f, 0, path, sizeof path);
    snprintf(spec, sizeof spec, "synckv:clusters=%s,m=4", path);
    recorder rec;
    rec_init(&rec, &f);
    kvs_replay_result *r = run(&f, spec, 20, &rec);
    int64_t T = f.N - PROMPT;
    int32_t *exp = malloc((size_t)T * (size_t)f.N * sizeof *exp);
    int64_t *exp_n = malloc((size_t)T * sizeof *exp_n);
    sched_opts o = {5, 0, 1, 0, 0};
    naive_schedule(&f, 0, 0, 10, 0.5, &o, exp, &exp_n[0]);
    int differ = 0;
    for (int64_t p = PROMPT; p < f.N; p++) {
        size_t c = cell(&f, 0, 1, p);
        differ |= rec.n_sel[c] != exp_n[p - PROMPT] ||
                  memcmp(rec.sel + c * (size_t)f.N, exp + (size_t)(p - PROMPT) * (size_t)f.N, (size_t)exp_n[p - PROMPT] * 4);
    }
    assert_true(differ);
    free(exp);
    free(exp_n);
    kvs_replay_result_free(r);
    rec_free(&rec);
    unlink(path);
    kvs_test_replay_fixture_free(&f);
}

/* ---- leak: device residency and period boundaries --------------------------------------------------------- */

static void test_nr_reads_only_what_it_holds_and_changes_at_boundaries(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 23);
    char path[512];
    write_one_cluster(&f, 0, path, sizeof path);
    const char *params[] = {"m=5", "m=3,fetch_latency_steps=2", "m=4,nr_recent=since_anticipation", "m=1"};
    const int ms[] = {5, 3, 4, 1}, lat[] = {0, 2, 0, 0};
    for (int ci = 0; ci < 4; ci++) {
        char spec[800];
        snprintf(spec, sizeof spec, "synckv:clusters=%s,%s", path, params[ci]);
        recorder rec;
        rec_init(&rec, &f);
        kvs_replay_result *r = run(&f, spec, 20, &rec);
        int changes = 0;
        for (int l = 0; l < f.L; l++)
            for (int64_t p = PROMPT; p < f.N; p++) {
                size_t c = cell(&f, l, 1, p), prev = cell(&f, l, 1, p - 1);
                assert_true(rec.n_dev[prev] >= 0); /* recorded after the prompt and after every step */
                const int32_t *s = rec.sel + c * (size_t)f.N, *dv = rec.dev + prev * (size_t)f.N;
                /* every attended position but the new token was device-resident after the previous step */
                for (int64_t j = 0; j < rec.n_sel[c]; j++) {
                    if (s[j] == p) continue;
                    int found = 0;
                    for (int64_t x = 0; x < rec.n_dev[prev] && !found; x++) found = dv[x] == s[j];
                    if (!found) fail_msg("%s: layer %d position %lld attends %d, not resident", spec, l, (long long)p, s[j]);
                }
                /* the prompt part (the static + dynamic sets) changes only when a fetch lands: step t with
                 * t - 1 - latency a positive multiple of m */
                if (p > PROMPT) {
                    const int32_t *a = rec.sel + prev * (size_t)f.N;
                    int64_t na = 0, nb = 0;
                    while (na < rec.n_sel[prev] && a[na] < PROMPT) na++;
                    while (nb < rec.n_sel[c] && s[nb] < PROMPT) nb++;
                    int same = na == nb && !memcmp(a, s, (size_t)na * sizeof *a);
                    int64_t t = p - PROMPT + 1, since = t - 1 - lat[ci];
                    int boundary = since > 0 && since % ms[ci] == 0;
                    if (!same) {
                        changes++;
                        if (!boundary) fail_msg("%s: layer %d: the set changed at step %lld, off the period", spec, l, (long long)t);
                    }
                }
            }
        assert_true(changes > 0); /* the check saw the hand-offs happen */
        kvs_replay_result_free(r);
        rec_free(&rec);
    }
    unlink(path);
    kvs_test_replay_fixture_free(&f);
}

/* ---- accounting -------------------------------------------------------------------------------------------- */

static const kvs_results_step *step_of(const kvs_replay_result *r, int l, int qh, int64_t p) {
    for (int64_t i = 0; i < r->runs[0].n_steps; i++) {
        const kvs_results_step *s = &r->runs[0].steps[i];
        if (s->layer == l && s->q_head == qh && s->position == p) return s;
    }
    fail_msg("no series sample at layer %d q head %d position %lld", l, qh, (long long)p);
    return NULL;
}

static void test_device_host_and_transfer_bytes(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 24);
    char path[512], spec[700];
    write_one_cluster(&f, 0, path, sizeof path);
    snprintf(spec, sizeof spec, "synckv:clusters=%s,m=5", path);
    recorder rec;
    rec_init(&rec, &f);
    kvs_replay_result *r = run(&f, spec, 20, &rec);
    const double slot = 2.0 * f.d * 2; /* K and V, d elements each, 2 bytes */
    const int64_t k_dyn = 5;
    for (int l = 0; l < f.L; l++)
        for (int64_t p = PROMPT; p < f.N; p++) {
            int64_t t = p - PROMPT + 1, n = p + 1;
            /* representative (KV head 0, query heads 0, 1): the full cache on the device, nothing moves */
            const kvs_results_step *R = step_of(r, l, 0, p);
            assert_true(R->v[KVS_M_STORAGE_KV] == slot * (double)n);
            assert_true(R->v[KVS_M_STORAGE_HOST] == 0 && R->v[KVS_M_H2D] == 0 && R->v[KVS_M_D2H] == 0);
            /* NR (KV head 1, query head 2) */
            const kvs_results_step *s = step_of(r, l, 2, p);
            size_t c = cell(&f, l, 1, p);
            assert_true(s->v[KVS_M_STORAGE_KV] == slot * (double)rec.n_sel[c]);
            assert_true(s->v[KVS_M_STORAGE_HOST] == slot * (double)n);
            assert_true(s->v[KVS_M_TRAFFIC_KV] == slot * (double)rec.n_sel[c]);
            double d2h = slot * (1.0 + (t == 1 ? PROMPT : 0));
            assert_true(s->v[KVS_M_D2H] == d2h);
            int lands = t > 1 && (t - 1) % 5 == 0;
            assert_true(s->v[KVS_M_H2D] == (lands ? slot * (double)k_dyn : 0.0));
            assert_true(s->v[KVS_M_TRANSFER] == s->v[KVS_M_H2D] + d2h);
            assert_true(rec.n_sel[c] <= 11); /* k + 1 */
        }
    /* the engine's per-cell budgets: the whole trace for the representative, k + 1 for the NR unit */
    assert_int_equal(r->runs[0].budgets[0], f.N);
    assert_int_equal(r->runs[0].budgets[1], 11);
    kvs_replay_result_free(r);
    rec_free(&rec);
    /* delta=1 fetches only what is new: never more than the full refetch, and less at least once here */
    snprintf(spec, sizeof spec, "synckv:clusters=%s,m=5,delta=1", path);
    kvs_replay_result *rd = run(&f, spec, 20, NULL);
    int less = 0;
    for (int64_t p = PROMPT + 5; p < f.N; p += 5) {
        const kvs_results_step *s = step_of(rd, 0, 2, p);
        assert_true(s->v[KVS_M_H2D] <= slot * (double)k_dyn);
        less |= s->v[KVS_M_H2D] < slot * (double)k_dyn;
    }
    assert_true(less);
    kvs_replay_result_free(rd);
    unlink(path);
    kvs_test_replay_fixture_free(&f);
}

/* ---- clusters=prefill --------------------------------------------------------------------------------------- */

static void test_prefill_clusters_match_a_naive_similarity(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 4, 25);
    /* 4 units, nr=2; B = 20 of P = 30: k = (80 - 60) / 2 = 10 = kc; the last 8 prompt queries */
    recorder rec;
    rec_init(&rec, &f);
    kvs_replay_result *r = run(&f, "synckv:nr=2,window=8", 20, &rec);
    const int H = 4, W = 8, kc = 10;
    kvs_head_clusters *c;
    assert_int_equal(kvs_head_clusters_create(f.L, H, &c), KVS_OK);
    double *a = malloc((size_t)f.N * sizeof *a);
    int32_t sets[4][8][10];
    for (int l = 0; l < f.L; l++) {
        for (int h = 0; h < H; h++)
            for (int w = 0; w < W; w++) {
                int64_t p = PROMPT - W + w;
                naive_pooled(&f, l, h, p, a);
                naive_topk(a, p + 1, kc, sets[h][w]);
            }
        double S[16];
        for (int i = 0; i < H; i++)
            for (int j = 0; j < H; j++) {
                double s = 0;
                for (int w = 0; w < W; w++) {
                    int inter = 0;
                    for (int x = 0; x < kc; x++)
                        for (int y = 0; y < kc; y++) inter += sets[i][w][x] == sets[j][w][y];
                    s += inter / (double)kc;
                }
                S[i * H + j] = s / W;
            }
        assert_int_equal(kvs_head_clusters_from_similarity(c, l, S, 2, NULL), KVS_OK);
        int reps = 0;
        for (int h = 0; h < H; h++) {
            int attends_all = rec.n_sel[cell(&f, l, h, f.N - 1)] == f.N;
            assert_int_equal(attends_all, c->is_rep[l * H + h]);
            reps += attends_all;
        }
        assert_int_equal(reps, 2);
    }
    free(a);
    kvs_head_clusters_free(c);
    kvs_replay_result_free(r);
    rec_free(&rec);
    kvs_test_replay_fixture_free(&f);
}

/* ---- the CLI ------------------------------------------------------------------------------------------------ */

static void test_cli_flags_an_infeasible_mem(void **state) {
    (void)state;
    char trace[4096], db[4096], out[4096], err[4096];
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    snprintf(db, sizeof db, "%s/synckv_cli_%d.db", tmp_dir, (int)getpid());
    snprintf(out, sizeof out, "%s/synckv_cli_%d.out", tmp_dir, (int)getpid());
    snprintf(err, sizeof err, "%s/synckv_cli_%d.err", tmp_dir, (int)getpid());
    unlink(db);
    /* stories260K: 4 KV heads, N_r = 1: Mem% 20 % is infeasible, 30 % runs (k = 16 of a 239-token prompt) */
    const char *args[] = {"replay", trace, "--db", db, "--policy", "synckv:m=5", "--budgets", "20%,30%", "--threads", "1",
                          NULL};
    assert_int_equal(kvs_test_cli(out, err, args), 1);
    FILE *fp = fopen(err, "r");
    assert_non_null(fp);
    char text[8192];
    size_t len = fread(text, 1, sizeof text - 1, fp);
    text[len] = 0;
    fclose(fp);
    assert_non_null(strstr(text, "infeasible"));
    assert_non_null(strstr(text, "N_r = 1 of 4"));
    assert_non_null(strstr(text, "k = 16 tokens per NR unit"));
    assert_non_null(strstr(text, "1 of 2 runs failed"));
    unlink(db);
    char side[4200];
    snprintf(side, sizeof side, "%s-wal", db);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", db);
    unlink(side);
    unlink(out);
    unlink(err);
}

/* Splits one CSV line in place (RFC 4180 quotes; no embedded newlines) into at most cap cells. */
static int split_csv(char *s, char **cell, int cap) {
    int n = 0;
    char *w = s;
    while (n < cap) {
        cell[n++] = w;
        if (*s == '"') {
            s++;
            for (;;) {
                if (*s == '"' && s[1] == '"') *w++ = '"', s += 2;
                else if (*s == '"') {
                    s++;
                    break;
                } else if (!*s) break;
                else *w++ = *s++;
            }
        } else {
            while (*s && *s != ',' && *s != '\n') *w++ = *s++;
        }
        if (*s != ',') {
            *w = 0;
            break;
        }
        *w++ = 0;
        s++;
    }
    return n;
}

/* clusters=DB reads the latest `kvsim heads` run of a results database: the replay equals the one given the same
 * clustering as a file (`--clusters-out`), run for run; a database without heads results is refused. */
static void test_cli_clusters_from_a_heads_database(void **state) {
    (void)state;
    char trace[4096], hdb[4096], cfile[4096], rdb[4096], out[4096], err[4096], spec_f[4200], spec_d[4200];
    int pid = (int)getpid();
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    snprintf(hdb, sizeof hdb, "%s/synckv_heads_%d.db", tmp_dir, pid);
    snprintf(cfile, sizeof cfile, "%s/synckv_heads_%d.txt", tmp_dir, pid);
    snprintf(rdb, sizeof rdb, "%s/synckv_replay_%d.db", tmp_dir, pid);
    snprintf(out, sizeof out, "%s/synckv_db_%d.out", tmp_dir, pid);
    snprintf(err, sizeof err, "%s/synckv_db_%d.err", tmp_dir, pid);
    const char *heads[] = {"heads", trace, "--db", hdb, "--clusters", "1", "--clusters-out", cfile, NULL};
    assert_int_equal(kvs_test_cli(out, err, heads), 0);
    snprintf(spec_f, sizeof spec_f, "synckv:clusters=%s", cfile);
    snprintf(spec_d, sizeof spec_d, "synckv:clusters=%s", hdb);
    const char *replay[] = {"replay", trace, "--db", rdb, "--policy", spec_f, "--policy", spec_d, "--budgets", "50%",
                            "--threads", "1", NULL};
    assert_int_equal(kvs_test_cli(out, err, replay), 0);
    const char *csv[] = {"runs", rdb, "--csv", "--summary", NULL};
    assert_int_equal(kvs_test_cli(out, err, csv), 0);
    FILE *fp = fopen(out, "r");
    assert_non_null(fp);
    char line[3][8192];
    int n = 0;
    while (n < 3 && fgets(line[n], sizeof line[n], fp)) n++;
    fclose(fp);
    assert_int_equal(n, 3); /* header + two runs */
    /* Every column is equal but the parameters (file vs database), the notes (which name the source), the run id,
     * the wall time and the creation time. */
    char *cell[3][256];
    int nc[3];
    for (int r = 0; r < 3; r++) nc[r] = split_csv(line[r], cell[r], 256);
    assert_int_equal(nc[1], nc[0]);
    assert_int_equal(nc[2], nc[0]);
    int compared = 0;
    for (int c = 0; c < nc[0]; c++) {
        const char *h = cell[0][c];
        if (!strcmp(h, "params") || !strcmp(h, "notes") || !strcmp(h, "run_id") || !strcmp(h, "id") ||
            !strcmp(h, "wall_seconds") || !strcmp(h, "created_at"))
            continue;
        if (strcmp(cell[1][c], cell[2][c])) fail_msg("column %s: %s vs %s", h, cell[1][c], cell[2][c]);
        compared++;
    }
    assert_true(compared > 20);
    /* A results database with no heads run: a clear refusal. */
    snprintf(spec_d, sizeof spec_d, "synckv:clusters=%s", rdb);
    const char *bad[] = {"replay", trace, "--db", rdb, "--policy", spec_d, "--budgets", "50%", "--threads", "1", NULL};
    /* exit 2, as for any policy parameter that does not hold (a bad clusters file likewise) */
    assert_int_equal(kvs_test_cli(out, err, bad), 2);
    fp = fopen(err, "r");
    char text[8192];
    size_t len = fread(text, 1, sizeof text - 1, fp);
    text[len] = 0;
    fclose(fp);
    assert_non_null(strstr(text, "no heads results"));
    const char *const files[] = {hdb, rdb, cfile, out, err};
    for (int i = 0; i < 5; i++) {
        char side[4200];
        unlink(files[i]);
        snprintf(side, sizeof side, "%s-wal", files[i]);
        unlink(side);
        snprintf(side, sizeof side, "%s-shm", files[i]);
        unlink(side);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_g5_mem_to_k_table),
        cmocka_unit_test(test_schedule_matches_naive_reference),
        cmocka_unit_test(test_schedule_reference_catches_a_wrong_period),
        cmocka_unit_test(test_nr_reads_only_what_it_holds_and_changes_at_boundaries),
        cmocka_unit_test(test_device_host_and_transfer_bytes),
        cmocka_unit_test(test_prefill_clusters_match_a_naive_similarity),
        cmocka_unit_test(test_cli_flags_an_infeasible_mem),
        cmocka_unit_test(test_cli_clusters_from_a_heads_database),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
