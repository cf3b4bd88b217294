/* plot_drift.c — gnuplot scripts of the drift plots: the drift curve (SyncKV Fig. 2a, S1) and the temporal-locality
 * heatmap (Fig. 2b, S3), from the drift tables through results/results_drift.h (no SQL here); see plot_drift.h.
 */
#include "plot_drift.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs.h"
#include "../results/results_drift.h"

#define DRIFT_MAX_BANDS 4    /* layer bands of the curve when the model has more than DRIFT_ALL_LAYERS layers */
#define DRIFT_ALL_LAYERS 6

struct kvs_plot_drift {
    int locality;
    char title[768], xlabel[256], ylabel[256];
    int n_bands;
    char band_label[DRIFT_ALL_LAYERS][64];
    int64_t T;
    int32_t D;
    double *mean, *sd;   /* curve: [n_bands][T] (NaN: no sample) */
    double *chance;      /* curve: [T] the chance level of the drawn rows at each step (NaN: no sample) */
    double *cell;        /* locality: [T][D] (NaN: no pair) */
};

void kvs_plot_drift_free(kvs_plot_drift *p) {
    if (!p) return;
    free(p->mean);
    free(p->sd);
    free(p->chance);
    free(p->cell);
    free(p);
}

size_t kvs_plot_drift_n_series(const kvs_plot_drift *p) { return !p ? 0 : p->locality ? 1 : (size_t)p->n_bands; }

kvs_status kvs_plot_drift_prepare(const char *db_path, const kvs_plot_options *o, kvs_plot_drift **out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "plot: NULL output handle");
    *out = NULL;
    if (!db_path || !o || (o->kind != KVS_PLOT_DRIFT_CURVE && o->kind != KVS_PLOT_DRIFT_LOCALITY))
        return kvs_fail(KVS_ERR_INVALID_ARG, "plot: not a drift kind");
    kvs_drift_unit unit = KVS_DRIFT_HEAD;
    if (o->unit && !strcmp(o->unit, "group")) unit = KVS_DRIFT_GROUP;
    else if (o->unit && strcmp(o->unit, "head"))
        return kvs_fail(KVS_ERR_INVALID_ARG, "--unit: '%s' is not head or group", o->unit);
    if (o->score && strcmp(o->score, "window") && strcmp(o->score, "last"))
        return kvs_fail(KVS_ERR_INVALID_ARG, "--score: '%s' is not window or last", o->score);
    if (o->score && o->kind == KVS_PLOT_DRIFT_LOCALITY)
        return kvs_fail(KVS_ERR_INVALID_ARG, "--score applies to --kind drift-curve only (locality compares steps)");

    kvs_results_db *db = NULL;
    kvs_results_drift_run *runs = NULL;
    int64_t n_runs = 0, n = 0;
    kvs_drift_step *steps = NULL;
    kvs_drift_locality *loc = NULL;
    kvs_plot_drift *p = calloc(1, sizeof *p);
    kvs_status rc = KVS_OK;
    if (!p) return kvs_fail(KVS_ERR_NOMEM, "plot: out of memory");
    p->locality = o->kind == KVS_PLOT_DRIFT_LOCALITY;
    KVS_TRY(rc = kvs_results_open_readonly(db_path, &db));
    KVS_TRY(rc = kvs_results_drift_query_runs(db, o->trace, o->model, &runs, &n_runs));
    if (n_runs == 0) {
        rc = kvs_fail(KVS_ERR_DB, "%s: no drift runs%s%s%s%s in the database: nothing to plot", db_path,
                      o->trace ? " of trace " : "", o->trace ? o->trace : "", o->model ? " of model " : "",
                      o->model ? o->model : "");
        goto cleanup;
    }
    const kvs_results_drift_run *run = &runs[n_runs - 1];
    int64_t k = o->k > 0 ? o->k : run->k[run->n_k - 1];
    int has_k = 0;
    for (int i = 0; i < run->n_k; i++) has_k |= run->k[i] == k;
    if (!has_k) {
        rc = kvs_fail(KVS_ERR_DB, "%s: drift run %lld has no k = %lld (its sweep: the largest is %lld, the smallest "
                                  "%lld)",
                      db_path, (long long)run->id, (long long)k, (long long)run->k[run->n_k - 1], (long long)run->k[0]);
        goto cleanup;
    }
    if (o->layer >= run->n_layers) {
        rc = kvs_fail(KVS_ERR_INVALID_ARG, "--layer %d: the trace has layers 0..%d", (int)o->layer, (int)run->n_layers - 1);
        goto cleanup;
    }
    const int use_last = o->score ? !strcmp(o->score, "last") : !(run->scores & KVS_DRIFT_SCORE_WINDOW);
    if (!p->locality && !(run->scores & (use_last ? KVS_DRIFT_SCORE_LAST : KVS_DRIFT_SCORE_WINDOW))) {
        rc = kvs_fail(KVS_ERR_DB, "%s: drift run %lld did not record the %s prefill score", db_path, (long long)run->id,
                      use_last ? "last" : "window");
        goto cleanup;
    }
    p->T = run->n_steps;
    p->D = run->delta_max;
    const int L = run->n_layers, l0 = o->layer >= 0 ? o->layer : 0, l1 = o->layer >= 0 ? o->layer + 1 : L;
    char layers[64];
    if (o->layer >= 0) snprintf(layers, sizeof layers, "layer %d", (int)o->layer);
    else snprintf(layers, sizeof layers, "layers 0-%d", L - 1);
    if (!p->locality) {
        const int nl = l1 - l0;
        p->n_bands = nl <= DRIFT_ALL_LAYERS ? nl : DRIFT_MAX_BANDS;
        p->mean = malloc((size_t)p->n_bands * (size_t)p->T * sizeof *p->mean);
        p->sd = malloc((size_t)p->n_bands * (size_t)p->T * sizeof *p->sd);
        double *cnt = calloc((size_t)p->n_bands * (size_t)p->T, sizeof *cnt);
        double *ccnt = calloc((size_t)p->T, sizeof *ccnt);
        p->chance = calloc((size_t)p->T, sizeof *p->chance);
        if (!p->mean || !p->sd || !cnt || !ccnt || !p->chance) {
            free(ccnt);
            free(cnt);
            rc = kvs_fail(KVS_ERR_NOMEM, "plot: out of memory");
            goto cleanup;
        }
        memset(p->mean, 0, (size_t)p->n_bands * (size_t)p->T * sizeof *p->mean);
        memset(p->sd, 0, (size_t)p->n_bands * (size_t)p->T * sizeof *p->sd);
        for (int b = 0; b < p->n_bands; b++) {
            const int a = l0 + b * nl / p->n_bands, z = l0 + (b + 1) * nl / p->n_bands - 1;
            if (a == z) snprintf(p->band_label[b], sizeof p->band_label[b], "layer %d", a);
            else snprintf(p->band_label[b], sizeof p->band_label[b], "layers %d-%d", a, z);
        }
        rc = kvs_results_drift_query_steps(db, run->id, unit, (int32_t)o->layer, k, &steps, &n);
        /* two passes: the mean, then the spread around it (sum of squares of deviations) */
        for (int pass = 0; pass < 2 && rc == KVS_OK; pass++) {
            for (int64_t i = 0; i < n; i++) {
                const kvs_drift_step *s = &steps[i];
                const double v = use_last ? s->overlap_last : s->overlap_window;
                if (isnan(v) || s->step < 0 || s->step >= p->T) continue;
                const int b = (int)((int64_t)(s->layer - l0) * p->n_bands / nl);
                const size_t at = (size_t)b * (size_t)p->T + (size_t)s->step;
                if (pass == 0) {
                    p->mean[at] += v;
                    cnt[at] += 1;
                    /* the chance level of the same rows (one value per step: k / the step's context) */
                    if (!isnan(s->chance)) {
                        p->chance[s->step] += s->chance;
                        ccnt[s->step] += 1;
                    }
                } else p->sd[at] += (v - p->mean[at]) * (v - p->mean[at]);
            }
            if (pass == 0)
                for (size_t j = 0; j < (size_t)p->n_bands * (size_t)p->T; j++) p->mean[j] = cnt[j] > 0 ? p->mean[j] / cnt[j] : NAN;
        }
        for (size_t j = 0; j < (size_t)p->n_bands * (size_t)p->T; j++) p->sd[j] = cnt[j] > 0 ? sqrt(p->sd[j] / cnt[j]) : NAN;
        for (int64_t t = 0; t < p->T; t++) p->chance[t] = ccnt[t] > 0 ? p->chance[t] / ccnt[t] : NAN;
        free(cnt);
        free(ccnt);
        if (rc != KVS_OK) goto cleanup;
        if (n == 0) {
            rc = kvs_fail(KVS_ERR_DB, "%s: drift run %lld has no %s rows at k = %lld", db_path, (long long)run->id,
                          kvs_drift_unit_name(unit), (long long)k);
            goto cleanup;
        }
        snprintf(p->title, sizeof p->title,
                 "attention drift: overlap of the %s prefill top-%lld with each decode step's (%s, mean +- sd over %ss) "
                 "- %s, drift run %lld",
                 use_last ? "last-query" : "window", (long long)k, layers, kvs_drift_unit_name(unit),
                 kvs_path_base(run->trace_path ? run->trace_path : "?"), (long long)run->id);
        snprintf(p->xlabel, sizeof p->xlabel,
                 "decode step (grey dashes: SyncKV S1, overlap 0.3 after 50 steps; black long dashes: a random top-%lld set)",
                 (long long)k);
        snprintf(p->ylabel, sizeof p->ylabel, "overlap_%lld(prefill set, step set)  (SyncKV Eq. 1)", (long long)k);
    } else {
        if (p->D < 1 || p->T < 2) {
            rc = kvs_fail(KVS_ERR_DB, "%s: drift run %lld recorded no temporal locality (delta_max %d, %lld steps)",
                          db_path, (long long)run->id, (int)p->D, (long long)p->T);
            goto cleanup;
        }
        p->cell = malloc((size_t)p->T * (size_t)p->D * sizeof *p->cell);
        double *cnt = calloc((size_t)p->T * (size_t)p->D, sizeof *cnt);
        if (!p->cell || !cnt) {
            free(cnt);
            rc = kvs_fail(KVS_ERR_NOMEM, "plot: out of memory");
            goto cleanup;
        }
        memset(p->cell, 0, (size_t)p->T * (size_t)p->D * sizeof *p->cell);
        rc = kvs_results_drift_query_locality(db, run->id, unit, (int32_t)o->layer, k, &loc, &n);
        for (int64_t i = 0; rc == KVS_OK && i < n; i++) {
            if (loc[i].step < 0 || loc[i].step >= p->T || loc[i].delta < 1 || loc[i].delta > p->D || isnan(loc[i].mean))
                continue;
            const size_t at = (size_t)loc[i].step * (size_t)p->D + (size_t)(loc[i].delta - 1);
            p->cell[at] += loc[i].mean; /* each layer's mean over its units, layers weighted equally */
            cnt[at] += 1;
        }
        for (size_t j = 0; j < (size_t)p->T * (size_t)p->D; j++) p->cell[j] = cnt[j] > 0 ? p->cell[j] / cnt[j] : NAN;
        free(cnt);
        if (rc != KVS_OK) goto cleanup;
        if (n == 0) {
            rc = kvs_fail(KVS_ERR_DB, "%s: drift run %lld has no %s locality rows at k = %lld", db_path,
                          (long long)run->id, kvs_drift_unit_name(unit), (long long)k);
            goto cleanup;
        }
        snprintf(p->title, sizeof p->title,
                 "temporal locality: overlap of the top-%lld sets of steps t and t+d (%s, mean over %ss) - %s, drift "
                 "run %lld",
                 (long long)k, layers, kvs_drift_unit_name(unit), kvs_path_base(run->trace_path ? run->trace_path : "?"),
                 (long long)run->id);
        snprintf(p->xlabel, sizeof p->xlabel, "d (steps apart)");
        snprintf(p->ylabel, sizeof p->ylabel, "decode step t");
    }
    *out = p;
    p = NULL;
cleanup:
    free(steps);
    free(loc);
    kvs_results_drift_runs_free(runs, n_runs);
    kvs_results_close(db);
    kvs_plot_drift_free(p);
    return rc;
}

static const char *const band_colors[DRIFT_ALL_LAYERS] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

void kvs_plot_drift_write_script(const kvs_plot_drift *p, int is_svg, const char *image_path, FILE *f) {
    if (is_svg) fprintf(f, "set terminal svg size 1200,720 noenhanced font 'Sans,11' background rgb 'white'\n");
    else fprintf(f, "set terminal pngcairo size 1200,720 noenhanced font 'Sans,10'\n");
    fprintf(f, "set encoding utf8\nset output ");
    kvs_plot_gp_string(f, image_path);
    fprintf(f, "\nset title ");
    kvs_plot_gp_string(f, p->title);
    fprintf(f, "\nset xlabel ");
    kvs_plot_gp_string(f, p->xlabel);
    fprintf(f, "\nset ylabel ");
    kvs_plot_gp_string(f, p->ylabel);
    fprintf(f, "\n");
    if (!p->locality) {
        fprintf(f, "set grid\nset key outside below center horizontal\nset yrange [0:1.05]\nset xrange [0:%lld]\n",
                (long long)(p->T > 1 ? p->T - 1 : 1));
        fprintf(f, "set style fill transparent solid 0.18 noborder\n");
        fprintf(f, "set arrow 1 from graph 0, first 0.3 to graph 1, first 0.3 nohead dt 2 lc rgb '#555555'\n");
        if (p->T > 50) fprintf(f, "set arrow 2 from first 50, graph 0 to first 50, graph 1 nohead dt 2 lc rgb '#555555'\n");
        fprintf(f, "plot ");
        for (int b = 0; b < p->n_bands; b++) {
            fprintf(f, "%s'-' using 1:2:3 with filledcurves lc rgb '%s' notitle, \\\n     '-' using 1:2 with lines lw 2 "
                       "lc rgb '%s' title ",
                    b ? ", \\\n     " : "", band_colors[b], band_colors[b]);
            kvs_plot_gp_string(f, p->band_label[b]);
        }
        fprintf(f, ", \\\n     '-' using 1:2 with lines lw 2 dt (12,6) lc rgb '#000000' title 'chance: random top-k (k / context)'\n");
        for (int b = 0; b < p->n_bands; b++) {
            const double *m = p->mean + (size_t)b * (size_t)p->T, *s = p->sd + (size_t)b * (size_t)p->T;
            for (int part = 0; part < 2; part++) {
                fprintf(f, "# series: %s%s\n", p->band_label[b], part ? "" : " (mean +- sd)");
                for (int64_t t = 0; t < p->T; t++) {
                    if (isnan(m[t])) continue;
                    if (part) fprintf(f, "%lld %.17g\n", (long long)t, m[t]);
                    else fprintf(f, "%lld %.17g %.17g\n", (long long)t, fmax(0.0, m[t] - s[t]), fmin(1.0, m[t] + s[t]));
                }
                fprintf(f, "e\n");
            }
        }
        fprintf(f, "# series: chance (random top-k)\n");
        for (int64_t t = 0; t < p->T; t++)
            if (!isnan(p->chance[t])) fprintf(f, "%lld %.17g\n", (long long)t, p->chance[t]);
        fprintf(f, "e\n");
    } else {
        fprintf(f, "set palette defined (0 '#ffffff', 0.5 '#6baed6', 1 '#08306b')\nset cbrange [0:1]\n");
        fprintf(f, "set cblabel 'overlap (SyncKV Eq. 1)'\nset xrange [0.5:%d.5]\nset yrange [-0.5:%lld.5]\n",
                (int)p->D, (long long)(p->T - 1));
        fprintf(f, "set key off\nplot '-' using 1:2:3 with image\n# series: step x delta\n");
        for (int64_t t = 0; t < p->T; t++)
            for (int32_t d = 1; d <= p->D; d++) {
                /* a full grid (what `with image` needs); NaN cells, pairs past the last step, are left blank */
                const double v = p->cell[(size_t)t * (size_t)p->D + (size_t)(d - 1)];
                if (isnan(v)) fprintf(f, "%d %lld NaN\n", (int)d, (long long)t);
                else fprintf(f, "%d %lld %.17g\n", (int)d, (long long)t, v);
            }
        fprintf(f, "e\n");
    }
    fprintf(f, "unset output\nexit\n");
}
