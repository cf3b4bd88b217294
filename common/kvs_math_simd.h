/* kvs_math_simd.h — the runtime-dispatched kernels under kvs_math.h (the replay at the hardware's speed,
 * sim/BENCH.md; ../shared/STYLE.md rule 9: the default build runs on any x86-64 and reaches the vector units through
 * `__attribute__((target))` variants picked by a CPU check, each tested against the scalar reference).
 *
 * One table of kernels per instruction set. The scalar table is the reference: it is the code kvs_math.c ran
 * before the kernels existed, so KVS_SIMD=scalar reproduces earlier results bit for bit. Every vector variant
 * computes each dot product, each output element and each exponential the same way whatever the tiling, the
 * number of query rows or the blocking, so a row's numbers never depend on how many rows were computed
 * together (the blocked full attention equals the row-by-row one bit for bit on one instruction set).
 * The vector tables compute the same operations in the same order, so they give the same bits (tests/test_simd.c);
 * the scalar reference differs from them by rounding only (tolerances there).
 *
 * Each table also reads K/V rows kept in a trace's 16 bits (fp16 / bf16: scores16, output_add16), equal bit for bit
 * to its fp32 entries on the converted rows; the engines keep such a history unless KVS_KV16=0.
 *
 * Selection, once per process: the environment variable KVS_SIMD's table when it names one ("scalar", "avx2",
 * "avx2x32", "avx512"; a table the CPU lacks falls back to the best below it). Otherwise, on a CPU with AVX-512VL,
 * avx512 (the AVX2 arithmetic on 16 lanes) where a timed probe finds 512-bit FMAs at least 1.5x as fast as 256-bit
 * ones, else avx2x32 (the AVX2 arithmetic in wider tiles over 32 registers); AVX2 on a CPU with AVX2 and FMA only;
 * else scalar. The three vector tables give the same bits, so the probe's timing can change the speed only.
 */
#ifndef KVS_MATH_SIMD_H
#define KVS_MATH_SIMD_H

#include <stddef.h>
#include <stdint.h>

#include "kvs.h"

typedef enum {
    KVS_ISA_SCALAR = 0,  /* plain C (the compiler's SSE2 at -O2): the reference */
    KVS_ISA_AVX2 = 1,    /* AVX2 + FMA, 8 fp32 lanes */
    KVS_ISA_AVX2X32 = 2, /* the AVX2 arithmetic with AVX-512VL's 32 registers (wider tiles): AVX2's results */
    KVS_ISA_AVX512 = 3,  /* the AVX2 arithmetic on 16 lanes (scores and output tiles): AVX2's results */
    KVS_ISA_COUNT
} kvs_isa;

/* Kernel table of one instruction set. Row pointers let a caller lay rows out as it needs (the replay keeps
 * each position's probability rows [group][p+1] contiguous). `idx` selects key/value rows (NULL = 0..n-1);
 * rows are `stride` floats apart. */
typedef struct {
    const char *name;
    /* sum_i a[i]*b[i] */
    float (*dot)(const float *a, const float *b, size_t n);
    /* out[i] += w * v[i] */
    void (*axpy)(float *out, float w, const float *v, size_t n);
    /* out_rows[r][col0 + j] = scale * q_r . K[row j], r < nr (query rows q + r*d), j < n */
    void (*scores)(const float *q, size_t nr, const float *keys, size_t stride, const int32_t *idx, size_t n,
                   size_t d, float scale, float *const *out_rows, size_t col0);
    /* out_rows[r][i] += sum_j p_rows[r][col0 + j] * V[row j][i], j ascending, r < nr, i < d */
    void (*output_add)(const float *const *p_rows, size_t nr, size_t col0, const float *values, size_t stride,
                       const int32_t *idx, size_t n, size_t d, float *const *out_rows);
    /* in-place softmax of x[0..n-1] (n > 0); @return the LSE (kvs_softmax's contract) */
    double (*softmax)(float *x, size_t n);
    /* softmax's probabilities bit for bit, without the LSE: for the callers that drop it (its log is a libm call
     * per softmax) */
    void (*softmax_probs)(float *x, size_t n);
    /* exp of each element (y may alias x); the softmax's exponential, exposed for the accuracy test */
    void (*exp)(const float *x, size_t n, float *y);
    /* the first j in [from, n) with x[j] > thr (ordered: NaN never), or n: top-k's filter */
    size_t (*first_above)(const float *x, size_t from, size_t n, float thr);
    /* 16-bit K/V (K/V kept in the trace's 16-bit form; sim/BENCH.md "K/V in 16 bits"): `keys` / `values` rows
     * hold `dtype` (KVS_DTYPE_F16 or KVS_DTYPE_BF16) elements, `stride` elements apart, d <= KVS_KV16_MAX_DIM.
     * Each is the fp32 entry above on the rows' exact fp32 conversion, bit for bit: rows are converted
     * (vcvtph2ps / a 16-bit shift on the vector tables, kvs_f16_to_f32 / kvs_bf16_to_f32 on the scalar one)
     * either a tile at a time into an L1-resident buffer that the table's own fp32 kernel then reads, or in
     * registers as the kernel loads them, in the fp32 kernel's order (kvs_math_simd.c says which table does
     * which); the fp32 kernels' rows do not depend on the tiling (above). Memory traffic on the K/V rows is half
     * the fp32 kernels'. */
    void (*scores16)(const float *q, size_t nr, const uint16_t *keys, kvs_dtype dtype, size_t stride,
                     const int32_t *idx, size_t n, size_t d, float scale, float *const *out_rows, size_t col0);
    void (*output_add16)(const float *const *p_rows, size_t nr, size_t col0, const uint16_t *values, kvs_dtype dtype,
                         size_t stride, const int32_t *idx, size_t n, size_t d, float *const *out_rows);
    /* The replay's check of a selection list (sim/replay.c check_sel): 1 when idx[0..n) (n >= 1) is strictly
     * ascending within [0, p] and row_k[0..n) and row_v[0..n) are all NULL (no merged slot), else 0. */
    int (*list_plain)(const int32_t *idx, const void *const *row_k, const void *const *row_v, size_t n, int64_t p);
    /* out[j] = v . K[row j] over d in fp32, the products summed in any order: not the same bits from one table to
     * the next, only within the bound of any order (Higham 3.1: gamma_d sum_i |v_i k_i|). For screens that need
     * that bound alone (kvs_key_scores_lowest). */
    void (*dots_loose)(const float *v, const float *keys, size_t stride, const int32_t *idx, size_t n, size_t d,
                       float *out);
    /* key[i] = kvs_desc_key(x[i]) for i < n (kvs_math.h: the rankings' radix sort keys), the same keys in every
     * table */
    void (*desc_keys)(const float *x, size_t n, uint32_t *key);
} kvs_math_kernels;

/*! kvs_math_kv16_default() : 1 when the engines (sim/replay.c, trace/kv_stream.c) keep a 16-bit K/V history for the
 *  16-bit kernels unless told otherwise: the environment's KVS_KV16 ("0" = no, anything else = yes), read at
 *  each call; 1 when unset (sim/BENCH.md "K/V in 16 bits" has the measurement behind the default). */
int kvs_math_kv16_default(void);

/* Largest head_dim the 16-bit kernels take (the trace format's limit, trace/trace.h KVS_TRACE_MAX_HEAD_DIM). */
#define KVS_KV16_MAX_DIM 1024

/*! kvs_math_kernels_for() : the table of `isa`, or NULL when this CPU (or this build) lacks it. Borrowed,
 *  static. Tests run every non-NULL table against the scalar one. */
const kvs_math_kernels *kvs_math_kernels_for(kvs_isa isa);

/*! kvs_math_kernels_active() : the table kvs_math.h's functions use (the selection above). */
const kvs_math_kernels *kvs_math_kernels_active(void);

/*! kvs_math_isa_active() : the instruction set of kvs_math_kernels_active(). */
kvs_isa kvs_math_isa_active(void);

/*! kvs_math_fma512_speedup() : what the selection's probe measured, 512-bit FMA lanes per second over 256-bit ones
 *  (about 2 where 512-bit FMAs run at full rate, 1 where they are split in two); 0 when KVS_SIMD chose or the CPU
 *  lacks AVX-512VL. */
double kvs_math_fma512_speedup(void);

/*! kvs_math_isa_name() : "scalar", "avx2", "avx2x32", "avx512". */
const char *kvs_math_isa_name(kvs_isa isa);

/* Accuracy of the vector exponential against libm's expf (tests/test_simd.c checks it on a dense grid):
 * relative error at most KVS_SIMD_EXP_REL_ERR for x in [KVS_SIMD_EXP_LO, 88.7]; below KVS_SIMD_EXP_LO the
 * result is 0 (libm's results there are subnormal, < 1.2e-38, which a softmax over fp32 cannot resolve). */
#define KVS_SIMD_EXP_REL_ERR 3e-7
#define KVS_SIMD_EXP_LO (-87.33f)

#endif /* KVS_MATH_SIMD_H */
