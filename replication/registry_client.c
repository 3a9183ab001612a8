/*
 * registry_client.c -- the member side of the registry protocol: registers
 * with every registry configured, heartbeats, answers probe requests and
 * hands the chosen registry's view to its owner. See registry.h.
 *
 * Threading: a registry_client runs on its owner's event loop; the few
 * fields stats read are atomics or behind the client's mutex.
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
#include "listspec.h"
#include "repl_wire.h"

/* =============================================================== client */

struct rlink {
    struct registry_client *c;
    repl_link *l;
    char name[REGISTRY_ADDR_MAX + 1];
    struct sockaddr_storage addr;
    socklen_t addrlen;
    bool registered;
    bool has_view;
    uint64_t epoch;
    registry_member *view;
    size_t nview;
    uint64_t retry_at, next_hb;
    uint32_t backoff_ms;
};

struct pending {
    bool used;
    uint64_t token;
    uint32_t target;
    int link;
};

struct registry_client {
    registry_client_options o;
    char *secret, *advertise;
    struct event_base *base;
    struct event *tick;
    uint32_t tick_ms;
    registry_view_fn on_view;
    registry_ping_fn on_ping;
    void *arg;
    struct rlink links[REGISTRY_SERVERS_MAX];
    int nlinks;
    int source; /* link whose view is in use, -1 none */
    bool leaving;
    uint64_t incarnation; /* atomic: read by stats */
    unsigned connected;   /* atomic: read by stats */
    pthread_mutex_t slock;
    char source_text[REGISTRY_ADDR_MAX + 64];
    struct pending pending[PENDING_MAX];
    unsigned pending_next;
    log_limit refused_log;
};

static uint64_t client_inc(struct registry_client *c)
{
    return __atomic_load_n(&c->incarnation, __ATOMIC_RELAXED);
}

static void set_source_text(struct registry_client *c, const char *fmt,
                            const char *name)
{
    pthread_mutex_lock(&c->slock);
    snprintf(c->source_text, sizeof(c->source_text), fmt, name);
    pthread_mutex_unlock(&c->slock);
}

/*
 * The preferred source is the first registry of the list that is
 * connected and has sent a view. Hands its view to the owner when the
 * source changes or force is set (its view changed).
 */
static void client_pick_source(struct registry_client *c, bool force)
{
    int best = -1;
    for (int i = 0; i < c->nlinks && best < 0; i++)
        if (c->links[i].l && repl_link_ready(c->links[i].l) &&
            c->links[i].has_view)
            best = i;
    if (best < 0) {
        if (c->source >= 0)
            set_source_text(c, "cached (registry %s unreachable)",
                            c->links[c->source].name);
        c->source = -1;
        return;
    }
    if (best == c->source && !force)
        return;
    c->source = best;
    struct rlink *k = &c->links[best];
    char src[REGISTRY_ADDR_MAX + 16];
    snprintf(src, sizeof(src), "registry %s", k->name);
    set_source_text(c, "%s", src);
    c->on_view(c->arg, k->view, k->nview, src);
}

/* This node's advertised peer address for the link's local side. */
static void advertised(struct rlink *k, char *out, size_t n)
{
    struct registry_client *c = k->c;
    const char *h = c->advertise;
    char host[INET6_ADDRSTRLEN] = "";
    if (!h[0] || strcmp(h, "0.0.0.0") == 0 || strcmp(h, "::") == 0 ||
        strcmp(h, "*") == 0) {
        /* A wildcard listener: advertise the address we reach the
         * registry from. */
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        evutil_socket_t fd = repl_link_fd(k->l);
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
            getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), NULL,
                        0, NI_NUMERICHOST) == 0)
            h = host;
        else
            h = "127.0.0.1";
    }
    if (strchr(h, ':'))
        snprintf(out, n, "[%s]:%u", h, (unsigned)c->o.advertise_port);
    else
        snprintf(out, n, "%s:%u", h, (unsigned)c->o.advertise_port);
}

static void client_register(struct rlink *k)
{
    char addr[REGISTRY_ADDR_MAX + 1];
    advertised(k, addr, sizeof(addr));
    size_t al = strlen(addr);
    uint8_t p[13 + REGISTRY_ADDR_MAX];
    repl_wire_put_u32(p, k->c->o.node_id);
    repl_wire_put_u64(p + 4, client_inc(k->c));
    p[12] = (uint8_t)al;
    memcpy(p + 13, addr, al);
    if (repl_link_send(k->l, REPL_MSG_REG_REGISTER, p, (uint32_t)(13 + al)) ==
        0) {
        k->registered = true;
        k->next_hb = registry_now_ms() + k->c->o.timing.heartbeat_ms;
    }
}

static void client_ack(struct registry_client *c, int link, uint64_t token,
                       uint32_t target, bool ok)
{
    struct rlink *k = &c->links[link];
    if (!k->l || !repl_link_ready(k->l))
        return;
    uint8_t p[13];
    repl_wire_put_u64(p, token);
    repl_wire_put_u32(p + 8, target);
    p[12] = ok ? 1 : 0;
    repl_link_send(k->l, REPL_MSG_REG_PING_ACK, p, sizeof(p));
}

/* The registry asks us to ping target on its behalf. */
static void client_ping_req(struct rlink *k, uint64_t token, uint32_t target)
{
    struct registry_client *c = k->c;
    int idx = (int)(k - c->links);
    if (target == c->o.node_id) {
        client_ack(c, idx, token, target, true);
        return;
    }
    /* A bounded ring: the oldest request is forgotten first. */
    struct pending *p = &c->pending[c->pending_next++ % PENDING_MAX];
    *p = (struct pending){true, token, target, idx};
    if (c->on_ping(c->arg, target, token) != 0) {
        p->used = false;
        client_ack(c, idx, token, target, false);
    }
}

static int client_frame(void *arg, repl_link *l, const repl_frame *f)
{
    struct rlink *k = arg;
    struct registry_client *c = k->c;
    const uint8_t *p = f->payload;
    switch (f->type) {
    case REPL_MSG_REG_VIEW: {
        uint64_t epoch;
        size_t n;
        if (registry_view_decode(p, f->length, &epoch, k->view,
                                 REGISTRY_MEMBERS_MAX, &n) != REGISTRY_OK)
            return -1;
        k->nview = n;
        k->epoch = epoch;
        k->has_view = true;
        int idx = (int)(k - c->links);
        client_pick_source(c, c->source == idx || c->source < 0);
        return 0;
    }
    case REPL_MSG_REG_REJOIN: {
        if (f->length != 8)
            return -1;
        uint64_t known = repl_wire_get_u64(p);
        uint64_t inc = client_inc(c);
        inc = (known > inc ? known : inc) + 1;
        __atomic_store_n(&c->incarnation, inc, __ATOMIC_RELAXED);
        /* Every registry learns the new incarnation. */
        for (int i = 0; i < c->nlinks; i++)
            if (c->links[i].l && repl_link_ready(c->links[i].l))
                client_register(&c->links[i]);
        return 0;
    }
    case REPL_MSG_PING:
        if (f->length != 8)
            return -1;
        return repl_link_send(l, REPL_MSG_PONG, p, 8) == 0 ? 0 : -1;
    case REPL_MSG_PONG:
        return f->length == 8 ? 0 : -1; /* a heartbeat's answer */
    case REPL_MSG_REG_PING_REQ:
        if (f->length != 12)
            return -1;
        client_ping_req(k, repl_wire_get_u64(p), repl_wire_get_u32(p + 8));
        return 0;
    case REPL_MSG_ERROR:
        return 1; /* e.g. a full registry: retry later */
    default:
        return -1;
    }
}

static void client_ready(void *arg, repl_link *l)
{
    struct rlink *k = arg;
    (void)l;
    k->backoff_ms = 0;
    __atomic_fetch_add(&k->c->connected, 1, __ATOMIC_RELAXED);
    client_register(k);
}

/* k has no connection any more: dial again after a backoff. */
static void client_lost(struct rlink *k, bool was_ready)
{
    struct registry_client *c = k->c;
    if (was_ready)
        __atomic_fetch_sub(&c->connected, 1, __ATOMIC_RELAXED);
    k->l = NULL;
    k->registered = false;
    k->has_view = false;
    uint32_t max = c->o.timing.heartbeat_ms;
    if (max > BACKOFF_MAX_MS)
        max = BACKOFF_MAX_MS;
    if (max < BACKOFF_FIRST_MS)
        max = BACKOFF_FIRST_MS;
    k->backoff_ms = k->backoff_ms ? k->backoff_ms * 2 : BACKOFF_FIRST_MS;
    if (k->backoff_ms > max)
        k->backoff_ms = max;
    k->retry_at = registry_now_ms() + k->backoff_ms;
    if (!c->leaving && c->source == (int)(k - c->links))
        client_pick_source(c, true);
}

static void client_closed(void *arg, repl_link *l, int why)
{
    struct rlink *k = arg;
    if (why == REPL_LINK_CLOSED_AUTH)
        registry_log_refusal(&k->c->refused_log, l, "registry connection to",
                             k->name);
    client_lost(arg, repl_link_ready(l));
}

/* A registry calls itself 0; anything else is a peer port. */
static bool client_check_id(void *arg, uint32_t node)
{
    (void)arg;
    return node == 0;
}

static const repl_link_ops client_ops = {
    .frame = client_frame,
    .ready = client_ready,
    .closed = client_closed,
    .check_id = client_check_id,
};

static void client_dial(struct rlink *k)
{
    struct registry_client *c = k->c;
    repl_link_options o =
        registry_link_options(c->secret, c->o.tls, c->o.node_id, &c->o.timing);
    int rc = repl_link_dial(c->base, (struct sockaddr *)&k->addr, k->addrlen,
                            &o, &client_ops, k, &k->l);
    if (rc == REPL_LINK_ERR_CONNECT)
        client_lost(k, false);
}

static void client_tick_arm(struct registry_client *c)
{
    evloop_add_ms(c->tick, c->tick_ms);
}

static void client_tick(evutil_socket_t fd, short what, void *arg)
{
    struct registry_client *c = arg;
    (void)fd;
    (void)what;
    uint64_t now = registry_now_ms();
    for (int i = 0; i < c->nlinks; i++) {
        struct rlink *k = &c->links[i];
        if (!k->l) {
            if (now >= k->retry_at)
                client_dial(k);
            continue;
        }
        if (repl_link_ready(k->l) && k->registered && now >= k->next_hb) {
            uint8_t p[16];
            repl_wire_put_u64(p, client_inc(c));
            repl_wire_put_u64(p + 8, k->has_view ? k->epoch : 0);
            repl_link_send(k->l, REPL_MSG_REG_HEARTBEAT, p, sizeof(p));
            k->next_hb = now + c->o.timing.heartbeat_ms;
        }
    }
    client_tick_arm(c);
}

registry_client *registry_client_create(struct event_base *base,
                                        const registry_client_options *o,
                                        registry_view_fn on_view,
                                        registry_ping_fn on_ping, void *arg,
                                        char *err, size_t nerr)
{
    if (o->node_id == 0 || o->advertise_port == 0) {
        snprintf(err, nerr,
                 "a registry member needs a node id and a peer "
                 "port");
        return NULL;
    }
    if ((!o->secret || !o->secret[0]) && !o->insecure && !o->tls) {
        snprintf(err, nerr,
                 "a registry member needs cluster_secret or repl_tls_* "
                 "certificates");
        return NULL;
    }
    if (registry_timing_check(&o->timing, err, nerr) != REGISTRY_OK)
        return NULL;
    struct registry_client *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, nerr, "out of memory");
        return NULL;
    }
    c->o = *o;
    c->base = base;
    c->on_view = on_view;
    c->on_ping = on_ping;
    c->arg = arg;
    c->source = -1;
    pthread_mutex_init(&c->slock, NULL);
    snprintf(c->source_text, sizeof(c->source_text), "none");
    /*
     * The incarnation starts at the wall clock in milliseconds, so a
     * restarted node comes back newer than anything the registry knew.
     */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    c->incarnation =
        (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    c->secret = strdup(o->secret ? o->secret : "");
    c->advertise = strdup(o->advertise ? o->advertise : "");
    if (!c->secret || !c->advertise) {
        snprintf(err, nerr, "out of memory");
        goto fail;
    }
    const char *p = o->registries, *item;
    size_t n;
    while (listspec_next(&p, &item, &n)) {
        if (c->nlinks == REGISTRY_SERVERS_MAX) {
            snprintf(err, nerr, "more than %d registries",
                     REGISTRY_SERVERS_MAX);
            goto fail;
        }
        struct rlink *k = &c->links[c->nlinks];
        if (n > REGISTRY_ADDR_MAX) {
            snprintf(err, nerr, "registry address too long");
            goto fail;
        }
        memcpy(k->name, item, n);
        k->name[n] = '\0';
        k->c = c;
        k->view = calloc(REGISTRY_MEMBERS_MAX, sizeof(*k->view));
        c->nlinks++;
        if (!k->view) {
            snprintf(err, nerr, "out of memory");
            goto fail;
        }
        if (repl_link_resolve("registry", k->name, strlen(k->name), &k->addr,
                              &k->addrlen, err, nerr) != 0)
            goto fail;
    }
    if (c->nlinks == 0) {
        snprintf(err, nerr, "the registry list is empty");
        goto fail;
    }
    uint32_t t = o->timing.heartbeat_ms;
    c->tick_ms = t < 100 ? (t < 5 ? 5 : t) : 100;
    c->tick = event_new(base, -1, 0, client_tick, c);
    if (!c->tick) {
        snprintf(err, nerr, "cannot create the registry timer");
        goto fail;
    }
    struct timeval zero = {0, 0};
    event_add(c->tick, &zero);
    return c;
fail:
    registry_client_destroy(c);
    return NULL;
}

void registry_client_pong(registry_client *c, uint32_t target, uint64_t token)
{
    for (int i = 0; i < PENDING_MAX; i++) {
        struct pending *p = &c->pending[i];
        if (p->used && p->token == token && p->target == target) {
            p->used = false;
            client_ack(c, p->link, token, target, true);
            return;
        }
    }
}

void registry_client_leave(registry_client *c)
{
    c->leaving = true;
    if (c->tick)
        event_del(c->tick);
    for (int i = 0; i < c->nlinks; i++) {
        struct rlink *k = &c->links[i];
        if (!k->l)
            continue;
        /*
         * The loop stops next, so the frame goes out now, straight on the
         * socket. With older frames still queued it is skipped: the
         * registry's probes find out instead.
         */
        if (repl_link_ready(k->l) && k->registered) {
            uint8_t p[8];
            repl_wire_put_u64(p, client_inc(c));
            repl_link_send_now(k->l, REPL_MSG_REG_LEAVE, p, 8);
        }
        repl_link_close(k->l);
    }
}

void registry_client_destroy(registry_client *c)
{
    if (!c)
        return;
    c->leaving = true;
    for (int i = 0; i < c->nlinks; i++) {
        if (c->links[i].l)
            repl_link_close(c->links[i].l);
        free(c->links[i].view);
    }
    if (c->tick)
        event_free(c->tick);
    pthread_mutex_destroy(&c->slock);
    free(c->secret);
    free(c->advertise);
    free(c);
}

void registry_client_source(registry_client *c, char *out, size_t n)
{
    pthread_mutex_lock(&c->slock);
    snprintf(out, n, "%s", c->source_text);
    pthread_mutex_unlock(&c->slock);
}

uint64_t registry_client_incarnation(registry_client *c)
{
    return client_inc(c);
}

unsigned registry_client_connected(registry_client *c)
{
    return __atomic_load_n(&c->connected, __ATOMIC_RELAXED);
}
