/* cmd_calibrate.c — `kvsim calibrate DB`: can offline replay rank policies as closed-loop decoding does?
 * (../shared/DESIGN.md "Closed-loop decoding (calibration of the replay)"). Prints what results/calibrate.h computes:
 * the pairs per trace and the duplicates collapsed, then per model the Spearman correlation of each offline metric
 * with each closed-loop one within each budget, at equal measured memory, and pooled over budgets, each the mean over
 * traces with a bootstrap interval over policies and traces.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_stats.h"
#include "../plots/plot.h"
#include "../results/calibrate.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim calibrate DB [--bootstrap N] [--seed S] [--pairs] [--plot F.png]\n"
            "Pairs every teacher-forced closed-loop run (kvsim generate --trace T) with the replay of T (kvsim replay,\n"
            "--measure decode) at the same (policy, parameters, budget); a trace is its content hash. Then, per model,\n"
            "the Spearman rank correlation of every offline metric (out_err mean, out_err p95, attention recall) with\n"
            "every closed-loop one (mean KL(full||policy), top-1 agreement, delta perplexity = ppl_policy - ppl_full):\n"
            "  within each budget    the configurations at that nominal budget, the full cache left out (it is at no\n"
            "                        budget, and its 0 error and 0 KL agree by construction);\n"
            "  at equal memory       the configurations whose replay measured a mean resident size (storage_bytes mean\n"
            "                        over the decode steps, bytes per KV head) in one power-of-two bin 2^k..2^(k+1)-1,\n"
            "                        whatever their budget, the full cache included;\n"
            "  pooled over budgets   every configuration but the full cache: mostly the budget axis (a larger budget\n"
            "                        is better on both sides), kept for comparison.\n"
            "Duplicates count once: in a trace, a configuration whose offline numbers (every statistic of the quality\n"
            "and token metrics of the run aggregate, and the out_err series where both runs stored one) equal an\n"
            "earlier one's is that configuration (MorphKV whose recent window fills its budget, the SnapKV family\n"
            "within its observation window, full at every budget); what was collapsed into what is listed. A note (N)\n"
            "collapses exactly when the numbers say the configuration became another; otherwise it counts as itself.\n"
            "Several texts: rho is computed per trace (ranks compare configurations on one text, so the texts'\n"
            "different difficulty never enters it, as the budget axis enters the pooled figure) and averaged over the\n"
            "traces with at least 3 distinct configurations, each text weighing the same; n says how many. The 95%%\n"
            "interval is a percentile bootstrap over both levels: each resample draws the policies with replacement\n"
            "(all of a policy's configurations together, on every trace) and the traces with replacement, and\n"
            "averages the drawn traces' rho over the drawn policies (one policy: no interval). Seeded by what is\n"
            "compared (the configurations and trace hashes of the selection): the same database, the same intervals.\n"
            "  --bootstrap N   resamples (default %d; 0 = no intervals)\n"
            "  --seed S        an extra seed mixed into the identity seed (default 0: the identity alone)\n"
            "  --pairs         also list every pair per trace with its within-budget ranks and what it collapsed into\n"
            "  --plot F.png    (or F.svg) scatter of out_err mean (offline) against mean KL (closed loop), log-log,\n"
            "                  one colour per model, distinct configurations only\n",
            KVS_BOOTSTRAP_REPS);
}

#define CELL_W 28

/* ---- per-trace listing (--pairs) ---------------------------------------------------------------------- */

static kvs_status print_pairs(const kvs_calibration *c, size_t ti) {
    const kvs_calibration_trace *t = kvs_calibration_trace_at(c, ti);
    printf("  %-14s %6s %10s %10s %8s %10s %8s %10s %9s %6s %6s  %s\n", "policy", "budget", "err_mean", "err_p95",
           "recall", "kl_mean", "top1", "dppl", "bytes", "rk_off", "rk_cl", "counted as");
    size_t n = t->n;
    double *x = malloc((n + 1) * sizeof *x), *y = malloc((n + 1) * sizeof *y), *rx = malloc((n + 1) * sizeof *rx),
           *ry = malloc((n + 1) * sizeof *ry);
    size_t *idx = malloc((n + 1) * sizeof *idx);
    double *ax = malloc((n + 1) * sizeof *ax), *ay = malloc((n + 1) * sizeof *ay);
    kvs_status st = KVS_OK;
    if (!x || !y || !rx || !ry || !idx || !ax || !ay) {
        st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    for (size_t i = 0; i < n; i++) rx[i] = ry[i] = NAN;
    /* ranks within (trace, budget) over the distinct configurations at a budget, by out_err mean and by mean KL */
    for (size_t i = 0; i < n; i++) {
        const kvs_calibration_pair *p = kvs_calibration_pair_at(c, t->first + i);
        size_t m = 0;
        int done = 0;
        for (size_t j = 0; j < i && !done; j++) done = kvs_calibration_pair_at(c, t->first + j)->c->budget_tokens ==
                                                      p->c->budget_tokens;
        if (done) continue;
        for (size_t j = i; j < n; j++) {
            const kvs_calibration_pair *q = kvs_calibration_pair_at(c, t->first + j);
            if (q->c->budget_tokens != p->c->budget_tokens || q->full_cache || q->rep != t->first + j ||
                !isfinite(q->x[0]) || !isfinite(q->y[0]))
                continue;
            x[m] = q->x[0];
            y[m] = q->y[0];
            idx[m++] = j;
        }
        KVS_TRY(st = kvs_ranks(x, m, ax));
        KVS_TRY(st = kvs_ranks(y, m, ay));
        for (size_t k = 0; k < m; k++) {
            rx[idx[k]] = ax[k];
            ry[idx[k]] = ay[k];
        }
    }
    for (size_t i = 0; i < n; i++) {
        const kvs_calibration_pair *p = kvs_calibration_pair_at(c, t->first + i);
        char as[96] = "itself";
        if (p->full_cache && p->rep == t->first + i) snprintf(as, sizeof as, "full cache (not ranked at a budget)");
        else if (p->rep != t->first + i) {
            const kvs_calibration_pair *r = kvs_calibration_pair_at(c, p->rep);
            snprintf(as, sizeof as, "= %s@%lld", r->c->policy, (long long)r->c->budget_tokens);
        }
        char rk[2][16] = {"-", "-"};
        if (isfinite(rx[i])) {
            snprintf(rk[0], sizeof rk[0], "%.1f", rx[i]);
            snprintf(rk[1], sizeof rk[1], "%.1f", ry[i]);
        }
        printf("  %-14s %6lld %10.4g %10.4g %8.4f %10.4g %8.4f %10.4g %9.0f %6s %6s  %s%s\n", p->c->policy,
               (long long)p->c->budget_tokens, p->x[0], p->x[1], p->x[2], p->y[0], p->y[1], p->y[2],
               p->r->agg.storage_bytes.mean, rk[0], rk[1], as, p->noted ? " (N)" : "");
    }
    /* the largest within-budget rank disagreements */
    int shown = 0;
    for (; shown < 5; shown++) {
        size_t worst = n;
        double wd = 0.5;
        for (size_t i = 0; i < n; i++)
            if (isfinite(rx[i]) && fabs(rx[i] - ry[i]) > wd) {
                wd = fabs(rx[i] - ry[i]);
                worst = i;
            }
        if (worst == n) break;
        if (!shown) printf("  largest within-budget rank disagreements (out_err_mean vs kl_mean, 1 = smallest):\n");
        const kvs_calibration_pair *p = kvs_calibration_pair_at(c, t->first + worst);
        printf("    %s budget %lld: offline rank %.1f, closed-loop rank %.1f\n", p->c->policy,
               (long long)p->c->budget_tokens, rx[worst], ry[worst]);
        rx[worst] = ry[worst]; /* shown */
    }
cleanup:
    free(x);
    free(y);
    free(rx);
    free(ry);
    free(idx);
    free(ax);
    free(ay);
    return st;
}

/* ---- collapsed classes of one model --------------------------------------------------------------------- */

/* One class's description: "snapkv = pyramidkv = adakv at budget 8", "full at budgets 8 = 16 = 32", else
 * "a@8 = b@16". */
static void class_text(const kvs_calibration *c, size_t rep, char *buf, size_t cap) {
    const kvs_calibration_trace *t = kvs_calibration_trace_at(c, kvs_calibration_pair_at(c, rep)->trace);
    int one_budget = 1, one_policy = 1;
    const kvs_calibration_pair *r = kvs_calibration_pair_at(c, rep);
    for (size_t i = t->first; i < t->first + t->n; i++) {
        const kvs_calibration_pair *p = kvs_calibration_pair_at(c, i);
        if (p->rep != rep) continue;
        one_budget &= p->c->budget_tokens == r->c->budget_tokens;
        one_policy &= !strcmp(p->c->policy, r->c->policy) && !strcmp(p->c->params, r->c->params);
    }
    size_t len = 0;
    buf[0] = 0;
    if (one_policy) len += (size_t)snprintf(buf, cap, "%s at budgets ", r->c->policy);
    for (size_t i = t->first; i < t->first + t->n && len < cap; i++) {
        const kvs_calibration_pair *p = kvs_calibration_pair_at(c, i);
        if (p->rep != rep) continue;
        const char *sep = i == rep ? "" : " = ";
        if (one_policy) len += (size_t)snprintf(buf + len, cap - len, "%s%lld", sep, (long long)p->c->budget_tokens);
        else if (one_budget) len += (size_t)snprintf(buf + len, cap - len, "%s%s", sep, p->c->policy);
        else len += (size_t)snprintf(buf + len, cap - len, "%s%s@%lld", sep, p->c->policy, (long long)p->c->budget_tokens);
    }
    if (!one_policy && one_budget && len < cap)
        snprintf(buf + len, cap - len, " at budget %lld", (long long)r->c->budget_tokens);
}

static kvs_status print_collapsed(const kvs_calibration *c, const char *model) {
    size_t n = kvs_calibration_n_pairs(c), n_collapsed = 0, n_traces = 0, n_pairs = 0;
    for (size_t ti = 0; ti < kvs_calibration_n_traces(c); ti++) {
        const kvs_calibration_trace *t = kvs_calibration_trace_at(c, ti);
        if (strcmp(t->model, model) != 0) continue;
        n_traces++;
        n_pairs += t->n;
        n_collapsed += t->n - t->n_distinct;
    }
    char (*texts)[512] = calloc(n + 1, sizeof *texts);
    int *count = calloc(n + 1, sizeof *count), *noted = calloc(n + 1, sizeof *noted);
    size_t n_texts = 0, y_differ = 0;
    kvs_status st = KVS_OK;
    if (!texts || !count || !noted) {
        st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    printf("  duplicates: %zu of the %zu pairs collapsed into the configuration named first (identical offline numbers:\n"
           "  counted once):\n", n_collapsed, n_pairs);
    for (size_t i = 0; i < n; i++) {
        const kvs_calibration_pair *p = kvs_calibration_pair_at(c, i);
        const kvs_calibration_trace *t = kvs_calibration_trace_at(c, p->trace);
        if (strcmp(t->model, model) != 0 || p->rep != i) continue;
        int members = 0, any_noted = 0;
        for (size_t j = t->first; j < t->first + t->n; j++)
            if (kvs_calibration_pair_at(c, j)->rep == i) {
                members++;
                any_noted |= kvs_calibration_pair_at(c, j)->noted;
            }
        if (members < 2) continue;
        char text[512];
        class_text(c, i, text, sizeof text);
        size_t k = 0;
        while (k < n_texts && strcmp(texts[k], text) != 0) k++;
        if (k == n_texts) snprintf(texts[n_texts++], sizeof texts[0], "%s", text);
        count[k]++;
        noted[k] |= any_noted;
    }
    for (size_t k = 0; k < n_texts; k++)
        printf("    %s (on %d of %zu traces)%s\n", texts[k], count[k], n_traces, noted[k] ? ", N: the replay noted it" : "");
    if (!n_texts) printf("    (none)\n");
    /* noted configurations that are not another one: they count as themselves */
    n_texts = 0;
    for (size_t i = 0; i < n; i++) {
        const kvs_calibration_pair *p = kvs_calibration_pair_at(c, i);
        const kvs_calibration_trace *t = kvs_calibration_trace_at(c, p->trace);
        if (strcmp(t->model, model) != 0 || p->rep != i || !p->noted) continue;
        int members = 0;
        for (size_t j = t->first; j < t->first + t->n; j++) members += kvs_calibration_pair_at(c, j)->rep == i;
        if (members > 1) continue;
        char text[512];
        snprintf(text, sizeof text, "%s@%lld", p->c->policy, (long long)p->c->budget_tokens);
        size_t k = 0;
        while (k < n_texts && strcmp(texts[k], text) != 0) k++;
        if (k == n_texts) {
            snprintf(texts[n_texts++], sizeof texts[0], "%s", text);
            count[k] = 0;
        }
        count[k]++;
    }
    if (n_texts) {
        printf("  noted (N) but distinct, counted as themselves (on how many traces):");
        for (size_t k = 0; k < n_texts; k++) printf("%s %s (%d)", k ? "," : "", texts[k], count[k]);
        printf("\n");
    }
    for (size_t ti = 0; ti < kvs_calibration_n_traces(c); ti++) {
        const kvs_calibration_trace *t = kvs_calibration_trace_at(c, ti);
        if (!strcmp(t->model, model)) y_differ += t->n_y_differ;
    }
    if (y_differ)
        printf("  %zu collapsed pairs have closed-loop numbers that differ from their first's (the first's are used)\n",
               y_differ);
cleanup:
    free(texts);
    free(count);
    free(noted);
    return st;
}

/* ---- one selection's table ---------------------------------------------------------------------------------- */

static kvs_status print_sel(const kvs_calibration *c, const kvs_calibration_sel *s, const char *title, long boot,
                            uint64_t seed, int *undefined_seen) {
    kvs_calibration_corr r;
    kvs_status st = kvs_calibration_correlate(c, s, (int)boot, 0.95, seed, &r);
    if (st != KVS_OK) return st;
    printf("  %s: %zu pairs, %zu distinct configurations", title, r.n_pairs, r.n_units);
    if (r.n_traces == 0) {
        printf("\n    no trace has 3 distinct configurations here: no correlation\n");
        return KVS_OK;
    }
    if (r.units_min == r.units_max) printf("; n = %zu per trace", r.units_min);
    else printf("; n = %zu..%zu per trace", r.units_min, r.units_max);
    printf(" on %zu trace%s, %zu polic%s\n", r.n_traces, r.n_traces == 1 ? "" : "s", r.n_policies,
           r.n_policies == 1 ? "y" : "ies");
    if (boot > 0)
        printf("    Spearman rho, mean over traces [95%% interval: %ld resamples of policies x traces]\n", boot);
    else printf("    Spearman rho, mean over traces (--bootstrap 0: no interval)\n");
    printf("    %-14s", "");
    for (int k = 0; k < KVS_CALIB_NY; k++) printf(" %*s", CELL_W, kvs_calibration_y_names[k]);
    printf("\n");
    for (int a = 0; a < KVS_CALIB_NX; a++) {
        printf("    %-14s", kvs_calibration_x_names[a]);
        for (int b = 0; b < KVS_CALIB_NY; b++) {
            const kvs_interval *iv = &r.rho[a][b];
            char cell[64];
            if (iv->n == 0) {
                snprintf(cell, sizeof cell, "undefined (constant)");
                *undefined_seen = 1;
            } else if (boot <= 0) {
                snprintf(cell, sizeof cell, "%+.3f", iv->mean);
            } else if (r.n_policies < 2) {
                snprintf(cell, sizeof cell, "%+.3f (one policy)", iv->mean);
            } else if (isnan(iv->lo) || isnan(iv->hi)) {
                snprintf(cell, sizeof cell, "%+.3f (no interval)", iv->mean);
            } else {
                snprintf(cell, sizeof cell, "%+.3f [%+.2f, %+.2f]", iv->mean, iv->lo, iv->hi);
            }
            printf(" %*s", CELL_W, cell);
        }
        printf("\n");
    }
    if (boot > 0 && r.n_policies < 2)
        printf("    one policy: no interval (the bootstrap resamples policies; one cannot vary)\n");
    if (r.rho[0][0].n > 1)
        printf("    per trace, out_err_mean x kl_mean: %+.3f .. %+.3f over %zu traces\n", r.rho_min[0][0],
               r.rho_max[0][0], r.rho[0][0].n);
    return KVS_OK;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}
static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static void bytes_text(double v, char *buf, size_t cap) {
    if (v >= 1024 * 1024) snprintf(buf, cap, "%gMiB", v / (1024.0 * 1024.0));
    else if (v >= 1024) snprintf(buf, cap, "%gKiB", v / 1024.0);
    else snprintf(buf, cap, "%gB", v);
}

static kvs_status print_model(const kvs_calibration *c, const char *model, long boot, uint64_t seed, int list_pairs,
                              int *undefined_seen) {
    size_t n = kvs_calibration_n_pairs(c), nb = 0, nm = 0, n_traces = 0, n_pairs = 0, n_full = 0;
    int64_t *budgets = malloc((n + 1) * sizeof *budgets);
    int *bins = malloc((n + 1) * sizeof *bins);
    kvs_status st = KVS_OK;
    if (!budgets || !bins) {
        st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    for (size_t ti = 0; ti < kvs_calibration_n_traces(c); ti++)
        n_traces += !strcmp(kvs_calibration_trace_at(c, ti)->model, model);
    for (size_t i = 0; i < n; i++) {
        const kvs_calibration_pair *p = kvs_calibration_pair_at(c, i);
        if (strcmp(kvs_calibration_trace_at(c, p->trace)->model, model) != 0) continue;
        n_pairs++;
        if (p->full_cache) n_full++;
        size_t k = 0;
        while (!p->full_cache && k < nb && budgets[k] != p->c->budget_tokens) k++;
        if (!p->full_cache && k == nb) budgets[nb++] = p->c->budget_tokens;
        k = 0;
        while (p->mem_log2 != KVS_CALIB_NO_MEM && k < nm && bins[k] != p->mem_log2) k++;
        if (p->mem_log2 != KVS_CALIB_NO_MEM && k == nm) bins[nm++] = p->mem_log2;
    }
    qsort(budgets, nb, sizeof *budgets, cmp_i64);
    qsort(bins, nm, sizeof *bins, cmp_int);
    printf("\nmodel %s: %zu (policy, budget) pairs on %zu trace%s\n", model, n_pairs, n_traces, n_traces == 1 ? "" : "s");
    for (size_t ti = 0; ti < kvs_calibration_n_traces(c); ti++) {
        const kvs_calibration_trace *t = kvs_calibration_trace_at(c, ti);
        if (strcmp(t->model, model) != 0) continue;
        printf("trace %s (%s; model %s, prompt %lld tokens): %zu (policy, budget) pairs, %zu distinct\n", t->label,
               t->path, t->model, (long long)t->prompt_len, t->n, t->n_distinct);
        if (list_pairs) KVS_TRY(st = print_pairs(c, ti));
    }
    KVS_TRY(st = print_collapsed(c, model));
    printf("within each budget (nominal tokens per KV head; the full cache left out):\n");
    for (size_t k = 0; k < nb; k++) {
        char title[64];
        snprintf(title, sizeof title, "budget %lld", (long long)budgets[k]);
        kvs_calibration_sel s = {.model = model, .kind = KVS_CALIB_BUDGET, .budget = budgets[k]};
        KVS_TRY(st = print_sel(c, &s, title, boot, seed, undefined_seen));
    }
    if (!nb) printf("  (no configuration but the full cache)\n");
    printf("at equal measured memory (resident bytes per KV head, mean over the decode steps, in power-of-two bins;\n"
           "the full cache included):\n");
    for (size_t k = 0; k < nm; k++) {
        char title[96], lo[32], hi[32];
        bytes_text(ldexp(1.0, bins[k]), lo, sizeof lo);
        bytes_text(ldexp(1.0, bins[k] + 1), hi, sizeof hi);
        snprintf(title, sizeof title, "memory %s to <%s", lo, hi);
        kvs_calibration_sel s = {.model = model, .kind = KVS_CALIB_MEMORY, .mem_log2 = bins[k]};
        KVS_TRY(st = print_sel(c, &s, title, boot, seed, undefined_seen));
    }
    if (!nm) printf("  (no run recorded its resident bytes)\n");
    printf("pooled over budgets (mostly the budget axis):\n");
    if (!nb) {
        printf("  undefined (constant): the %zu pairs are all the full cache, whose error and KL are 0 by "
               "construction: no ranking to correlate\n", n_full);
        *undefined_seen = 1;
    } else {
        kvs_calibration_sel s = {.model = model, .kind = KVS_CALIB_POOLED};
        KVS_TRY(st = print_sel(c, &s, "all budgets", boot, seed, undefined_seen));
    }
cleanup:
    free(budgets);
    free(bins);
    return st;
}

/* ---- the scatter ---------------------------------------------------------------------------------------------- */

typedef struct {
    const kvs_calibration *c;
    const char **models;
    size_t n_models;
    int is_svg;
} scatter;

static int plotted(const kvs_calibration *c, size_t i, const char *model) {
    const kvs_calibration_pair *p = kvs_calibration_pair_at(c, i);
    return p->rep == i && !strcmp(kvs_calibration_trace_at(c, p->trace)->model, model) && p->x[0] > 0 && p->y[0] > 0;
}

static void scatter_script(FILE *f, const void *ctx, const char *image_path) {
    const scatter *sc = ctx;
    if (sc->is_svg) fputs("set terminal svg size 900,650 dynamic\n", f);
    else fputs("set terminal pngcairo size 900,650\n", f);
    fputs("set output ", f);
    kvs_plot_gp_string(f, image_path);
    fputs("\nset logscale xy\nset key outside bottom center horizontal\n"
          "set xlabel 'offline: replay output error (mean)'\nset ylabel 'closed loop: mean KL(full || policy), nats'\n"
          "set grid\nset title 'offline replay vs closed-loop decoding (distinct configurations)'\nplot ",
          f);
    size_t n = kvs_calibration_n_pairs(sc->c);
    for (size_t m = 0; m < sc->n_models; m++) {
        fprintf(f, "%s'-' using 1:2 with points pt 7 title ", m ? ", " : "");
        kvs_plot_gp_string(f, sc->models[m]);
    }
    fprintf(f, "\n");
    for (size_t m = 0; m < sc->n_models; m++) {
        for (size_t i = 0; i < n; i++)
            if (plotted(sc->c, i, sc->models[m])) {
                const kvs_calibration_pair *p = kvs_calibration_pair_at(sc->c, i);
                fprintf(f, "%.9g %.9g\n", p->x[0], p->y[0]);
            }
        fprintf(f, "e\n");
    }
    fputs("unset output\n", f);
}

int kvs_cmd_calibrate(int argc, char **argv) {
    const char *db_path = NULL, *plot_path = NULL, *boot_s = NULL, *seed_s = NULL;
    int list_pairs = 0;
    for (int i = 1; i < argc; i++) {
        int m = 0, r;
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        }
        if (!strcmp(argv[i], "--pairs")) {
            list_pairs = 1;
            continue;
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
    long boot = KVS_BOOTSTRAP_REPS, seed = 0;
    if (boot_s && kvs_cli_parse_long("--bootstrap", boot_s, 0, 1000000, &boot) != KVS_OK)
        return kvs_cli_fail("calibrate", KVS_ERR_INVALID_ARG);
    if (seed_s && kvs_cli_parse_long("--seed", seed_s, 0, 1L << 62, &seed) != KVS_OK)
        return kvs_cli_fail("calibrate", KVS_ERR_INVALID_ARG);
    int plot_svg = 0; /* the image format by the name, as kvsim plot decides it: checked before any work */
    if (plot_path && kvs_plot_image_format(plot_path, NULL, &plot_svg) != KVS_OK)
        return kvs_cli_usage_error("calibrate", "--plot: '%s' must end in .png or .svg (or be -, a FIFO or a device)",
                                   plot_path);

    kvs_results_db *db = NULL;
    kvs_calibration *c = NULL;
    const char **models = NULL;
    size_t n_models = 0;
    int undefined_seen = 0;
    kvs_status st = kvs_results_open_readonly(db_path, &db);
    if (st != KVS_OK) goto cleanup;
    KVS_TRY(st = kvs_calibration_create(db, &c));
    size_t n_traces = kvs_calibration_n_traces(c);
    models = calloc(n_traces + 1, sizeof *models);
    if (!models) {
        st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    for (size_t ti = 0; ti < n_traces; ti++) {
        const kvs_calibration_trace *t = kvs_calibration_trace_at(c, ti);
        size_t k = 0;
        while (k < n_models && strcmp(models[k], t->model) != 0) k++;
        if (k == n_models) models[n_models++] = t->model;
    }
    printf("calibrate %s: %zu (policy, budget) pairs on %zu trace%s of %zu model%s\n", db_path,
           kvs_calibration_n_pairs(c), n_traces, n_traces == 1 ? "" : "s", n_models, n_models == 1 ? "" : "s");
    for (size_t k = 0; k < n_models; k++)
        KVS_TRY(st = print_model(c, models[k], boot, (uint64_t)seed, list_pairs, &undefined_seen));
    if (undefined_seen)
        printf("\nundefined: one side is the same for every configuration, so it has no ranking to correlate\n");
    if (plot_path) {
        scatter sc = {.c = c, .models = models, .n_models = n_models, .is_svg = plot_svg};
        KVS_TRY(st = kvs_plot_gnuplot_render(NULL, plot_path, plot_svg, scatter_script, &sc));
    }
    st = KVS_OK;
cleanup:
    kvs_calibration_free(c);
    kvs_results_close(db);
    free(models);
    if (st != KVS_OK) return kvs_cli_fail("calibrate", st);
    return kvs_cli_finish_stdout("calibrate");
}
