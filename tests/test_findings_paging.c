/* test_findings_paging.c — the section "Paged caches: what page granularity costs each policy" of
 * examples/FINDINGS.md (examples/findings/paging.sh, run once through `examples/findings.sh --only paging` on the
 * shared models), recomputed another way from what the script left under its $OUT:
 *  - P-1: the window's paired difference (pages of 16 − token level) at 4 KiB resident on each model, as the mean of
 *    the per-trace differences of `kvsim compare --per-trace --csv` (each row's page read from its run in
 *    `kvsim runs --csv`, since the per-trace CSV names no page);
 *  - P-4: H2O's paired difference (pages ranked by max score − by count) at 12 KiB resident on stories260K, the same
 *    way (each run's rule read from `kvsim runs --csv`'s page_score);
 *  - every "resolved" of P-1, P-2 and P-4 holds exactly when the interval printed beside it excludes 0.
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

#define MAX_RUNS 1024

static const char *const k_models[2] = {"stories260K", "tinystories-656K"};

/* The section's $OUT, the script run once for the whole file; skips when it cannot run here. */
static const char *section(void) {
    const char *out = NULL;
    if (kvs_test_findings_once("paging", &out) == 0) skip();
    if (!out) fail_msg("findings.sh --check --only paging failed");
    return out;
}

static char *block(const char *name) {
    char *s = kvs_test_findings_block(section(), name);
    assert_non_null(s);
    return s;
}

/* The page size of every run of a model's database, indexed by run id (-1: no such run), and its page score rule
 * (1: max, 0: the count rule). */
static void run_pages(const char *model, int *page, int *by_max) {
    for (int i = 0; i < MAX_RUNS; i++) page[i] = -1, by_max[i] = 0;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' runs '%s/paging_%s.db' --csv --summary", getenv("KVSIM_BIN"), section(), model);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char line[1 << 16];
    char *f[400];
    int c_id = -1, c_page = -1, c_rule = -1;
    for (int row = 0; fgets(line, sizeof line, p); row++) {
        int nf = kvs_test_csv_fields(line, f, 400);
        if (row == 0) {
            c_id = kvs_test_csv_col(f, nf, "run_id"), c_page = kvs_test_csv_col(f, nf, "page");
            c_rule = kvs_test_csv_col(f, nf, "page_score");
            assert_true(c_id >= 0 && c_page >= 0 && c_rule >= 0);
            continue;
        }
        assert_true(nf > c_id && nf > c_page && nf > c_rule);
        int id = atoi(f[c_id]);
        assert_true(id > 0 && id < MAX_RUNS);
        page[id] = atoi(f[c_page]);
        by_max[id] = !strcmp(f[c_rule], "max");
    }
    assert_int_equal(pclose(p), 0);
}

/* A policy's paired difference of err at X resident bytes from the per-trace values: rules 0 = pages of 16 − token
 * level, 1 = pages of 16 by max score − by count (token-level runs left out); *n receives the traces where both
 * have a value. */
static double pair_by_hand(const char *model, const char *policy, int rules, double X, int *n) {
    static int page[MAX_RUNS], by_max[MAX_RUNS];
    run_pages(model, page, by_max);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' compare '%s/paging_%s.db' --match mem --at %.17g --per-trace --csv --policy %s "
             "--metric out_err_mean",
             getenv("KVSIM_BIN"), section(), model, X, policy);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char line[1 << 16];
    char *f[64];
    static kvs_test_trace_pairs tp;
    memset(&tp, 0, sizeof tp);
    int c_sha = -1, c_run = -1, c_err = -1, c_st = -1;
    for (int row = 0; fgets(line, sizeof line, p); row++) {
        int nf = kvs_test_csv_fields(line, f, 64);
        if (row == 0) {
            c_sha = kvs_test_csv_col(f, nf, "trace_sha256"), c_run = kvs_test_csv_col(f, nf, "run_lo");
            c_err = kvs_test_csv_col(f, nf, "out_err_mean"), c_st = kvs_test_csv_col(f, nf, "status");
            assert_true(c_sha >= 0 && c_run >= 0 && c_err >= 0 && c_st >= 0);
            continue;
        }
        assert_true(nf > c_err);
        if (strcmp(f[c_st], "exact") != 0 && strcmp(f[c_st], "interpolated") != 0) continue;
        int id = atoi(f[c_run]);
        assert_true(id > 0 && id < MAX_RUNS && (page[id] == 0 || page[id] == 16));
        if (rules && page[id] == 0) continue;
        int k = rules ? by_max[id] : page[id] == 16;
        /* one series per (trace, page, rule) */
        assert_int_equal(kvs_test_trace_pairs_add(&tp, f[c_sha], k, atof(f[c_err])), 1);
    }
    assert_int_equal(pclose(p), 0);
    double mean = kvs_test_trace_pairs_mean(&tp, n);
    assert_true(*n > 0);
    return mean;
}

static void test_p1_window_pair_from_the_per_trace_values(void **state) {
    (void)state;
    char *p1 = block("P-1");
    for (int m = 0; m < 2; m++) {
        char first[64], rowkey[32], cell[160];
        /* the row "| MODEL (7) | window | 4KiB | ..." */
        const char *r = NULL;
        for (const char *q = p1; (q = strstr(q, "| window | 4KiB |")) != NULL; q++) {
            const char *bol = q;
            while (bol > p1 && bol[-1] != '\n') bol--;
            if (strncmp(bol + 2, k_models[m], strlen(k_models[m])) == 0 && bol[2 + strlen(k_models[m])] == ' ') {
                r = bol;
                break;
            }
        }
        if (!r) fail_msg("P-1 has no window row at 4KiB for %s", k_models[m]);
        const char *bar = strchr(r + 2, '|');
        if (!bar) fail_msg("P-1's window row at 4KiB for %s has one cell", k_models[m]);
        snprintf(first, sizeof first, "%.*s", (int)(bar - (r + 2) - 1), r + 2);
        snprintf(rowkey, sizeof rowkey, "window");
        /* the second cell is the policy; the pair is cell 5 of the first window row at 4KiB: find it by the level */
        char *copy = strdup(r);
        assert_non_null(copy);
        char *nl = strchr(copy, '\n');
        if (nl) *nl = 0;
        char *cells[8];
        assert_int_equal(kvs_test_row_cells(copy, cells, 8), 6);
        assert_string_equal(cells[1], rowkey);
        assert_string_equal(cells[2], "4KiB");
        snprintf(cell, sizeof cell, "%s", cells[5]);
        free(copy);
        kvs_test_iv iv;
        assert_int_equal(kvs_test_parse_iv(cell, &iv), 3);
        int n = 0;
        double d = pair_by_hand(k_models[m], "window", 0, 4096, &n);
        if (!kvs_test_sig_equal(iv.mean, d, 3))
            fail_msg("%s: printed %g, by hand %.6g over %d traces (%s)", first, iv.mean, d, n, cell);
        assert_int_equal(iv.n_of, n == 7 ? 0 : n);
        assert_true(iv.lo <= d && d <= iv.hi);
        assert_true(d > 0); /* pages cost the window resident memory: more error at equal bytes */
    }
    free(p1);
}

/* P-4: H2O on stories260K at 12 KiB, max − count, recomputed from the per-trace values. */
static void test_p4_h2o_rule_pair_from_the_per_trace_values(void **state) {
    (void)state;
    char *p4 = block("P-4");
    const char *r = strstr(p4, "| stories260K (7) | H2O | 12KiB |");
    if (!r) fail_msg("P-4 has no H2O row at 12KiB for stories260K");
    char *copy = strdup(r);
    assert_non_null(copy);
    char *nl = strchr(copy, '\n');
    if (nl) *nl = 0;
    char *cells[8];
    assert_int_equal(kvs_test_row_cells(copy, cells, 8), 6);
    kvs_test_iv iv;
    assert_int_equal(kvs_test_parse_iv(cells[5], &iv), 3);
    int n = 0;
    double d = pair_by_hand("stories260K", "h2o", 1, 12288, &n);
    if (!kvs_test_sig_equal(iv.mean, d, 3)) fail_msg("printed %g, by hand %.6g over %d traces (%s)", iv.mean, d, n, cells[5]);
    assert_int_equal(iv.n_of, n == 7 ? 0 : n);
    assert_true(iv.lo <= d && d <= iv.hi);
    assert_true(d != 0); /* the two rules attend different pages somewhere */
    free(copy);
    free(p4);
}

/* Every "resolved" / "not resolved" of a table block against the interval of the same cell; returns the count. */
static int check_resolved(const char *name) {
    char *text = block(name);
    int count = 0;
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *cells[8];
        int nc = kvs_test_row_cells(line, cells, 8);
        if (nc == 6 && strstr(cells[5], "resolved")) {
            kvs_test_iv iv;
            assert_int_equal(kvs_test_parse_iv(cells[5], &iv), 3);
            int excludes = iv.lo > 0 || iv.hi < 0;
            int said = strstr(cells[5], "not resolved") == NULL;
            if (excludes != said) fail_msg("%s: '%s'", name, cells[5]);
            count++;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(text);
    return count;
}

static void test_resolved_exactly_when_the_interval_excludes_zero(void **state) {
    (void)state;
    int n = check_resolved("P-1") + check_resolved("P-2") + check_resolved("P-4");
    assert_true(n >= 25);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_p1_window_pair_from_the_per_trace_values),
        cmocka_unit_test(test_p4_h2o_rule_pair_from_the_per_trace_values),
        cmocka_unit_test(test_resolved_exactly_when_the_interval_excludes_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
