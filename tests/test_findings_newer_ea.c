/* test_findings_newer_ea.c — the section "Newer methods that need pre-RoPE keys or calibration" of
 * examples/FINDINGS.md (examples/findings/newer_ea.sh, run once through `examples/findings.sh --check --only
 * newer_ea` on the shared models), recomputed another way from what the script left under its $OUT:
 *  - N-EA-1: Expected Attention's and Q-Filters' mean err at 128 tokens' KV on each model, as the mean of the
 *    per-trace values of `kvsim compare --per-trace --csv --policy P`;
 *  - N-EA-2: the paired difference Expected Attention − TOVA at 128 tokens' KV on each model, as the mean of the
 *    per-trace differences (traces keyed by their content hash), inside its printed interval;
 *  - every "resolved" of N-EA-2 holds exactly when the interval printed beside it excludes 0.
 * Skips without the shared models, outside `make test` and under the sanitizers (a whole study script).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/util/findings_blocks.h"
#include "tests/util/testenv.h"

#define MAX_TRACES 16

static const char *const k_models[2] = {"stories260K", "tinystories-656K"};
static const int k_slot[2] = {32, 64}; /* bytes of one token's K and V per KV head: 2 d x 2 bytes, d = 8 and 16 */

static const char *section(void) {
    const char *out = NULL;
    if (kvs_test_findings_once("newer_ea", &out) == 0) skip();
    if (!out) fail_msg("findings.sh --check --only newer_ea failed");
    return out;
}

static char *block(const char *name) {
    char *s = kvs_test_findings_block(section(), name);
    assert_non_null(s);
    return s;
}

/* Per-trace err of `policy` at X resident bytes: sha[t] and v[t] for the traces with a value; @return their count. */
static int per_trace(const char *model, const char *policy, double X, char sha[][80], double *v) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' compare '%s/newer_ea_%s.db' --match mem --at %.17g --per-trace --csv --policy %s "
             "--metric out_err_mean",
             getenv("KVSIM_BIN"), section(), model, X, policy);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char line[1 << 16];
    char *f[64];
    int nt = 0, c_sha = -1, c_err = -1, c_st = -1;
    for (int row = 0; fgets(line, sizeof line, p); row++) {
        int nf = kvs_test_csv_fields(line, f, 64);
        if (row == 0) {
            c_sha = kvs_test_csv_col(f, nf, "trace_sha256"), c_err = kvs_test_csv_col(f, nf, "out_err_mean");
            c_st = kvs_test_csv_col(f, nf, "status");
            assert_true(c_sha >= 0 && c_err >= 0 && c_st >= 0);
            continue;
        }
        assert_true(nf > c_err);
        if (strcmp(f[c_st], "exact") != 0 && strcmp(f[c_st], "interpolated") != 0) continue;
        assert_true(nt < MAX_TRACES);
        snprintf(sha[nt], 80, "%s", f[c_sha]);
        v[nt++] = atof(f[c_err]);
    }
    assert_int_equal(pclose(p), 0);
    return nt;
}

static void cell_of(const char *name, const char *model, const char *second, int col, kvs_test_iv *iv) {
    char *text = block(name);
    char first[64], cell[200];
    snprintf(first, sizeof first, "%s (7)", model);
    if (kvs_test_block_cell(text, first, second, KVS_TEST_CELL_EXACT, col, cell, sizeof cell) != 1)
        fail_msg("%s: no row '%s | %s'", name, first, second);
    free(text);
    assert_int_equal(kvs_test_parse_iv(cell, iv), 3);
}

static void test_n_ea_1_means_from_the_per_trace_values(void **state) {
    (void)state;
    const char *pol[2] = {"ea", "qfilters"}, *row[2] = {"Expected Attention", "Q-Filters"};
    for (int m = 0; m < 2; m++)
        for (int k = 0; k < 2; k++) {
            char sha[MAX_TRACES][80];
            double v[MAX_TRACES], s = 0;
            int n = per_trace(k_models[m], pol[k], 128.0 * k_slot[m], sha, v);
            assert_int_equal(n, 7);
            for (int t = 0; t < n; t++) s += v[t];
            kvs_test_iv iv;
            cell_of("N-EA-1", k_models[m], row[k], 2, &iv);
            if (!kvs_test_sig_equal(iv.mean, s / n, 3))
                fail_msg("%s %s: printed %g, by hand %.6g", k_models[m], pol[k], iv.mean, s / n);
            assert_true(iv.lo <= s / n && s / n <= iv.hi);
        }
}

static void test_n_ea_2_pair_from_the_per_trace_values(void **state) {
    (void)state;
    for (int m = 0; m < 2; m++) {
        char sa[MAX_TRACES][80], sb[MAX_TRACES][80];
        double va[MAX_TRACES], vb[MAX_TRACES], s = 0;
        int na = per_trace(k_models[m], "ea", 128.0 * k_slot[m], sa, va);
        int nb = per_trace(k_models[m], "tova", 128.0 * k_slot[m], sb, vb);
        int n = 0;
        for (int i = 0; i < na; i++)
            for (int j = 0; j < nb; j++)
                if (!strcmp(sa[i], sb[j])) s += va[i] - vb[j], n++;
        assert_true(n > 0);
        kvs_test_iv iv;
        cell_of("N-EA-2", k_models[m], "Expected Attention − TOVA", 2, &iv);
        if (!kvs_test_sig_equal(iv.mean, s / n, 3))
            fail_msg("%s: printed %g, by hand %.6g over %d traces", k_models[m], iv.mean, s / n, n);
        assert_int_equal(iv.n_of, n == 7 ? 0 : n);
        assert_true(iv.lo <= s / n && s / n <= iv.hi);
    }
}

static void test_resolved_exactly_when_the_interval_excludes_zero(void **state) {
    (void)state;
    char *text = block("N-EA-2");
    int count = 0;
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *cells[8];
        int nc = kvs_test_row_cells(line, cells, 8);
        for (int c = 2; nc == 4 && c < 4; c++) {
            if (!strstr(cells[c], "resolved")) continue;
            kvs_test_iv iv;
            assert_int_equal(kvs_test_parse_iv(cells[c], &iv), 3);
            int excludes = iv.lo > 0 || iv.hi < 0;
            int said = strstr(cells[c], "not resolved") == NULL;
            if (excludes != said) fail_msg("N-EA-2: '%s'", cells[c]);
            count++;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(text);
    assert_true(count >= 16);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_n_ea_1_means_from_the_per_trace_values),
        cmocka_unit_test(test_n_ea_2_pair_from_the_per_trace_values),
        cmocka_unit_test(test_resolved_exactly_when_the_interval_excludes_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
