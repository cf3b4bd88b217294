/* qfilters_internal.h — Q-Filters' filter computation (policies/qfilters.c, ../shared/POLICY_SPEC_2.md §2.8),
 * exposed for its golden test and for anything that computes filters outside a replay. */
#ifndef KVS_QFILTERS_INTERNAL_H
#define KVS_QFILTERS_INTERNAL_H

#include <stdint.h>

#include "../common/kvs.h"

/*! kvs_qfilters_head_filter() : the filter f_h = -eps * v1 of one query head from n calibration queries q (rows
 *  `stride` floats apart, d used): v1 the top eigenvector of Q^T Q (the first right-singular vector of the
 *  uncentred Q), eps = +1 when more than half of <q_i, v1> are > 0, else -1 (an exact half counts as -1, REF).
 *  f (d doubles) is written; *sigma1 (may be NULL) gets the top singular value. KVS_ERR_NOMEM. */
kvs_status kvs_qfilters_head_filter(const float *q, int64_t n, int64_t stride, int d, double *f, double *sigma1);

#endif /* KVS_QFILTERS_INTERNAL_H */
