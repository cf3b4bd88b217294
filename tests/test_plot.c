/* test_plot.c — tests of plots/plot.h and `kvsim plot`: PNG and SVG output of every plot kind from a
 * database populated through results/results.h (skipped with a message when gnuplot is not installed), the data
 * gnuplot receives (captured by a stand-in gnuplot script): the Pareto frontier of error-vs-memory /
 * error-vs-traffic on a hand-made case, series kept apart by trace and by measure mode, oracles dashed; the
 * Pareto function itself; the script written to a stream (kvs_plot_write_script) equal to what gnuplot reads;
 * the legend layout (every series an entry, columns that fit, the canvas grown by the key's rows); one colour per
 * policy across kinds and selections; the many-series warning; turn marks and line breaks of error-vs-position
 * (hand-made turns, a database without turn info, and a real multi-turn capture -> replay -> plot);
 * and every error path — gnuplot missing or failing, empty database, missing data,
 * bad options — giving the right status / exit code and leaving no output file (nor a temporary one) behind;
 * --out through common/kvs_out.h (a symbolic link written through, '-' standard output, --format); the view across
 * traces (--across-traces): each point's mean, bootstrap interval and n recomputed from the runs with the seed the
 * header documents, {0, 1} giving [0, 1], x of the cost kinds the traces' mean, the frontier through the means, n in
 * the legend and on points with fewer traces, no bars for one trace, a real seven-prompt capture -> replay -> plot.
 */
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/testenv.h"

#include "common/kvs.h"
#include "common/kvs_stats.h"
#include "plots/plot.h"
#include "sim/policy.h"
#include "policies/registry.h"
#include "results/results.h"
#include "results/results_sweep.h"
#include "trace/trace.h"

typedef struct {
    char dir[64];
    char db[128];   /* populated database */
    char empty[128]; /* kvsim database without runs */
} tmp_ctx;

static void expect_ok(kvs_status st) {
    if (st != KVS_OK) fprintf(stderr, "unexpected failure: %s (%s)\n", kvs_strerror(st), kvs_last_error());
    assert_int_equal(st, KVS_OK);
}

static void expect_msg(const char *part) {
    if (!strstr(kvs_last_error(), part)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", kvs_last_error(), part);
        fail();
    }
}

static kvs_results_stat stat_of(double v) {
    return (kvs_results_stat){.n = 40, .mean = v, .p50 = v, .p95 = 1.5 * v, .max = 2 * v, .min = 0.5 * v};
}

static kvs_results_agg agg_for(int32_t layer, double err, double bytes) {
    kvs_results_agg a = {.layer = layer};
    a.out_err = stat_of(err);
    a.attn_recall = stat_of(1.0 - err / 2);
    a.topk_overlap = stat_of(1.0 - err);
    a.storage_bytes = stat_of(bytes);
    a.traffic_bytes = stat_of(bytes);
    a.transfer_bytes = stat_of(0);
    a.compression_ratio = stat_of(4096.0 / bytes);
    return a;
}

/* Writes one complete run with 2 layers x 2 q heads x 24 positions of steps (when with_steps). */
static void put_run(kvs_results_db *db, const char *policy, const char *params, int oracle, int64_t budget,
                    int with_steps) {
    kvs_results_trace tr = {.path = "/traces/gen.kvt", .model_name = "generated-gaussian", .n_positions = 64,
                            .prompt_len = 40, .n_turns = 1, .n_layers = 2, .n_heads = 2, .n_kv_heads = 1,
                            .head_dim = 16, .dtype = "fp32", .file_bytes = 1000};
    kvs_results_run run = {.policy = policy, .params = params, .budget_tokens = budget, .budget_fraction = -1,
                           .is_oracle = oracle, .measure = "decode", .status = "complete", .wall_seconds = 0.01,
                           .kvsim_version = "0.1.0"};
    double err = (oracle ? 0.2 : 1.0) / (double)budget, bytes = (double)budget * 128.0;
    kvs_results_agg layers[2] = {agg_for(0, err, bytes), agg_for(1, 1.5 * err, bytes)};
    kvs_results_agg all = agg_for(-1, 1.25 * err, bytes);
    kvs_results_step steps[96];
    int n = 0;
    for (int l = 0; l < 2 && with_steps; l++)
        for (int h = 0; h < 2; h++)
            for (int p = 40; p < 64; p++)
                steps[n++] = (kvs_results_step){.layer = l, .q_head = h, .position = p,
                                                .out_err = (float)(err * (1 + 0.05 * (p - 40) + 0.1 * h + 0.2 * l)),
                                                .attn_recall = (float)(1 - err), .topk_overlap = 0.5f,
                                                .attended_tokens = (int32_t)budget, .storage_bytes = bytes,
                                                .traffic_bytes = bytes};
    expect_ok(kvs_results_write_run(db, &tr, &run, layers, 2, &all, steps, n, NULL));
}

static int setup_db(void **state) {
    tmp_ctx *t = calloc(1, sizeof *t);
    if (!t) return -1;
    snprintf(t->dir, sizeof t->dir, "/tmp/kvs_plot_XXXXXX");
    if (!mkdtemp(t->dir)) return -1;
    snprintf(t->db, sizeof t->db, "%s/study.db", t->dir);
    snprintf(t->empty, sizeof t->empty, "%s/empty.db", t->dir);
    kvs_results_db *db = NULL;
    if (kvs_results_open(t->db, &db) != KVS_OK) return -1;
    for (int64_t b = 16; b <= 128; b *= 2) {
        put_run(db, "h2o", "heavy=0.5,recent=0.5", 0, b, 1);
        put_run(db, "streaming", "sinks=4,window=auto", 0, b, 1);
        put_run(db, "topk", "", 1, b, b == 32);
    }
    kvs_results_close(db);
    if (kvs_results_open(t->empty, &db) != KVS_OK) return -1;
    kvs_results_close(db);
    *state = t;
    return 0;
}

static int teardown_db(void **state) {
    tmp_ctx *t = *state;
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->dir);
    int rc = system(cmd);
    free(t);
    return rc == 0 ? 0 : -1;
}

static int have_gnuplot(void) { return system("command -v gnuplot >/dev/null 2>&1") == 0; }

static void skip_without_gnuplot(void) {
    if (!have_gnuplot()) {
        fprintf(stderr, "SKIP: gnuplot is not installed (Debian: gnuplot-nox); plot output not checked\n");
        skip();
    }
}

/* No temporary file of an output at `out` is left: OUT.tmp.XXXXXX (common/kvs_out.h), nor the OUT.partial of
 * older kvsim. */
static void assert_no_temp_beside(const char *out) {
    char pattern[256];
    snprintf(pattern, sizeof pattern, "%s.tmp.*", out);
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == 0) {
        fprintf(stderr, "temporary file left: %s\n", g.gl_pathv[0]);
        globfree(&g);
        fail();
    }
    assert_int_equal(rc, GLOB_NOMATCH);
    snprintf(pattern, sizeof pattern, "%s.partial", out);
    assert_false(kvs_test_exists(pattern));
}

static void assert_nothing_written(const char *out) {
    assert_false(kvs_test_exists(out));
    assert_no_temp_beside(out);
}

/* Asserts `path` is a non-trivial PNG (signature) or SVG (starts with <?xml or <svg, has </svg>). */
static void assert_image(const char *path, int svg) {
    char *data = NULL;
    size_t n = 0;
    expect_ok(kvs_read_file(path, &data, &n));
    assert_true(n > 1000);
    if (svg) {
        assert_true(!strncmp(data, "<?xml", 5) || !strncmp(data, "<svg", 4));
        assert_non_null(strstr(data, "</svg>"));
    } else {
        assert_memory_equal(data, "\x89PNG\r\n\x1a\n", 8);
        assert_memory_equal(data + 12, "IHDR", 4);
    }
    free(data);
    assert_no_temp_beside(path);
}

static kvs_plot_options opts(kvs_plot_kind kind, const char *out) {
    kvs_plot_options o = {.kind = kind, .metric = NULL, .layer = -1, .policy = NULL, .budget_tokens = -1,
                          .out_path = out, .gnuplot = NULL};
    return o;
}

/* ------------------------------------------------------------------------------------------------ */

static void test_error_vs_budget_png_and_svg(void **state) {
    tmp_ctx *t = *state;
    skip_without_gnuplot();
    char out[160];
    snprintf(out, sizeof out, "%s/err.png", t->dir);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_BUDGET, out);
    expect_ok(kvs_plot_make(t->db, &o));
    assert_image(out, 0);

    snprintf(out, sizeof out, "%s/err.svg", t->dir);
    o.out_path = out;
    o.metric = "out_err_p95";
    expect_ok(kvs_plot_make(t->db, &o));
    assert_image(out, 1);
    /* The oracle is labelled and dashed; params with commas survive into the key. */
    char *svg = NULL;
    size_t n = 0;
    expect_ok(kvs_read_file(out, &svg, &n));
    assert_non_null(strstr(svg, "topk (oracle)"));
    assert_non_null(strstr(svg, "h2o (heavy=0.5,recent=0.5)"));
    assert_non_null(strstr(svg, "stroke-dasharray"));
    free(svg);

    snprintf(out, sizeof out, "%s/layer1.png", t->dir);
    o.out_path = out;
    o.metric = "attn_recall_mean";
    o.layer = 1;
    o.policy = "h2o";
    expect_ok(kvs_plot_make(t->db, &o));
    assert_image(out, 0);
}

static void test_memory_vs_budget_and_error_vs_position(void **state) {
    tmp_ctx *t = *state;
    skip_without_gnuplot();
    char out[160];
    snprintf(out, sizeof out, "%s/mem.svg", t->dir);
    kvs_plot_options o = opts(KVS_PLOT_MEMORY_VS_BUDGET, out);
    expect_ok(kvs_plot_make(t->db, &o));
    assert_image(out, 1);

    snprintf(out, sizeof out, "%s/pos.png", t->dir);
    o = opts(KVS_PLOT_ERROR_VS_POSITION, out);
    o.budget_tokens = 32;
    expect_ok(kvs_plot_make(t->db, &o));
    assert_image(out, 0);

    snprintf(out, sizeof out, "%s/pos.svg", t->dir);
    o.out_path = out;
    o.policy = "streaming";
    o.layer = 0;
    o.budget_tokens = -1;
    expect_ok(kvs_plot_make(t->db, &o));
    assert_image(out, 1);
    char *svg = NULL;
    size_t n = 0;
    expect_ok(kvs_read_file(out, &svg, &n));
    assert_non_null(strstr(svg, "budget=128"));
    assert_null(strstr(svg, "h2o (")); /* the policy filter applies */
    free(svg);
}

static void test_plot_failures_leave_no_file(void **state) {
    tmp_ctx *t = *state;
    char out[160];
    snprintf(out, sizeof out, "%s/fail.png", t->dir);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_BUDGET, out);

    o.gnuplot = "/nonexistent/dir/gnuplot";
    assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_EXTERNAL);
    expect_msg("gnuplot not found");
    assert_nothing_written(out);
    o.gnuplot = "kvsim-no-such-gnuplot";
    assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_EXTERNAL);
    expect_msg("gnuplot not found");
    assert_nothing_written(out);

    /* A "gnuplot" that exits 1 without reading its input: the SIGPIPE must not kill us. */
    if (access("/bin/false", X_OK) == 0) {
        o.gnuplot = "/bin/false";
        assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_EXTERNAL);
        expect_msg("failed (exit status 1)");
        assert_nothing_written(out);
    }
    /* A "gnuplot" that exits 0 without reading or writing anything: reported either as a failed write to
     * its input or as no output, depending on whether it exited before the script was written. */
    if (access("/bin/true", X_OK) == 0) {
        o.gnuplot = "/bin/true";
        assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_EXTERNAL);
        if (!strstr(kvs_last_error(), "wrote no output") && !strstr(kvs_last_error(), "writing the script")) {
            fprintf(stderr, "unexpected message '%s'\n", kvs_last_error());
            fail();
        }
        assert_nothing_written(out);
    }
    o.gnuplot = NULL;

    assert_int_equal(kvs_plot_make(t->empty, &o), KVS_ERR_DB);
    expect_msg("no complete runs");
    assert_nothing_written(out);

    o.policy = "snapkv";
    assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_DB);
    expect_msg("no complete runs of policy 'snapkv'");
    o.policy = NULL;

    o.layer = 9;
    assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_DB);
    expect_msg("no data for error-vs-budget");
    assert_nothing_written(out);
    o.layer = -1;

    o = opts(KVS_PLOT_ERROR_VS_POSITION, out);
    o.policy = "topk";
    o.budget_tokens = 64; /* topk has steps only at budget 32 */
    assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_DB);
    expect_msg("no per-step samples");
    assert_nothing_written(out);

    o = opts(KVS_PLOT_ERROR_VS_BUDGET, out);
    char txt[160];
    snprintf(txt, sizeof txt, "%s/notes.txt", t->dir);
    FILE *f = fopen(txt, "w");
    assert_non_null(f);
    fputs("not a database, just text that is long enough to have a header\n", f);
    fclose(f);
    assert_int_equal(kvs_plot_make(txt, &o), KVS_ERR_DB);
    expect_msg("not a kvsim results database");
    char missing[160];
    snprintf(missing, sizeof missing, "%s/missing.db", t->dir);
    assert_int_equal(kvs_plot_make(missing, &o), KVS_ERR_IO);
    assert_false(kvs_test_exists(missing));

    char bad_out[160];
    snprintf(bad_out, sizeof bad_out, "%s/plot.jpg", t->dir);
    o.out_path = bad_out;
    assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_INVALID_ARG);
    expect_msg("must end in .png or .svg");
    snprintf(bad_out, sizeof bad_out, "%s/no/such/dir/plot.png", t->dir);
    if (have_gnuplot()) {
        assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_IO);
        expect_msg("cannot create"); /* common/kvs_out.h's message, as for every output */
    }
    o.out_path = out;
    o.metric = "storage_bytes_max";
    assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_INVALID_ARG);
    expect_msg("error-vs-budget draws a quality metric");
    assert_nothing_written(out);
    o.metric = "out_err_bogus";
    assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_INVALID_ARG);
    expect_msg("unknown metric 'out_err_bogus'");
    o.metric = NULL;
    o.kind = KVS_PLOT_ERROR_VS_MEMORY;
    o.x_stat = "median";
    assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_INVALID_ARG);
    expect_msg("--x-stat: 'median'");
    o.x_stat = NULL;
    o.measure = "sometimes";
    assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_INVALID_ARG);
    expect_msg("--measure: 'sometimes'");
    o.measure = NULL;
    /* A filter that matches nothing is "no complete runs", named by the filter. */
    o.trace = "nosuch.kvt";
    assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_DB);
    expect_msg("no complete runs of trace 'nosuch.kvt'");
    assert_nothing_written(out);
}

static void test_kind_and_metric_parsing(void **state) {
    (void)state;
    kvs_plot_kind k;
    expect_ok(kvs_plot_kind_parse("error-vs-budget", &k));
    assert_int_equal(k, KVS_PLOT_ERROR_VS_BUDGET);
    expect_ok(kvs_plot_kind_parse("error-vs-position", &k));
    assert_int_equal(k, KVS_PLOT_ERROR_VS_POSITION);
    expect_ok(kvs_plot_kind_parse("memory-vs-budget", &k));
    assert_int_equal(k, KVS_PLOT_MEMORY_VS_BUDGET);
    expect_ok(kvs_plot_kind_parse("error-vs-memory", &k));
    assert_int_equal(k, KVS_PLOT_ERROR_VS_MEMORY);
    expect_ok(kvs_plot_kind_parse("error-vs-traffic", &k));
    assert_int_equal(k, KVS_PLOT_ERROR_VS_TRAFFIC);
    assert_string_equal(kvs_plot_kind_name(KVS_PLOT_ERROR_VS_TRAFFIC), "error-vs-traffic");
    assert_int_equal(kvs_plot_kind_parse("drift", &k), KVS_ERR_INVALID_ARG);
    expect_msg("unknown plot kind 'drift'");
    /* Metrics come from the metric table: any quality metric and statistic for the error kinds. */
    expect_ok(kvs_plot_metric_check(KVS_PLOT_ERROR_VS_MEMORY, "out_err_abs_p95"));
    expect_ok(kvs_plot_metric_check(KVS_PLOT_ERROR_VS_TRAFFIC, "attn_recall_merged_min"));
    expect_ok(kvs_plot_metric_check(KVS_PLOT_ERROR_VS_BUDGET, "out_cos_mean"));
    expect_ok(kvs_plot_metric_check(KVS_PLOT_MEMORY_VS_BUDGET, "traffic_bytes_mean"));
    expect_ok(kvs_plot_metric_check(KVS_PLOT_ERROR_VS_POSITION, "storage_bytes_mean"));
    assert_int_equal(kvs_plot_metric_check(KVS_PLOT_ERROR_VS_MEMORY, "storage_bytes_mean"), KVS_ERR_INVALID_ARG);
    expect_msg("draws a quality metric");
    assert_int_equal(kvs_plot_metric_check(KVS_PLOT_MEMORY_VS_BUDGET, "out_err_mean"), KVS_ERR_INVALID_ARG);
    expect_msg("draws a bytes metric");
    assert_int_equal(kvs_plot_metric_check(KVS_PLOT_ERROR_VS_BUDGET, "out_err_n"), KVS_ERR_INVALID_ARG);
    expect_msg("sample count");
    expect_ok(kvs_plot_metric_check(KVS_PLOT_ERROR_VS_BUDGET, "topk_overlap_mean"));
    expect_ok(kvs_plot_metric_check(KVS_PLOT_ERROR_VS_POSITION, "attn_recall_mean"));
    assert_int_equal(kvs_plot_metric_check(KVS_PLOT_ERROR_VS_POSITION, "out_err_p95"), KVS_ERR_INVALID_ARG);
    expect_msg("cannot be drawn per position");
    assert_int_equal(kvs_plot_metric_check(KVS_PLOT_ERROR_VS_BUDGET, "out_err"), KVS_ERR_INVALID_ARG);
    expect_msg("unknown metric 'out_err'");
}


/* ------------------------------------------------------------------------------------------------
 * The Pareto frontier and the data sent to gnuplot (captured by a stand-in gnuplot)
 * ---------------------------------------------------------------------------------------------- */

static void test_pareto_hand_made(void **state) {
    (void)state;
    /* lower is better: 2 is beaten at the same x by 1, 3 by 0 (less memory, better), 4 ties 1's error with
     * more memory, 7 is not finite, 8 duplicates 5 (the lower index stays). */
    const double x[10] = {1000, 2000, 2000, 1500, 4000, 8000, 500, NAN, 8000, 3000};
    const double y[10] = {0.5, 0.3, 0.4, 0.6, 0.3, 0.1, 0.9, 0.0, 0.1, 0.25};
    size_t idx[10];
    size_t n = kvs_plot_pareto(x, y, 10, 0, idx);
    const size_t want[5] = {6, 0, 1, 9, 5};
    assert_int_equal(n, 5);
    for (size_t i = 0; i < n; i++) assert_int_equal(idx[i], want[i]);
    /* higher is better (recall): at x 2000 the higher of the two; 4000 does not beat 0.9 */
    const double hx[6] = {500, 1000, 1500, 2000, 2000, 4000};
    const double hy[6] = {0.2, 0.5, 0.4, 0.8, 0.9, 0.85};
    n = kvs_plot_pareto(hx, hy, 6, 1, idx);
    assert_int_equal(n, 3);
    assert_true(idx[0] == 0 && idx[1] == 1 && idx[2] == 4);
    assert_int_equal(kvs_plot_pareto(x, y, 0, 0, idx), 0);
}

/* Writes one complete run whose run-wide storage_bytes mean is `mem`, traffic_bytes mean mem/2 and max mem,
 * and out_err mean `err` (layer aggregates the same). */
static void put_cost_run(kvs_results_db *db, const char *trace, const char *policy, const char *params, int oracle,
                         int64_t budget, const char *measure, double mem, double err) {
    kvs_results_trace tr = {.path = trace, .model_name = "generated-gaussian", .n_positions = 64, .prompt_len = 40,
                            .n_turns = 1, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 16,
                            .dtype = "fp32", .file_bytes = 1000};
    kvs_results_run run = {.policy = policy, .params = params, .budget_tokens = budget, .budget_fraction = -1,
                           .is_oracle = oracle, .measure = measure, .status = "complete", .wall_seconds = 0.01,
                           .kvsim_version = "0.1.0"};
    kvs_results_agg a = agg_for(-1, err, mem);
    a.traffic_bytes = (kvs_results_stat){.n = 40, .mean = mem / 2, .p50 = mem / 2, .p95 = mem, .max = mem, .min = 1};
    kvs_results_agg l = a;
    l.layer = 0;
    expect_ok(kvs_results_write_run(db, &tr, &run, &l, 1, &a, NULL, 0, NULL));
}

/* The hand-made study: per series (x = storage_bytes mean, y = out_err mean)
 *   h2o A decode   (1024, .0625)   (2048, .03125)   (4096, .015625)
 *   h2o B decode   (1536, .05)     (3072, .02)      (6144, .01)
 *   h2o A all      (1024, .125)    (2048, .0625)    (4096, .03125)
 *   streaming A    (512, .09375)   (1024, .046875)  (2048, .0234375)
 *   topk A oracle  (2048, .004)    (4096, .002)     (8192, .001)
 * Pareto frontier of the non-oracle points (min error at no more memory):
 *   (512, .09375) (1024, .046875) (2048, .0234375) (3072, .02) (4096, .015625) (6144, .01) */
static void make_cost_db(const char *path) {
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(path, &db));
    for (int k = 0; k < 3; k++) {
        int64_t b = 16 << k;
        double f = (double)(1 << k);
        put_cost_run(db, "/traces/a.kvt", "h2o", "heavy=0.5", 0, b, "decode", 1024 * f, 0.0625 / f);
        put_cost_run(db, "/traces/b.kvt", "h2o", "heavy=0.5", 0, b, "decode", 1536 * f, (k == 0 ? 0.05 : k == 1 ? 0.02 : 0.01));
        put_cost_run(db, "/traces/a.kvt", "h2o", "heavy=0.5", 0, b, "all", 1024 * f, 0.125 / f);
        put_cost_run(db, "/traces/a.kvt", "streaming", "sinks=4", 0, b, "decode", 512 * f, 0.09375 / f);
        put_cost_run(db, "/traces/a.kvt", "topk", "", 1, b, "decode", 2048 * f, 0.004 / f);
    }
    /* A repeated run of h2o A decode at budget 16 with the same memory: averaged with the first one, so the
     * point stays at (1024, .0625) only if both agree — make them agree. */
    put_cost_run(db, "/traces/a.kvt", "h2o", "heavy=0.5", 0, 16, "decode", 1024, 0.0625);
    kvs_results_close(db);
}

/* A stand-in gnuplot: saves its script to DIR/captured.gp and writes a small file as the output. */
static void make_fake_gnuplot(const char *dir, char *prog, size_t cap, char *captured, size_t ccap) {
    snprintf(prog, cap, "%s/fake-gnuplot", dir);
    snprintf(captured, ccap, "%s/captured.gp", dir);
    FILE *f = fopen(prog, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\ncat > '%s'\nout=$(sed -n \"s/^set output '\\(.*\\)'$/\\1/p\" '%s')\n"
               "printf 'stand-in image\\n' > \"$out\"\n",
            captured, captured);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(prog, 0755), 0);
}

/* The points of the first inline data block labelled `label` in a captured script; -1 when there is none. */
static int data_block(const char *script, const char *label, double *x, double *y, int cap) {
    char head[512];
    snprintf(head, sizeof head, "# series: %s\n", label);
    const char *p = strstr(script, head);
    if (!p) return -1;
    p += strlen(head);
    int n = 0;
    while (strncmp(p, "e\n", 2) != 0) {
        char *end;
        assert_true(n < cap);
        x[n] = strtod(p, &end);
        y[n] = strtod(end, &end);
        assert_int_equal(*end, '\n');
        p = end + 1;
        n++;
    }
    return n;
}

static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

static void expect_block(const char *script, const char *label, int n, const double *x, const double *y) {
    double gx[32], gy[32];
    int got = data_block(script, label, gx, gy, 32);
    if (got != n) {
        fprintf(stderr, "series '%s': %d points, expected %d\n--- script ---\n%s\n", label, got, n, script);
        fail();
    }
    for (int i = 0; i < n; i++)
        if (gx[i] != x[i] || gy[i] != y[i]) {
            fprintf(stderr, "series '%s' point %d: (%.17g, %.17g), expected (%.17g, %.17g)\n", label, i, gx[i], gy[i],
                    x[i], y[i]);
            fail();
        }
}

static void test_error_vs_memory_frontier_and_series(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160], prog[160], captured[160];
    snprintf(db, sizeof db, "%s/cost.db", t->dir);
    snprintf(out, sizeof out, "%s/mem.png", t->dir);
    make_cost_db(db);
    make_fake_gnuplot(t->dir, prog, sizeof prog, captured, sizeof captured);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_MEMORY, out);
    o.gnuplot = prog;
    expect_ok(kvs_plot_make(db, &o));
    assert_true(kvs_test_exists(out));
    char *gp = NULL;
    size_t n = 0;
    expect_ok(kvs_read_file(captured, &gp, &n));

    const double fx[6] = {512, 1024, 2048, 3072, 4096, 6144};
    const double fy[6] = {0.09375, 0.046875, 0.0234375, 0.02, 0.015625, 0.01};
    expect_block(gp, "Pareto frontier (non-oracle runs)", 6, fx, fy);
    assert_int_equal(count_of(gp, "# series: Pareto frontier (non-oracle runs)\n"), 2); /* steps line + points */
    assert_non_null(strstr(gp, "with steps lw 8 lc rgb '#b8b8b8' title 'Pareto frontier (non-oracle runs)'"));
    /* One series per (policy, params, trace, measure); several traces and measures: both named. */
    const double ax[3] = {1024, 2048, 4096}, ay[3] = {0.0625, 0.03125, 0.015625};
    expect_block(gp, "h2o (heavy=0.5) [a.kvt, decode]", 3, ax, ay);
    const double bx[3] = {1536, 3072, 6144}, by[3] = {0.05, 0.02, 0.01};
    expect_block(gp, "h2o (heavy=0.5) [b.kvt, decode]", 3, bx, by);
    const double allx[3] = {1024, 2048, 4096}, ally[3] = {0.125, 0.0625, 0.03125};
    expect_block(gp, "h2o (heavy=0.5) [a.kvt, all]", 3, allx, ally);
    const double sx[3] = {512, 1024, 2048}, sy[3] = {0.09375, 0.046875, 0.0234375};
    expect_block(gp, "streaming (sinks=4) [a.kvt, decode]", 3, sx, sy);
    const double ox[3] = {2048, 4096, 8192}, oy[3] = {0.004, 0.002, 0.001};
    expect_block(gp, "topk (oracle) [a.kvt, decode]", 3, ox, oy);
    assert_int_equal(count_of(gp, "# series: "), 7);
    /* The oracle is dashed black; log x in bytes; axis labels from the metric table. */
    assert_non_null(strstr(gp, "dt 2 lc rgb '#000000' title 'topk (oracle) [a.kvt, decode]'"));
    assert_non_null(strstr(gp, "set logscale x 2"));
    assert_non_null(strstr(gp, "set xlabel 'resident bytes per KV head, mean over steps (storage_bytes_mean; log2 "
                               "scale)'"));
    assert_non_null(strstr(gp, "set ylabel 'rel. output error, mean (out_err_mean)'"));
    free(gp);

    /* error-vs-traffic with --x-stat max: x = traffic_bytes max (= the memory above); a filter to one trace
     * and measure drops both from the labels. */
    o = opts(KVS_PLOT_ERROR_VS_TRAFFIC, out);
    o.gnuplot = prog;
    o.x_stat = "max";
    o.trace = "a.kvt";
    o.measure = "decode";
    expect_ok(kvs_plot_make(db, &o));
    expect_ok(kvs_read_file(captured, &gp, &n));
    expect_block(gp, "h2o (heavy=0.5)", 3, ax, ay);
    expect_block(gp, "streaming (sinks=4)", 3, sx, sy);
    const double f2x[4] = {512, 1024, 2048, 4096}, f2y[4] = {0.09375, 0.046875, 0.0234375, 0.015625};
    expect_block(gp, "Pareto frontier (non-oracle runs)", 4, f2x, f2y);
    assert_non_null(strstr(gp, "traffic_bytes_max"));
    assert_int_equal(count_of(gp, "# series: "), 5);
    free(gp);

    /* x-stat mean of traffic is half of it; a higher-is-better metric keeps the highest y at no more bytes. */
    o.x_stat = NULL;
    o.metric = "attn_recall_mean"; /* agg_for: 1 - err/2 */
    o.trace = NULL;
    o.measure = NULL;
    expect_ok(kvs_plot_make(db, &o));
    expect_ok(kvs_read_file(captured, &gp, &n));
    const double rx[6] = {256, 512, 1024, 1536, 2048, 3072};
    const double ry[6] = {1 - 0.09375 / 2, 1 - 0.046875 / 2, 1 - 0.0234375 / 2, 1 - 0.02 / 2, 1 - 0.015625 / 2,
                          1 - 0.01 / 2};
    expect_block(gp, "Pareto frontier (non-oracle runs)", 6, rx, ry);
    free(gp);
}

/* The existing kinds keep traces and measure modes apart too (they used to average across traces). */
static void test_budget_series_separated_by_trace_and_measure(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160], prog[160], captured[160];
    snprintf(db, sizeof db, "%s/cost.db", t->dir);
    snprintf(out, sizeof out, "%s/budget.svg", t->dir);
    make_cost_db(db);
    make_fake_gnuplot(t->dir, prog, sizeof prog, captured, sizeof captured);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_BUDGET, out);
    o.gnuplot = prog;
    o.policy = "h2o";
    expect_ok(kvs_plot_make(db, &o));
    char *gp = NULL;
    size_t n = 0;
    expect_ok(kvs_read_file(captured, &gp, &n));
    const double bx[3] = {16, 32, 64};
    const double a[3] = {0.0625, 0.03125, 0.015625}, b[3] = {0.05, 0.02, 0.01}, all[3] = {0.125, 0.0625, 0.03125};
    expect_block(gp, "h2o (heavy=0.5) [a.kvt, decode]", 3, bx, a);
    expect_block(gp, "h2o (heavy=0.5) [b.kvt, decode]", 3, bx, b);
    expect_block(gp, "h2o (heavy=0.5) [a.kvt, all]", 3, bx, all);
    assert_int_equal(count_of(gp, "# series: "), 3);
    assert_null(strstr(gp, "Pareto")); /* only the cost kinds draw a frontier */
    free(gp);

    o = opts(KVS_PLOT_MEMORY_VS_BUDGET, out);
    o.gnuplot = prog;
    o.measure = "all";
    expect_ok(kvs_plot_make(db, &o));
    expect_ok(kvs_read_file(captured, &gp, &n));
    const double mem_mean[3] = {1024, 2048, 4096}; /* the mean, as on every memory axis (max = 2 x mean) */
    expect_block(gp, "h2o (heavy=0.5)", 3, bx, mem_mean);
    assert_int_equal(count_of(gp, "# series: "), 1);
    free(gp);
}

static void test_error_vs_memory_and_traffic_png_svg(void **state) {
    tmp_ctx *t = *state;
    skip_without_gnuplot();
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/cost.db", t->dir);
    make_cost_db(db);
    snprintf(out, sizeof out, "%s/mem.svg", t->dir);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_MEMORY, out);
    expect_ok(kvs_plot_make(db, &o));
    assert_image(out, 1);
    char *svg = NULL;
    size_t n = 0;
    expect_ok(kvs_read_file(out, &svg, &n));
    assert_non_null(strstr(svg, "Pareto frontier (non-oracle runs)"));
    assert_non_null(strstr(svg, "topk (oracle) [a.kvt, decode]"));
    assert_non_null(strstr(svg, "stroke-dasharray"));
    free(svg);
    snprintf(out, sizeof out, "%s/traffic.png", t->dir);
    o = opts(KVS_PLOT_ERROR_VS_TRAFFIC, out);
    o.metric = "out_err_p95";
    expect_ok(kvs_plot_make(db, &o));
    assert_image(out, 0);
    /* The setup database of the other tests: its runs record storage and traffic too. */
    snprintf(out, sizeof out, "%s/mem2.png", t->dir);
    o = opts(KVS_PLOT_ERROR_VS_MEMORY, out);
    expect_ok(kvs_plot_make(t->db, &o));
    assert_image(out, 0);
}

/* The script comes from one writer: kvs_plot_write_script() to a stream gives what gnuplot reads on its input,
 * but for the output file named by `set output`. */
static char *script_of(const kvs_plot *p, const char *image) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    assert_non_null(f);
    expect_ok(kvs_plot_write_script(p, image, f));
    assert_int_equal(fclose(f), 0);
    return buf;
}

/* A byte axis is labelled at the powers of two of the data's range as "512B", "1KiB" (gnuplot's %b/%B padded
 * them as "512  B"). The cost database's memory runs span 512 B .. 8 KiB. */
static void test_byte_axis_labels(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/cost_tics.db", t->dir);
    make_cost_db(db);
    snprintf(out, sizeof out, "%s/tics.png", t->dir);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_MEMORY, out);
    kvs_plot *p = NULL;
    expect_ok(kvs_plot_prepare(db, &o, &p));
    char *gp = script_of(p, out);
    assert_non_null(strstr(gp, "set xtics (\"512B\" 512, \"1KiB\" 1024, \"2KiB\" 2048, \"4KiB\" 4096, \"8KiB\" 8192)\n"));
    assert_null(strstr(gp, "%b"));
    free(gp);
    kvs_plot_free(p);
}

static int block_with_breaks(const char *script, const char *prefix, double *x, int *brk, int cap);
static int style_of(const char *script, const char *label, int nth, char color[8], int *dt, int *pt);
static int run_cli_io(char *const argv[], const char *path_dir, const char *out_path, const char *err_path);
static void make_fake_gnuplot_dir(const char *dir, char *bindir, size_t cap, char *captured, size_t ccap);

/* --log-y: the quality axis of error-vs-budget / -memory / -traffic on a log10 scale. A point at 0 (an exact
 * cache's error) cannot be drawn there: it is left out, the line breaks where it was, and the label counts it;
 * a series with none left keeps its key entry through one undefined point. Other kinds refuse the option. */
static void test_log_y_axis(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160], prog[160], captured[160];
    snprintf(db, sizeof db, "%s/logy.db", t->dir);
    snprintf(out, sizeof out, "%s/logy.png", t->dir);
    kvs_results_db *r = NULL;
    expect_ok(kvs_results_open(db, &r));
    /* h2o: errors 0.1, 0 (budget 32), 0.001; full: 0 everywhere; window: 0.2, 0.02, 0. */
    const double h2o[3] = {0.1, 0, 0.001}, win[3] = {0.2, 0.02, 0};
    for (int k = 0; k < 3; k++) {
        int64_t b = 16 << k;
        put_cost_run(r, "/traces/a.kvt", "h2o", "", 0, b, "decode", 1000.0 * (k + 1), h2o[k]);
        put_cost_run(r, "/traces/a.kvt", "full", "", 0, b, "decode", 8000.0 + k, 0);
        put_cost_run(r, "/traces/a.kvt", "window", "", 0, b, "decode", 500.0 * (k + 1), win[k]);
    }
    kvs_results_close(r);
    make_fake_gnuplot(t->dir, prog, sizeof prog, captured, sizeof captured);
    const kvs_plot_kind kinds[3] = {KVS_PLOT_ERROR_VS_MEMORY, KVS_PLOT_ERROR_VS_TRAFFIC, KVS_PLOT_ERROR_VS_BUDGET};
    for (int k = 0; k < 3; k++) {
        kvs_plot_options o = opts(kinds[k], out);
        kvs_plot *p = NULL;
        /* Linear by default: every point drawn, the labels as they were. */
        expect_ok(kvs_plot_prepare(db, &o, &p));
        char *gp = script_of(p, out);
        assert_null(strstr(gp, "set logscale y"));
        assert_null(strstr(gp, "not on the log axis"));
        assert_non_null(strstr(gp, "set ylabel 'rel. output error, mean (out_err_mean)'\n"));
        free(gp);
        kvs_plot_free(p);

        o.log_y = 1;
        o.gnuplot = prog;
        expect_ok(kvs_plot_make(db, &o));
        size_t n = 0;
        expect_ok(kvs_read_file(captured, &gp, &n));
        assert_non_null(strstr(gp, "\nset logscale y 10\n"));
        assert_non_null(strstr(gp, "set ylabel 'rel. output error, mean (out_err_mean; log scale)'\n"));
        double x[8], y[8];
        int brk[8];
        /* h2o's point at budget 32 is out; the line breaks before the next one rather than joining across. */
        assert_int_equal(block_with_breaks(gp, "h2o [1 of 3 points <= 0: not on the log axis]", x, brk, 8), 2);
        assert_true(brk[1] && !brk[0]);
        const double unit = kinds[k] == KVS_PLOT_ERROR_VS_MEMORY ? 1000 : kinds[k] == KVS_PLOT_ERROR_VS_TRAFFIC ? 500 : 16;
        assert_true(x[0] == unit && x[1] == (kinds[k] == KVS_PLOT_ERROR_VS_BUDGET ? 64 : 3 * unit));
        /* window's last point is out: no break needed. */
        assert_int_equal(data_block(gp, "window [1 of 3 points <= 0: not on the log axis]", x, y, 8), 2);
        assert_true(y[0] == 0.2 && y[1] == 0.02);
        /* full: nothing drawable, its key entry kept by one undefined point. */
        char full[160];
        snprintf(full, sizeof full, "# series: full [3 of 3 points <= 0: not on the log axis]\n%g NaN\ne\n",
                 kinds[k] == KVS_PLOT_ERROR_VS_MEMORY ? 8000. : kinds[k] == KVS_PLOT_ERROR_VS_TRAFFIC ? 4000. : 16.);
        assert_non_null(strstr(gp, full));
        assert_int_equal(count_of(gp, "title 'full [3 of 3 points <= 0: not on the log axis]'"), 1);
        if (kinds[k] != KVS_PLOT_ERROR_VS_BUDGET) {
            /* The frontier (lowest error at no more bytes) reaches full's 0: that point is left off too, counted. */
            assert_non_null(strstr(gp, "# series: Pareto frontier (non-oracle runs) [1 of "));
        }
        free(gp);
    }
    /* The kinds without a quality axis to log refuse it. */
    const kvs_plot_kind refused[2] = {KVS_PLOT_MEMORY_VS_BUDGET, KVS_PLOT_ERROR_VS_POSITION};
    for (int k = 0; k < 2; k++) {
        kvs_plot_options o = opts(refused[k], out);
        o.log_y = 1;
        kvs_plot *p = NULL;
        assert_int_equal(kvs_plot_prepare(db, &o, &p), KVS_ERR_INVALID_ARG);
        expect_msg("--log-y applies to --kind error-vs-budget, error-vs-memory and error-vs-traffic");
        assert_null(p);
    }
}

/* One convention for every memory and traffic axis: the statistic over the run's steps (mean unless asked),
 * per KV head, named on the axis with its column and unit, log2 with B/KiB tics; memory-vs-budget (once the
 * peak, storage_bytes_max, unlabelled as such) included. The data drawn is that statistic. */
static void test_memory_axes_share_one_convention(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/memaxes.db", t->dir);
    snprintf(out, sizeof out, "%s/memaxes.png", t->dir);
    make_cost_db(db);
    struct {
        kvs_plot_kind kind;
        const char *metric, *x_stat, *axis, *label;
    } cases[5] = {
        {KVS_PLOT_MEMORY_VS_BUDGET, NULL, NULL, "y",
         "resident bytes per KV head, mean over steps (storage_bytes_mean; log2 scale)"},
        {KVS_PLOT_MEMORY_VS_BUDGET, "storage_bytes_max", NULL, "y",
         "resident bytes per KV head, max over steps (storage_bytes_max; log2 scale)"},
        {KVS_PLOT_ERROR_VS_MEMORY, NULL, NULL, "x",
         "resident bytes per KV head, mean over steps (storage_bytes_mean; log2 scale)"},
        {KVS_PLOT_ERROR_VS_MEMORY, NULL, "max", "x",
         "resident bytes per KV head, max over steps (storage_bytes_max; log2 scale)"},
        {KVS_PLOT_ERROR_VS_TRAFFIC, NULL, NULL, "x",
         "traffic bytes/step per KV head, mean over steps (traffic_bytes_mean; log2 scale)"},
    };
    for (int c = 0; c < 5; c++) {
        kvs_plot_options o = opts(cases[c].kind, out);
        o.metric = cases[c].metric;
        o.x_stat = cases[c].x_stat;
        o.trace = "a.kvt";
        o.measure = "decode";
        o.policy = "h2o";
        kvs_plot *p = NULL;
        expect_ok(kvs_plot_prepare(db, &o, &p));
        char *gp = script_of(p, out), want[300];
        snprintf(want, sizeof want, "\nset %slabel '%s'\n", cases[c].axis, cases[c].label);
        if (!strstr(gp, want)) {
            fprintf(stderr, "case %d: no '%s' in\n%.1500s\n", c, want + 1, gp);
            fail();
        }
        snprintf(want, sizeof want, "\nset logscale %s 2\n", cases[c].axis);
        assert_non_null(strstr(gp, want));
        snprintf(want, sizeof want, "\nset %stics (\"", cases[c].axis);
        assert_non_null(strstr(gp, want));
        /* h2o on a.kvt, decode: storage mean 1024, 2048, 4096 (max twice that), traffic mean half of it. */
        double x[4], y[4];
        assert_int_equal(data_block(gp, "h2o (heavy=0.5)", x, y, 4), 3);
        double mem = cases[c].kind == KVS_PLOT_MEMORY_VS_BUDGET ? y[0] : x[0];
        int is_max = (cases[c].metric && strstr(cases[c].metric, "max")) || cases[c].x_stat;
        double want_mem = cases[c].kind == KVS_PLOT_ERROR_VS_TRAFFIC ? 512 : is_max ? 2048 : 1024;
        assert_true(mem == want_mem);
        free(gp);
        kvs_plot_free(p);
    }
}

/* One complete run on trace `path` whose content hash `sha` (NULL: none recorded) and replay `options` (NULL:
 * not recorded, as older databases) are given; storage and traffic `mem`, out_err `err`. */
static void put_bytes_run(kvs_results_db *db, const char *path, const char *sha, const char *policy, const char *options,
                          int64_t budget, double mem, double err) {
    kvs_results_trace tr = {.path = path, .model_name = "generated-gaussian", .n_positions = 64, .prompt_len = 40,
                            .n_turns = 1, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 16,
                            .dtype = "fp32", .file_bytes = 1000};
    int64_t trace_id = 0;
    if (sha) expect_ok(kvs_results_sweep_trace(db, &tr, sha, &trace_id));
    kvs_results_run run = {.policy = policy, .params = "", .budget_tokens = budget, .budget_fraction = -1,
                           .measure = "decode", .status = "complete", .wall_seconds = 0.01, .kvsim_version = "0.1.0",
                           .options = options};
    kvs_results_agg a = agg_for(-1, err, mem), l = a;
    l.layer = 0;
    expect_ok(kvs_results_write_run(db, &tr, &run, &l, 1, &a, NULL, 0, NULL));
}

/* 1 when (x, y) is the point of one of the n runs. */
static int is_run_point(double x, double y, const double (*runs)[2], int n) {
    for (int i = 0; i < n; i++)
        if (runs[i][0] == x && runs[i][1] == y) return 1;
    return 0;
}

/* A series is one (policy, params, trace content, measure, kv_bytes, aux_bytes): runs replayed with other
 * element sizes are never averaged into one point (window at budget 8 with 1 and 4 bytes per element was drawn
 * at 640 B, between its 256 B and 1 KiB, and the frontier went through it); one trace through two path
 * spellings (two trace rows, one SHA-256) is one series; traces are named "<model>@<8 hex>". The frontier is
 * made of runs' own points, never of an average. */
static void test_series_keyed_by_trace_content_and_bytes(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/bytes.db", t->dir);
    snprintf(out, sizeof out, "%s/bytes.png", t->dir);
    const char *sha_a = "3f2a9c01aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const char *sha_b = "77e1b0c2bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const char *kv1 = "kv_bytes=1,aux_bytes=4,series_every=0", *kv4 = "kv_bytes=4,aux_bytes=4,series_every=0";
    kvs_results_db *r = NULL;
    expect_ok(kvs_results_open(db, &r));
    /* window, 4 bytes: trace A through two spellings, the same numbers; window, 1 byte: trace A; h2o: trace B. */
    const double runs[7][2] = {{1024, 0.5}, {2048, 0.3}, {256, 0.5}, {512, 0.3}, {4096, 0.1}, {256, 0.4}, {0, 0}};
    put_bytes_run(r, "/traces/a.kvt", sha_a, "window", kv4, 8, 1024, 0.5);
    put_bytes_run(r, "/traces/a.kvt", sha_a, "window", kv4, 16, 2048, 0.3);
    put_bytes_run(r, "/data/../traces/a.kvt", sha_a, "window", kv4, 8, 1024, 0.5);
    put_bytes_run(r, "/data/../traces/a.kvt", sha_a, "window", kv4, 16, 2048, 0.3);
    put_bytes_run(r, "/traces/a.kvt", sha_a, "window", kv1, 8, 256, 0.5);
    put_bytes_run(r, "/traces/a.kvt", sha_a, "window", kv1, 16, 512, 0.3);
    put_bytes_run(r, "/traces/b.kvt", sha_b, "h2o", kv4, 16, 4096, 0.1);
    kvs_results_close(r);

    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_MEMORY, out);
    kvs_plot *p = NULL;
    expect_ok(kvs_plot_prepare(db, &o, &p));
    char *gp = script_of(p, out);
    const double w4x[2] = {1024, 2048}, w1x[2] = {256, 512}, wy[2] = {0.5, 0.3}, hx[1] = {4096}, hy[1] = {0.1};
    expect_block(gp, "window [generated-gaussian@3f2a9c01, kv_bytes=4]", 2, w4x, wy);
    expect_block(gp, "window [generated-gaussian@3f2a9c01, kv_bytes=1]", 2, w1x, wy);
    expect_block(gp, "h2o [generated-gaussian@77e1b0c2, kv_bytes=4]", 1, hx, hy);
    const double fx[3] = {256, 512, 4096}, fy[3] = {0.5, 0.3, 0.1};
    expect_block(gp, "Pareto frontier (non-oracle runs)", 3, fx, fy);
    assert_int_equal(count_of(gp, "# series: "), 5); /* 3 series + the frontier's line and points */
    assert_int_equal(kvs_plot_n_series(p), 4);
    assert_null(strstr(gp, "\n640 ")); /* no averaged point */
    /* The two window series are told apart by point and dash as well as by label. */
    char c1[8], c4[8];
    int dt1, pt1, dt4, pt4;
    assert_true(style_of(gp, "window [generated-gaussian@3f2a9c01, kv_bytes=1]", 0, c1, &dt1, &pt1));
    assert_true(style_of(gp, "window [generated-gaussian@3f2a9c01, kv_bytes=4]", 0, c4, &dt4, &pt4));
    assert_string_equal(c1, c4);
    assert_false(dt1 == dt4 && pt1 == pt4);
    free(gp);
    kvs_plot_free(p);

    /* The same on error-vs-budget: two window series, each point one run's (not the mean 640 B / 0.5). */
    o = opts(KVS_PLOT_MEMORY_VS_BUDGET, out);
    o.policy = "window";
    expect_ok(kvs_plot_prepare(db, &o, &p));
    gp = script_of(p, out);
    const double bx[2] = {8, 16};
    expect_block(gp, "window [kv_bytes=1]", 2, bx, w1x);
    expect_block(gp, "window [kv_bytes=4]", 2, bx, w4x);
    assert_int_equal(count_of(gp, "# series: "), 2);
    free(gp);
    kvs_plot_free(p);

    /* Repeated runs of one configuration that disagree (here window 1 byte at budget 8 again, error 0.4): the
     * series point is their mean, (256, 0.45), which no run measured; the frontier takes the run (256, 0.4). */
    expect_ok(kvs_results_open(db, &r));
    put_bytes_run(r, "/traces/a.kvt", sha_a, "window", kv1, 8, 256, 0.4);
    kvs_results_close(r);
    o = opts(KVS_PLOT_ERROR_VS_MEMORY, out);
    expect_ok(kvs_plot_prepare(db, &o, &p));
    gp = script_of(p, out);
    const double w1y[2] = {0.45, 0.3};
    expect_block(gp, "window [generated-gaussian@3f2a9c01, kv_bytes=1]", 2, w1x, w1y);
    double x[8], y[8];
    int nf = data_block(gp, "Pareto frontier (non-oracle runs)", x, y, 8);
    assert_int_equal(nf, 3);
    for (int i = 0; i < nf; i++) assert_true(is_run_point(x[i], y[i], runs, 6));
    assert_true(x[0] == 256 && y[0] == 0.4);
    free(gp);
    kvs_plot_free(p);

    /* Runs recorded before options and hashes existed: one series per trace row, named by file name. */
    snprintf(db, sizeof db, "%s/old.db", t->dir);
    expect_ok(kvs_results_open(db, &r));
    put_bytes_run(r, "/traces/a.kvt", NULL, "window", NULL, 8, 1024, 0.5);
    put_bytes_run(r, "/other/a.kvt", NULL, "window", NULL, 8, 1024, 0.5);
    put_bytes_run(r, "/traces/c.kvt", NULL, "window", NULL, 8, 1024, 0.5);
    kvs_results_close(r);
    expect_ok(kvs_plot_prepare(db, &o, &p));
    gp = script_of(p, out);
    assert_non_null(strstr(gp, "# series: window [c.kvt]\n"));
    assert_non_null(strstr(gp, "# series: window [/traces/a.kvt #1]\n"));
    assert_non_null(strstr(gp, "# series: window [/other/a.kvt #2]\n"));
    assert_null(strstr(gp, "kv_bytes"));
    free(gp);
    kvs_plot_free(p);
}

/* One complete run of `policy` on trace `path` (content hash `sha`) with KV codec `codec` (NULL: K/V as captured):
 * storage and traffic `mem`, out_err `err`; options end with ",codec=SPEC" as `kvsim replay --codec` writes them. */
static void put_codec_run(kvs_results_db *db, const char *path, const char *sha, const char *policy, const char *codec,
                          int64_t budget, double mem, double err) {
    kvs_results_trace tr = {.path = path, .model_name = "generated-gaussian", .n_positions = 64, .prompt_len = 40,
                            .n_turns = 1, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 16,
                            .dtype = "fp32", .file_bytes = 1000};
    int64_t trace_id = 0;
    expect_ok(kvs_results_sweep_trace(db, &tr, sha, &trace_id));
    char options[256];
    snprintf(options, sizeof options, "kv_bytes=2,aux_bytes=4,series_every=0%s%s", codec ? ",codec=" : "",
             codec ? codec : "");
    kvs_results_run run = {.policy = policy, .params = "", .budget_tokens = budget, .budget_fraction = -1,
                           .measure = "decode", .status = "complete", .wall_seconds = 0.01, .kvsim_version = "0.1.0",
                           .options = options, .codec = codec};
    kvs_results_agg a = agg_for(-1, err, mem), l = a;
    l.layer = 0;
    expect_ok(kvs_results_write_run(db, &tr, &run, &l, 1, &a, NULL, 0, NULL));
}

#define INT4 "int:bits=4,group=32,k_axis=token,v_axis=channel"

/* A paged run (kvsim replay --page N) is its own series beside the same policy at token granularity (they were
 * averaged into one point no run measured), labelled "policy [page N]" after the policy's own line and drawn thin;
 * pages mapped by the policy's scores (page_score=max) are another series again, "policy [page N max]", after the
 * count rule's. */
static void test_paged_runs_are_their_own_series(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/page.db", t->dir);
    snprintf(out, sizeof out, "%s/page.png", t->dir);
    const char *sha = "3f2a9c01aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    kvs_results_db *r = NULL;
    expect_ok(kvs_results_open(db, &r));
    kvs_results_trace tr = {.path = "/traces/a.kvt", .model_name = "generated-gaussian", .n_positions = 64,
                            .prompt_len = 40, .n_turns = 1, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1,
                            .head_dim = 16, .dtype = "fp32", .file_bytes = 1000};
    int64_t trace_id = 0;
    expect_ok(kvs_results_sweep_trace(r, &tr, sha, &trace_id));
    const struct { int64_t page, budget; double mem, err; const char *rule; } runs[] = {
        {0, 8, 1024, 0.5, NULL},      {0, 16, 2048, 0.3, NULL},     {4, 8, 1536, 0.6, "count"},
        {4, 16, 2560, 0.4, "count"},  {4, 8, 1500, 0.55, "max"},    {4, 16, 2500, 0.35, "max"}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        char options[128];
        snprintf(options, sizeof options, "kv_bytes=2,aux_bytes=4,series_every=0%s%s",
                 runs[i].page ? ",page=4,page_score=" : "", runs[i].rule ? runs[i].rule : "");
        kvs_results_run run = {.policy = "window", .params = "", .budget_tokens = runs[i].budget,
                               .budget_fraction = -1, .measure = "decode", .status = "complete", .wall_seconds = 0.01,
                               .kvsim_version = "0.1.0", .options = options, .page = runs[i].page};
        kvs_results_agg a = agg_for(-1, runs[i].err, runs[i].mem), l = a;
        l.layer = 0;
        expect_ok(kvs_results_write_run(r, &tr, &run, &l, 1, &a, NULL, 0, NULL));
    }
    kvs_results_close(r);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_MEMORY, out);
    kvs_plot *p = NULL;
    expect_ok(kvs_plot_prepare(db, &o, &p));
    char *gp = script_of(p, out);
    const double wx[2] = {1024, 2048}, wy[2] = {0.5, 0.3}, px[2] = {1536, 2560}, py[2] = {0.6, 0.4},
                 mx[2] = {1500, 2500}, my[2] = {0.55, 0.35};
    expect_block(gp, "window", 2, wx, wy);
    expect_block(gp, "window [page 4]", 2, px, py);
    expect_block(gp, "window [page 4 max]", 2, mx, my);
    assert_int_equal(kvs_plot_n_series(p), 4); /* and the frontier */
    const char *w0 = strstr(gp, "# series: window\n"), *w1 = strstr(gp, "# series: window [page 4]\n"),
               *w2 = strstr(gp, "# series: window [page 4 max]\n");
    assert_true(w0 && w1 && w2 && w0 < w1 && w1 < w2);
    const char *line1 = strstr(gp, "title 'window [page 4]");
    assert_non_null(line1);
    while (line1 > gp && line1[-1] != '\n') line1--;
    assert_true(strstr(line1, "with linespoints lw 1 ") && strstr(line1, "with linespoints lw 1 ") < strstr(line1, "title"));
    free(gp);
    kvs_plot_free(p);
}

/* A KV codec's runs are their own series (they were averaged with the same policy's runs on K/V as captured: window
 * and window+int4 at budget 8 drew one point at the mean of 1024 B and 320 B), labelled "policy [codec]" after the
 * policy's own line, in the policy's colour drawn thin (lw 1, K/V as captured lw 2); the frontier runs over
 * policies x codecs; across traces a codec is its own line too. */
static void test_codec_runs_are_their_own_series(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/codec.db", t->dir);
    snprintf(out, sizeof out, "%s/codec.png", t->dir);
    const char *sha_a = "3f2a9c01aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const char *sha_b = "77e1b0c2bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    kvs_results_db *r = NULL;
    expect_ok(kvs_results_open(db, &r));
    /* trace A: window on K/V as captured, window with int4 (a quarter of the bytes plus scales), h2o with int4 */
    put_codec_run(r, "/traces/a.kvt", sha_a, "window", NULL, 8, 1024, 0.5);
    put_codec_run(r, "/traces/a.kvt", sha_a, "window", NULL, 16, 2048, 0.3);
    put_codec_run(r, "/traces/a.kvt", sha_a, "window", INT4, 8, 320, 0.55);
    put_codec_run(r, "/traces/a.kvt", sha_a, "window", INT4, 16, 640, 0.35);
    put_codec_run(r, "/traces/a.kvt", sha_a, "h2o", INT4, 16, 1280, 0.2);
    kvs_results_close(r);

    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_MEMORY, out);
    kvs_plot *p = NULL;
    expect_ok(kvs_plot_prepare(db, &o, &p));
    char *gp = script_of(p, out);
    const double wx[2] = {1024, 2048}, wy[2] = {0.5, 0.3}, qx[2] = {320, 640}, qy[2] = {0.55, 0.35};
    const double hx[1] = {1280}, hy[1] = {0.2};
    expect_block(gp, "window", 2, wx, wy);
    expect_block(gp, "window [" INT4 "]", 2, qx, qy);
    expect_block(gp, "h2o [" INT4 "]", 1, hx, hy);
    assert_int_equal(kvs_plot_n_series(p), 4);
    /* the frontier (lowest error at no more memory) over every run, codec or not: (320, .55) (640, .35) (1280, .2) */
    const double fx[3] = {320, 640, 1280}, fy[3] = {0.55, 0.35, 0.2};
    expect_block(gp, "Pareto frontier (non-oracle runs)", 3, fx, fy);
    /* legend order: window's own line, then its codec's */
    const char *w0 = strstr(gp, "# series: window\n"), *w1 = strstr(gp, "# series: window [");
    assert_true(w0 && w1 && w0 < w1);
    /* the style rule: the policy's colour; the codec's line thin, another (point, dash) */
    char c0[8], c1[8], ch[8];
    int dt0, pt0, dt1, pt1, dth, pth;
    assert_true(style_of(gp, "window'", 0, c0, &dt0, &pt0));
    assert_true(style_of(gp, "window [", 0, c1, &dt1, &pt1));
    assert_true(style_of(gp, "h2o [", 0, ch, &dth, &pth));
    assert_string_equal(c0, c1);
    assert_string_equal(c0, kvs_plot_policy_color("window"));
    assert_string_equal(ch, kvs_plot_policy_color("h2o"));
    assert_false(dt0 == dt1 && pt0 == pt1);
    kvs_plot_style h0 = kvs_plot_policy_style("h2o", 0, 0), wv1 = kvs_plot_policy_style("window", 1, 0);
    assert_true(dth == h0.dash && pth == h0.point); /* h2o's only series: its own style, thin */
    assert_true(dt1 == wv1.dash && pt1 == wv1.point);
    const char *line0 = strstr(gp, "title 'window'"), *line1 = strstr(gp, "title 'window [");
    assert_true(line0 && line1);
    while (line0 > gp && line0[-1] != '\n') line0--;
    while (line1 > gp && line1[-1] != '\n') line1--;
    assert_true(strstr(line0, "with linespoints lw 2 ") && strstr(line0, "with linespoints lw 2 ") < strstr(line0, "title"));
    assert_true(strstr(line1, "with linespoints lw 1 ") && strstr(line1, "with linespoints lw 1 ") < strstr(line1, "title"));
    free(gp);
    kvs_plot_free(p);

    /* error-vs-budget: each series' points are its own runs' (no mean of 1024 B and 320 B at budget 8) */
    o = opts(KVS_PLOT_MEMORY_VS_BUDGET, out);
    o.policy = "window";
    expect_ok(kvs_plot_prepare(db, &o, &p));
    gp = script_of(p, out);
    const double bx[2] = {8, 16};
    expect_block(gp, "window", 2, bx, wx);
    expect_block(gp, "window [" INT4 "]", 2, bx, qx);
    assert_null(strstr(gp, "\n8 672\n"));
    free(gp);
    kvs_plot_free(p);

    /* across traces: a second trace; window's line and window+int4's line, each over its two traces */
    expect_ok(kvs_results_open(db, &r));
    put_codec_run(r, "/traces/b.kvt", sha_b, "window", NULL, 8, 1024, 0.7);
    put_codec_run(r, "/traces/b.kvt", sha_b, "window", INT4, 8, 320, 0.75);
    kvs_results_close(r);
    o = opts(KVS_PLOT_ERROR_VS_MEMORY, out);
    o.policy = "window";
    o.across_traces = 1;
    expect_ok(kvs_plot_prepare(db, &o, &p));
    gp = script_of(p, out);
    assert_non_null(strstr(gp, "# series: window (n=1 to 2 traces)\n"));
    assert_non_null(strstr(gp, "# series: window [" INT4 "] (n=1 to 2 traces)\n"));
    /* budget 8's point of each line: the mean of its two traces' runs, x and y */
    const char *q8 = strstr(gp, "# series: window [" INT4 "] (n=1 to 2 traces)\n");
    double x = 0, y = 0;
    assert_int_equal(sscanf(strchr(q8, '\n') + 1, "%lf %lf", &x, &y), 2);
    assert_float_equal(x, 320, 1e-9);
    assert_float_equal(y, (0.55 + 0.75) / 2, 1e-12);
    const char *w8 = strstr(gp, "# series: window (n=1 to 2 traces)\n");
    assert_int_equal(sscanf(strchr(w8, '\n') + 1, "%lf %lf", &x, &y), 2);
    assert_float_equal(x, 1024, 1e-9);
    assert_float_equal(y, (0.5 + 0.7) / 2, 1e-12);
    free(gp);
    kvs_plot_free(p);
}

/* Through the CLI on the bundled trace: window replayed with --kv-bytes 4 through two spellings of the trace's
 * path and with --kv-bytes 1; error-vs-memory draws two window series (not one averaged over element sizes,
 * nor one per path spelling), and every frontier point is a run's own (storage, error). */
static void test_cli_bytes_and_path_spellings(void **state) {
    tmp_ctx *t = *state;
    if (!getenv("KVSIM_BIN")) skip();
    char trace1[400], trace2[400], db[160], out[160], bindir[200], captured[200];
    snprintf(trace1, sizeof trace1, "%s/examples/stories260K.kvt", kvs_test_root());
    snprintf(trace2, sizeof trace2, "%s/examples/./../examples/stories260K.kvt", kvs_test_root());
    if (!kvs_test_exists(trace1)) {
        fprintf(stderr, "SKIP: %s is missing\n", trace1);
        skip();
    }
    snprintf(db, sizeof db, "%s/cli_bytes.db", t->dir);
    snprintf(out, sizeof out, "%s/cli_bytes.png", t->dir);
    char *rep1[] = {"kvsim", "replay", trace1, "--db", db, "--policy", "window", "--budgets", "8,16", "--kv-bytes", "1",
                    "--no-progress", NULL};
    char *rep4a[] = {"kvsim", "replay", trace1, "--db", db, "--policy", "window", "--budgets", "8,16", "--kv-bytes", "4",
                     "--no-progress", NULL};
    char *rep4b[] = {"kvsim", "replay", trace2, "--db", db, "--policy", "window", "--budgets", "8,16", "--kv-bytes", "4",
                     "--no-progress", NULL};
    assert_int_equal(run_cli_io(rep1, NULL, NULL, NULL), 0);
    assert_int_equal(run_cli_io(rep4a, NULL, NULL, NULL), 0);
    assert_int_equal(run_cli_io(rep4b, NULL, NULL, NULL), 0);
    /* The runs as recorded: (storage_bytes mean, out_err mean) of each of the 6. */
    kvs_results_db *r = NULL;
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    expect_ok(kvs_results_open_readonly(db, &r));
    expect_ok(kvs_results_query_runs(r, NULL, &rows, &n));
    assert_int_equal(n, 6);
    double runs[6][2];
    for (int64_t i = 0; i < n; i++) {
        runs[i][0] = rows[i].agg.storage_bytes.mean;
        runs[i][1] = rows[i].agg.out_err.mean;
    }
    assert_true(runs[0][0] * 4 == runs[2][0]); /* 1 and 4 bytes per element: a quarter of the bytes */
    kvs_results_run_rows_free(rows, n);
    kvs_results_close(r);

    make_fake_gnuplot_dir(t->dir, bindir, sizeof bindir, captured, sizeof captured);
    char *plot[] = {"kvsim", "plot", db, "--kind", "error-vs-memory", "--out", out, NULL};
    assert_int_equal(run_cli_io(plot, bindir, NULL, NULL), 0);
    char *gp = NULL;
    size_t len = 0;
    expect_ok(kvs_read_file(captured, &gp, &len));
    double x[8], y[8];
    assert_int_equal(data_block(gp, "window [kv_bytes=1]", x, y, 8), 2);
    for (int i = 0; i < 2; i++) assert_true(x[i] == runs[i][0] && y[i] == runs[i][1]);
    assert_int_equal(data_block(gp, "window [kv_bytes=4]", x, y, 8), 2);
    for (int i = 0; i < 2; i++) assert_true(x[i] == runs[2 + i][0] && y[i] == runs[2 + i][1]);
    assert_int_equal(count_of(gp, "# series: "), 4); /* 2 series + the frontier's line and points */
    int nf = data_block(gp, "Pareto frontier (non-oracle runs)", x, y, 8);
    assert_true(nf >= 1);
    for (int i = 0; i < nf; i++) assert_true(is_run_point(x[i], y[i], (const double(*)[2])runs, 6));
    free(gp);
}

/* A prompt-only policy's line on a plot by nominal budget says so in its label (its runs hold every generated
 * token beyond that budget, as the runs table's flag P says); on a plot by measured bytes it needs no warning. */
static void test_prompt_only_budget_labelled_on_budget_plots(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/scope.db", t->dir);
    kvs_results_db *r = NULL;
    expect_ok(kvs_results_open(db, &r));
    kvs_results_trace tr = {.path = "/traces/a.kvt", .model_name = "generated-gaussian", .n_positions = 64,
                            .prompt_len = 40, .n_turns = 1, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1,
                            .head_dim = 16, .dtype = "fp32", .file_bytes = 1000};
    for (int k = 0; k < 2; k++) {
        kvs_results_run run = {.policy = k ? "snapkv" : "window", .params = "", .budget_tokens = 16, .budget_fraction = -1,
                               .measure = "decode", .budget_scope = k ? "prompt" : "every_step", .status = "complete",
                               .wall_seconds = 0.01, .kvsim_version = "0.1.0"};
        kvs_results_agg a = agg_for(-1, 0.1, 1024.0 * (k + 1)), l = a;
        l.layer = 0;
        expect_ok(kvs_results_write_run(r, &tr, &run, &l, 1, &a, NULL, 0, NULL));
    }
    kvs_results_close(r);
    snprintf(out, sizeof out, "%s/scope.png", t->dir);
    const kvs_plot_kind kinds[] = {KVS_PLOT_ERROR_VS_BUDGET, KVS_PLOT_MEMORY_VS_BUDGET, KVS_PLOT_ERROR_VS_MEMORY};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        kvs_plot_options o = opts(kinds[i], out);
        kvs_plot *p = NULL;
        expect_ok(kvs_plot_prepare(db, &o, &p));
        char *gp = script_of(p, out);
        if (kinds[i] == KVS_PLOT_ERROR_VS_MEMORY) assert_null(strstr(gp, "prompt-only"));
        else assert_non_null(strstr(gp, "title 'snapkv (prompt-only budget)'"));
        assert_non_null(strstr(gp, "title 'window'"));
        free(gp);
        kvs_plot_free(p);
    }
}

static void test_script_written_to_a_stream_is_what_gnuplot_reads(void **state) {
    tmp_ctx *t = *state;
    char out[160], prog[160], captured[160], image[400];
    snprintf(out, sizeof out, "%s/same.png", t->dir);
    make_fake_gnuplot(t->dir, prog, sizeof prog, captured, sizeof captured);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_POSITION, out);
    o.gnuplot = prog;
    o.budget_tokens = 32;
    kvs_plot *p = NULL;
    expect_ok(kvs_plot_prepare(t->db, &o, &p));
    assert_int_equal(kvs_plot_n_series(p), 3);
    expect_ok(kvs_plot_render(p));
    char *gp = NULL;
    size_t n = 0;
    expect_ok(kvs_read_file(captured, &gp, &n));
    /* gnuplot draws into a temporary folder (the image is then copied into --out): the script names it. */
    const char *so = strstr(gp, "\nset output '");
    assert_non_null(so);
    assert_int_equal(sscanf(so, "\nset output '%399[^']'", image), 1);
    assert_null(strstr(image, t->dir));
    char *mine = script_of(p, image);
    assert_string_equal(mine, gp);
    free(mine);
    free(gp);
    kvs_plot_free(p);
    kvs_plot_free(NULL);
    assert_int_equal(kvs_plot_prepare(t->empty, &o, &p), KVS_ERR_DB);
    assert_null(p);
}

/* ------------------------------------------------------------------------------------------------
 * Legend layout: every series gets a readable entry, on every kind
 * ---------------------------------------------------------------------------------------------- */

/* The main job's ten policies with their full parameter strings (the longest labels kvsim writes). */
static const char *const main_job[10][2] = {
    {"full", ""},
    {"window", ""},
    {"streaming", "sinks=4"},
    {"h2o", "recent=0.5,gqa=expand"},
    {"tova", "mode=layer,protect_current=false"},
    {"topk", "gqa=group"},
    {"scissorhands", "history=32,recent=8,drop=1,threshold=1,gqa=expand"},
    {"snapkv", "window=32,kernel=7,pool=max,gqa=expand"},
    {"pyramidkv", "window=32,kernel=7,pool=max,gqa=expand,beta=20,fidelity=paper"},
    {"adakv", "window=32,kernel=7,pool=max,gqa=mean,alpha=0.2"},
};

/* A study of the main job's policies at `n_budgets` budgets (16, 32, ...), every run with steps. */
static void make_main_job_db(const char *path, int n_budgets) {
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(path, &db));
    for (int b = 0; b < n_budgets; b++)
        for (int i = 0; i < 10; i++)
            put_run(db, main_job[i][0], main_job[i][1], !strcmp(main_job[i][0], "topk"), 16 << b, 1);
    kvs_results_close(db);
}

/* What the script asks of gnuplot's key: canvas size, key columns, and the legend titles. */
typedef struct {
    int width, height, maxcols, n_titles, longest;
} key_request;

/* UTF-8 characters of s[0..n). */
static int utf8_chars(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static key_request key_request_of(const char *script) {
    key_request k = {0};
    const char *term = strstr(script, "set terminal ");
    assert_non_null(term);
    const char *size = strstr(term, " size ");
    assert_non_null(size);
    assert_int_equal(sscanf(size, " size %d,%d", &k.width, &k.height), 2);
    const char *key = strstr(script, "\nset key ");
    assert_non_null(key);
    const char *mc = strstr(key, " maxcols "), *eol = strchr(key + 1, '\n');
    if (mc && mc < eol) assert_int_equal(sscanf(mc, " maxcols %d", &k.maxcols), 1);
    /* Titled plot elements: "... lc rgb '#rrggbb' title 'LABEL'" (the test labels hold no quote). */
    for (const char *p = strstr(script, "' title '"); p; p = strstr(p + 1, "' title '")) {
        const char *b = p + strlen("' title '"), *e = strchr(b, '\'');
        assert_non_null(e);
        int n = utf8_chars(b, (size_t)(e - b));
        if (n > k.longest) k.longest = n;
        k.n_titles++;
    }
    return k;
}

/* Every series has a legend entry, and the key gnuplot lays out fits the canvas: a horizontal key below the
 * plot with at most `maxcols` columns, each as wide as gnuplot's estimate of the longest title at its
 * character width (8 px for these terminals) plus the line sample (6 characters), and a canvas tall enough
 * for the rows of the key under a plot area of the same height as with few series. */
static void expect_key_fits(const kvs_plot *p, const char *script, int n_series) {
    key_request k = key_request_of(script);
    kvs_plot_layout l = kvs_plot_layout_of(p);
    if (k.n_titles != n_series || l.n_entries != n_series) {
        fprintf(stderr, "%d legend titles (layout: %d) for %d series\n--- script ---\n%.4000s\n", k.n_titles,
                l.n_entries, n_series, script);
        fail();
    }
    assert_int_equal(k.longest, l.longest);
    if (k.maxcols < 1 || k.maxcols * 8 * (k.longest + 6) > k.width) {
        fprintf(stderr, "key of %d columns of %d characters, canvas %d px wide\n", k.maxcols, k.longest, k.width);
        fail();
    }
    int rows = (n_series + k.maxcols - 1) / k.maxcols;
    assert_int_equal(k.maxcols, l.key_cols);
    assert_int_equal(rows, l.key_rows);
    assert_true(l.key_cols * l.key_rows >= n_series);
    assert_int_equal(k.width, l.width);
    assert_int_equal(k.height, l.height);
    assert_int_equal(l.height, l.plot_height + l.key_height);
    assert_true(l.key_height >= (rows + 1) * 16); /* gnuplot's row: 15.5 px (PNG), 16.5 px (SVG) */
}

static void test_legend_has_every_series_and_fits(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/main.db", t->dir);
    snprintf(out, sizeof out, "%s/legend.png", t->dir);
    make_main_job_db(db, 5);
    static const kvs_plot_kind kinds[3] = {KVS_PLOT_ERROR_VS_POSITION, KVS_PLOT_ERROR_VS_BUDGET,
                                           KVS_PLOT_ERROR_VS_MEMORY};
    int plot_height = 0;
    for (int k = 0; k < 3; k++) {
        kvs_plot_options o = opts(kinds[k], out);
        if (kinds[k] == KVS_PLOT_ERROR_VS_POSITION) o.budget_tokens = 32;
        kvs_plot *p = NULL;
        expect_ok(kvs_plot_prepare(db, &o, &p));
        char *gp = script_of(p, out);
        /* error-vs-memory adds the Pareto frontier: one more legend entry (its points element has none). */
        expect_key_fits(p, gp, kinds[k] == KVS_PLOT_ERROR_VS_MEMORY ? 11 : 10);
        plot_height = kvs_plot_layout_of(p).plot_height;
        free(gp);
        kvs_plot_free(p);
    }
    /* Every run of the study on one error-vs-position plot: 50 entries, the same rules, a taller canvas over a
     * plot area of the same height; SVG too. */
    snprintf(out, sizeof out, "%s/legend.svg", t->dir);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_POSITION, out);
    kvs_plot *p = NULL;
    expect_ok(kvs_plot_prepare(db, &o, &p));
    char *gp = script_of(p, out);
    expect_key_fits(p, gp, 50);
    assert_int_equal(kvs_plot_layout_of(p).plot_height, plot_height);
    assert_true(kvs_plot_layout_of(p).key_rows >= 25);
    free(gp);
    kvs_plot_free(p);
    /* Short labels share a row: three policies of the setup study, several columns. */
    snprintf(out, sizeof out, "%s/short.png", t->dir);
    o = opts(KVS_PLOT_ERROR_VS_BUDGET, out);
    expect_ok(kvs_plot_prepare(t->db, &o, &p));
    gp = script_of(p, out);
    expect_key_fits(p, gp, 3);
    assert_int_equal(kvs_plot_layout_of(p).key_cols, 3);
    assert_int_equal(kvs_plot_layout_of(p).key_rows, 1);
    free(gp);
    kvs_plot_free(p);
    /* A label longer than the canvas widens it (one column) instead of being cut off. */
    snprintf(db, sizeof db, "%s/long.db", t->dir);
    kvs_results_db *rdb = NULL;
    expect_ok(kvs_results_open(db, &rdb));
    char params[400];
    size_t len = 0;
    for (int i = 0; i < 30; i++)
        len += (size_t)snprintf(params + len, sizeof params - len, "%sk%02d=%d", i ? "," : "", i, i);
    put_run(rdb, "h2o", params, 0, 16, 0);
    put_run(rdb, "h2o", params, 0, 32, 0);
    kvs_results_close(rdb);
    o = opts(KVS_PLOT_ERROR_VS_BUDGET, out);
    expect_ok(kvs_plot_prepare(db, &o, &p));
    gp = script_of(p, out);
    expect_key_fits(p, gp, 1);
    assert_true(kvs_plot_layout_of(p).width > 1200);
    free(gp);
    kvs_plot_free(p);
}

/* The legend drawn by the real gnuplot: the canvas the layout asked for (PNG header), every title in the SVG. */
static void test_legend_rendered_by_gnuplot(void **state) {
    tmp_ctx *t = *state;
    skip_without_gnuplot();
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/main.db", t->dir);
    make_main_job_db(db, 5);
    snprintf(out, sizeof out, "%s/all.png", t->dir);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_POSITION, out);
    kvs_plot *p = NULL;
    expect_ok(kvs_plot_prepare(db, &o, &p));
    kvs_plot_layout l = kvs_plot_layout_of(p);
    expect_ok(kvs_plot_render(p));
    kvs_plot_free(p);
    assert_image(out, 0);
    char *png = NULL;
    size_t n = 0;
    expect_ok(kvs_read_file(out, &png, &n));
    const unsigned char *ihdr = (const unsigned char *)png + 16; /* width, height: big-endian after "IHDR" */
    assert_int_equal((ihdr[0] << 24) | (ihdr[1] << 16) | (ihdr[2] << 8) | ihdr[3], l.width);
    assert_int_equal((ihdr[4] << 24) | (ihdr[5] << 16) | (ihdr[6] << 8) | ihdr[7], l.height);
    free(png);
    snprintf(out, sizeof out, "%s/all.svg", t->dir);
    o.out_path = out;
    o.budget_tokens = 32;
    expect_ok(kvs_plot_make(db, &o));
    char *svg = NULL;
    expect_ok(kvs_read_file(out, &svg, &n));
    for (int i = 0; i < 10; i++) {
        char label[200];
        snprintf(label, sizeof label, ">%s%s%s%s budget=32", main_job[i][0], main_job[i][1][0] ? " (" : "",
                 main_job[i][1], main_job[i][1][0] ? ")" : "");
        if (!strstr(svg, label)) {
            fprintf(stderr, "the SVG has no legend entry '%s'\n", label + 1);
            fail();
        }
    }
    free(svg);
}

/* ------------------------------------------------------------------------------------------------
 * Colours: one per policy, on every plot
 * ---------------------------------------------------------------------------------------------- */

/* The style of the plot element titled `label...` (a prefix of the title): its "lc rgb '#rrggbb'" colour,
 * dash type and point type; the n-th (0-based) element with that title prefix. 0 when there is none. */
static int style_of(const char *script, const char *label, int nth, char color[8], int *dt, int *pt) {
    char head[300];
    snprintf(head, sizeof head, "' title '%s", label);
    const char *p = strstr(script, head);
    for (int i = 0; p && i < nth; i++) p = strstr(p + 1, head);
    if (!p) return 0;
    const char *line = p;
    while (line > script && line[-1] != '\n') line--;
    const char *lc = strstr(line, "lc rgb '#");
    assert_true(lc && lc < p);
    memcpy(color, lc + strlen("lc rgb '"), 7);
    color[7] = '\0';
    const char *d = strstr(line, " dt "), *q = strstr(line, " pt ");
    *dt = d && d < p ? atoi(d + 4) : 0;
    *pt = q && q < p ? atoi(q + 4) : 0;
    return 1;
}

static void test_one_colour_per_policy_on_every_plot(void **state) {
    tmp_ctx *t = *state;
    char out[160];
    snprintf(out, sizeof out, "%s/colour.png", t->dir);
    /* The same policy on several kinds and selections: error-vs-budget of all policies and of one,
     * error-vs-memory, error-vs-position at one budget and at every budget. */
    struct {
        kvs_plot_kind kind;
        const char *policy;
        int64_t budget;
    } plots[5] = {{KVS_PLOT_ERROR_VS_BUDGET, NULL, -1},
                  {KVS_PLOT_ERROR_VS_BUDGET, "streaming", -1},
                  {KVS_PLOT_ERROR_VS_MEMORY, NULL, -1},
                  {KVS_PLOT_ERROR_VS_POSITION, NULL, 32},
                  {KVS_PLOT_ERROR_VS_POSITION, "streaming", -1}};
    char first[3][8] = {"", "", ""};
    static const char *const policies[3] = {"h2o (", "streaming (", "topk ("};
    for (int k = 0; k < 5; k++) {
        kvs_plot_options o = opts(plots[k].kind, out);
        o.policy = plots[k].policy;
        o.budget_tokens = plots[k].budget;
        kvs_plot *p = NULL;
        expect_ok(kvs_plot_prepare(t->db, &o, &p));
        char *gp = script_of(p, out);
        for (int j = 0; j < 3; j++) {
            char color[8];
            int dt, pt;
            if (!style_of(gp, policies[j], 0, color, &dt, &pt)) continue;
            if (!first[j][0]) snprintf(first[j], sizeof first[j], "%s", color);
            if (strcmp(color, first[j]) != 0) {
                fprintf(stderr, "plot %d: %s drawn in %s, elsewhere in %s\n", k, policies[j], color, first[j]);
                fail();
            }
            assert_string_equal(color, j == 2 ? "#000000" : kvs_plot_policy_color(j == 0 ? "h2o" : "streaming"));
        }
        if (k == 4) {
            /* Four series of one policy: one colour, told apart by dash and point type. */
            int seen[4][2];
            for (int i = 0; i < 4; i++) {
                char color[8];
                assert_true(style_of(gp, "streaming (", i, color, &seen[i][0], &seen[i][1]));
                assert_string_equal(color, first[1]);
                for (int j = 0; j < i; j++) assert_false(seen[i][0] == seen[j][0] && seen[i][1] == seen[j][1]);
            }
            assert_false(style_of(gp, "streaming (", 4, (char[8]){0}, &seen[0][0], &seen[0][1]));
        }
        free(gp);
        kvs_plot_free(p);
    }
    /* Oracles stay black; the frontier grey; two policies never share a colour. */
    assert_string_equal(first[2], "#000000");
    assert_string_not_equal(first[0], first[1]);
    /* Every registered policy has its own colour (the palette is larger than the registry), unknown names
     * get a palette colour too, always the same. */
    for (int i = 0; i < kvs_policy_count(); i++) {
        const char *ci = kvs_plot_policy_color(kvs_policy_at(i)->name);
        assert_int_equal(strlen(ci), 7);
        assert_true(strcmp(ci, "#000000") != 0 && strcmp(ci, "#b8b8b8") != 0);
        for (int j = 0; j < i; j++) assert_string_not_equal(ci, kvs_plot_policy_color(kvs_policy_at(j)->name));
    }
    assert_string_equal(kvs_plot_policy_color("my-new-policy"), kvs_plot_policy_color("my-new-policy"));
    assert_int_equal(strlen(kvs_plot_policy_color("my-new-policy")), 7);
}

/* CIELAB (D65) of "#rrggbb": sRGB decoded to linear light, to XYZ, to L*a*b*. */
static void lab_of(const char *hex, double lab[3]) {
    unsigned v = (unsigned)strtoul(hex + 1, NULL, 16);
    double c[3] = {(v >> 16) / 255.0, ((v >> 8) & 255) / 255.0, (v & 255) / 255.0};
    for (int i = 0; i < 3; i++) c[i] = c[i] <= 0.04045 ? c[i] / 12.92 : pow((c[i] + 0.055) / 1.055, 2.4);
    double xyz[3] = {(0.4124564 * c[0] + 0.3575761 * c[1] + 0.1804375 * c[2]) / 0.95047,
                     0.2126729 * c[0] + 0.7151522 * c[1] + 0.0721750 * c[2],
                     (0.0193339 * c[0] + 0.1191920 * c[1] + 0.9503041 * c[2]) / 1.08883};
    for (int i = 0; i < 3; i++)
        xyz[i] = xyz[i] > 216.0 / 24389 ? cbrt(xyz[i]) : (24389.0 / 27 * xyz[i] + 16) / 116;
    lab[0] = 116 * xyz[1] - 16;
    lab[1] = 500 * (xyz[0] - xyz[1]);
    lab[2] = 200 * (xyz[1] - xyz[2]);
}

/* CIEDE2000 colour difference (Sharma, Wu, Dalal, "The CIEDE2000 color-difference formula", Color Research &
 * Application 30(1), 2005, Eqs. 1-22), angles in degrees. */
static double de2000(const double l1[3], const double l2[3]) {
    const double pi = 3.14159265358979323846, rad = pi / 180;
    double c1 = hypot(l1[1], l1[2]), c2 = hypot(l2[1], l2[2]), cb = (c1 + c2) / 2;
    double g = 0.5 * (1 - sqrt(pow(cb, 7) / (pow(cb, 7) + pow(25, 7))));
    double a1 = (1 + g) * l1[1], a2 = (1 + g) * l2[1];
    double c1p = hypot(a1, l1[2]), c2p = hypot(a2, l2[2]);
    double h1 = c1p == 0 ? 0 : fmod(atan2(l1[2], a1) / rad + 360, 360);
    double h2 = c2p == 0 ? 0 : fmod(atan2(l2[2], a2) / rad + 360, 360);
    double dl = l2[0] - l1[0], dc = c2p - c1p, dh = 0;
    if (c1p * c2p != 0) {
        dh = h2 - h1;
        if (dh > 180) dh -= 360;
        else if (dh < -180) dh += 360;
    }
    double dhh = 2 * sqrt(c1p * c2p) * sin(dh / 2 * rad);
    double lb = (l1[0] + l2[0]) / 2, cbp = (c1p + c2p) / 2, hb = h1 + h2;
    if (c1p * c2p != 0) hb = fabs(h1 - h2) <= 180 ? (h1 + h2) / 2 : h1 + h2 < 360 ? (h1 + h2 + 360) / 2 : (h1 + h2 - 360) / 2;
    double tt = 1 - 0.17 * cos((hb - 30) * rad) + 0.24 * cos(2 * hb * rad) + 0.32 * cos((3 * hb + 6) * rad) -
                0.20 * cos((4 * hb - 63) * rad);
    double dth = 30 * exp(-pow((hb - 275) / 25, 2));
    double rc = 2 * sqrt(pow(cbp, 7) / (pow(cbp, 7) + pow(25, 7)));
    double sl = 1 + 0.015 * pow(lb - 50, 2) / sqrt(20 + pow(lb - 50, 2)), sc = 1 + 0.045 * cbp,
           sh = 1 + 0.015 * cbp * tt, rt = -sin(2 * dth * rad) * rc;
    return sqrt(pow(dl / sl, 2) + pow(dc / sc, 2) + pow(dhh / sh, 2) + rt * (dc / sc) * (dhh / sh));
}

static double colour_distance(const char *a, const char *b) {
    double la[3], lb[3];
    lab_of(a, la);
    lab_of(b, lb);
    return de2000(la, lb);
}

/* Every registered policy has its own colour, point and dash, on every plot: the (colour, point, dash) triples
 * and the (point, dash) pairs pairwise different, and the colours at least 15 apart in CIEDE2000 (plainly
 * different as two thin lines) and as far from the white background, the oracles' black and the frontier's
 * grey. The distance itself is checked against Sharma et al.'s published test pairs first. */
static void test_every_policy_has_its_own_style(void **state) {
    tmp_ctx *t = *state;
    const double sharma[4][7] = {{50, 2.6772, -79.7751, 50, 0, -82.7485, 2.0425},
                                 {50, -1.3802, -84.2814, 50, 0, -82.7485, 1.0000},
                                 {60.2574, -34.0099, 36.2677, 60.4626, -34.1751, 39.4387, 1.2644},
                                 {2.0776, 0.0795, -1.1350, 0.9033, -0.0636, -0.5514, 0.9082}};
    for (int i = 0; i < 4; i++) assert_true(fabs(de2000(sharma[i], sharma[i] + 3) - sharma[i][6]) < 1e-4);
    double black[3];
    lab_of("#000000", black);
    assert_true(fabs(black[0]) < 1e-9 && fabs(colour_distance("#ffffff", "#000000") - 100) < 1e-3);

    const double min_de = 15;
    int n = kvs_policy_count();
    assert_true(n >= 21);
    for (int i = 0; i < n; i++) {
        const char *pi = kvs_policy_at(i)->name;
        kvs_plot_style a = kvs_plot_policy_style(pi, 0, 0);
        assert_string_equal(a.color, kvs_plot_policy_color(pi));
        assert_int_not_equal(a.dash, 2); /* the oracles' */
        static const char *const reserved[3] = {"#ffffff", "#000000", "#b8b8b8"};
        for (int r = 0; r < 3; r++)
            if (colour_distance(a.color, reserved[r]) < min_de) {
                fprintf(stderr, "%s's colour %s is %.1f from %s\n", pi, a.color, colour_distance(a.color, reserved[r]),
                        reserved[r]);
                fail();
            }
        for (int j = 0; j < i; j++) {
            const char *pj = kvs_policy_at(j)->name;
            kvs_plot_style b = kvs_plot_policy_style(pj, 0, 0);
            double de = colour_distance(a.color, b.color);
            if (de < min_de || (a.point == b.point && a.dash == b.dash)) {
                fprintf(stderr, "%s (%s pt %d dt %d) and %s (%s pt %d dt %d): colours %.1f apart\n", pi, a.color,
                        a.point, a.dash, pj, b.color, b.point, b.dash, de);
                fail();
            }
        }
        /* Variants of one policy (other params, bytes, traces): its colour, 36 different (point, dash) pairs;
         * its oracle runs black and dashed, 9 different points. */
        for (int k = 0; k < 36; k++) {
            kvs_plot_style v = kvs_plot_policy_style(pi, k, 0), o = kvs_plot_policy_style(pi, k, 1);
            assert_string_equal(v.color, a.color);
            assert_int_not_equal(v.dash, 2);
            assert_string_equal(o.color, "#000000");
            assert_int_equal(o.dash, 2);
            for (int q = 0; q < k; q++) {
                kvs_plot_style w = kvs_plot_policy_style(pi, q, 0), ow = kvs_plot_policy_style(pi, q, 1);
                assert_false(v.point == w.point && v.dash == w.dash);
                if (k < 9) assert_int_not_equal(o.point, ow.point);
            }
        }
    }

    /* On a plot of every registered policy, each line is drawn in its policy's style (read from the script). */
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/all_policies.db", t->dir);
    snprintf(out, sizeof out, "%s/all_policies.png", t->dir);
    kvs_results_db *r = NULL;
    expect_ok(kvs_results_open(db, &r));
    for (int i = 0; i < n; i++)
        for (int b = 16; b <= 32; b *= 2)
            put_cost_run(r, "/traces/a.kvt", kvs_policy_at(i)->name, "", 0, b, "decode", 64.0 * b + i, 1.0 / (b + i));
    kvs_results_close(r);
    const kvs_plot_kind kinds[2] = {KVS_PLOT_ERROR_VS_BUDGET, KVS_PLOT_ERROR_VS_MEMORY};
    for (int k = 0; k < 2; k++) {
        kvs_plot_options o = opts(kinds[k], out);
        kvs_plot *p = NULL;
        expect_ok(kvs_plot_prepare(db, &o, &p));
        char *gp = script_of(p, out);
        for (int i = 0; i < n; i++) {
            char label[64], color[8];
            int dt, pt;
            snprintf(label, sizeof label, "%s'", kvs_policy_at(i)->name);
            assert_true(style_of(gp, label, 0, color, &dt, &pt));
            kvs_plot_style want = kvs_plot_policy_style(kvs_policy_at(i)->name, 0, 0);
            if (strcmp(color, want.color) || dt != want.dash || pt != want.point) {
                fprintf(stderr, "%s drawn %s pt %d dt %d, its style is %s pt %d dt %d\n", kvs_policy_at(i)->name, color,
                        pt, dt, want.color, want.point, want.dash);
                fail();
            }
        }
        free(gp);
        kvs_plot_free(p);
    }
}

/* ------------------------------------------------------------------------------------------------
 * Multi-turn traces: turn boundaries marked, lines broken where positions were not measured
 * ---------------------------------------------------------------------------------------------- */

/* The points of the data block whose "# series: " label starts with `prefix`: x[i], and brk[i] = 1 when a
 * blank line (a break of gnuplot's line) comes before point i. Returns the number of points, -1 when absent. */
static int block_with_breaks(const char *script, const char *prefix, double *x, int *brk, int cap) {
    char head[300];
    snprintf(head, sizeof head, "# series: %s", prefix);
    const char *p = strstr(script, head);
    if (!p) return -1;
    p = strchr(p, '\n') + 1;
    int n = 0, blank = 0;
    while (strncmp(p, "e\n", 2) != 0) {
        if (*p == '\n') {
            assert_false(blank); /* one blank line per break */
            blank = 1;
            p++;
            continue;
        }
        char *end;
        assert_true(n < cap);
        x[n] = strtod(p, &end);
        (void)strtod(end, &end);
        assert_int_equal(*end, '\n');
        brk[n++] = blank;
        blank = 0;
        p = end + 1;
    }
    assert_false(blank);
    return n;
}

/* Asserts the series `prefix` has points exactly at positions [from[j], to[j]) for j < n_runs, with a break
 * before each stretch but the first and nowhere else. */
static void expect_stretches(const char *script, const char *prefix, const int64_t *from, const int64_t *to,
                             int n_runs) {
    double x[256];
    int brk[256], k = 0;
    int n = block_with_breaks(script, prefix, x, brk, 256);
    if (n < 0) {
        fprintf(stderr, "no series '%s...'\n--- script ---\n%s\n", prefix, script);
        fail();
    }
    for (int j = 0; j < n_runs; j++)
        for (int64_t pos = from[j]; pos < to[j]; pos++, k++) {
            assert_true(k < n);
            if (x[k] != (double)pos || brk[k] != (j > 0 && pos == from[j])) {
                fprintf(stderr, "series '%s' point %d: position %g break %d, expected %lld break %d\n", prefix, k, x[k],
                        brk[k], (long long)pos, j > 0 && pos == from[j]);
                fail();
            }
        }
    assert_int_equal(n, k);
}

/* One complete run of `policy` on trace `path` (60 positions; `turns` may be NULL: none recorded) with steps
 * (1 layer, 2 query heads) at the positions of [from[j], to[j]) (stride `every`), except `skip` (-1: none). */
static void put_turn_run(kvs_results_db *db, const char *path, const kvs_turn *turns, int64_t n_turns,
                         const char *policy, const char *measure, const int64_t *from, const int64_t *to, int n_runs,
                         int every, int64_t skip) {
    kvs_results_trace tr = {.path = path, .model_name = "generated-gaussian", .n_positions = 60, .prompt_len = 5,
                            .n_turns = n_turns, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 16,
                            .dtype = "fp32", .file_bytes = 1000, .turns = turns};
    kvs_results_run run = {.policy = policy, .params = "", .budget_tokens = 8, .budget_fraction = -1,
                           .measure = measure, .status = "complete", .kvsim_version = "0.1.0"};
    kvs_results_agg all = agg_for(-1, 0.1, 1024);
    kvs_results_step steps[2 * 64];
    int n = 0;
    for (int j = 0; j < n_runs; j++)
        for (int64_t p = from[j]; p < to[j]; p += every)
            for (int h = 0; h < 2 && p != skip; h++)
                steps[n++] = (kvs_results_step){.layer = 0, .q_head = h, .position = p, .out_err = 0.01 * (double)p,
                                                .attended_tokens = 8};
    expect_ok(kvs_results_write_run(db, &tr, &run, NULL, 0, &all, steps, n, NULL));
}

static void test_position_plot_marks_turns_and_breaks_at_gaps(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/turns.db", t->dir);
    snprintf(out, sizeof out, "%s/turns.png", t->dir);
    /* Three turns: prompt [0,5) response [5,17); prompt [17,28) response [28,40); prompt [40,48) response [48,60). */
    static const kvs_turn turns[3] = {{0, 5, 17}, {17, 28, 40}, {40, 48, 60}};
    const int64_t dec_from[3] = {5, 28, 48}, dec_to[3] = {17, 40, 60};
    const int64_t pre_from[3] = {0, 17, 40}, pre_to[3] = {5, 28, 48};
    const int64_t all_from[1] = {0}, all_to[1] = {60};
    kvs_results_db *rdb = NULL;
    expect_ok(kvs_results_open(db, &rdb));
    put_turn_run(rdb, "/traces/chat.kvt", turns, 3, "h2o", "decode", dec_from, dec_to, 3, 1, -1);
    put_turn_run(rdb, "/traces/chat.kvt", turns, 3, "snapkv", "prefill", pre_from, pre_to, 3, 1, -1);
    put_turn_run(rdb, "/traces/chat.kvt", turns, 3, "window", "all", all_from, all_to, 1, 1, -1);
    put_turn_run(rdb, "/traces/chat.kvt", turns, 3, "tova", "decode", dec_from, dec_to, 3, 1, 33); /* 33 missing */
    put_turn_run(rdb, "/traces/chat.kvt", turns, 3, "streaming", "decode", &dec_from[1], &dec_to[1], 1, 1, -1);
    kvs_results_close(rdb);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_POSITION, out);
    kvs_plot *p = NULL;
    expect_ok(kvs_plot_prepare(db, &o, &p));
    char *gp = script_of(p, out);
    kvs_plot_free(p);
    /* decode: the responses, broken at each later prompt; prefill: the prompts, broken at each response; all:
     * one line; a missing stored position breaks the line too (no value was measured there). */
    expect_stretches(gp, "h2o budget=8 [decode]", dec_from, dec_to, 3);
    expect_stretches(gp, "snapkv budget=8 [prefill]", pre_from, pre_to, 3);
    expect_stretches(gp, "window budget=8 [all]", all_from, all_to, 1);
    const int64_t tova_from[4] = {5, 28, 34, 48}, tova_to[4] = {17, 33, 40, 60};
    expect_stretches(gp, "tova budget=8 [decode]", tova_from, tova_to, 4);
    /* Each turn's prompt shaded, each later turn's start a dashed line labelled with its number. */
    for (int k = 0; k < 3; k++) {
        char rect[200];
        snprintf(rect, sizeof rect, " rect from first %lld, graph 0 to first %lld, graph 1 behind clip",
                 (long long)turns[k].begin, (long long)turns[k].prompt_end);
        if (!strstr(gp, rect)) {
            fprintf(stderr, "no shaded prompt of turn %d ('%s')\n--- script ---\n%.3000s\n", k + 1, rect, gp);
            fail();
        }
    }
    assert_int_equal(count_of(gp, "set object "), 3);
    assert_non_null(strstr(gp, "set arrow 1 from first 17, graph 0 to first 17, graph 1 nohead dt 2"));
    assert_non_null(strstr(gp, "set label 1 'turn 2' at first 17, graph 1"));
    assert_non_null(strstr(gp, "set arrow 2 from first 40, graph 0 to first 40, graph 1 nohead dt 2"));
    assert_non_null(strstr(gp, "set label 2 'turn 3' at first 40, graph 1"));
    assert_int_equal(count_of(gp, "set arrow "), 2);
    assert_non_null(strstr(gp, "shaded: the prompt of each turn; dashed: start of a turn"));
    free(gp);
    /* Turn starts are marked only within the plotted positions (arrows are not clipped): a series of turn 2's
     * response alone (28..39) has neither start inside; the shaded prompts are clipped by gnuplot. */
    o.policy = "streaming";
    expect_ok(kvs_plot_prepare(db, &o, &p));
    gp = script_of(p, out);
    kvs_plot_free(p);
    assert_null(strstr(gp, "set arrow "));
    assert_int_equal(count_of(gp, "set object "), 3);
    free(gp);
}

/* A database without turn info (v1, or a trace written without turns): no marks; the line breaks where the
 * positions jump by more than the series' usual stride. */
static void test_position_plot_without_turn_info_breaks_at_jumps(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/noturns.db", t->dir);
    snprintf(out, sizeof out, "%s/noturns.png", t->dir);
    const int64_t dec_from[3] = {5, 28, 48}, dec_to[3] = {17, 40, 60};
    const int64_t every_from[2] = {6, 30}, every_to[2] = {18, 40}; /* stride 2: 6..16, 30..38 */
    kvs_results_db *rdb = NULL;
    expect_ok(kvs_results_open(db, &rdb));
    put_turn_run(rdb, "/traces/chat.kvt", NULL, 3, "h2o", "decode", dec_from, dec_to, 3, 1, -1);
    put_turn_run(rdb, "/traces/chat.kvt", NULL, 3, "window", "decode", every_from, every_to, 2, 2, -1);
    kvs_results_close(rdb);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_POSITION, out);
    kvs_plot *p = NULL;
    expect_ok(kvs_plot_prepare(db, &o, &p));
    char *gp = script_of(p, out);
    kvs_plot_free(p);
    expect_stretches(gp, "h2o budget=8", dec_from, dec_to, 3);
    double x[64];
    int brk[64];
    int n = block_with_breaks(gp, "window budget=8", x, brk, 64);
    assert_int_equal(n, 11);
    for (int k = 0; k < n; k++) {
        assert_true(x[k] == (k < 6 ? 6 + 2 * k : 30 + 2 * (k - 6)));
        assert_int_equal(brk[k], k == 6);
    }
    assert_null(strstr(gp, "set object "));
    assert_null(strstr(gp, "set arrow "));
    assert_null(strstr(gp, "shaded"));
    free(gp);
}

/* Runs that do not record the x metric (a database written before it existed) give a clear "no data". */
static void test_error_vs_memory_without_recorded_bytes(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/nobytes.db", t->dir);
    snprintf(out, sizeof out, "%s/none.png", t->dir);
    kvs_results_db *rdb = NULL;
    expect_ok(kvs_results_open(db, &rdb));
    kvs_results_trace tr = {.path = "/traces/gen.kvt", .model_name = "m", .n_positions = 64, .prompt_len = 40,
                            .n_turns = 1, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 16,
                            .dtype = "fp32", .file_bytes = 1000};
    kvs_results_run run = {.policy = "h2o", .params = "", .budget_tokens = 16, .budget_fraction = -1,
                           .measure = "decode", .status = "complete", .kvsim_version = "0.1.0"};
    kvs_results_agg a = agg_for(-1, 0.5, 100);
    a.storage_bytes = (kvs_results_stat){0};
    expect_ok(kvs_results_write_run(rdb, &tr, &run, NULL, 0, &a, NULL, 0, NULL));
    kvs_results_close(rdb);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_MEMORY, out);
    o.gnuplot = "/bin/true";
    assert_int_equal(kvs_plot_make(db, &o), KVS_ERR_DB);
    expect_msg("no data for error-vs-memory");
    expect_msg("storage_bytes_mean");
    assert_nothing_written(out);
}

/* Runs KVSIM_BIN with argv (argv[0] ignored), output discarded; returns the exit code. */
static int run_cli(char *const argv[]) {
    const char *bin = getenv("KVSIM_BIN");
    assert_non_null(bin);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null < 0) _exit(126);
        dup2(null, 1);
        dup2(null, 2);
        execv(bin, argv);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/* Runs KVSIM_BIN with argv (argv[0] ignored): stdout to `out_path` and stderr to `err_path` (NULL: discarded),
 * with `path_dir` (may be NULL) put first on PATH, so a stand-in gnuplot there is the one found. Returns the
 * exit code. */
static int run_cli_io(char *const argv[], const char *path_dir, const char *out_path, const char *err_path) {
    const char *bin = getenv("KVSIM_BIN");
    assert_non_null(bin);
    char path[4096];
    snprintf(path, sizeof path, "%s:%s", path_dir ? path_dir : "", getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err_path ? err_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0) _exit(126);
        dup2(o, 1);
        dup2(e, 2);
        if (path_dir) setenv("PATH", path, 1);
        execv(bin, argv);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/* A folder holding a stand-in `gnuplot` (make_fake_gnuplot's script under that name) for the CLI tests. */
static void make_fake_gnuplot_dir(const char *dir, char *bindir, size_t cap, char *captured, size_t ccap) {
    char prog[200];
    snprintf(bindir, cap, "%s/bin", dir);
    mkdir(bindir, 0755);
    make_fake_gnuplot(bindir, prog, sizeof prog, captured, ccap);
    char name[220];
    snprintf(name, sizeof name, "%s/gnuplot", bindir);
    assert_int_equal(rename(prog, name), 0);
}

/* Many series on one error-vs-position plot: drawn, with a warning that says how to select fewer. */
static void test_cli_warns_about_too_many_position_series(void **state) {
    tmp_ctx *t = *state;
    if (!getenv("KVSIM_BIN")) skip();
    char db[160], out[160], err[160], bindir[160], captured[200];
    snprintf(db, sizeof db, "%s/main.db", t->dir);
    snprintf(out, sizeof out, "%s/many.png", t->dir);
    snprintf(err, sizeof err, "%s/stderr", t->dir);
    make_main_job_db(db, 5);
    make_fake_gnuplot_dir(t->dir, bindir, sizeof bindir, captured, sizeof captured);
    char *all[] = {"kvsim", "plot", db, "--kind", "error-vs-position", "--out", out, NULL};
    assert_int_equal(run_cli_io(all, bindir, NULL, err), 0);
    assert_true(kvs_test_exists(out));
    char *msg = NULL;
    size_t n = 0;
    expect_ok(kvs_read_file(err, &msg, &n));
    if (!strstr(msg, "kvsim plot: warning: 50 series on one error-vs-position plot; select fewer with --policy, "
                     "--budget, --trace")) {
        fprintf(stderr, "stderr was: '%s'\n", msg);
        fail();
    }
    free(msg);
    /* 10 (one budget) and 12 (the limit) are no warning; 13 are. */
    char *one[] = {"kvsim", "plot", db, "--kind", "error-vs-position", "--budget", "32", "--out", out, NULL};
    assert_int_equal(run_cli_io(one, bindir, NULL, err), 0);
    expect_ok(kvs_read_file(err, &msg, &n));
    assert_null(strstr(msg, "warning"));
    free(msg);
    kvs_results_db *rdb = NULL;
    expect_ok(kvs_results_open(db, &rdb));
    put_run(rdb, "h2o", "recent=0.5,gqa=expand", 0, 32, 1);
    put_run(rdb, "tova", "mode=layer,protect_current=false", 0, 32, 1);
    kvs_results_close(rdb);
    assert_int_equal(run_cli_io(one, bindir, NULL, err), 0);
    expect_ok(kvs_read_file(err, &msg, &n));
    assert_null(strstr(msg, "warning"));
    free(msg);
    expect_ok(kvs_results_open(db, &rdb));
    put_run(rdb, "window", "", 0, 32, 1);
    kvs_results_close(rdb);
    assert_int_equal(run_cli_io(one, bindir, NULL, err), 0);
    expect_ok(kvs_read_file(err, &msg, &n));
    assert_non_null(strstr(msg, "kvsim plot: warning: 13 series on one error-vs-position plot"));
    free(msg);
    /* The other kinds draw one line per configuration: no such warning. */
    char *budget[] = {"kvsim", "plot", db, "--kind", "error-vs-budget", "--out", out, NULL};
    assert_int_equal(run_cli_io(budget, bindir, NULL, err), 0);
    expect_ok(kvs_read_file(err, &msg, &n));
    assert_null(strstr(msg, "warning"));
    free(msg);
}

/* The whole path on a real multi-turn capture: `kvsim capture --turns` (stories260K), `kvsim replay` (the trace's
 * turns go to the database), `kvsim plot --kind error-vs-position`: the script gnuplot gets marks every turn of
 * the trace and breaks the decode line at each later turn's prompt. */
static void test_cli_multi_turn_capture_replay_plot(void **state) {
    tmp_ctx *t = *state;
    const char *bin = getenv("KVSIM_BIN");
    char model[600];
    snprintf(model, sizeof model, "%s/../shared/models/stories260K.bin", kvs_test_root());
    if (!bin || !kvs_test_exists(model)) {
        fprintf(stderr, "SKIP: needs KVSIM_BIN and ../shared/models/stories260K.bin\n");
        skip();
    }
    char turns_txt[160], trace[160], db[160], out[160], bindir[160], captured[200];
    snprintf(turns_txt, sizeof turns_txt, "%s/turns.txt", t->dir);
    snprintf(trace, sizeof trace, "%s/chat.kvt", t->dir);
    snprintf(db, sizeof db, "%s/chat.db", t->dir);
    snprintf(out, sizeof out, "%s/chat.png", t->dir);
    FILE *f = fopen(turns_txt, "w");
    assert_non_null(f);
    fputs("Once upon a time\n\nThe dog ran to the park.\n\nThen it rained.\n", f); /* three turns */
    assert_int_equal(fclose(f), 0);
    char *capture[] = {"kvsim", "capture", "--model", model, "--turns", turns_txt, "--steps", "6", "--ignore-eos",
                       "--out", trace, NULL};
    assert_int_equal(run_cli_io(capture, NULL, NULL, NULL), 0);
    kvs_trace *tr = NULL;
    expect_ok(kvs_trace_open(trace, &tr));
    const kvs_trace_info *info = kvs_trace_info_get(tr);
    assert_int_equal(info->n_turns, 3);
    kvs_turn turns[3];
    memcpy(turns, info->turns, sizeof turns);
    kvs_trace_close(tr);
    char *replay[] = {"kvsim", "replay", trace, "--db", db, "--policy", "window", "--budgets", "4",
                      "--series-every", "1", "--threads", "1", NULL};
    assert_int_equal(run_cli_io(replay, NULL, NULL, NULL), 0);
    make_fake_gnuplot_dir(t->dir, bindir, sizeof bindir, captured, sizeof captured);
    char *plot[] = {"kvsim", "plot", db, "--kind", "error-vs-position", "--out", out, NULL};
    assert_int_equal(run_cli_io(plot, bindir, NULL, NULL), 0);
    char *gp = NULL;
    size_t n = 0;
    expect_ok(kvs_read_file(captured, &gp, &n));
    /* decode: each turn's response, a break before each later one */
    int64_t from[3], to[3];
    for (int k = 0; k < 3; k++) from[k] = turns[k].prompt_end, to[k] = turns[k].end;
    expect_stretches(gp, "window budget=4", from, to, 3);
    for (int k = 0; k < 3; k++) {
        char mark[200];
        snprintf(mark, sizeof mark, "rect from first %lld, graph 0 to first %lld, graph 1", (long long)turns[k].begin,
                 (long long)turns[k].prompt_end);
        assert_non_null(strstr(gp, mark));
        if (k == 0) continue;
        snprintf(mark, sizeof mark, "set arrow %d from first %lld, graph 0 to first %lld, graph 1 nohead", k,
                 (long long)turns[k].begin, (long long)turns[k].begin);
        assert_non_null(strstr(gp, mark));
        snprintf(mark, sizeof mark, "set label %d 'turn %d' at first %lld,", k, k + 1, (long long)turns[k].begin);
        assert_non_null(strstr(gp, mark));
    }
    free(gp);
    /* The real gnuplot draws it too. */
    if (have_gnuplot()) {
        assert_int_equal(run_cli_io(plot, NULL, NULL, NULL), 0);
        assert_image(out, 0);
    }
}

/* The names in folder `dir`, sorted, joined by spaces (to see what a command left there). */
static void dir_listing(const char *dir, char *buf, size_t cap) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | tr '\n' ' '", dir);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    pclose(f);
}

/* `plot --out` follows the output rules of every command (common/kvs_out.h): a symbolic link is written through
 * (its target replaced, the link kept), '-' is standard output (PNG unless --format svg), a device is written
 * in place, and a failed plot changes nothing and leaves no temporary file (beside the target, or in TMPDIR
 * where gnuplot draws). */
static void test_cli_out_follows_the_output_rules(void **state) {
    tmp_ctx *t = *state;
    if (!getenv("KVSIM_BIN")) skip();
    char dir[160], bindir[160], captured[200], faildir[160], tmpdir[160], target[200], link[200], list[1024];
    snprintf(dir, sizeof dir, "%s/outs", t->dir);
    snprintf(tmpdir, sizeof tmpdir, "%s/tmp", t->dir);
    snprintf(faildir, sizeof faildir, "%s/failbin", t->dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    assert_int_equal(mkdir(tmpdir, 0755), 0);
    assert_int_equal(mkdir(faildir, 0755), 0);
    make_fake_gnuplot_dir(t->dir, bindir, sizeof bindir, captured, sizeof captured);
    char fail_prog[200];
    snprintf(fail_prog, sizeof fail_prog, "%s/gnuplot", faildir);
    FILE *f = fopen(fail_prog, "w");
    assert_non_null(f);
    fputs("#!/bin/sh\ncat > /dev/null\necho 'gnuplot: something went wrong' >&2\nexit 1\n", f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(fail_prog, 0755), 0);
    snprintf(target, sizeof target, "%s/real.png", dir);
    snprintf(link, sizeof link, "%s/link.png", dir);
    f = fopen(target, "w");
    assert_non_null(f);
    fputs("old image\n", f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(symlink("real.png", link), 0);
    setenv("TMPDIR", tmpdir, 1);

    /* A symbolic link: the target gets the new image, the link stays a link to it. */
    char *via_link[] = {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--out", link, NULL};
    assert_int_equal(run_cli_io(via_link, bindir, NULL, NULL), 0);
    struct stat sb;
    assert_int_equal(lstat(link, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    char *data = NULL;
    size_t n = 0;
    expect_ok(kvs_read_file(target, &data, &n));
    assert_string_equal(data, "stand-in image\n");
    free(data);
    dir_listing(dir, list, sizeof list);
    assert_string_equal(list, "link.png real.png ");
    dir_listing(tmpdir, list, sizeof list);
    assert_string_equal(list, "");

    /* A failing gnuplot: the target keeps its content, the link stays, nothing is left beside it or in TMPDIR. */
    f = fopen(target, "w");
    assert_non_null(f);
    fputs("old image\n", f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(run_cli_io(via_link, faildir, NULL, NULL), 1);
    assert_int_equal(lstat(link, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    expect_ok(kvs_read_file(target, &data, &n));
    assert_string_equal(data, "old image\n");
    free(data);
    dir_listing(dir, list, sizeof list);
    assert_string_equal(list, "link.png real.png ");
    dir_listing(tmpdir, list, sizeof list);
    assert_string_equal(list, "");

    /* '-': the image is standard output (the "wrote" line goes to stderr); PNG unless --format svg. */
    char img[200], err[200];
    snprintf(img, sizeof img, "%s/stdout", t->dir);
    snprintf(err, sizeof err, "%s/stderr", t->dir);
    char *to_stdout[] = {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--out", "-", NULL};
    assert_int_equal(run_cli_io(to_stdout, bindir, img, err), 0);
    expect_ok(kvs_read_file(img, &data, &n));
    assert_string_equal(data, "stand-in image\n");
    free(data);
    expect_ok(kvs_read_file(err, &data, &n));
    assert_non_null(strstr(data, "wrote standard output"));
    free(data);
    expect_ok(kvs_read_file(captured, &data, &n));
    assert_non_null(strstr(data, "set terminal pngcairo "));
    free(data);
    char *svg_stdout[] = {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--out", "-", "--format", "svg", NULL};
    assert_int_equal(run_cli_io(svg_stdout, bindir, img, NULL), 0);
    expect_ok(kvs_read_file(captured, &data, &n));
    assert_non_null(strstr(data, "set terminal svg "));
    free(data);
    /* A device is written in place; a name without .png/.svg takes --format. */
    char *device[] = {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--out", "/dev/null", NULL};
    assert_int_equal(run_cli_io(device, bindir, NULL, NULL), 0);
    char plain[200];
    snprintf(plain, sizeof plain, "%s/plot", dir);
    char *named[] = {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--out", plain, "--format", "svg", NULL};
    assert_int_equal(run_cli_io(named, bindir, NULL, NULL), 0);
    expect_ok(kvs_read_file(captured, &data, &n));
    assert_non_null(strstr(data, "set terminal svg "));
    free(data);
    assert_true(kvs_test_exists(plain));
    unlink(plain);
    /* Usage errors: a format that is neither, one that contradicts the name, a file name without either. */
    char *bad_format[] = {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--out", "-", "--format", "jpg", NULL};
    char *mismatch[] = {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--out", target, "--format", "svg", NULL};
    char *no_ext[] = {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--out", plain, NULL};
    assert_int_equal(run_cli_io(bad_format, bindir, NULL, err), 2);
    expect_ok(kvs_read_file(err, &data, &n));
    assert_non_null(strstr(data, "--format: 'jpg' is not png or svg"));
    free(data);
    assert_int_equal(run_cli_io(mismatch, bindir, NULL, err), 2);
    expect_ok(kvs_read_file(err, &data, &n));
    assert_non_null(strstr(data, "--format svg does not match"));
    free(data);
    assert_int_equal(run_cli_io(no_ext, bindir, NULL, err), 2);
    expect_ok(kvs_read_file(err, &data, &n));
    assert_non_null(strstr(data, "must end in .png or .svg"));
    free(data);
    assert_false(kvs_test_exists(plain));
    dir_listing(tmpdir, list, sizeof list);
    assert_string_equal(list, "");
    unsetenv("TMPDIR");

    /* With the real gnuplot: a PNG (and an SVG) on standard output. */
    if (have_gnuplot()) {
        assert_int_equal(run_cli_io(to_stdout, NULL, img, NULL), 0);
        assert_image(img, 0);
        assert_int_equal(run_cli_io(svg_stdout, NULL, img, NULL), 0);
        assert_image(img, 1);
        assert_int_equal(run_cli_io(via_link, NULL, NULL, NULL), 0);
        assert_int_equal(lstat(link, &sb), 0);
        assert_true(S_ISLNK(sb.st_mode));
        assert_image(target, 0);
    }
}

static void test_cli_exit_codes(void **state) {
    tmp_ctx *t = *state;
    if (!getenv("KVSIM_BIN")) skip(); /* only meaningful through the test runner, which sets it */
    char out[160], jpg[160];
    snprintf(out, sizeof out, "%s/cli.png", t->dir);
    snprintf(jpg, sizeof jpg, "%s/cli.jpg", t->dir);
    char *bad[][14] = {
        {"kvsim", "plot", NULL},
        {"kvsim", "plot", t->db, "--out", out, NULL},
        {"kvsim", "plot", t->db, "--kind", "error-vs-budget", NULL},
        {"kvsim", "plot", t->db, "--kind", "histogram", "--out", out, NULL},
        {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--metric", "bogus", "--out", out, NULL},
        {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--out", jpg, NULL},
        {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--layer", "-1", "--out", out, NULL},
        {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--budget", "32", "--out", out, NULL},
        {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--out", out, "--frobnicate", NULL},
        {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--out", NULL},
        {"kvsim", "plot", t->db, t->db, "--kind", "error-vs-budget", "--out", out, NULL},
        {"kvsim", "plot", t->db, "--kind", "error-vs-budget", "--x-stat", "max", "--out", out, NULL},
        {"kvsim", "plot", t->db, "--kind", "error-vs-memory", "--x-stat", "p95", "--out", out, NULL},
        {"kvsim", "plot", t->db, "--kind", "error-vs-memory", "--metric", "storage_bytes_mean", "--out", out, NULL},
        {"kvsim", "plot", t->db, "--kind", "error-vs-traffic", "--measure", "sometimes", "--out", out, NULL},
        {"kvsim", "plot", t->db, "--kind", "error-vs-traffic", "--trace", "--out", out, NULL},
        {"kvsim", "plot", t->db, "--kind", "memory-vs-budget", "--log-y", "--out", out, NULL},
        {"kvsim", "plot", t->db, "--kind", "error-vs-position", "--log-y", "--out", out, NULL},
        {"kvsim", "plot", t->db, "--kind", "error-vs-memory", "--log-y", "--log-y", "--out", out, NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = run_cli(bad[i]);
        if (rc != 2) {
            fprintf(stderr, "case %zu: exit %d, expected 2\n", i, rc);
            fail();
        }
        assert_nothing_written(out);
    }
    char *empty[] = {"kvsim", "plot", t->empty, "--kind", "error-vs-budget", "--out", out, NULL};
    assert_int_equal(run_cli(empty), 1);
    assert_nothing_written(out);

    if (!have_gnuplot()) {
        fprintf(stderr, "SKIP (part): gnuplot is not installed; successful `kvsim plot` not checked\n");
        return;
    }
    char *good[] = {"kvsim", "plot", t->db, "--kind=error-vs-budget", "--metric", "out_err_mean", "--out", out, NULL};
    assert_int_equal(run_cli(good), 0);
    assert_image(out, 0);
    char svg[160];
    snprintf(svg, sizeof svg, "%s/cli.svg", t->dir);
    char *pos[] = {"kvsim", "plot", t->db, "--kind", "error-vs-position", "--policy", "h2o", "--budget", "64",
                   "--out", svg, NULL};
    assert_int_equal(run_cli(pos), 0);
    assert_image(svg, 1);
    char *mem[] = {"kvsim", "plot", t->db, "--kind", "error-vs-memory", "--x-stat", "max", "--metric", "out_err_p95",
                   "--trace", "gen.kvt", "--measure", "decode", "--out", out, NULL};
    assert_int_equal(run_cli(mem), 0);
    assert_image(out, 0);
    char *traffic[] = {"kvsim", "plot", t->db, "--kind=error-vs-traffic", "--policy=h2o", "--out", svg, NULL};
    assert_int_equal(run_cli(traffic), 0);
    assert_image(svg, 1);
    char *logy[] = {"kvsim", "plot", t->db, "--kind", "error-vs-memory", "--log-y", "--out", svg, NULL};
    assert_int_equal(run_cli(logy), 0);
    assert_image(svg, 1);
}

/* ---- Across traces: one line per (policy, params, measure, bytes, model), the mean over its traces with the
 * percentile bootstrap interval resampling traces (plot.h "Across traces") ---- */

/* One complete run of trace `path` (content hash `sha`, model `model`) with replay options kv_bytes=2,aux_bytes=4:
 * storage and traffic `mem`, out_err `err`. */
static void put_model_run(kvs_results_db *db, const char *path, const char *sha, const char *model, const char *policy,
                          int oracle, int64_t budget, double mem, double err) {
    kvs_results_trace tr = {.path = path, .model_name = model, .n_positions = 64, .prompt_len = 40, .n_turns = 1,
                            .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 16, .dtype = "fp32",
                            .file_bytes = 1000};
    int64_t trace_id = 0;
    expect_ok(kvs_results_sweep_trace(db, &tr, sha, &trace_id));
    kvs_results_run run = {.policy = policy, .params = "", .budget_tokens = budget, .budget_fraction = -1,
                           .is_oracle = oracle, .measure = "decode", .status = "complete", .wall_seconds = 0.01,
                           .kvsim_version = "0.1.0", .options = "kv_bytes=2,aux_bytes=4,series_every=0"};
    kvs_results_agg a = agg_for(-1, err, mem), l = a;
    l.layer = 0;
    expect_ok(kvs_results_write_run(db, &tr, &run, &l, 1, &a, NULL, 0, NULL));
}

/* The test's own 64-bit FNV-1a (the seed rule of plot.h, written out again here). */
static uint64_t test_fnv(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* The seed plot.h documents for one point: the line's identity, the budget, then the keys of the traces of the
 * point, ascending (the caller passes them sorted). */
static uint64_t across_seed_of(const char *policy, const char *params, const char *measure, int kv, int aux,
                               const char *model, int64_t budget, const char *const *keys, int n) {
    char head[512];
    snprintf(head, sizeof head, "%s\n%s\n%s\n%d\n%d\n%s\n%lld\n", policy, params, measure, kv, aux, model,
             (long long)budget);
    uint64_t h = test_fnv(0xcbf29ce484222325ull, head);
    for (int i = 0; i < n; i++) h = test_fnv(test_fnv(h, keys[i]), "\n");
    return h;
}

/* The seed of a point of the hand-made database below (params "", decode, kv_bytes 2, aux_bytes 4). */
static uint64_t across_seed(const char *policy, const char *model, int64_t budget, const char *const *keys, int n) {
    return across_seed_of(policy, "", "decode", 2, 4, model, budget, keys, n);
}

/* The points (x, mean, lo, hi, n) of the inline data block labelled `label` (a line across traces); -1: none. */
static int across_block(const char *script, const char *label, double (*pt)[5], int cap) {
    char head[512];
    snprintf(head, sizeof head, "# series: %s\n", label);
    const char *p = strstr(script, head);
    if (!p) return -1;
    p += strlen(head);
    int n = 0;
    while (strncmp(p, "e\n", 2) != 0) {
        char *end = (char *)p;
        assert_true(n < cap);
        for (int c = 0; c < 5; c++) pt[n][c] = strtod(end, &end);
        assert_int_equal(*end, '\n');
        p = end + 1;
        n++;
    }
    return n;
}

/* The start of the plot element titled `label` up to its line width ("'-' using 1:2 with linespoints"); "" when
 * none. */
static const char *element_of(const char *script, const char *label) {
    static char buf[64];
    char title[512];
    snprintf(title, sizeof title, " title '%s'", label);
    const char *end = strstr(script, title), *p = end;
    buf[0] = '\0';
    if (!end) return buf;
    while (p > script && strncmp(p, "'-' using", 9) != 0) p--;
    const char *style = strstr(p, " lw ");
    if (!style || style > end) return buf;
    snprintf(buf, sizeof buf, "%.*s", (int)(style - p), p);
    return buf;
}

/* Expects the point of `label` at x to be (mean, interval, n) of the traces' values v[0..n) (in ascending key
 * order, keys[]) recomputed here: kvs_bootstrap_mean with the seed built by the test. */
static void expect_across_point(const char *script, const char *label, double x, const double *v, int n,
                                const char *policy, const char *model, int64_t budget, const char *const *keys) {
    double pt[16][5];
    int m = across_block(script, label, pt, 16);
    if (m < 0) {
        fprintf(stderr, "no block '%s'\n--- script ---\n%s\n", label, script);
        fail();
    }
    kvs_interval iv;
    expect_ok(kvs_bootstrap_mean(v, (size_t)n, KVS_BOOTSTRAP_REPS, 0.95, across_seed(policy, model, budget, keys, n),
                                 &iv));
    for (int k = 0; k < m; k++)
        if (pt[k][0] == x) {
            if (pt[k][1] != iv.mean || pt[k][2] != iv.lo || pt[k][3] != iv.hi || pt[k][4] != n) {
                fprintf(stderr, "'%s' at x=%g: (%.17g [%.17g, %.17g] n=%g), recomputed (%.17g [%.17g, %.17g] n=%d)\n",
                        label, x, pt[k][1], pt[k][2], pt[k][3], pt[k][4], iv.mean, iv.lo, iv.hi, n);
                fail();
            }
            return;
        }
    fprintf(stderr, "'%s' has no point at x=%g\n", label, x);
    fail();
}

/* Five traces of model m1 (keys A < B < C < D < E, written in another order), one of m2 (F):
 *   h2o   m1: budgets 8, 16, 32 on every trace; budget 64 on A and B only; trace A at budget 8 twice
 *             (0.25 and 0.35: its value there is their mean, 0.3). mem = 100 budget + 10 t (t = 0..4 for A..E)
 *   window m1: budget 8 on A (error 0, 500 B) and B (error 1, 700 B): the mean 0.5, the interval exactly [0, 1]
 *   topk  m1: oracle, budget 8 on every trace
 *   h2o   m2: trace F only, budgets 8 and 16 */
static const char *const tk[6] = {
    "aaaa000000000000000000000000000000000000000000000000000000000000",
    "bbbb000000000000000000000000000000000000000000000000000000000000",
    "cccc000000000000000000000000000000000000000000000000000000000000",
    "dddd000000000000000000000000000000000000000000000000000000000000",
    "eeee000000000000000000000000000000000000000000000000000000000000",
    "ffff000000000000000000000000000000000000000000000000000000000000"};
static const double h2o_err[5][4] = {{0, 0.21, 0.11, 0.05}, /* A at 8: 0.25 and 0.35 (below) */
                                     {0.37, 0.19, 0.08, 0.045},
                                     {0.29, 0.26, 0.13, 0},
                                     {0.41, 0.17, 0.095, 0},
                                     {0.33, 0.23, 0.07, 0}};
static const double topk_err[5] = {0.031, 0.044, 0.027, 0.052, 0.038};

static void make_across_db(const char *path) {
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(path, &db));
    const int order[5] = {3, 0, 4, 2, 1}; /* D A E C B: the database order is not the key order */
    for (int o = 0; o < 5; o++) {
        int t = order[o];
        char tp[64];
        snprintf(tp, sizeof tp, "/traces/%c.kvt", 'a' + t);
        for (int b = 0; b < 4; b++) {
            int64_t budget = 8 << b;
            if (b == 3 && t > 1) continue; /* budget 64: A and B only */
            double mem = 100.0 * (double)budget + 10.0 * t;
            if (t == 0 && b == 0) {
                put_model_run(db, tp, tk[t], "m1", "h2o", 0, budget, mem, 0.25);
                put_model_run(db, tp, tk[t], "m1", "h2o", 0, budget, mem, 0.35);
            } else put_model_run(db, tp, tk[t], "m1", "h2o", 0, budget, mem, h2o_err[t][b]);
        }
        put_model_run(db, tp, tk[t], "m1", "topk", 1, 8, 2000.0 + 100 * t, topk_err[t]);
        if (t < 2) put_model_run(db, tp, tk[t], "m1", "window", 0, 8, t ? 700 : 500, t ? 1.0 : 0.0);
    }
    put_model_run(db, "/traces/f.kvt", tk[5], "m2", "h2o", 0, 8, 800, 0.5);
    put_model_run(db, "/traces/f.kvt", tk[5], "m2", "h2o", 0, 16, 1600, 0.4);
    kvs_results_close(db);
}

/* error-vs-budget across traces: each point's mean, interval and n recomputed from the runs (the traces' values in
 * key order, the seed from the line, budget and keys); the exact case {0, 1} -> [0, 1]; a budget only two traces
 * reached drawn from those two, n in the data, the legend and a mark; n per line in the legend; the model named
 * when the plot has several; error bars drawn; the per-trace view (the default) still one line per trace. */
static void test_across_traces_mean_and_interval(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/across.db", t->dir);
    snprintf(out, sizeof out, "%s/across.png", t->dir);
    make_across_db(db);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_BUDGET, out);
    o.across_traces = 1;
    kvs_plot *p = NULL;
    expect_ok(kvs_plot_prepare(db, &o, &p));
    char *gp = script_of(p, out);
    assert_int_equal(kvs_plot_n_series(p), 4);
    assert_int_equal(count_of(gp, "# series: "), 4);
    const char *h2o = "h2o [m1] (n=2 to 5 traces)";
    /* budget 8: A's two runs averaged first (the same expression as the plot's), then the five traces */
    double v8[5] = {(0.25 + 0.35) / 2, h2o_err[1][0], h2o_err[2][0], h2o_err[3][0], h2o_err[4][0]};
    expect_across_point(gp, h2o, 8, v8, 5, "h2o", "m1", 8, tk);
    for (int b = 1; b < 3; b++) {
        double v[5];
        for (int k = 0; k < 5; k++) v[k] = h2o_err[k][b];
        expect_across_point(gp, h2o, 8 << b, v, 5, "h2o", "m1", 8 << b, tk);
    }
    const double v64[2] = {h2o_err[0][3], h2o_err[1][3]};
    expect_across_point(gp, h2o, 64, v64, 2, "h2o", "m1", 64, tk);
    expect_across_point(gp, "topk (oracle) [m1] (n=5 traces)", 8, topk_err, 5, "topk", "m1", 8, tk);
    expect_across_point(gp, "h2o [m2] (n=1 trace: no interval)", 16, (const double[]){0.4}, 1, "h2o", "m2", 16, tk + 5);
    /* Two traces {0, 1}: the resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so the 2.5 % and
     * 97.5 % quantiles of 2000 of them are 0 and 1 (P(fewer than 51 zeros) is nil). */
    double pt[4][5];
    assert_int_equal(across_block(gp, "window [m1] (n=2 traces)", pt, 4), 1);
    assert_true(pt[0][0] == 8 && pt[0][1] == 0.5 && pt[0][2] == 0 && pt[0][3] == 1 && pt[0][4] == 2);

    /* The recomputation is sharp: the values in database order (D A E C B), or a seed without the budget, give
     * another interval, which the plot does not draw. */
    kvs_interval want, other;
    expect_ok(kvs_bootstrap_mean(v8, 5, KVS_BOOTSTRAP_REPS, 0.95, across_seed("h2o", "m1", 8, tk, 5), &want));
    const double shuffled[5] = {v8[3], v8[0], v8[4], v8[2], v8[1]};
    expect_ok(kvs_bootstrap_mean(shuffled, 5, KVS_BOOTSTRAP_REPS, 0.95, across_seed("h2o", "m1", 8, tk, 5), &other));
    assert_false(other.lo == want.lo && other.hi == want.hi);
    expect_ok(kvs_bootstrap_mean(v8, 5, KVS_BOOTSTRAP_REPS, 0.95, across_seed("h2o", "m1", 16, tk, 5), &other));
    assert_false(other.lo == want.lo && other.hi == want.hi);
    assert_true(want.lo < want.mean && want.mean < want.hi);

    /* Error bars for lines of several traces, a plain line for the one-trace line; the budget only A and B
     * reached is marked n=2 in its own labels block. */
    assert_int_equal(count_of(gp, "with yerrorlines"), 3);
    assert_string_equal(element_of(gp, "h2o [m2] (n=1 trace: no interval)"), "'-' using 1:2 with linespoints");
    assert_string_equal(element_of(gp, "h2o [m1] (n=2 to 5 traces)"), "'-' using 1:2:3:4 with yerrorlines");
    assert_string_equal(element_of(gp, "window [m1] (n=2 traces)"), "'-' using 1:2:3:4 with yerrorlines");
    const char *marks = strstr(gp, "# point counts: h2o [m1] (n=2 to 5 traces)\n");
    assert_non_null(marks);
    assert_int_equal(strncmp(strchr(marks, '\n') + 1, "64 ", 3), 0);
    assert_non_null(strstr(marks, " n=2\ne\n"));
    assert_int_equal(count_of(gp, "# point counts: "), 1);
    assert_int_equal(count_of(gp, "with labels"), 1);
    assert_non_null(strstr(gp, "\nset offsets graph 0.03, graph 0.03, 0, 0\n")); /* marks at the ends drawn */
    assert_non_null(strstr(gp, "mean over traces, bars: 95% bootstrap interval (resampling traces)"));
    assert_non_null(strstr(gp, "set ylabel 'rel. output error, mean, mean over traces (out_err_mean)'"));
    free(gp);
    kvs_plot_free(p);

    /* The default view: one line per (policy, trace): h2o 5 + 1, topk 5, window 2. */
    o.across_traces = 0;
    expect_ok(kvs_plot_prepare(db, &o, &p));
    gp = script_of(p, out);
    assert_int_equal(kvs_plot_n_series(p), 13);
    assert_null(strstr(gp, "yerrorlines"));
    assert_null(strstr(gp, "traces)"));
    assert_null(strstr(gp, "set offsets"));
    free(gp);
    kvs_plot_free(p);

    /* A one-trace selection draws no bars. */
    o.across_traces = 1;
    o.model = "m2";
    expect_ok(kvs_plot_prepare(db, &o, &p));
    gp = script_of(p, out);
    assert_null(strstr(gp, "yerrorlines"));
    assert_null(strstr(gp, "with labels"));
    assert_int_equal(across_block(gp, "h2o (n=1 trace: no interval)", pt, 4), 2);
    assert_true(pt[0][0] == 8 && pt[0][1] == 0.5 && pt[0][2] == 0.5 && pt[0][3] == 0.5 && pt[0][4] == 1);
    free(gp);
    kvs_plot_free(p);

    /* The other kinds refuse it. */
    o = opts(KVS_PLOT_ERROR_VS_POSITION, out);
    o.across_traces = 1;
    assert_int_equal(kvs_plot_prepare(db, &o, &p), KVS_ERR_INVALID_ARG);
    expect_msg("--across-traces applies to");
    assert_null(p);
}

/* error-vs-memory across traces: a point's x is the mean of its traces' x at that budget (the axis says so), its
 * y as on error-vs-budget; the frontier goes through the lines' points and says so; --log-y cuts a lower bound at
 * 0 and the label counts it. */
static void test_across_traces_cost_kinds_and_frontier(void **state) {
    tmp_ctx *t = *state;
    char db[160], out[160];
    snprintf(db, sizeof db, "%s/across.db", t->dir);
    snprintf(out, sizeof out, "%s/across.svg", t->dir);
    make_across_db(db);
    kvs_plot_options o = opts(KVS_PLOT_ERROR_VS_MEMORY, out);
    o.across_traces = 1;
    o.model = "m1";
    kvs_plot *p = NULL;
    expect_ok(kvs_plot_prepare(db, &o, &p));
    char *gp = script_of(p, out);
    /* x: mean of 100 b + 10 t over the traces (t = 0..4: + 20; A and B at 64: + 5) */
    const char *h2o = "h2o (n=2 to 5 traces)";
    double v[5];
    for (int b = 1; b < 3; b++) {
        for (int k = 0; k < 5; k++) v[k] = h2o_err[k][b];
        expect_across_point(gp, h2o, 100.0 * (8 << b) + 20, v, 5, "h2o", "m1", 8 << b, tk);
    }
    const double v64[2] = {h2o_err[0][3], h2o_err[1][3]};
    expect_across_point(gp, h2o, 6405, v64, 2, "h2o", "m1", 64, tk);
    expect_across_point(gp, "topk (oracle) (n=5 traces)", 2200, topk_err, 5, "topk", "m1", 8, tk);
    double pt[8][5];
    assert_int_equal(across_block(gp, "window (n=2 traces)", pt, 8), 1);
    assert_true(pt[0][0] == 600 && pt[0][1] == 0.5 && pt[0][2] == 0 && pt[0][3] == 1);
    /* The frontier of the non-oracle lines' points: window (600, .5), then h2o at every budget (each mean below
     * the last), never a trace's own point nor the oracle. */
    double hp[8][5];
    assert_int_equal(across_block(gp, h2o, hp, 8), 4);
    double fx[5] = {600, hp[0][0], hp[1][0], hp[2][0], hp[3][0]}, fy[5] = {0.5, hp[0][1], hp[1][1], hp[2][1], hp[3][1]};
    assert_true(fx[1] == 820 && fx[4] == 6405);
    for (int k = 1; k < 5; k++) assert_true(fy[k] < fy[k - 1]);
    expect_block(gp, "Pareto frontier (means over traces of the non-oracle lines)", 5, fx, fy);
    assert_null(strstr(gp, "non-oracle runs"));
    assert_non_null(strstr(gp, "set xlabel 'resident bytes per KV head, mean over steps, mean over traces at each "
                               "budget (storage_bytes_mean; log2 scale)'"));
    free(gp);
    kvs_plot_free(p);

    /* memory-vs-budget: y = the mean resident bytes over traces with its interval. */
    o = opts(KVS_PLOT_MEMORY_VS_BUDGET, out);
    o.across_traces = 1;
    o.model = "m1";
    o.policy = "h2o";
    expect_ok(kvs_plot_prepare(db, &o, &p));
    gp = script_of(p, out);
    const double m16[5] = {1600, 1610, 1620, 1630, 1640};
    expect_across_point(gp, "h2o (n=2 to 5 traces)", 16, m16, 5, "h2o", "m1", 16, tk);
    assert_non_null(strstr(gp, "set ylabel 'resident bytes per KV head, mean over steps, mean over traces "
                               "(storage_bytes_mean; log2 scale)'"));
    free(gp);
    kvs_plot_free(p);

    /* --log-y: window's interval [0, 1] reaches 0; its lower end is drawn at half the plot's smallest positive
     * value (its own mean 0.5 here: 0.25) and the label says so. */
    o = opts(KVS_PLOT_ERROR_VS_BUDGET, out);
    o.across_traces = 1;
    o.policy = "window";
    o.log_y = 1;
    expect_ok(kvs_plot_prepare(db, &o, &p));
    gp = script_of(p, out);
    assert_int_equal(across_block(gp, "window (n=2 traces) [1 interval reaches <= 0: cut at the axis]", pt, 8), 1);
    assert_true(pt[0][1] == 0.5 && pt[0][2] == 0.25 && pt[0][3] == 1);
    free(gp);
    kvs_plot_free(p);
}

/* Through the CLI: --across-traces draws error bars and n; it is refused by the kinds it does not apply to and
 * when given twice; the help documents it; gnuplot draws the script (when installed). */
static void test_cli_across_traces(void **state) {
    tmp_ctx *t = *state;
    if (!getenv("KVSIM_BIN")) skip();
    char db[160], out[160], so[160], bindir[160], captured[200];
    snprintf(db, sizeof db, "%s/across.db", t->dir);
    snprintf(out, sizeof out, "%s/across.png", t->dir);
    snprintf(so, sizeof so, "%s/stdout.txt", t->dir);
    make_across_db(db);
    char *bad[][10] = {
        {"kvsim", "plot", db, "--kind", "error-vs-position", "--across-traces", "--out", out, NULL},
        {"kvsim", "plot", db, "--kind", "drift-curve", "--across-traces", "--out", out, NULL},
        {"kvsim", "plot", db, "--kind", "error-vs-budget", "--across-traces", "--across-traces", "--out", out, NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(run_cli(bad[i]), 2);
        assert_nothing_written(out);
    }
    char *help[] = {"kvsim", "plot", "--help", NULL};
    assert_int_equal(run_cli_io(help, NULL, so, NULL), 0);
    char *text = kvs_test_slurp(so, NULL);
    assert_non_null(text);
    assert_non_null(strstr(text, "--across-traces"));
    assert_non_null(strstr(text, "bootstrap interval resampling"));
    free(text);
    make_fake_gnuplot_dir(t->dir, bindir, sizeof bindir, captured, sizeof captured);
    char *good[] = {"kvsim", "plot", db, "--kind", "error-vs-traffic", "--across-traces", "--model", "m1", "--out", out,
                    NULL};
    assert_int_equal(run_cli_io(good, bindir, NULL, NULL), 0);
    char *gp = kvs_test_slurp(captured, NULL);
    assert_non_null(gp);
    assert_int_equal(count_of(gp, "with yerrorlines"), 3);
    assert_non_null(strstr(gp, "# series: h2o (n=2 to 5 traces)\n"));
    assert_non_null(strstr(gp, "Pareto frontier (means over traces of the non-oracle lines)"));
    free(gp);
    if (!have_gnuplot()) return;
    char *real[] = {"kvsim", "plot", db, "--kind", "error-vs-budget", "--across-traces", "--log-y", "--out", out, NULL};
    assert_int_equal(run_cli(real), 0);
    assert_image(out, 0);
}

static int cmp_key_value(const void *a, const void *b) {
    return strcmp(((const char *const *)a)[0], ((const char *const *)b)[0]);
}

/* The real pipeline: seven traces of stories260K (examples/capture_prompts.sh, one per prompt), window replayed on
 * each at budgets 8 and 16, `kvsim plot --across-traces`: one line of n=7 whose points are the mean and interval
 * the test recomputes from the runs as the read API returns them (each trace's recorded SHA-256 its key); the
 * default view draws seven lines. */
static void test_cli_across_traces_of_captured_prompts(void **state) {
    tmp_ctx *t = *state;
    const char *bin = getenv("KVSIM_BIN");
    char model[600], cmd[2000], db[160], out[160], bindir[160], captured[200];
    snprintf(model, sizeof model, "%s/../shared/models/stories260K.bin", kvs_test_root());
    if (!bin || !kvs_test_exists(model)) {
        fprintf(stderr, "SKIP: needs KVSIM_BIN and ../shared/models/stories260K.bin\n");
        skip();
    }
    snprintf(cmd, sizeof cmd, "KVSIM_BIN='%s' sh '%s/examples/capture_prompts.sh' '%s' '%s/prompts' 32 > /dev/null",
             bin, kvs_test_root(), model, t->dir);
    assert_int_equal(system(cmd), 0);
    snprintf(db, sizeof db, "%s/prompts.db", t->dir);
    snprintf(out, sizeof out, "%s/prompts.png", t->dir);
    glob_t g;
    snprintf(cmd, sizeof cmd, "%s/prompts/*.kvt", t->dir);
    assert_int_equal(glob(cmd, 0, NULL, &g), 0);
    assert_int_equal(g.gl_pathc, 7);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        char *replay[] = {"kvsim", "replay", g.gl_pathv[i], "--db", db, "--policy", "window", "--budgets", "8,16",
                          "--threads", "1", NULL};
        assert_int_equal(run_cli_io(replay, NULL, NULL, NULL), 0);
    }
    globfree(&g);
    make_fake_gnuplot_dir(t->dir, bindir, sizeof bindir, captured, sizeof captured);
    char *plot[] = {"kvsim", "plot", db, "--kind", "error-vs-budget", "--across-traces", "--out", out, NULL};
    assert_int_equal(run_cli_io(plot, bindir, NULL, NULL), 0);
    char *gp = kvs_test_slurp(captured, NULL);
    assert_non_null(gp);
    assert_int_equal(count_of(gp, "# series: "), 1);
    char label[400];
    const char *h = strstr(gp, "# series: ") + strlen("# series: ");
    snprintf(label, sizeof label, "%.*s", (int)(strchr(h, '\n') - h), h);
    assert_non_null(strstr(label, "(n=7 traces)"));

    /* The runs, read back: per budget the seven traces' out_err means ordered by their content hash. */
    kvs_results_db *r = NULL;
    kvs_results_run_row *rows = NULL;
    int64_t nr = 0;
    expect_ok(kvs_results_open_readonly(db, &r));
    expect_ok(kvs_results_query_runs(r, NULL, &rows, &nr));
    assert_int_equal(nr, 14);
    for (int64_t b = 8; b <= 16; b *= 2) {
        const char *kv[7][2];
        double v[7];
        const char *keys[7];
        int n = 0, kvb = -1, auxb = -1;
        for (int64_t i = 0; i < nr; i++)
            if (rows[i].budget_tokens == b) {
                assert_true(n < 7);
                assert_non_null(rows[i].trace_sha256);
                kv[n][0] = rows[i].trace_sha256;
                kv[n][1] = (const char *)&rows[i];
                n++;
            }
        assert_int_equal(n, 7);
        qsort(kv, 7, sizeof kv[0], cmp_key_value);
        for (int k = 0; k < 7; k++) {
            const kvs_results_run_row *w = (const kvs_results_run_row *)kv[k][1];
            keys[k] = kv[k][0];
            v[k] = w->agg.out_err.mean;
            assert_int_equal(kvs_results_run_bytes(w, &kvb, &auxb), 1);
            if (k > 0) assert_true(strcmp(keys[k - 1], keys[k]) < 0); /* seven different traces */
        }
        const kvs_results_run_row *w0 = (const kvs_results_run_row *)kv[0][1];
        kvs_interval iv;
        expect_ok(kvs_bootstrap_mean(v, 7, KVS_BOOTSTRAP_REPS, 0.95,
                                     across_seed_of(w0->policy, w0->params, w0->measure, kvb, auxb, w0->model, b, keys, 7),
                                     &iv));
        double pt[4][5];
        assert_int_equal(across_block(gp, label, pt, 4), 2);
        int k = b == 8 ? 0 : 1;
        if (pt[k][0] != (double)b || pt[k][1] != iv.mean || pt[k][2] != iv.lo || pt[k][3] != iv.hi || pt[k][4] != 7) {
            fprintf(stderr, "budget %lld: (%.17g [%.17g, %.17g] n=%g), recomputed (%.17g [%.17g, %.17g])\n",
                    (long long)b, pt[k][1], pt[k][2], pt[k][3], pt[k][4], iv.mean, iv.lo, iv.hi);
            fail();
        }
        assert_true(iv.lo < iv.hi); /* seven different prompts: a real interval */
    }
    kvs_results_run_rows_free(rows, nr);
    kvs_results_close(r);
    free(gp);

    char *per_trace[] = {"kvsim", "plot", db, "--kind", "error-vs-budget", "--out", out, NULL};
    assert_int_equal(run_cli_io(per_trace, bindir, NULL, NULL), 0);
    gp = kvs_test_slurp(captured, NULL);
    assert_non_null(gp);
    assert_int_equal(count_of(gp, "# series: "), 7);
    assert_null(strstr(gp, "yerrorlines"));
    free(gp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_error_vs_budget_png_and_svg, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_memory_vs_budget_and_error_vs_position, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_plot_failures_leave_no_file, setup_db, teardown_db),
        cmocka_unit_test(test_kind_and_metric_parsing),
        cmocka_unit_test_setup_teardown(test_cli_exit_codes, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_cli_warns_about_too_many_position_series, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_cli_multi_turn_capture_replay_plot, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_cli_out_follows_the_output_rules, setup_db, teardown_db),
        cmocka_unit_test(test_pareto_hand_made),
        cmocka_unit_test_setup_teardown(test_error_vs_memory_frontier_and_series, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_budget_series_separated_by_trace_and_measure, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_error_vs_memory_and_traffic_png_svg, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_error_vs_memory_without_recorded_bytes, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_byte_axis_labels, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_log_y_axis, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_codec_runs_are_their_own_series, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_paged_runs_are_their_own_series, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_series_keyed_by_trace_content_and_bytes, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_cli_bytes_and_path_spellings, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_memory_axes_share_one_convention, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_prompt_only_budget_labelled_on_budget_plots, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_script_written_to_a_stream_is_what_gnuplot_reads, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_legend_has_every_series_and_fits, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_legend_rendered_by_gnuplot, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_one_colour_per_policy_on_every_plot, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_every_policy_has_its_own_style, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_position_plot_marks_turns_and_breaks_at_gaps, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_position_plot_without_turn_info_breaks_at_jumps, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_across_traces_mean_and_interval, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_across_traces_cost_kinds_and_frontier, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_cli_across_traces, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_cli_across_traces_of_captured_prompts, setup_db, teardown_db),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
