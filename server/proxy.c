/*
 * proxy.c -- one-hop relaying of requests to the nodes that own their keys
 * (see proxy.h).
 *
 * Three kinds of objects, all owned by one worker thread:
 *
 *   slot      one relayed request: its reply buffer, and the client's
 *             output produced after it ("after"), held until the reply is
 *             in. A slot sits in its client's FIFO (reply order) and in an
 *             upstream's FIFO (wire order) and is freed when both let go.
 *   client    a client connection's FIFO of slots. When the head slot is
 *             done, its reply and its "after" bytes move to the
 *             connection's output buffer, and so on down the FIFO.
 *   upstream  a non-blocking TCP connection to one target's client port in
 *             one protocol (text or binary), with raw events, an input and
 *             an output evbuffer and a FIFO of slots awaiting replies. It
 *             opens with the relay hello. Requests are written verbatim;
 *             quiet ones are followed by a no-op (text "mn", a binary NOOP
 *             with an opaque of ours) so that their reply, possibly empty,
 *             ends at the no-op's answer. Replies are framed by parsing
 *             lines and skipping VALUE / VA data blocks by their byte
 *             counts, never by searching the data.
 *
 * Failures: a connect that fails (at once, asynchronously, or not within
 * half the timeout) marks the target down for PROXY_RETRY_MS and moves the
 * requests that never left to the next target of each. A request without
 * its reply after proxy_timeout_ms, end of input, a read error, or a reply
 * that does not parse closes the upstream and fails every request on it:
 * the client gets PROXY_TEXT_FAILURE or the binary temporary failure.
 * Requests already sent are never retried elsewhere (a write may have
 * happened).
 */
#include "proxy.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event_struct.h>

#include "bin_wire.h"
#include "tls.h"

/* Milliseconds a target whose connect failed is skipped. */
#define PROXY_RETRY_MS 1000
/* Default request timeout. */
#define PROXY_TIMEOUT_DEFAULT_MS 2000
/* Longest reply line accepted from an upstream. */
#define PROXY_LINE_MAX 4096
/* Binary: extras and key a response may carry besides the value. */
#define PROXY_BIN_HEAD_MAX 1024
/* Upstreams a pool keeps (targets times protocols). */
#define PROXY_UPSTREAMS_MAX 256
/* Free slots a pool keeps for reuse. */
#define PROXY_FREE_SLOTS 256
/* Reads per readable event on an upstream, each up to PROXY_READ_CHUNK. */
#define PROXY_READS 16
#define PROXY_READ_CHUNK 65536
/* The opaque of our binary hello and no-op. */
#define PROXY_BIN_MARK 0x52454c59u

static const char text_trailer[] = "mn\r\n";
static const char text_hello[] = PROXY_TEXT_HELLO "\r\n";
static const char bin_failure_text[] = "no owner reachable";

enum up_state {
    UP_IDLE = 0,   /* no socket */
    UP_CONNECTING, /* connect in progress */
    UP_READY,      /* connected: requests are written */
};

typedef struct upstream upstream;
typedef struct pclient pclient;
typedef struct pslot pslot;

struct pslot {
    pslot *cnext;    /* client FIFO */
    pslot *unext;    /* upstream FIFO */
    pclient *client; /* NULL once the client connection is gone */
    upstream *up;    /* NULL once the reply is in (or failed) */
    struct evbuffer *reply;
    struct evbuffer *after;
    struct evbuffer *req; /* the request while it waits for a connect */
    uint64_t deadline;    /* ms, monotonic */
    size_t limit;         /* largest reply accepted */
    uint8_t kind;
    bool get_part;
    bool silent;
    bool done;
    uint8_t bin_opcode;
    uint32_t bin_opaque;
    int ntargets;
    int tried; /* index of the target in use */
    proto_target targets[PROTO_ROUTE_MAX];
};

struct pclient {
    proxy_pool *pool;
    void *owner;
    struct evbuffer *out; /* the connection's output buffer */
    pslot *head;
    pslot *tail;
    unsigned n;
};

struct upstream {
    proxy_pool *pool;
    proto_target target;
    bool binary;
    uint8_t state; /* enum up_state */
    bool hello_pending;
    bool writing;
    bool timer_on;
    bool read_wants_write; /* TLS: a read must wait for writability */
    int fd;
    tls_conn *tls;             /* over TLS (proto_config.relay_tls) */
    uint64_t down_until;       /* ms: skip the target until then */
    uint64_t connect_deadline; /* ms */
    size_t scan;               /* bytes of in framed for the head slot */
    struct evbuffer *in;
    struct evbuffer *out;
    struct event rev;
    struct event wev;
    struct event tev;
    pslot *head;
    pslot *tail;
};

struct proxy_pool {
    struct event_base *base;
    const proto_config *cfg;
    stats_thread *stats;
    void (*wake)(void *owner);
    uint32_t timeout_ms;
    upstream **ups;
    size_t nups;
    pslot *free_slots;
    size_t nfree;
};

/* The relay TLS context (NULL: plain). */
static tls_server *p_tls(const upstream *u)
{
    return u->pool->cfg->relay_tls;
}

/* A monotonic clock in milliseconds; the coarse one is cheap, and a few
 * milliseconds of slack do not matter to timeouts of hundreds. */
static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ============================================================= slots */

static void slot_release_buffers(pslot *s)
{
    evbuffer_drain(s->reply, evbuffer_get_length(s->reply));
    evbuffer_drain(s->after, evbuffer_get_length(s->after));
    if (s->req != NULL) {
        evbuffer_free(s->req);
        s->req = NULL;
    }
}

static void slot_destroy(pslot *s)
{
    slot_release_buffers(s);
    evbuffer_free(s->reply);
    evbuffer_free(s->after);
    free(s);
}

/* A clean slot from the free list or the heap; NULL when out of memory. */
static pslot *slot_new(proxy_pool *p)
{
    pslot *s = p->free_slots;
    if (s != NULL) {
        p->free_slots = s->cnext;
        p->nfree--;
    } else {
        s = calloc(1, sizeof(*s));
        if (s == NULL)
            return NULL;
        s->reply = evbuffer_new();
        s->after = evbuffer_new();
        if (s->reply == NULL || s->after == NULL) {
            if (s->reply != NULL)
                evbuffer_free(s->reply);
            if (s->after != NULL)
                evbuffer_free(s->after);
            free(s);
            return NULL;
        }
    }
    s->cnext = s->unext = NULL;
    s->client = NULL;
    s->up = NULL;
    s->req = NULL;
    s->done = false;
    return s;
}

/* Frees a slot that neither its client nor an upstream holds. */
static void slot_free(proxy_pool *p, pslot *s)
{
    if (p->nfree >= PROXY_FREE_SLOTS) {
        slot_destroy(s);
        return;
    }
    slot_release_buffers(s);
    s->cnext = p->free_slots;
    p->free_slots = s;
    p->nfree++;
}

/* ============================================================ clients */

/*
 * Moves the replies of the done slots at the head of cl's FIFO (and what
 * the parser wrote behind each) to the connection's output, then wakes
 * the connection.
 */
static void client_advance(pclient *cl)
{
    bool moved = false;
    while (cl->head != NULL && cl->head->done) {
        pslot *s = cl->head;
        cl->head = s->cnext;
        if (cl->head == NULL)
            cl->tail = NULL;
        cl->n--;
        evbuffer_add_buffer(cl->out, s->reply);
        evbuffer_add_buffer(cl->out, s->after);
        s->client = NULL;
        slot_free(cl->pool, s);
        moved = true;
    }
    if (moved)
        cl->pool->wake(cl->owner);
}

/* Writes the failure reply of s into buf. */
static void put_failure(const pslot *s, struct evbuffer *buf)
{
    if (s->kind == PROXY_BIN_ONE || s->kind == PROXY_BIN_QUIET) {
        uint8_t h[BIN_HEADER_LEN];
        bin_header bh = {
            .magic = BIN_MAGIC_RES,
            .opcode = s->bin_opcode,
            .status = PROXY_BIN_STATUS_TMPFAIL,
            .bodylen = sizeof(bin_failure_text) - 1,
            .opaque = s->bin_opaque,
        };
        bin_header_encode(h, &bh);
        evbuffer_add(buf, h, sizeof(h));
        evbuffer_add(buf, bin_failure_text, sizeof(bin_failure_text) - 1);
        return;
    }
    if (s->silent || s->get_part)
        return;
    evbuffer_add(buf, PROXY_TEXT_FAILURE, sizeof(PROXY_TEXT_FAILURE) - 1);
}

/* Ends s, which its upstream (if any) has already let go of. */
static void slot_finish(proxy_pool *p, pslot *s)
{
    s->up = NULL;
    s->done = true;
    if (s->req != NULL) {
        evbuffer_free(s->req);
        s->req = NULL;
    }
    if (s->client == NULL) {
        slot_free(p, s);
        return;
    }
    client_advance(s->client);
}

/* Fails s: the failure reply takes its place. */
static void slot_fail(proxy_pool *p, pslot *s)
{
    STATS_INCR(p->stats, proxy_failures);
    evbuffer_drain(s->reply, evbuffer_get_length(s->reply));
    if (s->client != NULL)
        put_failure(s, s->reply);
    slot_finish(p, s);
}

/* ========================================================== upstreams */

static void up_read_cb(evutil_socket_t fd, short what, void *arg);
static void up_write_cb(evutil_socket_t fd, short what, void *arg);
static void up_timer_cb(evutil_socket_t fd, short what, void *arg);
static void slot_dispatch(proxy_pool *p, pslot *s, const void *data, size_t n);

static void up_push(upstream *u, pslot *s)
{
    s->up = u;
    s->unext = NULL;
    if (u->tail != NULL)
        u->tail->unext = s;
    else
        u->head = s;
    u->tail = s;
}

static pslot *up_pop(upstream *u)
{
    pslot *s = u->head;
    if (s != NULL) {
        u->head = s->unext;
        if (u->head == NULL)
            u->tail = NULL;
        s->unext = NULL;
    }
    return s;
}

/* Arms the timer for the earliest deadline that matters now. */
static void up_arm_timer(upstream *u)
{
    uint64_t when;
    if (u->state == UP_CONNECTING)
        when = u->connect_deadline;
    else if (u->head != NULL)
        when = u->head->deadline;
    else
        return;
    if (u->head != NULL && u->head->deadline < when)
        when = u->head->deadline;
    uint64_t now = now_ms();
    uint64_t in = when > now ? when - now : 0;
    struct timeval tv = {(time_t)(in / 1000), (suseconds_t)(in % 1000) * 1000};
    if (event_add(&u->tev, &tv) == 0)
        u->timer_on = true;
}

/* Closes u's socket and clears its buffers; the slots stay queued. */
static void up_close(upstream *u)
{
    if (u->fd >= 0) {
        event_del(&u->rev);
        event_del(&u->wev);
        tls_conn_free(u->tls);
        u->tls = NULL;
        u->read_wants_write = false;
        close(u->fd);
        u->fd = -1;
    }
    event_del(&u->tev);
    u->timer_on = false;
    u->writing = false;
    evbuffer_drain(u->in, evbuffer_get_length(u->in));
    evbuffer_drain(u->out, evbuffer_get_length(u->out));
    u->scan = 0;
    u->hello_pending = false;
    u->state = UP_IDLE;
}

/* Closes u and fails every request on it. */
static void up_fail(upstream *u)
{
    proxy_pool *p = u->pool;
    up_close(u);
    pslot *s;
    while ((s = up_pop(u)) != NULL)
        slot_fail(p, s);
}

/*
 * The connect to u's target failed: mark the target down, close, and send
 * each request that never left to its next target.
 */
static void up_connect_failed(upstream *u)
{
    proxy_pool *p = u->pool;
    u->down_until = now_ms() + PROXY_RETRY_MS;
    up_close(u);
    pslot *s;
    while ((s = up_pop(u)) != NULL) {
        s->up = NULL;
        s->tried++;
        slot_dispatch(p, s, NULL, 0);
    }
}

/* Queues the bytes of request s (and its trailer) for writing. */
static void up_put_request(upstream *u, pslot *s, const void *data, size_t n)
{
    evbuffer_add(u->out, data, n);
    if (s->kind == PROXY_TEXT_QUIET) {
        evbuffer_add(u->out, text_trailer, sizeof(text_trailer) - 1);
    } else if (s->kind == PROXY_BIN_QUIET) {
        uint8_t h[BIN_HEADER_LEN];
        bin_header bh = {.magic = BIN_MAGIC_REQ,
                         .opcode = BIN_OP_NOOP,
                         .opaque = PROXY_BIN_MARK};
        bin_header_encode(h, &bh);
        evbuffer_add(u->out, h, sizeof(h));
    }
}

/* Makes sure u's pending output leaves on the next loop iteration. */
static void up_want_write(upstream *u)
{
    if (!u->writing && u->fd >= 0) {
        if (event_add(&u->wev, NULL) == 0)
            u->writing = true;
    }
}

/*
 * Starts connecting u (idle) and queues the hello. Returns 0, or -1 when
 * the connect failed at once.
 */
static int up_connect(upstream *u)
{
    proxy_pool *p = u->pool;
    const struct sockaddr *sa = (const struct sockaddr *)&u->target.addr;
    int fd =
        socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (sa->sa_family == AF_INET || sa->sa_family == AF_INET6) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    int rc;
    do {
        rc = connect(fd, sa, u->target.addrlen);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    u->fd = fd;
    if (event_assign(&u->rev, p->base, fd, EV_READ | EV_PERSIST, up_read_cb,
                     u) != 0 ||
        event_assign(&u->wev, p->base, fd, EV_WRITE | EV_PERSIST, up_write_cb,
                     u) != 0) {
        close(fd);
        u->fd = -1;
        return -1;
    }
    u->state = UP_CONNECTING;
    u->connect_deadline = now_ms() + p->timeout_ms / 2;
    u->hello_pending = true;
    u->scan = 0;
    if (u->binary) {
        uint8_t h[BIN_HEADER_LEN];
        bin_header bh = {.magic = BIN_MAGIC_REQ,
                         .opcode = PROXY_BIN_OP_HELLO,
                         .opaque = PROXY_BIN_MARK};
        bin_header_encode(h, &bh);
        evbuffer_add(u->out, h, sizeof(h));
    } else {
        evbuffer_add(u->out, text_hello, sizeof(text_hello) - 1);
    }
    /* Writability tells that the connect finished, either way. */
    if (event_add(&u->wev, NULL) != 0) {
        up_close(u);
        return -1;
    }
    u->writing = true;
    up_arm_timer(u);
    return 0;
}

/* The connect finished: check it, then send the requests that waited. */
static void up_connected(upstream *u)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(u->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        up_connect_failed(u);
        return;
    }
    if (p_tls(u) != NULL) {
        /* The handshake runs inside the first writes and reads. */
        u->tls = tls_conn_new_client(p_tls(u), u->fd);
        if (u->tls == NULL) {
            up_connect_failed(u);
            return;
        }
    }
    u->state = UP_READY;
    if (event_add(&u->rev, NULL) != 0) {
        up_fail(u);
        return;
    }
    for (pslot *s = u->head; s != NULL; s = s->unext) {
        if (s->req != NULL) {
            size_t n = evbuffer_get_length(s->req);
            const void *d = evbuffer_pullup(s->req, -1);
            up_put_request(u, s, d, n);
            evbuffer_free(s->req);
            s->req = NULL;
        }
    }
    event_del(&u->tev);
    u->timer_on = false;
    up_arm_timer(u);
}

/* Everything is written: stop waiting for writability. Returns 0. */
static int up_flushed(upstream *u)
{
    if (u->writing) {
        event_del(&u->wev);
        u->writing = false;
    }
    return 0;
}

/* TLS: writes what u has pending, a record at a time (OpenSSL takes one
 * contiguous buffer). Returns -1 when the upstream was closed. */
static int up_flush_tls(upstream *u)
{
    while (evbuffer_get_length(u->out) > 0) {
        size_t len = evbuffer_get_contiguous_space(u->out);
        if (len > 16384) {
            len = 16384;
        }
        const void *data = evbuffer_pullup(u->out, (ev_ssize_t)len);
        ssize_t n = tls_conn_write(u->tls, data, len);
        if (n > 0) {
            evbuffer_drain(u->out, (size_t)n);
            continue;
        }
        if (n == TLS_IO_WANT_READ) {
            return 0; /* the read event calls again */
        }
        if (n == TLS_IO_WANT_WRITE) {
            up_want_write(u);
            return 0;
        }
        up_fail(u);
        return -1;
    }
    return up_flushed(u);
}

/* Writes what u has pending. Returns -1 when the upstream was closed. */
static int up_flush(upstream *u)
{
    if (u->tls != NULL) {
        return up_flush_tls(u);
    }
    while (evbuffer_get_length(u->out) > 0) {
        int n = evbuffer_write(u->out, u->fd);
        if (n > 0)
            continue;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        up_fail(u);
        return -1;
    }
    return up_flushed(u);
}

static void up_write_cb(evutil_socket_t fd, short what, void *arg)
{
    upstream *u = arg;
    (void)fd;
    (void)what;
    if (u->state == UP_CONNECTING) {
        up_connected(u);
        if (u->state != UP_READY)
            return;
    }
    if (up_flush(u) != 0)
        return;
    if (u->read_wants_write) {
        u->read_wants_write = false;
        up_read_cb(u->fd, EV_READ, u);
    }
}

static void up_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    upstream *u = arg;
    uint64_t now = now_ms();
    (void)fd;
    (void)what;
    u->timer_on = false;
    if (u->state == UP_CONNECTING && now >= u->connect_deadline) {
        up_connect_failed(u);
        return;
    }
    if (u->head != NULL && now >= u->head->deadline) {
        up_fail(u);
        return;
    }
    up_arm_timer(u);
}

/* ========================================================== framing */

enum frame_rc {
    FRAME_NEED = 0, /* the reply is not complete yet */
    FRAME_DONE = 1,
    FRAME_BAD = -1, /* the stream cannot be trusted: close */
};

/* Unsigned decimal of at most 20 digits ending at a space or the end. */
static bool parse_size(const char *s, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    size_t i = 0;
    for (; i < n && s[i] != ' '; i++) {
        unsigned d = (unsigned char)s[i] - '0';
        if (d > 9 || i >= 20 || v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return i > 0;
}

/* The byte count of "VALUE <key> <flags> <bytes> [<cas>]". */
static bool value_bytes(const char *line, size_t n, uint64_t *bytes)
{
    size_t i = 6, field = 0;
    while (i < n) {
        while (i < n && line[i] == ' ')
            i++;
        if (i == n)
            break;
        if (field == 2)
            return parse_size(line + i, n - i, bytes);
        while (i < n && line[i] != ' ')
            i++;
        field++;
    }
    return false;
}

#define LINE_IS(l, n, lit) ((n) == sizeof(lit) - 1 && memcmp(l, lit, n) == 0)
#define LINE_STARTS(l, n, lit)                                                \
    ((n) >= sizeof(lit) - 1 && memcmp(l, lit, sizeof(lit) - 1) == 0)

/*
 * Frames a text reply in u->in from u->scan on, by kind (PROXY_TEXT_* or
 * -1 for the hello). On FRAME_DONE, *total is the reply's length from the
 * start of in and *strip how many of its last bytes are ours to drop;
 * *failed says that a get part ended with an error line.
 */
static int frame_text(upstream *u, int kind, size_t limit, size_t *total,
                      size_t *strip, bool *failed)
{
    char line[PROXY_LINE_MAX];
    size_t len = evbuffer_get_length(u->in);

    for (;;) {
        struct evbuffer_ptr at, eol;
        size_t eol_len = 0;
        if (u->scan >= len)
            return FRAME_NEED;
        if (evbuffer_ptr_set(u->in, &at, u->scan, EVBUFFER_PTR_SET) != 0)
            return FRAME_BAD;
        eol = evbuffer_search_eol(u->in, &at, &eol_len, EVBUFFER_EOL_CRLF);
        if (eol.pos < 0)
            return len - u->scan > PROXY_LINE_MAX ? FRAME_BAD : FRAME_NEED;
        size_t n = (size_t)eol.pos - u->scan;
        if (n >= sizeof(line))
            return FRAME_BAD;
        evbuffer_copyout_from(u->in, &at, line, n);
        size_t next = u->scan + n + eol_len;
        uint64_t data = 0;
        bool has_data = false;

        if (kind == -1) {
            if (!LINE_IS(line, n, "OK"))
                return FRAME_BAD;
            *total = next;
            *strip = next;
            return FRAME_DONE;
        }
        if (kind != PROXY_TEXT_LINE && LINE_STARTS(line, n, "VALUE ")) {
            if (!value_bytes(line, n, &data))
                return FRAME_BAD;
            has_data = true;
        } else if (kind != PROXY_TEXT_GET && LINE_STARTS(line, n, "VA ")) {
            if (!parse_size(line + 3, n - 3, &data))
                return FRAME_BAD;
            has_data = true;
        }
        if (has_data) {
            if (data > u->pool->cfg->item_size_max + (uint64_t)PROXY_LINE_MAX)
                return FRAME_BAD;
            if (len < next + data + 2)
                return FRAME_NEED;
            char crlf[2];
            struct evbuffer_ptr dp;
            evbuffer_ptr_set(u->in, &dp, next + data, EVBUFFER_PTR_SET);
            evbuffer_copyout_from(u->in, &dp, crlf, 2);
            if (crlf[0] != '\r' || crlf[1] != '\n')
                return FRAME_BAD;
            next += data + 2;
        }
        if (next > limit)
            return FRAME_BAD;
        u->scan = next;
        switch (kind) {
        case PROXY_TEXT_LINE:
            *total = next;
            *strip = 0;
            return FRAME_DONE;
        case PROXY_TEXT_GET:
            if (has_data)
                continue;
            *total = next;
            *strip = LINE_IS(line, n, "END") ? n + eol_len : 0;
            *failed = *strip == 0;
            return FRAME_DONE;
        default: /* PROXY_TEXT_QUIET */
            if (!has_data && LINE_IS(line, n, "MN")) {
                *total = next;
                *strip = n + eol_len;
                return FRAME_DONE;
            }
            continue;
        }
    }
}

/*
 * Frames a binary reply in u->in from u->scan on (kind PROXY_BIN_* or -1
 * for the hello); results as frame_text.
 */
static int frame_bin(upstream *u, int kind, uint32_t opaque, size_t limit,
                     size_t *total, size_t *strip)
{
    size_t len = evbuffer_get_length(u->in);
    for (;;) {
        uint8_t raw[BIN_HEADER_LEN];
        struct evbuffer_ptr at;
        bin_header h;
        if (len - u->scan < BIN_HEADER_LEN)
            return FRAME_NEED;
        evbuffer_ptr_set(u->in, &at, u->scan, EVBUFFER_PTR_SET);
        evbuffer_copyout_from(u->in, &at, raw, BIN_HEADER_LEN);
        bin_header_decode(&h, raw);
        if (h.magic != BIN_MAGIC_RES ||
            h.bodylen > u->pool->cfg->item_size_max + PROXY_BIN_HEAD_MAX)
            return FRAME_BAD;
        size_t next = u->scan + BIN_HEADER_LEN + h.bodylen;
        if (next > limit)
            return FRAME_BAD;
        if (len < next)
            return FRAME_NEED;
        u->scan = next;
        if (kind == -1) {
            if (h.opcode != PROXY_BIN_OP_HELLO || h.status != 0)
                return FRAME_BAD;
            *total = next;
            *strip = next;
            return FRAME_DONE;
        }
        bool ours = h.opcode == BIN_OP_NOOP && h.opaque == PROXY_BIN_MARK;
        if (kind == PROXY_BIN_QUIET && ours) {
            *total = next;
            *strip = BIN_HEADER_LEN + h.bodylen;
            return FRAME_DONE;
        }
        if (h.opaque != opaque)
            return FRAME_BAD;
        if (kind == PROXY_BIN_ONE) {
            *total = next;
            *strip = 0;
            return FRAME_DONE;
        }
    }
}

/* Frames and hands over every complete reply in u->in. */
static void up_deliver(upstream *u)
{
    proxy_pool *p = u->pool;
    for (;;) {
        size_t total = 0, strip = 0;
        bool failed = false;
        int rc;
        pslot *s = u->head;
        if (u->hello_pending) {
            size_t lim = PROXY_LINE_MAX;
            rc = u->binary
                     ? frame_bin(u, -1, PROXY_BIN_MARK, lim, &total, &strip)
                     : frame_text(u, -1, lim, &total, &strip, &failed);
        } else if (s == NULL) {
            if (evbuffer_get_length(u->in) > 0) {
                up_fail(u); /* bytes nobody asked for */
                return;
            }
            return;
        } else if (u->binary) {
            rc =
                frame_bin(u, s->kind, s->bin_opaque, s->limit, &total, &strip);
        } else {
            rc = frame_text(u, s->kind, s->limit, &total, &strip, &failed);
        }
        if (rc == FRAME_NEED)
            return;
        if (rc == FRAME_BAD) {
            up_fail(u);
            return;
        }
        u->scan = 0;
        if (u->hello_pending) {
            u->hello_pending = false;
            evbuffer_drain(u->in, total);
            continue;
        }
        up_pop(u);
        if (s->kind == PROXY_TEXT_GET && !s->get_part)
            strip = 0; /* a whole get: its END is the client's */
        if (s->client == NULL || (failed && s->get_part)) {
            if (failed)
                STATS_INCR(p->stats, proxy_failures);
            evbuffer_drain(u->in, total);
        } else {
            evbuffer_remove_buffer(u->in, s->reply, total - strip);
            evbuffer_drain(u->in, strip);
        }
        slot_finish(p, s);
    }
}

/* TLS: reads what OpenSSL has for u. Returns true at the end of the
 * stream (or an error). */
static bool up_read_tls(upstream *u)
{
    for (int i = 0; i < PROXY_READS; i++) {
        struct evbuffer_iovec v;
        if (evbuffer_reserve_space(u->in, PROXY_READ_CHUNK, &v, 1) != 1) {
            return true;
        }
        ssize_t n = tls_conn_read(u->tls, v.iov_base, v.iov_len);
        v.iov_len = n > 0 ? (size_t)n : 0;
        evbuffer_commit_space(u->in, &v, 1);
        if (n > 0) {
            if (!tls_conn_pending(u->tls) && (size_t)n < PROXY_READ_CHUNK) {
                break;
            }
            continue;
        }
        if (n == TLS_IO_WANT_READ) {
            break;
        }
        if (n == TLS_IO_WANT_WRITE) {
            u->read_wants_write = true;
            up_want_write(u);
            break;
        }
        return true;
    }
    /* A write that waited for the handshake's reads goes on. */
    if (evbuffer_get_length(u->out) > 0 && up_flush(u) != 0) {
        return false; /* closed and failed already */
    }
    return false;
}

static void up_read_cb(evutil_socket_t fd, short what, void *arg)
{
    upstream *u = arg;
    bool eof = false;
    (void)what;
    if (u->tls != NULL) {
        eof = up_read_tls(u);
        if (u->state == UP_IDLE)
            return; /* failed while writing */
        goto deliver;
    }
    for (int i = 0; i < PROXY_READS; i++) {
        int n = evbuffer_read(u->in, fd, PROXY_READ_CHUNK);
        if (n > 0) {
            if (n < PROXY_READ_CHUNK)
                break;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        eof = true;
        break;
    }
deliver:
    up_deliver(u);
    if (u->state == UP_IDLE)
        return; /* closed while framing */
    if (eof) {
        /* Requests still waiting will never be answered. */
        up_fail(u);
        return;
    }
    if (u->head == NULL && u->timer_on) {
        event_del(&u->tev);
        u->timer_on = false;
    }
}

/* ============================================================== pool */

/* The upstream for target t in the given protocol; NULL when none can
 * be had. */
static upstream *pool_upstream(proxy_pool *p, const proto_target *t,
                               bool binary)
{
    for (size_t i = 0; i < p->nups; i++) {
        upstream *u = p->ups[i];
        if (u->binary == binary && proxy_same_target(&u->target, t))
            return u;
    }
    size_t slot = p->nups;
    if (p->nups == PROXY_UPSTREAMS_MAX) {
        /* Reuse an idle one (targets come and go with the ring). */
        for (slot = 0; slot < p->nups; slot++) {
            upstream *u = p->ups[slot];
            if (u->state == UP_IDLE && u->head == NULL)
                break;
        }
        if (slot == p->nups)
            return NULL;
        upstream *u = p->ups[slot];
        u->target = *t;
        u->binary = binary;
        u->down_until = 0;
        return u;
    }
    upstream *u = calloc(1, sizeof(*u));
    if (u == NULL)
        return NULL;
    u->in = evbuffer_new();
    u->out = evbuffer_new();
    if (u->in == NULL || u->out == NULL ||
        event_assign(&u->tev, p->base, -1, 0, up_timer_cb, u) != 0) {
        if (u->in != NULL)
            evbuffer_free(u->in);
        if (u->out != NULL)
            evbuffer_free(u->out);
        free(u);
        return NULL;
    }
    if (p->nups % 16 == 0) {
        upstream **ups = realloc(p->ups, (p->nups + 16) * sizeof(*ups));
        if (ups == NULL) {
            evbuffer_free(u->in);
            evbuffer_free(u->out);
            free(u);
            return NULL;
        }
        p->ups = ups;
    }
    u->pool = p;
    u->target = *t;
    u->binary = binary;
    u->fd = -1;
    u->state = UP_IDLE;
    p->ups[p->nups++] = u;
    return u;
}

/*
 * Sends slot s (not on any upstream) to its target s->tried or the next
 * one that can take it. The request is data (n bytes), or s->req when data
 * is NULL; a request that has to wait for a connect is kept in s->req.
 * Fails s when no target is left.
 */
static void slot_dispatch(proxy_pool *p, pslot *s, const void *data, size_t n)
{
    bool binary = s->kind == PROXY_BIN_ONE || s->kind == PROXY_BIN_QUIET;
    uint64_t now = now_ms();
    for (; s->tried < s->ntargets; s->tried++) {
        upstream *u = pool_upstream(p, &s->targets[s->tried], binary);
        if (u == NULL)
            continue;
        if (u->state == UP_IDLE) {
            if (u->down_until > now)
                continue;
            if (up_connect(u) != 0) {
                u->down_until = now + PROXY_RETRY_MS;
                continue;
            }
        }
        if (u->state != UP_READY && data != NULL) {
            s->req = evbuffer_new();
            if (s->req == NULL || evbuffer_add(s->req, data, n) != 0)
                break;
            data = NULL;
        }
        bool was_empty = u->head == NULL;
        up_push(u, s);
        if (u->state == UP_READY) {
            if (data == NULL) {
                n = evbuffer_get_length(s->req);
                data = evbuffer_pullup(s->req, -1);
            }
            up_put_request(u, s, data, n);
            if (s->req != NULL) {
                evbuffer_free(s->req);
                s->req = NULL;
            }
            up_want_write(u);
            if (was_empty && !u->timer_on)
                up_arm_timer(u);
        }
        return;
    }
    slot_fail(p, s);
}

proxy_pool *proxy_pool_create(struct event_base *base, const proto_config *cfg,
                              stats_thread *stats, void (*wake)(void *owner))
{
    proxy_pool *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->base = base;
    p->cfg = cfg;
    p->stats = stats;
    p->wake = wake;
    p->timeout_ms = cfg->proxy_timeout_ms ? cfg->proxy_timeout_ms
                                          : PROXY_TIMEOUT_DEFAULT_MS;
    return p;
}

void proxy_pool_destroy(proxy_pool *p)
{
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->nups; i++) {
        upstream *u = p->ups[i];
        up_close(u);
        pslot *s;
        /* Every client has let go already (see proxy.h). */
        while ((s = up_pop(u)) != NULL)
            slot_destroy(s);
        evbuffer_free(u->in);
        evbuffer_free(u->out);
        free(u);
    }
    free(p->ups);
    while (p->free_slots != NULL) {
        pslot *s = p->free_slots;
        p->free_slots = s->cnext;
        slot_destroy(s);
    }
    free(p);
}

/* ========================================================= parser side */

/* ctx's client state, created on first use; NULL when out of memory. */
static pclient *client_of(proto_ctx *ctx, struct evbuffer *out)
{
    pclient *cl = ctx->proxy;
    if (cl == NULL) {
        cl = calloc(1, sizeof(*cl));
        if (cl == NULL)
            return NULL;
        cl->pool = ctx->relays;
        cl->owner = ctx->relay_owner;
        ctx->proxy = cl;
    }
    cl->out = out;
    return cl;
}

int proxy_relay(proto_ctx *ctx, struct evbuffer *out, const proxy_req *rq)
{
    proxy_pool *p = ctx->relays;
    pclient *cl = client_of(ctx, out);
    pslot *s = cl != NULL ? slot_new(p) : NULL;

    STATS_INCR(p->stats, proxied_requests);
    if (s == NULL) {
        /* Answer in place, behind whatever is still in flight. */
        STATS_INCR(p->stats, proxy_failures);
        pslot tmp = {.kind = rq->kind,
                     .get_part = rq->get_part,
                     .silent = rq->silent,
                     .bin_opcode = rq->bin_opcode,
                     .bin_opaque = rq->bin_opaque};
        put_failure(&tmp, proxy_out(ctx, out));
        return PROXY_ERR_NOMEM;
    }
    uint32_t nkeys = rq->nkeys ? rq->nkeys : 1;
    s->kind = rq->kind;
    s->get_part = rq->get_part;
    s->silent = rq->silent;
    s->bin_opcode = rq->bin_opcode;
    s->bin_opaque = rq->bin_opaque;
    s->limit = (size_t)nkeys * (ctx->cfg->item_size_max + 2 * PROXY_LINE_MAX);
    s->deadline = now_ms() + p->timeout_ms;
    s->ntargets =
        rq->ntargets < PROTO_ROUTE_MAX ? rq->ntargets : PROTO_ROUTE_MAX;
    memcpy(s->targets, rq->targets, (size_t)s->ntargets * sizeof(*s->targets));
    s->tried = 0;

    /* Into the client's FIFO first: a failure at once is then answered
     * at the right place like any other. */
    s->client = cl;
    if (cl->tail != NULL)
        cl->tail->cnext = s;
    else
        cl->head = s;
    cl->tail = s;
    cl->n++;
    slot_dispatch(p, s, rq->data, rq->n);
    return PROXY_OK;
}

struct evbuffer *proxy_out(proto_ctx *ctx, struct evbuffer *out)
{
    pclient *cl = ctx->proxy;
    return cl != NULL && cl->tail != NULL ? cl->tail->after : out;
}

bool proxy_blocked(proto_ctx *ctx, struct evbuffer *out)
{
    pclient *cl = ctx->proxy;
    if (cl == NULL || cl->tail == NULL)
        return false;
    if (cl->n >= PROXY_MAX_INFLIGHT)
        return true;
    size_t max = ctx->cfg->output_max;
    return max != 0 &&
           evbuffer_get_length(out) + evbuffer_get_length(cl->tail->after) >
               max;
}

bool proxy_busy(const proto_ctx *ctx)
{
    const pclient *cl = ctx->proxy;
    return cl != NULL && cl->head != NULL;
}

void proxy_conn_free(proto_ctx *ctx)
{
    pclient *cl = ctx->proxy;
    if (cl == NULL)
        return;
    pslot *s = cl->head;
    while (s != NULL) {
        pslot *next = s->cnext;
        s->client = NULL;
        s->cnext = NULL;
        if (s->up == NULL) /* done, or never handed to an upstream */
            slot_free(cl->pool, s);
        s = next;
    }
    free(cl);
    ctx->proxy = NULL;
}
