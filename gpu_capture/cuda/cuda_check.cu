/* cuda_check.cu — status conversion behind CU_TRY (see cuda_check.cuh). */
#include "cuda_check.cuh"

static const char *base_of(const char *file) {
    const char *b = file;
    for (const char *p = file; *p; p++)
        if (*p == '/') b = p + 1;
    return b;
}

kvs_status kvs_cuda_status(cudaError_t e, const char *call, const char *file, int line) {
    switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInvalidDevice:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
        /* sticky "no GPU here" conditions: say so plainly; the CUDA name stays for diagnosis */
        return kvs_fail(KVS_ERR_NO_DEVICE, "no CUDA device (%s: %s) [%s:%d: %s]", cudaGetErrorName(e),
                        cudaGetErrorString(e), base_of(file), line, call);
    case cudaErrorMemoryAllocation:
        return kvs_fail(KVS_ERR_NOMEM, "out of device memory [%s:%d: %s]", base_of(file), line, call);
    default:
        return kvs_fail(KVS_ERR_CUDA, "%s:%d: %s: %s: %s", base_of(file), line, call, cudaGetErrorName(e),
                        cudaGetErrorString(e));
    }
}

static const char *cublas_name(cublasStatus_t e) {
    switch (e) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

kvs_status kvs_cuda_status(cublasStatus_t e, const char *call, const char *file, int line) {
    /* cublasCreate reports a missing/too-old driver as NOT_INITIALIZED: tell the no-device case apart */
    if (e == CUBLAS_STATUS_NOT_INITIALIZED) {
        int n = 0;
        cudaError_t ce = cudaGetDeviceCount(&n);
        if (ce != cudaSuccess || n == 0) {
            if (ce == cudaSuccess) ce = cudaErrorNoDevice;
            return kvs_cuda_status(ce, call, file, line);
        }
    }
    return kvs_fail(e == CUBLAS_STATUS_ALLOC_FAILED ? KVS_ERR_NOMEM : KVS_ERR_CUDA, "%s:%d: %s: %s", base_of(file),
                    line, call, cublas_name(e));
}
