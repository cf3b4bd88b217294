/* results_drift.c — the drift table family: tables drift_runs, drift_steps, drift_locality and
 * drift_locality_units (documented in results/SCHEMA.md "Drift tables"), written in one transaction per run and read
 * back for plots and reports (see results_drift.h; family rules in results_internal.h).
 *
 * The old form: tables written before the chance levels lack the `chance` columns. The writer adds them (ALTER
 * TABLE inside its transaction; the earlier runs' rows hold NULL there); the readers give those rows the chance
 * level of analysis/drift.h computed from the row and its run (k, pos, prompt_len, n_steps), the one derivation.
 */
#include "results_drift.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "results_internal.h"

/* The shared column helpers of results/results_internal.h under their short names. */
#define bind_real(st, i, v) ((void)kvs_results_bind_real((st), (i), (v)))
#define col_real kvs_results_col_real
#define col_dup kvs_results_col_dup

static const char drift_schema[] =
    "CREATE TABLE IF NOT EXISTS drift_runs (\n"
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,\n"
    "  trace_id INTEGER NOT NULL REFERENCES traces(id),\n"
    "  prompt_len INTEGER NOT NULL,\n"
    "  n_steps INTEGER NOT NULL,\n"
    "  obs_window INTEGER NOT NULL,\n"
    "  delta_max INTEGER NOT NULL,\n"
    "  scores TEXT NOT NULL,\n"
    "  ks TEXT NOT NULL,\n"
    "  created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))\n"
    ");\n"
    "CREATE TABLE IF NOT EXISTS drift_steps (\n"
    "  run_id INTEGER NOT NULL REFERENCES drift_runs(id) ON DELETE CASCADE,\n"
    "  layer INTEGER NOT NULL,\n"
    "  unit TEXT NOT NULL CHECK (unit IN ('head', 'group')),\n"
    "  unit_index INTEGER NOT NULL,\n"
    "  k INTEGER NOT NULL,\n"
    "  step INTEGER NOT NULL,\n"
    "  pos INTEGER NOT NULL,\n"
    "  overlap_window REAL,\n"
    "  overlap_last REAL,\n"
    "  mass REAL,\n"
    "  chance REAL,\n"
    "  PRIMARY KEY (run_id, unit, layer, unit_index, k, step)\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE IF NOT EXISTS drift_locality (\n"
    "  run_id INTEGER NOT NULL REFERENCES drift_runs(id) ON DELETE CASCADE,\n"
    "  layer INTEGER NOT NULL,\n"
    "  unit TEXT NOT NULL CHECK (unit IN ('head', 'group')),\n"
    "  k INTEGER NOT NULL,\n"
    "  step INTEGER NOT NULL,\n"
    "  delta INTEGER NOT NULL,\n"
    "  n_units INTEGER NOT NULL,\n"
    "  mean REAL, min REAL, max REAL,\n"
    "  chance REAL,\n"
    "  PRIMARY KEY (run_id, unit, layer, k, step, delta)\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE IF NOT EXISTS drift_locality_units (\n"
    "  run_id INTEGER NOT NULL REFERENCES drift_runs(id) ON DELETE CASCADE,\n"
    "  layer INTEGER NOT NULL,\n"
    "  unit TEXT NOT NULL CHECK (unit IN ('head', 'group')),\n"
    "  unit_index INTEGER NOT NULL,\n"
    "  k INTEGER NOT NULL,\n"
    "  delta INTEGER NOT NULL,\n"
    "  n_pairs INTEGER NOT NULL,\n"
    "  mean REAL,\n"
    "  chance REAL,\n"
    "  PRIMARY KEY (run_id, unit, layer, unit_index, k, delta)\n"
    ") WITHOUT ROWID;\n";

/* The tables that carry a `chance` column (added after the first form of the family). */
static const char *const chance_tables[] = {"drift_steps", "drift_locality", "drift_locality_units"};

/* 1 when `table` has column `col`, 0 when not, -1 (with kvs_fail) on a database error. */
static int has_column(kvs_results_db *db, const char *table, const char *col) {
    return kvs_results_has_column(db, table, col, "read the drift columns");
}

/* Tables of the old form get their chance column (inside the writer's transaction). */
static kvs_status add_chance_columns(kvs_results_db *db) {
    for (size_t i = 0; i < sizeof chance_tables / sizeof chance_tables[0]; i++) {
        int has = has_column(db, chance_tables[i], "chance");
        if (has < 0) return KVS_ERR_DB;
        if (has) continue;
        char sql[128];
        snprintf(sql, sizeof sql, "ALTER TABLE %s ADD COLUMN chance REAL", chance_tables[i]);
        kvs_status st = kvs_results_exec(db, sql, "add the drift chance column");
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

struct kvs_results_drift_writer {
    kvs_results_db *db;
    int64_t run_id;
    int failed;
    sqlite3_stmt *step, *loc, *loc_unit;
};


static void writer_free(kvs_results_drift_writer *w) {
    sqlite3_finalize(w->step);
    sqlite3_finalize(w->loc);
    sqlite3_finalize(w->loc_unit);
    free(w);
}

kvs_status kvs_results_drift_begin(kvs_results_db *db, const kvs_results_trace *trace,
                                   const kvs_results_drift_params *pr, kvs_results_drift_writer **out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "drift results: NULL output handle");
    *out = NULL;
    if (!db || !trace || !pr || !pr->k || pr->n_k < 1 || pr->n_k > KVS_DRIFT_MAX_KS)
        return kvs_fail(KVS_ERR_INVALID_ARG, "drift results: NULL argument or bad k list");
    char ks[KVS_DRIFT_MAX_KS * 21 + 1] = "";
    size_t len = 0;
    for (int32_t i = 0; i < pr->n_k; i++)
        len += (size_t)snprintf(ks + len, sizeof ks - len, "%s%lld", i ? "," : "", (long long)pr->k[i]);
    const char *scores = pr->scores == (KVS_DRIFT_SCORE_WINDOW | KVS_DRIFT_SCORE_LAST) ? "window,last"
                         : pr->scores == KVS_DRIFT_SCORE_LAST                          ? "last"
                                                                                       : "window";
    kvs_results_drift_writer *w = calloc(1, sizeof *w);
    if (!w) return kvs_fail(KVS_ERR_NOMEM, "drift results: out of memory");
    w->db = db;
    kvs_status st = kvs_results_txn_begin(db, "drift results");
    if (st != KVS_OK) {
        free(w);
        return st;
    }
    int64_t trace_id = 0;
    sqlite3_stmt *ins = NULL;
    KVS_TRY(st = kvs_results_exec(db, drift_schema, "create the drift tables"));
    KVS_TRY(st = add_chance_columns(db));
    KVS_TRY(st = kvs_results_trace_id(db, trace, &trace_id));
    KVS_TRY(st = kvs_results_prepare(db,
                                     "INSERT INTO drift_runs (trace_id, prompt_len, n_steps, obs_window, delta_max, scores, ks) "
                                     "VALUES (?, ?, ?, ?, ?, ?, ?)",
                                     &ins, "insert the drift run"));
    sqlite3_bind_int64(ins, 1, trace_id);
    sqlite3_bind_int64(ins, 2, pr->prompt_len);
    sqlite3_bind_int64(ins, 3, pr->n_steps);
    sqlite3_bind_int(ins, 4, pr->window);
    sqlite3_bind_int(ins, 5, pr->delta_max);
    sqlite3_bind_text(ins, 6, scores, -1, SQLITE_STATIC);
    sqlite3_bind_text(ins, 7, ks, -1, SQLITE_STATIC);
    KVS_TRY(st = kvs_results_step_done(db, ins, "insert the drift run"));
    w->run_id = sqlite3_last_insert_rowid(kvs_results_sqlite(db));
    KVS_TRY(st = kvs_results_prepare(db,
                                     "INSERT INTO drift_steps (run_id, layer, unit, unit_index, k, step, pos, "
                                     "overlap_window, overlap_last, mass, chance) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                     &w->step, "insert drift steps"));
    KVS_TRY(st = kvs_results_prepare(db,
                                     "INSERT INTO drift_locality (run_id, layer, unit, k, step, delta, n_units, mean, "
                                     "min, max, chance) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                     &w->loc, "insert drift locality"));
    KVS_TRY(st = kvs_results_prepare(db,
                                     "INSERT INTO drift_locality_units (run_id, layer, unit, unit_index, k, delta, "
                                     "n_pairs, mean, chance) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                     &w->loc_unit, "insert drift locality per unit"));
    sqlite3_finalize(ins);
    *out = w;
    return KVS_OK;
cleanup:
    sqlite3_finalize(ins);
    kvs_results_txn_rollback(db);
    writer_free(w);
    return st;
}

static kvs_status put_done(kvs_results_drift_writer *w, sqlite3_stmt *st, const char *what) {
    kvs_status rc = kvs_results_step_done(w->db, st, what);
    if (rc != KVS_OK) w->failed = 1;
    return rc;
}

static kvs_status check_writer(kvs_results_drift_writer *w, const void *row) {
    if (!w || !row) return kvs_fail(KVS_ERR_INVALID_ARG, "drift results: NULL writer or row");
    if (w->failed) return kvs_fail(KVS_ERR_STATE, "drift results: an earlier write failed; the run is rolled back");
    return KVS_OK;
}

kvs_status kvs_results_drift_put_step(kvs_results_drift_writer *w, const kvs_drift_step *r) {
    kvs_status rc = check_writer(w, r);
    if (rc != KVS_OK) return rc;
    sqlite3_stmt *s = w->step;
    sqlite3_bind_int64(s, 1, w->run_id);
    sqlite3_bind_int(s, 2, r->layer);
    sqlite3_bind_text(s, 3, kvs_drift_unit_name(r->unit), -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 4, r->index);
    sqlite3_bind_int64(s, 5, r->k);
    sqlite3_bind_int64(s, 6, r->step);
    sqlite3_bind_int64(s, 7, r->pos);
    bind_real(s, 8, r->overlap_window);
    bind_real(s, 9, r->overlap_last);
    bind_real(s, 10, r->mass);
    bind_real(s, 11, r->chance);
    return put_done(w, s, "insert drift steps");
}

kvs_status kvs_results_drift_put_locality(kvs_results_drift_writer *w, const kvs_drift_locality *r) {
    kvs_status rc = check_writer(w, r);
    if (rc != KVS_OK) return rc;
    sqlite3_stmt *s = w->loc;
    sqlite3_bind_int64(s, 1, w->run_id);
    sqlite3_bind_int(s, 2, r->layer);
    sqlite3_bind_text(s, 3, kvs_drift_unit_name(r->unit), -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 4, r->k);
    sqlite3_bind_int64(s, 5, r->step);
    sqlite3_bind_int(s, 6, r->delta);
    sqlite3_bind_int(s, 7, r->n_units);
    bind_real(s, 8, r->mean);
    bind_real(s, 9, r->min);
    bind_real(s, 10, r->max);
    bind_real(s, 11, r->chance);
    return put_done(w, s, "insert drift locality");
}

kvs_status kvs_results_drift_put_locality_unit(kvs_results_drift_writer *w, const kvs_drift_locality_unit *r) {
    kvs_status rc = check_writer(w, r);
    if (rc != KVS_OK) return rc;
    sqlite3_stmt *s = w->loc_unit;
    sqlite3_bind_int64(s, 1, w->run_id);
    sqlite3_bind_int(s, 2, r->layer);
    sqlite3_bind_text(s, 3, kvs_drift_unit_name(r->unit), -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 4, r->index);
    sqlite3_bind_int64(s, 5, r->k);
    sqlite3_bind_int(s, 6, r->delta);
    sqlite3_bind_int64(s, 7, r->n_pairs);
    bind_real(s, 8, r->mean);
    bind_real(s, 9, r->chance);
    return put_done(w, s, "insert drift locality per unit");
}

kvs_status kvs_results_drift_commit(kvs_results_drift_writer *w, int64_t *run_id) {
    if (!w) return kvs_fail(KVS_ERR_INVALID_ARG, "drift results: NULL writer");
    kvs_status rc;
    if (w->failed) {
        rc = kvs_fail(KVS_ERR_STATE, "drift results: an earlier write failed; the run is rolled back");
        kvs_results_txn_rollback(w->db);
    } else {
        /* The statements are finalized first: a COMMIT with statements still pending would be refused. */
        sqlite3_finalize(w->step);
        sqlite3_finalize(w->loc);
        sqlite3_finalize(w->loc_unit);
        w->step = w->loc = w->loc_unit = NULL;
        rc = kvs_results_txn_commit(w->db, "drift results");
        if (rc != KVS_OK) kvs_results_txn_rollback(w->db);
        else if (run_id) *run_id = w->run_id;
    }
    writer_free(w);
    return rc;
}

void kvs_results_drift_abort(kvs_results_drift_writer *w) {
    if (!w) return;
    kvs_results_txn_rollback(w->db);
    writer_free(w);
}

/* ---- reading ---- */

static kvs_status no_drift(kvs_results_db *db) {
    int ex = kvs_results_table_exists(db, "drift_runs");
    if (ex < 0) return KVS_ERR_DB;
    if (ex == 0) return kvs_fail(KVS_ERR_DB, "%s: no drift results in DB (run kvsim drift TRACE --db %s first)",
                                 kvs_results_path(db), kvs_results_path(db));
    return KVS_OK;
}


static int path_matches(const char *path, const char *want) {
    if (!want) return 1;
    if (!path) return 0;
    size_t n = strlen(path), k = strlen(want);
    return !strcmp(path, want) || (n > k && path[n - k - 1] == '/' && !strcmp(path + n - k, want));
}

void kvs_results_drift_runs_free(kvs_results_drift_run *rows, int64_t n) {
    if (!rows) return;
    for (int64_t i = 0; i < n; i++) {
        free(rows[i].trace_path);
        free(rows[i].model);
        free(rows[i].created_at);
    }
    free(rows);
}

/* Grows *rows (element size `size`) to hold at least n + 1 elements. */
static kvs_status grow(void **rows, int64_t n, int64_t *cap, size_t size) {
    if (n < *cap) return KVS_OK;
    int64_t nc = *cap ? 2 * *cap : 64;
    void *p = realloc(*rows, (size_t)nc * size);
    if (!p) return kvs_fail(KVS_ERR_NOMEM, "drift results: out of memory");
    *rows = p;
    *cap = nc;
    return KVS_OK;
}

kvs_status kvs_results_drift_query_runs(kvs_results_db *db, const char *trace, const char *model,
                                        kvs_results_drift_run **rows, int64_t *n) {
    if (!db || !rows || !n) return kvs_fail(KVS_ERR_INVALID_ARG, "drift results: NULL argument");
    *rows = NULL;
    *n = 0;
    kvs_status rc = no_drift(db);
    if (rc != KVS_OK) return rc;
    sqlite3_stmt *st = NULL;
    kvs_results_drift_run *out = NULL;
    int64_t cnt = 0, cap = 0;
    KVS_TRY(rc = kvs_results_prepare(db,
                                     "SELECT r.id, r.trace_id, t.path, t.model, r.created_at, t.n_layers, t.n_heads, "
                                     "t.n_kv_heads, r.prompt_len, r.n_steps, r.obs_window, r.delta_max, r.scores, r.ks "
                                     "FROM drift_runs r JOIN traces t ON t.id = r.trace_id ORDER BY r.id",
                                     &st, "read drift runs"));
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        const char *path = (const char *)sqlite3_column_text(st, 2), *mod = (const char *)sqlite3_column_text(st, 3);
        if (!path_matches(path, trace) || (model && (!mod || strcmp(mod, model)))) continue;
        KVS_TRY(rc = grow((void **)&out, cnt, &cap, sizeof *out));
        kvs_results_drift_run *r = &out[cnt];
        memset(r, 0, sizeof *r);
        cnt++;
        int oom = 0;
        r->id = sqlite3_column_int64(st, 0);
        r->trace_id = sqlite3_column_int64(st, 1);
        r->trace_path = col_dup(st, 2, &oom);
        r->model = col_dup(st, 3, &oom);
        r->created_at = col_dup(st, 4, &oom);
        r->n_layers = sqlite3_column_int(st, 5);
        r->n_heads = sqlite3_column_int(st, 6);
        r->n_kv_heads = sqlite3_column_int(st, 7);
        r->prompt_len = sqlite3_column_int64(st, 8);
        r->n_steps = sqlite3_column_int64(st, 9);
        r->window = sqlite3_column_int(st, 10);
        r->delta_max = sqlite3_column_int(st, 11);
        const char *sc = (const char *)sqlite3_column_text(st, 12), *ks = (const char *)sqlite3_column_text(st, 13);
        if (sc && strstr(sc, "window")) r->scores |= KVS_DRIFT_SCORE_WINDOW;
        if (sc && strstr(sc, "last")) r->scores |= KVS_DRIFT_SCORE_LAST;
        for (const char *p = ks; p && *p && r->n_k < KVS_DRIFT_MAX_KS;) {
            char *end = NULL;
            long long v = strtoll(p, &end, 10);
            if (end == p) break;
            r->k[r->n_k++] = v;
            p = *end == ',' ? end + 1 : end;
        }
        if (oom) {
            rc = kvs_fail(KVS_ERR_NOMEM, "drift results: out of memory");
            goto cleanup;
        }
    }
    if (s != SQLITE_DONE) {
        rc = kvs_results_db_error(db, "read drift runs");
        goto cleanup;
    }
    *rows = out;
    *n = cnt;
    out = NULL;
    cnt = 0;
cleanup:
    sqlite3_finalize(st);
    kvs_results_drift_runs_free(out, cnt);
    return rc;
}

/* Prepares `select` + the run / unit / layer / k filter + `order` and binds it. */
static kvs_status prepare_filtered(kvs_results_db *db, const char *select, const char *order, int64_t run_id,
                                   kvs_drift_unit unit, int32_t layer, int64_t k, sqlite3_stmt **st) {
    char sql[1024];
    snprintf(sql, sizeof sql, "%s WHERE run_id = ?1 AND unit = ?2 AND (?3 < 0 OR layer = ?3) AND (?4 <= 0 OR k = ?4) "
                              "ORDER BY %s",
             select, order);
    kvs_status rc = kvs_results_prepare(db, sql, st, "read drift results");
    if (rc != KVS_OK) return rc;
    sqlite3_bind_int64(*st, 1, run_id);
    sqlite3_bind_text(*st, 2, kvs_drift_unit_name(unit), -1, SQLITE_STATIC);
    sqlite3_bind_int(*st, 3, layer);
    sqlite3_bind_int64(*st, 4, k);
    return KVS_OK;
}

/* "chance" when `table` has the column, else "NULL" (the old form: filled in by fill_chance). */
static kvs_status chance_column(kvs_results_db *db, const char *table, const char **expr) {
    int has = has_column(db, table, "chance");
    if (has < 0) return KVS_ERR_DB;
    *expr = has ? "chance" : "NULL";
    return KVS_OK;
}

/* The prompt length and decode steps of run `run_id`, for the chance levels of rows written without them. */
static kvs_status run_shape(kvs_results_db *db, int64_t run_id, int64_t *prompt_len, int64_t *n_steps) {
    sqlite3_stmt *q = NULL;
    kvs_status rc = kvs_results_prepare(db, "SELECT prompt_len, n_steps FROM drift_runs WHERE id = ?1", &q,
                                        "read the drift run");
    if (rc != KVS_OK) return rc;
    sqlite3_bind_int64(q, 1, run_id);
    int s = sqlite3_step(q);
    *prompt_len = *n_steps = 0;
    if (s == SQLITE_ROW) {
        *prompt_len = sqlite3_column_int64(q, 0);
        *n_steps = sqlite3_column_int64(q, 1);
    } else if (s != SQLITE_DONE) {
        rc = kvs_results_db_error(db, "read the drift run");
    }
    sqlite3_finalize(q);
    return rc;
}

kvs_status kvs_results_drift_query_steps(kvs_results_db *db, int64_t run_id, kvs_drift_unit unit, int32_t layer,
                                         int64_t k, kvs_drift_step **rows, int64_t *n) {
    if (!db || !rows || !n) return kvs_fail(KVS_ERR_INVALID_ARG, "drift results: NULL argument");
    *rows = NULL;
    *n = 0;
    kvs_status rc = no_drift(db);
    if (rc != KVS_OK) return rc;
    sqlite3_stmt *st = NULL;
    kvs_drift_step *out = NULL;
    int64_t cnt = 0, cap = 0;
    const char *chance = NULL;
    char select[256];
    KVS_TRY(rc = chance_column(db, "drift_steps", &chance));
    snprintf(select, sizeof select,
             "SELECT layer, unit_index, k, step, pos, overlap_window, overlap_last, mass, %s FROM drift_steps", chance);
    KVS_TRY(rc = prepare_filtered(db, select, "layer, unit_index, k, step", run_id, unit, layer, k, &st));
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        KVS_TRY(rc = grow((void **)&out, cnt, &cap, sizeof *out));
        out[cnt++] = (kvs_drift_step){.layer = sqlite3_column_int(st, 0), .unit = unit,
                                      .index = sqlite3_column_int(st, 1), .k = sqlite3_column_int64(st, 2),
                                      .step = sqlite3_column_int64(st, 3), .pos = sqlite3_column_int64(st, 4),
                                      .overlap_window = col_real(st, 5), .overlap_last = col_real(st, 6),
                                      .mass = col_real(st, 7), .chance = col_real(st, 8)};
        kvs_drift_step *r = &out[cnt - 1];
        if (isnan(r->chance)) r->chance = kvs_analysis_drift_chance(r->k, r->pos + 1);
    }
    if (s != SQLITE_DONE) {
        rc = kvs_results_db_error(db, "read drift steps");
        goto cleanup;
    }
    *rows = out;
    *n = cnt;
    out = NULL;
cleanup:
    sqlite3_finalize(st);
    free(out);
    return rc;
}

kvs_status kvs_results_drift_query_locality(kvs_results_db *db, int64_t run_id, kvs_drift_unit unit, int32_t layer,
                                            int64_t k, kvs_drift_locality **rows, int64_t *n) {
    if (!db || !rows || !n) return kvs_fail(KVS_ERR_INVALID_ARG, "drift results: NULL argument");
    *rows = NULL;
    *n = 0;
    kvs_status rc = no_drift(db);
    if (rc != KVS_OK) return rc;
    sqlite3_stmt *st = NULL;
    kvs_drift_locality *out = NULL;
    int64_t cnt = 0, cap = 0, P = 0, T = 0;
    const char *chance = NULL;
    char select[256];
    KVS_TRY(rc = chance_column(db, "drift_locality", &chance));
    KVS_TRY(rc = run_shape(db, run_id, &P, &T));
    snprintf(select, sizeof select, "SELECT layer, k, step, delta, n_units, mean, min, max, %s FROM drift_locality",
             chance);
    KVS_TRY(rc = prepare_filtered(db, select, "layer, k, step, delta", run_id, unit, layer, k, &st));
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        KVS_TRY(rc = grow((void **)&out, cnt, &cap, sizeof *out));
        out[cnt++] = (kvs_drift_locality){.layer = sqlite3_column_int(st, 0), .unit = unit,
                                          .k = sqlite3_column_int64(st, 1), .step = sqlite3_column_int64(st, 2),
                                          .delta = sqlite3_column_int(st, 3), .n_units = sqlite3_column_int(st, 4),
                                          .mean = col_real(st, 5), .min = col_real(st, 6), .max = col_real(st, 7),
                                          .chance = col_real(st, 8)};
        kvs_drift_locality *r = &out[cnt - 1];
        if (isnan(r->chance)) r->chance = kvs_analysis_drift_chance(r->k, P + r->step + r->delta + 1);
    }
    if (s != SQLITE_DONE) {
        rc = kvs_results_db_error(db, "read drift locality");
        goto cleanup;
    }
    *rows = out;
    *n = cnt;
    out = NULL;
cleanup:
    sqlite3_finalize(st);
    free(out);
    return rc;
}

kvs_status kvs_results_drift_query_locality_units(kvs_results_db *db, int64_t run_id, kvs_drift_unit unit,
                                                  int32_t layer, int64_t k, kvs_drift_locality_unit **rows,
                                                  int64_t *n) {
    if (!db || !rows || !n) return kvs_fail(KVS_ERR_INVALID_ARG, "drift results: NULL argument");
    *rows = NULL;
    *n = 0;
    kvs_status rc = no_drift(db);
    if (rc != KVS_OK) return rc;
    sqlite3_stmt *st = NULL;
    kvs_drift_locality_unit *out = NULL;
    int64_t cnt = 0, cap = 0, P = 0, T = 0;
    const char *chance = NULL;
    char select[256];
    KVS_TRY(rc = chance_column(db, "drift_locality_units", &chance));
    KVS_TRY(rc = run_shape(db, run_id, &P, &T));
    snprintf(select, sizeof select,
             "SELECT layer, unit_index, k, delta, n_pairs, mean, %s FROM drift_locality_units", chance);
    KVS_TRY(rc = prepare_filtered(db, select, "layer, unit_index, k, delta", run_id, unit, layer, k, &st));
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        KVS_TRY(rc = grow((void **)&out, cnt, &cap, sizeof *out));
        out[cnt++] = (kvs_drift_locality_unit){.layer = sqlite3_column_int(st, 0), .unit = unit,
                                               .index = sqlite3_column_int(st, 1), .k = sqlite3_column_int64(st, 2),
                                               .delta = sqlite3_column_int(st, 3),
                                               .n_pairs = sqlite3_column_int64(st, 4), .mean = col_real(st, 5),
                                               .chance = col_real(st, 6)};
        kvs_drift_locality_unit *r = &out[cnt - 1];
        if (isnan(r->chance)) r->chance = kvs_analysis_drift_locality_chance(r->k, P, T, r->delta);
    }
    if (s != SQLITE_DONE) {
        rc = kvs_results_db_error(db, "read drift locality per unit");
        goto cleanup;
    }
    *rows = out;
    *n = cnt;
    out = NULL;
cleanup:
    sqlite3_finalize(st);
    free(out);
    return rc;
}
