/* plot_heads.c — the head-similarity heatmap with cluster boundaries and the layer-to-layer similarity matrix
 * (SyncKV §4.1, App. B.1, Fig. 2c; POLICY_SPEC §5.4 S4, §8.4g) from the heads table family, as gnuplot
 * scripts. Implements plots/plot_heads.h; plot.c renders them.
 */
#include "plot_heads.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../results/results_heads.h"

struct kvs_plot_heads {
    kvs_plot_kind kind;
    int units;                 /* 1: units (KV groups), 0: query heads */
    int32_t layer;             /* head-similarity: one layer, or -1 for every layer */
    kvs_results_heads_row *r;  /* the run drawn */
    int32_t n;                 /* matrix side */
    int32_t *order;            /* head-similarity: [n] global head index of each row / column */
};

int kvs_plot_heads_kind(kvs_plot_kind kind) {
    return kind == KVS_PLOT_HEAD_SIMILARITY || kind == KVS_PLOT_LAYER_SIMILARITY;
}

kvs_status kvs_plot_heads_metric_check(kvs_plot_kind kind, const char *metric) {
    if (!kvs_plot_heads_kind(kind)) return kvs_fail(KVS_ERR_INVALID_ARG, "plot: not a heads kind");
    if (!metric || !strcmp(metric, "unit_sim") || !strcmp(metric, "query_sim")) return KVS_OK;
    return kvs_fail(KVS_ERR_INVALID_ARG, "--metric: %s draws unit_sim (units: KV groups) or query_sim (query heads), "
                                         "not '%s'",
                    kvs_plot_kind_name(kind), metric);
}

void kvs_plot_heads_free(kvs_plot_heads *h) {
    if (!h) return;
    kvs_results_heads_row_free(h->r);
    free(h->order);
    free(h);
}

kvs_status kvs_plot_heads_prepare(const char *db_path, const kvs_plot_options *o, kvs_plot_heads **out) {
    *out = NULL;
    kvs_status st = kvs_plot_heads_metric_check(o->kind, o->metric);
    if (st != KVS_OK) return st;
    if (o->policy || o->measure || o->x_stat || o->budget_tokens > 0)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s draws a heads run: --policy, --measure, --budget and --x-stat do "
                                             "not apply (--trace and --model select the run)",
                        kvs_plot_kind_name(o->kind));
    if (o->kind == KVS_PLOT_LAYER_SIMILARITY && o->layer >= 0)
        return kvs_fail(KVS_ERR_INVALID_ARG, "--layer applies to head-similarity, not layer-similarity");
    kvs_plot_heads *h = calloc(1, sizeof *h);
    if (!h) return kvs_fail(KVS_ERR_NOMEM, "plot: out of memory");
    h->kind = o->kind;
    h->layer = o->layer;
    /* head-similarity shows what SyncKV clusters (units) unless asked; layer-similarity Fig. 2c's heads */
    h->units = o->metric ? !strcmp(o->metric, "unit_sim") : o->kind == KVS_PLOT_HEAD_SIMILARITY;
    kvs_results_db *db = NULL;
    KVS_TRY(st = kvs_results_open_readonly(db_path, &db));
    KVS_TRY(st = kvs_results_heads_read(db, 0, o->trace, o->model, &h->r));
    const kvs_results_heads_row *r = h->r;
    if (h->layer >= r->n_layers) {
        st = kvs_fail(KVS_ERR_INVALID_ARG, "--layer %d: heads run %lld has layers 0..%d", h->layer, (long long)r->id,
                      r->n_layers - 1);
        goto cleanup;
    }
    if (o->kind == KVS_PLOT_LAYER_SIMILARITY) {
        h->n = r->n_layers;
    } else {
        const int32_t per = h->units ? r->n_kv_heads : r->n_heads;
        const int32_t l0 = h->layer >= 0 ? h->layer : 0, l1 = h->layer >= 0 ? h->layer + 1 : r->n_layers;
        h->n = (l1 - l0) * per;
        if (!(h->order = malloc((size_t)h->n * sizeof *h->order))) {
            st = kvs_fail(KVS_ERR_NOMEM, "plot: out of memory");
            goto cleanup;
        }
        int32_t k = 0;
        for (int32_t l = l0; l < l1; l++) {
            if (!h->units) {
                for (int32_t i = 0; i < per; i++) h->order[k++] = l * per + i;
                continue;
            }
            /* cluster by cluster, so each cluster is one block on the diagonal */
            for (int32_t g = 0; g < r->clusters->n_clusters[l]; g++)
                for (int32_t u = 0; u < per; u++)
                    if (r->clusters->cluster[(size_t)l * (size_t)per + (size_t)u] == g) h->order[k++] = l * per + u;
        }
    }
    *out = h;
    h = NULL;
cleanup:
    kvs_results_close(db);
    kvs_plot_heads_free(h);
    return st;
}

/* Tick labels on both axes: "L<layer> <u|h><index>[*]". */
static void put_tics(FILE *gp, const kvs_plot_heads *h) {
    const kvs_results_heads_row *r = h->r;
    const int32_t per = h->units ? r->n_kv_heads : r->n_heads;
    for (int axis = 0; axis < 2; axis++) {
        fprintf(gp, "set %s (", axis ? "ytics" : "xtics");
        for (int32_t i = 0; i < h->n; i++) {
            int32_t gi = h->order[i], l = gi / per, u = gi % per;
            int rep = h->units && r->clusters->is_rep[gi];
            fprintf(gp, "%s\"L%d %s%d%s\" %d", i ? ", " : "", l, h->units ? "u" : "h", u, rep ? "*" : "", i);
        }
        fprintf(gp, ")%s\n", axis ? "" : " rotate by 90 right");
    }
}

void kvs_plot_heads_write_script(FILE *gp, const kvs_plot_heads *h, int is_svg, const char *image_path) {
    const kvs_results_heads_row *r = h->r;
    const int heads = h->kind == KVS_PLOT_HEAD_SIMILARITY;
    const int side = h->n > 24 ? 1100 : 800;
    if (is_svg)
        fprintf(gp, "set terminal svg size %d,%d noenhanced font 'Sans,11' background rgb 'white'\n", side + 100,
                side);
    else fprintf(gp, "set terminal pngcairo size %d,%d noenhanced font 'Sans,10'\n", side + 100, side);
    fprintf(gp, "set encoding utf8\nset output ");
    kvs_plot_gp_string(gp, image_path);
    char title[512], where[32], foot[1024];
    if (h->layer >= 0) snprintf(where, sizeof where, "layer %d", h->layer);
    else snprintf(where, sizeof where, "all layers");
    if (heads)
        snprintf(title, sizeof title, "%s similarity, %s: mean top-%lld overlap over %lld decode steps",
                 h->units ? "unit (KV group, MAX-pooled)" : "query head", where, (long long)r->k,
                 (long long)r->n_steps);
    else
        snprintf(title, sizeof title, "layer-to-layer similarity of %s: mean top-%lld overlap over head pairs",
                 h->units ? "units" : "query heads", (long long)r->k);
    snprintf(foot, sizeof foot, "%s%s, heads run %lld", heads && h->units ? "clusters boxed, * = representative; " :
                                                        !heads ? "diagonal: pairs of distinct heads; " : "",
             r->trace_path, (long long)r->id);
    fprintf(gp, "\nset title ");
    kvs_plot_gp_string(gp, title);
    fprintf(gp, "\nset label 1 ");
    kvs_plot_gp_string(gp, foot);
    fprintf(gp, " at screen 0.5, 0.012 center");
    fprintf(gp, "\nset size ratio -1\nset xrange [-0.5:%d.5]\nset yrange [%d.5:-0.5]\nset cbrange [0:1]\n"
                "set cblabel 'mean overlap coefficient'\nset bmargin 7\nset palette defined (0 '#ffffff', 0.5 '#6fa8dc', 1 '#0b2e6b')\n"
                "set tics nomirror out\nunset key\n",
            h->n - 1, h->n - 1);
    /* the matrix as a datablock, row i = head order[i] */
    fprintf(gp, "$S << EOD\n");
    const int32_t per = heads ? (h->units ? r->n_kv_heads : r->n_heads) : 1;
    const double *m = heads ? (h->units ? r->unit_sim : r->qhead_sim) : (h->units ? r->layer_sim_u : r->layer_sim_q);
    const size_t w = (size_t)r->n_layers * (size_t)per;
    for (int32_t i = 0; i < h->n; i++) {
        for (int32_t j = 0; j < h->n; j++) {
            size_t a = heads ? (size_t)h->order[i] : (size_t)i, b = heads ? (size_t)h->order[j] : (size_t)j;
            double v = m[a * w + b];
            if (isnan(v)) fprintf(gp, "%sNaN", j ? " " : "");
            else fprintf(gp, "%s%.17g", j ? " " : "", v);
        }
        fprintf(gp, "\n");
    }
    fprintf(gp, "EOD\n");
    if (!heads) {
        fprintf(gp, "set xtics 1\nset ytics 1\nset format x 'L%%g'\nset format y 'L%%g'\n"
                    "set xlabel 'target layer'\nset ylabel 'source layer'\n"
                    "plot $S matrix with image, $S matrix using 1:2:(sprintf('%%.3f', $3)) with labels font ',9'\n"
                    "unset output\nexit\n");
        return;
    }
    put_tics(gp, h);
    /* cluster boxes (units) and layer separators (every layer on one axis) */
    int obj = 0;
    int32_t start = 0;
    for (int32_t i = 1; i <= h->n; i++) {
        int32_t gp_prev = h->order[i - 1];
        int new_layer = i == h->n || h->order[i] / per != gp_prev / per;
        int new_cluster = h->units && (new_layer || r->clusters->cluster[h->order[i]] != r->clusters->cluster[gp_prev]);
        if (new_cluster) {
            fprintf(gp, "# cluster: layer %d cluster %d rows %d..%d\n", gp_prev / per,
                    r->clusters->cluster[gp_prev], start, i - 1);
            fprintf(gp, "set object %d rect from %g,%g to %g,%g front fillstyle empty border lc rgb '#000000' lw 2\n",
                    ++obj, start - 0.5, start - 0.5, i - 0.5, i - 0.5);
            start = i;
        }
        if (new_layer && i < h->n) {
            fprintf(gp, "set arrow from %g,-0.5 to %g,%g nohead front lw 3 lc rgb '#c00000'\n", i - 0.5, i - 0.5,
                    h->n - 0.5);
            fprintf(gp, "set arrow from -0.5,%g to %g,%g nohead front lw 3 lc rgb '#c00000'\n", i - 0.5, h->n - 0.5,
                    i - 0.5);
        }
        if (new_layer && !h->units) start = i;
    }
    fprintf(gp, "plot $S matrix with image\nunset output\nexit\n");
}
