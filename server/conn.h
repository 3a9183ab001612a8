/*
 * conn.h -- client connections: the per-connection state machine.
 *
 * A connection belongs to one worker thread's event loop for its whole life
 * and is touched only by that thread, except for the read-only fields that
 * `stats conns` lists under the environment's lock. Reading, parsing and
 * writing follow one cycle per read event:
 *
 *   waiting --readable--> read up to reqs_per_event chunks
 *           --> parse (text or binary, chosen by the first byte), at
 *               most reqs_per_event requests, then yield to the others
 *           --> one gathered write of everything the batch produced
 *           --> waiting, or mwrite while replies are pending.
 *
 * Back-pressure: while more than output_max reply bytes are pending, the
 * connection stops reading; it resumes once the pending bytes fall to half.
 * A parser's PROTO_CLOSE (and end of input) moves it to closing: pending
 * replies are flushed, then the socket closes.
 *
 * Relaying (proto_config.route_fn set): the environment keeps the
 * worker's proxy pool, created with the first connection. A connection
 * whose parser stopped at PROXY_MAX_INFLIGHT relayed requests stops
 * reading until replies come back; one that is closing waits for the
 * replies still in flight (within the closing grace).
 */
#ifndef CONN_H
#define CONN_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "proto.h"

enum conn_rc {
    CONN_OK = 0,
    CONN_ERR_NOMEM = -1,
    CONN_ERR_EVENT = -2, /* libevent refused an event */
};

typedef struct conn conn;

/*
 * What one worker's connections share. The worker fills the settings,
 * calls conn_env_init, and owns the environment.
 */
typedef struct conn_env {
    struct event_base *base;
    store *store;
    const proto_config *pcfg;
    stats_thread *stats;
    int verbose;
    unsigned reqs_per_event;
    size_t output_max;
    size_t input_max; /* unparsed input bytes that close the conn */
    /* TLS listeners' context (NULL: no TLS), and the size of the staging
     * buffer replies are gathered in before encryption (ssl_wbuf_size). */
    struct tls_server *tls;
    size_t tls_wbuf_size;
    int proto_mode;        /* enum options_proto */
    uint32_t idle_timeout; /* seconds; 0 = never */
    /* Asks the daemon to shut down (PROTO_SHUTDOWN); any thread. */
    void (*request_shutdown)(void *arg);
    void *shutdown_arg;

    /* Private to conn.c from here on. */
    pthread_mutex_t lock; /* guards the list against `stats conns` */
    conn *head;
    conn *free_list;
    size_t nconns;
    uint64_t conn_yields; /* relaxed atomics: summed by stats */
    uint64_t idle_kicks;
    struct proxy_pool *relays; /* upstreams of relayed requests, or NULL */
    char *tls_wbuf;            /* tls_wbuf_size bytes, once a TLS conn came */
    char *in_flat;   /* memory lent to the text parser (proto.h): input */
    char *out_flat;  /* and replies; NULL: nothing is lent */
    unsigned inputs; /* reads that brought requests, since the last take */
    unsigned piped;  /* those of them that brought more than one */
    /* Connections whose replies wait for a peer to hold their writes
     * (proto_config.ack_held), oldest first; their count and whether a
     * wake-up is on its way (atomics: the replication thread reads them
     * through conn_env_ack_kick); the timer of the oldest's deadline. */
    conn *ack_head, *ack_tail;
    int ack_waiting;
    bool ack_kicked;
    struct event *ack_timer;
} conn_env;

/* Initializes the private part of env. Returns 0 (without memory to lend
 * the parser, connections use their own buffers only). */
int conn_env_init(conn_env *env);

/* Closes every connection (a last non-blocking flush first) and frees the
 * cached structures. Other threads may still list env (conn_env_each). */
void conn_env_destroy(conn_env *env);

/* Frees the lock, once no thread can list env any more. */
void conn_env_fini(conn_env *env);

/*
 * Takes over the accepted, non-blocking socket fd (peer address sa of
 * salen bytes) and starts serving it on env's loop; tls: it came from a
 * TLS listener (the handshake runs inside the first reads, and a client
 * that has not finished it within a few seconds is closed). On failure the
 * socket is closed and the connection count given back. Returns 0 or
 * CONN_ERR_*.
 */
int conn_open(conn_env *env, int fd, const struct sockaddr *sa,
              socklen_t salen, bool tls);

/*
 * Once a second: closes connections idle longer than idle_timeout and
 * connections stuck in closing (a peer that never reads). now is
 * conn_now().
 */
void conn_env_tick(conn_env *env, uint32_t now);

/*
 * Since the last call (worker thread): how many connections read input
 * and had requests executed, and how many of those had more than one
 * (a client with several requests in flight on one connection).
 */
void conn_env_take_inputs(conn_env *env, unsigned *inputs, unsigned *piped);

/* A coarse monotonic clock in seconds, for activity stamps. */
uint32_t conn_now(void);

/*
 * Acknowledged writes. conn_env_ack_kick (any thread, after a peer
 * confirmed writes) returns true when env has connections waiting and no
 * wake-up is pending yet: the caller then wakes env's thread, which calls
 * conn_env_acks to answer those whose writes a peer now holds.
 */
bool conn_env_ack_kick(conn_env *env);
void conn_env_acks(conn_env *env);

/* What `stats conns` lists of one connection. */
typedef struct conn_info {
    int fd;
    const struct sockaddr *peer;
    socklen_t peerlen;
    const char *state; /* memcached's state names: conn_waiting, ... */
    uint32_t secs_since_last_cmd;
} conn_info;

typedef void (*conn_info_fn)(void *arg, const conn_info *ci);

/* Calls fn for every open connection of env, under env's lock (fn must not
 * call back into conn). Any thread. */
void conn_env_each(conn_env *env, conn_info_fn fn, void *arg);

#endif /* CONN_H */
