/* kvs_stats.h — small statistics shared by the analyses (analysis/) and their tests: average ranks with
 * ties, Spearman's rank correlation, and the log-determinant of a symmetric positive definite matrix
 * (KeyDiff App. F.1's key-diversity measure, POLICY_SPEC §5.5 K11). Double precision throughout.
 */
#ifndef KVS_STATS_H
#define KVS_STATS_H

#include <stddef.h>

#include "kvs.h"

/*! kvs_ranks() : the average (fractional) rank of each x[i], 1-based: the smallest value gets 1, tied values
 *  share the mean of the ranks they span (1, 2.5, 2.5, 4). NaN inputs are not allowed (KVS_ERR_INVALID_ARG).
 *  rank[n] is written; KVS_ERR_NOMEM when the n-element scratch cannot be allocated. */
kvs_status kvs_ranks(const double *x, size_t n, double *rank);

/*! kvs_spearman() : Spearman's rank correlation of x and y (n >= 2): the Pearson correlation of their
 *  average ranks, so ties are handled exactly. *rho is NaN when either ranking is constant (no variation:
 *  the correlation is undefined). KVS_ERR_INVALID_ARG for n < 2 or a NaN input. */
kvs_status kvs_spearman(const double *x, const double *y, size_t n, double *rho);

/*! kvs_logdet_spd() : log det(A) of the symmetric positive definite d x d matrix A (row-major; only the
 *  lower triangle is read) by a Cholesky factorisation in place of a copy. KVS_ERR_RANGE when A is not
 *  positive definite (a pivot <= 0), KVS_ERR_NOMEM for the copy. */
kvs_status kvs_logdet_spd(const double *A, size_t d, double *logdet);

#endif /* KVS_STATS_H */
