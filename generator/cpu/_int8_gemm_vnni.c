/*
 * _int8_gemm's AVX-512 VNNI kernel (see _int8_gemm.h for the module): the "avx512vnni" build's
 * tiles, 8-bit weights (linear) and 4-bit (linear4: the same loop, the nibbles unpacked into the
 * same registers), and the "amx" build's blocks of fewer than AMX_MIN_ROWS rows (4-bit:
 * AMX_MIN_ROWS_WIDENED). vpdpbusd multiplies the unsigned activations q + 128 (the job's aux) by
 * the signed weights; the epilogue takes 128 x (the channel's weight sum) off again, so the sums
 * are exact, as in every build (with block scales the roles swap: "Block weight scales" in
 * _int8_gemm.h). Built for baseline x86-64 but for its functions' target(VNNI_TARGET): it runs only
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
/* vpdpbusd's first factor is unsigned: the activations (q + 128), or with block scales the
 * weights (their bytes plus 128) against the signed activations */
#define VNNI_ROW(r)                                                            \
    if (rows > r) {                                                            \
        const __m512i u = _mm512_set1_epi32(load4(a + r * kp + 4 * g));         \
        c##r##0 = blocked ? _mm512_dpbusd_epi32(c##r##0, w0, u) : _mm512_dpbusd_epi32(c##r##0, u, w0); \
        c##r##1 = blocked ? _mm512_dpbusd_epi32(c##r##1, w1, u) : _mm512_dpbusd_epi32(c##r##1, u, w1); \
    }

/* A block's sums of row r (both halves), less their offset (128 x the channel's weight sums, or
 * with block scales 128 x the row's sum over the block), scaled and added to the blocks' before
 * (scaled()), and zeroed for the next block. */
#define VNNI_FOLD(r)                                                                              \
    if (rows > r) {                                                                               \
        const __m512i o0 = blocked ? _mm512_set1_epi32(job->qsum[(r0 + r) * job->blocks + b] * 128) : off0; \
        const __m512i o1 = blocked ? o0 : off1;                                                   \
        const __m512 g0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c##r##0, o0)), s0);   \
        const __m512 g1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c##r##1, o1)), s1);   \
        f[r][0] = b == 0 ? g0 : _mm512_add_ps(f[r][0], g0);                                   \
        f[r][1] = b == 0 ? g1 : _mm512_add_ps(f[r][1], g1);                                   \
        c##r##0 = _mm512_setzero_si512();                                                     \
        c##r##1 = c##r##0;                                                                    \
    }

__attribute__((target(VNNI_TARGET), always_inline)) static inline void block_vnni(const job_t *job, Py_ssize_t t,
                                                                                    Py_ssize_t r0, const int rows,
                                                                                    const int nibbles, const int blocked) {
    /* the same for the whole call: the branch below is predicted */
    const int far = wmark_prefetch == PREFETCH_FAR ||
                    (wmark_prefetch == PREFETCH_ROWS && job->m * (nibbles ? 2 : 1) >= FAR_FROM_ROWS);
    const __m512i low = _mm512_set1_epi8(15), eight = _mm512_set1_epi8(8);
    const uint8_t *w = job->packed + t * job->groups * (nibbles ? GROUP4 : GROUP);
    const Py_ssize_t kp = job->groups * 4;
    /* the activations' bytes: q + 128 against signed weights, or with block scales q itself
     * against the weights' bytes plus 128 (their top bit flipped) */
    const uint8_t *a = blocked ? (const uint8_t *)job->q + r0 * kp : job->aux + r0 * kp;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const Py_ssize_t c0 = t * TILE;
    const __mmask16 keep0 = lanes_below(job->n - c0), keep1 = lanes_below(job->n - c0 - 16);
    __m512i c00 = _mm512_setzero_si512(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
            c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00,
            c80 = c00, c81 = c00, c90 = c00, c91 = c00, c100 = c00, c101 = c00, c110 = c00, c111 = c00;
    __m512 f[ROWS_512][2]; /* the scaled sums of the blocks so far */
    /* without block scales, 128 x each channel's weight sum comes off its sums (VNNI_FOLD) */
    const __m512i off0 = blocked ? c00 : _mm512_slli_epi32(_mm512_loadu_si512((const void *)(job->colsum + c0)), 7);
    const __m512i off1 = blocked ? c00 : _mm512_slli_epi32(_mm512_loadu_si512((const void *)(job->colsum + c0 + 16)), 7);
    for (Py_ssize_t b = 0; b < job->blocks; b++) {
        const Py_ssize_t last = block_end(job, b);
        for (Py_ssize_t g = b * job->span; g < last; g++) {
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
                if (blocked) {
                    w0 = _mm512_xor_si512(w0, flip);
                    w1 = _mm512_xor_si512(w1, flip);
                }
            }
            VNNI_ROW(0) VNNI_ROW(1) VNNI_ROW(2) VNNI_ROW(3) VNNI_ROW(4) VNNI_ROW(5)
            VNNI_ROW(6) VNNI_ROW(7) VNNI_ROW(8) VNNI_ROW(9) VNNI_ROW(10) VNNI_ROW(11)
        }
        /* the block's sums, less their offset, scaled and added to the blocks' before */
        const float *scale = scales_at(job, t, b);
        const __m512 s0 = _mm512_maskz_loadu_ps(keep0, scale);
        const __m512 s1 = _mm512_maskz_loadu_ps(keep1, scale + 16);
        VNNI_FOLD(0) VNNI_FOLD(1) VNNI_FOLD(2) VNNI_FOLD(3) VNNI_FOLD(4) VNNI_FOLD(5)
        VNNI_FOLD(6) VNNI_FOLD(7) VNNI_FOLD(8) VNNI_FOLD(9) VNNI_FOLD(10) VNNI_FOLD(11)
    }
    for (int h = 0; h < 2; h++) {
        const Py_ssize_t c = c0 + 16 * h;
        if (c >= job->n) break;
        const __mmask16 keep = h == 0 ? keep0 : keep1;
        const __m512 bias = job->bias != NULL ? _mm512_maskz_loadu_ps(keep, job->bias + c) : _mm512_setzero_ps();
        __m512 held = _mm512_setzero_ps(); /* a pair's first row (paired: r0 and rows are even) */
        for (int r = 0; r < rows; r++) {
            __m512 f_r = _mm512_mul_ps(f[r][h], _mm512_set1_ps(job->rowscale[r0 + r]));
            if (job->paired) {
                if (r % 2 == 0) {
                    held = f_r;
                    continue;
                }
                f_r = _mm512_add_ps(held, f_r);
            }
            if (job->bias != NULL) f_r = _mm512_add_ps(f_r, bias);
            _mm512_mask_storeu_ps(job->out + ((r0 + r) >> job->paired) * job->n + c, keep, f_r);
        }
    }
}

__attribute__((target(VNNI_TARGET), always_inline)) static inline void rows_vnni(const job_t *job, Py_ssize_t t,
                                                                                 const int nibbles,
                                                                                 const int blocked) {
    Py_ssize_t r0 = 0;
    for (; r0 + ROWS_512 <= job->m; r0 += ROWS_512) block_vnni(job, t, r0, ROWS_512, nibbles, blocked);
    switch (job->m - r0) {
        case 11: block_vnni(job, t, r0, 11, nibbles, blocked); break;
        case 10: block_vnni(job, t, r0, 10, nibbles, blocked); break;
        case 9: block_vnni(job, t, r0, 9, nibbles, blocked); break;
        case 8: block_vnni(job, t, r0, 8, nibbles, blocked); break;
        case 7: block_vnni(job, t, r0, 7, nibbles, blocked); break;
        case 6: block_vnni(job, t, r0, 6, nibbles, blocked); break;
        case 5: block_vnni(job, t, r0, 5, nibbles, blocked); break;
        case 4: block_vnni(job, t, r0, 4, nibbles, blocked); break;
        case 3: block_vnni(job, t, r0, 3, nibbles, blocked); break;
        case 2: block_vnni(job, t, r0, 2, nibbles, blocked); break;
        case 1: block_vnni(job, t, r0, 1, nibbles, blocked); break;
        default: break;
    }
}

/* A tile's rows with 8-bit weights (a scale per channel, or per block) or (linear4) 4-bit ones:
 * three instances of one loop. */
__attribute__((target(VNNI_TARGET))) void wmark_tile_vnni(const job_t *job, Py_ssize_t t) {
    if (job->blocks > 1)
        rows_vnni(job, t, 0, 1);
    else
        rows_vnni(job, t, 0, 0);
}
__attribute__((target(VNNI_TARGET))) void wmark_tile_vnni4(const job_t *job, Py_ssize_t t) { rows_vnni(job, t, 1, 0); }

/* wmark_side_tile (_int8_gemm_portable.c) on 16 channels a vector: the same float operations on
 * each, in the same order. The 64 bytes of a group's half hold 16 channels' 4 weights; shifting
 * the wanted byte to the top of its lane and back (arithmetic) sign-extends it. The sums are
 * chains of dependent additions, so two rows and both halves of the tile run side by side (four
 * independent chains; one chain at a time waited on the adder: ~0.8 ms a row over the target). */
__attribute__((target(VNNI_TARGET), always_inline)) static inline __m512 weights_at(const uint8_t *half, int32_t c) {
    const __m512i v = _mm512_loadu_si512((const void *)half);
    return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_sllv_epi32(v, _mm512_set1_epi32(24 - 8 * (c % 4))), 24));
}

/* Row r's float part of block b (both halves of the tile) added to its output: out + a * scale. */
__attribute__((target(VNNI_TARGET), always_inline)) static inline void side_flush(const job_t *job, Py_ssize_t t,
                                                                                 Py_ssize_t r, Py_ssize_t b,
                                                                                 __m512 a0, __m512 a1) {
    const Py_ssize_t c0 = t * TILE;
    const __mmask16 keep0 = lanes_below(job->n - c0), keep1 = lanes_below(job->n - c0 - 16);
    const float *scale = scales_at(job, t, b);
    float *o = job->out + r * job->n + c0;
    _mm512_mask_storeu_ps(o, keep0,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(keep0, o), _mm512_mul_ps(a0, _mm512_maskz_loadu_ps(keep0, scale))));
    _mm512_mask_storeu_ps(o + 16, keep1,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(keep1, o + 16),
                                        _mm512_mul_ps(a1, _mm512_maskz_loadu_ps(keep1, scale + 16))));
}

__attribute__((target(VNNI_TARGET), always_inline)) static inline void side_rows_vnni(const job_t *job,
                                                                                     Py_ssize_t t, Py_ssize_t r,
                                                                                     const int rows) {
    const uint8_t *w = job->packed + t * job->groups * GROUP;
    const int32_t *i0 = job->side_idx + r * job->side, *i1 = i0 + job->side;
    const float *v0 = job->side_val + r * job->side, *v1 = v0 + job->side;
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00; /* row, half */
    /* each row's channels ascend: a block's sum is added out before the row's next block starts */
    Py_ssize_t b0 = block_of(job, i0[0]), b1 = rows == 2 ? block_of(job, i1[0]) : 0;
    /* the two rows' steps are written out side by side, not as one helper called twice: through
     * a helper (its sums behind pointers) a 9-row call measured 3-5 % slower in alternating runs */
    for (int d = 0; d < job->side; d++) {
        if (block_of(job, i0[d]) != b0) {
            side_flush(job, t, r, b0, a00, a01);
            a00 = a01 = _mm512_setzero_ps();
            b0 = block_of(job, i0[d]);
        }
        const uint8_t *g0 = w + (i0[d] / 4) * GROUP;
        const __m512 x0 = _mm512_set1_ps(v0[d]);
        a00 = _mm512_add_ps(a00, _mm512_mul_ps(weights_at(g0, i0[d]), x0));
        a01 = _mm512_add_ps(a01, _mm512_mul_ps(weights_at(g0 + 64, i0[d]), x0));
        if (rows == 2) {
            if (block_of(job, i1[d]) != b1) {
                side_flush(job, t, r + 1, b1, a10, a11);
                a10 = a11 = _mm512_setzero_ps();
                b1 = block_of(job, i1[d]);
            }
            const uint8_t *g1 = w + (i1[d] / 4) * GROUP;
            const __m512 x1 = _mm512_set1_ps(v1[d]);
            a10 = _mm512_add_ps(a10, _mm512_mul_ps(weights_at(g1, i1[d]), x1));
            a11 = _mm512_add_ps(a11, _mm512_mul_ps(weights_at(g1 + 64, i1[d]), x1));
        }
    }
    side_flush(job, t, r, b0, a00, a01);
    if (rows == 2) side_flush(job, t, r + 1, b1, a10, a11);
}

__attribute__((target(VNNI_TARGET))) void wmark_side_tile_vnni(const job_t *job, Py_ssize_t t) {
    Py_ssize_t r = 0;
    for (; r + 2 <= job->m; r += 2) side_rows_vnni(job, t, r, 2);
    if (r < job->m) side_rows_vnni(job, t, r, 1);
}
#endif
