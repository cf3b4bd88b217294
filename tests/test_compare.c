/* test_compare.c — tests of `kvsim compare` (cli/cmd_compare.c; POLICY_SPEC.md §1.5 budget-matching modes),
 * run through the binary ($KVSIM_BIN) as a user runs it, on a hand-made results database written with
 * kvs_results_write_run() whose aggregates are chosen so that every interpolated value is known by hand:
 * interpolation in log(x) between the bracketing runs for --match mem, traffic and tokens, exact matches,
 * series out of range (never extrapolated), series without a recorded x, separation by trace and measure,
 * oracle labels, sorting by the first metric, the suffixes of --at, CSV/JSON/table output, and every bad
 * option (exit 2) or unusable database (exit 1).
 * Across traces: five traces of one model whose values at X are set by hand; each configuration's mean against
 * a hand sum, its interval against a bootstrap done here (the seed's identity string hashed here, the resampling
 * order reproduced), exclusions (gap, out of range, not run), a paired difference resolved where the two own
 * intervals overlap and one that is not, --pairs, JSON seeds, and a one-trace database saying no interval.
 */
#include <fcntl.h>
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

#include "common/json.h"
#include "common/kvs.h"
#include "common/kvs_rng.h"
#include "results/results.h"
#include "results/results_sweep.h"
#include "tests/util/testenv.h"

typedef struct {
    char dir[64];
    char db[128];
    char out[128], err[128];
} tmp_ctx;

static void expect_ok(kvs_status st) {
    if (st != KVS_OK) fprintf(stderr, "unexpected failure: %s (%s)\n", kvs_strerror(st), kvs_last_error());
    assert_int_equal(st, KVS_OK);
}

/* One complete run with the chosen run-wide aggregate (storage, traffic, errors...; storage < 0: storage and
 * traffic not recorded). Returns its id. The fields after topk are optional: the trace's content hash (recorded
 * as replay does, in sweep_traces), runs.options, budget_scope, notes, a peak storage (0: = the mean) and the
 * codec. */
typedef struct {
    const char *trace, *model, *policy, *params, *measure;
    int oracle;
    int64_t budget;
    double storage, traffic, err, err_p95, recall, topk;
} run_spec;

typedef struct {
    const char *sha, *options, *scope, *notes;
    double storage_max;
    const char *codec; /* runs.codec, the canonical spec of kvsim replay --codec; NULL = K/V as captured */
} run_extra;

static kvs_results_stat val(double v) {
    return (kvs_results_stat){.n = 100, .mean = v, .p50 = v, .p95 = v, .max = v, .min = v};
}

static int64_t put_run_ex(kvs_results_db *db, run_spec r, run_extra x) {
    kvs_results_trace tr = {.path = r.trace, .model_name = r.model, .n_positions = 128, .prompt_len = 64,
                            .n_turns = 1, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 16,
                            .dtype = "fp16", .file_bytes = 4096};
    kvs_results_run run = {.policy = r.policy, .params = r.params, .budget_tokens = r.budget, .budget_fraction = -1,
                           .is_oracle = r.oracle, .measure = r.measure, .status = "complete", .wall_seconds = 0.1,
                           .kvsim_version = "0.1.0", .options = x.options, .budget_scope = x.scope, .notes = x.notes,
                           .codec = x.codec};
    kvs_results_agg a = {.layer = -1};
    a.out_err = val(r.err);
    a.out_err.p95 = r.err_p95;
    a.attn_recall = val(r.recall);
    a.topk_overlap = val(r.topk);
    a.attended_tokens = val((double)r.budget);
    if (r.storage >= 0) {
        a.storage_bytes = val(r.storage);
        a.traffic_bytes = val(r.traffic);
        if (x.storage_max > 0) a.storage_bytes.max = x.storage_max;
    }
    int64_t id = 0;
    if (x.sha) {
        int64_t trace_id = 0;
        expect_ok(kvs_results_sweep_trace(db, &tr, x.sha, &trace_id));
    }
    expect_ok(kvs_results_write_run(db, &tr, &run, NULL, 0, &a, NULL, 0, &id));
    return id;
}

static int64_t put_run(kvs_results_db *db, run_spec r) { return put_run_ex(db, r, (run_extra){.sha = NULL}); }

/* Run ids of the study, for the assertions. */
static int64_t id_h2o16, id_h2o64, id_st16, id_st32, id_st64, id_topk16, id_topk64;

/* The study (x: storage, traffic per KV head; budget in tokens):
 *   h2o heavy=0.5 a.kvt decode : b16 (1024, 512) err .5 p95 1 recall .5 topk .25 | b64 (4096, 2048) err .25 p95 .5
 *                                recall .75 topk .5
 *   streaming sinks=4 a decode : b16 (512, 256) .5 | b32 (1024, 512) .375 | b64 (2048, 1024) .3
 *   topk (oracle) a decode     : b16 (2048, 1024) .125 | b64 (8192, 4096) .0625
 *   h2o heavy=0.5 b.kvt decode : b16 (1024, 512) .75 | b64 (4096, 2048) .5
 *   h2o heavy=0.5 a.kvt all    : b16 (1024, 512) 1 | b64 (4096, 2048) .5
 *   window a decode            : b16, b64 with storage and traffic not recorded; err .5 | .25
 *   plus a failed quest run (never compared). */
static int setup_db(void **state) {
    tmp_ctx *t = calloc(1, sizeof *t);
    if (!t) return -1;
    snprintf(t->dir, sizeof t->dir, "/tmp/kvs_compare_XXXXXX");
    if (!mkdtemp(t->dir)) return -1;
    snprintf(t->db, sizeof t->db, "%s/study.db", t->dir);
    snprintf(t->out, sizeof t->out, "%s/out.txt", t->dir);
    snprintf(t->err, sizeof t->err, "%s/err.txt", t->dir);
    kvs_results_db *db = NULL;
    if (kvs_results_open(t->db, &db) != KVS_OK) return -1;
    const char *A = "/traces/a.kvt", *B = "/traces/b.kvt";
    id_h2o16 = put_run(db, (run_spec){A, "m1", "h2o", "heavy=0.5", "decode", 0, 16, 1024, 512, .5, 1, .5, .25});
    id_st16 = put_run(db, (run_spec){A, "m1", "streaming", "sinks=4", "decode", 0, 16, 512, 256, .5, .5, .5, .5});
    id_h2o64 = put_run(db, (run_spec){A, "m1", "h2o", "heavy=0.5", "decode", 0, 64, 4096, 2048, .25, .5, .75, .5});
    id_st32 = put_run(db, (run_spec){A, "m1", "streaming", "sinks=4", "decode", 0, 32, 1024, 512, .375, .5, .5, .5});
    id_st64 = put_run(db, (run_spec){A, "m1", "streaming", "sinks=4", "decode", 0, 64, 2048, 1024, .3, .5, .5, .5});
    id_topk16 = put_run(db, (run_spec){A, "m1", "topk", "", "decode", 1, 16, 2048, 1024, .125, .25, .9, 1});
    id_topk64 = put_run(db, (run_spec){A, "m1", "topk", "", "decode", 1, 64, 8192, 4096, .0625, .125, .95, 1});
    put_run(db, (run_spec){B, "m2", "h2o", "heavy=0.5", "decode", 0, 16, 1024, 512, .75, 1, .5, .5});
    put_run(db, (run_spec){B, "m2", "h2o", "heavy=0.5", "decode", 0, 64, 4096, 2048, .5, 1, .5, .5});
    put_run(db, (run_spec){A, "m1", "h2o", "heavy=0.5", "all", 0, 16, 1024, 512, 1, 1, .5, .5});
    put_run(db, (run_spec){A, "m1", "h2o", "heavy=0.5", "all", 0, 64, 4096, 2048, .5, 1, .5, .5});
    put_run(db, (run_spec){A, "m1", "window", "", "decode", 0, 16, -1, -1, .5, 1, .5, .5});
    put_run(db, (run_spec){A, "m1", "window", "", "decode", 0, 64, -1, -1, .25, 1, .5, .5});
    kvs_results_trace tr = {.path = A, .model_name = "m1", .n_positions = 128, .prompt_len = 64, .n_turns = 1,
                            .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 16, .dtype = "fp16",
                            .file_bytes = 4096};
    kvs_results_run failed = {.policy = "quest", .params = "page=16", .budget_tokens = 32, .budget_fraction = -1,
                              .measure = "decode", .status = "failed", .error = "page too big",
                              .kvsim_version = "0.1.0"};
    if (kvs_results_write_run(db, &tr, &failed, NULL, 0, NULL, NULL, 0, NULL) != KVS_OK) return -1;
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

/* Runs KVSIM_BIN with argv (NULL-terminated; argv[0] ignored), stdout to out_path, stderr to err_path. */
static int run_cli(char *const argv[], const char *out_path, const char *err_path) {
    const char *bin = getenv("KVSIM_BIN");
    assert_non_null(bin);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0) _exit(126);
        dup2(fo, 1);
        dup2(fe, 2);
        execv(bin, argv);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}


static void need_bin(void) {
    if (!getenv("KVSIM_BIN")) skip(); /* only meaningful through the test runner, which sets it */
}

/* A CSV output, parsed: f[i][j] = field j of data row i (RFC 4180 quotes undone). */
#define MAX_ROWS 32
#define MAX_FIELDS 256
typedef struct {
    char *text;
    int n_rows, n_cols;
    char *head[MAX_FIELDS];
    char *f[MAX_ROWS][MAX_FIELDS];
} csv_table;

/* Splits one record in place (a quoted field loses its quotes, "" inside becomes "). */
static int split(char *line, char **fields) {
    int n = 0;
    char *r = line, *w = line;
    for (;;) {
        assert_true(n < MAX_FIELDS);
        fields[n++] = w;
        if (*r == '"') {
            for (r++; *r && !(r[0] == '"' && r[1] != '"');)
                if (r[0] == '"') *w++ = '"', r += 2;
                else *w++ = *r++;
            if (*r == '"') r++;
        } else
            while (*r && *r != ',') *w++ = *r++;
        if (*r != ',') {
            *w = '\0';
            return n;
        }
        *w++ = '\0';
        r++;
    }
}

/* `kvsim ARGV...` (argv[0] ignored, NULL-terminated), whose stdout is CSV, parsed into *out; exit 0 required. */
static void cli_csv(tmp_ctx *t, char *const argv[], csv_table *out) {
    int rc = run_cli(argv, t->out, t->err);
    if (rc != 0) {
        char *e = kvs_test_slurp(t->err, NULL);
        fprintf(stderr, "kvsim %s exited %d: %s\n", argv[1], rc, e);
        free(e);
        fail();
    }
    memset(out, 0, sizeof *out);
    out->text = kvs_test_slurp(t->out, NULL);
    size_t len = strlen(out->text), start = 0;
    for (size_t i = 0; i < len; i++) {
        if (out->text[i] != '\n') continue;
        out->text[i] = '\0';
        char *line = out->text + start;
        start = i + 1;
        if (!out->n_cols) {
            out->n_cols = split(line, out->head);
            continue;
        }
        assert_true(out->n_rows < MAX_ROWS);
        assert_int_equal(split(line, out->f[out->n_rows]), out->n_cols);
        out->n_rows++;
    }
    assert_int_equal(start, len); /* every record ends in LF */
    assert_true(out->n_cols > 0);
}

/* `kvsim compare DB ARGS... --csv`, parsed. */
static void compare_csv(tmp_ctx *t, const char *const *args, csv_table *out) {
    char *argv[32] = {"kvsim", "compare", t->db};
    int n = 3;
    for (; *args; args++) argv[n++] = (char *)*args;
    argv[n++] = "--csv";
    argv[n] = NULL;
    cli_csv(t, argv, out);
}

static const char *cell(const csv_table *c, int row, const char *col) {
    for (int j = 0; j < c->n_cols; j++)
        if (!strcmp(c->head[j], col)) return c->f[row][j];
    fprintf(stderr, "no column %s\n", col);
    fail();
    return NULL;
}

static void expect_num(const csv_table *c, int row, const char *col, double want) {
    const char *s = cell(c, row, col);
    char *end;
    double v = strtod(s, &end);
    if (!s[0] || *end || fabs(v - want) > 1e-12 * fmax(1, fabs(want))) {
        fprintf(stderr, "row %d %s: '%s', expected %.17g\n", row, col, s, want);
        fail();
    }
}

static void expect_str(const csv_table *c, int row, const char *col, const char *want) {
    const char *s = cell(c, row, col);
    if (strcmp(s, want)) {
        fprintf(stderr, "row %d %s: '%s', expected '%s'\n", row, col, s, want);
        fail();
    }
}

/* ------------------------------------------------------------------------------------------------ */

static void test_mem_interpolates_in_log_x(void **state) {
    tmp_ctx *t = *state;
    need_bin();
    csv_table c;
    const char *args[] = {"--match", "mem", "--at", "2KiB", NULL};
    compare_csv(t, args, &c);
    const char *want_head = "policy,params,codec,page,page_score,flags,is_oracle,prompt_only,degenerate,kv_bytes,aux_bytes,trace,trace_label,"
                            "trace_sha256,model,measure,match,x,at,status,run_lo,run_hi,budget_lo,budget_hi,x_lo,x_hi,"
                            "x_min,x_max,out_err_mean,out_err_p95,attn_recall_mean,topk_overlap_mean,"
                            "attended_tokens_mean,storage_bytes_mean,traffic_bytes_mean";
    char head[1024] = "";
    for (int j = 0; j < c.n_cols; j++) snprintf(head + strlen(head), sizeof head - strlen(head), "%s%s", j ? "," : "", c.head[j]);
    assert_string_equal(head, want_head);
    assert_int_equal(c.n_rows, 6);
    /* Sorted by out_err_mean, lower first: topk .125, streaming .3, h2o/a/decode .375, h2o/b .625, h2o/a/all .75,
     * then window (no recorded x). */
    expect_str(&c, 0, "policy", "topk");
    expect_str(&c, 0, "is_oracle", "1");
    expect_str(&c, 0, "status", "exact");
    expect_num(&c, 0, "run_lo", (double)id_topk16);
    expect_num(&c, 0, "run_hi", (double)id_topk16);
    expect_num(&c, 0, "out_err_mean", 0.125);

    expect_str(&c, 1, "policy", "streaming");
    expect_str(&c, 1, "status", "exact");
    expect_num(&c, 1, "run_lo", (double)id_st64);
    expect_num(&c, 1, "out_err_mean", 0.3);
    expect_num(&c, 1, "x_min", 512);
    expect_num(&c, 1, "x_max", 2048);

    /* h2o on a.kvt, decode: x 1024 and 4096 bracket 2048 at t = ln 2 / ln 4 = 1/2. */
    expect_str(&c, 2, "policy", "h2o");
    expect_str(&c, 2, "trace", "/traces/a.kvt");
    expect_str(&c, 2, "measure", "decode");
    expect_str(&c, 2, "match", "mem");
    expect_num(&c, 2, "at", 2048);
    expect_str(&c, 2, "status", "interpolated");
    expect_num(&c, 2, "run_lo", (double)id_h2o16);
    expect_num(&c, 2, "run_hi", (double)id_h2o64);
    expect_num(&c, 2, "x_lo", 1024);
    expect_num(&c, 2, "x_hi", 4096);
    expect_num(&c, 2, "out_err_mean", 0.375);
    expect_num(&c, 2, "out_err_p95", 0.75);
    expect_num(&c, 2, "attn_recall_mean", 0.625);
    expect_num(&c, 2, "topk_overlap_mean", 0.375);
    expect_num(&c, 2, "attended_tokens_mean", 40);
    expect_num(&c, 2, "storage_bytes_mean", 2048); /* the matched quantity is X */
    expect_num(&c, 2, "traffic_bytes_mean", 1280); /* 512 + (2048 - 512) / 2 */

    /* The same configuration on another trace and in another measure mode: separate series. */
    expect_str(&c, 3, "trace", "/traces/b.kvt");
    expect_str(&c, 3, "model", "m2");
    expect_num(&c, 3, "out_err_mean", 0.625);
    expect_str(&c, 4, "measure", "all");
    expect_num(&c, 4, "out_err_mean", 0.75);

    expect_str(&c, 5, "policy", "window");
    expect_str(&c, 5, "status", "no_x");
    expect_str(&c, 5, "out_err_mean", "");
    free(c.text);

    /* Between the oracle's runs (2048, 8192) at 4096: t = 1/2; streaming's runs end at 2048: out of range. */
    const char *args4[] = {"--match", "mem", "--at", "4Ki", "--metric", "out_err_mean", NULL};
    compare_csv(t, args4, &c);
    expect_str(&c, 0, "policy", "topk");
    expect_str(&c, 0, "status", "interpolated");
    expect_num(&c, 0, "out_err_mean", 0.09375);
    int found = 0;
    for (int i = 0; i < c.n_rows; i++)
        if (!strcmp(cell(&c, i, "policy"), "streaming")) {
            found = 1;
            expect_str(&c, i, "status", "out_of_range");
            expect_str(&c, i, "out_err_mean", "");
            expect_str(&c, i, "run_lo", "");
            expect_num(&c, i, "x_min", 512);
            expect_num(&c, i, "x_max", 2048);
            assert_true(i >= 4); /* after every series in range */
        } else if (!strcmp(cell(&c, i, "policy"), "h2o") && !strcmp(cell(&c, i, "measure"), "decode") &&
                   !strcmp(cell(&c, i, "model"), "m1")) {
            expect_str(&c, i, "status", "exact");
            expect_num(&c, i, "out_err_mean", 0.25);
        }
    assert_true(found);
    free(c.text);
}

static void test_tokens_and_traffic_modes(void **state) {
    tmp_ctx *t = *state;
    need_bin();
    csv_table c;
    /* tokens: budgets 16 and 64 bracket 32 at t = 1/2; streaming has a run at exactly 32. */
    const char *args[] = {"--match", "tokens", "--at", "32", "--metric", "out_err_mean,storage_bytes_mean",
                          "--policy", "h2o", "--trace", "a.kvt", "--measure", "decode", NULL};
    compare_csv(t, args, &c);
    assert_int_equal(c.n_rows, 1);
    expect_str(&c, 0, "status", "interpolated");
    expect_num(&c, 0, "out_err_mean", 0.375);
    expect_num(&c, 0, "storage_bytes_mean", 2560); /* not the matched quantity here: interpolated */
    free(c.text);
    const char *args_s[] = {"--match", "tokens", "--at", "32", "--policy", "streaming", NULL};
    compare_csv(t, args_s, &c);
    assert_int_equal(c.n_rows, 1);
    expect_str(&c, 0, "status", "exact");
    expect_num(&c, 0, "run_lo", (double)id_st32);
    expect_num(&c, 0, "out_err_mean", 0.375);
    free(c.text);
    /* The window runs record no bytes but have budgets: usable under tokens. */
    const char *args_w[] = {"--match", "tokens", "--at", "32", "--policy", "window", NULL};
    compare_csv(t, args_w, &c);
    expect_str(&c, 0, "status", "interpolated");
    expect_num(&c, 0, "out_err_mean", 0.375);
    free(c.text);

    /* traffic: h2o/a reads 512 and 2048 bytes per step, 1024 lies at t = 1/2. Repeated and comma-separated
     * --metric keep their order. */
    const char *args_t[] = {"--match",  "traffic", "--at", "1KiB", "--metric", "traffic_bytes_mean",
                            "--metric", "out_err_mean,storage_bytes_mean", "--model", "m1", "--measure", "decode", NULL};
    compare_csv(t, args_t, &c);
    assert_true(c.n_cols == 31); /* 28 fixed columns, then the three metrics in the order given */
    assert_string_equal(c.head[28], "traffic_bytes_mean");
    assert_string_equal(c.head[29], "out_err_mean");
    assert_string_equal(c.head[30], "storage_bytes_mean");
    /* sorted by traffic_bytes_mean: every series in range shows 1024 (the match), ties by label */
    for (int i = 0; i < c.n_rows; i++) {
        const char *p = cell(&c, i, "policy");
        if (!strcmp(p, "h2o")) {
            expect_num(&c, i, "traffic_bytes_mean", 1024);
            expect_num(&c, i, "out_err_mean", 0.375);
            expect_num(&c, i, "storage_bytes_mean", 2560);
        } else if (!strcmp(p, "topk")) {
            expect_str(&c, i, "status", "exact");
            expect_num(&c, i, "out_err_mean", 0.125);
        } else if (!strcmp(p, "streaming")) {
            expect_str(&c, i, "status", "exact");
            expect_num(&c, i, "run_lo", (double)id_st64);
        }
    }
    free(c.text);
    (void)id_topk64;
}

static void test_at_suffixes(void **state) {
    tmp_ctx *t = *state;
    need_bin();
    const char *forms[] = {"2048", "2Ki", "2KiB", "2kib", "2048B", "2.048e3"};
    char *first = NULL;
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        char *argv[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", (char *)forms[i], "--csv", NULL};
        assert_int_equal(run_cli(argv, t->out, t->err), 0);
        char *text = kvs_test_slurp(t->out, NULL);
        if (!first) first = text;
        else {
            assert_string_equal(text, first);
            free(text);
        }
    }
    free(first);
    /* Decimal prefixes: 2K = 2000 (between 1024 and 4096 for h2o), 1M = 1e6 (out of range everywhere). */
    char *argk[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "2K", "--csv", NULL};
    assert_int_equal(run_cli(argk, t->out, t->err), 0);
    char *text = kvs_test_slurp(t->out, NULL);
    assert_non_null(strstr(text, ",mem,storage_bytes_mean,2000,"));
    free(text);
    char *argm[] = {"kvsim", "compare", t->db, "--match", "tokens", "--at", "1e6", "--json", NULL};
    assert_int_equal(run_cli(argm, t->out, t->err), 0);
    text = kvs_test_slurp(t->out, NULL);
    kvs_json *root = NULL;
    expect_ok(kvs_json_parse(text, strlen(text), &root));
    assert_string_equal(kvs_json_string(kvs_json_get(root, "match")), "tokens");
    assert_true(kvs_json_number(kvs_json_get(root, "at")) == 1e6);
    const kvs_json *series = kvs_json_get(root, "series");
    assert_int_equal(kvs_json_len(series), 6);
    for (size_t i = 0; i < kvs_json_len(series); i++) {
        const kvs_json *s = kvs_json_at(series, i);
        assert_string_equal(kvs_json_string(kvs_json_get(s, "status")), "out_of_range");
        assert_int_equal(kvs_json_type_of(kvs_json_get(s, "values")), KVS_JSON_NULL);
        assert_int_equal(kvs_json_len(kvs_json_get(s, "x_range")), 2);
    }
    kvs_json_free(root);
    free(text);
}

/* 1 when the table row of `policy` has exactly `flags` in its flags column (the field after the name). */
__attribute__((noinline)) static int row_flags_are(const char *text, const char *policy, const char *flags) {
    char key[64];
    snprintf(key, sizeof key, "\n%s ", policy);
    const char *row = strstr(text, key);
    if (!row) return 0;
    row += strlen(key);
    row += strspn(row, " ");
    return !strncmp(row, flags, strlen(flags)) && row[strlen(flags)] == ' ';
}

/* One layout: in the table after the "policy ..." header, every row's params text starts in the column where
 * the header's "params" does, after a blank (params last, of free length); rows end at the legend. */
__attribute__((noinline)) static int params_column_aligned(const char *text) {
    const char *hdr = strstr(text, "\npolicy ");
    if (!hdr || !strstr(hdr, "params")) return 0;
    hdr++;
    size_t at = (size_t)(strstr(hdr, "params") - hdr);
    int rows = 0;
    for (const char *ln = strchr(hdr, '\n'); ln && ln[1] && strncmp(ln + 1, "O  ", 3); ln = strchr(ln + 1, '\n')) {
        const char *row = ln + 1, *eol = strchr(row, '\n');
        if (!eol || (size_t)(eol - row) <= at || row[at - 1] != ' ' || row[at] == ' ') return 0;
        rows++;
    }
    return rows > 0;
}

static void test_table_and_json_output(void **state) {
    tmp_ctx *t = *state;
    need_bin();
    char *argv[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "4096", NULL};
    assert_int_equal(run_cli(argv, t->out, t->err), 0);
    char *text = kvs_test_slurp(t->out, NULL);
    assert_non_null(strstr(text, "storage_bytes_mean = 4096"));
    assert_true(row_flags_are(text, "topk", "O")); /* the oracle flag */
    assert_non_null(strstr(text, "O  oracle: looks at full attention"));       /* and its legend */
    assert_non_null(strstr(text, "out of range [512B, 2.00KiB]"));
    assert_non_null(strstr(text, "no recorded storage_bytes_mean"));
    assert_non_null(strstr(text, "sorted by out_err_mean (lower is better)"));
    /* h2o a/decode is an exact match at 4096 (run id_h2o64) */
    char want[64];
    snprintf(want, sizeof want, "#%lld at 4.00KiB (exact)", (long long)id_h2o64);
    assert_non_null(strstr(text, want));
    assert_true(params_column_aligned(text));
    free(text);

    char *argj[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "2048", "--json", "--metric",
                    "attn_recall_mean", NULL};
    assert_int_equal(run_cli(argj, t->out, t->err), 0);
    text = kvs_test_slurp(t->out, NULL);
    kvs_json *root = NULL;
    expect_ok(kvs_json_parse(text, strlen(text), &root));
    assert_string_equal(kvs_json_string(kvs_json_get(root, "x")), "storage_bytes_mean");
    const kvs_json *series = kvs_json_get(root, "series");
    /* attn_recall is higher-is-better: topk (.9) first, then h2o/a/decode (.625), then the .5 series */
    const kvs_json *s0 = kvs_json_at(series, 0), *s1 = kvs_json_at(series, 1);
    assert_string_equal(kvs_json_string(kvs_json_get(s0, "policy")), "topk");
    assert_true(kvs_json_bool(kvs_json_get(s0, "is_oracle")));
    assert_string_equal(kvs_json_string(kvs_json_get(s0, "label")), "topk (oracle)");
    assert_string_equal(kvs_json_string(kvs_json_get(s1, "policy")), "h2o");
    assert_string_equal(kvs_json_string(kvs_json_get(s1, "status")), "interpolated");
    assert_true(fabs(kvs_json_number(kvs_json_get(kvs_json_get(s1, "values"), "attn_recall_mean")) - 0.625) < 1e-12);
    assert_true(fabs(kvs_json_number(kvs_json_get(s1, "t")) - 0.5) < 1e-12);
    const kvs_json *runs = kvs_json_get(s1, "runs");
    assert_true(kvs_json_number(kvs_json_at(runs, 0)) == (double)id_h2o16);
    assert_true(kvs_json_number(kvs_json_at(runs, 1)) == (double)id_h2o64);
    assert_string_equal(kvs_json_string(kvs_json_get(kvs_json_get(s1, "trace"), "path")), "/traces/a.kvt");
    kvs_json_free(root);
    free(text);
    (void)id_st16;
}

static void test_bad_options_and_databases(void **state) {
    tmp_ctx *t = *state;
    need_bin();
    char *db = t->db;
    char *usage[][12] = {
        {"kvsim", "compare", NULL},
        {"kvsim", "compare", db, "--at", "2K", NULL},
        {"kvsim", "compare", db, "--match", "mem", NULL},
        {"kvsim", "compare", db, "--match", "memory", "--at", "2K", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "0", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "-5", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "12Q", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "K", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "nan", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--metric", "bogus_mean", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--metric", "out_err", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--metric", "out_err_n", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--metric", "out_err_mean,", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--csv", "--json", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--budget", "32", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--run", "1", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--measure", "sometimes", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--frobnicate", NULL},
        {"kvsim", "compare", db, db, "--match", "mem", "--at", "2K", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--x-stat", "p95", NULL},
        {"kvsim", "compare", db, "--match", "tokens", "--at", "8", "--x-stat", "max", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--x-stat", "max", "--x-stat", "max", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--x-stat", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--max-ratio", "0.5", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--max-ratio", "nan", NULL},
        {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--max-ratio", "4x", NULL},
    };
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        int rc = run_cli(usage[i], t->out, t->err);
        if (rc != 2) {
            fprintf(stderr, "case %zu: exit %d, expected 2\n", i, rc);
            fail();
        }
        char *e = kvs_test_slurp(t->err, NULL);
        assert_non_null(strstr(e, "kvsim compare: "));
        free(e);
    }
    char *bad_at[] = {"kvsim", "compare", db, "--match", "mem", "--at", "12Q", NULL};
    assert_int_equal(run_cli(bad_at, t->out, t->err), 2);
    char *e = kvs_test_slurp(t->err, NULL);
    assert_non_null(strstr(e, "--at: '12Q' has an unknown suffix"));
    free(e);

    char missing[192], empty[192], text[192];
    snprintf(missing, sizeof missing, "%s/missing.db", t->dir);
    snprintf(empty, sizeof empty, "%s/empty.db", t->dir);
    snprintf(text, sizeof text, "%s/notes.txt", t->dir);
    kvs_results_db *rdb = NULL;
    expect_ok(kvs_results_open(empty, &rdb));
    kvs_results_close(rdb);
    FILE *f = fopen(text, "w");
    assert_non_null(f);
    fputs("not a database, only text long enough to have a header\n", f);
    fclose(f);
    char *fails[][8] = {
        {"kvsim", "compare", missing, "--match", "mem", "--at", "2K", NULL},
        {"kvsim", "compare", empty, "--match", "mem", "--at", "2K", NULL},
        {"kvsim", "compare", text, "--match", "mem", "--at", "2K", NULL},
    };
    for (size_t i = 0; i < 3; i++) assert_int_equal(run_cli(fails[i], t->out, t->err), 1);
    e = kvs_test_slurp(t->err, NULL);
    assert_non_null(strstr(e, "not a kvsim results database"));
    free(e);
    assert_int_equal(access(missing, F_OK), -1); /* compare never creates a database */
    char *nothing[] = {"kvsim", "compare", db, "--match", "mem", "--at", "2K", "--policy", "nosuch", NULL};
    assert_int_equal(run_cli(nothing, t->out, t->err), 1);
    e = kvs_test_slurp(t->err, NULL);
    assert_non_null(strstr(e, "no complete runs of policy 'nosuch'"));
    free(e);
    if (access("/dev/full", W_OK) == 0) {
        char *full[] = {"kvsim", "compare", db, "--match", "mem", "--at", "2K", NULL};
        assert_int_equal(run_cli(full, "/dev/full", t->err), 1);
        e = kvs_test_slurp(t->err, NULL);
        assert_non_null(strstr(e, "writing the output failed"));
        free(e);
    }
    char *help[] = {"kvsim", "compare", "--help", NULL};
    assert_int_equal(run_cli(help, t->out, t->err), 0);
    char *h = kvs_test_slurp(t->out, NULL);
    assert_non_null(strstr(h, "3.5MiB"));
    assert_non_null(strstr(h, "out of range"));
    free(h);
}

/* ------------------------------------------------------------------------------------------------
 * Series by what they measured: the trace's content, the bytes per element, the flags of kvsim runs
 * ---------------------------------------------------------------------------------------------- */

static const char SHA_A[] = "a1a2a3a4b5b6c7c8d9d0e1e2f3f4a5a6b7b8c9c0d1d2e3e4f5f6a7a8b9b0c1c2";
static const char SHA_B[] = "0f0e0d0c0b0a09080706050403020100f0e0d0c0b0a090807060504030201000";

/* Opens a fresh database for a test of its own (the study of setup_db stays as it is). */
static kvs_results_db *fresh_db(tmp_ctx *t, const char *name) {
    snprintf(t->db, sizeof t->db, "%s/%s", t->dir, name);
    kvs_results_db *db = NULL;
    expect_ok(kvs_results_open(t->db, &db));
    return db;
}

/* The row of the CSV whose `col` reads `want` (and col2 reads want2 when col2 is not NULL); fails when none or
 * several. */
static int row_where(const csv_table *c, const char *col, const char *want, const char *col2, const char *want2) {
    int found = -1;
    for (int i = 0; i < c->n_rows; i++)
        if (!strcmp(cell(c, i, col), want) && (!col2 || !strcmp(cell(c, i, col2), want2))) {
            if (found >= 0) {
                fprintf(stderr, "two rows with %s = %s\n", col, want);
                fail();
            }
            found = i;
        }
    if (found < 0) {
        fprintf(stderr, "no row with %s = %s%s%s\n", col, want, col2 ? " and " : "", col2 ? want2 : "");
        fail();
    }
    return found;
}

/* One trace file named by two paths (one content hash) is one series; two different files with one base name are
 * two, labelled by model and hash; without a hash, two files with one base name get their traces row in the label. */
static void test_series_are_traces_by_content(void **state) {
    tmp_ctx *t = *state;
    need_bin();
    kvs_results_db *db = fresh_db(t, "traces.db");
    int64_t a16 = put_run_ex(db, (run_spec){"/data/a.kvt", "m1", "h2o", "", "decode", 0, 16, 1024, 512, .5, 1, .5, .5},
        (run_extra){.sha = SHA_A});
    int64_t a64 = put_run_ex(db, (run_spec){"/data/./x/../a.kvt", "m1", "h2o", "", "decode", 0, 64, 4096, 2048, .25, .5,
                                         .75, .5}, (run_extra){.sha = SHA_A});
    put_run_ex(db, (run_spec){"/other/a.kvt", "m1", "h2o", "", "decode", 0, 16, 1024, 512, .75, 1, .5, .5},
        (run_extra){.sha = SHA_B});
    put_run_ex(db, (run_spec){"/other/a.kvt", "m1", "h2o", "", "decode", 0, 64, 4096, 2048, .5, 1, .5, .5},
        (run_extra){.sha = SHA_B});
    put_run(db, (run_spec){"/p/b.kvt", "m1", "tova", "", "decode", 0, 16, 2048, 512, .5, 1, .5, .5});
    put_run(db, (run_spec){"/q/b.kvt", "m1", "tova", "", "decode", 0, 16, 2048, 512, .25, 1, .5, .5});
    kvs_results_close(db);
    csv_table c;
    const char *args[] = {"--match", "mem", "--at", "2KiB", "--metric", "out_err_mean", "--per-trace", NULL};
    compare_csv(t, args, &c);
    assert_int_equal(c.n_rows, 4); /* h2o on two traces, tova on two */
    /* the two spellings of SHA_A's file: one series from both runs, t = 1/2 in ln x: (.5 + .25) / 2 */
    int r = row_where(&c, "trace_sha256", SHA_A, NULL, NULL);
    expect_str(&c, r, "trace_label", "m1@a1a2a3a4");
    expect_str(&c, r, "status", "interpolated");
    expect_num(&c, r, "run_lo", (double)a16);
    expect_num(&c, r, "run_hi", (double)a64);
    expect_num(&c, r, "out_err_mean", 0.375);
    r = row_where(&c, "trace_sha256", SHA_B, NULL, NULL);
    expect_str(&c, r, "trace_label", "m1@0f0e0d0c");
    expect_num(&c, r, "out_err_mean", 0.625);
    /* no hash recorded: the base name, made unique by the traces row */
    int p = row_where(&c, "trace", "/p/b.kvt", NULL, NULL), q = row_where(&c, "trace", "/q/b.kvt", NULL, NULL);
    assert_string_not_equal(cell(&c, p, "trace_label"), cell(&c, q, "trace_label"));
    assert_non_null(strstr(cell(&c, p, "trace_label"), "b.kvt (trace "));
    expect_str(&c, p, "trace_sha256", "");
    free(c.text);
    /* the table names the traces by the same labels */
    char *argv[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "2KiB", "--per-trace", NULL};
    assert_int_equal(run_cli(argv, t->out, t->err), 0);
    char *text = kvs_test_slurp(t->out, NULL);
    assert_non_null(strstr(text, "m1@a1a2a3a4"));
    assert_non_null(strstr(text, "m1@0f0e0d0c"));
    assert_non_null(strstr(text, ": 4 series"));
    free(text);
}

/* Runs that differ only by --kv-bytes/--aux-bytes are two series (never averaged), labelled by their bytes. */
static void test_kv_bytes_are_part_of_the_series(void **state) {
    tmp_ctx *t = *state;
    need_bin();
    kvs_results_db *db = fresh_db(t, "bytes.db");
    const char *kv4 = "kv_bytes=4,aux_bytes=4,series_every=0", *kv1 = "kv_bytes=1,aux_bytes=4,series_every=0";
    int64_t w8_4 = put_run_ex(db, (run_spec){"/t/a.kvt", "m1", "window", "", "decode", 0, 8, 1024, 1024, .5, 1, .5, .5},
        (run_extra){.sha = SHA_A, .options = kv4});
    put_run_ex(db, (run_spec){"/t/a.kvt", "m1", "window", "", "decode", 0, 32, 4096, 4096, .25, 1, .5, .5},
        (run_extra){.sha = SHA_A,
                           .options = kv4});
    int64_t w8_1 = put_run_ex(db, (run_spec){"/t/a.kvt", "m1", "window", "", "decode", 0, 8, 256, 256, .5, 1, .5, .5},
        (run_extra){.sha = SHA_A, .options = kv1});
    int64_t w32_1 = put_run_ex(db, (run_spec){"/t/a.kvt", "m1", "window", "", "decode", 0, 32, 1024, 1024, .25, 1, .5,
                                           .5}, (run_extra){.sha = SHA_A, .options = kv1});
    kvs_results_close(db);
    csv_table c;
    /* at budget 8: 1 KiB with 4-byte elements, 256 B with 1-byte ones (not their mean, 640 B) */
    const char *tok[] = {"--match", "tokens", "--at", "8", "--metric", "storage_bytes_mean", NULL};
    compare_csv(t, tok, &c);
    assert_int_equal(c.n_rows, 2);
    int r4 = row_where(&c, "kv_bytes", "4", NULL, NULL), r1 = row_where(&c, "kv_bytes", "1", NULL, NULL);
    expect_num(&c, r4, "storage_bytes_mean", 1024);
    expect_num(&c, r4, "run_lo", (double)w8_4);
    expect_num(&c, r1, "storage_bytes_mean", 256);
    expect_num(&c, r1, "run_lo", (double)w8_1);
    expect_str(&c, r1, "aux_bytes", "4");
    free(c.text);
    /* at 1 KiB: the 4-byte series is exact at budget 8 (err .5), the 1-byte one at budget 32 (err .25) */
    const char *mem[] = {"--match", "mem", "--at", "1KiB", "--metric", "out_err_mean", "--json", NULL};
    char *argv[16] = {"kvsim", "compare", t->db};
    int n = 3;
    for (const char *const *a = mem; *a; a++) argv[n++] = (char *)*a;
    argv[n] = NULL;
    assert_int_equal(run_cli(argv, t->out, t->err), 0);
    char *text = kvs_test_slurp(t->out, NULL);
    kvs_json *root = NULL;
    expect_ok(kvs_json_parse(text, strlen(text), &root));
    const kvs_json *series = kvs_json_get(root, "series");
    assert_int_equal(kvs_json_len(series), 2);
    const kvs_json *s0 = kvs_json_at(series, 0), *s1 = kvs_json_at(series, 1);
    assert_string_equal(kvs_json_string(kvs_json_get(s0, "label")), "window [kv_bytes=1,aux_bytes=4]");
    assert_true(kvs_json_number(kvs_json_get(s0, "kv_bytes")) == 1);
    assert_true(kvs_json_number(kvs_json_at(kvs_json_get(s0, "runs"), 0)) == (double)w32_1);
    assert_true(kvs_json_number(kvs_json_get(kvs_json_get(s0, "values"), "out_err_mean")) == 0.25);
    assert_string_equal(kvs_json_string(kvs_json_get(s1, "label")), "window [kv_bytes=4,aux_bytes=4]");
    assert_true(kvs_json_number(kvs_json_get(kvs_json_get(s1, "values"), "out_err_mean")) == 0.5);
    kvs_json_free(root);
    free(text);
    /* the table says which is which */
    char *tab[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "1KiB", NULL};
    assert_int_equal(run_cli(tab, t->out, t->err), 0);
    text = kvs_test_slurp(t->out, NULL);
    assert_non_null(strstr(text, "- [kv_bytes=1,aux_bytes=4]\n"));
    assert_non_null(strstr(text, "- [kv_bytes=4,aux_bytes=4]\n"));
    free(text);
}

/* Runs that differ only by their codec are two series, and every view names each row's codec: the table after the
 * params (as kvs_results_run_label names runs), the CSV's codec column, the JSON's "codec"; across traces too. */
static const char INT4[] = "int:bits=4,group=32,k_axis=token,v_axis=channel";
static const char KIVI2[] = "kivi:bits=2,group=32,residual=32";

static void put_codec_pair(kvs_results_db *db, const char *trace, const char *sha, const char *codec, double err) {
    put_run_ex(db, (run_spec){trace, "m1", "window", "", "decode", 0, 16, 1024, 512, err, err, .5, .5},
               (run_extra){.sha = sha, .codec = codec});
    put_run_ex(db, (run_spec){trace, "m1", "window", "", "decode", 0, 64, 4096, 2048, err / 2, err / 2, .75, .5},
               (run_extra){.sha = sha, .codec = codec});
}

static void test_codec_runs_are_rows_naming_their_codec(void **state) {
    tmp_ctx *t = *state;
    need_bin();
    kvs_results_db *db = fresh_db(t, "codec.db");
    put_codec_pair(db, "/t/a.kvt", SHA_A, INT4, .5);
    put_codec_pair(db, "/t/a.kvt", SHA_A, KIVI2, .75);
    put_codec_pair(db, "/t/a.kvt", SHA_A, NULL, .25);
    kvs_results_close(db);

    /* CSV: three series at 2 KiB (t = 1/2 in ln x between 1 KiB and 4 KiB: 3/4 of each budget-16 error) */
    csv_table c;
    const char *args[] = {"--match", "mem", "--at", "2KiB", "--metric", "out_err_mean", "--per-trace", NULL};
    compare_csv(t, args, &c);
    assert_string_equal(c.head[2], "codec"); /* beside the params, before the flags */
    assert_int_equal(c.n_rows, 3);
    int ri = row_where(&c, "codec", INT4, NULL, NULL), rk = row_where(&c, "codec", KIVI2, NULL, NULL),
        rn = row_where(&c, "codec", "", NULL, NULL);
    expect_str(&c, ri, "policy", "window");
    expect_str(&c, rk, "policy", "window");
    expect_num(&c, rn, "out_err_mean", .25 * .75);
    expect_num(&c, ri, "out_err_mean", .5 * .75);
    expect_num(&c, rk, "out_err_mean", .75 * .75);
    free(c.text);

    /* the text table: each row's params cell ends in its codec ("-" = no params) */
    char *tab[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "2KiB", "--per-trace", NULL};
    assert_int_equal(run_cli(tab, t->out, t->err), 0);
    char *text = kvs_test_slurp(t->out, NULL), want[256];
    snprintf(want, sizeof want, "  - [%s]\n", INT4);
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof want, "  - [%s]\n", KIVI2);
    assert_non_null(strstr(text, want));
    assert_non_null(strstr(text, "  -\n")); /* the run without a codec: no brackets */
    assert_true(params_column_aligned(text));
    free(text);

    /* JSON: "codec" beside the params, null without one; the label as kvs_results_run_label names the run */
    char *js[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "2KiB", "--per-trace", "--json", NULL};
    assert_int_equal(run_cli(js, t->out, t->err), 0);
    text = kvs_test_slurp(t->out, NULL);
    kvs_json *root = NULL;
    expect_ok(kvs_json_parse(text, strlen(text), &root));
    const kvs_json *series = kvs_json_get(root, "series");
    assert_int_equal(kvs_json_len(series), 3);
    /* sorted by out_err_mean: no codec, int4, kivi2 */
    const kvs_json *c0 = kvs_json_get(kvs_json_at(series, 0), "codec");
    assert_non_null(c0); /* present, and null */
    assert_int_equal(kvs_json_type_of(c0), KVS_JSON_NULL);
    assert_string_equal(kvs_json_string(kvs_json_get(kvs_json_at(series, 1), "codec")), INT4);
    assert_string_equal(kvs_json_string(kvs_json_get(kvs_json_at(series, 2), "codec")), KIVI2);
    snprintf(want, sizeof want, "window [%s]", INT4);
    assert_string_equal(kvs_json_string(kvs_json_get(kvs_json_at(series, 1), "label")), want);
    kvs_json_free(root);
    free(text);

    /* across traces: three groups, the CSV's codec column and the table's params cell name them */
    const char *across[] = {"--match", "mem", "--at", "2KiB", "--metric", "out_err_mean", "--across-traces", NULL};
    compare_csv(t, across, &c);
    assert_string_equal(c.head[2], "codec");
    assert_int_equal(c.n_rows, 3);
    ri = row_where(&c, "codec", INT4, NULL, NULL);
    snprintf(want, sizeof want, "window [%s]", INT4);
    expect_str(&c, ri, "label", want);
    expect_num(&c, ri, "out_err_mean", .5 * .75);
    expect_num(&c, row_where(&c, "codec", "", NULL, NULL), "out_err_mean", .25 * .75);
    free(c.text);
    char *acr[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "2KiB", "--across-traces", NULL};
    assert_int_equal(run_cli(acr, t->out, t->err), 0);
    text = kvs_test_slurp(t->out, NULL);
    snprintf(want, sizeof want, "  - [%s]\n", KIVI2);
    assert_non_null(strstr(text, want));
    free(text);
}

/* The flags of kvsim runs: P (prompt-only budget) on the series, N when a run the value comes from has a note. */
static void test_prompt_only_and_note_flags(void **state) {
    tmp_ctx *t = *state;
    need_bin();
    kvs_results_db *db = fresh_db(t, "flags.db");
    put_run_ex(db, (run_spec){"/t/a.kvt", "m1", "snapkv", "", "decode", 0, 16, 512, 512, .5, 1, .5, .5},
        (run_extra){.notes =
                           "window of the last 16 positions"});
    put_run(db, (run_spec){"/t/a.kvt", "m1", "snapkv", "", "decode", 0, 32, 1024, 1024, .4, 1, .5, .5});
    put_run(db, (run_spec){"/t/a.kvt", "m1", "snapkv", "", "decode", 0, 64, 2048, 2048, .3, 1, .5, .5});
    put_run_ex(db, (run_spec){"/t/a.kvt", "m1", "pyramidkv", "", "decode", 0, 16, 700, 700, .45, 1, .5, .5},
        (run_extra){.scope = "prompt"});
    put_run_ex(db, (run_spec){"/t/a.kvt", "m1", "pyramidkv", "", "decode", 0, 64, 2200, 2200, .2, 1, .5, .5},
        (run_extra){.scope = "prompt"});
    kvs_results_close(db);
    csv_table c;
    /* at 768 B snapkv lies between its runs at 16 (noted) and 32: N; pyramidkv is prompt-only: P */
    const char *lo[] = {"--match", "mem", "--at", "768", "--metric", "out_err_mean", NULL};
    compare_csv(t, lo, &c);
    int s = row_where(&c, "policy", "snapkv", NULL, NULL), p = row_where(&c, "policy", "pyramidkv", NULL, NULL);
    expect_str(&c, s, "flags", "N");
    expect_str(&c, s, "degenerate", "1");
    expect_str(&c, s, "prompt_only", "0");
    expect_str(&c, p, "flags", "P");
    expect_str(&c, p, "prompt_only", "1");
    expect_str(&c, p, "degenerate", "0");
    free(c.text);
    /* at 1.5 KiB snapkv lies between 32 and 64, neither noted: no N */
    const char *hi[] = {"--match", "mem", "--at", "1536", "--metric", "out_err_mean", NULL};
    compare_csv(t, hi, &c);
    s = row_where(&c, "policy", "snapkv", NULL, NULL);
    expect_str(&c, s, "flags", "");
    expect_str(&c, s, "degenerate", "0");
    free(c.text);
    char *argv[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "768", NULL};
    assert_int_equal(run_cli(argv, t->out, t->err), 0);
    char *text = kvs_test_slurp(t->out, NULL);
    assert_true(row_flags_are(text, "snapkv", "N"));
    assert_true(row_flags_are(text, "pyramidkv", "P"));
    assert_non_null(strstr(text, "\nP  prompt-only budget"));
    assert_non_null(strstr(text, "\nN  note: a run this row's value comes from"));
    free(text);
}

/* --x-stat max: x is the peak resident bytes (storage_bytes_max), as kvsim plot --x-stat max. */
static void test_x_stat_max(void **state) {
    tmp_ctx *t = *state;
    need_bin();
    kvs_results_db *db = fresh_db(t, "xstat.db");
    int64_t b16 = put_run_ex(db, (run_spec){"/t/a.kvt", "m1", "h2o", "", "decode", 0, 16, 1000, 500, .5, 1, .5, .5},
        (run_extra){.storage_max = 2000});
    int64_t b64 = put_run_ex(db, (run_spec){"/t/a.kvt", "m1", "h2o", "", "decode", 0, 64, 4000, 2000, .25, 1, .5, .5},
        (run_extra){.storage_max = 8000});
    kvs_results_close(db);
    csv_table c;
    /* peak 2000 .. 8000 brackets 4000 at t = ln 2 / ln 4 = 1/2; the mean column is interpolated, the peak is X */
    const char *mx[] = {"--match", "mem", "--at", "4000", "--x-stat", "max", "--metric",
                        "out_err_mean,storage_bytes_mean,storage_bytes_max", NULL};
    compare_csv(t, mx, &c);
    expect_str(&c, 0, "x", "storage_bytes_max");
    expect_str(&c, 0, "status", "interpolated");
    expect_num(&c, 0, "run_lo", (double)b16);
    expect_num(&c, 0, "run_hi", (double)b64);
    expect_num(&c, 0, "x_lo", 2000);
    expect_num(&c, 0, "x_hi", 8000);
    expect_num(&c, 0, "out_err_mean", 0.375);
    expect_num(&c, 0, "storage_bytes_mean", 2500);
    expect_num(&c, 0, "storage_bytes_max", 4000);
    free(c.text);
    /* the mean: 4000 is the run at budget 64 exactly */
    const char *mean[] = {"--match", "mem", "--at", "4000", "--x-stat", "mean", "--metric", "out_err_mean", NULL};
    compare_csv(t, mean, &c);
    expect_str(&c, 0, "x", "storage_bytes_mean");
    expect_str(&c, 0, "status", "exact");
    expect_num(&c, 0, "run_lo", (double)b64);
    expect_num(&c, 0, "out_err_mean", 0.25);
    free(c.text);
    char *argv[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "4000", "--x-stat", "max", NULL};
    assert_int_equal(run_cli(argv, t->out, t->err), 0);
    char *text = kvs_test_slurp(t->out, NULL);
    assert_non_null(strstr(text, "compare at storage_bytes_max = 4000"));
    free(text);
}

/* A real MorphKV sweep on the bundled trace: its resident bytes jump from 1 KiB (budget 32: its recent window
 * R = 32 leaves no distant slot, no profile) to 18 KiB (budget 64). Between those two runs compare gives no value
 * (a gap naming both); between runs at most 4x apart it interpolates, and every number it prints is recomputed
 * here from `kvsim runs --csv --summary`. */
typedef struct {
    int64_t id;
    double x, err, recall;
} run_point;

static run_point point_of(const csv_table *runs, const char *policy, const char *budget) {
    int r = row_where(runs, "policy", policy, "budget_tokens", budget);
    run_point p = {.id = strtoll(cell(runs, r, "run_id"), NULL, 10),
                   .x = strtod(cell(runs, r, "storage_bytes_mean"), NULL),
                   .err = strtod(cell(runs, r, "out_err_mean"), NULL),
                   .recall = strtod(cell(runs, r, "attn_recall_mean"), NULL)};
    return p;
}

/* The value at X between a and b, in ln x, written out as the method states it. */
static double by_hand(double X, double xa, double va, double xb, double vb) {
    double t = (log(X) - log(xa)) / (log(xb) - log(xa));
    return va + t * (vb - va);
}

static void expect_near(const csv_table *c, int row, const char *col, double want) {
    const char *s = cell(c, row, col);
    double v = strtod(s, NULL);
    if (!s[0] || fabs(v - want) > 1e-12 * fmax(1, fabs(want))) {
        fprintf(stderr, "row %d %s: '%s', recomputed %.17g\n", row, col, s, want);
        fail();
    }
}

static void test_gap_on_a_morphkv_sweep(void **state) {
    tmp_ctx *t = *state;
    need_bin();
    char trace[4096];
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    snprintf(t->db, sizeof t->db, "%s/morph.db", t->dir);
    char *rep[] = {"kvsim", "replay", trace, "--db", t->db, "--policy", "morphkv", "--policy", "window", "--budgets",
                   "16,32,64,128", NULL};
    assert_int_equal(run_cli(rep, t->out, t->err), 0);
    csv_table runs;
    char *rargv[] = {"kvsim", "runs", t->db, "--csv", "--summary", NULL};
    cli_csv(t, rargv, &runs);
    run_point m32 = point_of(&runs, "morphkv", "32"), m64 = point_of(&runs, "morphkv", "64"),
              m128 = point_of(&runs, "morphkv", "128"), w64 = point_of(&runs, "window", "64"),
              w128 = point_of(&runs, "window", "128");
    assert_true(m64.x / m32.x > 4); /* the jump this test is about */
    assert_true(m128.x / m64.x <= 4);

    csv_table c;
    const char *at3k[] = {"--match", "mem", "--at", "3KiB", "--metric", "out_err_mean,attn_recall_mean", NULL};
    compare_csv(t, at3k, &c);
    int m = row_where(&c, "policy", "morphkv", NULL, NULL), w = row_where(&c, "policy", "window", NULL, NULL);
    expect_str(&c, m, "status", "gap");
    expect_num(&c, m, "run_lo", (double)m32.id);
    expect_num(&c, m, "run_hi", (double)m64.id);
    expect_num(&c, m, "budget_lo", 32);
    expect_num(&c, m, "budget_hi", 64);
    expect_near(&c, m, "x_lo", m32.x);
    expect_near(&c, m, "x_hi", m64.x);
    expect_str(&c, m, "out_err_mean", "");
    expect_str(&c, m, "flags", "N"); /* budget 32 is a degenerate MorphKV (a window of the last 32) */
    expect_str(&c, w, "status", "interpolated");
    expect_num(&c, w, "run_lo", (double)w64.id);
    expect_num(&c, w, "run_hi", (double)w128.id);
    expect_near(&c, w, "out_err_mean", by_hand(3072, w64.x, w64.err, w128.x, w128.err));
    expect_near(&c, w, "attn_recall_mean", by_hand(3072, w64.x, w64.recall, w128.x, w128.recall));
    assert_true(m > w); /* a gap after every series with a value */
    free(c.text);

    /* between MorphKV's runs at 64 and 128 (2x apart) it interpolates */
    const char *at24k[] = {"--match", "mem", "--at", "24KiB", "--metric", "out_err_mean,attn_recall_mean", NULL};
    compare_csv(t, at24k, &c);
    m = row_where(&c, "policy", "morphkv", NULL, NULL);
    expect_str(&c, m, "status", "interpolated");
    expect_str(&c, m, "flags", "");
    expect_near(&c, m, "out_err_mean", by_hand(24576, m64.x, m64.err, m128.x, m128.err));
    expect_near(&c, m, "attn_recall_mean", by_hand(24576, m64.x, m64.recall, m128.x, m128.recall));
    free(c.text);

    /* --max-ratio inf lifts the rule: the span is interpolated (a value no MorphKV configuration was measured at) */
    const char *inf[] = {"--match", "mem", "--at", "3KiB", "--metric", "out_err_mean", "--max-ratio", "inf", NULL};
    compare_csv(t, inf, &c);
    m = row_where(&c, "policy", "morphkv", NULL, NULL);
    expect_str(&c, m, "status", "interpolated");
    expect_near(&c, m, "out_err_mean", by_hand(3072, m32.x, m32.err, m64.x, m64.err));
    free(c.text);
    const char *wide[] = {"--match", "mem", "--at", "3KiB", "--metric", "out_err_mean", "--max-ratio", "20", NULL};
    compare_csv(t, wide, &c);
    expect_str(&c, row_where(&c, "policy", "morphkv", NULL, NULL), "status", "interpolated");
    free(c.text);

    /* the table and JSON name the two configurations */
    char *tab[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "3KiB", NULL};
    assert_int_equal(run_cli(tab, t->out, t->err), 0);
    char *text = kvs_test_slurp(t->out, NULL), want[160], xa[32], xb[32];
    snprintf(xa, sizeof xa, "%.2fKiB", m32.x / 1024);
    snprintf(xb, sizeof xb, "%.1fKiB", m64.x / 1024);
    snprintf(want, sizeof want, "gap: #%lld (budget 32) at %s .. #%lld (budget 64) at %s, x ratio %.3g > 4",
             (long long)m32.id, xa, (long long)m64.id, xb, m64.x / m32.x);
    if (!strstr(text, want)) {
        fprintf(stderr, "no '%s' in:\n%s\n", want, text);
        fail();
    }
    assert_non_null(strstr(text, "\ngap: the two runs around X are more than 4x apart"));
    free(text);
    char *js[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "3KiB", "--json", NULL};
    assert_int_equal(run_cli(js, t->out, t->err), 0);
    text = kvs_test_slurp(t->out, NULL);
    kvs_json *root = NULL;
    expect_ok(kvs_json_parse(text, strlen(text), &root));
    assert_true(kvs_json_number(kvs_json_get(root, "max_ratio")) == 4);
    const kvs_json *series = kvs_json_get(root, "series"), *g = NULL;
    for (size_t i = 0; i < kvs_json_len(series); i++)
        if (!strcmp(kvs_json_string(kvs_json_get(kvs_json_at(series, i), "policy")), "morphkv"))
            g = kvs_json_at(series, i);
    assert_non_null(g);
    assert_string_equal(kvs_json_string(kvs_json_get(g, "status")), "gap");
    assert_true(kvs_json_number(kvs_json_at(kvs_json_get(g, "runs"), 0)) == (double)m32.id);
    assert_true(kvs_json_number(kvs_json_at(kvs_json_get(g, "budgets"), 1)) == 64);
    assert_int_equal(kvs_json_type_of(kvs_json_get(g, "values")), KVS_JSON_NULL);
    assert_int_equal(kvs_json_type_of(kvs_json_get(g, "t")), KVS_JSON_NULL);
    kvs_json_free(root);
    free(text);
    free(runs.text);
}

/* ------------------------------------------------------------------------------------------------
 * Across traces: a configuration's mean over the traces of its model, its bootstrap interval, paired differences
 * ---------------------------------------------------------------------------------------------- */

/* Five traces of model "mp" (content hashes H0..H4, in ascending order) and, for a one-trace set beside them, one
 * trace of model "solo". Per trace i the values at X = 2 KiB (out_err_mean) are set by hand:
 *   alpha : exact at 2 KiB                  .30 .50 .20 .40 .60            (mean .40)
 *   beta  : alpha + .02 .03 .01 .025 .015   (mean .42; on H0 interpolated halfway in ln x between 1 KiB (.42) and
 *           4 KiB (.22): .32): the traces' spread dwarfs the difference, the paired difference is always > 0
 *   delta : alpha + .05 -.04 .04 -.03 0     (mean .404): a paired difference whose interval holds 0
 *   gamma : .90 .80 .85 exact on H0..H2; a gap on H3 (1 KiB .. 8 KiB, 8x apart); out of range on H4 (4, 8 KiB)
 *   zeta  : .70 .75 on H0, H1 only (not run on H2..H4) */
static const char *const HX[5] = {
    "1000000000000000000000000000000000000000000000000000000000000000",
    "2000000000000000000000000000000000000000000000000000000000000000",
    "3000000000000000000000000000000000000000000000000000000000000000",
    "4000000000000000000000000000000000000000000000000000000000000000",
    "5000000000000000000000000000000000000000000000000000000000000000",
};
static const char HSOLO[] = "9000000000000000000000000000000000000000000000000000000000000000";
static const double ALPHA[5] = {.30, .50, .20, .40, .60}, BETA_D[5] = {.02, .03, .01, .025, .015},
                    DELTA_D[5] = {.05, -.04, .04, -.03, 0}, GAMMA[3] = {.90, .80, .85}, ZETA[2] = {.70, .75};

static void put_at(kvs_results_db *db, int trace, const char *policy, double x, double err) {
    char path[64];
    const char *sha = trace < 5 ? HX[trace] : HSOLO;
    snprintf(path, sizeof path, "/traces/p%d.kvt", trace);
    put_run_ex(db, (run_spec){path, trace < 5 ? "mp" : "solo", policy, "", "decode", 0, (int64_t)x / 64, x, x, err,
                              err, .5, .5},
               (run_extra){.sha = sha});
}

static void make_across_db(tmp_ctx *t) {
    kvs_results_db *db = fresh_db(t, "across.db");
    for (int i = 0; i < 5; i++) {
        put_at(db, i, "alpha", 2048, ALPHA[i]);
        put_at(db, i, "alpha", 8192, ALPHA[i] / 2);
        if (i == 0) {
            put_at(db, i, "beta", 1024, .42);
            put_at(db, i, "beta", 4096, .22);
        } else put_at(db, i, "beta", 2048, ALPHA[i] + BETA_D[i]);
        put_at(db, i, "delta", 2048, ALPHA[i] + DELTA_D[i]);
        if (i < 3) put_at(db, i, "gamma", 2048, GAMMA[i]);
        else if (i == 3) put_at(db, i, "gamma", 1024, .9), put_at(db, i, "gamma", 8192, .5);
        else put_at(db, i, "gamma", 4096, .9), put_at(db, i, "gamma", 8192, .5);
        if (i < 2) put_at(db, i, "zeta", 2048, ZETA[i]);
    }
    put_at(db, 5, "alpha", 2048, .33);
    put_at(db, 5, "alpha", 4096, .22);
    kvs_results_close(db);
}

/* The seed compare.h states, written out: FNV-1a 64 of the identity string. */
static uint64_t fnv1a(const char *s) {
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double q7(const double *v, size_t n, double q) { /* Hyndman-Fan type 7 */
    double pos = q * (double)(n - 1);
    size_t i = (size_t)pos;
    return i + 1 < n ? v[i] + (pos - (double)i) * (v[i + 1] - v[i]) : v[n - 1];
}

/* The percentile bootstrap of kvs_stats.h done here by hand: 2000 resamples of n units drawn by PCG32 (seed, stream
 * "boot"), each unit index = (u32 * n) >> 32, the resampled means' 2.5 % and 97.5 % quantiles. */
static void boot_by_hand(const double *x, size_t n, uint64_t seed, double *lo, double *hi) {
    double *m = malloc(2000 * sizeof *m);
    assert_non_null(m);
    kvs_rng g;
    kvs_rng_seed(&g, seed, 0x626f6f74);
    for (int b = 0; b < 2000; b++) {
        long double s = 0;
        for (size_t i = 0; i < n; i++) s += x[((uint64_t)kvs_rng_u32(&g) * n) >> 32];
        m[b] = (double)(s / (long double)n);
    }
    qsort(m, 2000, sizeof *m, cmp_dbl);
    *lo = q7(m, 2000, 0.025);
    *hi = q7(m, 2000, 0.975);
    free(m);
}

/* The trace ids of the traces listed (indices into HX), joined as the seed string joins them. */
static void ids_of(char *buf, size_t cap, const int *tr, int n) {
    buf[0] = '\0';
    for (int k = 0; k < n; k++) snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", k ? "," : "", HX[tr[k]]);
}

static int group_row(const csv_table *c, const char *policy, const char *model) {
    return row_where(c, "policy", policy, "model", model);
}

static void test_across_traces_means_and_intervals(void **state) {
    tmp_ctx *t = *state;
    need_bin();
    make_across_db(t);
    csv_table c;
    /* a model with 5 traces: the across view by default */
    const char *args[] = {"--match", "mem", "--at", "2KiB", "--metric", "out_err_mean", NULL};
    compare_csv(t, args, &c);
    assert_int_equal(c.n_rows, 6); /* alpha beta delta gamma zeta of mp, alpha of solo */
    double beta[5], delta[5];
    for (int i = 0; i < 5; i++) beta[i] = ALPHA[i] + BETA_D[i], delta[i] = ALPHA[i] + DELTA_D[i];
    beta[0] = by_hand(2048, 1024, .42, 4096, .22); /* halfway in ln x between 1 and 4 KiB */
    struct {
        const char *policy;
        const double *v;
        int n;
        int tr[5];
    } want[] = {{"alpha", ALPHA, 5, {0, 1, 2, 3, 4}}, {"beta", beta, 5, {0, 1, 2, 3, 4}},
                {"delta", delta, 5, {0, 1, 2, 3, 4}}, {"gamma", GAMMA, 3, {0, 1, 2}}, {"zeta", ZETA, 2, {0, 1}}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        int r = group_row(&c, want[k].policy, "mp");
        double sum = 0;
        for (int i = 0; i < want[k].n; i++) sum += want[k].v[i];
        expect_near(&c, r, "out_err_mean", sum / want[k].n); /* the mean, summed by hand */
        expect_num(&c, r, "out_err_mean_n", want[k].n);
        expect_num(&c, r, "n", want[k].n);
        expect_num(&c, r, "n_traces", 5);
        /* the interval: the seed of compare.h's identity string and the bootstrap, both by hand */
        char ids[512], id[1024], lo_s[64], hi_s[64];
        ids_of(ids, sizeof ids, want[k].tr, want[k].n);
        snprintf(id, sizeof id, "mem|storage_bytes_mean|2048|out_err_mean|%s||decode|-1|-1|mp|%s", want[k].policy, ids);
        double lo, hi;
        boot_by_hand(want[k].v, (size_t)want[k].n, fnv1a(id), &lo, &hi);
        expect_near(&c, r, "out_err_mean_lo", lo);
        expect_near(&c, r, "out_err_mean_hi", hi);
        double m = strtod(cell(&c, r, "out_err_mean"), NULL);
        snprintf(lo_s, sizeof lo_s, "%s", cell(&c, r, "out_err_mean_lo"));
        snprintf(hi_s, sizeof hi_s, "%s", cell(&c, r, "out_err_mean_hi"));
        assert_true(strtod(lo_s, NULL) <= m && m <= strtod(hi_s, NULL));
        assert_true(strtod(lo_s, NULL) < strtod(hi_s, NULL)); /* n >= 2 traces that differ: a real interval */
    }
    /* sorted by the mean, best first; gamma's exclusions named */
    expect_str(&c, 0, "policy", "alpha");
    expect_str(&c, 1, "policy", "delta");
    expect_str(&c, 2, "policy", "beta");
    int g = group_row(&c, "gamma", "mp"), z = group_row(&c, "zeta", "mp");
    expect_num(&c, g, "n_gap", 1);
    expect_num(&c, g, "n_out_of_range", 1);
    expect_num(&c, g, "n_not_run", 0);
    expect_str(&c, g, "excluded", "out of range: mp@50000000; gap: mp@40000000");
    expect_num(&c, z, "n_not_run", 3);
    expect_str(&c, z, "excluded", "not run: mp@30000000, mp@40000000, mp@50000000");
    /* one trace of solo: its value, no interval */
    int s = group_row(&c, "alpha", "solo");
    expect_num(&c, s, "n_traces", 1);
    expect_num(&c, s, "out_err_mean", .33);
    expect_num(&c, s, "out_err_mean_lo", .33);
    expect_num(&c, s, "out_err_mean_hi", .33);
    expect_str(&c, s, "resolved", "");
    free(c.text);

    /* the same database compared the same way: the same bytes */
    compare_csv(t, args, &c);
    char *first = c.text;
    compare_csv(t, args, &c);
    assert_string_equal(first, c.text);
    free(first);
    free(c.text);

    /* --per-trace: today's series, one per (policy, trace) */
    const char *per[] = {"--match", "mem", "--at", "2KiB", "--metric", "out_err_mean", "--per-trace", NULL};
    compare_csv(t, per, &c);
    assert_int_equal(c.n_rows, 5 + 5 + 5 + 5 + 2 + 1);
    cell(&c, 0, "trace_sha256"); /* the per-trace schema */
    free(c.text);
}

/* beta - alpha: the two configurations' own intervals overlap (the traces differ far more than the configurations),
 * yet every trace has beta above alpha: the paired interval excludes 0. delta - alpha holds 0. */
static void test_across_traces_paired_differences(void **state) {
    tmp_ctx *t = *state;
    need_bin();
    make_across_db(t);
    csv_table c;
    const char *args[] = {"--match", "mem", "--at", "2KiB", "--metric", "out_err_mean", NULL};
    compare_csv(t, args, &c);
    int a = group_row(&c, "alpha", "mp"), b = group_row(&c, "beta", "mp"), d = group_row(&c, "delta", "mp");
    double a_hi = strtod(cell(&c, a, "out_err_mean_hi"), NULL), b_lo = strtod(cell(&c, b, "out_err_mean_lo"), NULL);
    assert_true(b_lo < a_hi); /* unpaired intervals overlap */
    expect_str(&c, b, "vs_best", "alpha");
    double diff[5], beta0 = by_hand(2048, 1024, .42, 4096, .22);
    for (int i = 0; i < 5; i++) diff[i] = (i ? ALPHA[i] + BETA_D[i] : beta0) - ALPHA[i];
    int all[5] = {0, 1, 2, 3, 4};
    char ids[512], id[1024];
    ids_of(ids, sizeof ids, all, 5);
    snprintf(id, sizeof id, "mem|storage_bytes_mean|2048|out_err_mean|beta||decode|-1|-1|mp|-|alpha||decode|-1|-1|mp|%s",
             ids);
    double lo, hi;
    boot_by_hand(diff, 5, fnv1a(id), &lo, &hi);
    expect_near(&c, b, "out_err_mean_diff", .02);
    expect_near(&c, b, "out_err_mean_diff_lo", lo);
    expect_near(&c, b, "out_err_mean_diff_hi", hi);
    expect_num(&c, b, "out_err_mean_diff_n", 5);
    assert_true(lo > 0);
    expect_str(&c, b, "resolved", "1");
    for (int i = 0; i < 5; i++) diff[i] = DELTA_D[i];
    snprintf(id, sizeof id, "mem|storage_bytes_mean|2048|out_err_mean|delta||decode|-1|-1|mp|-|alpha||decode|-1|-1|mp|%s",
             ids);
    boot_by_hand(diff, 5, fnv1a(id), &lo, &hi);
    expect_near(&c, d, "out_err_mean_diff", .004);
    expect_near(&c, d, "out_err_mean_diff_lo", lo);
    expect_near(&c, d, "out_err_mean_diff_hi", hi);
    assert_true(lo < 0 && hi > 0);
    expect_str(&c, d, "resolved", "0");
    expect_str(&c, a, "vs_best", ""); /* the best itself */
    /* zeta - alpha over the two traces both have */
    int z = group_row(&c, "zeta", "mp");
    expect_num(&c, z, "out_err_mean_diff_n", 2);
    expect_near(&c, z, "out_err_mean_diff", ((.70 - .30) + (.75 - .50)) / 2);
    free(c.text);

    /* --pairs: every pair of a set, a - b with a the better-ranked */
    const char *pairs[] = {"--match", "mem", "--at", "2KiB", "--metric", "out_err_mean", "--pairs", NULL};
    compare_csv(t, pairs, &c);
    assert_int_equal(c.n_rows, 10); /* C(5, 2) in mp; solo has one configuration */
    int r = row_where(&c, "a", "alpha", "b", "beta");
    expect_near(&c, r, "diff", -.02);
    expect_num(&c, r, "n", 5);
    expect_str(&c, r, "resolved", "-1");
    r = row_where(&c, "a", "alpha", "b", "delta");
    expect_str(&c, r, "resolved", "0");
    r = row_where(&c, "a", "zeta", "b", "gamma"); /* zeta (.725) ranks before gamma (.85); H0 and H1 in common */
    expect_num(&c, r, "n", 2);
    expect_near(&c, r, "diff", ((.70 - .90) + (.75 - .80)) / 2);
    free(c.text);
}

/* The table and JSON say the same; a database with one trace per model says "no interval"; bad combinations. */
static void test_across_traces_text_json_and_one_trace(void **state) {
    tmp_ctx *t = *state;
    need_bin();
    make_across_db(t);
    char *tab[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "2KiB", "--metric", "out_err_mean", NULL};
    assert_int_equal(run_cli(tab, t->out, t->err), 0);
    char *text = kvs_test_slurp(t->out, NULL);
    assert_non_null(strstr(text, "across traces"));
    assert_non_null(strstr(text, "model mp, measure decode: 5 traces\n"));
    assert_non_null(strstr(text, "model solo, measure decode: 1 trace (one trace: no interval)\n"));
    assert_non_null(strstr(text, "  beta - alpha: +0.02 ["));
    assert_non_null(strstr(text, "over 5 traces: resolved: alpha better (lower out_err_mean)\n"));
    assert_non_null(strstr(text, "  delta - alpha: +0.004 ["));
    assert_non_null(strstr(text, "over 5 traces: not resolved\n"));
    assert_non_null(strstr(text, "  gamma excluded on out of range: mp@50000000; gap: mp@40000000\n"));
    assert_non_null(strstr(text, "1 out of range, 1 gap"));
    free(text);
    char *js[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "2KiB", "--metric", "out_err_mean", "--json",
                  "--pairs", NULL};
    assert_int_equal(run_cli(js, t->out, t->err), 0);
    text = kvs_test_slurp(t->out, NULL);
    kvs_json *root = NULL;
    expect_ok(kvs_json_parse(text, strlen(text), &root));
    assert_string_equal(kvs_json_string(kvs_json_get(root, "view")), "across_traces");
    const kvs_json *sets = kvs_json_get(root, "sets"), *mp = kvs_json_at(sets, 0);
    assert_int_equal(kvs_json_len(sets), 2);
    assert_string_equal(kvs_json_string(kvs_json_get(mp, "model")), "mp");
    assert_string_equal(kvs_json_string(kvs_json_get(mp, "best")), "alpha");
    assert_int_equal(kvs_json_len(kvs_json_get(mp, "traces")), 5);
    assert_string_equal(kvs_json_string(kvs_json_get(kvs_json_at(kvs_json_get(mp, "traces"), 0), "id")), HX[0]);
    const kvs_json *alpha = kvs_json_at(kvs_json_get(mp, "groups"), 0);
    const kvs_json *v = kvs_json_get(kvs_json_get(alpha, "values"), "out_err_mean");
    assert_true(fabs(kvs_json_number(kvs_json_get(v, "mean")) - .4) < 1e-12);
    int all[5] = {0, 1, 2, 3, 4};
    char ids[512], id[1024], hex[32];
    ids_of(ids, sizeof ids, all, 5);
    snprintf(id, sizeof id, "mem|storage_bytes_mean|2048|out_err_mean|alpha||decode|-1|-1|mp|%s", ids);
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fnv1a(id));
    assert_string_equal(kvs_json_string(kvs_json_get(v, "seed")), hex);
    const kvs_json *gamma = kvs_json_at(kvs_json_get(mp, "groups"), 4);
    assert_string_equal(kvs_json_string(kvs_json_get(gamma, "policy")), "gamma");
    assert_string_equal(kvs_json_string(kvs_json_at(kvs_json_get(kvs_json_get(gamma, "excluded"), "gap"), 0)),
                        "mp@40000000");
    assert_int_equal(kvs_json_len(kvs_json_get(mp, "pairs")), 10);
    const kvs_json *solo = kvs_json_at(sets, 1);
    const kvs_json *sv = kvs_json_get(kvs_json_get(kvs_json_at(kvs_json_get(solo, "groups"), 0), "values"),
                                      "out_err_mean");
    assert_true(kvs_json_number(kvs_json_get(sv, "n")) == 1);
    assert_true(kvs_json_number(kvs_json_get(sv, "lo")) == kvs_json_number(kvs_json_get(sv, "hi")));
    kvs_json_free(root);
    free(text);

    /* one trace per model: today's table, and it says there is no interval */
    kvs_results_db *db = fresh_db(t, "one.db");
    put_at(db, 5, "alpha", 2048, .33);
    put_at(db, 5, "alpha", 4096, .22);
    put_at(db, 5, "beta", 2048, .5);
    kvs_results_close(db);
    char *one[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "2KiB", NULL};
    assert_int_equal(run_cli(one, t->out, t->err), 0);
    text = kvs_test_slurp(t->out, NULL);
    assert_non_null(strstr(text, ": 2 series\n"));
    assert_non_null(strstr(text, "one trace per model and measure: no interval"));
    assert_null(strstr(text, "across traces"));
    free(text);
    char *onep[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "2KiB", "--pairs", NULL};
    assert_int_equal(run_cli(onep, t->out, t->err), 0);
    text = kvs_test_slurp(t->out, NULL);
    assert_non_null(strstr(text, "1 trace (one trace: no interval)"));
    assert_non_null(strstr(text, "alpha - beta: -0.17 over one trace: no interval: not resolved\n"));
    free(text);
    csv_table c;
    const char *acr[] = {"--match", "mem", "--at", "2KiB", "--metric", "out_err_mean", "--across-traces", NULL};
    compare_csv(t, acr, &c);
    assert_int_equal(c.n_rows, 2);
    expect_num(&c, 0, "n", 1);
    expect_num(&c, 0, "out_err_mean_lo", .33);
    expect_num(&c, 1, "out_err_mean_diff_n", 1);
    expect_str(&c, 1, "resolved", "0");
    free(c.text);
    /* bad combinations: usage errors */
    char *both[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "2K", "--per-trace", "--across-traces", NULL};
    assert_int_equal(run_cli(both, t->out, t->err), 2);
    char *e = kvs_test_slurp(t->err, NULL);
    assert_non_null(strstr(e, "--per-trace and --across-traces exclude each other"));
    free(e);
    char *pp[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "2K", "--per-trace", "--pairs", NULL};
    assert_int_equal(run_cli(pp, t->out, t->err), 2);
    char *twice[] = {"kvsim", "compare", t->db, "--match", "mem", "--at", "2K", "--pairs", "--pairs", NULL};
    assert_int_equal(run_cli(twice, t->out, t->err), 2);
}
int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mem_interpolates_in_log_x, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_tokens_and_traffic_modes, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_at_suffixes, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_table_and_json_output, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_bad_options_and_databases, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_series_are_traces_by_content, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_kv_bytes_are_part_of_the_series, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_prompt_only_and_note_flags, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_x_stat_max, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_gap_on_a_morphkv_sweep, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_across_traces_means_and_intervals, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_across_traces_paired_differences, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_across_traces_text_json_and_one_trace, setup_db, teardown_db),
        cmocka_unit_test_setup_teardown(test_codec_runs_are_rows_naming_their_codec, setup_db, teardown_db),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
