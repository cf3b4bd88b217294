/* test_plot.c — tests of plots/plot.h and `kvsim plot`: PNG and SVG output of every plot kind from a
 * database populated through sim/results.h (skipped with a message when gnuplot is not installed), and
 * every error path — gnuplot missing or failing, empty database, missing data, bad options — giving the
 * right status / exit code and leaving no output file (nor OUT.partial) behind.
 */
#include <fcntl.h>
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
#include "plots/plot.h"
#include "sim/results.h"

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

static void assert_nothing_written(const char *out) {
    char partial[256];
    snprintf(partial, sizeof partial, "%s.partial", out);
    assert_false(kvs_test_exists(out));
    assert_false(kvs_test_exists(partial));
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
    char partial[256];
    snprintf(partial, sizeof partial, "%s.partial", path);
    assert_false(kvs_test_exists(partial));
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
        expect_msg("cannot create output file");
    }
    o.out_path = out;
    o.metric = "storage_bytes_max";
    assert_int_equal(kvs_plot_make(t->db, &o), KVS_ERR_INVALID_ARG);
    expect_msg("unknown metric");
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
    assert_int_equal(kvs_plot_kind_parse("drift", &k), KVS_ERR_INVALID_ARG);
    expect_msg("unknown plot kind 'drift'");
    expect_ok(kvs_plot_metric_check(KVS_PLOT_ERROR_VS_BUDGET, "topk_overlap_mean"));
    expect_ok(kvs_plot_metric_check(KVS_PLOT_ERROR_VS_POSITION, "attn_recall_mean"));
    assert_int_equal(kvs_plot_metric_check(KVS_PLOT_ERROR_VS_POSITION, "out_err_p95"), KVS_ERR_INVALID_ARG);
    expect_msg("cannot be drawn per position");
    assert_int_equal(kvs_plot_metric_check(KVS_PLOT_ERROR_VS_BUDGET, "out_err"), KVS_ERR_INVALID_ARG);
    expect_msg("unknown metric 'out_err'");
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

static void test_cli_exit_codes(void **state) {
    tmp_ctx *t = *state;
    if (!getenv("KVSIM_BIN")) skip(); /* only meaningful through the test runner, which sets it */
    char out[160], jpg[160];
    snprintf(out, sizeof out, "%s/cli.png", t->dir);
    snprintf(jpg, sizeof jpg, "%s/cli.jpg", t->dir);
    char *bad[][12] = {
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
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_error_vs_budget_png_and_svg, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_memory_vs_budget_and_error_vs_position, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_plot_failures_leave_no_file, setup_db, teardown_db),
        cmocka_unit_test(test_kind_and_metric_parsing),
        cmocka_unit_test_setup_teardown(test_cli_exit_codes, setup_db, teardown_db),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
