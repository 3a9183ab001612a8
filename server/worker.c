/*
 * worker.c -- worker threads, the hand-off of new sockets to them, and
 * their once-a-second tick (idle timeouts).
 *
 * The hand-off is a mutex-protected queue plus a pipe per worker: the
 * accepting thread queues the socket and writes one byte, the worker's
 * loop wakes on the pipe and takes everything queued. A 'q' byte asks the
 * worker to leave its loop; an 'a' byte tells it that peers confirmed
 * writes its connections wait for (worker_pool_wake_acks). No libevent
 * locking is needed: no event_base is ever touched by another thread.
 */
#define _GNU_SOURCE /* pipe2, pthread_setname_np */
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/prctl.h>
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
    unsigned nap_us;
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
/* Keeps worker_pool_wake_acks (another thread) off a pool being freed. */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
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
    bool acks = false;
    while ((n = read(fd, buf, sizeof(buf))) > 0) {
        if (memchr(buf, 'q', (size_t)n) != NULL) {
            quit = true;
        }
        if (memchr(buf, 'a', (size_t)n) != NULL) {
            acks = true;
        }
    }
    take_pending(w);
    if (acks) {
        conn_env_acks(&w->env);
    }
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

/*
 * The worker's event loop: epoll_wait, then the callbacks of what is
 * ready. Without naps (worker_nap_us = 0) that is all
 * (event_base_dispatch).
 *
 * With them, a pass in which some connection had more than one request
 * waiting (a client that pipelines, or keeps several requests in flight
 * on a connection) may be followed by a nap of worker_nap_us and a pass,
 * without blocking, over what arrived meanwhile; the naps go on while
 * each such pass finds requests on several connections, one of them with
 * more than one, and the worker blocks in epoll_wait again after the
 * first pass that does not. A nap gathers more requests into each read
 * and each reply write, and the clients' sends meanwhile wake nobody: on
 * pipelined loads that lowers the CPU each request costs. Requests sent
 * one at a time never start a nap: each still needs its own read and
 * write, and waiting would only delay it.
 *
 * A nap that finds little (a lone pipelining client, whose next requests
 * wait for the replies the nap holds back) costs a delay for nothing. So
 * the worker keeps a running average of the connections its nap passes
 * found (NAP_SCALE fixed point) and, while that is below NAP_KEEP_INPUTS,
 * lets only one chance in NAP_PROBE_EVERY start a nap, to see whether
 * naps would pay again. The nap is a plain nanosleep, with the thread's
 * timer slack set to NAP_TIMER_SLACK_NS so that it lasts what it says.
 */
enum {
    NAP_SCALE = 16,
    NAP_KEEP_INPUTS = 2,
    NAP_PROBE_EVERY = 16,
    NAP_AVG_WEIGHT = 8, /* a new nap counts for 1/8 of the average */
    NAP_TIMER_SLACK_NS = 1000,
};

void worker_nap_init(worker_nap *wn)
{
    wn->avg = NAP_KEEP_INPUTS * NAP_SCALE; /* naps are tried at first */
    wn->skip = 0;
    wn->napping = false;
}

bool worker_nap_next(worker_nap *wn, unsigned inputs, unsigned piped)
{
    if (wn->napping) { /* the pass that followed a nap */
        int found = inputs > 64 ? 64 : (int)inputs;
        wn->avg += (found * NAP_SCALE - wn->avg) / NAP_AVG_WEIGHT;
        if (wn->avg < NAP_KEEP_INPUTS * NAP_SCALE) {
            wn->skip = NAP_PROBE_EVERY - 1;
        }
        wn->napping = inputs >= 2 && piped >= 1;
        return wn->napping;
    }
    if (piped == 0) {
        return false;
    }
    if (wn->skip > 0) {
        wn->skip--;
        return false;
    }
    wn->napping = true;
    return true;
}

static void worker_loop(worker *w)
{
    if (w->nap_us == 0) {
        event_base_dispatch(w->base);
        return;
    }
    (void)prctl(PR_SET_TIMERSLACK, (unsigned long)NAP_TIMER_SLACK_NS);
    struct timespec nap = {(time_t)(w->nap_us / 1000000),
                           (long)(w->nap_us % 1000000) * 1000};
    worker_nap wn;
    worker_nap_init(&wn);
    int flags = EVLOOP_ONCE; /* a pass after no nap blocks */
    for (;;) {
        if (event_base_loop(w->base, flags) < 0 ||
            event_base_got_break(w->base)) {
            return;
        }
        unsigned inputs, piped;
        conn_env_take_inputs(&w->env, &inputs, &piped);
        flags = EVLOOP_ONCE;
        if (worker_nap_next(&wn, inputs, piped)) {
            STATS_INCR(&w->stats, worker_naps);
            nanosleep(&nap, NULL);
            /* One pass over what the nap gathered: NONBLOCK alone
             * would go on dispatching while clients keep up. */
            flags = EVLOOP_ONCE | EVLOOP_NONBLOCK;
        }
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
    w->nap_us = ws->nap_us;
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
        /* As memcached names its threads (mc-worker): top -H and ps -L
         * tell them apart. A name that does not take is no error. */
        (void)pthread_setname_np(workers[i].tid, "rc-worker");
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

void worker_pool_wake_acks(void)
{
    pthread_mutex_lock(&pool_lock);
    for (size_t i = 0; i < nworkers; i++) {
        if (workers[i].started && conn_env_ack_kick(&workers[i].env)) {
            wake(&workers[i], 'a');
        }
    }
    pthread_mutex_unlock(&pool_lock);
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
    pthread_mutex_lock(&pool_lock);
    for (size_t i = 0; i < nworkers; i++) {
        worker_fini(&workers[i]);
    }
    free(workers);
    workers = NULL;
    nworkers = 0;
    pthread_mutex_unlock(&pool_lock);
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
