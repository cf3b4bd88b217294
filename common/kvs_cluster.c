/* kvs_cluster.c — overlap coefficient, K-means (k-means++ seeding, restarts, canonical labels and
 * representatives), silhouette and adjusted Rand index. Implements common/kvs_cluster.h; definitions from
 * SyncKV Eq. 1 and App. B.1 and POLICY_SPEC §2.4 / §5.4 S12 (see the header).
 */
#include "kvs_cluster.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_rng.h"

double kvs_overlap_sorted(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    if (na == 0 || nb == 0) return NAN;
    return (double)kvs_intersect_sorted(a, na, b, nb) / (double)(na < nb ? na : nb);
}

size_t kvs_intersect_sorted(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t i = 0, j = 0, n = 0;
    while (i < na && j < nb) {
        if (a[i] < b[j]) i++;
        else if (b[j] < a[i]) j++;
        else {
            n++;
            i++;
            j++;
        }
    }
    return n;
}

/* ------------------------------------------------------------------------------------------------
 * K-means
 * ---------------------------------------------------------------------------------------------- */

static double sqdist(const double *a, const double *b, size_t dim) {
    double s = 0;
    for (size_t j = 0; j < dim; j++) {
        double d = a[j] - b[j];
        s += d * d;
    }
    return s;
}

/* A uniform double in [0, 1) from two 32-bit outputs (53 bits). */
static double rng_unit(kvs_rng *r) {
    uint64_t hi = kvs_rng_u32(r) >> 5, lo = kvs_rng_u32(r) >> 6; /* 27 + 26 bits */
    return ((double)hi * 67108864.0 + (double)lo) / 9007199254740992.0;
}

/* k-means++ (Arthur & Vassilvitskii 2007): the first centre uniform, each next one drawn with probability
 * proportional to the squared distance to the nearest centre chosen so far. When every remaining distance is
 * 0 (duplicate points), the lowest-indexed point not yet a centre is taken. */
static void kmeanspp(const double *x, size_t n, size_t dim, int32_t k, kvs_rng *rng, double *cent, double *d2,
                     unsigned char *chosen) {
    memset(chosen, 0, n);
    size_t first = (size_t)(rng_unit(rng) * (double)n);
    if (first >= n) first = n - 1;
    chosen[first] = 1;
    memcpy(cent, x + first * dim, dim * sizeof *cent);
    for (size_t i = 0; i < n; i++) d2[i] = sqdist(x + i * dim, cent, dim);
    for (int32_t c = 1; c < k; c++) {
        double total = 0;
        for (size_t i = 0; i < n; i++) total += d2[i];
        size_t pick = n;
        if (total > 0) {
            double u = rng_unit(rng) * total, acc = 0;
            for (size_t i = 0; i < n; i++) {
                if (d2[i] <= 0) continue;
                acc += d2[i];
                pick = i;
                if (acc > u) break;
            }
        }
        if (pick == n)
            for (size_t i = 0; i < n && pick == n; i++)
                if (!chosen[i]) pick = i;
        chosen[pick] = 1;
        double *cc = cent + (size_t)c * dim;
        memcpy(cc, x + pick * dim, dim * sizeof *cc);
        for (size_t i = 0; i < n; i++) {
            double d = sqdist(x + i * dim, cc, dim);
            if (d < d2[i]) d2[i] = d;
        }
    }
}

/* Lloyd iterations from the centres in cent; labels out; returns the inertia. */
static double lloyd(const double *x, size_t n, size_t dim, int32_t k, int32_t max_iter, double *cent,
                    int32_t *labels, int32_t *count) {
    for (size_t i = 0; i < n; i++) labels[i] = -1;
    for (int32_t it = 0; it < max_iter; it++) {
        int changed = 0;
        for (size_t i = 0; i < n; i++) {
            int32_t best = 0;
            double bd = sqdist(x + i * dim, cent, dim);
            for (int32_t c = 1; c < k; c++) {
                double d = sqdist(x + i * dim, cent + (size_t)c * dim, dim);
                if (d < bd) {
                    bd = d;
                    best = c;
                }
            }
            if (labels[i] != best) changed = 1;
            labels[i] = best;
        }
        /* An empty cluster takes the point farthest from its own centre (lowest index on ties). */
        for (int32_t c = 0; c < k; c++) {
            int32_t n_in = 0;
            for (size_t i = 0; i < n; i++) n_in += labels[i] == c;
            if (n_in) continue;
            size_t far = 0;
            double fd = -1;
            for (size_t i = 0; i < n; i++) {
                int32_t own = labels[i];
                int32_t own_n = 0;
                for (size_t j = 0; j < n; j++) own_n += labels[j] == own;
                if (own_n < 2) continue; /* never empty another cluster */
                double d = sqdist(x + i * dim, cent + (size_t)own * dim, dim);
                if (d > fd) {
                    fd = d;
                    far = i;
                }
            }
            labels[far] = c;
            changed = 1;
        }
        memset(count, 0, (size_t)k * sizeof *count);
        memset(cent, 0, (size_t)k * dim * sizeof *cent);
        for (size_t i = 0; i < n; i++) {
            count[labels[i]]++;
            for (size_t j = 0; j < dim; j++) cent[(size_t)labels[i] * dim + j] += x[i * dim + j];
        }
        for (int32_t c = 0; c < k; c++)
            for (size_t j = 0; j < dim; j++) cent[(size_t)c * dim + j] /= (double)count[c];
        if (!changed && it > 0) break;
    }
    double inertia = 0;
    for (size_t i = 0; i < n; i++) inertia += sqdist(x + i * dim, cent + (size_t)labels[i] * dim, dim);
    return inertia;
}

void kvs_kmeans_result_free(kvs_kmeans_result *r) {
    if (!r) return;
    free(r->labels);
    free(r->centroids);
    free(r->rep);
    memset(r, 0, sizeof *r);
}

kvs_status kvs_kmeans(const double *x, size_t n, size_t dim, int32_t k, const kvs_kmeans_opts *opts,
                      kvs_kmeans_result *out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "kmeans: NULL result");
    memset(out, 0, sizeof *out);
    if (!x || n == 0 || dim == 0) return kvs_fail(KVS_ERR_INVALID_ARG, "kmeans: no points (n %zu, dim %zu)", n, dim);
    if (k < 1 || (size_t)k > n)
        return kvs_fail(KVS_ERR_INVALID_ARG, "kmeans: %d clusters of %zu points (need 1 <= k <= n)", k, n);
    for (size_t i = 0; i < n * dim; i++)
        if (!isfinite(x[i])) return kvs_fail(KVS_ERR_INVALID_ARG, "kmeans: coordinate %zu is not finite", i);
    kvs_kmeans_opts o = opts ? *opts : (kvs_kmeans_opts){0};
    if (o.restarts <= 0) o.restarts = 10;
    if (o.max_iter <= 0) o.max_iter = 300;

    double *cent = malloc((size_t)k * dim * sizeof *cent), *d2 = malloc(n * sizeof *d2);
    int32_t *labels = malloc(n * sizeof *labels), *count = malloc((size_t)k * sizeof *count);
    int32_t *map = malloc((size_t)k * sizeof *map);
    unsigned char *chosen = malloc(n);
    out->labels = malloc(n * sizeof *out->labels);
    out->centroids = malloc((size_t)k * dim * sizeof *out->centroids);
    out->rep = malloc((size_t)k * sizeof *out->rep);
    if (!cent || !d2 || !labels || !count || !map || !chosen || !out->labels || !out->centroids || !out->rep) {
        free(cent), free(d2), free(labels), free(count), free(map), free(chosen);
        kvs_kmeans_result_free(out);
        return kvs_fail(KVS_ERR_NOMEM, "kmeans: out of memory (%zu points, %d clusters)", n, k);
    }
    out->k = k;
    out->inertia = INFINITY;
    for (int32_t r = 0; r < o.restarts; r++) {
        kvs_rng rng;
        kvs_rng_seed(&rng, o.seed, (uint64_t)r);
        kmeanspp(x, n, dim, k, &rng, cent, d2, chosen);
        double inertia = lloyd(x, n, dim, k, o.max_iter, cent, labels, count);
        if (inertia < out->inertia) {
            out->inertia = inertia;
            out->restart = r;
            /* Canonical labels: numbered in order of each cluster's lowest-indexed point. */
            for (int32_t c = 0; c < k; c++) map[c] = -1;
            int32_t next = 0;
            for (size_t i = 0; i < n; i++)
                if (map[labels[i]] < 0) map[labels[i]] = next++;
            for (size_t i = 0; i < n; i++) out->labels[i] = map[labels[i]];
            for (int32_t c = 0; c < k; c++)
                memcpy(out->centroids + (size_t)map[c] * dim, cent + (size_t)c * dim, dim * sizeof *cent);
        }
    }
    for (int32_t c = 0; c < k; c++) {
        double bd = INFINITY;
        out->rep[c] = -1;
        for (size_t i = 0; i < n; i++) {
            if (out->labels[i] != c) continue;
            double d = sqdist(x + i * dim, out->centroids + (size_t)c * dim, dim);
            if (d < bd) {
                bd = d;
                out->rep[c] = (int32_t)i;
            }
        }
    }
    free(cent), free(d2), free(labels), free(count), free(map), free(chosen);
    return KVS_OK;
}

kvs_status kvs_silhouette(const double *x, size_t n, size_t dim, const int32_t *labels, int32_t k, double *score) {
    if (!x || !labels || !score || k < 2) return kvs_fail(KVS_ERR_INVALID_ARG, "silhouette: needs k >= 2 (k %d)", k);
    int32_t *count = calloc((size_t)k, sizeof *count);
    double *sum = malloc((size_t)k * sizeof *sum);
    if (!count || !sum) {
        free(count), free(sum);
        return kvs_fail(KVS_ERR_NOMEM, "silhouette: out of memory");
    }
    kvs_status st = KVS_OK;
    int32_t used = 0;
    for (size_t i = 0; i < n; i++) {
        if (labels[i] < 0 || labels[i] >= k) {
            st = kvs_fail(KVS_ERR_INVALID_ARG, "silhouette: label %d of point %zu outside 0..%d", labels[i], i, k - 1);
            goto cleanup;
        }
        used += count[labels[i]]++ == 0;
    }
    if (used < 2) {
        st = kvs_fail(KVS_ERR_INVALID_ARG, "silhouette: the labels use %d cluster(s); it needs at least 2", used);
        goto cleanup;
    }
    double total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t own = labels[i];
        if (count[own] < 2) continue; /* s(i) = 0 */
        memset(sum, 0, (size_t)k * sizeof *sum);
        for (size_t j = 0; j < n; j++)
            if (j != i) sum[labels[j]] += sqrt(sqdist(x + i * dim, x + j * dim, dim));
        double a = sum[own] / (double)(count[own] - 1), b = INFINITY;
        for (int32_t c = 0; c < k; c++)
            if (c != own && count[c] > 0 && sum[c] / (double)count[c] < b) b = sum[c] / (double)count[c];
        double m = a > b ? a : b;
        if (m > 0) total += (b - a) / m;
    }
    *score = total / (double)n;
cleanup:
    free(count), free(sum);
    return st;
}

kvs_status kvs_kmeans_auto(const double *x, size_t n, size_t dim, int32_t k_min, int32_t k_max,
                           const kvs_kmeans_opts *opts, kvs_kmeans_result *out, double *silhouettes) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "kmeans_auto: NULL result");
    memset(out, 0, sizeof *out);
    if (k_min < 2 || k_max < k_min || (size_t)k_max + 1 > n)
        return kvs_fail(KVS_ERR_INVALID_ARG,
                        "kmeans_auto: cluster counts %d..%d for %zu points (need 2 <= k_min <= k_max <= n - 1)", k_min,
                        k_max, n);
    double best = -INFINITY;
    for (int32_t k = k_min; k <= k_max; k++) {
        kvs_kmeans_result r;
        double s = 0;
        kvs_status st = kvs_kmeans(x, n, dim, k, opts, &r);
        if (st == KVS_OK) st = kvs_silhouette(x, n, dim, r.labels, k, &s);
        if (st != KVS_OK) {
            kvs_kmeans_result_free(&r);
            kvs_kmeans_result_free(out);
            return st;
        }
        if (silhouettes) silhouettes[k - k_min] = s;
        if (s > best) {
            best = s;
            kvs_kmeans_result_free(out);
            *out = r;
        } else {
            kvs_kmeans_result_free(&r);
        }
    }
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Adjusted Rand index
 * ---------------------------------------------------------------------------------------------- */

static double choose2(double m) { return m * (m - 1) / 2; }

/* Dense labels 0..k-1 for arbitrary non-negative labels (rank among the distinct values), so the contingency
 * table is at most n x n whatever the label values. */
static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

static int32_t densify(const int32_t *lab, size_t n, int32_t *sorted, int32_t *dense) {
    memcpy(sorted, lab, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_i32);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || sorted[i] != sorted[k - 1]) sorted[k++] = sorted[i];
    for (size_t i = 0; i < n; i++) {
        const int32_t *at = bsearch(&lab[i], sorted, k, sizeof *sorted, cmp_i32);
        dense[i] = (int32_t)(at - sorted);
    }
    return (int32_t)k;
}

kvs_status kvs_adjusted_rand(const int32_t *a, const int32_t *b, size_t n, double *ari) {
    if (!a || !b || !ari || n == 0) return kvs_fail(KVS_ERR_INVALID_ARG, "adjusted_rand: no points");
    for (size_t i = 0; i < n; i++)
        if (a[i] < 0 || b[i] < 0) return kvs_fail(KVS_ERR_INVALID_ARG, "adjusted_rand: negative label at point %zu", i);
    int32_t *work = malloc(3 * n * sizeof *work);
    if (!work) return kvs_fail(KVS_ERR_NOMEM, "adjusted_rand: out of memory");
    int32_t *da = work + n, *db = work + 2 * n;
    int32_t ka = densify(a, n, work, da), kb = densify(b, n, work, db);
    int64_t *table = calloc((size_t)ka * (size_t)kb + (size_t)ka + (size_t)kb, sizeof *table);
    if (!table) {
        free(work);
        return kvs_fail(KVS_ERR_NOMEM, "adjusted_rand: out of memory");
    }
    int64_t *ra = table + (size_t)ka * (size_t)kb, *rb = ra + ka;
    for (size_t i = 0; i < n; i++) {
        table[(size_t)da[i] * (size_t)kb + (size_t)db[i]]++;
        ra[da[i]]++;
        rb[db[i]]++;
    }
    free(work);
    double sum_ij = 0, sum_a = 0, sum_b = 0;
    for (size_t i = 0; i < (size_t)ka * (size_t)kb; i++) sum_ij += choose2((double)table[i]);
    for (int32_t i = 0; i < ka; i++) sum_a += choose2((double)ra[i]);
    for (int32_t j = 0; j < kb; j++) sum_b += choose2((double)rb[j]);
    free(table);
    double total = choose2((double)n);
    double expected = total > 0 ? sum_a * sum_b / total : 0;
    double denom = 0.5 * (sum_a + sum_b) - expected;
    *ari = denom == 0 ? 1.0 : (sum_ij - expected) / denom;
    return KVS_OK;
}
