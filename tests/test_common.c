/* test_common.c — tests of common/: fp16/bf16 conversion (IEEE 754 binary16 and bfloat16 with
 * round-to-nearest-even, subnormals, inf, NaN), CRC-32 check value, error detail, file helpers, and the
 * shared math of kvs_math.h (top-k order and tie-breaking, softmax/LSE, attention, pooling, the prefill
 * attention column sums and SnapKV's scores against naive double-precision loops; the sparse-attention estimate
 * of RocketKV/Quest/SparQ: page min/max, page bounds, head-dimension choice, SparQ's temperature, the page
 * softmax and the page selection with its ties), and the .npy header of
 * common/npy.h.
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
#include <sched.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvs.h"
#include "common/kvs_math.h"
#include "common/kvs_rng.h"
#include "common/kvs_stats.h"
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

/* kvs_topk_f64: the same order and tie rule in double, including values that differ only beyond float. */
/* kvs_topk_sorted: kvs_topk's positions, ascending; kvs_max_rows: the element-wise maximum of strided rows. Both
 * against direct loops on random data with ties. */
static void test_topk_sorted_and_max_rows(void **state) {
    (void)state;
    unsigned seed = 7;
    for (int trial = 0; trial < 200; trial++) {
        float x[3 * 40];
        size_t n = 1 + (size_t)(trial % 40), k = 1 + (size_t)(trial % (int)n), rows = 1 + (size_t)(trial % 3);
        for (size_t i = 0; i < 3 * 40; i++) {
            seed = seed * 1103515245u + 12345u;
            x[i] = (float)((seed >> 16) % 9); /* few values: many ties */
        }
        int32_t top[40], sorted[40];
        kvs_topk(x, n, k, top);
        kvs_topk_sorted(x, n, k, sorted);
        /* the same set: every member of top once in sorted, sorted strictly ascending */
        for (size_t i = 1; i < k; i++) assert_true(sorted[i - 1] < sorted[i]);
        for (size_t i = 0; i < k; i++) {
            int found = 0;
            for (size_t j = 0; j < k; j++) found += sorted[j] == top[i];
            assert_int_equal(found, 1);
        }
        float mx[40];
        kvs_max_rows(x, 40, rows, n, mx);
        for (size_t j = 0; j < n; j++) {
            float want = x[j];
            for (size_t r = 1; r < rows; r++) want = x[r * 40 + j] > want ? x[r * 40 + j] : want;
            assert_true(mx[j] == want);
        }
    }
}

/* The naive ranking for the select test: descending value, NaN after every number, -0 equal to +0 (float ==),
 * equal values by ascending index: kvs_topk's documented order, written as a comparator. */
static const float *rank_x;
static int rank_cmp(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    float x = rank_x[a], y = rank_x[b];
    int na = isnan(x), nb = isnan(y);
    if (na != nb) return na - nb;
    if (!na && x != y) return x > y ? -1 : 1;
    return (a > b) - (a < b);
}
static int pos_cmp(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

/* kvs_topk_sorted's radix select (k >= 32) and heap path (k < 32) against the naive ranking's first k, sorted:
 * heavy ties, signed zeros, NaN, infinities, denormals, values sharing their top 11 or 22 key bits (the select's
 * later passes), k around the paths' switch and at 0, n - 1 and n. */
static void test_topk_sorted_matches_a_naive_ranking(void **state) {
    (void)state;
    uint64_t seed = 99;
    const size_t sizes[] = {1, 2, 31, 33, 64, 300, 2048, 3001};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        float *x = malloc(n * sizeof *x);
        int32_t *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
        assert_true(x && want && got);
        for (int kind = 0; kind < 6; kind++) {
            for (size_t i = 0; i < n; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                uint32_t r = (uint32_t)(seed >> 33);
                switch (kind) {
                case 0: x[i] = (float)(r % 16) / 8.0f - 1.0f; break; /* heavy ties, both signs */
                case 1: x[i] = (float)r / 4294967296.0f; break;      /* probabilities */
                case 2: x[i] = (r % 7 == 0) ? -0.0f : (r % 5 == 0) ? 0.0f : (r % 11 == 0) ? NAN : (r % 13 == 0) ? -INFINITY
                                           : (r % 17 == 0) ? INFINITY : (float)((int32_t)r) * 1e-9f;
                    break;
                case 3: x[i] = nextafterf(1.0f, 2.0f) + (float)(r % 64) * 1.1920929e-7f; break; /* top bits shared */
                case 4: x[i] = (float)(r % 8) * 1e-45f * ((r & 1u) ? -1.0f : 1.0f); break;        /* denormals */
                default: x[i] = 0.25f; break;                                                     /* all equal */
                }
            }
            for (size_t i = 0; i < n; i++) want[i] = (int32_t)i;
            rank_x = x;
            qsort(want, n, sizeof *want, rank_cmp);
            const size_t ks[] = {0, 1, 31, 32, 33, n / 2, n - 1, n};
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
                size_t k = ks[ki];
                if (k > n) continue;
                int32_t *ref = malloc((k ? k : 1) * sizeof *ref);
                assert_non_null(ref);
                memcpy(ref, want, k * sizeof *ref);
                qsort(ref, k, sizeof *ref, pos_cmp);
                for (size_t i = 0; i < n; i++) got[i] = -7;
                kvs_topk_sorted(x, n, k, got);
                assert_memory_equal(got, ref, k * sizeof *ref);
                if (k < n) assert_int_equal(got[k], -7); /* nothing written past k */
                free(ref);
            }
        }
        free(x);
        free(want);
        free(got);
    }
}

static void test_topk_f64_order_and_ties(void **state) {
    (void)state;
    double x[7] = {1.0, 3.0, 3.0, 2.0, NAN, 3.0 + 1e-12, -1.0};
    int32_t idx[7];
    kvs_topk_f64(x, 7, 7, idx);
    int32_t want_all[7] = {5, 1, 2, 3, 0, 6, 4}; /* 3+1e-12 first; equal values by ascending index; NaN last */
    assert_memory_equal(idx, want_all, sizeof want_all);
    kvs_topk_f64(x, 7, 2, idx);
    int32_t want2[2] = {5, 1};
    assert_memory_equal(idx, want2, sizeof want2);
    kvs_topk_f64(x, 7, 0, idx); /* k = 0 writes nothing */
    assert_int_equal(idx[0], 5);
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

/* The fp64 logits and softmax: a hand-computed case, and bit-equality with the same loops written here. */
static void test_scores_and_softmax_f64(void **state) {
    (void)state;
    float q[3] = {1.0f, -2.0f, 0.5f};
    float keys[9] = {1, 1, 1, 0.25f, 0, 4, -1, 0.5f, 2};
    int32_t idx[2] = {2, 0};
    double z[3];
    kvs_attn_scores_f64(q, keys, 3, NULL, 3, 3, 0.5f, z);
    assert_true(z[0] == 0.5 * (1 - 2 + 0.5) && z[1] == 0.5 * (0.25 + 2) && z[2] == 0.5 * (-1 - 1 + 1));
    kvs_attn_scores_f64(q, keys, 3, idx, 2, 3, 0.5f, z);
    assert_true(z[0] == -0.5 && z[1] == -0.25);
    double x[3] = {0.0, log(2.0), log(3.0)};
    assert_true(fabs(kvs_softmax_f64(x, 3) - log(6.0)) < 1e-15);
    assert_true(fabs(x[0] - 1.0 / 6) < 1e-16 && fabs(x[1] - 2.0 / 6) < 1e-16 && fabs(x[2] - 3.0 / 6) < 1e-16);
    double y[2] = {1000.0, 1000.0}; /* no overflow */
    assert_true(fabs(kvs_softmax_f64(y, 2) - (1000.0 + log(2.0))) < 1e-12 && y[0] == 0.5 && y[1] == 0.5);
    /* bit for bit: one running fp64 sum in ascending order, then the scale */
    float qq[5] = {0.1f, -0.7f, 1.3f, 2.9f, -0.01f}, kk[5] = {3.1f, 0.3f, -1.7f, 0.11f, 5.5f};
    double want = 0;
    for (int i = 0; i < 5; i++) want += (double)qq[i] * (double)kk[i];
    want *= (double)0.37f;
    kvs_attn_scores_f64(qq, kk, 5, NULL, 1, 5, 0.37f, z);
    assert_true(z[0] == want);
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

static void test_avgpool1d_pad_edges(void **state) {
    (void)state;
    /* Zero padding (count_include_pad): always divided by k, so both ends are pulled towards 0. */
    float x[5] = {1, 5, 2, 0, 3}, out[5];
    kvs_avgpool1d_pad(x, 5, 3, out);
    float want3[5] = {6.0f / 3, 8.0f / 3, 7.0f / 3, 5.0f / 3, 3.0f / 3};
    for (int i = 0; i < 5; i++) assert_float_equal(out[i], want3[i], 1e-6f);
    kvs_avgpool1d_pad(x, 5, 5, out);
    float want5[5] = {8.0f / 5, 8.0f / 5, 11.0f / 5, 10.0f / 5, 5.0f / 5};
    for (int i = 0; i < 5; i++) assert_float_equal(out[i], want5[i], 1e-6f);
    /* a kernel wider than the input: every output is the whole sum over k */
    kvs_avgpool1d_pad(x, 3, 9, out);
    for (int i = 0; i < 3; i++) assert_float_equal(out[i], 8.0f / 9, 1e-6f);
    /* k = 1 is the identity, bit for bit */
    kvs_avgpool1d_pad(x, 5, 1, out);
    assert_memory_equal(out, x, sizeof x);
    /* in the interior (full window) it equals the in-range mean of kvs_avgpool1d */
    float y[64], a[64], b[64];
    uint64_t seed = 7;
    for (int i = 0; i < 64; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        y[i] = (float)(seed >> 40) / 16777216.0f;
    }
    kvs_avgpool1d_pad(y, 64, 7, a);
    kvs_avgpool1d(y, 64, 7, b);
    for (int i = 0; i < 64; i++) {
        double s = 0;
        for (int j = i - 3; j <= i + 3; j++) s += j >= 0 && j < 64 ? y[j] : 0.0;
        assert_near(a[i], s / 7, 1e-6);
        if (i >= 3 && i < 61) assert_near(a[i], b[i], 1e-6);
    }
}

/* ---- prefill attention column sums: a naive reference in double, plain loops ---- */

/* S[h][j] (h < nh, j < n_cand) = sum over rows r0..r0+nr-1 of head h0+h's causal softmax probability of
 * candidate j; R[r][h][j] the same per row (NULL: not wanted). Everything in double. */
static void naive_colsum(const kvs_attn_src *src, int64_t r0, int64_t nr, int h0, int nh, double *S, double *R) {
    int64_t n = src->n_cand;
    double *z = malloc((size_t)n * sizeof *z);
    assert_non_null(z);
    for (int64_t i = 0; i < (int64_t)nh * n; i++) S[i] = 0;
    for (int64_t r = r0; r < r0 + nr; r++) {
        int64_t pos = src->q_first + r;
        for (int h = 0; h < nh; h++) {
            const float *q = src->q + ((size_t)r * (size_t)src->group + (size_t)(h0 + h)) * (size_t)src->d;
            double mx = -INFINITY, sum = 0;
            int64_t vis = 0;
            for (int64_t j = 0; j < n; j++) {
                int64_t kp = src->idx ? src->idx[j] : j;
                if (kp > pos) break;
                double dot = 0;
                for (int c = 0; c < src->d; c++) dot += (double)q[c] * src->keys[(size_t)kp * (size_t)src->d + (size_t)c];
                z[j] = (double)src->scale * dot;
                if (z[j] > mx) mx = z[j];
                vis++;
            }
            for (int64_t j = 0; j < vis; j++) sum += exp(z[j] - mx);
            for (int64_t j = 0; j < n; j++) {
                double p = j < vis ? exp(z[j] - mx) / sum : 0;
                S[(size_t)h * (size_t)n + (size_t)j] += p;
                if (R) R[((size_t)(r - r0) * (size_t)nh + (size_t)h) * (size_t)n + (size_t)j] = p;
            }
        }
    }
    free(z);
}

/* Reduces S[nh][n] over the heads into out[n] (KVS_GQA_NONE: copies). */
static void naive_reduce(const double *S, int nh, int64_t n, kvs_gqa_reduce red, double *out) {
    for (int64_t j = 0; j < n; j++) {
        double a = red == KVS_GQA_MAX ? -INFINITY : 0;
        for (int h = 0; h < nh; h++) {
            double v = S[(size_t)h * (size_t)n + (size_t)j];
            a = red == KVS_GQA_MAX ? (v > a ? v : a) : a + v;
        }
        out[j] = red == KVS_GQA_MEAN ? a / nh : a;
    }
}

/* x[0..n-1] uniform in [lo, hi) from a 64-bit LCG (deterministic per seed). */
static void fill_uniform(float *x, size_t n, uint64_t *seed, float lo, float hi) {
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = lo + (hi - lo) * (float)(*seed >> 40) / 16777216.0f;
    }
}

/* Three positions, d = 2, GQA group 2, scale 1: keys e0=(0,0), e1=(1,0), e2=(0,1), so a query (ln a, ln b)
 * gives probabilities proportional to (1, a, b) over the positions it sees. Rows (causal):
 *   position 0: both heads see only position 0 -> 1
 *   position 1: head 0 q=(ln 3, .) -> (1/4, 3/4);        head 1 q=(0, .) -> (1/2, 1/2)
 *   position 2: head 0 q=(ln 2, 0) -> (1/4, 1/2, 1/4);   head 1 q=(ln 3, ln 4) -> (1/8, 3/8, 1/2)
 * Column sums over all rows: head 0 (3/2, 5/4, 1/4), head 1 (13/8, 7/8, 1/2). */
static const float tiny_keys[6] = {0, 0, 1, 0, 0, 1};
static void tiny_queries(float q[12]) {
    float v[12] = {0.7f, -0.3f, 5.0f, 5.0f,                       /* position 0: any value */
                   logf(3), 9.0f, 0.0f, -2.0f,                   /* position 1: the 2nd component is unseen */
                   logf(2), 0.0f, logf(3), logf(4)};             /* position 2 */
    memcpy(q, v, sizeof v);
}

static void test_attn_colsum_tiny_exact(void **state) {
    (void)state;
    float q[12];
    tiny_queries(q);
    void *scratch = malloc(kvs_attn_colsum_scratch_bytes(3));
    assert_non_null(scratch);
    kvs_attn_src src = {.q = q, .q_first = 0, .n_q = 3, .group = 2, .d = 2, .scale = 1.0f, .keys = tiny_keys,
                        .idx = NULL, .n_cand = 3};
    kvs_colsum_opts o = {.row_first = 0, .n_rows = 3, .head_first = 0, .n_heads = 2, .n_out = 3};
    struct {
        kvs_gqa_reduce red;
        float want[3];
    } cases[] = {
        {KVS_GQA_SUM, {3.125f, 2.125f, 0.75f}},
        {KVS_GQA_MEAN, {1.5625f, 1.0625f, 0.375f}},
        {KVS_GQA_MAX, {1.625f, 1.25f, 0.5f}}, /* max over the heads of the head sums */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float out[3] = {0, 0, 0};
        double out64[3] = {0, 0, 0};
        o.reduce = cases[c].red;
        kvs_attn_colsum(&src, &o, out, NULL, scratch);
        for (int j = 0; j < 3; j++) assert_float_equal(out[j], cases[c].want[j], 1e-6f);
        if (cases[c].red == KVS_GQA_MAX) continue;
        kvs_attn_colsum(&src, &o, NULL, out64, scratch);
        for (int j = 0; j < 3; j++) assert_near(out64[j], cases[c].want[j], 1e-6);
    }
    /* fp64 MAX reduces each row first (the per-step reduction): 1 + 1/2 + 1/4, 3/4 + 1/2, 1/2 */
    double mx64[3] = {0, 0, 0};
    o.reduce = KVS_GQA_MAX;
    kvs_attn_colsum(&src, &o, NULL, mx64, scratch);
    assert_near(mx64[0], 1.75, 1e-6);
    assert_near(mx64[1], 1.25, 1e-6);
    assert_near(mx64[2], 0.5, 1e-6);
    /* per head (NONE), rows 4 floats apart, the window of the last 2 rows; the padding stays untouched */
    float heads[8];
    for (int i = 0; i < 8; i++) heads[i] = -1.0f;
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 3; j++) heads[h * 4 + j] = 0;
    kvs_colsum_opts w = {.row_first = 1, .n_rows = 2, .head_first = 0, .n_heads = 2, .reduce = KVS_GQA_NONE,
                         .n_out = 3, .head_stride = 4};
    kvs_attn_colsum(&src, &w, heads, NULL, scratch);
    float want_heads[8] = {0.5f, 1.25f, 0.25f, -1.0f, 0.625f, 0.875f, 0.5f, -1.0f};
    for (int i = 0; i < 8; i++) assert_float_equal(heads[i], want_heads[i], 1e-6f);
    /* the output accumulates: a running score is added to, only the first n_out columns are written */
    double run[3] = {10, 20, 30};
    kvs_colsum_opts h1 = {.row_first = 0, .n_rows = 3, .head_first = 1, .n_heads = 1, .reduce = KVS_GQA_SUM,
                          .n_out = 2};
    kvs_attn_colsum(&src, &h1, NULL, run, scratch);
    assert_near(run[0], 10 + 1.625, 1e-6);
    assert_near(run[1], 20 + 0.875, 1e-6);
    assert_true(run[2] == 30);
    /* an index list: candidates {0, 2}; position 1 sees only position 0, position 2 sees both
     * (head 0 at position 2: scores 0 and 0 -> 1/2, 1/2) */
    int32_t idx[2] = {0, 2};
    kvs_attn_src sub = src;
    sub.idx = idx;
    sub.n_cand = 2;
    float col[2] = {0, 0};
    kvs_colsum_opts s0 = {.row_first = 1, .n_rows = 2, .head_first = 0, .n_heads = 1, .reduce = KVS_GQA_SUM,
                          .n_out = 2};
    kvs_attn_colsum(&sub, &s0, col, NULL, scratch);
    assert_float_equal(col[0], 1.5f, 1e-6f);
    assert_float_equal(col[1], 0.5f, 1e-6f);
    free(scratch);
}

/* The fp64 column sums of a batch of rows (each row's heads reduced in one pass) equal the rows added one call
 * at a time (one row a call: the row-by-row path), bit for bit, for SUM and MEAN over 1-8 heads: 4 (the
 * unrolled case), 3 and 6 (a mean's division not by a power of two). */
static void test_attn_colsum_rows_batched_same_bits(void **state) {
    (void)state;
    uint64_t seed = 99;
    const int groups[] = {1, 2, 3, 4, 6, 8};
    for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
        int group = groups[gi], d = 16;
        int64_t n = 70;
        float *q = malloc((size_t)(n * group * d) * sizeof *q), *k = malloc((size_t)(n * d) * sizeof *k);
        double *batched = malloc((size_t)n * sizeof *batched), *rows = malloc((size_t)n * sizeof *rows);
        void *scratch = malloc(kvs_attn_colsum_scratch_bytes(n));
        assert_true(q && k && batched && rows && scratch);
        fill_uniform(q, (size_t)(n * group * d), &seed, -3.0f, 3.0f);
        fill_uniform(k, (size_t)(n * d), &seed, -1.5f, 1.5f);
        /* logits far apart (scale 2): probabilities whose fp64 sums round, so the order of every add shows */
        kvs_attn_src src = {.q = q, .q_first = 0, .n_q = n, .group = group, .d = d, .scale = 2.0f, .keys = k,
                            .idx = NULL, .n_cand = n};
        for (int c = 0; c < 4; c++) {
            kvs_gqa_reduce red = c % 2 ? KVS_GQA_MEAN : KVS_GQA_SUM;
            int64_t r0 = c < 2 ? 5 : n - 2; /* many rows onto a running score, or the last 2 onto zeros */
            for (int64_t j = 0; j < n; j++) batched[j] = rows[j] = c < 2 ? 0.001 * (double)j : 0;
            kvs_colsum_opts o = {.row_first = r0, .n_rows = n - r0, .head_first = 0, .n_heads = group,
                                 .reduce = red, .n_out = n - 2};
            kvs_attn_colsum(&src, &o, NULL, batched, scratch);
            for (int64_t r = r0; r < n; r++) {
                kvs_colsum_opts one = o;
                one.row_first = r;
                one.n_rows = 1;
                kvs_attn_colsum(&src, &one, NULL, rows, scratch);
            }
            assert_memory_equal(batched, rows, (size_t)n * sizeof *rows);
        }
        free(q);
        free(k);
        free(batched);
        free(rows);
        free(scratch);
    }
}

static void test_attn_colsum_matches_naive(void **state) {
    (void)state;
    uint64_t seed = 12345;
    for (int trial = 0; trial < 48; trial++) {
        int group = 1 + trial % 3, d = 1 + (trial * 7) % 9;
        int64_t n = 3 + (trial * 13) % 41;
        /* later turns: a subset of the earlier positions is retained, then the whole new prompt */
        int64_t turn_begin = trial % 2 ? n / 3 : 0, q_first = turn_begin;
        int64_t n_q = n - q_first;
        float *q = malloc((size_t)(n_q * group * d) * sizeof *q), *k = malloc((size_t)(n * d) * sizeof *k);
        int32_t *idx = malloc((size_t)n * sizeof *idx);
        assert_true(q && k && idx);
        fill_uniform(q, (size_t)(n_q * group * d), &seed, trial % 4 == 3 ? -6.0f : -1.5f, trial % 4 == 3 ? 6.0f : 1.5f);
        fill_uniform(k, (size_t)(n * d), &seed, -1.5f, 1.5f);
        int64_t nc = 0;
        for (int64_t p = 0; p < turn_begin; p++)
            if (p % 3 != 1) idx[nc++] = (int32_t)p;
        for (int64_t p = turn_begin; p < n; p++) idx[nc++] = (int32_t)p;
        kvs_attn_src src = {.q = q, .q_first = q_first, .n_q = n_q, .group = group, .d = d,
                            .scale = 1.0f / sqrtf((float)d), .keys = k, .idx = turn_begin ? idx : NULL, .n_cand = nc};
        int64_t nr = 1 + trial % (int)n_q, r0 = n_q - nr; /* a window of the last rows (all of them at times) */
        int h0 = group > 1 ? trial % 2 : 0, nh = group - h0;
        double *S = malloc((size_t)(nh * nc) * sizeof *S), *R = malloc((size_t)(nr * nh * nc) * sizeof *R);
        double *tmp = malloc((size_t)(nh * nc) * sizeof *tmp);
        float *o32 = malloc((size_t)(nh * nc) * sizeof *o32);
        double *o64 = malloc((size_t)(nh * nc) * sizeof *o64);
        void *scratch = malloc(kvs_attn_colsum_scratch_bytes(nc));
        assert_true(S && R && tmp && o32 && o64 && scratch);
        naive_colsum(&src, r0, nr, h0, nh, S, R);
        int64_t n_out = nc - trial % 3; /* a prefix of the columns at times */
        for (kvs_gqa_reduce red = KVS_GQA_NONE; red <= KVS_GQA_MAX; red++) {
            kvs_colsum_opts o = {.row_first = r0, .n_rows = nr, .head_first = h0, .n_heads = nh, .reduce = red,
                                 .n_out = n_out};
            int64_t rows = red == KVS_GQA_NONE ? nh : 1;
            for (int64_t i = 0; i < nh * nc; i++) {
                o32[i] = 0;
                o64[i] = 0;
            }
            kvs_attn_colsum(&src, &o, o32, NULL, scratch);
            kvs_attn_colsum(&src, &o, NULL, o64, scratch);
            if (red == KVS_GQA_NONE) memcpy(tmp, S, (size_t)(nh * nc) * sizeof *tmp);
            else naive_reduce(S, nh, nc, red, tmp);
            for (int64_t h = 0; h < rows; h++)
                for (int64_t j = 0; j < n_out; j++) {
                    double want = tmp[h * nc + j];
                    /* fp32 sums of up to ~40 probabilities: a few 1e-6 */
                    assert_near(o32[h * n_out + j], want, 2e-5 * (1 + want));
                    if (red != KVS_GQA_MAX) assert_near(o64[h * n_out + j], want, 2e-6 * (1 + want));
                }
            if (red == KVS_GQA_MAX) { /* fp64: the max of each row's heads, summed over the rows */
                for (int64_t j = 0; j < n_out; j++) {
                    double want = 0;
                    for (int64_t r = 0; r < nr; r++) {
                        double m = -INFINITY;
                        for (int h = 0; h < nh; h++) {
                            double v = R[((size_t)r * (size_t)nh + (size_t)h) * (size_t)nc + (size_t)j];
                            m = v > m ? v : m;
                        }
                        want += m;
                    }
                    assert_near(o64[j], want, 2e-6 * (1 + want));
                }
            }
        }
        free(q);
        free(k);
        free(idx);
        free(S);
        free(R);
        free(tmp);
        free(o32);
        free(o64);
        free(scratch);
    }
}

/* Naive SnapKV score: the window's head sums reduced, then pooled (max, or zero-padded average), double. */
static void naive_snapkv(const kvs_attn_src *src, int64_t w, int64_t kernel, kvs_pool pool, int h0, int nh,
                         kvs_gqa_reduce red, double *out) {
    int64_t n = src->n_cand, m = n - w, rows = red == KVS_GQA_NONE ? nh : 1, hw = kernel / 2;
    double *S = malloc((size_t)(nh * n) * sizeof *S), *x = malloc((size_t)(nh * n) * sizeof *x);
    assert_true(S && x);
    naive_colsum(src, src->n_q - w, w, h0, nh, S, NULL);
    if (red == KVS_GQA_NONE) memcpy(x, S, (size_t)(nh * n) * sizeof *x);
    else naive_reduce(S, nh, n, red, x);
    for (int64_t h = 0; h < rows; h++)
        for (int64_t i = 0; i < m; i++) {
            double a = pool == KVS_POOL_MAX ? -INFINITY : 0;
            for (int64_t j = i - hw; j <= i + hw; j++) {
                if (j < 0 || j >= m) continue; /* max: -inf padding; avg: zero padding */
                double v = x[h * n + j];
                a = pool == KVS_POOL_MAX ? (v > a ? v : a) : a + v;
            }
            out[h * m + i] = pool == KVS_POOL_MAX ? a : a / (double)kernel;
        }
    free(S);
    free(x);
}

static void test_snapkv_scores_tiny_exact(void **state) {
    (void)state;
    float q[12];
    tiny_queries(q);
    void *scratch = malloc(kvs_attn_colsum_scratch_bytes(3));
    assert_non_null(scratch);
    kvs_attn_src src = {.q = q, .q_first = 0, .n_q = 3, .group = 2, .d = 2, .scale = 1.0f, .keys = tiny_keys,
                        .idx = NULL, .n_cand = 3};
    /* window 1 (position 2): prefix = positions 0, 1; head sums (1/4, 1/2) and (1/8, 3/8) */
    kvs_snapkv_opts o = {.window = 1, .kernel = 1, .pool = KVS_POOL_MAX, .head_first = 0, .n_heads = 2,
                         .reduce = KVS_GQA_MEAN};
    float out[4];
    assert_int_equal(kvs_snapkv_scores(&src, &o, out, scratch), 2);
    assert_float_equal(out[0], 0.1875f, 1e-6f);
    assert_float_equal(out[1], 0.4375f, 1e-6f);
    o.kernel = 3; /* max pooling over a 2-long prefix: both see both */
    kvs_snapkv_scores(&src, &o, out, scratch);
    assert_float_equal(out[0], 0.4375f, 1e-6f);
    assert_float_equal(out[1], 0.4375f, 1e-6f);
    o.pool = KVS_POOL_AVG; /* zero padding at both ends: (0 + 3/16 + 7/16) / 3 */
    kvs_snapkv_scores(&src, &o, out, scratch);
    assert_float_equal(out[0], 0.625f / 3, 1e-6f);
    assert_float_equal(out[1], 0.625f / 3, 1e-6f);
    /* window 2, per head, no pooling: head sums over positions 1, 2 of position 0 only */
    kvs_snapkv_opts ph = {.window = 2, .kernel = 1, .pool = KVS_POOL_AVG, .head_first = 0, .n_heads = 2,
                          .reduce = KVS_GQA_NONE};
    assert_int_equal(kvs_snapkv_scores(&src, &ph, out, scratch), 1);
    assert_float_equal(out[0], 0.5f, 1e-6f);
    assert_float_equal(out[1], 0.625f, 1e-6f);
    ph.reduce = KVS_GQA_SUM;
    kvs_snapkv_scores(&src, &ph, out, scratch);
    assert_float_equal(out[0], 1.125f, 1e-6f);
    ph.reduce = KVS_GQA_MAX;
    kvs_snapkv_scores(&src, &ph, out, scratch);
    assert_float_equal(out[0], 0.625f, 1e-6f);
    /* a window covering every candidate (clamped to the 3 query rows) leaves nothing to score */
    out[0] = -7.0f;
    ph.window = 32;
    assert_int_equal(kvs_snapkv_scores(&src, &ph, out, scratch), 0);
    assert_true(out[0] == -7.0f);
    free(scratch);
}

static void test_snapkv_scores_matches_naive(void **state) {
    (void)state;
    uint64_t seed = 99;
    /* (prompt, window, kernel): RocketKV stage 1 (32, 63) on a prompt shorter than the kernel, SnapKV's
     * LongBench (32, 7), the SnapKVCluster default (64, 5), and small odd cases */
    const int64_t cfg[][3] = {{100, 32, 63}, {90, 32, 7}, {140, 64, 5}, {9, 3, 3}, {12, 11, 5}, {20, 4, 1}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        for (int group = 1; group <= 3; group++) {
            int d = 4 + (int)c;
            int64_t n = cfg[c][0], w = cfg[c][1], kernel = cfg[c][2], m = n - w;
            float *q = malloc((size_t)(n * group * d) * sizeof *q), *k = malloc((size_t)(n * d) * sizeof *k);
            float *out = malloc((size_t)(group * m) * sizeof *out);
            double *want = malloc((size_t)(group * m) * sizeof *want);
            void *scratch = malloc(kvs_attn_colsum_scratch_bytes(n));
            assert_true(q && k && out && want && scratch);
            fill_uniform(q, (size_t)(n * group * d), &seed, -2.0f, 2.0f);
            fill_uniform(k, (size_t)(n * d), &seed, -2.0f, 2.0f);
            kvs_attn_src src = {.q = q, .q_first = 0, .n_q = n, .group = group, .d = d,
                                .scale = 1.0f / sqrtf((float)d), .keys = k, .idx = NULL, .n_cand = n};
            for (kvs_gqa_reduce red = KVS_GQA_NONE; red <= KVS_GQA_MAX; red++)
                for (kvs_pool pool = KVS_POOL_MAX; pool <= KVS_POOL_AVG; pool++) {
                    kvs_snapkv_opts o = {.window = w, .kernel = kernel, .pool = pool, .head_first = 0,
                                         .n_heads = group, .reduce = red};
                    assert_int_equal(kvs_snapkv_scores(&src, &o, out, scratch), m);
                    naive_snapkv(&src, w, kernel, pool, 0, group, red, want);
                    int64_t rows = red == KVS_GQA_NONE ? group : 1;
                    for (int64_t i = 0; i < rows * m; i++) assert_near(out[i], want[i], 2e-5 * (1 + want[i]));
                }
            free(q);
            free(k);
            free(out);
            free(want);
            free(scratch);
        }
    }
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

/* ---- sparse-attention estimation (RocketKV HSA, Quest, SparQ) ---- */

/* kvs_div_by equals the division bit for bit, power-of-two divisors (the multiply) and others, on values whose
 * quotients are subnormal, round, overflow nothing, or are infinite, NaN or signed zero. */
static void test_div_by_matches_division(void **state) {
    (void)state;
    const double v[] = {1.0, 3.0, 0.1, 1e308, -7.25, 5e-324, 3e-310, 2.2250738585072014e-308, -0.0, 0.0,
                        INFINITY, -INFINITY, NAN, 0.3333333333333333, 123456789.123, 1.0000000000000002};
    enum { N = sizeof v / sizeof *v };
    const int64_t ms[] = {1, 2, 3, 4, 5, 7, 8, 16, 32, 1024, 1000};
    for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
        double got[N], want[N];
        for (size_t j = 0; j < N; j++) got[j] = v[j], want[j] = v[j] / (double)ms[mi];
        kvs_div_by(got, N, ms[mi]);
        assert_memory_equal(got, want, sizeof got);
    }
}

/* kvs_heads_add against the policies' loops it replaced: added to out (H2O's mean, D2O's sum), and into a zeroed out,
 * the set (Scissorhands', TOVA's mean), bit for bit; 1-8 heads (powers of two and not), n past the vector width,
 * probabilities from 0 to 1, subnormal floats, negative values, a NaN and an inf. */
static void test_heads_add_matches_policy_loops(void **state) {
    (void)state;
    enum { N = 23, MAX_H = 8 };
    float rows[MAX_H][N];
    uint64_t x = 777;
    for (int h = 0; h < MAX_H; h++)
        for (int j = 0; j < N; j++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            rows[h][j] = (float)(x >> 40) / (float)(1u << 24);
        }
    rows[0][3] = 1e-45f;
    rows[1][3] = -1e-45f;
    rows[2][4] = -0.0f;
    rows[0][5] = -0.25f;
    rows[3][6] = NAN;
    rows[4][7] = INFINITY;
    const float *p[MAX_H];
    for (int h = 0; h < MAX_H; h++) p[h] = rows[h];
    for (int nh = 1; nh <= MAX_H; nh++)
        for (int mean = 0; mean < 2; mean++) {
            double acc[N], want_acc[N], set[N], want_set[N];
            for (int j = 0; j < N; j++) {
                acc[j] = want_acc[j] = 0.5 * j - 3.0;
                set[j] = 0;
                double a = 0;
                for (int h = 0; h < nh; h++) a += p[h][j];
                want_acc[j] += mean ? a / nh : a;
                want_set[j] = mean ? a / nh : a;
            }
            kvs_heads_add(p, (size_t)nh, N, mean, acc);
            kvs_heads_add(p, (size_t)nh, N, mean, set);
            assert_memory_equal(acc, want_acc, sizeof acc);
            assert_memory_equal(set, want_set, sizeof set);
        }
}

/* kvs_page_minmax_add against the branchy loop it replaced, on widths past the vector loop's (d 37: its tail),
 * NaNs in the key and in the summaries (a NaN key element keeps the old value; a NaN summary stays), -0 against
 * +0, and kmax aliasing kmin (the max then sees the min just stored, element by element). */
static void test_page_minmax_matches_branches(void **state) {
    (void)state;
    enum { D = 37, KEYS = 9 };
    float keys[KEYS][D];
    uint64_t x = 12345;
    for (int j = 0; j < KEYS; j++)
        for (int i = 0; i < D; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            keys[j][i] = (float)((int64_t)(x >> 33) % 2001 - 1000) / 100.0f;
        }
    keys[2][5] = NAN;
    keys[3][6] = -0.0f;
    keys[4][6] = 0.0f;
    keys[0][7] = NAN; /* the page starts with a NaN summary there */
    for (int alias = 0; alias < 2; alias++) {
        float mn[D], mx[D], wmn[D], wmx[D];
        float *gmx = alias ? mn : mx, *rmx = alias ? wmn : wmx;
        for (int j = 0; j < KEYS; j++) {
            kvs_page_minmax_add(mn, gmx, keys[j], D, j == 0);
            if (j == 0) {
                memcpy(wmn, keys[j], sizeof wmn);
                if (rmx != wmn) memcpy(rmx, keys[j], sizeof wmx);
                continue;
            }
            for (int i = 0; i < D; i++) {
                if (keys[j][i] < wmn[i]) wmn[i] = keys[j][i];
                if (keys[j][i] > rmx[i]) rmx[i] = keys[j][i];
            }
        }
        assert_memory_equal(mn, wmn, sizeof mn);
        if (!alias) assert_memory_equal(mx, wmx, sizeof mx);
        assert_true(isnan(mn[7]));
    }
}

static void test_page_minmax_and_scores(void **state) {
    (void)state;
    /* two pages of d = 3: keys {1,-2,0.5},{3,-1,-4} and {0,0,1} */
    const float k[3][3] = {{1, -2, 0.5f}, {3, -1, -4}, {0, 0, 1}};
    float mn[2][3], mx[2][3];
    kvs_page_minmax_add(mn[0], mx[0], k[0], 3, 1);
    kvs_page_minmax_add(mn[0], mx[0], k[1], 3, 0);
    kvs_page_minmax_add(mn[1], mx[1], k[2], 3, 1);
    const float want_mn[3] = {1, -2, -4}, want_mx[3] = {3, -1, 0.5f};
    assert_memory_equal(mn[0], want_mn, sizeof want_mn);
    assert_memory_equal(mx[0], want_mx, sizeof want_mx);
    assert_memory_equal(mn[1], k[2], sizeof want_mn);
    assert_memory_equal(mx[1], k[2], sizeof want_mn);
    /* Quest's bound (own signs, every dimension): q = {2, -1, 0.5}: 2*3 + -1*-2 + 0.5*0.5 = 8.25; page 1: 0.5 */
    const float q[3] = {2, -1, 0.5f};
    double out[3];
    kvs_page_scores(q, NULL, 3, NULL, &mn[0][0], &mx[0][0], 3, 2, out);
    assert_near(out[0], 8.25, 1e-12);
    assert_near(out[1], 0.5, 1e-12);
    /* the bound is >= every logit of the page */
    assert_true(out[0] >= 2 * 1 + 2 + 0.25 && out[0] >= 6 + 1 - 2);
    /* HSA: dimensions {0, 2}, signs chosen by the caller (dimension 2 reads the minimum) */
    const int32_t dims[2] = {0, 2};
    const uint8_t use_max[2] = {1, 0};
    kvs_page_scores(q, dims, 2, use_max, &mn[0][0], &mx[0][0], 3, 2, out);
    assert_near(out[0], 2 * 3 + 0.5 * -4, 1e-12);
    assert_near(out[1], 0.5, 1e-12);
    /* pages of one key (kmin = kmax = the keys): the partial dot product */
    kvs_page_scores(q, dims, 2, NULL, &k[0][0], &k[0][0], 3, 3, out);
    assert_near(out[0], 2 + 0.25, 1e-12);
}

/* HSA step 2: sum_g |q_g| ranks the dimensions (ties to the lower one), the group sign picks max (>= 0, also
 * at exactly 0: Algorithm 1) or min; dims come back ascending. */
static void test_qdims_topk_ties_and_group_sign(void **state) {
    (void)state;
    const float q1[4] = {1, -1, 1, 0.5f};
    int32_t dims[4];
    uint8_t use_max[4];
    double scratch[4];
    kvs_qdims_topk(q1, 1, 4, 2, dims, use_max, scratch);
    assert_int_equal(dims[0], 0);
    assert_int_equal(dims[1], 1);
    assert_int_equal(use_max[0], 1);
    assert_int_equal(use_max[1], 0);
    /* two heads: |q| sums {2, 1.5, 3, 0.5}; q sums {0, -1.5, 1, 0.5} */
    const float q2[2][4] = {{1, -1, 2, 0.25f}, {-1, -0.5f, -1, 0.25f}};
    kvs_qdims_topk(&q2[0][0], 2, 4, 3, dims, use_max, scratch);
    assert_int_equal(dims[0], 0);
    assert_int_equal(dims[1], 1);
    assert_int_equal(dims[2], 2);
    assert_int_equal(use_max[0], 1); /* sum exactly 0 reads Kmax */
    assert_int_equal(use_max[1], 0);
    assert_int_equal(use_max[2], 1);
    kvs_qdims_topk(&q2[0][0], 2, 4, 4, dims, NULL, scratch);
    for (int i = 0; i < 4; i++) assert_int_equal(dims[i], i);
}

static void test_sparq_temperature_and_page_softmax(void **state) {
    (void)state;
    const float q[4] = {3, -1, 0, 0}, z[4] = {0, 0, 0, 0};
    const int32_t d0[1] = {0};
    assert_near(kvs_sparq_temperature(q, d0, 1, 4), sqrt(3.0), 1e-12);
    assert_near(kvs_sparq_temperature(q, NULL, 4, 4), 2.0, 1e-12); /* every dimension: sqrt(d) */
    assert_near(kvs_sparq_temperature(z, d0, 1, 4), 1.0, 0);
    /* pages of 2 over 3 tokens (2 + 1), scores {0, ln 2}: Z = 2*1 + 1*2, per-token probabilities 1/4 and 2/4 */
    double s[2] = {0, log(2.0)}, out[2] = {0, 0};
    kvs_page_softmax_add(s, 2, 2, 3, 1.0, out);
    assert_near(out[0], 0.25, 1e-15);
    assert_near(out[1], 0.5, 1e-15);
    kvs_page_softmax_add(s, 2, 2, 3, 1.0, out); /* adds */
    assert_near(out[0], 0.5, 1e-15);
    /* the temperature divides the scores */
    double s2[2] = {0, 2 * log(2.0)}, o2[2] = {0, 0};
    kvs_page_softmax_add(s2, 2, 2, 3, 2.0, o2);
    assert_near(o2[1], 0.5, 1e-15);
}

/* POLICY_SPEC §2.2 step 8 / §1.4: pages by score, ties to the lower page, whole pages, then the oldest tokens of
 * the boundary page; the output ascending; NaN last. */
static void test_page_select_ties_and_boundary(void **state) {
    (void)state;
    int32_t out[16], scratch[8];
    const double sc[4] = {1.0, 2.0, 2.0, 0.5}; /* pages of 3 over 11 tokens: 0-2, 3-5, 6-8, 9-10 */
    assert_int_equal(kvs_page_select(sc, 4, 3, 11, 4, out, scratch), 4);
    const int32_t w4[4] = {3, 4, 5, 6};
    assert_memory_equal(out, w4, sizeof w4);
    assert_int_equal(kvs_page_select(sc, 4, 3, 11, 7, out, scratch), 7);
    const int32_t w7[7] = {0, 3, 4, 5, 6, 7, 8};
    assert_memory_equal(out, w7, sizeof w7);
    /* the partial last page: its two tokens, then the next page's oldest */
    const double last[4] = {0, 0, 0, 9};
    assert_int_equal(kvs_page_select(last, 4, 3, 11, 3, out, scratch), 3);
    const int32_t w3[3] = {0, 9, 10};
    assert_memory_equal(out, w3, sizeof w3);
    /* k beyond the tokens: everything */
    assert_int_equal(kvs_page_select(sc, 4, 3, 11, 99, out, scratch), 11);
    for (int i = 0; i < 11; i++) assert_int_equal(out[i], i);
    /* NaN ranks last; equal scores everywhere keep the oldest */
    const double nan_first[3] = {NAN, 1, 1};
    assert_int_equal(kvs_page_select(nan_first, 3, 2, 6, 3, out, scratch), 3);
    const int32_t wn[3] = {2, 3, 4};
    assert_memory_equal(out, wn, sizeof wn);
    /* pages of one token: a plain top-k with ties to the older token */
    const double tok[5] = {0.5, 0.7, 0.7, 0.1, 0.7};
    assert_int_equal(kvs_page_select(tok, 5, 1, 5, 2, out, scratch), 2);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 2);
}

/* kvs_page_take (the pages expanded in ascending order, no sort of the slots) against a written-out
 * reference: each token's score is its page's, the k best tokens by (score descending, NaN last, older first),
 * ascending; from rankings of every depth from kvs_page_select_depth() to all pages, on scores with ties, NaN and
 * a partial last page, every k; and kvs_page_select equal to it. */
typedef struct {
    double s;
    int32_t slot;
} tok_score;

static int tok_before(const tok_score *a, const tok_score *b) {
    int na = isnan(a->s), nb = isnan(b->s);
    if (na != nb) return nb;
    if (!na && a->s != b->s) return a->s > b->s;
    return a->slot < b->slot;
}

static void test_page_take_matches_token_order(void **state) {
    (void)state;
    enum { MAXP = 12, MAXT = 64 };
    kvs_rng rng;
    kvs_rng_seed(&rng, 12345, 0);
    for (int trial = 0; trial < 200; trial++) {
        size_t page = 1 + (size_t)(kvs_rng_u32(&rng) % 6), n_tokens = 1 + (size_t)(kvs_rng_u32(&rng) % MAXT);
        size_t n_pages = (n_tokens + page - 1) / page;
        if (n_pages > MAXP) {
            n_pages = MAXP;
            n_tokens = n_pages * page - (size_t)(kvs_rng_u32(&rng) % page);
        }
        double sc[MAXP];
        for (size_t pi = 0; pi < n_pages; pi++) {
            uint32_t r = kvs_rng_u32(&rng) % 8;
            sc[pi] = r == 0 ? NAN : (double)(r % 4); /* few values: ties everywhere */
        }
        tok_score t[MAXT];
        for (size_t j = 0; j < n_tokens; j++) t[j] = (tok_score){.s = sc[j / page], .slot = (int32_t)j};
        for (size_t a = 1; a < n_tokens; a++) /* insertion sort by the token order */
            for (size_t b = a; b > 0 && tok_before(&t[b], &t[b - 1]); b--) {
                tok_score x = t[b];
                t[b] = t[b - 1];
                t[b - 1] = x;
            }
        int32_t ranked[MAXP], out[MAXT], sel[MAXT], want[MAXT], scratch[MAXP];
        kvs_topk_f64(sc, n_pages, n_pages, ranked);
        for (size_t k = 1; k <= n_tokens + 1; k++) {
            size_t kk = k < n_tokens ? k : n_tokens;
            for (size_t j = 0; j < kk; j++) want[j] = t[j].slot;
            kvs_sort_positions(want, kk);
            for (size_t depth = kvs_page_select_depth(n_pages, page, kk); depth <= n_pages; depth++) {
                assert_int_equal(kvs_page_take(ranked, depth, page, n_tokens, k, out), (int64_t)kk);
                assert_memory_equal(out, want, kk * sizeof *want);
            }
            assert_int_equal(kvs_page_select(sc, n_pages, page, n_tokens, k, sel, scratch), (int64_t)kk);
            assert_memory_equal(sel, want, kk * sizeof *want);
        }
    }
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

/* kvs_n_cpus counts the CPUs the process may run on: pinned to one CPU (as Slurm's --cpus-per-task=1 or taskset
 * would), it says 1; with the mask restored, the mask's count. */
static void test_n_cpus_follows_the_affinity_mask(void **state) {
    (void)state;
    cpu_set_t saved, one;
    assert_int_equal(sched_getaffinity(0, sizeof saved, &saved), 0);
    assert_int_equal(kvs_n_cpus(), CPU_COUNT(&saved));
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, &saved)) first = c;
    assert_true(first >= 0);
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    int pinned = kvs_n_cpus();
    assert_int_equal(sched_setaffinity(0, sizeof saved, &saved), 0);
    assert_int_equal(pinned, 1);
    assert_int_equal(kvs_n_cpus(), CPU_COUNT(&saved));
}

/* kvs_alloc_rows: below 1 MiB plain memory; from 1 MiB up 2 MiB-aligned and advised MADV_HUGEPAGE (the mapping
 * that holds it carries smaps' "hg" flag wherever the kernel has transparent huge pages at all); every byte asked
 * for is usable (ASan checks the ends). */
static int smaps_flag_for(const void *p, const char *flag) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int inside = 0, found = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) { /* a mapping's header line */
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            continue;
        }
        if (inside && !strncmp(line, "VmFlags:", 8)) {
            char want[8];
            snprintf(want, sizeof want, " %s", flag);
            found = strstr(line, want) != NULL;
            break;
        }
    }
    fclose(f);
    return found;
}

static void test_alloc_rows_alignment_and_advice(void **state) {
    (void)state;
    unsigned char *small = kvs_alloc_rows(1000);
    assert_non_null(small);
    memset(small, 1, 1000);
    free(small);
    size_t big = ((size_t)3 << 20) + 5;
    unsigned char *p = kvs_alloc_rows(big);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % ((uintptr_t)2 << 20), 0);
    memset(p, 7, big);
    assert_int_equal(p[big - 1], 7);
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0)
        assert_int_equal(smaps_flag_for(p + big / 2, "hg"), 1);
    free(p);
}

/* ---- the percentile bootstrap of a mean (common/kvs_stats.h) ---- */

static void test_quantile_type7(void **state) {
    (void)state;
    const double x[] = {1, 2, 4, 8};
    assert_true(kvs_quantile_sorted(x, 4, 0) == 1);
    assert_true(kvs_quantile_sorted(x, 4, 1) == 8);
    assert_true(kvs_quantile_sorted(x, 4, 0.5) == 3);            /* position 1.5: halfway between 2 and 4 */
    assert_true(fabs(kvs_quantile_sorted(x, 4, 0.9) - 6.8) < 1e-12); /* position 2.7: 4 + 0.7 * 4 */
    assert_true(kvs_quantile_sorted(x, 1, 0.3) == 1);
}

static void test_bootstrap_mean(void **state) {
    (void)state;
    kvs_interval iv;
    /* one unit: its value, no interval */
    const double one[] = {0.25};
    assert_int_equal(kvs_bootstrap_mean(one, 1, 100, 0.95, 1, &iv), KVS_OK);
    assert_true(iv.mean == 0.25 && iv.lo == 0.25 && iv.hi == 0.25 && iv.n == 1);
    assert_int_equal(kvs_interval_resolved(&iv), 0);
    /* two units {0, 1}: resampled means are 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4, so the 2.5 % and 97.5 %
     * quantiles of 2000 resamples are 0 and 1 */
    const double two[] = {0, 1};
    assert_int_equal(kvs_bootstrap_mean(two, 2, 2000, 0.95, 7, &iv), KVS_OK);
    assert_true(iv.mean == 0.5 && iv.lo == 0 && iv.hi == 1);
    /* 40 units: the interval is close to the normal-theory one, mean +- 1.96 sd sqrt((n-1)/n) / sqrt(n) */
    double x[40], sum = 0, ss = 0;
    for (int i = 0; i < 40; i++) {
        x[i] = sin(0.7 * i) + 0.01 * i;
        sum += x[i];
    }
    double mean = sum / 40;
    for (int i = 0; i < 40; i++) ss += (x[i] - mean) * (x[i] - mean);
    double se = sqrt(ss / 40) / sqrt(40.0);
    assert_int_equal(kvs_bootstrap_mean(x, 40, 4000, 0.95, 11, &iv), KVS_OK);
    assert_true(fabs(iv.mean - mean) < 1e-12);
    assert_true(fabs((iv.hi - iv.lo) / (2 * 1.96 * se) - 1) < 0.1);
    assert_true(iv.lo < mean && mean < iv.hi);
    /* a function of its inputs and seed */
    kvs_interval again, other;
    assert_int_equal(kvs_bootstrap_mean(x, 40, 4000, 0.95, 11, &again), KVS_OK);
    assert_true(again.lo == iv.lo && again.hi == iv.hi);
    assert_int_equal(kvs_bootstrap_mean(x, 40, 4000, 0.95, 12, &other), KVS_OK);
    assert_true(other.lo != iv.lo || other.hi != iv.hi);
    /* bad input */
    const double bad[] = {1, NAN};
    assert_int_equal(kvs_bootstrap_mean(bad, 2, 10, 0.95, 1, &iv), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_bootstrap_mean(x, 0, 10, 0.95, 1, &iv), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_bootstrap_mean(x, 3, 0, 0.95, 1, &iv), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_bootstrap_mean(x, 3, 10, 1.0, 1, &iv), KVS_ERR_INVALID_ARG);
}

static void test_bootstrap_paired_difference(void **state) {
    (void)state;
    /* b is a plus a unit-specific offset that is always positive: the paired interval is above 0 although the two
     * unpaired intervals overlap widely (the units differ far more than the policies) */
    double a[8], b[8];
    for (int i = 0; i < 8; i++) {
        a[i] = 10.0 * i;
        b[i] = a[i] + 1.0 + 0.1 * (i % 3);
    }
    kvs_interval d, ia, ib;
    assert_int_equal(kvs_bootstrap_mean_diff(b, a, 8, 2000, 0.95, 3, &d), KVS_OK);
    assert_int_equal(kvs_bootstrap_mean(a, 8, 2000, 0.95, 3, &ia), KVS_OK);
    assert_int_equal(kvs_bootstrap_mean(b, 8, 2000, 0.95, 3, &ib), KVS_OK);
    assert_true(ia.hi > ib.lo); /* unpaired: overlapping */
    assert_true(d.lo >= 1.0 && d.hi <= 1.2); /* every difference is in [1, 1.2] */
    assert_int_equal(kvs_interval_resolved(&d), 1);
    assert_int_equal(kvs_bootstrap_mean_diff(a, b, 8, 2000, 0.95, 3, &d), KVS_OK);
    assert_int_equal(kvs_interval_resolved(&d), -1);
    /* differences of both signs: unresolved */
    const double p[] = {1, 2, 3, 4}, q[] = {2, 1, 4, 3};
    assert_int_equal(kvs_bootstrap_mean_diff(p, q, 4, 2000, 0.95, 3, &d), KVS_OK);
    assert_true(d.mean == 0);
    assert_int_equal(kvs_interval_resolved(&d), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantile_type7),
        cmocka_unit_test(test_bootstrap_mean),
        cmocka_unit_test(test_bootstrap_paired_difference),
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
        cmocka_unit_test(test_topk_f64_order_and_ties),
        cmocka_unit_test(test_topk_sorted_and_max_rows),
        cmocka_unit_test(test_topk_sorted_matches_a_naive_ranking),
        cmocka_unit_test(test_argsort_matches_topk),
        cmocka_unit_test(test_softmax_and_lse),
        cmocka_unit_test(test_scores_and_softmax_f64),
        cmocka_unit_test(test_attention_small_example),
        cmocka_unit_test(test_pooling),
        cmocka_unit_test(test_avgpool1d_pad_edges),
        cmocka_unit_test(test_attn_colsum_tiny_exact),
        cmocka_unit_test(test_attn_colsum_matches_naive),
        cmocka_unit_test(test_attn_colsum_rows_batched_same_bits),
        cmocka_unit_test(test_snapkv_scores_tiny_exact),
        cmocka_unit_test(test_snapkv_scores_matches_naive),
        cmocka_unit_test(test_norms_and_cosine),
        cmocka_unit_test(test_page_minmax_and_scores),
        cmocka_unit_test(test_page_minmax_matches_branches),
        cmocka_unit_test(test_div_by_matches_division),
        cmocka_unit_test(test_heads_add_matches_policy_loops),
        cmocka_unit_test(test_qdims_topk_ties_and_group_sign),
        cmocka_unit_test(test_sparq_temperature_and_page_softmax),
        cmocka_unit_test(test_page_select_ties_and_boundary),
        cmocka_unit_test(test_page_take_matches_token_order),
        cmocka_unit_test(test_npy_header_layout),
        cmocka_unit_test(test_n_cpus_follows_the_affinity_mask),
        cmocka_unit_test(test_alloc_rows_alignment_and_advice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
