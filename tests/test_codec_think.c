/* test_codec_think.c — ThinK (query-driven key channel pruning) as a codec of sim/codec.c: the channel scores and
 * kept set against the NumPy reference (tests/fixtures/codec/think.txt, tools/gen_think_fixtures.py: the paper's
 * Frobenius norm of an outer product and the authors' cache split, step by step), a hand example asserted exactly,
 * q . k over the kept channels equal to q . k with the zeroed row, the time rule (positions >= n and queries outside
 * the window change nothing), bytes by hand, and bad specs and calls with their exact status and message.
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

#include "../common/kvs.h"
#include "../common/kvs_rng.h"
#include "../sim/codec.h"
#include "util/codec_fixture.h"

/* ---- helpers ---------------------------------------------------------------------------------------------- */

static kvs_codec *parse_ok(const char *spec) {
    kvs_codec *c = kvs_test_codec_parse(spec);
    assert_non_null(c);
    return c;
}

/* spec is rejected with KVS_ERR_INVALID_ARG and exactly msg */
static void expect_bad(const char *spec, const char *msg) {
    assert_non_null(msg);
    assert_true(kvs_test_codec_rejects(spec, msg));
}

static kvs_codec_state *state_ok(const kvs_codec *c, int64_t d, int64_t cap) {
    kvs_codec_state *st = NULL;
    if (kvs_codec_state_create(c, d, cap, &st) != KVS_OK) fail_msg("state: %s", kvs_last_error());
    return st;
}

static void ok(kvs_status s) {
    if (s != KVS_OK) fail_msg("%s", kvs_last_error());
}

/* ---- the NumPy reference ---------------------------------------------------------------------------------- */

typedef struct {
    char name[64], spec[KVS_CODEC_SPEC_MAX];
    int64_t N, d, P, G, NQ;
    float *q, *in[2], *out[2];
    double *score;
    uint8_t *keep;
    int64_t *steps; /* [N][2] */
} think_case;

static void case_free(think_case *tc) {
    free(tc->q);
    for (int t = 0; t < 2; t++) {
        free(tc->in[t]);
        free(tc->out[t]);
    }
    free(tc->score);
    free(tc->keep);
    free(tc->steps);
    memset(tc, 0, sizeof *tc);
}

static float *read_hex(char *p, int64_t n) {
    float *a = kvs_test_hex_floats(&p, n);
    assert_non_null(a);
    return a;
}

static int next_case(char **cursor, think_case *tc) {
    memset(tc, 0, sizeof *tc);
    for (char *line; (line = kvs_test_fixture_line(cursor)) != NULL;) {
        if (strncmp(line, "case ", 5) == 0) {
            long long N, d, P, G, NQ;
            assert_int_equal(sscanf(line + 5, "%63s %127s %lld %lld %lld %lld %lld", tc->name, tc->spec, &N, &d, &P,
                                    &G, &NQ), 7);
            tc->N = N, tc->d = d, tc->P = P, tc->G = G, tc->NQ = NQ;
        } else if (line[0] == 'q' && (line[1] == ' ' || line[1] == '\0')) {
            tc->q = read_hex(line + 1, tc->NQ * tc->G * tc->d);
        } else if (strncmp(line, "in ", 3) == 0 || strncmp(line, "out ", 4) == 0) {
            int is_out = line[0] == 'o';
            char *s = line + (is_out ? 4 : 3);
            int t = *s == 'k' ? 0 : 1;
            float *a = read_hex(s + 1, tc->N * tc->d);
            if (is_out)
                tc->out[t] = a;
            else
                tc->in[t] = a;
        } else if (strncmp(line, "score ", 6) == 0) {
            char *s = line + 6;
            tc->score = malloc((size_t)tc->d * sizeof(double));
            for (int64_t j = 0; j < tc->d; j++) tc->score[j] = strtod(s, &s);
        } else if (strncmp(line, "keep ", 5) == 0) {
            char *s = line + 5;
            tc->keep = malloc((size_t)tc->d);
            for (int64_t j = 0; j < tc->d; j++) tc->keep[j] = (uint8_t)strtol(s, &s, 10);
        } else if (strncmp(line, "steps ", 6) == 0) {
            char *s = line + 6;
            tc->steps = malloc((size_t)tc->N * 2 * sizeof(int64_t));
            for (int64_t i = 0; i < 2 * tc->N; i++) tc->steps[i] = strtoll(s, &s, 10);
        } else if (strcmp(line, "end") == 0) {
            return 1;
        } else {
            fail_msg("fixture: unexpected line '%.40s'", line);
        }
    }
    return 0;
}

static void run_case(const think_case *tc) {
    kvs_codec *c = parse_ok(tc->spec);
    assert_string_equal(kvs_codec_spec(c), tc->spec); /* the generator writes canonical specs */
    const int64_t d = tc->d;
    kvs_codec_state *st = state_ok(c, d, tc->N);
    if (tc->P > 0) ok(kvs_codec_state_prefill_queries(st, tc->q, tc->NQ, (int)tc->G));
    ok(kvs_codec_state_prefill(st, tc->in[0], tc->in[1], tc->P));
    const double *score = kvs_codec_state_channel_scores(st);
    const uint8_t *keep = kvs_codec_state_kept(st);
    assert_non_null(score);
    assert_non_null(keep);
    int64_t kept = 0;
    for (int64_t j = 0; j < d; j++) {
        if (fabs(score[j] - tc->score[j]) > 1e-12 * fabs(tc->score[j]))
            fail_msg("%s: score[%lld] = %.17g, reference %.17g", tc->name, (long long)j, score[j], tc->score[j]);
        if (keep[j] != tc->keep[j]) fail_msg("%s: channel %lld kept %d, reference %d", tc->name, (long long)j,
                                             keep[j], tc->keep[j]);
        kept += keep[j];
    }
    if (tc->P > 0) assert_int_equal(kept, kvs_codec_kept_channels(c, d));
    /* the exposed arithmetic on the window's queries alone gives the same */
    if (tc->P > 0) {
        int64_t w = tc->P < kvs_codec_query_window(c) ? tc->P : kvs_codec_query_window(c);
        double *s2 = malloc((size_t)d * sizeof(double));
        uint8_t *k2 = malloc((size_t)d);
        ok(kvs_codec_think_channels(c, tc->q + (tc->NQ - w) * tc->G * d, w, (int)tc->G, tc->in[0], tc->P, d, s2, k2));
        for (int64_t j = 0; j < d; j++) {
            assert_true(s2[j] == score[j]);
            assert_int_equal(k2[j], keep[j]);
        }
        free(s2);
        free(k2);
    }
    for (int64_t n = tc->P + 1; n <= tc->N; n++) {
        ok(kvs_codec_state_advance(st, tc->in[0], tc->in[1], n));
        assert_int_equal(kvs_codec_state_quantized(st, KVS_CODEC_K), tc->steps[2 * (n - 1)]);
        assert_int_equal(kvs_codec_state_quantized(st, KVS_CODEC_V), tc->steps[2 * (n - 1) + 1]);
        /* every step's rows are the final rows' first n (the reference asserts it of the authors' cache) */
        for (int t = 0; t < 2; t++) {
            const float *rows = kvs_codec_state_rows(st, (kvs_codec_tensor)t);
            for (int64_t i = 0; i < n * d; i++)
                if (kvs_f32_bits(rows[i]) != kvs_f32_bits(tc->out[t][i]))
                    fail_msg("%s step %lld %s[%lld][%lld] = %08x, reference %08x", tc->name, (long long)n,
                             t ? "V" : "K", (long long)(i / d), (long long)(i % d), kvs_f32_bits(rows[i]),
                             kvs_f32_bits(tc->out[t][i]));
        }
    }
    kvs_codec_state_free(st);
    kvs_codec_free(c);
}

static void test_fixtures_match_numpy(void **unused) {
    (void)unused;
    char *text = kvs_test_codec_fixture("think.txt");
    assert_non_null(text);
    char *cur = text;
    think_case tc;
    int n = 0;
    while (next_case(&cur, &tc)) {
        run_case(&tc);
        case_free(&tc);
        n++;
    }
    assert_int_equal(n, 13);
    free(text);
}

/* ---- by hand ---------------------------------------------------------------------------------------------- */

/* d = 4, two window queries, ratio 0.5 (2 channels pruned), recent 1, a prompt of 3 keys:
 *   q0 = (1, 0, 2, 0), q1 = (1, 1, 0, 0)      ||Q_c||^2 = 2, 1, 4, 0
 *   k0 = (1, 2, 0, 3), k1 = (1, 0, 1, 0), k2 = (0, 2, 0, 4)    ||K_c||^2 = 2, 8, 1, 25
 *   score = sqrt(2*2), sqrt(1*8), sqrt(4*1), sqrt(0*25) = 2, 2.828..., 2, 0
 * Channel 3 has the lowest score, then 0 and 2 tie at 2: the tie prunes the lower index, channel 0. Kept: 1, 2.
 * Positions 0, 1 (P - recent = 2) are pruned at the first decode step; position 2 and later are whole. */
static void test_hand_example(void **unused) {
    (void)unused;
    kvs_codec *c = parse_ok("think:ratio=0.5,window=2,recent=1");
    const float q[] = {9, 9, 9, 9, /* outside the window: never read */ 1, 0, 2, 0, 1, 1, 0, 0};
    const float k[] = {1, 2, 0, 3, 1, 0, 1, 0, 0, 2, 0, 4, 5, 6, 7, 8};
    const float v[] = {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4};
    kvs_codec_state *st = state_ok(c, 4, 4);
    ok(kvs_codec_state_prefill_queries(st, q, 3, 1));
    ok(kvs_codec_state_prefill(st, k, v, 3));
    const double *s = kvs_codec_state_channel_scores(st);
    assert_true(s[0] == 2.0 && s[1] == sqrt(8.0) && s[2] == 2.0 && s[3] == 0.0);
    const uint8_t *keep = kvs_codec_state_kept(st);
    assert_true(keep[0] == 0 && keep[1] == 1 && keep[2] == 1 && keep[3] == 0);
    /* the prefill's rows are as captured */
    assert_memory_equal(kvs_codec_state_rows(st, KVS_CODEC_K), k, 3 * 4 * sizeof(float));
    ok(kvs_codec_state_advance(st, k, v, 4));
    const float want[] = {0, 2, 0, 0, 0, 0, 1, 0, 0, 2, 0, 4, 5, 6, 7, 8};
    assert_memory_equal(kvs_codec_state_rows(st, KVS_CODEC_K), want, sizeof want);
    assert_memory_equal(kvs_codec_state_rows(st, KVS_CODEC_V), v, sizeof v);
    assert_int_equal(kvs_codec_state_quantized(st, KVS_CODEC_K), 2);
    assert_int_equal(kvs_codec_state_quantized(st, KVS_CODEC_V), 0);
    kvs_codec_state_free(st);
    kvs_codec_free(c);
}

/* q . k over the kept channels (the authors' restricted query against the thin key) equals q . k with the zeroed
 * row kvsim hands to attention, for every pruned row and many queries. */
static void test_restricted_dot_equals_zeroed_dot(void **unused) {
    (void)unused;
    const int64_t d = 64, P = 48, N = 56;
    kvs_codec *c = parse_ok("think");
    kvs_rng r;
    kvs_rng_seed(&r, 7, 0);
    float *k = malloc((size_t)(N * d) * sizeof(float)), *v = malloc((size_t)(N * d) * sizeof(float));
    float *q = malloc((size_t)(P * 2 * d) * sizeof(float));
    for (int64_t i = 0; i < N * d; i++) k[i] = (float)(kvs_rng_open01(&r) - 0.5) * (float)(1 + i % 7), v[i] = 1.0f;
    for (int64_t i = 0; i < P * 2 * d; i++) q[i] = (float)(kvs_rng_open01(&r) - 0.5);
    kvs_codec_state *st = state_ok(c, d, N);
    ok(kvs_codec_state_prefill_queries(st, q, P, 2));
    ok(kvs_codec_state_prefill(st, k, v, P));
    ok(kvs_codec_state_advance(st, k, v, N));
    const uint8_t *keep = kvs_codec_state_kept(st);
    const float *rows = kvs_codec_state_rows(st, KVS_CODEC_K);
    int64_t pruned_rows = kvs_codec_state_quantized(st, KVS_CODEC_K);
    assert_int_equal(pruned_rows, P - 32);
    for (int64_t p = 0; p < N; p++)
        for (int64_t qi = 0; qi < P * 2; qi++) {
            const float *qq = q + qi * d;
            double restricted = 0, zeroed = 0, whole = 0;
            for (int64_t j = 0; j < d; j++) {
                if (keep[j]) restricted += (double)qq[j] * (double)k[p * d + j];
                zeroed += (double)qq[j] * (double)rows[p * d + j];
                whole += (double)qq[j] * (double)k[p * d + j];
            }
            assert_true(zeroed == (p < pruned_rows ? restricted : whole));
        }
    free(k);
    free(v);
    free(q);
    kvs_codec_state_free(st);
    kvs_codec_free(c);
}

/* ---- the time rule ---------------------------------------------------------------------------------------- */

/* At every step n the rows equal those of a run whose positions >= n hold NaN, and whose queries outside the
 * window (and keys past the prompt) are scrambled: the channel choice reads the prompt and the window only. */
static void test_time_rule(void **unused) {
    (void)unused;
    const int64_t d = 16, P = 40, N = 60, G = 2, W = 8;
    kvs_codec *c = parse_ok("think:ratio=0.5,window=8,recent=4");
    kvs_rng r;
    kvs_rng_seed(&r, 11, 0);
    size_t nk = (size_t)(N * d), nq = (size_t)(P * G * d);
    float *k = malloc(nk * sizeof(float)), *v = malloc(nk * sizeof(float)), *q = malloc(nq * sizeof(float));
    float *k2 = malloc(nk * sizeof(float)), *v2 = malloc(nk * sizeof(float)), *q2 = malloc(nq * sizeof(float));
    for (size_t i = 0; i < nk; i++) k[i] = (float)(kvs_rng_open01(&r) * (double)(1 + i % 5)), v[i] = (float)i;
    for (size_t i = 0; i < nq; i++) q[i] = (float)(kvs_rng_open01(&r) - 0.5) * (float)(1 + i % 3);
    memcpy(q2, q, nq * sizeof(float));
    for (size_t i = 0; i < (size_t)((P - W) * G * d); i++) q2[i] = (float)(kvs_rng_open01(&r) * 1e6); /* outside */
    kvs_codec_state *a = state_ok(c, d, N), *b = state_ok(c, d, N);
    ok(kvs_codec_state_prefill_queries(a, q, P, (int)G));
    ok(kvs_codec_state_prefill_queries(b, q2, P, (int)G));
    ok(kvs_codec_state_prefill(a, k, v, P));
    memcpy(k2, k, nk * sizeof(float));
    memcpy(v2, v, nk * sizeof(float));
    for (size_t i = (size_t)(P * d); i < nk; i++) k2[i] = v2[i] = NAN; /* nothing past the prompt is read */
    ok(kvs_codec_state_prefill(b, k2, v2, P));
    assert_memory_equal(kvs_codec_state_kept(a), kvs_codec_state_kept(b), (size_t)d);
    int changed = 0;
    for (int64_t n = P + 1; n <= N; n++) {
        memcpy(k2, k, nk * sizeof(float));
        memcpy(v2, v, nk * sizeof(float));
        for (size_t i = (size_t)(n * d); i < nk; i++) k2[i] = v2[i] = NAN;
        ok(kvs_codec_state_advance(a, k, v, n));
        ok(kvs_codec_state_advance(b, k2, v2, n));
        for (int t = 0; t < 2; t++)
            assert_memory_equal(kvs_codec_state_rows(a, (kvs_codec_tensor)t),
                                kvs_codec_state_rows(b, (kvs_codec_tensor)t), (size_t)(n * d) * sizeof(float));
        changed |= memcmp(kvs_codec_state_rows(a, KVS_CODEC_K), k, (size_t)(n * d) * sizeof(float)) != 0;
    }
    assert_true(changed); /* the pruning did change rows: the comparison is not of two untouched copies */
    /* a window query does matter: one changed at the prompt's last position changes channel 0's score */
    kvs_codec_state *e = state_ok(c, d, N);
    memcpy(q2, q, nq * sizeof(float));
    q2[(size_t)((P - 1) * G * d)] += 100.0f;
    ok(kvs_codec_state_prefill_queries(e, q2, P, (int)G));
    ok(kvs_codec_state_prefill(e, k, v, P));
    assert_true(kvs_codec_state_channel_scores(a)[0] != kvs_codec_state_channel_scores(e)[0]);
    kvs_codec_state_free(e);
    kvs_codec_state_free(a);
    kvs_codec_state_free(b);
    free(k), free(v), free(q), free(k2), free(v2), free(q2);
    kvs_codec_free(c);
}

/* ---- bytes ------------------------------------------------------------------------------------------------ */

/* d = 10, ratio 0.3: int(10 * 0.3) = int(3.0000000000000004) = 3 pruned, 7 kept; P = 12, recent = 4: positions
 * 0..7 pruned. At step 15 with residents {0, 3, 9, 14}: K = 2 pruned rows x 7 x 2 + 2 whole rows x 10 x 2 = 68,
 * mask 10 bytes, V = 4 x 10 x 2 = 80: 158. Residents {9, 14}: no pruned row, no mask: 40 + 40 = 80. */
static void test_bytes_by_hand(void **unused) {
    (void)unused;
    kvs_codec *c = parse_ok("think:ratio=0.3,window=4,recent=4");
    assert_int_equal(kvs_codec_kept_channels(c, 10), 7);
    assert_true(kvs_codec_position_bytes(c, 10) == 7 * 2 + 10 * 2);
    assert_true(kvs_codec_layer_bytes(c) == 0.0);
    float k[15 * 10], v[15 * 10], q[4 * 10];
    for (int i = 0; i < 150; i++) k[i] = (float)(i % 10 + 1), v[i] = 1.0f;
    for (int i = 0; i < 40; i++) q[i] = 1.0f;
    kvs_codec_state *st = state_ok(c, 10, 15);
    ok(kvs_codec_state_prefill_queries(st, q, 4, 1));
    ok(kvs_codec_state_prefill(st, k, v, 12));
    kvs_codec_bytes b;
    const int64_t all[] = {0, 3, 9, 11};
    ok(kvs_codec_state_bytes(st, all, 4, &b)); /* at the prefill every row is whole */
    assert_true(b.k_full == 80 && b.k_codes == 0 && b.k_meta == 0 && b.v_full == 80 && b.total == 160);
    ok(kvs_codec_state_advance(st, k, v, 15));
    const int64_t res[] = {14, 0, 9, 3};
    ok(kvs_codec_state_bytes(st, res, 4, &b));
    assert_true(b.k_codes == 28 && b.k_full == 40 && b.k_meta == 10 && b.v_full == 80 && b.v_codes == 0);
    assert_true(b.v_meta == 0 && b.scale == 0 && b.total == 158);
    const int64_t whole[] = {9, 14};
    ok(kvs_codec_state_bytes(st, whole, 2, &b));
    assert_true(b.k_codes == 0 && b.k_meta == 0 && b.total == 80);
    /* the kept set: channels scored by ||K_c|| (all queries 1): channels 0, 1, 2 (values 1, 2, 3) are pruned */
    const uint8_t *keep = kvs_codec_state_kept(st);
    for (int j = 0; j < 10; j++) assert_int_equal(keep[j], j >= 3);
    kvs_codec_state_free(st);
    kvs_codec_free(c);
}

/* ---- specs and calls -------------------------------------------------------------------------------------- */

static void test_specs(void **unused) {
    (void)unused;
    const char *pairs[][2] = {
        {"think", "think:ratio=0.4,window=32,recent=32"},
        {"think:recent=0,ratio=0.5", "think:ratio=0.5,window=32,recent=0"},
        {"think:ratio=0", "think:ratio=0,window=32,recent=32"},
        {"think:ratio=-0", "think:ratio=0,window=32,recent=32"},
        {"think:ratio=0.29,window=1", "think:ratio=0.29,window=1,recent=32"},
        {"think:ratio=0.999999", "think:ratio=0.999999,window=32,recent=32"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        kvs_codec *c = parse_ok(pairs[i][0]);
        assert_string_equal(kvs_codec_spec(c), pairs[i][1]);
        assert_int_equal(kvs_codec_kind_of(c), KVS_CODEC_THINK);
        assert_int_equal(kvs_codec_needs_queries(c), 1);
        kvs_codec *c2 = parse_ok(pairs[i][1]);
        assert_string_equal(kvs_codec_spec(c2), pairs[i][1]);
        kvs_codec_free(c2);
        kvs_codec_free(c);
    }
    kvs_codec *c = parse_ok("think:ratio=0.29");
    assert_int_equal(kvs_codec_kept_channels(c, 100), 72); /* 100 * 0.29 = 28.999999999999996: 28 pruned */
    assert_int_equal(kvs_codec_kept_channels(c, 128), 91); /* int(37.12) = 37 */
    assert_int_equal(kvs_codec_query_window(c), 32);
    kvs_codec_free(c);
    kvs_codec *i4 = parse_ok("int");
    assert_int_equal(kvs_codec_needs_queries(i4), 0);
    assert_int_equal(kvs_codec_query_window(i4), 0);
    assert_int_equal(kvs_codec_kept_channels(i4, 64), 64);
    kvs_codec_free(i4);

    expect_bad("think:ratio=1", "codec think: ratio=1 must be a number in [0, 1)");
    expect_bad("think:ratio=1.5", "codec think: ratio=1.5 must be a number in [0, 1)");
    expect_bad("think:ratio=-0.1", "codec think: ratio=-0.1 must be a number in [0, 1)");
    expect_bad("think:ratio=nan", "codec think: ratio=nan must be a number in [0, 1)");
    expect_bad("think:ratio=0.4x", "codec think: ratio=0.4x must be a number in [0, 1)");
    expect_bad("think:ratio=", "codec think: ratio has no value");
    expect_bad("think:window=0", "codec think: window=0 out of range [1, 16777216]");
    expect_bad("think:window=-3", "codec think: window=-3 out of range [1, 16777216]");
    expect_bad("think:recent=-1", "codec think: recent=-1 out of range [0, 16777216]");
    expect_bad("think:bits=4", "codec think: unknown key 'bits' (keys: ratio, window, recent)");
    expect_bad("think:ratio=0.4,ratio=0.5", "codec think: ratio given twice");
}

static void test_call_errors(void **unused) {
    (void)unused;
    kvs_codec *c = parse_ok("think:ratio=0.5,window=4,recent=2");
    float k[8 * 4] = {0}, v[8 * 4] = {0}, q[8 * 4] = {0};
    kvs_codec_state *st = state_ok(c, 4, 8);
    /* no queries before a prefill of P > 0 */
    assert_int_equal(kvs_codec_state_prefill(st, k, v, 6), KVS_ERR_STATE);
    assert_string_equal(kvs_last_error(), "codec think:ratio=0.5,window=4,recent=2: prefill before "
                        "kvs_codec_state_prefill_queries (ThinK scores the key channels with the window's queries)");
    assert_int_equal(kvs_codec_state_prefill_queries(st, q, 3, 0), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_codec_state_prefill_queries(st, q, 9, 1), KVS_ERR_INVALID_ARG);
    q[5] = NAN; /* position 1 of 2 given: inside the window */
    assert_int_equal(kvs_codec_state_prefill_queries(st, q, 2, 1), KVS_ERR_RANGE);
    assert_string_equal(kvs_last_error(), "codec think:ratio=0.5,window=4,recent=2: non-finite window query at row 1 "
                        "channel 1");
    q[5] = 0.0f;
    /* fewer query positions than the window needs */
    ok(kvs_codec_state_prefill_queries(st, q, 3, 1));
    assert_int_equal(kvs_codec_state_prefill_queries(st, q, 3, 1), KVS_ERR_STATE);
    assert_int_equal(kvs_codec_state_prefill(st, k, v, 6), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "codec think:ratio=0.5,window=4,recent=2: queries of 3 positions, the "
                        "window needs min(window, P) = 4");
    kvs_codec_state_free(st);
    /* more query positions than the prompt has: queries past the prompt would be look-ahead */
    st = state_ok(c, 4, 8);
    ok(kvs_codec_state_prefill_queries(st, q, 5, 1));
    assert_int_equal(kvs_codec_state_prefill(st, k, v, 3), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "codec think:ratio=0.5,window=4,recent=2: queries of 5 positions for a "
                        "prompt of 3 (the window ends at the prompt's last position)");
    k[2] = INFINITY;
    assert_int_equal(kvs_codec_state_prefill(st, k, v, 5), KVS_ERR_RANGE);
    k[2] = 0.0f;
    ok(kvs_codec_state_prefill(st, k, v, 5));
    assert_int_equal(kvs_codec_state_prefill_queries(st, q, 5, 1), KVS_ERR_STATE);
    assert_string_equal(kvs_last_error(), "codec think:ratio=0.5,window=4,recent=2: queries after the prefill");
    kvs_codec_state_free(st);
    /* a prompt of 0 needs no queries */
    st = state_ok(c, 4, 8);
    ok(kvs_codec_state_prefill(st, k, v, 0));
    ok(kvs_codec_state_advance(st, k, v, 8));
    assert_int_equal(kvs_codec_state_quantized(st, KVS_CODEC_K), 0);
    kvs_codec_state_free(st);
    /* another codec takes no queries, and has no channel set */
    kvs_codec *i4 = parse_ok("int");
    st = state_ok(i4, 4, 8);
    assert_int_equal(kvs_codec_state_prefill_queries(st, q, 4, 1), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "codec int:bits=4,group=32,k_axis=token,v_axis=channel reads no queries "
                        "(kvs_codec_needs_queries is 0)");
    ok(kvs_codec_state_prefill(st, k, v, 4));
    assert_null(kvs_codec_state_kept(st));
    assert_null(kvs_codec_state_channel_scores(st));
    double s[4];
    uint8_t kp[4];
    assert_int_equal(kvs_codec_think_channels(i4, q, 4, 1, k, 4, 4, s, kp), KVS_ERR_INVALID_ARG);
    kvs_codec_state_free(st);
    kvs_codec_free(i4);
    kvs_codec_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_match_numpy),
        cmocka_unit_test(test_hand_example),
        cmocka_unit_test(test_restricted_dot_equals_zeroed_dot),
        cmocka_unit_test(test_time_rule),
        cmocka_unit_test(test_bytes_by_hand),
        cmocka_unit_test(test_specs),
        cmocka_unit_test(test_call_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
