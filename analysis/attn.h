/* attn.h — attention statistics per layer and head of a trace that two seed papers build on:
 *
 *  - D2O's density diagnostic (../shared/papers/d2o.txt §4.1, Figs. 1 and 4; POLICY_SPEC §5.3 D2, D3): per
 *    head, the variance over prompt positions j of the column sums Σ_i A[i][j] of the causal attention of
 *    the first turn's prompt queries i. Low variance = the attention is spread ("dense"), high = concentrated
 *    on few keys ("sparse"). D2O gives dense layers more budget (its inverse-variance softmax).
 *  - RocketKV's argument against permanent eviction (../shared/papers/rocketkv.txt §3.1, Fig. 2; POLICY_SPEC
 *    §5.2 R4): per query head, the number of distinct positions that are ever among the top-k of the full
 *    attention over the generated steps, |∪_t TOPK_t(k)|, against the sequence length. A union much larger
 *    than k means no fixed set of k tokens serves every step.
 *
 * Both read the trace through trace/kv_stream.h with exact full attention (the replay engine's numbers).
 */
#ifndef KVS_ANALYSIS_ATTN_H
#define KVS_ANALYSIS_ATTN_H

#include <stdint.h>

#include "../common/kvs.h"
#include "../trace/trace.h"

/*! kvs_analysis_colsum_variance() : D2O's F_v of every query head of `layer`: var[h] (h < n_heads, caller
 *  memory) = the population variance over the prompt's positions j of Σ_{i in prompt, i >= j} A_h[i][j].
 *  KVS_ERR_RANGE for a layer outside the trace, KVS_ERR_INVALID_ARG for a prompt of fewer than 2 positions,
 *  trace read errors as returned. O(P² · heads · head_dim). */
kvs_status kvs_analysis_colsum_variance(const kvs_trace *t, int layer, double *var);

/* The top-k union of one query head over the generated positions. */
typedef struct {
    int64_t steps;     /* generated positions (decode steps) looked at */
    int64_t max_len;   /* sequence length at the last of them */
    int64_t n_union;   /* |∪_t TOPK_t(k)|: distinct positions ever in a step's top-k */
} kvs_topk_union;

/*! kvs_analysis_topk_union() : for every query head of (layer, kv_head) (out[g], g < group, caller memory),
 *  the union of the top-k positions of the full attention at every generated position (a step attending to
 *  fewer than k positions contributes all of them). KVS_ERR_INVALID_ARG for k < 1 or a trace without a
 *  generated position; KVS_ERR_RANGE for a layer/head outside the trace. */
kvs_status kvs_analysis_topk_union(const kvs_trace *t, int layer, int kv_head, int64_t k, kvs_topk_union *out);

#endif /* KVS_ANALYSIS_ATTN_H */
