/* cmd_runs.c — `kvsim runs DB [--csv] [--all] [--policy NAME] [--run ID]`: lists the runs of a results
 * database (schema in sim/SCHEMA.md) as a readable table, or as CSV with one row per (run, layer).
 *
 * CSV follows RFC 4180 quoting: a field containing a comma, a double quote, CR or LF is enclosed in
 * double quotes with inner quotes doubled (params such as "window=64,sinks=4" are quoted); records end
 * in LF; NULL is an empty field; reals print in the shortest form that reads back to the same double.
 * Exit codes per cli.h: 0 listed, 1 database failure or unknown --run id, 2 bad usage.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../plots/plot.h"
#include "cli.h"

/* The CSV's leading columns are a fixed interface (scripts rely on them); more may only be appended. */
static const char csv_header[] =
    "policy,params,budget_tokens,layer,out_err_mean,out_err_p95,out_err_max,attn_recall_mean,topk_overlap_mean,"
    "storage_bytes_max,traffic_bytes_per_step_mean,"
    "run_id,trace,model,is_oracle,status,measure,budget_fraction,out_err_p50,out_err_min,attn_recall_min,"
    "topk_overlap_min,n_samples,storage_bytes_mean,traffic_bytes_per_step_max,transfer_bytes_per_step_mean,"
    "compression_ratio_mean,wall_seconds,kvsim_version,created_at,error";

static const char csv_sql[] =
    "SELECT r.policy, r.params, r.budget_tokens, l.layer, l.out_err_mean, l.out_err_p95, l.out_err_max, "
    "       l.attn_recall_mean, l.topk_overlap_mean, l.storage_bytes_max, l.traffic_bytes_mean, "
    "       r.id, t.path, t.model, r.is_oracle, r.status, r.measure, r.budget_fraction, l.out_err_p50, "
    "       l.out_err_min, l.attn_recall_min, l.topk_overlap_min, l.out_err_n, l.storage_bytes_mean, "
    "       l.traffic_bytes_max, l.transfer_bytes_mean, l.compression_ratio_mean, r.wall_seconds, "
    "       r.kvsim_version, r.created_at, r.error "
    "FROM runs r JOIN traces t ON t.id = r.trace_id LEFT JOIN run_layers l ON l.run_id = r.id "
    "WHERE (?1 OR r.status = 'complete') AND (?2 IS NULL OR r.policy = ?2) AND (?3 < 0 OR r.id = ?3) "
    "ORDER BY r.id, l.layer";

static const char table_sql[] =
    "SELECT r.id, r.policy, r.budget_tokens, r.is_oracle, r.status, s.out_err_mean, s.out_err_p95, s.out_err_max, "
    "       s.attn_recall_mean, s.topk_overlap_mean, s.storage_bytes_max, s.traffic_bytes_mean, r.wall_seconds, "
    "       r.params, r.error "
    "FROM runs r LEFT JOIN run_summary s ON s.run_id = r.id "
    "WHERE (?1 OR r.status = 'complete') AND (?2 IS NULL OR r.policy = ?2) AND (?3 < 0 OR r.id = ?3) "
    "ORDER BY r.id";

static const char layers_sql[] =
    "SELECT layer, out_err_mean, out_err_p95, out_err_max, attn_recall_mean, topk_overlap_mean, storage_bytes_max, "
    "       traffic_bytes_mean, out_err_n FROM run_layers WHERE run_id = ?1 ORDER BY layer";

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim runs DB [--csv] [--all] [--policy NAME] [--run ID]\n"
            "Lists the runs of the results database DB (complete runs only unless --all).\n"
            "  --csv         one row per (run, layer), leading columns:\n"
            "                policy,params,budget_tokens,layer,out_err_mean,out_err_p95,out_err_max,\n"
            "                attn_recall_mean,topk_overlap_mean,storage_bytes_max,traffic_bytes_per_step_mean\n"
            "                then run_id,trace,model,is_oracle,status,... (RFC 4180 quoting)\n"
            "  --all         include failed runs (their error in the last column)\n"
            "  --policy NAME only runs of this policy\n"
            "  --run ID      only this run (the table then also lists its layers)\n");
}

/* Shortest "%.*g" that reads back to exactly v. */
static void fmt_real(char *buf, size_t cap, double v) {
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

static void csv_field(FILE *f, sqlite3_stmt *st, int i) {
    char buf[64];
    switch (sqlite3_column_type(st, i)) {
    case SQLITE_NULL: return;
    case SQLITE_INTEGER: fprintf(f, "%" PRId64, (int64_t)sqlite3_column_int64(st, i)); return;
    case SQLITE_FLOAT:
        fmt_real(buf, sizeof buf, sqlite3_column_double(st, i));
        fputs(buf, f);
        return;
    default: break;
    }
    const char *s = (const char *)sqlite3_column_text(st, i);
    if (!s) return;
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

/* Table cell: 'g' = 4 significant digits, 'f' = 4 decimals, '0' = integer-rounded, '2' = 2 decimals;
 * "-" for NULL. */
static const char *cell(sqlite3_stmt *st, int i, char mode, char *buf, size_t cap) {
    if (sqlite3_column_type(st, i) == SQLITE_NULL) return "-";
    double v = sqlite3_column_double(st, i);
    if (mode == 'g') snprintf(buf, cap, "%.4g", v);
    else if (mode == 'f') snprintf(buf, cap, "%.4f", v);
    else if (mode == '2') snprintf(buf, cap, "%.2f", v);
    else snprintf(buf, cap, "%.0f", v);
    return buf;
}

static void bind_filters(sqlite3_stmt *st, int all, const char *policy, long run) {
    sqlite3_bind_int(st, 1, all);
    if (policy) sqlite3_bind_text(st, 2, policy, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, run);
}

static kvs_status print_layers(sqlite3 *db, const char *path, long run) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, layers_sql, -1, &st, NULL) != SQLITE_OK)
        return kvs_fail(KVS_ERR_DB, "%s: cannot query run_layers: %s", path, sqlite3_errmsg(db));
    sqlite3_bind_int64(st, 1, run);
    printf("\nrun %ld per layer:\n%5s %10s %10s %10s %8s %8s %12s %12s %9s\n", run, "layer", "err_mean", "err_p95",
           "err_max", "recall", "topk", "storage_max", "traffic_mean", "samples");
    int rc;
    char b[8][32];
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        printf("%5d %10s %10s %10s %8s %8s %12s %12s %9" PRId64 "\n", sqlite3_column_int(st, 0),
               cell(st, 1, 'g', b[0], 32), cell(st, 2, 'g', b[1], 32), cell(st, 3, 'g', b[2], 32),
               cell(st, 4, 'f', b[3], 32), cell(st, 5, 'f', b[4], 32), cell(st, 6, '0', b[5], 32),
               cell(st, 7, '0', b[6], 32), (int64_t)sqlite3_column_int64(st, 8));
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return kvs_fail(KVS_ERR_DB, "%s: cannot query run_layers: %s", path, sqlite3_errmsg(db));
    return KVS_OK;
}

int kvs_cmd_runs(int argc, char **argv) {
    const char *path = NULL, *policy = NULL;
    int csv = 0, all = 0;
    long run = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (kvs_cli_is_help(a)) {
            usage(stdout);
            return KVS_EXIT_OK;
        } else if (!strcmp(a, "--csv")) csv = 1;
        else if (!strcmp(a, "--all")) all = 1;
        else if (!strcmp(a, "--policy") || !strncmp(a, "--policy=", 9)) {
            if (a[8] == '=') policy = a + 9;
            else if (i + 1 < argc) policy = argv[++i];
            else return kvs_cli_usage_error("runs", "option --policy needs a value");
        } else if (!strcmp(a, "--run") || !strncmp(a, "--run=", 6)) {
            const char *v = a[5] == '=' ? a + 6 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) return kvs_cli_usage_error("runs", "option --run needs a value");
            kvs_status s = kvs_cli_parse_long("--run", v, 1, INT64_MAX, &run);
            if (s != KVS_OK) return kvs_cli_fail("runs", s);
        } else if (a[0] == '-' && a[1]) return kvs_cli_usage_error("runs", "unknown option '%s'", a);
        else if (!path) path = a;
        else return kvs_cli_usage_error("runs", "unexpected argument '%s'", a);
    }
    if (!path) return kvs_cli_usage_error("runs", "missing the results database DB");

    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    kvs_status s = kvs_plot_db_open(path, &db);
    if (s != KVS_OK) return kvs_cli_fail("runs", s);
    int n_rows = 0, rc;
    if (sqlite3_prepare_v2(db, csv ? csv_sql : table_sql, -1, &st, NULL) != SQLITE_OK) {
        s = kvs_fail(KVS_ERR_DB, "%s: cannot query runs: %s", path, sqlite3_errmsg(db));
        goto cleanup;
    }
    bind_filters(st, all, policy, run);
    if (csv) {
        printf("%s\n", csv_header);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            for (int c = 0, nc = sqlite3_column_count(st); c < nc; c++) {
                if (c) putchar(',');
                csv_field(stdout, st, c);
            }
            putchar('\n');
            n_rows++;
        }
    } else {
        printf("%6s %-14s %8s %-6s %-8s %10s %10s %10s %8s %8s %12s %12s %8s  %s\n", "run", "policy", "budget",
               "oracle", "status", "err_mean", "err_p95", "err_max", "recall", "topk", "storage_max", "traffic_mean",
               "wall_s", "params");
        char b[9][32];
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            const char *err = (const char *)sqlite3_column_text(st, 14);
            printf("%6" PRId64 " %-14s %8" PRId64 " %-6s %-8s %10s %10s %10s %8s %8s %12s %12s %8s  %s%s%s\n",
                   (int64_t)sqlite3_column_int64(st, 0), (const char *)sqlite3_column_text(st, 1),
                   (int64_t)sqlite3_column_int64(st, 2), sqlite3_column_int(st, 3) ? "yes" : "no",
                   (const char *)sqlite3_column_text(st, 4), cell(st, 5, 'g', b[0], 32),
                   cell(st, 6, 'g', b[1], 32), cell(st, 7, 'g', b[2], 32), cell(st, 8, 'f', b[3], 32),
                   cell(st, 9, 'f', b[4], 32), cell(st, 10, '0', b[5], 32), cell(st, 11, '0', b[6], 32),
                   cell(st, 12, '2', b[7], 32), (const char *)sqlite3_column_text(st, 13), err ? "  error: " : "",
                   err ? err : "");
            n_rows++;
        }
    }
    if (rc != SQLITE_DONE) {
        s = kvs_fail(KVS_ERR_DB, "%s: cannot query runs: %s", path, sqlite3_errmsg(db));
        goto cleanup;
    }
    if (run > 0 && n_rows == 0) {
        s = kvs_fail(KVS_ERR_DB, "%s: no %srun with id %ld%s", path, all ? "" : "complete ", run,
                     all ? "" : " (add --all to include failed runs)");
        goto cleanup;
    }
    if (!csv) {
        printf("%d run%s%s\n", n_rows, n_rows == 1 ? "" : "s", all ? "" : " (complete only; --all adds failed runs)");
        if (run > 0) KVS_TRY(s = print_layers(db, path, run));
    }
cleanup:
    sqlite3_finalize(st);
    sqlite3_close(db);
    return s == KVS_OK ? KVS_EXIT_OK : kvs_cli_fail("runs", s);
}
