/* plot_drift.h — the drift plots of `kvsim plot` (plots/plot.h kinds drift-curve and drift-locality), drawn from
 * the drift tables of a results database (results/results_drift.h, results/SCHEMA.md "Drift tables"): SyncKV Fig. 2a (the
 * overlap of the prefill top-k with each decode step's, against the step) and Fig. 2b (temporal locality, as a
 * step x δ heatmap); POLICY_SPEC §5.4 S1, S3. plot.c dispatches to these for the two kinds; gnuplot is run and
 * the output written by plot.c as for every kind.
 *
 * What is drawn comes from the NEWEST drift run that matches the options' trace / model filters:
 *  - drift-curve: per layer band (every layer when the model has at most 6, else 4 bands of consecutive layers;
 *    one layer with --layer) the mean over the band's units of overlap_k(prefill set, step set) per decode step,
 *    with a shaded band of ± one standard deviation over the units (clipped to [0, 1]); dashed guides at SyncKV's
 *    S1 figure (0.3 after 50 steps); a long-dashed black reference line at the chance level of the drawn rows, the
 *    overlap a uniformly random top-k set would have (k / the step's context, stored with each row:
 *    analysis/drift.h "Chance levels"), its own "# series: chance (random top-k)" block;
 *  - drift-locality: rows = decode step t, columns = δ, colour = the mean over the units of overlap_k(step t,
 *    step t + δ), averaged over the layers (or --layer's).
 * Options: k (0: the run's largest), score ("window" or "last"; NULL: window when recorded), unit ("head" or
 * "group"; NULL: head), layer (-1: all).
 */
#ifndef KVS_PLOT_DRIFT_H
#define KVS_PLOT_DRIFT_H

#include <stdio.h>

#include "plot.h"

typedef struct kvs_plot_drift kvs_plot_drift;

/*! kvs_plot_drift_prepare() : reads what `o->kind` (KVS_PLOT_DRIFT_CURVE or KVS_PLOT_DRIFT_LOCALITY) draws from
 *  the database at db_path (read-only). Errors: bad options KVS_ERR_INVALID_ARG; a database without drift results
 *  or without the selected data KVS_ERR_DB with a detail saying what is missing. Caller frees *out with
 *  kvs_plot_drift_free (accepts NULL). */
kvs_status kvs_plot_drift_prepare(const char *db_path, const kvs_plot_options *o, kvs_plot_drift **out);
void kvs_plot_drift_free(kvs_plot_drift *p);

/*! kvs_plot_drift_n_series() : curve: the layer bands (the chance reference line is not counted); locality: 1. */
size_t kvs_plot_drift_n_series(const kvs_plot_drift *p);

/*! kvs_plot_drift_write_script() : the complete gnuplot script (terminal PNG or SVG by is_svg, `set output`
 *  image_path, inline data with a "# series: LABEL" line before each block). */
void kvs_plot_drift_write_script(const kvs_plot_drift *p, int is_svg, const char *image_path, FILE *f);

#endif /* KVS_PLOT_DRIFT_H */
