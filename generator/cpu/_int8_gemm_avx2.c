/*
 * _int8_gemm's AVX2 kernel (see _int8_gemm.h for the module): the "avx2" build's tiles, for
 * x86-64 CPUs with AVX2 and without AVX-512 VNNI. vpmaddubsw multiplies |q| (the job's aux) by
 * the weights with q's sign: a pair of products is at most 2 x 127 x 127 and fits int16 without
 * saturating, and vpmaddwd adds the pairs into int32, so the sums are exact, as in every build.
 * Built for baseline x86-64 but for its functions' target("avx2"): it runs only where
 * PyInit__int8_gemm found AVX2.
 */
#include "_int8_gemm.h"

#ifdef WMARK_X86
#define ROWS_256 4 /* rows sharing each weight load (AVX2: 8 accumulators of 16) */

/*
 * The micro-kernels keep their accumulators in named variables (one per row and register of
 * channels), not an array: GCC kept an array in memory and stored every accumulator once per
 * group of 4 columns. `rows` is a constant at every call, so the unused rows compile away.
 */

/* ---- AVX2: 16 channels (half a tile) x up to ROWS_256 rows per pass ---- */
#define AVX2_ROW(r)                                                                                  \
    if (rows > r) {                                                                                  \
        const __m256i s = _mm256_set1_epi32(load4(q + r * kp + 4 * g));                               \
        const __m256i u = _mm256_set1_epi32(load4(mag + r * kp + 4 * g));                             \
        c##r##0 = _mm256_add_epi32(c##r##0,                                                          \
                                   _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(w0, s)), ones)); \
        c##r##1 = _mm256_add_epi32(c##r##1,                                                          \
                                   _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(w1, s)), ones)); \
    }

/* A block's sums (16 channels, 8 a register) scaled and added to the blocks' before (scaled()). */
__attribute__((target("avx2"), always_inline)) static inline void fold8(float *f, __m256i sums, __m256 scale,
                                                                        Py_ssize_t b) {
    __m256 g = _mm256_mul_ps(_mm256_cvtepi32_ps(sums), scale);
    if (b > 0) g = _mm256_add_ps(_mm256_loadu_ps(f), g);
    _mm256_storeu_ps(f, g);
}

#define AVX2_FOLD(r)                                   \
    if (rows > r) {                                    \
        fold8(f[r], c##r##0, s0, b);                   \
        fold8(f[r] + 8, c##r##1, s1, b);               \
        c##r##0 = _mm256_setzero_si256();              \
        c##r##1 = c##r##0;                             \
    }

__attribute__((target("avx2"), always_inline)) static inline void half_avx2(const job_t *job, Py_ssize_t t,
                                                                              int half, Py_ssize_t r0,
                                                                              const int rows) {
    const uint8_t *w = job->packed + t * job->groups * GROUP + half * 64;
    const Py_ssize_t kp = job->groups * 4;
    const int8_t *q = job->q + r0 * kp;
    const uint8_t *mag = job->aux + r0 * kp;
    const __m256i ones = _mm256_set1_epi16(1);
    const Py_ssize_t c0 = t * TILE + half * 16;
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
            c31 = c00;
    float f[ROWS_256][16]; /* the scaled sums of the blocks so far */
    for (Py_ssize_t b = 0; b < job->blocks; b++) {
        const Py_ssize_t last = block_end(job, b);
        for (Py_ssize_t g = b * job->span; g < last; g++) {
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + g * GROUP));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + g * GROUP + 32));
            AVX2_ROW(0) AVX2_ROW(1) AVX2_ROW(2) AVX2_ROW(3)
        }
        float sc[16];
        const float *scale = scales_at(job, t, b) + half * 16;
        for (int j = 0; j < 16; j++) sc[j] = c0 + j < job->n ? scale[j] : 0.0f;
        const __m256 s0 = _mm256_loadu_ps(sc), s1 = _mm256_loadu_ps(sc + 8);
        AVX2_FOLD(0) AVX2_FOLD(1) AVX2_FOLD(2) AVX2_FOLD(3)
    }
    float held[16]; /* a pair's first row (paired jobs: blocks start at even rows) */
    for (int r = 0; r < rows; r++) {
        const float rs = job->rowscale[r0 + r];
        if (!job->paired) {
            float *out = job->out + (r0 + r) * job->n;
            for (int j = 0; j < 16 && c0 + j < job->n; j++) out[c0 + j] = finish(f[r][j], rs, job->bias, c0 + j);
        } else if (r % 2 == 0) {
            for (int j = 0; j < 16 && c0 + j < job->n; j++) held[j] = finish(f[r][j], rs, NULL, c0 + j);
        } else {
            float *out = job->out + (r0 + r) / 2 * job->n;
            for (int j = 0; j < 16 && c0 + j < job->n; j++)
                out[c0 + j] = add_pair(held[j], finish(f[r][j], rs, NULL, c0 + j), job->bias, c0 + j);
        }
    }
}

__attribute__((target("avx2"))) void wmark_tile_avx2(const job_t *job, Py_ssize_t t) {
    for (int half = 0; half < 2; half++) {
        if (t * TILE + half * 16 >= job->n) break;
        Py_ssize_t r0 = 0;
        for (; r0 + ROWS_256 <= job->m; r0 += ROWS_256) half_avx2(job, t, half, r0, ROWS_256);
        switch (job->m - r0) {
            case 3: half_avx2(job, t, half, r0, 3); break;
            case 2: half_avx2(job, t, half, r0, 2); break;
            case 1: half_avx2(job, t, half, r0, 1); break;
            default: break;
        }
    }
}

/* wmark_side_tile (_int8_gemm_portable.c) on 8 channels a vector: the same float operations on
 * each, in the same order; the tile's four quarters are four independent chains of additions.
 * A group's 32 bytes at 32 q hold channels 8 q .. 8 q + 7, 4 weights each: shifting the wanted
 * byte to the top of its lane and back (arithmetic) sign-extends it. */
__attribute__((target("avx2"), always_inline)) static inline __m256 weights8(const uint8_t *quarter, __m256i shift) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)quarter);
    return _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_sllv_epi32(v, shift), 24));
}

__attribute__((target("avx2"))) void wmark_side_tile_avx2(const job_t *job, Py_ssize_t t) {
    const uint8_t *w = job->packed + t * job->groups * GROUP;
    const Py_ssize_t c0 = t * TILE;
    for (Py_ssize_t r = 0; r < job->m; r++) {
        const int32_t *idx = job->side_idx + r * job->side;
        const float *val = job->side_val + r * job->side;
        float *o = job->out + r * job->n + c0;
        for (int d = 0; d < job->side;) { /* a block's channels at a time (see wmark_side_tile) */
            const Py_ssize_t b = block_of(job, idx[d]);
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (; d < job->side && block_of(job, idx[d]) == b; d++) {
                const uint8_t *g = w + (idx[d] / 4) * GROUP;
                const __m256i shift = _mm256_set1_epi32(24 - 8 * (idx[d] % 4));
                const __m256 x = _mm256_set1_ps(val[d]);
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(weights8(g, shift), x));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(weights8(g + 32, shift), x));
                a2 = _mm256_add_ps(a2, _mm256_mul_ps(weights8(g + 64, shift), x));
                a3 = _mm256_add_ps(a3, _mm256_mul_ps(weights8(g + 96, shift), x));
            }
            float side[TILE];
            _mm256_storeu_ps(side, a0);
            _mm256_storeu_ps(side + 8, a1);
            _mm256_storeu_ps(side + 16, a2);
            _mm256_storeu_ps(side + 24, a3);
            const float *scale = scales_at(job, t, b);
            for (int j = 0; j < TILE && c0 + j < job->n; j++) o[j] = o[j] + side[j] * scale[j];
        }
    }
}
#endif
