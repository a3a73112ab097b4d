/* Scalar f16/bf16 <-> f32 conversions (IEEE binary16 and bfloat16). */
#ifndef GB_FP16_H
#define GB_FP16_H

#include <stdint.h>
#include <string.h>

static inline float fp32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t fp32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float bf16_to_f32(uint16_t h) { return fp32_from_bits((uint32_t)h << 16); }

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u = fp32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return fp32_from_bits(sign);
        /* subnormal: man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (exp == 31) return fp32_from_bits(sign | 0x7f800000u | (man << 13));
    return fp32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

/* Round to nearest even, overflow to inf. */
static inline uint16_t f32_to_f16(float f) {
    uint32_t u = fp32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;            /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;           /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                                 /* subnormal or zero in f16 */
        if (a < 0x33000000u) return sign;                  /* < 2^-25 rounds to 0 */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;                         /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return sign | (uint16_t)r;
    }
    uint32_t r = a - 0x38000000u;                          /* rebias exponent 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return sign | (uint16_t)(r >> 13);
}

#endif
