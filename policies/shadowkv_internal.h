/* shadowkv_internal.h — what policies/shadowkv.c computed, for its golden test (../shared/POLICY_SPEC_2.md §2.10
 * G-SKV). */
#ifndef KVS_SHADOWKV_INTERNAL_H
#define KVS_SHADOWKV_INTERNAL_H

#include <stdint.h>

typedef struct {
    const double *sigma;  /* [n_sigma] the layer's singular values of the pre-RoPE key matrix, descending */
    int n_sigma, rank;    /* rank r used */
    int64_t n_chunks;     /* C */
    const double *ocos;   /* [C] o_m = min_j cos(landmark_m, k_j) */
    const uint8_t *outlier; /* [C] 1 = outlier chunk (kept exactly) */
    const double *pi;     /* [C] the last decode step's chunk probabilities (max over the group; outliers 0) */
    int64_t local_lo;     /* local positions [local_lo, compressed end) */
    int64_t sparse_tokens;/* tokens of selected chunks allowed per step */
    int64_t misses;       /* chunks of the last step not selected at the step before (reuse misses) */
} kvs_shadowkv_debug;

/*! kvs_shadowkv_inspect() : the state's computed quantities (borrowed from the instance, valid until its next call). */
kvs_shadowkv_debug kvs_shadowkv_inspect(const void *state);

#endif /* KVS_SHADOWKV_INTERNAL_H */
