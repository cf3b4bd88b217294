/* selftest.cu — tests of the CPU emulation of CUDA itself (tests/cuda_emu, README.md), compiled like
 * the .cu files of gpu_capture/cuda/ (emu.mk's launch rewrite, g++, the emulator's headers), so the pipeline that runs
 * the backend's tests is the one tested here:
 *  - barriers are real: a kernel that reads a neighbour's shared-memory slot after __syncthreads sees it
 *    written, and shuffles return the named lane's value (a butterfly sum gives every lane the warp total);
 *  - the emulator can fail: the pre-fix attend_key of gpu_capture/cuda/kernels.cu (commit 5995f19: the
 *    running max never updated), copied here, gives attention that differs from kvs_attention, while the
 *    fixed one matches;
 *  - launch-configuration errors come back from cudaGetLastError() and nothing runs;
 *  - cublasGemmEx computes the documented column-major product and rejects bad lda/ldb/ldc, unsupported
 *    type combinations and compute types, as cuBLAS does;
 *  - the device says it is an emulation, and reports none under KVSIM_REQUIRE_GPU=1.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" { /* this cmocka.h declares C functions without C linkage guards */
#include <cmocka.h>
}
#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "common/kvs_math.h"
}

#define FULL_MASK 0xffffffffu

/* ================================================================================================
 * Barriers and shuffles
 * ============================================================================================== */

__global__ void neighbour_kernel(int *out) {
    __shared__ int slot[256];
    int t = threadIdx.x, n = blockDim.x;
    slot[t] = 1000 * (int)blockIdx.x + t;
    __syncthreads(); /* without it thread t would read slot[t + 1] before thread t + 1 wrote it */
    out[blockIdx.x * n + t] = slot[(t + 1) % n];
}

__global__ void butterfly_kernel(float *out) {
    float v = (float)(threadIdx.x & 31);
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

static void test_syncthreads_orders_shared_memory(void **state) {
    (void)state;
    const int blocks = 3, threads = 256;
    int *d, h[blocks * threads];
    assert_int_equal(cudaMalloc(&d, sizeof h), cudaSuccess);
    neighbour_kernel<<<blocks, threads>>>(d);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < threads; t++) assert_int_equal(h[b * threads + t], 1000 * b + (t + 1) % threads);
    cudaFree(d);
}

static void test_shfl_xor_gives_every_lane_the_warp_sum(void **state) {
    (void)state;
    const int n = 2 * 96;
    float *d, h[n];
    assert_int_equal(cudaMalloc(&d, sizeof h), cudaSuccess);
    butterfly_kernel<<<2, 96, 0, 0>>>(d);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < n; i++) assert_true(h[i] == 496.0f); /* 0 + 1 + ... + 31 */
    cudaFree(d);
}

/* ================================================================================================
 * A known bug is caught: attend_key before and after commit 5995f19
 * ============================================================================================== */

#define HD 32 /* one dimension per lane */

/* kernels.cu's attend_key for head_dim 32; BUGGY: the pre-fix copy, without `m = m_new`. */
template <bool BUGGY>
__device__ void attend_key(float q, const float *krow, const float *vrow, int lane, float scale, float &m, float &l,
                           float &acc) {
    float part = q * krow[lane];
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(FULL_MASK, part, o);
    float s = scale * part;
    float m_new = fmaxf(m, s);
    float corr = expf(m - m_new);
    float p = expf(s - m_new);
    l = l * corr + p;
    if (!BUGGY) m = m_new;
    acc = acc * corr + p * vrow[lane];
}

/* One warp: the query attends to n_keys rows of k and v ([n_keys][HD]) with an online softmax. */
template <bool BUGGY> __global__ void attend_kernel(const float *q, const float *k, const float *v, int n_keys, float scale,
                                                    float *o, float *lse) {
    int lane = threadIdx.x;
    float m = -INFINITY, l = 0.0f, acc = 0.0f;
    for (int j = 0; j < n_keys; j++) attend_key<BUGGY>(q[lane], k + j * HD, v + j * HD, lane, scale, m, l, acc);
    o[lane] = acc / l;
    if (lane == 0) *lse = m + logf(l);
}

/* 1 when the kernel's o and lse agree with kvs_attention within 1e-5. */
template <bool BUGGY> static int attention_agrees(void) {
    enum { N = 40 };
    float q[HD], k[N * HD], v[N * HD], o[HD], ref_o[HD], probs[N], lse;
    uint32_t x = 12345;
    for (float *a : {q, k, v})
        for (int i = 0; i < (a == q ? HD : N * HD); i++) {
            x = x * 1664525u + 1013904223u;
            a[i] = (float)((x >> 8) & 0xffff) / 16384.0f - 2.0f;
        }
    float scale = 0.25f;
    double ref_lse = kvs_attention(q, k, v, HD, NULL, N, HD, scale, probs, ref_o);
    float *dq, *dk, *dv, *dout, *dlse;
    assert_int_equal(cudaMalloc(&dq, sizeof q), cudaSuccess);
    assert_int_equal(cudaMalloc(&dk, sizeof k), cudaSuccess);
    assert_int_equal(cudaMalloc(&dv, sizeof v), cudaSuccess);
    assert_int_equal(cudaMalloc(&dout, sizeof o), cudaSuccess);
    assert_int_equal(cudaMalloc(&dlse, sizeof lse), cudaSuccess);
    assert_int_equal(cudaMemcpy(dq, q, sizeof q, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(dk, k, sizeof k, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(dv, v, sizeof v, cudaMemcpyHostToDevice), cudaSuccess);
    attend_kernel<BUGGY><<<1, 32>>>(dq, dk, dv, N, scale, dout, dlse);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaMemcpy(o, dout, sizeof o, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(&lse, dlse, sizeof lse, cudaMemcpyDeviceToHost), cudaSuccess);
    for (float *p : {dq, dk, dv, dout, dlse}) cudaFree(p);
    int ok = fabs(lse - ref_lse) <= 1e-5 * (1 + fabs(ref_lse)) && kvs_rel_l2(ref_o, o, HD) <= 1e-5;
    print_message("attend_key%s: lse %.7g vs CPU %.7g, o relative L2 error %.3g\n", BUGGY ? " (pre-fix copy)" : "", lse,
                  ref_lse, kvs_rel_l2(ref_o, o, HD));
    return ok;
}

static void test_fixed_attend_key_matches_cpu(void **state) {
    (void)state;
    assert_true(attention_agrees<false>());
}

static void test_prefix_attend_key_bug_is_caught(void **state) {
    (void)state;
    assert_false(attention_agrees<true>());
}

/* ================================================================================================
 * Launch configuration errors
 * ============================================================================================== */

static void test_bad_launch_configuration_is_reported_and_not_run(void **state) {
    (void)state;
    float *d, h[64];
    assert_int_equal(cudaMalloc(&d, sizeof h), cudaSuccess);
    assert_int_equal(cudaMemset(d, 0, sizeof h), cudaSuccess);
    butterfly_kernel<<<1, 2048>>>(d); /* more than 1024 threads per block */
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaSuccess); /* reading the error clears it */
    butterfly_kernel<<<0, 32>>>(d);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    butterfly_kernel<<<1, 32, 64 * 1024>>>(d); /* dynamic shared memory over the 48 KB default */
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < 64; i++) assert_true(h[i] == 0.0f); /* none of them ran */
    /* a copy past the end of an allocation is refused, as a GPU would refuse or fault */
    assert_int_equal(cudaMemcpy(d, h, sizeof h + 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    cudaFree(d);
}

/* ================================================================================================
 * cuBLAS
 * ============================================================================================== */

static void test_gemm_computes_column_major_product(void **state) {
    (void)state;
    /* C (2 x 3) = A^T B with A stored 4 x 2 (lda 4), B 4 x 3 (ldb 5, one padding row), C ldc 2 */
    float A[8], B[15], C[6], one = 1.0f, zero = 0.0f;
    for (int i = 0; i < 8; i++) A[i] = (float)(i + 1);
    for (int i = 0; i < 15; i++) B[i] = (float)(i % 5 == 4 ? 1000 : i - 7);
    float *dA, *dB, *dC;
    assert_int_equal(cudaMalloc(&dA, sizeof A), cudaSuccess);
    assert_int_equal(cudaMalloc(&dB, sizeof B), cudaSuccess);
    assert_int_equal(cudaMalloc(&dC, sizeof C), cudaSuccess); /* NaN-filled: beta 0 must not read it */
    assert_int_equal(cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice), cudaSuccess);
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 4, &one, dA, CUDA_R_32F, 4, dB, CUDA_R_32F, 5, &zero,
                                  dC, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cudaMemcpy(C, dC, sizeof C, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            float ref = 0;
            for (int p = 0; p < 4; p++) ref += A[p + 4 * i] * B[p + 5 * j];
            assert_true(C[i + 2 * j] == ref);
        }

    /* invalid leading dimensions: lda < k for op T (A is k x m as stored), ldb < k, ldc < m */
    const struct {
        int lda, ldb, ldc;
    } bad[3] = {{3, 5, 2}, {4, 3, 2}, {4, 5, 1}};
    for (int c = 0; c < 3; c++)
        assert_int_equal(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 4, &one, dA, CUDA_R_32F, bad[c].lda, dB,
                                      CUDA_R_32F, bad[c].ldb, &zero, dC, CUDA_R_32F, bad[c].ldc, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT),
                         CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, -1, 3, 4, &one, dA, CUDA_R_32F, 4, dB, CUDA_R_32F, 5, &zero,
                                  dC, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_INVALID_VALUE);
    /* unsupported for CUBLAS_COMPUTE_32F: mixed A/B types, 16F in with 16BF out, 32F in with 16F out */
    const cudaDataType types[3][3] = {{CUDA_R_16F, CUDA_R_32F, CUDA_R_32F},
                                      {CUDA_R_16F, CUDA_R_16F, CUDA_R_16BF},
                                      {CUDA_R_32F, CUDA_R_32F, CUDA_R_16F}};
    for (int c = 0; c < 3; c++)
        assert_int_equal(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 4, &one, dA, types[c][0], 4, dB, types[c][1], 5,
                                      &zero, dC, types[c][2], 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         CUBLAS_STATUS_NOT_SUPPORTED);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 4, &one, dA, CUDA_R_32F, 4, dB, CUDA_R_32F, 5, &zero,
                                  dC, CUDA_R_32F, 2, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    /* valid arguments, but B (4 x 3 with ldb 6) reaches past its allocation */
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 4, &one, dA, CUDA_R_32F, 4, dB, CUDA_R_32F, 6, &zero,
                                  dC, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_EXECUTION_FAILED);
    assert_int_equal(cublasGemmEx(NULL, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 4, &one, dA, CUDA_R_32F, 4, dB, CUDA_R_32F, 5,
                                  &zero, dC, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_NOT_INITIALIZED);
    cublasDestroy(h);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
}

/* ================================================================================================
 * It says what it is
 * ============================================================================================== */

static void test_device_names_itself_an_emulation(void **state) {
    (void)state;
    cudaDeviceProp p;
    int n = 0;
    assert_int_equal(cudaGetDeviceProperties(&p, 0), cudaSuccess);
    assert_non_null(strstr(p.name, "CPU emulation of CUDA (not a GPU)"));
    setenv("KVSIM_REQUIRE_GPU", "1", 1); /* a GPU session must not pass on the emulation */
    assert_int_equal(cudaGetDeviceCount(&n), cudaErrorNoDevice);
    assert_int_equal(n, 0);
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_NOT_INITIALIZED);
    unsetenv("KVSIM_REQUIRE_GPU");
    assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
    assert_int_equal(n, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_syncthreads_orders_shared_memory),
        cmocka_unit_test(test_shfl_xor_gives_every_lane_the_warp_sum),
        cmocka_unit_test(test_fixed_attend_key_matches_cpu),
        cmocka_unit_test(test_prefix_attend_key_bug_is_caught),
        cmocka_unit_test(test_bad_launch_configuration_is_reported_and_not_run),
        cmocka_unit_test(test_gemm_computes_column_major_product),
        cmocka_unit_test(test_device_names_itself_an_emulation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
