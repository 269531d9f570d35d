/*
 * _int8_gemm's AMX kernel (see _int8_gemm.h for the module): the "amx" build's blocks of
 * AMX_MIN_ROWS rows or more (a prompt's prefill, verify trees) on the tile unit of Intel
 * CPUs from Sapphire Rapids on, 8-bit weights and 4-bit (widened to 8 bits a tile at a time),
 * and the grant of the tile state from Linux. tdpbssd multiplies signed bytes directly, so the
 * sums are exact, as in every build. Built for baseline x86-64 but for its functions'
 * target(AMX_TARGET) or target(VNNI_TARGET): it runs only where PyInit__int8_gemm found AMX and
 * Linux granted it (wmark_amx_granted).
 */
#include "_int8_gemm.h"

#ifdef WMARK_AMX
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

atomic_int wmark_wide_failed = 0; /* a thread could not get its widening buffer (see widen4) */

#ifdef WMARK_AMX
/*
 * ---- AMX: blocks of 32 rows x one packed tile (32 channels) on the tile unit ----
 * Tile registers: 0-3 the int32 sums (rows 0-15 / 16-31 x channels 0-15 / 16-31), 4-5 the two
 * row blocks' 64 columns, 6-7 the two channel halves' weights: 16 groups of 4 columns, 64
 * bytes each, 128 bytes apart in the packed tile. Rows are taken a panel at a time (what fits
 * AMX_PANEL_BYTES), and within a panel every tile of the thread's range meets every row block:
 * the panel's rows stay in L2 while the weights stream from memory once per panel.
 */
typedef struct {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config_t;

/* Scale 16 x 32 sums (a row stride of 32) into the output, as block_vnni (_int8_gemm_vnni.c)
 * does (no offset: tdpbssd multiplies the signed bytes themselves), pairs added where paired. */
__attribute__((target(VNNI_TARGET))) static void finish_amx(const job_t *job, const int32_t *sums, Py_ssize_t t,
                                                            Py_ssize_t r0, int rows) {
    for (int h = 0; h < 2; h++) {
        const Py_ssize_t c = t * TILE + 16 * h;
        if (c >= job->n) break;
        const Py_ssize_t left = job->n - c;
        const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        const __m512 scale = _mm512_maskz_loadu_ps(keep, job->scale + c);
        const __m512 bias = job->bias != NULL ? _mm512_maskz_loadu_ps(keep, job->bias + c) : _mm512_setzero_ps();
        __m512 held = _mm512_setzero_ps(); /* a pair's first row (paired: r0 and rows are even) */
        for (int r = 0; r < rows; r++) {
            __m512 f = _mm512_cvtepi32_ps(_mm512_loadu_si512((const void *)(sums + r * TILE + 16 * h)));
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

__attribute__((target(AMX_TARGET))) void wmark_range_amx(const job_t *job, Py_ssize_t first, Py_ssize_t last) {
    uint8_t *wide = NULL;
    if (job->nibbles) {
        if (wide_buffer == NULL) wide_buffer = aligned_alloc(64, AMX_WIDE_BYTES);
        if (wide_buffer == NULL) {
            atomic_store(&wmark_wide_failed, 1);
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
int wmark_amx_granted(void) {
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8")) return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}
#endif
