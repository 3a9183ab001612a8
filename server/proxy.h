/*
 * proxy.h -- one-hop relaying of requests for keys this node does not
 * serve (scale-out).
 *
 * When proto_config.route_fn says a key lives elsewhere, the parser hands
 * the request's bytes to proxy_relay() instead of the store. Each worker
 * owns one proxy_pool: client-protocol connections ("upstreams") to the
 * other nodes' client ports, one per target node and protocol, opened on
 * the worker's event loop and shared by all its client connections. A
 * request goes out verbatim, in the protocol it arrived in, and its reply
 * comes back verbatim into the client's output at the request's place:
 * later replies of the same client wait behind it, so the order a client
 * sees is the order it asked in, while any number of relayed requests (up
 * to PROXY_MAX_INFLIGHT per connection) are in flight at once.
 *
 * Every upstream starts with the relay hello (PROXY_TEXT_HELLO, or a
 * PROXY_BIN_OP_HELLO packet). A connection that said it is served locally
 * for good, never relayed again, so requests cannot loop while nodes'
 * rings disagree. The hello grants nothing: a client that sends it only
 * gets what the node holds itself.
 *
 * Only the worker thread that owns a pool touches it.
 */
#ifndef PROXY_H
#define PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "proto.h"

enum proxy_rc {
    PROXY_OK = 0,
    PROXY_ERR_NOMEM = -1,
};

/* The text/meta relay hello (a line of its own), answered "OK". */
#define PROXY_TEXT_HELLO "proxy_hello 1"
/* The binary relay hello: a request with this opcode and an empty body,
 * answered with status 0 and an empty body. memcached has no such
 * opcode. */
#define PROXY_BIN_OP_HELLO 0xe1
/* Binary status of a relayed request no owner answered (memcached's
 * "temporary failure"). */
#define PROXY_BIN_STATUS_TMPFAIL 0x0086
/* The text reply of a relayed request no owner answered. */
#define PROXY_TEXT_FAILURE "SERVER_ERROR no owner reachable\r\n"
/* Relayed requests one client connection may have in flight; beyond, its
 * parser pauses until replies come back. */
#define PROXY_MAX_INFLIGHT 64

typedef struct proxy_pool proxy_pool;

/* How the reply to a relayed request is framed. */
enum proxy_kind {
    PROXY_TEXT_LINE = 0, /* one reply line; "VA <n> ..." carries n bytes */
    PROXY_TEXT_GET,      /* VALUE blocks, then END (or one error line) */
    PROXY_TEXT_QUIET,    /* noreply / q: followed by "mn", cut at "MN" */
    PROXY_BIN_ONE,       /* one response packet */
    PROXY_BIN_QUIET,     /* quiet opcode: followed by a NOOP of ours, cut
                            at its response */
};

/* A request to relay. */
typedef struct proxy_req {
    uint8_t kind;        /* enum proxy_kind */
    bool get_part;       /* PROXY_TEXT_GET for some keys of a multi-key get:
                            its END is dropped (the parser ends the listing)
                            and a failure reads as misses */
    bool silent;         /* noreply: a failure answers nothing either */
    uint8_t bin_opcode;  /* binary: for the failure reply */
    uint32_t bin_opaque; /* binary: echoed in the failure reply */
    uint32_t nkeys;      /* keys asked (bounds the reply size); 0 = 1 */
    const void *data;    /* the request bytes, sent verbatim (copied) */
    size_t n;
    const proto_target *targets; /* best first (copied) */
    int ntargets;
} proxy_req;

/*
 * Creates a worker's pool on base. cfg and stats (the worker's counters:
 * proxied_requests, proxy_failures) must outlive the pool. wake(owner) is
 * called when replies of a client connection have been appended to its
 * output buffer (owner is proto_ctx.relay_owner); it must not call back
 * into the pool synchronously. Returns NULL when out of memory.
 */
proxy_pool *proxy_pool_create(struct event_base *base, const proto_config *cfg,
                              stats_thread *stats, void (*wake)(void *owner));

/* Closes every upstream and frees the pool. Call after the client
 * connections that used it have been released (proxy_conn_free). */
void proxy_pool_destroy(proxy_pool *p);

/*
 * Where a request for key is served: 0 = here, n > 0 = relay to the n
 * targets written to out (PROTO_ROUTE_MAX room). Costs one pointer test
 * while route_fn is NULL. A connection that said the relay hello, or one
 * without a pool (tests), is always served here.
 */
static inline int proxy_route(proto_ctx *ctx, const char *key, size_t nkey,
                              bool write, proto_target *out)
{
    if (ctx->cfg->route_fn == NULL || ctx->relay_peer || ctx->relays == NULL)
        return 0;
    int n = ctx->cfg->route_fn(ctx->cfg->route_arg, key, nkey, write, out,
                               PROTO_ROUTE_MAX);
    return n < 0 ? 0 : n > PROTO_ROUTE_MAX ? PROTO_ROUTE_MAX : n;
}

/* Whether two targets are the same node at the same address. */
static inline bool proxy_same_target(const proto_target *a,
                                     const proto_target *b)
{
    return a->node == b->node && a->addrlen == b->addrlen &&
           memcmp(&a->addr, &b->addr, a->addrlen) == 0;
}

/*
 * Relays rq for the connection of ctx, whose output buffer is out. The
 * reply (or the failure reply) takes the current position in the
 * connection's output: what the parser writes next must go to
 * proxy_out(ctx, out). Counts proxied_requests, and proxy_failures for
 * each request that fails. Returns 0, or PROXY_ERR_NOMEM after writing
 * the failure reply.
 */
int proxy_relay(proto_ctx *ctx, struct evbuffer *out, const proxy_req *rq);

/* The buffer the parser appends replies to: out, or the spot behind the
 * last relayed request still in flight. */
struct evbuffer *proxy_out(proto_ctx *ctx, struct evbuffer *out);

/* True when the parser should stop taking requests until replies come
 * back (PROXY_MAX_INFLIGHT reached, or more than output_max bytes held). */
bool proxy_blocked(proto_ctx *ctx, struct evbuffer *out);

/* True while relayed requests of ctx's connection are in flight. */
bool proxy_busy(const proto_ctx *ctx);

/* Releases ctx's relay state; replies still in flight are dropped when
 * they arrive. */
void proxy_conn_free(proto_ctx *ctx);

#endif /* PROXY_H */
