/*
 * registry.h -- membership through a registry: the member directory with
 * heartbeats and SWIM-style probing, the registry server that hosts it, and
 * the member (client) side of the registry protocol.
 *
 * Three layers, each usable on its own:
 *   - registry_dir: the directory as a pure state machine driven by the
 *     caller's clock (milliseconds). It decides who is alive, suspect or
 *     dead and which probes to send; it does no I/O, so it is tested with
 *     a fake clock.
 *   - registry_server: a listener with its own thread and event loop that
 *     speaks the registry protocol (authenticated repl_wire frames) and
 *     drives a registry_dir. It runs inside a node or alone.
 *   - registry_client: runs on the replication thread's event loop; keeps
 *     one connection per configured registry, registers, heartbeats,
 *     answers probes, forwards indirect probes to the peer channel, and
 *     hands the live membership to its owner (a cached copy survives while
 *     every registry is down).
 * The protocol and the decisions are in replication/README.md.
 */
#ifndef REGISTRY_H
#define REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stats.h"

struct event_base;

enum registry_rc {
    REGISTRY_OK = 0,
    REGISTRY_ERR_CONFIG = -1, /* bad option value (message in err) */
    REGISTRY_ERR_NOMEM = -2,
    REGISTRY_ERR_SYSTEM = -3, /* socket, thread or event loop failure */
    REGISTRY_ERR_FORMAT = -4, /* malformed payload */
    REGISTRY_ERR_FULL = -5,   /* directory holds REGISTRY_MEMBERS_MAX */
    REGISTRY_ERR_STALE = -6,  /* incarnation too old: rejoin with a newer */
    REGISTRY_ERR_UNKNOWN = -7 /* no such member */
};

const char *registry_strerror(int rc);

/* Members one directory (and one view) holds. */
#define REGISTRY_MEMBERS_MAX 64
/* Longest advertised peer address ("host:port"). */
#define REGISTRY_ADDR_MAX 127
/* Largest payload on the registry channel once authenticated. */
#define REGISTRY_FRAME_MAX (16u << 10)
/* Registries one member may list. */
#define REGISTRY_SERVERS_MAX 8

enum registry_state {
    REGISTRY_ALIVE = 0,
    REGISTRY_SUSPECT = 1,
    REGISTRY_DEAD = 2,
};

/* "alive", "suspect", "dead" (or "unknown"). */
const char *registry_state_name(int state);

/* One entry of the membership view. */
typedef struct registry_member {
    uint32_t node;
    uint64_t incarnation;
    uint8_t state; /* enum registry_state */
    char addr[REGISTRY_ADDR_MAX + 1];
} registry_member;

/* Periods and timeouts, in milliseconds. */
typedef struct registry_timing {
    uint32_t heartbeat_ms;       /* member -> registry heartbeat period */
    uint32_t probe_ms;           /* one member probed per period */
    uint32_t probe_timeout_ms;   /* a ping (direct or indirect) fails */
    uint32_t suspect_timeout_ms; /* suspect this long without news: dead */
    uint32_t indirect_probes;    /* helpers asked when a direct ping fails */
} registry_timing;

void registry_timing_default(registry_timing *t);

/* Checks the timing (every period > 0, helpers <= 16). */
int registry_timing_check(const registry_timing *t, char *err, size_t nerr);

/* ================================================================ views */

/*
 * VIEW payload: epoch u64 | count u32 | count x (node u32 | incarnation u64
 * | state u8 | addr length u8 | addr). Encodes into out (cap bytes);
 * returns bytes written or REGISTRY_ERR_FORMAT when it does not fit or an
 * entry is malformed.
 */
long registry_view_encode(uint8_t *out, size_t cap, uint64_t epoch,
                          const registry_member *m, size_t n);

/*
 * Decodes a VIEW payload into out (room for max entries). Refuses
 * (REGISTRY_ERR_FORMAT) a truncated or over-long payload, more than max
 * entries, node 0, an unknown state, an empty address or one with bytes
 * outside printable ASCII.
 */
int registry_view_decode(const uint8_t *p, size_t len, uint64_t *epoch,
                         registry_member *out, size_t max, size_t *n);

/* ============================================================ directory */

typedef struct registry_dir registry_dir;

enum registry_action_kind {
    REGISTRY_ACT_PING = 1,     /* send PING(token) to member `to` */
    REGISTRY_ACT_PING_REQ = 2, /* ask `to` to ping `target` (token) */
};

typedef struct registry_action {
    int kind;
    uint32_t to;
    uint32_t target;
    uint64_t token;
} registry_action;

/* Counters of a directory (read with registry_dir_counters). */
typedef struct registry_counters {
    uint64_t registrations, heartbeats, leaves, rejoins, probes, probes_failed,
        indirect_probes, suspected, declared_dead, refuted, refused_full;
} registry_counters;

/* A directory with the given timing; seed feeds the helper choice. */
registry_dir *registry_dir_create(const registry_timing *t, uint64_t seed);
void registry_dir_destroy(registry_dir *d);

/*
 * A member registers (or re-registers) at addr with an incarnation.
 * Accepted (REGISTRY_OK, member alive) when it is new, when the
 * incarnation is newer than the known one, or equal while the member is
 * not dead. Otherwise REGISTRY_ERR_STALE with *known set: the member must
 * register again with an incarnation above *known. REGISTRY_ERR_FULL when
 * the directory is full.
 */
int registry_dir_register(registry_dir *d, uint32_t node, uint64_t inc,
                          const char *addr, uint64_t now_ms, uint64_t *known);

/*
 * A heartbeat: a sign of life when inc is the member's incarnation and the
 * member is not dead (a suspect becomes alive again). REGISTRY_ERR_STALE
 * (*known set) for a dead member or an old incarnation,
 * REGISTRY_ERR_UNKNOWN for a node not registered.
 */
int registry_dir_heartbeat(registry_dir *d, uint32_t node, uint64_t inc,
                           uint64_t now_ms, uint64_t *known);

/* A clean leave: the member is removed. Stale incarnations are ignored. */
int registry_dir_leave(registry_dir *d, uint32_t node, uint64_t inc);

/*
 * Whether the member's registry connection is up. A member whose
 * connection drops is probed at the next step (directly that fails at
 * once, so the helpers are asked).
 */
void registry_dir_connected(registry_dir *d, uint32_t node, bool up,
                            uint64_t now_ms);

/* A PONG from node with token: the direct probe succeeded. */
void registry_dir_pong(registry_dir *d, uint32_t node, uint64_t token,
                       uint64_t now_ms);

/* A helper's answer to PING_REQ about target. */
void registry_dir_ack(registry_dir *d, uint32_t via, uint32_t target,
                      uint64_t token, bool ok, uint64_t now_ms);

/*
 * Advances the clock to now_ms: times probes out, turns failed probes into
 * suspicion and old suspicion into death, purges long-dead members, and
 * starts the next probe when a period has passed. Writes up to max actions
 * for the caller to send and returns how many.
 */
size_t registry_dir_step(registry_dir *d, uint64_t now_ms,
                         registry_action *out, size_t max);

/* Changes whenever the view changes (join, leave, state, address). */
uint64_t registry_dir_epoch(const registry_dir *d);

/* Copies the view (up to max members, in join order); returns the count. */
size_t registry_dir_view(const registry_dir *d, registry_member *out,
                         size_t max);

/* Looks one member up; false when absent. */
bool registry_dir_get(const registry_dir *d, uint32_t node,
                      registry_member *out);

void registry_dir_counters(const registry_dir *d, registry_counters *out);

/* =============================================================== server */

struct repl_tls;

typedef struct registry_server_options {
    const char *listen; /* address of the registry listener */
    uint16_t port;      /* registry port (non-zero) */
    const char *secret; /* cluster secret */
    bool insecure;      /* allow an empty secret */
    /* TLS with mutual certificates instead of the secret (repl_tls.h);
     * borrowed, outlives the registry. */
    struct repl_tls *tls;
    registry_timing timing;
} registry_server_options;

typedef struct registry_server registry_server;

/* Checks the options and binds the port; NULL with a message on failure. */
registry_server *registry_server_create(const registry_server_options *o,
                                        char *err, size_t nerr);

/* Starts the registry's thread. */
int registry_server_start(registry_server *s);

/* Stops the thread, closes every connection, frees everything. */
void registry_server_destroy(registry_server *s);

/* Lists the "stats registry" group (safe from any thread). */
void registry_server_emit_stats(registry_server *s, stats_emit_fn emit,
                                void *arg);

/* =============================================================== client */

/*
 * Called with the membership (n entries, this node included) each time
 * the preferred registry's view changes or another registry becomes the
 * source; source is "registry host:port". The array is borrowed for the
 * call.
 */
typedef void (*registry_view_fn)(void *arg, const registry_member *m, size_t n,
                                 const char *source);

/*
 * Asked to ping target over the peer channel for an indirect probe.
 * Returns 0 when a PING(token) went out (the owner then reports the PONG
 * with registry_client_pong), -1 when there is no connection to target.
 */
typedef int (*registry_ping_fn)(void *arg, uint32_t target, uint64_t token);

typedef struct registry_client_options {
    uint32_t node_id;
    const char *registries;  /* "host:port,host:port" */
    const char *advertise;   /* this node's peer host (wildcard allowed) */
    uint16_t advertise_port; /* this node's peer port */
    const char *secret;
    bool insecure;
    struct repl_tls *tls;   /* as in registry_server_options */
    registry_timing timing; /* heartbeat_ms is what the client uses */
} registry_client_options;

typedef struct registry_client registry_client;

/*
 * Parses the registry list and arms the client's timer on base (the
 * caller's loop; every callback runs there). Nothing is dialled before the
 * loop runs. NULL with a message on failure.
 */
registry_client *registry_client_create(struct event_base *base,
                                        const registry_client_options *o,
                                        registry_view_fn on_view,
                                        registry_ping_fn on_ping, void *arg,
                                        char *err, size_t nerr);

/* The peer target answered PING(token): acknowledges the indirect probe. */
void registry_client_pong(registry_client *c, uint32_t target, uint64_t token);

/*
 * Sends LEAVE to every connected registry, best effort, and closes the
 * connections. Call on the loop's thread before the loop stops.
 */
void registry_client_leave(registry_client *c);

void registry_client_destroy(registry_client *c);

/*
 * Where the membership comes from, for stats (safe from any thread):
 * "registry host:port", "cached (registry ... unreachable)" once the
 * source is lost, or "none" before any view arrived.
 */
void registry_client_source(registry_client *c, char *out, size_t n);

/* This node's current incarnation (safe from any thread). */
uint64_t registry_client_incarnation(registry_client *c);

/* Registries currently connected and registered (safe from any thread). */
unsigned registry_client_connected(registry_client *c);

#endif /* REGISTRY_H */
