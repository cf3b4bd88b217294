/* test_cli_generate.c — `kvsim generate` and `kvsim calibrate` end to end on the real stories260K model (skipped
 * when ../shared/models is absent, or when KVSIM_BIN is unset): a teacher-forced sweep on the bundled trace paired
 * with a replay of it, calibrate's table and correlations, `full` recorded with KL 0, free-running runs, bad
 * usage / bad files (exit codes 2 and 1, nothing written), and --task: the full model's answers against the plain
 * model's greedy continuations, accuracy and counts recomputed from the per-item rows and from the printed table, the
 * intervals' seed and bounds, a budget covering every context scoring exactly as the full model, failed runs and
 * bad task input.
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

#include <math.h>

#include "common/kvs.h"
#include "common/kvs_stats.h"
#include "common/sha256.h"
#include "gpu_capture/model.h"
#include "gpu_capture/tokenizer.h"
#include "results/results_closed.h"
#include "sim/closed_loop.h"

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

/* --codec: each (policy, codec, budget) one closed-loop run with its codec recorded (NULL for none), the codec's run
 * differs from the 16-bit one; calibrate pairs each closed-loop run with the replay of the same codec at token
 * granularity: the 2-bit window with the 2-bit replay (its memory bin, 256 B to 512 B per KV head: 32 positions at
 * 2 bits plus scales), the 16-bit window with the 16-bit replay (1 KiB), never with the paged replay (1.5 KiB) made
 * after them. A bad codec spec: exit 1, nothing written. */
static void test_generate_with_codecs_pairs_by_codec(void **state) {
    (void)state;
    if (!need()) skip();
    const char *rep[] = {"replay", trace, "--db", db, "--policy", "window", "--codec", "none", "--codec",
                         "int:bits=2,group=8", "--budgets", "32", NULL};
    assert_int_equal(kvs_test_cli(out, err, rep), 0);
    const char *rep_page[] = {"replay", trace, "--db", db, "--policy", "window", "--page", "16", "--budgets", "32", NULL};
    assert_int_equal(kvs_test_cli(out, err, rep_page), 0);
    const char *gen[] = {"generate", "--model", model, "--trace", trace, "--db", db, "--policy", "window", "--codec",
                         "none", "--codec", "int:bits=2,group=8", "--codec", "none", "--budgets", "32", NULL};
    assert_int_equal(kvs_test_cli(out, err, gen), 0);
    char *text = kvs_test_slurp(err, NULL);
    assert_non_null(strstr(text, "--codec none given more than once: run once"));
    free(text);
    text = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(text, "window [int:bits=2,group=8,k_axis=token,v_axis=channel]"));
    free(text);
    kvs_results_db *h = NULL;
    assert_int_equal(kvs_results_open_readonly(db, &h), KVS_OK);
    kvs_results_closed_row *rows = NULL;
    int64_t n = 0;
    assert_int_equal(kvs_results_closed_query(h, &rows, &n), KVS_OK);
    assert_int_equal(n, 2);
    assert_null(rows[0].codec);
    assert_non_null(rows[1].codec);
    assert_string_equal(rows[1].codec, "int:bits=2,group=8,k_axis=token,v_axis=channel");
    assert_true(rows[1].kl_mean != rows[0].kl_mean && rows[1].out_err_mean > rows[0].out_err_mean);
    kvs_results_closed_rows_free(rows, n);
    kvs_results_close(h);
    const char *cal[] = {"calibrate", db, "--bootstrap", "0", NULL};
    assert_int_equal(kvs_test_cli(out, err, cal), 0);
    text = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(text, "2 (policy, budget) pairs, 2 distinct"));
    assert_non_null(strstr(text, "memory 256B to <512B: 1 pairs"));
    assert_non_null(strstr(text, "memory 1KiB to <2KiB: 1 pairs"));
    free(text);
    const char *bad[] = {"generate", "--model", model, "--trace", trace, "--db", db, "--policy", "window", "--codec",
                         "int:bits=5", "--budgets", "32", NULL};
    assert_int_equal(kvs_test_cli(out, err, bad), 1);
    text = kvs_test_slurp(err, NULL);
    assert_non_null(strstr(text, "bits=5"));
    free(text);
    assert_int_equal(kvs_results_open_readonly(db, &h), KVS_OK);
    assert_int_equal(kvs_results_closed_query(h, &rows, &n), KVS_OK);
    assert_int_equal(n, 2);
    kvs_results_closed_rows_free(rows, n);
    kvs_results_close(h);
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

/* ---- --task ---- */

/* The task's items scored by the plain model (kvs_model_forward, no closed loop): greedy from each item's context for
 * the answer's tokens and two more, as generate does; correct[k] receives whether it matches. */
static void plain_model_scores(const char *task_path, int *correct, int64_t n) {
    char tokp[4200];
    snprintf(tokp, sizeof tokp, "%s/../shared/models/tok512.bin", kvs_test_root());
    kvs_model *m = NULL;
    kvs_tokenizer *tok = NULL;
    kvs_closed_loop_task *t = NULL;
    assert_int_equal(kvs_model_load(model, &m), KVS_OK);
    const int V = kvs_model_info_get(m)->config.vocab_size;
    assert_int_equal(kvs_tokenizer_load_llama2c(tokp, V, &tok), KVS_OK);
    assert_int_equal(kvs_closed_loop_task_load(task_path, &t), KVS_OK);
    assert_int_equal(t->n_items, n);
    for (int64_t k = 0; k < n; k++) {
        kvs_closed_loop_task_input in;
        assert_int_equal(kvs_closed_loop_task_tokenize(tok, &t->items[k], &in), KVS_OK);
        int64_t n_gen = in.n_tokens - in.n_context + 2;
        int32_t gen[64];
        assert_true(n_gen <= 64);
        kvs_model_state *ms = NULL;
        assert_int_equal(kvs_model_state_create(m, (int)(in.n_context + n_gen), NULL, &ms), KVS_OK);
        const float *lg = NULL;
        for (int64_t i = 0; i < in.n_context; i++) assert_int_equal(kvs_model_forward(ms, in.tokens[i], (int)i, &lg), KVS_OK);
        int64_t got = 0;
        for (; got < n_gen; got++) {
            int best = 0;
            for (int v = 1; v < V; v++)
                if (lg[v] > lg[best]) best = v;
            gen[got] = best;
            if (kvs_model_is_eos(m, best)) {
                got++;
                break;
            }
            if (got + 1 < n_gen) assert_int_equal(kvs_model_forward(ms, best, (int)(in.n_context + got), &lg), KVS_OK);
        }
        char *text = NULL;
        assert_int_equal(kvs_closed_loop_task_continuation(tok, &in, gen, got, &text), KVS_OK);
        correct[k] = kvs_closed_loop_task_match(text, in.expected);
        free(text);
        kvs_model_state_free(ms);
        kvs_closed_loop_task_input_clear(&in);
    }
    kvs_closed_loop_task_free(t);
    kvs_tokenizer_free(tok);
    kvs_model_free(m);
}

static uint64_t fnv(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* The documented seed: FNV-1a of "task|<sha256>|<model>|<prompt tokens>|<series>". */
static uint64_t documented_seed(const char *sha, const char *prompt_tokens, const char *series) {
    char id[512];
    snprintf(id, sizeof id, "task|%s|stories260K|%s|%s", sha, prompt_tokens, series);
    return fnv(14695981039346656037ULL, id);
}

/* The line of `text` that starts with `prefix` (NULL when none), as a copy up to its newline. */
static char *line_of(const char *text, const char *prefix, char *buf, size_t cap) {
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, prefix, strlen(prefix))) {
            size_t n = strcspn(p, "\n");
            snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), p);
            return buf;
        }
    return NULL;
}

static void test_task_accuracy_per_policy_and_budget(void **state) {
    (void)state;
    if (!need()) skip();
    char task[4200], sha[65];
    snprintf(task, sizeof task, "%s/examples/tasks/name_recall.txt", kvs_test_root());
    /* under the sanitizers (each closed loop some fifty times slower) the task's first 8 items, a file of their own:
     * the same checks on fewer items */
    const int64_t N = kvs_test_sanitized() ? 8 : 32;
    char part[160] = "";
    if (N < 32) {
        snprintf(part, sizeof part, "%s/name_recall_8.txt", dir);
        FILE *in = fopen(task, "r"), *o = fopen(part, "w");
        assert_non_null(in);
        assert_non_null(o);
        char line[4096];
        for (int k = 0; k < 6 + 8 && fgets(line, sizeof line, in); k++) fputs(line, o);
        fclose(in);
        assert_int_equal(fclose(o), 0);
        snprintf(task, sizeof task, "%s", part);
    }
    file_sha256(task, sha);
    /* budget 512: more than any item's positions, so the window attends to everything */
    const char *gen[] = {"generate", "--model", model, "--task", task, "--db", db, "--policy", "window", "--budgets",
                         "8,512", NULL};
    assert_int_equal(kvs_test_cli(out, err, gen), 0);
    char *text = kvs_test_slurp(out, NULL);
    kvs_results_db *h = NULL;
    assert_int_equal(kvs_results_open_readonly(db, &h), KVS_OK);
    kvs_results_closed_task_row *rows = NULL;
    int64_t n = 0;
    assert_int_equal(kvs_results_closed_task_query(h, &rows, &n), KVS_OK);
    assert_int_equal(n, 2);
    int plain[32];
    plain_model_scores(task, plain, N);
    int64_t n_plain = 0;
    for (int64_t k = 0; k < N; k++) n_plain += plain[k];
    /* the name is a real recall: the full model answers a good part, a window of 8 almost nothing */
    assert_true(n_plain >= N / 2);
    for (int64_t r = 0; r < n; r++) {
        const kvs_results_closed_task_row *t = &rows[r];
        assert_string_equal(t->task_sha256, sha);
        assert_string_equal(t->policy, "window");
        assert_int_equal(t->prompt_tokens, 0);
        assert_int_equal(t->n_items, N);
        int64_t pol = 0, full = 0;
        double x[32], y[32];
        for (int64_t k = 0; k < N; k++) {
            const kvs_results_closed_task_item_row *it = &t->items[k];
            assert_int_equal(it->item, k);
            assert_int_equal(it->line, k + 7); /* six lines of header and comments */
            /* the full model beside each policy is the plain model */
            assert_int_equal(it->full_correct, plain[k]);
            pol += it->policy_correct;
            full += it->full_correct;
            x[k] = it->policy_correct;
            y[k] = it->full_correct;
        }
        assert_int_equal(t->n_correct, pol);
        assert_int_equal(t->full_correct, full);
        assert_true(fabs(t->accuracy - (double)pol / (double)N) < 1e-12);
        assert_true(fabs(t->full_accuracy - (double)full / (double)N) < 1e-12);
        assert_true(fabs(t->diff - (t->accuracy - t->full_accuracy)) < 1e-12);
        /* intervals: ordered, inside [0, 1] ([-1, 1] for the difference), 95 %, 2000 resamples, and from the seed the
         * table documents */
        assert_true(0 <= t->acc_lo && t->acc_lo <= t->accuracy && t->accuracy <= t->acc_hi && t->acc_hi <= 1);
        assert_true(0 <= t->full_lo && t->full_lo <= t->full_accuracy && t->full_accuracy <= t->full_hi &&
                    t->full_hi <= 1);
        assert_true(-1 <= t->diff_lo && t->diff_lo <= t->diff && t->diff <= t->diff_hi && t->diff_hi <= 1);
        assert_true(t->level == 0.95);
        assert_int_equal(t->reps, KVS_BOOTSTRAP_REPS);
        char series[256], hex[17];
        snprintf(series, sizeof series, "window|%s|%lld", t->params, (long long)t->budget_tokens);
        uint64_t seed = documented_seed(sha, "0", series);
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)seed);
        assert_string_equal(t->seed, hex);
        kvs_interval iv, fv;
        assert_int_equal(kvs_bootstrap_mean(x, N, KVS_BOOTSTRAP_REPS, 0.95, seed, &iv), KVS_OK);
        assert_true(iv.lo == t->acc_lo && iv.hi == t->acc_hi);
        assert_int_equal(kvs_bootstrap_mean(y, N, KVS_BOOTSTRAP_REPS, 0.95, documented_seed(sha, "0", "full"), &fv),
                         KVS_OK);
        assert_true(fv.lo == t->full_lo && fv.hi == t->full_hi);
        /* a mean of 0/1 items away from 0 and 1: the width is that of the normal approximation, 2 x 1.96 x
         * sqrt(p (1 - p) / n), within a third */
        double p = t->full_accuracy, w = 2 * 1.96 * sqrt(p * (1 - p) / (double)N);
        if (p > 0.2 && p < 0.8) assert_true(fabs((t->full_hi - t->full_lo) - w) < w / 3);
        /* the printed rows are the database's */
        char want[160], buf[256];
        snprintf(want, sizeof want, "%-14s %6lld %3lld/%-3lld  %6.3f [%.3f, %.3f]  %+7.3f [%+.3f, %+.3f]", "window",
                 (long long)t->budget_tokens, (long long)pol, (long long)N, t->accuracy, t->acc_lo, t->acc_hi,
                 t->diff, t->diff_lo, t->diff_hi);
        snprintf(series, sizeof series, "%-14s %6lld ", "window", (long long)t->budget_tokens);
        assert_non_null(line_of(text, series, buf, sizeof buf));
        if (strncmp(buf, want, strlen(want)) != 0) fail_msg("printed '%s', want '%s'", buf, want);
        snprintf(want, sizeof want, "%-14s %6s %3lld/%-3lld  %6.3f [%.3f, %.3f]", "(full cache)", "-", (long long)full,
                 (long long)N, t->full_accuracy, t->full_lo, t->full_hi);
        assert_non_null(line_of(text, "(full cache)", buf, sizeof buf));
        assert_string_equal(buf, want);
    }
    /* a window of 8 loses the name; 512 covers every context: exactly the full model, item for item, text for text */
    assert_true(rows[0].budget_tokens == 8 && rows[0].accuracy < 0.2 && rows[0].diff_hi < 0);
    assert_int_equal(rows[1].budget_tokens, 512);
    for (int64_t k = 0; k < N; k++) {
        assert_int_equal(rows[1].items[k].policy_correct, rows[1].items[k].full_correct);
        assert_string_equal(rows[1].items[k].policy_text, rows[1].items[k].full_text);
    }
    assert_true(rows[1].accuracy == rows[1].full_accuracy && rows[1].diff == 0 && rows[1].diff_lo == 0 &&
                rows[1].diff_hi == 0);
    assert_non_null(strstr(text, "window            512  "));
    assert_null(strstr(text, "nan"));
    free(text);
    /* each item is a closed-loop run of its own (mode free, the context's tokens but the last as the prompt) */
    kvs_results_closed_row *cl = NULL;
    int64_t n_cl = 0;
    assert_int_equal(kvs_results_closed_query(h, &cl, &n_cl), KVS_OK);
    assert_int_equal(n_cl, 2 * N);
    for (int64_t k = 0; k < N; k++) {
        const kvs_results_closed_row *c = NULL;
        for (int64_t j = 0; j < n_cl; j++)
            if (cl[j].id == rows[1].items[k].run_id) c = &cl[j];
        assert_non_null(c);
        assert_string_equal(c->mode, "free");
        assert_int_equal(c->n_tokens, rows[1].items[k].n_context);
        assert_int_equal(c->prompt_len, c->n_tokens - 1);
        assert_true(c->kl_mean == 0.0 && c->first_divergence == -1);
    }
    kvs_results_closed_rows_free(cl, n_cl);
    /* the same task, model and row again: the same intervals */
    assert_int_equal(kvs_test_cli(out, err, gen), 0);
    kvs_results_closed_task_row *again = NULL;
    int64_t n2 = 0;
    assert_int_equal(kvs_results_closed_task_query(h, &again, &n2), KVS_OK);
    assert_int_equal(n2, 4);
    for (int r = 0; r < 2; r++)
        assert_true(again[r + 2].acc_lo == rows[r].acc_lo && again[r + 2].acc_hi == rows[r].acc_hi &&
                    again[r + 2].diff_lo == rows[r].diff_lo && again[r + 2].diff_hi == rows[r].diff_hi);
    kvs_results_closed_task_rows_free(again, n2);
    kvs_results_closed_task_rows_free(rows, n);
    kvs_results_close(h);
    if (part[0]) unlink(part);
    cleanup_dir();
}

/* --prompt-tokens K with --task: the first K tokens are the prompt, the rest of each context is read through the
 * policy (recorded); a policy that rejects a budget is a failed task run (exit 1, recorded failed, no accuracy). */
static void test_task_prompt_tokens_and_failed_runs(void **state) {
    (void)state;
    if (!need()) skip();
    char task[160];
    snprintf(task, sizeof task, "%s/t.txt", dir);
    FILE *f = fopen(task, "w");
    assert_non_null(f);
    fputs("# kvsim task v1\nOnce upon a time, there was a girl named Lily. Lily had a little cat. One day the cat ran "
          "away. Lily looked for the cat in the house. At last she found the cat in a box. Mom came and said, \"Good "
          "job,\tLily\nOnce upon a time, there was a boy named Tom. Tom had a red ball. He played with it every day. "
          "Mom came and said, \"Good job,\tTom\n", f);
    fclose(f);
    const char *gen[] = {"generate", "--model", model, "--task", task, "--prompt-tokens", "8", "--db", db, "--policy",
                         "streaming", "--budgets", "2,16", NULL};
    assert_int_equal(kvs_test_cli(out, err, gen), 1);
    char *text = kvs_test_slurp(err, NULL);
    assert_non_null(strstr(text, "streaming budget 2 failed on"));
    assert_non_null(strstr(text, "t.txt:2: policy streaming: budget 2 must exceed sinks=4"));
    free(text);
    text = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(text, "prompt: the first 8 tokens of each context"));
    free(text);
    kvs_results_db *h = NULL;
    assert_int_equal(kvs_results_open_readonly(db, &h), KVS_OK);
    kvs_results_closed_task_row *rows = NULL;
    int64_t n = 0;
    assert_int_equal(kvs_results_closed_task_query(h, &rows, &n), KVS_OK);
    assert_int_equal(n, 1); /* the failed run is not a result */
    assert_int_equal(rows[0].budget_tokens, 16);
    assert_int_equal(rows[0].prompt_tokens, 8);
    assert_int_equal(rows[0].n_items, 2);
    kvs_results_closed_row *cl = NULL;
    int64_t n_cl = 0;
    assert_int_equal(kvs_results_closed_query(h, &cl, &n_cl), KVS_OK);
    assert_int_equal(n_cl, 2);
    for (int64_t j = 0; j < n_cl; j++) {
        assert_int_equal(cl[j].prompt_len, 8);
        assert_true(cl[j].n_steps > 10); /* the rest of the context, then the generation */
    }
    kvs_results_closed_rows_free(cl, n_cl);
    kvs_results_closed_task_rows_free(rows, n);
    kvs_results_close(h);
    unlink(task);
    cleanup_dir();
}

static void test_task_bad_usage_and_files(void **state) {
    (void)state;
    if (!need()) skip();
    char task[160], good[4200];
    snprintf(task, sizeof task, "%s/t.txt", dir);
    snprintf(good, sizeof good, "%s/examples/tasks/name_recall.txt", kvs_test_root());
    static const struct {
        const char *a, *b, *msg;
    } usage_cases[] = {
        {"--budgets", "10%", "--task takes budgets in tokens"},
        {"--steps", "4", "--steps goes with --prompt / --prompt-file"},
        {"--ignore-eos", NULL, "--ignore-eos goes with --prompt / --prompt-file"},
        {"--trace", trace, "give exactly one of --trace, --text, --prompt, --prompt-file, --task"},
    };
    for (size_t i = 0; i < sizeof usage_cases / sizeof usage_cases[0]; i++) {
        const char *args[16] = {"generate", "--model", model, "--task", good, "--db", db, "--policy", "window"};
        int k = 9;
        if (strcmp(usage_cases[i].a, "--budgets") != 0) {
            args[k++] = "--budgets";
            args[k++] = "8";
        }
        args[k++] = usage_cases[i].a;
        if (usage_cases[i].b) args[k++] = usage_cases[i].b;
        args[k] = NULL;
        assert_int_equal(kvs_test_cli(out, err, args), 2);
        char *text = kvs_test_slurp(err, NULL);
        if (!strstr(text, usage_cases[i].msg)) fail_msg("%s: stderr '%s'", usage_cases[i].a, text);
        free(text);
    }
    /* bad files: exit 1 with the reason, before any run (no database); a test item the tokenizer cannot split is
     * tests/test_task.c's */
    static const struct {
        const char *content, *msg;
    } file_cases[] = {
        {"Her name was\tLily\n", "t.txt:1: not a task file"},
        {"# kvsim task v2\nHer name was\tLily\n", "task format '# kvsim task v2' is not supported"},
        {"# kvsim task v1\nHer name was Lily\n", "t.txt:2: an item is CONTEXT<TAB>ANSWER: no TAB"},
        {"# kvsim task v1\nHer name was\tLily\nHi\tLily\n", "t.txt:3: the context has 3 tokens: --prompt-tokens 4 leaves none"},
    };
    for (size_t i = 0; i < sizeof file_cases / sizeof file_cases[0]; i++) {
        FILE *f = fopen(task, "w");
        assert_non_null(f);
        fputs(file_cases[i].content, f);
        fclose(f);
        const char *args[] = {"generate", "--model", model, "--task", task, "--prompt-tokens", i == 3 ? "4" : "1",
                              "--db", db, "--policy", "window", "--budgets", "8", NULL};
        /* a prompt longer than an item's context is an option that does not fit the file: bad usage */
        assert_int_equal(kvs_test_cli(out, err, args), i == 3 ? 2 : 1);
        char *text = kvs_test_slurp(err, NULL);
        if (!strstr(text, file_cases[i].msg)) fail_msg("case %zu: stderr '%s'", i, text);
        free(text);
        assert_false(kvs_test_exists(db));
    }
    const char *missing[] = {"generate", "--model", model, "--task", "/nonexistent/t.txt", "--db", db, "--policy",
                             "window", "--budgets", "8", NULL};
    assert_int_equal(kvs_test_cli(out, err, missing), 1);
    assert_false(kvs_test_exists(db));
    unlink(task);
    cleanup_dir();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_and_calibrate_on_the_bundled_trace),
        cmocka_unit_test(test_calibrate_pairs_one_trace_through_two_paths),
        cmocka_unit_test(test_generate_with_codecs_pairs_by_codec),
        cmocka_unit_test(test_free_running_and_text_modes),
        cmocka_unit_test(test_bad_usage_and_files),
        cmocka_unit_test(test_task_accuracy_per_policy_and_budget),
        cmocka_unit_test(test_task_prompt_tokens_and_failed_runs),
        cmocka_unit_test(test_task_bad_usage_and_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
