/*
 * registry_int.h -- what the registry's three parts share, private to
 * registry_dir.c (the member directory and the view format, pure),
 * registry_server.c (the registry server) and registry_client.c (the
 * member side): limits, the clock, and the link settings and helpers of
 * the registry channel.
 */
#ifndef REGISTRY_INT_H
#define REGISTRY_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "log.h"
#include "registry.h"
#include "repl_link.h"

#define SERVER_CONNS_MAX 256
#define ACTIONS_MAX 256
#define PENDING_MAX 32
#define HELPERS_MAX 16
#define BACKOFF_FIRST_MS 50u
#define BACKOFF_MAX_MS 2000u
/* Dead members are forgotten after this many suspect timeouts (>= 60 s). */
#define DEAD_RETENTION_FACTOR 10u
#define DEAD_RETENTION_MIN_MS 60000u

/* Monotonic milliseconds. */
static inline uint64_t registry_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* An address a view may carry: 1..REGISTRY_ADDR_MAX printable bytes. */
bool registry_addr_ok(const char *a, size_t n);

/*
 * The registry channel runs on the peer channel's links (repl_link.h):
 * same frames, same handshake with the cluster secret (or TLS). A registry
 * answers with node id 0, which tells a member it reached a registry and
 * not a peer port; a registry refuses a member calling itself 0.
 */

/* Link settings of either side: frames up to 16 KiB, idle timeout. */
repl_link_options registry_link_options(const char *secret,
                                        struct repl_tls *tls, uint32_t node_id,
                                        const registry_timing *t);

/* Logs a refused handshake with its reason, at most once per 10 s; name
 * (may be NULL) replaces the link's address. */
void registry_log_refusal(log_limit *lim, const repl_link *l, const char *what,
                          const char *name);

/* Sends a frame whose payload is one u64. */
int registry_send_u64(repl_link *l, uint8_t type, uint64_t v);

#endif /* REGISTRY_INT_H */
