/*
 * wmark.generator.cpu._int8_gemm: the exact int8 GEMM of the batch-invariant CPU path.
 *
 * A linear layer y = x W^T + b with int8 weights (a scale per output channel) and int8
 * activations (a scale per row): each row of x is quantised with its own peak, the integer
 * products are summed exactly in int32, and the sum is scaled back. Integer sums do not depend
 * on the order of the additions, so a row's output is the same bits whichever kernel ran and
 * however many rows rode along: what speculative verification needs (a token's logits must not
 * depend on the draft tree it was verified in).
 *
 * Why not fbgemm: its packed weights are opaque (they cannot be stored, so every load repacked
 * the 1.5B target for ~5 s), it takes its input as separate torch ops (abs, amax, divide, round,
 * multiply: ~6 small ops per layer call), and each extra row of a small block cost ~12 % of a
 * one-row forward on a 2-core AVX-512 EPYC, where the weights are read once whatever the row
 * count. Here one call quantises, multiplies and scales, and a block of up to 12 rows shares
 * every load of the weights.
 *
 * Weights are packed once, in a layout shared by every build: tiles of 32 output channels; in a
 * tile, groups of 4 input columns; a group is 128 bytes, channel j's 4 weights at 4 j. Three
 * builds, picked at import from the CPU (`backend()`), all giving the same integer sums:
 * - avx512vnni: vpdpbusd, unsigned activations q + 128 times signed weights, minus
 *   128 x (the channel's weight sum);
 * - avx2: vpmaddubsw on |q| and the weights with q's sign (pairs of products <= 2 x 127 x 127
 *   fit int16: no saturation), vpmaddwd into int32;
 * - portable C;
 * and on CPUs with AMX (Intel Sapphire Rapids and later) a fourth, "amx", that runs blocks of 16
 * rows or more (a prompt's prefill, wide verify trees) on the tile unit: tdpbssd multiplies
 * signed bytes directly, 16 rows x 16 channels x 64 columns per instruction, and reads the
 * packed layout as it is (a tile's group of 4 columns is one 64-byte row of a B tile for 16
 * channels). Fewer rows, or widths that are not a multiple of 64, run the avx512vnni code.
 * linear4 runs the VNNI loop (or portable C) over 4-bit weights, two a byte, unpacked to the
 * same registers (draft models only: wmark.generator.drafters.int4_weights).
 * Compile with -ffp-contract=off: the scaling is two multiplications and an addition, in that
 * order, never fused, so it rounds like the torch expression it replaced.
 */
#define PY_SSIZE_T_CLEAN
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* cpu_set_t, pthread_attr_setaffinity_np: the workers' CPUs */
#endif
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_fastmath.h"
#include "_pool_api.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define WMARK_X86 1
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define WMARK_AMX 1 /* the kernel must grant the tile state to the process (arch_prctl) */
#endif
#endif

#define TILE 32     /* output channels per packed tile */
#define GROUP 128   /* bytes of one tile's 4 input columns */
#define GROUP4 64   /* the same with 4-bit weights: byte j holds GROUP bytes j (low) and 64 + j (high) */
#define ROWS_512 12 /* rows sharing each weight load (AVX-512: 24 accumulators of 32) */
#define ROWS_256 4  /* the same with AVX2 (8 accumulators of 16) */
/* Software prefetch of the weights, in groups ahead (prefetches never fault). Measured per CPU,
 * one thread: on a 2-core AMD EPYC 96 groups (12 KB) into L1 was the best of 0-128; on a 2-core
 * Intel Xeon with AMX, where one core streams ~13 GB/s, 192 groups into L2 (more misses in
 * flight) took the target's 9-row forward from 196 to 184-190 ms and left one row as it was
 * (bench/int8_kernels.py --prefetch far,near). Intel CPUs take the far prefetch. */
#define NEAR_AHEAD 96
#define FAR_AHEAD 192
static int far_prefetch = 0;

#define AMX_MIN_ROWS 16 /* fewer rows stream the weights once through VNNI as fast */
#define AMX_PANEL_BYTES (768 * 1024) /* quantised rows kept in L2 while a thread's tiles stream by */
#define AMX_WIDE_BYTES (320 * 1024)  /* 4-bit tiles widened for the tile unit: up to 2,560 groups */
static atomic_int wide_failed = 0;   /* a thread could not get its widening buffer (see widen4) */

/* AMX_TILES is not a build of its own: the job of an "amx" call that runs on the tile unit. */
enum backend { PORTABLE = 0, AVX2 = 1, AVX512VNNI = 2, AMX = 3, AMX_TILES = 4 };
static const char *backend_names[] = {"portable", "avx2", "avx512vnni", "amx"};
static int best_backend = PORTABLE; /* what this CPU runs */
static int active_backend = PORTABLE; /* what runs now (tests may force a slower one) */

static inline Py_ssize_t tiles_of(Py_ssize_t n) { return (n + TILE - 1) / TILE; }
static inline Py_ssize_t groups_of(Py_ssize_t k) { return (k + 3) / 4; }

/* One call's work: the quantised rows and where the tiles' results go. */
typedef struct {
    const uint8_t *packed;  /* tiles x groups x GROUP bytes */
    const int32_t *colsum;  /* (tiles x TILE) weight sums per channel, 0 past n */
    const float *scale;     /* (n) channel scales */
    const float *bias;      /* (n) or NULL */
    const int8_t *q;        /* (m, 4 groups) quantised rows, signed, zero-padded (AMX: to 16 rows) */
    const uint8_t *aux;     /* (m, 4 groups): q + 128 (avx512vnni) or |q| (avx2); else NULL */
    const float *rowscale;  /* (m) peak / 127 */
    float *out;             /* (m, n) */
    Py_ssize_t m, n, groups;
    int backend;
    int nibbles; /* 4-bit weights (linear4): GROUP4 bytes a group */
    const struct rows_job *rows; /* non-NULL: the call's rows phase (its chunks are rows), not tiles */
    wmark_units_fn each;         /* non-NULL: another kernel's m units (`parallel_for`), not tiles */
    void *ctx;                   /* ... and its argument */
} job_t;

/* A call's rows phase: each row of x through the prologue (if any), then quantised. */
typedef struct rows_job {
    const float *x;     /* (m, k), or (m, 2k) for SWIGLU */
    const float *norm;  /* (k): RMS_NORM's weight */
    float eps;
    float *h;           /* (m, k) scratch for the prologue's rows, or NULL */
    int prologue, rounding;
    Py_ssize_t k, kp;
    int8_t *q;
    uint8_t *aux;
    float *rowscale;
} rows_job_t;

static void run_rows(const rows_job_t *rows, Py_ssize_t first, Py_ssize_t last);

/* ---- the epilogue, portable: (float)sum * scale * rowscale (+ bias), in that order ---- */
static inline float finish(int32_t sum, float scale, float rowscale, const float *bias, Py_ssize_t c) {
    float f = (float)sum;
    f = f * scale;
    f = f * rowscale;
    if (bias != NULL) f = f + bias[c];
    return f;
}

static void tile_portable(const job_t *job, Py_ssize_t t) {
    const uint8_t *w = job->packed + t * job->groups * GROUP;
    const Py_ssize_t c0 = t * TILE, kp = job->groups * 4;
    for (Py_ssize_t r = 0; r < job->m; r++) {
        const int8_t *a = job->q + r * kp;
        int32_t sums[TILE] = {0};
        for (Py_ssize_t g = 0; g < job->groups; g++) {
            const int8_t *wg = (const int8_t *)(w + g * GROUP);
            const int8_t *ag = a + 4 * g;
            for (int j = 0; j < TILE; j++)
                sums[j] += ag[0] * wg[4 * j] + ag[1] * wg[4 * j + 1] + ag[2] * wg[4 * j + 2] + ag[3] * wg[4 * j + 3];
        }
        for (int j = 0; j < TILE && c0 + j < job->n; j++)
            job->out[r * job->n + c0 + j] = finish(sums[j], job->scale[c0 + j], job->rowscale[r], job->bias, c0 + j);
    }
}

/* A 4-bit weight: byte p (0-127) of a group in the 8-bit layout, stored as a nibble plus 8. */
static inline int nibble(const uint8_t *group, int p) {
    return (p < 64 ? group[p] & 15 : group[p - 64] >> 4) - 8;
}

static void tile_portable4(const job_t *job, Py_ssize_t t) {
    const uint8_t *w = job->packed + t * job->groups * GROUP4;
    const Py_ssize_t c0 = t * TILE, kp = job->groups * 4;
    for (Py_ssize_t r = 0; r < job->m; r++) {
        const int8_t *a = job->q + r * kp;
        int32_t sums[TILE] = {0};
        for (Py_ssize_t g = 0; g < job->groups; g++) {
            const uint8_t *wg = w + g * GROUP4;
            const int8_t *ag = a + 4 * g;
            for (int j = 0; j < TILE; j++)
                for (int i = 0; i < 4; i++) sums[j] += ag[i] * nibble(wg, 4 * j + i);
        }
        for (int j = 0; j < TILE && c0 + j < job->n; j++)
            job->out[r * job->n + c0 + j] = finish(sums[j], job->scale[c0 + j], job->rowscale[r], job->bias, c0 + j);
    }
}

#ifdef WMARK_X86
static inline int32_t load4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

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

__attribute__((target("avx2"), always_inline)) static inline void half_avx2(const job_t *job, Py_ssize_t t,
                                                                              int half, Py_ssize_t r0,
                                                                              const int rows) {
    const uint8_t *w = job->packed + t * job->groups * GROUP + half * 64;
    const Py_ssize_t kp = job->groups * 4;
    const int8_t *q = job->q + r0 * kp;
    const uint8_t *mag = job->aux + r0 * kp;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
            c31 = c00;
    for (Py_ssize_t g = 0; g < job->groups; g++) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + g * GROUP));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + g * GROUP + 32));
        AVX2_ROW(0) AVX2_ROW(1) AVX2_ROW(2) AVX2_ROW(3)
    }
    const __m256i acc[ROWS_256][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}};
    const Py_ssize_t c0 = t * TILE + half * 16;
    for (int r = 0; r < rows; r++) {
        int32_t sums[16];
        _mm256_storeu_si256((__m256i *)sums, acc[r][0]);
        _mm256_storeu_si256((__m256i *)(sums + 8), acc[r][1]);
        float *out = job->out + (r0 + r) * job->n;
        const float rs = job->rowscale[r0 + r];
        for (int j = 0; j < 16 && c0 + j < job->n; j++)
            out[c0 + j] = finish(sums[j], job->scale[c0 + j], rs, job->bias, c0 + j);
    }
}

__attribute__((target("avx2"))) static void tile_avx2(const job_t *job, Py_ssize_t t) {
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

/* ---- AVX-512 VNNI: a whole tile x up to ROWS_512 rows per pass ---- */
#define VNNI_TARGET "avx512f,avx512bw,avx512vl,avx512vnni"
#define VNNI_ROW(r)                                                            \
    if (rows > r) {                                                            \
        const __m512i u = _mm512_set1_epi32(load4(a + r * kp + 4 * g));         \
        c##r##0 = _mm512_dpbusd_epi32(c##r##0, u, w0);                         \
        c##r##1 = _mm512_dpbusd_epi32(c##r##1, u, w1);                         \
    }

__attribute__((target(VNNI_TARGET), always_inline)) static inline void block_vnni(const job_t *job, Py_ssize_t t,
                                                                                    Py_ssize_t r0, const int rows,
                                                                                    const int nibbles) {
    const int far = far_prefetch; /* the same all run long: the branch below is predicted */
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
        const Py_ssize_t left = job->n - c;
        const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        const __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(job->colsum + c)), 7);
        const __m512 scale = _mm512_maskz_loadu_ps(keep, job->scale + c);
        const __m512 bias = job->bias != NULL ? _mm512_maskz_loadu_ps(keep, job->bias + c) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++) {
            __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][h], offset));
            f = _mm512_mul_ps(f, scale);
            f = _mm512_mul_ps(f, _mm512_set1_ps(job->rowscale[r0 + r]));
            if (job->bias != NULL) f = _mm512_add_ps(f, bias);
            _mm512_mask_storeu_ps(job->out + (r0 + r) * job->n + c, keep, f);
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
__attribute__((target(VNNI_TARGET))) static void tile_vnni(const job_t *job, Py_ssize_t t) { rows_vnni(job, t, 0); }
__attribute__((target(VNNI_TARGET))) static void tile_vnni4(const job_t *job, Py_ssize_t t) { rows_vnni(job, t, 1); }
#ifdef WMARK_AMX
/*
 * ---- AMX: blocks of 32 rows x one packed tile (32 channels) on the tile unit ----
 * Tile registers: 0-3 the int32 sums (rows 0-15 / 16-31 x channels 0-15 / 16-31), 4-5 the two
 * row blocks' 64 columns, 6-7 the two channel halves' weights: 16 groups of 4 columns, 64
 * bytes each, 128 bytes apart in the packed tile. Rows are taken a panel at a time (what fits
 * AMX_PANEL_BYTES), and within a panel every tile of the thread's range meets every row block:
 * the panel's rows stay in L2 while the weights stream from memory once per panel.
 */
#define AMX_TARGET "amx-tile,amx-int8,avx512f,avx512bw,avx512vl"

typedef struct {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config_t;

/* Scale 16 x 32 sums (a row stride of 32) into the output, as block_vnni does (no offset:
 * tdpbssd multiplies the signed bytes themselves). */
__attribute__((target(VNNI_TARGET))) static void finish_amx(const job_t *job, const int32_t *sums, Py_ssize_t t,
                                                            Py_ssize_t r0, int rows) {
    for (int h = 0; h < 2; h++) {
        const Py_ssize_t c = t * TILE + 16 * h;
        if (c >= job->n) break;
        const Py_ssize_t left = job->n - c;
        const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        const __m512 scale = _mm512_maskz_loadu_ps(keep, job->scale + c);
        const __m512 bias = job->bias != NULL ? _mm512_maskz_loadu_ps(keep, job->bias + c) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++) {
            __m512 f = _mm512_cvtepi32_ps(_mm512_loadu_si512((const void *)(sums + r * TILE + 16 * h)));
            f = _mm512_mul_ps(f, scale);
            f = _mm512_mul_ps(f, _mm512_set1_ps(job->rowscale[r0 + r]));
            if (job->bias != NULL) f = _mm512_add_ps(f, bias);
            _mm512_mask_storeu_ps(job->out + (r0 + r) * job->n + c, keep, f);
        }
    }
}

/* The 2 KB (16 groups) of weights a chunk reads, FAR_AHEAD groups ahead (AMX CPUs are Intel's). */
static inline void prefetch_chunk(const uint8_t *p) {
    for (int line = 0; line < 16 * GROUP; line += 64) _mm_prefetch((const char *)(p + line), _MM_HINT_T1);
}

/* 4-bit weights (linear4) on the tile unit: each tile's nibbles are widened to the 8-bit packed
 * layout (GROUP bytes a group, the values block_vnni computes on the fly) in a buffer of the
 * thread's, once per tile and panel, and then run the same loop: a prefill's many rows share each
 * widening. Wider layers than the buffer holds stay on VNNI. */
static _Thread_local uint8_t *wide_buffer = NULL; /* never freed: pool threads live as long */

__attribute__((target(AMX_TARGET))) static void widen4(const uint8_t *packed, Py_ssize_t groups, uint8_t *wide) {
    const __m512i low = _mm512_set1_epi8(15), eight = _mm512_set1_epi8(8);
    for (Py_ssize_t g = 0; g < groups; g++) {
        const __m512i v = _mm512_loadu_si512((const void *)(packed + g * GROUP4));
        _mm512_store_si512((void *)(wide + g * GROUP), _mm512_sub_epi8(_mm512_and_si512(v, low), eight));
        _mm512_store_si512((void *)(wide + g * GROUP + 64),
                           _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), eight));
    }
}

__attribute__((target(AMX_TARGET))) static void range_amx(const job_t *job, Py_ssize_t first, Py_ssize_t last) {
    uint8_t *wide = NULL;
    if (job->nibbles) {
        if (wide_buffer == NULL) wide_buffer = aligned_alloc(64, AMX_WIDE_BYTES);
        if (wide_buffer == NULL) {
            atomic_store(&wide_failed, 1);
            return;
        }
        wide = wide_buffer;
    }
    tile_config_t config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int i = 0; i < 8; i++) {
        config.colsb[i] = 64;
        config.rows[i] = 16;
    }
    _tile_loadconfig(&config);
    const Py_ssize_t kp = job->groups * 4, chunks = job->groups / 16, padded = (job->m + 15) / 16 * 16;
    Py_ssize_t panel = AMX_PANEL_BYTES / kp / 32 * 32;
    if (panel < 32) panel = 32;
    int32_t sums[32 * TILE] __attribute__((aligned(64)));
    for (Py_ssize_t p0 = 0; p0 < padded; p0 += panel) {
        const Py_ssize_t p1 = p0 + panel < padded ? p0 + panel : padded;
        for (Py_ssize_t t = first; t < last; t++) {
            const uint8_t *w = job->packed + t * job->groups * GROUP;
            if (wide != NULL) {
                widen4(job->packed + t * job->groups * GROUP4, job->groups, wide);
                w = wide;
            }
            for (Py_ssize_t r0 = p0; r0 < p1; r0 += 32) {
                const int8_t *a = job->q + r0 * kp;
                _tile_zero(0);
                _tile_zero(1);
                if (r0 + 16 < p1) { /* two row blocks */
                    _tile_zero(2);
                    _tile_zero(3);
                    for (Py_ssize_t c = 0; c < chunks; c++) {
                        if (wide == NULL) prefetch_chunk(w + (c * 16 + FAR_AHEAD) * GROUP);
                        _tile_loadd(6, w + c * 16 * GROUP, GROUP);
                        _tile_loadd(7, w + c * 16 * GROUP + 64, GROUP);
                        _tile_loadd(4, a + c * 64, kp);
                        _tile_loadd(5, a + 16 * kp + c * 64, kp);
                        _tile_dpbssd(0, 4, 6);
                        _tile_dpbssd(1, 4, 7);
                        _tile_dpbssd(2, 5, 6);
                        _tile_dpbssd(3, 5, 7);
                    }
                    _tile_stored(2, sums + 16 * TILE, TILE * 4);
                    _tile_stored(3, sums + 16 * TILE + 16, TILE * 4);
                } else {
                    for (Py_ssize_t c = 0; c < chunks; c++) {
                        if (wide == NULL) prefetch_chunk(w + (c * 16 + FAR_AHEAD) * GROUP);
                        _tile_loadd(6, w + c * 16 * GROUP, GROUP);
                        _tile_loadd(7, w + c * 16 * GROUP + 64, GROUP);
                        _tile_loadd(4, a + c * 64, kp);
                        _tile_dpbssd(0, 4, 6);
                        _tile_dpbssd(1, 4, 7);
                    }
                }
                _tile_stored(0, sums, TILE * 4);
                _tile_stored(1, sums + 16, TILE * 4);
                const Py_ssize_t left = job->m - r0;
                if (left > 0) finish_amx(job, sums, t, r0, left < 32 ? (int)left : 32);
            }
        }
    }
    _tile_release();
}

/* Ask Linux for the tile state (a process-wide grant, inherited by threads and forks). */
static int amx_granted(void) {
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8")) return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}
#endif
#endif

static void run_tiles(const job_t *job, Py_ssize_t first, Py_ssize_t last) {
#ifdef WMARK_AMX
    if (job->backend == AMX_TILES) {
        range_amx(job, first, last);
        return;
    }
#endif
    for (Py_ssize_t t = first; t < last; t++) {
        if (job->nibbles) {
#ifdef WMARK_X86
            if (job->backend == AVX512VNNI) {
                tile_vnni4(job, t);
                continue;
            }
#endif
            tile_portable4(job, t);
            continue;
        }
#ifdef WMARK_X86
        if (job->backend == AVX512VNNI) {
            tile_vnni(job, t);
            continue;
        }
        if (job->backend == AVX2) {
            tile_avx2(job, t);
            continue;
        }
#endif
        tile_portable(job, t);
    }
}

/*
 * ---- a small pool of worker threads ----
 * A call cuts its tiles into contiguous chunks that the threads claim in turn (the caller takes
 * part), largest first: an eighth of a thread's share while much is left, then half of what is
 * left per thread, down to one tile. Which thread computes a tile does not change its sums.
 * The caller waits only for chunks that a worker has claimed and not finished, never for a
 * worker to show up: a worker that wakes late or shares its core with another process simply
 * claims fewer chunks (none if the call is over when it runs). So that a late worker can never
 * mix two calls, a claim is one compare-and-swap of a word holding the call's number (epoch),
 * its thread count and chunk count and the next chunk: a worker reads a call's parameters only
 * after a claim in that call has succeeded, and the caller publishes the next call only after
 * every claimed chunk is done.
 * Waiting for the next call: "active" workers spin briefly (a forward makes ~100 calls back to
 * back), then sleep on a condition variable; "passive" ones sleep at once, for workers on cores
 * that another process uses, where spinning would spend the worker's share of the core idle.
 */
#define MAX_THREADS 64
#define MAX_CHUNKS 512
#define PARALLEL_ROWS_ELEMENTS 16384 /* a call's rows phase runs on the pool from this many elements */
#define SPIN_ROUNDS 20000

/* The claim word: epoch (32 bits) | threads (8) | chunks (12) | next chunk (12). */
#define CLAIM_NEXT(w) ((int)((w)&0xFFF))
#define CLAIM_CHUNKS(w) ((int)(((w) >> 12) & 0xFFF))
#define CLAIM_THREADS(w) ((int)(((w) >> 24) & 0xFF))
#define CLAIM_EPOCH(w) ((uint32_t)((w) >> 32))

static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER; /* one call at a time uses the pool */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER; /* guards the workers' sleep */
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static int pool_started = 0;               /* worker threads started (they never exit) */
static pthread_t pool_threads[MAX_THREADS]; /* ... their handles (worker i + 1 at [i]) */
#ifdef __linux__
static cpu_set_t pool_cpus; /* the CPUs workers may run on, where pool_pinned */
static int pool_pinned = 0;
#endif
static atomic_int pool_spin = SPIN_ROUNDS; /* rounds a worker spins before sleeping (0: passive) */
static _Atomic uint64_t pool_claim;        /* the claim word of the current call */
static atomic_int pool_done;               /* chunks of the current call finished */
static const job_t *pool_job;              /* the current call's parameters ... */
static Py_ssize_t pool_bounds[MAX_CHUNKS + 1]; /* ... chunk i is tiles bounds[i] .. bounds[i + 1] */

/* Units first .. last of a job: tiles, a rows phase's rows, or another kernel's units. */
static void run_units(const job_t *job, Py_ssize_t first, Py_ssize_t last) {
    if (job->each != NULL)
        job->each(job->ctx, first, last);
    else if (job->rows != NULL)
        run_rows(job->rows, first, last);
    else
        run_tiles(job, first, last);
}

/* Cut `tiles` into chunks for `threads` threads (see above); returns the count. */
static int cut_chunks(Py_ssize_t tiles, int threads, Py_ssize_t *bounds) {
    const Py_ssize_t cap = (tiles + 8 * threads - 1) / (8 * threads);
    int chunks = 0;
    Py_ssize_t done = 0;
    bounds[0] = 0;
    while (done < tiles) {
        Py_ssize_t size = (tiles - done + 2 * threads - 1) / (2 * threads);
        if (size > cap) size = cap;
        if (chunks == MAX_CHUNKS - 1) size = tiles - done;
        done += size;
        bounds[++chunks] = done;
    }
    return chunks;
}

/* Claim and run chunks of the call in `word` (thread `id`; the caller is 0) until none is left;
 * returns the word last seen, whose epoch is a call this thread has finished with. */
static uint64_t take_chunks(uint64_t word, int id) {
    for (;;) {
        if (id >= CLAIM_THREADS(word) || CLAIM_NEXT(word) >= CLAIM_CHUNKS(word)) return word;
        if (!atomic_compare_exchange_weak_explicit(&pool_claim, &word, word + 1, memory_order_acquire,
                                                   memory_order_acquire))
            continue; /* word now holds what is there: another claim, or the next call */
        const int i = CLAIM_NEXT(word);
        run_units(pool_job, pool_bounds[i], pool_bounds[i + 1]);
        atomic_fetch_add_explicit(&pool_done, 1, memory_order_release);
        word = atomic_load_explicit(&pool_claim, memory_order_acquire);
    }
}

static void *worker(void *arg) {
    const int id = (int)(intptr_t)arg;
    uint32_t seen = CLAIM_EPOCH(take_chunks(atomic_load_explicit(&pool_claim, memory_order_acquire), id));
    for (;;) {
        const int rounds = atomic_load_explicit(&pool_spin, memory_order_relaxed);
        uint64_t word = atomic_load_explicit(&pool_claim, memory_order_acquire);
        for (int spins = 0; CLAIM_EPOCH(word) == seen && spins < rounds; spins++) {
#ifdef WMARK_X86
            _mm_pause();
#endif
            word = atomic_load_explicit(&pool_claim, memory_order_acquire);
        }
        if (CLAIM_EPOCH(word) == seen) {
            pthread_mutex_lock(&pool_lock);
            while (CLAIM_EPOCH(word = atomic_load_explicit(&pool_claim, memory_order_acquire)) == seen)
                pthread_cond_wait(&pool_wake, &pool_lock);
            pthread_mutex_unlock(&pool_lock);
        }
        seen = CLAIM_EPOCH(take_chunks(word, id));
    }
    return NULL;
}

/* A forked child has only the thread that forked: it starts its own workers when it needs them,
 * and a call that another thread of the parent was running is closed to claims. */
static void pool_after_fork(void) {
    pool_started = 0;
    const uint64_t word = atomic_load_explicit(&pool_claim, memory_order_relaxed);
    atomic_store_explicit(&pool_claim, (word & ~(uint64_t)0xFFF) | (uint64_t)CLAIM_CHUNKS(word),
                          memory_order_relaxed);
    pthread_mutex_init(&call_lock, NULL);
    pthread_mutex_init(&pool_lock, NULL);
    pthread_cond_init(&pool_wake, NULL);
}

/* Run `job` on `threads` threads, the caller's included (fewer where no more could start):
 * its tiles, or for a rows phase (or another kernel's job) its m units, in chunks. Called with
 * call_lock held. */
static void run_job(const job_t *job, int threads) {
    const Py_ssize_t tiles = job->rows != NULL || job->each != NULL ? job->m : tiles_of(job->n);
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > tiles) threads = (int)tiles;
    while (pool_started < threads - 1) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
#ifdef __linux__
        if (pool_pinned) pthread_attr_setaffinity_np(&attr, sizeof(pool_cpus), &pool_cpus);
#endif
        const int failed = pthread_create(&thread, &attr, worker, (void *)(intptr_t)(pool_started + 1));
        pthread_attr_destroy(&attr);
        if (failed) break;
        pool_threads[pool_started++] = thread;
    }
    if (threads > pool_started + 1) threads = pool_started + 1;
    if (threads <= 1) {
        run_units(job, 0, tiles);
        return;
    }
    pool_job = job;
    const int chunks = cut_chunks(tiles, threads, pool_bounds);
    atomic_store_explicit(&pool_done, 0, memory_order_relaxed);
    const uint64_t epoch = CLAIM_EPOCH(atomic_load_explicit(&pool_claim, memory_order_relaxed)) + 1u;
    const uint64_t word = epoch << 32 | (uint64_t)threads << 24 | (uint64_t)chunks << 12;
    pthread_mutex_lock(&pool_lock);
    atomic_store_explicit(&pool_claim, word, memory_order_release);
    pthread_cond_broadcast(&pool_wake);
    pthread_mutex_unlock(&pool_lock);
    take_chunks(word, 0);
    int spins = 0;
    while (atomic_load_explicit(&pool_done, memory_order_acquire) < chunks) {
        if (++spins > SPIN_ROUNDS) sched_yield();
#ifdef WMARK_X86
        else _mm_pause();
#endif
    }
}

/* wmark_pool_api.parallel_for (see _pool_api.h). */
static void parallel_for(wmark_units_fn fn, void *ctx, Py_ssize_t units, int threads) {
    if (units <= 0) return;
    const job_t job = {.m = units, .each = fn, .ctx = ctx};
    pthread_mutex_lock(&call_lock);
    run_job(&job, threads < 1 ? 1 : threads);
    pthread_mutex_unlock(&call_lock);
}
static const wmark_pool_api pool_api = {parallel_for};

/*
 * ---- quantisation: q = round(x * (127 / peak)), as `torch.round(x * (127.0 / peak))` ----
 * Rounding is to nearest, ties to even, in every build (nearbyintf, vroundps, vrndscaleps), and
 * the peak is a maximum (order-free), so every build quantises a row to the same bytes. The
 * vector builds matter: nearbyintf is a libm call per element on baseline x86-64, ~2 ms per
 * row of a 1.5B model's forward.
 */
static float row_peak(const float *row, Py_ssize_t k) {
    float peak = 0.0f;
    for (Py_ssize_t i = 0; i < k; i++) {
        const float a = fabsf(row[i]);
        peak = a > peak ? a : peak;
    }
    return peak;
}

static void round_row(const float *row, Py_ssize_t k, float inv, int8_t *q) {
    for (Py_ssize_t i = 0; i < k; i++) q[i] = (int8_t)nearbyintf(row[i] * inv);
}

#ifdef WMARK_X86
__attribute__((target("avx2"))) static float row_peak_avx2(const float *row, Py_ssize_t k) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 top = _mm256_setzero_ps();
    Py_ssize_t i = 0;
    for (; i + 8 <= k; i += 8) top = _mm256_max_ps(top, _mm256_and_ps(_mm256_loadu_ps(row + i), magnitude));
    float lanes[8];
    _mm256_storeu_ps(lanes, top);
    float peak = row_peak(row + i, k - i);
    for (int j = 0; j < 8; j++) peak = lanes[j] > peak ? lanes[j] : peak;
    return peak;
}

__attribute__((target("avx2"))) static void round_row_avx2(const float *row, Py_ssize_t k, float inv, int8_t *q) {
    const __m256 scale = _mm256_set1_ps(inv);
    Py_ssize_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(row + i), scale),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i i32 = _mm256_cvtps_epi32(r);
        const __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
        _mm_storel_epi64((__m128i *)(q + i), _mm_packs_epi16(i16, i16));
    }
    round_row(row + i, k - i, inv, q + i);
}

__attribute__((target(VNNI_TARGET))) static void round_row_avx512(const float *row, Py_ssize_t k, float inv,
                                                                  int8_t *q) {
    const __m512 scale = _mm512_set1_ps(inv);
    Py_ssize_t i = 0;
    for (; i + 16 <= k; i += 16) {
        const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(row + i), scale),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
    }
    round_row(row + i, k - i, inv, q + i);
}
#endif

static void quantise_rows(const float *x, Py_ssize_t m, Py_ssize_t k, Py_ssize_t kp, int backend, int8_t *q,
                          uint8_t *aux, float *rowscale) {
    for (Py_ssize_t r = 0; r < m; r++) {
        const float *row = x + r * k;
        int8_t *qr = q + r * kp;
        float peak;
#ifdef WMARK_X86
        peak = backend == PORTABLE ? row_peak(row, k) : row_peak_avx2(row, k);
#else
        peak = row_peak(row, k);
#endif
        if (!(peak >= 1e-30f)) peak = 1e-30f; /* clamp_min(1e-30) */
        const float inv = (1.0f / peak) * 127.0f; /* torch's `127.0 / peak`: reciprocal, then times */
#ifdef WMARK_X86
        if (backend == AVX512VNNI)
            round_row_avx512(row, k, inv, qr);
        else if (backend == AVX2)
            round_row_avx2(row, k, inv, qr);
        else
            round_row(row, k, inv, qr);
#else
        round_row(row, k, inv, qr);
#endif
        memset(qr + k, 0, (size_t)(kp - k));
        rowscale[r] = peak / 127.0f;
        if (aux != NULL) {
            uint8_t *ar = aux + r * kp;
            if (backend == AVX512VNNI)
                for (Py_ssize_t i = 0; i < kp; i++) ar[i] = (uint8_t)(qr[i] + 128);
            else
                for (Py_ssize_t i = 0; i < kp; i++) ar[i] = (uint8_t)(qr[i] < 0 ? -qr[i] : qr[i]);
        }
    }
}

/*
 * ---- prologues: rows the GEMM makes from its input before quantising them ----
 * A decoder layer feeds its projections RMSNorm(x) * w and silu(gate) * up: computing those
 * rows here, inside the call, saves the torch ops (and their dispatch, which costs a small draft
 * model almost as much as its weights). Row-local and in a fixed order, so deterministic; their
 * bits are not torch's (only draft models use them: wmark.generator.draft_forward).
 */
enum prologue { PLAIN = 0, RMS_NORM = 1, SWIGLU = 2 };

/* RMSNorm of each row of x (m, k) times weight (k): x / sqrt(mean(x^2) + eps) * w. The sum of
 * squares runs over 8 lanes (lane l: columns l mod 8, in order), then the lanes in order. */
static void rms_norm_rows(const float *x, Py_ssize_t m, Py_ssize_t k, const float *weight, float eps, float *h) {
    for (Py_ssize_t r = 0; r < m; r++) {
        const float *row = x + r * k;
        float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        Py_ssize_t j = 0;
        for (; j + 8 <= k; j += 8)
            for (int l = 0; l < 8; l++) lanes[l] += row[j + l] * row[j + l];
        for (; j < k; j++) lanes[j % 8] += row[j] * row[j];
        float squares = 0.0f;
        for (int l = 0; l < 8; l++) squares += lanes[l];
        const float inv = 1.0f / sqrtf(squares / (float)k + eps);
        for (j = 0; j < k; j++) h[r * k + j] = (row[j] * inv) * weight[j];
    }
}

/* silu(gate) * up of each row of x (m, 2k): gate is its first k columns, up the last k;
 * silu(g) = g * sigmoid(g), sigmoid from e^-|g| (never overflows). */
static void swiglu_rows(const float *x, Py_ssize_t m, Py_ssize_t k, float *h) {
    for (Py_ssize_t r = 0; r < m; r++) {
        const float *gate = x + r * 2 * k, *up = gate + k;
        for (Py_ssize_t j = 0; j < k; j++) {
            const float g = gate[j];
            const float e = exp_nonpositive(g < 0.0f ? g : -g);
            const float sigmoid = (g < 0.0f ? e : 1.0f) / (1.0f + e);
            h[r * k + j] = (g * sigmoid) * up[j];
        }
    }
}

#ifdef WMARK_X86
/* The same two prologues on 8 lanes at a time (AVX2, no FMA): each lane performs exactly the
 * portable code's float operations in its order, so every build writes the same bits. */
__attribute__((target("avx2"))) static void rms_norm_rows_avx2(const float *x, Py_ssize_t m, Py_ssize_t k,
                                                               const float *weight, float eps, float *h) {
    for (Py_ssize_t r = 0; r < m; r++) {
        const float *row = x + r * k;
        __m256 acc = _mm256_setzero_ps();
        Py_ssize_t j = 0;
        for (; j + 8 <= k; j += 8) {
            const __m256 v = _mm256_loadu_ps(row + j);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, acc);
        for (; j < k; j++) lanes[j % 8] += row[j] * row[j];
        float squares = 0.0f;
        for (int l = 0; l < 8; l++) squares += lanes[l];
        const float inv = 1.0f / sqrtf(squares / (float)k + eps);
        const __m256 scale = _mm256_set1_ps(inv);
        for (j = 0; j + 8 <= k; j += 8)
            _mm256_storeu_ps(h + r * k + j,
                             _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(row + j), scale), _mm256_loadu_ps(weight + j)));
        for (; j < k; j++) h[r * k + j] = (row[j] * inv) * weight[j];
    }
}

/* exp_nonpositive (_fastmath.h) on 8 lanes: the same operations, in the same order. */
__attribute__((target("avx2"))) static inline __m256 exp8_nonpositive(__m256 x) {
    const __m256 rounder = _mm256_set1_ps(12582912.0f), floor87 = _mm256_set1_ps(-87.0f);
    const __m256 low = _mm256_max_ps(x, floor87);
    const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(low, _mm256_set1_ps(1.44269504088896341f)), rounder),
                                   rounder);
    __m256 r = _mm256_sub_ps(low, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, floor87, _CMP_LT_OQ), e); /* 0 below -87 */
}

__attribute__((target("avx2"))) static void swiglu_rows_avx2(const float *x, Py_ssize_t m, Py_ssize_t k, float *h) {
    const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    for (Py_ssize_t r = 0; r < m; r++) {
        const float *gate = x + r * 2 * k, *up = gate + k;
        Py_ssize_t j = 0;
        for (; j + 8 <= k; j += 8) {
            const __m256 g = _mm256_loadu_ps(gate + j);
            const __m256 negative = _mm256_cmp_ps(g, zero, _CMP_LT_OQ);
            /* g < 0 ? g : -g, as a select (-g flips the sign bit, as the scalar negation does) */
            const __m256 e = exp8_nonpositive(_mm256_blendv_ps(_mm256_xor_ps(g, sign), g, negative));
            const __m256 sigmoid = _mm256_div_ps(_mm256_blendv_ps(one, e, negative), _mm256_add_ps(one, e));
            _mm256_storeu_ps(h + r * k + j, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), _mm256_loadu_ps(up + j)));
        }
        for (; j < k; j++) {
            const float g = gate[j];
            const float e = exp_nonpositive(g < 0.0f ? g : -g);
            h[r * k + j] = (g * ((g < 0.0f ? e : 1.0f) / (1.0f + e))) * up[j];
        }
    }
}
#endif

/* Rows first .. last of a call's rows phase: the prologue into h, then quantisation. Rows are
 * independent, so any split over threads gives the same bytes. */
static void run_rows(const rows_job_t *rows, Py_ssize_t first, Py_ssize_t last) {
    const Py_ssize_t count = last - first, k = rows->k;
    const float *src = rows->x + first * k;
#ifdef WMARK_X86
    const int vector = rows->rounding != PORTABLE;
#else
    const int vector = 0;
#endif
    if (rows->prologue == RMS_NORM) {
        float *h = rows->h + first * k;
#ifdef WMARK_X86
        if (vector)
            rms_norm_rows_avx2(src, count, k, rows->norm, rows->eps, h);
        else
#endif
            rms_norm_rows(src, count, k, rows->norm, rows->eps, h);
        src = h;
    } else if (rows->prologue == SWIGLU) {
        float *h = rows->h + first * k;
        src = rows->x + first * 2 * k;
#ifdef WMARK_X86
        if (vector)
            swiglu_rows_avx2(src, count, k, h);
        else
#endif
            swiglu_rows(src, count, k, h);
        src = h;
    }
    quantise_rows(src, count, k, rows->kp, rows->rounding, rows->q + first * rows->kp,
                  rows->aux != NULL ? rows->aux + first * rows->kp : NULL, rows->rowscale + first);
}

/* ---- Python interface ---- */
static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *name, Py_ssize_t need) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Format(PyExc_TypeError, "%s: a C-contiguous%s buffer is required", name, writable ? " writable" : "");
        return -1;
    }
    if (need >= 0 && view->len != need) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, the shape needs %zd", name, view->len, need);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The (n, k) int8 weights `src` in the packed layout `dst` (zeroed beforehand), and each
 * channel's weight sum in `sums`. Writes run tile by tile in order, reading 32 rows side by side,
 * a cache line of each at a time. */
static void pack_rows(const int8_t *src, uint8_t *dst, int32_t *sums, Py_ssize_t n, Py_ssize_t k) {
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

/* Round to nearest, ties to even (as torch.round), for |x| < 2^22: adding and subtracting
 * 1.5 x 2^23 leaves no fraction bits (IEEE arithmetic: without -ffast-math the compiler keeps
 * both operations); no libm call, so the loop vectorises. */
static inline float round_even(float x) { return (x + 12582912.0f) - 12582912.0f; }

/* The packed 8-bit weights `p8` of an (n, k) layer re-quantised to 4 bits per output channel:
 * each channel's weights divided by step = max(peak, 1) / 7 (peak: its largest |weight|),
 * rounded, clamped to [-8, 7]; written in the 4-bit layout (see linear4) with each channel's
 * step and its sum of 4-bit values. One pass over the tile for the peaks, one to pack. */
static void pack4_tiles(const uint8_t *p8, uint8_t *p4, int32_t *colsum, float *step, Py_ssize_t n, Py_ssize_t k) {
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

PyDoc_STRVAR(pack4_doc,
             "pack4(packed, packed4, colsum4, step, n, k)\n\n"
             "Re-quantise the packed 8-bit weights of an (n, k) layer to 4 bits per output channel\n"
             "(weight / step, rounded half to even, clamped to [-8, 7]; step = max(peak, 1) / 7): write them\n"
             "into packed4 (uint8, packed_size(n, k) / 2 bytes), their sums into colsum4 (int32, 32 x\n"
             "ceil(n / 32)) and each channel's step into step (float32, 32 x ceil(n / 32)).");

static PyObject *pack4(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[4];
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "OOOOnn", &objs[0], &objs[1], &objs[2], &objs[3], &n, &k)) return NULL;
    if (n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "pack4: n and k must be positive");
        return NULL;
    }
    const Py_ssize_t need[4] = {tiles_of(n) * groups_of(k) * GROUP, tiles_of(n) * groups_of(k) * GROUP4,
                                tiles_of(n) * TILE * 4, tiles_of(n) * TILE * 4};
    static const char *names[4] = {"packed", "packed4", "colsum4", "step"};
    Py_buffer views[4];
    int got = 0;
    for (; got < 4; got++)
        if (get_buffer(objs[got], &views[got], got > 0, names[got], need[got]) < 0) break;
    if (got == 4) {
        Py_BEGIN_ALLOW_THREADS pack4_tiles(views[0].buf, views[1].buf, views[2].buf, views[3].buf, n, k);
        Py_END_ALLOW_THREADS
    }
    for (int i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    if (got < 4) return NULL;
    Py_RETURN_NONE;
}

static PyObject *packed_size(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "nn", &n, &k)) return NULL;
    if (n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "packed_size: n and k must be positive");
        return NULL;
    }
    return PyLong_FromSsize_t(tiles_of(n) * groups_of(k) * GROUP);
}

PyDoc_STRVAR(pack_doc,
             "pack(weight, packed, colsum, n, k)\n\n"
             "Write weight (int8, (n, k)) into packed (uint8, packed_size(n, k) bytes, zeroed beforehand)\n"
             "and each channel's weight sum into colsum (int32, 32 x ceil(n / 32), zeroed beforehand).");

static PyObject *pack(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[3];
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "OOOnn", &objs[0], &objs[1], &objs[2], &n, &k)) return NULL;
    if (n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "pack: n and k must be positive");
        return NULL;
    }
    Py_buffer w, p, s;
    if (get_buffer(objs[0], &w, 0, "weight", n * k) < 0) return NULL;
    if (get_buffer(objs[1], &p, 1, "packed", tiles_of(n) * groups_of(k) * GROUP) < 0) {
        PyBuffer_Release(&w);
        return NULL;
    }
    if (get_buffer(objs[2], &s, 1, "colsum", tiles_of(n) * TILE * 4) < 0) {
        PyBuffer_Release(&w);
        PyBuffer_Release(&p);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS pack_rows(w.buf, p.buf, s.buf, n, k);
    Py_END_ALLOW_THREADS PyBuffer_Release(&w);
    PyBuffer_Release(&p);
    PyBuffer_Release(&s);
    Py_RETURN_NONE;
}

static PyObject *unpack(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[2];
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "OOnn", &objs[0], &objs[1], &n, &k)) return NULL;
    if (n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "unpack: bad shape");
        return NULL;
    }
    Py_buffer p, w;
    if (get_buffer(objs[0], &p, 0, "packed", tiles_of(n) * groups_of(k) * GROUP) < 0) return NULL;
    if (get_buffer(objs[1], &w, 1, "weight", n * k) < 0) {
        PyBuffer_Release(&p);
        return NULL;
    }
    const uint8_t *src = p.buf;
    int8_t *dst = w.buf;
    const Py_ssize_t groups = groups_of(k);
    Py_BEGIN_ALLOW_THREADS for (Py_ssize_t c = 0; c < n; c++) {
        const uint8_t *tile = src + (c / TILE) * groups * GROUP + 4 * (c % TILE);
        for (Py_ssize_t col = 0; col < k; col++) dst[c * k + col] = (int8_t)tile[(col / 4) * GROUP + col % 4];
    }
    Py_END_ALLOW_THREADS PyBuffer_Release(&p);
    PyBuffer_Release(&w);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(linear_doc,
             "linear(x, packed, colsum, scale, bias, out, m, n, k, threads[, prologue, norm, eps])\n\n"
             "out = the exact int8 linear layer of x: float32 (m, k) rows, each quantised with its own\n"
             "peak; packed/colsum from pack(); scale: float32 (n); bias: float32 (n) or None; out: float32\n"
             "(m, n), written. Runs on `threads` threads (this module's own), releasing the GIL.\n"
             "prologue 1: the rows multiplied are RMSNorm(x) * norm (float32 (k)) with epsilon eps;\n"
             "prologue 2: x is (m, 2k), gate then up, and the rows are silu(gate) * up.");

static PyObject *linear_call(PyObject *args, int nibbles) {
    PyObject *objs[6];
    Py_ssize_t m, n, k;
    int threads, prologue = PLAIN;
    PyObject *norm = Py_None;
    float eps = 0.0f;
    if (!PyArg_ParseTuple(args, "OOOOOOnnni|iOf", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &m,
                          &n, &k, &threads, &prologue, &norm, &eps))
        return NULL;
    if (m < 0 || n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "linear: bad shape");
        return NULL;
    }
    if (prologue != PLAIN && prologue != RMS_NORM && prologue != SWIGLU) {
        PyErr_Format(PyExc_ValueError, "linear: unknown prologue %d", prologue);
        return NULL;
    }
    if ((prologue == RMS_NORM) != (norm != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "linear: a norm weight goes with prologue 1 only");
        return NULL;
    }
    Py_buffer norm_view = {.obj = NULL};
    if (prologue == RMS_NORM && get_buffer(norm, &norm_view, 0, "norm", k * 4) < 0) return NULL;
    const int has_bias = objs[4] != Py_None;
    const Py_ssize_t groups = groups_of(k), kp = groups * 4;
    const Py_ssize_t need[6] = {m * k * (prologue == SWIGLU ? 8 : 4), tiles_of(n) * groups * (nibbles ? GROUP4 : GROUP), tiles_of(n) * TILE * 4,
                                n * 4, n * 4, m * n * 4};
    static const char *names[6] = {"x", "packed", "colsum", "scale", "bias", "out"};
    Py_buffer views[6];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 6; got++) {
        if (got == 4 && !has_bias) {
            views[got].obj = NULL;
            continue;
        }
        if (get_buffer(objs[got], &views[got], got == 5, names[got], need[got]) < 0) goto done;
    }
    if (m == 0) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    {
        /* the "amx" build runs blocks of AMX_MIN_ROWS rows or more, over whole 64-column chunks
         * (4-bit weights: up to AMX_WIDE_BYTES widened), on the tile unit, and everything else as
         * avx512vnni */
        const int tiles = active_backend == AMX && m >= AMX_MIN_ROWS && groups % 16 == 0 &&
                          (!nibbles || groups * GROUP <= AMX_WIDE_BYTES);
        int backend = tiles ? AMX_TILES : active_backend == AMX ? AVX512VNNI : active_backend;
        if (nibbles && backend == AVX2) backend = PORTABLE; /* 4-bit weights: VNNI or portable */
        const int rounding = tiles ? AVX512VNNI : backend;
        const Py_ssize_t rows = tiles ? (m + 15) / 16 * 16 : m; /* whole tiles of rows, zeros past m */
        int8_t *q = tiles ? calloc((size_t)rows, (size_t)kp) : malloc((size_t)(m * kp));
        uint8_t *aux = backend == PORTABLE || tiles ? NULL : malloc((size_t)(m * kp));
        float *rowscale = malloc((size_t)m * sizeof(float));
        float *h = prologue == PLAIN ? NULL : malloc((size_t)(m * k) * sizeof(float));
        if (q == NULL || rowscale == NULL || (backend != PORTABLE && !tiles && aux == NULL) ||
            (prologue != PLAIN && h == NULL)) {
            free(q);
            free(aux);
            free(rowscale);
            free(h);
            PyErr_NoMemory();
            goto done;
        }
        const rows_job_t rows_job = {views[0].buf, norm_view.buf, eps, h, prologue, rounding, k, kp, q, aux, rowscale};
        job_t job = {views[1].buf, views[2].buf, views[3].buf, has_bias ? views[4].buf : NULL, q, aux, rowscale,
                     views[5].buf, m, n, groups, backend, nibbles, NULL, NULL, NULL};
        job_t rows_phase = job;
        rows_phase.rows = &rows_job;
        if (threads < 1) threads = 1;
        int failed = 0; /* a thread could not widen 4-bit tiles (read under the call lock: this call's) */
        Py_BEGIN_ALLOW_THREADS;
        pthread_mutex_lock(&call_lock);
        /* quantising (and a prologue) is ~1 ns an element: worth the pool from a few thousand */
        run_job(&rows_phase, m * k >= PARALLEL_ROWS_ELEMENTS ? threads : 1);
        run_job(&job, threads);
        failed = tiles && nibbles && atomic_exchange(&wide_failed, 0);
        pthread_mutex_unlock(&call_lock);
        Py_END_ALLOW_THREADS;
        free(q);
        free(aux);
        free(rowscale);
        free(h);
        if (failed) {
            PyErr_NoMemory();
            goto done;
        }
        result = Py_None;
        Py_INCREF(result);
    }
done:
    for (int i = 0; i < got; i++)
        if (views[i].obj != NULL) PyBuffer_Release(&views[i]);
    if (norm_view.obj != NULL) PyBuffer_Release(&norm_view);
    return result;
}

static PyObject *linear(PyObject *self, PyObject *args) {
    (void)self;
    return linear_call(args, 0);
}

PyDoc_STRVAR(linear4_doc,
             "linear4(x, packed, colsum, scale, bias, out, m, n, k, threads)\n\n"
             "linear() over 4-bit weights (values -8..7, a scale per channel): packed holds\n"
             "packed_size(n, k) / 2 bytes, byte j of a 64-byte group the 8-bit layout's bytes j (low\n"
             "nibble) and 64 + j (high), each plus 8; colsum the channels' sums of the 4-bit values. Exact\n"
             "integer sums as linear(); VNNI CPUs run it vectorised, others portable C (slow).");

static PyObject *linear4(PyObject *self, PyObject *args) {
    (void)self;
    return linear_call(args, 1);
}

static PyObject *backend(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyUnicode_FromString(backend_names[active_backend]);
}

static PyObject *backends(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *names = PyList_New(0);
    for (int b = best_backend; names != NULL && b >= 0; b--) {
        PyObject *name = PyUnicode_FromString(backend_names[b]);
        if (name == NULL || PyList_Append(names, name) < 0) Py_CLEAR(names);
        Py_XDECREF(name);
    }
    return names;
}

static PyObject *use_backend(PyObject *self, PyObject *args) {
    (void)self;
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    for (int b = 0; b <= best_backend; b++)
        if (strcmp(name, backend_names[b]) == 0) {
            active_backend = b;
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "use_backend: %s does not run on this CPU", name);
    return NULL;
}

static PyObject *prefetch(PyObject *self, PyObject *args) {
    (void)self;
    const char *name = NULL;
    if (!PyArg_ParseTuple(args, "|s", &name)) return NULL;
    if (name != NULL) {
        if (strcmp(name, "far") != 0 && strcmp(name, "near") != 0) {
            PyErr_Format(PyExc_ValueError, "prefetch: %s is not 'near' or 'far'", name);
            return NULL;
        }
        far_prefetch = strcmp(name, "far") == 0;
    }
    return PyUnicode_FromString(far_prefetch ? "far" : "near");
}

static PyObject *wait_policy(PyObject *self, PyObject *args) {
    (void)self;
    const char *name = NULL;
    if (!PyArg_ParseTuple(args, "|s", &name)) return NULL;
    if (name != NULL) {
        if (strcmp(name, "active") != 0 && strcmp(name, "passive") != 0) {
            PyErr_Format(PyExc_ValueError, "wait_policy: %s is not 'active' or 'passive'", name);
            return NULL;
        }
        atomic_store_explicit(&pool_spin, strcmp(name, "active") == 0 ? SPIN_ROUNDS : 0, memory_order_relaxed);
    }
    return PyUnicode_FromString(atomic_load_explicit(&pool_spin, memory_order_relaxed) ? "active" : "passive");
}

/* worker_cpus(cpus): see the method table. Takes call_lock (a call on another thread released the GIL
 * and holds it until done), so no worker is started or moved while a call runs. */
static PyObject *worker_cpus(PyObject *self, PyObject *arg) {
    (void)self;
#ifdef __linux__
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    int pinned = arg != Py_None;
    if (pinned) {
        PyObject *seq = PySequence_Fast(arg, "worker_cpus: expected a sequence of CPU numbers or None");
        if (seq == NULL) return NULL;
        const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
        for (Py_ssize_t i = 0; i < count; i++) {
            const long cpu = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
            if (cpu == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return NULL;
            }
            if (cpu < 0 || cpu >= CPU_SETSIZE) {
                Py_DECREF(seq);
                return PyErr_Format(PyExc_ValueError, "worker_cpus: CPU %ld is out of range", cpu);
            }
            CPU_SET((int)cpu, &cpus);
        }
        Py_DECREF(seq);
        if (count == 0) return PyErr_Format(PyExc_ValueError, "worker_cpus: no CPU given (None: any CPU)");
    } else if (sched_getaffinity(0, sizeof(cpus), &cpus) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS;
    pthread_mutex_lock(&call_lock);
    for (int i = 0; i < pool_started; i++)
        failed |= pthread_setaffinity_np(pool_threads[i], sizeof(cpus), &cpus) != 0;
    pool_cpus = cpus;
    pool_pinned = pinned;
    pthread_mutex_unlock(&call_lock);
    Py_END_ALLOW_THREADS;
    if (failed) return PyErr_Format(PyExc_OSError, "worker_cpus: a worker could not be moved to those CPUs");
#else
    (void)arg;
#endif
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"packed_size", packed_size, METH_VARARGS, "packed_size(n, k): bytes of the packed weights of n x k."},
    {"pack", pack, METH_VARARGS, pack_doc},
    {"unpack", unpack, METH_VARARGS, "unpack(packed, weight, n, k): the int8 (n, k) weights back."},
    {"linear", linear, METH_VARARGS, linear_doc},
    {"linear4", linear4, METH_VARARGS, linear4_doc},
    {"pack4", pack4, METH_VARARGS, pack4_doc},
    {"backend", backend, METH_NOARGS, "The build that runs now: 'amx', 'avx512vnni', 'avx2' or 'portable'."},
    {"backends", backends, METH_NOARGS, "The builds this CPU can run, fastest first."},
    {"use_backend", use_backend, METH_VARARGS, "use_backend(name): run that build (tests compare them)."},
    {"prefetch", prefetch, METH_VARARGS,
     "prefetch([policy]): the weight prefetch, 'near' (L1, AMD's default) or 'far' (L2, Intel's);\n"
     "sets it when given (benchmarks compare them; the bits do not change)."},
    {"wait_policy", wait_policy, METH_VARARGS,
     "wait_policy([policy]): how idle workers wait for the next call, 'active' (spin briefly, then\n"
     "sleep) or 'passive' (sleep at once: for workers on cores that other processes use); sets it\n"
     "when given."},
    {"worker_cpus", worker_cpus, METH_O,
     "worker_cpus(cpus): run the pool's worker threads (not the calling thread) only on these CPU\n"
     "numbers, now and when started later; None: on any CPU the caller may use. Linux only (elsewhere\n"
     "it does nothing). Keeping the workers off the core the caller computes on stops a worker from\n"
     "taking that core from it when another process holds the other one."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "wmark.generator.cpu._int8_gemm",
                                    "Exact int8 GEMM (see wmark.generator.cpu.rowwise).", -1, methods, NULL, NULL,
                                    NULL, NULL};

PyMODINIT_FUNC PyInit__int8_gemm(void) {
#ifdef WMARK_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) best_backend = AVX2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
        best_backend = AVX512VNNI;
#ifdef WMARK_AMX
        if (amx_granted()) best_backend = AMX;
#endif
    }
#endif
    active_backend = best_backend;
#ifdef WMARK_X86
    far_prefetch = __builtin_cpu_is("intel");
#endif
    pthread_atfork(NULL, NULL, pool_after_fork);
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) return NULL;
    PyObject *capsule = PyCapsule_New((void *)&pool_api, WMARK_POOL_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObject(mod, "_pool_api", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
