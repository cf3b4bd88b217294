/* simlayerkv_internal.h — the lazy-layer score of SimLayerKV (policies/simlayerkv.c, ../shared/POLICY_SPEC_2.md
 * §2.6), for the test of the spec's worked example G-SLK. STYLE.md rule 1: cross-module internals in *_internal.h.
 */
#ifndef KVS_POLICIES_SIMLAYERKV_INTERNAL_H
#define KVS_POLICIES_SIMLAYERKV_INTERNAL_H

#include <stdint.h>

/*! kvs_slk_lazy_score() : the lazy mass of one attention row (or a sum of rows: the score is linear) over n keys,
 *  the last one the query's own: Σ_{j<n_init} row[j] + Σ over the last n_recent columns. prefill_last (kvpress):
 *  the query's own column is dropped first (not renormalised), so the recent range is the last n_recent of the
 *  first n−1. decode1 (the authors): all n columns, the ranges counted twice where they overlap (REF). */
double kvs_slk_lazy_score(const double *row, int64_t n, int64_t n_init, int64_t n_recent, int prefill_last);

#endif /* KVS_POLICIES_SIMLAYERKV_INTERNAL_H */
