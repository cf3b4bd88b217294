/* results.c — the SQLite results database of kvsim: schema creation, the one-transaction run writer and
 * the summary statistics of a metric. Implements sim/results.h; the schema (tables, columns, units) is
 * documented in sim/SCHEMA.md and the metrics in ../shared/DESIGN.md ("Metrics", "Results (SQLite)").
 *
 * Safety rules this file keeps:
 *  - A file that is not a kvsim results database is never modified: before SQLite touches it we check
 *    its 16-byte SQLite header ourselves, then (read-only queries only) that it holds a `meta` table with
 *    creator 'kvsim' — or no schema at all (an empty SQLite file, which is also what a concurrent
 *    creator's file looks like before its schema transaction commits). Only then do we switch it to WAL.
 *  - A run is written by one BEGIN IMMEDIATE ... COMMIT transaction; any failure rolls it back, so
 *    readers (and a process killed mid-write) never see a half-written run.
 *  - Several processes may write at once: WAL journal plus a 30 s busy timeout.
 */
#include "results.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KVS_RESULTS_SCHEMA_VERSION 1

/* The named members of the unions in results.h must alias the metric array entry by entry. */
_Static_assert(offsetof(kvs_results_agg, compression_ratio) ==
                   offsetof(kvs_results_agg, m) + KVS_M_COMPRESSION * sizeof(kvs_results_stat),
               "kvs_results_agg members out of step with KVS_METRIC_LIST");
_Static_assert(offsetof(kvs_results_step, compression_ratio) ==
                   offsetof(kvs_results_step, v) + KVS_M_COMPRESSION * sizeof(double),
               "kvs_results_step members out of step with KVS_METRIC_LIST");
#define KVS_RESULTS_BUSY_TIMEOUT_MS 30000

struct kvs_results_db {
    sqlite3 *db;
    char *path; /* owned copy, for error messages */
};

/* ------------------------------------------------------------------------------------------------
 * Schema (keep in sync with sim/SCHEMA.md)
 * ---------------------------------------------------------------------------------------------- */

/* The seven aggregated metrics, in the order of kvs_results_agg's fields; each becomes six columns
 * <metric>_n, _mean, _p50, _p95, _max, _min in run_layers and run_summary. */
static const char *const agg_metrics[] = {"out_err",        "attn_recall",    "topk_overlap",     "storage_bytes",
                                          "traffic_bytes",  "transfer_bytes", "compression_ratio"};
#define N_AGG_METRICS 7
static const char *const agg_stats[] = {"n", "mean", "p50", "p95", "max", "min"};
#define N_AGG_STATS 6

static const char schema_fixed_sql[] =
    "CREATE TABLE IF NOT EXISTS meta (\n"
    "  key TEXT PRIMARY KEY,\n"
    "  value TEXT NOT NULL\n"
    ");\n"
    "CREATE TABLE IF NOT EXISTS traces (\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  path TEXT NOT NULL,\n"
    "  model TEXT NOT NULL,\n"
    "  n_positions INTEGER NOT NULL,\n"
    "  prompt_len INTEGER NOT NULL,\n"
    "  n_turns INTEGER NOT NULL,\n"
    "  n_layers INTEGER NOT NULL,\n"
    "  n_heads INTEGER NOT NULL,\n"
    "  n_kv_heads INTEGER NOT NULL,\n"
    "  head_dim INTEGER NOT NULL,\n"
    "  dtype TEXT NOT NULL,\n"
    "  file_bytes INTEGER NOT NULL,\n"
    "  UNIQUE (path, model, n_positions, prompt_len, n_turns, n_layers, n_heads, n_kv_heads, head_dim, dtype,\n"
    "          file_bytes)\n"
    ");\n"
    "CREATE TABLE IF NOT EXISTS runs (\n"
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,\n"
    "  trace_id INTEGER NOT NULL REFERENCES traces(id),\n"
    "  policy TEXT NOT NULL,\n"
    "  params TEXT NOT NULL,\n"
    "  budget_tokens INTEGER NOT NULL,\n"
    "  budget_fraction REAL,\n"
    "  is_oracle INTEGER NOT NULL CHECK (is_oracle IN (0, 1)),\n"
    "  measure TEXT NOT NULL CHECK (measure IN ('decode', 'all')),\n"
    "  status TEXT NOT NULL CHECK (status IN ('complete', 'failed')),\n"
    "  error TEXT,\n"
    "  wall_seconds REAL,\n"
    "  kvsim_version TEXT NOT NULL,\n"
    "  created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))\n"
    ");\n"
    "CREATE INDEX IF NOT EXISTS runs_policy ON runs (policy, params, budget_tokens);\n"
    "CREATE INDEX IF NOT EXISTS runs_trace ON runs (trace_id);\n"
    "CREATE TABLE IF NOT EXISTS steps (\n"
    "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
    "  layer INTEGER NOT NULL,\n"
    "  q_head INTEGER NOT NULL,\n"
    "  position INTEGER NOT NULL,\n"
    "  out_err REAL,\n"
    "  attn_recall REAL,\n"
    "  topk_overlap REAL,\n"
    "  attended_tokens INTEGER NOT NULL,\n"
    "  storage_bytes REAL,\n"
    "  traffic_bytes REAL,\n"
    "  PRIMARY KEY (run_id, layer, q_head, position)\n"
    ") WITHOUT ROWID;\n";

/* Appends the 42 "<metric>_<stat> <type>" column definitions of an aggregate table to buf. */
static void append_agg_columns(char *buf, size_t cap) {
    for (int m = 0; m < N_AGG_METRICS; m++)
        for (int s = 0; s < N_AGG_STATS; s++) {
            size_t len = strlen(buf);
            snprintf(buf + len, cap - len, ",\n  %s_%s %s", agg_metrics[m], agg_stats[s],
                     s == 0 ? "INTEGER NOT NULL" : "REAL");
        }
}

/* ------------------------------------------------------------------------------------------------
 * Small SQLite helpers
 * ---------------------------------------------------------------------------------------------- */

static kvs_status db_fail(sqlite3 *db, const char *path, const char *what) {
    return kvs_fail(KVS_ERR_DB, "%s: %s: %s", path, what, db ? sqlite3_errmsg(db) : "out of memory");
}

static kvs_status exec_sql(kvs_results_db *r, const char *sql, const char *what) {
    char *msg = NULL;
    if (sqlite3_exec(r->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        kvs_status st = kvs_fail(KVS_ERR_DB, "%s: %s: %s", r->path, what, msg ? msg : sqlite3_errmsg(r->db));
        sqlite3_free(msg);
        return st;
    }
    return KVS_OK;
}

/* Checks the first 16 bytes of an existing, non-empty file for the SQLite header string, so a foreign
 * file is rejected before SQLite opens (and possibly journals) it. */
static kvs_status check_sqlite_header(const char *path) {
    static const char magic[16] = "SQLite format 3";
    char hdr[16];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kvs_fail(KVS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    ssize_t n = read(fd, hdr, sizeof hdr);
    close(fd);
    if (n != (ssize_t)sizeof hdr || memcmp(hdr, magic, sizeof magic) != 0)
        return kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (not an SQLite file); left unchanged", path);
    return KVS_OK;
}

/* Read-only check that an opened existing database is a kvsim one (or has no schema yet). */
static kvs_status check_kvsim_schema(kvs_results_db *r, int *is_empty) {
    sqlite3_stmt *st = NULL;
    kvs_status rc = KVS_OK;
    *is_empty = 0;
    if (sqlite3_prepare_v2(r->db, "SELECT count(*), sum(type = 'table' AND name = 'meta') FROM sqlite_master", -1,
                           &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        rc = kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (unreadable: %s); left unchanged", r->path,
                      sqlite3_errmsg(r->db));
        goto cleanup;
    }
    int64_t n_objects = sqlite3_column_int64(st, 0), has_meta = sqlite3_column_int64(st, 1);
    sqlite3_finalize(st);
    st = NULL;
    if (n_objects == 0) {
        *is_empty = 1;
        return KVS_OK;
    }
    if (!has_meta) {
        rc = kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (SQLite file without a kvsim meta table); "
                                  "left unchanged",
                      r->path);
        goto cleanup;
    }
    if (sqlite3_prepare_v2(r->db,
                           "SELECT (SELECT value FROM meta WHERE key = 'creator'),"
                           "       (SELECT value FROM meta WHERE key = 'schema_version')",
                           -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        rc = kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (meta table unreadable: %s); left unchanged",
                      r->path, sqlite3_errmsg(r->db));
        goto cleanup;
    }
    const char *creator = (const char *)sqlite3_column_text(st, 0);
    if (!creator || strcmp(creator, "kvsim") != 0) {
        rc = kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (meta creator is '%s', expected 'kvsim'); "
                                  "left unchanged",
                      r->path, creator ? creator : "(none)");
        goto cleanup;
    }
    int64_t version = sqlite3_column_int64(st, 1);
    if (version != KVS_RESULTS_SCHEMA_VERSION) {
        rc = kvs_fail(KVS_ERR_VERSION, "%s: results schema version %" PRId64 " is not supported (this kvsim writes %d)",
                      r->path, version, KVS_RESULTS_SCHEMA_VERSION);
        goto cleanup;
    }
cleanup:
    sqlite3_finalize(st);
    return rc;
}

/* Switches the database to WAL (a no-op when it already is). The switch needs an exclusive lock and, when
 * two processes create one database at once, SQLite reports SQLITE_BUSY without calling the busy handler,
 * so it is retried here for up to the busy timeout. journal_mode returns the mode in force: anything but
 * "wal" means concurrent writers would not work. */
static kvs_status switch_to_wal(kvs_results_db *r) {
    char mode[16] = "";
    int rc = SQLITE_OK;
    for (int attempt = 0; attempt < KVS_RESULTS_BUSY_TIMEOUT_MS / 5; attempt++) {
        sqlite3_stmt *st = NULL;
        rc = sqlite3_prepare_v2(r->db, "PRAGMA journal_mode = WAL", -1, &st, NULL);
        if (rc == SQLITE_OK) rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            const char *m = (const char *)sqlite3_column_text(st, 0);
            snprintf(mode, sizeof mode, "%s", m ? m : "?");
        }
        sqlite3_finalize(st);
        if (rc == SQLITE_ROW && !strcmp(mode, "wal")) return KVS_OK;
        if (rc == SQLITE_ROW || ((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED)) break;
        struct timespec pause = {0, 5 * 1000000};
        nanosleep(&pause, NULL);
    }
    if (rc == SQLITE_ROW)
        return kvs_fail(KVS_ERR_DB, "%s: cannot switch to WAL journal (mode stays '%s')", r->path, mode);
    return kvs_fail(KVS_ERR_DB, "%s: cannot switch to WAL journal: %s", r->path, sqlite3_errmsg(r->db));
}

/* Directory part of path, for the writability check (WAL needs to create PATH-wal and PATH-shm there). */
static void dir_of(const char *path, char *dir, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, cap, ".");
    else if (slash == path) snprintf(dir, cap, "/");
    else snprintf(dir, cap, "%.*s", (int)(slash - path), path);
}

/* ------------------------------------------------------------------------------------------------
 * Open / close
 * ---------------------------------------------------------------------------------------------- */

kvs_status kvs_results_open(const char *path, kvs_results_db **out) {
    if (!path || !path[0] || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "results db: empty path");
    *out = NULL;
    kvs_status rc = KVS_OK;
    kvs_results_db *r = calloc(1, sizeof *r);
    char dir[PATH_MAX];
    if (!r || !(r->path = strdup(path))) {
        free(r);
        return kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", path);
    }

    struct stat sb;
    int exists = stat(path, &sb) == 0;
    if (!exists && errno != ENOENT) {
        rc = kvs_fail(KVS_ERR_IO, "%s: cannot use as results database: %s", path, strerror(errno));
        goto cleanup;
    }
    dir_of(path, dir, sizeof dir);
    if (exists) {
        if (!S_ISREG(sb.st_mode)) {
            rc = kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (not a regular file)", path);
            goto cleanup;
        }
        if (sb.st_size > 0) KVS_TRY(rc = check_sqlite_header(path));
        if (access(path, R_OK | W_OK) != 0) {
            rc = kvs_fail(KVS_ERR_IO, "%s: results database is not writable: %s", path, strerror(errno));
            goto cleanup;
        }
    }
    if (access(dir, W_OK | X_OK) != 0) {
        rc = kvs_fail(KVS_ERR_IO, "%s: directory '%s' is not writable (the database and its -wal/-shm files live "
                                  "there): %s",
                      path, dir, strerror(errno));
        goto cleanup;
    }

    if (!exists) {
        /* Create the file ourselves: SQLite opens lazily and would report a failure later as a vague
         * "unable to open database file". O_EXCL losing to a concurrent creator is fine. */
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) {
            rc = kvs_fail(KVS_ERR_IO, "%s: cannot create results database: %s", path, strerror(errno));
            goto cleanup;
        }
        if (fd >= 0) close(fd);
    }
    if (sqlite3_open_v2(path, &r->db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
        rc = kvs_fail(KVS_ERR_DB, "%s: cannot open results database: %s", path,
                      r->db ? sqlite3_errmsg(r->db) : "out of memory");
        goto cleanup;
    }
    sqlite3_extended_result_codes(r->db, 1);
    sqlite3_busy_timeout(r->db, KVS_RESULTS_BUSY_TIMEOUT_MS);

    /* Identify before changing anything: an existing foreign or corrupt database must stay byte-identical. */
    int is_empty = 1;
    if (exists && sb.st_size > 0) KVS_TRY(rc = check_kvsim_schema(r, &is_empty));

    KVS_TRY(rc = switch_to_wal(r));
    KVS_TRY(rc = exec_sql(r, "PRAGMA foreign_keys = ON", "cannot enable foreign keys"));

    /* Schema: idempotent, in one transaction so a concurrent opener sees all of it or none of it. */
    char schema[8192];
    snprintf(schema, sizeof schema, "%s", schema_fixed_sql);
    static const char *const agg_tables[2][2] = {
        {"run_layers", "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
                       "  layer INTEGER NOT NULL CHECK (layer >= 0)"},
        {"run_summary", "  run_id INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE"}};
    for (int t = 0; t < 2; t++) {
        size_t len = strlen(schema);
        snprintf(schema + len, sizeof schema - len, "CREATE TABLE IF NOT EXISTS %s (\n%s", agg_tables[t][0],
                 agg_tables[t][1]);
        append_agg_columns(schema, sizeof schema);
        len = strlen(schema);
        snprintf(schema + len, sizeof schema - len, "%s\n);\n", t == 0 ? ",\n  PRIMARY KEY (run_id, layer)" : "");
    }
    size_t len = strlen(schema);
    snprintf(schema + len, sizeof schema - len,
             "INSERT OR IGNORE INTO meta (key, value) VALUES ('creator', 'kvsim');\n"
             "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '%d');\n"
             "INSERT OR IGNORE INTO meta (key, value) VALUES ('created_at', strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', "
             "'now'));\n",
             KVS_RESULTS_SCHEMA_VERSION);
    KVS_ASSERT(strlen(schema) < sizeof schema - 1);
    KVS_TRY(rc = exec_sql(r, "BEGIN IMMEDIATE", "cannot start the schema transaction"));
    if ((rc = exec_sql(r, schema, "cannot create the schema")) != KVS_OK) {
        sqlite3_exec(r->db, "ROLLBACK", NULL, NULL, NULL);
        goto cleanup;
    }
    if ((rc = exec_sql(r, "COMMIT", "cannot commit the schema")) != KVS_OK) {
        sqlite3_exec(r->db, "ROLLBACK", NULL, NULL, NULL);
        goto cleanup;
    }
    /* A concurrent creator may have won the race with different content: re-check what is there now. */
    KVS_TRY(rc = check_kvsim_schema(r, &is_empty));
    *out = r;
    return KVS_OK;

cleanup:
    kvs_results_close(r);
    return rc;
}

void kvs_results_close(kvs_results_db *r) {
    if (!r) return;
    if (r->db) sqlite3_close_v2(r->db);
    free(r->path);
    free(r);
}

/* ------------------------------------------------------------------------------------------------
 * Statistics
 * ---------------------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

kvs_status kvs_results_stat_compute(const double *samples, int64_t n, kvs_results_stat *out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "stat_compute: NULL output");
    memset(out, 0, sizeof *out);
    if (n < 0) return kvs_fail(KVS_ERR_INVALID_ARG, "stat_compute: negative sample count %" PRId64, n);
    if (n == 0) return KVS_OK;
    if (!samples) return kvs_fail(KVS_ERR_INVALID_ARG, "stat_compute: NULL samples for n = %" PRId64, n);
    if ((uint64_t)n > SIZE_MAX / sizeof(double))
        return kvs_fail(KVS_ERR_NOMEM, "stat_compute: %" PRId64 " samples do not fit in memory", n);
    /* NaN has no rank: sorting it would silently corrupt every percentile, so it is refused. */
    for (int64_t i = 0; i < n; i++)
        if (isnan(samples[i]))
            return kvs_fail(KVS_ERR_INVALID_ARG, "stat_compute: sample %" PRId64 " of %" PRId64 " is NaN", i, n);
    double *sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted) return kvs_fail(KVS_ERR_NOMEM, "stat_compute: out of memory for %" PRId64 " samples", n);
    memcpy(sorted, samples, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_double);
    /* Kahan-compensated sum: runs aggregate up to millions of samples of very different magnitude. */
    double sum = 0.0, comp = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double y = sorted[i] - comp, t = sum + y;
        comp = (t - sum) - y;
        sum = t;
    }
    out->n = n;
    out->mean = sum / (double)n;
    out->min = sorted[0];
    out->max = sorted[n - 1];
    /* Nearest rank, index ceil(p*n)-1, in integer arithmetic so 0.95*20 cannot round up to 20. */
    out->p50 = sorted[(n + 1) / 2 - 1];
    out->p95 = sorted[(95 * n + 99) / 100 - 1];
    free(sorted);
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Writing a run
 * ---------------------------------------------------------------------------------------------- */

static kvs_status validate_run(const char *path, const kvs_results_trace *trace, const kvs_results_run *run,
                               const kvs_results_agg *layer_aggs, int32_t n_layers, const kvs_results_agg *run_agg,
                               const kvs_results_step *steps, int64_t n_steps) {
    if (!trace || !run) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: NULL trace or run", path);
    if (!trace->path || !trace->dtype)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: trace path and dtype are required", path);
    if (!run->policy || !run->policy[0] || !run->params || !run->kvsim_version)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: policy, params and kvsim_version are required", path);
    if (!run->measure || (strcmp(run->measure, "decode") && strcmp(run->measure, "all")))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: measure '%s' is not 'decode' or 'all'", path,
                        run->measure ? run->measure : "(null)");
    if (!run->status || (strcmp(run->status, "complete") && strcmp(run->status, "failed")))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: status '%s' is not 'complete' or 'failed'", path,
                        run->status ? run->status : "(null)");
    if (!strcmp(run->status, "complete") && !run_agg)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: a complete run needs its run-wide aggregate", path);
    if (run->is_oracle != 0 && run->is_oracle != 1)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: is_oracle %d is not 0 or 1", path, run->is_oracle);
    if (n_layers < 0 || (n_layers > 0 && !layer_aggs))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: bad layer aggregates (n_layers = %d)", path, n_layers);
    if (n_steps < 0 || (n_steps > 0 && !steps))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: bad steps (n_steps = %" PRId64 ")", path, n_steps);
    for (int32_t i = 0; i < n_layers; i++)
        if (layer_aggs[i].layer < 0)
            return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: layer aggregate %d has layer %d (must be >= 0)", path,
                            i, layer_aggs[i].layer);
    return KVS_OK;
}

/* Binds a double, or NULL for NaN (SQLite would store NULL anyway; this makes it explicit). */
static int bind_real(sqlite3_stmt *st, int i, double v) {
    return isnan(v) ? sqlite3_bind_null(st, i) : sqlite3_bind_double(st, i, v);
}

static int bind_text_or_null(sqlite3_stmt *st, int i, const char *s) {
    return s ? sqlite3_bind_text(st, i, s, -1, SQLITE_STATIC) : sqlite3_bind_null(st, i);
}

/* Binds the 42 statistics of `a` starting at parameter `first`. */
static int bind_agg(sqlite3_stmt *st, int first, const kvs_results_agg *a) {
    const kvs_results_stat *m[N_AGG_METRICS] = {&a->out_err,       &a->attn_recall,    &a->topk_overlap,
                                                &a->storage_bytes, &a->traffic_bytes,  &a->transfer_bytes,
                                                &a->compression_ratio};
    int rc = SQLITE_OK, p = first;
    for (int i = 0; i < N_AGG_METRICS && rc == SQLITE_OK; i++) {
        rc = sqlite3_bind_int64(st, p++, m[i]->n);
        if (rc == SQLITE_OK) rc = bind_real(st, p++, m[i]->mean);
        if (rc == SQLITE_OK) rc = bind_real(st, p++, m[i]->p50);
        if (rc == SQLITE_OK) rc = bind_real(st, p++, m[i]->p95);
        if (rc == SQLITE_OK) rc = bind_real(st, p++, m[i]->max);
        if (rc == SQLITE_OK) rc = bind_real(st, p++, m[i]->min);
    }
    return rc;
}

/* "INSERT INTO <table> (<lead>, <42 agg columns>) VALUES (?, ...)" */
static void agg_insert_sql(char *buf, size_t cap, const char *table, const char *lead, int n_lead) {
    size_t len = (size_t)snprintf(buf, cap, "INSERT INTO %s (%s", table, lead);
    for (int m = 0; m < N_AGG_METRICS; m++)
        for (int s = 0; s < N_AGG_STATS; s++)
            len += (size_t)snprintf(buf + len, cap - len, ", %s_%s", agg_metrics[m], agg_stats[s]);
    len += (size_t)snprintf(buf + len, cap - len, ") VALUES (?");
    for (int i = 1; i < n_lead + N_AGG_METRICS * N_AGG_STATS; i++) len += (size_t)snprintf(buf + len, cap - len, ", ?");
    snprintf(buf + len, cap - len, ")");
}

/* Runs a fully bound statement expected to finish with SQLITE_DONE, then resets it for reuse. */
/* Prepares `sql` into *st; on failure the detail names `what` and SQLite's message. */
static kvs_status prepare(kvs_results_db *r, const char *sql, sqlite3_stmt **st, const char *what) {
    if (sqlite3_prepare_v2(r->db, sql, -1, st, NULL) != SQLITE_OK) return db_fail(r->db, r->path, what);
    return KVS_OK;
}

static kvs_status step_done(kvs_results_db *r, sqlite3_stmt *st, const char *what) {
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return db_fail(r->db, r->path, what);
    return KVS_OK;
}

static kvs_status find_or_insert_trace(kvs_results_db *r, const kvs_results_trace *t, int64_t *trace_id) {
    static const char *const where =
        "path = ?1 AND model = ?2 AND n_positions = ?3 AND prompt_len = ?4 AND n_turns = ?5 AND n_layers = ?6 "
        "AND n_heads = ?7 AND n_kv_heads = ?8 AND head_dim = ?9 AND dtype = ?10 AND file_bytes = ?11";
    char sql[1024];
    sqlite3_stmt *sel = NULL, *ins = NULL;
    kvs_status rc = KVS_OK;
    sqlite3_stmt *sts[2];
    snprintf(sql, sizeof sql, "SELECT id FROM traces WHERE %s", where);
    KVS_TRY(rc = prepare(r, sql, &sel, "cannot prepare trace lookup"));
    KVS_TRY(rc = prepare(r, "INSERT INTO traces (path, model, n_positions, prompt_len, n_turns, n_layers, n_heads, "
                            "n_kv_heads, head_dim, dtype, file_bytes) "
                            "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                         &ins, "cannot prepare trace insert"));
    sts[0] = sel;
    sts[1] = ins;
    if (t->file_bytes > (uint64_t)INT64_MAX) {
        rc = kvs_fail(KVS_ERR_INVALID_ARG, "%s: trace file_bytes %" PRIu64 " too large", r->path, t->file_bytes);
        goto cleanup;
    }
    for (int k = 0; k < 2; k++) {
        sqlite3_stmt *s = sts[k];
        sqlite3_bind_text(s, 1, t->path, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, t->model_name ? t->model_name : "", -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 3, t->n_positions);
        sqlite3_bind_int64(s, 4, t->prompt_len);
        sqlite3_bind_int64(s, 5, t->n_turns);
        sqlite3_bind_int(s, 6, t->n_layers);
        sqlite3_bind_int(s, 7, t->n_heads);
        sqlite3_bind_int(s, 8, t->n_kv_heads);
        sqlite3_bind_int(s, 9, t->head_dim);
        sqlite3_bind_text(s, 10, t->dtype, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 11, (int64_t)t->file_bytes);
    }
    int src = sqlite3_step(sel);
    if (src == SQLITE_ROW) {
        *trace_id = sqlite3_column_int64(sel, 0);
    } else if (src == SQLITE_DONE) {
        KVS_TRY(rc = step_done(r, ins, "cannot insert the trace row"));
        *trace_id = sqlite3_last_insert_rowid(r->db);
    } else {
        rc = db_fail(r->db, r->path, "cannot look up the trace row");
    }
cleanup:
    sqlite3_finalize(sel);
    sqlite3_finalize(ins);
    return rc;
}

kvs_status kvs_results_write_run(kvs_results_db *r, const kvs_results_trace *trace, const kvs_results_run *run,
                                 const kvs_results_agg *layer_aggs, int32_t n_layers, const kvs_results_agg *run_agg,
                                 const kvs_results_step *steps, int64_t n_steps, int64_t *run_id) {
    if (!r || !r->db) return kvs_fail(KVS_ERR_INVALID_ARG, "write_run: NULL results database");
    kvs_status rc = validate_run(r->path, trace, run, layer_aggs, n_layers, run_agg, steps, n_steps);
    if (rc != KVS_OK) return rc;

    sqlite3_stmt *ins_run = NULL, *ins_layer = NULL, *ins_summary = NULL, *ins_step = NULL;
    int in_txn = 0;
    int64_t trace_id = 0, id = 0;
    char sql[4096];

    KVS_TRY(rc = exec_sql(r, "BEGIN IMMEDIATE", "cannot start the run transaction"));
    in_txn = 1;
    KVS_TRY(rc = find_or_insert_trace(r, trace, &trace_id));

    KVS_TRY(rc = prepare(r, "INSERT INTO runs (trace_id, policy, params, budget_tokens, budget_fraction, is_oracle, "
                            "measure, status, error, wall_seconds, kvsim_version) "
                            "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                         &ins_run, "cannot prepare run insert"));
    sqlite3_bind_int64(ins_run, 1, trace_id);
    sqlite3_bind_text(ins_run, 2, run->policy, -1, SQLITE_STATIC);
    sqlite3_bind_text(ins_run, 3, run->params, -1, SQLITE_STATIC);
    sqlite3_bind_int64(ins_run, 4, run->budget_tokens);
    /* A negative fraction means "the user gave tokens, not a fraction": stored as NULL. */
    if (run->budget_fraction >= 0.0) sqlite3_bind_double(ins_run, 5, run->budget_fraction);
    else sqlite3_bind_null(ins_run, 5);
    sqlite3_bind_int(ins_run, 6, run->is_oracle);
    sqlite3_bind_text(ins_run, 7, run->measure, -1, SQLITE_STATIC);
    sqlite3_bind_text(ins_run, 8, run->status, -1, SQLITE_STATIC);
    bind_text_or_null(ins_run, 9, run->error);
    bind_real(ins_run, 10, run->wall_seconds);
    sqlite3_bind_text(ins_run, 11, run->kvsim_version, -1, SQLITE_STATIC);
    KVS_TRY(rc = step_done(r, ins_run, "cannot insert the run row"));
    id = sqlite3_last_insert_rowid(r->db);

    if (n_layers > 0) {
        agg_insert_sql(sql, sizeof sql, "run_layers", "run_id, layer", 2);
        KVS_TRY(rc = prepare(r, sql, &ins_layer, "cannot prepare run_layers insert"));
        for (int32_t i = 0; i < n_layers; i++) {
            sqlite3_bind_int64(ins_layer, 1, id);
            sqlite3_bind_int(ins_layer, 2, layer_aggs[i].layer);
            if (bind_agg(ins_layer, 3, &layer_aggs[i]) != SQLITE_OK) {
                rc = db_fail(r->db, r->path, "cannot bind a run_layers row");
                goto cleanup;
            }
            KVS_TRY(rc = step_done(r, ins_layer, "cannot insert a run_layers row"));
        }
    }
    if (run_agg) {
        agg_insert_sql(sql, sizeof sql, "run_summary", "run_id", 1);
        KVS_TRY(rc = prepare(r, sql, &ins_summary, "cannot prepare run_summary insert"));
        sqlite3_bind_int64(ins_summary, 1, id);
        if (bind_agg(ins_summary, 2, run_agg) != SQLITE_OK) {
            rc = db_fail(r->db, r->path, "cannot bind the run_summary row");
            goto cleanup;
        }
        KVS_TRY(rc = step_done(r, ins_summary, "cannot insert the run_summary row"));
    }
    if (n_steps > 0) {
        KVS_TRY(rc = prepare(r, "INSERT INTO steps (run_id, layer, q_head, position, out_err, attn_recall, "
                                "topk_overlap, attended_tokens, storage_bytes, traffic_bytes) "
                                "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                             &ins_step, "cannot prepare steps insert"));
        sqlite3_bind_int64(ins_step, 1, id);
        for (int64_t i = 0; i < n_steps; i++) {
            const kvs_results_step *s = &steps[i];
            sqlite3_bind_int(ins_step, 2, s->layer);
            sqlite3_bind_int(ins_step, 3, s->q_head);
            sqlite3_bind_int64(ins_step, 4, s->position);
            bind_real(ins_step, 5, s->out_err);
            bind_real(ins_step, 6, s->attn_recall);
            bind_real(ins_step, 7, s->topk_overlap);
            sqlite3_bind_int64(ins_step, 8, (int64_t)s->attended_tokens);
            bind_real(ins_step, 9, s->storage_bytes);
            bind_real(ins_step, 10, s->traffic_bytes);
            if (sqlite3_step(ins_step) != SQLITE_DONE) {
                rc = kvs_fail(KVS_ERR_DB, "%s: cannot insert step %" PRId64 " (layer %d, q_head %d, position %" PRId64
                                          "): %s",
                              r->path, i, s->layer, s->q_head, s->position, sqlite3_errmsg(r->db));
                sqlite3_reset(ins_step);
                goto cleanup;
            }
            sqlite3_reset(ins_step);
        }
    }
    KVS_TRY(rc = exec_sql(r, "COMMIT", "cannot commit the run"));
    in_txn = 0;
    if (run_id) *run_id = id;

cleanup:
    sqlite3_finalize(ins_run);
    sqlite3_finalize(ins_layer);
    sqlite3_finalize(ins_summary);
    sqlite3_finalize(ins_step);
    /* Nothing of a failed write may remain: ROLLBACK undoes the trace row too. */
    if (in_txn && sqlite3_get_autocommit(r->db) == 0) sqlite3_exec(r->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}
