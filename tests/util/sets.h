/* sets.h — TEST HELPER: position sets recorded per cell (a test's own indexing of layer, KV head, position and
 * list), kept sorted so that a policy's selection and a naive reference's can be compared as sets. Used by the
 * seed-method tests to record the engine's selections (on_select hook) beside their references'.
 */
#ifndef KVS_TEST_SETS_H
#define KVS_TEST_SETS_H

#include <stddef.h>
#include <stdint.h>

#include "../../common/kvs.h"

typedef struct {
    size_t n_cells;
    int64_t width;  /* capacity of a cell: the trace's positions */
    int32_t *data;  /* [n_cells][width], each recorded cell sorted ascending */
    int64_t *n;     /* [n_cells]: entries of each cell, -1 = not recorded */
} kvs_test_sets;

/*! kvs_test_sets_init() : n_cells unrecorded cells of `width` positions each. Free with kvs_test_sets_free. */
kvs_status kvs_test_sets_init(kvs_test_sets *s, size_t n_cells, int64_t width);
void kvs_test_sets_free(kvs_test_sets *s);

/*! kvs_test_sets_put() : records idx[0..n-1] (n <= width) in `cell`, sorted. */
void kvs_test_sets_put(kvs_test_sets *s, size_t cell, const int32_t *idx, int64_t n);

/*! kvs_test_sets_get() : the sorted entries of `cell` (its count in s->n[cell]). */
const int32_t *kvs_test_sets_get(const kvs_test_sets *s, size_t cell);

/*! kvs_test_sets_diff() : the first cell where a and b (same shape) differ, in count or entries, or -1 when every
 *  cell agrees; *compared (may be NULL) receives the number of cells a recorded. */
int64_t kvs_test_sets_diff(const kvs_test_sets *a, const kvs_test_sets *b, int64_t *compared);

#endif /* KVS_TEST_SETS_H */
