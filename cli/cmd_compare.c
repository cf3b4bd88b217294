/* cmd_compare.c — `kvsim compare DB --match mem|traffic|tokens --at X [--x-stat mean|max] [--max-ratio R]
 * [--metric M ...] [--csv|--json] [filters]`: compares policies at an equal cost X, the budget-matching modes of
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
 * into series (policy, params, trace by content hash, measure, kv_bytes, aux_bytes); runs of one series at the same
 * x are averaged; at X a point at exactly X is used as is, two adjacent points at most --max-ratio apart that
 * bracket X are interpolated linearly in log(x), two farther apart are a "gap" (no value; both named), and a series
 * whose points do not reach X on both sides is "out of range [xmin, xmax]": never extrapolated. A value not
 * recorded in either bracketing run is not available ("-", empty, null). Flags as `kvsim runs` shows them (O P N).
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
            "                        [--metric M ...] [--csv | --json]\n"
            "                        [--policy NAME] [--trace PATH] [--model NAME] [--measure M]\n"
            "Compares the policies of the results database DB at an equal cost X (POLICY_SPEC.md 1.5,\n"
            "budget-matching modes). A series is the complete runs of one (policy, params, trace, measure,\n"
            "kv_bytes, aux_bytes): a trace is its content hash, so one file through two paths is one trace, two\n"
            "files with one name two (labelled <model>@<8 hex>); runs with other --kv-bytes/--aux-bytes are\n"
            "other series (labelled [kv_bytes=K,aux_bytes=A] when that is all that differs). Each run's x is\n"
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
            "  --csv         one row per series: policy,params,flags,is_oracle,prompt_only,degenerate,kv_bytes,\n"
            "                aux_bytes,trace,trace_label,trace_sha256,model,measure,match,x,at,status,run_lo,\n"
            "                run_hi,budget_lo,budget_hi,x_lo,x_hi,x_min,x_max, then the metrics (status:\n"
            "                interpolated, exact, gap, out_of_range, no_x = the runs have no recorded x)\n"
            "  --json        one object with the match, x, X, the ratio and one entry per series\n",
            KVS_COMPARE_MAX_RATIO, default_metrics);
    kvs_cli_filter_usage(f, COMPARE_FILTERS);
}

/* Appends the comma-separated metric columns of `list` to cols; returns 0, or the usage exit code. */
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
        fprintf(o, "  %-*s  %s", fw, from[i], s->rep->params[0] ? s->rep->params : "-");
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
    fputs("policy,params,flags,is_oracle,prompt_only,degenerate,kv_bytes,aux_bytes,trace,trace_label,trace_sha256,"
          "model,measure,match,x,at,status,run_lo,run_hi,budget_lo,budget_hi,x_lo,x_hi,x_min,x_max",
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
        fprintf(o, ",%s,%d,%d,%d,", flags, s->is_oracle, s->prompt_only, s->degenerate);
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

/* kvs_cli_single_value for compare's single-valued options. */
static int single(int argc, char **argv, int *i, int *missing, const char *opt, const char **slot) {
    return kvs_cli_single_value("compare", opt, argc, argv, i, missing, slot);
}

int kvs_cmd_compare(int argc, char **argv) {
    const char *path = NULL, *match_s = NULL, *at_s = NULL, *xstat_s = NULL, *ratio_s = NULL;
    kvs_compare_column cols[MAX_COLUMNS];
    int n_cols = 0, csv = 0, json = 0;
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
    if (n_cols == 0) {
        int rc = parse_metrics(default_metrics, cols, &n_cols);
        if (rc) return rc;
    }

    kvs_results_db *db = NULL;
    kvs_results_run_row *rows = NULL;
    int64_t n_rows = 0;
    kvs_compare *cmp = NULL;
    kvs_status st = kvs_results_open_readonly(path, &db);
    if (st != KVS_OK) return kvs_cli_fail("compare", st);
    KVS_TRY(st = kvs_results_query_runs(db, &f, &rows, &n_rows));
    if (n_rows == 0) {
        st = kvs_fail(KVS_ERR_DB, "%s: no complete runs%s%s%s in the database: nothing to compare", path,
                      f.policy ? " of policy '" : "", f.policy ? f.policy : "", f.policy ? "'" : "");
        goto cleanup;
    }
    KVS_TRY(st = kvs_compare_create_opts(rows, n_rows, &o, cols, n_cols, &cmp));
    if (csv) print_csv(stdout, cmp, cols, n_cols);
    else if (json) print_json(stdout, cmp, cols, n_cols);
    else print_table(stdout, cmp, cols, n_cols);
cleanup:
    kvs_compare_free(cmp);
    kvs_results_run_rows_free(rows, n_rows);
    kvs_results_close(db);
    if (st != KVS_OK) return kvs_cli_fail("compare", st);
    return kvs_cli_finish_stdout("compare");
}
