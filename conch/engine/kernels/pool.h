/* Helper threads for the attention kernels: a job is a number of independent items, claimed one at a time by the
 * calling thread and by helpers until none is left.
 *
 * Why this shape: on a VM a sleeping thread takes ~20 us to wake (measured on a 2-vCPU KVM guest), about as long
 * as a decode kernel call at a few thousand tokens. Starting threads per call (what the kernels did before) or a
 * static split puts that wake-up on the critical path; with items claimed dynamically the caller starts at once,
 * a helper joins whenever it wakes, and the caller never waits longer than one item. Helpers sleep on a futex
 * between jobs after a short spin, so nothing keeps spinning on a core the engine's other work needs.
 *
 * Helpers are pinned to CPUs other than the caller's. Measured on the 2-vCPU VM: a helper woken after the caller
 * had been idle for 0.5 ms or more was placed on the caller's own CPU in 48 of 50 wakes (the idle vCPU counts as
 * preempted, so the scheduler does not pick it), where it could not run until the caller finished every item
 * alone. The pins are checked on each job (the caller's CPU is one vDSO read) and moved only when the caller has
 * moved onto a helper's CPU.
 *
 * Correctness: the claim word packs (generation, items, next item), so a helper that wakes late for a finished
 * job fails its compare-and-swap instead of claiming an item of a newer job; a claimed item keeps its job alive
 * (the caller waits for every item to finish), so the job's function and argument are stable while it runs.
 */
#ifndef CONCH_POOL_H
#define CONCH_POOL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <immintrin.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define POOL_MAX_HELPERS 15
#define POOL_MAX_ITEMS ((1 << 20) - 1)
#define POOL_SPIN_NS 20000 /* a helper spins this long for the next job before it sleeps */
#define POOL_MAX_CPUS 1024

typedef void (*pool_item_fn)(const void *arg, int item);

static struct {
    _Atomic uint64_t claim;     /* generation << 40 | items << 20 | next unclaimed item */
    _Atomic uint32_t wake;      /* futex word, bumped for every job */
    _Atomic int finished;       /* items of the current job done */
    pool_item_fn fn;
    const void *arg;
    int helpers;                /* started */
    pthread_t tid[POOL_MAX_HELPERS];
    int pin[POOL_MAX_HELPERS];  /* the CPU each helper is pinned to, -1 for none */
    int ncpus;                  /* CPUs this process may use (read when the first helper starts) */
    short cpus[POOL_MAX_CPUS];
    uint64_t generation;
    pthread_mutex_t lock;       /* one job at a time; a second caller runs its items alone */
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

static inline uint64_t pool_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Claims and runs items of generation `gen` until none is left. */
static void pool_work(uint64_t gen) {
    for (;;) {
        uint64_t c = atomic_load_explicit(&pool.claim, memory_order_acquire);
        const int items = (int)((c >> 20) & POOL_MAX_ITEMS), next = (int)(c & POOL_MAX_ITEMS);
        if ((c >> 40) != gen || next >= items) return;
        if (!atomic_compare_exchange_weak_explicit(&pool.claim, &c, c + 1, memory_order_acq_rel, memory_order_relaxed))
            continue;
        pool.fn(pool.arg, next);
        atomic_fetch_add_explicit(&pool.finished, 1, memory_order_release);
    }
}

static void *pool_helper(void *unused) {
    (void)unused;
    uint32_t seen = atomic_load(&pool.wake);
    for (;;) {
        const uint64_t t0 = pool_now_ns();
        while (atomic_load_explicit(&pool.wake, memory_order_acquire) == seen) {
            if (pool_now_ns() - t0 < POOL_SPIN_NS)
                _mm_pause();
            else
                syscall(SYS_futex, &pool.wake, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
        }
        seen = atomic_load(&pool.wake);
        pool_work(atomic_load_explicit(&pool.claim, memory_order_acquire) >> 40);
    }
    return NULL;
}

static void pool_after_fork(void) { /* a forked child has no helpers: start afresh */
    pool.helpers = 0;
    pool.ncpus = 0;
    pthread_mutex_init(&pool.lock, NULL);
}

static void pool_atfork_register(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

static void pool_read_cpus(void) {
    cpu_set_t set;
    pool.ncpus = 0;
    if (sched_getaffinity(getpid(), sizeof set, &set) != 0) return; /* the process's (main thread's) CPUs */
    for (int c = 0; c < CPU_SETSIZE && c < POOL_MAX_CPUS; c++)
        if (CPU_ISSET(c, &set)) pool.cpus[pool.ncpus++] = (short)c;
}

/* Pins helper h to the h-th allowed CPU after skipping the caller's (no-op when it is there already). */
static void pool_pin(int used) {
    if (pool.ncpus < 2) return;
    const int me = sched_getcpu();
    for (int h = 0, i = 0; h < used; h++, i++) {
        if (pool.cpus[i % pool.ncpus] == me) i++;
        const int cpu = pool.cpus[i % pool.ncpus];
        if (pool.pin[h] == cpu) continue;
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        pool.pin[h] = pthread_setaffinity_np(pool.tid[h], sizeof set, &set) == 0 ? cpu : -1;
    }
}

/* Runs fn(arg, i) for i in [0, items) on this thread and up to threads - 1 helpers. */
static void pool_run(pool_item_fn fn, const void *arg, int items, int threads) {
    if (threads > POOL_MAX_HELPERS + 1) threads = POOL_MAX_HELPERS + 1;
    if (threads <= 1 || items <= 1 || items > POOL_MAX_ITEMS || pthread_mutex_trylock(&pool.lock) != 0) {
        for (int i = 0; i < items; i++) fn(arg, i);
        return;
    }
    if (pool.helpers == 0) {
        static pthread_once_t once = PTHREAD_ONCE_INIT;
        pthread_once(&once, pool_atfork_register);
        pool_read_cpus();
    }
    while (pool.helpers < threads - 1) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int failed = pthread_create(&pool.tid[pool.helpers], &attr, pool_helper, NULL);
        pthread_attr_destroy(&attr);
        if (failed) break; /* run with the helpers there are */
        pool.pin[pool.helpers++] = -1;
    }
    pool_pin(pool.helpers); /* idle ones too: none is left on the caller's CPU */
    pool.fn = fn;
    pool.arg = arg;
    atomic_store_explicit(&pool.finished, 0, memory_order_relaxed);
    const uint64_t gen = ++pool.generation & 0xffffff;
    atomic_store_explicit(&pool.claim, gen << 40 | (uint64_t)items << 20, memory_order_release);
    atomic_fetch_add_explicit(&pool.wake, 1, memory_order_release);
    const int sleepers = threads - 1 < pool.helpers ? threads - 1 : pool.helpers;
    if (sleepers > 0) syscall(SYS_futex, &pool.wake, FUTEX_WAKE_PRIVATE, sleepers, NULL, NULL, 0);
    pool_work(gen);
    while (atomic_load_explicit(&pool.finished, memory_order_acquire) < items) _mm_pause();
    pthread_mutex_unlock(&pool.lock);
}

#endif
