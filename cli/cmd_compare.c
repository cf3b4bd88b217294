/* cmd_compare.c — `kvsim compare DB --match mem|traffic|tokens --at X [--x-stat mean|max] [--max-ratio R]
 * [--metric M ...] [--per-trace|--across-traces [--pairs]] [--csv|--json] [filters]`: compares policies at an equal cost X, the budget-matching modes of
 * POLICY_SPEC.md §1.5:
 *   mem     = equal resident bytes including auxiliary structures (run-wide storage_bytes per KV head, its mean
 *             over steps or with --x-stat max its peak),
 *   traffic = equal HBM bytes read per decode step (run-wide traffic_bytes per KV head, mean or max; RocketKV's
 *             "token budget"),
 *   tokens  = each paper's nominal budget (budget_tokens per KV head).
 * ../shared/DESIGN.md ("Replay"): a policy that keeps every generated token (prompt-only compression) is
 * compared with the others at its measured memory, never only at its nominal budget — that is --match mem.
 *
 * Method (results/compare.h, shared with `kvsim report`): complete runs, read through results/results.h, grouped
 * into series (policy, params, codec, trace by content hash, measure, kv_bytes, aux_bytes); runs of one series at
 * the same x are averaged; at X a point at exactly X is used as is, two adjacent points at most --max-ratio apart that
 * bracket X are interpolated linearly in log(x), two farther apart are a "gap" (no value; both named), and a series
 * whose points do not reach X on both sides is "out of range [xmin, xmax]": never extrapolated. A value not
 * recorded in either bracketing run is not available ("-", empty, null). Flags as `kvsim runs` shows them (O P N).
 * Across traces (results/compare.h; the default when a model has several traces, --per-trace for the series): each
 * configuration's mean over its model's traces with a percentile bootstrap interval resampling traces, and the
 * paired difference of the first metric against the best configuration (--pairs: every pair), resolved when its
 * interval excludes 0.
 * Exit codes per cli.h: 0 compared, 1 database failure or nothing to compare, 2 bad usage.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../results/compare.h"
#include "../results/results.h"
#include "cli.h"

#define COMPARE_FILTERS (KVS_CLI_FILTER_POLICY | KVS_CLI_FILTER_TRACE | KVS_CLI_FILTER_MODEL | KVS_CLI_FILTER_MEASURE)
#define MAX_COLUMNS (KVS_N_METRICS * KVS_N_STATS)

/* The default columns: a human comparison picks these few on purpose. */
static const char default_metrics[] = "out_err_mean,out_err_p95,attn_recall_mean,topk_overlap_mean,"
                                      "attended_tokens_mean,storage_bytes_mean,traffic_bytes_mean";

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim compare DB --match mem|traffic|tokens --at X [--x-stat mean|max] [--max-ratio R]\n"
            "                        [--metric M ...] [--per-trace | --across-traces [--pairs]] [--csv | --json]\n"
            "                        [--policy NAME] [--trace PATH] [--model NAME] [--measure M]\n"
            "Compares the policies of the results database DB at an equal cost X (POLICY_SPEC.md 1.5,\n"
            "budget-matching modes). A series is the complete runs of one (policy, params, codec, trace, measure,\n"
            "kv_bytes, aux_bytes): a trace is its content hash, so one file through two paths is one trace, two\n"
            "files with one name two (labelled <model>@<8 hex>); runs with other --kv-bytes/--aux-bytes are\n"
            "other series (labelled [kv_bytes=K,aux_bytes=A] when that is all that differs); a run of\n"
            "kvsim replay --codec has its canonical spec in brackets after the params. Each run's x is\n"
            "  --match mem      its resident bytes per KV head (storage_bytes_mean: KV + auxiliary)\n"
            "  --match traffic  its bytes read per step per KV head (traffic_bytes_mean)\n"
            "  --match tokens   its nominal budget (budget_tokens per KV head)\n"
            "Runs of one series at the same x are averaged. A run at exactly X is used as is. Between the two\n"
            "adjacent runs whose x bracket X, every metric is interpolated linearly in log(x) when x_hi / x_lo\n"
            "<= R; a wider span is a \"gap\" (the policy's cost jumps there, e.g. MorphKV's profiles once its\n"
            "budget passes its window): no value, both runs and budgets named; measure budgets inside it to\n"
            "close it. A series whose runs do not reach X on both sides is \"out of range [xmin, xmax]\", never\n"
            "extrapolated. Flags: O oracle, P prompt-only budget, N a replay note on a run the value comes from\n"
            "(kvsim runs DB shows it). Rows are sorted by the first metric, best first.\n"
            "  --at X        the cost to compare at, > 0: a number with an optional suffix K M G T (x1000^n) or\n"
            "                Ki Mi Gi Ti (x1024^n), optionally followed by B: 12K = 12000, 3.5MiB = 3670016, 1e6\n"
            "  --x-stat S    mem, traffic: mean (default) or max = the peak over steps (storage_bytes_max,\n"
            "                traffic_bytes_max), as kvsim plot --x-stat\n"
            "  --max-ratio R the widest x_hi / x_lo interpolated across, >= 1 (default %g: two doublings of a\n"
            "                power-of-two sweep; inf = any span)\n"
            "  --metric M    <metric>_<stat> of the metric table (stat: mean p50 p95 max min), repeatable or\n"
            "                comma-separated; default:\n"
            "                %s\n"
            "  --csv         one row per series: policy,params,codec,page,page_score,flags,is_oracle,prompt_only,\n"
            "                degenerate,kv_bytes,aux_bytes,trace,trace_label,trace_sha256,model,measure,match,x,\n"
            "                at,status,\n"
            "                run_lo,run_hi,budget_lo,budget_hi,x_lo,x_hi,x_min,x_max, then the metrics (page: 0 =\n"
            "                token granularity; page_score: max or sum, empty for the count rule; codec:\n"
            "                empty = K/V as captured; status: interpolated, exact, gap, out_of_range, no_x = the\n"
            "                runs have no recorded x)\n"
            "  --json        one object with the match, x, X, the ratio and one entry per series (codec: null =\n"
            "                K/V as captured)\n"
            "Across traces (the default as soon as a model has two or more traces in DB, e.g. one per prompt from\n"
            "examples/capture_prompts.sh): the series are grouped by (policy, params, codec, measure, kv_bytes,\n"
            "aux_bytes, model); each group's value is its MEAN over the traces of its model where it has a value\n"
            "at X, with the percentile bootstrap 95%% interval [lo, hi] resampling traces (%d resamples, seeded\n"
            "from what is compared: the same database gives the same intervals) and n = traces used; the traces\n"
            "it is excluded on are named (out of range, gap, no x, not run). The first metric's difference\n"
            "between two groups is PAIRED: the mean of (a - b) over the traces both have a value on, with its\n"
            "interval; it is resolved when the interval excludes 0. One trace: the value alone (one trace: no\n"
            "interval).\n"
            "  --per-trace     one row per series (per trace), as with a single trace\n"
            "  --across-traces the groups even when every model has one trace\n"
            "  --pairs         every pair of groups of a model (default: each group against the best one, the\n"
            "                  first non-oracle group by the first metric); implies --across-traces\n"
            "  --csv across:   one row per group: policy,params,codec,page,page_score,label,flags,is_oracle,\n"
            "                  prompt_only,degenerate,kv_bytes,aux_bytes,model,measure,match,x,at,n_traces,n,\n"
            "                  n_out_of_range,n_gap,n_no_x,\n"
            "                  n_not_run,excluded, per metric M: M,M_lo,M_hi,M_n, then vs_best,<M1>_diff,\n"
            "                  <M1>_diff_lo,<M1>_diff_hi,<M1>_diff_n,resolved (-1 below the best, +1 above, 0 not\n"
            "                  resolved); with --pairs one row per pair: model,measure,match,x,at,metric,a,b,diff,\n"
            "                  diff_lo,diff_hi,n,resolved\n"
            "  --json across:  {\"view\":\"across_traces\", ..., \"sets\":[{model, measure, traces, best, groups\n"
            "                  (values: {mean, lo, hi, n, seed}, excluded, vs_best)[, pairs]}]}\n",
            KVS_COMPARE_MAX_RATIO, default_metrics, KVS_BOOTSTRAP_REPS);
    kvs_cli_filter_usage(f, COMPARE_FILTERS);
}

/* Appends the comma-separated metric columns of `list` to cols; returns 0, or the usage exit code. */
/* A run's page score rule in JSON: "page_score":"max" or "sum", null for the count rule or no pages. */
static void json_page_score(FILE *o, const char *rule) {
    if (rule && rule[0]) fprintf(o, ",\"page_score\":\"%s\"", rule);
    else fputs(",\"page_score\":null", o);
}

static int parse_metrics(const char *list, kvs_compare_column *cols, int *n) {
    const char *p = list;
    for (;;) {
        size_t len = strcspn(p, ",");
        kvs_compare_column c;
        char name[sizeof c.name];
        if (len == 0 || len >= sizeof name)
            return kvs_cli_usage_error("compare", "--metric: bad metric list '%s' (an empty or overlong name)", list);
        memcpy(name, p, len);
        name[len] = '\0';
        if (kvs_compare_column_parse(name, &c) != KVS_OK)
            return kvs_cli_usage_error("compare", "--metric: %s", kvs_last_error());
        if (*n == MAX_COLUMNS) return kvs_cli_usage_error("compare", "--metric: at most %d metrics", MAX_COLUMNS);
        cols[(*n)++] = c;
        p += len;
        if (*p == '\0') return 0;
        p++; /* the comma: a name must follow */
    }
}

/* x for the human table: bytes with a binary prefix, tokens as an integer. */
static void fmt_x(char *buf, size_t cap, double x, kvs_compare_match mode) {
    if (mode == KVS_COMPARE_TOKENS) snprintf(buf, cap, "%.6g", x);
    else kvs_cli_fmt_bytes(buf, cap, x);
}

static void fmt_value(char *buf, size_t cap, double v, const kvs_compare_column *c) {
    if (isnan(v)) snprintf(buf, cap, "-");
    else if (kvs_metric_table[c->m].kind == KVS_METRIC_BYTES) kvs_cli_fmt_bytes(buf, cap, v);
    else if (kvs_metric_table[c->m].kind == KVS_METRIC_TOKENS) snprintf(buf, cap, "%.1f", v);
    else snprintf(buf, cap, "%.4g", v);
}

/* Where a row's values come from, or why it has none (the table's "from runs" column). */
static void fmt_from(char *buf, size_t cap, const kvs_compare *cmp, const kvs_compare_series *s) {
    kvs_compare_match mode = kvs_compare_match_of(cmp);
    char a[64], b[64];
    if (s->status == KVS_COMPARE_NO_X) {
        snprintf(buf, cap, "no recorded %s in its runs", kvs_compare_x_name(cmp));
        return;
    }
    if (s->status == KVS_COMPARE_OUT_OF_RANGE) {
        fmt_x(a, sizeof a, s->pts[0].x, mode);
        fmt_x(b, sizeof b, s->pts[s->n - 1].x, mode);
        snprintf(buf, cap, "out of range [%s, %s]", a, b);
        return;
    }
    const kvs_compare_point *lo = &s->pts[s->lo], *hi = &s->pts[s->hi];
    fmt_x(a, sizeof a, lo->x, mode);
    fmt_x(b, sizeof b, hi->x, mode);
    if (s->status == KVS_COMPARE_EXACT) snprintf(buf, cap, "#%" PRId64 " at %s (exact)", lo->run_id, a);
    else if (s->status == KVS_COMPARE_GAP)
        snprintf(buf, cap, "gap: #%" PRId64 " (budget %" PRId64 ") at %s .. #%" PRId64 " (budget %" PRId64
                           ") at %s, x ratio %.3g > %g",
                 lo->run_id, lo->budget_tokens, a, hi->run_id, hi->budget_tokens, b, hi->x / lo->x,
                 kvs_compare_max_ratio(cmp));
    else snprintf(buf, cap, "#%" PRId64 " at %s .. #%" PRId64 " at %s (t=%.3f)", lo->run_id, a, hi->run_id, b, s->t);
}

static int col_width(const kvs_compare_column *c) { return strlen(c->name) > 10 ? (int)strlen(c->name) : 10; }

static void print_table(FILE *o, const kvs_compare *cmp, const kvs_compare_column *cols, int n_cols) {
    size_t n = kvs_compare_n_series(cmp);
    double X = kvs_compare_at(cmp);
    kvs_compare_match mode = kvs_compare_match_of(cmp);
    char xb[64];
    fmt_x(xb, sizeof xb, X, mode);
    fprintf(o, "compare at %s = %.17g%s%s%s (--match %s): %zu series\n", kvs_compare_x_name(cmp), X,
            mode == KVS_COMPARE_TOKENS ? "" : " (", mode == KVS_COMPARE_TOKENS ? "" : xb,
            mode == KVS_COMPARE_TOKENS ? "" : " per KV head)", kvs_compare_match_name(mode), n);
    fprintf(o, "values interpolated linearly in log(%s) between the two adjacent runs that bracket it when they are at "
               "most %gx apart; sorted by %s (%s is better)\n\n",
            kvs_compare_x_name(cmp), kvs_compare_max_ratio(cmp), cols[0].name,
            kvs_metric_table[cols[0].m].higher_is_better ? "higher" : "lower");
    /* One layout with `kvsim runs`: fixed-width labelled columns, the free-length params last. The source
     * of each row (the runs interpolated between, or why there is no value) is formatted first so its
     * column can be as wide as its longest entry. */
    int pw = 6, tw = 5, fw = 9, vw = 0;
    char(*from)[256] = calloc(n ? n : 1, sizeof *from);
    if (!from) return;
    for (int c = 0; c < n_cols; c++) vw += 1 + col_width(&cols[c]);
    for (size_t i = 0; i < n; i++) {
        const kvs_compare_series *s = kvs_compare_series_at(cmp, i);
        fmt_from(from[i], sizeof from[i], cmp, s);
        int l = (int)strlen(s->rep->policy), t = (int)strlen(s->trace_label), f = (int)strlen(from[i]);
        if (l > pw) pw = l;
        if (t > tw) tw = t;
        if (f > fw) fw = f;
    }
    if (tw > 40) tw = 40;
    fprintf(o, "%-*s %-5s %-7s %-*s", pw, "policy", "flags", "measure", tw, "trace");
    for (int c = 0; c < n_cols; c++) fprintf(o, " %*s", col_width(&cols[c]), cols[c].name);
    fprintf(o, "  %-*s  params\n", fw, "from runs");
    int any_o = 0, any_p = 0, any_n = 0, any_gap = 0;
    for (size_t i = 0; i < n; i++) {
        const kvs_compare_series *s = kvs_compare_series_at(cmp, i);
        char flags[KVS_COMPARE_FLAGS_CAP];
        kvs_compare_series_flags(s, flags);
        any_o |= s->is_oracle;
        any_p |= s->prompt_only;
        any_n |= s->degenerate;
        any_gap |= s->status == KVS_COMPARE_GAP;
        fprintf(o, "%-*s %-5s %-7s %-*.*s", pw, s->rep->policy, flags[0] ? flags : "-", s->rep->measure, tw, tw,
                s->trace_label);
        if (s->status > KVS_COMPARE_EXACT) fprintf(o, "%*s", vw, "");
        else
            for (int c = 0; c < n_cols; c++) {
                char v[64];
                fmt_value(v, sizeof v, s->val[c], &cols[c]);
                fprintf(o, " %*s", col_width(&cols[c]), v);
            }
        char pl[512];
        kvs_results_run_params_label(s->rep, pl, sizeof pl); /* the codec after the params, as labels name it */
        fprintf(o, "  %-*s  %s", fw, from[i], pl);
        if (s->bytes_in_label && s->kv_bytes >= 0) fprintf(o, " [kv_bytes=%d,aux_bytes=%d]", s->kv_bytes, s->aux_bytes);
        else if (s->bytes_in_label) fputs(" [bytes not recorded]", o);
        fputc('\n', o);
    }
    if (any_o) fprintf(o, "O  oracle: looks at full attention (a bound, not a deployable policy)\n");
    if (any_p)
        fprintf(o, "P  prompt-only budget: generated tokens are all kept, so its memory grows with the response; "
                   "compare it at measured memory (--match mem)\n");
    if (any_n)
        fprintf(o, "N  note: a run this row's value comes from degenerates at its budget or on this trace (kvsim "
                   "replay warned; kvsim runs shows the note)\n");
    if (any_gap)
        fprintf(o, "gap: the two runs around X are more than %gx apart in %s, so no measured configuration lies near "
                   "X: no value (add budgets between them, or --max-ratio)\n",
                kvs_compare_max_ratio(cmp), kvs_compare_x_name(cmp));
    free(from);
}

static void csv_real(FILE *o, double v) {
    char buf[64];
    kvs_cli_fmt_real(buf, sizeof buf, v);
    fputs(buf, o);
}

static void print_csv(FILE *o, const kvs_compare *cmp, const kvs_compare_column *cols, int n_cols) {
    size_t n = kvs_compare_n_series(cmp);
    double X = kvs_compare_at(cmp);
    kvs_compare_match mode = kvs_compare_match_of(cmp);
    fputs("policy,params,codec,page,page_score,flags,is_oracle,prompt_only,degenerate,kv_bytes,aux_bytes,trace,"
          "trace_label,"
          "trace_sha256,model,measure,match,x,at,status,run_lo,run_hi,budget_lo,budget_hi,x_lo,x_hi,x_min,x_max",
          o);
    for (int c = 0; c < n_cols; c++) fprintf(o, ",%s", cols[c].name);
    fputc('\n', o);
    for (size_t i = 0; i < n; i++) {
        const kvs_compare_series *s = kvs_compare_series_at(cmp, i);
        int usable = s->status <= KVS_COMPARE_EXACT, bracket = usable || s->status == KVS_COMPARE_GAP;
        char flags[KVS_COMPARE_FLAGS_CAP];
        kvs_compare_series_flags(s, flags);
        kvs_cli_csv_field(o, s->rep->policy);
        fputc(',', o);
        kvs_cli_csv_field(o, s->rep->params);
        fputc(',', o);
        kvs_cli_csv_field(o, s->rep->codec); /* empty: K/V as captured */
        fprintf(o, ",%" PRId64 ",%s,%s,%d,%d,%d,", s->rep->page, s->rep->page_score, flags, s->is_oracle,
                s->prompt_only, s->degenerate);
        if (s->kv_bytes >= 0) fprintf(o, "%d,%d,", s->kv_bytes, s->aux_bytes);
        else fputs(",,", o);
        kvs_cli_csv_field(o, s->rep->trace_path);
        fputc(',', o);
        kvs_cli_csv_field(o, s->trace_label);
        fputc(',', o);
        kvs_cli_csv_field(o, s->rep->trace_sha256);
        fputc(',', o);
        kvs_cli_csv_field(o, s->rep->model);
        fputc(',', o);
        kvs_cli_csv_field(o, s->rep->measure);
        fprintf(o, ",%s,%s,", kvs_compare_match_name(mode), kvs_compare_x_name(cmp));
        csv_real(o, X);
        fprintf(o, ",%s,", kvs_compare_status_name(s->status));
        if (bracket)
            fprintf(o, "%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 ",", s->pts[s->lo].run_id, s->pts[s->hi].run_id,
                    s->pts[s->lo].budget_tokens, s->pts[s->hi].budget_tokens);
        else fputs(",,,,", o);
        if (bracket) {
            csv_real(o, s->pts[s->lo].x);
            fputc(',', o);
            csv_real(o, s->pts[s->hi].x);
        } else fputc(',', o);
        fputc(',', o);
        if (s->n) {
            csv_real(o, s->pts[0].x);
            fputc(',', o);
            csv_real(o, s->pts[s->n - 1].x);
        } else fputc(',', o);
        for (int c = 0; c < n_cols; c++) {
            fputc(',', o);
            if (usable) csv_real(o, s->val[c]);
        }
        fputc('\n', o);
    }
}

static void json_point_pair(FILE *o, const char *key, double a, double b) {
    fprintf(o, ",\"%s\":[", key);
    kvs_cli_json_number(o, a);
    fputc(',', o);
    kvs_cli_json_number(o, b);
    fputc(']', o);
}

static void print_json(FILE *o, const kvs_compare *cmp, const kvs_compare_column *cols, int n_cols) {
    size_t n = kvs_compare_n_series(cmp);
    double X = kvs_compare_at(cmp);
    kvs_compare_match mode = kvs_compare_match_of(cmp);
    fprintf(o, "{\"match\":\"%s\",\"x\":\"%s\",\"at\":", kvs_compare_match_name(mode), kvs_compare_x_name(cmp));
    kvs_cli_json_number(o, X);
    fprintf(o, ",\"max_ratio\":");
    kvs_cli_json_number(o, kvs_compare_max_ratio(cmp)); /* inf: null, any span */
    fprintf(o, ",\"metrics\":[");
    for (int c = 0; c < n_cols; c++) fprintf(o, "%s\"%s\"", c ? "," : "", cols[c].name);
    fprintf(o, "],\"series\":[");
    for (size_t i = 0; i < n; i++) {
        const kvs_compare_series *s = kvs_compare_series_at(cmp, i);
        int usable = s->status <= KVS_COMPARE_EXACT, bracket = usable || s->status == KVS_COMPARE_GAP;
        char flags[KVS_COMPARE_FLAGS_CAP];
        kvs_compare_series_flags(s, flags);
        fprintf(o, "%s\n{\"policy\":", i ? "," : "");
        kvs_cli_json_string(o, s->rep->policy);
        fprintf(o, ",\"params\":");
        kvs_cli_json_string(o, s->rep->params);
        fprintf(o, ",\"codec\":");
        kvs_cli_json_string(o, s->rep->codec); /* null: K/V as captured */
        fprintf(o, ",\"page\":%" PRId64, s->rep->page); /* 0: token granularity */
        json_page_score(o, s->rep->page_score);
        fprintf(o, ",\"flags\":\"%s\",\"is_oracle\":%s,\"prompt_only\":%s,\"degenerate\":%s,\"kv_bytes\":", flags,
                s->is_oracle ? "true" : "false", s->prompt_only ? "true" : "false", s->degenerate ? "true" : "false");
        if (s->kv_bytes >= 0) fprintf(o, "%d,\"aux_bytes\":%d", s->kv_bytes, s->aux_bytes);
        else fputs("null,\"aux_bytes\":null", o);
        fprintf(o, ",\"label\":");
        kvs_cli_json_string(o, s->label);
        fprintf(o, ",\"trace\":{\"id\":%" PRId64 ",\"path\":", s->rep->trace_id);
        kvs_cli_json_string(o, s->rep->trace_path);
        fprintf(o, ",\"label\":");
        kvs_cli_json_string(o, s->trace_label);
        fprintf(o, ",\"sha256\":");
        if (s->rep->trace_sha256) kvs_cli_json_string(o, s->rep->trace_sha256);
        else fputs("null", o);
        fprintf(o, ",\"model\":");
        kvs_cli_json_string(o, s->rep->model);
        fprintf(o, "},\"measure\":");
        kvs_cli_json_string(o, s->rep->measure);
        fprintf(o, ",\"status\":\"%s\",\"x_range\":", kvs_compare_status_name(s->status));
        if (s->n) {
            fputc('[', o);
            kvs_cli_json_number(o, s->pts[0].x);
            fputc(',', o);
            kvs_cli_json_number(o, s->pts[s->n - 1].x);
            fputc(']', o);
        } else fputs("null", o);
        if (bracket) {
            const kvs_compare_point *lo = &s->pts[s->lo], *hi = &s->pts[s->hi];
            fprintf(o, ",\"runs\":[%" PRId64 ",%" PRId64 "],\"budgets\":[%" PRId64 ",%" PRId64 "]", lo->run_id,
                    hi->run_id, lo->budget_tokens, hi->budget_tokens);
            json_point_pair(o, "x", lo->x, hi->x);
            fprintf(o, ",\"t\":");
            kvs_cli_json_number(o, s->t);
        } else fprintf(o, ",\"runs\":null,\"budgets\":null,\"x\":null,\"t\":null");
        if (usable) {
            fprintf(o, ",\"values\":{");
            for (int c = 0; c < n_cols; c++) {
                fprintf(o, "%s\"%s\":", c ? "," : "", cols[c].name);
                kvs_cli_json_number(o, s->val[c]);
            }
            fputc('}', o);
        } else fprintf(o, ",\"values\":null");
        fputc('}', o);
    }
    fprintf(o, "\n]}\n");
}

/* ------------------------------------------------------------------------------------------------
 * Across traces (results/compare.h): each configuration's mean over the traces of its model, its interval, and
 * the paired differences
 * ---------------------------------------------------------------------------------------------- */

/* "mean [lo, hi]" of one interval as the table prints it; the value alone over one trace; "-" over none. */
static void fmt_interval(char *buf, size_t cap, const kvs_interval *iv, const kvs_compare_column *c) {
    char m[64], lo[64], hi[64];
    if (iv->n == 0) {
        snprintf(buf, cap, "-");
        return;
    }
    fmt_value(m, sizeof m, iv->mean, c);
    if (iv->n == 1) {
        snprintf(buf, cap, "%s", m);
        return;
    }
    fmt_value(lo, sizeof lo, iv->lo, c);
    fmt_value(hi, sizeof hi, iv->hi, c);
    snprintf(buf, cap, "%s [%s, %s]", m, lo, hi);
}

/* A difference as the table prints it: signed, 4 significant digits (bytes and tokens too: a difference of a
 * few bytes reads better as a number than with a prefix). */
static void fmt_diff(char *buf, size_t cap, const kvs_interval *d) {
    if (d->n == 0) snprintf(buf, cap, "no trace in common");
    else if (d->n == 1) snprintf(buf, cap, "%+.4g over one trace: no interval", d->mean);
    else snprintf(buf, cap, "%+.4g [%+.4g, %+.4g] over %zu traces", d->mean, d->lo, d->hi, d->n);
}

/* Whether d = a - b orders a and b, in words. */
static void fmt_resolved(char *buf, size_t cap, const kvs_compare_diff *d, const char *a, const char *b,
                         const kvs_compare_column *c) {
    int hb = kvs_metric_table[c->m].higher_is_better != 0;
    if (d->d.n < 2 || !d->resolved) snprintf(buf, cap, "not resolved");
    else
        snprintf(buf, cap, "resolved: %s better (%s %s)", (d->resolved < 0) != hb ? a : b, hb ? "higher" : "lower",
                 c->name);
}

/* The table's "excluded" cell: how many traces a group lost, by reason ("-" none). */
static void excluded_counts(char *buf, size_t cap, const kvs_compare_group *g) {
    const size_t n[] = {g->n_out_of_range, g->n_gap, g->n_no_x, g->n_not_run};
    static const char *const why[] = {"out of range", "gap", "no x", "not run"};
    size_t len = 0;
    buf[0] = '\0';
    for (int r = 0; r < 4 && len < cap; r++)
        if (n[r]) len += (size_t)snprintf(buf + len, cap - len, "%s%zu %s", len ? ", " : "", n[r], why[r]);
}

static void print_across_table(FILE *o, const kvs_compare *cmp, const kvs_compare_across *ac,
                               const kvs_compare_column *cols, int n_cols, int pairs, kvs_status *st) {
    double X = kvs_compare_at(cmp);
    kvs_compare_match mode = kvs_compare_match_of(cmp);
    char xb[64];
    fmt_x(xb, sizeof xb, X, mode);
    fprintf(o, "compare at %s = %.17g%s%s%s (--match %s) across traces: %zu (model, measure) "
               "set%s, %zu configurations (--per-trace: each trace's series)\n",
            kvs_compare_x_name(cmp), X, mode == KVS_COMPARE_TOKENS ? "" : " (", mode == KVS_COMPARE_TOKENS ? "" : xb,
            mode == KVS_COMPARE_TOKENS ? "" : " per KV head)", kvs_compare_match_name(mode),
            kvs_compare_across_n_sets(ac), kvs_compare_across_n_sets(ac) == 1 ? "" : "s",
            kvs_compare_across_n_groups(ac));
    fprintf(o, "each configuration's value at X on each trace (interpolated in log(%s) between runs at most %gx "
               "apart), then its mean over the traces of its model where it has one, [lo, hi] = percentile bootstrap "
               "%g%% interval resampling traces (%d resamples, seeded from what is compared), n = traces used; sorted "
               "by %s (%s is better)\n",
            kvs_compare_x_name(cmp), kvs_compare_max_ratio(cmp), 100 * 0.95, KVS_BOOTSTRAP_REPS, cols[0].name,
            kvs_metric_table[cols[0].m].higher_is_better ? "higher" : "lower");
    int any_o = 0, any_p = 0, any_n = 0;
    for (size_t k = 0; k < kvs_compare_across_n_sets(ac) && *st == KVS_OK; k++) {
        const kvs_compare_set *set = kvs_compare_across_set_at(ac, k);
        fprintf(o, "\nmodel %s, measure %s: %zu trace%s%s\n", set->model[0] ? set->model : "(unknown)", set->measure,
                set->n_traces, set->n_traces == 1 ? "" : "s", set->n_traces == 1 ? " (one trace: no interval)" : "");
        /* widths: each column as wide as its widest cell */
        size_t ng = set->n;
        int pw = 6, ew = 8, *cw = calloc((size_t)n_cols, sizeof *cw);
        char(*cells)[208] = calloc(ng * (size_t)n_cols + 1, sizeof *cells);
        char(*excl)[512] = calloc(ng + 1, sizeof *excl);
        if (!cw || !cells || !excl) {
            free(cw), free(cells), free(excl);
            *st = kvs_fail(KVS_ERR_NOMEM, "compare: out of memory");
            return;
        }
        for (int c = 0; c < n_cols; c++) cw[c] = col_width(&cols[c]);
        for (size_t i = 0; i < ng; i++) {
            const kvs_compare_group *g = kvs_compare_across_group_at(ac, set->first + i);
            if ((int)strlen(g->rep->rep->policy) > pw) pw = (int)strlen(g->rep->rep->policy);
            for (int c = 0; c < n_cols; c++) {
                char *cell = cells[i * (size_t)n_cols + (size_t)c];
                fmt_interval(cell, sizeof cells[0], &g->col[c], &cols[c]);
                if ((int)strlen(cell) > cw[c]) cw[c] = (int)strlen(cell);
            }
            excluded_counts(excl[i], sizeof excl[i], g);
            if ((int)strlen(excl[i]) > ew) ew = (int)strlen(excl[i]);
        }
        fprintf(o, "%-*s %-5s %7s", pw, "policy", "flags", "n");
        for (int c = 0; c < n_cols; c++) fprintf(o, "  %*s", cw[c], cols[c].name);
        fprintf(o, "  %-*s  params\n", ew, "excluded");
        for (size_t i = 0; i < ng; i++) {
            const kvs_compare_group *g = kvs_compare_across_group_at(ac, set->first + i);
            char flags[KVS_COMPARE_FLAGS_CAP], nn[32];
            kvs_compare_group_flags(g, flags);
            any_o |= g->is_oracle, any_p |= g->prompt_only, any_n |= g->degenerate;
            snprintf(nn, sizeof nn, "%zu/%zu", g->n_used, set->n_traces);
            fprintf(o, "%-*s %-5s %7s", pw, g->rep->rep->policy, flags[0] ? flags : "-", nn);
            for (int c = 0; c < n_cols; c++) fprintf(o, "  %*s", cw[c], cells[i * (size_t)n_cols + (size_t)c]);
            char pl[512];
            kvs_results_run_params_label(g->rep->rep, pl, sizeof pl);
            fprintf(o, "  %-*s  %s", ew, excl[i][0] ? excl[i] : "-", pl);
            if (g->rep->bytes_in_label && g->rep->kv_bytes >= 0)
                fprintf(o, " [kv_bytes=%d,aux_bytes=%d]", g->rep->kv_bytes, g->rep->aux_bytes);
            fputc('\n', o);
        }
        free(cw), free(cells), free(excl);
        for (size_t i = 0; i < ng; i++) { /* which traces, for the rows that lost some */
            const kvs_compare_group *g = kvs_compare_across_group_at(ac, set->first + i);
            char names[4096];
            kvs_compare_group_excluded(ac, g, names, sizeof names);
            if (names[0]) fprintf(o, "  %s excluded on %s\n", g->label, names);
        }
        if (set->best == SIZE_MAX || ng < 2) continue;
        /* the paired differences: each configuration against the best, or every pair with --pairs */
        const kvs_compare_group *best = kvs_compare_across_group_at(ac, set->best);
        if (pairs) fprintf(o, "paired differences of %s, row - column (mean over the traces both have a value on):\n",
                           cols[0].name);
        else
            fprintf(o, "paired differences of %s against the best, %s: mean of (row - best) over the traces both "
                       "have a value on (--pairs: every pair)\n",
                    cols[0].name, best->label);
        for (size_t i = 0; i < ng && *st == KVS_OK; i++)
            for (size_t j = pairs ? i + 1 : 0; j < (pairs ? ng : 1) && *st == KVS_OK; j++) {
                size_t ga = set->first + i, gb = pairs ? set->first + j : set->best;
                if (ga == gb || kvs_compare_across_group_at(ac, ga)->col[0].n == 0 ||
                    kvs_compare_across_group_at(ac, gb)->col[0].n == 0)
                    continue; /* a configuration without a value at X has nothing to difference */
                kvs_compare_diff d;
                if ((*st = kvs_compare_across_diff(ac, ga, gb, 0, &d)) != KVS_OK) return;
                const kvs_compare_group *A = kvs_compare_across_group_at(ac, ga), *B = kvs_compare_across_group_at(ac, gb);
                char ds[160], rs[1200];
                fmt_diff(ds, sizeof ds, &d.d);
                fmt_resolved(rs, sizeof rs, &d, A->label, B->label, &cols[0]);
                fprintf(o, "  %s - %s: %s: %s\n", A->label, B->label, ds, rs);
            }
    }
    if (any_o) fprintf(o, "O  oracle: looks at full attention (a bound, not a deployable policy)\n");
    if (any_p)
        fprintf(o, "P  prompt-only budget: generated tokens are all kept, so its memory grows with the response; "
                   "compare it at measured memory (--match mem)\n");
    if (any_n)
        fprintf(o, "N  note: a run some trace's value comes from degenerates at its budget or on that trace (kvsim "
                   "runs shows the note)\n");
}

static void csv_interval(FILE *o, const kvs_interval *iv) {
    if (iv->n) {
        csv_real(o, iv->mean);
        fputc(',', o);
        csv_real(o, iv->lo);
        fputc(',', o);
        csv_real(o, iv->hi);
    } else fputs(",,", o);
    fprintf(o, ",%zu", iv->n);
}

static void print_across_csv(FILE *o, const kvs_compare *cmp, const kvs_compare_across *ac,
                             const kvs_compare_column *cols, int n_cols, int pairs, kvs_status *st) {
    double X = kvs_compare_at(cmp);
    kvs_compare_match mode = kvs_compare_match_of(cmp);
    if (pairs) {
        fputs("model,measure,match,x,at,metric,a,b,diff,diff_lo,diff_hi,n,resolved\n", o);
        for (size_t k = 0; k < kvs_compare_across_n_sets(ac); k++) {
            const kvs_compare_set *set = kvs_compare_across_set_at(ac, k);
            for (size_t ga = set->first; ga < set->first + set->n; ga++)
                for (size_t gb = ga + 1; gb < set->first + set->n; gb++) {
                    kvs_compare_diff d;
                    if ((*st = kvs_compare_across_diff(ac, ga, gb, 0, &d)) != KVS_OK) return;
                    kvs_cli_csv_field(o, set->model);
                    fputc(',', o);
                    kvs_cli_csv_field(o, set->measure);
                    fprintf(o, ",%s,%s,", kvs_compare_match_name(mode), kvs_compare_x_name(cmp));
                    csv_real(o, X);
                    fprintf(o, ",%s,", cols[0].name);
                    kvs_cli_csv_field(o, kvs_compare_across_group_at(ac, ga)->label);
                    fputc(',', o);
                    kvs_cli_csv_field(o, kvs_compare_across_group_at(ac, gb)->label);
                    fputc(',', o);
                    csv_interval(o, &d.d);
                    fprintf(o, ",%d\n", d.resolved);
                }
        }
        return;
    }
    fputs("policy,params,codec,page,page_score,label,flags,is_oracle,prompt_only,degenerate,kv_bytes,aux_bytes,model,"
          "measure,match,x,"
          "at,n_traces,n,n_out_of_range,n_gap,n_no_x,n_not_run,excluded",
          o);
    for (int c = 0; c < n_cols; c++)
        fprintf(o, ",%s,%s_lo,%s_hi,%s_n", cols[c].name, cols[c].name, cols[c].name, cols[c].name);
    fprintf(o, ",vs_best,%s_diff,%s_diff_lo,%s_diff_hi,%s_diff_n,resolved\n", cols[0].name, cols[0].name,
            cols[0].name, cols[0].name);
    for (size_t k = 0; k < kvs_compare_across_n_sets(ac); k++) {
        const kvs_compare_set *set = kvs_compare_across_set_at(ac, k);
        for (size_t gi = set->first; gi < set->first + set->n; gi++) {
            const kvs_compare_group *g = kvs_compare_across_group_at(ac, gi);
            char flags[KVS_COMPARE_FLAGS_CAP], excl[2048];
            kvs_compare_group_flags(g, flags);
            kvs_compare_group_excluded(ac, g, excl, sizeof excl);
            kvs_cli_csv_field(o, g->rep->rep->policy);
            fputc(',', o);
            kvs_cli_csv_field(o, g->rep->rep->params);
            fputc(',', o);
            kvs_cli_csv_field(o, g->rep->rep->codec);
            fprintf(o, ",%" PRId64 ",%s,", g->rep->rep->page, g->rep->rep->page_score);
            kvs_cli_csv_field(o, g->label);
            fprintf(o, ",%s,%d,%d,%d,", flags, g->is_oracle, g->prompt_only, g->degenerate);
            if (g->rep->kv_bytes >= 0) fprintf(o, "%d,%d,", g->rep->kv_bytes, g->rep->aux_bytes);
            else fputs(",,", o);
            kvs_cli_csv_field(o, set->model);
            fputc(',', o);
            kvs_cli_csv_field(o, set->measure);
            fprintf(o, ",%s,%s,", kvs_compare_match_name(mode), kvs_compare_x_name(cmp));
            csv_real(o, X);
            fprintf(o, ",%zu,%zu,%zu,%zu,%zu,%zu,", set->n_traces, g->n_used, g->n_out_of_range, g->n_gap, g->n_no_x,
                    g->n_not_run);
            kvs_cli_csv_field(o, excl);
            for (int c = 0; c < n_cols; c++) {
                fputc(',', o);
                csv_interval(o, &g->col[c]);
            }
            if (set->best != SIZE_MAX && set->best != gi) {
                kvs_compare_diff d;
                if ((*st = kvs_compare_across_diff(ac, gi, set->best, 0, &d)) != KVS_OK) return;
                fputc(',', o);
                kvs_cli_csv_field(o, kvs_compare_across_group_at(ac, set->best)->label);
                fputc(',', o);
                csv_interval(o, &d.d);
                fprintf(o, ",%d\n", d.resolved);
            } else fputs(",,,,,,\n", o);
        }
    }
}

static void json_interval(FILE *o, const kvs_interval *iv, uint64_t seed) {
    fprintf(o, "{\"mean\":");
    kvs_cli_json_number(o, iv->n ? iv->mean : NAN);
    fprintf(o, ",\"lo\":");
    kvs_cli_json_number(o, iv->n ? iv->lo : NAN);
    fprintf(o, ",\"hi\":");
    kvs_cli_json_number(o, iv->n ? iv->hi : NAN);
    fprintf(o, ",\"n\":%zu,\"seed\":\"%016" PRIx64 "\"}", iv->n, seed);
}

static void json_diff(FILE *o, const kvs_compare_across *ac, const kvs_compare_diff *d) {
    fprintf(o, "{\"a\":");
    kvs_cli_json_string(o, kvs_compare_across_group_at(ac, d->a)->label);
    fprintf(o, ",\"b\":");
    kvs_cli_json_string(o, kvs_compare_across_group_at(ac, d->b)->label);
    fprintf(o, ",\"diff\":");
    json_interval(o, &d->d, d->seed);
    fprintf(o, ",\"resolved\":%d}", d->resolved);
}

static void print_across_json(FILE *o, const kvs_compare *cmp, const kvs_compare_across *ac,
                              const kvs_compare_column *cols, int n_cols, int pairs, kvs_status *st) {
    kvs_compare_match mode = kvs_compare_match_of(cmp);
    fprintf(o, "{\"view\":\"across_traces\",\"match\":\"%s\",\"x\":\"%s\",\"at\":", kvs_compare_match_name(mode),
            kvs_compare_x_name(cmp));
    kvs_cli_json_number(o, kvs_compare_at(cmp));
    fprintf(o, ",\"max_ratio\":");
    kvs_cli_json_number(o, kvs_compare_max_ratio(cmp));
    fprintf(o, ",\"level\":0.95,\"reps\":%d,\"metrics\":[", KVS_BOOTSTRAP_REPS);
    for (int c = 0; c < n_cols; c++) fprintf(o, "%s\"%s\"", c ? "," : "", cols[c].name);
    fprintf(o, "],\"sets\":[");
    static const char *const reasons[] = {"out_of_range", "gap", "no_x", "not_run"};
    for (size_t k = 0; k < kvs_compare_across_n_sets(ac); k++) {
        const kvs_compare_set *set = kvs_compare_across_set_at(ac, k);
        fprintf(o, "%s\n{\"model\":", k ? "," : "");
        kvs_cli_json_string(o, set->model);
        fprintf(o, ",\"measure\":");
        kvs_cli_json_string(o, set->measure);
        fprintf(o, ",\"traces\":[");
        for (size_t t = 0; t < set->n_traces; t++) {
            fprintf(o, "%s{\"id\":", t ? "," : "");
            kvs_cli_json_string(o, set->trace_id[t]);
            fprintf(o, ",\"label\":");
            kvs_cli_json_string(o, set->trace_label[t]);
            fputc('}', o);
        }
        fprintf(o, "],\"best\":");
        if (set->best != SIZE_MAX) kvs_cli_json_string(o, kvs_compare_across_group_at(ac, set->best)->label);
        else fputs("null", o);
        fprintf(o, ",\"groups\":[");
        for (size_t gi = set->first; gi < set->first + set->n; gi++) {
            const kvs_compare_group *g = kvs_compare_across_group_at(ac, gi);
            char flags[KVS_COMPARE_FLAGS_CAP];
            kvs_compare_group_flags(g, flags);
            fprintf(o, "%s\n{\"policy\":", gi > set->first ? "," : "");
            kvs_cli_json_string(o, g->rep->rep->policy);
            fprintf(o, ",\"params\":");
            kvs_cli_json_string(o, g->rep->rep->params);
            fprintf(o, ",\"codec\":");
            kvs_cli_json_string(o, g->rep->rep->codec);
            fprintf(o, ",\"page\":%" PRId64, g->rep->rep->page);
            json_page_score(o, g->rep->rep->page_score);
            fprintf(o, ",\"label\":");
            kvs_cli_json_string(o, g->label);
            fprintf(o, ",\"flags\":\"%s\",\"is_oracle\":%s,\"prompt_only\":%s,\"degenerate\":%s,\"kv_bytes\":", flags,
                    g->is_oracle ? "true" : "false", g->prompt_only ? "true" : "false",
                    g->degenerate ? "true" : "false");
            if (g->rep->kv_bytes >= 0) fprintf(o, "%d,\"aux_bytes\":%d", g->rep->kv_bytes, g->rep->aux_bytes);
            else fputs("null,\"aux_bytes\":null", o);
            fprintf(o, ",\"n\":%zu,\"excluded\":{", g->n_used);
            for (int r = 0; r < 4; r++) {
                fprintf(o, "%s\"%s\":[", r ? "," : "", reasons[r]);
                int first = 1;
                for (size_t t = 0; t < set->n_traces; t++) {
                    const kvs_compare_series *s = g->by_trace[t];
                    int hit = r == 3 ? !s
                                     : s && s->status == (r == 0   ? KVS_COMPARE_OUT_OF_RANGE
                                                          : r == 1 ? KVS_COMPARE_GAP
                                                                   : KVS_COMPARE_NO_X);
                    if (!hit) continue;
                    if (!first) fputc(',', o);
                    first = 0;
                    kvs_cli_json_string(o, set->trace_label[t]);
                }
                fputc(']', o);
            }
            fprintf(o, "},\"values\":{");
            for (int c = 0; c < n_cols; c++) {
                fprintf(o, "%s\"%s\":", c ? "," : "", cols[c].name);
                json_interval(o, &g->col[c], g->seed[c]);
            }
            fprintf(o, "},\"vs_best\":");
            if (set->best != SIZE_MAX && set->best != gi) {
                kvs_compare_diff d;
                if ((*st = kvs_compare_across_diff(ac, gi, set->best, 0, &d)) != KVS_OK) return;
                json_diff(o, ac, &d);
            } else fputs("null", o);
            fputc('}', o);
        }
        fputc(']', o);
        if (pairs) {
            fprintf(o, ",\"pairs\":[");
            int first = 1;
            for (size_t ga = set->first; ga < set->first + set->n; ga++)
                for (size_t gb = ga + 1; gb < set->first + set->n; gb++) {
                    kvs_compare_diff d;
                    if ((*st = kvs_compare_across_diff(ac, ga, gb, 0, &d)) != KVS_OK) return;
                    if (!first) fputc(',', o);
                    first = 0;
                    json_diff(o, ac, &d);
                }
            fputc(']', o);
        }
        fputc('}', o);
    }
    fprintf(o, "\n]}\n");
}

/* kvs_cli_single_value for compare's single-valued options. */
static int single(int argc, char **argv, int *i, int *missing, const char *opt, const char **slot) {
    return kvs_cli_single_value("compare", opt, argc, argv, i, missing, slot);
}

int kvs_cmd_compare(int argc, char **argv) {
    const char *path = NULL, *match_s = NULL, *at_s = NULL, *xstat_s = NULL, *ratio_s = NULL;
    kvs_compare_column cols[MAX_COLUMNS];
    int n_cols = 0, csv = 0, json = 0, per_trace = 0, across = 0, pairs = 0;
    kvs_results_filter f = {0};
    for (int i = 1; i < argc; i++) {
        const char *v;
        int missing = 0, fr, r;
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        } else if ((fr = kvs_cli_filter_option("compare", argc, argv, &i, COMPARE_FILTERS, &f)) != 0) {
            if (fr < 0) return KVS_EXIT_USAGE;
        } else if ((r = single(argc, argv, &i, &missing, "--match", &match_s)) ||
                   (!missing && (r = single(argc, argv, &i, &missing, "--at", &at_s))) ||
                   (!missing && (r = single(argc, argv, &i, &missing, "--x-stat", &xstat_s))) ||
                   (!missing && (r = single(argc, argv, &i, &missing, "--max-ratio", &ratio_s)))) {
            if (r < 0) return KVS_EXIT_USAGE;
        } else if (!missing && (v = kvs_cli_opt_value("--metric", argc, argv, &i, &missing))) {
            int rc = parse_metrics(v, cols, &n_cols);
            if (rc) return rc;
        } else if (missing) return kvs_cli_usage_error("compare", "option %s needs a value", argv[i]);
        else if (!strcmp(argv[i], "--csv")) {
            if (kvs_cli_once("compare", "--csv", &csv)) return KVS_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--json")) {
            if (kvs_cli_once("compare", "--json", &json)) return KVS_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--per-trace")) {
            if (kvs_cli_once("compare", "--per-trace", &per_trace)) return KVS_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--across-traces")) {
            if (kvs_cli_once("compare", "--across-traces", &across)) return KVS_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--pairs")) {
            if (kvs_cli_once("compare", "--pairs", &pairs)) return KVS_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--budget") || !strncmp(argv[i], "--budget=", 9) || !strcmp(argv[i], "--run") ||
                 !strncmp(argv[i], "--run=", 6))
            return kvs_cli_usage_error("compare", "%s does not apply: compare interpolates between the runs of "
                                                  "each series (use kvsim runs to list single runs)",
                                       argv[i]);
        else if (argv[i][0] == '-' && argv[i][1]) return kvs_cli_usage_error("compare", "unknown option '%s'", argv[i]);
        else if (!path) path = argv[i];
        else return kvs_cli_usage_error("compare", "unexpected argument '%s'", argv[i]);
    }
    if (!path) return kvs_cli_usage_error("compare", "missing the results database DB");
    if (!match_s) return kvs_cli_usage_error("compare", "missing --match mem|traffic|tokens");
    kvs_compare_opts o = {.x_stat = KVS_STAT_MEAN};
    if (kvs_compare_match_parse(match_s, &o.match) != KVS_OK)
        return kvs_cli_usage_error("compare", "--match: '%s' is not mem, traffic or tokens", match_s);
    if (!at_s) return kvs_cli_usage_error("compare", "missing --at X (e.g. --at 12K, --at 3.5MiB, --at 64)");
    if (kvs_cli_parse_size("--at", at_s, &o.at) != KVS_OK) return kvs_cli_fail("compare", KVS_ERR_INVALID_ARG);
    if (xstat_s) {
        if (!strcmp(xstat_s, "max")) o.x_stat = KVS_STAT_MAX;
        else if (strcmp(xstat_s, "mean"))
            return kvs_cli_usage_error("compare", "--x-stat: '%s' is not mean or max", xstat_s);
        if (o.match == KVS_COMPARE_TOKENS)
            return kvs_cli_usage_error("compare",
                                       "--x-stat applies to --match mem and traffic (a budget is one number)");
    }
    if (ratio_s) {
        if (!strcmp(ratio_s, "inf")) o.max_ratio = INFINITY;
        else if (kvs_cli_parse_double("--max-ratio", ratio_s, 1, 1e300, &o.max_ratio) != KVS_OK)
            return kvs_cli_fail("compare", KVS_ERR_INVALID_ARG);
    }
    if (csv && json) return kvs_cli_usage_error("compare", "--csv and --json exclude each other");
    if (per_trace && across) return kvs_cli_usage_error("compare", "--per-trace and --across-traces exclude each other");
    if (per_trace && pairs)
        return kvs_cli_usage_error("compare", "--pairs compares configurations across traces: not with --per-trace");
    if (n_cols == 0) {
        int rc = parse_metrics(default_metrics, cols, &n_cols);
        if (rc) return rc;
    }

    kvs_results_db *db = NULL;
    kvs_results_run_row *rows = NULL;
    int64_t n_rows = 0;
    kvs_compare *cmp = NULL;
    kvs_compare_across *ac = NULL;
    kvs_status st = kvs_results_open_readonly(path, &db);
    if (st != KVS_OK) return kvs_cli_fail("compare", st);
    KVS_TRY(st = kvs_results_query_runs(db, &f, &rows, &n_rows));
    if (n_rows == 0) {
        st = kvs_fail(KVS_ERR_DB, "%s: no complete runs%s%s%s in the database: nothing to compare", path,
                      f.policy ? " of policy '" : "", f.policy ? f.policy : "", f.policy ? "'" : "");
        goto cleanup;
    }
    KVS_TRY(st = kvs_compare_create_opts(rows, n_rows, &o, cols, n_cols, &cmp));
    KVS_TRY(st = kvs_compare_across_create(cmp, &ac));
    /* Across traces when asked, or by default as soon as a model has several traces (one per prompt): one trace
     * is one sample, and the answer a reader needs is over them. */
    if (across || pairs || (!per_trace && kvs_compare_across_max_traces(ac) >= 2)) {
        if (csv) print_across_csv(stdout, cmp, ac, cols, n_cols, pairs, &st);
        else if (json) print_across_json(stdout, cmp, ac, cols, n_cols, pairs, &st);
        else print_across_table(stdout, cmp, ac, cols, n_cols, pairs, &st);
    } else if (csv) print_csv(stdout, cmp, cols, n_cols);
    else if (json) print_json(stdout, cmp, cols, n_cols);
    else {
        print_table(stdout, cmp, cols, n_cols);
        if (!per_trace)
            printf("one trace per model and measure: no interval (several traces of a model, one per prompt, give "
                   "each policy's mean over them with its interval: examples/capture_prompts.sh)\n");
    }
cleanup:
    kvs_compare_across_free(ac);
    kvs_compare_free(cmp);
    kvs_results_run_rows_free(rows, n_rows);
    kvs_results_close(db);
    if (st != KVS_OK) return kvs_cli_fail("compare", st);
    return kvs_cli_finish_stdout("compare");
}
