/* cuda_fp16.h — __half for the CPU emulation of CUDA (tests/cuda_emu): storage and the two conversions
 * the kernels use, round to nearest even. Done with the compiler's _Float16, independently of
 * common/kvs.h's converters, so the kernel tests still compare two implementations. */
#ifndef KVS_CUDA_EMU_FP16_H
#define KVS_CUDA_EMU_FP16_H

#include <stdint.h>
#include <string.h>

struct __half {
    uint16_t x; /* IEEE binary16 bits */
};

static inline float __half2float(__half h) {
    _Float16 f;
    memcpy(&f, &h.x, sizeof f);
    return (float)f;
}

static inline __half __float2half_rn(float v) {
    _Float16 f = (_Float16)v; /* one rounding, to nearest even */
    __half h;
    memcpy(&h.x, &f, sizeof h.x);
    return h;
}

#endif /* KVS_CUDA_EMU_FP16_H */
