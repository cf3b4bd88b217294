/* ref_rank.c — the leading part of the full attention's ranking, for the replay's top-k overlap (semantics in
 * ref_rank.h; POLICY_SPEC.md §1.6 topk_overlap; sim/BENCH.md "Work shared between a task's configurations").
 *
 * kvs_argsort_desc sorts all p+1 probabilities of a row at every measured step (4 radix passes over the row);
 * the overlap needs the order only down to the longest list measured. Here: one pass computes the sort keys
 * and a histogram of their top 11 bits, the boundary bucket (where the count reaches the depth) is found in it,
 * a second pass gathers the positions in the buckets up to the boundary (in ascending position), and only those
 * are radix-sorted, stably, on the whole key. Every position left out has a larger key than every one gathered,
 * so the gathered ones, sorted, are exactly the ranking's first entries.
 */
#include "ref_rank.h"

#include <string.h>

#include "../common/kvs_math.h"

#define TOP_BITS 11
#define TOP_SHIFT (32 - TOP_BITS)

size_t kvs_ref_rank_prefix(const float *x, size_t n, size_t depth, int32_t *order, uint32_t *scratch) {
    if (depth >= n) {
        kvs_argsort_desc(x, n, order, scratch);
        return n;
    }
    if (depth == 0) return 0;
    uint32_t *key = scratch;                  /* [n] every position's key, then free: the sort's second buffer */
    uint32_t *ckey = scratch + n;             /* [m] the gathered keys */
    uint32_t *cidx = scratch + 2 * n;         /* [m] their positions */
    uint32_t top[1u << TOP_BITS];
    memset(top, 0, sizeof top);
    kvs_desc_keys(x, n, key); /* kvs_argsort_desc's keys (vectors where the CPU has them) */
    for (size_t i = 0; i < n; i++) top[key[i] >> TOP_SHIFT]++;
    size_t m = 0;
    uint32_t bound = 0;
    for (;; bound++) { /* the counts add up to n > depth: the loop ends within the table */
        m += top[bound];
        if (m >= depth) break;
    }
    /* Gather keys with top bits <= bound, positions ascending; branch-free (about a third are taken, at random). */
    uint32_t limit = ((bound + 1u) << TOP_SHIFT) - 1u; /* the largest key in the boundary bucket (no overflow: bound
                                                        * < 2^11, and bound 2^11-1 gives UINT32_MAX) */
    size_t c = 0;
    for (size_t i = 0; i < n; i++) {
        ckey[c] = key[i];
        cidx[c] = (uint32_t)i;
        c += key[i] <= limit;
    }
    /* c == m. The gathered pairs sorted stably on the whole key (positions ascending among equal keys), (key,
     * order) the second buffers. */
    kvs_radix_sort_pairs(ckey, cidx, key, (uint32_t *)order, m, (uint32_t *)order); /* same width; positions < 2^31 */
    return m;
}

void kvs_ref_rank_positions(const int32_t *order, size_t m, size_t n, int32_t *rank) {
    for (size_t x = 0; x < n; x++) rank[x] = (int32_t)m;
    for (size_t r = 0; r < m; r++) rank[order[r]] = (int32_t)r;
}
