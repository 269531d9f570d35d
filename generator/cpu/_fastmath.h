/*
 * Float helpers shared by wmark's C kernels (_tree_attention.c, _int8_gemm.c), header-only so
 * that each kernel inlines them into its own loops.
 */
#ifndef WMARK_FASTMATH_H
#define WMARK_FASTMATH_H

#include <stdint.h>

/*
 * e^x for x <= 0 in plain float arithmetic (Cephes' expf: x = n ln2 + r, a degree-6 polynomial
 * in r, 2^n from the exponent bits), so that the compiler vectorises the softmax loop where
 * libm's expf is a call per score; within ~2 ulp of e^x, and 0 below -87 (e^-87 < 2^-125).
 */
static inline float exp_nonpositive(float x) {
    const float rounder = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const float low = x < -87.0f ? -87.0f : x;
    const float n = (low * 1.44269504088896341f + rounder) - rounder;
    float r = low - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = ((int32_t)n + 127) << 23};
    return x < -87.0f ? 0.0f : p * scale.f;
}

#endif
