/*
 * wmark.generator.cpu._topk: the k largest logits of each row, for the samplers' supports.
 *
 * torch.topk over a 151,936-token vocabulary took ~0.3 ms a row on a 2-core Xeon, and a
 * speculative block asks for it on every drafted and verified row (~3 % of a block). Here one
 * pass per row keeps the k best so far in a min-heap: most entries fail one comparison with the
 * heap's minimum (the AVX2 build compares eight at a time and skips groups without a candidate),
 * then the k are sorted. Order: larger value first, ties by smaller token ID, so the result
 * depends on the row alone. Logits hold no NaN (their order would be undefined); -inf entries
 * come last, smallest IDs first, as any entries do.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define WMARK_X86 1
#endif

typedef struct {
    float value;
    int64_t id;
} entry_t;

/* a ranks before b: a larger value, or the same value and a smaller id */
static inline int ahead(const entry_t *a, const entry_t *b) {
    return a->value > b->value || (a->value == b->value && a->id < b->id);
}

/* Min-heap on rank: the root is the entry every other one ranks before. */
static void sift_down(entry_t *heap, Py_ssize_t k, Py_ssize_t i) {
    for (;;) {
        Py_ssize_t last = i;
        const Py_ssize_t l = 2 * i + 1, r = l + 1;
        if (l < k && ahead(&heap[last], &heap[l])) last = l;
        if (r < k && ahead(&heap[last], &heap[r])) last = r;
        if (last == i) return;
        const entry_t t = heap[i];
        heap[i] = heap[last];
        heap[last] = t;
        i = last;
    }
}

/* Entry j of the row replaces the heap's root if it ranks before it. */
static inline void offer(entry_t *heap, Py_ssize_t k, float value, Py_ssize_t j) {
    const entry_t e = {value, (int64_t)j};
    if (ahead(&e, &heap[0])) {
        heap[0] = e;
        sift_down(heap, k, 0);
    }
}

/* Offer row[first .. last) (ids are positions in the row). An entry below the root's value
 * cannot rank before it; one equal to it can (a smaller id), so the filter is "not below". */
static void scan(const float *row, Py_ssize_t first, Py_ssize_t last, entry_t *heap, Py_ssize_t k) {
    for (Py_ssize_t j = first; j < last; j++)
        if (!(row[j] < heap[0].value)) offer(heap, k, row[j], j);
}

#ifdef WMARK_X86
__attribute__((target("avx2"))) static void scan_avx2(const float *row, Py_ssize_t first, Py_ssize_t last,
                                                      entry_t *heap, Py_ssize_t k) {
    Py_ssize_t j = first;
    for (; j + 8 <= last; j += 8) {
        const __m256 x = _mm256_loadu_ps(row + j);
        const int hits = _mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_set1_ps(heap[0].value), _CMP_GE_OQ));
        if (hits) scan(row, j, j + 8, heap, k); /* the root may rise within the group: check each */
    }
    scan(row, j, last, heap, k);
}
#endif

static int have_avx2 = 0;

static int by_rank(const void *a, const void *b) {
    const entry_t *x = a, *y = b;
    return ahead(x, y) ? -1 : ahead(y, x) ? 1 : 0;
}

/* The k (<= n) best entries of row[0..n), in rank order. */
static void top_row(const float *row, Py_ssize_t n, Py_ssize_t k, entry_t *heap, int vector) {
    for (Py_ssize_t j = 0; j < k; j++) heap[j] = (entry_t){row[j], (int64_t)j};
    for (Py_ssize_t i = k / 2 - 1; i >= 0; i--) sift_down(heap, k, i);
#ifdef WMARK_X86
    if (vector)
        scan_avx2(row, k, n, heap, k);
    else
#endif
        scan(row, k, n, heap, k);
    (void)vector;
    qsort(heap, (size_t)k, sizeof(entry_t), by_rank);
}

static int force_portable = 0;

PyDoc_STRVAR(top_k_doc,
             "top_k(logits, values, ids, rows, vocab, k)\n\n"
             "logits: float32 (rows, vocab); values: float32 (rows, k) and ids: int64 (rows, k), written:\n"
             "each row's k largest entries, larger first, ties by smaller id (k <= vocab). Releases the GIL.");

static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *name, Py_ssize_t need) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Format(PyExc_TypeError, "top_k: %s must be a C-contiguous%s buffer", name, writable ? " writable" : "");
        return -1;
    }
    if (view->len != need) {
        PyErr_Format(PyExc_ValueError, "top_k: %s holds %zd bytes, the shape needs %zd", name, view->len, need);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *top_k(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[3];
    Py_ssize_t rows, vocab, k;
    if (!PyArg_ParseTuple(args, "OOOnnn", &objs[0], &objs[1], &objs[2], &rows, &vocab, &k)) return NULL;
    if (rows < 0 || vocab <= 0 || k <= 0 || k > vocab) {
        PyErr_SetString(PyExc_ValueError, "top_k: bad shape (0 < k <= vocab)");
        return NULL;
    }
    static const char *names[3] = {"logits", "values", "ids"};
    const Py_ssize_t need[3] = {rows * vocab * 4, rows * k * 4, rows * k * 8};
    Py_buffer views[3];
    int got = 0;
    for (; got < 3; got++)
        if (get_buffer(objs[got], &views[got], got > 0, names[got], need[got]) < 0) break;
    PyObject *result = NULL;
    if (got == 3) {
        entry_t *heap = malloc((size_t)k * sizeof(entry_t));
        if (heap == NULL) {
            PyErr_NoMemory();
        } else {
            const float *logits = views[0].buf;
            float *values = views[1].buf;
            int64_t *ids = views[2].buf;
            const int vector = have_avx2 && !force_portable;
            Py_BEGIN_ALLOW_THREADS;
            for (Py_ssize_t r = 0; r < rows; r++) {
                top_row(logits + r * vocab, vocab, k, heap, vector);
                for (Py_ssize_t i = 0; i < k; i++) {
                    values[r * k + i] = heap[i].value;
                    ids[r * k + i] = heap[i].id;
                }
            }
            Py_END_ALLOW_THREADS;
            free(heap);
            result = Py_None;
            Py_INCREF(result);
        }
    }
    for (int i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    return result;
}

static PyObject *use_portable(PyObject *self, PyObject *args) {
    (void)self;
    int flag;
    if (!PyArg_ParseTuple(args, "p", &flag)) return NULL;
    force_portable = flag;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"top_k", top_k, METH_VARARGS, top_k_doc},
    {"use_portable", use_portable, METH_VARARGS,
     "use_portable(flag): force (True) or release (False) the portable scan (for tests)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "wmark.generator.cpu._topk",
                                    "The k largest logits of each row (see wmark.generator.logits).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__topk(void) {
#ifdef WMARK_X86
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
#endif
    return PyModule_Create(&module);
}
