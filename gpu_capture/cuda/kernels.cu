/* kernels.cu — the CUDA backend's own kernels (see kernels.cuh): embedding lookup, RMSNorm, q/k/v bias +
 * RoPE + KV-cache store, decode and prefill causal GQA attention with LSE (online softmax, as in
 * FlashAttention / FlashDecoding), dtype conversion, residual add and SwiGLU. Each follows the matching
 * step of gpu_capture/model.c `kvs_model_forward` (which follows llama2.c run.c `forward`); the per-kernel
 * CPU references live in tests/test_cuda.c.
 *
 * Bounds: every kernel takes its sizes as arguments and guards every index; block sizes are fixed
 * (256 threads) and grids are sized from the arguments: rows <= KVS_CUDA_CHUNK (grid.y of the prefill
 * kernel <= 8), n_heads <= 1024 (grid.x), head_dim <= 256 (8 registers per lane; static shared memory of
 * the decode kernel 8 KB, dynamic shared memory of the prefill kernel 2 * 16 * head_dim * 4 <= 32 KB).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "cuda_check.cuh"
#include "kernels.cuh"

extern "C" {
#include "../../trace/trace.h" /* KVS_ROPE_ADJACENT */
}

#define THREADS 256
#define ATT_WARPS (THREADS / 32)
#define PER_LANE (KVS_CUDA_MAX_HEAD_DIM / 32)
#define FULL_MASK 0xffffffffu

/* ---- dtype helpers (round to nearest even, as kvs_f32_to_f16 / kvs_f32_to_bf16) ---- */

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

static unsigned grid_for(int64_t count) {
    int64_t b = (count + THREADS - 1) / THREADS;
    if (b < 1) b = 1;
    if (b > 1048576) b = 1048576; /* grid-stride loops cover the rest */
    return (unsigned)b;
}

/* ================================================================================================
 * Embedding, RMSNorm, conversion, residual, SwiGLU
 * ============================================================================================== */

template <typename T>
__global__ void __launch_bounds__(THREADS) embed_kernel(const T *table, int dim, kvs_cuda_tokens tok, int n, float *x) {
    int r = blockIdx.x;
    if (r >= n) return;
    const T *row = table + (size_t)tok.ids[r] * (size_t)dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) x[(size_t)r * dim + i] = to_f<T>(row[i]);
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the total. One call per
 * kernel (the shared scratch is not reused afterwards). */
__device__ __forceinline__ double block_sum(double v) {
    __shared__ double sh[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        double t = lane < nw ? sh[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(FULL_MASK, t, o);
        if (lane == 0) sh[0] = t;
    }
    __syncthreads();
    return sh[0];
}

template <typename T>
__global__ void __launch_bounds__(THREADS) rmsnorm_kernel(const float *x, const float *w, int dim, float eps, T *out) {
    int r = blockIdx.x;
    const float *xr = x + (size_t)r * dim;
    double ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum(ss);
    /* model.c rmsnorm: inv = (float)(1 / sqrt(ss / n + eps)) in fp64, then w * (x * inv) in fp32 */
    float inv = (float)(1.0 / sqrt(ss / dim + (double)eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        out[(size_t)r * dim + i] = from_f<T>(__fmul_rn(w[i], __fmul_rn(xr[i], inv)));
}

template <typename T> __global__ void __launch_bounds__(THREADS) convert_kernel(const float *in, int64_t count, T *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = from_f<T>(in[i]);
}

__global__ void __launch_bounds__(THREADS) residual_kernel(float *x, const float *t, const float *b, int dim, int64_t count) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        float v = t[i];
        if (b) v += b[i % dim]; /* model.c: the bias is added to the projection, then the sum to x */
        x[i] += v;
    }
}

template <typename T>
__global__ void __launch_bounds__(THREADS) swiglu_kernel(const float *gu, int hidden, int64_t count, T *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / hidden, c = i % hidden;
        float g = gu[r * 2 * hidden + c], u = gu[r * 2 * hidden + hidden + c];
        out[i] = from_f<T>(g / (1.0f + expf(-g)) * u); /* model.c: SiLU(gate) * up, same operation order */
    }
}

/* ================================================================================================
 * q/k/v bias, RoPE, KV-cache store
 * ============================================================================================== */

__global__ void __launch_bounds__(THREADS) qkv_rope_kernel(const float *qkv, const float *bq, const float *bk,
                                                           const float *bv, const float *inv_freq, int layout, int pos0,
                                                           int n_heads, int n_kv_heads, int hd, float *q_out, float *kc,
                                                           float *vc, kvs_cuda_rec rec) {
    int r = blockIdx.x, pos = pos0 + r;
    int qd = n_heads * hd, kvd = n_kv_heads * hd, half = hd / 2;
    const float *in = qkv + (size_t)r * (size_t)(qd + 2 * kvd);
    float *kr = kc + (size_t)pos * kvd, *vr = vc + (size_t)pos * kvd, *qr = q_out + (size_t)r * qd;
    float *rr = rec.base ? rec.base + (size_t)r * (size_t)rec.row_stride : NULL;
    int n_qp = n_heads * half, n_kp = n_kv_heads * half, total = n_qp + n_kp + kvd;
    for (int t = threadIdx.x; t < total; t += blockDim.x) {
        if (t < n_qp + n_kp) {
            int is_k = t >= n_qp, p = is_k ? t - n_qp : t;
            int head = p / half, i = p % half, base = head * hd;
            int a = layout == KVS_ROPE_ADJACENT ? 2 * i : i, b = layout == KVS_ROPE_ADJACENT ? 2 * i + 1 : i + half;
            const float *src = is_k ? in + qd : in;
            const float *bias = is_k ? bk : bq;
            float x0 = src[base + a], x1 = src[base + b];
            if (bias) {
                x0 += bias[base + a];
                x1 += bias[base + b];
            }
            /* model.c: the angle and its cos/sin in fp64, rounded to fp32; the rotation in fp32 without
             * fused multiply-adds, so the rotation itself is bit-identical to the CPU's */
            double s, c;
            sincos((double)pos * (double)inv_freq[i], &s, &c);
            float cf = (float)c, sf = (float)s;
            float y0 = __fsub_rn(__fmul_rn(x0, cf), __fmul_rn(x1, sf));
            float y1 = __fadd_rn(__fmul_rn(x0, sf), __fmul_rn(x1, cf));
            if (is_k) {
                kr[base + a] = y0;
                kr[base + b] = y1;
                if (rr) {
                    rr[rec.k_off + base + a] = y0;
                    rr[rec.k_off + base + b] = y1;
                }
            } else {
                qr[base + a] = y0;
                qr[base + b] = y1;
                if (rr) {
                    rr[rec.q_off + base + a] = y0;
                    rr[rec.q_off + base + b] = y1;
                }
            }
        } else {
            int e = t - n_qp - n_kp;
            float v = in[qd + kvd + e];
            if (bv) v += bv[e];
            vr[e] = v;
            if (rr) rr[rec.v_off + e] = v;
        }
    }
}

/* ================================================================================================
 * Attention
 * ============================================================================================== */

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

/* One key/value row into a warp's online-softmax state (m running max, l running denominator, acc the
 * unnormalised output; lane holds dims lane + 32 i). All 32 lanes must call it together. */
__device__ __forceinline__ void attend_key(const float (&qr)[PER_LANE], const float *krow, const float *vrow, int hd,
                                           int lane, float scale, float &m, float &l, float (&acc)[PER_LANE]) {
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        int d = lane + 32 * i;
        if (d < hd) part += qr[i] * krow[d];
    }
    float s = scale * warp_sum(part); /* kvs_attn_scores: scale * (q . k) */
    float m_new = fmaxf(m, s);
    float corr = expf(m - m_new); /* first key: exp(-inf) = 0 */
    float p = expf(s - m_new);
    l = l * corr + p;
    m = m_new;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        int d = lane + 32 * i;
        if (d < hd) acc[i] = acc[i] * corr + p * vrow[d];
    }
}

__device__ __forceinline__ void load_q(const float *qh, int hd, int lane, float (&qr)[PER_LANE], float (&acc)[PER_LANE]) {
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        int d = lane + 32 * i;
        qr[i] = d < hd ? qh[d] : 0.0f;
        acc[i] = 0.0f;
    }
}

/* Decode: one block per query head h, the n_keys cached rows split round-robin over the 8 warps, then the
 * 8 partial softmax states merged (FlashDecoding's split-K reduction within a block). */
__global__ void __launch_bounds__(THREADS) attn_decode_kernel(const float *q, const float *kc, const float *vc, int n_keys,
                                                              int n_heads, int n_kv_heads, int hd, float scale, float *o,
                                                              float *lse, kvs_cuda_rec rec) {
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][KVS_CUDA_MAX_HEAD_DIM];
    int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int kvh = h / (n_heads / n_kv_heads), kvd = n_kv_heads * hd;
    float qr[PER_LANE], acc[PER_LANE];
    load_q(q + (size_t)h * hd, hd, lane, qr, acc);
    float m = -INFINITY, l = 0.0f;
    for (int j = warp; j < n_keys; j += ATT_WARPS)
        attend_key(qr, kc + (size_t)j * kvd + (size_t)kvh * hd, vc + (size_t)j * kvd + (size_t)kvh * hd, hd, lane, scale,
                   m, l, acc);
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        int d = lane + 32 * i;
        if (d < hd) sm_acc[warp][d] = acc[i];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm_m[w]);
    float L = 0.0f; /* warps that saw no key hold m = -inf, l = 0 and weigh exp(-inf) = 0 */
    for (int w = 0; w < ATT_WARPS; w++) L += sm_l[w] * expf(sm_m[w] - M);
    float *rr = rec.base;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float s = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) s += sm_acc[w][d] * expf(sm_m[w] - M);
        float out = s / L;
        o[(size_t)h * hd + d] = out;
        if (rr) rr[rec.o_off + h * hd + d] = out;
    }
    if (threadIdx.x == 0) {
        float v = M + logf(L);
        lse[h] = v;
        if (rr) rr[rec.lse_off + h] = v;
    }
}

/* Prefill: block (h, row group); warp w of the block owns query row r = 8 * blockIdx.y + w (position
 * pos0 + r) and attends to keys 0..pos0 + r; the block stages K/V tiles of KVS_CUDA_ATTN_TILE rows of KV
 * head h / G in shared memory, shared by its 8 rows. */
__global__ void __launch_bounds__(THREADS) attn_prefill_kernel(const float *q, const float *kc, const float *vc, int n,
                                                               int pos0, int n_heads, int n_kv_heads, int hd, float scale,
                                                               float *o, float *lse, kvs_cuda_rec rec) {
    extern __shared__ float smem[];
    float *sk = smem, *sv = smem + KVS_CUDA_ATTN_TILE * hd;
    int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int kvh = h / (n_heads / n_kv_heads), kvd = n_kv_heads * hd, qd = n_heads * hd;
    int r0 = blockIdx.y * ATT_WARPS, r = r0 + warp;
    int active = r < n; /* uniform per warp */
    int p = pos0 + r;
    int r_last = min(n - 1, r0 + ATT_WARPS - 1);
    int key_end = pos0 + r_last + 1; /* exclusive: the block's last row sees keys < key_end */
    float qr[PER_LANE], acc[PER_LANE];
    load_q(q + (size_t)(active ? r : 0) * qd + (size_t)h * hd, hd, lane, qr, acc);
    float m = -INFINITY, l = 0.0f;
    for (int t0 = 0; t0 < key_end; t0 += KVS_CUDA_ATTN_TILE) {
        int cnt = min(KVS_CUDA_ATTN_TILE, key_end - t0);
        __syncthreads(); /* every warp is done with the previous tile */
        for (int idx = threadIdx.x; idx < cnt * hd; idx += blockDim.x) {
            int j = idx / hd, d = idx - j * hd;
            size_t g = (size_t)(t0 + j) * kvd + (size_t)kvh * hd + d;
            sk[idx] = kc[g];
            sv[idx] = vc[g];
        }
        __syncthreads();
        if (active) {
            int jmax = min(cnt, p - t0 + 1); /* causal: keys <= p */
            for (int j = 0; j < jmax; j++) attend_key(qr, sk + j * hd, sv + j * hd, hd, lane, scale, m, l, acc);
        }
    }
    if (!active) return;
    float *rr = rec.base ? rec.base + (size_t)r * (size_t)rec.row_stride : NULL;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        int d = lane + 32 * i;
        if (d < hd) {
            float out = acc[i] / l;
            o[(size_t)r * qd + (size_t)h * hd + d] = out;
            if (rr) rr[rec.o_off + h * hd + d] = out;
        }
    }
    if (lane == 0) {
        float v = m + logf(l);
        lse[(size_t)r * n_heads + h] = v;
        if (rr) rr[rec.lse_off + h] = v;
    }
}

/* ================================================================================================
 * Launchers
 * ============================================================================================== */

kvs_status kvs_cuda_embed(cudaStream_t stream, kvs_dtype dt, const void *table, int dim, const kvs_cuda_tokens *tok,
                          int n, float *x) {
    kvs_status st = KVS_OK;
    if (n < 1 || n > KVS_CUDA_CHUNK) return kvs_fail(KVS_ERR_INVALID_ARG, "cuda embed: %d rows outside [1, %d]", n, KVS_CUDA_CHUNK);
    switch (dt) {
    case KVS_DTYPE_F32: embed_kernel<float><<<n, THREADS, 0, stream>>>((const float *)table, dim, *tok, n, x); break;
    case KVS_DTYPE_F16: embed_kernel<__half><<<n, THREADS, 0, stream>>>((const __half *)table, dim, *tok, n, x); break;
    case KVS_DTYPE_BF16:
        embed_kernel<__nv_bfloat16><<<n, THREADS, 0, stream>>>((const __nv_bfloat16 *)table, dim, *tok, n, x);
        break;
    }
    CU_TRY_LAUNCH();
cleanup:
    return st;
}

kvs_status kvs_cuda_rmsnorm(cudaStream_t stream, kvs_dtype dt, const float *x, const float *w, int n, int dim, float eps,
                            void *out) {
    kvs_status st = KVS_OK;
    if (n < 1) return kvs_fail(KVS_ERR_INVALID_ARG, "cuda rmsnorm: %d rows", n);
    switch (dt) {
    case KVS_DTYPE_F32: rmsnorm_kernel<float><<<n, THREADS, 0, stream>>>(x, w, dim, eps, (float *)out); break;
    case KVS_DTYPE_F16: rmsnorm_kernel<__half><<<n, THREADS, 0, stream>>>(x, w, dim, eps, (__half *)out); break;
    case KVS_DTYPE_BF16:
        rmsnorm_kernel<__nv_bfloat16><<<n, THREADS, 0, stream>>>(x, w, dim, eps, (__nv_bfloat16 *)out);
        break;
    }
    CU_TRY_LAUNCH();
cleanup:
    return st;
}

kvs_status kvs_cuda_qkv_rope(cudaStream_t stream, const float *qkv, const float *bq, const float *bk, const float *bv,
                             const float *inv_freq, int layout, int n, int pos0, int n_heads, int n_kv_heads,
                             int head_dim, float *q_out, float *kc, float *vc, kvs_cuda_rec rec) {
    kvs_status st = KVS_OK;
    if (n < 1 || n > KVS_CUDA_CHUNK || head_dim < 2 || head_dim % 2 || head_dim > KVS_CUDA_MAX_HEAD_DIM)
        return kvs_fail(KVS_ERR_INVALID_ARG, "cuda qkv_rope: rows %d / head_dim %d outside the kernel limits", n, head_dim);
    qkv_rope_kernel<<<n, THREADS, 0, stream>>>(qkv, bq, bk, bv, inv_freq, layout, pos0, n_heads, n_kv_heads, head_dim,
                                               q_out, kc, vc, rec);
    CU_TRY_LAUNCH();
cleanup:
    return st;
}

kvs_status kvs_cuda_attention(cudaStream_t stream, const float *q, const float *kc, const float *vc, int n, int pos0,
                              int n_heads, int n_kv_heads, int head_dim, float scale, int force_prefill, float *o,
                              float *lse, kvs_cuda_rec rec) {
    kvs_status st = KVS_OK;
    if (n < 1 || n > KVS_CUDA_CHUNK || pos0 < 0 || head_dim < 1 || head_dim > KVS_CUDA_MAX_HEAD_DIM || n_heads < 1 ||
        n_heads > 1024 || n_kv_heads < 1 || n_heads % n_kv_heads)
        return kvs_fail(KVS_ERR_INVALID_ARG, "cuda attention: rows %d pos0 %d heads %d/%d head_dim %d outside the kernel "
                        "limits", n, pos0, n_heads, n_kv_heads, head_dim);
    if (n == 1 && !force_prefill) {
        attn_decode_kernel<<<n_heads, THREADS, 0, stream>>>(q, kc, vc, pos0 + 1, n_heads, n_kv_heads, head_dim, scale, o,
                                                            lse, rec);
    } else {
        dim3 grid((unsigned)n_heads, (unsigned)((n + ATT_WARPS - 1) / ATT_WARPS));
        size_t smem = 2 * (size_t)KVS_CUDA_ATTN_TILE * (size_t)head_dim * sizeof(float);
        attn_prefill_kernel<<<grid, THREADS, smem, stream>>>(q, kc, vc, n, pos0, n_heads, n_kv_heads, head_dim, scale, o,
                                                             lse, rec);
    }
    CU_TRY_LAUNCH();
cleanup:
    return st;
}

kvs_status kvs_cuda_convert(cudaStream_t stream, kvs_dtype dt, const float *in, int64_t count, void *out) {
    kvs_status st = KVS_OK;
    if (count <= 0) return KVS_OK;
    switch (dt) {
    case KVS_DTYPE_F32: CU_TRY(cudaMemcpyAsync(out, in, (size_t)count * sizeof(float), cudaMemcpyDeviceToDevice, stream)); break;
    case KVS_DTYPE_F16: convert_kernel<__half><<<grid_for(count), THREADS, 0, stream>>>(in, count, (__half *)out); break;
    case KVS_DTYPE_BF16:
        convert_kernel<__nv_bfloat16><<<grid_for(count), THREADS, 0, stream>>>(in, count, (__nv_bfloat16 *)out);
        break;
    }
    CU_TRY_LAUNCH();
cleanup:
    return st;
}

kvs_status kvs_cuda_residual_add(cudaStream_t stream, float *x, const float *t, const float *b, int n, int dim) {
    kvs_status st = KVS_OK;
    int64_t count = (int64_t)n * dim;
    if (count <= 0) return KVS_OK;
    residual_kernel<<<grid_for(count), THREADS, 0, stream>>>(x, t, b, dim, count);
    CU_TRY_LAUNCH();
cleanup:
    return st;
}

kvs_status kvs_cuda_swiglu(cudaStream_t stream, kvs_dtype dt, const float *gu, int n, int hidden, void *out) {
    kvs_status st = KVS_OK;
    int64_t count = (int64_t)n * hidden;
    if (count <= 0) return KVS_OK;
    switch (dt) {
    case KVS_DTYPE_F32: swiglu_kernel<float><<<grid_for(count), THREADS, 0, stream>>>(gu, hidden, count, (float *)out); break;
    case KVS_DTYPE_F16: swiglu_kernel<__half><<<grid_for(count), THREADS, 0, stream>>>(gu, hidden, count, (__half *)out); break;
    case KVS_DTYPE_BF16:
        swiglu_kernel<__nv_bfloat16><<<grid_for(count), THREADS, 0, stream>>>(gu, hidden, count, (__nv_bfloat16 *)out);
        break;
    }
    CU_TRY_LAUNCH();
cleanup:
    return st;
}

kvs_status kvs_cuda_gemm(cublasHandle_t h, kvs_dtype dt, const void *W, const void *X, float *Y, int n, int out, int in,
                         float beta) {
    kvs_status st = KVS_OK;
    const float one = 1.0f;
    cudaDataType_t t = dt == KVS_DTYPE_F32 ? CUDA_R_32F : dt == KVS_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
    CU_TRY(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W, t, in, X, t, in, &beta, Y, CUDA_R_32F, out,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
cleanup:
    return st;
}
