/* results_drift.h — the drift table family of the results database (results/SCHEMA.md "Drift tables"): what
 * `kvsim drift` measures (analysis/drift.h: SyncKV §3.1-3.2, Fig. 2a/2b; POLICY_SPEC §5.4 S1-S3) and the read API
 * that `kvsim plot --kind drift-*` and `kvsim report` use. Follows the family rules of results/results_internal.h.
 *
 * Writing: one drift run = one transaction. kvs_results_drift_begin() opens it (BEGIN IMMEDIATE, the family's
 * tables created if absent, the trace row, the drift_runs row); the put calls insert rows through prepared
 * statements as the analysis produces them (nothing of the analysis is buffered here); kvs_results_drift_commit()
 * commits, kvs_results_drift_abort() (or any failed put, or free without commit) rolls everything back, so a failed
 * or killed analysis leaves the database as it was.
 */
#ifndef KVS_RESULTS_DRIFT_H
#define KVS_RESULTS_DRIFT_H

#include <stdint.h>

#include "../analysis/drift.h"
#include "results.h"

/* The parameters of one drift run (a drift_runs row). Borrowed strings. */
typedef struct {
    int64_t prompt_len;   /* turn 0's prompt: positions the prefill sets are chosen from */
    int64_t n_steps;      /* decode steps analysed (turn 0's generated positions) */
    int32_t window;       /* observation window of the window score */
    int32_t delta_max;
    unsigned scores;      /* KVS_DRIFT_SCORE_* */
    const int64_t *k;     /* [n_k] the sweep */
    int32_t n_k;
} kvs_results_drift_params;

typedef struct kvs_results_drift_writer kvs_results_drift_writer;

/*! kvs_results_drift_begin() : starts a drift run of `trace` in `db` (a writable handle): KVS_ERR_STATE on a
 *  read-only one, KVS_ERR_DB on SQLite errors (nothing written). @return KVS_OK and *out (caller ends it with
 *  kvs_results_drift_commit or kvs_results_drift_abort). */
kvs_status kvs_results_drift_begin(kvs_results_db *db, const kvs_results_trace *trace,
                                   const kvs_results_drift_params *params, kvs_results_drift_writer **out);

/*! kvs_results_drift_put_*() : one row of the run. A failure leaves the writer failed: later puts and the commit
 *  return KVS_ERR_STATE, and the run is rolled back by commit/abort. NaN overlaps are stored as NULL. */
kvs_status kvs_results_drift_put_step(kvs_results_drift_writer *w, const kvs_drift_step *row);
kvs_status kvs_results_drift_put_locality(kvs_results_drift_writer *w, const kvs_drift_locality *row);
kvs_status kvs_results_drift_put_locality_unit(kvs_results_drift_writer *w, const kvs_drift_locality_unit *row);

/*! kvs_results_drift_commit() : commits the run and frees the writer; on failure (or a failed writer) rolls back.
 *  *run_id (may be NULL) receives the new drift_runs id. */
kvs_status kvs_results_drift_commit(kvs_results_drift_writer *w, int64_t *run_id);

/*! kvs_results_drift_abort() : rolls the run back and frees the writer. Accepts NULL. */
void kvs_results_drift_abort(kvs_results_drift_writer *w);

/* ---- reading ---- */

/* One drift_runs row with its trace. Owned strings, freed by kvs_results_drift_runs_free. */
typedef struct {
    int64_t id, trace_id;
    char *trace_path, *model, *created_at;
    int32_t n_layers, n_heads, n_kv_heads;
    int64_t prompt_len, n_steps;
    int32_t window, delta_max;
    unsigned scores;
    int64_t k[KVS_DRIFT_MAX_KS];
    int32_t n_k;
} kvs_results_drift_run;

/*! kvs_results_drift_query_runs() : every drift run, ascending id, optionally only those whose trace path
 *  is `trace` or ends with "/" trace, and whose model is `model` (NULL = any). A database without drift
 *  tables is KVS_ERR_DB "no drift results in DB". Caller frees *rows with kvs_results_drift_runs_free. */
kvs_status kvs_results_drift_query_runs(kvs_results_db *db, const char *trace, const char *model,
                                        kvs_results_drift_run **rows, int64_t *n);
void kvs_results_drift_runs_free(kvs_results_drift_run *rows, int64_t n);

/*! kvs_results_drift_query_steps() : the per-step curves of run `run_id`: rows of `unit`, of layer `layer` (-1 =
 *  all) and top-k size `k` (0 = all), ordered by layer, index, k, step. Caller frees *rows with free().
 *  The three queries give every row its chance level: the stored one, or for a row written before the family had
 *  the column, the one analysis/drift.h computes from the row and its run (kvs_analysis_drift_chance,
 *  kvs_analysis_drift_locality_chance). */
kvs_status kvs_results_drift_query_steps(kvs_results_db *db, int64_t run_id, kvs_drift_unit unit, int32_t layer,
                                         int64_t k, kvs_drift_step **rows, int64_t *n);

/*! kvs_results_drift_query_locality() : the step x δ summaries of run `run_id` for `unit`, `layer` (-1 = all) and
 *  `k` (0 = all), ordered by layer, k, step, delta. Caller frees *rows with free(). */
kvs_status kvs_results_drift_query_locality(kvs_results_db *db, int64_t run_id, kvs_drift_unit unit, int32_t layer,
                                            int64_t k, kvs_drift_locality **rows, int64_t *n);

/*! kvs_results_drift_query_locality_units() : the per-unit δ profiles of run `run_id` (filters as above), ordered
 *  by layer, index, k, delta. Caller frees *rows with free(). */
kvs_status kvs_results_drift_query_locality_units(kvs_results_db *db, int64_t run_id, kvs_drift_unit unit,
                                                  int32_t layer, int64_t k, kvs_drift_locality_unit **rows,
                                                  int64_t *n);

#endif /* KVS_RESULTS_DRIFT_H */
