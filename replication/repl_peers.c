/*
 * repl_peers.c -- the peer table: its slots, the state of a peer's
 * outgoing connection (ready, or lost and waiting out a backoff), the
 * registry's view of the members merged into it beside the static list,
 * and the indirect probes the registry asks this node to make.
 *
 * Threading: replication thread only. The table changes under plock,
 * which the stats reader takes to read it.
 */
#include "repl_int.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* ============================================================== peers */

/* Its outgoing connection is authenticated and open. */
bool repl_peer_ready(const struct peer *p)
{
    return p->conn && repl_link_ready(p->conn->link);
}

/* Closes the peer's connection and frees its round's memory. */
void repl_peer_free(struct peer *p)
{
    if (p->conn)
        repl_conn_free(p->conn);
    repl_round_reset(p);
    free(p->round.own);
    free(p->round.ps);
    free(p->round.diffs);
    free(p->round.wanted);
    free(p->round.parts);
    riblt_decoder_destroy(p->round.dec);
}

/*
 * An outgoing connection is gone (why: the reason, for the log): fail its
 * round, retry after a backoff. A peer that was up is logged down once;
 * one that stays down is logged again at most every 30 s.
 */
void repl_peer_lost(struct peer *p, const char *why)
{
    if (p->round.active)
        repl_round_fail(p, "connection closed");
    if (p->self) {
        /* our own address: not a peer, nothing to report */
    } else if (p->down_since_ns == 0 || strcmp(why, p->down_why) != 0) {
        if (p->down_since_ns == 0)
            p->down_attempts = 0;
        LOG(LOG_LEVEL_WARN, "repl", "peer %s (node %u) %s: %s", p->name,
            (unsigned)p->node_id,
            p->down_since_ns == 0 ? "down" : "still down", why);
        snprintf(p->down_why, sizeof(p->down_why), "%s", why);
        p->down_log.next_ns = 0;
        log_limit_pass(&p->down_log, 30000, NULL);
    } else if (log_limit_pass(&p->down_log, 30000, NULL)) {
        LOG(LOG_LEVEL_WARN, "repl",
            "peer %s (node %u) still down after %u attempts: %s", p->name,
            (unsigned)p->node_id, (unsigned)p->down_attempts + 1, why);
    }
    p->down_attempts++;
    /* Stores the stats reader may see: atomic (it only tests them). */
    __atomic_store_n(&p->conn, NULL, __ATOMIC_RELAXED);
    p->connecting = false;
    uint64_t now = repl_now_ns();
    if (p->down_since_ns == 0)
        p->down_since_ns = now;
    /* A link down for a short while is retried every few tens of
     * milliseconds, so a peer back from a short partition or a stall is
     * used again at once; one down longer backs off exponentially. */
    if (now - p->down_since_ns < FAST_RETRY_NS)
        p->backoff_ms = FAST_RETRY_MS;
    else
        p->backoff_ms = p->backoff_ms ? p->backoff_ms * 2 : FAST_RETRY_MS;
    if (p->backoff_ms > BACKOFF_MAX_MS)
        p->backoff_ms = BACKOFF_MAX_MS;
    p->retry_at_ns = now + (uint64_t)p->backoff_ms * 1000000ull;
    /* Redial when the backoff ends, not at the next tick (a period of
     * up to 1.5 x repl_period_ms away). */
    repl_arm_redial(p->r, p->backoff_ms);
}

/* ========================================================== membership */

/* Closes a slot's connection, frees its round state and marks it vacant. */
static void peer_release(struct repl *r, struct peer *p)
{
    repl_peer_free(p);
    memset(p, 0, sizeof(*p));
    p->r = r;
    p->vacant = true;
}

/* A vacant slot or a new one at the end; NULL when the table is full. */
static struct peer *peer_slot(struct repl *r)
{
    for (int i = 0; i < r->npeers; i++)
        if (r->peers[i].vacant)
            return &r->peers[i];
    if (r->npeers == PEER_MAX)
        return NULL;
    struct peer *p = &r->peers[r->npeers++];
    memset(p, 0, sizeof(*p));
    p->r = r;
    p->vacant = true;
    return p;
}

/*
 * One view of a membership source (a registry, DNS): members new to it get
 * a slot and are dialled by the next tick, a member whose address changed
 * is dialled again, a dead one loses its connection and is left alone, and
 * a member no longer in the view is removed. A member is known by its node
 * id, or by its address when the source knows no ids (node 0: DNS). Peers
 * of other origins are never touched; a member that is already a peer of
 * another origin (same address or id) stays what it was.
 */
static void view_apply(struct repl *r, uint8_t origin,
                       const registry_member *m, size_t n, const char *source)
{
    bool seen[PEER_MAX] = {false};
    pthread_mutex_lock(&r->plock);
    for (size_t i = 0; i < n; i++) {
        if (m[i].node != 0 && m[i].node == r->o.node_id)
            continue;
        struct peer *p = NULL;
        bool elsewhere = false;
        for (int j = 0; j < r->npeers; j++) {
            struct peer *q = &r->peers[j];
            if (q->vacant)
                continue;
            bool same = m[i].node != 0 ? q->view_node == m[i].node
                                       : strcmp(q->name, m[i].addr) == 0;
            if (q->origin == origin && same)
                p = q;
            else if (q->origin != origin &&
                     (strcmp(q->name, m[i].addr) == 0 ||
                      (m[i].node != 0 && q->node_id == m[i].node)))
                elsewhere = true;
        }
        if (elsewhere)
            continue;
        if (p && strcmp(p->name, m[i].addr) != 0) {
            peer_release(r, p);
            p = NULL;
        }
        if (!p) {
            char err[256];
            p = peer_slot(r);
            if (!p)
                continue;
            if (repl_peer_parse(p, m[i].addr, strlen(m[i].addr), err,
                                sizeof(err)) != REPL_OK) {
                memset(p, 0, sizeof(*p));
                p->r = r;
                p->vacant = true;
                continue;
            }
            p->vacant = false;
            p->origin = origin;
            p->view_node = m[i].node;
            p->node_id = m[i].node;
            p->member = m[i].state;
            if (m[i].node != 0)
                LOG(LOG_LEVEL_INFO, "membership",
                    "node %u at %s joins the view (%s, from %s)",
                    (unsigned)m[i].node, m[i].addr,
                    registry_state_name(m[i].state), source ? source : "?");
            else
                LOG(LOG_LEVEL_INFO, "membership",
                    "%s joins the view (from %s)", m[i].addr,
                    source ? source : "?");
        }
        seen[p - r->peers] = true;
        p->incarnation = m[i].incarnation;
        if (m[i].state == REGISTRY_DEAD && p->conn)
            repl_conn_free(p->conn);
        if (p->member != m[i].state)
            LOG(LOG_LEVEL_INFO, "membership", "node %u at %s: %s -> %s",
                (unsigned)m[i].node, m[i].addr, registry_state_name(p->member),
                registry_state_name(m[i].state));
        p->member = m[i].state;
    }
    for (int j = 0; j < r->npeers; j++) {
        struct peer *q = &r->peers[j];
        if (!q->vacant && q->origin == origin && !seen[j]) {
            LOG(LOG_LEVEL_INFO, "membership", "node %u at %s leaves the view",
                (unsigned)q->node_id, q->name);
            peer_release(r, q);
        }
    }
    pthread_mutex_unlock(&r->plock);
}

void repl_on_view(void *arg, const registry_member *m, size_t n,
                  const char *source)
{
    view_apply(arg, PEER_REGISTRY, m, n, source);
}

void repl_on_dns_view(void *arg, const registry_member *m, size_t n,
                      const char *source)
{
    view_apply(arg, PEER_DNS, m, n, source);
}

void repl_on_etcd_view(void *arg, const registry_member *m, size_t n,
                       const char *source)
{
    view_apply(arg, PEER_ETCD, m, n, source);
}

/*
 * An indirect probe (registry_ping_fn): PING target over our connection
 * to it; its PONG comes back through repl_on_reply.
 */
int repl_on_ping(void *arg, uint32_t target, uint64_t token)
{
    struct repl *r = arg;
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (p->vacant || p->self || p->node_id != target ||
            !repl_peer_ready(p))
            continue;
        repl_wire_put_u64(repl_payload_area(r), token);
        return repl_conn_send(p->conn, REPL_MSG_PING, 8);
    }
    return -1;
}
