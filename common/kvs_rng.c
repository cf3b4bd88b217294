/* kvs_rng.c — PCG32 and the distributions of kvs_rng.h, written from the PCG paper's definition of
 * PCG-XSH-RR (64-bit LCG state, xorshift-high then random rotation to 32 bits).
 */
#include "kvs_rng.h"

#include <math.h>

#define PCG_MULT 6364136223846793005ull

uint32_t kvs_rng_u32(kvs_rng *r) {
    uint64_t old = r->state;
    r->state = old * PCG_MULT + r->inc;
    uint32_t xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    uint32_t rot = (uint32_t)(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
}

void kvs_rng_seed(kvs_rng *r, uint64_t seed, uint64_t stream) {
    r->state = 0;
    r->inc = (stream << 1u) | 1u;
    (void)kvs_rng_u32(r);
    r->state += seed;
    (void)kvs_rng_u32(r);
}

double kvs_rng_open01(kvs_rng *r) { return ((double)kvs_rng_u32(r) + 0.5) * (1.0 / 4294967296.0); }

double kvs_rng_gumbel(kvs_rng *r) { return -log(-log(kvs_rng_open01(r))); }

uint64_t kvs_fnv1a64(uint64_t h, const char *s) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) h = (h ^ *c) * 1099511628211ull;
    return h;
}
