/* kvs_cluster.h — the set and clustering arithmetic of the head analyses and of SyncKV: the overlap
 * coefficient of two top-k sets (SyncKV Eq. 1, POLICY_SPEC §1.6 item 4, golden value G5), K-means with
 * k-means++ seeding and restarts (SyncKV App. B.1 step 4; POLICY_SPEC §2.4 [SIM-CHOICE] "k-means++ with seed 0
 * and 10 restarts; keep the lowest inertia"), the representative member of each cluster (§2.4 step 5), the
 * silhouette score used to choose the number of clusters automatically, and the adjusted Rand index (Hubert &
 * Arabie 1985) that measures the stability of a clustering (SyncKV App. B.1, POLICY_SPEC §5.4 S12).
 *
 * Everything is deterministic: the only randomness is kvs_rng (common/kvs_rng.h) seeded from the caller's
 * seed, and every tie is broken towards the lowest index. Double precision throughout.
 */
#ifndef KVS_CLUSTER_H
#define KVS_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "kvs.h"

/*! kvs_overlap_sorted() : |A ∩ B| / min(|A|, |B|) of two sets given as STRICTLY ascending index arrays (the
 *  overlap coefficient, SyncKV Eq. 1). NaN when either set is empty (the coefficient is undefined). */
double kvs_overlap_sorted(const int32_t *a, size_t na, const int32_t *b, size_t nb);

/*! kvs_intersect_sorted() : |A ∩ B| of two strictly ascending index arrays (a merge walk). */
size_t kvs_intersect_sorted(const int32_t *a, size_t na, const int32_t *b, size_t nb);

/* K-means options. Zero-initialised fields take the defaults shown. */
typedef struct {
    uint64_t seed;     /* 0 (POLICY_SPEC §2.4): restart r draws from kvs_rng stream r of this seed */
    int32_t restarts;  /* 10 when 0 */
    int32_t max_iter;  /* Lloyd iterations per restart; 300 when 0 */
} kvs_kmeans_opts;

/* A K-means result: labels are canonical — cluster 0 holds point 0, and each next cluster number is given to
 * the lowest-indexed point not yet labelled — so equal partitions always carry equal labels. */
typedef struct {
    int32_t k;          /* clusters (every one non-empty) */
    int32_t *labels;    /* [n] cluster of each point, 0..k-1 */
    double *centroids;  /* [k][dim] mean of each cluster's points, in canonical label order */
    int32_t *rep;       /* [k] representative of each cluster: the member nearest its centroid, ties lowest */
    double inertia;     /* sum of squared distances of the points to their centroids */
    int32_t restart;    /* which restart gave this result (the first of equal-inertia ones) */
} kvs_kmeans_result;

/*! kvs_kmeans() : clusters the n points x[n][dim] (row-major) into k clusters (1 <= k <= n) by Lloyd's
 *  algorithm from k-means++ seeds, `restarts` times, keeping the lowest inertia (earliest on ties). A cluster
 *  that empties during an iteration is re-seeded with the point farthest from its centroid (lowest index on
 *  ties), so every returned cluster is non-empty. Fills *out (caller frees with kvs_kmeans_result_free).
 *  KVS_ERR_INVALID_ARG for k outside 1..n, dim 0 or a non-finite coordinate; KVS_ERR_NOMEM. */
kvs_status kvs_kmeans(const double *x, size_t n, size_t dim, int32_t k, const kvs_kmeans_opts *opts,
                      kvs_kmeans_result *out);
void kvs_kmeans_result_free(kvs_kmeans_result *r);

/*! kvs_silhouette() : the mean silhouette (Rousseeuw 1987) of `labels` (values 0..k-1, k >= 2) on the points
 *  x[n][dim] with Euclidean distance: s(i) = (b - a) / max(a, b) with a the mean distance to the other
 *  members of i's cluster and b the lowest mean distance to another cluster's members; s(i) = 0 for a member
 *  of a singleton cluster, and 0 when a = b = 0. *score in [-1, 1]. KVS_ERR_INVALID_ARG when fewer than two
 *  clusters are used or a label is out of range; KVS_ERR_NOMEM. */
kvs_status kvs_silhouette(const double *x, size_t n, size_t dim, const int32_t *labels, int32_t k, double *score);

/*! kvs_kmeans_auto() : K-means for every k in k_min..k_max (2 <= k_min <= k_max <= n - 1) and the one with the
 *  highest mean silhouette (the smaller k on ties, compared exactly); *out as kvs_kmeans and, when
 *  `silhouettes` is not NULL, silhouettes[k - k_min] for each k tried. KVS_ERR_INVALID_ARG for a bad range. */
kvs_status kvs_kmeans_auto(const double *x, size_t n, size_t dim, int32_t k_min, int32_t k_max,
                           const kvs_kmeans_opts *opts, kvs_kmeans_result *out, double *silhouettes);

/*! kvs_adjusted_rand() : the adjusted Rand index of two labelings of the same n >= 1 points (labels >= 0):
 *  (Σ_ij C(n_ij,2) − E) / (½(Σ_i C(a_i,2) + Σ_j C(b_j,2)) − E) with E = Σ_i C(a_i,2) Σ_j C(b_j,2) / C(n,2).
 *  1 for identical partitions (whatever the label names), about 0 for independent ones. When the
 *  denominator is 0 (both partitions trivial: one cluster each, or all singletons each) the partitions are
 *  equal and *ari is 1. KVS_ERR_INVALID_ARG for a negative label; KVS_ERR_NOMEM. */
kvs_status kvs_adjusted_rand(const int32_t *a, const int32_t *b, size_t n, double *ari);

#endif /* KVS_CLUSTER_H */
