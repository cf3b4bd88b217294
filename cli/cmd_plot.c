/* cmd_plot.c — `kvsim plot DB --kind KIND --out FILE.png|FILE.svg [...]`: draws a plot from a results
 * database through gnuplot (plots/plot.h; ../shared/DESIGN.md "Results (SQLite) and plots").
 * Exit codes per cli.h: 0 drawn, 1 database/gnuplot/output failure, 2 bad usage.
 */
#include <stdio.h>
#include <string.h>

#include "../plots/plot.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim plot DB --kind KIND --out FILE.png|FILE.svg [--metric M] [--layer L] [--policy NAME]\n"
            "                     [--budget TOKENS]\n"
            "Draws complete runs of the results database DB with gnuplot (PNG or SVG by the --out extension).\n"
            "  --kind error-vs-budget    x: budget_tokens (log2), y: --metric (default out_err_mean), run-wide\n"
            "                            aggregate or --layer L; one line per policy+params, oracles dashed\n"
            "  --kind error-vs-position  x: position, y: --metric averaged over query heads (and layers unless\n"
            "                            --layer); one line per run, selected by --policy / --budget\n"
            "  --kind memory-vs-budget   x: budget_tokens (log2), y: storage_bytes_max (bytes per KV head)\n"
            "  --metric   out_err_mean | out_err_p50 | out_err_p95 | out_err_max | attn_recall_mean |\n"
            "             topk_overlap_mean (error-vs-position: out_err_mean, attn_recall_mean, topk_overlap_mean)\n"
            "  --layer L  one layer's aggregates instead of the run-wide ones\n"
            "  --policy   only runs of this policy\n"
            "  --budget   error-vs-position only: only runs with this budget (tokens per KV head)\n");
}

/* "--opt VALUE" or "--opt=VALUE": returns the value (advancing *i) or NULL when `arg` is not `opt`. */
static const char *opt_value(const char *opt, int argc, char **argv, int *i, int *missing) {
    size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n) != 0) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

int kvs_cmd_plot(int argc, char **argv) {
    const char *db = NULL, *kind_s = NULL, *layer_s = NULL, *budget_s = NULL;
    kvs_plot_options o = {.kind = KVS_PLOT_ERROR_VS_BUDGET, .layer = -1, .budget_tokens = -1};
    for (int i = 1; i < argc; i++) {
        const char *v;
        int missing = 0;
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        } else if ((v = opt_value("--kind", argc, argv, &i, &missing))) kind_s = v;
        else if ((v = opt_value("--out", argc, argv, &i, &missing))) o.out_path = v;
        else if ((v = opt_value("--metric", argc, argv, &i, &missing))) o.metric = v;
        else if ((v = opt_value("--layer", argc, argv, &i, &missing))) layer_s = v;
        else if ((v = opt_value("--policy", argc, argv, &i, &missing))) o.policy = v;
        else if ((v = opt_value("--budget", argc, argv, &i, &missing))) budget_s = v;
        else if (missing) return kvs_cli_usage_error("plot", "option %s needs a value", argv[i]);
        else if (argv[i][0] == '-' && argv[i][1]) return kvs_cli_usage_error("plot", "unknown option '%s'", argv[i]);
        else if (!db) db = argv[i];
        else return kvs_cli_usage_error("plot", "unexpected argument '%s'", argv[i]);
    }
    if (!db) return kvs_cli_usage_error("plot", "missing the results database DB");
    if (!kind_s) return kvs_cli_usage_error("plot", "missing --kind (error-vs-budget, error-vs-position, memory-vs-budget)");
    if (!o.out_path) return kvs_cli_usage_error("plot", "missing --out FILE.png|FILE.svg");
    kvs_status st = kvs_plot_kind_parse(kind_s, &o.kind);
    if (st != KVS_OK) return kvs_cli_fail("plot", st);
    if (layer_s) {
        long l;
        if ((st = kvs_cli_parse_long("--layer", layer_s, 0, 1 << 20, &l)) != KVS_OK) return kvs_cli_fail("plot", st);
        o.layer = (int32_t)l;
    }
    if (budget_s) {
        long b;
        if (o.kind != KVS_PLOT_ERROR_VS_POSITION)
            return kvs_cli_usage_error("plot", "--budget applies to --kind error-vs-position only");
        if ((st = kvs_cli_parse_long("--budget", budget_s, 1, 1L << 40, &b)) != KVS_OK) return kvs_cli_fail("plot", st);
        o.budget_tokens = b;
    }
    if (o.kind != KVS_PLOT_MEMORY_VS_BUDGET || o.metric) {
        st = kvs_plot_metric_check(o.kind, o.metric ? o.metric : "out_err_mean");
        if (st != KVS_OK) return kvs_cli_fail("plot", st);
    }
    st = kvs_plot_make(db, &o);
    if (st != KVS_OK) return kvs_cli_fail("plot", st);
    printf("wrote %s\n", o.out_path);
    return KVS_EXIT_OK;
}
