/* test_rng.c — common/kvs_rng.c: PCG32 against the reference implementation's published sequence
 * (pcg32-demo, pcg32_srandom_r(&rng, 42, 54)), streams, copies, and the open-interval uniform and Gumbel
 * samplers (range, and moments against their closed forms).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

#include "../common/kvs_rng.h"

static void test_pcg32_reference_sequence(void **state) {
    (void)state;
    /* pcg-c-basic pcg32-demo, "Round 1" with seed 42 and sequence 54 */
    const uint32_t want[] = {0xa15c02b7u, 0x7b47f409u, 0xba1d3330u, 0x83d2f293u, 0xbfa4784bu, 0xcbed606eu};
    kvs_rng r;
    kvs_rng_seed(&r, 42u, 54u);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) assert_int_equal(kvs_rng_u32(&r), want[i]);
}

static void test_streams_differ_and_copies_repeat(void **state) {
    (void)state;
    kvs_rng a, b, c;
    kvs_rng_seed(&a, 7, 1);
    kvs_rng_seed(&b, 7, 2);
    kvs_rng_seed(&c, 8, 1);
    int same_ab = 0, same_ac = 0;
    for (int i = 0; i < 64; i++) {
        uint32_t x = kvs_rng_u32(&a);
        same_ab += x == kvs_rng_u32(&b);
        same_ac += x == kvs_rng_u32(&c);
    }
    assert_true(same_ab < 2);
    assert_true(same_ac < 2);
    kvs_rng copy = a; /* a plain value: a copy continues the same sequence */
    for (int i = 0; i < 16; i++) assert_int_equal(kvs_rng_u32(&copy), kvs_rng_u32(&a));
    kvs_rng_seed(&b, 7, 1);
    kvs_rng_seed(&c, 7, 1);
    for (int i = 0; i < 16; i++) assert_int_equal(kvs_rng_u32(&b), kvs_rng_u32(&c));
}

static void test_open01_and_gumbel_ranges_and_moments(void **state) {
    (void)state;
    kvs_rng r;
    kvs_rng_seed(&r, 12345, 6789);
    const int n = 200000;
    double su = 0, sg = 0, sg2 = 0;
    for (int i = 0; i < n; i++) {
        double u = kvs_rng_open01(&r);
        assert_true(u > 0.0 && u < 1.0);
        su += u;
    }
    for (int i = 0; i < n; i++) {
        double g = kvs_rng_gumbel(&r);
        assert_true(isfinite(g) && fabs(g) < 23.2);
        sg += g;
        sg2 += g * g;
    }
    /* Uniform mean 1/2 (sd 0.29/sqrt(n) = 6.5e-4); Gumbel(0,1) mean = Euler's gamma, variance pi^2/6 */
    assert_true(fabs(su / n - 0.5) < 0.004);
    double mean = sg / n, var = sg2 / n - mean * mean;
    assert_true(fabs(mean - 0.5772156649) < 0.015);
    assert_true(fabs(var - M_PI * M_PI / 6.0) < 0.05);
    /* the extremes of the open interval: (0 + 0.5) / 2^32 and (2^32 - 1 + 0.5) / 2^32, never 0 or 1 */
    assert_true(-log(-log(0.5 / 4294967296.0)) > -3.2);
    assert_true(-log(-log((4294967295.0 + 0.5) / 4294967296.0)) < 23.2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pcg32_reference_sequence),
        cmocka_unit_test(test_streams_differ_and_copies_repeat),
        cmocka_unit_test(test_open01_and_gumbel_ranges_and_moments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
