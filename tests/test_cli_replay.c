/* test_cli_replay.c — `kvsim replay` and the commands reading its database, tried through the kvsim binary
 * ($KVSIM_BIN) the way a new user would, so that its results cannot be misread:
 * degenerate configurations warned about once and noted in the database, duplicate pairs run once, an invalid
 * pair recorded as failed while the others run, a trace with nothing to measure refused, a corrupt trace
 * leaving no database behind, progress and SIGTERM, one table layout for replay and runs, runs --csv
 * --summary, no -wal/-shm files left after any command, `kvsim policies`.
 * All traces here are GENERATED test data (tests/util/gen_trace.h), not a model's.
 */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/json.h"
#include "common/kvs.h"
#include "sim/policy.h"
#include "policies/registry.h"
#include "results/results.h"
#include "tests/util/cli_run.h"
#include "tests/util/gen_trace.h"
#include "tests/util/testenv.h"

typedef struct {
    char dir[64];
    char trace[128]; /* 40 positions, prompt 20 */
    char db[128];
    char out_path[128], err_path[128];
    char *out, *err; /* output of the last run */
} ctx;

static int write_trace(const char *path, int n_positions, int prompt_len, int n_layers) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = n_positions;
    o.prompt_len = prompt_len;
    o.n_layers = n_layers;
    kvs_gen_trace *g = NULL;
    int ok = kvs_gen_trace_create(&o, &g) == KVS_OK && kvs_gen_trace_write(g, path) == KVS_OK;
    kvs_gen_trace_free(g);
    return ok ? 0 : -1;
}

static int setup(void **state) {
    ctx *c = calloc(1, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "/tmp/kvs_cli_replay_XXXXXX");
    if (!mkdtemp(c->dir)) return -1;
    snprintf(c->trace, sizeof c->trace, "%s/t.kvt", c->dir);
    snprintf(c->db, sizeof c->db, "%s/r.db", c->dir);
    snprintf(c->out_path, sizeof c->out_path, "%s/stdout", c->dir);
    snprintf(c->err_path, sizeof c->err_path, "%s/stderr", c->dir);
    if (write_trace(c->trace, 40, 20, 2) != 0) return -1;
    *state = c;
    return 0;
}

static int teardown(void **state) {
    ctx *c = *state;
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->dir);
    int rc = system(cmd);
    free(c->out);
    free(c->err);
    free(c);
    return rc == 0 ? 0 : -1;
}


/* Runs kvsim with the NULL-terminated arguments; stdout and stderr land in c->out and c->err. */
static int run_args(ctx *c, const char *const *args) {
    if (!kvs_test_kvsim_bin()) {
        print_message("KVSIM_BIN is not set (run through `make test`): skipping CLI test\n");
        skip();
    }
    int rc = kvs_test_cli(c->out_path, c->err_path, args);
    free(c->out);
    free(c->err);
    c->out = kvs_test_slurp(c->out_path, NULL);
    c->err = kvs_test_slurp(c->err_path, NULL);
    assert_true(c->out && c->err);
    return rc;
}
#define run(c, ...) run_args((c), (const char *const[]){__VA_ARGS__, NULL})

#define assert_contains(hay, needle)                                                                           \
    do {                                                                                                       \
        if (!strstr((hay), (needle))) fail_msg("expected '%s' in:\n%s", (needle), (hay));                      \
    } while (0)
#define assert_lacks(hay, needle)                                                                              \
    do {                                                                                                       \
        if (strstr((hay), (needle))) fail_msg("did not expect '%s' in:\n%s", (needle), (hay));                 \
    } while (0)

static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* Entries of the test folder whose name contains `part`. */
static int count_names(const ctx *c, const char *part) {
    DIR *d = opendir(c->dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, part)) n++;
    closedir(d);
    return n;
}

/* `kvsim runs DB --all --json`, parsed; the caller frees. */
static kvs_json *runs_json(ctx *c) {
    assert_int_equal(run(c, "runs", c->db, "--all", "--json"), 0);
    kvs_json *root = NULL;
    assert_int_equal(kvs_json_parse(c->out, strlen(c->out), &root), KVS_OK);
    return root;
}

/* The run of `policy` at `budget` in a runs --json array, or NULL. */
static const kvs_json *find_run(const kvs_json *root, const char *policy, int budget) {
    for (size_t i = 0; i < kvs_json_len(root); i++) {
        const kvs_json *r = kvs_json_at(root, i);
        if (!strcmp(kvs_json_string(kvs_json_get(r, "policy")), policy) &&
            kvs_json_number(kvs_json_get(r, "budget_tokens")) == budget)
            return r;
    }
    return NULL;
}

static const char *notes_of(const kvs_json *run) {
    const kvs_json *n = kvs_json_get(run, "notes");
    return kvs_json_type_of(n) == KVS_JSON_STRING ? kvs_json_string(n) : NULL;
}

/* ------------------------------------------------------------------------------------------------
 * degenerate configurations, duplicates
 * ---------------------------------------------------------------------------------------------- */

static void test_degenerate_configurations_warn_once_and_are_noted(void **state) {
    ctx *c = *state;
    /* Trace: 40 positions, prompt 20. snapkv window 8 at budgets 4 and 6 scores nothing (one warning for
     * both), at 12 it scores; scissorhands recent 8 at budget 6 is a window; h2o recent=1 has no heavy
     * hitter; streaming without sinks is a window; window at 40 keeps everything. */
    assert_int_equal(run(c, "replay", c->trace, "--db", c->db, "--policy", "snapkv:window=8", "--policy",
                         "scissorhands:recent=8", "--policy", "h2o:recent=1", "--policy", "streaming:sinks=0",
                         "--policy", "window", "--policy", "tova", "--budgets", "4,6,12,40"),
                     0);
    assert_int_equal(count_of(c->err, "warning: snapkv:window=8,kernel=7,pool=max,gqa=expand,block=0 at budgets 4,6: the "
                                      "budget is at most window=8"),
                     1);
    assert_int_equal(count_of(c->err, "warning: snapkv"), 2); /* ... and budget 40 >= the prompt */
    assert_contains(c->err, "at budget 40: the budget is at least the first prompt's 20 positions");
    assert_contains(c->err, "warning: scissorhands:history=32,recent=8,drop=1,threshold=1,gqa=expand at budgets 4,6: "
                            "recent=8 protects every position");
    assert_contains(c->err, "warning: h2o:recent=1,gqa=expand,prefill=all,window=0,block=0 at budgets 4,6,12: recent=1 leaves no "
                            "heavy-hitter slot");
    assert_contains(c->err, "warning: streaming:sinks=0 at budgets 4,6,12: sinks=0 keeps no attention sink (a window)");
    assert_contains(c->err, "warning: window at budget 40: the budget is at least the trace's 40 positions");
    assert_lacks(c->err, "warning: tova at budgets 4"); /* nothing degenerate about it below 40 */
    /* the notes column: on every degenerate run, on no other */
    kvs_json *root = runs_json(c);
    assert_int_equal(kvs_json_len(root), 24);
    assert_contains(notes_of(find_run(root, "snapkv", 4)), "the budget is at most window=8");
    assert_contains(notes_of(find_run(root, "snapkv", 6)), "the budget is at most window=8");
    assert_null(notes_of(find_run(root, "snapkv", 12)));
    assert_null(notes_of(find_run(root, "scissorhands", 12)));
    assert_contains(notes_of(find_run(root, "scissorhands", 6)), "(a window)");
    assert_contains(notes_of(find_run(root, "window", 40)), "nothing is ever evicted");
    assert_null(notes_of(find_run(root, "window", 12)));
    assert_null(notes_of(find_run(root, "tova", 12)));
    kvs_json_free(root);
    /* the table flags them */
    assert_int_equal(run(c, "runs", c->db, "--policy", "snapkv", "--budget", "4"), 0);
    assert_contains(c->out, " PN ");
    assert_contains(c->out, "N  note: the configuration degenerates");
}

static void test_duplicate_configurations_run_once_with_one_warning(void **state) {
    ctx *c = *state;
    assert_int_equal(run(c, "replay", c->trace, "--db", c->db, "--policy", "tova", "--policy",
                         "tova:mode=layer,protect_current=false", "--policy", "window", "--budgets", "8,8,16,8,25%"),
                     0);
    /* 25% of the 20-position prompt is 5: a new budget; 8 given three times, tova spelt twice */
    assert_int_equal(count_of(c->err, "warning:"), 2);
    assert_contains(c->err, "warning: budget 8 given 3 times in --budgets 8,8,16,8,25%: run once");
    assert_contains(c->err, "warning: --policy tova:mode=layer,protect_current=false,block=0 given 2 times: run once");
    kvs_json *root = runs_json(c);
    assert_int_equal(kvs_json_len(root), 6); /* {tova, window} x {8, 16, 5} */
    kvs_json_free(root);
}

/* ------------------------------------------------------------------------------------------------
 * an invalid pair fails alone; nothing to measure, a corrupt trace
 * ---------------------------------------------------------------------------------------------- */

static void test_invalid_pair_is_recorded_failed_while_the_others_run(void **state) {
    ctx *c = *state;
    assert_int_equal(run(c, "replay", c->trace, "--db", c->db, "--policy", "streaming:sinks=6", "--policy", "window",
                         "--budgets", "4,8"),
                     1);
    assert_contains(c->err, "run streaming:sinks=6 budget 4 failed: invalid configuration: policy streaming: budget 4 "
                            "must exceed sinks=6");
    assert_contains(c->err, "1 of 4 runs failed");
    kvs_json *root = runs_json(c);
    assert_int_equal(kvs_json_len(root), 4);
    const kvs_json *bad = find_run(root, "streaming", 4);
    assert_string_equal(kvs_json_string(kvs_json_get(bad, "status")), "failed");
    assert_contains(kvs_json_string(kvs_json_get(bad, "error")), "must exceed sinks=6");
    assert_string_equal(kvs_json_string(kvs_json_get(find_run(root, "streaming", 8), "status")), "complete");
    assert_string_equal(kvs_json_string(kvs_json_get(find_run(root, "window", 4), "status")), "complete");
    kvs_json_free(root);
    /* the replay table lists the failed run with its flag */
    assert_contains(c->out, "must exceed sinks=6");
    /* one rule whether the policy rejects some pairs or all of them: each is recorded failed, exit 1 */
    unlink(c->db);
    assert_int_equal(run(c, "replay", c->trace, "--db", c->db, "--policy", "streaming:sinks=6", "--budgets", "2,4"), 1);
    assert_contains(c->err, "2 of 2 runs failed");
    root = runs_json(c);
    assert_int_equal(kvs_json_len(root), 2);
    for (size_t i = 0; i < 2; i++) {
        assert_string_equal(kvs_json_string(kvs_json_get(kvs_json_at(root, i), "status")), "failed");
        assert_contains(kvs_json_string(kvs_json_get(kvs_json_at(root, i), "error")), "must exceed sinks=6");
    }
    kvs_json_free(root);
}

static void test_nothing_to_measure_is_refused(void **state) {
    ctx *c = *state;
    char all_prompt[160];
    snprintf(all_prompt, sizeof all_prompt, "%s/prompt_only.kvt", c->dir);
    assert_int_equal(write_trace(all_prompt, 24, 24, 2), 0); /* no generated position */
    assert_int_equal(run(c, "replay", all_prompt, "--db", c->db, "--policy", "window", "--budgets", "4"), 1);
    assert_contains(c->err, "kvsim replay: the trace has no generated position to measure (24 prompt positions, 0 "
                            "generated); use --measure prefill");
    assert_int_equal(count_names(c, "r.db"), 0); /* no fake "complete" run, no database */
    /* asked for, the prompt positions are measured */
    assert_int_equal(run(c, "replay", all_prompt, "--db", c->db, "--policy", "window", "--budgets", "4", "--measure",
                         "prefill"),
                     0);
    kvs_json *root = runs_json(c);
    assert_int_equal(kvs_json_len(root), 1);
    assert_string_equal(kvs_json_string(kvs_json_get(kvs_json_at(root, 0), "measure")), "prefill");
    kvs_json_free(root);
}

static void test_corrupt_trace_leaves_no_database(void **state) {
    ctx *c = *state;
    char bad[160];
    snprintf(bad, sizeof bad, "%s/bad.kvt", c->dir);
    char *data = NULL;
    size_t n = 0;
    assert_int_equal(kvs_read_file(c->trace, &data, &n), KVS_OK);
    for (size_t i = n / 2; i < n / 2 + 64; i++) data[i] ^= 0x5a; /* inside a chunk payload */
    FILE *f = fopen(bad, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    free(data);
    assert_int_equal(run(c, "replay", bad, "--db", c->db, "--policy", "window", "--budgets", "4"), 1);
    assert_contains(c->err, "kvsim replay: ");
    assert_int_equal(count_names(c, "r.db"), 0); /* neither the database nor -wal/-shm */
}

/* ------------------------------------------------------------------------------------------------
 * progress and SIGTERM
 * ---------------------------------------------------------------------------------------------- */

static void test_sigterm_records_every_run_as_interrupted(void **state) {
    ctx *c = *state;
    if (!kvs_test_kvsim_bin()) skip();
    /* A replay long enough to be stopped: 4096 positions, the oracle and TOVA at several budgets, one thread.
     * The signal is sent once the progress line shows the replay is under way. */
    char big[160];
    snprintf(big, sizeof big, "%s/big.kvt", c->dir);
    assert_int_equal(write_trace(big, 4096, 2048, 2), 0);
    const char *args[] = {"replay", big, "--db", c->db, "--policy", "topk", "--policy", "tova", "--policy", "h2o",
                          "--budgets", "64,128,256,512", "--threads", "1", "--progress", NULL};
    pid_t pid = kvs_test_cli_spawn(c->out_path, c->err_path, args);
    assert_true(pid > 0);
    int seen = 0;
    for (int i = 0; i < 6000 && !seen; i++) { /* up to 60 s for the first progress line */
        char *e = kvs_test_slurp(c->err_path, NULL);
        seen = e && strstr(e, "% (") != NULL;
        free(e);
        if (!seen) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    assert_true(seen);
    assert_int_equal(kill(pid, SIGTERM), 0);
    int rc = kvs_test_cli_wait(pid);
    char *err = kvs_test_slurp(c->err_path, NULL);
    assert_non_null(err);
    if (rc != 1) fail_msg("exit %d (expected 1 after SIGTERM); stderr:\n%s", rc, err);
    assert_contains(err, "kvsim replay: interrupted by signal after");
    assert_contains(err, "the 12 runs were recorded as failed (interrupted) in");
    free(err);
    kvs_json *root = runs_json(c);
    assert_int_equal(kvs_json_len(root), 12);
    for (size_t i = 0; i < 12; i++) {
        const kvs_json *r = kvs_json_at(root, i);
        assert_string_equal(kvs_json_string(kvs_json_get(r, "status")), "failed");
        assert_contains(kvs_json_string(kvs_json_get(r, "error")), "interrupted");
    }
    kvs_json_free(root);
}

/* A signal once the engine has finished (the progress line at 100%) stops the storing: the runs stored before it
 * stay complete, the others are recorded as failed (interrupted), and the exit status is 1, never 0. The store is
 * made long (series of every position of many runs) so that the signal lands while it runs. */
static void test_sigterm_while_storing_stops_and_says_so(void **state) {
    ctx *c = *state;
    if (!kvs_test_kvsim_bin()) skip();
    char big[160];
    snprintf(big, sizeof big, "%s/big.kvt", c->dir);
    assert_int_equal(write_trace(big, 2048, 64, 2), 0);
    const char *args[] = {"replay", big, "--db", c->db, "--policy", "window", "--policy", "streaming",
                          "--budgets", "8,12,16,20,24,32,40,48,56,64,80,96,112,128,160,192", "--series-every", "1",
                          "--progress", NULL};
    pid_t pid = kvs_test_cli_spawn(c->out_path, c->err_path, args);
    assert_true(pid > 0);
    int seen = 0;
    for (int i = 0; i < 12000 && !seen; i++) { /* up to 120 s for the engine to finish */
        char *e = kvs_test_slurp(c->err_path, NULL);
        seen = e && strstr(e, "100.0% (") != NULL;
        free(e);
        if (!seen) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    assert_true(seen);
    assert_int_equal(kill(pid, SIGTERM), 0);
    int rc = kvs_test_cli_wait(pid);
    char *err = kvs_test_slurp(c->err_path, NULL);
    assert_non_null(err);
    if (rc != 1) fail_msg("exit %d (expected 1 after SIGTERM while storing); stderr:\n%s", rc, err);
    const char *m = strstr(err, "interrupted by signal while storing the results (after ");
    if (!m) fail_msg("no interruption message; stderr:\n%s", err);
    int stored = -1, total = -1;
    assert_int_equal(sscanf(m, "interrupted by signal while storing the results (after %d of %d runs)", &stored, &total), 2);
    assert_int_equal(total, 32);
    assert_true(stored >= 0 && stored < 32);
    print_message("signal landed after %d of %d runs were stored\n", stored, total);
    free(err);
    /* the complete runs are those stored first; every other run is failed (interrupted) */
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open_readonly(c->db, &db), KVS_OK);
    kvs_results_filter f = {.include_failed = 1};
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    assert_int_equal(kvs_results_query_runs(db, &f, &rows, &n), KVS_OK);
    assert_int_equal(n, 32);
    for (int64_t i = 0; i < n; i++) {
        if (i < stored) {
            assert_string_equal(rows[i].status, "complete");
        } else {
            assert_string_equal(rows[i].status, "failed");
            assert_non_null(strstr(rows[i].error, "interrupted"));
        }
    }
    kvs_results_run_rows_free(rows, n);
    kvs_results_close(db);
}

/* A trace is its content: runs of one file replayed through two path spellings are both selected by `--trace`
 * given either spelling (the filter takes the file's content hash), and the table labels them <model>@<hash>. */
static void test_trace_filter_matches_any_spelling(void **state) {
    ctx *c = *state;
    char link[160];
    snprintf(link, sizeof link, "%s/other_name.kvt", c->dir);
    assert_int_equal(symlink(c->trace, link), 0);
    assert_int_equal(run(c, "replay", c->trace, "--db", c->db, "--policy", "window", "--budgets", "8"), 0);
    assert_int_equal(run(c, "replay", link, "--db", c->db, "--policy", "h2o", "--budgets", "8"), 0);
    const char *spellings[] = {c->trace, link};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(run(c, "runs", c->db, "--trace", spellings[k], "--json"), 0);
        kvs_json *root = NULL;
        assert_int_equal(kvs_json_parse(c->out, strlen(c->out), &root), KVS_OK);
        assert_int_equal(kvs_json_len(root), 2);
        /* both rows carry the file's hash and one label */
        const char *h0 = kvs_json_string(kvs_json_get(kvs_json_get(kvs_json_at(root, 0), "trace"), "sha256"));
        const char *h1 = kvs_json_string(kvs_json_get(kvs_json_get(kvs_json_at(root, 1), "trace"), "sha256"));
        assert_non_null(h0);
        assert_non_null(h1);
        assert_int_equal(strlen(h0), 64);
        assert_string_equal(h0, h1);
        assert_string_equal(kvs_json_string(kvs_json_get(kvs_json_get(kvs_json_at(root, 0), "trace"), "label")),
                            kvs_json_string(kvs_json_get(kvs_json_get(kvs_json_at(root, 1), "trace"), "label")));
        kvs_json_free(root);
    }
    /* a name that is no readable file still matches by its spelling: the file name of the link's row only */
    assert_int_equal(run(c, "runs", c->db, "--trace", "other_name.kvt", "--json"), 0);
    kvs_json *root = NULL;
    assert_int_equal(kvs_json_parse(c->out, strlen(c->out), &root), KVS_OK);
    assert_int_equal(kvs_json_len(root), 1);
    kvs_json_free(root);
    /* the table names the trace by model and content hash, the same for both rows */
    assert_int_equal(run(c, "runs", c->db), 0);
    const char *a = strstr(c->out, "@");
    assert_non_null(a);
    const char *b = strstr(a + 1, "@");
    assert_non_null(b);
    assert_memory_equal(a, b, 9);
}

/* ------------------------------------------------------------------------------------------------
 * one table layout; runs --csv --summary; no -wal/-shm, kvsim policies
 * ---------------------------------------------------------------------------------------------- */

/* The header line of a runs table (the line starting with "  run policy"), copied. */
static void table_header(const char *text, char *buf, size_t cap) {
    const char *h = strstr(text, "  run policy");
    assert_non_null(h);
    size_t n = strcspn(h, "\n");
    assert_true(n < cap);
    memcpy(buf, h, n);
    buf[n] = '\0';
}

static void test_replay_summary_is_the_runs_table(void **state) {
    ctx *c = *state;
    assert_int_equal(run(c, "replay", c->trace, "--db", c->db, "--policy", "h2o", "--policy",
                         "scissorhands:history=32,recent=2,drop=1,threshold=1,gqa=expand", "--budgets", "8,16"),
                     0);
    char replay_head[512], runs_head[512];
    table_header(c->out, replay_head, sizeof replay_head);
    char *replay_out = strdup(c->out);
    assert_int_equal(run(c, "runs", c->db), 0);
    table_header(c->out, runs_head, sizeof runs_head);
    assert_string_equal(replay_head, runs_head); /* the same columns under the same names */
    assert_contains(replay_head, "res_mean");
    assert_contains(replay_head, "res_max");
    /* and the same rows: every run line of runs appears verbatim in replay's output */
    for (const char *l = strstr(c->out, "\n    1 "); l && strncmp(l + 1, "4 runs", 6); l = strchr(l + 1, '\n')) {
        char line[1024];
        size_t n = strcspn(l + 1, "\n");
        assert_true(n < sizeof line);
        memcpy(line, l + 1, n);
        line[n] = '\0';
        assert_contains(replay_out, line);
    }
    free(replay_out);
}

static void test_runs_csv_summary_has_one_run_wide_row_per_run(void **state) {
    ctx *c = *state;
    assert_int_equal(run(c, "replay", c->trace, "--db", c->db, "--policy", "window", "--policy", "tova", "--budgets",
                         "8,16"),
                     0);
    assert_int_equal(run(c, "runs", c->db, "--csv", "--summary"), 0);
    assert_int_equal(count_of(c->out, "\n"), 1 + 4); /* header + one row per run */
    assert_int_equal(count_of(c->out, "\nwindow,,8,,"), 1); /* params empty, layer empty: run-wide */
    /* its out_err_mean is the run-wide aggregate that --json reports */
    const char *row = strstr(c->out, "\nwindow,,8,,");
    double csv_mean = strtod(row + strlen("\nwindow,,8,,"), NULL);
    kvs_json *root = runs_json(c);
    const kvs_json *w8 = find_run(root, "window", 8);
    double json_mean = kvs_json_number(kvs_json_get(kvs_json_get(kvs_json_get(w8, "metrics"), "out_err"), "mean"));
    assert_true(csv_mean == json_mean && csv_mean > 0);
    kvs_json_free(root);
    /* the per-layer rows stay the default */
    assert_int_equal(run(c, "runs", c->db, "--csv"), 0);
    assert_int_equal(count_of(c->out, "\n"), 1 + 4 * 2);
    assert_int_equal(run(c, "runs", c->db, "--summary"), 2);
    assert_contains(c->err, "--summary goes with --csv");
}

/* A randomised policy's run is the same run in any invocation: Keyformer alone in one shard and after the window
 * in another (through another spelling of the trace's path) gives the same numbers, so `kvsim merge` takes the two
 * shards as one run instead of refusing a conflicting duplicate. */
static void test_randomised_run_same_in_any_shard(void **state) {
    ctx *c = *state;
    char a[160], b[160], merged[160], dotted[160];
    snprintf(a, sizeof a, "%s/a.db", c->dir);
    snprintf(b, sizeof b, "%s/b.db", c->dir);
    snprintf(merged, sizeof merged, "%s/m.db", c->dir);
    snprintf(dotted, sizeof dotted, "%s/./t.kvt", c->dir);
    assert_int_equal(run(c, "replay", c->trace, "--db", a, "--policy", "keyformer", "--budgets", "8", "--no-progress"),
                     0);
    assert_int_equal(run(c, "replay", dotted, "--db", b, "--policy", "window", "--policy", "keyformer", "--budgets",
                         "8", "--no-progress", "--threads", "2"),
                     0);
    const char *metrics[] = {"out_err", "attn_recall", "topk_overlap", "storage_bytes"};
    const char *stats[] = {"mean", "p50", "p95", "max"};
    double va[4][4];
    for (int side = 0; side < 2; side++) {
        assert_int_equal(run(c, "runs", side ? b : a, "--all", "--json"), 0);
        kvs_json *root = NULL;
        assert_int_equal(kvs_json_parse(c->out, strlen(c->out), &root), KVS_OK);
        const kvs_json *kf = find_run(root, "keyformer", 8);
        assert_non_null(kf);
        for (int m = 0; m < 4; m++)
            for (int k = 0; k < 4; k++) {
                double v = kvs_json_number(kvs_json_get(kvs_json_get(kvs_json_get(kf, "metrics"), metrics[m]), stats[k]));
                if (side == 0) va[m][k] = v;
                else if (v != va[m][k]) fail_msg("keyformer %s %s: %.17g alone, %.17g in a sweep", metrics[m], stats[k], va[m][k], v);
            }
        kvs_json_free(root);
    }
    assert_int_equal(run(c, "merge", merged, a, b), 0);
    assert_int_equal(run(c, "runs", merged, "--csv", "--summary"), 0);
    assert_int_equal(count_of(c->out, "\nkeyformer,"), 1);
    assert_int_equal(count_of(c->out, "\nwindow,"), 1);
}

static void test_no_wal_or_shm_left_behind(void **state) {
    ctx *c = *state;
    assert_int_equal(run(c, "replay", c->trace, "--db", c->db, "--policy", "window", "--budgets", "8,16",
                         "--series-every", "1"),
                     0);
    assert_int_equal(count_names(c, "r.db-"), 0);
    assert_int_equal(run(c, "runs", c->db), 0);
    assert_int_equal(run(c, "runs", c->db, "--csv"), 0);
    assert_int_equal(run(c, "compare", c->db, "--match", "tokens", "--at", "12"), 0);
    assert_int_equal(count_names(c, "r.db-"), 0);
    assert_int_equal(count_names(c, "r.db"), 1);
}

static void test_policies_lists_every_policy_and_parameter(void **state) {
    ctx *c = *state;
    assert_int_equal(run(c, "policies"), 0);
    char *text = strdup(c->out);
    assert_int_equal(run(c, "policies", "--json"), 0);
    kvs_json *root = NULL;
    assert_int_equal(kvs_json_parse(c->out, strlen(c->out), &root), KVS_OK);
    const kvs_json *list = kvs_json_get(root, "policies");
    assert_int_equal(kvs_json_len(list), kvs_policy_count());
    for (int i = 0; i < kvs_policy_count(); i++) {
        const struct kvs_policy_ops *ops = kvs_policy_at(i);
        const kvs_json *p = kvs_json_at(list, (size_t)i);
        assert_string_equal(kvs_json_string(kvs_json_get(p, "name")), ops->name);
        assert_int_equal(kvs_json_bool(kvs_json_get(p, "oracle")), ops->is_oracle);
        const kvs_json *params = kvs_json_get(p, "params");
        assert_int_equal(kvs_json_len(params), ops->n_params);
        char line[160];
        snprintf(line, sizeof line, "\n%s", ops->name);
        assert_contains(text, line);
        for (int j = 0; j < ops->n_params; j++) {
            const kvs_policy_param *pp = &ops->params[j];
            const kvs_json *jp = kvs_json_at(params, (size_t)j);
            assert_string_equal(kvs_json_string(kvs_json_get(jp, "key")), pp->key);
            if (pp->type == KVS_PARAM_INT || pp->type == KVS_PARAM_DOUBLE) {
                assert_true(kvs_json_number(kvs_json_get(jp, "default")) == pp->def);
                assert_true(kvs_json_number(kvs_json_get(jp, "max")) == pp->hi);
            }
            snprintf(line, sizeof line, "  %s=", pp->key);
            assert_contains(text, line);
        }
    }
    assert_contains(text, "sinks=INT in [0, 1048576], default 4"); /* exact bounds, never 1.04858e+06 */
    assert_lacks(text, "e+06");
    kvs_json_free(root);
    free(text);
    assert_int_equal(run(c, "policies", "--json", "--json"), 2);
    assert_int_equal(run(c, "policies", "extra"), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_degenerate_configurations_warn_once_and_are_noted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_configurations_run_once_with_one_warning, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_pair_is_recorded_failed_while_the_others_run, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nothing_to_measure_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_trace_leaves_no_database, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_records_every_run_as_interrupted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_while_storing_stops_and_says_so, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trace_filter_matches_any_spelling, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_summary_is_the_runs_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_runs_csv_summary_has_one_run_wide_row_per_run, setup, teardown),
        cmocka_unit_test_setup_teardown(test_randomised_run_same_in_any_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_wal_or_shm_left_behind, setup, teardown),
        cmocka_unit_test_setup_teardown(test_policies_lists_every_policy_and_parameter, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
