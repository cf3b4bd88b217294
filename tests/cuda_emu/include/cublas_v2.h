/* cublas_v2.h — the cuBLAS subset gpu_capture/cuda/ uses (handle, stream, cublasGemmEx), implemented on the
 * host by emu_runtime.cpp for the CPU emulation of CUDA (tests/cuda_emu, see README.md). Enum values are
 * those of CUDA 12's cublas_api.h / library_types.h.
 *
 * cublasGemmEx follows the cuBLAS documentation: column-major C = alpha op(A) op(B) + beta C with op(A)
 * m x k, op(B) k x n; returns CUBLAS_STATUS_NOT_INITIALIZED for a NULL handle, INVALID_VALUE for m, n, k < 0,
 * a bad operation or lda < max(1, rows of A as stored) (likewise ldb, ldc < max(1, m)), NOT_SUPPORTED for
 * type combinations outside the documented CUBLAS_COMPUTE_32F table (A/B 32F -> C 32F; 16F -> 16F or 32F;
 * 16BF -> 16BF or 32F) and for other compute types (not emulated). C is not read when beta == 0. Beyond
 * cuBLAS: EXECUTION_FAILED, with a message, when an operand reaches outside its device allocation (a GPU
 * would read garbage or fault).
 */
#ifndef KVS_CUDA_EMU_CUBLAS_H
#define KVS_CUDA_EMU_CUBLAS_H

#include "cuda_runtime.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16,
} cublasStatus_t;

typedef struct cublasContext *cublasHandle_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_8I = 3,
    CUDA_R_16BF = 14,
} cudaDataType;
typedef enum {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_64F = 70,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo);

#endif /* KVS_CUDA_EMU_CUBLAS_H */
