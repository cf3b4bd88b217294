/* test_cluster.c — common/kvs_cluster.c against independent references: the overlap coefficient (POLICY_SPEC
 * §7 G5 and a brute-force set count), K-means against the exhaustive optimum over every partition of small
 * point sets (n <= 8), canonical labels, representatives and determinism, the silhouette against a direct
 * evaluation of Rousseeuw's definition, the automatic choice of k, and the adjusted Rand index against
 * published values (scikit-learn's documented examples) and a pair-counting reference.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_cluster.h"
#include "../common/kvs_rng.h"

#define assert_near(a, b, eps) assert_true(fabs((double)(a) - (double)(b)) <= (double)(eps))

static void test_overlap_golden_g5(void **state) {
    (void)state;
    const int32_t a[] = {1, 2, 3, 4}, b[] = {3, 4, 5, 6, 7, 8};
    assert_near(kvs_overlap_sorted(a, 4, b, 6), 0.5, 0);
    assert_near(kvs_overlap_sorted(b, 6, a, 4), 0.5, 0);
    assert_int_equal(kvs_intersect_sorted(a, 4, b, 6), 2);
    assert_true(isnan(kvs_overlap_sorted(a, 0, b, 6)));
    assert_near(kvs_overlap_sorted(a, 4, a, 4), 1.0, 0);
    const int32_t c[] = {0, 9};
    assert_near(kvs_overlap_sorted(a, 4, c, 2), 0.0, 0);
}

static void test_overlap_matches_brute_force(void **state) {
    (void)state;
    kvs_rng r;
    kvs_rng_seed(&r, 5, 0);
    for (int trial = 0; trial < 500; trial++) {
        int32_t a[40], b[40];
        size_t na = 0, nb = 0;
        unsigned char in_a[64] = {0}, in_b[64] = {0};
        for (int32_t v = 0; v < 64; v++) {
            if (kvs_rng_u32(&r) % 3 == 0 && na < 40) a[na++] = v, in_a[v] = 1;
            if (kvs_rng_u32(&r) % 4 == 0 && nb < 40) b[nb++] = v, in_b[v] = 1;
        }
        size_t both = 0;
        for (int v = 0; v < 64; v++) both += in_a[v] && in_b[v];
        if (!na || !nb) continue;
        assert_int_equal(kvs_intersect_sorted(a, na, b, nb), both);
        assert_near(kvs_overlap_sorted(a, na, b, nb), (double)both / (double)(na < nb ? na : nb), 1e-15);
    }
}

/* The exhaustive optimum: every assignment of n points to k labels that uses all k, minimal inertia. */
static double brute_min_inertia(const double *x, size_t n, size_t dim, int k) {
    double best = INFINITY;
    size_t total = 1;
    for (size_t i = 0; i < n; i++) total *= (size_t)k;
    for (size_t code = 0; code < total; code++) {
        int lab[16], cnt[8] = {0};
        size_t c = code;
        for (size_t i = 0; i < n; i++) lab[i] = (int)(c % (size_t)k), c /= (size_t)k, cnt[lab[i]]++;
        int ok = 1;
        for (int g = 0; g < k; g++) ok &= cnt[g] > 0;
        if (!ok) continue;
        double inertia = 0;
        for (int g = 0; g < k; g++) {
            double mu[4] = {0};
            for (size_t i = 0; i < n; i++)
                if (lab[i] == g)
                    for (size_t j = 0; j < dim; j++) mu[j] += x[i * dim + j] / cnt[g];
            for (size_t i = 0; i < n; i++)
                if (lab[i] == g)
                    for (size_t j = 0; j < dim; j++) inertia += (x[i * dim + j] - mu[j]) * (x[i * dim + j] - mu[j]);
        }
        if (inertia < best) best = inertia;
    }
    return best;
}

static void test_kmeans_finds_the_exhaustive_optimum(void **state) {
    (void)state;
    kvs_rng r;
    kvs_rng_seed(&r, 11, 3);
    int hit = 0, cases = 0;
    for (int trial = 0; trial < 40; trial++) {
        size_t n = 5 + (size_t)(trial % 4), dim = 2 + (size_t)(trial % 3);
        double x[8 * 4];
        for (size_t i = 0; i < n * dim; i++) x[i] = kvs_rng_open01(&r) * 4 - 2;
        for (int k = 1; k <= 3; k++) {
            kvs_kmeans_result res;
            assert_int_equal(kvs_kmeans(x, n, dim, k, NULL, &res), KVS_OK);
            double opt = brute_min_inertia(x, n, dim, k);
            /* Never below the optimum (it is one of the partitions), and a Lloyd fixed point: every point is
             * nearest its own centroid (ties allowed) and each centroid is its members' mean. */
            assert_true(res.inertia >= opt - 1e-9);
            for (size_t i = 0; i < n; i++) {
                double own = 0;
                for (size_t j = 0; j < dim; j++)
                    own += (x[i * dim + j] - res.centroids[res.labels[i] * dim + j]) *
                           (x[i * dim + j] - res.centroids[res.labels[i] * dim + j]);
                for (int g = 0; g < k; g++) {
                    double d = 0;
                    for (size_t j = 0; j < dim; j++)
                        d += (x[i * dim + j] - res.centroids[g * dim + j]) * (x[i * dim + j] - res.centroids[g * dim + j]);
                    assert_true(own <= d + 1e-12);
                }
            }
            for (int g = 0; g < k; g++)
                for (size_t j = 0; j < dim; j++) {
                    double mu = 0;
                    int m = 0;
                    for (size_t i = 0; i < n; i++)
                        if (res.labels[i] == g) mu += x[i * dim + j], m++;
                    assert_near(res.centroids[g * dim + j], mu / m, 1e-12);
                }
            hit += fabs(res.inertia - opt) <= 1e-9 * (1 + opt);
            cases++;
            /* Every cluster used; representative = member nearest the centroid (lowest index on ties). */
            for (int g = 0; g < k; g++) {
                double bd = INFINITY;
                int want = -1, members = 0;
                for (size_t i = 0; i < n; i++) {
                    if (res.labels[i] != g) continue;
                    members++;
                    double d = 0;
                    for (size_t j = 0; j < dim; j++)
                        d += (x[i * dim + j] - res.centroids[g * dim + j]) * (x[i * dim + j] - res.centroids[g * dim + j]);
                    if (d < bd) bd = d, want = (int)i;
                }
                assert_true(members > 0);
                assert_int_equal(res.rep[g], want);
            }
            /* Canonical labels: point 0 in cluster 0, each new label the next integer. */
            int next = 0;
            for (size_t i = 0; i < n; i++) {
                assert_true(res.labels[i] <= next);
                if (res.labels[i] == next) next++;
            }
            assert_int_equal(next, k);
            kvs_kmeans_result_free(&res);
        }
    }
    /* Lloyd converges to local optima; the k-means++ restarts are what make the global one likely (10 restarts
     * reach it in 118 of these 120 cases). */
    assert_true(hit >= cases * 95 / 100);
}

static void test_kmeans_deterministic_and_separates_blobs(void **state) {
    (void)state;
    /* Three well separated blobs of 4 points; listed interleaved so that labels must be canonicalised. */
    double x[12 * 2];
    const double centre[3][2] = {{10, 0}, {0, 10}, {-10, -10}};
    kvs_rng r;
    kvs_rng_seed(&r, 1, 1);
    for (int i = 0; i < 12; i++)
        for (int j = 0; j < 2; j++) x[i * 2 + j] = centre[i % 3][j] + kvs_rng_open01(&r) - 0.5;
    kvs_kmeans_result a, b;
    kvs_kmeans_opts o = {.seed = 0, .restarts = 10};
    assert_int_equal(kvs_kmeans(x, 12, 2, 3, &o, &a), KVS_OK);
    assert_int_equal(kvs_kmeans(x, 12, 2, 3, &o, &b), KVS_OK);
    for (int i = 0; i < 12; i++) {
        assert_int_equal(a.labels[i], i % 3);
        assert_int_equal(a.labels[i], b.labels[i]);
    }
    assert_memory_equal(a.centroids, b.centroids, 3 * 2 * sizeof(double));
    assert_near(a.inertia, b.inertia, 0);
    double s = 0;
    assert_int_equal(kvs_silhouette(x, 12, 2, a.labels, 3, &s), KVS_OK);
    assert_true(s > 0.9);
    /* The automatic choice over 2..5 picks 3 by silhouette. */
    kvs_kmeans_result best;
    double sil[4];
    assert_int_equal(kvs_kmeans_auto(x, 12, 2, 2, 5, &o, &best, sil), KVS_OK);
    assert_int_equal(best.k, 3);
    assert_near(sil[1], s, 1e-12);
    for (int i = 0; i < 4; i++) assert_true(i == 1 || sil[i] < sil[1]);
    kvs_kmeans_result_free(&a);
    kvs_kmeans_result_free(&b);
    kvs_kmeans_result_free(&best);
}

static void test_kmeans_duplicates_and_bad_input(void **state) {
    (void)state;
    double same[5 * 2] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    kvs_kmeans_result r;
    assert_int_equal(kvs_kmeans(same, 5, 2, 3, NULL, &r), KVS_OK); /* every cluster still non-empty */
    int cnt[3] = {0};
    for (int i = 0; i < 5; i++) cnt[r.labels[i]]++;
    assert_true(cnt[0] > 0 && cnt[1] > 0 && cnt[2] > 0);
    assert_near(r.inertia, 0, 0);
    kvs_kmeans_result_free(&r);
    assert_int_equal(kvs_kmeans(same, 5, 2, 6, NULL, &r), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_kmeans(same, 5, 2, 0, NULL, &r), KVS_ERR_INVALID_ARG);
    same[3] = NAN;
    assert_int_equal(kvs_kmeans(same, 5, 2, 2, NULL, &r), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_kmeans_auto(same, 5, 2, 2, 5, NULL, &r, NULL), KVS_ERR_INVALID_ARG);
    int32_t one[3] = {0, 0, 0};
    double s;
    double pts[3] = {0, 1, 2};
    assert_int_equal(kvs_silhouette(pts, 3, 1, one, 2, &s), KVS_ERR_INVALID_ARG);
}

/* Rousseeuw's definition evaluated directly, cluster by cluster. */
static double silhouette_ref(const double *x, int n, int dim, const int32_t *lab, int k) {
    double total = 0;
    for (int i = 0; i < n; i++) {
        double mean[8] = {0};
        int cnt[8] = {0};
        for (int j = 0; j < n; j++) {
            if (j == i) continue;
            double d = 0;
            for (int t = 0; t < dim; t++) d += (x[i * dim + t] - x[j * dim + t]) * (x[i * dim + t] - x[j * dim + t]);
            mean[lab[j]] += sqrt(d);
            cnt[lab[j]]++;
        }
        if (cnt[lab[i]] == 0) continue;
        double a = mean[lab[i]] / cnt[lab[i]], b = INFINITY;
        for (int c = 0; c < k; c++)
            if (c != lab[i] && cnt[c]) b = fmin(b, mean[c] / cnt[c]);
        total += (b - a) / fmax(a, b);
    }
    return total / n;
}

static void test_silhouette_matches_definition(void **state) {
    (void)state;
    kvs_rng r;
    kvs_rng_seed(&r, 9, 9);
    for (int trial = 0; trial < 50; trial++) {
        int n = 4 + trial % 9, dim = 1 + trial % 3, k = 2 + trial % 3;
        double x[12 * 3];
        int32_t lab[12];
        for (int i = 0; i < n * dim; i++) x[i] = kvs_rng_open01(&r);
        for (int i = 0; i < n; i++) lab[i] = i < k ? i : (int32_t)(kvs_rng_u32(&r) % (uint32_t)k);
        double s;
        assert_int_equal(kvs_silhouette(x, (size_t)n, (size_t)dim, lab, k, &s), KVS_OK);
        assert_near(s, silhouette_ref(x, n, dim, lab, k), 1e-12);
    }
}

/* Pair counting: the Rand index adjusted by its expectation under the permutation model, from the pairs. */
static double ari_pairs(const int32_t *a, const int32_t *b, int n) {
    double both = 0, in_a = 0, in_b = 0, pairs = n * (n - 1) / 2.0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            int sa = a[i] == a[j], sb = b[i] == b[j];
            both += sa && sb;
            in_a += sa;
            in_b += sb;
        }
    double e = in_a * in_b / pairs, mx = (in_a + in_b) / 2;
    return mx == e ? 1.0 : (both - e) / (mx - e);
}

static void test_adjusted_rand_published_and_pair_counting(void **state) {
    (void)state;
    double v;
    /* scikit-learn's adjusted_rand_score documentation examples. */
    const int32_t p[] = {0, 0, 1, 1}, q[] = {1, 1, 0, 0}, r3[] = {0, 0, 1, 2}, all0[] = {0, 0, 0, 0},
                  each[] = {0, 1, 2, 3};
    assert_int_equal(kvs_adjusted_rand(p, p, 4, &v), KVS_OK);
    assert_near(v, 1.0, 0);
    assert_int_equal(kvs_adjusted_rand(p, q, 4, &v), KVS_OK);
    assert_near(v, 1.0, 0);
    assert_int_equal(kvs_adjusted_rand(p, r3, 4, &v), KVS_OK);
    assert_near(v, 4.0 / 7.0, 1e-15); /* 0.5714... */
    assert_int_equal(kvs_adjusted_rand(all0, each, 4, &v), KVS_OK);
    assert_near(v, 0.0, 0);
    assert_int_equal(kvs_adjusted_rand(all0, all0, 4, &v), KVS_OK);
    assert_near(v, 1.0, 0);
    kvs_rng g;
    kvs_rng_seed(&g, 3, 4);
    for (int trial = 0; trial < 200; trial++) {
        int32_t a[20], b[20];
        int n = 2 + trial % 19;
        for (int i = 0; i < n; i++) {
            a[i] = (int32_t)(kvs_rng_u32(&g) % 4u);
            b[i] = trial % 5 == 0 ? a[i] : (int32_t)(kvs_rng_u32(&g) % 3u);
        }
        assert_int_equal(kvs_adjusted_rand(a, b, (size_t)n, &v), KVS_OK);
        assert_near(v, ari_pairs(a, b, n), 1e-12);
    }
    const int32_t neg[] = {0, -1};
    assert_int_equal(kvs_adjusted_rand(neg, p, 2, &v), KVS_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overlap_golden_g5),
        cmocka_unit_test(test_overlap_matches_brute_force),
        cmocka_unit_test(test_kmeans_finds_the_exhaustive_optimum),
        cmocka_unit_test(test_kmeans_deterministic_and_separates_blobs),
        cmocka_unit_test(test_kmeans_duplicates_and_bad_input),
        cmocka_unit_test(test_silhouette_matches_definition),
        cmocka_unit_test(test_adjusted_rand_published_and_pair_counting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
