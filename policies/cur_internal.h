/* cur_internal.h — the scoring of CurDKV (policies/cur.c, ../shared/POLICY_SPEC_2.md §2.7), exposed for the test
 * of its worked example G-CUR (tests/test_cur.c). STYLE.md rule 1: cross-module internals in *_internal.h; the
 * policy itself is reached through the registry (policies/registry.h).
 */
#ifndef KVS_POLICIES_CUR_INTERNAL_H
#define KVS_POLICIES_CUR_INTERNAL_H

#include <stdint.h>

#include "../sim/policy.h"

/* cur's `type` choices, in the parameter's order. */
enum { KVS_CUR_KV_PRODUCT = 0, KVS_CUR_KV_AVG = 1, KVS_CUR_KEY = 2, KVS_CUR_VALUE = 3 };

typedef struct {
    int type;            /* KVS_CUR_* */
    int local_w;         /* normalisation window in candidates, 0 = off */
    int64_t sinks;       /* the first `sinks` candidates get score 1 */
    int proj_r;          /* sketch width; 0 = exact row norms */
    const float *gamma;  /* [d][proj_r] sketch (borrowed), NULL when proj_r = 0 */
} kvs_cur_opts;

/*! kvs_cur_scores() : score[0..n-1] of the n candidates (rows idx[j] of keys/values, [*][d]; idx NULL = rows
 *  0..n-1), §2.7 steps 1-5, in fp64: the squared row norms (of the sketch), locally normalised, combined by
 *  o->type, divided by their sum, sinks set to 1. nu: n doubles of caller scratch (the value leverages). */
void kvs_cur_scores(const float *keys, const float *values, const int32_t *idx, int64_t n, int d,
                    const kvs_cur_opts *o, double *score, double *nu);

#endif /* KVS_POLICIES_CUR_INTERNAL_H */
