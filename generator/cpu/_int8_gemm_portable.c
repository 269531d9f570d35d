/*
 * _int8_gemm's tiles phase (see _int8_gemm.h for the module): which kernel runs a job's tiles
 * (wmark_run_tiles, called by the pool for each chunk), and the portable C kernels, 8-bit and
 * 4-bit weights, that run where no vector build does (and that tests compare the others with).
 * Everything here builds for baseline x86-64 (no target attributes): the dispatch runs on every
 * CPU, and calls the vector kernels of _int8_gemm_{avx2,vnni,amx}.c only when the job's build
 * is one this CPU has.
 */
#include "_int8_gemm.h"

/* Quantised row r's scaled sums (its blocks' sums already scaled and added: scaled()) for tile t
 * into the output: its own row, or where the job is paired the first of a pair kept in `held`
 * and the second added to it (add_pair). */
static void store_row(const job_t *job, Py_ssize_t t, Py_ssize_t r, const float *f, float *held) {
    const Py_ssize_t c0 = t * TILE;
    const float rs = job->rowscale[r];
    for (int j = 0; j < TILE && c0 + j < job->n; j++) {
        const Py_ssize_t c = c0 + j;
        if (!job->paired)
            job->out[r * job->n + c] = finish(f[j], rs, job->bias, c);
        else if (r % 2 == 0)
            held[j] = finish(f[j], rs, NULL, c);
        else
            job->out[r / 2 * job->n + c] = add_pair(held[j], finish(f[j], rs, NULL, c), job->bias, c);
    }
}

/* Block b's integer sums of tile t into the scaled sums f (scaled()). */
static void scale_block(const job_t *job, Py_ssize_t t, Py_ssize_t b, const int32_t *sums, float *f) {
    const Py_ssize_t c0 = t * TILE;
    const float *scale = scales_at(job, t, b);
    for (int j = 0; j < TILE && c0 + j < job->n; j++) f[j] = scaled(f[j], sums[j], scale[j], b);
}

static void tile_portable(const job_t *job, Py_ssize_t t) {
    const uint8_t *w = job->packed + t * job->groups * GROUP;
    const Py_ssize_t kp = job->groups * 4;
    float held[TILE];
    for (Py_ssize_t r = 0; r < job->m; r++) {
        const int8_t *a = job->q + r * kp;
        float f[TILE] = {0};
        for (Py_ssize_t b = 0; b < job->blocks; b++) {
            int32_t sums[TILE] = {0};
            const Py_ssize_t last = block_end(job, b);
            for (Py_ssize_t g = b * job->span; g < last; g++) {
                const int8_t *wg = (const int8_t *)(w + g * GROUP);
                const int8_t *ag = a + 4 * g;
                for (int j = 0; j < TILE; j++)
                    sums[j] += ag[0] * wg[4 * j] + ag[1] * wg[4 * j + 1] + ag[2] * wg[4 * j + 2] + ag[3] * wg[4 * j + 3];
            }
            scale_block(job, t, b, sums, f);
        }
        store_row(job, t, r, f, held);
    }
}

/* A 4-bit weight: byte p (0-127) of a group in the 8-bit layout, stored as a nibble plus 8. */
static inline int nibble(const uint8_t *group, int p) {
    return (p < 64 ? group[p] & 15 : group[p - 64] >> 4) - 8;
}

static void tile_portable4(const job_t *job, Py_ssize_t t) {
    const uint8_t *w = job->packed + t * job->groups * GROUP4;
    const Py_ssize_t kp = job->groups * 4;
    float held[TILE];
    for (Py_ssize_t r = 0; r < job->m; r++) { /* one block: 4-bit weights have a scale per channel */
        const int8_t *a = job->q + r * kp;
        int32_t sums[TILE] = {0};
        for (Py_ssize_t g = 0; g < job->groups; g++) {
            const uint8_t *wg = w + g * GROUP4;
            const int8_t *ag = a + 4 * g;
            for (int j = 0; j < TILE; j++)
                for (int i = 0; i < 4; i++) sums[j] += ag[i] * nibble(wg, 4 * j + i);
        }
        float f[TILE];
        scale_block(job, t, 0, sums, f);
        store_row(job, t, r, f, held);
    }
}

/* See _int8_gemm.h. Channel j's weight for input column c is byte 4 j + c % 4 of the tile's
 * group c / 4. The row's channels ascend, so each block's come together: a block's sum is
 * added (times the block's scale) before the next block's starts from 0. */
void wmark_side_tile(const job_t *job, Py_ssize_t t) {
    const uint8_t *w = job->packed + t * job->groups * GROUP;
    const Py_ssize_t c0 = t * TILE;
    for (Py_ssize_t r = 0; r < job->m; r++) {
        const int32_t *idx = job->side_idx + r * job->side;
        const float *val = job->side_val + r * job->side;
        for (int j = 0; j < TILE && c0 + j < job->n; j++) {
            float *o = job->out + r * job->n + c0 + j;
            for (int d = 0; d < job->side;) {
                const Py_ssize_t b = block_of(job, idx[d]);
                float side = 0.0f;
                for (; d < job->side && block_of(job, idx[d]) == b; d++) {
                    const int8_t weight = (int8_t)w[(idx[d] / 4) * GROUP + 4 * j + idx[d] % 4];
                    side = side + (float)weight * val[d];
                }
                *o = *o + side * scales_at(job, t, b)[j];
            }
        }
    }
}

/* Tile t of an 8-bit job on its build's kernel, and an outlier call's float part on its build's copy. */
static void tile8(const job_t *job, Py_ssize_t t) {
#ifdef WMARK_X86
    if (job->backend == AVX512VNNI) {
        wmark_tile_vnni(job, t);
        return;
    }
    if (job->backend == AVX2) {
        wmark_tile_avx2(job, t);
        return;
    }
#endif
    tile_portable(job, t);
}

static void side_tile(const job_t *job, Py_ssize_t t) {
#ifdef WMARK_X86
    if (job->backend == AVX512VNNI) {
        wmark_side_tile_vnni(job, t);
        return;
    }
    if (job->backend == AVX2) {
        wmark_side_tile_avx2(job, t);
        return;
    }
#endif
    wmark_side_tile(job, t);
}

void wmark_run_tiles(const job_t *job, Py_ssize_t first, Py_ssize_t last) {
#ifdef WMARK_AMX
    if (job->backend == AMX_TILES) {
        wmark_range_amx(job, first, last);
        return;
    }
#endif
    for (Py_ssize_t t = first; t < last; t++) {
        if (job->nibbles) {
#ifdef WMARK_X86
            if (job->backend == AVX512VNNI) {
                wmark_tile_vnni4(job, t);
                continue;
            }
#endif
            tile_portable4(job, t);
            continue;
        }
        tile8(job, t);
        if (job->side_idx != NULL) side_tile(job, t); /* an outlier call: its float part (never AMX tiles) */
    }
}
