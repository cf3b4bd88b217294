/* policy_memo.h — the replay engine's memo of scores shared between the configurations of one replay task (sim/BENCH.md
 * "Work shared between a task's configurations"). A sweep runs one policy at
 * several budgets; H2O's, Scissorhands' and TOVA's prompt column sums (kvs_attn_colsum) and SnapKV's, PyramidKV's,
 * Ada-KV's and RocketKV's observation-window scores (kvs_snapkv_scores) do not depend on the budget at a turn's
 * first prefill, yet each configuration computed them again; likewise Quest's decode-time page bounds
 * (kvs_page_scores_rows) at a fixed page size, whose summaries are the page min/max of every key so far, and the
 * page selection over them (kvs_page_select: at every budget a prefix of one page ranking), and
 * the top-k oracle's decode-time selection (kvs_topk_sorted of the group-summed full attention: at every budget a
 * prefix of one ranking). A policy calls kvs_policy_colsum() / kvs_policy_snapkv_scores() with its
 * prefill view (kvs_policy_page_scores() with its prefill or decode view) instead of the kvs_math.h function: when
 * the view carries a memo and an earlier configuration of the same task asked for the same computation (the same q
 * and key rows, the same candidates, the same options) at the same position, the stored result is copied; otherwise
 * it is computed and stored. Either way the output is the kvs_math.h function's, bit for bit: a hit copies the bits
 * the same computation produced. Nothing is shared that the policy could not compute from its own view (the prompt's
 * queries and keys every policy sees at prefill; the full attention only an oracle's view carries), and the memo
 * lives in one task (one thread): no global state. The engine clears it whenever the rows under the view may change
 * (each position, prompt and decode; never used when an on_step_end hook may rewrite rows). The allocation pass
 * gives its views a memo too, one per (layer, KV head) being read, shared by every configuration's alloc_prefill
 * over that view: a policy's budget-independent prompt scoring (kvs_policy_shared) runs once for all its budgets.
 */
#ifndef KVS_POLICY_MEMO_H
#define KVS_POLICY_MEMO_H

#include <stdint.h>

#include "../common/kvs_math.h"
#include "policy.h"

typedef struct kvs_policy_memo kvs_policy_memo;

/*! kvs_policy_memo_create() : an empty memo; NULL when out of memory (the engine then runs without one).
 *  Caller owns; free with kvs_policy_memo_free(). */
kvs_policy_memo *kvs_policy_memo_create(void);

/*! kvs_policy_memo_free() : accepts NULL. */
void kvs_policy_memo_free(kvs_policy_memo *m);

/*! kvs_policy_memo_clear() : forgets every entry (their buffers are kept for reuse). The engine calls it before
 *  the rows a stored entry was computed from may change. */
void kvs_policy_memo_clear(kvs_policy_memo *m);

/*! kvs_policy_memo_set_checked() : checked mode on or off, overriding KVS_MEMO_CHECK: every hit of an entry keyed
 *  under a contract (column sums, window scores, page scores) is computed again and compared bit for bit; a
 *  difference aborts with a message (the test suite runs checked). Process-wide; set it before replays start. */
void kvs_policy_memo_set_checked(int on);

/*! kvs_policy_memo_hits() : lookups answered from the memo since creation (tests, the benchmark). */
int64_t kvs_policy_memo_hits(const kvs_policy_memo *m);

/*! kvs_policy_colsum() : kvs_attn_colsum(src, opts, out_f32, out_f64, scratch), bit for bit. Memoised when
 *  view->memo is set and the output span it adds to is all +0.0 on entry (a running score to add to is never
 *  memoised: the sums' rounding depends on it). */
void kvs_policy_colsum(const kvs_policy_view *view, const kvs_attn_src *src, const kvs_colsum_opts *opts,
                       float *out_f32, double *out_f64, void *scratch);

/*! kvs_policy_snapkv_scores() : kvs_snapkv_scores(src, opts, out, scratch), bit for bit, memoised when
 *  view->memo is set. */
int64_t kvs_policy_snapkv_scores(const kvs_policy_view *view, const kvs_attn_src *src, const kvs_snapkv_opts *opts,
                                 float *out, void *scratch);

/*! kvs_policy_page_scores() : kvs_page_scores_rows(q, nq, d, kmin, kmax, stride, n_pages, out), bit for bit,
 *  memoised when view->memo is set and page > 0. CONTRACT of the memoised call: the summaries are a function
 *  of the view's keys and `page` only — kmin/kmax row pi is the element-wise min/max of view->k's rows
 *  [pi*page, min((pi+1)*page, view->n)), folded by kvs_page_minmax_add in ascending position order (Quest:
 *  every key resident, pages over every position). The memo does not read them: the key is the query rows
 *  (address and values), nq, d, stride, n_pages, and view->k, view->n, view->q_first and page, which under the
 *  contract fix the summaries. A policy whose summaries depend on anything else (its held set, a budget-derived
 *  slot order) passes page = 0 or a view without a memo: then it is plain kvs_page_scores_rows. */
void kvs_policy_page_scores(const kvs_policy_view *view, int64_t page, const float *q, size_t nq, size_t d,
                            const float *kmin, const float *kmax, size_t stride, size_t n_pages, double *out);

/*! kvs_policy_page_select() : kvs_page_select(score, n_pages, page, n_tokens, k, out, scratch), the same slots,
 *  with the page ranking memoised when view->memo is set: the key is the scores' values (n_pages doubles,
 *  compared bit for bit, wherever they lie: each configuration sums its own copy). A configuration ranks as deep
 *  as the largest kvs_page_select_depth() asked so far (Quest's budgets at one page size rank the same group
 *  scores: one ranking a position serves them all), and every configuration takes the prefix it needs (the
 *  ranking is kvs_topk_f64's strict order, so a deeper ranking's prefix is the shallower one). */
int64_t kvs_policy_page_select(const kvs_policy_view *view, const double *score, size_t n_pages, size_t page,
                               size_t n_tokens, size_t k, int32_t *out, int32_t *scratch);

/*! kvs_policy_topk_sorted() : kvs_topk_sorted(v, n, k, out), bit for bit, where v is rows[0..n_rows-1] (n floats
 *  each, n apart) summed element-wise from +0 in row order in fp32 (the oracle top-k's group sum; n_rows = 1: the
 *  row itself), memoised when view->memo is set. `sum` is caller scratch of n floats (contents unspecified after);
 *  out holds min(k, n) entries, written ascending. The key is the rows' address, n_rows, n and the rows' values
 *  (compared, so a hit is the same input bits, whatever the caller did to the rows). The first configuration to
 *  ask selects as without a memo and stores the values; a later one ranks them (kvs_ref_rank_prefix) as deep as
 *  the largest k asked so far, and every k up to that depth takes the first k of the ranking: under kvs_topk's
 *  strict total order (larger first, -0 equal to +0, NaN last, the lower position first among equals) the k
 *  largest are exactly the ranking's first k. */
void kvs_policy_topk_sorted(const kvs_policy_view *view, const float *rows, size_t n_rows, size_t n, size_t k,
                            float *sum, int32_t *out);

/* A policy's own budget-independent result (kvs_policy_shared): computed into out (out_bytes) from the view's rows
 * and whatever the key bytes describe; returns its status. */
typedef kvs_status (*kvs_policy_shared_fn)(void *ctx, void *out);

/*! kvs_policy_shared() : compute(ctx, out), memoised when view->memo is set, for a result the memo has no kind of its
 *  own for (DuoAttention-heuristic's prompt probes, Q-Filters' calib=self filters, Expected Attention's prompt
 *  scores, R-KV's key redundancy: sim/BENCH.md "Policies against H2O"). CONTRACT: the out_bytes compute writes are a
 *  function of the rows under the view (view->k, view->v, view->q with n, q_first, n_q, turn_begin, group,
 *  head_dim, scale, which are part of the key) and of the `key_bytes` at `key` only — the caller puts in them
 *  EVERYTHING else the result depends on (the parameters that enter it, candidate lists, derived constants such
 *  as RoPE frequencies), never a pointer to its configuration. `tag` names the computation (a string literal,
 *  "policy.what"), so two computations with equal keys never meet. A hit copies the stored bytes (checked mode:
 *  computes again and compares them, aborting on a difference); a miss computes and stores. A failed compute
 *  stores nothing. */
kvs_status kvs_policy_shared(const kvs_policy_view *view, const char *tag, const void *key, size_t key_bytes,
                             void *out, size_t out_bytes, kvs_policy_shared_fn compute, void *ctx);

#endif /* KVS_POLICY_MEMO_H */
