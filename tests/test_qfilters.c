/* test_qfilters.c — policies/qfilters.c (../shared/POLICY_SPEC_2.md §2.8): the golden example G-QF (filters, their
 * sign rule, the group-mean filter, the scores and the kept set of an evict-then-attend cut with window 1), and the
 * CLI path: a calibration trace of the same model is accepted and changes the choices against calib=self, one of
 * another model is refused with a message and a non-zero exit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../policies/qfilters_internal.h"
#include "../policies/registry.h"
#include "util/cli_run.h"
#include "util/testenv.h"

static void assert_rel(double got, double want) {
    double tol = 1e-5 * fmax(fabs(want), 1e-2);
    if (fabs(got - want) > tol) fail_msg("got %.9g want %.9g", got, want);
}

static const float calib[2][5][3] = {
    {{1.0f, 0.2f, -0.1f}, {0.8f, -0.1f, 0.3f}, {1.2f, 0.4f, 0.0f}, {0.9f, 0.0f, -0.2f}, {1.1f, -0.3f, 0.1f}},
    {{0.9f, 0.1f, 0.5f}, {1.1f, 0.0f, 0.4f}, {0.7f, 0.3f, 0.6f}, {1.0f, -0.2f, 0.5f}, {0.8f, 0.1f, 0.3f}}};
static const float keys[6][3] = {{0.5f, 0.1f, 0}, {-0.6f, 0.2f, 0.9f}, {1, -0.4f, -0.5f},
                                 {0, 1, 0},       {-1.2f, 0, 0.3f},    {0.3f, 0.3f, 0.3f}};

static void test_golden_gqf_filters(void **state) {
    (void)state;
    double f0[3], f1[3], s0;
    assert_int_equal(kvs_qfilters_head_filter(&calib[0][0][0], 5, 3, 3, f0, &s0), KVS_OK);
    assert_int_equal(kvs_qfilters_head_filter(&calib[1][0][0], 5, 3, 3, f1, NULL), KVS_OK);
    assert_rel(s0, 2.261858);
    const double w0[3] = {-0.9983577, -0.0557522, -0.0131746}, w1[3] = {-0.8919959, -0.0461073, -0.4496859};
    const double wf[3] = {-0.9451768, -0.0509297, -0.2314302};
    const double ws[6] = {0.4776814, -0.3486329, 0.8090898, 0.0509297, -1.064783, 0.368261};
    for (int a = 0; a < 3; a++) {
        assert_rel(f0[a], w0[a]);
        assert_rel(f1[a], w1[a]);
        assert_rel((f0[a] + f1[a]) / 2, wf[a]);
    }
    for (int j = 0; j < 6; j++) {
        double sc = 0;
        for (int a = 0; a < 3; a++) sc -= keys[j][a] * (f0[a] + f1[a]) / 2;
        assert_rel(sc, ws[j]);
    }
    /* the sign rule: negated queries give the same |v1| but the opposite filter */
    float neg[5][3];
    for (int i = 0; i < 5; i++)
        for (int a = 0; a < 3; a++) neg[i][a] = -calib[0][i][a];
    double fn[3];
    assert_int_equal(kvs_qfilters_head_filter(&neg[0][0], 5, 3, 3, fn, NULL), KVS_OK);
    for (int a = 0; a < 3; a++) assert_rel(fn[a], -w0[a]);
}

/* The policy itself on G-QF: calib=self takes the prompt queries of the allocation pass (the five calibration
 * rows, as positions 0..4 of a prompt whose keys are the six of the example), B = 4, window = 1: kept {0,2,3,5}. */
static void test_golden_gqf_kept_set(void **state) {
    (void)state;
    const struct kvs_policy_ops *ops = kvs_policy_find("qfilters");
    assert_non_null(ops);
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse("qfilters:window=1", &cfg), KVS_OK);
    kvs_policy_model m = {.n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .group = 2, .head_dim = 3, .scale = 0.5f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = 6, .prompt_len = 6, .rope_theta = 10000.0f};
    float q[6][2][3] = {{{0}}}, v[6][3] = {{0}};
    for (int i = 0; i < 5; i++)
        for (int g = 0; g < 2; g++) memcpy(q[i][g], calib[g][i], sizeof q[i][g]);
    /* position 5's query is zero: it adds nothing to Q^T Q and projects to 0 (not > 0), so with 5 of 6 positive
     * the sign is unchanged */
    kvs_policy_view view = {.n = 6, .group = 2, .head_dim = 3, .scale = 0.5f, .k = &keys[0][0], .v = &v[0][0],
                            .q = &q[0][0][0], .q_first = 0, .n_q = 6, .turn_begin = 0, .prompt_end = 6,
                            .block_begin = 0, .last_block = 1};
    void *alloc = NULL, *st = NULL;
    int64_t budgets[1] = {4};
    assert_int_equal(ops->alloc_begin(&cfg, &m, 4, &alloc), KVS_OK);
    assert_int_equal(ops->alloc_prefill(alloc, 0, 0, &view), KVS_OK);
    assert_int_equal(ops->alloc_end(alloc, budgets), KVS_OK);
    kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = 4, .budget_nominal = 4, .shared = ops->alloc_shared(alloc)};
    assert_int_equal(ops->create(&init, &st), KVS_OK);
    assert_int_equal(ops->prefill(st, &view), KVS_OK);
    int32_t out[8];
    int64_t n = ops->stored(st, 0, out);
    assert_int_equal(n, 4);
    const int32_t want[4] = {0, 2, 3, 5};
    for (int i = 0; i < 4; i++) assert_int_equal(out[i], want[i]);
    ops->free(st);
    ops->alloc_free(alloc);
}

static void test_cli_calibration_trace(void **state) {
    const kvs_test_cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    char model[1024], hf[1024], cal[256], calhf[256], db[256], trace[1024], spec_ok[512], spec_bad[512];
    snprintf(model, sizeof model, "%s/../shared/models/stories260K.bin", kvs_test_root());
    snprintf(hf, sizeof hf, "%s/../shared/models/tinystories-656K", kvs_test_root());
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    if (!kvs_test_exists(model) || !kvs_test_exists(hf)) skip();
    snprintf(cal, sizeof cal, "%s/cal.kvt", f->dir);
    snprintf(calhf, sizeof calhf, "%s/calhf.kvt", f->dir);
    snprintf(db, sizeof db, "%s/r.db", f->dir);
    const char *cap1[] = {"capture", "--model", model, "--prompt", "The cat sat on the mat and looked at the sun.",
                          "--steps", "40", "--threads", "1", "--out", cal, NULL};
    assert_int_equal(kvs_test_cli_run(f, cap1), 0);
    const char *cap2[] = {"capture", "--model", hf, "--prompt", "The cat sat.", "--steps", "8", "--threads", "1",
                          "--out", calhf, NULL};
    assert_int_equal(kvs_test_cli_run(f, cap2), 0);
    snprintf(spec_ok, sizeof spec_ok, "qfilters:window=4,calib=%s", cal);
    snprintf(spec_bad, sizeof spec_bad, "qfilters:window=4,calib=%s", calhf);
    const char *bad[] = {"replay", trace, "--db", db, "--policy", spec_bad, "--budgets", "32", "--threads", "1",
                         "--no-progress", NULL};
    assert_int_not_equal(kvs_test_cli_run(f, bad), 0);
    assert_true(kvs_test_file_has(f->err, "another model"));
    const char *ok[] = {"replay", trace, "--db", db, "--policy", spec_ok, "--policy", "qfilters:window=4",
                        "--budgets", "32", "--threads", "1", "--no-progress", NULL};
    assert_int_equal(kvs_test_cli_run(f, ok), 0);
    /* the two filter sources give different errors (the output lists both runs' err_mean) */
    FILE *fp = fopen(f->out, "r");
    assert_non_null(fp);
    char line[1024];
    double err[2];
    int got = 0;
    while (fgets(line, sizeof line, fp) && got < 2) {
        int run;
        char pol[64];
        long b;
        char meas[32];
        double am, rm;
        int amax;
        char r1[32], r2[32], r3[32];
        if (sscanf(line, "%d %63s %ld %31s %lf %d %31s %31s %31s %lf", &run, pol, &b, meas, &am, &amax, r1, r2, r3,
                   &rm) == 10 && !strcmp(pol, "qfilters"))
            err[got++] = rm;
    }
    fclose(fp);
    assert_int_equal(got, 2);
    assert_true(err[0] != err[1]);
    assert_true(kvs_test_file_has(f->err, "calib=self"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_gqf_filters),
        cmocka_unit_test(test_golden_gqf_kept_set),
        cmocka_unit_test_setup_teardown(test_cli_calibration_trace, kvs_test_cli_setup, kvs_test_cli_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
