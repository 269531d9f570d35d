/*
 * The int8 GEMM's worker pool, offered to the other C extensions of wmark.generator.
 *
 * `_int8_gemm` exports one `wmark_pool_api` through the capsule named WMARK_POOL_CAPSULE. A
 * kernel with independent units of work (the tree attention's (row, key/value head) pairs)
 * runs them on the same threads as the GEMM instead of starting a pool of its own: two pools
 * on two cores would spin against each other, and this one already follows the thread plan
 * (`_int8_gemm.worker_cpus`, `wait_policy`).
 */
#ifndef WMARK_POOL_API_H
#define WMARK_POOL_API_H

#include <Python.h>

#define WMARK_POOL_CAPSULE "wmark.generator.cpu._int8_gemm._pool_api"

/* Units first .. last (exclusive) of a call; ctx is the caller's. */
typedef void (*wmark_units_fn)(void *ctx, Py_ssize_t first, Py_ssize_t last);

typedef struct {
    /* Run fn over units 0 .. units in contiguous chunks on up to `threads` threads, the caller's
     * included, and return when all are done. One call uses the pool at a time (a GEMM on
     * another thread waits, or is waited for). Call it with the GIL released; fn must not call
     * back into the pool. Which thread runs a unit must not change its result: that is fn's
     * contract, as it is the GEMM's. */
    void (*parallel_for)(wmark_units_fn fn, void *ctx, Py_ssize_t units, int threads);
} wmark_pool_api;

#endif
