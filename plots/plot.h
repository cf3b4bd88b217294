/* plot.h — plots from a kvsim results database (sim/SCHEMA.md), drawn by gnuplot through a pipe
 * (../shared/DESIGN.md "Results (SQLite) and plots"): error vs budget per policy, error vs decode
 * position, resident memory vs budget. PNG (pngcairo) or SVG, chosen by the output file's extension.
 *
 * Also home of the read-only opener of a results database, shared by `kvsim runs` and `kvsim plot`
 * (sim/results.h only offers the read-write opener, which creates missing files).
 */
#ifndef KVS_PLOT_H
#define KVS_PLOT_H

#include <sqlite3.h>
#include <stdint.h>

#include "../common/kvs.h"

/*! kvs_plot_db_open() : opens an EXISTING kvsim results database read-only (never creates or modifies
 *  it). Missing file: KVS_ERR_IO; not SQLite, corrupt, or SQLite without a kvsim `meta` table:
 *  KVS_ERR_DB; other schema version: KVS_ERR_VERSION. Caller closes *out with sqlite3_close(). */
kvs_status kvs_plot_db_open(const char *path, sqlite3 **out);

typedef enum {
    KVS_PLOT_ERROR_VS_BUDGET = 0,   /* x: budget_tokens (log2), y: a run-wide or per-layer metric */
    KVS_PLOT_ERROR_VS_POSITION = 1, /* x: position, y: mean over heads (and layers) of a step metric */
    KVS_PLOT_MEMORY_VS_BUDGET = 2,  /* x: budget_tokens (log2), y: storage_bytes_max */
} kvs_plot_kind;

/* What to draw. Borrowed strings. */
typedef struct {
    kvs_plot_kind kind;
    const char *metric;    /* NULL = "out_err_mean"; see kvs_plot_metric_check(); ignored for memory-vs-budget */
    int32_t layer;         /* -1: run-wide aggregate (budget kinds) / all layers (position kind) */
    const char *policy;    /* only runs of this policy; NULL = all */
    int64_t budget_tokens; /* error-vs-position only: runs with this budget; -1 = all */
    const char *out_path;  /* ends in .png or .svg; written as OUT.partial then renamed */
    const char *gnuplot;   /* program to run (name looked up on PATH, or a path); NULL = "gnuplot" */
} kvs_plot_options;

/*! kvs_plot_kind_parse() : "error-vs-budget", "error-vs-position", "memory-vs-budget";
 *  else KVS_ERR_INVALID_ARG naming the accepted kinds. */
kvs_status kvs_plot_kind_parse(const char *name, kvs_plot_kind *out);

/*! kvs_plot_metric_check() : KVS_OK when `metric` can be drawn by `kind`: error-vs-budget accepts
 *  out_err_mean, out_err_p50, out_err_p95, out_err_max, attn_recall_mean, topk_overlap_mean;
 *  error-vs-position accepts out_err_mean, attn_recall_mean, topk_overlap_mean (means of the step series);
 *  else KVS_ERR_INVALID_ARG listing the accepted ones. */
kvs_status kvs_plot_metric_check(kvs_plot_kind kind, const char *metric);

/*! kvs_plot_make() : reads the data from the results database at `db_path` (complete runs only) and draws
 *  it with gnuplot into opt->out_path. Errors: bad options KVS_ERR_INVALID_ARG; database problems or no
 *  data to draw KVS_ERR_DB (detail says what was missing); gnuplot missing or failing KVS_ERR_EXTERNAL;
 *  output not creatable KVS_ERR_IO. On any error no output file (and no .partial) is left behind. */
kvs_status kvs_plot_make(const char *db_path, const kvs_plot_options *opt);

#endif /* KVS_PLOT_H */
