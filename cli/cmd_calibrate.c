/* cmd_calibrate.c — `kvsim calibrate DB`: can offline replay rank policies as closed-loop decoding does?
 * (../shared/DESIGN.md "Closed-loop decoding (calibration of the replay)"). Pairs every teacher-forced
 * closed-loop run on a trace (results/results_closed.h) with the replay run (results/results.h, --measure decode) of the
 * same trace, policy, parameters and budget, and per trace gives the Spearman rank correlation of each offline
 * metric (output error mean / p95, attention recall) with each closed-loop metric (mean KL, top-1 agreement,
 * Δ perplexity), with percentile bootstrap intervals over the pairs (common/kvs_stats.h kvs_spearman).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_rng.h"
#include "../common/kvs_stats.h"
#include "../plots/plot.h"
#include "../results/results_closed.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim calibrate DB [--bootstrap N] [--seed S] [--plot F.png]\n"
            "For each trace with both replay runs (kvsim replay, --measure decode) and teacher-forced closed-loop\n"
            "runs (kvsim generate --trace) of the same (policy, parameters, budget): the pairs, then the Spearman\n"
            "rank correlation of every offline metric (out_err mean, out_err p95, attention recall) with every\n"
            "closed-loop metric (mean KL(full||policy), top-1 agreement, delta perplexity = ppl_policy - ppl_full)\n"
            "with a 95%% percentile bootstrap interval over the pairs, and the pairs whose offline and closed-loop\n"
            "ranks (by out_err mean and by mean KL) disagree most. A trace needs at least 3 pairs.\n"
            "  --bootstrap N   resamples (default 1000; 0 = no intervals)\n"
            "  --seed S        bootstrap seed (default 1)\n"
            "  --plot F.png    (or F.svg) scatter of out_err mean (offline) against mean KL (closed loop), log-log, per trace\n");
}

/* One trace: the same content hash when both runs recorded one (any path spelling), else the same traces row. */
static int same_trace(const char *sha_a, int64_t id_a, const char *sha_b, int64_t id_b) {
    if (sha_a && sha_b) return !strcmp(sha_a, sha_b);
    return id_a == id_b;
}

typedef struct {
    const kvs_results_closed_row *c;
    const kvs_results_run_row *r;
} pair;

enum { N_X = 3, N_Y = 3 };
static const char *const x_names[N_X] = {"out_err_mean", "out_err_p95", "attn_recall"};
static const char *const y_names[N_Y] = {"kl_mean", "top1_agree", "delta_ppl"};

static double x_of(const pair *p, int k) {
    const kvs_results_agg *a = &p->r->agg;
    return k == 0 ? a->out_err.mean : k == 1 ? a->out_err.p95 : a->attn_recall.mean;
}

static double y_of(const pair *p, int k) {
    return k == 0 ? p->c->kl_mean : k == 1 ? p->c->top1_agree : p->c->ppl_policy - p->c->ppl_full;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Spearman of (x, y) and its percentile bootstrap interval; resamples with a constant side are skipped. */
static kvs_status spearman_ci(const double *x, const double *y, size_t n, int boot, uint64_t seed, double *rho,
                              double *lo, double *hi) {
    kvs_status st = kvs_spearman(x, y, n, rho);
    if (st != KVS_OK) *rho = NAN;
    *lo = *hi = NAN;
    if (boot <= 0) return KVS_OK;
    double *bx = malloc(n * sizeof *bx), *by = malloc(n * sizeof *by), *r = malloc((size_t)boot * sizeof *r);
    if (!bx || !by || !r) {
        free(bx);
        free(by);
        free(r);
        return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    }
    kvs_rng g;
    kvs_rng_seed(&g, seed, 54);
    int m = 0;
    for (int b = 0; b < boot; b++) {
        for (size_t i = 0; i < n; i++) {
            size_t j = (size_t)(kvs_rng_open01(&g) * (double)n);
            if (j >= n) j = n - 1;
            bx[i] = x[j];
            by[i] = y[j];
        }
        double v;
        if (kvs_spearman(bx, by, n, &v) == KVS_OK && isfinite(v)) r[m++] = v;
    }
    if (m > 0) {
        qsort(r, (size_t)m, sizeof *r, cmp_double);
        *lo = r[(size_t)floor(0.025 * (m - 1))];
        *hi = r[(size_t)ceil(0.975 * (m - 1))];
    }
    free(bx);
    free(by);
    free(r);
    return KVS_OK;
}

/* The scatter's data: the pairs grouped by trace (group gi ends at group_end[gi]). */
typedef struct {
    const pair *pairs;
    const size_t *group_end;
    int n_groups, is_svg;
} scatter;

static void scatter_script(FILE *f, const void *ctx, const char *image_path) {
    const scatter *sc = ctx;
    if (sc->is_svg) fputs("set terminal svg size 900,650 dynamic\n", f);
    else fputs("set terminal pngcairo size 900,650\n", f);
    fputs("set output ", f);
    kvs_plot_gp_string(f, image_path);
    fputs("\nset logscale xy\nset key outside bottom center horizontal\n"
          "set xlabel 'offline: replay output error (mean)'\nset ylabel 'closed loop: mean KL(full || policy), nats'\n"
          "set grid\nset title 'offline replay vs closed-loop decoding'\nplot ",
          f);
    size_t b = 0;
    for (int gi = 0; gi < sc->n_groups; gi++) {
        fprintf(f, "%s'-' using 1:2 with points pt 7 title ", gi ? ", " : "");
        kvs_plot_gp_string(f, sc->pairs[b].c->model ? sc->pairs[b].c->model : "trace");
        fputs(", '-' using 1:2:3 with labels offset 0.6,0.6 font ',7' notitle", f);
        b = sc->group_end[gi];
    }
    fprintf(f, "\n");
    b = 0;
    for (int gi = 0; gi < sc->n_groups; gi++) {
        for (int rep = 0; rep < 2; rep++) {
            for (size_t i = b; i < sc->group_end[gi]; i++) {
                const pair *q = &sc->pairs[i];
                double x = x_of(q, 0), y = y_of(q, 0);
                if (!(x > 0) || !(y > 0)) continue; /* log axes: full-cache points sit at 0 */
                if (rep == 0) fprintf(f, "%.9g %.9g\n", x, y);
                else fprintf(f, "%.9g %.9g \"%s:%lld\"\n", x, y, q->c->policy, (long long)q->c->budget_tokens);
            }
            fprintf(f, "e\n");
        }
        b = sc->group_end[gi];
    }
    fputs("unset output\n", f);
}

/* The gnuplot scatter, drawn and delivered like every kvsim plot (plots/plot.h: atomic output, PNG or SVG by the
 * name, nothing left on failure). */
static kvs_status plot_scatter(const char *path, int is_svg, const pair *pairs, const size_t *group_end, int n_groups) {
    scatter sc = {.pairs = pairs, .group_end = group_end, .n_groups = n_groups, .is_svg = is_svg};
    return kvs_plot_gnuplot_render(NULL, path, is_svg, scatter_script, &sc);
}

int kvs_cmd_calibrate(int argc, char **argv) {
    const char *db_path = NULL, *plot_path = NULL, *boot_s = NULL, *seed_s = NULL;
    for (int i = 1; i < argc; i++) {
        int m = 0, r;
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        }
        if ((r = kvs_cli_single_value("calibrate", "--bootstrap", argc, argv, &i, &m, &boot_s)) ||
            (!m && (r = kvs_cli_single_value("calibrate", "--seed", argc, argv, &i, &m, &seed_s))) ||
            (!m && (r = kvs_cli_single_value("calibrate", "--plot", argc, argv, &i, &m, &plot_path)))) {
            if (r < 0) return KVS_EXIT_USAGE;
            continue;
        }
        if (m) return kvs_cli_usage_error("calibrate", "option %s needs a value", argv[i]);
        if (argv[i][0] == '-' && argv[i][1]) return kvs_cli_usage_error("calibrate", "unknown option '%s'", argv[i]);
        if (db_path) return kvs_cli_usage_error("calibrate", "unexpected argument '%s'", argv[i]);
        db_path = argv[i];
    }
    if (!db_path) return kvs_cli_usage_error("calibrate", "missing DB");
    long boot = 1000, seed = 1;
    if (boot_s && kvs_cli_parse_long("--bootstrap", boot_s, 0, 1000000, &boot) != KVS_OK)
        return kvs_cli_fail("calibrate", KVS_ERR_INVALID_ARG);
    if (seed_s && kvs_cli_parse_long("--seed", seed_s, 0, 1L << 62, &seed) != KVS_OK)
        return kvs_cli_fail("calibrate", KVS_ERR_INVALID_ARG);
    int plot_svg = 0; /* the image format by the name, as kvsim plot decides it: checked before any work */
    if (plot_path && kvs_plot_image_format(plot_path, NULL, &plot_svg) != KVS_OK)
        return kvs_cli_usage_error("calibrate", "--plot: '%s' must end in .png or .svg (or be -, a FIFO or a device)",
                                   plot_path);

    kvs_results_db *db = NULL;
    kvs_results_closed_row *cl = NULL;
    kvs_results_run_row *runs = NULL;
    int64_t n_cl = 0, n_runs = 0;
    pair *pairs = NULL;
    size_t *group_end = NULL, n_pairs = 0;
    double *xs = NULL, *ys = NULL;
    int n_groups = 0, reported = 0;
    kvs_status st = kvs_results_open_readonly(db_path, &db);
    if (st != KVS_OK) goto cleanup;
    KVS_TRY(st = kvs_results_closed_query(db, &cl, &n_cl));
    kvs_results_filter f = {.measure = "decode"};
    KVS_TRY(st = kvs_results_query_runs(db, &f, &runs, &n_runs));
    pairs = calloc((size_t)n_cl + 1, sizeof *pairs);
    group_end = calloc((size_t)n_cl + 1, sizeof *group_end);
    xs = calloc((size_t)n_cl + 1, sizeof *xs);
    ys = calloc((size_t)n_cl + 1, sizeof *ys);
    if (!pairs || !group_end || !xs || !ys) {
        st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    /* Pairs grouped by trace, in order of first appearance; the latest replay run of a configuration wins. A
     * trace is its content hash where recorded, so a replay and a closed-loop run of one file named by two paths
     * pair (and two files that share a name do not). */
    for (int64_t i = 0; i < n_cl; i++) {
        if (cl[i].trace_id <= 0 || strcmp(cl[i].mode, "teacher") != 0) continue;
        int seen = 0;
        for (int64_t k = 0; k < i && !seen; k++)
            seen = cl[k].trace_id > 0 && !strcmp(cl[k].mode, "teacher") &&
                   same_trace(cl[k].trace_sha256, cl[k].trace_id, cl[i].trace_sha256, cl[i].trace_id);
        if (seen) continue;
        for (int64_t j = i; j < n_cl; j++) {
            const kvs_results_closed_row *c = &cl[j];
            if (c->trace_id <= 0 || strcmp(c->mode, "teacher") != 0 ||
                !same_trace(c->trace_sha256, c->trace_id, cl[i].trace_sha256, cl[i].trace_id))
                continue;
            const kvs_results_run_row *best = NULL;
            for (int64_t r = 0; r < n_runs; r++)
                if (same_trace(runs[r].trace_sha256, runs[r].trace_id, c->trace_sha256, c->trace_id) &&
                    runs[r].has_agg && runs[r].budget_tokens == c->budget_tokens &&
                    !strcmp(runs[r].policy, c->policy) && !strcmp(runs[r].params, c->params))
                    best = &runs[r];
            int dup = 0; /* a configuration generated twice: the latest closed-loop run */
            for (size_t q = n_groups ? group_end[n_groups - 1] : 0; q < n_pairs; q++)
                if (pairs[q].c->budget_tokens == c->budget_tokens && !strcmp(pairs[q].c->policy, c->policy) &&
                    !strcmp(pairs[q].c->params, c->params)) {
                    pairs[q].c = c;
                    pairs[q].r = best ? best : pairs[q].r;
                    dup = 1;
                }
            if (!dup && best) pairs[n_pairs++] = (pair){c, best};
        }
        group_end[n_groups++] = n_pairs;
    }
    size_t b = 0;
    for (int gi = 0; gi < n_groups; b = group_end[gi], gi++) {
        size_t n = group_end[gi] - b;
        if (n == 0) continue;
        const pair *p = pairs + b;
        char label[160];
        kvs_results_trace_label(p[0].r, label, sizeof label);
        printf("trace %s (%s; model %s, prompt %lld tokens): %zu (policy, budget) pairs\n", label, p[0].r->trace_path,
               p[0].c->model, (long long)p[0].c->prompt_len, n);
        printf("  %-14s %6s %10s %10s %8s %10s %8s %10s %7s %7s\n", "policy", "budget", "err_mean", "err_p95",
               "recall", "kl_mean", "top1", "dppl", "rk_off", "rk_cl");
        double *rx = malloc(n * sizeof *rx), *ry = malloc(n * sizeof *ry);
        if (!rx || !ry) {
            free(rx);
            free(ry);
            st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        for (size_t i = 0; i < n; i++) {
            xs[i] = x_of(&p[i], 0);
            ys[i] = y_of(&p[i], 0);
        }
        kvs_ranks(xs, n, rx);
        kvs_ranks(ys, n, ry);
        for (size_t i = 0; i < n; i++)
            printf("  %-14s %6lld %10.4g %10.4g %8.4f %10.4g %8.4f %10.4g %7.1f %7.1f\n", p[i].c->policy,
                   (long long)p[i].c->budget_tokens, x_of(&p[i], 0), x_of(&p[i], 1), x_of(&p[i], 2), y_of(&p[i], 0),
                   y_of(&p[i], 1), y_of(&p[i], 2), rx[i], ry[i]);
        if (n < 3) {
            printf("  (fewer than 3 pairs: no correlation)\n");
        } else {
            if (boot > 0) printf("  Spearman rho [95%% bootstrap interval, %ld resamples] (offline x closed loop)\n", boot);
            else printf("  Spearman rho (offline x closed loop; --bootstrap 0: no interval)\n");
            int undefined = 0, no_interval = 0;
            printf("  %-14s", "");
            for (int k = 0; k < N_Y; k++) printf(" %28s", y_names[k]);
            printf("\n");
            for (int xk = 0; xk < N_X; xk++) {
                printf("  %-14s", x_names[xk]);
                for (int yk = 0; yk < N_Y; yk++) {
                    for (size_t i = 0; i < n; i++) {
                        xs[i] = x_of(&p[i], xk);
                        ys[i] = y_of(&p[i], yk);
                    }
                    double rho, lo, hi;
                    if ((st = spearman_ci(xs, ys, n, (int)boot, (uint64_t)seed, &rho, &lo, &hi)) != KVS_OK) {
                        free(rx);
                        free(ry);
                        goto cleanup;
                    }
                    /* Spearman is undefined when one side is constant over the pairs (e.g. only `full`, whose
                     * errors are all 0): say so rather than print nan; the same for an interval no resample gave */
                    char cell[64];
                    if (isnan(rho)) {
                        snprintf(cell, sizeof cell, "undefined (constant)");
                        undefined++;
                    } else if (boot <= 0) {
                        snprintf(cell, sizeof cell, "%+.3f", rho);
                    } else if (isnan(lo) || isnan(hi)) {
                        snprintf(cell, sizeof cell, "%+.3f [no interval]", rho);
                        no_interval++;
                    } else {
                        snprintf(cell, sizeof cell, "%+.3f [%+.2f, %+.2f]", rho, lo, hi);
                    }
                    printf(" %28s", cell);
                }
                printf("\n");
            }
            if (undefined)
                printf("  undefined: one side of the pair is the same for every (policy, budget), so it has no "
                       "ranking to correlate\n");
            if (no_interval)
                printf("  no interval: every bootstrap resample had a constant side\n");
            printf("  largest rank disagreements (out_err_mean rank vs kl_mean rank, 1 = smallest):\n");
            int shown = 0;
            for (; shown < 5; shown++) {
                size_t worst = n;
                double wd = 0.5;
                for (size_t i = 0; i < n; i++)
                    if (fabs(rx[i] - ry[i]) > wd) {
                        wd = fabs(rx[i] - ry[i]);
                        worst = i;
                    }
                if (worst == n) break;
                printf("    %s budget %lld: offline rank %.1f, closed-loop rank %.1f (%s)\n", p[worst].c->policy,
                       (long long)p[worst].c->budget_tokens, rx[worst], ry[worst], p[worst].c->budget_scope ? p[worst].c->budget_scope : "");
                rx[worst] = ry[worst]; /* shown */
            }
            if (!shown) printf("    (none: the two rankings agree)\n");
        }
        free(rx);
        free(ry);
        reported++;
    }
    if (!reported) {
        st = kvs_fail(KVS_ERR_STATE, "%s: no (policy, budget) has both a replay run and a teacher-forced closed-loop "
                      "run on the same trace (kvsim replay TRACE ... and kvsim generate --trace TRACE ...)", db_path);
        goto cleanup;
    }
    if (plot_path) KVS_TRY(st = plot_scatter(plot_path, plot_svg, pairs, group_end, n_groups));
    st = KVS_OK;
cleanup:
    kvs_results_closed_rows_free(cl, n_cl);
    kvs_results_run_rows_free(runs, n_runs);
    kvs_results_close(db);
    free(pairs);
    free(group_end);
    free(xs);
    free(ys);
    if (st != KVS_OK) return kvs_cli_fail("calibrate", st);
    return kvs_cli_finish_stdout("calibrate");
}
