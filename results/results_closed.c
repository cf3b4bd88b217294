/* results_closed.c — SQL of the "closed" table family (results_closed.h; results/SCHEMA.md "Closed-loop runs";
 * family rules in results/results_internal.h).
 */
#include "results_closed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/sha256.h"
#include "results_internal.h"

/* The shared column helpers of results/results_internal.h under their short names. */
#define bind_real(st, i, v) ((void)kvs_results_bind_real((st), (i), (v)))
#define col_real kvs_results_col_real
#define col_text(st, i) kvs_results_col_dup((st), (i), NULL)

static const char *const closed_schema =
    "CREATE TABLE IF NOT EXISTS closed_runs (\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now')),\n"
    "  kvsim_version TEXT NOT NULL,\n"
    "  model TEXT NOT NULL,\n"
    "  mode TEXT NOT NULL CHECK (mode IN ('teacher','free')),\n"
    "  source TEXT NOT NULL,\n"
    "  trace_id INTEGER REFERENCES traces(id),\n"
    "  tokens_sha256 TEXT NOT NULL,\n"
    "  n_tokens INTEGER NOT NULL,\n"
    "  prompt_len INTEGER NOT NULL,\n"
    "  policy TEXT NOT NULL,\n"
    "  params TEXT NOT NULL,\n"
    "  budget_tokens INTEGER NOT NULL,\n"
    "  budget_max INTEGER,\n"
    "  layout TEXT,\n"
    "  budget_scope TEXT,\n"
    "  status TEXT NOT NULL CHECK (status IN ('complete','failed')),\n"
    "  error TEXT,\n"
    "  n_steps INTEGER,\n"
    "  kl_mean REAL, kl_max REAL, top1_agree REAL,\n"
    "  nll_full_mean REAL, nll_policy_mean REAL, ppl_full REAL, ppl_policy REAL,\n"
    "  out_err_mean REAL, out_err_p95 REAL, attn_recall_mean REAL, topk_overlap_mean REAL, attended_mean REAL,\n"
    "  n_generated INTEGER, first_divergence INTEGER, token_agreement REAL,\n"
    "  full_text TEXT, policy_text TEXT,\n"
    "  wall_seconds REAL\n"
    ");\n"
    "CREATE TABLE IF NOT EXISTS closed_steps (\n"
    "  run_id INTEGER NOT NULL REFERENCES closed_runs(id) ON DELETE CASCADE,\n"
    "  step INTEGER NOT NULL,\n"
    "  position INTEGER NOT NULL,\n"
    "  ref_token INTEGER NOT NULL, full_top1 INTEGER NOT NULL, policy_top1 INTEGER NOT NULL,\n"
    "  kl REAL, nll_full REAL, nll_policy REAL,\n"
    "  out_err REAL, attn_recall REAL, topk_overlap REAL, attended REAL,\n"
    "  PRIMARY KEY (run_id, step)\n"
    ");\n";


static void bind_text(sqlite3_stmt *st, int i, const char *s) {
    if (s) sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, i);
}

kvs_status kvs_results_closed_write(kvs_results_db *db, const kvs_results_closed_run *run, int64_t *run_id) {
    const char *path = kvs_results_path(db);
    if (!run->model || !run->mode || !run->source || !run->tokens || run->n_tokens < 1 || !run->policy ||
        !run->params || !run->status || !run->kvsim_version)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: closed-loop run: model, mode, source, tokens, policy, params, "
                        "status and version are required", path);
    char sha[65];
    kvs_sha256_hex(run->tokens, (size_t)run->n_tokens * sizeof(int32_t), sha);
    sqlite3_stmt *ins = NULL, *step = NULL;
    kvs_status s = kvs_results_txn_begin(db, "closed-loop run");
    if (s != KVS_OK) return s;
    int64_t trace_id = 0;
    KVS_TRY(s = kvs_results_exec(db, closed_schema, "create closed-loop tables"));
    if (run->trace) KVS_TRY(s = kvs_results_trace_id(db, run->trace, &trace_id));
    KVS_TRY(s = kvs_results_prepare(
                db,
                "INSERT INTO closed_runs (kvsim_version, model, mode, source, trace_id, tokens_sha256, n_tokens, "
                "prompt_len, policy, params, budget_tokens, budget_max, layout, budget_scope, status, error, n_steps, "
                "kl_mean, kl_max, top1_agree, nll_full_mean, nll_policy_mean, ppl_full, ppl_policy, out_err_mean, "
                "out_err_p95, attn_recall_mean, topk_overlap_mean, attended_mean, n_generated, first_divergence, "
                "token_agreement, full_text, policy_text, wall_seconds) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,"
                "?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                &ins, "insert closed-loop run"));
    const kvs_closed_loop_result *r = run->result;
    int free_mode = !strcmp(run->mode, "free");
    int i = 1;
    bind_text(ins, i++, run->kvsim_version);
    bind_text(ins, i++, run->model);
    bind_text(ins, i++, run->mode);
    bind_text(ins, i++, run->source);
    if (trace_id > 0) sqlite3_bind_int64(ins, i++, trace_id);
    else sqlite3_bind_null(ins, i++);
    bind_text(ins, i++, sha);
    sqlite3_bind_int64(ins, i++, run->n_tokens);
    sqlite3_bind_int64(ins, i++, run->prompt_len);
    bind_text(ins, i++, run->policy);
    bind_text(ins, i++, run->params);
    sqlite3_bind_int64(ins, i++, run->budget_tokens);
    if (r) sqlite3_bind_int64(ins, i++, r->budget_max);
    else sqlite3_bind_null(ins, i++);
    bind_text(ins, i++, run->layout);
    bind_text(ins, i++, run->budget_scope);
    bind_text(ins, i++, run->status);
    bind_text(ins, i++, run->error);
    if (r) {
        sqlite3_bind_int64(ins, i++, r->n_steps);
        const double v[] = {r->kl_mean, r->kl_max, r->top1_agree, r->nll_full_mean, r->nll_policy_mean, r->ppl_full,
                            r->ppl_policy, r->out_err_mean, r->out_err_p95, r->attn_recall_mean,
                            r->topk_overlap_mean, r->attended_mean};
        for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) bind_real(ins, i++, r->n_steps > 0 ? v[k] : NAN);
    } else {
        for (int k = 0; k < 13; k++) sqlite3_bind_null(ins, i++);
    }
    if (r && free_mode) {
        sqlite3_bind_int64(ins, i++, r->n_generated);
        sqlite3_bind_int64(ins, i++, r->first_divergence);
        bind_real(ins, i++, r->token_agreement);
    } else {
        for (int k = 0; k < 3; k++) sqlite3_bind_null(ins, i++);
    }
    bind_text(ins, i++, run->full_text);
    bind_text(ins, i++, run->policy_text);
    bind_real(ins, i++, run->wall_seconds);
    KVS_TRY(s = kvs_results_step_done(db, ins, "insert closed-loop run"));
    int64_t id = sqlite3_last_insert_rowid(kvs_results_sqlite(db));
    if (r && r->n_steps > 0) {
        KVS_TRY(s = kvs_results_prepare(db,
                                        "INSERT INTO closed_steps (run_id, step, position, ref_token, full_top1, "
                                        "policy_top1, kl, nll_full, nll_policy, out_err, attn_recall, topk_overlap, "
                                        "attended) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                                        &step, "insert closed-loop steps"));
        for (int64_t k = 0; k < r->n_steps; k++) {
            const kvs_closed_loop_step *p = &r->steps[k];
            sqlite3_bind_int64(step, 1, id);
            sqlite3_bind_int64(step, 2, k);
            sqlite3_bind_int64(step, 3, p->position);
            sqlite3_bind_int64(step, 4, p->ref_token);
            sqlite3_bind_int64(step, 5, p->full_top1);
            sqlite3_bind_int64(step, 6, p->policy_top1);
            bind_real(step, 7, p->kl);
            bind_real(step, 8, p->nll_full);
            bind_real(step, 9, p->nll_policy);
            bind_real(step, 10, p->out_err);
            bind_real(step, 11, p->attn_recall);
            bind_real(step, 12, p->topk_overlap);
            bind_real(step, 13, p->attended);
            KVS_TRY(s = kvs_results_step_done(db, step, "insert closed-loop steps"));
        }
    }
    sqlite3_finalize(ins);
    sqlite3_finalize(step);
    ins = step = NULL;
    KVS_TRY(s = kvs_results_txn_commit(db, "closed-loop run"));
    if (run_id) *run_id = id;
    return KVS_OK;
cleanup:
    sqlite3_finalize(ins);
    sqlite3_finalize(step);
    kvs_results_txn_rollback(db);
    return s;
}



void kvs_results_closed_rows_free(kvs_results_closed_row *rows, int64_t n) {
    if (!rows) return;
    for (int64_t i = 0; i < n; i++) {
        kvs_results_closed_row *r = &rows[i];
        free(r->model);
        free(r->mode);
        free(r->source);
        free(r->tokens_sha256);
        free(r->policy);
        free(r->params);
        free(r->budget_scope);
        free(r->trace_sha256);
    }
    free(rows);
}

kvs_status kvs_results_closed_query(kvs_results_db *db, kvs_results_closed_row **rows, int64_t *n) {
    *rows = NULL;
    *n = 0;
    int ex = kvs_results_table_exists(db, "closed_runs");
    if (ex < 0) return KVS_ERR_DB;
    if (ex == 0) return kvs_fail(KVS_ERR_STATE, "no closed-loop results in %s (run kvsim generate first)", kvs_results_path(db));
    /* the trace's content hash where its writer recorded one (table sweep_traces: generate and replay do) */
    int has_sha = kvs_results_table_exists(db, "sweep_traces");
    if (has_sha < 0) return KVS_ERR_DB;
    char sql[1024];
    snprintf(sql, sizeof sql,
             "SELECT c.id, COALESCE(c.trace_id, 0), c.model, c.mode, c.source, c.tokens_sha256, c.policy, c.params, "
             "c.budget_scope, c.n_tokens, c.prompt_len, c.budget_tokens, c.n_steps, c.kl_mean, c.kl_max, "
             "c.top1_agree, c.ppl_full, c.ppl_policy, c.out_err_mean, c.out_err_p95, c.attn_recall_mean, "
             "c.topk_overlap_mean, c.attended_mean, c.token_agreement, COALESCE(c.first_divergence, -1), %s "
             "FROM closed_runs c%s WHERE c.status = 'complete' ORDER BY c.id",
             has_sha ? "h.sha256" : "NULL", has_sha ? " LEFT JOIN sweep_traces h ON h.trace_id = c.trace_id" : "");
    sqlite3_stmt *st = NULL;
    kvs_status s = kvs_results_prepare(db, sql, &st, "read closed-loop runs");
    if (s != KVS_OK) return s;
    kvs_results_closed_row *out = NULL;
    int64_t cnt = 0, cap = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (cnt == cap) {
            cap = cap ? 2 * cap : 16;
            kvs_results_closed_row *g = realloc(out, (size_t)cap * sizeof *g);
            if (!g) {
                s = kvs_fail(KVS_ERR_NOMEM, "out of memory");
                break;
            }
            out = g;
        }
        kvs_results_closed_row *r = &out[cnt++];
        memset(r, 0, sizeof *r);
        r->id = sqlite3_column_int64(st, 0);
        r->trace_id = sqlite3_column_int64(st, 1);
        r->model = col_text(st, 2);
        r->mode = col_text(st, 3);
        r->source = col_text(st, 4);
        r->tokens_sha256 = col_text(st, 5);
        r->policy = col_text(st, 6);
        r->params = col_text(st, 7);
        r->budget_scope = col_text(st, 8);
        r->n_tokens = sqlite3_column_int64(st, 9);
        r->prompt_len = sqlite3_column_int64(st, 10);
        r->budget_tokens = sqlite3_column_int64(st, 11);
        r->n_steps = sqlite3_column_int64(st, 12);
        double *dst[] = {&r->kl_mean, &r->kl_max, &r->top1_agree, &r->ppl_full, &r->ppl_policy, &r->out_err_mean,
                         &r->out_err_p95, &r->attn_recall_mean, &r->topk_overlap_mean, &r->attended_mean,
                         &r->token_agreement};
        for (int k = 0; k < 11; k++) *dst[k] = col_real(st, 13 + k);
        r->first_divergence = sqlite3_column_int64(st, 24);
        int oom = 0;
        r->trace_sha256 = kvs_results_col_dup(st, 25, &oom);
        if (oom || !r->model || !r->mode || !r->policy || !r->params) {
            s = kvs_fail(KVS_ERR_NOMEM, "out of memory");
            break;
        }
    }
    if (s == KVS_OK && rc != SQLITE_DONE) s = kvs_results_db_error(db, "read closed-loop runs");
    sqlite3_finalize(st);
    if (s != KVS_OK) {
        kvs_results_closed_rows_free(out, cnt);
        return s;
    }
    *rows = out;
    *n = cnt;
    return KVS_OK;
}
