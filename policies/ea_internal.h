/* ea_internal.h — Expected Attention's score and Ada-KV head allocation (policies/ea.c, ../shared/POLICY_SPEC_2.md
 * §2.1), exposed for the golden tests (G-EA, G-ADAKV). */
#ifndef KVS_EA_INTERNAL_H
#define KVS_EA_INTERNAL_H

#include <stdint.h>

#include "../common/kvs.h"

typedef struct {
    int64_t n_future; /* T_f: future positions averaged in R̄ */
    int64_t n_sink;   /* first positions: never scored (kept), not in the statistics */
    int use_cov, use_vnorm;
    double eps;       /* score = (a + eps) * |v| */
} kvs_ea_params;

/*! kvs_ea_scores() : Expected Attention scores of one KV head (§2.1 steps 1-7). q: [nq][G][d] post-RoPE queries of
 *  positions q_first..q_first+nq-1 (the statistics use those >= n_sink); k, v: rows by position (d floats each);
 *  cand[0..nc-1]: the candidate positions; a0: the first position that will read the cache; freq/layout: the
 *  trace's RoPE (common/kvs_rope.h); scale: the softmax scale s. score[c] (nc doubles) receives the score of
 *  cand[c]; candidates < n_sink get max + 1. KVS_ERR_NOMEM. */
kvs_status kvs_ea_scores(const kvs_ea_params *p, const double *freq, int layout, double scale, int G, int d,
                         const float *q, int64_t q_first, int64_t nq, int64_t a0, const float *k, const float *v,
                         const int32_t *cand, int64_t nc, double *score);

/*! kvs_ea_adakv_counts() : Ada-KV's layer-wide allocation (kvpress AdaKVPress): scores[h*n + j] of Hkv heads over n
 *  positions; per head the floor(bp * alpha) best are forced; then the Hkv*(n - bp) lowest (head, position) scores
 *  of the layer are pruned, ties pruning the lower flat index first. keep[h*n + j] (may be NULL) = 1 if kept;
 *  counts[h] = positions head h keeps. Requires bp < n. KVS_ERR_NOMEM. */
kvs_status kvs_ea_adakv_counts(const double *scores, int Hkv, int64_t n, int64_t bp, double alpha, uint8_t *keep,
                               int64_t *counts);

/*! kvs_ea_keep_top() : the `count` positions a head keeps from its own scores under Ada-KV's prune order (higher
 *  score first; among equal scores the higher index, which the prune reaches last), as indices into score[0..n-1],
 *  written ascending to out. */
void kvs_ea_keep_top(const double *score, int64_t n, int64_t count, int32_t *out);

#endif /* KVS_EA_INTERNAL_H */
