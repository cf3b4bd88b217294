/* cmd_plot.c — `kvsim plot DB --kind KIND --out FILE.png|FILE.svg|- [...]`: draws a plot from a results
 * database through gnuplot (plots/plot.h; ../shared/DESIGN.md "Results (SQLite) and plots"; the cost
 * kinds follow POLICY_SPEC.md §1.5 "Budget-matching modes"). --out follows common/kvs_out.h like every kvsim
 * output; a warning on stderr when an error-vs-position plot has many lines. --across-traces draws the mean over
 * a model's traces with its bootstrap interval (plot.h "Across traces").
 * Exit codes per cli.h: 0 drawn, 1 database/gnuplot/output failure, 2 bad usage.
 */
#include <stdio.h>
#include <string.h>

#include "../common/kvs_out.h"
#include "../plots/plot.h"
#include "cli.h"

#define PLOT_FILTERS (KVS_CLI_FILTER_POLICY | KVS_CLI_FILTER_TRACE | KVS_CLI_FILTER_MODEL | KVS_CLI_FILTER_MEASURE)

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim plot DB --kind KIND --out FILE.png|FILE.svg|- [--format png|svg] [--metric M] [--layer L]\n"
            "                     [--x-stat mean|max] [--log-y] [--across-traces] [--budget TOKENS] [--policy NAME]\n"
            "                     [--trace PATH] [--model NAME] [--measure M] [--k K] [--score window|last]\n"
            "                     [--unit head|group]\n"
            "Draws complete runs of the results database DB with gnuplot as PNG or SVG.\n"
            "One line per (policy, params, codec, trace, measure, --kv-bytes, --aux-bytes): runs of different\n"
            "traces (by content: one trace under two path spellings is one), KV codecs (replay --codec), measure\n"
            "modes or element sizes are never averaged together; the legend names the codec as \"policy (params)\n"
            "[codec]\", and trace (<model>@<8 hex of its SHA-256>), measure and bytes when the plot has several.\n"
            "The Pareto frontier goes through runs' own points, every policy x codec. Each policy has its own\n"
            "colour, point and dash type on every plot (several series of one policy differ in point and dash\n"
            "type; a codec's series is a thin line in its policy's colour); oracles are black, dashed, labelled\n"
            "(oracle). On the plots by nominal budget, a prompt-only\n"
            "policy (SnapKV, PyramidKV, Ada-KV: generated tokens all kept) is labelled (prompt-only budget): it\n"
            "holds more than its budget; compare it on error-vs-memory. Every series has a legend entry under the\n"
            "plot: the image grows taller with the number of entries, the plot area keeps its size.\n"
            "One trace (one prompt) is one sample: with several traces per model (examples/capture_prompts.sh),\n"
            "--across-traces draws one line per (policy, params, codec, measure, bytes, model): the mean over\n"
            "the traces with its bootstrap interval (below).\n"
            "  --kind error-vs-budget    x: budget_tokens (log2), y: --metric (default out_err_mean), run-wide\n"
            "                            aggregate or --layer L\n"
            "  --kind error-vs-memory    x: measured resident bytes per KV head (storage_bytes mean, or max with\n"
            "                            --x-stat max; log scale), y: --metric; the Pareto frontier of the\n"
            "                            non-oracle runs (lowest error at no more memory) drawn as a thick grey step line\n"
            "  --kind error-vs-traffic   the same with x: bytes read per step per KV head (traffic_bytes mean|max)\n"
            "  --kind error-vs-position  x: position, y: --metric averaged over query heads (and layers unless\n"
            "                            --layer); one line per run, selected by the filters and --budget\n"
            "                            (more than %d lines are drawn with a warning); on a multi-turn trace\n"
            "                            each turn's prompt is shaded and each later turn's start a dashed line;\n"
            "                            a line breaks where positions were not measured (the prompts of later\n"
            "                            turns with --measure decode; without turn info in the database, where\n"
            "                            positions jump by more than the line's usual step)\n"
            "  --kind memory-vs-budget   x: budget_tokens (log2), y: a bytes metric (default storage_bytes_mean,\n"
            "                            log2 scale; --metric storage_bytes_max for the peak)\n"
            "  --kind drift-curve        from `kvsim drift` (newest drift run of --trace/--model): overlap of the\n"
            "                            prefill top-K with each decode step's (SyncKV Fig. 2a, S1) against the\n"
            "                            step, per layer band (each layer up to 6 layers, else 4 bands; --layer L\n"
            "                            one), mean over the units with a +-1 sd shade; dashed: 0.3 and step 50\n"
            "  --kind drift-locality     heatmap of the overlap of steps t and t+d (Fig. 2b, S3): rows t, columns d,\n"
            "                            mean over units and layers (or --layer L)\n"
            "  --k K       drift kinds: the top-k size (default the run's largest)\n"
            "  --score S   drift-curve: the window (default when recorded) or last prefill score\n"
            "  --unit U    drift kinds: head (query heads, default) or group (KV groups, max-pooled)\n"
            "  --kind head-similarity    a `kvsim heads` run (the latest, or of --trace / --model): heatmap of the\n"
            "                            similarity of units (--metric unit_sim, default; clusters boxed, * marks\n"
            "                            representatives) or query heads (query_sim), of --layer L or all layers\n"
            "  --kind layer-similarity   the layer-to-layer similarity matrix of that run (query_sim default, unit_sim)\n"
            "  --metric M  <metric>_<stat>, stat one of mean p50 p95 max min; quality metrics (out_err, out_err_abs,\n"
            "              out_cos, attn_recall, attn_recall_merged, topk_overlap) for the error kinds, bytes metrics\n"
            "              (storage_bytes, traffic_bytes, ...) for memory-vs-budget, any metric's _mean per position\n"
            "  --layer L   one layer's aggregates (or steps) instead of the run-wide ones\n"
            "  --x-stat S  error-vs-memory / error-vs-traffic: mean (default) or max over steps of the x metric.\n"
            "              Every bytes axis is per KV head, log2, its statistic and unit named on the axis\n"
            "  --log-y     error-vs-budget / -memory / -traffic: a log10 y axis (small errors spread out); points\n"
            "              <= 0 (an exact cache's error 0) cannot be drawn there: their count joins the label\n"
            "  --across-traces  error-vs-budget / -memory / -traffic, memory-vs-budget: one line per (policy, params,\n"
            "              codec, measure, bytes, model) instead of one per trace: at each budget the mean over the traces\n"
            "              that have a run there, with error bars of its 95%% percentile bootstrap interval resampling\n"
            "              traces (2000 resamples, seeded from the line, the budget and the traces' hashes: the same\n"
            "              data draws the same bars). On error-vs-memory / -traffic a point's x is the mean of the\n"
            "              traces' x at that budget (said on the axis) and the Pareto frontier goes through these\n"
            "              means. The legend gives n (traces); a budget only some traces reached is drawn from those\n"
            "              and marked n=K; a line of one trace has no bars. Without it (the default) each trace is\n"
            "              its own line\n"
            "  --budget    error-vs-position only: only runs with this budget (tokens per KV head)\n"
            "  --out FILE  a regular file is replaced atomically (written beside it, then renamed); a symbolic link is\n"
            "              written through (its target is replaced, the link stays); a FIFO or device is written\n"
            "              directly; - is standard output (the \"wrote\" line then goes to stderr). gnuplot draws into\n"
            "              a temporary folder under $TMPDIR (or /tmp) first, so a failed plot changes nothing.\n"
            "  --format F  png or svg; default: the --out extension (.png, .svg), else png for standard output, a\n"
            "              FIFO or a device; another file name needs --format\n",
            KVS_PLOT_MANY_SERIES);
    kvs_cli_filter_usage(f, PLOT_FILTERS);
}

int kvs_cmd_plot(int argc, char **argv) {
    const char *db = NULL, *kind_s = NULL, *layer_s = NULL, *budget_s = NULL, *k_s = NULL;
    kvs_plot_options o = {.kind = KVS_PLOT_ERROR_VS_BUDGET, .layer = -1, .budget_tokens = -1};
    kvs_results_filter f = {0};
    for (int i = 1; i < argc; i++) {
        int missing = 0, fr, r;
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        } else if (!strcmp(argv[i], "--log-y")) {
            if (o.log_y) return kvs_cli_usage_error("plot", "--log-y given twice");
            o.log_y = 1;
        } else if (!strcmp(argv[i], "--across-traces")) {
            if (o.across_traces) return kvs_cli_usage_error("plot", "--across-traces given twice");
            o.across_traces = 1;
        } else if ((fr = kvs_cli_filter_option("plot", argc, argv, &i, PLOT_FILTERS, &f)) != 0) {
            if (fr < 0) return KVS_EXIT_USAGE;
        } else if ((r = kvs_cli_single_value("plot", "--kind", argc, argv, &i, &missing, &kind_s)) ||
                   (r = kvs_cli_single_value("plot", "--out", argc, argv, &i, &missing, &o.out_path)) ||
                   (r = kvs_cli_single_value("plot", "--format", argc, argv, &i, &missing, &o.format)) ||
                   (r = kvs_cli_single_value("plot", "--metric", argc, argv, &i, &missing, &o.metric)) ||
                   (r = kvs_cli_single_value("plot", "--layer", argc, argv, &i, &missing, &layer_s)) ||
                   (r = kvs_cli_single_value("plot", "--budget", argc, argv, &i, &missing, &budget_s)) ||
                   (r = kvs_cli_single_value("plot", "--x-stat", argc, argv, &i, &missing, &o.x_stat)) ||
                   (r = kvs_cli_single_value("plot", "--k", argc, argv, &i, &missing, &k_s)) ||
                   (r = kvs_cli_single_value("plot", "--score", argc, argv, &i, &missing, &o.score)) ||
                   (r = kvs_cli_single_value("plot", "--unit", argc, argv, &i, &missing, &o.unit))) {
            if (r < 0) return KVS_EXIT_USAGE;
        } else if (missing) return kvs_cli_usage_error("plot", "option %s needs a value", argv[i]);
        else if (argv[i][0] == '-' && argv[i][1]) return kvs_cli_usage_error("plot", "unknown option '%s'", argv[i]);
        else if (!db) db = argv[i];
        else return kvs_cli_usage_error("plot", "unexpected argument '%s'", argv[i]);
    }
    if (!db) return kvs_cli_usage_error("plot", "missing the results database DB");
    if (!kind_s)
        return kvs_cli_usage_error("plot", "missing --kind (error-vs-budget, error-vs-memory, error-vs-traffic, "
                                           "error-vs-position, memory-vs-budget, drift-curve, drift-locality, "
                                           "head-similarity, layer-similarity)");
    if (!o.out_path) return kvs_cli_usage_error("plot", "missing --out FILE.png|FILE.svg|-");
    if (o.format && strcmp(o.format, "png") && strcmp(o.format, "svg"))
        return kvs_cli_usage_error("plot", "--format: '%s' is not png or svg", o.format);
    kvs_status st = kvs_plot_kind_parse(kind_s, &o.kind);
    if (st != KVS_OK) return kvs_cli_fail("plot", st);
    o.policy = f.policy;
    o.trace = f.trace_path;
    o.trace_sha256 = f.trace_sha256;
    o.model = f.model;
    o.measure = f.measure;
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
    if (o.log_y && o.kind != KVS_PLOT_ERROR_VS_BUDGET && o.kind != KVS_PLOT_ERROR_VS_MEMORY &&
        o.kind != KVS_PLOT_ERROR_VS_TRAFFIC)
        return kvs_cli_usage_error("plot", "--log-y applies to --kind error-vs-budget, error-vs-memory and "
                                           "error-vs-traffic only%s",
                                   o.kind == KVS_PLOT_MEMORY_VS_BUDGET ? " (memory-vs-budget's bytes axis is log2 already)"
                                                                       : "");
    if (o.across_traces && o.kind != KVS_PLOT_ERROR_VS_BUDGET && o.kind != KVS_PLOT_MEMORY_VS_BUDGET &&
        o.kind != KVS_PLOT_ERROR_VS_MEMORY && o.kind != KVS_PLOT_ERROR_VS_TRAFFIC)
        return kvs_cli_usage_error("plot", "--across-traces applies to --kind error-vs-budget, memory-vs-budget, "
                                           "error-vs-memory and error-vs-traffic only");
    if (o.x_stat) {
        if (o.kind != KVS_PLOT_ERROR_VS_MEMORY && o.kind != KVS_PLOT_ERROR_VS_TRAFFIC)
            return kvs_cli_usage_error("plot", "--x-stat applies to --kind error-vs-memory and error-vs-traffic only");
        if (strcmp(o.x_stat, "mean") && strcmp(o.x_stat, "max"))
            return kvs_cli_usage_error("plot", "--x-stat: '%s' is not mean or max", o.x_stat);
    }
    const int drift = o.kind == KVS_PLOT_DRIFT_CURVE || o.kind == KVS_PLOT_DRIFT_LOCALITY;
    if ((k_s || o.unit) && !drift) return kvs_cli_usage_error("plot", "--k and --unit apply to the drift kinds only");
    if (o.score && o.kind != KVS_PLOT_DRIFT_CURVE) return kvs_cli_usage_error("plot", "--score applies to --kind drift-curve only");
    if (o.unit && strcmp(o.unit, "head") && strcmp(o.unit, "group"))
        return kvs_cli_usage_error("plot", "--unit: '%s' is not head or group", o.unit);
    if (o.score && strcmp(o.score, "window") && strcmp(o.score, "last"))
        return kvs_cli_usage_error("plot", "--score: '%s' is not window or last", o.score);
    if (k_s) {
        long k;
        if ((st = kvs_cli_parse_long("--k", k_s, 1, 1L << 30, &k)) != KVS_OK) return kvs_cli_fail("plot", st);
        o.k = k;
    }
    if (drift && (f.policy || o.measure))
        return kvs_cli_usage_error("plot", "--policy and --measure select replay runs; the drift kinds take --trace and --model");
    if (o.metric && (st = kvs_plot_metric_check(o.kind, o.metric)) != KVS_OK) return kvs_cli_fail("plot", st);
    kvs_plot *p = NULL;
    if ((st = kvs_plot_prepare(db, &o, &p)) != KVS_OK) return kvs_cli_fail("plot", st);
    size_t n = kvs_plot_n_series(p);
    if (o.kind == KVS_PLOT_ERROR_VS_POSITION && n > KVS_PLOT_MANY_SERIES)
        fprintf(stderr, "kvsim plot: warning: %zu series on one error-vs-position plot; select fewer with --policy, "
                        "--budget, --trace, --model or --measure\n",
                n);
    st = kvs_plot_render(p);
    kvs_plot_free(p);
    if (st != KVS_OK) return kvs_cli_fail("plot", st);
    /* The image owns standard output when it went there. */
    if (kvs_out_path_is_stdout(o.out_path)) fprintf(stderr, "wrote standard output\n");
    else printf("wrote %s\n", o.out_path);
    return kvs_cli_finish_stdout("plot");
}
