/* compare.c — policies at an equal cost (POLICY_SPEC.md §1.5 budget-matching modes): the series of the runs of a
 * results database and their values interpolated in log(x) at X. The method is documented in results/compare.h;
 * `kvsim compare` (cli/cmd_compare.c) prints it and `kvsim report` (plots/report.c) tabulates it.
 */
#include "compare.h"
#include "../common/kvs_rng.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const match_names[KVS_COMPARE_N_MATCH] = {"mem", "traffic", "tokens"};
static const char *const match_x[KVS_COMPARE_N_MATCH] = {"storage_bytes_mean", "traffic_bytes_mean", "budget_tokens"};
static const char *const match_x_max[KVS_COMPARE_N_MATCH] = {"storage_bytes_max", "traffic_bytes_max", "budget_tokens"};
static const char *const status_names[] = {"interpolated", "exact", "out_of_range", "no_x", "gap"};

struct kvs_compare {
    kvs_compare_match match;
    double at, max_ratio;
    kvs_stat_kind x_stat;
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
    return (unsigned)s <= KVS_COMPARE_GAP ? status_names[s] : "?";
}

int kvs_compare_run_prompt_only(const kvs_results_run_row *w) {
    return w->budget_scope && !strcmp(w->budget_scope, "prompt");
}

int kvs_compare_run_noted(const kvs_results_run_row *w) { return w->notes && w->notes[0]; }

void kvs_compare_run_flags(const kvs_results_run_row *w, char out[KVS_COMPARE_FLAGS_CAP]) {
    int k = 0;
    if (w->is_oracle) out[k++] = 'O';
    if (kvs_compare_run_prompt_only(w)) out[k++] = 'P';
    if (!w->status || strcmp(w->status, "complete")) out[k++] = 'F';
    if (kvs_compare_run_noted(w)) out[k++] = 'N';
    out[k] = '\0';
}

void kvs_compare_series_flags(const kvs_compare_series *s, char out[KVS_COMPARE_FLAGS_CAP]) {
    int k = 0;
    if (s->is_oracle) out[k++] = 'O';
    if (s->prompt_only) out[k++] = 'P';
    if (s->degenerate) out[k++] = 'N';
    out[k] = '\0';
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

/* The run's codec spec, "" for K/V as captured: part of every series' and group's key. */
static const char *nz_codec(const kvs_results_run_row *w) { return w->codec ? w->codec : ""; }

/* The trace a run measured: its content hash when recorded (one file through any path spelling), else its row. */
static int same_trace(const kvs_results_run_row *a, const kvs_results_run_row *b) {
    if (a->trace_sha256 && b->trace_sha256) return !strcmp(a->trace_sha256, b->trace_sha256);
    if (a->trace_sha256 || b->trace_sha256) return 0;
    return a->trace_id == b->trace_id;
}

/* The run's bytes per K/V and auxiliary element, -1 each when runs.options does not record them. */
static void run_bytes(const kvs_results_run_row *w, int *kv, int *aux) {
    if (!kvs_results_run_bytes(w, kv, aux)) *kv = *aux = -1;
}

/* Same configuration on the same positions of the same trace: the series key without the bytes. */
static int same_but_bytes(const kvs_results_run_row *a, const kvs_results_run_row *b) {
    return !strcmp(a->policy, b->policy) && !strcmp(a->params, b->params) && same_trace(a, b) &&
           !strcmp(a->measure, b->measure) && !strcmp(nz_codec(a), nz_codec(b)) && a->page == b->page &&
           !strcmp(a->page_score, b->page_score);
}

static double run_x(const kvs_results_run_row *w, kvs_compare_match mode, kvs_stat_kind x_stat) {
    if (mode == KVS_COMPARE_TOKENS) return (double)w->budget_tokens;
    return kvs_results_stat_value(mode == KVS_COMPARE_MEM ? &w->agg.storage_bytes : &w->agg.traffic_bytes, x_stat);
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
        p->n_noted += kvs_compare_run_noted(w);
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
    p->budget_tokens = w->budget_tokens;
    p->n_noted = kvs_compare_run_noted(w);
    for (int c = 0; c < n_cols; c++) p->v[c] = kvs_results_stat_value(&w->agg.m[cols[c].m], cols[c].s);
    return KVS_OK;
}

/* Means of the averaged points, points sorted by x, and the values at X (the method of compare.h). */
static void evaluate(kvs_compare_series *s, const kvs_compare *cmp) {
    const double X = cmp->at;
    const int n_cols = cmp->n_cols;
    const kvs_compare_column *cols = cmp->cols;
    for (size_t i = 0; i < s->n; i++)
        for (int c = 0; c < n_cols; c++) s->pts[i].v[c] /= (double)s->pts[i].n_runs;
    for (size_t i = 1; i < s->n; i++)
        for (size_t j = i; j > 0 && s->pts[j - 1].x > s->pts[j].x; j--) {
            kvs_compare_point tmp = s->pts[j];
            s->pts[j] = s->pts[j - 1];
            s->pts[j - 1] = tmp;
        }
    for (int c = 0; c < n_cols; c++) s->val[c] = NAN;
    s->t = NAN;
    for (size_t i = 0; i < s->n; i++) s->degenerate |= s->pts[i].n_noted > 0; /* no bracket: any run */
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
        s->degenerate = s->pts[i].n_noted > 0;
    } else {
        const kvs_compare_point *a = &s->pts[i], *b = &s->pts[i + 1];
        s->lo = i;
        s->hi = i + 1;
        s->degenerate = a->n_noted > 0 || b->n_noted > 0;
        /* b->x / a->x rather than a log difference: the ratio is what the rule states */
        if (b->x / a->x > cmp->max_ratio) {
            s->status = KVS_COMPARE_GAP;
            return;
        }
        s->status = KVS_COMPARE_INTERPOLATED;
        s->t = (log(X) - log(a->x)) / (log(b->x) - log(a->x));
        for (int c = 0; c < n_cols; c++) s->val[c] = a->v[c] + s->t * (b->v[c] - a->v[c]);
    }
    /* The matched quantity is X by definition of the match. */
    kvs_metric matched = cmp->match == KVS_COMPARE_MEM ? KVS_M_STORAGE : KVS_M_TRAFFIC;
    if (cmp->match != KVS_COMPARE_TOKENS)
        for (int c = 0; c < n_cols; c++)
            if (cols[c].m == matched && cols[c].s == cmp->x_stat) s->val[c] = X;
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

/* The order of the statuses after the usable ones: a gap (the series reaches X on both sides) before a series
 * that does not reach X at all. */
static int status_rank(kvs_compare_status st) {
    return st <= KVS_COMPARE_EXACT ? 0 : st == KVS_COMPARE_GAP ? 1 : st == KVS_COMPARE_OUT_OF_RANGE ? 2 : 3;
}

static int cmp_keyed(const void *pa, const void *pb) {
    const keyed_series *ka = pa, *kb = pb;
    const kvs_compare_series *a = &ka->s, *b = &kb->s;
    int ra = status_rank(a->status), rb = status_rank(b->status);
    if (ra != rb) return ra < rb ? -1 : 1;
    if (ra == 0) {
        int na = isnan(ka->key), nb = isnan(kb->key);
        if (na != nb) return na ? 1 : -1;
        if (!na && ka->key != kb->key) return ka->key < kb->key ? -1 : 1;
    }
    int l = strcmp(a->label, b->label);
    if (l) return l;
    l = strcmp(a->trace_label, b->trace_label);
    if (l) return l;
    return strcmp(a->rep->measure, b->rep->measure);
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

/* Labels once every series is known: the bytes where two series differ only by them, a trace label made unique. */
static void label_series(keyed_series *ks, size_t n) {
    for (size_t j = 0; j < n; j++) {
        kvs_compare_series *s = &ks[j].s;
        for (size_t k = 0; k < n && !s->bytes_in_label; k++)
            s->bytes_in_label = k != j && same_but_bytes(s->rep, ks[k].s.rep);
        char bytes[64] = "";
        if (s->bytes_in_label && s->kv_bytes >= 0)
            snprintf(bytes, sizeof bytes, " [kv_bytes=%d,aux_bytes=%d]", s->kv_bytes, s->aux_bytes);
        else if (s->bytes_in_label)
            snprintf(bytes, sizeof bytes, " [bytes not recorded]");
        kvs_results_run_label(s->rep, s->label, sizeof s->label);
        size_t used = strlen(s->label);
        snprintf(s->label + used, sizeof s->label - used, "%s%s", bytes, s->is_oracle ? " (oracle)" : "");
        kvs_results_trace_label(s->rep, s->trace_label, sizeof s->trace_label);
    }
    /* two different traces that read the same (base names without a recorded hash): the traces row tells them apart */
    char(*plain)[160] = malloc((n ? n : 1) * sizeof *plain);
    if (!plain) return; /* labels stay as read: still correct, only possibly ambiguous */
    for (size_t j = 0; j < n; j++) memcpy(plain[j], ks[j].s.trace_label, sizeof plain[j]);
    for (size_t j = 0; j < n; j++) {
        kvs_compare_series *s = &ks[j].s;
        int clash = 0;
        for (size_t k = 0; k < n && !clash; k++)
            clash = !strcmp(plain[j], plain[k]) && !same_trace(s->rep, ks[k].s.rep);
        if (clash)
            snprintf(s->trace_label, sizeof s->trace_label, "%.120s (trace %" PRId64 ")", plain[j], s->rep->trace_id);
    }
    free(plain);
}

kvs_status kvs_compare_create_opts(const kvs_results_run_row *rows, int64_t n_rows, const kvs_compare_opts *o,
                                   const kvs_compare_column *cols, int n_cols, kvs_compare **out) {
    *out = NULL;
    if (!o) return kvs_fail(KVS_ERR_INVALID_ARG, "compare: no options");
    kvs_compare_match match = o->match;
    double X = o->at, ratio = o->max_ratio == 0 ? KVS_COMPARE_MAX_RATIO : o->max_ratio;
    kvs_stat_kind xs = o->x_stat == KVS_STAT_N ? KVS_STAT_MEAN : o->x_stat;
    if ((unsigned)match >= KVS_COMPARE_N_MATCH) return kvs_fail(KVS_ERR_INVALID_ARG, "compare: bad match mode");
    if (!(X > 0) || !isfinite(X)) return kvs_fail(KVS_ERR_INVALID_ARG, "compare: X must be finite and positive");
    if (xs != KVS_STAT_MEAN && xs != KVS_STAT_MAX)
        return kvs_fail(KVS_ERR_INVALID_ARG, "compare: x statistic must be mean or max");
    if (xs == KVS_STAT_MAX && match == KVS_COMPARE_TOKENS)
        return kvs_fail(KVS_ERR_INVALID_ARG, "compare: --match tokens has no x statistic (a budget is one number)");
    if (!(ratio >= 1)) return kvs_fail(KVS_ERR_INVALID_ARG, "compare: the largest interpolated x ratio must be >= 1");
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
    c->x_stat = xs;
    c->max_ratio = ratio;
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
        int kv, aux;
        run_bytes(w, &kv, &aux);
        keyed_series *k = NULL;
        for (size_t j = 0; j < n_ks && !k; j++)
            if (same_but_bytes(ks[j].s.rep, w) && ks[j].s.kv_bytes == kv && ks[j].s.aux_bytes == aux) k = &ks[j];
        if (!k) {
            k = &ks[n_ks++];
            k->s.rep = w;
            k->s.kv_bytes = kv;
            k->s.aux_bytes = aux;
            if (!(k->s.val = malloc((size_t)n_cols * sizeof *k->s.val))) {
                st = kvs_fail(KVS_ERR_NOMEM, "compare: out of memory");
                goto cleanup;
            }
        }
        if (w->is_oracle) k->s.is_oracle = 1;
        if (kvs_compare_run_prompt_only(w)) k->s.prompt_only = 1;
        double x = w->has_agg ? run_x(w, match, xs) : NAN;
        if (isfinite(x) && x > 0) KVS_TRY(st = add_point(&k->s, &k->cap, w, x, cols, n_cols));
    }
    for (size_t j = 0; j < n_ks; j++) {
        evaluate(&ks[j].s, c);
        ks[j].key = sort_key(&ks[j].s, &cols[0]);
    }
    label_series(ks, n_ks);
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

kvs_status kvs_compare_create(const kvs_results_run_row *rows, int64_t n_rows, kvs_compare_match match, double X,
                              const kvs_compare_column *cols, int n_cols, kvs_compare **out) {
    kvs_compare_opts o = {.match = match, .at = X, .x_stat = KVS_STAT_MEAN, .max_ratio = INFINITY};
    return kvs_compare_create_opts(rows, n_rows, &o, cols, n_cols, out);
}

size_t kvs_compare_n_series(const kvs_compare *c) { return c->n_ss; }
const kvs_compare_series *kvs_compare_series_at(const kvs_compare *c, size_t i) { return &c->ss[i]; }
kvs_compare_match kvs_compare_match_of(const kvs_compare *c) { return c->match; }
double kvs_compare_at(const kvs_compare *c) { return c->at; }
kvs_stat_kind kvs_compare_x_stat(const kvs_compare *c) { return c->x_stat; }
const char *kvs_compare_x_name(const kvs_compare *c) {
    return c->x_stat == KVS_STAT_MAX ? match_x_max[c->match] : match_x[c->match];
}
double kvs_compare_max_ratio(const kvs_compare *c) { return c->max_ratio; }
int kvs_compare_n_columns(const kvs_compare *c) { return c->n_cols; }
const kvs_compare_column *kvs_compare_column_at(const kvs_compare *c, int i) { return &c->cols[i]; }

/* ------------------------------------------------------------------------------------------------
 * Across traces (compare.h): groups of series over the traces of a (model, measure) set
 * ---------------------------------------------------------------------------------------------- */

struct kvs_compare_across {
    const kvs_compare *c;
    kvs_compare_set *sets;
    size_t n_sets;
    kvs_compare_group *groups;
    size_t n_groups;
};

static const char *nz(const char *s) { return s ? s : ""; }

void kvs_compare_trace_identity(const kvs_results_run_row *w, char out[KVS_COMPARE_TRACE_ID_CAP]) {
    if (w->trace_sha256) snprintf(out, KVS_COMPARE_TRACE_ID_CAP, "%s", w->trace_sha256);
    else snprintf(out, KVS_COMPARE_TRACE_ID_CAP, "trace#%" PRId64, w->trace_id);
}

static int same_set(const kvs_compare_series *a, const kvs_compare_series *b) {
    return !strcmp(nz(a->rep->model), nz(b->rep->model)) && !strcmp(a->rep->measure, b->rep->measure);
}

/* One configuration: the series key without the trace, the model in its place. */
static int same_group(const kvs_compare_series *a, const kvs_compare_series *b) {
    return same_set(a, b) && !strcmp(a->rep->policy, b->rep->policy) && !strcmp(a->rep->params, b->rep->params) &&
           a->kv_bytes == b->kv_bytes && a->aux_bytes == b->aux_bytes && !strcmp(nz_codec(a->rep), nz_codec(b->rep)) &&
           a->rep->page == b->rep->page && !strcmp(a->rep->page_score, b->rep->page_score);
}

/* FNV-1a, 64 bits, streamed over the pieces of an identity string (common/kvs_rng.h). */
#define FNV_BASIS KVS_FNV1A64_BASIS
#define fnv_str kvs_fnv1a64

static uint64_t fnv_fmt(uint64_t h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static uint64_t fnv_fmt(uint64_t h, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof buf) { /* a long params string: format it whole */
        char *big = malloc((size_t)n + 1);
        if (big) {
            va_start(ap, fmt);
            vsnprintf(big, (size_t)n + 1, fmt, ap);
            va_end(ap);
            h = fnv_str(h, big);
            free(big);
            return h;
        }
    }
    return fnv_str(h, buf);
}

static uint64_t fnv_group_key(uint64_t h, const kvs_compare_group *g) {
    const kvs_compare_series *s = g->rep;
    h = fnv_str(h, s->rep->policy);
    h = fnv_str(h, "|");
    h = fnv_str(h, s->rep->params);
    h = fnv_fmt(h, "|%s|%d|%d|%s", s->rep->measure, s->kv_bytes, s->aux_bytes, nz(s->rep->model));
    /* a codec joins the key only when set: the groups of before keep their seeds */
    if (s->rep->codec && s->rep->codec[0]) h = fnv_fmt(h, "|codec=%s", s->rep->codec);
    /* so does a page size */
    if (s->rep->page > 0) h = fnv_fmt(h, "|page=%lld", (long long)s->rep->page);
    /* and a page score rule other than the count rule */
    return s->rep->page_score[0] ? fnv_fmt(h, "|page_score=%s", s->rep->page_score) : h;
}

/* The head of every seed string: "<match>|<x name>|<X>|<column>|". */
static uint64_t fnv_head(const kvs_compare *c, int col) {
    return fnv_fmt(FNV_BASIS, "%s|%s|%.17g|%s|", kvs_compare_match_name(c->match), kvs_compare_x_name(c), c->at,
                   c->cols[col].name);
}

static int cmp_trace_ids(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }

static int value_usable(const kvs_compare_series *s, int col) {
    return s && s->status <= KVS_COMPARE_EXACT && isfinite(s->val[col]);
}

/* The mean and interval of column col of g over its set's traces (in the set's order), seeded from its identity. */
static kvs_status group_interval(const kvs_compare_across *a, kvs_compare_group *g, int col, double *scratch) {
    const kvs_compare_set *set = &a->sets[g->set];
    uint64_t h = fnv_group_key(fnv_head(a->c, col), g);
    size_t n = 0;
    h = fnv_str(h, "|");
    for (size_t t = 0; t < set->n_traces; t++) {
        if (!value_usable(g->by_trace[t], col)) continue;
        if (n) h = fnv_str(h, ",");
        h = fnv_str(h, set->trace_id[t]);
        scratch[n++] = g->by_trace[t]->val[col];
    }
    g->seed[col] = h;
    if (n == 0) {
        g->col[col] = (kvs_interval){.mean = NAN, .lo = NAN, .hi = NAN, .n = 0, .level = 0.95,
                                     .reps = KVS_BOOTSTRAP_REPS};
        return KVS_OK;
    }
    return kvs_bootstrap_mean(scratch, n, KVS_BOOTSTRAP_REPS, 0.95, h, &g->col[col]);
}

kvs_status kvs_compare_across_diff(const kvs_compare_across *a, size_t ga, size_t gb, int col, kvs_compare_diff *out) {
    if (ga >= a->n_groups || gb >= a->n_groups || col < 0 || col >= a->c->n_cols ||
        a->groups[ga].set != a->groups[gb].set)
        return kvs_fail(KVS_ERR_INVALID_ARG, "compare: a paired difference needs two groups of one set");
    const kvs_compare_group *A = &a->groups[ga], *B = &a->groups[gb];
    const kvs_compare_set *set = &a->sets[A->set];
    double *x = malloc((set->n_traces ? set->n_traces : 1) * 2 * sizeof *x);
    if (!x) return kvs_fail(KVS_ERR_NOMEM, "compare: out of memory");
    double *y = x + (set->n_traces ? set->n_traces : 1);
    uint64_t h = fnv_group_key(fnv_head(a->c, col), A);
    h = fnv_str(h, "|-|");
    h = fnv_group_key(h, B);
    h = fnv_str(h, "|");
    size_t n = 0;
    for (size_t t = 0; t < set->n_traces; t++) {
        if (!value_usable(A->by_trace[t], col) || !value_usable(B->by_trace[t], col)) continue;
        if (n) h = fnv_str(h, ",");
        h = fnv_str(h, set->trace_id[t]);
        x[n] = A->by_trace[t]->val[col];
        y[n++] = B->by_trace[t]->val[col];
    }
    *out = (kvs_compare_diff){.a = ga, .b = gb, .col = col, .seed = h};
    kvs_status st = KVS_OK;
    if (n == 0)
        out->d = (kvs_interval){.mean = NAN, .lo = NAN, .hi = NAN, .n = 0, .level = 0.95, .reps = KVS_BOOTSTRAP_REPS};
    else st = kvs_bootstrap_mean_diff(x, y, n, KVS_BOOTSTRAP_REPS, 0.95, h, &out->d);
    free(x);
    if (st == KVS_OK) out->resolved = kvs_interval_resolved(&out->d);
    return st;
}

void kvs_compare_across_free(kvs_compare_across *a) {
    if (!a) return;
    for (size_t i = 0; a->sets && i < a->n_sets; i++) {
        free(a->sets[i].trace_id);
        free(a->sets[i].trace_label);
    }
    for (size_t i = 0; a->groups && i < a->n_groups; i++) {
        free(a->groups[i].by_trace);
        free(a->groups[i].col);
        free(a->groups[i].seed);
    }
    free(a->sets);
    free(a->groups);
    free(a);
}

/* The order of the groups of a set: by the first column's mean, best first; no value last; then by label. qsort
 * has no context argument: the first column's direction is carried by a key computed before sorting (as for
 * keyed_series). */
typedef struct {
    kvs_compare_group g;
    double key; /* the first column's mean, negated when higher is better; NaN: no value */
} keyed_group;

static int cmp_groups(const void *pa, const void *pb) {
    const keyed_group *ka = pa, *kb = pb;
    if (ka->g.set != kb->g.set) return ka->g.set < kb->g.set ? -1 : 1;
    int na = isnan(ka->key), nb = isnan(kb->key);
    if (na != nb) return na ? 1 : -1;
    if (!na && ka->key != kb->key) return ka->key < kb->key ? -1 : 1;
    return strcmp(ka->g.label, kb->g.label);
}

static int cmp_sets(const void *pa, const void *pb) {
    const kvs_compare_set *a = pa, *b = pb;
    int m = strcmp(nz(a->model), nz(b->model));
    return m ? m : strcmp(a->measure, b->measure);
}

static size_t find_set(const kvs_compare_across *a, const kvs_compare_series *s) {
    size_t k = 0;
    while (k < a->n_sets && (strcmp(a->sets[k].model, nz(s->rep->model)) || strcmp(a->sets[k].measure, s->rep->measure)))
        k++;
    return k;
}

/* Swaps traces i and j of a set (identity and label). */
static void swap_traces(kvs_compare_set *set, size_t i, size_t j) {
    char ti[KVS_COMPARE_TRACE_ID_CAP], tl[160];
    memcpy(ti, set->trace_id[i], sizeof ti);
    memcpy(set->trace_id[i], set->trace_id[j], sizeof ti);
    memcpy(set->trace_id[j], ti, sizeof ti);
    memcpy(tl, set->trace_label[i], sizeof tl);
    memcpy(set->trace_label[i], set->trace_label[j], sizeof tl);
    memcpy(set->trace_label[j], tl, sizeof tl);
}

kvs_status kvs_compare_across_create(const kvs_compare *c, kvs_compare_across **out) {
    *out = NULL;
    kvs_status st = KVS_OK;
    size_t n = c->n_ss, cap = n ? n : 1; /* at most one set, group or trace per series */
    double *scratch = NULL;
    kvs_compare_across *a = calloc(1, sizeof *a);
    if (!a || !(a->sets = calloc(cap, sizeof *a->sets)) || !(a->groups = calloc(cap, sizeof *a->groups)) ||
        !(scratch = malloc(cap * sizeof *scratch))) {
        st = kvs_fail(KVS_ERR_NOMEM, "compare: out of memory");
        goto cleanup;
    }
    a->c = c;
    /* The sets and their traces. */
    for (size_t i = 0; i < n; i++) {
        const kvs_compare_series *s = &c->ss[i];
        size_t k = find_set(a, s);
        kvs_compare_set *set = &a->sets[k];
        if (k == a->n_sets) {
            a->n_sets++;
            set->model = nz(s->rep->model);
            set->measure = s->rep->measure;
            if (!(set->trace_id = calloc(cap, sizeof *set->trace_id)) ||
                !(set->trace_label = calloc(cap, sizeof *set->trace_label))) {
                st = kvs_fail(KVS_ERR_NOMEM, "compare: out of memory");
                goto cleanup;
            }
        }
        char id[KVS_COMPARE_TRACE_ID_CAP];
        kvs_compare_trace_identity(s->rep, id);
        size_t t = 0;
        while (t < set->n_traces && strcmp(set->trace_id[t], id)) t++;
        if (t == set->n_traces) {
            memcpy(set->trace_id[t], id, sizeof id);
            memcpy(set->trace_label[t], s->trace_label, sizeof s->trace_label);
            set->n_traces++;
        }
    }
    /* Sets by (model, measure), the traces of each by identity: the order seeds and outputs follow. */
    if (a->n_sets) qsort(a->sets, a->n_sets, sizeof *a->sets, cmp_sets);
    for (size_t k = 0; k < a->n_sets; k++)
        for (size_t i = 1; i < a->sets[k].n_traces; i++)
            for (size_t j = i; j > 0 && strcmp(a->sets[k].trace_id[j - 1], a->sets[k].trace_id[j]) > 0; j--)
                swap_traces(&a->sets[k], j - 1, j);
    /* The groups: each series joins its configuration's group at its trace's place. */
    for (size_t i = 0; i < n; i++) {
        const kvs_compare_series *s = &c->ss[i];
        size_t k = find_set(a, s), g = 0;
        const kvs_compare_set *set = &a->sets[k];
        while (g < a->n_groups && !same_group(a->groups[g].rep, s)) g++;
        kvs_compare_group *gr = &a->groups[g];
        if (g == a->n_groups) {
            a->n_groups++;
            gr->rep = s;
            gr->label = s->label;
            gr->set = k;
            if (!(gr->by_trace = calloc(set->n_traces, sizeof *gr->by_trace)) ||
                !(gr->col = calloc((size_t)c->n_cols, sizeof *gr->col)) ||
                !(gr->seed = calloc((size_t)c->n_cols, sizeof *gr->seed))) {
                st = kvs_fail(KVS_ERR_NOMEM, "compare: out of memory");
                goto cleanup;
            }
        }
        char id[KVS_COMPARE_TRACE_ID_CAP];
        kvs_compare_trace_identity(s->rep, id);
        const char(*hit)[KVS_COMPARE_TRACE_ID_CAP] =
            bsearch(id, set->trace_id, set->n_traces, sizeof *set->trace_id, cmp_trace_ids);
        if (hit) gr->by_trace[hit - set->trace_id] = s; /* always found: the set holds every trace of its series */
    }
    /* Each group's exclusions, flags and intervals. */
    for (size_t g = 0; g < a->n_groups; g++) {
        kvs_compare_group *gr = &a->groups[g];
        const kvs_compare_set *set = &a->sets[gr->set];
        for (size_t t = 0; t < set->n_traces; t++) {
            const kvs_compare_series *s = gr->by_trace[t];
            if (!s) {
                gr->n_not_run++;
                continue;
            }
            gr->is_oracle |= s->is_oracle;
            gr->prompt_only |= s->prompt_only;
            if (s->status <= KVS_COMPARE_EXACT) gr->n_used++, gr->degenerate |= s->degenerate;
            else if (s->status == KVS_COMPARE_OUT_OF_RANGE) gr->n_out_of_range++;
            else if (s->status == KVS_COMPARE_GAP) gr->n_gap++;
            else gr->n_no_x++;
        }
        for (int col = 0; col < c->n_cols; col++)
            if ((st = group_interval(a, gr, col, scratch)) != KVS_OK) goto cleanup;
    }
    /* Groups by set, then best first; each set's range and best group. */
    keyed_group *kg = malloc(cap * sizeof *kg);
    if (!kg) {
        st = kvs_fail(KVS_ERR_NOMEM, "compare: out of memory");
        goto cleanup;
    }
    for (size_t g = 0; g < a->n_groups; g++) {
        kg[g].g = a->groups[g];
        double m = a->groups[g].col[0].n ? a->groups[g].col[0].mean : NAN;
        kg[g].key = kvs_metric_table[c->cols[0].m].higher_is_better ? -m : m;
    }
    if (a->n_groups) qsort(kg, a->n_groups, sizeof *kg, cmp_groups);
    for (size_t g = 0; g < a->n_groups; g++) a->groups[g] = kg[g].g;
    free(kg);
    for (size_t k = 0; k < a->n_sets; k++) a->sets[k].best = SIZE_MAX;
    for (size_t g = a->n_groups; g-- > 0;) {
        kvs_compare_set *set = &a->sets[a->groups[g].set];
        set->first = g;
        set->n++;
    }
    for (size_t k = 0; k < a->n_sets; k++) {
        kvs_compare_set *set = &a->sets[k];
        size_t any = SIZE_MAX;
        for (size_t g = set->first; g < set->first + set->n && set->best == SIZE_MAX; g++) {
            if (a->groups[g].col[0].n == 0) continue;
            if (any == SIZE_MAX) any = g;
            if (!a->groups[g].is_oracle) set->best = g;
        }
        if (set->best == SIZE_MAX) set->best = any;
    }
cleanup:
    free(scratch);
    if (st != KVS_OK) {
        kvs_compare_across_free(a);
        return st;
    }
    *out = a;
    return KVS_OK;
}

size_t kvs_compare_across_n_sets(const kvs_compare_across *a) { return a->n_sets; }
const kvs_compare_set *kvs_compare_across_set_at(const kvs_compare_across *a, size_t i) { return &a->sets[i]; }
size_t kvs_compare_across_n_groups(const kvs_compare_across *a) { return a->n_groups; }
const kvs_compare_group *kvs_compare_across_group_at(const kvs_compare_across *a, size_t i) { return &a->groups[i]; }

size_t kvs_compare_across_max_traces(const kvs_compare_across *a) {
    size_t m = 0;
    for (size_t k = 0; k < a->n_sets; k++)
        if (a->sets[k].n_traces > m) m = a->sets[k].n_traces;
    return m;
}

void kvs_compare_group_flags(const kvs_compare_group *g, char out[KVS_COMPARE_FLAGS_CAP]) {
    int k = 0;
    if (g->is_oracle) out[k++] = 'O';
    if (g->prompt_only) out[k++] = 'P';
    if (g->degenerate) out[k++] = 'N';
    out[k] = '\0';
}

void kvs_compare_group_excluded(const kvs_compare_across *a, const kvs_compare_group *g, char *buf, size_t cap) {
    static const char *const why[] = {"out of range", "gap", "no x", "not run"};
    const kvs_compare_set *set = &a->sets[g->set];
    size_t len = 0;
    if (cap) buf[0] = '\0';
    for (int r = 0; r < 4; r++) {
        int first = 1;
        for (size_t t = 0; t < set->n_traces && len < cap; t++) {
            const kvs_compare_series *s = g->by_trace[t];
            int hit = r == 3 ? !s
                             : s && s->status == (r == 0   ? KVS_COMPARE_OUT_OF_RANGE
                                                  : r == 1 ? KVS_COMPARE_GAP
                                                           : KVS_COMPARE_NO_X);
            if (!hit) continue;
            int w = first ? snprintf(buf + len, cap - len, "%s%s: %s", len ? "; " : "", why[r], set->trace_label[t])
                          : snprintf(buf + len, cap - len, ", %s", set->trace_label[t]);
            if (w < 0) return;
            len += (size_t)w;
            first = 0;
        }
    }
}
