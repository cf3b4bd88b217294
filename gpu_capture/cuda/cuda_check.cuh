/* cuda_check.cuh — the ONE place where CUDA runtime and cuBLAS status codes become kvs_status
 * (../shared/STYLE.md rule 8; llm.c's cudaCheck, but returning instead of exiting).
 *
 *   CU_TRY(cudaMalloc(&p, n));           // any cudaError_t or cublasStatus_t expression
 *   CU_TRY(cublasGemmEx(...));
 *   CU_TRY_LAUNCH();                     // after a <<<>>> launch: checks cudaGetLastError()
 *
 * On failure CU_TRY sets the local `kvs_status st` (which must exist) to the converted status, with the
 * detail "file:line: call: error name: message", and jumps to the local `cleanup` label, like KVS_TRY.
 * "No usable device" (cudaErrorNoDevice, cudaErrorInsufficientDriver, and the driver-absent codes) becomes
 * KVS_ERR_NO_DEVICE with a detail that starts "no CUDA device"; everything else KVS_ERR_CUDA.
 */
#ifndef KVS_CUDA_CHECK_CUH
#define KVS_CUDA_CHECK_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "../../common/kvs.h"
}

/* Converters (defined in cuda_check.cu); overloaded so CU_TRY works on both status types. */
kvs_status kvs_cuda_status(cudaError_t e, const char *call, const char *file, int line);
kvs_status kvs_cuda_status(cublasStatus_t e, const char *call, const char *file, int line);

#define CU_TRY(call)                                                            \
    do {                                                                        \
        auto cu_try_e_ = (call);                                                \
        if ((int)cu_try_e_ != 0) {                                              \
            st = kvs_cuda_status(cu_try_e_, #call, __FILE__, __LINE__);         \
            goto cleanup;                                                       \
        }                                                                       \
    } while (0)

#define CU_TRY_LAUNCH() CU_TRY(cudaGetLastError())

#endif /* KVS_CUDA_CHECK_CUH */
