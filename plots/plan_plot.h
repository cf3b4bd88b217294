/* plan_plot.h — the plots of a capacity plan (`kvsim plan --plot-memory / --plot-batch`; analysis/plan.h):
 * resident KV memory of the whole batch against the response length, one line per policy kind, with the GPU
 * memory left for the KV cache as a dashed line; and the max-batch chart, a clustered bar chart of the largest
 * batch that fits at each (context + response) setting per policy kind (D2O Table 5's comparison, POLICY_SPEC
 * D10); and decode tokens/s against the batch per policy (the roofline of analysis/plan_time.h). Drawn by gnuplot through a pipe with plots/plot.c's runner (kvs_plot_gnuplot_render: the output rules
 * of common/kvs_out.h, nothing written on failure). The data is the caller's: no database is read here.
 */
#ifndef KVS_PLAN_PLOT_H
#define KVS_PLAN_PLOT_H

#include <stdint.h>
#include <stdio.h>

#include "../common/kvs.h"

typedef enum {
    KVS_PLOT_PLAN_MEMORY = 0,    /* x: response tokens (n_x values in x), y: bytes (drawn in GiB) */
    KVS_PLOT_PLAN_MAX_BATCH = 1, /* x: categories (x_labels), y: max batch (log scale), bars per series */
    KVS_PLOT_PLAN_THROUGHPUT = 2, /* x: batch (n_x values in x, log scale), y: decode tokens/s, a line per series
                                   * (`kvsim plan --plot-throughput`, analysis/plan_time.h) */
} kvs_plot_plan_kind;

/* What to draw. Everything borrowed. */
typedef struct {
    kvs_plot_plan_kind kind;
    const char *title;
    const char *out_path;          /* common/kvs_out.h rules; "-" standard output */
    const char *format;            /* "png", "svg" or NULL (by out_path's extension) */
    const char *gnuplot;           /* NULL = "gnuplot" on PATH */
    int n_series;
    const char *const *labels;     /* [n_series] */
    int n_x;
    const double *x;               /* [n_x] memory and throughput kinds */
    const char *const *x_labels;   /* [n_x] max-batch kind */
    const double *y;               /* [n_series * n_x], row-major by series; non-finite = no point */
    double hline;                  /* memory kind: bytes for the KV-pool line; non-finite = none */
} kvs_plot_plan;

/*! kvs_plot_plan_write_script() : the complete gnuplot script of `p` (its `set output` names image_path) to f;
 *  one "# series: LABEL" comment before each series' data. KVS_ERR_INVALID_ARG for an empty plot, KVS_ERR_IO
 *  when writing fails. */
kvs_status kvs_plot_plan_write_script(const kvs_plot_plan *p, int is_svg, const char *image_path, FILE *f);

/*! kvs_plot_plan_render() : checks the format (plots/plot.h kvs_plot_image_format) and draws `p` into
 *  p->out_path. Errors as kvs_plot_render's. */
kvs_status kvs_plot_plan_render(const kvs_plot_plan *p);

#endif /* KVS_PLAN_PLOT_H */
