/* ref_rank.h — the replay engine's ranking of the full attention for the top-k overlap metric (../shared/DESIGN.md
 * "Metrics", POLICY_SPEC.md §1.6 topk_overlap; issue 17, sim/BENCH.md "Fifth pass").
 *
 * The top-k overlap of a list of n positions counts its members that are among the n largest probabilities of
 * the full attention row, the n largest as kvs_topk orders them (descending value, ties to the lower index,
 * -0 equal to +0, NaN last). A whole ranking (kvs_argsort_desc) answers that for every n, but the replay only
 * ever asks for n up to the longest list a configuration measures, a few hundred of a few thousand positions.
 * kvs_ref_rank_prefix() orders only a leading part of the row, at least as deep as asked: a radix select of
 * the boundary (the top 11 bits of the sort key), then an exact stable sort of the positions at or above it.
 * Membership of position x in the first n of that order is then one comparison against the n-th element, the
 * cut (kvs_ref_rank_cut_at, kvs_ref_rank_within): the same answer as rank[x] < n of the whole ranking.
 */
#ifndef KVS_REF_RANK_H
#define KVS_REF_RANK_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/*! kvs_ref_rank_prefix() : writes to order[0..m-1] the first m indices of x[0..n-1] in kvs_argsort_desc's order
 *  (exactly kvs_topk(x, n, n)'s first m) and returns m, with min(depth, n) <= m <= n: the positions whose sort
 *  key shares the boundary's top bits come along. depth >= n is the whole ranking (kvs_argsort_desc).
 *  `order` holds n entries, `scratch` at least 3*n uint32_t (caller memory, both overwritten). */
size_t kvs_ref_rank_prefix(const float *x, size_t n, size_t depth, int32_t *order, uint32_t *scratch);

/* The n-th element of a ranking: its value and position. */
typedef struct {
    float value;
    int32_t pos;
    int value_is_nan;
} kvs_ref_rank_cut;

/*! kvs_ref_rank_cut_at() : the cut of the first n (1 <= n <= the m kvs_ref_rank_prefix returned) of the ranking
 *  `order` of row x. */
static inline kvs_ref_rank_cut kvs_ref_rank_cut_at(const float *x, const int32_t *order, size_t n) {
    int32_t pos = order[n - 1];
    kvs_ref_rank_cut c = {.value = x[pos], .pos = pos, .value_is_nan = isnan(x[pos]) != 0};
    return c;
}

/*! kvs_ref_rank_within() : 1 when position `pos`, whose value in the ranked row is v, is among the first n of
 *  the ranking (c = kvs_ref_rank_cut_at(.., n)), else 0. Before the cut: a larger value, or an equal one at a
 *  lower or the same position (float == holds -0 equal to +0 and never holds for NaN, as the ranking's key).
 *  A NaN cut: every number is before it, and the NaNs up to its position. */
static inline int kvs_ref_rank_within(kvs_ref_rank_cut c, float v, int32_t pos) {
    if (c.value_is_nan) return !isnan(v) || pos <= c.pos;
    return (v > c.value) | ((v == c.value) & (pos <= c.pos));
}

/*! kvs_ref_rank_within_number() : kvs_ref_rank_within() for a cut that is a number (!c.value_is_nan), without
 *  the test: a caller's loop over a list tests the cut once. */
static inline int kvs_ref_rank_within_number(kvs_ref_rank_cut c, float v, int32_t pos) {
    return (v > c.value) | ((v == c.value) & (pos <= c.pos));
}

#endif
