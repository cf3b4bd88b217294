/* results.c — the SQLite results database of kvsim: schema creation and migration, the one-transaction run
 * writer (with the trace row and its turns), the read API every reader uses (no SQL outside this file), and
 * the summary statistics of a metric. Implements results/results.h; the schema (tables, columns, units, versions)
 * is documented in results/SCHEMA.md and the metrics in sim/metrics.h and ../shared/DESIGN.md ("Metrics",
 * "Results (SQLite)").
 *
 * Every metric column is generated from the metric table (sim/metrics.h): run_layers / run_summary hold
 * `<metric>_<stat>` for every metric and statistic, steps one column per metric. No metric is named here.
 *
 * Safety rules this file keeps:
 *  - A file that is not a kvsim results database is never modified: before SQLite touches it we check
 *    its 16-byte SQLite header ourselves, then (read-only queries only) that it holds a `meta` table with
 *    creator 'kvsim' — or no schema at all (an empty SQLite file, which is also what a concurrent
 *    creator's file looks like before its schema transaction commits). Only then do we switch it to WAL.
 *  - A v1 database opened for writing is migrated to v2 in one BEGIN IMMEDIATE ... COMMIT transaction that
 *    re-reads the version first (two processes migrating at once: the second finds v2 and does nothing);
 *    any failure rolls back to the intact v1 database.
 *  - A run is written by one BEGIN IMMEDIATE ... COMMIT transaction; any failure rolls it back, so
 *    readers (and a process killed mid-write) never see a half-written run.
 *  - Several processes may write at once: WAL journal plus a 30 s busy timeout.
 *  - Readers open read-only and read v1 and v2 alike: they select the columns that exist (a missing one
 *    reads as NULL = not recorded), so readers never need a migration.
 */
#include "results.h"
#include "results_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The named members of the unions in results.h must alias the metric array entry by entry. */
_Static_assert(offsetof(kvs_results_agg, compression_ratio) ==
                   offsetof(kvs_results_agg, m) + KVS_M_COMPRESSION * sizeof(kvs_results_stat),
               "kvs_results_agg members out of step with KVS_METRIC_LIST");
_Static_assert(offsetof(kvs_results_step, compression_ratio) ==
                   offsetof(kvs_results_step, v) + KVS_M_COMPRESSION * sizeof(double),
               "kvs_results_step members out of step with KVS_METRIC_LIST");
_Static_assert(KVS_N_STATS == 6 && KVS_STAT_N == 0, "the statistics columns assume n first, then five reals");
#define KVS_RESULTS_BUSY_TIMEOUT_MS 30000

/* The tables whose column lists are cached at open (readers select only the columns that exist). */
enum { T_RUNS = 0, T_RUN_LAYERS, T_RUN_SUMMARY, T_STEPS, T_TRACE_TURNS, N_TABLES };
static const char *const table_names[N_TABLES] = {"runs", "run_layers", "run_summary", "steps", "trace_turns"};

struct kvs_results_db {
    sqlite3 *db;
    char *path;              /* owned copy, for error messages */
    int readonly;            /* opened by kvs_results_open_readonly */
    int created;             /* kvs_results_open created the file (it did not exist) */
    int write_failed;        /* a write through this handle (or its open) failed: see kvs_results_close */
    int version;             /* schema version of the file (after migration for a writer) */
    char *cols[N_TABLES];    /* "\x1f" + each column name + "\x1f", of each table */
    char *notnull[N_TABLES]; /* the same for the NOT NULL columns only */
};

/* ------------------------------------------------------------------------------------------------
 * A growing string (SQL text is built from the metric table, so its length is not fixed)
 * ---------------------------------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 1024;
        while (cap <= b->len + (size_t)n) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        if (!b->p) q[0] = '\0';
        b->p = q;
        b->cap = cap;
    }
}

static void sb_free(sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ------------------------------------------------------------------------------------------------
 * Schema (keep in sync with results/SCHEMA.md)
 * ---------------------------------------------------------------------------------------------- */

static const char schema_meta_traces_sql[] =
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
    ");\n";

/* The turns of a trace: positions [begin_pos, prompt_end) are the turn's prompt, [prompt_end, end_pos) its
 * generated tokens (trace/trace.h kvs_turn; "begin" and "end" are SQL keywords). Part of schema v2: the v1
 * migration and every open for writing create it, so a v2 file written before it existed gains it. */
static const char trace_turns_sql[] =
    "CREATE TABLE IF NOT EXISTS trace_turns (\n"
    "  trace_id INTEGER NOT NULL REFERENCES traces(id) ON DELETE CASCADE,\n"
    "  turn INTEGER NOT NULL CHECK (turn >= 0),\n"
    "  begin_pos INTEGER NOT NULL,\n"
    "  prompt_end INTEGER NOT NULL,\n"
    "  end_pos INTEGER NOT NULL,\n"
    "  CHECK (0 <= begin_pos AND begin_pos <= prompt_end AND prompt_end <= end_pos),\n"
    "  PRIMARY KEY (trace_id, turn)\n"
    ") WITHOUT ROWID;\n";

/* The runs table of schema v2 under `name` (the migration builds it as runs_v2, then renames it; there it
 * must not exist yet, so no IF NOT EXISTS). */
static void sb_runs_ddl(sbuf *b, const char *name, int if_not_exists) {
    sb_printf(b,
              "CREATE TABLE %s%s (\n"
              "  id INTEGER PRIMARY KEY AUTOINCREMENT,\n"
              "  trace_id INTEGER NOT NULL REFERENCES traces(id),\n"
              "  policy TEXT NOT NULL,\n"
              "  params TEXT NOT NULL,\n"
              "  budget_tokens INTEGER NOT NULL,\n"
              "  budget_fraction REAL,\n"
              "  is_oracle INTEGER NOT NULL CHECK (is_oracle IN (0, 1)),\n"
              "  measure TEXT NOT NULL CHECK (measure IN ('decode', 'prefill', 'all')),\n"
              "  status TEXT NOT NULL CHECK (status IN ('complete', 'failed')),\n"
              "  error TEXT,\n"
              "  wall_seconds REAL,\n"
              "  kvsim_version TEXT NOT NULL,\n"
              "  created_at TEXT NOT NULL DEFAULT (strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now')),\n"
              "  budget_scope TEXT CHECK (budget_scope IN ('every_step', 'prompt', 'none')),\n"
              "  layout TEXT CHECK (layout IN ('per_kv_head', 'per_query_head')),\n"
              "  notes TEXT,\n"
              "  options TEXT,\n"
              "  codec TEXT,\n"
              "  page INTEGER\n"
              ");\n",
              if_not_exists ? "IF NOT EXISTS " : "", name);
}

static const char runs_indexes_sql[] = "CREATE INDEX IF NOT EXISTS runs_policy ON runs (policy, params, budget_tokens);\n"
                                       "CREATE INDEX IF NOT EXISTS runs_trace ON runs (trace_id);\n";

/* SQL type of aggregate column <metric>_<stat>: the sample count is an integer, the statistics reals. */
static const char *agg_col_type(int stat) { return stat == KVS_STAT_N ? "INTEGER" : "REAL"; }

/* SQL type of a steps column: token counts are integers, everything else real (NULL = not recorded). */
static const char *step_col_type(int metric) {
    return kvs_metric_table[metric].kind == KVS_METRIC_TOKENS ? "INTEGER" : "REAL";
}

static void sb_schema(sbuf *b) {
    sb_printf(b, "%s%s", schema_meta_traces_sql, trace_turns_sql);
    sb_runs_ddl(b, "runs", 1);
    sb_printf(b, "%s", runs_indexes_sql);
    static const char *const agg_lead[2][2] = {
        {"run_layers", "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
                       "  layer INTEGER NOT NULL CHECK (layer >= 0)"},
        {"run_summary", "  run_id INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE"}};
    for (int t = 0; t < 2; t++) {
        sb_printf(b, "CREATE TABLE IF NOT EXISTS %s (\n%s", agg_lead[t][0], agg_lead[t][1]);
        for (int m = 0; m < KVS_N_METRICS; m++)
            for (int s = 0; s < KVS_N_STATS; s++)
                sb_printf(b, ",\n  %s_%s %s", kvs_metric_table[m].name, kvs_stat_names[s], agg_col_type(s));
        sb_printf(b, "%s\n);\n", t == 0 ? ",\n  PRIMARY KEY (run_id, layer)" : "");
    }
    sb_printf(b, "CREATE TABLE IF NOT EXISTS steps (\n"
                 "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,\n"
                 "  layer INTEGER NOT NULL,\n"
                 "  q_head INTEGER NOT NULL,\n"
                 "  position INTEGER NOT NULL");
    for (int m = 0; m < KVS_N_METRICS; m++) sb_printf(b, ",\n  %s %s", kvs_metric_table[m].name, step_col_type(m));
    sb_printf(b, ",\n  PRIMARY KEY (run_id, layer, q_head, position)\n) WITHOUT ROWID;\n");
    sb_printf(b, "INSERT OR IGNORE INTO meta (key, value) VALUES ('creator', 'kvsim');\n"
                 "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '%d');\n"
                 "INSERT OR IGNORE INTO meta (key, value) VALUES ('created_at', "
                 "strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now'));\n",
              KVS_RESULTS_SCHEMA_VERSION);
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

/* Prepares `sql` into *st; on failure the detail names `what` and SQLite's message. */
static kvs_status prepare(kvs_results_db *r, const char *sql, sqlite3_stmt **st, const char *what) {
    if (sqlite3_prepare_v2(r->db, sql, -1, st, NULL) != SQLITE_OK) return db_fail(r->db, r->path, what);
    return KVS_OK;
}

/* Runs a fully bound statement expected to finish with SQLITE_DONE, then resets it for reuse. */
static kvs_status step_done(kvs_results_db *r, sqlite3_stmt *st, const char *what) {
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return db_fail(r->db, r->path, what);
    return KVS_OK;
}

/* Checks the first 16 bytes of an existing, non-empty file for the SQLite header string, so a foreign
 * file is rejected before SQLite opens (and possibly journals) it. */
/* 1 when the file at `path` starts with the 16-byte SQLite header, 0 when it does not (or is shorter), -1 (errno
 * set) when it cannot be opened. */
static int sqlite_header(const char *path) { return kvs_file_sqlite_header(path); }

int kvs_results_is_sqlite_file(const char *path) { return sqlite_header(path) == 1; }

static kvs_status check_sqlite_header(const char *path) {
    int h = sqlite_header(path);
    if (h < 0) return kvs_fail(KVS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (h == 0)
        return kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (not an SQLite file); left unchanged", path);
    return KVS_OK;
}

/* Read-only identification of an opened existing database: *is_empty when it has no schema objects at
 * all, else it must be a kvsim one; *version receives meta.schema_version (not checked here). */
static kvs_status identify(kvs_results_db *r, int *is_empty, int64_t *version) {
    sqlite3_stmt *st = NULL;
    kvs_status rc = KVS_OK;
    *is_empty = 0;
    *version = 0;
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
    *version = sqlite3_column_int64(st, 1);
cleanup:
    sqlite3_finalize(st);
    return rc;
}

static kvs_status version_fail(const char *path, int64_t version) {
    return kvs_fail(KVS_ERR_VERSION,
                    "%s: results schema version %" PRId64 " is not supported: this kvsim reads versions 1 and %d and "
                    "writes %d (a newer kvsim wrote this file?); left unchanged",
                    path, version, KVS_RESULTS_SCHEMA_VERSION, KVS_RESULTS_SCHEMA_VERSION);
}

/* Caches the column names of the tables readers and writers adapt to (see has_col). */
static kvs_status load_columns(kvs_results_db *r) {
    for (int t = 0; t < N_TABLES; t++) {
        free(r->cols[t]);
        free(r->notnull[t]);
        r->cols[t] = r->notnull[t] = NULL;
        sqlite3_stmt *st = NULL;
        sbuf all = {0}, nn = {0};
        sb_printf(&all, "\x1f");
        sb_printf(&nn, "\x1f");
        kvs_status rc = prepare(r, "SELECT name, \"notnull\" FROM pragma_table_info(?1)", &st, "cannot list columns");
        if (rc != KVS_OK) {
            sb_free(&all);
            sb_free(&nn);
            return rc;
        }
        sqlite3_bind_text(st, 1, table_names[t], -1, SQLITE_STATIC);
        int src;
        while ((src = sqlite3_step(st)) == SQLITE_ROW) {
            const char *name = (const char *)sqlite3_column_text(st, 0);
            sb_printf(&all, "%s\x1f", name ? name : "");
            if (sqlite3_column_int(st, 1)) sb_printf(&nn, "%s\x1f", name ? name : "");
        }
        sqlite3_finalize(st);
        if (src != SQLITE_DONE) rc = db_fail(r->db, r->path, "cannot list columns");
        else if (all.oom || nn.oom) rc = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", r->path);
        if (rc != KVS_OK) {
            sb_free(&all);
            sb_free(&nn);
            return rc;
        }
        r->cols[t] = all.p;
        r->notnull[t] = nn.p;
    }
    return KVS_OK;
}

static int in_list(const char *list, const char *col) {
    if (!list) return 0;
    size_t n = strlen(col);
    for (const char *p = strstr(list, col); p; p = strstr(p + 1, col))
        if (p[-1] == '\x1f' && p[n] == '\x1f') return 1;
    return 0;
}

static int has_col(const kvs_results_db *r, int table, const char *col) { return in_list(r->cols[table], col); }

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

/* Appends an ALTER TABLE ... ADD COLUMN for every metric column of the table that run_layers, run_summary or
 * steps lack (per the column lists cached by load_columns): NULL in existing rows = not recorded. */
static void sb_missing_columns(sbuf *sql, const kvs_results_db *r) {
    static const int agg_tables[2] = {T_RUN_LAYERS, T_RUN_SUMMARY};
    for (int t = 0; t < 2; t++)
        for (int m = 0; m < KVS_N_METRICS; m++)
            for (int s = 0; s < KVS_N_STATS; s++) {
                char col[128];
                snprintf(col, sizeof col, "%s_%s", kvs_metric_table[m].name, kvs_stat_names[s]);
                if (!has_col(r, agg_tables[t], col))
                    sb_printf(sql, "ALTER TABLE %s ADD COLUMN %s %s;\n", table_names[agg_tables[t]], col,
                              agg_col_type(s));
            }
    /* runs.options (the replay options that change a run's numbers) came later in v2; a v1 table (no
     * budget_scope) is rebuilt by the migration with it */
    if (has_col(r, T_RUNS, "budget_scope") && !has_col(r, T_RUNS, "options"))
        sb_printf(sql, "ALTER TABLE runs ADD COLUMN options TEXT;\n");
    /* runs.codec (the representation stage's canonical spec, NULL = K/V as captured) came later still */
    if (has_col(r, T_RUNS, "budget_scope") && !has_col(r, T_RUNS, "codec"))
        sb_printf(sql, "ALTER TABLE runs ADD COLUMN codec TEXT;\n");
    /* runs.page (page granularity, positions a page; NULL = token granularity) after it */
    if (has_col(r, T_RUNS, "budget_scope") && !has_col(r, T_RUNS, "page"))
        sb_printf(sql, "ALTER TABLE runs ADD COLUMN page INTEGER;\n");
    for (int m = 0; m < KVS_N_METRICS; m++)
        if (!has_col(r, T_STEPS, kvs_metric_table[m].name))
            sb_printf(sql, "ALTER TABLE steps ADD COLUMN %s %s;\n", kvs_metric_table[m].name, step_col_type(m));
}

/* A v2 database written before a metric was appended to sim/metrics.h lacks its columns: add them (additive, no
 * version change; readers already select only the columns that exist). One transaction that re-reads the
 * columns first, so concurrent openers add each column once. */
static kvs_status ensure_metric_columns(kvs_results_db *r) {
    sbuf sql = {0};
    sb_missing_columns(&sql, r);
    int missing = sql.len > 0 || sql.oom;
    sb_free(&sql);
    if (!missing) return KVS_OK;
    kvs_status rc = exec_sql(r, "BEGIN IMMEDIATE", "cannot start the column transaction");
    if (rc != KVS_OK) return rc;
    if ((rc = load_columns(r)) == KVS_OK) {
        sb_missing_columns(&sql, r);
        if (sql.oom) rc = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", r->path);
        else if (sql.len > 0) rc = exec_sql(r, sql.p, "cannot add the new metric columns");
    }
    sb_free(&sql);
    if (rc == KVS_OK) rc = exec_sql(r, "COMMIT", "cannot commit the new metric columns");
    if (rc != KVS_OK) {
        if (sqlite3_get_autocommit(r->db) == 0) sqlite3_exec(r->db, "ROLLBACK", NULL, NULL, NULL);
        return rc;
    }
    return load_columns(r);
}

/* ------------------------------------------------------------------------------------------------
 * Migration v1 -> v2 (results/SCHEMA.md "Versions and migration")
 * ---------------------------------------------------------------------------------------------- */

/* The runs columns of schema v1 (frozen), copied into the rebuilt runs table. */
static const char v1_runs_columns[] = "id, trace_id, policy, params, budget_tokens, budget_fraction, is_oracle, "
                                      "measure, status, error, wall_seconds, kvsim_version, created_at";

/* Rebuilds `runs` with the v2 columns and CHECKs (SQLite cannot alter a CHECK constraint: create runs_v2,
 * copy, drop, rename, with foreign keys off so nothing cascades; AUTOINCREMENT's high-water mark is
 * restored so run ids are never reused), creates trace_turns (empty), adds the missing metric columns to
 * run_layers, run_summary and steps (NULL in existing rows = not recorded), sets meta.schema_version, checks
 * every foreign key, and commits — all in one transaction. */
static kvs_status migrate_v1(kvs_results_db *r) {
    kvs_status rc = KVS_OK;
    sbuf sql = {0};
    sqlite3_stmt *st = NULL;
    int in_txn = 0;
    int64_t version = 0, seq = -1;
    KVS_TRY(rc = exec_sql(r, "PRAGMA foreign_keys = OFF", "cannot disable foreign keys"));
    KVS_TRY(rc = exec_sql(r, "BEGIN IMMEDIATE", "cannot start the migration transaction"));
    in_txn = 1;
    KVS_TRY(rc = prepare(r, "SELECT value FROM meta WHERE key = 'schema_version'", &st, "cannot read the version"));
    if (sqlite3_step(st) == SQLITE_ROW) version = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    st = NULL;
    if (version == KVS_RESULTS_SCHEMA_VERSION) goto commit; /* a concurrent opener migrated it first */
    if (version != 1) {
        rc = version_fail(r->path, version);
        goto cleanup;
    }
    KVS_TRY(rc = prepare(r, "SELECT seq FROM sqlite_sequence WHERE name = 'runs'", &st, "cannot read sqlite_sequence"));
    if (sqlite3_step(st) == SQLITE_ROW) seq = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    st = NULL;

    KVS_TRY(rc = load_columns(r));
    sb_runs_ddl(&sql, "runs_v2", 0);
    sb_printf(&sql, "INSERT INTO runs_v2 (%s) SELECT %s FROM runs;\n", v1_runs_columns, v1_runs_columns);
    sb_printf(&sql, "DROP TABLE runs;\nALTER TABLE runs_v2 RENAME TO runs;\n%s", runs_indexes_sql);
    sb_printf(&sql, "%s", trace_turns_sql); /* empty: v1 recorded no turns (no turn info) */
    sb_missing_columns(&sql, r);
    sb_printf(&sql,
              "UPDATE meta SET value = '%d' WHERE key = 'schema_version';\n"
              "INSERT OR REPLACE INTO meta (key, value) VALUES ('migrated_from', '1');\n"
              "INSERT OR REPLACE INTO meta (key, value) VALUES ('migrated_at', "
              "strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now'));\n",
              KVS_RESULTS_SCHEMA_VERSION);
    if (sql.oom) {
        rc = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", r->path);
        goto cleanup;
    }
    KVS_TRY(rc = exec_sql(r, sql.p, "cannot rebuild the tables"));
    if (seq >= 0) {
        KVS_TRY(rc = prepare(r, "UPDATE sqlite_sequence SET seq = ?1 WHERE name = 'runs' AND seq < ?1", &st,
                             "cannot prepare the sequence update"));
        sqlite3_bind_int64(st, 1, seq);
        KVS_TRY(rc = step_done(r, st, "cannot restore the run id sequence"));
        sqlite3_finalize(st);
        KVS_TRY(rc = prepare(r, "INSERT INTO sqlite_sequence (name, seq) SELECT 'runs', ?1 "
                                "WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'runs')",
                             &st, "cannot prepare the sequence insert"));
        sqlite3_bind_int64(st, 1, seq);
        KVS_TRY(rc = step_done(r, st, "cannot restore the run id sequence"));
        sqlite3_finalize(st);
        st = NULL;
    }
    KVS_TRY(rc = prepare(r, "PRAGMA foreign_key_check", &st, "cannot check foreign keys"));
    int fk = sqlite3_step(st);
    sqlite3_finalize(st);
    st = NULL;
    if (fk != SQLITE_DONE) {
        rc = fk == SQLITE_ROW ? kvs_fail(KVS_ERR_DB, "%s: a foreign key is broken after rebuilding runs", r->path)
                              : db_fail(r->db, r->path, "cannot check foreign keys");
        goto cleanup;
    }
commit:
    KVS_TRY(rc = exec_sql(r, "COMMIT", "cannot commit the migration"));
    in_txn = 0;
cleanup:
    sqlite3_finalize(st);
    sb_free(&sql);
    if (in_txn && sqlite3_get_autocommit(r->db) == 0) sqlite3_exec(r->db, "ROLLBACK", NULL, NULL, NULL);
    if (rc != KVS_OK && rc != KVS_ERR_VERSION)
        rc = kvs_fail(rc, "%s: cannot migrate the results database from schema version 1 to %d (it is left "
                          "unchanged, still version 1): %s",
                      r->path, KVS_RESULTS_SCHEMA_VERSION, kvs_last_error());
    return rc;
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
    sbuf schema = {0};
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
        if (fd >= 0) {
            close(fd);
            r->created = 1; /* ours to remove should this open, or every write, fail (kvs_results_close) */
        }
    }
    if (sqlite3_open_v2(path, &r->db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
        rc = kvs_fail(KVS_ERR_DB, "%s: cannot open results database: %s", path,
                      r->db ? sqlite3_errmsg(r->db) : "out of memory");
        goto cleanup;
    }
    sqlite3_extended_result_codes(r->db, 1);
    sqlite3_busy_timeout(r->db, KVS_RESULTS_BUSY_TIMEOUT_MS);

    /* Identify before changing anything: an existing foreign or corrupt database, or one of an unknown
     * version, must stay byte-identical. */
    int is_empty = 1;
    int64_t version = 0;
    if (exists && sb.st_size > 0) {
        KVS_TRY(rc = identify(r, &is_empty, &version));
        if (!is_empty && version != 1 && version != KVS_RESULTS_SCHEMA_VERSION) {
            rc = version_fail(path, version);
            goto cleanup;
        }
    }

    KVS_TRY(rc = switch_to_wal(r));
    if (!is_empty && version == 1) KVS_TRY(rc = migrate_v1(r));
    KVS_TRY(rc = exec_sql(r, "PRAGMA foreign_keys = ON", "cannot enable foreign keys"));

    /* Schema: idempotent, in one transaction so a concurrent opener sees all of it or none of it. */
    sb_schema(&schema);
    if (schema.oom) {
        rc = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    KVS_TRY(rc = exec_sql(r, "BEGIN IMMEDIATE", "cannot start the schema transaction"));
    if ((rc = exec_sql(r, schema.p, "cannot create the schema")) != KVS_OK) {
        sqlite3_exec(r->db, "ROLLBACK", NULL, NULL, NULL);
        goto cleanup;
    }
    if ((rc = exec_sql(r, "COMMIT", "cannot commit the schema")) != KVS_OK) {
        sqlite3_exec(r->db, "ROLLBACK", NULL, NULL, NULL);
        goto cleanup;
    }
    /* A concurrent creator may have won the race with different content: re-check what is there now. */
    KVS_TRY(rc = identify(r, &is_empty, &version));
    if (version != KVS_RESULTS_SCHEMA_VERSION) {
        rc = version_fail(path, version);
        goto cleanup;
    }
    r->version = (int)version;
    KVS_TRY(rc = load_columns(r));
    KVS_TRY(rc = ensure_metric_columns(r));
    sb_free(&schema);
    *out = r;
    return KVS_OK;

cleanup:
    sb_free(&schema);
    r->write_failed = 1;
    kvs_results_close(r);
    return rc;
}

/* An empty database (a 0-byte file, or SQLite without any schema object) is what a replay killed before its
 * schema committed leaves: kvs_results_open initialises it, a reader has nothing to read (KVS_ERR_END). */
static kvs_status empty_db_fail(const char *path) {
    return kvs_fail(KVS_ERR_END, "%s: empty results database: no runs recorded (a replay stopped before its first "
                    "run leaves one; the next replay fills it)", path);
}

/* How a reader opens the file, tried in this order until one can read it (see kvs_results_open_readonly). */
enum { OPEN_WRITABLE, OPEN_READONLY, OPEN_IMMUTABLE, N_OPEN_MODES };

/* "file:" + path percent-encoded where a URI would read it otherwise, + "?immutable=1" (caller frees), NULL when out of memory. */
static char *immutable_uri(const char *path) {
    sbuf b = {0};
    sb_printf(&b, "file:");
    for (const unsigned char *c = (const unsigned char *)path; *c; c++) {
        if ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || strchr("/-_.~", *c))
            sb_printf(&b, "%c", *c);
        else sb_printf(&b, "%%%02X", *c);
    }
    sb_printf(&b, "?immutable=1");
    if (b.oom) {
        sb_free(&b);
        return NULL;
    }
    return b.p;
}

/* Opens r->path in `mode` and reads its schema list once, which is when SQLite opens the -wal and -shm files of a
 * WAL database: SQLITE_OK, or the SQLite result code of the failure (the connection is then closed; SQLITE_NOMEM
 * without one). */
static int open_mode(kvs_results_db *r, int mode) {
    int rc;
    if (mode == OPEN_IMMUTABLE) {
        char *uri = immutable_uri(r->path);
        if (!uri) return SQLITE_NOMEM;
        rc = sqlite3_open_v2(uri, &r->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL);
        free(uri);
    } else {
        rc = sqlite3_open_v2(r->path, &r->db, mode == OPEN_WRITABLE ? SQLITE_OPEN_READWRITE : SQLITE_OPEN_READONLY,
                             NULL);
    }
    if (rc == SQLITE_OK) {
        sqlite3_extended_result_codes(r->db, 1);
        sqlite3_busy_timeout(r->db, KVS_RESULTS_BUSY_TIMEOUT_MS);
        rc = sqlite3_exec(r->db, "PRAGMA query_only = 1; SELECT count(*) FROM sqlite_master", NULL, NULL, NULL);
    }
    return rc;
}

kvs_status kvs_results_open_readonly(const char *path, kvs_results_db **out) {
    if (!path || !path[0] || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "results db: empty path");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return kvs_fail(KVS_ERR_IO, "%s: cannot open results database: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (not a regular file)", path);
    if (sb.st_size == 0) return empty_db_fail(path);
    kvs_status rc = check_sqlite_header(path);
    if (rc != KVS_OK) return rc;
    kvs_results_db *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path))) {
        free(r);
        return kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", path);
    }
    r->readonly = 1;
    /* A WAL database is read through its -wal file and its -shm index, which SQLite creates beside the database
     * when they are missing. The modes, in order:
     *  - writable: when the file and its folder are writable, the file is opened for writing with writes refused
     *    (query_only): a read-only connection keeps the -wal and -shm files after the last close (only one that
     *    may write checkpoints and removes them), so this one leaves the database as one file again;
     *  - read-only (SQLITE_OPEN_READONLY): the database or its folder is not writable. SQLite reads a WAL
     *    database so when its -wal and -shm already exist (a writer is open, or was killed), or when it can
     *    create them (https://www.sqlite.org/wal.html, "Read-Only Databases");
     *  - immutable (URI parameter immutable=1: no locks, no -wal, no -shm): when neither worked because they
     *    cannot be created (a folder without write permission, a read-only mount), and only when there is NO
     *    -wal file. SQLite removes the -wal when the last connection closes, after checkpointing every committed
     *    transaction into the database file; so without one the file holds every committed run and no
     *    connection is open. The docs' risk of immutable — reading a file that changes underneath, with wrong
     *    results or "database disk image is malformed" — then needs a writer to start while this command reads,
     *    and a writer needs the folder's write access that this user lacks: someone else writing the same
     *    database at that moment. A reader that cannot share the file's locks cannot exclude that; the
     *    alternative is not reading the database at all. When a -wal file exists it may hold committed runs the
     *    database file does not (immutable would silently miss them) or belong to a live writer: the reader
     *    refuses, saying why. */
    char wal[PATH_MAX + 8];
    snprintf(wal, sizeof wal, "%s-wal", path);
    struct stat wsb;
    int has_wal = lstat(wal, &wsb) == 0 || errno != ENOENT;
    char *dir_copy = strdup(path);
    int writable = dir_copy && access(path, R_OK | W_OK) == 0 && access(dirname(dir_copy), W_OK | X_OK) == 0;
    free(dir_copy);
    int src = SQLITE_OK, mode = writable ? OPEN_WRITABLE : OPEN_READONLY;
    for (; mode < N_OPEN_MODES; mode++) {
        if (mode == OPEN_IMMUTABLE && has_wal) break;
        if ((src = open_mode(r, mode)) == SQLITE_OK) break;
        int primary = src & 0xff;
        /* a file SQLite can read but whose -wal/-shm it can neither use nor create: the next mode may read it */
        if (primary != SQLITE_CANTOPEN && primary != SQLITE_READONLY && primary != SQLITE_PERM &&
            primary != SQLITE_IOERR)
            break;
        if (mode + 1 < N_OPEN_MODES) {
            sqlite3_close_v2(r->db);
            r->db = NULL;
        }
    }
    if (src != SQLITE_OK) {
        if (mode == OPEN_IMMUTABLE && has_wal)
            rc = kvs_fail(KVS_ERR_IO,
                          "%s: cannot read the results database: %s; its write-ahead log %s may hold runs the "
                          "database file does not, and SQLite cannot open it here (it needs to create or write "
                          "the -shm index beside the database). Read it where it is writable, or have its owner "
                          "run `kvsim runs %s` once (which folds the log into the database)",
                          path, r->db ? sqlite3_errmsg(r->db) : sqlite3_errstr(src), wal, path);
        else if (src == SQLITE_NOMEM || !r->db) rc = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", path);
        else if ((src & 0xff) == SQLITE_NOTADB || (src & 0xff) == SQLITE_CORRUPT)
            rc = kvs_fail(KVS_ERR_DB, "%s: not a kvsim results database (unreadable: %s); left unchanged", path,
                          sqlite3_errmsg(r->db));
        else rc = kvs_fail(KVS_ERR_DB, "%s: cannot open results database: %s", path, sqlite3_errmsg(r->db));
        goto cleanup;
    }
    int is_empty = 0;
    int64_t version = 0;
    KVS_TRY(rc = identify(r, &is_empty, &version));
    if (is_empty) {
        rc = empty_db_fail(path);
        goto cleanup;
    }
    if (version != 1 && version != KVS_RESULTS_SCHEMA_VERSION) {
        rc = version_fail(path, version);
        goto cleanup;
    }
    r->version = (int)version;
    KVS_TRY(rc = load_columns(r));
    *out = r;
    return KVS_OK;
cleanup:
    kvs_results_close(r);
    return rc;
}

/* SQLite's locks (os_unix.c): a connection holds a read lock on the database file's SHARED range, in the 512
 * bytes from PENDING_BYTE, for as long as it has the file open in WAL mode; a connection with the -shm open holds
 * a read lock on it. What SQLite's own last-connection test (an exclusive lock there) relies on. */
#define KVS_SQLITE_PENDING_BYTE 0x40000000

/* 1 when a process other than this one holds a lock on the file at `path` in [start, start + len) (len 0: to its
 * end); 0 when none does or the file does not exist. Call it only with no SQLite connection of this process open on
 * the file: closing our descriptor drops every POSIX lock this process holds on it. */
static int locked_by_another(const char *path, off_t start, off_t len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : 1;
    struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
    int busy = fcntl(fd, F_GETLK, &lk) != 0 || lk.l_type != F_UNLCK;
    close(fd);
    return busy;
}

/* 1 when the database holds results: a row in any table but the schema's and the trace description's (meta,
 * sqlite_sequence, traces, trace_turns, sweep_traces), which a run, an analysis or a plan always adds to; 0 when it
 * holds none; -1 when that cannot be read (the failure that brought us here may make every read fail too). */
static int holds_results(kvs_results_db *r) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(r->db,
                           "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT IN ('meta', "
                           "'sqlite_sequence', 'traces', 'trace_turns', 'sweep_traces')",
                           -1, &st, NULL) != SQLITE_OK)
        return -1;
    int found = 0, src;
    while (!found && (src = sqlite3_step(st)) == SQLITE_ROW) {
        char sql[256];
        snprintf(sql, sizeof sql, "SELECT 1 FROM \"%s\" LIMIT 1", (const char *)sqlite3_column_text(st, 0));
        sqlite3_stmt *q = NULL;
        if (sqlite3_prepare_v2(r->db, sql, -1, &q, NULL) != SQLITE_OK) found = -1;
        else {
            int qrc = sqlite3_step(q);
            found = qrc == SQLITE_ROW ? 1 : qrc == SQLITE_DONE ? 0 : -1;
        }
        sqlite3_finalize(q);
    }
    if (!found && src != SQLITE_DONE) found = -1;
    sqlite3_finalize(st);
    return found;
}

void kvs_results_close(kvs_results_db *r) {
    if (!r) return;
    /* A database this handle created, whose writes failed before any result was stored in it (a full disk during
     * the first replay into a new file: its schema in a WAL and nothing else), is removed with its -wal and -shm:
     * it would only read as "empty results database". Only when no other process has it open: another writer
     * (several may share a database) may be about to store its runs there. The residual race, a process that opens
     * the file between the lock test and the unlink and writes into the removed file, needs two processes to
     * create one new database at the same moment as one of them fails. A database that existed is never removed:
     * its failed write rolled back (one transaction per run) and left it as it was. */
    int discard = 0;
    if (r->created && r->write_failed) {
        /* Unreadable: removed only when the failure came inside kvs_results_open (r->version still 0), which began
         * by creating the file a few moments ago, so no other process can have stored and gone since; after that,
         * kept (what cannot be checked is not thrown away). */
        int holds = r->db ? holds_results(r) : 0;
        discard = holds == 0 || (holds < 0 && r->version == 0);
    }
    if (r->db) {
        /* sqlite3_close, not _v2: with a statement left open the connection would stay open, locks and all */
        if (discard && sqlite3_close(r->db) != SQLITE_OK) {
            discard = 0;
            sqlite3_close_v2(r->db);
        } else if (!discard) sqlite3_close_v2(r->db);
    }
    if (discard) {
        char wal[PATH_MAX + 8], shm[PATH_MAX + 8];
        snprintf(wal, sizeof wal, "%s-wal", r->path);
        snprintf(shm, sizeof shm, "%s-shm", r->path);
        if (!locked_by_another(r->path, KVS_SQLITE_PENDING_BYTE, 512) && !locked_by_another(shm, 0, 0)) {
            unlink(r->path);
            unlink(wal);
            unlink(shm);
        }
    }
    for (int t = 0; t < N_TABLES; t++) {
        free(r->cols[t]);
        free(r->notnull[t]);
    }
    free(r->path);
    free(r);
}

int kvs_results_schema_version(const kvs_results_db *r) { return r ? r->version : 0; }


/* ------------------------------------------------------------------------------------------------
 * Writing a run
 * ---------------------------------------------------------------------------------------------- */

static int one_of(const char *s, const char *a, const char *b, const char *c) {
    return s && (!strcmp(s, a) || !strcmp(s, b) || (c && !strcmp(s, c)));
}

/* The trace row's own checks (shared by the run writer and kvs_results_trace_id): path and dtype given, and
 * turns, when given, that tile the trace. `who` names the caller in messages. */
static kvs_status validate_trace(const kvs_results_db *r, const kvs_results_trace *trace, const char *who) {
    const char *path = r->path;
    if (!trace) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: %s: NULL trace", path, who);
    if (!trace->path || !trace->dtype)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: %s: trace path and dtype are required", path, who);
    if (trace->turns) { /* the turns must tile the trace: plots draw its turn boundaries from them */
        if (trace->n_turns < 1)
            return kvs_fail(KVS_ERR_INVALID_ARG, "%s: %s: trace turns given with n_turns %" PRId64, path, who,
                            trace->n_turns);
        for (int64_t i = 0; i < trace->n_turns; i++) {
            const kvs_turn *u = &trace->turns[i];
            int64_t want = i ? trace->turns[i - 1].end : 0;
            if (u->begin != want)
                return kvs_fail(KVS_ERR_INVALID_ARG,
                                "%s: %s: trace turn %" PRId64 " begins at %" PRId64 ", not %s%" PRId64, path, who, i,
                                u->begin, i ? "where the previous turn ended, " : "", want);
            if (u->prompt_end < u->begin || u->end < u->prompt_end)
                return kvs_fail(KVS_ERR_INVALID_ARG,
                                "%s: %s: trace turn %" PRId64 ": positions %" PRId64 ", %" PRId64 ", %" PRId64
                                " are not begin <= prompt_end <= end",
                                path, who, i, u->begin, u->prompt_end, u->end);
        }
        if (trace->turns[trace->n_turns - 1].end != trace->n_positions)
            return kvs_fail(KVS_ERR_INVALID_ARG,
                            "%s: %s: the trace turns end at %" PRId64 ", not at n_positions %" PRId64, path, who,
                            trace->turns[trace->n_turns - 1].end, trace->n_positions);
    }
    return KVS_OK;
}

static kvs_status validate_run(const kvs_results_db *r, const kvs_results_trace *trace, const kvs_results_run *run,
                               const kvs_results_agg *layer_aggs, int32_t n_layers, const kvs_results_agg *run_agg,
                               const kvs_results_step *steps, int64_t n_steps) {
    const char *path = r->path;
    if (!trace || !run) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: NULL trace or run", path);
    kvs_status vst = validate_trace(r, trace, "write_run");
    if (vst != KVS_OK) return vst;
    if (!run->policy || !run->policy[0] || !run->params || !run->kvsim_version)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: policy, params and kvsim_version are required", path);
    if (!one_of(run->measure, "decode", "prefill", "all"))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: measure '%s' is not 'decode', 'prefill' or 'all'", path,
                        run->measure ? run->measure : "(null)");
    if (!one_of(run->status, "complete", "failed", NULL))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: status '%s' is not 'complete' or 'failed'", path,
                        run->status ? run->status : "(null)");
    if (run->budget_scope && !one_of(run->budget_scope, "every_step", "prompt", "none"))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: budget_scope '%s' is not 'every_step', 'prompt' or 'none'",
                        path, run->budget_scope);
    if (run->layout && !one_of(run->layout, "per_kv_head", "per_query_head", NULL))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: write_run: layout '%s' is not 'per_kv_head' or 'per_query_head'",
                        path, run->layout);
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
    /* A database migrated from v1 keeps v1's NOT NULL on steps.attended_tokens: say so before writing. */
    for (int m = 0; m < KVS_N_METRICS; m++) {
        if (!in_list(r->notnull[T_STEPS], kvs_metric_table[m].name)) continue;
        for (int64_t i = 0; i < n_steps; i++)
            if (isnan(steps[i].v[m]))
                return kvs_fail(KVS_ERR_INVALID_ARG,
                                "%s: write_run: step %" PRId64 " has no %s, but steps.%s is NOT NULL in this database "
                                "(a column kept from schema version 1)",
                                path, i, kvs_metric_table[m].name, kvs_metric_table[m].name);
    }
    return KVS_OK;
}

int kvs_results_bind_real(sqlite3_stmt *st, int i, double v) {
    return isnan(v) ? sqlite3_bind_null(st, i) : sqlite3_bind_double(st, i, v);
}
#define bind_real kvs_results_bind_real

static int bind_text_or_null(sqlite3_stmt *st, int i, const char *s) {
    return s ? sqlite3_bind_text(st, i, s, -1, SQLITE_STATIC) : sqlite3_bind_null(st, i);
}

/* Binds the KVS_N_METRICS x KVS_N_STATS statistics of `a` starting at parameter `first`; the statistics of a
 * metric without samples (n = 0) are NULL. */
static int bind_agg(sqlite3_stmt *st, int first, const kvs_results_agg *a) {
    int rc = SQLITE_OK, p = first;
    for (int m = 0; m < KVS_N_METRICS && rc == SQLITE_OK; m++) {
        const kvs_results_stat *s = &a->m[m];
        rc = sqlite3_bind_int64(st, p++, s->n);
        const double v[KVS_N_STATS - 1] = {s->mean, s->p50, s->p95, s->max, s->min};
        for (int k = 0; k < KVS_N_STATS - 1 && rc == SQLITE_OK; k++)
            rc = s->n == 0 ? sqlite3_bind_null(st, p++) : bind_real(st, p++, v[k]);
    }
    return rc;
}

/* "INSERT INTO <table> (<lead>, <every metric_stat column>) VALUES (?, ...)" */
static void agg_insert_sql(sbuf *b, const char *table, const char *lead, int n_lead) {
    sb_printf(b, "INSERT INTO %s (%s", table, lead);
    for (int m = 0; m < KVS_N_METRICS; m++)
        for (int s = 0; s < KVS_N_STATS; s++) sb_printf(b, ", %s_%s", kvs_metric_table[m].name, kvs_stat_names[s]);
    sb_printf(b, ") VALUES (?");
    for (int i = 1; i < n_lead + KVS_N_METRICS * KVS_N_STATS; i++) sb_printf(b, ", ?");
    sb_printf(b, ")");
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
        goto cleanup;
    }
    /* The turns, with the row (OR IGNORE: a row that has them keeps them; one written without them, or before
     * the table existed, gains them). */
    if (t->turns) {
        sqlite3_finalize(ins);
        ins = NULL;
        KVS_TRY(rc = prepare(r, "INSERT OR IGNORE INTO trace_turns (trace_id, turn, begin_pos, prompt_end, end_pos) "
                                "VALUES (?1, ?2, ?3, ?4, ?5)",
                             &ins, "cannot prepare the trace_turns insert"));
        for (int64_t i = 0; i < t->n_turns; i++) {
            sqlite3_bind_int64(ins, 1, *trace_id);
            sqlite3_bind_int64(ins, 2, i);
            sqlite3_bind_int64(ins, 3, t->turns[i].begin);
            sqlite3_bind_int64(ins, 4, t->turns[i].prompt_end);
            sqlite3_bind_int64(ins, 5, t->turns[i].end);
            KVS_TRY(rc = step_done(r, ins, "cannot insert a trace_turns row"));
        }
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
    if (r->readonly) return kvs_fail(KVS_ERR_STATE, "%s: write_run: the database was opened read-only", r->path);
    kvs_status rc = validate_run(r, trace, run, layer_aggs, n_layers, run_agg, steps, n_steps);
    if (rc != KVS_OK) return rc; /* refused input, nothing attempted: not a failed write */

    sqlite3_stmt *ins_run = NULL, *ins_layer = NULL, *ins_summary = NULL, *ins_step = NULL;
    int in_txn = 0;
    int64_t trace_id = 0, id = 0;
    sbuf sql = {0};

    KVS_TRY(rc = exec_sql(r, "BEGIN IMMEDIATE", "cannot start the run transaction"));
    in_txn = 1;
    KVS_TRY(rc = find_or_insert_trace(r, trace, &trace_id));

    KVS_TRY(rc = prepare(r, "INSERT INTO runs (trace_id, policy, params, budget_tokens, budget_fraction, is_oracle, "
                            "measure, status, error, wall_seconds, kvsim_version, budget_scope, layout, notes, options, codec, page) "
                            "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
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
    sqlite3_bind_text(ins_run, 12, run->budget_scope ? run->budget_scope : "every_step", -1, SQLITE_STATIC);
    sqlite3_bind_text(ins_run, 13, run->layout ? run->layout : "per_kv_head", -1, SQLITE_STATIC);
    bind_text_or_null(ins_run, 14, run->notes);
    bind_text_or_null(ins_run, 15, run->options);
    bind_text_or_null(ins_run, 16, run->codec && run->codec[0] ? run->codec : NULL);
    if (run->page > 0) sqlite3_bind_int64(ins_run, 17, run->page);
    else sqlite3_bind_null(ins_run, 17);
    KVS_TRY(rc = step_done(r, ins_run, "cannot insert the run row"));
    id = sqlite3_last_insert_rowid(r->db);

    if (n_layers > 0) {
        agg_insert_sql(&sql, "run_layers", "run_id, layer", 2);
        if (sql.oom) {
            rc = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", r->path);
            goto cleanup;
        }
        KVS_TRY(rc = prepare(r, sql.p, &ins_layer, "cannot prepare run_layers insert"));
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
        sb_free(&sql);
        agg_insert_sql(&sql, "run_summary", "run_id", 1);
        if (sql.oom) {
            rc = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", r->path);
            goto cleanup;
        }
        KVS_TRY(rc = prepare(r, sql.p, &ins_summary, "cannot prepare run_summary insert"));
        sqlite3_bind_int64(ins_summary, 1, id);
        if (bind_agg(ins_summary, 2, run_agg) != SQLITE_OK) {
            rc = db_fail(r->db, r->path, "cannot bind the run_summary row");
            goto cleanup;
        }
        KVS_TRY(rc = step_done(r, ins_summary, "cannot insert the run_summary row"));
    }
    if (n_steps > 0) {
        sb_free(&sql);
        sb_printf(&sql, "INSERT INTO steps (run_id, layer, q_head, position");
        for (int m = 0; m < KVS_N_METRICS; m++) sb_printf(&sql, ", %s", kvs_metric_table[m].name);
        sb_printf(&sql, ") VALUES (?1, ?2, ?3, ?4");
        for (int m = 0; m < KVS_N_METRICS; m++) sb_printf(&sql, ", ?%d", 5 + m);
        sb_printf(&sql, ")");
        if (sql.oom) {
            rc = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", r->path);
            goto cleanup;
        }
        KVS_TRY(rc = prepare(r, sql.p, &ins_step, "cannot prepare steps insert"));
        sqlite3_bind_int64(ins_step, 1, id);
        for (int64_t i = 0; i < n_steps; i++) {
            const kvs_results_step *s = &steps[i];
            sqlite3_bind_int(ins_step, 2, s->layer);
            sqlite3_bind_int(ins_step, 3, s->q_head);
            sqlite3_bind_int64(ins_step, 4, s->position);
            /* INTEGER columns (token counts) store an integral double as an integer by column affinity. */
            for (int m = 0; m < KVS_N_METRICS; m++) bind_real(ins_step, 5 + m, s->v[m]);
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
    sb_free(&sql);
    sqlite3_finalize(ins_run);
    sqlite3_finalize(ins_layer);
    sqlite3_finalize(ins_summary);
    sqlite3_finalize(ins_step);
    /* Nothing of a failed write may remain: ROLLBACK undoes the trace row too. */
    if (in_txn && sqlite3_get_autocommit(r->db) == 0) sqlite3_exec(r->db, "ROLLBACK", NULL, NULL, NULL);
    if (rc != KVS_OK) r->write_failed = 1;
    return rc;
}

/* ------------------------------------------------------------------------------------------------
 * Reading
 * ---------------------------------------------------------------------------------------------- */

kvs_status kvs_results_column_parse(const char *name, kvs_metric *metric, kvs_stat_kind *stat) {
    for (int m = 0; name && m < KVS_N_METRICS; m++) {
        size_t n = strlen(kvs_metric_table[m].name);
        if (strncmp(name, kvs_metric_table[m].name, n) != 0 || name[n] != '_') continue;
        for (int s = 0; s < KVS_N_STATS; s++)
            if (!strcmp(name + n + 1, kvs_stat_names[s])) {
                if (metric) *metric = (kvs_metric)m;
                if (stat) *stat = (kvs_stat_kind)s;
                return KVS_OK;
            }
    }
    return kvs_fail(KVS_ERR_INVALID_ARG, "unknown metric column '%s' (expected <metric>_<stat>, e.g. out_err_p95)",
                    name ? name : "(null)");
}

double kvs_results_stat_value(const kvs_results_stat *s, kvs_stat_kind k) {
    if (!s) return NAN;
    switch (k) {
    case KVS_STAT_N: return (double)s->n;
    case KVS_STAT_MEAN: return s->n ? s->mean : NAN;
    case KVS_STAT_P50: return s->n ? s->p50 : NAN;
    case KVS_STAT_P95: return s->n ? s->p95 : NAN;
    case KVS_STAT_MAX: return s->n ? s->max : NAN;
    case KVS_STAT_MIN: return s->n ? s->min : NAN;
    default: return NAN;
    }
}

/* Appends "alias.col" when table `t` has column `col`, else "NULL" (a v1 database). */
static void sb_col(sbuf *b, const kvs_results_db *r, int t, const char *alias, const char *col) {
    if (has_col(r, t, col)) sb_printf(b, ", %s.%s", alias, col);
    else sb_printf(b, ", NULL");
}

/* Appends the KVS_N_METRICS x KVS_N_STATS aggregate columns of table t (alias) to a select list. */
static void sb_agg_cols(sbuf *b, const kvs_results_db *r, int t, const char *alias) {
    char col[128];
    for (int m = 0; m < KVS_N_METRICS; m++)
        for (int s = 0; s < KVS_N_STATS; s++) {
            snprintf(col, sizeof col, "%s_%s", kvs_metric_table[m].name, kvs_stat_names[s]);
            sb_col(b, r, t, alias, col);
        }
}

double kvs_results_col_real(sqlite3_stmt *st, int i) {
    return sqlite3_column_type(st, i) == SQLITE_NULL ? NAN : sqlite3_column_double(st, i);
}
#define col_real kvs_results_col_real

/* Reads the aggregate columns starting at `first` into *a: NULL n -> 0, NULL statistic -> NaN, and every
 * statistic of a metric with no samples NaN. */
/* A paged run's page score rule from its options ("...,page=16,page_score=max"): "max" or "sum" into buf, "" for
 * the count rule, an unknown word or none recorded (the count rule was the only one before the score rules). */
static void option_page_score(const char *opts, char *buf, size_t cap) {
    buf[0] = '\0';
    for (const char *p = opts; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        if (strncmp(p, "page_score=", 11) != 0) continue;
        const char *v = p + 11;
        size_t n = strcspn(v, ",");
        if ((n == 3 && !strncmp(v, "max", 3)) || (n == 3 && !strncmp(v, "sum", 3))) snprintf(buf, cap, "%.3s", v);
        return;
    }
}

static void read_agg(sqlite3_stmt *st, int first, int32_t layer, kvs_results_agg *a) {
    a->layer = layer;
    int c = first;
    for (int m = 0; m < KVS_N_METRICS; m++) {
        kvs_results_stat *s = &a->m[m];
        s->n = sqlite3_column_type(st, c) == SQLITE_NULL ? 0 : sqlite3_column_int64(st, c);
        c++;
        double *v[KVS_N_STATS - 1] = {&s->mean, &s->p50, &s->p95, &s->max, &s->min};
        for (int k = 0; k < KVS_N_STATS - 1; k++, c++) *v[k] = s->n ? col_real(st, c) : NAN;
    }
}

static void agg_nan(kvs_results_agg *a, int32_t layer) {
    a->layer = layer;
    for (int m = 0; m < KVS_N_METRICS; m++)
        a->m[m] = (kvs_results_stat){.n = 0, .mean = NAN, .p50 = NAN, .p95 = NAN, .max = NAN, .min = NAN};
}

/* strdup of a text column; NULL stays NULL. *oom set when a copy fails. */
char *kvs_results_col_dup(sqlite3_stmt *st, int i, int *oom) {
    const char *s = (const char *)sqlite3_column_text(st, i);
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d && oom) *oom = 1;
    return d;
}
#define col_dup kvs_results_col_dup

static void row_free_strings(kvs_results_run_row *w) {
    char *strs[] = {w->trace_path, w->model,   w->dtype,  w->policy, w->params,        w->measure,    w->budget_scope,
                    w->layout,     w->notes,   w->status, w->error,  w->kvsim_version, w->created_at,
                    w->options,    w->trace_sha256, w->codec};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) free(strs[i]);
    free(w->layer_aggs);
}

void kvs_results_run_rows_free(kvs_results_run_row *rows, int64_t n) {
    if (!rows) return;
    for (int64_t i = 0; i < n; i++) row_free_strings(&rows[i]);
    free(rows);
}

/* Reads the run_layers rows of run `id` into w->layer_aggs (statement `st` prepared with ?1 = run id). */
static kvs_status read_layers(kvs_results_db *r, sqlite3_stmt *st, kvs_results_run_row *w) {
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, w->id);
    int32_t cap = 0;
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        if (w->n_layer_aggs == cap) {
            int32_t ncap = cap ? 2 * cap : 8;
            kvs_results_agg *a = realloc(w->layer_aggs, (size_t)ncap * sizeof *a);
            if (!a) {
                sqlite3_reset(st);
                return kvs_fail(KVS_ERR_NOMEM, "%s: out of memory reading run_layers", r->path);
            }
            w->layer_aggs = a;
            cap = ncap;
        }
        read_agg(st, 1, sqlite3_column_int(st, 0), &w->layer_aggs[w->n_layer_aggs++]);
    }
    sqlite3_reset(st);
    if (src != SQLITE_DONE) return db_fail(r->db, r->path, "cannot read run_layers");
    return KVS_OK;
}

kvs_status kvs_results_query_runs(kvs_results_db *r, const kvs_results_filter *f, kvs_results_run_row **rows,
                                  int64_t *n) {
    if (!r || !r->db || !rows || !n) return kvs_fail(KVS_ERR_INVALID_ARG, "query_runs: NULL argument");
    *rows = NULL;
    *n = 0;
    static const kvs_results_filter all_complete = {0};
    if (!f) f = &all_complete;
    sbuf sql = {0}, lsql = {0};
    sqlite3_stmt *st = NULL, *lst = NULL;
    kvs_results_run_row *out = NULL;
    int64_t count = 0, cap = 0;
    kvs_status rc = KVS_OK;

    sb_printf(&sql, "SELECT r.id, r.trace_id, t.path, t.model, t.dtype, t.n_positions, t.prompt_len, t.n_turns, "
                    "t.n_layers, t.n_heads, t.n_kv_heads, t.head_dim, r.policy, r.params, r.budget_tokens, "
                    "r.budget_fraction, r.is_oracle, r.measure");
    sb_col(&sql, r, T_RUNS, "r", "budget_scope");
    sb_col(&sql, r, T_RUNS, "r", "layout");
    sb_col(&sql, r, T_RUNS, "r", "notes");
    sb_printf(&sql, ", r.status, r.error, r.wall_seconds, r.kvsim_version, r.created_at");
    sb_col(&sql, r, T_RUNS, "r", "options");
    sb_col(&sql, r, T_RUNS, "r", "codec");
    sb_col(&sql, r, T_RUNS, "r", "page");
    /* The trace's content hash lives in the sweep family's table, which a database that never saw a replay or
     * sweep recording it does not have: then the hash reads as not recorded. */
    int has_sha = kvs_results_table_exists(r, "sweep_traces");
    if (has_sha < 0) {
        rc = KVS_ERR_DB;
        goto cleanup;
    }
    sb_printf(&sql, has_sha ? ", h.sha256" : ", NULL");
    sb_printf(&sql, ", s.run_id IS NOT NULL");
    sb_agg_cols(&sql, r, T_RUN_SUMMARY, "s");
    sb_printf(&sql, " FROM runs r JOIN traces t ON t.id = r.trace_id LEFT JOIN run_summary s ON s.run_id = r.id%s "
                    "WHERE (?1 OR r.status = 'complete') AND (?2 IS NULL OR r.policy = ?2) AND (?3 <= 0 OR r.id = ?3) "
                    "AND (?4 <= 0 OR r.budget_tokens = ?4) "
                    "AND (?5 IS NULL OR t.path = ?5 OR substr(t.path, -length(?5) - 1) = '/' || ?5 "
                    "OR (?8 IS NOT NULL AND %s = ?8)) "
                    "AND (?6 IS NULL OR t.model = ?6) AND (?7 IS NULL OR r.measure = ?7) ORDER BY r.id",
              has_sha ? " LEFT JOIN sweep_traces h ON h.trace_id = r.trace_id" : "", has_sha ? "h.sha256" : "NULL");
    enum { C_OPTIONS = 26, C_CODEC = 27, C_PAGE = 28, C_SHA = 29, C_HAS_AGG = 30, C_AGG = 31 }; /* columns of the select list above */
    if (f->with_layers) {
        sb_printf(&lsql, "SELECT l.layer");
        sb_agg_cols(&lsql, r, T_RUN_LAYERS, "l");
        sb_printf(&lsql, " FROM run_layers l WHERE l.run_id = ?1 ORDER BY l.layer");
    }
    if (sql.oom || lsql.oom) {
        rc = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", r->path);
        goto cleanup;
    }
    KVS_TRY(rc = prepare(r, sql.p, &st, "cannot query runs"));
    if (f->with_layers) KVS_TRY(rc = prepare(r, lsql.p, &lst, "cannot query run_layers"));
    sqlite3_bind_int(st, 1, f->include_failed ? 1 : 0);
    bind_text_or_null(st, 2, f->policy);
    sqlite3_bind_int64(st, 3, f->run_id);
    sqlite3_bind_int64(st, 4, f->budget_tokens);
    bind_text_or_null(st, 5, f->trace_path);
    bind_text_or_null(st, 6, f->model);
    bind_text_or_null(st, 7, f->measure);
    bind_text_or_null(st, 8, f->trace_path ? f->trace_sha256 : NULL);
    int src, oom = 0;
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        if (count == cap) {
            int64_t ncap = cap ? 2 * cap : 16;
            kvs_results_run_row *p = realloc(out, (size_t)ncap * sizeof *p);
            if (!p) {
                rc = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory reading runs", r->path);
                goto cleanup;
            }
            out = p;
            cap = ncap;
        }
        kvs_results_run_row *w = &out[count++];
        memset(w, 0, sizeof *w);
        w->id = sqlite3_column_int64(st, 0);
        w->trace_id = sqlite3_column_int64(st, 1);
        w->trace_path = col_dup(st, 2, &oom);
        w->model = col_dup(st, 3, &oom);
        w->dtype = col_dup(st, 4, &oom);
        w->n_positions = sqlite3_column_int64(st, 5);
        w->prompt_len = sqlite3_column_int64(st, 6);
        w->n_turns = sqlite3_column_int64(st, 7);
        w->n_layers = sqlite3_column_int(st, 8);
        w->n_heads = sqlite3_column_int(st, 9);
        w->n_kv_heads = sqlite3_column_int(st, 10);
        w->head_dim = sqlite3_column_int(st, 11);
        w->policy = col_dup(st, 12, &oom);
        w->params = col_dup(st, 13, &oom);
        w->budget_tokens = sqlite3_column_int64(st, 14);
        w->budget_fraction = sqlite3_column_type(st, 15) == SQLITE_NULL ? -1.0 : sqlite3_column_double(st, 15);
        w->is_oracle = sqlite3_column_int(st, 16);
        w->measure = col_dup(st, 17, &oom);
        w->budget_scope = col_dup(st, 18, &oom);
        w->layout = col_dup(st, 19, &oom);
        w->notes = col_dup(st, 20, &oom);
        w->status = col_dup(st, 21, &oom);
        w->error = col_dup(st, 22, &oom);
        w->wall_seconds = col_real(st, 23);
        w->kvsim_version = col_dup(st, 24, &oom);
        w->created_at = col_dup(st, 25, &oom);
        w->options = col_dup(st, C_OPTIONS, &oom);
        w->codec = col_dup(st, C_CODEC, &oom);
        w->page = sqlite3_column_type(st, C_PAGE) == SQLITE_NULL ? 0 : sqlite3_column_int64(st, C_PAGE);
        option_page_score(w->page > 0 ? w->options : NULL, w->page_score, sizeof w->page_score);
        w->trace_sha256 = col_dup(st, C_SHA, &oom);
        w->has_agg = sqlite3_column_int(st, C_HAS_AGG) ? 1 : 0;
        if (w->has_agg) read_agg(st, C_AGG, -1, &w->agg);
        else agg_nan(&w->agg, -1);
        if (oom) {
            rc = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory reading runs", r->path);
            goto cleanup;
        }
        if (f->with_layers) KVS_TRY(rc = read_layers(r, lst, w));
    }
    if (src != SQLITE_DONE) {
        rc = db_fail(r->db, r->path, "cannot query runs");
        goto cleanup;
    }
    *rows = out;
    *n = count;
    out = NULL;
    count = 0;
cleanup:
    kvs_results_run_rows_free(out, count);
    sqlite3_finalize(st);
    sqlite3_finalize(lst);
    sb_free(&sql);
    sb_free(&lsql);
    return rc;
}

void kvs_results_trace_label(const kvs_results_run_row *r, char *buf, size_t cap) {
    if (!buf || cap == 0) return;
    if (r && r->trace_sha256 && r->trace_sha256[0]) {
        snprintf(buf, cap, "%s@%.8s", r->model ? r->model : "?", r->trace_sha256);
        return;
    }
    const char *path = r ? r->trace_path : NULL;
    if (!path || !path[0]) {
        snprintf(buf, cap, "?");
        return;
    }
    snprintf(buf, cap, "%s", kvs_path_base(path));
}

/* The decimal integer value of key `key` in a "k=v,k=v" list into *v: 1 when present and a whole int, else 0. */
static int option_int(const char *opts, const char *key, int *v) {
    size_t kn = strlen(key);
    for (const char *p = opts; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        if (strncmp(p, key, kn) != 0 || p[kn] != '=') continue;
        const char *num = p + kn + 1;
        if (!(num[0] >= '0' && num[0] <= '9')) return 0; /* strtol would take a sign or blanks */
        char *end = NULL;
        errno = 0;
        long x = strtol(num, &end, 10);
        if (end == num || (*end != ',' && *end != '\0') || errno == ERANGE || x < INT_MIN || x > INT_MAX) return 0;
        *v = (int)x;
        return 1;
    }
    return 0;
}

int kvs_results_run_bytes(const kvs_results_run_row *r, int *kv_bytes, int *aux_bytes) {
    int kv = 0, aux = 0;
    if (!r || !r->options || !option_int(r->options, "kv_bytes", &kv) || !option_int(r->options, "aux_bytes", &aux))
        return 0;
    if (kv_bytes) *kv_bytes = kv;
    if (aux_bytes) *aux_bytes = aux;
    return 1;
}

kvs_status kvs_results_check_runs(kvs_results_db *r) {
    if (!r || !r->db) return kvs_fail(KVS_ERR_INVALID_ARG, "check_runs: NULL results database");
    /* quick_check(TABLE) walks the b-trees of one table and its indexes: the cost of the rows a listing reads,
     * not of the whole file (steps, by far the largest table, is read and so checked by its own readers) */
    static const char *const tables[] = {"traces", "runs", "run_summary", "run_layers", "trace_turns", "sweep_traces"};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        int has = kvs_results_table_exists(r, tables[i]);
        if (has < 0) return KVS_ERR_DB;
        if (!has) continue;
        char sql[64];
        snprintf(sql, sizeof sql, "PRAGMA quick_check(%s)", tables[i]);
        sqlite3_stmt *st = NULL;
        kvs_status rc = prepare(r, sql, &st, "cannot check the database");
        if (rc != KVS_OK) return rc;
        int src = sqlite3_step(st);
        const char *msg = src == SQLITE_ROW ? (const char *)sqlite3_column_text(st, 0) : NULL;
        if (src == SQLITE_ROW && msg && !strcmp(msg, "ok")) rc = KVS_OK;
        else if (src == SQLITE_ROW) {
            /* SQLite's finding on one line, without its "*** in database main ***" heading */
            char what[256];
            const char *m = msg ? msg : "?";
            if (!strncmp(m, "*** in database main ***\n", 25)) m += 25;
            snprintf(what, sizeof what, "%s", m);
            for (char *c = what; *c; c++)
                if (*c == '\n') *c = ' ';
            rc = kvs_fail(KVS_ERR_DB, "%s: database disk image is malformed (table %s: %s)", r->path, tables[i], what);
        }
        else rc = kvs_fail(KVS_ERR_DB, "%s: cannot check table %s: %s", r->path, tables[i], sqlite3_errmsg(r->db));
        sqlite3_finalize(st);
        if (rc != KVS_OK) return rc;
    }
    return KVS_OK;
}

void kvs_results_series_free(kvs_results_series *s) {
    if (!s) return;
    free(s->position);
    free(s->value);
    memset(s, 0, sizeof *s);
}

kvs_status kvs_results_query_turns(kvs_results_db *r, int64_t trace_id, kvs_turn **turns, int64_t *n) {
    if (!r || !r->db || !turns || !n) return kvs_fail(KVS_ERR_INVALID_ARG, "query_turns: NULL argument");
    *turns = NULL;
    *n = 0;
    if (!has_col(r, T_TRACE_TURNS, "trace_id")) return KVS_OK; /* v1, or v2 before the table: no turn info */
    sqlite3_stmt *st = NULL;
    kvs_status rc = prepare(r, "SELECT begin_pos, prompt_end, end_pos FROM trace_turns WHERE trace_id = ?1 "
                               "ORDER BY turn",
                            &st, "cannot query trace_turns");
    if (rc != KVS_OK) return rc;
    sqlite3_bind_int64(st, 1, trace_id);
    kvs_turn *out = NULL;
    int64_t count = 0, cap = 0;
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        if (count == cap) {
            int64_t ncap = cap ? 2 * cap : 8;
            kvs_turn *p = realloc(out, (size_t)ncap * sizeof *p);
            if (!p) {
                rc = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory reading trace_turns", r->path);
                goto cleanup;
            }
            out = p;
            cap = ncap;
        }
        out[count++] = (kvs_turn){.begin = sqlite3_column_int64(st, 0), .prompt_end = sqlite3_column_int64(st, 1),
                                  .end = sqlite3_column_int64(st, 2)};
    }
    if (src != SQLITE_DONE) {
        rc = db_fail(r->db, r->path, "cannot query trace_turns");
        goto cleanup;
    }
    *turns = count ? out : NULL;
    *n = count;
    if (count) out = NULL;
cleanup:
    free(out);
    sqlite3_finalize(st);
    return rc;
}

kvs_status kvs_results_query_steps(kvs_results_db *r, int64_t run_id, int32_t layer, kvs_metric metric,
                                   kvs_results_series *out) {
    if (!r || !r->db || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "query_steps: NULL argument");
    memset(out, 0, sizeof *out);
    if ((int)metric < 0 || (int)metric >= KVS_N_METRICS)
        return kvs_fail(KVS_ERR_INVALID_ARG, "query_steps: bad metric %d", (int)metric);
    const char *col = kvs_metric_table[metric].name;
    if (!has_col(r, T_STEPS, col)) return KVS_OK; /* a v1 database: never recorded */
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT position, avg(%s) FROM steps WHERE run_id = ?1 AND (?2 < 0 OR layer = ?2) AND %s IS NOT NULL "
             "GROUP BY position ORDER BY position",
             col, col);
    sqlite3_stmt *st = NULL;
    kvs_status rc = prepare(r, sql, &st, "cannot query steps");
    if (rc != KVS_OK) return rc;
    sqlite3_bind_int64(st, 1, run_id);
    sqlite3_bind_int(st, 2, layer);
    int64_t cap = 0;
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        if (out->n == cap) {
            int64_t ncap = cap ? 2 * cap : 256;
            int64_t *p = realloc(out->position, (size_t)ncap * sizeof *p);
            if (p) out->position = p;
            double *v = p ? realloc(out->value, (size_t)ncap * sizeof *v) : NULL;
            if (!p || !v) {
                rc = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory reading steps", r->path);
                goto cleanup;
            }
            out->value = v;
            cap = ncap;
        }
        out->position[out->n] = sqlite3_column_int64(st, 0);
        out->value[out->n] = sqlite3_column_double(st, 1);
        out->n++;
    }
    if (src != SQLITE_DONE) rc = db_fail(r->db, r->path, "cannot query steps");
cleanup:
    sqlite3_finalize(st);
    if (rc != KVS_OK) kvs_results_series_free(out);
    return rc;
}

/* ------------------------------------------------------------------------------------------------
 * Shared with the table families (results/results_internal.h)
 * ---------------------------------------------------------------------------------------------- */

sqlite3 *kvs_results_sqlite(kvs_results_db *r) { return r ? r->db : NULL; }
const char *kvs_results_path(const kvs_results_db *r) { return r && r->path ? r->path : "(results database)"; }
int kvs_results_is_readonly(const kvs_results_db *r) { return r ? r->readonly : 1; }

kvs_status kvs_results_db_error(kvs_results_db *r, const char *what) {
    return db_fail(r ? r->db : NULL, kvs_results_path(r), what);
}

kvs_status kvs_results_exec(kvs_results_db *r, const char *sql, const char *what) { return exec_sql(r, sql, what); }

kvs_status kvs_results_prepare(kvs_results_db *r, const char *sql, sqlite3_stmt **st, const char *what) {
    return prepare(r, sql, st, what);
}

/* The one spelling of a run's codec in its names: " [SPEC]", "" without a codec. */
static const char *codec_open(const kvs_results_run_row *r) { return r->codec && r->codec[0] ? " [" : ""; }
static const char *codec_spec(const kvs_results_run_row *r) { return r->codec ? r->codec : ""; }
static const char *codec_close(const kvs_results_run_row *r) { return r->codec && r->codec[0] ? "]" : ""; }

/* ... and of its page size: " [page N]" (" [page N max]" under a score rule), "" at token granularity. */
static const char *page_text(int64_t page, const char *rule, char *buf, size_t cap) {
    if (page <= 0) return "";
    rule = rule ? rule : "";
    snprintf(buf, cap, " [page %lld%s%s]", (long long)page, rule[0] ? " " : "", rule);
    return buf;
}

void kvs_results_config_label_rule(const char *policy, const char *params, const char *codec, int64_t page,
                                   const char *page_score, char *buf, size_t cap) {
    if (!cap) return;
    params = params ? params : "";
    codec = codec ? codec : "";
    char pg[48];
    snprintf(buf, cap, "%s%s%s%s%s%s%s%s", policy ? policy : "?", params[0] ? " (" : "", params, params[0] ? ")" : "",
             codec[0] ? " [" : "", codec, codec[0] ? "]" : "", page_text(page, page_score, pg, sizeof pg));
}

void kvs_results_config_label(const char *policy, const char *params, const char *codec, int64_t page, char *buf,
                              size_t cap) {
    kvs_results_config_label_rule(policy, params, codec, page, NULL, buf, cap);
}

void kvs_results_run_label(const kvs_results_run_row *r, char *buf, size_t cap) {
    kvs_results_config_label_rule(r->policy, r->params, r->codec, r->page, r->page_score, buf, cap);
}

void kvs_results_run_params_label(const kvs_results_run_row *r, char *buf, size_t cap) {
    if (!cap) return;
    char pg[48];
    snprintf(buf, cap, "%s%s%s%s%s", r->params && r->params[0] ? r->params : "-", codec_open(r), codec_spec(r),
             codec_close(r), page_text(r->page, r->page_score, pg, sizeof pg));
}

int kvs_results_has_column(kvs_results_db *r, const char *table, const char *col, const char *what) {
    sqlite3_stmt *q = NULL;
    if (prepare(r, "SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2", &q, what) != KVS_OK) return -1;
    sqlite3_bind_text(q, 1, table, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, col, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    if (rc == SQLITE_ROW) return 1;
    if (rc == SQLITE_DONE) return 0;
    kvs_results_db_error(r, what);
    return -1;
}

kvs_status kvs_results_step_done(kvs_results_db *r, sqlite3_stmt *st, const char *what) {
    return step_done(r, st, what);
}

kvs_status kvs_results_txn_begin(kvs_results_db *r, const char *what) {
    if (!r || !r->db) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: NULL results database", what);
    if (r->readonly) return kvs_fail(KVS_ERR_STATE, "%s: %s: the database was opened read-only", r->path, what);
    kvs_status rc = exec_sql(r, "BEGIN IMMEDIATE", what);
    if (rc != KVS_OK) r->write_failed = 1;
    return rc;
}

kvs_status kvs_results_txn_commit(kvs_results_db *r, const char *what) {
    if (!r || !r->db) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: NULL results database", what);
    kvs_status rc = exec_sql(r, "COMMIT", what);
    if (rc != KVS_OK) kvs_results_txn_rollback(r); /* a COMMIT that failed may leave the transaction open */
    return rc;
}

void kvs_results_txn_rollback(kvs_results_db *r) {
    if (!r) return;
    r->write_failed = 1; /* called on a family's error paths only */
    if (r->db && !sqlite3_get_autocommit(r->db)) sqlite3_exec(r->db, "ROLLBACK", NULL, NULL, NULL);
}

int kvs_results_table_exists(kvs_results_db *r, const char *name) {
    sqlite3_stmt *st = NULL;
    if (prepare(r, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1", &st,
                "cannot look up a table") != KVS_OK)
        return -1;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st), found = rc == SQLITE_ROW;
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        db_fail(r->db, r->path, "cannot look up a table");
        found = -1;
    }
    sqlite3_finalize(st);
    return found;
}

kvs_status kvs_results_trace_id(kvs_results_db *r, const kvs_results_trace *trace, int64_t *trace_id) {
    if (!r || !r->db || !trace_id) return kvs_fail(KVS_ERR_INVALID_ARG, "trace_id: NULL argument");
    if (r->readonly) return kvs_fail(KVS_ERR_STATE, "%s: trace_id: the database was opened read-only", r->path);
    kvs_status st = validate_trace(r, trace, "trace_id");
    if (st != KVS_OK) return st;
    return find_or_insert_trace(r, trace, trace_id);
}

kvs_results_trace kvs_results_trace_of(const char *path, const kvs_trace_info *info) {
    kvs_results_trace t = {
        .path = path, .model_name = info->model.model_name, .n_positions = info->n_positions,
        .prompt_len = info->prompt_len, .n_turns = info->n_turns, .n_layers = info->model.n_layers,
        .n_heads = info->model.n_heads, .n_kv_heads = info->model.n_kv_heads, .head_dim = info->model.head_dim,
        .dtype = kvs_dtype_name((kvs_dtype)info->capture.dtype), .file_bytes = info->file_bytes,
        .turns = info->turns,
    };
    return t;
}
