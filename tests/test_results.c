/* test_results.c — tests of the SQLite results database (sim/results.h, schema in sim/SCHEMA.md) and of
 * `kvsim runs`: schema creation and idempotent reopen, exact read-back of a written run, atomicity (a
 * write failing midway, a writer killed with SIGKILL mid-transaction), two processes writing at once,
 * foreign/unwritable files left byte-identical, nearest-rank percentiles against hand-computed values,
 * and the exact CSV header and RFC 4180 quoting of `kvsim runs --csv` (run through KVSIM_BIN).
 */
#include <errno.h>
#include <fcntl.h>
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

#include "common/kvs.h"
#include "sim/results.h"

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

/* Every statistic distinct and exactly representable: base + metric/8 + stat/64. */
static kvs_results_agg make_agg(int32_t layer, double base) {
    kvs_results_agg a = {.layer = layer};
    kvs_results_stat *m[7] = {&a.out_err,       &a.attn_recall,    &a.topk_overlap,     &a.storage_bytes,
                              &a.traffic_bytes, &a.transfer_bytes, &a.compression_ratio};
    for (int i = 0; i < 7; i++) {
        double b = base + i / 8.0;
        *m[i] = (kvs_results_stat){.n = 100 + i, .mean = b, .p50 = b + 1 / 64.0, .p95 = b + 2 / 64.0,
                                   .max = b + 3 / 64.0, .min = b + 4 / 64.0};
    }
    return a;
}

static kvs_results_run make_run(const char *policy, const char *params, int64_t budget) {
    kvs_results_run r = {.policy = policy, .params = params, .budget_tokens = budget, .budget_fraction = -1,
                         .is_oracle = 0, .measure = "decode", .status = "complete", .error = NULL,
                         .wall_seconds = 0.5, .kvsim_version = "0.1.0"};
    return r;
}

/* n steps over 2 layers x 2 q heads, positions from 32. */
static kvs_results_step *make_steps(int64_t n) {
    kvs_results_step *s = calloc((size_t)n, sizeof *s);
    assert_non_null(s);
    for (int64_t i = 0; i < n; i++) {
        s[i].layer = (int32_t)(i % 2);
        s[i].q_head = (int32_t)((i / 2) % 2);
        s[i].position = 32 + i / 4;
        s[i].out_err = (float)(i % 7) / 8.0f;
        s[i].attn_recall = 1.0f - (float)(i % 5) / 16.0f;
        s[i].topk_overlap = 0.75f;
        s[i].attended_tokens = 16;
        s[i].storage_bytes = 4096.0 + (double)i;
        s[i].traffic_bytes = 2048.0;
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
    int64_t meta, traces, runs, run_layers, run_summary, steps;
} counts;

static counts table_counts(const char *path) {
    sqlite3 *db = raw_open(path);
    counts c = {query_i64(db, "SELECT count(*) FROM meta"),        query_i64(db, "SELECT count(*) FROM traces"),
                query_i64(db, "SELECT count(*) FROM runs"),        query_i64(db, "SELECT count(*) FROM run_layers"),
                query_i64(db, "SELECT count(*) FROM run_summary"), query_i64(db, "SELECT count(*) FROM steps")};
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
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len - 1 == 0) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

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
    assert_string_equal(buf, "1");
    query_text(raw, "PRAGMA journal_mode", buf, sizeof buf);
    assert_string_equal(buf, "wal");
    const char *tables[] = {"meta", "traces", "runs", "run_layers", "run_summary", "steps"};
    for (size_t i = 0; i < 6; i++) {
        char sql[128];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '%s'", tables[i]);
        assert_int_equal(query_i64(raw, sql), 1);
    }
    /* Every metric has its six statistics in both aggregate tables. */
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('run_layers')"), 2 + 7 * 6);
    assert_int_equal(query_i64(raw, "SELECT count(*) FROM pragma_table_info('run_summary')"), 1 + 7 * 6);
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
    run.measure = "all";
    run.wall_seconds = 1.75;
    kvs_results_agg layers[2] = {make_agg(0, 0.25), make_agg(1, 0.5)};
    kvs_results_agg all = make_agg(-1, 0.375);
    kvs_results_step *steps = make_steps(12);
    int64_t id1 = 0, id2 = 0;
    expect_ok(kvs_results_write_run(db, &tr, &run, layers, 2, &all, steps, 12, &id1));
    assert_true(id1 > 0);
    /* Same trace again: one traces row, a second run. */
    run.budget_fraction = -1;
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
                                        "r.wall_seconds, r.kvsim_version, r.created_at "
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
    assert_string_equal(sqlite3_column_text(st, 16), "all");
    assert_string_equal(sqlite3_column_text(st, 17), "complete");
    assert_int_equal(sqlite3_column_type(st, 18), SQLITE_NULL);
    assert_true(sqlite3_column_double(st, 19) == 1.75);
    assert_string_equal(sqlite3_column_text(st, 20), "0.1.0");
    const char *created = (const char *)sqlite3_column_text(st, 21);
    /* UTC ISO 8601 with milliseconds: 2024-01-02T03:04:05.678Z */
    assert_int_equal(strlen(created), 24);
    assert_true(created[4] == '-' && created[10] == 'T' && created[19] == '.' && created[23] == 'Z');
    sqlite3_finalize(st);
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT budget_fraction IS NULL FROM runs WHERE id = %lld", (long long)id2);
    assert_int_equal(query_i64(raw, sql), 1); /* -1 = "no fraction given" is stored as NULL */

    /* Aggregates: every statistic of every metric, exactly. */
    const char *metrics[7] = {"out_err",       "attn_recall",    "topk_overlap",     "storage_bytes",
                              "traffic_bytes", "transfer_bytes", "compression_ratio"};
    for (int table = 0; table < 2; table++)
        for (int li = 0; li < (table ? 1 : 2); li++) {
            double base = table ? 0.375 : (li ? 0.5 : 0.25);
            for (int m = 0; m < 7; m++) {
                snprintf(sql, sizeof sql,
                         "SELECT %s_n, %s_mean, %s_p50, %s_p95, %s_max, %s_min FROM %s WHERE run_id = %lld%s%d",
                         metrics[m], metrics[m], metrics[m], metrics[m], metrics[m], metrics[m],
                         table ? "run_summary" : "run_layers", (long long)id1, table ? " AND -1 = " : " AND layer = ",
                         table ? -1 : li);
                assert_int_equal(sqlite3_prepare_v2(raw, sql, -1, &st, NULL), SQLITE_OK);
                assert_int_equal(sqlite3_step(st), SQLITE_ROW);
                double b = base + m / 8.0;
                assert_int_equal(sqlite3_column_int64(st, 0), 100 + m);
                assert_true(sqlite3_column_double(st, 1) == b);
                assert_true(sqlite3_column_double(st, 2) == b + 1 / 64.0);
                assert_true(sqlite3_column_double(st, 3) == b + 2 / 64.0);
                assert_true(sqlite3_column_double(st, 4) == b + 3 / 64.0);
                assert_true(sqlite3_column_double(st, 5) == b + 4 / 64.0);
                assert_int_equal(sqlite3_step(st), SQLITE_DONE);
                sqlite3_finalize(st);
            }
        }

    /* Steps: every field of every sample. */
    snprintf(sql, sizeof sql,
             "SELECT layer, q_head, position, out_err, attn_recall, topk_overlap, attended_tokens, storage_bytes, "
             "traffic_bytes FROM steps WHERE run_id = %lld ORDER BY position, q_head, layer",
             (long long)id1);
    assert_int_equal(sqlite3_prepare_v2(raw, sql, -1, &st, NULL), SQLITE_OK);
    for (int64_t i = 0; i < 12; i++) {
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        assert_int_equal(sqlite3_column_int(st, 0), steps[i].layer);
        assert_int_equal(sqlite3_column_int(st, 1), steps[i].q_head);
        assert_int_equal(sqlite3_column_int64(st, 2), steps[i].position);
        assert_true((float)sqlite3_column_double(st, 3) == steps[i].out_err);
        assert_true((float)sqlite3_column_double(st, 4) == steps[i].attn_recall);
        assert_true((float)sqlite3_column_double(st, 5) == steps[i].topk_overlap);
        assert_int_equal(sqlite3_column_int(st, 6), 16);
        assert_true(sqlite3_column_double(st, 7) == steps[i].storage_bytes);
        assert_true(sqlite3_column_double(st, 8) == 2048.0);
    }
    assert_int_equal(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    sqlite3_close(raw);
    free(steps);
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
    run.measure = "prefill";
    assert_int_equal(kvs_results_write_run(db, &tr, &run, NULL, 0, &all, NULL, 0, NULL), KVS_ERR_INVALID_ARG);
    expect_msg("measure 'prefill'");
    run.measure = "decode";
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
    char *csv = slurp(out);
    /* Header: the fixed leading columns exactly, then run_id,trace,... */
    assert_memory_equal(csv, csv_header, strlen(csv_header));
    assert_true(!strncmp(csv + strlen(csv_header), ",run_id,trace,model,is_oracle,status,", 37));
    char *line = strchr(csv, '\n');
    assert_non_null(line);
    line++;
    /* layer 0 of run 1: base 0.25 => out_err mean .25 p95 .28125 max .296875; recall mean .375;
     * topk mean .5; storage max .625+3/64; traffic mean .75 */
    const char *row1 = "streaming,\"sinks=4,window=60\",64,0,0.25,0.28125,0.296875,0.375,0.5,0.671875,0.75,1,"
                       "\"/traces/a,b.kvt\",stories260K,0,complete,decode,,";
    const char *row2 = "streaming,\"sinks=4,window=60\",64,1,0.5,0.53125,0.546875,0.625,0.75,0.921875,1,1,";
    const char *row3 = "topk,\"tag=\"\"x y\"\"\",128,0,0.25,0.28125,0.296875,0.375,0.5,0.671875,0.75,2,";
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
    free(csv);

    argv[4] = "--all";
    assert_int_equal(run_cli(argv, out, err), 0);
    csv = slurp(out);
    const char *failed_row = "quest,page=16,32,,,,,,,,,3,\"/traces/a,b.kvt\",stories260K,0,failed,decode,";
    char *f = strstr(csv, "\nquest,");
    assert_non_null(f);
    assert_true(!strncmp(f + 1, failed_row, strlen(failed_row)));
    assert_non_null(strstr(f, ",\"budget, too small\"\n"));
    free(csv);

    argv[4] = "--policy";
    argv[5] = "topk";
    assert_int_equal(run_cli(argv, out, err), 0);
    csv = slurp(out);
    line = strchr(csv, '\n') + 1;
    assert_true(!strncmp(line, row3, strlen(row3)));
    assert_null(strchr(strchr(line, '\n') + 1, '\n'));
    free(csv);

    /* The readable table lists both complete runs, marks the oracle, and --run adds the per-layer rows. */
    char *argt[] = {"kvsim", "runs", t->db, "--run", "1", NULL};
    assert_int_equal(run_cli(argt, out, err), 0);
    char *table = slurp(out);
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
    char *e = slurp(err);
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
    e = slurp(err);
    assert_non_null(strstr(e, "not a kvsim results database"));
    free(e);
    assert_file_bytes(txt, text, sizeof text - 1);
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
        cmocka_unit_test(test_stat_compute_nearest_rank_percentiles),
        cmocka_unit_test_setup_teardown(test_runs_csv_header_and_quoting, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_runs_bad_input_exit_codes, setup_tmp, teardown_tmp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
