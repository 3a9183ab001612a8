/*
 * registry_server.c -- the registry server: accepts members' links,
 * keeps the directory (registry_dir.c) and sends views. See registry.h.
 *
 * Threading: a registry_server runs on a thread of its own; its directory
 * is guarded by a mutex so that registry_server_emit_stats may read it
 * from any thread.
 */
#define _GNU_SOURCE
#include "registry_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>

#include "evloop.h"
#include "repl_wire.h"

/* =============================================================== server */

struct sconn {
    struct registry_server *s;
    repl_link *l;
    bool member;    /* the current connection of a registered member */
    uint32_t node;  /* the member (its handshake id) */
    uint64_t epoch; /* view epoch last sent */
    struct sconn *next;
};

#define REGISTRY_SERVER_COUNTERS(X)                                           \
    X(connections)                                                            \
    X(auth_failures)                                                          \
    X(bad_frames)                                                             \
    X(refused_connections)                                                    \
    X(views_sent)

struct registry_server {
    registry_server_options o;
    char *secret, *listen;
    evloop loop; /* the registry's thread and event base */
    struct evconnlistener *lis;
    struct event *tick;
    uint32_t tick_ms;
    uint64_t publish_at;  /* no view before this (members re-register) */
    pthread_mutex_t lock; /* guards dir */
    registry_dir *dir;
    struct sconn *conns;
    int nconns;
    log_limit refused_log;
    struct {
#define RS_FIELD(n) uint64_t n;
        REGISTRY_SERVER_COUNTERS(RS_FIELD)
#undef RS_FIELD
    } st;
};

#define RS_ADD(s, name) __atomic_fetch_add(&(s)->st.name, 1, __ATOMIC_RELAXED)

static struct sconn *member_conn(struct registry_server *s, uint32_t node)
{
    for (struct sconn *c = s->conns; c; c = c->next)
        if (c->member && c->node == node)
            return c;
    return NULL;
}

/* Sends the current view to c (the directory lock is held). */
static void send_view(struct registry_server *s, struct sconn *c)
{
    registry_member m[REGISTRY_MEMBERS_MAX];
    uint8_t p[REGISTRY_FRAME_MAX];
    size_t n = registry_dir_view(s->dir, m, REGISTRY_MEMBERS_MAX);
    uint64_t epoch = registry_dir_epoch(s->dir);
    long len = registry_view_encode(p, sizeof(p), epoch, m, n);
    if (len < 0)
        return;
    if (repl_link_send(c->l, REPL_MSG_REG_VIEW, p, (uint32_t)len) == 0) {
        c->epoch = epoch;
        RS_ADD(s, views_sent);
    }
}

static bool publishing(struct registry_server *s, uint64_t now)
{
    return now >= s->publish_at;
}

static int server_register(struct sconn *c, const uint8_t *p, size_t len)
{
    struct registry_server *s = c->s;
    if (len < 14 || len != 13u + p[12])
        return -1;
    uint32_t node = repl_wire_get_u32(p);
    uint64_t inc = repl_wire_get_u64(p + 4);
    size_t al = p[12];
    char addr[REGISTRY_ADDR_MAX + 1];
    /* A member registers only itself: the id its handshake proved. */
    if (node != repl_link_peer_id(c->l) || al > REGISTRY_ADDR_MAX ||
        !registry_addr_ok((const char *)p + 13, al))
        return -1;
    memcpy(addr, p + 13, al);
    addr[al] = '\0';
    uint64_t now = registry_now_ms(), known = 0;
    pthread_mutex_lock(&s->lock);
    int rc = registry_dir_register(s->dir, node, inc, addr, now, &known);
    if (rc == REGISTRY_OK) {
        struct sconn *old = member_conn(s, node);
        if (old && old != c)
            old->member = false;
        c->member = true;
        c->node = node;
        c->epoch = 0;
        registry_dir_connected(s->dir, node, true, now);
        if (publishing(s, now))
            send_view(s, c);
    }
    pthread_mutex_unlock(&s->lock);
    if (rc == REGISTRY_ERR_STALE)
        return registry_send_u64(c->l, REPL_MSG_REG_REJOIN, known) == 0 ? 0
                                                                        : -1;
    if (rc == REGISTRY_ERR_FULL) {
        static const char full[] = "registry full";
        uint8_t e[4 + sizeof(full)];
        repl_wire_put_u32(e, 1);
        memcpy(e + 4, full, sizeof(full) - 1);
        repl_link_send(c->l, REPL_MSG_ERROR, e, (uint32_t)(sizeof(e) - 1));
        return 0;
    }
    return rc == REGISTRY_OK ? 0 : -1;
}

static int server_heartbeat(struct sconn *c, const uint8_t *p, size_t len)
{
    struct registry_server *s = c->s;
    if (len != 16)
        return -1;
    uint64_t inc = repl_wire_get_u64(p);
    uint64_t epoch = repl_wire_get_u64(p + 8);
    uint64_t now = registry_now_ms(), known = 0;
    int rc = REGISTRY_ERR_UNKNOWN;
    pthread_mutex_lock(&s->lock);
    if (c->member)
        rc = registry_dir_heartbeat(s->dir, c->node, inc, now, &known);
    bool view = rc == REGISTRY_OK && publishing(s, now) &&
                epoch != registry_dir_epoch(s->dir);
    if (view)
        send_view(s, c);
    pthread_mutex_unlock(&s->lock);
    if (rc != REGISTRY_OK)
        return registry_send_u64(c->l, REPL_MSG_REG_REJOIN, known) == 0 ? 0
                                                                        : -1;
    /* Every heartbeat is answered, so a member notices a dead registry. */
    return view || registry_send_u64(c->l, REPL_MSG_PONG, 0) == 0 ? 0 : -1;
}

static int server_frame(void *arg, repl_link *l, const repl_frame *f)
{
    struct sconn *c = arg;
    struct registry_server *s = c->s;
    const uint8_t *p = f->payload;
    uint64_t now = registry_now_ms();
    switch (f->type) {
    case REPL_MSG_REG_REGISTER:
        return server_register(c, p, f->length);
    case REPL_MSG_REG_HEARTBEAT:
        return server_heartbeat(c, p, f->length);
    case REPL_MSG_REG_LEAVE:
        if (f->length != 8)
            return -1;
        if (c->member) {
            pthread_mutex_lock(&s->lock);
            registry_dir_leave(s->dir, c->node, repl_wire_get_u64(p));
            pthread_mutex_unlock(&s->lock);
            c->member = false;
        }
        return 1;
    case REPL_MSG_PONG:
        if (f->length != 8)
            return -1;
        if (c->member) {
            pthread_mutex_lock(&s->lock);
            registry_dir_pong(s->dir, c->node, repl_wire_get_u64(p), now);
            pthread_mutex_unlock(&s->lock);
        }
        return 0;
    case REPL_MSG_REG_PING_ACK:
        if (f->length != 13 || p[12] > 1)
            return -1;
        if (c->member) {
            pthread_mutex_lock(&s->lock);
            registry_dir_ack(s->dir, c->node, repl_wire_get_u32(p + 8),
                             repl_wire_get_u64(p), p[12] == 1, now);
            pthread_mutex_unlock(&s->lock);
        }
        return 0;
    default:
        return -1;
    }
}

/* The link closed: counts why, tells the directory, forgets c. */
static void server_closed(void *arg, repl_link *l, int why)
{
    struct sconn *c = arg;
    struct registry_server *s = c->s;
    if (why == REPL_LINK_CLOSED_AUTH)
        RS_ADD(s, auth_failures);
    if (why == REPL_LINK_CLOSED_AUTH)
        registry_log_refusal(&s->refused_log, l,
                             "incoming registry connection from", NULL);
    else if (why == REPL_LINK_CLOSED_BAD_FRAME)
        RS_ADD(s, bad_frames);
    if (c->member) {
        pthread_mutex_lock(&s->lock);
        registry_dir_connected(s->dir, c->node, false, registry_now_ms());
        pthread_mutex_unlock(&s->lock);
    }
    for (struct sconn **pp = &s->conns; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            s->nconns--;
            break;
        }
    }
    free(c);
}

/* Members have non-zero ids. */
static bool server_check_id(void *arg, uint32_t node)
{
    (void)arg;
    return node != 0;
}

static const repl_link_ops server_ops = {
    .frame = server_frame,
    .closed = server_closed,
    .check_id = server_check_id,
};

static void server_accept(struct evconnlistener *lis, evutil_socket_t fd,
                          struct sockaddr *sa, int socklen, void *arg)
{
    struct registry_server *s = arg;
    (void)lis;
    (void)sa;
    (void)socklen;
    if (s->nconns >= SERVER_CONNS_MAX) {
        RS_ADD(s, refused_connections);
        evutil_closesocket(fd);
        return;
    }
    struct sconn *c = calloc(1, sizeof(*c));
    if (!c) {
        evutil_closesocket(fd);
        return;
    }
    c->s = s;
    repl_link_options lo =
        registry_link_options(s->secret, s->o.tls, 0, &s->o.timing);
    c->l = repl_link_accept(s->loop.base, fd, &lo, &server_ops, c);
    if (!c->l) {
        free(c);
        return;
    }
    c->next = s->conns;
    s->conns = c;
    s->nconns++;
    RS_ADD(s, connections);
}

static void server_tick_arm(struct registry_server *s)
{
    evloop_add_ms(s->tick, s->tick_ms);
}

/* Drives the directory: probes to send, views to publish. */
static void server_tick(evutil_socket_t fd, short what, void *arg)
{
    struct registry_server *s = arg;
    (void)fd;
    (void)what;
    registry_action acts[ACTIONS_MAX];
    uint64_t now = registry_now_ms();
    pthread_mutex_lock(&s->lock);
    size_t n = registry_dir_step(s->dir, now, acts, ACTIONS_MAX);
    for (size_t i = 0; i < n; i++) {
        struct sconn *c = member_conn(s, acts[i].to);
        if (!c)
            continue; /* the probe times out */
        if (acts[i].kind == REGISTRY_ACT_PING) {
            registry_send_u64(c->l, REPL_MSG_PING, acts[i].token);
        } else {
            uint8_t p[12];
            repl_wire_put_u64(p, acts[i].token);
            repl_wire_put_u32(p + 8, acts[i].target);
            repl_link_send(c->l, REPL_MSG_REG_PING_REQ, p, sizeof(p));
        }
    }
    if (publishing(s, now)) {
        uint64_t epoch = registry_dir_epoch(s->dir);
        for (struct sconn *c = s->conns; c; c = c->next)
            if (c->member && c->epoch != epoch)
                send_view(s, c);
    }
    pthread_mutex_unlock(&s->lock);
    server_tick_arm(s);
}

registry_server *registry_server_create(const registry_server_options *o,
                                        char *err, size_t nerr)
{
    if (o->port == 0) {
        snprintf(err, nerr, "the registry needs a port");
        return NULL;
    }
    if ((!o->secret || !o->secret[0]) && !o->insecure && !o->tls) {
        snprintf(err, nerr,
                 "a registry needs cluster_secret or repl_tls_* certificates "
                 "(or repl_insecure = yes to run without authentication)");
        return NULL;
    }
    if (registry_timing_check(&o->timing, err, nerr) != REGISTRY_OK)
        return NULL;
    struct registry_server *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, nerr, "out of memory");
        return NULL;
    }
    s->o = *o;
    int loop_rc = evloop_init(&s->loop, NULL, NULL);
    pthread_mutex_init(&s->lock, NULL);
    s->secret = strdup(o->secret ? o->secret : "");
    s->listen = strdup(o->listen && o->listen[0] ? o->listen : "127.0.0.1");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->dir = registry_dir_create(&o->timing, (uint64_t)ts.tv_nsec ^
                                                 (uint64_t)getpid() << 32);
    if (!s->secret || !s->listen || !s->dir || loop_rc != 0) {
        snprintf(err, nerr, "cannot create the registry");
        goto fail;
    }
    uint32_t t = o->timing.probe_ms;
    if (o->timing.probe_timeout_ms < t)
        t = o->timing.probe_timeout_ms;
    if (o->timing.heartbeat_ms < t)
        t = o->timing.heartbeat_ms;
    s->tick_ms = t / 4 < 5 ? 5 : t / 4 > 250 ? 250 : t / 4;
    char port[16];
    snprintf(port, sizeof(port), "%u", (unsigned)o->port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(s->listen, port, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, nerr, "registry listen address '%s': %s", s->listen,
                 gai_strerror(rc));
        goto fail;
    }
    s->lis = evconnlistener_new_bind(s->loop.base, server_accept, s,
                                     LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                     64, res->ai_addr, (int)res->ai_addrlen);
    freeaddrinfo(res);
    if (!s->lis) {
        snprintf(err, nerr, "cannot listen on registry port %s:%u: %s",
                 s->listen, (unsigned)o->port, strerror(errno));
        goto fail;
    }
    s->tick = event_new(s->loop.base, -1, 0, server_tick, s);
    if (!s->tick) {
        snprintf(err, nerr, "cannot create registry events");
        goto fail;
    }
    /*
     * A registry that (re)starts knows nobody; members re-register within
     * a heartbeat or a reconnect backoff. Publishing an almost empty view
     * before then would make them drop peers they still have.
     */
    uint64_t grace = 3ull * o->timing.heartbeat_ms;
    if (grace < BACKOFF_MAX_MS + 500)
        grace = BACKOFF_MAX_MS + 500;
    s->publish_at = registry_now_ms() + grace;
    server_tick_arm(s);
    return s;
fail:
    registry_server_destroy(s);
    return NULL;
}

int registry_server_start(registry_server *s)
{
    return evloop_start(&s->loop, "rc-registry") == 0 ? REGISTRY_OK
                                                      : REGISTRY_ERR_SYSTEM;
}

void registry_server_destroy(registry_server *s)
{
    if (!s)
        return;
    evloop_stop(&s->loop);
    while (s->conns)
        repl_link_close(s->conns->l);
    if (s->lis)
        evconnlistener_free(s->lis);
    if (s->tick)
        event_free(s->tick);
    evloop_fini(&s->loop);
    registry_dir_destroy(s->dir);
    pthread_mutex_destroy(&s->lock);
    free(s->secret);
    free(s->listen);
    free(s);
}

void registry_server_emit_stats(registry_server *s, stats_emit_fn emit,
                                void *arg)
{
    char name[64], val[160];
    snprintf(val, sizeof(val), "%u", (unsigned)s->o.port);
    emit(arg, "registry_port", val);
#define RS_EMIT(n)                                                            \
    snprintf(                                                                 \
        val, sizeof(val), "%llu",                                             \
        (unsigned long long)__atomic_load_n(&s->st.n, __ATOMIC_RELAXED));     \
    emit(arg, #n, val);
    REGISTRY_SERVER_COUNTERS(RS_EMIT)
#undef RS_EMIT
    registry_member m[REGISTRY_MEMBERS_MAX];
    registry_counters rc;
    pthread_mutex_lock(&s->lock);
    size_t n = registry_dir_view(s->dir, m, REGISTRY_MEMBERS_MAX);
    uint64_t epoch = registry_dir_epoch(s->dir);
    registry_dir_counters(s->dir, &rc);
    pthread_mutex_unlock(&s->lock);
    snprintf(val, sizeof(val), "%llu", (unsigned long long)epoch);
    emit(arg, "epoch", val);
    snprintf(val, sizeof(val), "%zu", n);
    emit(arg, "members", val);
#define RC_EMIT(f)                                                            \
    snprintf(val, sizeof(val), "%llu", (unsigned long long)rc.f);             \
    emit(arg, #f, val);
    RC_EMIT(registrations)
    RC_EMIT(heartbeats)
    RC_EMIT(leaves)
    RC_EMIT(rejoins)
    RC_EMIT(probes)
    RC_EMIT(probes_failed)
    RC_EMIT(indirect_probes)
    RC_EMIT(suspected)
    RC_EMIT(declared_dead)
    RC_EMIT(refuted)
    RC_EMIT(refused_full)
#undef RC_EMIT
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "member%zu:node_id", i);
        snprintf(val, sizeof(val), "%u", m[i].node);
        emit(arg, name, val);
        snprintf(name, sizeof(name), "member%zu:addr", i);
        emit(arg, name, m[i].addr);
        snprintf(name, sizeof(name), "member%zu:state", i);
        emit(arg, name, registry_state_name(m[i].state));
        snprintf(name, sizeof(name), "member%zu:incarnation", i);
        snprintf(val, sizeof(val), "%llu",
                 (unsigned long long)m[i].incarnation);
        emit(arg, name, val);
    }
}
