/* emu_device.h — the CUDA C++ device language as plain C++ for the CPU emulation of CUDA (tests/cuda_emu,
 * see README.md). Force-included (through cuda_runtime.h) into every .cu file of gpu_capture/cuda/ compiled by g++,
 * as nvcc force-includes the real cuda_runtime.h.
 *
 * Execution model (CUDA C++ Programming Guide, "Programming model" and "Warp shuffle functions"): a launch
 * runs its blocks one after another; within a block every CUDA thread is a cooperative fiber
 * (emu_runtime.cpp). A fiber runs until it reaches __syncthreads(), a warp shuffle or __syncwarp(), which
 * are barriers (of the block, resp. of its 32-lane warp); it then hands the CPU to the next fiber. So every
 * interleaving the barriers allow is a legal GPU schedule, and code that needs a barrier it lacks reads
 * stale or poisoned data here too. `__shared__` variables become function statics: correct because only
 * one block runs at a time (and one launch at a time, process-wide).
 */
#ifndef KVS_CUDA_EMU_DEVICE_H
#define KVS_CUDA_EMU_DEVICE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
typedef dim3 uint3;

/* Set by the scheduler before it resumes a fiber (threadIdx) or starts a block (the others). */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
static const int warpSize = 32;

/* Qualifiers: every function is a host function here; kernels are called by the launch's fibers. */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict

/* Device min/max for equal types (CUDA overloads them for int, float, ...; a mixed call fails to compile,
 * which is worth knowing). */
using std::max;
using std::min;

/* Round-to-nearest intrinsics: plain IEEE fp32 operations (g++ -std=c++17 does not contract them into
 * FMAs, and x86-64 without -mfma has none). */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }

/* ---- barriers (emu_runtime.cpp) ---- */
void emu_syncthreads(void);
/* Deposits `bits` for this lane, waits for every lane named in `mask` (which must be the whole warp),
 * returns what lane `src` deposited. */
uint64_t emu_warp_exchange(unsigned mask, uint64_t bits, int src);
unsigned emu_lane(void);

static inline void __syncthreads(void) { emu_syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)emu_warp_exchange(mask, 0, (int)emu_lane()); }

template <typename T> static inline T emu_shfl(unsigned mask, T v, int src) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a type wider than 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = emu_warp_exchange(mask, b, src);
    memcpy(&v, &b, sizeof v);
    return v;
}
/* Source lanes as the Programming Guide defines them; `width` splits the warp into segments. */
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    int lane = (int)emu_lane();
    return emu_shfl(mask, v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    int lane = (int)emu_lane(), src = lane ^ lane_mask;
    /* a lane may read earlier segments, not later ones: then it gets its own value */
    return emu_shfl(mask, v, src >= (lane | (width - 1)) + 1 ? lane : src);
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    int lane = (int)emu_lane(), src = lane + (int)delta;
    return emu_shfl(mask, v, (src & ~(width - 1)) != (lane & ~(width - 1)) ? lane : src);
}
template <typename T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    int lane = (int)emu_lane(), src = lane - (int)delta;
    return emu_shfl(mask, v, src < (lane & ~(width - 1)) ? lane : src);
}

/* ---- launches ---- */
/* `extern __shared__ T x[];` becomes `T *x = (T *)emu_dyn_smem();` (emu.mk's sed): this launch's dynamic
 * shared memory, exactly the bytes asked for, filled with 0xff (NaN) before every block. */
void *emu_dyn_smem(void);

typedef struct CUstream_st *cudaStream_t;
/* Runs grid x block fibers of body(ctx) (see emu_runtime.cpp); an invalid configuration is reported by
 * the next cudaGetLastError(), as on a GPU, and nothing runs. */
void emu_launch_fn(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void (*body)(void *), void *ctx);

/* `k<<<g, b, smem, stream>>>(args);` becomes `emu_launch(g, b, smem, stream, [&] { k(args); });` (emu.mk's
 * sed). Every fiber calls the lambda, so kernel parameters are per-thread copies as on a GPU. */
template <typename F> static inline void emu_launch(dim3 g, dim3 b, size_t smem, cudaStream_t s, F body) {
    emu_launch_fn(g, b, smem, s, [](void *p) { (*(F *)p)(); }, &body);
}
template <typename F> static inline void emu_launch(dim3 g, dim3 b, size_t smem, F body) {
    emu_launch(g, b, smem, (cudaStream_t)0, body);
}
template <typename F> static inline void emu_launch(dim3 g, dim3 b, F body) { emu_launch(g, b, 0, (cudaStream_t)0, body); }

#endif /* KVS_CUDA_EMU_DEVICE_H */
