/*
 * registry.c -- the member directory (pure state machine), the registry
 * server and the member side of the registry protocol. See registry.h for
 * the layers and replication/README.md for the protocol.
 *
 * Threading: a registry_server runs on a thread of its own; its directory
 * is guarded by a mutex so that registry_server_emit_stats may read it
 * from any thread. A registry_client runs on its owner's event loop; the
 * few fields stats read are atomics or behind the client's mutex.
 */
#define _GNU_SOURCE
#include "registry.h"

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
#include "log.h"
#include "repl_link.h"
#include "repl_wire.h"

#define SERVER_CONNS_MAX 256
#define ACTIONS_MAX 256
#define PENDING_MAX 32
#define HELPERS_MAX 16
#define BACKOFF_FIRST_MS 50u
#define BACKOFF_MAX_MS 2000u
/* Dead members are forgotten after this many suspect timeouts (>= 60 s). */
#define DEAD_RETENTION_FACTOR 10u
#define DEAD_RETENTION_MIN_MS 60000u

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

const char *registry_strerror(int rc)
{
    switch (rc) {
    case REGISTRY_OK:
        return "ok";
    case REGISTRY_ERR_CONFIG:
        return "bad registry setting";
    case REGISTRY_ERR_NOMEM:
        return "out of memory";
    case REGISTRY_ERR_SYSTEM:
        return "system failure";
    case REGISTRY_ERR_FORMAT:
        return "malformed registry message";
    case REGISTRY_ERR_FULL:
        return "registry full";
    case REGISTRY_ERR_STALE:
        return "stale incarnation";
    case REGISTRY_ERR_UNKNOWN:
        return "unknown member";
    default:
        return "unknown error";
    }
}

const char *registry_state_name(int state)
{
    switch (state) {
    case REGISTRY_ALIVE:
        return "alive";
    case REGISTRY_SUSPECT:
        return "suspect";
    case REGISTRY_DEAD:
        return "dead";
    default:
        return "unknown";
    }
}

void registry_timing_default(registry_timing *t)
{
    t->heartbeat_ms = 1000;
    t->probe_ms = 1000;
    t->probe_timeout_ms = 500;
    t->suspect_timeout_ms = 5000;
    t->indirect_probes = 3;
}

int registry_timing_check(const registry_timing *t, char *err, size_t nerr)
{
    if (t->heartbeat_ms == 0 || t->probe_ms == 0 || t->probe_timeout_ms == 0 ||
        t->suspect_timeout_ms == 0) {
        snprintf(err, nerr,
                 "heartbeat_ms, probe_ms, probe_timeout_ms and "
                 "suspect_timeout_ms must be > 0");
        return REGISTRY_ERR_CONFIG;
    }
    if (t->indirect_probes > HELPERS_MAX) {
        snprintf(err, nerr, "indirect_probes must be at most %d", HELPERS_MAX);
        return REGISTRY_ERR_CONFIG;
    }
    return REGISTRY_OK;
}

/* ================================================================ views */

static bool addr_ok(const char *a, size_t n)
{
    if (n == 0 || n > REGISTRY_ADDR_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (a[i] < 0x21 || a[i] > 0x7e)
            return false;
    return true;
}

long registry_view_encode(uint8_t *out, size_t cap, uint64_t epoch,
                          const registry_member *m, size_t n)
{
    if (cap < 12 || n > UINT32_MAX)
        return REGISTRY_ERR_FORMAT;
    repl_wire_put_u64(out, epoch);
    repl_wire_put_u32(out + 8, (uint32_t)n);
    size_t off = 12;
    for (size_t i = 0; i < n; i++) {
        size_t al = strnlen(m[i].addr, REGISTRY_ADDR_MAX + 1);
        if (!addr_ok(m[i].addr, al) || m[i].node == 0 ||
            m[i].state > REGISTRY_DEAD || cap - off < 14 + al)
            return REGISTRY_ERR_FORMAT;
        repl_wire_put_u32(out + off, m[i].node);
        repl_wire_put_u64(out + off + 4, m[i].incarnation);
        out[off + 12] = m[i].state;
        out[off + 13] = (uint8_t)al;
        memcpy(out + off + 14, m[i].addr, al);
        off += 14 + al;
    }
    return (long)off;
}

int registry_view_decode(const uint8_t *p, size_t len, uint64_t *epoch,
                         registry_member *out, size_t max, size_t *n)
{
    if (len < 12)
        return REGISTRY_ERR_FORMAT;
    *epoch = repl_wire_get_u64(p);
    uint32_t count = repl_wire_get_u32(p + 8);
    if (count > max)
        return REGISTRY_ERR_FORMAT;
    size_t off = 12;
    for (uint32_t i = 0; i < count; i++) {
        if (len - off < 14)
            return REGISTRY_ERR_FORMAT;
        registry_member *m = &out[i];
        m->node = repl_wire_get_u32(p + off);
        m->incarnation = repl_wire_get_u64(p + off + 4);
        m->state = p[off + 12];
        size_t al = p[off + 13];
        if (m->node == 0 || m->state > REGISTRY_DEAD || len - off - 14 < al ||
            !addr_ok((const char *)p + off + 14, al))
            return REGISTRY_ERR_FORMAT;
        memcpy(m->addr, p + off + 14, al);
        m->addr[al] = '\0';
        off += 14 + al;
    }
    if (off != len)
        return REGISTRY_ERR_FORMAT;
    *n = count;
    return REGISTRY_OK;
}

/* ============================================================ directory */

enum probe_phase { PROBE_NONE, PROBE_DIRECT, PROBE_INDIRECT };

struct dmember {
    registry_member m;
    bool used;
    bool connected;
    bool probe_now; /* its connection dropped: probe at the next step */
    uint64_t seen_ms, suspect_ms, dead_ms;
    enum probe_phase probe;
    uint64_t token, deadline;
    uint32_t helpers_pending;
};

struct registry_dir {
    registry_timing t;
    struct dmember m[REGISTRY_MEMBERS_MAX];
    uint64_t epoch;
    uint64_t rng;
    uint64_t next_token;
    uint64_t next_probe_ms;
    size_t cursor;
    registry_counters st;
};

registry_dir *registry_dir_create(const registry_timing *t, uint64_t seed)
{
    registry_dir *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->t = *t;
    d->rng = seed;
    d->epoch = 1;
    return d;
}

void registry_dir_destroy(registry_dir *d)
{
    free(d);
}

static struct dmember *dir_find(registry_dir *d, uint32_t node)
{
    for (size_t i = 0; i < REGISTRY_MEMBERS_MAX; i++)
        if (d->m[i].used && d->m[i].m.node == node)
            return &d->m[i];
    return NULL;
}

static const struct dmember *dir_cfind(const registry_dir *d, uint32_t node)
{
    for (size_t i = 0; i < REGISTRY_MEMBERS_MAX; i++)
        if (d->m[i].used && d->m[i].m.node == node)
            return &d->m[i];
    return NULL;
}

/* Any sign of life ends a probe and a suspicion. */
static void dir_alive(registry_dir *d, struct dmember *x, uint64_t now)
{
    x->seen_ms = now;
    x->probe = PROBE_NONE;
    if (x->m.state == REGISTRY_SUSPECT) {
        x->m.state = REGISTRY_ALIVE;
        d->epoch++;
        d->st.refuted++;
    }
}

static void dir_probe_failed(registry_dir *d, struct dmember *x, uint64_t now)
{
    x->probe = PROBE_NONE;
    d->st.probes_failed++;
    if (x->m.state == REGISTRY_ALIVE) {
        x->m.state = REGISTRY_SUSPECT;
        x->suspect_ms = now;
        d->epoch++;
        d->st.suspected++;
    }
}

int registry_dir_register(registry_dir *d, uint32_t node, uint64_t inc,
                          const char *addr, uint64_t now_ms, uint64_t *known)
{
    size_t al = addr ? strnlen(addr, REGISTRY_ADDR_MAX + 1) : 0;
    if (node == 0 || !addr_ok(addr, al))
        return REGISTRY_ERR_FORMAT;
    struct dmember *x = dir_find(d, node);
    if (!x) {
        for (size_t i = 0; i < REGISTRY_MEMBERS_MAX && !x; i++)
            if (!d->m[i].used)
                x = &d->m[i];
        if (!x) {
            d->st.refused_full++;
            return REGISTRY_ERR_FULL;
        }
        memset(x, 0, sizeof(*x));
        x->used = true;
        x->m.node = node;
        x->m.incarnation = inc;
        x->m.state = REGISTRY_ALIVE;
        memcpy(x->m.addr, addr, al + 1);
        x->seen_ms = now_ms;
        d->epoch++;
        d->st.registrations++;
        return REGISTRY_OK;
    }
    if (inc < x->m.incarnation ||
        (inc == x->m.incarnation && x->m.state == REGISTRY_DEAD)) {
        *known = x->m.incarnation;
        d->st.rejoins++;
        return REGISTRY_ERR_STALE;
    }
    bool changed = inc != x->m.incarnation || strcmp(addr, x->m.addr) != 0 ||
                   x->m.state != REGISTRY_ALIVE;
    x->m.incarnation = inc;
    x->m.state = REGISTRY_ALIVE;
    memcpy(x->m.addr, addr, al + 1);
    x->seen_ms = now_ms;
    x->probe = PROBE_NONE;
    x->probe_now = false;
    if (changed)
        d->epoch++;
    d->st.registrations++;
    return REGISTRY_OK;
}

int registry_dir_heartbeat(registry_dir *d, uint32_t node, uint64_t inc,
                           uint64_t now_ms, uint64_t *known)
{
    struct dmember *x = dir_find(d, node);
    if (!x) {
        *known = 0;
        return REGISTRY_ERR_UNKNOWN;
    }
    /* A newer incarnation must come with its address: register again. */
    if (x->m.state == REGISTRY_DEAD || inc != x->m.incarnation) {
        *known = x->m.incarnation;
        d->st.rejoins++;
        return REGISTRY_ERR_STALE;
    }
    d->st.heartbeats++;
    dir_alive(d, x, now_ms);
    return REGISTRY_OK;
}

int registry_dir_leave(registry_dir *d, uint32_t node, uint64_t inc)
{
    struct dmember *x = dir_find(d, node);
    if (!x)
        return REGISTRY_ERR_UNKNOWN;
    if (inc < x->m.incarnation)
        return REGISTRY_ERR_STALE;
    x->used = false;
    d->epoch++;
    d->st.leaves++;
    return REGISTRY_OK;
}

void registry_dir_connected(registry_dir *d, uint32_t node, bool up,
                            uint64_t now_ms)
{
    (void)now_ms;
    struct dmember *x = dir_find(d, node);
    if (!x)
        return;
    x->connected = up;
    if (!up && x->m.state != REGISTRY_DEAD && x->probe == PROBE_NONE)
        x->probe_now = true;
}

void registry_dir_pong(registry_dir *d, uint32_t node, uint64_t token,
                       uint64_t now_ms)
{
    struct dmember *x = dir_find(d, node);
    if (x && x->probe != PROBE_NONE && x->token == token &&
        x->m.state != REGISTRY_DEAD)
        dir_alive(d, x, now_ms);
}

void registry_dir_ack(registry_dir *d, uint32_t via, uint32_t target,
                      uint64_t token, bool ok, uint64_t now_ms)
{
    (void)via;
    struct dmember *x = dir_find(d, target);
    if (!x || x->probe != PROBE_INDIRECT || x->token != token ||
        x->m.state == REGISTRY_DEAD)
        return;
    if (ok) {
        dir_alive(d, x, now_ms);
        return;
    }
    /* Every helper said no: no need to wait for the deadline. */
    if (x->helpers_pending > 0 && --x->helpers_pending == 0)
        dir_probe_failed(d, x, now_ms);
}

struct actions {
    registry_action *v;
    size_t n, max;
};

static bool act_emit(struct actions *a, int kind, uint32_t to, uint32_t target,
                     uint64_t token)
{
    if (a->n == a->max)
        return false;
    a->v[a->n++] = (registry_action){kind, to, target, token};
    return true;
}

/*
 * Asks up to indirect_probes alive, connected members other than x to
 * ping x. With no helper at all the probe fails at once.
 */
static void dir_indirect(registry_dir *d, struct dmember *x, uint64_t now,
                         struct actions *a)
{
    size_t cand[REGISTRY_MEMBERS_MAX], nc = 0;
    for (size_t i = 0; i < REGISTRY_MEMBERS_MAX; i++) {
        struct dmember *h = &d->m[i];
        if (h->used && h != x && h->connected && h->m.state == REGISTRY_ALIVE)
            cand[nc++] = i;
    }
    uint32_t asked = 0;
    for (uint32_t k = 0; k < d->t.indirect_probes && nc > 0; k++) {
        size_t j = (size_t)(splitmix(&d->rng) % nc);
        if (act_emit(a, REGISTRY_ACT_PING_REQ, d->m[cand[j]].m.node, x->m.node,
                     x->token))
            asked++;
        cand[j] = cand[--nc];
    }
    if (asked == 0) {
        dir_probe_failed(d, x, now);
        return;
    }
    d->st.indirect_probes++;
    x->probe = PROBE_INDIRECT;
    x->helpers_pending = asked;
    x->deadline = now + d->t.probe_timeout_ms;
}

static void dir_probe(registry_dir *d, struct dmember *x, uint64_t now,
                      struct actions *a)
{
    d->st.probes++;
    x->token = ++d->next_token;
    if (x->connected &&
        act_emit(a, REGISTRY_ACT_PING, x->m.node, 0, x->token)) {
        x->probe = PROBE_DIRECT;
        x->deadline = now + d->t.probe_timeout_ms;
        return;
    }
    /* No registry connection: the direct probe has failed already. */
    dir_indirect(d, x, now, a);
}

size_t registry_dir_step(registry_dir *d, uint64_t now_ms,
                         registry_action *out, size_t max)
{
    struct actions a = {out, 0, max};
    uint64_t retention =
        (uint64_t)d->t.suspect_timeout_ms * DEAD_RETENTION_FACTOR;
    if (retention < DEAD_RETENTION_MIN_MS)
        retention = DEAD_RETENTION_MIN_MS;
    for (size_t i = 0; i < REGISTRY_MEMBERS_MAX; i++) {
        struct dmember *x = &d->m[i];
        if (!x->used)
            continue;
        if (x->m.state == REGISTRY_DEAD) {
            if (now_ms - x->dead_ms >= retention) {
                x->used = false;
                d->epoch++;
            }
            continue;
        }
        if (x->m.state == REGISTRY_SUSPECT &&
            now_ms - x->suspect_ms >= d->t.suspect_timeout_ms) {
            x->m.state = REGISTRY_DEAD;
            x->dead_ms = now_ms;
            x->probe = PROBE_NONE;
            x->probe_now = false;
            d->epoch++;
            d->st.declared_dead++;
            continue;
        }
        if (x->probe == PROBE_DIRECT && now_ms >= x->deadline)
            dir_indirect(d, x, now_ms, &a);
        else if (x->probe == PROBE_INDIRECT && now_ms >= x->deadline)
            dir_probe_failed(d, x, now_ms);
        if (x->probe == PROBE_NONE && x->probe_now) {
            x->probe_now = false;
            dir_probe(d, x, now_ms, &a);
        }
    }
    if (now_ms >= d->next_probe_ms) {
        d->next_probe_ms = now_ms + d->t.probe_ms;
        /* Round robin over the members, as SWIM does. */
        for (size_t k = 0; k < REGISTRY_MEMBERS_MAX; k++) {
            struct dmember *x = &d->m[(d->cursor + k) % REGISTRY_MEMBERS_MAX];
            if (x->used && x->m.state != REGISTRY_DEAD &&
                x->probe == PROBE_NONE) {
                d->cursor = (d->cursor + k + 1) % REGISTRY_MEMBERS_MAX;
                dir_probe(d, x, now_ms, &a);
                break;
            }
        }
    }
    return a.n;
}

uint64_t registry_dir_epoch(const registry_dir *d)
{
    return d->epoch;
}

size_t registry_dir_view(const registry_dir *d, registry_member *out,
                         size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < REGISTRY_MEMBERS_MAX && n < max; i++)
        if (d->m[i].used)
            out[n++] = d->m[i].m;
    return n;
}

bool registry_dir_get(const registry_dir *d, uint32_t node,
                      registry_member *out)
{
    const struct dmember *x = dir_cfind(d, node);
    if (!x)
        return false;
    *out = x->m;
    return true;
}

void registry_dir_counters(const registry_dir *d, registry_counters *out)
{
    *out = d->st;
}

/* ================================================================= links */

/*
 * The registry channel runs on the peer channel's links (repl_link.h):
 * same frames, same handshake with the cluster secret. A registry answers
 * with node id 0, which tells a member it reached a registry and not a
 * peer port; a registry refuses a member calling itself 0.
 */

/* Link settings of either side: frames up to 16 KiB, idle timeout. */
static repl_link_options link_options(const char *secret, struct repl_tls *tls,
                                      uint32_t node_id,
                                      const registry_timing *t)
{
    uint64_t ms = 3ull * t->heartbeat_ms + 2000;
    repl_link_options o = {
        .secret = secret,
        .tls = tls,
        .node_id = node_id,
        .max_payload = REGISTRY_FRAME_MAX,
        /* Seconds without a frame after which a ready link is dropped. */
        .idle_s = (uint32_t)((ms + 999) / 1000),
    };
    return o;
}

/* Logs a refused handshake with its reason, at most once per 10 s. */
static void log_refusal(log_limit *lim, const repl_link *l, const char *what,
                        const char *name)
{
    uint32_t held = 0;
    char addr[64];
    if (!log_limit_pass(lim, 10000, &held))
        return;
    repl_link_peer_addr(l, addr, sizeof(addr));
    if (name)
        snprintf(addr, sizeof(addr), "%s", name);
    const char *why = repl_link_refusal(l);
    LOG(LOG_LEVEL_WARN, "registry",
        "%s %s refused: %s; %u more since the "
        "last such line",
        what, addr,
        why ? why
            : (repl_link_tls(l) ? "not a member of this cluster"
                                : "handshake failed (wrong cluster_secret?)"),
        (unsigned)held);
}

static int send_u64(repl_link *l, uint8_t type, uint64_t v)
{
    uint8_t p[8];
    repl_wire_put_u64(p, v);
    return repl_link_send(l, type, p, 8);
}

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
        !addr_ok((const char *)p + 13, al))
        return -1;
    memcpy(addr, p + 13, al);
    addr[al] = '\0';
    uint64_t now = now_ms(), known = 0;
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
        return send_u64(c->l, REPL_MSG_REG_REJOIN, known) == 0 ? 0 : -1;
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
    uint64_t now = now_ms(), known = 0;
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
        return send_u64(c->l, REPL_MSG_REG_REJOIN, known) == 0 ? 0 : -1;
    /* Every heartbeat is answered, so a member notices a dead registry. */
    return view || send_u64(c->l, REPL_MSG_PONG, 0) == 0 ? 0 : -1;
}

static int server_frame(void *arg, repl_link *l, const repl_frame *f)
{
    struct sconn *c = arg;
    struct registry_server *s = c->s;
    const uint8_t *p = f->payload;
    uint64_t now = now_ms();
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
        log_refusal(&s->refused_log, l, "incoming registry connection from",
                    NULL);
    else if (why == REPL_LINK_CLOSED_BAD_FRAME)
        RS_ADD(s, bad_frames);
    if (c->member) {
        pthread_mutex_lock(&s->lock);
        registry_dir_connected(s->dir, c->node, false, now_ms());
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
    repl_link_options lo = link_options(s->secret, s->o.tls, 0, &s->o.timing);
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
    struct timeval tv = {(time_t)(s->tick_ms / 1000),
                         (suseconds_t)(s->tick_ms % 1000) * 1000};
    event_add(s->tick, &tv);
}

/* Drives the directory: probes to send, views to publish. */
static void server_tick(evutil_socket_t fd, short what, void *arg)
{
    struct registry_server *s = arg;
    (void)fd;
    (void)what;
    registry_action acts[ACTIONS_MAX];
    uint64_t now = now_ms();
    pthread_mutex_lock(&s->lock);
    size_t n = registry_dir_step(s->dir, now, acts, ACTIONS_MAX);
    for (size_t i = 0; i < n; i++) {
        struct sconn *c = member_conn(s, acts[i].to);
        if (!c)
            continue; /* the probe times out */
        if (acts[i].kind == REGISTRY_ACT_PING) {
            send_u64(c->l, REPL_MSG_PING, acts[i].token);
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
    s->publish_at = now_ms() + grace;
    server_tick_arm(s);
    return s;
fail:
    registry_server_destroy(s);
    return NULL;
}

int registry_server_start(registry_server *s)
{
    return evloop_start(&s->loop) == 0 ? REGISTRY_OK : REGISTRY_ERR_SYSTEM;
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
        k->next_hb = now_ms() + k->c->o.timing.heartbeat_ms;
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
    k->retry_at = now_ms() + k->backoff_ms;
    if (!c->leaving && c->source == (int)(k - c->links))
        client_pick_source(c, true);
}

static void client_closed(void *arg, repl_link *l, int why)
{
    struct rlink *k = arg;
    if (why == REPL_LINK_CLOSED_AUTH)
        log_refusal(&k->c->refused_log, l, "registry connection to", k->name);
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
        link_options(c->secret, c->o.tls, c->o.node_id, &c->o.timing);
    int rc = repl_link_dial(c->base, (struct sockaddr *)&k->addr, k->addrlen,
                            &o, &client_ops, k, &k->l);
    if (rc == REPL_LINK_ERR_CONNECT)
        client_lost(k, false);
}

static void client_tick_arm(struct registry_client *c)
{
    struct timeval tv = {(time_t)(c->tick_ms / 1000),
                         (suseconds_t)(c->tick_ms % 1000) * 1000};
    event_add(c->tick, &tv);
}

static void client_tick(evutil_socket_t fd, short what, void *arg)
{
    struct registry_client *c = arg;
    (void)fd;
    (void)what;
    uint64_t now = now_ms();
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
    const char *p = o->registries ? o->registries : "";
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        const char *e = p;
        while (*e && *e != ',' && *e != ' ')
            e++;
        if (c->nlinks == REGISTRY_SERVERS_MAX) {
            snprintf(err, nerr, "more than %d registries",
                     REGISTRY_SERVERS_MAX);
            goto fail;
        }
        struct rlink *k = &c->links[c->nlinks];
        size_t n = (size_t)(e - p);
        if (n > REGISTRY_ADDR_MAX) {
            snprintf(err, nerr, "registry address too long");
            goto fail;
        }
        memcpy(k->name, p, n);
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
        p = e;
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
