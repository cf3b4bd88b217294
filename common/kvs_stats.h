/* kvs_stats.h — small statistics shared by the analyses (analysis/), the comparisons over several traces
 * (results/, plots/) and their tests: average ranks with ties, Spearman's rank correlation, the log-determinant
 * of a symmetric positive definite matrix (KeyDiff App. F.1's key-diversity measure, POLICY_SPEC §5.5 K11), and
 * the percentile bootstrap interval of a mean and of a paired mean difference (Efron & Tibshirani 1993, ch. 13:
 * resample the units — traces, prompts — with replacement, take the level's quantiles of the resampled means).
 * Double precision throughout.
 */
#ifndef KVS_STATS_H
#define KVS_STATS_H

#include <stddef.h>
#include <stdint.h>

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

/* A mean over n units with its percentile bootstrap interval [lo, hi] at `level` (0.95: the 2.5 % and 97.5 %
 * quantiles of the resampled means, linear interpolation between order statistics). n = 1: lo = hi = mean (one
 * unit has no interval: say n). */
typedef struct {
    double mean, lo, hi;
    size_t n;
    double level;
    int reps;
} kvs_interval;

/* The default number of bootstrap resamples. */
#define KVS_BOOTSTRAP_REPS 2000

/*! kvs_bootstrap_mean() : the mean of x[0..n) (n >= 1, every value finite) and its percentile bootstrap interval
 *  from `reps` (>= 1) resamples of n units drawn with replacement by a PCG32 seeded with `seed` (so an interval is
 *  a function of its inputs and seed: seed it from what is compared, never from the clock). level in (0, 1).
 *  KVS_ERR_INVALID_ARG for n = 0, a non-finite value, reps < 1 or a level outside (0, 1); KVS_ERR_NOMEM. */
kvs_status kvs_bootstrap_mean(const double *x, size_t n, int reps, double level, uint64_t seed, kvs_interval *out);

/*! kvs_bootstrap_mean_diff() : the paired difference mean(a[i] - b[i]) over the same n units (same traces) and its
 *  interval, as kvs_bootstrap_mean of the differences. An ordering is resolved at `level` when the interval
 *  excludes 0 (kvs_interval_resolved). */
kvs_status kvs_bootstrap_mean_diff(const double *a, const double *b, size_t n, int reps, double level, uint64_t seed,
                                   kvs_interval *out);

/*! kvs_interval_resolved() : +1 when the interval lies above 0, -1 below, 0 when it contains 0 or n < 2 (one unit
 *  resolves nothing). */
int kvs_interval_resolved(const kvs_interval *iv);

/*! kvs_quantile_sorted() : the q-quantile (q in [0, 1]) of the ascending x[0..n), n >= 1, interpolated linearly
 *  between order statistics at position q·(n − 1) (Hyndman & Fan type 7). */
double kvs_quantile_sorted(const double *x, size_t n, double q);

#endif /* KVS_STATS_H */
