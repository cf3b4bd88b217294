/* test_d2o_a9.c — examples/findings/d2o_a9.awk, D2O's App. A.9 numerical example as FINDINGS' D-5 block reports
 * it (POLICY_SPEC §5.3 D14): every number it prints recomputed here another way — the optimum of Eq. 33 under
 * Eq. 17 by the exact active-set solution (heads sorted by entropy, the closed form of ln μ over the largest
 * feasible set) instead of the script's bisection, checked to be a maximum by moving cache between heads; the
 * entropy H = ln P − ln(1 + F_v) against the collision entropy of an explicit column-sum vector; bad input exits 1
 * with a message. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "tests/util/testenv.h"

typedef struct {
    double q_uniform, q_eq28, gap, dmu; /* Q ratios to Q_opt; the script's own two residuals */
    int clamped;
} a9_out;

/* Runs the script on the F_v values with P and rho; its exit status, *o filled when it is 0. */
static int run_awk(const kvs_test_tmp *c, const double *F, int n, const char *P, const char *rho, a9_out *o, char **err) {
    char in[128], out[128], errp[128], cmd[1024];
    kvs_test_tmp_path(c, "fv.txt", in, sizeof in);
    kvs_test_tmp_path(c, "out.txt", out, sizeof out);
    kvs_test_tmp_path(c, "err.txt", errp, sizeof errp);
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) fprintf(f, "%.17g\n", F[i]);
    fclose(f);
    snprintf(cmd, sizeof cmd, "awk %s%s %s%s -f '%s/examples/findings/d2o_a9.awk' '%s' > '%s' 2> '%s'", P ? "-v P=" : "", P ? P : "",
             rho ? "-v rho=" : "", rho ? rho : "", kvs_test_root(), in, out, errp);
    int rc = system(cmd);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (err) *err = kvs_test_slurp(errp, NULL);
    if (rc == 0) {
        char *s = kvs_test_slurp(out, NULL);
        assert_non_null(s);
        assert_int_equal(sscanf(s, "%lf %lf %d %lf %lf", &o->q_uniform, &o->q_eq28, &o->clamped, &o->gap, &o->dmu), 5);
        free(s);
    }
    return rc;
}

static int by_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

static double retained(const double *H, const double *S, int n, double k) {
    double q = 0;
    for (int i = 0; i < n; i++) q += H[i] * (1 - exp(-k * S[i]));
    return q;
}

/* The optimum by the active set: with the m heads of largest H active, ln mu = (sum of ln(H k) - k total) / m;
 * the solution is the largest m whose smallest active head still gets S > 0. Fills S; returns the clamped count. */
static int exact_optimum(const double *H, int n, double k, double total, double *S) {
    double *lh = malloc((size_t)n * sizeof *lh);
    assert_non_null(lh);
    int pos = 0;
    for (int i = 0; i < n; i++)
        if (H[i] > 0) lh[pos++] = log(H[i] * k);
    qsort(lh, (size_t)pos, sizeof *lh, by_desc);
    double sum = 0, lm = 0;
    for (int m = 1; m <= pos; m++) {
        sum += lh[m - 1];
        double cand = (sum - k * total) / m;
        if (lh[m - 1] > cand) lm = cand; /* the m-th head is active at this mu: the set may grow */
        else break;
    }
    free(lh);
    int clamped = 0;
    for (int i = 0; i < n; i++) {
        S[i] = H[i] > 0 ? (log(H[i] * k) - lm) / k : 0;
        if (S[i] <= 0) {
            S[i] = 0;
            clamped++;
        }
    }
    return clamped;
}

/* The reference for one input: the three Q, the clamped count; and the optimum is a maximum (moving a little cache
 * from any head that has some to any other lowers Q) and meets the total exactly. */
static void reference(const double *F, int n, double P, double rho, a9_out *o) {
    double H[64], S[64], Su[64], S28[64], z = 0;
    assert_true(n <= 64);
    double k = 1 / (rho * P), total = rho * n * P;
    for (int i = 0; i < n; i++) {
        H[i] = log(P) - log(1 + F[i]);
        Su[i] = rho * P;
        z += exp(-F[i]);
    }
    for (int i = 0; i < n; i++) S28[i] = total * exp(-F[i]) / z;
    o->clamped = exact_optimum(H, n, k, total, S);
    double st = 0;
    for (int i = 0; i < n; i++) st += S[i];
    assert_true(fabs(st - total) < 1e-9 * total);
    double qo = retained(H, S, n, k);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            if (i == j || S[i] <= 0) continue;
            double eps = fmin(S[i], 1e-3 * rho * P), keep_i = S[i], keep_j = S[j];
            S[i] -= eps;
            S[j] += eps;
            assert_true(retained(H, S, n, k) <= qo + 1e-12 * qo);
            S[i] = keep_i;
            S[j] = keep_j;
        }
    o->q_uniform = retained(H, Su, n, k) / qo;
    o->q_eq28 = retained(H, S28, n, k) / qo;
    assert_true(o->q_uniform <= 1 + 1e-12);
    assert_true(o->q_eq28 <= 1 + 1e-12);
}

static void check_against_reference(const kvs_test_tmp *c, const double *F, int n, double P, double rho, int want_clamped) {
    char ps[32], rs[32];
    snprintf(ps, sizeof ps, "%.17g", P);
    snprintf(rs, sizeof rs, "%.17g", rho);
    a9_out got, want;
    assert_int_equal(run_awk(c, F, n, ps, rs, &got, NULL), 0);
    reference(F, n, P, rho, &want);
    assert_int_equal(want.clamped, want_clamped);
    assert_int_equal(got.clamped, want.clamped);
    assert_true(fabs(got.q_uniform - want.q_uniform) < 1e-9);
    assert_true(fabs(got.q_eq28 - want.q_eq28) < 1e-9);
    assert_true(got.gap < 1e-9); /* every active head's marginal gain is mu (Eq. 35) */
    assert_true(got.dmu < 1e-9); /* the bisection's mu is the closed form's */
}

/* Heads like the real models' (F_v of 0.5-4, a prompt of a few hundred): no head is left empty; uniform and Eq. 28
 * are below the optimum, and the outputs do not depend on rho (k = 1/(rho P) makes the problem scale-free). */
static void test_matches_the_exact_optimum(void **state) {
    const kvs_test_tmp *c = *state;
    const double F[] = {0.55, 0.71, 0.82, 0.93, 1.2, 1.31, 0.96, 1.48, 2.1, 3.9};
    check_against_reference(c, F, 10, 276, 0.2, 0);
    check_against_reference(c, F, 10, 108, 0.8, 0);
    a9_out a, b;
    assert_int_equal(run_awk(c, F, 10, "276", "0.2", &a, NULL), 0);
    assert_int_equal(run_awk(c, F, 10, "276", "0.5", &b, NULL), 0);
    assert_true(fabs(a.q_uniform - b.q_uniform) < 1e-9 && fabs(a.q_eq28 - b.q_eq28) < 1e-9);
    assert_true(a.q_uniform < 1 && a.q_eq28 < 1);
}

/* A head of near-zero entropy (its column sums almost all on one position) gets no cache at the optimum, and one of
 * exactly zero entropy (F_v = P - 1) is skipped: the script clamps where Eq. 36 alone would give a negative size. */
static void test_clamps_heads_of_low_entropy(void **state) {
    const kvs_test_tmp *c = *state;
    const double F[] = {0.5, 0.6, 0.7, 60, 0.8, 99};
    check_against_reference(c, F, 6, 100, 0.2, 2);
}

/* H = ln P - ln(1 + F_v) is the collision entropy of the normalised column sums of an explicit matrix's columns. */
static void test_entropy_from_the_variance(void **state) {
    (void)state;
    enum { P = 7 };
    double s[P] = {0};
    /* a causal row-stochastic P x P matrix: row i spreads over 0..i with weights (j + 1)^2 / sum */
    for (int i = 0; i < P; i++) {
        double z = 0;
        for (int j = 0; j <= i; j++) z += (j + 1.0) * (j + 1.0);
        for (int j = 0; j <= i; j++) s[j] += (j + 1.0) * (j + 1.0) / z;
    }
    double mean = 0, var = 0, p2 = 0;
    for (int j = 0; j < P; j++) mean += s[j] / P;
    for (int j = 0; j < P; j++) var += (s[j] - mean) * (s[j] - mean) / P;
    for (int j = 0; j < P; j++) p2 += (s[j] / P) * (s[j] / P);
    assert_true(fabs(mean - 1) < 1e-12);
    assert_true(fabs(-log(p2) - (log(P) - log(1 + var))) < 1e-12);
}

static void test_bad_input(void **state) {
    const kvs_test_tmp *c = *state;
    const double F[] = {0.5, 0.7};
    a9_out o;
    char *err = NULL;
    assert_int_equal(run_awk(c, F, 0, "100", "0.2", &o, &err), 1);
    assert_non_null(strstr(err, "no heads"));
    free(err);
    assert_int_equal(run_awk(c, F, 2, NULL, "0.2", &o, &err), 1);
    assert_non_null(strstr(err, "needs P >= 2"));
    free(err);
    assert_int_equal(run_awk(c, F, 2, "100", "1.5", &o, &err), 1);
    assert_non_null(strstr(err, "0 < rho <= 1"));
    free(err);
    const double neg[] = {0.5, -1};
    assert_int_equal(run_awk(c, neg, 2, "100", "0.2", &o, &err), 1);
    assert_non_null(strstr(err, "not a variance"));
    free(err);
    const double zero[] = {99, 99}; /* every head at zero entropy: nothing to allocate to */
    assert_int_equal(run_awk(c, zero, 2, "100", "0.2", &o, &err), 1);
    assert_non_null(strstr(err, "zero entropy"));
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_matches_the_exact_optimum, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test_setup_teardown(test_clamps_heads_of_low_entropy, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test(test_entropy_from_the_variance),
        cmocka_unit_test_setup_teardown(test_bad_input, kvs_test_tmp_setup, kvs_test_tmp_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
