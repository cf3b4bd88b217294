/* test_findings_blocks.c — the test helpers the findings tests (tests/test_findings_*.c) read the script's output
 * with (tests/util/findings_blocks.h, kvs_test_findings_once of tests/util/testenv.h), on small texts whose answers
 * are written out here: a row's cells split and trimmed, the second cell matched exactly or as a prefix (an exact
 * "window" must not find the "window, int4" row above it), a missing row or cell told apart, the number after a key
 * on its own line only, intervals with and without "(n = K of N)", agreement to significant figures, the first of
 * two equal CSV columns, the bundled trace's shape from its header, the prompt traces of a folder sorted and
 * counted, and the findings run answered once per process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/util/findings_blocks.h"
#include "tests/util/testenv.h"

static const char k_table[] =
    "intro | not a row\n"
    "| model (traces) | policy | at 2 KiB | at 4 KiB |\n"
    "|---|---|---|---|\n"
    "| stories260K (7) | window, int4 per-token | 0.5 [0.4, 0.6] | 0.25 [0.2, 0.3] (n = 3 of 7) |\n"
    "| stories260K (7) | window | 0.125 [0.1, 0.15] | - |\n"
    "| stories260K | window | +0.01 [-0.02, +0.04], not resolved | x |\n";

#define S7 "stories260K (7)"
#define EXACT KVS_TEST_CELL_EXACT
#define PREFIX KVS_TEST_CELL_PREFIX

static void test_row_cells_are_split_and_trimmed(void **state) {
    (void)state;
    char line[] = "| a |  b c | d|\n", rule[] = "|---|---|", prose[] = "a | b";
    char *cells[8];
    assert_int_equal(kvs_test_row_cells(line, cells, 8), 3);
    assert_string_equal(cells[0], "a");
    assert_string_equal(cells[1], "b c");
    assert_string_equal(cells[2], "d");
    assert_int_equal(kvs_test_row_cells(rule, cells, 8), 0);
    assert_int_equal(kvs_test_row_cells(prose, cells, 8), 0);
    char two[] = "| a | b | c |";
    assert_int_equal(kvs_test_row_cells(two, cells, 2), 2); /* at most max */
}

static void test_rows_match_the_first_cell_exactly_and_the_second_as_asked(void **state) {
    (void)state;
    char out[64];
    /* exact: the "window" row, not the "window, int4 per-token" row above it */
    assert_int_equal(kvs_test_block_cell(k_table, S7, "window", EXACT, 2, out, sizeof out), 1);
    assert_string_equal(out, "0.125 [0.1, 0.15]");
    /* prefix: the first row whose second cell starts so */
    assert_int_equal(kvs_test_block_cell(k_table, S7, "window", PREFIX, 2, out, sizeof out), 1);
    assert_string_equal(out, "0.5 [0.4, 0.6]");
    assert_int_equal(kvs_test_block_cell(k_table, S7, "", PREFIX, 1, out, sizeof out), 1);
    assert_string_equal(out, "window, int4 per-token");
    /* the first cell is never a prefix: "stories260K" is the pairs row, not the "(7)" rows */
    assert_int_equal(kvs_test_block_cell(k_table, "stories260K", "window", EXACT, 2, out, sizeof out), 1);
    assert_string_equal(out, "+0.01 [-0.02, +0.04], not resolved");
    assert_int_equal(kvs_test_block_cell(k_table, S7, "window", EXACT, 3, out, sizeof out), 1);
    assert_string_equal(out, "-");
    assert_int_equal(kvs_test_block_cell(k_table, S7, "wind", EXACT, 2, out, sizeof out), 0);
    assert_int_equal(kvs_test_block_cell(k_table, "tinystories-656K (7)", "", PREFIX, 2, out, sizeof out), 0);
    /* no cell 5 on the row (the next row's cells do not count), and a cell longer than the buffer */
    assert_int_equal(kvs_test_block_cell(k_table, S7, "window", EXACT, 5, out, sizeof out), -1);
    assert_int_equal(kvs_test_block_cell(k_table, S7, "window", EXACT, 2, out, 8), -1);
    /* the row itself, and the next one from after it */
    const char *row = kvs_test_block_row(k_table, S7, "window", PREFIX);
    assert_non_null(row);
    assert_true(strncmp(row, "| stories260K (7) | window, int4", 32) == 0);
    const char *next = kvs_test_block_row(strchr(row, '\n') + 1, S7, "window", PREFIX);
    assert_non_null(next);
    assert_true(strncmp(next, "| stories260K (7) | window |", 28) == 0);
}

static void test_after_reads_the_number_on_the_key_line(void **state) {
    (void)state;
    const char *text = "- stories260K at 2KiB: a − b = -0.0345 [x]\n- tinystories-656K: c\nd = 7\n";
    double v = 0;
    assert_int_equal(kvs_test_block_after(text, "- stories260K at 2KiB: ", "a − b = ", &v), 1);
    assert_true(v == -0.0345);
    /* the key on a later line than the start does not count */
    assert_int_equal(kvs_test_block_after(text, "- tinystories-656K", "d = ", &v), 0);
    assert_int_equal(kvs_test_block_after(text, "- nothing", "a", &v), 0);
}

static void test_intervals_and_significant_figures(void **state) {
    (void)state;
    kvs_test_iv v;
    assert_int_equal(kvs_test_parse_iv("0.25 [0.2, 0.3] (n = 3 of 7)", &v), 3);
    assert_true(v.mean == 0.25 && v.lo == 0.2 && v.hi == 0.3 && v.n_of == 3);
    assert_int_equal(kvs_test_parse_iv("+0.01 [-0.02, +0.04], not resolved", &v), 3);
    assert_true(v.lo == -0.02 && v.hi == 0.04 && v.n_of == 0);
    assert_int_equal(kvs_test_parse_iv("0.5 (n = 1)", &v), 1);
    assert_int_equal(kvs_test_parse_iv("-", &v), 0);
    assert_int_equal(kvs_test_parse_iv("not run", &v), 0);
    assert_int_equal(kvs_test_parse_iv("", &v), 0);
    assert_true(kvs_test_sig_equal(0.123, 0.12345, 3));
    assert_false(kvs_test_sig_equal(0.124, 0.12345, 3));
    assert_true(kvs_test_sig_equal(0.1235, 0.12345, 4));  /* half a unit away: the rounding either way */
    assert_true(kvs_test_sig_equal(1.23e-5, 1.2349e-5, 3));
    assert_false(kvs_test_sig_equal(1.24e-5, 1.2349e-5, 3));
    assert_true(kvs_test_sig_equal(12300, 12345, 3));
    assert_false(kvs_test_sig_equal(12400, 12345, 3));
    assert_true(kvs_test_sig_equal(0, 0, 3));
    assert_false(kvs_test_sig_equal(1e-3, 0, 3));
}

static void test_csv_columns_by_name(void **state) {
    (void)state;
    char header[] = "policy,out_err_mean,trace,out_err_mean\n";
    char *f[8];
    int nf = kvs_test_csv_fields(header, f, 8);
    assert_int_equal(nf, 4);
    assert_int_equal(kvs_test_csv_col(f, nf, "policy"), 0);
    assert_int_equal(kvs_test_csv_col(f, nf, "out_err_mean"), 1); /* the first of two */
    assert_int_equal(kvs_test_csv_col(f, nf, "trace"), 2);
    assert_int_equal(kvs_test_csv_col(f, nf, "codec"), -1);
}

static void test_trace_shapes_and_prompt_folders(void **state) {
    (void)state;
    char trace[1024];
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    kvs_test_trace_shape t[3];
    /* the bundled trace (kvsim info: 239 prompt positions of 495; 8 query heads on 4 KV heads; head_dim 8; fp16) */
    assert_int_equal(kvs_test_trace_shape_of(trace, &t[0]), 0);
    assert_true(t[0].P == 239 && t[0].N == 495 && t[0].T == 256);
    assert_true(t[0].H == 4 && t[0].G == 2 && t[0].d == 8 && t[0].kv_bytes == 2);
    assert_string_equal(t[0].path, trace);
    assert_int_equal(kvs_test_trace_shape_of("/nonexistent/x.kvt", &t[0]), -1);

    char dir[] = "/tmp/kvs_fblocks_XXXXXX", path[256], cmd[4096];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/prompts/m", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s' '%s/b.kvt' && cp '%s' '%s/a.kvt' && echo x > '%s/notes.txt'",
             path, trace, path, trace, path, path);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(kvs_test_findings_prompts(dir, "m", t, 3), 2);
    char want[300];
    snprintf(want, sizeof want, "%s/a.kvt", path);
    assert_string_equal(t[0].path, want); /* sorted, the .txt left out */
    snprintf(want, sizeof want, "%s/b.kvt", path);
    assert_string_equal(t[1].path, want);
    assert_true(t[1].P == 239 && t[1].d == 8);
    assert_int_equal(kvs_test_findings_prompts(dir, "m", t, 1), -1);     /* more than max */
    assert_int_equal(kvs_test_findings_prompts(dir, "none", t, 3), -1);  /* no folder */
    snprintf(cmd, sizeof cmd, "echo broken > '%s/c.kvt'", path);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(kvs_test_findings_prompts(dir, "m", t, 3), -1);     /* a trace that does not open */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* Under the sanitizers the findings run is skipped (0, no folder); the answer is kept for the process: the same
 * sections answer 0 again after the variable is gone, without running the script. */
static void test_findings_run_answered_once(void **state) {
    (void)state;
    const char *saved = getenv("KVS_TEST_SANITIZED");
    setenv("KVS_TEST_SANITIZED", "1", 1);
    const char *out = (const char *)1;
    assert_int_equal(kvs_test_findings_once("no-such-section", &out), 0);
    assert_null(out);
    unsetenv("KVS_TEST_SANITIZED");
    out = (const char *)1;
    assert_int_equal(kvs_test_findings_once("no-such-section", &out), 0); /* cached: a run would fail (-1) */
    assert_null(out);
    if (saved) setenv("KVS_TEST_SANITIZED", saved, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_cells_are_split_and_trimmed),
        cmocka_unit_test(test_rows_match_the_first_cell_exactly_and_the_second_as_asked),
        cmocka_unit_test(test_after_reads_the_number_on_the_key_line),
        cmocka_unit_test(test_intervals_and_significant_figures),
        cmocka_unit_test(test_csv_columns_by_name),
        cmocka_unit_test(test_trace_shapes_and_prompt_folders),
        cmocka_unit_test(test_findings_run_answered_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
