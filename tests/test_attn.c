/* test_attn.c — analysis/attn (D2O's column-sum variance, RocketKV's top-k union) against a separately written
 * double-precision computation on a GENERATED trace (tests/util/gen_trace.h, not a model's), a hand-checkable
 * property of each, and `kvsim attn` through the binary.
 */
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

#include "analysis/attn.h"
#include "tests/util/cli_run.h"
#include "tests/util/gen_trace.h"

typedef struct {
    char dir[64], path[128];
    kvs_gen_trace *g;
    kvs_trace *t;
} fixture;

static int fx_setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/kvs_attn_XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/t.kvt", f->dir);
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = 44;
    o.prompt_len = 20;
    o.q_scale = 3.0f; /* peaked attention: clear top-k margins */
    o.dtype = KVS_DTYPE_F32;
    if (kvs_gen_trace_create(&o, &f->g) != KVS_OK || kvs_gen_trace_write(f->g, f->path) != KVS_OK) return -1;
    if (kvs_trace_open(f->path, &f->t) != KVS_OK) return -1;
    *state = f;
    return 0;
}

static int fx_teardown(void **state) {
    fixture *f = *state;
    kvs_trace_close(f->t);
    kvs_gen_trace_free(f->g);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    int rc = system(cmd);
    free(f);
    return rc == 0 ? 0 : -1;
}


static void test_colsum_variance_matches_a_naive_computation(void **state) {
    fixture *f = *state;
    const kvs_gen_trace_opts *o = &f->g->opt;
    const int64_t P = 20;
    double var[8], p[64];
    for (int l = 0; l < o->n_layers; l++) {
        assert_int_equal(kvs_analysis_colsum_variance(f->t, l, var), KVS_OK);
        for (int h = 0; h < o->n_heads; h++) {
            double col[64] = {0}, mean = 0, sq = 0;
            for (int64_t i = 0; i < P; i++) {
                kvs_gen_trace_naive_probs(f->g, l, h, i, p);
                for (int64_t j = 0; j <= i; j++) col[j] += p[j];
            }
            for (int64_t j = 0; j < P; j++) mean += col[j] / P;
            assert_true(fabs(mean - 1.0) < 1e-12); /* P rows of 1 spread over P columns */
            for (int64_t j = 0; j < P; j++) sq += (col[j] - mean) * (col[j] - mean);
            assert_true(fabs(var[h] - sq / P) < 1e-5 * (1 + sq / P));
        }
    }
    assert_int_equal(kvs_analysis_colsum_variance(f->t, 5, var), KVS_ERR_RANGE);
}

static int cmp_desc(const void *a, const void *b) {
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return (x < y) - (x > y);
}

static void test_topk_union_matches_a_naive_computation(void **state) {
    fixture *f = *state;
    const kvs_gen_trace_opts *o = &f->g->opt;
    const int G = o->n_heads / o->n_kv_heads;
    kvs_topk_union u[8];
    for (int64_t k = 1; k <= 8; k *= 2)
        for (int l = 0; l < o->n_layers; l++)
            for (int kvh = 0; kvh < o->n_kv_heads; kvh++) {
                assert_int_equal(kvs_analysis_topk_union(f->t, l, kvh, k, u), KVS_OK);
                for (int g = 0; g < G; g++) {
                    uint8_t seen[64] = {0};
                    int64_t n = 0;
                    double p[64], pv[64][2];
                    for (int64_t t = 20; t < o->n_positions; t++) {
                        kvs_gen_trace_naive_probs(f->g, l, kvh * G + g, t, p);
                        for (int64_t j = 0; j <= t; j++) pv[j][0] = p[j], pv[j][1] = (double)j;
                        qsort(pv, (size_t)t + 1, sizeof pv[0], cmp_desc);
                        for (int64_t r = 0; r < k && r <= t; r++) {
                            int j = (int)pv[r][1];
                            if (!seen[j]) seen[j] = 1, n++;
                        }
                    }
                    assert_int_equal(u[g].steps, o->n_positions - 20);
                    assert_int_equal(u[g].max_len, o->n_positions);
                    /* fp32 against fp64 attention can swap two near-equal probabilities at the k-th rank */
                    assert_true(llabs(u[g].n_union - n) <= 1);
                    assert_true(u[g].n_union >= k && u[g].n_union <= o->n_positions);
                }
            }
    /* k at least the sequence: every position is in every step's top-k */
    assert_int_equal(kvs_analysis_topk_union(f->t, 0, 0, 1000, u), KVS_OK);
    assert_int_equal(u[0].n_union, o->n_positions);
    assert_int_equal(kvs_analysis_topk_union(f->t, 0, 0, 0, u), KVS_ERR_INVALID_ARG);
}

static void test_cli_attn(void **state) {
    fixture *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    char out[160], err[160];
    snprintf(out, sizeof out, "%s/out", f->dir);
    snprintf(err, sizeof err, "%s/err", f->dir);
    const char *csv[] = {"attn", f->path, "--csv", "--k", "4", NULL};
    assert_int_equal(kvs_test_cli(out, err, csv), 0);
    char *text = NULL;
    size_t n = 0;
    assert_int_equal(kvs_read_file(out, &text, &n), KVS_OK);
    assert_non_null(strstr(text, "layer,q_head,colsum_var,k,union,steps,max_len\n0,0,"));
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += text[i] == '\n';
    assert_int_equal(lines, 1 + 2 * 4);
    free(text);
    const char *table[] = {"attn", f->path, NULL};
    assert_int_equal(kvs_test_cli(out, err, table), 0);
    assert_int_equal(kvs_read_file(out, &text, &n), KVS_OK);
    assert_non_null(strstr(text, "first prompt 20 positions, 24 generated"));
    free(text);
    const char *bad[] = {"attn", f->path, "--k", "0", NULL};
    assert_int_equal(kvs_test_cli(out, err, bad), 2);
    const char *twice[] = {"attn", f->path, "--k", "2", "--k", "3", NULL};
    assert_int_equal(kvs_test_cli(out, err, twice), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_colsum_variance_matches_a_naive_computation, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_topk_union_matches_a_naive_computation, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cli_attn, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
