/*
 * proto.h -- what every client protocol parser shares.
 *
 * A parser is a pure function of (connection context, input buffer): it
 * consumes whole requests from `in`, executes them against the store and
 * appends replies to `out`. It never touches sockets or the event loop, so
 * the same code serves TCP, unix sockets, unit tests and fuzz targets.
 *
 *   proto_text.h  text and meta commands (lines ending in \n)
 *   proto_bin.h   the binary protocol (requests start with magic 0x80)
 *
 * The connection layer picks the parser from the first byte a client sends
 * and calls it again whenever more bytes arrive, or when `out` drained
 * after a parser stopped at cfg->output_max with requests still in `in`.
 *
 * Worker memory (proto_ctx's in_flat and out_flat, text parser only): a
 * request that arrives whole in one read needs no buffer of its own. The
 * connection layer reads into its worker's memory and, when `in` is empty,
 * lends those bytes to the parser as its input; the parser appends what it
 * did not consume to `in` before it returns. Replies the parser leaves in
 * out_flat (out_flat_len bytes) come after everything in `out`; the
 * connection writes them before it lends that memory to another
 * connection. A parser that ignores both (binary, tests, fuzz targets
 * that do not set them) works on `in` and `out` alone.
 *
 * Types and constants only, with no .c behind it, so that the parsers can
 * share it without depending on one another. proto_ctx_cleanup, which has
 * to reach every parser, is in proto_ctx.h, above them.
 */
#ifndef PROTO_H
#define PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/socket.h>

#include <event2/buffer.h>

#include "stats.h"
#include "store.h"

/* Size of the reply memory a worker lends (proto_ctx.out_flat). */
#define PROTO_OUT_FLAT 8192

/* Results of a parser's execute call. */
enum proto_rc {
    PROTO_OK = 0,        /* consumed what it could; call again on more bytes */
    PROTO_PAUSED = 1,    /* stopped at cfg->output_max with requests left in
                            `in`: call again once `out` has drained */
    PROTO_CLOSE = -1,    /* send what is in `out`, then close */
    PROTO_SHUTDOWN = -2, /* send `out`; the client asked for shutdown */
    PROTO_CLOSE_ERROR = -3, /* as PROTO_CLOSE, for a protocol error */
    PROTO_IDLE = 2,         /* a long-lived stream (watch) has nothing now:
                               call again after a short while, even
                               without input */
};

/*
 * Relaying (scale-out). A key that this node does not serve is relayed,
 * one hop, to one of its owners' client ports (proxy.h).
 */

/* Most targets a parser asks route_fn for. */
#define PROTO_ROUTE_MAX 8

/* One node a request may be relayed to: its client address. */
typedef struct proto_target {
    uint32_t node; /* node id (tells targets apart in the relay pool) */
    struct sockaddr_storage addr;
    socklen_t addrlen;
} proto_target;

/*
 * Where a request for key (nkey >= 1 bytes) is served. Returns 0 = here;
 * n > 0 = relay to one of the n targets written to out (n <= cap, best
 * first; the relay falls back down the list when a connect fails). write
 * says whether the command changes the key. Called by every worker thread
 * for every keyed request, so it must be thread-safe and fast.
 */
typedef int (*proto_route_fn)(void *arg, const char *key, size_t nkey,
                              bool write, proto_target *out, int cap);

/* Settings the parsers need; owned by the daemon, read-only for parsers. */
typedef struct proto_config {
    size_t item_size_max;       /* -I */
    bool sasl;                  /* -S: binary SASL PLAIN required */
    struct authfile *sasl_auth; /* -S: sasl_file's users */
    /* -Y: credentials every connection must show first: text ones with
     * memcached's authenticating set, binary ones with SASL PLAIN. NULL:
     * no such requirement. */
    struct authfile *auth;
    bool flush_enabled;      /* -F disables flush_all */
    bool shutdown_enabled;   /* -A enables shutdown */
    bool cas_enabled;        /* -C disables cas */
    bool dump_disabled;      /* -X: no cachedump, metadump, mgdump */
    bool watch_disabled;     /* -W: no watch */
    size_t max_line;         /* longest text request line accepted */
    unsigned reqs_per_event; /* -R: requests one call executes before it
                                yields to other connections (PROTO_PAUSED
                                with ctx->yielded set); 0 = no limit */
    size_t output_max;       /* stop taking requests while `out` holds more
                                (0 = no limit); the caller runs the parser
                                again once it has drained */
    const char *version;     /* the version string */
    /* `stats [group]` and `stats reset`: the daemon's listings (stats
     * groups know the workers, which the parsers must not). list returns
     * 0, or -1 for an unknown group. NULL: every group is unknown and
     * reset does nothing. */
    int (*stats_list)(const char *group, stats_emit_fn emit, void *arg);
    void (*stats_reset)(void);
    /* `refresh_certs`: reloads the TLS certificates; 0, or -1 with the
     * reason in err. NULL: the command answers that TLS is off. */
    int (*refresh_certs)(char *err, size_t errlen);
    /* Relaying: NULL (the default) serves every key here, at the cost of
     * one pointer test per request. Relaying requires sasl off. */
    proto_route_fn route_fn;
    void *route_arg;
    uint32_t proxy_timeout_ms; /* a relayed request fails after this long
                                  without its reply (0 = 2000) */
    /* Relays speak TLS to the other nodes' client ports when set (this
     * node runs -Z): tls.h's client side. */
    struct tls_server *relay_tls;
    /* Acknowledged writes (repl_ack_wait_ms): NULL (the default) answers a
     * write as soon as the store holds it. Otherwise the connection layer
     * holds the replies of a parser call that wrote until ack_held says a
     * peer holds its writes, at most ack_wait_ms. ack_take returns the
     * calling thread's newest write ticket since its last call (0: none)
     * and sets *dropped when a write will never be confirmed; ack_held
     * runs on any thread. */
    uint64_t (*ack_take)(void *arg, bool *dropped);
    bool (*ack_held)(void *arg, uint64_t ticket);
    void *ack_arg;
    uint32_t ack_wait_ms;
} proto_config;

/*
 * Per-connection state shared by all parsers. Each parser keeps its own
 * private state behind its pointer, allocates it on first use and frees it
 * in proto_ctx_cleanup() (proto_ctx.h).
 */
typedef struct proto_ctx {
    store *store;
    int fd; /* the connection's socket, for logs (-1 = none) */
    const proto_config *cfg;
    stats_thread *stats; /* this worker thread's counters */
    int verbose;         /* -v level */
    bool authenticated;  /* SASL done, or not required */
    bool yielded;        /* the last call stopped at reqs_per_event */
    unsigned executed;   /* requests the last call executed */
    bool mid_request;    /* the last call left a request whose data block
                            has not all arrived (stats conns: conn_nread) */
    void *text;          /* proto_text's private state */
    void *bin;           /* proto_bin's private state */
    /* Relaying (proxy.h); all unused while cfg->route_fn is NULL. */
    bool relay_peer;           /* the peer said the relay hello: every
                                  request is served here */
    struct proxy_pool *relays; /* the worker's upstream pool, or NULL */
    void *relay_owner;         /* the connection, for the pool's wake-up */
    void *proxy;               /* proxy's per-connection state */
    /* Worker memory lent for one call (see the top of this file); NULL
     * and 0 when not lent. */
    const char *in_flat;
    size_t in_flat_len;
    char *out_flat;
    size_t out_flat_cap; /* at least PROTO_OUT_FLAT when lent */
    size_t out_flat_len; /* set by the parser */
} proto_ctx;

#endif /* PROTO_H */
