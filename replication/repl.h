/*
 * repl.h -- leaderless replication between ribltcached nodes.
 *
 * The daemon creates one repl object over its store. It runs in a thread of
 * its own with its own event loop (client event loops never wait on peers):
 *   - a peer listener that serves reconciliation requests and pushes;
 *   - one outgoing connection per peer, used for this node's rounds and
 *     for eager push; the peers are the static list, plus the live
 *     members of the registry's view when registries are configured
 *     (added and removed as the view changes; a dead member is neither
 *     dialled nor chosen);
 *   - a gossip timer: every period a random live peer gets a round;
 *   - the push queue: fresh local writes (from the store's listener) are
 *     sent to every peer within milliseconds, batched; a full queue drops
 *     and leaves the repair to the rounds.
 * Everything a peer sends ends in store_apply, the store's one write path.
 */
#ifndef REPL_H
#define REPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "registry.h"
#include "stats.h"
#include "store.h"

enum repl_rc {
    REPL_OK = 0,
    REPL_ERR_CONFIG = -1, /* bad option value (message in err) */
    REPL_ERR_NOMEM = -2,
    REPL_ERR_SYSTEM = -3, /* socket, thread or event loop failure */
};

typedef struct repl_options {
    uint32_t node_id;   /* this node's id (non-zero, unique) */
    const char *listen; /* address of the peer listener */
    uint16_t port;      /* peer port; 0 = replication off */
    const char *peers;  /* "host:port,host:port,..." (may hold self) */
    const char *secret; /* cluster secret */
    bool insecure;      /* allow an empty secret */
    /* Peer and registry links over TLS with mutual certificates instead
     * of the secret (repl_tls.h); borrowed, must outlive the repl. */
    struct repl_tls *tls;
    uint32_t period_ms;        /* gossip period (default 100) */
    uint32_t max_symbols;      /* coded symbols per round, cap */
    uint32_t round_timeout_ms; /* a round taking longer fails */
    uint32_t push_queue;       /* pending eager pushes, cap */
    uint32_t push_delay_us;    /* coalescing window under load (0 = none) */
    size_t backlog_bytes;      /* push log kept for resumes (0 = none) */
    size_t item_size_max;      /* largest value accepted from a peer */
    /* Membership through registries ("host:port,..."; empty = none). */
    const char *registries;
    /* Membership from DNS (dnsview.h): "name:port,..." (empty = none),
     * the resolver ("ip[:port]", empty = the system's), the interval. */
    const char *dns_names;
    const char *dns_server;
    uint32_t dns_interval_ms;
    /* Membership through etcd v3 (etcdview.h): "http[s]://host:port,...",
     * the key prefix, the lease in seconds. */
    const char *etcd_urls;
    const char *etcd_prefix;
    uint32_t etcd_lease_s;
    const char *etcd_tls_ca, *etcd_tls_cert, *etcd_tls_key; /* https:// */
    registry_timing timing; /* heartbeats and probing */
    /*
     * Placement (replicas > 0): the store must have been created with
     * store_options.partitions = ring_partitions and a partition function
     * of ring_hash_key(key) mod ring_partitions.
     */
    uint32_t replicas;        /* copies of each key; 0 = every node, all */
    uint32_t ring_partitions; /* P, the same on every node */
    uint32_t ring_weight;     /* this node's weight (1..65535) */
    uint32_t handoff_ms;      /* a lost partition is kept at least this long */
    uint32_t down_ms;      /* a static peer down this long leaves the ring */
    const char *advertise; /* "host:port" of this node's client port */
    /*
     * Acknowledged writes (full replication only): pushes ask their
     * receivers to confirm them (PUSH_ACK), so that repl_ticket_held can
     * tell when a peer holds a client write. on_acked, when set, runs on
     * the replication thread each time a confirmation comes in.
     */
    bool acks;
    void (*on_acked)(void *arg);
    void *acked_arg;
} repl_options;

void repl_options_default(repl_options *o);

typedef struct repl repl;

/*
 * Checks the options, parses the peer list, registers the store listener
 * and binds the peer port. Returns NULL with a message in err on failure.
 * The store must outlive the repl object.
 */
repl *repl_create(store *s, const repl_options *o, char *err, size_t nerr);

/* Starts the replication thread. */
int repl_start(repl *r);

/* Stops the thread, closes every connection, frees everything. */
void repl_destroy(repl *r);

/* Lists the "stats replication" group (safe from any thread). */
void repl_emit_stats(repl *r, stats_emit_fn emit, void *arg);

/* Lists the "stats ring" group (safe from any thread). */
void repl_emit_ring_stats(repl *r, stats_emit_fn emit, void *arg);

/*
 * The "stats health" group: health (converged, catching_up or isolated),
 * health_peers_up, health_peers, health_last_differences (the largest
 * difference the last round with an up peer found), health_for_s (how
 * long the verdict has held).
 */
void repl_emit_health(repl *r, stats_emit_fn emit, void *arg);

/*
 * Tickets (repl_options.acks): every client write queued for push gets the
 * next number. Called on a client thread, returns the newest ticket that
 * thread's writes got since its last call (0: none), and sets *dropped
 * when one of them was refused by the full push queue (no push will
 * carry it: no peer will confirm it).
 */
uint64_t repl_ticket_take(bool *dropped);

/* Whether a peer confirmed applying the write of ticket t, and so every
 * write of this node's queue up to it that was sent to it (any thread). */
bool repl_ticket_held(repl *r, uint64_t t);

/* An owner a client request may be relayed to. */
typedef struct repl_target {
    uint32_t node;
    struct sockaddr_storage addr; /* its client port */
    socklen_t addrlen;
} repl_target;

/*
 * Where a request for key is served (called on client worker threads;
 * takes a read lock on the published ring). Returns 0 when this node
 * serves it: full replication; a write when this node is the key's
 * preferred (first) owner; a read when this node owns the key's partition
 * and has caught up. Otherwise copies up to cap targets to out and
 * returns how many (0 when there is nobody else: serve here): for a
 * write, every owner best first (this node too, as the last resort, at
 * its own client port); for a read, the other owners, those that owned
 * the partition before the last ring change first.
 */
int repl_route(repl *r, const char *key, size_t nkey, bool write,
               repl_target *out, int cap);

#endif /* REPL_H */
