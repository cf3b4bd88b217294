/* cuda_bf16.h — __nv_bfloat16 for the CPU emulation of CUDA (tests/cuda_emu): storage and the two
 * conversions the kernels use (round to nearest even; NaN stays a quiet NaN), written on the bits,
 * independently of common/kvs.h's converters. */
#ifndef KVS_CUDA_EMU_BF16_H
#define KVS_CUDA_EMU_BF16_H

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    uint16_t x; /* the high 16 bits of an fp32 */
};

static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline __nv_bfloat16 __float2bfloat16_rn(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h.x = (uint16_t)((u >> 16) | 0x40u); /* NaN: keep it one */
    else h.x = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}

#endif /* KVS_CUDA_EMU_BF16_H */
