/* test_keyformer.c — policies/keyformer.c (POLICY_SPEC §2.6 B7) against a NAIVE reference written here,
 * independently of the policy code: its own PCG32 and Gumbel sampler (the same documented stream: seed, stream
 * = query position x G + head, one draw per visible position in ascending order), logits as plain fp64 dot
 * products, the Gumbel-softmax by its formula, dense per-position score and residency arrays, and every
 * decision recomputed by scanning. The policy is driven through its ops (create / prefill / select / observe,
 * as the replay engine calls them) on small GENERATED streams (a seeded uniform generator here, not a model),
 * and compared selection by selection. Also: determinism for a seed and different seeds giving different
 * choices; the noise-free setting reducing to the accumulated-softmax ranking of H2O on a hand-computed case;
 * notes; the cost model through the replay engine.
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
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"

/* ---- generated streams --------------------------------------------------------------------------- */

typedef struct {
    int64_t begin, prompt_end, end;
} turn;

typedef struct {
    int G, d;
    int64_t N;
    float scale;
    float *q;     /* [N][G][d] */
    float *k, *v; /* [N][d] */
    turn turns[4];
    int n_turns;
} stream;

static uint64_t xs_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float xs_unit(uint64_t *s) { return (float)((double)(xs_next(s) >> 11) / 9007199254740992.0) * 2.0f - 1.0f; }

/* N positions split into n_turns turns of equal length, each half prompt, half generated. */
static void stream_make(stream *s, int64_t N, int G, int d, int n_turns, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->N = N;
    s->G = G;
    s->d = d;
    s->scale = 1.0f / sqrtf((float)d);
    s->q = malloc((size_t)N * (size_t)G * (size_t)d * sizeof(float));
    s->k = malloc((size_t)N * (size_t)d * sizeof(float));
    s->v = malloc((size_t)N * (size_t)d * sizeof(float));
    assert_true(s->q && s->k && s->v);
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < N * G * d; i++) s->q[i] = 3.0f * xs_unit(&r); /* sharp attention */
    for (int64_t i = 0; i < N * d; i++) s->k[i] = xs_unit(&r);
    for (int64_t i = 0; i < N * d; i++) s->v[i] = xs_unit(&r);
    s->n_turns = n_turns;
    for (int t = 0; t < n_turns; t++) {
        int64_t b = N * t / n_turns, e = N * (t + 1) / n_turns;
        s->turns[t] = (turn){b, b + (e - b) / 2, e};
    }
}

static void stream_free(stream *s) {
    free(s->q);
    free(s->k);
    free(s->v);
}

/* ---- recorded selections: per decode position and list, plus the kept sets after each prefill -------- */

typedef struct {
    int64_t N;
    int G;
    int32_t *set; /* [N][G][N] sorted positions (decode: S_t; prompt_end - 1: kept after the prefill) */
    int64_t *n;   /* [N][G], -1 = nothing recorded */
} record;

static void rec_init(record *r, const stream *s) {
    r->N = s->N;
    r->G = s->G;
    r->set = calloc((size_t)s->N * (size_t)s->G * (size_t)s->N, sizeof(int32_t));
    r->n = malloc((size_t)s->N * (size_t)s->G * sizeof(int64_t));
    assert_true(r->set && r->n);
    for (int64_t i = 0; i < s->N * s->G; i++) r->n[i] = -1;
}

static void rec_free(record *r) {
    free(r->set);
    free(r->n);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void rec_put(record *r, int64_t p, int li, const int32_t *idx, int64_t n) {
    int32_t *dst = r->set + ((size_t)p * (size_t)r->G + (size_t)li) * (size_t)r->N;
    memcpy(dst, idx, (size_t)n * sizeof(int32_t));
    qsort(dst, (size_t)n, sizeof(int32_t), cmp_i32);
    r->n[(size_t)p * (size_t)r->G + (size_t)li] = n;
}

/* Number of (position, list) cells compared; fails on the first difference. */
static int64_t rec_compare(const record *a, const record *b, const char *what) {
    int64_t compared = 0;
    for (int64_t p = 0; p < a->N; p++)
        for (int li = 0; li < a->G; li++) {
            size_t c = (size_t)p * (size_t)a->G + (size_t)li;
            if (a->n[c] != b->n[c] ||
                (a->n[c] > 0 && memcmp(a->set + c * (size_t)a->N, b->set + c * (size_t)a->N, (size_t)a->n[c] * sizeof(int32_t)))) {
                print_error("%s: position %lld list %d differs (%lld vs %lld entries)\n", what, (long long)p, li,
                            (long long)a->n[c], (long long)b->n[c]);
                fail();
            }
            compared += a->n[c] >= 0;
        }
    return compared;
}

static int rec_equal(const record *a, const record *b) {
    size_t cells = (size_t)a->N * (size_t)a->G;
    for (size_t c = 0; c < cells; c++)
        if (a->n[c] != b->n[c] || (a->n[c] > 0 && memcmp(a->set + c * (size_t)a->N, b->set + c * (size_t)a->N,
                                                         (size_t)a->n[c] * sizeof(int32_t))))
            return 0;
    return 1;
}

/* ---- the policy through its ops --------------------------------------------------------------------- */

static kvs_policy_model model_of(const stream *s, int64_t max_new) {
    kvs_policy_model m = {.n_layers = 1, .n_heads = s->G, .n_kv_heads = 1, .group = s->G, .head_dim = s->d,
                          .scale = s->scale, .kv_bytes = 2, .aux_bytes = 4, .n_positions = s->N,
                          .prompt_len = s->turns[0].prompt_end, .max_new_tokens = max_new};
    return m;
}

/* Runs `spec` at budget B with instance seed `seed` over every turn of s, recording what it keeps after each
 * prefill (at position prompt_end - 1) and S_t at every decode position. */
static void run_policy(const stream *s, const char *spec, int64_t B, uint64_t seed, int64_t max_new, record *out) {
    kvs_policy_config cfg;
    if (kvs_policy_parse(spec, &cfg) != KVS_OK) fail_msg("%s: %s", spec, kvs_last_error());
    const struct kvs_policy_ops *ops = cfg.ops;
    kvs_policy_model m = model_of(s, max_new);
    assert_int_equal(kvs_policy_validate(&cfg, &m, B), KVS_OK);
    kvs_policy_init init = {.model = &m, .cfg = &cfg, .budget = B, .budget_nominal = B, .seed = seed};
    void *st = NULL;
    assert_int_equal(ops->create(&init, &st), KVS_OK);
    int n_lists = kvs_policy_layout(&cfg) == KVS_SEL_PER_QUERY_HEAD ? s->G : 1;
    int32_t *buf = malloc((size_t)s->G * (size_t)s->N * sizeof(int32_t));
    int32_t *idx[8];
    int64_t cnt[8];
    float *probs = malloc((size_t)s->G * (size_t)s->N * sizeof(float)), out_v[64];
    const float *pr[8];
    assert_true(buf && probs && s->G <= 8 && s->d <= 64);
    for (int g = 0; g < s->G; g++) {
        idx[g] = buf + (size_t)g * (size_t)s->N;
        pr[g] = probs + (size_t)g * (size_t)s->N;
    }
    for (int t = 0; t < s->n_turns; t++) {
        const turn *tu = &s->turns[t];
        if (tu->prompt_end > tu->begin) {
            kvs_policy_view v = {.n = tu->prompt_end, .group = s->G, .head_dim = s->d, .scale = s->scale, .k = s->k,
                                 .v = s->v, .q = s->q + (size_t)tu->begin * (size_t)s->G * (size_t)s->d,
                                 .q_first = tu->begin, .n_q = tu->prompt_end - tu->begin, .turn_begin = tu->begin,
                                 .prompt_end = tu->prompt_end, .turn = t, .block_begin = tu->begin, .last_block = 1};
            assert_int_equal(ops->prefill(st, &v), KVS_OK);
            for (int li = 0; li < n_lists; li++) {
                int64_t n = ops->stored(st, li, idx[0]);
                rec_put(out, tu->prompt_end - 1, li, idx[0], n);
            }
        }
        for (int64_t p = tu->prompt_end; p < tu->end; p++) {
            kvs_policy_view v = {.n = p + 1, .group = s->G, .head_dim = s->d, .scale = s->scale, .k = s->k, .v = s->v,
                                 .q = s->q + (size_t)p * (size_t)s->G * (size_t)s->d, .q_first = p, .n_q = 1,
                                 .turn_begin = tu->begin, .prompt_end = tu->prompt_end, .turn = t, .block_begin = p,
                                 .last_block = 1};
            kvs_policy_sel sel = {.idx = idx, .n = cnt, .n_lists = n_lists, .cap = s->N};
            assert_int_equal(ops->select(st, &v, &sel), KVS_OK);
            for (int li = 0; li < n_lists; li++) rec_put(out, p, li, sel.idx[li], sel.n[li]);
            for (int g = 0; g < s->G; g++) {
                int li = n_lists == 1 ? 0 : g;
                kvs_attention(v.q + (size_t)g * (size_t)s->d, s->k, s->v, (size_t)s->d, sel.idx[li], (size_t)sel.n[li],
                              (size_t)s->d, s->scale, probs + (size_t)g * (size_t)s->N, out_v);
            }
            assert_int_equal(ops->observe(st, &v, &sel, pr), KVS_OK);
        }
    }
    ops->free(st);
    free(buf);
    free(probs);
}

/* ---- the naive reference -------------------------------------------------------------------------------- */

/* PCG32 (PCG-XSH-RR), as pcg32_srandom_r / pcg32_random_r define it. */
typedef struct {
    uint64_t st, inc;
} ref_pcg;

static uint32_t ref_pcg_next(ref_pcg *r) {
    uint64_t x = r->st;
    r->st = x * 6364136223846793005ull + r->inc;
    uint32_t v = (uint32_t)(((x >> 18) ^ x) >> 27), rot = (uint32_t)(x >> 59);
    return rot ? (v >> rot) | (v << (32 - rot)) : v;
}

static void ref_pcg_seed(ref_pcg *r, uint64_t seed, uint64_t stream_id) {
    r->st = 0;
    r->inc = stream_id * 2 + 1;
    ref_pcg_next(r);
    r->st += seed;
    ref_pcg_next(r);
}

/* Gumbel(0, 1) from u in (0, 1): u = (x + 1/2) / 2^32. */
static double ref_gumbel(ref_pcg *r) {
    double u = ((double)ref_pcg_next(r) + 0.5) / 4294967296.0;
    return -log(-log(u));
}

typedef struct {
    double recent, tau_init, tau_end, tau_delta;
    int step, no_noise, mean;
} ref_opts;

static ref_opts ref_opts_of(const char *spec) {
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_OK);
    ref_opts o = {.recent = kvs_policy_param_get(&cfg, "recent"), .tau_init = kvs_policy_param_get(&cfg, "tau_init"),
                  .tau_end = kvs_policy_param_get(&cfg, "tau_end"), .tau_delta = kvs_policy_param_get(&cfg, "tau_delta")};
    o.step = strstr(cfg.canonical, "tau_schedule=step") != NULL;
    o.no_noise = strstr(cfg.canonical, "noise=none") != NULL;
    o.mean = strstr(cfg.canonical, "gqa=mean") != NULL;
    return o;
}

/* tau of the itr-th generated token of a turn (0: the prompt), by the formula. */
static double ref_tau(const ref_opts *o, int64_t itr, int64_t max_new) {
    if (o->step) return o->tau_init + (double)itr * o->tau_delta;
    if (max_new <= 0) return o->tau_init;
    if (itr > max_new) itr = max_new;
    return o->tau_init + (double)itr * ((o->tau_end - o->tau_init) / (double)max_new);
}

/* acc[j] += the Gumbel-softmax that query position qp pays every resident position j <= qp: per query head of
 * the list, summed over the heads (gqa=mean: then divided by G). */
static void ref_score(const stream *s, const ref_opts *o, uint64_t seed, int li, int64_t qp, double tau,
                      const char *res, double *acc) {
    int g_lo = o->mean ? 0 : li, g_hi = o->mean ? s->G : li + 1;
    double *sum = calloc((size_t)qp + 1, sizeof(double)), *x = malloc(((size_t)qp + 1) * sizeof(double));
    assert_true(sum && x);
    for (int g = g_lo; g < g_hi; g++) {
        ref_pcg rng;
        ref_pcg_seed(&rng, seed, (uint64_t)qp * (uint64_t)s->G + (uint64_t)g);
        const float *q = s->q + ((size_t)qp * (size_t)s->G + (size_t)g) * (size_t)s->d;
        double mx = -INFINITY, tot = 0;
        for (int64_t j = 0; j <= qp; j++) {
            if (!res[j]) continue;
            double z = 0;
            for (int i = 0; i < s->d; i++) z += (double)q[i] * (double)s->k[(size_t)j * (size_t)s->d + (size_t)i];
            z *= (double)s->scale;
            double noise = o->no_noise ? 0.0 : ref_gumbel(&rng);
            x[j] = (z + noise) / tau;
            if (x[j] > mx) mx = x[j];
        }
        for (int64_t j = 0; j <= qp; j++)
            if (res[j]) tot += x[j] = exp(x[j] - mx);
        for (int64_t j = 0; j <= qp; j++)
            if (res[j]) sum[j] += x[j] / tot;
    }
    for (int64_t j = 0; j <= qp; j++)
        if (res[j]) acc[j] += o->mean ? sum[j] / s->G : sum[j];
    free(sum);
    free(x);
}

static int64_t ref_list(const char *res, int64_t n, int32_t *out) {
    int64_t m = 0;
    for (int64_t j = 0; j < n; j++)
        if (res[j]) out[m++] = (int32_t)j;
    return m;
}

/* The reference run of list li: same recording as run_policy(). */
static void ref_keyformer(const stream *s, const char *spec, int64_t B, uint64_t seed, int64_t max_new, int li,
                          record *out) {
    ref_opts o = ref_opts_of(spec);
    int64_t Rk = (int64_t)(o.recent * (double)B);
    char *res = calloc((size_t)s->N, 1);
    double *acc = calloc((size_t)s->N, sizeof(double));
    int32_t *list = malloc((size_t)s->N * sizeof(int32_t));
    assert_true(res && acc && list);
    for (int t = 0; t < s->n_turns; t++) {
        const turn *tu = &s->turns[t];
        for (int64_t i = tu->begin; i < tu->prompt_end; i++) {
            res[i] = 1;
            ref_score(s, &o, seed, li, i, ref_tau(&o, 0, max_new), res, acc);
        }
        if (tu->prompt_end > tu->begin) {
            int64_t m = ref_list(res, tu->prompt_end, list);
            if (m > B - 1) {
                /* keep the last R_k - 1 positions and the best B - R_k of the others (older first on ties) */
                int64_t rec = Rk > 0 ? Rk - 1 : 0;
                if (rec > B - 1) rec = B - 1;
                int64_t others = m - rec;
                char *keep = calloc((size_t)others + 1, 1);
                for (int64_t k = 0; k < (B - 1) - rec; k++) {
                    int64_t best = -1;
                    for (int64_t j = 0; j < others; j++)
                        if (!keep[j] && (best < 0 || acc[list[j]] > acc[list[best]])) best = j;
                    if (best < 0) break;
                    keep[best] = 1;
                }
                for (int64_t j = 0; j < others; j++)
                    if (!keep[j]) res[list[j]] = 0;
                free(keep);
            }
            m = ref_list(res, tu->prompt_end, list);
            rec_put(out, tu->prompt_end - 1, li, list, m);
        }
        for (int64_t p = tu->prompt_end; p < tu->end; p++) {
            res[p] = 1;
            acc[p] = 0;
            int64_t m = ref_list(res, p + 1, list);
            rec_put(out, p, li, list, m);
            ref_score(s, &o, seed, li, p, ref_tau(&o, p - tu->prompt_end + 1, max_new), res, acc);
            if (m == B) { /* discard the lowest score older than the last R_k (the newer on ties) */
                int64_t v = 0;
                for (int64_t j = 1; j < m - Rk; j++)
                    if (acc[list[j]] <= acc[list[v]]) v = j;
                res[list[v]] = 0;
            }
        }
    }
    free(res);
    free(acc);
    free(list);
}

static void check_case(const stream *s, const char *spec, int64_t B, uint64_t seed, int64_t max_new) {
    record eng, ref;
    rec_init(&eng, s);
    rec_init(&ref, s);
    run_policy(s, spec, B, seed, max_new, &eng);
    int n_lists = strstr(spec, "gqa=mean") ? 1 : s->G;
    for (int li = 0; li < n_lists; li++) ref_keyformer(s, spec, B, seed, max_new, li, &ref);
    char what[160];
    snprintf(what, sizeof what, "%s at budget %lld", spec, (long long)B);
    assert_true(rec_compare(&eng, &ref, what) > 0);
    rec_free(&eng);
    rec_free(&ref);
}

/* ---- tests ------------------------------------------------------------------------------------------------ */

static void test_keyformer_matches_naive_reference(void **state) {
    (void)state;
    stream s;
    stream_make(&s, 80, 2, 8, 1, 3);
    const int64_t gen = 40;
    const int64_t budgets[] = {1, 2, 5, 9, 16, 39, 40, 80};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) check_case(&s, "keyformer", budgets[b], 77, gen);
    check_case(&s, "keyformer:gqa=mean", 7, 5, gen);
    check_case(&s, "keyformer:gqa=mean,recent=0.5", 12, 5, gen);
    check_case(&s, "keyformer@reference", 8, 9, gen);
    check_case(&s, "keyformer:tau_schedule=step,tau_delta=0.25,tau_init=0.5", 10, 9, gen);
    check_case(&s, "keyformer:recent=0", 6, 11, gen);          /* R_k = 0: the current token is unprotected */
    check_case(&s, "keyformer:recent=1", 5, 11, gen);          /* no key token: a window */
    check_case(&s, "keyformer:tau_init=3,tau_end=0.5", 9, 13, gen); /* a falling temperature */
    check_case(&s, "keyformer:tau_end=0.2", 9, 13, 10);        /* generating past max_new_tokens: tau stays at tau_end */
    check_case(&s, "keyformer", 9, 13, 0);                     /* max_new_tokens unknown: tau_init throughout */
    check_case(&s, "keyformer:noise=none", 9, 13, gen);
    stream_free(&s);
    stream_make(&s, 60, 1, 16, 1, 4); /* MHA */
    check_case(&s, "keyformer", 10, 21, 30);
    check_case(&s, "keyformer:gqa=mean", 10, 21, 30); /* G = 1: the same as expand */
    stream_free(&s);
    stream_make(&s, 96, 3, 8, 2, 5); /* two turns, GQA group 3 */
    check_case(&s, "keyformer", 7, 31, 24);
    check_case(&s, "keyformer:gqa=mean,recent=0.4", 11, 31, 24);
    check_case(&s, "keyformer@reference", 64, 31, 24);
    stream_free(&s);
}

static void test_keyformer_is_deterministic_for_a_seed_and_seeds_differ(void **state) {
    (void)state;
    stream s;
    stream_make(&s, 80, 2, 8, 1, 6);
    record a, b, c, n1, n2;
    rec_init(&a, &s);
    rec_init(&b, &s);
    rec_init(&c, &s);
    rec_init(&n1, &s);
    rec_init(&n2, &s);
    run_policy(&s, "keyformer", 8, 1234, 40, &a);
    run_policy(&s, "keyformer", 8, 1234, 40, &b);
    run_policy(&s, "keyformer", 8, 1235, 40, &c);
    assert_true(rec_compare(&a, &b, "same seed") > 0);
    assert_false(rec_equal(&a, &c)); /* another seed, other noise, other choices */
    /* without noise the seed plays no part */
    run_policy(&s, "keyformer:noise=none", 8, 1234, 40, &n1);
    run_policy(&s, "keyformer:noise=none", 8, 99, 40, &n2);
    assert_true(rec_compare(&n1, &n2, "noise=none, two seeds") > 0);
    assert_false(rec_equal(&a, &n1)); /* and the noise does change the choices */
    rec_free(&a);
    rec_free(&b);
    rec_free(&c);
    rec_free(&n1);
    rec_free(&n2);
    stream_free(&s);
}

/* Without noise and at a constant temperature 1 the score is the accumulated softmax: H2O's ranking. A hand-
 * computed case: d = 1, scale 1, every query 1, so the logits are the keys.
 *   keys: prompt [0, ln3, 0, ln2, 0], then ln2, 0, ln4.
 *   prefill column sums: q0 {0}: 1; q1 {0,1}: (1,3)/4; q2 {0..2}: (1,3,1)/5; q3: (1,3,1,2)/7; q4: (1,3,1,2,1)/8
 *     acc = 1.717857, 2.153571, 0.467857, 0.535714, 0.125
 *   B = 4, recent 0.5: R_k = 2. Prefill keeps the last R_k - 1 = 1 ({4}) and the top 2 of {0..3}: {0, 1}.
 *   p5 (ln2): S = {0,1,4,5}, attention (1,3,1,2)/7: acc 1.860714, 2.582143, 0.267857, 0.285714; discard the
 *     lower of the non-recent {0, 1}: 0.
 *   p6 (0): S = {1,4,5,6}, (3,1,2,1)/7: acc 3.010714, 0.410714, 0.571429, 0.142857; non-recent {1, 4}: 4 goes.
 *   p7 (ln4): S = {1,5,6,7}, (3,2,1,4)/10: acc 3.310714, 0.771429, 0.242857, 0.4; non-recent {1, 5}: 5 goes. */
static void test_keyformer_without_noise_is_accumulated_softmax_hand_case(void **state) {
    (void)state;
    stream s;
    memset(&s, 0, sizeof s);
    s.N = 8;
    s.G = 1;
    s.d = 1;
    s.scale = 1.0f;
    float q[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    float k[8] = {0, logf(3), 0, logf(2), 0, logf(2), 0, logf(4)};
    float v[8] = {0};
    s.q = q;
    s.k = k;
    s.v = v;
    s.n_turns = 1;
    s.turns[0] = (turn){0, 5, 8};
    const int32_t kept[] = {0, 1, 4}, s5[] = {0, 1, 4, 5}, s6[] = {1, 4, 5, 6}, s7[] = {1, 5, 6, 7};
    const char *specs[] = {"keyformer:noise=none,tau_end=1,recent=0.5", "h2o:recent=0.5,gqa=mean"};
    for (int i = 0; i < 2; i++) {
        record r;
        rec_init(&r, &s);
        run_policy(&s, specs[i], 4, 42, 3, &r);
        assert_int_equal(r.n[4], 3);
        assert_memory_equal(r.set + 4 * 8, kept, sizeof kept);
        assert_int_equal(r.n[5], 4);
        assert_memory_equal(r.set + 5 * 8, s5, sizeof s5);
        assert_int_equal(r.n[6], 4);
        assert_memory_equal(r.set + 6 * 8, s6, sizeof s6);
        assert_int_equal(r.n[7], 4);
        assert_memory_equal(r.set + 7 * 8, s7, sizeof s7);
        rec_free(&r);
    }
    /* and the noise-free reference agrees */
    record ref;
    rec_init(&ref, &s);
    ref_keyformer(&s, "keyformer:noise=none,tau_end=1,recent=0.5", 4, 42, 3, 0, &ref);
    assert_memory_equal(ref.set + 7 * 8, s7, sizeof s7);
    rec_free(&ref);
}

/* The decode-time temperature decides a hand-computed eviction. d = 1, scale 1, every query 1, noise off,
 * keys [0, ln2, -30 | -30, -30] (prompt of 3), B = 3, recent 0.34: R_k = 1, the prefill keeps the top 2.
 *   prefill at tau_init = 1: acc0 = 1 + 1/3 + 1/3 = 5/3, acc1 = 2/3 + 2/3 = 4/3, acc2 ~ 1e-13: keeps {0, 1}.
 *   p3: S = {0, 1, 3}; position 1 gets p = 2^(1/tau) / (1 + 2^(1/tau)), position 0 gets 1 - p. Then acc1 > acc0
 *   exactly when p > 2/3, i.e. tau < 1: tau 0.5 (p = 0.8) discards 0, tau 2 (p = 0.586) discards 1.
 *   p4 attends what is left plus itself. With max_new_tokens = 1 the first generated token has tau = tau_end. */
static void test_keyformer_temperature_schedule_hand_case(void **state) {
    (void)state;
    stream s;
    memset(&s, 0, sizeof s);
    s.N = 5;
    s.G = 1;
    s.d = 1;
    s.scale = 1.0f;
    float q[5] = {1, 1, 1, 1, 1}, k[5] = {0, logf(2), -30, -30, -30}, v[5] = {0};
    s.q = q;
    s.k = k;
    s.v = v;
    s.n_turns = 1;
    s.turns[0] = (turn){0, 3, 5};
    const struct {
        const char *spec;
        int32_t survivor;
    } cases[] = {
        {"keyformer:noise=none,recent=0.34,tau_end=0.5", 1},
        {"keyformer:noise=none,recent=0.34,tau_end=2", 0},
        {"keyformer:noise=none,recent=0.34,tau_schedule=step,tau_delta=1", 0},    /* tau = 1 + 1 x 1 */
        {"keyformer:noise=none,recent=0.34,tau_schedule=step,tau_delta=0.02", 0}, /* 1.02: just above 1 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        record r;
        rec_init(&r, &s);
        run_policy(&s, cases[c].spec, 3, 7, 1, &r);
        const int32_t kept[] = {0, 1}, s3[] = {0, 1, 3};
        const int32_t s4[] = {cases[c].survivor, 3, 4};
        assert_int_equal(r.n[2], 2);
        assert_memory_equal(r.set + 2 * 5, kept, sizeof kept);
        assert_int_equal(r.n[3], 3);
        assert_memory_equal(r.set + 3 * 5, s3, sizeof s3);
        assert_int_equal(r.n[4], 3);
        if (memcmp(r.set + 4 * 5, s4, sizeof s4)) fail_msg("%s: position %d should survive", cases[c].spec, s4[0]);
        rec_free(&r);
    }
}

static void test_keyformer_notes_and_parameters(void **state) {
    (void)state;
    kvs_policy_model m = {.group = 2, .head_dim = 8, .kv_bytes = 2, .aux_bytes = 4, .prompt_len = 40,
                          .max_new_tokens = 40};
    kvs_policy_config cfg;
    char buf[512];
    assert_int_equal(kvs_policy_parse("keyformer", &cfg), KVS_OK);
    assert_string_equal(cfg.canonical,
                        "recent=0.3,tau_init=1,tau_end=2,tau_schedule=span,tau_delta=0.01,noise=gumbel,gqa=expand");
    assert_int_equal(kvs_policy_layout(&cfg), KVS_SEL_PER_QUERY_HEAD);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 10, buf, sizeof buf), 0);
    assert_int_equal(kvs_policy_parse("keyformer:recent=1", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 10, buf, sizeof buf), 1);
    assert_non_null(strstr(buf, "recent=1 leaves no key-token slot at this budget (a window)"));
    assert_int_equal(kvs_policy_parse("keyformer:noise=none", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 10, buf, sizeof buf), 1);
    assert_non_null(strstr(buf, "noise=none: no Gumbel noise"));
    m.max_new_tokens = 0;
    assert_int_equal(kvs_policy_parse("keyformer", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_notes(&cfg, &m, 10, buf, sizeof buf), 1);
    assert_non_null(strstr(buf, "max_new_tokens is unknown: the temperature stays at tau_init=1"));
    assert_int_equal(kvs_policy_parse("keyformer@reference", &cfg), KVS_OK); /* step schedule: no T_gen needed */
    assert_int_equal(kvs_policy_notes(&cfg, &m, 10, buf, sizeof buf), 0);
    assert_int_equal(kvs_policy_layout(&cfg), KVS_SEL_PER_QUERY_HEAD);
    assert_int_equal(kvs_policy_parse("keyformer:gqa=mean", &cfg), KVS_OK);
    assert_int_equal(kvs_policy_layout(&cfg), KVS_SEL_PER_KV_HEAD);
    assert_int_equal(kvs_policy_parse("keyformer:tau_init=0", &cfg), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "out of range"));
    assert_int_equal(kvs_policy_parse("keyformer:noise=uniform", &cfg), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "'uniform' is not one of gumbel|none"));
}

/* Through the replay engine: B K/V slots and B scores (the model's aux_bytes, here 2 as `--aux-bytes 2`) per
 * cache once the caches are full, G caches with gqa=expand; the scores are read and written every step. */
static void test_keyformer_cost_model_through_the_engine(void **state) {
    (void)state;
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = 48;
    o.n_kv_heads = 2;
    o.n_heads = 6;
    o.head_dim = 8;
    o.seed = 3;
    kvs_test_replay_fixture f;
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 8, &f), KVS_OK);
    f.mem.model.aux_bytes = 2;
    const char *specs[] = {"keyformer", "keyformer:gqa=mean"};
    for (int i = 0; i < 2; i++) {
        kvs_replay_config cfg = {.budget = 8, .budget_fraction = -1};
        assert_int_equal(kvs_policy_parse(specs[i], &cfg.policy), KVS_OK);
        kvs_replay_source src;
        assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
        kvs_replay_opts ro = {.configs = &cfg, .n_configs = 1, .threads = 2, .measure = KVS_MEASURE_DECODE};
        kvs_replay_result *r = NULL;
        assert_int_equal(kvs_replay_execute(&src, &ro, &r), KVS_OK);
        assert_int_equal(r->runs[0].status, KVS_OK);
        double caches = i == 0 ? 3 : 1, kv = caches * 8 * 2 * 8 * 2, aux = caches * 8 * 2;
        const kvs_results_agg *a = &r->runs[0].run_agg;
        assert_true(fabs(a->storage_kv_bytes.max - kv) < 1e-9);
        assert_true(fabs(a->storage_aux_bytes.max - aux) < 1e-9);
        assert_true(fabs(a->storage_bytes.max - (kv + aux)) < 1e-9);
        assert_true(fabs(a->traffic_aux_bytes.max - aux) < 1e-9);
        assert_true(fabs(a->traffic_aux_unfused_bytes.max - (aux + kv / 2)) < 1e-9);
        assert_true(fabs(a->write_bytes.max - (caches * 2 * 8 * 2 + aux)) < 1e-9);
        assert_true(r->runs[0].max_attended <= 8);
        kvs_replay_result_free(r);
    }
    kvs_test_replay_fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keyformer_matches_naive_reference),
        cmocka_unit_test(test_keyformer_is_deterministic_for_a_seed_and_seeds_differ),
        cmocka_unit_test(test_keyformer_without_noise_is_accumulated_softmax_hand_case),
        cmocka_unit_test(test_keyformer_temperature_schedule_hand_case),
        cmocka_unit_test(test_keyformer_notes_and_parameters),
        cmocka_unit_test(test_keyformer_cost_model_through_the_engine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
