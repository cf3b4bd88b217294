/* matmul.h — the CPU forward pass's matrix products (../shared/DESIGN.md "Capture"): Y = X W^T (+ b) for a block of
 * positions X [n][cols] (fp32 activations) against a weight matrix W [rows][cols] kept in its checkpoint dtype
 * (fp32, fp16 or bf16, read in place from the mmap'd file: no fp32 copy of a 16-bit checkpoint). Accumulation is
 * fp32; 16-bit weights are widened exactly (bf16 by a 16-bit shift, fp16 by F16C / AVX-512 vcvtph2ps), in
 * registers from 32-row panels packed once at load (kvs_wmat_pack) or, unpacked, a small tile at a time into an
 * L1-resident buffer; every position of a block reuses what was read, so a prompt of n positions reads each
 * weight once per block instead of once per position.
 *
 * Arithmetic (what makes the blocked prefill equal the token-by-token decode): an output element's value depends
 * only on its x row, its w row and the instruction set — never on n, on which rows share a tile, or on the thread
 * that computes it.
 *  - Packed 16-bit matrices (kvs_wmat_pack; every 16-bit matrix of a loaded model): one fmaf chain over k in
 *    ascending order, the same bits at every instruction set too (an outer-product kernel over the panels).
 *  - Unpacked matrices (fp32 checkpoints, as the shared models): the reduction dimension is cut into chunks of
 *    KVS_GEMM_KC; within a chunk each element is one vector-lane FMA chain (16 lanes on AVX-512, 8 on AVX2, 8
 *    partial sums in the scalar code) reduced by a fixed tree, and the chunk sums are added to the output in
 *    ascending order. Different instruction sets differ by fp32 summation order only.
 * tests/test_prefill.c bounds both against a double-precision reference.
 *
 * Selection, once per process: KVS_SIMD=scalar|avx2|avx512 (the variable common/kvs_math_simd.h reads; avx2x32
 * counts as avx2; a level the CPU lacks falls back to the best below it), else the widest the CPU has. Never
 * -march=native: the vector kernels are __attribute__((target)) variants behind a CPUID check.
 */
#ifndef KVS_MATMUL_H
#define KVS_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"
#include "../common/threadpool.h"

/* Reduction chunk: within it an element is one lane-parallel FMA chain; chunk sums are added in order. */
#define KVS_GEMM_KC 1024

/* A weight matrix as stored: row-major [rows][cols] elements of `dtype` (F32, F16 or BF16, little-endian), and for
 * a 16-bit matrix optionally its panel copy (kvs_wmat_pack), which the products then read instead of `data`. */
typedef struct {
    const void *data;
    kvs_dtype dtype;
    const uint16_t *packed; /* NULL, or [ceil(rows / KVS_PANEL)][cols][KVS_PANEL] 16-bit panels (see below) */
} kvs_wmat;

/* Rows of a weight panel. A packed 16-bit matrix is stored panel by panel, each panel column by column: the
 * KVS_PANEL weights of rows p*KVS_PANEL .. +KVS_PANEL-1 at column k are 64 contiguous bytes (rows past the matrix
 * are zero). Within those bytes row r sits at slot kvs_wmat_slot(dtype, r): for fp16 slot r (two 16-lane halves
 * for vcvtph2ps), for bf16 the 32-bit word r % 16 holds row r in its low half and row r + 16 in its high half (a
 * 16-bit shift and a mask widen one vector each). Packed matrices use the outer-product kernel: an output element
 * is ONE fp32 fmaf chain over k in ascending order (x[k] * w[k] + acc, from +0), then + bias — the same bits at
 * every instruction set, block size, tile and thread. */
#define KVS_PANEL 32

static inline int kvs_wmat_slot(kvs_dtype dt, int r) { return dt == KVS_DTYPE_BF16 ? 2 * (r & 15) + (r >> 4) : r; }

/*! kvs_wmat_pack() : packs the 16-bit matrix w [rows][cols] into panels (a new 64-byte aligned allocation the
 *  caller frees with free()) and sets w->packed; KVS_ERR_INVALID_ARG for an fp32 matrix, KVS_ERR_NOMEM. */
kvs_status kvs_wmat_pack(kvs_wmat *w, int rows, int cols);

/*! kvs_wmat_packed_at() : element (r, k) of a packed matrix with `cols` columns, widened to fp32. */
float kvs_wmat_packed_at(const kvs_wmat *w, int cols, int r, int k);

/* One product of a multi-GEMM: y[i * ldy + r] = x_i . w[r] (+ bias[r]) for r < rows. */
typedef struct {
    kvs_wmat w;
    const float *bias; /* [rows] or NULL */
    float *y;
    size_t ldy;
    int rows;
} kvs_gemm_out;

typedef enum { KVS_GEMM_SCALAR = 0, KVS_GEMM_AVX2 = 1, KVS_GEMM_AVX512 = 2, KVS_GEMM_COUNT } kvs_gemm_isa;

/*! kvs_gemm_multi() : every product of outs[0..n_outs) over the same input rows x [n][cols] (rows ldx floats
 *  apart), as one parallel section of `pool` (NULL = the calling thread): q/k/v, or gate/up. Rows of the
 *  outputs are split among the workers; small products run on the caller. */
void kvs_gemm_multi(kvs_threadpool *pool, const float *x, size_t ldx, int n, int cols, const kvs_gemm_out *outs,
                    int n_outs);

/*! kvs_gemm() : one product, kvs_gemm_multi with one output. */
void kvs_gemm(kvs_threadpool *pool, const float *x, size_t ldx, int n, int cols, kvs_wmat w, const float *bias,
              int rows, float *y, size_t ldy);

/*! kvs_gemm_test_scratch_fail() : test hook: on != 0 makes every blocked product of packed matrices take the path of
 *  a failed scratch allocation (X copied tile by tile, the same bits); 0 restores. Not thread-safe against running
 *  products. */
void kvs_gemm_test_scratch_fail(int on);

/*! kvs_wmat_row_f32() : row `r` of w [rows][cols] widened to fp32 into dst[cols] (the embedding lookup). */
void kvs_wmat_row_f32(kvs_wmat w, size_t cols, size_t r, float *dst);

/*! kvs_gemm_isa_available() : 1 when this CPU (and build) runs `isa`'s kernels. */
int kvs_gemm_isa_available(kvs_gemm_isa isa);
/*! kvs_gemm_isa_get() : the level in use (selected on first use, see above). */
kvs_gemm_isa kvs_gemm_isa_get(void);
/*! kvs_gemm_isa_set() : forces `isa` (tests, bench); KVS_ERR_UNSUPPORTED when unavailable. Not thread-safe
 *  against running products. */
kvs_status kvs_gemm_isa_set(kvs_gemm_isa isa);
/*! kvs_gemm_isa_name() : "scalar", "avx2", "avx512". */
const char *kvs_gemm_isa_name(kvs_gemm_isa isa);

#endif /* KVS_MATMUL_H */
