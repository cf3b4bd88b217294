/* calibrate.c — offline replay against closed-loop decoding: pairs, duplicates collapsed, within-selection Spearman
 * correlations averaged over traces and their bootstrap over policies and traces (method in results/calibrate.h).
 */
#include "calibrate.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_rng.h"
#include "compare.h"
#include "results_internal.h"

const char *const kvs_calibration_x_names[KVS_CALIB_NX] = {"out_err_mean", "out_err_p95", "attn_recall"};
const char *const kvs_calibration_y_names[KVS_CALIB_NY] = {"kl_mean", "top1_agree", "delta_ppl"};

struct kvs_calibration {
    kvs_results_closed_row *cl;
    kvs_results_run_row *runs;
    int64_t n_cl, n_runs;
    kvs_calibration_pair *pairs;
    size_t n_pairs;
    kvs_calibration_trace *traces;
    size_t n_traces;
    const char **policies; /* borrowed from the closed rows */
    size_t n_policies;
};

/* ---- pairing --------------------------------------------------------------------------------------------- */

/* One trace: the same content hash when both runs recorded one (any path spelling), else the same traces row. */
static int same_trace(const char *sha_a, int64_t id_a, const char *sha_b, int64_t id_b) {
    if (sha_a && sha_b) return !strcmp(sha_a, sha_b);
    return id_a == id_b;
}

static int is_teacher(const kvs_results_closed_row *c) { return c->trace_id > 0 && !strcmp(c->mode, "teacher"); }

static int stat_equal(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

/* Every statistic of every quality and token-count metric of the two run-wide aggregates equal: the offline
 * numbers of one selection. Byte metrics are left out on purpose (a window in disguise stores more). */
static int agg_equal(const kvs_results_agg *a, const kvs_results_agg *b) {
    for (int m = 0; m < KVS_N_METRICS; m++) {
        kvs_metric_kind k = kvs_metric_table[m].kind;
        if (k != KVS_METRIC_QUALITY && k != KVS_METRIC_TOKENS) continue;
        if (a->m[m].n != b->m[m].n) return 0;
        for (int s = KVS_STAT_MEAN; s < KVS_N_STATS; s++)
            if (!stat_equal(kvs_results_stat_value(&a->m[m], (kvs_stat_kind)s),
                            kvs_results_stat_value(&b->m[m], (kvs_stat_kind)s)))
                return 0;
    }
    return 1;
}

static int series_equal(const kvs_results_series *a, const kvs_results_series *b) {
    if (a->n == 0 || b->n == 0) return 1; /* one of them stored no series: the aggregates decide */
    if (a->n != b->n) return 0;
    for (int64_t i = 0; i < a->n; i++)
        if (a->position[i] != b->position[i] || !stat_equal(a->value[i], b->value[i])) return 0;
    return 1;
}

static double x_of(const kvs_results_run_row *r, int k) {
    return k == 0 ? r->agg.out_err.mean : k == 1 ? r->agg.out_err.p95 : r->agg.attn_recall.mean;
}

static double y_of(const kvs_results_closed_row *c, int k) {
    return k == 0 ? c->kl_mean : k == 1 ? c->top1_agree : c->ppl_policy - c->ppl_full;
}

static int is_full_cache(const kvs_results_closed_row *c, const kvs_results_run_row *r) {
    return (c->budget_scope && !strcmp(c->budget_scope, "none")) || (r->budget_scope && !strcmp(r->budget_scope, "none"));
}

static size_t policy_index(kvs_calibration *c, const char *name) {
    for (size_t i = 0; i < c->n_policies; i++)
        if (!strcmp(c->policies[i], name)) return i;
    c->policies[c->n_policies] = name;
    return c->n_policies++;
}

/* One codec spelling for "none": NULL and "" alike. */
static int same_codec(const char *a, const char *b) {
    return !strcmp(a && a[0] ? a : "", b && b[0] ? b : "");
}

/* A replay run that the closed-loop run q is the open-loop counterpart of: the same trace, configuration, budget and
 * codec, at token granularity (the closed loop has no paged cache). */
static int counterpart(const kvs_results_run_row *w, const kvs_results_closed_row *q) {
    return same_trace(w->trace_sha256, w->trace_id, q->trace_sha256, q->trace_id) && w->has_agg &&
           w->budget_tokens == q->budget_tokens && !strcmp(w->policy, q->policy) && !strcmp(w->params, q->params) &&
           same_codec(w->codec, q->codec) && w->page == 0;
}

/* The pairs, grouped by trace in order of first appearance; in a trace, configurations in order of first closed-loop
 * run, each with its latest closed-loop run and its latest replay run. */
static kvs_status build_pairs(kvs_calibration *c) {
    const kvs_results_closed_row *cl = c->cl;
    for (int64_t i = 0; i < c->n_cl; i++) {
        if (!is_teacher(&cl[i])) continue;
        int seen = 0;
        for (int64_t k = 0; k < i && !seen; k++)
            seen = is_teacher(&cl[k]) && same_trace(cl[k].trace_sha256, cl[k].trace_id, cl[i].trace_sha256, cl[i].trace_id);
        if (seen) continue;
        size_t first = c->n_pairs;
        for (int64_t j = i; j < c->n_cl; j++) {
            const kvs_results_closed_row *q = &cl[j];
            if (!is_teacher(q) || !same_trace(q->trace_sha256, q->trace_id, cl[i].trace_sha256, cl[i].trace_id))
                continue;
            const kvs_results_run_row *best = NULL;
            for (int64_t r = 0; r < c->n_runs; r++) {
                const kvs_results_run_row *w = &c->runs[r];
                if (counterpart(w, q)) best = w;
            }
            int dup = 0; /* a configuration generated twice: the latest closed-loop run */
            for (size_t p = first; p < c->n_pairs; p++)
                if (c->pairs[p].c->budget_tokens == q->budget_tokens && !strcmp(c->pairs[p].c->policy, q->policy) &&
                    !strcmp(c->pairs[p].c->params, q->params) && same_codec(c->pairs[p].c->codec, q->codec)) {
                    c->pairs[p].c = q;
                    if (best) c->pairs[p].r = best;
                    dup = 1;
                }
            if (!dup && best) c->pairs[c->n_pairs++] = (kvs_calibration_pair){.c = q, .r = best};
        }
        if (c->n_pairs == first) continue;
        kvs_calibration_trace *t = &c->traces[c->n_traces];
        const kvs_results_run_row *r0 = c->pairs[first].r;
        *t = (kvs_calibration_trace){.model = cl[i].model, .path = r0->trace_path, .prompt_len = cl[i].prompt_len,
                                     .first = first, .n = c->n_pairs - first};
        if (r0->trace_sha256) snprintf(t->id, sizeof t->id, "%s", r0->trace_sha256);
        else snprintf(t->id, sizeof t->id, "trace#%lld", (long long)r0->trace_id);
        kvs_results_trace_label(r0, t->label, sizeof t->label);
        for (size_t p = first; p < c->n_pairs; p++) c->pairs[p].trace = c->n_traces;
        c->n_traces++;
    }
    for (size_t p = 0; p < c->n_pairs; p++) {
        kvs_calibration_pair *q = &c->pairs[p];
        q->policy = policy_index(c, q->c->policy);
        q->full_cache = is_full_cache(q->c, q->r);
        q->noted = kvs_compare_run_noted(q->r);
        double s = q->r->agg.storage_bytes.mean;
        q->mem_log2 = isfinite(s) && s >= 1 ? (int)floor(log2(s)) : KVS_CALIB_NO_MEM;
        for (int k = 0; k < KVS_CALIB_NX; k++) q->x[k] = x_of(q->r, k);
        for (int k = 0; k < KVS_CALIB_NY; k++) q->y[k] = y_of(q->c, k);
    }
    return KVS_OK;
}

/* Each pair's class: the first earlier pair of its trace with equal aggregates (and equal series where both runs
 * stored one). The series are read only for pairs whose aggregates match another's. */
static kvs_status collapse(kvs_calibration *c, kvs_results_db *db) {
    kvs_status st = KVS_OK;
    kvs_results_series *ser = calloc(c->n_pairs + 1, sizeof *ser);
    char *loaded = calloc(c->n_pairs + 1, 1);
    if (!ser || !loaded) {
        st = kvs_fail(KVS_ERR_NOMEM, "calibrate: out of memory");
        goto cleanup;
    }
    for (size_t t = 0; t < c->n_traces; t++) {
        kvs_calibration_trace *tr = &c->traces[t];
        for (size_t p = tr->first; p < tr->first + tr->n; p++) {
            kvs_calibration_pair *a = &c->pairs[p];
            a->rep = p;
            for (size_t q = tr->first; q < p; q++) {
                kvs_calibration_pair *b = &c->pairs[q];
                if (b->rep != q || !agg_equal(&a->r->agg, &b->r->agg)) continue;
                for (size_t k = 0; k < 2; k++) {
                    size_t i = k ? q : p;
                    if (loaded[i]) continue;
                    KVS_TRY(st = kvs_results_query_steps(db, c->pairs[i].r->id, -1, KVS_M_OUT_ERR, &ser[i]));
                    loaded[i] = 1;
                }
                if (!series_equal(&ser[p], &ser[q])) continue;
                a->rep = q;
                break;
            }
            if (a->rep == p) {
                tr->n_distinct++;
            } else {
                for (int k = 0; k < KVS_CALIB_NY; k++)
                    if (!stat_equal(a->y[k], c->pairs[a->rep].y[k])) {
                        tr->n_y_differ++;
                        break;
                    }
            }
        }
    }
cleanup:
    if (ser)
        for (size_t i = 0; i < c->n_pairs; i++) kvs_results_series_free(&ser[i]);
    free(ser);
    free(loaded);
    return st;
}

kvs_status kvs_calibration_create(kvs_results_db *db, kvs_calibration **out) {
    *out = NULL;
    kvs_calibration *c = calloc(1, sizeof *c);
    if (!c) return kvs_fail(KVS_ERR_NOMEM, "calibrate: out of memory");
    kvs_status st;
    KVS_TRY(st = kvs_results_closed_query(db, &c->cl, &c->n_cl));
    kvs_results_filter f = {.measure = "decode"};
    KVS_TRY(st = kvs_results_query_runs(db, &f, &c->runs, &c->n_runs));
    size_t cap = (size_t)c->n_cl + 1;
    c->pairs = calloc(cap, sizeof *c->pairs);
    c->traces = calloc(cap, sizeof *c->traces);
    c->policies = calloc(cap, sizeof *c->policies);
    if (!c->pairs || !c->traces || !c->policies) {
        st = kvs_fail(KVS_ERR_NOMEM, "calibrate: out of memory");
        goto cleanup;
    }
    KVS_TRY(st = build_pairs(c));
    if (c->n_pairs == 0) {
        st = kvs_fail(KVS_ERR_STATE, "%s: no (policy, budget) has both a replay run and a teacher-forced closed-loop "
                      "run on the same trace (kvsim replay TRACE ... and kvsim generate --trace TRACE ...)",
                      kvs_results_path(db));
        goto cleanup;
    }
    KVS_TRY(st = collapse(c, db));
    *out = c;
    return KVS_OK;
cleanup:
    kvs_calibration_free(c);
    return st;
}

void kvs_calibration_free(kvs_calibration *c) {
    if (!c) return;
    kvs_results_closed_rows_free(c->cl, c->n_cl);
    kvs_results_run_rows_free(c->runs, c->n_runs);
    free(c->pairs);
    free(c->traces);
    free(c->policies);
    free(c);
}

size_t kvs_calibration_n_pairs(const kvs_calibration *c) { return c->n_pairs; }
const kvs_calibration_pair *kvs_calibration_pair_at(const kvs_calibration *c, size_t i) { return &c->pairs[i]; }
size_t kvs_calibration_n_traces(const kvs_calibration *c) { return c->n_traces; }
const kvs_calibration_trace *kvs_calibration_trace_at(const kvs_calibration *c, size_t i) { return &c->traces[i]; }
size_t kvs_calibration_n_policies(const kvs_calibration *c) { return c->n_policies; }
const char *kvs_calibration_policy_name(const kvs_calibration *c, size_t i) { return c->policies[i]; }

/* ---- correlations ---------------------------------------------------------------------------------------- */

int kvs_calibration_in_sel(const kvs_calibration *c, const kvs_calibration_sel *s, size_t i) {
    const kvs_calibration_pair *p = &c->pairs[i];
    if (strcmp(c->traces[p->trace].model, s->model) != 0) return 0;
    switch (s->kind) {
    case KVS_CALIB_POOLED: return !p->full_cache;
    case KVS_CALIB_BUDGET: return !p->full_cache && p->c->budget_tokens == s->budget;
    case KVS_CALIB_MEMORY: return p->mem_log2 != KVS_CALIB_NO_MEM && p->mem_log2 == s->mem_log2;
    }
    return 0;
}

#define FNV_BASIS KVS_FNV1A64_BASIS
#define fnv_str kvs_fnv1a64

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The selection's seed: the identity string of results/calibrate.h, hashed. */
static kvs_status sel_seed(const kvs_calibration *c, const kvs_calibration_sel *s, const size_t *units, size_t n_units,
                           uint64_t extra, uint64_t *seed) {
    char **ids = calloc(n_units + 1, sizeof *ids);
    if (!ids) return kvs_fail(KVS_ERR_NOMEM, "calibrate: out of memory");
    kvs_status st = KVS_OK;
    for (size_t i = 0; i < n_units; i++) {
        const kvs_calibration_pair *p = &c->pairs[units[i]];
        /* a codec enters the unit's identity only when set: the seeds of runs without one stay as they were */
        const char *codec = p->c->codec && p->c->codec[0] ? p->c->codec : NULL;
        int len = snprintf(NULL, 0, "%s|%s|%s|%lld%s%s", c->traces[p->trace].id, p->c->policy, p->c->params,
                           (long long)p->c->budget_tokens, codec ? "|codec=" : "", codec ? codec : "");
        ids[i] = malloc((size_t)len + 1);
        if (!ids[i]) {
            st = kvs_fail(KVS_ERR_NOMEM, "calibrate: out of memory");
            goto cleanup;
        }
        snprintf(ids[i], (size_t)len + 1, "%s|%s|%s|%lld%s%s", c->traces[p->trace].id, p->c->policy, p->c->params,
                 (long long)p->c->budget_tokens, codec ? "|codec=" : "", codec ? codec : "");
    }
    qsort(ids, n_units, sizeof *ids, cmp_str);
    char head[256];
    if (s->kind == KVS_CALIB_POOLED) snprintf(head, sizeof head, "|pooled|");
    else if (s->kind == KVS_CALIB_BUDGET) snprintf(head, sizeof head, "|budget=%lld|", (long long)s->budget);
    else snprintf(head, sizeof head, "|memory=%d|", s->mem_log2);
    uint64_t h = fnv_str(fnv_str(fnv_str(FNV_BASIS, "calibrate|"), s->model), head);
    for (size_t i = 0; i < n_units; i++) {
        if (i) h = fnv_str(h, ",");
        h = fnv_str(h, ids[i]);
    }
    if (extra) {
        char tail[48];
        snprintf(tail, sizeof tail, "|seed=%llu", (unsigned long long)extra);
        h = fnv_str(h, tail);
    }
    *seed = h;
cleanup:
    for (size_t i = 0; i < n_units; i++) free(ids[i]);
    free(ids);
    return st;
}

/* Scratch of one correlation: the units of each used trace and the cell arrays. */
typedef struct {
    size_t *units;      /* [n_units] pair indices, grouped by used trace */
    size_t *t_first, *t_n; /* [n_used] */
    size_t n_used;
    size_t *pol;        /* [n_pol] policy indices with a unit */
    size_t n_pol;
    size_t *pol_of;     /* [n_units] index into pol of each unit */
    double *bx, *by;    /* [cap] */
    size_t cap;
} corr_work;

/* rho of cell (xk, yk) over the units of used trace t, unit u taken w[pol_of[u]] times (w NULL: once): NaN when
 * undefined (fewer than 2 points with both values finite, or a constant side). */
static kvs_status trace_rho(const kvs_calibration *c, corr_work *W, size_t t, const int *w, int xk, int yk,
                            double *rho) {
    size_t m = 0;
    for (size_t u = W->t_first[t]; u < W->t_first[t] + W->t_n[t]; u++) {
        const kvs_calibration_pair *p = &c->pairs[W->units[u]];
        if (!isfinite(p->x[xk]) || !isfinite(p->y[yk])) continue;
        int times = w ? w[W->pol_of[u]] : 1;
        for (int k = 0; k < times; k++) {
            W->bx[m] = p->x[xk];
            W->by[m] = p->y[yk];
            m++;
        }
    }
    *rho = NAN;
    if (m < 2) return KVS_OK;
    kvs_status st = kvs_spearman(W->bx, W->by, m, rho);
    if (st != KVS_OK) return st;
    if (!isfinite(*rho)) *rho = NAN;
    return KVS_OK;
}

kvs_status kvs_calibration_correlate(const kvs_calibration *c, const kvs_calibration_sel *s, int reps, double level,
                                     uint64_t seed_extra, kvs_calibration_corr *out) {
    if (reps < 0 || !(level > 0 && level < 1) || !s || !s->model)
        return kvs_fail(KVS_ERR_INVALID_ARG, "calibrate: reps = %d, level = %g, model %s (need reps >= 0, level in "
                        "(0, 1), a model)", reps, level, s && s->model ? s->model : "missing");
    memset(out, 0, sizeof *out);
    for (int a = 0; a < KVS_CALIB_NX; a++)
        for (int b = 0; b < KVS_CALIB_NY; b++) {
            out->rho[a][b] = (kvs_interval){.mean = NAN, .lo = NAN, .hi = NAN, .level = level, .reps = reps};
            out->rho_min[a][b] = out->rho_max[a][b] = NAN;
        }
    corr_work W = {0};
    double *vals = NULL;
    kvs_status st = KVS_OK;
    size_t n = c->n_pairs;
    W.units = calloc(n + 1, sizeof *W.units);
    W.t_first = calloc(c->n_traces + 1, sizeof *W.t_first);
    W.t_n = calloc(c->n_traces + 1, sizeof *W.t_n);
    W.pol = calloc(c->n_policies + 1, sizeof *W.pol);
    W.pol_of = calloc(n + 1, sizeof *W.pol_of);
    /* a resample repeats a unit at most (number of policies) times */
    W.cap = (n + 1) * (c->n_policies + 1);
    W.bx = malloc(W.cap * sizeof *W.bx);
    W.by = malloc(W.cap * sizeof *W.by);
    int *wp = calloc(c->n_policies + 1, sizeof *wp), *wt = calloc(c->n_traces + 1, sizeof *wt);
    if (!W.units || !W.t_first || !W.t_n || !W.pol || !W.pol_of || !W.bx || !W.by || !wp || !wt) {
        st = kvs_fail(KVS_ERR_NOMEM, "calibrate: out of memory");
        goto cleanup;
    }
    /* The units: per trace, the selection's pairs, each class once (its first member in the selection). */
    size_t n_units = 0;
    for (size_t t = 0; t < c->n_traces; t++) {
        const kvs_calibration_trace *tr = &c->traces[t];
        size_t first = n_units;
        for (size_t p = tr->first; p < tr->first + tr->n; p++) {
            if (!kvs_calibration_in_sel(c, s, p)) continue;
            out->n_pairs++;
            int dup = 0;
            for (size_t u = first; u < n_units && !dup; u++) dup = c->pairs[W.units[u]].rep == c->pairs[p].rep;
            if (!dup) W.units[n_units++] = p;
        }
        size_t k = n_units - first;
        out->n_units += k;
        if (k < 3) { /* too few to rank: not one of the traces used */
            n_units = first;
            continue;
        }
        W.t_first[W.n_used] = first;
        W.t_n[W.n_used++] = k;
        if (out->units_min == 0 || k < out->units_min) out->units_min = k;
        if (k > out->units_max) out->units_max = k;
    }
    out->n_traces = W.n_used;
    for (size_t u = 0; u < n_units; u++) {
        size_t pi = c->pairs[W.units[u]].policy, j = 0;
        while (j < W.n_pol && W.pol[j] != pi) j++;
        if (j == W.n_pol) W.pol[W.n_pol++] = pi;
        W.pol_of[u] = j;
    }
    out->n_policies = W.n_pol;
    KVS_TRY(st = sel_seed(c, s, W.units, n_units, seed_extra, &out->seed));
    if (W.n_used == 0) goto cleanup;

    /* the point figures */
    for (int a = 0; a < KVS_CALIB_NX; a++)
        for (int b = 0; b < KVS_CALIB_NY; b++) {
            double sum = 0, lo = INFINITY, hi = -INFINITY;
            size_t k = 0;
            for (size_t t = 0; t < W.n_used; t++) {
                double r;
                KVS_TRY(st = trace_rho(c, &W, t, NULL, a, b, &r));
                if (isnan(r)) continue;
                sum += r;
                k++;
                lo = fmin(lo, r);
                hi = fmax(hi, r);
            }
            out->rho[a][b].n = k;
            if (k) {
                out->rho[a][b].mean = sum / (double)k;
                out->rho_min[a][b] = lo;
                out->rho_max[a][b] = hi;
            }
        }
    if (reps == 0 || W.n_pol < 2) goto cleanup; /* one policy: its level cannot vary, no interval */

    /* the bootstrap: policies, then traces, drawn with replacement per resample; the nine cells share the draws */
    vals = malloc((size_t)reps * KVS_CALIB_NX * KVS_CALIB_NY * sizeof *vals);
    if (!vals) {
        st = kvs_fail(KVS_ERR_NOMEM, "calibrate: out of memory");
        goto cleanup;
    }
    kvs_rng g;
    kvs_rng_seed(&g, out->seed, 0x63616c6962 /* "calib" */);
    for (int r = 0; r < reps; r++) {
        memset(wp, 0, W.n_pol * sizeof *wp);
        memset(wt, 0, W.n_used * sizeof *wt);
        for (size_t i = 0; i < W.n_pol; i++) wp[((uint64_t)kvs_rng_u32(&g) * (uint64_t)W.n_pol) >> 32]++;
        for (size_t i = 0; i < W.n_used; i++) wt[((uint64_t)kvs_rng_u32(&g) * (uint64_t)W.n_used) >> 32]++;
        for (int a = 0; a < KVS_CALIB_NX; a++)
            for (int b = 0; b < KVS_CALIB_NY; b++) {
                double sum = 0;
                int k = 0;
                for (size_t t = 0; t < W.n_used; t++) {
                    if (!wt[t]) continue;
                    double rho;
                    KVS_TRY(st = trace_rho(c, &W, t, wp, a, b, &rho));
                    if (isnan(rho)) continue;
                    sum += wt[t] * rho;
                    k += wt[t];
                }
                if (k) vals[(size_t)(a * KVS_CALIB_NY + b) * (size_t)reps + (size_t)out->n_boot[a][b]++] = sum / k;
            }
    }
    for (int a = 0; a < KVS_CALIB_NX; a++)
        for (int b = 0; b < KVS_CALIB_NY; b++) {
            int m = out->n_boot[a][b];
            if (!m) continue;
            double *v = vals + (size_t)(a * KVS_CALIB_NY + b) * (size_t)reps;
            qsort(v, (size_t)m, sizeof *v, cmp_double);
            double q = (1.0 - level) / 2.0;
            out->rho[a][b].lo = kvs_quantile_sorted(v, (size_t)m, q);
            out->rho[a][b].hi = kvs_quantile_sorted(v, (size_t)m, 1.0 - q);
        }
cleanup:
    free(W.units);
    free(W.t_first);
    free(W.t_n);
    free(W.pol);
    free(W.pol_of);
    free(W.bx);
    free(W.by);
    free(wp);
    free(wt);
    free(vals);
    return st;
}
