/*
 * tlsio.c -- the two ways a libevent server can drive OpenSSL, side by
 * side, for contrib/tlsio: a one-thread server that answers every text
 * line starting with "get " with one fixed 100-byte value and "END",
 * "version" with a VERSION line, and every other line with "STORED"
 * (memtier_benchmark's memcache_text protocol needs nothing more: a set's
 * data line is answered too, and memtier reads one reply per request, so
 * only get-only runs are meaningful), over TLS, either
 *
 *   raw  -- SSL_read / SSL_write on the socket's own read and write events
 *           (what server/conn.c does), or
 *   bev  -- libevent's bufferevent_openssl, with evbuffer_readln.
 *
 * Usage: tlsio raw|bev PORT CERT KEY. Runs until SIGTERM/SIGINT.
 * Not part of the daemon; built by contrib/tlsio with cc.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

static SSL_CTX *ctx;
static struct event_base *base;
static char value_reply[256];
static size_t value_len;
static const char stored_reply[] = "STORED\r\n";

/* Appends the reply to one request line (without its CRLF). */
static void answer(struct evbuffer *out, const char *line, size_t len)
{
    static const char version_reply[] = "VERSION tlsio\r\n";
    if (len >= 4 && memcmp(line, "get ", 4) == 0)
        evbuffer_add(out, value_reply, value_len);
    else if (len >= 7 && memcmp(line, "version", 7) == 0)
        evbuffer_add(out, version_reply, sizeof(version_reply) - 1);
    else if (len > 0)
        evbuffer_add(out, stored_reply, sizeof(stored_reply) - 1);
}

static void nodelay(evutil_socket_t fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* ------------------------------------------------------------ raw */

typedef struct raw_conn {
    int fd;
    SSL *ssl;
    struct event *rev, *wev;
    struct evbuffer *in, *out;
} raw_conn;

static void raw_close(raw_conn *c)
{
    event_free(c->rev);
    event_free(c->wev);
    evbuffer_free(c->in);
    evbuffer_free(c->out);
    SSL_free(c->ssl);
    close(c->fd);
    free(c);
}

/* Writes what is pending; returns -1 when the connection is gone. */
static int raw_flush(raw_conn *c)
{
    char chunk[16384];
    while (evbuffer_get_length(c->out) > 0) {
        ev_ssize_t n = evbuffer_copyout(c->out, chunk, sizeof(chunk));
        int w = SSL_write(c->ssl, chunk, (int)n);
        if (w <= 0) {
            int e = SSL_get_error(c->ssl, w);
            if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
                event_add(c->wev, NULL);
                return 0;
            }
            return -1;
        }
        evbuffer_drain(c->out, (size_t)w);
    }
    event_del(c->wev);
    return 0;
}

static void raw_io(evutil_socket_t fd, short what, void *arg)
{
    raw_conn *c = arg;
    (void)fd;
    (void)what;
    for (;;) {
        struct evbuffer_iovec v;
        if (evbuffer_reserve_space(c->in, 16384, &v, 1) != 1)
            goto gone;
        int n = SSL_read(c->ssl, v.iov_base, (int)v.iov_len);
        if (n <= 0) {
            int e = SSL_get_error(c->ssl, n);
            v.iov_len = 0;
            evbuffer_commit_space(c->in, &v, 1);
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
                break;
            goto gone;
        }
        v.iov_len = (size_t)n;
        evbuffer_commit_space(c->in, &v, 1);
        if (SSL_pending(c->ssl) == 0)
            break;
    }
    size_t len;
    char *line;
    while ((line = evbuffer_readln(c->in, &len, EVBUFFER_EOL_CRLF)) != NULL) {
        answer(c->out, line, len);
        free(line);
    }
    if (raw_flush(c) == 0)
        return;
gone:
    raw_close(c);
}

static void raw_accept(struct evconnlistener *l, evutil_socket_t fd,
                       struct sockaddr *sa, int salen, void *arg)
{
    (void)l;
    (void)sa;
    (void)salen;
    (void)arg;
    raw_conn *c = calloc(1, sizeof(*c));
    nodelay(fd);
    c->fd = fd;
    evutil_make_socket_nonblocking(fd);
    c->ssl = SSL_new(ctx);
    SSL_set_fd(c->ssl, fd);
    SSL_set_accept_state(c->ssl);
    c->in = evbuffer_new();
    c->out = evbuffer_new();
    c->rev = event_new(base, fd, EV_READ | EV_PERSIST, raw_io, c);
    c->wev = event_new(base, fd, EV_WRITE, raw_io, c);
    event_add(c->rev, NULL);
}

/* ------------------------------------------------------------ bev */

static void bev_read(struct bufferevent *bev, void *arg)
{
    (void)arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    struct evbuffer *out = bufferevent_get_output(bev);
    size_t len;
    char *line;
    while ((line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF)) != NULL) {
        answer(out, line, len);
        free(line);
    }
}

static void bev_event(struct bufferevent *bev, short what, void *arg)
{
    (void)arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        bufferevent_free(bev);
}

static void bev_accept(struct evconnlistener *l, evutil_socket_t fd,
                       struct sockaddr *sa, int salen, void *arg)
{
    (void)l;
    (void)sa;
    (void)salen;
    (void)arg;
    nodelay(fd);
    evutil_make_socket_nonblocking(fd);
    SSL *ssl = SSL_new(ctx);
    struct bufferevent *bev = bufferevent_openssl_socket_new(
        base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(bev, bev_read, NULL, bev_event, NULL);
    bufferevent_enable(bev, EV_READ);
}

/* ------------------------------------------------------------ main */

static void on_signal(evutil_socket_t s, short what, void *arg)
{
    (void)s;
    (void)what;
    (void)arg;
    event_base_loopbreak(base);
}

int main(int argc, char **argv)
{
    if (argc != 5 ||
        (strcmp(argv[1], "raw") != 0 && strcmp(argv[1], "bev") != 0)) {
        fprintf(stderr, "usage: %s raw|bev PORT CERT KEY\n", argv[0]);
        return 64;
    }
    int raw = strcmp(argv[1], "raw") == 0;
    value_len = (size_t)snprintf(value_reply, sizeof(value_reply),
                                 "VALUE k 0 100\r\n%0100d\r\nEND\r\n", 0);
    signal(SIGPIPE, SIG_IGN);
    ctx = SSL_CTX_new(TLS_server_method());
    if (SSL_CTX_use_certificate_chain_file(ctx, argv[3]) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, argv[4], SSL_FILETYPE_PEM) != 1) {
        ERR_print_errors_fp(stderr);
        return 1;
    }
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS |
                              SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);

    base = event_base_new();
    struct sockaddr_in sin = {0};
    sin.sin_family = AF_INET;
    sin.sin_port = htons((unsigned short)atoi(argv[2]));
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct evconnlistener *l =
        evconnlistener_new_bind(base, raw ? raw_accept : bev_accept, NULL,
                                LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                1024, (struct sockaddr *)&sin, sizeof(sin));
    if (l == NULL) {
        perror("listen");
        return 1;
    }
    struct event *sterm = evsignal_new(base, SIGTERM, on_signal, NULL);
    struct event *sint = evsignal_new(base, SIGINT, on_signal, NULL);
    event_add(sterm, NULL);
    event_add(sint, NULL);
    event_base_dispatch(base);
    evconnlistener_free(l);
    event_free(sterm);
    event_free(sint);
    event_base_free(base);
    SSL_CTX_free(ctx);
    return 0;
}
