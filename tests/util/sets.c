/* sets.c — TEST HELPER: sorted position sets per cell; see sets.h. */
#include "sets.h"

#include <stdlib.h>
#include <string.h>

kvs_status kvs_test_sets_init(kvs_test_sets *s, size_t n_cells, int64_t width) {
    s->n_cells = n_cells;
    s->width = width;
    s->data = calloc(n_cells * (size_t)width, sizeof *s->data);
    s->n = malloc(n_cells * sizeof *s->n);
    if (!s->data || !s->n) {
        kvs_test_sets_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "test sets: out of memory");
    }
    for (size_t c = 0; c < n_cells; c++) s->n[c] = -1;
    return KVS_OK;
}

void kvs_test_sets_free(kvs_test_sets *s) {
    free(s->data);
    free(s->n);
    s->data = NULL;
    s->n = NULL;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

void kvs_test_sets_put(kvs_test_sets *s, size_t cell, const int32_t *idx, int64_t n) {
    int32_t *dst = s->data + cell * (size_t)s->width;
    memcpy(dst, idx, (size_t)n * sizeof *idx);
    qsort(dst, (size_t)n, sizeof *idx, cmp_i32);
    s->n[cell] = n;
}

const int32_t *kvs_test_sets_get(const kvs_test_sets *s, size_t cell) { return s->data + cell * (size_t)s->width; }

int64_t kvs_test_sets_diff(const kvs_test_sets *a, const kvs_test_sets *b, int64_t *compared) {
    int64_t seen = 0, first = -1;
    for (size_t c = 0; c < a->n_cells && first < 0; c++) {
        if (a->n[c] != b->n[c] ||
            memcmp(kvs_test_sets_get(a, c), kvs_test_sets_get(b, c), (size_t)(a->n[c] > 0 ? a->n[c] : 0) * sizeof(int32_t)))
            first = (int64_t)c;
        seen += a->n[c] > 0;
    }
    if (compared) *compared = seen;
    return first;
}
