/* test_common.c — tests of common/: fp16/bf16 conversion (IEEE 754 binary16 and bfloat16 with
 * round-to-nearest-even, subnormals, inf, NaN), CRC-32 check value, error detail, file helpers, and the
 * shared math of kvs_math.h (top-k order and tie-breaking, softmax/LSE, attention, pooling), and the .npy
 * header of common/npy.h.
 */
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvs.h"
#include "common/kvs_math.h"
#include "common/npy.h"

/* cmocka 1.1 has no assert_double_equal */
#define assert_near(a, b, eps) assert_true(fabs((double)(a) - (double)(b)) <= (double)(eps))

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- fp16 ---- */

static void test_f16_exact_values(void **state) {
    (void)state;
    assert_int_equal(kvs_f32_to_f16(1.0f), 0x3C00);
    assert_int_equal(kvs_f32_to_f16(-2.0f), 0xC000);
    assert_int_equal(kvs_f32_to_f16(0.5f), 0x3800);
    assert_int_equal(kvs_f32_to_f16(65504.0f), 0x7BFF); /* largest finite half */
    assert_int_equal(kvs_f32_to_f16(0.0f), 0x0000);
    assert_int_equal(kvs_f32_to_f16(-0.0f), 0x8000);
    assert_true(kvs_f16_to_f32(0x3C00) == 1.0f);
    assert_true(kvs_f16_to_f32(0x7BFF) == 65504.0f);
    assert_true(kvs_f16_to_f32(0xC000) == -2.0f);
    /* every finite half survives half -> float -> half */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7C00) == 0x7C00) continue;
        assert_int_equal(kvs_f32_to_f16(kvs_f16_to_f32((uint16_t)h)), h);
    }
}

static void test_f16_round_to_nearest_even(void **state) {
    (void)state;
    /* 1 + 2^-11 is halfway between 1 (even mantissa) and 1 + 2^-10: ties go to even = 1 */
    assert_int_equal(kvs_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3C00);
    /* 1 + 3*2^-11 is halfway between 0x3C01 (odd) and 0x3C02 (even) */
    assert_int_equal(kvs_f32_to_f16(1.0f + 3 * ldexpf(1, -11)), 0x3C02);
    /* just above the halfway point rounds up */
    assert_int_equal(kvs_f32_to_f16(1.0f + ldexpf(1, -11) + ldexpf(1, -20)), 0x3C01);
    /* just below rounds down */
    assert_int_equal(kvs_f32_to_f16(1.0f + ldexpf(1, -11) - ldexpf(1, -20)), 0x3C00);
    /* rounding carries into the exponent: 2 - 2^-12 -> 2.0 */
    assert_int_equal(kvs_f32_to_f16(2.0f - ldexpf(1, -12)), 0x4000);
    /* 65520 is halfway between 65504 (odd mantissa) and 65536 (not representable): overflows to inf */
    assert_int_equal(kvs_f32_to_f16(65520.0f), 0x7C00);
    assert_int_equal(kvs_f32_to_f16(65519.0f), 0x7BFF);
}

static void test_f16_subnormals(void **state) {
    (void)state;
    assert_int_equal(kvs_f32_to_f16(ldexpf(1, -24)), 0x0001);        /* smallest subnormal */
    assert_int_equal(kvs_f32_to_f16(ldexpf(1, -14)), 0x0400);        /* smallest normal */
    assert_int_equal(kvs_f32_to_f16(1023 * ldexpf(1, -24)), 0x03FF); /* largest subnormal */
    assert_int_equal(kvs_f32_to_f16(ldexpf(1, -25)), 0x0000);        /* tie between 0 and 1 ulp: even (0) */
    assert_int_equal(kvs_f32_to_f16(3 * ldexpf(1, -25)), 0x0002);    /* tie between 1 and 2: even (2) */
    assert_int_equal(kvs_f32_to_f16(ldexpf(1, -25) * 1.5f), 0x0001); /* above the tie */
    assert_int_equal(kvs_f32_to_f16(-ldexpf(1, -24)), 0x8001);
    assert_int_equal(kvs_f32_to_f16(ldexpf(1, -30)), 0x0000);        /* underflow */
    assert_true(kvs_f16_to_f32(0x0001) == ldexpf(1, -24));
    assert_true(kvs_f16_to_f32(0x03FF) == 1023 * ldexpf(1, -24));
    assert_true(kvs_f16_to_f32(0x8001) == -ldexpf(1, -24));
}

static void test_f16_inf_nan(void **state) {
    (void)state;
    assert_int_equal(kvs_f32_to_f16(INFINITY), 0x7C00);
    assert_int_equal(kvs_f32_to_f16(-INFINITY), 0xFC00);
    assert_int_equal(kvs_f32_to_f16(1e10f), 0x7C00);
    uint16_t n = kvs_f32_to_f16(NAN);
    assert_int_equal(n & 0x7C00, 0x7C00);
    assert_true((n & 0x03FF) != 0);
    assert_true(isnan(kvs_f16_to_f32(n)));
    assert_true(isinf(kvs_f16_to_f32(0x7C00)) && kvs_f16_to_f32(0x7C00) > 0);
    assert_true(isinf(kvs_f16_to_f32(0xFC00)) && kvs_f16_to_f32(0xFC00) < 0);
    /* a NaN whose payload sits only in the low mantissa bits must stay NaN, not become inf */
    assert_true(isnan(kvs_f16_to_f32(kvs_f32_to_f16(bits_f(0x7F800001u)))));
}

/* ---- bf16 ---- */

static void test_bf16_conversion(void **state) {
    (void)state;
    assert_int_equal(kvs_f32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(kvs_f32_to_bf16(-2.0f), 0xC000);
    assert_true(kvs_bf16_to_f32(0x3F80) == 1.0f);
    /* ties to even: 1 + 2^-8 is halfway between 0x3F80 (even) and 0x3F81 */
    assert_int_equal(kvs_f32_to_bf16(1.0f + ldexpf(1, -8)), 0x3F80);
    assert_int_equal(kvs_f32_to_bf16(1.0f + 3 * ldexpf(1, -8)), 0x3F82);
    assert_int_equal(kvs_f32_to_bf16(1.0f + ldexpf(1, -8) + ldexpf(1, -20)), 0x3F81);
    /* subnormal floats keep their top bits */
    assert_int_equal(kvs_f32_to_bf16(bits_f(0x00010000u)), 0x0001);
    assert_true(kvs_bf16_to_f32(0x0001) == bits_f(0x00010000u));
    /* inf, overflow by rounding, NaN */
    assert_int_equal(kvs_f32_to_bf16(INFINITY), 0x7F80);
    assert_int_equal(kvs_f32_to_bf16(-INFINITY), 0xFF80);
    assert_int_equal(kvs_f32_to_bf16(bits_f(0x7F7FFFFFu)), 0x7F80); /* FLT_MAX rounds up to inf */
    assert_true(isnan(kvs_bf16_to_f32(kvs_f32_to_bf16(NAN))));
    assert_true(isnan(kvs_bf16_to_f32(kvs_f32_to_bf16(bits_f(0x7F800001u))))); /* low-payload NaN stays NaN */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7F80) == 0x7F80) continue;
        assert_int_equal(kvs_f32_to_bf16(kvs_bf16_to_f32((uint16_t)h)), h);
    }
}

static void test_encode_decode_arrays(void **state) {
    (void)state;
    float src[5] = {1.0f, -0.333333f, 1e-6f, 123.456f, -0.0f}, dst[5];
    uint8_t buf[20];
    kvs_encode(KVS_DTYPE_F32, src, 5, buf);
    kvs_decode(KVS_DTYPE_F32, buf, 5, dst);
    assert_memory_equal(src, dst, sizeof src);
    assert_int_equal(buf[0], 0x00); /* little-endian 1.0f = 00 00 80 3F */
    assert_int_equal(buf[3], 0x3F);
    kvs_encode(KVS_DTYPE_F16, src, 5, buf);
    assert_int_equal(kvs_get_u16(buf), 0x3C00);
    kvs_decode(KVS_DTYPE_F16, buf, 5, dst);
    for (int i = 0; i < 5; i++) assert_true(dst[i] == kvs_f16_to_f32(kvs_f32_to_f16(src[i])));
    kvs_encode(KVS_DTYPE_BF16, src, 5, buf);
    kvs_decode(KVS_DTYPE_BF16, buf, 5, dst);
    for (int i = 0; i < 5; i++) assert_true(dst[i] == kvs_bf16_to_f32(kvs_f32_to_bf16(src[i])));
}

/* kvs_encode/kvs_decode of fp16 arrays (the F16C path where the CPU has it) against the scalar conversions,
 * bit for bit: every half decoded; encoded, every half value, the midpoints between neighbouring halves
 * (ties) and one float ulp either side of them, for both signs, overflow and underflow regions, inf, NaNs with
 * payloads, and a million random bit patterns; array lengths leave a scalar tail. */
static void check_encode_f16(const float *x, size_t n) {
    uint8_t *h = malloc(2 * n);
    assert_non_null(h);
    kvs_encode(KVS_DTYPE_F16, x, n, h);
    for (size_t i = 0; i < n; i++) {
        uint16_t want = kvs_f32_to_f16(x[i]), got = (uint16_t)(h[2 * i] | h[2 * i + 1] << 8);
        if (got != want) {
            print_error("fp16 encode of 0x%08x: 0x%04x, scalar 0x%04x\n", kvs_f32_bits(x[i]), got, want);
            fail();
        }
    }
    free(h);
}

static void test_f16_array_path_matches_scalar(void **state) {
    (void)state;
    print_message("fp16 array path: %s\n", kvs_f16_fast_path() ? "F16C" : "scalar (no F16C on this CPU, or KVSIM_NO_F16C set)");
    /* decode every half */
    uint8_t *all = malloc(2 * 65536);
    float *dec = malloc(sizeof(float) * 65536);
    assert_true(all && dec);
    for (uint32_t u = 0; u < 65536; u++) kvs_put_u16(all + 2 * u, (uint16_t)u);
    kvs_decode(KVS_DTYPE_F16, all, 65535, dec); /* odd length: scalar tail */
    kvs_decode(KVS_DTYPE_F16, all + 2 * 65535, 1, dec + 65535);
    for (uint32_t u = 0; u < 65536; u++)
        if (kvs_f32_bits(dec[u]) != kvs_f32_bits(kvs_f16_to_f32((uint16_t)u))) {
            print_error("fp16 decode of 0x%04x: 0x%08x, scalar 0x%08x\n", u, kvs_f32_bits(dec[u]),
                        kvs_f32_bits(kvs_f16_to_f32((uint16_t)u)));
            fail();
        }
    free(all);
    free(dec);
    /* encode around every half and the ties between them */
    size_t cap = 65536 * 8 + 1000003, n = 0;
    float *x = malloc(sizeof(float) * cap);
    assert_non_null(x);
    for (uint32_t u = 0; u < 0x7c00; u++) {
        for (int sgn = 0; sgn < 2; sgn++) {
            float a = kvs_f16_to_f32((uint16_t)u), b = kvs_f16_to_f32((uint16_t)(u + 1));
            float mid = u + 1 < 0x7c00 ? (a + b) / 2 : 65520.0f; /* the tie above the largest half rounds to inf */
            float v[4] = {a, mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
            for (int k = 0; k < 4; k++) x[n++] = sgn ? -v[k] : v[k];
        }
    }
    const uint32_t special[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fa00000u,
                                0x7f802000u, 0x477fefffu, 0x477ff000u, 0x47800000u, 0x33000000u, 0x33000001u,
                                0x32ffffffu, 0x00000001u, 0x80000001u, 0x387fc000u, 0x38800000u};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) x[n++] = bits_f(special[i]);
    uint64_t r = 0x243f6a8885a308d3ull;
    while (n < cap) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        x[n++] = bits_f((uint32_t)(r >> 16));
    }
    check_encode_f16(x, n);
    check_encode_f16(x + 3, 13); /* unaligned start, 8 + a tail of 5 */
    free(x);
}

static void test_dtype_names(void **state) {
    (void)state;
    kvs_dtype t;
    assert_int_equal(kvs_dtype_parse("bfloat16", &t), KVS_OK);
    assert_int_equal(t, KVS_DTYPE_BF16);
    assert_int_equal(kvs_dtype_parse("f16", &t), KVS_OK);
    assert_int_equal(t, KVS_DTYPE_F16);
    assert_int_equal(kvs_dtype_parse("int8", &t), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "int8"));
    assert_string_equal(kvs_dtype_name(KVS_DTYPE_F32), "fp32");
    assert_int_equal(kvs_dtype_size(KVS_DTYPE_F32), 4);
    assert_int_equal(kvs_dtype_size(KVS_DTYPE_BF16), 2);
}

/* ---- CRC, errors, files ---- */

static void test_crc32_check_value(void **state) {
    (void)state;
    assert_int_equal(kvs_crc32(0, "123456789", 9), 0xCBF43926u);
    /* continuing from a partial CRC gives the same result */
    assert_int_equal(kvs_crc32(kvs_crc32(0, "1234", 4), "56789", 5), 0xCBF43926u);
    assert_int_equal(kvs_crc32(0, "", 0), 0);
}

static void test_error_detail(void **state) {
    (void)state;
    kvs_clear_error();
    assert_string_equal(kvs_last_error(), "");
    assert_int_equal(kvs_fail(KVS_ERR_RANGE, "layer %d", 7), KVS_ERR_RANGE);
    assert_string_equal(kvs_last_error(), "layer 7");
    assert_string_equal(kvs_strerror(KVS_ERR_CHECKSUM), "checksum mismatch");
    assert_string_equal(kvs_strerror((kvs_status)-999), "unknown status");
}

/* kvs_fail formats through a scratch buffer, so a detail may prefix the previous one (the argument
 * aliases the thread's error buffer). */
static void test_fail_detail_may_prefix_itself(void **state) {
    (void)state;
    assert_int_equal(kvs_fail(KVS_ERR_IO, "x"), KVS_ERR_IO);
    assert_int_equal(kvs_fail(KVS_ERR_FORMAT, "pre: %s", kvs_last_error()), KVS_ERR_FORMAT);
    assert_string_equal(kvs_last_error(), "pre: x");
    /* twice more: the prefix grows, it is not garbled by overlapping copies */
    kvs_fail(KVS_ERR_FORMAT, "a/%s/%s", kvs_last_error(), kvs_last_error());
    assert_string_equal(kvs_last_error(), "a/pre: x/pre: x");
}

static void test_pread_all_truncated(void **state) {
    (void)state;
    char dir[] = "/tmp/kvs_common_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/f", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(kvs_write_all(fd, "hello", 5, path), KVS_OK);
    char buf[8];
    assert_int_equal(kvs_pread_all(fd, buf, 5, 0, path), KVS_OK);
    assert_memory_equal(buf, "hello", 5);
    assert_int_equal(kvs_pread_all(fd, buf, 4, 3, path), KVS_ERR_TRUNCATED);
    close(fd);
    unlink(path);
    rmdir(dir);
}

/* ---- math ---- */

static void test_topk_order_and_ties(void **state) {
    (void)state;
    float x[7] = {1.0f, 3.0f, 3.0f, 2.0f, NAN, 3.0f, -1.0f};
    int32_t idx[7];
    kvs_topk(x, 7, 4, idx);
    int32_t want[4] = {1, 2, 5, 3}; /* descending value; equal values by ascending index */
    assert_memory_equal(idx, want, sizeof want);
    kvs_topk(x, 7, 7, idx);
    int32_t want_all[7] = {1, 2, 5, 3, 0, 6, 4}; /* NaN sorts lowest */
    assert_memory_equal(idx, want_all, sizeof want_all);
    kvs_topk(x, 7, 1, idx);
    assert_int_equal(idx[0], 1);
    /* all equal: the lowest indices in order */
    float z[6] = {0, 0, 0, 0, 0, 0};
    kvs_topk(z, 6, 3, idx);
    int32_t want_z[3] = {0, 1, 2};
    assert_memory_equal(idx, want_z, sizeof want_z);
}

/* kvs_argsort_desc must order exactly as kvs_topk(x, n, n) does (the replay engine's top-k overlap depends
 * on it): checked on random data with many ties, signed zeros, negatives, NaN and infinities, and on sizes
 * that exercise the radix passes' skip of shared digits. */
static void test_argsort_matches_topk(void **state) {
    (void)state;
    uint64_t seed = 12345;
    for (int trial = 0; trial < 200; trial++) {
        size_t n = 1 + (size_t)(trial * 37 % 700);
        float *x = malloc(n * sizeof *x);
        int32_t *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        uint32_t *scratch = malloc(3 * n * sizeof *scratch);
        assert_true(x && a && b && scratch);
        for (size_t i = 0; i < n; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(seed >> 33);
            switch (trial % 4) {
            case 0: x[i] = (float)(r % 16) / 8.0f - 1.0f; break; /* heavy ties, both signs */
            case 1: x[i] = (float)r / 4294967296.0f; break;      /* probabilities */
            case 2: x[i] = (r % 7 == 0) ? -0.0f : (r % 5 == 0) ? 0.0f : (r % 11 == 0) ? NAN : (r % 13 == 0) ? -INFINITY
                                       : (r % 17 == 0) ? INFINITY : (float)((int32_t)r) * 1e-9f;
                break;
            default: x[i] = 0.25f; break; /* all equal: index order */
            }
        }
        kvs_topk(x, n, n, a);
        kvs_argsort_desc(x, n, b, scratch);
        assert_memory_equal(a, b, n * sizeof *a);
        free(x);
        free(a);
        free(b);
        free(scratch);
    }
}

static void test_softmax_and_lse(void **state) {
    (void)state;
    float x[3] = {0.0f, logf(2.0f), logf(3.0f)};
    double lse = kvs_softmax(x, 3);
    assert_near(lse, log(6.0), 1e-6);
    assert_float_equal(x[0], 1.0f / 6, 1e-6f);
    assert_float_equal(x[1], 2.0f / 6, 1e-6f);
    assert_float_equal(x[2], 3.0f / 6, 1e-6f);
    /* large scores must not overflow */
    float y[2] = {1000.0f, 1000.0f};
    lse = kvs_softmax(y, 2);
    assert_near(lse, 1000.0 + log(2.0), 1e-4);
    assert_float_equal(y[0], 0.5f, 1e-6f);
    float one[1] = {-7.0f};
    assert_near(kvs_softmax(one, 1), -7.0, 1e-6);
    assert_float_equal(one[0], 1.0f, 0);
}

static void test_attention_small_example(void **state) {
    (void)state;
    /* d = 2, keys with stride 3 (one padding float per row) */
    float q[2] = {1.0f, 0.0f};
    float keys[9] = {1, 0, 99, 0, 1, 99, -1, 0, 99};
    float vals[9] = {1, 0, 99, 0, 1, 99, 0, 0, 99};
    float probs[3], out[2];
    double lse = kvs_attention(q, keys, vals, 3, NULL, 3, 2, 2.0f, probs, out);
    /* scores 2, 0, -2 */
    double z = exp(2.0) + 1.0 + exp(-2.0);
    assert_near(lse, log(z), 1e-6);
    assert_float_equal(out[0], (float)(exp(2.0) / z), 1e-6f);
    assert_float_equal(out[1], (float)(1.0 / z), 1e-6f);
    /* an index list selects rows */
    int32_t idx[2] = {2, 0};
    lse = kvs_attention(q, keys, vals, 3, idx, 2, 2, 2.0f, probs, out);
    assert_near(lse, log(exp(-2.0) + exp(2.0)), 1e-6);
    assert_float_equal(probs[1], (float)(exp(2.0) / (exp(-2.0) + exp(2.0))), 1e-6f);
}

static void test_pooling(void **state) {
    (void)state;
    float x[5] = {1, 5, 2, 0, 3}, out[5];
    kvs_maxpool1d(x, 5, 3, out);
    float want[5] = {5, 5, 5, 3, 3};
    assert_memory_equal(out, want, sizeof want);
    kvs_maxpool1d(x, 5, 1, out);
    assert_memory_equal(out, x, sizeof x);
    kvs_avgpool1d(x, 5, 3, out);
    float want_avg[5] = {3, 8.0f / 3, 7.0f / 3, 5.0f / 3, 1.5f};
    for (int i = 0; i < 5; i++) assert_float_equal(out[i], want_avg[i], 1e-6f);
}

static void test_norms_and_cosine(void **state) {
    (void)state;
    float a[2] = {3, 4}, b[2] = {3, 5}, z[2] = {0, 0};
    assert_near(kvs_l2(a, 2), 5.0, 1e-12);
    assert_near(kvs_rel_l2(a, b, 2), 0.2, 1e-12);
    assert_true(isinf(kvs_rel_l2(z, a, 2)));
    assert_near(kvs_rel_l2(z, z, 2), 0.0, 0);
    assert_float_equal(kvs_cosine(a, a, 2), 1.0f, 1e-6f);
    assert_float_equal(kvs_cosine(a, z, 2), 0.0f, 0);
}

/* ---- npy header ---- */

static void test_npy_header_layout(void **state) {
    (void)state;
    uint8_t buf[640];
    size_t len;
    int64_t shape3[3] = {7, 4, 16};
    assert_int_equal(kvs_npy_header(KVS_NPY_F32, shape3, 3, buf, sizeof buf, &len), KVS_OK);
    assert_int_equal(len % 64, 0);
    assert_memory_equal(buf, "\x93NUMPY\x01\x00", 8);
    assert_int_equal(kvs_get_u16(buf + 8), len - 10);
    assert_int_equal(buf[len - 1], '\n');
    const char *want = "{'descr': '<f4', 'fortran_order': False, 'shape': (7, 4, 16), }";
    assert_memory_equal(buf + 10, want, strlen(want));
    int64_t shape1[1] = {5};
    assert_int_equal(kvs_npy_header(KVS_NPY_I32, shape1, 1, buf, sizeof buf, &len), KVS_OK);
    want = "{'descr': '<i4', 'fortran_order': False, 'shape': (5,), }";
    assert_memory_equal(buf + 10, want, strlen(want));
    int64_t bad[1] = {-1};
    assert_int_equal(kvs_npy_header(KVS_NPY_I32, bad, 1, buf, sizeof buf, &len), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "negative"));
    assert_int_equal(kvs_npy_header(KVS_NPY_I32, shape3, 9, buf, sizeof buf, &len), KVS_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_exact_values),
        cmocka_unit_test(test_f16_round_to_nearest_even),
        cmocka_unit_test(test_f16_subnormals),
        cmocka_unit_test(test_f16_inf_nan),
        cmocka_unit_test(test_bf16_conversion),
        cmocka_unit_test(test_encode_decode_arrays),
        cmocka_unit_test(test_f16_array_path_matches_scalar),
        cmocka_unit_test(test_dtype_names),
        cmocka_unit_test(test_crc32_check_value),
        cmocka_unit_test(test_error_detail),
        cmocka_unit_test(test_fail_detail_may_prefix_itself),
        cmocka_unit_test(test_pread_all_truncated),
        cmocka_unit_test(test_topk_order_and_ties),
        cmocka_unit_test(test_argsort_matches_topk),
        cmocka_unit_test(test_softmax_and_lse),
        cmocka_unit_test(test_attention_small_example),
        cmocka_unit_test(test_pooling),
        cmocka_unit_test(test_norms_and_cosine),
        cmocka_unit_test(test_npy_header_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
