/* test_d2o.c — D2O (policies/d2o.c; paper §4, POLICY_SPEC §2.3, §5.3 D4, §7 G4, §8 item 3):
 *  - golden vector G4 through the merge math (d2o_internal.h): cosines, j*, m, tau0 = 0.566501, the PAPER
 *    (GAT-style) and REF merged k/v of both slots, tau1 = 0.799950 and its merge; and through the policy's own
 *    calls on a hand-made stream (the prompt compression evicts exactly G4's three tokens, then a decode step
 *    evicts a merged slot with similarity 0.9), with the merged slots handed to the engine and their costs;
 *  - similarities decided in fp64 (kvs_cosine_f64): Eq. 9's argmax and Eq. 10's merge test on keys whose cosines
 *    tie in fp32 but differ in long double (computed here independently), through the policy too;
 *  - the allocation arithmetic by hand: rho = (B-1)/P, the largest-remainder split, the reference's clamp and
 *    floors, the split S = T + N + M;
 *  - D4 (sum_l alpha_l = L rho) with alloc=paper on generated traces (both variance modes, against a naive
 *    double-precision allocation written here) and on real-model data (the bundled stories260K trace, and a
 *    tinystories-656K capture when ../shared/models is there), where the per-layer budgets of every mode are
 *    printed and alloc=ref's clamping is shown to break D4;
 *  - POLICY_SPEC §8.3a: with attention sinks (generated, one per layer, of different strengths) the raw
 *    variance hands the whole budget to one layer, min-max normalisation does not;
 *  - a NAIVE reference written here (double precision, slot structs, repeated scans) compared at every decode
 *    step with the engine: selected positions, which are merged slots, and the merged slots' K/V — every mode
 *    (variance, alloc, merge, tau, decide, skip, gqa), the presets, one and two turns, short prompts, tiny budgets;
 *  - the leak check with merges and the layer modes (the conformance fixture's two layers are all skipped
 *    by @reference), notes(), and the CLI on the bundled trace.
 * Data: GENERATED Gaussian streams (tests/util/gen_trace.h) or hand-set arrays, and the real models' traces.
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
#include "../policies/d2o_internal.h"
#include "../policies/registry.h"
#include "../sim/policy.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "../trace/trace.h"
#include "util/replay_fixture.h"
#include "util/testenv.h"

typedef kvs_test_replay_fixture fixture;

static void assert_near(double got, double want, double tol, const char *what) {
    if (!(fabs(got - want) <= tol)) {
        print_error("%s: got %.9f, want %.9f (tolerance %g)\n", what, got, want, tol);
        fail();
    }
}

static kvs_policy_config parse(const char *spec) {
    kvs_policy_config cfg;
    if (kvs_policy_parse(spec, &cfg) != KVS_OK) fail_msg("%s: %s", spec, kvs_last_error());
    return cfg;
}

/* ================================================================================================
 * G4 (POLICY_SPEC §7) through the merge math
 * ============================================================================================== */

static const float g4_kc[2][2] = {{1, 0}, {0, 1}}, g4_vc[2][2] = {{1, 1}, {2, 0}};
static const float g4_ke[3][2] = {{0.8f, 0.6f}, {0.6f, 0.8f}, {-1.0f, 0.1f}}, g4_ve[3][2] = {{0, 2}, {4, 4}, {9, 9}};
static const double g4_paper_k[2][2] = {{0.909967, 0.270100}, {0.270100, 0.909967}};
static const double g4_paper_v[2][2] = {{0.549834, 1.450166}, {2.900332, 1.800664}};
static const double g4_ref_k[2][2] = {{0.82, 0.24}, {0.24, 0.82}}, g4_ref_v[2][2] = {{0.5, 1.3}, {2.6, 1.6}};

static void test_g4_merge_math(void **state) {
    (void)state;
    const double U[3][2] = {{0.8, 0.6}, {0.6, 0.8}, {-0.995037, 0.0995037}};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) assert_near(kvs_cosine(g4_ke[i], g4_kc[j], 2), U[i][j], 1e-6, "cosine U[i][j]");
    int64_t jstar[3];
    double m[3], msum = 0;
    for (int i = 0; i < 3; i++) {
        jstar[i] = kvs_d2o_nearest(g4_ke[i], &g4_kc[0][0], 2, 2, &m[i]);
        msum += m[i];
    }
    assert_true(jstar[0] == 0 && jstar[1] == 1 && jstar[2] == 1);
    assert_near(m[0], 0.8, 1e-6, "m0");
    assert_near(m[1], 0.8, 1e-6, "m1");
    assert_near(m[2], 0.0995037, 1e-6, "m2");
    double tau0 = kvs_d2o_tau_next(0, 123.0, msum / 3, 0.7); /* the first event: the mean, whatever came before */
    assert_near(tau0, 0.566501, 5e-7, "tau0");
    assert_true(m[0] >= tau0 && m[1] >= tau0 && m[2] < tau0); /* tokens 0 and 1 merge, token 2 is discarded */
    /* ties go to the older (lower) index */
    const float same[2][2] = {{0, 1}, {0, 2}};
    double mt;
    assert_int_equal(kvs_d2o_nearest(g4_kc[1], &same[0][0], 2, 2, &mt), 0);
    for (int w = 0; w < 2; w++) {
        for (int j = 0; j < 2; j++) {
            float k[2] = {g4_kc[j][0], g4_kc[j][1]}, v[2] = {g4_vc[j][0], g4_vc[j][1]};
            const float *ke[1] = {g4_ke[j]}, *ve[1] = {g4_ve[j]};
            kvs_d2o_merge(w ? KVS_D2O_MERGE_REF : KVS_D2O_MERGE_PAPER, k, v, 2, 1, ke, ve, &m[j]);
            const double(*wk)[2] = w ? g4_ref_k : g4_paper_k, (*wv)[2] = w ? g4_ref_v : g4_paper_v;
            for (int x = 0; x < 2; x++) {
                assert_near(k[x], wk[j][x], 1e-6, w ? "REF merged k" : "PAPER merged k");
                assert_near(v[x], wv[j][x], 1e-6, w ? "REF merged v" : "PAPER merged v");
            }
        }
    }
    /* several tokens into one slot: PAPER weights e/Z and e^u/Z sum to 1; REF divides by 1 + n */
    float k[2] = {1, 0}, v[2] = {1, 1};
    const float *ke[2] = {g4_ke[0], g4_ke[1]}, *ve[2] = {g4_ve[0], g4_ve[1]};
    const double u[2] = {0.8, 0.6};
    kvs_d2o_merge(KVS_D2O_MERGE_PAPER, k, v, 2, 2, ke, ve, u);
    double z = M_E + exp(0.8) + exp(0.6);
    assert_near(k[0], (M_E + exp(0.8) * 0.8 + exp(0.6) * 0.6) / z, 1e-6, "PAPER two-token k");
    assert_near(v[1], (M_E + exp(0.8) * 2 + exp(0.6) * 4) / z, 1e-6, "PAPER two-token v");
    float k2[2] = {1, 0}, v2[2] = {1, 1};
    kvs_d2o_merge(KVS_D2O_MERGE_REF, k2, v2, 2, 2, ke, ve, u);
    assert_near(k2[0], (1 + 0.8 * 0.8 + 0.6 * 0.6) / 3, 1e-6, "REF two-token k");
    assert_near(v2[1], (1 + 0.8 * 2 + 0.6 * 4) / 3, 1e-6, "REF two-token v");
    /* the next event: a single evicted token with m = 0.9 */
    double tau1 = kvs_d2o_tau_next(1, tau0, 0.9, 0.7);
    assert_near(tau1, 0.799950, 5e-7, "tau1");
    assert_true(0.9 >= tau1 && 0.9 >= tau0);
}

/* ================================================================================================
 * G4 through the policy: a hand-made stream
 * ============================================================================================== */

/* Prompt positions 0..4: 0 = k_c0 (the sink), 1..3 = G4's evicted tokens, 4 = k_c1 (the recent slot). With
 * sinks=1 and budget 3 (cache S = 2: one sink, no heavy hitter, one recent slot) the prompt compression keeps
 * 0 and 4 and evicts exactly 1, 2, 3: G4's event. Decode position 5 has a key at similarity 0.9 to the merged
 * slot 4, which the step then evicts (the only slot neither sink nor recent) and merges into 5 (tau1 = 0.79995);
 * position 6 attends to {0, 5 merged, 6}. */
static void g4_walk(int ref) {
    enum { D = 2, N = 7 };
    kvs_policy_config cfg = parse(ref ? "d2o:sinks=1,merge=ref" : "d2o:sinks=1");
    const double (*gk)[2] = ref ? g4_ref_k : g4_paper_k, (*gv)[2] = ref ? g4_ref_v : g4_paper_v;
    float k[N * D] = {1, 0, 0.8f, 0.6f, 0.6f, 0.8f, -1, 0.1f, 0, 1, 0, 0, 1, 1};
    float v[N * D] = {1, 1, 0, 2, 4, 4, 9, 9, 2, 0, 3, -1, 0, 0};
    float q[N * D] = {0};
    /* k5: the merged slot 4's key rotated by acos(0.9), away from slot 0 */
    double th = atan2(gk[1][1], gk[1][0]) + acos(0.9);
    k[5 * D] = (float)cos(th);
    k[5 * D + 1] = (float)sin(th);
    kvs_policy_model m = {.n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .group = 1, .head_dim = D, .scale = 1.0f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = N, .prompt_len = 5};
    kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = 3, .budget_nominal = 3};
    void *st = NULL;
    assert_int_equal(kvs_policy_d2o.create(&init, &st), KVS_OK);
    kvs_policy_view pv = {.n = 5, .group = 1, .head_dim = D, .scale = 1.0f, .k = k, .v = v, .q = q, .q_first = 0,
                          .n_q = 5, .turn_begin = 0, .prompt_end = 5, .block_begin = 0, .last_block = 1};
    assert_int_equal(kvs_policy_d2o.prefill(st, &pv), KVS_OK);
    int64_t events;
    assert_near(kvs_d2o_tau(st, 0, &events), 0.566501, 5e-7, "tau0 through the policy");
    assert_int_equal(events, 1);
    int32_t stored[N];
    assert_int_equal(kvs_policy_d2o.stored(st, 0, stored), 2);
    assert_true(stored[0] == 0 && stored[1] == 4);
    int32_t buf[N], *idx[1] = {buf};
    int64_t nsel[1];
    const float *rk[N] = {0}, *rv[N] = {0}, **rkp[1] = {rk}, **rvp[1] = {rv};
    kvs_policy_sel sel = {.idx = idx, .n = nsel, .n_lists = 1, .cap = N, .row_k = rkp, .row_v = rvp};
    float k4m[2], v4m[2];
    for (int64_t p = 5; p < N; p++) {
        kvs_policy_view dv = {.n = p + 1, .group = 1, .head_dim = D, .scale = 1.0f, .k = k, .v = v, .q = q + p * D,
                              .q_first = p, .n_q = 1, .turn_begin = 0, .prompt_end = 5, .block_begin = p, .last_block = 1};
        nsel[0] = 0;
        memset(rk, 0, sizeof rk);
        memset(rv, 0, sizeof rv);
        assert_int_equal(kvs_policy_d2o.select(st, &dv, &sel), KVS_OK);
        assert_int_equal(nsel[0], 3);
        kvs_policy_cost c = {0};
        c.write_bytes = kvs_policy_kv_bytes(&m, 1); /* the engine's default before account() */
        kvs_policy_d2o.account(st, &dv, &sel, &c);
        /* 3 slots x (K, V) x 2 dims x 2 bytes; scores 3 + tau, fp32; this step evicts: the similarity row is
         * transient and unfused scoring re-reads the 3 keys */
        assert_true(c.aux_bytes == (3 + 1) * 4 && c.read_aux_bytes == (3 + 1) * 4);
        assert_true(c.read_aux_unfused_bytes == (3 + 1) * 4 + 3 * D * 2);
        assert_true(c.transient_bytes == 3 * 4);
        if (p == 5) {
            const int32_t want[3] = {0, 4, 5};
            assert_memory_equal(buf, want, sizeof want);
            assert_true(rk[0] && rv[0] && rk[1] && rv[1] && !rk[2] && !rv[2]); /* slots 0 and 4 merged, 5 not */
            for (int x = 0; x < 2; x++) {
                assert_near(rk[0][x], gk[0][x], 1e-6, "G4 slot 0 k");
                assert_near(rv[0][x], gv[0][x], 1e-6, "G4 slot 0 v");
                assert_near(rk[1][x], gk[1][x], 1e-6, "G4 slot 1 k");
                assert_near(rv[1][x], gv[1][x], 1e-6, "G4 slot 1 v");
                k4m[x] = rk[1][x];
                v4m[x] = rv[1][x];
            }
            /* the prompt's merges are not a decode step's writes: the new token's K/V and the scores */
            assert_true(c.write_bytes == 2 * D * 2 + (3 + 1) * 4);
        } else {
            const int32_t want[3] = {0, 5, 6};
            assert_memory_equal(buf, want, sizeof want);
            assert_true(rk[0] && rk[1] && !rk[2]);
            assert_near(kvs_d2o_tau(st, 0, &events), 0.799950, 2e-6, "tau1 through the policy");
            assert_int_equal(events, 2);
            /* slot 5 = k5 merged with the evicted slot 4 (u = 0.9) */
            double u = kvs_cosine(k4m, k + 5 * D, 2), wc, we;
            assert_near(u, 0.9, 2e-6, "similarity of the evicted merged slot");
            if (ref) {
                wc = 0.5;
                we = u / 2;
            } else {
                wc = M_E / (M_E + exp(u));
                we = exp(u) / (M_E + exp(u));
            }
            for (int x = 0; x < 2; x++) {
                assert_near(rk[1][x], wc * k[5 * D + x] + we * k4m[x], 1e-6, "merged slot 5 k");
                assert_near(rv[1][x], wc * v[5 * D + x] + we * v4m[x], 1e-6, "merged slot 5 v");
                assert_near(rk[0][x], gk[0][x], 1e-6, "slot 0 unchanged");
            }
            /* step 5's merge rewrote slot 5's K/V: reported now */
            assert_true(c.write_bytes == 2 * D * 2 + (3 + 1) * 4 + 2 * D * 2);
        }
        const float uni[3] = {1.0f / 3, 1.0f / 3, 1.0f / 3}, *probs[1] = {uni};
        assert_int_equal(kvs_policy_d2o.observe(st, &dv, &sel, probs), KVS_OK);
    }
    kvs_policy_d2o.free(st);
}

static void test_g4_through_the_policy(void **state) {
    (void)state;
    g4_walk(0);
    g4_walk(1);
}

/* Sliding-window layers: G4's stream with the host's window evictions. The prompt compression keeps the sink 0 (token 1
 * merged into it) and slot 4 (tokens 2 and 3 merged into it: the nearest keys). At decode position 5 the window moves
 * to first = 2: slot 0 leaves (its position), slot 4 stays although it carries tokens 2 and 3 (both in the window), and
 * the window's eviction is not D2O's (no merge: the held set {4, 5} fits the cache of 2 without an eviction). At
 * position 6, first = 3: slot 4's own position is in the window, but token 2 merged into it is not, so the slot leaves
 * (the merge cannot be undone): {5, 6} remain, again without an eviction of D2O's own. At position 7 (first = 4) the
 * sink is gone, so D2O's own eviction ranks every slot but the recent one: 5 (acc 2/3) goes, not 6 (acc 1/3 + 0.9),
 * which a sink range kept by count would have protected position 5 from. */
static void test_window_drops_merged_slots(void **state) {
    (void)state;
    enum { D = 2, N = 8 };
    kvs_policy_config cfg = parse("d2o:sinks=1");
    float k[N * D] = {1, 0, 0.8f, 0.6f, 0.6f, 0.8f, -1, 0.1f, 0, 1, 0.6f, 0.8f, 1, 1, -1, 1};
    float v[N * D] = {1, 1, 0, 2, 4, 4, 9, 9, 2, 0, 3, -1, 0, 0, 1, 2};
    float q[N * D] = {0};
    kvs_policy_model m = {.n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .group = 1, .head_dim = D, .scale = 1.0f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = N, .prompt_len = 5};
    kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = 3, .budget_nominal = 3};
    void *st = NULL;
    assert_int_equal(kvs_policy_d2o.create(&init, &st), KVS_OK);
    kvs_policy_view pv = {.n = 5, .group = 1, .head_dim = D, .scale = 1.0f, .k = k, .v = v, .q = q, .q_first = 0,
                          .n_q = 5, .turn_begin = 0, .prompt_end = 5, .block_begin = 0, .last_block = 1};
    assert_int_equal(kvs_policy_d2o.prefill(st, &pv), KVS_OK);
    int32_t stored[N], buf[N], *idx[1] = {buf};
    int64_t nsel[1], events;
    const float *rk[N] = {0}, *rv[N] = {0}, **rkp[1] = {rk}, **rvp[1] = {rv};
    kvs_policy_sel sel = {.idx = idx, .n = nsel, .n_lists = 1, .cap = N, .row_k = rkp, .row_v = rvp};
    static const int32_t want_sel[3][3] = {{0, 4, 5}, {4, 5, 6}, {5, 6, 7}}, want_kept[3][2] = {{4, 5}, {5, 6}, {6, 7}};
    for (int64_t p = 5; p < N; p++) {
        kvs_policy_view dv = {.n = p + 1, .group = 1, .head_dim = D, .scale = 1.0f, .k = k, .v = v, .q = q + p * D,
                              .q_first = p, .n_q = 1, .turn_begin = 0, .prompt_end = 5, .block_begin = p, .last_block = 1};
        memset(rk, 0, sizeof rk);
        memset(rv, 0, sizeof rv);
        assert_int_equal(kvs_policy_d2o.select(st, &dv, &sel), KVS_OK);
        assert_int_equal(nsel[0], 3);
        assert_memory_equal(buf, want_sel[p - 5], sizeof want_sel[0]);
        /* the merged slots: 0 and 4 at position 5; 4 (still merged) at position 6 */
        if (p == 5) assert_true(rk[0] && rk[1] && !rk[2]);
        else if (p == 6) assert_true(rk[0] && !rk[1] && !rk[2]);
        assert_int_equal(kvs_policy_d2o.window_evict(st, p - 3), KVS_OK); /* a window of 5: first = p + 2 - 5 */
        const float uni[3] = {1.0f / 3, 1.0f / 3, 1.0f / 3}, late[3] = {0, 0.9f, 0.1f};
        const float *probs[1] = {p < 7 ? uni : late};
        assert_int_equal(kvs_policy_d2o.observe(st, &dv, &sel, probs), KVS_OK);
        assert_int_equal(kvs_policy_d2o.stored(st, 0, stored), 2);
        assert_memory_equal(stored, want_kept[p - 5], sizeof want_kept[0]);
        kvs_d2o_tau(st, 0, &events);
        assert_int_equal(events, p < 7 ? 1 : 2); /* the window's evictions are not D2O's; at 7 its own one is */
    }
    kvs_policy_d2o.free(st);
}

/* ================================================================================================
 * Similarities decided in fp64: the matching (argmax) and the merge test (m >= tau)
 * ============================================================================================== */

/* An independent cosine of float rows in long double. */
static long double ld_cos(const float *a, const float *b, int d) {
    long double ab = 0, aa = 0, bb = 0;
    for (int x = 0; x < d; x++) {
        ab += (long double)a[x] * b[x];
        aa += (long double)a[x] * a[x];
        bb += (long double)b[x] * b[x];
    }
    return aa == 0 || bb == 0 ? 0 : ab / sqrtl(aa * bb);
}

/* The float key at angle t (radians) of length 1, d = 2. */
static void unit2(double t, float *k) {
    k[0] = (float)cos(t);
    k[1] = (float)sin(t);
}

/* Two held keys whose cosines to the evicted key round to the same float but differ by more than 1e-12 in long
 * double, the second the more similar: Eq. 9's argmax must pick the second (fp32 cosines would tie and pick the
 * older), and m must be the long double similarity to fp64 precision. */
static void test_nearest_decides_in_fp64(void **state) {
    (void)state;
    float key[2], rows[4];
    unit2(0.3, key);
    unit2(0.3 + 0.2, rows);
    int found = 0;
    for (int i = 1; i < 20000 && !found; i++) {
        unit2(0.3 + 0.2 - 1e-10 * i, rows + 2); /* a little closer to the key than rows[0] */
        long double c0 = ld_cos(key, rows, 2), c1 = ld_cos(key, rows + 2, 2);
        found = c1 - c0 > 1e-12L && (float)c0 == (float)c1;
    }
    assert_true(found);
    assert_true(kvs_cosine(key, rows, 2) == kvs_cosine(key, rows + 2, 2)); /* fp32 ties */
    double m;
    assert_int_equal(kvs_d2o_nearest(key, rows, 2, 2, &m), 1);
    assert_near(m, (double)ld_cos(key, rows + 2, 2), 1e-15, "m in fp64");
    /* kvs_cosine_f64 against long double, and its float rounding is kvs_cosine */
    for (int j = 0; j < 2; j++) {
        assert_near(kvs_cosine_f64(key, rows + 2 * j, 2), (double)ld_cos(key, rows + 2 * j, 2), 1e-15, "cosine_f64");
        assert_true((float)kvs_cosine_f64(key, rows + 2 * j, 2) == kvs_cosine(key, rows + 2 * j, 2));
    }
    const float zero[2] = {0, 0};
    assert_true(kvs_cosine_f64(key, zero, 2) == 0 && kvs_cosine_f64(zero, key, 2) == 0);
}

/* Through the policy (sinks=1, budget 3: one sink, one recent slot). Prompt 0..2: key 0 = the sink at angle 0,
 * key 1 at 80 degrees is evicted by the prompt compression and merged into key 2 (90 degrees), its m0 the first
 * threshold tau0. Decode position 3 evicts the merged slot 2 and matches it to key 3 (slot 0 is at about 85
 * degrees from it), with m1 = cos(slot 2, key 3) chosen so that (float)m1 == (float)m0 while m1 and m0 differ by
 * more than 1e-12 in long double, on the side where the fp32 values would decide the other way: it merges
 * (slot 3 handed as a merged row at position 4) exactly when the long double m1 >= m0 (tau1 = 0.7 m1 + 0.3 tau0
 * lies between them). */
static void test_merge_test_decides_in_fp64(void **state) {
    (void)state;
    enum { D = 2, N = 5 };
    const double deg = M_PI / 180;
    float k[N * D] = {0}, v[N * D] = {1, 0, 0, 1, 1, 1, 2, 0, 0, 2}, q[N * D] = {0};
    unit2(0, k);
    unit2(80 * deg, k + D);
    unit2(90 * deg, k + 2 * D);
    unit2(175 * deg, k + 3 * D); /* a placeholder until slot 2's merged key is known */
    unit2(30 * deg, k + 4 * D);
    kvs_policy_model m = {.n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .group = 1, .head_dim = D, .scale = 1.0f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = N, .prompt_len = 3};
    kvs_policy_config cfg = parse("d2o:sinks=1");
    kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = 3, .budget_nominal = 3};
    kvs_policy_view pv = {.n = 3, .group = 1, .head_dim = D, .scale = 1.0f, .k = k, .v = v, .q = q, .q_first = 0,
                          .n_q = 3, .turn_begin = 0, .prompt_end = 3, .block_begin = 0, .last_block = 1};
    int32_t buf[N], *idx[1] = {buf};
    int64_t nsel[1];
    const float *rk[N] = {0}, *rv[N] = {0}, **rkp[1] = {rk}, **rvp[1] = {rv};
    kvs_policy_sel sel = {.idx = idx, .n = nsel, .n_lists = 1, .cap = N, .row_k = rkp, .row_v = rvp};
    const float uni[3] = {1.0f / 3, 1.0f / 3, 1.0f / 3}, *probs[1] = {uni};
    long double m0 = ld_cos(k + D, k + 2 * D, D); /* key 1's nearest is key 2 (cos 80 degrees to the sink) */
    float k2m[D];
    int old_merges = -1;
    for (int pass = 0; pass < 2; pass++) { /* pass 0 reads slot 2's merged key, pass 1 runs with the chosen key 3 */
        void *st = NULL;
        assert_int_equal(kvs_policy_d2o.create(&init, &st), KVS_OK);
        assert_int_equal(kvs_policy_d2o.prefill(st, &pv), KVS_OK);
        int64_t events;
        assert_near(kvs_d2o_tau(st, 0, &events), (double)m0, 1e-15, "tau0 = m0 in fp64");
        for (int64_t p = 3; p < N; p++) {
            kvs_policy_view dv = {.n = p + 1, .group = 1, .head_dim = D, .scale = 1.0f, .k = k, .v = v,
                                  .q = q + p * D, .q_first = p, .n_q = 1, .turn_begin = 0, .prompt_end = 3,
                                  .block_begin = p, .last_block = 1};
            nsel[0] = 0;
            memset(rk, 0, sizeof rk);
            memset(rv, 0, sizeof rv);
            assert_int_equal(kvs_policy_d2o.select(st, &dv, &sel), KVS_OK);
            assert_int_equal(nsel[0], 3);
            if (p == 3) {
                assert_true(buf[1] == 2 && rk[1] != NULL); /* slot 2 merged with key 1 */
                if (pass == 0) {
                    memcpy(k2m, rk[1], sizeof k2m);
                    break;
                }
                assert_memory_equal(rk[1], k2m, sizeof k2m);
            } else {
                assert_true(buf[1] == 3);
                long double m1 = ld_cos(k2m, k + 3 * D, D);
                assert_true(ld_cos(k2m, k, D) < m1 - 0.5L); /* the sink is not the match */
                assert_near(kvs_d2o_tau(st, 0, &events), 0.7 * (double)m1 + 0.3 * (double)m0, 1e-15, "tau1");
                assert_int_equal(events, 2);
                int merged = rk[1] != NULL;
                assert_int_equal(merged, m1 >= m0);
                assert_int_equal(merged, !old_merges); /* the fp32 similarities would have decided the other way */
            }
            assert_int_equal(kvs_policy_d2o.observe(st, &dv, &sel, probs), KVS_OK);
        }
        kvs_policy_d2o.free(st);
        if (pass == 0) {
            /* key 3 at the angle from slot 2's merged key whose cosine ties m0 in fp32, on the side where the fp32
             * decision (m1 >= tau1 computed from the rounded values) differs from the long double one */
            double a2 = atan2(k2m[1], k2m[0]), t0 = a2 + acos((double)m0);
            float f = (float)m0;
            old_merges = (double)f >= kvs_d2o_tau_next(1, (double)f, (double)f, 0.7);
            int found = 0;
            for (int i = -20000; i <= 20000 && !found; i++) {
                unit2(t0 + 1e-10 * i, k + 3 * D);
                long double m1 = ld_cos(k2m, k + 3 * D, D);
                found = (float)m1 == f && fabsl(m1 - m0) > 1e-12L && (m1 >= m0) != old_merges;
            }
            assert_true(found);
        }
    }
}

/* ================================================================================================
 * Allocation arithmetic
 * ============================================================================================== */

static kvs_d2o_layers layers_of(int L, int alloc, int64_t P, int64_t B, const double *w, double *bufs) {
    static int64_t ib[4][16];
    static char full[16];
    kvs_d2o_layers o = {.n_layers = L, .alloc = alloc, .prompt_len = P, .budget = B, .F = bufs, .w = bufs + 16,
                        .alpha = bufs + 32, .cache = ib[0], .sinks = ib[1], .heavy = ib[2], .recent = ib[3], .full = full};
    for (int l = 0; l < L; l++) o.w[l] = w[l];
    return o;
}

static void test_allocation_arithmetic(void **state) {
    (void)state;
    double bufs[48];
    /* the paper: S_total = L (B - 1), largest remainders, ties to the lower layer; rho = (B - 1) / P */
    const double w3[3] = {0.5, 0.3, 0.2}, eq[3] = {1.0 / 3, 1.0 / 3, 1.0 / 3};
    kvs_d2o_layers o = layers_of(3, KVS_D2O_ALLOC_PAPER, 239, 11, w3, bufs);
    kvs_d2o_allocate(&o, 4, 0.75, 0);
    assert_near(o.rho, 10.0 / 239, 1e-15, "rho = (B-1)/P");
    assert_true(o.cache[0] == 15 && o.cache[1] == 9 && o.cache[2] == 6);
    assert_near(o.alpha[0] + o.alpha[1] + o.alpha[2], 3 * o.rho, 1e-12, "D4");
    o = layers_of(3, KVS_D2O_ALLOC_PAPER, 100, 5, eq, bufs); /* 12 / 3 = 4 each (floors of 3.9999... and remainders) */
    kvs_d2o_allocate(&o, 4, 0.75, 0);
    assert_true(o.cache[0] == 4 && o.cache[1] == 4 && o.cache[2] == 4);
    const double w2[2] = {0.55, 0.45}; /* L = 2, B = 6: total 10 -> 5.5, 4.5 -> floors 5, 4, the last slot to layer 0 */
    o = layers_of(2, KVS_D2O_ALLOC_PAPER, 100, 6, w2, bufs);
    kvs_d2o_allocate(&o, 4, 0.75, 0);
    assert_true(o.cache[0] == 6 && o.cache[1] == 4);
    /* the split S = T + N + M: T' = min(T, S), N = floor(0.75 (S - T')), M the rest */
    assert_true(o.sinks[0] == 4 && o.heavy[0] == 1 && o.recent[0] == 1);
    int64_t t, n, mm;
    kvs_d2o_split(47, 4, 0.75, &t, &n, &mm);
    assert_true(t == 4 && n == 32 && mm == 11);
    kvs_d2o_split(3, 4, 0.75, &t, &n, &mm);
    assert_true(t == 3 && n == 0 && mm == 0);
    kvs_d2o_split(0, 4, 0.75, &t, &n, &mm);
    assert_true(t == 0 && n == 0 && mm == 0);
    /* the reference: ratio = clamp(w L rho, 0.01, 1), N = floor((P+1) ratio 3/4) (sinks inside), M = floor((P+1)
     * ratio / 4). rho = 0.8 on two layers with w = (0.99, 0.01): layer 0 clamped to 1 (100 slots of the 1.584 * 100
     * it was given), layer 1 keeps floor(101 * 0.016 * 0.75) + floor(101 * 0.016 / 4) = 1: 101 in all, not 160 */
    const double wc[2] = {0.99, 0.01};
    o = layers_of(2, KVS_D2O_ALLOC_REF, 100, 81, wc, bufs);
    kvs_d2o_allocate(&o, 4, 0.75, 0);
    assert_true(o.cache[0] == 100 && o.sinks[0] == 4 && o.heavy[0] == 71 && o.recent[0] == 25);
    assert_true(o.cache[1] == 1 && o.sinks[1] == 1 && o.heavy[1] == 0 && o.recent[1] == 0);
    assert_true(o.alpha[0] + o.alpha[1] < 2 * o.rho - 0.5); /* D4 broken by the clamp */
    /* the 0.01 floor: rho = 0.2, P = 1000, w = (0.999, 0.001): layer 1 would get 0.0004, gets 0.01 -> 7 + 2 */
    const double wf[2] = {0.999, 0.001};
    o = layers_of(2, KVS_D2O_ALLOC_REF, 1000, 201, wf, bufs);
    kvs_d2o_allocate(&o, 4, 0.75, 0);
    assert_true(o.cache[1] == 9);
    /* uniform: B - 1 everywhere; skip=ref marks layers 0, 1, L-1 */
    const double w5[5] = {0.2, 0.2, 0.2, 0.2, 0.2};
    o = layers_of(5, KVS_D2O_ALLOC_UNIFORM, 100, 21, w5, bufs);
    kvs_d2o_allocate(&o, 4, 0.75, 1);
    for (int l = 0; l < 5; l++) assert_true(o.cache[l] == 20 && o.full[l] == (l != 2 && l != 3));
    /* the weights never underflow for a raw O(P) variance */
    const double F[3] = {2000.0, 2003.0, 2500.0};
    double w[3];
    kvs_d2o_weights(F, 3, w);
    assert_near(w[0], 1.0 / (1.0 + exp(-3.0) + exp(-500.0)), 1e-12, "softmax(-F) shifted by min F");
    assert_near(kvs_d2o_variance((const double[]){1, 2, 3, 4}, 4, 0), 1.25, 1e-15, "population variance");
    assert_near(kvs_d2o_variance((const double[]){1, 2, 3, 4}, 4, 1), 5.0 / 3, 1e-15, "unbiased variance");
}

/* ================================================================================================
 * Generated traces and the naive reference
 * ============================================================================================== */

static void fixture_make(fixture *f, int layers, int n_turns, int group, int n_pos, int prompt_len, uint64_t seed) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_layers = layers;
    o.n_positions = n_pos;
    o.n_turns = n_turns;
    o.prompt_len = prompt_len;
    o.n_kv_heads = 2;
    o.n_heads = 2 * group;
    o.head_dim = 8;
    o.block_positions = 13;
    o.seed = seed;
    o.q_scale = 2.0f;
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 13, f), KVS_OK);
}

static const float *fq(const fixture *f, int l, int64_t p, int qh) {
    return f->g->q + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)f->H + (size_t)qh) * (size_t)f->d;
}
static float *fk(const fixture *f, int l, int64_t p, int h) {
    return f->g->k + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)f->Hkv + (size_t)h) * (size_t)f->d;
}
static float *fv(const fixture *f, int l, int64_t p, int h) {
    return f->g->v + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)f->Hkv + (size_t)h) * (size_t)f->d;
}

/* ---- the engine's selections ---- */

typedef struct {
    const fixture *f;
    int64_t *n;      /* [cell] -1 = none; cell = ((l Hkv + h) N + p) G + li */
    int32_t *pos;    /* [cell][N] */
    char *merged;    /* [cell][N] */
    float *k, *v;    /* [cell][N][d] merged rows */
    int scramble;
    uint64_t rng;
} erec;

static size_t ecell(const fixture *f, int l, int h, int64_t p, int li) {
    return (((size_t)l * (size_t)f->Hkv + (size_t)h) * (size_t)f->N + (size_t)p) * (size_t)f->G + (size_t)li;
}

static void erec_init(erec *r, const fixture *f) {
    memset(r, 0, sizeof *r);
    r->f = f;
    size_t cells = (size_t)f->L * (size_t)f->Hkv * (size_t)f->N * (size_t)f->G, N = (size_t)f->N;
    r->n = malloc(cells * sizeof *r->n);
    r->pos = calloc(cells * N, sizeof *r->pos);
    r->merged = calloc(cells * N, 1);
    r->k = calloc(cells * N * (size_t)f->d, sizeof *r->k);
    r->v = calloc(cells * N * (size_t)f->d, sizeof *r->v);
    assert_true(r->n && r->pos && r->merged && r->k && r->v);
    for (size_t c = 0; c < cells; c++) r->n[c] = -1;
    r->rng = 0x2545f4914f6cdd1dull;
}

static void erec_free(erec *r) {
    free(r->n);
    free(r->pos);
    free(r->merged);
    free(r->k);
    free(r->v);
}

static void on_select(void *user, int config, int layer, int kv_head, int64_t p, const kvs_policy_sel *sel) {
    (void)config;
    erec *r = user;
    const fixture *f = r->f;
    size_t N = (size_t)f->N, d = (size_t)f->d;
    for (int li = 0; li < sel->n_lists; li++) {
        size_t c = ecell(f, layer, kv_head, p, li);
        r->n[c] = sel->n[li];
        for (int64_t j = 0; j < sel->n[li]; j++) {
            if (j > 0) assert_true(sel->idx[li][j] > sel->idx[li][j - 1]); /* ascending */
            r->pos[c * N + (size_t)j] = sel->idx[li][j];
            r->merged[c * N + (size_t)j] = sel->row_k[li][j] != NULL;
            if (sel->row_k[li][j]) {
                memcpy(r->k + (c * N + (size_t)j) * d, sel->row_k[li][j], d * sizeof(float));
                memcpy(r->v + (c * N + (size_t)j) * d, sel->row_v[li][j], d * sizeof(float));
            }
        }
    }
}

/* With `scramble`, overwrites the K/V rows of every position no cache of the instance holds (the conformance
 * leak check, here on configurations that merge and decide per layer). */
static void on_step_end(void *user, int config, int layer, int kv_head, int64_t pos, void *state,
                        const struct kvs_policy_ops *ops, float *k, float *v, int64_t n) {
    (void)config;
    (void)layer;
    (void)kv_head;
    (void)pos;
    erec *r = user;
    if (!r->scramble) return;
    char *keep = calloc((size_t)n, 1);
    int32_t *buf = malloc((size_t)r->f->N * sizeof *buf);
    assert_true(keep && buf);
    for (int g = 0; g < r->f->G; g++) {
        int64_t m = ops->stored(state, g, buf);
        for (int64_t j = 0; j < m; j++) keep[buf[j]] = 1;
    }
    kvs_test_scramble_rows(k, v, n, r->f->d, keep, &r->rng);
    free(keep);
    free(buf);
}

static kvs_replay_result *run_engine(const fixture *f, const char *spec, int64_t budget, erec *rec) {
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

/* ---- the naive reference: its own allocation, slot structs, double precision ---- */

enum { ND = 16 }; /* head_dim bound of the naive slot */

typedef struct {
    int sinks, variance, alloc, merge, tau, decide, skip, gqa;
    double heavy, beta;
} ncfg;

static ncfg ncfg_of(const kvs_policy_config *c) {
    ncfg n = {.sinks = (int)kvs_policy_param_get(c, "sinks"), .variance = (int)kvs_policy_param_get(c, "variance"),
              .alloc = (int)kvs_policy_param_get(c, "alloc"), .merge = (int)kvs_policy_param_get(c, "merge"),
              .tau = (int)kvs_policy_param_get(c, "tau"), .decide = (int)kvs_policy_param_get(c, "decide"),
              .skip = (int)kvs_policy_param_get(c, "skip"), .gqa = (int)kvs_policy_param_get(c, "gqa"),
              .heavy = kvs_policy_param_get(c, "heavy"), .beta = kvs_policy_param_get(c, "beta")};
    return n;
}

typedef struct {
    int64_t cache, sinks, heavy, recent; /* per layer */
    int full;
} nlayer;

/* Naive allocation: per query head the causal prompt attention in double, column sums, F per the variance mode,
 * softmax(-F), then the sizes per the alloc mode. Budgets out[l] (per KV head, the same in a layer). */
static void naive_alloc(const fixture *f, const ncfg *c, int64_t B, nlayer *out, double *F_out) {
    int L = f->L, H = f->H;
    int64_t P = f->turns[0].prompt_end;
    double *col = calloc((size_t)P, sizeof *col), *mean = calloc((size_t)P, sizeof *mean), *var = calloc((size_t)H, sizeof *var);
    double *F = calloc((size_t)L, sizeof *F), *w = calloc((size_t)L, sizeof *w), *z = calloc((size_t)P, sizeof *z);
    for (int l = 0; l < L; l++) {
        memset(mean, 0, (size_t)P * sizeof *mean);
        for (int qh = 0; qh < H; qh++) {
            memset(col, 0, (size_t)P * sizeof *col);
            for (int64_t i = 0; i < P; i++) {
                double mx = -INFINITY, s = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double dot = 0;
                    for (int x = 0; x < f->d; x++) dot += (double)fq(f, l, i, qh)[x] * fk(f, l, j, qh / f->G)[x];
                    z[j] = dot * f->scale;
                    if (z[j] > mx) mx = z[j];
                }
                for (int64_t j = 0; j <= i; j++) s += exp(z[j] - mx);
                for (int64_t j = 0; j <= i; j++) col[j] += exp(z[j] - mx) / s;
            }
            double mu = 0, ss = 0;
            for (int64_t j = 0; j < P; j++) mu += col[j];
            mu /= (double)P;
            for (int64_t j = 0; j < P; j++) ss += (col[j] - mu) * (col[j] - mu);
            var[qh] = P > 1 ? ss / (double)(P - 1) : 0;
            for (int64_t j = 0; j < P; j++) mean[j] += col[j] / H;
        }
        if (c->variance == KVS_D2O_VAR_RAW) {
            double mu = 0, ss = 0;
            for (int64_t j = 0; j < P; j++) mu += mean[j];
            mu /= (double)P;
            for (int64_t j = 0; j < P; j++) ss += (mean[j] - mu) * (mean[j] - mu);
            F[l] = ss / (double)P;
        } else {
            double lo = var[0], hi = var[0];
            for (int h = 0; h < H; h++) {
                lo = var[h] < lo ? var[h] : lo;
                hi = var[h] > hi ? var[h] : hi;
            }
            for (int h = 0; h < H; h++) F[l] += (var[h] - lo) / (hi - lo + 1e-6) / H;
        }
        if (F_out) F_out[l] = F[l];
    }
    double Fmin = F[0], sum = 0;
    for (int l = 1; l < L; l++) Fmin = F[l] < Fmin ? F[l] : Fmin;
    for (int l = 0; l < L; l++) sum += w[l] = exp(Fmin - F[l]);
    for (int l = 0; l < L; l++) w[l] /= sum;
    double rho = (double)(B - 1) / (double)P;
    for (int l = 0; l < L; l++) {
        out[l].full = c->skip == KVS_D2O_SKIP_REF && (l == 0 || l == 1 || l == L - 1);
        if (c->alloc == KVS_D2O_ALLOC_REF) {
            double r = fmin(1.0, fmax(0.01, w[l] * L * rho));
            int64_t nl = (int64_t)floor((double)(P + 1) * r * c->heavy + 1e-9), ml = (int64_t)floor((double)(P + 1) * r * (1 - c->heavy) + 1e-9);
            out[l].cache = nl + ml;
            out[l].sinks = c->sinks < nl ? c->sinks : nl;
            out[l].heavy = nl - out[l].sinks;
            out[l].recent = ml;
        } else {
            out[l].cache = c->alloc == KVS_D2O_ALLOC_UNIFORM || L == 1 ? B - 1 : (int64_t)floor(w[l] * (double)L * (double)(B - 1));
        }
    }
    if (c->alloc == KVS_D2O_ALLOC_PAPER && L > 1) { /* hand the remainder out, one at a time, largest fraction */
        int64_t total = (int64_t)L * (B - 1), have = 0;
        for (int l = 0; l < L; l++) have += out[l].cache;
        char *got = calloc((size_t)L, 1);
        for (; have < total; have++) {
            int best = -1;
            for (int l = 0; l < L; l++) {
                double fr = w[l] * (double)total - (double)out[l].cache;
                if (!got[l] && (best < 0 || fr > w[best] * (double)total - (double)out[best].cache)) best = l;
            }
            got[best] = 1;
            out[best].cache++;
        }
        free(got);
    }
    if (c->alloc != KVS_D2O_ALLOC_REF)
        for (int l = 0; l < L; l++) {
            int64_t S = out[l].cache;
            out[l].sinks = c->sinks < S ? c->sinks : S;
            out[l].heavy = (int64_t)floor(c->heavy * (double)(S - out[l].sinks) + 1e-9);
            out[l].recent = S - out[l].sinks - out[l].heavy;
        }
    free(col);
    free(mean);
    free(var);
    free(F);
    free(w);
    free(z);
}

typedef struct {
    int32_t pos;
    double acc;
    double k[ND], v[ND];
    int merged;
} nslot;

typedef struct {
    nslot *s, *ev;
    int64_t cnt, n_ev;
    int64_t *ej;
    double *em;
    double tau;
    int64_t events;
} nlist;

static double ncos(const double *a, const double *b, int d) {
    double ab = 0, aa = 0, bb = 0;
    for (int x = 0; x < d; x++) {
        ab += a[x] * b[x];
        aa += a[x] * a[x];
        bb += b[x] * b[x];
    }
    return aa == 0 || bb == 0 ? 0 : ab / (sqrt(aa) * sqrt(bb));
}

/* Evicts the slots with drop[j] = 1 of list L into its pending event, each matched to the most similar kept key
 * (first maximum). */
static void naive_evict(nlist *L, const char *drop, const ncfg *c, int d) {
    int64_t w = 0;
    L->n_ev = 0;
    for (int64_t j = 0; j < L->cnt; j++) {
        if (drop[j]) L->ev[L->n_ev++] = L->s[j];
        else L->s[w++] = L->s[j];
    }
    L->cnt = w;
    if (c->merge == KVS_D2O_MERGE_NONE || w == 0) {
        L->n_ev = 0;
        return;
    }
    for (int64_t i = 0; i < L->n_ev; i++) {
        L->ej[i] = 0;
        L->em[i] = ncos(L->ev[i].k, L->s[0].k, d);
        for (int64_t j = 1; j < L->cnt; j++) {
            double u = ncos(L->ev[i].k, L->s[j].k, d);
            if (u > L->em[i]) {
                L->em[i] = u;
                L->ej[i] = j;
            }
        }
    }
}

/* Decides the pending events of the n lists together (or one at a time): tau, merges. */
static void naive_decide(nlist *const *ls, int n, const ncfg *c, int d) {
    int64_t total = 0, most = 0;
    double msum = 0;
    for (int a = 0; a < n; a++) {
        total += ls[a]->n_ev;
        most = ls[a]->n_ev > most ? ls[a]->n_ev : most;
        for (int64_t i = 0; i < ls[a]->n_ev; i++) msum += ls[a]->em[i];
    }
    if (!total) return;
    double layer_tau = ls[0]->events == 0 ? msum / (double)total : c->beta * msum / (double)total + (1 - c->beta) * ls[0]->tau;
    for (int a = 0; a < n; a++) {
        nlist *L = ls[a];
        if (c->tau == KVS_D2O_TAU_LAYER) {
            L->tau = layer_tau; /* every list gets the same value and count */
        } else if (L->n_ev) {
            double mm = 0;
            for (int64_t i = 0; i < L->n_ev; i++) mm += L->em[i] / (double)L->n_ev;
            L->tau = L->events == 0 ? mm : c->beta * mm + (1 - c->beta) * L->tau;
        }
        if (c->tau == KVS_D2O_TAU_LAYER || L->n_ev) L->events++;
    }
    for (int a = 0; a < n; a++) {
        nlist *L = ls[a];
        for (int64_t j = 0; j < L->cnt; j++) {
            /* every evicted token merging into slot j, all against its K/V before this event */
            double zk[ND] = {0}, zv[ND] = {0}, wsum = c->merge == KVS_D2O_MERGE_PAPER ? M_E : 1.0;
            int64_t cnt = 0;
            for (int64_t i = 0; i < L->n_ev; i++) {
                if (L->ej[i] != j) continue;
                double m = L->em[i];
                if (c->decide == KVS_D2O_DECIDE_MEAN) {
                    double s = 0;
                    int k = 0;
                    for (int b = 0; b < n; b++)
                        if (ls[b]->n_ev > i) {
                            s += ls[b]->em[i];
                            k++;
                        }
                    m = s / k;
                }
                if (!(m >= L->tau)) continue;
                double wi = c->merge == KVS_D2O_MERGE_PAPER ? exp(L->em[i]) : L->em[i];
                if (c->merge == KVS_D2O_MERGE_PAPER) wsum += wi;
                for (int x = 0; x < d; x++) {
                    zk[x] += wi * L->ev[i].k[x];
                    zv[x] += wi * L->ev[i].v[x];
                }
                cnt++;
            }
            if (!cnt) continue;
            if (c->merge == KVS_D2O_MERGE_REF) wsum = 1.0 + (double)cnt;
            double wc = c->merge == KVS_D2O_MERGE_PAPER ? M_E : 1.0;
            for (int x = 0; x < d; x++) {
                L->s[j].k[x] = (wc * L->s[j].k[x] + zk[x]) / wsum;
                L->s[j].v[x] = (wc * L->s[j].v[x] + zv[x]) / wsum;
            }
            L->s[j].merged = 1;
        }
    }
    for (int a = 0; a < n; a++) ls[a]->n_ev = 0; /* after every list decided: the means read them all */
    (void)most;
}

static int layer_modes(const ncfg *c) {
    return c->merge != KVS_D2O_MERGE_NONE && (c->tau == KVS_D2O_TAU_LAYER || c->decide == KVS_D2O_DECIDE_MEAN);
}

/* Softmax over the list's slots (those with position <= qp) of query qh, in double, into p[]. */
static void naive_probs(const fixture *f, int l, int qh, int64_t qp, const nlist *L, double *p) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < L->cnt; j++) {
        if (L->s[j].pos > qp) {
            p[j] = -INFINITY;
            continue;
        }
        double dot = 0;
        for (int x = 0; x < f->d; x++) dot += (double)fq(f, l, qp, qh)[x] * L->s[j].k[x];
        p[j] = dot * f->scale;
        mx = p[j] > mx ? p[j] : mx;
    }
    for (int64_t j = 0; j < L->cnt; j++) s += p[j] == -INFINITY ? 0 : exp(p[j] - mx);
    for (int64_t j = 0; j < L->cnt; j++) p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - mx) / s;
}

static void naive_append(const fixture *f, int l, int h, nlist *L, int64_t p) {
    nslot *s = &L->s[L->cnt++];
    memset(s, 0, sizeof *s);
    s->pos = (int32_t)p;
    for (int x = 0; x < f->d; x++) {
        s->k[x] = fk(f, l, p, h)[x];
        s->v[x] = fv(f, l, p, h)[x];
    }
}

/* Runs the naive D2O on every layer and compares each decode step with the engine's record; returns the number
 * of merged slots compared. */
static int64_t naive_compare(const fixture *f, const char *spec, int64_t B, const erec *eng, const int64_t *eng_budgets) {
    kvs_policy_config cfg = parse(spec);
    ncfg c = ncfg_of(&cfg);
    int L = f->L, Hkv = f->Hkv, G = f->G, d = f->d, nl = c.gqa == KVS_D2O_GQA_EXPAND ? G : 1;
    int64_t N = f->N, merged_seen = 0;
    assert_true(d <= ND);
    nlayer *lay = calloc((size_t)L, sizeof *lay);
    naive_alloc(f, &c, B, lay, NULL);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < Hkv; h++) {
            int64_t want = lay[l].full ? N : lay[l].cache + 1;
            if (eng_budgets[l * Hkv + h] != want)
                fail_msg("%s B=%lld: layer %d budget %lld, naive %lld", spec, (long long)B, l, (long long)eng_budgets[l * Hkv + h],
                         (long long)want);
        }
    nlist *ls = calloc((size_t)Hkv * (size_t)nl, sizeof *ls);
    nlist **all = calloc((size_t)Hkv * (size_t)nl, sizeof *all);
    double *p = malloc((size_t)N * sizeof *p), *acc = malloc((size_t)N * sizeof *acc);
    char *drop = malloc((size_t)N);
    for (int a = 0; a < Hkv * nl; a++) {
        ls[a].s = malloc((size_t)N * sizeof(nslot));
        ls[a].ev = malloc((size_t)N * sizeof(nslot));
        ls[a].ej = malloc((size_t)N * sizeof(int64_t));
        ls[a].em = malloc((size_t)N * sizeof(double));
        all[a] = &ls[a];
    }
    for (int l = 0; l < L; l++) {
        const nlayer *ly = &lay[l];
        for (int a = 0; a < Hkv * nl; a++) {
            ls[a].cnt = ls[a].n_ev = ls[a].events = 0;
            ls[a].tau = 0;
        }
        for (int64_t t = 0; t < f->n_turns; t++) {
            const kvs_turn *tu = &f->turns[t];
            /* prefill */
            for (int h = 0; h < Hkv && !ly->full; h++)
                for (int li = 0; li < nl; li++) {
                    nlist *Ls = &ls[h * nl + li];
                    for (int64_t q = tu->begin; q < tu->prompt_end; q++) naive_append(f, l, h, Ls, q);
                    for (int64_t q = tu->begin; q < tu->prompt_end; q++)
                        for (int g = 0; g < G; g++) {
                            if (nl > 1 && g != li) continue;
                            naive_probs(f, l, h * G + g, q, Ls, p);
                            for (int64_t j = 0; j < Ls->cnt; j++) Ls->s[j].acc += p[j];
                        }
                    if (Ls->cnt > ly->cache) {
                        /* keep the sinks, the last M, and the N best in between (older first on ties) */
                        int64_t lo = ly->sinks, hi = Ls->cnt - ly->recent;
                        memset(drop, 1, (size_t)Ls->cnt);
                        for (int64_t j = 0; j < lo; j++) drop[j] = 0;
                        for (int64_t j = hi; j < Ls->cnt; j++) drop[j] = 0;
                        for (int64_t k = 0; k < ly->heavy; k++) {
                            int64_t best = -1;
                            for (int64_t j = lo; j < hi; j++)
                                if (drop[j] && (best < 0 || Ls->s[j].acc > Ls->s[best].acc)) best = j;
                            drop[best] = 0;
                        }
                        naive_evict(Ls, drop, &c, d);
                        if (!layer_modes(&c)) naive_decide(&Ls, 1, &c, d);
                    }
                }
            if (layer_modes(&c) && !ly->full) naive_decide(all, Hkv * nl, &c, d);
            /* decode */
            for (int64_t q = tu->prompt_end; q < tu->end; q++) {
                for (int h = 0; h < Hkv; h++)
                    for (int li = 0; li < nl; li++) {
                        size_t cell = ecell(f, l, h, q, li);
                        if (ly->full) { /* everything, nothing merged */
                            assert_int_equal(eng->n[cell], q + 1);
                            for (int64_t j = 0; j <= q; j++) assert_true(eng->pos[cell * (size_t)N + (size_t)j] == j);
                            continue;
                        }
                        nlist *Ls = &ls[h * nl + li];
                        naive_append(f, l, h, Ls, q);
                        if (eng->n[cell] != Ls->cnt)
                            fail_msg("%s B=%lld: layer %d head %d list %d position %lld: %lld entries, naive %lld", spec, (long long)B,
                                     l, h, li, (long long)q, (long long)eng->n[cell], (long long)Ls->cnt);
                        for (int64_t j = 0; j < Ls->cnt; j++) {
                            size_t e = cell * (size_t)N + (size_t)j;
                            if (eng->pos[e] != Ls->s[j].pos || eng->merged[e] != Ls->s[j].merged)
                                fail_msg("%s B=%lld: layer %d head %d list %d position %lld entry %lld: position %d%s, naive %d%s",
                                         spec, (long long)B, l, h, li, (long long)q, (long long)j, eng->pos[e],
                                         eng->merged[e] ? " merged" : "", Ls->s[j].pos, Ls->s[j].merged ? " merged" : "");
                            if (!Ls->s[j].merged) continue;
                            merged_seen++;
                            for (int x = 0; x < d; x++) {
                                double ek = eng->k[e * (size_t)d + (size_t)x], ev = eng->v[e * (size_t)d + (size_t)x];
                                if (fabs(ek - Ls->s[j].k[x]) > 1e-4 * (1 + fabs(Ls->s[j].k[x])) ||
                                    fabs(ev - Ls->s[j].v[x]) > 1e-4 * (1 + fabs(Ls->s[j].v[x])))
                                    fail_msg("%s: merged slot %d K/V differ at layer %d head %d list %d position %lld: dim %d "
                                             "k %.6f v %.6f, naive %.6f %.6f", spec, Ls->s[j].pos, l, h, li, (long long)q, x, ek, ev,
                                             Ls->s[j].k[x], Ls->s[j].v[x]);
                            }
                        }
                        /* attention, then the score update and the eviction */
                        for (int64_t j = 0; j < Ls->cnt; j++) acc[j] = 0;
                        for (int g = 0; g < G; g++) {
                            if (nl > 1 && g != li) continue;
                            naive_probs(f, l, h * G + g, q, Ls, p);
                            for (int64_t j = 0; j < Ls->cnt; j++) acc[j] += p[j];
                        }
                        for (int64_t j = 0; j < Ls->cnt; j++) Ls->s[j].acc += acc[j];
                        if (Ls->cnt > ly->cache) {
                            int64_t lo = ly->sinks, hi = Ls->cnt - ly->recent, victim = -1;
                            for (int64_t j = lo; j < hi; j++)
                                if (victim < 0 || Ls->s[j].acc <= Ls->s[victim].acc) victim = j;
                            memset(drop, 0, (size_t)Ls->cnt);
                            drop[victim] = 1;
                            naive_evict(Ls, drop, &c, d);
                            if (!layer_modes(&c)) naive_decide(&Ls, 1, &c, d);
                        }
                    }
                if (layer_modes(&c) && !ly->full) naive_decide(all, Hkv * nl, &c, d);
            }
        }
    }
    for (int a = 0; a < Hkv * nl; a++) {
        free(ls[a].s);
        free(ls[a].ev);
        free(ls[a].ej);
        free(ls[a].em);
    }
    free(ls);
    free(all);
    free(p);
    free(acc);
    free(drop);
    free(lay);
    return merged_seen;
}

static void test_matches_naive_reference(void **state) {
    (void)state;
    const struct {
        int layers, turns, group, n_pos, prompt;
        const char *spec;
        int64_t B;
    } cases[] = {
        {3, 1, 2, 60, -1, "d2o", 12},                                       /* defaults: minmax, paper, expand */
        {3, 1, 2, 60, -1, "d2o:sinks=2", 9},
        {3, 1, 2, 60, -1, "d2o:merge=ref,beta=0.5", 12},
        {3, 1, 2, 60, -1, "d2o:merge=none", 10},
        {3, 1, 2, 60, -1, "d2o:variance=raw", 12},
        {3, 1, 2, 60, -1, "d2o:alloc=ref", 14},
        {3, 1, 2, 60, -1, "d2o:alloc=uniform,heavy=0.5", 11},
        {3, 1, 2, 60, -1, "d2o:gqa=sum", 12},
        {3, 1, 3, 60, -1, "d2o:gqa=sum,merge=ref", 10},
        {3, 1, 2, 60, -1, "d2o:tau=layer", 12},
        {3, 1, 2, 60, -1, "d2o:decide=mean", 12},
        {3, 1, 2, 60, -1, "d2o:tau=layer,decide=mean,gqa=sum", 12},
        {4, 1, 2, 60, -1, "d2o@reference", 14},                            /* layers 0, 1, 3 uncompressed */
        {4, 1, 2, 60, -1, "d2o@paper", 12},
        {3, 2, 2, 72, -1, "d2o", 11},                                       /* two turns: merged slots in prefill */
        {3, 2, 2, 72, -1, "d2o:tau=layer,decide=mean,merge=ref", 11},
        {3, 2, 1, 72, -1, "d2o:sinks=1,heavy=0.5", 9},                      /* MHA */
        {3, 1, 2, 60, 6, "d2o", 16},                                        /* prompt shorter than the cache */
        {3, 1, 2, 60, -1, "d2o", 5},                                        /* tiny: cache 4 = sinks only */
        {3, 1, 2, 60, -1, "d2o:sinks=0,heavy=1", 8},                        /* no recent window */
        {2, 1, 2, 60, -1, "d2o", 2},                                        /* one slot */
    };
    int64_t merged = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fixture f;
        fixture_make(&f, cases[i].layers, cases[i].turns, cases[i].group, cases[i].n_pos, cases[i].prompt, 700 + i);
        erec eng;
        erec_init(&eng, &f);
        kvs_replay_result *r = run_engine(&f, cases[i].spec, cases[i].B, &eng);
        merged += naive_compare(&f, cases[i].spec, cases[i].B, &eng, r->runs[0].budgets);
        kvs_replay_result_free(r);
        erec_free(&eng);
        kvs_test_replay_fixture_free(&f);
    }
    assert_true(merged > 1000); /* the comparison covered merged slots, not only plain ones */
}

/* ---- D4 and the allocation against the naive one, generated ---------------------------------------------- */

static int64_t layer_budget_sum(const kvs_replay_result *r, const fixture *f) {
    int64_t s = 0;
    for (int l = 0; l < f->L; l++)
        for (int h = 0; h < f->Hkv; h++) {
            assert_true(r->runs[0].budgets[l * f->Hkv + h] == r->runs[0].budgets[l * f->Hkv]); /* per layer */
            s += r->runs[0].budgets[l * f->Hkv + h];
        }
    return s;
}

static void test_d4_on_generated_traces(void **state) {
    (void)state;
    const char *specs[] = {"d2o", "d2o:variance=raw", "d2o:gqa=sum", "d2o:variance=raw,sinks=0"};
    const int64_t Bs[] = {2, 7, 13, 30};
    for (int seed = 0; seed < 3; seed++) {
        fixture f;
        fixture_make(&f, 5, 1, 2, 64, 40, 900 + seed);
        for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++)
            for (size_t b = 0; b < sizeof Bs / sizeof Bs[0]; b++) {
                kvs_replay_result *r = run_engine(&f, specs[s], Bs[b], NULL);
                /* sum_l (B_l - 1) = sum_l S_l = L (B - 1) = L rho P: sum_l alpha_l = L rho */
                assert_int_equal(layer_budget_sum(r, &f), (int64_t)f.L * f.Hkv * Bs[b]);
                kvs_policy_config cfg = parse(specs[s]);
                ncfg c = ncfg_of(&cfg);
                nlayer lay[8];
                naive_alloc(&f, &c, Bs[b], lay, NULL);
                for (int l = 0; l < f.L; l++) assert_int_equal(r->runs[0].budgets[l * f.Hkv], lay[l].cache + 1);
                kvs_replay_result_free(r);
            }
        kvs_test_replay_fixture_free(&f);
    }
}

/* POLICY_SPEC §8.3a on generated data with attention sinks: layer l's position 0 takes a share of every query's
 * attention that grows with l (a large key along a direction every query has), so the raw column-sum variance
 * grows like s^2 P and the raw softmax gives (nearly) everything to layer 0, min-max normalisation does not. */
static void test_raw_variance_collapses_with_sinks(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 4, 1, 2, 160, 128, 950);
    for (int l = 0; l < f.L; l++) {
        for (int64_t p = 0; p < f.N; p++) {
            for (int qh = 0; qh < f.H; qh++) ((float *)fq(&f, l, p, qh))[0] = 4.0f;
            for (int h = 0; h < f.Hkv; h++) fk(&f, l, p, h)[0] = p == 0 ? 2.0f + 1.5f * (float)l : 0.0f;
        }
    }
    const int64_t B = 33; /* rho = 0.25 */
    kvs_replay_result *raw = run_engine(&f, "d2o:variance=raw", B, NULL);
    kvs_replay_result *mm = run_engine(&f, "d2o", B, NULL);
    int64_t total = (int64_t)f.L * (B - 1);
    assert_int_equal(layer_budget_sum(raw, &f), (int64_t)f.L * f.Hkv * B); /* D4 still holds */
    assert_int_equal(layer_budget_sum(mm, &f), (int64_t)f.L * f.Hkv * B);
    double F[4];
    kvs_policy_config cfg = parse("d2o:variance=raw");
    ncfg c = ncfg_of(&cfg);
    nlayer lay[4];
    naive_alloc(&f, &c, B, lay, F);
    print_message("raw F per layer with sinks: %.2f %.2f %.2f %.2f; cache raw %lld %lld %lld %lld, minmax %lld %lld %lld %lld\n",
                  F[0], F[1], F[2], F[3], (long long)raw->runs[0].budgets[0] - 1, (long long)raw->runs[0].budgets[2] - 1,
                  (long long)raw->runs[0].budgets[4] - 1, (long long)raw->runs[0].budgets[6] - 1,
                  (long long)mm->runs[0].budgets[0] - 1, (long long)mm->runs[0].budgets[2] - 1,
                  (long long)mm->runs[0].budgets[4] - 1, (long long)mm->runs[0].budgets[6] - 1);
    for (int l = 1; l < f.L; l++) assert_true(F[l] > F[l - 1] + 5); /* O(P) variances, several units apart */
    assert_true(raw->runs[0].budgets[0] - 1 >= total - 1);            /* the whole budget on layer 0 ... */
    for (int l = 1; l < f.L; l++) assert_true(raw->runs[0].budgets[l * f.Hkv] <= 2); /* ... the others attend ~1 */
    for (int l = 0; l < f.L; l++) /* minmax: every layer at least 1/(1 + (L-1)e) of the total */
        assert_true((double)(mm->runs[0].budgets[l * f.Hkv] - 1) >= floor((double)total / (1 + (f.L - 1) * M_E)));
    kvs_replay_result_free(raw);
    kvs_replay_result_free(mm);
    kvs_test_replay_fixture_free(&f);
}

/* ================================================================================================
 * Real-model data: D4, the per-layer budgets of every mode, alloc=ref breaking D4
 * ============================================================================================== */

/* The allocation pass run directly on a trace's first prompt (as the engine runs it), for the diagnostics. */
static void alloc_on_trace(kvs_trace *t, const char *spec, int64_t B, kvs_d2o_layers *out, int64_t *budgets, void **keep) {
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_trace(t, &src), KVS_OK);
    const kvs_policy_model *m = &src.model;
    kvs_policy_config cfg = parse(spec);
    int64_t P = src.turns[0].prompt_end;
    size_t d = (size_t)m->head_dim, Gd = (size_t)m->group * d;
    float *k = malloc((size_t)P * d * sizeof *k), *v = malloc((size_t)P * d * sizeof *v), *q = malloc((size_t)P * Gd * sizeof *q);
    assert_true(k && v && q);
    void *a = NULL;
    assert_int_equal(kvs_policy_d2o.alloc_begin(&cfg, m, B, &a), KVS_OK);
    for (int l = 0; l < m->n_layers; l++)
        for (int h = 0; h < m->n_kv_heads; h++) {
            void *s;
            assert_int_equal(src.stream_open(src.user, l, h, &s), KVS_OK);
            int64_t pos = 0;
            while (pos < P) {
                const kvs_trace_block *b;
                assert_int_equal(src.stream_next(s, &b), KVS_OK);
                for (int i = 0; i < b->n_pos && pos < P; i++, pos++) {
                    memcpy(k + (size_t)pos * d, b->k + (size_t)i * d, d * sizeof *k);
                    memcpy(v + (size_t)pos * d, b->v + (size_t)i * d, d * sizeof *v);
                    memcpy(q + (size_t)pos * Gd, b->q + (size_t)i * Gd, Gd * sizeof *q);
                }
            }
            src.stream_free(s);
            kvs_policy_view view = {.n = P, .group = m->group, .head_dim = m->head_dim, .scale = m->scale, .k = k, .v = v,
                                    .q = q, .q_first = 0, .n_q = P, .turn_begin = 0, .prompt_end = P, .last_block = 1};
            assert_int_equal(kvs_policy_d2o.alloc_prefill(a, l, h, &view), KVS_OK);
        }
    assert_int_equal(kvs_policy_d2o.alloc_end(a, budgets), KVS_OK);
    *out = *(const kvs_d2o_layers *)kvs_policy_d2o.alloc_shared(a);
    *keep = a;
    free(k);
    free(v);
    free(q);
}

static void d4_on_real_trace(const char *path) {
    kvs_trace *t = NULL;
    if (kvs_trace_open(path, &t) != KVS_OK) fail_msg("%s: %s", path, kvs_last_error());
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_trace(t, &src), KVS_OK);
    int L = src.model.n_layers, Hkv = src.model.n_kv_heads;
    int64_t P = src.turns[0].prompt_end;
    const char *modes[] = {"d2o", "d2o:variance=raw", "d2o:alloc=ref", "d2o@reference"};
    /* the paper's rho = 0.2, 0.4, 0.8 (§5.1) and 1 (Table 5: budget = prompt length): B = rho P + 1 */
    const double rhos[] = {0.2, 0.4, 0.8, 1.0};
    print_message("%s: %d layers, P = %lld\n", path, L, (long long)P);
    int64_t *budgets = malloc((size_t)L * (size_t)Hkv * sizeof *budgets);
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        for (int bi = 0; bi < 4; bi++) {
            kvs_d2o_layers o;
            void *a = NULL;
            int64_t B = (int64_t)llround(rhos[bi] * (double)P) + 1;
            alloc_on_trace(t, modes[mi], B, &o, budgets, &a);
            double sa = 0, loss = 0;
            char line[1024];
            int w = snprintf(line, sizeof line, "  %-16s B=%-4lld rho=%.4f  S_l:", modes[mi], (long long)B, o.rho);
            for (int l = 0; l < L; l++) {
                sa += o.alpha[l];
                loss += fmax(0.0, o.w[l] * L * o.rho - 1.0);
                w += snprintf(line + w, sizeof line - (size_t)w, " %lld%s", (long long)o.cache[l], o.full[l] ? "(full)" : "");
            }
            w += snprintf(line + w, sizeof line - (size_t)w, "  F:");
            for (int l = 0; l < L; l++) w += snprintf(line + w, sizeof line - (size_t)w, " %.3f", o.F[l]);
            print_message("%s  sum alpha=%.4f, L rho=%.4f\n", line, sa, L * o.rho);
            for (int l = 0; l < L; l++) {
                int64_t want = o.full[l] ? src.model.n_positions : o.cache[l] + 1;
                for (int h = 0; h < Hkv; h++) assert_int_equal(budgets[l * Hkv + h], want);
            }
            if (o.alloc == KVS_D2O_ALLOC_PAPER) assert_near(sa, L * o.rho, 1e-9, "D4 on real-model data (alloc=paper)");
            if (o.alloc == KVS_D2O_ALLOC_REF) {
                /* the clamp: a capped layer keeps floor((P+1) 3/4) + floor((P+1)/4), its excess w L rho - 1 goes to
                 * nobody; with the floors and the (P+1) factor, sum alpha <= (L rho - loss)(P+1)/P (no layer below the
                 * 0.01 floor with min-max weights), which is below L rho once the clamp takes more than (P+1)/P gives */
                for (int l = 0; l < L; l++)
                    if (o.w[l] * L * o.rho > 1.0)
                        assert_int_equal(o.cache[l], (int64_t)floor((double)(P + 1) * 0.75) + (int64_t)floor((double)(P + 1) * 0.25));
                assert_true(sa <= (L * o.rho - loss) * (double)(P + 1) / (double)P + 1e-9);
                if ((L * o.rho - loss) * (double)(P + 1) / (double)P < L * o.rho) assert_true(sa < L * o.rho);
                if (loss > 0) print_message("    the clamp binds: %.1f slots of L(B-1) = %lld lost to it\n", loss * (double)P,
                                            (long long)(L * (B - 1)));
            }
            kvs_policy_d2o.alloc_free(a);
        }
    }
    /* the engine's run: the same budgets, D4 in the run's own record */
    int64_t B20 = (int64_t)ceil(0.2 * (double)P); /* --budgets 20% */
    kvs_replay_config rc = {.policy = parse("d2o"), .budget = B20, .budget_fraction = 0.2};
    kvs_replay_opts o = {.configs = &rc, .n_configs = 1, .threads = 2, .measure = KVS_MEASURE_DECODE};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
    assert_int_equal(r->runs[0].status, KVS_OK);
    int64_t s = 0;
    for (int c = 0; c < L * Hkv; c++) s += r->runs[0].budgets[c];
    assert_int_equal(s, (int64_t)L * Hkv * B20);
    kvs_replay_result_free(r);
    free(budgets);
    kvs_trace_close(t);
}

static void test_d4_on_real_model_data(void **state) {
    (void)state;
    char path[4096], model[4096];
    snprintf(path, sizeof path, "%s/examples/stories260K.kvt", kvs_test_root());
    if (!kvs_test_exists(path)) {
        print_message("SKIP: %s (the bundled real-model trace) is absent\n", path);
        skip();
    }
    d4_on_real_trace(path);
    /* the second real model, captured here when the models and the binary are there */
    const char *bin = getenv("KVSIM_BIN");
    snprintf(model, sizeof model, "%s/../shared/models/tinystories-656K", kvs_test_root());
    if (!bin || !*bin || !kvs_test_exists(model)) {
        print_message("SKIP (second model): needs KVSIM_BIN and %s\n", model);
        return;
    }
    char dir[] = "/tmp/kvsim_d2o_XXXXXX", cmd[16384], trace[64];
    assert_non_null(mkdtemp(dir));
    snprintf(trace, sizeof trace, "%s/ts656.kvt", dir);
    snprintf(cmd, sizeof cmd, "'%s' capture --model '%s' --prompt-file '%s/examples/prompt.txt' --steps 32 --ignore-eos --out '%s' >/dev/null 2>&1",
             bin, model, kvs_test_root(), trace);
    assert_int_equal(system(cmd), 0);
    d4_on_real_trace(trace);
    unlink(trace);
    rmdir(dir);
}

/* ================================================================================================
 * Leaks, notes, CLI
 * ============================================================================================== */

static void test_reads_only_what_it_stores(void **state) {
    (void)state;
    const char *specs[] = {"d2o", "d2o:tau=layer,decide=mean", "d2o@reference", "d2o:gqa=sum,merge=ref,tau=layer",
                           "d2o:variance=raw,alloc=ref"};
    fixture f;
    fixture_make(&f, 4, 2, 2, 72, -1, 990);
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        erec a, b;
        erec_init(&a, &f);
        erec_init(&b, &f);
        b.scramble = 1;
        kvs_replay_result *ra = run_engine(&f, specs[i], 10, &a);
        kvs_replay_result *rb = run_engine(&f, specs[i], 10, &b);
        size_t cells = (size_t)f.L * (size_t)f.Hkv * (size_t)f.N * (size_t)f.G;
        int64_t merged = 0;
        for (size_t c = 0; c < cells; c++) {
            assert_true(a.n[c] == b.n[c]);
            if (a.n[c] <= 0) continue;
            assert_memory_equal(a.pos + c * (size_t)f.N, b.pos + c * (size_t)f.N, (size_t)a.n[c] * sizeof(int32_t));
            assert_memory_equal(a.merged + c * (size_t)f.N, b.merged + c * (size_t)f.N, (size_t)a.n[c]);
            for (int64_t j = 0; j < a.n[c]; j++) merged += a.merged[c * (size_t)f.N + (size_t)j];
        }
        assert_true(merged > 0);
        kvs_replay_result_free(ra);
        kvs_replay_result_free(rb);
        erec_free(&a);
        erec_free(&b);
    }
    kvs_test_replay_fixture_free(&f);
}

static void test_notes(void **state) {
    (void)state;
    kvs_policy_model m = {.n_layers = 5, .n_heads = 8, .n_kv_heads = 4, .group = 2, .head_dim = 8, .scale = 0.35f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = 495, .prompt_len = 239, .max_new_tokens = 256};
    char buf[2048];
    kvs_policy_config c = parse("d2o");
    assert_int_equal(kvs_policy_notes(&c, &m, 48, buf, sizeof buf), 0);
    c = parse("d2o@paper");
    assert_true(kvs_policy_notes(&c, &m, 48, buf, sizeof buf) >= 1);
    assert_non_null(strstr(buf, "variance=raw"));
    assert_non_null(strstr(buf, "to one layer"));
    c = parse("d2o");
    assert_true(kvs_policy_notes(&c, &m, 5, buf, sizeof buf) >= 1); /* B - 1 = 4 = T */
    assert_non_null(strstr(buf, "sinks only"));
    assert_true(kvs_policy_notes(&c, &m, 6, buf, sizeof buf) >= 1); /* one non-sink slot: a recent one */
    assert_non_null(strstr(buf, "no heavy-hitter slot"));
    c = parse("d2o:heavy=1");
    assert_true(kvs_policy_notes(&c, &m, 48, buf, sizeof buf) >= 1);
    assert_non_null(strstr(buf, "no recent window"));
    c = parse("d2o@reference");
    assert_true(kvs_policy_notes(&c, &m, 48, buf, sizeof buf) >= 1);
    assert_non_null(strstr(buf, "layers 0, 1 and 4 keep every position"));
    assert_null(strstr(buf, "D4 broken")); /* rho = 0.2: the clamp cannot bind with min-max weights */
    assert_true(kvs_policy_notes(&c, &m, 200, buf, sizeof buf) >= 2);
    assert_non_null(strstr(buf, "D4 broken"));
}

static void test_cli_on_the_bundled_trace(void **state) {
    (void)state;
    const char *bin = getenv("KVSIM_BIN");
    char trace[4096];
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    if (!bin || !*bin || !kvs_test_exists(trace)) {
        print_message("SKIP: needs KVSIM_BIN (run through `make test`) and %s\n", trace);
        skip();
    }
    char dir[] = "/tmp/kvsim_d2o_cli_XXXXXX", cmd[16384];
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd,
             "'%s' replay '%s' --db '%s/r.db' --policy d2o --policy d2o@reference --policy 'd2o:gqa=sum,merge=ref' "
             "--budgets 20%%,50%% --no-progress >'%s/log' 2>&1 && '%s' runs '%s/r.db' --csv --summary >'%s/runs.csv' 2>>'%s/log'",
             bin, trace, dir, dir, bin, dir, dir, dir);
    int rc = system(cmd);
    snprintf(cmd, sizeof cmd, "%s/runs.csv", dir);
    FILE *fp = fopen(cmd, "r");
    int lines = 0;
    char row[8192];
    while (fp && fgets(row, sizeof row, fp)) lines += strncmp(row, "d2o,", 4) == 0;
    if (fp) fclose(fp);
    if (rc != 0 || lines != 6) {
        snprintf(cmd, sizeof cmd, "cat '%s/log'", dir);
        if (system(cmd)) {}
        fail_msg("kvsim replay of d2o on the bundled trace: rc %d, %d runs", rc, lines);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_g4_merge_math),
        cmocka_unit_test(test_g4_through_the_policy),
        cmocka_unit_test(test_window_drops_merged_slots),
        cmocka_unit_test(test_nearest_decides_in_fp64),
        cmocka_unit_test(test_merge_test_decides_in_fp64),
        cmocka_unit_test(test_allocation_arithmetic),
        cmocka_unit_test(test_matches_naive_reference),
        cmocka_unit_test(test_d4_on_generated_traces),
        cmocka_unit_test(test_raw_variance_collapses_with_sinks),
        cmocka_unit_test(test_d4_on_real_model_data),
        cmocka_unit_test(test_reads_only_what_it_stores),
        cmocka_unit_test(test_notes),
        cmocka_unit_test(test_cli_on_the_bundled_trace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
