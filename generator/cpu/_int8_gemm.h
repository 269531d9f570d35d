/*
 * wmark.generator.cpu._int8_gemm: the exact int8 GEMM of the batch-invariant CPU path.
 *
 * A linear layer y = x W^T + b with int8 weights (a scale per output channel, or per channel and
 * block of columns: "Block weight scales" below) and int8 activations (a scale per row): each
 * row of x is quantised with its own peak, the integer products are summed exactly in int32,
 * and the sum is scaled back. Integer sums do not depend on the order of the additions, and
 * every float step after them has one order in every build, so a row's output is the same bits
 * whichever kernel ran and however many rows rode along: what speculative verification needs (a
 * token's logits must not depend on the draft tree it was verified in).
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
 * Compile with -ffp-contract=off: the scaling is multiplications and additions in a fixed
 * order, never fused, so it rounds like the torch expression it replaced.
 *
 * The module is one extension built from several C files, one per job:
 * - _int8_gemm_module.c:   the Python interface (argument checks, the methods, module init);
 * - _int8_gemm_pool.c:     the worker threads a call's units run on (also lent to other kernels
 *                          through the capsule of _pool_api.h), their CPUs and wait policy;
 * - _int8_gemm_rows.c:     a call's rows phase: prologues and quantisation, every build;
 * - _int8_gemm_portable.c: the tiles phase's dispatch, and its portable C kernels (8 and 4 bits);
 * - _int8_gemm_avx2.c, _int8_gemm_vnni.c (8 and 4 bits), _int8_gemm_amx.c: the vector kernels;
 * - _int8_gemm_pack.c:     the packed weight layout: packing, unpacking, 4-bit re-quantisation.
 * This private header holds what they share. Every function shared across the files is hidden
 * (WMARK_HIDDEN): the .so exports only PyInit__int8_gemm. Each file includes this header first
 * (PY_SSIZE_T_CLEAN and _GNU_SOURCE must precede every system header).
 */
#ifndef WMARK_INT8_GEMM_H
#define WMARK_INT8_GEMM_H

#define PY_SSIZE_T_CLEAN
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* cpu_set_t, pthread_attr_setaffinity_np: the workers' CPUs */
#endif
#include <Python.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#ifdef __linux__
#include <sched.h>
#endif

#include "_pool_api.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define WMARK_X86 1
#if defined(__linux__)
#define WMARK_AMX 1 /* the kernel must grant the tile state to the process (arch_prctl) */
#endif
#endif

/* Internal linkage across this module's files: not exported from the .so. */
#define WMARK_HIDDEN __attribute__((visibility("hidden")))

#define TILE 32     /* output channels per packed tile */
#define GROUP 128   /* bytes of one tile's 4 input columns */
#define GROUP4 64   /* the same with 4-bit weights: byte j holds GROUP bytes j (low) and 64 + j (high) */
/* Software prefetch of the weights, in groups ahead (prefetches never fault). Measured per CPU,
 * one thread: on a 2-core AMD EPYC 96 groups (12 KB) into L1 was the best of 0-128; on a 2-core
 * Intel Xeon with AMX, where one core streams ~13 GB/s, 192 groups into L2 (more misses in
 * flight) took the target's 9-row forward from 196 to 184-190 ms and left one row as it was
 * (bench/int8_kernels.py --prefetch far,near). Intel CPUs take the far prefetch. On a 2-core
 * Zen 4 EPYC, two threads, the near prefetch won below ~8 quantised rows and the far one from
 * ~10 (the target's forward of 1 / 3 / 5 / 7 / 9 two-part tokens, near against far: 38-47 /
 * 48-51 / 57-60 / 76-80 / 86-89 ms against 52-53 / 55-56 / 55-56 / 68-72 / 79-80; the draft
 * model's from 7-9 one-part rows on, with 4-bit weights from 5-7: twice the products per byte
 * streamed), so AMD CPUs take PREFETCH_ROWS: far from FAR_FROM_ROWS quantised rows in a call
 * (half as many with 4-bit weights), near below. The policy changes speed only, never the bits. */
#define NEAR_AHEAD 96
#define FAR_AHEAD 192
#define FAR_FROM_ROWS 9
enum prefetch { PREFETCH_NEAR = 0, PREFETCH_FAR = 1, PREFETCH_ROWS = 2 };
WMARK_HIDDEN extern int wmark_prefetch; /* an enum prefetch: set at import and by `prefetch()` (_vnni.c) */

/* Quantised rows from which the "amx" build runs 8-bit weights on the tile unit: with two
 * activation parts a target's verify forward of 2-8 tokens is 4-16 rows, which VNNI computed at
 * ~1.5 ms a row over the target's GEMMs while tiles take them at the one-row cost (2-core AMX
 * Xeon, target after 300 tokens, medians of 3 x 30 forwards: 4 tokens 93.1 -> 81.5 ms, 6 tokens
 * 99.2 -> 82.3 ms with the threshold at 16 -> 4; 8 was in between, 2 slower for one token).
 * 4-bit weights widen each tile before the tile unit reads it, which pays only over many rows. */
#define AMX_MIN_ROWS 4
#define AMX_MIN_ROWS_WIDENED 16
#define AMX_PANEL_BYTES (768 * 1024) /* quantised rows kept in L2 while a thread's tiles stream by */
#define AMX_WIDE_BYTES (320 * 1024)  /* 4-bit tiles widened for the tile unit: up to 2,560 groups */
WMARK_HIDDEN extern atomic_int wmark_wide_failed; /* a thread could not get its widening buffer (_amx.c) */

/* The target attributes of the vector kernels (function-level: the rest builds for baseline x86-64). */
#define VNNI_TARGET "avx512f,avx512bw,avx512vl,avx512vnni"
#define AMX_TARGET "amx-tile,amx-int8,avx512f,avx512bw,avx512vl"

/* Outlier activations (`linear(..., activations=ACT_OUTLIERS)`): each row's OUTLIERS largest
 * channels by magnitude (ties: the lower channel) are taken out of its int8 part and multiplied
 * in float32 instead, by a pass over each tile's weights right after the tile's sums, while
 * they are in cache (wmark_side_tile; the avx2 and avx512vnni builds have vector copies). One
 * int8 part plus this costs about 0.6 of two parts' arithmetic at a verify's row count and keeps
 * the channels that crush a row's scale exact. */
#define OUTLIERS 16
enum activations { ACT_ONE = 0, ACT_TWO = 1, ACT_OUTLIERS = 2 };

/* Block weight scales (`linear(..., scale_cols)`): a scale per output channel and block of
 * scale_cols input columns (SCALE_COLS in the models), instead of one per channel. A block's
 * integer sum is exact as ever; the blocks meet in float32, in ascending order:
 *   f = (float)sum_0 * scale_0;  f = f + (float)sum_1 * scale_1;  ...;  out = f * rowscale (+ bias)
 * (one block: today's finish(), the same bits). An outlier call's float part adds each block's
 * channels the same way: out = out + side_b * scale_b over the blocks holding its channels. The
 * scales are float32, (tiles, blocks, TILE) (scales_at). The avx512vnni build cannot take
 * 128 x (weight sum) off each block's sums without a table of them as large as the scales, so
 * there the weights are the unsigned operand instead (w + 128, a flip of their top bit), the
 * rows' int8 values the signed one, and each block's sum less 128 x (the row's sum over the
 * block: job.qsum, from the rows phase). 8-bit weights only; never on the tile unit (the sums
 * would have to leave the tiles every two products). Why: the weights' own rounding is most of
 * what the int8 path loses against float32 once the activations are near-exact (BENCHMARKS.md,
 * "Quality"). */

/* AMX_TILES is not a build of its own: the job of an "amx" call that runs on the tile unit. */
enum backend { PORTABLE = 0, AVX2 = 1, AVX512VNNI = 2, AMX = 3, AMX_TILES = 4 };

static inline Py_ssize_t tiles_of(Py_ssize_t n) { return (n + TILE - 1) / TILE; }
static inline Py_ssize_t groups_of(Py_ssize_t k) { return (k + 3) / 4; }
/* Groups of 4 columns a scale covers, and the scale blocks of a k-wide layer (scale_cols 0: a
 * scale per channel, one block; else a positive multiple of 4, checked by the module). */
static inline Py_ssize_t span_of(Py_ssize_t k, Py_ssize_t scale_cols) {
    return scale_cols > 0 ? scale_cols / 4 : groups_of(k);
}
static inline Py_ssize_t blocks_of(Py_ssize_t k, Py_ssize_t scale_cols) {
    return (groups_of(k) + span_of(k, scale_cols) - 1) / span_of(k, scale_cols);
}

/* One call's work: the quantised rows and where the tiles' results go. */
typedef struct {
    const uint8_t *packed;  /* tiles x groups x GROUP bytes */
    const int32_t *colsum;  /* (tiles x TILE) weight sums per channel, 0 past n */
    const float *scale;     /* (n) channel scales, or (tiles, blocks, TILE) per block of `span` groups */
    const float *bias;      /* (n) or NULL */
    const int8_t *q;        /* (m, 4 groups) quantised rows, signed, zero-padded (AMX: to 16 rows) */
    const uint8_t *aux;     /* (m, 4 groups): q + 128 (avx512vnni) or |q| (avx2); else NULL */
    const float *rowscale;  /* (m) peak / 127 */
    const int32_t *qsum;    /* (m, blocks) each quantised row's sum over each block, or NULL */
    float *out;             /* (m, n), or (m / 2, n) where paired */
    Py_ssize_t m, n, groups;
    Py_ssize_t span, blocks; /* groups of 4 columns a scale covers (groups: one per channel), and
                              * the blocks of them, ceil(groups / span) */
    int backend;
    int nibbles; /* 4-bit weights (linear4): GROUP4 bytes a group */
    int paired;  /* a residual call: quantised rows 2r and 2r + 1 are one output row (see add_pair) */
    const int32_t *side_idx; /* (m, side) an outlier call's float channels per row, ascending; else NULL */
    const float *side_val;   /* (m, side) their values */
    int side;                /* channels per row (OUTLIERS, or k where k is smaller) */
    const struct rows_job *rows; /* non-NULL: the call's rows phase (its chunks are rows), not tiles */
    wmark_units_fn each;         /* non-NULL: another kernel's m units (`parallel_for`), not tiles */
    void *ctx;                   /* ... and its argument */
} job_t;

/* Prologues: rows the GEMM makes from its input before quantising them (see _int8_gemm_rows.c). */
enum prologue { PLAIN = 0, RMS_NORM = 1, SWIGLU = 2 };

/* A call's rows phase: each row of x through the prologue (if any), then quantised. With
 * `residual`, input row r becomes two quantised rows: 2r, the row itself, and 2r + 1, what its
 * quantisation left (the row minus q * peak / 127), quantised with its own peak; the GEMM runs
 * over both and its epilogue adds their outputs (add_pair). */
typedef struct rows_job {
    const float *x;     /* (m, k), or (m, 2k) for SWIGLU */
    const float *norm;  /* (k): RMS_NORM's weight */
    float eps;
    float *h;           /* (m, k) scratch for the prologue's rows, or NULL */
    int prologue, rounding;
    Py_ssize_t k, kp;
    int8_t *q;          /* (m, kp), or (2m, kp) with residual */
    uint8_t *aux;
    float *rowscale;    /* (m), or (2m) with residual */
    float *res;         /* (m, k) scratch: the residuals, or an outlier call's rows without their
                         * float channels; NULL: neither */
    int32_t *side_idx;  /* (m, side) an outlier call's channels, or NULL */
    float *side_val;    /* (m, side) their values */
    int side;
    int32_t *qsum;      /* (quantised rows, blocks) their sums over each block of `span` groups, or NULL */
    Py_ssize_t span, blocks;
} rows_job_t;

/* ---- the epilogue, portable: (float)sum * scale, summed over blocks, * rowscale (+ bias) ---- */
/* Block b's sum scaled and added to the blocks before it (`f`, unused for the first). */
static inline float scaled(float f, int32_t sum, float scale, Py_ssize_t b) {
    const float g = (float)sum * scale;
    return b == 0 ? g : f + g;
}

static inline float finish(float f, float rowscale, const float *bias, Py_ssize_t c) {
    f = f * rowscale;
    if (bias != NULL) f = f + bias[c];
    return f;
}

/* Tile t's scales of block b, from its first channel on. Blocks > 1 are stored tile by tile,
 * (tiles, blocks, TILE), so that a tile's scales stream in order beside its weights (laid out
 * (blocks, n) they cost a one-row forward ~10 %: a jump per block); one block is the plain (n). */
static inline const float *scales_at(const job_t *job, Py_ssize_t t, Py_ssize_t b) {
    return job->scale + (job->blocks == 1 ? t * TILE : (t * job->blocks + b) * TILE);
}

/* The end (exclusive) of scale block b's groups of 4 columns; it starts at b * span. */
static inline Py_ssize_t block_end(const job_t *job, Py_ssize_t b) {
    return (b + 1) * job->span < job->groups ? (b + 1) * job->span : job->groups;
}

/* The scale block an input column belongs to (an outlier channel's float part is scaled by it). */
static inline Py_ssize_t block_of(const job_t *job, Py_ssize_t col) { return col / 4 / job->span; }

/* A residual call's output row r is (quantised row 2r's output + row 2r + 1's) + bias, in that
 * order (every build's bits): each kernel's epilogue computes a pair's rows one after the other
 * (its row blocks start at even rows and hold whole pairs, as m is even), keeping the first,
 * and stores their sum, so the two parts' outputs are never written out. Portable form:
 * `hi` and `lo` are finish() without the bias. */
static inline float add_pair(float hi, float lo, const float *bias, Py_ssize_t c) {
    float f = hi + lo;
    if (bias != NULL) f = f + bias[c];
    return f;
}

#ifdef WMARK_X86
static inline int32_t load4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}
#endif

/* ---- _int8_gemm_pool.c ---- */
/* Run `job` on up to `threads` threads, the caller's included: its tiles, or for a rows phase
 * (or another kernel's job) its m units. Call it between wmark_pool_lock and wmark_pool_unlock. */
WMARK_HIDDEN void wmark_run_job(const job_t *job, int threads);
WMARK_HIDDEN void wmark_pool_lock(void);   /* one call at a time uses the pool */
WMARK_HIDDEN void wmark_pool_unlock(void);
WMARK_HIDDEN void wmark_pool_init(void);   /* at import: forked children restart their workers */
WMARK_HIDDEN void wmark_pool_set_active(int active); /* the wait policy: spin, then sleep (1), or sleep (0) */
WMARK_HIDDEN int wmark_pool_is_active(void);
#ifdef __linux__
/* Run the workers (now and when started later) on `cpus`, or on any CPU where !pinned; takes the
 * pool's lock. Returns nonzero where a running worker could not be moved. */
WMARK_HIDDEN int wmark_pool_move_workers(const cpu_set_t *cpus, int pinned);
#endif
WMARK_HIDDEN extern const wmark_pool_api wmark_gemm_pool_api; /* the capsule's contents */

/* ---- _int8_gemm_rows.c ---- */
WMARK_HIDDEN void wmark_run_rows(const rows_job_t *rows, Py_ssize_t first, Py_ssize_t last);

/* ---- _int8_gemm_portable.c: tiles first .. last of a job, on its build's kernel ---- */
WMARK_HIDDEN void wmark_run_tiles(const job_t *job, Py_ssize_t first, Py_ssize_t last);
/* An outlier call's float part for tile t, added to what the tile's kernel stored: per row and
 * channel c, side = ((0 + w[c, i0] * v0) + w[c, i1] * v1) + ... over the row's channels in
 * ascending order, then out = out + side * scale[c] (float32, no contraction, every build). */
WMARK_HIDDEN void wmark_side_tile(const job_t *job, Py_ssize_t t);

/* ---- the vector kernels: tile t of a job (AMX: tiles first .. last) ---- */
#ifdef WMARK_X86
__attribute__((target("avx2"))) WMARK_HIDDEN void wmark_tile_avx2(const job_t *job, Py_ssize_t t);
__attribute__((target("avx2"))) WMARK_HIDDEN void wmark_side_tile_avx2(const job_t *job, Py_ssize_t t);
__attribute__((target(VNNI_TARGET))) WMARK_HIDDEN void wmark_tile_vnni(const job_t *job, Py_ssize_t t);
__attribute__((target(VNNI_TARGET))) WMARK_HIDDEN void wmark_tile_vnni4(const job_t *job, Py_ssize_t t);
__attribute__((target(VNNI_TARGET))) WMARK_HIDDEN void wmark_side_tile_vnni(const job_t *job, Py_ssize_t t);
#ifdef WMARK_AMX
__attribute__((target(AMX_TARGET))) WMARK_HIDDEN void wmark_range_amx(const job_t *job, Py_ssize_t first,
                                                                      Py_ssize_t last);
WMARK_HIDDEN int wmark_amx_granted(void); /* asks Linux for the tile state; 1 if this process has it */
#endif
#endif

/* ---- _int8_gemm_pack.c: the packed layout ---- */
WMARK_HIDDEN void wmark_pack_rows(const int8_t *src, uint8_t *dst, int32_t *sums, Py_ssize_t n, Py_ssize_t k);
WMARK_HIDDEN void wmark_unpack_rows(const uint8_t *src, int8_t *dst, Py_ssize_t n, Py_ssize_t k);
WMARK_HIDDEN void wmark_pack4_tiles(const uint8_t *p8, uint8_t *p4, int32_t *colsum, float *step, Py_ssize_t n,
                                    Py_ssize_t k);

#endif
