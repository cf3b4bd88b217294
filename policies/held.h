/* held.h — the held list of a score-based eviction policy: the positions one cache holds, one fp64 score per
 * entry, and the two decisions every such policy takes on it: evict the lowest-scoring entry of a range, or keep
 * the N best of a range (and everything outside it). One tie rule for both, POLICY_SPEC §1.4: the older position
 * wins a tie (the NEWER one is evicted; the OLDER one is kept).
 *
 * Used by H2O, Keyformer and D2O (accumulated attention), Scissorhands (minus the unimportance count), TOVA (this
 * step's attention) and MorphKV (the fused score of a compression): policies/<name>.c. What differs between them
 * stays in the policy: where the scores come from, which ranges are protected (recent window, sinks, the current
 * token), and the per-entry data that moves with an entry (D2O's K/V rows, Scissorhands' flag ring, MorphKV's
 * profile columns: compacted by the policy with the same keep mask, kvs_held_mark_top() + kvs_held_compact()).
 *
 * Entries are indexed 0..count-1 in the order they were pushed, which is ascending position order (the policies
 * push the prompt, then one token per decode step); "older" is "lower index". Scores are fp64 so that the
 * policies' sums (fp32 attention added in fp64, in the policy's order) are kept bit for bit: the helper never
 * reorders an addition.
 *
 * Ownership: a kvs_held is owned by its creator (one per cache: per query head or per KV head) and freed with
 * kvs_held_free(); the arrays returned by kvs_held_pos()/kvs_held_score() are borrowed and valid until the next
 * call that changes the count or the capacity. Not thread-safe (one instance, one thread, as the policies).
 */
#ifndef KVS_POLICIES_HELD_H
#define KVS_POLICIES_HELD_H

#include <stdint.h>

#include "../common/kvs.h"

typedef struct kvs_held kvs_held;

/*! kvs_held_create() : an empty list with room for `cap` entries (at least 1). @return NULL when out of memory
 *  (the caller reports it under its own name). Caller owns; free with kvs_held_free(). */
kvs_held *kvs_held_create(int64_t cap);

/*! kvs_held_free() : accepts NULL. */
void kvs_held_free(kvs_held *h);

/*! kvs_held_reserve() : room for at least `need` entries (the capacity at least doubles when it grows, so a list
 *  pushed one entry at a time reallocates rarely); the entries are kept. KVS_ERR_NOMEM when out of memory (the
 *  entries and the capacity unchanged). */
kvs_status kvs_held_reserve(kvs_held *h, int64_t need);

/*! kvs_held_resize() : capacity exactly max(cap, count, 1), growing or shrinking (MorphKV gives back a long
 *  prompt's room after its first compression); the entries are kept. KVS_ERR_NOMEM when out of memory (the
 *  entries kept; the capacity is the smaller of the old one and the request). */
kvs_status kvs_held_resize(kvs_held *h, int64_t cap);

/*! kvs_held_count() : entries held. */
int64_t kvs_held_count(const kvs_held *h);

/*! kvs_held_pos() : [count] the held positions, ascending. Borrowed. */
const int32_t *kvs_held_pos(const kvs_held *h);

/*! kvs_held_score() : [count] the scores, aligned with kvs_held_pos(); the policy may write them (its colsum of a
 *  prefill adds into them, TOVA and MorphKV overwrite them). Borrowed. */
double *kvs_held_score(kvs_held *h);

/*! kvs_held_copy() : the held positions into out (capacity >= count), the stored() callback's job; @return count. */
int64_t kvs_held_copy(const kvs_held *h, int32_t *out);

/*! kvs_held_push() : appends position p with score 0 (a new token has no attention yet). Requires room
 *  (kvs_held_reserve) and p greater than the last held position (internal invariants). */
void kvs_held_push(kvs_held *h, int32_t p);

/*! kvs_held_reset_scores() : every score 0, for a policy that scores afresh (TOVA's attention of one step). */
void kvs_held_reset_scores(kvs_held *h);

/*! kvs_held_add() : score[j] += a[j] for every entry (one query head's probabilities over the held entries, in
 *  their order: the engine's feedback to an accumulating policy). */
void kvs_held_add(kvs_held *h, const float *a);

/*! kvs_held_add_f64() : score[j] += t[j] for j < n (n <= count): a score the policy computed in fp64 over the first
 *  n entries (Keyformer's Gumbel-softmax of a prompt query over the entries visible to it). */
void kvs_held_add_f64(kvs_held *h, const double *t, int64_t n);

/*! kvs_held_add_heads() : score[j] += the sum (mean != 0: the mean) over the n_heads rows probs[g][j], through
 *  kvs_heads_add (common/kvs_math.h: fp64 in head order), the GQA group's attention of one step. */
void kvs_held_add_heads(kvs_held *h, const float *const *probs, int n_heads, int mean);

/*! kvs_held_lowest() : the index in [lo, hi) of the lowest score, the LATER (newer) one among equals: the entry an
 *  eviction takes. @return lo when the range holds at most one entry (lo is then the eviction: a window's oldest,
 *  or D2O's first non-sink). Requires 0 <= lo < count, hi <= count. Exactly the scan
 *      v = lo; for j in (lo, hi): if score[j] <= score[v]: v = j
 *  so for a NaN score (never produced from finite attention) the comparisons decide: a NaN at lo stays the
 *  victim, a NaN elsewhere is never chosen. */
int64_t kvs_held_lowest(const kvs_held *h, int64_t lo, int64_t hi);

/*! kvs_held_scores_of() : the policy.h scores() answer of a held list whose entries [lo, hi) are ranked by score and
 *  every other entry is kept whatever its score (sinks before lo, a recent window from hi): out[j] = the score of
 *  position idx[j] when its entry lies in [lo, hi), INFINITY otherwise (also for a position not held). lo, hi are
 *  clamped to [0, count]. */
void kvs_held_scores_of(const kvs_held *h, int64_t lo, int64_t hi, const int32_t *idx, int64_t n, double *out);

/*! kvs_held_remove() : drops entry j (0 <= j < count); the later entries move down one place. */
void kvs_held_remove(kvs_held *h, int64_t j);

/*! kvs_held_drop_before() : drops every entry whose position is below `first` (the oldest ones: a sliding-window
 *  layer's host eviction, sim/policy.h window_evict); the others keep their order and scores. @return how many. */
int64_t kvs_held_drop_before(kvs_held *h, int32_t first);

/*! kvs_positions_drop_before() : removes the entries below `first` from the ascending positions pos[0..n) (the
 *  oldest ones: a sliding-window layer's host eviction of a policy keeping a bare position list), moving the rest
 *  down in their order. @return how many remain. */
int64_t kvs_positions_drop_before(int32_t *pos, int64_t n, int64_t first);

/*! kvs_held_top_mask() : keep[j] = 1 for the k best of score[0..n) and 0 for the others: larger score first, NaN
 *  after every number, -0 equal to +0, the lower index (older position) first among equals — kvs_topk_f64's
 *  order, so the kept set is the set of its first k. k >= n keeps all, k <= 0 none. scratch: min(k, n) int32
 *  entries of caller memory. The rule kvs_held_mark_top() applies to a range of a list. */
void kvs_held_top_mask(const double *score, int64_t n, int64_t k, char *keep, int32_t *scratch);

/*! kvs_held_mark_top() : keep[0..count): 1 for every entry outside [lo, hi) (the ranges a policy protects: sinks
 *  before lo, the recent window from hi), and inside it 1 for the k best scores (kvs_held_top_mask's rule), 0 for
 *  the others. keep: caller memory of count bytes, for a policy that compacts its own per-entry data with the
 *  same mask before kvs_held_compact(). Requires 0 <= lo <= hi <= count. */
void kvs_held_mark_top(kvs_held *h, int64_t lo, int64_t hi, int64_t k, char *keep);

/*! kvs_held_compact() : keeps the entries j with keep[j] != 0 (keep: count bytes), in their order, scores with them. */
void kvs_held_compact(kvs_held *h, const char *keep);

/*! kvs_held_keep_top() : kvs_held_mark_top() then kvs_held_compact() with the list's own mask, for a policy with no
 *  per-entry data of its own: the entries outside [lo, hi) and the k best inside it remain, in order. */
void kvs_held_keep_top(kvs_held *h, int64_t lo, int64_t hi, int64_t k);

#endif /* KVS_POLICIES_HELD_H */
