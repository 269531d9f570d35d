/*
 * _int8_gemm's rows phase (see _int8_gemm.h for the module): what a call does to its input rows
 * before the tiles phase multiplies them, on the pool a chunk of rows at a time
 * (wmark_run_rows): the prologue if any (RMSNorm, SwiGLU), then quantisation to int8 with each
 * row's own peak, plus the vector build's form of the bytes (q + 128 or |q|). All its builds
 * (portable, AVX2, AVX-512) sit together, not with the tile kernels of the same ISA: each vector
 * routine must write exactly the bits of the portable code next to it, in every build, and that
 * is checked by reading the two side by side. Target attributes are per function, as in the
 * kernels' files.
 */
#include "_int8_gemm.h"

#include <math.h>

#include "_fastmath.h"

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
 * ---- outliers: a row's `d` largest channels by magnitude, taken out of its int8 part ----
 * Scanned in channel order, the chosen kept sorted by magnitude, larger first, and among equal
 * magnitudes by channel, lower first; a channel enters only if strictly larger than the last
 * kept, which it then evicts. So the set is the d first channels in (magnitude descending,
 * channel ascending) order, the same in every build (one portable routine, exact compares; a
 * NaN enters only among the first d channels, and then stays). Returned in channel order (the
 * order the float part adds them in), and the row is copied into `rest` with those channels
 * zeroed, for quantisation.
 */
static void take_outliers(const float *row, Py_ssize_t k, int d, int32_t *idx, float *val, float *rest) {
    float mag[OUTLIERS];
    int32_t at[OUTLIERS];
    int kept = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        const float a = fabsf(row[i]);
        if (kept == d && !(a > mag[d - 1])) continue;
        int p = kept < d ? kept++ : d - 1; /* full: the last (smallest, highest channel) goes */
        while (p > 0 && a > mag[p - 1]) { /* past every smaller one; equal ones keep their place */
            mag[p] = mag[p - 1];
            at[p] = at[p - 1];
            p--;
        }
        mag[p] = a;
        at[p] = (int32_t)i;
    }
    for (int j = 1; j < kept; j++) { /* channel order */
        const int32_t c = at[j];
        int p = j;
        while (p > 0 && at[p - 1] > c) {
            at[p] = at[p - 1];
            p--;
        }
        at[p] = c;
    }
    memcpy(rest, row, (size_t)k * sizeof(float));
    for (int j = 0; j < kept; j++) { /* kept == d: d <= k, and every channel enters until then */
        idx[j] = at[j];
        val[j] = row[at[j]];
        rest[at[j]] = 0.0f;
    }
}

/*
 * ---- prologues: rows the GEMM makes from its input before quantising them ----
 * A decoder layer feeds its projections RMSNorm(x) * w and silu(gate) * up: computing those
 * rows here, inside the call, saves the torch ops (and their dispatch, which costs a small draft
 * model almost as much as its weights). Row-local and in a fixed order, so deterministic; their
 * bits are not torch's (only draft models use them: wmark.generator.draft_forward).
 * The prologues (enum prologue) are declared in _int8_gemm.h: linear() takes one by number.
 */

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

/* Input rows first .. last - 1 through the prologue (into h), then quantised (see rows_job_t). */
static void quantise_phase(const rows_job_t *rows, Py_ssize_t first, Py_ssize_t last) {
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
    if (rows->res == NULL) {
        quantise_rows(src, count, k, rows->kp, rows->rounding, rows->q + first * rows->kp,
                      rows->aux != NULL ? rows->aux + first * rows->kp : NULL, rows->rowscale + first);
        return;
    }
    if (rows->side_idx != NULL) { /* outlier rows: the float channels out, the rest one int8 part */
        float *rest = rows->res + first * k;
        for (Py_ssize_t i = 0; i < count; i++)
            take_outliers(src + i * k, k, rows->side, rows->side_idx + (first + i) * rows->side,
                          rows->side_val + (first + i) * rows->side, rest + i * k);
        quantise_rows(rest, count, k, rows->kp, rows->rounding, rows->q + first * rows->kp,
                      rows->aux != NULL ? rows->aux + first * rows->kp : NULL, rows->rowscale + first);
        return;
    }
    /* residual rows: 2r the row, 2r + 1 the row minus its quantised value (exact float32 steps,
     * no contraction: the same bits in every build) */
    const Py_ssize_t kp = rows->kp;
    for (Py_ssize_t i = 0; i < count; i++) {
        const float *row = src + i * k;
        float *res = rows->res + (first + i) * k;
        const Py_ssize_t hi = 2 * (first + i);
        for (int part = 0; part < 2; part++) {
            const Py_ssize_t at = hi + part;
            quantise_rows(part ? res : row, 1, k, kp, rows->rounding, rows->q + at * kp,
                          rows->aux != NULL ? rows->aux + at * kp : NULL, rows->rowscale + at);
            if (!part) {
                const int8_t *q = rows->q + at * kp;
                const float step = rows->rowscale[at];
                for (Py_ssize_t j = 0; j < k; j++) res[j] = row[j] - (float)q[j] * step;
            }
        }
    }
}

/* Quantised rows first .. last - 1: each one's sum over each block of `span` groups (qsum). */
static void block_sums(const rows_job_t *rows, Py_ssize_t first, Py_ssize_t last) {
    const Py_ssize_t cols = 4 * rows->span;
    for (Py_ssize_t r = first; r < last; r++) {
        const int8_t *q = rows->q + r * rows->kp;
        for (Py_ssize_t b = 0; b < rows->blocks; b++) {
            const Py_ssize_t end = (b + 1) * cols < rows->kp ? (b + 1) * cols : rows->kp;
            int32_t total = 0;
            for (Py_ssize_t j = b * cols; j < end; j++) total += q[j];
            rows->qsum[r * rows->blocks + b] = total;
        }
    }
}

/* Rows first .. last - 1 of a call's rows phase: the prologue, quantisation and (block scales on
 * VNNI) the quantised rows' block sums. Rows are independent, so any split over threads gives the
 * same bytes. */
void wmark_run_rows(const rows_job_t *rows, Py_ssize_t first, Py_ssize_t last) {
    quantise_phase(rows, first, last);
    if (rows->qsum == NULL) return;
    const int parts = rows->res != NULL && rows->side_idx == NULL ? 2 : 1; /* a residual's rows: 2 each */
    block_sums(rows, parts * first, parts * last);
}
