/* results_internal.h — what the table families beside results/results.c share with it: the SQLite handle of an
 * open kvsim results database and the few helpers every writer and reader of that file needs. Only files
 * named results/results_<family>.c include this header; everything else reads and writes the database through
 * results/results.h and the family headers (results/results_<family>.h), never with SQL of its own.
 *
 * Why families: the replay tables (runs, run_layers, run_summary, steps, traces, trace_turns) belong to
 * results.c; analyses (drift, heads), capacity plans and later features keep their tables in a file of their
 * own so that none of them edits the core schema. Rules a family keeps (results/SCHEMA.md, "Table families"):
 *  - its tables are created by its writer with CREATE TABLE IF NOT EXISTS inside the writer's own
 *    BEGIN IMMEDIATE ... COMMIT transaction (kvs_results_txn_begin/commit/rollback), so a database that
 *    never held that family's results has none of its tables, and a killed or failed write leaves the
 *    database as it was;
 *  - its readers check kvs_results_table_exists() first and report "no <family> results in DB" when absent;
 *  - rows that describe a trace reference traces(id), obtained with kvs_results_trace_id() inside the
 *    transaction (the same row a replay of that trace uses);
 *  - the schema version stays 2: a family's tables are additive (a v2 reader that does not know them ignores
 *    them); a family that changes its own tables documents how it reads the old form.
 */
#ifndef KVS_RESULTS_INTERNAL_H
#define KVS_RESULTS_INTERNAL_H

#include <sqlite3.h>

#include "results.h"

/* The connection of `db` (owned by db), its path (for error messages) and whether it was opened read-only. */
sqlite3 *kvs_results_sqlite(kvs_results_db *db);
const char *kvs_results_path(const kvs_results_db *db);
int kvs_results_is_readonly(const kvs_results_db *db);

/* KVS_ERR_DB with "<path>: <what>: <SQLite's message>" (recorded with kvs_fail). */
kvs_status kvs_results_db_error(kvs_results_db *db, const char *what);

/* sqlite3_exec of `sql` (several statements allowed); KVS_ERR_DB naming `what` on failure. */
kvs_status kvs_results_exec(kvs_results_db *db, const char *sql, const char *what);

/* sqlite3_prepare_v2 of `sql` into *st; KVS_ERR_DB naming `what` on failure. */
kvs_status kvs_results_prepare(kvs_results_db *db, const char *sql, sqlite3_stmt **st, const char *what);

/* 1 when `table` has column `col`, 0 when not (or when the table does not exist), -1 (with kvs_fail naming
 * `what`) on a database error: how a family upgrades a table written by an earlier kvsim. */
int kvs_results_has_column(kvs_results_db *db, const char *table, const char *col, const char *what);

/* Steps a fully bound statement that must finish with SQLITE_DONE, then resets it for reuse. */
kvs_status kvs_results_step_done(kvs_results_db *db, sqlite3_stmt *st, const char *what);

/* The write transaction of a family: BEGIN IMMEDIATE (KVS_ERR_STATE on a read-only handle), COMMIT, and a
 * ROLLBACK that never fails (call it on every error path after a successful begin). */
kvs_status kvs_results_txn_begin(kvs_results_db *db, const char *what);
kvs_status kvs_results_txn_commit(kvs_results_db *db, const char *what);
void kvs_results_txn_rollback(kvs_results_db *db);

/* Column helpers of every family: a double bound as NULL when NaN (NULL = not recorded; SQLite would store NULL
 * for NaN anyway, this makes it explicit), a REAL column read back as NaN when NULL, and a text column copied
 * (NULL for NULL; on allocation failure NULL and *oom = 1 when oom is not NULL). */
int kvs_results_bind_real(sqlite3_stmt *st, int i, double v);
double kvs_results_col_real(sqlite3_stmt *st, int i);
char *kvs_results_col_dup(sqlite3_stmt *st, int i, int *oom);

/* 1 when table `name` exists in the database, 0 when it does not; -1 (with kvs_fail) on a database error. */
int kvs_results_table_exists(kvs_results_db *db, const char *name);

/* The id of the traces row describing `trace` (the row replays of the same trace use), inserting it — and its
 * turns when given — if new. Call it inside a transaction of kvs_results_txn_begin(). */
kvs_status kvs_results_trace_id(kvs_results_db *db, const kvs_results_trace *trace, int64_t *trace_id);

#endif /* KVS_RESULTS_INTERNAL_H */
