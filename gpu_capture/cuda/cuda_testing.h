/* cuda_testing.h — test and benchmark hooks of the CUDA backend (CUDA build only): each runs ONE kernel
 * (or one cuBLAS GEMM) of kernels.cuh on host arrays (upload, launch, download, synchronise), so
 * tests/test_cuda.c can compare every kernel with its CPU reference on random inputs, as llm.c's kernel
 * lab files do. Not part of the capture path. All arrays are host memory, fp32, row-major; the shapes
 * are those of kernels.cuh. Return KVS_ERR_NO_DEVICE without a usable GPU.
 */
#ifndef KVS_CUDA_TESTING_H
#define KVS_CUDA_TESTING_H

#include <stdint.h>

/* C headers: C linkage also when a .cu file includes this one */
#ifdef __cplusplus
extern "C" {
#endif

#include "../../common/kvs.h"


/* out [n][dim] = table[tokens[r]] after storing the table [vocab][dim] in dtype dt. */
kvs_status kvs_cuda_test_embed(kvs_dtype dt, const float *table, int vocab, int dim, const int32_t *tokens, int n,
                               float *out);

/* out [n][dim] = rmsnorm(x) * w, produced in dtype dt and widened back to fp32. */
kvs_status kvs_cuda_test_rmsnorm(kvs_dtype dt, const float *x, const float *w, int n, int dim, float eps, float *out);

/* qkv [n][q_dim + 2 kv_dim] at positions pos0..pos0+n-1 -> q_out [n][q_dim], k_out, v_out [n][kv_dim]
 * (biases may be NULL; layout kvs_rope_layout; inv_freq [head_dim/2]). */
kvs_status kvs_cuda_test_qkv_rope(const float *qkv, const float *bq, const float *bk, const float *bv,
                                  const float *inv_freq, int layout, int n, int pos0, int n_heads, int n_kv_heads,
                                  int head_dim, float *q_out, float *k_out, float *v_out);

/* Causal attention of the last n of n_keys positions: q [n][n_heads*head_dim], k, v [n_keys][n_kv_heads*head_dim];
 * o [n][n_heads*head_dim], lse [n][n_heads]. force_prefill: use the prefill kernel even for n == 1. */
kvs_status kvs_cuda_test_attention(const float *q, const float *k, const float *v, int n_keys, int n, int n_heads,
                                   int n_kv_heads, int head_dim, float scale, int force_prefill, float *o, float *lse);

/* out [n][hidden] = silu(gate) * up in dtype dt (widened back), gu [n][2*hidden]. */
kvs_status kvs_cuda_test_swiglu(kvs_dtype dt, const float *gu, int n, int hidden, float *out);

/* x [n][dim] += t (+ b [dim] when not NULL), in place. */
kvs_status kvs_cuda_test_residual(float *x, const float *t, const float *b, int n, int dim);

/* y [n][out] = x [n][in] . W[out][in]^T with W and x stored in dtype dt (rounded to it first). */
kvs_status kvs_cuda_test_gemm(kvs_dtype dt, const float *W, const float *x, int n, int out, int in, float *y);

/* Device-to-device copy bandwidth in bytes/s (read + write bytes over time, 1 GiB buffer or a quarter of
 * free memory, best of 5), for the benchmark's memory-bandwidth floor. */
kvs_status kvs_cuda_copy_bandwidth(double *bytes_per_s);

#ifdef __cplusplus
}
#endif

#endif /* KVS_CUDA_TESTING_H */
