/*
 * registry_dir.c -- the member directory (a pure state machine: heartbeats,
 * SWIM-style probing, views), the view format, error names and timing.
 * No I/O. See registry.h for the layers and replication/README.md for the
 * protocol.
 */
#define _GNU_SOURCE
#include "registry_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repl_wire.h"

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
        if (!registry_addr_ok(m[i].addr, al) || m[i].node == 0 ||
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
            !registry_addr_ok((const char *)p + off + 14, al))
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
    if (node == 0 || !registry_addr_ok(addr, al))
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

bool registry_addr_ok(const char *a, size_t n)
{
    if (n == 0 || n > REGISTRY_ADDR_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (a[i] < 0x21 || a[i] > 0x7e)
            return false;
    return true;
}
