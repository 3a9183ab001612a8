/*
 * registry_link.c -- the registry channel's link settings and the helpers
 * the registry server and the member side share (registry_int.h).
 */
#include "registry_int.h"

#include <stdio.h>

#include "repl_wire.h"

/* Link settings of either side: frames up to 16 KiB, idle timeout. */
repl_link_options registry_link_options(const char *secret,
                                        struct repl_tls *tls, uint32_t node_id,
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
void registry_log_refusal(log_limit *lim, const repl_link *l, const char *what,
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

int registry_send_u64(repl_link *l, uint8_t type, uint64_t v)
{
    uint8_t p[8];
    repl_wire_put_u64(p, v);
    return repl_link_send(l, type, p, 8);
}
