/* test_json.c — tests of the strict RFC 8259 JSON parser (common/json.h): values, escapes and
 * surrogate pairs, numbers, big-object lookup, every class of malformed input with its exact status and
 * message, and a fuzz of random truncations and byte flips (must never crash; run under ASan by
 * `make asan`).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/json.h"

static kvs_json *parse_ok(const char *s) {
    kvs_json *j = NULL;
    kvs_status st = kvs_json_parse(s, strlen(s), &j);
    if (st != KVS_OK) fprintf(stderr, "unexpected parse failure of %s: %s\n", s, kvs_last_error());
    assert_int_equal(st, KVS_OK);
    assert_non_null(j);
    return j;
}

static void expect_fail(const char *s, size_t len, const char *msg_part) {
    kvs_json *j = (kvs_json *)1;
    kvs_clear_error();
    kvs_status st = kvs_json_parse(s, len, &j);
    assert_int_equal(st, KVS_ERR_FORMAT);
    assert_null(j);
    if (!strstr(kvs_last_error(), msg_part)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", kvs_last_error(), msg_part);
        fail();
    }
}

static void test_parses_scalars_and_containers(void **state) {
    (void)state;
    kvs_json *j = parse_ok(" {\"a\": [1, -2.5e3, true, false, null, \"x\"], \"b\": {}, \"c\": []} ");
    assert_int_equal(kvs_json_type_of(j), KVS_JSON_OBJECT);
    assert_int_equal(kvs_json_len(j), 3);
    assert_string_equal(kvs_json_key_at(j, 0), "a");
    assert_string_equal(kvs_json_key_at(j, 2), "c");
    const kvs_json *a = kvs_json_get(j, "a");
    assert_int_equal(kvs_json_type_of(a), KVS_JSON_ARRAY);
    assert_int_equal(kvs_json_len(a), 6);
    assert_true(kvs_json_number(kvs_json_at(a, 0)) == 1.0);
    assert_true(kvs_json_number(kvs_json_at(a, 1)) == -2500.0);
    assert_int_equal(kvs_json_type_of(kvs_json_at(a, 2)), KVS_JSON_BOOL);
    assert_int_equal(kvs_json_bool(kvs_json_at(a, 2)), 1);
    assert_int_equal(kvs_json_bool(kvs_json_at(a, 3)), 0);
    assert_int_equal(kvs_json_type_of(kvs_json_at(a, 4)), KVS_JSON_NULL);
    assert_string_equal(kvs_json_string(kvs_json_at(a, 5)), "x");
    assert_null(kvs_json_at(a, 6));
    assert_int_equal(kvs_json_type_of(kvs_json_get(j, "b")), KVS_JSON_OBJECT);
    assert_int_equal(kvs_json_len(kvs_json_get(j, "b")), 0);
    assert_null(kvs_json_get(j, "zz"));
    assert_null(kvs_json_get(a, "a")); /* not an object */
    assert_null(kvs_json_string(a));
    assert_true(kvs_json_number(a) == 0.0);
    kvs_json_free(j);
    kvs_json_free(NULL);

    j = parse_ok("42");
    assert_int_equal(kvs_json_type_of(j), KVS_JSON_NUMBER);
    assert_true(kvs_json_number(j) == 42.0);
    kvs_json_free(j);
    j = parse_ok("\"top\"");
    assert_string_equal(kvs_json_string(j), "top");
    kvs_json_free(j);
    j = parse_ok("\xEF\xBB\xBF[]"); /* UTF-8 BOM skipped */
    assert_int_equal(kvs_json_len(j), 0);
    kvs_json_free(j);
}

static void test_decodes_escapes_and_surrogate_pairs(void **state) {
    (void)state;
    kvs_json *j = parse_ok("[\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\", \"\\u0041\\u00e9\\u20AC\", \"\\ud83d\\ude00\","
                           " \"a\\u0000b\", \"\xe2\x96\x81hi\"]");
    assert_string_equal(kvs_json_string(kvs_json_at(j, 0)), "\" \\ / \b \f \n \r \t");
    assert_string_equal(kvs_json_string(kvs_json_at(j, 1)), "A\xc3\xa9\xe2\x82\xac");
    assert_string_equal(kvs_json_string(kvs_json_at(j, 2)), "\xf0\x9f\x98\x80"); /* U+1F600 */
    const kvs_json *nul = kvs_json_at(j, 3);
    assert_int_equal(kvs_json_string_len(nul), 3);
    assert_memory_equal(kvs_json_string(nul), "a\0b", 3);
    assert_string_equal(kvs_json_string(kvs_json_at(j, 4)), "\xe2\x96\x81hi"); /* raw UTF-8 kept */
    kvs_json_free(j);
}

static void test_parses_numbers_exactly(void **state) {
    (void)state;
    kvs_json *j = parse_ok("[0, -0, 0.5, 1e-6, 1E+2, 10000.0, 1e-400, 123456789012]");
    assert_true(kvs_json_number(kvs_json_at(j, 0)) == 0.0);
    assert_true(kvs_json_number(kvs_json_at(j, 2)) == 0.5);
    assert_true(kvs_json_number(kvs_json_at(j, 3)) == 1e-6);
    assert_true(kvs_json_number(kvs_json_at(j, 4)) == 100.0);
    assert_true(kvs_json_number(kvs_json_at(j, 5)) == 10000.0);
    assert_true(kvs_json_number(kvs_json_at(j, 6)) == 0.0); /* underflow to zero is fine */
    assert_true(kvs_json_number(kvs_json_at(j, 7)) == 123456789012.0);
    kvs_json_free(j);
}

static void test_big_object_lookup(void **state) {
    (void)state;
    const int n = 100000;
    size_t cap = (size_t)n * 24 + 16, len = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    s[len++] = '{';
    for (int i = 0; i < n; i++) len += (size_t)snprintf(s + len, cap - len, "%s\"tok%d\":%d", i ? "," : "", i, i);
    s[len++] = '}';
    kvs_json *j = NULL;
    assert_int_equal(kvs_json_parse(s, len, &j), KVS_OK);
    assert_int_equal(kvs_json_len(j), (size_t)n);
    char key[32];
    for (int i = 0; i < n; i += 997) {
        snprintf(key, sizeof key, "tok%d", i);
        assert_true(kvs_json_number(kvs_json_get(j, key)) == (double)i);
    }
    assert_true(kvs_json_number(kvs_json_get(j, "tok99999")) == 99999.0);
    assert_null(kvs_json_get(j, "tok100000"));
    assert_string_equal(kvs_json_key_at(j, 12345), "tok12345");
    kvs_json_free(j);
    /* a duplicate key in a large (indexed) object is rejected too */
    s[len - 1] = ',';
    memcpy(s + len, "\"tok7\":1}", 9);
    expect_fail(s, len + 9, "duplicate key in object at byte 0");
    free(s);
}

static void test_rejects_malformed_with_offset(void **state) {
    (void)state;
    expect_fail("", 0, "unexpected end of input, value expected at byte 0");
    expect_fail("   ", 3, "at byte 3");
    expect_fail("{\"a\" 1}", 7, "expected ':' after object key at byte 5");
    expect_fail("{\"a\":1,}", 8, "expected string key in object at byte 7");
    expect_fail("[1,]", 4, "unexpected character, value expected at byte 3");
    expect_fail("[1 2]", 5, "expected ',' or ']' in array at byte 3");
    expect_fail("[1", 2, "unexpected end of input in array");
    expect_fail("{\"a\":1", 6, "unexpected end of input in object");
    expect_fail("\"abc", 4, "unterminated string at byte 0");
    expect_fail("\"a\x01\"", 4, "raw control character in string at byte 2");
    expect_fail("\"\\x\"", 4, "invalid escape in string at byte 1");
    expect_fail("\"\\u12G4\"", 8, "bad \\u escape");
    expect_fail("\"\\ud83d\"", 8, "high surrogate not followed");
    expect_fail("\"\\ud83d\\u0041\"", 14, "high surrogate not followed");
    expect_fail("\"\\ude00\"", 8, "lone low surrogate");
    expect_fail("\"\xc0\xaf\"", 4, "invalid UTF-8 in string at byte 1"); /* overlong '/' */
    expect_fail("\"\xed\xa0\x80\"", 5, "invalid UTF-8");                  /* encoded surrogate */
    expect_fail("\"\xe2\x96\"", 4, "invalid UTF-8");                      /* truncated sequence */
    expect_fail("01", 2, "leading zero in number at byte 0");
    expect_fail("-", 1, "invalid number");
    expect_fail("+1", 2, "unexpected character");
    expect_fail("1.", 2, "digit expected after '.'");
    expect_fail("1e", 2, "digit expected in number exponent");
    expect_fail("1e999", 5, "number out of range");
    expect_fail("NaN", 3, "unexpected character");
    expect_fail("tru", 3, "invalid literal");
    expect_fail("nul", 3, "invalid literal");
    expect_fail("1 2", 3, "trailing characters after the JSON value at byte 2");
    expect_fail("{} x", 4, "trailing characters");
    expect_fail("{\"a\":1,\"a\":2}", 13, "duplicate key in object at byte 0");
    expect_fail("[1]\0", 4, "trailing characters");
    expect_fail("{1:2}", 5, "expected string key");
    kvs_json *j = NULL;
    assert_int_equal(kvs_json_parse("{}", 2, NULL), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_json_parse(NULL, 5, &j), KVS_ERR_INVALID_ARG);
}

static void test_depth_limit(void **state) {
    (void)state;
    size_t n = KVS_JSON_MAX_DEPTH;
    char *s = malloc(2 * n + 2);
    assert_non_null(s);
    /* exactly the limit parses */
    memset(s, '[', n);
    memset(s + n, ']', n);
    kvs_json *j = NULL;
    assert_int_equal(kvs_json_parse(s, 2 * n, &j), KVS_OK);
    kvs_json_free(j);
    /* one more level is rejected, with the offset of the level that broke it */
    s = realloc(s, 2 * (n + 1));
    memset(s, '[', n + 1);
    memset(s + n + 1, ']', n + 1);
    char want[64];
    snprintf(want, sizeof want, "nesting too deep at byte %zu", n);
    expect_fail(s, 2 * (n + 1), want);
    /* a hostile unterminated 1 MB of '[' fails cleanly instead of overflowing the stack */
    size_t big = 1 << 20;
    s = realloc(s, big);
    memset(s, '[', big);
    expect_fail(s, big, "nesting too deep");
    free(s);
}

/* xorshift64* so the fuzz is deterministic. */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static void test_fuzz_truncations_and_flips(void **state) {
    (void)state;
    const char *doc =
        "{\"version\":\"1.0\",\"model\":{\"type\":\"BPE\",\"vocab\":{\"<unk>\":0,\"<s>\":1,\"\\u2581the\":2,"
        "\"\xe2\x96\x81" "a\":3},\"merges\":[\"\xe2\x96\x81 t\",\"h e\"],\"byte_fallback\":true,\"dropout\":null},"
        "\"nums\":[0,-1.5e-3,12345,6.02E23],\"esc\":\"\\ud83d\\ude00\\n\\t\\\"\"}";
    size_t len = strlen(doc);
    kvs_json *j = NULL;
    assert_int_equal(kvs_json_parse(doc, len, &j), KVS_OK);
    assert_string_equal(kvs_json_string(kvs_json_get(kvs_json_get(j, "model"), "type")), "BPE");
    kvs_json_free(j);
    /* every strict prefix is invalid JSON for this document (it is an object) */
    for (size_t n = 0; n < len; n++) {
        j = NULL;
        kvs_status st = kvs_json_parse(doc, n, &j);
        assert_int_equal(st, KVS_ERR_FORMAT);
        assert_null(j);
    }
    /* random byte flips: any outcome but a crash or a leak; successes must be traversable */
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    char *buf = malloc(len);
    assert_non_null(buf);
    int ok = 0, bad = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(buf, doc, len);
        int flips = 1 + (int)(rng_next(&seed) % 4);
        for (int f = 0; f < flips; f++) {
            size_t at = (size_t)(rng_next(&seed) % len);
            buf[at] = (char)(rng_next(&seed) & 0xFF);
        }
        size_t n = (rng_next(&seed) % 8 == 0) ? (size_t)(rng_next(&seed) % (len + 1)) : len;
        j = NULL;
        kvs_status st = kvs_json_parse(buf, n, &j);
        if (st == KVS_OK) {
            ok++;
            for (size_t i = 0; i < kvs_json_len(j); i++) {
                assert_non_null(kvs_json_key_at(j, i));
                (void)kvs_json_get(j, kvs_json_key_at(j, i));
            }
            kvs_json_free(j);
        } else {
            bad++;
            assert_int_equal(st, KVS_ERR_FORMAT);
            assert_null(j);
            assert_non_null(strstr(kvs_last_error(), "at byte"));
        }
    }
    assert_true(ok > 0 && bad > 0);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parses_scalars_and_containers),
        cmocka_unit_test(test_decodes_escapes_and_surrogate_pairs),
        cmocka_unit_test(test_parses_numbers_exactly),
        cmocka_unit_test(test_big_object_lookup),
        cmocka_unit_test(test_rejects_malformed_with_offset),
        cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_fuzz_truncations_and_flips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
