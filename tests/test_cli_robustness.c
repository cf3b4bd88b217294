/* test_cli_robustness.c — a CLI that behaves: output paths (common/kvs_out.h, unit tests first, then `export
 * --out`, `trace recover ... OUT` through the kvsim binary $KVSIM_BIN): symbolic links written through, FIFOs
 * and devices written in place, `-` and links to /dev/fd/1 as standard output, nothing half-written on failure;
 * write errors on standard output exit 1; a single-valued option given twice is a usage error; range messages
 * echo the user's text and print exact bounds; one --threads limit. All traces here are GENERATED test data
 * (tests/util/gen_trace.h), not a model's. The capture side (prompts, --out) is in tests/test_capture.c.
 */
#include <dirent.h>
#include <errno.h>
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

#include "common/kvs.h"
#include "common/kvs_out.h"
#include "tests/util/gen_trace.h"
#include "trace/trace.h"
#include "tests/util/testenv.h"

typedef struct {
    char dir[64];
    char trace[128];
    char *out, *err; /* captured output of the last run */
} ctx;

static int setup(void **state) {
    ctx *c = calloc(1, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "/tmp/kvs_cli_robust_XXXXXX");
    if (!mkdtemp(c->dir)) return -1;
    snprintf(c->trace, sizeof c->trace, "%s/t.kvt", c->dir);
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = 20;
    o.block_positions = 8;
    kvs_gen_trace *g = NULL;
    if (kvs_gen_trace_create(&o, &g) != KVS_OK || kvs_gen_trace_write(g, c->trace) != KVS_OK) return -1;
    kvs_gen_trace_free(g);
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

static const char *kvsim_bin(void) {
    const char *b = getenv("KVSIM_BIN");
    if (!b || !b[0]) {
        print_message("KVSIM_BIN is not set (run through `make test`): skipping CLI test\n");
        skip();
    }
    return b;
}

static void path_in(const ctx *c, const char *name, char *buf, size_t cap) { snprintf(buf, cap, "%s/%s", c->dir, name); }



/* Runs kvsim with the NULL-terminated arguments, standard output to `out_path` (NULL: captured into c->out;
 * opened for appending when `append`), stderr captured into c->err; returns the exit status. */
static int run_to(ctx *c, const char *out_path, int append, ...) {
    const char *bin = kvsim_bin();
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)bin;
    va_list ap;
    va_start(ap, append);
    const char *a;
    while ((a = va_arg(ap, const char *)) && n < 31) argv[n++] = (char *)a;
    va_end(ap);
    argv[n] = NULL;
    char outp[160], errp[160];
    snprintf(outp, sizeof outp, "%s/stdout", c->dir);
    snprintf(errp, sizeof errp, "%s/stderr", c->dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(out_path ? out_path : outp, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
        int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(120);
        execv(bin, argv);
        _exit(121);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    free(c->out);
    free(c->err);
    c->out = out_path ? calloc(1, 1) : kvs_test_slurp(outp, NULL);
    c->err = kvs_test_slurp(errp, NULL);
    assert_true(c->out && c->err);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}
#define run(c, ...) run_to((c), NULL, 0, __VA_ARGS__, NULL)

#define assert_contains(hay, needle)                                                                           \
    do {                                                                                                       \
        if (!strstr((hay), (needle))) fail_msg("expected '%s' in:\n%s", (needle), (hay));                      \
    } while (0)

/* Asserts a usage error: exit 2 and the key words on stderr. */
#define assert_usage(c, key, ...)                                                                              \
    do {                                                                                                       \
        int rc_ = run((c), __VA_ARGS__);                                                                       \
        if (rc_ != 2) fail_msg("exit %d (expected 2); stderr:\n%s", rc_, (c)->err);                            \
        assert_contains((c)->err, (key));                                                                      \
    } while (0)

/* Number of entries of `dir` whose name contains `part`. */
static int count_names(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, part)) n++;
    closedir(d);
    return n;
}

static int is_link(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0 && S_ISLNK(st.st_mode);
}

/* The tokens .npy of the generated trace (20 positions): header + 80 bytes. */
static void assert_tokens_npy(const char *buf, size_t len) {
    assert_true(len > 10);
    assert_memory_equal(buf, "\x93NUMPY", 6);
    assert_non_null(strstr(buf + 10, "'shape': (20,)"));
    size_t hl = (size_t)((uint8_t)buf[8] | ((uint8_t)buf[9] << 8));
    assert_int_equal(len, 10 + hl + 20 * 4);
}

/* ------------------------------------------------------------------------------------------------
 * common/kvs_out.h
 * ---------------------------------------------------------------------------------------------- */

static void test_kvs_out_replaces_atomically_keeping_the_mode(void **state) {
    ctx *c = *state;
    char p[160];
    path_in(c, "f.txt", p, sizeof p);
    assert_int_equal(kvs_test_spit_text(p, "old content\n"), 0);
    assert_int_equal(chmod(p, 0640), 0);
    kvs_out *o = NULL;
    assert_int_equal(kvs_out_open(p, &o), KVS_OK);
    assert_int_equal(kvs_out_kind_of(o), KVS_OUT_FILE);
    assert_false(kvs_out_is_stdout(o));
    assert_string_equal(kvs_out_name(o), p);
    assert_int_equal(strncmp(kvs_out_write_path(o), p, strlen(p)), 0); /* the temporary file is beside it */
    assert_contains(kvs_out_write_path(o), ".tmp.");
    assert_int_equal(kvs_out_write(o, "new ", 4), KVS_OK);
    FILE *f = kvs_out_stream(o);
    assert_non_null(f);
    fprintf(f, "content\n");
    char *now = kvs_test_slurp(p, NULL); /* until the commit the target keeps its old content */
    assert_string_equal(now, "old content\n");
    free(now);
    assert_int_equal(kvs_out_commit(o), KVS_OK);
    now = kvs_test_slurp(p, NULL);
    assert_string_equal(now, "new content\n");
    free(now);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0640);
    assert_int_equal(count_names(c->dir, ".tmp."), 0);
    assert_int_equal(kvs_out_commit(NULL), KVS_OK);
    kvs_out_abort(NULL);
}

static void test_kvs_out_abort_leaves_the_old_content(void **state) {
    ctx *c = *state;
    char p[160], q[160];
    path_in(c, "keep.txt", p, sizeof p);
    assert_int_equal(kvs_test_spit_text(p, "precious\n"), 0);
    kvs_out *o = NULL;
    assert_int_equal(kvs_out_open(p, &o), KVS_OK);
    assert_int_equal(kvs_out_write(o, "half-writ", 9), KVS_OK);
    kvs_out_abort(o);
    char *now = kvs_test_slurp(p, NULL);
    assert_string_equal(now, "precious\n");
    free(now);
    assert_int_equal(count_names(c->dir, ".tmp."), 0);
    /* a new name that is abandoned is never created */
    path_in(c, "never.txt", q, sizeof q);
    assert_int_equal(kvs_out_open(q, &o), KVS_OK);
    kvs_out_abort(o);
    assert_int_equal(access(q, F_OK), -1);
    assert_int_equal(count_names(c->dir, ".tmp."), 0);
    /* a folder that does not exist: a clear error naming the path, nothing created */
    assert_int_equal(kvs_out_open("/nonexistent-kvsim-dir/x.npy", &o), KVS_ERR_IO);
    assert_null(o);
    assert_contains(kvs_last_error(), "/nonexistent-kvsim-dir/x.npy");
}

static void test_kvs_out_follows_relative_and_dangling_links(void **state) {
    ctx *c = *state;
    char sub[160], a[160], b[200], target[200];
    path_in(c, "sub", sub, sizeof sub);
    assert_int_equal(mkdir(sub, 0755), 0);
    path_in(c, "a", a, sizeof a);
    snprintf(b, sizeof b, "%s/b", sub);
    snprintf(target, sizeof target, "%s/final.dat", sub);
    assert_int_equal(symlink("sub/b", a), 0);       /* relative to a's folder */
    assert_int_equal(symlink("final.dat", b), 0);   /* relative to b's folder (sub/), dangling */
    kvs_out_kind kind;
    char *t = NULL;
    assert_int_equal(kvs_out_resolve(a, &kind, &t), KVS_OK);
    assert_int_equal(kind, KVS_OUT_FILE);
    assert_string_equal(t, target);
    free(t);
    kvs_out *o = NULL;
    assert_int_equal(kvs_out_open(a, &o), KVS_OK);
    assert_int_equal(kvs_out_write(o, "through", 7), KVS_OK);
    assert_int_equal(kvs_out_commit(o), KVS_OK);
    assert_true(is_link(a));
    assert_true(is_link(b));
    char *now = kvs_test_slurp(target, NULL);
    assert_string_equal(now, "through");
    free(now);
    now = kvs_test_slurp(a, NULL);
    assert_string_equal(now, "through");
    free(now);
    /* a link loop and a folder are errors */
    char l1[160], l2[160];
    path_in(c, "loop1", l1, sizeof l1);
    path_in(c, "loop2", l2, sizeof l2);
    assert_int_equal(symlink("loop2", l1), 0);
    assert_int_equal(symlink("loop1", l2), 0);
    assert_int_equal(kvs_out_open(l1, &o), KVS_ERR_IO);
    assert_contains(kvs_last_error(), "symbolic links");
    assert_int_equal(kvs_out_open(sub, &o), KVS_ERR_IO);
    assert_contains(kvs_last_error(), "is a directory");
}

static void test_kvs_out_special_files_and_stdout(void **state) {
    (void)state;
    kvs_out_kind kind;
    char *t = NULL;
    assert_int_equal(kvs_out_resolve("-", &kind, &t), KVS_OK);
    assert_int_equal(kind, KVS_OUT_FD);
    free(t);
    assert_true(kvs_out_path_is_stdout("-"));
    assert_true(kvs_out_path_is_stdout("/dev/stdout"));
    assert_true(kvs_out_path_is_stdout("/dev/fd/1"));
    assert_true(kvs_out_path_is_stdout("/proc/self/fd/1"));
    assert_false(kvs_out_path_is_stdout("/dev/stderr"));
    assert_false(kvs_out_path_is_stdout("/dev/null"));
    assert_int_equal(kvs_out_resolve("/dev/null", &kind, NULL), KVS_OK);
    assert_int_equal(kind, KVS_OUT_DIRECT);
    kvs_out *o = NULL;
    assert_int_equal(kvs_out_open("/dev/null", &o), KVS_OK); /* written in place: no temporary, no rename */
    assert_string_equal(kvs_out_write_path(o), "/dev/null");
    assert_int_equal(kvs_out_write(o, "x", 1), KVS_OK);
    assert_int_equal(kvs_out_commit(o), KVS_OK);
    struct stat st;
    assert_int_equal(stat("/dev/null", &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    /* a write error of a device is reported at the write */
    if (access("/dev/full", W_OK) == 0) {
        assert_int_equal(kvs_out_open("/dev/full", &o), KVS_OK);
        assert_int_equal(kvs_out_write(o, "x", 1), KVS_ERR_IO);
        assert_contains(kvs_last_error(), "/dev/full");
        kvs_out_abort(o);
    }
}

/* ------------------------------------------------------------------------------------------------
 * --out through the binary
 * ---------------------------------------------------------------------------------------------- */

static void test_export_out_writes_through_a_symlink(void **state) {
    ctx *c = *state;
    char link[160], target[160];
    path_in(c, "link.npy", link, sizeof link);
    path_in(c, "target.npy", target, sizeof target);
    assert_int_equal(kvs_test_spit_text(target, "old"), 0);
    assert_int_equal(symlink("target.npy", link), 0);
    int rc = run(c, "export", c->trace, "--what", "tokens", "--out", link);
    if (rc != 0) fail_msg("exit %d: %s", rc, c->err);
    assert_true(is_link(link)); /* the link stays a link ... */
    size_t len = 0;
    char *buf = kvs_test_slurp(target, &len); /* ... and its target holds the array */
    assert_non_null(buf);
    assert_tokens_npy(buf, len);
    free(buf);
    assert_int_equal(count_names(c->dir, ".tmp."), 0);
    assert_int_equal(count_names(c->dir, ".partial"), 0);
    /* a dangling link: its target is created */
    char dl[160], dt[160];
    path_in(c, "dangling.npy", dl, sizeof dl);
    path_in(c, "created.npy", dt, sizeof dt);
    assert_int_equal(symlink("created.npy", dl), 0);
    assert_int_equal(run(c, "export", c->trace, "--what", "tokens", "--out", dl), 0);
    assert_true(is_link(dl));
    buf = kvs_test_slurp(dt, &len);
    assert_non_null(buf);
    assert_tokens_npy(buf, len);
    free(buf);
}

static void test_out_dash_and_links_to_stdout_write_standard_output(void **state) {
    ctx *c = *state;
    char got[160], link[160];
    path_in(c, "got.npy", got, sizeof got);
    /* "-": the array on stdout, the "wrote" line on stderr */
    assert_int_equal(run_to(c, got, 0, "export", c->trace, "--what", "tokens", "--out", "-", NULL), 0);
    assert_contains(c->err, "wrote standard output: tokens int32 [20]");
    size_t len = 0;
    char *buf = kvs_test_slurp(got, &len);
    assert_tokens_npy(buf, len);
    free(buf);
    /* a link to /dev/fd/1 (as /dev/stdout is, through /proc/self/fd/1): written to the descriptor, in
     * append mode when the shell opened it so, never replaced by a regular file */
    path_in(c, "to_stdout", link, sizeof link);
    assert_int_equal(symlink("/dev/fd/1", link), 0);
    assert_int_equal(unlink(got), 0);
    for (int i = 0; i < 2; i++) {
        int rc = run_to(c, got, 1, "export", c->trace, "--what", "tokens", "--out", link, NULL);
        if (rc != 0) fail_msg("exit %d: %s", rc, c->err);
    }
    assert_true(is_link(link));
    buf = kvs_test_slurp(got, &len);
    assert_non_null(buf);
    assert_int_equal(len % 2, 0);
    assert_tokens_npy(buf, len / 2); /* two whole arrays, one after the other */
    assert_memory_equal(buf, buf + len / 2, len / 2);
    free(buf);
    /* trace recover to -: the trace on stdout, the report on stderr */
    char rec[160];
    path_in(c, "rec.kvt", rec, sizeof rec);
    assert_int_equal(run_to(c, rec, 0, "trace", "recover", c->trace, "-", NULL), 0);
    assert_contains(c->err, "recovered 20 positions");
    assert_int_equal(run(c, "info", rec), 0);
    assert_contains(c->out, "positions    20");
}

static void test_out_fifo_is_written_in_place(void **state) {
    ctx *c = *state;
    char fifo[160], got[160], cmd[1024];
    path_in(c, "fifo", fifo, sizeof fifo);
    path_in(c, "from_fifo.npy", got, sizeof got);
    assert_int_equal(mkfifo(fifo, 0644), 0);
    snprintf(cmd, sizeof cmd, "timeout 20 cat '%s' > '%s' & '%s' export '%s' --what tokens --out '%s' >/dev/null; rc=$?; "
             "wait; exit $rc", fifo, got, kvsim_bin(), c->trace, fifo);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    struct stat sb;
    assert_int_equal(lstat(fifo, &sb), 0);
    assert_true(S_ISFIFO(sb.st_mode)); /* still a FIFO, not replaced by a regular file */
    size_t len = 0;
    char *buf = kvs_test_slurp(got, &len);
    assert_non_null(buf);
    assert_tokens_npy(buf, len);
    free(buf);
}

/* ------------------------------------------------------------------------------------------------
 * write errors on standard output
 * ---------------------------------------------------------------------------------------------- */

static void test_stdout_write_errors_exit_1(void **state) {
    ctx *c = *state;
    if (access("/dev/full", W_OK) != 0) {
        print_message("no writable /dev/full: skipping\n");
        skip();
    }
    char x[160], rec[160];
    path_in(c, "x.npy", x, sizeof x);
    path_in(c, "rec.kvt", rec, sizeof rec);
    char db[160];
    path_in(c, "r.db", db, sizeof db);
    assert_int_equal(run(c, "replay", c->trace, "--db", db, "--policy", "window", "--budgets", "4,8"), 0);
    struct {
        const char *name;
        int rc;
    } got[12];
    got[0].name = "info", got[0].rc = run_to(c, "/dev/full", 0, "info", c->trace, NULL);
    got[1].name = "verify", got[1].rc = run_to(c, "/dev/full", 0, "verify", c->trace, NULL);
    got[2].name = "export --out -", got[2].rc = run_to(c, "/dev/full", 0, "export", c->trace, "--what", "tokens", "--out", "-", NULL);
    got[3].name = "export --out F", got[3].rc = run_to(c, "/dev/full", 0, "export", c->trace, "--what", "tokens", "--out", x, NULL);
    got[4].name = "trace recover", got[4].rc = run_to(c, "/dev/full", 0, "trace", "recover", c->trace, rec, NULL);
    got[5].name = "help", got[5].rc = run_to(c, "/dev/full", 0, "capture", "--help", NULL);
    got[6].name = "runs", got[6].rc = run_to(c, "/dev/full", 0, "runs", db, NULL);
    got[7].name = "runs --csv", got[7].rc = run_to(c, "/dev/full", 0, "runs", db, "--csv", NULL);
    got[8].name = "runs --json", got[8].rc = run_to(c, "/dev/full", 0, "runs", db, "--json", NULL);
    got[9].name = "compare", got[9].rc = run_to(c, "/dev/full", 0, "compare", db, "--match", "tokens", "--at", "6", NULL);
    got[10].name = "policies", got[10].rc = run_to(c, "/dev/full", 0, "policies", NULL);
    got[11].name = "replay", got[11].rc = run_to(c, "/dev/full", 0, "replay", c->trace, "--db", db, "--policy", "tova",
                                                 "--budgets", "4", NULL);
    for (int i = 0; i < 12; i++) {
        if (got[i].rc != 1) fail_msg("%s > /dev/full: exit %d (expected 1)", got[i].name, got[i].rc);
    }
    /* the last one's message */
    assert_contains(c->err, "failed: No space left on device");
}

/* ------------------------------------------------------------------------------------------------
 * options given twice, messages, limits
 * ---------------------------------------------------------------------------------------------- */

static void test_single_valued_options_given_twice_are_usage_errors(void **state) {
    ctx *c = *state;
    const char *t = c->trace;
    char x[160];
    path_in(c, "x.npy", x, sizeof x);
    assert_usage(c, "--what given twice", "export", t, "--what", "q", "--what", "k", "--layer", "0", "--out", x);
    assert_usage(c, "--layer given twice", "export", t, "--what", "q", "--layer", "0", "--layer=1", "--out", x);
    assert_usage(c, "--out given twice", "export", t, "--what", "tokens", "--out", x, "--out", x);
    assert_int_equal(access(x, F_OK), -1);
    assert_usage(c, "--threads given twice", "verify", t, "--threads", "1", "--threads", "2");
    assert_usage(c, "--tolerance given twice", "verify", t, "--tolerance", "1", "--tolerance", "2");
    /* capture checks its options before it loads anything */
    const char *m = "/nonexistent/model.bin";
    assert_usage(c, "--prompt given twice", "capture", "--model", m, "--no-trace", "--prompt", "a", "--prompt", "b");
    assert_usage(c, "--steps given twice", "capture", "--model", m, "--no-trace", "--steps", "3", "--steps=4");
    assert_usage(c, "--model given twice", "capture", "--model", m, "--model", m, "--no-trace");
    assert_usage(c, "--out given twice", "capture", "--model", m, "--out", x, "--out", x);
    assert_usage(c, "--seed given twice", "capture", "--model", m, "--no-trace", "--seed", "1", "--seed", "1");
    assert_usage(c, "--no-bos given twice", "capture", "--model", m, "--no-trace", "--no-bos", "--no-bos");
    assert_usage(c, "--progress/--quiet given twice", "capture", "--model", m, "--no-trace", "--quiet", "--progress");
    assert_usage(c, "--truncate given twice", "capture", "--model", m, "--no-trace", "--truncate", "left",
                 "--truncate", "right");
    /* replay and the readers of its database */
    char db[160];
    path_in(c, "r.db", db, sizeof db);
    assert_usage(c, "--measure given twice", "replay", t, "--db", db, "--policy", "window", "--budgets", "4",
                 "--measure", "all", "--measure", "decode");
    assert_usage(c, "--db given twice", "replay", t, "--db", db, "--db", db, "--policy", "window", "--budgets", "4");
    assert_int_equal(access(db, F_OK), -1);
    assert_int_equal(run(c, "replay", t, "--db", db, "--policy", "window", "--budgets", "4,8"), 0);
    assert_usage(c, "--policy given twice", "runs", db, "--policy", "window", "--policy", "tova");
    assert_usage(c, "--budget given twice", "runs", db, "--budget", "4", "--budget=8");
    assert_usage(c, "--measure given twice", "runs", db, "--measure", "decode", "--measure", "all");
    assert_usage(c, "--csv given twice", "runs", db, "--csv", "--csv");
    assert_usage(c, "--at given twice", "compare", db, "--match", "tokens", "--at", "4", "--at", "8");
    assert_usage(c, "--match given twice", "compare", db, "--match", "tokens", "--match", "mem", "--at", "4");
    assert_usage(c, "--trace given twice", "compare", db, "--match", "tokens", "--at", "4", "--trace", "a", "--trace",
                 "b");
    char png[160];
    path_in(c, "p.png", png, sizeof png);
    assert_usage(c, "--out given twice", "plot", db, "--kind", "error-vs-budget", "--out", png, "--out", png);
    assert_usage(c, "--kind given twice", "plot", db, "--kind=error-vs-budget", "--kind", "error-vs-memory", "--out", png);
    assert_usage(c, "--policy given twice", "plot", db, "--kind", "error-vs-budget", "--out", png, "--policy", "window",
                 "--policy", "window");
    assert_int_equal(access(png, F_OK), -1);
    /* the rule is in the help */
    assert_int_equal(run(c, "capture", "--help"), 0);
    assert_contains(c->out, "each may be given once");
    assert_int_equal(run(c, "export", "--help"), 0);
    assert_contains(c->out, "Each option may be given once");
}

static void test_range_messages_echo_the_value_and_exact_bounds(void **state) {
    ctx *c = *state;
    const char *m = "/nonexistent/model.bin";
    /* an integer too large for a long: echoed as typed (never 9223372036854775807), called out of range */
    assert_usage(c, "--steps: '99999999999999999999' is out of range [0, 16777216]", "capture", "--model", m,
                 "--no-trace", "--steps", "99999999999999999999");
    assert_usage(c, "--block: '70000' is out of range [1, 65536]", "capture", "--model", m, "--no-trace", "--block",
                 "70000");
    /* a number just over its bound: the user's text, not "%g" of it (100.00000000001 printed as 100) */
    assert_usage(c, "--temperature: '100.00000000001' is out of range [0, 100]", "capture", "--model", m,
                 "--no-trace", "--temperature", "100.00000000001");
    /* --top-p: one message, with its open bound, for every bad value */
    assert_usage(c, "--top-p: '0' is out of range (0, 1]", "capture", "--model", m, "--no-trace", "--top-p", "0");
    assert_usage(c, "--top-p: '1.5' is out of range (0, 1]", "capture", "--model", m, "--no-trace", "--top-p", "1.5");
    assert_usage(c, "--top-p: 'x' is not a number", "capture", "--model", m, "--no-trace", "--top-p", "x");
    assert_usage(c, "--tolerance: '1e999' is out of range [0, 1e+30]", "verify", c->trace, "--tolerance", "1e999");
    /* one thread limit (cli.h KVS_CLI_MAX_THREADS) in every command */
    assert_usage(c, "--threads: '1025' is out of range [1, 1024]", "verify", c->trace, "--threads", "1025");
    assert_usage(c, "--threads: '1025' is out of range [1, 1024]", "capture", "--model", m, "--no-trace",
                 "--threads", "1025");
    assert_usage(c, "--threads: '1025' is out of range [1, 1024]", "replay", c->trace, "--db", "x.db", "--policy",
                 "window", "--budgets", "4", "--threads", "1025");
    assert_int_equal(run(c, "verify", c->trace, "--threads", "1024"), 0);
}

static void test_help_describes_runs_rows(void **state) {
    ctx *c = *state;
    assert_int_equal(run(c, "help"), 0);
    assert_contains(c->out, "one row per run (--csv: one row per run and layer");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kvs_out_replaces_atomically_keeping_the_mode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kvs_out_abort_leaves_the_old_content, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kvs_out_follows_relative_and_dangling_links, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kvs_out_special_files_and_stdout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_out_writes_through_a_symlink, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_dash_and_links_to_stdout_write_standard_output, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_fifo_is_written_in_place, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stdout_write_errors_exit_1, setup, teardown),
        cmocka_unit_test_setup_teardown(test_single_valued_options_given_twice_are_usage_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_range_messages_echo_the_value_and_exact_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_help_describes_runs_rows, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
