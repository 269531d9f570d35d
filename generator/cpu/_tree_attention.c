/*
 * wmark.generator.cpu._tree_attention: batch-invariant attention for speculative verification.
 *
 * Each query row attends to exactly the keys its mask row marks visible, in cache order, and
 * every number it computes depends on that row's query and those keys only: the dot products
 * run over the head dimension in a fixed lane pattern, the softmax sums and the weighted sum of
 * values run over the visible keys in order. So a tree row and the same context decoded alone
 * produce identical bits, with no copy of the visible keys and no per-row Python loop (the
 * torch version gathered the keys of every row with index_select and ran two small matmuls per
 * row, ~60 % of a verify row's cost after 700 tokens of context).
 *
 * The unit of work is one row and one key/value head (the query heads that share it): units
 * run on the int8 GEMM's worker pool (`_pool_api.h`) when a call has enough of them, and a
 * unit's numbers do not depend on the thread that computed it.
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
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_fastmath.h"
#include "_pool_api.h"

/* One call's shapes and buffers. q: (heads, nq, dim); k, v: (kv_heads, kv_stride, dim), of which
 * the first nkv keys of each head are used; out: (nq, heads, dim). Row i sees count[i] keys, at
 * the positions idx[i * nkv ...]. */
typedef struct {
    const float *q, *k, *v;
    float *out;
    Py_ssize_t heads, kv_heads, nq, nkv, kv_stride, dim;
    float scaling;
    const Py_ssize_t *idx, *count;
    int fast;       /* run the AVX2 build */
    atomic_int failed; /* a chunk could not get its scratch */
} attend_job_t;

/* One unit: row i and key/value head h. scores: the unit's scratch (`SCRATCH_FLOATS`). */
typedef void (*unit_fn)(const attend_job_t *job, Py_ssize_t i, Py_ssize_t h, float *scores);

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
 * Portable build: each query head of the unit in turn. A dot product sums 8 lanes (lane l:
 * elements d = l mod 8, in order) and then the lanes in a fixed tree; values are accumulated
 * key after key.
 */
static void unit_baseline(const attend_job_t *job, Py_ssize_t i, Py_ssize_t h, float *scores) {
    const Py_ssize_t dim = job->dim, group = job->heads / job->kv_heads, whole = dim - dim % 8;
    const Py_ssize_t n = job->count[i], *idx = job->idx + i * job->nkv;
    const float *kh = job->k + h * job->kv_stride * dim, *vh = job->v + h * job->kv_stride * dim;
    for (Py_ssize_t head = h * group; head < (h + 1) * group; head++) {
        const float *qh = job->q + (head * job->nq + i) * dim;
        for (Py_ssize_t t = 0; t < n; t++) {
            const float *kj = kh + idx[t] * dim;
            float acc[8] = {0};
            for (Py_ssize_t d = 0; d < whole; d += 8)
                for (int l = 0; l < 8; l++) acc[l] += qh[d + l] * kj[d + l];
            for (Py_ssize_t d = whole; d < dim; d++) acc[d - whole] += qh[d] * kj[d];
            scores[t] = (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) *
                        job->scaling;
        }
        const float z = softmax_numerators(scores, n);
        float *o = job->out + (i * job->heads + head) * dim;
        memset(o, 0, (size_t)dim * sizeof(float));
        for (Py_ssize_t t = 0; t < n; t++) {
            const float *vj = vh + idx[t] * dim, w = scores[t];
            for (Py_ssize_t d = 0; d < dim; d++) o[d] += w * vj[d];
        }
        for (Py_ssize_t d = 0; d < dim; d++) o[d] /= z;
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
__attribute__((target("avx2,fma"))) static void unit_avx2(const attend_job_t *job, Py_ssize_t i, Py_ssize_t h,
                                                          float *scores) {
    const Py_ssize_t dim = job->dim, group = job->heads / job->kv_heads, stride = SCORE_STRIDE(job->nkv);
    const Py_ssize_t heads = job->heads, nq = job->nq, n = job->count[i], *idx = job->idx + i * job->nkv;
    const float *q = job->q, scaling = job->scaling;
    float *out = job->out;
    const __m256 scale = _mm256_set1_ps(scaling);
    const float *kh = job->k + h * job->kv_stride * dim, *vh = job->v + h * job->kv_stride * dim;
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
#endif

static unit_fn fast_impl = NULL; /* the AVX2 build where the CPU has it */
static int force_baseline = 0;
static const wmark_pool_api *pool = NULL; /* the GEMM's worker pool, NULL where it did not load */

/* A call's units go to the pool from this many multiply-adds of their dot products (each row's
 * visible keys x heads x dim): below it, waking the workers costs more than they save. */
#define PARALLEL_WORK 65536

/* Scratch of a unit: its query heads' scores, padded for 8-wide exp, then their softmax sums. */
#define SCRATCH_FLOATS(job) ((size_t)(((job)->heads / (job)->kv_heads) * ((job)->nkv + 16) + 8))

/* Units first .. last of a call, unit u being row u / kv_heads and key/value head u % kv_heads. */
static void attend_units(void *arg, Py_ssize_t first, Py_ssize_t last) {
    attend_job_t *job = arg;
    float *scores = malloc(SCRATCH_FLOATS(job) * sizeof(float));
    if (scores == NULL) {
        atomic_store(&job->failed, 1);
        return;
    }
    const unit_fn unit = job->fast ? fast_impl : unit_baseline;
    for (Py_ssize_t u = first; u < last; u++) unit(job, u / job->kv_heads, u % job->kv_heads, scores);
    free(scores);
}

static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s buffer", what, writable ? " writable" : "");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(attend_doc,
             "attend(q, k, v, visible, out, heads, kv_heads, nq, nkv, dim, scaling[, kv_stride[, threads]])\n\n"
             "q: float32 (heads, nq, dim); k, v: float32 (kv_heads, kv_stride, dim) (kv_stride: nkv unless\n"
             "given: a cache with room to grow), of which each head's first nkv keys are read; visible:\n"
             "uint8 (nq, nkv), nonzero where a row sees a key; out: float32 (nq, heads, dim), written.\n"
             "Each row attends to its visible keys in cache order; its result depends on nothing else.\n"
             "threads (default 1): the (row, key/value head) units of a large enough call run on that many\n"
             "threads of the int8 GEMM's pool, with the same result. Releases the GIL.");

static PyObject *attend(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[5];
    Py_ssize_t heads, kv_heads, nq, nkv, dim, kv_stride = -1;
    float scaling;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "OOOOOnnnnnf|ni", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &heads,
                          &kv_heads, &nq, &nkv, &dim, &scaling, &kv_stride, &threads))
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
        /* every row's visible keys, listed once for all its heads */
        Py_ssize_t *idx = malloc((size_t)(nq * nkv + 1) * sizeof(Py_ssize_t));
        Py_ssize_t *count = malloc((size_t)(nq + 1) * sizeof(Py_ssize_t));
        if (idx == NULL || count == NULL) {
            free(idx);
            free(count);
            PyErr_NoMemory();
            goto done;
        }
        attend_job_t job = {views[0].buf, views[1].buf, views[2].buf, views[4].buf, heads, kv_heads, nq, nkv,
                            kv_stride, dim, scaling, idx, count, fast_impl != NULL && !force_baseline && dim % 8 == 0, 0};
        Py_BEGIN_ALLOW_THREADS;
        Py_ssize_t work = 0;
        for (Py_ssize_t i = 0; i < nq; i++) {
            count[i] = visible_keys((const uint8_t *)views[3].buf + i * nkv, nkv, idx + i * nkv);
            work += count[i];
        }
        if (pool != NULL && threads > 1 && work * heads * dim >= PARALLEL_WORK)
            pool->parallel_for(attend_units, &job, nq * kv_heads, threads);
        else
            attend_units(&job, 0, nq * kv_heads);
        Py_END_ALLOW_THREADS;
        free(idx);
        free(count);
        if (atomic_load(&job.failed)) {
            PyErr_NoMemory();
            goto done;
        }
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

static PyObject *pooled(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyBool_FromLong(pool != NULL);
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
    {"pooled", pooled, METH_NOARGS, "Whether calls with threads > 1 can use the int8 GEMM's worker pool."},
    {"use_baseline", use_baseline, METH_VARARGS,
     "use_baseline(flag): force (True) or release (False) the portable build (for tests)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "wmark.generator.cpu._tree_attention",
                                    "Batch-invariant tree attention (see wmark.generator.cpu.rowwise).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__tree_attention(void) {
#ifdef WMARK_HAVE_AVX2_BUILD
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        fast_impl = unit_avx2;
    }
#endif
    /* (PyCapsule_Import would look the module up as attributes of its parents, which a
     * package that is still importing does not have yet) */
    PyObject *gemm = PyImport_ImportModule("wmark.generator.cpu._int8_gemm");
    PyObject *capsule = gemm != NULL ? PyObject_GetAttrString(gemm, "_pool_api") : NULL;
    pool = capsule != NULL ? PyCapsule_GetPointer(capsule, WMARK_POOL_CAPSULE) : NULL;
    Py_XDECREF(capsule); /* the module keeps the capsule, and its pointer, alive */
    Py_XDECREF(gemm);
    if (pool == NULL) PyErr_Clear(); /* then every call runs on the calling thread */
    return PyModule_Create(&module);
}
