/* metrics.h — the one table of replay metrics: KVS_METRIC_LIST below. The policy host computes one value per
 * metric for every measured sample (run, layer, query head, position): kvs_host_metrics (sim/host.h) holds the
 * formulas, and the replay engine (sim/replay.c) records the values as samples and step series. The enum
 * kvs_metric, kvs_metric_table (sim/metrics.c), the named members of kvs_results_agg / kvs_results_step
 * (results/results.h) and the results schema's columns (results/results.c, results/SCHEMA.md: one `<name>_<stat>` column per
 * metric and statistic, one `steps` column per metric) are generated from the list, and `kvsim runs`, `kvsim
 * compare`, the plots and the report iterate the table. So a new metric is one line appended to the list plus its
 * formula in kvs_host_metrics; a database written before it gains its columns at the next open for writing
 * (results/SCHEMA.md "Versions and migration").
 *
 * Definitions follow ../shared/DESIGN.md ("Metrics") and ../shared/POLICY_SPEC.md §1.5 (storage classes,
 * traffic, transfers) and §1.6 (per-step metrics). All byte metrics are per (layer, KV head) per step: the
 * KV head of the sampled query head. For a per-query-head policy the KV and auxiliary storage are the
 * EXPANDED count (the G copies summed, what the reference code stores); `storage_dedup_bytes` is the
 * union of the G sets (an optimistic shared pool).
 */
#ifndef KVS_METRICS_H
#define KVS_METRICS_H

#include <stdint.h>

#include "../common/kvs.h"

/* THE LIST. One line per metric: X(ENUM_SUFFIX, column_name, "label", "unit", kind, higher_is_better, "help").
 * Order = column order in the database and the CSV; append new metrics at the end. The enum kvs_metric,
 * the named members of kvs_results_agg / kvs_results_step (results/results.h) and kvs_metric_table are all
 * generated from it. */
#define KVS_METRIC_LIST(X)                                                                                        \
    X(OUT_ERR, out_err, "rel. output error", "", KVS_METRIC_QUALITY, 0, "||O - O'||_2 / ||O||_2")                 \
    X(OUT_ERR_ABS, out_err_abs, "abs. output error", "", KVS_METRIC_QUALITY, 0, "||O - O'||_2 (MorphKV Eq. 2)")   \
    X(OUT_COS, out_cos, "cos(O, O')", "", KVS_METRIC_QUALITY, 1, "cosine of the full and the policy's output")   \
    X(ATTN_RECALL, attn_recall, "attention recall", "", KVS_METRIC_QUALITY, 1,                                    \
      "full-attention mass on the attended unmerged original positions")                                          \
    X(ATTN_RECALL_MERGED, attn_recall_merged, "recall (merged)", "", KVS_METRIC_QUALITY, 1,                       \
      "attention recall counting a merged slot's conserved position")                                             \
    X(TOPK_OVERLAP, topk_overlap, "top-k overlap", "", KVS_METRIC_QUALITY, 1, "|S_t & TopK_|S_t|(full)| / |S_t|") \
    X(ATTENDED, attended_tokens, "attended tokens", "tokens", KVS_METRIC_TOKENS, 0,                               \
      "|S_t|: tokens attended by the query head")                                                                 \
    X(STORAGE, storage_bytes, "resident bytes", "bytes", KVS_METRIC_BYTES, 0,                                     \
      "device-resident bytes per KV head at attention time: KV + auxiliary")                                      \
    X(STORAGE_KV, storage_kv_bytes, "resident KV bytes", "bytes", KVS_METRIC_BYTES, 0,                            \
      "device KV bytes per KV head (per-query-head policies: the G copies summed)")                               \
    X(STORAGE_AUX, storage_aux_bytes, "resident aux bytes", "bytes", KVS_METRIC_BYTES, 0,                         \
      "device auxiliary bytes per KV head (scores, pages, profiles)")                                             \
    X(STORAGE_DEDUP, storage_dedup_bytes, "resident KV bytes (dedup)", "bytes", KVS_METRIC_BYTES, 0,              \
      "device KV bytes of the union of the query heads' sets (= storage_kv_bytes for per-KV-head policies)")      \
    X(STORAGE_HOST, storage_host_bytes, "host bytes", "bytes", KVS_METRIC_BYTES, 0,                               \
      "host-resident (offloaded) bytes per KV head")                                                              \
    X(STORAGE_PEAK, storage_peak_bytes, "peak device bytes", "bytes", KVS_METRIC_BYTES, 0,                        \
      "device peak within the step: resident + transient buffers (prefill blocks, fetch buffers)")                \
    X(TRAFFIC, traffic_bytes, "traffic bytes/step", "bytes", KVS_METRIC_BYTES, 0,                                 \
      "device bytes read per step per KV head: KV + auxiliary (fused)")                                           \
    X(TRAFFIC_KV, traffic_kv_bytes, "KV read bytes/step", "bytes", KVS_METRIC_BYTES, 0,                           \
      "K/V bytes read for attention per step")                                                                    \
    X(TRAFFIC_AUX, traffic_aux_bytes, "aux read bytes/step", "bytes", KVS_METRIC_BYTES, 0,                        \
      "auxiliary bytes read per step, scoring fused with the attention K read")                                   \
    X(TRAFFIC_AUX_UNFUSED, traffic_aux_unfused_bytes, "aux read bytes/step (unfused)", "bytes", KVS_METRIC_BYTES, \
      0, "auxiliary bytes read per step when scoring re-reads K")                                                 \
    X(WRITE, write_bytes, "write bytes/step", "bytes", KVS_METRIC_BYTES, 0, "device bytes written per step")      \
    X(TRANSFER, transfer_bytes, "transfer bytes/step", "bytes", KVS_METRIC_BYTES, 0,                              \
      "host<->device bytes per step (h2d + d2h)")                                                                 \
    X(H2D, h2d_bytes, "host->device bytes/step", "bytes", KVS_METRIC_BYTES, 0, "host->device bytes per step")     \
    X(D2H, d2h_bytes, "device->host bytes/step", "bytes", KVS_METRIC_BYTES, 0, "device->host bytes per step")     \
    X(COMPRESSION, compression_ratio, "compression ratio", "", KVS_METRIC_RATIO, 1,                               \
      "full-cache bytes of the positions so far / resident device bytes")

#define KVS_METRIC_ENUM_(E, name, label, unit, kind, hib, help) KVS_M_##E,
typedef enum { KVS_METRIC_LIST(KVS_METRIC_ENUM_) KVS_N_METRICS } kvs_metric;
#undef KVS_METRIC_ENUM_

/* Declares one member per metric of type T, named as the metric's column (for the unions in results.h). */
#define KVS_METRIC_MEMBER_(E, name, label, unit, kind, hib, help) KVS_METRIC_MEMBER_T_ name;

typedef enum {
    KVS_METRIC_QUALITY = 0, /* error/fidelity: lower or higher is better per `higher_is_better` */
    KVS_METRIC_BYTES = 1,   /* bytes per KV head */
    KVS_METRIC_TOKENS = 2,  /* token counts */
    KVS_METRIC_RATIO = 3,   /* unitless ratio */
} kvs_metric_kind;

typedef struct {
    const char *name;       /* column stem, [a-z0-9_]: "out_err" -> out_err_mean, out_err_p95, ... */
    const char *label;      /* short human label for tables and plot axes */
    const char *unit;       /* "", "bytes", "tokens" */
    const char *help;       /* one line: what it measures */
    kvs_metric_kind kind;
    int higher_is_better;   /* 1 for recall, overlap, cos, compression; 0 otherwise */
} kvs_metric_info;

/* The table, indexed by kvs_metric. */
extern const kvs_metric_info kvs_metric_table[KVS_N_METRICS];

/* Statistics stored per metric in aggregates; order = column order. */
typedef enum { KVS_STAT_N = 0, KVS_STAT_MEAN, KVS_STAT_P50, KVS_STAT_P95, KVS_STAT_MAX, KVS_STAT_MIN, KVS_N_STATS } kvs_stat_kind;
extern const char *const kvs_stat_names[KVS_N_STATS];

/*! kvs_metric_find() : index of the metric named `name`, or -1. */
int kvs_metric_find(const char *name);

/* ---- what a run's metrics come to (the engine's output; the results database stores them) ------------------ */

/* Summary statistics of one metric over a set of samples. */
typedef struct {
    int64_t n;
    double mean, p50, p95, max, min;
} kvs_results_stat;

/* Aggregates over (query head, measured step) samples of one layer, or of the whole run (layer = -1): one
 * kvs_results_stat per metric of the table in sim/metrics.h (m[KVS_M_...]); the named members alias the
 * metric names for readability (out_err is m[KVS_M_OUT_ERR], ...). */
typedef struct {
    int32_t layer; /* -1 for the run-wide aggregate */
    union {
        kvs_results_stat m[KVS_N_METRICS];
#define KVS_METRIC_MEMBER_T_ kvs_results_stat
        struct { KVS_METRIC_LIST(KVS_METRIC_MEMBER_) };
#undef KVS_METRIC_MEMBER_T_
    };
} kvs_results_agg;

/* One sample of the per-step series: every metric of sim/metrics.h at one (layer, query head, position). */
typedef struct {
    int32_t layer, q_head;
    int64_t position;        /* absolute position of the step's token */
    union {
        double v[KVS_N_METRICS]; /* v[KVS_M_...]; NaN = not available */
#define KVS_METRIC_MEMBER_T_ double
        struct { KVS_METRIC_LIST(KVS_METRIC_MEMBER_) };
#undef KVS_METRIC_MEMBER_T_
    };
} kvs_results_step;

/*! kvs_results_stat_compute() : fills *out from n samples (sorted copy made internally; p50/p95 by
 *  nearest rank on the sorted samples: index ceil(p*n)-1). n == 0 gives all zeros. */
kvs_status kvs_results_stat_compute(const double *samples, int64_t n, kvs_results_stat *out);


#endif /* KVS_METRICS_H */
