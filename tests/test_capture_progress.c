/* test_capture_progress.c — the progress line of `kvsim capture` and its interruption (capture_progress.h,
 * cli/cmd_capture.c, trace/trace.h kvs_trace_writer_keep_partial):
 *  - the rates, ETAs, plan and text of the line on a fake clock, against values computed by hand;
 *  - a capture sent SIGINT mid-way exits 130, says how many positions it kept and prints the recovery
 *    command, which run as printed gives a trace `kvsim verify` accepts, holding exactly those positions;
 *    SIGTERM with --no-trace exits 143 and says no trace was recorded.
 * The capture is made slow enough to interrupt by a model of zero weights (a sparse llama2.c file written
 * here: 4 layers of dim 512, 8192 positions of context); the test polls the .partial's size and stderr,
 * and never asserts a timing. The CLI under test is $KVSIM_BIN.
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

#include "tests/util/cli_run.h"
#include "tests/util/testenv.h"

#include "gpu_capture/capture_progress.h"
#include "trace/trace.h"

/* ------------------------------------------------------------------------------------------------
 * the line's numbers on a fake clock
 * ---------------------------------------------------------------------------------------------- */

static void test_single_turn_rates_and_etas(void **state) {
    (void)state;
    int64_t prompt[1] = {10};
    kvs_capture_progress p;
    kvs_capture_eta e;
    kvs_capture_progress_start(&p, 100.0, prompt, 1, 20, 100);
    assert_int_equal(p.planned[0], 10);
    assert_int_equal(p.planned[1], 20);
    kvs_capture_progress_turn(&p, 0, 10);
    char line[320];
    kvs_capture_progress_format(&p, 100.0, 0, line, sizeof line);
    assert_string_equal(line, "capture: prefill 0/10, 0/30 positions, -- tok/s, ETA prefill -- total --, trace 0.00 MB, "
                              "0:00 elapsed");

    /* 4 prompt positions in 2 s: 2/s, 6 left = 3 s; decode never timed: no total */
    kvs_capture_progress_add(&p, KVS_CAPTURE_PREFILL, 4, 102.0);
    kvs_capture_progress_estimate(&p, 102.0, &e);
    assert_float_equal(e.rate, 2.0, 1e-12);
    assert_float_equal(e.eta_phase, 3.0, 1e-12);
    assert_true(e.eta_total < 0);
    assert_float_equal(e.elapsed, 2.0, 1e-12);

    /* the prompt done: 10 in 3 s; the phase has nothing left, the capture still 20 untimed decode steps */
    kvs_capture_progress_add(&p, KVS_CAPTURE_PREFILL, 6, 103.0);
    kvs_capture_progress_estimate(&p, 103.0, &e);
    assert_float_equal(e.rate, 10.0 / 3.0, 1e-12);
    assert_float_equal(e.eta_phase, 0.0, 0);
    assert_true(e.eta_total < 0);

    /* 5 generated in 10 s: 0.5/s, 15 left = 30 s for the phase and the capture */
    kvs_capture_progress_add(&p, KVS_CAPTURE_DECODE, 5, 113.0);
    kvs_capture_progress_estimate(&p, 113.0, &e);
    assert_float_equal(e.rate, 0.5, 1e-12);
    assert_float_equal(e.eta_phase, 30.0, 1e-12);
    assert_float_equal(e.eta_total, 30.0, 1e-12);
    kvs_capture_progress_format(&p, 113.0, 1234567, line, sizeof line);
    assert_string_equal(line, "capture: decode 5/20, 15/30 positions, 0.5 tok/s, ETA decode 0:30 total 0:30, "
                              "trace 1.23 MB, 0:13 elapsed");
}

static void test_no_steps_has_a_total_during_prefill(void **state) {
    (void)state;
    int64_t prompt[1] = {10};
    kvs_capture_progress p;
    kvs_capture_eta e;
    kvs_capture_progress_start(&p, 0.0, prompt, 1, 0, 100);
    kvs_capture_progress_turn(&p, 0, 10);
    kvs_capture_progress_add(&p, KVS_CAPTURE_PREFILL, 4, 2.0);
    kvs_capture_progress_estimate(&p, 2.0, &e);
    assert_float_equal(e.eta_total, 3.0, 1e-12); /* nothing to decode: the prefill's 6 left at 2/s */
}

static void test_turns_plan_cut_at_max_positions(void **state) {
    (void)state;
    /* turns of 5, 3, 4 prompt tokens, 10 steps each, 30 positions: 5+10, 3+10, then 2 of the last prompt */
    int64_t prompt[3] = {5, 3, 4};
    kvs_capture_progress p;
    kvs_capture_eta e;
    kvs_capture_progress_start(&p, 0.0, prompt, 3, 10, 30);
    assert_int_equal(p.planned[0], 10);
    assert_int_equal(p.planned[1], 20);
    kvs_capture_progress_turn(&p, 0, 5);
    kvs_capture_progress_add(&p, KVS_CAPTURE_PREFILL, 5, 1.0);  /* 5/s */
    kvs_capture_progress_add(&p, KVS_CAPTURE_DECODE, 10, 6.0);  /* 2/s */
    kvs_capture_progress_turn(&p, 1, 3);
    kvs_capture_progress_estimate(&p, 6.0, &e);
    assert_float_equal(e.rate, 5.0, 1e-12);                     /* the turn starts with its prompt */
    assert_float_equal(e.eta_phase, 3.0 / 5.0, 1e-12);
    assert_float_equal(e.eta_total, 5.0 / 5.0 + 10.0 / 2.0, 1e-12); /* prompts 3 + 2 left, decode 10 */
    char line[320];
    kvs_capture_progress_format(&p, 6.0, 0, line, sizeof line);
    assert_string_equal(line, "capture: prefill (turn 2/3) 0/3, 15/30 positions, 5.0 tok/s, ETA prefill 0:01 total "
                              "0:06, trace 0.00 MB, 0:06 elapsed");
    /* the last turn: 2 of its 4 prompt tokens fit, no generation */
    kvs_capture_progress_add(&p, KVS_CAPTURE_PREFILL, 3, 7.0);
    kvs_capture_progress_add(&p, KVS_CAPTURE_DECODE, 10, 12.0);
    kvs_capture_progress_turn(&p, 2, 4);
    assert_int_equal(p.turn_planned[0], 2);
    assert_int_equal(p.turn_planned[1], 0);
}

static void test_turn_ended_early_replans_the_rest(void **state) {
    (void)state;
    /* 5 + 10, 3 + 10, 4 + 10 in 100 positions = 42; turn 0 ends at an end token after 4 generated: then the
     * plan is 9 done + 3 + 10 + 4 + 10 = 36 */
    int64_t prompt[3] = {5, 3, 4};
    kvs_capture_progress p;
    kvs_capture_progress_start(&p, 0.0, prompt, 3, 10, 100);
    assert_int_equal(p.planned[0] + p.planned[1], 42);
    kvs_capture_progress_turn(&p, 0, 5);
    kvs_capture_progress_add(&p, KVS_CAPTURE_PREFILL, 5, 1.0);
    kvs_capture_progress_add(&p, KVS_CAPTURE_DECODE, 4, 3.0);
    kvs_capture_progress_turn(&p, 1, 3);
    char line[320];
    kvs_capture_progress_format(&p, 3.0, 0, line, sizeof line);
    assert_non_null(strstr(line, " 9/36 positions,"));
    kvs_capture_eta e;
    kvs_capture_progress_estimate(&p, 3.0, &e);
    assert_float_equal(e.eta_total, 7.0 / 5.0 + 20.0 / 2.0, 1e-12);
}

/* A cost per position growing with the position (attention over the context): the ETAs extrapolate the line
 * fitted to the timings, not the mean rate. */
static void test_eta_follows_a_cost_growing_with_the_position(void **state) {
    (void)state;
    int64_t prompt[1] = {1};
    kvs_capture_progress p;
    kvs_capture_eta e;
    kvs_capture_progress_start(&p, 0.0, prompt, 1, 9, 100);
    kvs_capture_progress_turn(&p, 0, 1);
    double now = 0.05;
    kvs_capture_progress_add(&p, KVS_CAPTURE_PREFILL, 1, now);
    for (int i = 1; i <= 4; i++) { /* position i costs 0.1 + 0.01 i */
        now += 0.1 + 0.01 * i;
        kvs_capture_progress_add(&p, KVS_CAPTURE_DECODE, 1, now);
    }
    kvs_capture_progress_estimate(&p, now, &e);
    assert_float_equal(e.rate, 4.0 / 0.5, 1e-9);       /* the mean, shown as tok/s */
    assert_float_equal(e.eta_phase, 0.5 + 0.01 * 35, 1e-9); /* positions 5..9: 5 x 0.1 + 0.01 (5+6+7+8+9) */
    assert_float_equal(e.eta_total, 0.85, 1e-9);
    /* costs falling with the position (a slow start) are not extrapolated down: the mean, 5 x 0.5 / 4 */
    kvs_capture_progress_start(&p, 0.0, prompt, 1, 9, 100);
    kvs_capture_progress_turn(&p, 0, 1);
    now = 0.05;
    kvs_capture_progress_add(&p, KVS_CAPTURE_PREFILL, 1, now);
    for (int i = 1; i <= 4; i++) {
        now += 0.2 - 0.01 * i;
        kvs_capture_progress_add(&p, KVS_CAPTURE_DECODE, 1, now);
    }
    kvs_capture_progress_estimate(&p, now, &e);
    assert_float_equal(e.eta_phase, 5.0 * (0.8 - 0.1) / 4.0, 1e-9);
}

static void test_duration_text(void **state) {
    (void)state;
    struct {
        double s;
        const char *want;
    } c[] = {{-1, "--"}, {0, "0:00"}, {59.4, "0:59"}, {59.5, "1:00"}, {3599.4, "59:59"}, {3600, "1:00:00"},
             {3725, "1:02:05"}, {90061, "25:01:01"}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char buf[24];
        kvs_capture_progress_duration(c[i].s, buf, sizeof buf);
        assert_string_equal(buf, c[i].want);
    }
}

/* ------------------------------------------------------------------------------------------------
 * interruption of a real capture
 * ---------------------------------------------------------------------------------------------- */

#define SLOW_PROMPT "5,6,7,8,9,10,11,12,13,14" /* + BOS: 11 prompt positions */
#define SLOW_STEPS 8000

/* A llama2.c checkpoint of zero weights, sparse: dim 512, hidden 1536, 4 layers, 8 heads, vocab 512, 8192
 * positions. Zero weights decode token 0 every step at a cost of real matrix products. */
static void write_slow_model(const char *path) {
    const int32_t h[7] = {512, 1536, 4, 8, 8, 512, 8192};
    int64_t d = h[0], hid = h[1], L = h[2], hd = h[0] / h[3], kvd = h[4] * hd, V = h[5], S = h[6];
    int64_t n = V * d + L * d + L * d * d + 2 * L * kvd * d + L * d * d + L * d + 3 * L * hid * d + d + S * hd;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(h, sizeof h, 1, f), 1);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(truncate(path, (off_t)(28 + 4 * n)), 0);
}

static off_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : -1;
}

/* Polls (10 ms steps, up to 120 s) until `path` (when not NULL) holds at least min_bytes and the file `err`
 * holds a progress line of the decode phase. @return 1 when both happened. */
static int wait_for_progress(const char *path, off_t min_bytes, const char *err) {
    for (int i = 0; i < 12000; i++) {
        int ok = !path || file_size(path) >= min_bytes;
        if (ok) {
            char *e = kvs_test_slurp(err, NULL);
            ok = e && strstr(e, "capture: decode ") != NULL;
            free(e);
        }
        if (ok) return 1;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static void test_sigint_leaves_a_recoverable_trace(void **state) {
    kvs_test_cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    char model[160], trace[160], partial[200];
    snprintf(model, sizeof model, "%s/slow.bin", f->dir);
    snprintf(trace, sizeof trace, "%s/my trace.kvt", f->dir); /* a space: the printed command quotes it */
    snprintf(partial, sizeof partial, "%s.partial", trace);
    write_slow_model(model);
    const char *args[] = {"capture", "--model", model, "--prompt-ids", SLOW_PROMPT, "--steps", "8000", "--ignore-eos",
                          "--threads", "1", "--block", "16", "--out", trace, "--progress", NULL};
    pid_t pid = kvs_test_cli_spawn(f->out, f->err, args);
    assert_true(pid > 0);
    int ready = wait_for_progress(partial, 64 * 1024, f->err); /* several blocks written, a line printed */
    assert_int_equal(kill(pid, SIGINT), 0);
    int rc = kvs_test_cli_wait(pid);
    char *err = kvs_test_slurp(f->err, NULL);
    assert_non_null(err);
    if (!ready || rc != 130) fail_msg("ready %d, exit %d (expected 130 after SIGINT); stderr:\n%s", ready, rc, err);

    /* the message: how many positions, where, and the command */
    const char *head = "kvsim capture: interrupted by SIGINT after ";
    char *m = strstr(err, head);
    if (!m) fail_msg("no interruption message in:\n%s", err);
    long long n = strtoll(m + strlen(head), NULL, 10);
    char want[512];
    snprintf(want, sizeof want, "%s%lld positions; %s holds them. Recover a valid trace of those positions with:\n  ",
             head, n, partial);
    if (strncmp(m, want, strlen(want)) != 0) fail_msg("message:\n%s\nexpected it to start with:\n%s", m, want);
    assert_true(n > 11 && n < 11 + SLOW_STEPS);
    char *cmd = m + strlen(want), *nl = strchr(cmd, '\n');
    assert_non_null(nl);
    *nl = '\0';
    snprintf(want, sizeof want, " trace recover '%s' '%s'", partial, trace);
    assert_non_null(strstr(cmd, want));

    /* the last progress line, printed at the stop, counts the same positions */
    char line_want[160];
    snprintf(line_want, sizeof line_want, "capture: decode %lld/%d, %lld/%d positions, ", n - 11, SLOW_STEPS, n,
             11 + SLOW_STEPS);
    char *last = NULL;
    for (char *q = strstr(err, "capture: decode "); q && q < m; q = strstr(q + 1, "capture: decode ")) last = q;
    if (!last || strncmp(last, line_want, strlen(line_want)) != 0)
        fail_msg("last progress line does not start with '%s':\n%s", line_want, err);

    /* the command as printed, then verify */
    char shell[1200];
    snprintf(shell, sizeof shell, "%s >'%s/rec.out' 2>&1", cmd, f->dir);
    int st = system(shell);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    snprintf(shell, sizeof shell, "%s/rec.out", f->dir);
    char rec_want[300];
    snprintf(rec_want, sizeof rec_want, "recovered %lld positions", n);
    assert_true(kvs_test_file_has(shell, rec_want));
    const char *vargs[] = {"verify", trace, NULL};
    assert_int_equal(kvs_test_cli_run(f, vargs), 0);
    assert_true(kvs_test_file_has(f->out, "verify: OK"));
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(trace, &t), KVS_OK);
    const kvs_trace_info *info = kvs_trace_info_get(t);
    assert_int_equal(info->n_positions, n);
    assert_int_equal(info->prompt_len, 11);
    const int32_t *tok = kvs_trace_tokens(t);
    assert_int_equal(tok[0], 1); /* BOS */
    assert_int_equal(tok[10], 14);
    for (long long i = 11; i < n; i++) assert_int_equal(tok[i], 0); /* zero logits: token 0 */
    kvs_trace_close(t);
    free(err);
}

static void test_sigterm_without_a_trace(void **state) {
    kvs_test_cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    char model[160];
    snprintf(model, sizeof model, "%s/slow.bin", f->dir);
    write_slow_model(model);
    const char *args[] = {"capture", "--model", model, "--prompt-ids", SLOW_PROMPT, "--steps", "8000", "--ignore-eos",
                          "--threads", "1", "--no-trace", "--progress", NULL};
    pid_t pid = kvs_test_cli_spawn(f->out, f->err, args);
    assert_true(pid > 0);
    int ready = wait_for_progress(NULL, 0, f->err);
    assert_int_equal(kill(pid, SIGTERM), 0);
    int rc = kvs_test_cli_wait(pid);
    char *err = kvs_test_slurp(f->err, NULL);
    assert_non_null(err);
    if (!ready || rc != 143) fail_msg("ready %d, exit %d (expected 143 after SIGTERM); stderr:\n%s", ready, rc, err);
    assert_non_null(strstr(err, "kvsim capture: interrupted by SIGTERM after "));
    assert_non_null(strstr(err, " positions: no trace was recorded (--no-trace)\n"));
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_turn_rates_and_etas),
        cmocka_unit_test(test_no_steps_has_a_total_during_prefill),
        cmocka_unit_test(test_turns_plan_cut_at_max_positions),
        cmocka_unit_test(test_turn_ended_early_replans_the_rest),
        cmocka_unit_test(test_eta_follows_a_cost_growing_with_the_position),
        cmocka_unit_test(test_duration_text),
        cmocka_unit_test_setup_teardown(test_sigint_leaves_a_recoverable_trace, kvs_test_cli_setup,
                                        kvs_test_cli_teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_without_a_trace, kvs_test_cli_setup, kvs_test_cli_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
