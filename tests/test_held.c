/* test_held.c — policies/held.c, the held list of the score-based eviction policies (H2O, Keyformer, Scissorhands,
 * TOVA, D2O, MorphKV), against a naive written-out reference: the eviction scan (lowest score, the newer entry
 * among equals), the top-N mask (larger first, NaN last, -0 equal to +0, the older entry among equals), and whole
 * streams of prefill compressions and decode evictions at budgets 1..N with random scores full of ties, compared
 * bit for bit after every step (POLICY_SPEC §1.4's tie rule); the scores() answer of a held list (kvs_held_scores_of).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "../common/kvs_rng.h"
#include "../policies/held.h"

enum { MAXN = 256 };

/* ---- the naive reference ------------------------------------------------------------------------------ */

typedef struct {
    int32_t pos[MAXN];
    double score[MAXN];
    int64_t n;
} ref_list;

/* 1 when a ranks before b in the top-N order: the larger score, a number before NaN, equal scores by index. */
static int ref_before(double a, int64_t ia, double b, int64_t ib) {
    if (isnan(a) != isnan(b)) return isnan(b);
    if (!isnan(a) && a != b) return a > b;
    return ia < ib;
}

/* keep[j] for the k best of score[0..n): k rounds, each taking the best entry not taken yet. */
static void ref_top_mask(const double *score, int64_t n, int64_t k, char *keep) {
    for (int64_t j = 0; j < n; j++) keep[j] = 0;
    for (int64_t r = 0; r < k && r < n; r++) {
        int64_t best = -1;
        for (int64_t j = 0; j < n; j++)
            if (!keep[j] && (best < 0 || ref_before(score[j], j, score[best], best))) best = j;
        keep[best] = 1;
    }
}

/* The lowest score of [lo, hi) (numbers only), the highest index holding it; lo for a range of at most one. */
static int64_t ref_lowest(const ref_list *r, int64_t lo, int64_t hi) {
    if (hi - lo <= 1) return lo;
    double m = r->score[lo];
    for (int64_t j = lo; j < hi; j++)
        if (r->score[j] < m) m = r->score[j];
    int64_t v = lo;
    for (int64_t j = lo; j < hi; j++)
        if (r->score[j] == m) v = j;
    return v;
}

static void ref_remove(ref_list *r, int64_t v) {
    for (int64_t j = v; j + 1 < r->n; j++) {
        r->pos[j] = r->pos[j + 1];
        r->score[j] = r->score[j + 1];
    }
    r->n--;
}

/* Keeps everything outside [lo, hi) and the k best inside it, in order. */
static void ref_keep_top(ref_list *r, int64_t lo, int64_t hi, int64_t k) {
    char keep[MAXN];
    for (int64_t j = 0; j < r->n; j++) keep[j] = 1;
    ref_top_mask(r->score + lo, hi - lo, k, keep + lo);
    int64_t w = 0;
    for (int64_t j = 0; j < r->n; j++)
        if (keep[j]) {
            r->pos[w] = r->pos[j];
            r->score[w++] = r->score[j];
        }
    r->n = w;
}

/* The list equals the reference: the same positions and the same score bits. */
static void assert_same(kvs_held *h, const ref_list *r) {
    assert_int_equal(kvs_held_count(h), r->n);
    if (r->n == 0) return;
    assert_memory_equal(kvs_held_pos(h), r->pos, (size_t)r->n * sizeof(int32_t));
    assert_memory_equal(kvs_held_score(h), r->score, (size_t)r->n * sizeof(double));
}

/* A score with many ties: multiples of 1/8 in [0, 1). */
static float tied(kvs_rng *g) { return (float)(kvs_rng_u32(g) % 8) / 8.0f; }

/* ---- tests -------------------------------------------------------------------------------------------- */

static void test_lowest_takes_the_newer_of_equal_scores(void **state) {
    (void)state;
    kvs_held *h = kvs_held_create(4);
    assert_non_null(h);
    const float a[4] = {0.5f, 0.25f, 0.75f, 0.25f};
    for (int32_t p = 0; p < 4; p++) kvs_held_push(h, p * 3);
    kvs_held_add(h, a);
    assert_int_equal(kvs_held_lowest(h, 0, 4), 3); /* two 0.25: the newer goes */
    assert_int_equal(kvs_held_lowest(h, 0, 3), 1);
    assert_int_equal(kvs_held_lowest(h, 2, 3), 2); /* one entry: itself */
    assert_int_equal(kvs_held_lowest(h, 2, 2), 2); /* nothing to rank (a window): lo */
    assert_int_equal(kvs_held_lowest(h, 0, -1), 0);
    kvs_held_remove(h, 3);
    int32_t out[4];
    assert_int_equal(kvs_held_copy(h, out), 3);
    assert_true(out[0] == 0 && out[1] == 3 && out[2] == 6);
    kvs_held_free(h);
    kvs_held_free(NULL);
}

static void test_top_mask_against_reference(void **state) {
    (void)state;
    kvs_rng g;
    kvs_rng_seed(&g, 2024, 1);
    double score[64];
    char keep[64], want[64];
    int32_t scratch[64];
    for (int trial = 0; trial < 3000; trial++) {
        int64_t n = 1 + (int64_t)(kvs_rng_u32(&g) % 48);
        for (int64_t j = 0; j < n; j++) {
            uint32_t u = kvs_rng_u32(&g) % 16;
            score[j] = u == 0 ? NAN : u == 1 ? -0.0 : u == 2 ? 0.0 : (double)(u % 5) / 4.0 - 0.25;
        }
        int64_t k = (int64_t)(kvs_rng_u32(&g) % (uint32_t)(n + 3)) - 1; /* -1 .. n + 1 */
        ref_top_mask(score, n, k < 0 ? 0 : k, want);
        memset(keep, 7, sizeof keep);
        kvs_held_top_mask(score, n, k, keep, scratch);
        assert_memory_equal(keep, want, (size_t)n);
    }
    /* ties: the older entry is kept; NaN after every number; -0 ties with +0 */
    const double tie[5] = {0.2, 0.5, 0.2, NAN, 0.2};
    kvs_held_top_mask(tie, 5, 2, keep, scratch);
    assert_true(keep[0] && keep[1] && !keep[2] && !keep[3] && !keep[4]);
    kvs_held_top_mask(tie, 5, 4, keep, scratch);
    assert_true(keep[0] && keep[1] && keep[2] && !keep[3] && keep[4]);
    const double zeros[3] = {-1.0, 0.0, -0.0};
    kvs_held_top_mask(zeros, 3, 1, keep, scratch);
    assert_true(!keep[0] && keep[1] && !keep[2]);
    const double zeros2[3] = {-1.0, -0.0, 0.0};
    kvs_held_top_mask(zeros2, 3, 1, keep, scratch);
    assert_true(!keep[0] && keep[1] && !keep[2]);
}

/* Attend-then-evict streams as H2O, Keyformer and D2O run them: a prompt compressed to B-1 (sinks and a recent
 * window protected, the best of the rest kept), then per decode step the new token pushed, one row of tied
 * attention added, and the lowest non-protected entry evicted once B are held. Every budget 1..N, several
 * protected splits, checked against the reference after every step. */
static void test_streams_against_reference_at_every_budget(void **state) {
    (void)state;
    kvs_rng g;
    kvs_rng_seed(&g, 7, 3);
    float row[MAXN];
    double trow[MAXN];
    for (int64_t B = 1; B <= 24; B++)
        for (int64_t recent = 0; recent <= B; recent += (B > 6 ? 3 : 1))
            for (int64_t sinks = 0; sinks <= 2 && sinks + recent <= B; sinks++) {
                kvs_held *h = kvs_held_create(B);
                assert_non_null(h);
                ref_list r = {.n = 0};
                int64_t P = 1 + (int64_t)(kvs_rng_u32(&g) % 40);
                assert_int_equal(kvs_held_reserve(h, P), KVS_OK);
                for (int32_t p = 0; p < P; p++) {
                    kvs_held_push(h, p);
                    r.pos[r.n] = p;
                    r.score[r.n++] = 0;
                }
                /* prefill: each prompt row adds fp64 scores over the entries visible to it (causal) */
                for (int64_t i = 0; i < P; i++) {
                    for (int64_t j = 0; j <= i; j++) trow[j] = (double)tied(&g) / 3.0;
                    kvs_held_add_f64(h, trow, i + 1);
                    for (int64_t j = 0; j <= i; j++) r.score[j] += trow[j];
                }
                assert_same(h, &r);
                if (P > B - 1) {
                    int64_t rec = recent > 0 ? recent - 1 : 0, lo = sinks < B - 1 ? sinks : B - 1;
                    if (rec > B - 1 - lo) rec = B - 1 - lo;
                    int64_t hi = P - rec, k = B - 1 - lo - rec;
                    kvs_held_keep_top(h, lo, hi, k);
                    ref_keep_top(&r, lo, hi, k);
                    assert_same(h, &r);
                }
                for (int32_t p = (int32_t)P; p < P + 60; p++) {
                    assert_int_equal(kvs_held_reserve(h, kvs_held_count(h) + 1), KVS_OK);
                    kvs_held_push(h, p);
                    r.pos[r.n] = p;
                    r.score[r.n++] = 0;
                    for (int64_t j = 0; j < r.n; j++) row[j] = tied(&g);
                    kvs_held_add(h, row);
                    for (int64_t j = 0; j < r.n; j++) r.score[j] += row[j];
                    if (r.n < B) continue;
                    int64_t lo = sinks < r.n - 1 ? sinks : r.n - 1, hi = r.n - recent;
                    int64_t v = kvs_held_lowest(h, lo, hi);
                    assert_int_equal(v, ref_lowest(&r, lo, hi));
                    kvs_held_remove(h, v);
                    ref_remove(&r, v);
                    assert_same(h, &r);
                }
                kvs_held_free(h);
            }
}

/* A policy with its own per-entry data compacts it with the mask of kvs_held_mark_top (D2O's K/V, Scissorhands'
 * flags): the mask covers every entry, the protected ranges set. */
static void test_mark_top_then_compact(void **state) {
    (void)state;
    kvs_rng g;
    kvs_rng_seed(&g, 99, 5);
    for (int trial = 0; trial < 500; trial++) {
        int64_t n = 1 + (int64_t)(kvs_rng_u32(&g) % 60);
        kvs_held *h = kvs_held_create(1);
        assert_non_null(h);
        assert_int_equal(kvs_held_reserve(h, n), KVS_OK);
        ref_list r = {.n = 0};
        int32_t p = 0;
        for (int64_t j = 0; j < n; j++) {
            p += 1 + (int32_t)(kvs_rng_u32(&g) % 3);
            kvs_held_push(h, p);
            kvs_held_score(h)[j] = -(double)(kvs_rng_u32(&g) % 4); /* minus a count, as Scissorhands keeps it */
            r.pos[j] = p;
            r.score[j] = kvs_held_score(h)[j];
        }
        r.n = n;
        int64_t lo = (int64_t)(kvs_rng_u32(&g) % (uint32_t)(n + 1));
        int64_t hi = lo + (int64_t)(kvs_rng_u32(&g) % (uint32_t)(n - lo + 1));
        int64_t k = (int64_t)(kvs_rng_u32(&g) % (uint32_t)(hi - lo + 2));
        char keep[MAXN], want[MAXN];
        kvs_held_mark_top(h, lo, hi, k, keep);
        for (int64_t j = 0; j < n; j++) want[j] = 1;
        ref_top_mask(r.score + lo, hi - lo, k, want + lo);
        assert_memory_equal(keep, want, (size_t)n);
        kvs_held_compact(h, keep);
        ref_keep_top(&r, lo, hi, k);
        assert_same(h, &r);
        kvs_held_free(h);
    }
}

/* The GQA group's reduction: the heads' probabilities summed from +0 in head order in fp64, divided for the mean,
 * then added to the running score; and a fresh score (TOVA) after kvs_held_reset_scores. */
static void test_add_heads_sum_and_mean(void **state) {
    (void)state;
    kvs_rng g;
    kvs_rng_seed(&g, 11, 2);
    enum { N = 37 };
    float rows[8][N];
    const float *probs[8];
    for (int nh = 1; nh <= 8; nh++)
        for (int mean = 0; mean <= 1; mean++) {
            kvs_held *h = kvs_held_create(N);
            assert_non_null(h);
            double want[N];
            for (int32_t p = 0; p < N; p++) {
                kvs_held_push(h, p);
                want[p] = 0;
            }
            for (int step = 0; step < 3; step++) {
                if (step == 2) {
                    kvs_held_reset_scores(h);
                    for (int j = 0; j < N; j++) want[j] = 0;
                }
                for (int hd = 0; hd < nh; hd++) {
                    for (int j = 0; j < N; j++) rows[hd][j] = (float)kvs_rng_open01(&g);
                    probs[hd] = rows[hd];
                }
                kvs_held_add_heads(h, probs, nh, mean);
                for (int j = 0; j < N; j++) {
                    double t = 0;
                    for (int hd = 0; hd < nh; hd++) t += rows[hd][j];
                    want[j] += mean ? t / nh : t;
                }
                assert_memory_equal(kvs_held_score(h), want, sizeof want);
            }
            kvs_held_free(h);
        }
}

/* Growing and shrinking the capacity keeps the entries; the arrays follow. */
static void test_reserve_and_resize_keep_the_entries(void **state) {
    (void)state;
    kvs_held *h = kvs_held_create(0);
    assert_non_null(h);
    for (int32_t p = 0; p < 1000; p++) {
        assert_int_equal(kvs_held_reserve(h, kvs_held_count(h) + 1), KVS_OK);
        kvs_held_push(h, 2 * p);
        kvs_held_score(h)[p] = p * 0.5;
    }
    char keep[1000];
    for (int j = 0; j < 1000; j++) keep[j] = j % 7 == 0;
    kvs_held_compact(h, keep);
    assert_int_equal(kvs_held_count(h), 143);
    assert_int_equal(kvs_held_resize(h, 10), KVS_OK); /* never below the count */
    assert_int_equal(kvs_held_resize(h, 143), KVS_OK);
    for (int64_t j = 0; j < 143; j++) {
        assert_int_equal(kvs_held_pos(h)[j], 14 * j);
        assert_true(kvs_held_score(h)[j] == (double)(7 * j) * 0.5);
    }
    kvs_held_keep_top(h, 0, 143, 5); /* the five largest are the newest */
    assert_int_equal(kvs_held_count(h), 5);
    assert_int_equal(kvs_held_pos(h)[0], 14 * 138);
    assert_int_equal(kvs_held_resize(h, 0), KVS_OK);
    assert_int_equal(kvs_held_count(h), 5);
    kvs_held_free(h);
}

/* kvs_held_scores_of: a held position's score inside the ranked range, INFINITY outside it (protected) and for a
 * position not held; lo/hi clamped; positions asked in any order. */
static void test_scores_of_ranked_protected_and_absent(void **state) {
    (void)state;
    kvs_held *h = kvs_held_create(8);
    assert_non_null(h);
    const int32_t pos[6] = {2, 5, 7, 11, 12, 20};
    for (int j = 0; j < 6; j++) kvs_held_push(h, pos[j]);
    double *sc = kvs_held_score(h);
    for (int j = 0; j < 6; j++) sc[j] = 0.5 * j - 1;
    const int32_t ask[7] = {20, 2, 7, 3, 12, 5, 11};
    double out[7];
    kvs_held_scores_of(h, 1, 4, ask, 7, out); /* ranked: entries 1..3 = positions 5, 7, 11 */
    const double want[7] = {INFINITY, INFINITY, 0.0, INFINITY, INFINITY, -0.5, 0.5};
    for (int j = 0; j < 7; j++) assert_true(out[j] == want[j]);
    kvs_held_scores_of(h, -3, 99, ask, 7, out); /* clamped: every held entry ranked */
    const double all[7] = {1.5, -1.0, 0.0, INFINITY, 1.0, -0.5, 0.5};
    for (int j = 0; j < 7; j++) assert_true(out[j] == all[j]);
    kvs_held_scores_of(h, 0, -2, ask, 7, out); /* an empty range: everything protected */
    for (int j = 0; j < 7; j++) assert_true(isinf(out[j]) && out[j] > 0);
    kvs_held_free(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lowest_takes_the_newer_of_equal_scores),
        cmocka_unit_test(test_top_mask_against_reference),
        cmocka_unit_test(test_streams_against_reference_at_every_budget),
        cmocka_unit_test(test_mark_top_then_compact),
        cmocka_unit_test(test_add_heads_sum_and_mean),
        cmocka_unit_test(test_reserve_and_resize_keep_the_entries),
        cmocka_unit_test(test_scores_of_ranked_protected_and_absent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
