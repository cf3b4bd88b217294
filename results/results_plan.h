/* results_plan.h — the "plan" table family of the results database (results/SCHEMA.md, "Table family: plan"):
 * capacity plans written by `kvsim plan --db` (analysis/plan.h) and read back by reports.
 *
 * A plan is one row of `plans` (the model, its KV and weight sizes, the GPUs, the policy and its measured
 * profile when it had one) and its points in `plan_points` (one row per series x context x response: bytes
 * per sequence and per batch, host bytes, PCIe bytes per step, max batch and max context). Written in one
 * transaction with the family's tables created inside it (results/results_internal.h).
 */
#ifndef KVS_RESULTS_PLAN_H
#define KVS_RESULTS_PLAN_H

#include <stdint.h>

#include "../analysis/plan.h"
#include "results.h"

/* One plan. Borrowed strings; NaN = not recorded (stored NULL). */
typedef struct {
    const char *model;          /* model name */
    const char *model_source;   /* preset citation, config.json path or trace */
    int32_t n_layers, n_heads, n_kv_heads, head_dim;
    double params;              /* weights counted from the shape */
    const char *kv_dtype;       /* fp16, bf16, fp8, fp32, or a codec's canonical spec (plan --codec) */
    double kv_bytes_per_token;  /* bytes, all layers and KV heads */
    const char *weight_dtype;   /* NULL = weights not resident */
    double weight_bytes;        /* bytes (0 when not resident) */
    int32_t n_gpus;
    double gpu_bytes;           /* per GPU; NaN = not given */
    double reserve_bytes;       /* per GPU */
    double kv_pool_bytes;       /* left for KV; NaN without GPU memory */
    int64_t batch, context, response;
    const char *policy;         /* the planned policy's kind: full, constant, prompt-only, offload, measured */
    int64_t budget;             /* tokens per KV head; <= 0 = none */
    /* the measured profile (policy measured); NULL / NaN / <= 0 otherwise */
    const char *profile_db;     /* the replay database read */
    int64_t profile_run_id;
    const char *profile_policy, *profile_params, *profile_x; /* x: "n" or "generated" */
    const char *aux_scale;      /* the auxiliary rule in effect, e.g. "auto: per list, scalars (a score per held slot,
                                 * per list)" or "kv: ..." / "none: ..." for an override */
    double kv_a, kv_b, aux_a, aux_b, host_a, host_b, transfer_a, transfer_b, fit_r2;
    int64_t fit_n_min, fit_n_max, fit_points; /* the steady-state steps the lines were fitted on; <= 0: none */
    const char *kvsim_version;
} kvs_results_plan;

/* One point of a plan (max_batch / max_context: -1 = unbounded; < -1 = not computed, stored NULL). */
typedef struct {
    const char *series;         /* the series, unique in its plan, naming what it plans: "full", "constant B=64",
                                 * "prompt-only B=64", "offload B=64", a nominal registered policy "h2o B=64
                                 * nominal" and a measured one "measured h2o B=64 (run 12)" */
    int64_t budget;             /* <= 0: none */
    int64_t context, response, batch;
    double seq_device_bytes, total_bytes, host_bytes, pcie_bytes_per_step;
    int64_t max_batch, max_context;
} kvs_results_plan_point;

/*! kvs_results_write_plan() : writes `plan`, its `n_points` points and, when the plan's model came from a trace,
 *  that trace's row (`trace`, may be NULL; see kvs_results_trace_of) in one transaction; *plan_id (may be NULL)
 *  receives the new plan's id. On failure nothing is written. KVS_ERR_STATE on a read-only handle. */
kvs_status kvs_results_write_plan(kvs_results_db *db, const kvs_results_plan *plan, const kvs_results_trace *trace,
                                  const kvs_results_plan_point *points, int64_t n_points, int64_t *plan_id);

/* A plan as read back: ids, a few identifying columns and its points. Strings owned by the row array. */
typedef struct {
    int64_t id;
    char *model, *kv_dtype, *policy, *created_at;
    double kv_bytes_per_token, weight_bytes, gpu_bytes, kv_pool_bytes; /* NaN when not recorded */
    int32_t n_gpus;
    int64_t batch, context, response, budget, trace_id; /* trace_id 0 when none */
    int64_t n_points;
    kvs_results_plan_point *points; /* [n_points] by series, context, response; strings owned by the row array */
} kvs_results_plan_row;

/*! kvs_results_query_plans() : every plan, ascending id, with its points. No plan table: KVS_ERR_DB "no plan
 *  results in DB". Caller frees with kvs_results_plan_rows_free. */
kvs_status kvs_results_query_plans(kvs_results_db *db, kvs_results_plan_row **rows, int64_t *n);
void kvs_results_plan_rows_free(kvs_results_plan_row *rows, int64_t n);

/* One timed point of a plan (`kvsim plan --hw --db`, analysis/plan_time.h): table plan_times, one row per
 * (plan, series, context, response, batch): the plan's points and each series' throughput sweep over the batch. */
typedef struct {
    int64_t plan_id;            /* reading only (writing: the plan_id argument) */
    const char *series;         /* as plan_points.series */
    int64_t context, response, batch;
    const char *hw;             /* the GPU (preset name or the file's "name") */
    int32_t n_gpus;
    double mbu, mfu;
    double ttft_s, tpot_s, tokens_per_s;
    const char *decode_bound;   /* "memory" or "compute" (the response's last step) */
    int fits;                   /* 1: the batch fits in the GPU memory at (context, response) */
    int best;                   /* 1: the series' throughput-maximising batch at the plan's (context, response) */
} kvs_results_plan_time;

/*! kvs_results_write_plan_times() : writes `n` timed points of plan `plan_id` (written by kvs_results_write_plan)
 *  in one transaction, creating plan_times when absent. On failure nothing is written. */
kvs_status kvs_results_write_plan_times(kvs_results_db *db, int64_t plan_id, const kvs_results_plan_time *rows,
                                        int64_t n);

/*! kvs_results_query_plan_times() : every timed point, by plan, series, context, response, batch; *n = 0 (and
 *  KVS_OK) when the database has no plan_times table. Caller frees with kvs_results_plan_times_free. */
kvs_status kvs_results_query_plan_times(kvs_results_db *db, kvs_results_plan_time **rows, int64_t *n);
void kvs_results_plan_times_free(kvs_results_plan_time *rows, int64_t n);

/*! kvs_plan_profile_read() : reads the profile of one complete run from the results database `db_path`
 *  (read-only): run `run_id` when > 0 (then `policy` and `budget`, when given, must be that run's), else the one
 *  complete run of `policy` (NULL = any) at `budget` (> 0; 0 = any). Its per-step series (kvsim replay
 *  --series-every N) of storage_kv_bytes, storage_aux_bytes, storage_host_bytes and transfer_bytes, mean over
 *  layers and query heads per position, are fitted on the run's steady state with kvs_plan_profile_fit, in the
 *  run's KV element bytes (its kv_bytes option, else the trace dtype's); out->aux_scale is an input (set it before
 *  the call): AUTO takes the policy's rule (kvs_plan_aux_rule_of), an override keeps the policy's copies (the
 *  run's layout when the planner does not know the policy). Errors (KVS_ERR_DB unless said): not a results
 *  database, as kvs_results_open_readonly; "no complete runs"; several runs match ("N runs match: choose one with
 *  --run ID", listing them; KVS_ERR_INVALID_ARG); --run with a --policy or --budget of another run
 *  (KVS_ERR_INVALID_ARG); a policy without a rule under AUTO (KVS_ERR_INVALID_ARG); the run has no series; the
 *  run never reaches its steady state (KVS_ERR_INVALID_ARG, kvs_plan_profile_fit). */
kvs_status kvs_plan_profile_read(const char *db_path, int64_t run_id, const char *policy, int64_t budget,
                                 kvs_plan_profile *out);

#endif /* KVS_RESULTS_PLAN_H */
