/*
 * worker.c -- worker threads, the hand-off of new sockets to them, and
 * their once-a-second tick (idle timeouts).
 *
 * The hand-off is a mutex-protected queue plus a pipe per worker: the
 * accepting thread queues the socket and writes one byte, the worker's
 * loop wakes on the pipe and takes everything queued. A 'q' byte asks the
 * worker to leave its loop. No libevent locking is needed: no event_base
 * is ever touched by another thread.
 */
#define _GNU_SOURCE /* pipe2 */
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "stats.h"

typedef struct pending_conn {
    struct pending_conn *next;
    int fd;
    bool tls;
    socklen_t salen;
    struct sockaddr_storage sa;
} pending_conn;

typedef struct worker {
    /* Counters first, on their own cache lines: bumped on every request. */
    stats_thread stats __attribute__((aligned(64)));
    conn_env env __attribute__((aligned(64)));
    pthread_t tid;
    bool started;
    unsigned idle_poll_us;
    struct event_base *base;
    int notify_rd;
    int notify_wr;
    struct event notify_ev;
    struct event tick_ev;
    pthread_mutex_t qlock;
    pending_conn *qhead;
    pending_conn *qtail;
} worker;

static worker *workers;
static size_t nworkers;
static size_t next_worker;

static void take_pending(worker *w)
{
    pthread_mutex_lock(&w->qlock);
    pending_conn *p = w->qhead;
    w->qhead = w->qtail = NULL;
    pthread_mutex_unlock(&w->qlock);
    while (p != NULL) {
        pending_conn *next = p->next;
        conn_open(&w->env, p->fd, (struct sockaddr *)&p->sa, p->salen, p->tls);
        free(p);
        p = next;
    }
}

static void notify_cb(evutil_socket_t fd, short what, void *arg)
{
    worker *w = arg;
    char buf[64];
    bool quit = false;
    ssize_t n;

    (void)what;
    while ((n = read(fd, buf, sizeof(buf))) > 0) {
        if (memchr(buf, 'q', (size_t)n) != NULL) {
            quit = true;
        }
    }
    take_pending(w);
    if (quit) {
        event_base_loopbreak(w->base);
    }
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    worker *w = arg;
    (void)fd;
    (void)what;
    conn_env_tick(&w->env, conn_now());
}

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/*
 * The worker's event loop. With idle_poll_us = 0 it is event_base_dispatch:
 * the thread sleeps in epoll_wait whenever nothing is ready. Otherwise,
 * after input arrives the thread may keep polling its sockets (epoll_wait
 * with no timeout, yielding the CPU between polls) until idle_poll_us pass
 * without new input, and only then sleeps. Each time new input arrives
 * inside that window, a sleep and a wake-up (and the sender's wake-up
 * call) are saved; each window that runs out has cost idle_poll_us of CPU
 * for nothing.
 *
 * So the poll is kept only while it pays: the thread keeps a running
 * average of the inputs a window caught before it ran out (POLL_SCALE
 * fixed point). Below POLL_KEEP_HITS, the thread sleeps at once, and polls
 * only one wait in POLL_PROBE_EVERY to see whether it would pay again.
 * Measured on loopback (contrib/bench rows): pipelined 4 KB workloads
 * catch 3-4.6 inputs a window, where the poll buys throughput; requests
 * sent one at a time, and pipelined 100-byte ones, catch 1.0-1.5, where it
 * only costs CPU per request.
 */
enum {
    POLL_SCALE = 16,
    POLL_KEEP_HITS = 2,
    POLL_PROBE_EVERY = 16,
    POLL_AVG_WEIGHT = 8, /* a new window counts for 1/8 of the average */
};

void worker_poll_init(worker_poll *wp)
{
    wp->avg = POLL_KEEP_HITS * POLL_SCALE; /* start out polling */
    wp->skip = 0;
}

bool worker_poll_now(worker_poll *wp)
{
    if (wp->skip > 0) {
        wp->skip--;
        return false;
    }
    return true;
}

void worker_poll_done(worker_poll *wp, int hits)
{
    wp->avg += (hits * POLL_SCALE - wp->avg) / POLL_AVG_WEIGHT;
    if (wp->avg < POLL_KEEP_HITS * POLL_SCALE) {
        wp->skip = POLL_PROBE_EVERY - 1;
    }
}

/* One polling window: returns how many times input arrived in it, or -1
 * when the loop must end. */
static int poll_window(worker *w)
{
    int hits = 0;
    uint64_t seen = __atomic_load_n(&w->stats.bytes_read, __ATOMIC_RELAXED);
    uint64_t last = mono_us();
    while (mono_us() - last < w->idle_poll_us) {
        sched_yield(); /* another thread on this core may have work */
        if (event_base_loop(w->base, EVLOOP_NONBLOCK) < 0 ||
            event_base_got_break(w->base)) {
            return -1;
        }
        uint64_t now = __atomic_load_n(&w->stats.bytes_read, __ATOMIC_RELAXED);
        if (now != seen) {
            seen = now;
            last = mono_us();
            hits++;
        }
    }
    return hits;
}

static void worker_loop(worker *w)
{
    if (w->idle_poll_us == 0) {
        event_base_dispatch(w->base);
        return;
    }
    worker_poll wp;
    worker_poll_init(&wp);
    for (;;) {
        if (event_base_loop(w->base, EVLOOP_ONCE) < 0 ||
            event_base_got_break(w->base)) {
            return;
        }
        if (!worker_poll_now(&wp)) {
            continue;
        }
        int hits = poll_window(w);
        if (hits < 0) {
            return;
        }
        worker_poll_done(&wp, hits);
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    worker_loop(w);
    take_pending(w);
    conn_env_destroy(&w->env);
    return NULL;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        return -1;
    }
    return 0;
}

/* Prepares worker w (not yet running). Returns 0 or WORKER_ERR_SYS. */
static int worker_init(worker *w, const worker_setup *ws)
{
    int p[2];
    memset(w, 0, sizeof(*w));
    w->notify_rd = w->notify_wr = -1;
    pthread_mutex_init(&w->qlock, NULL);
    conn_env_init(&w->env);

    struct event_config *cfg = event_config_new();
    if (cfg == NULL) {
        return WORKER_ERR_NOMEM;
    }
    /* Only this thread touches its base: no libevent locks. */
    event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK);
    w->base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    if (w->base == NULL) {
        return WORKER_ERR_SYS;
    }
    if (pipe2(p, O_CLOEXEC) != 0) {
        return WORKER_ERR_SYS;
    }
    w->notify_rd = p[0];
    w->notify_wr = p[1];
    if (set_nonblock(w->notify_rd) != 0) {
        return WORKER_ERR_SYS;
    }

    w->env.base = w->base;
    w->env.store = ws->store;
    w->env.pcfg = ws->pcfg;
    w->env.stats = &w->stats;
    w->env.verbose = ws->verbose;
    w->env.reqs_per_event = ws->reqs_per_event ? ws->reqs_per_event : 1;
    w->idle_poll_us = ws->idle_poll_us;
    w->env.output_max = ws->output_max;
    w->env.input_max = ws->input_max;
    w->env.tls = ws->tls;
    w->env.tls_wbuf_size = ws->tls_wbuf_size;
    w->env.proto_mode = ws->proto_mode;
    w->env.idle_timeout = ws->idle_timeout;
    w->env.request_shutdown = ws->request_shutdown;
    w->env.shutdown_arg = ws->shutdown_arg;

    struct timeval one = {1, 0};
    if (event_assign(&w->notify_ev, w->base, w->notify_rd,
                     EV_READ | EV_PERSIST, notify_cb, w) != 0 ||
        event_add(&w->notify_ev, NULL) != 0 ||
        event_assign(&w->tick_ev, w->base, -1, EV_PERSIST, tick_cb, w) != 0 ||
        event_add(&w->tick_ev, &one) != 0) {
        return WORKER_ERR_SYS;
    }
    return WORKER_OK;
}

static void worker_fini(worker *w)
{
    if (w->base != NULL) {
        event_del(&w->notify_ev);
        event_del(&w->tick_ev);
        event_base_free(w->base);
        w->base = NULL;
    }
    if (w->notify_rd >= 0) {
        close(w->notify_rd);
    }
    if (w->notify_wr >= 0) {
        close(w->notify_wr);
    }
    conn_env_fini(&w->env);
    pthread_mutex_destroy(&w->qlock);
}

int worker_pool_start(const worker_setup *ws)
{
    size_t n = ws->nthreads ? ws->nthreads : 1;
    workers = aligned_alloc(64, ((n * sizeof(worker) + 63) / 64) * 64);
    if (workers == NULL) {
        return WORKER_ERR_NOMEM;
    }
    nworkers = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = worker_init(&workers[i], ws);
        nworkers = i + 1;
        if (rc != 0) {
            worker_pool_stop();
            return rc;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (pthread_create(&workers[i].tid, NULL, worker_main, &workers[i]) !=
            0) {
            worker_pool_stop();
            return WORKER_ERR_SYS;
        }
        workers[i].started = true;
    }
    return WORKER_OK;
}

static void wake(worker *w, char what)
{
    ssize_t n;
    do {
        n = write(w->notify_wr, &what, 1);
    } while (n < 0 && errno == EINTR);
}

int worker_dispatch(int fd, const struct sockaddr *sa, socklen_t salen,
                    bool tls)
{
    if (nworkers == 0) {
        close(fd);
        STATS_CONN_SUB(curr_connections, 1);
        return WORKER_ERR_STATE;
    }
    pending_conn *p = malloc(sizeof(*p));
    if (p == NULL) {
        close(fd);
        STATS_CONN_SUB(curr_connections, 1);
        return WORKER_ERR_NOMEM;
    }
    p->next = NULL;
    p->fd = fd;
    p->tls = tls;
    p->salen = 0;
    if (sa != NULL && salen <= sizeof(p->sa)) {
        memcpy(&p->sa, sa, salen);
        p->salen = salen;
    }
    worker *w = &workers[next_worker];
    next_worker = (next_worker + 1) % nworkers;

    pthread_mutex_lock(&w->qlock);
    if (w->qtail != NULL) {
        w->qtail->next = p;
    } else {
        w->qhead = p;
    }
    w->qtail = p;
    pthread_mutex_unlock(&w->qlock);
    wake(w, 'c');
    return WORKER_OK;
}

void worker_pool_stop(void)
{
    if (workers == NULL) {
        return;
    }
    for (size_t i = 0; i < nworkers; i++) {
        if (workers[i].started) {
            wake(&workers[i], 'q');
        }
    }
    /* Join them all before freeing anything: a worker still running may
     * list the others' connections (stats conns). */
    for (size_t i = 0; i < nworkers; i++) {
        if (workers[i].started) {
            pthread_join(workers[i].tid, NULL);
            workers[i].started = false;
        } else {
            conn_env_destroy(&workers[i].env);
        }
    }
    for (size_t i = 0; i < nworkers; i++) {
        worker_fini(&workers[i]);
    }
    free(workers);
    workers = NULL;
    nworkers = 0;
}

size_t worker_count(void)
{
    return nworkers;
}

stats_thread *worker_stats(size_t i)
{
    return i < nworkers ? &workers[i].stats : NULL;
}

uint64_t worker_conn_yields(size_t i)
{
    return i < nworkers
               ? __atomic_load_n(&workers[i].env.conn_yields, __ATOMIC_RELAXED)
               : 0;
}

uint64_t worker_idle_kicks(size_t i)
{
    return i < nworkers
               ? __atomic_load_n(&workers[i].env.idle_kicks, __ATOMIC_RELAXED)
               : 0;
}

void worker_reset_counters(size_t i)
{
    if (i < nworkers) {
        __atomic_store_n(&workers[i].env.conn_yields, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&workers[i].env.idle_kicks, 0, __ATOMIC_RELAXED);
    }
}

void worker_conns_each(size_t i, conn_info_fn fn, void *arg)
{
    if (i < nworkers) {
        conn_env_each(&workers[i].env, fn, arg);
    }
}
