/*
 * _int8_gemm's packed weight layout (see _int8_gemm.h for the module): writing an (n, k) int8
 * weight matrix into it (tiles of TILE output channels, groups of 4 input columns, GROUP bytes a
 * group) with each channel's weight sum, reading it back, and re-quantising packed 8-bit weights
 * to the 4-bit layout (GROUP4 bytes a group) of linear4. Run per layer when its weights are
 * packed, converted or read back, never per forward: plain C, one thread, called by the
 * module's pack(), unpack() and pack4() with the GIL released.
 */
#include "_int8_gemm.h"

/* The (n, k) int8 weights `src` in the packed layout `dst` (zeroed beforehand), and each
 * channel's weight sum in `sums`. Writes run tile by tile in order, reading 32 rows side by side,
 * a cache line of each at a time. */
void wmark_pack_rows(const int8_t *src, uint8_t *dst, int32_t *sums, Py_ssize_t n, Py_ssize_t k) {
    const Py_ssize_t groups = groups_of(k), whole = k / 4;
    for (Py_ssize_t t = 0; t < tiles_of(n); t++) {
        const Py_ssize_t lo = t * TILE, hi = lo + TILE < n ? lo + TILE : n;
        uint8_t *tile = dst + t * groups * GROUP;
        for (Py_ssize_t g0 = 0; g0 < whole; g0 += 16) {
            const Py_ssize_t g1 = g0 + 16 < whole ? g0 + 16 : whole;
            for (Py_ssize_t c = lo; c < hi; c++)
                for (Py_ssize_t g = g0; g < g1; g++) memcpy(tile + g * GROUP + 4 * (c - lo), src + c * k + 4 * g, 4);
        }
        if (whole < groups)
            for (Py_ssize_t c = lo; c < hi; c++)
                memcpy(tile + whole * GROUP + 4 * (c - lo), src + c * k + 4 * whole, (size_t)(k - 4 * whole));
    }
    for (Py_ssize_t c = 0; c < n; c++) {
        int32_t total = 0;
        for (Py_ssize_t col = 0; col < k; col++) total += src[c * k + col];
        sums[c] = total;
    }
}

/* The (n, k) int8 weights `dst` back from the packed layout `src`. */
void wmark_unpack_rows(const uint8_t *src, int8_t *dst, Py_ssize_t n, Py_ssize_t k) {
    const Py_ssize_t groups = groups_of(k);
    for (Py_ssize_t c = 0; c < n; c++) {
        const uint8_t *tile = src + (c / TILE) * groups * GROUP + 4 * (c % TILE);
        for (Py_ssize_t col = 0; col < k; col++) dst[c * k + col] = (int8_t)tile[(col / 4) * GROUP + col % 4];
    }
}

/* Round to nearest, ties to even (as torch.round), for |x| < 2^22: adding and subtracting
 * 1.5 x 2^23 leaves no fraction bits (IEEE arithmetic: without -ffast-math the compiler keeps
 * both operations); no libm call, so the loop vectorises. */
static inline float round_even(float x) { return (x + 12582912.0f) - 12582912.0f; }

/* The packed 8-bit weights `p8` of an (n, k) layer re-quantised to 4 bits per output channel:
 * each channel's weights divided by step = max(peak, 1) / 7 (peak: its largest |weight|),
 * rounded, clamped to [-8, 7]; written in the 4-bit layout (see linear4) with each channel's
 * step and its sum of 4-bit values. One pass over the tile for the peaks, one to pack. */
void wmark_pack4_tiles(const uint8_t *p8, uint8_t *p4, int32_t *colsum, float *step, Py_ssize_t n, Py_ssize_t k) {
    const Py_ssize_t groups = groups_of(k);
    for (Py_ssize_t t = 0; t < tiles_of(n); t++) {
        const int8_t *src = (const int8_t *)(p8 + t * groups * GROUP);
        uint8_t *dst = p4 + t * groups * GROUP4;
        int peak[TILE] = {0};
        for (Py_ssize_t g = 0; g < groups; g++)
            for (int b = 0; b < GROUP; b++) {
                const int v = src[g * GROUP + b] < 0 ? -src[g * GROUP + b] : src[g * GROUP + b];
                if (v > peak[b / 4]) peak[b / 4] = v;
            }
        float unit[TILE];
        int32_t sums[TILE] = {0};
        for (int j = 0; j < TILE; j++) unit[j] = step[t * TILE + j] = (float)(peak[j] < 1 ? 1 : peak[j]) / 7.0f;
        for (Py_ssize_t g = 0; g < groups; g++)
            for (int b = 0; b < GROUP4; b++) {
                float lo = round_even((float)src[g * GROUP + b] / unit[b / 4]);
                float hi = round_even((float)src[g * GROUP + 64 + b] / unit[16 + b / 4]);
                lo = lo < -8.0f ? -8.0f : lo > 7.0f ? 7.0f : lo;
                hi = hi < -8.0f ? -8.0f : hi > 7.0f ? 7.0f : hi;
                sums[b / 4] += (int32_t)lo;
                sums[16 + b / 4] += (int32_t)hi;
                dst[g * GROUP4 + b] = (uint8_t)(((int)lo + 8) | (((int)hi + 8) << 4));
            }
        for (int j = 0; j < TILE; j++) colsum[t * TILE + j] = sums[j];
    }
}
