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
    "  wall_seconds REAL,\n"
    "  codec TEXT\n"
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

/* `codec` (the policy model's codec, canonical spec; NULL = none) came after the tables: a database written before
 * gets the column, NULL in its rows (none), so a reader and a writer see one shape. */
static kvs_status add_codec_column(kvs_results_db *db, const char *table) {
    int has = kvs_results_has_column(db, table, "codec", "read the closed-loop tables");
    if (has < 0) return KVS_ERR_DB;
    if (has) return KVS_OK;
    char sql[96];
    snprintf(sql, sizeof sql, "ALTER TABLE %s ADD COLUMN codec TEXT", table);
    return kvs_results_exec(db, sql, "add the codec column");
}

static const char *codec_or_null(const char *codec) { return codec && codec[0] ? codec : NULL; }

static kvs_status check_run(kvs_results_db *db, const kvs_results_closed_run *run) {
    if (!run->model || !run->mode || !run->source || !run->tokens || run->n_tokens < 1 || !run->policy ||
        !run->params || !run->status || !run->kvsim_version)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: closed-loop run: model, mode, source, tokens, policy, params, "
                        "status and version are required", kvs_results_path(db));
    return KVS_OK;
}

/* One run's closed_runs row and its closed_steps, inside the caller's transaction (tables created, run checked). */
static kvs_status write_run(kvs_results_db *db, const kvs_results_closed_run *run, int64_t *run_id) {
    char sha[65];
    kvs_sha256_hex(run->tokens, (size_t)run->n_tokens * sizeof(int32_t), sha);
    sqlite3_stmt *ins = NULL, *step = NULL;
    kvs_status s = KVS_OK;
    int64_t trace_id = 0;
    if (run->trace) KVS_TRY(s = kvs_results_trace_id(db, run->trace, &trace_id));
    KVS_TRY(s = kvs_results_prepare(
                db,
                "INSERT INTO closed_runs (kvsim_version, model, mode, source, trace_id, tokens_sha256, n_tokens, "
                "prompt_len, policy, params, budget_tokens, budget_max, layout, budget_scope, status, error, n_steps, "
                "kl_mean, kl_max, top1_agree, nll_full_mean, nll_policy_mean, ppl_full, ppl_policy, out_err_mean, "
                "out_err_p95, attn_recall_mean, topk_overlap_mean, attended_mean, n_generated, first_divergence, "
                "token_agreement, full_text, policy_text, wall_seconds, codec) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,"
                "?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
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
    bind_text(ins, i++, codec_or_null(run->codec));
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
    *run_id = id;
cleanup:
    sqlite3_finalize(ins);
    sqlite3_finalize(step);
    return s;
}

kvs_status kvs_results_closed_write(kvs_results_db *db, const kvs_results_closed_run *run, int64_t *run_id) {
    kvs_status s = check_run(db, run);
    if (s != KVS_OK) return s;
    int64_t id = 0;
    if ((s = kvs_results_txn_begin(db, "closed-loop run")) != KVS_OK) return s;
    KVS_TRY(s = kvs_results_exec(db, closed_schema, "create closed-loop tables"));
    KVS_TRY(s = add_codec_column(db, "closed_runs"));
    KVS_TRY(s = write_run(db, run, &id));
    KVS_TRY(s = kvs_results_txn_commit(db, "closed-loop run"));
    if (run_id) *run_id = id;
    return KVS_OK;
cleanup:
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
        free(r->codec);
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
    int has_codec = kvs_results_has_column(db, "closed_runs", "codec", "read closed-loop runs");
    if (has_codec < 0) return KVS_ERR_DB;
    char sql[1024];
    snprintf(sql, sizeof sql,
             "SELECT c.id, COALESCE(c.trace_id, 0), c.model, c.mode, c.source, c.tokens_sha256, c.policy, c.params, "
             "c.budget_scope, c.n_tokens, c.prompt_len, c.budget_tokens, c.n_steps, c.kl_mean, c.kl_max, "
             "c.top1_agree, c.ppl_full, c.ppl_policy, c.out_err_mean, c.out_err_p95, c.attn_recall_mean, "
             "c.topk_overlap_mean, c.attended_mean, c.token_agreement, COALESCE(c.first_divergence, -1), %s, %s "
             "FROM closed_runs c%s WHERE c.status = 'complete' ORDER BY c.id",
             has_sha ? "h.sha256" : "NULL", has_codec ? "c.codec" : "NULL",
             has_sha ? " LEFT JOIN sweep_traces h ON h.trace_id = c.trace_id" : "");
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
        r->codec = kvs_results_col_dup(st, 26, &oom);
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

/* ---- task runs (`kvsim generate --task`) ---- */

static const char *const task_schema =
    "CREATE TABLE IF NOT EXISTS closed_task_runs (\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now')),\n"
    "  kvsim_version TEXT NOT NULL,\n"
    "  model TEXT NOT NULL,\n"
    "  task TEXT NOT NULL,\n"
    "  task_sha256 TEXT NOT NULL,\n"
    "  prompt_tokens INTEGER NOT NULL,\n"
    "  policy TEXT NOT NULL,\n"
    "  params TEXT NOT NULL,\n"
    "  budget_tokens INTEGER NOT NULL,\n"
    "  status TEXT NOT NULL CHECK (status IN ('complete','failed')),\n"
    "  error TEXT,\n"
    "  n_items INTEGER NOT NULL,\n"
    "  n_correct INTEGER, accuracy REAL, acc_lo REAL, acc_hi REAL,\n"
    "  full_correct INTEGER, full_accuracy REAL, full_lo REAL, full_hi REAL,\n"
    "  diff REAL, diff_lo REAL, diff_hi REAL,\n"
    "  level REAL, reps INTEGER, seed TEXT,\n"
    "  wall_seconds REAL,\n"
    "  codec TEXT\n"
    ");\n"
    "CREATE TABLE IF NOT EXISTS closed_task_items (\n"
    "  task_run_id INTEGER NOT NULL REFERENCES closed_task_runs(id) ON DELETE CASCADE,\n"
    "  item INTEGER NOT NULL,\n"
    "  line INTEGER NOT NULL,\n"
    "  run_id INTEGER NOT NULL REFERENCES closed_runs(id),\n"
    "  answer TEXT NOT NULL, expected TEXT NOT NULL,\n"
    "  n_context INTEGER NOT NULL,\n"
    "  full_text TEXT, policy_text TEXT,\n"
    "  full_correct INTEGER, policy_correct INTEGER,\n"
    "  PRIMARY KEY (task_run_id, item)\n"
    ");\n";

kvs_status kvs_results_closed_task_write(kvs_results_db *db, const kvs_results_closed_task_run *run, int64_t *task_id) {
    const char *path = kvs_results_path(db);
    if (!run->model || !run->task || !run->task_sha256 || !run->policy || !run->params || !run->status ||
        !run->kvsim_version || run->n_items < 0 || (run->n_items > 0 && !run->items))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: task run: model, task, its hash, policy, params, status and version "
                        "are required", path);
    for (int64_t k = 0; k < run->n_items; k++) {
        const kvs_results_closed_task_item *it = &run->items[k];
        if (!it->run || !it->answer || !it->expected)
            return kvs_fail(KVS_ERR_INVALID_ARG, "%s: task run: item %lld needs its run, answer and expected text",
                            path, (long long)k);
        kvs_status c = check_run(db, it->run);
        if (c != KVS_OK) return c;
    }
    int complete = !strcmp(run->status, "complete");
    sqlite3_stmt *ins = NULL, *item = NULL;
    kvs_status s = kvs_results_txn_begin(db, "task run");
    if (s != KVS_OK) return s;
    KVS_TRY(s = kvs_results_exec(db, closed_schema, "create closed-loop tables"));
    KVS_TRY(s = kvs_results_exec(db, task_schema, "create task tables"));
    KVS_TRY(s = add_codec_column(db, "closed_runs"));
    KVS_TRY(s = add_codec_column(db, "closed_task_runs"));
    KVS_TRY(s = kvs_results_prepare(db,
                                    "INSERT INTO closed_task_runs (kvsim_version, model, task, task_sha256, "
                                    "prompt_tokens, policy, params, budget_tokens, status, error, n_items, n_correct, "
                                    "accuracy, acc_lo, acc_hi, full_correct, full_accuracy, full_lo, full_hi, diff, "
                                    "diff_lo, diff_hi, level, reps, seed, wall_seconds, codec) VALUES (?,?,?,?,?,?,?,?,"
                                    "?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                                    &ins, "insert task run"));
    int i = 1;
    bind_text(ins, i++, run->kvsim_version);
    bind_text(ins, i++, run->model);
    bind_text(ins, i++, run->task);
    bind_text(ins, i++, run->task_sha256);
    sqlite3_bind_int64(ins, i++, run->prompt_tokens);
    bind_text(ins, i++, run->policy);
    bind_text(ins, i++, run->params);
    sqlite3_bind_int64(ins, i++, run->budget_tokens);
    bind_text(ins, i++, run->status);
    bind_text(ins, i++, run->error);
    sqlite3_bind_int64(ins, i++, run->n_items);
    if (complete) {
        int64_t n_pol = 0, n_full = 0;
        for (int64_t k = 0; k < run->n_items; k++) {
            n_pol += run->items[k].policy_correct != 0;
            n_full += run->items[k].full_correct != 0;
        }
        char seed[17];
        snprintf(seed, sizeof seed, "%016llx", (unsigned long long)run->seed);
        sqlite3_bind_int64(ins, i++, n_pol);
        bind_real(ins, i++, run->accuracy.mean);
        bind_real(ins, i++, run->accuracy.lo);
        bind_real(ins, i++, run->accuracy.hi);
        sqlite3_bind_int64(ins, i++, n_full);
        bind_real(ins, i++, run->full_accuracy.mean);
        bind_real(ins, i++, run->full_accuracy.lo);
        bind_real(ins, i++, run->full_accuracy.hi);
        bind_real(ins, i++, run->diff.mean);
        bind_real(ins, i++, run->diff.lo);
        bind_real(ins, i++, run->diff.hi);
        bind_real(ins, i++, run->accuracy.level);
        sqlite3_bind_int64(ins, i++, run->accuracy.reps);
        bind_text(ins, i++, seed);
    } else {
        for (int k = 0; k < 14; k++) sqlite3_bind_null(ins, i++);
    }
    bind_real(ins, i++, run->wall_seconds);
    bind_text(ins, i++, codec_or_null(run->codec));
    KVS_TRY(s = kvs_results_step_done(db, ins, "insert task run"));
    int64_t id = sqlite3_last_insert_rowid(kvs_results_sqlite(db));
    KVS_TRY(s = kvs_results_prepare(db,
                                    "INSERT INTO closed_task_items (task_run_id, item, line, run_id, answer, expected, "
                                    "n_context, full_text, policy_text, full_correct, policy_correct) VALUES "
                                    "(?,?,?,?,?,?,?,?,?,?,?)",
                                    &item, "insert task items"));
    for (int64_t k = 0; k < run->n_items; k++) {
        const kvs_results_closed_task_item *it = &run->items[k];
        int64_t run_id = 0;
        KVS_TRY(s = write_run(db, it->run, &run_id));
        int scored = !strcmp(it->run->status, "complete");
        sqlite3_bind_int64(item, 1, id);
        sqlite3_bind_int64(item, 2, k);
        sqlite3_bind_int64(item, 3, it->line);
        sqlite3_bind_int64(item, 4, run_id);
        bind_text(item, 5, it->answer);
        bind_text(item, 6, it->expected);
        sqlite3_bind_int64(item, 7, it->n_context);
        bind_text(item, 8, it->full_text);
        bind_text(item, 9, it->policy_text);
        if (scored) {
            sqlite3_bind_int(item, 10, it->full_correct != 0);
            sqlite3_bind_int(item, 11, it->policy_correct != 0);
        } else {
            sqlite3_bind_null(item, 10);
            sqlite3_bind_null(item, 11);
        }
        KVS_TRY(s = kvs_results_step_done(db, item, "insert task items"));
    }
    sqlite3_finalize(ins);
    sqlite3_finalize(item);
    ins = item = NULL;
    KVS_TRY(s = kvs_results_txn_commit(db, "task run"));
    if (task_id) *task_id = id;
    return KVS_OK;
cleanup:
    sqlite3_finalize(ins);
    sqlite3_finalize(item);
    kvs_results_txn_rollback(db);
    return s;
}

void kvs_results_closed_task_rows_free(kvs_results_closed_task_row *rows, int64_t n) {
    if (!rows) return;
    for (int64_t i = 0; i < n; i++) {
        kvs_results_closed_task_row *r = &rows[i];
        free(r->model);
        free(r->task);
        free(r->task_sha256);
        free(r->policy);
        free(r->params);
        free(r->codec);
        for (int64_t k = 0; r->items && k < r->n_items; k++) {
            free(r->items[k].answer);
            free(r->items[k].expected);
            free(r->items[k].full_text);
            free(r->items[k].policy_text);
        }
        free(r->items);
    }
    free(rows);
}

/* The items of task run r->id into r->items (r->n_items of them, ascending item). */
static kvs_status read_task_items(kvs_results_db *db, sqlite3_stmt *st, kvs_results_closed_task_row *r) {
    if (r->n_items < 0) return kvs_fail(KVS_ERR_FORMAT, "%s: task run %lld: %lld items", kvs_results_path(db),
                                        (long long)r->id, (long long)r->n_items);
    r->items = calloc((size_t)(r->n_items > 0 ? r->n_items : 1), sizeof *r->items);
    if (!r->items) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, r->id);
    int64_t got = 0;
    int rc, oom = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (got == r->n_items) break;
        kvs_results_closed_task_item_row *it = &r->items[got++];
        it->item = sqlite3_column_int64(st, 0);
        it->line = sqlite3_column_int64(st, 1);
        it->run_id = sqlite3_column_int64(st, 2);
        it->n_context = sqlite3_column_int64(st, 3);
        it->answer = kvs_results_col_dup(st, 4, &oom);
        it->expected = kvs_results_col_dup(st, 5, &oom);
        it->full_text = kvs_results_col_dup(st, 6, &oom);
        it->policy_text = kvs_results_col_dup(st, 7, &oom);
        it->full_correct = sqlite3_column_int(st, 8);
        it->policy_correct = sqlite3_column_int(st, 9);
        if (oom) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return kvs_results_db_error(db, "read task items");
    /* a complete run holds every item it counts: fewer rows is a damaged database, not a smaller task */
    if (got != r->n_items || rc == SQLITE_ROW)
        return kvs_fail(KVS_ERR_FORMAT, "%s: task run %lld counts %lld items but holds %s%lld", kvs_results_path(db),
                        (long long)r->id, (long long)r->n_items, rc == SQLITE_ROW ? "more than " : "",
                        (long long)got);
    return KVS_OK;
}

kvs_status kvs_results_closed_task_query(kvs_results_db *db, kvs_results_closed_task_row **rows, int64_t *n) {
    *rows = NULL;
    *n = 0;
    int ex = kvs_results_table_exists(db, "closed_task_runs"), ex_items = kvs_results_table_exists(db,
                                                                                                   "closed_task_items");
    if (ex < 0 || ex_items < 0) return KVS_ERR_DB;
    if (ex == 0 || ex_items == 0)
        return kvs_fail(KVS_ERR_STATE, "no task results in %s (run kvsim generate --task first)", kvs_results_path(db));
    int has_codec = kvs_results_has_column(db, "closed_task_runs", "codec", "read task runs");
    if (has_codec < 0) return KVS_ERR_DB;
    sqlite3_stmt *st = NULL, *items = NULL;
    kvs_status s = kvs_results_prepare(db,
                                       has_codec ? "SELECT id, model, task, task_sha256, policy, params, prompt_tokens, "
                                                   "budget_tokens, n_items, n_correct, full_correct, accuracy, acc_lo, "
                                                   "acc_hi, full_accuracy, full_lo, full_hi, diff, diff_lo, diff_hi, "
                                                   "level, reps, seed, codec FROM closed_task_runs WHERE status = "
                                                   "'complete' ORDER BY id"
                                                 : "SELECT id, model, task, task_sha256, policy, params, prompt_tokens, "
                                                   "budget_tokens, n_items, n_correct, full_correct, accuracy, acc_lo, "
                                                   "acc_hi, full_accuracy, full_lo, full_hi, diff, diff_lo, diff_hi, "
                                                   "level, reps, seed, NULL FROM closed_task_runs WHERE status = "
                                                   "'complete' ORDER BY id",
                                       &st, "read task runs");
    if (s != KVS_OK) return s;
    kvs_results_closed_task_row *out = NULL;
    int64_t cnt = 0, cap = 0;
    int rc;
    KVS_TRY(s = kvs_results_prepare(db,
                                    "SELECT item, line, run_id, n_context, answer, expected, full_text, policy_text, "
                                    "full_correct, policy_correct FROM closed_task_items WHERE task_run_id = ? "
                                    "ORDER BY item",
                                    &items, "read task items"));
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (cnt == cap) {
            cap = cap ? 2 * cap : 16;
            kvs_results_closed_task_row *g = realloc(out, (size_t)cap * sizeof *g);
            if (!g) {
                s = kvs_fail(KVS_ERR_NOMEM, "out of memory");
                goto cleanup;
            }
            out = g;
        }
        kvs_results_closed_task_row *r = &out[cnt++];
        memset(r, 0, sizeof *r);
        int oom = 0;
        r->id = sqlite3_column_int64(st, 0);
        r->model = kvs_results_col_dup(st, 1, &oom);
        r->task = kvs_results_col_dup(st, 2, &oom);
        r->task_sha256 = kvs_results_col_dup(st, 3, &oom);
        r->policy = kvs_results_col_dup(st, 4, &oom);
        r->params = kvs_results_col_dup(st, 5, &oom);
        r->prompt_tokens = sqlite3_column_int64(st, 6);
        r->budget_tokens = sqlite3_column_int64(st, 7);
        r->n_items = sqlite3_column_int64(st, 8);
        r->n_correct = sqlite3_column_int64(st, 9);
        r->full_correct = sqlite3_column_int64(st, 10);
        double *dst[] = {&r->accuracy, &r->acc_lo, &r->acc_hi, &r->full_accuracy, &r->full_lo, &r->full_hi,
                         &r->diff, &r->diff_lo, &r->diff_hi, &r->level};
        for (int k = 0; k < 10; k++) *dst[k] = col_real(st, 11 + k);
        r->reps = sqlite3_column_int64(st, 21);
        const unsigned char *seed = sqlite3_column_text(st, 22);
        snprintf(r->seed, sizeof r->seed, "%s", seed ? (const char *)seed : "");
        r->codec = kvs_results_col_dup(st, 23, &oom);
        if (oom) {
            s = kvs_fail(KVS_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        KVS_TRY(s = read_task_items(db, items, r));
    }
    if (rc != SQLITE_DONE) {
        s = kvs_results_db_error(db, "read task runs");
        goto cleanup;
    }
    sqlite3_finalize(st);
    sqlite3_finalize(items);
    *rows = out;
    *n = cnt;
    return KVS_OK;
cleanup:
    sqlite3_finalize(st);
    sqlite3_finalize(items);
    kvs_results_closed_task_rows_free(out, cnt);
    return s;
}
