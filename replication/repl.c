/*
 * repl.c -- the replication thread's lifecycle: options and the static
 * peer list, repl_create / repl_start / repl_destroy, the peer listener,
 * and the tick that drives reconnects, round timeouts and the choice of
 * the next round. The thread's other jobs live in files of their own
 * behind repl_int.h: connections (repl_conn.c), the symbol stream
 * (repl_stream.c), the responder (repl_serve.c), the initiator
 * (repl_round.c), eager push (repl_push.c), placement (repl_place.c), the
 * peer table (repl_peers.c) and the stats (repl_stats.c). See repl.h for
 * the overview and replication/README.md for the protocol and the
 * decisions behind it.
 *
 * Threading: repl_create and repl_destroy run on the caller's thread while
 * the replication thread is not running (before repl_start, after the
 * loop stopped); the tick and on_stop run on the replication thread.
 */
#define _GNU_SOURCE
#include "repl.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>

#include "listspec.h"
#include "repl_int.h"

/* ====================================================== clock and rng */

uint64_t repl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t repl_wall_s(void)
{
    return (uint64_t)time(NULL);
}

static uint64_t rng_next(struct repl *r)
{
    uint64_t z = (r->rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* ============================================================ options */

void repl_options_default(repl_options *o)
{
    memset(o, 0, sizeof(*o));
    o->node_id = 1;
    o->listen = "127.0.0.1";
    o->port = 0;
    o->peers = "";
    o->secret = "";
    o->period_ms = 100;
    o->max_symbols = 262144;
    o->round_timeout_ms = 10000;
    o->push_queue = 65536;
    o->push_delay_us = 1000;
    o->backlog_bytes = 8u << 20;
    o->item_size_max = 1024 * 1024;
    o->registries = "";
    o->dns_names = "";
    o->dns_server = "";
    o->dns_interval_ms = 5000;
    o->etcd_urls = "";
    o->etcd_prefix = "/ribltcache/";
    o->etcd_lease_s = 10;
    registry_timing_default(&o->timing);
    o->replicas = 0;
    o->ring_partitions = RING_DEFAULT_PARTITIONS;
    o->ring_weight = 1;
    o->handoff_ms = 10000;
    o->down_ms = 3000;
    o->advertise = "";
}

/* Resolves "host:port" (or "[v6]:port") into p->addr; p->name keeps it. */
int repl_peer_parse(struct peer *p, const char *spec, size_t n, char *err,
                    size_t nerr)
{
    if (repl_link_resolve("peer", spec, n, &p->addr, &p->addrlen, err, nerr) !=
        0)
        return REPL_ERR_CONFIG;
    memcpy(p->name, spec, n);
    p->name[n] = '\0';
    return REPL_OK;
}

/* Splits the comma-separated list into r->peers. */
static int peers_parse(struct repl *r, const char *list, char *err,
                       size_t nerr)
{
    const char *p = list, *item;
    size_t n;
    while (listspec_next(&p, &item, &n)) {
        if (r->npeers == PEER_MAX) {
            snprintf(err, nerr, "more than %d peers", PEER_MAX);
            return REPL_ERR_CONFIG;
        }
        struct peer *peer = &r->peers[r->npeers];
        peer->r = r;
        int rc = repl_peer_parse(peer, item, n, err, nerr);
        if (rc != REPL_OK)
            return rc;
        r->npeers++;
    }
    return REPL_OK;
}

/* =============================================================== tick */

/*
 * Arms the next tick after a period jittered to between 0.5 and 1.5 times
 * repl_period_ms, so that nodes started together drift apart instead of
 * choosing each other in lockstep.
 */
static void tick_arm(struct repl *r)
{
    uint64_t us = (uint64_t)r->o.period_ms * 500 +
                  rng_next(r) % ((uint64_t)r->o.period_ms * 1000 + 1);
    struct timeval tv = {(time_t)(us / 1000000), (suseconds_t)(us % 1000000)};
    event_add(r->tick, &tv);
}

/* Dials every peer whose backoff has ended. */
static void redial_due(struct repl *r, uint64_t now)
{
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (p->self || p->vacant || p->member == REGISTRY_DEAD)
            continue;
        if (!p->conn && now >= p->retry_at_ns)
            repl_peer_connect(r, p);
    }
}

static void on_redial(evutil_socket_t fd, short what, void *arg)
{
    struct repl *r = arg;
    (void)fd;
    (void)what;
    redial_due(r, repl_now_ns());
}

/* Runs redial_due in ms milliseconds, unless it is due sooner already. */
void repl_arm_redial(struct repl *r, uint32_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    if (!r->redial)
        return;
    if (evtimer_pending(r->redial, NULL)) {
        struct timeval at, now_tv, want;
        evtimer_pending(r->redial, &at);
        event_base_gettimeofday_cached(r->loop.base, &now_tv);
        timeradd(&now_tv, &tv, &want);
        if (timercmp(&at, &want, <=))
            return;
    }
    evtimer_add(r->redial, &tv);
}

/*
 * Rounds waited for resumes after links came up: a peer whose link came
 * back meanwhile gets its round now rather than at a tick.
 */
static void on_quiet_end(evutil_socket_t fd, short what, void *arg)
{
    struct repl *r = arg;
    (void)fd;
    (void)what;
    uint64_t now = repl_now_ns();
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (!p->round_due)
            continue;
        if (repl_in_round(r, NULL, now))
            return; /* the tick starts it */
        p->round_due = false;
        if (repl_peer_ready(p)) {
            repl_round_start(r, p);
            p->round_was_due = p->round.active;
            return;
        }
    }
}

/* Every period: reconnect, time rounds out, start a round. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct repl *r = arg;
    (void)fd;
    (void)what;
    uint64_t now = repl_now_ns();
    int ready[PEER_MAX], nready = 0;
    if (repl_partitioned(r)) {
        pthread_mutex_lock(&r->plock);
        repl_ring_refresh(r, now);
        pthread_mutex_unlock(&r->plock);
        repl_handoff_tick(r, now);
    }
    redial_due(r, now);
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (p->self || p->vacant || p->member == REGISTRY_DEAD)
            continue;
        if (p->round.active &&
            now - p->round.started_ns >
                (uint64_t)r->o.round_timeout_ms * 1000000ull) {
            /* A stuck round: drop the connection, replies would be late. */
            repl_conn_free(p->conn);
            continue;
        }
        if (repl_peer_ready(p))
            ready[nready++] = i;
    }
    repl_health_tick(r, now);
    repl_push_tick(r);
    repl_encoder_spares_tick(r, now);
    /* One round at a time, run or served (repl_in_round); after rounds
     * that repaired nothing, one every 2^round_backoff ticks. */
    if (nready > 0 && !repl_in_round(r, NULL, now) &&
        ++r->round_ticks >= 1u << r->round_backoff) {
        r->round_ticks = 0;
        repl_round_start(r, &r->peers[ready[rng_next(r) % (uint64_t)nready]]);
    }
    tick_arm(r);
}

/* On the replication thread, as it stops. */
static void on_stop(void *arg)
{
    struct repl *r = arg;
    /* A clean stop leaves the registries' views at once. */
    if (r->reg)
        registry_client_leave(r->reg);
}

/* ========================================================== lifecycle */

static int bind_listener(struct repl *r, char *err, size_t nerr)
{
    char port[16];
    snprintf(port, sizeof(port), "%u", (unsigned)r->o.port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(r->listen, port, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, nerr, "peer listen address '%s': %s", r->listen,
                 gai_strerror(rc));
        return REPL_ERR_CONFIG;
    }
    r->lis = evconnlistener_new_bind(r->loop.base, repl_on_accept, r,
                                     LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                     64, res->ai_addr, (int)res->ai_addrlen);
    freeaddrinfo(res);
    if (!r->lis) {
        snprintf(err, nerr, "cannot listen on peer port %s:%u: %s", r->listen,
                 (unsigned)r->o.port, strerror(errno));
        return REPL_ERR_SYSTEM;
    }
    return REPL_OK;
}

repl *repl_create(store *s, const repl_options *o, char *err, size_t nerr)
{
    if (o->port == 0) {
        snprintf(err, nerr, "replication needs a peer port");
        return NULL;
    }
    if (o->node_id == 0) {
        snprintf(err, nerr, "node_id must be non-zero");
        return NULL;
    }
    if ((!o->secret || !o->secret[0]) && !o->insecure && !o->tls) {
        snprintf(err, nerr,
                 "a cluster node needs cluster_secret or repl_tls_* "
                 "certificates (or repl_insecure = yes to run without "
                 "authentication)");
        return NULL;
    }
    if (o->period_ms == 0 || o->max_symbols < 1024 || o->push_queue == 0) {
        snprintf(err, nerr,
                 "repl_period_ms must be > 0, repl_max_symbols >= 1024, "
                 "repl_push_queue > 0");
        return NULL;
    }
    if (o->acks && o->replicas != 0) {
        snprintf(err, nerr,
                 "repl_ack_wait_ms needs full replication (replicas = 0)");
        return NULL;
    }
    struct repl *r = calloc(1, sizeof(*r));
    if (!r) {
        snprintf(err, nerr, "out of memory");
        return NULL;
    }
    r->o = *o;
    r->s = s;
    r->S = store_sketch_symbols(s);
    pthread_rwlock_init(&r->rlock, NULL);
    r->wake_fd = -1;
    int loop_rc = evloop_init(&r->loop, on_stop, r);
    r->secret = strdup(o->secret ? o->secret : "");
    r->listen = strdup(o->listen && o->listen[0] ? o->listen : "127.0.0.1");
    r->qcap = o->push_queue;
    r->queue = calloc(r->qcap, sizeof(*r->queue));
    r->rng = repl_now_ns() ^ ((uint64_t)o->node_id << 32);
    r->created_ns = repl_now_ns();
    pthread_mutex_init(&r->qlock, NULL);
    pthread_mutex_init(&r->plock, NULL);
    /* Small frames (handshake, requests) are built without a size check. */
    r->syms = malloc(BATCH_MAX * sizeof(riblt_symbol));
    r->own_syms = malloc(BATCH_MAX * sizeof(riblt_symbol));
    if (!r->secret || !r->listen || !r->queue || r->S == 0 || !r->syms ||
        !r->own_syms || !repl_scratch_fit(r, 65536) || !repl_pushlog_init(r)) {
        snprintf(err, nerr, "out of memory");
        goto fail;
    }
    if (peers_parse(r, o->peers, err, nerr) != REPL_OK)
        goto fail;
    if (repl_placement_setup(r, err, nerr) != REPL_OK)
        goto fail;
    r->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (loop_rc != 0 || r->wake_fd < 0) {
        snprintf(err, nerr, "cannot create the replication event loop");
        goto fail;
    }
    if (bind_listener(r, err, nerr) != REPL_OK)
        goto fail;
    r->tick = event_new(r->loop.base, -1, 0, on_tick, r);
    r->wake = event_new(r->loop.base, r->wake_fd, EV_READ | EV_PERSIST,
                        repl_on_wake, r);
    r->push_timer = evtimer_new(r->loop.base, repl_on_push_timer, r);
    r->redial = evtimer_new(r->loop.base, on_redial, r);
    r->quiet_end = evtimer_new(r->loop.base, on_quiet_end, r);
    if (!r->tick || !r->wake || !r->push_timer || !r->redial ||
        !r->quiet_end) {
        snprintf(err, nerr, "cannot create replication events");
        goto fail;
    }
    if (o->registries && o->registries[0]) {
        registry_client_options co = {
            .node_id = o->node_id,
            .registries = o->registries,
            .advertise = r->listen,
            .advertise_port = o->port,
            .secret = r->secret,
            .insecure = o->insecure,
            .tls = o->tls,
            .timing = o->timing,
        };
        r->reg = registry_client_create(r->loop.base, &co, repl_on_view,
                                        repl_on_ping, r, err, nerr);
        if (!r->reg)
            goto fail;
    }
    if (o->dns_names && o->dns_names[0]) {
        dnsview_options dno = {
            .names = o->dns_names,
            .server = o->dns_server,
            .interval_ms = o->dns_interval_ms,
        };
        r->dns =
            dnsview_create(r->loop.base, &dno, repl_on_dns_view, r, err, nerr);
        if (!r->dns)
            goto fail;
    }
    if (o->etcd_urls && o->etcd_urls[0]) {
        char addr[REGISTRY_ADDR_MAX + 1];
        if (strcmp(r->listen, "0.0.0.0") == 0 ||
            strcmp(r->listen, "::") == 0 || strchr(r->listen, ',') != NULL) {
            snprintf(err, nerr,
                     "etcd needs repl_listen to be this node's own address "
                     "(it is what the other nodes dial)");
            goto fail;
        }
        snprintf(addr, sizeof(addr),
                 strchr(r->listen, ':') ? "[%s]:%u" : "%s:%u", r->listen,
                 (unsigned)o->port);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        etcdview_options eo = {
            .urls = o->etcd_urls,
            .prefix = o->etcd_prefix,
            .lease_s = o->etcd_lease_s,
            .node_id = o->node_id,
            .addr = addr,
            .weight = o->ring_weight,
            .tls_ca = o->etcd_tls_ca,
            .tls_cert = o->etcd_tls_cert,
            .tls_key = o->etcd_tls_key,
            .incarnation =
                (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u,
        };
        r->etcd = etcdview_create(r->loop.base, &eo, repl_on_etcd_view, r, err,
                                  nerr);
        if (!r->etcd)
            goto fail;
    }
    tick_arm(r);
    event_add(r->wake, NULL);
    store_set_listener(s, repl_on_change, r);
    return r;
fail:
    repl_destroy(r);
    return NULL;
}

int repl_start(repl *r)
{
    return evloop_start(&r->loop, "rc-repl") == 0 ? REPL_OK : REPL_ERR_SYSTEM;
}

void repl_destroy(repl *r)
{
    if (!r)
        return;
    evloop_stop(&r->loop);
    if (r->s)
        store_set_listener(r->s, NULL, NULL);
    for (int i = 0; i < r->npeers; i++)
        repl_peer_free(&r->peers[i]);
    while (r->incoming)
        repl_conn_free(r->incoming);
    registry_client_destroy(r->reg);
    dnsview_destroy(r->dns);
    etcdview_destroy(r->etcd);
    while (r->nspare > 0)
        riblt_encoder_destroy(r->spare[--r->nspare]);
    for (size_t i = 0; i < r->qlen; i++)
        store_item_release(r->queue[(r->qhead + i) % r->qcap]);
    repl_pushlog_free(r);
    if (r->lis)
        evconnlistener_free(r->lis);
    if (r->tick)
        event_free(r->tick);
    if (r->wake)
        event_free(r->wake);
    if (r->push_timer)
        event_free(r->push_timer);
    if (r->redial)
        event_free(r->redial);
    if (r->quiet_end)
        event_free(r->quiet_end);
    evloop_fini(&r->loop);
    if (r->wake_fd >= 0)
        close(r->wake_fd);
    pthread_mutex_destroy(&r->qlock);
    pthread_mutex_destroy(&r->plock);
    repl_route_free(r->route);
    pthread_rwlock_destroy(&r->rlock);
    ring_destroy(r->ring);
    ring_destroy(r->prev_ring);
    free(r->owned);
    free(r->ready);
    free(r->changed_ns);
    free(r->lost_ns);
    free(r->gained_ns);
    free(r->parts_buf);
    free(r->queue);
    free(r->scratch);
    free(r->syms);
    free(r->own_syms);
    free(r->secret);
    free(r->listen);
    free(r);
}
