/* results_plan.c — the "plan" table family (see results_plan.h; tables documented in results/SCHEMA.md, "Table
 * family: plan"), following the family rules of results/results_internal.h.
 */
#include "results_plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "results_internal.h"

/* The shared column helpers of results/results_internal.h under their short names. */
#define bind_real(st, i, v) ((void)kvs_results_bind_real((st), (i), (v)))
#define col_real kvs_results_col_real
#define col_text(st, i) kvs_results_col_dup((st), (i), NULL)

static const char plan_schema[] =
    "CREATE TABLE IF NOT EXISTS plans ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),"
    " kvsim_version TEXT,"
    " trace_id INTEGER REFERENCES traces(id),"
    " model TEXT NOT NULL, model_source TEXT,"
    " n_layers INTEGER NOT NULL, n_heads INTEGER NOT NULL, n_kv_heads INTEGER NOT NULL, head_dim INTEGER NOT NULL,"
    " params REAL, kv_dtype TEXT NOT NULL, kv_bytes_per_token REAL NOT NULL,"
    " weight_dtype TEXT, weight_bytes REAL NOT NULL,"
    " n_gpus INTEGER NOT NULL, gpu_bytes REAL, reserve_bytes REAL NOT NULL, kv_pool_bytes REAL,"
    " batch INTEGER NOT NULL, context INTEGER NOT NULL, response INTEGER NOT NULL,"
    " policy TEXT NOT NULL, budget INTEGER,"
    " profile_db TEXT, profile_run_id INTEGER, profile_policy TEXT, profile_params TEXT, profile_x TEXT,"
    " aux_scale TEXT, kv_a REAL, kv_b REAL, aux_a REAL, aux_b REAL, host_a REAL, host_b REAL,"
    " transfer_a REAL, transfer_b REAL, fit_r2 REAL, fit_n_min INTEGER, fit_n_max INTEGER, fit_points INTEGER);"
    "CREATE TABLE IF NOT EXISTS plan_points ("
    " plan_id INTEGER NOT NULL REFERENCES plans(id) ON DELETE CASCADE,"
    " series TEXT NOT NULL, budget INTEGER,"
    " context INTEGER NOT NULL, response INTEGER NOT NULL, batch INTEGER NOT NULL,"
    " seq_device_bytes REAL NOT NULL, total_bytes REAL NOT NULL, host_bytes REAL NOT NULL,"
    " pcie_bytes_per_step REAL NOT NULL, max_batch INTEGER, max_context INTEGER,"
    " PRIMARY KEY (plan_id, series, context, response)) WITHOUT ROWID;";

/* A plans table of an earlier kvsim lacks the steady-state columns: added in the write's transaction. */
static kvs_status plan_columns(kvs_results_db *db) {
    int has = kvs_results_has_column(db, "plans", "fit_points", "read the plan columns");
    if (has < 0) return KVS_ERR_DB;
    if (has) return KVS_OK;
    return kvs_results_exec(db,
                            "ALTER TABLE plans ADD COLUMN fit_n_min INTEGER; ALTER TABLE plans ADD COLUMN fit_n_max "
                            "INTEGER; ALTER TABLE plans ADD COLUMN fit_points INTEGER;",
                            "add the plan's steady-state columns");
}

static void bind_text(sqlite3_stmt *st, int i, const char *s) {
    if (s) sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, i);
}
static void bind_pos(sqlite3_stmt *st, int i, int64_t v) { /* > 0, else NULL */
    if (v > 0) sqlite3_bind_int64(st, i, v);
    else sqlite3_bind_null(st, i);
}
static void bind_cap(sqlite3_stmt *st, int i, int64_t v) { /* >= -1 (-1 = unbounded), else NULL */
    if (v >= -1) sqlite3_bind_int64(st, i, v);
    else sqlite3_bind_null(st, i);
}

kvs_status kvs_results_write_plan(kvs_results_db *db, const kvs_results_plan *p, const kvs_results_trace *trace,
                                  const kvs_results_plan_point *pts, int64_t n, int64_t *plan_id) {
    if (!db || !p || !p->model || !p->kv_dtype || !p->policy || (n > 0 && !pts) || n < 0)
        return kvs_fail(KVS_ERR_INVALID_ARG, "write plan: NULL database, plan or points");
    for (int64_t i = 0; i < n; i++)
        if (!pts[i].series) return kvs_fail(KVS_ERR_INVALID_ARG, "write plan: point %lld has no series", (long long)i);
    kvs_status st = kvs_results_txn_begin(db, "write plan");
    if (st != KVS_OK) return st;
    sqlite3_stmt *ins = NULL, *pt = NULL;
    int64_t trace_id = 0;
    KVS_TRY(st = kvs_results_exec(db, plan_schema, "create the plan tables"));
    KVS_TRY(st = plan_columns(db));
    if (trace) KVS_TRY(st = kvs_results_trace_id(db, trace, &trace_id));
    KVS_TRY(st = kvs_results_prepare(
                db,
                "INSERT INTO plans (kvsim_version, trace_id, model, model_source, n_layers, n_heads, n_kv_heads, "
                "head_dim, params, kv_dtype, kv_bytes_per_token, weight_dtype, weight_bytes, n_gpus, gpu_bytes, "
                "reserve_bytes, kv_pool_bytes, batch, context, response, policy, budget, profile_db, profile_run_id, "
                "profile_policy, profile_params, profile_x, aux_scale, kv_a, kv_b, aux_a, aux_b, host_a, host_b, "
                "transfer_a, transfer_b, fit_r2, fit_n_min, fit_n_max, fit_points) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,"
                "?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22,?23,?24,?25,?26,?27,?28,?29,?30,?31,?32,?33,?34,"
                "?35,?36,?37,?38,?39,?40)",
                &ins, "insert a plan"));
    bind_text(ins, 1, p->kvsim_version);
    bind_pos(ins, 2, trace_id);
    bind_text(ins, 3, p->model);
    bind_text(ins, 4, p->model_source);
    sqlite3_bind_int(ins, 5, p->n_layers);
    sqlite3_bind_int(ins, 6, p->n_heads);
    sqlite3_bind_int(ins, 7, p->n_kv_heads);
    sqlite3_bind_int(ins, 8, p->head_dim);
    bind_real(ins, 9, p->params);
    bind_text(ins, 10, p->kv_dtype);
    sqlite3_bind_double(ins, 11, p->kv_bytes_per_token);
    bind_text(ins, 12, p->weight_dtype);
    sqlite3_bind_double(ins, 13, p->weight_bytes);
    sqlite3_bind_int(ins, 14, p->n_gpus);
    bind_real(ins, 15, p->gpu_bytes);
    sqlite3_bind_double(ins, 16, p->reserve_bytes);
    bind_real(ins, 17, p->kv_pool_bytes);
    sqlite3_bind_int64(ins, 18, p->batch);
    sqlite3_bind_int64(ins, 19, p->context);
    sqlite3_bind_int64(ins, 20, p->response);
    bind_text(ins, 21, p->policy);
    bind_pos(ins, 22, p->budget);
    bind_text(ins, 23, p->profile_db);
    bind_pos(ins, 24, p->profile_run_id);
    bind_text(ins, 25, p->profile_policy);
    bind_text(ins, 26, p->profile_params);
    bind_text(ins, 27, p->profile_x);
    bind_text(ins, 28, p->aux_scale);
    const double fit[9] = {p->kv_a, p->kv_b, p->aux_a, p->aux_b, p->host_a, p->host_b, p->transfer_a, p->transfer_b,
                           p->fit_r2};
    for (int i = 0; i < 9; i++) bind_real(ins, 29 + i, fit[i]);
    bind_pos(ins, 38, p->fit_n_min);
    bind_pos(ins, 39, p->fit_n_max);
    bind_pos(ins, 40, p->fit_points);
    KVS_TRY(st = kvs_results_step_done(db, ins, "insert a plan"));
    const int64_t id = sqlite3_last_insert_rowid(kvs_results_sqlite(db));
    KVS_TRY(st = kvs_results_prepare(db,
                                     "INSERT INTO plan_points (plan_id, series, budget, context, response, batch, "
                                     "seq_device_bytes, total_bytes, host_bytes, pcie_bytes_per_step, max_batch, "
                                     "max_context) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12)",
                                     &pt, "insert a plan point"));
    for (int64_t i = 0; i < n; i++) {
        const kvs_results_plan_point *q = &pts[i];
        sqlite3_bind_int64(pt, 1, id);
        bind_text(pt, 2, q->series);
        bind_pos(pt, 3, q->budget);
        sqlite3_bind_int64(pt, 4, q->context);
        sqlite3_bind_int64(pt, 5, q->response);
        sqlite3_bind_int64(pt, 6, q->batch);
        sqlite3_bind_double(pt, 7, q->seq_device_bytes);
        sqlite3_bind_double(pt, 8, q->total_bytes);
        sqlite3_bind_double(pt, 9, q->host_bytes);
        sqlite3_bind_double(pt, 10, q->pcie_bytes_per_step);
        bind_cap(pt, 11, q->max_batch);
        bind_cap(pt, 12, q->max_context);
        KVS_TRY(st = kvs_results_step_done(db, pt, "insert a plan point"));
    }
    sqlite3_finalize(ins);
    sqlite3_finalize(pt);
    ins = pt = NULL;
    KVS_TRY(st = kvs_results_txn_commit(db, "write plan"));
    if (plan_id) *plan_id = id;
    return KVS_OK;
cleanup:
    sqlite3_finalize(ins);
    sqlite3_finalize(pt);
    kvs_results_txn_rollback(db);
    return st;
}

/* ---- reading ---- */

static int64_t col_cap(sqlite3_stmt *st, int i) { /* NULL = not computed: -2 */
    return sqlite3_column_type(st, i) == SQLITE_NULL ? -2 : sqlite3_column_int64(st, i);
}

void kvs_results_plan_rows_free(kvs_results_plan_row *rows, int64_t n) {
    for (int64_t i = 0; rows && i < n; i++) {
        free(rows[i].model);
        free(rows[i].kv_dtype);
        free(rows[i].policy);
        free(rows[i].created_at);
        for (int64_t j = 0; j < rows[i].n_points; j++) free((char *)rows[i].points[j].series);
        free(rows[i].points);
    }
    free(rows);
}

kvs_status kvs_results_query_plans(kvs_results_db *db, kvs_results_plan_row **out, int64_t *n_out) {
    if (!db || !out || !n_out) return kvs_fail(KVS_ERR_INVALID_ARG, "query plans: NULL argument");
    *out = NULL;
    *n_out = 0;
    int have = kvs_results_table_exists(db, "plans");
    if (have < 0) return KVS_ERR_DB;
    if (!have) return kvs_fail(KVS_ERR_DB, "no plan results in %s", kvs_results_path(db));
    sqlite3_stmt *q = NULL, *pq = NULL;
    kvs_results_plan_row *rows = NULL;
    int64_t n = 0, cap = 0;
    kvs_status st = kvs_results_prepare(db,
                                        "SELECT id, model, kv_dtype, policy, created_at, kv_bytes_per_token, "
                                        "weight_bytes, gpu_bytes, kv_pool_bytes, n_gpus, batch, context, response, "
                                        "budget, trace_id FROM plans ORDER BY id",
                                        &q, "read plans");
    KVS_TRY(st);
    KVS_TRY(st = kvs_results_prepare(db,
                                     "SELECT series, budget, context, response, batch, seq_device_bytes, total_bytes, "
                                     "host_bytes, pcie_bytes_per_step, max_batch, max_context FROM plan_points "
                                     "WHERE plan_id = ?1 ORDER BY series, context, response",
                                     &pq, "read plan points"));
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? 2 * cap : 4;
            kvs_results_plan_row *g = realloc(rows, (size_t)cap * sizeof *g);
            if (!g) {
                st = kvs_fail(KVS_ERR_NOMEM, "query plans: out of memory");
                goto cleanup;
            }
            rows = g;
        }
        kvs_results_plan_row *r = &rows[n++];
        memset(r, 0, sizeof *r);
        r->id = sqlite3_column_int64(q, 0);
        r->model = col_text(q, 1);
        r->kv_dtype = col_text(q, 2);
        r->policy = col_text(q, 3);
        r->created_at = col_text(q, 4);
        r->kv_bytes_per_token = col_real(q, 5);
        r->weight_bytes = col_real(q, 6);
        r->gpu_bytes = col_real(q, 7);
        r->kv_pool_bytes = col_real(q, 8);
        r->n_gpus = sqlite3_column_int(q, 9);
        r->batch = sqlite3_column_int64(q, 10);
        r->context = sqlite3_column_int64(q, 11);
        r->response = sqlite3_column_int64(q, 12);
        r->budget = sqlite3_column_int64(q, 13);
        r->trace_id = sqlite3_column_int64(q, 14);
        sqlite3_bind_int64(pq, 1, r->id);
        int64_t pcap = 0;
        while ((rc = sqlite3_step(pq)) == SQLITE_ROW) {
            if (r->n_points == pcap) {
                pcap = pcap ? 2 * pcap : 16;
                kvs_results_plan_point *g = realloc(r->points, (size_t)pcap * sizeof *g);
                if (!g) {
                    st = kvs_fail(KVS_ERR_NOMEM, "query plans: out of memory");
                    goto cleanup;
                }
                r->points = g;
            }
            kvs_results_plan_point *p = &r->points[r->n_points++];
            p->series = col_text(pq, 0);
            p->budget = sqlite3_column_int64(pq, 1);
            p->context = sqlite3_column_int64(pq, 2);
            p->response = sqlite3_column_int64(pq, 3);
            p->batch = sqlite3_column_int64(pq, 4);
            p->seq_device_bytes = col_real(pq, 5);
            p->total_bytes = col_real(pq, 6);
            p->host_bytes = col_real(pq, 7);
            p->pcie_bytes_per_step = col_real(pq, 8);
            p->max_batch = col_cap(pq, 9);
            p->max_context = col_cap(pq, 10);
        }
        sqlite3_reset(pq);
        if (rc != SQLITE_DONE) {
            st = kvs_results_db_error(db, "read plan points");
            goto cleanup;
        }
    }
    if (rc != SQLITE_DONE) {
        st = kvs_results_db_error(db, "read plans");
        goto cleanup;
    }
    *out = rows;
    *n_out = n;
    rows = NULL;
    n = 0;
cleanup:
    sqlite3_finalize(q);
    sqlite3_finalize(pq);
    kvs_results_plan_rows_free(rows, n);
    return st;
}

/* ---- timed points (kvsim plan --hw --db) ---- */

static const char plan_times_schema[] =
    "CREATE TABLE IF NOT EXISTS plan_times ("
    " plan_id INTEGER NOT NULL REFERENCES plans(id) ON DELETE CASCADE,"
    " series TEXT NOT NULL, context INTEGER NOT NULL, response INTEGER NOT NULL, batch INTEGER NOT NULL,"
    " hw TEXT NOT NULL, n_gpus INTEGER NOT NULL, mbu REAL NOT NULL, mfu REAL NOT NULL,"
    " ttft_s REAL NOT NULL, tpot_s REAL NOT NULL, tokens_per_s REAL NOT NULL, decode_bound TEXT NOT NULL,"
    " fits INTEGER NOT NULL, best INTEGER NOT NULL,"
    " PRIMARY KEY (plan_id, series, context, response, batch)) WITHOUT ROWID;";

kvs_status kvs_results_write_plan_times(kvs_results_db *db, int64_t plan_id, const kvs_results_plan_time *rows,
                                        int64_t n) {
    if (!db || (n > 0 && !rows) || n < 0 || plan_id < 1)
        return kvs_fail(KVS_ERR_INVALID_ARG, "write plan times: NULL database or rows, or no plan");
    for (int64_t i = 0; i < n; i++)
        if (!rows[i].series || !rows[i].hw || !rows[i].decode_bound)
            return kvs_fail(KVS_ERR_INVALID_ARG, "write plan times: row %lld lacks its series, GPU or bound",
                            (long long)i);
    kvs_status st = kvs_results_txn_begin(db, "write plan times");
    if (st != KVS_OK) return st;
    sqlite3_stmt *ins = NULL;
    KVS_TRY(st = kvs_results_exec(db, plan_times_schema, "create the plan_times table"));
    KVS_TRY(st = kvs_results_prepare(db,
                                     "INSERT INTO plan_times (plan_id, series, context, response, batch, hw, n_gpus, "
                                     "mbu, mfu, ttft_s, tpot_s, tokens_per_s, decode_bound, fits, best) VALUES (?1,?2,"
                                     "?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15)",
                                     &ins, "insert a plan time"));
    for (int64_t i = 0; i < n; i++) {
        const kvs_results_plan_time *r = &rows[i];
        sqlite3_bind_int64(ins, 1, plan_id);
        bind_text(ins, 2, r->series);
        sqlite3_bind_int64(ins, 3, r->context);
        sqlite3_bind_int64(ins, 4, r->response);
        sqlite3_bind_int64(ins, 5, r->batch);
        bind_text(ins, 6, r->hw);
        sqlite3_bind_int(ins, 7, r->n_gpus);
        const double v[5] = {r->mbu, r->mfu, r->ttft_s, r->tpot_s, r->tokens_per_s};
        for (int k = 0; k < 5; k++) sqlite3_bind_double(ins, 8 + k, v[k]);
        bind_text(ins, 13, r->decode_bound);
        sqlite3_bind_int(ins, 14, r->fits != 0);
        sqlite3_bind_int(ins, 15, r->best != 0);
        KVS_TRY(st = kvs_results_step_done(db, ins, "insert a plan time"));
    }
    sqlite3_finalize(ins);
    ins = NULL;
    KVS_TRY(st = kvs_results_txn_commit(db, "write plan times"));
    return KVS_OK;
cleanup:
    sqlite3_finalize(ins);
    kvs_results_txn_rollback(db);
    return st;
}

void kvs_results_plan_times_free(kvs_results_plan_time *rows, int64_t n) {
    for (int64_t i = 0; rows && i < n; i++) {
        free((char *)rows[i].series);
        free((char *)rows[i].hw);
        free((char *)rows[i].decode_bound);
    }
    free(rows);
}

kvs_status kvs_results_query_plan_times(kvs_results_db *db, kvs_results_plan_time **out, int64_t *n_out) {
    if (!db || !out || !n_out) return kvs_fail(KVS_ERR_INVALID_ARG, "query plan times: NULL argument");
    *out = NULL;
    *n_out = 0;
    int have = kvs_results_table_exists(db, "plan_times");
    if (have < 0) return KVS_ERR_DB;
    if (!have) return KVS_OK;
    sqlite3_stmt *q = NULL;
    kvs_results_plan_time *rows = NULL;
    int64_t n = 0, cap = 0;
    int rc;
    kvs_status st = kvs_results_prepare(db,
                                        "SELECT plan_id, series, context, response, batch, hw, n_gpus, mbu, mfu, "
                                        "ttft_s, tpot_s, tokens_per_s, decode_bound, fits, best FROM plan_times "
                                        "ORDER BY plan_id, series, context, response, batch",
                                        &q, "read plan times");
    KVS_TRY(st);
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            kvs_results_plan_time *g = realloc(rows, (size_t)cap * sizeof *g);
            if (!g) {
                st = kvs_fail(KVS_ERR_NOMEM, "query plan times: out of memory");
                goto cleanup;
            }
            rows = g;
        }
        kvs_results_plan_time *r = &rows[n++];
        memset(r, 0, sizeof *r);
        r->plan_id = sqlite3_column_int64(q, 0);
        r->series = col_text(q, 1);
        r->context = sqlite3_column_int64(q, 2);
        r->response = sqlite3_column_int64(q, 3);
        r->batch = sqlite3_column_int64(q, 4);
        r->hw = col_text(q, 5);
        r->n_gpus = sqlite3_column_int(q, 6);
        r->mbu = col_real(q, 7);
        r->mfu = col_real(q, 8);
        r->ttft_s = col_real(q, 9);
        r->tpot_s = col_real(q, 10);
        r->tokens_per_s = col_real(q, 11);
        r->decode_bound = col_text(q, 12);
        r->fits = sqlite3_column_int(q, 13);
        r->best = sqlite3_column_int(q, 14);
    }
    if (rc != SQLITE_DONE) {
        st = kvs_results_db_error(db, "read plan times");
        goto cleanup;
    }
    *out = rows;
    *n_out = n;
    rows = NULL;
    n = 0;
cleanup:
    sqlite3_finalize(q);
    kvs_results_plan_times_free(rows, n);
    return st;
}

/* ---- the measured profile of a run (kvsim plan --profile) ---- */

kvs_status kvs_plan_profile_read(const char *db_path, int64_t run_id, const char *policy, int64_t budget,
                                 kvs_plan_profile *out) {
    if (!db_path || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "plan: NULL database path");
    kvs_results_db *db = NULL;
    kvs_results_run_row *rows = NULL;
    int64_t n_rows = 0;
    kvs_results_series s[6] = {{0}};
    int64_t *lens = NULL;
    double *vals = NULL;
    kvs_status st = kvs_results_open_readonly(db_path, &db);
    if (st != KVS_OK) return st;
    kvs_results_filter f = {0};
    f.run_id = run_id > 0 ? run_id : 0;
    f.policy = run_id > 0 ? NULL : policy;
    f.budget_tokens = run_id > 0 ? 0 : budget;
    KVS_TRY(st = kvs_results_query_runs(db, &f, &rows, &n_rows));
    if (n_rows == 0) {
        char what[160] = "";
        if (run_id > 0) snprintf(what, sizeof what, " with id %lld", (long long)run_id);
        else if (policy && budget > 0) snprintf(what, sizeof what, " of policy %s at budget %lld", policy, (long long)budget);
        else if (policy) snprintf(what, sizeof what, " of policy %s", policy);
        else if (budget > 0) snprintf(what, sizeof what, " at budget %lld", (long long)budget);
        st = kvs_fail(KVS_ERR_DB, "%s: no complete runs%s in the database: nothing to plan with", db_path, what);
        goto cleanup;
    }
    if (n_rows > 1) {
        char list[512];
        size_t used = 0;
        for (int64_t i = 0; i < n_rows && used + 64 < sizeof list; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%lld (%s, budget %lld)", i ? ", " : "",
                                     (long long)rows[i].id, rows[i].policy, (long long)rows[i].budget_tokens);
        st = kvs_fail(KVS_ERR_INVALID_ARG, "%s: %lld runs match: choose one with --run ID (%s%s)", db_path,
                      (long long)n_rows, list, used + 64 >= sizeof list ? ", ..." : "");
        goto cleanup;
    }
    const kvs_results_run_row *r = &rows[0];
    /* --run chooses the run; a --policy or --budget beside it must describe that run, not be dropped silently */
    if (run_id > 0 && ((policy && strcmp(policy, r->policy ? r->policy : "")) ||
                       (budget > 0 && budget != r->budget_tokens))) {
        char want[128];
        if (policy && budget > 0) snprintf(want, sizeof want, "%s at budget %lld", policy, (long long)budget);
        else if (policy) snprintf(want, sizeof want, "%s", policy);
        else snprintf(want, sizeof want, "budget %lld", (long long)budget);
        st = kvs_fail(KVS_ERR_INVALID_ARG, "%s: run %lld is %s at budget %lld, not %s: give --run alone, or --policy "
                                           "and --budget without --run",
                      db_path, (long long)r->id, r->policy ? r->policy : "?", (long long)r->budget_tokens, want);
        goto cleanup;
    }
    kvs_plan_profile p = {0};
    p.run_id = r->id;
    snprintf(p.policy, sizeof p.policy, "%s", r->policy ? r->policy : "");
    snprintf(p.params, sizeof p.params, "%s", r->params ? r->params : "");
    snprintf(p.budget_scope, sizeof p.budget_scope, "%s", r->budget_scope ? r->budget_scope : "every_step");
    p.budget_tokens = r->budget_tokens;
    snprintf(p.trace_model, sizeof p.trace_model, "%s", r->model ? r->model : "");
    p.trace_id = r->trace_id;
    p.trace_head_dim = r->head_dim;
    kvs_dtype dt;
    if (!r->dtype || kvs_dtype_parse(r->dtype, &dt) != KVS_OK) {
        st = kvs_fail(KVS_ERR_FORMAT, "%s: run %lld: the trace's dtype '%s' is unknown", db_path, (long long)r->id,
                      r->dtype ? r->dtype : "");
        goto cleanup;
    }
    /* the replay accounts in its kv_bytes option (--kv-bytes), the trace's element size by default */
    int kvb = 0, auxb = 0;
    p.trace_elem_bytes = kvs_results_run_bytes(r, &kvb, &auxb) && kvb > 0 ? (double)kvb : (double)kvs_dtype_size(dt);
    p.tok_bytes = 2.0 * r->head_dim * p.trace_elem_bytes;
    p.prompt_len = r->prompt_len;
    p.x_is_generated = !strcmp(p.budget_scope, "prompt");
    p.per_query_head = r->layout && !strcmp(r->layout, "per_query_head");
    p.trace_group = r->n_kv_heads > 0 ? r->n_heads / r->n_kv_heads : 1;
    p.aux_scale = out->aux_scale;
    if (kvs_plan_aux_rule_of(p.policy, p.params, &p.aux_rule) != KVS_OK) {
        if (p.aux_scale == KVS_PLAN_AUX_AUTO) { /* the message of kvs_plan_aux_rule_of, with the run */
            st = kvs_fail(KVS_ERR_INVALID_ARG, "%s: run %lld: %s", db_path, (long long)r->id, kvs_last_error());
            goto cleanup;
        }
        /* an override without the policy's rule: the copies follow the run's layout */
        p.aux_rule = (kvs_plan_aux_rule){.copies = KVS_PLAN_AUX_PER_LIST, .head_dim_offset = -1};
        snprintf(p.aux_rule.what, sizeof p.aux_rule.what, "unknown to the planner");
        kvs_clear_error();
    }
    const kvs_metric metrics[4] = {KVS_M_STORAGE_KV, KVS_M_STORAGE_AUX, KVS_M_STORAGE_HOST,
                                   KVS_M_TRANSFER};
    for (int i = 0; i < 4; i++) KVS_TRY(st = kvs_results_query_steps(db, r->id, -1, metrics[i], &s[i]));
    const int64_t n = s[0].n;
    if (n == 0) {
        st = kvs_fail(KVS_ERR_DB, "%s: run %lld has no per-step series to measure its profile from (replay with "
                                  "--series-every 1)", db_path, (long long)r->id);
        goto cleanup;
    }
    lens = malloc((size_t)n * sizeof *lens);
    vals = malloc((size_t)n * 3 * sizeof *vals);
    if (!lens || !vals) {
        st = kvs_fail(KVS_ERR_NOMEM, "plan: out of memory");
        goto cleanup;
    }
    /* The other series at the storage series' positions (a series that never recorded a metric is empty: 0). */
    for (int k = 1; k < 4; k++) {
        int64_t j = 0;
        for (int64_t i = 0; i < n; i++) {
            while (j < s[k].n && s[k].position[j] < s[0].position[i]) j++;
            vals[(size_t)(k - 1) * (size_t)n + (size_t)i] =
                j < s[k].n && s[k].position[j] == s[0].position[i] ? s[k].value[j] : 0;
        }
    }
    for (int64_t i = 0; i < n; i++) lens[i] = s[0].position[i] + 1;
    KVS_TRY(st = kvs_plan_profile_fit(&p, lens, s[0].value, vals, vals + n, vals + 2 * n, n));
    /* What a decode step reads (the roofline's memory time, analysis/plan_time.h): the KV and auxiliary traffic
     * series at the storage series' positions. A run without them (recorded before they existed) keeps reads =
     * its resident footprint (has_reads 0). */
    KVS_TRY(st = kvs_results_query_steps(db, r->id, -1, KVS_M_TRAFFIC_KV, &s[4]));
    KVS_TRY(st = kvs_results_query_steps(db, r->id, -1, KVS_M_TRAFFIC_AUX, &s[5]));
    if (s[4].n > 0) {
        for (int k = 4; k < 6; k++) {
            int64_t j = 0;
            for (int64_t i = 0; i < n; i++) {
                while (j < s[k].n && s[k].position[j] < s[0].position[i]) j++;
                vals[(size_t)(k - 4) * (size_t)n + (size_t)i] =
                    j < s[k].n && s[k].position[j] == s[0].position[i] ? s[k].value[j] : 0;
            }
        }
        KVS_TRY(st = kvs_plan_profile_fit_reads(&p, lens, vals, vals + n, n));
    }
    *out = p;
cleanup:
    for (int i = 0; i < 6; i++) kvs_results_series_free(&s[i]);
    free(lens);
    free(vals);
    kvs_results_run_rows_free(rows, n_rows);
    kvs_results_close(db);
    return st;
}
