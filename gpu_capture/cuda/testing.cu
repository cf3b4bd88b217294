/* testing.cu — single-kernel hooks for tests/test_cuda.c and bench/bench_cuda.c (see cuda_testing.h).
 * Each hook allocates device buffers, uploads, runs one launcher of kernels.cuh on the default stream,
 * downloads and frees, checking every call with CU_TRY. */
#include <stdlib.h>
#include <string.h>

#include "cuda_check.cuh"
#include "kernels.cuh"

extern "C" {
#include "cuda_testing.h"
}

/* Device buffers freed together at the end of a hook. */
typedef struct {
    void *p[12];
    int n;
} dev_bufs;

static kvs_status dev_alloc(dev_bufs *d, size_t bytes, void **out) {
    kvs_status st = KVS_OK;
    *out = NULL;
    if (d->n == 12) return kvs_fail(KVS_ERR_STATE, "testing.cu: too many buffers");
    CU_TRY(cudaMalloc(out, bytes ? bytes : 1));
    d->p[d->n++] = *out;
cleanup:
    return st;
}

static void dev_free(dev_bufs *d) {
    for (int i = 0; i < d->n; i++) cudaFree(d->p[i]);
    d->n = 0;
}

/* Uploads n floats (NULL -> *out = NULL). */
static kvs_status up_f32(dev_bufs *d, const float *src, size_t n, float **out) {
    kvs_status st = KVS_OK;
    *out = NULL;
    if (!src) return KVS_OK;
    KVS_TRY(st = dev_alloc(d, n * sizeof(float), (void **)out));
    CU_TRY(cudaMemcpy(*out, src, n * sizeof(float), cudaMemcpyHostToDevice));
cleanup:
    return st;
}

/* Uploads n floats encoded in dtype dt. */
static kvs_status up_dt(dev_bufs *d, kvs_dtype dt, const float *src, size_t n, void **out) {
    kvs_status st = KVS_OK;
    void *h = malloc(n * kvs_dtype_size(dt) + 1);
    if (!h) return kvs_fail(KVS_ERR_NOMEM, "testing.cu: out of memory");
    kvs_encode(dt, src, n, h);
    KVS_TRY(st = dev_alloc(d, n * kvs_dtype_size(dt), out));
    CU_TRY(cudaMemcpy(*out, h, n * kvs_dtype_size(dt), cudaMemcpyHostToDevice));
cleanup:
    free(h);
    return st;
}

/* Downloads n elements of dtype dt and widens them to fp32. */
static kvs_status down_dt(kvs_dtype dt, const void *src, size_t n, float *dst) {
    kvs_status st = KVS_OK;
    void *h = malloc(n * kvs_dtype_size(dt) + 1);
    if (!h) return kvs_fail(KVS_ERR_NOMEM, "testing.cu: out of memory");
    CU_TRY(cudaDeviceSynchronize());
    CU_TRY(cudaMemcpy(h, src, n * kvs_dtype_size(dt), cudaMemcpyDeviceToHost));
    kvs_decode(dt, h, n, dst);
cleanup:
    free(h);
    return st;
}

extern "C" kvs_status kvs_cuda_test_embed(kvs_dtype dt, const float *table, int vocab, int dim, const int32_t *tokens,
                                          int n, float *out) {
    kvs_status st = KVS_OK;
    dev_bufs d = {{0}, 0};
    void *t;
    float *x;
    kvs_cuda_tokens tok;
    if (n < 1 || n > KVS_CUDA_CHUNK) return kvs_fail(KVS_ERR_INVALID_ARG, "embed: n %d outside [1, %d]", n, KVS_CUDA_CHUNK);
    memset(&tok, 0, sizeof tok);
    memcpy(tok.ids, tokens, (size_t)n * sizeof *tokens);
    KVS_TRY(st = up_dt(&d, dt, table, (size_t)vocab * dim, &t));
    KVS_TRY(st = dev_alloc(&d, (size_t)n * dim * sizeof(float), (void **)&x));
    KVS_TRY(st = kvs_cuda_embed(0, dt, t, dim, &tok, n, x));
    KVS_TRY(st = down_dt(KVS_DTYPE_F32, x, (size_t)n * dim, out));
cleanup:
    dev_free(&d);
    return st;
}

extern "C" kvs_status kvs_cuda_test_rmsnorm(kvs_dtype dt, const float *x, const float *w, int n, int dim, float eps,
                                            float *out) {
    kvs_status st = KVS_OK;
    dev_bufs d = {{0}, 0};
    float *dx, *dw;
    void *o;
    KVS_TRY(st = up_f32(&d, x, (size_t)n * dim, &dx));
    KVS_TRY(st = up_f32(&d, w, (size_t)dim, &dw));
    KVS_TRY(st = dev_alloc(&d, (size_t)n * dim * kvs_dtype_size(dt), &o));
    KVS_TRY(st = kvs_cuda_rmsnorm(0, dt, dx, dw, n, dim, eps, o));
    KVS_TRY(st = down_dt(dt, o, (size_t)n * dim, out));
cleanup:
    dev_free(&d);
    return st;
}

extern "C" kvs_status kvs_cuda_test_qkv_rope(const float *qkv, const float *bq, const float *bk, const float *bv,
                                             const float *inv_freq, int layout, int n, int pos0, int n_heads,
                                             int n_kv_heads, int head_dim, float *q_out, float *k_out, float *v_out) {
    kvs_status st = KVS_OK;
    dev_bufs d = {{0}, 0};
    size_t qd = (size_t)n_heads * head_dim, kvd = (size_t)n_kv_heads * head_dim, rows = (size_t)pos0 + n;
    float *dqkv, *dbq, *dbk, *dbv, *dfreq, *dq, *dk, *dv;
    kvs_cuda_rec rec;
    memset(&rec, 0, sizeof rec);
    KVS_TRY(st = up_f32(&d, qkv, (size_t)n * (qd + 2 * kvd), &dqkv));
    KVS_TRY(st = up_f32(&d, bq, qd, &dbq));
    KVS_TRY(st = up_f32(&d, bk, kvd, &dbk));
    KVS_TRY(st = up_f32(&d, bv, kvd, &dbv));
    KVS_TRY(st = up_f32(&d, inv_freq, (size_t)head_dim / 2, &dfreq));
    KVS_TRY(st = dev_alloc(&d, (size_t)n * qd * sizeof(float), (void **)&dq));
    KVS_TRY(st = dev_alloc(&d, rows * kvd * sizeof(float), (void **)&dk));
    KVS_TRY(st = dev_alloc(&d, rows * kvd * sizeof(float), (void **)&dv));
    KVS_TRY(st = kvs_cuda_qkv_rope(0, dqkv, dbq, dbk, dbv, dfreq, layout, n, pos0, n_heads, n_kv_heads, head_dim, dq, dk,
                                   dv, rec));
    KVS_TRY(st = down_dt(KVS_DTYPE_F32, dq, (size_t)n * qd, q_out));
    KVS_TRY(st = down_dt(KVS_DTYPE_F32, dk + (size_t)pos0 * kvd, (size_t)n * kvd, k_out));
    KVS_TRY(st = down_dt(KVS_DTYPE_F32, dv + (size_t)pos0 * kvd, (size_t)n * kvd, v_out));
cleanup:
    dev_free(&d);
    return st;
}

extern "C" kvs_status kvs_cuda_test_attention(const float *q, const float *k, const float *v, int n_keys, int n,
                                              int n_heads, int n_kv_heads, int head_dim, float scale, int force_prefill,
                                              float *o, float *lse) {
    kvs_status st = KVS_OK;
    dev_bufs d = {{0}, 0};
    size_t qd = (size_t)n_heads * head_dim, kvd = (size_t)n_kv_heads * head_dim;
    float *dq, *dk, *dv, *dout, *dlse;
    kvs_cuda_rec rec;
    memset(&rec, 0, sizeof rec);
    if (n < 1 || n > n_keys) return kvs_fail(KVS_ERR_INVALID_ARG, "attention: n %d outside [1, n_keys %d]", n, n_keys);
    KVS_TRY(st = up_f32(&d, q, (size_t)n * qd, &dq));
    KVS_TRY(st = up_f32(&d, k, (size_t)n_keys * kvd, &dk));
    KVS_TRY(st = up_f32(&d, v, (size_t)n_keys * kvd, &dv));
    KVS_TRY(st = dev_alloc(&d, (size_t)n * qd * sizeof(float), (void **)&dout));
    KVS_TRY(st = dev_alloc(&d, (size_t)n * n_heads * sizeof(float), (void **)&dlse));
    KVS_TRY(st = kvs_cuda_attention(0, dq, dk, dv, n, n_keys - n, n_heads, n_kv_heads, head_dim, scale, force_prefill,
                                    dout, dlse, rec));
    KVS_TRY(st = down_dt(KVS_DTYPE_F32, dout, (size_t)n * qd, o));
    KVS_TRY(st = down_dt(KVS_DTYPE_F32, dlse, (size_t)n * n_heads, lse));
cleanup:
    dev_free(&d);
    return st;
}

extern "C" kvs_status kvs_cuda_test_swiglu(kvs_dtype dt, const float *gu, int n, int hidden, float *out) {
    kvs_status st = KVS_OK;
    dev_bufs d = {{0}, 0};
    float *dgu;
    void *o;
    KVS_TRY(st = up_f32(&d, gu, (size_t)n * 2 * hidden, &dgu));
    KVS_TRY(st = dev_alloc(&d, (size_t)n * hidden * kvs_dtype_size(dt), &o));
    KVS_TRY(st = kvs_cuda_swiglu(0, dt, dgu, n, hidden, o));
    KVS_TRY(st = down_dt(dt, o, (size_t)n * hidden, out));
cleanup:
    dev_free(&d);
    return st;
}

extern "C" kvs_status kvs_cuda_test_residual(float *x, const float *t, const float *b, int n, int dim) {
    kvs_status st = KVS_OK;
    dev_bufs d = {{0}, 0};
    float *dx, *dt, *db;
    KVS_TRY(st = up_f32(&d, x, (size_t)n * dim, &dx));
    KVS_TRY(st = up_f32(&d, t, (size_t)n * dim, &dt));
    KVS_TRY(st = up_f32(&d, b, (size_t)dim, &db));
    KVS_TRY(st = kvs_cuda_residual_add(0, dx, dt, db, n, dim));
    KVS_TRY(st = down_dt(KVS_DTYPE_F32, dx, (size_t)n * dim, x));
cleanup:
    dev_free(&d);
    return st;
}

extern "C" kvs_status kvs_cuda_test_gemm(kvs_dtype dt, const float *W, const float *x, int n, int out, int in, float *y) {
    kvs_status st = KVS_OK;
    dev_bufs d = {{0}, 0};
    cublasHandle_t h = NULL;
    void *dw, *dx;
    float *dy;
    CU_TRY(cublasCreate(&h));
    KVS_TRY(st = up_dt(&d, dt, W, (size_t)out * in, &dw));
    KVS_TRY(st = up_dt(&d, dt, x, (size_t)n * in, &dx));
    KVS_TRY(st = dev_alloc(&d, (size_t)n * out * sizeof(float), (void **)&dy));
    KVS_TRY(st = kvs_cuda_gemm(h, dt, dw, dx, dy, n, out, in, 0.0f));
    KVS_TRY(st = down_dt(KVS_DTYPE_F32, dy, (size_t)n * out, y));
cleanup:
    if (h) cublasDestroy(h);
    dev_free(&d);
    return st;
}

extern "C" kvs_status kvs_cuda_copy_bandwidth(double *bytes_per_s) {
    kvs_status st = KVS_OK;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    size_t free_b = 0, total_b = 0, bytes = (size_t)1 << 30;
    float best_ms = 0;
    *bytes_per_s = 0;
    CU_TRY(cudaMemGetInfo(&free_b, &total_b));
    if (bytes > free_b / 4) bytes = free_b / 4;
    CU_TRY(cudaMalloc(&a, bytes));
    CU_TRY(cudaMalloc(&b, bytes));
    CU_TRY(cudaMemset(a, 1, bytes));
    CU_TRY(cudaEventCreate(&e0));
    CU_TRY(cudaEventCreate(&e1));
    for (int i = 0; i < 6; i++) { /* the first run warms up */
        float ms;
        CU_TRY(cudaEventRecord(e0, 0));
        CU_TRY(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
        CU_TRY(cudaEventRecord(e1, 0));
        CU_TRY(cudaEventSynchronize(e1));
        CU_TRY(cudaEventElapsedTime(&ms, e0, e1));
        if (i > 0 && (best_ms == 0 || ms < best_ms)) best_ms = ms;
    }
    *bytes_per_s = 2.0 * (double)bytes / (best_ms * 1e-3);
cleanup:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return st;
}
