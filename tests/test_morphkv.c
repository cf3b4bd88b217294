/* test_morphkv.c — MorphKV (policies/morphkv.c; POLICY_SPEC §2.1, §5.1, §7 G1/G7):
 *  - the paper's Fig. 5 walk-through (golden vector G1): fused scores 0.6 vs 0.1 (sum) and 0.3 vs 0.05 (max),
 *    "me" evicted, through the scoring functions and through the policy's own calls on a hand-made stream;
 *  - M4: the resident set is constant (C_tot + 1 = B) at every step after the first eviction;
 *  - G7: the profile overhead aux/KV = G R / (2d) from the policy's reported bytes (profile=rows), and
 *    G R (d+1) values for profile=qz, in the model's aux_bytes;
 *  - a NAIVE reference written here (dense arrays, every score recomputed in double precision from q and k)
 *    compared with the engine's selections at every step: both fusions, both fidelities, both profile stores,
 *    MHA and GQA groups 2-4, two turns, evict_after > 1, the paper_ctot scaling, short prompts, a window;
 *  - the policy reads K/V only of tokens it stores (the conformance leak test, on configurations that score:
 *    the registry defaults make a window at the conformance budgets);
 *  - sizing rules (C_tot from the budget and evict_after, R scaling), presets, notes and validation;
 *  - examples/morphkv.sh (the presets on the bundled trace) runs through $KVSIM_BIN (set by `make test`).
 * Data: GENERATED Gaussian streams (tests/util/gen_trace.h), never a model's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/kvs_math.h"
#include "../policies/held.h"
#include "../policies/morphkv_internal.h"
#include "../policies/registry.h"
#include "../sim/policy.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"
#include "util/sets.h"

typedef kvs_test_replay_fixture fixture;

/* n_turns > 1 splits the positions evenly (half prompt, half generated per turn); prompt_len (single turn,
 * -1 = half) sets the first prompt. */
static void fixture_make(fixture *f, int n_turns, int group, int n_pos, int prompt_len, int d, uint64_t seed) {
    kvs_gen_trace_opts o = kvs_test_grouped_opts(n_turns, group, n_pos, prompt_len, d, seed);
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 11, f), KVS_OK);
}

static kvs_policy_config parse(const char *spec) {
    kvs_policy_config cfg;
    if (kvs_policy_parse(spec, &cfg) != KVS_OK) fail_msg("%s: %s", spec, kvs_last_error());
    return cfg;
}

/* ---- G1: Fig. 5 through the scoring functions ------------------------------------------------------ */

/* Window rows of "weather" and "The" over the old tokens [me, today's] (Fig. 5, §3.2). */
static void test_fig5_fused_scores_golden_g1(void **state) {
    (void)state;
    const float rows[2][2] = {{0.05f, 0.30f}, {0.05f, 0.30f}};
    double F[2];
    char keep[2];
    int32_t rank[2];
    kvs_morphkv_fuse(KVS_MORPHKV_PAPER, KVS_MORPHKV_SUM, &rows[0][0], 2, 2, 1, 2, F, NULL);
    assert_true(fabs(F[0] - 0.1) < 1e-7 && fabs(F[1] - 0.6) < 1e-7);
    kvs_held_top_mask(F, 2, 1, keep, rank); /* one distant slot: keep today's, evict me */
    assert_int_equal(keep[0], 0);
    assert_int_equal(keep[1], 1);
    kvs_morphkv_fuse(KVS_MORPHKV_PAPER, KVS_MORPHKV_MAX, &rows[0][0], 2, 2, 1, 2, F, NULL);
    assert_true(fabs(F[0] - 0.05) < 1e-7 && fabs(F[1] - 0.3) < 1e-7);
    kvs_held_top_mask(F, 2, 1, keep, rank);
    assert_int_equal(keep[0], 0);
    assert_int_equal(keep[1], 1);
    /* GQA, G = 2: the same attention split over two query heads sums back to Fig. 5's numbers (Algorithm 1:
     * S_r = sum over the group); layout [row][head][candidate] */
    const float gqa[2][2][2] = {{{0.02f, 0.10f}, {0.03f, 0.20f}}, {{0.04f, 0.25f}, {0.01f, 0.05f}}};
    kvs_morphkv_fuse(KVS_MORPHKV_PAPER, KVS_MORPHKV_SUM, &gqa[0][0][0], 2, 2, 2, 2, F, NULL);
    assert_true(fabs(F[0] - 0.1) < 1e-7 && fabs(F[1] - 0.6) < 1e-7);
    kvs_morphkv_fuse(KVS_MORPHKV_PAPER, KVS_MORPHKV_MAX, &gqa[0][0][0], 2, 2, 2, 2, F, NULL);
    assert_true(fabs(F[0] - 0.05) < 1e-7 && fabs(F[1] - 0.3) < 1e-7);
    /* REF: logits summed over the group, softmax over the candidates only: ln 0.05 and ln 0.30 renormalise to
     * 1/7 and 6/7 per row. */
    const float lg[2][2] = {{logf(0.05f), logf(0.30f)}, {logf(0.05f), logf(0.30f)}};
    double tmp[2];
    kvs_morphkv_fuse(KVS_MORPHKV_REF, KVS_MORPHKV_SUM, &lg[0][0], 2, 2, 1, 2, F, tmp);
    assert_true(fabs(F[0] - 2.0 / 7) < 1e-6 && fabs(F[1] - 12.0 / 7) < 1e-6);
    kvs_morphkv_fuse(KVS_MORPHKV_REF, KVS_MORPHKV_MAX, &lg[0][0], 2, 2, 1, 2, F, tmp);
    assert_true(fabs(F[0] - 1.0 / 7) < 1e-6 && fabs(F[1] - 6.0 / 7) < 1e-6);
    /* ties go to the older token (lower index) */
    const double tie[4] = {0.2, 0.5, 0.2, 0.2};
    char k4[4];
    int32_t r4[4];
    kvs_held_top_mask(tie, 4, 2, k4, r4);
    assert_true(k4[0] == 1 && k4[1] == 1 && k4[2] == 0 && k4[3] == 0);
    kvs_held_top_mask(tie, 4, 9, k4, r4);
    assert_true(k4[0] && k4[1] && k4[2] && k4[3]);
}

/* ---- fidelity=ref: no underflow to ties --------------------------------------------------------------- */

/* The window rows' candidate softmax in long double (exp underflows only below about -11355): the fp64 reading
 * of the reference's S_r[j] = softmax_j(sum_g z_r^g[j]), fused by sum or max. Independent of kvs_math. */
static void ld_fuse(int fusion, const float *vals, int n_rows, int group, int n, long double *F) {
    for (int j = 0; j < n; j++) F[j] = 0;
    for (int r = 0; r < n_rows; r++) {
        long double z[16], mx = -INFINITY, sum = 0;
        for (int j = 0; j < n; j++) {
            z[j] = 0;
            for (int g = 0; g < group; g++) z[j] += (long double)vals[(r * group + g) * n + j];
            if (z[j] > mx) mx = z[j];
        }
        for (int j = 0; j < n; j++) sum += expl(z[j] - mx);
        for (int j = 0; j < n; j++) {
            long double sr = expl(z[j] - mx) / sum;
            F[j] = fusion == KVS_MORPHKV_SUM ? F[j] + sr : (sr > F[j] ? sr : F[j]);
        }
    }
}

/* Logits 90 to 300 below a row's best: exp in fp32 returns 0 there, so every such candidate would tie at 0 and
 * the tie rule (the older token) would keep candidate 0; the fp64 ranking keeps candidate 1 (and 2 before 3 by
 * max). The kept set and the order of every pair of scores must be the long double ones. */
static void test_ref_scores_do_not_underflow_to_ties(void **state) {
    (void)state;
    enum { NR = 2, G = 2, N = 6 };
    /* [row][head][candidate]; group sums: row 0 {-240, -100, -130, -180, 0, -300},
     * row 1 {-260, -95, -150, -120, 0, -400} */
    const float vals[NR][G][N] = {{{-120, -60, -65, -100, 1, -150}, {-120, -40, -65, -80, -1, -150}},
                                  {{-130, -45, -75, -60, 2, -200}, {-130, -50, -75, -60, -2, -200}}};
    for (int fusion = 0; fusion < 2; fusion++) {
        double F[N], scratch[N];
        long double L[N];
        kvs_morphkv_fuse(KVS_MORPHKV_REF, fusion, &vals[0][0][0], N, NR, G, N, F, scratch);
        ld_fuse(fusion, &vals[0][0][0], NR, G, N, L);
        for (int i = 0; i < N; i++) {
            assert_true(F[i] > 0); /* no underflow */
            assert_true(fabsl((long double)F[i] - L[i]) <= 1e-12L * L[i]);
            for (int j = 0; j < N; j++)
                if (L[i] != L[j]) assert_true((F[i] > F[j]) == (L[i] > L[j]));
        }
        for (int k = 1; k < N; k++) {
            char keep[N];
            int32_t rank[N];
            kvs_held_top_mask(F, N, k, keep, rank);
            for (int j = 0; j < N; j++) {
                int better = 0;
                for (int i = 0; i < N; i++) better += L[i] > L[j] || (L[i] == L[j] && i < j);
                assert_int_equal(keep[j], better < k);
            }
        }
    }
}

/* ---- G1 through the policy: a hand-made stream ----------------------------------------------------- */

/* Positions 0 me, 1 today's (prompt), 2 weather, 3 The (decode, their attention given to observe), 4 the
 * current token. R = 2, budget 4 (C_tot = 3: 2 recent + 1 distant slot). Returns the set at position 4 and
 * checks the costs of that step. */
typedef struct {
    int64_t n;
    int32_t idx[8];
    kvs_policy_cost cost;
} walk_result;

static walk_result walk(const char *spec, const float *row_weather, const float *row_the) {
    kvs_policy_config cfg = parse(spec);
    enum { D = 2, N = 5 };
    float k[N * D] = {0}, v[N * D] = {0}, q[N * D] = {0}; /* K/V/q values do not matter in paper rows mode */
    kvs_policy_model m = {.n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .group = 1, .head_dim = D, .scale = 1.0f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = N, .prompt_len = 2};
    kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = 4, .budget_nominal = 4};
    void *st = NULL;
    assert_int_equal(kvs_policy_morphkv.create(&init, &st), KVS_OK);
    kvs_policy_view pv = {.n = 2, .group = 1, .head_dim = D, .scale = 1.0f, .k = k, .v = v, .q = q, .q_first = 0,
                          .n_q = 2, .turn_begin = 0, .prompt_end = 2, .block_begin = 0, .last_block = 1};
    assert_int_equal(kvs_policy_morphkv.prefill(st, &pv), KVS_OK);
    int32_t buf[N], *idx[1] = {buf};
    int64_t nsel[1];
    const float *rk[N] = {0}, *rv[N] = {0}, **rkp[1] = {rk}, **rvp[1] = {rv};
    kvs_policy_sel sel = {.idx = idx, .n = nsel, .n_lists = 1, .cap = N, .row_k = rkp, .row_v = rvp};
    walk_result out = {0};
    for (int64_t p = 2; p < N; p++) {
        kvs_policy_view dv = {.n = p + 1, .group = 1, .head_dim = D, .scale = 1.0f, .k = k, .v = v, .q = q + p * D,
                              .q_first = p, .n_q = 1, .turn_begin = 0, .prompt_end = 2, .block_begin = p, .last_block = 1};
        nsel[0] = 0;
        assert_int_equal(kvs_policy_morphkv.select(st, &dv, &sel), KVS_OK);
        /* nothing is evicted before position 4 (at 3 the trigger finds exactly C_tot + 1 tokens) */
        if (p < 4) assert_int_equal(nsel[0], p + 1);
        kvs_policy_cost c = {0};
        c.write_bytes = kvs_policy_kv_bytes(&m, 1); /* the engine's default before account() */
        kvs_policy_morphkv.account(st, &dv, &sel, &c);
        const float *pr = p == 2 ? row_weather : p == 3 ? row_the : NULL;
        float uniform[N];
        for (int j = 0; j < N; j++) uniform[j] = 1.0f / (float)nsel[0];
        const float *probs[1] = {pr ? pr : uniform};
        assert_int_equal(kvs_policy_morphkv.observe(st, &dv, &sel, probs), KVS_OK);
        if (p == 4) {
            out.n = nsel[0];
            memcpy(out.idx, buf, (size_t)nsel[0] * sizeof *buf);
            out.cost = c;
            int32_t stored[N];
            assert_int_equal(kvs_policy_morphkv.stored(st, 0, stored), nsel[0]);
            assert_memory_equal(stored, buf, (size_t)nsel[0] * sizeof *buf);
        }
    }
    kvs_policy_morphkv.free(st);
    return out;
}

static void test_fig5_walkthrough_through_the_policy(void **state) {
    (void)state;
    /* Fig. 5: weather and The pay me 0.05 and today's 0.30 (the rest goes to the window tokens) */
    const float weather[3] = {0.05f, 0.30f, 0.65f}, the[4] = {0.05f, 0.30f, 0.25f, 0.40f};
    const int32_t keep_todays[4] = {1, 2, 3, 4};
    for (int fusion = 0; fusion < 2; fusion++) {
        walk_result r = walk(fusion ? "morphkv:recent=2,fusion=max" : "morphkv:recent=2", weather, the);
        assert_int_equal(r.n, 4);
        assert_memory_equal(r.idx, keep_todays, sizeof keep_todays); /* "me" evicted */
        /* costs: 4 resident slots of 2 x d=2 fp16; profile rows 1 head x R=2 rows x 4 columns fp32; the
         * scoring read the 2 candidate columns of both rows; "me" and the fused scores were transient */
        assert_true(r.cost.aux_bytes == 1 * 2 * 4 * 4);
        assert_true(r.cost.read_aux_bytes == 1 * 2 * 2 * 4 && r.cost.read_aux_unfused_bytes == r.cost.read_aux_bytes);
        assert_true(r.cost.write_bytes == 2 * 2 * 2 + 1 * 4 * 4);
        assert_true(r.cost.transient_bytes == 1 * 2 * 2 * 2 + 2 * 4);
    }
    /* where the fusions disagree: me gets 0.5 from one window query only, today's 0.3 from both */
    const float w2[3] = {0.5f, 0.3f, 0.2f}, t2[4] = {0.0f, 0.3f, 0.3f, 0.4f};
    const int32_t keep_me[4] = {0, 2, 3, 4};
    walk_result s = walk("morphkv:recent=2,fusion=sum", w2, t2); /* 0.5 vs 0.6 */
    assert_memory_equal(s.idx, keep_todays, sizeof keep_todays);
    walk_result x = walk("morphkv:recent=2,fusion=max", w2, t2); /* 0.5 vs 0.3 */
    assert_memory_equal(x.idx, keep_me, sizeof keep_me);
}

/* ---- engine runs ---------------------------------------------------------------------------------- */

typedef struct {
    const fixture *f;
    kvs_test_sets s;  /* the selections; cell = (l*Hkv+h)*N + p */
    int64_t *stored;  /* resident count after the step */
    int scramble;
    uint64_t rng;
} recorder;

static void rec_init(recorder *r, const fixture *f) {
    memset(r, 0, sizeof *r);
    r->f = f;
    size_t cells = (size_t)f->L * (size_t)f->Hkv * (size_t)f->N;
    assert_int_equal(kvs_test_sets_init(&r->s, cells, f->N), KVS_OK);
    r->stored = malloc(cells * sizeof *r->stored);
    assert_non_null(r->stored);
    for (size_t c = 0; c < cells; c++) r->stored[c] = -1;
    r->rng = 0x9e3779b97f4a7c15ull;
}

static void rec_free(recorder *r) {
    kvs_test_sets_free(&r->s);
    free(r->stored);
}

static size_t cell(const fixture *f, int l, int h, int64_t p) {
    return ((size_t)l * (size_t)f->Hkv + (size_t)h) * (size_t)f->N + (size_t)p;
}

static void put(recorder *r, int l, int h, int64_t p, const int32_t *idx, int64_t n) {
    kvs_test_sets_put(&r->s, cell(r->f, l, h, p), idx, n);
}

static void on_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    (void)config;
    assert_int_equal(sel->n_lists, 1);
    put(user, layer, kv_head, pos, sel->idx[0], sel->n[0]);
}

/* Records the resident count after every step; with `scramble`, overwrites the K/V rows of every position the
 * policy does not store (as tests/test_policy_conformance.c does). */
static void on_step_end(void *user, int config, int layer, int kv_head, int64_t pos, void *state,
                        const struct kvs_policy_ops *ops, float *k, float *v, int64_t n) {
    (void)config;
    recorder *r = user;
    int32_t *buf = malloc((size_t)r->f->N * sizeof *buf);
    char *keep = calloc((size_t)n, 1);
    assert_non_null(buf);
    assert_non_null(keep);
    int64_t m = ops->stored(state, 0, buf);
    r->stored[cell(r->f, layer, kv_head, pos)] = m;
    for (int64_t j = 0; j < m; j++) keep[buf[j]] = 1;
    if (r->scramble) kvs_test_scramble_rows(k, v, n, r->f->d, keep, &r->rng);
    free(buf);
    free(keep);
}

static kvs_replay_result *run_engine(const fixture *f, const char *spec, int64_t budget, recorder *rec) {
    kvs_replay_config cfg = {.policy = parse(spec), .budget = budget, .budget_fraction = -1};
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, &src), KVS_OK);
    kvs_replay_hooks hooks = {.user = rec, .on_select = on_select, .on_step_end = on_step_end};
    kvs_replay_opts o = {.configs = &cfg, .n_configs = 1, .threads = 2, .measure = KVS_MEASURE_DECODE,
                         .hooks = rec ? &hooks : NULL};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
    if (r->runs[0].status != KVS_OK) fail_msg("%s: %s", spec, r->runs[0].error);
    return r;
}

static int is_decode(const fixture *f, int64_t p) {
    for (int64_t t = 0; t < f->n_turns; t++)
        if (p < f->turns[t].end) return p >= f->turns[t].prompt_end;
    return 0;
}

/* ---- M4: constant resident size ---------------------------------------------------------------------- */

/* Sliding-window layers: a stream of 8 positions (prompt 0..3), R = 2, budget 4 (one distant slot), the host's window
 * 6 (first = p - 4 from position 5). At 4 the first compression keeps 0 (the prompt rows tie 0 and 1: the older)
 * with 2, 3, 4; at 5 the row of 4 (0.4 on position 0) keeps 0 again: {0, 3, 4, 5}. The window then drops 0, but only
 * after the step's row, recorded over {0, 3, 4, 5}, has its column 0 removed: 3 keeps 0.1, 4 keeps 0.15. At 7 the
 * candidates 3 and 4 are ranked by the rows of 5 and 6 (uniform 0.25): 0.35 against 0.40, so 4 stays. A row recorded
 * after the drop would give 3 the 0.7 of position 0 and keep 3. */
static void test_window_drops_profile_columns(void **state) {
    (void)state;
    kvs_policy_config cfg = parse("morphkv:recent=2");
    enum { D = 2, N = 8, W = 6 };
    float k[N * D] = {0}, v[N * D] = {0}, q[N * D] = {0}; /* paper rows: the probabilities given decide */
    kvs_policy_model m = {.n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .group = 1, .head_dim = D, .scale = 1.0f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = N, .prompt_len = 4};
    kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = 4, .budget_nominal = 4};
    void *st = NULL;
    assert_int_equal(kvs_policy_morphkv.create(&init, &st), KVS_OK);
    kvs_policy_view pv = {.n = 4, .group = 1, .head_dim = D, .scale = 1.0f, .k = k, .v = v, .q = q, .q_first = 0,
                          .n_q = 4, .turn_begin = 0, .prompt_end = 4, .block_begin = 0, .last_block = 1};
    assert_int_equal(kvs_policy_morphkv.prefill(st, &pv), KVS_OK);
    int32_t buf[N], stored[N], *idx[1] = {buf};
    int64_t nsel[1];
    const float *rk[N] = {0}, *rv[N] = {0}, **rkp[1] = {rk}, **rvp[1] = {rv};
    kvs_policy_sel sel = {.idx = idx, .n = nsel, .n_lists = 1, .cap = N, .row_k = rkp, .row_v = rvp};
    static const float rows[4][5] = {{0.4f, 0.1f, 0.25f, 0.25f}, {0.7f, 0.1f, 0.15f, 0.05f},
                                     {0.25f, 0.25f, 0.25f, 0.25f}, {0.25f, 0.25f, 0.25f, 0.25f}};
    static const int32_t want[4][4] = {{0, 2, 3, 4}, {0, 3, 4, 5}, {3, 4, 5, 6}, {4, 5, 6, 7}};
    for (int64_t p = 4; p < N; p++) {
        kvs_policy_view dv = {.n = p + 1, .group = 1, .head_dim = D, .scale = 1.0f, .k = k, .v = v, .q = q + p * D,
                              .q_first = p, .n_q = 1, .turn_begin = 0, .prompt_end = 4, .block_begin = p, .last_block = 1};
        assert_int_equal(kvs_policy_morphkv.select(st, &dv, &sel), KVS_OK);
        assert_int_equal(nsel[0], 4);
        assert_memory_equal(buf, want[p - 4], sizeof want[0]);
        if (p + 2 - W > 0) assert_int_equal(kvs_policy_morphkv.window_evict(st, p + 2 - W), KVS_OK);
        const float *probs[1] = {rows[p - 4]};
        assert_int_equal(kvs_policy_morphkv.observe(st, &dv, &sel, probs), KVS_OK);
        int64_t ns = kvs_policy_morphkv.stored(st, 0, stored);
        for (int64_t j = 0; j < ns; j++) assert_true(stored[j] >= p + 2 - W); /* the window's first, or earlier */
        if (p == 5) {
            static const int32_t kept[3] = {3, 4, 5};
            assert_int_equal(ns, 3);
            assert_memory_equal(stored, kept, sizeof kept);
        }
    }
    kvs_policy_morphkv.free(st);
}

static void test_resident_size_constant_after_first_eviction(void **state) {
    (void)state;
    const struct {
        int turns, group, n_pos, prompt;
        const char *spec;
        int64_t B;
    } cases[] = {
        {1, 2, 64, 40, "morphkv:recent=4", 12},                      /* first decode step compresses 41 -> 12 */
        {1, 2, 64, 40, "morphkv:recent=4,fusion=max,fidelity=ref", 12},
        {1, 3, 64, 6, "morphkv:recent=3,profile=qz", 15},            /* short prompt: grows to B, then constant */
        {2, 1, 72, -1, "morphkv:recent=2", 9},                        /* second turn: compresses again at decode */
        {1, 2, 64, 40, "morphkv", 11},                                /* R = 32 >= C_tot: a window, still B */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fixture f;
        fixture_make(&f, cases[c].turns, cases[c].group, cases[c].n_pos, cases[c].prompt, 8, 100 + c);
        recorder rec;
        rec_init(&rec, &f);
        kvs_replay_result *r = run_engine(&f, cases[c].spec, cases[c].B, &rec);
        int64_t B = cases[c].B, checked = 0;
        for (int l = 0; l < f.L; l++)
            for (int h = 0; h < f.Hkv; h++) {
                int evicted = 0;
                for (int64_t p = 0; p < f.N; p++) {
                    if (!is_decode(&f, p)) continue;
                    size_t ce = cell(&f, l, h, p);
                    int64_t n = rec.s.n[ce], kept = rec.stored[ce];
                    assert_true(n >= 1 && n <= B);
                    assert_int_equal(kept, n); /* the attended set is the resident set */
                    if (n == B) evicted = 1;   /* full at last (first turn: the first compression) */
                    if (evicted) {
                        assert_int_equal(n, B); /* C_tot + 1 at every later step, turns included */
                        checked++;
                    } else {
                        assert_int_equal(n, p + 1); /* nothing evicted before the cache is full */
                    }
                }
            }
        assert_true(checked > 0);
        assert_true(r->runs[0].max_attended == B);
        kvs_replay_result_free(r);
        rec_free(&rec);
        kvs_test_replay_fixture_free(&f);
    }
}

/* evict_after > 1: the cache grows to the budget between compressions and is cut back to C_tot + 1. */
static void test_evict_after_grows_and_compresses_within_budget(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 2, 80, 30, 8, 131);
    recorder rec;
    rec_init(&rec, &f);
    int64_t B = 20, ctot = kvs_morphkv_ctot(B, 1.5); /* c = 14 triggers at 21 tokens: peak 20 */
    assert_int_equal(ctot, 13);
    kvs_replay_result *r = run_engine(&f, "morphkv:recent=3,evict_after=1.5", B, &rec);
    int64_t compressions = 0;
    for (int l = 0; l < f.L; l++)
        for (int h = 0; h < f.Hkv; h++)
            for (int64_t p = f.turns[0].prompt_end; p < f.N; p++) {
                int64_t n = rec.s.n[cell(&f, l, h, p)];
                assert_true(n <= B);
                if (p > f.turns[0].prompt_end) {
                    int64_t prev = rec.s.n[cell(&f, l, h, p - 1)];
                    if (n == ctot + 1) compressions++;
                    else assert_int_equal(n, prev + 1); /* grows by one between compressions */
                } else {
                    assert_int_equal(n, ctot + 1); /* the prompt (31 tokens) compressed at once */
                }
            }
    assert_true(compressions >= 2 * 2 * 6);
    assert_true(r->runs[0].max_attended == B);
    kvs_replay_result_free(r);
    rec_free(&rec);
    kvs_test_replay_fixture_free(&f);
}

/* ---- G7: profile overhead --------------------------------------------------------------------------- */

static double metric_max(const kvs_replay_result *r, int m) { return r->runs[0].run_agg.m[m].max; }
static double metric_min(const kvs_replay_result *r, int m) { return r->runs[0].run_agg.m[m].min; }

static void test_profile_overhead_golden_g7(void **state) {
    (void)state;
    const struct {
        int G, R;
        double golden; /* POLICY_SPEC §7 G7, d = 128 */
    } cases[] = {{4, 30, 0.469}, {4, 32, 0.5}, {4, 200, 3.125}, {7, 30, 0.820}, {1, 30, 0.117}};
    const int d = 128;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int G = cases[c].G, R = cases[c].R;
        kvs_gen_trace_opts o = kvs_gen_trace_defaults();
        o.n_layers = 1;
        o.n_kv_heads = 1;
        o.n_heads = G;
        o.head_dim = d;
        o.prompt_len = R + 24; /* the ring is full from the first decode step, which compresses */
        o.n_positions = o.prompt_len + 6;
        o.seed = 200 + c;
        fixture f;
        assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 16, &f), KVS_OK);
        f.mem.model.aux_bytes = 2; /* b_kv = b_aux: the spec's ratio counts elements */
        char spec[64];
        snprintf(spec, sizeof spec, "morphkv:recent=%d", R);
        int64_t B = R + 9; /* C_tot = R + 8: eight distant slots */
        kvs_replay_result *r = run_engine(&f, spec, B, NULL);
        double kv = metric_max(r, KVS_M_STORAGE_KV), aux = metric_max(r, KVS_M_STORAGE_AUX);
        assert_true(kv == (double)B * 2 * d * 2 && metric_min(r, KVS_M_STORAGE_KV) == kv);
        assert_true(aux == (double)G * R * B * 2 && metric_min(r, KVS_M_STORAGE_AUX) == aux); /* G R (C_tot+1) */
        double ratio = aux / kv;
        assert_true(fabs(ratio - (double)G * R / (2.0 * d)) < 1e-12);
        char got[16], want[16];
        snprintf(got, sizeof got, "%.3f", ratio);
        snprintf(want, sizeof want, "%.3f", cases[c].golden);
        assert_string_equal(got, want);
        assert_true(metric_max(r, KVS_M_STORAGE) == kv + aux);
        kvs_replay_result_free(r);
        /* the model's aux_bytes, never a literal: fp32 profiles double the ratio */
        f.mem.model.aux_bytes = 4;
        r = run_engine(&f, spec, B, NULL);
        assert_true(fabs(metric_max(r, KVS_M_STORAGE_AUX) / kv - 2.0 * G * R / (2.0 * d)) < 1e-12);
        kvs_replay_result_free(r);
        /* profile=qz: the window queries and their log-sum-exp, G R (d+1) values (ref: no Z, G R d) */
        snprintf(spec, sizeof spec, "morphkv:recent=%d,profile=qz", R);
        r = run_engine(&f, spec, B, NULL);
        assert_true(metric_max(r, KVS_M_STORAGE_AUX) == (double)G * R * (d + 1) * 4);
        assert_true(metric_min(r, KVS_M_STORAGE_AUX) == (double)G * R * (d + 1) * 4);
        kvs_replay_result_free(r);
        snprintf(spec, sizeof spec, "morphkv:recent=%d,profile=qz,fidelity=ref", R);
        r = run_engine(&f, spec, B, NULL);
        assert_true(metric_max(r, KVS_M_STORAGE_AUX) == (double)G * R * d * 4);
        kvs_replay_result_free(r);
        kvs_test_replay_fixture_free(&f);
    }
}

/* Traffic and writes of a steady-state step, by hand (header "Costs per step"): G = 2, d = 8, R = 3,
 * B = 10 (C_tot = 9), kv 2 bytes, aux 4 bytes; every decode step evicts one of nd = 10 - 4 + 1 = 7
 * candidates. */
static void test_costs_of_a_steady_step(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 2, 48, 30, 8, 300);
    const double G = 2, R = 3, d = 8, A = 10, nd = 7, kvb = 2, ab = 4;
    kvs_replay_result *r = run_engine(&f, "morphkv:recent=3", 10, NULL);
    /* the first step compresses 31 -> 10 (larger reads and transient), the others are steady: check the minima */
    assert_true(metric_min(r, KVS_M_TRAFFIC_KV) == A * 2 * d * kvb);
    assert_true(metric_min(r, KVS_M_TRAFFIC_AUX) == G * R * nd * ab);
    assert_true(metric_min(r, KVS_M_WRITE) == 2 * d * kvb + G * A * ab);
    assert_true(metric_min(r, KVS_M_STORAGE_PEAK) == A * 2 * d * kvb + G * R * A * ab + 2 * d * kvb + nd * ab);
    assert_true(metric_max(r, KVS_M_TRAFFIC_AUX) == G * R * (31 - 4) * ab);
    kvs_replay_result_free(r);
    r = run_engine(&f, "morphkv:recent=3,profile=qz", 10, NULL);
    assert_true(metric_min(r, KVS_M_TRAFFIC_AUX) == G * R * (d + 1) * ab + d * kvb); /* + the evicted key */
    assert_true(metric_min(r, KVS_M_TRAFFIC_AUX_UNFUSED) == G * R * (d + 1) * ab + nd * d * kvb);
    assert_true(metric_min(r, KVS_M_WRITE) == 2 * d * kvb + G * (d + 1) * ab);
    kvs_replay_result_free(r);
    kvs_test_replay_fixture_free(&f);
}

/* ---- naive reference ---------------------------------------------------------------------------------- */

typedef struct {
    int fusion, ref;  /* 1 = max; 1 = REF fidelity */
    int64_t recent, paper_ctot;
    double evict_after;
} naive_cfg;

static const float *nq(const fixture *f, int l, int64_t p, int qh) {
    return f->g->q + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)f->H + (size_t)qh) * (size_t)f->d;
}
static const float *nk(const fixture *f, int l, int64_t p, int h) {
    return f->g->k + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)f->Hkv + (size_t)h) * (size_t)f->d;
}

static double logit(const fixture *f, int l, int h, int g, int64_t qp, int64_t j) {
    const float *q = nq(f, l, qp, h * f->G + g), *k = nk(f, l, j, h);
    double s = 0;
    for (int i = 0; i < f->d; i++) s += (double)q[i] * (double)k[i];
    return s * (double)f->scale;
}

/* Row of query position qp, head g, over the resident positions j <= qp (res mask): probabilities (paper) or
 * logits (ref), in double, into row[j] (NAN elsewhere). */
static void naive_row(const fixture *f, int l, int h, int g, int64_t qp, const char *res, int ref, double *row) {
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < f->N; j++) row[j] = NAN;
    for (int64_t j = 0; j <= qp; j++)
        if (res[j]) {
            row[j] = logit(f, l, h, g, qp, j);
            if (row[j] > mx) mx = row[j];
        }
    if (ref) return;
    for (int64_t j = 0; j <= qp; j++)
        if (res[j]) sum += exp(row[j] - mx);
    for (int64_t j = 0; j <= qp; j++)
        if (res[j]) row[j] = exp(row[j] - mx) / sum;
}

/* Every decode step's attended set, recomputed from scratch by the rules of POLICY_SPEC §2.1. */
static void naive_morphkv(const fixture *f, const naive_cfg *c, int64_t B, recorder *out) {
    /* C_tot: the largest with a peak attended set <= B; R scaled by C_tot / paper_ctot when that is smaller */
    int64_t ctot = -1;
    for (int64_t cc = B; cc >= 1 && ctot < 0; cc--)
        if (cc <= B && ceil(c->evict_after * (double)cc) - 1 <= (double)B) ctot = cc - 1;
    assert_true(ctot >= 0);
    int64_t R = c->recent;
    if (c->paper_ctot > 0 && ctot < c->paper_ctot) {
        R = (int64_t)floor((double)c->recent * (double)ctot / (double)c->paper_ctot + 0.5);
        if (R < 1) R = 1;
    }
    int64_t N = f->N, G = f->G;
    char *res = malloc((size_t)N);
    double *prof = malloc((size_t)N * (size_t)G * (size_t)N * sizeof *prof); /* [query pos][g][pos] */
    double *F = malloc((size_t)N * sizeof *F), *S = malloc((size_t)N * sizeof *S);
    int32_t *list = malloc((size_t)N * sizeof *list);
    char *taken = malloc((size_t)N);
    for (int l = 0; l < f->L; l++)
        for (int h = 0; h < f->Hkv; h++) {
            memset(res, 0, (size_t)N);
            for (int64_t t = 0; t < f->n_turns; t++) {
                const kvs_turn *tu = &f->turns[t];
                for (int64_t i = tu->begin; i < tu->prompt_end; i++) res[i] = 1; /* prefill keeps the prompt */
                for (int64_t i = tu->begin; i < tu->prompt_end; i++)
                    for (int g = 0; g < G; g++) naive_row(f, l, h, g, i, res, c->ref, prof + ((size_t)i * (size_t)G + (size_t)g) * (size_t)N);
                for (int64_t p = tu->prompt_end; p < tu->end; p++) {
                    res[p] = 1;
                    int64_t nr = 0, nprot = 0;
                    for (int64_t j = 0; j <= p; j++) {
                        nr += res[j];
                        nprot += res[j] && j >= p - R;
                    }
                    int64_t cap = ctot + 1;
                    if ((double)nr >= c->evict_after * (double)cap && nr > cap) {
                        if (nprot >= cap) { /* keep the newest cap */
                            int64_t seen = 0;
                            for (int64_t j = p; j >= 0; j--)
                                if (res[j] && ++seen > cap) res[j] = 0;
                        } else {
                            int64_t r0 = p - R < 0 ? 0 : p - R;
                            for (int64_t j = 0; j < p - R; j++) F[j] = 0;
                            for (int64_t r = r0; r < p; r++) {
                                double mx = -INFINITY, sum = 0;
                                for (int64_t j = 0; j < p - R; j++) {
                                    if (!res[j]) continue;
                                    assert_true(j < r); /* a candidate is older than every window query */
                                    S[j] = 0;
                                    for (int g = 0; g < G; g++) S[j] += prof[((size_t)r * (size_t)G + (size_t)g) * (size_t)N + (size_t)j];
                                    if (S[j] > mx) mx = S[j];
                                }
                                if (c->ref) { /* softmax of the group-summed logits over the candidates */
                                    for (int64_t j = 0; j < p - R; j++)
                                        if (res[j]) sum += exp(S[j] - mx);
                                    for (int64_t j = 0; j < p - R; j++)
                                        if (res[j]) S[j] = exp(S[j] - mx) / sum;
                                }
                                for (int64_t j = 0; j < p - R; j++)
                                    if (res[j]) F[j] = c->fusion ? (S[j] > F[j] ? S[j] : F[j]) : F[j] + S[j];
                            }
                            memset(taken, 0, (size_t)N);
                            for (int64_t k = 0; k < cap - nprot; k++) {
                                int64_t best = -1;
                                for (int64_t j = 0; j < p - R; j++)
                                    if (res[j] && !taken[j] && (best < 0 || F[j] > F[best])) best = j;
                                assert_true(best >= 0);
                                taken[best] = 1;
                            }
                            for (int64_t j = 0; j < p - R; j++)
                                if (res[j] && !taken[j]) res[j] = 0;
                        }
                    }
                    int64_t m = 0;
                    for (int64_t j = 0; j <= p; j++)
                        if (res[j]) list[m++] = (int32_t)j;
                    put(out, l, h, p, list, m);
                    for (int g = 0; g < G; g++) naive_row(f, l, h, g, p, res, c->ref, prof + ((size_t)p * (size_t)G + (size_t)g) * (size_t)N);
                }
            }
        }
    free(res);
    free(prof);
    free(F);
    free(S);
    free(list);
    free(taken);
}

static int64_t compare(const recorder *eng, const recorder *ref, const char *what) {
    const fixture *f = eng->f;
    int64_t compared = 0, c = kvs_test_sets_diff(&eng->s, &ref->s, &compared);
    if (c >= 0)
        fail_msg("%s: selection differs at layer %d kv head %d position %lld (%lld vs %lld entries)", what,
                 (int)((size_t)c / (size_t)f->N / (size_t)f->Hkv), (int)((size_t)c / (size_t)f->N % (size_t)f->Hkv),
                 (long long)((size_t)c % (size_t)f->N), (long long)eng->s.n[c], (long long)ref->s.n[c]);
    return compared;
}

static void test_matches_naive_reference(void **state) {
    (void)state;
    const struct {
        int turns, group, n_pos, prompt;
        const char *spec;
        int64_t B;
        naive_cfg c;
    } cases[] = {
        {1, 2, 60, -1, "morphkv:recent=4", 12, {0, 0, 4, 0, 1.0}},
        {1, 2, 60, -1, "morphkv:recent=4,fusion=max", 12, {1, 0, 4, 0, 1.0}},
        {1, 2, 60, -1, "morphkv:recent=4,fidelity=ref", 12, {0, 1, 4, 0, 1.0}},
        {1, 2, 60, -1, "morphkv:recent=4,fidelity=ref,fusion=max", 12, {1, 1, 4, 0, 1.0}},
        {1, 1, 60, -1, "morphkv:recent=3", 9, {0, 0, 3, 0, 1.0}},                      /* MHA */
        {1, 1, 60, -1, "morphkv:recent=3,fidelity=ref,fusion=max", 9, {1, 1, 3, 0, 1.0}},
        {2, 3, 64, -1, "morphkv:recent=3,profile=qz", 10, {0, 0, 3, 0, 1.0}},          /* two turns */
        {2, 3, 64, -1, "morphkv:recent=3,profile=qz,fidelity=ref", 10, {0, 1, 3, 0, 1.0}},
        {2, 2, 64, -1, "morphkv:recent=5,fusion=max", 14, {1, 0, 5, 0, 1.0}},
        {2, 4, 64, -1, "morphkv:recent=2,fusion=max,fidelity=ref,profile=qz", 7, {1, 1, 2, 0, 1.0}},
        {2, 2, 64, -1, "morphkv:recent=5,evict_after=1.5", 14, {0, 0, 5, 0, 1.5}},
        {1, 2, 60, 9, "morphkv:recent=4", 20, {0, 0, 4, 0, 1.0}},                      /* prompt shorter than B */
        {1, 2, 60, 3, "morphkv:recent=6,fusion=max", 12, {1, 0, 6, 0, 1.0}},          /* prompt shorter than R */
        {1, 2, 60, -1, "morphkv@longwriter", 40, {0, 0, 30, 600, 1.0}},              /* R scaled to 2 */
        {1, 2, 60, -1, "morphkv@longgenbench", 50, {1, 0, 200, 4096, 1.0}},          /* R scaled to 2 */
        {2, 2, 64, -1, "morphkv", 11, {0, 0, 32, 0, 1.0}},                             /* a window */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fixture f;
        fixture_make(&f, cases[c].turns, cases[c].group, cases[c].n_pos, cases[c].prompt, 8, 400 + c);
        recorder eng, ref;
        rec_init(&eng, &f);
        rec_init(&ref, &f);
        kvs_replay_result *r = run_engine(&f, cases[c].spec, cases[c].B, &eng);
        naive_morphkv(&f, &cases[c].c, cases[c].B, &ref);
        assert_true(compare(&eng, &ref, cases[c].spec) > 0);
        kvs_replay_result_free(r);
        rec_free(&eng);
        rec_free(&ref);
        kvs_test_replay_fixture_free(&f);
    }
}

/* ---- no leak on configurations that score --------------------------------------------------------------- */

static void test_reads_only_what_it_stores(void **state) {
    (void)state;
    const char *specs[] = {"morphkv:recent=4", "morphkv:recent=4,fidelity=ref", "morphkv:recent=4,profile=qz",
                           "morphkv:recent=4,profile=qz,fidelity=ref,fusion=max", "morphkv:recent=3,evict_after=2"};
    fixture f;
    fixture_make(&f, 2, 2, 72, -1, 8, 500);
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        recorder a, b;
        rec_init(&a, &f);
        rec_init(&b, &f);
        b.scramble = 1;
        kvs_replay_result *ra = run_engine(&f, specs[i], 12, &a);
        kvs_replay_result *rb = run_engine(&f, specs[i], 12, &b);
        assert_true(compare(&a, &b, specs[i]) > 0);
        kvs_replay_result_free(ra);
        kvs_replay_result_free(rb);
        rec_free(&a);
        rec_free(&b);
    }
    kvs_test_replay_fixture_free(&f);
}

/* ---- sizing rules, presets, notes, validation ---------------------------------------------------------- */

static void test_budget_and_scaling_rules(void **state) {
    (void)state;
    /* C_tot = B - 1 (the current token is attended too); with evict_after the peak must still fit B */
    assert_int_equal(kvs_morphkv_ctot(601, 1.0), 600);
    assert_int_equal(kvs_morphkv_ctot(1, 1.0), 0);
    assert_int_equal(kvs_morphkv_ctot(100, 2.0), 49); /* c = 50 triggers at 100 tokens: peak 99 */
    assert_int_equal(kvs_morphkv_ctot(10, 1.5), 6);   /* c = 7 triggers at ceil(10.5) = 11: peak 10 */
    assert_int_equal(kvs_morphkv_ctot(2, 3.0), 0);    /* c = 1 triggers at 3: peak 2 */
    assert_int_equal(kvs_morphkv_ctot(1, 3.0), -1);
    /* R scales with C_tot below paper_ctot only */
    assert_int_equal(kvs_morphkv_recent(30, 600, 600), 30);
    assert_int_equal(kvs_morphkv_recent(30, 600, 5000), 30);
    assert_int_equal(kvs_morphkv_recent(30, 600, 59), 3);   /* 2.95 */
    assert_int_equal(kvs_morphkv_recent(200, 4096, 99), 5); /* 4.83 */
    assert_int_equal(kvs_morphkv_recent(32, 2048, 10), 1);  /* 0.16 -> at least 1 */
    assert_int_equal(kvs_morphkv_recent(32, 0, 10), 32);
    /* the presets are the paper's three settings */
    kvs_policy_config a = parse("morphkv@longwriter"), b = parse("morphkv:recent=30,fusion=sum,paper_ctot=600");
    assert_string_equal(a.canonical, b.canonical);
    a = parse("morphkv@longgenbench");
    assert_string_equal(a.canonical, "recent=200,fusion=max,fidelity=paper,profile=rows,evict_after=1,paper_ctot=4096");
    a = parse("morphkv@longbench");
    assert_string_equal(a.canonical, "recent=32,fusion=sum,fidelity=paper,profile=rows,evict_after=1,paper_ctot=2048");
    a = parse("morphkv");
    assert_string_equal(a.canonical, "recent=32,fusion=sum,fidelity=paper,profile=rows,evict_after=1,paper_ctot=0");
}

static void test_notes_and_validation(void **state) {
    (void)state;
    kvs_policy_model m = {.n_layers = 1, .n_heads = 8, .n_kv_heads = 4, .group = 2, .head_dim = 8, .scale = 0.35f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = 495, .prompt_len = 239};
    char buf[1024];
    kvs_policy_config cfg = parse("morphkv");
    assert_int_equal(kvs_policy_notes(&cfg, &m, 11, buf, sizeof buf), 1);
    assert_string_equal(buf, "R=32 leaves no distant slot in C_tot=10: a window of the last 11 positions");
    assert_int_equal(kvs_policy_notes(&cfg, &m, 128, buf, sizeof buf), 0);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 495, buf, sizeof buf), 1); /* the engine's: never evicts */
    assert_non_null(strstr(buf, "nothing is ever evicted"));
    cfg = parse("morphkv@longwriter");
    assert_int_equal(kvs_policy_notes(&cfg, &m, 60, buf, sizeof buf), 1);
    assert_string_equal(buf, "recent=30 scaled to R=3 for C_tot=59 (paper_ctot=600)");
    assert_int_equal(kvs_policy_notes(&cfg, &m, 16, buf, sizeof buf), 1); /* R = 1 < C_tot = 15 */
    cfg = parse("morphkv:recent=8,evict_after=2");
    assert_int_equal(kvs_policy_notes(&cfg, &m, 300, buf, sizeof buf), 1);
    assert_string_equal(buf, "evict_after=2: C_tot=149, the cache grows back to the budget between compressions");
    assert_int_equal(kvs_policy_validate(&cfg, &m, 1), KVS_OK); /* C_tot = 0 triggers at 2 tokens: peak 1 */
    cfg = parse("morphkv:evict_after=4.5");
    assert_int_equal(kvs_policy_validate(&cfg, &m, 3), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "policy morphkv: evict_after=4.5 needs a budget of at least 4, got 3");
    assert_int_equal(kvs_policy_validate(&cfg, &m, 4), KVS_OK);
    assert_int_equal(kvs_policy_parse("morphkv:fusion=mean", &cfg), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_policy_parse("morphkv:evict_after=0.5", &cfg), KVS_ERR_INVALID_ARG);
}

/* ---- examples/morphkv.sh ------------------------------------------------------------------------------ */

static void test_example_script_runs(void **state) {
    (void)state;
    const char *bin = getenv("KVSIM_BIN"), *root = getenv("KVSIM_ROOT");
    if (!bin || !bin[0] || !root || !root[0]) {
        print_message("KVSIM_BIN / KVSIM_ROOT not set (run through `make test`): skipping\n");
        skip();
    }
    char dir[] = "/tmp/kvs_morphkv_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cmd[4096], path[600], line[512];
    snprintf(cmd, sizeof cmd, "OUT='%s' KVSIM_BIN='%s' sh '%s/examples/morphkv.sh' >'%s/log' 2>&1", dir, bin, root, dir);
    int rc = system(cmd);
    if (rc != 0) {
        snprintf(cmd, sizeof cmd, "cat '%s/log'", dir);
        (void)system(cmd);
    }
    assert_int_equal(rc, 0);
    /* the last table: 12 MorphKV runs, each with profile bytes, and 6 baselines */
    snprintf(path, sizeof path, "%s/log", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int table = 0, morph = 0, other = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "kv_bytes") && strstr(line, "aux_bytes")) table = 1;
        else if (table && strstr(line, " morphkv ")) {
            double kv = 0, aux = -1;
            assert_int_equal(sscanf(line, "%*d morphkv %*d %lf %lf", &kv, &aux), 2);
            assert_true(kv > 0 && aux > 0);
            morph++;
        } else if (table && (strstr(line, " h2o ") || strstr(line, " tova "))) {
            other++;
        }
    }
    fclose(f);
    assert_int_equal(morph, 12);
    assert_int_equal(other, 6);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fig5_fused_scores_golden_g1),
        cmocka_unit_test(test_ref_scores_do_not_underflow_to_ties),
        cmocka_unit_test(test_fig5_walkthrough_through_the_policy),
        cmocka_unit_test(test_window_drops_profile_columns),
        cmocka_unit_test(test_resident_size_constant_after_first_eviction),
        cmocka_unit_test(test_evict_after_grows_and_compresses_within_budget),
        cmocka_unit_test(test_profile_overhead_golden_g7),
        cmocka_unit_test(test_costs_of_a_steady_step),
        cmocka_unit_test(test_matches_naive_reference),
        cmocka_unit_test(test_reads_only_what_it_stores),
        cmocka_unit_test(test_budget_and_scaling_rules),
        cmocka_unit_test(test_notes_and_validation),
        cmocka_unit_test(test_example_script_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
