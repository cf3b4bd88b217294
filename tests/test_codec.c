/* test_codec.c — sim/codec.c, the KV codec core: every codec against the NumPy reference's fixtures
 * (tests/fixtures/codec/, tools/gen_codec_fixtures.py: KIVI's Algorithm 1, transformers' QuantizedLayer.update, a
 * cache written per position, fp8 by a table of all codes), bit for bit at every step; fp8 rounding against the
 * table; small examples computed by hand; the time rule (a position's representation at step n does not depend on
 * positions >= n); incremental and one-jump states agree; byte counts by hand and by a second count; bad specs and
 * calls rejected with their exact status and message.
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

/* spec is rejected with KVS_ERR_INVALID_ARG and exactly msg (any message when msg is NULL) */
static void expect_bad(const char *spec, const char *msg) { assert_true(kvs_test_codec_rejects(spec, msg)); }

static uint32_t bits_of(float f) { return kvs_f32_bits(f); }

static void fill_kv(kvs_rng *r, float *k, float *v, int64_t n, int64_t d) {
    for (int64_t i = 0; i < n * d; i++) {
        /* per-channel offsets in K (what token-axis groups are for), per-token scales in V */
        k[i] = (float)((kvs_rng_open01(r) - 0.5) * 4.0 + (double)(i % d) * 0.7);
        v[i] = (float)((kvs_rng_open01(r) - 0.5) * (1.0 + (double)((i / d) % 5)));
    }
}

/* ---- fixtures --------------------------------------------------------------------------------------------- */

typedef struct {
    char name[64], spec[KVS_CODEC_SPEC_MAX];
    int64_t N, d, P, H;
    float *in[8][2], *out[8][2]; /* [head][K|V] [N][d] */
    float scale[8][2];
    int has_scale;
    int64_t *steps; /* [N][2]: q_K, q_V after step n = i + 1 */
} fixture_case;

static void case_free(fixture_case *fc) {
    for (int h = 0; h < 8; h++)
        for (int t = 0; t < 2; t++) {
            free(fc->in[h][t]);
            free(fc->out[h][t]);
        }
    free(fc->steps);
    memset(fc, 0, sizeof *fc);
}

/* Reads n hex words from *p into a new array. */
static float *read_hex(char **p, int64_t n) {
    float *a = kvs_test_hex_floats(p, n);
    assert_non_null(a);
    return a;
}

/* Parses the next case of a fixture file from *cursor (NUL-terminated text); 0 at the end. */
static int next_case(char **cursor, fixture_case *fc) {
    memset(fc, 0, sizeof *fc);
    for (char *line; (line = kvs_test_fixture_line(cursor)) != NULL;) {
        if (strncmp(line, "case ", 5) == 0) {
            long long N, d, P, H;
            assert_int_equal(sscanf(line + 5, "%63s %127s %lld %lld %lld %lld", fc->name, fc->spec, &N, &d, &P, &H), 6);
            fc->N = N, fc->d = d, fc->P = P, fc->H = H;
            assert_true(H >= 1 && H <= 8);
        } else if (strncmp(line, "in ", 3) == 0 || strncmp(line, "out ", 4) == 0) {
            int is_out = line[0] == 'o';
            char *q = line + (is_out ? 4 : 3);
            int h = (int)strtol(q, &q, 10);
            while (*q == ' ') q++;
            int t = *q == 'k' ? 0 : 1;
            q++;
            float *a = read_hex(&q, fc->N * fc->d);
            if (is_out)
                fc->out[h][t] = a;
            else
                fc->in[h][t] = a;
        } else if (strncmp(line, "scale ", 6) == 0) {
            char *q = line + 6;
            int h = (int)strtol(q, &q, 10);
            float *a = read_hex(&q, 2);
            fc->scale[h][0] = a[0];
            fc->scale[h][1] = a[1];
            fc->has_scale = 1;
            free(a);
        } else if (strncmp(line, "steps ", 6) == 0) {
            char *q = line + 6;
            fc->steps = malloc((size_t)fc->N * 2 * sizeof(int64_t));
            assert_non_null(fc->steps);
            for (int64_t i = 0; i < 2 * fc->N; i++) fc->steps[i] = strtoll(q, &q, 10);
        } else if (strcmp(line, "end") == 0) {
            return 1;
        } else {
            fail_msg("fixture: unexpected line '%.40s'", line);
        }
    }
    return 0;
}

static char *slurp_fixture(const char *file) {
    char *text = kvs_test_codec_fixture(file);
    assert_non_null(text);
    return text;
}

/* Runs one fixture case: prefill, shared scale, then every decode step, checking q(n) and every row bitwise. */
static void run_case(const fixture_case *fc) {
    kvs_codec *c = parse_ok(fc->spec);
    assert_string_equal(kvs_codec_spec(c), fc->spec); /* the generator writes canonical specs */
    kvs_codec_state *st[8] = {0};
    for (int h = 0; h < fc->H; h++) {
        assert_int_equal(kvs_codec_state_create(c, fc->d, fc->N, &st[h]), KVS_OK);
        assert_int_equal(kvs_codec_state_prefill(st[h], fc->in[h][0], fc->in[h][1], fc->P), KVS_OK);
    }
    assert_int_equal(kvs_codec_share_scale(st, (int)fc->H), KVS_OK);
    for (int h = 0; h < fc->H; h++) {
        if (fc->has_scale) {
            assert_int_equal(bits_of(kvs_codec_state_scale(st[h], KVS_CODEC_K)), bits_of(fc->scale[h][0]));
            assert_int_equal(bits_of(kvs_codec_state_scale(st[h], KVS_CODEC_V)), bits_of(fc->scale[h][1]));
        }
        for (int64_t n = fc->P; n <= fc->N; n++) {
            if (n > fc->P) assert_int_equal(kvs_codec_state_advance(st[h], fc->in[h][0], fc->in[h][1], n), KVS_OK);
            for (int t = 0; t < 2; t++) {
                int64_t q = n ? fc->steps[(n - 1) * 2 + t] : 0;
                int64_t got = kvs_codec_state_quantized(st[h], (kvs_codec_tensor)t);
                if (got != q) fail_msg("%s head %d %s step %lld: q = %lld, reference %lld", fc->name, h, t ? "V" : "K",
                                       (long long)n, (long long)got, (long long)q);
                const float *rows = kvs_codec_state_rows(st[h], (kvs_codec_tensor)t);
                for (int64_t i = 0; i < n * fc->d; i++) {
                    float want = i / fc->d < q ? fc->out[h][t][i] : fc->in[h][t][i];
                    if (bits_of(rows[i]) != bits_of(want))
                        fail_msg("%s head %d %s step %lld position %lld channel %lld: %.9g, reference %.9g", fc->name,
                                 h, t ? "V" : "K", (long long)n, (long long)(i / fc->d), (long long)(i % fc->d),
                                 (double)rows[i], (double)want);
                }
            }
        }
        kvs_codec_state_free(st[h]);
    }
    kvs_codec_free(c);
}

static void run_fixture_file(const char *file, int min_cases) {
    char *text = slurp_fixture(file);
    char *cursor = text;
    fixture_case fc;
    int n = 0;
    while (next_case(&cursor, &fc)) {
        run_case(&fc);
        case_free(&fc);
        n++;
    }
    free(text);
    assert_true(n >= min_cases); /* the file was read, not skipped */
}

static void test_int_matches_reference(void **state) {
    (void)state;
    run_fixture_file("int.txt", 17);
}

static void test_kivi_matches_algorithm_1(void **state) {
    (void)state;
    run_fixture_file("kivi.txt", 8);
}

static void test_hf_matches_quantized_cache_update(void **state) {
    (void)state;
    run_fixture_file("hf.txt", 6);
}

static void test_fp8_matches_reference(void **state) {
    (void)state;
    run_fixture_file("fp8.txt", 8);
}

static void test_fp8_rounding_matches_table(void **state) {
    (void)state;
    char *text = slurp_fixture("fp8_round.txt");
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        unsigned x, e4, e5;
        assert_int_equal(sscanf(line, "%x %x %x", &x, &e4, &e5), 3);
        float fx = kvs_bits_f32(x);
        uint32_t g4 = bits_of(kvs_codec_fp8_round(fx, KVS_CODEC_E4M3));
        uint32_t g5 = bits_of(kvs_codec_fp8_round(fx, KVS_CODEC_E5M2));
        if (g4 != e4 || g5 != e5)
            fail_msg("fp8(%.9g): e4m3 %.9g (reference %.9g), e5m2 %.9g (reference %.9g)", (double)fx,
                     (double)kvs_bits_f32(g4), (double)kvs_bits_f32(e4), (double)kvs_bits_f32(g5),
                     (double)kvs_bits_f32(e5));
        n++;
    }
    free(text);
    assert_true(n > 1000);
}

/* ---- golden examples, by hand ----------------------------------------------------------------------------- */

static void test_int_group_golden(void **state) {
    (void)state;
    float out[4], s, z;
    /* 2 bits: range 3, scale 1, zero -1: (x - zero) / scale = 0, 1.2, 1.5, 3 -> 0, 1, 2 (1.5 to even), 3 */
    const float a[4] = {-1.0f, 0.2f, 0.5f, 2.0f};
    assert_int_equal(kvs_codec_quant_group(a, 1, 4, 2, out, &s, &z), KVS_OK);
    assert_true(s == 1.0f && z == -1.0f);
    const float a_want[4] = {-1.0f, 0.0f, 1.0f, 2.0f};
    assert_memory_equal(out, a_want, sizeof out);
    /* ties go to even both ways: 2.5 -> 2, 0.5 -> 0 */
    const float b[4] = {0.0f, 2.5f, 0.5f, 3.0f};
    assert_int_equal(kvs_codec_quant_group(b, 1, 4, 2, out, NULL, NULL), KVS_OK);
    const float b_want[4] = {0.0f, 2.0f, 0.0f, 3.0f};
    assert_memory_equal(out, b_want, sizeof out);
    /* 3 bits over [0, 1]: scale = fp16(1/7) = 1170 * 2^-13 = 0.142822265625; 1 / scale = 7.0017 -> 7;
     * xhat = 7 * 1170 * 2^-13 = 8190 * 2^-13 = 0.999755859375 (exact in fp32) */
    const float c2[2] = {0.0f, 1.0f};
    assert_int_equal(kvs_codec_quant_group(c2, 1, 2, 3, out, &s, &z), KVS_OK);
    assert_true(s == 0.142822265625f && z == 0.0f);
    assert_true(out[0] == 0.0f && out[1] == 0.999755859375f);
    /* an all-equal group: scale 0, every element the fp16 zero: 0.3 = 1.2 * 2^-2, 1.2 * 1024 = 1228.8 rounds to 1229:
     * fp16(0.3) = 1229 * 2^-12 = 0.300048828125 */
    const float e[4] = {0.3f, 0.3f, 0.3f, 0.3f};
    assert_int_equal(kvs_codec_quant_group(e, 1, 4, 4, out, &s, &z), KVS_OK);
    assert_true(s == 0.0f && z == 0.300048828125f);
    for (int i = 0; i < 4; i++) assert_true(out[i] == 0.300048828125f);
    /* a strided group (a token-axis column): only every 3rd element is touched */
    float col[9] = {4.0f, 9.0f, 9.0f, 0.0f, 9.0f, 9.0f, 1.0f, 9.0f, 9.0f};
    assert_int_equal(kvs_codec_quant_group(col, 3, 3, 2, col, NULL, NULL), KVS_OK);
    /* range 4, scale fp16(4/3) = 1365 * 2^-10 = 1.3330078125; 1 / s = 0.750 -> 1; 4 / s = 3.0007 -> 3 */
    assert_true(col[0] == 3.0f * 1.3330078125f && col[3] == 0.0f && col[6] == 1.3330078125f);
    assert_true(col[1] == 9.0f && col[2] == 9.0f && col[4] == 9.0f && col[8] == 9.0f);
    /* errors */
    assert_int_equal(kvs_codec_quant_group(a, 1, 4, 5, out, NULL, NULL), KVS_ERR_INVALID_ARG);
    const float inf_row[2] = {0.0f, INFINITY};
    assert_int_equal(kvs_codec_quant_group(inf_row, 1, 2, 4, out, NULL, NULL), KVS_ERR_RANGE);
    const float big[2] = {-70000.0f, 1.0f};
    assert_int_equal(kvs_codec_quant_group(big, 1, 2, 4, out, NULL, NULL), KVS_ERR_RANGE);
    assert_string_equal(kvs_last_error(), "minimum -70000 does not fit fp16");
}

static void test_fp8_golden(void **state) {
    (void)state;
    const kvs_codec_fp8_format E4 = KVS_CODEC_E4M3, E5 = KVS_CODEC_E5M2;
    assert_true(kvs_codec_fp8_max(E4) == 448.0f && kvs_codec_fp8_max(E5) == 57344.0f);
    /* 0.1: e4m3 spacing at [2^-4, 2^-3) is 2^-7: 12.8 -> 13 * 2^-7 = 0.1015625; e5m2 spacing 2^-6: 6.4 -> 0.09375 */
    assert_true(kvs_codec_fp8_round(0.1f, E4) == 0.1015625f);
    assert_true(kvs_codec_fp8_round(0.1f, E5) == 0.09375f);
    assert_true(kvs_codec_fp8_round(-0.1f, E4) == -0.1015625f);
    /* ties to even: 1.0625 between 1.0 (mantissa 000) and 1.125 (001) -> 1.0; 1.1875 -> 1.25 (010) */
    assert_true(kvs_codec_fp8_round(1.0625f, E4) == 1.0f);
    assert_true(kvs_codec_fp8_round(1.1875f, E4) == 1.25f);
    /* saturation, infinities included */
    assert_true(kvs_codec_fp8_round(500.0f, E4) == 448.0f);
    assert_true(kvs_codec_fp8_round(-INFINITY, E4) == -448.0f);
    assert_true(kvs_codec_fp8_round(1e6f, E5) == 57344.0f);
    assert_true(kvs_codec_fp8_round(447.0f, E4) == 448.0f); /* 416 and 448 are neighbours: 447 is nearer 448 */
    /* subnormals: e4m3's smallest is 2^-9; 2^-10 is a tie with 0 -> 0; 3 * 2^-10 ties 2^-9 (odd) and 2^-8 -> 2^-8 */
    assert_true(kvs_codec_fp8_round(0x1p-10f, E4) == 0.0f);
    assert_true(kvs_codec_fp8_round(0x3p-10f, E4) == 0x1p-8f);
    assert_true(kvs_codec_fp8_round(0x1p-16f, E5) == 0x1p-16f);
    assert_true(kvs_codec_fp8_round(0x1p-17f, E5) == 0.0f);
    assert_true(signbit(kvs_codec_fp8_round(-0.0f, E4)));
    assert_true(isnan(kvs_codec_fp8_round(NAN, E4)));
}

/* ---- specs -------------------------------------------------------------------------------------------------- */

static void test_specs_canonical(void **state) {
    (void)state;
    const char *pairs[][2] = {
        {"int", "int:bits=4,group=32,k_axis=token,v_axis=channel"},
        {"int:v_axis=token,bits=8", "int:bits=8,group=32,k_axis=token,v_axis=token"},
        {"kivi", "kivi:bits=2,group=32,residual=128"},
        {"kivi:bits=4,group=16,residual=32", "kivi:bits=4,group=16,residual=32"},
        {"hf", "hf:bits=4,group=64,residual=128"},
        {"fp8", "fp8:format=e4m3,scale=1,per=tensor"},
        {"fp8:scale=0.1,format=e5m2", "fp8:format=e5m2,scale=0.1,per=tensor"},
        {"fp8:scale=2.50", "fp8:format=e4m3,scale=2.5,per=tensor"},
        {"fp8:scale=prompt,per=head", "fp8:format=e4m3,scale=prompt,per=head"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        kvs_codec *c = parse_ok(pairs[i][0]);
        assert_string_equal(kvs_codec_spec(c), pairs[i][1]);
        kvs_codec *c2 = parse_ok(kvs_codec_spec(c)); /* the canonical spec parses to itself */
        assert_string_equal(kvs_codec_spec(c2), pairs[i][1]);
        kvs_codec_free(c2);
        kvs_codec_free(c);
    }
    kvs_codec *c = parse_ok("kivi");
    assert_int_equal(kvs_codec_kind_of(c), KVS_CODEC_KIVI);
    kvs_codec_free(c);
    kvs_codec_free(NULL);
    kvs_codec_state_free(NULL);
}

/* The spec checks the tests above rely on (tests/util/codec_fixture.h) tell a wrong answer: a spec that parses, a
 * different message, a spec that does not parse. */
static void test_spec_checks_report_failures(void **state) {
    (void)state;
    assert_false(kvs_test_codec_rejects("int", NULL));
    assert_false(kvs_test_codec_rejects("int4", "codec: some other message"));
    assert_true(kvs_test_codec_rejects("int4", NULL));
    assert_null(kvs_test_codec_parse("int4"));
    kvs_codec *c = kvs_test_codec_parse("kivi");
    assert_non_null(c);
    kvs_codec_free(c);
}

static void test_bad_specs_rejected(void **state) {
    (void)state;
    expect_bad("", "codec: empty spec (one of int, kivi, hf, fp8, think [:key=value,...])");
    expect_bad(NULL, "codec: empty spec (one of int, kivi, hf, fp8, think [:key=value,...])");
    expect_bad("int4", "codec: unknown codec 'int4' (one of int, kivi, hf, fp8, think)");
    expect_bad("int:", "codec int: empty parameter list after ':'");
    expect_bad("int:bits=4,", "codec int: empty parameter in 'int:bits=4,'");
    expect_bad("int:bits", "codec int: 'bits' is not key=value");
    expect_bad("int:bits=", "codec int: bits has no value");
    expect_bad("int:bits=5", "codec int: bits=5 not one of {2,3,4,8}");
    expect_bad("int:bits=4x", "codec int: bits=4x is not a whole number");
    expect_bad("int:bits=+4", "codec int: bits=+4 is not a whole number");
    expect_bad("int:bits=4,bits=4", "codec int: bits given twice");
    expect_bad("int:group=0", "codec int: group=0 out of range [1, 65536]");
    expect_bad("int:k_axis=diag", "codec int: k_axis=diag is not one of token|channel");
    expect_bad("int:residual=8", "codec int: unknown key 'residual' (keys: bits, group, k_axis, v_axis)");
    expect_bad("kivi:bits=3", "codec kivi: bits=3 not one of {2,4}");
    expect_bad("kivi:residual=100", "codec kivi: residual=100 must be a multiple of group=32");
    expect_bad("kivi:residual=16", "codec kivi: residual=16 must be a multiple of group=32");
    expect_bad("hf:residual=1", "codec hf: residual=1 out of range [2, 16777216]");
    expect_bad("hf:bits=8", "codec hf: bits=8 not one of {2,4}");
    expect_bad("fp8:format=e4m3fnuz", "codec fp8: format=e4m3fnuz is not one of e4m3|e5m2");
    expect_bad("fp8:scale=0", "codec fp8: scale=0 must be a positive number (fp32, finite) or 'prompt'");
    expect_bad("fp8:scale=-1", NULL);
    expect_bad("fp8:scale=nan", NULL);
    expect_bad("fp8:scale=1e39", NULL); /* finite as a double, not as the fp32 scale */
    expect_bad("fp8:scale=1e-50", NULL);
    expect_bad("fp8:per=head", "codec fp8: per=head needs scale=prompt (a number is one scale for every head)");
    kvs_codec *c = NULL;
    assert_int_equal(kvs_codec_parse("int", NULL), KVS_ERR_INVALID_ARG);
    assert_null(c);
}

/* ---- the time rule ------------------------------------------------------------------------------------------ */

static const char *ALL_SPECS[] = {
    "int:bits=2,group=4,k_axis=token,v_axis=channel", "int:bits=3,group=5,k_axis=channel,v_axis=token",
    "int:bits=8,group=3,k_axis=token,v_axis=token",   "kivi:bits=2,group=3,residual=6",
    "kivi:bits=4,group=4,residual=4",                 "hf:bits=4,group=4,residual=5",
    "hf:bits=2,group=64,residual=2",                  "fp8:format=e4m3,scale=1,per=tensor",
    "fp8:format=e5m2,scale=prompt,per=head",
};
#define N_ALL_SPECS (sizeof ALL_SPECS / sizeof ALL_SPECS[0])

/* A position's representation at step n depends only on positions < n: a second state gets, at every step, rows
 * whose positions >= n are scrambled (NaN and huge values, which would fail or show if read), and must give the
 * same rows bit for bit. */
static void test_time_rule_no_future_reads(void **state) {
    (void)state;
    const int64_t N = 41, d = 7, P = 11;
    float *k = malloc(N * d * sizeof(float)), *v = malloc(N * d * sizeof(float));
    float *k2 = malloc(N * d * sizeof(float)), *v2 = malloc(N * d * sizeof(float));
    assert_true(k && v && k2 && v2);
    kvs_rng r;
    kvs_rng_seed(&r, 11, 3);
    fill_kv(&r, k, v, N, d);
    for (size_t s = 0; s < N_ALL_SPECS; s++) {
        kvs_codec *c = parse_ok(ALL_SPECS[s]);
        kvs_codec_state *a = NULL, *b = NULL;
        assert_int_equal(kvs_codec_state_create(c, d, N, &a), KVS_OK);
        assert_int_equal(kvs_codec_state_create(c, d, N, &b), KVS_OK);
        assert_int_equal(kvs_codec_state_prefill(a, k, v, P), KVS_OK);
        memcpy(k2, k, P * d * sizeof(float));
        memcpy(v2, v, P * d * sizeof(float));
        for (int64_t i = P * d; i < N * d; i++) k2[i] = v2[i] = (i % 2) ? NAN : 1e30f;
        assert_int_equal(kvs_codec_state_prefill(b, k2, v2, P), KVS_OK);
        for (int64_t n = P + 1; n <= N; n++) {
            memcpy(k2, k, n * d * sizeof(float));
            memcpy(v2, v, n * d * sizeof(float));
            for (int64_t i = n * d; i < N * d; i++) {
                k2[i] = (i % 3) ? NAN : -1e30f;
                v2[i] = (i % 3) ? 1e30f : NAN;
            }
            assert_int_equal(kvs_codec_state_advance(a, k, v, n), KVS_OK);
            kvs_status rc = kvs_codec_state_advance(b, k2, v2, n);
            if (rc != KVS_OK) fail_msg("%s step %lld: %s", ALL_SPECS[s], (long long)n, kvs_last_error());
            for (int t = 0; t < 2; t++)
                assert_memory_equal(kvs_codec_state_rows(a, (kvs_codec_tensor)t),
                                    kvs_codec_state_rows(b, (kvs_codec_tensor)t), (size_t)(n * d) * sizeof(float));
        }
        kvs_codec_state_free(a);
        kvs_codec_state_free(b);
        kvs_codec_free(c);
    }
    free(k);
    free(v);
    free(k2);
    free(v2);
}

/* Advancing one step at a time, or jumping from the prefill straight to step n, gives the same rows: each group's
 * representation is a function of its own positions, quantized once when final. */
static void test_incremental_equals_one_jump(void **state) {
    (void)state;
    const int64_t N = 37, d = 9, P = 10;
    float *k = malloc(N * d * sizeof(float)), *v = malloc(N * d * sizeof(float));
    assert_true(k && v);
    kvs_rng r;
    kvs_rng_seed(&r, 5, 9);
    fill_kv(&r, k, v, N, d);
    for (size_t s = 0; s < N_ALL_SPECS; s++) {
        kvs_codec *c = parse_ok(ALL_SPECS[s]);
        kvs_codec_state *inc = NULL;
        assert_int_equal(kvs_codec_state_create(c, d, N, &inc), KVS_OK);
        assert_int_equal(kvs_codec_state_prefill(inc, k, v, P), KVS_OK);
        for (int64_t n = P + 1; n <= N; n++) {
            assert_int_equal(kvs_codec_state_advance(inc, k, v, n), KVS_OK);
            assert_int_equal(kvs_codec_state_advance(inc, k, v, n), KVS_OK); /* the same step again: nothing */
            kvs_codec_state *jump = NULL;
            assert_int_equal(kvs_codec_state_create(c, d, N, &jump), KVS_OK);
            assert_int_equal(kvs_codec_state_prefill(jump, k, v, P), KVS_OK);
            assert_int_equal(kvs_codec_state_advance(jump, k, v, n), KVS_OK);
            for (int t = 0; t < 2; t++) {
                assert_int_equal(kvs_codec_state_quantized(inc, (kvs_codec_tensor)t),
                                 kvs_codec_state_quantized(jump, (kvs_codec_tensor)t));
                assert_memory_equal(kvs_codec_state_rows(inc, (kvs_codec_tensor)t),
                                    kvs_codec_state_rows(jump, (kvs_codec_tensor)t), (size_t)(n * d) * sizeof(float));
            }
            kvs_codec_state_free(jump);
        }
        assert_int_equal(kvs_codec_state_step(inc), N);
        kvs_codec_state_free(inc);
        kvs_codec_free(c);
    }
    free(k);
    free(v);
}

/* The paper's and the library's defaults on a stories260K-sized stream (prompt 239, 495 positions): where the
 * quantized prefixes stand, from codec.h's rules worked by hand. */
static void test_default_schedules(void **state) {
    (void)state;
    const int64_t N = 495, d = 8, P = 239;
    float *k = calloc(N * d, sizeof(float)), *v = calloc(N * d, sizeof(float));
    assert_true(k && v);
    struct {
        const char *spec;
        int64_t n, qk, qv;
    } want[] = {
        /* kivi G=32 R=128: prefill leaves keys < 128 quantized (239 mod 128 = 111 in 16 bits), values < 239-128 */
        {"kivi", 240, 128, 111}, {"kivi", 256, 128, 127}, {"kivi", 257, 256, 128}, {"kivi", 495, 384, 366},
        /* hf R=128: the whole prompt at prefill, then flushes after positions 366 (239 + 127) and 494 */
        {"hf", 240, 239, 239},   {"hf", 367, 239, 239},   {"hf", 368, 367, 367},   {"hf", 495, 367, 367},
        /* int G=32: token-axis K in whole groups of 32, channel-axis V every position, the new one included */
        {"int", 240, 224, 240},  {"int", 256, 256, 256},  {"int", 495, 480, 495},
        {"fp8", 240, 240, 240},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        kvs_codec *c = parse_ok(want[i].spec);
        kvs_codec_state *st = NULL;
        assert_int_equal(kvs_codec_state_create(c, d, N, &st), KVS_OK);
        assert_int_equal(kvs_codec_state_prefill(st, k, v, P), KVS_OK);
        assert_int_equal(kvs_codec_state_quantized(st, KVS_CODEC_K), 0); /* prefill: full precision */
        assert_int_equal(kvs_codec_state_advance(st, k, v, want[i].n), KVS_OK);
        if (kvs_codec_state_quantized(st, KVS_CODEC_K) != want[i].qk ||
            kvs_codec_state_quantized(st, KVS_CODEC_V) != want[i].qv)
            fail_msg("%s at step %lld: q = %lld, %lld; want %lld, %lld", want[i].spec, (long long)want[i].n,
                     (long long)kvs_codec_state_quantized(st, KVS_CODEC_K),
                     (long long)kvs_codec_state_quantized(st, KVS_CODEC_V), (long long)want[i].qk, (long long)want[i].qv);
        kvs_codec_state_free(st);
        kvs_codec_free(c);
    }
    free(k);
    free(v);
}

/* ---- bytes -------------------------------------------------------------------------------------------------- */

static kvs_codec_state *state_at(const kvs_codec *c, int64_t d, int64_t N, int64_t P, int64_t n, float *k, float *v) {
    kvs_codec_state *st = NULL;
    assert_int_equal(kvs_codec_state_create(c, d, N, &st), KVS_OK);
    assert_int_equal(kvs_codec_state_prefill(st, k, v, P), KVS_OK);
    if (n > P) assert_int_equal(kvs_codec_state_advance(st, k, v, n), KVS_OK);
    return st;
}

static void test_bytes_by_hand(void **state) {
    (void)state;
    const int64_t N = 64, d = 8;
    float *k = malloc(N * d * sizeof(float)), *v = malloc(N * d * sizeof(float));
    assert_true(k && v);
    kvs_rng r;
    kvs_rng_seed(&r, 1, 2);
    fill_kv(&r, k, v, N, d);
    int64_t all[64];
    for (int i = 0; i < 64; i++) all[i] = i;
    kvs_codec_bytes b;

    /* int 4 bits, groups of 4, K token-axis, V channel-axis, no prompt, step 10, everything resident:
     * K: positions 0..7 quantized (2 groups): codes 8 x 8 x 1/2 = 32, scale/zero 2 groups x 8 channels x 4 = 64;
     *    positions 8, 9 in 16 bits: 2 x 8 x 2 = 32.  V: every position: codes 10 x 4 = 40, 10 rows x 2 groups x 4 = 80.
     *    Total 248. */
    kvs_codec *c = parse_ok("int:bits=4,group=4,k_axis=token,v_axis=channel");
    kvs_codec_state *st = state_at(c, d, N, 0, 10, k, v);
    assert_int_equal(kvs_codec_state_bytes(st, all, 10, &b), KVS_OK);
    assert_true(b.k_codes == 32 && b.k_meta == 64 && b.k_full == 32);
    assert_true(b.v_codes == 40 && b.v_meta == 80 && b.v_full == 0 && b.scale == 0);
    assert_true(b.total == 248);
    /* resident {9, 0, 5}: K codes 2 x 4 = 8, both groups still hold a position: 64, position 9: 16 -> 88;
     * V: 3 x 4 + 3 x 8 = 36. Total 124. Evicting 5 as well frees group 1's 32 bytes of K scales: 124 - 4 - 32 - 12. */
    const int64_t some[3] = {9, 0, 5};
    assert_int_equal(kvs_codec_state_bytes(st, some, 3, &b), KVS_OK);
    assert_true(b.k_codes == 8 && b.k_meta == 64 && b.k_full == 16 && b.v_codes == 12 && b.v_meta == 24);
    assert_true(b.total == 124);
    assert_int_equal(kvs_codec_state_bytes(st, some, 2, &b), KVS_OK);
    assert_true(b.total == 124 - 4 - 32 - 12);
    /* errors: repeated, out of range (position 10 does not exist at step 10) */
    const int64_t dup[2] = {3, 3}, far[1] = {10};
    assert_int_equal(kvs_codec_state_bytes(st, dup, 2, &b), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(),
                        "codec int:bits=4,group=4,k_axis=token,v_axis=channel: resident position 3 listed twice");
    assert_int_equal(kvs_codec_state_bytes(st, far, 1, &b), KVS_ERR_INVALID_ARG);
    kvs_codec_state_free(st);
    kvs_codec_free(c);

    /* 3 bits pack at 3/8 byte an element: d = 8, channel axis groups of 3 (3, 3, 2): codes 3 bytes, 3 x 4 = 12 */
    c = parse_ok("int:bits=3,group=3,k_axis=channel,v_axis=channel");
    st = state_at(c, d, N, 0, 1, k, v);
    assert_int_equal(kvs_codec_state_bytes(st, all, 1, &b), KVS_OK);
    assert_true(b.k_codes == 3 && b.k_meta == 12 && b.total == 30);
    kvs_codec_state_free(st);
    kvs_codec_free(c);

    /* kivi 2 bits, G = 2, R = 4, prompt 9, at step 10 (query 9): keys < 8 quantized, values < 5.
     * K: codes 8 x 8 x 1/4 = 16, 4 groups x 8 x 4 = 128, positions 8, 9 in 16 bits: 32 -> 176.
     * V: codes 5 x 2 = 10, 5 rows x 4 groups (of 2 channels) x 4 = 80, positions 5..9: 5 x 16 = 80 -> 170. */
    c = parse_ok("kivi:bits=2,group=2,residual=4");
    st = state_at(c, d, N, 9, 10, k, v);
    assert_int_equal(kvs_codec_state_bytes(st, all, 10, &b), KVS_OK);
    assert_true(b.k_codes == 16 && b.k_meta == 128 && b.k_full == 32);
    assert_true(b.v_codes == 10 && b.v_meta == 80 && b.v_full == 80);
    assert_true(b.total == 346);
    kvs_codec_state_free(st);
    /* at the prefill's step every row is as captured: 2 x 9 x 8 x 2 */
    st = state_at(c, d, N, 9, 9, k, v);
    assert_int_equal(kvs_codec_state_bytes(st, all, 9, &b), KVS_OK);
    assert_true(b.k_full == 144 && b.v_full == 144 && b.total == 288);
    kvs_codec_state_free(st);
    kvs_codec_free(c);

    /* fp8 per head: 1 byte an element and 8 bytes of scales; at step 12 with 3 resident: 2 x 3 x 8 + 8 = 56 */
    c = parse_ok("fp8:scale=prompt,per=head");
    st = state_at(c, d, N, 6, 12, k, v);
    assert_int_equal(kvs_codec_state_bytes(st, some, 3, &b), KVS_OK);
    assert_true(b.k_codes == 24 && b.v_codes == 24 && b.scale == 8 && b.total == 56);
    assert_true(kvs_codec_layer_bytes(c) == 0);
    kvs_codec_state_free(st);
    kvs_codec_free(c);
    c = parse_ok("fp8:scale=prompt");
    assert_true(kvs_codec_layer_bytes(c) == 8);
    kvs_codec_free(c);
    free(k);
    free(v);
}

static void test_position_bytes_nominal(void **state) {
    (void)state;
    /* d = 128. int 4-bit G 32: K 64 codes + 128 x 4 / 32 = 16; V 64 + 4 groups x 4 = 16 -> 160 (of 512 in fp16) */
    struct {
        const char *spec;
        double want;
    } w[] = {{"int", 160}, {"kivi", 96}, {"hf", 144}, {"fp8", 256}, {"int:bits=3,group=128", 96 + 4 + 4}};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        kvs_codec *c = parse_ok(w[i].spec);
        assert_true(kvs_codec_position_bytes(c, 128) == w[i].want);
        kvs_codec_free(c);
    }
    /* the nominal figure is what a stream of whole quantized groups measures per position */
    const int64_t N = 64, d = 16;
    float *k = malloc(N * d * sizeof(float)), *v = malloc(N * d * sizeof(float));
    kvs_rng r;
    kvs_rng_seed(&r, 8, 8);
    fill_kv(&r, k, v, N, d);
    int64_t all[64];
    for (int i = 0; i < 64; i++) all[i] = i;
    const char *specs[] = {"int:bits=2,group=8", "int:bits=8,group=16,k_axis=channel,v_axis=token", "fp8"};
    for (size_t i = 0; i < 3; i++) {
        kvs_codec *c = parse_ok(specs[i]);
        kvs_codec_state *st = state_at(c, d, N, 0, 64, k, v);
        kvs_codec_bytes b;
        assert_int_equal(kvs_codec_state_bytes(st, all, 64, &b), KVS_OK);
        assert_true(b.k_full == 0 && b.v_full == 0);
        assert_true(fabs(b.total / 64 - kvs_codec_position_bytes(c, d)) < 1e-12);
        kvs_codec_state_free(st);
        kvs_codec_free(c);
    }
    free(k);
    free(v);
}

/* kvs_codec_state_bytes against a second count: per position its codes or 16-bit row, per token-axis group a scan
 * of the resident list for any member, per channel-axis row its groups, over random resident sets of every codec. */
static void test_bytes_second_count(void **state) {
    (void)state;
    const int64_t N = 50, d = 6, P = 13;
    float *k = malloc(N * d * sizeof(float)), *v = malloc(N * d * sizeof(float));
    kvs_rng r;
    kvs_rng_seed(&r, 3, 4);
    fill_kv(&r, k, v, N, d);
    int64_t pos[50];
    for (size_t s = 0; s < N_ALL_SPECS; s++) {
        kvs_codec *c = parse_ok(ALL_SPECS[s]);
        const char *spec = kvs_codec_spec(c);
        int bits = 0, group = 1;
        const char *bp = strstr(spec, "bits="), *gp = strstr(spec, "group=");
        if (bp) bits = atoi(bp + 5);
        if (gp) group = atoi(gp + 6);
        int fp8 = kvs_codec_kind_of(c) == KVS_CODEC_FP8;
        int token_axis[2] = {strstr(spec, "k_axis=token") != NULL || kvs_codec_kind_of(c) == KVS_CODEC_KIVI,
                             strstr(spec, "v_axis=token") != NULL};
        for (int64_t n = P; n <= N; n += 3) {
            kvs_codec_state *st = state_at(c, d, N, P, n, k, v);
            for (int trial = 0; trial < 4; trial++) {
                int64_t m = 0;
                for (int64_t p = n - 1; p >= 0; p--) /* descending: any order is allowed */
                    if (kvs_rng_u32(&r) % 3) pos[m++] = p;
                kvs_codec_bytes b;
                assert_int_equal(kvs_codec_state_bytes(st, pos, m, &b), KVS_OK);
                double want = fp8 && strstr(spec, "per=head") ? 8.0 : 0.0;
                for (int t = 0; t < 2; t++) {
                    int64_t q = kvs_codec_state_quantized(st, (kvs_codec_tensor)t);
                    for (int64_t i = 0; i < m; i++) {
                        if (pos[i] >= q) {
                            want += 2.0 * d;
                        } else if (fp8) {
                            want += d;
                        } else {
                            want += d * bits / 8.0;
                            if (!token_axis[t]) want += 4.0 * ((d + group - 1) / group);
                        }
                    }
                    if (!fp8 && token_axis[t])
                        for (int64_t g0 = 0; g0 < q; g0 += group) {
                            int any = 0;
                            for (int64_t i = 0; i < m; i++) any |= pos[i] >= g0 && pos[i] < g0 + group;
                            if (any) want += 4.0 * d;
                        }
                }
                if (b.total != want) fail_msg("%s step %lld: %g bytes, recount %g", spec, (long long)n, b.total, want);
            }
            kvs_codec_state_free(st);
        }
        kvs_codec_free(c);
    }
    free(k);
    free(v);
}

/* ---- calls out of order and bad data ------------------------------------------------------------------------ */

static void test_state_errors(void **state) {
    (void)state;
    const int64_t N = 20, d = 4;
    float k[80], v[80];
    for (int i = 0; i < 80; i++) k[i] = v[i] = (float)(i % 7) - 3.0f;
    kvs_codec *c = parse_ok("int:bits=4,group=4");
    kvs_codec_state *st = NULL;
    assert_int_equal(kvs_codec_state_create(c, 0, N, &st), KVS_ERR_INVALID_ARG);
    assert_null(st);
    assert_int_equal(kvs_codec_state_create(c, d, 0, &st), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_codec_state_create(c, d, N, &st), KVS_OK);
    assert_int_equal(kvs_codec_state_step(st), -1);
    assert_int_equal(kvs_codec_state_advance(st, k, v, 5), KVS_ERR_STATE);
    assert_string_equal(kvs_last_error(), "codec int:bits=4,group=4,k_axis=token,v_axis=channel: advance before the prefill");
    kvs_codec_bytes b;
    assert_int_equal(kvs_codec_state_bytes(st, NULL, 0, &b), KVS_ERR_STATE);
    assert_int_equal(kvs_codec_state_prefill(st, k, v, N + 1), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_codec_state_prefill(st, k, v, 5), KVS_OK);
    assert_int_equal(kvs_codec_state_prefill(st, k, v, 5), KVS_ERR_STATE);
    assert_int_equal(kvs_codec_state_advance(st, k, v, 9), KVS_OK);
    assert_int_equal(kvs_codec_state_advance(st, k, v, 8), KVS_ERR_STATE);
    assert_string_equal(kvs_last_error(), "codec int:bits=4,group=4,k_axis=token,v_axis=channel: step 8 after step 9 "
                                          "(positions arrive in order)");
    assert_int_equal(kvs_codec_state_advance(st, k, v, N + 1), KVS_ERR_INVALID_ARG);
    /* a non-finite row is an error naming its group, and leaves the state as it was */
    float kb[80];
    memcpy(kb, k, sizeof kb);
    kb[11 * d + 2] = INFINITY; /* position 11: its token-axis group 8..11 becomes final at step 12 */
    float before[2][48];
    memcpy(before[0], kvs_codec_state_rows(st, KVS_CODEC_K), sizeof before[0]);
    memcpy(before[1], kvs_codec_state_rows(st, KVS_CODEC_V), sizeof before[1]);
    assert_int_equal(kvs_codec_state_advance(st, kb, v, 12), KVS_ERR_RANGE);
    assert_string_equal(kvs_last_error(), "codec int:bits=4,group=4,k_axis=token,v_axis=channel: K group of positions "
                                          "8..11, channel 2: non-finite value inf");
    assert_int_equal(kvs_codec_state_step(st), 9);
    assert_int_equal(kvs_codec_state_quantized(st, KVS_CODEC_K), 8);
    assert_memory_equal(kvs_codec_state_rows(st, KVS_CODEC_K), before[0], 9 * d * sizeof(float));
    assert_memory_equal(kvs_codec_state_rows(st, KVS_CODEC_V), before[1], 9 * d * sizeof(float));
    assert_int_equal(kvs_codec_state_advance(st, k, v, 12), KVS_OK); /* good rows: on it goes */
    assert_int_equal(kvs_codec_state_quantized(st, KVS_CODEC_K), 12);
    /* a value beyond fp16 */
    float vb[80];
    memcpy(vb, v, sizeof vb);
    vb[13 * d] = 1e6f;
    assert_int_equal(kvs_codec_state_advance(st, k, vb, 14), KVS_ERR_RANGE);
    kvs_codec_state_free(st);
    kvs_codec_free(c);

    /* fp8 per tensor: the layer's scale must be shared before decoding, and only between the prefill and step 1 */
    c = parse_ok("fp8:scale=prompt,per=tensor");
    kvs_codec_state *h[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) assert_int_equal(kvs_codec_state_create(c, d, N, &h[i]), KVS_OK);
    assert_int_equal(kvs_codec_share_scale(h, 2), KVS_ERR_STATE); /* no prefill yet */
    float k2[80];
    for (int i = 0; i < 80; i++) k2[i] = k[i] * 100.0f;
    assert_int_equal(kvs_codec_state_prefill(h[0], k, v, 5), KVS_OK);
    assert_int_equal(kvs_codec_state_prefill(h[1], k2, v, 5), KVS_OK);
    assert_int_equal(kvs_codec_state_advance(h[0], k, v, 6), KVS_ERR_STATE);
    assert_int_equal(kvs_codec_share_scale(h, 2), KVS_OK);
    /* the prompt's amax is 300 in head 1's K (3 x 100), 3 in V: scale = amax / 448, the same for both heads */
    for (int i = 0; i < 2; i++) {
        assert_true(kvs_codec_state_scale(h[i], KVS_CODEC_K) == 300.0f / 448.0f);
        assert_true(kvs_codec_state_scale(h[i], KVS_CODEC_V) == 3.0f / 448.0f);
    }
    assert_int_equal(kvs_codec_state_advance(h[0], k, v, 6), KVS_OK);
    assert_int_equal(kvs_codec_share_scale(h, 2), KVS_ERR_STATE); /* head 0 has decoded */
    kvs_codec *other = parse_ok("fp8");
    kvs_codec_state *o = NULL;
    assert_int_equal(kvs_codec_state_create(other, d, N, &o), KVS_OK);
    kvs_codec_state *mixed[2] = {h[1], o};
    assert_int_equal(kvs_codec_share_scale(mixed, 2), KVS_ERR_INVALID_ARG);
    kvs_codec_state_free(o);
    kvs_codec_free(other);
    for (int i = 0; i < 2; i++) kvs_codec_state_free(h[i]);
    kvs_codec_free(c);

    /* a zero prompt calibrates to scale 1; an empty prompt too */
    c = parse_ok("fp8:scale=prompt,per=head");
    float z[80] = {0};
    assert_int_equal(kvs_codec_state_create(c, d, N, &st), KVS_OK);
    assert_int_equal(kvs_codec_state_prefill(st, z, z, 4), KVS_OK);
    assert_true(kvs_codec_state_scale(st, KVS_CODEC_K) == 1.0f);
    kvs_codec_state_free(st);
    assert_int_equal(kvs_codec_state_create(c, d, N, &st), KVS_OK);
    assert_int_equal(kvs_codec_state_prefill(st, NULL, NULL, 0), KVS_OK);
    assert_int_equal(kvs_codec_state_advance(st, k, v, 3), KVS_OK);
    assert_int_equal(kvs_codec_state_quantized(st, KVS_CODEC_V), 3);
    kvs_codec_state_free(st);
    kvs_codec_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int_matches_reference),
        cmocka_unit_test(test_kivi_matches_algorithm_1),
        cmocka_unit_test(test_hf_matches_quantized_cache_update),
        cmocka_unit_test(test_fp8_matches_reference),
        cmocka_unit_test(test_fp8_rounding_matches_table),
        cmocka_unit_test(test_int_group_golden),
        cmocka_unit_test(test_fp8_golden),
        cmocka_unit_test(test_specs_canonical),
        cmocka_unit_test(test_bad_specs_rejected),
        cmocka_unit_test(test_spec_checks_report_failures),
        cmocka_unit_test(test_time_rule_no_future_reads),
        cmocka_unit_test(test_incremental_equals_one_jump),
        cmocka_unit_test(test_default_schedules),
        cmocka_unit_test(test_bytes_by_hand),
        cmocka_unit_test(test_position_bytes_nominal),
        cmocka_unit_test(test_bytes_second_count),
        cmocka_unit_test(test_state_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
