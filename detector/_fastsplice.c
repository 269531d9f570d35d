/*
 * wmark.detector._fastsplice: which chunks of a text normalisation may change, read off its
 * tokens (wmark.detector.splice), in one pass in C.
 *
 * The definition is splice._changed_chunks_reference (numpy, over many texts at once); this is
 * the same rule token by token, for the texts of one call one after another.  A text of a few
 * hundred tokens spends most of the numpy version in the per-call overhead of its ~40 array
 * operations, more than the tokenizer spends on the text: here it costs a few microseconds.
 * The tests hold the two equal on random token sequences.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

/* A token's flags (SpliceTables.packed): bit i is splice._FLAGS[i]. */
enum {
    SITE = 1 << 0,
    ENDS_SOLID = 1 << 1,
    STARTS_RUN = 1 << 2,
    ONE_SPACE = 1 << 3,
    LONE_SPACE = 1 << 4,
    STARTS_SOLID = 1 << 5,
    ENDS_LINE = 1 << 6,
    LINE_START = 1 << 7,
    BLANK = 1 << 8,
    OPENS_LINE = 1 << 9,
    CLOSES_LINE = 1 << 10,
    ENDS_SPACE = 1 << 11,
};

typedef struct {
    int64_t *data;
    Py_ssize_t len, cap;
} spans;

static int spans_push(spans *out, int64_t text, int64_t lo, int64_t hi) {
    if (out->len + 3 > out->cap) {
        Py_ssize_t cap = out->cap ? 2 * out->cap : 96;
        int64_t *grown = (int64_t *)realloc(out->data, (size_t)cap * sizeof(int64_t));
        if (!grown) return -1;
        out->data = grown;
        out->cap = cap;
    }
    out->data[out->len++] = text;
    out->data[out->len++] = lo;
    out->data[out->len++] = hi;
    return 0;
}

/* The changed chunks of one text's n flags (each token's), appended to `out` as (text, lo, hi):
 * token spans, end exclusive, touching chunks merged.  A token is a site (its chunk may
 * change) when its own flag says so, when it starts a run of spaces after a non-space that is
 * not one space before a non-space, or when it ends a line of spaces only that spans tokens;
 * a chunk starts at the text's start and at each token after a "\n" that starts a line holding
 * printable ASCII after its indentation (directly, or after one token of spaces). */
static int text_chunks(const uint16_t *f, Py_ssize_t n, int64_t text, spans *out) {
    Py_ssize_t lo = 0, open_lo = -1, open_hi = -1; /* the current chunk; the span not yet written */
    int has_site = 0, after_prev = 0;
    for (Py_ssize_t i = 0; i <= n; i++) {
        int boundary = i == n;
        if (i > 0 && i < n && (f[i - 1] & ENDS_LINE)) {
            boundary = (f[i] & LINE_START) || (i + 1 < n && (f[i] & BLANK) && (f[i + 1] & LINE_START));
        }
        if (boundary) {
            if (has_site) {
                if (open_hi == lo) {
                    open_hi = i;
                } else {
                    if (open_lo >= 0 && spans_push(out, text, open_lo, open_hi) < 0) return -1;
                    open_lo = lo;
                    open_hi = i;
                }
            }
            lo = i;
            has_site = 0;
            if (i == n) break;
        }
        uint16_t cur = f[i];
        int site = (cur & SITE) != 0;
        if (i > 0 && (f[i - 1] & ENDS_SOLID) && (cur & STARTS_RUN)) {
            int lone_ok = i + 1 < n && (cur & LONE_SPACE) && (f[i + 1] & STARTS_SOLID);
            if (!((cur & ONE_SPACE) || lone_ok)) site = 1;
        }
        /* a line of spaces only that spans tokens: "after" holds while the line, after this
         * token, has held only spaces since a line break (or the text's start) */
        int after = (i == 0 || !(cur & BLANK)) ? (cur & (OPENS_LINE | BLANK)) != 0 : after_prev;
        int before = i == 0 || after_prev;
        int after_break = i > 0 && (f[i - 1] & ENDS_LINE);
        int not_empty = (cur & STARTS_RUN) || !(i == 0 || after_break);
        if (before && (cur & CLOSES_LINE) && not_empty) site = 1;
        if (i == n - 1 && after && (cur & ENDS_SPACE)) site = 1;
        after_prev = after;
        has_site |= site;
    }
    if (open_lo >= 0 && spans_push(out, text, open_lo, open_hi) < 0) return -1;
    return 0;
}

PyDoc_STRVAR(changed_chunks_doc,
             "changed_chunks(flags, ids, ends) -> bytes\n\n"
             "The chunks normalisation may change of texts whose token IDs (native-endian uint32) lie\n"
             "end to end in `ids`, text i ending at ends[i] (int64, ascending), read through `flags`\n"
             "(uint16 per token ID: SpliceTables.packed); returns int64 triples (text, lo, hi), token\n"
             "spans relative to each text's start, in order.  IndexError for an ID outside `flags`.");

static PyObject *changed_chunks(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer table, ids, ends;
    if (!PyArg_ParseTuple(args, "y*y*y*", &table, &ids, &ends)) return NULL;
    PyObject *result = NULL;
    spans out = {NULL, 0, 0};
    uint16_t *f = NULL;
    Py_ssize_t n = ids.len / 4, size = table.len / 2, texts = ends.len / 8;
    const int64_t *end = (const int64_t *)ends.buf;
    if (ids.len % 4 || table.len % 2 || ends.len % 8 || (texts && end[texts - 1] != n)) {
        PyErr_SetString(PyExc_ValueError, "uint16 flags, uint32 ids and int64 ends with ends[-1] == len(ids)");
        goto done;
    }
    f = (uint16_t *)malloc((size_t)(n ? n : 1) * sizeof(uint16_t));
    if (!f) {
        PyErr_NoMemory();
        goto done;
    }
    const uint32_t *tok = (const uint32_t *)ids.buf;
    const uint16_t *flags = (const uint16_t *)table.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((Py_ssize_t)tok[i] >= size) {
            PyErr_Format(PyExc_IndexError, "token ID %u outside the splice tables (%zd)", tok[i], size);
            goto done;
        }
        f[i] = flags[tok[i]];
    }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t t = 0, start = 0; t < texts && !failed; t++) {
        if (end[t] < start || end[t] > n) {
            failed = 2;
            break;
        }
        failed = text_chunks(f + start, end[t] - start, t, &out) < 0;
        start = end[t];
    }
    Py_END_ALLOW_THREADS
    if (failed == 2) {
        PyErr_SetString(PyExc_ValueError, "ends must ascend from 0 to len(ids)");
    } else if (failed) {
        PyErr_NoMemory();
    } else {
        result = PyBytes_FromStringAndSize((const char *)out.data, out.len * (Py_ssize_t)sizeof(int64_t));
    }
done:
    free(f);
    free(out.data);
    PyBuffer_Release(&table);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&ends);
    return result;
}

static PyMethodDef methods[] = {
    {"changed_chunks", changed_chunks, METH_VARARGS, changed_chunks_doc},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "wmark.detector._fastsplice",
                                    "The changed chunks of texts, read off their tokens (see splice.py).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastsplice(void) { return PyModule_Create(&module); }
