/*
 * repl_health.c -- one verdict per node, for `stats health` and
 * contrib/cluster-status: converged, catching up (and by how much), or
 * isolated. The tick computes it from the peer table and the last rounds;
 * the stats reader only loads what the tick stored. Also the log lines an
 * operator needs when a node is cut off: at start, when none of its peers
 * answers within a few seconds, and whenever it becomes or stops being
 * isolated.
 *
 * Threading: repl_health_tick runs on the replication thread; the
 * verdict fields are written and read with relaxed atomics.
 */
#include "repl_int.h"

#include <stdio.h>

/* A last round that moved more than this many differences: catching up. */
#define CATCHING_UP_DIFFS 1000
/* A node with peers none of which answered this long after start (or
 * after its last link went down) is isolated. */
#define ISOLATED_AFTER_NS (5ull * 1000000000ull)
/* A node that handed a round over for being behind counts as catching up
 * this long after. */
#define HANDED_CATCHING_UP_NS (2ull * 1000000000ull)

static const char *const verdict_names[] = {"converged", "catching_up",
                                            "isolated"};

void repl_health_tick(struct repl *r, uint64_t now)
{
    uint32_t total = 0, up = 0;
    uint64_t diffs = 0;
    bool any_ok = false, long_round = false;
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (p->self || p->vacant || p->member == REGISTRY_DEAD)
            continue;
        total++;
        if (!repl_peer_ready(p))
            continue;
        up++;
        if (p->last_ok_ns != 0) {
            any_ok = true;
            if (p->last_diffs > diffs)
                diffs = p->last_diffs;
        }
        if (p->round.active && (p->round.walk || p->round.bulk))
            long_round = true;
    }
    /* Being caught up by a peer: serving it a walked round or a bulk
     * transfer, or having just handed a round over for being behind. */
    for (struct conn *c = r->incoming; c; c = c->next)
        if (c->serving_since_ns != 0 && (c->walk || c->bulk_ids))
            long_round = true;
    if (r->handed_ns != 0 && now - r->handed_ns < HANDED_CATCHING_UP_NS)
        long_round = true;
    /* No peer at all (a peer list of this node alone): nothing to
     * disagree with. Peers but none up: isolated. Up, but in a walked
     * round or a bulk transfer, with no round done yet, or after a round
     * that found many differences: catching up. */
    int verdict = REPL_HEALTH_CONVERGED;
    if (up == 0 && (total > 0 || r->reg))
        verdict = REPL_HEALTH_ISOLATED;
    else if (up > 0 && (long_round || !any_ok || diffs > CATCHING_UP_DIFFS))
        verdict = REPL_HEALTH_CATCHING_UP;

    int before = ALOAD(r->health);
    uint64_t since = ALOAD(r->health_since_ns);
    if (verdict != before) {
        if (before == REPL_HEALTH_ISOLATED)
            LOG(LOG_LEVEL_WARN, "health",
                "no longer isolated: %u of %u peers up", (unsigned)up,
                (unsigned)total);
        ASTORE(r->health, verdict);
        ASTORE(r->health_since_ns, now);
        since = now;
    }
    /* Isolated for a while (a few seconds, so that a start-up or a
     * reconnect is not reported): say so, then every minute. */
    if (verdict == REPL_HEALTH_ISOLATED && now - since >= ISOLATED_AFTER_NS) {
        uint32_t held = 0;
        if (log_limit_pass(&r->isolated_log, 60000, &held))
            LOG(LOG_LEVEL_ERROR, "health",
                "isolated for %.0f s: none of %u peers%s answers; serving "
                "this node's data alone, its writes reach no other node",
                (double)(now - since) / 1e9, (unsigned)total,
                r->reg ? " (nor a registry's view)" : "");
    }
    ASTORE(r->health_up, up);
    ASTORE(r->health_total, total);
    ASTORE(r->health_diffs, diffs);
}

void repl_emit_health(repl *r, stats_emit_fn emit, void *arg)
{
    char val[64];
    int verdict = ALOAD(r->health);
    if (verdict < 0 || verdict > REPL_HEALTH_ISOLATED)
        verdict = REPL_HEALTH_CATCHING_UP;
    emit(arg, "health", verdict_names[verdict]);
    snprintf(val, sizeof(val), "%u", (unsigned)ALOAD(r->health_up));
    emit(arg, "health_peers_up", val);
    snprintf(val, sizeof(val), "%u", (unsigned)ALOAD(r->health_total));
    emit(arg, "health_peers", val);
    snprintf(val, sizeof(val), "%llu",
             (unsigned long long)ALOAD(r->health_diffs));
    emit(arg, "health_last_differences", val);
    uint64_t since = ALOAD(r->health_since_ns);
    uint64_t now = repl_now_ns();
    snprintf(val, sizeof(val), "%llu",
             (unsigned long long)(since && now > since
                                      ? (now - since) / 1000000000ull
                                      : 0));
    emit(arg, "health_for_s", val);
}
