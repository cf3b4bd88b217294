/* findings_blocks.h — TEST HELPER: reading what `examples/findings.sh` wrote for the tests that recompute a section
 * of examples/FINDINGS.md another way (tests/test_findings_*.c): the cells, intervals and "KEY number" phrases of its
 * generated blocks (out/blocks/NAME.md, Markdown tables "| a | b | ... |" and "- ..." lines), the prompt traces
 * under out/prompts/MODEL/ with their shapes, and the columns of kvsim's CSV outputs. No cmocka here (bench
 * programs link these objects too): every function returns what it found, and the test asserts on it.
 */
#ifndef KVS_TEST_FINDINGS_BLOCKS_H
#define KVS_TEST_FINDINGS_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

/*! kvs_test_row_cells() : splits the table row `line` ("| a | b | c |", ending at NUL) into its cells, in place, each
 *  trimmed of spaces and newlines; at most max. @return the count, 0 when the line is not a row or is the header
 *  rule ("|---..."). */
int kvs_test_row_cells(char *line, char **cells, int max);

/* How kvs_test_block_row matches the second cell. */
enum { KVS_TEST_CELL_EXACT = 0, KVS_TEST_CELL_PREFIX = 1 };

/*! kvs_test_block_row() : the first table row of `text` whose first cell is `first` and whose second cell is
 *  `second` (match KVS_TEST_CELL_EXACT) or starts with it (KVS_TEST_CELL_PREFIX; "" matches any), both compared
 *  without their surrounding spaces. @return a pointer to the row's line in text, NULL when there is none. */
const char *kvs_test_block_row(const char *text, const char *first, const char *second, int match);

/*! kvs_test_block_cell() : cell `col` (0 = the first) of the row kvs_test_block_row finds, trimmed, into out (cap
 *  bytes). @return 1; 0 when there is no such row; -1 when the row has no cell col or it does not fit in cap. */
int kvs_test_block_cell(const char *text, const char *first, const char *second, int match, int col, char *out,
                        size_t cap);

/*! kvs_test_block_after() : the number right after `key` on the first line of `text` that starts with `start`
 *  and holds `key`, in *v. @return 1, or 0 when there is no such line. */
int kvs_test_block_after(const char *text, const char *start, const char *key, double *v);

/* A printed mean with its interval: "m [lo, hi]", optionally followed by " (n = K of N)". */
typedef struct {
    double mean, lo, hi;
    int n_of; /* K of "(n = K of N)": the traces that had a value; 0 when the cell does not say (all of them) */
} kvs_test_iv;

/*! kvs_test_parse_iv() : reads a cell "m [lo, hi] ..." (or "m" alone). @return how many of m, lo, hi it read (3
 *  for a mean with its interval, 1 for a mean alone, 0 for "-" or words). */
int kvs_test_parse_iv(const char *cell, kvs_test_iv *v);

/*! kvs_test_sig_equal() : 1 when `printed` is `value` printed with `sig` significant figures (%.{sig}g): within
 *  half a unit of the last printed digit of `value`; else 0. */
int kvs_test_sig_equal(double printed, double value, int sig);

/* A trace's shape, from its header. */
typedef struct {
    char path[512];
    int64_t P;        /* prompt positions */
    int64_t N;        /* positions */
    int64_t T;        /* decode steps: N - P */
    int64_t H;        /* KV heads */
    int64_t G;        /* query heads per KV head */
    int64_t d;        /* head_dim */
    int64_t kv_bytes; /* bytes of one captured K or V element */
} kvs_test_trace_shape;

/*! kvs_test_trace_shape_of() : opens the trace at `path` and fills *t. @return 0, or -1 when it cannot be read. */
int kvs_test_trace_shape_of(const char *path, kvs_test_trace_shape *t);

/*! kvs_test_findings_prompts() : the prompt traces the findings script wrote for `model` (the .kvt files of
 *  out/prompts/MODEL, out being the script's $OUT) with their shapes, sorted by path, into t[0..max). @return the
 *  count, or -1 when the folder or a trace cannot be read or there are more than max. */
int kvs_test_findings_prompts(const char *out, const char *model, kvs_test_trace_shape *t, int max);

/*! kvs_test_csv_col() : the index of the first of fields[0..nf) (a CSV header split by kvs_test_csv_fields) equal to
 *  `name`, or -1. */
int kvs_test_csv_col(char *const *fields, int nf, const char *name);

/* Per-trace values of two sides (0 and 1) of a paired difference, keyed by the trace's content hash: what a test
 * reads from `kvsim compare --per-trace` to recompute a block's paired mean another way. */
#define KVS_TEST_PAIR_TRACES 16
typedef struct {
    char sha[KVS_TEST_PAIR_TRACES][80];
    double v[2][KVS_TEST_PAIR_TRACES];
    int has[2][KVS_TEST_PAIR_TRACES];
    int n_traces;
} kvs_test_trace_pairs;

/*! kvs_test_trace_pairs_add() : side k's value v on the trace `sha` (a new trace takes the next slot). @return 1, 0
 *  when side k already had a value on that trace (the old one kept), -1 when there is no slot left. */
int kvs_test_trace_pairs_add(kvs_test_trace_pairs *tp, const char *sha, int k, double v);

/*! kvs_test_trace_pairs_mean() : the mean of v[1] - v[0] over the traces where both sides have a value; *n receives
 *  their count (NAN when 0). */
double kvs_test_trace_pairs_mean(const kvs_test_trace_pairs *tp, int *n);

#endif /* KVS_TEST_FINDINGS_BLOCKS_H */
