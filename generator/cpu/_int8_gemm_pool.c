/*
 * _int8_gemm's pool of worker threads (see _int8_gemm.h for the module): how a call's units
 * (tiles, a rows phase's rows, or another kernel's units lent through the capsule of
 * _pool_api.h) are cut into chunks and shared between the caller and the workers, how idle
 * workers wait, and on which CPUs they run. Apart from the kernels because it knows nothing of
 * them: a chunk is a range of units, run by wmark_run_tiles, wmark_run_rows or the lender's fn.
 *
 * A call cuts its tiles into contiguous chunks that the threads claim in turn (the caller takes
 * part), largest first: an eighth of a thread's share while much is left, then half of what is
 * left per thread, down to one tile. Which thread computes a tile does not change its sums.
 * The caller waits only for chunks that a worker has claimed and not finished, never for a
 * worker to show up: a worker that wakes late or shares its core with another process simply
 * claims fewer chunks (none if the call is over when it runs). So that a late worker can never
 * mix two calls, a claim is one compare-and-swap of a word holding the call's number (epoch),
 * its thread count and chunk count and the next chunk: a worker reads a call's parameters only
 * after a claim in that call has succeeded, and the caller publishes the next call only after
 * every claimed chunk is done.
 * Waiting for the next call: "active" workers spin briefly (a forward makes ~100 calls back to
 * back), then sleep on a condition variable; "passive" ones sleep at once, for workers on cores
 * that another process uses, where spinning would spend the worker's share of the core idle.
 */
#include "_int8_gemm.h"

#include <pthread.h>
#include <sched.h>

#define MAX_THREADS 64
#define MAX_CHUNKS 512
#define SPIN_ROUNDS 20000

/* The claim word: epoch (32 bits) | threads (8) | chunks (12) | next chunk (12). */
#define CLAIM_NEXT(w) ((int)((w)&0xFFF))
#define CLAIM_CHUNKS(w) ((int)(((w) >> 12) & 0xFFF))
#define CLAIM_THREADS(w) ((int)(((w) >> 24) & 0xFF))
#define CLAIM_EPOCH(w) ((uint32_t)((w) >> 32))

static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER; /* one call at a time uses the pool */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER; /* guards the workers' sleep */
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static int pool_started = 0;               /* worker threads started (they never exit) */
static pthread_t pool_threads[MAX_THREADS]; /* ... their handles (worker i + 1 at [i]) */
#ifdef __linux__
static cpu_set_t pool_cpus; /* the CPUs workers may run on, where pool_pinned */
static int pool_pinned = 0;
#endif
static atomic_int pool_spin = SPIN_ROUNDS; /* rounds a worker spins before sleeping (0: passive) */
static _Atomic uint64_t pool_claim;        /* the claim word of the current call */
static atomic_int pool_done;               /* chunks of the current call finished */
static const job_t *pool_job;              /* the current call's parameters ... */
static Py_ssize_t pool_bounds[MAX_CHUNKS + 1]; /* ... chunk i is tiles bounds[i] .. bounds[i + 1] */

/* Units first .. last of a job: tiles, a rows phase's rows, or another kernel's units. */
static void run_units(const job_t *job, Py_ssize_t first, Py_ssize_t last) {
    if (job->each != NULL)
        job->each(job->ctx, first, last);
    else if (job->rows != NULL)
        wmark_run_rows(job->rows, first, last);
    else
        wmark_run_tiles(job, first, last);
}

/* Cut `tiles` into chunks for `threads` threads (see above); returns the count. */
static int cut_chunks(Py_ssize_t tiles, int threads, Py_ssize_t *bounds) {
    const Py_ssize_t cap = (tiles + 8 * threads - 1) / (8 * threads);
    int chunks = 0;
    Py_ssize_t done = 0;
    bounds[0] = 0;
    while (done < tiles) {
        Py_ssize_t size = (tiles - done + 2 * threads - 1) / (2 * threads);
        if (size > cap) size = cap;
        if (chunks == MAX_CHUNKS - 1) size = tiles - done;
        done += size;
        bounds[++chunks] = done;
    }
    return chunks;
}

/* Claim and run chunks of the call in `word` (thread `id`; the caller is 0) until none is left;
 * returns the word last seen, whose epoch is a call this thread has finished with. */
static uint64_t take_chunks(uint64_t word, int id) {
    for (;;) {
        if (id >= CLAIM_THREADS(word) || CLAIM_NEXT(word) >= CLAIM_CHUNKS(word)) return word;
        if (!atomic_compare_exchange_weak_explicit(&pool_claim, &word, word + 1, memory_order_acquire,
                                                   memory_order_acquire))
            continue; /* word now holds what is there: another claim, or the next call */
        const int i = CLAIM_NEXT(word);
        run_units(pool_job, pool_bounds[i], pool_bounds[i + 1]);
        atomic_fetch_add_explicit(&pool_done, 1, memory_order_release);
        word = atomic_load_explicit(&pool_claim, memory_order_acquire);
    }
}

static void *worker(void *arg) {
    const int id = (int)(intptr_t)arg;
    uint32_t seen = CLAIM_EPOCH(take_chunks(atomic_load_explicit(&pool_claim, memory_order_acquire), id));
    for (;;) {
        const int rounds = atomic_load_explicit(&pool_spin, memory_order_relaxed);
        uint64_t word = atomic_load_explicit(&pool_claim, memory_order_acquire);
        for (int spins = 0; CLAIM_EPOCH(word) == seen && spins < rounds; spins++) {
#ifdef WMARK_X86
            _mm_pause();
#endif
            word = atomic_load_explicit(&pool_claim, memory_order_acquire);
        }
        if (CLAIM_EPOCH(word) == seen) {
            pthread_mutex_lock(&pool_lock);
            while (CLAIM_EPOCH(word = atomic_load_explicit(&pool_claim, memory_order_acquire)) == seen)
                pthread_cond_wait(&pool_wake, &pool_lock);
            pthread_mutex_unlock(&pool_lock);
        }
        seen = CLAIM_EPOCH(take_chunks(word, id));
    }
    return NULL;
}

/* A forked child has only the thread that forked: it starts its own workers when it needs them,
 * and a call that another thread of the parent was running is closed to claims. */
static void pool_after_fork(void) {
    pool_started = 0;
    const uint64_t word = atomic_load_explicit(&pool_claim, memory_order_relaxed);
    atomic_store_explicit(&pool_claim, (word & ~(uint64_t)0xFFF) | (uint64_t)CLAIM_CHUNKS(word),
                          memory_order_relaxed);
    pthread_mutex_init(&call_lock, NULL);
    pthread_mutex_init(&pool_lock, NULL);
    pthread_cond_init(&pool_wake, NULL);
}

void wmark_pool_init(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

void wmark_pool_lock(void) { pthread_mutex_lock(&call_lock); }

void wmark_pool_unlock(void) { pthread_mutex_unlock(&call_lock); }

/* Run `job` on `threads` threads, the caller's included (fewer where no more could start):
 * its tiles, or for a rows phase (or another kernel's job) its m units, in chunks. Called with
 * call_lock held. */
void wmark_run_job(const job_t *job, int threads) {
    const Py_ssize_t tiles = job->rows != NULL || job->each != NULL ? job->m : tiles_of(job->n);
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > tiles) threads = (int)tiles;
    while (pool_started < threads - 1) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
#ifdef __linux__
        if (pool_pinned) pthread_attr_setaffinity_np(&attr, sizeof(pool_cpus), &pool_cpus);
#endif
        const int failed = pthread_create(&thread, &attr, worker, (void *)(intptr_t)(pool_started + 1));
        pthread_attr_destroy(&attr);
        if (failed) break;
        pool_threads[pool_started++] = thread;
    }
    if (threads > pool_started + 1) threads = pool_started + 1;
    if (threads <= 1) {
        run_units(job, 0, tiles);
        return;
    }
    pool_job = job;
    const int chunks = cut_chunks(tiles, threads, pool_bounds);
    atomic_store_explicit(&pool_done, 0, memory_order_relaxed);
    const uint64_t epoch = CLAIM_EPOCH(atomic_load_explicit(&pool_claim, memory_order_relaxed)) + 1u;
    const uint64_t word = epoch << 32 | (uint64_t)threads << 24 | (uint64_t)chunks << 12;
    pthread_mutex_lock(&pool_lock);
    atomic_store_explicit(&pool_claim, word, memory_order_release);
    pthread_cond_broadcast(&pool_wake);
    pthread_mutex_unlock(&pool_lock);
    take_chunks(word, 0);
    int spins = 0;
    while (atomic_load_explicit(&pool_done, memory_order_acquire) < chunks) {
        if (++spins > SPIN_ROUNDS) sched_yield();
#ifdef WMARK_X86
        else _mm_pause();
#endif
    }
}

/* wmark_pool_api.parallel_for (see _pool_api.h). */
static void parallel_for(wmark_units_fn fn, void *ctx, Py_ssize_t units, int threads) {
    if (units <= 0) return;
    const job_t job = {.m = units, .each = fn, .ctx = ctx};
    pthread_mutex_lock(&call_lock);
    wmark_run_job(&job, threads < 1 ? 1 : threads);
    pthread_mutex_unlock(&call_lock);
}
const wmark_pool_api wmark_gemm_pool_api = {parallel_for};

/* The wait policy (`_int8_gemm.wait_policy`): workers spin SPIN_ROUNDS before sleeping, or none. */
void wmark_pool_set_active(int active) {
    atomic_store_explicit(&pool_spin, active ? SPIN_ROUNDS : 0, memory_order_relaxed);
}

int wmark_pool_is_active(void) { return atomic_load_explicit(&pool_spin, memory_order_relaxed) != 0; }

#ifdef __linux__
/* `_int8_gemm.worker_cpus`: under call_lock (a call on another thread released the GIL and holds
 * it until done), so no worker is started or moved while a call runs. */
int wmark_pool_move_workers(const cpu_set_t *cpus, int pinned) {
    int failed = 0;
    pthread_mutex_lock(&call_lock);
    for (int i = 0; i < pool_started; i++)
        failed |= pthread_setaffinity_np(pool_threads[i], sizeof(*cpus), cpus) != 0;
    pool_cpus = *cpus;
    pool_pinned = pinned;
    pthread_mutex_unlock(&call_lock);
    return failed;
}
#endif
