/* fuzz_results_db.c — libFuzzer harness of the results database readers (results/results.c and the table families
 * results/results_{drift,heads,plan,closed}.c; results/SCHEMA.md): the input is the database file, a foreign or corrupt
 * SQLite file included. One that opens read-only is read the way every reading command reads it: `kvsim runs`
 * and `plot` (every run, failed ones and per-layer rows too, each run's turns and a steps series), `compare`
 * (kvs_compare_create at equal memory, traffic and tokens), the analysis families (drift runs with their step,
 * locality and per-unit rows; heads runs and their clustering, which must pass kvs_head_clusters_check; plans
 * with their points; closed-loop runs), `plan --profile` (kvs_plan_profile_read) and `report`
 * (kvs_report_write into the scratch folder, plots drawn by a stand-in for gnuplot that writes a few bytes where
 * the script says: the harness tests the readers, not gnuplot). A report that fails must leave no folder.
 * Seeds: fuzz/corpus/results_db (databases of a real replay, drift, heads, plan, generate and sweep run).
 */
#include "fuzz.h"

#include <dirent.h>

#include "../common/head_clusters.h"
#include "../analysis/plan.h"
#include "../common/kvs.h"
#include "../plots/report.h"
#include "../results/compare.h"
#include "../results/results.h"
#include "../results/results_closed.h"
#include "../results/results_drift.h"
#include "../results/results_heads.h"
#include "../results/results_plan.h"

static char gnuplot[128];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    /* "set output '/tmp/kvsim-plot.X/plot.png'" (or with double quotes): a 4-byte image there */
    static const char script[] = "#!/bin/sh\n"
                                 "while IFS= read -r l; do case $l in \"set output \"*)\n"
                                 "  f=${l#set output }; f=${f#?}; f=${f%?}; printf '\\211PNG' >\"$f\";; esac; done\n";
    kvs_fuzz_write("gnuplot", (const uint8_t *)script, sizeof script - 1, gnuplot, sizeof gnuplot);
    if (chmod(gnuplot, 0755) != 0) abort();
    return 0;
}

static void read_compare(const kvs_results_run_row *rows, int64_t n) {
    kvs_compare_column col;
    if (kvs_compare_column_parse("out_err_p95", &col) != KVS_OK) abort();
    const kvs_compare_match modes[] = {KVS_COMPARE_MEM, KVS_COMPARE_TRAFFIC, KVS_COMPARE_TOKENS};
    for (int i = 0; i < 3; i++) {
        kvs_compare *c = NULL;
        if (kvs_compare_create(rows, n, modes[i], 64, &col, 1, &c) == KVS_OK)
            for (size_t k = 0; k < kvs_compare_n_series(c); k++) (void)kvs_compare_series_at(c, k)->status;
        kvs_compare_free(c);
    }
}

static void read_replay(kvs_results_db *db) {
    kvs_results_filter f = {.include_failed = 1, .with_layers = 1};
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    if (kvs_results_query_runs(db, &f, &rows, &n) == KVS_OK) {
        for (int64_t i = 0; i < n && i < 8; i++) {
            kvs_turn *turns = NULL;
            int64_t nt = 0;
            if (kvs_results_query_turns(db, rows[i].trace_id, &turns, &nt) == KVS_OK) free(turns);
            kvs_results_series s = {0};
            if (kvs_results_query_steps(db, rows[i].id, -1, KVS_M_OUT_ERR, &s) == KVS_OK) kvs_results_series_free(&s);
        }
        read_compare(rows, n);
        kvs_results_run_rows_free(rows, n);
    }
    kvs_clear_error();
}

static void read_drift(kvs_results_db *db) {
    kvs_results_drift_run *runs = NULL;
    int64_t n = 0;
    if (kvs_results_drift_query_runs(db, NULL, NULL, &runs, &n) != KVS_OK) return;
    for (int64_t i = 0; i < n && i < 4; i++)
        for (int u = 0; u < KVS_DRIFT_N_UNITS; u++) {
            kvs_drift_step *st = NULL;
            kvs_drift_locality *lo = NULL;
            kvs_drift_locality_unit *lu = NULL;
            int64_t m = 0;
            if (kvs_results_drift_query_steps(db, runs[i].id, (kvs_drift_unit)u, -1, 0, &st, &m) == KVS_OK) free(st);
            if (kvs_results_drift_query_locality(db, runs[i].id, (kvs_drift_unit)u, -1, 0, &lo, &m) == KVS_OK)
                free(lo);
            if (kvs_results_drift_query_locality_units(db, runs[i].id, (kvs_drift_unit)u, -1, 0, &lu, &m) == KVS_OK)
                free(lu);
        }
    kvs_results_drift_runs_free(runs, n);
    kvs_clear_error();
}

static void read_heads(kvs_results_db *db) {
    kvs_head_clusters *c = NULL;
    char sha[65];
    if (kvs_results_heads_read_clusters(db, 0, &c, sha) == KVS_OK && kvs_head_clusters_check(c) != KVS_OK) abort();
    kvs_head_clusters_free(c);
    kvs_results_heads_row *r = NULL;
    if (kvs_results_heads_read(db, 0, NULL, NULL, &r) == KVS_OK) kvs_results_heads_row_free(r);
    kvs_clear_error();
}

static void read_plans_closed(kvs_results_db *db) {
    kvs_results_plan_row *plans = NULL;
    int64_t n = 0;
    if (kvs_results_query_plans(db, &plans, &n) == KVS_OK) kvs_results_plan_rows_free(plans, n);
    kvs_results_closed_row *closed = NULL;
    if (kvs_results_closed_query(db, &closed, &n) == KVS_OK) kvs_results_closed_rows_free(closed, n);
    kvs_clear_error();
}

static int dir_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Removes the report folder (its files only: the report writes no sub-folder). */
static void remove_report(const char *p) {
    DIR *d = opendir(p);
    if (!d) return;
    struct dirent *e;
    char f[512];
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(f, sizeof f, "%s/%s", p, e->d_name);
            unlink(f);
        }
    closedir(d);
    rmdir(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128], report[128];
    kvs_fuzz_write("results.db", data, size, path, sizeof path);
    snprintf(report, sizeof report, "%s/report", kvs_fuzz_dir());
    kvs_results_db *db = NULL;
    if (kvs_results_open_readonly(path, &db) == KVS_OK) {
        (void)kvs_results_schema_version(db);
        read_replay(db);
        read_drift(db);
        read_heads(db);
        read_plans_closed(db);
        kvs_results_close(db);
        kvs_plan_profile prof = {.aux_scale = KVS_PLAN_AUX_AUTO};
        (void)kvs_plan_profile_read(path, 0, NULL, 0, &prof);
        kvs_clear_error();
        kvs_report_options o = {.db_path = path, .out_dir = report, .gnuplot = gnuplot};
        if (kvs_report_write(&o, NULL) != KVS_OK && dir_exists(report)) {
            fprintf(stderr, "a failed report left %s: %s\n", report, kvs_last_error());
            abort();
        }
        remove_report(report);
        DIR *d = opendir(kvs_fuzz_dir()); /* nor its temporary folder (.report.tmp.XXXXXX) */
        struct dirent *e;
        while (d && (e = readdir(d)))
            if (!strncmp(e->d_name, ".report", 7)) {
                fprintf(stderr, "the report left %s behind\n", e->d_name);
                abort();
            }
        if (d) closedir(d);
    } else {
        kvs_results_close(db);
    }
    /* SQLite may leave a journal beside a database it could not read cleanly: start the next input afresh */
    char j[160];
    snprintf(j, sizeof j, "%s-journal", path);
    unlink(j);
    kvs_clear_error();
    return 0;
}
