/* test_drift.c — analysis/drift (SyncKV §3.1-3.2 drift, top-k mass and temporal locality; POLICY_SPEC §5.4
 * S1-S3, §6.3, golden value G5) against a brute-force reference that holds the whole GENERATED trace
 * (tests/util/gen_trace.h, not a model's) and every step's attention and top-k sets in memory and recomputes
 * everything in double precision with its own top-k, overlap and window score; the results family
 * (results/results_drift.h) round trip and rollback; and `kvsim drift` through the binary, bad input included.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include <sqlite3.h>

#include "analysis/drift.h"
#include "common/kvs_cluster.h"
#include "common/kvs_rng.h"
#include "plots/plot.h"
#include "results/results_drift.h"
#include "tests/util/cli_run.h"
#include "tests/util/gen_trace.h"

enum { PROMPT = 20, WINDOW = 8, DELTA_MAX = 5, N_K = 3 };
static const int64_t KS[N_K] = {1, 3, 6};

typedef struct {
    char dir[64], path[128], db[128], out[128], err[128];
    kvs_gen_trace *g;
    kvs_trace *t;
} fixture;

static int fx_setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/kvs_drift_XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/t.kvt", f->dir);
    snprintf(f->db, sizeof f->db, "%s/r.db", f->dir);
    snprintf(f->out, sizeof f->out, "%s/out", f->dir);
    snprintf(f->err, sizeof f->err, "%s/err", f->dir);
    kvs_gen_trace_opts o = kvs_gen_trace_defaults(); /* 2 layers, 4 query heads, 2 KV heads (G = 2), d 16 */
    o.n_positions = 44;
    o.prompt_len = PROMPT;
    o.q_scale = 3.0f; /* peaked attention: clear top-k margins */
    o.dtype = KVS_DTYPE_F32;
    if (kvs_gen_trace_create(&o, &f->g) != KVS_OK || kvs_gen_trace_write(f->g, f->path) != KVS_OK) return -1;
    if (kvs_trace_open(f->path, &f->t) != KVS_OK) return -1;
    *state = f;
    return 0;
}

static int fx_teardown(void **state) {
    fixture *f = *state;
    kvs_trace_close(f->t);
    kvs_gen_trace_free(f->g);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    int rc = system(cmd);
    free(f);
    return rc == 0 ? 0 : -1;
}

/* ---- the brute-force reference ---- */

/* Indexes of the k largest of x[0..n-1] by repeated scans, ties to the lower index (POLICY_SPEC §1.4). */
static void naive_topk(const double *x, int64_t n, int64_t k, int32_t *out) {
    unsigned char *taken = calloc((size_t)n, 1);
    for (int64_t r = 0; r < k; r++) {
        int64_t best = -1;
        for (int64_t j = 0; j < n; j++)
            if (!taken[j] && (best < 0 || x[j] > x[best])) best = j;
        taken[best] = 1;
        out[r] = (int32_t)best;
    }
    free(taken);
}

/* |A ∩ B| / min(|A|, |B|) by comparing every pair (SyncKV Eq. 1), sets in any order. */
static double naive_overlap(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    int64_t both = 0;
    for (int64_t i = 0; i < na; i++)
        for (int64_t j = 0; j < nb; j++) both += a[i] == b[j];
    return (double)both / (double)(na < nb ? na : nb);
}

typedef struct {
    int L, H, Hkv, G, U, N, P, T;       /* U = H + Hkv units: heads 0..H-1, then groups */
    double *probs;                      /* [L][H][N][N]: row t = attention of position t over 0..t */
    int32_t *pre;                       /* [L][U][2][n_k][kmax] */
    int32_t *sets;                      /* [L][U][n_k][T][kmax] */
    double *mass;                       /* [L][U][n_k][T] */
} reference;

#define KMAX 6
static double *ref_p(reference *r, int l, int h, int t) {
    return r->probs + ((((size_t)l * (size_t)r->H + (size_t)h) * (size_t)r->N + (size_t)t) * (size_t)r->N);
}
static int32_t *ref_pre(reference *r, int l, int u, int score, int ki) {
    return r->pre + ((((size_t)l * (size_t)r->U + (size_t)u) * 2 + (size_t)score) * N_K + (size_t)ki) * KMAX;
}
static int32_t *ref_set(reference *r, int l, int u, int ki, int s) {
    return r->sets + ((((size_t)l * (size_t)r->U + (size_t)u) * N_K + (size_t)ki) * (size_t)r->T + (size_t)s) * KMAX;
}
static double *ref_mass(reference *r, int l, int u, int ki, int s) {
    return r->mass + (((size_t)l * (size_t)r->U + (size_t)u) * N_K + (size_t)ki) * (size_t)r->T + (size_t)s;
}

/* Everything from the generated q/k in memory, in double. */
static void reference_build(const kvs_gen_trace *g, reference *r) {
    const kvs_gen_trace_opts *o = &g->opt;
    r->L = o->n_layers, r->H = o->n_heads, r->Hkv = o->n_kv_heads, r->G = r->H / r->Hkv, r->U = r->H + r->Hkv;
    r->N = o->n_positions, r->P = PROMPT, r->T = r->N - r->P;
    const int d = o->head_dim;
    const double scale = 1.0 / sqrt((double)d);
    r->probs = calloc((size_t)r->L * (size_t)r->H * (size_t)r->N * (size_t)r->N, sizeof *r->probs);
    r->pre = calloc((size_t)r->L * (size_t)r->U * 2 * N_K * KMAX, sizeof *r->pre);
    r->sets = calloc((size_t)r->L * (size_t)r->U * N_K * (size_t)r->T * KMAX, sizeof *r->sets);
    r->mass = calloc((size_t)r->L * (size_t)r->U * N_K * (size_t)r->T, sizeof *r->mass);
    for (int l = 0; l < r->L; l++)
        for (int h = 0; h < r->H; h++)
            for (int t = 0; t < r->N; t++) {
                const float *q = g->q + (((size_t)l * (size_t)r->N + (size_t)t) * (size_t)r->H + (size_t)h) * (size_t)d;
                double *p = ref_p(r, l, h, t), mx = -INFINITY, z = 0;
                for (int j = 0; j <= t; j++) {
                    const float *k = g->k + (((size_t)l * (size_t)r->N + (size_t)j) * (size_t)r->Hkv + (size_t)(h / r->G)) * (size_t)d;
                    double s = 0;
                    for (int i = 0; i < d; i++) s += (double)q[i] * (double)k[i];
                    p[j] = s * scale;
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = 0; j <= t; j++) z += (p[j] = exp(p[j] - mx));
                for (int j = 0; j <= t; j++) p[j] /= z;
            }
    double *map = malloc((size_t)r->N * sizeof *map);
    for (int l = 0; l < r->L; l++)
        for (int u = 0; u < r->U; u++) {
            const int h0 = u < r->H ? u : (u - r->H) * r->G, h1 = u < r->H ? u + 1 : h0 + r->G;
            /* window score: the window's attention summed per head, max over the group's heads */
            const int m = r->P - WINDOW;
            for (int j = 0; j < m; j++) {
                map[j] = -INFINITY;
                for (int h = h0; h < h1; h++) {
                    double s = 0;
                    for (int t = r->P - WINDOW; t < r->P; t++) s += ref_p(r, l, h, t)[j];
                    if (s > map[j]) map[j] = s;
                }
            }
            for (int ki = 0; ki < N_K; ki++) naive_topk(map, m, KS[ki], ref_pre(r, l, u, 0, ki));
            for (int j = 0; j < r->P; j++) {
                map[j] = -INFINITY;
                for (int h = h0; h < h1; h++) map[j] = fmax(map[j], ref_p(r, l, h, r->P - 1)[j]);
            }
            for (int ki = 0; ki < N_K; ki++) naive_topk(map, r->P, KS[ki], ref_pre(r, l, u, 1, ki));
            for (int s = 0; s < r->T; s++) {
                const int pos = r->P + s;
                for (int j = 0; j <= pos; j++) {
                    map[j] = -INFINITY;
                    for (int h = h0; h < h1; h++) map[j] = fmax(map[j], ref_p(r, l, h, pos)[j]);
                }
                for (int ki = 0; ki < N_K; ki++) {
                    int32_t *set = ref_set(r, l, u, ki, s);
                    naive_topk(map, pos + 1, KS[ki], set);
                    double mass = 0;
                    for (int h = h0; h < h1; h++)
                        for (int64_t i = 0; i < KS[ki]; i++) mass += ref_p(r, l, h, pos)[set[i]];
                    *ref_mass(r, l, u, ki, s) = mass / (h1 - h0);
                }
            }
        }
    free(map);
}

static void reference_free(reference *r) {
    free(r->probs);
    free(r->pre);
    free(r->sets);
    free(r->mass);
}

/* ---- what the streaming analysis emits ---- */

typedef struct {
    kvs_drift_step *steps;
    kvs_drift_locality *loc;
    kvs_drift_locality_unit *lu;
    int64_t n_steps, n_loc, n_lu;
    int fail_after; /* > 0: the step callback fails on that call */
} collected;

static kvs_status got_step(void *ctx, const kvs_drift_step *r) {
    collected *c = ctx;
    if (c->fail_after > 0 && c->n_steps + 1 == c->fail_after) return kvs_fail(KVS_ERR_IO, "test sink: refused");
    c->steps = realloc(c->steps, (size_t)(c->n_steps + 1) * sizeof *c->steps);
    c->steps[c->n_steps++] = *r;
    return KVS_OK;
}
static kvs_status got_loc(void *ctx, const kvs_drift_locality *r) {
    collected *c = ctx;
    c->loc = realloc(c->loc, (size_t)(c->n_loc + 1) * sizeof *c->loc);
    c->loc[c->n_loc++] = *r;
    return KVS_OK;
}
static kvs_status got_lu(void *ctx, const kvs_drift_locality_unit *r) {
    collected *c = ctx;
    c->lu = realloc(c->lu, (size_t)(c->n_lu + 1) * sizeof *c->lu);
    c->lu[c->n_lu++] = *r;
    return KVS_OK;
}
static void collected_free(collected *c) {
    free(c->steps);
    free(c->loc);
    free(c->lu);
}

static kvs_drift_opts test_opts(void) {
    return (kvs_drift_opts){.k = KS, .n_k = N_K, .scores = KVS_DRIFT_SCORE_WINDOW | KVS_DRIFT_SCORE_LAST,
                            .window = WINDOW, .delta_max = DELTA_MAX};
}

static int k_index(int64_t k) {
    for (int i = 0; i < N_K; i++)
        if (KS[i] == k) return i;
    fail_msg("k %lld not in the sweep", (long long)k);
    return -1;
}

static void test_g5_overlap_coefficient(void **state) {
    (void)state;
    /* POLICY_SPEC §7 G5: Overlap({1,2,3,4}, {3,4,5,6,7,8}) = 2/4 = 0.5, by the shared routine the analysis uses
     * and by the reference's pairwise count. */
    const int32_t a[] = {1, 2, 3, 4}, b[] = {3, 4, 5, 6, 7, 8};
    assert_true(kvs_overlap_sorted(a, 4, b, 6) == 0.5);
    assert_true(naive_overlap(a, 4, b, 6) == 0.5);
    assert_true(naive_overlap(b, 6, a, 4) == 0.5);
}

static void test_streaming_equals_brute_force(void **state) {
    fixture *f = *state;
    reference r = {0};
    reference_build(f->g, &r);
    collected c = {0};
    const kvs_drift_opts o = test_opts();
    const kvs_drift_sink sink = {.ctx = &c, .step = got_step, .locality = got_loc, .locality_unit = got_lu};
    assert_int_equal(kvs_analysis_drift_run(f->t, &o, &sink), KVS_OK);

    /* drift and mass: every (layer, unit, k, step), overlaps exactly equal */
    assert_int_equal(c.n_steps, (int64_t)r.L * r.U * N_K * r.T);
    int differ = 0;
    for (int64_t i = 0; i < c.n_steps; i++) {
        const kvs_drift_step *s = &c.steps[i];
        const int u = s->unit == KVS_DRIFT_HEAD ? s->index : r.H + s->index, ki = k_index(s->k);
        assert_int_equal(s->pos, r.P + s->step);
        const int32_t *set = ref_set(&r, s->layer, u, ki, (int)s->step);
        const double ow = naive_overlap(ref_pre(&r, s->layer, u, 0, ki), s->k, set, s->k);
        const double ol = naive_overlap(ref_pre(&r, s->layer, u, 1, ki), s->k, set, s->k);
        assert_true(s->overlap_window == ow);
        assert_true(s->overlap_last == ol);
        assert_true(fabs(s->mass - *ref_mass(&r, s->layer, u, ki, (int)s->step)) < 1e-5);
        differ += ow != ol;
    }
    assert_true(differ > 0); /* the two prefill scores are not the same set: both are exercised */

    /* temporal locality, step x delta, summarised over each layer's units of a kind */
    int64_t want_loc = 0;
    for (int s = 1; s < r.T; s++) want_loc += s < DELTA_MAX ? s : DELTA_MAX;
    assert_int_equal(c.n_loc, (int64_t)r.L * 2 * N_K * want_loc);
    for (int64_t i = 0; i < c.n_loc; i++) {
        const kvs_drift_locality *x = &c.loc[i];
        const int ki = k_index(x->k);
        const int u0 = x->unit == KVS_DRIFT_HEAD ? 0 : r.H, u1 = x->unit == KVS_DRIFT_HEAD ? r.H : r.U;
        double sum = 0, mn = INFINITY, mx = -INFINITY;
        for (int u = u0; u < u1; u++) {
            double ov = naive_overlap(ref_set(&r, x->layer, u, ki, (int)x->step), x->k,
                                      ref_set(&r, x->layer, u, ki, (int)x->step + x->delta), x->k);
            sum += ov;
            mn = fmin(mn, ov);
            mx = fmax(mx, ov);
        }
        assert_int_equal(x->n_units, u1 - u0);
        assert_true(x->min == mn && x->max == mx);
        assert_true(fabs(x->mean - sum / (u1 - u0)) < 1e-12);
    }
    /* per unit, averaged over every pair (t, t + delta) */
    assert_int_equal(c.n_lu, (int64_t)r.L * r.U * N_K * DELTA_MAX);
    for (int64_t i = 0; i < c.n_lu; i++) {
        const kvs_drift_locality_unit *x = &c.lu[i];
        const int u = x->unit == KVS_DRIFT_HEAD ? x->index : r.H + x->index, ki = k_index(x->k);
        double sum = 0;
        for (int t = 0; t + x->delta < r.T; t++)
            sum += naive_overlap(ref_set(&r, x->layer, u, ki, t), x->k, ref_set(&r, x->layer, u, ki, t + x->delta), x->k);
        assert_int_equal(x->n_pairs, r.T - x->delta);
        assert_true(fabs(x->mean - sum / (r.T - x->delta)) < 1e-12);
    }
    collected_free(&c);
    reference_free(&r);
}

static void test_single_score_leaves_the_other_unset(void **state) {
    fixture *f = *state;
    collected c = {0};
    kvs_drift_opts o = test_opts();
    o.scores = KVS_DRIFT_SCORE_LAST;
    o.delta_max = 0;
    const kvs_drift_sink sink = {.ctx = &c, .step = got_step, .locality = got_loc, .locality_unit = got_lu};
    assert_int_equal(kvs_analysis_drift_run(f->t, &o, &sink), KVS_OK);
    assert_true(c.n_steps > 0);
    for (int64_t i = 0; i < c.n_steps; i++) assert_true(isnan(c.steps[i].overlap_window) && !isnan(c.steps[i].overlap_last));
    assert_int_equal(c.n_loc, 0);
    assert_int_equal(c.n_lu, 0);
    collected_free(&c);
}

static void test_check_rejects_bad_options(void **state) {
    fixture *f = *state;
    kvs_drift_opts o = test_opts();
    const int64_t too_big[] = {PROMPT - WINDOW + 1};
    o.k = too_big;
    o.n_k = 1;
    assert_int_equal(kvs_analysis_drift_check(f->t, &o), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "larger than the context"));
    /* the advice is the fix: the last query's score chooses among the whole prompt, where this k fits */
    assert_non_null(strstr(kvs_last_error(), "--prefill-score last"));
    o.scores = KVS_DRIFT_SCORE_LAST; /* the last-query set is chosen among all PROMPT positions: fits */
    assert_int_equal(kvs_analysis_drift_check(f->t, &o), KVS_OK);
    const int64_t unsorted[] = {3, 2};
    o.k = unsorted;
    o.n_k = 2;
    assert_int_equal(kvs_analysis_drift_check(f->t, &o), KVS_ERR_INVALID_ARG);
    o = test_opts();
    o.window = PROMPT;
    assert_int_equal(kvs_analysis_drift_check(f->t, &o), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "no position before"));
    /* default sweep: 2k <= m = PROMPT - 32 < 0 for the window score; 2k <= 20 for last: {4, 8} */
    int64_t ks[8];
    const kvs_trace_info *info = kvs_trace_info_get(f->t);
    assert_int_equal(kvs_analysis_drift_default_ks(info, KVS_DRIFT_SCORE_WINDOW, 32, ks, 8), 0);
    assert_int_equal(kvs_analysis_drift_default_ks(info, KVS_DRIFT_SCORE_LAST, 32, ks, 8), 2);
    assert_true(ks[0] == 4 && ks[1] == 8);
}

static void test_no_decode_steps_is_refused(void **state) {
    fixture *f = *state;
    char path[160];
    snprintf(path, sizeof path, "%s/prompt_only.kvt", f->dir);
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = 24;
    o.prompt_len = 24;
    kvs_gen_trace *g = NULL;
    assert_int_equal(kvs_gen_trace_create(&o, &g), KVS_OK);
    assert_int_equal(kvs_gen_trace_write(g, path), KVS_OK);
    kvs_gen_trace_free(g);
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(path, &t), KVS_OK);
    const int64_t k[] = {2};
    kvs_drift_opts d = test_opts();
    d.k = k;
    d.n_k = 1;
    assert_int_equal(kvs_analysis_drift_run(t, &d, NULL), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "no decode steps"));
    kvs_trace_close(t);
    if (!kvs_test_kvsim_bin()) return;
    const char *args[] = {"drift", path, "--db", f->db, "--k", "2", NULL};
    assert_int_equal(kvs_test_cli(f->out, f->err, args), 1);
    char *text = NULL;
    size_t n = 0;
    assert_int_equal(kvs_read_file(f->err, &text, &n), KVS_OK);
    assert_non_null(strstr(text, "no decode steps"));
    free(text);
    assert_int_equal(access(f->db, F_OK), -1); /* nothing written, not even an empty database */
}

/* The results family: a run written by the writer reads back as the analysis produced it; an aborted run and a
 * run whose analysis fails leave no trace. */
static void test_results_round_trip_and_rollback(void **state) {
    fixture *f = *state;
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(f->db, &db), KVS_OK);
    kvs_results_drift_run *runs = NULL;
    int64_t n_runs = 0;
    assert_int_equal(kvs_results_drift_query_runs(db, NULL, NULL, &runs, &n_runs), KVS_ERR_DB);
    assert_non_null(strstr(kvs_last_error(), "no drift results"));
    const kvs_results_trace rt = kvs_results_trace_of(f->path, kvs_trace_info_get(f->t));
    const kvs_results_drift_params pr = {.prompt_len = PROMPT, .n_steps = 24, .window = WINDOW, .delta_max = DELTA_MAX,
                                         .scores = KVS_DRIFT_SCORE_WINDOW | KVS_DRIFT_SCORE_LAST, .k = KS, .n_k = N_K};
    /* a failing analysis: the sink refuses its 7th row; everything is rolled back */
    kvs_results_drift_writer *w = NULL;
    assert_int_equal(kvs_results_drift_begin(db, &rt, &pr, &w), KVS_OK);
    collected c = {.fail_after = 7};
    kvs_drift_opts o = test_opts();
    const kvs_drift_sink failing = {.ctx = &c, .step = got_step};
    assert_int_equal(kvs_analysis_drift_run(f->t, &o, &failing), KVS_ERR_IO);
    kvs_results_drift_abort(w);
    assert_int_equal(kvs_results_drift_query_runs(db, NULL, NULL, &runs, &n_runs), KVS_ERR_DB);
    collected_free(&c);

    memset(&c, 0, sizeof c);
    const kvs_drift_sink sink = {.ctx = &c, .step = got_step, .locality = got_loc, .locality_unit = got_lu};
    assert_int_equal(kvs_analysis_drift_run(f->t, &o, &sink), KVS_OK);
    assert_int_equal(kvs_results_drift_begin(db, &rt, &pr, &w), KVS_OK);
    for (int64_t i = 0; i < c.n_steps; i++) assert_int_equal(kvs_results_drift_put_step(w, &c.steps[i]), KVS_OK);
    for (int64_t i = 0; i < c.n_loc; i++) assert_int_equal(kvs_results_drift_put_locality(w, &c.loc[i]), KVS_OK);
    for (int64_t i = 0; i < c.n_lu; i++) assert_int_equal(kvs_results_drift_put_locality_unit(w, &c.lu[i]), KVS_OK);
    int64_t run_id = 0;
    assert_int_equal(kvs_results_drift_commit(w, &run_id), KVS_OK);
    kvs_results_close(db);

    assert_int_equal(kvs_results_open_readonly(f->db, &db), KVS_OK);
    assert_int_equal(kvs_results_drift_query_runs(db, "t.kvt", NULL, &runs, &n_runs), KVS_OK);
    assert_int_equal(n_runs, 1);
    assert_int_equal(runs[0].id, run_id);
    assert_int_equal(runs[0].n_k, N_K);
    for (int i = 0; i < N_K; i++) assert_int_equal(runs[0].k[i], KS[i]);
    assert_int_equal(runs[0].window, WINDOW);
    assert_int_equal(runs[0].delta_max, DELTA_MAX);
    assert_int_equal(runs[0].scores, KVS_DRIFT_SCORE_WINDOW | KVS_DRIFT_SCORE_LAST);
    assert_int_equal(runs[0].n_heads, 4);
    kvs_results_drift_runs_free(runs, n_runs);
    assert_int_equal(kvs_results_drift_query_runs(db, "other.kvt", NULL, &runs, &n_runs), KVS_OK);
    assert_int_equal(n_runs, 0);
    kvs_results_drift_runs_free(runs, n_runs);
    int64_t total = 0;
    for (int u = 0; u < KVS_DRIFT_N_UNITS; u++) {
        kvs_drift_step *rows = NULL;
        int64_t n = 0;
        assert_int_equal(kvs_results_drift_query_steps(db, run_id, (kvs_drift_unit)u, -1, 0, &rows, &n), KVS_OK);
        for (int64_t i = 0; i < n; i++) {
            /* find the emitted row with the same key: stored values are the analysis' doubles */
            int found = 0;
            for (int64_t j = 0; j < c.n_steps && !found; j++) {
                const kvs_drift_step *e = &c.steps[j];
                if (e->unit != rows[i].unit || e->layer != rows[i].layer || e->index != rows[i].index ||
                    e->k != rows[i].k || e->step != rows[i].step)
                    continue;
                found = 1;
                assert_true(e->overlap_window == rows[i].overlap_window && e->overlap_last == rows[i].overlap_last &&
                            e->mass == rows[i].mass && e->pos == rows[i].pos);
            }
            assert_true(found);
        }
        total += n;
        free(rows);
        kvs_drift_locality *loc = NULL;
        assert_int_equal(kvs_results_drift_query_locality(db, run_id, (kvs_drift_unit)u, 1, 3, &loc, &n), KVS_OK);
        int64_t want = 0;
        for (int64_t i = 0; i < c.n_loc; i++) want += c.loc[i].unit == (kvs_drift_unit)u && c.loc[i].layer == 1 && c.loc[i].k == 3;
        assert_int_equal(n, want);
        for (int64_t i = 1; i < n; i++)
            assert_true(loc[i - 1].step < loc[i].step || (loc[i - 1].step == loc[i].step && loc[i - 1].delta < loc[i].delta));
        free(loc);
        kvs_drift_locality_unit *lu = NULL;
        assert_int_equal(kvs_results_drift_query_locality_units(db, run_id, (kvs_drift_unit)u, -1, 0, &lu, &n), KVS_OK);
        want = 0;
        for (int64_t i = 0; i < c.n_lu; i++) want += c.lu[i].unit == (kvs_drift_unit)u;
        assert_int_equal(n, want);
        free(lu);
    }
    assert_int_equal(total, c.n_steps);
    kvs_results_close(db);
    collected_free(&c);
}

static int same_bytes(const char *path, const char *want, size_t want_n) {
    char *text = NULL;
    size_t n = 0;
    if (kvs_read_file(path, &text, &n) != KVS_OK) return 0;
    int same = n == want_n && !memcmp(text, want, n);
    free(text);
    return same;
}

static int stderr_has(const fixture *f, const char *what) {
    char *text = NULL;
    size_t n = 0;
    if (kvs_read_file(f->err, &text, &n) != KVS_OK) return 0;
    int has = strstr(text, what) != NULL;
    if (!has) fprintf(stderr, "stderr was: %s\n", text);
    free(text);
    return has;
}

static void test_cli_drift(void **state) {
    fixture *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    const char *ok[] = {"drift", f->path, "--db", f->db, "--k", "6,1,3,3", "--window", "8", "--delta-max", "5", NULL};
    assert_int_equal(kvs_test_cli(f->out, f->err, ok), 0);
    char *text = NULL, *before = NULL;
    size_t n = 0, n_before = 0;
    assert_int_equal(kvs_read_file(f->out, &text, &n), KVS_OK);
    assert_non_null(strstr(text, "prompt 20 positions, 24 decode steps"));
    assert_non_null(strstr(text, "drift run 1 written to"));
    assert_non_null(strstr(text, "at decode step 23")); /* a turn shorter than 50 steps: its last step */
    free(text);
    /* what the command stored is what the analysis computes (sorted, deduplicated k = 1, 3, 6) */
    collected c = {0};
    const kvs_drift_opts o = test_opts();
    const kvs_drift_sink sink = {.ctx = &c, .step = got_step};
    assert_int_equal(kvs_analysis_drift_run(f->t, &o, &sink), KVS_OK);
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open_readonly(f->db, &db), KVS_OK);
    kvs_drift_step *rows = NULL;
    int64_t nr = 0;
    assert_int_equal(kvs_results_drift_query_steps(db, 1, KVS_DRIFT_HEAD, -1, 0, &rows, &nr), KVS_OK);
    int64_t heads = 0;
    for (int64_t i = 0; i < c.n_steps; i++) heads += c.steps[i].unit == KVS_DRIFT_HEAD;
    assert_int_equal(nr, heads);
    double sum_db = 0, sum_mem = 0;
    for (int64_t i = 0; i < nr; i++) sum_db += rows[i].overlap_window + rows[i].overlap_last + rows[i].mass;
    for (int64_t i = 0; i < c.n_steps; i++)
        if (c.steps[i].unit == KVS_DRIFT_HEAD) sum_mem += c.steps[i].overlap_window + c.steps[i].overlap_last + c.steps[i].mass;
    assert_true(fabs(sum_db - sum_mem) < 1e-9);
    free(rows);
    kvs_results_close(db);
    collected_free(&c);

    /* bad usage and bad input after a good run: exit codes, messages, the database byte-identical */
    assert_int_equal(kvs_read_file(f->db, &before, &n_before), KVS_OK);
    const char *too_big[] = {"drift", f->path, "--db", f->db, "--k", "13", "--window", "8", NULL};
    assert_int_equal(kvs_test_cli(f->out, f->err, too_big), 2);
    assert_true(stderr_has(f, "larger than the context"));
    const char *both[] = {"drift", f->path, "--db", f->db, "--k", "2", "--k-frac", "0.1", NULL};
    assert_int_equal(kvs_test_cli(f->out, f->err, both), 2);
    const char *score[] = {"drift", f->path, "--db", f->db, "--prefill-score", "first", NULL};
    assert_int_equal(kvs_test_cli(f->out, f->err, score), 2);
    const char *no_db[] = {"drift", f->path, NULL};
    assert_int_equal(kvs_test_cli(f->out, f->err, no_db), 2);
    const char *frac0[] = {"drift", f->path, "--db", f->db, "--k-frac", "0", NULL};
    assert_int_equal(kvs_test_cli(f->out, f->err, frac0), 2);
    const char *defaults[] = {"drift", f->path, "--db", f->db, NULL}; /* 20 - 32 < 0: no default k fits */
    assert_int_equal(kvs_test_cli(f->out, f->err, defaults), 2);
    assert_true(stderr_has(f, "give --k"));
    assert_true(same_bytes(f->db, before, n_before));

    /* a corrupt trace: the failure comes mid-analysis, the transaction is rolled back */
    char bad[160];
    snprintf(bad, sizeof bad, "%s/corrupt.kvt", f->dir);
    assert_int_equal(kvs_read_file(f->path, &text, &n), KVS_OK);
    for (size_t i = n / 2; i < n / 2 + 64; i++) text[i] ^= 0x5a;
    FILE *fp = fopen(bad, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(text, 1, n, fp), n);
    fclose(fp);
    free(text);
    const char *corrupt[] = {"drift", bad, "--db", f->db, "--k", "2", "--window", "8", NULL};
    assert_int_equal(kvs_test_cli(f->out, f->err, corrupt), 1);
    assert_true(same_bytes(f->db, before, n_before));
    free(before);

    /* a file that is not a kvsim database is refused and left as it was */
    char foreign[160];
    snprintf(foreign, sizeof foreign, "%s/foreign.db", f->dir);
    fp = fopen(foreign, "wb");
    assert_non_null(fp);
    fputs("not a database\n", fp);
    fclose(fp);
    const char *fdb[] = {"drift", f->path, "--db", foreign, "--k", "2", "--window", "8", NULL};
    assert_int_equal(kvs_test_cli(f->out, f->err, fdb), 1);
    assert_true(same_bytes(foreign, "not a database\n", 15));
}

/* The drift plots' scripts carry the data the drift tables hold: the curve's mean over a layer's heads at a step,
 * the heatmap's cells; a database without drift results (empty, or replay-only) is a clear error, left as it was. */
static void test_plots_from_the_drift_tables(void **state) {
    fixture *f = *state;
    collected c = {0};
    kvs_drift_opts o = test_opts();
    const kvs_drift_sink sink = {.ctx = &c, .step = got_step, .locality = got_loc, .locality_unit = got_lu};
    assert_int_equal(kvs_analysis_drift_run(f->t, &o, &sink), KVS_OK);
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(f->db, &db), KVS_OK);
    const kvs_results_trace rt = kvs_results_trace_of(f->path, kvs_trace_info_get(f->t));
    const kvs_results_drift_params pr = {.prompt_len = PROMPT, .n_steps = 24, .window = WINDOW, .delta_max = DELTA_MAX,
                                         .scores = o.scores, .k = KS, .n_k = N_K};
    kvs_results_drift_writer *w = NULL;
    assert_int_equal(kvs_results_drift_begin(db, &rt, &pr, &w), KVS_OK);
    for (int64_t i = 0; i < c.n_steps; i++) assert_int_equal(kvs_results_drift_put_step(w, &c.steps[i]), KVS_OK);
    for (int64_t i = 0; i < c.n_loc; i++) assert_int_equal(kvs_results_drift_put_locality(w, &c.loc[i]), KVS_OK);
    assert_int_equal(kvs_results_drift_commit(w, NULL), KVS_OK);
    kvs_results_close(db);

    /* curve, layer 1, k 3, last-query score: the point of step 5 is the mean over the layer's 4 heads */
    kvs_plot_options po = {.kind = KVS_PLOT_DRIFT_CURVE, .layer = 1, .k = 3, .score = "last", .out_path = "x.png"};
    kvs_plot *p = NULL;
    assert_int_equal(kvs_plot_prepare(f->db, &po, &p), KVS_OK);
    assert_int_equal(kvs_plot_n_series(p), 1);
    char *buf = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&buf, &len);
    assert_int_equal(kvs_plot_write_script(p, "x.png", mf), KVS_OK);
    fclose(mf);
    kvs_plot_free(p);
    double want = 0;
    for (int64_t i = 0; i < c.n_steps; i++)
        if (c.steps[i].unit == KVS_DRIFT_HEAD && c.steps[i].layer == 1 && c.steps[i].k == 3 && c.steps[i].step == 5)
            want += c.steps[i].overlap_last / 4;
    const char *series = strstr(buf, "# series: layer 1\n");
    assert_non_null(series);
    const char *at = strstr(series, "\n5 ");
    assert_non_null(at);
    assert_true(fabs(strtod(at + 3, NULL) - want) < 1e-12);
    /* the dashed chance line: k over the positions step 5 attends to (prompt 20 + 5 + 1), from the stored rows */
    assert_non_null(strstr(buf, "title 'chance: random top-k (k / context)'"));
    const char *chance = strstr(buf, "# series: chance (random top-k)\n");
    assert_non_null(chance);
    at = strstr(chance, "\n5 ");
    assert_non_null(at);
    assert_true(fabs(strtod(at + 3, NULL) - 3.0 / 26.0) < 1e-15);
    free(buf);

    /* heatmap, groups, k 6, all layers: cell (t 2, delta 3) = the mean over the 2 layers of their group means */
    po = (kvs_plot_options){.kind = KVS_PLOT_DRIFT_LOCALITY, .layer = -1, .k = 6, .unit = "group", .out_path = "x.svg"};
    assert_int_equal(kvs_plot_prepare(f->db, &po, &p), KVS_OK);
    mf = open_memstream(&buf, &len);
    assert_int_equal(kvs_plot_write_script(p, "x.svg", mf), KVS_OK);
    fclose(mf);
    kvs_plot_free(p);
    want = 0;
    for (int64_t i = 0; i < c.n_loc; i++)
        if (c.loc[i].unit == KVS_DRIFT_GROUP && c.loc[i].k == 6 && c.loc[i].step == 2 && c.loc[i].delta == 3)
            want += c.loc[i].mean / 2;
    at = strstr(buf, "\n3 2 ");
    assert_non_null(at);
    assert_true(fabs(strtod(at + 5, NULL) - want) < 1e-12);
    assert_non_null(strstr(buf, "set terminal svg"));
    free(buf);
    po.k = 5; /* not in the sweep */
    assert_int_equal(kvs_plot_prepare(f->db, &po, &p), KVS_ERR_DB);
    assert_non_null(strstr(kvs_last_error(), "no k = 5"));
    collected_free(&c);

    /* an empty (0-byte) file and a results database without drift tables */
    char empty[160];
    snprintf(empty, sizeof empty, "%s/empty.db", f->dir);
    FILE *fp = fopen(empty, "wb");
    assert_non_null(fp);
    fclose(fp);
    po = (kvs_plot_options){.kind = KVS_PLOT_DRIFT_CURVE, .layer = -1, .out_path = "x.png"};
    assert_int_not_equal(kvs_plot_prepare(empty, &po, &p), KVS_OK);
    struct stat sb;
    assert_int_equal(stat(empty, &sb), 0);
    assert_int_equal(sb.st_size, 0);
    char plain[160];
    snprintf(plain, sizeof plain, "%s/plain.db", f->dir);
    assert_int_equal(kvs_results_open(plain, &db), KVS_OK);
    kvs_results_close(db);
    assert_int_equal(kvs_plot_prepare(plain, &po, &p), KVS_ERR_DB);
    assert_non_null(strstr(kvs_last_error(), "no drift results"));
    if (!kvs_test_kvsim_bin()) return;
    char png[160];
    snprintf(png, sizeof png, "%s/x.png", f->dir);
    const char *args[] = {"plot", empty, "--kind", "drift-curve", "--out", png, NULL};
    assert_int_equal(kvs_test_cli(f->out, f->err, args), 1);
    assert_int_equal(access(png, F_OK), -1);
    const char *metric[] = {"plot", f->db, "--kind", "drift-curve", "--metric", "out_err_mean", "--out", png, NULL};
    assert_int_equal(kvs_test_cli(f->out, f->err, metric), 2);
}


/* ---- chance levels ---- */

static int popcount32(uint32_t x) {
    int c = 0;
    for (; x; x &= x - 1) c++;
    return c;
}

/* The chance level of a k-set inside n positions, exactly, by enumerating every k-subset B of the n positions:
 * the mean of |A ∩ B| / k for fixed sets A (the first k positions, the last k, every other one) and the mean
 * attention mass on B for an uneven distribution. */
static void test_chance_levels_by_enumeration(void **state) {
    (void)state;
    for (int n = 1; n <= 10; n++)
        for (int k = 1; k <= n; k++) {
            uint32_t first = (1u << k) - 1, last = first << (n - k), spread = 0;
            for (int i = 0, got = 0; i < n && got < k; i++)
                if (i % 2 == 0 || n - i <= k - got) spread |= 1u << i, got++;
            assert_int_equal(popcount32(spread), k);
            double p[10], z = 0;
            for (int j = 0; j < n; j++) z += (p[j] = 1.0 / (1 + j * j));
            double ov[3] = {0}, mass = 0;
            int64_t subsets = 0;
            for (uint32_t b = 0; b < (1u << n); b++) {
                if (popcount32(b) != k) continue;
                subsets++;
                ov[0] += (double)popcount32(first & b) / k;
                ov[1] += (double)popcount32(last & b) / k;
                ov[2] += (double)popcount32(spread & b) / k;
                for (int j = 0; j < n; j++)
                    if (b >> j & 1) mass += p[j] / z;
            }
            const double want = kvs_analysis_drift_chance(k, n);
            for (int a = 0; a < 3; a++) assert_true(fabs(ov[a] / (double)subsets - want) < 1e-12);
            assert_true(fabs(mass / (double)subsets - want) < 1e-12);
        }
    assert_true(isnan(kvs_analysis_drift_chance(0, 5)));
    assert_true(isnan(kvs_analysis_drift_chance(6, 5)));

    /* a per-unit locality level: prompt 2, 4 decode steps (contexts 3, 4, 5, 6), k 2, both sets of a pair (t, t+d)
     * random, every pair of subsets enumerated, the pairs' means averaged over t */
    enum { P = 2, T = 4, KK = 2 };
    for (int d = 1; d < T; d++) {
        double sum_t = 0;
        for (int t = 0; t + d < T; t++) {
            const int na = P + t + 1, nb = P + t + d + 1;
            double sum = 0;
            int64_t pairs = 0;
            for (uint32_t a = 0; a < (1u << na); a++) {
                if (popcount32(a) != KK) continue;
                for (uint32_t b = 0; b < (1u << nb); b++) {
                    if (popcount32(b) != KK) continue;
                    sum += (double)popcount32(a & b) / KK;
                    pairs++;
                }
            }
            sum_t += sum / (double)pairs;
        }
        assert_true(fabs(kvs_analysis_drift_locality_chance(KK, P, T, d) - sum_t / (T - d)) < 1e-12);
    }
    assert_true(isnan(kvs_analysis_drift_locality_chance(KK, P, T, T)));
}

/* A uniformly random k-subset of 0..n-1 as a membership mask (partial Fisher-Yates). */
static void random_subset(kvs_rng *r, int n, int k, unsigned char *mask) {
    int idx[64];
    for (int i = 0; i < n; i++) idx[i] = i, mask[i] = 0;
    for (int i = 0; i < k; i++) {
        int j = i + (int)(kvs_rng_u32(r) % (uint32_t)(n - i));
        int tmp = idx[i];
        idx[i] = idx[j];
        idx[j] = tmp;
        mask[idx[i]] = 1;
    }
}

static double common_over_k(const unsigned char *a, const unsigned char *b, int n, int k) {
    int c = 0;
    for (int i = 0; i < n; i++) c += a[i] && b[i];
    return (double)c / k;
}

/* One Monte Carlo estimate: mean and standard error over the reps. */
typedef struct {
    double sum, sumsq;
} mc_acc;
static void mc_add(mc_acc *a, double v) {
    a->sum += v;
    a->sumsq += v * v;
}
static void mc_check(const mc_acc *a, int reps, double got, const char *what, int64_t k) {
    const double mean = a->sum / reps, var = a->sumsq / reps - mean * mean, se = sqrt(var > 0 ? var / reps : 0);
    if (!(fabs(got - mean) <= 5 * se + 1e-9))
        fail_msg("%s at k %lld: %.6f, a Monte Carlo of random top-k sets gives %.6f +- %.6f", what, (long long)k, got,
                 mean, se);
}

/* The chance columns of the summary (CLI CSV and the analysis' rows averaged as the summary averages them) against
 * a Monte Carlo of the whole measurement with the top-k sets drawn at random: per rep, random prefill sets (window
 * and last, among their candidates), a random set at every decode step among the positions it attends to, and the
 * summary's averages taken over the same steps. Fixed seed, 2000 reps, 5 standard errors. */
static void test_chance_columns_by_monte_carlo(void **state) {
    fixture *f = *state;
    reference r = {0};
    reference_build(f->g, &r);
    collected c = {0};
    const kvs_drift_opts o = test_opts();
    const kvs_drift_sink sink = {.ctx = &c, .step = got_step, .locality = got_loc, .locality_unit = got_lu};
    assert_int_equal(kvs_analysis_drift_run(f->t, &o, &sink), KVS_OK);
    const int T = r.T, P = r.P, m = P - WINDOW, at = T - 1, N = r.N; /* a turn shorter than 50 steps: its last */
    /* every row's level is its own step's: k over the positions the step attends to */
    for (int64_t i = 0; i < c.n_steps; i++) assert_true(c.steps[i].chance == (double)c.steps[i].k / (double)(c.steps[i].pos + 1));

    double csv[N_K][5]; /* chance_at, chance_avg, chance_d1, chance_dn as the CLI prints them; [4]: mass */
    int have_csv = 0;
    if (kvs_test_kvsim_bin()) {
        const char *args[] = {"drift", f->path, "--db", f->db, "--k", "1,3,6", "--window", "8", "--delta-max", "5",
                              "--csv", NULL};
        assert_int_equal(kvs_test_cli(f->out, f->err, args), 0);
        char *text = NULL;
        size_t n = 0;
        assert_int_equal(kvs_read_file(f->out, &text, &n), KVS_OK);
        assert_non_null(strstr(text, "unit,k,layer,at_step,win_at,last_at,chance_at,win_avg,last_avg,mass,chance_avg,"
                                     "delta_n,loc_d1,chance_d1,loc_dn,chance_dn\n"));
        for (int ki = 0; ki < N_K; ki++) {
            char key[32];
            snprintf(key, sizeof key, "\nhead,%lld,all,%d,", (long long)KS[ki], at);
            const char *row = strstr(text, key);
            assert_non_null(row);
            double v[12];
            const char *q = row + strlen(key);
            for (int i = 0; i < 12; i++) {
                char *end;
                v[i] = strtod(q, &end);
                assert_true(end != q);
                q = end + 1;
            }
            /* win_at last_at chance_at win_avg last_avg mass chance_avg delta_n loc_d1 chance_d1 loc_dn chance_dn */
            csv[ki][0] = v[2], csv[ki][1] = v[6], csv[ki][2] = v[9], csv[ki][3] = v[11], csv[ki][4] = v[6];
            assert_true(v[7] == DELTA_MAX);
        }
        free(text);
        have_csv = 1;
    }

    enum { REPS = 2000 };
    kvs_rng rng;
    kvs_rng_seed(&rng, 20240611, 1);
    unsigned char *sets = malloc((size_t)T * (size_t)N), aw[64], al[64];
    for (int ki = 0; ki < N_K; ki++) {
        const int k = (int)KS[ki];
        mc_acc at_w = {0}, at_l = {0}, avg_w = {0}, avg_l = {0}, mass = {0}, d1 = {0}, dn = {0};
        for (int rep = 0; rep < REPS; rep++) {
            random_subset(&rng, m, k, aw);
            random_subset(&rng, P, k, al);
            double sw = 0, sl = 0, sm = 0, s1 = 0, sn = 0;
            for (int s = 0; s < T; s++) {
                const int n = P + s + 1;
                unsigned char *b = sets + (size_t)s * (size_t)N;
                random_subset(&rng, n, k, b);
                const double ow = common_over_k(aw, b, m, k), ol = common_over_k(al, b, P, k);
                sw += ow, sl += ol;
                if (s == at) mc_add(&at_w, ow), mc_add(&at_l, ol);
                const double *p = ref_p(&r, 0, 0, P + s); /* a real attention row: the level does not depend on it */
                for (int j = 0; j < n; j++)
                    if (b[j]) sm += p[j];
            }
            for (int t = 0; t + 1 < T; t++) s1 += common_over_k(sets + (size_t)t * N, sets + (size_t)(t + 1) * N, P + t + 1, k);
            for (int t = 0; t + DELTA_MAX < T; t++)
                sn += common_over_k(sets + (size_t)t * N, sets + (size_t)(t + DELTA_MAX) * N, P + t + 1, k);
            mc_add(&avg_w, sw / T), mc_add(&avg_l, sl / T), mc_add(&mass, sm / T);
            mc_add(&d1, s1 / (T - 1)), mc_add(&dn, sn / (T - DELTA_MAX));
        }
        /* the analysis' rows, averaged as the summary averages them (head rows of every layer) */
        double r_at = 0, r_avg = 0, r_d1 = 0, r_dn = 0, n_at = 0, n_avg = 0, n_d1 = 0, n_dn = 0;
        for (int64_t i = 0; i < c.n_steps; i++) {
            const kvs_drift_step *x = &c.steps[i];
            if (x->unit != KVS_DRIFT_HEAD || x->k != k) continue;
            r_avg += x->chance, n_avg++;
            if (x->step == at) r_at += x->chance, n_at++;
        }
        for (int64_t i = 0; i < c.n_loc; i++) {
            const kvs_drift_locality *x = &c.loc[i];
            if (x->unit != KVS_DRIFT_HEAD || x->k != k) continue;
            if (x->delta == 1) r_d1 += x->chance, n_d1++;
            if (x->delta == DELTA_MAX) r_dn += x->chance, n_dn++;
        }
        const double rows[5] = {r_at / n_at, r_avg / n_avg, r_d1 / n_d1, r_dn / n_dn, r_avg / n_avg};
        for (int src = 0; src < 1 + have_csv; src++) {
            const double *v = src ? csv[ki] : rows;
            mc_check(&at_w, REPS, v[0], "chance at the summary step (window set)", k);
            mc_check(&at_l, REPS, v[0], "chance at the summary step (last set)", k);
            mc_check(&avg_w, REPS, v[1], "chance averaged over the steps (window set)", k);
            mc_check(&avg_l, REPS, v[1], "chance averaged over the steps (last set)", k);
            mc_check(&mass, REPS, v[4], "chance of the mass", k);
            mc_check(&d1, REPS, v[2], "chance of locality at d = 1", k);
            mc_check(&dn, REPS, v[3], "chance of locality at d = N", k);
        }
        /* the per-unit locality rows: the mean of the pairs' levels */
        for (int64_t i = 0; i < c.n_lu; i++)
            if (c.lu[i].k == k && c.lu[i].delta == 1) mc_check(&d1, REPS, c.lu[i].chance, "per-unit locality chance", k);
    }
    free(sets);
    collected_free(&c);
    reference_free(&r);
}

/* The chance columns survive the database, and a database of the old form (no chance columns) reads the same
 * levels: the reader computes them; a new run written into it adds the columns, and the old run still reads. */
static void test_chance_in_the_tables_and_the_old_form(void **state) {
    fixture *f = *state;
    collected c = {0};
    const kvs_drift_opts o = test_opts();
    const kvs_drift_sink sink = {.ctx = &c, .step = got_step, .locality = got_loc, .locality_unit = got_lu};
    assert_int_equal(kvs_analysis_drift_run(f->t, &o, &sink), KVS_OK);
    const kvs_results_trace rt = kvs_results_trace_of(f->path, kvs_trace_info_get(f->t));
    const kvs_results_drift_params pr = {.prompt_len = PROMPT, .n_steps = 24, .window = WINDOW, .delta_max = DELTA_MAX,
                                         .scores = o.scores, .k = KS, .n_k = N_K};
    for (int form = 0; form < 2; form++) {
        kvs_results_db *db = NULL;
        assert_int_equal(kvs_results_open(f->db, &db), KVS_OK);
        kvs_results_drift_writer *w = NULL;
        assert_int_equal(kvs_results_drift_begin(db, &rt, &pr, &w), KVS_OK);
        for (int64_t i = 0; i < c.n_steps; i++) assert_int_equal(kvs_results_drift_put_step(w, &c.steps[i]), KVS_OK);
        for (int64_t i = 0; i < c.n_loc; i++) assert_int_equal(kvs_results_drift_put_locality(w, &c.loc[i]), KVS_OK);
        for (int64_t i = 0; i < c.n_lu; i++) assert_int_equal(kvs_results_drift_put_locality_unit(w, &c.lu[i]), KVS_OK);
        assert_int_equal(kvs_results_drift_commit(w, NULL), KVS_OK);
        kvs_results_close(db);
        if (form == 0) {
            /* the old form: the family's tables without their chance columns */
            sqlite3 *raw = NULL;
            assert_int_equal(sqlite3_open(f->db, &raw), SQLITE_OK);
            assert_int_equal(sqlite3_exec(raw, "ALTER TABLE drift_steps DROP COLUMN chance; ALTER TABLE drift_locality "
                                               "DROP COLUMN chance; ALTER TABLE drift_locality_units DROP COLUMN chance;",
                                          NULL, NULL, NULL),
                             SQLITE_OK);
            sqlite3_close(raw);
        }
        assert_int_equal(kvs_results_open_readonly(f->db, &db), KVS_OK);
        for (int64_t run = 1; run <= form + 1; run++)
            for (int u = 0; u < KVS_DRIFT_N_UNITS; u++) {
                kvs_drift_step *rows = NULL;
                kvs_drift_locality *loc = NULL;
                kvs_drift_locality_unit *lu = NULL;
                int64_t n = 0, nl = 0, nu = 0;
                assert_int_equal(kvs_results_drift_query_steps(db, run, (kvs_drift_unit)u, -1, 0, &rows, &n), KVS_OK);
                assert_true(n > 0);
                for (int64_t i = 0; i < n; i++) assert_true(rows[i].chance == kvs_analysis_drift_chance(rows[i].k, rows[i].pos + 1));
                assert_int_equal(kvs_results_drift_query_locality(db, run, (kvs_drift_unit)u, -1, 0, &loc, &nl), KVS_OK);
                assert_true(nl > 0);
                for (int64_t i = 0; i < nl; i++)
                    assert_true(loc[i].chance == kvs_analysis_drift_chance(loc[i].k, PROMPT + loc[i].step + loc[i].delta + 1));
                assert_int_equal(kvs_results_drift_query_locality_units(db, run, (kvs_drift_unit)u, -1, 0, &lu, &nu), KVS_OK);
                assert_true(nu > 0);
                for (int64_t i = 0; i < nu; i++) {
                    /* the same as the analysis emitted for that row */
                    int found = 0;
                    for (int64_t j = 0; j < c.n_lu && !found; j++)
                        if (c.lu[j].unit == lu[i].unit && c.lu[j].layer == lu[i].layer && c.lu[j].index == lu[i].index &&
                            c.lu[j].k == lu[i].k && c.lu[j].delta == lu[i].delta)
                            found = 1, assert_true(fabs(c.lu[j].chance - lu[i].chance) < 1e-15);
                    assert_true(found);
                }
                free(rows);
                free(loc);
                free(lu);
            }
        kvs_results_close(db);
    }
    collected_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_g5_overlap_coefficient),
        cmocka_unit_test_setup_teardown(test_streaming_equals_brute_force, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_single_score_leaves_the_other_unset, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_check_rejects_bad_options, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_no_decode_steps_is_refused, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_results_round_trip_and_rollback, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cli_drift, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_plots_from_the_drift_tables, fx_setup, fx_teardown),
        cmocka_unit_test(test_chance_levels_by_enumeration),
        cmocka_unit_test_setup_teardown(test_chance_columns_by_monte_carlo, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_chance_in_the_tables_and_the_old_form, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
