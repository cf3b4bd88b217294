/* ref_rank.h — the replay engine's ranking of the full attention for the top-k overlap metric (../shared/DESIGN.md
 * "Metrics", POLICY_SPEC.md §1.6 topk_overlap; sim/BENCH.md "Work shared between a task's configurations").
 *
 * The top-k overlap of a list of n positions counts its members that are among the n largest probabilities of
 * the full attention row, the n largest as kvs_topk orders them (descending value, ties to the lower index,
 * -0 equal to +0, NaN last). A whole ranking (kvs_argsort_desc) answers that for every n, but the replay only
 * ever asks for n up to the longest list a configuration measures, a few hundred of a few thousand positions.
 * kvs_ref_rank_prefix() orders only a leading part of the row, at least as deep as asked: a radix select of
 * the boundary (the top 11 bits of the sort key), then an exact stable sort of the positions at or above it.
 * kvs_ref_rank_positions() turns that into ranks, every position past the part ranked sharing the part's length:
 * rank[x] < n is then the whole ranking's answer for every n up to that length. (Testing x against the n-th
 * element's value and position instead costs no fill but 50% more per list entry in the replay's recall loop,
 * which measures far more entries than a row has positions.)
 */
#ifndef KVS_REF_RANK_H
#define KVS_REF_RANK_H

#include <stddef.h>
#include <stdint.h>

/*! kvs_ref_rank_prefix() : writes to order[0..m-1] the first m indices of x[0..n-1] in kvs_argsort_desc's order
 *  (exactly kvs_topk(x, n, n)'s first m) and returns m, with min(depth, n) <= m <= n: the positions whose sort
 *  key shares the boundary's top bits come along. depth >= n is the whole ranking (kvs_argsort_desc).
 *  `order` holds n entries, `scratch` at least 3*n uint32_t (caller memory, both overwritten). */
size_t kvs_ref_rank_prefix(const float *x, size_t n, size_t depth, int32_t *order, uint32_t *scratch);

/*! kvs_ref_rank_positions() : rank[x] for every position x < n of a row whose first m ranked positions are
 *  order[0..m-1] (kvs_ref_rank_prefix): its place r in the ranking when r < m, else m. So for every list length
 *  k <= m, rank[x] < k exactly when x is among the first k, as with the whole ranking's ranks. */
void kvs_ref_rank_positions(const int32_t *order, size_t m, size_t n, int32_t *rank);

#endif
