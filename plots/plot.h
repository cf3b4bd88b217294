/* plot.h — plots from a kvsim results database (results/SCHEMA.md), drawn by gnuplot through a pipe
 * (../shared/DESIGN.md "Results (SQLite) and plots"): error vs budget per policy, error vs decode
 * position, memory vs budget, and error vs measured memory / traffic with the Pareto frontier
 * (POLICY_SPEC.md §1.5 "Budget-matching modes": policies compared at equal bytes, not only equal tokens).
 * PNG (pngcairo) or SVG, chosen by --format or the output file's extension; the output follows
 * common/kvs_out.h like every kvsim output ("-" is standard output).
 *
 * The data is read through the read API of results/results.h (kvs_results_open_readonly, query_runs,
 * query_steps); this module holds no SQL. Axis labels and units come from the metric table (sim/metrics.h).
 *
 * Memory and traffic axes follow one convention on every kind: bytes per KV head, the statistic over the
 * run's steps (mean unless --x-stat max, or memory-vs-budget's --metric, says otherwise) named on the axis with
 * its column and unit, a log2 scale with tics in B / KiB / MiB. --log-y puts a quality axis on a log scale.
 *
 * Series. Runs are never averaged across measure modes or element sizes, nor across traces unless asked ("Across
 * traces" below): a series of the budget and cost kinds is one (policy, params, codec, trace content, measure,
 * kv_bytes, aux_bytes) — the codec by runs.codec (`kvsim replay --codec`; K/V as captured is its own series), the
 * trace by its recorded
 * SHA-256 (one trace through two path spellings is one series; without a recorded hash, its trace row), the
 * element sizes from the run's recorded options (kvs_results_run_bytes) — and runs of one series at one budget
 * (a repeated replay) are averaged; error-vs-position draws one series per run. The Pareto frontier is made of
 * the runs' own points, never of an average. On error-vs-position the turns of a multi-turn
 * trace are marked (each turn's prompt shaded, a dashed line at each later turn's start; the turns come from
 * the database, kvs_results_query_turns) and a line breaks where positions between two of its points were not
 * measured (the prompts of later turns under measure mode decode), or, without turn info, where the positions
 * jump by more than the series' usual stride. The legend names the trace ("<model>@<8 hex>",
 * kvs_results_trace_label), the measure mode and kv_bytes / aux_bytes only when the plotted series differ in
 * them. Oracles are dashed black and labelled
 * "(oracle)"; every other series is drawn in its policy's colour, point and dash type, the same on every plot
 * and different for every registered policy (kvs_plot_policy_style), several series of one policy told apart
 * by other point and dash types. Codecs: a series of a codec's runs is labelled like every run,
 * "policy (params) [codec]" (kvs_results_run_label), comes after its policy's K/V-as-captured series in the
 * legend, keeps the policy's colour (its point and dash those of its variant number) and is drawn as a thin line
 * (width 1, K/V as captured 2): one colour per policy, thin = quantized. The Pareto frontier is made of every
 * non-oracle run's point, so it spans policies x codecs.
 *
 * Across traces (across_traces; `kvsim plot --across-traces`). One trace (one prompt) is one sample; a database
 * holding several traces of one model (examples/capture_prompts.sh: one per prompt) can be drawn as one line per
 * (policy, params, codec, measure, kv_bytes, aux_bytes, model), the traces being the units of a mean. Per trace first the
 * per-trace point as above (its repeated runs at one budget averaged); then, at each budget, over the traces that
 * have a run there: y = the mean of their y with its percentile bootstrap 95 % interval resampling traces
 * (common/kvs_stats.h kvs_bootstrap_mean, KVS_BOOTSTRAP_REPS resamples, the traces' values in ascending order of
 * their trace key), drawn as error bars, and x = the budget (budget kinds) or the mean of the traces' x at that
 * budget (cost kinds: the axis says "mean over traces at each budget"). A budget that only some traces have a run
 * at is drawn from those (dropping it would hide what was measured, and a line that ends early hides it too); the
 * number of traces of each point is in the data, the legend says "n=7 traces" (or "n=5 to 7 traces": then every
 * point below the most is marked "n=5" on the plot), and a line whose points all have one trace draws no bars
 * ("n=1 trace: no interval"). The interval is a function of what it summarises: its seed is the 64-bit FNV-1a
 * (offset 14695981039346656037, prime 1099511628211) of the text
 *     "<policy>\n<params>\n<measure>\n<kv_bytes>\n<aux_bytes>\n<model>\n<budget>\n" [+ "codec=<spec>\n" for a
 *     codec's line] + "<trace key>\n" per trace
 * (kv_bytes/aux_bytes -1 when not recorded, model "" when not recorded; the trace key is the recorded SHA-256 in
 * hex, else "#<trace_id>"; the traces of that point only, ascending), so adding an unrelated series to a plot or
 * a trace to another line changes no interval. The Pareto frontier of a cost kind then goes through the
 * aggregated points of the non-oracle lines and is labelled so. On a --log-y axis a lower bound <= 0 is drawn
 * down to the axis' floor and the label counts such bars.
 */
#ifndef KVS_PLOT_H
#define KVS_PLOT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../common/kvs.h"

typedef enum {
    KVS_PLOT_ERROR_VS_BUDGET = 0,   /* x: budget_tokens (log2), y: a run-wide or per-layer quality metric */
    KVS_PLOT_ERROR_VS_POSITION = 1, /* x: position, y: mean over heads (and layers) of a step metric */
    KVS_PLOT_MEMORY_VS_BUDGET = 2,  /* x: budget_tokens (log2), y: a bytes metric (default storage_bytes_mean, log2) */
    KVS_PLOT_ERROR_VS_MEMORY = 3,   /* x: measured resident bytes (storage_bytes mean|max, log), y: quality */
    KVS_PLOT_ERROR_VS_TRAFFIC = 4,  /* x: measured bytes read per step (traffic_bytes mean|max, log), y: quality */
    KVS_PLOT_DRIFT_CURVE = 5,       /* drift tables: prefill-vs-step top-k overlap per decode step (plot_drift.h) */
    KVS_PLOT_DRIFT_LOCALITY = 6,    /* drift tables: step x delta top-k overlap heatmap (plot_drift.h) */
    KVS_PLOT_HEAD_SIMILARITY = 7,   /* heatmap of a heads run's head similarity, clusters boxed (plot_heads.h) */
    KVS_PLOT_LAYER_SIMILARITY = 8,  /* a heads run's layer-to-layer similarity matrix (plot_heads.h) */
} kvs_plot_kind;
#define KVS_PLOT_N_KINDS 9

/* What to draw. Borrowed strings; NULL filters select everything. */
typedef struct {
    kvs_plot_kind kind;
    const char *metric;    /* y column "<metric>_<stat>"; NULL = the kind's default; see kvs_plot_metric_check() */
    int32_t layer;         /* -1: run-wide aggregate (budget/cost kinds) / all layers (position kind) */
    const char *policy;    /* only runs of this policy; NULL = all */
    int64_t budget_tokens; /* error-vs-position only: runs with this budget; -1 = all */
    const char *out_path;  /* the image, written through common/kvs_out.h: a file (through symbolic links) replaced
                            * atomically, a device or FIFO in place, "-" standard output */
    const char *format;    /* "png" or "svg"; NULL: by out_path's extension (.png/.svg), else PNG for standard
                            * output, a descriptor, device or FIFO; a file named otherwise needs it */
    const char *gnuplot;   /* program to run (name looked up on PATH, or a path); NULL = "gnuplot" */
    const char *trace;     /* only runs of this trace (path as stored, or its trailing components) */
    const char *trace_sha256; /* with trace: also runs of the trace with this content hash (any path spelling) */
    const char *model;     /* only runs of traces of this model */
    const char *measure;   /* only runs of this measure mode: decode, prefill, all */
    const char *x_stat;    /* error-vs-memory/-traffic: "mean" (NULL) or "max" of the x metric */
    int64_t k;             /* drift kinds: the top-k size (0: the run's largest) */
    const char *score;     /* drift-curve: "window" or "last" prefill score (NULL: window when recorded) */
    const char *unit;      /* drift kinds: "head" or "group" (NULL: head) */
    int log_y;             /* error-vs-budget/-memory/-traffic: 1 = log10 y axis; points with y <= 0 are left out
                            * and their count is added to their series' label ("[2 of 5 points <= 0: not on the
                            * log axis]"); other kinds KVS_ERR_INVALID_ARG */
    int across_traces;     /* error-vs-budget/-memory/-traffic, memory-vs-budget: 1 = one line per (policy, params,
                            * measure, kv_bytes, aux_bytes, model), the mean over its traces with a bootstrap
                            * interval ("Across traces" above); 0 = one line per trace; other kinds
                            * KVS_ERR_INVALID_ARG */
} kvs_plot_options;

/*! kvs_plot_kind_parse() : "error-vs-budget", "error-vs-position", "memory-vs-budget", "error-vs-memory",
 *  "error-vs-traffic", "drift-curve", "drift-locality", "head-similarity", "layer-similarity"; else
 *  KVS_ERR_INVALID_ARG naming the accepted kinds. */
kvs_status kvs_plot_kind_parse(const char *name, kvs_plot_kind *out);

/*! kvs_plot_kind_name() : the name of a kind ("?" when out of range). */
const char *kvs_plot_kind_name(kvs_plot_kind kind);

/*! kvs_plot_metric_check() : KVS_OK when `metric` ("<metric>_<stat>" of the metric table) can be drawn by
 *  `kind`: error-vs-budget/-memory/-traffic accept a quality metric (out_err, out_err_abs, out_cos,
 *  attn_recall, attn_recall_merged, topk_overlap) with _mean, _p50, _p95, _max or _min; memory-vs-budget a
 *  bytes metric with one of those statistics; error-vs-position any metric's _mean (the mean of its step
 *  series); else KVS_ERR_INVALID_ARG saying what is accepted. */
kvs_status kvs_plot_metric_check(kvs_plot_kind kind, const char *metric);

/*! kvs_plot_policy_color() : the colour ("#rrggbb", static) every plot draws policy `policy` in: the
 *  policy's place in the registry (policies/registry.h kvs_policy_at) picks it from a fixed palette of
 *  colours chosen far apart (plot.c says how), larger than the registry, so each registered policy has its own
 *  colour on every plot whatever else is drawn; another name gets a palette colour from a hash of the name.
 *  Never black (oracle series are drawn black, dashed) nor the frontier's grey. */
const char *kvs_plot_policy_color(const char *policy);

/* How one series is drawn: its colour, gnuplot point type (pt) and dash type (dt). */
typedef struct {
    const char *color; /* "#rrggbb", static */
    int point, dash;
} kvs_plot_style;

/*! kvs_plot_policy_style() : the style of the `variant`-th series (0-based, in legend order) of policy
 *  `policy` on a plot. Variant 0 is the policy's own style, the same on every plot: its colour
 *  (kvs_plot_policy_color) and a point and dash type, the (colour, point, dash) triple different for every
 *  registered policy and the (point, dash) pair too. Later variants (other params, bytes, traces, budgets) keep
 *  the colour and take other (point, dash) pairs, variants 0..35 of one policy all different. Oracles
 *  (is_oracle) are black with dash type 2, which no other series uses, variants told apart by point. */
kvs_plot_style kvs_plot_policy_style(const char *policy, int variant, int is_oracle);

/*! kvs_plot_pareto() : the Pareto-optimal points among n points (x[i], y[i]) (non-finite ones ignored):
 *  point i is kept when no other point has x <= x[i] and a y at least as good (lower, or higher when
 *  higher_is_better) with one of the two strictly better; of identical points the lowest index is kept.
 *  Writes the kept indexes to idx (capacity n) in ascending x and returns how many. */
size_t kvs_plot_pareto(const double *x, const double *y, size_t n, int higher_is_better, size_t *idx);

/* A prepared plot: the data read from the database, its series, labels and layout (opaque). */
typedef struct kvs_plot kvs_plot;

/*! kvs_plot_prepare() : checks the options (the image format included), reads the data from the results database at `db_path`
 *  (read-only; complete runs only) and lays the plot out; runs no program and writes nothing. Errors: bad
 *  options KVS_ERR_INVALID_ARG; database problems or no data to draw KVS_ERR_DB (detail says what was
 *  missing). @return KVS_OK and *out (caller frees with kvs_plot_free). */
kvs_status kvs_plot_prepare(const char *db_path, const kvs_plot_options *opt, kvs_plot **out);

/*! kvs_plot_free() : frees a prepared plot; accepts NULL. */
void kvs_plot_free(kvs_plot *p);

/* More series than this on one error-vs-position plot (one line per run) are hard to tell apart: `kvsim plot`
 * still draws them, with a warning naming the filters that select fewer. */
#define KVS_PLOT_MANY_SERIES 12

/*! kvs_plot_n_series() : the number of series of a prepared plot (the Pareto frontier counts as one). */
size_t kvs_plot_n_series(const kvs_plot *p);

/* The canvas and legend of a plot, in pixels. The key sits under the plot in key_cols columns of key_rows
 * rows (row by row, in legend order): the number of columns is what the longest label allows at the
 * canvas width, and the canvas grows by one key row height per row, so the area above the key (title, plot
 * area, x axis) is plot_height pixels on every plot. A label too long for one column widens the canvas. */
typedef struct {
    int n_entries;          /* legend entries: one per series */
    int longest;            /* characters of the longest legend label */
    int key_cols, key_rows; /* key_cols * key_rows >= n_entries */
    int width, height;      /* canvas */
    int plot_height;        /* canvas above the key */
    int key_height;         /* canvas given to the key: height = plot_height + key_height */
} kvs_plot_layout;

/*! kvs_plot_layout_of() : the layout of a prepared plot (what kvs_plot_write_script asks gnuplot for). */
kvs_plot_layout kvs_plot_layout_of(const kvs_plot *p);

/*! kvs_plot_write_script() : writes the complete gnuplot script of `p` to `f`: terminal, `set output`
 *  naming `image_path`, labels, key, the plot command and the inline data. The script carries one
 *  "# series: LABEL" comment line before each inline data block (tests read it). KVS_ERR_IO when writing to
 *  `f` fails. */
kvs_status kvs_plot_write_script(const kvs_plot *p, const char *image_path, FILE *f);

/*! kvs_plot_render() : draws `p` with gnuplot and writes the image to opt->out_path of kvs_plot_prepare
 *  (common/kvs_out.h). gnuplot draws into a private folder under $TMPDIR (or /tmp), removed afterwards, and
 *  the complete image is then copied into the output. Errors: gnuplot missing or failing, or writing no image,
 *  KVS_ERR_EXTERNAL; output not creatable or not writable KVS_ERR_IO. On any error the output is unchanged (a
 *  file keeps its old content; nothing reaches a device, FIFO or standard output) and no temporary file is left
 *  behind. */
kvs_status kvs_plot_render(const kvs_plot *p);

/*! kvs_plot_make() : kvs_plot_prepare(), kvs_plot_render() and kvs_plot_free() in one call; errors as
 *  theirs. */
kvs_status kvs_plot_make(const char *db_path, const kvs_plot_options *opt);

/* ---- the gnuplot runner, shared with plots drawn from other data (plots/plan_plot.c) ---- */

/*! kvs_plot_gp_string() : writes s (NULL = empty) as a gnuplot single-quoted string: inside '...' only a
 *  doubled quote is special, and line breaks become spaces (a string is one line of the script). For every
 *  script kvsim writes: titles, labels, legend entries, the output path. */
void kvs_plot_gp_string(FILE *f, const char *s);

/* Writes a complete gnuplot script to `gp` whose `set output` names `image_path`. */
typedef void (*kvs_plot_script_fn)(FILE *gp, const void *ctx, const char *image_path);

/*! kvs_plot_image_format() : PNG or SVG for `out_path`: `format` ("png"/"svg") when given (it must agree with
 *  a .png/.svg name), else the name's extension, else PNG for standard output, a descriptor, device or FIFO;
 *  *is_svg receives the choice. A file named otherwise: KVS_ERR_INVALID_ARG. */
kvs_status kvs_plot_image_format(const char *out_path, const char *format, int *is_svg);

/*! kvs_plot_gnuplot_render() : runs `gnuplot` (NULL = "gnuplot" on PATH) on the script `write(gp, ctx, image)`
 *  writes and delivers the image to `out_path` exactly as kvs_plot_render does (common/kvs_out.h; a private
 *  temporary folder; on any error the output is unchanged and nothing is left behind). Errors as
 *  kvs_plot_render's. */
kvs_status kvs_plot_gnuplot_render(const char *gnuplot, const char *out_path, int is_svg, kvs_plot_script_fn write,
                                   const void *ctx);

#endif /* KVS_PLOT_H */
