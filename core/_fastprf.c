/*
 * wmark._fastprf: the detector's hot path in C, bit-for-bit equal to wmark.prf.
 *
 * HMAC-SHA256 per context with the key's inner/outer midstates computed once, then
 * Philox-4x32-10 for the pivot U(token, arrival).  SHA-256 uses the x86 SHA extensions
 * when the CPU has them and portable C otherwise.  No weakening of the PRF: this is
 * the same function as the reference, only faster.  Loops release the GIL so callers
 * can split a batch across threads.  First-occurrence masking of context windows
 * (dedup v1) is here too because a Python set costs more than the PRF itself, and so is
 * scored_pivots, which does both for one token sequence in a single pass: a short text's
 * detection would otherwise spend more in numpy's per-call overhead than in the PRF.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define WMARK_HAVE_SHANI_BUILD 1
#include <immintrin.h>
#endif

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static const uint32_t IV256[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static inline uint32_t load_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline void store_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void compress_portable(uint32_t state[8], const uint8_t block[64]) {
    uint32_t w[64];
    for (int t = 0; t < 16; t++) w[t] = load_be32(block + 4 * t);
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = ROTR(w[t - 15], 7) ^ ROTR(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = ROTR(w[t - 2], 17) ^ ROTR(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = h + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g)) + K256[t] + w[t];
        uint32_t t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1;
        d = c; c = b; b = a; a = t1 + t2;
    }
    state[0] += a; state[1] += b; state[2] += c; state[3] += d;
    state[4] += e; state[5] += f; state[6] += g; state[7] += h;
}

#ifdef WMARK_HAVE_SHANI_BUILD
/* Four rounds per step with sha256rnds2; the schedule for steps >= 4 comes from msg1/msg2. */
__attribute__((target("sha,sse4.1,ssse3")))
static void compress_shani(uint32_t state[8], const uint8_t block[64]) {
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i tmp = _mm_loadu_si128((const __m128i *)&state[0]);  /* a b c d */
    __m128i st1 = _mm_loadu_si128((const __m128i *)&state[4]);  /* e f g h */
    tmp = _mm_shuffle_epi32(tmp, 0xB1);                          /* b a d c */
    st1 = _mm_shuffle_epi32(st1, 0x1B);                          /* h g f e */
    __m128i st0 = _mm_alignr_epi8(tmp, st1, 8);                  /* ABEF */
    st1 = _mm_blend_epi16(st1, tmp, 0xF0);                       /* CDGH */
    const __m128i abef_save = st0, cdgh_save = st1;
    __m128i w[4];
    for (int i = 0; i < 16; i++) {
        __m128i cur;
        if (i < 4) {
            cur = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(block + 16 * i)), bswap);
        } else {
            __m128i x = _mm_sha256msg1_epu32(w[i & 3], w[(i - 3) & 3]);
            x = _mm_add_epi32(x, _mm_alignr_epi8(w[(i - 1) & 3], w[(i - 2) & 3], 4));
            cur = _mm_sha256msg2_epu32(x, w[(i - 1) & 3]);
        }
        w[i & 3] = cur;
        __m128i msg = _mm_add_epi32(cur, _mm_loadu_si128((const __m128i *)&K256[4 * i]));
        st1 = _mm_sha256rnds2_epu32(st1, st0, msg);
        msg = _mm_shuffle_epi32(msg, 0x0E);
        st0 = _mm_sha256rnds2_epu32(st0, st1, msg);
    }
    st0 = _mm_add_epi32(st0, abef_save);
    st1 = _mm_add_epi32(st1, cdgh_save);
    tmp = _mm_shuffle_epi32(st0, 0x1B);                          /* F E B A */
    st1 = _mm_shuffle_epi32(st1, 0xB1);                          /* D C H G */
    st0 = _mm_blend_epi16(tmp, st1, 0xF0);                       /* D C B A */
    st1 = _mm_alignr_epi8(st1, tmp, 8);                          /* H G F E */
    _mm_storeu_si128((__m128i *)&state[0], st0);
    _mm_storeu_si128((__m128i *)&state[4], st1);
}

/* compress_shani on two independent blocks at once: sha256rnds2 waits on its previous result
 * for several cycles, so two interleaved streams run in about the time of one. */
__attribute__((target("sha,sse4.1,ssse3")))
static void compress_shani_x2(uint32_t sa[8], const uint8_t *ba, uint32_t sb[8], const uint8_t *bb) {
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i ta = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&sa[0]), 0xB1);
    __m128i tb = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&sb[0]), 0xB1);
    __m128i a1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&sa[4]), 0x1B);
    __m128i b1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&sb[4]), 0x1B);
    __m128i a0 = _mm_alignr_epi8(ta, a1, 8), b0 = _mm_alignr_epi8(tb, b1, 8);
    a1 = _mm_blend_epi16(a1, ta, 0xF0);
    b1 = _mm_blend_epi16(b1, tb, 0xF0);
    const __m128i a0_save = a0, a1_save = a1, b0_save = b0, b1_save = b1;
    __m128i wa[4], wb[4];
    for (int i = 0; i < 16; i++) {
        __m128i ca, cb;
        if (i < 4) {
            ca = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(ba + 16 * i)), bswap);
            cb = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(bb + 16 * i)), bswap);
        } else {
            __m128i xa = _mm_sha256msg1_epu32(wa[i & 3], wa[(i - 3) & 3]);
            __m128i xb = _mm_sha256msg1_epu32(wb[i & 3], wb[(i - 3) & 3]);
            xa = _mm_add_epi32(xa, _mm_alignr_epi8(wa[(i - 1) & 3], wa[(i - 2) & 3], 4));
            xb = _mm_add_epi32(xb, _mm_alignr_epi8(wb[(i - 1) & 3], wb[(i - 2) & 3], 4));
            ca = _mm_sha256msg2_epu32(xa, wa[(i - 1) & 3]);
            cb = _mm_sha256msg2_epu32(xb, wb[(i - 1) & 3]);
        }
        wa[i & 3] = ca;
        wb[i & 3] = cb;
        const __m128i k = _mm_loadu_si128((const __m128i *)&K256[4 * i]);
        __m128i ma = _mm_add_epi32(ca, k), mb = _mm_add_epi32(cb, k);
        a1 = _mm_sha256rnds2_epu32(a1, a0, ma);
        b1 = _mm_sha256rnds2_epu32(b1, b0, mb);
        ma = _mm_shuffle_epi32(ma, 0x0E);
        mb = _mm_shuffle_epi32(mb, 0x0E);
        a0 = _mm_sha256rnds2_epu32(a0, a1, ma);
        b0 = _mm_sha256rnds2_epu32(b0, b1, mb);
    }
    a0 = _mm_add_epi32(a0, a0_save);
    a1 = _mm_add_epi32(a1, a1_save);
    b0 = _mm_add_epi32(b0, b0_save);
    b1 = _mm_add_epi32(b1, b1_save);
    ta = _mm_shuffle_epi32(a0, 0x1B);
    tb = _mm_shuffle_epi32(b0, 0x1B);
    a1 = _mm_shuffle_epi32(a1, 0xB1);
    b1 = _mm_shuffle_epi32(b1, 0xB1);
    _mm_storeu_si128((__m128i *)&sa[0], _mm_blend_epi16(ta, a1, 0xF0));
    _mm_storeu_si128((__m128i *)&sa[4], _mm_alignr_epi8(a1, ta, 8));
    _mm_storeu_si128((__m128i *)&sb[0], _mm_blend_epi16(tb, b1, 0xF0));
    _mm_storeu_si128((__m128i *)&sb[4], _mm_alignr_epi8(b1, tb, 8));
}
#endif

typedef void (*compress_fn)(uint32_t *, const uint8_t *);
static compress_fn compress = compress_portable;
static int using_shani = 0;

/* Two blocks into two states: interleaved on SHA-NI (compress_shani_x2), else one after the other. */
static void compress_pair_serial(uint32_t sa[8], const uint8_t *ba, uint32_t sb[8], const uint8_t *bb) {
    compress(sa, ba);
    compress(sb, bb);
}

typedef void (*compress2_fn)(uint32_t *, const uint8_t *, uint32_t *, const uint8_t *);
static compress2_fn compress2 = compress_pair_serial;

/* HMAC-SHA256 with precomputed midstates; msg_len is the length of the message (not the key block). */
static void hmac_from_midstates(const uint32_t istate[8], const uint32_t ostate[8], const uint8_t *msg,
                                size_t msg_len, uint8_t out[32]) {
    uint32_t st[8];
    uint8_t block[64];
    memcpy(st, istate, sizeof st);
    size_t off = 0;
    while (msg_len - off >= 64) {
        compress(st, msg + off);
        off += 64;
    }
    size_t rem = msg_len - off;
    uint64_t bits = (uint64_t)(64 + msg_len) * 8;
    memset(block, 0, 64);
    memcpy(block, msg + off, rem);
    block[rem] = 0x80;
    if (rem >= 56) {
        compress(st, block);
        memset(block, 0, 64);
    }
    for (int i = 0; i < 8; i++) block[63 - i] = (uint8_t)(bits >> (8 * i));
    compress(st, block);

    uint8_t inner[32];
    for (int i = 0; i < 8; i++) store_be32(inner + 4 * i, st[i]);
    memcpy(st, ostate, sizeof st);
    memset(block, 0, 64);
    memcpy(block, inner, 32);
    block[32] = 0x80;
    bits = (uint64_t)(64 + 32) * 8;
    for (int i = 0; i < 8; i++) block[63 - i] = (uint8_t)(bits >> (8 * i));
    compress(st, block);
    for (int i = 0; i < 8; i++) store_be32(out + 4 * i, st[i]);
}

static void key_midstates(const uint8_t *key, size_t key_len, uint32_t istate[8], uint32_t ostate[8]) {
    uint8_t ipad[64], opad[64];
    memset(ipad, 0x36, 64);
    memset(opad, 0x5c, 64);
    for (size_t i = 0; i < key_len; i++) {
        ipad[i] ^= key[i];
        opad[i] ^= key[i];
    }
    memcpy(istate, IV256, 32);
    memcpy(ostate, IV256, 32);
    compress(istate, ipad);
    compress(ostate, opad);
}

static inline uint32_t mulhilo32(uint32_t a, uint32_t b, uint32_t *hi) {
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

static void philox4x32_10(uint32_t ctr[4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint32_t hi0, hi1;
        uint32_t lo0 = mulhilo32(0xD2511F53u, ctr[0], &hi0);
        uint32_t lo1 = mulhilo32(0xCD9E8D57u, ctr[2], &hi1);
        uint32_t c0 = hi1 ^ ctr[1] ^ k0, c2 = hi0 ^ ctr[3] ^ k1;
        ctr[0] = c0;
        ctr[1] = lo1;
        ctr[2] = c2;
        ctr[3] = lo0;
    }
}

static inline uint32_t load_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* U(token, arrival) from a 32-byte context seed: the top 52 bits x of the 64-bit Philox output,
 * u = (x + 1/2) * 2^-52, exact in float64 and never 0 or 1. */
static inline double seed_uniform_words(const uint32_t w[4], uint32_t token, uint32_t arrival) {
    uint32_t ctr[4] = {token, arrival, w[2], w[3]};
    philox4x32_10(ctr, w[0], w[1]);
    uint64_t x = ((uint64_t)ctr[1] << 20) | ((uint64_t)ctr[0] >> 12);
    return ((double)x + 0.5) * (1.0 / 4503599627370496.0);
}

static inline double seed_uniform(const uint8_t seed[32], uint32_t token, uint32_t arrival) {
    const uint32_t w[4] = {load_le32(seed), load_le32(seed + 4), load_le32(seed + 8), load_le32(seed + 12)};
    return seed_uniform_words(w, token, arrival);
}

typedef struct {
    Py_buffer key, prefix, rows;
    Py_ssize_t n_rows, width, stride; /* row i starts at word i * stride (width, or 1 for a sequence) */
    uint8_t *msg;
    size_t msg_len;
    uint32_t istate[8], ostate[8];
} seed_job;

/* Parse (key, prefix, rows, width) and prepare a message buffer: prefix || be32(row words). */
static int seed_job_open(seed_job *job, PyObject *args, const char *fmt, Py_buffer *extra, unsigned *arrival) {
    memset(job, 0, sizeof *job);
    int ok;
    if (extra) {
        ok = PyArg_ParseTuple(args, fmt, &job->key, &job->prefix, &job->rows, &job->width, extra, arrival);
    } else {
        ok = PyArg_ParseTuple(args, fmt, &job->key, &job->prefix, &job->rows, &job->width);
    }
    if (!ok) return -1;
    if (job->key.len > 64) {
        PyErr_SetString(PyExc_ValueError, "key longer than 64 bytes: pre-hash it with SHA-256");
        return -1;
    }
    if (job->width <= 0 || job->rows.len % (4 * job->width) != 0) {
        PyErr_SetString(PyExc_ValueError, "rows must be a uint32 buffer of shape (n, width)");
        return -1;
    }
    job->n_rows = job->rows.len / (4 * job->width);
    job->stride = job->width;
    job->msg_len = (size_t)job->prefix.len + 4 * (size_t)job->width;
    job->msg = (uint8_t *)malloc(job->msg_len);
    if (!job->msg) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(job->msg, job->prefix.buf, job->prefix.len);
    key_midstates((const uint8_t *)job->key.buf, (size_t)job->key.len, job->istate, job->ostate);
    return 0;
}

static void seed_job_close(seed_job *job, Py_buffer *extra) {
    free(job->msg);
    if (job->key.obj) PyBuffer_Release(&job->key);
    if (job->prefix.obj) PyBuffer_Release(&job->prefix);
    if (job->rows.obj) PyBuffer_Release(&job->rows);
    if (extra && extra->obj) PyBuffer_Release(extra);
}

static inline void seed_for_row(seed_job *job, Py_ssize_t i, uint8_t seed[32]) {
    const uint32_t *row = (const uint32_t *)job->rows.buf + i * job->stride;
    uint8_t *tail = job->msg + job->prefix.len;
    for (Py_ssize_t k = 0; k < job->width; k++) store_be32(tail + 4 * k, row[k]);
    hmac_from_midstates(job->istate, job->ostate, job->msg, job->msg_len, seed);
}

PyDoc_STRVAR(context_seeds_doc,
             "context_seeds(key, prefix, rows, width) -> bytes\n\n"
             "HMAC-SHA256(key, prefix || be32(row)) for each row of a native-endian uint32 buffer\n"
             "of shape (n, width); returns n * 32 bytes.");

static PyObject *context_seeds(PyObject *self, PyObject *args) {
    (void)self;
    seed_job job;
    if (seed_job_open(&job, args, "y*y*y*n", NULL, NULL) < 0) {
        seed_job_close(&job, NULL);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, job.n_rows * 32);
    if (out) {
        uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < job.n_rows; i++) seed_for_row(&job, i, dst + 32 * i);
        Py_END_ALLOW_THREADS
    }
    seed_job_close(&job, NULL);
    return out;
}

PyDoc_STRVAR(pivots_doc,
             "pivots(key, prefix, rows, width, tokens, arrival) -> bytes\n\n"
             "For each row i, U(tokens[i], arrival) under the seed HMAC-SHA256(key, prefix || be32(row i));\n"
             "tokens is a native-endian uint32 buffer of length n; returns n float64 values as bytes.");

static PyObject *pivots(PyObject *self, PyObject *args) {
    (void)self;
    seed_job job;
    Py_buffer tokens;
    unsigned arrival = 1;
    memset(&tokens, 0, sizeof tokens);
    if (seed_job_open(&job, args, "y*y*y*ny*I", &tokens, &arrival) < 0) {
        seed_job_close(&job, &tokens);
        return NULL;
    }
    if (tokens.len != 4 * job.n_rows) {
        PyErr_SetString(PyExc_ValueError, "tokens must hold one uint32 per row");
        seed_job_close(&job, &tokens);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, job.n_rows * 8);
    if (out) {
        double *dst = (double *)PyBytes_AS_STRING(out);
        const uint32_t *tok = (const uint32_t *)tokens.buf;
        Py_BEGIN_ALLOW_THREADS
        uint8_t seed[32];
        for (Py_ssize_t i = 0; i < job.n_rows; i++) {
            seed_for_row(&job, i, seed);
            dst[i] = seed_uniform(seed, tok[i], (uint32_t)arrival);
        }
        Py_END_ALLOW_THREADS
    }
    seed_job_close(&job, &tokens);
    return out;
}

PyDoc_STRVAR(uniforms_doc,
             "uniforms(seed, tokens, arrivals) -> bytes\n\n"
             "U(tokens[i], arrivals[i]) under one 32-byte context seed, for native-endian uint32 buffers\n"
             "of equal length n; returns n float64 values as bytes.");

static PyObject *uniforms(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer seed, tokens, arrivals;
    if (!PyArg_ParseTuple(args, "y*y*y*", &seed, &tokens, &arrivals)) return NULL;
    PyObject *out = NULL;
    if (seed.len < 16) {
        PyErr_SetString(PyExc_ValueError, "seed must have at least 16 bytes");
    } else if (tokens.len != arrivals.len || tokens.len % 4 != 0) {
        PyErr_SetString(PyExc_ValueError, "tokens and arrivals must be uint32 buffers of equal length");
    } else {
        Py_ssize_t n = tokens.len / 4;
        out = PyBytes_FromStringAndSize(NULL, n * 8);
        if (out) {
            double *dst = (double *)PyBytes_AS_STRING(out);
            const uint32_t *tok = (const uint32_t *)tokens.buf, *arr = (const uint32_t *)arrivals.buf;
            uint8_t key[32] = {0};
            memcpy(key, seed.buf, seed.len < 32 ? (size_t)seed.len : 32);
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t i = 0; i < n; i++) dst[i] = seed_uniform(key, tok[i], arr[i]);
            Py_END_ALLOW_THREADS
        }
    }
    PyBuffer_Release(&seed);
    PyBuffer_Release(&tokens);
    PyBuffer_Release(&arrivals);
    return out;
}

/* vLLM's watermark PRF (vllm/v1/watermarking/prfs/philox.py in vLLM 0.32.0, Apache-2.0; ported,
 * see wmark/vllm_gumbel.py for the definition): Philox4x32-10 absorbs the context four words at a
 * time under key (k0 ^ offset, k1), then one more call keyed by the context state picks the
 * token's word; u = float32((top 24 bits + 1) / (2^24 + 1)), returned widened to float64. */
static inline double vllm_uniform(uint32_t k0, uint32_t k1, const uint32_t *ctx, Py_ssize_t width,
                                  uint32_t token) {
    uint32_t state[4] = {0x574D4358u, (uint32_t)width, 0, 0};
    for (Py_ssize_t off = 0; off < width; off += 4) {
        uint32_t ctr[4];
        for (int i = 0; i < 4; i++) {
            uint32_t word = off + i < width ? ctx[off + i] : 0xFFFFFFFFu - (uint32_t)i;
            ctr[i] = state[i] ^ word;
        }
        philox4x32_10(ctr, k0 ^ (uint32_t)off, k1);
        memcpy(state, ctr, sizeof state);
    }
    uint32_t out[4] = {token >> 2, state[0], state[1], state[2]};
    philox4x32_10(out, k0 ^ state[3], k1 ^ 0x574D544Bu);
    uint32_t mantissa = out[token & 3] >> 8;
    return (double)(float)(((double)mantissa + 1.0) / 16777217.0);
}

PyDoc_STRVAR(vllm_uniforms_doc,
             "vllm_uniforms(key0, key1, rows, width, tokens) -> bytes\n\n"
             "vLLM's Philox watermark uniform of tokens[i] at context row i, for a native-endian uint32\n"
             "(n, width) buffer of contexts (-1 padding as 0xFFFFFFFF) and n uint32 tokens, under the\n"
             "64-bit key (key1 << 32 | key0); returns n float64 values as bytes.");

static PyObject *vllm_uniforms(PyObject *self, PyObject *args) {
    (void)self;
    unsigned int k0, k1;
    Py_buffer rows, tokens;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "IIy*ny*", &k0, &k1, &rows, &width, &tokens)) return NULL;
    PyObject *out = NULL;
    if (width <= 0 || rows.len % (4 * width) != 0 || tokens.len * width != rows.len) {
        PyErr_SetString(PyExc_ValueError, "rows must be uint32 (n, width) and tokens uint32 (n,)");
    } else {
        Py_ssize_t n = tokens.len / 4;
        out = PyBytes_FromStringAndSize(NULL, n * 8);
        if (out) {
            double *dst = (double *)PyBytes_AS_STRING(out);
            const uint32_t *ctx = (const uint32_t *)rows.buf, *tok = (const uint32_t *)tokens.buf;
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t i = 0; i < n; i++) dst[i] = vllm_uniform(k0, k1, ctx + i * width, width, tok[i]);
            Py_END_ALLOW_THREADS
        }
    }
    PyBuffer_Release(&rows);
    PyBuffer_Release(&tokens);
    return out;
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* Open addressing over row indices: the table of first_occurrence and scored_pivots_core. */
static size_t row_table_capacity(Py_ssize_t n) {
    size_t cap = 16;
    while (cap < (size_t)(2 * n + 1)) cap <<= 1;
    return cap;
}

/* Whether `row` (width words) is new to `table`, whose entries index rows of `data` (a row at
 * index i starts at data + i * stride); a new row is entered under `index`. */
static inline int row_is_new(int64_t *table, size_t cap, const uint32_t *data, Py_ssize_t stride,
                             const uint32_t *row, Py_ssize_t width, int64_t index) {
    uint64_t hsh = 0x9E3779B97F4A7C15ULL;
    for (Py_ssize_t k = 0; k < width; k++) hsh = mix64(hsh ^ row[k]);
    size_t slot = (size_t)hsh & (cap - 1);
    while (table[slot] >= 0) {
        if (memcmp(data + table[slot] * stride, row, 4 * (size_t)width) == 0) return 0;
        slot = (slot + 1) & (cap - 1);
    }
    table[slot] = index;
    return 1;
}

PyDoc_STRVAR(first_occurrence_doc,
             "first_occurrence(rows, width) -> bytes\n\n"
             "1 for each row of a uint32 (n, width) buffer that did not occur earlier, else 0.");

static PyObject *first_occurrence(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer rows;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "y*n", &rows, &width)) return NULL;
    if (width <= 0 || rows.len % (4 * width) != 0) {
        PyBuffer_Release(&rows);
        PyErr_SetString(PyExc_ValueError, "rows must be a uint32 buffer of shape (n, width)");
        return NULL;
    }
    Py_ssize_t n = rows.len / (4 * width);
    size_t cap = row_table_capacity(n);
    int64_t *table = (int64_t *)malloc(cap * sizeof(int64_t));
    PyObject *out = table ? PyBytes_FromStringAndSize(NULL, n) : NULL;
    if (!table) PyErr_NoMemory();
    if (out) {
        uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
        const uint32_t *data = (const uint32_t *)rows.buf;
        Py_BEGIN_ALLOW_THREADS
        for (size_t s = 0; s < cap; s++) table[s] = -1;
        for (Py_ssize_t i = 0; i < n; i++) dst[i] = (uint8_t)row_is_new(table, cap, data, width, data + i * width, width, i);
        Py_END_ALLOW_THREADS
    }
    free(table);
    PyBuffer_Release(&rows);
    return out;
}

/* The seeds of many windows, HMAC-SHA256(key, prefix || be32(window)), two at a time where the
 * message fits one SHA-256 block (compress2: interleaved on SHA-NI); each kept as the four
 * little-endian words of its first 16 bytes, all that seed_uniform reads. */
typedef struct {
    uint32_t istate[8], ostate[8];
    uint8_t inner[2][64], outer[2][64]; /* padded blocks, one per lane: only the window changes */
    size_t prefix_len, msg_len;
    Py_ssize_t width;
    uint8_t *msg; /* prefix || window, for a message longer than one block */
} seed_plan;

static int seed_plan_open(seed_plan *p, const Py_buffer *key, const Py_buffer *prefix, Py_ssize_t width) {
    memset(p, 0, sizeof *p);
    p->prefix_len = (size_t)prefix->len;
    p->width = width;
    p->msg_len = p->prefix_len + 4 * (size_t)width;
    p->msg = (uint8_t *)malloc(p->msg_len);
    if (!p->msg) return -1;
    memcpy(p->msg, prefix->buf, p->prefix_len);
    key_midstates((const uint8_t *)key->buf, (size_t)key->len, p->istate, p->ostate);
    uint64_t inner_bits = (uint64_t)(64 + p->msg_len) * 8, outer_bits = (uint64_t)(64 + 32) * 8;
    for (int lane = 0; lane < 2; lane++) {
        if (p->msg_len <= 55) {
            memcpy(p->inner[lane], prefix->buf, p->prefix_len);
            p->inner[lane][p->msg_len] = 0x80;
            for (int i = 0; i < 8; i++) p->inner[lane][63 - i] = (uint8_t)(inner_bits >> (8 * i));
        }
        p->outer[lane][32] = 0x80;
        for (int i = 0; i < 8; i++) p->outer[lane][63 - i] = (uint8_t)(outer_bits >> (8 * i));
    }
    return 0;
}

static inline uint32_t bswap32(uint32_t x) {
    return (x >> 24) | ((x >> 8) & 0xFF00u) | ((x << 8) & 0xFF0000u) | (x << 24);
}

/* seeds[i] = the seed words of the window at rows[i] (p->width uint32 IDs). */
static void plan_seeds(seed_plan *p, const uint32_t *const *rows, Py_ssize_t n, uint32_t (*seeds)[4]) {
    Py_ssize_t i = 0;
    if (p->msg_len > 55) {
        uint8_t digest[32];
        for (; i < n; i++) {
            for (Py_ssize_t k = 0; k < p->width; k++) store_be32(p->msg + p->prefix_len + 4 * k, rows[i][k]);
            hmac_from_midstates(p->istate, p->ostate, p->msg, p->msg_len, digest);
            for (int k = 0; k < 4; k++) seeds[i][k] = load_le32(digest + 4 * k);
        }
        return;
    }
    for (; i < n; i += 2) {
        int lanes = i + 1 < n ? 2 : 1;
        uint32_t st[2][8];
        for (int lane = 0; lane < lanes; lane++) {
            const uint32_t *row = rows[i + lane];
            for (Py_ssize_t k = 0; k < p->width; k++) store_be32(p->inner[lane] + p->prefix_len + 4 * k, row[k]);
            memcpy(st[lane], p->istate, sizeof st[lane]);
        }
        if (lanes == 2) compress2(st[0], p->inner[0], st[1], p->inner[1]);
        else compress(st[0], p->inner[0]);
        for (int lane = 0; lane < lanes; lane++) {
            for (int k = 0; k < 8; k++) store_be32(p->outer[lane] + 4 * k, st[lane][k]);
            memcpy(st[lane], p->ostate, sizeof st[lane]);
        }
        if (lanes == 2) compress2(st[0], p->outer[0], st[1], p->outer[1]);
        else compress(st[0], p->outer[0]);
        /* the digest's bytes are the state's words big-endian; seed_uniform reads them little-endian */
        for (int lane = 0; lane < lanes; lane++)
            for (int k = 0; k < 4; k++) seeds[i + lane][k] = bswap32(st[lane][k]);
    }
}

/* The scored positions of k token sequences (the readings of one text) under window labels of
 * p->width IDs with dedup v1, each sequence on its own, and their pivots U(token, 1).  A window
 * seen in an earlier sequence keeps its seed: one HMAC per distinct window of all of them.
 * Writes counts[r] positions and pivots to pos[r], piv[r] (room for n - first each); returns
 * -1 when out of memory.  Runs without the GIL. */
static int scored_pivots_core(seed_plan *p, const uint32_t *const *ids, const Py_ssize_t *lens, Py_ssize_t k,
                              Py_ssize_t start, int64_t *const *pos, double *const *piv, Py_ssize_t *counts) {
    Py_ssize_t width = p->width, first = width > start ? width : start, total = 0;
    for (Py_ssize_t r = 0; r < k; r++) total += lens[r] > first ? lens[r] - first : 0;
    size_t cap = row_table_capacity(total);
    int64_t *table = (int64_t *)malloc(cap * sizeof(int64_t));
    const uint32_t **rows = (const uint32_t **)malloc((size_t)(total ? total : 1) * sizeof *rows);
    Py_ssize_t *last = (Py_ssize_t *)malloc((size_t)(total ? total : 1) * sizeof *last);
    Py_ssize_t *entry_of = (Py_ssize_t *)malloc((size_t)(total ? total : 1) * sizeof *entry_of);
    uint32_t(*seeds)[4] = (uint32_t(*)[4])malloc((size_t)(total ? total : 1) * sizeof *seeds);
    int status = -1;
    if (!table || !rows || !last || !entry_of || !seeds) goto done;
    for (size_t s = 0; s < cap; s++) table[s] = -1;
    Py_ssize_t entries = 0, scored = 0;
    for (Py_ssize_t r = 0; r < k; r++) {
        counts[r] = 0;
        for (Py_ssize_t t = first; t < lens[r]; t++) {
            const uint32_t *row = ids[r] + t - width;
            uint64_t hsh = 0x9E3779B97F4A7C15ULL;
            for (Py_ssize_t w = 0; w < width; w++) hsh = mix64(hsh ^ row[w]);
            size_t slot = (size_t)hsh & (cap - 1);
            int64_t e;
            while ((e = table[slot]) >= 0 && memcmp(rows[e], row, 4 * (size_t)width) != 0) slot = (slot + 1) & (cap - 1);
            if (e < 0) {
                e = entries++;
                table[slot] = e;
                rows[e] = row;
            } else if (last[e] == r) {
                continue; /* a repeat within this sequence: masked */
            }
            last[e] = r;
            pos[r][counts[r]++] = t;
            entry_of[scored++] = e;
        }
    }
    plan_seeds(p, rows, entries, seeds);
    scored = 0;
    for (Py_ssize_t r = 0; r < k; r++)
        for (Py_ssize_t i = 0; i < counts[r]; i++) {
            const uint32_t *w = seeds[entry_of[scored++]];
            piv[r][i] = seed_uniform_words(w, ids[r][pos[r][i]], 1);
        }
    status = 0;
done:
    free(table);
    free(rows);
    free(last);
    free(entry_of);
    free(seeds);
    return status;
}

/* scored_pivots (one sequence, `many` 0) and scored_pivots_many (a sequence of them). */
static PyObject *scored_pivots_impl(PyObject *args, int many) {
    Py_buffer key, prefix;
    PyObject *seq_arg;
    Py_ssize_t width, start;
    if (!PyArg_ParseTuple(args, "y*y*Onn", &key, &prefix, &seq_arg, &width, &start)) return NULL;
    PyObject *seq = NULL, *result = NULL;
    Py_buffer *views = NULL;
    PyObject **outs = NULL;
    const uint32_t **ids = NULL;
    Py_ssize_t *lens = NULL, *counts = NULL, k = 0, opened = 0;
    int64_t **pos = NULL;
    double **piv = NULL;
    seed_plan plan;
    memset(&plan, 0, sizeof plan);
    if (key.len > 64 || width <= 0 || start < 0) {
        PyErr_SetString(PyExc_ValueError, "key of at most 64 bytes, width >= 1 and start >= 0 expected");
        goto done;
    }
    seq = many ? PySequence_Fast(seq_arg, "ids must be a sequence of uint32 buffers") : PyTuple_Pack(1, seq_arg);
    if (!seq) goto done;
    k = PySequence_Fast_GET_SIZE(seq);
    views = (Py_buffer *)calloc((size_t)(k ? k : 1), sizeof *views);
    outs = (PyObject **)calloc((size_t)(2 * k + 1), sizeof *outs);
    ids = (const uint32_t **)calloc((size_t)(k ? k : 1), sizeof *ids);
    lens = (Py_ssize_t *)calloc((size_t)(k ? k : 1), sizeof *lens);
    counts = (Py_ssize_t *)calloc((size_t)(k ? k : 1), sizeof *counts);
    pos = (int64_t **)calloc((size_t)(k ? k : 1), sizeof *pos);
    piv = (double **)calloc((size_t)(k ? k : 1), sizeof *piv);
    if (!views || !outs || !ids || !lens || !counts || !pos || !piv || seed_plan_open(&plan, &key, &prefix, width) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t first = width > start ? width : start;
    for (; opened < k; opened++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, opened), &views[opened], PyBUF_SIMPLE) < 0) goto done;
        if (views[opened].len % 4 != 0) {
            opened++;
            PyErr_SetString(PyExc_ValueError, "ids must be native-endian uint32 buffers");
            goto done;
        }
        Py_ssize_t n = views[opened].len / 4, m = n > first ? n - first : 0;
        ids[opened] = (const uint32_t *)views[opened].buf;
        lens[opened] = n;
        outs[2 * opened] = PyBytes_FromStringAndSize(NULL, m * 8);
        outs[2 * opened + 1] = PyBytes_FromStringAndSize(NULL, m * 8);
        if (!outs[2 * opened] || !outs[2 * opened + 1]) {
            opened++;
            goto done;
        }
        pos[opened] = (int64_t *)PyBytes_AS_STRING(outs[2 * opened]);
        piv[opened] = (double *)PyBytes_AS_STRING(outs[2 * opened + 1]);
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = scored_pivots_core(&plan, ids, lens, k, start, pos, piv, counts);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *pairs = PyList_New(k);
    if (!pairs) goto done;
    for (Py_ssize_t r = 0; r < k; r++) {
        PyObject *pair = NULL;
        if (_PyBytes_Resize(&outs[2 * r], counts[r] * 8) == 0 && _PyBytes_Resize(&outs[2 * r + 1], counts[r] * 8) == 0)
            pair = PyTuple_Pack(2, outs[2 * r], outs[2 * r + 1]);
        if (!pair) {
            Py_DECREF(pairs);
            goto done;
        }
        PyList_SET_ITEM(pairs, r, pair);
    }
    if (many) {
        result = pairs;
    } else {
        result = PyList_GET_ITEM(pairs, 0);
        Py_INCREF(result);
        Py_DECREF(pairs);
    }
done:
    for (Py_ssize_t r = 0; r < opened; r++) {
        if (views[r].obj) PyBuffer_Release(&views[r]);
    }
    if (outs)
        for (Py_ssize_t i = 0; i < 2 * k; i++) Py_XDECREF(outs[i]);
    free(views);
    free(outs);
    free(ids);
    free(lens);
    free(counts);
    free(pos);
    free(piv);
    free(plan.msg);
    Py_XDECREF(seq);
    PyBuffer_Release(&key);
    PyBuffer_Release(&prefix);
    return result;
}

PyDoc_STRVAR(scored_pivots_doc,
             "scored_pivots(key, prefix, ids, width, start) -> (bytes, bytes)\n\n"
             "The scored positions of a native-endian uint32 token sequence under window labels of\n"
             "`width` IDs with dedup v1 (each t >= max(width, start) whose window ids[t - width : t]\n"
             "did not occur at an earlier such t), as int64, and U(ids[t], 1) under the seed\n"
             "HMAC-SHA256(key, prefix || be32(window)) of each, as float64: scored_positions and\n"
             "pivots in one pass.");

static PyObject *scored_pivots(PyObject *self, PyObject *args) {
    (void)self;
    return scored_pivots_impl(args, 0);
}

PyDoc_STRVAR(scored_pivots_many_doc,
             "scored_pivots_many(key, prefix, ids, width, start) -> list[(bytes, bytes)]\n\n"
             "scored_pivots of each sequence of `ids` (a sequence of uint32 buffers: the readings of\n"
             "one text), each on its own; a window that several of them hold is hashed once.");

static PyObject *scored_pivots_many(PyObject *self, PyObject *args) {
    (void)self;
    return scored_pivots_impl(args, 1);
}

static PyObject *backend(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(using_shani ? "sha-ni" : "portable");
}

static PyObject *use_portable(PyObject *self, PyObject *args) {
    (void)self;
    int flag;
    if (!PyArg_ParseTuple(args, "p", &flag)) return NULL;
    if (flag) {
        compress = compress_portable;
        compress2 = compress_pair_serial;
        using_shani = 0;
    } else {
#ifdef WMARK_HAVE_SHANI_BUILD
        if (__builtin_cpu_supports("sha")) {
            compress = compress_shani;
            compress2 = compress_shani_x2;
            using_shani = 1;
        }
#endif
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"context_seeds", context_seeds, METH_VARARGS, context_seeds_doc},
    {"pivots", pivots, METH_VARARGS, pivots_doc},
    {"uniforms", uniforms, METH_VARARGS, uniforms_doc},
    {"first_occurrence", first_occurrence, METH_VARARGS, first_occurrence_doc},
    {"scored_pivots", scored_pivots, METH_VARARGS, scored_pivots_doc},
    {"scored_pivots_many", scored_pivots_many, METH_VARARGS, scored_pivots_many_doc},
    {"vllm_uniforms", vllm_uniforms, METH_VARARGS, vllm_uniforms_doc},
    {"backend", backend, METH_NOARGS, "Which SHA-256 implementation is in use: 'sha-ni' or 'portable'."},
    {"use_portable", use_portable, METH_VARARGS, "use_portable(flag): force (True) or release (False) portable SHA-256."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "wmark._fastprf",
                                    "Fast exact HMAC-SHA256/Philox pivots (see wmark.prf).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastprf(void) {
#ifdef WMARK_HAVE_SHANI_BUILD
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sha")) {
        compress = compress_shani;
        compress2 = compress_shani_x2;
        using_shani = 1;
    }
#endif
    return PyModule_Create(&module);
}
