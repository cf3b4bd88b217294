/* test_ref_rank.c — the replay's ranking of the full attention for the top-k overlap, only as deep as asked
 * (sim/ref_rank.h; POLICY_SPEC.md §1.6 topk_overlap):
 *  - kvs_ref_rank_prefix() against the whole ranking (kvs_argsort_desc) and, on
 *    short rows, against a naive pairwise ranking written from kvs_topk's rule (descending value, ties to the
 *    lower index, -0 equal to +0, NaN last), on many random rows: softmax-like probabilities, few distinct
 *    values (ties), signed zeros, negatives, infinities, subnormals, NaNs, all equal; depths 0, 1, n-1, n, > n
 *    and random, row lengths around the radix's bucket and byte boundaries;
 *  - kvs_ref_rank_positions(): rank[x] < k as with the whole ranking's ranks for every position and many
 *    k up to the depth ranked (ties at the cut, NaN cuts), every rank exact above the depth;
 *  - the replay: a per-query-head oracle test policy computes the expected overlap of its own lists from the
 *    full attention it is shown (a naive ranking), at budgets whose lists are shorter, longer and as long as the
 *    row, in an order that makes the engine rank deeper within a step, one with a merged slot; attention with
 *    exact ties (repeated key rows; sharp queries whose probabilities underflow to +0). Every step sample's
 *    topk_overlap is the naive one; two full caches (lists 0..p, whose recall the engine sums once per step and
 *    head) have overlap 1 and the recall of the full attention summed in order. Data: GENERATED (tests/util/gen_trace.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../sim/policy.h"
#include "../policies/registry.h"
#include "../sim/ref_rank.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 32);
}
static float rnd_unit(void) { return (float)(rnd() >> 8) / 16777216.0f; }

/* kvs_topk's rule, written out: 1 when position a comes before position b. */
static int before(const float *x, int32_t a, int32_t b) {
    float va = x[a], vb = x[b];
    int na = isnan(va) != 0, nb = isnan(vb) != 0;
    if (na != nb) return nb;
    if (!na && va != vb) return va > vb;
    return a < b;
}

enum { N_KINDS = 8 };

/* Row kind k of length n. */
static void make_row(float *x, size_t n, int kind) {
    for (size_t i = 0; i < n; i++) {
        float u = rnd_unit();
        switch (kind) {
        case 0: x[i] = expf(8.0f * (u - 1.0f)); break;                    /* softmax-like, all distinct-ish */
        case 1: x[i] = (float)(rnd() % 5) * 0.125f; break;                 /* 5 levels: ties everywhere */
        case 2: x[i] = (rnd() % 3) ? ((rnd() & 1) ? -0.0f : 0.0f) : u; break; /* mostly +-0 */
        case 3: x[i] = (u - 0.5f) * 1e3f; break;                           /* negatives and positives */
        case 4: {                                                          /* specials */
            uint32_t r = rnd() % 8;
            x[i] = r == 0 ? INFINITY : r == 1 ? -INFINITY : r == 2 ? 1e-42f : r == 3 ? -1e-42f : u - 0.5f;
            break;
        }
        case 5: x[i] = (rnd() % 4) ? NAN : (float)(rnd() % 7); break;      /* NaNs with ties */
        case 6: x[i] = 0.25f; break;                                      /* all equal */
        default: x[i] = expf(-30.0f * u) * (float)(rnd() % 2); break;     /* probabilities with underflowed zeros */
        }
    }
}

/* The first m of the whole ranking `full` equal `order`, m in [min(depth, n), n]; with naive, also the pairwise
 * rule. */
static void check_prefix(const float *x, size_t n, size_t depth, const int32_t *full, int32_t *order,
                         uint32_t *scratch, int naive) {
    size_t m = kvs_ref_rank_prefix(x, n, depth, order, scratch);
    size_t lo = depth < n ? depth : n;
    if (m < lo || m > n) {
        print_error("n %zu depth %zu: m %zu\n", n, depth, m);
        fail();
    }
    for (size_t r = 0; r < m; r++)
        if (order[r] != full[r]) {
            print_error("n %zu depth %zu: entry %zu is %d, the whole ranking's %d\n", n, depth, r, order[r], full[r]);
            fail();
        }
    if (naive)
        for (size_t r = 0; r < m; r++) { /* order[r] has exactly r positions before it */
            size_t ahead = 0;
            for (size_t y = 0; y < n; y++) ahead += before(x, (int32_t)y, order[r]);
            assert_int_equal(ahead, r);
        }
}

static void test_prefix_is_the_whole_rankings_head(void **state) {
    (void)state;
    enum { MAXN = 2200 };
    float *x = malloc(MAXN * sizeof *x);
    int32_t *full = malloc(MAXN * sizeof *full), *order = malloc(MAXN * sizeof *order);
    uint32_t *scratch = malloc(3 * MAXN * sizeof *scratch);
    assert_true(x && full && order && scratch);
    const size_t lens[] = {1, 2, 3, 5, 17, 33, 255, 256, 257, 600, 1000, 2047, 2048, 2049, 2200};
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        size_t n = lens[li];
        for (int kind = 0; kind < N_KINDS; kind++)
            for (int rep = 0; rep < 3; rep++) {
                make_row(x, n, kind);
                kvs_argsort_desc(x, n, full, scratch);
                int naive = n <= 300;
                size_t depths[] = {0, 1, 2, n / 4, n / 2, n > 1 ? n - 1 : 1, n, n + 3, 1 + rnd() % n, 1 + rnd() % n};
                for (size_t di = 0; di < sizeof depths / sizeof *depths; di++)
                    check_prefix(x, n, depths[di], full, order, scratch, naive);
            }
    }
    free(x);
    free(full);
    free(order);
    free(scratch);
}

static void test_ranks_below_the_depth_are_exact(void **state) {
    (void)state;
    enum { MAXN = 700 };
    float x[MAXN];
    int32_t full[MAXN], order[MAXN], rank[MAXN], want[MAXN];
    uint32_t scratch[3 * MAXN];
    const size_t lens[] = {1, 2, 7, 64, 300, 700};
    int64_t nan_cuts = 0, tied_cuts = 0;
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        size_t n = lens[li];
        for (int kind = 0; kind < N_KINDS; kind++)
            for (int rep = 0; rep < 4; rep++) {
                make_row(x, n, kind);
                kvs_argsort_desc(x, n, full, scratch);
                for (size_t r = 0; r < n; r++) want[full[r]] = (int32_t)r;
                size_t depth = 1 + rnd() % n;
                size_t m = kvs_ref_rank_prefix(x, n, depth, order, scratch);
                for (size_t pos = 0; pos < n; pos++) rank[pos] = -7; /* every entry must be written */
                kvs_ref_rank_positions(order, m, n, rank);
                for (size_t k = 1; k <= m; k += 1 + (m > 64 ? rnd() % 9 : 0)) {
                    nan_cuts += isnan(x[full[k - 1]]) != 0;
                    /* a tie at the cut: the tie order decides membership */
                    tied_cuts += k < n && (x[full[k]] == x[full[k - 1]] || (isnan(x[full[k]]) && isnan(x[full[k - 1]])));
                    for (size_t pos = 0; pos < n; pos++)
                        if ((rank[pos] < (int32_t)k) != (want[pos] < (int32_t)k)) {
                            print_error("kind %d n %zu first %zu, pos %zu: rank %d, the whole ranking's %d\n", kind, n,
                                        k, pos, rank[pos], want[pos]);
                            fail();
                        }
                }
                for (size_t pos = 0; pos < n; pos++) /* exact above the depth, the depth below it */
                    assert_int_equal(rank[pos], want[pos] < (int32_t)m ? want[pos] : (int32_t)m);
            }
    }
    assert_true(nan_cuts > 0);
    assert_true(tied_cuts > 0);
}

/* ---- the replay: an oracle test policy that knows the expected overlap of its lists ---- */

enum { T_POS = 150, T_PROMPT = 50, T_D = 8 };

static const int64_t g_budgets[] = {3, 40, 9, 150, 17, 64, 41}; /* 150: every list is the whole row */
enum { N_CFG = sizeof g_budgets / sizeof *g_budgets };

enum { T_L = 2, T_HKV = 2, T_G = 4 };
static double g_expect[N_CFG][T_L][T_HKV * T_G][T_POS]; /* NaN: no step */
static int64_t g_tied_cuts;                             /* cuts inside a run of equal probabilities */
static double g_prefix_recall[T_L][T_HKV * T_G][T_POS]; /* the full attention's sum over 0..p in order */

typedef struct {
    int layer, kv_head, cfg;
    float row[T_D]; /* the merged slot's K and V row */
} oracle_state;

static kvs_status oracle_create(const kvs_policy_init *init, void **st) {
    oracle_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "rank_test");
    s->layer = init->layer;
    s->kv_head = init->kv_head;
    s->cfg = -1;
    for (int c = 0; c < N_CFG; c++)
        if (g_budgets[c] == init->budget_nominal) s->cfg = c;
    *st = s;
    return s->cfg >= 0 ? KVS_OK : kvs_fail(KVS_ERR_STATE, "rank_test: unknown budget");
}
static kvs_status oracle_prefill(void *st, const kvs_policy_view *v) {
    (void)st;
    (void)v;
    return KVS_OK;
}
/* List g: min(budget, p+1) consecutive positions (mod p+1) from a pseudo-random start; an odd budget makes its
 * first entry a merged slot. The expected overlap: members with fewer than |list| positions before them in
 * the full attention shown (naive pairwise ranking). */
static kvs_status oracle_select(void *st, const kvs_policy_view *v, kvs_policy_sel *sel) {
    oracle_state *s = st;
    int64_t p = v->n - 1, B = g_budgets[s->cfg];
    int64_t len = B < p + 1 ? B : p + 1;
    for (int g = 0; g < sel->n_lists; g++) {
        uint64_t z = ((uint64_t)s->kv_head * 131u + (uint64_t)p * 7919u + (uint64_t)g * 104729u + (uint64_t)s->cfg) *
                     0x9e3779b97f4a7c15ull;
        int64_t start = (int64_t)((z >> 33) % (uint64_t)(p + 1));
        for (int64_t j = 0; j < len; j++) sel->idx[g][j] = (int32_t)((start + j) % (p + 1));
        sel->n[g] = len;
        if (B % 2 == 1 && len >= 2) {
            memcpy(s->row, v->k + (size_t)sel->idx[g][0] * T_D, sizeof s->row);
            sel->row_k[g][0] = s->row;
            sel->row_v[g][0] = s->row;
        }
        const float *fp = v->full_probs + (size_t)g * (size_t)v->n;
        int64_t hit = 0;
        for (int64_t j = 0; j < len; j++) {
            int32_t x = sel->idx[g][j];
            int64_t ahead = 0;
            for (int32_t y = 0; y <= p; y++) ahead += before(fp, y, x);
            hit += ahead < len;
        }
        if (len <= p) { /* the len-th and (len+1)-th largest equal: count the cut as tied */
            int64_t eq_ahead = 0, eq = 0;
            for (int32_t x = 0; x <= p; x++) {
                int64_t ahead = 0;
                for (int32_t y = 0; y <= p && ahead <= len; y++) ahead += before(fp, y, x);
                if (ahead == len - 1) eq_ahead = 1, eq = x;
            }
            if (eq_ahead)
                for (int32_t y = 0; y <= p; y++)
                    if (y != eq && fp[y] == fp[eq]) {
                        g_tied_cuts++;
                        break;
                    }
        }
        g_expect[s->cfg][s->layer][s->kv_head * T_G + g][p] = (double)hit / (double)len;
        double sum = 0;
        for (int32_t y = 0; y <= p; y++) sum += fp[y];
        g_prefix_recall[s->layer][s->kv_head * T_G + g][p] = sum;
    }
    return KVS_OK;
}

static const struct kvs_policy_ops oracle_ops = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "rank_test", .summary = "test: per-query-head lists whose top-k overlap it computes itself",
    .granularity = KVS_SEL_PER_QUERY_HEAD, .budget_scope = KVS_BUDGET_EVERY_STEP, .is_oracle = 1,
    .create = oracle_create, .free = free, .prefill = oracle_prefill, .select = oracle_select,
};

static void check_replay(int threads) {
    kvs_gen_trace_opts o = kvs_test_grouped_opts(1, T_G, T_POS, T_PROMPT, T_D, 77);
    o.q_scale = 12.0f; /* sharp: many probabilities underflow to +0, ties in the tail */
    kvs_test_replay_fixture f;
    assert_int_equal(kvs_test_replay_fixture_make(&o, 4, 13, &f), KVS_OK);
    assert_true(f.L == T_L && f.Hkv == T_HKV && f.G == T_G && f.d == T_D && f.N == T_POS);
    /* repeated key rows: equal scores, equal probabilities (exact ties above zero) */
    for (int l = 0; l < T_L; l++)
        for (int64_t x = 1; x < T_POS; x++)
            if (x % 4 != 0)
                for (int h = 0; h < T_HKV; h++)
                    memcpy(f.g->k + (((size_t)l * T_POS + (size_t)x) * T_HKV + (size_t)h) * T_D,
                           f.g->k + (((size_t)l * T_POS + (size_t)(x - x % 4)) * T_HKV + (size_t)h) * T_D,
                           T_D * sizeof(float));
    for (size_t i = 0; i < sizeof g_expect / sizeof(double); i++) (&g_expect[0][0][0][0])[i] = NAN;
    for (size_t i = 0; i < sizeof g_prefix_recall / sizeof(double); i++) (&g_prefix_recall[0][0][0])[i] = NAN;
    g_tied_cuts = 0;
    kvs_replay_config rc[N_CFG + 2]; /* the test policy at every budget, then two full caches (one list: 0..p) */
    for (int c = 0; c < N_CFG; c++) {
        rc[c] = (kvs_replay_config){.budget = g_budgets[c], .budget_fraction = -1};
        kvs_policy_defaults(&oracle_ops, &rc[c].policy);
    }
    for (int c = N_CFG; c < N_CFG + 2; c++) {
        rc[c] = (kvs_replay_config){.budget = T_POS, .budget_fraction = -1};
        assert_int_equal(kvs_policy_parse("full", &rc[c].policy), KVS_OK);
    }
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    kvs_replay_opts ro = {.configs = rc, .n_configs = N_CFG + 2, .threads = threads, .measure = KVS_MEASURE_DECODE,
                          .series_every = 1};
    kvs_replay_result *r = NULL;
    kvs_status est = kvs_replay_execute(&src, &ro, &r);
    if (est != KVS_OK) print_error("%s\n", kvs_last_error());
    assert_int_equal(est, KVS_OK);
    int64_t checked = 0, partial = 0;
    for (int c = 0; c < N_CFG; c++) {
        const kvs_replay_run_result *run = &r->runs[c];
        if (run->status != KVS_OK) print_error("%s\n", run->error);
        assert_int_equal(run->status, KVS_OK);
        assert_int_equal(run->n_steps, (int64_t)T_L * T_HKV * T_G * (T_POS - T_PROMPT));
        for (int64_t i = 0; i < run->n_steps; i++) {
            const kvs_results_step *s = &run->steps[i];
            double want = g_expect[c][s->layer][s->q_head][s->position];
            assert_false(isnan(want));
            if (s->topk_overlap != (double)(float)want) {
                print_error("budget %lld layer %d head %d position %lld: overlap %.9g, naive %.9g\n",
                            (long long)g_budgets[c], s->layer, s->q_head, (long long)s->position, s->topk_overlap,
                            want);
                fail();
            }
            partial += want < 1.0;
            checked++;
        }
    }
    for (int c = N_CFG; c < N_CFG + 2; c++) { /* the prefix's recall, computed once per step and head, shared */
        const kvs_replay_run_result *run = &r->runs[c];
        assert_int_equal(run->status, KVS_OK);
        assert_int_equal(run->n_steps, (int64_t)T_L * T_HKV * T_G * (T_POS - T_PROMPT));
        for (int64_t i = 0; i < run->n_steps; i++) {
            const kvs_results_step *s = &run->steps[i];
            assert_true(s->topk_overlap == 1.0);
            assert_true(s->attn_recall == (double)(float)g_prefix_recall[s->layer][s->q_head][s->position]);
        }
    }
    assert_true(checked > 0);
    assert_true(partial > checked / 4); /* the lists miss much of the top: the counts are exercised */
    assert_true(g_tied_cuts > 0);
    kvs_replay_result_free(r);
    kvs_test_replay_fixture_free(&f);
}

static void test_replay_overlap_matches_naive_ranking(void **state) {
    (void)state;
    check_replay(1);
    check_replay(3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_is_the_whole_rankings_head),
        cmocka_unit_test(test_ranks_below_the_depth_are_exact),
        cmocka_unit_test(test_replay_overlap_matches_naive_ranking),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
