/* results_closed.h — the "closed" table family of the results database: closed-loop decoding runs
 * (`kvsim generate`, sim/closed_loop.h) and their per-step series, read back by `kvsim calibrate`, and task runs
 * (`kvsim generate --task`: accuracy of one (policy, budget) over a task's items, each item one closed-loop run).
 * Tables closed_runs, closed_steps, closed_task_runs and closed_task_items, documented in results/SCHEMA.md
 * ("Closed-loop runs"); written and read only here (results/results_internal.h rules: created by the writer in its
 * own transaction, additive, schema version 2).
 */
#ifndef KVS_RESULTS_CLOSED_H
#define KVS_RESULTS_CLOSED_H

#include <stdint.h>

#include "../common/kvs_stats.h"
#include "../sim/closed_loop.h"
#include "results.h"

/* One closed-loop run to write. Borrowed strings. */
typedef struct {
    const char *model;          /* model name (file / folder base name) */
    const char *mode;           /* "teacher" or "free" */
    const char *source;         /* the trace or text file path, or "prompt" */
    const kvs_results_trace *trace; /* --trace runs: the trace row (shared with replays of it); NULL otherwise */
    const int32_t *tokens;      /* [n_tokens] the input token ids (teacher: whole text; free: prompt) */
    int64_t n_tokens, prompt_len;
    const char *policy, *params;/* registry name, canonical parameters */
    const char *codec;          /* the policy model's codec, canonical spec (kvs_codec_spec); NULL or "" = none */
    int64_t budget_tokens;
    const char *layout, *budget_scope; /* "per_kv_head"/"per_query_head"; "every_step"/"prompt"/"none" */
    const char *status;         /* "complete" or "failed" */
    const char *error;          /* failure detail or NULL */
    const kvs_closed_loop_result *result; /* NULL for a failed run */
    const char *full_text, *policy_text; /* free-running: decoded generations (NULL without a tokenizer) */
    double wall_seconds;
    const char *kvsim_version;
} kvs_results_closed_run;

/*! kvs_results_closed_write() : writes one run (closed_runs row, its trace row when given, every step into
 *  closed_steps) in one transaction; *run_id receives its id (may be NULL). Nothing is written on failure.
 *  KVS_ERR_INVALID_ARG for missing required fields; KVS_ERR_STATE on a read-only handle; KVS_ERR_DB. */
kvs_status kvs_results_closed_write(kvs_results_db *db, const kvs_results_closed_run *run, int64_t *run_id);

/* One complete closed-loop run as read back (strings owned by the row array). */
typedef struct {
    int64_t id, trace_id;       /* trace_id 0 when the run did not read a trace */
    char *model, *mode, *source, *tokens_sha256, *policy, *params, *budget_scope;
    int64_t n_tokens, prompt_len, budget_tokens, n_steps;
    double kl_mean, kl_max, top1_agree, ppl_full, ppl_policy, out_err_mean, out_err_p95, attn_recall_mean,
        topk_overlap_mean, attended_mean, token_agreement; /* NaN when not recorded */
    int64_t first_divergence;   /* free: -1 never; teacher: -1 */
    char *trace_sha256;         /* the trace file's content hash (table sweep_traces, recorded by generate and
                                 * replay); NULL when not recorded: no trace, or written before generate recorded it */
    char *codec;                /* the policy model's codec (canonical spec); NULL = none */
} kvs_results_closed_row;

/*! kvs_results_closed_query() : every complete closed-loop run, ascending id, into *rows (*n entries; caller
 *  frees with kvs_results_closed_rows_free). A database without the family's tables: KVS_ERR_STATE with
 *  "no closed-loop results in DB". */
kvs_status kvs_results_closed_query(kvs_results_db *db, kvs_results_closed_row **rows, int64_t *n);
void kvs_results_closed_rows_free(kvs_results_closed_row *rows, int64_t n);

/* One item of a task run to write: its closed-loop run (mode "free": the context read, then the generation) and
 * how each model's continuation scored (kvs_closed_loop_task_match). Borrowed. */
typedef struct {
    const kvs_results_closed_run *run;
    int64_t line;                  /* the item's line in the task file */
    const char *answer, *expected; /* the item's answer; the text expected after the tokens read */
    int64_t n_context;             /* tokens read (BOS included) */
    const char *full_text, *policy_text; /* each model's continuation (kvs_closed_loop_task_continuation) */
    int full_correct, policy_correct;    /* 1 / 0; ignored for a failed run */
} kvs_results_closed_task_item;

/* One task run: a (policy configuration, budget) over a task's items. Borrowed. */
typedef struct {
    const char *model, *task, *task_sha256; /* model name; the task file as given; its content hash (its identity) */
    int64_t prompt_tokens;       /* the prompt rule: 0 = each context but its last token, K > 0 = its first K tokens */
    const char *policy, *params;
    const char *codec;           /* the policy model's codec (canonical spec); NULL or "" = none */
    int64_t budget_tokens;
    const char *status, *error;  /* "complete" (every item scored) or "failed" (then the intervals are ignored) */
    const kvs_results_closed_task_item *items;
    int64_t n_items;             /* items written: all of the task's when complete, those run when failed */
    kvs_interval accuracy, full_accuracy, diff; /* policy accuracy, full model accuracy, paired policy - full */
    uint64_t seed;               /* the bootstrap's seed (the interval of the difference uses it too) */
    double wall_seconds;
    const char *kvsim_version;
} kvs_results_closed_task_run;

/*! kvs_results_closed_task_write() : writes a task run in one transaction: each item's closed_runs row (and steps),
 *  its closed_task_runs row and the closed_task_items rows; *task_id receives its id (may be NULL). Nothing is
 *  written on failure. KVS_ERR_INVALID_ARG for missing fields; KVS_ERR_STATE on a read-only handle; KVS_ERR_DB. */
kvs_status kvs_results_closed_task_write(kvs_results_db *db, const kvs_results_closed_task_run *run, int64_t *task_id);

/* An item of a task run as read back (strings owned by the row array). */
typedef struct {
    int64_t item, line, run_id, n_context; /* item: 0-based index in the task */
    char *answer, *expected, *full_text, *policy_text;
    int full_correct, policy_correct;
} kvs_results_closed_task_item_row;

/* One complete task run as read back (strings and items owned by the row array). */
typedef struct {
    int64_t id;
    char *model, *task, *task_sha256, *policy, *params;
    char *codec;                 /* the policy model's codec (canonical spec); NULL = none */
    int64_t prompt_tokens, budget_tokens, n_items, n_correct, full_correct;
    double accuracy, acc_lo, acc_hi, full_accuracy, full_lo, full_hi, diff, diff_lo, diff_hi, level;
    int64_t reps;
    char seed[17];               /* 16 lowercase hex digits */
    kvs_results_closed_task_item_row *items; /* [n_items] ascending item */
} kvs_results_closed_task_row;

/*! kvs_results_closed_task_query() : every complete task run, ascending id, with its items (caller frees with
 *  kvs_results_closed_task_rows_free). A database without the task tables: KVS_ERR_STATE with "no task results
 *  in DB". */
kvs_status kvs_results_closed_task_query(kvs_results_db *db, kvs_results_closed_task_row **rows, int64_t *n);
void kvs_results_closed_task_rows_free(kvs_results_closed_task_row *rows, int64_t n);

#endif /* KVS_RESULTS_CLOSED_H */
