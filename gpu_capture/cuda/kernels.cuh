/* kernels.cuh — the CUDA backend's own kernels (everything that is not a cuBLAS GEMM), as host-side
 * launchers. Each mirrors one step of the CPU reference forward pass in gpu_capture/model.c, and
 * tests/test_cuda.c compares each against a CPU reference on random inputs (through cuda_testing.h).
 *
 * Conventions: row-major buffers, shapes in comments as [rows][cols]; "act" buffers are in the weight
 * dtype `dt` (fp32, fp16 or bf16: what the next GEMM consumes), everything else fp32. All launchers
 * enqueue on `stream` and return the launch status through CU_TRY (KVS_OK or an error with file:line).
 * Limits checked by the backend before any launch: head_dim even and <= KVS_CUDA_MAX_HEAD_DIM, rows per
 * launch <= KVS_CUDA_CHUNK.
 */
#ifndef KVS_CUDA_KERNELS_CUH
#define KVS_CUDA_KERNELS_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../../common/kvs.h"
}

#define KVS_CUDA_MAX_HEAD_DIM 256 /* per-lane registers: head_dim / 32 <= 8 */
#define KVS_CUDA_CHUNK 64         /* rows (positions) per batched forward; tokens travel as a kernel argument */
#define KVS_CUDA_ATTN_TILE 16     /* keys per shared-memory tile in the prefill attention kernel */

/* Token ids of one chunk, passed by value (256 bytes of kernel parameters) so no host->device copy is
 * needed per step. */
typedef struct {
    int32_t ids[KVS_CUDA_CHUNK];
} kvs_cuda_tokens;

/* Where a kernel also stores what the trace records (NULL base = not recording). For row r and this
 * layer the record of that row starts at base + r * row_stride; within it q, k, v, o, lse lie at the
 * given float offsets (see backend.cu for the layout). */
typedef struct {
    float *base;
    int64_t row_stride; /* floats between consecutive positions' records */
    int32_t q_off, k_off, v_off, o_off, lse_off;
} kvs_cuda_rec;

/* x[r][:] = table[tokens[r]][:] as fp32; table [vocab][dim] in dtype dt. */
kvs_status kvs_cuda_embed(cudaStream_t stream, kvs_dtype dt, const void *table, int dim, const kvs_cuda_tokens *tok,
                          int n, float *x);

/* out[r][i] = w[i] * (x[r][i] * inv_r), inv_r = 1/sqrt(mean(x[r]^2) + eps) (sum of squares in fp64, as
 * model.c rmsnorm); out [n][dim] in dtype dt, x [n][dim], w [dim] fp32. */
kvs_status kvs_cuda_rmsnorm(cudaStream_t stream, kvs_dtype dt, const float *x, const float *w, int n, int dim,
                            float eps, void *out);

/* Post-projection step of attention for rows r < n at positions pos0 + r: qkv [n][q_dim + 2 kv_dim] (q, k, v
 * projections side by side) gets the optional biases, q and k are rotated (RoPE, `layout` kvs_rope_layout,
 * angle pos * inv_freq[i] computed in fp64 as model.c does), q goes to q_out [n][q_dim], k and v to row
 * pos0 + r of the layer's caches kc, vc [max_pos][kv_dim], and all three to the record when rec.base. */
kvs_status kvs_cuda_qkv_rope(cudaStream_t stream, const float *qkv, const float *bq, const float *bk, const float *bv,
                             const float *inv_freq, int layout, int n, int pos0, int n_heads, int n_kv_heads,
                             int head_dim, float *q_out, float *kc, float *vc, kvs_cuda_rec rec);

/* Causal GQA attention for rows r < n (query position pos0 + r attends to cache rows 0..pos0 + r):
 * q [n][n_heads*head_dim], kc/vc [>= pos0+n][n_kv_heads*head_dim] (query head h reads KV head
 * h / (n_heads / n_kv_heads)); o [n][n_heads*head_dim] = softmax(scale q K^T) V, lse [n][n_heads] the
 * natural-log log-sum-exp of the scaled scores; both also to the record when rec.base. n == 1 uses the
 * decode kernel (one block per query head, keys split over 8 warps, online softmax, merged), unless
 * force_prefill; otherwise the prefill kernel (one warp per query row, K/V tiles in shared memory). */
kvs_status kvs_cuda_attention(cudaStream_t stream, const float *q, const float *kc, const float *vc, int n, int pos0,
                              int n_heads, int n_kv_heads, int head_dim, float scale, int force_prefill, float *o,
                              float *lse, kvs_cuda_rec rec);

/* out[i] = (dt) in[i] for i < count (round to nearest even); for dt fp32 a plain copy. */
kvs_status kvs_cuda_convert(cudaStream_t stream, kvs_dtype dt, const float *in, int64_t count, void *out);

/* x[r][i] += t[r][i] (+ b[i] when b): the residual connection after a projection. */
kvs_status kvs_cuda_residual_add(cudaStream_t stream, float *x, const float *t, const float *b, int n, int dim);

/* out[r][i] = silu(gu[r][i]) * gu[r][hidden + i], out [n][hidden] in dtype dt; gu [n][2*hidden] holds the
 * gate and up projections side by side. */
kvs_status kvs_cuda_swiglu(cudaStream_t stream, kvs_dtype dt, const float *gu, int n, int hidden, void *out);

/* Y[n][out] = X[n][in] . W[out][in]^T (+ beta * Y) with cublasGemmEx: W and X in dtype dt, Y fp32,
 * CUBLAS_COMPUTE_32F (fp32 accumulation; no TF32: the handle keeps the default math mode). Row-major
 * W[out][in] is column-major W^T, so this is C(out x n) = op_T(W) (out x in) * X^T (in x n), ld in/in/out. */
kvs_status kvs_cuda_gemm(cublasHandle_t h, kvs_dtype dt, const void *W, const void *X, float *Y, int n, int out, int in,
                         float beta);

#endif /* KVS_CUDA_KERNELS_CUH */
