/* plan_plot.c — the memory-vs-response plot, the max-batch chart and the throughput-vs-batch plot of a capacity plan
 * (see plan_plot.h). */
#include "plan_plot.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "plot.h"

/* Writes s as a gnuplot single-quoted string (a doubled quote is the only escape; line breaks become spaces). */
static void put_comment(FILE *f, const char *s) {
    fputs("# series: ", f);
    for (; s && *s; s++) fputc(*s == '\n' || *s == '\r' ? ' ' : *s, f);
    fputc('\n', f);
}

static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
#define N_COLORS (sizeof colors / sizeof colors[0])

static void write_memory(FILE *f, const kvs_plot_plan *p) {
    fprintf(f, "set xlabel 'response length (generated tokens)'\n"
               "set ylabel 'resident KV cache of the batch (GiB = 2^30 bytes)'\n"
               "set key top left\nset grid\nset yrange [0:*]\n");
    if (isfinite(p->hline) && p->hline > 0) {
        fprintf(f, "set arrow from graph 0, first %.17g to graph 1, first %.17g nohead dt 2 lw 2 lc rgb '#555555'\n",
                p->hline / 1073741824.0, p->hline / 1073741824.0);
        fprintf(f, "set label 'GPU memory for KV (%.4g GiB)' at graph 0.02, first %.17g offset 0,0.7\n",
                p->hline / 1073741824.0, p->hline / 1073741824.0);
    }
    fputs("plot ", f);
    for (int s = 0; s < p->n_series; s++) {
        fprintf(f, "%s'-' using 1:2 with linespoints lw 2 pt %d lc rgb '%s' title ", s ? ", " : "", 5 + s,
                colors[(size_t)s % N_COLORS]);
        kvs_plot_gp_string(f, p->labels[s]);
    }
    fputc('\n', f);
    for (int s = 0; s < p->n_series; s++) {
        put_comment(f, p->labels[s]);
        for (int i = 0; i < p->n_x; i++) {
            double y = p->y[(size_t)s * (size_t)p->n_x + (size_t)i];
            if (isfinite(y)) fprintf(f, "%.17g %.17g\n", p->x[i], y / 1073741824.0);
        }
        fputs("e\n", f);
    }
}

/* Tokens/s against the batch: a line per series over the batches it was timed at (a series without a value at a
 * batch of another's is left out there). */
static void write_throughput(FILE *f, const kvs_plot_plan *p) {
    fprintf(f, "set xlabel 'batch (sequences decoded together)'\nset ylabel 'decode tokens/s (batch / time per output "
               "token)'\nset logscale x 2\nset logscale y\nset key top left\nset grid\n");
    fputs("plot ", f);
    for (int s = 0; s < p->n_series; s++) {
        fprintf(f, "%s'-' using 1:2 with linespoints lw 2 pt %d lc rgb '%s' title ", s ? ", " : "", 5 + s,
                colors[(size_t)s % N_COLORS]);
        kvs_plot_gp_string(f, p->labels[s]);
    }
    fputc('\n', f);
    for (int s = 0; s < p->n_series; s++) {
        put_comment(f, p->labels[s]);
        for (int i = 0; i < p->n_x; i++) {
            double y = p->y[(size_t)s * (size_t)p->n_x + (size_t)i];
            if (isfinite(y) && y > 0 && p->x[i] > 0) fprintf(f, "%.17g %.17g\n", p->x[i], y);
        }
        fputs("e\n", f);
    }
}

static void write_max_batch(FILE *f, const kvs_plot_plan *p) {
    fprintf(f, "set xlabel 'context + response (tokens)'\nset ylabel 'max batch (sequences that fit)'\n"
               "set logscale y\nset key top right\nset grid ytics\n"
               "set style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
               "set boxwidth 0.9\nset yrange [0.5:*]\n");
    fputs("plot ", f);
    for (int s = 0; s < p->n_series; s++) {
        fprintf(f, "%s'-' using 2:xtic(1) lc rgb '%s' title ", s ? ", " : "", colors[(size_t)s % N_COLORS]);
        kvs_plot_gp_string(f, p->labels[s]);
    }
    fputc('\n', f);
    /* gnuplot reads one inline block per plot element: each series' block carries the categories too. A bar of a
     * setting where nothing fits (0) or without a value is left out of the log axis ('?' = missing). */
    for (int s = 0; s < p->n_series; s++) {
        put_comment(f, p->labels[s]);
        for (int i = 0; i < p->n_x; i++) {
            double y = p->y[(size_t)s * (size_t)p->n_x + (size_t)i];
            /* a category is a double-quoted data field (single quotes are not quotes in gnuplot data) */
            fputc('"', f);
            for (const char *c = p->x_labels[i]; *c; c++) fputc(*c == '"' || *c == '\n' ? ' ' : *c, f);
            fputc('"', f);
            if (isfinite(y) && y > 0) fprintf(f, " %.17g\n", y);
            else fputs(" ?\n", f);
        }
        fputs("e\n", f);
    }
}

static void write_script(FILE *f, const void *ctx, const char *image_path) {
    const kvs_plot_plan *p = ((const void *const *)ctx)[0];
    const int is_svg = *(const int *)((const void *const *)ctx)[1];
    int height = 540 + 20 * (p->n_series > 4 ? p->n_series - 4 : 0);
    if (is_svg) fprintf(f, "set terminal svg size 900,%d dynamic font 'sans,12'\n", height);
    else fprintf(f, "set terminal pngcairo size 900,%d font 'sans,11'\n", height);
    fputs("set output ", f);
    kvs_plot_gp_string(f, image_path);
    fputs("\nset title ", f);
    kvs_plot_gp_string(f, p->title ? p->title : "");
    fputc('\n', f);
    fputs("set datafile missing '?'\n", f);
    if (p->kind == KVS_PLOT_PLAN_MEMORY) write_memory(f, p);
    else if (p->kind == KVS_PLOT_PLAN_THROUGHPUT) write_throughput(f, p);
    else write_max_batch(f, p);
    fputs("unset output\nexit\n", f);
}

static kvs_status check(const kvs_plot_plan *p) {
    if (!p || p->n_series < 1 || p->n_x < 1 || !p->labels || !p->y ||
        (p->kind == KVS_PLOT_PLAN_MAX_BATCH ? !p->x_labels : !p->x))
        return kvs_fail(KVS_ERR_INVALID_ARG, "plan plot: nothing to draw (no series or no points)");
    for (int s = 0; s < p->n_series; s++)
        if (!p->labels[s]) return kvs_fail(KVS_ERR_INVALID_ARG, "plan plot: series %d has no label", s);
    return KVS_OK;
}

kvs_status kvs_plot_plan_write_script(const kvs_plot_plan *p, int is_svg, const char *image_path, FILE *f) {
    kvs_status st = check(p);
    if (st != KVS_OK) return st;
    if (!image_path || !f) return kvs_fail(KVS_ERR_INVALID_ARG, "plan plot: NULL image path or stream");
    const void *ctx[2] = {p, &is_svg};
    write_script(f, ctx, image_path);
    if (fflush(f) != 0 || ferror(f))
        return kvs_fail(KVS_ERR_IO, "plan plot: writing the gnuplot script failed: %s", strerror(errno));
    return KVS_OK;
}

kvs_status kvs_plot_plan_render(const kvs_plot_plan *p) {
    kvs_status st = check(p);
    if (st != KVS_OK) return st;
    int is_svg = 0;
    if (!p->out_path) return kvs_fail(KVS_ERR_INVALID_ARG, "plan plot: no output path");
    if ((st = kvs_plot_image_format(p->out_path, p->format, &is_svg)) != KVS_OK) return st;
    const void *ctx[2] = {p, &is_svg};
    return kvs_plot_gnuplot_render(p->gnuplot, p->out_path, is_svg, write_script, ctx);
}
