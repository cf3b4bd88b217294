/* results.h — the SQLite results database of kvsim (schema documented in results/SCHEMA.md).
 *
 * One database per study. Several processes may write one database at once (WAL journal, busy timeout).
 * A replay run is written by one call, kvs_results_write_run(), inside one transaction: its trace row and
 * the trace's turns (when new), its runs row (status 'complete' or 'failed'), its per-layer aggregates, its
 * run-wide aggregate and its per-step series appear together or not at all, so a killed replay leaves no
 * complete-looking partial run.
 * Metric definitions are in ../shared/DESIGN.md ("Metrics").
 */
#ifndef KVS_RESULTS_H
#define KVS_RESULTS_H

#include <stdint.h>

#include "../common/kvs.h"
#include "../trace/trace.h"
#include "../sim/metrics.h"

typedef struct kvs_results_db kvs_results_db;

/* The schema version this kvsim writes (results/SCHEMA.md). */
#define KVS_RESULTS_SCHEMA_VERSION 2

/*! kvs_results_open() : opens or creates the database at `path` for writing, and its schema (idempotent).
 *  An existing file that is not a kvsim results database (or is corrupt) is KVS_ERR_DB with a clear detail
 *  and is left unchanged; a schema version newer than KVS_RESULTS_SCHEMA_VERSION (or unknown) is
 *  KVS_ERR_VERSION, also unchanged. A version-1 database is MIGRATED in place to version 2 in one
 *  transaction (results/SCHEMA.md "Versions and migration"): on any failure it stays a complete v1 database.
 *  Caller frees with kvs_results_close (accepts NULL). */
kvs_status kvs_results_open(const char *path, kvs_results_db **out);

/*! kvs_results_is_sqlite_file() : 1 when the file at `path` starts with SQLite's 16-byte header (a database a
 *  parameter may name instead of a text file), else 0 (also when it cannot be read). Does not open it as a database. */
int kvs_results_is_sqlite_file(const char *path);

/*! kvs_results_open_readonly() : opens an EXISTING kvsim results database read-only: never creates,
 *  migrates or modifies it (what `kvsim runs`, `plot` and `compare` use). A database whose folder the user cannot
 *  write is read too (SQLITE_OPEN_READONLY, or SQLite's immutable mode when its -wal/-shm cannot be created and
 *  no -wal exists: results/SCHEMA.md "Readers"); one with a -wal but no usable -shm there is KVS_ERR_IO saying so. Versions 1 and 2 are read; in a
 *  v1 database the metrics and run columns v1 did not have read as "not recorded" (see the read API
 *  below). Missing or unreadable file: KVS_ERR_IO; an empty database (0 bytes, or SQLite without any schema
 *  object: what a replay killed before its schema committed leaves, and kvs_results_open initialises):
 *  KVS_ERR_END; not SQLite, corrupt, or SQLite with other tables but no kvsim `meta` table: KVS_ERR_DB; newer
 *  or unknown schema version: KVS_ERR_VERSION. Write calls on the handle are
 *  KVS_ERR_STATE. Caller frees with kvs_results_close. */
kvs_status kvs_results_open_readonly(const char *path, kvs_results_db **out);

/*! kvs_results_close() : closes the database (accepts NULL). A database that kvs_results_open() CREATED (the file
 *  did not exist) and whose open or writes failed before any result was stored in it (a full disk during the first
 *  replay into a new file) is removed with its -wal and -shm files, unless another process has it open; a
 *  database that existed is never removed (a failed write rolled back: it is as it was). */
void kvs_results_close(kvs_results_db *db);

/*! kvs_results_schema_version() : the schema version of the open database (1 only for a read-only
 *  handle on a v1 file; a writable handle is always KVS_RESULTS_SCHEMA_VERSION). */
int kvs_results_schema_version(const kvs_results_db *db);

/* The trace a run replayed (stored once per distinct trace in table `traces`). Borrowed strings. */
typedef struct {
    const char *path;         /* as given on the command line */
    const char *model_name;
    int64_t n_positions, prompt_len, n_turns;
    int32_t n_layers, n_heads, n_kv_heads, head_dim;
    const char *dtype;        /* "fp16" ... */
    uint64_t file_bytes;
    const kvs_turn *turns;    /* [n_turns], borrowed: the trace's turns (trace/trace.h), stored in table
                               * trace_turns; NULL = not recorded (readers then have no turn info) */
} kvs_results_trace;

/*! kvs_results_trace_of() : the trace row of the trace opened from `path` with header `info` (its turns
 *  included): what every writer of the database (replay, the analyses) records for a trace. Borrows path and
 *  info's strings and turns. */
kvs_results_trace kvs_results_trace_of(const char *path, const kvs_trace_info *info);

/* One run: one policy configuration at one budget on one trace. Borrowed strings. */
typedef struct {
    const char *policy;        /* registry name, e.g. "h2o" */
    const char *params;        /* canonical "key=value,key=value" with every default filled in */
    int64_t budget_tokens;     /* per KV head, the current token included */
    double budget_fraction;    /* the fraction the user gave (e.g. 0.2 for "20%"), or -1 */
    int is_oracle;             /* 1 for oracle policies (topk): labelled in every output */
    const char *measure;       /* "decode" (generated positions), "prefill" (prompt positions) or "all" */
    const char *budget_scope;  /* "every_step" (|S_t| <= budget), "prompt" (prompt-only: generated tokens all
                                * kept, S_t grows) or "none" (full cache); NULL = "every_step" (stored so) */
    const char *layout;        /* "per_kv_head" or "per_query_head"; NULL = "per_kv_head" (stored so) */
    const char *notes;         /* warnings about the configuration (degenerate settings...), or NULL */
    const char *status;        /* "complete" or "failed" */
    const char *error;         /* failure detail or NULL */
    double wall_seconds;       /* replay time of this run's streams (summed thread time) */
    const char *kvsim_version;
    const char *options;       /* the replay options besides the budget and measure that change its numbers, as
                                * "kv_bytes=2,aux_bytes=4,series_every=0" (the effective values); part of the run's
                                * identity for kvsim merge and sweep resumption; NULL = not recorded */
    const char *codec;         /* the representation stage's canonical spec (sim/codec.h), NULL or "" = K/V as
                                * captured (stored as NULL) */
    int64_t page;              /* page granularity (kvsim replay --page, sim/host.h): positions a page, 0 = token
                                * granularity (stored as NULL) */
} kvs_results_run;

/*! kvs_results_write_run() : writes the trace row (if new) and its turns (trace->turns, when given and not
 *  yet recorded for that row), the run row, `n_layers` per-layer aggregates,
 *  the run-wide aggregate `run_agg` (may be NULL for a failed run) and `n_steps` step samples, in one
 *  transaction; *run_id receives the new run's id (may be NULL). On any failure nothing is written.
 *  Every metric of the table is stored: a NaN statistic or sample as NULL, and the statistics of a metric
 *  with n = 0 (no samples) as NULL too. Turns that do not tile the trace (turn 0 begins at 0, each turn
 *  where the previous ended, begin <= prompt_end <= end, the last ends at n_positions) are KVS_ERR_INVALID_ARG
 *  before anything is written. KVS_ERR_STATE on a read-only handle. */
kvs_status kvs_results_write_run(kvs_results_db *db, const kvs_results_trace *trace, const kvs_results_run *run,
                                 const kvs_results_agg *layer_aggs, int32_t n_layers, const kvs_results_agg *run_agg,
                                 const kvs_results_step *steps, int64_t n_steps, int64_t *run_id);

/* ------------------------------------------------------------------------------------------------
 * Reading. `kvsim runs`, `kvsim plot`, `kvsim compare` and later analyses read the database only through
 * these calls (no SQL outside results/results.c). Values that are not recorded — a NULL column, a column a v1
 * database does not have, or a statistic over no samples (n = 0) — read back as NaN with n = 0; strings
 * not recorded read back as NULL.
 * ---------------------------------------------------------------------------------------------- */

/* Which runs to read. A zero-initialised filter selects every complete run. Borrowed strings. */
typedef struct {
    int64_t run_id;         /* > 0: only this run */
    const char *policy;     /* only this registry name; NULL = any */
    int64_t budget_tokens;  /* > 0: only this budget (tokens per KV head) */
    const char *trace_path; /* only traces stored with this path, or whose path ends in "/" + this; NULL = any */
    const char *trace_sha256; /* with trace_path: also the traces of this content hash (64 hex digits; the file at
                               * trace_path, so any path spelling of it matches); NULL = by path only */
    const char *model;      /* only traces of this model name; NULL = any */
    const char *measure;    /* "decode", "prefill" or "all"; NULL = any */
    int include_failed;     /* 1: failed runs too (status 'failed', has_agg 0) */
    int with_layers;        /* 1: also read the per-layer aggregates into layer_aggs */
} kvs_results_filter;

/* One run as read back. Every string is owned by the row array (freed by kvs_results_run_rows_free);
 * never free one alone. */
typedef struct {
    int64_t id;
    /* the trace */
    int64_t trace_id;
    char *trace_path, *model, *dtype;
    int64_t n_positions, prompt_len, n_turns;
    int32_t n_layers, n_heads, n_kv_heads, head_dim;
    /* the configuration */
    char *policy, *params;
    int64_t budget_tokens;
    double budget_fraction;  /* -1 when the budget was given in tokens */
    int is_oracle;
    char *measure;           /* "decode", "prefill" or "all" */
    char *budget_scope;      /* "every_step", "prompt", "none"; NULL = not recorded (written by schema v1) */
    char *layout;            /* "per_kv_head", "per_query_head"; NULL = not recorded (schema v1) */
    char *notes;             /* NULL when none */
    /* the outcome */
    char *status;            /* "complete" or "failed" */
    char *error;             /* NULL unless failed */
    double wall_seconds;     /* NaN when not recorded */
    char *kvsim_version, *created_at;
    char *options;           /* runs.options, "kv_bytes=2,aux_bytes=4,series_every=0" (the replay options that change
                              * a run's numbers); NULL = not recorded (older databases). kvs_results_run_bytes parses it */
    char *codec;             /* runs.codec: the codec's canonical spec; NULL = K/V as captured (or an older database) */
    int64_t page;            /* runs.page: positions a page; 0 = token granularity (NULL, or an older database) */
    char page_score[8];      /* a paged run's page score rule from runs.options' page_score (sim/host.h): "max" or
                              * "sum"; "" for the count rule, token granularity or a run that recorded none */
    char *trace_sha256;      /* the trace file's content hash, 64 lowercase hex digits (table sweep_traces, recorded by
                              * replay and sweep); NULL = not recorded (older databases, or no sweep_traces table).
                              * Runs of one trace through two path spellings have two trace_ids and one trace_sha256 */
    int has_agg;             /* 1 when the run has its run-wide aggregate (every complete run does) */
    kvs_results_agg agg;     /* run-wide aggregate (layer -1); all NaN / n 0 when has_agg is 0 */
    int32_t n_layer_aggs;    /* filter.with_layers only: rows of run_layers */
    kvs_results_agg *layer_aggs; /* [n_layer_aggs] ascending layer, or NULL */
} kvs_results_run_row;

/*! kvs_results_query_runs() : the runs selected by `f` (NULL = every complete run), ascending id, into a
 *  malloc'd array *rows of *n entries (*rows NULL when *n is 0). Caller frees with
 *  kvs_results_run_rows_free(*rows, *n). KVS_ERR_DB on a database error (nothing returned then). */
kvs_status kvs_results_query_runs(kvs_results_db *db, const kvs_results_filter *f, kvs_results_run_row **rows,
                                  int64_t *n);
void kvs_results_run_rows_free(kvs_results_run_row *rows, int64_t n);

/*! kvs_results_check_runs() : SQLite's quick_check of the tables a run listing reads (traces, runs, run_summary,
 *  run_layers, trace_turns, sweep_traces; not steps, which is read, and so found damaged, by the series readers):
 *  KVS_OK when they are sound, KVS_ERR_DB "database disk image is malformed" naming the table and SQLite's finding
 *  when not. Costs a walk of those tables' pages. `kvsim runs` calls it so that a damaged database is an error,
 *  never a listing of what could still be read. */
kvs_status kvs_results_check_runs(kvs_results_db *db);

/*! kvs_results_run_label() : the one name of a run's configuration in every output that names runs (compare, plot,
 *  report, runs): "policy (params) [codec] [page N]", e.g. "window [int:bits=4,group=32,k_axis=token,v_axis=channel]" or
 *  "window [page 16]" (no parentheses without params, no brackets without a codec or a page size); a page mapped by
 *  a score rule names it after the size, "h2o [page 16 max]" (the count rule is the plain "[page N]"). Into buf (cap
 *  bytes, always NUL-terminated). */
void kvs_results_run_label(const kvs_results_run_row *r, char *buf, size_t cap);
/*! kvs_results_config_label() : the same name from its parts (policy, params, codec, page; NULL params or codec =
 *  none, page 0 = token granularity), for a series that holds them apart from any run row (plot, report). */
void kvs_results_config_label(const char *policy, const char *params, const char *codec, int64_t page, char *buf,
                              size_t cap);
/*! kvs_results_config_label_rule() : the same with the page score rule (NULL or "" = the count rule); the one
 *  function behind every label above. */
void kvs_results_config_label_rule(const char *policy, const char *params, const char *codec, int64_t page,
                                   const char *page_score, char *buf, size_t cap);
/*! kvs_results_run_params_label() : the same name less its policy, for the tables that print the policy in a
 *  column of its own (compare, runs): "params [codec] [page N]", "-" standing for no params ("- [fp8]", "- [page 16]", "-"). Into buf (cap
 *  bytes, always NUL-terminated). */
void kvs_results_run_params_label(const kvs_results_run_row *r, char *buf, size_t cap);

/*! kvs_results_trace_label() : a run's trace as people read it, into buf (cap bytes, always NUL-terminated when
 *  cap > 0, truncated to fit): "<model>@<first 8 hex digits of trace_sha256>" (e.g. "stories260K@3f2a9c01") when
 *  the hash is recorded, which names the same trace through any path spelling; else the base name of trace_path
 *  ("story.kvt"), or "?" when the row has neither. */
void kvs_results_trace_label(const kvs_results_run_row *r, char *buf, size_t cap);

/*! kvs_results_run_bytes() : the bytes per stored K/V element (*kv_bytes) and per auxiliary element (*aux_bytes)
 *  the run was replayed with, parsed from r->options ("kv_bytes=2,aux_bytes=4,..."). @return 1 when both keys are
 *  present with decimal integer values (then both outputs are written), 0 when options is NULL (not recorded),
 *  lacks either key or holds a value that is not an integer (outputs untouched then). */
int kvs_results_run_bytes(const kvs_results_run_row *r, int *kv_bytes, int *aux_bytes);

/* A per-position series of one metric of one run. */
typedef struct {
    int64_t n;
    int64_t *position; /* [n] ascending absolute positions */
    double *value;     /* [n] mean over query heads (and layers) of the recorded (non-NULL) samples */
} kvs_results_series;

/*! kvs_results_query_steps() : the steps series of `metric` for run `run_id`, one point per stored
 *  position: the mean over query heads of layer `layer` (or over every layer and query head when layer is
 *  -1) of the samples where the metric was recorded. n = 0 when the run stored no series or never recorded
 *  this metric (e.g. a v1 database). Caller frees with kvs_results_series_free (accepts an empty series). */
kvs_status kvs_results_query_steps(kvs_results_db *db, int64_t run_id, int32_t layer, kvs_metric metric,
                                   kvs_results_series *out);
void kvs_results_series_free(kvs_results_series *s);

/*! kvs_results_query_turns() : the turns of trace `trace_id` (kvs_results_run_row.trace_id), ascending, into a
 *  malloc'd array *turns of *n entries (caller frees with free()). *n = 0 and *turns NULL when the database
 *  has no turn info for it: a v1 database, a v2 database written before table trace_turns existed, a trace
 *  written without its turns, or no such trace. KVS_ERR_DB on a database error. */
kvs_status kvs_results_query_turns(kvs_results_db *db, int64_t trace_id, kvs_turn **turns, int64_t *n);

/*! kvs_results_column_parse() : splits an aggregate column name "<metric>_<stat>" of the metric table
 *  (out_err_p95, storage_bytes_max, attended_tokens_mean, out_err_n) into its metric and statistic.
 *  KVS_ERR_INVALID_ARG when it names none ("unknown metric column"). */
kvs_status kvs_results_column_parse(const char *name, kvs_metric *metric, kvs_stat_kind *stat);

/*! kvs_results_stat_value() : statistic `k` of `s` as a double (n converted); NaN when s->n is 0 and k
 *  is not KVS_STAT_N (no samples: no value). */
double kvs_results_stat_value(const kvs_results_stat *s, kvs_stat_kind k);

#endif /* KVS_RESULTS_H */
