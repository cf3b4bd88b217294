/* test_findings_newer_chunk.c — the section "Newer chunk and score methods" of examples/FINDINGS.md
 * (examples/findings/newer_chunk.sh, run once through `examples/findings.sh --only newer_chunk` on the shared models),
 * recomputed another way from what the script left under its $OUT:
 *  - N-C-3: LagKV's mean attended size on every prompt trace against a step-by-step simulation of §2.4's recursive
 *    rule written here (the script uses the closed-form |Res(n)|), equal to the last bit of a double sum; and the
 *    printed ratio is 1;
 *  - N-C-2: ChunkKV − SnapKV (CH3) at the larger compared bytes of each model, as the mean of the per-trace
 *    differences of `kvsim compare --per-trace --csv`;
 *  - every "resolved" of N-C-2 holds exactly when the interval printed beside it excludes 0.
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

static const char *section(void) {
    const char *out = NULL;
    if (kvs_test_findings_once("newer_chunk", &out) == 0) skip();
    if (!out) fail_msg("findings.sh --check --only newer_chunk failed");
    return out;
}

static char *block(const char *name) {
    char *s = kvs_test_findings_block(section(), name);
    assert_non_null(s);
    return s;
}

/* §2.4's rule applied one position at a time (sink S, lag L, keep per partition): the attended size of every decode
 * step p (P <= p < N) summed, the triggering step attending before it compresses. */
static double lag_mean_attended(int64_t P, int64_t N, int64_t S, int64_t L, int64_t keep) {
    int64_t res = 0, base = S;
    double sum = 0;
    for (int64_t p = 0; p < N; p++) {
        res++; /* position p arrives */
        if (p >= P) sum += (double)res;
        if (p + 1 < P) continue; /* the prompt is appended whole; the rule runs at its end */
        if (res >= base + 2 * L) {
            int64_t M = (res - base) / L;
            res -= (M - 1) * (L - keep);
            base += (M - 1) * keep;
        }
    }
    return sum / (double)(N - P);
}

static void test_lagkv_attended_by_simulation(void **state) {
    (void)state;
    int checked = 0;
    for (int m = 0; m < 2; m++) {
        kvs_test_trace_shape t[MAX_TRACES];
        int nt = kvs_test_findings_prompts(section(), k_models[m], t, MAX_TRACES);
        assert_true(nt > 0);
        for (int i = 0; i < nt; i++) {
            static char cmd[16384];
            snprintf(cmd, sizeof cmd, "'%s' runs '%s/newer_chunk_%s.db' --csv --summary --policy lagkv --trace '%s'",
                     getenv("KVSIM_BIN"), section(), k_models[m], t[i].path);
            FILE *p = popen(cmd, "r");
            assert_non_null(p);
            static char line[1 << 16];
            char *f[400];
            int c_par = -1, c_att = -1;
            for (int row = 0; fgets(line, sizeof line, p); row++) {
                int nf = kvs_test_csv_fields(line, f, 400);
                if (row == 0) {
                    c_par = kvs_test_csv_col(f, nf, "params"), c_att = kvs_test_csv_col(f, nf, "attended_tokens_mean");
                    assert_true(c_par >= 0 && c_att >= 0);
                    continue;
                }
                int64_t keep = strstr(f[c_par], "ratio=0.125") ? 16 : strstr(f[c_par], "ratio=0.5,") ? 64 : -1;
                assert_true(keep > 0);
                assert_non_null(strstr(f[c_par], "sink=16,lag=128,"));
                double want = lag_mean_attended(t[i].P, t[i].N, 16, 128, keep), got = atof(f[c_att]);
                if (!(fabs(got - want) <= 1e-12 * want))
                    fail_msg("%s %s: attended %.17g, simulated %.17g", t[i].path, f[c_par], got, want);
                checked++;
            }
            assert_int_equal(pclose(p), 0);
        }
    }
    assert_true(checked >= 4);
    char *b = block("N-C-3");
    int rows = 0;
    for (char *line = b; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *cells[8];
        if (kvs_test_row_cells(line, cells, 8) == 8 && strncmp(cells[1], "LagKV (", 7) == 0) {
            kvs_test_iv iv;
            assert_true(kvs_test_parse_iv(cells[2], &iv) >= 1);
            assert_true(iv.mean == 1.0);
            rows++;
        }
        line = nl ? nl + 1 : NULL;
    }
    assert_int_equal(rows, 4);
    free(b);
}

/* Mean over the traces of (ChunkKV − SnapKV gqa=mean) err at X, from the per-trace comparison. */
static double ch3_by_hand(const char *model, double X, int *n) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' compare '%s/newer_chunk_%s.db' --match mem --at %.17g --per-trace --csv "
             "--metric out_err_mean", getenv("KVSIM_BIN"), section(), model, X);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char line[1 << 16];
    static char *f[400];
    static kvs_test_trace_pairs tp;
    memset(&tp, 0, sizeof tp);
    int c_sha = -1, c_pol = -1, c_par = -1, c_err = -1, c_st = -1;
    for (int row = 0; fgets(line, sizeof line, p); row++) {
        int nf = kvs_test_csv_fields(line, f, 400);
        if (row == 0) {
            c_sha = kvs_test_csv_col(f, nf, "trace_sha256"), c_pol = kvs_test_csv_col(f, nf, "policy");
            c_par = kvs_test_csv_col(f, nf, "params"), c_err = kvs_test_csv_col(f, nf, "out_err_mean");
            c_st = kvs_test_csv_col(f, nf, "status");
            assert_true(c_sha >= 0 && c_pol >= 0 && c_par >= 0 && c_err >= 0 && c_st >= 0);
            continue;
        }
        assert_true(nf > c_st);
        if (strcmp(f[c_st], "exact") != 0 && strcmp(f[c_st], "interpolated") != 0) continue;
        assert_true(nf > c_err);
        /* side 1 ChunkKV, side 0 SnapKV (gqa=mean): the pairs' mean is ChunkKV − SnapKV */
        int k = !strcmp(f[c_pol], "chunkkv") ? 1 : !strcmp(f[c_pol], "snapkv") && strstr(f[c_par], "gqa=mean") ? 0 : -1;
        if (k < 0) continue;
        assert_int_equal(kvs_test_trace_pairs_add(&tp, f[c_sha], k, atof(f[c_err])), 1); /* one value a trace */
    }
    assert_int_equal(pclose(p), 0);
    double mean = kvs_test_trace_pairs_mean(&tp, n);
    assert_true(*n > 0);
    return mean;
}

static void test_ch3_pair_from_the_per_trace_values(void **state) {
    (void)state;
    char *b = block("N-C-2");
    for (int m = 0; m < 2; m++) {
        kvs_test_trace_shape t[MAX_TRACES];
        assert_true(kvs_test_findings_prompts(section(), k_models[m], t, MAX_TRACES) > 0);
        double X = 128.0 * 2 * (double)t[0].d * 2; /* the larger level: 128 tokens' K/V of 2-byte elements */
        char first[64], at[32];
        snprintf(first, sizeof first, "%s (7)", k_models[m]);
        snprintf(at, sizeof at, "%.0f", X);
        const char *row = kvs_test_block_row(b, first, at, KVS_TEST_CELL_EXACT); /* CH3 comes first */
        if (!row) fail_msg("N-C-2 has no row for %s at %s", first, at);
        char *copy = strdup(row);
        assert_non_null(copy);
        char *nl = strchr(copy, '\n');
        if (nl) *nl = 0;
        char *cells[8];
        assert_int_equal(kvs_test_row_cells(copy, cells, 8), 4);
        assert_non_null(strstr(cells[2], "CH3"));
        kvs_test_iv iv;
        assert_int_equal(kvs_test_parse_iv(cells[3], &iv), 3);
        int n = 0;
        double d = ch3_by_hand(k_models[m], X, &n);
        if (!kvs_test_sig_equal(iv.mean, d, 3)) fail_msg("%s: printed %g, by hand %.6g over %d traces", first, iv.mean, d, n);
        assert_true(iv.lo <= d && d <= iv.hi);
        free(copy);
    }
    free(b);
}

static void test_resolved_exactly_when_the_interval_excludes_zero(void **state) {
    (void)state;
    char *text = block("N-C-2");
    int count = 0;
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *cells[8];
        if (kvs_test_row_cells(line, cells, 8) == 4 && strstr(cells[3], "resolved")) {
            kvs_test_iv iv;
            assert_int_equal(kvs_test_parse_iv(cells[3], &iv), 3);
            int excludes = iv.lo > 0 || iv.hi < 0;
            int said = strstr(cells[3], "not resolved") == NULL;
            if (excludes != said) fail_msg("N-C-2: '%s'", cells[3]);
            count++;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(text);
    assert_true(count >= 12);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lagkv_attended_by_simulation),
        cmocka_unit_test(test_ch3_pair_from_the_per_trace_values),
        cmocka_unit_test(test_resolved_exactly_when_the_interval_excludes_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
