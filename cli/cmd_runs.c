/* cmd_runs.c — `kvsim runs DB [--csv|--json] [--all] [filters]`: lists the runs of a results database
 * (schema in results/SCHEMA.md, read through the read API of results/results.h) as a readable table, as CSV with one
 * row per (run, layer), or as JSON with one object per run.
 *
 * CSV follows RFC 4180 quoting: a field containing a comma, a double quote, CR or LF is enclosed in
 * double quotes with inner quotes doubled (params such as "window=64,sinks=4" are quoted); records end
 * in LF; a value not recorded is an empty field; reals print in the shortest form that reads back to the
 * same double. Its leading columns are a fixed interface (csv_legacy below); after them come the later run columns
 * (budget_scope, layout, notes, codec) and then `<metric>_<stat>` for every metric of the table (sim/metrics.h)
 * and statistic, last because that block grows with the metric table: a new run column goes before it.
 * Exit codes per cli.h: 0 listed, 1 database failure (a damaged table among those listed included: checked with
 * kvs_results_check_runs), unknown --run id or failed write, 2 bad usage.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../results/results.h"
#include "cli.h"
#include "../results/compare.h"

#define RUNS_FILTERS                                                                                                   \
    (KVS_CLI_FILTER_POLICY | KVS_CLI_FILTER_BUDGET | KVS_CLI_FILTER_TRACE | KVS_CLI_FILTER_MODEL |                    \
     KVS_CLI_FILTER_MEASURE | KVS_CLI_FILTER_RUN)

/* The CSV's leading columns are a fixed interface (scripts rely on them); more may only be appended. */
static const char csv_legacy_header[] =
    "policy,params,budget_tokens,layer,out_err_mean,out_err_p95,out_err_max,attn_recall_mean,topk_overlap_mean,"
    "storage_bytes_max,traffic_bytes_per_step_mean,"
    "run_id,trace,model,is_oracle,status,measure,budget_fraction,out_err_p50,out_err_min,attn_recall_min,"
    "topk_overlap_min,n_samples,storage_bytes_mean,traffic_bytes_per_step_max,transfer_bytes_per_step_mean,"
    "compression_ratio_mean,wall_seconds,kvsim_version,created_at,error";

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim runs DB [--csv [--summary] | --json] [--all] [--policy NAME] [--budget TOKENS] [--trace PATH]\n"
            "                     [--model NAME] [--measure M] [--run ID]\n"
            "Lists the runs of the results database DB (complete runs only unless --all). The table shows per run\n"
            "the mean and peak attended tokens, the mean and peak resident bytes per KV head (storage_bytes mean,\n"
            "max), the bytes read per step (traffic_bytes mean), the output error (mean, p95) and the attention\n"
            "recall; flags: O oracle, P prompt-only budget (generated tokens all kept), F failed, N a note about a\n"
            "degenerate configuration (kvsim replay warned about it; the note follows the params). A run with a codec\n"
            "(kvsim replay --codec) has its canonical spec in brackets after the params (JSON: \"codec\"), a paged run\n"
            "(kvsim replay --page N) \"[page N]\", \"[page N max]\" when its pages were ranked by a score rule (JSON:\n"
            "\"page\", null at token granularity, and \"page_score\": \"max\", \"sum\" or null for the count rule).\n"
            "  --csv         one row per (run, layer), leading columns:\n"
            "                policy,params,budget_tokens,layer,out_err_mean,out_err_p95,out_err_max,\n"
            "                attn_recall_mean,topk_overlap_mean,storage_bytes_max,traffic_bytes_per_step_mean\n"
            "                then run_id,trace,model,is_oracle,status,...,error (RFC 4180 quoting), then\n"
            "                budget_scope,layout,notes,codec (empty: K/V as captured),page (positions a page, 0:\n"
            "                token granularity),page_score (max or sum; empty: the count rule or no pages) and\n"
            "                <metric>_<stat> for\n"
            "                every metric and statistic\n"
            "  --summary     with --csv: one row per run instead, its run-wide aggregate (table run_summary,\n"
            "                over every layer); same columns, the layer field empty\n"
            "  --json        a JSON array, one object per run: configuration, trace, budget_scope, layout,\n"
            "                notes and every metric's n/mean/p50/p95/max/min (null = not recorded)\n"
            "  --all         include failed runs (their error in the error column)\n"
            "  --run ID      only this run (the table and --json then also list its layers)\n");
    kvs_cli_filter_usage(f, RUNS_FILTERS & ~KVS_CLI_FILTER_RUN);
}

/* ------------------------------------------------------------------------------------------------
 * CSV
 * ---------------------------------------------------------------------------------------------- */

static void csv_real(FILE *o, double v) {
    char buf[64];
    kvs_cli_fmt_real(buf, sizeof buf, v);
    fputs(buf, o);
}

/* ",<value>" of one statistic (empty when not recorded). */
static void csv_stat(FILE *o, const kvs_results_agg *a, kvs_metric m, kvs_stat_kind s) {
    fputc(',', o);
    if (a) csv_real(o, kvs_results_stat_value(&a->m[m], s));
}

static void print_csv_header(FILE *o) {
    fputs(csv_legacy_header, o);
    fputs(",budget_scope,layout,notes,codec,page,page_score", o);
    for (int m = 0; m < KVS_N_METRICS; m++)
        for (int s = 0; s < KVS_N_STATS; s++) fprintf(o, ",%s_%s", kvs_metric_table[m].name, kvs_stat_names[s]);
    fputc('\n', o);
}

/* One CSV record of run w and its layer aggregate a (NULL: a run without layer rows, e.g. a failed run). */
static void print_csv_row(FILE *o, const kvs_results_run_row *w, const kvs_results_agg *a) {
    kvs_cli_csv_field(o, w->policy);
    fputc(',', o);
    kvs_cli_csv_field(o, w->params);
    fprintf(o, ",%" PRId64 ",", w->budget_tokens);
    if (a && a->layer >= 0) fprintf(o, "%d", a->layer); /* run-wide aggregate (layer -1): empty */
    csv_stat(o, a, KVS_M_OUT_ERR, KVS_STAT_MEAN);
    csv_stat(o, a, KVS_M_OUT_ERR, KVS_STAT_P95);
    csv_stat(o, a, KVS_M_OUT_ERR, KVS_STAT_MAX);
    csv_stat(o, a, KVS_M_ATTN_RECALL, KVS_STAT_MEAN);
    csv_stat(o, a, KVS_M_TOPK_OVERLAP, KVS_STAT_MEAN);
    csv_stat(o, a, KVS_M_STORAGE, KVS_STAT_MAX);
    csv_stat(o, a, KVS_M_TRAFFIC, KVS_STAT_MEAN);
    fprintf(o, ",%" PRId64 ",", w->id);
    kvs_cli_csv_field(o, w->trace_path);
    fputc(',', o);
    kvs_cli_csv_field(o, w->model);
    fprintf(o, ",%d,", w->is_oracle);
    kvs_cli_csv_field(o, w->status);
    fputc(',', o);
    kvs_cli_csv_field(o, w->measure);
    fputc(',', o);
    if (w->budget_fraction >= 0) csv_real(o, w->budget_fraction);
    csv_stat(o, a, KVS_M_OUT_ERR, KVS_STAT_P50);
    csv_stat(o, a, KVS_M_OUT_ERR, KVS_STAT_MIN);
    csv_stat(o, a, KVS_M_ATTN_RECALL, KVS_STAT_MIN);
    csv_stat(o, a, KVS_M_TOPK_OVERLAP, KVS_STAT_MIN);
    csv_stat(o, a, KVS_M_OUT_ERR, KVS_STAT_N);
    csv_stat(o, a, KVS_M_STORAGE, KVS_STAT_MEAN);
    csv_stat(o, a, KVS_M_TRAFFIC, KVS_STAT_MAX);
    csv_stat(o, a, KVS_M_TRANSFER, KVS_STAT_MEAN);
    csv_stat(o, a, KVS_M_COMPRESSION, KVS_STAT_MEAN);
    fputc(',', o);
    csv_real(o, w->wall_seconds);
    fputc(',', o);
    kvs_cli_csv_field(o, w->kvsim_version);
    fputc(',', o);
    kvs_cli_csv_field(o, w->created_at);
    fputc(',', o);
    kvs_cli_csv_field(o, w->error);
    fputc(',', o);
    kvs_cli_csv_field(o, w->budget_scope);
    fputc(',', o);
    kvs_cli_csv_field(o, w->layout);
    fputc(',', o);
    kvs_cli_csv_field(o, w->notes);
    fputc(',', o);
    kvs_cli_csv_field(o, w->codec); /* empty: K/V as captured */
    fprintf(o, ",%" PRId64 ",%s", w->page, w->page_score); /* 0: token granularity; "": the count rule */
    for (int m = 0; m < KVS_N_METRICS; m++)
        for (int s = 0; s < KVS_N_STATS; s++) csv_stat(o, a, (kvs_metric)m, (kvs_stat_kind)s);
    fputc('\n', o);
}

/* ------------------------------------------------------------------------------------------------
 * JSON
 * ---------------------------------------------------------------------------------------------- */

static void json_metrics(FILE *o, const kvs_results_agg *a) {
    fputc('{', o);
    for (int m = 0; m < KVS_N_METRICS; m++) {
        fprintf(o, "%s\"%s\":{", m ? "," : "", kvs_metric_table[m].name);
        for (int s = 0; s < KVS_N_STATS; s++) {
            fprintf(o, "%s\"%s\":", s ? "," : "", kvs_stat_names[s]);
            kvs_cli_json_number(o, kvs_results_stat_value(&a->m[m], (kvs_stat_kind)s));
        }
        fputc('}', o);
    }
    fputc('}', o);
}

static void json_key_string(FILE *o, const char *key, const char *v) {
    fprintf(o, ",\"%s\":", key);
    kvs_cli_json_string(o, v);
}

static void print_json_run(FILE *o, const kvs_results_run_row *w, int with_layers) {
    fprintf(o, "{\"id\":%" PRId64, w->id);
    json_key_string(o, "policy", w->policy);
    json_key_string(o, "params", w->params);
    fprintf(o, ",\"budget_tokens\":%" PRId64 ",\"budget_fraction\":", w->budget_tokens);
    kvs_cli_json_number(o, w->budget_fraction >= 0 ? w->budget_fraction : NAN);
    fprintf(o, ",\"is_oracle\":%s", w->is_oracle ? "true" : "false");
    json_key_string(o, "measure", w->measure);
    json_key_string(o, "budget_scope", w->budget_scope);
    json_key_string(o, "layout", w->layout);
    json_key_string(o, "notes", w->notes);
    json_key_string(o, "status", w->status);
    json_key_string(o, "error", w->error);
    fprintf(o, ",\"trace\":{\"id\":%" PRId64, w->trace_id);
    json_key_string(o, "path", w->trace_path);
    json_key_string(o, "sha256", w->trace_sha256);
    char tl[160];
    kvs_results_trace_label(w, tl, sizeof tl);
    json_key_string(o, "label", tl);
    json_key_string(o, "model", w->model);
    json_key_string(o, "dtype", w->dtype);
    fprintf(o,
            ",\"n_positions\":%" PRId64 ",\"prompt_len\":%" PRId64 ",\"n_turns\":%" PRId64
            ",\"n_layers\":%d,\"n_heads\":%d,\"n_kv_heads\":%d,\"head_dim\":%d}",
            w->n_positions, w->prompt_len, w->n_turns, w->n_layers, w->n_heads, w->n_kv_heads, w->head_dim);
    fprintf(o, ",\"wall_seconds\":");
    kvs_cli_json_number(o, w->wall_seconds);
    json_key_string(o, "kvsim_version", w->kvsim_version);
    json_key_string(o, "created_at", w->created_at);
    json_key_string(o, "options", w->options);
    json_key_string(o, "codec", w->codec);
    if (w->page > 0) fprintf(o, ",\"page\":%lld", (long long)w->page);
    else fputs(",\"page\":null", o);
    if (w->page_score[0]) fprintf(o, ",\"page_score\":\"%s\"", w->page_score);
    else fputs(",\"page_score\":null", o);
    fprintf(o, ",\"metrics\":");
    if (w->has_agg) json_metrics(o, &w->agg);
    else fputs("null", o);
    if (with_layers) {
        fprintf(o, ",\"layers\":[");
        for (int32_t l = 0; l < w->n_layer_aggs; l++) {
            fprintf(o, "%s{\"layer\":%d,\"metrics\":", l ? "," : "", w->layer_aggs[l].layer);
            json_metrics(o, &w->layer_aggs[l]);
            fputc('}', o);
        }
        fputc(']', o);
    }
    fputc('}', o);
}

/* ------------------------------------------------------------------------------------------------
 * Table
 * ---------------------------------------------------------------------------------------------- */

/* A statistic for a table cell: 'g' 4 significant digits, 'f' 4 decimals, '1' 1 decimal, '0' integer,
 * 'b' bytes with a binary prefix; "-" when not recorded. */
static const char *cell(const kvs_results_agg *a, kvs_metric m, kvs_stat_kind s, char mode, char *buf, size_t cap) {
    double v = a ? kvs_results_stat_value(&a->m[m], s) : NAN;
    if (isnan(v)) return "-";
    if (mode == 'b') kvs_cli_fmt_bytes(buf, cap, v);
    else if (mode == 'g') snprintf(buf, cap, "%.4g", v);
    else if (mode == 'f') snprintf(buf, cap, "%.4f", v);
    else if (mode == '1') snprintf(buf, cap, "%.1f", v);
    else snprintf(buf, cap, "%.0f", v);
    return buf;
}


void kvs_cli_print_runs_table(FILE *o, const kvs_results_run_row *rows, int64_t n, int count_line, int all) {
    fprintf(o, "%5s %-12s %7s %-7s %8s %7s %9s %9s %10s %9s %9s %7s %-5s %-20s %s\n", "run", "policy", "budget",
            "measure", "att_mean", "att_max", "res_mean", "res_max", "traffic/st", "err_mean", "err_p95", "recall",
            "flags", "trace", "params");
    int any_o = 0, any_p = 0, any_f = 0, any_n = 0;
    for (int64_t i = 0; i < n; i++) {
        const kvs_results_run_row *w = &rows[i];
        const kvs_results_agg *a = w->has_agg ? &w->agg : NULL;
        char b[10][48], flags[KVS_COMPARE_FLAGS_CAP], tl[160], pl[512];
        kvs_compare_run_flags(w, flags); /* the one derivation of compare and report */
        any_o |= strchr(flags, 'O') != NULL;
        any_p |= strchr(flags, 'P') != NULL;
        any_f |= strchr(flags, 'F') != NULL;
        any_n |= strchr(flags, 'N') != NULL;
        if (!flags[0]) snprintf(flags, sizeof flags, "-");
        kvs_results_trace_label(w, tl, sizeof tl); /* <model>@<8 hex of the content hash>, else the file name */
        kvs_results_run_params_label(w, pl, sizeof pl); /* "params [codec]": the codec as every run label names it */
        fprintf(o, "%5" PRId64 " %-12s %7" PRId64 " %-7s %8s %7s %9s %9s %10s %9s %9s %7s %-5s %-20s %s", w->id,
                w->policy, w->budget_tokens, w->measure, cell(a, KVS_M_ATTENDED, KVS_STAT_MEAN, '1', b[0], 48),
                cell(a, KVS_M_ATTENDED, KVS_STAT_MAX, '0', b[1], 48), cell(a, KVS_M_STORAGE, KVS_STAT_MEAN, 'b', b[2], 48),
                cell(a, KVS_M_STORAGE, KVS_STAT_MAX, 'b', b[3], 48), cell(a, KVS_M_TRAFFIC, KVS_STAT_MEAN, 'b', b[4], 48),
                cell(a, KVS_M_OUT_ERR, KVS_STAT_MEAN, 'g', b[5], 48), cell(a, KVS_M_OUT_ERR, KVS_STAT_P95, 'g', b[6], 48),
                cell(a, KVS_M_ATTN_RECALL, KVS_STAT_MEAN, 'f', b[7], 48), flags, tl,
                pl);
        if (w->notes) fprintf(o, "  note: %s", w->notes);
        if (w->error) fprintf(o, "  error: %s", w->error);
        fputc('\n', o);
    }
    if (count_line)
        fprintf(o, "%" PRId64 " run%s%s\n", n, n == 1 ? "" : "s", all ? "" : " (complete only; --all adds failed runs)");
    if (any_o) fprintf(o, "O  oracle: looks at full attention (a bound, not a deployable policy)\n");
    if (any_p)
        fprintf(o, "P  prompt-only budget (budget_scope = prompt): the budget bounds the prompt only; generated tokens "
                   "are all kept,\n   so attended tokens and resident bytes grow past the budget: compare such runs at "
                   "their measured memory\n   (kvsim compare --match mem), not at their nominal budget\n");
    if (any_f) fprintf(o, "F  failed run (its error after the params)\n");
    if (any_n)
        fprintf(o, "N  note: the configuration degenerates at this budget or on this trace (the note after the params; "
                   "kvsim replay warned)\n");
}

static void print_layers(FILE *o, const kvs_results_run_row *w) {
    fprintf(o, "\nrun %" PRId64 " per layer:\n%5s %10s %10s %10s %8s %8s %8s %9s %9s %10s %9s\n", w->id, "layer",
            "err_mean", "err_p95", "err_max", "recall", "topk", "att_mean", "res_mean", "res_max", "traffic/st",
            "samples");
    char b[10][48];
    for (int32_t l = 0; l < w->n_layer_aggs; l++) {
        const kvs_results_agg *a = &w->layer_aggs[l];
        fprintf(o, "%5d %10s %10s %10s %8s %8s %8s %9s %9s %10s %9" PRId64 "\n", a->layer,
                cell(a, KVS_M_OUT_ERR, KVS_STAT_MEAN, 'g', b[0], 48), cell(a, KVS_M_OUT_ERR, KVS_STAT_P95, 'g', b[1], 48),
                cell(a, KVS_M_OUT_ERR, KVS_STAT_MAX, 'g', b[2], 48), cell(a, KVS_M_ATTN_RECALL, KVS_STAT_MEAN, 'f', b[3], 48),
                cell(a, KVS_M_TOPK_OVERLAP, KVS_STAT_MEAN, 'f', b[4], 48),
                cell(a, KVS_M_ATTENDED, KVS_STAT_MEAN, '1', b[5], 48), cell(a, KVS_M_STORAGE, KVS_STAT_MEAN, 'b', b[6], 48),
                cell(a, KVS_M_STORAGE, KVS_STAT_MAX, 'b', b[7], 48), cell(a, KVS_M_TRAFFIC, KVS_STAT_MEAN, 'b', b[8], 48),
                a->out_err.n);
    }
}

int kvs_cmd_runs(int argc, char **argv) {
    const char *path = NULL;
    int csv = 0, json = 0, summary = 0, seen_csv = 0, seen_json = 0, seen_all = 0, seen_summary = 0;
    kvs_results_filter f = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int fr;
        if (kvs_cli_is_help(a)) {
            usage(stdout);
            return KVS_EXIT_OK;
        } else if ((fr = kvs_cli_filter_option("runs", argc, argv, &i, RUNS_FILTERS, &f)) != 0) {
            if (fr < 0) return KVS_EXIT_USAGE;
        } else if (!strcmp(a, "--csv")) {
            if (kvs_cli_once("runs", a, &seen_csv)) return KVS_EXIT_USAGE;
            csv = 1;
        } else if (!strcmp(a, "--json")) {
            if (kvs_cli_once("runs", a, &seen_json)) return KVS_EXIT_USAGE;
            json = 1;
        } else if (!strcmp(a, "--summary")) {
            if (kvs_cli_once("runs", a, &seen_summary)) return KVS_EXIT_USAGE;
            summary = 1;
        } else if (!strcmp(a, "--all")) {
            if (kvs_cli_once("runs", a, &seen_all)) return KVS_EXIT_USAGE;
            f.include_failed = 1;
        }
        else if (a[0] == '-' && a[1]) return kvs_cli_usage_error("runs", "unknown option '%s'", a);
        else if (!path) path = a;
        else return kvs_cli_usage_error("runs", "unexpected argument '%s'", a);
    }
    if (!path) return kvs_cli_usage_error("runs", "missing the results database DB");
    if (csv && json) return kvs_cli_usage_error("runs", "--csv and --json exclude each other");
    if (summary && !csv) return kvs_cli_usage_error("runs", "--summary goes with --csv (one row per run)");
    f.with_layers = (csv && !summary) || f.run_id > 0;

    kvs_results_db *db = NULL;
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    kvs_status s = kvs_results_open_readonly(path, &db);
    if (s != KVS_OK) return kvs_cli_fail("runs", s);
    KVS_TRY(s = kvs_results_query_runs(db, &f, &rows, &n));
    /* a damaged page in a table this listing reads (or, for the table view, in the layers it skips) must be an
     * error, as it is for plot, not a listing of whatever rows could still be read */
    KVS_TRY(s = kvs_results_check_runs(db));
    if (f.run_id > 0 && n == 0) {
        s = kvs_fail(KVS_ERR_DB, "%s: no %srun with id %" PRId64 "%s", path, f.include_failed ? "" : "complete ",
                     f.run_id, f.include_failed ? "" : " (add --all to include failed runs)");
        goto cleanup;
    }
    if (csv) {
        print_csv_header(stdout);
        for (int64_t i = 0; i < n && summary; i++) print_csv_row(stdout, &rows[i], rows[i].has_agg ? &rows[i].agg : NULL);
        for (int64_t i = 0; i < n && !summary; i++) {
            if (rows[i].n_layer_aggs == 0) print_csv_row(stdout, &rows[i], NULL);
            for (int32_t l = 0; l < rows[i].n_layer_aggs; l++) print_csv_row(stdout, &rows[i], &rows[i].layer_aggs[l]);
        }
    } else if (json) {
        fputc('[', stdout);
        for (int64_t i = 0; i < n; i++) {
            fputs(i ? ",\n" : "\n", stdout);
            print_json_run(stdout, &rows[i], f.run_id > 0);
        }
        fputs("\n]\n", stdout);
    } else {
        kvs_cli_print_runs_table(stdout, rows, n, 1, f.include_failed);
        if (f.run_id > 0) print_layers(stdout, &rows[0]);
    }
cleanup:
    kvs_results_run_rows_free(rows, n);
    kvs_results_close(db);
    if (s != KVS_OK) return kvs_cli_fail("runs", s);
    return kvs_cli_finish_stdout("runs");
}
