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
#endif

typedef void (*compress_fn)(uint32_t *, const uint8_t *);
static compress_fn compress = compress_portable;
static int using_shani = 0;

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
static inline double seed_uniform(const uint8_t seed[32], uint32_t token, uint32_t arrival) {
    uint32_t ctr[4] = {token, arrival, load_le32(seed + 8), load_le32(seed + 12)};
    philox4x32_10(ctr, load_le32(seed), load_le32(seed + 4));
    uint64_t x = ((uint64_t)ctr[1] << 20) | ((uint64_t)ctr[0] >> 12);
    return ((double)x + 0.5) * (1.0 / 4503599627370496.0);
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

/* Open addressing over row indices: the table of first_occurrence and scored_pivots. */
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

PyDoc_STRVAR(scored_pivots_doc,
             "scored_pivots(key, prefix, ids, width, start) -> (bytes, bytes)\n\n"
             "The scored positions of a native-endian uint32 token sequence under window labels of\n"
             "`width` IDs with dedup v1 (each t >= max(width, start) whose window ids[t - width : t]\n"
             "did not occur at an earlier such t), as int64, and U(ids[t], 1) under the seed\n"
             "HMAC-SHA256(key, prefix || be32(window)) of each, as float64: scored_positions and\n"
             "pivots in one pass.");

static PyObject *scored_pivots(PyObject *self, PyObject *args) {
    (void)self;
    seed_job job;
    Py_ssize_t start;
    memset(&job, 0, sizeof job);
    if (!PyArg_ParseTuple(args, "y*y*y*nn", &job.key, &job.prefix, &job.rows, &job.width, &start)) {
        seed_job_close(&job, NULL);
        return NULL;
    }
    if (job.key.len > 64 || job.width <= 0 || job.rows.len % 4 != 0 || start < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "key of at most 64 bytes, uint32 ids, width >= 1 and start >= 0 expected");
        seed_job_close(&job, NULL);
        return NULL;
    }
    Py_ssize_t n = job.rows.len / 4, first = job.width > start ? job.width : start;
    Py_ssize_t m = n > first ? n - first : 0;
    job.stride = 1;
    job.msg_len = (size_t)job.prefix.len + 4 * (size_t)job.width;
    job.msg = (uint8_t *)malloc(job.msg_len);
    size_t cap = row_table_capacity(m);
    int64_t *table = (int64_t *)malloc(cap * sizeof(int64_t));
    PyObject *positions = PyBytes_FromStringAndSize(NULL, m * 8);
    PyObject *pivots_out = PyBytes_FromStringAndSize(NULL, m * 8);
    PyObject *result = NULL;
    if (!job.msg || !table) PyErr_NoMemory();
    if (job.msg && table && positions && pivots_out) {
        memcpy(job.msg, job.prefix.buf, job.prefix.len);
        key_midstates((const uint8_t *)job.key.buf, (size_t)job.key.len, job.istate, job.ostate);
        int64_t *pos = (int64_t *)PyBytes_AS_STRING(positions);
        double *piv = (double *)PyBytes_AS_STRING(pivots_out);
        const uint32_t *ids = (const uint32_t *)job.rows.buf;
        Py_ssize_t count = 0;
        Py_BEGIN_ALLOW_THREADS
        uint8_t seed[32];
        for (size_t s = 0; s < cap; s++) table[s] = -1;
        for (Py_ssize_t t = first; t < n; t++) {
            /* the window of t is ids[t - width : t]: row t - width of the sequence read with stride 1 */
            if (!row_is_new(table, cap, ids, 1, ids + t - job.width, job.width, t - job.width)) continue;
            seed_for_row(&job, t - job.width, seed);
            pos[count] = t;
            piv[count] = seed_uniform(seed, ids[t], 1);
            count++;
        }
        Py_END_ALLOW_THREADS
        if (_PyBytes_Resize(&positions, count * 8) == 0 && _PyBytes_Resize(&pivots_out, count * 8) == 0) {
            result = PyTuple_Pack(2, positions, pivots_out);
        }
    }
    free(table);
    Py_XDECREF(positions);
    Py_XDECREF(pivots_out);
    seed_job_close(&job, NULL);
    return result;
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
        using_shani = 0;
    } else {
#ifdef WMARK_HAVE_SHANI_BUILD
        if (__builtin_cpu_supports("sha")) {
            compress = compress_shani;
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
        using_shani = 1;
    }
#endif
    return PyModule_Create(&module);
}
