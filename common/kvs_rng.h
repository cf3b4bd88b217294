/* kvs_rng.h — a small seeded random generator for randomised policies and tests: PCG32 (O'Neill 2014,
 * "PCG: A Family of Simple Fast Space-Efficient Statistically Good Algorithms for Random Number Generation",
 * the PCG-XSH-RR 64/32 member with the reference multiplier, seeded as the reference pcg32_srandom_r()), plus
 * the few distributions kvsim needs. Plain value state, no hidden global state (STYLE.md rule 7): a (seed,
 * stream) pair always gives the same numbers on every platform (integer arithmetic; the double conversions
 * are exact and log() is the C library's).
 *
 * Used by policies/keyformer.c (Gumbel noise, POLICY_SPEC §2.6 B7 [SIM-CHOICE] "PCG32 seeded by (sample,
 * layer, head, step)"). gpu_capture/sampler.c keeps its own default-stream PCG32 (kvs_pcg32_next), whose
 * numbers the capture tests depend on.
 */
#ifndef KVS_RNG_H
#define KVS_RNG_H

#include <stdint.h>

/* Generator state: a plain value (copy it to fork a stream). */
typedef struct {
    uint64_t state;
    uint64_t inc; /* stream selector, always odd */
} kvs_rng;

/*! kvs_rng_seed() : pcg32_srandom_r(r, seed, stream): the generator for initial state `seed` on stream
 *  `stream` (2^63 distinct streams: bit 63 of `stream` is ignored). Different streams give independent
 *  sequences for the same seed. */
void kvs_rng_seed(kvs_rng *r, uint64_t seed, uint64_t stream);

/*! kvs_rng_u32() : the next 32-bit output (pcg32_random_r). */
uint32_t kvs_rng_u32(kvs_rng *r);

/*! kvs_rng_open01() : a uniform number in the OPEN interval (0, 1): (x + 0.5) / 2^32 for the next 32-bit
 *  output x, so never 0 or 1 (its extremes are 2^-33 and 1 - 2^-33), exact in double. */
double kvs_rng_open01(kvs_rng *r);

/* Seeds from identities: the 64-bit FNV-1a hash (offset basis KVS_FNV1A64_BASIS, prime 1099511628211) of an
 * identity string, streamed piece by piece (the pieces hash as their concatenation), so that randomness is a
 * function of what is measured or compared, never of the clock. */
#define KVS_FNV1A64_BASIS 14695981039346656037ull

/*! kvs_fnv1a64() : FNV-1a continued from h over the bytes of the NUL-terminated s. */
uint64_t kvs_fnv1a64(uint64_t h, const char *s);

/*! kvs_rng_gumbel() : a standard Gumbel(0, 1) sample g = -log(-log(u)) with u = kvs_rng_open01(r); always
 *  finite (|g| < 23.2). */
double kvs_rng_gumbel(kvs_rng *r);

#endif /* KVS_RNG_H */
