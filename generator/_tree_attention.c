/*
 * wmark.generator._tree_attention: batch-invariant attention for speculative verification.
 *
 * Each query row attends to exactly the keys its mask row marks visible, in cache order, and
 * every number it computes depends on that row's query and those keys only: the dot products
 * run over the head dimension in a fixed lane pattern, the softmax sums and the weighted sum of
 * values run over the visible keys in order. So a tree row and the same context decoded alone
 * produce identical bits, with no copy of the visible keys and no per-row Python loop (the
 * torch version gathered the keys of every row with index_select and ran two small matmuls per
 * row, ~60 % of a verify row's cost after 700 tokens of context).
 *
 * Two builds: AVX2 + FMA intrinsics, and portable C for other CPUs (and head sizes that are not
 * a multiple of 8). The CPU picks one at import, so within one machine every row runs the same
 * instructions; the two builds round differently (FMA), so a seed's text may differ between them.
 *
 * `rotate` prepares a draft model's attention inputs: the fused q/k/v output split into heads,
 * with the rotary embedding applied, in one call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_fastmath.h"

typedef void (*attend_fn)(const float *, const float *, const float *, const uint8_t *, float *, Py_ssize_t,
                          Py_ssize_t, Py_ssize_t, Py_ssize_t, Py_ssize_t, Py_ssize_t, float, float *, Py_ssize_t *);

/* The visible keys of one mask row, in cache order; returns how many. */
static Py_ssize_t visible_keys(const uint8_t *row, Py_ssize_t nkv, Py_ssize_t *idx) {
    Py_ssize_t n = 0;
    for (Py_ssize_t j = 0; j < nkv; j++)
        if (row[j]) idx[n++] = j;
    return n;
}

/* scores[0..n) -> softmax numerators e^(s - max); returns their sum, taken in key order. */
static inline float softmax_numerators(float *s, Py_ssize_t n) {
    float top = -INFINITY, z = 0.0f;
    for (Py_ssize_t t = 0; t < n; t++)
        if (s[t] > top) top = s[t];
    for (Py_ssize_t t = 0; t < n; t++) s[t] = exp_nonpositive(s[t] - top);
    for (Py_ssize_t t = 0; t < n; t++) z += s[t];
    return z;
}

/*
 * Portable build. q: (heads, nq, dim); k, v: (kv_heads, kv_stride, dim), of which the first nkv
 * keys of each head are used; visible: (nq, nkv), nonzero where visible; out: (nq, heads, dim). scores: nkv floats of scratch, idx: nkv indices.
 * A dot product sums 8 lanes (lane l: elements d = l mod 8, in order) and then the lanes in a
 * fixed tree; values are accumulated key after key.
 */
static void attend_baseline(const float *q, const float *k, const float *v, const uint8_t *visible, float *out,
                            Py_ssize_t heads, Py_ssize_t kv_heads, Py_ssize_t nq, Py_ssize_t nkv,
                            Py_ssize_t kv_stride, Py_ssize_t dim, float scaling, float *scores, Py_ssize_t *idx) {
    const Py_ssize_t group = heads / kv_heads, whole = dim - dim % 8;
    for (Py_ssize_t i = 0; i < nq; i++) {
        const Py_ssize_t n = visible_keys(visible + i * nkv, nkv, idx);
        for (Py_ssize_t head = 0; head < heads; head++) {
            const float *qh = q + (head * nq + i) * dim;
            const float *kh = k + (head / group) * kv_stride * dim, *vh = v + (head / group) * kv_stride * dim;
            for (Py_ssize_t t = 0; t < n; t++) {
                const float *kj = kh + idx[t] * dim;
                float acc[8] = {0};
                for (Py_ssize_t d = 0; d < whole; d += 8)
                    for (int l = 0; l < 8; l++) acc[l] += qh[d + l] * kj[d + l];
                for (Py_ssize_t d = whole; d < dim; d++) acc[d - whole] += qh[d] * kj[d];
                scores[t] = (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) *
                            scaling;
            }
            const float z = softmax_numerators(scores, n);
            float *o = out + (i * heads + head) * dim;
            memset(o, 0, (size_t)dim * sizeof(float));
            for (Py_ssize_t t = 0; t < n; t++) {
                const float *vj = vh + idx[t] * dim, w = scores[t];
                for (Py_ssize_t d = 0; d < dim; d++) o[d] += w * vj[d];
            }
            for (Py_ssize_t d = 0; d < dim; d++) o[d] /= z;
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define WMARK_HAVE_AVX2_BUILD 1
#include <immintrin.h>

/* The 8 lane sums of a[0..8) as one vector (a fixed pairwise tree of horizontal adds). */
__attribute__((target("avx2,fma"))) static inline __m256 lane_sums(const __m256 a[8]) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* `exp_nonpositive` on eight floats (the same steps, with FMA). */
__attribute__((target("avx2,fma"))) static inline __m256 exp8_nonpositive(__m256 x) {
    const __m256 floor = _mm256_set1_ps(-87.0f), rounder = _mm256_set1_ps(12582912.0f);
    const __m256 low = _mm256_max_ps(x, floor);
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(low, _mm256_set1_ps(1.44269504088896341f), rounder), rounder);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), low);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    return _mm256_and_ps(e, _mm256_cmp_ps(x, floor, _CMP_GE_OQ)); /* 0 below -87 */
}

/* `softmax_numerators` for a row padded to a multiple of 8 (the padding is overwritten). */
__attribute__((target("avx2,fma"))) static inline float softmax_numerators8(float *s, Py_ssize_t n) {
    float top = -INFINITY, z = 0.0f;
    for (Py_ssize_t t = 0; t < n; t++)
        if (s[t] > top) top = s[t];
    const __m256 shift = _mm256_set1_ps(top);
    for (Py_ssize_t t = 0; t < n; t += 8)
        _mm256_storeu_ps(s + t, exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + t), shift)));
    for (Py_ssize_t t = 0; t < n; t++) z += s[t];
    return z;
}

/*
 * AVX2 + FMA build, for dim a multiple of 8. The query heads that share a key/value head (GQA)
 * are served together, so that each key and value row is read from memory once per row, not
 * once per query head. Scores: eight keys a pass, each with one 8-lane accumulator over the head
 * dimension (FMA, lane l holds d = l mod 8 in order), reduced by `lane_sums`; the last n mod 8
 * keys one at a time through the same reduction. Values: 64 dimensions of a head a pass, held in
 * registers over a block of keys and accumulated key after key with FMA.
 */
#define KEY_BLOCK 16
#define SCORE_STRIDE(nkv) ((nkv) + 8 - (nkv) % 8) /* a head's scores, padded for 8-wide exp */
__attribute__((target("avx2,fma"))) static void attend_avx2(const float *q, const float *k, const float *v,
                                                            const uint8_t *visible, float *out, Py_ssize_t heads,
                                                            Py_ssize_t kv_heads, Py_ssize_t nq, Py_ssize_t nkv,
                                                            Py_ssize_t kv_stride, Py_ssize_t dim, float scaling,
                                                            float *scores, Py_ssize_t *idx) {
    const Py_ssize_t group = heads / kv_heads, stride = SCORE_STRIDE(nkv);
    const __m256 scale = _mm256_set1_ps(scaling);
    for (Py_ssize_t i = 0; i < nq; i++) {
        const Py_ssize_t n = visible_keys(visible + i * nkv, nkv, idx);
        for (Py_ssize_t h = 0; h < kv_heads; h++) {
            const float *kh = k + h * kv_stride * dim, *vh = v + h * kv_stride * dim;
            Py_ssize_t t = 0;
            for (; t + 8 <= n; t += 8) {
                const float *kj[8];
                for (int j = 0; j < 8; j++) kj[j] = kh + idx[t + j] * dim;
                for (Py_ssize_t g = 0; g < group; g++) {
                    const float *qh = q + ((h * group + g) * nq + i) * dim;
                    __m256 acc[8];
                    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
                    for (Py_ssize_t d = 0; d < dim; d += 8) {
                        const __m256 qd = _mm256_loadu_ps(qh + d);
                        for (int j = 0; j < 8; j++)
                            acc[j] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kj[j] + d), acc[j]);
                    }
                    _mm256_storeu_ps(scores + g * stride + t, _mm256_mul_ps(lane_sums(acc), scale));
                }
            }
            for (; t < n; t++) {
                const float *kj = kh + idx[t] * dim;
                for (Py_ssize_t g = 0; g < group; g++) {
                    const float *qh = q + ((h * group + g) * nq + i) * dim;
                    __m256 acc[8];
                    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
                    for (Py_ssize_t d = 0; d < dim; d += 8)
                        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), _mm256_loadu_ps(kj + d), acc[0]);
                    float sums[8];
                    _mm256_storeu_ps(sums, lane_sums(acc));
                    scores[g * stride + t] = sums[0] * scaling;
                }
            }
            for (Py_ssize_t g = 0; g < group; g++) {
                const float z = softmax_numerators8(scores + g * stride, n);
                memset(out + (i * heads + h * group + g) * dim, 0, (size_t)dim * sizeof(float));
                scores[group * stride + g] = z;
            }
            for (Py_ssize_t c = 0; c < dim; c += 64) {
                const int width = (int)((dim - c < 64 ? dim - c : 64) / 8);
                for (Py_ssize_t u0 = 0; u0 < n; u0 += KEY_BLOCK) {
                    const Py_ssize_t u1 = u0 + KEY_BLOCK < n ? u0 + KEY_BLOCK : n;
                    for (Py_ssize_t g = 0; g < group; g++) {
                        float *o = out + (i * heads + h * group + g) * dim + c;
                        const float *w_g = scores + g * stride;
                        __m256 acc[8];
                        for (int w = 0; w < width; w++) acc[w] = _mm256_loadu_ps(o + 8 * w);
                        for (Py_ssize_t u = u0; u < u1; u++) {
                            const __m256 weight = _mm256_set1_ps(w_g[u]);
                            const float *vj = vh + idx[u] * dim + c;
                            for (int w = 0; w < width; w++)
                                acc[w] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(vj + 8 * w), acc[w]);
                        }
                        for (int w = 0; w < width; w++) _mm256_storeu_ps(o + 8 * w, acc[w]);
                    }
                }
            }
            for (Py_ssize_t g = 0; g < group; g++) {
                float *o = out + (i * heads + h * group + g) * dim;
                const __m256 z = _mm256_set1_ps(scores[group * stride + g]);
                for (Py_ssize_t d = 0; d < dim; d += 8) _mm256_storeu_ps(o + d, _mm256_div_ps(_mm256_loadu_ps(o + d), z));
            }
        }
    }
}
#endif

static attend_fn fast_impl = NULL; /* the AVX2 build where the CPU has it */
static int force_baseline = 0;

static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s buffer", what, writable ? " writable" : "");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(attend_doc,
             "attend(q, k, v, visible, out, heads, kv_heads, nq, nkv, dim, scaling[, kv_stride])\n\n"
             "q: float32 (heads, nq, dim); k, v: float32 (kv_heads, kv_stride, dim) (kv_stride: nkv unless\n"
             "given: a cache with room to grow), of which each head's first nkv keys are read; visible:\n"
             "uint8 (nq, nkv), nonzero where a row sees a key; out: float32 (nq, heads, dim), written.\n"
             "Each row attends to its visible keys in cache order; its result depends on nothing else.\n"
             "Releases the GIL.");

static PyObject *attend(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[5];
    Py_ssize_t heads, kv_heads, nq, nkv, dim, kv_stride = -1;
    float scaling;
    if (!PyArg_ParseTuple(args, "OOOOOnnnnnf|n", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &heads,
                          &kv_heads, &nq, &nkv, &dim, &scaling, &kv_stride))
        return NULL;
    if (kv_stride < 0) kv_stride = nkv;
    if (heads <= 0 || kv_heads <= 0 || heads % kv_heads || nq < 0 || nkv < 0 || kv_stride < nkv ||
        dim <= 0) {
        PyErr_SetString(PyExc_ValueError,
                        "attend: bad shape (heads must be a multiple of kv_heads, kv_stride at least nkv)");
        return NULL;
    }
    static const char *names[5] = {"q", "k", "v", "visible", "out"};
    const Py_ssize_t sizes[5] = {heads * nq * dim * 4, kv_heads * kv_stride * dim * 4, kv_heads * kv_stride * dim * 4,
                                 nq * nkv, nq * heads * dim * 4};
    Py_buffer views[5];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 5; got++) {
        if (get_buffer(objs[got], &views[got], got == 4, names[got]) < 0) goto done;
        if (views[got].len != sizes[got]) {
            PyErr_Format(PyExc_ValueError, "attend: %s holds %zd bytes, the shape needs %zd", names[got],
                         views[got].len, sizes[got]);
            got++;
            goto done;
        }
    }
    {
        const attend_fn impl = fast_impl != NULL && !force_baseline && dim % 8 == 0 ? fast_impl : attend_baseline;
        /* scores and softmax sums of a key/value head's query heads */
        float *scores = malloc((size_t)((heads / kv_heads) * (nkv + 16) + 8) * sizeof(float));
        Py_ssize_t *idx = malloc((size_t)(nkv + 1) * sizeof(Py_ssize_t));
        if (scores == NULL || idx == NULL) {
            free(scores);
            free(idx);
            PyErr_NoMemory();
            goto done;
        }
        Py_BEGIN_ALLOW_THREADS impl((const float *)views[0].buf, (const float *)views[1].buf,
                                           (const float *)views[2].buf, (const uint8_t *)views[3].buf,
                                           (float *)views[4].buf, heads, kv_heads, nq, nkv, kv_stride, dim, scaling,
                                           scores, idx);
        Py_END_ALLOW_THREADS free(scores);
        free(idx);
        result = Py_None;
        Py_INCREF(result);
    }
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    return result;
}

PyDoc_STRVAR(rotate_doc,
             "rotate(qkv, cos, sin, q, k, v, heads, kv_heads, n, dim)\n\n"
             "Split a fused q/k/v projection's output (n, (heads + 2 kv_heads) * dim) into q (heads, n,\n"
             "dim), k and v (kv_heads, n, dim), with the rotary embedding applied to q and k:\n"
             "x * cos + rotate_half(x) * sin, cos and sin (n, dim) per row (rotate_half(x) is\n"
             "(-x[half:], x[:half])). One call instead of ~16 torch ops per layer of a draft model.");

static PyObject *rotate(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[6];
    Py_ssize_t heads, kv_heads, n, dim;
    if (!PyArg_ParseTuple(args, "OOOOOOnnnn", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &heads,
                          &kv_heads, &n, &dim))
        return NULL;
    if (heads <= 0 || kv_heads <= 0 || n < 0 || dim <= 0 || dim % 2) {
        PyErr_SetString(PyExc_ValueError, "rotate: bad shape (dim must be even)");
        return NULL;
    }
    static const char *names[6] = {"qkv", "cos", "sin", "q", "k", "v"};
    const Py_ssize_t width = (heads + 2 * kv_heads) * dim;
    const Py_ssize_t sizes[6] = {n * width * 4, n * dim * 4, n * dim * 4,
                                 heads * n * dim * 4, kv_heads * n * dim * 4, kv_heads * n * dim * 4};
    Py_buffer views[6];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 6; got++) {
        if (get_buffer(objs[got], &views[got], got >= 3, names[got]) < 0) goto done;
        if (views[got].len != sizes[got]) {
            PyErr_Format(PyExc_ValueError, "rotate: %s holds %zd bytes, the shape needs %zd", names[got],
                         views[got].len, sizes[got]);
            got++;
            goto done;
        }
    }
    {
        const float *qkv = views[0].buf, *cos = views[1].buf, *sin = views[2].buf;
        float *outs[3] = {views[3].buf, views[4].buf, views[5].buf};
        const Py_ssize_t counts[3] = {heads, kv_heads, kv_heads}, half = dim / 2;
        Py_BEGIN_ALLOW_THREADS;
        for (Py_ssize_t r = 0; r < n; r++) {
            const float *x = qkv + r * width, *c = cos + r * dim, *s = sin + r * dim;
            for (int part = 0; part < 3; part++) {
                for (Py_ssize_t h = 0; h < counts[part]; h++, x += dim) {
                    float *o = outs[part] + (h * n + r) * dim;
                    if (part == 2) { /* values are not rotated */
                        memcpy(o, x, (size_t)dim * sizeof(float));
                        continue;
                    }
                    for (Py_ssize_t j = 0; j < half; j++) o[j] = x[j] * c[j] + (-x[j + half]) * s[j];
                    for (Py_ssize_t j = half; j < dim; j++) o[j] = x[j] * c[j] + x[j - half] * s[j];
                }
            }
        }
        Py_END_ALLOW_THREADS;
        result = Py_None;
        Py_INCREF(result);
    }
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    return result;
}

static PyObject *backend(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyUnicode_FromString(fast_impl != NULL && !force_baseline ? "avx2" : "baseline");
}

static PyObject *use_baseline(PyObject *self, PyObject *args) {
    (void)self;
    int flag;
    if (!PyArg_ParseTuple(args, "p", &flag)) return NULL;
    force_baseline = flag;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"attend", attend, METH_VARARGS, attend_doc},
    {"rotate", rotate, METH_VARARGS, rotate_doc},
    {"backend", backend, METH_NOARGS, "Which build of the kernel runs here: 'avx2' or 'baseline'."},
    {"use_baseline", use_baseline, METH_VARARGS,
     "use_baseline(flag): force (True) or release (False) the portable build (for tests)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "wmark.generator._tree_attention",
                                    "Batch-invariant tree attention (see wmark.generator.rowwise).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__tree_attention(void) {
#ifdef WMARK_HAVE_AVX2_BUILD
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        fast_impl = attend_avx2;
    }
#endif
    return PyModule_Create(&module);
}
