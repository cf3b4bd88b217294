/* rkv_internal.h — the score of one R-KV compression (policies/rkv.c, ../shared/POLICY_SPEC_2.md §2.9), exposed for
 * the test of its worked example G-RKV (tests/test_rkv.c). STYLE.md rule 1: cross-module internals in
 * *_internal.h; the policy itself is reached through the registry (policies/registry.h).
 */
#ifndef KVS_POLICIES_RKV_INTERNAL_H
#define KVS_POLICIES_RKV_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    double lambda;   /* λ: importance weight; 1 − λ on the redundancy */
    int kernel;      /* max-pool kernel on the importance (odd) */
    double sim_thr;  /* cosine above which a key is "highly similar" */
    int ref_quirks;  /* 1: a row without a similar key zeroes its column 0 (the reference's quirk) */
} kvs_rkv_opts;

/*! kvs_rkv_scratch_bytes() : bytes of kvs_rkv_scores' scratch for m resident keys (malloc'd: aligned for double). */
size_t kvs_rkv_scratch_bytes(int64_t m);

/*! kvs_rkv_scores() : F[0..n_cand) = λ·I_j − (1 − λ)·R_j of the first n_cand of m resident keys (rows idx[j] of
 *  keys, [*][d], in position order; the other m − n_cand are the window), §2.9 steps 1-4: logits the group max of
 *  scale·q·k over the n_q cached query rows (q: [n_q][group][d]), softmax over the candidates only, mean over the
 *  rows, max-pooled in position order (I); redundancy over all m keys: cosine rows with the diagonal and each
 *  row's most recent key above sim_thr zeroed, column means, softmax over the m keys (R). I and R: NULL or
 *  n_cand (I) and m (R) doubles receiving the two terms. n_q >= 1, n_cand >= 1. */
void kvs_rkv_scores(const float *keys, const int32_t *idx, int64_t m, int64_t n_cand, const float *q, int64_t n_q,
                    int group, int d, float scale, const kvs_rkv_opts *o, double *F, double *I, double *R,
                    void *scratch);

#endif /* KVS_POLICIES_RKV_INTERNAL_H */
