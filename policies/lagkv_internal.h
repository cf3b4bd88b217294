/* lagkv_internal.h — the partition score of LagKV (policies/lagkv.c, ../shared/POLICY_SPEC_2.md §2.4), exposed for
 * the test of its worked example G-LAG (tests/test_lagkv.c). STYLE.md rule 1: cross-module internals in
 * *_internal.h; the policy itself is reached through the registry (policies/registry.h).
 */
#ifndef KVS_POLICIES_LAGKV_INTERNAL_H
#define KVS_POLICIES_LAGKV_INTERNAL_H

#include <stdint.h>

/*! kvs_lagkv_partition_scores() : sc[0..len) = softmax_i(σ_i) over one partition of len rows of X (rows part[i] of
 *  x, [*][d]), σ_i the unbiased standard deviation over the d channels of row i min-max normalised channel-wise by
 *  its reference partition (rows ref[0..ref_len) of x: per channel c, (x - min_c) / (max_c - min_c), a constant
 *  channel divided by 1 instead, §2.4 [SIM-CHOICE]). fp64. d >= 2. */
void kvs_lagkv_partition_scores(const float *x, const int32_t *part, int64_t len, const int32_t *ref,
                                int64_t ref_len, int d, double *sc);

#endif /* KVS_POLICIES_LAGKV_INTERNAL_H */
