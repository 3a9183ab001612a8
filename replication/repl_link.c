/*
 * repl_link.c -- an authenticated, framed connection over a bufferevent:
 * the handshake, the frame reader, sending, flow control and closing that
 * the peer channel and the registry channel share (see repl_link.h, and
 * replication/README.md for the handshake).
 */
#define _GNU_SOURCE
#include "repl_link.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "log.h"
#include "repl_tls.h"

/* Frame cap while the handshake runs: its frames are 32 to 36 bytes. */
#define HANDSHAKE_CAP 64
#define HANDSHAKE_TIMEOUT_S 5

enum link_state {
    L_HELLO, /* HELLO (server) or CHALLENGE (client) expected */
    L_PROOF, /* PROOF (server) or ACCEPT (client) expected */
    L_READY,
};

struct repl_link {
    struct bufferevent *bev;
    const repl_link_ops *ops;
    void *arg;
    repl_link_options o;
    bool outgoing;
    enum link_state state;
    repl_auth auth;
    repl_mac *mac;       /* the session key's HMAC context, once derived */
    SSL *ssl;            /* with TLS: the bufferevent's, owned by it */
    uint8_t tls_key[32]; /* with TLS: the handshake key, exported */
    bool hello_sent;     /* the dialling side sent its HELLO */
    char refusal[192];   /* why the handshake was refused, for the log */
    char addr[64];       /* the other side's address, once connected */
    uint64_t seq_out, seq_in;
    bool read_paused; /* output over the high water: not reading */
    bool direct;      /* plain and ready: frames are written as they are
                         queued (link_write_through) */
    bool closing;     /* close once the output is sent */
    int closing_why;  /* and report this (REPL_LINK_CLOSED_SELF or _DUPLICATE)
                       */
    bool dead;        /* closed() ran; freed when no callback is running */
    int busy;         /* depth of this link's bufferevent callbacks */
};

const char *repl_link_strerror(int rc)
{
    switch (rc) {
    case REPL_LINK_OK:
        return "ok";
    case REPL_LINK_ERR_NOMEM:
        return "out of memory";
    case REPL_LINK_ERR_CONNECT:
        return "connect failed";
    case REPL_LINK_ERR_STATE:
        return "link not ready";
    case REPL_LINK_ERR_FRAME:
        return "frame could not be sent";
    case REPL_LINK_ERR_BUSY:
        return "output not empty";
    default:
        return "unknown error";
    }
}

static void count(uint64_t *counter, uint64_t v)
{
    if (counter)
        __atomic_fetch_add(counter, v, __ATOMIC_RELAXED);
}

static void set_nodelay(evutil_socket_t fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* ========================================================== lifecycle */

/*
 * Derives the session key and keeps its HMAC context. Over TLS the
 * handshake key is exported from the TLS session (finished on both sides
 * by the time a HELLO or CHALLENGE has come through it), so the frames
 * are bound to it and no cluster secret is needed.
 */
static int link_derive(repl_link *l)
{
    if (l->ssl) {
        if (repl_tls_exporter(l->ssl, l->tls_key) != 0)
            return -1;
        l->auth.secret = l->tls_key;
        l->auth.nsecret = sizeof(l->tls_key);
    }
    if (repl_wire_derive(&l->auth) != REPL_WIRE_OK)
        return -1;
    repl_mac_destroy(l->mac);
    l->mac = repl_mac_create(l->auth.session_key);
    return l->mac ? 0 : -1;
}

static void link_free(repl_link *l)
{
    repl_mac_destroy(l->mac);
    bufferevent_free(l->bev); /* and the SSL object, if any */
    OPENSSL_cleanse(l->tls_key, sizeof(l->tls_key));
    free(l);
}

/*
 * Marks l dead and tells the owner, once. A callback of l's own (busy > 0)
 * ends l with this; link_leave frees it on the way out.
 */
static void link_kill(repl_link *l, int why)
{
    if (l->dead)
        return;
    l->dead = true;
    bufferevent_disable(l->bev, EV_READ | EV_WRITE);
    l->ops->closed(l->arg, l, why);
}

/*
 * Tells the owner once, then frees l, or leaves the freeing to link_leave
 * when one of its callbacks is still on the stack.
 */
static void link_end(repl_link *l, int why)
{
    bool was_dead = l->dead;
    link_kill(l, why);
    if (!was_dead && l->busy == 0)
        link_free(l);
}

/* Leaves a bufferevent callback; the last one out frees a dead link. */
static void link_leave(repl_link *l)
{
    if (--l->busy == 0 && l->dead)
        link_free(l);
}

void repl_link_close(repl_link *l)
{
    link_end(l, REPL_LINK_CLOSED_LOCAL);
}

/* ============================================================ sending */

/*
 * Writes as much of out as the socket takes now. A socket bufferevent
 * keeps the start of its output frozen (only its own write drains it), so
 * this thaws it around the write, as the bufferevent does itself.
 */
static void link_write_out(struct evbuffer *out, evutil_socket_t fd)
{
    evbuffer_unfreeze(out, 1);
    while (evbuffer_get_length(out) != 0)
        if (evbuffer_write(out, fd) <= 0)
            break;
    evbuffer_freeze(out, 1);
}

/*
 * A ready link without TLS writes a frame to its socket as soon as it is
 * queued, with the bufferevent's write event off, and turns the event on
 * only for what the socket did not take (on_write turns it off again once
 * the output is empty). Through the bufferevent alone, every frame cost
 * an epoll_ctl to add the write event, a wake-up to learn the socket was
 * writable, and another epoll_ctl to remove the event: for eager pushes,
 * several system calls per window on the node that takes the writes.
 * While the event is on, frames queue behind the output as before, so
 * they still leave in order. An error is left to the bufferevent: with
 * the frame still queued and the event on, its own write reports it.
 */
static void link_write_through(repl_link *l)
{
    struct evbuffer *out = bufferevent_get_output(l->bev);
    if (bufferevent_get_enabled(l->bev) & EV_WRITE)
        return;
    link_write_out(out, bufferevent_getfd(l->bev));
    if (evbuffer_get_length(out) != 0)
        bufferevent_enable(l->bev, EV_WRITE);
}

/* Builds one frame straight into the output buffer. */
static int link_queue(repl_link *l, uint8_t type, const uint8_t *payload,
                      uint32_t len)
{
    repl_mac *mac = NULL;
    uint64_t seq = 0;
    if (type != REPL_MSG_HELLO && type != REPL_MSG_CHALLENGE) {
        if (!l->mac)
            return REPL_LINK_ERR_STATE;
        mac = l->mac;
        seq = l->seq_out;
    }
    if (len > REPL_WIRE_MAX_PAYLOAD)
        return REPL_LINK_ERR_FRAME;
    size_t size = repl_wire_frame_size(len);
    struct evbuffer *out = bufferevent_get_output(l->bev);
    struct evbuffer_iovec v;
    if (evbuffer_reserve_space(out, (ev_ssize_t)size, &v, 1) != 1 ||
        v.iov_len < size)
        return REPL_LINK_ERR_FRAME;
    long n = repl_wire_build_mac(v.iov_base, v.iov_len, type, seq, payload,
                                 len, mac);
    if (n < 0)
        return REPL_LINK_ERR_FRAME;
    v.iov_len = (size_t)n;
    if (evbuffer_commit_space(out, &v, 1) != 0)
        return REPL_LINK_ERR_FRAME;
    if (mac)
        l->seq_out++;
    count(l->o.bytes_sent, (uint64_t)n);
    if (l->direct)
        link_write_through(l);
    return REPL_LINK_OK;
}

int repl_link_send(repl_link *l, uint8_t type, const uint8_t *payload,
                   uint32_t len)
{
    if (l->state != L_READY || l->closing || l->dead)
        return REPL_LINK_ERR_STATE;
    /* Never more than a link with the same settings would take. */
    if (len > l->o.max_payload)
        return REPL_LINK_ERR_FRAME;
    return link_queue(l, type, payload, len);
}

int repl_link_send_now(repl_link *l, uint8_t type, const uint8_t *payload,
                       uint32_t len)
{
    if (l->state != L_READY || l->closing || l->dead)
        return REPL_LINK_ERR_STATE;
    /*
     * Frames already queued (a heartbeat, a probe reply) go first, as far
     * as the socket takes them now; the frame is sent only behind a whole
     * queue, never in the middle of one.
     */
    struct evbuffer *out = bufferevent_get_output(l->bev);
    if (!l->ssl) /* with TLS the output is plaintext, for the session */
        link_write_out(out, bufferevent_getfd(l->bev));
    if (evbuffer_get_length(out) != 0)
        return REPL_LINK_ERR_BUSY;
    if (len > REPL_WIRE_MAX_PAYLOAD)
        return REPL_LINK_ERR_FRAME;
    size_t size = repl_wire_frame_size(len);
    uint8_t *frame = malloc(size);
    if (!frame)
        return REPL_LINK_ERR_NOMEM;
    long n = l->mac ? repl_wire_build_mac(frame, size, type, l->seq_out,
                                          payload, len, l->mac)
                    : REPL_WIRE_ERR_CRYPTO;
    int rc = REPL_LINK_ERR_FRAME;
    if (n > 0) {
        l->seq_out++;
        /* With TLS, one record straight through the session: safe with
         * the bufferevent's output empty (no write of its own pending). */
        ssize_t w = l->ssl ? SSL_write(l->ssl, frame, (int)n)
                           : send(bufferevent_getfd(l->bev), frame, (size_t)n,
                                  MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0)
            count(l->o.bytes_sent, (uint64_t)w);
        rc = w == n ? REPL_LINK_OK : REPL_LINK_ERR_FRAME;
    }
    free(frame);
    return rc;
}

/* ========================================================== handshake */

static int send_hello(repl_link *l, uint8_t type, const uint8_t *nonce)
{
    uint8_t p[4 + REPL_WIRE_NONCE];
    repl_wire_put_u32(p, l->o.node_id);
    memcpy(p + 4, nonce, REPL_WIRE_NONCE);
    return link_queue(l, type, p, sizeof(p));
}

static int send_proof(repl_link *l, uint8_t type, int role)
{
    uint8_t p[32];
    if (repl_wire_proof(&l->auth, role, p) != REPL_WIRE_OK)
        return REPL_LINK_ERR_FRAME;
    return link_queue(l, type, p, sizeof(p));
}

static void become_ready(repl_link *l)
{
    l->state = L_READY;
    struct timeval tv = {(time_t)l->o.idle_s, 0};
    bufferevent_set_timeouts(l->bev, l->o.idle_s ? &tv : NULL, NULL);
    if (!l->ssl) {
        l->direct = true;
        if (evbuffer_get_length(bufferevent_get_output(l->bev)) == 0)
            bufferevent_disable(l->bev, EV_WRITE);
    }
    if (l->ops->ready)
        l->ops->ready(l->arg, l);
}

/*
 * One handshake frame. Returns 0 to go on, REPL_LINK_CLOSED_AUTH to refuse
 * the link, REPL_LINK_CLOSED_SELF to drop it quietly (we dialled
 * ourselves).
 */
static int handshake(repl_link *l, const repl_frame *f)
{
    if (l->state == L_HELLO) {
        uint8_t want = l->outgoing ? REPL_MSG_CHALLENGE : REPL_MSG_HELLO;
        if (f->type != want || f->length != 4 + REPL_WIRE_NONCE)
            return REPL_LINK_CLOSED_AUTH;
        uint32_t node = repl_wire_get_u32(f->payload);
        if (l->o.detect_self && node == l->o.node_id) {
            /*
             * Our own id at the other end: this very process (our own
             * address in the peer list) when the nonce is one of ours,
             * otherwise another node configured with the same node id,
             * which is refused. The dialling side learns it from the
             * CHALLENGE carrying the id; the answering side still sends
             * that CHALLENGE, with a nonce of its own, then closes once
             * it is out, so both sides can tell and say which it was.
             */
            int why = repl_wire_nonce_ours(f->payload + 4)
                          ? REPL_LINK_CLOSED_SELF
                          : REPL_LINK_CLOSED_DUPLICATE;
            if (l->outgoing)
                return why;
            if (repl_wire_nonce(l->auth.server_nonce) != REPL_WIRE_OK ||
                send_hello(l, REPL_MSG_CHALLENGE, l->auth.server_nonce) != 0)
                return why;
            l->closing = true;
            l->closing_why = why;
            return 0;
        }
        if (l->ssl &&
            !repl_tls_id_ok(l->ssl, node, l->refusal, sizeof(l->refusal)))
            return REPL_LINK_CLOSED_AUTH;
        if (l->ops->check_id && !l->ops->check_id(l->arg, node))
            return REPL_LINK_CLOSED_AUTH;
        if (l->outgoing) {
            l->auth.server_node = node;
            memcpy(l->auth.server_nonce, f->payload + 4, REPL_WIRE_NONCE);
            if (link_derive(l) != 0)
                return REPL_LINK_CLOSED_AUTH;
            l->state = L_PROOF;
            return send_proof(l, REPL_MSG_PROOF, 0) == 0
                       ? 0
                       : REPL_LINK_CLOSED_AUTH;
        }
        l->auth.client_node = node;
        l->auth.server_node = l->o.node_id;
        memcpy(l->auth.client_nonce, f->payload + 4, REPL_WIRE_NONCE);
        if (repl_wire_nonce(l->auth.server_nonce) != REPL_WIRE_OK ||
            link_derive(l) != 0)
            return REPL_LINK_CLOSED_AUTH;
        l->state = L_PROOF;
        return send_hello(l, REPL_MSG_CHALLENGE, l->auth.server_nonce) == 0
                   ? 0
                   : REPL_LINK_CLOSED_AUTH;
    }
    /* L_PROOF: the frame was already authenticated with the session key. */
    uint8_t want = l->outgoing ? REPL_MSG_ACCEPT : REPL_MSG_PROOF;
    if (f->type != want || !repl_wire_proof_ok(&l->auth, l->outgoing ? 1 : 0,
                                               f->payload, f->length))
        return REPL_LINK_CLOSED_AUTH;
    if (!l->outgoing && send_proof(l, REPL_MSG_ACCEPT, 1) != 0)
        return REPL_LINK_CLOSED_AUTH;
    become_ready(l);
    return 0;
}

/* Notes the other side's address while the socket is connected. */
static void note_addr(repl_link *l, evutil_socket_t fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (fd >= 0 && getpeername(fd, (struct sockaddr *)&ss, &len) == 0)
        log_addr((const struct sockaddr *)&ss, len, l->addr, sizeof(l->addr));
}

/* ============================================================ reading */

/*
 * Reads every whole frame in the input. The length is checked against the
 * cap from the header alone, so an oversized frame is refused before its
 * payload is buffered.
 */
static void link_read(repl_link *l)
{
    struct evbuffer *in = bufferevent_get_input(l->bev);
    struct evbuffer *out = bufferevent_get_output(l->bev);
    while (!l->dead && !l->closing) {
        /*
         * A side that sends requests but does not read the answers stops
         * being read (TCP pushes back on it) until its output drains.
         */
        if (l->o.out_high_water &&
            evbuffer_get_length(out) > l->o.out_high_water) {
            bufferevent_disable(l->bev, EV_READ);
            l->read_paused = true;
            return;
        }
        size_t avail = evbuffer_get_length(in);
        if (avail < REPL_WIRE_HEADER)
            return;
        uint8_t *hdr = evbuffer_pullup(in, REPL_WIRE_HEADER);
        uint32_t length = repl_wire_get_u32(hdr + 4);
        uint32_t cap = l->state == L_READY ? l->o.max_payload : HANDSHAKE_CAP;
        size_t need =
            length <= cap ? repl_wire_frame_size(length) : REPL_WIRE_HEADER;
        if (avail < need)
            return;
        uint8_t *buf = evbuffer_pullup(in, (ev_ssize_t)need);
        repl_mac *mac = l->state == L_HELLO ? NULL : l->mac;
        repl_frame f;
        size_t used = 0;
        int rc = l->state != L_HELLO && !mac
                     ? REPL_WIRE_ERR_AUTH
                     : repl_wire_parse_mac(buf, need, mac, l->seq_in, cap, &f,
                                           &used);
        if (rc == REPL_WIRE_NEED_MORE)
            return;
        if (rc != REPL_WIRE_OK) {
            link_end(l, rc == REPL_WIRE_ERR_AUTH ? REPL_LINK_CLOSED_AUTH
                                                 : REPL_LINK_CLOSED_BAD_FRAME);
            return;
        }
        if (mac)
            l->seq_in++;
        count(l->o.bytes_recv, used);
        int why = 0;
        if (l->state != L_READY) {
            why = handshake(l, &f);
        } else {
            int hr = l->ops->frame(l->arg, l, &f);
            why = hr > 0   ? REPL_LINK_CLOSED_QUIET
                  : hr < 0 ? REPL_LINK_CLOSED_BAD_FRAME
                           : 0;
        }
        if (l->dead)
            return; /* closed by the callback */
        evbuffer_drain(in, used);
        if (why != 0) {
            link_end(l, why);
            return;
        }
    }
    if (l->closing && !l->dead) {
        /* Nothing more is read; the write callback closes once sent. */
        struct timeval tv = {HANDSHAKE_TIMEOUT_S, 0};
        bufferevent_disable(l->bev, EV_READ);
        bufferevent_set_timeouts(l->bev, NULL, &tv);
    }
}

/* ========================================================== callbacks */

static void on_read(struct bufferevent *bev, void *arg)
{
    repl_link *l = arg;
    (void)bev;
    l->busy++;
    link_read(l);
    link_leave(l);
}

/* The output drained to the write low watermark. */
static void on_write(struct bufferevent *bev, void *arg)
{
    repl_link *l = arg;
    struct evbuffer *out = bufferevent_get_output(bev);
    l->busy++;
    if (l->closing) {
        if (evbuffer_get_length(out) == 0)
            link_kill(l, l->closing_why);
        link_leave(l);
        return;
    }
    if (l->direct && evbuffer_get_length(out) == 0)
        bufferevent_disable(bev, EV_WRITE); /* see link_write_through */
    if (l->ops->writable)
        l->ops->writable(l->arg, l);
    if (!l->dead && l->read_paused &&
        evbuffer_get_length(out) <= l->o.out_high_water / 2) {
        l->read_paused = false;
        bufferevent_enable(bev, EV_READ);
        link_read(l); /* frames may be waiting in the input already */
    }
    link_leave(l);
}

/* The dialling side opens the handshake. */
static int send_first_hello(repl_link *l)
{
    l->hello_sent = true;
    l->auth.client_node = l->o.node_id;
    if (repl_wire_nonce(l->auth.client_nonce) != REPL_WIRE_OK)
        return REPL_LINK_ERR_FRAME;
    return send_hello(l, REPL_MSG_HELLO, l->auth.client_nonce);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    repl_link *l = arg;
    l->busy++;
    if (what & BEV_EVENT_CONNECTED) {
        /* A dial connected (over TLS: its handshake finished); on an
         * accepted TLS link, its handshake finished: nothing to do. */
        if (l->outgoing && !l->hello_sent) {
            set_nodelay(bufferevent_getfd(bev));
            note_addr(l, bufferevent_getfd(bev));
            count(l->o.connects, 1);
            if (send_first_hello(l) != 0)
                link_kill(l, REPL_LINK_CLOSED_LOCAL);
        }
    } else if (what & (BEV_EVENT_ERROR | BEV_EVENT_EOF | BEV_EVENT_TIMEOUT)) {
        int why = l->closing ? l->closing_why : REPL_LINK_CLOSED_NET;
        unsigned long e = l->ssl ? bufferevent_get_openssl_error(bev) : 0;
        if (l->ssl && l->state != L_READY && !l->closing &&
            (SSL_get_verify_result(l->ssl) != X509_V_OK ||
             (ERR_GET_LIB(e) == ERR_LIB_SSL &&
              ERR_GET_REASON(e) != SSL_R_UNEXPECTED_EOF_WHILE_READING))) {
            /* The TLS handshake failed: refused, by us or by the other
             * side (an alert), with OpenSSL's reason. A connection that
             * merely ended (a node stopping) is no refusal. */
            repl_tls_failure(l->ssl, e, l->refusal, sizeof(l->refusal));
            why = REPL_LINK_CLOSED_AUTH;
        }
        /* The rest of the bufferevent's OpenSSL errors are of no use. */
        while (l->ssl && bufferevent_get_openssl_error(bev) != 0)
            continue;
        link_kill(l, why);
    }
    link_leave(l);
}

/* ============================================================ creation */

static repl_link *link_new(struct event_base *base, evutil_socket_t fd,
                           bool outgoing, const repl_link_options *o,
                           const repl_link_ops *ops, void *arg)
{
    repl_link *l = calloc(1, sizeof(*l));
    if (!l)
        return NULL;
    if (o->tls) {
        l->ssl = repl_tls_new_ssl(o->tls);
        if (l->ssl)
            l->bev = bufferevent_openssl_socket_new(
                base, fd, l->ssl,
                outgoing ? BUFFEREVENT_SSL_CONNECTING
                         : BUFFEREVENT_SSL_ACCEPTING,
                BEV_OPT_CLOSE_ON_FREE);
        if (l->bev) /* a peer that closes without close_notify: EOF */
            bufferevent_openssl_set_allow_dirty_shutdown(l->bev, 1);
        else
            SSL_free(l->ssl);
    } else {
        l->bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    }
    if (!l->bev) {
        free(l);
        return NULL;
    }
    l->ops = ops;
    l->arg = arg;
    l->o = *o;
    if (l->o.max_payload > REPL_WIRE_MAX_PAYLOAD)
        l->o.max_payload = REPL_WIRE_MAX_PAYLOAD;
    l->outgoing = outgoing;
    l->state = L_HELLO;
    l->auth.secret = (const uint8_t *)(o->secret ? o->secret : "");
    l->auth.nsecret = strlen((const char *)l->auth.secret);
    bufferevent_setcb(l->bev, on_read, on_write, on_event, l);
    bufferevent_setwatermark(l->bev, EV_WRITE, o->write_low_water, 0);
    struct timeval tv = {HANDSHAKE_TIMEOUT_S, 0};
    bufferevent_set_timeouts(l->bev, &tv, NULL);
    bufferevent_enable(l->bev, EV_READ | EV_WRITE);
    return l;
}

/* A link on a connected socket, which it owns from here on. */
static repl_link *link_adopt(struct event_base *base, evutil_socket_t fd,
                             bool outgoing, const repl_link_options *o,
                             const repl_link_ops *ops, void *arg)
{
    set_nodelay(fd);
    repl_link *l = link_new(base, fd, outgoing, o, ops, arg);
    if (!l)
        evutil_closesocket(fd);
    else
        note_addr(l, fd);
    return l;
}

repl_link *repl_link_accept(struct event_base *base, evutil_socket_t fd,
                            const repl_link_options *o,
                            const repl_link_ops *ops, void *arg)
{
    return link_adopt(base, fd, false, o, ops, arg);
}

repl_link *repl_link_start(struct event_base *base, evutil_socket_t fd,
                           const repl_link_options *o,
                           const repl_link_ops *ops, void *arg)
{
    repl_link *l = link_adopt(base, fd, true, o, ops, arg);
    if (l && send_first_hello(l) != 0) {
        link_free(l);
        return NULL;
    }
    return l;
}

int repl_link_dial(struct event_base *base, const struct sockaddr *addr,
                   socklen_t addrlen, const repl_link_options *o,
                   const repl_link_ops *ops, void *arg, repl_link **out)
{
    *out = NULL;
    repl_link *l = link_new(base, -1, true, o, ops, arg);
    if (!l)
        return REPL_LINK_ERR_NOMEM;
    if (bufferevent_socket_connect(l->bev, (struct sockaddr *)addr,
                                   (int)addrlen) != 0) {
        link_free(l);
        return REPL_LINK_ERR_CONNECT;
    }
    *out = l;
    return REPL_LINK_OK;
}

/* ============================================================ queries */

bool repl_link_proof_sent(const repl_link *l)
{
    return l->outgoing && l->state == L_PROOF;
}

bool repl_link_ready(const repl_link *l)
{
    return l->state == L_READY;
}

const char *repl_link_refusal(const repl_link *l)
{
    return l->refusal[0] ? l->refusal : NULL;
}

void repl_link_peer_addr(const repl_link *l, char *buf, size_t n)
{
    snprintf(buf, n, "%s", l->addr[0] ? l->addr : "unknown");
}

bool repl_link_tls(const repl_link *l)
{
    return l->ssl != NULL;
}

uint32_t repl_link_peer_id(const repl_link *l)
{
    if (l->state == L_HELLO)
        return 0;
    return l->outgoing ? l->auth.server_node : l->auth.client_node;
}

size_t repl_link_output_length(const repl_link *l)
{
    return evbuffer_get_length(bufferevent_get_output(l->bev));
}

evutil_socket_t repl_link_fd(const repl_link *l)
{
    return bufferevent_getfd(l->bev);
}

/* ============================================================ addresses */

int repl_link_resolve(const char *what, const char *spec, size_t n,
                      struct sockaddr_storage *ss, socklen_t *len, char *err,
                      size_t nerr)
{
    char buf[REPL_LINK_ADDR_MAX + 1], name[REPL_LINK_ADDR_MAX + 1];
    if (n == 0 || n >= sizeof(buf)) {
        snprintf(err, nerr, "%s address '%.*s' is empty or too long", what,
                 (int)(n > 64 ? 64 : n), spec);
        return -1;
    }
    memcpy(buf, spec, n);
    buf[n] = '\0';
    memcpy(name, buf, n + 1);
    char *host = buf, *colon = strrchr(buf, ':');
    if (!colon || colon == buf || colon[1] == '\0') {
        snprintf(err, nerr, "%s '%s' is not host:port", what, name);
        return -1;
    }
    *colon = '\0';
    if (host[0] == '[') {
        size_t hl = strlen(host);
        if (hl < 2 || host[hl - 1] != ']') {
            snprintf(err, nerr, "%s '%s' has a bad IPv6 address", what, name);
            return -1;
        }
        host[hl - 1] = '\0';
        host++;
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || port < 1 || port > 65535) {
        snprintf(err, nerr, "%s '%s' has a bad port", what, name);
        return -1;
    }
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, nerr, "%s '%s': %s", what, name, gai_strerror(rc));
        return -1;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}
