/* results_sweep.c — the "sweep" table family (results/SCHEMA.md "Family sweep"): completed tasks of `kvsim sweep`,
 * trace content hashes, and `kvsim merge` of shard databases (run identity, conflicts, atomic replacement).
 * Follows the family rules of results/SCHEMA.md "Table families" through results/results_internal.h.
 */
#include "results_sweep.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "results_internal.h"

static const char sweep_schema[] =
    "CREATE TABLE IF NOT EXISTS sweep_traces (\n"
    "  trace_id INTEGER PRIMARY KEY REFERENCES traces(id) ON DELETE CASCADE,\n"
    "  sha256 TEXT NOT NULL);\n"
    "CREATE INDEX IF NOT EXISTS sweep_traces_sha ON sweep_traces(sha256);\n"
    "CREATE TABLE IF NOT EXISTS sweep_tasks (\n"
    "  task_key TEXT PRIMARY KEY,\n"
    "  study TEXT NOT NULL,\n"
    "  task_index INTEGER NOT NULL,\n"
    "  trace_id INTEGER NOT NULL REFERENCES traces(id) ON DELETE CASCADE,\n"
    "  configs TEXT NOT NULL,\n"
    "  options TEXT NOT NULL,\n"
    "  completed_at TEXT NOT NULL);\n";

#define NOW_SQL "strftime('%Y-%m-%dT%H:%M:%fZ','now')"

/* A run's identity (results_sweep.h): the same trace row, policy, canonical params, budget, measure, replay options
 * (kv/aux bytes, series interval: they change its numbers) and kvsim version, bound as ?1..?7. Two runs of one
 * identity are the same measurement: merge keeps one, and a re-run task replaces its earlier attempt's. */
#define RUN_IDENTITY_SQL                                                                                           \
    "trace_id = ?1 AND policy = ?2 AND params = ?3 AND budget_tokens = ?4 AND measure IS ?5 AND kvsim_version IS ?6 " \
    "AND options IS ?7"

kvs_status kvs_results_sweep_trace(kvs_results_db *db, const kvs_results_trace *trace, const char *sha256,
                                   int64_t *trace_id) {
    if (!db || !trace || !sha256 || !trace_id) return kvs_fail(KVS_ERR_INVALID_ARG, "sweep_trace: NULL argument");
    kvs_status st = kvs_results_txn_begin(db, "sweep trace");
    if (st != KVS_OK) return st;
    sqlite3_stmt *ins = NULL;
    if ((st = kvs_results_exec(db, sweep_schema, "create the sweep tables")) == KVS_OK &&
        (st = kvs_results_trace_id(db, trace, trace_id)) == KVS_OK &&
        (st = kvs_results_prepare(db, "INSERT OR IGNORE INTO sweep_traces (trace_id, sha256) VALUES (?1, ?2)", &ins,
                                  "record the trace hash")) == KVS_OK) {
        sqlite3_bind_int64(ins, 1, *trace_id);
        sqlite3_bind_text(ins, 2, sha256, -1, SQLITE_STATIC);
        st = kvs_results_step_done(db, ins, "record the trace hash");
    }
    sqlite3_finalize(ins);
    if (st == KVS_OK) return kvs_results_txn_commit(db, "sweep trace");
    kvs_results_txn_rollback(db);
    return st;
}

kvs_status kvs_results_sweep_task_done(kvs_results_db *db, const char *task_key, int *done) {
    if (!db || !task_key || !done) return kvs_fail(KVS_ERR_INVALID_ARG, "sweep_task_done: NULL argument");
    *done = 0;
    int has = kvs_results_table_exists(db, "sweep_tasks");
    if (has < 0) return KVS_ERR_DB;
    if (!has) return KVS_OK;
    sqlite3_stmt *q = NULL;
    kvs_status st = kvs_results_prepare(db, "SELECT 1 FROM sweep_tasks WHERE task_key = ?1", &q, "read the tasks");
    if (st != KVS_OK) return st;
    sqlite3_bind_text(q, 1, task_key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) *done = 1;
    else if (rc != SQLITE_DONE) st = kvs_results_db_error(db, "read the tasks");
    sqlite3_finalize(q);
    return st;
}

kvs_status kvs_results_sweep_next_run_id(kvs_results_db *db, int64_t *next) {
    if (!db || !next) return kvs_fail(KVS_ERR_INVALID_ARG, "sweep_next_run_id: NULL argument");
    sqlite3_stmt *q = NULL;
    kvs_status st = kvs_results_prepare(db, "SELECT coalesce(max(id), 0) + 1 FROM runs", &q, "read the run ids");
    if (st != KVS_OK) return st;
    if (sqlite3_step(q) == SQLITE_ROW) *next = sqlite3_column_int64(q, 0);
    else st = kvs_results_db_error(db, "read the run ids");
    sqlite3_finalize(q);
    return st;
}

kvs_status kvs_results_sweep_task_record(kvs_results_db *db, const char *task_key, const char *study,
                                         int32_t task_index, int64_t trace_id, const char *configs,
                                         const char *options, int64_t first_run_id) {
    if (!db || !task_key || !study || !configs || !options)
        return kvs_fail(KVS_ERR_INVALID_ARG, "sweep_task_record: NULL argument");
    kvs_status st = kvs_results_txn_begin(db, "record the task");
    if (st != KVS_OK) return st;
    sqlite3_stmt *ins = NULL, *del = NULL;
    /* the earlier attempt's runs (ON DELETE CASCADE removes their layers, summary and steps) */
    if ((st = kvs_results_prepare(db,
                                  "DELETE FROM runs WHERE trace_id = ?1 AND id < ?2 AND EXISTS (SELECT 1 FROM runs n "
                                  "WHERE n.id >= ?2 AND n.trace_id = runs.trace_id AND n.policy = runs.policy AND "
                                  "n.params = runs.params AND n.budget_tokens = runs.budget_tokens AND n.measure IS "
                                  "runs.measure AND n.kvsim_version IS runs.kvsim_version AND n.options IS runs.options)",
                                  &del, "drop an earlier attempt's runs")) == KVS_OK) {
        sqlite3_bind_int64(del, 1, trace_id);
        sqlite3_bind_int64(del, 2, first_run_id);
        st = kvs_results_step_done(db, del, "drop an earlier attempt's runs");
    }
    sqlite3_finalize(del);
    if (st == KVS_OK && (st = kvs_results_exec(db, sweep_schema, "create the sweep tables")) == KVS_OK &&
        (st = kvs_results_prepare(db,
                                  "INSERT OR IGNORE INTO sweep_tasks (task_key, study, task_index, trace_id, configs, "
                                  "options, completed_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, " NOW_SQL ")",
                                  &ins, "record the task")) == KVS_OK) {
        sqlite3_bind_text(ins, 1, task_key, -1, SQLITE_STATIC);
        sqlite3_bind_text(ins, 2, study, -1, SQLITE_STATIC);
        sqlite3_bind_int(ins, 3, task_index);
        sqlite3_bind_int64(ins, 4, trace_id);
        sqlite3_bind_text(ins, 5, configs, -1, SQLITE_STATIC);
        sqlite3_bind_text(ins, 6, options, -1, SQLITE_STATIC);
        st = kvs_results_step_done(db, ins, "record the task");
    }
    sqlite3_finalize(ins);
    if (st == KVS_OK) return kvs_results_txn_commit(db, "record the task");
    kvs_results_txn_rollback(db);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Merge
 * ---------------------------------------------------------------------------------------------- */

/* The replay's tables and this family's: everything else in an input belongs to a family merge does not know. */
static const char *const known_tables[] = {"meta", "traces", "trace_turns", "runs", "run_layers", "run_summary",
                                           "steps", "sweep_traces", "sweep_tasks"};

typedef struct {
    kvs_results_db *out;
    const char *in_path;
    char *buf;      /* scratch SQL */
    size_t cap;
} merge_ctx;

/* Comma-separated column list of table `t` in schema `schema` without the columns in `skip` (NULL-terminated);
 * `prefix` before each name. Every column must exist in main's table too (else a newer kvsim wrote it). */
static kvs_status column_list(merge_ctx *m, const char *schema, const char *t, const char *const *skip,
                              const char *prefix, char **out) {
    *out = NULL;
    sqlite3 *db = kvs_results_sqlite(m->out);
    sqlite3_stmt *q = NULL;
    kvs_status st = kvs_results_prepare(
        m->out,
        "SELECT s.name, (SELECT count(*) FROM pragma_table_info(?1, 'main') d WHERE d.name = s.name) "
        "FROM pragma_table_info(?1, ?2) s ORDER BY s.cid",
        &q, "read the columns");
    if (st != KVS_OK) return st;
    sqlite3_bind_text(q, 1, t, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, schema, -1, SQLITE_STATIC);
    size_t len = 0, cap = 256;
    char *s = malloc(cap);
    if (!s) st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
    else s[0] = '\0';
    int rc;
    while (st == KVS_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(q, 0);
        int skipped = 0;
        for (int i = 0; skip && skip[i] && !skipped; i++) skipped = !strcmp(skip[i], name);
        if (skipped) continue;
        if (!sqlite3_column_int(q, 1)) {
            st = kvs_fail(KVS_ERR_VERSION, "%s: column %s.%s is unknown to this kvsim (written by a newer one?)",
                          m->in_path, t, name);
            break;
        }
        size_t need = len + strlen(prefix) + strlen(name) + 8;
        if (need > cap) {
            char *g = realloc(s, cap = need * 2);
            if (!g) {
                st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
                break;
            }
            s = g;
        }
        len += (size_t)sprintf(s + len, "%s%s\"%s\"", len ? ", " : "", prefix, name);
    }
    if (st == KVS_OK && rc != SQLITE_DONE) st = kvs_fail(KVS_ERR_DB, "%s: read the columns of %s: %s", m->in_path, t,
                                                          sqlite3_errmsg(db));
    sqlite3_finalize(q);
    if (st != KVS_OK) {
        free(s);
        return st;
    }
    *out = s;
    return KVS_OK;
}

/* printf into the scratch buffer; @return it, or NULL when out of memory. */
static const char *sqlf(merge_ctx *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *sqlf(merge_ctx *m, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(m->buf, m->cap, fmt, ap);
        va_end(ap);
        if (n < 0) return NULL;
        if ((size_t)n < m->cap) return m->buf;
        char *g = realloc(m->buf, (size_t)n + 1);
        if (!g) return NULL;
        m->buf = g;
        m->cap = (size_t)n + 1;
    }
}

typedef struct {
    int64_t src, dst;
} id_pair;

static int64_t map_find(const id_pair *map, int64_t n, int64_t src) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (map[mid].src < src) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && map[lo].src == src ? map[lo].dst : -1;
}

static int src_has(merge_ctx *m, const char *table) {
    sqlite3_stmt *q = NULL;
    if (kvs_results_prepare(m->out, "SELECT 1 FROM src.sqlite_master WHERE type = 'table' AND name = ?1", &q,
                            "read the input's tables") != KVS_OK)
        return -1;
    sqlite3_bind_text(q, 1, table, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    return rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : -1;
}

/* 1 when table `table` of the attached input has column `col`, 0 when not, -1 on a database error. */
static int src_has_column(merge_ctx *m, const char *table, const char *col) {
    sqlite3_stmt *q = NULL;
    if (kvs_results_prepare(m->out, "SELECT 1 FROM pragma_table_info(?1, 'src') WHERE name = ?2", &q,
                            "read the input's columns") != KVS_OK)
        return -1;
    sqlite3_bind_text(q, 1, table, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, col, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    return rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : -1;
}

#define MERGE_TRY(expr)                                                                                            \
    do {                                                                                                           \
        if ((st = (expr)) != KVS_OK) goto done;                                                                    \
    } while (0)
#define MERGE_SQL(var, ...)                                                                                        \
    do {                                                                                                           \
        if (!((var) = sqlf(m, __VA_ARGS__))) {                                                                     \
            st = kvs_fail(KVS_ERR_NOMEM, "out of memory");                                                         \
            goto done;                                                                                             \
        }                                                                                                          \
    } while (0)

/* Maps every trace of the attached input `src` to a traces row of main (inserting the new ones with their turns
 * and hashes). *map receives [*n_map] (src id, dst id) pairs ascending by src id. */
static kvs_status merge_traces(merge_ctx *m, int has_sha, int has_turns, id_pair **map, int64_t *n_map) {
    kvs_status st = KVS_OK;
    const char *sql;
    char *cols = NULL, *match = NULL;
    sqlite3_stmt *list = NULL, *by_sha = NULL, *by_row = NULL, *ins = NULL, *turns = NULL, *ins_sha = NULL;
    static const char *const skip_id[] = {"id", NULL};
    *map = NULL;
    *n_map = 0;
    MERGE_TRY(column_list(m, "src", "traces", skip_id, "", &cols));
    /* a trace without a hash is the same trace when every column of its row matches */
    size_t mcap = strlen(cols) * 3 + 64, ml = 0;
    if (!(match = malloc(mcap))) {
        st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        goto done;
    }
    match[0] = '\0';
    for (const char *c = cols; *c;) {
        const char *e = strchr(c, ',');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        ml += (size_t)snprintf(match + ml, mcap - ml, "%sd.%.*s IS s.%.*s", ml ? " AND " : "", (int)n, c, (int)n, c);
        c += n;
        while (*c == ',' || *c == ' ') c++;
    }
    MERGE_SQL(sql, "SELECT s.id, %s FROM src.traces s ORDER BY s.id",
              has_sha ? "(SELECT h.sha256 FROM src.sweep_traces h WHERE h.trace_id = s.id)" : "NULL");
    MERGE_TRY(kvs_results_prepare(m->out, sql, &list, "read the input's traces"));
    MERGE_TRY(kvs_results_prepare(m->out, "SELECT trace_id FROM main.sweep_traces WHERE sha256 = ?1 ORDER BY trace_id "
                                          "LIMIT 1", &by_sha, "find a trace by hash"));
    MERGE_SQL(sql, "SELECT d.id FROM main.traces d, src.traces s WHERE s.id = ?1 AND %s ORDER BY d.id LIMIT 1", match);
    MERGE_TRY(kvs_results_prepare(m->out, sql, &by_row, "find a trace by its row"));
    MERGE_SQL(sql, "INSERT INTO main.traces (%s) SELECT %s FROM src.traces WHERE id = ?1", cols, cols);
    MERGE_TRY(kvs_results_prepare(m->out, sql, &ins, "copy a trace"));
    if (has_turns)
        MERGE_TRY(kvs_results_prepare(m->out,
                                      "INSERT INTO main.trace_turns (trace_id, turn, begin_pos, prompt_end, end_pos) "
                                      "SELECT ?1, turn, begin_pos, prompt_end, end_pos FROM src.trace_turns "
                                      "WHERE trace_id = ?2 AND NOT EXISTS (SELECT 1 FROM main.trace_turns "
                                      "WHERE trace_id = ?1)",
                                      &turns, "copy a trace's turns"));
    MERGE_TRY(kvs_results_prepare(m->out, "INSERT OR IGNORE INTO main.sweep_traces (trace_id, sha256) VALUES (?1, ?2)",
                                  &ins_sha, "copy a trace hash"));
    int64_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(list)) == SQLITE_ROW) {
        int64_t src_id = sqlite3_column_int64(list, 0), dst = -1;
        const char *sha = (const char *)sqlite3_column_text(list, 1);
        if (sha) {
            sqlite3_bind_text(by_sha, 1, sha, -1, SQLITE_TRANSIENT);
            if ((rc = sqlite3_step(by_sha)) == SQLITE_ROW) dst = sqlite3_column_int64(by_sha, 0);
            sqlite3_reset(by_sha);
        }
        if (dst < 0) {
            sqlite3_bind_int64(by_row, 1, src_id);
            if ((rc = sqlite3_step(by_row)) == SQLITE_ROW) dst = sqlite3_column_int64(by_row, 0);
            else if (rc != SQLITE_DONE) st = kvs_results_db_error(m->out, "find a trace by its row");
            sqlite3_reset(by_row);
            if (st != KVS_OK) goto done;
        }
        if (dst < 0) {
            sqlite3_bind_int64(ins, 1, src_id);
            MERGE_TRY(kvs_results_step_done(m->out, ins, "copy a trace"));
            dst = sqlite3_last_insert_rowid(kvs_results_sqlite(m->out));
        }
        if (turns) {
            sqlite3_bind_int64(turns, 1, dst);
            sqlite3_bind_int64(turns, 2, src_id);
            MERGE_TRY(kvs_results_step_done(m->out, turns, "copy a trace's turns"));
        }
        if (sha) {
            sqlite3_bind_int64(ins_sha, 1, dst);
            sqlite3_bind_text(ins_sha, 2, sha, -1, SQLITE_TRANSIENT);
            MERGE_TRY(kvs_results_step_done(m->out, ins_sha, "copy a trace hash"));
        }
        if (*n_map == cap) {
            id_pair *g = realloc(*map, (size_t)(cap = cap ? cap * 2 : 16) * sizeof *g);
            if (!g) {
                st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
                goto done;
            }
            *map = g;
        }
        (*map)[(*n_map)++] = (id_pair){src_id, dst};
    }
    if (rc != SQLITE_DONE) st = kvs_results_db_error(m->out, "read the input's traces");
done:
    sqlite3_finalize(list);
    sqlite3_finalize(by_sha);
    sqlite3_finalize(by_row);
    sqlite3_finalize(ins);
    sqlite3_finalize(turns);
    sqlite3_finalize(ins_sha);
    free(cols);
    free(match);
    return st;
}

/* A run's status column is "complete" (a NULL status, possible only in a corrupt input, is not). */
static int is_complete(sqlite3_stmt *q, int col) {
    const char *s = (const char *)sqlite3_column_text(q, col);
    return s && !strcmp(s, "complete");
}

/* A text column for a message ("NULL" for a NULL value of a corrupt input). */
static const char *text_or_null(sqlite3_stmt *q, int col) {
    const char *s = (const char *)sqlite3_column_text(q, col);
    return s ? s : "NULL";
}

/* Copies the runs of the attached input into main, de-duplicating by identity (results_sweep.h). */
static kvs_status merge_runs(merge_ctx *m, const id_pair *map, int64_t n_map, kvs_results_merge_stats *stats) {
    kvs_status st = KVS_OK;
    const char *sql;
    static const char *const skip_run[] = {"id", "trace_id", NULL}, *const skip_child[] = {"run_id", NULL};
    char *run_cols = NULL, *layer_cols = NULL, *sum_cols = NULL, *step_cols = NULL;
    sqlite3_stmt *list = NULL, *find = NULL, *ins = NULL, *ins_layers = NULL, *ins_sum = NULL, *ins_steps = NULL,
                 *differ = NULL, *del = NULL;
    MERGE_TRY(column_list(m, "src", "runs", skip_run, "", &run_cols));
    MERGE_TRY(column_list(m, "src", "run_layers", skip_child, "", &layer_cols));
    MERGE_TRY(column_list(m, "src", "run_summary", skip_child, "", &sum_cols));
    MERGE_TRY(column_list(m, "src", "steps", skip_child, "", &step_cols));
    /* a database written before runs.options existed: its runs' options were not recorded (NULL) */
    int has_options = src_has_column(m, "runs", "options");
    if (has_options < 0) {
        st = kvs_results_db_error(m->out, "read the input's columns");
        goto done;
    }
    MERGE_SQL(sql,
              "SELECT id, trace_id, policy, params, budget_tokens, measure, kvsim_version, %s, status "
              "FROM src.runs ORDER BY id",
              has_options ? "options" : "NULL");
    MERGE_TRY(kvs_results_prepare(m->out, sql, &list, "read the input's runs"));
    MERGE_TRY(kvs_results_prepare(m->out, "SELECT id, status FROM main.runs WHERE " RUN_IDENTITY_SQL
                                          " ORDER BY status = 'complete' DESC, id LIMIT 1",
                                  &find, "find a run by identity"));
    MERGE_SQL(sql, "INSERT INTO main.runs (trace_id, %s) SELECT ?1, %s FROM src.runs WHERE id = ?2", run_cols,
              run_cols);
    MERGE_TRY(kvs_results_prepare(m->out, sql, &ins, "copy a run"));
    MERGE_SQL(sql, "INSERT INTO main.run_layers (run_id, %s) SELECT ?1, %s FROM src.run_layers WHERE run_id = ?2",
              layer_cols, layer_cols);
    MERGE_TRY(kvs_results_prepare(m->out, sql, &ins_layers, "copy a run's layers"));
    MERGE_SQL(sql, "INSERT INTO main.run_summary (run_id, %s) SELECT ?1, %s FROM src.run_summary WHERE run_id = ?2",
              sum_cols, sum_cols);
    MERGE_TRY(kvs_results_prepare(m->out, sql, &ins_sum, "copy a run's summary"));
    MERGE_SQL(sql, "INSERT INTO main.steps (run_id, %s) SELECT ?1, %s FROM src.steps WHERE run_id = ?2", step_cols,
              step_cols);
    MERGE_TRY(kvs_results_prepare(m->out, sql, &ins_steps, "copy a run's steps"));
    /* the run-wide results of two complete runs of one identity: any column differing (NULL = NULL) is a conflict */
    MERGE_SQL(sql,
              "SELECT (SELECT count(*) FROM (SELECT %s FROM src.run_summary WHERE run_id = ?1 EXCEPT "
              "SELECT %s FROM main.run_summary WHERE run_id = ?2)) + (SELECT count(*) FROM (SELECT %s FROM "
              "main.run_summary WHERE run_id = ?2 EXCEPT SELECT %s FROM src.run_summary WHERE run_id = ?1))",
              sum_cols, sum_cols, sum_cols, sum_cols);
    MERGE_TRY(kvs_results_prepare(m->out, sql, &differ, "compare two runs"));
    MERGE_TRY(kvs_results_prepare(m->out, "DELETE FROM main.runs WHERE id = ?1", &del, "drop a superseded run"));
    int rc;
    while ((rc = sqlite3_step(list)) == SQLITE_ROW) {
        int64_t src_id = sqlite3_column_int64(list, 0), dst_trace = map_find(map, n_map, sqlite3_column_int64(list, 1));
        int src_complete = is_complete(list, 8);
        const char *src_status = text_or_null(list, 8);
        if (!src_complete && strcmp(src_status, "failed")) { /* a NULL or other status: only a corrupt input */
            st = kvs_fail(KVS_ERR_DB, "%s: run %" PRId64 " has status %s (neither complete nor failed): a corrupt "
                                      "database", m->in_path, src_id, src_status);
            goto done;
        }
        if (dst_trace < 0) {
            st = kvs_fail(KVS_ERR_DB, "%s: run %" PRId64 " refers to a trace the database does not have", m->in_path,
                          src_id);
            goto done;
        }
        sqlite3_bind_int64(find, 1, dst_trace);
        for (int c = 2; c <= 7; c++) sqlite3_bind_value(find, c, sqlite3_column_value(list, c));
        int64_t existing = -1;
        int existing_complete = 0;
        if ((rc = sqlite3_step(find)) == SQLITE_ROW) {
            existing = sqlite3_column_int64(find, 0);
            existing_complete = is_complete(find, 1);
        } else if (rc != SQLITE_DONE) {
            st = kvs_results_db_error(m->out, "find a run by identity");
        }
        sqlite3_reset(find);
        if (st != KVS_OK) goto done;
        if (existing >= 0 && existing_complete && src_complete) {
            sqlite3_bind_int64(differ, 1, src_id);
            sqlite3_bind_int64(differ, 2, existing);
            int64_t n_diff = sqlite3_step(differ) == SQLITE_ROW ? sqlite3_column_int64(differ, 0) : -1;
            sqlite3_reset(differ);
            if (n_diff != 0) {
                st = kvs_fail(KVS_ERR_DB,
                              "%s: run %" PRId64 " (%s:%s budget %" PRId64 ", measure %s) is a conflicting duplicate: "
                              "the merged database already has a run of the same identity (trace, policy, params, "
                              "budget, measure, options, kvsim version) with different results",
                              m->in_path, src_id, text_or_null(list, 2), text_or_null(list, 3),
                              (int64_t)sqlite3_column_int64(list, 4), text_or_null(list, 5));
                goto done;
            }
            stats->runs_duplicate++;
            continue;
        }
        if (existing >= 0 && (existing_complete || !src_complete)) { /* a failed run adds nothing to what is there */
            stats->runs_duplicate++;
            continue;
        }
        if (existing >= 0) { /* a complete run replaces the failed one (an interrupted task that was re-run) */
            sqlite3_bind_int64(del, 1, existing);
            MERGE_TRY(kvs_results_step_done(m->out, del, "drop a superseded run"));
            stats->runs_superseded++;
        }
        sqlite3_bind_int64(ins, 1, dst_trace);
        sqlite3_bind_int64(ins, 2, src_id);
        MERGE_TRY(kvs_results_step_done(m->out, ins, "copy a run"));
        int64_t dst_id = sqlite3_last_insert_rowid(kvs_results_sqlite(m->out));
        sqlite3_stmt *children[] = {ins_layers, ins_sum, ins_steps};
        for (int c = 0; c < 3; c++) {
            sqlite3_bind_int64(children[c], 1, dst_id);
            sqlite3_bind_int64(children[c], 2, src_id);
            MERGE_TRY(kvs_results_step_done(m->out, children[c], "copy a run's rows"));
        }
        stats->runs_copied++;
    }
    if (rc != SQLITE_DONE) st = kvs_results_db_error(m->out, "read the input's runs");
done:
    sqlite3_finalize(list);
    sqlite3_finalize(find);
    sqlite3_finalize(ins);
    sqlite3_finalize(ins_layers);
    sqlite3_finalize(ins_sum);
    sqlite3_finalize(ins_steps);
    sqlite3_finalize(differ);
    sqlite3_finalize(del);
    free(run_cols);
    free(layer_cols);
    free(sum_cols);
    free(step_cols);
    return st;
}

static kvs_status merge_tasks(merge_ctx *m, const id_pair *map, int64_t n_map) {
    kvs_status st = KVS_OK;
    sqlite3_stmt *ins = NULL;
    MERGE_TRY(kvs_results_prepare(m->out,
                                  "INSERT OR IGNORE INTO main.sweep_tasks (task_key, study, task_index, trace_id, "
                                  "configs, options, completed_at) SELECT task_key, study, task_index, ?1, configs, "
                                  "options, completed_at FROM src.sweep_tasks WHERE trace_id = ?2",
                                  &ins, "copy the completed tasks"));
    for (int64_t i = 0; i < n_map; i++) {
        sqlite3_bind_int64(ins, 1, map[i].dst);
        sqlite3_bind_int64(ins, 2, map[i].src);
        MERGE_TRY(kvs_results_step_done(m->out, ins, "copy the completed tasks"));
    }
done:
    sqlite3_finalize(ins);
    return st;
}

/* Notes the input's tables of other families (not merged) in stats->skipped_tables, once each. */
static kvs_status note_skipped_tables(merge_ctx *m, kvs_results_merge_stats *stats) {
    sqlite3_stmt *q = NULL;
    kvs_status st = kvs_results_prepare(m->out, "SELECT name FROM src.sqlite_master WHERE type = 'table' AND name "
                                                "NOT LIKE 'sqlite_%' ORDER BY name", &q, "read the input's tables");
    if (st != KVS_OK) return st;
    while (sqlite3_step(q) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(q, 0);
        if (!name) continue; /* a corrupt schema row */
        int known = 0;
        for (size_t i = 0; i < sizeof known_tables / sizeof known_tables[0] && !known; i++)
            known = !strcmp(known_tables[i], name);
        size_t len = strlen(stats->skipped_tables), nl = strlen(name);
        char *at = strstr(stats->skipped_tables, name);
        int listed = at && (at == stats->skipped_tables || at[-1] == ',') && (at[nl] == ',' || !at[nl]);
        if (!known && !listed && len + nl + 2 < sizeof stats->skipped_tables)
            snprintf(stats->skipped_tables + len, sizeof stats->skipped_tables - len, "%s%s", len ? "," : "", name);
    }
    sqlite3_finalize(q);
    return KVS_OK;
}

/* Merges one input file into the open output. */
static kvs_status merge_one(merge_ctx *m, const char *in_path, kvs_results_merge_stats *stats) {
    /* identify it first through the read API: a foreign, corrupt or other-version file is refused clearly */
    kvs_results_db *probe = NULL;
    kvs_status st = kvs_results_open_readonly(in_path, &probe);
    if (st != KVS_OK) return kvs_fail(st, "%s", kvs_last_error());
    int version = kvs_results_schema_version(probe);
    kvs_results_close(probe);
    if (version != KVS_RESULTS_SCHEMA_VERSION)
        return kvs_fail(KVS_ERR_VERSION,
                        "%s: schema version %d, but the merged database is version %d: refusing to merge different "
                        "schema versions (open it once for writing, e.g. with kvsim replay, to migrate it)",
                        in_path, version, KVS_RESULTS_SCHEMA_VERSION);
    m->in_path = in_path;
    sqlite3 *db = kvs_results_sqlite(m->out);
    sqlite3_stmt *att = NULL;
    if ((st = kvs_results_prepare(m->out, "ATTACH DATABASE ?1 AS src", &att, "attach the input")) != KVS_OK) return st;
    sqlite3_bind_text(att, 1, in_path, -1, SQLITE_STATIC);
    int rc = sqlite3_step(att);
    sqlite3_finalize(att);
    if (rc != SQLITE_DONE) return kvs_fail(KVS_ERR_DB, "%s: cannot attach: %s", in_path, sqlite3_errmsg(db));
    id_pair *map = NULL;
    int64_t n_map = 0;
    int has_sha = src_has(m, "sweep_traces"), has_turns = src_has(m, "trace_turns"), has_tasks = src_has(m, "sweep_tasks");
    if (has_sha < 0 || has_turns < 0 || has_tasks < 0) st = kvs_results_db_error(m->out, "read the input's tables");
    if (st == KVS_OK) st = kvs_results_txn_begin(m->out, "merge");
    if (st == KVS_OK) {
        st = merge_traces(m, has_sha, has_turns, &map, &n_map);
        if (st == KVS_OK) st = merge_runs(m, map, n_map, stats);
        if (st == KVS_OK && has_tasks) st = merge_tasks(m, map, n_map);
        if (st == KVS_OK) st = note_skipped_tables(m, stats);
        if (st == KVS_OK) st = kvs_results_txn_commit(m->out, "merge");
        else kvs_results_txn_rollback(m->out);
    }
    free(map);
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", kvs_last_error());
    kvs_status dst = kvs_results_exec(m->out, "DETACH DATABASE src", "detach the input");
    if (st != KVS_OK) return kvs_fail(st, "%s", saved);
    if (dst != KVS_OK) return dst;
    stats->inputs++;
    return KVS_OK;
}

static int64_t count_rows(kvs_results_db *db, const char *sql) {
    sqlite3_stmt *q = NULL;
    if (kvs_results_prepare(db, sql, &q, "count") != KVS_OK) return -1;
    int64_t n = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
    sqlite3_finalize(q);
    return n;
}

static void remove_db_files(const char *path) {
    char side[4096];
    unlink(path);
    snprintf(side, sizeof side, "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-journal", path);
    unlink(side);
}

/* fsync of a file or of the folder holding `path`. */
static kvs_status sync_path(const char *path, int folder) {
    char dir[4096];
    const char *p = path;
    if (folder) {
        const char *slash = strrchr(path, '/');
        if (!slash) snprintf(dir, sizeof dir, ".");
        else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path) + (slash == path), path);
        p = dir;
    }
    int fd = open(p, O_RDONLY);
    if (fd < 0) return kvs_fail(KVS_ERR_IO, "%s: cannot open to sync: %s", p, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    return rc == 0 || folder ? KVS_OK : kvs_fail(KVS_ERR_IO, "%s: fsync: %s", p, strerror(errno));
}

/* A test-only hook (SQLite's style of test hooks): with KVSIM_TEST_MERGE_STALL set, the merge stops after its first
 * input for that many seconds, saying so on stderr, so the tests can kill it in the middle of a merge. */
static void test_stall(void) {
#ifndef KVS_NO_TEST_HOOKS
    const char *v = getenv("KVSIM_TEST_MERGE_STALL");
    if (v && atoi(v) > 0) {
        fprintf(stderr, "kvsim merge: test stall\n");
        sleep((unsigned)atoi(v));
    }
#endif
}

kvs_status kvs_results_merge(const char *out_path, const char *const *inputs, int n, kvs_results_merge_stats *stats) {
    kvs_results_merge_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!out_path || (n > 0 && !inputs)) return kvs_fail(KVS_ERR_INVALID_ARG, "merge: NULL argument");
    struct stat sb;
    int out_exists = stat(out_path, &sb) == 0;
    if (out_exists && !S_ISREG(sb.st_mode)) return kvs_fail(KVS_ERR_IO, "%s: not a regular file", out_path);
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.merge-%ld.tmp", out_path, (long)getpid()) >= sizeof tmp)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: path too long", out_path);
    remove_db_files(tmp);
    merge_ctx m = {.cap = 4096};
    if (!(m.buf = malloc(m.cap))) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    kvs_status st = kvs_results_open(tmp, &m.out);
    if (st == KVS_OK) {
        if ((st = kvs_results_txn_begin(m.out, "create the sweep tables")) == KVS_OK) {
            if ((st = kvs_results_exec(m.out, sweep_schema, "create the sweep tables")) == KVS_OK)
                st = kvs_results_txn_commit(m.out, "create the sweep tables");
            else kvs_results_txn_rollback(m.out);
        }
    }
    /* OUT's own runs come first: merging into an existing database adds to it (counted apart: the statistics
     * say what the inputs added) */
    if (st == KVS_OK && out_exists) {
        kvs_results_merge_stats own = {0};
        st = merge_one(&m, out_path, &own);
        stats->inputs = own.inputs;
        memcpy(stats->skipped_tables, own.skipped_tables, sizeof own.skipped_tables);
    }
    for (int i = 0; st == KVS_OK && i < n; i++) {
        st = merge_one(&m, inputs[i], stats);
        if (st == KVS_OK && i == 0) test_stall();
    }
    if (st == KVS_OK) {
        stats->traces = count_rows(m.out, "SELECT count(*) FROM traces");
        stats->tasks = count_rows(m.out, "SELECT count(*) FROM sweep_tasks");
        /* one self-contained file to rename: no -wal beside it that would have to travel with it */
        st = kvs_results_exec(m.out, "PRAGMA journal_mode = DELETE", "leave WAL mode");
    }
    kvs_results_close(m.out);
    free(m.buf);
    if (st == KVS_OK) st = sync_path(tmp, 0);
    if (st == KVS_OK && rename(tmp, out_path) != 0)
        st = kvs_fail(KVS_ERR_IO, "%s: cannot rename the merged database into place: %s", out_path, strerror(errno));
    if (st != KVS_OK) {
        char saved[1024];
        snprintf(saved, sizeof saved, "%s", kvs_last_error());
        remove_db_files(tmp);
        return kvs_fail(st, "%s", saved);
    }
    return sync_path(out_path, 1);
}
