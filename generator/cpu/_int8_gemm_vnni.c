/*
 * _int8_gemm's AVX-512 VNNI kernel (see _int8_gemm.h for the module): the "avx512vnni" build's
 * tiles, 8-bit weights (linear) and 4-bit (linear4: the same loop, the nibbles unpacked into the
 * same registers), and the "amx" build's blocks of fewer than AMX_MIN_ROWS rows (4-bit:
 * AMX_MIN_ROWS_WIDENED). vpdpbusd multiplies the unsigned activations q + 128 (the job's aux) by
 * the signed weights; the epilogue takes 128 x (the channel's weight sum) off again, so the sums
 * are exact, as in every build. Built for baseline x86-64 but for its functions' target(VNNI_TARGET): it runs only
 * where PyInit__int8_gemm found AVX-512 F, BW, VL and VNNI.
 */
#include "_int8_gemm.h"

int wmark_prefetch = PREFETCH_ROWS; /* see FAR_AHEAD; set at import (Intel: far) and by `prefetch()` */

#ifdef WMARK_X86
#define ROWS_512 12 /* rows sharing each weight load (AVX-512: 24 accumulators of 32) */

/*
 * The micro-kernels keep their accumulators in named variables (one per row and register of
 * channels), not an array: GCC kept an array in memory and stored every accumulator once per
 * group of 4 columns. `rows` is a constant at every call, so the unused rows compile away.
 */

/* The lanes of a 16-channel half that hold channels (left: channels from its first on; none
 * where left <= 0). */
static inline __mmask16 lanes_below(Py_ssize_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

/* ---- AVX-512 VNNI: a whole tile x up to ROWS_512 rows per pass ---- */
#define VNNI_ROW(r)                                                            \
    if (rows > r) {                                                            \
        const __m512i u = _mm512_set1_epi32(load4(a + r * kp + 4 * g));         \
        c##r##0 = _mm512_dpbusd_epi32(c##r##0, u, w0);                         \
        c##r##1 = _mm512_dpbusd_epi32(c##r##1, u, w1);                         \
    }

__attribute__((target(VNNI_TARGET), always_inline)) static inline void block_vnni(const job_t *job, Py_ssize_t t,
                                                                                    Py_ssize_t r0, const int rows,
                                                                                    const int nibbles) {
    /* the same for the whole call: the branch below is predicted */
    const int far = wmark_prefetch == PREFETCH_FAR ||
                    (wmark_prefetch == PREFETCH_ROWS && job->m * (nibbles ? 2 : 1) >= FAR_FROM_ROWS);
    const __m512i low = _mm512_set1_epi8(15), eight = _mm512_set1_epi8(8);
    const uint8_t *w = job->packed + t * job->groups * (nibbles ? GROUP4 : GROUP);
    const Py_ssize_t kp = job->groups * 4;
    const uint8_t *a = job->aux + r0 * kp;
    __m512i c00 = _mm512_setzero_si512(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
            c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00,
            c80 = c00, c81 = c00, c90 = c00, c91 = c00, c100 = c00, c101 = c00, c110 = c00, c111 = c00;
    for (Py_ssize_t g = 0; g < job->groups; g++) {
        __m512i w0, w1;
        if (nibbles) { /* the same bytes ahead as below: twice the groups */
            if (far)
                _mm_prefetch((const char *)(w + (g + 2 * FAR_AHEAD) * GROUP4), _MM_HINT_T1);
            else
                _mm_prefetch((const char *)(w + (g + 2 * NEAR_AHEAD) * GROUP4), _MM_HINT_T0);
            const __m512i v = _mm512_loadu_si512((const void *)(w + g * GROUP4));
            w0 = _mm512_sub_epi8(_mm512_and_si512(v, low), eight);
            w1 = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), eight);
        } else {
            if (far) {
                _mm_prefetch((const char *)(w + (g + FAR_AHEAD) * GROUP), _MM_HINT_T1);
                _mm_prefetch((const char *)(w + (g + FAR_AHEAD) * GROUP + 64), _MM_HINT_T1);
            } else {
                _mm_prefetch((const char *)(w + (g + NEAR_AHEAD) * GROUP), _MM_HINT_T0);
                _mm_prefetch((const char *)(w + (g + NEAR_AHEAD) * GROUP + 64), _MM_HINT_T0);
            }
            w0 = _mm512_loadu_si512((const void *)(w + g * GROUP));
            w1 = _mm512_loadu_si512((const void *)(w + g * GROUP + 64));
        }
        VNNI_ROW(0) VNNI_ROW(1) VNNI_ROW(2) VNNI_ROW(3) VNNI_ROW(4) VNNI_ROW(5)
        VNNI_ROW(6) VNNI_ROW(7) VNNI_ROW(8) VNNI_ROW(9) VNNI_ROW(10) VNNI_ROW(11)
    }
    const __m512i acc[ROWS_512][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51},
                                      {c60, c61}, {c70, c71}, {c80, c81}, {c90, c91}, {c100, c101}, {c110, c111}};
    const Py_ssize_t c0 = t * TILE;
    for (int h = 0; h < 2; h++) {
        const Py_ssize_t c = c0 + 16 * h;
        if (c >= job->n) break;
        const __mmask16 keep = lanes_below(job->n - c);
        const __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(job->colsum + c)), 7);
        const __m512 scale = _mm512_maskz_loadu_ps(keep, job->scale + c);
        const __m512 bias = job->bias != NULL ? _mm512_maskz_loadu_ps(keep, job->bias + c) : _mm512_setzero_ps();
        __m512 held = _mm512_setzero_ps(); /* a pair's first row (paired: r0 and rows are even) */
        for (int r = 0; r < rows; r++) {
            __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][h], offset));
            f = _mm512_mul_ps(f, scale);
            f = _mm512_mul_ps(f, _mm512_set1_ps(job->rowscale[r0 + r]));
            if (job->paired) {
                if (r % 2 == 0) {
                    held = f;
                    continue;
                }
                f = _mm512_add_ps(held, f);
            }
            if (job->bias != NULL) f = _mm512_add_ps(f, bias);
            _mm512_mask_storeu_ps(job->out + ((r0 + r) >> job->paired) * job->n + c, keep, f);
        }
    }
}

__attribute__((target(VNNI_TARGET), always_inline)) static inline void rows_vnni(const job_t *job, Py_ssize_t t,
                                                                                 const int nibbles) {
    Py_ssize_t r0 = 0;
    for (; r0 + ROWS_512 <= job->m; r0 += ROWS_512) block_vnni(job, t, r0, ROWS_512, nibbles);
    switch (job->m - r0) {
        case 11: block_vnni(job, t, r0, 11, nibbles); break;
        case 10: block_vnni(job, t, r0, 10, nibbles); break;
        case 9: block_vnni(job, t, r0, 9, nibbles); break;
        case 8: block_vnni(job, t, r0, 8, nibbles); break;
        case 7: block_vnni(job, t, r0, 7, nibbles); break;
        case 6: block_vnni(job, t, r0, 6, nibbles); break;
        case 5: block_vnni(job, t, r0, 5, nibbles); break;
        case 4: block_vnni(job, t, r0, 4, nibbles); break;
        case 3: block_vnni(job, t, r0, 3, nibbles); break;
        case 2: block_vnni(job, t, r0, 2, nibbles); break;
        case 1: block_vnni(job, t, r0, 1, nibbles); break;
        default: break;
    }
}

/* A tile's rows with 8-bit or (linear4) 4-bit weights: two instances of one loop. */
__attribute__((target(VNNI_TARGET))) void wmark_tile_vnni(const job_t *job, Py_ssize_t t) { rows_vnni(job, t, 0); }
__attribute__((target(VNNI_TARGET))) void wmark_tile_vnni4(const job_t *job, Py_ssize_t t) { rows_vnni(job, t, 1); }

/* wmark_side_tile (_int8_gemm_portable.c) on 16 channels a vector: the same float operations on
 * each, in the same order. The 64 bytes of a group's half hold 16 channels' 4 weights; shifting
 * the wanted byte to the top of its lane and back (arithmetic) sign-extends it. The sums are
 * chains of dependent additions, so two rows and both halves of the tile run side by side (four
 * independent chains; one chain at a time waited on the adder: ~0.8 ms a row over the target). */
__attribute__((target(VNNI_TARGET), always_inline)) static inline __m512 weights_at(const uint8_t *half, int32_t c) {
    const __m512i v = _mm512_loadu_si512((const void *)half);
    return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_sllv_epi32(v, _mm512_set1_epi32(24 - 8 * (c % 4))), 24));
}

__attribute__((target(VNNI_TARGET), always_inline)) static inline void side_rows_vnni(const job_t *job,
                                                                                     Py_ssize_t t, Py_ssize_t r,
                                                                                     const int rows) {
    const uint8_t *w = job->packed + t * job->groups * GROUP;
    const Py_ssize_t c0 = t * TILE;
    const __mmask16 keep0 = lanes_below(job->n - c0), keep1 = lanes_below(job->n - c0 - 16);
    const int32_t *i0 = job->side_idx + r * job->side, *i1 = i0 + job->side;
    const float *v0 = job->side_val + r * job->side, *v1 = v0 + job->side;
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00; /* row, half */
    for (int d = 0; d < job->side; d++) {
        const uint8_t *g0 = w + (i0[d] / 4) * GROUP;
        const __m512 x0 = _mm512_set1_ps(v0[d]);
        a00 = _mm512_add_ps(a00, _mm512_mul_ps(weights_at(g0, i0[d]), x0));
        a01 = _mm512_add_ps(a01, _mm512_mul_ps(weights_at(g0 + 64, i0[d]), x0));
        if (rows == 2) {
            const uint8_t *g1 = w + (i1[d] / 4) * GROUP;
            const __m512 x1 = _mm512_set1_ps(v1[d]);
            a10 = _mm512_add_ps(a10, _mm512_mul_ps(weights_at(g1, i1[d]), x1));
            a11 = _mm512_add_ps(a11, _mm512_mul_ps(weights_at(g1 + 64, i1[d]), x1));
        }
    }
    const __m512 s0 = _mm512_maskz_loadu_ps(keep0, job->scale + c0);
    const __m512 s1 = _mm512_maskz_loadu_ps(keep1, job->scale + c0 + 16);
    const __m512 sums[2][2] = {{a00, a01}, {a10, a11}};
    for (int k = 0; k < rows; k++) {
        float *o = job->out + (r + k) * job->n + c0;
        _mm512_mask_storeu_ps(o, keep0, _mm512_add_ps(_mm512_maskz_loadu_ps(keep0, o), _mm512_mul_ps(sums[k][0], s0)));
        _mm512_mask_storeu_ps(o + 16, keep1,
                              _mm512_add_ps(_mm512_maskz_loadu_ps(keep1, o + 16), _mm512_mul_ps(sums[k][1], s1)));
    }
}

__attribute__((target(VNNI_TARGET))) void wmark_side_tile_vnni(const job_t *job, Py_ssize_t t) {
    Py_ssize_t r = 0;
    for (; r + 2 <= job->m; r += 2) side_rows_vnni(job, t, r, 2);
    if (r < job->m) side_rows_vnni(job, t, r, 1);
}
#endif
