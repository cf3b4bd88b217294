/* test_keys.c — common/kvs_stats (ranks, Spearman, SPD log-determinant) on hand-computed values, and
 * analysis/keys (KeyDiff's premises K3/K12 and the retained-key diversity K11) against a separately written
 * double-precision computation on GENERATED traces (tests/util/gen_trace.h, not a model's), then
 * `kvsim keys` through the binary.
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

#include "analysis/keys.h"
#include "common/kvs_stats.h"
#include "sim/policy.h"
#include "policies/registry.h"
#include "tests/util/cli_run.h"
#include "tests/util/gen_trace.h"

/* ---- kvs_stats ----------------------------------------------------------------------------------------- */

static void test_ranks_average_ties(void **state) {
    (void)state;
    const double x[] = {3.0, 1.0, 2.0, 2.0, 5.0, 2.0};
    double r[6];
    assert_int_equal(kvs_ranks(x, 6, r), KVS_OK);
    const double want[] = {5.0, 1.0, 3.0, 3.0, 6.0, 3.0}; /* the three 2s share ranks 2, 3, 4 */
    for (int i = 0; i < 6; i++) assert_true(r[i] == want[i]);
    const double bad[] = {1.0, NAN};
    assert_int_equal(kvs_ranks(bad, 2, r), KVS_ERR_INVALID_ARG);
}

static void test_spearman_hand_values(void **state) {
    (void)state;
    double rho;
    const double a[] = {1, 2, 3, 4, 5}, up[] = {10, 20, 30, 40, 50}, down[] = {9, 7, 5, 3, 1};
    assert_int_equal(kvs_spearman(a, up, 5, &rho), KVS_OK);
    assert_true(fabs(rho - 1.0) < 1e-15);
    assert_int_equal(kvs_spearman(a, down, 5, &rho), KVS_OK);
    assert_true(fabs(rho + 1.0) < 1e-15);
    /* no ties: 1 - 6 Σd² / (n(n²-1)); ranks of y = (2,1,4,3,5): Σd² = 4 -> 1 - 24/120 = 0.8 */
    const double y[] = {0.2, 0.1, 0.4, 0.3, 0.5};
    assert_int_equal(kvs_spearman(a, y, 5, &rho), KVS_OK);
    assert_true(fabs(rho - 0.8) < 1e-15);
    /* ties: x ranks (1.5,1.5,3,4), y ranks (1,2,3,4): Pearson of the ranks = 0.9486832980505138 */
    const double xt[] = {1, 1, 2, 3}, yt[] = {1, 2, 3, 4};
    assert_int_equal(kvs_spearman(xt, yt, 4, &rho), KVS_OK);
    assert_true(fabs(rho - 0.9486832980505138) < 1e-14);
    /* a constant ranking: undefined */
    const double c[] = {2, 2, 2, 2};
    assert_int_equal(kvs_spearman(c, yt, 4, &rho), KVS_OK);
    assert_true(isnan(rho));
    assert_int_equal(kvs_spearman(a, y, 1, &rho), KVS_ERR_INVALID_ARG);
}

static void test_logdet_spd_hand_values(void **state) {
    (void)state;
    double ld;
    const double A[] = {4, 2, 0, 2, 5, 1, 0, 1, 3}; /* det = 4(15-1) - 2(6-0) = 44 */
    assert_int_equal(kvs_logdet_spd(A, 3, &ld), KVS_OK);
    assert_true(fabs(ld - log(44.0)) < 1e-13);
    const double I[] = {1e-6, 0, 0, 1e-6};
    assert_int_equal(kvs_logdet_spd(I, 2, &ld), KVS_OK);
    assert_true(fabs(ld - 2 * log(1e-6)) < 1e-12);
    const double notpd[] = {1, 2, 2, 1}; /* eigenvalues 3, -1 */
    assert_int_equal(kvs_logdet_spd(notpd, 2, &ld), KVS_ERR_RANGE);
}

/* ---- analysis/keys against a naive double computation --------------------------------------------- */

typedef struct {
    char dir[64], path[128];
    kvs_gen_trace *g;
    kvs_trace *t;
} fixture;

static int fx_setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/kvs_keys_XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/t.kvt", f->dir);
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = 48;
    o.prompt_len = 30;
    o.q_scale = 2.0f;
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

static const float *key_of(const kvs_gen_trace *g, int layer, int64_t pos, int kvh) {
    const kvs_gen_trace_opts *o = &g->opt;
    return g->k + (((size_t)layer * (size_t)o->n_positions + (size_t)pos) * (size_t)o->n_kv_heads + (size_t)kvh) *
                      (size_t)o->head_dim;
}
static const float *query_of(const kvs_gen_trace *g, int layer, int64_t pos, int head) {
    const kvs_gen_trace_opts *o = &g->opt;
    return g->q + (((size_t)layer * (size_t)o->n_positions + (size_t)pos) * (size_t)o->n_heads + (size_t)head) *
                      (size_t)o->head_dim;
}

static double dotd(const float *a, const float *b, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)a[i] * b[i];
    return s;
}

/* Spearman the slow way: ranks by counting (ties averaged), then Pearson. */
static double naive_spearman(const double *x, const double *y, int n) {
    double *rx = malloc((size_t)n * sizeof *rx), *ry = malloc((size_t)n * sizeof *ry);
    for (int i = 0; i < n; i++) {
        double lx = 0, ex = 0, ly = 0, ey = 0;
        for (int j = 0; j < n; j++) {
            lx += x[j] < x[i], ex += x[j] == x[i];
            ly += y[j] < y[i], ey += y[j] == y[i];
        }
        rx[i] = lx + (ex + 1) / 2;
        ry[i] = ly + (ey + 1) / 2;
    }
    double mx = 0, my = 0, sxy = 0, sxx = 0, syy = 0;
    for (int i = 0; i < n; i++) mx += rx[i] / n, my += ry[i] / n;
    for (int i = 0; i < n; i++) {
        sxy += (rx[i] - mx) * (ry[i] - my);
        sxx += (rx[i] - mx) * (rx[i] - mx);
        syy += (ry[i] - my) * (ry[i] - my);
    }
    free(rx);
    free(ry);
    return sxy / sqrt(sxx * syy);
}

static void check_head(const fixture *f, int layer, int kvh, int n) {
    const kvs_gen_trace_opts *o = &f->g->opt;
    const int d = o->head_dim, G = o->n_heads / o->n_kv_heads;
    const double scale = 1.0 / sqrt((double)d);
    double recv[64] = {0}, meancos[64], perq[64], mk[64] = {0}, mq[64] = {0};
    for (int t = 0; t < n; t++)
        for (int g = 0; g < G; g++) {
            const float *q = query_of(f->g, layer, t, kvh * G + g);
            double s[64], mx = -INFINITY, z = 0;
            for (int j = 0; j <= t; j++) {
                s[j] = scale * dotd(q, key_of(f->g, layer, j, kvh), d);
                if (s[j] > mx) mx = s[j];
            }
            for (int j = 0; j <= t; j++) z += exp(s[j] - mx);
            for (int j = 0; j <= t; j++) recv[j] += exp(s[j] - mx) / z / G;
            for (int c = 0; c < d; c++) mq[c] += q[c];
        }
    double norm[64], cos_mk_sum = 0;
    for (int i = 0; i < n; i++) {
        const float *ki = key_of(f->g, layer, i, kvh);
        norm[i] = sqrt(dotd(ki, ki, d));
        for (int c = 0; c < d; c++) mk[c] += ki[c];
    }
    for (int i = 0; i < n; i++) {
        const float *ki = key_of(f->g, layer, i, kvh);
        double s = 0;
        for (int j = 0; j < n; j++)
            if (j != i) s += dotd(ki, key_of(f->g, layer, j, kvh), d) / (norm[i] * norm[j]);
        meancos[i] = s / (n - 1);
        perq[i] = recv[i] / (n - i);
    }
    double nmk = 0, nmq = 0, kq = 0;
    for (int c = 0; c < d; c++) nmk += mk[c] * mk[c], nmq += mq[c] * mq[c], kq += mk[c] * mq[c];
    nmk = sqrt(nmk), nmq = sqrt(nmq);
    for (int i = 0; i < n; i++) {
        const float *ki = key_of(f->g, layer, i, kvh);
        double s = 0;
        for (int c = 0; c < d; c++) s += ki[c] * mk[c];
        cos_mk_sum += s / (norm[i] * nmk);
    }
    kvs_key_stats st;
    assert_int_equal(kvs_analysis_key_stats(f->t, layer, kvh, n == o->n_positions ? KVS_KEYS_ALL : KVS_KEYS_PROMPT, &st),
                     KVS_OK);
    assert_int_equal(st.n_keys, n);
    assert_int_equal(st.layer, layer);
    /* the rank correlations: float attention vs double may swap near-equal sums, so a small tolerance */
    assert_true(fabs(st.spearman_sum - naive_spearman(meancos, recv, n)) < 5e-3);
    assert_true(fabs(st.spearman_per_query - naive_spearman(meancos, perq, n)) < 5e-3);
    assert_true(fabs(st.cos_meank_meanq - kq / (nmk * nmq)) < 1e-6);
    assert_true(fabs(st.mean_cos_to_meank - cos_mk_sum / n) < 1e-6);
    double mean = 0, sq = 0;
    for (int i = 0; i < n; i++) mean += norm[i] / n, sq += norm[i] * norm[i] / n;
    assert_true(fabs(st.norm_cv - sqrt(sq - mean * mean) / mean) < 1e-6);
    assert_true(st.distinct_key_pct >= 0 && st.distinct_key_pct <= 1);
}

static void test_key_stats_match_a_naive_computation(void **state) {
    fixture *f = *state;
    for (int l = 0; l < f->g->opt.n_layers; l++)
        for (int h = 0; h < f->g->opt.n_kv_heads; h++) {
            check_head(f, l, h, f->g->opt.n_positions); /* every position */
            check_head(f, l, h, 30);                    /* the prompt */
        }
    kvs_key_stats st;
    assert_int_equal(kvs_analysis_key_stats(f->t, 9, 0, KVS_KEYS_ALL, &st), KVS_ERR_RANGE);
}

/* logdet(K̂ᵀK̂ + eps I) of the unit keys of positions [lo, hi) of (layer, kvh), computed directly. */
static double naive_logdet(const fixture *f, int layer, int kvh, int lo, int hi, double eps) {
    const int d = f->g->opt.head_dim;
    double A[64 * 64] = {0};
    for (int p = lo; p < hi; p++) {
        const float *k = key_of(f->g, layer, p, kvh);
        double nr = sqrt(dotd(k, k, d));
        for (int a = 0; a < d; a++)
            for (int b = 0; b < d; b++) A[a * d + b] += k[a] / nr * (k[b] / nr);
    }
    for (int a = 0; a < d; a++) A[a * d + a] += eps;
    double ld = 0;
    assert_int_equal(kvs_logdet_spd(A, (size_t)d, &ld), KVS_OK);
    return ld;
}

static void test_retained_logdet_of_known_sets(void **state) {
    fixture *f = *state;
    const int L = f->g->opt.n_layers, H = f->g->opt.n_kv_heads;
    double ld[16];
    int64_t m[16];
    kvs_policy_config cfg;
    /* full keeps the whole 30-position prompt */
    assert_int_equal(kvs_policy_parse("full", &cfg), KVS_OK);
    assert_int_equal(kvs_analysis_retained_logdet(f->t, &cfg, 48, 1e-6, ld, m), KVS_OK);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            assert_int_equal(m[l * H + h], 30);
            assert_true(fabs(ld[l * H + h] - naive_logdet(f, l, h, 0, 30, 1e-6)) < 1e-9);
        }
    /* a window of 10 holds the prompt's last 9 positions between steps */
    assert_int_equal(kvs_policy_parse("window", &cfg), KVS_OK);
    assert_int_equal(kvs_analysis_retained_logdet(f->t, &cfg, 10, 1e-3, ld, m), KVS_OK);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            assert_int_equal(m[l * H + h], 9);
            assert_true(fabs(ld[l * H + h] - naive_logdet(f, l, h, 21, 30, 1e-3)) < 1e-9);
        }
    /* a configuration the policy rejects is an error with its reason */
    assert_int_equal(kvs_policy_parse("streaming:sinks=8", &cfg), KVS_OK);
    assert_int_not_equal(kvs_analysis_retained_logdet(f->t, &cfg, 4, 1e-6, ld, m), KVS_OK);
    assert_non_null(strstr(kvs_last_error(), "sinks"));
}

/* ---- kvsim keys -------------------------------------------------------------------------------------------- */

static int count_lines(const char *path) {
    char *t = NULL;
    size_t n = 0;
    if (kvs_read_file(path, &t, &n) != KVS_OK) return -1;
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += t[i] == '\n';
    free(t);
    return lines;
}

static void test_cli_keys(void **state) {
    fixture *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    char out[160], err[160];
    snprintf(out, sizeof out, "%s/out", f->dir);
    snprintf(err, sizeof err, "%s/err", f->dir);
    const char *csv[] = {"keys", f->path, "--csv", "--policy", "window", "--policy", "tova", "--budget", "12", NULL};
    assert_int_equal(kvs_test_cli(out, err, csv), 0);
    assert_int_equal(count_lines(out), 1 + 2 * 2); /* header + (2 layers x 2 KV heads) */
    char *text = NULL;
    size_t n = 0;
    assert_int_equal(kvs_read_file(out, &text, &n), KVS_OK);
    assert_non_null(strstr(text, "layer,kv_head,n_keys,rho_sum,rho_perq,cos_kq,cos_k_mk,norm_cv,distinct,logdet_0,m_0,"
                                 "logdet_1,m_1\n0,0,48,"));
    free(text);
    const char *table[] = {"keys", f->path, "--scope", "prompt", "--layer", "1", NULL};
    assert_int_equal(kvs_test_cli(out, err, table), 0);
    assert_int_equal(kvs_read_file(out, &text, &n), KVS_OK);
    assert_non_null(strstr(text, "30 keys per head (the first prompt)"));
    assert_non_null(strstr(text, "heads with rho < 0:"));
    free(text);
    const char *bad1[] = {"keys", f->path, "--policy", "tova", NULL}; /* no --budget */
    assert_int_equal(kvs_test_cli(out, err, bad1), 2);
    const char *bad2[] = {"keys", f->path, "--scope", "x", NULL};
    assert_int_equal(kvs_test_cli(out, err, bad2), 2);
    const char *bad3[] = {"keys", f->path, "--layer", "7", NULL};
    assert_int_equal(kvs_test_cli(out, err, bad3), 1);
    const char *bad4[] = {"keys", "/nonexistent.kvt", NULL};
    assert_int_equal(kvs_test_cli(out, err, bad4), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranks_average_ties),
        cmocka_unit_test(test_spearman_hand_values),
        cmocka_unit_test(test_logdet_spd_hand_values),
        cmocka_unit_test_setup_teardown(test_key_stats_match_a_naive_computation, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_retained_logdet_of_known_sets, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cli_keys, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
