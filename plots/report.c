/* report.c — `kvsim report DB --out DIR`: the study report of a results database as one self-contained HTML page
 * and its Markdown twin (plots/report.h; ../shared/DESIGN.md "Results (SQLite) and plots"; the comparisons follow
 * POLICY_SPEC.md §1.5 "Budget-matching modes" through results/compare.h).
 *
 * Shape. `sections` below is the report: one line per section naming its anchor, its title and the function
 * that renders it. A section function reads the database through results/results.h (and results/compare.h, plots/plot.h
 * and, for analyses and plans, their results/results_<family>.h), writes its body to ctx->md and ctx->html, and
 * returns KVS_OK; when the database has nothing for it, it calls absent() with the reason instead, and the
 * report lists it under "Not in this database". Absent means known to be absent: the database passes SQLite's
 * integrity check (results/results_check.h) before the first section, a family's section counts its rows
 * before reading them, and a plot that reports no data is believed only while the check still passes. Any
 * other error fails the whole report (nothing is written).
 * Sections that come with other features (drift, heads, capacity plans) are added the same way when their
 * family headers exist: one function, one table line.
 *
 * Plots are drawn by plots/plot.h into the report's temporary folder as PNG; the HTML embeds each one as a
 * data:image/png;base64 URI (so report.html alone is the whole report) and the Markdown references the file.
 */
#include "../common/kvs_rng.h"
#include "report.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/kvs_out.h"
#include "../results/compare.h"
#include "../results/results.h"
#include "../results/results_check.h"
#include "../results/results_drift.h"
#include "../results/results_heads.h"
#include "../results/results_plan.h"
#include "../trace/trace.h"
#include "plot.h"

/* At most this many memory levels in the summary: more read as noise. */
#define MAX_LEVELS 8

/* ------------------------------------------------------------------------------------------------
 * The context every section gets
 * ---------------------------------------------------------------------------------------------- */

typedef struct {
    const kvs_report_options *opt;
    kvs_results_db *db;
    kvs_results_run_row *rows; /* every run, failed ones included, ascending id */
    int64_t n_rows;
    int64_t n_complete;
    const char *tmp_dir; /* the report folder being written */
    FILE *md, *html;     /* the current section's body */
    char absent[1024];   /* set by absent(): the section has nothing to show, and why */
    int n_images;
} report_ctx;

typedef struct {
    const char *anchor; /* HTML id, [a-z-] */
    const char *title;
    kvs_status (*render)(report_ctx *ctx);
} report_section;

static kvs_status absent(report_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static kvs_status absent(report_ctx *ctx, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->absent, sizeof ctx->absent, fmt, ap);
    va_end(ap);
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Text: escaping, paragraphs and tables written to both outputs
 * ---------------------------------------------------------------------------------------------- */

static void html_text(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* A Markdown table cell or inline text: '|' and line breaks would end the cell, '<' could start HTML. */
static void md_text(FILE *f, const char *s) {
    for (; s && *s; s++) {
        if (*s == '|') fputs("\\|", f);
        else if (*s == '\n' || *s == '\r') fputc(' ', f);
        else if (*s == '<') fputs("&lt;", f);
        else fputc(*s, f);
    }
}

/* One paragraph of plain text in both outputs. */
static void para(report_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void para(report_ctx *ctx, const char *fmt, ...) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    md_text(ctx->md, buf);
    fputs("\n\n", ctx->md);
    fputs("<p>", ctx->html);
    html_text(ctx->html, buf);
    fputs("</p>\n", ctx->html);
}

static void subheading(report_ctx *ctx, const char *text) {
    fputs("### ", ctx->md);
    md_text(ctx->md, text);
    fputs("\n\n", ctx->md);
    fputs("<h3>", ctx->html);
    html_text(ctx->html, text);
    fputs("</h3>\n", ctx->html);
}

static void table_begin(report_ctx *ctx, int n, const char *const *head) {
    fputs("|", ctx->md);
    for (int i = 0; i < n; i++) {
        fputc(' ', ctx->md);
        md_text(ctx->md, head[i]);
        fputs(" |", ctx->md);
    }
    fputs("\n|", ctx->md);
    for (int i = 0; i < n; i++) fputs("---|", ctx->md);
    fputc('\n', ctx->md);
    fputs("<table>\n<tr>", ctx->html);
    for (int i = 0; i < n; i++) {
        fputs("<th>", ctx->html);
        html_text(ctx->html, head[i]);
        fputs("</th>", ctx->html);
    }
    fputs("</tr>\n", ctx->html);
}

static void table_row(report_ctx *ctx, int n, const char *const *cell) {
    fputs("|", ctx->md);
    for (int i = 0; i < n; i++) {
        fputc(' ', ctx->md);
        md_text(ctx->md, cell[i] && cell[i][0] ? cell[i] : "-");
        fputs(" |", ctx->md);
    }
    fputc('\n', ctx->md);
    fputs("<tr>", ctx->html);
    for (int i = 0; i < n; i++) {
        fputs("<td>", ctx->html);
        html_text(ctx->html, cell[i] && cell[i][0] ? cell[i] : "-");
        fputs("</td>", ctx->html);
    }
    fputs("</tr>\n", ctx->html);
}

static void table_end(report_ctx *ctx) {
    fputc('\n', ctx->md);
    fputs("</table>\n", ctx->html);
}

/* A metric value for a table: bytes with a binary prefix, tokens with one decimal, others 4 digits; "-" NaN. */
static void fmt_metric(char *buf, size_t cap, double v, kvs_metric m) {
    if (isnan(v)) snprintf(buf, cap, "-");
    else if (kvs_metric_table[m].kind == KVS_METRIC_BYTES) kvs_format_bytes(buf, cap, v);
    else if (kvs_metric_table[m].kind == KVS_METRIC_TOKENS) snprintf(buf, cap, "%.1f", v);
    else snprintf(buf, cap, "%.4g", v);
}


/* Appends one entry to a cell, after `sep` when the cell is not empty. */
static void cell_append(char *cell, size_t cap, const char *sep, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void cell_append(char *cell, size_t cap, const char *sep, const char *fmt, ...) {
    size_t len = strlen(cell);
    if (len && len < cap) len += (size_t)snprintf(cell + len, cap - len, "%s", sep);
    if (len >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cell + len, cap - len, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------------------------------
 * Plots: drawn into the report folder, embedded as data: URIs
 * ---------------------------------------------------------------------------------------------- */

static void base64(FILE *f, const unsigned char *p, size_t n) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        fputc(tab[v >> 18], f);
        fputc(tab[(v >> 12) & 63], f);
        fputc(tab[(v >> 6) & 63], f);
        fputc(tab[v & 63], f);
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        fprintf(f, "%c%c==", tab[v >> 18], tab[(v >> 12) & 63]);
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        fprintf(f, "%c%c%c=", tab[v >> 18], tab[(v >> 12) & 63], tab[(v >> 6) & 63]);
    }
}

/* Draws one plot as DIR/file and embeds it with `caption`. *drawn is 1 when it was drawn, 0 when the database has
 * nothing for it (the reason is then written in its place); other failures (gnuplot, I/O) are errors. */
static kvs_status plot(report_ctx *ctx, kvs_plot_options o, const char *file, const char *caption, int *drawn) {
    char path[4096];
    *drawn = 0;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", ctx->tmp_dir, file) >= sizeof path)
        return kvs_fail(KVS_ERR_IO, "report: path too long: %s/%s", ctx->tmp_dir, file);
    o.out_path = path;
    o.format = "png";
    o.gnuplot = ctx->opt->gnuplot;
    kvs_plot *p = NULL;
    kvs_status st = kvs_plot_prepare(ctx->opt->db_path, &o, &p);
    if (st == KVS_ERR_DB) {
        /* KVS_ERR_DB is both "nothing to draw" and "the database could not be read". The database passed
         * kvs_results_check before the first section; checked again now, an intact database means the plot
         * really has no data (said where the plot would be), and a failing one fails the report. */
        char why[1024];
        snprintf(why, sizeof why, "%s: not drawn (%s).", caption, kvs_last_error());
        if ((st = kvs_results_check(ctx->db)) != KVS_OK) return st;
        para(ctx, "%s", why);
        return KVS_OK;
    }
    if (st != KVS_OK) return st;
    st = kvs_plot_render(p);
    kvs_plot_free(p);
    if (st != KVS_OK) return st;
    char *png = NULL;
    size_t len = 0;
    if ((st = kvs_read_file(path, &png, &len)) != KVS_OK) return st;
    fprintf(ctx->md, "![");
    md_text(ctx->md, caption);
    fprintf(ctx->md, "](%s)\n\n", file);
    fputs("<figure><img alt=\"", ctx->html);
    html_text(ctx->html, caption);
    fputs("\" src=\"data:image/png;base64,", ctx->html);
    base64(ctx->html, (const unsigned char *)png, len);
    fputs("\"><figcaption>", ctx->html);
    html_text(ctx->html, caption);
    fputs("</figcaption></figure>\n", ctx->html);
    free(png);
    ctx->n_images++;
    *drawn = 1;
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Memory levels and comparisons
 * ---------------------------------------------------------------------------------------------- */

/* The x of a complete non-oracle run under `match` (NaN when not recorded). */
static double run_x(const kvs_results_run_row *w, kvs_compare_match match) {
    if (!w->has_agg || w->is_oracle) return NAN;
    double x = match == KVS_COMPARE_TOKENS ? (double)w->budget_tokens
                                           : kvs_results_stat_value(match == KVS_COMPARE_MEM ? &w->agg.storage_bytes
                                                                                             : &w->agg.traffic_bytes,
                                                                    KVS_STAT_MEAN);
    return isfinite(x) && x > 0 ? x : NAN;
}

/* The levels to compare at: the powers of two within [smallest, largest] x of the complete non-oracle runs
 * (every other one, or sparser, when there are more than MAX_LEVELS), or that smallest x alone when no power of
 * two lies in the range. Powers of two because they are the sizes people budget in; within the measured range
 * because compare never extrapolates, and because above the largest run the summary's answer stops changing. Returns how many (0: no run recorded x). */
static int levels_of(const kvs_results_run_row *rows, int64_t n, kvs_compare_match match, double *out) {
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        if (!rows[i].status || strcmp(rows[i].status, "complete")) continue;
        double x = run_x(&rows[i], match);
        if (isnan(x)) continue;
        if (x < lo) lo = x;
        if (x > hi) hi = x;
    }
    if (!(lo <= hi)) return 0;
    int p0 = (int)ceil(log2(lo)), p1 = (int)floor(log2(hi));
    if (p0 > p1) {
        out[0] = lo;
        return 1;
    }
    int count = p1 - p0 + 1, step = (count + MAX_LEVELS - 1) / MAX_LEVELS, k = 0;
    for (int p = p0; p <= p1 && k < MAX_LEVELS; p += step) out[k++] = ldexp(1.0, p);
    return k;
}

static const char *const compare_cols[] = {"out_err_mean",      "out_err_p95",          "attn_recall_mean",
                                           "topk_overlap_mean", "attended_tokens_mean", "storage_bytes_mean",
                                           "traffic_bytes_mean"};
#define N_COMPARE_COLS ((int)(sizeof compare_cols / sizeof compare_cols[0]))

#define KVS_CODEC_CELL_CAP 200 /* a canonical codec spec (KVS_CODEC_SPEC_MAX) and " page N max" */

/* A run's codec cell: its canonical spec, "-" for K/V as captured (the tables' "no value"), and its page size when
 * it has one ("page 16", "- page 16", with a score rule "- page 16 max"). Into buf. */
static const char *codec_cell_page(const kvs_results_run_row *w, char *buf, size_t cap) {
    const char *c = w->codec && w->codec[0] ? w->codec : "-";
    if (w->page > 0)
        snprintf(buf, cap, "%s page %" PRId64 "%s%s", c, w->page, w->page_score[0] ? " " : "", w->page_score);
    else snprintf(buf, cap, "%s", c);
    return buf;
}

static kvs_status compare_columns(kvs_compare_column *cols) {
    for (int c = 0; c < N_COMPARE_COLS; c++) {
        kvs_status st = kvs_compare_column_parse(compare_cols[c], &cols[c]);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

/* "mean [lo, hi] (n)" of an interval; the value and "(one trace: no interval)" over one trace; "-" over none. */
static void fmt_interval(char *buf, size_t cap, const kvs_interval *iv, kvs_metric m) {
    char a[64], b[64], c[64];
    if (iv->n == 0) {
        snprintf(buf, cap, "-");
        return;
    }
    fmt_metric(a, sizeof a, iv->mean, m);
    if (iv->n == 1) {
        snprintf(buf, cap, "%s (one trace: no interval)", a);
        return;
    }
    fmt_metric(b, sizeof b, iv->lo, m);
    fmt_metric(c, sizeof c, iv->hi, m);
    snprintf(buf, cap, "%s [%s, %s] (%zu)", a, b, c, iv->n);
}

/* The equal-cost tables over traces (results/compare.h "Across traces"): per (model, measure) with two or more
 * traces, each configuration's mean [lo, hi] (n) and the resolved orderings of its paired differences against the
 * best one. */
static kvs_status across_tables(report_ctx *ctx, const kvs_compare *cmp, const kvs_compare_across *ac,
                                const kvs_compare_column *cols) {
    para(ctx, "Over traces: with several traces of a model (one per prompt), each configuration's value at %s "
              "on each trace where it has one (as in the per-trace table below), their mean, its percentile bootstrap "
              "%g%% interval resampling traces [lo, hi] (%d resamples, seeded from what is compared: the same "
              "database gives the same intervals) and (n) the traces used (kvsim compare %s --match %s --at %.17g). "
              "An ordering of two configurations is resolved when the interval of their paired difference in "
              "out_err_mean (mean of a - b over the traces both have a value on) excludes 0.",
         kvs_compare_x_name(cmp), 100 * 0.95, KVS_BOOTSTRAP_REPS, kvs_path_base(ctx->opt->db_path),
         kvs_compare_match_name(kvs_compare_match_of(cmp)), kvs_compare_at(cmp));
    char one[2048] = "";
    for (size_t k = 0; k < kvs_compare_across_n_sets(ac); k++) {
        const kvs_compare_set *set = kvs_compare_across_set_at(ac, k);
        if (set->n_traces < 2) {
            cell_append(one, sizeof one, "; ", "%s (%s)", set->model[0] ? set->model : "unknown", set->measure);
            continue;
        }
        char sub[512];
        snprintf(sub, sizeof sub, "Model %s, measure %s: %zu traces", set->model[0] ? set->model : "unknown",
                 set->measure, set->n_traces);
        subheading(ctx, sub);
        const char *head[5 + N_COMPARE_COLS + 1];
        int nh = 0;
        head[nh++] = "policy";
        head[nh++] = "params";
        head[nh++] = "codec";
        head[nh++] = "flags";
        head[nh++] = "traces used";
        for (int c = 0; c < N_COMPARE_COLS; c++) head[nh++] = compare_cols[c];
        head[nh++] = "excluded";
        table_begin(ctx, nh, head);
        for (size_t gi = set->first; gi < set->first + set->n; gi++) {
            const kvs_compare_group *g = kvs_compare_across_group_at(ac, gi);
            char flags[KVS_COMPARE_FLAGS_CAP], used[64], vals[N_COMPARE_COLS][256], excl[2048];
            kvs_compare_group_flags(g, flags);
            snprintf(used, sizeof used, "%zu of %zu", g->n_used, set->n_traces);
            for (int c = 0; c < N_COMPARE_COLS; c++) fmt_interval(vals[c], sizeof vals[c], &g->col[c], cols[c].m);
            kvs_compare_group_excluded(ac, g, excl, sizeof excl);
            const char *cell[5 + N_COMPARE_COLS + 1];
            int n = 0;
            cell[n++] = g->rep->rep->policy;
            cell[n++] = g->rep->rep->params;
            char codec[KVS_CODEC_CELL_CAP];
            cell[n++] = codec_cell_page(g->rep->rep, codec, sizeof codec);
            cell[n++] = flags;
            cell[n++] = used;
            for (int c = 0; c < N_COMPARE_COLS; c++) cell[n++] = vals[c];
            cell[n++] = excl;
            table_row(ctx, n, cell);
        }
        table_end(ctx);
        if (set->best == SIZE_MAX) continue;
        /* each configuration with a value against the best one */
        const kvs_compare_group *best = kvs_compare_across_group_at(ac, set->best);
        char resolved[4096] = "", open_[4096] = "";
        for (size_t gi = set->first; gi < set->first + set->n; gi++) {
            const kvs_compare_group *g = kvs_compare_across_group_at(ac, gi);
            if (gi == set->best || g->col[0].n == 0) continue;
            kvs_compare_diff d;
            kvs_status st = kvs_compare_across_diff(ac, gi, set->best, 0, &d);
            if (st != KVS_OK) return st;
            if (d.resolved) { /* said as lower - higher, so the difference reads negative whichever comes first */
                int g_lower = d.resolved < 0;
                double sg = g_lower ? 1 : -1;
                double lo = g_lower ? d.d.lo : -d.d.hi, hi = g_lower ? d.d.hi : -d.d.lo;
                cell_append(resolved, sizeof resolved, "; ", "%s lower than %s (paired difference %+.4g [%+.4g, %+.4g] "
                                                           "over %zu traces)",
                            g_lower ? g->label : best->label, g_lower ? best->label : g->label, sg * d.d.mean, lo, hi,
                            d.d.n);
            }
            else if (d.d.n >= 2)
                cell_append(open_, sizeof open_, "; ", "%s vs %s (%+.4g [%+.4g, %+.4g] over %zu traces)", g->label,
                            best->label, d.d.mean, d.d.lo, d.d.hi, d.d.n);
            else
                cell_append(open_, sizeof open_, "; ", "%s vs %s (%zu trace%s in common: no interval)", g->label,
                            best->label, d.d.n, d.d.n == 1 ? "" : "s");
        }
        para(ctx, "Best by mean out_err_mean: %s. Resolved orderings: %s. Not resolved: %s.", best->label,
             resolved[0] ? resolved : "none", open_[0] ? open_ : "none");
    }
    if (one[0]) para(ctx, "One trace: no interval for %s (their values are in the per-trace table).", one);
    return KVS_OK;
}

/* The equal-cost table at X under `match` (the rows of `kvsim compare DB --match M --at X`). */
static kvs_status compare_table(report_ctx *ctx, kvs_compare_match match, double X) {
    kvs_compare_column cols[N_COMPARE_COLS];
    kvs_compare *cmp = NULL;
    kvs_status st = compare_columns(cols);
    /* kvsim compare's defaults: the mean bytes, and no interpolation across a jump wider than
     * KVS_COMPARE_MAX_RATIO (a gap: no configuration is there) */
    kvs_compare_opts copts = {.match = match, .at = X};
    if (st == KVS_OK) st = kvs_compare_create_opts(ctx->rows, ctx->n_rows, &copts, cols, N_COMPARE_COLS, &cmp);
    if (st != KVS_OK) return st;
    size_t n = kvs_compare_n_series(cmp), usable = 0;
    for (size_t i = 0; i < n; i++) usable += kvs_compare_series_at(cmp, i)->status <= KVS_COMPARE_EXACT;
    if (usable == 0) {
        kvs_compare_free(cmp);
        return absent(ctx, "no series has runs on both sides of %s = %.6g (every series out of range or without a "
                           "recorded %s)",
                      kvs_compare_match_x(match), X, kvs_compare_match_x(match));
    }
    char xb[64];
    kvs_format_bytes(xb, sizeof xb, X);
    /* Several traces of a model (one per prompt): the answer over them first, each trace's series after. */
    kvs_compare_across *ac = NULL;
    size_t max_traces = 0;
    if ((st = kvs_compare_across_create(cmp, &ac)) == KVS_OK && (max_traces = kvs_compare_across_max_traces(ac)) >= 2)
        st = across_tables(ctx, cmp, ac, cols);
    kvs_compare_across_free(ac);
    if (st != KVS_OK) {
        kvs_compare_free(cmp);
        return st;
    }
    if (max_traces >= 2) subheading(ctx, "Per trace");
    else para(ctx, "One trace per model: no interval (several traces of a model, one per prompt, give each policy's "
                   "mean over them with a bootstrap interval: examples/capture_prompts.sh).");
    para(ctx, "Every series (policy, params, KV codec, trace, measure) interpolated linearly in log(%s) to %s per KV head "
              "between the two runs that bracket it (kvsim compare %s --match %s --at %.17g); sorted by mean output "
              "error, best first. A series whose runs do not bracket it is listed as out of range, never "
              "extrapolated; one whose bracketing runs are more than %gx apart is a gap (no configuration of it is "
              "near there), never interpolated.",
         kvs_compare_match_x(match), xb, kvs_path_base(ctx->opt->db_path), kvs_compare_match_name(match), X,
         kvs_compare_max_ratio(cmp));
    const char *head[6 + N_COMPARE_COLS + 1];
    int nh = 0;
    head[nh++] = "policy";
    head[nh++] = "params";
    head[nh++] = "codec";
    head[nh++] = "flags";
    head[nh++] = "trace";
    head[nh++] = "measure";
    for (int c = 0; c < N_COMPARE_COLS; c++) head[nh++] = compare_cols[c];
    head[nh++] = "from runs";
    table_begin(ctx, nh, head);
    int any_o = 0, any_p = 0, any_n = 0;
    for (size_t i = 0; i < n; i++) {
        const kvs_compare_series *s = kvs_compare_series_at(cmp, i);
        char flags[KVS_COMPARE_FLAGS_CAP], vals[N_COMPARE_COLS][64], from[160], a[64], b[64];
        kvs_compare_series_flags(s, flags);
        any_o |= s->is_oracle;
        any_p |= s->prompt_only;
        any_n |= s->degenerate;
        int ok = s->status <= KVS_COMPARE_EXACT;
        for (int c = 0; c < N_COMPARE_COLS; c++) {
            if (ok) fmt_metric(vals[c], sizeof vals[c], s->val[c], cols[c].m);
            else snprintf(vals[c], sizeof vals[c], "-");
        }
        if (s->status == KVS_COMPARE_NO_X) snprintf(from, sizeof from, "no recorded %s", kvs_compare_match_x(match));
        else if (s->status == KVS_COMPARE_OUT_OF_RANGE) {
            kvs_format_bytes(a, sizeof a, s->pts[0].x);
            kvs_format_bytes(b, sizeof b, s->pts[s->n - 1].x);
            snprintf(from, sizeof from, "out of range [%s, %s]", a, b);
        } else if (s->status == KVS_COMPARE_EXACT)
            snprintf(from, sizeof from, "#%" PRId64 " (exact)", s->pts[s->lo].run_id);
        else if (s->status == KVS_COMPARE_INTERPOLATED)
            snprintf(from, sizeof from, "#%" PRId64 " .. #%" PRId64 " (t=%.3f)", s->pts[s->lo].run_id,
                     s->pts[s->hi].run_id, s->t);
        else if (s->status == KVS_COMPARE_GAP) {
            kvs_format_bytes(a, sizeof a, s->pts[s->lo].x);
            kvs_format_bytes(b, sizeof b, s->pts[s->hi].x);
            snprintf(from, sizeof from, "gap: #%" PRId64 " at %s .. #%" PRId64 " at %s", s->pts[s->lo].run_id, a,
                     s->pts[s->hi].run_id, b);
        }
        else /* a status results/compare.h gives no value for: its name, never a made-up bracket */
            snprintf(from, sizeof from, "%s: no value", kvs_compare_status_name(s->status));
        const char *cell[6 + N_COMPARE_COLS + 1];
        int k = 0;
        cell[k++] = s->rep->policy;
        cell[k++] = s->rep->params;
        char codec[KVS_CODEC_CELL_CAP];
        cell[k++] = codec_cell_page(s->rep, codec, sizeof codec);
        cell[k++] = flags;
        cell[k++] = s->trace_label;
        cell[k++] = s->rep->measure;
        for (int c = 0; c < N_COMPARE_COLS; c++) cell[k++] = vals[c];
        cell[k++] = from;
        table_row(ctx, k, cell);
    }
    table_end(ctx);
    if (any_o) para(ctx, "O = oracle: looks at full attention; a bound, not a deployable policy.");
    if (any_p)
        para(ctx, "P = prompt-only budget: the budget bounds the prompt only and every generated token is kept, so "
                  "its memory grows with the response; here it is compared at its measured memory.");
    if (any_n)
        para(ctx, "N = noted: a run the value comes from carries a replay note (a degenerate configuration, e.g. a "
                  "budget at most the policy's window); read its value as that configuration's, not the policy's.");
    kvs_compare_free(cmp);
    return KVS_OK;
}

/* The default X of an equal-cost table: the middle one of the levels (the given option when > 0). */
static double default_at(report_ctx *ctx, kvs_compare_match match, double given) {
    if (given > 0) return given;
    double lv[MAX_LEVELS];
    int n = levels_of(ctx->rows, ctx->n_rows, match, lv);
    return n ? lv[(n - 1) / 2] : NAN;
}

/* ------------------------------------------------------------------------------------------------
 * Sections
 * ---------------------------------------------------------------------------------------------- */

/* Runs of one (trace, measure) group: the summary compares policies only on the same positions of the same
 * trace. Shallow copies: the strings stay owned by ctx->rows. */
/* Runs of one trace: the same content hash where both recorded it (one file through two path spellings is one
 * trace), else the same traces row. */
static int same_trace(const kvs_results_run_row *a, const kvs_results_run_row *b) {
    if (a->trace_sha256 && b->trace_sha256) return !strcmp(a->trace_sha256, b->trace_sha256);
    return a->trace_id == b->trace_id;
}

static int64_t group_rows(const report_ctx *ctx, const kvs_results_run_row *w, kvs_results_run_row *out) {
    int64_t n = 0;
    for (int64_t i = 0; i < ctx->n_rows; i++)
        if (same_trace(&ctx->rows[i], w) && !strcmp(ctx->rows[i].measure, w->measure)) out[n++] = ctx->rows[i];
    return n;
}

/* The summary's rule, in one place so that the text a reader gets and the code that applies it cannot drift
 * apart: at each memory level M a series (policy, params, codec) qualifies through its best unflagged run whose
 * measured memory is at most M. Measured points only: a run at less memory is a configuration that fits in M,
 * while a value interpolated between runs is one no configuration was measured at. */
static const char summary_rule[] =
    "Rule: at each memory level M (the powers of two within the measured range of resident bytes per KV head: "
    "KV plus auxiliary state, storage_bytes mean over the measured steps), a policy (policy, params and KV codec: "
    "a codec's runs, named \"policy (params) [codec]\", are a candidate of their own beside the policy on K/V as "
    "captured) qualifies when it has a complete run whose memory is at most M, and is represented by its best such run "
    "(the lowest mean relative output error ||O - O'|| / ||O||): measured runs only, never interpolated, so a "
    "policy whose smallest run needs more than M is not at M. The qualifying policy with the lowest error is "
    "the winner at M. A level where only one policy qualifies is no contest and a level whose lowest error is "
    "shared is a tie: neither counts as a win. Runs kvsim flags are never crowned: degenerate runs (N: replay "
    "warned that the configuration degenerates at that budget, e.g. it keeps the whole prompt or only a window) "
    "and oracle runs (O: they look at full attention; a bound, not a deployable policy). A policy qualifies "
    "through its unflagged runs only; the last column lists, per policy, its best flagged run at M when that "
    "run's error is at most the winner's (oracles always, as the bound). This is teacher-forced replay of one "
    "trace: attention-output error against the full cache, not task accuracy.";

/* One run the summary can use: complete, with its run-wide memory and error recorded. */
typedef struct {
    const kvs_results_run_row *w;
    double mem, err; /* storage_bytes mean, out_err mean */
    int flagged;     /* O (oracle) or N (a replay note): never crowned */
    size_t series;   /* its policy in the group's summary_series[] */
} summary_run;

/* A policy of the summary (policy, params, codec, page size: a codec's or a page size's runs are a candidate of
 * their own) and, at the level being tabulated, its best runs at most that memory. */
typedef struct {
    const char *policy, *params, *codec; /* codec "" = K/V as captured */
    int64_t page;                        /* positions a page, 0 = token granularity */
    const char *page_score;              /* the page score rule ("" = count, kvs_results_run_row.page_score) */
    int prompt_only, oracle; /* some run has budget scope prompt; some run is an oracle */
    const summary_run *best, *best_flagged;
    char label[600];
} summary_series;

static int run_flagged(const kvs_results_run_row *w) { return w->is_oracle || (w->notes && w->notes[0]); }

static int same_series(const summary_series *s, const char *policy, const char *params, const char *codec,
                       const kvs_results_run_row *x) {
    return !strcmp(s->policy, policy) && !strcmp(s->params, params) && !strcmp(s->codec, codec) &&
           s->page == x->page && !strcmp(s->page_score, x->page_score);
}

/* The series named as every run is (kvs_results_config_label), then its marks. */
static void series_label(summary_series *s) {
    kvs_results_config_label_rule(s->policy, s->params, s->codec, s->page, s->page_score, s->label, sizeof s->label);
    size_t n = strlen(s->label);
    snprintf(s->label + n, sizeof s->label - n, "%s%s", s->prompt_only ? " (prompt-only budget)" : "",
             s->oracle ? " (oracle)" : "");
}

/* a better than b: lower error, then less memory, then the earlier run (a stable, stated order). */
static int run_better(const summary_run *a, const summary_run *b) {
    if (!b) return 1;
    if (a->err != b->err) return a->err < b->err;
    if (a->mem != b->mem) return a->mem < b->mem;
    return a->w->id < b->w->id;
}

static int cmp_candidates(const void *pa, const void *pb) {
    const summary_series *a = *(const summary_series *const *)pa, *b = *(const summary_series *const *)pb;
    if (a->best->err != b->best->err) return a->best->err < b->best->err ? -1 : 1;
    return strcmp(a->label, b->label);
}

/* Two errors as the table prints them: 4 significant digits, more when two different values would read the same. */
static void fmt_err_pair(char *a, char *b, size_t cap, double x, double y) {
    for (int d = 4; d <= 17; d++) {
        snprintf(a, cap, "%.*g", d, x);
        snprintf(b, cap, "%.*g", d, y);
        if (x == y || strcmp(a, b)) return;
    }
}

/* The summary of one (trace, measure) group: runs[0..n_runs) of series ser[0..n_ser). */
static kvs_status summary_group(report_ctx *ctx, const summary_run *runs, size_t n_runs, summary_series *ser,
                                size_t n_ser, const double *lv, int n_lv) {
    summary_series **cand = malloc((n_ser ? n_ser : 1) * sizeof *cand);
    int *wins = calloc(n_ser ? n_ser : 1, sizeof *wins);
    if (!cand || !wins) {
        free(cand);
        free(wins);
        return kvs_fail(KVS_ERR_NOMEM, "report: out of memory");
    }
    const char *head[] = {"memory per KV head (at most)", "policies qualifying", "lowest error", "its out_err_mean",
                          "its run (memory)", "runner-up", "runner-up out_err_mean",
                          "flagged, not crowned (N degenerate, O oracle): out_err_mean"};
    table_begin(ctx, 8, head);
    char alone[1024] = "", ties[2048] = "";
    int n_contested = 0, any_p = 0;
    for (int l = 0; l < n_lv; l++) {
        for (size_t s = 0; s < n_ser; s++) ser[s].best = ser[s].best_flagged = NULL;
        for (size_t r = 0; r < n_runs; r++) {
            if (runs[r].mem > lv[l]) continue;
            summary_series *s = &ser[runs[r].series];
            const summary_run **slot = runs[r].flagged ? &s->best_flagged : &s->best;
            if (run_better(&runs[r], *slot)) *slot = &runs[r];
        }
        size_t nc = 0;
        for (size_t s = 0; s < n_ser; s++)
            if (ser[s].best) cand[nc++] = &ser[s];
        qsort(cand, nc, sizeof *cand, cmp_candidates);
        size_t n_top = 0, n_second = 0;
        while (n_top < nc && cand[n_top]->best->err == cand[0]->best->err) n_top++;
        while (n_top + n_second < nc && cand[n_top + n_second]->best->err == cand[n_top]->best->err) n_second++;
        char xb[64], nq[32], who[2048] = "", e1[64] = "-", e2[64] = "-", run[1024] = "", who2[2048] = "",
                                                                             flagged[2048] = "";
        kvs_format_bytes(xb, sizeof xb, lv[l]);
        snprintf(nq, sizeof nq, "%zu", nc);
        if (nc) {
            fmt_err_pair(e1, e2, sizeof e1, cand[0]->best->err, n_second ? cand[n_top]->best->err : cand[0]->best->err);
            if (!n_second) snprintf(e2, sizeof e2, "-");
        }
        if (n_top > 1) snprintf(who, sizeof who, "tie: ");
        for (size_t k = 0; k < n_top; k++) {
            char mb[64];
            kvs_format_bytes(mb, sizeof mb, cand[k]->best->mem);
            cell_append(who, sizeof who, k ? "; " : "", "%s", cand[k]->label);
            cell_append(run, sizeof run, "; ", "#%" PRId64 " (%s)", cand[k]->best->w->id, mb);
            any_p |= cand[k]->prompt_only;
        }
        for (size_t k = n_top; k < n_top + n_second; k++) {
            cell_append(who2, sizeof who2, "; ", "%s", cand[k]->label);
            any_p |= cand[k]->prompt_only;
        }
        if (nc == 1) {
            cell_append(who, sizeof who, " ", "(only candidate: not a win)");
            cell_append(alone, sizeof alone, ", ", "%s (%s)", xb, cand[0]->label);
        } else if (n_top > 1) {
            cell_append(ties, sizeof ties, "; ", "%s (%s)", xb, who + strlen("tie: "));
        } else if (nc > 1) {
            n_contested++;
            wins[cand[0] - ser]++;
        }
        /* Flagged runs that would have been crowned (or tied), and every oracle's best run as the bound. */
        for (size_t s = 0; s < n_ser; s++) {
            const summary_run *f = ser[s].best_flagged;
            if (!f || !(f->w->is_oracle || !nc || f->err <= cand[0]->best->err)) continue;
            char fe[64], mb[64];
            snprintf(fe, sizeof fe, "%.4g", f->err);
            kvs_format_bytes(mb, sizeof mb, f->mem);
            cell_append(flagged, sizeof flagged, "; ", "%s #%" PRId64 " (%s%s, %s): %s", ser[s].label, f->w->id,
                        f->w->is_oracle ? "O" : "", f->w->notes && f->w->notes[0] ? "N" : "", mb, fe);
        }
        const char *cell[] = {xb, nq, nc ? who : "-", e1, nc ? run : "-", who2, e2, flagged};
        table_row(ctx, 8, cell);
    }
    table_end(ctx);
    /* The sentences a reader remembers: who wins the contested levels, and which levels are no contest or ties. */
    int most = 0;
    for (size_t s = 0; s < n_ser; s++)
        if (wins[s] > most) most = wins[s];
    if (n_contested == 0)
        para(ctx, "No level is contested (two or more policies qualifying, one lowest): no policy wins here.");
    else {
        char names[2048] = "";
        int n_names = 0;
        for (size_t s = 0; s < n_ser; s++)
            if (wins[s] == most) cell_append(names, sizeof names, " and ", "%s", ser[s].label), n_names++;
        if (most == n_contested)
            para(ctx, "%s has the lowest mean output error at every contested level (%d of the %d levels).", names,
                 most, n_lv);
        else
            para(ctx, "%s %s the lowest mean output error at %d of the %d contested levels (of %d levels); the "
                      "winner changes with the memory level (table above).",
                 names, n_names > 1 ? "each have" : "has", most, n_contested, n_lv);
    }
    if (alone[0]) para(ctx, "Only one policy qualifies at %s: no contest, not counted as a win.", alone);
    if (ties[0]) para(ctx, "Tied for the lowest error at %s: not counted as a win.", ties);
    if (any_p)
        para(ctx, "(prompt-only budget): the policy bounds the prompt only and keeps every generated token; "
                  "it is compared at its measured memory, which grows with the response length.");
    free(cand);
    free(wins);
    return KVS_OK;
}

/* The summary over the traces of a model: the same rule per trace, then each policy's mean over the traces, and a
 * win only when its paired difference against the runner-up is resolved. In one place for the same reason as
 * summary_rule. */
static const char summary_rule_across[] =
    "Rule over several traces of a model (one per prompt): on each trace, a policy (policy, params and KV codec, "
    "\"policy (params) [codec]\") qualifies at "
    "memory level M through its best unflagged complete run whose resident bytes per KV head (storage_bytes mean) "
    "are at most M, as with one trace (measured runs only, never interpolated; degenerate (N) and oracle (O) runs "
    "never crowned). Its value at M is the mean over the traces where it qualifies of that run's mean relative "
    "output error, with the percentile bootstrap 95% interval resampling traces [lo, hi] and (n) the traces used. "
    "The policy with the lowest mean leads; it wins the level only when the paired difference of its error and the "
    "runner-up's (mean of lowest - runner-up over the traces both qualify on, bootstrap interval) lies below 0. "
    "Otherwise the level is not resolved over those traces and counts as no one's win; a level with one qualifying "
    "policy is no contest. Intervals are seeded from what is compared (the level, the policies, the sorted trace "
    "hashes), so the same database gives the same table. Teacher-forced replay: attention-output error against the "
    "full cache, not task accuracy.";

typedef struct {
    const kvs_results_run_row *w;
    double mem, err;
    int flagged;
    size_t series, trace;
} across_run;

static int cmp_ids(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }

/* The summary over the traces of (model, measure) of w. */
static kvs_status summary_across(report_ctx *ctx, const kvs_results_run_row *w0) {
    size_t cap = (size_t)ctx->n_rows;
    kvs_status st = KVS_OK;
    kvs_results_run_row *grp = malloc(cap * sizeof *grp);
    across_run *runs = malloc(cap * sizeof *runs);
    summary_series *ser = malloc(cap * sizeof *ser);
    char(*ids)[KVS_COMPARE_TRACE_ID_CAP] = malloc(cap * sizeof *ids);
    const across_run **best = NULL, **bestf = NULL;
    double *va = malloc(cap * sizeof *va), *vb = malloc(cap * sizeof *vb);
    typedef struct {
        size_t s;
        kvs_interval iv;
    } cand_t;
    cand_t *cand = malloc(cap * sizeof *cand);
    int *wins = calloc(cap, sizeof *wins);
    if (!grp || !runs || !ser || !ids || !va || !vb || !cand || !wins) {
        st = kvs_fail(KVS_ERR_NOMEM, "report: out of memory");
        goto cleanup;
    }
    const char *model = w0->model ? w0->model : "";
    size_t n_ids = 0, n_runs = 0, n_ser = 0;
    int64_t n_grp = 0;
    for (int64_t r = 0; r < ctx->n_rows; r++) {
        const kvs_results_run_row *x = &ctx->rows[r];
        if (strcmp(x->model ? x->model : "", model) || strcmp(x->measure, w0->measure)) continue;
        grp[n_grp++] = *x;
        if (strcmp(x->status, "complete") || !x->has_agg) continue;
        char id[KVS_COMPARE_TRACE_ID_CAP];
        kvs_compare_trace_identity(x, id);
        size_t t = 0;
        while (t < n_ids && strcmp(ids[t], id)) t++;
        if (t == n_ids) memcpy(ids[n_ids++], id, sizeof id);
    }
    qsort(ids, n_ids, sizeof *ids, cmp_ids);
    double lv[MAX_LEVELS];
    int n_lv = levels_of(grp, n_grp, KVS_COMPARE_MEM, lv);
    if (n_lv == 0) goto cleanup;
    for (int64_t r = 0; r < ctx->n_rows; r++) {
        const kvs_results_run_row *x = &ctx->rows[r];
        if (strcmp(x->model ? x->model : "", model) || strcmp(x->measure, w0->measure)) continue;
        if (strcmp(x->status, "complete") || !x->has_agg) continue;
        double mem = kvs_results_stat_value(&x->agg.storage_bytes, KVS_STAT_MEAN);
        double err = kvs_results_stat_value(&x->agg.out_err, KVS_STAT_MEAN);
        if (!isfinite(mem) || !(mem > 0) || !isfinite(err)) continue;
        const char *params = x->params ? x->params : "", *codec = x->codec ? x->codec : "";
        size_t k = 0;
        while (k < n_ser && !same_series(&ser[k], x->policy, params, codec, x)) k++;
        if (k == n_ser)
            ser[n_ser++] = (summary_series){.policy = x->policy, .params = params, .codec = codec, .page = x->page,
                                               .page_score = x->page_score};
        ser[k].prompt_only |= kvs_compare_run_prompt_only(x);
        ser[k].oracle |= x->is_oracle;
        char id[KVS_COMPARE_TRACE_ID_CAP];
        kvs_compare_trace_identity(x, id);
        const char(*hit)[KVS_COMPARE_TRACE_ID_CAP] = bsearch(id, ids, n_ids, sizeof *ids, cmp_ids);
        runs[n_runs++] = (across_run){.w = x, .mem = mem, .err = err, .flagged = run_flagged(x), .series = k,
                                      .trace = (size_t)(hit - ids)};
    }
    for (size_t k = 0; k < n_ser; k++) series_label(&ser[k]);
    if (!(best = calloc(n_ser * n_ids + 1, sizeof *best)) || !(bestf = calloc(n_ser * n_ids + 1, sizeof *bestf))) {
        st = kvs_fail(KVS_ERR_NOMEM, "report: out of memory");
        goto cleanup;
    }
    char sub[1024];
    snprintf(sub, sizeof sub, "Model %s, measure %s: %zu traces", model[0] ? model : "unknown", w0->measure, n_ids);
    subheading(ctx, sub);
    para(ctx, "%s", summary_rule_across);
    const char *head[] = {"memory per KV head (at most)", "policies qualifying", "lowest mean error",
                          "its out_err_mean: mean [lo, hi] (traces)", "runner-up", "runner-up out_err_mean",
                          "paired difference (lowest - runner-up)", "counted",
                          "flagged, not crowned (N degenerate, O oracle): mean out_err_mean (traces)"};
    table_begin(ctx, 9, head);
    int n_contested = 0, n_resolved = 0;
    char open_[2048] = "", alone[1024] = "";
    for (int l = 0; l < n_lv && st == KVS_OK; l++) {
        for (size_t i = 0; i < n_ser * n_ids; i++) best[i] = bestf[i] = NULL;
        for (size_t r = 0; r < n_runs; r++) {
            if (runs[r].mem > lv[l]) continue;
            const across_run **slot = &(runs[r].flagged ? bestf : best)[runs[r].series * n_ids + runs[r].trace];
            summary_run a = {.w = runs[r].w, .mem = runs[r].mem, .err = runs[r].err};
            summary_run b = *slot ? (summary_run){.w = (*slot)->w, .mem = (*slot)->mem, .err = (*slot)->err}
                                  : (summary_run){0};
            if (!*slot || run_better(&a, &b)) *slot = &runs[r];
        }
        /* each qualifying policy's mean over its traces, seeded by the level, its label and its traces */
        size_t nc = 0;
        for (size_t k = 0; k < n_ser && st == KVS_OK; k++) {
            size_t n = 0;
            uint64_t h = kvs_fnv1a64(KVS_FNV1A64_BASIS, "summary|");
            char lvs[64];
            snprintf(lvs, sizeof lvs, "%.17g|", lv[l]);
            h = kvs_fnv1a64(kvs_fnv1a64(kvs_fnv1a64(h, lvs), ser[k].label), "|");
            for (size_t t = 0; t < n_ids; t++) {
                const across_run *b = best[k * n_ids + t];
                if (!b) continue;
                if (n) h = kvs_fnv1a64(h, ",");
                h = kvs_fnv1a64(h, ids[t]);
                va[n++] = b->err;
            }
            if (!n) continue;
            cand[nc].s = k;
            st = kvs_bootstrap_mean(va, n, KVS_BOOTSTRAP_REPS, 0.95, h, &cand[nc].iv);
            nc++;
        }
        if (st != KVS_OK) break;
        for (size_t i = 1; i < nc; i++) /* by mean, then label (insertion sort: a few policies) */
            for (size_t j = i; j > 0; j--) {
                cand_t *a = &cand[j - 1], *b = &cand[j];
                if (a->iv.mean < b->iv.mean || (a->iv.mean == b->iv.mean && strcmp(ser[a->s].label, ser[b->s].label) <= 0))
                    break;
                cand_t tmp = *a;
                *a = *b;
                *b = tmp;
            }
        char xb[64], nq[32], e1[256] = "-", e2[256] = "-", dd[256] = "-", counted[256] = "-", flagged[2048] = "";
        kvs_format_bytes(xb, sizeof xb, lv[l]);
        snprintf(nq, sizeof nq, "%zu", nc);
        if (nc) fmt_interval(e1, sizeof e1, &cand[0].iv, KVS_M_OUT_ERR);
        if (nc == 1) {
            snprintf(counted, sizeof counted, "only candidate: not a win");
            cell_append(alone, sizeof alone, ", ", "%s (%s)", xb, ser[cand[0].s].label);
        } else if (nc >= 2) {
            n_contested++;
            fmt_interval(e2, sizeof e2, &cand[1].iv, KVS_M_OUT_ERR);
            /* the paired difference over the traces both qualify on, seeded by the level, both labels, those traces */
            size_t a = cand[0].s, b = cand[1].s, n = 0;
            char lvs[64];
            snprintf(lvs, sizeof lvs, "%.17g|", lv[l]);
            uint64_t h = kvs_fnv1a64(kvs_fnv1a64(KVS_FNV1A64_BASIS, "summary|"), lvs);
            h = kvs_fnv1a64(kvs_fnv1a64(h, ser[a].label), "|-|");
            h = kvs_fnv1a64(kvs_fnv1a64(h, ser[b].label), "|");
            for (size_t t = 0; t < n_ids; t++) {
                const across_run *ra = best[a * n_ids + t], *rb = best[b * n_ids + t];
                if (!ra || !rb) continue;
                if (n) h = kvs_fnv1a64(h, ",");
                h = kvs_fnv1a64(h, ids[t]);
                va[n] = ra->err;
                vb[n++] = rb->err;
            }
            kvs_interval d = {.n = 0};
            if (n && (st = kvs_bootstrap_mean_diff(va, vb, n, KVS_BOOTSTRAP_REPS, 0.95, h, &d)) != KVS_OK) break;
            int res = n ? kvs_interval_resolved(&d) : 0;
            if (n == 0) snprintf(dd, sizeof dd, "no trace in common");
            else if (n == 1) snprintf(dd, sizeof dd, "%+.4g (one trace: no interval)", d.mean);
            else snprintf(dd, sizeof dd, "%+.4g [%+.4g, %+.4g] (%zu)", d.mean, d.lo, d.hi, n);
            if (res < 0) {
                snprintf(counted, sizeof counted, "win: resolved over %zu traces", n);
                wins[a]++;
                n_resolved++;
            } else {
                snprintf(counted, sizeof counted, "not resolved over %zu traces%s", n,
                         res > 0 ? " (the runner-up is lower on the traces both qualify on)" : "");
                cell_append(open_, sizeof open_, "; ", "%s (%s vs %s, %zu traces)", xb, ser[a].label, ser[b].label, n);
            }
        }
        /* flagged runs whose mean would have led (oracles always, as the bound) */
        for (size_t k = 0; k < n_ser; k++) {
            double sum = 0;
            size_t n = 0;
            int o = 0, nn = 0;
            for (size_t t = 0; t < n_ids; t++) {
                const across_run *f = bestf[k * n_ids + t];
                if (!f) continue;
                sum += f->err, n++;
                o |= f->w->is_oracle;
                nn |= f->w->notes && f->w->notes[0];
            }
            if (!n || !(o || !nc || sum / (double)n <= cand[0].iv.mean)) continue;
            cell_append(flagged, sizeof flagged, "; ", "%s (%s%s): %.4g (%zu)", ser[k].label, o ? "O" : "",
                        nn ? "N" : "", sum / (double)n, n);
        }
        const char *cell[] = {xb, nq, nc ? ser[cand[0].s].label : "-", e1, nc >= 2 ? ser[cand[1].s].label : "-", e2,
                              dd, counted, flagged};
        table_row(ctx, 9, cell);
    }
    if (st != KVS_OK) goto cleanup;
    table_end(ctx);
    if (n_contested == 0)
        para(ctx, "No level is contested (two or more policies qualifying): no policy wins here.");
    else if (n_resolved == 0)
        para(ctx, "No level has a resolved winner: at each of the %d contested levels the lowest mean error is not "
                  "resolved against the runner-up over these %zu traces.",
             n_contested, n_ids);
    else {
        int most = 0;
        char names[2048] = "";
        for (size_t k = 0; k < n_ser; k++) most = wins[k] > most ? wins[k] : most;
        int n_names = 0;
        for (size_t k = 0; k < n_ser; k++)
            if (wins[k] == most) cell_append(names, sizeof names, " and ", "%s", ser[k].label), n_names++;
        para(ctx, "%s %s the lowest mean output error, resolved against the runner-up over the traces, at %d of the "
                  "%d contested levels (of %d levels).",
             names, n_names > 1 ? "each have" : "has", most, n_contested, n_lv);
    }
    if (open_[0]) para(ctx, "Not resolved (not counted as a win): %s.", open_);
    if (alone[0]) para(ctx, "Only one policy qualifies at %s: no contest, not counted as a win.", alone);
cleanup:
    free(grp);
    free(runs);
    free(ser);
    free(ids);
    free(best);
    free(bestf);
    free(va);
    free(vb);
    free(cand);
    free(wins);
    return st;
}

/* The traces of w's (model, measure) with a complete run, counted by identity (at most 2: enough to decide). */
static int set_has_traces(const report_ctx *ctx, const kvs_results_run_row *w) {
    char first[KVS_COMPARE_TRACE_ID_CAP] = "", id[KVS_COMPARE_TRACE_ID_CAP];
    for (int64_t r = 0; r < ctx->n_rows; r++) {
        const kvs_results_run_row *x = &ctx->rows[r];
        if (strcmp(x->model ? x->model : "", w->model ? w->model : "") || strcmp(x->measure, w->measure) ||
            strcmp(x->status, "complete") || !x->has_agg)
            continue;
        kvs_compare_trace_identity(x, id);
        if (!first[0]) memcpy(first, id, sizeof id);
        else if (strcmp(first, id)) return 2;
    }
    return first[0] ? 1 : 0;
}

static kvs_status sec_summary(report_ctx *ctx) {
    if (ctx->n_complete == 0) return absent(ctx, "no complete run");
    size_t cap = (size_t)ctx->n_rows;
    kvs_results_run_row *grp = malloc(cap * sizeof *grp);
    summary_run *runs = malloc(cap * sizeof *runs);
    summary_series *ser = malloc(cap * sizeof *ser);
    kvs_status st = KVS_OK;
    int any_level = 0;
    if (!grp || !runs || !ser) {
        st = kvs_fail(KVS_ERR_NOMEM, "report: out of memory");
        goto cleanup;
    }
    para(ctx, "Which policy loses the least attention fidelity within each memory level. %s", summary_rule);
    for (int64_t i = 0; i < ctx->n_rows && st == KVS_OK; i++) {
        const kvs_results_run_row *w = &ctx->rows[i];
        int seen = 0;
        for (int64_t j = 0; j < i && !seen; j++)
            seen = same_trace(&ctx->rows[j], w) && !strcmp(ctx->rows[j].measure, w->measure);
        if (seen) continue;
        if (set_has_traces(ctx, w) >= 2) { /* several traces of its model: the summary over them, once per set */
            int first = 1;
            for (int64_t j = 0; j < i && first; j++)
                first = strcmp(ctx->rows[j].model ? ctx->rows[j].model : "", w->model ? w->model : "") ||
                        strcmp(ctx->rows[j].measure, w->measure);
            if (first) {
                any_level = 1;
                st = summary_across(ctx, w);
            }
            continue;
        }
        int64_t n = group_rows(ctx, w, grp);
        double lv[MAX_LEVELS];
        int n_lv = levels_of(grp, n, KVS_COMPARE_MEM, lv);
        if (n_lv == 0) continue;
        /* The usable runs of the group and its series, in the order of their first run. */
        size_t n_runs = 0, n_ser = 0;
        for (int64_t r = 0; r < ctx->n_rows; r++) {
            const kvs_results_run_row *x = &ctx->rows[r];
            if (!same_trace(x, w) || strcmp(x->measure, w->measure)) continue;
            if (strcmp(x->status, "complete") || !x->has_agg) continue;
            double mem = kvs_results_stat_value(&x->agg.storage_bytes, KVS_STAT_MEAN);
            double err = kvs_results_stat_value(&x->agg.out_err, KVS_STAT_MEAN);
            if (!isfinite(mem) || !(mem > 0) || !isfinite(err)) continue;
            const char *params = x->params ? x->params : "", *codec = x->codec ? x->codec : "";
            size_t k = 0;
            while (k < n_ser && !same_series(&ser[k], x->policy, params, codec, x)) k++;
            if (k == n_ser)
                ser[n_ser++] = (summary_series){.policy = x->policy, .params = params, .codec = codec, .page = x->page,
                                               .page_score = x->page_score};
            summary_series *s = &ser[k];
            runs[n_runs++] = (summary_run){.w = x, .mem = mem, .err = err, .flagged = run_flagged(x), .series = k};
            s->prompt_only |= kvs_compare_run_prompt_only(x);
            s->oracle |= x->is_oracle;
        }
        for (size_t k = 0; k < n_ser; k++) series_label(&ser[k]);
        any_level = 1;
        char sub[1024], tl[160];
        kvs_results_trace_label(w, tl, sizeof tl);
        snprintf(sub, sizeof sub, "%s (%s, model %s), measure %s", tl, kvs_path_base(w->trace_path),
                 w->model && w->model[0] ? w->model : "unknown", w->measure);
        subheading(ctx, sub);
        para(ctx, "One trace of model %s: no interval (the values are this trace's).",
             w->model && w->model[0] ? w->model : "unknown");
        st = summary_group(ctx, runs, n_runs, ser, n_ser, lv, n_lv);
        /* An oracle whose smallest run is above every level (topk stores the whole cache) is in no row: say why. */
        for (size_t k = 0; k < n_ser && st == KVS_OK; k++) {
            if (!ser[k].oracle) continue;
            double lo = INFINITY;
            for (size_t r = 0; r < n_runs; r++)
                if (runs[r].w->is_oracle && runs[r].series == k && runs[r].mem < lo)
                    lo = runs[r].mem;
            if (lo > lv[n_lv - 1]) {
                char a[64];
                kvs_format_bytes(a, sizeof a, lo);
                para(ctx, "The oracle %s is at none of these levels: its smallest run holds %s per KV head (an oracle "
                          "that selects from the full cache stores all of it).",
                     ser[k].label, a);
            }
        }
    }
cleanup:
    free(grp);
    free(runs);
    free(ser);
    if (st != KVS_OK) return st;
    if (!any_level) return absent(ctx, "no complete non-oracle run recorded its resident memory (storage_bytes)");
    return KVS_OK;
}

/* The trace header, when the trace file is still readable at its stored path and is the trace the runs
 * replayed (same model name and shape): the capture settings live only there. */
static void trace_capture(report_ctx *ctx, const kvs_results_run_row *w) {
    kvs_trace *t = NULL;
    if (kvs_trace_open(w->trace_path, &t) != KVS_OK) {
        para(ctx, "Capture settings not shown: the trace file %s is not readable from here (%s).", w->trace_path,
             kvs_last_error());
        return;
    }
    const kvs_trace_info *in = kvs_trace_info_get(t);
    if (in->n_positions != w->n_positions || in->model.n_layers != w->n_layers || in->model.n_heads != w->n_heads ||
        in->model.n_kv_heads != w->n_kv_heads || in->model.head_dim != w->head_dim ||
        strcmp(in->model.model_name, w->model ? w->model : "")) {
        para(ctx, "Capture settings not shown: the file now at %s holds another trace than the one replayed.",
             w->trace_path);
        kvs_trace_close(t);
        return;
    }
    char b[64], c[64];
    kvs_format_bytes(b, sizeof b, (double)in->raw_bytes);
    kvs_format_bytes(c, sizeof c, (double)in->compressed_bytes);
    para(ctx, "Capture (from the trace header, format version %u): %s; dtype %s; max_new_tokens %d; %d positions per "
              "block; model dim %d, FFN %d, vocab %d, context %d, rope theta %g; payload %s raw, %s compressed.",
         in->version, in->capture.settings[0] ? in->capture.settings : "no settings recorded",
         kvs_dtype_name((kvs_dtype)in->capture.dtype), in->capture.max_new_tokens, in->capture.block_positions,
         in->model.dim, in->model.hidden_dim, in->model.vocab_size, in->model.max_seq_len, (double)in->model.rope_theta,
         b, c);
    kvs_trace_close(t);
}

static kvs_status sec_traces(report_ctx *ctx) {
    const char *head[] = {"trace", "path", "model", "positions", "prompt", "turns", "layers",
                          "heads", "KV heads", "head_dim", "dtype", "runs"};
    table_begin(ctx, 12, head);
    for (int64_t i = 0; i < ctx->n_rows; i++) {
        const kvs_results_run_row *w = &ctx->rows[i];
        int seen = 0, runs = 0;
        for (int64_t j = 0; j < i && !seen; j++) seen = ctx->rows[j].trace_id == w->trace_id;
        if (seen) continue;
        for (int64_t j = 0; j < ctx->n_rows; j++) runs += ctx->rows[j].trace_id == w->trace_id;
        char id[32], np[32], pl[32], nt[32], nl[16], nh[16], nk[16], hd[16], nr[16];
        snprintf(id, sizeof id, "#%" PRId64, w->trace_id);
        snprintf(np, sizeof np, "%" PRId64, w->n_positions);
        snprintf(pl, sizeof pl, "%" PRId64, w->prompt_len);
        snprintf(nt, sizeof nt, "%" PRId64, w->n_turns);
        snprintf(nl, sizeof nl, "%d", w->n_layers);
        snprintf(nh, sizeof nh, "%d", w->n_heads);
        snprintf(nk, sizeof nk, "%d", w->n_kv_heads);
        snprintf(hd, sizeof hd, "%d", w->head_dim);
        snprintf(nr, sizeof nr, "%d", runs);
        const char *cell[] = {id, w->trace_path, w->model, np, pl, nt, nl, nh, nk, hd, w->dtype, nr};
        table_row(ctx, 12, cell);
    }
    table_end(ctx);
    for (int64_t i = 0; i < ctx->n_rows; i++) {
        const kvs_results_run_row *w = &ctx->rows[i];
        int seen = 0;
        for (int64_t j = 0; j < i && !seen; j++) seen = ctx->rows[j].trace_id == w->trace_id;
        if (seen) continue;
        char sub[800], tl[160];
        kvs_results_trace_label(w, tl, sizeof tl);
        snprintf(sub, sizeof sub, "Trace #%" PRId64 ": %s (%s)", w->trace_id, kvs_path_base(w->trace_path), tl);
        subheading(ctx, sub);
        kvs_turn *turns = NULL;
        int64_t n_turns = 0;
        kvs_status st = kvs_results_query_turns(ctx->db, w->trace_id, &turns, &n_turns);
        if (st != KVS_OK) return st;
        if (n_turns == 0) para(ctx, "Turns: not recorded in the database.");
        else {
            char buf[2048];
            size_t len = (size_t)snprintf(buf, sizeof buf, "Turns (prompt [begin, prompt end), response [prompt end, "
                                                           "end)):");
            for (int64_t t = 0; t < n_turns && len < sizeof buf; t++)
                len += (size_t)snprintf(buf + len, sizeof buf - len, "%s turn %" PRId64 ": [%" PRId64 ", %" PRId64
                                                                     "), [%" PRId64 ", %" PRId64 ")",
                                        t ? ";" : "", t, turns[t].begin, turns[t].prompt_end, turns[t].prompt_end,
                                        turns[t].end);
            para(ctx, "%s.", buf);
        }
        free(turns);
        trace_capture(ctx, w);
    }
    return KVS_OK;
}

static kvs_status sec_runs(report_ctx *ctx) {
    const char *head[] = {"run", "policy", "params", "codec", "budget", "measure", "budget scope", "layout", "flags",
                          "status", "out_err_mean", "out_err_p95", "attn_recall_mean", "storage_bytes_mean",
                          "traffic_bytes_mean", "trace", "notes"};
    int any_o = 0, any_p = 0, any_f = 0, any_n = 0, any_codec = 0;
    table_begin(ctx, 17, head);
    for (int64_t i = 0; i < ctx->n_rows; i++) {
        const kvs_results_run_row *w = &ctx->rows[i];
        char id[32], budget[64], flags[KVS_COMPARE_FLAGS_CAP], e[32], e95[32], rec[32], sto[32], tra[32], tl[160];
        snprintf(id, sizeof id, "#%" PRId64, w->id);
        if (w->budget_fraction >= 0)
            snprintf(budget, sizeof budget, "%" PRId64 " (%g%% of the prompt)", w->budget_tokens,
                     100.0 * w->budget_fraction);
        else snprintf(budget, sizeof budget, "%" PRId64, w->budget_tokens);
        int failed = strcmp(w->status, "complete") != 0;
        kvs_compare_run_flags(w, flags); /* the letters of kvsim runs and compare */
        any_o |= w->is_oracle;
        any_p |= kvs_compare_run_prompt_only(w);
        any_f |= failed;
        any_n |= kvs_compare_run_noted(w);
        kvs_results_trace_label(w, tl, sizeof tl);
        fmt_metric(e, sizeof e, kvs_results_stat_value(&w->agg.out_err, KVS_STAT_MEAN), KVS_M_OUT_ERR);
        fmt_metric(e95, sizeof e95, kvs_results_stat_value(&w->agg.out_err, KVS_STAT_P95), KVS_M_OUT_ERR);
        fmt_metric(rec, sizeof rec, kvs_results_stat_value(&w->agg.attn_recall, KVS_STAT_MEAN), KVS_M_ATTN_RECALL);
        fmt_metric(sto, sizeof sto, kvs_results_stat_value(&w->agg.storage_bytes, KVS_STAT_MEAN), KVS_M_STORAGE);
        fmt_metric(tra, sizeof tra, kvs_results_stat_value(&w->agg.traffic_bytes, KVS_STAT_MEAN), KVS_M_TRAFFIC);
        char notes[1024];
        snprintf(notes, sizeof notes, "%s%s%s", w->notes ? w->notes : "", w->notes && w->error ? "; " : "",
                 w->error ? w->error : "");
        any_codec |= (w->codec && w->codec[0]) || w->page > 0;
        char codec[KVS_CODEC_CELL_CAP];
        const char *cell[] = {id,    w->policy, w->params, codec_cell_page(w, codec, sizeof codec), budget, w->measure, w->budget_scope, w->layout,
                              flags, w->status, e, e95, rec, sto, tra, tl, notes};
        table_row(ctx, 17, cell);
    }
    table_end(ctx);
    if (any_codec)
        para(ctx, "codec: the KV codec the run stored K/V with (kvsim replay --codec; its canonical spec, sim/codec.h), "
                  "- for K/V as captured. A codec's bytes are its codes, scales, zero points and full-precision "
                  "rows; its error is against the full-precision full cache. \"page N\": the run held whole pages of N "
                  "positions (kvsim replay --page; sim/host.h), its bytes whole pages with their padding.");
    para(ctx, "%" PRId64 " runs, %" PRId64 " complete. Budgets are tokens per KV head (the current token included); "
              "bytes are means over measured steps per (layer, KV head).",
         ctx->n_rows, ctx->n_complete);
    if (any_o) para(ctx, "O = oracle: looks at full attention; a bound, not a deployable policy.");
    if (any_p)
        para(ctx, "P = prompt-only budget (budget scope prompt): the budget bounds the prompt only; generated tokens "
                  "are all kept, so attended tokens and resident bytes grow past the budget. Compare such runs at "
                  "their measured memory (equal-memory comparison), not at their nominal budget.");
    if (any_f) para(ctx, "F = failed: the run did not complete (its error in the notes column); it has no metrics.");
    if (any_n) para(ctx, "N = note: the configuration degenerates at this budget or on this trace (kvsim replay warned).");
    return KVS_OK;
}

static kvs_status sec_equal_memory(report_ctx *ctx) {
    double X = default_at(ctx, KVS_COMPARE_MEM, ctx->opt->mem_at);
    if (isnan(X)) return absent(ctx, "no complete non-oracle run recorded its resident memory (storage_bytes)");
    return compare_table(ctx, KVS_COMPARE_MEM, X);
}

static kvs_status sec_equal_traffic(report_ctx *ctx) {
    double X = default_at(ctx, KVS_COMPARE_TRAFFIC, ctx->opt->traffic_at);
    if (isnan(X)) return absent(ctx, "no complete non-oracle run recorded its traffic per step (traffic_bytes)");
    return compare_table(ctx, KVS_COMPARE_TRAFFIC, X);
}

/* A section made of plots: absent when none of them could be drawn. */
typedef struct {
    kvs_plot_kind kind;
    const char *metric; /* NULL = the kind's default */
    const char *file, *caption;
} plot_spec;

static kvs_status plot_section(report_ctx *ctx, const plot_spec *ps, int n, int64_t budget, const char *why_none) {
    int any = 0;
    for (int i = 0; i < n; i++) {
        kvs_plot_options o = {.kind = ps[i].kind, .metric = ps[i].metric, .layer = -1, .budget_tokens = budget};
        int drawn = 0;
        kvs_status st = plot(ctx, o, ps[i].file, ps[i].caption, &drawn);
        if (st != KVS_OK) return st;
        any |= drawn;
    }
    return any ? KVS_OK : absent(ctx, "%s", why_none);
}

static kvs_status sec_pareto(report_ctx *ctx) {
    static const plot_spec ps[] = {
        {KVS_PLOT_ERROR_VS_MEMORY, NULL, "error_vs_memory.png",
         "Mean output error vs measured resident bytes per KV head, with the Pareto frontier (grey)"},
        {KVS_PLOT_ERROR_VS_TRAFFIC, NULL, "error_vs_traffic.png",
         "Mean output error vs bytes read per decode step per KV head, with the Pareto frontier (grey)"},
    };
    para(ctx, "Each point is a run at its measured cost; the grey step line is the Pareto frontier of the non-oracle "
              "runs (lowest error at no more bytes). Oracles are black and dashed.");
    return plot_section(ctx, ps, 2, -1, "no complete run recorded its resident memory or traffic");
}

static kvs_status sec_budget(report_ctx *ctx) {
    static const plot_spec ps[] = {
        {KVS_PLOT_ERROR_VS_BUDGET, NULL, "error_vs_budget.png", "Mean output error vs nominal budget (tokens per KV head)"},
        {KVS_PLOT_ERROR_VS_BUDGET, "attn_recall_mean", "recall_vs_budget.png",
         "Attention recall vs nominal budget (tokens per KV head)"},
        {KVS_PLOT_MEMORY_VS_BUDGET, NULL, "memory_vs_budget.png", "Mean resident bytes per KV head vs nominal budget"},
    };
    para(ctx, "By nominal budget, for reference: a budget means different things to different policies (a "
              "prompt-only policy keeps every generated token and is labelled so); the equal-memory comparison is "
              "the fair one.");
    return plot_section(ctx, ps, 3, -1, "no complete run with an aggregate");
}

/* The budget of the error-vs-position plot: the lower median of the distinct budgets of the complete runs (one
 * line per run would be unreadable over every budget). */
static int64_t position_budget(const report_ctx *ctx) {
    int64_t *b = malloc((size_t)(ctx->n_rows ? ctx->n_rows : 1) * sizeof *b);
    int64_t n = 0, pick = -1;
    if (!b) return -1;
    for (int64_t i = 0; i < ctx->n_rows; i++) {
        if (strcmp(ctx->rows[i].status, "complete")) continue;
        int dup = 0;
        for (int64_t j = 0; j < n && !dup; j++) dup = b[j] == ctx->rows[i].budget_tokens;
        if (!dup) b[n++] = ctx->rows[i].budget_tokens;
    }
    for (int64_t i = 1; i < n; i++)
        for (int64_t j = i; j > 0 && b[j - 1] > b[j]; j--) {
            int64_t t = b[j];
            b[j] = b[j - 1];
            b[j - 1] = t;
        }
    if (n) pick = b[(n - 1) / 2];
    free(b);
    return pick;
}

static kvs_status sec_position(report_ctx *ctx) {
    int64_t budget = position_budget(ctx);
    if (budget <= 0) return absent(ctx, "no complete run");
    char caption[256];
    snprintf(caption, sizeof caption, "Output error vs decode position, runs with budget %" PRId64
                                      " tokens per KV head (mean over layers and query heads)",
             budget);
    plot_spec ps[] = {{KVS_PLOT_ERROR_VS_POSITION, NULL, "error_vs_position.png", caption}};
    para(ctx, "How the error evolves as the response grows (kvsim plot --kind error-vs-position --budget %" PRId64
              "): one line per run at the median budget of the study; a multi-turn trace has each turn's prompt shaded.",
         budget);
    return plot_section(ctx, ps, 1, budget, "no run stored its per-step series (kvsim replay --series-every)");
}

/* Attention drift (kvsim drift; SyncKV §3.1-3.2): the latest drift run's curves and locality heatmap, and one line
 * per drift run of the database. */
static kvs_status sec_drift(report_ctx *ctx) {
    kvs_results_drift_run *runs = NULL;
    int64_t n = 0;
    kvs_status st = kvs_results_table_rows(ctx->db, "drift_runs", &n);
    if (st != KVS_OK) return st;
    if (n == 0) return absent(ctx, "no kvsim drift run in this database");
    if ((st = kvs_results_drift_query_runs(ctx->db, NULL, NULL, &runs, &n)) != KVS_OK) return st;
    if (n == 0) return absent(ctx, "no kvsim drift run in this database");
    para(ctx, "Overlap (SyncKV Eq. 1) of each decode step's top-k attended positions with the prefill top-k (SnapKV "
              "window score of the last prompt queries, or the last prompt query), and of steps t and t+d (temporal "
              "locality): how fast the positions a policy chose at the prompt stop being the ones attended. Plots draw "
              "the latest drift run at its largest k (kvsim plot --kind drift-curve|drift-locality --k K for another).");
    static const char *const head[] = {"run", "trace", "model", "prompt", "decode steps", "k swept", "window", "max d"};
    table_begin(ctx, 8, head);
    for (int64_t i = 0; i < n; i++) {
        const kvs_results_drift_run *r = &runs[i];
        char id[32], pl[32], ns[32], ks[256] = "", win[32], dm[32];
        snprintf(id, sizeof id, "%" PRId64, r->id);
        snprintf(pl, sizeof pl, "%" PRId64, r->prompt_len);
        snprintf(ns, sizeof ns, "%" PRId64, r->n_steps);
        for (int32_t j = 0; j < r->n_k; j++) {
            size_t len = strlen(ks);
            snprintf(ks + len, sizeof ks - len, "%s%" PRId64, j ? ", " : "", r->k[j]);
        }
        snprintf(win, sizeof win, "%d", r->window);
        snprintf(dm, sizeof dm, "%d", r->delta_max);
        const char *cell[] = {id, kvs_path_base(r->trace_path), r->model, pl, ns, ks, win, dm};
        table_row(ctx, 8, cell);
    }
    table_end(ctx);
    kvs_results_drift_runs_free(runs, n);
    static const plot_spec ps[] = {
        {KVS_PLOT_DRIFT_CURVE, NULL, "drift_curve.png",
         "Prefill-vs-step top-k overlap against the decode step, per layer band (SyncKV Fig. 2a)"},
        {KVS_PLOT_DRIFT_LOCALITY, NULL, "drift_locality.png",
         "Top-k overlap of steps t and t+d (temporal locality, SyncKV Fig. 2b)"},
    };
    return plot_section(ctx, ps, 2, -1, "the drift run could not be drawn");
}

/* Head similarity and clusters (kvsim heads; SyncKV §3.3, App. B.1): the latest heads run's layer means, clusters,
 * silhouettes and stability, with its similarity heatmaps. */
static kvs_status sec_heads(report_ctx *ctx) {
    kvs_results_heads_row *h = NULL;
    int64_t n_runs = 0;
    kvs_status st = kvs_results_table_rows(ctx->db, "heads_runs", &n_runs);
    if (st != KVS_OK) return st;
    if (n_runs == 0) return absent(ctx, "no kvsim heads run in this database");
    if ((st = kvs_results_heads_read(ctx->db, 0, NULL, NULL, &h)) != KVS_OK) return st;
    int32_t L = h->n_layers;
    double intra = 0, inter = 0;
    int n_intra = 0, n_inter = 0;
    for (int32_t a = 0; a < L; a++)
        for (int32_t b = 0; b < L; b++) {
            double v = h->layer_sim_q[(size_t)a * (size_t)L + (size_t)b];
            if (isnan(v)) continue;
            if (a == b) intra += v, n_intra++;
            else inter += v, n_inter++;
        }
    para(ctx, "Latest heads run (%s, %s; k_c = %" PRId64 ", %" PRId64 " decode steps): mean overlap of two query heads' "
              "top-k sets is %.3f within a layer and %.3f across layers (SyncKV Fig. 2c reads: within well above "
              "across). Per layer, the K-means clusters of the KV-group units on D = max(S) - S, their representatives "
              "(the units SyncKV keeps exact), the silhouette and, when measured, the adjusted Rand index of the "
              "clustering's stability (%s).",
         kvs_path_base(h->trace_path), h->model, h->k, h->n_steps, n_intra ? intra / n_intra : NAN,
         n_inter ? inter / n_inter : NAN, h->stability && h->stability[0] ? h->stability : "not measured");
    static const char *const head[] = {"layer", "clusters", "representatives", "silhouette", "ARI"};
    table_begin(ctx, 5, head);
    for (int32_t l = 0; l < L; l++) {
        char ls[16], nc[16], reps[256] = "", sil[32], ari[32];
        snprintf(ls, sizeof ls, "%d", l);
        snprintf(nc, sizeof nc, "%d", h->clusters->n_clusters[l]);
        for (int32_t u = 0; u < h->clusters->n_units; u++)
            if (h->clusters->is_rep[(size_t)l * (size_t)h->clusters->n_units + (size_t)u]) {
                size_t len = strlen(reps);
                snprintf(reps + len, sizeof reps - len, "%sunit %d", len ? ", " : "", u);
            }
        if (isnan(h->silhouette[l])) snprintf(sil, sizeof sil, "-");
        else snprintf(sil, sizeof sil, "%.3f", h->silhouette[l]);
        if (isnan(h->ari[l])) snprintf(ari, sizeof ari, "-");
        else snprintf(ari, sizeof ari, "%.3f", h->ari[l]);
        const char *cell[] = {ls, nc, reps, sil, ari};
        table_row(ctx, 5, cell);
    }
    table_end(ctx);
    kvs_results_heads_row_free(h);
    static const plot_spec ps[] = {
        {KVS_PLOT_HEAD_SIMILARITY, NULL, "head_similarity.png",
         "Similarity of KV-group units (mean top-k overlap), clusters boxed, representatives starred"},
        {KVS_PLOT_LAYER_SIMILARITY, NULL, "layer_similarity.png", "Layer-to-layer similarity (SyncKV Fig. 2c)"},
    };
    return plot_section(ctx, ps, 2, -1, "the heads run could not be drawn");
}

/* A byte count with a decimal and a binary prefix, each side its own (kilo .. peta), four significant digits:
 * "343.6 GB = 320.0 GiB", "316.8 KB = 309.4 KiB", as kvsim plan prints them ("-" when not recorded). One fixed
 * unit would print a small model's plan as "0.0 GB". */
static void fmt_plan_bytes(char *buf, size_t cap, double bytes) {
    static const char *const dec[] = {"B", "KB", "MB", "GB", "TB", "PB"};
    static const char *const bin[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (!isfinite(bytes) || bytes < 0) {
        snprintf(buf, cap, "-");
        return;
    }
    int i = 0, j = 0;
    double d = bytes, e = bytes;
    while (d >= 1000 && i < 5) d /= 1000, i++;
    while (e >= 1024 && j < 5) e /= 1024, j++;
    if (i == 0) snprintf(buf, cap, "%.0f B", bytes);
    else snprintf(buf, cap, "%#.4g %s = %#.4g %s", d, dec[i], e, bin[j]);
}

/* Capacity plans (kvsim plan --db): one row per plan point — the plan's policy, the point's series as stored
 * (whole: for a measured series it names the policy and budget), KV per sequence, total, and the largest batch
 * and context that fit — with decimal (10^3n bytes) and binary (2^10n bytes) prefixes side by side. */
static kvs_status sec_capacity(report_ctx *ctx) {
    kvs_results_plan_row *rows = NULL;
    int64_t n = 0;
    kvs_status st = kvs_results_table_rows(ctx->db, "plans", &n);
    if (st != KVS_OK) return st;
    if (n == 0) return absent(ctx, "no kvsim plan --db result in this database");
    if ((st = kvs_results_query_plans(ctx->db, &rows, &n)) != KVS_OK) return st;
    if (n == 0) {
        kvs_results_plan_rows_free(rows, n);
        return absent(ctx, "no kvsim plan --db result in this database");
    }
    para(ctx, "Capacity plans stored by kvsim plan --db: KB/MB/GB/TB = 10^3/10^6/10^9/10^12 bytes, KiB/MiB/GiB/TiB "
              "= 2^10/2^20/2^30/2^40 bytes. The plan's policy is the one kvsim plan was asked for; every plan also "
              "carries the full cache and the reference series beside it (series column). A measured series is a "
              "policy's storage profile from a replay of this study, fitted on its steady state (the steps where the "
              "policy holds what it will keep holding) and scaled to the planned model component by component: KV "
              "by the KV bytes per token, auxiliary state by what it depends on (its copies per KV head, head_dim "
              "or not; analysis/README.md); max batch / max context: what fits in the GPU memory left beside the "
              "weights (- when not computed, unbounded when nothing limits it).");
    static const char *const head[] = {"plan", "model", "KV dtype", "plan's policy", "series", "budget",
                                       "context + response", "batch", "KV per sequence", "KV total", "max batch",
                                       "max context"};
    table_begin(ctx, 12, head);
    for (int64_t i = 0; i < n; i++) {
        const kvs_results_plan_row *r = &rows[i];
        for (int64_t j = 0; j < r->n_points; j++) {
            const kvs_results_plan_point *p = &r->points[j];
            char id[32], bud[32], cr[64], b[32], seq[64], tot[64], mb[32], mc[32];
            snprintf(id, sizeof id, "%" PRId64, r->id);
            if (p->budget > 0) snprintf(bud, sizeof bud, "%" PRId64, p->budget);
            else snprintf(bud, sizeof bud, "-");
            snprintf(cr, sizeof cr, "%" PRId64 " + %" PRId64, p->context, p->response);
            snprintf(b, sizeof b, "%" PRId64, p->batch);
            fmt_plan_bytes(seq, sizeof seq, p->seq_device_bytes);
            fmt_plan_bytes(tot, sizeof tot, p->total_bytes);
            if (p->max_batch == -1) snprintf(mb, sizeof mb, "unbounded");
            else if (p->max_batch < -1) snprintf(mb, sizeof mb, "-");
            else snprintf(mb, sizeof mb, "%" PRId64, p->max_batch);
            if (p->max_context == -1) snprintf(mc, sizeof mc, "unbounded");
            else if (p->max_context < -1) snprintf(mc, sizeof mc, "-");
            else snprintf(mc, sizeof mc, "%" PRId64, p->max_context);
            const char *cell[] = {id, r->model, r->kv_dtype, r->policy, p->series, bud, cr, b, seq, tot, mb, mc};
            table_row(ctx, 12, cell);
        }
    }
    table_end(ctx);
    /* the measured policies, by name: each distinct measured series (its policy, budget and run), listed as
     * "; name;" entries so that one name is never taken for the start of another ("run 1" of "run 12") */
    char measured[2048] = ";", needle[160];
    size_t used = 1;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < rows[i].n_points; j++) {
            const char *sr = rows[i].points[j].series;
            if (strncmp(sr, "measured ", 9)) continue;
            snprintf(needle, sizeof needle, " %s;", sr + 9);
            if (strstr(measured, needle)) continue;
            int w = snprintf(measured + used, sizeof measured - used, "%s", needle);
            if (w > 0 && (size_t)w < sizeof measured - used) used += (size_t)w;
        }
    if (used > 1) {
        measured[used - 1] = '\0'; /* the last ';' */
        para(ctx, "Measured policies planned here (policy, budget, replay run):%s.", measured + 1);
    }
    /* time (kvsim plan --hw): each series at the plan's batch and at its throughput-maximising batch */
    kvs_results_plan_time *tm = NULL;
    int64_t nt = 0;
    if ((st = kvs_results_query_plan_times(ctx->db, &tm, &nt)) != KVS_OK) {
        kvs_results_plan_rows_free(rows, n);
        return st;
    }
    if (nt > 0) {
        para(ctx, "Time on a GPU (kvsim plan --hw; the roofline of analysis/plan_time.h: each phase the larger of its "
                  "compute and memory time at the efficiency factors mbu/mfu, plus host transfers and all-reduces). "
                  "TTFT: the prefill of the batch's prompts; TPOT: the mean decode step over the response; tokens/s = "
                  "batch / TPOT. Rows: the plan's batch, and each series' batch with the most tokens/s that fits.");
        static const char *const th[] = {"plan", "series", "GPU", "mbu / mfu", "context + response", "batch", "TTFT",
                                         "TPOT", "tokens/s", "decode bound", "best"};
        table_begin(ctx, 11, th);
        for (int64_t k = 0; k < nt; k++) {
            const kvs_results_plan_time *t = &tm[k];
            const kvs_results_plan_row *r = NULL;
            for (int64_t i = 0; i < n && !r; i++)
                if (rows[i].id == t->plan_id) r = &rows[i];
            if (!r || t->context != r->context || t->response != r->response || (t->batch != r->batch && !t->best))
                continue;
            char id[32], hw[96], eff[48], cr[64], b[32], ttft[32], tpot[32], tps[32];
            snprintf(id, sizeof id, "%" PRId64, t->plan_id);
            snprintf(hw, sizeof hw, "%d x %s", t->n_gpus, t->hw);
            snprintf(eff, sizeof eff, "%g / %g", t->mbu, t->mfu);
            snprintf(cr, sizeof cr, "%" PRId64 " + %" PRId64, t->context, t->response);
            snprintf(b, sizeof b, "%" PRId64, t->batch);
            snprintf(ttft, sizeof ttft, "%.4g ms", t->ttft_s * 1e3);
            snprintf(tpot, sizeof tpot, "%.4g ms", t->tpot_s * 1e3);
            snprintf(tps, sizeof tps, "%.4g", t->tokens_per_s);
            const char *cell[] = {id, t->series, hw, eff, cr, b, ttft, tpot, tps, t->decode_bound, t->best ? "yes" : ""};
            table_row(ctx, 11, cell);
        }
        table_end(ctx);
    }
    kvs_results_plan_times_free(tm, nt);
    kvs_results_plan_rows_free(rows, n);
    return KVS_OK;
}

/* THE REPORT: one line per section, in reading order. A new section (drift, heads, capacity plans: each reading
 * its family through results/results_<family>.h) is one function and one line here. */
static const report_section sections[] = {
    {"summary", "Summary: which policy wins at each memory level", sec_summary},
    {"traces", "Traces used", sec_traces},
    {"runs", "Runs", sec_runs},
    {"equal-memory", "Equal-memory comparison", sec_equal_memory},
    {"equal-traffic", "Equal-traffic comparison", sec_equal_traffic},
    {"pareto", "Error vs measured memory and traffic (Pareto frontier)", sec_pareto},
    {"budget", "Error and memory vs nominal budget", sec_budget},
    {"position", "Error vs decode position", sec_position},
    {"drift", "Attention drift and temporal locality", sec_drift},
    {"heads", "Head similarity and clusters", sec_heads},
    {"capacity", "Capacity planning", sec_capacity},
};
#define N_SECTIONS (sizeof sections / sizeof sections[0])

/* ------------------------------------------------------------------------------------------------
 * The report folder: written beside DIR, swapped in when complete
 * ---------------------------------------------------------------------------------------------- */

/* Removes a folder this report created and the plain files in it. */
static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4096];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
                (size_t)snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < sizeof p)
                unlink(p);
        closedir(d);
    }
    rmdir(dir);
}

/* A name a report writes: report.html, report.md, NAME.png (and kvs_out's temporary files of them). */
static int report_file_name(const char *n) {
    size_t l = strlen(n);
    return !strcmp(n, "report.html") || !strcmp(n, "report.md") || (l > 4 && !strcmp(n + l - 4, ".png"));
}

/* KVS_OK when DIR does not exist or is a folder holding a previous report and nothing else (*exists says
 * which); else KVS_ERR_IO saying why it will not be replaced. */
static kvs_status check_out_dir(const char *dir, int *exists) {
    struct stat sb;
    *exists = 0;
    if (lstat(dir, &sb) != 0) {
        if (errno == ENOENT) return KVS_OK;
        return kvs_fail(KVS_ERR_IO, "%s: %s", dir, strerror(errno));
    }
    if (S_ISLNK(sb.st_mode))
        return kvs_fail(KVS_ERR_IO, "%s is a symbolic link: give the report folder itself", dir);
    if (!S_ISDIR(sb.st_mode)) return kvs_fail(KVS_ERR_IO, "%s exists and is not a folder: left unchanged", dir);
    DIR *d = opendir(dir);
    if (!d) return kvs_fail(KVS_ERR_IO, "%s: %s", dir, strerror(errno));
    struct dirent *e;
    int n = 0, has_report = 0;
    kvs_status st = KVS_OK;
    while ((e = readdir(d)) && st == KVS_OK) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        n++;
        has_report |= !strcmp(e->d_name, "report.html");
        char p[4096];
        struct stat fb;
        if (!report_file_name(e->d_name) || (size_t)snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= sizeof p ||
            lstat(p, &fb) != 0 || !S_ISREG(fb.st_mode))
            st = kvs_fail(KVS_ERR_IO, "%s exists and holds '%s', which is not part of a kvsim report: it is left "
                                      "unchanged (give another --out, or remove it)",
                          dir, e->d_name);
    }
    closedir(d);
    if (st == KVS_OK && n > 0 && !has_report)
        st = kvs_fail(KVS_ERR_IO, "%s exists and is not a kvsim report folder (no report.html): it is left unchanged",
                      dir);
    *exists = 1;
    return st;
}

/* Puts the complete folder tmp in place of dir (which, when it exists, was checked to be a previous report):
 * exchanged atomically when the file system can, else the old one moved aside first. */
static kvs_status swap_in(const char *tmp, const char *dir, int exists, const char *parent, const char *base) {
    if (!exists) {
        if (rename(tmp, dir) != 0) return kvs_fail(KVS_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
        return KVS_OK;
    }
#ifdef RENAME_EXCHANGE
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
        remove_tree(tmp); /* now the old report */
        return KVS_OK;
    }
#endif
    char old[4096];
    if ((size_t)snprintf(old, sizeof old, "%s/.%s.old.XXXXXX", parent, base) >= sizeof old || !mkdtemp(old))
        return kvs_fail(KVS_ERR_IO, "cannot replace %s: %s", dir, strerror(errno));
    if (rename(dir, old) != 0) {
        int e = errno;
        rmdir(old);
        return kvs_fail(KVS_ERR_IO, "cannot replace %s: %s", dir, strerror(e));
    }
    if (rename(tmp, dir) != 0) {
        int e = errno;
        if (rename(old, dir) != 0) rmdir(old);
        return kvs_fail(KVS_ERR_IO, "cannot replace %s: %s", dir, strerror(e));
    }
    remove_tree(old);
    return KVS_OK;
}

/* Writes `n` bytes of text as DIR/name through common/kvs_out.h. */
static kvs_status write_text(const char *dir, const char *name, const char *text, size_t n) {
    char p[4096];
    if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, name) >= sizeof p)
        return kvs_fail(KVS_ERR_IO, "report: path too long: %s/%s", dir, name);
    kvs_out *o = NULL;
    kvs_status st = kvs_out_open(p, &o);
    if (st != KVS_OK) return st;
    if ((st = kvs_out_write(o, text, n)) != KVS_OK) {
        kvs_out_abort(o);
        return st;
    }
    return kvs_out_commit(o);
}

static const char style[] =
    "body{font-family:sans-serif;max-width:1200px;margin:1em auto;color:#111;background:#fff}"
    "table{border-collapse:collapse;font-size:12px;margin:0.5em 0;display:block;overflow-x:auto}"
    "th,td{border:1px solid #bbb;padding:2px 6px;text-align:left;max-width:30em}th{background:#eee}"
    "figure{margin:1em 0}figure img{max-width:100%;border:1px solid #ddd}figcaption{font-size:13px;color:#444}"
    "nav li{font-size:14px}a{color:#222}";

/* Runs every section into its own buffers; appends the present ones to md/html. */
static kvs_status render_sections(report_ctx *ctx, FILE *md, FILE *html, kvs_report_result *res, char **absent_md,
                                  size_t *absent_md_len, FILE *absent_html) {
    FILE *amd = open_memstream(absent_md, absent_md_len);
    if (!amd) return kvs_fail(KVS_ERR_NOMEM, "report: out of memory");
    kvs_status st = KVS_OK;
    for (size_t i = 0; i < N_SECTIONS && st == KVS_OK; i++) {
        char *mb = NULL, *hb = NULL;
        size_t ml = 0, hl = 0;
        ctx->md = open_memstream(&mb, &ml);
        ctx->html = open_memstream(&hb, &hl);
        ctx->absent[0] = '\0';
        if (!ctx->md || !ctx->html) st = kvs_fail(KVS_ERR_NOMEM, "report: out of memory");
        else st = sections[i].render(ctx);
        if (ctx->md) fclose(ctx->md);
        if (ctx->html) fclose(ctx->html);
        ctx->md = ctx->html = NULL;
        if (st == KVS_OK && ctx->absent[0]) {
            res->n_absent++;
            fprintf(amd, "- **");
            md_text(amd, sections[i].title);
            fprintf(amd, "**: ");
            md_text(amd, ctx->absent);
            fputc('\n', amd);
            fputs("<li><b>", absent_html);
            html_text(absent_html, sections[i].title);
            fputs("</b>: ", absent_html);
            html_text(absent_html, ctx->absent);
            fputs("</li>\n", absent_html);
        } else if (st == KVS_OK) {
            res->n_present++;
            fprintf(md, "## ");
            md_text(md, sections[i].title);
            fprintf(md, "\n\n%s", mb ? mb : "");
            fprintf(html, "<section id=\"%s\">\n<h2>", sections[i].anchor);
            html_text(html, sections[i].title);
            fprintf(html, "</h2>\n%s</section>\n", hb ? hb : "");
        }
        free(mb);
        free(hb);
    }
    fclose(amd);
    return st;
}

static kvs_status write_report(report_ctx *ctx, kvs_report_result *res) {
    char *md = NULL, *html = NULL, *amd = NULL, *ahtml = NULL;
    size_t md_len = 0, html_len = 0, amd_len = 0, ahtml_len = 0;
    FILE *fm = open_memstream(&md, &md_len), *fh = open_memstream(&html, &html_len),
         *fah = open_memstream(&ahtml, &ahtml_len);
    kvs_status st = KVS_OK;
    if (!fm || !fh || !fah) st = kvs_fail(KVS_ERR_NOMEM, "report: out of memory");
    else st = render_sections(ctx, fm, fh, res, &amd, &amd_len, fah);
    if (fm) fclose(fm);
    if (fh) fclose(fh);
    if (fah) fclose(fah);
    if (st != KVS_OK) goto cleanup;
    /* The page: header, contents, the sections, what the database does not hold. */
    const char *dbname = kvs_path_base(ctx->opt->db_path);
    char *page_md = NULL, *page_html = NULL;
    size_t page_md_len = 0, page_html_len = 0;
    FILE *pm = open_memstream(&page_md, &page_md_len), *ph = open_memstream(&page_html, &page_html_len);
    if (!pm || !ph) {
        if (pm) fclose(pm);
        if (ph) fclose(ph);
        free(page_md);
        free(page_html);
        st = kvs_fail(KVS_ERR_NOMEM, "report: out of memory");
        goto cleanup;
    }
    fprintf(pm, "# kvsim study report: ");
    md_text(pm, dbname);
    fprintf(pm, "\n\nResults database `%s`: %" PRId64 " runs (%" PRId64 " complete). Written by `kvsim report` from "
                "the database alone; the HTML twin of this file embeds every plot.\n\n",
            ctx->opt->db_path, ctx->n_rows, ctx->n_complete);
    fprintf(pm, "%s", md ? md : "");
    if (res->n_absent) fprintf(pm, "## Not in this database\n\n%s\n", amd ? amd : "");
    fprintf(ph, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>kvsim study report: ");
    html_text(ph, dbname);
    fprintf(ph, "</title>\n<style>%s</style>\n</head>\n<body>\n<h1>kvsim study report: ", style);
    html_text(ph, dbname);
    fprintf(ph, "</h1>\n<p>Results database <code>");
    html_text(ph, ctx->opt->db_path);
    fprintf(ph, "</code>: %" PRId64 " runs (%" PRId64 " complete). Written by <code>kvsim report</code> from the "
                "database alone; every plot is embedded in this page.</p>\n<nav><ul>\n",
            ctx->n_rows, ctx->n_complete);
    /* Contents: the anchors of the present sections, found in the body just rendered. */
    for (size_t i = 0; i < N_SECTIONS; i++) {
        char id[96];
        snprintf(id, sizeof id, "<section id=\"%s\">", sections[i].anchor);
        if (!html || !strstr(html, id)) continue;
        fprintf(ph, "<li><a href=\"#%s\">", sections[i].anchor);
        html_text(ph, sections[i].title);
        fprintf(ph, "</a></li>\n");
    }
    if (res->n_absent) fprintf(ph, "<li><a href=\"#absent\">Not in this database</a></li>\n");
    fprintf(ph, "</ul></nav>\n%s", html ? html : "");
    if (res->n_absent)
        fprintf(ph, "<section id=\"absent\">\n<h2>Not in this database</h2>\n<ul>\n%s</ul>\n</section>\n",
                ahtml ? ahtml : "");
    fprintf(ph, "</body>\n</html>\n");
    fclose(pm);
    fclose(ph);
    st = write_text(ctx->tmp_dir, "report.md", page_md, page_md_len);
    if (st == KVS_OK) st = write_text(ctx->tmp_dir, "report.html", page_html, page_html_len);
    free(page_md);
    free(page_html);
cleanup:
    free(md);
    free(html);
    free(amd);
    free(ahtml);
    return st;
}

kvs_status kvs_report_write(const kvs_report_options *opt, kvs_report_result *res) {
    kvs_report_result dummy;
    if (!res) res = &dummy;
    memset(res, 0, sizeof *res);
    if (!opt || !opt->db_path || !opt->out_dir || !opt->out_dir[0])
        return kvs_fail(KVS_ERR_INVALID_ARG, "report: a database and an output folder are needed");
    /* DIR without trailing slashes, split into its parent and name (the temporary folder goes beside it). */
    char dir[4096], parent[4096], base[4096];
    size_t len = strlen(opt->out_dir);
    if (len >= sizeof dir) return kvs_fail(KVS_ERR_INVALID_ARG, "--out: path too long");
    memcpy(dir, opt->out_dir, len + 1);
    while (len > 1 && dir[len - 1] == '/') dir[--len] = '\0';
    const char *slash = strrchr(dir, '/');
    if (slash) {
        size_t pl = slash == dir ? 1 : (size_t)(slash - dir);
        memcpy(parent, dir, pl);
        parent[pl] = '\0';
    } else snprintf(parent, sizeof parent, ".");
    snprintf(base, sizeof base, "%s", slash ? slash + 1 : dir);
    if (!base[0] || !strcmp(base, ".") || !strcmp(base, "..") || !strcmp(dir, "/"))
        return kvs_fail(KVS_ERR_INVALID_ARG, "--out: '%s' does not name a folder to create", opt->out_dir);

    report_ctx ctx = {.opt = opt};
    char tmp[4096] = "";
    int exists = 0;
    kvs_status st = kvs_results_open_readonly(opt->db_path, &ctx.db);
    if (st != KVS_OK) return st;
    /* A damaged database fails the report: its sections could not tell "not in this database" from "not
     * readable", and a report of what happened to be readable would say things the study did not find. */
    KVS_TRY(st = kvs_results_check(ctx.db));
    kvs_results_filter f = {.include_failed = 1};
    KVS_TRY(st = kvs_results_query_runs(ctx.db, &f, &ctx.rows, &ctx.n_rows));
    if (ctx.n_rows == 0) {
        st = kvs_fail(KVS_ERR_DB, "%s: no runs in the database: nothing to report (kvsim replay TRACE --db %s ... "
                                  "records some)",
                      opt->db_path, opt->db_path);
        goto cleanup;
    }
    for (int64_t i = 0; i < ctx.n_rows; i++) ctx.n_complete += !strcmp(ctx.rows[i].status, "complete");
    KVS_TRY(st = check_out_dir(dir, &exists));
    if ((size_t)snprintf(tmp, sizeof tmp, "%s/.%s.tmp.XXXXXX", parent, base) >= sizeof tmp) {
        tmp[0] = '\0';
        st = kvs_fail(KVS_ERR_INVALID_ARG, "--out: path too long");
        goto cleanup;
    }
    if (!mkdtemp(tmp)) {
        st = kvs_fail(KVS_ERR_IO, "cannot create a folder beside %s: %s", dir, strerror(errno));
        tmp[0] = '\0';
        goto cleanup;
    }
    /* mkdtemp makes it 0700; a report is for reading. */
    mode_t um = umask(0);
    umask(um);
    chmod(tmp, 0777 & ~um);
    ctx.tmp_dir = tmp;
    KVS_TRY(st = write_report(&ctx, res));
    res->n_images = ctx.n_images;
    KVS_TRY(st = swap_in(tmp, dir, exists, parent, base));
    tmp[0] = '\0';
cleanup:
    if (tmp[0]) remove_tree(tmp);
    kvs_results_run_rows_free(ctx.rows, ctx.n_rows);
    kvs_results_close(ctx.db);
    if (st != KVS_OK) memset(res, 0, sizeof *res);
    return st;
}
