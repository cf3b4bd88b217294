/* results_heads.c — the "heads" table family (results/SCHEMA.md "Table family heads"): the tables of `kvsim heads`
 * (SyncKV Eq. 2 similarity, Fig. 2c layer-to-layer similarity, App. B.1 clustering and its stability, POLICY_SPEC
 * §2.4, §5.4 S4/S12), written in one transaction through results/results_internal.h, and their readers.
 * Implements results/results_heads.h.
 *
 * The old form: tables written before the split by KV head lack heads_similarity.same_kv and
 * heads_layer_similarity.sim_other_kv / sim_same_kv. The writer adds the columns (ALTER TABLE in its transaction;
 * earlier runs' rows hold NULL there) and the reader gives such a run the split computed from its stored pair
 * matrix by analysis/heads.h (kvs_analysis_heads_layer_sim_kv), the function the writer stores.
 */
#include "results_heads.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../analysis/heads.h"
#include "results_internal.h"

/* The shared column helpers of results/results_internal.h under their short names. */
#define col_dup kvs_results_col_dup

static const char heads_ddl[] =
    "CREATE TABLE IF NOT EXISTS heads_runs (\n"
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,\n"
    "  trace_id INTEGER NOT NULL REFERENCES traces(id),\n"
    "  k INTEGER NOT NULL CHECK (k >= 1),\n"
    "  k_requested INTEGER,\n"
    "  n_steps INTEGER NOT NULL CHECK (n_steps >= 1),\n"
    "  n_layers INTEGER NOT NULL,\n"
    "  n_heads INTEGER NOT NULL,\n"
    "  n_kv_heads INTEGER NOT NULL,\n"
    "  n_clusters_requested INTEGER,\n"
    "  seed INTEGER NOT NULL,\n"
    "  stability TEXT CHECK (stability IN ('halves', 'trace')),\n"
    "  stability_trace_id INTEGER REFERENCES traces(id),\n"
    "  clusters_sha256 TEXT NOT NULL,\n"
    "  notes TEXT,\n"
    "  wall_seconds REAL,\n"
    "  kvsim_version TEXT NOT NULL,\n"
    "  created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))\n"
    ");\n"
    "CREATE TABLE IF NOT EXISTS heads_similarity (\n"
    "  run_id INTEGER NOT NULL REFERENCES heads_runs(id) ON DELETE CASCADE,\n"
    "  kind TEXT NOT NULL CHECK (kind IN ('query', 'unit')),\n"
    "  layer_a INTEGER NOT NULL,\n"
    "  head_a INTEGER NOT NULL,\n"
    "  layer_b INTEGER NOT NULL,\n"
    "  head_b INTEGER NOT NULL,\n"
    "  sim REAL NOT NULL,\n"
    "  same_kv INTEGER,\n"
    "  PRIMARY KEY (run_id, kind, layer_a, head_a, layer_b, head_b)\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE IF NOT EXISTS heads_layer_similarity (\n"
    "  run_id INTEGER NOT NULL REFERENCES heads_runs(id) ON DELETE CASCADE,\n"
    "  kind TEXT NOT NULL CHECK (kind IN ('query', 'unit')),\n"
    "  layer_a INTEGER NOT NULL,\n"
    "  layer_b INTEGER NOT NULL,\n"
    "  sim REAL,\n"
    "  sim_other_kv REAL,\n"
    "  sim_same_kv REAL,\n"
    "  PRIMARY KEY (run_id, kind, layer_a, layer_b)\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE IF NOT EXISTS heads_layers (\n"
    "  run_id INTEGER NOT NULL REFERENCES heads_runs(id) ON DELETE CASCADE,\n"
    "  layer INTEGER NOT NULL,\n"
    "  n_clusters INTEGER NOT NULL CHECK (n_clusters >= 1),\n"
    "  silhouette REAL,\n"
    "  ari REAL,\n"
    "  PRIMARY KEY (run_id, layer)\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE IF NOT EXISTS heads_clusters (\n"
    "  run_id INTEGER NOT NULL REFERENCES heads_runs(id) ON DELETE CASCADE,\n"
    "  part TEXT NOT NULL CHECK (part IN ('all', 'a', 'b')),\n"
    "  layer INTEGER NOT NULL,\n"
    "  unit INTEGER NOT NULL,\n"
    "  cluster INTEGER NOT NULL CHECK (cluster >= 0),\n"
    "  is_rep INTEGER NOT NULL CHECK (is_rep IN (0, 1)),\n"
    "  PRIMARY KEY (run_id, part, layer, unit)\n"
    ") WITHOUT ROWID;\n";

/* NaN is stored as NULL (SQLite has no NaN); read back as NaN. */
static void bind_real_or_null(sqlite3_stmt *st, int i, double v) {
    if (isnan(v)) sqlite3_bind_null(st, i);
    else sqlite3_bind_double(st, i, v);
}

static double column_real_or_nan(sqlite3_stmt *st, int i) {
    return sqlite3_column_type(st, i) == SQLITE_NULL ? NAN : sqlite3_column_double(st, i);
}

/* 1 when `table` has column `col`, 0 when not, -1 (with kvs_fail) on a database error. */
static int has_column(kvs_results_db *db, const char *table, const char *col) {
    return kvs_results_has_column(db, table, col, "cannot read the heads columns");
}

/* The columns of the split by KV head, added to tables of the old form (inside the writer's transaction). */
static kvs_status add_kv_columns(kvs_results_db *db) {
    static const char *const add[][3] = {{"heads_similarity", "same_kv", "INTEGER"},
                                         {"heads_layer_similarity", "sim_other_kv", "REAL"},
                                         {"heads_layer_similarity", "sim_same_kv", "REAL"}};
    for (size_t i = 0; i < sizeof add / sizeof add[0]; i++) {
        int has = has_column(db, add[i][0], add[i][1]);
        if (has < 0) return KVS_ERR_DB;
        if (has) continue;
        char sql[160];
        snprintf(sql, sizeof sql, "ALTER TABLE %s ADD COLUMN %s %s", add[i][0], add[i][1], add[i][2]);
        kvs_status st = kvs_results_exec(db, sql, "cannot add the heads KV-head columns");
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

static kvs_status check_clusters(const kvs_results_db *db, const kvs_head_clusters *c, const kvs_results_heads_data *d,
                                 const char *which) {
    if (!c) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: heads: the %s clustering is missing", kvs_results_path(db), which);
    if (c->n_layers != d->n_layers || c->n_units != d->n_kv_heads)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: heads: the %s clustering is %d x %d, the run %d layers x %d units",
                        kvs_results_path(db), which, c->n_layers, c->n_units, d->n_layers, d->n_kv_heads);
    if (kvs_head_clusters_check(c) != KVS_OK)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: heads: the %s clustering: %s", kvs_results_path(db), which,
                        kvs_last_error());
    return KVS_OK;
}

static kvs_status put_clusters(kvs_results_db *db, sqlite3_stmt *ins, int64_t run_id, const char *part,
                               const kvs_head_clusters *c) {
    kvs_status st = KVS_OK;
    for (int32_t l = 0; l < c->n_layers && st == KVS_OK; l++)
        for (int32_t u = 0; u < c->n_units && st == KVS_OK; u++) {
            size_t i = (size_t)l * (size_t)c->n_units + (size_t)u;
            sqlite3_bind_int64(ins, 1, run_id);
            sqlite3_bind_text(ins, 2, part, -1, SQLITE_STATIC);
            sqlite3_bind_int(ins, 3, l);
            sqlite3_bind_int(ins, 4, u);
            sqlite3_bind_int(ins, 5, c->cluster[i]);
            sqlite3_bind_int(ins, 6, c->is_rep[i] ? 1 : 0);
            st = kvs_results_step_done(db, ins, "cannot insert heads_clusters");
        }
    return st;
}

/* The pair matrix of `kind`, n heads per layer, `group` of them per KV head (same_kv: same layer, same KV head). */
static kvs_status put_matrix(kvs_results_db *db, sqlite3_stmt *ins, int64_t run_id, const char *kind, int32_t L,
                             int32_t n, int32_t group, const double *m) {
    const size_t w = (size_t)L * (size_t)n;
    kvs_status st = KVS_OK;
    for (size_t i = 0; i < w && st == KVS_OK; i++)
        for (size_t j = 0; j < w && st == KVS_OK; j++) {
            sqlite3_bind_int64(ins, 1, run_id);
            sqlite3_bind_text(ins, 2, kind, -1, SQLITE_STATIC);
            sqlite3_bind_int(ins, 3, (int)(i / (size_t)n));
            sqlite3_bind_int(ins, 4, (int)(i % (size_t)n));
            sqlite3_bind_int(ins, 5, (int)(j / (size_t)n));
            sqlite3_bind_int(ins, 6, (int)(j % (size_t)n));
            sqlite3_bind_double(ins, 7, m[i * w + j]);
            sqlite3_bind_int(ins, 8, i / (size_t)n == j / (size_t)n && (i % (size_t)n) / (size_t)group == (j % (size_t)n) / (size_t)group);
            st = kvs_results_step_done(db, ins, "cannot insert heads_similarity");
        }
    return st;
}

/* The layer matrix m of `kind` with its split by KV head (other, same). */
static kvs_status put_layer_matrix(kvs_results_db *db, sqlite3_stmt *ins, int64_t run_id, const char *kind, int32_t L,
                                   const double *m, const double *other, const double *same) {
    kvs_status st = KVS_OK;
    for (int32_t a = 0; a < L && st == KVS_OK; a++)
        for (int32_t b = 0; b < L && st == KVS_OK; b++) {
            sqlite3_bind_int64(ins, 1, run_id);
            sqlite3_bind_text(ins, 2, kind, -1, SQLITE_STATIC);
            sqlite3_bind_int(ins, 3, a);
            sqlite3_bind_int(ins, 4, b);
            bind_real_or_null(ins, 5, m[(size_t)a * (size_t)L + (size_t)b]);
            bind_real_or_null(ins, 6, other[(size_t)a * (size_t)L + (size_t)b]);
            bind_real_or_null(ins, 7, same[(size_t)a * (size_t)L + (size_t)b]);
            st = kvs_results_step_done(db, ins, "cannot insert heads_layer_similarity");
        }
    return st;
}

kvs_status kvs_results_heads_write(kvs_results_db *db, const kvs_results_trace *trace, const kvs_results_heads_run *run,
                                   const kvs_results_heads_data *d, int64_t *run_id) {
    if (!db || !trace || !run || !d || !run->kvsim_version)
        return kvs_fail(KVS_ERR_INVALID_ARG, "heads: write: NULL argument");
    const char *path = kvs_results_path(db);
    const int32_t L = d->n_layers, H = d->n_heads, U = d->n_kv_heads;
    if (L != trace->n_layers || H != trace->n_heads || U != trace->n_kv_heads || L < 1 || U < 1 || H < U || H % U)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: heads: %d layers x %d heads / %d KV heads do not match the trace "
                                             "(%d x %d / %d)",
                        path, L, H, U, trace->n_layers, trace->n_heads, trace->n_kv_heads);
    if (!d->qhead_sim || !d->unit_sim || !d->layer_sim_q || !d->layer_sim_u || !d->silhouette || run->k < 1 ||
        run->n_steps < 1)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: heads: a similarity table is missing or k / steps < 1", path);
    int stab = run->stability != NULL;
    if (stab && strcmp(run->stability, "halves") && strcmp(run->stability, "trace"))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: heads: stability '%s' is not halves or trace", path, run->stability);
    if (stab && (!d->stab_a || !d->stab_b || !d->ari || (!strcmp(run->stability, "trace") && !run->stability_trace)))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: heads: stability without its two clusterings, ARI or trace", path);
    kvs_status st = check_clusters(db, d->clusters, d, "run's");
    if (st == KVS_OK && stab) st = check_clusters(db, d->stab_a, d, "first stability");
    if (st == KVS_OK && stab) st = check_clusters(db, d->stab_b, d, "second stability");
    if (st != KVS_OK) return st;
    char sha[65];
    if ((st = kvs_head_clusters_sha256(d->clusters, sha)) != KVS_OK) return st;

    /* The split by KV head of both layer matrices: [4][L][L] query other, query same, unit other, unit same. */
    const size_t LL = (size_t)L * (size_t)L;
    double *split = malloc(4 * LL * sizeof *split);
    if (!split) return kvs_fail(KVS_ERR_NOMEM, "heads: out of memory");
    kvs_analysis_heads_layer_sim_kv(d->qhead_sim, L, H, H / U, split, split + LL);
    kvs_analysis_heads_layer_sim_kv(d->unit_sim, L, U, 1, split + 2 * LL, split + 3 * LL);

    sqlite3_stmt *ins_run = NULL, *ins_sim = NULL, *ins_lsim = NULL, *ins_layer = NULL, *ins_cl = NULL;
    if ((st = kvs_results_txn_begin(db, "cannot begin the heads transaction")) != KVS_OK) {
        free(split);
        return st;
    }
    int64_t trace_id = 0, trace2_id = 0, id = 0;
    KVS_TRY(st = kvs_results_exec(db, heads_ddl, "cannot create the heads tables"));
    KVS_TRY(st = add_kv_columns(db));
    KVS_TRY(st = kvs_results_trace_id(db, trace, &trace_id));
    if (stab && !strcmp(run->stability, "trace")) KVS_TRY(st = kvs_results_trace_id(db, run->stability_trace, &trace2_id));
    KVS_TRY(st = kvs_results_prepare(db,
                                     "INSERT INTO heads_runs (trace_id, k, k_requested, n_steps, n_layers, n_heads, "
                                     "n_kv_heads, n_clusters_requested, seed, stability, stability_trace_id, "
                                     "clusters_sha256, notes, wall_seconds, kvsim_version) "
                                     "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
                                     &ins_run, "cannot prepare the heads_runs insert"));
    sqlite3_bind_int64(ins_run, 1, trace_id);
    sqlite3_bind_int64(ins_run, 2, run->k);
    if (run->k_requested > 0) sqlite3_bind_int64(ins_run, 3, run->k_requested);
    sqlite3_bind_int64(ins_run, 4, run->n_steps);
    sqlite3_bind_int(ins_run, 5, L);
    sqlite3_bind_int(ins_run, 6, H);
    sqlite3_bind_int(ins_run, 7, U);
    if (run->n_clusters_requested > 0) sqlite3_bind_int(ins_run, 8, run->n_clusters_requested);
    sqlite3_bind_int64(ins_run, 9, (int64_t)run->seed); /* two's complement for seeds >= 2^63; read back alike */
    if (stab) sqlite3_bind_text(ins_run, 10, run->stability, -1, SQLITE_STATIC);
    if (trace2_id) sqlite3_bind_int64(ins_run, 11, trace2_id);
    sqlite3_bind_text(ins_run, 12, sha, -1, SQLITE_STATIC);
    if (run->notes) sqlite3_bind_text(ins_run, 13, run->notes, -1, SQLITE_STATIC);
    bind_real_or_null(ins_run, 14, run->wall_seconds);
    sqlite3_bind_text(ins_run, 15, run->kvsim_version, -1, SQLITE_STATIC);
    KVS_TRY(st = kvs_results_step_done(db, ins_run, "cannot insert heads_runs"));
    id = sqlite3_last_insert_rowid(kvs_results_sqlite(db));

    KVS_TRY(st = kvs_results_prepare(db,
                                     "INSERT INTO heads_similarity (run_id, kind, layer_a, head_a, layer_b, head_b, sim, "
                                     "same_kv) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                                     &ins_sim, "cannot prepare the heads_similarity insert"));
    KVS_TRY(st = put_matrix(db, ins_sim, id, "query", L, H, H / U, d->qhead_sim));
    KVS_TRY(st = put_matrix(db, ins_sim, id, "unit", L, U, 1, d->unit_sim));
    KVS_TRY(st = kvs_results_prepare(db,
                                     "INSERT INTO heads_layer_similarity (run_id, kind, layer_a, layer_b, sim, "
                                     "sim_other_kv, sim_same_kv) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                                     &ins_lsim, "cannot prepare the heads_layer_similarity insert"));
    KVS_TRY(st = put_layer_matrix(db, ins_lsim, id, "query", L, d->layer_sim_q, split, split + LL));
    KVS_TRY(st = put_layer_matrix(db, ins_lsim, id, "unit", L, d->layer_sim_u, split + 2 * LL, split + 3 * LL));
    KVS_TRY(st = kvs_results_prepare(db,
                                     "INSERT INTO heads_layers (run_id, layer, n_clusters, silhouette, ari) "
                                     "VALUES (?1, ?2, ?3, ?4, ?5)",
                                     &ins_layer, "cannot prepare the heads_layers insert"));
    for (int32_t l = 0; l < L; l++) {
        sqlite3_bind_int64(ins_layer, 1, id);
        sqlite3_bind_int(ins_layer, 2, l);
        sqlite3_bind_int(ins_layer, 3, d->clusters->n_clusters[l]);
        bind_real_or_null(ins_layer, 4, d->silhouette[l]);
        bind_real_or_null(ins_layer, 5, stab ? d->ari[l] : NAN);
        KVS_TRY(st = kvs_results_step_done(db, ins_layer, "cannot insert heads_layers"));
    }
    KVS_TRY(st = kvs_results_prepare(db,
                                     "INSERT INTO heads_clusters (run_id, part, layer, unit, cluster, is_rep) "
                                     "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                                     &ins_cl, "cannot prepare the heads_clusters insert"));
    KVS_TRY(st = put_clusters(db, ins_cl, id, "all", d->clusters));
    if (stab) {
        KVS_TRY(st = put_clusters(db, ins_cl, id, "a", d->stab_a));
        KVS_TRY(st = put_clusters(db, ins_cl, id, "b", d->stab_b));
    }
    KVS_TRY(st = kvs_results_txn_commit(db, "cannot commit the heads run"));
    if (run_id) *run_id = id;
cleanup:
    sqlite3_finalize(ins_run);
    sqlite3_finalize(ins_sim);
    sqlite3_finalize(ins_lsim);
    sqlite3_finalize(ins_layer);
    sqlite3_finalize(ins_cl);
    free(split);
    if (st != KVS_OK) kvs_results_txn_rollback(db);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Reading
 * ---------------------------------------------------------------------------------------------- */

static kvs_status require_family(kvs_results_db *db) {
    int e = kvs_results_table_exists(db, "heads_runs");
    if (e < 0) return KVS_ERR_DB;
    if (!e) return kvs_fail(KVS_ERR_DB, "no heads results in %s (run `kvsim heads TRACE --db DB` first)",
                            kvs_results_path(db));
    return KVS_OK;
}


/* The clustering of part `part` of run `id` (L x U), checked. */
static kvs_status read_clusters_part(kvs_results_db *db, int64_t id, const char *part, int32_t L, int32_t U,
                                     kvs_head_clusters **out) {
    *out = NULL;
    kvs_head_clusters *c = NULL;
    sqlite3_stmt *q = NULL;
    kvs_status st = kvs_head_clusters_create(L, U, &c);
    if (st != KVS_OK) return kvs_fail(KVS_ERR_DB, "%s: heads run %lld: %s", kvs_results_path(db), (long long)id,
                                      kvs_last_error());
    for (int32_t l = 0; l < L; l++) c->n_clusters[l] = 0;
    KVS_TRY(st = kvs_results_prepare(db, "SELECT layer, unit, cluster, is_rep FROM heads_clusters "
                                         "WHERE run_id = ?1 AND part = ?2 ORDER BY layer, unit",
                                     &q, "cannot read heads_clusters"));
    sqlite3_bind_int64(q, 1, id);
    sqlite3_bind_text(q, 2, part, -1, SQLITE_STATIC);
    int64_t rows = 0;
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        int l = sqlite3_column_int(q, 0), u = sqlite3_column_int(q, 1), g = sqlite3_column_int(q, 2);
        if (l < 0 || l >= L || u < 0 || u >= U || g < 0 || g >= U) {
            st = kvs_fail(KVS_ERR_DB, "%s: heads run %lld: cluster row (layer %d, unit %d, cluster %d) outside %d x %d",
                          kvs_results_path(db), (long long)id, l, u, g, L, U);
            goto cleanup;
        }
        size_t i = (size_t)l * (size_t)U + (size_t)u;
        c->cluster[i] = g;
        c->is_rep[i] = sqlite3_column_int(q, 3) != 0;
        if (g + 1 > c->n_clusters[l]) c->n_clusters[l] = g + 1;
        rows++;
    }
    if (rc != SQLITE_DONE) {
        st = kvs_results_db_error(db, "cannot read heads_clusters");
        goto cleanup;
    }
    if (rows != (int64_t)L * U) {
        st = kvs_fail(KVS_ERR_DB, "%s: heads run %lld: %lld cluster rows for %d layers x %d units",
                      kvs_results_path(db), (long long)id, (long long)rows, L, U);
        goto cleanup;
    }
    if (kvs_head_clusters_check(c) != KVS_OK) {
        st = kvs_fail(KVS_ERR_DB, "%s: heads run %lld: %s", kvs_results_path(db), (long long)id, kvs_last_error());
        goto cleanup;
    }
    *out = c;
    c = NULL;
cleanup:
    sqlite3_finalize(q);
    kvs_head_clusters_free(c);
    return st;
}

/* A full square matrix of `kind` from heads_similarity or column `col` of heads_layer_similarity (`layer_level`). */
static kvs_status read_matrix(kvs_results_db *db, int64_t id, const char *kind, int layer_level, const char *col,
                              int32_t L, int32_t n, double **out) {
    const size_t w = layer_level ? (size_t)L : (size_t)L * (size_t)n;
    sqlite3_stmt *q = NULL;
    double *m = malloc(w * w * sizeof *m);
    uint8_t *seen = calloc(w * w, 1);
    kvs_status st = KVS_OK;
    if (!m || !seen) {
        st = kvs_fail(KVS_ERR_NOMEM, "heads: out of memory");
        goto cleanup;
    }
    char sql[192];
    if (layer_level)
        snprintf(sql, sizeof sql, "SELECT layer_a, 0, layer_b, 0, %s FROM heads_layer_similarity WHERE run_id = ?1 AND "
                                  "kind = ?2", col);
    else
        snprintf(sql, sizeof sql, "SELECT layer_a, head_a, layer_b, head_b, sim FROM heads_similarity WHERE run_id = ?1 "
                                  "AND kind = ?2");
    KVS_TRY(st = kvs_results_prepare(db, sql, &q, "cannot read the heads similarity"));
    sqlite3_bind_int64(q, 1, id);
    sqlite3_bind_text(q, 2, kind, -1, SQLITE_STATIC);
    size_t rows = 0;
    int rc;
    const int32_t per = layer_level ? 1 : n;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        int la = sqlite3_column_int(q, 0), ha = sqlite3_column_int(q, 1), lb = sqlite3_column_int(q, 2),
            hb = sqlite3_column_int(q, 3);
        if (la < 0 || la >= L || lb < 0 || lb >= L || ha < 0 || ha >= per || hb < 0 || hb >= per) {
            st = kvs_fail(KVS_ERR_DB, "%s: heads run %lld: a %s similarity row is outside %d layers x %d",
                          kvs_results_path(db), (long long)id, kind, L, per);
            goto cleanup;
        }
        size_t i = (size_t)la * (size_t)per + (size_t)ha, j = (size_t)lb * (size_t)per + (size_t)hb;
        rows += !seen[i * w + j];
        seen[i * w + j] = 1;
        m[i * w + j] = column_real_or_nan(q, 4);
    }
    if (rc != SQLITE_DONE) {
        st = kvs_results_db_error(db, "cannot read the heads similarity");
        goto cleanup;
    }
    if (rows != w * w) {
        st = kvs_fail(KVS_ERR_DB, "%s: heads run %lld: %zu of the %zu %s similarity cells are stored",
                      kvs_results_path(db), (long long)id, rows, w * w, kind);
        goto cleanup;
    }
    *out = m;
    m = NULL;
cleanup:
    sqlite3_finalize(q);
    free(m);
    free(seen);
    return st;
}

/* The id and shape of the selected run. */
static kvs_status find_run(kvs_results_db *db, int64_t want, const char *trace_path, const char *model,
                           kvs_results_heads_row *r) {
    sqlite3_stmt *q = NULL;
    kvs_status st = kvs_results_prepare(
        db,
        "SELECT h.id, h.trace_id, t.path, t.model, h.n_layers, h.n_heads, h.n_kv_heads, h.k, h.n_steps, "
        "h.n_clusters_requested, h.seed, h.stability, h.notes, h.created_at, h.clusters_sha256 "
        "FROM heads_runs h JOIN traces t ON t.id = h.trace_id "
        "WHERE (?1 <= 0 OR h.id = ?1) "
        "AND (?2 IS NULL OR t.path = ?2 OR substr(t.path, -length(?2) - 1) = '/' || ?2) "
        "AND (?3 IS NULL OR t.model = ?3) ORDER BY h.id DESC LIMIT 1",
        &q, "cannot read heads_runs");
    if (st != KVS_OK) return st;
    sqlite3_bind_int64(q, 1, want);
    if (trace_path) sqlite3_bind_text(q, 2, trace_path, -1, SQLITE_STATIC);
    if (model) sqlite3_bind_text(q, 3, model, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q), oom = 0;
    if (rc == SQLITE_ROW) {
        r->id = sqlite3_column_int64(q, 0);
        r->trace_id = sqlite3_column_int64(q, 1);
        r->trace_path = col_dup(q, 2, &oom);
        r->model = col_dup(q, 3, &oom);
        r->n_layers = sqlite3_column_int(q, 4);
        r->n_heads = sqlite3_column_int(q, 5);
        r->n_kv_heads = sqlite3_column_int(q, 6);
        r->k = sqlite3_column_int64(q, 7);
        r->n_steps = sqlite3_column_int64(q, 8);
        r->n_clusters_requested = sqlite3_column_int(q, 9);
        r->seed = (uint64_t)sqlite3_column_int64(q, 10);
        r->stability = col_dup(q, 11, &oom);
        r->notes = col_dup(q, 12, &oom);
        r->created_at = col_dup(q, 13, &oom);
        r->clusters_sha256 = col_dup(q, 14, &oom);
        if (oom) st = kvs_fail(KVS_ERR_NOMEM, "heads: out of memory");
        else if (r->n_layers < 1 || r->n_layers > KVS_HEAD_CLUSTERS_MAX_LAYERS || r->n_kv_heads < 1 ||
                 r->n_kv_heads > KVS_HEAD_CLUSTERS_MAX_UNITS || r->n_heads < r->n_kv_heads ||
                 r->n_heads % r->n_kv_heads)
            st = kvs_fail(KVS_ERR_DB, "%s: heads run %lld: bad shape %d layers x %d heads / %d KV heads",
                          kvs_results_path(db), (long long)r->id, r->n_layers, r->n_heads, r->n_kv_heads);
    } else if (rc == SQLITE_DONE) {
        if (want > 0) st = kvs_fail(KVS_ERR_DB, "no heads run %lld in %s", (long long)want, kvs_results_path(db));
        else st = kvs_fail(KVS_ERR_DB, "no heads run matching%s%s%s%s in %s", trace_path ? " trace " : "",
                           trace_path ? trace_path : "", model ? " model " : "", model ? model : "",
                           kvs_results_path(db));
    } else {
        st = kvs_results_db_error(db, "cannot read heads_runs");
    }
    sqlite3_finalize(q);
    return st;
}

/* The split by KV head of run r (its pair matrices already read): the stored cells, or for a run of the old form
 * (no column, or a run written before it was added: every cell NULL) the ones its pair matrices give. */
static kvs_status read_kv_split(kvs_results_db *db, kvs_results_heads_row *r) {
    const int32_t L = r->n_layers;
    int stored = has_column(db, "heads_layer_similarity", "sim_other_kv");
    if (stored < 0) return KVS_ERR_DB;
    if (stored) {
        sqlite3_stmt *q = NULL;
        kvs_status st = kvs_results_prepare(db, "SELECT count(sim_other_kv) FROM heads_layer_similarity WHERE run_id = ?1",
                                            &q, "cannot read the heads similarity");
        if (st != KVS_OK) return st;
        sqlite3_bind_int64(q, 1, r->id);
        int rc = sqlite3_step(q);
        stored = rc == SQLITE_ROW && sqlite3_column_int64(q, 0) > 0;
        sqlite3_finalize(q);
        if (rc != SQLITE_ROW) return kvs_results_db_error(db, "cannot read the heads similarity");
    }
    if (stored) {
        kvs_status st = read_matrix(db, r->id, "query", 1, "sim_other_kv", L, 1, &r->layer_sim_q_other_kv);
        if (st == KVS_OK) st = read_matrix(db, r->id, "query", 1, "sim_same_kv", L, 1, &r->layer_sim_q_same_kv);
        if (st == KVS_OK) st = read_matrix(db, r->id, "unit", 1, "sim_other_kv", L, 1, &r->layer_sim_u_other_kv);
        return st;
    }
    const size_t LL = (size_t)L * (size_t)L;
    r->layer_sim_q_other_kv = malloc(LL * sizeof(double));
    r->layer_sim_q_same_kv = malloc(LL * sizeof(double));
    r->layer_sim_u_other_kv = malloc(LL * sizeof(double));
    if (!r->layer_sim_q_other_kv || !r->layer_sim_q_same_kv || !r->layer_sim_u_other_kv)
        return kvs_fail(KVS_ERR_NOMEM, "heads: out of memory");
    kvs_analysis_heads_layer_sim_kv(r->qhead_sim, L, r->n_heads, r->n_heads / r->n_kv_heads, r->layer_sim_q_other_kv,
                                    r->layer_sim_q_same_kv);
    kvs_analysis_heads_layer_sim_kv(r->unit_sim, L, r->n_kv_heads, 1, r->layer_sim_u_other_kv, NULL);
    return KVS_OK;
}

void kvs_results_heads_row_free(kvs_results_heads_row *r) {
    if (!r) return;
    free(r->trace_path);
    free(r->model);
    free(r->stability);
    free(r->notes);
    free(r->created_at);
    free(r->clusters_sha256);
    free(r->qhead_sim);
    free(r->unit_sim);
    free(r->layer_sim_q);
    free(r->layer_sim_u);
    free(r->layer_sim_q_other_kv);
    free(r->layer_sim_q_same_kv);
    free(r->layer_sim_u_other_kv);
    kvs_head_clusters_free(r->clusters);
    free(r->silhouette);
    free(r->ari);
    free(r);
}

kvs_status kvs_results_heads_read(kvs_results_db *db, int64_t heads_run_id, const char *trace_path, const char *model,
                                  kvs_results_heads_row **out) {
    if (!db || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "heads: read: NULL argument");
    *out = NULL;
    kvs_status st = require_family(db);
    if (st != KVS_OK) return st;
    kvs_results_heads_row *r = calloc(1, sizeof *r);
    sqlite3_stmt *q = NULL;
    if (!r) return kvs_fail(KVS_ERR_NOMEM, "heads: out of memory");
    KVS_TRY(st = find_run(db, heads_run_id, trace_path, model, r));
    const int32_t L = r->n_layers;
    KVS_TRY(st = read_matrix(db, r->id, "query", 0, NULL, L, r->n_heads, &r->qhead_sim));
    KVS_TRY(st = read_matrix(db, r->id, "unit", 0, NULL, L, r->n_kv_heads, &r->unit_sim));
    KVS_TRY(st = read_matrix(db, r->id, "query", 1, "sim", L, 1, &r->layer_sim_q));
    KVS_TRY(st = read_matrix(db, r->id, "unit", 1, "sim", L, 1, &r->layer_sim_u));
    KVS_TRY(st = read_kv_split(db, r));
    KVS_TRY(st = read_clusters_part(db, r->id, "all", L, r->n_kv_heads, &r->clusters));
    r->silhouette = malloc((size_t)L * sizeof *r->silhouette);
    r->ari = malloc((size_t)L * sizeof *r->ari);
    if (!r->silhouette || !r->ari) {
        st = kvs_fail(KVS_ERR_NOMEM, "heads: out of memory");
        goto cleanup;
    }
    for (int32_t l = 0; l < L; l++) r->silhouette[l] = r->ari[l] = NAN;
    KVS_TRY(st = kvs_results_prepare(db, "SELECT layer, silhouette, ari FROM heads_layers WHERE run_id = ?1", &q,
                                     "cannot read heads_layers"));
    sqlite3_bind_int64(q, 1, r->id);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        int l = sqlite3_column_int(q, 0);
        if (l < 0 || l >= L) continue;
        r->silhouette[l] = column_real_or_nan(q, 1);
        r->ari[l] = column_real_or_nan(q, 2);
    }
    if (rc != SQLITE_DONE) {
        st = kvs_results_db_error(db, "cannot read heads_layers");
        goto cleanup;
    }
    *out = r;
    r = NULL;
cleanup:
    sqlite3_finalize(q);
    kvs_results_heads_row_free(r);
    return st;
}

kvs_status kvs_results_heads_read_clusters(kvs_results_db *db, int64_t heads_run_id, kvs_head_clusters **out,
                                           char sha256_hex[65]) {
    if (!db || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "heads: read_clusters: NULL argument");
    *out = NULL;
    kvs_status st = require_family(db);
    if (st != KVS_OK) return st;
    kvs_results_heads_row r = {0};
    kvs_head_clusters *c = NULL;
    KVS_TRY(st = find_run(db, heads_run_id, NULL, NULL, &r));
    KVS_TRY(st = read_clusters_part(db, r.id, "all", r.n_layers, r.n_kv_heads, &c));
    if (sha256_hex) KVS_TRY(st = kvs_head_clusters_sha256(c, sha256_hex));
    *out = c;
    c = NULL;
cleanup:
    free(r.trace_path);
    free(r.model);
    free(r.stability);
    free(r.notes);
    free(r.created_at);
    free(r.clusters_sha256);
    kvs_head_clusters_free(c);
    return st;
}

/* ---- policy inputs that live in a results database ---------------------------------------------------- */

/* What kvs_results_resolve_policy_inputs loaded: [n][KVS_POLICY_MAX_PARAMS] clusterings, NULL where none. */
typedef struct {
    int n;
    kvs_head_clusters *clusters[];
} policy_inputs;

void kvs_results_policy_inputs_free(void *owned) {
    policy_inputs *pi = owned;
    if (!pi) return;
    for (int i = 0; i < pi->n * KVS_POLICY_MAX_PARAMS; i++) kvs_head_clusters_free(pi->clusters[i]);
    free(pi);
}

/* Loads what parameter i of cfg stands for into *slot when it names a results database (nothing otherwise). */
static kvs_status resolve_param(kvs_policy_config *cfg, int i, kvs_head_clusters **slot) {
    const struct kvs_policy_ops *ops = cfg->ops;
    const kvs_policy_param *pp = &ops->params[i];
    if (pp->type != KVS_PARAM_FILE || !pp->resolves || !kvs_file_is_sqlite(cfg->str[i])) return KVS_OK;
    if (strcmp(pp->resolves, "head_clusters") != 0)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy %s: parameter %s: unknown database input '%s'", ops->name, pp->key,
                        pp->resolves);
    kvs_results_db *db = NULL;
    kvs_status st = kvs_results_open_readonly(cfg->str[i], &db);
    if (st == KVS_OK) st = kvs_results_heads_read_clusters(db, 0, slot, NULL);
    kvs_results_close(db);
    if (st != KVS_OK)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: %s=%s: %s", ops->name, pp->key, cfg->str[i], kvs_last_error());
    cfg->resolved[i] = *slot;
    return KVS_OK;
}

kvs_status kvs_results_resolve_policy_inputs(kvs_policy_config *cfgs, int n, void **owned) {
    *owned = NULL;
    if (n <= 0) return KVS_OK;
    policy_inputs *pi = calloc(1, sizeof *pi + (size_t)n * KVS_POLICY_MAX_PARAMS * sizeof pi->clusters[0]);
    if (!pi) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    pi->n = n;
    for (int c = 0; c < n; c++)
        for (int i = 0; i < cfgs[c].ops->n_params; i++) {
            kvs_status st = resolve_param(&cfgs[c], i, &pi->clusters[(size_t)c * KVS_POLICY_MAX_PARAMS + (size_t)i]);
            if (st != KVS_OK) {
                kvs_results_policy_inputs_free(pi);
                return st;
            }
        }
    *owned = pi;
    return KVS_OK;
}
