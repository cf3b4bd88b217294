/* test_findings_newer_layer.c — the section "CAKE, SimLayerKV, DuoAttention" of examples/FINDINGS.md
 * (examples/findings/newer_layer.sh, run once through `examples/findings.sh --only newer_layer` on the shared models),
 * recomputed another way from what the script left under its $OUT:
 *  - N-L-1: StreamingLLM − CAKE at 4 KiB resident on each model, as the mean of the per-trace differences of
 *    `kvsim compare --per-trace --csv` (each trace's two values), inside the printed interval;
 *  - every "resolved" of N-L-1 holds exactly when the interval printed beside it excludes 0;
 *  - N-L-2: the arithmetic column recomputed here from each prompt trace's header (prompt P and positions N: the mean
 *    over the traces of Σ n / Σ (n/2 + min(n, 320)/2), n = P+1..N), and the measured column from the per-run resident
 *    bytes of `kvsim runs --csv --summary` (full ÷ duo_heuristic per trace, then the mean); the two agree.
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
    if (kvs_test_findings_once("newer_layer", &out) == 0) skip();
    if (!out) fail_msg("findings.sh --check --only newer_layer failed");
    return out;
}

static char *block(const char *name) {
    char *s = kvs_test_findings_block(section(), name);
    assert_non_null(s);
    return s;
}

/* The cell `col` of the row "| MODEL (n) | POLICY-prefix | LEVEL | ..." of `text`, into out. */
static void row_cell(const char *text, const char *model, const char *policy, const char *level, int col, char *out,
                     size_t cap) {
    char *copy = strdup(text);
    assert_non_null(copy);
    int found = 0;
    for (char *line = copy; line && *line && !found;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *cells[8];
        int nc = kvs_test_row_cells(line, cells, 8);
        if (nc >= 5 && strncmp(cells[0], model, strlen(model)) == 0 && cells[0][strlen(model)] == ' ' &&
            strncmp(cells[1], policy, strlen(policy)) == 0 && strcmp(cells[2], level) == 0) {
            snprintf(out, cap, "%s", cells[col]);
            found = 1;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(copy);
    if (!found) fail_msg("no row %s / %s / %s", model, policy, level);
}

/* Mean over the traces of (streaming − cake) err at X resident bytes from the per-trace values; *n traces. */
static double pair_by_hand(const char *model, double X, int *n) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' compare '%s/newer_layer_%s.db' --match mem --at %.17g --per-trace --csv "
                              "--metric out_err_mean",
             getenv("KVSIM_BIN"), section(), model, X);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char line[1 << 16];
    char *f[64];
    static kvs_test_trace_pairs tp;
    memset(&tp, 0, sizeof tp);
    int c_pol = -1, c_sha = -1, c_err = -1, c_st = -1;
    for (int row = 0; fgets(line, sizeof line, p); row++) {
        int nf = kvs_test_csv_fields(line, f, 64);
        if (row == 0) {
            c_pol = kvs_test_csv_col(f, nf, "policy"), c_sha = kvs_test_csv_col(f, nf, "trace_sha256");
            c_err = kvs_test_csv_col(f, nf, "out_err_mean"), c_st = kvs_test_csv_col(f, nf, "status");
            assert_true(c_pol >= 0 && c_sha >= 0 && c_err >= 0 && c_st >= 0);
            continue;
        }
        assert_true(nf > c_st);
        int k = !strcmp(f[c_pol], "cake") ? 0 : !strcmp(f[c_pol], "streaming") ? 1 : -1;
        if (k < 0 || (strcmp(f[c_st], "exact") != 0 && strcmp(f[c_st], "interpolated") != 0)) continue;
        assert_true(nf > c_err); /* a value where the status says there is one */
        assert_int_equal(kvs_test_trace_pairs_add(&tp, f[c_sha], k, atof(f[c_err])), 1); /* one value a trace */
    }
    assert_int_equal(pclose(p), 0);
    double mean = kvs_test_trace_pairs_mean(&tp, n);
    assert_true(*n > 0);
    return mean;
}

static void test_nl1_streaming_pair_from_the_per_trace_values(void **state) {
    (void)state;
    char *b = block("N-L-1");
    for (int m = 0; m < 2; m++) {
        char cell[160];
        row_cell(b, k_models[m], "StreamingLLM", "4KiB", 4, cell, sizeof cell);
        kvs_test_iv iv;
        assert_int_equal(kvs_test_parse_iv(cell, &iv), 3);
        int n = 0;
        double d = pair_by_hand(k_models[m], 4096, &n);
        if (!kvs_test_sig_equal(iv.mean, d, 3)) fail_msg("%s: printed %g, by hand %.6g over %d traces", k_models[m], iv.mean, d, n);
        assert_int_equal(iv.n_of, n == 7 ? 0 : n);
        assert_true(iv.lo <= d && d <= iv.hi);
    }
    free(b);
}

static void test_nl1_resolved_exactly_when_the_interval_excludes_zero(void **state) {
    (void)state;
    char *text = block("N-L-1");
    int count = 0;
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *cells[8];
        if (kvs_test_row_cells(line, cells, 8) == 5 && strstr(cells[4], "resolved")) {
            kvs_test_iv iv;
            assert_int_equal(kvs_test_parse_iv(cells[4], &iv), 3);
            int excludes = iv.lo > 0 || iv.hi < 0, said = strstr(cells[4], "not resolved") == NULL;
            if (excludes != said) fail_msg("N-L-1: '%s'", cells[4]);
            count++;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(text);
    assert_true(count >= 8);
}

/* full ÷ duo_heuristic resident bytes per trace from `kvsim runs --csv --summary`, averaged over the traces. */
static double du1_measured_by_hand(const char *model) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' runs '%s/newer_layer_du1_%s.db' --csv --summary", getenv("KVSIM_BIN"), section(),
             model);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char line[1 << 16];
    char *f[400], trace[MAX_TRACES][600];
    double full[MAX_TRACES], duo[MAX_TRACES];
    int nt = 0, has[2][MAX_TRACES] = {{0}}, c_tr = -1, c_pol = -1, c_st = -1;
    for (int row = 0; fgets(line, sizeof line, p); row++) {
        int nf = kvs_test_csv_fields(line, f, 400);
        if (row == 0) {
            c_tr = kvs_test_csv_col(f, nf, "trace"), c_pol = kvs_test_csv_col(f, nf, "policy");
            c_st = kvs_test_csv_col(f, nf, "storage_bytes_mean");
            assert_true(c_tr >= 0 && c_pol >= 0 && c_st >= 0);
            continue;
        }
        int t = 0;
        while (t < nt && strcmp(trace[t], f[c_tr]) != 0) t++;
        if (t == nt) {
            assert_true(nt < MAX_TRACES);
            snprintf(trace[nt++], sizeof trace[0], "%s", f[c_tr]);
        }
        int k = !strcmp(f[c_pol], "full") ? 0 : 1;
        (k ? duo : full)[t] = atof(f[c_st]);
        has[k][t] = 1;
    }
    assert_int_equal(pclose(p), 0);
    double s = 0;
    for (int t = 0; t < nt; t++) {
        assert_true(has[0][t] && has[1][t]);
        s += full[t] / duo[t];
    }
    assert_int_equal(nt, 7);
    return s / nt;
}

static void test_nl2_ratio_by_arithmetic_and_from_the_runs(void **state) {
    (void)state;
    char *b = block("N-L-2");
    for (int m = 0; m < 2; m++) {
        kvs_test_trace_shape t[MAX_TRACES];
        int nt = kvs_test_findings_prompts(section(), k_models[m], t, MAX_TRACES);
        assert_int_equal(nt, 7);
        double arith = 0;
        for (int i = 0; i < nt; i++) {
            double sn = 0, sr = 0;
            for (int64_t n = t[i].P + 1; n <= t[i].N; n++) sn += (double)n, sr += 0.5 * (double)n + 0.5 * (n < 320 ? (double)n : 320.0);
            arith += sn / sr;
        }
        arith /= nt;
        char cell[160], first[64];
        snprintf(first, sizeof first, "%s (7)", k_models[m]);
        assert_int_equal(kvs_test_block_cell(b, first, "", KVS_TEST_CELL_PREFIX, 3, cell, sizeof cell), 1);
        kvs_test_iv iv;
        assert_true(kvs_test_parse_iv(cell, &iv) >= 1);
        if (!kvs_test_sig_equal(iv.mean, arith, 3)) fail_msg("%s arithmetic: printed %g, here %.6g", k_models[m], iv.mean, arith);
        assert_int_equal(kvs_test_block_cell(b, first, "", KVS_TEST_CELL_PREFIX, 2, cell, sizeof cell), 1);
        assert_true(kvs_test_parse_iv(cell, &iv) >= 1);
        double meas = du1_measured_by_hand(k_models[m]);
        if (!kvs_test_sig_equal(iv.mean, meas, 3)) fail_msg("%s measured: printed %g, here %.6g", k_models[m], iv.mean, meas);
        assert_true(fabs(meas - arith) < 1e-3 * arith); /* the replay's bytes are the formula's (+ the head map's bit) */
    }
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nl1_streaming_pair_from_the_per_trace_values),
        cmocka_unit_test(test_nl1_resolved_exactly_when_the_interval_excludes_zero),
        cmocka_unit_test(test_nl2_ratio_by_arithmetic_and_from_the_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
