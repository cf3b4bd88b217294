/* results_sweep.h — the "sweep" table family of the results database (results/SCHEMA.md "Family sweep"): which
 * study tasks of `kvsim sweep` completed, the content hash of each trace a sweep replayed, and `kvsim merge`,
 * which combines the shard databases of a sharded study into one.
 */
#ifndef KVS_RESULTS_SWEEP_H
#define KVS_RESULTS_SWEEP_H

#include <stdint.h>

#include "results.h"

/*! kvs_results_sweep_trace() : the traces row of `trace` (the row replays of it use; inserted if new) and its
 *  content hash `sha256` (64 hex digits) in table sweep_traces, in one transaction; *trace_id receives the row
 *  id. KVS_ERR_STATE on a read-only handle. */
kvs_status kvs_results_sweep_trace(kvs_results_db *db, const kvs_results_trace *trace, const char *sha256,
                                   int64_t *trace_id);

/*! kvs_results_sweep_task_done() : *done = 1 when task `task_key` is recorded as completed, else 0 (also when
 *  the database holds no sweep tables). Read-only handles allowed. */
kvs_status kvs_results_sweep_task_done(kvs_results_db *db, const char *task_key, int *done);

/*! kvs_results_sweep_next_run_id() : *next = an id above every run id the database holds (the runs a replay
 *  writes next have ids >= it). Read-only handles allowed. */
kvs_status kvs_results_sweep_next_run_id(kvs_results_db *db, int64_t *next);

/*! kvs_results_sweep_task_record() : records task `task_key` (index `task_index` of study `study`, on trace row
 *  `trace_id`, its policies `configs` and measurement `options`) as completed, in one transaction; recording a
 *  completed task again changes nothing. In the same transaction, the runs of trace `trace_id` with ids below
 *  `first_run_id` that have the identity (kvs_results_merge) of a run with an id >= first_run_id are deleted:
 *  the task's runs were written from first_run_id on, and those older ones are an interrupted earlier attempt's
 *  (a resumed database holds each run once). Borrowed strings. */
kvs_status kvs_results_sweep_task_record(kvs_results_db *db, const char *task_key, const char *study,
                                         int32_t task_index, int64_t trace_id, const char *configs,
                                         const char *options, int64_t first_run_id);

/* What kvs_results_merge() did. */
typedef struct {
    int64_t inputs;           /* databases read, OUT itself included when it existed */
    int64_t runs_copied;      /* runs written to OUT */
    int64_t runs_duplicate;   /* runs already in OUT with the same identity and the same results: skipped */
    int64_t runs_superseded;  /* failed runs dropped for a complete run of the same identity */
    int64_t traces;           /* distinct traces in OUT */
    int64_t tasks;            /* completed sweep tasks in OUT */
    char skipped_tables[512]; /* comma-separated tables of other families that were not merged ("" = none) */
} kvs_results_merge_stats;

/*! kvs_results_merge() : combines the kvsim results databases `inputs[0..n)` — and OUT itself first when it
 *  exists — into OUT. Runs are de-duplicated by identity (trace content hash, or the whole traces row for a
 *  trace without one; policy; canonical params; budget; measure; the replay options of runs.options — kv/aux
 *  bytes, series interval, NULL when not recorded; kvsim version): a complete run replaces failed
 *  ones, a duplicate with the same run-wide results is dropped, a duplicate with different results is
 *  KVS_ERR_DB "conflicting duplicate" naming both. An input of another schema version is KVS_ERR_VERSION, a
 *  file that is not a kvsim database KVS_ERR_DB. Atomic: OUT is written as a temporary file beside it and
 *  renamed over it only when complete, so a failed or killed merge leaves OUT unchanged (a killed merge may
 *  leave OUT.merge-PID.tmp behind). Inputs are never modified. `stats` may be NULL. */
kvs_status kvs_results_merge(const char *out_path, const char *const *inputs, int n, kvs_results_merge_stats *stats);

#endif /* KVS_RESULTS_SWEEP_H */
