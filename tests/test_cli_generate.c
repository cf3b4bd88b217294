/* test_cli_generate.c — `kvsim generate` and `kvsim calibrate` end to end on the real stories260K model (skipped
 * when ../shared/models is absent, or when KVSIM_BIN is unset): a teacher-forced sweep on the bundled trace paired
 * with a replay of it, calibrate's table and correlations, `full` recorded with KL 0, free-running runs, and bad
 * usage / bad files (exit codes 2 and 1, nothing written).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/cli_run.h"
#include "tests/util/testenv.h"

#include "common/kvs.h"
#include "common/sha256.h"
#include "results/results_closed.h"

static char model[4096], trace[4096], story[4096], dir[64], db[128], out[128], err[128];

static int need(void) {
    if (!kvs_test_kvsim_bin()) {
        fprintf(stderr, "SKIP: KVSIM_BIN unset\n");
        return 0;
    }
    snprintf(model, sizeof model, "%s/../shared/models/stories260K.bin", kvs_test_root());
    if (!kvs_test_exists(model)) {
        fprintf(stderr, "SKIP: %s absent (shared real models not installed)\n", model);
        return 0;
    }
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    snprintf(story, sizeof story, "%s/examples/heldout_story.txt", kvs_test_root());
    snprintf(dir, sizeof dir, "/tmp/kvsim_cli_gen_XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/r.db", dir);
    snprintf(out, sizeof out, "%s/out.txt", dir);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    return 1;
}

static void cleanup_dir(void) {
    unlink(db);
    char p[160];
    snprintf(p, sizeof p, "%s-wal", db);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", db);
    unlink(p);
    snprintf(p, sizeof p, "%s/cal.png", dir);
    unlink(p);
    unlink(out);
    unlink(err);
    rmdir(dir);
}


static void test_generate_and_calibrate_on_the_bundled_trace(void **state) {
    (void)state;
    if (!need()) skip();
    const char *rep[] = {"replay", trace, "--db", db, "--policy", "window", "--policy", "tova", "--policy", "full",
                         "--budgets", "8,32", NULL};
    assert_int_equal(kvs_test_cli(out, err, rep), 0);
    const char *gen[] = {"generate", "--model", model, "--trace", trace, "--db", db, "--policy", "window", "--policy",
                         "tova", "--policy", "full", "--budgets", "8,32", NULL};
    assert_int_equal(kvs_test_cli(out, err, gen), 0);
    kvs_results_db *h = NULL;
    assert_int_equal(kvs_results_open_readonly(db, &h), KVS_OK);
    kvs_results_closed_row *rows = NULL;
    int64_t n = 0;
    assert_int_equal(kvs_results_closed_query(h, &rows, &n), KVS_OK);
    assert_int_equal(n, 6);
    for (int64_t i = 0; i < n; i++) {
        assert_true(rows[i].trace_id > 0);
        assert_string_equal(rows[i].mode, "teacher");
        if (!strcmp(rows[i].policy, "full")) {
            assert_true(rows[i].kl_mean == 0.0);
            assert_true(rows[i].top1_agree == 1.0);
            assert_true(rows[i].ppl_policy == rows[i].ppl_full);
        } else {
            assert_true(rows[i].kl_mean > 0.0);
        }
    }
    /* a smaller window hurts more in closed loop */
    assert_true(rows[0].kl_mean > rows[1].kl_mean);
    kvs_results_closed_rows_free(rows, n);
    kvs_results_close(h);
    char png[160];
    snprintf(png, sizeof png, "%s/cal.png", dir);
    const char *cal[] = {"calibrate", db, "--bootstrap", "200", "--plot", png, NULL};
    assert_int_equal(kvs_test_cli(out, err, cal), 0);
    char *text = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(text, "6 (policy, budget) pairs"));
    assert_non_null(strstr(text, "Spearman rho"));
    assert_non_null(strstr(text, "kl_mean"));
    assert_null(strstr(text, "nan"));
    free(text);
    assert_true(kvs_test_exists(png));
    /* only `full`: every error, recall and KL is the same at each budget, so no correlation is defined; said in
     * words, never as nan */
    char db2[160];
    snprintf(db2, sizeof db2, "%s/full.db", dir);
    const char *rep2[] = {"replay", trace, "--db", db2, "--policy", "full", "--budgets", "8,16,32", NULL};
    assert_int_equal(kvs_test_cli(out, err, rep2), 0);
    const char *gen2[] = {"generate", "--model", model, "--trace", trace, "--db", db2, "--policy", "full",
                          "--budgets", "8,16,32", NULL};
    assert_int_equal(kvs_test_cli(out, err, gen2), 0);
    const char *cal2[] = {"calibrate", db2, "--bootstrap", "50", NULL};
    assert_int_equal(kvs_test_cli(out, err, cal2), 0);
    text = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(text, "3 (policy, budget) pairs"));
    assert_non_null(strstr(text, "undefined (constant)"));
    assert_non_null(strstr(text, "no ranking to correlate"));
    assert_null(strstr(text, "nan"));
    free(text);
    /* no bootstrap: rho alone, no empty interval */
    const char *cal3[] = {"calibrate", db, "--bootstrap", "0", NULL};
    assert_int_equal(kvs_test_cli(out, err, cal3), 0);
    text = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(text, "no interval)"));
    assert_null(strstr(text, "nan"));
    assert_null(strstr(text, "["));
    free(text);
    cleanup_dir();
}

/* The 64 hex digits of the SHA-256 of the file at `path`, by sha256sum when it is installed (a computation that
 * shares nothing with kvsim's), else by common/sha256.h over the file's bytes. */
static void file_sha256(const char *path, char hex[65]) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "sha256sum '%s' 2>/dev/null", path);
    FILE *p = popen(cmd, "r");
    int got = p && fscanf(p, "%64s", hex) == 1 && strlen(hex) == 64;
    if (p) pclose(p);
    if (got) return;
    size_t n = 0;
    void *data = kvs_test_slurp(path, &n);
    assert_non_null(data);
    kvs_sha256_hex(data, n, hex);
    free(data);
}

/* A trace is its content: generate through another path to the bundled trace (a symbolic link with another
 * name) records the file's hash and pairs with the replays made through its usual path; a different file with
 * the same base name pairs with nothing. */
static void test_calibrate_pairs_one_trace_through_two_paths(void **state) {
    (void)state;
    if (!need()) skip();
    char link[160], other_dir[160], other[192], sha[65];
    snprintf(link, sizeof link, "%s/renamed.kvt", dir);
    assert_int_equal(symlink(trace, link), 0);
    file_sha256(trace, sha);
    const char *rep[] = {"replay", trace, "--db", db, "--policy", "window", "--policy", "tova", "--budgets", "8,32",
                         NULL};
    assert_int_equal(kvs_test_cli(out, err, rep), 0);
    const char *gen[] = {"generate", "--model", model, "--trace", link, "--db", db, "--policy", "window", "--policy",
                         "tova", "--budgets", "8,32", NULL};
    assert_int_equal(kvs_test_cli(out, err, gen), 0);
    kvs_results_db *h = NULL;
    assert_int_equal(kvs_results_open_readonly(db, &h), KVS_OK);
    kvs_results_closed_row *rows = NULL;
    int64_t n = 0;
    assert_int_equal(kvs_results_closed_query(h, &rows, &n), KVS_OK);
    assert_int_equal(n, 4);
    for (int64_t i = 0; i < n; i++) {
        assert_non_null(rows[i].trace_sha256);
        assert_string_equal(rows[i].trace_sha256, sha);
        assert_string_equal(rows[i].source, link);
    }
    kvs_results_closed_rows_free(rows, n);
    kvs_results_close(h);
    const char *cal[] = {"calibrate", db, "--bootstrap", "0", NULL};
    assert_int_equal(kvs_test_cli(out, err, cal), 0);
    char *text = kvs_test_slurp(out, NULL), label[64];
    snprintf(label, sizeof label, "trace stories260K@%.8s (", sha);
    assert_non_null(strstr(text, label));
    assert_non_null(strstr(text, ": 4 (policy, budget) pairs"));
    /* another file named stories260K.kvt (the multi-turn trace) replayed after: its runs pair with nothing, so
     * calibrate's output does not change */
    snprintf(other_dir, sizeof other_dir, "%s/other", dir);
    assert_int_equal(mkdir(other_dir, 0755), 0);
    snprintf(other, sizeof other, "%s/stories260K.kvt", other_dir);
    char multi[4200];
    snprintf(multi, sizeof multi, "%s/examples/stories260K_multiturn.kvt", kvs_test_root());
    assert_int_equal(symlink(multi, other), 0);
    const char *rep2[] = {"replay", other, "--db", db, "--policy", "window", "--policy", "tova", "--budgets", "8,32",
                          NULL};
    assert_int_equal(kvs_test_cli(out, err, rep2), 0);
    assert_int_equal(kvs_test_cli(out, err, cal), 0);
    char *again = kvs_test_slurp(out, NULL);
    assert_string_equal(again, text);
    free(again);
    free(text);
    unlink(other);
    rmdir(other_dir);
    unlink(link);
    cleanup_dir();
}

static void test_free_running_and_text_modes(void **state) {
    (void)state;
    if (!need()) skip();
    const char *fr[] = {"generate", "--model", model, "--prompt", "Once upon a time", "--steps", "24", "--ignore-eos",
                        "--db", db, "--policy", "window", "--budgets", "4,28", NULL};
    assert_int_equal(kvs_test_cli(out, err, fr), 0);
    char *text = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(text, "diverge"));
    free(text);
    const char *tf[] = {"generate", "--model", model, "--text", story, "--prompt-tokens", "16", "--db", db,
                        "--policy", "h2o", "--budgets", "8", NULL};
    assert_int_equal(kvs_test_cli(out, err, tf), 0);
    kvs_results_db *h = NULL;
    assert_int_equal(kvs_results_open_readonly(db, &h), KVS_OK);
    kvs_results_closed_row *rows = NULL;
    int64_t n = 0;
    assert_int_equal(kvs_results_closed_query(h, &rows, &n), KVS_OK);
    assert_int_equal(n, 3);
    assert_string_equal(rows[0].mode, "free");
    assert_true(rows[0].first_divergence > 0); /* a 4-token window leaves the full model's text */
    assert_true(rows[1].first_divergence == -1 && rows[1].token_agreement == 1.0); /* 28 >= every position */
    assert_string_equal(rows[2].mode, "teacher");
    assert_true(rows[2].ppl_full > 1.0 && rows[2].ppl_policy > rows[2].ppl_full);
    kvs_results_closed_rows_free(rows, n);
    kvs_results_close(h);
    /* calibrate has nothing to pair here: a clear failure */
    const char *cal[] = {"calibrate", db, NULL};
    assert_int_equal(kvs_test_cli(out, err, cal), 1);
    text = kvs_test_slurp(err, NULL);
    assert_non_null(strstr(text, "no (policy, budget) has both"));
    free(text);
    cleanup_dir();
}

static void test_bad_usage_and_files(void **state) {
    (void)state;
    if (!need()) skip();
    const char *no_src[] = {"generate", "--model", model, "--db", db, "--policy", "window", "--budgets", "8", NULL};
    assert_int_equal(kvs_test_cli(out, err, no_src), 2);
    const char *oracle[] = {"generate", "--model", model, "--trace", trace, "--db", db, "--policy", "topk",
                            "--budgets", "8", NULL};
    assert_int_equal(kvs_test_cli(out, err, oracle), 2);
    char *text = kvs_test_slurp(err, NULL);
    assert_non_null(strstr(text, "oracle"));
    free(text);
    const char *bad_model[] = {"generate", "--model", story, "--trace", trace, "--db", db, "--policy", "window",
                               "--budgets", "8", NULL};
    assert_int_equal(kvs_test_cli(out, err, bad_model), 1);
    assert_false(kvs_test_exists(db)); /* nothing written */
    const char *no_db[] = {"calibrate", db, NULL};
    assert_int_equal(kvs_test_cli(out, err, no_db), 1);
    const char *twice[] = {"calibrate", db, "--seed", "1", "--seed", "2", NULL};
    assert_int_equal(kvs_test_cli(out, err, twice), 2);
    /* The plot's name is checked before any work (PNG or SVG, as kvsim plot decides it). */
    const char *bad_plot[] = {"calibrate", db, "--plot", "scatter.txt", NULL};
    assert_int_equal(kvs_test_cli(out, err, bad_plot), 2);
    text = kvs_test_slurp(err, NULL);
    assert_non_null(strstr(text, "--plot: 'scatter.txt' must end in .png or .svg"));
    free(text);
    cleanup_dir();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_and_calibrate_on_the_bundled_trace),
        cmocka_unit_test(test_calibrate_pairs_one_trace_through_two_paths),
        cmocka_unit_test(test_free_running_and_text_modes),
        cmocka_unit_test(test_bad_usage_and_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
