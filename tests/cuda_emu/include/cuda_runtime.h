/* cuda_runtime.h — the subset of the CUDA runtime API that gpu_capture/cuda/ uses, implemented on the host
 * by emu_runtime.cpp for the CPU emulation of CUDA (tests/cuda_emu, see README.md). Names, signatures and
 * numeric codes are those of the CUDA 12 headers (driver_types.h), so cuda_check.cu's conversions are
 * exercised as they are on a GPU.
 *
 * Semantics kept from the real runtime: cudaMalloc'ed memory is separate from other host allocations for
 * the purpose of checks (copies and GEMM operands must lie inside one device allocation, else
 * cudaErrorInvalidValue), it starts as 0xff bytes (NaN in fp32/fp16/bf16) so reads of never-written
 * device memory show; launch-configuration errors come back from cudaGetLastError(). NOT kept: every
 * stream, event and copy is synchronous (work completes before the call returns), so ordering bugs between
 * streams cannot show here.
 */
#ifndef KVS_CUDA_EMU_RUNTIME_H
#define KVS_CUDA_EMU_RUNTIME_H

#include "emu_device.h"

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInsufficientDriver = 35,
    cudaErrorDevicesUnavailable = 46,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorSystemDriverMismatch = 803,
    cudaErrorCompatNotSupportedOnDevice = 804,
} cudaError_t;

typedef struct CUevent_st *cudaEvent_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;

/* The fields the backend reads. The emulated device says what it is in `name`. */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor, multiProcessorCount;
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

/* The emulated device's name: tests and `kvsim capture` print it, so a run cannot pass for a GPU run. */
#define KVS_CUDA_EMU_DEVICE_NAME "CPU emulation of CUDA (not a GPU)"

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t e);

cudaError_t cudaMalloc(void **p, size_t bytes);
template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t bytes) { return cudaMalloc((void **)p, bytes); }
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
template <typename T> static inline cudaError_t cudaMallocHost(T **p, size_t bytes) {
    return cudaMallocHost((void **)p, bytes);
}
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemset(void *p, int value, size_t bytes);

/* For the emulator's cuBLAS: 1 when [p, p + bytes) lies inside one live cudaMalloc allocation. */
int emu_is_device_range(const void *p, size_t bytes);

#endif /* KVS_CUDA_EMU_RUNTIME_H */
