/* test_failinj.c — failure injection: a full disk and SIGKILL at many points of the commands that
 * write files, checked the way a user would find the result afterwards.
 *
 * A full disk is RLIMIT_FSIZE on the command's process: every write past N bytes of any one file fails (EFBIG;
 * SIGXFSZ is ignored, as the shell's `ulimit -f` after `trap '' XFSZ` would do), which is what a disk with
 * N bytes free does to each file written — the trace's .partial, SQLite's database and journal, an output's
 * temporary file. Looping N over the file's whole size hits every write of it. After each failure:
 *   - capture: exit 1 with a message, no trace under the final name; a .partial left behind recovers to a
 *     whole number of blocks (FORMAT.md "Writing, killing and recovering");
 *   - trace recover: exit 1, no output file, nothing else left in the folder;
 *   - replay (of one run): exit 1, the database's runs unchanged, `runs --all` byte for byte (each run is one
 *     transaction, rolled back; a replay of several runs keeps those committed before the failure);
 *   - plot: exit 1, no output file, no temporary left.
 * SIGKILL at several times during capture (a 400-step capture killed 0-160 ms after its start) and replay (killed
 * 0-16 ms after its database appears, fresh or added to): a trace under the final name is complete (verify
 * passes), a .partial recovers, and `kvsim runs` reads the database and lists only complete runs, or says an
 * empty database is empty (the next replay fills it).
 * Then the same commands with a preloaded shim (tests/failio/failio.c) failing the N-th and later write, fsync
 * or rename, N over every call the command makes (up to 24 points): the same checks.
 * The outputs added since, the same way: drift, heads, plan and generate database writes (the database's rows
 * unchanged, compared as a dump of every table), heads --clusters-out (neither the file nor the run on a full
 * disk), report (a previous report folder kept byte for byte, no temporary folder), calibrate --plot (calibrate
 * writes no database), sweep shards killed at
 * several times (no task recorded without its runs; the sweep run again completes), merge failing or killed
 * (OUT byte for byte as it was, or the complete merge).
 * A replay into a new database failing at every write or fsync leaves no database, -wal or -shm behind; the readers
 * (runs, compare, plot, report) read a database in a folder they cannot write (the shim's op open) and leave it as
 * they found it.
 */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <sqlite3.h>

#include "common/head_clusters.h"
#include "common/kvs.h"
#include "common/sha256.h"
#include "results/results.h"
#include "tests/util/cli_run.h"
#include "tests/util/gen_trace.h"
#include "tests/util/testenv.h"
#include "trace/trace.h"

static char dir[64];

static int setup(void **state) {
    (void)state;
    strcpy(dir, "/tmp/kvs_failinj_XXXXXX");
    signal(SIGXFSZ, SIG_IGN); /* inherited by the children: a write past the limit fails with EFBIG instead */
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_in(const char *name, char *out, size_t n) { snprintf(out, n, "%s/%s", dir, name); }

static long file_size(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? (long)st.st_size : -1;
}


/* Names in the folder other than `keep` (NULL-terminated list), counted. */
static int stray_files(const char *const *keep) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        int kept = 0;
        for (const char *const *k = keep; *k; k++) kept |= !strcmp(e->d_name, *k);
        if (!kept) {
            fprintf(stderr, "stray file: %s\n", e->d_name);
            n++;
        }
    }
    closedir(d);
    return n;
}

/* Runs kvsim with every file it writes limited to `limit` bytes; returns the exit status. */
static int cli_limited(long limit, const char *const *args) {
    char out[256], err[256];
    path_in("cmd.out", out, sizeof out);
    path_in("cmd.err", err, sizeof err);
    struct rlimit old, rl;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    rl = old;
    rl.rlim_cur = (rlim_t)limit;
    /* lowered only around the fork: the child inherits it, this process writes nothing in between */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &rl), 0);
    pid_t pid = kvs_test_cli_spawn("/dev/null", err, args);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    (void)out;
    assert_true(pid > 0);
    return kvs_test_cli_wait(pid);
}

static void expect_error_message(const char *needle) {
    char err[256];
    path_in("cmd.err", err, sizeof err);
    size_t n;
    char *text = (char *)kvs_test_slurp(err, &n);
    text[n] = '\0';
    if (!strstr(text, needle)) fprintf(stderr, "stderr: %s\n", text);
    assert_non_null(strstr(text, needle));
    free(text);
}

/* A generated trace at `name` in the folder (2 layers, 2 KV heads, 40 positions, blocks of 16). */
static void gen_trace(const char *name, char *path, size_t n) {
    path_in(name, path, n);
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    kvs_gen_trace *g = NULL;
    assert_int_equal(kvs_gen_trace_create(&o, &g), KVS_OK);
    assert_int_equal(kvs_gen_trace_write(g, path), KVS_OK);
    kvs_gen_trace_free(g);
}

/* The limits tried for a file of `size` bytes: every `step` bytes from 0, and its last byte. */
#define FOR_EACH_LIMIT(var, size, step) for (long var = 0; var < (size); var = var + (step) < (size) ? var + (step) : (var < (size) - 1 ? (size) - 1 : (size)))

/* ---------------------------------------------------------------- full disk */

static void test_recover_on_a_full_disk_leaves_nothing(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) { skip(); }
    char in[256], out[256];
    gen_trace("in.kvt", in, sizeof in);
    path_in("out.kvt", out, sizeof out);
    long size = file_size(in);
    int tried = 0;
    FOR_EACH_LIMIT(limit, size, size / 23 + 1) {
        const char *args[] = {"trace", "recover", in, out, NULL};
        assert_int_equal(cli_limited(limit, args), 1);
        if (limit >= 4096) expect_error_message(out); /* below that its own stderr file is full too */
        const char *keep[] = {"in.kvt", "cmd.err", NULL};
        assert_int_equal(stray_files(keep), 0);
        tried++;
    }
    assert_true(tried >= 20);
    const char *args[] = {"trace", "recover", in, out, NULL};
    assert_int_equal(cli_limited(size + 4096, args), 0); /* and with room, it works */
    assert_int_equal(file_size(out), size);
}

/* One run per replay: replay commits each run in its own transaction, so a failure leaves the runs committed
 * before it; with one run, a failed replay must leave the database as it was. */
static int run_replay(long limit, const char *trace, const char *db, const char *policy) {
    const char *args[] = {"replay", trace, "--db", db, "--policy", policy, "--budgets", "8", "--threads", "1", NULL};
    return cli_limited(limit, args);
}

static void test_replay_on_a_full_disk_leaves_the_database_unchanged(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) { skip(); }
    char trace[256], db[256];
    gen_trace("t.kvt", trace, sizeof trace);
    path_in("r.db", db, sizeof db);
    assert_int_equal(run_replay(1L << 30, trace, db, "window"), 0);
    size_t n0, n_runs0;
    uint8_t *before = kvs_test_slurp(db, &n0); /* its size: the replay below must grow it */
    char runs_csv[256];
    path_in("runs0.csv", runs_csv, sizeof runs_csv);
    const char *rargs0[] = {"runs", db, "--csv", "--summary", "--all", NULL};
    assert_int_equal(kvs_test_cli(runs_csv, NULL, rargs0), 0);
    uint8_t *runs0 = kvs_test_slurp(runs_csv, &n_runs0);
    unlink(runs_csv);
    assert_true(n_runs0 > 0);
    /* a second replay writes its run through SQLite's write-ahead log, then checkpoints it into the database:
     * limits from 0 to past both sizes fail it at every stage (a limit large enough lets it succeed: stop there) */
    int tried = 0;
    for (long limit = 0; limit < (long)n0 + (1L << 17); limit += 4096 + limit / 4) {
        int rc = run_replay(limit, trace, db, "h2o");
        if (rc == 0) break;
        assert_int_equal(rc, 1);
        /* SQLite may leave its write-ahead log and index when the failed write was the closing checkpoint: they
         * hold no committed frame of the failed replay (the runs listed below prove it); nothing else remains */
        const char *keep[] = {"t.kvt", "r.db", "r.db-wal", "r.db-shm", "cmd.err", NULL};
        assert_int_equal(stray_files(keep), 0);
        char runs_now[256];
        path_in("runs.csv", runs_now, sizeof runs_now);
        const char *rargs[] = {"runs", db, "--csv", "--summary", "--all", NULL};
        assert_int_equal(kvs_test_cli(runs_now, NULL, rargs), 0);
        size_t nr1;
        uint8_t *csv = kvs_test_slurp(runs_now, &nr1);
        assert_int_equal(nr1, n_runs0);
        assert_memory_equal(csv, runs0, n_runs0);
        free(csv);
        unlink(runs_now);
        tried++;
    }
    assert_true(tried >= 5);
    /* the database still reads, with the first replay's run and, when the last limit let it through, h2o's */
    kvs_results_db *r = NULL;
    assert_int_equal(kvs_results_open_readonly(db, &r), KVS_OK);
    kvs_results_run_row *rows = NULL;
    int64_t nr = 0;
    kvs_results_filter f = {.include_failed = 1};
    assert_int_equal(kvs_results_query_runs(r, &f, &rows, &nr), KVS_OK);
    assert_true(nr == 1 || nr == 2);
    assert_string_equal(rows[0].policy, "window");
    for (int64_t i = 0; i < nr; i++) assert_true(rows[i].has_agg);
    kvs_results_run_rows_free(rows, nr);
    kvs_results_close(r);
    free(before);
    free(runs0);
}

static void test_plot_on_a_full_disk_leaves_nothing(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin() || system("command -v gnuplot >/dev/null 2>&1") != 0) { skip(); }
    char trace[256], db[256], png[256];
    gen_trace("t.kvt", trace, sizeof trace);
    path_in("r.db", db, sizeof db);
    path_in("p.svg", png, sizeof png);
    assert_int_equal(run_replay(1L << 30, trace, db, "window"), 0);
    const char *args[] = {"plot", db, "--kind", "error-vs-budget", "--out", png, NULL};
    assert_int_equal(cli_limited(1L << 30, args), 0);
    long size = file_size(png);
    assert_true(size > 0);
    unlink(png);
    int tried = 0;
    FOR_EACH_LIMIT(limit, size, size / 8 + 1) {
        assert_int_equal(cli_limited(limit, args), 1);
        const char *keep[] = {"t.kvt", "r.db", "r.db-wal", "r.db-shm", "cmd.err", NULL};
        assert_int_equal(stray_files(keep), 0);
        tried++;
    }
    assert_true(tried >= 8);
}

/* capture needs the real model */
static int model_path(char *p, size_t n) {
    snprintf(p, n, "%s/../shared/models/stories260K.bin", kvs_test_root());
    if (!kvs_test_exists(p)) {
        fprintf(stderr, "SKIP: %s absent (shared models not installed)\n", p);
        return 0;
    }
    return 1;
}

/* After a failed or killed capture to `out`: no file under the final name unless it is complete, and a .partial
 * (when one is left) recovers to whole blocks of 8 (or says there is none), or to the whole capture of
 * `complete_positions` positions (not a multiple of 8: a kill after the last, short block was written but before
 * the rename leaves every block in the .partial; -1 where the run cannot have written them all). */
static void check_capture_leftovers(const char *out, int must_not_exist, int64_t complete_positions) {
    char partial[300], rec[300];
    snprintf(partial, sizeof partial, "%s.partial", out);
    path_in("rec.kvt", rec, sizeof rec);
    if (kvs_test_exists(out)) {
        assert_false(must_not_exist);
        const char *args[] = {"verify", out, NULL};
        assert_int_equal(kvs_test_cli(NULL, NULL, args), 0);
        unlink(out);
    }
    if (kvs_test_exists(partial)) {
        int64_t n = -1;
        long psize = file_size(partial);
        kvs_status s = kvs_trace_recover(partial, rec, &n);
        /* no complete block yet, or (killed before the header reached the file) no valid header */
        assert_true(s == KVS_OK || s == KVS_ERR_TRUNCATED || (s == KVS_ERR_FORMAT && psize < 152 + 4096));
        if (s == KVS_OK) {
            assert_true(n > 0 && (n % 8 == 0 || n == complete_positions));
            const char *args[] = {"verify", rec, NULL};
            assert_int_equal(kvs_test_cli(NULL, NULL, args), 0);
            unlink(rec);
        }
        unlink(partial);
    }
}

static const char *const CAPTURE_ARGS[] = {"capture", "--model", NULL, "--prompt-ids", "1,403,407,261", "--steps",
                                           "60",      "--block", "8",  "--threads",   "1",             "--out"};

/* The capture's arguments into args (16 entries); steps: "60" for the loops over failure points (a 150 KB trace),
 * "400" for the kill loop (~80 ms of decoding, so the kill times below land before, during and after it). */
static void capture_args(const char **args, const char *model, const char *out, const char *steps) {
    size_t n = sizeof CAPTURE_ARGS / sizeof CAPTURE_ARGS[0];
    for (size_t i = 0; i < n; i++) args[i] = CAPTURE_ARGS[i];
    args[2] = model;
    args[6] = steps;
    args[n] = out;
    args[n + 1] = NULL;
}

static void test_capture_on_a_full_disk(void **state) {
    (void)state;
    char model[512], out[256];
    if (!kvs_test_kvsim_bin() || !model_path(model, sizeof model)) { skip(); }
    path_in("c.kvt", out, sizeof out);
    const char *args[16];
    capture_args(args, model, out, "60");
    assert_int_equal(cli_limited(1L << 30, args), 0);
    long size = file_size(out);
    assert_true(size > 0);
    unlink(out);
    int tried = 0;
    FOR_EACH_LIMIT(limit, size, size / 12 + 1) {
        assert_int_equal(cli_limited(limit, args), 1);
        if (limit >= 4096) expect_error_message("c.kvt");
        check_capture_leftovers(out, 1, -1);
        tried++;
    }
    assert_true(tried >= 12);
}

/* ---------------------------------------------------------------- failing write / fsync / rename */

/* tests/failio/failio.c compiled into the scratch folder (with $CC, default cc); 0 when no compiler works (the
 * tests then skip with a message). */
static int build_failio(char *so, size_t n) {
    path_in("failio.so", so, n);
    const char *cc = getenv("CC");
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s -shared -fPIC -O1 -o '%s' '%s/tests/failio/failio.c' -ldl 2>&2", cc && *cc ? cc : "cc",
             so, kvs_test_root());
    if (system(cmd) != 0) {
        fprintf(stderr, "SKIP: cannot compile tests/failio/failio.c\n");
        return 0;
    }
    return 1;
}

/* Runs kvsim with `op` failing from its n-th call (n 0: nothing fails); report: where the shim appends its call
 * counts, or NULL. Returns the exit status. */
static int cli_failio(const char *so, const char *op, long n, const char *report, const char *const *args) {
    char nbuf[32], asan[600];
    snprintf(nbuf, sizeof nbuf, "%ld", n);
    const char *old_asan = getenv("ASAN_OPTIONS");
    /* an ASan build of kvsim insists on its runtime being loaded first; the shim only wraps libc calls */
    snprintf(asan, sizeof asan, "%s%sverify_asan_link_order=0", old_asan ? old_asan : "", old_asan ? ":" : "");
    char *saved_asan = old_asan ? strdup(old_asan) : NULL;
    setenv("ASAN_OPTIONS", asan, 1);
    setenv("KVS_FAILIO_OP", op, 1);
    setenv("KVS_FAILIO_N", nbuf, 1);
    if (report) setenv("KVS_FAILIO_REPORT", report, 1);
    setenv("LD_PRELOAD", so, 1);
    char err[256];
    path_in("cmd.err", err, sizeof err);
    pid_t pid = kvs_test_cli_spawn("/dev/null", err, args);
    unsetenv("LD_PRELOAD");
    unsetenv("KVS_FAILIO_OP");
    unsetenv("KVS_FAILIO_N");
    unsetenv("KVS_FAILIO_REPORT");
    if (saved_asan) setenv("ASAN_OPTIONS", saved_asan, 1);
    else unsetenv("ASAN_OPTIONS");
    free(saved_asan);
    assert_true(pid > 0);
    return kvs_test_cli_wait(pid);
}

/* How many calls of `op` the command makes (the largest count any of its processes reported). */
static long count_calls(const char *so, const char *op, const char *const *args) {
    char report[256];
    path_in("calls.txt", report, sizeof report);
    unlink(report);
    int rc = cli_failio(so, op, 0, report, args);
    if (rc != 0) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "cat '%s/cmd.err' >&2", dir);
        (void)system(cmd);
    }
    assert_int_equal(rc, 0);
    FILE *f = fopen(report, "r");
    assert_non_null(f);
    long most = 0, c;
    char name[16];
    while (fscanf(f, "%15s %ld", name, &c) == 2)
        if (c > most) most = c;
    fclose(f);
    unlink(report);
    return most;
}

/* The failure points tried for a command making `calls` calls: all of them up to 24, else 24 spread evenly
 * (the first and the last included). */
static long nth_point(long calls, int i, int *n_points) {
    *n_points = calls <= 24 ? (int)calls : 24;
    if (calls <= 24) return i + 1;
    return 1 + (long)((double)i * (double)(calls - 1) / 23.0);
}

static const char *const FAIL_OPS[] = {"write", "fsync", "rename"};

/* trace recover: any failing write, fsync or rename leaves no output and no temporary file. */
static void test_recover_with_failing_io_leaves_nothing(void **state) {
    (void)state;
    char so[256], in[256], out[256];
    if (!kvs_test_kvsim_bin() || !build_failio(so, sizeof so)) { skip(); }
    gen_trace("in.kvt", in, sizeof in);
    path_in("out.kvt", out, sizeof out);
    const char *args[] = {"trace", "recover", in, out, NULL};
    for (int k = 0; k < 3; k++) {
        long calls = count_calls(so, FAIL_OPS[k], args);
        assert_true(calls >= 1);
        unlink(out);
        int n_points;
        nth_point(calls, 0, &n_points);
        for (int i = 0; i < n_points; i++) {
            assert_int_equal(cli_failio(so, FAIL_OPS[k], nth_point(calls, i, &n_points), NULL, args), 1);
            expect_error_message("out.kvt");
            const char *keep[] = {"in.kvt", "cmd.err", "failio.so", NULL};
            assert_int_equal(stray_files(keep), 0);
        }
    }
}

/* replay of one run into an existing database, failing a write, fsync or rename from the N-th call on (the
 * database restored before each point): either it exits 1 and the database lists exactly the runs it had
 * (`runs --all`, byte for byte), or the call failed after the run's commit (the checkpoint of SQLite's log at
 * close, which SQLite redoes from the log on the next open) and it exits 0 with the run complete. */
static void test_replay_with_failing_io_keeps_the_database(void **state) {
    (void)state;
    char so[256], trace[256], db[256], runs_now[256];
    if (!kvs_test_kvsim_bin() || !build_failio(so, sizeof so)) { skip(); }
    gen_trace("t.kvt", trace, sizeof trace);
    path_in("r.db", db, sizeof db);
    path_in("runs.csv", runs_now, sizeof runs_now);
    assert_int_equal(run_replay(1L << 30, trace, db, "window"), 0);
    const char *rargs[] = {"runs", db, "--csv", "--summary", "--all", NULL};
    assert_int_equal(kvs_test_cli(runs_now, NULL, rargs), 0);
    size_t n_runs0;
    uint8_t *runs0 = kvs_test_slurp(runs_now, &n_runs0);
    char orig[256];
    path_in("orig.db", orig, sizeof orig);
    char cp0[700];
    snprintf(cp0, sizeof cp0, "cp '%s' '%s'", db, orig);
    assert_int_equal(system(cp0), 0);
    const char *args[] = {"replay", trace, "--db", db, "--policy", "tova", "--budgets", "8", "--threads", "1", NULL};
    char probe[256];
    path_in("probe.db", probe, sizeof probe);
    for (int k = 0; k < 3; k++) {
        /* count on a copy: the counting run itself adds its run */
        char cmd[1400];
        snprintf(cmd, sizeof cmd, "cp '%s' '%s'", db, probe);
        assert_int_equal(system(cmd), 0);
        const char *pargs[] = {"replay", trace, "--db", probe, "--policy", "tova", "--budgets", "8", "--threads", "1", NULL};
        long calls = count_calls(so, FAIL_OPS[k], pargs);
        unlink(probe);
        if (calls == 0) continue; /* SQLite in WAL mode renames nothing */
        int n_points, failed = 0;
        nth_point(calls, 0, &n_points);
        for (int i = 0; i < n_points; i++) {
            long nth = nth_point(calls, i, &n_points);
            snprintf(cmd, sizeof cmd, "rm -f '%s-wal' '%s-shm' && cp '%s' '%s'", db, db, orig, db);
            assert_int_equal(system(cmd), 0);
            int rc = cli_failio(so, FAIL_OPS[k], nth, NULL, args);
            assert_int_equal(kvs_test_cli(runs_now, NULL, rargs), 0);
            size_t n1;
            uint8_t *csv = kvs_test_slurp(runs_now, &n1);
            if (rc == 1) { /* rolled back: the runs it had, byte for byte */
                failed++;
                assert_int_equal(n1, n_runs0);
                assert_memory_equal(csv, runs0, n_runs0);
            } else { /* committed before the failing call (the checkpoint at close may fail: the log keeps it) */
                assert_int_equal(rc, 0);
                assert_true(n1 > n_runs0);
                assert_memory_equal(csv, runs0, n_runs0);
                kvs_results_db *r = NULL;
                assert_int_equal(kvs_results_open_readonly(db, &r), KVS_OK);
                kvs_results_run_row *rows = NULL;
                int64_t nr = 0;
                assert_int_equal(kvs_results_query_runs(r, NULL, &rows, &nr), KVS_OK);
                assert_int_equal(nr, 2);
                assert_string_equal(rows[1].policy, "tova");
                assert_true(rows[1].has_agg);
                kvs_results_run_rows_free(rows, nr);
                kvs_results_close(r);
            }
            free(csv);
            const char *keep[] = {"t.kvt", "r.db", "orig.db", "r.db-wal", "r.db-shm", "cmd.err", "runs.csv",
                                  "failio.so", NULL};
            assert_int_equal(stray_files(keep), 0);
        }
        assert_true(failed >= 1 && nth_point(calls, 0, &n_points) == 1); /* the first call always fails it */
    }
    free(runs0);
}

/* capture: a failing write, fsync or rename exits 1, leaves no trace under the final name, and any .partial
 * left behind recovers to whole blocks. */
static void test_capture_with_failing_io(void **state) {
    (void)state;
    char so[256], model[512], out[256];
    if (!kvs_test_kvsim_bin() || !model_path(model, sizeof model) || !build_failio(so, sizeof so)) { skip(); }
    path_in("c.kvt", out, sizeof out);
    const char *args[16];
    capture_args(args, model, out, "60");
    for (int k = 0; k < 3; k++) {
        long calls = count_calls(so, FAIL_OPS[k], args);
        assert_true(calls >= 1);
        unlink(out);
        int n_points;
        nth_point(calls, 0, &n_points);
        for (int i = 0; i < n_points; i++) {
            assert_int_equal(cli_failio(so, FAIL_OPS[k], nth_point(calls, i, &n_points), NULL, args), 1);
            expect_error_message("c.kvt");
            check_capture_leftovers(out, 1, -1);
        }
    }
}

/* plot: a failing write, fsync or rename (kvsim's or gnuplot's) exits 1 and leaves no output or temporary. */
static void test_plot_with_failing_io_leaves_nothing(void **state) {
    (void)state;
    char so[256], trace[256], db[256], svg[256];
    if (!kvs_test_kvsim_bin() || system("command -v gnuplot >/dev/null 2>&1") != 0 || !build_failio(so, sizeof so)) {
        skip();
    }
    gen_trace("t.kvt", trace, sizeof trace);
    path_in("r.db", db, sizeof db);
    path_in("p.svg", svg, sizeof svg);
    assert_int_equal(run_replay(1L << 30, trace, db, "window"), 0);
    const char *args[] = {"plot", db, "--kind", "error-vs-budget", "--out", svg, NULL};
    for (int k = 0; k < 3; k++) {
        long calls = count_calls(so, FAIL_OPS[k], args);
        assert_true(calls >= 1);
        unlink(svg);
        int n_points;
        nth_point(calls, 0, &n_points);
        for (int i = 0; i < n_points; i++) {
            assert_int_equal(cli_failio(so, FAIL_OPS[k], nth_point(calls, i, &n_points), NULL, args), 1);
            const char *keep[] = {"t.kvt", "r.db", "r.db-wal", "r.db-shm", "cmd.err", "failio.so", NULL};
            assert_int_equal(stray_files(keep), 0);
        }
    }
}

/* What a replay killed before its schema committed leaves, a 0-byte file or an SQLite file with no schema object
 * (the WAL switch commits before the schema), is an empty database: readers say so (KVS_ERR_END), and the next
 * replay initialises it (before the fix, `runs` called it "not an SQLite file" and replay refused it). */
static void test_empty_database_is_reported_and_reused(void **state) {
    (void)state;
    char db[256];
    path_in("e.db", db, sizeof db);
    for (int kind = 0; kind < 2; kind++) {
        unlink(db);
        if (kind == 0) {
            FILE *f = fopen(db, "w");
            assert_non_null(f);
            fclose(f);
        } else {
            /* an SQLite file in WAL mode with no schema object left (what the WAL switch commits alone) */
            sqlite3 *raw = NULL;
            assert_int_equal(sqlite3_open(db, &raw), SQLITE_OK);
            assert_int_equal(sqlite3_exec(raw, "PRAGMA journal_mode=WAL; CREATE TABLE x (a); DROP TABLE x;", NULL, NULL,
                                          NULL),
                             SQLITE_OK);
            assert_int_equal(sqlite3_close(raw), SQLITE_OK);
            assert_true(file_size(db) > 0);
        }
        kvs_results_db *r = (kvs_results_db *)1;
        assert_int_equal(kvs_results_open_readonly(db, &r), KVS_ERR_END);
        assert_null(r);
        assert_non_null(strstr(kvs_last_error(), "empty results database: no runs recorded"));
        if (!kvs_test_kvsim_bin()) continue;
        char trace[256];
        gen_trace("t.kvt", trace, sizeof trace);
        const char *rargs[] = {"runs", db, NULL};
        assert_int_equal(kvs_test_cli(NULL, NULL, rargs), 1);
        assert_int_equal(run_replay(1L << 30, trace, db, "window"), 0);
        assert_int_equal(kvs_test_cli(NULL, NULL, rargs), 0);
    }
}

/* ---------------------------------------------------------------- SIGKILL */

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
    nanosleep(&ts, NULL);
}

static void sleep_ms(long ms) { sleep_us(ms * 1000); }

/* Kill times (ms after the start): the same list whatever the machine's speed; each run's result is checked
 * whenever the kill landed (before the output existed, mid-write, or after the command finished). */
static const long KILL_MS[] = {0, 2, 5, 10, 20, 40, 80, 160};

static void test_capture_killed_at_any_time(void **state) {
    (void)state;
    char model[512], out[256];
    if (!kvs_test_kvsim_bin() || !model_path(model, sizeof model)) { skip(); }
    path_in("k.kvt", out, sizeof out);
    const char *args[16];
    capture_args(args, model, out, "400");
    /* the whole capture, once, for its length (it stops at EOS before 400 steps) */
    assert_int_equal(kvs_test_cli(NULL, NULL, args), 0);
    kvs_trace *whole = NULL;
    assert_int_equal(kvs_trace_open(out, &whole), KVS_OK);
    int64_t complete_positions = kvs_trace_info_get(whole)->n_positions;
    kvs_trace_close(whole);
    assert_true(complete_positions % 8 != 0); /* else the check below could not tell the two cases apart */
    unlink(out);
    for (size_t i = 0; i < sizeof KILL_MS / sizeof KILL_MS[0]; i++) {
        pid_t pid = kvs_test_cli_spawn(NULL, NULL, args);
        assert_true(pid > 0);
        sleep_ms(KILL_MS[i]);
        kill(pid, SIGKILL);
        (void)kvs_test_cli_wait(pid);
        check_capture_leftovers(out, 0, complete_positions);
    }
}

/* Replay computes its runs first and writes the database at the end, run by run: to land in those writes, each
 * kill comes a set delay after the database file appears (polled every 50 us). Even rounds start from no database
 * (the kill may land in its creation), odd ones add to the previous rounds' database. */
static const long KILL_AFTER_DB_US[] = {0, 100, 300, 1000, 2000, 4000, 8000, 16000, 0, 200, 600, 3000};

static void test_replay_killed_at_any_time(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) { skip(); }
    char trace[512], db[256];
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    path_in("r.db", db, sizeof db);
    int landed = 0;
    for (size_t i = 0; i < sizeof KILL_AFTER_DB_US / sizeof KILL_AFTER_DB_US[0]; i++) {
        if (i % 2 == 0) {
            char cmd[1200];
            snprintf(cmd, sizeof cmd, "rm -f '%s' '%s-wal' '%s-shm'", db, db, db);
            assert_int_equal(system(cmd), 0);
        }
        const char *args[] = {"replay", trace, "--db", db, "--policy", "h2o", "--policy", "tova", "--budgets",
                              "4,8,16", "--threads", "1", NULL};
        long before = file_size(db);
        pid_t pid = kvs_test_cli_spawn(NULL, NULL, args);
        assert_true(pid > 0);
        int st, reaped = 0;
        /* wait for the database to appear (or, adding to one, to change), or for the replay to end */
        while (!(reaped = waitpid(pid, &st, WNOHANG) == pid)) {
            char wal[300];
            snprintf(wal, sizeof wal, "%s-wal", db);
            if (before < 0 ? kvs_test_exists(db) : kvs_test_exists(wal)) break;
            sleep_us(50);
        }
        if (!reaped) {
            sleep_us(KILL_AFTER_DB_US[i]);
            kill(pid, SIGKILL);
            reaped = waitpid(pid, &st, 0) == pid;
            landed += WIFSIGNALED(st);
        }
        assert_true(reaped);
        if (!kvs_test_exists(db)) continue;
        /* the database reads, and every run it lists as complete has its aggregate */
        const char *rargs[] = {"runs", db, NULL};
        char err[256];
        path_in("runs.err", err, sizeof err);
        int rc = kvs_test_cli(NULL, err, rargs);
        if (rc == 1) {
            /* killed before the schema committed: an empty database, said so, and the next replay fills it */
            size_t n;
            char *msg = (char *)kvs_test_slurp(err, &n);
            msg[n] = '\0';
            int empty = strstr(msg, "empty results database: no runs recorded") != NULL;
            free(msg);
            if (empty) {
                const char *again[] = {"replay", trace, "--db", db, "--policy", "window", "--budgets", "4", NULL};
                assert_int_equal(kvs_test_cli(NULL, NULL, again), 0);
                assert_int_equal(kvs_test_cli(NULL, NULL, rargs), 0);
                unlink(db);
                continue;
            }
        }
        if (rc != 0) {
            char cmd[400];
            snprintf(cmd, sizeof cmd, "cat '%s' >&2; ls -la '%s' >&2", err, dir);
            (void)system(cmd);
        }
        assert_int_equal(rc, 0);
        kvs_results_db *r = NULL;
        assert_int_equal(kvs_results_open_readonly(db, &r), KVS_OK);
        kvs_results_run_row *rows = NULL;
        int64_t n = 0;
        assert_int_equal(kvs_results_query_runs(r, NULL, &rows, &n), KVS_OK);
        for (int64_t k = 0; k < n; k++) assert_true(rows[k].has_agg);
        kvs_results_run_rows_free(rows, n);
        kvs_results_close(r);
    }
    assert_true(landed >= 1); /* at least one kill landed while it wrote (the others may have come after) */
}

/* ---------------------------------------------------------------- outputs added since: report, analysis
 * databases, heads --clusters-out, sweep shards and merge */

/* A canonical text of every table of the database at `path` (schema, then each table's rows in rowid order),
 * caller frees: "unchanged" compares these, since SQLite may rewrite pages (a checkpoint) without changing
 * any row. NULL when the file does not exist. */
static char *db_dump(const char *path) {
    if (!kvs_test_exists(path)) return NULL;
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    sqlite3_stmt *tables = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name",
                                        -1, &tables, NULL),
                     SQLITE_OK);
    while (sqlite3_step(tables) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(tables, 0);
        fprintf(f, "%s\n", (const char *)sqlite3_column_text(tables, 1));
        char q[300];
        snprintf(q, sizeof q, "SELECT * FROM \"%s\"", name);
        sqlite3_stmt *rows = NULL;
        assert_int_equal(sqlite3_prepare_v2(db, q, -1, &rows, NULL), SQLITE_OK);
        while (sqlite3_step(rows) == SQLITE_ROW) {
            for (int c = 0; c < sqlite3_column_count(rows); c++) {
                const unsigned char *v = sqlite3_column_text(rows, c);
                fprintf(f, "%s|", v ? (const char *)v : "NULL");
            }
            fputc('\n', f);
        }
        sqlite3_finalize(rows);
    }
    sqlite3_finalize(tables);
    sqlite3_close(db);
    fclose(f);
    return text;
}

static void copy_file(const char *from, const char *to) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    assert_int_equal(system(cmd), 0);
}

/* The tiny llama2.c checkpoint and its trace from the fuzz seeds (1 layer, 2 heads of 4 dims): small enough that
 * every command below runs in milliseconds. */
static void tiny_model(char *model, size_t nm, char *trace, size_t nt) {
    snprintf(model, nm, "%s/fuzz/corpus/model_llama2c/tiny.bin", kvs_test_root());
    snprintf(trace, nt, "%s/fuzz/corpus/trace/tiny_fp16_block3.kvt", kvs_test_root());
}

/* A command that adds one thing to database `db` (which already holds a replay run), run with a failing write,
 * fsync or rename from its n-th call (the database restored before each point): it exits 1 and the database
 * holds exactly what it held (db_dump), or the failing call came after its commit (SQLite's checkpoint at close,
 * redone from the log on the next open) and it exits 0 with one more row in `table`. Files in `keep` may stay. */
static void db_writer_with_failing_io(const char *so, const char *db, const char *const *args, const char *table,
                                      const char *const *keep) {
    char orig[256], probe[256];
    path_in("orig.db", orig, sizeof orig);
    path_in("probe.db", probe, sizeof probe);
    copy_file(db, orig);
    char *before = db_dump(db);
    assert_non_null(before);
    /* count on a copy: the counting run itself adds its row */
    const char *pargs[24];
    size_t na = 0;
    for (; args[na]; na++) pargs[na] = !strcmp(args[na], db) ? probe : args[na];
    pargs[na] = NULL;
    for (int k = 0; k < 3; k++) {
        copy_file(orig, probe); /* from the clean copy: a failed checkpoint leaves db needing its log */
        long calls = count_calls(so, FAIL_OPS[k], pargs);
        char cmd[1400];
        snprintf(cmd, sizeof cmd, "rm -f '%s' '%s-wal' '%s-shm'", probe, probe, probe);
        assert_int_equal(system(cmd), 0);
        if (calls == 0) continue; /* SQLite in WAL mode renames nothing */
        int n_points, failed = 0;
        nth_point(calls, 0, &n_points);
        for (int i = 0; i < n_points; i++) {
            snprintf(cmd, sizeof cmd, "rm -f '%s-wal' '%s-shm' && cp '%s' '%s'", db, db, orig, db);
            assert_int_equal(system(cmd), 0);
            int rc = cli_failio(so, FAIL_OPS[k], nth_point(calls, i, &n_points), NULL, args);
            char *after = db_dump(db);
            assert_non_null(after);
            if (rc == 1) {
                failed++;
                if (strcmp(before, after)) fprintf(stderr, "%s: %s failing from call %ld changed the database\n",
                                                   args[0], FAIL_OPS[k], nth_point(calls, i, &n_points));
                assert_string_equal(before, after);
            } else {
                assert_int_equal(rc, 0);
                sqlite3 *raw = NULL;
                assert_int_equal(sqlite3_open_v2(db, &raw, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
                char q[128];
                snprintf(q, sizeof q, "SELECT count(*) FROM %s", table);
                sqlite3_stmt *st = NULL;
                assert_int_equal(sqlite3_prepare_v2(raw, q, -1, &st, NULL), SQLITE_OK);
                assert_int_equal(sqlite3_step(st), SQLITE_ROW);
                assert_true(sqlite3_column_int64(st, 0) >= 1);
                sqlite3_finalize(st);
                sqlite3_close(raw);
            }
            free(after);
            assert_int_equal(stray_files(keep), 0);
        }
        assert_true(failed >= 1); /* the first call always fails it */
    }
    free(before);
    unlink(orig);
}

/* drift, heads, plan and generate each write their results in one transaction: a failing write, fsync or rename
 * leaves the database as it was. */
static void test_analysis_db_writes_with_failing_io_keep_the_database(void **state) {
    (void)state;
    char so[256], model[512], trace[512], db[256];
    if (!kvs_test_kvsim_bin() || !build_failio(so, sizeof so)) { skip(); }
    tiny_model(model, sizeof model, trace, sizeof trace);
    path_in("r.db", db, sizeof db);
    const char *keep[] = {"r.db", "orig.db", "r.db-wal", "r.db-shm", "cmd.err", "failio.so", NULL};
    assert_int_equal(run_replay(1L << 30, trace, db, "window"), 0);
    const char *drift[] = {"drift", trace, "--db", db, "--k", "2", "--prefill-score", "last", NULL};
    db_writer_with_failing_io(so, db, drift, "drift_runs", keep);
    const char *heads[] = {"heads", trace, "--db", db, "--k", "2", "--clusters", "1", NULL};
    db_writer_with_failing_io(so, db, heads, "heads_runs", keep);
    const char *plan[] = {"plan", "--model", "Llama-3.1-8B", "--gpu-mem", "80GB", "--db", db, NULL};
    db_writer_with_failing_io(so, db, plan, "plans", keep);
    const char *gen[] = {"generate", "--model", model, "--trace", trace, "--policy", "window", "--budgets", "2",
                         "--db", db, NULL};
    db_writer_with_failing_io(so, db, gen, "closed_runs", keep);
}

/* heads --clusters-out: a full disk (a failing write) anywhere, the database or the clusters file, leaves neither a
 * clusters file nor a new heads run: the file is written to its temporary first and put in place after the
 * database commit. Only the clusters file's fsync or rename, after that commit, can fail with the run recorded,
 * and the message says so. (Before the fix the file was written after the commit: a full disk left the run.) */
static void test_heads_clusters_out_with_failing_io(void **state) {
    (void)state;
    char so[256], model[512], trace[512], db[256], out[256];
    if (!kvs_test_kvsim_bin() || !build_failio(so, sizeof so)) { skip(); }
    tiny_model(model, sizeof model, trace, sizeof trace);
    path_in("r.db", db, sizeof db);
    path_in("c.txt", out, sizeof out);
    assert_int_equal(run_replay(1L << 30, trace, db, "window"), 0);
    const char *args[] = {"heads", trace, "--db", db, "--k", "2", "--clusters", "1", "--clusters-out", out, NULL};
    const char *keep[] = {"r.db", "orig.db", "r.db-wal", "r.db-shm", "cmd.err", "failio.so", "c.txt", NULL};
    char orig[256];
    path_in("orig.db", orig, sizeof orig);
    copy_file(db, orig);
    char *before = db_dump(db);
    for (int k = 0; k < 3; k++) {
        long calls = count_calls(so, FAIL_OPS[k], args);
        assert_true(k == 2 || calls >= 1);
        int n_points;
        nth_point(calls, 0, &n_points);
        for (int i = 0; i < n_points && calls > 0; i++) {
            char cmd[1400];
            snprintf(cmd, sizeof cmd, "rm -f '%s' '%s-wal' '%s-shm' && cp '%s' '%s'", out, db, db, orig, db);
            assert_int_equal(system(cmd), 0);
            int rc = cli_failio(so, FAIL_OPS[k], nth_point(calls, i, &n_points), NULL, args);
            char *after = db_dump(db);
            if (rc == 1) {
                assert_false(kvs_test_exists(out) && k != 1); /* fsync of the folder after the rename: in place */
                /* only the clusters file's own fsync or rename, after the database commit, leaves the run */
                if (strcmp(before, after)) {
                    assert_true(k >= 1);
                    expect_error_message("is recorded in");
                }
            } else { /* only the checkpoint at close failed: both complete */
                assert_int_equal(rc, 0);
                kvs_head_clusters *c = NULL;
                assert_int_equal(kvs_head_clusters_read(out, &c, NULL), KVS_OK);
                kvs_head_clusters_free(c);
            }
            free(after);
            assert_int_equal(stray_files(keep), 0);
        }
    }
    free(before);
}

/* report: a full disk or a failing write, fsync or rename exits 1 and leaves no report folder, no temporary
 * folder, and a previous report exactly as it was. */
static void test_report_with_failing_io_keeps_the_previous_report(void **state) {
    (void)state;
    char so[256], trace[256], db[256], rep[256], prev[256];
    if (!kvs_test_kvsim_bin() || system("command -v gnuplot >/dev/null 2>&1") != 0 || !build_failio(so, sizeof so)) {
        skip();
    }
    gen_trace("t.kvt", trace, sizeof trace);
    path_in("r.db", db, sizeof db);
    path_in("rep", rep, sizeof rep);
    path_in("prev", prev, sizeof prev);
    assert_int_equal(run_replay(1L << 30, trace, db, "window"), 0);
    assert_int_equal(run_replay(1L << 30, trace, db, "h2o"), 0);
    const char *args[] = {"report", db, "--out", rep, NULL};
    assert_int_equal(kvs_test_cli(NULL, NULL, args), 0);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", rep, prev); /* the previous report, to compare with */
    assert_int_equal(system(cmd), 0);
    const char *keep[] = {"t.kvt", "r.db", "r.db-wal", "r.db-shm", "cmd.err", "failio.so", "rep", "prev", NULL};
    snprintf(cmd, sizeof cmd, "diff -r '%s' '%s' >/dev/null", rep, prev);
    for (int k = 0; k < 3; k++) {
        long calls = count_calls(so, FAIL_OPS[k], args);
        assert_int_equal(system(cmd), 0);
        int n_points;
        nth_point(calls, 0, &n_points);
        for (int i = 0; i < n_points && calls > 0; i += 2) { /* every other point: each draws with gnuplot */
            assert_int_equal(cli_failio(so, FAIL_OPS[k], nth_point(calls, i, &n_points), NULL, args), 1);
            assert_int_equal(system(cmd), 0); /* the previous report, byte for byte */
            assert_int_equal(stray_files(keep), 0);
        }
    }
    /* and a full disk, with no previous report: nothing at all */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", rep);
    assert_int_equal(system(cmd), 0);
    const char *keep2[] = {"t.kvt", "r.db", "r.db-wal", "r.db-shm", "cmd.err", "failio.so", "prev", NULL};
    int tried = 0;
    for (long limit = 0; limit < (1L << 16); limit = limit * 2 + 1024) {
        assert_int_equal(cli_limited(limit, args), 1);
        assert_int_equal(stray_files(keep2), 0);
        tried++;
    }
    assert_true(tried >= 6);
}

/* calibrate writes no database (it reads replay and closed-loop runs); its --plot output: a failing write,
 * fsync or rename (kvsim's or gnuplot's) exits 1 and leaves no image or temporary, the database unchanged. */
static void test_calibrate_plot_with_failing_io_leaves_nothing(void **state) {
    (void)state;
    char so[256], model[512], trace[512], db[256], svg[256];
    if (!kvs_test_kvsim_bin() || system("command -v gnuplot >/dev/null 2>&1") != 0 || !build_failio(so, sizeof so)) {
        skip();
    }
    tiny_model(model, sizeof model, trace, sizeof trace);
    path_in("c.db", db, sizeof db);
    path_in("c.svg", svg, sizeof svg);
    const char *rep[] = {"replay", trace, "--db", db, "--policy", "window", "--policy", "h2o", "--policy", "tova",
                         "--budgets", "2", "--threads", "1", NULL};
    assert_int_equal(kvs_test_cli(NULL, NULL, rep), 0);
    const char *gen[] = {"generate", "--model", model, "--trace", trace, "--policy", "window", "--policy", "h2o",
                         "--policy", "tova", "--budgets", "2", "--db", db, NULL};
    assert_int_equal(kvs_test_cli(NULL, NULL, gen), 0);
    char *before = db_dump(db);
    const char *args[] = {"calibrate", db, "--bootstrap", "0", "--plot", svg, NULL};
    const char *keep[] = {"c.db", "c.db-wal", "c.db-shm", "cmd.err", "failio.so", NULL};
    for (int k = 0; k < 3; k++) {
        long calls = count_calls(so, FAIL_OPS[k], args);
        assert_true(calls >= 1);
        unlink(svg);
        int n_points;
        nth_point(calls, 0, &n_points);
        for (int i = 0; i < n_points; i++) {
            assert_int_equal(cli_failio(so, FAIL_OPS[k], nth_point(calls, i, &n_points), NULL, args), 1);
            assert_int_equal(stray_files(keep), 0);
        }
    }
    char *after = db_dump(db);
    assert_string_equal(before, after);
    free(before);
    free(after);
}

/* A study of the tiny trace: 2 tasks (one policy each), for the sweep and merge tests. */
static void tiny_study(char *study, size_t n) {
    char model[512], trace[512];
    tiny_model(model, sizeof model, trace, sizeof trace);
    path_in("s.study", study, n);
    FILE *f = fopen(study, "w");
    assert_non_null(f);
    fprintf(f, "trace %s\npolicy window\npolicy h2o\nbudgets 2,3\nseries-every 1\nthreads 1\n", trace);
    fclose(f);
}

/* The completed tasks of a shard and its runs: every task recorded complete has all its runs complete. */
static int64_t shard_tasks_done(const char *db) {
    sqlite3 *raw = NULL;
    assert_int_equal(sqlite3_open_v2(db, &raw, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *st = NULL;
    int64_t n = 0;
    if (sqlite3_prepare_v2(raw, "SELECT count(*) FROM sweep_tasks", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(raw);
    return n;
}

/* sweep: SIGKILL at several points of a 2-task sweep into a shard; then the shard reads, lists no half-written
 * run as complete, records no task whose runs are not all complete, and running the sweep again completes it
 * (every task recorded once, 4 complete runs). */
static void test_sweep_killed_at_any_time_reruns_cleanly(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) { skip(); }
    char study[256], db[256];
    tiny_study(study, sizeof study);
    path_in("shard.db", db, sizeof db);
    const char *args[] = {"sweep", study, "--db", db, NULL};
    static const long kill_us[] = {0, 500, 1000, 2000, 4000, 8000, 16000, 32000};
    int landed = 0;
    for (size_t i = 0; i < sizeof kill_us / sizeof kill_us[0]; i++) {
        char cmd[1400];
        snprintf(cmd, sizeof cmd, "rm -f '%s' '%s-wal' '%s-shm'", db, db, db);
        assert_int_equal(system(cmd), 0);
        pid_t pid = kvs_test_cli_spawn(NULL, NULL, args);
        assert_true(pid > 0);
        sleep_us(kill_us[i]);
        kill(pid, SIGKILL);
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        landed += WIFSIGNALED(st);
        if (kvs_test_exists(db) && file_size(db) > 0) {
            int64_t done = shard_tasks_done(db);
            assert_true(done >= 0 && done <= 2);
            kvs_results_db *r = NULL;
            if (kvs_results_open_readonly(db, &r) == KVS_OK) {
                kvs_results_run_row *rows = NULL;
                int64_t n = 0;
                kvs_results_filter f = {0};
                if (kvs_results_query_runs(r, &f, &rows, &n) == KVS_OK) {
                    for (int64_t k = 0; k < n; k++) assert_true(rows[k].has_agg);
                    assert_true(n >= 2 * done); /* a task is recorded only after its 2 runs */
                    kvs_results_run_rows_free(rows, n);
                }
                kvs_results_close(r);
            }
        }
        /* and again, to the end */
        assert_int_equal(kvs_test_cli(NULL, NULL, args), 0);
        assert_int_equal(shard_tasks_done(db), 2);
        kvs_results_db *r = NULL;
        assert_int_equal(kvs_results_open_readonly(db, &r), KVS_OK);
        kvs_results_run_row *rows = NULL;
        int64_t n = 0;
        assert_int_equal(kvs_results_query_runs(r, NULL, &rows, &n), KVS_OK);
        assert_true(n >= 4);
        kvs_results_run_rows_free(rows, n);
        kvs_results_close(r);
        kvs_clear_error();
    }
    assert_true(landed >= 1);
}

/* merge: a failing write, fsync or rename, or a SIGKILL, leaves OUT byte for byte as it was and (but for a
 * killed merge's documented OUT.merge-PID.tmp) nothing beside it. */
static void test_merge_failing_or_killed_leaves_out_unchanged(void **state) {
    (void)state;
    char so[256], study[256], shard[256], out[256], orig[256];
    if (!kvs_test_kvsim_bin() || !build_failio(so, sizeof so)) { skip(); }
    tiny_study(study, sizeof study);
    path_in("shard.db", shard, sizeof shard);
    path_in("out.db", out, sizeof out);
    path_in("orig.db", orig, sizeof orig);
    const char *sargs[] = {"sweep", study, "--db", shard, "--task", "0", NULL};
    assert_int_equal(kvs_test_cli(NULL, NULL, sargs), 0);
    char model[512], trace[512];
    tiny_model(model, sizeof model, trace, sizeof trace);
    assert_int_equal(run_replay(1L << 30, trace, out, "tova"), 0);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -f '%s-wal' '%s-shm'", out, out);
    assert_int_equal(system(cmd), 0);
    copy_file(out, orig);
    size_t n0;
    uint8_t *before = kvs_test_slurp(out, &n0);
    const char *args[] = {"merge", out, shard, NULL};
    /* SQLite's read-only open of OUT (a WAL-mode database, merged first) leaves its empty log and index */
    const char *keep[] = {"s.study", "shard.db", "out.db", "orig.db", "cmd.err", "failio.so", "shard.db-wal",
                          "shard.db-shm", "out.db-wal", "out.db-shm", NULL};
    for (int k = 0; k < 3; k++) {
        long calls = count_calls(so, FAIL_OPS[k], args);
        assert_true(calls >= 1);
        int n_points;
        nth_point(calls, 0, &n_points);
        for (int i = 0; i < n_points; i++) {
            copy_file(orig, out);
            int rc = cli_failio(so, FAIL_OPS[k], nth_point(calls, i, &n_points), NULL, args);
            size_t n1;
            uint8_t *now = kvs_test_slurp(out, &n1);
            if (rc == 1) { /* unchanged, byte for byte */
                assert_int_equal(n1, n0);
                assert_memory_equal(now, before, n0);
            } else { /* the failing call came after the rename (the folder's fsync): OUT complete */
                assert_int_equal(rc, 0);
                kvs_results_db *r = NULL;
                assert_int_equal(kvs_results_open_readonly(out, &r), KVS_OK);
                kvs_results_close(r);
            }
            free(now);
            assert_int_equal(stray_files(keep), 0);
        }
    }
    /* killed at several points: OUT is the old file or the complete merge, never a mixture */
    static const long kill_us[] = {0, 1000, 3000, 6000, 12000, 25000};
    for (size_t i = 0; i < sizeof kill_us / sizeof kill_us[0]; i++) {
        copy_file(orig, out);
        pid_t pid = kvs_test_cli_spawn(NULL, NULL, args);
        assert_true(pid > 0);
        sleep_us(kill_us[i]);
        kill(pid, SIGKILL);
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        size_t n1;
        uint8_t *now = kvs_test_slurp(out, &n1);
        if (!(n1 == n0 && !memcmp(now, before, n0))) {
            kvs_results_db *r = NULL;
            assert_int_equal(kvs_results_open_readonly(out, &r), KVS_OK);
            kvs_results_run_row *rows = NULL;
            int64_t n = 0;
            assert_int_equal(kvs_results_query_runs(r, NULL, &rows, &n), KVS_OK);
            assert_int_equal(n, 3); /* tova, and the shard's window at budgets 2 and 3 */
            kvs_results_run_rows_free(rows, n);
            kvs_results_close(r);
        }
        free(now);
        snprintf(cmd, sizeof cmd, "rm -f '%s'/out.db.merge-*", dir);
        assert_int_equal(system(cmd), 0);
    }
    free(before);
}

/* A replay into a NEW database that fails before its run is stored (a full disk, a failing write or fsync at any
 * point: creating the file, switching it to WAL, its schema, the trace row, the run) removes what it created:
 * the database, its -wal and its -shm (before, an empty database and a 372 KB log stayed behind). When the failing
 * call comes after the run's commit the replay succeeds and the database lists its run. */
static void test_replay_into_a_new_database_failing_leaves_nothing(void **state) {
    (void)state;
    char so[256], trace[256], db[256];
    if (!kvs_test_kvsim_bin() || !build_failio(so, sizeof so)) { skip(); }
    gen_trace("t.kvt", trace, sizeof trace);
    path_in("n.db", db, sizeof db);
    const char *args[] = {"replay", trace, "--db", db, "--policy", "window", "--budgets", "8", "--threads", "1", NULL};
    const char *keep[] = {"t.kvt", "cmd.err", "failio.so", NULL};
    char rm[1024];
    snprintf(rm, sizeof rm, "rm -f '%s' '%s-wal' '%s-shm'", db, db, db);
    int failed_late = 0; /* failures after the schema was in the log: what left the debris */
    static const char *const ops[] = {"write", "fsync"};
    for (int k = 0; k < 2; k++) {
        long calls = count_calls(so, ops[k], args);
        assert_int_equal(system(rm), 0);
        assert_true(calls >= 2);
        int failed = 0;
        for (long nth = 1; nth <= calls; nth++) { /* every call: the debris came from a few of them */
            int rc = cli_failio(so, ops[k], nth, NULL, args);
            if (rc == 0) { /* the failing call came after the commit (the checkpoint at close) */
                const char *rargs[] = {"runs", db, NULL};
                assert_int_equal(kvs_test_cli(NULL, NULL, rargs), 0);
                assert_int_equal(system(rm), 0);
                continue;
            }
            assert_int_equal(rc, 1);
            failed++;
            failed_late += nth > 1;
            if (stray_files(keep) != 0) {
                fprintf(stderr, "replay into a new database, %s failing from call %ld of %ld: debris left\n", ops[k],
                        nth, calls);
                fail();
            }
        }
        assert_true(failed >= 1);
    }
    assert_true(failed_late >= 1);
    /* a full disk (every file limited to `limit` bytes): nothing left either, until the limit lets it through */
    int tried = 0;
    for (long limit = 0; limit < (1L << 22); limit = limit * 2 + 4096) {
        int rc = cli_limited(limit, args);
        if (rc == 0) break;
        assert_int_equal(rc, 1);
        assert_int_equal(stray_files(keep), 0);
        tried++;
    }
    assert_true(tried >= 3);
}

/* ---------------------------------------------------------------- a folder that may be read, not written */

/* "name size sha256\n" of every file in `folder`, in readdir order sorted by name (caller frees): what a reader
 * must leave as it found it. */
static char *folder_snapshot(const char *folder) {
    struct dirent **names = NULL;
    int n = scandir(folder, &names, NULL, alphasort);
    assert_true(n >= 0);
    size_t cap = 64 + (size_t)n * 400, len = 0;
    char *out = calloc(1, cap);
    assert_non_null(out);
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i]->d_name, ".") && strcmp(names[i]->d_name, "..")) {
            char p[600], hex[65] = "-";
            snprintf(p, sizeof p, "%s/%s", folder, names[i]->d_name);
            struct stat st;
            assert_int_equal(lstat(p, &st), 0);
            if (S_ISREG(st.st_mode)) assert_int_equal(kvs_sha256_file_hex(p, hex), KVS_OK);
            len += (size_t)snprintf(out + len, cap - len, "%s %lld %s\n", names[i]->d_name, (long long)st.st_size, hex);
        }
        free(names[i]);
    }
    free(names);
    return out;
}

/* Runs kvsim with the shim making `rodir` read-only (failing with `err_name`, "EACCES" or "EROFS"), stdout to
 * out_path (NULL: /dev/null). *blocked receives how many calls the shim refused. Returns the exit status. */
static int cli_in_ro_folder(const char *so, const char *rodir, const char *err_name, const char *out_path,
                            long *blocked, const char *const *args) {
    char report[256], err[256];
    path_in("calls.txt", report, sizeof report);
    path_in("cmd.err", err, sizeof err);
    unlink(report);
    /* an ASan build of kvsim insists on its runtime being loaded first; the shim only wraps libc calls */
    char asan[600];
    const char *old_asan = getenv("ASAN_OPTIONS");
    snprintf(asan, sizeof asan, "%s%sverify_asan_link_order=0", old_asan ? old_asan : "", old_asan ? ":" : "");
    char *saved_asan = old_asan ? strdup(old_asan) : NULL;
    setenv("ASAN_OPTIONS", asan, 1);
    setenv("KVS_FAILIO_OP", "open", 1);
    setenv("KVS_FAILIO_N", "1", 1);
    setenv("KVS_FAILIO_DIR", rodir, 1);
    setenv("KVS_FAILIO_ERRNO", err_name, 1);
    setenv("KVS_FAILIO_REPORT", report, 1);
    setenv("LD_PRELOAD", so, 1);
    pid_t pid = kvs_test_cli_spawn(out_path ? out_path : "/dev/null", err, args);
    unsetenv("LD_PRELOAD");
    unsetenv("KVS_FAILIO_OP");
    unsetenv("KVS_FAILIO_N");
    unsetenv("KVS_FAILIO_DIR");
    unsetenv("KVS_FAILIO_ERRNO");
    unsetenv("KVS_FAILIO_REPORT");
    if (saved_asan) setenv("ASAN_OPTIONS", saved_asan, 1);
    else unsetenv("ASAN_OPTIONS");
    free(saved_asan);
    assert_true(pid > 0);
    int rc = kvs_test_cli_wait(pid);
    *blocked = 0;
    FILE *f = fopen(report, "r");
    if (f) {
        char name[16];
        long c;
        while (fscanf(f, "%15s %ld", name, &c) == 2) *blocked += c;
        fclose(f);
    }
    return rc;
}

/* Its child: commits a change to `db` that stays in the write-ahead log (no checkpoint, no close), as a writer
 * killed after its commit leaves it: the -wal and -shm files remain beside the database. */
static void commit_into_the_log_only(const char *db, const char *sql) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        sqlite3 *raw = NULL;
        if (sqlite3_open_v2(db, &raw, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK ||
            sqlite3_exec(raw, "PRAGMA wal_autocheckpoint = 0", NULL, NULL, NULL) != SQLITE_OK ||
            sqlite3_exec(raw, sql, NULL, NULL, NULL) != SQLITE_OK)
            _exit(1);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* A results database in a folder the user may read but not write (no write permission, a read-only mount):
 * runs, compare, plot and report read it (SQLite cannot create its -wal and -shm there: the reader falls back to
 * reading the checkpointed file as immutable), and leave the folder as they found it, file for file and byte for
 * byte. With -wal and -shm left by a writer that committed and never checkpointed, the reader sees the run only
 * the log holds; with a -wal and no -shm it refuses, saying why. Tests run as root, where chmod does not stop a
 * write: the shim (tests/failio, op open) refuses every write, creation and removal in the folder instead. */
static void test_readers_in_a_read_only_folder(void **state) {
    (void)state;
    char so[256], trace[256], rodir[256], db[300], out[256], svg[256], rep[256];
    if (!kvs_test_kvsim_bin() || !build_failio(so, sizeof so)) { skip(); }
    int have_gnuplot = system("command -v gnuplot >/dev/null 2>&1") == 0;
    gen_trace("t.kvt", trace, sizeof trace);
    path_in("ro", rodir, sizeof rodir);
    assert_int_equal(mkdir(rodir, 0755), 0);
    snprintf(db, sizeof db, "%s/r.db", rodir);
    path_in("out.txt", out, sizeof out);
    path_in("p.svg", svg, sizeof svg);
    path_in("rep", rep, sizeof rep);
    assert_int_equal(run_replay(1L << 30, trace, db, "window"), 0);
    assert_int_equal(run_replay(1L << 30, trace, db, "h2o"), 0);
    char *before = folder_snapshot(rodir);
    assert_non_null(strstr(before, "r.db "));
    assert_null(strstr(before, "r.db-wal")); /* the writers' last close folded the log into the file */

    const char *runs[] = {"runs", db, "--csv", "--all", NULL};
    const char *compare[] = {"compare", db, "--match", "tokens", "--at", "8", NULL};
    const char *plot[] = {"plot", db, "--kind", "error-vs-budget", "--out", svg, NULL};
    const char *report[] = {"report", db, "--out", rep, NULL};
    const char *const *cmds[] = {runs, compare, plot, report};
    static const char *const errs[] = {"EACCES", "EROFS"};
    for (int e = 0; e < 2; e++)
        for (int c = 0; c < 4; c++) {
            if (c >= 2 && !have_gnuplot) continue;
            long blocked = 0;
            int rc = cli_in_ro_folder(so, rodir, errs[e], out, &blocked, cmds[c]);
            if (rc != 0) {
                fprintf(stderr, "kvsim %s in a read-only folder (%s): exit %d\n", cmds[c][0], errs[e], rc);
                char cmd[400];
                snprintf(cmd, sizeof cmd, "cat '%s/cmd.err' >&2", dir);
                (void)system(cmd);
            }
            assert_int_equal(rc, 0);
            assert_true(blocked >= 1); /* the folder really refused something: SQLite's -wal/-shm at least */
            char *now = folder_snapshot(rodir);
            assert_string_equal(now, before);
            free(now);
            if (c == 0) {
                char *csv = kvs_test_slurp(out, NULL);
                assert_non_null(strstr(csv, "\nwindow,"));
                assert_non_null(strstr(csv, "\nh2o,"));
                free(csv);
            }
        }
    if (have_gnuplot) {
        assert_true(file_size(svg) > 0);
        char idx[300];
        snprintf(idx, sizeof idx, "%s/report.html", rep);
        assert_true(file_size(idx) > 0);
    }
    free(before);

    /* a writer's committed change only in the log, -wal and -shm beside the database: read, the log included */
    commit_into_the_log_only(db, "UPDATE runs SET notes = 'only in the log' WHERE policy = 'h2o'");
    before = folder_snapshot(rodir);
    assert_non_null(strstr(before, "r.db-wal"));
    assert_non_null(strstr(before, "r.db-shm"));
    long blocked = 0;
    assert_int_equal(cli_in_ro_folder(so, rodir, "EACCES", out, &blocked, runs), 0);
    char *csv = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(csv, "only in the log"));
    free(csv);
    char *now = folder_snapshot(rodir);
    assert_string_equal(now, before);
    free(now);
    free(before);

    /* a -wal without its -shm: SQLite cannot read it here, and the file alone would miss the log's run: refused */
    char shm[320];
    snprintf(shm, sizeof shm, "%s-shm", db);
    assert_int_equal(unlink(shm), 0);
    before = folder_snapshot(rodir);
    assert_int_equal(cli_in_ro_folder(so, rodir, "EACCES", out, &blocked, runs), 1);
    expect_error_message("write-ahead log");
    now = folder_snapshot(rodir);
    assert_string_equal(now, before);
    free(now);
    free(before);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_recover_on_a_full_disk_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_on_a_full_disk_leaves_the_database_unchanged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plot_on_a_full_disk_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_capture_on_a_full_disk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recover_with_failing_io_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_with_failing_io_keeps_the_database, setup, teardown),
        cmocka_unit_test_setup_teardown(test_capture_with_failing_io, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plot_with_failing_io_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_database_is_reported_and_reused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_capture_killed_at_any_time, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_killed_at_any_time, setup, teardown),
        cmocka_unit_test_setup_teardown(test_analysis_db_writes_with_failing_io_keep_the_database, setup, teardown),
        cmocka_unit_test_setup_teardown(test_heads_clusters_out_with_failing_io, setup, teardown),
        cmocka_unit_test_setup_teardown(test_report_with_failing_io_keeps_the_previous_report, setup, teardown),
        cmocka_unit_test_setup_teardown(test_calibrate_plot_with_failing_io_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sweep_killed_at_any_time_reruns_cleanly, setup, teardown),
        cmocka_unit_test_setup_teardown(test_merge_failing_or_killed_leaves_out_unchanged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_into_a_new_database_failing_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_readers_in_a_read_only_folder, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
