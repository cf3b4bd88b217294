/* test_policy_memo.c — the replay task's memo of shared scores (sim/policy_memo.h; sim/BENCH.md "Work shared
 * between a task's configurations"):
 *  - kvs_policy_colsum() / kvs_policy_snapkv_scores() against kvs_attn_colsum() / kvs_snapkv_scores() called
 *    directly, bit for bit, on the miss that stores and on the hit that copies (fp32 and fp64 outputs, every
 *    head reduction, a KVS_GQA_NONE output whose rows are further apart than they are long);
 *  - what must not hit: other candidates, other options, other rows, a running score to add to, a cleared memo,
 *    a view without a memo;
 *  - kvs_policy_page_scores() against kvs_page_scores_rows() called directly, bit for bit, miss and hit, and
 *    what must not hit: another page size, key count, key rows, query values at the same address, page count;
 *  - Quest driven directly as the engine drives it (a memo cleared each position), several budgets and both GQA
 *    modes at the fixed page size: the expected number of hits at decode and the selections of a run without
 *    the memo; page=0 at budgets whose derived page sizes differ: no hit (sharing would be wrong), at budgets
 *    deriving the same page size: hits;
 *  - kvs_policy_topk_sorted() against a written-out reference order and kvs_topk_sorted(): every k of small rows
 *    full of ties, NaN, infinities and both zeros, the budgets in three orders, 1 to 3 rows summed; rows of 3000
 *    at a sweep's budgets; what must not hit (other values at the same address, another row count or length,
 *    another address, a cleared memo, no memo); the top-k oracle driven in both GQA modes: hits and selections;
 *  - kvs_policy_shared(): hits only for the same tag, key bytes and view rows; a failed computation is not kept;
 *    checked mode aborts on a caller whose key leaves out a parameter;
 *  - the replay: every policy that calls them (H2O in both layouts, TOVA, Scissorhands, SnapKV, PyramidKV,
 *    RocketKV, D2O, Quest with page=16 in both GQA modes and page=0, the top-k oracle in both GQA modes;
 *    duo_heuristic, Q-Filters, Expected Attention and R-KV in configurations whose parameters enter their shared
 *    prompt scoring and ones whose do not, the allocation pass on one thread and on two),
 *    several budgets of each in one task, single- and multi-turn, with the memo (the default) and without
 *    (prefill_memo = -1): every step sample and every aggregate the same bits;
 *  - the replay with S_t's scores taken from the full reference's (the default) and computed (ref_scores = -1,
 *    sim/BENCH.md "Scores from the reference"): 22 policy configurations, fp32 and 16-bit histories, the same
 *    bits; with the shared output pass of the first (sim/BENCH.md "The shared output pass") in blocks of the
 *    default size, 1, 5 and 7 rows and unblocked.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvs.h"
#include "common/kvs_math.h"
#include "sim/policy.h"
#include "policies/registry.h"
#include "sim/policy_memo.h"
#include "sim/replay.h"
#include "sim/replay_mem.h"
#include "tests/util/replay_fixture.h"
#include "tests/util/testenv.h"

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

/* ---- Quest's decode-time page bounds ---- */

enum { PG_N = NQ - 3, PG_PAGE = 4, PG_PAGES = (PG_N + PG_PAGE - 1) / PG_PAGE };

/* Page min/max summaries of keys[0..n) at page size `page`, as Quest builds them. */
static void build_pages(const float *keys, int64_t n, int64_t page, float *kmin, float *kmax) {
    for (int64_t p = 0; p < n; p++)
        kvs_page_minmax_add(kmin + (size_t)(p / page) * D, kmax + (size_t)(p / page) * D, keys + (size_t)p * D, D,
                            p % page == 0);
}

static void test_page_scores_hit_and_miss(void **st) {
    (void)st;
    data x;
    data_init(&x);
    free(x.scratch);
    kvs_policy_memo *m = kvs_policy_memo_create();
    assert_non_null(m);
    static float kmin[PG_N * D], kmax[PG_N * D], kmin3[PG_N * D], kmax3[PG_N * D];
    build_pages(x.keys, PG_N, PG_PAGE, kmin, kmax);
    build_pages(x.keys, PG_N, 3, kmin3, kmax3);
    kvs_policy_view view = {.n = PG_N, .k = x.keys, .q_first = PG_N - 1, .memo = m};
    float q[GROUP * D];
    memcpy(q, x.q, sizeof q);
    double ref[GROUP * PG_N], got[GROUP * PG_N];
    kvs_page_scores_rows(q, GROUP, D, kmin, kmax, D, PG_PAGES, ref);
    for (int call = 0; call < 3; call++) { /* a miss, then two hits, the same bits */
        memset(got, 0x5a, sizeof got);
        kvs_policy_page_scores(&view, PG_PAGE, q, GROUP, D, kmin, kmax, D, PG_PAGES, got);
        assert_memory_equal(ref, got, GROUP * PG_PAGES * sizeof(double));
        assert_int_equal(kvs_policy_memo_hits(m), call);
    }
    /* what must not hit: each a miss computing its own bits */
    for (int variant = 0; variant < 5; variant++) {
        kvs_policy_view v2 = view;
        int64_t page = PG_PAGE, pages = PG_PAGES;
        const float *mn = kmin, *mx = kmax;
        static float kmin_b[PG_N * D], kmax_b[PG_N * D], keys_b[PG_N * D];
        switch (variant) {
        case 0: /* another page size (Quest page=0 at another budget): other summaries */
            page = 3;
            pages = (PG_N + 2) / 3;
            mn = kmin3;
            mx = kmax3;
            break;
        case 1: /* one key fewer (the previous position): the last page's summary differs */
            v2.n = PG_N - 1;
            build_pages(x.keys, PG_N - 1, PG_PAGE, kmin_b, kmax_b);
            mn = kmin_b;
            mx = kmax_b;
            break;
        case 2: /* other key rows (another KV head) */
            for (size_t i = 0; i < sizeof keys_b / sizeof *keys_b; i++) keys_b[i] = -x.keys[i];
            v2.k = keys_b;
            build_pages(keys_b, PG_N, PG_PAGE, kmin_b, kmax_b);
            mn = kmin_b;
            mx = kmax_b;
            break;
        case 3: /* other query values at the same address (the memo checks the values, not only the address) */
            q[5] = -q[5] + 0.5f;
            break;
        default: /* fewer pages scored */
            pages = PG_PAGES - 1;
            break;
        }
        double r2[GROUP * PG_N], g2[GROUP * PG_N];
        kvs_page_scores_rows(q, GROUP, D, mn, mx, D, (size_t)pages, r2);
        kvs_policy_page_scores(&v2, page, q, GROUP, D, mn, mx, D, (size_t)pages, g2);
        assert_memory_equal(r2, g2, (size_t)(GROUP * pages) * sizeof(double));
        assert_int_equal(kvs_policy_memo_hits(m), 2);
        if (variant == 3) memcpy(q, x.q, sizeof q);
    }
    /* page 0 (a policy whose summaries are not the contract's) and a view without a memo: never memoised */
    kvs_policy_page_scores(&view, 0, q, GROUP, D, kmin, kmax, D, PG_PAGES, got);
    kvs_policy_page_scores(&view, 0, q, GROUP, D, kmin, kmax, D, PG_PAGES, got);
    assert_memory_equal(ref, got, GROUP * PG_PAGES * sizeof(double));
    kvs_policy_view bare = view;
    bare.memo = NULL;
    kvs_policy_page_scores(&bare, PG_PAGE, q, GROUP, D, kmin, kmax, D, PG_PAGES, got);
    assert_memory_equal(ref, got, GROUP * PG_PAGES * sizeof(double));
    /* the first call again: a hit; after a clear: a miss */
    kvs_policy_page_scores(&view, PG_PAGE, q, GROUP, D, kmin, kmax, D, PG_PAGES, got);
    assert_int_equal(kvs_policy_memo_hits(m), 3);
    kvs_policy_memo_clear(m);
    kvs_policy_page_scores(&view, PG_PAGE, q, GROUP, D, kmin, kmax, D, PG_PAGES, got);
    assert_memory_equal(ref, got, GROUP * PG_PAGES * sizeof(double));
    assert_int_equal(kvs_policy_memo_hits(m), 3);
    kvs_policy_memo_free(m);
}

/* Quest's (and the top-k oracle's) configurations driven as the replay engine drives one task's: prefill of a
 * PROMPT-position prompt, then each decode position the memo cleared and every configuration's select() in turn.
 * An oracle's view carries "full attention" rows ([GROUP][n] at each position): values in eighths, so with ties. */
enum { QP_PROMPT = 60, QP_DECODE = 30, QP_N = QP_PROMPT + QP_DECODE, QP_MAXCFG = 8 };

typedef struct {
    int64_t hits;          /* memo hits over the decode positions */
    int64_t n_scored;      /* selections that scored pages (n > quota) */
    int32_t *idx;          /* [n_cfg][QP_N positions][GROUP lists][QP_N] the selections */
    int64_t *cnt;          /* [n_cfg][QP_N][GROUP] */
} quest_run;

static void quest_drive(const char *const *specs, const int64_t *budgets, int n_cfg, int with_memo, quest_run *out) {
    uint64_t s = 777;
    static float q[QP_N * GROUP * D], keys[QP_N * D], vals[QP_N * D];
    for (size_t i = 0; i < sizeof q / sizeof *q; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        q[i] = 2.0f * ((float)(s >> 40) / 16777216.0f - 0.5f);
    }
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        keys[i] = 2.0f * ((float)(s >> 40) / 16777216.0f - 0.5f);
        vals[i] = keys[i] * 0.5f;
    }
    static float probs[QP_N][GROUP * QP_N];
    for (size_t p = 0; p < QP_N; p++)
        for (size_t i = 0; i < GROUP * QP_N; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            probs[p][i] = (float)((s >> 40) % 9) / 8.0f;
        }
    kvs_policy_model model = {.n_layers = 1, .n_heads = GROUP, .n_kv_heads = 1, .group = GROUP, .head_dim = D,
                              .scale = 0.2f, .kv_bytes = 2, .aux_bytes = 4, .n_positions = QP_N,
                              .prompt_len = QP_PROMPT, .max_new_tokens = QP_DECODE, .max_seq_len = 0};
    kvs_policy_config cfg[QP_MAXCFG];
    void *state[QP_MAXCFG];
    assert_true(n_cfg <= QP_MAXCFG);
    for (int c = 0; c < n_cfg; c++) {
        assert_int_equal(kvs_policy_parse(specs[c], &cfg[c]), KVS_OK);
        kvs_policy_init init = {.model = &model, .cfg = &cfg[c], .budget = budgets[c], .budget_nominal = budgets[c],
                                .seed = 1};
        assert_int_equal(cfg[c].ops->create(&init, &state[c]), KVS_OK);
    }
    kvs_policy_memo *m = with_memo ? kvs_policy_memo_create() : NULL;
    if (with_memo) assert_non_null(m);
    out->idx = calloc((size_t)n_cfg * QP_N * GROUP * QP_N, sizeof *out->idx);
    out->cnt = calloc((size_t)n_cfg * QP_N * GROUP, sizeof *out->cnt);
    assert_true(out->idx && out->cnt);
    out->n_scored = 0;
    static int32_t lists[GROUP][QP_N];
    int32_t *idx_ptr[GROUP];
    int64_t n_sel[GROUP];
    for (int g = 0; g < GROUP; g++) idx_ptr[g] = lists[g];
    for (int64_t p = QP_PROMPT - 1; p < QP_N; p++) {
        kvs_policy_memo_clear(m);
        for (int c = 0; c < n_cfg; c++) {
            kvs_policy_view view = {.n = p + 1, .group = GROUP, .head_dim = D, .scale = model.scale, .k = keys,
                                    .v = vals, .turn_begin = 0, .prompt_end = QP_PROMPT, .memo = m,
                                    .full_probs = cfg[c].ops->is_oracle && p >= QP_PROMPT ? probs[p] : NULL};
            if (p == QP_PROMPT - 1) { /* the prompt's prefill */
                view.q = q;
                view.q_first = 0;
                view.n_q = QP_PROMPT;
                view.block_begin = 0;
                view.last_block = 1;
                assert_int_equal(cfg[c].ops->prefill(state[c], &view), KVS_OK);
                continue;
            }
            view.q = q + (size_t)p * GROUP * D;
            view.q_first = p;
            view.n_q = 1;
            view.block_begin = p;
            view.last_block = 1;
            int n_lists = cfg[c].ops->layout && cfg[c].ops->layout(&cfg[c]) == KVS_SEL_PER_QUERY_HEAD ? GROUP : 1;
            kvs_policy_sel sel = {.idx = idx_ptr, .n = n_sel, .n_lists = n_lists, .cap = QP_N};
            assert_int_equal(cfg[c].ops->select(state[c], &view, &sel), KVS_OK);
            for (int li = 0; li < n_lists; li++) {
                size_t at = ((size_t)c * QP_N + (size_t)p) * GROUP + (size_t)li;
                out->cnt[at] = n_sel[li];
                memcpy(out->idx + at * QP_N, lists[li], (size_t)n_sel[li] * sizeof(int32_t));
                if (li == 0 && n_sel[0] < p + 1) out->n_scored++;
            }
        }
    }
    out->hits = kvs_policy_memo_hits(m);
    kvs_policy_memo_free(m);
    for (int c = 0; c < n_cfg; c++) cfg[c].ops->free(state[c]);
}

static void quest_run_check_same(const quest_run *a, const quest_run *b, int n_cfg) {
    assert_memory_equal(a->cnt, b->cnt, (size_t)n_cfg * QP_N * GROUP * sizeof *a->cnt);
    assert_memory_equal(a->idx, b->idx, (size_t)n_cfg * QP_N * GROUP * QP_N * sizeof *a->idx);
    free(b->idx);
    free(b->cnt);
    free(a->idx);
    free(a->cnt);
}

/* Checked mode turns the page scores' contract into a checked invariant: a caller that hands other summaries for
 * the same view, page size and queries (a broken contract: the memo would return the first caller's scores)
 * aborts on the hit instead of receiving wrong numbers. Run in a child process, which must die of SIGABRT. */
static void test_checked_mode_catches_a_broken_page_contract(void **st) {
    (void)st;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        data x;
        data_init(&x);
        kvs_policy_memo_set_checked(1);
        kvs_policy_memo *m = kvs_policy_memo_create();
        static float kmin[PG_N * D], kmax[PG_N * D];
        build_pages(x.keys, PG_N, PG_PAGE, kmin, kmax);
        kvs_policy_view view = {.n = PG_N, .k = x.keys, .q_first = PG_N - 1, .memo = m};
        double got[GROUP * PG_N];
        kvs_policy_page_scores(&view, PG_PAGE, x.q, GROUP, D, kmin, kmax, D, PG_PAGES, got);
        kvs_policy_page_scores(&view, PG_PAGE, x.q, GROUP, D, kmin, kmax, D, PG_PAGES, got); /* a good hit */
        for (size_t i = 0; i < sizeof kmax / sizeof *kmax; i++) kmax[i] += 1.0f; /* summaries not of view->k */
        kvs_policy_page_scores(&view, PG_PAGE, x.q, GROUP, D, kmin, kmax, D, PG_PAGES, got);
        _exit(0); /* reached only when the broken contract went unnoticed */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
}

/* ---- kvs_policy_shared: a policy's own result, keyed by the view's rows, a tag and the caller's key bytes ---- */

typedef struct {
    const kvs_policy_view *v;
    double p;  /* a "parameter" of the computation: it must be in the key */
    int calls, fail;
} shared_job;

static kvs_status shared_sum(void *ctx, void *out) {
    shared_job *j = ctx;
    j->calls++;
    if (j->fail) return kvs_fail(KVS_ERR_NOMEM, "test: refused");
    double s[2] = {j->p, 0};
    for (int64_t i = 0; i < j->v->n * j->v->head_dim; i++) s[1] += j->v->k[i];
    memcpy(out, s, sizeof s);
    return KVS_OK;
}

static double shared_get(const kvs_policy_view *v, const char *tag, shared_job *j, double key) {
    double out[2] = {-1, -1};
    assert_int_equal(kvs_policy_shared(v, tag, &key, sizeof key, out, sizeof out, shared_sum, j), KVS_OK);
    assert_true(out[0] == j->p); /* the answer is the one this caller's computation gives */
    return out[1];
}

/* Hits only for the same tag, key bytes and rows under the view; misses for another parameter, another tag, other
 * rows (another address, another count), after a clear, without a memo; a failed computation is not kept. */
static void test_shared_keyed_by_everything(void **st) {
    (void)st;
    data x;
    data_init(&x);
    kvs_policy_memo *m = kvs_policy_memo_create();
    assert_non_null(m);
    kvs_policy_view v = {.n = 10, .group = GROUP, .head_dim = D, .scale = 0.5f, .k = x.keys, .v = x.keys, .q = x.q,
                         .q_first = 0, .n_q = 10, .memo = m};
    shared_job a = {.v = &v, .p = 1}, b = {.v = &v, .p = 2};
    double s10 = shared_get(&v, "t.a", &a, a.p);
    assert_int_equal(kvs_policy_memo_hits(m), 0);
    assert_true(shared_get(&v, "t.a", &a, a.p) == s10);
    assert_int_equal(kvs_policy_memo_hits(m), 1);
    shared_get(&v, "t.a", &b, b.p); /* another parameter, in the key: computed, not the first's */
    assert_int_equal(kvs_policy_memo_hits(m), 1);
    shared_get(&v, "t.b", &a, a.p); /* another computation with the same key bytes */
    assert_int_equal(kvs_policy_memo_hits(m), 1);
    kvs_policy_view w = v;
    w.n = 11; /* more rows */
    shared_job c = {.v = &w, .p = 1};
    assert_true(shared_get(&w, "t.a", &c, c.p) != s10);
    assert_int_equal(kvs_policy_memo_hits(m), 1);
    w.n = 10;
    w.k = x.keys + D; /* other rows */
    shared_get(&w, "t.a", &c, c.p);
    w.k = x.keys;
    w.n_q = 9; /* other queries */
    shared_get(&w, "t.a", &c, c.p);
    assert_int_equal(kvs_policy_memo_hits(m), 1);
    shared_get(&v, "t.a", &b, b.p); /* the second parameter's own entry hits (its p comes back) */
    assert_int_equal(kvs_policy_memo_hits(m), 2);
    kvs_policy_memo_clear(m);
    int calls = a.calls;
    shared_get(&v, "t.a", &a, a.p);
    assert_int_equal(a.calls, calls + 1);
    assert_int_equal(kvs_policy_memo_hits(m), 2);
    kvs_policy_view none = v;
    none.memo = NULL;
    calls = a.calls;
    shared_get(&none, "t.a", &a, a.p);
    shared_get(&none, "t.a", &a, a.p);
    assert_int_equal(a.calls, calls + 2);
    shared_job f = {.v = &v, .p = 3, .fail = 1};
    double key = 3, out[2];
    assert_int_equal(kvs_policy_shared(&v, "t.a", &key, sizeof key, out, sizeof out, shared_sum, &f), KVS_ERR_NOMEM);
    f.fail = 0;
    shared_get(&v, "t.a", &f, f.p); /* the failure stored nothing: computed */
    assert_int_equal(f.calls, 2);
    assert_int_equal(kvs_policy_memo_hits(m), 2);
    kvs_policy_memo_free(m);
    free(x.scratch);
}

/* A caller that leaves a parameter out of its key (the same key bytes, another answer) aborts in checked mode on
 * the hit instead of receiving the first caller's result. Run in a child process, which must die of SIGABRT. */
static void test_shared_checked_mode_catches_a_missing_parameter(void **st) {
    (void)st;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        data x;
        data_init(&x);
        kvs_policy_memo_set_checked(1);
        kvs_policy_memo *m = kvs_policy_memo_create();
        kvs_policy_view v = {.n = 10, .head_dim = D, .k = x.keys, .memo = m};
        shared_job a = {.v = &v, .p = 1}, b = {.v = &v, .p = 2};
        double key = 0, out[2];
        kvs_policy_shared(&v, "t.a", &key, sizeof key, out, sizeof out, shared_sum, &a);
        kvs_policy_shared(&v, "t.a", &key, sizeof key, out, sizeof out, shared_sum, &a); /* a good hit */
        kvs_policy_shared(&v, "t.a", &key, sizeof key, out, sizeof out, shared_sum, &b); /* p not in the key */
        _exit(0); /* reached only when the broken contract went unnoticed */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
}

static void test_quest_decode_hits(void **st) {
    (void)st;
    /* page=4: three budgets in both GQA modes share each position's bounds: 5 hits a position (the budgets keep
     * n > quota: every configuration scores); and the page rankings (kvs_policy_page_select): the group sums' by the
     * 2 later group configurations, each query head's by the 2 later head configurations: 2 + 2 GROUP more
     * (fill=tokens: every configuration ranks all the pages; fill=pages ranks the others at K_pg > 1 only) */
    static const char *const fixed[] = {"quest:page=4,fill=tokens", "quest:page=4,fill=tokens",
                                        "quest:page=4,gqa=head,fill=tokens", "quest:page=4,gqa=head,fill=tokens",
                                        "quest:page=4,fill=tokens", "quest:page=4,gqa=head,fill=tokens"};
    static const int64_t fixed_b[] = {8, 20, 8, 30, 40, 12};
    quest_run on, off;
    quest_drive(fixed, fixed_b, 6, 1, &on);
    quest_drive(fixed, fixed_b, 6, 0, &off);
    assert_int_equal(on.n_scored, 6 * QP_DECODE);
    assert_int_equal(on.hits, (5 + 2 + 2 * GROUP) * QP_DECODE);
    assert_int_equal(off.hits, 0);
    quest_run_check_same(&on, &off, 6);
    /* page=0 derives ceil(2 S/t), S = 60 + 30 = 90: t = 9 -> 20, t = 30 -> 6, t = 3 -> 60, t = 4 -> 45 (60 and
     * 45 give 2 pages at every decode position: only the page size tells them apart), t = 18 and t = 19 -> 10.
     * The first four must not share (other summaries); the last two do (the same page size, whatever the
     * budget). */
    static const char *const derived[] = {"quest:page=0,fill=tokens", "quest:page=0,fill=tokens",
                                          "quest:page=0,fill=tokens", "quest:page=0,fill=tokens",
                                          "quest:page=0,fill=tokens", "quest:page=0,fill=tokens"};
    static const int64_t derived_b[] = {9, 30, 3, 4, 18, 19};
    quest_drive(derived, derived_b, 4, 1, &on);
    quest_drive(derived, derived_b, 4, 0, &off);
    assert_int_equal(on.n_scored, 4 * QP_DECODE);
    assert_int_equal(on.hits, 0);
    quest_run_check_same(&on, &off, 4);
    quest_drive(derived + 4, derived_b + 4, 2, 1, &on);
    quest_drive(derived + 4, derived_b + 4, 2, 0, &off);
    assert_int_equal(on.n_scored, 2 * QP_DECODE);
    assert_int_equal(on.hits, 2 * QP_DECODE); /* the bounds, then the ranking of the same group sums */
    quest_run_check_same(&on, &off, 2);
}

/* The top-k oracle's budgets in both GQA modes share each position's ranking: every configuration after the first
 * of its mode hits, once per list (the budgets stay below n: every one is memoised), and every selection is the
 * one without the memo (kvs_topk_sorted). */
static void test_topk_decode_hits(void **st) {
    (void)st;
    static const char *const specs[] = {"topk", "topk", "topk:gqa=head", "topk", "topk:gqa=head"};
    static const int64_t budgets[] = {8, 40, 30, 20, 8};
    quest_run on, off;
    quest_drive(specs, budgets, 5, 1, &on);
    quest_drive(specs, budgets, 5, 0, &off);
    assert_int_equal(on.n_scored, 5 * QP_DECODE);
    assert_int_equal(on.hits, (2 + GROUP) * QP_DECODE);
    assert_int_equal(off.hits, 0);
    quest_run_check_same(&on, &off, 5);
}

/* ---- the oracle top-k's selection shared across budgets (kvs_policy_topk_sorted) ---- */

/* The reference order, written out: the larger value first, -0 equal to +0 (C's ==), a NaN after every number,
 * the lower position first among equals. A strict total order on positions, so qsort's result is the one order. */
static const float *ref_vals;

static int ref_before(int32_t a, int32_t b) {
    float x = ref_vals[a], y = ref_vals[b];
    if (isnan(x) || isnan(y)) return isnan(x) && isnan(y) ? a < b : isnan(y);
    if (x != y) return x > y;
    return a < b;
}

static int ref_cmp(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return ref_before(a, b) ? -1 : ref_before(b, a) ? 1 : 0;
}

static int cmp_pos(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

/* The k positions first in the reference order, ascending; v: the rows' sum from +0 in row order (written). */
static void ref_topk(const float *rows, size_t n_rows, size_t n, size_t k, float *v, int32_t *out) {
    int32_t *all = malloc(n * sizeof *all);
    assert_non_null(all);
    for (size_t j = 0; j < n; j++) {
        float s = 0.0f;
        for (size_t g = 0; g < n_rows; g++) s += rows[g * n + j];
        v[j] = n_rows == 1 ? rows[j] : s;
        all[j] = (int32_t)j;
    }
    ref_vals = v;
    qsort(all, n, sizeof *all, ref_cmp);
    memcpy(out, all, k * sizeof *out);
    qsort(out, k, sizeof *out, cmp_pos);
    free(all);
}

/* Values with many ties and every special case: NaN of both signs, infinities (whose sums give NaN and, with
 * FLT_MAX, overflow), both zeros, a denormal, repeated numbers. */
static float tie_value(uint64_t *s) {
    static const float pool[] = {1.0f, 0.5f, 0.5f, 0.25f, 0.25f, 0.25f, 0.0f, -0.0f, 0.0f, 1e-45f, -1.0f, 0.75f,
                                 3.4028235e38f, 0.125f};
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t r = *s >> 33;
    if (r % 61 == 0) return NAN;
    if (r % 61 == 1) return -NAN;
    if (r % 61 == 2) return INFINITY;
    if (r % 61 == 3) return -INFINITY;
    return pool[(r >> 8) % (sizeof pool / sizeof pool[0])];
}

/* Every k of small rows, asked in three orders (ascending: the ranking deepens at each budget; descending;
 * shuffled), 1..3 rows summed: kvs_policy_topk_sorted with a memo, without one, and kvs_topk_sorted on the sum all
 * give the reference set; the first lookup of a row misses and every later one (k < n) hits. */
static void test_topk_every_k_matches_select(void **st) {
    (void)st;
    enum { MAXN = 40, MAXR = 3 };
    uint64_t s = 99;
    static float rows[MAXR * MAXN], v[MAXN], scratch[MAXN];
    int32_t ref[MAXN], got[MAXN], bare[MAXN], sel[MAXN];
    size_t ks[MAXN];
    int64_t calls = 0;
    for (size_t n = 1; n <= MAXN; n++)
        for (size_t n_rows = 1; n_rows <= MAXR; n_rows++)
            for (int order = 0; order < 3; order++) {
                kvs_policy_memo *m = kvs_policy_memo_create(); /* fresh: the depth hint starts at 0 */
                assert_non_null(m);
                kvs_policy_view view = {.n = (int64_t)n, .memo = m}, no_memo = {.n = (int64_t)n};
                for (size_t i = 0; i < n_rows * n; i++) rows[i] = tie_value(&s);
                for (size_t i = 0; i < n; i++) ks[i] = order == 1 ? n - i : i + 1;
                if (order == 2)
                    for (size_t i = n; i > 1; i--) {
                        s = s * 6364136223846793005ull + 1442695040888963407ull;
                        size_t j = (size_t)(s >> 33) % i, t = ks[i - 1];
                        ks[i - 1] = ks[j];
                        ks[j] = t;
                    }
                int64_t memoised = 0;
                for (size_t i = 0; i < n; i++) {
                    size_t k = ks[i];
                    ref_topk(rows, n_rows, n, k, v, ref);
                    kvs_topk_sorted(v, n, k, sel);
                    assert_memory_equal(ref, sel, k * sizeof *ref);
                    kvs_policy_topk_sorted(&view, rows, n_rows, n, k, scratch, got);
                    assert_memory_equal(ref, got, k * sizeof *ref);
                    kvs_policy_topk_sorted(&no_memo, rows, n_rows, n, k, scratch, bare);
                    assert_memory_equal(ref, bare, k * sizeof *ref);
                    memoised += k < n;
                    assert_int_equal(kvs_policy_memo_hits(m), memoised > 0 ? memoised - 1 : 0);
                    calls++;
                }
                kvs_policy_memo_free(m);
            }
    /* rows longer than the select's threshold: the radix ranking's prefix at a sweep's budgets */
    enum { BIGN = 3000 };
    static float big[2 * BIGN], bv[BIGN], bscratch[BIGN];
    static int32_t bref[BIGN], bgot[BIGN];
    static const size_t budgets[] = {32, 64, 96, 128, 192, 256, 384, 512, 2999, 1, 31};
    for (int rep = 0; rep < 3; rep++) {
        kvs_policy_memo *m = kvs_policy_memo_create();
        assert_non_null(m);
        kvs_policy_view view = {.n = BIGN, .memo = m};
        for (size_t i = 0; i < 2 * BIGN; i++) big[i] = rep == 2 ? (float)(i % 97) / 97.0f : tie_value(&s);
        for (size_t b = 0; b < sizeof budgets / sizeof *budgets; b++) {
            size_t k = budgets[rep == 1 ? sizeof budgets / sizeof *budgets - 1 - b : b];
            ref_topk(big, 2, BIGN, k, bv, bref);
            kvs_policy_topk_sorted(&view, big, 2, BIGN, k, bscratch, bgot);
            assert_memory_equal(bref, bgot, k * sizeof *bref);
        }
        assert_int_equal(kvs_policy_memo_hits(m), (int64_t)(sizeof budgets / sizeof *budgets) - 1);
        kvs_policy_memo_free(m);
    }
    print_message("%lld small-row selections compared\n", (long long)calls);
}

/* What must not hit: other values at the same address, another row count, another length (the previous
 * position's n at the same address), another address; a cleared memo; a view without a memo. */
static void test_topk_what_must_not_hit(void **st) {
    (void)st;
    enum { N = 50, K = 12 };
    uint64_t s = 7;
    static float rows[3 * N], other[3 * N], v[N], scratch[N];
    int32_t ref[N], got[N];
    for (size_t i = 0; i < 3 * N; i++) rows[i] = tie_value(&s);
    kvs_policy_memo *m = kvs_policy_memo_create();
    assert_non_null(m);
    kvs_policy_view view = {.n = N, .memo = m};
    for (int call = 0; call < 3; call++) { /* a miss, then two hits */
        ref_topk(rows, 3, N, K - (size_t)call, v, ref);
        kvs_policy_topk_sorted(&view, rows, 3, N, K - (size_t)call, scratch, got);
        assert_memory_equal(ref, got, (K - (size_t)call) * sizeof *ref);
        assert_int_equal(kvs_policy_memo_hits(m), call);
    }
    for (int variant = 0; variant < 4; variant++) {
        const float *r = rows;
        size_t n_rows = 3, n = N;
        switch (variant) {
        case 0: /* one value changed at the same address: the memo compares the values */
            rows[2 * N + 17] += 2.0f;
            break;
        case 1: /* two of the rows (another reduction of the same buffer) */
            n_rows = 2;
            break;
        case 2: /* one position fewer at the same address */
            n = N - 1;
            break;
        default: /* the same values at another address (another KV head's rows) */
            memcpy(other, rows, sizeof other);
            r = other;
            break;
        }
        ref_topk(r, n_rows, n, K, v, ref);
        kvs_policy_topk_sorted(&view, r, n_rows, n, K, scratch, got);
        assert_memory_equal(ref, got, K * sizeof *ref);
        assert_int_equal(kvs_policy_memo_hits(m), 2);
    }
    /* the changed rows again: now a hit, with their own selection */
    ref_topk(rows, 3, N, K + 5, v, ref);
    kvs_policy_topk_sorted(&view, rows, 3, N, K + 5, scratch, got);
    assert_memory_equal(ref, got, (K + 5) * sizeof *ref);
    assert_int_equal(kvs_policy_memo_hits(m), 3);
    kvs_policy_memo_clear(m);
    kvs_policy_topk_sorted(&view, rows, 3, N, K, scratch, got);
    assert_int_equal(kvs_policy_memo_hits(m), 3);
    kvs_policy_view bare = view;
    bare.memo = NULL;
    kvs_policy_topk_sorted(&bare, rows, 3, N, K, scratch, got);
    kvs_policy_topk_sorted(&bare, rows, 3, N, K, scratch, got);
    ref_topk(rows, 3, N, K, v, ref);
    assert_memory_equal(ref, got, K * sizeof *ref);
    assert_int_equal(kvs_policy_memo_hits(m), 3);
    kvs_policy_memo_free(m);
}

/* ---- the replay with and without the memo ---- */

/* The policies sharing their own prompt scoring (kvs_policy_shared) come each in configurations whose parameters
 * enter that scoring (n_r, probe; eps, n_future, head_alloc; sim_thr, ref_quirks) and ones whose parameters do not
 * (duo's sparsity and score, qfilters' window): in one replay a result shared across the first would be wrong and
 * differ from the replay without the memo (and abort in checked mode); across the second it is the same. */
static const char *const memo_specs[] = {"h2o",      "h2o:gqa=mean", "tova",  "scissorhands",   "snapkv",
                                         "snapkv:gqa=mean", "pyramidkv", "rocketkv", "d2o", "window", "quest",
                                         "quest:gqa=head", "quest:page=0", "topk", "topk:gqa=head",
                                         "duo_heuristic:n_s=2,n_r=8,probe=16",
                                         "duo_heuristic:n_s=2,n_r=3,probe=16,score=mass",
                                         "duo_heuristic:n_s=2,n_r=8,probe=5,sparsity=0.25",
                                         "duo_heuristic:n_s=2,n_r=8,probe=16,sparsity=-1",
                                         "qfilters", "qfilters:window=2",
                                         "ea", "ea:eps=0.5", "ea:n_future=4", "ea:head_alloc=uniform",
                                         "ea:head_alloc=uniform,use_cov=0",
                                         "rkv", "rkv:sim_thr=0.05", "rkv:ref_quirks=1", "rkv:window=3"};
#define N_MEMO_SPECS (int)(sizeof memo_specs / sizeof memo_specs[0])
static const int64_t memo_budgets[] = {6, 12, 20, 33};
#define N_MEMO_BUDGETS (int)(sizeof memo_budgets / sizeof memo_budgets[0])

/* The replay of specs[0..n_specs) at memo_budgets with the options given (0 = default). */
static kvs_replay_result *replay_specs(const kvs_test_replay_fixture *f, const char *const *specs, int n_specs,
                                       int prefill_memo, int ref_scores, int kv16, int threads,
                                       int64_t out_block_rows) {
    static kvs_replay_config cfg[64 * N_MEMO_BUDGETS];
    assert_true(n_specs <= 64);
    int nc = 0;
    for (int i = 0; i < n_specs; i++)
        for (int b = 0; b < N_MEMO_BUDGETS; b++, nc++) {
            assert_int_equal(kvs_policy_parse(specs[i], &cfg[nc].policy), KVS_OK);
            cfg[nc].budget = memo_budgets[b];
            cfg[nc].budget_fraction = -1;
        }
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, &src), KVS_OK);
    kvs_replay_opts o = {.configs = cfg, .n_configs = nc, .threads = threads, .measure = KVS_MEASURE_ALL,
                         .series_every = 1, .prefill_memo = prefill_memo, .ref_scores = ref_scores, .kv16 = kv16,
                         .out_block_rows = out_block_rows};
    kvs_replay_result *r = NULL;
    kvs_status st = kvs_replay_execute(&src, &o, &r);
    if (st != KVS_OK) print_message("replay: %s\n", kvs_last_error());
    assert_int_equal(st, KVS_OK);
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
    print_message("%lld runs ok, %lld step samples compared\n", (long long)ok, (long long)steps);
    assert_true(ok >= a->n_runs - N_MEMO_BUDGETS); /* nearly all ran (a policy may refuse a tiny budget) */
    assert_true(steps > 10000);
}

/* On each of a 1- and a 2-turn trace: specs replayed with an optimisation on (1 and 2 threads) and off (the memo
 * when memo_off, the reference's scores when ref_off), every number compared; kv16 as kvs_replay_opts has it. With
 * the reference's scores on, the shared output pass runs too: at its default blocks (one block of rows on traces
 * this short), in blocks of 1 and 7 rows, and without blocks. */
static void assert_on_off_same(const char *const *specs, int n_specs, int memo_off, int ref_off, int kv16) {
    for (int turns = 1; turns <= 2; turns++) {
        kvs_gen_trace_opts o = kvs_test_grouped_opts(turns, 4, 90, turns == 1 ? 50 : -1, 16, 11);
        kvs_test_replay_fixture f;
        assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 11, &f), KVS_OK);
        kvs_replay_result *off = replay_specs(&f, specs, n_specs, memo_off ? -1 : 0, ref_off ? -1 : 0, kv16, 1, 0);
        /* under the sanitizers the blocks of 1 and 7 rows (the ragged ends) and the default; the plain suite all */
        const int64_t blocks[] = {1, 7, 0, -1};
        for (int k = 0; k < (ref_off ? (kvs_test_sanitized() ? 2 : 4) : 1); k++) {
            kvs_replay_result *on = replay_specs(&f, specs, n_specs, 0, 0, kv16, 1, blocks[k]);
            assert_same_results(on, off);
            kvs_replay_result_free(on);
        }
        kvs_replay_result *on2 = replay_specs(&f, specs, n_specs, 0, 0, kv16, 2, ref_off ? 5 : 0);
        assert_same_results(on2, off);
        kvs_replay_result_free(off);
        kvs_replay_result_free(on2);
        kvs_test_replay_fixture_free(&f);
    }
}

static void test_replay_memo_same_numbers(void **st) {
    (void)st;
    assert_on_off_same(memo_specs, N_MEMO_SPECS, 1, 0, 0);
}

/* ---- S_t's scores taken from the full reference's (kvs_replay_opts.ref_scores) ----
 * Every kind of selection the engine attends: one list for the group (window, sink + window, top-k, Quest's
 * pages), per-query-head lists (H2O, SnapKV, AdaKV, per-head top-k, RocketKV), lists holding merged slots
 * (D2O, which must take the computing path), the whole prefix (full), key-only scores (KeyDiff, K-norm), state
 * shared across layers or heads (MorphKV, HSA; SyncKV is in bench/cmp_runs.sh: it refuses budgets this small):
 * scores gathered from the reference against computed, every step sample and aggregate the same bits, on the
 * 16-bit history and on the fp32 one, 1 and 2 threads. */
static const char *const ref_specs[] = {"full",  "window",        "streaming", "h2o",     "h2o:gqa=mean", "tova",
                                        "snapkv", "pyramidkv",    "adakv",     "topk",    "topk:gqa=head", "quest",
                                        "quest:gqa=head", "knorm", "keydiff",   "rocketkv", "d2o",          "hsa",
                                        "morphkv", "scissorhands", "sparq",    "keyformer"};
#define N_REF_SPECS (int)(sizeof ref_specs / sizeof ref_specs[0])

static void test_replay_ref_scores_same_numbers(void **st) {
    (void)st;
    for (int kv16 = -1; kv16 <= 1; kv16 += 2) assert_on_off_same(ref_specs, N_REF_SPECS, 0, 1, kv16);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_colsum_hit_and_miss_same_bits),
        cmocka_unit_test(test_colsum_what_must_not_hit),
        cmocka_unit_test(test_many_entries_all_hit),
        cmocka_unit_test(test_snapkv_scores_hit_and_miss_same_bits),
        cmocka_unit_test(test_page_scores_hit_and_miss),
        cmocka_unit_test(test_checked_mode_catches_a_broken_page_contract),
        cmocka_unit_test(test_shared_keyed_by_everything),
        cmocka_unit_test(test_shared_checked_mode_catches_a_missing_parameter),
        cmocka_unit_test(test_quest_decode_hits),
        cmocka_unit_test(test_topk_decode_hits),
        cmocka_unit_test(test_topk_every_k_matches_select),
        cmocka_unit_test(test_topk_what_must_not_hit),
        cmocka_unit_test(test_replay_memo_same_numbers),
        cmocka_unit_test(test_replay_ref_scores_same_numbers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
