/* test_rocketkv.c — RocketKV, HSA and RocketKV-MT (policies/rocketkv.c, hsa.c, rocketkv_mt.c; POLICY_SPEC §2.2,
 * §3, §5.2, §7 G2), and the Table 1 accounting of the sparse-attention baselines (quest.c, sparq.c):
 *  - golden vector G2: c = 64 (r, c^r, c^(1-r), page size, head ratio, Table 1 storage 0.17542 / MT 1.07802,
 *    traffic 1/c), the pipeline derivation table row by row (cap, B_p, k2, c2, Ppg, k1 for both roundings) and
 *    the per-c table, through kvs_rocketkv_derive (policies/rocketkv_internal.h);
 *  - Table 1 reproduced by the replay's own accounting at c = 64: device KV, page min/max and host store, and
 *    the traffic, for RocketKV, RocketKV-MT, HSA, Quest (even split) and SparQ, against the closed forms with the
 *    actual rounding and against the paper's unrounded values;
 *  - a NAIVE reference written here (double precision, dense loops: stage-1 causal softmax window sums, max
 *    pooling by scan, page min/max from the raw keys, per-token estimates and softmaxes, selection by repeated
 *    scan with ties to the older token) compared with the engine's selection at every decode step: stage 1 on
 *    and degenerate, kernels, windows, static and adaptive r, both roundings, MHA and GQA 2-4, one and two turns,
 *    rocketkv, rocketkv_mt and hsa;
 *  - decode reads no key but the current one: every other row is scrambled between decode steps (restored
 *    before the next turn's prompt, whose prefill may read what is stored) and the choices do not change
 *    (rocketkv, rocketkv_mt, hsa, quest); SparQ, which reads every key's r dimensions, is caught by it;
 *  - RocketKV-MT: the same selections as rocketkv on one turn; readable() = every position, stored() = the
 *    device set; host bytes and the h2d/d2h of each turn's prefill; the bundled multi-turn trace
 *    (examples/stories260K_multiturn.kvt) replayed, later turns reading back from the host store;
 *  - ties (§1.4): identical keys make every page equal, and the oldest tokens win;
 *  - notes() for the degenerate settings and validate() messages.
 * Data: GENERATED Gaussian streams (tests/util/gen_trace.h) or hand-set keys, and the bundled real trace.
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

#include "../common/kvs_math.h"
#include "../policies/registry.h"
#include "../policies/rocketkv_internal.h"
#include "../sim/policy.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "../trace/trace.h"
#include "util/replay_fixture.h"
#include "util/sets.h"
#include "util/testenv.h"

typedef kvs_test_replay_fixture fixture;

/* n_turns > 1 splits the positions evenly (half prompt, half generated per turn); prompt_len (single turn,
 * -1 = half) sets the prompt. 2 layers, 2 KV heads, `group` query heads per KV head. */
static void fixture_make(fixture *f, int n_turns, int group, int n_pos, int prompt_len, int d, uint64_t seed) {
    kvs_gen_trace_opts o = kvs_test_grouped_opts(n_turns, group, n_pos, prompt_len, d, seed);
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 11, f), KVS_OK);
}

static kvs_policy_config parse(const char *spec) {
    kvs_policy_config cfg;
    if (kvs_policy_parse(spec, &cfg) != KVS_OK) fail_msg("%s: %s", spec, kvs_last_error());
    return cfg;
}

/* Agreement with a golden value given to `dp` decimals. */
static void assert_dp(double got, double want, int dp, const char *what) {
    if (!(fabs(got - want) <= 0.5 * pow(10.0, -dp) + 1e-12)) fail_msg("%s: got %.8f, want %.*f", what, got, dp, want);
}

/* ================================================================================================
 * G2 (POLICY_SPEC §7): the derivation
 * ============================================================================================== */

static void test_g2_c64_golden(void **state) {
    (void)state;
    double c = 64, r = kvs_rocketkv_split(c);
    assert_dp(r, 0.56, 4, "r");
    assert_dp(pow(c, r), 10.267, 3, "c^r");
    assert_dp(pow(c, 1 - r), 6.233, 3, "c^(1-r)");
    assert_dp(pow(c, (1 - r) / 2), 2.4967, 4, "c^((1-r)/2)");
    assert_int_equal((int)ceil(pow(c, (1 - r) / 2)), 3);                /* page size 3 (§3.6) */
    assert_dp(pow(c, 1 - r) / ceil(pow(c, (1 - r) / 2)), 2.078, 3, "head ratio");
    double st, mt, tr;
    kvs_rocketkv_table1(c, r, &st, &mt, &tr);
    assert_dp(1 / pow(c, r), 0.09740, 5, "KV term 1/c^r");
    assert_dp(2 / pow(c, (1 + r) / 2), 0.07802, 5, "page term 2/c^((1+r)/2)");
    assert_dp(st, 0.17542, 5, "Table 1 storage");
    assert_dp(mt, 1.07802, 5, "Table 1 RocketKV-MT storage");
    assert_true(tr == 0.015625);
    /* §3.6's rounded statement: 10.3x in stage 1, 6.2x in stage 2, 3x sequence, 2.1x head dimension */
    assert_dp(pow(c, r), 10.3, 1, "stage 1");
    assert_dp(pow(c, 1 - r), 6.2, 1, "stage 2");
    assert_dp(pow(c, 1 - r) / 3, 2.1, 1, "head dimension");
    /* the same through the policy's derivation (S = 64 t, Table row 6: the floor does not bind) */
    kvs_rocketkv_params p;
    kvs_rocketkv_derive(131072, 2048, 128, 128, -1, KVS_ROCKETKV_PIPELINE, &p);
    assert_true(p.c == 64 && p.r == r);
    assert_int_equal(p.page, 3);
    assert_dp(p.c2, 6.233, 3, "c2 = c^(1-r)");
    /* other c of R8: 16 -> 0.567, 256 -> 0.0420 (MT 1.019); the split saturates at 0.8 */
    kvs_rocketkv_table1(16, kvs_rocketkv_split(16), &st, NULL, NULL);
    assert_dp(st, 0.567, 3, "c = 16");
    kvs_rocketkv_table1(256, kvs_rocketkv_split(256), &st, &mt, NULL);
    assert_dp(st, 0.0420, 4, "c = 256");
    assert_dp(mt, 1.019, 3, "c = 256 MT");
    assert_true(kvs_rocketkv_split(1 << 20) == 0.8);
    assert_dp(kvs_rocketkv_split(1), 0.2, 12, "c = 1");
}

/* G2's pipeline derivation table, (S, t, max_new) -> cap, B_p, k2, c2, Ppg, k1 (pipeline, gpt-fast), d = 128. */
static void test_g2_derivation_table_row_by_row(void **state) {
    (void)state;
    const struct {
        int64_t S, t, max_new;
        double c, r;
        int64_t cap, bp, k2;
        double c2;
        int c2_dp;
        int64_t page, k1_pipe, k1_gpt;
    } rows[] = {
        {16384, 512, 128, 32, 0.50, 2896, 2768, 256, 5.656, 3, 3, 67, 68},
        {32768, 256, 128, 128, 0.62, 1618, 1490, 128, 6.320, 3, 3, 60, 61},
        {32768, 1024, 128, 32, 0.50, 5792, 5664, 512, 5.656, 3, 3, 67, 68},
        {109000, 256, 32, 425.8, 0.7240, 1360, 1328, 128, 5.3125, 4, 3, 72, 72},
        {8192, 4096, 128, 2, 0.26, 6841, 6713, 2048, 1.670, 3, 1, 76, 77},
        {131072, 2048, 128, 64, 0.56, 12765, 12637, 1024, 6.233, 3, 3, 61, 62},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        for (int rounding = 0; rounding < 2; rounding++) {
            kvs_rocketkv_params p;
            kvs_rocketkv_derive(rows[i].S, rows[i].t, rows[i].max_new, 128, -1, rounding, &p);
            char what[96];
            snprintf(what, sizeof what, "row %zu (%s)", i + 1, rounding ? "gptfast" : "pipeline");
            assert_dp(p.c, rows[i].c, rows[i].c == 425.8 ? 1 : 6, what);
            assert_dp(p.r, rows[i].r, 4, what);
            if (p.cap != rows[i].cap || p.prompt_budget != rows[i].bp || p.k2 != rows[i].k2 || p.page != rows[i].page)
                fail_msg("%s: cap %lld B_p %lld k2 %lld page %lld", what, (long long)p.cap, (long long)p.prompt_budget,
                         (long long)p.k2, (long long)p.page);
            assert_dp(p.c2, rows[i].c2, rows[i].c2_dp, what);
            int64_t k1 = rounding ? rows[i].k1_gpt : rows[i].k1_pipe;
            if (p.k1 != k1) fail_msg("%s: k1 %lld, want %lld", what, (long long)p.k1, (long long)k1);
        }
    }
    /* gpt-fast's own roundings: k2 = round(t/2) half to even and at most cap, B_p at most S - max_new */
    kvs_rocketkv_params p;
    kvs_rocketkv_derive(100, 11, 0, 8, 0, KVS_ROCKETKV_GPTFAST, &p);
    assert_int_equal(p.k2, 6); /* round(5.5) = 6 */
    kvs_rocketkv_derive(100, 13, 0, 8, 0, KVS_ROCKETKV_GPTFAST, &p);
    assert_int_equal(p.k2, 6); /* round(6.5) = 6 */
    kvs_rocketkv_derive(100, 13, 0, 8, 0, KVS_ROCKETKV_PIPELINE, &p);
    assert_int_equal(p.k2, 6);
    assert_int_equal(p.cap, 100); /* r = 0: cap = S */
}

/* G2's table of c -> r, c^r, c^(1-r), Ppg, k1 (d = 128), Table 1 storage (S = c t, nothing generated). */
static void test_g2_ratio_table(void **state) {
    (void)state;
    const struct {
        double c, r, cr, c1r;
        int64_t page, k1;
        double storage;
        int st_dp;
    } rows[] = {
        {2, 0.26, 1.20, 1.67, 1, 76, 2.127, 3},    {4, 0.32, 1.56, 2.57, 2, 99, 1.443, 3},
        {8, 0.38, 2.20, 3.63, 2, 70, 0.930, 3},    {16, 0.44, 3.39, 4.72, 3, 81, 0.567, 3},
        {32, 0.50, 5.66, 5.66, 3, 67, 0.325, 3},   {64, 0.56, 10.27, 6.23, 3, 61, 0.175, 3},
        {128, 0.62, 20.25, 6.32, 3, 60, 0.089, 3}, {256, 0.68, 43.41, 5.90, 3, 65, 0.042, 3},
        {1024, 0.80, 256, 4.0, 2, 64, 0.0078, 4},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        double c = rows[i].c, r = kvs_rocketkv_split(c), st;
        char what[64];
        snprintf(what, sizeof what, "c = %g", c);
        assert_dp(r, rows[i].r, 4, what);
        assert_dp(pow(c, r), rows[i].cr, 2, what);
        assert_dp(pow(c, 1 - r), rows[i].c1r, 2, what);
        kvs_rocketkv_params p;
        kvs_rocketkv_derive((int64_t)(c * 1024), 1024, 0, 128, -1, KVS_ROCKETKV_PIPELINE, &p);
        if (p.page != rows[i].page || p.k1 != rows[i].k1)
            fail_msg("%s: page %lld k1 %lld", what, (long long)p.page, (long long)p.k1);
        kvs_rocketkv_table1(c, r, &st, NULL, NULL);
        assert_dp(st, rows[i].storage, rows[i].st_dp, what);
    }
}

/* ================================================================================================
 * Recording selections; scrambling rows
 * ============================================================================================== */

typedef struct {
    const fixture *f;
    kvs_test_sets s;   /* the selections; cell = ((l*Hkv+h)*N + p)*G + list */
    int strict;        /* scramble every row but the current one after each decode step / prefill; restore at a
                        * turn's last decode step */
    int leak;          /* scramble, for good, every row the policy may not read (readable(), else stored()), as
                        * tests/test_policy_conformance.c does */
    uint64_t rng;
    /* stored() and readable() counts after each call, per (l, h, p) */
    int64_t *stored, *readable;
} recorder;

static size_t cell(const fixture *f, int l, int h, int64_t p, int li) {
    return (((size_t)l * (size_t)f->Hkv + (size_t)h) * (size_t)f->N + (size_t)p) * (size_t)f->G + (size_t)li;
}

static void rec_init(recorder *r, const fixture *f) {
    memset(r, 0, sizeof *r);
    r->f = f;
    size_t cells = (size_t)f->L * (size_t)f->Hkv * (size_t)f->N * (size_t)f->G;
    assert_int_equal(kvs_test_sets_init(&r->s, cells, f->N), KVS_OK);
    r->stored = malloc(cells * sizeof *r->stored);
    r->readable = malloc(cells * sizeof *r->readable);
    assert_non_null(r->stored);
    assert_non_null(r->readable);
    for (size_t c = 0; c < cells; c++) r->stored[c] = r->readable[c] = -1;
    r->rng = 0x2545F4914F6CDD1Dull;
}

static void rec_free(recorder *r) {
    kvs_test_sets_free(&r->s);
    free(r->stored);
    free(r->readable);
}

static void put(recorder *r, int l, int h, int64_t p, int li, const int32_t *idx, int64_t n) {
    kvs_test_sets_put(&r->s, cell(r->f, l, h, p, li), idx, n);
}

static void on_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    (void)config;
    for (int li = 0; li < sel->n_lists; li++) put(user, layer, kv_head, pos, li, sel->idx[li], sel->n[li]);
}

static int last_decode_of_turn(const fixture *f, int64_t p) {
    for (int64_t t = 0; t < f->n_turns; t++)
        if (p == f->turns[t].end - 1 && f->turns[t].end > f->turns[t].prompt_end) return 1;
    return 0;
}

static void on_step_end(void *user, int config, int layer, int kv_head, int64_t pos, void *state,
                        const struct kvs_policy_ops *ops, float *k, float *v, int64_t n) {
    (void)config;
    recorder *r = user;
    const fixture *f = r->f;
    int32_t *buf = malloc((size_t)f->N * sizeof *buf);
    assert_non_null(buf);
    if (ops->stored) r->stored[cell(f, layer, kv_head, pos, 0)] = ops->stored(state, 0, buf);
    if (ops->readable) r->readable[cell(f, layer, kv_head, pos, 0)] = ops->readable(state, 0, buf);
    size_t d = (size_t)f->d;
    if (r->leak) {
        char *keep = calloc((size_t)n, 1);
        assert_non_null(keep);
        int64_t m = ops->readable ? ops->readable(state, 0, buf) : ops->stored(state, 0, buf);
        for (int64_t j = 0; j < m; j++) keep[buf[j]] = 1;
        for (int64_t j = 0; j < n; j++)
            for (size_t i = 0; !keep[j] && i < d; i++) {
                r->rng = r->rng * 6364136223846793005ull + 1442695040888963407ull;
                k[(size_t)j * d + i] = ((float)(r->rng >> 40) / (float)(1u << 24) - 0.5f) * 1000.0f;
                v[(size_t)j * d + i] = -k[(size_t)j * d + i];
            }
        free(keep);
    }
    free(buf);
    if (!r->strict) return;
    for (int64_t j = 0; j < n; j++) {
        float *kr = k + (size_t)j * d, *vr = v + (size_t)j * d;
        if (last_decode_of_turn(f, pos)) { /* the next call is a prefill: it may read what is stored */
            size_t o = (((size_t)layer * (size_t)f->N + (size_t)j) * (size_t)f->Hkv + (size_t)kv_head) * d;
            memcpy(kr, f->g->k + o, d * sizeof *kr);
            memcpy(vr, f->g->v + o, d * sizeof *vr);
            continue;
        }
        for (size_t i = 0; i < d; i++) {
            r->rng = r->rng * 6364136223846793005ull + 1442695040888963407ull;
            float x = ((float)(r->rng >> 40) / (float)(1u << 24) - 0.5f) * 1000.0f;
            kr[i] = x;
            vr[i] = -x;
        }
    }
}

static kvs_replay_result *run_engine(const fixture *f, const char *spec, int64_t budget, recorder *rec, int series) {
    kvs_replay_config cfg = {.policy = parse(spec), .budget = budget, .budget_fraction = -1};
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, &src), KVS_OK);
    kvs_replay_hooks hooks = {.user = rec, .on_select = on_select, .on_step_end = on_step_end};
    kvs_replay_opts o = {.configs = &cfg, .n_configs = 1, .threads = 2, .measure = KVS_MEASURE_DECODE,
                         .series_every = series, .hooks = rec ? &hooks : NULL};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
    if (r->runs[0].status != KVS_OK) fail_msg("%s: %s", spec, r->runs[0].error);
    return r;
}

/* Selections equal in a and b at every recorded cell; returns how many were compared. */
static int64_t compare(const recorder *a, const recorder *b, const char *what) {
    const fixture *f = a->f;
    int64_t compared = 0, c = kvs_test_sets_diff(&a->s, &b->s, &compared);
    if (c >= 0) {
        size_t pc = (size_t)c / (size_t)f->G;
        fail_msg("%s: selection differs at layer %zu kv head %zu position %zu list %zu (%lld vs %lld entries)", what,
                 pc / (size_t)f->N / (size_t)f->Hkv, pc / (size_t)f->N % (size_t)f->Hkv, pc % (size_t)f->N,
                 (size_t)c % (size_t)f->G, (long long)a->s.n[c], (long long)b->s.n[c]);
    }
    return compared;
}

/* ================================================================================================
 * The naive reference (POLICY_SPEC §2.2 stage 1 and stage 2, written from the spec, double precision)
 * ============================================================================================== */

enum { N_ROCKET = 0, N_HSA = 1, N_MT = 2 };

typedef struct {
    int mode, window, kernel, rounding;
    double r;        /* < 0 adaptive */
    int64_t max_new; /* 0 = the model's */
} naive_cfg;

static const float *nq(const fixture *f, int l, int64_t p, int qh) {
    return f->g->q + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)f->H + (size_t)qh) * (size_t)f->d;
}
static const float *nk(const fixture *f, int l, int64_t p, int h) {
    return f->g->k + (((size_t)l * (size_t)f->N + (size_t)p) * (size_t)f->Hkv + (size_t)h) * (size_t)f->d;
}

/* Takes and returns the index of the largest x[i] among i < n with !taken[i], ties to the lower index. */
static int64_t take_best(const double *x, char *taken, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || x[i] > x[best])) best = i;
    if (best < 0) fail_msg("nothing left to take");
    taken[best] = 1;
    return best;
}

static void naive_rocketkv(const fixture *f, const naive_cfg *c, int64_t B, recorder *out) {
    int64_t N = f->N, G = f->G, d = f->d;
    int64_t max_new = c->max_new > 0 ? c->max_new : f->mem.model.max_new_tokens;
    char *dev = malloc((size_t)N), *taken = malloc((size_t)N), *dsel = malloc((size_t)d);
    int32_t *cand = malloc((size_t)N * sizeof *cand), *list = malloc((size_t)N * sizeof *list);
    double *score = malloc((size_t)N * sizeof *score), *pooled = malloc((size_t)N * sizeof *pooled);
    double *tot = malloc((size_t)N * sizeof *tot), *est = malloc((size_t)N * sizeof *est), *z = malloc((size_t)N * sizeof *z);
    double *kmin = malloc((size_t)N * (size_t)d * sizeof *kmin), *kmax = malloc((size_t)N * (size_t)d * sizeof *kmax);
    double *a = malloc((size_t)d * sizeof *a), *qs = malloc((size_t)d * sizeof *qs);
    int32_t *kept = malloc((size_t)N * sizeof *kept);
    for (int l = 0; l < f->L; l++)
        for (int h = 0; h < f->Hkv; h++) {
            memset(dev, 0, (size_t)N);
            for (int64_t t = 0; t < f->n_turns; t++) {
                const kvs_turn *tu = &f->turns[t];
                int64_t n = tu->prompt_end, first = tu->begin;
                if (n <= first) continue;
                int64_t S = n + max_new;
                kvs_rocketkv_params p;
                kvs_rocketkv_derive(S, B, max_new, (int32_t)d, c->mode == N_HSA ? 0.0 : c->r, c->rounding, &p);
                int64_t k2 = p.k2 < 1 ? 1 : p.k2, k1 = p.k1 < 1 ? 1 : (p.k1 > d ? d : p.k1);
                int64_t bp = p.prompt_budget < 1 ? 1 : p.prompt_budget, P = p.page;
                /* stage 1 */
                int64_t nc = 0;
                for (int64_t j = 0; j < n; j++)
                    if (c->mode != N_ROCKET || dev[j] || j >= first) cand[nc++] = (int32_t)j;
                memset(dev, 0, (size_t)N);
                int64_t nk_ = 0;
                if (c->mode == N_HSA || nc <= bp) {
                    for (int64_t j = 0; j < nc; j++) kept[nk_++] = cand[j];
                } else {
                    int64_t w = c->window < n - first ? c->window : n - first;
                    if (bp <= w) {
                        for (int64_t j = nc - bp; j < nc; j++) kept[nk_++] = cand[j];
                    } else {
                        int64_t m = nc - w;
                        for (int64_t j = 0; j < m; j++) score[j] = 0;
                        for (int64_t qi = n - w; qi < n; qi++)
                            for (int64_t g = 0; g < G; g++) {
                                const float *q = nq(f, l, qi, (int)(h * G + g));
                                double mx = -INFINITY, sum = 0;
                                int64_t vis = 0;
                                while (vis < nc && cand[vis] <= qi) vis++;
                                for (int64_t j = 0; j < vis; j++) {
                                    const float *k = nk(f, l, cand[j], h);
                                    double s = 0;
                                    for (int64_t i = 0; i < d; i++) s += (double)q[i] * (double)k[i];
                                    z[j] = s * (double)f->scale;
                                    if (z[j] > mx) mx = z[j];
                                }
                                for (int64_t j = 0; j < vis; j++) sum += exp(z[j] - mx);
                                for (int64_t j = 0; j < vis && j < m; j++) score[j] += exp(z[j] - mx) / sum;
                            }
                        int64_t half = c->kernel / 2;
                        for (int64_t j = 0; j < m; j++) {
                            pooled[j] = -INFINITY;
                            for (int64_t o = j - half; o <= j + half; o++)
                                if (o >= 0 && o < m && score[o] > pooled[j]) pooled[j] = score[o];
                        }
                        memset(taken, 0, (size_t)N);
                        for (int64_t k = 0; k < bp - w; k++) take_best(pooled, taken, m);
                        for (int64_t j = 0; j < m; j++)
                            if (taken[j]) kept[nk_++] = cand[j];
                        for (int64_t j = m; j < nc; j++) kept[nk_++] = cand[j];
                    }
                }
                for (int64_t j = 0; j < nk_; j++) dev[kept[j]] = 1;
                /* stage 2 */
                for (int64_t pp = tu->prompt_end; pp < tu->end; pp++) {
                    dev[pp] = 1;
                    int64_t np = 0;
                    for (int64_t j = 0; j <= pp; j++)
                        if (dev[j]) list[np++] = (int32_t)j;
                    if (np <= k2) {
                        put(out, l, h, pp, 0, list, np);
                        continue;
                    }
                    for (int64_t s = 0; s < np; s++) { /* page min/max straight from the keys */
                        const float *k = nk(f, l, list[s], h);
                        double *mn = kmin + (size_t)(s / P) * (size_t)d, *mx = kmax + (size_t)(s / P) * (size_t)d;
                        for (int64_t i = 0; i < d; i++) {
                            if (s % P == 0 || k[i] < mn[i]) mn[i] = k[i];
                            if (s % P == 0 || k[i] > mx[i]) mx[i] = k[i];
                        }
                    }
                    for (int64_t i = 0; i < d; i++) {
                        a[i] = qs[i] = 0;
                        for (int64_t g = 0; g < G; g++) {
                            a[i] += fabs((double)nq(f, l, pp, (int)(h * G + g))[i]);
                            qs[i] += (double)nq(f, l, pp, (int)(h * G + g))[i];
                        }
                    }
                    memset(taken, 0, (size_t)N);
                    for (int64_t k = 0; k < k1; k++) take_best(a, taken, d);
                    for (int64_t i = 0; i < d; i++) dsel[i] = taken[i];
                    for (int64_t s = 0; s < np; s++) tot[s] = 0;
                    for (int64_t g = 0; g < G; g++) {
                        const float *q = nq(f, l, pp, (int)(h * G + g));
                        double part = 0, all = 0, m = -INFINITY, sum = 0;
                        for (int64_t i = 0; i < d; i++) {
                            all += fabs((double)q[i]);
                            if (dsel[i]) part += fabs((double)q[i]);
                        }
                        double tau = all > 0 ? sqrt((double)d * part / all) : 1.0;
                        for (int64_t s = 0; s < np; s++) {
                            const double *mn = kmin + (size_t)(s / P) * (size_t)d, *mx = kmax + (size_t)(s / P) * (size_t)d;
                            double e = 0;
                            for (int64_t i = 0; i < d; i++)
                                if (dsel[i]) e += (double)q[i] * (qs[i] >= 0 ? mx[i] : mn[i]);
                            est[s] = e / tau;
                            if (est[s] > m) m = est[s];
                        }
                        for (int64_t s = 0; s < np; s++) sum += exp(est[s] - m);
                        for (int64_t s = 0; s < np; s++) tot[s] += exp(est[s] - m) / sum;
                    }
                    memset(taken, 0, (size_t)N);
                    int64_t m = 0;
                    for (int64_t k = 0; k < k2; k++) {
                        kept[m++] = list[take_best(tot, taken, np)];
                    }
                    put(out, l, h, pp, 0, kept, m);
                }
            }
        }
    free(dev);
    free(taken);
    free(dsel);
    free(cand);
    free(list);
    free(score);
    free(pooled);
    free(tot);
    free(est);
    free(z);
    free(kmin);
    free(kmax);
    free(a);
    free(qs);
    free(kept);
}

static void test_matches_naive_reference(void **state) {
    (void)state;
    const struct {
        int turns, group, n_pos, prompt, d;
        const char *spec;
        int64_t B;
        naive_cfg c;
    } cases[] = {
        {1, 2, 96, 80, 16, "rocketkv:kernel=5", 16, {N_ROCKET, 32, 5, 0, -1, 0}},
        {1, 2, 96, 80, 16, "rocketkv", 16, {N_ROCKET, 32, 63, 0, -1, 0}}, /* the kernel covers the prefix */
        {1, 1, 96, 80, 8, "rocketkv:kernel=3,window=8", 12, {N_ROCKET, 8, 3, 0, -1, 0}}, /* MHA */
        {1, 3, 96, 80, 16, "rocketkv:kernel=7,window=8,rounding=gptfast", 11, {N_ROCKET, 8, 7, 1, -1, 0}},
        {1, 2, 96, 80, 16, "rocketkv:kernel=5,window=8,r=0.7", 16, {N_ROCKET, 8, 5, 0, 0.7, 0}},
        {1, 2, 96, 80, 16, "rocketkv@static-r0.3:kernel=5,window=6", 20, {N_ROCKET, 6, 5, 0, 0.3, 0}},
        {1, 2, 96, 80, 16, "rocketkv:kernel=5", 4, {N_ROCKET, 32, 5, 0, -1, 0}},  /* B_p <= window */
        {1, 2, 96, 80, 16, "rocketkv:kernel=5,window=4", 1, {N_ROCKET, 4, 5, 0, -1, 0}}, /* k2 raised to 1 */
        {2, 2, 128, -1, 16, "rocketkv:kernel=5,window=8,max_new=8", 16, {N_ROCKET, 8, 5, 0, -1, 8}},
        {2, 4, 128, -1, 8, "rocketkv:kernel=9,window=4,max_new=4,rounding=gptfast", 9, {N_ROCKET, 4, 9, 1, -1, 4}},
        {2, 2, 128, -1, 16, "rocketkv_mt:kernel=5,window=8,max_new=8", 16, {N_MT, 8, 5, 0, -1, 8}},
        {2, 4, 128, -1, 8, "rocketkv_mt:kernel=9,window=4,max_new=4,rounding=gptfast", 9, {N_MT, 4, 9, 1, -1, 4}},
        {1, 2, 96, 80, 16, "rocketkv_mt:kernel=5", 16, {N_MT, 32, 5, 0, -1, 0}},
        {1, 2, 96, 80, 16, "hsa", 16, {N_HSA, 0, 1, 0, 0, 0}},
        {1, 2, 96, 80, 16, "hsa", 40, {N_HSA, 0, 1, 0, 0, 0}},
        {1, 1, 96, 40, 8, "hsa", 6, {N_HSA, 0, 1, 0, 0, 0}},
        {2, 3, 128, -1, 16, "hsa:rounding=gptfast", 12, {N_HSA, 0, 1, 1, 0, 0}},
        {2, 2, 128, -1, 16, "hsa:max_new=8", 24, {N_HSA, 0, 1, 0, 0, 8}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fixture f;
        fixture_make(&f, cases[c].turns, cases[c].group, cases[c].n_pos, cases[c].prompt, cases[c].d, 700 + c);
        recorder eng, ref;
        rec_init(&eng, &f);
        rec_init(&ref, &f);
        kvs_replay_result *r = run_engine(&f, cases[c].spec, cases[c].B, &eng, 0);
        naive_rocketkv(&f, &cases[c].c, cases[c].B, &ref);
        char what[160];
        snprintf(what, sizeof what, "%s at budget %lld", cases[c].spec, (long long)cases[c].B);
        assert_true(compare(&eng, &ref, what) > 0);
        kvs_replay_result_free(r);
        rec_free(&eng);
        rec_free(&ref);
        kvs_test_replay_fixture_free(&f);
    }
}

/* Stage 1 does evict in the cases above (else the naive comparison would test HSA only): the device set after
 * the prompt is B_p, smaller than the prompt. */
static void test_stage1_evicts_to_the_prompt_budget(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 2, 96, 80, 16, 11);
    recorder rec;
    rec_init(&rec, &f);
    kvs_replay_result *r = run_engine(&f, "rocketkv:kernel=5", 16, &rec, 0);
    kvs_rocketkv_params p;
    kvs_rocketkv_derive(96, 16, 16, 16, -1, KVS_ROCKETKV_PIPELINE, &p);
    assert_true(p.prompt_budget < 80 && p.prompt_budget > 32);
    for (int l = 0; l < f.L; l++)
        for (int h = 0; h < f.Hkv; h++) {
            assert_int_equal(rec.stored[cell(&f, l, h, 79, 0)], p.prompt_budget);
            assert_int_equal(rec.stored[cell(&f, l, h, 95, 0)], p.prompt_budget + 16); /* + every generated */
            assert_true(rec.stored[cell(&f, l, h, 95, 0)] <= p.cap);
            assert_int_equal(rec.readable[cell(&f, l, h, 95, 0)], p.prompt_budget + 16); /* readable = stored */
            for (int64_t pp = 80; pp < 96; pp++) assert_int_equal(rec.s.n[cell(&f, l, h, pp, 0)], p.k2);
        }
    kvs_replay_result_free(r);
    rec_free(&rec);
    kvs_test_replay_fixture_free(&f);
}

/* ================================================================================================
 * What decode reads
 * ============================================================================================== */

/* Between decode steps every row but the current one is scrambled (restored before a later turn's prompt):
 * HSA and Quest read nothing but their page summaries and the current key, so the choices are the same. */
static void test_decode_reads_no_key_but_the_current(void **state) {
    (void)state;
    const char *specs[] = {"rocketkv:kernel=5,window=8,max_new=8", "rocketkv_mt:kernel=5,window=8,max_new=8", "hsa",
                           "hsa:rounding=gptfast", "rocketkv", "quest:page=4", "quest:page=3,gqa=head",
                           "quest:page=0,split=attend"};
    for (int turns = 1; turns <= 2; turns++) {
        fixture f;
        fixture_make(&f, turns, 2, 128, turns == 1 ? 100 : -1, 16, 40 + turns);
        for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
            recorder a, b;
            rec_init(&a, &f);
            rec_init(&b, &f);
            b.strict = 1;
            kvs_replay_result *ra = run_engine(&f, specs[i], 16, &a, 0);
            kvs_replay_result *rb = run_engine(&f, specs[i], 16, &b, 0);
            assert_true(compare(&a, &b, specs[i]) > 0);
            kvs_replay_result_free(ra);
            kvs_replay_result_free(rb);
            rec_free(&a);
            rec_free(&b);
        }
        /* the check bites: SparQ reads r dimensions of every key, so scrambled keys change its choices */
        recorder a, b;
        rec_init(&a, &f);
        rec_init(&b, &f);
        b.strict = 1;
        kvs_replay_result *ra = run_engine(&f, "sparq", 16, &a, 0);
        kvs_replay_result *rb = run_engine(&f, "sparq", 16, &b, 0);
        int differ = 0;
        for (size_t c = 0; c < (size_t)f.L * (size_t)f.Hkv * (size_t)f.N * (size_t)f.G && !differ; c++)
            differ = a.s.n[c] > 0 && memcmp(kvs_test_sets_get(&a.s, c), kvs_test_sets_get(&b.s, c), (size_t)a.s.n[c] * sizeof(int32_t));
        assert_true(differ);
        kvs_replay_result_free(ra);
        kvs_replay_result_free(rb);
        rec_free(&a);
        rec_free(&b);
        kvs_test_replay_fixture_free(&f);
    }
}

/* The conformance leak check on configurations whose stage 1 evicts (the registry defaults do not on the
 * conformance fixture: the cap floor keeps its prompts): rows neither stored nor readable are scrambled for good
 * after every prefill and step, and a later turn's stage 1 must not need them. */
static void test_reads_only_what_it_may_read(void **state) {
    (void)state;
    const char *specs[] = {"rocketkv:kernel=5,window=8,max_new=8", "rocketkv:window=4,max_new=4",
                           "rocketkv_mt:kernel=5,window=8,max_new=8", "rocketkv:kernel=3,window=2,max_new=8,r=0.8"};
    fixture f;
    fixture_make(&f, 2, 3, 128, -1, 8, 15);
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        recorder a, b;
        rec_init(&a, &f);
        rec_init(&b, &f);
        b.leak = 1;
        kvs_replay_result *ra = run_engine(&f, specs[i], 12, &a, 0);
        kvs_replay_result *rb = run_engine(&f, specs[i], 12, &b, 0);
        assert_true(compare(&a, &b, specs[i]) > 0);
        /* stage 1 did evict: fewer positions stored than seen at the end of each turn */
        for (int64_t t = 0; t < f.n_turns; t++) assert_true(a.stored[cell(&f, 0, 0, f.turns[t].end - 1, 0)] < f.turns[t].end);
        kvs_replay_result_free(ra);
        kvs_replay_result_free(rb);
        rec_free(&a);
        rec_free(&b);
    }
    kvs_test_replay_fixture_free(&f);
}

/* ================================================================================================
 * RocketKV-MT
 * ============================================================================================== */

static void test_mt_selects_as_rocketkv_on_one_turn(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 2, 96, 80, 16, 12);
    const char *pairs[][2] = {{"rocketkv:kernel=5", "rocketkv_mt:kernel=5"},
                              {"rocketkv@scbench:window=16", "rocketkv_mt@scbench:window=16"}};
    for (size_t i = 0; i < 2; i++) {
        recorder a, b;
        rec_init(&a, &f);
        rec_init(&b, &f);
        kvs_replay_result *ra = run_engine(&f, pairs[i][0], 16, &a, 0);
        kvs_replay_result *rb = run_engine(&f, pairs[i][1], 16, &b, 0);
        assert_true(compare(&a, &b, pairs[i][1]) > 0);
        /* same device set, but MT may read every position */
        for (int l = 0; l < f.L; l++)
            for (int h = 0; h < f.Hkv; h++) {
                assert_int_equal(a.stored[cell(&f, l, h, 95, 0)], b.stored[cell(&f, l, h, 95, 0)]);
                assert_int_equal(b.readable[cell(&f, l, h, 95, 0)], 96);
                assert_int_equal(b.readable[cell(&f, l, h, 79, 0)], 80);
            }
        kvs_replay_result_free(ra);
        kvs_replay_result_free(rb);
        rec_free(&a);
        rec_free(&b);
    }
    kvs_test_replay_fixture_free(&f);
}

/* The series sample of (layer 0, query head 0) at position p. */
static const kvs_results_step *step_at(const kvs_replay_result *r, int layer, int q_head, int64_t p) {
    for (int64_t s = 0; s < r->runs[0].n_steps; s++) {
        const kvs_results_step *x = &r->runs[0].steps[s];
        if (x->layer == layer && x->q_head == q_head && x->position == p) return x;
    }
    fail_msg("no series sample at layer %d q head %d position %lld", layer, q_head, (long long)p);
    return NULL;
}

/* Host bytes = the positions seen but not on the device; each turn's prefill moves to the device the selected
 * positions that were on the host (h2d) and to the host the device positions it left (d2h), charged at the
 * turn's first decode step; nothing moves at the other steps. rocketkv has no host store. */
static void test_mt_host_store_and_transfers(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 2, 128, -1, 16, 13);
    recorder rec;
    rec_init(&rec, &f);
    kvs_replay_result *r = run_engine(&f, "rocketkv_mt:kernel=5,window=8,max_new=8", 16, &rec, 1);
    double slot = 2.0 * f.d * 2; /* K/V bytes of one position (kv_bytes 2) */
    int64_t total_h2d = 0;
    for (int l = 0; l < f.L; l++)
        for (int h = 0; h < f.Hkv; h++) {
            int64_t prev_dev = 0; /* device count after the previous turn's last step */
            for (int64_t t = 0; t < f.n_turns; t++) {
                const kvs_turn *tu = &f.turns[t];
                int64_t after = rec.stored[cell(&f, l, h, tu->prompt_end - 1, 0)]; /* after the prefill */
                for (int64_t p = tu->prompt_end; p < tu->end; p++) {
                    const kvs_results_step *s = step_at(r, l, h * f.G, p);
                    int64_t dev = rec.stored[cell(&f, l, h, p, 0)];
                    assert_true(s->storage_host_bytes == slot * (double)(p + 1 - dev));
                    assert_true(s->storage_kv_bytes == slot * (double)dev);
                    if (p > tu->prompt_end) {
                        assert_true(s->h2d_bytes == 0 && s->d2h_bytes == 0);
                        continue;
                    }
                    /* d2h - h2d = what left the device net: before (prev_dev + the new prompt) minus after */
                    int64_t new_prompt = tu->prompt_end - tu->begin;
                    double net = s->d2h_bytes - s->h2d_bytes;
                    assert_true(net == slot * (double)(prev_dev + new_prompt - after));
                    if (t == 0) assert_true(s->h2d_bytes == 0);
                    total_h2d += (int64_t)(s->h2d_bytes / slot);
                }
                prev_dev = rec.stored[cell(&f, l, h, tu->end - 1, 0)];
            }
        }
    assert_true(total_h2d > 0); /* a later turn brought back positions an earlier one left on the host */
    kvs_replay_result_free(r);
    rec_free(&rec);
    /* rocketkv: no host store, nothing moves */
    rec_init(&rec, &f);
    r = run_engine(&f, "rocketkv:kernel=5,window=8,max_new=8", 16, &rec, 0);
    assert_true(r->runs[0].run_agg.storage_host_bytes.max == 0 && r->runs[0].run_agg.transfer_bytes.max == 0);
    kvs_replay_result_free(r);
    rec_free(&rec);
    kvs_test_replay_fixture_free(&f);
}

/* ================================================================================================
 * Table 1 from the replay's accounting (c = 64)
 * ============================================================================================== */

/* One KV head (G = 2, d = 64), S = 512 positions (496 prompt + 16 generated), t = 8: c = 64. The last step
 * (n = S) is where the paper's Table 1 holds: K-normalised storage = KV/full + aux/(full K), traffic = reads /
 * full KV. */
static void test_table1_reproduced_by_the_accounting(void **state) {
    (void)state;
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_layers = 1;
    o.n_kv_heads = 1;
    o.n_heads = 2;
    o.head_dim = 64;
    o.n_positions = 512;
    o.prompt_len = 496;
    o.seed = 64;
    fixture f;
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 64, &f), KVS_OK);
    const double d = 64, n = 512, kb = 2, full = 2 * d * n * kb, fullK = d * n * kb;
    const double c = 64, r = kvs_rocketkv_split(c);
    double t1_st, t1_mt, t1_tr;
    kvs_rocketkv_table1(c, r, &t1_st, &t1_mt, &t1_tr);
    kvs_rocketkv_params p;
    kvs_rocketkv_derive(512, 8, 16, 64, -1, KVS_ROCKETKV_PIPELINE, &p);
    assert_int_equal(p.cap, 49); /* floor(512 / 64^0.56); the floor min(32, 512) does not bind */
    assert_int_equal(p.prompt_budget, 33);
    assert_int_equal(p.page, 3);
    assert_int_equal(p.k1, 31);
    assert_int_equal(p.k2, 4);
    const char *specs[] = {"rocketkv", "rocketkv_mt", "hsa", "quest:page=0", "sparq:gqa=group", "full"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kvs_replay_result *res = run_engine(&f, specs[i], 8, NULL, 1);
        const kvs_results_step *s = step_at(res, 0, 0, 511);
        double kv = s->storage_kv_bytes / full, host = s->storage_host_bytes / full, aux = s->storage_aux_bytes / fullK;
        double reads = (s->traffic_kv_bytes + s->traffic_aux_bytes) / full;
        double st_k = kv + host + aux, st_kv = kv + host + aux / 2; /* aux_norm = K | KV (POLICY_SPEC §2.2) */
        print_message("  %-16s storage %.5f (K-normalised; %.5f over K+V)  traffic %.6f  (Table 1: %s)\n", specs[i], st_k,
                      st_kv, reads,
                      i == 0 ? "0.17542, 1/64" : i == 1 ? "1.07802, 1/64" : i == 3 ? "1 + 1/c, 1/64" : i == 4 ? "2, 1/64" : "");
        if (i <= 1) { /* RocketKV, RocketKV-MT: cap = 49 resident, 17 pages of 3, k1 = 31 of 64 dims, k2 = 4 */
            assert_true(kv == 49.0 / 512);
            assert_true(aux == 2.0 * 17 / 512);
            assert_true(host == (i == 1 ? (512.0 - 49) / 512 : 0));
            /* the paper's terms, unrounded: 1/c^r vs cap/S (floor), 2/c^((1+r)/2) vs 2 ceil(cap/3)/S (page 3 >= 2.497) */
            assert_true(fabs(kv - 1 / pow(c, r)) < 1.0 / 512);
            assert_true(aux <= 2 / pow(c, (1 + r) / 2) && aux >= 2 / pow(c, (1 + r) / 2) * 2.4967 / 3 - 1.0 / 512);
            if (i == 0) assert_true(fabs(st_k - t1_st) < 0.015);
            else assert_true(kv + host == 1.0 && fabs(st_k - t1_mt) < 0.015);
            /* traffic: k2 attended + the estimate, k1 elements of each page (slot 48 opens a page: no RMW read) */
            assert_true(s->traffic_kv_bytes == 4 * 2 * d * kb);
            assert_true(s->traffic_aux_bytes == 31.0 * 17 * kb);
            assert_true(fabs(reads - t1_tr) / t1_tr < 0.03);
        } else if (i == 2) { /* HSA: r = 0, cap = S, page ceil(8) = 8, k1 = 8: Table 1's formula with r = 0 exactly */
            assert_true(kv == 1.0 && aux == 2.0 * 64 / 512);
            assert_true(st_k == 1 + 2 / pow(c, 0.5));
            assert_true(s->traffic_aux_bytes == 8.0 * 64 * kb + 2 * d * kb); /* + the last page's min/max RMW */
            assert_true(reads - 2 * d * kb / full == t1_tr);
        } else if (i == 3) { /* Quest, even split: page ceil(2c) = 128, 4 pages, 4 tokens attended */
            assert_true(kv == 1.0 && st_k == 1 + 1 / c);
            assert_true(s->traffic_aux_bytes == 2 * d * 4 * kb + 2 * d * kb); /* + the RMW of page 3 */
            assert_true(reads - 2 * d * kb / full == t1_tr);
        } else if (i == 4) { /* SparQ, even split: r = t d / S = 1 dimension of 512 keys, 4 tokens */
            assert_true(kv == 1.0 && st_k == 2.0);
            assert_true(reads == t1_tr);
        } else {
            assert_true(st_k == 1.0 && reads == 1.0);
        }
        kvs_replay_result_free(res);
    }
    kvs_test_replay_fixture_free(&f);
}

/* ================================================================================================
 * Ties, notes, validation
 * ============================================================================================== */

/* Identical keys: every page has the same estimate, so the k2 oldest resident tokens are attended (§1.4; Quest with
 * fill=tokens, its exact-k fill: its default fill=pages attends whole pages with the current one). */
static void test_equal_keys_keep_the_oldest(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 2, 64, 48, 8, 14);
    size_t d = (size_t)f.d;
    for (size_t r = 0; r < (size_t)f.L * (size_t)f.N * (size_t)f.Hkv; r++) memcpy(f.g->k + r * d, f.g->k, d * sizeof(float));
    const char *specs[] = {"hsa", "rocketkv:kernel=5,window=4", "quest:page=4,fill=tokens",
                           "quest:page=5,gqa=head,fill=tokens"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        recorder rec;
        rec_init(&rec, &f);
        kvs_replay_result *r = run_engine(&f, specs[i], 10, &rec, 0);
        for (int l = 0; l < f.L; l++)
            for (int h = 0; h < f.Hkv; h++)
                for (int64_t p = 48; p < 64; p++) {
                    size_t c = cell(&f, l, h, p, 0);
                    assert_int_equal(rec.s.n[c], 5);
                    for (int j = 0; j < 5; j++) assert_int_equal(kvs_test_sets_get(&rec.s, c)[j], j);
                }
        kvs_replay_result_free(r);
        rec_free(&rec);
    }
    kvs_test_replay_fixture_free(&f);
}

static int notes_of(const char *spec, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    kvs_policy_config cfg = parse(spec);
    buf[0] = 0;
    return cfg.ops->notes ? cfg.ops->notes(&cfg, m, budget, buf, cap) : 0;
}

static void test_notes_and_validation(void **state) {
    (void)state;
    char buf[2048];
    /* the bundled stories260K trace: 239 prompt + 256 generated, context 512 */
    kvs_policy_model m = {.n_layers = 5, .n_heads = 8, .n_kv_heads = 4, .group = 2, .head_dim = 8, .scale = 0.35f,
                          .kv_bytes = 2, .aux_bytes = 4, .n_positions = 495, .prompt_len = 239, .max_new_tokens = 256,
                          .max_seq_len = 512};
    assert_true(notes_of("rocketkv", &m, 32, buf, sizeof buf) >= 1);
    assert_non_null(strstr(buf, "stage 1 keeps the whole 239-position first prompt (prompt budget B_p=239 = cap 495 - "
                                "max_new 256, cap raised to the floor min(2 max_new, S)): rocketkv is HSA alone on it"));
    assert_true(notes_of("rocketkv:max_new=16", &m, 32, buf, sizeof buf) == 0); /* S = 255: stage 1 evicts */
    assert_true(notes_of("rocketkv:max_new=16", &m, 8, buf, sizeof buf) >= 1);
    assert_non_null(strstr(buf, "<= observation window 32: stage 1 keeps the prompt's last B_p positions (a window)"));
    kvs_policy_model m30 = m; /* a 30-position prompt, 4 generated: the scored prefix is 26 positions */
    m30.prompt_len = 30;
    m30.max_new_tokens = 4;
    assert_true(notes_of("rocketkv:window=4", &m30, 8, buf, sizeof buf) == 1);
    assert_string_equal(buf, "kernel=63 covers the whole 26-position scored prefix: every pooled score is the maximum, "
                             "stage 1 keeps the oldest positions");
    assert_true(notes_of("rocketkv:window=4,kernel=5", &m30, 8, buf, sizeof buf) == 0);
    assert_true(notes_of("hsa", &m, 495, buf, sizeof buf) >= 1);
    assert_non_null(strstr(buf, "budget t=495 >= S=495: c = 1, no compression asked; still only k2=247 tokens are attended"));
    assert_true(notes_of("hsa", &m, 1, buf, sizeof buf) >= 1);
    assert_non_null(strstr(buf, "budget 1: k2 = 0 attended tokens raised to 1"));
    assert_true(notes_of("hsa", &m, 300, buf, sizeof buf) >= 1);
    assert_non_null(strstr(buf, "page size 1 (c2=1.65): the estimate reads k1=4 of 8 dimensions"));
    assert_true(notes_of("hsa", &m, 64, buf, sizeof buf) == 0);
    kvs_policy_model m0 = m;
    m0.max_new_tokens = 0;
    assert_true(notes_of("rocketkv_mt", &m0, 32, buf, sizeof buf) >= 1);
    assert_non_null(strstr(buf, "max_new_tokens unknown (trace and max_new=0): S = the 239-position prompt"));
    assert_true(notes_of("quest", &m, 16, buf, sizeof buf) == 1);
    assert_non_null(strstr(buf, "the quota of 8 tokens is less than one 16-token page"));
    assert_true(notes_of("quest:page=0", &m, 32, buf, sizeof buf) == 2); /* ceil(2 * 495/32) = 31 > 16 attended */
    assert_non_null(strstr(buf, "page=0: page size 31 from the even split"));
    assert_non_null(strstr(buf, "the quota of 16 tokens is less than one 31-token page"));
    assert_true(notes_of("sparq", &m, 32, buf, sizeof buf) == 1);
    assert_non_null(strstr(buf, "gqa=head: each of the 2 query heads of a group estimates and attends on its own"));
    assert_true(notes_of("sparq:gqa=group,r=9", &m, 32, buf, sizeof buf) == 2);
    assert_non_null(strstr(buf, "r = d = 8: the estimate is the exact logits"));
    /* validation */
    kvs_policy_config cfg = parse("rocketkv:kernel=8");
    assert_int_equal(kvs_policy_validate(&cfg, &m, 32), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "policy rocketkv: parameter 'kernel' must be odd (same padding), got 8");
    cfg = parse("rocketkv_mt:r=-0.5");
    assert_int_equal(kvs_policy_validate(&cfg, &m, 32), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "policy rocketkv_mt: parameter 'r' must be -1 (adaptive) or in [0, 1], got -0.5");
    cfg = parse("rocketkv@static-r0.5");
    assert_int_equal(kvs_policy_validate(&cfg, &m, 32), KVS_OK);
    assert_true(kvs_policy_param_get(&cfg, "r") == 0.5);
}

/* ================================================================================================
 * The bundled multi-turn trace (real decoding of stories260K, examples/stories260K_multiturn.kvt)
 * ============================================================================================== */

static void test_bundled_multiturn_trace(void **state) {
    (void)state;
    char path[4200];
    snprintf(path, sizeof path, "%s/examples/stories260K_multiturn.kvt", kvs_test_root());
    kvs_trace *tr = NULL;
    assert_int_equal(kvs_trace_open(path, &tr), KVS_OK);
    const kvs_trace_info *info = kvs_trace_info_get(tr);
    assert_int_equal(info->n_turns, 3);
    assert_int_equal(info->capture.dtype, KVS_DTYPE_F16);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_trace(tr, &src), KVS_OK);
    kvs_replay_config cfg[2] = {{.policy = parse("rocketkv"), .budget = 16, .budget_fraction = -1},
                                {.policy = parse("rocketkv_mt"), .budget = 16, .budget_fraction = -1}};
    kvs_replay_opts o = {.configs = cfg, .n_configs = 2, .threads = 2, .measure = KVS_MEASURE_DECODE, .series_every = 1};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
    assert_int_equal(r->runs[0].status, KVS_OK);
    assert_int_equal(r->runs[1].status, KVS_OK);
    /* both attend k2 = 8 tokens; MT keeps the rest of the history on the host and reads some of it back */
    assert_true(r->runs[0].max_attended == 8 && r->runs[1].max_attended == 8);
    assert_true(r->runs[0].run_agg.storage_host_bytes.max == 0);
    assert_true(r->runs[1].run_agg.storage_host_bytes.max > 0);
    double h2d_later = 0;
    for (int64_t s = 0; s < r->runs[1].n_steps; s++)
        if (r->runs[1].steps[s].position >= info->turns[1].prompt_end) h2d_later += r->runs[1].steps[s].h2d_bytes;
    assert_true(h2d_later > 0);
    print_message("  multi-turn trace, budget 16: output error rocketkv %.4f, rocketkv_mt %.4f; host bytes/KV head up "
                  "to %.0f\n",
                  r->runs[0].run_agg.out_err.mean, r->runs[1].run_agg.out_err.mean,
                  r->runs[1].run_agg.storage_host_bytes.max);
    kvs_replay_result_free(r);
    kvs_trace_close(tr);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_g2_c64_golden),
        cmocka_unit_test(test_g2_derivation_table_row_by_row),
        cmocka_unit_test(test_g2_ratio_table),
        cmocka_unit_test(test_matches_naive_reference),
        cmocka_unit_test(test_stage1_evicts_to_the_prompt_budget),
        cmocka_unit_test(test_decode_reads_no_key_but_the_current),
        cmocka_unit_test(test_reads_only_what_it_may_read),
        cmocka_unit_test(test_mt_selects_as_rocketkv_on_one_turn),
        cmocka_unit_test(test_mt_host_store_and_transfers),
        cmocka_unit_test(test_table1_reproduced_by_the_accounting),
        cmocka_unit_test(test_equal_keys_keep_the_oldest),
        cmocka_unit_test(test_notes_and_validation),
        cmocka_unit_test(test_bundled_multiturn_trace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
