/* test_sweep.c — `kvsim sweep` and `kvsim merge`: the STUDY file (results/STUDY.md) and its errors naming
 * file:line, the deterministic task list and its sizing, one task / a range / resumed tasks (a completed task is
 * skipped), and the merge of shard databases: equal, run by run, to a one-process sweep of the same study (the
 * independent reference), duplicates dropped, a failed run superseded, runs differing only in a replay option kept
 * apart, a re-run task's earlier attempt replaced, conflicting duplicates, other schema versions and foreign files
 * refused, OUT unchanged after a refused or SIGKILLed merge.
 * All traces here are GENERATED test data (tests/util/gen_trace.h).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "common/kvs.h"
#include "results/results.h"
#include "results/results_sweep.h"
#include "results/study.h"
#include "tests/util/cli_run.h"
#include "tests/util/gen_trace.h"
#include "tests/util/testenv.h"

typedef struct {
    char dir[64];
    char study[128], a[128], b[128];
    char out_path[128], err_path[128];
    char *out, *err;
} ctx;

static int write_trace(const char *path, int n_positions, int prompt_len) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = n_positions;
    o.prompt_len = prompt_len;
    o.n_layers = 2;
    kvs_gen_trace *g = NULL;
    int ok = kvs_gen_trace_create(&o, &g) == KVS_OK && kvs_gen_trace_write(g, path) == KVS_OK;
    kvs_gen_trace_free(g);
    return ok ? 0 : -1;
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

/* The study of most tests: 2 traces (the second 3x shorter) x 4 policies x 2 budgets. */
static const char study_text[] = "# test study\n"
                                 "name t\n"
                                 "trace tr_*.kvt\n"
                                 "policy h2o\n"
                                 "policy window\n"
                                 "policy streaming:sinks=2\n"
                                 "policy tova\n"
                                 "budgets 8,50%\n"
                                 "threads 1\n";

static int setup(void **state) {
    ctx *c = calloc(1, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "/tmp/kvs_sweep_XXXXXX");
    if (!c || !mkdtemp(c->dir)) return -1;
    char p[160];
    snprintf(p, sizeof p, "%s/tr_a.kvt", c->dir);
    if (write_trace(p, 60, 30) != 0) return -1;
    snprintf(p, sizeof p, "%s/tr_b.kvt", c->dir);
    if (write_trace(p, 30, 20) != 0) return -1;
    snprintf(c->study, sizeof c->study, "%s/s.study", c->dir);
    snprintf(c->a, sizeof c->a, "%s/a.db", c->dir);
    snprintf(c->b, sizeof c->b, "%s/b.db", c->dir);
    snprintf(c->out_path, sizeof c->out_path, "%s/stdout", c->dir);
    snprintf(c->err_path, sizeof c->err_path, "%s/stderr", c->dir);
    if (write_text(c->study, study_text) != 0) return -1;
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
static int run(ctx *c, ...) {
    const char *args[32];
    int n = 0;
    va_list ap;
    va_start(ap, c);
    const char *a;
    while ((a = va_arg(ap, const char *)) && n < 31) args[n++] = a;
    va_end(ap);
    args[n] = NULL;
    int rc = kvs_test_cli(c->out_path, c->err_path, args);
    free(c->out);
    free(c->err);
    c->out = kvs_test_slurp(c->out_path, NULL);
    c->err = kvs_test_slurp(c->err_path, NULL);
    return rc;
}

#define SKIP_WITHOUT_BIN()                                                                                         \
    do {                                                                                                           \
        if (!kvs_test_kvsim_bin()) {                                                                               \
            print_message("KVSIM_BIN not set: skipped\n");                                                          \
            skip();                                                                                                \
        }                                                                                                          \
    } while (0)

/* Complete runs of a database as sorted "trace-name|policy|params|budget|measure|out_err_mean|storage_bytes_mean|
 * attended_tokens_mean|n|codec|page page_score" lines: what two databases must agree on run by run. */
static char *run_lines(const char *db_path, int64_t *n_runs) {
    kvs_results_db *db = NULL;
    if (kvs_results_open_readonly(db_path, &db) != KVS_OK) return NULL;
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    kvs_results_filter f = {.include_failed = 0};
    if (kvs_results_query_runs(db, &f, &rows, &n) != KVS_OK) {
        kvs_results_close(db);
        return NULL;
    }
    char **lines = calloc((size_t)n + 1, sizeof *lines);
    size_t total = 1;
    for (int64_t i = 0; i < n; i++) {
        const char *name = strrchr(rows[i].trace_path, '/');
        char buf[2048];
        snprintf(buf, sizeof buf, "%s|%s|%s|%lld|%s|%.17g|%.17g|%.17g|%lld|%s|%lld%s\n",
                 name ? name + 1 : rows[i].trace_path, rows[i].policy, rows[i].params, (long long)rows[i].budget_tokens,
                 rows[i].measure, rows[i].agg.out_err.mean, rows[i].agg.storage_bytes.mean,
                 rows[i].agg.attended_tokens.mean, (long long)rows[i].agg.out_err.n, rows[i].codec ? rows[i].codec : "",
                 (long long)rows[i].page, rows[i].page_score);
        lines[i] = strdup(buf);
        total += strlen(buf);
    }
    /* insertion sort: a few dozen lines */
    for (int64_t i = 1; i < n; i++)
        for (int64_t j = i; j > 0 && strcmp(lines[j - 1], lines[j]) > 0; j--) {
            char *t = lines[j];
            lines[j] = lines[j - 1];
            lines[j - 1] = t;
        }
    char *all = calloc(total, 1);
    for (int64_t i = 0; i < n; i++) {
        strcat(all, lines[i]);
        free(lines[i]);
    }
    free(lines);
    kvs_results_run_rows_free(rows, n);
    kvs_results_close(db);
    *n_runs = n;
    return all;
}

/* Asserts that two databases hold the same complete runs, run by run (run_lines), n_runs of each (< 0: any
 * number, the same in both). */
static void assert_same_runs(const char *want_db, const char *got_db, int64_t n_runs) {
    int64_t n1 = 0, n2 = 0;
    char *want = run_lines(want_db, &n1), *got = run_lines(got_db, &n2);
    assert_non_null(want);
    assert_non_null(got);
    if (n_runs >= 0) {
        assert_int_equal(n1, n_runs);
        assert_int_equal(n2, n_runs);
    }
    assert_string_equal(want, got);
    free(want);
    free(got);
}

static int64_t count_all_runs(const char *db_path) {
    kvs_results_db *db = NULL;
    if (kvs_results_open_readonly(db_path, &db) != KVS_OK) return -1;
    kvs_results_run_row *rows = NULL;
    int64_t n = 0;
    kvs_results_filter f = {.include_failed = 1};
    if (kvs_results_query_runs(db, &f, &rows, &n) != KVS_OK) n = -1;
    kvs_results_run_rows_free(rows, n > 0 ? n : 0);
    kvs_results_close(db);
    return n;
}

static int sql(const char *db_path, const char *statement) {
    sqlite3 *db = NULL;
    int rc = sqlite3_open(db_path, &db);
    if (rc == SQLITE_OK) rc = sqlite3_exec(db, statement, NULL, NULL, NULL);
    sqlite3_close(db);
    return rc;
}

static int copy_file(const char *from, const char *to) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    return system(cmd);
}

/* ---- the STUDY file ---- */

static void expect_load_error(ctx *c, const char *text, kvs_status want, const char *detail) {
    assert_int_equal(write_text(c->study, text), 0);
    kvs_study *s = NULL;
    assert_int_equal(kvs_study_load(c->study, &s), want);
    assert_null(s);
    if (!strstr(kvs_last_error(), detail)) fail_msg("detail '%s' lacks '%s'", kvs_last_error(), detail);
}

static void test_study_errors_name_file_and_line(void **state) {
    ctx *c = *state;
    char want[256];
    snprintf(want, sizeof want, "%s:3: unknown key 'polcy'", c->study);
    expect_load_error(c, "trace tr_a.kvt\n# comment\npolcy h2o\nbudgets 8\n", KVS_ERR_FORMAT, want);
    snprintf(want, sizeof want, "%s:2: policy nosuch", c->study);
    expect_load_error(c, "trace tr_a.kvt\npolicy nosuch\nbudgets 8\n", KVS_ERR_FORMAT, want);
    snprintf(want, sizeof want, "%s:1: trace pattern 'zz_*.kvt' matches no file", c->study);
    expect_load_error(c, "trace zz_*.kvt\npolicy h2o\nbudgets 8\n", KVS_ERR_IO, want);
    snprintf(want, sizeof want, "%s:3: 'budgets' given twice", c->study);
    expect_load_error(c, "trace tr_a.kvt\nbudgets 8\nbudgets 9\npolicy h2o\n", KVS_ERR_FORMAT, want);
    snprintf(want, sizeof want, "%s:2: budgets for trace", c->study); /* 45 > the 30 positions of tr_b */
    expect_load_error(c, "trace tr_*.kvt\nbudgets 8,45\npolicy h2o\n", KVS_ERR_FORMAT, want);
    snprintf(want, sizeof want, "%s:4: threads: 'x' is not a whole number", c->study);
    expect_load_error(c, "trace tr_a.kvt\nbudgets 8\npolicy h2o\nthreads x\n", KVS_ERR_FORMAT, want);
    snprintf(want, sizeof want, "%s: no 'policy' line", c->study);
    expect_load_error(c, "trace tr_a.kvt\nbudgets 8\n", KVS_ERR_FORMAT, want);
    snprintf(want, sizeof want, "%s:1: trace", c->study);
    expect_load_error(c, "trace missing.kvt\n", KVS_ERR_IO, want);
}

/* Task sizing (results/STUDY.md): per-policy cost ~ n (n / P + 2 sum budgets) with P = 4 policies; tr_a (60 positions,
 * prompt 30: budgets 8 and 15) costs 60 * (15 + 46) = 3660, tr_b (30, prompt 20: budgets 8 and 10) 30 * (7.5 + 36)
 * = 1305 per policy (same shape otherwise): with policies-per-task 1, tr_b gets floor(3660 / 1305) = 2 per task. */
static void test_task_list_is_deterministic_and_sized(void **state) {
    ctx *c = *state;
    kvs_study *s = NULL;
    assert_int_equal(kvs_study_load(c->study, &s), KVS_OK);
    assert_int_equal(kvs_study_n_traces(s), 2);
    assert_int_equal(kvs_study_n_policies(s), 4);
    assert_int_equal(kvs_study_n_budgets(s), 2);
    assert_int_equal(kvs_study_n_tasks(s), 4 + 2);
    static const int want[6][3] = {{0, 0, 1}, {0, 1, 2}, {0, 2, 3}, {0, 3, 4}, {1, 0, 2}, {1, 2, 4}};
    for (int i = 0; i < 6; i++) {
        const kvs_study_task *t = kvs_study_task_get(s, i);
        assert_int_equal(t->trace, want[i][0]);
        assert_int_equal(t->policy_begin, want[i][1]);
        assert_int_equal(t->policy_end, want[i][2]);
    }
    assert_true(strstr(kvs_study_trace_path(s, 0), "/tr_a.kvt") != NULL); /* sorted glob, resolved to the folder */
    kvs_study_free(s);
    SKIP_WITHOUT_BIN();
    assert_int_equal(run(c, "sweep", c->study, "--list-tasks", NULL), 0);
    char *first = strdup(c->out);
    assert_int_equal(run(c, "sweep", c->study, "--list-tasks", NULL), 0);
    assert_string_equal(first, c->out);
    assert_non_null(strstr(c->out, "2 traces x 4 policies x 2 budgets = 16 runs in 6 tasks"));
    assert_non_null(strstr(c->out, "\tstreaming:sinks=2 tova\n") ? strstr(c->out, "5\t") : NULL);
    free(first);
    assert_int_equal(run(c, "sweep", c->study, "--list-tasks", "--estimate", NULL), 0);
    assert_non_null(strstr(c->out, "work_gmac\tmem_mib"));
    assert_int_equal(run(c, "sweep", c->study, "--estimate", NULL), 2);
    assert_int_equal(run(c, "sweep", c->study, "--db", c->a, "--task", "6", NULL), 2);
    assert_int_equal(run(c, "sweep", c->study, "--db", c->a, "--tasks", "3", NULL), 2);
}

/* ---- codecs ---- */

static int count_of(const char *hay, const char *needle); /* occurrences of needle in hay (below) */

#define INT4 "int:bits=4,group=32,k_axis=token,v_axis=channel" /* the canonical spec of "int:bits=4" */

/* The `codec` key: repeatable, each spec parsed when the study loads (kept canonical), errors naming file:line, the
 * same codec twice refused; the task list keeps its slices but each task's cost and runs scale with the codecs;
 * kvs_study_set_codecs (`sweep --codec`) replaces them. */
static void test_study_codec_key(void **state) {
    ctx *c = *state;
    char want[256];
    snprintf(want, sizeof want, "%s:3: codec kivi:bits=3: codec kivi: bits=3", c->study);
    expect_load_error(c, "trace tr_a.kvt\npolicy h2o\ncodec kivi:bits=3\nbudgets 8\n", KVS_ERR_FORMAT, want);
    snprintf(want, sizeof want, "%s:4: codec int:bits=4,group=32 given twice (" INT4 ")", c->study);
    expect_load_error(c, "trace tr_a.kvt\npolicy h2o\ncodec int:bits=4\ncodec int:bits=4,group=32\nbudgets 8\n",
                      KVS_ERR_FORMAT, want);
    kvs_study *plain = NULL, *s = NULL;
    assert_int_equal(write_text(c->study, study_text), 0);
    assert_int_equal(kvs_study_load(c->study, &plain), KVS_OK);
    assert_int_equal(kvs_study_n_codecs(plain), 0);
    char text[sizeof study_text + 64];
    snprintf(text, sizeof text, "%scodec none\ncodec int:bits=4\n", study_text);
    assert_int_equal(write_text(c->study, text), 0);
    assert_int_equal(kvs_study_load(c->study, &s), KVS_OK);
    assert_int_equal(kvs_study_n_codecs(s), 2);
    assert_string_equal(kvs_study_codec_spec(s, 0), "none");
    assert_string_equal(kvs_study_codec_spec(s, 1), INT4);
    /* the same slices (every trace's cost doubles alike); each task's budget part of the work doubles: work =
     * L H D n (n + 2 sum(b) P C) for P policies and C codecs */
    assert_int_equal(kvs_study_n_tasks(s), kvs_study_n_tasks(plain));
    for (int32_t i = 0; i < kvs_study_n_tasks(s); i++) {
        const kvs_study_task *a = kvs_study_task_get(plain, i), *b = kvs_study_task_get(s, i);
        assert_int_equal(a->policy_begin, b->policy_begin);
        assert_int_equal(a->policy_end, b->policy_end);
        const char *tp = kvs_study_trace_path(s, b->trace);
        double n = strstr(tp, "tr_a") ? 60 : 30, sum_b = strstr(tp, "tr_a") ? 8 + 15 : 8 + 10;
        double p = b->policy_end - b->policy_begin, full = n * n; /* per L H D */
        assert_float_equal(a->work / (full + 2 * sum_b * n * p), b->work / (full + 4 * sum_b * n * p), 1e-9);
    }
    const char *specs[] = {"kivi"}, *bad[] = {"fp8:format=e9"}, *twice[] = {"none", "none"};
    assert_int_equal(kvs_study_set_codecs(s, bad, 1), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "--codec: codec fp8:format=e9"));
    assert_int_equal(kvs_study_set_codecs(s, twice, 2), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_study_n_codecs(s), 2); /* unchanged */
    assert_int_equal(kvs_study_set_codecs(s, specs, 1), KVS_OK);
    assert_int_equal(kvs_study_n_codecs(s), 1);
    assert_string_equal(kvs_study_codec_spec(s, 0), "kivi:bits=2,group=32,residual=128");
    for (int32_t i = 0; i < kvs_study_n_tasks(s); i++) /* one codec costs what none does */
        assert_float_equal(kvs_study_task_get(s, i)->work, kvs_study_task_get(plain, i)->work, 1e-6);
    kvs_study_free(s);
    kvs_study_free(plain);
    SKIP_WITHOUT_BIN();
    assert_int_equal(run(c, "sweep", c->study, "--list-tasks", NULL), 0);
    assert_non_null(strstr(c->out, "2 traces x 4 policies x 2 codecs x 2 budgets = 32 runs in 6 tasks"));
    assert_non_null(strstr(c->out, "0\t"));
    assert_non_null(strstr(c->out, "\t4\th2o x codecs none " INT4 "\n")); /* task 0: h2o x 2 codecs x 2 budgets */
    assert_int_equal(run(c, "sweep", c->study, "--list-tasks", "--codec", "fp8", NULL), 0);
    assert_non_null(strstr(c->out, "2 traces x 4 policies x 1 codecs x 2 budgets = 16 runs in 6 tasks"));
    assert_non_null(strstr(c->out, "\th2o x codecs fp8:"));
    assert_int_equal(run(c, "sweep", c->study, "--list-tasks", "--codec", "int:bits=5", NULL), 1);
    assert_non_null(strstr(c->err, "kvsim sweep: --codec: codec int:bits=5"));
    assert_int_equal(run(c, "sweep", c->study, "--list-tasks", "--codec", NULL), 2);
}

/* A study with codecs runs each (trace, policy, codec, budget) once: the same runs, number for number, as one
 * `kvsim replay` with the same --codec options; a resumed sweep skips its tasks, another codec list (--codec) is
 * other tasks and other runs; shards merge to the one-process sweep, and the folder (MPI) path expands alike. */
static void test_codec_sweep_runs_and_resumes(void **state) {
    ctx *c = *state;
    SKIP_WITHOUT_BIN();
    char single[160], replayed[160], merged[160], dir[160], study_db[200], trace[160];
    snprintf(single, sizeof single, "%s/single.db", c->dir);
    snprintf(replayed, sizeof replayed, "%s/replay.db", c->dir);
    snprintf(merged, sizeof merged, "%s/merged.db", c->dir);
    snprintf(dir, sizeof dir, "%s/shards/", c->dir);
    snprintf(study_db, sizeof study_db, "%sstudy.db", dir);
    snprintf(trace, sizeof trace, "%s/tr_a.kvt", c->dir);
    assert_int_equal(write_text(c->study, "trace tr_a.kvt\npolicy window\npolicy h2o\ncodec none\n"
                                          "codec int:bits=4\nbudgets 8,16\nthreads 1\n"),
                     0);
    assert_int_equal(run(c, "sweep", c->study, "--db", single, NULL), 0);
    assert_int_equal(count_all_runs(single), 2 * 2 * 2);
    assert_int_equal(run(c, "replay", trace, "--db", replayed, "--policy", "window", "--policy", "h2o", "--codec",
                         "none", "--codec", "int:bits=4", "--budgets", "8,16", "--threads", "1", "--no-progress", NULL),
                     0);
    assert_same_runs(replayed, single, 8);
    char *lines = NULL;
    int64_t n = 0;
    assert_non_null(lines = run_lines(single, &n));
    assert_int_equal(count_of(lines, "|" INT4 "|0\n"), 4);
    assert_int_equal(count_of(lines, "||0\n"), 4);
    free(lines);
    /* resumed: both tasks complete */
    assert_int_equal(run(c, "sweep", c->study, "--db", single, NULL), 0);
    assert_int_equal(count_of(c->err, "already complete in"), 2);
    assert_int_equal(count_all_runs(single), 8);
    /* another codec list is another task: it runs, beside the others */
    assert_int_equal(run(c, "sweep", c->study, "--db", single, "--task", "0", "--codec", "fp8", NULL), 0);
    assert_int_equal(count_of(c->err, "already complete in"), 0);
    assert_int_equal(count_all_runs(single), 8 + 2);
    assert_int_equal(run(c, "sweep", c->study, "--db", single, "--task", "0", "--codec", "fp8", NULL), 0);
    assert_int_equal(count_of(c->err, "already complete in"), 1);
    /* shards: the merge tells the codec runs apart (none of them is a duplicate of another) */
    assert_int_equal(run(c, "sweep", c->study, "--db", c->a, "--task", "0", NULL), 0);
    assert_int_equal(run(c, "sweep", c->study, "--db", c->b, "--task", "1", NULL), 0);
    assert_int_equal(run(c, "merge", merged, c->a, c->b, NULL), 0);
    assert_non_null(strstr(c->out, "8 runs copied, 0 duplicates dropped"));
    assert_same_runs(replayed, merged, 8);
    /* the folder path (what every MPI rank runs) expands the same runs */
    assert_int_equal(run(c, "sweep", c->study, "--db", dir, NULL), 0);
    assert_same_runs(replayed, study_db, 8);
}

/* ---- page sizes ---- */

/* The `page` key: one list ("0,16"; none = 0), parsed when the study loads, errors naming file:line (a bad size, a
 * size twice, the key twice); each task's runs and cost scale with the sizes, its configs text names them; the
 * `--page` option replaces the line (a bad list: exit 1 naming --page). */
static void test_study_page_key(void **state) {
    ctx *c = *state;
    char want[256];
    snprintf(want, sizeof want, "%s:3: page: 'x' is not a page size", c->study);
    expect_load_error(c, "trace tr_a.kvt\npolicy h2o\npage 16,x\nbudgets 8\n", KVS_ERR_FORMAT, want);
    snprintf(want, sizeof want, "%s:3: page: page size 16 given twice", c->study);
    expect_load_error(c, "trace tr_a.kvt\npolicy h2o\npage 16,16\nbudgets 8\n", KVS_ERR_FORMAT, want);
    snprintf(want, sizeof want, "%s:4: 'page' given twice", c->study);
    expect_load_error(c, "trace tr_a.kvt\npolicy h2o\npage 16\npage 32\nbudgets 8\n", KVS_ERR_FORMAT, want);
    kvs_study *plain = NULL, *s = NULL;
    assert_int_equal(write_text(c->study, study_text), 0);
    assert_int_equal(kvs_study_load(c->study, &plain), KVS_OK);
    assert_int_equal(kvs_study_n_pages(plain), 0);
    assert_null(kvs_study_pages(plain));
    char text[sizeof study_text + 64];
    snprintf(text, sizeof text, "%spage none,16\n", study_text);
    assert_int_equal(write_text(c->study, text), 0);
    assert_int_equal(kvs_study_load(c->study, &s), KVS_OK);
    assert_int_equal(kvs_study_n_pages(s), 2);
    assert_string_equal(kvs_study_pages(s), "0,16");
    /* work = L H D n (n + 2 sum(b) P S) for P policies and S page sizes: the budget part doubles */
    assert_int_equal(kvs_study_n_tasks(s), kvs_study_n_tasks(plain));
    for (int32_t i = 0; i < kvs_study_n_tasks(s); i++) {
        const kvs_study_task *a = kvs_study_task_get(plain, i), *b = kvs_study_task_get(s, i);
        const char *tp = kvs_study_trace_path(s, b->trace);
        double n = strstr(tp, "tr_a") ? 60 : 30, sum_b = strstr(tp, "tr_a") ? 8 + 15 : 8 + 10;
        double p = b->policy_end - b->policy_begin, full = n * n;
        assert_float_equal(a->work / (full + 2 * sum_b * n * p), b->work / (full + 4 * sum_b * n * p), 1e-9);
    }
    assert_int_equal(kvs_study_set_pages(s, "16,x"), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "--page: 'x' is not a page size"));
    assert_int_equal(kvs_study_n_pages(s), 2); /* unchanged */
    assert_int_equal(kvs_study_set_pages(s, "32"), KVS_OK);
    assert_string_equal(kvs_study_pages(s), "32");
    kvs_study_free(s);
    kvs_study_free(plain);
    SKIP_WITHOUT_BIN();
    assert_int_equal(run(c, "sweep", c->study, "--list-tasks", NULL), 0);
    assert_non_null(strstr(c->out, "2 traces x 4 policies x 2 page sizes x 2 budgets = 32 runs in 6 tasks"));
    assert_non_null(strstr(c->out, "\t4\th2o x pages 0,16\n"));
    assert_int_equal(run(c, "sweep", c->study, "--list-tasks", "--page", "8", NULL), 0);
    assert_non_null(strstr(c->out, "2 traces x 4 policies x 1 page sizes x 2 budgets = 16 runs in 6 tasks"));
    assert_non_null(strstr(c->out, "\t2\th2o x pages 8\n"));
    assert_int_equal(run(c, "sweep", c->study, "--list-tasks", "--page", "8,y", NULL), 1);
    assert_non_null(strstr(c->err, "kvsim sweep: --page: 'y' is not a page size"));
    assert_int_equal(run(c, "sweep", c->study, "--list-tasks", "--page", NULL), 2);
    assert_int_equal(run(c, "sweep", c->study, "--list-tasks", "--page", "8", "--page", "16", NULL), 2);
}

/* A study with page sizes runs each (trace, policy, page, budget) once: the same runs, number for number (rule
 * included), as one `kvsim replay --page` with the same list; resumed, its tasks are skipped; another list
 * (--page) is other tasks and other runs. */
static void test_page_sweep_runs_and_resumes(void **state) {
    ctx *c = *state;
    SKIP_WITHOUT_BIN();
    char single[160], replayed[160], trace[160];
    snprintf(single, sizeof single, "%s/single.db", c->dir);
    snprintf(replayed, sizeof replayed, "%s/replay.db", c->dir);
    snprintf(trace, sizeof trace, "%s/tr_a.kvt", c->dir);
    assert_int_equal(write_text(c->study, "trace tr_a.kvt\npolicy window\npolicy h2o\npage 0,4\n"
                                          "budgets 8,16\nthreads 1\n"),
                     0);
    assert_int_equal(run(c, "sweep", c->study, "--db", single, NULL), 0);
    assert_int_equal(count_all_runs(single), 2 * 2 * 2);
    assert_int_equal(run(c, "replay", trace, "--db", replayed, "--policy", "window", "--policy", "h2o", "--page", "0,4",
                         "--budgets", "8,16", "--threads", "1", "--no-progress", NULL),
                     0);
    assert_same_runs(replayed, single, 8);
    char *lines = NULL;
    int64_t n = 0;
    assert_non_null(lines = run_lines(single, &n));
    assert_int_equal(count_of(lines, "|4max\n"), 2); /* h2o by its scores, the window by the count rule */
    assert_int_equal(count_of(lines, "|4\n"), 2);
    assert_int_equal(count_of(lines, "|0\n"), 4);
    free(lines);
    assert_int_equal(run(c, "sweep", c->study, "--db", single, NULL), 0);
    assert_int_equal(count_of(c->err, "already complete in"), 2);
    assert_int_equal(count_all_runs(single), 8);
    assert_int_equal(run(c, "sweep", c->study, "--db", single, "--task", "0", "--page", "8", NULL), 0);
    assert_int_equal(count_of(c->err, "already complete in"), 0);
    assert_int_equal(count_all_runs(single), 8 + 2);
}

/* ---- tasks ---- */

static void test_task_runs_once_and_resumes(void **state) {
    ctx *c = *state;
    SKIP_WITHOUT_BIN();
    assert_int_equal(run(c, "sweep", c->study, "--db", c->a, "--task", "0", NULL), 0);
    assert_int_equal(count_all_runs(c->a), 2);                     /* h2o x 2 budgets */
    assert_int_equal(run(c, "sweep", c->study, "--db", c->a, "--tasks", "0:2", NULL), 0);
    assert_non_null(strstr(c->err, "task 0 ("));                    /* skipped: already complete */
    assert_non_null(strstr(c->err, "already complete"));
    assert_int_equal(count_all_runs(c->a), 4);                     /* only task 1 ran */
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open_readonly(c->a, &db), KVS_OK);
    int done = 0;
    assert_int_equal(kvs_results_sweep_task_done(db, "no such key", &done), KVS_OK);
    assert_int_equal(done, 0);
    kvs_results_close(db);
    /* the rest of the study: every task not yet complete, the first two skipped */
    assert_int_equal(run(c, "sweep", c->study, "--db", c->a, NULL), 0);
    assert_int_equal(count_all_runs(c->a), 16);
}

/* The merge of two shards, each holding half of the tasks, equals a one-process sweep run by run. */
static void test_merged_shards_equal_one_process(void **state) {
    ctx *c = *state;
    SKIP_WITHOUT_BIN();
    char single[160], merged[160];
    snprintf(single, sizeof single, "%s/single.db", c->dir);
    snprintf(merged, sizeof merged, "%s/merged.db", c->dir);
    assert_int_equal(run(c, "sweep", c->study, "--db", single, NULL), 0);
    assert_int_equal(run(c, "sweep", c->study, "--db", c->a, "--tasks", "0:3", NULL), 0);
    assert_int_equal(run(c, "sweep", c->study, "--db", c->b, "--tasks", "3:6", NULL), 0);
    /* one task in both shards: its runs are duplicates, dropped */
    assert_int_equal(run(c, "sweep", c->study, "--db", c->b, "--task", "0", NULL), 0);
    assert_int_equal(run(c, "merge", merged, c->a, c->b, NULL), 0);
    assert_non_null(strstr(c->out, "16 runs copied, 2 duplicates dropped"));
    assert_non_null(strstr(c->out, "2 traces, 6 completed sweep tasks"));
    assert_same_runs(single, merged, 16);
    /* merging again into the merged database adds nothing; the readers take it as one study */
    assert_int_equal(run(c, "merge", merged, c->a, NULL), 0);
    assert_non_null(strstr(c->out, "0 runs copied, 6 duplicates dropped"));
    assert_int_equal(run(c, "runs", merged, NULL), 0);
    assert_int_equal(run(c, "compare", merged, "--match", "tokens", "--at", "8", NULL), 0);
    /* a task re-run after its shard was merged is skipped in the merged database too */
    assert_int_equal(run(c, "sweep", c->study, "--db", merged, "--task", "4", NULL), 0);
    assert_non_null(strstr(c->err, "already complete"));
}

/* `--db DIR/` resumes from every database in the folder: the tasks an earlier run completed in another rank's
 * shard (here shard-3.db, as a 4-rank run leaves it; this run is one process, rank 0) are skipped, not run again,
 * and that shard is merged with this run's: study.db equals a one-process sweep run by run. Run again, nothing
 * runs. Before, only the rank's own shard was consulted and only shards 0..ranks-1 merged. */
static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static void test_sharded_resume_skips_every_shard(void **state) {
    ctx *c = *state;
    SKIP_WITHOUT_BIN();
    char single[160], dir[160], shard3[200], study_db[200], stray[200];
    snprintf(single, sizeof single, "%s/single.db", c->dir);
    snprintf(dir, sizeof dir, "%s/shards/", c->dir);
    snprintf(shard3, sizeof shard3, "%sshard-3.db", dir);
    snprintf(study_db, sizeof study_db, "%sstudy.db", dir);
    snprintf(stray, sizeof stray, "%sshard-03.db", dir); /* not a name sweep writes: neither read nor merged */
    assert_int_equal(mkdir(dir, 0777), 0);
    assert_int_equal(run(c, "sweep", c->study, "--db", single, NULL), 0);
    assert_int_equal(run(c, "sweep", c->study, "--db", shard3, "--tasks", "0:4", NULL), 0);
    assert_int_equal(write_text(stray, "not a database"), 0);
    assert_int_equal(run(c, "sweep", c->study, "--db", dir, NULL), 0);
    for (int i = 0; i < 4; i++) {
        char want[64];
        snprintf(want, sizeof want, "task %d (", i);
        assert_non_null(strstr(c->err, want));
        snprintf(want, sizeof want, "rank 0: task %d:", i);
        assert_null(strstr(c->err, want));
    }
    assert_int_equal(count_of(c->err, "already complete in"), 4);
    assert_int_equal(count_of(c->err, "shard-3.db: skipped"), 4);
    assert_non_null(strstr(c->err, "rank 0: task 4:"));
    assert_non_null(strstr(c->err, "rank 0: task 5:"));
    assert_int_equal(count_of(c->err, "rank 0: task"), 2);
    assert_non_null(strstr(c->err, "merged 2 shards"));
    assert_same_runs(single, study_db, 16);
    /* everything is complete now: the same command runs no task and the merged database is unchanged */
    assert_int_equal(run(c, "sweep", c->study, "--db", dir, NULL), 0);
    assert_int_equal(count_of(c->err, "rank 0: task"), 0);
    assert_int_equal(count_of(c->err, "already complete in"), 6);
    assert_same_runs(single, study_db, 16);
}

/* A failed run (an interrupted task) is replaced by the complete run of the same identity. */
static void test_complete_run_supersedes_failed(void **state) {
    ctx *c = *state;
    SKIP_WITHOUT_BIN();
    char merged[160];
    snprintf(merged, sizeof merged, "%s/merged.db", c->dir);
    assert_int_equal(run(c, "sweep", c->study, "--db", c->a, "--task", "0", NULL), 0);
    assert_int_equal(copy_file(c->a, c->b), 0);
    assert_int_equal(sql(c->b, "UPDATE runs SET status = 'failed', error = 'interrupted'; DELETE FROM run_summary;"
                               "DELETE FROM run_layers; DELETE FROM steps;"),
                     SQLITE_OK);
    assert_int_equal(run(c, "merge", merged, c->b, c->a, NULL), 0);
    assert_non_null(strstr(c->out, "4 runs copied, 0 duplicates dropped, 2 failed runs superseded"));
    assert_int_equal(count_all_runs(merged), 2);
    assert_same_runs(c->a, merged, -1);
}

/* Runs differing only in a replay option that changes their numbers (--kv-bytes, --aux-bytes: the storage and
 * traffic metrics; --series-every: the steps recorded) are different runs: merged side by side, neither a conflict
 * nor a duplicate; the same options twice are one run. */
static void test_merge_identity_includes_replay_options(void **state) {
    ctx *c = *state;
    SKIP_WITHOUT_BIN();
    char trace[160], merged[160], other[160];
    snprintf(trace, sizeof trace, "%s/tr_a.kvt", c->dir);
    snprintf(merged, sizeof merged, "%s/merged.db", c->dir);
    snprintf(other, sizeof other, "%s/c.db", c->dir);
    static const char *const opt[3][2] = {{"--kv-bytes", "2"}, {"--aux-bytes", "2"}, {"--series-every", "4"}};
    for (int o = 0; o < 3; o++) {
        unlink(c->a);
        unlink(c->b);
        unlink(other);
        unlink(merged);
        assert_int_equal(run(c, "replay", trace, "--db", c->a, "--policy", "h2o", "--budgets", "8", "--no-progress", NULL), 0);
        assert_int_equal(run(c, "replay", trace, "--db", c->b, "--policy", "h2o", "--budgets", "8", "--no-progress",
                             opt[o][0], opt[o][1], NULL),
                         0);
        assert_int_equal(run(c, "replay", trace, "--db", other, "--policy", "h2o", "--budgets", "8", "--no-progress",
                             opt[o][0], opt[o][1], NULL),
                         0);
        assert_int_equal(run(c, "merge", merged, c->a, c->b, other, NULL), 0);
        if (!strstr(c->out, "2 runs copied, 1 duplicates dropped")) fail_msg("%s: %s%s", opt[o][0], c->out, c->err);
        assert_int_equal(count_all_runs(merged), 2);
    }
    /* the kv-bytes runs do differ in their numbers: without the option in the identity they were a conflict */
    int64_t n = 0;
    char *x = run_lines(c->a, &n), *y = NULL;
    unlink(c->b);
    assert_int_equal(run(c, "replay", trace, "--db", c->b, "--policy", "h2o", "--budgets", "8", "--no-progress",
                         "--kv-bytes", "1", NULL), 0);
    y = run_lines(c->b, &n);
    assert_string_not_equal(x, y);
    free(x);
    free(y);
}

/* A task that did not complete (killed after some of its runs were written) and is run again leaves each of its
 * runs once in the database, the earlier attempt's copies gone; runs of other options on the same trace stay. */
static void test_rerun_task_replaces_earlier_attempt(void **state) {
    ctx *c = *state;
    SKIP_WITHOUT_BIN();
    char trace[160];
    snprintf(trace, sizeof trace, "%s/tr_a.kvt", c->dir);
    /* task 0 is tr_a x h2o x budgets 8,50%, replayed as the sweep does; the attempt left no task record */
    assert_int_equal(run(c, "replay", trace, "--db", c->a, "--policy", "h2o", "--budgets", "8,50%", "--measure",
                         "decode", "--series-every", "0", "--threads", "1", "--no-progress", NULL),
                     0);
    /* another measurement of the same trace and policy: not the task's, it stays */
    assert_int_equal(run(c, "replay", trace, "--db", c->a, "--policy", "h2o", "--budgets", "8", "--kv-bytes", "1",
                         "--no-progress", NULL),
                     0);
    assert_int_equal(count_all_runs(c->a), 3);
    int64_t n_before = 0, n_after = 0;
    char *before = run_lines(c->a, &n_before);
    assert_int_equal(run(c, "sweep", c->study, "--db", c->a, "--task", "0", NULL), 0);
    assert_int_equal(count_all_runs(c->a), 3);
    char *after = run_lines(c->a, &n_after);
    assert_string_equal(before, after);
    free(before);
    free(after);
    /* the surviving task runs are the new attempt's (ids above the earlier ones) */
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open_readonly(c->a, &db), KVS_OK);
    int64_t next = 0;
    assert_int_equal(kvs_results_sweep_next_run_id(db, &next), KVS_OK);
    assert_int_equal(next, 6);
    kvs_results_close(db);
}

static int files_equal(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int eq = kvs_read_file(a, &x, &nx) == KVS_OK && kvs_read_file(b, &y, &ny) == KVS_OK && nx == ny && !memcmp(x, y, nx);
    free(x);
    free(y);
    return eq;
}

static void test_conflicts_versions_and_foreign_files_refused(void **state) {
    ctx *c = *state;
    SKIP_WITHOUT_BIN();
    char merged[160], snap[160], bad[160];
    snprintf(merged, sizeof merged, "%s/merged.db", c->dir);
    snprintf(snap, sizeof snap, "%s/snap.db", c->dir);
    snprintf(bad, sizeof bad, "%s/bad.db", c->dir);
    assert_int_equal(run(c, "sweep", c->study, "--db", c->a, "--task", "0", NULL), 0);
    assert_int_equal(run(c, "merge", merged, c->a, NULL), 0);
    assert_int_equal(copy_file(merged, snap), 0);
    /* the same identity with another result */
    assert_int_equal(copy_file(c->a, c->b), 0);
    assert_int_equal(sql(c->b, "UPDATE run_summary SET out_err_mean = out_err_mean * 2"), SQLITE_OK);
    assert_int_equal(run(c, "merge", merged, c->b, NULL), 1);
    assert_non_null(strstr(c->err, "conflicting duplicate"));
    assert_true(files_equal(merged, snap));
    /* a newer schema version */
    assert_int_equal(copy_file(c->a, c->b), 0);
    assert_int_equal(sql(c->b, "UPDATE meta SET value = '3' WHERE key = 'schema_version'"), SQLITE_OK);
    assert_int_equal(run(c, "merge", merged, c->b, NULL), 1);
    assert_non_null(strstr(c->err, "version"));
    assert_true(files_equal(merged, snap));
    /* not a kvsim database; a missing file */
    assert_int_equal(write_text(bad, "not a database\n"), 0);
    assert_int_equal(run(c, "merge", merged, bad, NULL), 1);
    assert_true(files_equal(merged, snap));
    assert_int_equal(run(c, "merge", merged, "/nonexistent/x.db", NULL), 1);
    assert_true(files_equal(merged, snap));
    assert_int_equal(run(c, "merge", merged, NULL), 2);
    assert_int_equal(run(c, "merge", merged, merged, NULL), 2);
    /* nothing left beside OUT by the refused merges */
    char tmp_glob[256];
    snprintf(tmp_glob, sizeof tmp_glob, "ls %s | grep -c merge- >/dev/null", c->dir);
    assert_int_not_equal(system(tmp_glob), 0);
}

/* A merge killed with SIGKILL in the middle (after its first input, through the test hook) leaves OUT as it was. */
static void test_killed_merge_leaves_out_unchanged(void **state) {
    ctx *c = *state;
    SKIP_WITHOUT_BIN();
    char merged[160], snap[160];
    snprintf(merged, sizeof merged, "%s/merged.db", c->dir);
    snprintf(snap, sizeof snap, "%s/snap.db", c->dir);
    assert_int_equal(run(c, "sweep", c->study, "--db", c->a, "--task", "0", NULL), 0);
    assert_int_equal(run(c, "sweep", c->study, "--db", c->b, "--task", "4", NULL), 0);
    assert_int_equal(run(c, "merge", merged, c->a, NULL), 0);
    assert_int_equal(copy_file(merged, snap), 0);
    setenv("KVSIM_TEST_MERGE_STALL", "30", 1);
    const char *args[] = {"merge", merged, c->a, c->b, NULL};
    pid_t pid = kvs_test_cli_spawn(c->out_path, c->err_path, args);
    unsetenv("KVSIM_TEST_MERGE_STALL");
    assert_true(pid > 0);
    int stalled = 0;
    for (int i = 0; i < 2000 && !stalled; i++) { /* up to 20 s for the child to reach the hook */
        char *err = kvs_test_slurp(c->err_path, NULL);
        stalled = err && strstr(err, "test stall");
        free(err);
        if (!stalled) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    assert_true(stalled);
    kill(pid, SIGKILL);
    assert_int_equal(kvs_test_cli_wait(pid), 128 + SIGKILL);
    assert_true(files_equal(merged, snap));
    assert_int_equal(count_all_runs(merged), 2);
    /* and a merge run again completes */
    assert_int_equal(run(c, "merge", merged, c->a, c->b, NULL), 0);
    assert_int_equal(count_all_runs(merged), 2 + 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_study_errors_name_file_and_line, setup, teardown),
        cmocka_unit_test_setup_teardown(test_task_list_is_deterministic_and_sized, setup, teardown),
        cmocka_unit_test_setup_teardown(test_study_codec_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_codec_sweep_runs_and_resumes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_study_page_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_page_sweep_runs_and_resumes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_task_runs_once_and_resumes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_merged_shards_equal_one_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded_resume_skips_every_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_complete_run_supersedes_failed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_merge_identity_includes_replay_options, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rerun_task_replaces_earlier_attempt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conflicts_versions_and_foreign_files_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_merge_leaves_out_unchanged, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
