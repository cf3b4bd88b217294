/* test_results.c — tests of the SQLite results database (results/results.h, schema in results/SCHEMA.md) and of
 * `kvsim runs`: schema v2 creation (one column per metric and statistic of the metric table) and idempotent
 * reopen, exact read-back of a written run (raw SQL and the read API), atomicity (a write failing midway, a
 * writer killed with SIGKILL mid-transaction), two processes writing at once, foreign/unwritable files left
 * byte-identical, the migration of a schema-v1 database (built with the v1 DDL) and v1 read-only reading,
 * the turns of a trace (trace_turns: written with the trace row, read back, refused when they do not tile the
 * trace, no turn info in v1 and older v2 files),
 * the read API's filters and step series, nearest-rank percentiles against hand-computed values, and
 * `kvsim runs` (table flags, CSV header and RFC 4180 quoting, JSON, write errors) run through KVSIM_BIN.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "common/json.h"
#include "common/kvs.h"
#include "common/sha256.h"
#include "results/results.h"
#include "results/results_internal.h"
#include "tests/util/testenv.h"

/* ------------------------------------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------------------------------- */

typedef struct {
    char dir[64];
    char db[128];
} tmp_ctx;

static int setup_tmp(void **state) {
    tmp_ctx *t = calloc(1, sizeof *t);
    if (!t) return -1;
    snprintf(t->dir, sizeof t->dir, "/tmp/kvs_results_XXXXXX");
    if (!mkdtemp(t->dir)) return -1;
    snprintf(t->db, sizeof t->db, "%s/results.db", t->dir);
    *state = t;
    return 0;
}

static int teardown_tmp(void **state) {
    tmp_ctx *t = *state;
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->dir);
    int rc = system(cmd);
    free(t);
    return rc == 0 ? 0 : -1;
}

static void expect_ok(kvs_status st) {
    if (st != KVS_OK) fprintf(stderr, "unexpected failure: %s (%s)\n", kvs_strerror(st), kvs_last_error());
    assert_int_equal(st, KVS_OK);
}

static void expect_msg(const char *part) {
    if (!strstr(kvs_last_error(), part)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", kvs_last_error(), part);
        fail();
    }
}

static kvs_results_trace make_trace(const char *path) {
    kvs_results_trace t = {.path = path, .model_name = "stories260K", .n_positions = 96, .prompt_len = 32,
                           .n_turns = 1, .n_layers = 2, .n_heads = 8, .n_kv_heads = 4, .head_dim = 8,
                           .dtype = "fp16", .file_bytes = 123456};
    return t;
}

/* Every statistic of every metric of the table distinct and exactly representable: base + metric/8 + stat/64. */
static kvs_results_stat agg_stat(double base, int metric) {
    double b = base + metric / 8.0;
    return (kvs_results_stat){.n = 100 + metric, .mean = b, .p50 = b + 1 / 64.0, .p95 = b + 2 / 64.0,
                              .max = b + 3 / 64.0, .min = b + 4 / 64.0};
}

static kvs_results_agg make_agg(int32_t layer, double base) {
    kvs_results_agg a = {.layer = layer};
    for (int i = 0; i < KVS_N_METRICS; i++) a.m[i] = agg_stat(base, i);
    return a;
}

/* Statistic s of agg_stat(base, metric) as it must read back. */
static double agg_expect(double base, int metric, int s) {
    kvs_results_stat st = agg_stat(base, metric);
    return kvs_results_stat_value(&st, (kvs_stat_kind)s);
}

static kvs_results_run make_run(const char *policy, const char *params, int64_t budget) {
    kvs_results_run r = {.policy = policy, .params = params, .budget_tokens = budget, .budget_fraction = -1,
                         .is_oracle = 0, .measure = "decode", .status = "complete", .error = NULL,
                         .wall_seconds = 0.5, .kvsim_version = "0.1.0"};
    return r;
}

/* n steps over 2 layers x 2 q heads, positions from 32; every metric recorded (distinct values) except
 * out_cos of q_head 0 in layer 1 (NaN = not recorded). */
static kvs_results_step *make_steps(int64_t n) {
    kvs_results_step *s = calloc((size_t)n, sizeof *s);
    assert_non_null(s);
    for (int64_t i = 0; i < n; i++) {
        s[i].layer = (int32_t)(i % 2);
        s[i].q_head = (int32_t)((i / 2) % 2);
        s[i].position = 32 + i / 4;
        for (int m = 0; m < KVS_N_METRICS; m++) s[i].v[m] = (double)m * 8.0 + (double)(i % 7) / 8.0;
        s[i].out_err = (float)(i % 7) / 8.0f;
        s[i].attn_recall = 1.0f - (float)(i % 5) / 16.0f;
        s[i].topk_overlap = 0.75f;
        s[i].attended_tokens = 16;
        s[i].storage_bytes = 4096.0 + (double)i;
        s[i].traffic_bytes = 2048.0;
        if (i % 4 == 1) s[i].out_cos = NAN;
    }
    return s;
}

static kvs_status write_simple_run(kvs_results_db *db, const char *trace_path, const char *policy, const char *params,
                                   int64_t budget, int64_t n_steps, int64_t *id) {
    kvs_results_trace t = make_trace(trace_path);
    kvs_results_run r = make_run(policy, params, budget);
    kvs_results_agg layers[2] = {make_agg(0, 0.25), make_agg(1, 0.5)};
    kvs_results_agg all = make_agg(-1, 0.375);
    kvs_results_step *s = make_steps(n_steps);
    kvs_status st = kvs_results_write_run(db, &t, &r, layers, 2, &all, s, n_steps, id);
    free(s);
    return st;
}

static sqlite3 *raw_open(const char *path) {
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 30000);
    return db;
}

static int64_t query_i64(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        fprintf(stderr, "query '%s' failed: %s\n", sql, sqlite3_errmsg(db));
        fail();
    }
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

static void query_text(sqlite3 *db, const char *sql, char *out, size_t cap) {
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    const char *s = (const char *)sqlite3_column_text(st, 0);
    snprintf(out, cap, "%s", s ? s : "(null)");
    sqlite3_finalize(st);
}

/* Row counts of every table, to compare a database before and after a failed operation. */
typedef struct {
    int64_t meta, traces, runs, run_layers, run_summary, steps, trace_turns;
} counts;

static counts table_counts(const char *path) {
    sqlite3 *db = raw_open(path);
    counts c = {query_i64(db, "SELECT count(*) FROM meta"),        query_i64(db, "SELECT count(*) FROM traces"),
                query_i64(db, "SELECT count(*) FROM runs"),        query_i64(db, "SELECT count(*) FROM run_layers"),
                query_i64(db, "SELECT count(*) FROM run_summary"), query_i64(db, "SELECT count(*) FROM steps"), -1};
    /* -1: no such table (a v1 database) */
    if (query_i64(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'trace_turns'"))
        c.trace_turns = query_i64(db, "SELECT count(*) FROM trace_turns");
    sqlite3_close(db);
    return c;
}

static void assert_counts_equal(counts a, counts b) {
    assert_int_equal(a.meta, b.meta);
    assert_int_equal(a.traces, b.traces);
    assert_int_equal(a.runs, b.runs);
    assert_int_equal(a.run_layers, b.run_layers);
    assert_int_equal(a.run_summary, b.run_summary);
    assert_int_equal(a.steps, b.steps);
    assert_int_equal(a.trace_turns, b.trace_turns);
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Asserts the file at path holds exactly data[0..n). */
static void assert_file_bytes(const char *path, const void *data, size_t n) {
    char *got = NULL;
    size_t len = 0;
    expect_ok(kvs_read_file(path, &got, &len));
    assert_int_equal(len, n);
    assert_memory_equal(got, data, n);
    free(got);
}

/* Runs KVSIM_BIN with argv (argv[0] ignored), stdout to out_path, stderr to err_path; returns exit code. */
static int run_cli(char *const argv[], const char *out_path, const char *err_path) {
    const char *bin = getenv("KVSIM_BIN");
    assert_non_null(bin);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0) _exit(126);
        dup2(fo, 1);
        dup2(fe, 2);
        execv(bin, argv);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/* Whole file as a NUL-terminated string (caller frees). */

/* ------------------------------------------------------------------------------------------------
 * Schema
 * ---------------------------------------------------------------------------------------------- */

static void test_open_creates_schema_and_reopen_is_idempotent(void **state) {
    tmp_ctx *t = *state;
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    assert_non_null(db);
    kvs_results_close(db);

    sqlite3 *raw = raw_open(t->db);
    char buf[128];
    query_text(raw, "SELECT value FROM meta WHERE key = 'creator'", buf, sizeof buf);
    assert_string_equal(buf, "kvsim");
    query_text(raw, "SELECT value FROM meta WHERE key = 'schema_version'", buf, sizeof buf);
    assert_string_equal(buf, "2");
    query_text(raw, "PRAGMA journal_mode", buf, sizeof buf);
    assert_string_equal(buf, "wal");
    const char *tables[] = {"meta", "traces", "trace_turns", "runs", "run_layers", "run_summary", "steps"};
    for (size_t i = 0; i < 7; i++) {
        char sql[128];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '%s'", tables[i]);
        assert_int_equal(query_i64(raw, sql), 1);
    }
    /* Every metric of the table has its six statistics in both aggregate tables and a steps column. */
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('run_layers')"),
                     2 + KVS_N_METRICS * KVS_N_STATS);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('run_summary')"),
                     1 + KVS_N_METRICS * KVS_N_STATS);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('steps')"), 4 + KVS_N_METRICS);
    for (int m = 0; m < KVS_N_METRICS; m++) {
        char sql[256];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM pragma_table_info('steps') WHERE name = '%s'",
                 kvs_metric_table[m].name);
        assert_int_equal(query_i64(raw, sql), 1);
        for (int st = 0; st < KVS_N_STATS; st++) {
            snprintf(sql, sizeof sql,
                     "SELECT count(*) FROM pragma_table_info('run_summary') WHERE name = '%s_%s' AND type = '%s'",
                     kvs_metric_table[m].name, kvs_stat_names[st], st == KVS_STAT_N ? "INTEGER" : "REAL");
            assert_int_equal(query_i64(raw, sql), 1);
        }
    }
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('runs') WHERE name IN "
                                    "('budget_scope', 'layout', 'notes')"),
                     3);
    query_text(raw, "SELECT value FROM meta WHERE key = 'created_at'", buf, sizeof buf);
    sqlite3_close(raw);

    /* Reopening (twice) changes nothing, keeps data and the original creation time. */
    expect_ok(kvs_results_open(t->db, &db));
    expect_ok(write_simple_run(db, "/traces/a.kvt", "h2o", "heavy=0.5", 64, 8, NULL));
    kvs_results_close(db);
    counts before = table_counts(t->db);
    expect_ok(kvs_results_open(t->db, &db));
    kvs_results_close(db);
    expect_ok(kvs_results_open(t->db, &db));
    kvs_results_close(db);
    assert_counts_equal(before, table_counts(t->db));
    assert_int_equal(before.meta, 3);
    raw = raw_open(t->db);
    char again[128];
    query_text(raw, "SELECT value FROM meta WHERE key = 'created_at'", again, sizeof again);
    assert_string_equal(buf, again);
    sqlite3_close(raw);
}

static void test_empty_file_is_initialised(void **state) {
    tmp_ctx *t = *state;
    write_file(t->db, "", 0); /* what mkstemp or touch leaves: no data to lose */
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    kvs_results_close(db);
    assert_int_equal(table_counts(t->db).meta, 3);
}

/* ------------------------------------------------------------------------------------------------
 * Writing
 * ---------------------------------------------------------------------------------------------- */

static void test_write_run_reads_back_exact_values(void **state) {
    tmp_ctx *t = *state;
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    kvs_results_trace tr = make_trace("/traces/stories.kvt");
    kvs_results_run run = make_run("snapkv", "window=32,kernel=7,pool=max", 48);
    run.budget_fraction = 0.2;
    run.is_oracle = 1;
    run.measure = "prefill";
    run.budget_scope = "prompt";
    run.layout = "per_query_head";
    run.notes = "window 32 >= budget 48 - 16";
    run.wall_seconds = 1.75;
    kvs_results_agg layers[2] = {make_agg(0, 0.25), make_agg(1, 0.5)};
    kvs_results_agg all = make_agg(-1, 0.375);
    kvs_results_step *steps = make_steps(12);
    int64_t id1 = 0, id2 = 0;
    expect_ok(kvs_results_write_run(db, &tr, &run, layers, 2, &all, steps, 12, &id1));
    assert_true(id1 > 0);
    /* Same trace again: one traces row, a second run (defaults for scope and layout). */
    run.budget_fraction = -1;
    run.budget_scope = run.layout = run.notes = NULL;
    run.measure = "all";
    expect_ok(kvs_results_write_run(db, &tr, &run, layers, 2, &all, steps, 12, &id2));
    assert_true(id2 > id1);
    kvs_results_close(db);

    sqlite3 *raw = raw_open(t->db);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM traces"), 1);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(raw,
                                        "SELECT t.path, t.model, t.n_positions, t.prompt_len, t.n_turns, t.n_layers, "
                                        "t.n_heads, t.n_kv_heads, t.head_dim, t.dtype, t.file_bytes, r.policy, r.params, "
                                        "r.budget_tokens, r.budget_fraction, r.is_oracle, r.measure, r.status, r.error, "
                                        "r.wall_seconds, r.kvsim_version, r.created_at, r.budget_scope, r.layout, r.notes "
                                        "FROM runs r JOIN traces t ON t.id = r.trace_id WHERE r.id = ?",
                                        -1, &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(st, 1, id1);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal(sqlite3_column_text(st, 0), "/traces/stories.kvt");
    assert_string_equal(sqlite3_column_text(st, 1), "stories260K");
    assert_int_equal(sqlite3_column_int64(st, 2), 96);
    assert_int_equal(sqlite3_column_int64(st, 3), 32);
    assert_int_equal(sqlite3_column_int64(st, 4), 1);
    assert_int_equal(sqlite3_column_int64(st, 5), 2);
    assert_int_equal(sqlite3_column_int64(st, 6), 8);
    assert_int_equal(sqlite3_column_int64(st, 7), 4);
    assert_int_equal(sqlite3_column_int64(st, 8), 8);
    assert_string_equal(sqlite3_column_text(st, 9), "fp16");
    assert_int_equal(sqlite3_column_int64(st, 10), 123456);
    assert_string_equal(sqlite3_column_text(st, 11), "snapkv");
    assert_string_equal(sqlite3_column_text(st, 12), "window=32,kernel=7,pool=max");
    assert_int_equal(sqlite3_column_int64(st, 13), 48);
    assert_true(sqlite3_column_double(st, 14) == 0.2);
    assert_int_equal(sqlite3_column_int(st, 15), 1);
    assert_string_equal(sqlite3_column_text(st, 16), "prefill");
    assert_string_equal(sqlite3_column_text(st, 17), "complete");
    assert_int_equal(sqlite3_column_type(st, 18), SQLITE_NULL);
    assert_true(sqlite3_column_double(st, 19) == 1.75);
    assert_string_equal(sqlite3_column_text(st, 20), "0.1.0");
    const char *created = (const char *)sqlite3_column_text(st, 21);
    /* UTC ISO 8601 with milliseconds: 2024-01-02T03:04:05.678Z */
    assert_int_equal(strlen(created), 24);
    assert_true(created[4] == '-' && created[10] == 'T' && created[19] == '.' && created[23] == 'Z');
    assert_string_equal(sqlite3_column_text(st, 22), "prompt");
    assert_string_equal(sqlite3_column_text(st, 23), "per_query_head");
    assert_string_equal(sqlite3_column_text(st, 24), "window 32 >= budget 48 - 16");
    sqlite3_finalize(st);
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT budget_fraction IS NULL AND budget_scope = 'every_step' AND layout = 'per_kv_head' AND notes IS "
             "NULL FROM runs WHERE id = %lld",
             (long long)id2);
    assert_int_equal(query_i64(raw, sql), 1); /* -1 = "no fraction given" is stored as NULL; NULL scope/layout */

    /* Aggregates: every statistic of every metric of the table, exactly, in both tables. */
    for (int table = 0; table < 2; table++)
        for (int li = 0; li < (table ? 1 : 2); li++) {
            double base = table ? 0.375 : (li ? 0.5 : 0.25);
            for (int m = 0; m < KVS_N_METRICS; m++)
                for (int k = 0; k < KVS_N_STATS; k++) {
                    snprintf(sql, sizeof sql, "SELECT %s_%s FROM %s WHERE run_id = %lld%s%d", kvs_metric_table[m].name,
                             kvs_stat_names[k], table ? "run_summary" : "run_layers", (long long)id1,
                             table ? " AND -1 = " : " AND layer = ", table ? -1 : li);
                    assert_int_equal(sqlite3_prepare_v2(raw, sql, -1, &st, NULL), SQLITE_OK);
                    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
                    if (k == KVS_STAT_N) assert_int_equal(sqlite3_column_int64(st, 0), 100 + m);
                    else if (sqlite3_column_double(st, 0) != agg_expect(base, m, k)) {
                        fprintf(stderr, "%s: got %.17g\n", sql, sqlite3_column_double(st, 0));
                        fail();
                    }
                    assert_int_equal(sqlite3_step(st), SQLITE_DONE);
                    sqlite3_finalize(st);
                }
        }

    /* Steps: every metric column of every sample (NaN stored as NULL). */
    for (int m = 0; m < KVS_N_METRICS; m++) {
        snprintf(sql, sizeof sql,
                 "SELECT layer, q_head, position, %s FROM steps WHERE run_id = %lld ORDER BY position, q_head, layer",
                 kvs_metric_table[m].name, (long long)id1);
        assert_int_equal(sqlite3_prepare_v2(raw, sql, -1, &st, NULL), SQLITE_OK);
        for (int64_t i = 0; i < 12; i++) {
            assert_int_equal(sqlite3_step(st), SQLITE_ROW);
            assert_int_equal(sqlite3_column_int(st, 0), steps[i].layer);
            assert_int_equal(sqlite3_column_int(st, 1), steps[i].q_head);
            assert_int_equal(sqlite3_column_int64(st, 2), steps[i].position);
            if (isnan(steps[i].v[m])) assert_int_equal(sqlite3_column_type(st, 3), SQLITE_NULL);
            else assert_true(sqlite3_column_double(st, 3) == steps[i].v[m]);
        }
        assert_int_equal(sqlite3_step(st), SQLITE_DONE);
        sqlite3_finalize(st);
    }
    assert_int_equal(query_i64(raw, "SELECT typeof(attended_tokens) = 'integer' FROM steps LIMIT 1"), 1);
    sqlite3_close(raw);

    /* The same through the read API. */
    expect_ok(kvs_results_open_readonly(t->db, &db));
    assert_int_equal(kvs_results_schema_version(db), KVS_RESULTS_SCHEMA_VERSION);
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    kvs_results_filter f = {.with_layers = 1};
    expect_ok(kvs_results_query_runs(db, &f, &rows, &n));
    assert_int_equal(n, 2);
    const kvs_results_run_row *w = &rows[0];
    assert_int_equal(w->id, id1);
    assert_string_equal(w->trace_path, "/traces/stories.kvt");
    assert_string_equal(w->model, "stories260K");
    assert_string_equal(w->dtype, "fp16");
    assert_true(w->n_positions == 96 && w->prompt_len == 32 && w->n_turns == 1 && w->n_layers == 2 &&
                w->n_heads == 8 && w->n_kv_heads == 4 && w->head_dim == 8);
    assert_string_equal(w->policy, "snapkv");
    assert_string_equal(w->params, "window=32,kernel=7,pool=max");
    assert_true(w->budget_tokens == 48 && w->budget_fraction == 0.2 && w->is_oracle == 1);
    assert_string_equal(w->measure, "prefill");
    assert_string_equal(w->budget_scope, "prompt");
    assert_string_equal(w->layout, "per_query_head");
    assert_string_equal(w->notes, "window 32 >= budget 48 - 16");
    assert_string_equal(w->status, "complete");
    assert_null(w->error);
    assert_true(w->wall_seconds == 1.75);
    assert_string_equal(w->kvsim_version, "0.1.0");
    assert_int_equal(strlen(w->created_at), 24);
    assert_true(w->has_agg);
    assert_int_equal(w->agg.layer, -1);
    assert_int_equal(w->n_layer_aggs, 2);
    for (int m = 0; m < KVS_N_METRICS; m++)
        for (int k = 0; k < KVS_N_STATS; k++) {
            assert_true(kvs_results_stat_value(&w->agg.m[m], (kvs_stat_kind)k) == agg_expect(0.375, m, k));
            for (int l = 0; l < 2; l++) {
                assert_int_equal(w->layer_aggs[l].layer, l);
                assert_true(kvs_results_stat_value(&w->layer_aggs[l].m[m], (kvs_stat_kind)k) ==
                            agg_expect(l ? 0.5 : 0.25, m, k));
            }
        }
    assert_true(rows[1].budget_fraction == -1 && !rows[1].notes && !strcmp(rows[1].budget_scope, "every_step"));
    kvs_results_run_rows_free(rows, n);

    /* Step series: per position the mean over the layer's query heads (or every layer) of the recorded samples. */
    kvs_results_series ser;
    for (int m = 0; m < KVS_N_METRICS; m++)
        for (int layer = -1; layer < 2; layer++) {
            expect_ok(kvs_results_query_steps(db, id1, layer, (kvs_metric)m, &ser));
            assert_int_equal(ser.n, 3); /* positions 32, 33, 34 */
            for (int64_t p = 0; p < 3; p++) {
                double sum = 0;
                int cnt = 0;
                for (int64_t i = 0; i < 12; i++)
                    if (steps[i].position == 32 + p && (layer < 0 || steps[i].layer == layer) && !isnan(steps[i].v[m])) {
                        sum += steps[i].v[m];
                        cnt++;
                    }
                assert_int_equal(ser.position[p], 32 + p);
                if (fabs(ser.value[p] - sum / cnt) > 1e-12) {
                    fprintf(stderr, "%s layer %d position %lld: %.17g != %.17g\n", kvs_metric_table[m].name, layer,
                            (long long)(32 + p), ser.value[p], sum / cnt);
                    fail();
                }
            }
            kvs_results_series_free(&ser);
        }
    expect_ok(kvs_results_query_steps(db, 999, -1, KVS_M_OUT_ERR, &ser));
    assert_int_equal(ser.n, 0);
    kvs_results_series_free(&ser);
    /* A read-only handle refuses writes. */
    assert_int_equal(kvs_results_write_run(db, &tr, &run, layers, 2, &all, NULL, 0, NULL), KVS_ERR_STATE);
    expect_msg("read-only");
    kvs_results_close(db);
    free(steps);
}

/* A metric without samples (n = 0) is stored as NULL statistics and reads back as not recorded. */
static void test_metric_without_samples_reads_as_not_recorded(void **state) {
    tmp_ctx *t = *state;
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    kvs_results_trace tr = make_trace("/traces/a.kvt");
    kvs_results_run run = make_run("h2o", "", 64);
    kvs_results_agg all = make_agg(-1, 0.5);
    all.out_cos = (kvs_results_stat){0};               /* what stat_compute gives for no samples */
    all.storage_host_bytes.mean = NAN;                 /* a NaN statistic */
    int64_t id = 0;
    expect_ok(kvs_results_write_run(db, &tr, &run, NULL, 0, &all, NULL, 0, &id));
    kvs_results_close(db);
    sqlite3 *raw = raw_open(t->db);
    assert_int_equal(query_i64(raw, "SELECT out_cos_n = 0 AND out_cos_mean IS NULL AND out_cos_p95 IS NULL AND "
                                    "storage_host_bytes_mean IS NULL AND storage_host_bytes_max IS NOT NULL "
                                    "FROM run_summary"),
                     1);
    sqlite3_close(raw);
    expect_ok(kvs_results_open_readonly(t->db, &db));
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    expect_ok(kvs_results_query_runs(db, NULL, &rows, &n));
    assert_int_equal(n, 1);
    assert_int_equal(rows[0].agg.out_cos.n, 0);
    for (int k = 1; k < KVS_N_STATS; k++) assert_true(isnan(kvs_results_stat_value(&rows[0].agg.out_cos, (kvs_stat_kind)k)));
    assert_true(isnan(rows[0].agg.storage_host_bytes.mean));
    assert_true(rows[0].agg.out_err.mean == agg_expect(0.5, KVS_M_OUT_ERR, KVS_STAT_MEAN));
    kvs_results_run_rows_free(rows, n);
    kvs_results_close(db);
}

static void test_failed_run_is_recorded_with_its_error(void **state) {
    tmp_ctx *t = *state;
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    kvs_results_trace tr = make_trace("/traces/a.kvt");
    kvs_results_run run = make_run("quest", "page=16", 64);
    run.status = "failed";
    run.error = "policy quest: page 16 exceeds budget 8";
    int64_t id = 0;
    expect_ok(kvs_results_write_run(db, &tr, &run, NULL, 0, NULL, NULL, 0, &id));
    kvs_results_close(db);
    sqlite3 *raw = raw_open(t->db);
    char buf[128];
    query_text(raw, "SELECT status || '|' || error FROM runs", buf, sizeof buf);
    assert_string_equal(buf, "failed|policy quest: page 16 exceeds budget 8");
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM run_summary"), 0);
    sqlite3_close(raw);
}

static void test_invalid_run_is_rejected_before_writing(void **state) {
    tmp_ctx *t = *state;
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    counts before = table_counts(t->db);
    kvs_results_trace tr = make_trace("/traces/a.kvt");
    kvs_results_run run = make_run("h2o", "", 64);
    kvs_results_agg all = make_agg(-1, 0.5);

    run.status = "done";
    assert_int_equal(kvs_results_write_run(db, &tr, &run, NULL, 0, &all, NULL, 0, NULL), KVS_ERR_INVALID_ARG);
    expect_msg("status 'done'");
    run.status = "complete";
    assert_int_equal(kvs_results_write_run(db, &tr, &run, NULL, 0, NULL, NULL, 0, NULL), KVS_ERR_INVALID_ARG);
    expect_msg("run-wide aggregate");
    run.measure = "sometimes";
    assert_int_equal(kvs_results_write_run(db, &tr, &run, NULL, 0, &all, NULL, 0, NULL), KVS_ERR_INVALID_ARG);
    expect_msg("measure 'sometimes' is not 'decode', 'prefill' or 'all'");
    run.measure = "decode";
    run.budget_scope = "tokens";
    assert_int_equal(kvs_results_write_run(db, &tr, &run, NULL, 0, &all, NULL, 0, NULL), KVS_ERR_INVALID_ARG);
    expect_msg("budget_scope 'tokens'");
    run.budget_scope = NULL;
    run.layout = "per_head";
    assert_int_equal(kvs_results_write_run(db, &tr, &run, NULL, 0, &all, NULL, 0, NULL), KVS_ERR_INVALID_ARG);
    expect_msg("layout 'per_head'");
    run.layout = NULL;
    kvs_results_agg bad_layer = make_agg(-1, 0.5);
    assert_int_equal(kvs_results_write_run(db, &tr, &run, &bad_layer, 1, &all, NULL, 0, NULL), KVS_ERR_INVALID_ARG);
    expect_msg("layer -1");
    assert_int_equal(kvs_results_write_run(db, &tr, &run, NULL, 0, &all, NULL, 5, NULL), KVS_ERR_INVALID_ARG);
    expect_msg("n_steps = 5");
    kvs_results_close(db);
    assert_counts_equal(before, table_counts(t->db));
}

/* A constraint violation on the LAST step (a duplicate key) after the trace, run, layer and summary rows
 * were inserted: the whole transaction must roll back. */
static void test_write_failing_midway_leaves_db_unchanged(void **state) {
    tmp_ctx *t = *state;
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    expect_ok(write_simple_run(db, "/traces/a.kvt", "h2o", "heavy=0.5", 64, 40, NULL));
    counts before = table_counts(t->db);

    kvs_results_trace tr = make_trace("/traces/NEW.kvt"); /* a new trace row is part of the rollback */
    static const kvs_turn turns[2] = {{0, 24, 48}, {48, 60, 96}}; /* so are its turns */
    tr.n_turns = 2;
    tr.turns = turns;
    kvs_results_run run = make_run("tova", "", 32);
    kvs_results_agg layers[2] = {make_agg(0, 0.25), make_agg(1, 0.5)};
    kvs_results_agg all = make_agg(-1, 0.375);
    kvs_results_step *steps = make_steps(30);
    steps[29] = steps[3];
    int64_t id = -7;
    assert_int_equal(kvs_results_write_run(db, &tr, &run, layers, 2, &all, steps, 30, &id), KVS_ERR_DB);
    expect_msg("cannot insert step 29");
    assert_int_equal(id, -7);
    assert_counts_equal(before, table_counts(t->db));

    /* Duplicate layer aggregate: fails on the second run_layers row. */
    layers[1].layer = 0;
    assert_int_equal(kvs_results_write_run(db, &tr, &run, layers, 2, &all, steps, 3, NULL), KVS_ERR_DB);
    expect_msg("run_layers");
    assert_counts_equal(before, table_counts(t->db));

    /* The connection is still usable after a rollback. */
    layers[1].layer = 1;
    expect_ok(kvs_results_write_run(db, &tr, &run, layers, 2, &all, steps, 29, &id));
    kvs_results_close(db);
    counts after = table_counts(t->db);
    assert_int_equal(after.runs, before.runs + 1);
    assert_int_equal(after.traces, before.traces + 1);
    assert_int_equal(after.steps, before.steps + 29);
    free(steps);
}

static off_t file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_size : -1;
}

/* A child writes one small run, then a huge one; it is SIGKILLed once the huge transaction has spilled
 * megabytes into the WAL (so the kill lands inside the transaction). The survivor must hold exactly the
 * small run, fully, and nothing of the big one. */
static void test_killed_writer_leaves_no_partial_run(void **state) {
    tmp_ctx *t = *state;
    char wal[160];
    snprintf(wal, sizeof wal, "%s-wal", t->db);
    const int64_t big = 1500000;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvs_results_db *db = NULL;
        if (kvs_results_open(t->db, &db) != KVS_OK) _exit(10);
        if (write_simple_run(db, "/traces/a.kvt", "h2o", "heavy=0.5", 64, 10, NULL) != KVS_OK) _exit(11);
        write_simple_run(db, "/traces/a.kvt", "tova", "", 32, big, NULL);
        _exit(12); /* reaching this means the kill came too late: the parent reports it */
    }
    int killed_mid_write = 0;
    for (int i = 0; i < 120000; i++) { /* up to ~2 min under sanitizers */
        if (file_size(wal) > 4 * 1024 * 1024) {
            killed_mid_write = kill(pid, SIGKILL) == 0;
            break;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            fprintf(stderr, "writer exited (status %d) before it could be killed mid-transaction\n", status);
            fail();
        }
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    int status = 0;
    if (!killed_mid_write) kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(killed_mid_write);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db)); /* recovers the WAL */
    kvs_results_close(db);
    sqlite3 *raw = raw_open(t->db);
    char buf[64];
    query_text(raw, "PRAGMA integrity_check", buf, sizeof buf);
    assert_string_equal(buf, "ok");
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM runs"), 1);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM runs WHERE policy = 'h2o' AND status = 'complete'"), 1);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM run_summary"), 1);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM run_layers"), 2);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM steps"), 10);
    sqlite3_close(raw);
}

/* Two processes create the same new database and write runs into it at the same time. */
static void test_two_processes_write_concurrently(void **state) {
    tmp_ctx *t = *state;
    enum { RUNS_EACH = 12, STEPS_EACH = 300 };
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t pids[2];
    fflush(NULL);
    for (int c = 0; c < 2; c++) {
        pids[c] = fork();
        assert_true(pids[c] >= 0);
        if (pids[c] == 0) {
            close(go[1]);
            char b;
            if (read(go[0], &b, 1) != 1) _exit(20); /* start together */
            kvs_results_db *db = NULL;
            if (kvs_results_open(t->db, &db) != KVS_OK) {
                fprintf(stderr, "child %d open: %s\n", c, kvs_last_error());
                _exit(21);
            }
            for (int i = 0; i < RUNS_EACH; i++) {
                char params[64];
                snprintf(params, sizeof params, "writer=%d,i=%d", c, i);
                if (write_simple_run(db, "/traces/shared.kvt", c ? "tova" : "h2o", params, 16 << (i % 4), STEPS_EACH,
                                     NULL) != KVS_OK) {
                    fprintf(stderr, "child %d run %d: %s\n", c, i, kvs_last_error());
                    _exit(22);
                }
            }
            kvs_results_close(db);
            _exit(0);
        }
    }
    close(go[0]);
    assert_int_equal(write(go[1], "gg", 2), 2);
    close(go[1]);
    for (int c = 0; c < 2; c++) {
        int status = 0;
        assert_int_equal(waitpid(pids[c], &status, 0), pids[c]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    counts c = table_counts(t->db);
    assert_int_equal(c.meta, 3);
    assert_int_equal(c.traces, 1);
    assert_int_equal(c.runs, 2 * RUNS_EACH);
    assert_int_equal(c.run_summary, 2 * RUNS_EACH);
    assert_int_equal(c.run_layers, 2 * 2 * RUNS_EACH);
    assert_int_equal(c.steps, 2 * RUNS_EACH * STEPS_EACH);
}

/* ------------------------------------------------------------------------------------------------
 * Foreign and unwritable files
 * ---------------------------------------------------------------------------------------------- */

static void expect_open_fails_unchanged(const char *path, kvs_status want, const char *msg_part) {
    char *before = NULL;
    size_t n = 0;
    expect_ok(kvs_read_file(path, &before, &n));
    kvs_results_db *db = (kvs_results_db *)1;
    kvs_clear_error();
    assert_int_equal(kvs_results_open(path, &db), want);
    assert_null(db);
    expect_msg(msg_part);
    assert_file_bytes(path, before, n);
    free(before);
}

static void test_not_a_kvsim_db_is_refused_and_left_unchanged(void **state) {
    tmp_ctx *t = *state;
    char path[160];

    snprintf(path, sizeof path, "%s/notes.txt", t->dir);
    const char text[] = "policy,budget\nh2o,64\n this is not a database, and it is longer than a header\n";
    write_file(path, text, sizeof text - 1);
    expect_open_fails_unchanged(path, KVS_ERR_DB, "not a kvsim results database");

    snprintf(path, sizeof path, "%s/tiny", t->dir);
    write_file(path, "SQLite", 6); /* shorter than the 16-byte header */
    expect_open_fails_unchanged(path, KVS_ERR_DB, "not an SQLite file");

    /* A real SQLite database of another program. */
    snprintf(path, sizeof path, "%s/other.sqlite", t->dir);
    sqlite3 *raw = NULL;
    assert_int_equal(sqlite3_open(path, &raw), SQLITE_OK);
    assert_int_equal(sqlite3_exec(raw, "CREATE TABLE contacts (name TEXT); INSERT INTO contacts VALUES ('ada');",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(raw);
    expect_open_fails_unchanged(path, KVS_ERR_DB, "without a kvsim meta table");

    /* ... even one with a table named meta that some other program wrote. */
    snprintf(path, sizeof path, "%s/other_meta.sqlite", t->dir);
    assert_int_equal(sqlite3_open(path, &raw), SQLITE_OK);
    assert_int_equal(sqlite3_exec(raw, "CREATE TABLE meta (key TEXT, value TEXT); "
                                       "INSERT INTO meta VALUES ('creator', 'someone-else');",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(raw);
    expect_open_fails_unchanged(path, KVS_ERR_DB, "creator is 'someone-else'");

    /* A corrupt file with a valid SQLite header: page data is garbage. */
    snprintf(path, sizeof path, "%s/corrupt.db", t->dir);
    uint8_t junk[8192];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 131 + 7);
    memcpy(junk, "SQLite format 3", 16);
    write_file(path, junk, sizeof junk);
    expect_open_fails_unchanged(path, KVS_ERR_DB, "not a kvsim results database");

    /* A directory. */
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(t->dir, &db), KVS_ERR_DB);
    expect_msg("not a regular file");
}

static void test_unwritable_paths_give_clear_errors(void **state) {
    tmp_ctx *t = *state;
    char path[192];
    kvs_results_db *db = NULL;

    snprintf(path, sizeof path, "%s/no/such/dir/results.db", t->dir);
    assert_int_equal(kvs_results_open(path, &db), KVS_ERR_IO);
    expect_msg("not writable");
    assert_null(db);

    /* A path "under" a regular file. */
    char file[160];
    snprintf(file, sizeof file, "%s/plain", t->dir);
    write_file(file, "x", 1);
    snprintf(path, sizeof path, "%s/results.db", file);
    assert_int_equal(kvs_results_open(path, &db), KVS_ERR_IO);
    assert_file_bytes(file, "x", 1);

    /* /proc refuses file creation even to root. */
    assert_int_equal(kvs_results_open("/proc/kvsim-results-test.db", &db), KVS_ERR_IO);
    expect_msg("/proc");

    /* A read-only kvsim database: refused with the file untouched (root ignores modes: skipped then). */
    expect_ok(kvs_results_open(t->db, &db));
    expect_ok(write_simple_run(db, "/traces/a.kvt", "h2o", "", 64, 4, NULL));
    kvs_results_close(db);
    db = NULL;
    if (geteuid() == 0) {
        fprintf(stderr, "note: running as root, the read-only-file case cannot be checked (root may write it)\n");
        return;
    }
    assert_int_equal(chmod(t->db, 0444), 0);
    expect_open_fails_unchanged(t->db, KVS_ERR_IO, "not writable");
    assert_int_equal(chmod(t->db, 0644), 0);
}

/* ------------------------------------------------------------------------------------------------
 * Schema version 1: read-only reading and migration. The DDL below is schema v1 as results/results.c wrote it
 * (git history, schema_version 1), frozen here so the tests keep building real v1 files.
 * ---------------------------------------------------------------------------------------------- */

static const char v1_fixed_sql[] =
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);\n"
    "CREATE TABLE traces (id INTEGER PRIMARY KEY, path TEXT NOT NULL, model TEXT NOT NULL,\n"
    "  n_positions INTEGER NOT NULL, prompt_len INTEGER NOT NULL, n_turns INTEGER NOT NULL,\n"
    "  n_layers INTEGER NOT NULL, n_heads INTEGER NOT NULL, n_kv_heads INTEGER NOT NULL, head_dim INTEGER NOT NULL,\n"
    "  dtype TEXT NOT NULL, file_bytes INTEGER NOT NULL,\n"
    "  UNIQUE (path, model, n_positions, prompt_len, n_turns, n_layers, n_heads, n_kv_heads, head_dim, dtype,\n"
    "          file_bytes));\n"
    "CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, trace_id INTEGER NOT NULL REFERENCES traces(id),\n"
    "  policy TEXT NOT NULL, params TEXT NOT NULL, budget_tokens INTEGER NOT NULL, budget_fraction REAL,\n"
    "  is_oracle INTEGER NOT NULL CHECK (is_oracle IN (0, 1)),\n"
    "  measure TEXT NOT NULL CHECK (measure IN ('decode', 'all')),\n"
    "  status TEXT NOT NULL CHECK (status IN ('complete', 'failed')), error TEXT, wall_seconds REAL,\n"
    "  kvsim_version TEXT NOT NULL,\n"
    "  created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')));\n"
    "CREATE INDEX runs_policy ON runs (policy, params, budget_tokens);\n"
    "CREATE INDEX runs_trace ON runs (trace_id);\n"
    "CREATE TABLE steps (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
    "  layer INTEGER NOT NULL, q_head INTEGER NOT NULL, position INTEGER NOT NULL, out_err REAL, attn_recall REAL,\n"
    "  topk_overlap REAL, attended_tokens INTEGER NOT NULL, storage_bytes REAL, traffic_bytes REAL,\n"
    "  PRIMARY KEY (run_id, layer, q_head, position)) WITHOUT ROWID;\n";

/* The seven metrics of schema v1, in its column order. */
static const char *const v1_metrics[7] = {"out_err",       "attn_recall",    "topk_overlap",     "storage_bytes",
                                          "traffic_bytes", "transfer_bytes", "compression_ratio"};

static void exec_raw(sqlite3 *db, const char *sql) {
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        fprintf(stderr, "SQL failed: %s\n%s\n", msg ? msg : "?", sql);
        sqlite3_free(msg);
        fail();
    }
}

/* Value of v1 statistic s (0 = n) of v1 metric i for a row with this base: n = 40, base + i/8 + s/64. */
static double v1_value(double base, int i, int s) { return s == 0 ? 40.0 : base + i / 8.0 + s / 64.0; }

/* Writes one v1 aggregate row ("run_id[, layer]" values given in lead). */
static void v1_agg_row(sqlite3 *db, const char *table, const char *lead_cols, const char *lead_vals, double base) {
    char sql[4096];
    size_t len = (size_t)snprintf(sql, sizeof sql, "INSERT INTO %s (%s", table, lead_cols);
    static const char *const stats[6] = {"n", "mean", "p50", "p95", "max", "min"};
    for (int i = 0; i < 7; i++)
        for (int s = 0; s < 6; s++) len += (size_t)snprintf(sql + len, sizeof sql - len, ", %s_%s", v1_metrics[i], stats[s]);
    len += (size_t)snprintf(sql + len, sizeof sql - len, ") VALUES (%s", lead_vals);
    for (int i = 0; i < 7; i++)
        for (int s = 0; s < 6; s++) len += (size_t)snprintf(sql + len, sizeof sql - len, ", %.17g", v1_value(base, i, s));
    snprintf(sql + len, sizeof sql - len, ")");
    exec_raw(db, sql);
}

/* A schema-v1 database (meta.schema_version = version) as kvsim 0.1 wrote it: run 1 complete (run_summary,
 * 2 run_layers rows, 4 steps at position 40), run 2 failed, the run id sequence at 5 (run 5 deleted). */
static void make_v1_db(const char *path, const char *version) {
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    exec_raw(db, "PRAGMA journal_mode = WAL");
    exec_raw(db, v1_fixed_sql);
    static const char *const stats[6] = {"n", "mean", "p50", "p95", "max", "min"};
    for (int t = 0; t < 2; t++) {
        char sql[4096];
        size_t len = (size_t)snprintf(sql, sizeof sql, "CREATE TABLE %s (%s", t ? "run_summary" : "run_layers",
                                      t ? "run_id INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE"
                                        : "run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE, "
                                          "layer INTEGER NOT NULL CHECK (layer >= 0)");
        for (int i = 0; i < 7; i++)
            for (int s = 0; s < 6; s++)
                len += (size_t)snprintf(sql + len, sizeof sql - len, ", %s_%s %s", v1_metrics[i], stats[s],
                                        s ? "REAL" : "INTEGER NOT NULL");
        snprintf(sql + len, sizeof sql - len, "%s)", t ? "" : ", PRIMARY KEY (run_id, layer)");
        exec_raw(db, sql);
    }
    char meta[256];
    snprintf(meta, sizeof meta,
             "INSERT INTO meta VALUES ('creator', 'kvsim'), ('schema_version', '%s'), "
             "('created_at', '2025-01-01T00:00:00.000Z')",
             version);
    exec_raw(db, meta);
    exec_raw(db, "INSERT INTO traces VALUES (1, '/traces/v1.kvt', 'stories260K', 96, 32, 1, 2, 8, 4, 8, 'fp16', 1000);"
                 "INSERT INTO runs (id, trace_id, policy, params, budget_tokens, budget_fraction, is_oracle, measure, "
                 "status, error, wall_seconds, kvsim_version) VALUES "
                 "(1, 1, 'h2o', 'heavy=0.5', 32, 0.25, 0, 'decode', 'complete', NULL, 0.5, '0.1.0'), "
                 "(2, 1, 'quest', 'page=16', 8, NULL, 0, 'all', 'failed', 'page 16 exceeds budget 8', 0.1, '0.1.0'), "
                 "(5, 1, 'tova', '', 64, NULL, 0, 'decode', 'complete', NULL, 0.1, '0.1.0');"
                 "DELETE FROM runs WHERE id = 5;"
                 "INSERT INTO steps VALUES (1, 0, 0, 40, 0.5, 0.75, 0.5, 16, 1024, 2048), "
                 "(1, 0, 1, 40, 0.25, 0.5, 0.5, 16, 1024, 2048), (1, 1, 0, 40, 0.125, 1, 0.5, 16, 1024, 2048), "
                 "(1, 1, 1, 40, 0.125, 1, 0.5, 16, 1024, 2048);");
    v1_agg_row(db, "run_summary", "run_id", "1", 0.375);
    v1_agg_row(db, "run_layers", "run_id, layer", "1, 0", 0.25);
    v1_agg_row(db, "run_layers", "run_id, layer", "1, 1", 0.5);
    assert_int_equal(sqlite3_close(db), SQLITE_OK);
}

/* The v1 values of run 1 read back through the read API; the metrics v1 did not have are not recorded. */
static void expect_v1_run1(const kvs_results_run_row *w) {
    assert_int_equal(w->id, 1);
    assert_string_equal(w->policy, "h2o");
    assert_string_equal(w->params, "heavy=0.5");
    assert_true(w->budget_tokens == 32 && w->budget_fraction == 0.25 && w->wall_seconds == 0.5);
    assert_string_equal(w->measure, "decode");
    assert_string_equal(w->trace_path, "/traces/v1.kvt");
    assert_true(w->has_agg);
    for (int m = 0; m < KVS_N_METRICS; m++) {
        int v1 = -1;
        for (int i = 0; i < 7; i++)
            if (!strcmp(v1_metrics[i], kvs_metric_table[m].name)) v1 = i;
        for (int s = 0; s < KVS_N_STATS; s++) {
            double got = kvs_results_stat_value(&w->agg.m[m], (kvs_stat_kind)s);
            if (v1 >= 0) assert_true(got == v1_value(0.375, v1, s));
            else if (s == KVS_STAT_N) assert_true(got == 0);
            else assert_true(isnan(got));
        }
    }
}

static void test_v1_database_is_read_without_migration(void **state) {
    tmp_ctx *t = *state;
    make_v1_db(t->db, "1");
    char *before = NULL;
    size_t n_before = 0;
    expect_ok(kvs_read_file(t->db, &before, &n_before));

    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open_readonly(t->db, &db));
    assert_int_equal(kvs_results_schema_version(db), 1);
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    kvs_results_filter f = {.include_failed = 1, .with_layers = 1};
    expect_ok(kvs_results_query_runs(db, &f, &rows, &n));
    assert_int_equal(n, 2);
    expect_v1_run1(&rows[0]);
    assert_null(rows[0].budget_scope); /* not recorded by v1 */
    assert_null(rows[0].layout);
    assert_null(rows[0].notes);
    assert_null(rows[0].options);      /* v1 has no runs.options */
    assert_null(rows[0].trace_sha256); /* nor sweep_traces */
    assert_int_equal(rows[0].n_layer_aggs, 2);
    assert_true(rows[0].layer_aggs[1].out_err.mean == v1_value(0.5, 0, 1));
    assert_true(isnan(rows[0].layer_aggs[1].out_cos.mean));
    assert_string_equal(rows[1].status, "failed");
    assert_string_equal(rows[1].error, "page 16 exceeds budget 8");
    assert_false(rows[1].has_agg);
    assert_true(isnan(rows[1].agg.out_err.mean));
    kvs_results_run_rows_free(rows, n);
    kvs_results_series ser;
    expect_ok(kvs_results_query_steps(db, 1, -1, KVS_M_OUT_ERR, &ser));
    assert_int_equal(ser.n, 1);
    assert_true(ser.position[0] == 40 && ser.value[0] == 0.25);
    kvs_results_series_free(&ser);
    expect_ok(kvs_results_query_steps(db, 1, 1, KVS_M_ATTN_RECALL, &ser));
    assert_true(ser.n == 1 && ser.value[0] == 1.0);
    kvs_results_series_free(&ser);
    expect_ok(kvs_results_query_steps(db, 1, -1, KVS_M_OUT_COS, &ser)); /* no such v1 column */
    assert_int_equal(ser.n, 0);
    kvs_results_series_free(&ser);
    kvs_turn *turns = (kvs_turn *)&ser; /* must be replaced by NULL */
    int64_t n_turns = -1;
    expect_ok(kvs_results_query_turns(db, 1, &turns, &n_turns)); /* v1 has no trace_turns: no turn info */
    assert_int_equal(n_turns, 0);
    assert_null(turns);
    kvs_results_close(db);

    /* `kvsim runs` reads it too, and never modifies it. */
    if (getenv("KVSIM_BIN")) {
        char out[160], err[160];
        snprintf(out, sizeof out, "%s/out.txt", t->dir);
        snprintf(err, sizeof err, "%s/err.txt", t->dir);
        char *argv[] = {"kvsim", "runs", t->db, "--csv", NULL};
        assert_int_equal(run_cli(argv, out, err), 0);
        char *csv = kvs_test_slurp(out, NULL);
        /* layer 0 (base 0.25): out_err mean/p95/max .265625/.296875/.3125, recall .390625, topk .515625 */
        const char *row = "h2o,heavy=0.5,32,0,0.265625,0.296875,0.3125,0.390625,0.515625,";
        assert_non_null(strstr(csv, row));
        free(csv);
        char *argt[] = {"kvsim", "runs", t->db, NULL};
        assert_int_equal(run_cli(argt, out, err), 0);
        char *table = kvs_test_slurp(out, NULL);
        assert_non_null(strstr(table, "h2o"));
        free(table);
    }
    assert_file_bytes(t->db, before, n_before);
    free(before);
}

static void test_v1_database_is_migrated_on_open_for_writing(void **state) {
    tmp_ctx *t = *state;
    make_v1_db(t->db, "1");
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    assert_int_equal(kvs_results_schema_version(db), 2);
    /* v2 content is accepted now: measure 'prefill', the new run columns, every metric; ids are not reused. */
    kvs_results_trace tr = make_trace("/traces/v1.kvt");
    kvs_results_run run = make_run("snapkv", "window=8", 48);
    run.measure = "prefill";
    run.budget_scope = "prompt";
    kvs_results_agg layers[2] = {make_agg(0, 0.25), make_agg(1, 0.5)};
    kvs_results_agg all = make_agg(-1, 0.375);
    kvs_results_step *steps = make_steps(8);
    int64_t id = 0;
    expect_ok(kvs_results_write_run(db, &tr, &run, layers, 2, &all, steps, 8, &id));
    assert_int_equal(id, 6); /* the v1 sequence stood at 5 */
    /* steps.attended_tokens keeps v1's NOT NULL: a step without it is refused before anything is written. */
    steps[3].attended_tokens = NAN;
    assert_int_equal(kvs_results_write_run(db, &tr, &run, layers, 2, &all, steps, 8, NULL), KVS_ERR_INVALID_ARG);
    expect_msg("NOT NULL in this database");
    free(steps);
    kvs_results_close(db);

    sqlite3 *raw = raw_open(t->db);
    char buf[128];
    query_text(raw, "SELECT value FROM meta WHERE key = 'schema_version'", buf, sizeof buf);
    assert_string_equal(buf, "2");
    query_text(raw, "SELECT value FROM meta WHERE key = 'migrated_from'", buf, sizeof buf);
    assert_string_equal(buf, "1");
    query_text(raw, "PRAGMA integrity_check", buf, sizeof buf);
    assert_string_equal(buf, "ok");
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name IN "
                                    "('runs_policy', 'runs_trace')"),
                     2);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('run_summary')"),
                     1 + KVS_N_METRICS * KVS_N_STATS);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('run_layers')"),
                     2 + KVS_N_METRICS * KVS_N_STATS);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('steps')"), 4 + KVS_N_METRICS);
    /* The migration creates the turn table; the v1 trace has no turns recorded (no turn info). */
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('trace_turns')"), 5);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM trace_turns"), 0);
    /* Old rows intact; the new columns are NULL (not recorded) for them. */
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM runs"), 3);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM runs WHERE id = 1 AND policy = 'h2o' AND "
                                    "budget_fraction = 0.25 AND budget_scope IS NULL AND layout IS NULL"),
                     1);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM runs WHERE id = 2 AND status = 'failed' AND "
                                    "error = 'page 16 exceeds budget 8'"),
                     1);
    assert_int_equal(query_i64(raw, "SELECT out_err_n = 40 AND out_err_mean = 0.390625 AND out_cos_n IS NULL AND "
                                    "out_cos_mean IS NULL FROM run_summary WHERE run_id = 1"),
                     1);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM steps WHERE run_id = 1 AND out_cos IS NULL"), 4);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM run_summary WHERE run_id = 6 AND out_cos_n = 102"), 1);
    /* The rebuilt runs table still anchors the foreign keys: deleting a run cascades. */
    exec_raw(raw, "PRAGMA foreign_keys = ON; DELETE FROM runs WHERE id = 1;");
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM run_layers WHERE run_id = 1"), 0);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM steps WHERE run_id = 1"), 0);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM run_summary WHERE run_id = 1"), 0);
    sqlite3_close(raw);

    /* Reopening a migrated database changes nothing. */
    counts before = table_counts(t->db);
    expect_ok(kvs_results_open(t->db, &db));
    kvs_results_close(db);
    assert_counts_equal(before, table_counts(t->db));
}

/* ------------------------------------------------------------------------------------------------
 * The turns of a trace (table trace_turns)
 * ---------------------------------------------------------------------------------------------- */

static void expect_turns(kvs_results_db *db, int64_t trace_id, const kvs_turn *want, int64_t n_want) {
    kvs_turn *turns = NULL;
    int64_t n = -1;
    expect_ok(kvs_results_query_turns(db, trace_id, &turns, &n));
    assert_int_equal(n, n_want);
    if (n_want == 0) assert_null(turns);
    for (int64_t i = 0; i < n; i++) {
        assert_int_equal(turns[i].begin, want[i].begin);
        assert_int_equal(turns[i].prompt_end, want[i].prompt_end);
        assert_int_equal(turns[i].end, want[i].end);
    }
    free(turns);
}

/* The trace id of run `id`. */
static int64_t trace_of(kvs_results_db *db, int64_t id) {
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    kvs_results_filter f = {.run_id = id, .include_failed = 1};
    expect_ok(kvs_results_query_runs(db, &f, &rows, &n));
    assert_int_equal(n, 1);
    int64_t tid = rows[0].trace_id;
    kvs_results_run_rows_free(rows, n);
    return tid;
}

static void test_trace_turns_are_written_and_read(void **state) {
    tmp_ctx *t = *state;
    static const kvs_turn three[3] = {{0, 32, 48}, {48, 60, 72}, {72, 80, 96}};
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    kvs_results_trace tr = make_trace("/traces/chat.kvt");
    tr.n_turns = 3;
    tr.turns = three;
    kvs_results_run run = make_run("h2o", "heavy=0.5", 16);
    kvs_results_agg all = make_agg(-1, 0.375);
    int64_t id1 = 0, id2 = 0, id3 = 0;
    expect_ok(kvs_results_write_run(db, &tr, &run, NULL, 0, &all, NULL, 0, &id1));
    run.budget_tokens = 32; /* a second run of the same trace: the same trace row, the turns once */
    expect_ok(kvs_results_write_run(db, &tr, &run, NULL, 0, &all, NULL, 0, &id2));
    int64_t chat = trace_of(db, id1);
    assert_int_equal(trace_of(db, id2), chat);
    expect_turns(db, chat, three, 3);
    /* A trace written without its turns has no turn info; so has a trace id that does not exist. */
    kvs_results_trace plain = make_trace("/traces/plain.kvt");
    expect_ok(kvs_results_write_run(db, &plain, &run, NULL, 0, &all, NULL, 0, &id3));
    int64_t plain_id = trace_of(db, id3);
    assert_true(plain_id != chat);
    expect_turns(db, plain_id, NULL, 0);
    expect_turns(db, 999, NULL, 0);
    /* ... until it is written with them: the same trace row gains them. */
    static const kvs_turn one[1] = {{0, 32, 96}};
    plain.turns = one;
    expect_ok(kvs_results_write_run(db, &plain, &run, NULL, 0, &all, NULL, 0, &id3));
    assert_int_equal(trace_of(db, id3), plain_id);
    expect_turns(db, plain_id, one, 1);
    kvs_results_close(db);
    sqlite3 *raw = raw_open(t->db);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM trace_turns"), 4);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM trace_turns WHERE turn = 1 AND begin_pos = 48 AND "
                                    "prompt_end = 60 AND end_pos = 72"),
                     1);
    sqlite3_close(raw);
    /* Readers see them through a read-only handle too. */
    expect_ok(kvs_results_open_readonly(t->db, &db));
    expect_turns(db, chat, three, 3);
    kvs_results_close(db);

    /* Turns that do not tile the trace are refused before anything is written. */
    expect_ok(kvs_results_open(t->db, &db));
    counts before = table_counts(t->db);
    kvs_results_trace bad = make_trace("/traces/bad.kvt");
    static const kvs_turn gap[2] = {{0, 32, 48}, {50, 60, 96}}, backwards[2] = {{0, 32, 48}, {48, 80, 72}},
                          short_[2] = {{0, 32, 48}, {48, 60, 90}}, late[1] = {{4, 32, 96}};
    struct {
        const kvs_turn *turns;
        int64_t n;
        const char *msg;
    } cases[5] = {{gap, 2, "turn 1 begins at 50"},
                  {backwards, 2, "turn 1: positions 48, 80, 72"},
                  {short_, 2, "end at 90"},
                  {late, 1, "turn 0 begins at 4"},
                  {gap, 0, "n_turns 0"}};
    for (int i = 0; i < 5; i++) {
        bad.turns = cases[i].turns;
        bad.n_turns = cases[i].n;
        assert_int_equal(kvs_results_write_run(db, &bad, &run, NULL, 0, &all, NULL, 0, NULL), KVS_ERR_INVALID_ARG);
        expect_msg(cases[i].msg);
    }
    kvs_results_close(db);
    assert_counts_equal(before, table_counts(t->db));
}

/* A v2 database written before trace_turns existed: readers find no turn info; the next open for writing
 * adds the table. */
/* The helpers of the table families (results/results_internal.h): a family table created inside a transaction that
 * rolls back is gone and the database unchanged; one that commits is there; kvs_results_trace_id gives the
 * replay's own trace row; a read-only handle refuses to begin a write. */
static void test_family_helpers(void **state) {
    tmp_ctx *t = *state;
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    kvs_results_trace tr = make_trace("/traces/family.kvt");
    kvs_results_run run = make_run("h2o", "heavy=0.5", 16);
    kvs_results_agg all = make_agg(-1, 0.375);
    int64_t run_id = 0, tid = 0, tid2 = 0;
    expect_ok(kvs_results_write_run(db, &tr, &run, NULL, 0, &all, NULL, 0, &run_id));
    assert_int_equal(kvs_results_table_exists(db, "family_rows"), 0);
    assert_int_equal(kvs_results_table_exists(db, "runs"), 1);
    expect_ok(kvs_results_txn_begin(db, "family write"));
    expect_ok(kvs_results_exec(db, "CREATE TABLE IF NOT EXISTS family_rows (trace_id INTEGER REFERENCES traces(id), x REAL)",
                               "create"));
    expect_ok(kvs_results_trace_id(db, &tr, &tid));
    assert_int_equal(tid, trace_of(db, run_id));
    kvs_results_txn_rollback(db);
    assert_int_equal(kvs_results_table_exists(db, "family_rows"), 0);
    kvs_results_trace other = make_trace("/traces/other.kvt");
    expect_ok(kvs_results_txn_begin(db, "family write"));
    expect_ok(kvs_results_exec(db, "CREATE TABLE IF NOT EXISTS family_rows (trace_id INTEGER REFERENCES traces(id), x REAL)",
                               "create"));
    expect_ok(kvs_results_trace_id(db, &other, &tid2));
    assert_true(tid2 != tid);
    sqlite3_stmt *ins = NULL;
    expect_ok(kvs_results_prepare(db, "INSERT INTO family_rows VALUES (?1, 0.5)", &ins, "prepare"));
    sqlite3_bind_int64(ins, 1, tid2);
    expect_ok(kvs_results_step_done(db, ins, "insert"));
    sqlite3_finalize(ins);
    expect_ok(kvs_results_txn_commit(db, "commit"));
    assert_int_equal(kvs_results_table_exists(db, "family_rows"), 1);
    assert_int_equal(kvs_results_prepare(db, "SELECT nope FROM family_rows", &ins, "bad select"), KVS_ERR_DB);
    kvs_results_close(db);
    expect_ok(kvs_results_open_readonly(t->db, &db));
    assert_int_equal(kvs_results_is_readonly(db), 1);
    assert_int_equal(kvs_results_txn_begin(db, "family write"), KVS_ERR_STATE);
    assert_int_equal(kvs_results_trace_id(db, &tr, &tid), KVS_ERR_STATE);
    assert_int_equal(kvs_results_table_exists(db, "family_rows"), 1);
    kvs_results_close(db);
}

static void test_v2_database_without_turn_table(void **state) {
    tmp_ctx *t = *state;
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    int64_t id = 0;
    expect_ok(write_simple_run(db, "/traces/a.kvt", "h2o", "heavy=0.5", 64, 8, &id));
    kvs_results_close(db);
    sqlite3 *raw = raw_open(t->db);
    exec_raw(raw, "DROP TABLE trace_turns");
    sqlite3_close(raw);
    expect_ok(kvs_results_open_readonly(t->db, &db));
    expect_turns(db, trace_of(db, id), NULL, 0);
    kvs_results_close(db);
    expect_ok(kvs_results_open(t->db, &db));
    kvs_results_close(db);
    raw = raw_open(t->db);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('trace_turns')"), 5);
    sqlite3_close(raw);
}

/* A migrated v1 database has trace_turns (created in the migration's transaction), empty: the v1 trace has no
 * turn info until it is written again with its turns. */
static void test_migration_creates_the_turn_table(void **state) {
    tmp_ctx *t = *state;
    make_v1_db(t->db, "1");
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    kvs_turn *turns = NULL;
    int64_t n = -1;
    expect_ok(kvs_results_query_turns(db, 1, &turns, &n));
    assert_int_equal(n, 0);
    /* The v1 trace written again with its turns (same trace row): the turns are recorded for it. */
    kvs_results_trace tr = make_trace("/traces/v1.kvt");
    tr.file_bytes = 1000; /* the v1 row: 96 positions, prompt 32, 1 turn, 1000 bytes */
    static const kvs_turn one[1] = {{0, 32, 96}};
    tr.turns = one;
    kvs_results_run run = make_run("window", "", 16);
    kvs_results_agg all = make_agg(-1, 0.375);
    int64_t id = 0;
    expect_ok(kvs_results_write_run(db, &tr, &run, NULL, 0, &all, NULL, 0, &id));
    kvs_results_run_row *rows = NULL;
    int64_t n_rows = 0;
    kvs_results_filter f = {.run_id = id};
    expect_ok(kvs_results_query_runs(db, &f, &rows, &n_rows));
    assert_int_equal(n_rows, 1);
    assert_int_equal(rows[0].trace_id, 1);
    kvs_results_run_rows_free(rows, n_rows);
    expect_ok(kvs_results_query_turns(db, 1, &turns, &n));
    assert_int_equal(n, 1);
    assert_true(turns[0].begin == 0 && turns[0].prompt_end == 32 && turns[0].end == 96);
    free(turns);
    kvs_results_close(db);
    sqlite3 *raw = raw_open(t->db);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'trace_turns'"),
                     1);
    sqlite3_close(raw);
}

/* What migrates is also read correctly: the v1 values through the read API after the migration. */
static void test_migrated_database_reads_back_v1_values(void **state) {
    tmp_ctx *t = *state;
    make_v1_db(t->db, "1");
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    kvs_results_close(db);
    expect_ok(kvs_results_open_readonly(t->db, &db));
    assert_int_equal(kvs_results_schema_version(db), 2);
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    expect_ok(kvs_results_query_runs(db, NULL, &rows, &n));
    assert_int_equal(n, 1);
    expect_v1_run1(&rows[0]);
    kvs_results_run_rows_free(rows, n);
    kvs_results_close(db);
}

static void test_failed_migration_leaves_v1_database_unchanged(void **state) {
    tmp_ctx *t = *state;
    make_v1_db(t->db, "1");
    /* An object in the way of the rebuild makes the migration fail midway (after reading everything). */
    sqlite3 *raw = raw_open(t->db);
    exec_raw(raw, "CREATE TABLE runs_v2 (x INTEGER)");
    sqlite3_close(raw);
    counts before = table_counts(t->db);
    kvs_results_db *db = (kvs_results_db *)1;
    assert_int_equal(kvs_results_open(t->db, &db), KVS_ERR_DB);
    assert_null(db);
    expect_msg("cannot migrate the results database from schema version 1 to 2");
    expect_msg("still version 1");
    assert_counts_equal(before, table_counts(t->db));
    raw = raw_open(t->db);
    char buf[64];
    query_text(raw, "SELECT value FROM meta WHERE key = 'schema_version'", buf, sizeof buf);
    assert_string_equal(buf, "1");
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('runs') WHERE name = 'budget_scope'"), 0);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('run_summary')"), 1 + 7 * 6);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('steps')"), 10);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM meta WHERE key = 'migrated_from'"), 0);
    sqlite3_close(raw);
    /* Still readable as v1. */
    expect_ok(kvs_results_open_readonly(t->db, &db));
    assert_int_equal(kvs_results_schema_version(db), 1);
    kvs_results_close(db);
}

static void test_newer_schema_version_is_refused_unchanged(void **state) {
    tmp_ctx *t = *state;
    make_v1_db(t->db, "3");
    expect_open_fails_unchanged(t->db, KVS_ERR_VERSION, "schema version 3 is not supported");
    kvs_results_db *db = (kvs_results_db *)1;
    assert_int_equal(kvs_results_open_readonly(t->db, &db), KVS_ERR_VERSION);
    assert_null(db);
    expect_msg("schema version 3 is not supported");
}

/* Two processes open one v1 database for writing at once: one migrates, the other finds v2; both write. */
static void test_two_processes_migrate_at_once(void **state) {
    tmp_ctx *t = *state;
    make_v1_db(t->db, "1");
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t pids[2];
    fflush(NULL);
    for (int c = 0; c < 2; c++) {
        pids[c] = fork();
        assert_true(pids[c] >= 0);
        if (pids[c] == 0) {
            close(go[1]);
            char b;
            if (read(go[0], &b, 1) != 1) _exit(20);
            kvs_results_db *db = NULL;
            if (kvs_results_open(t->db, &db) != KVS_OK) {
                fprintf(stderr, "child %d open: %s\n", c, kvs_last_error());
                _exit(21);
            }
            if (write_simple_run(db, "/traces/v1.kvt", c ? "tova" : "h2o", "", 64, 8, NULL) != KVS_OK) _exit(22);
            kvs_results_close(db);
            _exit(0);
        }
    }
    close(go[0]);
    assert_int_equal(write(go[1], "gg", 2), 2);
    close(go[1]);
    for (int c = 0; c < 2; c++) {
        int status = 0;
        assert_int_equal(waitpid(pids[c], &status, 0), pids[c]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    sqlite3 *raw = raw_open(t->db);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM runs"), 4);
    assert_int_equal(query_i64(raw, "SELECT min(id) FROM runs WHERE id > 2"), 6);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('runs') WHERE name = 'layout'"), 1);
    char buf[64];
    query_text(raw, "SELECT value FROM meta WHERE key = 'schema_version'", buf, sizeof buf);
    assert_string_equal(buf, "2");
    sqlite3_close(raw);
}

/* A v2 database written before the last metric of the table existed (simulated by dropping its columns) is
 * read with that metric not recorded, and gains its columns at the next open for writing. */
static void test_v2_database_gains_appended_metric_columns(void **state) {
    tmp_ctx *t = *state;
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    expect_ok(write_simple_run(db, "/traces/a.kvt", "h2o", "", 64, 4, NULL));
    kvs_results_close(db);
    const char *last = kvs_metric_table[KVS_N_METRICS - 1].name;
    sqlite3 *raw = raw_open(t->db);
    char sql[256];
    for (int k = 0; k < KVS_N_STATS; k++)
        for (int tb = 0; tb < 2; tb++) {
            snprintf(sql, sizeof sql, "ALTER TABLE %s DROP COLUMN %s_%s", tb ? "run_summary" : "run_layers", last,
                     kvs_stat_names[k]);
            exec_raw(raw, sql);
        }
    snprintf(sql, sizeof sql, "ALTER TABLE steps DROP COLUMN %s", last);
    exec_raw(raw, sql);
    sqlite3_close(raw);

    expect_ok(kvs_results_open_readonly(t->db, &db));
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    expect_ok(kvs_results_query_runs(db, NULL, &rows, &n));
    assert_int_equal(n, 1);
    assert_true(isnan(rows[0].agg.m[KVS_N_METRICS - 1].mean));
    assert_true(rows[0].agg.out_err.mean == agg_expect(0.375, KVS_M_OUT_ERR, KVS_STAT_MEAN));
    kvs_results_run_rows_free(rows, n);
    kvs_results_close(db);

    expect_ok(kvs_results_open(t->db, &db));
    int64_t id = 0;
    expect_ok(write_simple_run(db, "/traces/a.kvt", "h2o", "", 32, 4, &id));
    kvs_results_close(db);
    raw = raw_open(t->db);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('run_summary')"),
                     1 + KVS_N_METRICS * KVS_N_STATS);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('steps')"), 4 + KVS_N_METRICS);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM run_summary WHERE %s_mean IS NOT NULL", last);
    assert_int_equal(query_i64(raw, sql), 1); /* the new run only */
    sqlite3_close(raw);
}

/* ------------------------------------------------------------------------------------------------
 * The read API: filters and column names
 * ---------------------------------------------------------------------------------------------- */

static int64_t put_filtered_run(kvs_results_db *db, const char *trace, const char *model, const char *policy,
                                int64_t budget, const char *measure, const char *status) {
    kvs_results_trace tr = make_trace(trace);
    tr.model_name = model;
    kvs_results_run run = make_run(policy, "", budget);
    run.measure = measure;
    run.status = status;
    int complete = !strcmp(status, "complete");
    if (!complete) run.error = "failed on purpose";
    kvs_results_agg layers[2] = {make_agg(0, 0.25), make_agg(1, 0.5)};
    kvs_results_agg all = make_agg(-1, 0.375);
    int64_t id = 0;
    expect_ok(kvs_results_write_run(db, &tr, &run, layers, complete ? 2 : 0, complete ? &all : NULL, NULL, 0, &id));
    return id;
}

static int64_t count_runs(kvs_results_db *db, kvs_results_filter f, int64_t *first_id) {
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    expect_ok(kvs_results_query_runs(db, &f, &rows, &n));
    if (first_id) *first_id = n ? rows[0].id : -1;
    for (int64_t i = 0; i < n; i++) assert_true(f.with_layers ? rows[i].n_layer_aggs >= 0 : !rows[i].layer_aggs);
    kvs_results_run_rows_free(rows, n);
    return n;
}

static void test_query_runs_filters(void **state) {
    tmp_ctx *t = *state;
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    int64_t r1 = put_filtered_run(db, "/data/a.kvt", "m1", "h2o", 32, "decode", "complete");
    int64_t r2 = put_filtered_run(db, "/data/a.kvt", "m1", "h2o", 64, "decode", "complete");
    int64_t r3 = put_filtered_run(db, "/other/b.kvt", "m2", "tova", 32, "all", "complete");
    int64_t r4 = put_filtered_run(db, "/data/a.kvt", "m1", "quest", 32, "decode", "failed");
    kvs_results_close(db);
    expect_ok(kvs_results_open_readonly(t->db, &db));
    int64_t first;
    assert_int_equal(count_runs(db, (kvs_results_filter){0}, &first), 3);
    assert_int_equal(first, r1);
    assert_int_equal(count_runs(db, (kvs_results_filter){.include_failed = 1}, NULL), 4);
    assert_int_equal(count_runs(db, (kvs_results_filter){.policy = "h2o"}, NULL), 2);
    assert_int_equal(count_runs(db, (kvs_results_filter){.budget_tokens = 32}, &first), 2);
    assert_int_equal(count_runs(db, (kvs_results_filter){.budget_tokens = 32, .include_failed = 1}, NULL), 3);
    assert_int_equal(count_runs(db, (kvs_results_filter){.trace_path = "/data/a.kvt"}, NULL), 2);
    assert_int_equal(count_runs(db, (kvs_results_filter){.trace_path = "a.kvt"}, NULL), 2);   /* trailing part */
    assert_int_equal(count_runs(db, (kvs_results_filter){.trace_path = "data/a.kvt"}, NULL), 2);
    assert_int_equal(count_runs(db, (kvs_results_filter){.trace_path = "kvt"}, NULL), 0);     /* whole components */
    assert_int_equal(count_runs(db, (kvs_results_filter){.trace_path = "/a.kvt"}, NULL), 0);
    assert_int_equal(count_runs(db, (kvs_results_filter){.model = "m2"}, &first), 1);
    assert_int_equal(first, r3);
    assert_int_equal(count_runs(db, (kvs_results_filter){.measure = "all"}, &first), 1);
    assert_int_equal(first, r3);
    assert_int_equal(count_runs(db, (kvs_results_filter){.measure = "prefill"}, NULL), 0);
    assert_int_equal(count_runs(db, (kvs_results_filter){.run_id = r2, .with_layers = 1}, &first), 1);
    assert_int_equal(first, r2);
    assert_int_equal(count_runs(db, (kvs_results_filter){.run_id = r4}, NULL), 0);
    assert_int_equal(count_runs(db, (kvs_results_filter){.run_id = r4, .include_failed = 1}, &first), 1);
    assert_int_equal(count_runs(db, (kvs_results_filter){.policy = "h2o", .budget_tokens = 64, .model = "m1"}, &first),
                     1);
    assert_int_equal(first, r2);
    kvs_results_close(db);
}

static void test_column_parse(void **state) {
    (void)state;
    kvs_metric m;
    kvs_stat_kind s;
    expect_ok(kvs_results_column_parse("out_err_p95", &m, &s));
    assert_true(m == KVS_M_OUT_ERR && s == KVS_STAT_P95);
    expect_ok(kvs_results_column_parse("storage_kv_bytes_mean", &m, &s));
    assert_true(m == KVS_M_STORAGE_KV && s == KVS_STAT_MEAN);
    expect_ok(kvs_results_column_parse("traffic_aux_unfused_bytes_max", &m, &s));
    assert_true(m == KVS_M_TRAFFIC_AUX_UNFUSED && s == KVS_STAT_MAX);
    expect_ok(kvs_results_column_parse("attended_tokens_n", &m, &s));
    assert_true(m == KVS_M_ATTENDED && s == KVS_STAT_N);
    /* Every column of the table parses back to its own metric and statistic. */
    for (int i = 0; i < KVS_N_METRICS; i++)
        for (int k = 0; k < KVS_N_STATS; k++) {
            char name[128];
            snprintf(name, sizeof name, "%s_%s", kvs_metric_table[i].name, kvs_stat_names[k]);
            expect_ok(kvs_results_column_parse(name, &m, &s));
            assert_true((int)m == i && (int)s == k);
        }
    const char *bad[] = {"out_err", "out_err_p99", "bogus_mean", "", "_mean", "out_err_mean_"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(kvs_results_column_parse(bad[i], &m, &s), KVS_ERR_INVALID_ARG);
        expect_msg("unknown metric column");
    }
    kvs_results_stat st = {.n = 0, .mean = 5};
    assert_true(isnan(kvs_results_stat_value(&st, KVS_STAT_MEAN)));
    assert_true(kvs_results_stat_value(&st, KVS_STAT_N) == 0);
    st.n = 2;
    assert_true(kvs_results_stat_value(&st, KVS_STAT_MEAN) == 5);
}

/* ------------------------------------------------------------------------------------------------
 * Statistics
 * ---------------------------------------------------------------------------------------------- */

static void test_stat_compute_nearest_rank_percentiles(void **state) {
    (void)state;
    kvs_results_stat s;
    const double five[5] = {5, 1, 4, 2, 3}; /* sorted 1..5: p50 index ceil(2.5)-1 = 2, p95 ceil(4.75)-1 = 4 */
    expect_ok(kvs_results_stat_compute(five, 5, &s));
    assert_int_equal(s.n, 5);
    assert_true(s.mean == 3.0 && s.p50 == 3.0 && s.p95 == 5.0 && s.min == 1.0 && s.max == 5.0);

    double twenty[20]; /* 20..1: p50 index 9 -> 10, p95 index ceil(19)-1 = 18 -> 19 (not 20) */
    for (int i = 0; i < 20; i++) twenty[i] = 20 - i;
    expect_ok(kvs_results_stat_compute(twenty, 20, &s));
    assert_true(s.mean == 10.5 && s.p50 == 10.0 && s.p95 == 19.0 && s.min == 1.0 && s.max == 20.0);

    double hundred[100]; /* p50 index 49 -> 0.5, p95 index 94 -> 0.95 (values i/100 for i = 1..100) */
    for (int i = 0; i < 100; i++) hundred[i] = (double)((i * 37) % 100 + 1) / 100.0;
    expect_ok(kvs_results_stat_compute(hundred, 100, &s));
    assert_true(s.p50 == 0.5 && s.p95 == 0.95 && s.min == 0.01 && s.max == 1.0);
    assert_true(fabs(s.mean - 0.505) < 1e-15);

    double twentyone[21]; /* p95 index ceil(19.95)-1 = 19 -> 20; p50 index 10 -> 11 */
    for (int i = 0; i < 21; i++) twentyone[i] = i + 1;
    expect_ok(kvs_results_stat_compute(twentyone, 21, &s));
    assert_true(s.p50 == 11.0 && s.p95 == 20.0);

    const double one = -2.5;
    expect_ok(kvs_results_stat_compute(&one, 1, &s));
    assert_true(s.n == 1 && s.mean == -2.5 && s.p50 == -2.5 && s.p95 == -2.5 && s.min == -2.5 && s.max == -2.5);

    s.mean = 9;
    expect_ok(kvs_results_stat_compute(NULL, 0, &s));
    assert_true(s.n == 0 && s.mean == 0 && s.p50 == 0 && s.p95 == 0 && s.min == 0 && s.max == 0);

    /* The input is not reordered (a sorted copy is made). */
    assert_true(five[0] == 5 && five[4] == 3);

    const double with_nan[3] = {1, NAN, 2};
    assert_int_equal(kvs_results_stat_compute(with_nan, 3, &s), KVS_ERR_INVALID_ARG);
    expect_msg("sample 1 of 3 is NaN");
    assert_int_equal(kvs_results_stat_compute(five, -1, &s), KVS_ERR_INVALID_ARG);
    expect_msg("negative sample count");
}

/* ------------------------------------------------------------------------------------------------
 * kvsim runs
 * ---------------------------------------------------------------------------------------------- */

static const char csv_header[] =
    "policy,params,budget_tokens,layer,out_err_mean,out_err_p95,out_err_max,attn_recall_mean,topk_overlap_mean,"
    "storage_bytes_max,traffic_bytes_per_step_mean";

static void test_runs_csv_header_and_quoting(void **state) {
    tmp_ctx *t = *state;
    if (!getenv("KVSIM_BIN")) skip(); /* only meaningful through the test runner, which sets it */
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    int64_t id1, id2, id3;
    expect_ok(write_simple_run(db, "/traces/a,b.kvt", "streaming", "sinks=4,window=60", 64, 8, &id1));
    kvs_results_trace tr = make_trace("/traces/a,b.kvt");
    kvs_results_run run = make_run("topk", "tag=\"x y\"", 128);
    run.is_oracle = 1;
    run.codec = "int:bits=4,group=32,k_axis=token,v_axis=channel"; /* the codec column, quoted (commas) */
    kvs_results_agg layer = make_agg(0, 0.25);
    kvs_results_agg all = make_agg(-1, 0.375);
    expect_ok(kvs_results_write_run(db, &tr, &run, &layer, 1, &all, NULL, 0, &id2));
    run = make_run("quest", "page=16", 32);
    run.status = "failed";
    run.error = "budget, too small";
    expect_ok(kvs_results_write_run(db, &tr, &run, NULL, 0, NULL, NULL, 0, &id3));
    kvs_results_close(db);
    assert_int_equal(id1, 1);
    assert_int_equal(id2, 2);
    assert_int_equal(id3, 3);

    char out[160], err[160];
    snprintf(out, sizeof out, "%s/out.csv", t->dir);
    snprintf(err, sizeof err, "%s/err.txt", t->dir);
    char *argv[] = {"kvsim", "runs", t->db, "--csv", NULL, NULL, NULL};
    assert_int_equal(run_cli(argv, out, err), 0);
    char *csv = kvs_test_slurp(out, NULL);
    /* Header: the fixed leading columns exactly, then run_id,trace,...,error, then the later run columns
     * budget_scope,layout,notes,codec,page,page_score, and every <metric>_<stat> of the metric table last: that block grows with
     * the metric table, so a run column added later goes before it, never after (a reader that takes the metrics
     * as the tail keeps working). */
    assert_memory_equal(csv, csv_header, strlen(csv_header));
    assert_true(!strncmp(csv + strlen(csv_header), ",run_id,trace,model,is_oracle,status,", 37));
    char want_tail[8192];
    size_t len = (size_t)snprintf(want_tail, sizeof want_tail, ",wall_seconds,kvsim_version,created_at,error,"
                                                               "budget_scope,layout,notes,codec,page,page_score");
    for (int m = 0; m < KVS_N_METRICS; m++)
        for (int k = 0; k < KVS_N_STATS; k++)
            len += (size_t)snprintf(want_tail + len, sizeof want_tail - len, ",%s_%s", kvs_metric_table[m].name,
                                    kvs_stat_names[k]);
    snprintf(want_tail + len, sizeof want_tail - len, "\n");
    char *nl = strchr(csv, '\n');
    assert_non_null(nl);
    assert_true((size_t)(nl + 1 - csv) > strlen(want_tail));
    assert_memory_equal(nl + 1 - strlen(want_tail), want_tail, strlen(want_tail));
    char *line = strchr(csv, '\n');
    assert_non_null(line);
    line++;
    /* layer 0 of run 1: base 0.25, metric m adds m/8 => out_err (0) mean .25 p95 .28125 max .296875;
     * attn_recall (3) mean .625; topk_overlap (5) mean .875; storage_bytes (7) max 1.125+3/64;
     * traffic_bytes (13) mean 1.875 */
    const char *row1 = "streaming,\"sinks=4,window=60\",64,0,0.25,0.28125,0.296875,0.625,0.875,1.171875,1.875,1,"
                       "\"/traces/a,b.kvt\",stories260K,0,complete,decode,,";
    const char *row2 = "streaming,\"sinks=4,window=60\",64,1,0.5,0.53125,0.546875,0.875,1.125,1.421875,2.125,1,";
    const char *row3 = "topk,\"tag=\"\"x y\"\"\",128,0,0.25,0.28125,0.296875,0.625,0.875,1.171875,1.875,2,";
    const char *rows[3] = {row1, row2, row3};
    for (int i = 0; i < 3; i++) {
        if (strncmp(line, rows[i], strlen(rows[i])) != 0) {
            fprintf(stderr, "row %d:\n got  %.*s\n want %s\n", i + 1, (int)strcspn(line, "\n"), line, rows[i]);
            fail();
        }
        line = strchr(line, '\n');
        assert_non_null(line);
        line++;
    }
    assert_string_equal(line, ""); /* the failed run is not listed without --all */
    /* Row 1 ends in every statistic of layer 0 (base 0.25) in table order. */
    char *row1_end = strchr(nl + 1, '\n');
    /* notes and codec empty, page 0 (token level), page_score empty (no pages) */
    char *p = strstr(nl + 1, ",every_step,per_kv_head,,,0,,");
    assert_non_null(p);
    assert_true(p < row1_end);
    p += strlen(",every_step,per_kv_head,,,0,");
    for (int m = 0; m < KVS_N_METRICS; m++)
        for (int k = 0; k < KVS_N_STATS; k++) {
            assert_int_equal(*p, ',');
            char *end = NULL;
            double v = strtod(p + 1, &end);
            if (v != agg_expect(0.25, m, k)) {
                fprintf(stderr, "csv %s_%s: %.17g\n", kvs_metric_table[m].name, kvs_stat_names[k], v);
                fail();
            }
            p = end;
        }
    assert_true(p == row1_end);
    /* the topk run's codec: its canonical spec after the notes, before the metrics */
    char *topk = strstr(csv, "\ntopk,");
    assert_non_null(topk);
    char *topk_codec = strstr(topk, ",every_step,per_kv_head,,\"int:bits=4,group=32,k_axis=token,v_axis=channel\",0,");
    assert_non_null(topk_codec);
    assert_true(topk_codec < strchr(topk + 1, '\n'));
    free(csv);

    argv[4] = "--all";
    assert_int_equal(run_cli(argv, out, err), 0);
    csv = kvs_test_slurp(out, NULL);
    const char *failed_row = "quest,page=16,32,,,,,,,,,3,\"/traces/a,b.kvt\",stories260K,0,failed,decode,";
    char *f = strstr(csv, "\nquest,");
    assert_non_null(f);
    assert_true(!strncmp(f + 1, failed_row, strlen(failed_row)));
    /* error is the last legacy column; budget_scope, layout, notes, codec, page, page_score follow, then the (empty)
     * metrics */
    char *e = strstr(f, ",\"budget, too small\",every_step,per_kv_head,,,0,,");
    assert_non_null(e);
    int n_fields = 0;
    for (char *c = e + strlen(",\"budget, too small\",every_step,per_kv_head,,,0,"); *c != '\n'; c++) n_fields += *c == ',';
    assert_int_equal(n_fields, KVS_N_METRICS * KVS_N_STATS);
    free(csv);

    argv[4] = "--policy";
    argv[5] = "topk";
    assert_int_equal(run_cli(argv, out, err), 0);
    csv = kvs_test_slurp(out, NULL);
    line = strchr(csv, '\n') + 1;
    assert_true(!strncmp(line, row3, strlen(row3)));
    assert_null(strchr(strchr(line, '\n') + 1, '\n'));
    free(csv);

    /* The readable table lists both complete runs, marks the oracle, and --run adds the per-layer rows. */
    char *argt[] = {"kvsim", "runs", t->db, "--run", "1", NULL};
    assert_int_equal(run_cli(argt, out, err), 0);
    char *table = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(table, "streaming"));
    assert_non_null(strstr(table, "sinks=4,window=60"));
    assert_non_null(strstr(table, "per layer"));
    free(table);
}

static void test_runs_bad_input_exit_codes(void **state) {
    tmp_ctx *t = *state;
    if (!getenv("KVSIM_BIN")) skip();
    char out[160], err[160], txt[160];
    snprintf(out, sizeof out, "%s/out", t->dir);
    snprintf(err, sizeof err, "%s/err", t->dir);
    snprintf(txt, sizeof txt, "%s/not.db", t->dir);
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    expect_ok(write_simple_run(db, "/traces/a.kvt", "h2o", "", 64, 4, NULL));
    kvs_results_close(db);

    char *no_db[] = {"kvsim", "runs", NULL};
    assert_int_equal(run_cli(no_db, out, err), 2);
    char *bad_opt[] = {"kvsim", "runs", t->db, "--bogus", NULL};
    assert_int_equal(run_cli(bad_opt, out, err), 2);
    char *bad_run[] = {"kvsim", "runs", t->db, "--run", "abc", NULL};
    assert_int_equal(run_cli(bad_run, out, err), 2);
    char *missing_val[] = {"kvsim", "runs", t->db, "--policy", NULL};
    assert_int_equal(run_cli(missing_val, out, err), 2);
    char *unknown_run[] = {"kvsim", "runs", t->db, "--run", "99", NULL};
    assert_int_equal(run_cli(unknown_run, out, err), 1);
    char *e = kvs_test_slurp(err, NULL);
    assert_non_null(strstr(e, "no complete run with id 99"));
    free(e);

    char missing[192];
    snprintf(missing, sizeof missing, "%s/missing.db", t->dir);
    char *no_file[] = {"kvsim", "runs", missing, NULL};
    assert_int_equal(run_cli(no_file, out, err), 1);
    struct stat sb;
    assert_int_equal(stat(missing, &sb), -1); /* `runs` never creates a database */

    const char text[] = "just some text that is not a database at all\n";
    write_file(txt, text, sizeof text - 1);
    char *not_db[] = {"kvsim", "runs", txt, NULL};
    assert_int_equal(run_cli(not_db, out, err), 1);
    e = kvs_test_slurp(err, NULL);
    assert_non_null(strstr(e, "not a kvsim results database"));
    free(e);
    assert_file_bytes(txt, text, sizeof text - 1);
}


/* The table flags prompt-only budgets and oracles; --json is one parseable object per run with every metric. */
static void test_runs_table_flags_and_json(void **state) {
    tmp_ctx *t = *state;
    if (!getenv("KVSIM_BIN")) skip();
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    kvs_results_trace tr = make_trace("/traces/deep/dir/story.kvt");
    kvs_results_agg layers[2] = {make_agg(0, 0.25), make_agg(1, 0.5)};
    kvs_results_agg all = make_agg(-1, 0.375);
    all.storage_bytes = (kvs_results_stat){.n = 10, .mean = 1536, .p50 = 1536, .p95 = 2048, .max = 3072, .min = 1024};
    all.out_cos = (kvs_results_stat){0}; /* not recorded */
    kvs_results_run run = make_run("snapkv", "window=8", 64);
    run.budget_scope = "prompt";
    run.layout = "per_query_head";
    run.notes = "window 8 keeps the whole prompt";
    expect_ok(kvs_results_write_run(db, &tr, &run, layers, 2, &all, NULL, 0, NULL));
    run = make_run("topk", "", 64);
    run.is_oracle = 1;
    expect_ok(kvs_results_write_run(db, &tr, &run, layers, 2, &all, NULL, 0, NULL));
    kvs_results_close(db);

    char out[160], err[160];
    snprintf(out, sizeof out, "%s/out.txt", t->dir);
    snprintf(err, sizeof err, "%s/err.txt", t->dir);
    char *argt[] = {"kvsim", "runs", t->db, NULL};
    assert_int_equal(run_cli(argt, out, err), 0);
    char *table = kvs_test_slurp(out, NULL);
    const char *heads[] = {"att_mean", "att_max", "res_mean", "res_max", "traffic/st", "err_mean", "err_p95", "recall",
                           "flags", "trace", "params"};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) assert_non_null(strstr(table, heads[i]));
    char *l1 = strstr(table, "\n    1 snapkv");
    assert_non_null(l1);
    assert_non_null(strstr(l1, " 1.50KiB ")); /* storage mean */
    assert_non_null(strstr(l1, " 3.00KiB ")); /* storage max */
    assert_non_null(strstr(l1, " PN ")); /* prompt-only, with a note */
    assert_non_null(strstr(l1, " story.kvt "));
    assert_non_null(strstr(l1, "note: window 8 keeps the whole prompt"));
    char *l2 = strstr(table, "\n    2 topk");
    assert_non_null(l2);
    assert_non_null(strstr(l2, " O "));
    assert_non_null(strstr(table, "budget bounds the prompt only; generated tokens are all kept"));
    assert_non_null(strstr(table, "O  oracle"));
    assert_non_null(strstr(table, "N  note: the configuration degenerates"));
    free(table);

    char *argj[] = {"kvsim", "runs", t->db, "--json", NULL};
    assert_int_equal(run_cli(argj, out, err), 0);
    char *text = kvs_test_slurp(out, NULL);
    kvs_json *root = NULL;
    expect_ok(kvs_json_parse(text, strlen(text), &root));
    assert_int_equal(kvs_json_type_of(root), KVS_JSON_ARRAY);
    assert_int_equal(kvs_json_len(root), 2);
    const kvs_json *r0 = kvs_json_at(root, 0);
    assert_string_equal(kvs_json_string(kvs_json_get(r0, "policy")), "snapkv");
    assert_string_equal(kvs_json_string(kvs_json_get(r0, "budget_scope")), "prompt");
    assert_string_equal(kvs_json_string(kvs_json_get(r0, "layout")), "per_query_head");
    assert_string_equal(kvs_json_string(kvs_json_get(r0, "notes")), "window 8 keeps the whole prompt");
    assert_int_equal(kvs_json_type_of(kvs_json_get(r0, "error")), KVS_JSON_NULL);
    assert_string_equal(kvs_json_string(kvs_json_get(kvs_json_get(r0, "trace"), "path")), "/traces/deep/dir/story.kvt");
    const kvs_json *metrics = kvs_json_get(r0, "metrics");
    assert_int_equal(kvs_json_len(metrics), KVS_N_METRICS);
    for (int m = 0; m < KVS_N_METRICS; m++) {
        const kvs_json *mo = kvs_json_get(metrics, kvs_metric_table[m].name);
        assert_non_null(mo);
        for (int k = 0; k < KVS_N_STATS; k++) {
            const kvs_json *v = kvs_json_get(mo, kvs_stat_names[k]);
            double want = kvs_results_stat_value(&all.m[m], (kvs_stat_kind)k);
            if (isnan(want)) assert_int_equal(kvs_json_type_of(v), KVS_JSON_NULL);
            else assert_true(kvs_json_number(v) == want);
        }
    }
    assert_null(kvs_json_get(r0, "layers")); /* per layer only with --run */
    assert_true(kvs_json_bool(kvs_json_get(kvs_json_at(root, 1), "is_oracle")));
    kvs_json_free(root);
    free(text);

    char *argr[] = {"kvsim", "runs", t->db, "--json", "--run", "2", NULL};
    assert_int_equal(run_cli(argr, out, err), 0);
    text = kvs_test_slurp(out, NULL);
    expect_ok(kvs_json_parse(text, strlen(text), &root));
    assert_int_equal(kvs_json_len(root), 1);
    const kvs_json *layers_j = kvs_json_get(kvs_json_at(root, 0), "layers");
    assert_int_equal(kvs_json_len(layers_j), 2);
    assert_true(kvs_json_number(kvs_json_get(kvs_json_get(kvs_json_get(kvs_json_at(layers_j, 1), "metrics"), "out_err"),
                                             "mean")) == 0.5);
    kvs_json_free(root);
    free(text);

    /* A full disk is a failure, not a silently truncated listing. */
    if (access("/dev/full", W_OK) == 0) {
        char *argc_[] = {"kvsim", "runs", t->db, "--csv", NULL};
        assert_int_equal(run_cli(argc_, "/dev/full", err), 1);
        char *e = kvs_test_slurp(err, NULL);
        assert_non_null(strstr(e, "writing the output failed"));
        free(e);
        assert_int_equal(run_cli(argj, "/dev/full", err), 1);
        assert_int_equal(run_cli(argt, "/dev/full", err), 1);
    }
    char *both[] = {"kvsim", "runs", t->db, "--csv", "--json", NULL};
    assert_int_equal(run_cli(both, out, err), 2);
    char *bad_measure[] = {"kvsim", "runs", t->db, "--measure", "sometimes", NULL};
    assert_int_equal(run_cli(bad_measure, out, err), 2);
    char *bad_budget[] = {"kvsim", "runs", t->db, "--budget", "0", NULL};
    assert_int_equal(run_cli(bad_budget, out, err), 2);
    char *filtered[] = {"kvsim", "runs", t->db, "--csv", "--policy", "topk", "--trace", "story.kvt", "--budget", "64",
                        "--measure", "decode", "--model", "stories260K", NULL};
    assert_int_equal(run_cli(filtered, out, err), 0);
    text = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(text, "\ntopk,,64,0,"));
    assert_null(strstr(text, "snapkv"));
    free(text);
}

/* ------------------------------------------------------------------------------------------------
 * Identity fields of a run as read back: options, trace_sha256, and their helpers
 * ---------------------------------------------------------------------------------------------- */

/* One trace replayed through two spellings of its path is two traces rows with one content hash; options reads
 * back as the replay wrote it; the label names model and hash; the bytes parse from options. The hash is
 * recomputed here from the file's bytes, the label and bytes from the strings by hand. */
static void test_query_runs_identity_fields(void **state) {
    tmp_ctx *t = *state;
    if (!getenv("KVSIM_BIN")) skip();
    char p1[PATH_MAX], p2[PATH_MAX], out[160], err[160];
    snprintf(p1, sizeof p1, "%s/examples/stories260K.kvt", kvs_test_root());
    snprintf(p2, sizeof p2, "%s/examples/../examples/stories260K.kvt", kvs_test_root());
    snprintf(out, sizeof out, "%s/out.txt", t->dir);
    snprintf(err, sizeof err, "%s/err.txt", t->dir);
    char *r1[] = {"kvsim", "replay", p1, "--db", t->db, "--policy", "window", "--budgets", "16", "--threads", "1", NULL};
    assert_int_equal(run_cli(r1, out, err), 0);
    char *r2[] = {"kvsim", "replay", p2, "--db", t->db, "--policy", "window", "--budgets", "16", "--threads", "1",
                  "--kv-bytes", "1", "--aux-bytes", "8", NULL};
    assert_int_equal(run_cli(r2, out, err), 0);

    char want_sha[65];
    expect_ok(kvs_sha256_file_hex(p1, want_sha));
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open_readonly(t->db, &db));
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    expect_ok(kvs_results_query_runs(db, NULL, &rows, &n));
    assert_int_equal(n, 2);
    assert_true(rows[0].trace_id != rows[1].trace_id); /* two path spellings: two traces rows */
    assert_string_equal(rows[0].trace_path, p1);
    assert_string_equal(rows[1].trace_path, p2);
    assert_non_null(rows[0].trace_sha256);
    assert_non_null(rows[1].trace_sha256);
    assert_string_equal(rows[0].trace_sha256, want_sha); /* one content: one hash */
    assert_string_equal(rows[1].trace_sha256, want_sha);
    assert_string_equal(rows[0].options, "kv_bytes=2,aux_bytes=4,series_every=0");
    assert_string_equal(rows[1].options, "kv_bytes=1,aux_bytes=8,series_every=0");
    int kv = -1, aux = -1;
    assert_int_equal(kvs_results_run_bytes(&rows[0], &kv, &aux), 1);
    assert_true(kv == 2 && aux == 4);
    assert_int_equal(kvs_results_run_bytes(&rows[1], &kv, &aux), 1);
    assert_true(kv == 1 && aux == 8);
    char label[64], want_label[64];
    snprintf(want_label, sizeof want_label, "%s@%.8s", rows[0].model, want_sha);
    assert_string_equal(rows[0].model, "stories260K");
    kvs_results_trace_label(&rows[0], label, sizeof label);
    assert_string_equal(label, want_label);
    kvs_results_trace_label(&rows[1], label, sizeof label); /* the same trace through the other spelling */
    assert_string_equal(label, want_label);
    kvs_results_run_rows_free(rows, n);
    kvs_results_close(db);
}

/* A database written without hashes or options (the write API alone, as older kvsim did): both read as NULL,
 * the label falls back to the path's base name, the bytes are "not recorded" with the outputs untouched. */
static void test_identity_fields_not_recorded(void **state) {
    tmp_ctx *t = *state;
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    expect_ok(write_simple_run(db, "/traces/deep/dir/story.kvt", "h2o", "", 64, 0, NULL));
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    expect_ok(kvs_results_query_runs(db, NULL, &rows, &n));
    assert_int_equal(n, 1);
    assert_null(rows[0].options);
    assert_null(rows[0].trace_sha256);
    char label[64];
    kvs_results_trace_label(&rows[0], label, sizeof label);
    assert_string_equal(label, "story.kvt");
    int kv = -7, aux = -9;
    assert_int_equal(kvs_results_run_bytes(&rows[0], &kv, &aux), 0);
    assert_true(kv == -7 && aux == -9);
    kvs_results_run_rows_free(rows, n);
    kvs_results_close(db);
}

static void test_trace_label_and_run_bytes(void **state) {
    (void)state;
    char sha[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    kvs_results_run_row r = {.trace_path = "/a/b/t.kvt", .model = "llama", .trace_sha256 = sha};
    char buf[32];
    kvs_results_trace_label(&r, buf, sizeof buf);
    assert_string_equal(buf, "llama@01234567");
    memset(buf, 'x', sizeof buf);
    kvs_results_trace_label(&r, buf, 5); /* truncated, terminated */
    assert_string_equal(buf, "llam");
    assert_int_equal(buf[5], 'x');
    buf[0] = 'x';
    kvs_results_trace_label(&r, buf, 0); /* no room: nothing written */
    assert_int_equal(buf[0], 'x');
    r.trace_sha256 = NULL;
    kvs_results_trace_label(&r, buf, sizeof buf);
    assert_string_equal(buf, "t.kvt");
    r.trace_path = "plain.kvt";
    kvs_results_trace_label(&r, buf, sizeof buf);
    assert_string_equal(buf, "plain.kvt");
    r.trace_path = NULL;
    kvs_results_trace_label(&r, buf, sizeof buf);
    assert_string_equal(buf, "?");

    static const struct {
        const char *options;
        int found, kv, aux;
    } cases[] = {
        {"kv_bytes=2,aux_bytes=4,series_every=0", 1, 2, 4},
        {"aux_bytes=4,kv_bytes=8", 1, 8, 4}, /* order does not matter */
        {"series_every=3,kv_bytes=16,aux_bytes=2", 1, 16, 2},
        {"kv_bytes=2", 0, 0, 0},              /* aux_bytes missing */
        {"aux_bytes=4", 0, 0, 0},             /* kv_bytes missing */
        {"", 0, 0, 0},
        {"garbage", 0, 0, 0},
        {"kv_bytes=abc,aux_bytes=4", 0, 0, 0},
        {"kv_bytes=2x,aux_bytes=4", 0, 0, 0},
        {"kv_bytes=,aux_bytes=4", 0, 0, 0},
        {"kv_bytes=-1,aux_bytes=4", 0, 0, 0},
        {"kv_bytes= 2,aux_bytes=4", 0, 0, 0},
        {"kv_bytes=99999999999,aux_bytes=4", 0, 0, 0}, /* beyond int */
        {"xkv_bytes=2,aux_bytes=4", 0, 0, 0},           /* a key ending in kv_bytes is another key */
        {"kv_bytes=2,aux_bytes=4,", 1, 2, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        r.options = (char *)cases[i].options;
        int kv = -7, aux = -9;
        int got = kvs_results_run_bytes(&r, &kv, &aux);
        if (got != cases[i].found || (got && (kv != cases[i].kv || aux != cases[i].aux)) ||
            (!got && (kv != -7 || aux != -9))) {
            fprintf(stderr, "run_bytes('%s') = %d (%d, %d)\n", cases[i].options, got, kv, aux);
            fail();
        }
    }
    r.options = NULL;
    int kv = -7, aux = -9;
    assert_int_equal(kvs_results_run_bytes(&r, &kv, &aux), 0);
    assert_true(kv == -7 && aux == -9);
}

/* A damaged page in a table `kvsim runs` reads (here run_layers, which the table view does not even list) is an
 * error saying "malformed", exit 1, in every output form, never a listing of the rows that could still be read;
 * the file is left as it was. */
static void test_runs_on_a_corrupt_database_fails(void **state) {
    tmp_ctx *t = *state;
    if (!getenv("KVSIM_BIN")) skip();
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    expect_ok(write_simple_run(db, "/traces/a.kvt", "h2o", "", 64, 4, NULL));
    expect_ok(write_simple_run(db, "/traces/a.kvt", "tova", "", 64, 4, NULL));
    kvs_results_close(db);
    sqlite3 *raw = raw_open(t->db);
    int64_t page = query_i64(raw, "SELECT rootpage FROM sqlite_master WHERE name = 'run_layers'");
    int64_t page_size = query_i64(raw, "PRAGMA page_size");
    sqlite3_close(raw);
    struct stat sb;
    assert_int_equal(stat(t->db, &sb), 0);
    assert_true(page >= 2 && page * page_size <= sb.st_size);
    char wal[160];
    snprintf(wal, sizeof wal, "%s-wal", t->db);
    assert_false(kvs_test_exists(wal)); /* all of it in the file */
    size_t n = 0;
    unsigned char *bytes = kvs_test_slurp(t->db, &n);
    assert_non_null(bytes);
    memset(bytes + (page - 1) * page_size, 0xA5, (size_t)page_size); /* not a b-tree page any more */
    write_file(t->db, bytes, n);

    char out[160], err[160];
    snprintf(out, sizeof out, "%s/out.txt", t->dir);
    snprintf(err, sizeof err, "%s/err.txt", t->dir);
    const char *forms[][3] = {{NULL}, {"--csv"}, {"--csv", "--summary"}, {"--json"}, {"--all"}};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        char *argv[8] = {"kvsim", "runs", t->db};
        int k = 3;
        for (int j = 0; j < 3 && forms[i][j]; j++) argv[k++] = (char *)forms[i][j];
        argv[k] = NULL;
        int rc = run_cli(argv, out, err);
        char *e = kvs_test_slurp(err, NULL);
        if (rc != 1 || !strstr(e, "malformed")) {
            fprintf(stderr, "runs %s: exit %d, stderr '%s'\n", forms[i][0] ? forms[i][0] : "", rc, e);
            fail();
        }
        free(e);
        assert_file_bytes(t->db, bytes, n);
    }
    free(bytes);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_open_creates_schema_and_reopen_is_idempotent, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_empty_file_is_initialised, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_write_run_reads_back_exact_values, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_failed_run_is_recorded_with_its_error, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_invalid_run_is_rejected_before_writing, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_write_failing_midway_leaves_db_unchanged, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_killed_writer_leaves_no_partial_run, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_two_processes_write_concurrently, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_not_a_kvsim_db_is_refused_and_left_unchanged, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_unwritable_paths_give_clear_errors, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_metric_without_samples_reads_as_not_recorded, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_v1_database_is_read_without_migration, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_v1_database_is_migrated_on_open_for_writing, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_migrated_database_reads_back_v1_values, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_migration_creates_the_turn_table, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_trace_turns_are_written_and_read, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_v2_database_without_turn_table, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_family_helpers, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_failed_migration_leaves_v1_database_unchanged, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_newer_schema_version_is_refused_unchanged, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_two_processes_migrate_at_once, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_v2_database_gains_appended_metric_columns, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_query_runs_filters, setup_tmp, teardown_tmp),
        cmocka_unit_test(test_column_parse),
        cmocka_unit_test_setup_teardown(test_query_runs_identity_fields, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_identity_fields_not_recorded, setup_tmp, teardown_tmp),
        cmocka_unit_test(test_trace_label_and_run_bytes),
        cmocka_unit_test(test_stat_compute_nearest_rank_percentiles),
        cmocka_unit_test_setup_teardown(test_runs_csv_header_and_quoting, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_runs_bad_input_exit_codes, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_runs_on_a_corrupt_database_fails, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_runs_table_flags_and_json, setup_tmp, teardown_tmp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
