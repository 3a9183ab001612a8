/*
 * dnsview.c -- cluster membership from DNS (see dnsview.h), on c-ares.
 *
 * One resolution ("a pass") runs at a time: for each configured name an
 * SRV query; a name with SRV records resolves each target's addresses
 * with the record's port, a name without resolves its own addresses with
 * the configured port. When the last answer of a pass is in, the
 * addresses collected are the new view, unless a query failed (timeout,
 * server failure): then the last view stays.
 */
#include "dnsview.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <ares.h>
#include <event2/event.h>

#include "evloop.h"
#include "listspec.h"
#include "log.h"
#include "viewsrc.h"

#define DNSVIEW_NAMES_MAX 16
#define DNSVIEW_ADDRS_MAX REGISTRY_MEMBERS_MAX
#define DNSVIEW_SOCKS_MAX 16
#define DNS_CLASS_IN 1
#define DNS_TYPE_SRV 33

struct dnsview;

struct dname {
    char host[256];
    char port[8];
    struct dnsview *v;
};

struct dsock {
    ares_socket_t fd;
    struct event *ev;
};

struct dnsview {
    struct event_base *base;
    ares_channel chan;
    bool chan_ok;
    viewsrc src; /* views, answering or not, stats */
    uint32_t interval_ms;
    struct dname names[DNSVIEW_NAMES_MAX];
    int nnames;
    struct event *tick;    /* the next pass */
    struct event *timeout; /* c-ares's own timeouts */
    struct dsock socks[DNSVIEW_SOCKS_MAX];
    /* the pass in flight */
    int pending;
    bool failed;
    char fail_why[96];
    registry_member got[DNSVIEW_ADDRS_MAX];
    size_t ngot;
    bool destroying;
};

static pthread_once_t ares_once = PTHREAD_ONCE_INIT;
static int ares_init_rc;

static void ares_init_once(void)
{
    ares_init_rc = ares_library_init(ARES_LIB_INIT_ALL);
}

/* ============================================================== events */

static void arm_timeout(dnsview *v)
{
    struct timeval tv;
    struct timeval *t = ares_timeout(v->chan, NULL, &tv);
    if (t)
        evtimer_add(v->timeout, t);
    else
        evtimer_del(v->timeout);
}

static void on_io(evutil_socket_t fd, short what, void *arg)
{
    dnsview *v = arg;
    ares_process_fd(v->chan, (what & EV_READ) ? fd : ARES_SOCKET_BAD,
                    (what & EV_WRITE) ? fd : ARES_SOCKET_BAD);
    arm_timeout(v);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    dnsview *v = arg;
    (void)fd;
    (void)what;
    ares_process_fd(v->chan, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
    arm_timeout(v);
}

/* c-ares opens, closes or changes interest in a socket. */
static void on_sock_state(void *data, ares_socket_t fd, int readable,
                          int writable)
{
    dnsview *v = data;
    struct dsock *slot = NULL, *free_slot = NULL;
    for (int i = 0; i < DNSVIEW_SOCKS_MAX; i++) {
        if (v->socks[i].ev && v->socks[i].fd == fd)
            slot = &v->socks[i];
        else if (!v->socks[i].ev && !free_slot)
            free_slot = &v->socks[i];
    }
    if (slot) {
        event_free(slot->ev);
        slot->ev = NULL;
    }
    if (!readable && !writable)
        return;
    if (!slot)
        slot = free_slot;
    if (!slot)
        return; /* more sockets than c-ares opens for one server list */
    short what =
        EV_PERSIST | (readable ? EV_READ : 0) | (writable ? EV_WRITE : 0);
    slot->fd = fd;
    slot->ev = event_new(v->base, fd, what, on_io, v);
    if (slot->ev)
        event_add(slot->ev, NULL);
}

/* ============================================================== a pass */

static void fail(dnsview *v, const char *what, int status)
{
    if (!v->failed)
        snprintf(v->fail_why, sizeof(v->fail_why), "%s: %s", what,
                 ares_strerror(status));
    v->failed = true;
}

/* The addresses of an answer, as "ip:port" members of the view. */
static void collect(dnsview *v, const struct ares_addrinfo *ai)
{
    for (const struct ares_addrinfo_node *n = ai ? ai->nodes : NULL; n;
         n = n->ai_next) {
        char addr[REGISTRY_ADDR_MAX + 1];
        if (!log_addr(n->ai_addr, n->ai_addrlen, addr, sizeof(addr)))
            continue;
        bool dup = false;
        for (size_t i = 0; i < v->ngot && !dup; i++)
            dup = strcmp(v->got[i].addr, addr) == 0;
        if (dup || v->ngot == DNSVIEW_ADDRS_MAX)
            continue;
        registry_member *m = &v->got[v->ngot++];
        memset(m, 0, sizeof(*m));
        m->state = REGISTRY_ALIVE;
        snprintf(m->addr, sizeof(m->addr), "%s", addr);
    }
}

static int cmp_member(const void *a, const void *b)
{
    return strcmp(((const registry_member *)a)->addr,
                  ((const registry_member *)b)->addr);
}

/* The last answer of the pass is in: hand the view over, or keep the
 * last one when a query failed. */
static void pass_done(dnsview *v)
{
    if (v->failed) {
        viewsrc_failed(&v->src, v->fail_why);
        return;
    }
    qsort(v->got, v->ngot, sizeof(v->got[0]), cmp_member);
    viewsrc_view(&v->src, v->got, v->ngot);
}

static void pass_step(dnsview *v)
{
    if (--v->pending == 0 && !v->destroying)
        pass_done(v);
}

static void on_addrs(void *arg, int status, int timeouts,
                     struct ares_addrinfo *res)
{
    dnsview *v = arg;
    (void)timeouts;
    if (status == ARES_SUCCESS)
        collect(v, res);
    else if (status != ARES_ENOTFOUND && status != ARES_ENODATA &&
             status != ARES_EDESTRUCTION && status != ARES_ECANCELLED)
        fail(v, "address lookup", status);
    if (res)
        ares_freeaddrinfo(res);
    pass_step(v);
}

static void lookup_addrs(dnsview *v, const char *host, const char *port)
{
    struct ares_addrinfo_hints hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = ARES_AI_NUMERICSERV;
    v->pending++;
    ares_getaddrinfo(v->chan, host, port, &hints, on_addrs, v);
}

/* An SRV answer for names[i]: its targets, or the name's own addresses
 * when it has none. */
static void on_srv(void *arg, int status, int timeouts, unsigned char *abuf,
                   int alen)
{
    struct dname *d = arg;
    dnsview *v = d->v;
    (void)timeouts;
    if (v->destroying) {
        pass_step(v);
        return;
    }
    struct ares_srv_reply *srv = NULL;
    if (status == ARES_SUCCESS &&
        ares_parse_srv_reply(abuf, alen, &srv) == ARES_SUCCESS && srv) {
        for (struct ares_srv_reply *s = srv; s; s = s->next) {
            char port[8];
            snprintf(port, sizeof(port), "%u", (unsigned)s->port);
            lookup_addrs(v, s->host, port);
        }
        ares_free_data(srv);
    } else if (status == ARES_SUCCESS || status == ARES_ENODATA ||
               status == ARES_ENOTFOUND) {
        if (srv)
            ares_free_data(srv);
        lookup_addrs(v, d->host, d->port);
    } else if (status != ARES_EDESTRUCTION && status != ARES_ECANCELLED) {
        fail(v, "SRV lookup", status);
    }
    pass_step(v);
}

static void start_pass(dnsview *v)
{
    if (v->pending > 0)
        return; /* the last pass is still waiting for an answer */
    v->failed = false;
    v->ngot = 0;
    v->pending = 1; /* held until every query is issued */
    for (int i = 0; i < v->nnames; i++) {
        v->pending++;
        ares_query(v->chan, v->names[i].host, DNS_CLASS_IN, DNS_TYPE_SRV,
                   on_srv, &v->names[i]);
    }
    pass_step(v);
    arm_timeout(v);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    dnsview *v = arg;
    (void)fd;
    (void)what;
    start_pass(v);
    evloop_add_ms(v->tick, v->interval_ms);
}

/* ========================================================== lifecycle */

/* "name:port[,name:port...]" into v->names. */
static int parse_names(dnsview *v, const char *spec, char *err, size_t nerr)
{
    const char *p = spec, *item;
    size_t n;
    while (listspec_next(&p, &item, &n)) {
        const char *colon = NULL;
        for (size_t i = 0; i < n; i++)
            if (item[i] == ':')
                colon = item + i;
        if (v->nnames == DNSVIEW_NAMES_MAX) {
            snprintf(err, nerr, "peers_dns: more than %d names",
                     DNSVIEW_NAMES_MAX);
            return -1;
        }
        struct dname *d = &v->names[v->nnames];
        size_t hl = colon ? (size_t)(colon - item) : 0;
        size_t pl = colon ? n - hl - 1 : 0;
        char *end = NULL;
        unsigned long port = 0;
        if (colon && pl > 0 && pl < sizeof(d->port)) {
            memcpy(d->port, colon + 1, pl);
            d->port[pl] = '\0';
            port = strtoul(d->port, &end, 10);
        }
        if (!colon || hl == 0 || hl >= sizeof(d->host) || !end ||
            *end != '\0' || port < 1 || port > 65535) {
            snprintf(err, nerr, "peers_dns: '%.*s' is not name:port",
                     (int)(n > 100 ? 100 : n), item);
            return -1;
        }
        memcpy(d->host, item, hl);
        d->host[hl] = '\0';
        d->v = v;
        v->nnames++;
    }
    if (v->nnames == 0) {
        snprintf(err, nerr, "peers_dns: no name given");
        return -1;
    }
    return 0;
}

dnsview *dnsview_create(struct event_base *base, const dnsview_options *o,
                        registry_view_fn on_view, void *arg, char *err,
                        size_t nerr)
{
    pthread_once(&ares_once, ares_init_once);
    if (ares_init_rc != ARES_SUCCESS) {
        snprintf(err, nerr, "peers_dns: c-ares: %s",
                 ares_strerror(ares_init_rc));
        return NULL;
    }
    dnsview *v = calloc(1, sizeof(*v));
    if (!v) {
        snprintf(err, nerr, "out of memory");
        return NULL;
    }
    v->base = base;
    viewsrc_init(&v->src, "dns", o->names, "address", "addresses", on_view,
                 arg);
    v->interval_ms = o->interval_ms < 100 ? 100 : o->interval_ms;
    if (parse_names(v, o->names, err, nerr) != 0)
        goto fail;
    struct ares_options ao;
    memset(&ao, 0, sizeof(ao));
    ao.sock_state_cb = on_sock_state;
    ao.sock_state_cb_data = v;
    ao.timeout = 1000; /* ms a try */
    ao.tries = 2;
    int rc = ares_init_options(&v->chan, &ao,
                               ARES_OPT_SOCK_STATE_CB | ARES_OPT_TIMEOUTMS |
                                   ARES_OPT_TRIES);
    if (rc != ARES_SUCCESS) {
        snprintf(err, nerr, "peers_dns: c-ares: %s", ares_strerror(rc));
        goto fail;
    }
    v->chan_ok = true;
    if (o->server && o->server[0]) {
        rc = ares_set_servers_ports_csv(v->chan, o->server);
        if (rc != ARES_SUCCESS) {
            snprintf(err, nerr, "peers_dns_server '%s': %s", o->server,
                     ares_strerror(rc));
            goto fail;
        }
    }
    v->tick = evtimer_new(base, on_tick, v);
    v->timeout = evtimer_new(base, on_timeout, v);
    if (!v->tick || !v->timeout) {
        snprintf(err, nerr, "out of memory");
        goto fail;
    }
    evloop_add_ms(v->tick, 0); /* the first pass at once */
    return v;
fail:
    dnsview_destroy(v);
    return NULL;
}

void dnsview_destroy(dnsview *v)
{
    if (!v)
        return;
    v->destroying = true;
    if (v->chan_ok)
        ares_destroy(v->chan); /* callbacks run with ARES_EDESTRUCTION */
    for (int i = 0; i < DNSVIEW_SOCKS_MAX; i++)
        if (v->socks[i].ev)
            event_free(v->socks[i].ev);
    if (v->tick)
        event_free(v->tick);
    if (v->timeout)
        event_free(v->timeout);
    viewsrc_fini(&v->src);
    free(v);
}

void dnsview_source(dnsview *v, char *out, size_t n)
{
    viewsrc_text(&v->src, out, n);
}
