/*
 * conn.c -- the connection state machine (see conn.h).
 *
 * Sockets are driven with raw events and evbuffers rather than
 * bufferevents. A connection whose input buffer is empty reads into its
 * worker's memory. For a text connection that memory is lent to the
 * parser (proto.h): a request that arrives whole is parsed there, and
 * replies the parser leaves in the worker's reply memory go out in one
 * write when nothing is queued before them, so a request that fits one
 * read and one write allocates nothing in this layer. A binary connection
 * gets the bytes by reference in its input buffer, and what its parser
 * left of them is copied. Otherwise (a request split across reads, a reply
 * the socket does not take at once, binary replies, TLS connections)
 * bytes go through the connection's evbuffers: one readv per chunk into
 * the input buffer's free space, replies appended to the output buffer,
 * the batch out in one writev. Connection structures are recycled.
 */
#include "conn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>

#include "options.h"
#include "proto_bin.h"
#include "proto_ctx.h"
#include "proto_text.h"
#include "proxy.h"
#include "stats.h"
#include "tls.h"
#include "watch.h"

/* Bytes asked of the kernel per read: with the buffer chain header this
 * makes a 16 KB allocation. */
#define CONN_READ_CHUNK (16384 - 128)
/* How often a streaming parser (PROTO_IDLE) is asked for more. */
#define CONN_STREAM_POLL_MS 10
/* Seconds a closing connection may wait for its peer to take the replies. */
#define CONN_CLOSE_GRACE 5
/* Seconds a TLS client has to complete its handshake: a stalled or
 * trickling handshake must not hold a connection slot for long. */
#define CONN_HANDSHAKE_SECS 5

enum conn_state {
    CONN_WAITING = 0, /* reading requests */
    CONN_PARSING,     /* inside a parser */
    CONN_MWRITE,      /* replies pending, reading paused */
    CONN_CLOSING,     /* flushing, then close */
    CONN_NREAD,       /* waiting for the rest of a request's data block */
};

static const char *const state_names[] = {"conn_waiting", "conn_parse_cmd",
                                          "conn_mwrite", "conn_closing",
                                          "conn_nread"};

enum conn_parser {
    PARSER_UNKNOWN = 0,
    PARSER_TEXT,
    PARSER_BIN,
};

struct conn {
    int fd;
    uint8_t state;      /* enum conn_state; read by stats conns */
    uint8_t parser;     /* enum conn_parser */
    bool reading;       /* rev is added */
    bool paused;        /* the parser stopped at output_max: rerun it after the
                           output drains, even if no byte arrives */
    bool writing;       /* wev is added */
    bool relay_blocked; /* the parser stopped at the relay in-flight cap:
                           reading waits for replies to come back */
    bool has_pev;       /* pev is assigned (relaying is on) */
    bool idle_stream;   /* the parser streams (watch) with nothing to send
                           now: rev polls it every CONN_STREAM_POLL_MS */
    bool closed_error;  /* the parser closed for a protocol error */
    bool tls_wants_write; /* a TLS read must wait for writability */
    uint64_t ack_ticket;  /* replies held until a peer holds the writes up
                             to this ticket (0: none held) */
    uint64_t ack_deadline_ns;
    conn *ack_prev, *ack_next; /* env's list of waiting connections */
    uint32_t last_active;
    uint32_t opened;
    uint32_t closing_since;
    conn_env *env;
    struct evbuffer *in;
    struct evbuffer *out;
    tls_conn *tls; /* NULL: plain socket */
    struct event rev;
    struct event wev;
    struct event pev; /* relayed replies arrived (activated by proxy) */
    proto_ctx ctx;
    conn *prev;
    conn *next;
    socklen_t peerlen;
    struct sockaddr_storage peer;
};

uint32_t conn_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint32_t)ts.tv_sec;
}

static void set_state(conn *c, enum conn_state s)
{
    __atomic_store_n(&c->state, (uint8_t)s, __ATOMIC_RELAXED);
}

/* Stamps activity; `stats conns` reads the stamp from other threads. */
static void touch(conn *c)
{
    __atomic_store_n(&c->last_active, conn_now(), __ATOMIC_RELAXED);
}

int conn_env_init(conn_env *env)
{
    pthread_mutex_init(&env->lock, NULL);
    env->head = NULL;
    env->free_list = NULL;
    env->nconns = 0;
    env->conn_yields = 0;
    env->idle_kicks = 0;
    env->relays = NULL;
    env->tls_wbuf = NULL;
    env->inputs = env->piped = 0;
    env->ack_head = env->ack_tail = NULL;
    env->ack_waiting = 0;
    env->ack_kicked = false;
    env->ack_timer = NULL;
    /* One block for both; without it nothing is lent. */
    env->in_flat = malloc(CONN_READ_CHUNK + PROTO_OUT_FLAT);
    env->out_flat =
        env->in_flat != NULL ? env->in_flat + CONN_READ_CHUNK : NULL;
    return CONN_OK;
}

static void read_cb(evutil_socket_t fd, short what, void *arg);
static void write_cb(evutil_socket_t fd, short what, void *arg);
static void relay_cb(evutil_socket_t fd, short what, void *arg);

/* proxy's wake-up: replies were appended to c->out; act on the next loop
 * turn (never inside the pool's own callback). */
static void relay_wake(void *owner)
{
    conn *c = owner;
    event_active(&c->pev, EV_TIMEOUT, 0);
}

static void ack_unlink(conn *c);

/* Releases everything the connection holds and recycles the structure. */
static void conn_close(conn *c)
{
    conn_env *env = c->env;

    if (c->ack_ticket != 0) {
        ack_unlink(c);
    }

    pthread_mutex_lock(&env->lock);
    if (c->prev != NULL) {
        c->prev->next = c->next;
    } else {
        env->head = c->next;
    }
    if (c->next != NULL) {
        c->next->prev = c->prev;
    }
    env->nconns--;
    pthread_mutex_unlock(&env->lock);

    event_del(&c->rev);
    event_del(&c->wev);
    if (c->has_pev) {
        event_del(&c->pev);
        c->has_pev = false;
    }
    if (env->verbose > 1) {
        fprintf(stderr, "<%d connection closed.\n", c->fd);
    }
    if (watch_wanted(WATCH_CONNEVENTS)) {
        watch_conn(false, (const struct sockaddr *)&c->peer, c->peerlen,
                   c->closed_error ? "error" : "normal", c->fd);
    }
    if (c->tls != NULL) {
        tls_conn_free(c->tls);
        c->tls = NULL;
    }
    close(c->fd);
    c->fd = -1;
    /* Draining runs the reference cleanups: item references go back. */
    evbuffer_drain(c->in, evbuffer_get_length(c->in));
    evbuffer_drain(c->out, evbuffer_get_length(c->out));
    proto_ctx_cleanup(&c->ctx);
    c->next = env->free_list;
    env->free_list = c;
    STATS_CONN_SUB(curr_connections, 1);
}

static void conn_free(conn *c)
{
    evbuffer_free(c->in);
    evbuffer_free(c->out);
    free(c);
    STATS_CONN_SUB(connection_structures, 1);
}

static conn *conn_alloc(conn_env *env)
{
    conn *c = env->free_list;
    if (c != NULL) {
        env->free_list = c->next;
        return c;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return NULL;
    }
    c->in = evbuffer_new();
    c->out = evbuffer_new();
    if (c->in == NULL || c->out == NULL) {
        if (c->in != NULL) {
            evbuffer_free(c->in);
        }
        if (c->out != NULL) {
            evbuffer_free(c->out);
        }
        free(c);
        return NULL;
    }
    STATS_CONN_ADD(connection_structures, 1);
    return c;
}

int conn_open(conn_env *env, int fd, const struct sockaddr *sa,
              socklen_t salen, bool tls)
{
    conn *c = conn_alloc(env);
    if (c != NULL && tls) {
        if (env->tls == NULL) {
            /* A TLS listener without a context: never serve it plain. */
            c->tls = NULL;
        } else {
            c->tls = tls_conn_new(env->tls, fd);
        }
        if (env->tls_wbuf == NULL && env->tls_wbuf_size > 0) {
            env->tls_wbuf = malloc(env->tls_wbuf_size);
        }
        if (c->tls == NULL || env->tls_wbuf == NULL) {
            if (c->tls != NULL) {
                tls_conn_free(c->tls);
                c->tls = NULL;
            }
            c->next = env->free_list;
            env->free_list = c;
            c = NULL;
        }
    } else if (c != NULL) {
        c->tls = NULL;
    }
    if (c == NULL) {
        close(fd);
        STATS_CONN_SUB(curr_connections, 1);
        return CONN_ERR_NOMEM;
    }
    c->fd = fd;
    c->env = env;
    c->parser = PARSER_UNKNOWN;
    if (env->proto_mode == OPTIONS_PROTO_ASCII) {
        c->parser = PARSER_TEXT;
    } else if (env->proto_mode == OPTIONS_PROTO_BINARY) {
        c->parser = PARSER_BIN;
    }
    c->reading = false;
    c->writing = false;
    c->paused = false;
    c->relay_blocked = false;
    c->has_pev = false;
    c->idle_stream = false;
    c->closed_error = false;
    c->tls_wants_write = false;
    c->ack_ticket = 0;
    c->ack_prev = c->ack_next = NULL;
    touch(c);
    c->opened = c->last_active;
    c->closing_since = 0;
    c->peerlen = 0;
    if (sa != NULL && salen <= sizeof(c->peer)) {
        memcpy(&c->peer, sa, salen);
        c->peerlen = salen;
    }
    memset(&c->ctx, 0, sizeof(c->ctx));
    c->ctx.fd = fd;
    c->ctx.store = env->store;
    c->ctx.cfg = env->pcfg;
    c->ctx.stats = env->stats;
    c->ctx.verbose = env->verbose;
    c->ctx.authenticated = !env->pcfg->sasl && env->pcfg->auth == NULL;
    set_state(c, CONN_WAITING);
    if (env->pcfg->route_fn != NULL) {
        if (env->relays == NULL) {
            env->relays = proxy_pool_create(env->base, env->pcfg, env->stats,
                                            relay_wake);
        }
        /* Without a pool (no memory) every key is served here. */
        c->ctx.relays = env->relays;
        c->ctx.relay_owner = c;
        if (event_assign(&c->pev, env->base, -1, 0, relay_cb, c) == 0) {
            c->has_pev = true;
        } else {
            c->ctx.relays = NULL;
        }
    }

    if (event_assign(&c->rev, env->base, fd, EV_READ | EV_PERSIST, read_cb,
                     c) != 0 ||
        event_assign(&c->wev, env->base, fd, EV_WRITE | EV_PERSIST, write_cb,
                     c) != 0 ||
        event_add(&c->rev, NULL) != 0) {
        if (c->tls != NULL) {
            tls_conn_free(c->tls);
            c->tls = NULL;
        }
        close(fd);
        c->next = env->free_list;
        env->free_list = c;
        STATS_CONN_SUB(curr_connections, 1);
        return CONN_ERR_EVENT;
    }
    c->reading = true;

    pthread_mutex_lock(&env->lock);
    c->prev = NULL;
    c->next = env->head;
    if (env->head != NULL) {
        env->head->prev = c;
    }
    env->head = c;
    env->nconns++;
    pthread_mutex_unlock(&env->lock);
    if (env->verbose > 1) {
        fprintf(stderr, "<%d new client connection\n", fd);
    }
    if (watch_wanted(WATCH_CONNEVENTS)) {
        watch_conn(true, (const struct sockaddr *)&c->peer, c->peerlen, NULL,
                   fd);
    }
    return CONN_OK;
}

/*
 * read_chunk over TLS: one SSL_read into contiguous free space of c->in.
 * WANT_READ reads as EAGAIN; WANT_WRITE too, with tls_wants_write set so
 * that writability runs the read again; a failed handshake or a broken
 * session as ECONNRESET.
 */
static ssize_t read_tls(conn *c, size_t want)
{
    struct evbuffer_iovec v;
    if (evbuffer_reserve_space(c->in, (ev_ssize_t)want, &v, 1) != 1) {
        errno = ENOMEM;
        return -1;
    }
    ssize_t r = tls_conn_read(c->tls, v.iov_base, v.iov_len);
    if (r > 0) {
        v.iov_len = (size_t)r;
        evbuffer_commit_space(c->in, &v, 1);
        return r;
    }
    evbuffer_commit_space(c->in, NULL, 0);
    switch (r) {
    case TLS_IO_CLOSED:
        return 0;
    case TLS_IO_WANT_WRITE:
        c->tls_wants_write = true;
        /* fall through */
    case TLS_IO_WANT_READ:
        errno = EAGAIN;
        return -1;
    default:
        errno = ECONNRESET;
        return -1;
    }
}

/*
 * Reads at most `want` bytes into the free space of c->in with one readv.
 * Returns the byte count, 0 on end of input, -1 with errno on error.
 */
static ssize_t read_chunk(conn *c, size_t want)
{
    struct evbuffer_iovec v[2];
    struct iovec iov[2];
    if (c->tls != NULL) {
        return read_tls(c, want);
    }
    int n = evbuffer_reserve_space(c->in, (ev_ssize_t)want, v, 2);
    if (n <= 0) {
        errno = ENOMEM;
        return -1;
    }
    size_t room = 0;
    for (int i = 0; i < n; i++) {
        iov[i].iov_base = v[i].iov_base;
        iov[i].iov_len = v[i].iov_len;
        room += v[i].iov_len;
    }
    ssize_t r;
    do {
        r = readv(c->fd, iov, n);
    } while (r < 0 && errno == EINTR);
    if (r <= 0) {
        int saved = errno;
        evbuffer_commit_space(c->in, NULL, 0);
        errno = saved;
        return r;
    }
    size_t left = (size_t)r;
    int used = 0;
    for (int i = 0; i < n && left > 0; i++) {
        if (v[i].iov_len > left) {
            v[i].iov_len = left;
        }
        left -= v[i].iov_len;
        used++;
    }
    evbuffer_commit_space(c->in, v, used);
    (void)room;
    return r;
}

/* A read may go to the worker's memory: a plain connection with nothing
 * kept in its input buffer. */
static bool can_lend(const conn *c)
{
    return c->env->in_flat != NULL && c->tls == NULL &&
           evbuffer_get_length(c->in) == 0;
}

/* One read into the worker's memory; returns like read_chunk. */
static ssize_t read_lent(conn *c)
{
    ssize_t r;
    do {
        r = read(c->fd, c->env->in_flat, CONN_READ_CHUNK);
    } while (r < 0 && errno == EINTR);
    return r;
}

/* (Re)arms the read event: with a poll timeout while the parser streams. */
static int rev_add(conn *c)
{
    static const struct timeval poll_tv = {0, CONN_STREAM_POLL_MS * 1000};
    return event_add(&c->rev, c->idle_stream ? &poll_tv : NULL);
}

/*
 * Replies the parser left in the worker's memory: written at once when
 * nothing is queued before them (and they are not held for a peer's
 * confirmation), and what the socket did not take (or all of them) copied
 * to c->out, as that memory serves the next connection. A failed write
 * leaves them all to c->out, where flush_out meets the error. Returns
 * false without memory for them.
 */
static bool settle_out(conn *c)
{
    size_t n = c->ctx.out_flat_len;
    const char *p = c->env->out_flat;
    c->ctx.out_flat_len = 0;
    if (n == 0) {
        return true;
    }
    if (evbuffer_get_length(c->out) == 0 && c->ack_ticket == 0) {
        ssize_t w;
        do {
            w = write(c->fd, p, n);
        } while (w < 0 && errno == EINTR);
        if (w > 0) {
            STATS_ADD(c->env->stats, bytes_written, (uint64_t)w);
            touch(c);
            p += w;
            n -= (size_t)w;
        }
    }
    return n == 0 || evbuffer_add(c->out, p, n) == 0;
}

/* ================================================ acknowledged writes */

/*
 * With repl_ack_wait_ms, the replies of a parser call that wrote wait in
 * c->out until a peer holds its writes: the connection parses nothing
 * meanwhile (replies keep their order; what arrives is kept for after,
 * ack_read_ahead), and sits on its worker's list, oldest first. The
 * replication thread's confirmation wakes the worker (conn_env_ack_kick, then
 * conn_env_acks); a timer at the oldest deadline closes, unanswered, those no
 * peer confirmed in time. A client that was not answered cannot take the write
 * for durable; it may still reach the peers, as any write this node holds.
 */

enum ack_verdict {
    ACK_NONE, /* nothing to wait for */
    ACK_WAIT, /* replies held */
    ACK_FAIL, /* a write will never be confirmed: close unanswered */
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void ack_unlink(conn *c)
{
    conn_env *env = c->env;
    if (c->ack_prev != NULL) {
        c->ack_prev->ack_next = c->ack_next;
    } else {
        env->ack_head = c->ack_next;
    }
    if (c->ack_next != NULL) {
        c->ack_next->ack_prev = c->ack_prev;
    } else {
        env->ack_tail = c->ack_prev;
    }
    c->ack_prev = c->ack_next = NULL;
    c->ack_ticket = 0;
    __atomic_sub_fetch(&env->ack_waiting, 1, __ATOMIC_SEQ_CST);
}

/* Arms the timer for the oldest waiting connection's deadline. */
static void ack_arm(conn_env *env, uint64_t now)
{
    if (env->ack_head == NULL || env->ack_timer == NULL) {
        return;
    }
    uint64_t left = env->ack_head->ack_deadline_ns > now
                        ? env->ack_head->ack_deadline_ns - now
                        : 0;
    struct timeval tv = {(time_t)(left / 1000000000ull),
                         (suseconds_t)(left % 1000000000ull / 1000)};
    /* A failure leaves the confirmations to answer them, not the clock. */
    (void)evtimer_add(env->ack_timer, &tv);
}

static void ack_timer_cb(evutil_socket_t fd, short what, void *arg);

/* After a parser call (has_output: it left replies): whether they wait. */
static enum ack_verdict ack_hold(conn *c, bool has_output)
{
    conn_env *env = c->env;
    const proto_config *cfg = env->pcfg;
    if (cfg->ack_take == NULL) {
        return ACK_NONE;
    }
    bool dropped = false;
    uint64_t t = cfg->ack_take(cfg->ack_arg, &dropped);
    if (!has_output || (t == 0 && !dropped)) {
        return c->ack_ticket != 0 ? ACK_WAIT : ACK_NONE;
    }
    if (dropped) {
        return ACK_FAIL;
    }
    if (c->ack_ticket != 0) {
        c->ack_ticket = t > c->ack_ticket ? t : c->ack_ticket;
        return ACK_WAIT;
    }
    if (cfg->ack_held(cfg->ack_arg, t)) {
        return ACK_NONE;
    }
    if (env->ack_timer == NULL) {
        env->ack_timer = evtimer_new(env->base, ack_timer_cb, env);
        if (env->ack_timer == NULL) {
            return ACK_FAIL;
        }
    }
    uint64_t now = mono_ns();
    c->ack_ticket = t;
    c->ack_deadline_ns = now + (uint64_t)cfg->ack_wait_ms * 1000000ull;
    c->ack_next = NULL;
    c->ack_prev = env->ack_tail;
    if (env->ack_tail != NULL) {
        env->ack_tail->ack_next = c;
    } else {
        env->ack_head = c;
    }
    env->ack_tail = c;
    /* Counted before looking again: either this look sees a confirmation
     * that came meanwhile, or its sender sees this connection waiting and
     * wakes the worker (both sequentially consistent). */
    __atomic_add_fetch(&env->ack_waiting, 1, __ATOMIC_SEQ_CST);
    if (cfg->ack_held(cfg->ack_arg, t)) {
        ack_unlink(c);
        return ACK_NONE;
    }
    STATS_INCR(env->stats, repl_ack_waits);
    if (env->ack_head == c) {
        ack_arm(env, now);
    }
    return ACK_WAIT;
}

/* A write of the parser call will never be confirmed: no reply of it, nor
 * any queued before it, goes out, and the connection closes. */
static int ack_fail(conn *c)
{
    STATS_INCR(c->env->stats, repl_ack_failures);
    c->ctx.out_flat_len = 0;
    evbuffer_drain(c->out, evbuffer_get_length(c->out));
    return PROTO_CLOSE;
}

static bool flush_out(conn *c);
static void start_closing(conn *c);

/*
 * Answers the waiting connections whose writes a peer now holds; with
 * `expire`, closes unanswered those past their deadline.
 */
static void ack_scan(conn_env *env, bool expire)
{
    const proto_config *cfg = env->pcfg;
    uint64_t now = mono_ns();
    conn *c = env->ack_head;
    while (c != NULL) {
        conn *next = c->ack_next;
        if (cfg->ack_held(cfg->ack_arg, c->ack_ticket)) {
            ack_unlink(c);
            /* What the client sent meanwhile (ack_read_ahead) is parsed
             * now; flush_out sees to a connection that stopped reading. */
            if (flush_out(c) && c->reading &&
                (evbuffer_get_length(c->in) > 0 || c->paused ||
                 (c->tls != NULL && tls_conn_pending(c->tls)))) {
                event_active(&c->rev, EV_READ, 0);
            }
        } else if (expire && now >= c->ack_deadline_ns) {
            ack_unlink(c);
            (void)ack_fail(c);
            start_closing(c);
            flush_out(c);
        }
        c = next;
    }
    ack_arm(env, now);
}

static void ack_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    ack_scan(arg, true);
}

bool conn_env_ack_kick(conn_env *env)
{
    if (__atomic_load_n(&env->ack_waiting, __ATOMIC_SEQ_CST) == 0) {
        return false;
    }
    return !__atomic_exchange_n(&env->ack_kicked, true, __ATOMIC_SEQ_CST);
}

void conn_env_acks(conn_env *env)
{
    /* Down first: a confirmation after this store kicks again. */
    __atomic_store_n(&env->ack_kicked, false, __ATOMIC_SEQ_CST);
    if (env->ack_head != NULL) {
        ack_scan(env, false);
    }
}

/*
 * Runs the connection's parser over c->in, or over the `lent` bytes read
 * into the worker's memory (c->in is then empty). Returns a PROTO_* code.
 */
static int run_parser(conn *c, size_t lent)
{
    conn_env *env = c->env;
    c->ctx.executed = 0;
    /* A paused parser may have work left without input (a long dump). */
    if (lent == 0 && evbuffer_get_length(c->in) == 0 && !c->paused &&
        !c->idle_stream) {
        return PROTO_OK;
    }
    if (c->parser == PARSER_UNKNOWN) {
        unsigned char first = 0;
        if (lent > 0) {
            first = (unsigned char)env->in_flat[0];
        } else {
            evbuffer_copyout(c->in, &first, 1);
        }
        c->parser = first == 0x80 ? PARSER_BIN : PARSER_TEXT;
    }
    set_state(c, CONN_PARSING);
    int rc;
    if (c->parser == PARSER_BIN) {
        /* The binary parser reads `in` only: the bytes are referenced
         * there, not copied (no 16 KB block per read), and what it left
         * of them is copied into a buffer of the connection's own. */
        if (lent > 0 && evbuffer_add_reference(c->in, env->in_flat, lent, NULL,
                                               NULL) != 0) {
            return PROTO_CLOSE;
        }
        rc = proto_bin_execute(&c->ctx, c->in, c->out);
        size_t left = lent > 0 ? evbuffer_get_length(c->in) : 0;
        if (left > 0) {
            evbuffer_drain(c->in, left);
            if (evbuffer_add(c->in, env->in_flat + (lent - left), left) != 0) {
                rc = PROTO_CLOSE;
            }
        }
        if (ack_hold(c, evbuffer_get_length(c->out) > 0) == ACK_FAIL) {
            rc = ack_fail(c);
        }
    } else {
        c->ctx.in_flat = lent > 0 ? env->in_flat : NULL;
        c->ctx.in_flat_len = lent;
        c->ctx.out_flat = c->tls == NULL ? env->out_flat : NULL;
        c->ctx.out_flat_cap = c->ctx.out_flat != NULL ? PROTO_OUT_FLAT : 0;
        rc = proto_text_execute(&c->ctx, c->in, c->out);
        if (ack_hold(c, c->ctx.out_flat_len > 0 ||
                            evbuffer_get_length(c->out) > 0) == ACK_FAIL) {
            rc = ack_fail(c);
        }
        c->ctx.in_flat = NULL;
        c->ctx.in_flat_len = 0;
        c->ctx.out_flat = NULL;
        c->ctx.out_flat_cap = 0;
        if (!settle_out(c)) {
            rc = PROTO_CLOSE;
        }
    }
    set_state(c, c->ctx.mid_request ? CONN_NREAD : CONN_WAITING);
    if (c->ctx.yielded) {
        __atomic_fetch_add(&env->conn_yields, 1, __ATOMIC_RELAXED);
    }
    return rc;
}

static void stop_reading(conn *c)
{
    if (c->reading) {
        event_del(&c->rev);
        c->reading = false;
    }
}

static void start_closing(conn *c)
{
    stop_reading(c);
    if (c->closing_since == 0) {
        c->closing_since = conn_now();
        if (c->closing_since == 0) {
            c->closing_since = 1;
        }
    }
    set_state(c, CONN_CLOSING);
}

/*
 * One TLS record's worth of c->out: the head of the buffer is copied into
 * the worker's staging buffer (replies are many small pieces; one
 * SSL_write each would make one record each) and what OpenSSL took is
 * drained. A retry after WANT_WRITE copies the same head again, as
 * OpenSSL requires. Returns like evbuffer_write.
 */
static int write_tls(conn *c)
{
    conn_env *env = c->env;
    ev_ssize_t len =
        evbuffer_copyout(c->out, env->tls_wbuf, env->tls_wbuf_size);
    if (len <= 0) {
        return 0;
    }
    ssize_t w = tls_conn_write(c->tls, env->tls_wbuf, (size_t)len);
    if (w > 0) {
        evbuffer_drain(c->out, (size_t)w);
        return (int)w;
    }
    if (w == TLS_IO_WANT_WRITE || w == TLS_IO_WANT_READ) {
        /* WANT_READ (a key update in flight) is met by the read event,
         * which stays armed while replies are pending below the cap. */
        errno = EAGAIN;
        return -1;
    }
    errno = EPIPE;
    return -1;
}

/*
 * Writes as much of c->out as the socket takes, then arranges what comes
 * next: wait for writability, pause or resume reading, or close. Returns
 * false when the connection was closed.
 */
static bool flush_out(conn *c)
{
    if (c->ack_ticket != 0) {
        /* Held for a peer's confirmation (ack_scan flushes again); a
         * writable socket must not call back meanwhile. */
        if (c->writing) {
            event_del(&c->wev);
            c->writing = false;
        }
        return true;
    }
    size_t total = 0;
    while (evbuffer_get_length(c->out) > 0) {
        int n = c->tls != NULL ? write_tls(c) : evbuffer_write(c->out, c->fd);
        if (n > 0) {
            total += (size_t)n;
            continue;
        }
        if (n == 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) {
            break;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        /* The peer is gone; replies cannot be delivered. */
        if (total > 0) {
            STATS_ADD(c->env->stats, bytes_written, total);
        }
        conn_close(c);
        return false;
    }
    if (total > 0) {
        STATS_ADD(c->env->stats, bytes_written, total);
        touch(c);
    }

    size_t pending = evbuffer_get_length(c->out);
    bool closing = c->closing_since != 0;
    if (pending == 0 && c->tls_wants_write) {
        /* A TLS read waits for writability: keep wev for it. */
        if (!c->writing) {
            if (event_add(&c->wev, NULL) != 0) {
                conn_close(c);
                return false;
            }
            c->writing = true;
        }
    } else if (pending == 0) {
        if (c->writing) {
            event_del(&c->wev);
            c->writing = false;
        }
        /* Replies still relayed will land in c->out: wait for them. */
        if (closing && (c->ctx.proxy == NULL || !proxy_busy(&c->ctx))) {
            conn_close(c);
            return false;
        }
    } else if (!c->writing) {
        if (event_add(&c->wev, NULL) != 0) {
            conn_close(c);
            return false;
        }
        c->writing = true;
    }
    if (closing) {
        return true;
    }
    if (pending > c->env->output_max) {
        stop_reading(c);
        set_state(c, CONN_MWRITE);
    } else if (c->relay_blocked) {
        /* relay_cb resumes once relayed replies come back */
    } else if (!c->reading && pending <= c->env->output_max / 2) {
        if (rev_add(c) != 0) {
            conn_close(c);
            return false;
        }
        c->reading = true;
        set_state(c, c->ctx.mid_request ? CONN_NREAD : CONN_WAITING);
        /* A parser may have left complete requests (or a dump) behind
         * while the output was full: let the read callback run it again
         * (after_parse sets paused anew). */
        if (evbuffer_get_length(c->in) > 0 || c->paused ||
            (c->tls != NULL && tls_conn_pending(c->tls))) {
            event_active(&c->rev, EV_READ, 0);
        }
    } else if (c->paused && pending <= c->env->output_max / 2) {
        /* Still reading, but the requests the parser left behind may be
         * all the client sends: no byte will wake the read callback.
         * (paused stays set so that run_parser runs; after_parse sets it
         * anew.) */
        event_active(&c->rev, EV_READ, 0);
    }
    return true;
}

static void after_parse(conn *c, int rc, bool eof);

/*
 * Replies wait for a peer's confirmation: what the client sends meanwhile
 * is kept in c->in for after. Reading stays armed, which spares an
 * epoll_ctl pair per acknowledged write; it stops beyond half of
 * input_max, at the end of input or on an error, which the read after
 * the wait meets again.
 */
static void ack_read_ahead(conn *c)
{
    ssize_t r = read_chunk(c, CONN_READ_CHUNK);
    if (r > 0) {
        STATS_ADD(c->env->stats, bytes_read, (uint64_t)r);
        touch(c);
        /* Half: after the wait, what the parser leaves of it stays
         * below the cap after_parse closes at. */
        if (evbuffer_get_length(c->in) > c->env->input_max / 2) {
            stop_reading(c);
        }
    } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        stop_reading(c);
    }
}

static void read_cb(evutil_socket_t fd, short what, void *arg)
{
    conn *c = arg;
    conn_env *env = c->env;
    size_t got = 0;
    size_t lent = 0; /* bytes of the last read left in worker memory */
    bool eof = false;
    unsigned reads = 0;

    (void)fd;
    (void)what;
    if (c->ack_ticket != 0) {
        ack_read_ahead(c);
        return;
    }
    /* A parser that stopped with requests (or a dump) left goes on first:
     * input is read only once it has caught up, so it stays bounded. */
    while (!c->paused && reads < env->reqs_per_event) {
        bool borrow = reads == 0 && can_lend(c);
        ssize_t r = borrow ? read_lent(c) : read_chunk(c, CONN_READ_CHUNK);
        if (r > 0) {
            got += (size_t)r;
            reads++;
            /* A short read drained the socket; over TLS, OpenSSL may
             * still hold the tail of a record the socket won't signal. */
            if ((size_t)r < CONN_READ_CHUNK &&
                (c->tls == NULL || !tls_conn_pending(c->tls))) {
                lent = borrow ? (size_t)r : 0;
                break;
            }
            /* More is coming: the bytes become the connection's. */
            if (borrow && evbuffer_add(c->in, env->in_flat, (size_t)r) != 0) {
                STATS_ADD(env->stats, bytes_read, got);
                conn_close(c);
                return;
            }
            continue;
        }
        if (r == 0) {
            eof = true;
            break;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            break;
        }
        /* ECONNRESET and friends: nothing more can be delivered. */
        if (got > 0) {
            STATS_ADD(env->stats, bytes_read, got);
        }
        conn_close(c);
        return;
    }
    if (reads == env->reqs_per_event) {
        __atomic_fetch_add(&env->conn_yields, 1, __ATOMIC_RELAXED);
    }
    if (got > 0) {
        STATS_ADD(env->stats, bytes_read, got);
        touch(c);
    }

    int rc = run_parser(c, lent);
    if (got > 0 && c->ctx.executed > 0) {
        env->inputs++;
        env->piped += c->ctx.executed > 1;
    }
    after_parse(c, rc, eof);
    if (!flush_out(c)) {
        return;
    }
    /* Decrypted input left inside OpenSSL wakes nobody: come back for
     * it. */
    if (c->tls != NULL && c->reading && !c->paused &&
        tls_conn_pending(c->tls)) {
        event_active(&c->rev, EV_READ, 0);
    }
}

/* The connection's part after a parser run that returned rc. */
static void after_parse(conn *c, int rc, bool eof)
{
    conn_env *env = c->env;
    bool was_stream = c->idle_stream;
    c->paused = rc == PROTO_PAUSED;
    c->idle_stream = rc == PROTO_IDLE;
    if (c->idle_stream != was_stream && c->reading && rev_add(c) != 0) {
        start_closing(c);
        return;
    }
    if (c->paused && c->ctx.proxy != NULL && proxy_blocked(&c->ctx, c->out)) {
        /* Too many relayed requests in flight: take no more input until
         * their replies are in (relay_cb). */
        c->relay_blocked = true;
        stop_reading(c);
    }
    if (rc == PROTO_SHUTDOWN) {
        if (env->request_shutdown != NULL) {
            env->request_shutdown(env->shutdown_arg);
        }
        start_closing(c);
    } else if ((rc != PROTO_OK && rc != PROTO_PAUSED && rc != PROTO_IDLE) ||
               eof) {
        c->closed_error = rc == PROTO_CLOSE_ERROR;
        start_closing(c);
    } else if (evbuffer_get_length(c->in) > env->input_max) {
        /* A parser bounds what it buffers; this only guards the daemon
         * against a request that no parser would ever complete. */
        start_closing(c);
    }
}

/*
 * Relayed replies were appended to c->out: send them, and run the parser
 * again if it stopped at the in-flight cap.
 */
static void relay_cb(evutil_socket_t fd, short what, void *arg)
{
    conn *c = arg;
    (void)fd;
    (void)what;
    if (c->relay_blocked && c->closing_since == 0) {
        c->relay_blocked = false;
        after_parse(c, run_parser(c, 0), false);
    }
    flush_out(c);
}

static void write_cb(evutil_socket_t fd, short what, void *arg)
{
    conn *c = arg;
    if (c->tls_wants_write) {
        /* The handshake (or a TLS read) was waiting for this. */
        c->tls_wants_write = false;
        if (c->reading) {
            read_cb(fd, EV_READ, c);
            return;
        }
    }
    (void)what;
    flush_out(c);
}

void conn_env_take_inputs(conn_env *env, unsigned *inputs, unsigned *piped)
{
    *inputs = env->inputs;
    *piped = env->piped;
    env->inputs = env->piped = 0;
}

void conn_env_tick(conn_env *env, uint32_t now)
{
    conn *c = env->head;
    while (c != NULL) {
        conn *next = c->next;
        if (c->closing_since != 0) {
            if (now - c->closing_since > CONN_CLOSE_GRACE) {
                conn_close(c);
            }
        } else if (c->tls != NULL && !tls_conn_established(c->tls) &&
                   now - c->opened > CONN_HANDSHAKE_SECS) {
            if (env->verbose > 1) {
                fprintf(stderr, "<%d TLS handshake timeout\n", c->fd);
            }
            conn_close(c);
        } else if (env->idle_timeout != 0 &&
                   now - c->last_active > env->idle_timeout) {
            __atomic_fetch_add(&env->idle_kicks, 1, __ATOMIC_RELAXED);
            if (env->verbose > 1) {
                fprintf(stderr, "<%d idle timeout\n", c->fd);
            }
            conn_close(c);
        }
        c = next;
    }
}

void conn_env_destroy(conn_env *env)
{
    while (env->head != NULL) {
        conn *c = env->head;
        /* One last try to hand over pending replies (e.g. to the client
         * that asked for shutdown); the socket is non-blocking. Replies
         * still waiting for a peer's confirmation are not answers. */
        if (evbuffer_get_length(c->out) > 0 && c->ack_ticket == 0) {
            if (c->tls != NULL) {
                write_tls(c);
            } else {
                evbuffer_write(c->out, c->fd);
            }
        }
        conn_close(c);
    }
    while (env->free_list != NULL) {
        conn *c = env->free_list;
        env->free_list = c->next;
        conn_free(c);
    }
    if (env->ack_timer != NULL) {
        event_free(env->ack_timer);
        env->ack_timer = NULL;
    }
    free(env->tls_wbuf);
    env->tls_wbuf = NULL;
    free(env->in_flat);
    env->in_flat = NULL;
    env->out_flat = NULL;
    /* Last: the connections above have let go of their relays. */
    proxy_pool_destroy(env->relays);
    env->relays = NULL;
}

void conn_env_fini(conn_env *env)
{
    pthread_mutex_destroy(&env->lock);
}

void conn_env_each(conn_env *env, conn_info_fn fn, void *arg)
{
    uint32_t now = conn_now();
    pthread_mutex_lock(&env->lock);
    for (conn *c = env->head; c != NULL; c = c->next) {
        conn_info ci;
        uint8_t st = __atomic_load_n(&c->state, __ATOMIC_RELAXED);
        uint32_t last = __atomic_load_n(&c->last_active, __ATOMIC_RELAXED);
        ci.fd = c->fd;
        ci.peer = (const struct sockaddr *)&c->peer;
        ci.peerlen = c->peerlen;
        ci.state =
            state_names[st < sizeof(state_names) / sizeof(state_names[0]) ? st
                                                                          : 0];
        ci.secs_since_last_cmd = now - last;
        fn(arg, &ci);
    }
    pthread_mutex_unlock(&env->lock);
}
