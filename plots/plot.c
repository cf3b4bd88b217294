/* plot.c — plots from the kvsim results database through a gnuplot pipe (see plot.h). Follows
 * ../shared/DESIGN.md "Results (SQLite) and plots" and POLICY_SPEC.md §1.5 (budget-matching modes); the
 * data comes through the read API of results/results.h (no SQL here), labels from the metric table.
 *
 * How a plot is made: kvs_plot_prepare() reads all data from the database first (so a database problem is
 * reported before any program runs: runs, step series, the turns of their traces) and builds the series,
 * labels, line breaks and the legend layout; kvs_plot_write_script() writes the
 * script and the data (inline `plot '-' ... e` blocks, no temporary files) to any stream, which is how tests
 * read it; kvs_plot_render() locates gnuplot on PATH (a clear "gnuplot not found" instead of a shell error),
 * opens the output through common/kvs_out.h (the rules of every kvsim output: symbolic links written through,
 * devices and FIFOs in place, "-" standard output), writes the script to gnuplot's stdin, gnuplot draws into
 * a private temporary folder, and only when gnuplot exited 0 and the image is non-empty is it copied into the
 * output and committed. Any failure abandons the output and removes the folder, so a failed plot changes
 * nothing and leaves nothing behind.
 */
#include "../common/kvs_rng.h"
#include "plot.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/kvs_out.h"
#include "../common/kvs_stats.h"
#include "../sim/policy.h"
#include "../policies/registry.h"
#include "../results/results.h"
#include "plot_drift.h"
#include "plot_heads.h"

/* ------------------------------------------------------------------------------------------------
 * Kinds and metrics
 * ---------------------------------------------------------------------------------------------- */

static const char *const kind_names[KVS_PLOT_N_KINDS] = {"error-vs-budget", "error-vs-position", "memory-vs-budget",
                                                         "error-vs-memory", "error-vs-traffic", "drift-curve",
                                                         "drift-locality", "head-similarity", "layer-similarity"};

const char *kvs_plot_kind_name(kvs_plot_kind kind) {
    return (int)kind >= 0 && (int)kind < KVS_PLOT_N_KINDS ? kind_names[kind] : "?";
}

kvs_status kvs_plot_kind_parse(const char *name, kvs_plot_kind *out) {
    for (int i = 0; i < KVS_PLOT_N_KINDS; i++)
        if (name && !strcmp(name, kind_names[i])) {
            *out = (kvs_plot_kind)i;
            return KVS_OK;
        }
    return kvs_fail(KVS_ERR_INVALID_ARG, "--kind: unknown plot kind '%s' (expected error-vs-budget, "
                                         "error-vs-position, memory-vs-budget, error-vs-memory, error-vs-traffic, drift-curve, "
                                         "drift-locality, head-similarity or layer-similarity)",
                    name ? name : "(none)");
}

static int is_cost_kind(kvs_plot_kind k) { return k == KVS_PLOT_ERROR_VS_MEMORY || k == KVS_PLOT_ERROR_VS_TRAFFIC; }

static int is_drift_kind(kvs_plot_kind k) { return k == KVS_PLOT_DRIFT_CURVE || k == KVS_PLOT_DRIFT_LOCALITY; }

static const char *default_metric(kvs_plot_kind k) {
    return k == KVS_PLOT_MEMORY_VS_BUDGET ? "storage_bytes_mean" : "out_err_mean";
}

/* "a, b, c" of the metric table's names of one kind (for messages). */
static void names_of_kind(kvs_metric_kind kind, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int m = 0; m < KVS_N_METRICS && len < cap; m++)
        if (kvs_metric_table[m].kind == kind)
            len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", kvs_metric_table[m].name);
}

kvs_status kvs_plot_metric_check(kvs_plot_kind kind, const char *metric) {
    kvs_metric m;
    kvs_stat_kind s;
    char names[1024];
    if ((int)kind < 0 || (int)kind >= KVS_PLOT_N_KINDS)
        return kvs_fail(KVS_ERR_INVALID_ARG, "plot: bad kind %d", (int)kind);
    if (is_drift_kind(kind))
        return kvs_fail(KVS_ERR_INVALID_ARG, "--metric does not apply to --kind %s (it draws the drift tables)",
                        kind_names[kind]);
    if (kvs_plot_heads_kind(kind)) return kvs_plot_heads_metric_check(kind, metric);
    if (!metric || kvs_results_column_parse(metric, &m, &s) != KVS_OK) {
        if (kind == KVS_PLOT_ERROR_VS_POSITION)
            return kvs_fail(KVS_ERR_INVALID_ARG, "--metric: '%s' cannot be drawn per position (expected <metric>_mean "
                                                 "of a metric of the table, e.g. out_err_mean, attn_recall_mean, "
                                                 "storage_bytes_mean)",
                            metric ? metric : "(none)");
        return kvs_fail(KVS_ERR_INVALID_ARG, "--metric: unknown metric '%s' (expected <metric>_<stat>, e.g. "
                                             "out_err_mean, out_err_p95, attn_recall_mean)",
                        metric ? metric : "(none)");
    }
    if (kind == KVS_PLOT_ERROR_VS_POSITION) {
        if (s != KVS_STAT_MEAN)
            return kvs_fail(KVS_ERR_INVALID_ARG, "--metric: '%s' cannot be drawn per position (the position series is "
                                                 "the mean over heads: use %s_mean)",
                            metric, kvs_metric_table[m].name);
        return KVS_OK;
    }
    if (s == KVS_STAT_N)
        return kvs_fail(KVS_ERR_INVALID_ARG, "--metric: '%s' is a sample count; use _mean, _p50, _p95, _max or _min",
                        metric);
    kvs_metric_kind want = kind == KVS_PLOT_MEMORY_VS_BUDGET ? KVS_METRIC_BYTES : KVS_METRIC_QUALITY;
    if (kvs_metric_table[m].kind != want) {
        names_of_kind(want, names, sizeof names);
        return kvs_fail(KVS_ERR_INVALID_ARG, "--metric: %s draws a %s metric (%s) with _mean, _p50, _p95, _max or _min, "
                                             "not '%s'",
                        kind_names[kind], want == KVS_METRIC_BYTES ? "bytes" : "quality", names, metric);
    }
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Colours
 * ---------------------------------------------------------------------------------------------- */

/* The policy palette: 36 colours, each as far from the others as a greedy farthest-point search could place
 * it (the method of Glasbey, van der Heijden, Toh and Gray, "Colour displays for categorical images", Color
 * Research & Application 32(4), 2007), with CIEDE2000 as the distance: starting from matplotlib's tab10 blue,
 * orange, green and red, each next colour is the sRGB colour of a 16-level grid (steps of 0x11), lightness L*
 * in [25, 70] (readable as a thin line on white, and not the oracles' black), whose smallest distance to the
 * colours already chosen and to white, black and the greys of the plot (frontier #b8b8b8, turn shade #e6e6e6,
 * turn line #555555) is the largest. tools/gen_palette.py computes it (`/usr/bin/python3 tools/gen_palette.py
 * 36`). Registry order takes them in that order, so the first policies get the most separated colours: every
 * pair of the first 21 is at least 18 apart in CIEDE2000, of the first 33 (the registry's size) at least 15.2, of all
 * 36 at least 14.6; tests/test_plot.c recomputes the distances and holds every registered policy to at least 15 (a
 * difference plainly visible between two thin lines). */
static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#dd00ff", "#1100cc", "#880055",
                                      "#bbaa00", "#005500", "#ff7799", "#00aaaa", "#885500", "#9999ff", "#776699",
                                      "#888866", "#006666", "#997777", "#772200", "#114477", "#666600", "#dd1188",
                                      "#33aaff", "#5555ff", "#dd88dd", "#118866", "#dd9988", "#553333", "#9900bb",
                                      "#bb8833", "#444422", "#00bb88", "#bb6633", "#443366", "#888899", "#992233",
                                      "#668888"};
#define N_PALETTE (sizeof palette / sizeof palette[0])

/* Point and dash types: a policy's colour, point and dash all differ from every other registered policy's,
 * so a plot read in grey or by a colour-blind reader still tells policies apart. Policy i takes point i mod 9
 * and dash i mod 4: 9 and 4 are coprime, so the first 36 indexes give 36 different (point, dash) pairs (the
 * Chinese remainder theorem), more than the registry holds. Points alternate filled and open shapes; the
 * dashes are solid, dash-dot, dotted and dash-dot-dot: dt 2 (plain dashes) is left to the oracles. */
static const int style_points[9] = {7, 4, 9, 12, 11, 6, 3, 5, 8}; /* ● □ ▲ ◇ ▼ ○ ✱ ■ △ (cairo/svg terminals) */
static const int style_dashes[4] = {1, 4, 3, 5};
#define N_POINTS 9
#define STYLE_PAIRS 36
#define ORACLE_DASH 2

/* The registry index of `policy`, or a stable index from a hash of an unregistered name (>= the count). */
static unsigned policy_index(const char *policy) {
    if (!policy) policy = "";
    for (int i = 0; i < kvs_policy_count(); i++)
        if (!strcmp(kvs_policy_at(i)->name, policy)) return (unsigned)i;
    uint32_t h = 2166136261u; /* FNV-1a: a name the registry does not know still keeps one style */
    for (const unsigned char *c = (const unsigned char *)policy; *c; c++) h = (h ^ *c) * 16777619u;
    return (unsigned)kvs_policy_count() + h % (N_PALETTE * STYLE_PAIRS);
}

const char *kvs_plot_policy_color(const char *policy) { return palette[policy_index(policy) % N_PALETTE]; }

kvs_plot_style kvs_plot_policy_style(const char *policy, int variant, int is_oracle) {
    unsigned i = policy_index(policy), k = variant > 0 ? (unsigned)variant : 0;
    kvs_plot_style st;
    if (is_oracle) {
        st.color = "#000000";
        st.point = style_points[(i + k) % N_POINTS];
        st.dash = ORACLE_DASH;
        return st;
    }
    st.color = palette[i % N_PALETTE];
    /* Variant k: the dash moves on first, then the point, so variants 0..35 of one policy are 36 different
     * (point, dash) pairs ((k div 4) mod 9 and k mod 4 determine k below 36), and variants 0..3 keep the
     * policy's point. */
    st.point = style_points[(i + k / 4) % N_POINTS];
    st.dash = style_dashes[(i + k) % 4];
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Pareto frontier
 * ---------------------------------------------------------------------------------------------- */

/* Does point a come before point b in the sweep order: x ascending, then the better y, then the lower index. */
static int pareto_before(const double *x, const double *y, int hib, size_t a, size_t b) {
    if (x[a] != x[b]) return x[a] < x[b];
    if (y[a] != y[b]) return hib ? y[a] > y[b] : y[a] < y[b];
    return a < b;
}

size_t kvs_plot_pareto(const double *x, const double *y, size_t n, int higher_is_better, size_t *idx) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i]) && isfinite(y[i])) idx[m++] = i;
    /* Insertion sort (a plot has at most a few hundred points; no global comparator state). */
    for (size_t i = 1; i < m; i++)
        for (size_t j = i; j > 0 && pareto_before(x, y, higher_is_better, idx[j], idx[j - 1]); j--) {
            size_t t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    /* Sweep in x order: a point is kept when its y is strictly better than every point at smaller or equal
     * x before it (equal x: the better y came first, so the rest at that x are dominated). */
    size_t k = 0;
    double best = 0;
    for (size_t j = 0; j < m; j++) {
        double v = y[idx[j]];
        if (k == 0 || (higher_is_better ? v > best : v < best)) {
            idx[k++] = idx[j];
            best = v;
        }
    }
    return k;
}

/* ------------------------------------------------------------------------------------------------
 * Series
 * ---------------------------------------------------------------------------------------------- */

typedef enum { STYLE_LINE = 0, STYLE_ORACLE, STYLE_FRONTIER } series_style;

typedef struct {
    /* identity: (policy, params, codec, trace content, measure, kv_bytes, aux_bytes), or one run (position kind) */
    char *policy, *params, *measure, *trace_path;
    char *codec;       /* runs.codec: the KV codec's canonical spec, "" = K/V as captured */
    int64_t page;      /* runs.page: positions a page, 0 = token granularity */
    char page_score[8]; /* a paged run's page score rule ("max", "sum"; "" = the count rule) */
    char *trace_key;   /* the trace's content hash (one trace through any path spelling), else "#<trace_id>" */
    char *trace_label; /* kvs_results_trace_label: "<model>@<8 hex>", else the path's base name */
    char *model;       /* the trace's model name ("" when not recorded) */
    int kv_bytes, aux_bytes; /* bytes per K/V and per auxiliary element the runs were replayed with; -1 = not
                              * recorded (runs written before runs.options) */
    int64_t trace_id, run_id, budget; /* run_id/budget: position kind only (one series per run) */
    int is_oracle;
    int prompt_only; /* budget_scope "prompt": the budget bounds the prompt only (generated tokens all kept) */
    char *label;
    series_style style;
    /* points; per point the budget it stands for and how many runs were averaged into it (a line across traces:
     * how many traces) */
    size_t n, cap;
    double *x, *y;
    double *lo, *hi; /* [n] a line across traces: the bootstrap interval of y; else lo = hi = y */
    int64_t *pt_budget, *pt_count;
    int across;      /* a line across traces (pt_count: traces per point): drawn with its interval */
    int64_t n_min, n_max; /* across: fewest and most traces of a point */
    size_t n_cut;    /* across, log y axis: bars whose lower bound (<= 0) is cut at the axis' floor */
    unsigned char *brk; /* [n], 1 = the line breaks before point k (a gap, or a point left off a log axis); NULL =
                         * never */
    size_t n_off;       /* points left out because a log y axis cannot show them (y <= 0) */
    double off_x;       /* the x of the first of them (where a series with none left keeps its key entry) */
} plot_series;

/* The turns of one trace of a position plot, as the database has them (n 0: no turn info). */
typedef struct {
    int64_t trace_id;
    char *path;      /* the trace's label (kvs_results_trace_label), for the turn marks */
    kvs_turn *turns; /* [n] */
    int64_t n;
} trace_turns;

typedef struct {
    plot_series *s;
    size_t n, cap;
    trace_turns *tr; /* position kind: one per trace of the plotted runs */
    size_t n_tr;
    double *run_x, *run_y; /* cost kinds: each non-oracle run's own point, what the frontier is made of */
    size_t n_run, cap_run;
} plot_data;

static void series_free(plot_series *s) {
    free(s->policy);
    free(s->params);
    free(s->codec);
    free(s->measure);
    free(s->trace_path);
    free(s->trace_key);
    free(s->trace_label);
    free(s->model);
    free(s->label);
    free(s->x);
    free(s->y);
    free(s->lo);
    free(s->hi);
    free(s->pt_budget);
    free(s->pt_count);
    free(s->brk);
    memset(s, 0, sizeof *s);
}

static void plot_data_free(plot_data *d) {
    for (size_t i = 0; i < d->n; i++) series_free(&d->s[i]);
    free(d->s);
    for (size_t i = 0; i < d->n_tr; i++) {
        free(d->tr[i].path);
        free(d->tr[i].turns);
    }
    free(d->tr);
    free(d->run_x);
    free(d->run_y);
    memset(d, 0, sizeof *d);
}

static kvs_status nomem(void) { return kvs_fail(KVS_ERR_NOMEM, "plot: out of memory"); }

static char *dup_or_empty(const char *s) { return strdup(s ? s : ""); }

/* The identity of run w's trace: its content hash when recorded, else its trace row. */
static void trace_key_of(const kvs_results_run_row *w, char *buf, size_t cap) {
    if (w->trace_sha256 && w->trace_sha256[0]) snprintf(buf, cap, "%s", w->trace_sha256);
    else snprintf(buf, cap, "#%" PRId64, w->trace_id);
}

static kvs_status series_new(plot_data *d, const kvs_results_run_row *w, int per_run, plot_series **out) {
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 8;
        plot_series *s = realloc(d->s, cap * sizeof *s);
        if (!s) return nomem();
        d->s = s;
        d->cap = cap;
    }
    plot_series *s = &d->s[d->n++];
    memset(s, 0, sizeof *s);
    s->policy = dup_or_empty(w ? w->policy : NULL);
    s->params = dup_or_empty(w ? w->params : NULL);
    s->codec = dup_or_empty(w ? w->codec : NULL);
    s->page = w ? w->page : 0;
    snprintf(s->page_score, sizeof s->page_score, "%s", w ? w->page_score : "");
    s->measure = dup_or_empty(w ? w->measure : NULL);
    s->trace_path = dup_or_empty(w ? w->trace_path : NULL);
    char key[80] = "", label[600] = "";
    if (w) {
        trace_key_of(w, key, sizeof key);
        kvs_results_trace_label(w, label, sizeof label);
    }
    s->trace_key = strdup(key);
    s->trace_label = strdup(label);
    s->model = dup_or_empty(w ? w->model : NULL);
    if (!s->policy || !s->params || !s->codec || !s->measure || !s->trace_path || !s->trace_key || !s->trace_label ||
        !s->model)
        return nomem();
    s->kv_bytes = s->aux_bytes = -1;
    if (w) kvs_results_run_bytes(w, &s->kv_bytes, &s->aux_bytes);
    s->trace_id = w ? w->trace_id : -1;
    s->run_id = w && per_run ? w->id : -1;
    s->budget = w && per_run ? w->budget_tokens : -1;
    s->is_oracle = w ? w->is_oracle : 0;
    s->prompt_only = w && w->budget_scope && !strcmp(w->budget_scope, "prompt");
    s->style = s->is_oracle ? STYLE_ORACLE : STYLE_LINE;
    *out = s;
    return KVS_OK;
}

/* The series of run w: (policy, params, codec, page, trace content, measure, kv_bytes, aux_bytes), or the run itself
 * when per_run. A codec's (or a page size's) runs hold other bytes and errors than the same policy's runs on K/V as
 * captured at token granularity: their own series (averaging them would draw a point no run measured). Runs that differ in their element sizes hold different bytes for the same tokens: averaging them
 * would draw a point no run measured (window at budget 8 with 1 and 4 bytes per element, at 640 B). One trace
 * replayed through two path spellings has two trace rows but one content: one series. */
static kvs_status series_of(plot_data *d, const kvs_results_run_row *w, int per_run, plot_series **out) {
    char key[80];
    int kv = -1, aux = -1;
    trace_key_of(w, key, sizeof key);
    kvs_results_run_bytes(w, &kv, &aux);
    for (size_t i = 0; i < d->n; i++) {
        plot_series *s = &d->s[i];
        if (per_run ? s->run_id == w->id
                    : (!strcmp(s->policy, w->policy) && !strcmp(s->params, w->params) &&
                       !strcmp(s->codec, w->codec ? w->codec : "") && s->page == w->page &&
                       !strcmp(s->page_score, w->page_score) && !strcmp(s->trace_key, key) &&
                       !strcmp(s->measure, w->measure) && s->kv_bytes == kv && s->aux_bytes == aux)) {
            if (w->is_oracle) s->is_oracle = 1, s->style = STYLE_ORACLE;
            *out = s;
            return KVS_OK;
        }
    }
    return series_new(d, w, per_run, out);
}

/* Adds a point; with budget >= 0, a point of the same budget is averaged with it instead (repeated runs). */
static kvs_status series_add(plot_series *s, double x, double y, int64_t budget) {
    if (budget >= 0)
        for (size_t i = 0; i < s->n; i++)
            if (s->pt_budget[i] == budget) {
                s->x[i] += x;
                s->y[i] += y;
                s->pt_count[i]++;
                return KVS_OK;
            }
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        double *nx = realloc(s->x, cap * sizeof *nx);
        if (!nx) return nomem();
        s->x = nx;
        double *ny = realloc(s->y, cap * sizeof *ny);
        if (!ny) return nomem();
        s->y = ny;
        int64_t *nb = realloc(s->pt_budget, cap * sizeof *nb);
        if (!nb) return nomem();
        s->pt_budget = nb;
        int64_t *nc = realloc(s->pt_count, cap * sizeof *nc);
        if (!nc) return nomem();
        s->pt_count = nc;
        double *nl = realloc(s->lo, cap * sizeof *nl);
        if (!nl) return nomem();
        s->lo = nl;
        double *nh = realloc(s->hi, cap * sizeof *nh);
        if (!nh) return nomem();
        s->hi = nh;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->lo[s->n] = s->hi[s->n] = y;
    s->pt_budget[s->n] = budget;
    s->pt_count[s->n] = 1;
    s->n++;
    return KVS_OK;
}

/* Sorts the points by x, every per-point array with them (insertion sort: a series has few points). */
static void series_sort(plot_series *s) {
    for (size_t i = 1; i < s->n; i++)
        for (size_t j = i; j > 0 && s->x[j - 1] > s->x[j]; j--) {
            double tx = s->x[j], ty = s->y[j], tl = s->lo[j], th = s->hi[j];
            int64_t tb = s->pt_budget[j], tc = s->pt_count[j];
            s->x[j] = s->x[j - 1], s->y[j] = s->y[j - 1], s->lo[j] = s->lo[j - 1], s->hi[j] = s->hi[j - 1];
            s->pt_budget[j] = s->pt_budget[j - 1], s->pt_count[j] = s->pt_count[j - 1];
            s->x[j - 1] = tx, s->y[j - 1] = ty, s->lo[j - 1] = tl, s->hi[j - 1] = th;
            s->pt_budget[j - 1] = tb, s->pt_count[j - 1] = tc;
        }
}

/* Turns the sums into means and sorts the points by x. */
static void series_finish(plot_series *s) {
    for (size_t i = 0; i < s->n; i++) {
        s->x[i] /= (double)s->pt_count[i];
        s->y[i] /= (double)s->pt_count[i];
        s->lo[i] = s->hi[i] = s->y[i];
        s->pt_count[i] = 1;
    }
    series_sort(s);
}

/* Legend order: policy, params, codec (K/V as captured first), page size (token level first), element bytes, trace,
 * measure, run. */
static int cmp_series(const void *pa, const void *pb) {
    const plot_series *a = pa, *b = pb;
    int c;
    if ((c = strcmp(a->policy, b->policy))) return c;
    if ((c = strcmp(a->params, b->params))) return c;
    if ((c = strcmp(a->codec, b->codec))) return c;
    if (a->page != b->page) return a->page < b->page ? -1 : 1;
    if ((c = strcmp(a->page_score, b->page_score))) return c; /* the count rule ("") first */
    if (a->kv_bytes != b->kv_bytes) return a->kv_bytes < b->kv_bytes ? -1 : 1;
    if (a->aux_bytes != b->aux_bytes) return a->aux_bytes < b->aux_bytes ? -1 : 1;
    if ((c = strcmp(a->trace_label, b->trace_label))) return c;
    if ((c = strcmp(a->trace_key, b->trace_key))) return c;
    if ((c = strcmp(a->model, b->model))) return c; /* lines across traces: their trace fields are empty */
    if ((c = strcmp(a->measure, b->measure))) return c;
    return (a->run_id > b->run_id) - (a->run_id < b->run_id);
}

/* Labels: "policy (params)" [" [codec]"] [" budget=B"] [" (oracle)"] [" (prompt-only budget)"] [" [trace, measure, bytes]"
 * naming what varies among the plot's series: the trace where it has several, the measure mode, and
 * "kv_bytes=N" / "aux_bytes=N" where runs were replayed with different element sizes ("?" for a run that did
 * not record them)] [" [run N]"]. A trace is named by kvs_results_trace_label ("<model>@<8 hex>", or the
 * file name without a recorded hash); when two different traces would read alike, by more of the hash, or by
 * path and trace row. `by_budget`: the plot places runs by their nominal budget, which a prompt-only policy
 * exceeds while generating (it keeps every generated token): the label says so, as the runs table's flag P
 * does, so that its line is not read as a policy holding that many tokens. A line across traces names its model
 * where the plot has several, and how many traces its points average: " (n=7 traces)", " (n=5 to 7 traces)" (the
 * points with fewer are marked on the plot), " (n=1 trace: no interval)". */
static kvs_status label_series(plot_data *d, int per_run, int by_budget) {
    int many_traces = 0, many_measures = 0, many_kv = 0, many_aux = 0, many_models = 0;
    for (size_t i = 1; i < d->n; i++) {
        many_models |= strcmp(d->s[i].model, d->s[0].model) != 0;
        many_traces |= strcmp(d->s[i].trace_key, d->s[0].trace_key) != 0;
        many_measures |= strcmp(d->s[i].measure, d->s[0].measure) != 0;
        many_kv |= d->s[i].kv_bytes != d->s[0].kv_bytes;
        many_aux |= d->s[i].aux_bytes != d->s[0].aux_bytes;
    }
    for (size_t i = 0; i < d->n; i++) {
        plot_series *s = &d->s[i];
        char trace[1100] = "", bytes[80] = "", kv[16] = "?", aux[16] = "?", extra[1400] = "", budget[48] = "",
             run[64] = "";
        if (many_traces) {
            int clash = 0;
            for (size_t j = 0; j < d->n; j++)
                clash |= strcmp(d->s[j].trace_key, s->trace_key) && !strcmp(d->s[j].trace_label, s->trace_label);
            if (!clash) snprintf(trace, sizeof trace, "%s", s->trace_label);
            else if (s->trace_key[0] != '#') snprintf(trace, sizeof trace, "%s (sha256 %.16s)", s->trace_label, s->trace_key);
            else snprintf(trace, sizeof trace, "%s #%" PRId64, s->trace_path, s->trace_id);
        }
        if (s->across && many_models) snprintf(trace, sizeof trace, "%s", s->model[0] ? s->model : "model ?");
        if (s->kv_bytes >= 0) snprintf(kv, sizeof kv, "%d", s->kv_bytes);
        if (s->aux_bytes >= 0) snprintf(aux, sizeof aux, "%d", s->aux_bytes);
        if (many_kv || many_aux)
            snprintf(bytes, sizeof bytes, "%s%s%s%s%s", many_kv ? "kv_bytes=" : "", many_kv ? kv : "",
                     many_kv && many_aux ? " " : "", many_aux ? "aux_bytes=" : "", many_aux ? aux : "");
        const char *parts[3] = {trace, many_measures ? s->measure : "", bytes};
        size_t len = 0;
        for (int k = 0; k < 3; k++)
            if (parts[k][0] && len < sizeof extra)
                len += (size_t)snprintf(extra + len, sizeof extra - len, "%s%s", len ? ", " : " [", parts[k]);
        if (len && len < sizeof extra) snprintf(extra + len, sizeof extra - len, "]");
        if (per_run) {
            snprintf(budget, sizeof budget, " budget=%" PRId64, s->budget);
            snprintf(run, sizeof run, " [run %" PRId64 "]", s->run_id);
        }
        if (s->across) {
            if (s->n_max < 2) snprintf(run, sizeof run, " (n=1 trace: no interval)");
            else if (s->n_min == s->n_max) snprintf(run, sizeof run, " (n=%" PRId64 " traces)", s->n_max);
            else snprintf(run, sizeof run, " (n=%" PRId64 " to %" PRId64 " traces)", s->n_min, s->n_max);
        }
        /* the configuration named as everywhere else (kvs_results_config_label), then the series' marks */
        size_t name_cap = strlen(s->policy) + strlen(s->params) + strlen(s->codec) + 64;
        char *name = malloc(name_cap);
        if (!name) return nomem();
        kvs_results_config_label_rule(s->policy, s->params, s->codec, s->page, s->page_score, name, name_cap);
        size_t cap = strlen(name) + strlen(extra) + 200;
        if (!(s->label = malloc(cap))) {
            free(name);
            return nomem();
        }
        snprintf(s->label, cap, "%s%s%s%s%s%s", name, budget, s->is_oracle ? " (oracle)" : "",
                 by_budget && s->prompt_only ? " (prompt-only budget)" : "", extra, run);
        free(name);
    }
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Reading the data (through results/results.h)
 * ---------------------------------------------------------------------------------------------- */

/* The aggregate of run w that the plot reads: run-wide, or layer `layer` (NULL when the run has none). */
static const kvs_results_agg *agg_of(const kvs_results_run_row *w, int32_t layer) {
    if (layer < 0) return w->has_agg ? &w->agg : NULL;
    for (int32_t i = 0; i < w->n_layer_aggs; i++)
        if (w->layer_aggs[i].layer == layer) return &w->layer_aggs[i];
    return NULL;
}

/* Budget and cost kinds: one point per run, x = its budget (x_metric < 0) or a measured statistic (log
 * scale: only positive x), y = the statistic of y_metric; points of one series and budget are averaged. */
static kvs_status read_run_points(const kvs_results_run_row *rows, int64_t n_rows, int32_t layer, int y_metric,
                                  kvs_stat_kind y_stat, int x_metric, kvs_stat_kind x_stat, plot_data *d) {
    for (int64_t i = 0; i < n_rows; i++) {
        const kvs_results_run_row *w = &rows[i];
        const kvs_results_agg *a = agg_of(w, layer);
        if (!a || w->budget_tokens <= 0) continue;
        double y = kvs_results_stat_value(&a->m[y_metric], y_stat);
        double x = x_metric < 0 ? (double)w->budget_tokens : kvs_results_stat_value(&a->m[x_metric], x_stat);
        if (!isfinite(y) || !isfinite(x) || x <= 0) continue;
        plot_series *s = NULL;
        kvs_status rc = series_of(d, w, 0, &s);
        if (rc != KVS_OK) return rc;
        if ((rc = series_add(s, x, y, w->budget_tokens)) != KVS_OK) return rc;
        if (w->is_oracle) continue;
        if (d->n_run == d->cap_run) {
            size_t cap = d->cap_run ? 2 * d->cap_run : 64;
            double *nx = realloc(d->run_x, cap * sizeof *nx);
            if (!nx) return nomem();
            d->run_x = nx;
            double *ny = realloc(d->run_y, cap * sizeof *ny);
            if (!ny) return nomem();
            d->run_y = ny;
            d->cap_run = cap;
        }
        d->run_x[d->n_run] = x;
        d->run_y[d->n_run++] = y;
    }
    return KVS_OK;
}

static const trace_turns *turns_of(const plot_data *d, int64_t trace_id) {
    for (size_t i = 0; i < d->n_tr; i++)
        if (d->tr[i].trace_id == trace_id) return &d->tr[i];
    return NULL;
}

/* Reads the turns of the trace of run w once per trace (none recorded: n 0, no turn info). */
static kvs_status read_turns(kvs_results_db *db, const kvs_results_run_row *w, plot_data *d) {
    if (turns_of(d, w->trace_id)) return KVS_OK;
    trace_turns *tr = realloc(d->tr, (d->n_tr + 1) * sizeof *tr);
    if (!tr) return nomem();
    d->tr = tr;
    trace_turns *t = &d->tr[d->n_tr];
    memset(t, 0, sizeof *t);
    t->trace_id = w->trace_id;
    char label[600];
    kvs_results_trace_label(w, label, sizeof label);
    if (!(t->path = strdup(label))) return nomem();
    d->n_tr++;
    return kvs_results_query_turns(db, w->trace_id, &t->turns, &t->n);
}

/* Position kind: one series per run, the mean over heads (and layers) of the step metric per position. */
static kvs_status read_position_points(kvs_results_db *db, const kvs_results_run_row *rows, int64_t n_rows,
                                       int32_t layer, kvs_metric metric, plot_data *d) {
    for (int64_t i = 0; i < n_rows; i++) {
        kvs_results_series ser;
        kvs_status rc = kvs_results_query_steps(db, rows[i].id, layer, metric, &ser);
        if (rc != KVS_OK) return rc;
        plot_series *s = NULL;
        if (ser.n > 0) rc = series_new(d, &rows[i], 1, &s);
        if (ser.n > 0 && rc == KVS_OK) rc = read_turns(db, &rows[i], d);
        for (int64_t k = 0; k < ser.n && rc == KVS_OK; k++)
            if (isfinite(ser.value[k])) rc = series_add(s, (double)ser.position[k], ser.value[k], -1);
        kvs_results_series_free(&ser);
        if (rc != KVS_OK) return rc;
    }
    return KVS_OK;
}

/* The stretch of positions measured without a gap that holds `pos`, under measure mode `measure`: decode
 * measures each turn's generated positions [prompt_end, end), prefill its prompt [begin, prompt_end), all
 * every position; -1 when pos is in none. */
static int64_t measured_span(const trace_turns *t, const char *measure, int64_t pos) {
    if (!strcmp(measure, "all")) return pos >= 0 && pos < t->turns[t->n - 1].end ? 0 : -1;
    int decode = strcmp(measure, "prefill") != 0;
    for (int64_t i = 0; i < t->n; i++) {
        const kvs_turn *u = &t->turns[i];
        if (decode ? pos >= u->prompt_end && pos < u->end : pos >= u->begin && pos < u->prompt_end) return i;
    }
    return -1;
}

static int cmp_double_asc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Where the line of position series s breaks (a blank line in gnuplot's inline data): between two points in
 * different measured stretches of its trace's turns (with --measure decode, the prompt of a later turn lies
 * between its responses and was not measured), and, with or without turn info, where the positions jump by
 * more than the series' usual stride (the median step: 1, or N with --series-every N), i.e. where a stored
 * position is missing. Drawing a line across either would invent values nobody measured. */
static kvs_status series_breaks(plot_series *s, const trace_turns *t) {
    if (s->n < 2) return KVS_OK;
    double *step = malloc((s->n - 1) * sizeof *step);
    if (!step || !(s->brk = calloc(s->n, 1))) {
        free(step);
        return nomem();
    }
    for (size_t k = 1; k < s->n; k++) step[k - 1] = s->x[k] - s->x[k - 1];
    qsort(step, s->n - 1, sizeof *step, cmp_double_asc);
    double stride = step[(s->n - 1) / 2];
    free(step);
    int has_turns = t && t->n > 0;
    int64_t prev = has_turns ? measured_span(t, s->measure, (int64_t)s->x[0]) : 0;
    for (size_t k = 1; k < s->n; k++) {
        int64_t span = has_turns ? measured_span(t, s->measure, (int64_t)s->x[k]) : 0;
        s->brk[k] = span != prev || span < 0 || s->x[k] - s->x[k - 1] > stride;
        prev = span;
    }
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Across traces: the per-trace series of one (policy, params, measure, kv_bytes, aux_bytes, model) become one
 * line of means over traces with bootstrap intervals (plot.h "Across traces").
 * ---------------------------------------------------------------------------------------------- */


/* Do per-trace series a and b belong to one line across traces? */
static int same_line(const plot_series *a, const plot_series *b) {
    return !strcmp(a->policy, b->policy) && !strcmp(a->params, b->params) && !strcmp(a->codec, b->codec) &&
           a->page == b->page && !strcmp(a->page_score, b->page_score) && !strcmp(a->measure, b->measure) &&
           a->kv_bytes == b->kv_bytes && a->aux_bytes == b->aux_bytes && !strcmp(a->model, b->model);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The line of the per-trace series mem[0..m) (one line's traces, ascending trace key): at each budget any of them
 * has a point, over the traces that do, x = the mean of their x, y the mean of their y with its interval. */
static kvs_status line_across(plot_data *out, plot_series *const *mem, size_t m) {
    const plot_series *p = mem[0];
    plot_series *s = NULL;
    kvs_status rc = series_new(out, NULL, 0, &s);
    if (rc != KVS_OK) return rc;
    free(s->policy), free(s->params), free(s->codec), free(s->measure), free(s->model);
    s->policy = strdup(p->policy), s->params = strdup(p->params), s->measure = strdup(p->measure);
    s->codec = strdup(p->codec), s->model = strdup(p->model);
    s->page = p->page;
    memcpy(s->page_score, p->page_score, sizeof s->page_score);
    if (!s->policy || !s->params || !s->codec || !s->measure || !s->model) return nomem();
    s->kv_bytes = p->kv_bytes, s->aux_bytes = p->aux_bytes;
    s->across = 1;
    for (size_t j = 0; j < m; j++) {
        s->is_oracle |= mem[j]->is_oracle;
        s->prompt_only |= mem[j]->prompt_only;
    }
    s->style = s->is_oracle ? STYLE_ORACLE : STYLE_LINE;
    /* The line's budgets: every budget of any of its traces, once. */
    size_t nb = 0;
    for (size_t j = 0; j < m; j++) nb += mem[j]->n;
    int64_t *budgets = malloc((nb + 1) * sizeof *budgets);
    double *xs = malloc(m * sizeof *xs), *ys = malloc(m * sizeof *ys);
    if (!budgets || !xs || !ys) {
        rc = nomem();
        goto cleanup;
    }
    nb = 0;
    for (size_t j = 0; j < m; j++)
        for (size_t k = 0; k < mem[j]->n; k++) budgets[nb++] = mem[j]->pt_budget[k];
    qsort(budgets, nb, sizeof *budgets, cmp_i64);
    s->n_min = INT64_MAX;
    for (size_t b = 0; b < nb; b++) {
        if (b > 0 && budgets[b] == budgets[b - 1]) continue;
        char head[64 + 40];
        uint64_t seed = KVS_FNV1A64_BASIS;
        seed = kvs_fnv1a64(seed, s->policy), seed = kvs_fnv1a64(seed, "\n");
        seed = kvs_fnv1a64(seed, s->params), seed = kvs_fnv1a64(seed, "\n");
        seed = kvs_fnv1a64(seed, s->measure), seed = kvs_fnv1a64(seed, "\n");
        snprintf(head, sizeof head, "%d\n%d\n", s->kv_bytes, s->aux_bytes);
        seed = kvs_fnv1a64(seed, head);
        seed = kvs_fnv1a64(seed, s->model), seed = kvs_fnv1a64(seed, "\n");
        snprintf(head, sizeof head, "%" PRId64 "\n", budgets[b]);
        seed = kvs_fnv1a64(seed, head);
        /* a codec joins the seed only when set: the lines on K/V as captured keep the intervals they had */
        if (s->codec[0]) seed = kvs_fnv1a64(kvs_fnv1a64(kvs_fnv1a64(seed, "codec="), s->codec), "\n");
        if (s->page > 0) { /* a page size likewise, and a score rule other than count */
            snprintf(head, sizeof head, "page=%" PRId64 "\n", s->page);
            seed = kvs_fnv1a64(seed, head);
            if (s->page_score[0]) seed = kvs_fnv1a64(kvs_fnv1a64(kvs_fnv1a64(seed, "page_score="), s->page_score), "\n");
        }
        size_t n = 0;
        long double xsum = 0;
        for (size_t j = 0; j < m; j++)
            for (size_t k = 0; k < mem[j]->n; k++)
                if (mem[j]->pt_budget[k] == budgets[b]) {
                    xs[n] = mem[j]->x[k], ys[n] = mem[j]->y[k];
                    xsum += xs[n++];
                    seed = kvs_fnv1a64(kvs_fnv1a64(seed, mem[j]->trace_key), "\n");
                    break;
                }
        kvs_interval iv;
        if ((rc = kvs_bootstrap_mean(ys, n, KVS_BOOTSTRAP_REPS, 0.95, seed, &iv)) != KVS_OK) goto cleanup;
        if ((rc = series_add(s, (double)(xsum / (long double)n), iv.mean, -1)) != KVS_OK) goto cleanup;
        s->lo[s->n - 1] = iv.lo;
        s->hi[s->n - 1] = iv.hi;
        s->pt_budget[s->n - 1] = budgets[b];
        s->pt_count[s->n - 1] = (int64_t)n;
        if ((int64_t)n < s->n_min) s->n_min = (int64_t)n;
        if ((int64_t)n > s->n_max) s->n_max = (int64_t)n;
    }
    series_sort(s);
cleanup:
    free(budgets);
    free(xs);
    free(ys);
    return rc;
}

static int cmp_series_by_trace_key(const void *a, const void *b) {
    return strcmp((*(plot_series *const *)a)->trace_key, (*(plot_series *const *)b)->trace_key);
}

/* Replaces the per-trace series of d (finished: means per budget) by the lines across traces, and the runs'
 * points the frontier is made of by the lines' points (of the non-oracle lines): the frontier of this view goes
 * through the means it draws. */
static kvs_status aggregate_traces(plot_data *d) {
    plot_data out = {0};
    plot_series **mem = malloc((d->n ? d->n : 1) * sizeof *mem);
    unsigned char *done = calloc(d->n ? d->n : 1, 1);
    kvs_status rc = KVS_OK;
    if (!mem || !done) {
        rc = nomem();
        goto cleanup;
    }
    for (size_t i = 0; i < d->n; i++) {
        if (done[i]) continue;
        size_t m = 0;
        for (size_t j = i; j < d->n; j++)
            if (!done[j] && same_line(&d->s[i], &d->s[j])) {
                done[j] = 1;
                mem[m++] = &d->s[j];
            }
        /* The traces in ascending key order: the order of the bootstrap's units and of the seed's keys. */
        qsort(mem, m, sizeof *mem, cmp_series_by_trace_key);
        if ((rc = line_across(&out, mem, m)) != KVS_OK) goto cleanup;
    }
    d->n_run = 0;
    for (size_t i = 0; i < out.n; i++) {
        const plot_series *s = &out.s[i];
        if (s->is_oracle) continue;
        for (size_t k = 0; k < s->n; k++) {
            if (d->n_run == d->cap_run) {
                size_t cap = d->cap_run ? 2 * d->cap_run : 64;
                double *nx = realloc(d->run_x, cap * sizeof *nx);
                if (!nx) {
                    rc = nomem();
                    goto cleanup;
                }
                d->run_x = nx;
                double *ny = realloc(d->run_y, cap * sizeof *ny);
                if (!ny) {
                    rc = nomem();
                    goto cleanup;
                }
                d->run_y = ny;
                d->cap_run = cap;
            }
            d->run_x[d->n_run] = s->x[k];
            d->run_y[d->n_run++] = s->y[k];
        }
    }
    for (size_t i = 0; i < d->n; i++) series_free(&d->s[i]);
    free(d->s);
    d->s = out.s, d->n = out.n, d->cap = out.cap;
    out.s = NULL, out.n = 0;
cleanup:
    plot_data_free(&out);
    free(mem);
    free(done);
    return rc;
}

/* Appends the Pareto frontier of the non-oracle runs as a series (nothing when there are none). It is made of
 * the runs' own points, not of the series' points: a series point averages the repeated runs of one
 * configuration at one budget, which agree when the replay is deterministic; where they did not, the average
 * is a point no run measured, and the frontier must not pass through it. Across traces the points are the
 * lines' means (aggregate_traces put them in run_x / run_y): `label` says which. */
static kvs_status add_frontier(plot_data *d, int higher_is_better, const char *label) {
    size_t n = d->n_run;
    if (n == 0) return KVS_OK;
    size_t *idx = malloc(n * sizeof *idx);
    if (!idx) return nomem();
    size_t m = kvs_plot_pareto(d->run_x, d->run_y, n, higher_is_better, idx);
    plot_series *f = NULL;
    kvs_status rc = KVS_OK;
    KVS_TRY(rc = series_new(d, NULL, 0, &f));
    f->style = STYLE_FRONTIER;
    if (!(f->label = strdup(label))) {
        rc = nomem();
        goto cleanup;
    }
    for (size_t j = 0; j < m; j++) KVS_TRY(rc = series_add(f, d->run_x[idx[j]], d->run_y[idx[j]], -1));
cleanup:
    free(idx);
    return rc;
}

/* A log y axis cannot show y <= 0 (a full cache's error of exactly 0, say): such points are taken out of each
 * series (the line breaks where one was, rather than joining its neighbours across it) and the series' label
 * says how many, e.g. "full [3 of 3 points <= 0: not on the log axis]", so no series vanishes unexplained.
 * The frontier was computed before, over every point: its points at 0 are left off the same way. A line across
 * traces whose mean is > 0 may have an interval reaching 0 (some of its traces measured 0): gnuplot would drop
 * the whole bar, so its lower end is put at half the smallest positive value of the plot, below every point, and
 * the label counts such bars ("[1 interval reaches <= 0: cut at the axis]"). */
static kvs_status leave_off_log_axis(plot_data *d) {
    for (size_t i = 0; i < d->n; i++) {
        plot_series *s = &d->s[i];
        size_t w = 0, total = s->n;
        int gap = 0;
        for (size_t k = 0; k < s->n; k++) {
            if (!(s->y[k] > 0)) {
                if (s->n_off++ == 0) s->off_x = s->x[k];
                gap = w > 0;
                continue;
            }
            if (gap && !s->brk && !(s->brk = calloc(s->n, 1))) return nomem();
            s->x[w] = s->x[k];
            s->y[w] = s->y[k];
            s->pt_budget[w] = s->pt_budget[k];
            s->pt_count[w] = s->pt_count[k];
            s->lo[w] = s->lo[k];
            s->hi[w] = s->hi[k];
            if (s->brk) s->brk[w] = (unsigned char)(gap || s->brk[k]);
            gap = 0;
            w++;
        }
        s->n = w;
        if (s->n_off == 0) continue;
        char note[96];
        snprintf(note, sizeof note, " [%zu of %zu points <= 0: not on the log axis]", s->n_off, total);
        size_t cap = strlen(s->label) + strlen(note) + 1;
        char *l = realloc(s->label, cap);
        if (!l) return nomem();
        s->label = strcat(l, note);
    }
    double floor_y = INFINITY;
    for (size_t i = 0; i < d->n; i++)
        for (size_t k = 0; k < d->s[i].n; k++) {
            if (d->s[i].y[k] < floor_y) floor_y = d->s[i].y[k];
            if (d->s[i].lo[k] > 0 && d->s[i].lo[k] < floor_y) floor_y = d->s[i].lo[k];
        }
    for (size_t i = 0; i < d->n; i++) {
        plot_series *s = &d->s[i];
        if (!s->across) continue;
        for (size_t k = 0; k < s->n; k++)
            if (!(s->lo[k] > 0)) {
                s->lo[k] = floor_y / 2;
                s->n_cut++;
            }
        if (s->n_cut == 0) continue;
        char note[96];
        snprintf(note, sizeof note, " [%zu interval%s reach%s <= 0: cut at the axis]", s->n_cut,
                 s->n_cut == 1 ? "" : "s", s->n_cut == 1 ? "es" : "");
        size_t cap = strlen(s->label) + strlen(note) + 1;
        char *l = realloc(s->label, cap);
        if (!l) return nomem();
        s->label = strcat(l, note);
    }
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * gnuplot
 * ---------------------------------------------------------------------------------------------- */

/* AXIS_LOG_BYTES: every memory or traffic axis, log2 with tics in B/KiB/MiB (put_byte_tics); AXIS_LOG10: a
 * quality axis under --log-y. */
typedef enum { AXIS_LINEAR = 0, AXIS_LOG_TOKENS, AXIS_LOG_BYTES, AXIS_LOG10 } axis_mode;

typedef struct {
    char title[1024], xlabel[512], ylabel[512];
    axis_mode x, y;
} plot_text;

/* Finds `prog` (a path, or a name on PATH) as an executable; writes the resolved path. */
static int find_program(const char *prog, char *resolved, size_t cap) {
    if (strchr(prog, '/')) {
        snprintf(resolved, cap, "%s", prog);
        return access(prog, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    if (!path || !path[0]) path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t len = colon ? (size_t)(colon - path) : strlen(path);
        snprintf(resolved, cap, "%.*s/%s", (int)len, len ? path : ".", prog);
        struct stat sb;
        if (stat(resolved, &sb) == 0 && S_ISREG(sb.st_mode) && access(resolved, X_OK) == 0) return 1;
        path += len + (colon ? 1 : 0);
    }
    return 0;
}

void kvs_plot_gp_string(FILE *f, const char *s) {
    fputc('\'', f);
    for (; s && *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s == '\n' || *s == '\r' ? ' ' : *s, f);
    }
    fputc('\'', f);
}

/* Writes s single-quoted for /bin/sh. */
static void sh_quote(char *dst, size_t cap, const char *s) {
    size_t j = 0;
    if (j + 1 < cap) dst[j++] = '\'';
    for (; *s && j + 5 < cap; s++) {
        if (*s == '\'') {
            memcpy(dst + j, "'\\''", 4);
            j += 4;
        } else {
            dst[j++] = *s;
        }
    }
    if (j + 1 < cap) dst[j++] = '\'';
    dst[j] = '\0';
}

/* Writes s on one line of the script (a comment's text: a line break in it would end the comment). */
static void put_one_line(FILE *gp, const char *s) {
    for (const char *c = s; *c; c++) fputc(*c == '\n' || *c == '\r' ? ' ' : *c, gp);
}

/* A log2 byte axis (`axis` 'x' or 'y') labelled at every power of two of the data's range as "256B", "1KiB",
 * "16MiB" (gnuplot's own %b/%B format pads the mantissa: "256  B"). */
static void put_byte_tics(FILE *gp, const plot_data *d, char axis) {
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < d->n; i++)
        for (size_t k = 0; k < d->s[i].n; k++) {
            /* y: the point and its interval (a line across traces), which gnuplot's autoscale includes */
            double v[3] = {axis == 'y' ? d->s[i].y[k] : d->s[i].x[k], axis == 'y' ? d->s[i].lo[k] : 0,
                           axis == 'y' ? d->s[i].hi[k] : 0};
            for (int j = 0; j < 3; j++)
                if (v[j] > 0) {
                    if (v[j] < lo) lo = v[j];
                    if (v[j] > hi) hi = v[j];
                }
        }
    fprintf(gp, "set logscale %c 2\n", axis);
    if (!(lo <= hi)) return;
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int e0 = (int)floor(log2(lo)), e1 = (int)ceil(log2(hi));
    if (e1 == e0) e1++;
    fprintf(gp, "set %ctics (", axis);
    for (int e = e0; e <= e1; e++) {
        int u = e >= 0 ? e / 10 : 0;
        if (u > 5) u = 5;
        fprintf(gp, "%s\"%.10g%s\" %.17g", e > e0 ? ", " : "", ldexp(1.0, e - 10 * u), units[u], ldexp(1.0, e));
    }
    fprintf(gp, ")\n");
}

static void put_data(FILE *gp, const plot_series *s) {
    fprintf(gp, "# series: ");
    put_one_line(gp, s->label);
    fputc('\n', gp);
    for (size_t k = 0; k < s->n; k++) {
        if (s->brk && s->brk[k]) fputc('\n', gp); /* a blank line: gnuplot does not join the points across it */
        /* across traces: x, mean, interval, traces (the n gnuplot does not draw: the legend and marks say it) */
        if (s->across)
            fprintf(gp, "%.17g %.17g %.17g %.17g %" PRId64 "\n", s->x[k], s->y[k], s->lo[k], s->hi[k], s->pt_count[k]);
        else fprintf(gp, "%.17g %.17g\n", s->x[k], s->y[k]);
    }
    /* Every point left off a log axis: one undefined point keeps the series' key entry (whose label says why
     * nothing is drawn); an empty block would drop it with a warning. */
    if (s->n == 0 && s->n_off > 0) fprintf(gp, "%.17g NaN%s\n", s->off_x, s->across ? " NaN NaN 0" : "");
    fprintf(gp, "e\n");
}

/* Does line s (across traces) mark points: those with fewer traces than its most. */
static int marks_counts(const plot_series *s) { return s->across && s->n_max >= 2 && s->n_min < s->n_max; }

/* The marks of the points of line s with fewer traces than its most: "x y n=K" (a labels element). */
static void put_count_marks(FILE *gp, const plot_series *s) {
    fprintf(gp, "# point counts: ");
    put_one_line(gp, s->label);
    fputc('\n', gp);
    int any = 0;
    for (size_t k = 0; k < s->n; k++)
        if (s->pt_count[k] < s->n_max) {
            fprintf(gp, "%.17g %.17g n=%" PRId64 "\n", s->x[k], s->y[k], s->pt_count[k]);
            any = 1;
        }
    if (!any) fprintf(gp, "%.17g NaN n=0\n", s->n ? s->x[0] : 1.0); /* all left off a log axis: nothing drawn */
    fprintf(gp, "e\n");
}

/* A prepared plot: everything read from the database and laid out, ready to be written as a script. */
struct kvs_plot {
    kvs_plot_kind kind;
    int is_svg;
    char *out_path; /* owned copy of opt->out_path */
    char *gnuplot;  /* owned copy of opt->gnuplot, or NULL for "gnuplot" */
    plot_text t;
    plot_data d;
    kvs_plot_layout layout;
    kvs_plot_drift *drift; /* the drift kinds: their own data and script (plot_drift.h) */
    kvs_plot_heads *heads; /* the heads kinds (plot_heads.h): their own data and script */
};

/* ------------------------------------------------------------------------------------------------
 * Layout. gnuplot lays the key out itself and neither wraps nor shortens a title: a column is as wide as ITS
 * estimate of the longest title (characters x its character width) plus the line sample, and a key wider
 * than the canvas is cut off at both edges. A vertical key also takes no more rows than the plot area is
 * high, however tall the canvas, so with many series it spreads into columns that do not fit (the bug this
 * replaces: 10 long labels, `maxrows 6`, 2 columns cut off, half the entries lost). A horizontal key has
 * `maxcols` columns at most and as many rows as the entries need. So the columns are chosen here, from the
 * longest label and the canvas width, and the canvas is made tall enough for the rows.
 * ---------------------------------------------------------------------------------------------- */

enum {
    LAYOUT_WIDTH = 1200,    /* canvas width unless a label needs more */
    LAYOUT_CHAR_PX = 8,     /* gnuplot's character width (GPVAL_TERM_HCHAR): pngcairo 'Sans,10' 8 px, svg
                             * 'Sans,11' 7.7 px; the glyphs drawn are narrower (about 6.5 px) */
    LAYOUT_ROW_PX_PNG = 16, /* one key row (GPVAL_TERM_VCHAR): pngcairo 15.5 px */
    LAYOUT_ROW_PX_SVG = 17, /* svg 16.5 px */
    LAYOUT_COL_CHARS = 8,   /* a key column beyond its title: gnuplot's line sample and gaps (6 characters and
                             * a tic) and one character to spare */
    LAYOUT_SIDE_PX = 90,    /* each side of the canvas outside the key: the key is centred on the plot area,
                             * which leaves the y tics and label on the left */
    LAYOUT_PLOT_PX = 640,   /* canvas above the key */
    LAYOUT_TOP_PX = 40,     /* of which above the plot area: the title */
    LAYOUT_XAXIS_PX = 50,   /* and under it: the x tics and label */
};

/* UTF-8 characters of s (gnuplot measures titles in characters). */
static int utf8_chars(const char *s) {
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static kvs_plot_layout layout_key(const plot_data *d, int is_svg) {
    kvs_plot_layout l = {.width = LAYOUT_WIDTH, .plot_height = LAYOUT_PLOT_PX};
    for (size_t i = 0; i < d->n; i++) {
        int n = utf8_chars(d->s[i].label ? d->s[i].label : "");
        if (n > l.longest) l.longest = n;
    }
    l.n_entries = (int)d->n;
    int col_px = LAYOUT_CHAR_PX * (l.longest + LAYOUT_COL_CHARS);
    int room = LAYOUT_WIDTH - 2 * LAYOUT_SIDE_PX;
    if (col_px > room) l.width = col_px + 2 * LAYOUT_SIDE_PX; /* one column, as wide as its label */
    l.key_cols = col_px > room ? 1 : room / col_px;
    if (l.key_cols > l.n_entries) l.key_cols = l.n_entries > 0 ? l.n_entries : 1;
    l.key_rows = (l.n_entries + l.key_cols - 1) / l.key_cols;
    if (l.key_rows < 1) l.key_rows = 1;
    l.key_cols = (l.n_entries + l.key_rows - 1) / l.key_rows; /* the same rows with no empty column */
    if (l.key_cols < 1) l.key_cols = 1;
    /* One row spare for gnuplot's key box padding, and a small gap to the canvas edge. */
    l.key_height = (l.key_rows + 1) * (is_svg ? LAYOUT_ROW_PX_SVG : LAYOUT_ROW_PX_PNG) + 8;
    l.height = l.plot_height + l.key_height;
    return l;
}

kvs_plot_layout kvs_plot_layout_of(const kvs_plot *p) {
    if (!p) return (kvs_plot_layout){0};
    return p->layout;
}

/* The turns of a position plot's traces: each turn's prompt shaded (its right edge is the prompt/response
 * boundary; clipped to the plot area), and at each later turn's start, where it lies within the plotted
 * positions, a dashed line labelled "turn N" (arrows and labels are not clipped, hence the range check).
 * A boundary several traces share is drawn once. */
static void put_turn_marks(FILE *gp, const plot_data *d) {
    double xmin = INFINITY, xmax = -INFINITY;
    for (size_t i = 0; i < d->n; i++)
        for (size_t k = 0; k < d->s[i].n; k++) {
            if (d->s[i].x[k] < xmin) xmin = d->s[i].x[k];
            if (d->s[i].x[k] > xmax) xmax = d->s[i].x[k];
        }
    size_t n_with = 0;
    for (size_t i = 0; i < d->n_tr; i++) n_with += d->tr[i].n > 0;
    int n_objects = 0, n_arrows = 0;
    for (size_t i = 0; i < d->n_tr; i++) {
        const trace_turns *t = &d->tr[i];
        for (int64_t k = 0; k < t->n; k++) {
            const kvs_turn *u = &t->turns[k];
            int seen_span = 0, seen_start = 0;
            for (size_t j = 0; j < i; j++)
                for (int64_t q = 0; q < d->tr[j].n; q++) {
                    const kvs_turn *v = &d->tr[j].turns[q];
                    seen_span |= v->begin == u->begin && v->prompt_end == u->prompt_end;
                    seen_start |= q > 0 && v->begin == u->begin;
                }
            fprintf(gp, "# turn %" PRId64 " of ", k + 1);
            put_one_line(gp, t->path);
            fprintf(gp, ": prompt [%" PRId64 ", %" PRId64 "), response [%" PRId64 ", %" PRId64 ")\n", u->begin,
                    u->prompt_end, u->prompt_end, u->end);
            if (u->prompt_end > u->begin && !seen_span)
                fprintf(gp, "set object %d rect from first %" PRId64 ", graph 0 to first %" PRId64 ", graph 1 behind "
                            "clip fillcolor rgb '#e6e6e6' fillstyle solid 1.0 noborder\n",
                        ++n_objects, u->begin, u->prompt_end);
            if (k == 0 || seen_start || (double)u->begin < xmin || (double)u->begin > xmax) continue;
            fprintf(gp, "set arrow %d from first %" PRId64 ", graph 0 to first %" PRId64 ", graph 1 nohead dt 2 lw 1 "
                        "lc rgb '#555555' front\n",
                    ++n_arrows, u->begin, u->begin);
            char text[600];
            snprintf(text, sizeof text, "%s%sturn %" PRId64, n_with > 1 ? t->path : "", n_with > 1 ? " " : "",
                     k + 1);
            fprintf(gp, "set label %d ", n_arrows);
            kvs_plot_gp_string(gp, text);
            fprintf(gp, " at first %" PRId64 ", graph 1 offset 0.4,-1 left textcolor rgb '#555555' front\n", u->begin);
        }
    }
}

static void write_script(FILE *gp, const kvs_plot *p, const char *image_path) {
    if (p->drift) {
        kvs_plot_drift_write_script(p->drift, p->is_svg, image_path, gp);
        return;
    }
    if (p->heads) {
        kvs_plot_heads_write_script(gp, p->heads, p->is_svg, image_path);
        return;
    }
    const plot_text *t = &p->t;
    const plot_data *d = &p->d;
    const kvs_plot_layout *l = &p->layout;
    /* noenhanced: labels contain '_' and '^' (params, metric names) that enhanced text would typeset. */
    if (p->is_svg)
        fprintf(gp, "set terminal svg size %d,%d noenhanced font 'Sans,11' background rgb 'white'\n", l->width,
                l->height);
    else fprintf(gp, "set terminal pngcairo size %d,%d noenhanced font 'Sans,10'\n", l->width, l->height);
    fprintf(gp, "set encoding utf8\nset output ");
    kvs_plot_gp_string(gp, image_path);
    fprintf(gp, "\nset title ");
    kvs_plot_gp_string(gp, t->title);
    fprintf(gp, "\nset xlabel ");
    kvs_plot_gp_string(gp, t->xlabel);
    fprintf(gp, "\nset ylabel ");
    kvs_plot_gp_string(gp, t->ylabel);
    /* Legend under the plot (labels carry every parameter and would squeeze the plot area beside it), in the
     * columns chosen by layout_key() ("height 1": a row's space under the last one); the margins in screen
     * coordinates keep the plot area the same size above a key of any height. */
    fprintf(gp, "\nset grid\nset key outside below center horizontal maxcols %d Left reverse height 1\n", l->key_cols);
    fprintf(gp, "set tmargin at screen %.6f\nset bmargin at screen %.6f\n",
            1.0 - (double)LAYOUT_TOP_PX / l->height, (double)(l->key_height + LAYOUT_XAXIS_PX) / l->height);
    if (p->kind == KVS_PLOT_ERROR_VS_POSITION) put_turn_marks(gp, d);
    /* Lines across traces: a little room left and right, or the bars and "n=K" marks of the first and last budget
     * sit on the border, where gnuplot drops a label (its point reads as out of range). */
    int across = 0;
    for (size_t i = 0; i < d->n; i++) across |= d->s[i].across;
    if (across) fprintf(gp, "set offsets graph 0.03, graph 0.03, 0, 0\n");
    if (t->x == AXIS_LOG_TOKENS) fprintf(gp, "set logscale x 2\nset format x '%%g'\n");
    else if (t->x == AXIS_LOG_BYTES) put_byte_tics(gp, d, 'x');
    if (t->y == AXIS_LOG_BYTES) put_byte_tics(gp, d, 'y');
    else if (t->y == AXIS_LOG10) fprintf(gp, "set logscale y 10\nset format y '%%g'\n");
    fprintf(gp, "plot ");
    /* The frontier first, so the policies' lines are drawn over it; then the series in legend order. */
    int first = 1;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < d->n; i++) {
            const plot_series *s = &d->s[i];
            if ((s->style == STYLE_FRONTIER) != (pass == 0)) continue;
            fprintf(gp, "%s", first ? "" : ", \\\n     ");
            first = 0;
            if (s->style == STYLE_FRONTIER) {
                fprintf(gp, "'-' using 1:2 with steps lw 8 lc rgb '#b8b8b8' title ");
                kvs_plot_gp_string(gp, s->label);
                fprintf(gp, ", \\\n     '-' using 1:2 with points pt 7 ps 1.8 lc rgb '#b8b8b8' notitle");
                continue;
            }
            /* The policy's style, the same on every plot (kvs_plot_policy_style); the k-th series of one
             * policy in legend order is its variant k. Oracles black, dashed. A line of many points (a position
             * series) marks every few points only, so that the marker still reads as a marker. A codec's series
             * (K/V quantized) is its policy's colour drawn thin (lw 1; K/V as captured lw 2), after the policy's
             * own series in legend order, so it reads as the same policy on cheaper bytes. */
            int k = 0;
            for (size_t j = 0; j < i; j++)
                k += d->s[j].style != STYLE_FRONTIER && d->s[j].style == s->style && !strcmp(d->s[j].policy, s->policy);
            kvs_plot_style st = kvs_plot_policy_style(s->policy, k, s->style == STYLE_ORACLE);
            size_t every = s->n > 24 ? s->n / 12 : 1;
            int lw = s->codec[0] || s->page > 0 ? 1 : 2; /* a page size's series likewise */
            /* A line across traces: the mean with its interval as error bars (none when one trace is all it has:
             * there is no interval to draw), and the points with fewer traces than the rest marked "n=K". */
            if (s->across && s->n_max >= 2)
                fprintf(gp, "'-' using 1:2:3:4 with yerrorlines lw %d pt %d ps 1 dt %d lc rgb '%s' title ", lw,
                        st.point, st.dash, st.color);
            else
                fprintf(gp, "'-' using 1:2 with linespoints lw %d pt %d ps 1 pi %zu dt %d lc rgb '%s' title ", lw,
                        st.point, every, st.dash, st.color);
            kvs_plot_gp_string(gp, s->label);
            if (marks_counts(s))
                fprintf(gp, ", \\\n     '-' using 1:2:3 with labels offset 0,1 tc rgb '%s' notitle", st.color);
        }
    fprintf(gp, "\n");
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < d->n; i++) {
            const plot_series *s = &d->s[i];
            if ((s->style == STYLE_FRONTIER) != (pass == 0)) continue;
            put_data(gp, s);
            if (s->style == STYLE_FRONTIER) put_data(gp, s); /* the points element reads its own copy */
            if (marks_counts(s)) put_count_marks(gp, s);
        }
    fprintf(gp, "unset output\nexit\n");
}

/* Runs gnuplot with the script `write` writes (the caller blocks SIGPIPE, so a gnuplot that dies early is an
 * error status here instead of killing kvsim). */
static kvs_status run_gnuplot(const char *prog, kvs_plot_script_fn write, const void *ctx, const char *image_path) {
    char cmd[PATH_MAX * 4 + 32], quoted[PATH_MAX * 4];
    sh_quote(quoted, sizeof quoted, prog);
    snprintf(cmd, sizeof cmd, "exec %s", quoted);
    fflush(NULL); /* so buffered output of ours is not duplicated or interleaved by the child */
    FILE *gp = popen(cmd, "w");
    if (!gp) return kvs_fail(KVS_ERR_EXTERNAL, "cannot start gnuplot (%s): %s", prog, strerror(errno));
    write(gp, ctx, image_path);
    fflush(gp);
    int write_failed = ferror(gp);
    int status = pclose(gp);
    if (status == -1) return kvs_fail(KVS_ERR_EXTERNAL, "gnuplot (%s): cannot wait for it: %s", prog, strerror(errno));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        return kvs_fail(KVS_ERR_EXTERNAL, "gnuplot not found: could not run '%s'", prog);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return kvs_fail(KVS_ERR_EXTERNAL, "gnuplot (%s) failed (%s %d); its messages are above", prog,
                        WIFEXITED(status) ? "exit status" : "signal",
                        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    if (write_failed) return kvs_fail(KVS_ERR_EXTERNAL, "gnuplot (%s): writing the script to its input failed", prog);
    return KVS_OK;
}

/* Copies the image gnuplot wrote at `path` into the output. */
static kvs_status deliver(const char *path, kvs_out *o) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return kvs_fail(KVS_ERR_EXTERNAL, "gnuplot exited 0 but wrote no output");
    if (fd < 0) return kvs_fail(KVS_ERR_IO, "%s: cannot open gnuplot's image: %s", path, strerror(errno));
    char buf[1 << 16];
    kvs_status rc = KVS_OK;
    int64_t total = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) rc = kvs_fail(KVS_ERR_IO, "%s: cannot read gnuplot's image: %s", path, strerror(errno));
        if (n <= 0 || (rc = kvs_out_write(o, buf, (size_t)n)) != KVS_OK) break;
        total += n;
    }
    close(fd);
    if (rc == KVS_OK && total == 0) rc = kvs_fail(KVS_ERR_EXTERNAL, "gnuplot exited 0 but wrote no output");
    return rc;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcasecmp(s + n - k, suffix);
}

/* The axis label of a statistic of a metric. A quality axis: "rel. output error, p95 (out_err_p95)" plus the
 * unit and `extra`. A bytes axis, the one convention of every memory and traffic axis (x of error-vs-memory /
 * -traffic, y of memory-vs-budget): what is counted (the metric's label names the bytes), per what, which
 * statistic over the run's steps, the column and the log2 scale, e.g. "resident bytes per KV head, mean over
 * steps (storage_bytes_mean; log2 scale)"; its tics carry the unit, B / KiB / MiB (put_byte_tics). Short
 * enough to fit along the y axis of memory-vs-budget (550 px of plot area, about 85 characters). `traces` follows
 * the statistic: ", mean over traces" on a line across traces' axes, else "". */
static void axis_label(char *buf, size_t cap, kvs_metric m, kvs_stat_kind s, const char *extra, const char *traces) {
    const kvs_metric_info *mi = &kvs_metric_table[m];
    if (mi->kind == KVS_METRIC_BYTES)
        snprintf(buf, cap, "%s per KV head, %s over steps%s (%s_%s; log2 scale)", mi->label, kvs_stat_names[s], traces,
                 mi->name, kvs_stat_names[s]);
    else
        snprintf(buf, cap, "%s, %s%s (%s_%s%s%s%s)", mi->label, kvs_stat_names[s], traces, mi->name, kvs_stat_names[s],
                 mi->unit[0] ? "; " : "", mi->unit, extra);
}

/* PNG or SVG: --format when given (it must agree with a .png/.svg name), else the name's extension, else PNG
 * for what has no file name to go by: standard output, a descriptor, a device or a FIFO. A file named
 * otherwise is refused rather than written as PNG under a misleading name. */
kvs_status kvs_plot_image_format(const char *out_path, const char *format, int *is_svg) {
    int ext_svg = ends_with(out_path, ".svg"), ext_png = ends_with(out_path, ".png");
    if (format) {
        if (strcmp(format, "png") && strcmp(format, "svg"))
            return kvs_fail(KVS_ERR_INVALID_ARG, "--format: '%s' is not png or svg", format);
        *is_svg = !strcmp(format, "svg");
        if ((*is_svg && ext_png) || (!*is_svg && ext_svg))
            return kvs_fail(KVS_ERR_INVALID_ARG, "--format %s does not match --out '%s'", format, out_path);
        return KVS_OK;
    }
    *is_svg = ext_svg;
    if (ext_svg || ext_png) return KVS_OK;
    kvs_out_kind kind = KVS_OUT_FILE;
    char *target = NULL;
    kvs_status rc = kvs_out_resolve(out_path, &kind, &target);
    free(target);
    if (rc == KVS_OK && kind != KVS_OUT_FILE) return KVS_OK;
    return kvs_fail(KVS_ERR_INVALID_ARG, "--out: '%s' must end in .png or .svg (or give --format png|svg)", out_path);
}

void kvs_plot_free(kvs_plot *p) {
    if (!p) return;
    plot_data_free(&p->d);
    kvs_plot_drift_free(p->drift);
    kvs_plot_heads_free(p->heads);
    free(p->out_path);
    free(p->gnuplot);
    free(p);
}

size_t kvs_plot_n_series(const kvs_plot *p) {
    return !p ? 0 : p->drift ? kvs_plot_drift_n_series(p->drift) : p->heads ? 1 : p->d.n;
}

kvs_status kvs_plot_prepare(const char *db_path, const kvs_plot_options *o, kvs_plot **out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "plot: NULL output handle");
    *out = NULL;
    if (!db_path || !o) return kvs_fail(KVS_ERR_INVALID_ARG, "plot: NULL database path or options");
    if (!o->out_path || !o->out_path[0]) return kvs_fail(KVS_ERR_INVALID_ARG, "--out: an output file is required");
    int is_svg = 0;
    kvs_status rc = kvs_plot_image_format(o->out_path, o->format, &is_svg);
    if (rc != KVS_OK) return rc;
    if ((int)o->kind < 0 || (int)o->kind >= KVS_PLOT_N_KINDS)
        return kvs_fail(KVS_ERR_INVALID_ARG, "plot: bad kind %d", (int)o->kind);
    if (o->across_traces && o->kind != KVS_PLOT_ERROR_VS_BUDGET && o->kind != KVS_PLOT_MEMORY_VS_BUDGET &&
        !is_cost_kind(o->kind))
        return kvs_fail(KVS_ERR_INVALID_ARG, "--across-traces applies to --kind error-vs-budget, memory-vs-budget, "
                                             "error-vs-memory and error-vs-traffic (not %s)",
                        kind_names[o->kind]);
    if (o->log_y && o->kind != KVS_PLOT_ERROR_VS_BUDGET && !is_cost_kind(o->kind))
        return kvs_fail(KVS_ERR_INVALID_ARG, "--log-y applies to --kind error-vs-budget, error-vs-memory and "
                                             "error-vs-traffic%s",
                        o->kind == KVS_PLOT_MEMORY_VS_BUDGET ? " (memory-vs-budget's bytes axis is log2 already)" : "");
    if (is_drift_kind(o->kind)) {
        if (o->metric) return kvs_plot_metric_check(o->kind, o->metric);
        kvs_plot *dp = calloc(1, sizeof *dp);
        if (!dp) return nomem();
        dp->kind = o->kind;
        dp->is_svg = is_svg;
        if (!(dp->out_path = strdup(o->out_path)) || (o->gnuplot && !(dp->gnuplot = strdup(o->gnuplot))) ||
            (rc = kvs_plot_drift_prepare(db_path, o, &dp->drift)) != KVS_OK) {
            kvs_plot_free(dp);
            return rc != KVS_OK ? rc : nomem();
        }
        *out = dp;
        return KVS_OK;
    }
    if (kvs_plot_heads_kind(o->kind)) {
        kvs_plot *hp = calloc(1, sizeof *hp);
        if (!hp) return nomem();
        hp->kind = o->kind;
        hp->is_svg = is_svg;
        if (!(hp->out_path = strdup(o->out_path)) || (o->gnuplot && !(hp->gnuplot = strdup(o->gnuplot))))
            rc = nomem();
        else rc = kvs_plot_heads_prepare(db_path, o, &hp->heads);
        if (rc == KVS_OK) *out = hp;
        else kvs_plot_free(hp);
        return rc;
    }
    const char *metric_name = o->metric ? o->metric : default_metric(o->kind);
    rc = kvs_plot_metric_check(o->kind, metric_name);
    if (rc != KVS_OK) return rc;
    kvs_metric ym;
    kvs_stat_kind ys;
    kvs_results_column_parse(metric_name, &ym, &ys);
    kvs_stat_kind xs = KVS_STAT_MEAN;
    if (o->x_stat && !strcmp(o->x_stat, "max")) xs = KVS_STAT_MAX;
    else if (o->x_stat && strcmp(o->x_stat, "mean") != 0)
        return kvs_fail(KVS_ERR_INVALID_ARG, "--x-stat: '%s' is not mean or max", o->x_stat);
    if (o->measure && strcmp(o->measure, "decode") && strcmp(o->measure, "prefill") && strcmp(o->measure, "all"))
        return kvs_fail(KVS_ERR_INVALID_ARG, "--measure: '%s' is not decode, prefill or all", o->measure);

    kvs_results_db *db = NULL;
    kvs_results_run_row *rows = NULL;
    int64_t n_rows = 0;
    char where[512] = "";
    kvs_plot *p = calloc(1, sizeof *p);
    if (!p) return nomem();
    p->kind = o->kind;
    p->is_svg = is_svg;
    p->t.x = AXIS_LOG_TOKENS;
    if (!(p->out_path = strdup(o->out_path)) || (o->gnuplot && !(p->gnuplot = strdup(o->gnuplot)))) {
        kvs_plot_free(p);
        return nomem();
    }
    plot_data *dd = &p->d;
    plot_text *tt = &p->t;

    KVS_TRY(rc = kvs_results_open_readonly(db_path, &db));
    kvs_results_filter f = {.policy = o->policy, .trace_path = o->trace, .trace_sha256 = o->trace_sha256, .model = o->model, .measure = o->measure,
                            .with_layers = o->layer >= 0};
    if (o->kind == KVS_PLOT_ERROR_VS_POSITION && o->budget_tokens > 0) f.budget_tokens = o->budget_tokens;
    KVS_TRY(rc = kvs_results_query_runs(db, &f, &rows, &n_rows));
    if (n_rows == 0) {
        char sel[512] = "";
        size_t len = 0;
        if (o->policy) len += (size_t)snprintf(sel + len, sizeof sel - len, " of policy '%s'", o->policy);
        if (o->trace && len < sizeof sel) len += (size_t)snprintf(sel + len, sizeof sel - len, " of trace '%s'", o->trace);
        if (o->model && len < sizeof sel) len += (size_t)snprintf(sel + len, sizeof sel - len, " of model '%s'", o->model);
        if (o->measure && len < sizeof sel) snprintf(sel + len, sizeof sel - len, " with measure '%s'", o->measure);
        if (o->kind == KVS_PLOT_ERROR_VS_POSITION && o->budget_tokens > 0) {
            len = strlen(sel);
            if (len < sizeof sel) snprintf(sel + len, sizeof sel - len, " at budget %" PRId64, o->budget_tokens);
        }
        rc = kvs_fail(KVS_ERR_DB, "%s: no complete runs%s in the database: nothing to plot", db_path, sel);
        goto cleanup;
    }

    const char *base = kvs_path_base(db_path);
    size_t len = 0;
    if (o->policy) len += (size_t)snprintf(where + len, sizeof where - len, ", policy %s", o->policy);
    if (o->trace && len < sizeof where) len += (size_t)snprintf(where + len, sizeof where - len, ", trace %s", o->trace);
    if (o->model && len < sizeof where) len += (size_t)snprintf(where + len, sizeof where - len, ", model %s", o->model);
    if (o->measure && len < sizeof where)
        len += (size_t)snprintf(where + len, sizeof where - len, ", measure %s", o->measure);
    const kvs_metric_info *mi = &kvs_metric_table[ym];
    if (o->kind == KVS_PLOT_ERROR_VS_POSITION) {
        KVS_TRY(rc = read_position_points(db, rows, n_rows, o->layer, ym, dd));
        len = strlen(where);
        if (o->budget_tokens > 0 && len < sizeof where)
            snprintf(where + len, sizeof where - len, ", budget %" PRId64 " tokens", o->budget_tokens);
        len = strlen(where);
        if (len < sizeof where) {
            if (o->layer >= 0) snprintf(where + len, sizeof where - len, ", layer %d", o->layer);
            else snprintf(where + len, sizeof where - len, ", mean over layers");
        }
        snprintf(tt->title, sizeof tt->title, "%s per position (mean over query heads%s) - %s", metric_name, where, base);
        int64_t most_turns = 0; /* what put_turn_marks draws, said under the axis */
        for (size_t i = 0; i < dd->n_tr; i++)
            if (dd->tr[i].n > most_turns) most_turns = dd->tr[i].n;
        snprintf(tt->xlabel, sizeof tt->xlabel, "position in the sequence (tokens)%s",
                 most_turns > 1   ? "; shaded: the prompt of each turn; dashed: start of a turn"
                 : most_turns > 0 ? "; shaded: prompt positions"
                                  : "");
        snprintf(tt->ylabel, sizeof tt->ylabel, "%s, mean over query heads (%s%s%s)", mi->label, mi->name,
                 mi->unit[0] ? "; " : "", mi->unit);
        tt->x = AXIS_LINEAR;
    } else {
        int xm = -1;
        if (o->kind == KVS_PLOT_ERROR_VS_MEMORY) xm = KVS_M_STORAGE;
        else if (o->kind == KVS_PLOT_ERROR_VS_TRAFFIC) xm = KVS_M_TRAFFIC;
        KVS_TRY(rc = read_run_points(rows, n_rows, o->layer, ym, ys, xm, xs, dd));
        len = strlen(where);
        if (len < sizeof where) {
            if (o->layer >= 0) snprintf(where + len, sizeof where - len, ", layer %d", o->layer);
            else snprintf(where + len, sizeof where - len, ", run-wide aggregate");
        }
        const char *over = o->across_traces ? ", mean over traces" : "";
        axis_label(tt->ylabel, sizeof tt->ylabel, ym, ys, o->log_y ? "; log scale" : "", over);
        if (o->kind == KVS_PLOT_MEMORY_VS_BUDGET) tt->y = AXIS_LOG_BYTES;
        else if (o->log_y) tt->y = AXIS_LOG10;
        if (xm >= 0) {
            snprintf(tt->title, sizeof tt->title, "%s vs measured %s (%s) - %s", metric_name,
                     xm == KVS_M_STORAGE ? "memory" : "traffic", where + 2, base);
            axis_label(tt->xlabel, sizeof tt->xlabel, (kvs_metric)xm, xs, "",
                       o->across_traces ? ", mean over traces at each budget" : "");
            tt->x = AXIS_LOG_BYTES;
        } else if (o->kind == KVS_PLOT_MEMORY_VS_BUDGET) {
            snprintf(tt->title, sizeof tt->title, "%s vs budget (%s) - %s", metric_name, where + 2, base);
            snprintf(tt->xlabel, sizeof tt->xlabel, "KV budget per KV head (tokens, log2 scale)");
        } else {
            snprintf(tt->title, sizeof tt->title, "%s vs KV budget (%s) - %s", metric_name, where + 2, base);
            snprintf(tt->xlabel, sizeof tt->xlabel, "KV budget per KV head (tokens, log2 scale)");
        }
    }
    /* Series without a point would only add an empty key entry (and '-' needs at least one row). */
    size_t w = 0;
    for (size_t i = 0; i < dd->n; i++) {
        if (dd->s[i].n > 0) dd->s[w++] = dd->s[i];
        else series_free(&dd->s[i]);
    }
    dd->n = w;
    if (dd->n == 0) {
        if (o->kind == KVS_PLOT_ERROR_VS_POSITION)
            rc = kvs_fail(KVS_ERR_DB, "%s: no data for %s%s: the selected complete runs have no per-step samples "
                                      "(steps table) of %s",
                          db_path, kind_names[o->kind], where, mi->name);
        else if (is_cost_kind(o->kind))
            rc = kvs_fail(KVS_ERR_DB, "%s: no data for %s%s: the selected complete runs have no recorded %s and %s_%s "
                                      "(runs written before these metrics were recorded read as not recorded)",
                          db_path, kind_names[o->kind], where, metric_name,
                          kvs_metric_table[o->kind == KVS_PLOT_ERROR_VS_MEMORY ? KVS_M_STORAGE : KVS_M_TRAFFIC].name,
                          kvs_stat_names[xs]);
        else
            rc = kvs_fail(KVS_ERR_DB, "%s: no data for %s%s: the selected complete runs have no aggregate rows with a "
                                      "positive budget and a recorded %s",
                          db_path, kind_names[o->kind], where, metric_name);
        goto cleanup;
    }
    for (size_t i = 0; i < dd->n; i++) {
        series_finish(&dd->s[i]);
        if (o->kind == KVS_PLOT_ERROR_VS_POSITION)
            KVS_TRY(rc = series_breaks(&dd->s[i], turns_of(dd, dd->s[i].trace_id)));
    }
    if (o->across_traces) {
        KVS_TRY(rc = aggregate_traces(dd));
        len = strlen(tt->title);
        if (len < sizeof tt->title)
            snprintf(tt->title + len, sizeof tt->title - len, " - mean over traces, bars: 95%% bootstrap interval "
                                                                "(resampling traces)");
    }
    qsort(dd->s, dd->n, sizeof *dd->s, cmp_series);
    KVS_TRY(rc = label_series(dd, o->kind == KVS_PLOT_ERROR_VS_POSITION, !is_cost_kind(o->kind)));
    if (is_cost_kind(o->kind))
        KVS_TRY(rc = add_frontier(dd, mi->higher_is_better,
                                  o->across_traces ? "Pareto frontier (means over traces of the non-oracle lines)"
                                                   : "Pareto frontier (non-oracle runs)"));
    if (tt->y != AXIS_LINEAR) KVS_TRY(rc = leave_off_log_axis(dd));
    p->layout = layout_key(dd, is_svg);
    kvs_results_run_rows_free(rows, n_rows);
    rows = NULL;
    kvs_results_close(db);
    db = NULL;

    *out = p;
    p = NULL;

cleanup:
    kvs_results_run_rows_free(rows, n_rows);
    kvs_results_close(db);
    kvs_plot_free(p);
    return rc;
}

kvs_status kvs_plot_write_script(const kvs_plot *p, const char *image_path, FILE *f) {
    if (!p || !image_path || !f) return kvs_fail(KVS_ERR_INVALID_ARG, "plot: NULL plot, image path or stream");
    write_script(f, p, image_path);
    if (fflush(f) != 0 || ferror(f))
        return kvs_fail(KVS_ERR_IO, "plot: writing the gnuplot script failed: %s", strerror(errno));
    return KVS_OK;
}

kvs_status kvs_plot_gnuplot_render(const char *gnuplot, const char *out_path, int is_svg, kvs_plot_script_fn write,
                                   const void *ctx) {
    if (!out_path || !write) return kvs_fail(KVS_ERR_INVALID_ARG, "plot: NULL output or script writer");
    char prog[PATH_MAX];
    const char *want = gnuplot ? gnuplot : "gnuplot";
    if (!find_program(want, prog, sizeof prog))
        return kvs_fail(KVS_ERR_EXTERNAL, "gnuplot not found ('%s' is not an executable on PATH); install gnuplot "
                                          "(Debian: apt-get install gnuplot-nox)",
                        want);
    /* SIGPIPE blocked for this thread while gnuplot reads the script and while the image goes to a pipe whose
     * reader may leave: either becomes an error status (EPIPE) instead of killing kvsim. */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    /* The output first, so an unwritable one is a clear I/O error before gnuplot runs (common/kvs_out.h: a
     * temporary file beside the symlink-resolved target, or the device, FIFO or descriptor itself). gnuplot
     * then draws into a private folder and the image is copied into the output: gnuplot opens the path it is
     * given with its own truncating open, which would replace neither a symbolic link's target atomically nor
     * append to standard output, and a device or FIFO would receive a half image when gnuplot fails. */
    kvs_out *o = NULL;
    char folder[PATH_MAX] = "", image[PATH_MAX + 16] = "";
    kvs_status rc = kvs_out_open(out_path, &o);
    if (rc != KVS_OK) goto restore;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0] || strpbrk(tmp, "\n\r")) tmp = "/tmp"; /* `set output` takes one line */
    snprintf(folder, sizeof folder, "%s/kvsim-plot.XXXXXX", tmp);
    if (!mkdtemp(folder)) {
        rc = kvs_fail(KVS_ERR_IO, "%s: cannot create a temporary folder for gnuplot's image: %s", folder,
                      strerror(errno));
        folder[0] = '\0';
        goto restore;
    }
    snprintf(image, sizeof image, "%s/plot.%s", folder, is_svg ? "svg" : "png");
    if ((rc = run_gnuplot(prog, write, ctx, image)) == KVS_OK) rc = deliver(image, o);
restore:
    if (rc == KVS_OK) rc = kvs_out_commit(o);
    else kvs_out_abort(o);
    if (image[0]) unlink(image);
    if (folder[0]) rmdir(folder);
    /* Drop a SIGPIPE raised while it was blocked, then restore the caller's mask. */
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE)) {
        struct timespec zero = {0, 0};
        sigtimedwait(&block, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* The script writer of a prepared plot, for kvs_plot_gnuplot_render. */
static void write_plot_script(FILE *gp, const void *ctx, const char *image_path) { write_script(gp, ctx, image_path); }

kvs_status kvs_plot_render(const kvs_plot *p) {
    if (!p) return kvs_fail(KVS_ERR_INVALID_ARG, "plot: NULL plot");
    return kvs_plot_gnuplot_render(p->gnuplot, p->out_path, p->is_svg, write_plot_script, p);
}

kvs_status kvs_plot_make(const char *db_path, const kvs_plot_options *o) {
    kvs_plot *p = NULL;
    kvs_status rc = kvs_plot_prepare(db_path, o, &p);
    if (rc == KVS_OK) rc = kvs_plot_render(p);
    kvs_plot_free(p);
    return rc;
}
