/* compare.c — policies at an equal cost (POLICY_SPEC.md §1.5 budget-matching modes): the series of the runs of a
 * results database and their values interpolated in log(x) at X. The method is documented in results/compare.h;
 * `kvsim compare` (cli/cmd_compare.c) prints it and `kvsim report` (plots/report.c) tabulates it.
 */
#include "compare.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const match_names[KVS_COMPARE_N_MATCH] = {"mem", "traffic", "tokens"};
static const char *const match_x[KVS_COMPARE_N_MATCH] = {"storage_bytes_mean", "traffic_bytes_mean", "budget_tokens"};
static const char *const status_names[] = {"interpolated", "exact", "out_of_range", "no_x"};

struct kvs_compare {
    kvs_compare_match match;
    double at;
    kvs_compare_column *cols;
    int n_cols;
    kvs_compare_series *ss;
    size_t n_ss;
};

const char *kvs_compare_match_name(kvs_compare_match m) {
    return (unsigned)m < KVS_COMPARE_N_MATCH ? match_names[m] : "?";
}

const char *kvs_compare_match_x(kvs_compare_match m) { return (unsigned)m < KVS_COMPARE_N_MATCH ? match_x[m] : "?"; }

kvs_status kvs_compare_match_parse(const char *s, kvs_compare_match *out) {
    for (int m = 0; m < KVS_COMPARE_N_MATCH; m++)
        if (s && !strcmp(s, match_names[m])) {
            *out = (kvs_compare_match)m;
            return KVS_OK;
        }
    return kvs_fail(KVS_ERR_INVALID_ARG, "--match: '%s' is not mem, traffic or tokens", s ? s : "");
}

const char *kvs_compare_status_name(kvs_compare_status s) {
    return (unsigned)s <= KVS_COMPARE_NO_X ? status_names[s] : "?";
}

kvs_status kvs_compare_column_parse(const char *name, kvs_compare_column *out) {
    size_t len = strlen(name);
    if (len == 0 || len >= sizeof out->name)
        return kvs_fail(KVS_ERR_INVALID_ARG, "bad metric '%s' (an empty or overlong name)", name);
    memcpy(out->name, name, len + 1);
    if (kvs_results_column_parse(out->name, &out->m, &out->s) != KVS_OK)
        return kvs_fail(KVS_ERR_INVALID_ARG, "unknown metric '%s' (expected <metric>_<stat>, e.g. out_err_p95; see "
                                             "sim/metrics.h)",
                        name);
    if (out->s == KVS_STAT_N)
        return kvs_fail(KVS_ERR_INVALID_ARG, "'%s' is a sample count, not a value to compare", name);
    return KVS_OK;
}

static int same_series(const kvs_results_run_row *a, const kvs_results_run_row *b) {
    return !strcmp(a->policy, b->policy) && !strcmp(a->params, b->params) && a->trace_id == b->trace_id &&
           !strcmp(a->measure, b->measure);
}

static double run_x(const kvs_results_run_row *w, kvs_compare_match mode) {
    if (mode == KVS_COMPARE_TOKENS) return (double)w->budget_tokens;
    return kvs_results_stat_value(mode == KVS_COMPARE_MEM ? &w->agg.storage_bytes : &w->agg.traffic_bytes,
                                  KVS_STAT_MEAN);
}

/* Adds run w's point to s (summed into an existing point of the same x; evaluate() divides). */
static kvs_status add_point(kvs_compare_series *s, size_t *cap, const kvs_results_run_row *w, double x,
                            const kvs_compare_column *cols, int n_cols) {
    kvs_compare_point *p = NULL;
    for (size_t i = 0; i < s->n; i++)
        if (s->pts[i].x == x) p = &s->pts[i];
    if (p) {
        for (int c = 0; c < n_cols; c++) p->v[c] += kvs_results_stat_value(&w->agg.m[cols[c].m], cols[c].s);
        p->n_runs++;
        return KVS_OK;
    }
    if (s->n == *cap) {
        size_t nc = *cap ? 2 * *cap : 8;
        kvs_compare_point *np = realloc(s->pts, nc * sizeof *np);
        if (!np) return kvs_fail(KVS_ERR_NOMEM, "compare: out of memory");
        s->pts = np;
        *cap = nc;
    }
    p = &s->pts[s->n];
    if (!(p->v = malloc((size_t)n_cols * sizeof *p->v))) return kvs_fail(KVS_ERR_NOMEM, "compare: out of memory");
    s->n++;
    p->x = x;
    p->run_id = w->id;
    p->n_runs = 1;
    for (int c = 0; c < n_cols; c++) p->v[c] = kvs_results_stat_value(&w->agg.m[cols[c].m], cols[c].s);
    return KVS_OK;
}

/* Means of the averaged points, points sorted by x, and the values at X. */
static void evaluate(kvs_compare_series *s, double X, kvs_compare_match mode, const kvs_compare_column *cols,
                     int n_cols) {
    for (size_t i = 0; i < s->n; i++)
        for (int c = 0; c < n_cols; c++) s->pts[i].v[c] /= (double)s->pts[i].n_runs;
    for (size_t i = 1; i < s->n; i++)
        for (size_t j = i; j > 0 && s->pts[j - 1].x > s->pts[j].x; j--) {
            kvs_compare_point tmp = s->pts[j];
            s->pts[j] = s->pts[j - 1];
            s->pts[j - 1] = tmp;
        }
    for (int c = 0; c < n_cols; c++) s->val[c] = NAN;
    if (s->n == 0) {
        s->status = KVS_COMPARE_NO_X;
        return;
    }
    if (X < s->pts[0].x || X > s->pts[s->n - 1].x) {
        s->status = KVS_COMPARE_OUT_OF_RANGE;
        return;
    }
    size_t i = 0;
    while (i + 1 < s->n && s->pts[i + 1].x <= X) i++;
    if (s->pts[i].x == X) {
        s->status = KVS_COMPARE_EXACT;
        s->lo = s->hi = i;
        s->t = 0;
        for (int c = 0; c < n_cols; c++) s->val[c] = s->pts[i].v[c];
    } else {
        s->status = KVS_COMPARE_INTERPOLATED;
        s->lo = i;
        s->hi = i + 1;
        const kvs_compare_point *a = &s->pts[i], *b = &s->pts[i + 1];
        s->t = (log(X) - log(a->x)) / (log(b->x) - log(a->x));
        for (int c = 0; c < n_cols; c++) s->val[c] = a->v[c] + s->t * (b->v[c] - a->v[c]);
    }
    /* The matched quantity is X by definition of the match. */
    for (int c = 0; c < n_cols; c++)
        if (cols[c].s == KVS_STAT_MEAN && ((mode == KVS_COMPARE_MEM && cols[c].m == KVS_M_STORAGE) ||
                                           (mode == KVS_COMPARE_TRAFFIC && cols[c].m == KVS_M_TRAFFIC)))
            s->val[c] = X;
}

/* The sort key of a series: its first column, negated when higher is better (NaN: not available). */
static double sort_key(const kvs_compare_series *s, const kvs_compare_column *first) {
    return kvs_metric_table[first->m].higher_is_better ? -s->val[0] : s->val[0];
}

/* qsort has no context argument: the first column's direction is carried by the key computed before sorting. */
typedef struct {
    kvs_compare_series s;
    size_t cap;
    double key;
} keyed_series;

static int cmp_keyed(const void *pa, const void *pb) {
    const keyed_series *ka = pa, *kb = pb;
    const kvs_compare_series *a = &ka->s, *b = &kb->s;
    int ua = a->status <= KVS_COMPARE_EXACT, ub = b->status <= KVS_COMPARE_EXACT;
    if (ua != ub) return ua ? -1 : 1;
    if (ua) {
        int na = isnan(ka->key), nb = isnan(kb->key);
        if (na != nb) return na ? 1 : -1;
        if (!na && ka->key != kb->key) return ka->key < kb->key ? -1 : 1;
    }
    if (a->status != b->status) return a->status < b->status ? -1 : 1;
    return strcmp(a->label, b->label);
}

void kvs_compare_free(kvs_compare *c) {
    if (!c) return;
    for (size_t k = 0; c->ss && k < c->n_ss; k++) {
        for (size_t i = 0; i < c->ss[k].n; i++) free(c->ss[k].pts[i].v);
        free(c->ss[k].pts);
        free(c->ss[k].val);
    }
    free(c->ss);
    free(c->cols);
    free(c);
}

kvs_status kvs_compare_create(const kvs_results_run_row *rows, int64_t n_rows, kvs_compare_match match, double X,
                              const kvs_compare_column *cols, int n_cols, kvs_compare **out) {
    *out = NULL;
    if ((unsigned)match >= KVS_COMPARE_N_MATCH) return kvs_fail(KVS_ERR_INVALID_ARG, "compare: bad match mode");
    if (!(X > 0) || !isfinite(X)) return kvs_fail(KVS_ERR_INVALID_ARG, "compare: X must be finite and positive");
    if (n_cols < 1 || !cols) return kvs_fail(KVS_ERR_INVALID_ARG, "compare: no column to compare");
    if (n_rows < 0 || (n_rows > 0 && !rows)) return kvs_fail(KVS_ERR_INVALID_ARG, "compare: bad rows");
    for (int c = 0; c < n_cols; c++)
        if (cols[c].s == KVS_STAT_N)
            return kvs_fail(KVS_ERR_INVALID_ARG, "'%s' is a sample count, not a value to compare", cols[c].name);
    kvs_status st = KVS_OK;
    keyed_series *ks = NULL;
    size_t n_ks = 0;
    kvs_compare *c = calloc(1, sizeof *c);
    if (!c) return kvs_fail(KVS_ERR_NOMEM, "compare: out of memory");
    c->match = match;
    c->at = X;
    c->n_cols = n_cols;
    if (!(c->cols = malloc((size_t)n_cols * sizeof *c->cols)) ||
        !(ks = calloc(n_rows > 0 ? (size_t)n_rows : 1, sizeof *ks))) {
        st = kvs_fail(KVS_ERR_NOMEM, "compare: out of memory");
        goto cleanup;
    }
    memcpy(c->cols, cols, (size_t)n_cols * sizeof *cols);
    for (int64_t r = 0; r < n_rows; r++) {
        const kvs_results_run_row *w = &rows[r];
        if (!w->status || strcmp(w->status, "complete")) continue;
        keyed_series *k = NULL;
        for (size_t j = 0; j < n_ks && !k; j++)
            if (same_series(ks[j].s.rep, w)) k = &ks[j];
        if (!k) {
            k = &ks[n_ks++];
            k->s.rep = w;
            if (!(k->s.val = malloc((size_t)n_cols * sizeof *k->s.val))) {
                st = kvs_fail(KVS_ERR_NOMEM, "compare: out of memory");
                goto cleanup;
            }
        }
        if (w->is_oracle) k->s.is_oracle = 1;
        if (w->budget_scope && !strcmp(w->budget_scope, "prompt")) k->s.prompt_only = 1;
        double x = w->has_agg ? run_x(w, match) : NAN;
        if (isfinite(x) && x > 0) KVS_TRY(st = add_point(&k->s, &k->cap, w, x, cols, n_cols));
    }
    for (size_t j = 0; j < n_ks; j++) {
        kvs_compare_series *s = &ks[j].s;
        evaluate(s, X, match, cols, n_cols);
        snprintf(s->label, sizeof s->label, "%s%s%s%s%s", s->rep->policy, s->rep->params[0] ? " (" : "",
                 s->rep->params, s->rep->params[0] ? ")" : "", s->is_oracle ? " (oracle)" : "");
        ks[j].key = sort_key(s, &cols[0]);
    }
    if (n_ks) qsort(ks, n_ks, sizeof *ks, cmp_keyed);
    if (!(c->ss = calloc(n_ks ? n_ks : 1, sizeof *c->ss))) {
        st = kvs_fail(KVS_ERR_NOMEM, "compare: out of memory");
        goto cleanup;
    }
    for (size_t j = 0; j < n_ks; j++) c->ss[j] = ks[j].s;
    c->n_ss = n_ks;
    n_ks = 0; /* owned by c now */
cleanup:
    for (size_t j = 0; ks && j < n_ks; j++) {
        for (size_t i = 0; i < ks[j].s.n; i++) free(ks[j].s.pts[i].v);
        free(ks[j].s.pts);
        free(ks[j].s.val);
    }
    free(ks);
    if (st != KVS_OK) {
        kvs_compare_free(c);
        return st;
    }
    *out = c;
    return KVS_OK;
}

size_t kvs_compare_n_series(const kvs_compare *c) { return c->n_ss; }
const kvs_compare_series *kvs_compare_series_at(const kvs_compare *c, size_t i) { return &c->ss[i]; }
kvs_compare_match kvs_compare_match_of(const kvs_compare *c) { return c->match; }
double kvs_compare_at(const kvs_compare *c) { return c->at; }
int kvs_compare_n_columns(const kvs_compare *c) { return c->n_cols; }
const kvs_compare_column *kvs_compare_column_at(const kvs_compare *c, int i) { return &c->cols[i]; }
