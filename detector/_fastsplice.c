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
#include <string.h>

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

/* The changed chunks of the texts whose token IDs lie end to end in `ids` (text t ending at
 * end[t]), as triples in `out`; with `byte_len` (bytes per token ID, may be NULL), also each
 * text's byte length in totals[t] and the byte offsets of each span (relative to its text's
 * start) in `bytes_out` as pairs.  Returns 0, -1 out of memory, -2 for bad `end`, -3 for an ID
 * outside the tables (its index in *bad). */
static int scan_texts(const uint16_t *flags, Py_ssize_t size, const int64_t *byte_len, const uint32_t *tok,
                      Py_ssize_t n, const int64_t *end, Py_ssize_t texts, spans *out, int64_t *totals,
                      int64_t **bytes_out, Py_ssize_t *bad) {
    uint16_t *f = (uint16_t *)malloc((size_t)(n ? n : 1) * sizeof(uint16_t));
    int64_t *cum = byte_len ? (int64_t *)malloc((size_t)(n + 1) * sizeof(int64_t)) : NULL;
    int status = 0;
    if (!f || (byte_len && !cum)) {
        status = -1;
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((Py_ssize_t)tok[i] >= size) {
            *bad = i;
            status = -3;
            goto done;
        }
        f[i] = flags[tok[i]];
    }
    if (cum) {
        cum[0] = 0;
        for (Py_ssize_t i = 0; i < n; i++) cum[i + 1] = cum[i] + byte_len[tok[i]];
    }
    for (Py_ssize_t t = 0, start = 0; t < texts; t++) {
        if (end[t] < start || end[t] > n) {
            status = -2;
            goto done;
        }
        if (text_chunks(f + start, end[t] - start, t, out) < 0) {
            status = -1;
            goto done;
        }
        if (cum) totals[t] = cum[end[t]] - cum[start];
        start = end[t];
    }
    if (cum) {
        Py_ssize_t spans_found = out->len / 3, first = 0;
        int64_t *pairs = (int64_t *)malloc((size_t)(2 * spans_found + 1) * sizeof(int64_t));
        if (!pairs) {
            status = -1;
            goto done;
        }
        for (Py_ssize_t i = 0; i < spans_found; i++) {
            int64_t text = out->data[3 * i];
            first = text ? end[text - 1] : 0;
            pairs[2 * i] = cum[first + out->data[3 * i + 1]] - cum[first];
            pairs[2 * i + 1] = cum[first + out->data[3 * i + 2]] - cum[first];
        }
        *bytes_out = pairs;
    }
done:
    free(f);
    free(cum);
    return status;
}

static int check_buffers(Py_buffer *table, Py_buffer *ids, Py_buffer *ends) {
    Py_ssize_t n = ids->len / 4, texts = ends->len / 8;
    const int64_t *end = (const int64_t *)ends->buf;
    if (ids->len % 4 || table->len % 2 || ends->len % 8 || (texts && end[texts - 1] != n)) {
        PyErr_SetString(PyExc_ValueError, "uint16 flags, uint32 ids and int64 ends with ends[-1] == len(ids)");
        return -1;
    }
    return 0;
}

static void raise_scan_error(int status, const uint32_t *tok, Py_ssize_t bad, Py_ssize_t size) {
    if (status == -2) {
        PyErr_SetString(PyExc_ValueError, "ends must ascend from 0 to len(ids)");
    } else if (status == -3) {
        PyErr_Format(PyExc_IndexError, "token ID %u outside the splice tables (%zd)", tok[bad], size);
    } else {
        PyErr_NoMemory();
    }
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
    if (check_buffers(&table, &ids, &ends) == 0) {
        Py_ssize_t bad = 0, size = table.len / 2;
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = scan_texts((const uint16_t *)table.buf, size, NULL, (const uint32_t *)ids.buf, ids.len / 4,
                            (const int64_t *)ends.buf, ends.len / 8, &out, NULL, NULL, &bad);
        Py_END_ALLOW_THREADS
        if (status == 0) {
            result = PyBytes_FromStringAndSize((const char *)out.data, out.len * (Py_ssize_t)sizeof(int64_t));
        } else {
            raise_scan_error(status, (const uint32_t *)ids.buf, bad, size);
        }
    }
    free(out.data);
    PyBuffer_Release(&table);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&ends);
    return result;
}

PyDoc_STRVAR(changed_spans_doc,
             "changed_spans(flags, byte_len, ids, ends) -> (bytes, bytes)\n\n"
             "changed_chunks with the bytes: int64 quintuples (text, lo, hi, byte_lo, byte_hi), the\n"
             "token spans and their byte offsets in the text (the sum of `byte_len`, int64 per token\n"
             "ID, over the tokens before), and each text's byte length (int64 per text).");

static PyObject *changed_spans(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer table, lengths, ids, ends;
    if (!PyArg_ParseTuple(args, "y*y*y*y*", &table, &lengths, &ids, &ends)) return NULL;
    PyObject *result = NULL, *found = NULL, *totals = NULL;
    spans out = {NULL, 0, 0};
    int64_t *pairs = NULL;
    if (check_buffers(&table, &ids, &ends) == 0) {
        Py_ssize_t bad = 0, size = table.len / 2, texts = ends.len / 8;
        if (lengths.len != 8 * size) {
            PyErr_SetString(PyExc_ValueError, "byte_len must hold one int64 per token ID of flags");
            goto done;
        }
        totals = PyBytes_FromStringAndSize(NULL, 8 * texts);
        if (!totals) goto done;
        int64_t *total = (int64_t *)PyBytes_AS_STRING(totals);
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = scan_texts((const uint16_t *)table.buf, size, (const int64_t *)lengths.buf,
                            (const uint32_t *)ids.buf, ids.len / 4, (const int64_t *)ends.buf, texts, &out,
                            total, &pairs, &bad);
        Py_END_ALLOW_THREADS
        if (status != 0) {
            raise_scan_error(status, (const uint32_t *)ids.buf, bad, size);
            goto done;
        }
        Py_ssize_t count = out.len / 3;
        found = PyBytes_FromStringAndSize(NULL, 5 * 8 * count);
        if (!found) goto done;
        int64_t *dst = (int64_t *)PyBytes_AS_STRING(found);
        for (Py_ssize_t i = 0; i < count; i++) {
            memcpy(dst + 5 * i, out.data + 3 * i, 3 * sizeof(int64_t));
            memcpy(dst + 5 * i + 3, pairs + 2 * i, 2 * sizeof(int64_t));
        }
        result = PyTuple_Pack(2, found, totals);
    }
done:
    Py_XDECREF(found);
    Py_XDECREF(totals);
    free(out.data);
    free(pairs);
    PyBuffer_Release(&table);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&ends);
    return result;
}

static PyMethodDef methods[] = {
    {"changed_chunks", changed_chunks, METH_VARARGS, changed_chunks_doc},
    {"changed_spans", changed_spans, METH_VARARGS, changed_spans_doc},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "wmark.detector._fastsplice",
                                    "The changed chunks of texts, read off their tokens (see splice.py).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastsplice(void) { return PyModule_Create(&module); }
