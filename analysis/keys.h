/* keys.h — key geometry against attention, per (layer, KV head) of a trace: the premises of KeyDiff
 * (../shared/papers/keydiff.txt §3.1 Fig. 2, App. C.3 Figs. 13-16, App. F.1 Fig. 12; POLICY_SPEC §5.5 K3,
 * K11, K12) measured on real decoding.
 *
 *  - K3: do keys less similar to the other keys receive more attention? Spearman's rank correlation
 *    between a key's mean cosine similarity to the other keys and the attention it receives (negative =
 *    the premise holds). "Attention received" follows POLICY_SPEC §6.3: summed over every later query of
 *    the scope (itself included), per query head, averaged over the KV head's group. Because an early key
 *    is seen by more queries, the same correlation is also reported for the attention per query that saw it
 *    (the sum divided by their number): position alone can make the first correlation negative.
 *  - K12: cos(mean key, mean query) (the paper: negative in every head), the mean cos(k, mean key) (keys
 *    nearly collinear with their mean), the coefficient of variation of the key norms (tightly clustered),
 *    and where the key least similar to the mean key ranks by attention received.
 *  - K11: the log-determinant of the retained keys' Gram matrix after a policy compressed the first turn's
 *    prompt (kvs_analysis_retained_logdet). For unit keys K̂_S (m x d) the paper's logdet(K̂_S K̂_Sᵀ + εI_m)
 *    equals logdet(K̂_Sᵀ K̂_S + εI_d) + (m − d)·log ε; the d x d form is computed (it is what differs
 *    between policies keeping the same number m of keys) and reported with m.
 * Scope: every position of the trace (default), or the first turn's prompt only (the paper's figures use
 * prompts). Full attention is the exact recomputation of trace/kv_stream.h.
 */
#ifndef KVS_ANALYSIS_KEYS_H
#define KVS_ANALYSIS_KEYS_H

#include <stdint.h>

#include "../common/kvs.h"
#include "../sim/policy.h"
#include "../trace/trace.h"

typedef enum { KVS_KEYS_ALL = 0, KVS_KEYS_PROMPT = 1 } kvs_keys_scope;

/* Statistics of one (layer, KV head). NaN where undefined (e.g. a constant ranking). */
typedef struct {
    int32_t layer, kv_head;
    int64_t n_keys;            /* keys (= queries) in the scope */
    double spearman_sum;       /* K3: rho(mean cos to the other keys, attention received summed) */
    double spearman_per_query; /* K3: rho(mean cos to the other keys, attention received per query that saw it) */
    double cos_meank_meanq;    /* K12: cos(mean key, mean query of the group) */
    double mean_cos_to_meank;  /* K12: mean over keys of cos(k, mean key) */
    double norm_cv;            /* K12: standard deviation / mean of the key norms */
    double distinct_key_pct;   /* K12: fraction of keys receiving less attention (summed) than the key with the
                                * lowest cos(k, mean key): 1 = it gets the most attention */
} kvs_key_stats;

/*! kvs_analysis_key_stats() : the statistics of (layer, kv_head) of `t` (borrowed) over `scope`. Reads the
 *  stream once with exact full attention: O(n² · group · head_dim) time, O(n · head_dim) memory.
 *  KVS_ERR_RANGE for a layer/head outside the trace, KVS_ERR_INVALID_ARG for a scope with fewer than 2
 *  keys, trace read errors as kvs_kv_stream_next returns them. */
kvs_status kvs_analysis_key_stats(const kvs_trace *t, int layer, int kv_head, kvs_keys_scope scope,
                                  kvs_key_stats *out);

/*! kvs_analysis_retained_logdet() : replays `t` under one policy configuration at `budget` and, at the end
 *  of the first turn's prompt (after its prefill compression), for every (layer, KV head): m = the number
 *  of keys the policy holds (query head 0's set for per-query-head policies) and logdet(K̂_Sᵀ K̂_S + eps·I_d)
 *  of their unit keys. logdet[] and count[] are [n_layers * n_kv_heads], index layer * n_kv_heads + kv_head
 *  (caller memory). Runs the replay engine (all cores); errors of the replay or of the policy's
 *  configuration are returned with their detail. */
kvs_status kvs_analysis_retained_logdet(const kvs_trace *t, const kvs_policy_config *cfg, int64_t budget, double eps,
                                        double *logdet, int64_t *count);

#endif /* KVS_ANALYSIS_KEYS_H */
