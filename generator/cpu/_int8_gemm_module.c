/*
 * wmark.generator.cpu._int8_gemm's Python interface (see _int8_gemm.h for the module and its
 * files): the methods' argument checks and buffers, linear()'s choice of build and its two
 * phases on the pool (rows, then tiles), the settings a process may change (the build, the
 * prefetch, the pool's wait policy and CPUs), and PyInit__int8_gemm, which picks the fastest
 * build this CPU runs and offers the pool to the other kernels (the capsule of _pool_api.h).
 * The only file that touches Python objects; the others work on plain buffers, GIL released.
 */
#include "_int8_gemm.h"

#include <stdlib.h>

#define PARALLEL_ROWS_ELEMENTS 16384 /* a call's rows phase runs on the pool from this many elements */

static const char *backend_names[] = {"portable", "avx2", "avx512vnni", "amx"};
static int best_backend = PORTABLE; /* what this CPU runs */
static int active_backend = PORTABLE; /* what runs now (tests may force a slower one) */

static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *name, Py_ssize_t need) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Format(PyExc_TypeError, "%s: a C-contiguous%s buffer is required", name, writable ? " writable" : "");
        return -1;
    }
    if (need >= 0 && view->len != need) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, the shape needs %zd", name, view->len, need);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(pack4_doc,
             "pack4(packed, packed4, colsum4, step, n, k)\n\n"
             "Re-quantise the packed 8-bit weights of an (n, k) layer to 4 bits per output channel\n"
             "(weight / step, rounded half to even, clamped to [-8, 7]; step = max(peak, 1) / 7): write them\n"
             "into packed4 (uint8, packed_size(n, k) / 2 bytes), their sums into colsum4 (int32, 32 x\n"
             "ceil(n / 32)) and each channel's step into step (float32, 32 x ceil(n / 32)).");

static PyObject *pack4(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[4];
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "OOOOnn", &objs[0], &objs[1], &objs[2], &objs[3], &n, &k)) return NULL;
    if (n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "pack4: n and k must be positive");
        return NULL;
    }
    const Py_ssize_t need[4] = {tiles_of(n) * groups_of(k) * GROUP, tiles_of(n) * groups_of(k) * GROUP4,
                                tiles_of(n) * TILE * 4, tiles_of(n) * TILE * 4};
    static const char *names[4] = {"packed", "packed4", "colsum4", "step"};
    Py_buffer views[4];
    int got = 0;
    for (; got < 4; got++)
        if (get_buffer(objs[got], &views[got], got > 0, names[got], need[got]) < 0) break;
    if (got == 4) {
        Py_BEGIN_ALLOW_THREADS wmark_pack4_tiles(views[0].buf, views[1].buf, views[2].buf, views[3].buf, n, k);
        Py_END_ALLOW_THREADS
    }
    for (int i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    if (got < 4) return NULL;
    Py_RETURN_NONE;
}

static PyObject *packed_size(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "nn", &n, &k)) return NULL;
    if (n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "packed_size: n and k must be positive");
        return NULL;
    }
    return PyLong_FromSsize_t(tiles_of(n) * groups_of(k) * GROUP);
}

PyDoc_STRVAR(pack_doc,
             "pack(weight, packed, colsum, n, k)\n\n"
             "Write weight (int8, (n, k)) into packed (uint8, packed_size(n, k) bytes, zeroed beforehand)\n"
             "and each channel's weight sum into colsum (int32, 32 x ceil(n / 32), zeroed beforehand).");

/* scale_cols: 0 (a scale per channel) or a positive multiple of 4; else a ValueError. */
static int check_scale_cols(Py_ssize_t scale_cols, const char *name) {
    if (scale_cols == 0 || (scale_cols > 0 && scale_cols % 4 == 0)) return 0;
    PyErr_Format(PyExc_ValueError, "%s: scale_cols must be 0 or a positive multiple of 4, got %zd", name, scale_cols);
    return -1;
}

static PyObject *pack(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[3];
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "OOOnn", &objs[0], &objs[1], &objs[2], &n, &k)) return NULL;
    if (n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "pack: n and k must be positive");
        return NULL;
    }
    Py_buffer w, p, s;
    if (get_buffer(objs[0], &w, 0, "weight", n * k) < 0) return NULL;
    if (get_buffer(objs[1], &p, 1, "packed", tiles_of(n) * groups_of(k) * GROUP) < 0) {
        PyBuffer_Release(&w);
        return NULL;
    }
    if (get_buffer(objs[2], &s, 1, "colsum", tiles_of(n) * TILE * 4) < 0) {
        PyBuffer_Release(&w);
        PyBuffer_Release(&p);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS wmark_pack_rows(w.buf, p.buf, s.buf, n, k);
    Py_END_ALLOW_THREADS PyBuffer_Release(&w);
    PyBuffer_Release(&p);
    PyBuffer_Release(&s);
    Py_RETURN_NONE;
}

static PyObject *unpack(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[2];
    Py_ssize_t n, k;
    if (!PyArg_ParseTuple(args, "OOnn", &objs[0], &objs[1], &n, &k)) return NULL;
    if (n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "unpack: bad shape");
        return NULL;
    }
    Py_buffer p, w;
    if (get_buffer(objs[0], &p, 0, "packed", tiles_of(n) * groups_of(k) * GROUP) < 0) return NULL;
    if (get_buffer(objs[1], &w, 1, "weight", n * k) < 0) {
        PyBuffer_Release(&p);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS wmark_unpack_rows(p.buf, w.buf, n, k);
    Py_END_ALLOW_THREADS PyBuffer_Release(&p);
    PyBuffer_Release(&w);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(linear_doc,
             "linear(x, packed, colsum, scale, bias, out, m, n, k, threads[, prologue, norm, eps, activations,\n"
             "scale_cols])\n\n"
             "out = the exact int8 linear layer of x: float32 (m, k) rows, each quantised with its own\n"
             "peak; packed/colsum from pack(); scale: float32 (n); bias: float32 (n) or None; out: float32\n"
             "(m, n), written. Runs on `threads` threads (this module's own), releasing the GIL.\n"
             "prologue 1: the rows multiplied are RMSNorm(x) * norm (float32 (k)) with epsilon eps;\n"
             "prologue 2: x is (m, 2k), gate then up, and the rows are silu(gate) * up.\n"
             "activations 1 (two parts): each row is also multiplied as what its quantisation left (the\n"
             "row minus its int8 value, quantised with its own peak) and the two outputs are added:\n"
             "~16-bit activations for twice the rows' arithmetic, the weights still read once.\n"
             "activations 2 (outliers): each row's 16 largest channels by magnitude (ties: the lower\n"
             "channel) are multiplied in float32 and the rest as one int8 part (8-bit weights only).\n"
             "scale_cols (8-bit weights only; a positive multiple of 4): a scale per channel and block of\n"
             "that many columns: scale is float32 (ceil(n / 32), blocks = ceil(k / scale_cols), 32), zero\n"
             "past n, a tile of 32 channels' blocks side by side,\n"
             "and each block's exact sum is scaled and the blocks added in order before the row's scale.");

static PyObject *linear_call(PyObject *args, int nibbles) {
    PyObject *objs[6];
    Py_ssize_t m, n, k;
    int threads, prologue = PLAIN, activations = ACT_ONE;
    PyObject *norm = Py_None;
    float eps = 0.0f;
    Py_ssize_t scale_cols = 0;
    if (!PyArg_ParseTuple(args, "OOOOOOnnni|iOfin", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &m,
                          &n, &k, &threads, &prologue, &norm, &eps, &activations, &scale_cols))
        return NULL;
    if (check_scale_cols(scale_cols, "linear") < 0) return NULL;
    if (scale_cols != 0 && nibbles) {
        PyErr_SetString(PyExc_ValueError, "linear4: block scales need 8-bit weights");
        return NULL;
    }
    if (activations != ACT_ONE && activations != ACT_TWO && activations != ACT_OUTLIERS) {
        PyErr_Format(PyExc_ValueError, "linear: unknown activations %d", activations);
        return NULL;
    }
    if (activations == ACT_OUTLIERS && nibbles) {
        PyErr_SetString(PyExc_ValueError, "linear4: outlier activations need 8-bit weights");
        return NULL;
    }
    const int residual = activations == ACT_TWO, outliers = activations == ACT_OUTLIERS;
    if (m < 0 || n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "linear: bad shape");
        return NULL;
    }
    if (prologue != PLAIN && prologue != RMS_NORM && prologue != SWIGLU) {
        PyErr_Format(PyExc_ValueError, "linear: unknown prologue %d", prologue);
        return NULL;
    }
    if ((prologue == RMS_NORM) != (norm != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "linear: a norm weight goes with prologue 1 only");
        return NULL;
    }
    Py_buffer norm_view = {.obj = NULL};
    if (prologue == RMS_NORM && get_buffer(norm, &norm_view, 0, "norm", k * 4) < 0) return NULL;
    const int has_bias = objs[4] != Py_None;
    const Py_ssize_t groups = groups_of(k), kp = groups * 4, blocks = blocks_of(k, scale_cols);
    const Py_ssize_t need[6] = {m * k * (prologue == SWIGLU ? 8 : 4), tiles_of(n) * groups * (nibbles ? GROUP4 : GROUP),
                                tiles_of(n) * TILE * 4, (blocks == 1 ? n : blocks * tiles_of(n) * TILE) * 4,
                                n * 4, m * n * 4};
    static const char *names[6] = {"x", "packed", "colsum", "scale", "bias", "out"};
    Py_buffer views[6];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 6; got++) {
        if (got == 4 && !has_bias) {
            views[got].obj = NULL;
            continue;
        }
        if (get_buffer(objs[got], &views[got], got == 5, names[got], need[got]) < 0) goto done;
    }
    if (m == 0) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    {
        /* the "amx" build runs blocks of AMX_MIN_ROWS rows or more (4-bit weights: of
         * AMX_MIN_ROWS_WIDENED, up to AMX_WIDE_BYTES widened), over whole 64-column chunks, on the
         * tile unit, and everything else as avx512vnni */
        const Py_ssize_t qm = residual ? 2 * m : m; /* quantised rows the GEMM multiplies */
        /* an outlier call's float part runs after each VNNI tile, and block scales would take the
         * sums out of the tiles every two products: neither on the tile unit */
        const int tiles = active_backend == AMX && !outliers && blocks == 1 && qm >= (nibbles ? AMX_MIN_ROWS_WIDENED : AMX_MIN_ROWS) &&
                          groups % 16 == 0 &&
                          (!nibbles || groups * GROUP <= AMX_WIDE_BYTES);
        int backend = tiles ? AMX_TILES : active_backend == AMX ? AVX512VNNI : active_backend;
        if (nibbles && backend == AVX2) backend = PORTABLE; /* 4-bit weights: VNNI or portable */
        const int rounding = tiles ? AVX512VNNI : backend;
        const Py_ssize_t rows = tiles ? (qm + 15) / 16 * 16 : qm; /* whole tiles of rows, zeros past qm */
        int8_t *q = tiles ? calloc((size_t)rows, (size_t)kp) : malloc((size_t)(qm * kp));
        uint8_t *aux = backend == PORTABLE || tiles ? NULL : malloc((size_t)(qm * kp));
        float *rowscale = malloc((size_t)qm * sizeof(float));
        float *h = prologue == PLAIN ? NULL : malloc((size_t)(m * k) * sizeof(float));
        float *res = residual || outliers ? malloc((size_t)(m * k) * sizeof(float)) : NULL;
        const int side = k < OUTLIERS ? (int)k : OUTLIERS;
        int32_t *side_idx = outliers ? malloc((size_t)(m * side) * sizeof(int32_t)) : NULL;
        float *side_val = outliers ? malloc((size_t)(m * side) * sizeof(float)) : NULL;
        /* block scales on VNNI: each quantised row's sum per block (see _int8_gemm.h) */
        const int need_qsum = blocks > 1 && backend == AVX512VNNI;
        int32_t *qsum = need_qsum ? malloc((size_t)(qm * blocks) * sizeof(int32_t)) : NULL;
        if (q == NULL || rowscale == NULL || (backend != PORTABLE && !tiles && aux == NULL) ||
            (prologue != PLAIN && h == NULL) || ((residual || outliers) && res == NULL) ||
            (outliers && (side_idx == NULL || side_val == NULL)) || (need_qsum && qsum == NULL)) {
            free(qsum);
            free(q);
            free(aux);
            free(rowscale);
            free(h);
            free(res);
            free(side_idx);
            free(side_val);
            PyErr_NoMemory();
            goto done;
        }
        const float *bias = has_bias ? views[4].buf : NULL;
        const Py_ssize_t span = span_of(k, scale_cols);
        const rows_job_t rows_job = {views[0].buf, norm_view.buf, eps, h, prologue, rounding, k, kp, q, aux, rowscale,
                                     res, side_idx, side_val, side, qsum, span, blocks};
        /* a residual call's quantised rows 2r and 2r + 1 are added into out row r by the tiles'
         * epilogue (add_pair in _int8_gemm.h): the two parts' outputs are never stored */
        job_t job = {.packed = views[1].buf, .colsum = views[2].buf, .scale = views[3].buf, .bias = bias,
                     .q = q, .aux = aux, .rowscale = rowscale, .qsum = qsum, .out = views[5].buf, .m = qm,
                     .n = n, .groups = groups, .span = span, .blocks = blocks, .backend = backend,
                     .nibbles = nibbles, .paired = residual,
                     .side_idx = side_idx, .side_val = side_val, .side = side};
        job_t rows_phase = job;
        rows_phase.rows = &rows_job;
        rows_phase.m = m; /* its units are the input rows (a residual's two quantised rows are one unit) */
        if (threads < 1) threads = 1;
        int failed = 0; /* a thread could not widen 4-bit tiles (read under the call lock: this call's) */
        Py_BEGIN_ALLOW_THREADS;
        wmark_pool_lock();
        /* quantising (and a prologue) is ~1 ns an element: worth the pool from a few thousand */
        wmark_run_job(&rows_phase, m * k >= PARALLEL_ROWS_ELEMENTS ? threads : 1);
        wmark_run_job(&job, threads);
        failed = tiles && nibbles && atomic_exchange(&wmark_wide_failed, 0);
        wmark_pool_unlock();
        Py_END_ALLOW_THREADS;
        free(q);
        free(aux);
        free(rowscale);
        free(h);
        free(res);
        free(side_idx);
        free(side_val);
        free(qsum);
        if (failed) {
            PyErr_NoMemory();
            goto done;
        }
        result = Py_None;
        Py_INCREF(result);
    }
done:
    for (int i = 0; i < got; i++)
        if (views[i].obj != NULL) PyBuffer_Release(&views[i]);
    if (norm_view.obj != NULL) PyBuffer_Release(&norm_view);
    return result;
}

static PyObject *linear(PyObject *self, PyObject *args) {
    (void)self;
    return linear_call(args, 0);
}

PyDoc_STRVAR(linear4_doc,
             "linear4(x, packed, colsum, scale, bias, out, m, n, k, threads)\n\n"
             "linear() over 4-bit weights (values -8..7, a scale per channel): packed holds\n"
             "packed_size(n, k) / 2 bytes, byte j of a 64-byte group the 8-bit layout's bytes j (low\n"
             "nibble) and 64 + j (high), each plus 8; colsum the channels' sums of the 4-bit values. Exact\n"
             "integer sums as linear(); VNNI CPUs run it vectorised, others portable C (slow).");

static PyObject *linear4(PyObject *self, PyObject *args) {
    (void)self;
    return linear_call(args, 1);
}

static PyObject *backend(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyUnicode_FromString(backend_names[active_backend]);
}

static PyObject *backends(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *names = PyList_New(0);
    for (int b = best_backend; names != NULL && b >= 0; b--) {
        PyObject *name = PyUnicode_FromString(backend_names[b]);
        if (name == NULL || PyList_Append(names, name) < 0) Py_CLEAR(names);
        Py_XDECREF(name);
    }
    return names;
}

static PyObject *use_backend(PyObject *self, PyObject *args) {
    (void)self;
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    for (int b = 0; b <= best_backend; b++)
        if (strcmp(name, backend_names[b]) == 0) {
            active_backend = b;
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "use_backend: %s does not run on this CPU", name);
    return NULL;
}

static PyObject *prefetch(PyObject *self, PyObject *args) {
    (void)self;
    const char *name = NULL;
    if (!PyArg_ParseTuple(args, "|s", &name)) return NULL;
    static const char *const names[] = {[PREFETCH_NEAR] = "near", [PREFETCH_FAR] = "far", [PREFETCH_ROWS] = "rows"};
    if (name != NULL) {
        int found = -1;
        for (int p = 0; p < (int)(sizeof names / sizeof names[0]); p++)
            if (strcmp(name, names[p]) == 0) found = p;
        if (found < 0) {
            PyErr_Format(PyExc_ValueError, "prefetch: %s is not 'near', 'far' or 'rows'", name);
            return NULL;
        }
        wmark_prefetch = found;
    }
    return PyUnicode_FromString(names[wmark_prefetch]);
}

static PyObject *wait_policy(PyObject *self, PyObject *args) {
    (void)self;
    const char *name = NULL;
    if (!PyArg_ParseTuple(args, "|s", &name)) return NULL;
    if (name != NULL) {
        if (strcmp(name, "active") != 0 && strcmp(name, "passive") != 0) {
            PyErr_Format(PyExc_ValueError, "wait_policy: %s is not 'active' or 'passive'", name);
            return NULL;
        }
        wmark_pool_set_active(strcmp(name, "active") == 0);
    }
    return PyUnicode_FromString(wmark_pool_is_active() ? "active" : "passive");
}

/* worker_cpus(cpus): see the method table. The pool moves its workers under its lock (a call on
 * another thread released the GIL and holds it until done), so none is started or moved while a
 * call runs. */
static PyObject *worker_cpus(PyObject *self, PyObject *arg) {
    (void)self;
#ifdef __linux__
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    int pinned = arg != Py_None;
    if (pinned) {
        PyObject *seq = PySequence_Fast(arg, "worker_cpus: expected a sequence of CPU numbers or None");
        if (seq == NULL) return NULL;
        const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
        for (Py_ssize_t i = 0; i < count; i++) {
            const long cpu = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
            if (cpu == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return NULL;
            }
            if (cpu < 0 || cpu >= CPU_SETSIZE) {
                Py_DECREF(seq);
                return PyErr_Format(PyExc_ValueError, "worker_cpus: CPU %ld is out of range", cpu);
            }
            CPU_SET((int)cpu, &cpus);
        }
        Py_DECREF(seq);
        if (count == 0) return PyErr_Format(PyExc_ValueError, "worker_cpus: no CPU given (None: any CPU)");
    } else if (sched_getaffinity(0, sizeof(cpus), &cpus) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS;
    failed = wmark_pool_move_workers(&cpus, pinned);
    Py_END_ALLOW_THREADS;
    if (failed) return PyErr_Format(PyExc_OSError, "worker_cpus: a worker could not be moved to those CPUs");
#else
    (void)arg;
#endif
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"packed_size", packed_size, METH_VARARGS, "packed_size(n, k): bytes of the packed weights of n x k."},
    {"pack", pack, METH_VARARGS, pack_doc},
    {"unpack", unpack, METH_VARARGS, "unpack(packed, weight, n, k): the int8 (n, k) weights back."},
    {"linear", linear, METH_VARARGS, linear_doc},
    {"linear4", linear4, METH_VARARGS, linear4_doc},
    {"pack4", pack4, METH_VARARGS, pack4_doc},
    {"backend", backend, METH_NOARGS, "The build that runs now: 'amx', 'avx512vnni', 'avx2' or 'portable'."},
    {"backends", backends, METH_NOARGS, "The builds this CPU can run, fastest first."},
    {"use_backend", use_backend, METH_VARARGS, "use_backend(name): run that build (tests compare them)."},
    {"prefetch", prefetch, METH_VARARGS,
     "prefetch([policy]): the weight prefetch, 'near' (L1), 'far' (L2, Intel's default) or 'rows'\n"
     "(AMD's: near below 9 quantised rows in a call, 5 with 4-bit weights, far from there);\n"
     "sets it when given (benchmarks compare them; the bits do not change)."},
    {"wait_policy", wait_policy, METH_VARARGS,
     "wait_policy([policy]): how idle workers wait for the next call, 'active' (spin briefly, then\n"
     "sleep) or 'passive' (sleep at once: for workers on cores that other processes use); sets it\n"
     "when given."},
    {"worker_cpus", worker_cpus, METH_O,
     "worker_cpus(cpus): run the pool's worker threads (not the calling thread) only on these CPU\n"
     "numbers, now and when started later; None: on any CPU the caller may use. Linux only (elsewhere\n"
     "it does nothing). Keeping the workers off the core the caller computes on stops a worker from\n"
     "taking that core from it when another process holds the other one."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "wmark.generator.cpu._int8_gemm",
                                    "Exact int8 GEMM (see wmark.generator.cpu.rowwise).", -1, methods, NULL, NULL,
                                    NULL, NULL};

PyMODINIT_FUNC PyInit__int8_gemm(void) {
#ifdef WMARK_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) best_backend = AVX2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
        best_backend = AVX512VNNI;
#ifdef WMARK_AMX
        if (wmark_amx_granted()) best_backend = AMX;
#endif
    }
#endif
    active_backend = best_backend;
#ifdef WMARK_X86
    wmark_prefetch = __builtin_cpu_is("intel") ? PREFETCH_FAR : PREFETCH_ROWS;
#endif
    wmark_pool_init();
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) return NULL;
    PyObject *capsule = PyCapsule_New((void *)&wmark_gemm_pool_api, WMARK_POOL_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObject(mod, "_pool_api", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
