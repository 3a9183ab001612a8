/*
 * repl_stats.c -- the "stats replication" group: the node's identity and
 * membership source, its counters, the push queue's length, the gap
 * between the rounds it starts, and each peer's state and counters.
 *
 * Threading: called from any thread (a client's stats command). It reads
 * relaxed atomics and fields fixed at creation, the peer table under
 * plock and the queue length under qlock.
 */
#include "repl_int.h"

#include <pthread.h>
#include <stdio.h>

/* ============================================================== stats */

void repl_emit_stats(repl *r, stats_emit_fn emit, void *arg)
{
    char name[192], val[192];
    snprintf(val, sizeof(val), "%u", r->o.node_id);
    emit(arg, "node_id", val);
    snprintf(val, sizeof(val), "%u", (unsigned)r->o.port);
    emit(arg, "peer_port", val);
    pthread_mutex_lock(&r->plock);
    int npeers = 0;
    for (int i = 0; i < r->npeers; i++)
        npeers += !r->peers[i].vacant;
    snprintf(val, sizeof(val), "%d", npeers);
    emit(arg, "peers", val);
    /* Where the peer set comes from: the static list alone, a registry,
     * or the cached view of a registry that is unreachable. */
    if (r->reg) {
        registry_client_source(r->reg, val, sizeof(val));
        emit(arg, "membership", val);
        snprintf(val, sizeof(val), "%llu",
                 (unsigned long long)registry_client_incarnation(r->reg));
        emit(arg, "incarnation", val);
        snprintf(val, sizeof(val), "%u", registry_client_connected(r->reg));
        emit(arg, "registries_connected", val);
    } else if (r->etcd) {
        etcdview_source(r->etcd, val, sizeof(val));
        emit(arg, "membership", val);
    } else if (r->dns) {
        dnsview_source(r->dns, val, sizeof(val));
        emit(arg, "membership", val);
    } else {
        emit(arg, "membership", "static");
    }
#define NSTATS_EMIT(n)                                                        \
    snprintf(val, sizeof(val), "%llu",                                        \
             (unsigned long long)PST_GET(&r->st, n));                         \
    emit(arg, #n, val);
    REPL_NODE_COUNTERS(NSTATS_EMIT)
#undef NSTATS_EMIT
    pthread_mutex_lock(&r->qlock);
    snprintf(val, sizeof(val), "%zu", r->qlen);
    pthread_mutex_unlock(&r->qlock);
    emit(arg, "push_queue_length", val);
    /* Ticks between the rounds this node starts (repl_round.c). */
    snprintf(val, sizeof(val), "%u",
             1u << __atomic_load_n(&r->round_backoff, __ATOMIC_RELAXED));
    emit(arg, "round_gap_ticks", val);
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (p->vacant)
            continue;
        snprintf(name, sizeof(name), "peer%d:addr", i);
        emit(arg, name, p->name);
        snprintf(name, sizeof(name), "peer%d:origin", i);
        emit(arg, name,
             p->origin == PEER_REGISTRY ? "registry"
             : p->origin == PEER_DNS    ? "dns"
             : p->origin == PEER_ETCD   ? "etcd"
                                        : "static");
        snprintf(name, sizeof(name), "peer%d:member", i);
        emit(arg, name, registry_state_name(p->member));
        snprintf(name, sizeof(name), "peer%d:incarnation", i);
        snprintf(val, sizeof(val), "%llu", (unsigned long long)p->incarnation);
        emit(arg, name, val);
        /* The connection pointer is the replication thread's: only a
         * coarse state is read here. */
        const char *state =
            __atomic_load_n(&p->self, __ATOMIC_RELAXED)   ? "self"
            : __atomic_load_n(&p->conn, __ATOMIC_RELAXED) ? "up"
                                                          : "down";
        snprintf(name, sizeof(name), "peer%d:state", i);
        emit(arg, name, state);
        snprintf(name, sizeof(name), "peer%d:node_id", i);
        snprintf(val, sizeof(val), "%u",
                 __atomic_load_n(&p->node_id, __ATOMIC_RELAXED));
        emit(arg, name, val);
#define PSTATS_EMIT(n)                                                        \
    snprintf(name, sizeof(name), "peer%d:" #n, i);                            \
    snprintf(val, sizeof(val), "%llu",                                        \
             (unsigned long long)PST_GET(&p->st, n));                         \
    emit(arg, name, val);
        REPL_PEER_COUNTERS(PSTATS_EMIT)
#undef PSTATS_EMIT
    }
    pthread_mutex_unlock(&r->plock);
}
