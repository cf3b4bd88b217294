/* plot_heads.h — the heads plots of `kvsim plot` (plots/plot.h), drawn from the heads table family
 * (results/results_heads.h) of a results database: the head-similarity heatmap with the clusters boxed (SyncKV
 * §4.1 Eq. 2, App. B.1) and the layer-to-layer similarity matrix (SyncKV Fig. 2c; POLICY_SPEC §5.4 S4, §8.4g).
 * plot.c dispatches here for these kinds and keeps the output rules (common/kvs_out.h, gnuplot in a private
 * folder); this file reads the run and writes the gnuplot script.
 *
 *  - head-similarity: S of the units (KV groups, --metric unit_sim, the default) or of the query heads
 *    (query_sim) of one layer (--layer L) or of every layer on one axis (layer-major). Units are ordered by
 *    (layer, cluster, unit) so each cluster is a contiguous block on the diagonal, boxed in black; a thick line
 *    separates layers; tick labels name layer and head, a '*' marks each cluster's representative.
 *  - layer-similarity: the L x L matrix of the layer-to-layer similarity (query heads by default, unit_sim for
 *    units), each cell labelled with its value.
 * The latest heads run is drawn, or the latest of the trace (--trace) / model (--model) given.
 */
#ifndef KVS_PLOT_HEADS_H
#define KVS_PLOT_HEADS_H

#include <stdio.h>

#include "plot.h"

typedef struct kvs_plot_heads kvs_plot_heads;

/*! kvs_plot_heads_kind() : 1 for the kinds drawn here (head-similarity, layer-similarity). */
int kvs_plot_heads_kind(kvs_plot_kind kind);

/*! kvs_plot_heads_metric_check() : KVS_OK for "unit_sim" or "query_sim" (NULL = the kind's default); else
 *  KVS_ERR_INVALID_ARG saying what is accepted. */
kvs_status kvs_plot_heads_metric_check(kvs_plot_kind kind, const char *metric);

/*! kvs_plot_heads_prepare() : reads the heads run to draw from `db_path` (read-only) and lays it out.
 *  KVS_ERR_INVALID_ARG for options these kinds do not take (--layer on layer-similarity, a layer outside the
 *  run, --policy, --budget, --measure, --x-stat); KVS_ERR_DB when the database has no heads run to draw.
 *  @return KVS_OK and *out (caller frees with kvs_plot_heads_free, which accepts NULL) */
kvs_status kvs_plot_heads_prepare(const char *db_path, const kvs_plot_options *o, kvs_plot_heads **out);
void kvs_plot_heads_free(kvs_plot_heads *h);

/*! kvs_plot_heads_write_script() : the complete gnuplot script (terminal, `set output` naming image_path, the
 *  matrix as a datablock $S, one "# cluster: ..." comment per boxed cluster). */
void kvs_plot_heads_write_script(FILE *gp, const kvs_plot_heads *h, int is_svg, const char *image_path);

#endif /* KVS_PLOT_HEADS_H */
