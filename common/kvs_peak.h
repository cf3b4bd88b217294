/* kvs_peak.h — the machine's measured ceilings, the yardsticks of `make bench` (every replay figure is reported
 * as a fraction of what the hardware does; sim/BENCH.md "Yardsticks and floors"): the fp32 FMA rate of a vector
 * FMA loop on the widest instruction set the CPU has (AVX-512F, AVX2+FMA, or SSE2 multiply+add), per core and on
 * all cores, and the bandwidth of a streaming read from memory. Timed measurements: numbers vary with the machine's load, and
 * nothing asserts them.
 */
#ifndef KVS_PEAK_H
#define KVS_PEAK_H

#include <stddef.h>

typedef enum {
    KVS_PEAK_SSE2 = 0,   /* 4 lanes, multiply then add (no FMA instruction): counted as one FMA per lane */
    KVS_PEAK_AVX2 = 1,   /* 8 lanes, vfmadd */
    KVS_PEAK_AVX512 = 2, /* 16 lanes, vfmadd on zmm */
    KVS_PEAK_COUNT
} kvs_peak_isa;

/*! kvs_peak_isa_available() : 1 when this CPU (and build) can run the loop of `isa`. */
int kvs_peak_isa_available(kvs_peak_isa isa);

/*! kvs_peak_isa_name() : "sse2", "avx2+fma", "avx512f". */
const char *kvs_peak_isa_name(kvs_peak_isa isa);

/*! kvs_peak_fma() : fp32 FMAs per second of `threads` threads each running the vector FMA loop of `isa` (12
 *  independent accumulators, registers only) for about `seconds`; summed over the threads. 0 when isa is not
 *  available or threads < 1. */
double kvs_peak_fma(kvs_peak_isa isa, int threads, double seconds);

/*! kvs_peak_read_bandwidth() : bytes per second of `threads` threads summing disjoint parts of a `bytes`
 *  buffer (much larger than the caches), best of `reps` passes after one warm-up. 0 when out of memory. */
double kvs_peak_read_bandwidth(size_t bytes, int threads, int reps);

#endif /* KVS_PEAK_H */
