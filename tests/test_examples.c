/* test_examples.c — runs the README's main job (examples/main_job.sh) on the bundled trace
 * examples/stories260K.kvt, exactly as a user would, and checks what it produces: the trace verifies,
 * every (policy, budget) of the sweep is a complete run with one CSV row per layer, the `full` policy has
 * zero error, the oracle is never worse than any realisable policy at the same budget, and the plots are
 * real PNG files, and the equal-memory / equal-traffic comparisons bracket every compressing policy. Keeps
 * the main job from rotting. Also runs examples/findings.sh (the numbers of examples/FINDINGS.md) and checks
 * the invariants its tables must show. Uses $KVSIM_BIN (so `make asan` runs them under ASan).
 */
#include <ctype.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/testenv.h"

#define N_POLICIES 10
#define N_CODEC_CONFIGS 1 /* window with the int:bits=4 codec, beside the policies */
#define N_BUDGETS 7
#define N_LAYERS 5 /* stories260K */

static const char *env_or_skip(const char *name) {
    const char *v = getenv(name);
    if (!v || !v[0]) {
        print_message("%s is not set (run through `make test`): skipping\n", name);
        skip();
    }
    return v;
}

static int file_starts_with(const char *path, const unsigned char *magic, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    unsigned char buf[16];
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    return got == n && memcmp(buf, magic, n) == 0;
}

/* Policies whose attended set is bounded by the budget at every step, as the oracle's is. The prompt-only
 * compressors (snapkv, pyramidkv, adakv) keep every generated token, so over 320 generated tokens they
 * attend to far more than B positions and are not comparable with a budget-B oracle. */
static int every_step_budget(const char *policy) {
    static const char *const names[] = {"window", "streaming", "h2o", "tova", "scissorhands"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(policy, names[i])) return 1;
    return 0;
}

static void test_main_job_runs_end_to_end(void **state) {
    (void)state;
    const char *bin = env_or_skip("KVSIM_BIN");
    const char *root = env_or_skip("KVSIM_ROOT");
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        print_message("gnuplot is not installed: skipping the main job (it draws plots)\n");
        skip();
    }
    char dir[] = "/tmp/kvs_examples_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "OUT='%s' KVSIM_BIN='%s' README_PICTURE='%s/picture.png' sh '%s/examples/main_job.sh' >'%s/log' 2>&1",
             dir, bin, dir, root, dir);
    int rc = system(cmd);
    if (rc != 0) {
        snprintf(cmd, sizeof cmd, "cat '%s/log'", dir);
        (void)system(cmd);
    }
    assert_int_equal(rc, 0);

    /* The CSV: header with the documented leading columns, one row per (run, layer). */
    char path[512];
    snprintf(path, sizeof path, "%s/runs.csv", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4096];
    assert_non_null(fgets(line, sizeof line, f));
    assert_memory_equal(line,
                        "policy,params,budget_tokens,layer,out_err_mean,out_err_p95,out_err_max,attn_recall_mean,"
                        "topk_overlap_mean,storage_bytes_max,traffic_bytes_per_step_mean",
                        strlen("policy,params,budget_tokens,layer,out_err_mean,out_err_p95,out_err_max,"
                               "attn_recall_mean,topk_overlap_mean,storage_bytes_max,traffic_bytes_per_step_mean"));
    int rows = 0;
    /* oracle_err[budget index][layer] and the best realisable error at the same (budget, layer). */
    double oracle_err[N_BUDGETS][N_LAYERS], best_err[N_BUDGETS][N_LAYERS];
    const int budgets[N_BUDGETS] = {8, 16, 32, 64, 128, 256, 384};
    for (int b = 0; b < N_BUDGETS; b++)
        for (int l = 0; l < N_LAYERS; l++) oracle_err[b][l] = -1, best_err[b][l] = 1e30;
    while (fgets(line, sizeof line, f)) {
        char *fl[32];
        int nf = kvs_test_csv_fields(line, fl, 32);
        assert_true(nf >= 11);
        rows++;
        int budget = atoi(fl[2]), layer = atoi(fl[3]);
        double err = atof(fl[4]), recall = atof(fl[7]);
        assert_true(layer >= 0 && layer < N_LAYERS);
        assert_true(err >= 0 && recall > 0 && recall <= 1.0 + 1e-6);
        int bi = -1;
        for (int b = 0; b < N_BUDGETS; b++)
            if (budgets[b] == budget) bi = b;
        assert_true(bi >= 0);
        if (!strcmp(fl[0], "full")) {
            assert_true(err == 0.0); /* full attention recomputed from the same data: exactly zero */
            assert_true(recall > 1.0 - 1e-6);
        } else if (!strcmp(fl[0], "topk")) {
            oracle_err[bi][layer] = err;
        } else if (every_step_budget(fl[0]) && err < best_err[bi][layer]) {
            best_err[bi][layer] = err;
        }
    }
    fclose(f);
    assert_int_equal(rows, (N_POLICIES + N_CODEC_CONFIGS) * N_BUDGETS * N_LAYERS);
    /* Exact top-k by the group's summed attention is not guaranteed to minimise the output error of every
     * query head, but on average over a layer's heads and steps it must not lose to every realisable policy
     * of the same attended size by a wide margin; a wiring bug (oracle given stale or wrong attention) breaks this at once. */
    for (int b = 0; b < N_BUDGETS; b++)
        for (int l = 0; l < N_LAYERS; l++) {
            assert_true(oracle_err[b][l] >= 0);
            assert_true(oracle_err[b][l] <= 1.5 * best_err[b][l] + 1e-3);
        }

    static const unsigned char png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    const char *plots[] = {"error_vs_memory.png", "error_vs_traffic.png", "error_vs_budget.png",
                           "recall_vs_budget.png", "memory_vs_budget.png", "error_vs_position.png"};
    for (size_t i = 0; i < sizeof plots / sizeof plots[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, plots[i]);
        assert_true(file_starts_with(path, png, sizeof png));
        snprintf(path, sizeof path, "%s/report/%s", dir, plots[i]); /* the report draws the same plots */
        assert_true(file_starts_with(path, png, sizeof png));
    }
    /* On the bundled trace the error-vs-memory plot is also the README's picture (README_PICTURE here). */
    snprintf(cmd, sizeof cmd, "cmp -s '%s/picture.png' '%s/error_vs_memory.png'", dir, dir);
    assert_int_equal(system(cmd), 0);
    /* The job ends with the study report and its path (tests/test_report.c checks the report itself). */
    static const unsigned char html[] = "<!DOCTYPE html>";
    snprintf(path, sizeof path, "%s/report/report.html", dir);
    assert_true(file_starts_with(path, html, sizeof html - 1));
    snprintf(path, sizeof path, "%s/log", dir);
    f = fopen(path, "r");
    assert_non_null(f);
    char last[4096] = "";
    while (fgets(line, sizeof line, f)) snprintf(last, sizeof last, "%s", line);
    fclose(f);
    char want[1024];
    snprintf(want, sizeof want, "the report: %s/report/report.html\n", dir);
    assert_string_equal(strstr(last, "the report: ") ? strstr(last, "the report: ") : last, want);
    /* The equal-memory and equal-traffic comparisons: every realisable policy bracketed at 9 KiB (the sweep's
     * budgets reach it), full and the oracle's stored full cache out of range at equal memory. */
    const char *cmps[] = {"compare_mem.txt", "compare_traffic.txt"};
    const char *xs[] = {"compare at storage_bytes_mean = 9216", "compare at traffic_bytes_mean = 9216"};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, cmps[k]);
        f = fopen(path, "r");
        assert_non_null(f);
        int interpolated = 0, header = 0;
        while (fgets(line, sizeof line, f)) {
            if (strstr(line, xs[k])) header = 1;
            if (strstr(line, " #") && strstr(line, " at ")) interpolated++;
        }
        fclose(f);
        assert_true(header);
        assert_true(interpolated >= 8); /* the eight realisable compressing policies */
    }
    /* the codec beside the policies: its own row in the low equal-memory comparison */
    snprintf(path, sizeof path, "%s/compare_mem_low.txt", dir);
    char *low = kvs_test_slurp(path, NULL);
    assert_non_null(low);
    assert_non_null(strstr(low, "[int:bits=4,group=32,k_axis=token,v_axis=channel]"));
    free(low);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* The whole of a small file, NUL-terminated (NULL when it cannot be read). */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (buf) buf[n] = '\0';
    return buf;
}


/* The number written just before `phrase` in text (searched from `from`): "about 17.3 GB of RAM" -> 17.3 for
 * phrase " GB of RAM"; a range "83-86" gives its low end in *lo and high end in the result. Fails the test when
 * the phrase or the number is missing. */
static double number_before(const char *text, const char *phrase, double *lo) {
    const char *at = strstr(text, phrase);
    if (!at) fail_msg("README's CPU capture paragraph no longer says \"%s\"", phrase);
    const char *b = at;
    while (b > text && (isdigit((unsigned char)b[-1]) || b[-1] == '.' || b[-1] == 'e' || b[-1] == '-' || b[-1] == ','))
        b--;
    char num[64];
    size_t n = 0;
    for (const char *c = b; c < at && n + 1 < sizeof num; c++)
        if (*c != ',') num[n++] = *c; /* 4,096 */
    num[n] = '\0';
    char *dash = strchr(num + 1, '-'), *end = NULL;
    if (dash && dash[-1] != 'e') {
        *dash = '\0';
        if (lo) *lo = strtod(num, NULL);
        double hi = strtod(dash + 1, &end);
        if (end == dash + 1) fail_msg("no number before \"%s\"", phrase);
        return hi;
    }
    double v = strtod(num, &end);
    if (end == num) fail_msg("no number before \"%s\"", phrase);
    if (lo) *lo = v;
    return v;
}

static void assert_about(const char *what, double written, double computed, double rel) {
    if (!(fabs(written - computed) <= rel * fabs(computed)))
        fail_msg("README's %s: %g written, %g recomputed", what, written, computed);
}

/* README's "Llama-3.1-8B-Instruct on a CPU server" estimate, recomputed from the model's published shape (32 layers,
 * hidden 4096, 32 query and 8 KV heads of 128, FFN 14336, vocabulary 128256, untied embeddings, bf16) and the rates
 * gpu_capture/BENCH.md records (the prefill's GFLOP per CPU-second of its two runs, the decode step's GB/s and its
 * share of the read bandwidth): weights, KV cache a position, RAM, prefill FLOP and time on 2 and 32 cores, decode
 * rate, trace bytes a position. */
static void test_readme_cpu_capture_estimate(void **state) {
    (void)state;
    const char *root = env_or_skip("KVSIM_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/README.md", root);
    char *readme = slurp(path);
    assert_non_null(readme);
    for (char *c = readme; *c; c++)
        if (*c == '\n') *c = ' '; /* phrases may wrap */
    const char *para = strstr(readme, "What to expect, from the rates `make bench-prefill` measures");
    assert_non_null(para);
    snprintf(path, sizeof path, "%s/gpu_capture/BENCH.md", root);
    char *bench = slurp(path);
    assert_non_null(bench);
    /* the measured rates */
    const char *row = strstr(bench, "| (prefill per CPU-second) | ");
    assert_non_null(row);
    double r1 = 0, r2 = 0;
    assert_int_equal(sscanf(row, "| (prefill per CPU-second) | %lf GFLOP per CPU-s [%lf]", &r1, &r2), 2);
    const char *dec = strstr(bench, "whole step reads 2.08 GB in ");
    assert_non_null(dec);
    double dec_ms = 0, dec_gbs = 0, dec_share = 0, probe = 0;
    assert_int_equal(sscanf(dec, "whole step reads 2.08 GB in %lf ms = %lf GB/s, %lf%% of the %lf GB/s", &dec_ms,
                            &dec_gbs, &dec_share, &probe), 4);
    assert_about("decode GB/s in BENCH.md", dec_gbs, 2.08 / (dec_ms * 1e-3), 0.01);
    /* the model */
    const double L = 32, dim = 4096, Hq = 32, Hkv = 8, hd = 128, ffn = 14336, vocab = 128256;
    const double layer_matrices = dim * Hq * hd * 2 + dim * Hkv * hd * 2 + 3 * dim * ffn;
    const double params = L * (layer_matrices + 2 * dim) + 2 * vocab * dim + dim;
    const double weight_bytes = 2 * params;
    const double kv_pos = L * Hkv * hd * 2 * 4;            /* fp32 K and V */
    const double block_bufs = 128 * L * dim * 2 * 4;        /* the block's activations and records */
    const double prompt = 4096, gen = 128;
    const double prefill_flop = 2 * L * layer_matrices * prompt;
    const double rate_lo = r1 < r2 ? r1 : r2, rate_hi = r1 < r2 ? r2 : r1, rate = (r1 + r2) / 2 * 1e9;
    double lo = 0, hi = number_before(para, " GFLOP per core-second", &lo);
    assert_about("GFLOP per core-second (low)", lo, floor(rate_lo), 0);
    assert_about("GFLOP per core-second (high)", hi, ceil(rate_hi - 0.5), 0);
    assert_about("weights", number_before(para, " GB of weights once", NULL), weight_bytes / 1e9, 0.005);
    assert_about("KV a position", number_before(para, " KB a position,", NULL), kv_pos / 1e3, 0.005);
    assert_about("RAM", number_before(para, " GB of RAM", NULL), (weight_bytes + (prompt + gen) * kv_pos + block_bufs) / 1e9,
                 0.005);
    assert_about("prefill FLOP", number_before(para, " FLOP: about", NULL), prefill_flop, 0.01);
    assert_about("prefill minutes on 2 cores", number_before(para, " minutes on 2 such cores", NULL),
                 prefill_flop / (2 * rate) / 60, 0.1);
    assert_about("prefill seconds on 32 cores", number_before(para, " s on 32", NULL), prefill_flop / (32 * rate), 0.1);
    const double kv_4k = prompt * kv_pos;
    assert_about("cache read a token", number_before(para, " GB of fp32 cache a token", NULL), kv_4k / 1e9, 0.05);
    assert_about("the VM's decode GB/s", number_before(para, " GB/s (2 minutes", NULL), dec_gbs, 0);
    const double tok_s = dec_gbs * 1e9 / (weight_bytes + kv_4k);
    assert_about("tokens/s on the VM", number_before(para, " tokens/s at that VM", NULL), tok_s, 0.05);
    assert_about("minutes for 128 tokens", number_before(para, " minutes for 128 tokens", NULL), gen / tok_s / 60, 0.1);
    assert_about("tokens/s at 200 GB/s", number_before(para, " tokens/s on a server", NULL),
                 dec_share / 100 * 200e9 / (weight_bytes + kv_4k), 0.05);
    assert_about("share of the read bandwidth", number_before(para, "% of the machine's measured read bandwidth", NULL),
                 dec_share, 0);
    const double trace_pos = L * ((Hq * hd * 2 + Hkv * hd * 2) * 2 + Hq * 4); /* fp16 q, k, v, o; fp32 lse */
    assert_about("trace bytes a position", number_before(para, " KB a position before", NULL), trace_pos / 1e3, 0.01);
    free(bench);
    free(readme);
}

/* The README leads with what kvsim answers, the main job's picture (committed; the main job refreshes it) and the
 * two commands, set up + main job and the tests; the long reference lives in docs/REFERENCE.md. */
static void test_readme_leads_with_the_picture_and_two_commands(void **state) {
    (void)state;
    const char *root = env_or_skip("KVSIM_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/README.md", root);
    char *readme = slurp(path);
    assert_non_null(readme);
    const char *pic = strstr(readme, "](examples/main_job.png)");
    const char *setup = strstr(readme, "\nsh tools/install-debian-deps.sh && make && sh examples/main_job.sh\n");
    const char *tests = strstr(readme, "\nmake test && make asan\n");
    assert_non_null(pic);
    assert_non_null(setup);
    assert_non_null(tests);
    assert_true(pic < setup && setup < tests); /* the picture, then the two commands */
    assert_non_null(strstr(readme, "](docs/REFERENCE.md)"));
    /* no wall of text: no paragraph line or table row longer than 200 characters */
    for (const char *l = readme; *l;) {
        size_t n = strcspn(l, "\n");
        if (n > 200) fail_msg("README line of %zu characters: %.60s...", n, l);
        l += n + (l[n] == '\n');
    }
    free(readme);
    static const unsigned char png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    snprintf(path, sizeof path, "%s/examples/main_job.png", root);
    assert_true(file_starts_with(path, png, sizeof png));
    /* the reference page keeps every command of `kvsim help` */
    snprintf(path, sizeof path, "%s/docs/REFERENCE.md", root);
    char *ref = slurp(path);
    assert_non_null(ref);
    const char *cmds[] = {"capture", "chat-template", "info", "verify", "export", "trace recover", "policies", "replay",
                          "sweep", "merge", "runs", "compare", "report", "keys", "attn", "drift", "heads", "plot", "generate",
                          "calibrate", "interval", "plan"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "| `kvsim %s", cmds[i]);
        if (!strstr(ref, want)) fail_msg("docs/REFERENCE.md has no row for kvsim %s", cmds[i]);
    }
    free(ref);
}

/* The main job's budgets follow the trace: on tinystories-656K's 364-position capture (108 prompt + 256 generated)
 * the budgets above 364 are left out and 364 takes their place; the job runs to its report. */
static void test_main_job_budgets_follow_a_shorter_trace(void **state) {
    (void)state;
    const char *bin = env_or_skip("KVSIM_BIN");
    const char *root = env_or_skip("KVSIM_ROOT");
    char model[512];
    snprintf(model, sizeof model, "%s/../shared/models/tinystories-656K", root);
    if (access(model, R_OK) != 0) {
        print_message("%s not found: skipping\n", model);
        skip();
    }
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        print_message("gnuplot is not installed: skipping the main job (it draws plots)\n");
        skip();
    }
    if (kvs_test_sanitized()) {
        print_message("the main job on a second model runs in the plain suite (minutes under the sanitizers)\n");
        skip();
    }
    char dir[] = "/tmp/kvs_examples656_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "OUT='%s' KVSIM_BIN='%s' sh '%s/examples/main_job.sh' '%s' >'%s/log' 2>&1", dir, bin,
             root, model, dir);
    int rc = system(cmd);
    char path[512];
    snprintf(path, sizeof path, "%s/log", dir);
    char *log = slurp(path);
    assert_non_null(log);
    if (rc != 0) fail_msg("main_job.sh on tinystories-656K failed:\n%s", log);
    assert_non_null(strstr(log, "== budgets 8,16,32,64,128,256,364 (the trace has 364 positions)\n"));
    assert_non_null(strstr(log, "the report: "));
    free(log);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* The check of FINDINGS.md's generated blocks (examples/findings_lib.sh) fails when a block differs from what was
 * generated, when a generated block is missing from the file and when a block of the file has no generated text;
 * --update rewrites the blocks and leaves the rest of the file as it was. */
static void test_findings_blocks_check_catches_drift(void **state) {
    (void)state;
    const char *root = env_or_skip("KVSIM_ROOT");
    char dir[] = "/tmp/kvs_blocks_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cmd[4096], path[512];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && mkdir b && printf 'intro 1.0\n<!-- begin generated A -->\nold 0.5\n<!-- end generated A "
             "-->\nverdict\n' > f.md && printf 'new 0.6\n' > b/A.md",
             dir);
    assert_int_equal(system(cmd), 0);
#define LIB_CALL(mode)                                                                                             \
    snprintf(cmd, sizeof cmd, "cd '%s' && . '%s/examples/findings_lib.sh' && findings_blocks %s f.md b '' 2>/dev/null", \
             dir, root, mode)
    LIB_CALL("check");
    assert_int_not_equal(system(cmd), 0); /* the block differs */
    LIB_CALL("update");
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/f.md", dir);
    char *text = slurp(path);
    assert_non_null(text);
    assert_string_equal(text, "intro 1.0\n<!-- begin generated A -->\nnew 0.6\n<!-- end generated A -->\nverdict\n");
    free(text);
    LIB_CALL("check");
    assert_int_equal(system(cmd), 0); /* now it matches */
    snprintf(cmd, sizeof cmd, "printf 'x\n' > '%s/b/B.md'", dir);
    assert_int_equal(system(cmd), 0);
    LIB_CALL("check");
    assert_int_not_equal(system(cmd), 0); /* a generated block the file does not have */
    snprintf(cmd, sizeof cmd, "rm '%s/b/B.md' '%s/b/A.md'", dir, dir);
    assert_int_equal(system(cmd), 0);
    LIB_CALL("check");
    assert_int_not_equal(system(cmd), 0); /* a block of the file with no generated text */
#undef LIB_CALL
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* examples/findings.sh regenerates FINDINGS.md's numbers. With the shared models beside the repository the sections
 * without a test file of their own (the introduction's traces, D2O, drift, heads, the task, the closed loop) run with
 * --check: their generated blocks must be what kvsim measures now (tests/test_findings_*.c check the other sections
 * and recompute their numbers); every single trace gets D2O's single-trace tables in summary.txt. Without the models
 * the whole script runs on the bundled trace alone. */
static void test_findings_script_regenerates_the_numbers(void **state) {
    (void)state;
    const char *bin = env_or_skip("KVSIM_BIN");
    const char *root = env_or_skip("KVSIM_ROOT");
    if (kvs_test_sanitized()) {
        print_message("the findings study runs in the plain suite (many minutes under the sanitizers; the commands it "
                      "calls have their own tests there)\n");
        skip();
    }
    char out[256], cmd[4096], path[512], line[1024];
    int rc = kvs_test_findings("intro,d2o,drift,heads,task,calibration", out, sizeof out);
    assert_int_not_equal(rc, -1);
    int with_models = rc == 1;
    if (!with_models) { /* the bundled trace alone */
        char dir[] = "/tmp/kvs_findings_XXXXXX";
        assert_non_null(mkdtemp(dir));
        snprintf(out, sizeof out, "%s/f", dir);
        snprintf(cmd, sizeof cmd, "OUT='%s' KVSIM_BIN='%s' sh '%s/examples/findings.sh' '%s/no-models' >'%s/log' 2>&1",
                 out, bin, root, dir, dir);
        if (system(cmd) != 0) {
            snprintf(cmd, sizeof cmd, "cat '%s/log'", dir);
            (void)system(cmd);
            fail_msg("findings.sh failed on the bundled trace");
        }
    }
    snprintf(path, sizeof path, "%s/summary.txt", out);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int traces = 0, density = 0, merging = 0;
    while (fgets(line, sizeof line, f)) {
        traces += !strncmp(line, "=== ", 4) && !strstr(line, "multiturn");
        density += !strncmp(line, "D2/D3", 5);
        merging += !strncmp(line, "D9/merging", 10);
    }
    fclose(f);
    assert_int_equal(traces, with_models ? 2 : 1); /* the bundled trace, and a tinystories-656K capture */
    assert_int_equal(density, traces);
    assert_int_equal(merging, traces);
    if (with_models) { /* the introduction's table: seven prompt traces of each model */
        snprintf(path, sizeof path, "%s/blocks/traces.md", out);
        char *text = slurp(path);
        assert_non_null(text);
        assert_non_null(strstr(text, "| stories260K | 7 | "));
        assert_non_null(strstr(text, "| tinystories-656K | 7 | "));
        free(text);
        kvs_test_findings_cleanup(out);
    } else {
        snprintf(cmd, sizeof cmd, "rm -rf '%.*s'", (int)(strlen(out) - 2), out);
        assert_int_equal(system(cmd), 0);
    }
}

/* Reads "[+-]x [lo, hi]" at p (numbers as the blocks print them); 1 when it parsed. */
static int parse_interval(const char *p, double *x, double *lo, double *hi) {
    char *end;
    *x = strtod(p, &end);
    if (end == p || strncmp(end, " [", 2) != 0) return 0;
    p = end + 2;
    *lo = strtod(p, &end);
    if (end == p || strncmp(end, ", ", 2) != 0) return 0;
    p = end + 2;
    *hi = strtod(p, &end);
    return end != p && *end == ']';
}

/* Every "resolved" / "not resolved" FINDINGS.md says of a paired difference agrees with the interval printed beside
 * it: resolved exactly when the 95% interval excludes 0, and the estimate lies inside its interval. The blocks'
 * scripts take the word from kvsim's own flag; this reads it back from the printed numbers. */
static void test_findings_resolved_matches_the_intervals(void **state) {
    (void)state;
    const char *root = env_or_skip("KVSIM_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/examples/FINDINGS.md", root);
    char *text = slurp(path);
    assert_non_null(text);
    int checked = 0, resolved = 0, bad = 0;
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        /* each "resolved" in the line: the nearest interval before it is the one it judges */
        for (char *r = strstr(line, "resolved"); r; r = strstr(r + 1, "resolved")) {
            int negated = r - line >= 4 && !strncmp(r - 4, "not ", 4);
            const char *best = NULL;
            double x = 0, lo = 0, hi = 0;
            for (char *b = strchr(line, '['); b && b < r; b = strchr(b + 1, '[')) {
                const char *s = b - 1; /* back to the estimate before " [" */
                if (s <= line || *s != ' ') continue;
                s--;
                while (s > line && (isdigit((unsigned char)s[-1]) || strchr("+-.e", s[-1]))) s--;
                double tx, tlo, thi;
                if (parse_interval(s, &tx, &tlo, &thi)) best = s, x = tx, lo = tlo, hi = thi;
            }
            if (!best) continue;
            int excl = lo > 0 || hi < 0;
            if (excl == negated || x < lo - 1e-12 * fabs(lo) - 5e-3 * fabs(hi - lo) - 1e-9 ||
                x > hi + 5e-3 * fabs(hi - lo) + 1e-9) {
                print_message("FINDINGS.md: \"%.*s\" says %s of [%g, %g] around %g\n", (int)(r - line + 8), line,
                              negated ? "not resolved" : "resolved", lo, hi, x);
                bad++;
            }
            checked++;
            resolved += !negated;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(text);
    print_message("%d judgements of paired intervals checked (%d resolved)\n", checked, resolved);
    assert_int_equal(bad, 0);
    assert_true(checked >= 50);
    assert_true(resolved > 0 && resolved < checked);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_main_job_runs_end_to_end),
        cmocka_unit_test(test_readme_leads_with_the_picture_and_two_commands),
        cmocka_unit_test(test_readme_cpu_capture_estimate),
        cmocka_unit_test(test_main_job_budgets_follow_a_shorter_trace),
        cmocka_unit_test(test_findings_blocks_check_catches_drift),
        cmocka_unit_test(test_findings_script_regenerates_the_numbers),
        cmocka_unit_test(test_findings_resolved_matches_the_intervals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
