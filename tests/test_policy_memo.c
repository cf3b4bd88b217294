/* test_policy_memo.c — the replay task's memo of prefill scores (sim/policy_memo.h; issue 17, sim/BENCH.md
 * "Third pass"):
 *  - kvs_policy_colsum() / kvs_policy_snapkv_scores() against kvs_attn_colsum() / kvs_snapkv_scores() called
 *    directly, bit for bit, on the miss that stores and on the hit that copies (fp32 and fp64 outputs, every
 *    head reduction, a KVS_GQA_NONE output whose rows are further apart than they are long);
 *  - what must not hit: other candidates, other options, other rows, a running score to add to, a cleared memo,
 *    a view without a memo;
 *  - the replay: every policy that calls them (H2O in both layouts, TOVA, Scissorhands, SnapKV, PyramidKV,
 *    RocketKV, D2O), several budgets of each in one task, single- and multi-turn, with the memo (the default)
 *    and without (prefill_memo = -1): every step sample and every aggregate the same bits.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/kvs.h"
#include "common/kvs_math.h"
#include "sim/policy.h"
#include "sim/policy_memo.h"
#include "sim/replay.h"
#include "sim/replay_mem.h"
#include "tests/util/replay_fixture.h"

enum { NQ = 40, GROUP = 4, D = 24, NCAND = 36 };

typedef struct {
    float q[NQ * GROUP * D], keys[NQ * D];
    int32_t idx[NCAND];
    void *scratch;
} data;

static void data_init(data *x) {
    uint64_t s = 12345;
    for (size_t i = 0; i < sizeof x->q / sizeof *x->q; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x->q[i] = 2.0f * ((float)(s >> 40) / 16777216.0f - 0.5f);
    }
    for (size_t i = 0; i < sizeof x->keys / sizeof *x->keys; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x->keys[i] = 2.0f * ((float)(s >> 40) / 16777216.0f - 0.5f);
    }
    for (int j = 0, p = 0; j < NCAND; j++, p++) { /* ascending, a few positions skipped */
        if (j % 9 == 4) p++;
        x->idx[j] = p;
    }
    x->scratch = malloc(kvs_attn_colsum_scratch_bytes(NCAND));
    assert_non_null(x->scratch);
}

static kvs_attn_src src_of(data *x) {
    return (kvs_attn_src){.q = x->q, .q_first = 0, .n_q = NQ, .group = GROUP, .d = D, .scale = 0.3f,
                          .keys = x->keys, .idx = x->idx, .n_cand = NCAND};
}

static void test_colsum_hit_and_miss_same_bits(void **st) {
    (void)st;
    data x;
    data_init(&x);
    kvs_policy_memo *m = kvs_policy_memo_create();
    assert_non_null(m);
    kvs_policy_view view = {.memo = m};
    const kvs_gqa_reduce reds[] = {KVS_GQA_SUM, KVS_GQA_MEAN, KVS_GQA_MAX, KVS_GQA_NONE};
    int64_t hits = 0;
    for (int prec = 0; prec < 2; prec++)
        for (int ri = 0; ri < 4; ri++) {
            kvs_attn_src src = src_of(&x);
            kvs_colsum_opts co = {.row_first = 4, .n_rows = NQ - 4, .head_first = 1, .n_heads = 3,
                                  .reduce = reds[ri], .n_out = NCAND - 2,
                                  .head_stride = reds[ri] == KVS_GQA_NONE ? NCAND + 5 : 0};
            enum { CAP = 3 * (NCAND + 5) };
            double ref64[CAP], got64[CAP];
            float ref32[CAP], got32[CAP];
            for (int call = 0; call < 3; call++) { /* a miss, then two hits */
                for (int i = 0; i < CAP; i++) { /* between NONE's rows: values that must stay untouched */
                    ref64[i] = got64[i] = 0;
                    ref32[i] = got32[i] = 0;
                    if (reds[ri] == KVS_GQA_NONE && i % (NCAND + 5) >= NCAND - 2) ref64[i] = got64[i] = ref32[i] = got32[i] = 7;
                }
                kvs_attn_colsum(&src, &co, prec ? NULL : ref32, prec ? ref64 : NULL, x.scratch);
                kvs_policy_colsum(&view, &src, &co, prec ? NULL : got32, prec ? got64 : NULL, x.scratch);
                if (prec) assert_memory_equal(ref64, got64, sizeof ref64);
                else assert_memory_equal(ref32, got32, sizeof ref32);
                assert_int_equal(kvs_policy_memo_hits(m), hits + call);
            }
            hits += 2;
        }
    kvs_policy_memo_free(m);
    free(x.scratch);
}

static void test_colsum_what_must_not_hit(void **st) {
    (void)st;
    data x;
    data_init(&x);
    kvs_policy_memo *m = kvs_policy_memo_create();
    kvs_policy_view view = {.memo = m};
    kvs_attn_src src = src_of(&x);
    kvs_colsum_opts co = {.row_first = 0, .n_rows = NQ, .head_first = 0, .n_heads = GROUP, .reduce = KVS_GQA_MEAN,
                          .n_out = NCAND};
    double ref[NCAND], got[NCAND];
    memset(got, 0, sizeof got);
    kvs_policy_colsum(&view, &src, &co, NULL, got, x.scratch); /* stored */
    assert_int_equal(kvs_policy_memo_hits(m), 0);
    /* a running score to add to: computed, and equal to kvs_attn_colsum adding to it */
    for (int j = 0; j < NCAND; j++) ref[j] = got[j] = 0.25 * j;
    kvs_attn_colsum(&src, &co, NULL, ref, x.scratch);
    kvs_policy_colsum(&view, &src, &co, NULL, got, x.scratch);
    assert_memory_equal(ref, got, sizeof ref);
    assert_int_equal(kvs_policy_memo_hits(m), 0);
    /* other candidates (same count), other options, other query rows: misses with their own results */
    for (int variant = 0; variant < 3; variant++) {
        kvs_attn_src s2 = src;
        kvs_colsum_opts c2 = co;
        int32_t idx2[NCAND];
        memcpy(idx2, x.idx, sizeof idx2);
        if (variant == 0) {
            idx2[3]++;
            s2.idx = idx2;
        } else if (variant == 1) {
            c2.row_first = 1;
            c2.n_rows = NQ - 1;
        } else {
            s2.q = x.q + GROUP * D; /* the rows of another position */
            s2.n_q = NQ - 1;
            c2.n_rows = NQ - 1;
        }
        memset(ref, 0, sizeof ref);
        memset(got, 0, sizeof got);
        kvs_attn_colsum(&s2, &c2, NULL, ref, x.scratch);
        kvs_policy_colsum(&view, &s2, &c2, NULL, got, x.scratch);
        assert_memory_equal(ref, got, sizeof ref);
        assert_int_equal(kvs_policy_memo_hits(m), 0);
    }
    /* the first call again: a hit; after a clear: a miss */
    memset(got, 0, sizeof got);
    kvs_policy_colsum(&view, &src, &co, NULL, got, x.scratch);
    assert_int_equal(kvs_policy_memo_hits(m), 1);
    kvs_policy_memo_clear(m);
    memset(got, 0, sizeof got);
    kvs_policy_colsum(&view, &src, &co, NULL, got, x.scratch);
    assert_int_equal(kvs_policy_memo_hits(m), 1);
    /* no memo in the view (allocation passes, other engines): plain computation */
    kvs_policy_view bare = {0};
    memset(got, 0, sizeof got);
    memset(ref, 0, sizeof ref);
    kvs_attn_colsum(&src, &co, NULL, ref, x.scratch);
    kvs_policy_colsum(&bare, &src, &co, NULL, got, x.scratch);
    assert_memory_equal(ref, got, sizeof ref);
    kvs_policy_memo_free(m);
    kvs_policy_memo_free(NULL);
    free(x.scratch);
}

/* The computations of a position with many KV heads and query heads (Llama-3.1-8B: H2O alone asks for 32) all
 * stay: 64 distinct ones stored, then every one a hit with its own bits. */
static void test_many_entries_all_hit(void **st) {
    (void)st;
    data x;
    data_init(&x);
    kvs_policy_memo *m = kvs_policy_memo_create();
    kvs_policy_view view = {.memo = m};
    kvs_attn_src src = src_of(&x);
    enum { N_DISTINCT = 64 };
    static double first[N_DISTINCT][NCAND];
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < N_DISTINCT; i++) {
            kvs_colsum_opts co = {.row_first = i % (NQ / 2), .n_rows = NQ / 2, .head_first = i / (NQ / 2),
                                  .n_heads = 1, .reduce = KVS_GQA_SUM, .n_out = NCAND};
            double got[NCAND] = {0};
            kvs_policy_colsum(&view, &src, &co, NULL, got, x.scratch);
            if (pass == 0) memcpy(first[i], got, sizeof got);
            else assert_memory_equal(first[i], got, sizeof got);
        }
    assert_int_equal(kvs_policy_memo_hits(m), N_DISTINCT);
    kvs_policy_memo_free(m);
    free(x.scratch);
}

static void test_snapkv_scores_hit_and_miss_same_bits(void **st) {
    (void)st;
    data x;
    data_init(&x);
    kvs_policy_memo *m = kvs_policy_memo_create();
    kvs_policy_view view = {.memo = m};
    /* the window queries must be the last candidates: candidates 0..NQ-1 without gaps */
    kvs_attn_src src = {.q = x.q, .q_first = 0, .n_q = NQ, .group = GROUP, .d = D, .scale = 0.3f, .keys = x.keys,
                        .idx = NULL, .n_cand = NQ};
    const kvs_gqa_reduce reds[] = {KVS_GQA_MEAN, KVS_GQA_MAX, KVS_GQA_NONE};
    int64_t hits = 0;
    for (int ri = 0; ri < 3; ri++)
        for (int pool = 0; pool < 2; pool++) {
            kvs_snapkv_opts so = {.window = 8, .kernel = 5, .pool = pool ? KVS_POOL_AVG : KVS_POOL_MAX,
                                  .head_first = 0, .n_heads = GROUP, .reduce = reds[ri]};
            for (int call = 0; call < 2; call++) {
                float ref[GROUP * NQ], got[GROUP * NQ];
                memset(ref, 0x5a, sizeof ref);
                memset(got, 0x5a, sizeof got);
                int64_t mr = kvs_snapkv_scores(&src, &so, ref, x.scratch);
                int64_t mg = kvs_policy_snapkv_scores(&view, &src, &so, got, x.scratch);
                assert_int_equal(mr, NQ - 8);
                assert_int_equal(mg, mr);
                assert_memory_equal(ref, got, sizeof ref);
                assert_int_equal(kvs_policy_memo_hits(m), hits + call);
            }
            hits++;
        }
    kvs_policy_memo_free(m);
    free(x.scratch);
}

/* ---- the replay with and without the memo ---- */

static const char *const memo_specs[] = {"h2o", "h2o:gqa=mean", "tova", "scissorhands", "snapkv", "snapkv:gqa=mean",
                                         "pyramidkv", "rocketkv", "d2o", "window"};
#define N_MEMO_SPECS (int)(sizeof memo_specs / sizeof memo_specs[0])
static const int64_t memo_budgets[] = {6, 12, 20, 33};
#define N_MEMO_BUDGETS (int)(sizeof memo_budgets / sizeof memo_budgets[0])

static kvs_replay_result *replay_memo(const kvs_test_replay_fixture *f, int prefill_memo, int threads) {
    static kvs_replay_config cfg[N_MEMO_SPECS * N_MEMO_BUDGETS];
    int nc = 0;
    for (int i = 0; i < N_MEMO_SPECS; i++)
        for (int b = 0; b < N_MEMO_BUDGETS; b++, nc++) {
            assert_int_equal(kvs_policy_parse(memo_specs[i], &cfg[nc].policy), KVS_OK);
            cfg[nc].budget = memo_budgets[b];
            cfg[nc].budget_fraction = -1;
        }
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, &src), KVS_OK);
    kvs_replay_opts o = {.configs = cfg, .n_configs = nc, .threads = threads, .measure = KVS_MEASURE_ALL,
                         .series_every = 1, .prefill_memo = prefill_memo};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
    return r;
}

static void assert_same_results(const kvs_replay_result *a, const kvs_replay_result *b) {
    assert_int_equal(a->n_runs, b->n_runs);
    int64_t steps = 0, ok = 0;
    for (int i = 0; i < a->n_runs; i++) {
        assert_int_equal(a->runs[i].status, b->runs[i].status);
        ok += a->runs[i].status == KVS_OK;
        assert_memory_equal(&a->runs[i].run_agg, &b->runs[i].run_agg, sizeof a->runs[i].run_agg);
        for (int l = 0; l < a->runs[i].n_layers; l++)
            assert_memory_equal(&a->runs[i].layer_aggs[l], &b->runs[i].layer_aggs[l], sizeof a->runs[i].layer_aggs[l]);
        assert_int_equal(a->runs[i].n_steps, b->runs[i].n_steps);
        for (int64_t s = 0; s < a->runs[i].n_steps; s++) {
            const kvs_results_step *x = &a->runs[i].steps[s], *y = &b->runs[i].steps[s];
            assert_true(x->layer == y->layer && x->q_head == y->q_head && x->position == y->position);
            assert_memory_equal(x->v, y->v, sizeof x->v);
        }
        steps += a->runs[i].n_steps;
    }
    print_message("%lld runs ok, %lld step samples compared, memo on vs off\n", (long long)ok, (long long)steps);
    assert_true(ok >= a->n_runs - N_MEMO_BUDGETS); /* nearly all ran (a policy may refuse a tiny budget) */
    assert_true(steps > 10000);
}

static void test_replay_memo_same_numbers(void **st) {
    (void)st;
    for (int turns = 1; turns <= 2; turns++) {
        kvs_gen_trace_opts o = kvs_test_grouped_opts(turns, 4, 90, turns == 1 ? 50 : -1, 16, 11);
        kvs_test_replay_fixture f;
        assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 11, &f), KVS_OK);
        kvs_replay_result *on = replay_memo(&f, 0, 1), *off = replay_memo(&f, -1, 1), *on2 = replay_memo(&f, 0, 2);
        assert_same_results(on, off);
        assert_same_results(on2, off);
        kvs_replay_result_free(on);
        kvs_replay_result_free(off);
        kvs_replay_result_free(on2);
        kvs_test_replay_fixture_free(&f);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_colsum_hit_and_miss_same_bits),
        cmocka_unit_test(test_colsum_what_must_not_hit),
        cmocka_unit_test(test_many_entries_all_hit),
        cmocka_unit_test(test_snapkv_scores_hit_and_miss_same_bits),
        cmocka_unit_test(test_replay_memo_same_numbers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
